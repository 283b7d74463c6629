"""Calibration tier: the serving KV-cache model (llmbench.serve.capacity) against every
committed serving record whose engine reported its KV cache: from the record's own GPU total
(NVML, provenance.gpu_state) and share, the prediction comes within CALIBRATION_TOLERANCE of
the engine's report. It pins OVERHEAD_GIB to the committed evidence: a reference run that
moves an engine's overhead makes it fail, and the constant follows."""

from llmbench.cells import SERVE_RECORD_PATTERN, glob
from llmbench.models import ModelSpec
from llmbench.record import read
from llmbench.serve import capacity

from conftest import REPO


def reported():
    """(record path, engine, model, gpus, GPU GiB, share, KV tokens) of every ok serving record of
    vLLM or SGLang whose engine reported its KV cache and whose provenance has the GPU's total."""
    out = []
    for path in sorted(REPO.glob("results/reference/2026-*/" + glob(SERVE_RECORD_PATTERN))):
        rec = read(path)
        s, gpu = rec.summary, (rec.provenance.get("gpu_state") or {}).get("gpus") or [{}]
        if rec.status != "ok" or rec.cell["engine"] not in capacity.SHARE or \
                s.get("kv_cache_source") != "engine report" or not gpu[0].get("total_gib"):
            continue
        out.append((path.relative_to(REPO), rec.cell["engine"], rec.cell["model"], rec.cell["gpus"],
                    gpu[0]["total_gib"], s["gpu_memory_utilization"], s["kv_cache_tokens"]))
    return out


def test_the_kv_model_predicts_every_reported_cache_of_the_committed_records():
    rows = reported()
    # both engines, tensor parallel 1 and 2, four models: the evidence OVERHEAD_GIB is fitted to
    assert {r[1] for r in rows} == {"vllm", "sglang"} and {r[3] for r in rows} == {1, 2} and len(rows) >= 100
    worst = []
    for path, engine, model, gpus, total, share, tokens in rows:
        got = capacity.predict(engine, ModelSpec.load(model, REPO), total, gpus, share=share).kv_tokens
        worst.append((abs(got / tokens - 1), str(path), got, tokens))
    assert max(worst)[0] < capacity.CALIBRATION_TOLERANCE, max(worst)
