"""The platform's compute dtype: bf16 (the paper's, DeepSpeed's bf16 mode) or fp32 (the CPU
platform, where bf16 matmuls are emulated), as the platforms state and validate it. Real
cells in each dtype: tests/integration/test_dtype_cells.py."""
import shutil

import pytest
import yaml

from llmbench import grid
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
