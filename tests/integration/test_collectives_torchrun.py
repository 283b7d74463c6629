"""The collectives microbenchmark over 2 gloo processes under torchrun, for real: every op
and size checked for a correct result, bandwidths as nccl-tests define them. The rest of
llmbench.micro in one process: tests/unit/test_micro.py."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from llmbench.micro import collectives


def _finite_positive(x: float) -> bool:
    return math.isfinite(x) and x > 0


def test_collectives_two_ranks_through_torchrun(tmp_path, repo):
    ops = list(collectives.OPS)
    spec = {"ops": ops, "sizes_bytes": [8, 1000, 1 << 16], "warmup": 1, "iters": 3, "accelerator": "cpu"}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(repo / "workflow" / "scripts"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "llmbench.micro.collectives", "--spec", str(tmp_path / "spec.json"),
         "--out", str(tmp_path / "rows.json")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(r["op"], r["bytes_requested"]) for r in rows] == [(op, s) for op in ops for s in spec["sizes_bytes"]]
    for r in rows:
        assert r["correct"] is True, r
        assert r["world_size"] == 2 and r["backend"] == "gloo"
        assert _finite_positive(r["time_s"])
        assert r["algbw_gb_per_s"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gb_per_s"] == pytest.approx(r["algbw_gb_per_s"] * collectives.BUS_FACTOR[r["op"]](2))
        # nccl-tests' size: the whole gathered / scattered buffer, a multiple of n elements
        assert r["bytes"] == r["bytes_requested"]
        if r["op"] in ("all_gather", "reduce_scatter"):
            assert r["bytes"] % (2 * 4) == 0
    assert not list(tmp_path.glob("*.tmp"))
