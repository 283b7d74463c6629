"""Benchmark (reported, not asserted): what the leash (llmbench.procs.leash_argv) adds to
starting a process group, as the median wall time of running a command with and without it.

    .venv/bin/python tests/bench_leash.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflow" / "scripts"))

from llmbench import procs  # noqa: E402


def median_ms(argv: list[str], repeats: int) -> float:
    """Median wall time, in ms, of running ``argv`` to completion."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    for cmd in (["/bin/true"], [sys.executable, "-c", "pass"]):
        bare, leashed = median_ms(cmd, args.repeats), median_ms(procs.leash_argv(cmd), args.repeats)
        print(f"{' '.join(cmd[-2:]):>20}: bare {bare:.1f} ms, leashed {leashed:.1f} ms, "
              f"overhead {leashed - bare:.1f} ms (median of {args.repeats})")


if __name__ == "__main__":
    main()
