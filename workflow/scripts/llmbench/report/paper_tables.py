"""The paper's table layouts, ours beside the published values, as CSV (long) and Markdown.

Table III: every method at batch size 1. Table IV: every method at the batch size that
gave the highest throughput among the batch sizes run, over every run (one row per method;
Table IV's "maximised" batch; a method whose largest batch no max-batch search found says
"not maximised").
Both show, per (platform, model, method), the cells with the most GPUs run, as the paper's
tables are whole-node runs: a scaling axis's smaller runs (fewer GPUs, or fewer ranks on a
CPU) are Fig. 4's, and global tokens/s of different GPU counts do not compare.
Table IX: every fine-tuning method (LoRA, QLoRA, ...) at batch size 1.
Table II: Megatron-LM vs DeepSpeed (Naive) at batch size 1 and at the largest batch size run.

Comparisons across hardware. Beside tokens/s and memory, which compare only on the same
platform and GPU count (``ratio``), every row carries what compares across GPUs, ours and
the paper's: tokens/s per GPU, MFU (against each platform's dense bf16 peak) and the
method's throughput relative to a stated baseline method of the same platform, model and
GPU count (``BASELINE``). A baseline missing on a platform leaves the relative empty and the
table's note says where; it never switches to another method. Memory: the paper's "GB" sits
beside our peak *allocated* memory in GB (paper_frame.MEMORY_BASIS), reserved kept beside.
"-" is an out-of-memory cell (ours or the paper's); an empty cell was not run/printed. Where
several results folders feed the tables (the combined view), each row names its run, and a cell
several of them measured shows the one record the tidy table uses (llmbench.report.runs: the
stronger protocol, then the later run); the note names the runs it superseded.
"""

from __future__ import annotations


import pandas as pd

from .. import backends
from . import catalog, paper_frame, reference, render
from . import tidy as tidy_table
from .render import fmt

PAPER_PLATFORM_ORDER = ["a800", "rtx4090", "rtx3090", "rtx3090-nonvlink"]
#: paper table -> the stage of the cells it shows
STAGE = {"table3": "pretrain", "table4": "pretrain", "table9": "finetune"}
#: paper table -> the method every other method's throughput is relative to (same platform,
#: model and GPUs). Z3 runs on every paper platform for 7B (Tables III, IV); L is the method
#: Section V compares the others with ("than LoRA alone").
BASELINE = {"table3": "Z3", "table4": "Z3", "table9": "L"}
KEY = ["model", "technique", "platform"]
LONG_COLUMNS = [
    "model", "technique", "platform", "run", "gpus", "status", "batch_size", "searched_max_batch", "tokens_per_s",
    "tokens_per_s_std", "tokens_per_s_per_gpu", "mfu", "relative_tokens_per_s", "peak_mem_gib",
    "peak_mem_allocated_gib", "peak_mem_allocated_gb", "peak_mem_reserved_gib",
    "paper_status", "paper_batch_size", "paper_tokens_per_s", "paper_tokens_per_s_std",
    "paper_tokens_per_s_per_gpu", "paper_mfu", "paper_relative_tokens_per_s", "paper_mem_gb", "paper_flag",
    "ratio_tokens_per_s", "ratio_mem",
    "choice",  # where several runs measured the cell: the runs this record was chosen over, and why
]


def _cells(tidy: pd.DataFrame) -> pd.DataFrame:
    """Measured cells only (not max-batch probes), with the columns older tidy tables lack."""
    df = tidy.copy()
    for col, default in (("run", ""), ("kind", "cell"), ("searched_max_batch", None), ("choice", None)):
        if col not in df:
            df[col] = default
    df["run"] = df["run"].astype(object).where(df["run"].notna(), "")
    return tidy_table.per_gpu(df[df["kind"].fillna("cell") == "cell"].copy())


def _ours(tidy: pd.DataFrame, table: str) -> pd.DataFrame:
    pre = _cells(tidy)
    pre = pre[(pre["stage"] == STAGE[table]) & pre["backend"].isin(backends.method_backends())]
    if table in ("table3", "table9"):
        pre = pre[pre["batch_size"] == 1]
    most = pre.groupby(KEY)["gpus"].transform("max")
    pre = pre[pre["gpus"] == most]
    if table in ("table3", "table9"):
        # one record per (platform, model, technique, run) at batch 1, of the most GPUs run at batch 1
        return pre.groupby(KEY + ["run"]).tail(1)
    # table4: one row per method, the best ok cell of the most GPUs over every run (the batch
    # sizes of one method may come from several runs: a search's in one, batch 1 in another);
    # a method with no ok cell shows the status of its smallest batch
    ok = pre[pre["status"] == "ok"].sort_values("tokens_per_s_mean")
    best = ok.groupby(KEY).tail(1)
    rest = pre[~pre.set_index(KEY).index.isin(best.set_index(KEY).index)]
    rest = rest.sort_values("batch_size").groupby(KEY).head(1)
    return pd.concat([best, rest])


def _relative(df: pd.DataFrame, tps: str, base: str, keys: list[str]) -> pd.Series:
    """Each row's ``tps`` over the mean ``tps`` of the baseline method's rows of the same keys."""
    b = df[df["technique"] == base].groupby(keys, dropna=False)[tps].mean().rename("_base")
    return df.join(b, on=keys)[tps] / df.join(b, on=keys)["_base"]


def paper_rows(table: str, root=None) -> pd.DataFrame:
    """The paper's cells of one table (from paper_frame), with per-GPU throughput, MFU and
    relative to the table's baseline; flagged values (typos of the paper) are shown, not compared."""
    pf = paper_frame.frame(**({"root": root} if root else {}))
    p = pf[pf["table"] == table].copy()
    p["relative"] = _relative(p, "tokens_per_s_compared", BASELINE[table], ["platform", "model"])
    return p


def build(tidy: pd.DataFrame, table: str, root=None) -> pd.DataFrame:
    """Long form of Table III, IV or IX: one row per (model, technique, platform, run)."""
    ref = reference.load(table, **({"root": root} if root else {}))
    ours = _ours(tidy, table).rename(columns={"tokens_per_s_mean": "tokens_per_s"})
    ours["relative_tokens_per_s"] = _relative(ours, "tokens_per_s_per_gpu", BASELINE[table],
                                              ["platform", "model", "gpus"])
    ours = ours[["model", "technique", "platform", "run", "gpus", "status", "batch_size", "searched_max_batch",
                 "tokens_per_s", "tokens_per_s_std", "tokens_per_s_per_gpu", "mfu", "relative_tokens_per_s",
                 "peak_mem_gib", "peak_mem_allocated_gib", "peak_mem_allocated_gb", "peak_mem_reserved_gib",
                 "choice"]]
    p = paper_rows(table, root)
    paper = pd.DataFrame({
        "model": p["model"], "technique": p["technique"], "platform": p["platform"],
        "paper_status": p["status"], "paper_batch_size": p["batch_size"], "paper_tokens_per_s": p["tokens_per_s_mean"],
        "paper_tokens_per_s_std": p["tokens_per_s_std"], "paper_tokens_per_s_per_gpu": p["tokens_per_s_per_gpu"],
        "paper_mfu": p["mfu"], "paper_relative_tokens_per_s": p["relative"], "paper_mem_gb": p["peak_mem_gb_printed"],
        "paper_flag": p["flag"],
    })
    long = ours.merge(paper, on=KEY, how="outer")
    # ours over the paper's only for the same platform at the same GPU count (and batch, for memory)
    same = (long["gpus"] == paper_frame.PAPER_GPUS) & long["paper_flag"].isna()
    long["ratio_tokens_per_s"] = (long["tokens_per_s"] / long["paper_tokens_per_s"]).where(same)
    long["ratio_mem"] = (long["peak_mem_allocated_gb"] / long["paper_mem_gb"]).where(
        same & (long["batch_size"] == long["paper_batch_size"]))
    # paper order first (its row order), then ours
    order = {k: i for i, k in enumerate(dict.fromkeys(zip(ref["model"], ref["technique"])))}
    long["_row"] = [order.get((m, t), len(order)) for m, t in zip(long["model"], long["technique"])]
    plats = PAPER_PLATFORM_ORDER + sorted(set(long["platform"]) - set(PAPER_PLATFORM_ORDER))
    long["_col"] = [plats.index(p) for p in long["platform"]]
    long = long.sort_values(["_row", "model", "technique", "_col", "run"]).drop(columns=["_row", "_col"])
    return long[LONG_COLUMNS].reset_index(drop=True)


def _cell(status, value, spec: str) -> str:
    if isinstance(status, str) and status != "ok":
        return "-" if status == "oom" else status
    if value is None or pd.isna(value):
        return ""
    return format(value, spec)


def _pct(v) -> str:
    return "" if v is None or pd.isna(v) else f"{100 * v:.1f}"


def _baseline_gaps(long: pd.DataFrame, table: str) -> str:
    """Where the baseline method is missing (so relatives are empty), ours and the paper's."""
    base = BASELINE[table]
    gaps = []
    ours = long[long["status"].notna()]
    for (plat, model, gpus), _ in ours.groupby(["platform", "model", "gpus"]):
        b = ours[(ours["platform"] == plat) & (ours["model"] == model) & (ours["gpus"] == gpus)
                 & (ours["technique"] == base)]
        if b.empty or not (b["status"] == "ok").any():
            why = "not run" if b.empty else "out of memory" if (b["status"] == "oom").all() else "not ok"
            gaps.append(f"{plat} {model} {int(gpus)} GPU(s) ({why})")
    paper = long[long["paper_status"].notna()]
    for (plat, model), g in paper.groupby(["platform", "model"]):
        if not ((g["technique"] == base) & (g["paper_status"] == "ok")).any():
            gaps.append(f"paper {plat} {model}")
    return "; ".join(gaps)


def _shown(long: pd.DataFrame) -> pd.DataFrame:
    """The rows of the models we ran (all of the paper's if we ran none)."""
    ours_models = set(long.loc[long["status"].notna(), "model"])
    return long[long["model"].isin(ours_models)] if ours_models else long


def wide(long: pd.DataFrame, table: str) -> pd.DataFrame:
    """The paper's wide layout: a row per (model, method), per platform: ours (tok/s ± std,
    tok/s per GPU, MFU %, x baseline, memory allocated GB and reserved GiB, GPUs, run) and
    the paper's (tok/s, per GPU, MFU %, x baseline, GB), and ours / paper where both ran on
    the same platform and GPU count. The run column is shown where our rows come from
    several runs (results folders).

    Shows the models we ran (all of the paper's if we ran none) and the platforms that have
    a value, ours or the paper's, for those models."""
    with_bs = table == "table4"
    base = BASELINE[table]
    long = _shown(long)
    ours_plats = list(dict.fromkeys(long.loc[long["status"].notna(), "platform"]))
    paper_plats = list(dict.fromkeys(long.loc[long["paper_status"].notna(), "platform"]))
    plats = [p for p in dict.fromkeys(list(long["platform"])) if p in ours_plats or p in paper_plats]
    multi_run = long.loc[long["status"].notna(), "run"].nunique() > 1
    rows = []
    for (model, tech), grp in long.groupby(["model", "technique"], sort=False):
        by: dict[str, list] = {}
        for r in grp.itertuples():
            by.setdefault(r.platform, []).append(r)
        lines = max(len(v) for v in by.values())
        for i in range(lines):
            row = {"Model": model, "Method": tech}
            for p in plats:
                rs = by.get(p, [])
                r = rs[i] if i < len(rs) else None
                has_ours, has_paper = p in ours_plats, p in paper_plats
                if has_ours:
                    ok = r is not None and r.status == "ok"
                    tps = _cell(r.status, r.tokens_per_s, ".1f") if r is not None else ""
                    if ok and not pd.isna(r.tokens_per_s_std):
                        tps += f" ±{r.tokens_per_s_std:.1f}"
                    row[f"{p} tok/s"] = tps
                    row[f"{p} tok/s/GPU"] = _cell(r.status, r.tokens_per_s_per_gpu, ".1f") if r is not None else ""
                    row[f"{p} MFU %"] = _pct(r.mfu) if ok else ""
                    row[f"{p} x {base}"] = fmt(r.relative_tokens_per_s, ".2f") if ok else ""
                    row[f"{p} M GB"] = _cell(r.status, r.peak_mem_allocated_gb, ".1f") if r is not None else ""
                    row[f"{p} M GiB rsv"] = _cell(r.status, r.peak_mem_reserved_gib, ".1f") if r is not None else ""
                    if with_bs:
                        bs = _cell(r.status, r.batch_size, ".0f") if r is not None else ""
                        if bs and bs != "-" and pd.isna(r.searched_max_batch):
                            bs += " (not maximised)"
                        row[f"{p} BS"] = bs
                    row[f"{p} GPUs"] = fmt(r.gpus, ".0f") if r is not None else ""
                    if multi_run:
                        row[f"{p} run"] = r.run if r is not None else ""
                if has_paper:
                    pr = r if r is not None else (rs[0] if rs else None)
                    st = pr.paper_status if pr is not None else None
                    ptps = _cell(st, pr.paper_tokens_per_s, ".1f") if pr is not None else ""
                    if pr is not None and isinstance(pr.paper_flag, str):
                        ptps += f" ({pr.paper_flag}, not compared)"
                    lab = f"{p} paper" if has_ours else p + " (paper)"
                    row[f"{lab} tok/s"] = ptps
                    row[f"{lab} tok/s/GPU"] = _cell(st, pr.paper_tokens_per_s_per_gpu, ".1f") if pr is not None else ""
                    row[f"{lab} MFU %"] = _pct(pr.paper_mfu) if pr is not None and st == "ok" else ""
                    row[f"{lab} x {base}"] = fmt(pr.paper_relative_tokens_per_s, ".2f") if pr is not None and st == "ok" else ""
                    row[f"{lab} M GB"] = _cell(st, pr.paper_mem_gb, "g") if pr is not None else ""
                    if with_bs:
                        row[f"{lab} BS"] = _cell(st, pr.paper_batch_size, ".0f") if pr is not None else ""
                    if has_ours:
                        row[f"{p} ratio"] = fmt(r.ratio_tokens_per_s, ".2f") if r is not None else ""
            rows.append(row)
    return pd.DataFrame(rows).fillna("")


def _superseded_note(long: pd.DataFrame, key: list[str]) -> str:
    """The cells several runs measured: which run's record the row shows, and over which."""
    chosen = long[long["choice"].notna() & (long["choice"].astype(str) != "")] if "choice" in long else long.iloc[0:0]
    if chosen.empty:
        return ""
    cells = "; ".join(f"{' '.join(str(r[k]) for k in key if pd.notna(r[k]) and str(r[k]))}: {r['run']} {r['choice']}"
                      for _, r in chosen.drop_duplicates(key + ["run"]).iterrows())
    return ("Cells several runs measured show one record: a result before none, then the stronger protocol "
            "(measured steps x repeats), then the later run (llmbench.report.runs; the others are in "
            f"tables/records-superseded.csv). {cells}.")


def note(long: pd.DataFrame, table: str) -> str:
    """What the columns mean, which compare across hardware, and where the baseline is missing."""
    base = BASELINE[table]
    gaps = _baseline_gaps(_shown(long), table)
    parts = [
        "Compare across hardware: tok/s/GPU, MFU % and x " + base + " (each method's tokens/s per GPU "
        f"over {base}'s on the same platform, model and GPU count), ours beside the paper's on every paper "
        "platform. tok/s and M compare only on one platform at one GPU count: ratio = ours / paper tokens/s "
        f"there. The paper's cells ran on the whole 8-GPU node (Table I); ours per method are the cells with "
        "the most GPUs run (GPUs column), so an H100 or H200 row meets the A800 column through per-GPU "
        "throughput, MFU and the relatives, assuming a method's cost relative to another carries across GPUs "
        "(ZeRO sharding does not: it depends on the GPU count).",
        f"Baseline {base} missing (its relatives empty, no other method substituted): {gaps}." if gaps else "",
        "ours: mean ± sample std over repeats; '-' out of memory; empty: not run (ours) or not printed "
        "(paper). MFU = tokens/s x (6N + 12·L·h·s) / (GPUs x dense bf16 peak) (4N with a frozen base), "
        "none for 4-bit methods; the paper's from its printed tokens/s and config/platforms' peaks.",
        "M: " + paper_frame.MEMORY_BASIS + " M GB is ours allocated; M GiB rsv ours reserved (host RSS on a "
        "CPU platform).",
        _superseded_note(long, ["platform", "model", "technique"]),
    ]
    if table == "table4":
        parts.append("BS: the best batch run; '(not maximised)': no max-batch search of that method ran, so "
                     "its batch is only the largest run, not the largest that fits.")
    if long["paper_flag"].notna().any():
        parts.append("A paper value marked as a typo (config/reference's flag) is printed as the paper has it "
                     "and kept out of every ratio, relative and finding.")
    return "\n\n".join(p for p in parts if p)


def table(long: pd.DataFrame, name: str) -> render.Table:
    """Table III, IV or IX for the report: the long form (CSV), the wide layout and its note."""
    return render.Table(title=catalog.get("table", name).title, long=long,
                        parts=(render.Part(frame=wide(long, name), note=note(long, name)),))


# Table II: Megatron-LM vs DeepSpeed, no other technique (Naive), at batch size 1 and at
# the largest batch size that ran ("max"; the paper's maximum batch size per framework).
TABLE2_FRAMEWORKS = ("megatron", "deepspeed")
TABLE2_KEY = ["framework", "platform", "model", "batch"]
TABLE2_COLUMNS = [
    "framework", "layout", "platform", "model", "run", "gpus", "batch", "status", "batch_size", "searched_max_batch",
    "tokens_per_s", "tokens_per_s_std", "tokens_per_s_per_gpu", "mfu", "relative_tokens_per_s", "peak_mem_gib",
    "peak_mem_allocated_gb", "peak_mem_reserved_gib", "paper_status", "paper_batch_size", "paper_tokens_per_s",
    "paper_tokens_per_s_per_gpu", "paper_mfu", "paper_relative_tokens_per_s", "paper_mem_gb", "ratio_tokens_per_s",
    "choice",  # as in LONG_COLUMNS
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


def _relative_to_deepspeed(df: pd.DataFrame, tps: str, keys: list[str]) -> pd.Series:
    ds = df[df["framework"] == "deepspeed"].groupby(keys, dropna=False)[tps].mean().rename("_base")
    return df.join(ds, on=keys)[tps] / df.join(ds, on=keys)["_base"]


def build_table2(tidy: pd.DataFrame, root=None) -> pd.DataFrame:
    """Long form of Table II: one row per (framework, layout, platform, model, batch, run),
    ours beside the paper's where the platform is the same (the paper ran an 8 x A800 node);
    relative: tokens/s per GPU over DeepSpeed's at the same batch ('1' or 'max')."""
    pre = _cells(tidy)
    pre = pre[(pre["stage"] == "pretrain") & (pre["technique"] == "Naive") & pre["backend"].isin(TABLE2_FRAMEWORKS)]
    pre["layout"] = pre["layout"].astype(object).where(pre["layout"].notna(), "")
    # one record per (framework, layout, platform, model, batch size, run): the one with most GPUs
    cell = ["backend", "layout", "platform", "model", "run"]
    pre = pre.sort_values("gpus").groupby(cell + ["batch_size"]).tail(1)
    parts = [_pick_batches(g) for _, g in pre.groupby(cell, sort=True)]
    ours = pd.concat(parts) if parts else pre.assign(batch=pd.Series(dtype=str))
    ours = ours.rename(columns={"backend": "framework", "tokens_per_s_mean": "tokens_per_s"})
    ours["relative_tokens_per_s"] = _relative_to_deepspeed(ours, "tokens_per_s_per_gpu", ["platform", "model", "batch"])
    ours = ours[["framework", "layout", "platform", "model", "run", "gpus", "batch", "status", "batch_size",
                 "searched_max_batch", "tokens_per_s", "tokens_per_s_std", "tokens_per_s_per_gpu", "mfu",
                 "relative_tokens_per_s", "peak_mem_gib", "peak_mem_allocated_gb", "peak_mem_reserved_gib", "choice"]]
    p = paper_frame.frame(**({"root": root} if root else {}))
    p = p[p["table"] == "table2"].rename(columns={"backend": "framework"})
    p = p.assign(batch=["1" if b == 1 else "max" for b in p["batch_size"]])
    p["paper_relative_tokens_per_s"] = _relative_to_deepspeed(p, "tokens_per_s_per_gpu", ["platform", "model", "batch"])
    paper = p.rename(columns={"status": "paper_status", "batch_size": "paper_batch_size",
                              "tokens_per_s_mean": "paper_tokens_per_s", "tokens_per_s_per_gpu": "paper_tokens_per_s_per_gpu",
                              "mfu": "paper_mfu", "peak_mem_gb": "paper_mem_gb"})
    paper = paper[TABLE2_KEY + ["paper_status", "paper_batch_size", "paper_tokens_per_s", "paper_tokens_per_s_per_gpu",
                                "paper_mfu", "paper_relative_tokens_per_s", "paper_mem_gb"]]
    long = ours.merge(paper, on=TABLE2_KEY, how="outer")
    same = long["gpus"] == paper_frame.PAPER_GPUS
    long["ratio_tokens_per_s"] = (long["tokens_per_s"] / long["paper_tokens_per_s"]).where(same)
    long["_fw"] = [TABLE2_FRAMEWORKS.index(f) for f in long["framework"]]
    long = long.sort_values(["_fw", "platform", "model", "layout", "batch", "run"], na_position="first")
    return long[TABLE2_COLUMNS].reset_index(drop=True)


def wide_table2(long: pd.DataFrame) -> pd.DataFrame:
    """Table II's layout: a row per framework (and Megatron layout), batch and run, ours | paper | ratio."""
    rows = []
    for r in long.itertuples():
        tps = _cell(r.status, r.tokens_per_s, ".1f")
        if tps and r.status == "ok" and not pd.isna(r.tokens_per_s_std):
            tps += f" ±{r.tokens_per_s_std:.1f}"
        ok, pok = r.status == "ok", r.paper_status == "ok"
        bs = _cell(r.status, r.batch_size, ".0f")
        if r.batch == "max" and bs and bs != "-" and pd.isna(r.searched_max_batch):
            bs += " (not maximised)"
        rows.append({
            "Framework": {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}[r.framework],
            "Layout": "" if pd.isna(r.layout) else str(r.layout), "Platform": r.platform, "Model": r.model,
            "GPUs": fmt(r.gpus, ".0f"), "Batch": r.batch, "BS": bs, "tok/s": tps,
            "tok/s/GPU": _cell(r.status, r.tokens_per_s_per_gpu, ".1f"), "MFU %": _pct(r.mfu) if ok else "",
            "x DeepSpeed": fmt(r.relative_tokens_per_s, ".2f") if ok else "",
            "M GB": _cell(r.status, r.peak_mem_allocated_gb, ".1f"),
            "M GiB rsv": _cell(r.status, r.peak_mem_reserved_gib, ".1f"),
            "paper BS": _cell(r.paper_status, r.paper_batch_size, ".0f"),
            "paper tok/s": _cell(r.paper_status, r.paper_tokens_per_s, ".1f"),
            "paper tok/s/GPU": _cell(r.paper_status, r.paper_tokens_per_s_per_gpu, ".1f"),
            "paper MFU %": _pct(r.paper_mfu) if pok else "",
            "paper x DeepSpeed": fmt(r.paper_relative_tokens_per_s, ".2f") if pok else "",
            "paper M GB": _cell(r.paper_status, r.paper_mem_gb, "g"),
            "ratio": fmt(r.ratio_tokens_per_s, ".2f"), "Run": "" if pd.isna(r.run) else r.run,
        })
    w = pd.DataFrame(rows)
    if len(w) and (w["Run"] == "").all():
        w = w.drop(columns="Run")
    return w


NOTE_TABLE2 = ("Pre-training without any other technique (Naive). Batch '1' and 'max': the largest batch size that "
               "ran ok (the paper's maximum); '(not maximised)': no max-batch search of it ran. Layout: Megatron's "
               "tp{T}pp{P}[-distopt], data parallel = GPUs / (T*P); the paper's is tensor parallel 1 on 8 GPUs. "
               "Compare across hardware: tok/s/GPU, MFU % and x DeepSpeed (tokens/s per GPU over DeepSpeed's at the "
               "same platform, model and batch; empty where DeepSpeed did not run ok), ours beside the paper's. ours: "
               "mean ± sample std over repeats; '-' out of memory; ratio = ours / paper tokens/s, only on the "
               "paper's platform at its GPU count.\n\nM: " + paper_frame.MEMORY_BASIS)


def table2(long: pd.DataFrame) -> render.Table:
    """Table II for the report: the long form (CSV), its layout and note."""
    extra = _superseded_note(long, ["framework", "layout", "platform", "model", "batch"])
    return render.Table(title=catalog.get("table", "table2").title, long=long,
                        parts=(render.Part(frame=wide_table2(long), note=NOTE_TABLE2 + ("\n\n" + extra if extra else "")),))
