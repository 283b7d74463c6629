"""A GPU cell on a busy or free GPU (fake NVML, tests/fixtures/fake_nvml.py), run for real
through its launcher: a busy GPU is an error and nothing starts; a free one runs and its
state goes to the record (llmbench.gpus)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llmbench import backends, grid, gpus, launch

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
sys.path.insert(0, FIXTURES)
from fake_nvml import FREE, HELD, reader_of  # noqa: E402


@pytest.fixture
def cuda_spec(monkeypatch):
    """A training cell on a 'cuda' platform whose worker is the stand-in (it runs on the CPU)."""
    monkeypatch.setitem(backends.BACKENDS, "deepspeed", replace(backends.BACKENDS["deepspeed"], worker="fake_worker"))
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


def test_a_training_cell_on_another_platforms_gpu_is_an_error_and_runs_nothing(cuda_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "read_nvml", reader_of(FREE))  # a free 'Fake H100'
    cuda_spec["platform"].update(name="h200", gpu_name="H200")
    rec = launch.run_cell(cuda_spec, tmp_path / "record.json", tmp_path / "run.log")
    assert rec.status == "error" and rec.reason.startswith("wrong GPU: GPU 0 is 'Fake H100', not platform h200's")
    assert "=== repeat 0" not in (tmp_path / "run.log").read_text()  # no worker started


def test_a_training_cell_on_free_gpus_runs_and_records_their_state(cuda_spec, tmp_path, monkeypatch):
    monkeypatch.setattr(gpus, "read_nvml", reader_of(FREE))
    rec = launch.run_cell(cuda_spec, tmp_path / "record.json", tmp_path / "run.log")
    assert rec.status == "ok", rec.reason
    assert rec.provenance["gpu_state"]["gpus"][0]["free_gib"] == pytest.approx(79.7)


def test_a_serving_cell_on_a_busy_gpu_starts_no_engine(tmp_path, monkeypatch):
    from test_serve_cell import fake_engine, no_orphans

    from llmbench import record
    from llmbench.cells import ServeCell
    from llmbench.models import ModelSpec
    from llmbench.platforms import Platform
    from llmbench.serve import bench, engines

    monkeypatch.setattr(gpus, "read_nvml", reader_of(HELD))
    monkeypatch.setitem(engines.ENGINES, "transformers", fake_engine())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cell = ServeCell(platform="cpu", model="tiny", engine="transformers", load="b", gpus=1,
                     load_spec={"mode": "burst", "num_requests": 4, "input_len": 8, "output_len": 4,
                                "warmup_requests": 0, "request_timeout_s": 20}, ready_timeout_s=30, timeout_s=60)
    spec = {"cell": cell.to_dict(), "model": ModelSpec.load("tiny").to_dict(), "engine_python": None,
            "platform": {**Platform.load("cpu").to_dict(), "accelerator": "cuda"}}
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
