"""A serving cell's lifecycle and statuses, with a PROTOCOL test double as the engine
(tests/fixtures/fake_servers.py run as its own process): ready probe, port in use, an
engine that never gets ready, dies before or during the load, answers errors, or sends a
malformed stream. Each gives a record with a clear status and reason, and no engine
process outlives its cell. Real engines: tests/e2e/test_workflow.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import sys
from pathlib import Path

import psutil
import pytest

from llmbench import record
from llmbench.cells import ServeCell
from llmbench.models import ModelSpec
from llmbench.platforms import Platform
from llmbench.serve import bench, engines, telemetry
from llmbench.procs import free_port
from llmbench.serve.server import ServerError, serve

FAKE = str(Path(__file__).resolve().parents[1] / "fixtures" / "fake_servers.py")
sys.path.insert(0, str(Path(FAKE).parent))
from fake_nvml import fake_pynvml  # noqa: E402


def fake_engine(knobs: dict | None = None, exit_after: int = 0, argv: list[str] | None = None,
                stats_file: Path | None = None) -> engines.Engine:
    """The transformers engine's entry, its command replaced by the fake server (which keeps
    what it saw in ``stats_file`` where one is given)."""
    def command(x: engines.Launch) -> list[str]:
        return argv or [sys.executable, FAKE, "--dialect", "openai", "--port", str(x.port),
                        "--knobs", json.dumps({"flavour": "transformers", **(knobs or {})}),
                        "--exit-after", str(exit_after), *(["--stats-file", str(stats_file)] if stats_file else [])]
    return dataclasses.replace(engines.ENGINES["transformers"], command=command, env=lambda x: {})


def run(tmp_path, monkeypatch, engine: engines.Engine, n: int = 20, ready_timeout_s: int = 30, timeout_s: int = 60,
        **load):
    monkeypatch.setitem(engines.ENGINES, "transformers", engine)
    cell = ServeCell(platform="cpu", model="tiny", engine="transformers", load="b", gpus=1,
                     load_spec={"mode": "burst", "num_requests": n, "input_len": 8, "output_len": 4,
                                "warmup_requests": 0, "request_timeout_s": 20, **load},
                     ready_timeout_s=ready_timeout_s, timeout_s=timeout_s)
    spec = {"cell": cell.to_dict(), "model": ModelSpec.load("tiny").to_dict(), "engine_python": None,
            "platform": Platform.load("cpu").to_dict()}
    out = tmp_path / "record.json"
    rec = bench.run_cell(spec, tmp_path, out, tmp_path / "cell.log", tmp_path / "server.log")
    assert record.read(out) == rec  # what was returned is what was written
    return rec


def no_orphans() -> bool:
    """No fake engine is left behind: none among this process's descendants, and none
    orphaned (its parent gone, adopted by init). Another test process's engines that are still
    running under their own cell (pytest-xdist) are neither."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    return not [p for p in psutil.process_iter(["cmdline", "ppid"])
                if FAKE in (p.info["cmdline"] or []) and (p.pid in mine or p.info["ppid"] == 1)]


def test_a_healthy_engine_gives_an_ok_record(tmp_path, monkeypatch):
    rec = run(tmp_path, monkeypatch, fake_engine())
    assert rec.status == "ok", rec.reason
    assert rec.summary["completed"] == 20 and rec.summary["output_tokens_total"] == 80
    assert len(rec.samples["ttft_s"]) == 20 and all(rec.samples["ok"])
    assert rec.summary["server_ready_s"] > 0 and rec.summary["server_peak_rss_gib"] > 0
    assert rec.provenance["engine_command"][1] == FAKE
    assert no_orphans()


def test_a_load_past_timeout_keeps_what_completed(tmp_path, monkeypatch):
    # two requests at a time, 4 tokens each 0.5 s apart: the first pair completes at about
    # 2 s, the second is mid-stream and the third still queued when timeout_s=3 cuts them
    from llmbench.serve.loadgen import CUT_ERROR

    rec = run(tmp_path, monkeypatch, fake_engine({"token_delay_s": 0.5}), n=6, timeout_s=3, max_concurrency=2)
    assert rec.status == "timeout" and "2 of 6 requests had completed" in rec.reason, rec.reason
    assert rec.summary["completed"] == 2 and rec.summary["failed"] == 4 and rec.summary["output_tokens_total"] == 8
    assert rec.summary["p50_ttft_s"] is not None and rec.summary["output_tokens_per_s"] > 0
    cut = [(tokens, err) for ok, tokens, err in zip(rec.samples["ok"], rec.samples["output_tokens"],
                                                      rec.samples["error"]) if not ok]
    assert all(err == CUT_ERROR for _, err in cut)
    tokens = sorted(t for t, _ in cut)
    assert tokens[:2] == [0, 0] and all(0 < t < 4 for t in tokens[2:]), tokens  # queued; mid-stream
    assert no_orphans()


def test_an_engine_that_dies_mid_burst_gives_an_error_record(tmp_path, monkeypatch):
    rec = run(tmp_path, monkeypatch, fake_engine({"token_delay_s": 0.2}, exit_after=5))
    assert rec.status == "error"
    assert "exited (code 1) during the load" in rec.reason and "of 20 requests had completed" in rec.reason
    assert "died on purpose" in rec.log_tail
    assert no_orphans()


def test_an_engine_killed_mid_burst_keeps_what_completed(tmp_path, monkeypatch):
    """kill -9 of the engine during the burst, for real: two requests at a time of 4 tokens
    0.2 s apart (about 8 s for all 20), killed once it has served for 2.5 s."""
    import threading
    import time

    def kill_the_engine():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            log = tmp_path / "server.log"
            if log.exists() and "fake openai server on" in log.read_text():
                break
            time.sleep(0.05)
        time.sleep(2.5)
        for p in psutil.Process().children(recursive=True):
            # another child may exit meanwhile (an earlier test's idle fork server): its
            # NoSuchProcess would end this thread before the kill, and the burst finish ok
            with contextlib.suppress(psutil.Error):
                if FAKE in p.cmdline():
                    p.kill()

    killer = threading.Thread(target=kill_the_engine, daemon=True)
    killer.start()
    rec = run(tmp_path, monkeypatch, fake_engine({"token_delay_s": 0.2}), n=20, max_concurrency=2)
    killer.join(5)
    assert rec.status == "error", rec.reason
    done = rec.summary["completed"]
    assert 0 < done < 20 and f"exited (code -9) during the load: {done} of 20 requests had completed" in rec.reason
    assert sum(rec.samples["ok"]) == done and len(rec.samples["ok"]) == 20
    assert "fake openai server on" in rec.log_tail  # the engine's own log
    assert no_orphans()


def test_errors_from_the_engine_fail_the_cell_but_keep_the_measurements(tmp_path, monkeypatch):
    rec = run(tmp_path, monkeypatch, fake_engine({"http_500_every": 4}))
    assert rec.status == "error" and rec.reason.startswith("5 of 20 requests failed; first: HTTP 500")
    assert rec.summary["completed"] == 15 and rec.samples["ok"].count(False) == 5


def test_a_malformed_stream_is_named(tmp_path, monkeypatch):
    rec = run(tmp_path, monkeypatch, fake_engine({"malformed_every": 1}), n=3)
    assert rec.status == "error" and "not JSON" in rec.reason


def test_an_engine_that_cannot_start_gives_its_root_cause(tmp_path, monkeypatch):
    argv = [sys.executable, "-c", "import sys; print('OSError: cannot load model from /nowhere'); sys.exit(3)"]
    rec = run(tmp_path, monkeypatch, fake_engine(argv=argv))
    assert rec.status == "error" and "exited with code 3 before it was ready" in rec.reason
    assert "cannot load model from /nowhere" in rec.reason and rec.samples == {}


def test_an_engine_out_of_memory_at_start_is_oom(tmp_path, monkeypatch):
    argv = [sys.executable, "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory.'); sys.exit(1)"]
    assert run(tmp_path, monkeypatch, fake_engine(argv=argv)).status == "oom"


def test_an_engine_that_never_gets_ready_is_stopped(tmp_path, monkeypatch):
    # a process group with a grandchild, neither answering the health probe
    argv = [sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, {FAKE!r}, "
            "'--dialect', 'tgi', '--port', '1']); time.sleep(600)"]
    rec = run(tmp_path, monkeypatch, fake_engine(argv=argv), ready_timeout_s=3)
    assert rec.status == "error" and "not ready after ready_timeout_s=3" in rec.reason
    assert no_orphans()


def test_a_port_in_use_is_refused_before_starting(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is already in use"):
            with serve([sys.executable, "-c", "pass"], env={}, host="127.0.0.1", port=port, health_path="/health",
                       log=tmp_path / "s.log", ready_timeout_s=5):
                pass


def test_the_engine_sizes_its_own_thread_pools(tmp_path, monkeypatch):
    """Snakemake's OMP_NUM_THREADS (the job's threads) must not reach the engine: vLLM's CPU
    backend pins its OpenMP threads itself and ran 4x slower with it."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    port = free_port()
    argv = ["sh", "-c", f'echo "OMP=[$OMP_NUM_THREADS]"; exec {sys.executable} {FAKE} --dialect openai --port {port}']
    with serve(argv, env={}, host="127.0.0.1", port=port, health_path="/health",
               log=tmp_path / "s.log", ready_timeout_s=30):
        pass
    assert "OMP=[]" in (tmp_path / "s.log").read_text()
    assert no_orphans()


def test_a_concurrency_load_of_shared_prefix_prompts_says_so_in_its_record(tmp_path, monkeypatch):
    """A closed loop of 3 in flight over prompts sharing 6 of their 8 tokens: the limit holds
    at the engine (the fake server counts what it had open at once), the record keeps the
    load kind, P, N and the suffix length, goodput, and says there was no GPU to sample."""
    stats = tmp_path / "stats.json"
    rec = run(tmp_path, monkeypatch, fake_engine({"token_delay_s": 0.01, "gate_inflight": 3}, stats_file=stats),
              n=12, mode="concurrency", max_concurrency=3, prefix_len=6, warmup_requests=2)
    assert rec.status == "ok", rec.reason
    assert json.loads(stats.read_text())["max_in_flight"] == 3
    sv = rec.summary
    assert rec.cell["load_spec"]["mode"] == "concurrency" and sv["num_requests"] == 12
    assert (sv["prefix_len"], sv["suffix_len"], sv["warmup_requests"]) == (6, 2, 2)
    assert sv["goodput_requests"] is not None and sv["goodput_ttft_target_s"] == 2.0
    assert sv["gpu_telemetry_source"] is None and "CPU" in sv["gpu_telemetry_unavailable"]
    assert not (tmp_path / telemetry.FILE).exists()


def test_gpu_telemetry_goes_beside_the_record(tmp_path, monkeypatch):
    """With a GPU to read (a stand-in for NVML), the measured window is sampled: the summary
    per GPU in the record, every sample in a file beside it."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(clocks=(1410,), power_mw=(250_000,),
                                                           used_bytes=(2**31,), util=(50,)))
    sampler = telemetry.Telemetry  # a GPU to sample on this CPU platform: the stand-in's GPU 0
    monkeypatch.setattr(telemetry, "Telemetry", lambda ids, **kw: sampler(["0"], **kw))
    rec = run(tmp_path, monkeypatch, fake_engine(), n=4)
    assert rec.status == "ok", rec.reason
    sv = rec.summary
    assert (sv["gpu_telemetry_source"], sv["gpu_telemetry_gpus"], sv["gpu_telemetry_file"]) == (
        "nvml", "0", telemetry.FILE)
    assert (sv["gpu0_sm_clock_mhz_max"], sv["gpu0_power_w_mean"], sv["gpu0_mem_used_gib_max"],
            sv["gpu0_util_pct_mean"]) == (1410, 250.0, 2.0, 50)
    rows = (tmp_path / telemetry.FILE).read_text().splitlines()
    assert rows[0] == "t_s,gpu,sm_clock_mhz,power_w,mem_used_gib,util_pct"
    assert len(rows) - 1 == sv["gpu_telemetry_samples"] >= 2
