"""The platform's compute dtype: bf16 (the paper's, DeepSpeed's bf16 mode) or fp32 (the CPU
platform, where bf16 matmuls are emulated), through real DeepSpeed cells on the tiny model.
ZeRO-3 builds its model under zero.Init, which on a CPU once turned fp32 into bf16."""
import shutil

import pytest
import yaml

from llmbench import grid, launch
from llmbench.config import ConfigError
from llmbench.platforms import Platform

PROTOCOL = {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 64, "timeout_s": 600}


def test_shipped_platforms_compute_in_bf16_except_the_cpu():
    assert Platform.load("cpu").compute_dtype == "float32"
    assert {Platform.load(n).compute_dtype for n in ("a800", "rtx4090", "rtx3090", "h100", "h200")} == {"bfloat16"}


def test_a_bad_compute_dtype_names_the_key(tmp_path, repo):
    shutil.copytree(repo / "config", tmp_path / "config")
    path = tmp_path / "config" / "platforms" / "cpu.yaml"
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "compute_dtype": "float16"}))
    with pytest.raises(ConfigError, match=r"compute_dtype: 'float16' is not allowed; allowed values: 'bfloat16', 'float32'"):
        grid.expand({"protocol": PROTOCOL, "pretrain": [
            {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]}]}, root=tmp_path)


@pytest.mark.parametrize("dtype, short", [("float32", "fp32"), ("bfloat16", "bf16")])
def test_cells_train_in_the_platforms_dtype(tmp_path, dtype, short):
    g = grid.expand({"protocol": PROTOCOL, "pretrain": [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z2", "Z3", "Q"], "batch_sizes": [1]}]})
    for c in g.cells:
        spec = g.spec(c)
        spec["platform"]["compute_dtype"] = dtype
        rec = launch.run_cell(spec, tmp_path / f"{c.technique}.json", tmp_path / f"{c.technique}.log", threads=2)
        assert rec.status == "ok", rec.reason
        assert rec.metrics.compute_dtype == short
        assert rec.provenance["ds_config"]["bf16"]["enabled"] is (dtype == "bfloat16")
        if c.technique == "Q":
            assert f"{short} compute" in rec.metrics.trainable_desc
