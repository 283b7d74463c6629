"""Benchmarks of the harness itself (numbers, not assertions; not collected by pytest).

    .venv/bin/python tests/bench_harness.py            # snakemake -n on config/paper.yaml
    .venv/bin/python tests/bench_harness.py --default  # + a full run of the embedded default

Prints wall-clock seconds: planning the paper's grid (target: under 10 s) and running the
embedded default in a fresh copy of the workflow (target: under 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workspaces import make_workspace, snakemake  # noqa: E402


def timed(workspace: Path, *args: str) -> float:
    start = time.perf_counter()
    res = snakemake(workspace, *args)
    if res.returncode != 0:
        raise SystemExit(f"snakemake {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--default", action="store_true", help="also time a full run of the default grid")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ws = make_workspace(Path(tmp) / "ws")
        dry = [timed(ws, "-n", "--quiet", "--configfile", "config/paper.yaml") for _ in range(3)]
        print(f"snakemake -n on config/paper.yaml: median {statistics.median(dry):.2f} s "
              f"(runs: {', '.join(f'{d:.2f}' for d in dry)})")
        if args.default:
            print(f"embedded default, full run (--cores 2): {timed(ws, '--cores', '2'):.1f} s")


if __name__ == "__main__":
    main()
