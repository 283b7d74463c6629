"""An SGLang serving cell end to end on the CPU, with a PROTOCOL test double of SGLang's
HTTP API as the engine (tests/fixtures/fake_servers.py run as its own process): SGLang
itself runs only on NVIDIA GPUs, so nothing here measures it. What is real: the sglang
entry's launch command (passed to the double after ``--engine-argv``, its settings parsed from it into
the record), the readiness probe, the /generate dialect and its token counting, the
/server_info read-back of the KV cache, and the record."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from llmbench import record
from llmbench.cells import ServeCell
from llmbench.models import ModelSpec
from llmbench.platforms import Platform
from llmbench.serve import bench, engines

FAKE = str(Path(__file__).resolve().parents[1] / "fixtures" / "fake_servers.py")
sys.path.insert(0, str(Path(FAKE).parent))
from fake_servers import SGLANG_SERVER_INFO  # noqa: E402


def sglang_double(knobs: dict | None = None) -> engines.Engine:
    """The sglang entry, its command run by the double with SGLang's real argv after it."""
    real = engines.ENGINES["sglang"]

    def command(x: engines.Launch) -> list[str]:
        return [sys.executable, FAKE, "--dialect", "sglang", "--port", str(x.port),
                "--knobs", json.dumps(knobs or {}), "--engine-argv", *real.command(x)[1:]]
    return dataclasses.replace(real, command=command, env=lambda x: {})


def test_an_sglang_cell_against_its_double_gives_an_ok_record_with_its_launch_spec(tmp_path, monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "sglang", sglang_double({"tokens_per_event": 3}))
    cell = ServeCell(platform="cpu", model="tiny", engine="sglang", load="b", gpus=1,
                     load_spec={"mode": "burst", "num_requests": 12, "input_len": 8, "output_len": 7,
                                "warmup_requests": 0, "request_timeout_s": 20},
                     engine_args=("--disable-radix-cache", "--chunked-prefill-size", "2048"),
                     ready_timeout_s=30, timeout_s=60)
    spec = {"cell": cell.to_dict(), "model": ModelSpec.load("tiny").to_dict(), "engine_python": None,
            "platform": Platform.load("cpu").to_dict()}
    out = tmp_path / "record.json"
    rec = bench.run_cell(spec, tmp_path, out, tmp_path / "cell.log", tmp_path / "server.log")
    assert record.read(out) == rec
    assert rec.status == "ok", rec.reason
    s = rec.summary
    # 7 tokens a request in chunks of 3, 3, 1: counted from the chunks' ids and completion_tokens
    assert s["completed"] == 12 and s["output_tokens_total"] == 84 and s["output_shortfall_requests"] == 0
    assert s["dialect"] == "sglang" and s["prompts"] == "token ids" and s["ignore_eos"] is True
    assert (s["max_num_seqs"], s["max_batch_tokens"], s["cuda_graphs"], s["chunked_prefill"], s["prefix_caching"],
            s["tensor_parallel"]) == (12, 16384, True, True, False, 1)
    assert s["kv_cache_tokens"] == SGLANG_SERVER_INFO["max_total_num_tokens"]
    assert s["kv_cache_source"] == "engine report" and "engine_observe_error" not in s
    argv = rec.provenance["engine_command"]
    real = argv[argv.index("--engine-argv") + 1:]
    assert argv[1] == FAKE and real[:2] == ["-m", "sglang.launch_server"] and real[-3:] == list(cell.engine_args)
    assert "sglang" in rec.provenance["engine_versions"]  # None here: not installed on the CPU machines
