"""llmbench.profile's worker on the tiny model for real: under torchrun on the CPU, a training
step under torch.profiler, without (Naive) and with F+R. Attribution on synthetic ops and
events: tests/unit/test_profile.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmbench.cells import Cell
from llmbench.models import ModelSpec
from llmbench.platforms import Platform
from llmbench.profile import attribution as attr
from llmbench.profile import kernels
from llmbench.protocol import Protocol

REPO = Path(__file__).resolve().parents[2]


def spec_for(technique: str) -> dict:
    cell = Cell(stage="profile", platform="cpu", model="tiny", backend="torch", technique=technique, batch_size=1,
                gpus=1, protocol=Protocol(warmup_steps=1, measured_steps=2, repeats=1, seq_len=64, timeout_s=300))
    platform = Platform.load("cpu").to_dict()
    platform.pop("slurm")
    return {"cell": cell.to_dict(), "platform": platform, "model": ModelSpec.load("tiny").to_dict()}


def rows_of(result, phase):
    return {r["module"]: r for r in result["rows"] if r["phase"] == phase}


#: What a step of the tiny model must show per phase with eager (SDPA-math) attention.
EAGER_KINDS = ("embedding", "qkv", "rope", "attn_scores", "softmax", "attn_values", "output", "mlp",
               "rmsnorm", "lm_head", "loss")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The worker under torchrun on the tiny model, without (Naive) and with F+R; both at once."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "workflow" / "scripts"), "OMP_NUM_THREADS": "1"}
    procs, outs = {}, {}
    for tech in ("Naive", "F+R"):
        d = tmp_path_factory.mktemp(tech.replace("+", "_"))
        (d / "spec.json").write_text(json.dumps(spec_for(tech)))
        outs[tech] = d / "repeat-0.json"
        procs[tech] = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
             "-m", "llmbench.profile.worker", "--spec", str(d / "spec.json"), "--out", str(outs[tech]),
             "--trace-dir", str(d / "traces")],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    results = {}
    for tech, p in procs.items():
        log, _ = p.communicate(timeout=240)
        assert p.returncode == 0, log[-3000:]
        results[tech] = json.loads(outs[tech].read_text())
    return results


def test_worker_eager_step_breaks_down_into_every_module(runs):
    res = runs["Naive"]
    assert res["attention"] == "sdpa[math]" and res["technique"] == "Naive"
    for phase in ("forward", "backward"):
        rows = rows_of(res, phase)
        missing = [k for k in EAGER_KINDS if not (k in rows and rows[k]["time_s"] > 0)]
        assert not missing, f"{phase}: no time for {missing}"
        assert "attention_fused" not in rows
        assert 0 < rows["mlp"]["gemm_time_s"] <= rows["mlp"]["time_s"]
        assert rows["rmsnorm"]["gemm_time_s"] == 0.0
    assert res["phases"]["backward"]["recompute_s"] == 0.0
    assert set(rows_of(res, "optimizer")) == {"optimizer", "other"}


def test_worker_phases_add_up(runs):
    for res in runs.values():
        for phase, totals in res["phases"].items():
            rows = [r for r in res["rows"] if r["phase"] == phase]
            assert sum(r["share"] for r in rows) == pytest.approx(1.0, abs=1e-6)
            assert sum(r["time_s"] for r in rows) == pytest.approx(totals["wall_s"], rel=1e-9)
            assert 0 < totals["gemm_s"] <= totals["kernel_s"] or phase == "optimizer"
            assert 0 < totals["kernel_s"] <= totals["wall_s"]
        assert sum(t["wall_s"] for t in res["phases"].values()) == pytest.approx(res["step_time_s"], rel=1e-9)
        # a CPU's op times are host times under the profiler: the profiled steps' walls
        assert res["wall_basis"] == "profiled"
        assert all(t["profiled_wall_s"] == t["wall_s"] for t in res["phases"].values())
        assert abs(res["unaccounted_s"]) < 1e-9
        assert res["unprofiled_step_time_s"] > 0 and res["tokens_per_s"] == pytest.approx(
            64 / res["unprofiled_step_time_s"])
        assert res["trace"].endswith(kernels.TRACE_SUFFIX)  # gzipped beside the record
        names = {e.get("name") for e in kernels.load_events(res["trace"])}
        assert {"llmbench/phase/forward", "llmbench/module/mlp", "aten::mm"} <= names
        assert res["method"] == attr.METHOD and res["versions"]["torch"]
        # a CPU has no device memory; the host's peak RSS holds at least the tiny model
        assert res["peak_mem_allocated_gib"] is None and res["peak_mem_reserved_gib"] is None
        assert res["peak_rss_gib"] > 0


def test_worker_flash_attention_is_one_fused_kind(runs):
    res = runs["F+R"]
    assert res["attention"] == "sdpa[default]"
    for phase in ("forward", "backward"):
        rows = rows_of(res, phase)
        assert rows["attention_fused"]["time_s"] > 0
        assert not set(attr.EAGER_ATTENTION) & set(rows)


def test_worker_recomputation_reruns_the_forward_inside_backward(runs):
    """R: the decoder layers' forward ops reappear inside the backward phase (their module
    ranges open again inside autograd nodes), flagged as recompute_s; embedding, lm_head and
    loss sit outside the checkpointed layers and are not rerun."""
    res = runs["F+R"]
    back = rows_of(res, "backward")
    for kind in ("qkv", "rope", "attention_fused", "mlp", "rmsnorm"):
        assert 0 < back[kind]["recompute_s"] < back[kind]["time_s"], kind
    for kind in ("embedding", "lm_head", "loss"):
        assert back[kind]["recompute_s"] == 0.0
    in_modules = sum(r["recompute_s"] for r in back.values() if r["module"] != "other")
    assert res["phases"]["backward"]["recompute_s"] >= in_modules - 1e-12
    assert all(r["recompute_s"] == 0.0 for r in res["rows"] if r["phase"] == "forward")
