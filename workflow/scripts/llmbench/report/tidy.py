"""The tidy table: one row per Record, flat columns with units in their names."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pandas as pd

from ..record import Record, read

COLUMNS = [
    "stage", "platform", "model", "backend", "technique", "batch_size", "gpus", "seq_len",
    "status", "reason", "tokens_per_s_mean", "tokens_per_s_std", "tokens_per_s_runs",
    "step_time_s_mean", "peak_mem_gib", "peak_mem_kind", "peak_mem_allocated_gib",
    "peak_mem_reserved_gib", "peak_rss_gib", "mfu", "total_params", "trainable_params",
    "attention", "warmup_steps", "measured_steps", "repeats", "git_sha", "record_path",
]


def row(record: Record, path: str) -> dict:
    """Flatten one Record. peak_mem_gib is the paper's "M": reserved GPU memory on a GPU
    (what the allocator holds, close to what nvidia-smi shows), peak RSS on a CPU."""
    c, m = record.cell, record.metrics
    proto = c["protocol"]
    gpu_mem = m.peak_mem_reserved_gib
    return {
        "stage": c["stage"], "platform": c["platform"], "model": c["model"],
        "backend": c["backend"], "technique": c["technique"], "batch_size": c["batch_size"],
        "gpus": c["gpus"], "seq_len": proto["seq_len"], "status": record.status,
        "reason": record.reason, "tokens_per_s_mean": m.tokens_per_s_mean,
        # a single run has no spread: leave std empty rather than print a misleading 0
        "tokens_per_s_std": m.tokens_per_s_std if len(m.tokens_per_s_runs) > 1 else None,
        "tokens_per_s_runs": ";".join(f"{v:.6g}" for v in m.tokens_per_s_runs),
        "step_time_s_mean": m.step_time_s_mean,
        "peak_mem_gib": gpu_mem if gpu_mem is not None else m.peak_rss_gib,
        "peak_mem_kind": "gpu_reserved" if gpu_mem is not None else ("host_rss" if m.peak_rss_gib is not None else None),
        "peak_mem_allocated_gib": m.peak_mem_allocated_gib,
        "peak_mem_reserved_gib": m.peak_mem_reserved_gib, "peak_rss_gib": m.peak_rss_gib,
        "mfu": m.mfu, "total_params": m.total_params, "trainable_params": m.trainable_params,
        "attention": m.attention, "warmup_steps": proto["warmup_steps"],
        "measured_steps": proto["measured_steps"], "repeats": proto["repeats"],
        "git_sha": (record.provenance.get("git") or {}).get("sha"), "record_path": path,
    }


def build(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The tidy table of the given record files (sorted by their path fields)."""
    rows = [row(read(p), str(p)) for p in paths]
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.sort_values(["stage", "platform", "model", "backend", "technique", "batch_size", "gpus"],
                          ignore_index=True)


def write(df: pd.DataFrame, csv: Path | str, parquet: Path | str) -> None:
    """Write the tidy table as CSV and Parquet."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(csv, index=False)
    df.to_parquet(parquet, index=False)
