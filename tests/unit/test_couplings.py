"""Couplings between modules that nothing else would hold: each list that must follow
another is tested against it, and the report asks the backend registry what a backend is
for rather than naming it."""

import dataclasses
import os
import re
import sys
import types
from pathlib import Path

import pytest
import yaml

from llmbench import backends, grid, record
from llmbench.gpus import UsedMemory
from llmbench.record import Metrics, Record
from llmbench.report import paper_tables, profile, tidy
from llmbench.serve.engines import ENGINES
from llmbench.serve.server import MemorySampler

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "workflow" / "scripts" / "llmbench"
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from fake_nvml import gpu, reader_of  # noqa: E402


def engine_enums() -> dict[str, list]:
    """Every enum of the schemas under a key named engine...: where it is -> its values."""
    found = {}

    def walk(node, where, in_engine):
        if isinstance(node, dict):
            if in_engine and "enum" in node:
                found[where] = node["enum"]
            for k, v in node.items():
                walk(v, f"{where}.{k}", in_engine or str(k).startswith("engine"))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]", in_engine)

    for path in sorted((REPO / "workflow" / "schemas").glob("*.yaml")):
        walk(yaml.safe_load(path.read_text()), path.name, False)
    return found


def test_the_schemas_engine_enums_are_the_engine_registry():
    enums = engine_enums()
    assert sorted(enums) == ["config.schema.yaml.$defs.serve_block.properties.engine_args.propertyNames",
                             "config.schema.yaml.$defs.serve_block.properties.engines.items",
                             "config.schema.yaml.properties.engine_python.propertyNames"], sorted(enums)
    for where, values in enums.items():
        assert sorted(values) == sorted(ENGINES), where


#: a comparison of a backend column or field with a name: df["backend"] == "deepspeed", c.backend != "torch"
BACKEND_NAME_FILTER = re.compile(r"""backend"?\]?\)?\s*[!=]=\s*["']""")


def test_no_report_filters_on_a_backend_name():
    """The registry says which backends' cells are the paper's methods and which runs each
    kind of profile; findings (its claims name backends as the paper does) and runs (which
    record of a cell is used) aside."""
    sources = {p.name: p.read_text() for p in sorted((LIBRARY / "report").glob("*.py"))
               if p.name not in ("findings.py", "runs.py")}
    offenders = [f"{name}:{n}: {line.strip()}" for name, text in sources.items()
                 for n, line in enumerate(text.splitlines(), 1) if BACKEND_NAME_FILTER.search(line)]
    assert offenders == []
    assert BACKEND_NAME_FILTER.search('df[(df["backend"] == "deepspeed")]')  # the pattern finds what it is for
    assert BACKEND_NAME_FILTER.search('if c.backend == "deepspeed":')
    # the profile tables name kinds of profile, which the registry maps to backends
    kinds = re.findall(r"""_ok\(\w+, ["'](\w+)["']\)""", sources["profile.py"])
    assert kinds and set(kinds) <= set(backends.PROFILES), kinds


def write(tmp_path, backend, technique, tps, stage="pretrain"):
    block = {"platforms": ["cpu"], "models": ["tiny"], "techniques": [technique], "batch_sizes": [1]}
    if backend != backends.default(stage):
        block["backend"] = backend
    c = grid.expand({"protocol": {}, stage: [block]}).cells[0]
    path = tmp_path / c.record_path("results")
    record.write(Record(cell=c.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=tps)), path)
    return path


def test_the_method_tables_read_the_backends_the_registry_marks(monkeypatch, tmp_path):
    """Table III holds the cells of the backends whose cells are the paper's methods
    (DeepSpeed's today): mark another one and its cells come in, with nothing else changed."""
    df = tidy.build([write(tmp_path, "deepspeed", "Naive", 100.0), write(tmp_path, "megatron", "F", 90.0)])

    def ours():
        long = paper_tables.build(df, "table3")
        return sorted(long[(long["platform"] == "cpu") & long["tokens_per_s"].notna()]["technique"])

    assert backends.method_backends() == ("deepspeed",)
    assert ours() == ["Naive"]
    monkeypatch.setitem(backends.BACKENDS, "megatron", dataclasses.replace(backends.BACKENDS["megatron"],
                                                                           paper_methods=True))
    assert ours() == ["F", "Naive"]


def test_the_profile_tables_read_the_backend_that_runs_each_kind_of_profile(monkeypatch):
    import pandas as pd

    df = pd.DataFrame({"stage": ["profile"] * 3, "backend": ["torch", "inference", "deepspeed"],
                       "status": ["ok"] * 3})
    assert [list(profile._ok(df, k)["backend"]) for k in ("training", "inference", "communication")] == [
        ["torch"], ["inference"], ["deepspeed"]]
    monkeypatch.setitem(backends.PROFILES, "training", "inference")
    assert list(profile._ok(df, "training")["backend"]) == ["inference"]


def fake_pynvml(used_bytes: dict[str, int], calls: list[str]):
    """pynvml's names over GPUs whose memory in use the test sets (bytes per handle)."""

    class NVMLError(Exception):
        pass

    def memory(h):
        calls.append(f"mem {h}")
        if used_bytes[h] is None:
            raise NVMLError("Unknown Error")
        return types.SimpleNamespace(used=used_bytes[h])

    return types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: f"idx{i}", nvmlDeviceGetHandleByUUID=lambda u: f"uuid{u}",
        nvmlDeviceGetMemoryInfo=memory)


def test_the_serving_sampler_reads_gpu_memory_through_one_nvml_session(monkeypatch):
    """Every sample is one NVML call a GPU in one session (gpus.UsedMemory): no process forked
    per sample, no nvmlInit per sample."""
    calls, used = [], {"idx0": 2 * 2**30, "uuidGPU-b": 2**30}
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(used, calls))
    with UsedMemory(["0", "GPU-b"]) as mem:
        assert mem.read() == 3.0
        used["idx0"] = 5 * 2**30
        assert mem.read() == 6.0
        used["idx0"] = None  # a read the driver fails: no number, not an exception
        assert mem.read() is None
    assert calls.count("init") == 1 and calls[-1] == "shutdown"
    assert calls.count("mem idx0") == 3
    assert UsedMemory([]).__enter__().read() is None  # a CPU cell reads nothing


def test_the_serving_sampler_forks_no_tool(monkeypatch, tmp_path):
    """The peak is NVML's reading less the baseline; an nvidia-smi on PATH is never run."""
    marker = tmp_path / "nvidia-smi-ran"
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir()
    tool.write_text(f"#!/bin/sh\ntouch {marker}\necho 1\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    read = reader_of(lambda i: gpu(i, used=1.0), lambda i: gpu(i, used=4.0), lambda i: gpu(i, used=3.0))
    with UsedMemory(["0", "1"], reader=read) as mem:
        sampler = MemorySampler(os.getpid(), mem.read, mem.read())
        sampler.sample()
        sampler.sample()
        peaks = sampler.stop()
    assert peaks["server_peak_gpu_mem_gib"] == pytest.approx(8.0 - 2.0)
    assert read.calls == [["0", "1"]] * 3 and not marker.exists()
