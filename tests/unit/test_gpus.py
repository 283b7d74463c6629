"""llmbench.gpus: a busy GPU is an error, not an OOM. NVML is faked (this machine has no
GPU): the reader is injected, and the runners are run for real on a spec whose platform
says cuda, with the stand-in worker and the test-double engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmbench import config, gpus, grid, launch
from llmbench.gpus import BusyPolicy, GpuInfo, GpuProcess

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")


def gpu(gid="0", used=0.3, procs=()):
    return GpuInfo(id=gid, name="Fake H100", total_gib=80.0, used_gib=used, free_gib=80.0 - used,
                   processes=tuple(GpuProcess(pid=p, used_gib=g) for p, g in procs))


def reader_of(*states):
    """A fake NVML: each read returns the next state (the last one repeats)."""
    calls = []

    def read(ids):
        calls.append(list(ids))
        state = states[min(len(calls), len(states)) - 1]
        return [state(i) for i in ids]
    read.calls = calls
    return read


FREE = lambda gid: gpu(gid)  # noqa: E731
HELD = lambda gid: gpu(gid, used=30.5, procs=[(4242, 30.0)])  # noqa: E731


def test_the_cells_gpus_come_from_the_scheduler_then_the_count():
    assert gpus.cell_gpu_ids(2, "cpu", {"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert gpus.cell_gpu_ids(1, "cuda", {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2"]
    assert gpus.cell_gpu_ids(2, "cuda", {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert gpus.cell_gpu_ids(2, "cuda", {"SLURM_JOB_GPUS": "4,5"}) == ["4", "5"]
    assert gpus.cell_gpu_ids(2, "cuda", {}) == ["0", "1"]


def test_free_gpus_pass_and_their_state_goes_to_provenance():
    check = gpus.check("cuda", 2, reader=reader_of(FREE), env={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert check.busy is None
    state = check.provenance()["gpu_state"]
    assert [g["id"] for g in state["gpus"]] == ["3", "1"] and state["gpus"][0]["free_gib"] == pytest.approx(79.7)


def test_a_foreign_process_makes_the_gpu_busy():
    check = gpus.check("cuda", 1, reader=reader_of(HELD), env={})
    assert check.busy == "GPU busy: pid 4242 holds 30.00 GiB on GPU 0"
    assert check.provenance()["gpu_state"]["gpus"][0]["processes"] == [{"pid": 4242, "used_gib": 30.0}]


def test_memory_in_use_without_a_listed_process_is_busy_past_the_threshold():
    hidden = lambda gid: gpu(gid, used=12.0)  # noqa: E731
    assert "12.00 GiB in use by no listed process" in gpus.check("cuda", 1, reader=reader_of(hidden), env={}).busy
    assert gpus.check("cuda", 1, BusyPolicy(used_threshold_gib=20), reader=reader_of(hidden), env={}).busy is None


def test_wait_polls_until_the_gpu_is_free_or_the_wait_is_over():
    now = [0.0]
    clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    read = reader_of(HELD, HELD, FREE)
    check = gpus.check("cuda", 1, BusyPolicy(action="wait", wait_s=60, poll_s=5), reader=read, env={},
                       sleep=sleep, clock=clock)
    assert check.busy is None and check.waited_s == 10 and len(read.calls) == 3
    now[0] = 0.0
    check = gpus.check("cuda", 1, BusyPolicy(action="wait", wait_s=12, poll_s=5), reader=reader_of(HELD), env={},
                       sleep=sleep, clock=clock)
    assert check.busy.startswith("GPU busy: pid 4242") and "after waiting 12 s of gpu_busy_wait_s=12" in check.busy


def test_no_nvml_does_not_stop_the_cell_and_says_why():
    def broken(ids):
        raise ModuleNotFoundError("No module named 'pynvml'")
    check = gpus.check("cuda", 1, reader=broken, env={})
    assert check.busy is None and "pynvml" in check.provenance()["gpu_state"]["error"]


def test_cpu_cells_read_nothing():
    def never(ids):
        raise AssertionError("read on a CPU")
    assert gpus.check("cpu", 1, reader=never).provenance() == {}


def test_the_policy_comes_from_the_config_and_the_schema_checks_it():
    assert BusyPolicy.from_config({}) == BusyPolicy()
    assert BusyPolicy.from_config({"gpu_busy": "wait", "gpu_busy_wait_s": 30}).wait_s == 30.0
    with pytest.raises(ValueError, match="gpu_busy must be"):
        BusyPolicy(action="maybe")
    base = {"protocol": {}}
    assert config.validate(dict(base), "config", "t")["gpu_busy"] == "error"
    with pytest.raises(config.ConfigError, match="gpu_busy"):
        config.validate({**base, "gpu_busy": "maybe"}, "config", "t")


@pytest.fixture
def cuda_spec(monkeypatch):
    """A training cell on a 'cuda' platform whose worker is the stand-in (it runs on the CPU)."""
    monkeypatch.setitem(launch.WORKERS, "deepspeed", "fake_worker")
    monkeypatch.setenv("PYTHONPATH", FIXTURES)
    monkeypatch.setenv("FAKE_MODE", "ok")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    g = grid.expand({"protocol": {"warmup_steps": 0, "measured_steps": 1, "repeats": 1, "seq_len": 8},
                     "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"],
                                   "batch_sizes": [1]}]})
    spec = g.spec(g.cells[0])
    spec["platform"]["accelerator"] = "cuda"
    return spec


def test_a_training_cell_on_a_busy_gpu_is_an_error_and_runs_nothing(cuda_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "read_nvml", reader_of(HELD))
    rec = launch.run_cell(cuda_spec, tmp_path / "record.json", tmp_path / "run.log")
    assert rec.status == "error" and rec.reason == "GPU busy: pid 4242 holds 30.00 GiB on GPU 0"
    assert "=== repeat 0" not in (tmp_path / "run.log").read_text()  # no worker started
    assert rec.provenance["gpu_state"]["gpus"][0]["processes"][0]["pid"] == 4242


def test_a_training_cell_on_free_gpus_runs_and_records_their_state(cuda_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "read_nvml", reader_of(FREE))
    rec = launch.run_cell(cuda_spec, tmp_path / "record.json", tmp_path / "run.log")
    assert rec.status == "ok", rec.reason
    assert rec.provenance["gpu_state"]["gpus"][0]["free_gib"] == pytest.approx(79.7)


def test_a_serving_cell_on_a_busy_gpu_starts_no_engine(tmp_path, monkeypatch):
    from test_serve_cell import fake_engine, no_orphans

    from llmbench import record
    from llmbench.grid import ServeCell
    from llmbench.models import ModelSpec
    from llmbench.serve import bench, engines

    monkeypatch.setattr(gpus, "read_nvml", reader_of(HELD))
    monkeypatch.setitem(engines.ENGINES, "transformers", fake_engine())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cell = ServeCell(platform="cpu", model="tiny", engine="transformers", load="b", gpus=1,
                     load_spec={"mode": "burst", "num_requests": 4, "input_len": 8, "output_len": 4,
                                "warmup_requests": 0, "request_timeout_s": 20}, ready_timeout_s=30, timeout_s=60)
    spec = {"cell": cell.to_dict(), "model": ModelSpec.load("tiny").to_dict(), "engine_python": None,
            "platform": {"accelerator": "cuda", "env": {}, "name": "cpu"}}
    rec = bench.run_cell(spec, tmp_path, tmp_path / "record.json", tmp_path / "cell.log", tmp_path / "server.log")
    assert record.read(tmp_path / "record.json") == rec
    assert rec.status == "error" and rec.reason.startswith("GPU busy: pid 4242")
    assert (tmp_path / "server.log").read_text() == "" and no_orphans()  # the engine never started
    assert rec.provenance["gpu_state"]["gpus"][0]["used_gib"] == 30.5


def test_a_microbenchmark_cell_on_a_busy_gpu_is_an_error_and_runs_nothing(tmp_path, monkeypatch):
    from llmbench.micro import bench as micro_bench

    monkeypatch.setattr(gpus, "read_nvml", reader_of(HELD))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    g = grid.expand({"protocol": {}, "micro": [{"platforms": ["cpu"], "warmup": 1, "iters": 1,
                                                 "memcpy": {"min_bytes": 1024, "max_bytes": 2048}}]})
    spec = g.spec(g.cells[0])
    spec["platform"]["accelerator"] = "cuda"
    rec = micro_bench.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log")
    assert rec.status == "error" and rec.reason.startswith("GPU busy: pid 4242") and rec.samples == {}
    assert "GPU state at start: GPU busy" in (tmp_path / "run.log").read_text()
    assert rec.provenance["gpu_state"]["gpus"][0]["processes"][0]["pid"] == 4242
