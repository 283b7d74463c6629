"""A real engine under the load kinds users measure today: `transformers serve` on the CPU
(the cheaper of the two CPU engines to start), the tiny model's random weights, a closed loop
of two requests in flight over prompts that share a prefix, after awaited warm-up requests.
The fake-engine tests (test_serve_cell.py, tests/unit/test_loadgen.py) count the limit at the
server; here the engine is real and the record is what a user reads."""

from __future__ import annotations

import pytest

from llmbench import grid, record
from llmbench.models import ModelSpec
from llmbench.platforms import Platform
from llmbench.serve import bench, model_dir, telemetry

pytestmark = pytest.mark.integration

LOAD = {"mode": "concurrency", "max_concurrency": 2, "num_requests": 8, "input_len": 32, "output_len": 4,
        "prefix_len": 24, "warmup_requests": 2, "request_timeout_s": 60, "ttft_target_s": 60, "tpot_target_s": 60}


def max_overlap(starts: list[float], ends: list[float]) -> int:
    """Most intervals [start, end] open at one time."""
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def test_transformers_serve_under_a_concurrency_load_of_shared_prefix_prompts(tmp_path):
    [cell] = grid.expand({"protocol": {}, "serve": [{
        "platforms": ["cpu"], "models": ["tiny"], "engines": ["transformers"], "loads": {"c2-prefix": LOAD},
        "ready_timeout_s": 300, "timeout_s": 300}]}).cells
    model = ModelSpec.load("tiny")
    folder = model_dir.build(model, tmp_path / "model")
    spec = {"cell": cell.to_dict(), "model": model.to_dict(), "engine_python": None,
            "platform": Platform.load("cpu").to_dict()}
    out = tmp_path / "run" / "record.json"
    rec = bench.run_cell(spec, folder, out, tmp_path / "cell.log", tmp_path / "server.log")
    assert record.read(out) == rec
    assert rec.status == "ok", (rec.reason, rec.log_tail)
    sv, req = rec.summary, rec.samples
    assert rec.cell["load_spec"]["mode"] == "concurrency" and rec.cell["load_spec"]["max_concurrency"] == 2
    assert (sv["num_requests"], sv["completed"], sv["warmup_failed"]) == (8, 8, 0)
    assert (sv["prefix_len"], sv["suffix_len"], sv["warmup_requests"]) == (24, 8, 2)
    # the client never had more than two requests open (send to last token)
    assert max_overlap(req["sent_s"], [s + e for s, e in zip(req["sent_s"], req["e2e_s"])]) <= 2
    assert sv["goodput_share"] == 1.0 and sv["output_tokens_per_s"] > 0  # targets of a minute: all meet them
    assert sv["prefix_caching"] is None  # transformers serve has no such switch here
    assert sv["gpu_telemetry_source"] is None and "CPU" in sv["gpu_telemetry_unavailable"]
    assert not (out.parent / telemetry.FILE).exists()
