"""tests/bench_fsdp2.py runs on the CPU: the pipeline's FSDP2 Z3 cell through the launcher and
the plain FSDP2 loop under torchrun beside it, on the tiny model over gloo. Its numbers are a
benchmark's and are not asserted; what is checked is that both sides ran the same cell, that
the ratio is computed from the two timed windows, and that --no-batch-1 measures --batch alone."""

import json
import math
import subprocess
import sys

from conftest import REPO


def test_the_fsdp2_benchmark_runs_the_cell_and_the_plain_loop_on_the_cpu(tmp_path):
    out = tmp_path / "fsdp2.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "bench_fsdp2.py"), "--model", "tiny", "--device", "cpu",
         "--techniques", "Z3", "--batch", "2", "--no-batch-1", "--warmup", "1", "--steps", "1", "--threads", "1",
         "--seq-len", "64", "--timeout-s", "300", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["technique"], r["batch"], r["gpus"], r["status"]) for r in rows] == [("Z3", 2, 1, "ok")]  # --no-batch-1: batch 2 alone
    row = rows[0]
    plain, cell = row["plain_rounds"][0], row["cell_rounds"][0]
    assert plain["attention"] == cell["attention"] and math.isfinite(plain["loss_last"])
    assert row["cell_over_plain"] == cell["tokens_per_s"] / plain["tokens_per_s"]
    assert "cell_over_plain" in proc.stdout


def test_a_batch_below_one_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "bench_fsdp2.py"), "--batch", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--batch" in proc.stderr
