"""The paper's table layouts, ours beside the published values, as CSV (long) and Markdown.

Table III: every method at batch size 1. Table IV: every method at the batch size that
gave the highest throughput among the batch sizes run (Table IV's "maximised" batch).
Both show, per (platform, model, method), the cells with the most GPUs run, as the paper's
tables are whole-node runs: a scaling axis's smaller runs (fewer GPUs, or fewer ranks on a
CPU) are Fig. 4's, and global tokens/s of different GPU counts do not compare.
Table IX: every fine-tuning method (LoRA, QLoRA, ...) at batch size 1.
Table II: Megatron-LM vs DeepSpeed (Naive) at batch size 1 and at the largest batch size run.
"-" is an out-of-memory cell (ours or the paper's); an empty cell was not run/printed.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import reference
from .markdown import fmt, table

PAPER_PLATFORM_ORDER = ["a800", "rtx4090", "rtx3090", "rtx3090-nonvlink"]
LONG_COLUMNS = [
    "model", "technique", "platform", "status", "batch_size", "tokens_per_s", "tokens_per_s_std",
    "peak_mem_gib", "paper_status", "paper_batch_size", "paper_tokens_per_s",
    "paper_tokens_per_s_std", "paper_mem_gb", "ratio_tokens_per_s",
]


#: paper table -> the stage of the cells it shows
STAGE = {"table3": "pretrain", "table4": "pretrain", "table9": "finetune"}


def _ours(tidy: pd.DataFrame, table: str) -> pd.DataFrame:
    pre = tidy[(tidy["stage"] == STAGE[table]) & (tidy["backend"] == "deepspeed")]
    if table in ("table3", "table9"):
        pre = pre[pre["batch_size"] == 1]
        # one record per (platform, model, technique): the one with most GPUs
        pre = pre.sort_values("gpus").groupby(["platform", "model", "technique"]).tail(1)
        return pre
    # table4: of the cells with the most GPUs of each method, the best ok one; a method with
    # no ok cell shows its worst status
    most = pre.groupby(["platform", "model", "technique"])["gpus"].transform("max")
    pre = pre[pre["gpus"] == most]
    ok = pre[pre["status"] == "ok"].sort_values("tokens_per_s_mean")
    best = ok.groupby(["platform", "model", "technique"]).tail(1)
    rest = pre[~pre.set_index(["platform", "model", "technique"]).index.isin(
        best.set_index(["platform", "model", "technique"]).index)]
    rest = rest.sort_values("batch_size").groupby(["platform", "model", "technique"]).head(1)
    return pd.concat([best, rest])


def build(tidy: pd.DataFrame, table: str, root=None) -> pd.DataFrame:
    """Long form of Table III or IV: one row per (model, technique, platform)."""
    ref = reference.load(table, **({"root": root} if root else {}))
    ours = _ours(tidy, table).rename(columns={"tokens_per_s_mean": "tokens_per_s"})
    ours = ours[["model", "technique", "platform", "status", "batch_size", "tokens_per_s",
                 "tokens_per_s_std", "peak_mem_gib"]]
    paper = ref.rename(columns={"status": "paper_status", "batch_size": "paper_batch_size",
                                "tokens_per_s": "paper_tokens_per_s",
                                "tokens_per_s_std": "paper_tokens_per_s_std", "mem_gb": "paper_mem_gb"})
    paper = paper[["model", "technique", "platform", "paper_status", "paper_batch_size",
                   "paper_tokens_per_s", "paper_tokens_per_s_std", "paper_mem_gb"]]
    long = ours.merge(paper, on=["model", "technique", "platform"], how="outer")
    long["ratio_tokens_per_s"] = long["tokens_per_s"] / long["paper_tokens_per_s"]
    # paper order first (its row order), then ours
    order = {k: i for i, k in enumerate(dict.fromkeys(zip(ref["model"], ref["technique"])))}
    long["_row"] = [order.get((m, t), len(order)) for m, t in zip(long["model"], long["technique"])]
    plats = PAPER_PLATFORM_ORDER + sorted(set(long["platform"]) - set(PAPER_PLATFORM_ORDER))
    long["_col"] = [plats.index(p) for p in long["platform"]]
    long = long.sort_values(["_row", "model", "technique", "_col"]).drop(columns=["_row", "_col"])
    return long[LONG_COLUMNS].reset_index(drop=True)


def _cell(status, value, fmt: str) -> str:
    if isinstance(status, str) and status != "ok":
        return "-" if status == "oom" else status
    if value is None or pd.isna(value):
        return ""
    return format(value, fmt)


def markdown(long: pd.DataFrame, title: str, with_bs: bool) -> str:
    """The paper's wide layout: a row per (model, method), per platform ours | paper | ratio.

    Shows the models we ran (all of the paper's if we ran none) and the platforms that have
    a value, ours or the paper's, for those models.
    """
    ours_models = set(long.loc[long["status"].notna(), "model"])
    if ours_models:
        long = long[long["model"].isin(ours_models)]
    has_value = long["status"].notna() | long["paper_status"].notna()
    plats = list(dict.fromkeys(long.loc[has_value, "platform"]))
    head = ["Model", "Method"]
    for p in plats:
        head += [f"{p} tok/s", f"{p} paper", f"{p} ratio", f"{p} M GiB", f"{p} paper M GB"]
        if with_bs:
            head += [f"{p} BS", f"{p} paper BS"]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, tech), grp in long.groupby(["model", "technique"], sort=False):
        cells = [model, tech]
        by = {r.platform: r for r in grp.itertuples()}
        for p in plats:
            r = by.get(p)
            if r is None:
                cells += [""] * (7 if with_bs else 5)
                continue
            ours_tps = _cell(r.status, r.tokens_per_s, ".1f")
            if ours_tps and r.status == "ok" and not pd.isna(r.tokens_per_s_std):
                ours_tps += f" ±{r.tokens_per_s_std:.1f}"
            ratio = "" if pd.isna(r.ratio_tokens_per_s) else f"{r.ratio_tokens_per_s:.2f}"
            cells += [ours_tps, _cell(r.paper_status, r.paper_tokens_per_s, ".1f"), ratio,
                      _cell(r.status, r.peak_mem_gib, ".2f"), _cell(r.paper_status, r.paper_mem_gb, "g")]
            if with_bs:
                cells += [_cell(r.status, r.batch_size, ".0f"), _cell(r.paper_status, r.paper_batch_size, ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "ours: mean ± sample std over repeats; '-' out of memory; empty: not run (ours) or "
              "not printed (paper); ratio = ours / paper tokens/s. M: ours is peak reserved GPU "
              "memory in GiB (host RSS on CPU platforms), the paper's is 'GB' as printed. Ours per "
              "method: the cells with the most GPUs run (whole-node runs, as the paper's; a scaling "
              "axis's smaller runs are Fig. 4's).", ""]
    return "\n".join(lines)


def write(long: pd.DataFrame, csv: Path | str, md: Path | str, title: str, with_bs: bool) -> None:
    """Write one paper table as CSV (long form) and Markdown (wide form)."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    long.to_csv(csv, index=False)
    Path(md).write_text(markdown(long, title, with_bs))


# Table II: Megatron-LM vs DeepSpeed, no other technique (Naive), at batch size 1 and at
# the largest batch size that ran ("max"; the paper's maximum batch size per framework).
TABLE2_FRAMEWORKS = ("megatron", "deepspeed")
TABLE2_KEY = ["framework", "platform", "model", "batch"]
TABLE2_COLUMNS = [
    "framework", "layout", "platform", "model", "gpus", "batch", "status", "batch_size", "tokens_per_s",
    "tokens_per_s_std", "peak_mem_gib", "paper_status", "paper_batch_size", "paper_tokens_per_s",
    "paper_mem_gb", "ratio_tokens_per_s",
]


def _pick_batches(group: pd.DataFrame) -> pd.DataFrame:
    """Batch size 1, and the largest batch size above 1 that ran ok (if none did, the
    smallest one that did not, to show its status)."""
    picked = []
    one = group[group["batch_size"] == 1]
    if not one.empty:
        picked.append(one.iloc[[0]].assign(batch="1"))
    more = group[group["batch_size"] > 1]
    ok = more[more["status"] == "ok"]
    if not ok.empty:
        picked.append(ok.sort_values("batch_size").iloc[[-1]].assign(batch="max"))
    elif not more.empty:
        picked.append(more.sort_values("batch_size").iloc[[0]].assign(batch="max"))
    return pd.concat(picked) if picked else group.iloc[0:0].assign(batch=pd.Series(dtype=str))


def build_table2(tidy: pd.DataFrame, root=None) -> pd.DataFrame:
    """Long form of Table II: one row per (framework, layout, platform, model, batch), ours
    beside the paper's where the platform is the same (the paper ran an 8 x A800 node)."""
    ref = reference.load("table2", **({"root": root} if root else {}))
    pre = tidy[(tidy["stage"] == "pretrain") & (tidy["technique"] == "Naive")
               & tidy["backend"].isin(TABLE2_FRAMEWORKS)].copy()
    pre["layout"] = pre["layout"].astype(object).where(pre["layout"].notna(), "")
    # one record per (framework, layout, platform, model, batch size): the one with most GPUs
    pre = pre.sort_values("gpus").groupby(["backend", "layout", "platform", "model", "batch_size"]).tail(1)
    parts = [_pick_batches(g) for _, g in pre.groupby(["backend", "layout", "platform", "model"], sort=True)]
    ours = pd.concat(parts) if parts else pre.assign(batch=pd.Series(dtype=str))
    ours = ours.rename(columns={"backend": "framework", "tokens_per_s_mean": "tokens_per_s"})
    ours = ours[["framework", "layout", "platform", "model", "gpus", "batch", "status", "batch_size",
                 "tokens_per_s", "tokens_per_s_std", "peak_mem_gib"]]
    paper = ref.assign(batch=["1" if b == 1 else "max" for b in ref["batch_size"]])
    paper = paper.rename(columns={"status": "paper_status", "batch_size": "paper_batch_size",
                                  "tokens_per_s": "paper_tokens_per_s", "mem_gb": "paper_mem_gb"})
    paper = paper[TABLE2_KEY + ["paper_status", "paper_batch_size", "paper_tokens_per_s", "paper_mem_gb"]]
    long = ours.merge(paper, on=TABLE2_KEY, how="outer")
    long["ratio_tokens_per_s"] = long["tokens_per_s"] / long["paper_tokens_per_s"]
    long["_fw"] = [TABLE2_FRAMEWORKS.index(f) for f in long["framework"]]
    long = long.sort_values(["_fw", "platform", "model", "layout", "batch"], na_position="first")
    return long[TABLE2_COLUMNS].reset_index(drop=True)


def markdown_table2(long: pd.DataFrame, title: str) -> str:
    """Table II's layout: a row per framework (and Megatron layout) and batch, ours | paper | ratio."""
    head = ["Framework", "Layout", "Platform", "Model", "GPUs", "Batch", "BS", "tok/s", "paper BS",
            "paper tok/s", "ratio", "M GiB", "paper M GB"]
    rows = []
    for r in long.itertuples():
        tps = _cell(r.status, r.tokens_per_s, ".1f")
        if tps and r.status == "ok" and not pd.isna(r.tokens_per_s_std):
            tps += f" ±{r.tokens_per_s_std:.1f}"
        rows.append([
            {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}[r.framework],
            "" if pd.isna(r.layout) else str(r.layout), r.platform, r.model, fmt(r.gpus, ".0f"), r.batch,
            _cell(r.status, r.batch_size, ".0f"), tps, _cell(r.paper_status, r.paper_batch_size, ".0f"),
            _cell(r.paper_status, r.paper_tokens_per_s, ".1f"), fmt(r.ratio_tokens_per_s, ".2f"),
            _cell(r.status, r.peak_mem_gib, ".2f"), _cell(r.paper_status, r.paper_mem_gb, "g"),
        ])
    note = ("Pre-training without any other technique (Naive). Batch '1' and 'max': the largest "
            "batch size that ran ok (the paper's maximum). Layout: Megatron's tp{T}pp{P}[-distopt], "
            "data parallel = GPUs / (T*P); the paper's is tensor parallel 1 on 8 GPUs. ours: mean ± "
            "sample std over repeats; '-' out of memory; ratio = ours / paper tokens/s, only on the "
            "paper's platform. M: ours is peak reserved GPU memory in GiB (host RSS on CPU "
            "platforms), the paper's is 'GB' as printed.")
    return table(title, head, rows, note)


def write_table2(long: pd.DataFrame, csv: Path | str, md: Path | str, title: str) -> None:
    """Write Table II as CSV (long form) and Markdown."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    long.to_csv(csv, index=False)
    Path(md).write_text(markdown_table2(long, title))
