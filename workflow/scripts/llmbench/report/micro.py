"""Microbenchmark tables (paper Section VII) from the per-point table (tables/micro.parquet):
GEMM (Fig. 11; Table XII beside the paper's), memcpy (Fig. 12), collectives (Figs. 13-15).

Every table is written as CSV (one row per measured point, or per Table XII shape) and as
Markdown (a summary per platform and case; the CSV has the full sweep).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import reference
from . import render
from .render import fmt

KEY = ["platform", "bench", "case", "gpus"]


def points(micro: pd.DataFrame, bench: str) -> pd.DataFrame:
    """The measured points of one benchmark, all columns that benchmark has."""
    df = micro[micro["bench"] == bench] if "bench" in micro else micro.iloc[0:0]
    # a benchmark's own columns (the table holds every benchmark's); none run: the keys only
    return (df.dropna(axis=1, how="all") if len(df) else df).reset_index(drop=True)


def gemm(micro: pd.DataFrame) -> render.Table:
    """Every GEMM point (CSV) and the best point per platform and case (Markdown)."""
    df = points(micro, "gemm")
    rows = []
    for (plat, case), g in df.groupby(["platform", "case"], sort=True) if len(df) else []:
        best = g.loc[g["tflops"].idxmax()]
        rows.append([plat, case, str(len(g)), f"{int(best.m)}x{int(best.n)}x{int(best.k)}", fmt(best.tflops, ".2f"),
                     fmt(best.get("pct_of_peak"), ".1f"), fmt(g["tflops"].median(), ".2f"),
                     fmt(best.get("plain_tflops"), ".2f"), fmt(100 * best.get("vs_plain", float("nan")), ".1f"),
                     "yes" if g["correct"].astype(bool).all() else "NO"])
    return render.simple("micro-gemm", df, ["Platform", "Case", "Points", "Best M x N x K", "Best TFLOP/s", "% of peak",
                                    "Median TFLOP/s", "Plain matmul TFLOP/s", "% of plain", "Correct"], rows,
                         "TFLOP/s = 2·M·N·K / median time of `torch.matmul` (bf16 unless the case says otherwise); "
                         "% of the platform's datasheet dense peak. Plain matmul: the same shape as back-to-back "
                         "`torch.matmul` calls timed as one window (no events, no out=), right after, in shape sets "
                         "only; '% of plain' is the harness's best point against it. "
                         "'Correct': each shape checked against float64.")


def memcpy(micro: pd.DataFrame) -> render.Table:
    """Every copy point (CSV) and per direction the small-copy latency and large-copy bandwidth."""
    df = points(micro, "memcpy")
    rows = []
    if len(df):
        for (plat, direction, pinned), g in df.groupby(["platform", "direction", "pinned"], sort=True):
            small, large = g.loc[g["bytes"].idxmin()], g.loc[g["bytes"].idxmax()]
            rows.append([plat, direction, "pinned" if pinned else "pageable", fmt(small.bytes, ".0f"),
                         fmt(small.time_s * 1e6, ".1f"), fmt(large.bytes, ".0f"), fmt(large.gb_per_s, ".2f"),
                         str(g["label"].iloc[0]) if "label" in g else ""])
    return render.simple("micro-memcpy", df, ["Platform", "Direction", "Host memory", "Smallest B", "Latency µs",
                                      "Largest B", "GB/s", "What"], rows,
                         "GB/s = 1e9 bytes per second (decimal), median over iterations. On a CPU platform there is no "
                         "device: the rows are host-memory copies, NOT host<->device transfers.")


def collectives(micro: pd.DataFrame) -> render.Table:
    """Every collective point (CSV) and per op the small-size latency and large-size bus bandwidth."""
    df = points(micro, "collectives")
    rows = []
    if len(df):
        for (plat, case, op), g in df.groupby(["platform", "case", "op"], sort=True):
            small, large = g.loc[g["bytes"].idxmin()], g.loc[g["bytes"].idxmax()]
            rows.append([plat, case, op, fmt(large.world_size, ".0f"), fmt(small.time_s * 1e6, ".1f"),
                         fmt(large.bytes, ".0f"), fmt(large.algbw_gb_per_s, ".2f"), fmt(large.busbw_gb_per_s, ".2f"),
                         "yes" if g["correct"].astype(bool).all() else "NO"])
    return render.simple("micro-collectives", df, ["Platform", "P2P", "Op", "Ranks", "Latency µs (smallest)", "Largest B",
                                           "algbw GB/s", "busbw GB/s", "Correct"], rows,
                         "nccl-tests' definitions: algbw = bytes / time (time: median over iterations of the slowest rank); "
                         "busbw = algbw x 2(n-1)/n (AllReduce), x (n-1)/n (AllGather, ReduceScatter), x 1 (Reduce, "
                         "Broadcast). nop2p: NCCL_P2P_DISABLE=1. On a CPU platform: gloo over local processes.")


def table12(micro: pd.DataFrame, root: Path | None = None) -> render.Table:
    """Table XII: the paper's two MLP GEMMs, ours at the same shapes on every platform measured."""
    ref = reference.load("table12", **({"root": root} if root else {}))
    df = points(micro, "gemm")
    out = []
    for r in ref.itertuples():
        hits = df[(df.get("m") == r.m) & (df.get("n") == r.n) & (df.get("k") == r.k)] if len(df) else df
        if len(hits) == 0:
            out.append({**r._asdict(), "platform": None, "ours_time_ms": None, "ours_pct_of_peak": None,
                        "ours_tflops": None})
        for h in hits.itertuples():
            out.append({**r._asdict(), "platform": h.platform, "ours_time_ms": h.time_s * 1e3,
                        "ours_pct_of_peak": getattr(h, "pct_of_peak", None), "ours_tflops": h.tflops})
    table = pd.DataFrame(out).drop(columns=["Index"])
    rows = [[str(r.method), f"{r.m},{r.n},{r.k}", fmt(r.time_ms, ".3f"), fmt(r.peak_pct, ".1f"),
             str(r.platform or ""), fmt(r.ours_time_ms, ".3f"), fmt(r.ours_pct_of_peak, ".1f"),
             fmt(r.ours_tflops, ".2f")] for r in table.itertuples()]
    return render.simple("table12", table, ["Method", "Shape (M,N,K)", "paper A800 ms", "paper peak %", "ours: platform",
                                 "ours ms", "ours % of peak", "ours TFLOP/s"], rows,
                         "Ours: median of the timed calls (the paper: mean of 320 measurements); peak: each platform's "
                         "datasheet dense bf16 peak (config/platforms). Empty: that shape was not measured.")
