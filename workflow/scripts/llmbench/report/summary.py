"""A compact text table of the records under a folder (for terminals and device runs).

    python -m llmbench.report.summary results/runs
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import tidy


def num(v, fmt: str) -> str:
    """A number formatted, or empty for None/NaN."""
    return "" if v is None or v != v else format(v, fmt)


def render(folder: Path) -> str:
    """One line per record: cell, status, tokens/s, peak memory, MFU, reason (training);
    then the serving records (engine, load, output tokens/s, latency, memory) and the
    microbenchmark records (bench, case, points, best GEMM TFLOP/s)."""
    df = tidy.build(sorted(Path(folder).rglob("record.json")))
    serve, micro = df[df["stage"] == "serve"], df[df["stage"] == "micro"]
    train = df[~df["stage"].isin(["serve", "micro"])]
    lines = [f"{'platform':<9} {'model':<10} {'technique':<10} {'bs':>4} {'g':>2} {'status':<7} "
             f"{'tok/s':>10} {'±std':>7} {'M GiB':>7} {'alloc':>7} {'MFU':>6}  reason"] if len(train) else []
    for r in train.itertuples():
        lines.append(
            f"{r.platform:<9} {r.model:<10} {r.technique:<10} {num(r.batch_size, '.0f'):>4} {r.gpus:>2} {r.status:<7} "
            f"{num(r.tokens_per_s_mean, ',.1f'):>10} {num(r.tokens_per_s_std, '.1f'):>7} "
            f"{num(r.peak_mem_gib, '.2f'):>7} {num(r.peak_mem_allocated_gib, '.2f'):>7} "
            f"{num(r.mfu * 100 if r.mfu == r.mfu and r.mfu is not None else None, '.1f'):>6}  {str(r.reason or '')[:90]}"
        )
    if len(serve):
        lines.append(f"{'platform':<9} {'model':<10} {'engine':<12} {'load':<12} {'g':>2} {'status':<7} "
                     f"{'out tok/s':>10} {'req/s':>7} {'p50 TTFT':>9} {'p50 E2E':>8} {'M GiB':>7}  reason")
    for r in serve.itertuples():
        lines.append(
            f"{r.platform:<9} {r.model:<10} {r.engine:<12} {r.load:<12} {r.gpus:>2} {r.status:<7} "
            f"{num(r.output_tokens_per_s, ',.1f'):>10} {num(r.request_throughput_per_s, '.2f'):>7} "
            f"{num(r.p50_ttft_s, '.3f'):>9} {num(r.p50_e2e_latency_s, '.3f'):>8} {num(r.peak_mem_gib, '.2f'):>7}  "
            f"{str(r.reason or '')[:90]}")
    if len(micro):
        lines.append(f"{'platform':<9} {'bench':<12} {'case':<24} {'g':>2} {'status':<7} {'points':>6} "
                     f"{'best TFLOP/s':>12} {'correct':>7}  reason")
    for r in micro.itertuples():
        lines.append(f"{r.platform:<9} {r.bench:<12} {r.case:<24} {r.gpus:>2} {r.status:<7} {num(r.points, '.0f'):>6} "
                     f"{num(r.best_tflops, '.2f'):>12} {str(r.all_correct):>7}  {str(r.reason or '')[:90]}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(Path(sys.argv[1] if len(sys.argv) > 1 else "results/runs")))
