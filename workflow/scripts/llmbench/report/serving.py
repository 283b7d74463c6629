"""The serving table (paper Figs. 6-10 as numbers): per engine, platform, model and load,
request and token throughput, TTFT/TPOT/ITL/end-to-end percentiles, failures, memory.

The paper prints figures only for serving (no numbers to transcribe), so there is no
published column here; the figures (llmbench.report.figures) show the same cells.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import render
from .render import fmt

KEY = ["platform", "model", "engine", "load", "gpus"]
COLUMNS = KEY + [
    "status", "mode", "num_requests", "input_len", "output_len", "completed", "failed",
    "output_shortfall_requests", "request_throughput_per_s", "output_tokens_per_s", "total_tokens_per_s",
    *[f"{s}_{m}" for m in ("ttft_s", "tpot_s", "itl_s", "e2e_latency_s") for s in ("p50", "p90", "p99")],
    "server_peak_gpu_mem_gib", "server_peak_rss_gib", "server_ready_s", "reason",
]
NOTES = (
    "TTFT: from the moment a request is sent to its first token, so in a burst it includes the "
    "time the request waits in the server's queue. TPOT: (end-to-end - TTFT) / (output tokens - 1) "
    "per request. ITL: gaps between streamed events that carry tokens (as `vllm bench serve`). "
    "Throughput: completed requests' tokens over the load's wall time (first send to last token). "
    "Memory: GPU memory in use on the engine's GPUs minus before start (nvidia-smi), or the "
    "engine's process-tree RSS on a CPU platform. Failed > 0 makes a cell status error; "
    "a load cut at the cell's timeout_s is status timeout, its failed requests those unfinished then, its "
    "numbers from the requests that completed before the cut."
)


def build(tidy: pd.DataFrame) -> pd.DataFrame:
    """The serving rows of the tidy table, in the serving table's columns and order."""
    df = tidy[tidy["stage"] == "serve"].copy()
    if df.empty:
        return pd.DataFrame(columns=COLUMNS)
    return df.reindex(columns=COLUMNS).sort_values(KEY, ignore_index=True)


def table(df: pd.DataFrame) -> render.Table:
    """One row per serving cell; latencies in seconds, throughput per second."""
    head = ["Platform", "Model", "Engine", "Load", "GPUs", "Status", "Requests (failed)", "req/s", "out tok/s",
            "TTFT p50/p90/p99 s", "TPOT p50/p90/p99 s", "ITL p50/p90/p99 s", "E2E p50/p90/p99 s",
            "server mem GiB"]
    rows = []
    for r in df.itertuples():
        def pct(m: str, spec: str = ".3f") -> str:
            vals = [getattr(r, f"{s}_{m}") for s in ("p50", "p90", "p99")]
            return "" if all(v is None or pd.isna(v) for v in vals) else " / ".join(fmt(v, spec) for v in vals)
        mem = r.server_peak_gpu_mem_gib if not pd.isna(r.server_peak_gpu_mem_gib) else r.server_peak_rss_gib
        status = r.status if r.status != "oom" else "- (oom)"
        rows.append([
            r.platform, r.model, r.engine, f"{r.load} ({r.mode}, {fmt(r.input_len, '.0f')} in / {fmt(r.output_len, '.0f')} out)",
            fmt(r.gpus, ".0f"), status, f"{fmt(r.num_requests, '.0f')} ({fmt(r.failed, '.0f')})",
            fmt(r.request_throughput_per_s, ".2f"), fmt(r.output_tokens_per_s, ".1f"),
            pct("ttft_s"), pct("tpot_s", ".4f"), pct("itl_s", ".4f"), pct("e2e_latency_s"), fmt(mem, ".2f"),
        ])
    return render.simple("serving", df, head, rows, NOTES)
