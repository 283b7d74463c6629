"""A compact text table of the records under a folder (for terminals and device runs).

    python -m llmbench.report.summary results/runs
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import tidy


def render(folder: Path) -> str:
    """One line per record: cell, status, tokens/s, peak memory, MFU, reason."""
    df = tidy.build(sorted(Path(folder).rglob("record.json")))
    lines = [f"{'platform':<9} {'model':<10} {'technique':<10} {'bs':>4} {'g':>2} {'status':<7} "
             f"{'tok/s':>10} {'±std':>7} {'M GiB':>7} {'alloc':>7} {'MFU':>6}  reason"]
    for r in df.itertuples():
        def num(v, fmt):
            return "" if v is None or v != v else format(v, fmt)
        lines.append(
            f"{r.platform:<9} {r.model:<10} {r.technique:<10} {r.batch_size:>4} {r.gpus:>2} {r.status:<7} "
            f"{num(r.tokens_per_s_mean, ',.1f'):>10} {num(r.tokens_per_s_std, '.1f'):>7} "
            f"{num(r.peak_mem_gib, '.2f'):>7} {num(r.peak_mem_allocated_gib, '.2f'):>7} "
            f"{num(r.mfu * 100 if r.mfu == r.mfu and r.mfu is not None else None, '.1f'):>6}  {str(r.reason or '')[:90]}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Path(sys.argv[1] if len(sys.argv) > 1 else "results/runs")))
