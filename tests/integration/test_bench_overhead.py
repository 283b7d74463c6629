"""tests/bench_overhead.py runs on the CPU (issue 18): the pipeline's L cell through the
launcher and the plain loop's variants in a child of their own, on the tiny model. Its
numbers are a benchmark's and are not asserted; what is checked is that every side ran
the same model and that each ratio is computed from windows that were timed."""

import json
import subprocess
import sys

from conftest import REPO


def test_the_overhead_benchmark_runs_the_cell_and_every_plain_variant_on_the_cpu(tmp_path):
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "bench_overhead.py"), "--model", "tiny", "--device", "cpu",
         "--techniques", "L", "--batch", "1", "--warmup", "1", "--steps", "2", "--threads", "1",
         "--timeout-s", "300", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["technique"], r["batch"], r["status"]) for r in rows] == [("L", 1, "ok")]
    row = rows[0]
    # tiny: 2 decoder layers x 7 adapted linears x (A, B)
    assert row["trainable_tensors"] == 28
    plain, cell = row["plain_rounds"][0], row["cell_rounds"][0]
    assert plain["trainable_params"] == cell["trainable_params"] > 0
    tps = plain["variants_tokens_per_s"]
    assert set(tps) == {"plain", "plain_first", "plain_last", "overflow", "master"}
    assert all(v > 0 for v in tps.values())
    assert plain["tokens_per_s"] == (tps["plain_first"] + tps["plain_last"]) / 2
    assert row["cell_over_plain"] == cell["tokens_per_s"] / plain["tokens_per_s"]
    assert row["overflow_over_plain"] == tps["overflow"] / tps["plain"]
    assert "master_over_plain" in proc.stdout  # the printed table has every ratio


def test_an_unknown_variant_is_refused_by_name():
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "bench_overhead.py"), "--variants", "plain,fast"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--variants" in proc.stderr and "'plain,fast'" in proc.stderr
