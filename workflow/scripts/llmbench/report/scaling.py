"""GPU scaling (paper Fig. 4): the same training cell on 1, 2, 4, 8 GPUs of a node, and on
more over several nodes (a block's ``nodes``; the Nodes column).

Scaling efficiency at n GPUs = tokens/s(n) / (n / n0 x tokens/s(n0)), n0 the smallest
count run: 1.0 is linear scaling (the paper's slope). Beside it, what compares across
hardware: tokens/s per GPU and MFU at each count. The paper prints only two efficiencies
(RTX4090 90.8%, RTX3090 85.9%, llama2-7b, Q, batch 2, 8 GPUs), no throughput of Fig. 4's
points; they stand beside ours.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import reference
from . import render
from .render import fmt

#: A series: one cell's fields but gpus (layout: a Megatron-LM cell's parallel layout, so
#: two layouts never form one series; empty for other backends).
KEY = ["stage", "platform", "model", "backend", "layout", "technique", "batch_size"]
COLUMNS = KEY + ["gpus", "nodes", "tokens_per_s", "ideal_tokens_per_s", "efficiency_pct", "tokens_per_s_per_gpu", "mfu",
                 "paper_efficiency_pct"]


def build(tidy: pd.DataFrame, root: Path | None = None) -> pd.DataFrame:
    """One row per GPU count of every training cell run on two or more counts."""
    ok = tidy[tidy["stage"].isin(["pretrain", "finetune"]) & (tidy["status"] == "ok")]
    # integers again: the tidy table's other stages (micro, serve) leave these columns NaN
    # nodes: 1 where the tidy table predates it
    ok = ok.assign(nodes=ok["nodes"].fillna(1) if "nodes" in ok else 1).astype({"batch_size": "int64", "gpus": "int64", "nodes": "int64"})
    out = []
    for key, grp in ok.groupby(KEY, sort=True, dropna=False):
        if len(grp[["gpus", "nodes"]].drop_duplicates()) < 2:
            continue
        grp = grp.sort_values(["gpus", "nodes"])
        n0, t0 = grp["gpus"].iloc[0], grp["tokens_per_s_mean"].iloc[0]
        for r in grp.itertuples():
            ideal = t0 * r.gpus / n0
            out.append({**dict(zip(KEY, key)), "gpus": r.gpus, "nodes": r.nodes, "tokens_per_s": r.tokens_per_s_mean,
                        "ideal_tokens_per_s": ideal, "efficiency_pct": 100 * r.tokens_per_s_mean / ideal,
                        "tokens_per_s_per_gpu": r.tokens_per_s_mean / r.gpus, "mfu": r.mfu})
    df = pd.DataFrame(out, columns=COLUMNS[:-1])
    paper = reference.load("fig4", **({"root": root} if root else {}))
    paper = paper.rename(columns={"efficiency_pct": "paper_efficiency_pct"})
    df = df.merge(paper[["model", "technique", "platform", "batch_size", "gpus", "paper_efficiency_pct"]],
                  on=["model", "technique", "platform", "batch_size", "gpus"], how="left")
    return df[COLUMNS]


def table(df: pd.DataFrame) -> render.Table:
    """Tokens/s, the linear ideal and the efficiency per GPU count; per GPU and MFU beside."""
    rows = [[r.platform, r.model, r.stage, r.technique, fmt(r.batch_size, ".0f"), fmt(r.gpus, ".0f"), fmt(r.nodes, ".0f"),
             fmt(r.tokens_per_s, ",.1f"), fmt(r.ideal_tokens_per_s, ",.1f"), fmt(r.efficiency_pct, ".1f"),
             fmt(r.tokens_per_s_per_gpu, ",.1f"), fmt(100 * r.mfu if r.mfu is not None else None, ".1f"),
             fmt(r.paper_efficiency_pct, ".1f")] for r in df.itertuples()]
    return render.simple(
        "scaling", df, ["Platform", "Model", "Stage", "Method", "BS", "GPUs", "Nodes", "tok/s", "linear tok/s", "efficiency %",
                        "tok/s/GPU", "MFU %", "paper efficiency %"], rows,
        "Efficiency = tokens/s at n GPUs / (n / n0 x tokens/s at n0), n0 the fewest GPUs run; batch size is per GPU; "
        "Nodes: the nodes the GPUs span. "
        "Compare across hardware: tok/s/GPU and MFU % (tokens/s x (6N + 12·L·h·s) / (GPUs x dense bf16 peak); none "
        "for 4-bit methods) and the efficiency itself. The paper prints only the efficiency of Fig. 4 at 8 GPUs "
        "(RTX4090 90.8%, RTX3090 85.9%; llama2-7b, Q, batch 2), no tokens/s, per GPU or MFU of its points, so "
        "those columns have no paper value. On a CPU platform the 'GPUs' are gloo processes sharing the host's "
        "cores.")
