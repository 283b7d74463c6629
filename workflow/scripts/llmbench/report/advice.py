"""The advisor (tables/advice.{csv,md,html}, ``snakemake advice``): for a platform, a model,
a stage and a number of GPUs, the paper's methods ranked for a goal, each row labelled by
where its numbers come from:

  measured   an ok record of that cell here (same platform and GPU count): its tokens/s at the
             best batch measured; or its batch-1 record ran out of memory: it does not fit
  paper      the paper's own measurement (config/reference, Tables II, III, IV, IX: 8 GPUs of
             a800, rtx4090, rtx3090, rtx3090-nonvlink): its best tokens/s over the batches it
             printed; a "-" at batch 1 there: it does not fit
  predicted  the memory model (fits, largest batch, memory at batch 1; offload held to the
             platform file's host memory, or to the smallest machine the platform's records at
             that GPU count ran on) and the throughput model (tokens/s at the predicted largest
             batch, with its interval and a note where the cell lies outside what the
             calibration records cover: llmbench.throughput.predict)

A measurement answers for its method wherever it exists (ours first, then the paper's);
the models answer only for methods nobody measured there.

What is asked (config key ``advice``, or on the command line)::

    snakemake advice --config advice='{platforms: [a800], models: [llama2-70b], stage: finetune, goal: throughput, gpus: 8}'

Every key is optional: platforms and models default to those of the config's training cells
and of the records (the tidy table); stage to both pretrain and finetune; goal to
throughput; gpus (a number, a list, or per platform: ``{a800: 8, h100: [1, 2]}``) to 1 and
the platform's gpus_per_node. Methods: the paper's (those of
config/paper.yaml for the stage), or ``methods: [...]``. A platform file nobody ran on
is advised from the paper's tables where they have it, else from the models alone.

Goals:
  throughput  by tokens/s, fastest first. A measured or paper row ranks by its tokens/s, a
              predicted row by the low end of its interval: a prediction outranks a
              measurement only where even its slow end is faster. Rows with no tokens/s
              (no throughput model for the platform) come last among those that fit;
  memory      by memory at batch 1 (measured peak where measured, else the paper's, else
              predicted), least first;
  fits        every method that fits, by the predicted largest batch, largest first.
Methods that do not fit (measured, or predicted) are listed last, unranked, with why.

Serving (stage ``serve``, goal throughput only): the engines measured on a platform, model
and GPU count, per workload (input and output lengths, latency targets), ranked by the most
output tokens/s they served with at least 99 % of requests within the TTFT and TPOT targets,
then by the most they served at all (llmbench.report.serving.engine_choice), each with the KV
cache its records report. Where vLLM or SGLang was not measured, its KV cache is predicted
(llmbench.serve.capacity: whether the model fits, how many requests of the paper's burst stay
resident), unranked: no model predicts serving throughput.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from .. import backends, techniques
from ..config import REPO_ROOT, ConfigError
from ..memory import Workload, fits, host_memory_gib, machine_host_gib, predict, predicted_max_batch
from ..models import ModelSpec
from ..platforms import Platform
from ..serve import capacity, metrics, runs
from . import catalog, render, serving
from .render import fmt

GOALS = ("throughput", "memory", "fits")
STAGES = ("pretrain", "finetune")
#: The serving stage: engines, not methods, ranked for throughput (module docstring)
SERVE = "serve"
#: The paper's burst request (input, output tokens): the workload a predicted serving row holds
BURST_TOKENS = (512, 128)
#: Where a row's numbers come from (module docstring), strongest first.
SOURCES = ("measured", "paper", "predicted")
#: Sequence length of every advised cell (the paper's, Section III).
SEQ_LEN = 350
#: LoRA settings of the paper's Table IX (rank 64 on every decoder linear), for predicted rows
PAPER_LORA = {"kind": "lora", "rank": 64, "alpha": 16, "dropout": 0.05,
              "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
COLUMNS = ["platform", "model", "stage", "gpus", "goal", "rank", "technique", "basis", "fits", "tokens_per_s",
           "tokens_per_s_low", "tokens_per_s_high", "tokens_per_s_per_gpu", "batch_size", "measured_tokens_per_s",
           "measured_batch_size", "predicted_max_batch",
           "memory_gib", "predicted_gib_bs1", "capacity_gib", "evidence", "why_not",
           # a serving row's (llmbench.report.serving.CHOICE; its output tokens/s within the targets in tokens_per_s)
           "engine", "engine_version", "input_len", "output_len", "ttft_target_s", "tpot_target_s", "within_point",
           "within_p99_ttft_s", "within_p99_tpot_s", "most_output_tokens_per_s", "most_point", "most_goodput_share",
           "points", "runs", "kv_cache_tokens", "resident_requests"]


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def request(advice: dict[str, Any] | None, config_cells: list[tuple[str, str]], tidy: pd.DataFrame,
            platforms: dict[str, Platform]) -> list[dict[str, Any]]:
    """The (platform, model, stage, gpus, goal, methods) to advise on: the ``advice`` key's,
    with the defaults of the module docstring (values may come as strings from --config)."""
    advice = dict(advice or {})
    rows = tidy[tidy["stage"].isin((*STAGES, SERVE))] if "stage" in tidy else tidy
    known = sorted(set(config_cells) | set(zip(rows.get("platform", []), rows.get("model", []))))
    plats = _as_list(advice.get("platforms") or advice.get("platform")) or sorted({p for p, _ in known})
    models = _as_list(advice.get("models") or advice.get("model")) or sorted({m for _, m in known})
    goal = str(advice.get("goal") or "throughput")
    if goal not in GOALS:
        raise ConfigError(f"advice.goal must be one of {GOALS}, got {goal!r}")
    stages = _as_list(advice.get("stages") or advice.get("stage")) or [*STAGES, *([SERVE] if goal == "throughput"
                                                                                   else [])]
    for s in stages:
        if s not in (*STAGES, SERVE):
            raise ConfigError(f"advice.stage must be one of {(*STAGES, SERVE)}, got {s!r}")
        if s == SERVE and goal != "throughput":
            raise ConfigError(f"advice.goal {goal!r} with stage {SERVE!r}: serving engines rank by throughput only")
    by_platform = advice.get("gpus") if isinstance(advice.get("gpus"), dict) else None
    gpus = [] if by_platform else [int(g) for g in _as_list(advice.get("gpus"))]
    methods = [techniques.canonical(str(m)) for m in _as_list(advice.get("methods"))]
    out = []
    for p in plats:
        plat = platforms[p]
        mine = [int(g) for g in _as_list((by_platform or {}).get(p))] or gpus
        for g in mine or sorted({1, plat.gpus_per_node}):
            for m in models:
                for s in stages:
                    out.append({"platform": p, "model": m, "stage": s, "gpus": g, "goal": goal,
                                "methods": [] if s == SERVE else methods or paper_methods(s)})
    return out


@cache
def _paper_methods(root: str) -> dict[str, tuple[str, ...]]:
    from ..cells import Cell
    from ..grid import load

    grid = load(Path(root) / "config" / "paper.yaml", Path(root))
    out: dict[str, list[str]] = {s: [] for s in STAGES}
    for c in grid.cells:
        if isinstance(c, Cell) and c.stage in out and backends.get(c.backend).paper_methods \
                and c.technique not in out[c.stage]:
            out[c.stage].append(c.technique)
    return {s: tuple(v) for s, v in out.items()}


def paper_methods(stage: str, root: Path = REPO_ROOT) -> list[str]:
    """The methods of config/paper.yaml for a stage (its Tables III, IV and IX: the cells of
    the backends that run the paper's methods, llmbench.backends.method_backends)."""
    return list(_paper_methods(str(root))[stage])


def _cells(tidy: pd.DataFrame, platform: str, model: str, stage: str, gpus: int, technique: str) -> pd.DataFrame:
    """The records of a method's cell (its backends: llmbench.backends.method_backends; every
    batch, search probes left out)."""
    if tidy.empty or "technique" not in tidy:
        return tidy.iloc[0:0]
    rows = tidy[(tidy["platform"] == platform) & (tidy["model"] == model) & (tidy["stage"] == stage)
                & (tidy["gpus"] == gpus) & (tidy["technique"] == technique)
                & tidy["backend"].isin(backends.method_backends())]
    return rows[rows["kind"] != "probe"] if "kind" in rows else rows


def _out_of_memory(tidy: pd.DataFrame, platform: str, model: str, stage: str, gpus: int, technique: str) -> str | None:
    """Why a cell does not fit where its batch-1 record ran out of memory (its reason), else None."""
    rows = _cells(tidy, platform, model, stage, gpus, technique)
    if rows.empty or not {"status", "batch_size"} <= set(rows.columns):
        return None
    oom = rows[(rows["status"] == "oom") & (rows["batch_size"] == 1)]
    if oom.empty:
        return None
    reason = render.brief(oom["reason"].iloc[0] if "reason" in oom else None, 120)
    return "out of memory at batch 1 (measured)" + (f": {reason}" if reason else "")


def offload_host_gib(tidy: pd.DataFrame, platform: dict[str, Any], gpus: int) -> float | None:
    """The host memory offload is held to on a platform at a GPU count: its file's, or that of
    the smallest machine its training records there ran on (llmbench.memory.machine_host_gib)."""
    seen = None
    if not tidy.empty and "host_mem_gib" in tidy:
        mine = tidy[(tidy["platform"] == platform["name"]) & (tidy["gpus"] == gpus) & tidy["stage"].isin(STAGES)]
        seen = mine["host_mem_gib"].min()
    return machine_host_gib(platform, seen)


def _measured(tidy: pd.DataFrame, platform: str, model: str, stage: str, gpus: int, technique: str) -> dict | None:
    """The best ok record of a cell (highest tokens/s over the batches measured), or None."""
    if "tokens_per_s_mean" not in tidy:
        return None
    rows = _cells(tidy, platform, model, stage, gpus, technique)
    rows = rows[(rows["status"] == "ok") & rows["tokens_per_s_mean"].notna()]
    if rows.empty:
        return None
    best = rows.sort_values("tokens_per_s_mean", ascending=False).iloc[0]
    bs1 = rows[rows["batch_size"] == 1]
    return {"tokens_per_s": float(best["tokens_per_s_mean"]), "batch_size": int(best["batch_size"]),
            "memory_gib": float(bs1["peak_mem_allocated_gib"].iloc[0]) if len(bs1) and pd.notna(
                bs1["peak_mem_allocated_gib"].iloc[0]) else None}


def predicted(plat: dict[str, Any], model: ModelSpec, technique: str, gpus: int,
              margin: float | None = None, host_gib: float | None = None,
              backend: str = "deepspeed") -> dict[str, Any] | None:
    """The memory model's answer for one of the paper's methods at batch 1 (sequence 350; LoRA
    as Table IX's) on ``gpus`` GPUs of a platform (its to_dict()), under ``backend`` (the
    paper's methods run on DeepSpeed): ``fits`` (None on a platform without a GPU capacity),
    ``why`` not, ``gib_bs1``, ``max_batch`` (the largest predicted to fit, at most 1024),
    ``capacity_gib``. None where the platform cannot run the method at all (prompt tuning is
    not modelled; 4-bit where the platform has no 4-bit kernels). Offload is held to
    ``host_gib`` where given, else to the platform file's host memory."""
    t = techniques.parse(technique)
    if t.adapter == "prompt_tuning" or (t.quant4 and not plat.get("supports_4bit", True)):
        return None
    cap = plat.get("gpu_memory_gib") if plat.get("accelerator") == "cuda" else None
    host = host_gib if host_gib is not None else host_memory_gib(plat)
    ranks = min(gpus, plat.get("gpus_per_node") or 1)
    w = Workload(model=model, technique=technique, batch_size=1, seq_len=350, gpus=gpus, backend=backend,
                 adapter=PAPER_LORA if t.adapter else None)
    pred = predict(w)
    ok, why = fits(pred, cap, host, ranks, margin) if cap else (None, "")
    pmb = predicted_max_batch(w, cap, host, ranks, margin, max_batch=1024) if cap else None
    return {"fits": ok, "why": why, "gib_bs1": pred.gpu_gib, "max_batch": pmb, "capacity_gib": cap}


@cache
def _paper_training(root: str) -> pd.DataFrame:
    """The paper's rows of its methods (llmbench.backends.method_backends) in Tables II, III, IV and IX."""
    from . import paper_frame

    df = paper_frame.frame(Path(root))
    df = df[df["table"].isin(list(paper_frame.TABLES)) & df["backend"].isin(backends.method_backends())]
    return df.reset_index(drop=True)


def _paper(root: Path, platform: str, model: str, stage: str, gpus: int, technique: str) -> dict | None:
    """The paper's measurement of a cell: ``{"fits": True, tokens_per_s, batch_size, memory_gib,
    evidence}`` at its best printed tokens/s (flagged values left out), ``{"fits": False, "why"}``
    where it printed "-" at batch 1, or None where the paper has no such cell."""
    from . import paper_frame

    if gpus != paper_frame.PAPER_GPUS:
        return None
    df = _paper_training(str(root))
    rows = df[(df["platform"] == platform) & (df["model"] == model) & (df["stage"] == stage)
              & (df["technique"] == technique)]
    if rows.empty:
        return None
    ok = rows[(rows["status"] == "ok") & rows["tokens_per_s_compared"].notna()]
    if ok.empty:
        oom = rows[(rows["status"] == "oom") & (rows["table"] != "table4")]
        if oom.empty:
            return None
        table = _table_name(oom["table"].iloc[0])
        return {"fits": False, "why": f"out of memory at batch 1 in the paper ({table})"}
    best = ok.sort_values("tokens_per_s_compared", ascending=False).iloc[0]
    bs1 = ok[(ok["batch_size"] == 1) & ok["peak_mem_gb"].notna()]
    return {"fits": True, "tokens_per_s": float(best["tokens_per_s_compared"]), "batch_size": int(best["batch_size"]),
            "memory_gib": float(bs1["peak_mem_gb"].iloc[0]) / paper_frame.GIB_TO_GB if len(bs1) else None,
            "evidence": f"the paper's {_table_name(best['table'])}, batch {int(best['batch_size'])}"}


def _table_name(table: str) -> str:
    """'table4' -> 'Table IV'."""
    roman = {"2": "II", "3": "III", "4": "IV", "9": "IX"}
    return "Table " + roman.get(table.removeprefix("table"), table)


def _train_cell(platform: str, model: ModelSpec, stage: str, technique: str, gpus: int, batch_size: int):
    """The throughput model's cell (DeepSpeed, sequence length SEQ_LEN), or None where it does
    not model the method (prompt tuning, LoRA variants)."""
    from ..throughput import TrainCell

    tech = techniques.parse(technique)
    if tech.adapter not in (None, "lora"):
        return None
    return TrainCell(stage=stage, platform=platform, model=model, technique=tech, batch_size=batch_size,
                     gpus=gpus, seq_len=SEQ_LEN)


def predicted_tokens(platform: str, model: ModelSpec, stage: str, technique: str, gpus: int, batch_size: int,
                     root: Path = REPO_ROOT, measured: tuple[int, float] | None = None):
    """The throughput model's prediction (llmbench.throughput.Prediction) of a cell, or None
    where it has no model of the platform (no hardware entry or peak) or of the method.
    ``measured`` = (batch, tokens/s) of the same cell: the prediction is scaled from it
    (llmbench.throughput.interval.anchored)."""
    from ..throughput import interval

    try:
        cell = _train_cell(platform, model, stage, technique, gpus, batch_size)
        if cell is None:
            return None
        if measured is None:
            return interval.predict(cell, root=root)
        base = _train_cell(platform, model, stage, technique, gpus, measured[0])
        return interval.anchored(cell, base, measured[1], root=root)
    except ConfigError:
        return None


def _prediction_row(tp, batch: int) -> dict:
    """A row's throughput fields from a throughput-model prediction at ``batch``."""
    notes = "; ".join(tp.notes) if tp.notes else "in the calibration's range"
    return {"basis": "predicted", "tokens_per_s": tp.value, "tokens_per_s_low": tp.low, "tokens_per_s_high": tp.high,
            "batch_size": batch, "evidence": f"predicted at batch {batch} ({tp.quantile:.0%} interval): {notes}"}


def _method_row(tidy: pd.DataFrame, ask: dict[str, Any], model: ModelSpec, tech: str, p: dict,
                root: Path) -> dict:
    """One method's row: our measurement, else the paper's, else the models' (module docstring).
    The paper's rows stand as printed. Our measurement below the largest batch the memory
    model predicts to fit gives way to the prediction at that batch where even its interval's
    low end is faster (its evidence names the measurement): the plain prediction, or, where its
    interval is wider (a platform or GPU count outside the calibration), the one scaled from
    the measurement by the model's ratio."""
    row = {"platform": ask["platform"], "model": ask["model"], "stage": ask["stage"], "gpus": ask["gpus"],
           "goal": ask["goal"], "technique": tech, "predicted_max_batch": p["max_batch"],
           "predicted_gib_bs1": p["gib_bs1"], "capacity_gib": p["capacity_gib"], "memory_gib": p["gib_bs1"],
           "tokens_per_s": None, "tokens_per_s_low": None, "tokens_per_s_high": None, "batch_size": None,
           "why_not": ""}
    cell = (tidy, ask["platform"], ask["model"], ask["stage"], ask["gpus"], tech)
    m = _measured(*cell)
    oom = None if m else _out_of_memory(*cell)
    paper = None if (m or oom) else _paper(root, ask["platform"], ask["model"], ask["stage"], ask["gpus"], tech)
    if oom:
        return {**row, "basis": "measured", "fits": False, "evidence": "our records", "why_not": oom}
    if paper:  # the paper's measurements answer for its platforms, as printed
        return {**row, "basis": "paper", "fits": paper["fits"], "tokens_per_s": paper.get("tokens_per_s"),
                "batch_size": paper.get("batch_size"), "memory_gib": paper.get("memory_gib") or p["gib_bs1"],
                "measured_tokens_per_s": paper.get("tokens_per_s"), "measured_batch_size": paper.get("batch_size"),
                "evidence": paper.get("evidence", "the paper"), "why_not": paper.get("why", "")}
    batch = p["max_batch"] or 0
    if not m:
        row.update(basis="predicted", fits=p["fits"], evidence="no throughput model for this cell",
                   why_not="" if p["fits"] is not False else p["why"])
        if p["fits"] is False or not batch:
            return row
        tp = predicted_tokens(ask["platform"], model, ask["stage"], tech, ask["gpus"], batch, root)
        return {**row, **_prediction_row(tp, batch)} if tp else row
    row.update(basis="measured", fits=True, tokens_per_s=m["tokens_per_s"], batch_size=m["batch_size"],
               measured_tokens_per_s=m["tokens_per_s"], measured_batch_size=m["batch_size"],
               memory_gib=m.get("memory_gib") or p["gib_bs1"], evidence=f"our records, batch {m['batch_size']}")
    if batch <= m["batch_size"]:
        return row
    plain = predicted_tokens(ask["platform"], model, ask["stage"], tech, ask["gpus"], batch, root)
    scaled = predicted_tokens(ask["platform"], model, ask["stage"], tech, ask["gpus"], batch, root,
                              measured=(row["batch_size"], row["tokens_per_s"]))
    tp = scaled if scaled is not None and plain is not None and scaled.width < plain.width else plain
    if tp is not None and tp.low > row["tokens_per_s"]:
        new = _prediction_row(tp, batch)
        told = (" (in our records)" if tp is scaled else
                f"; measured {row['tokens_per_s']:,.0f} tokens/s at batch {row['batch_size']} in our records")
        return {**row, **new, "evidence": new["evidence"] + told}
    return row


def advise(tidy: pd.DataFrame, asks: list[dict[str, Any]], platforms: dict[str, Platform],
           root: Path = REPO_ROOT, margin: float | None = None) -> pd.DataFrame:
    """One row per (ask, method), ranked within each ask (see the module docstring); a serving
    ask's rows are its engines (serving_rows)."""
    rows = []
    choice = None
    for ask in asks:
        if ask["stage"] == SERVE:
            if choice is None:
                choice = serving.engine_choice(serving.build(tidy)) if "stage" in tidy else \
                    pd.DataFrame(columns=serving.CHOICE)
            rows += serving_rows(choice, ask, platforms[ask["platform"]], ModelSpec.load(ask["model"], root))
            continue
        plat = platforms[ask["platform"]].to_dict()
        model = ModelSpec.load(ask["model"], root)
        host = offload_host_gib(tidy, plat, ask["gpus"])
        group = []
        for tech in ask["methods"]:
            p = predicted(plat, model, tech, ask["gpus"], margin, host_gib=host)
            if p is None:
                continue
            row = _method_row(tidy, ask, model, tech, p, root)
            row["tokens_per_s_per_gpu"] = row["tokens_per_s"] / ask["gpus"] if row["tokens_per_s"] else None
            group.append(row)
        rows += _rank(group, ask["goal"])
    return pd.DataFrame(rows, columns=COLUMNS)


def serving_rows(choice: pd.DataFrame, ask: dict[str, Any], platform: Platform, model: ModelSpec) -> list[dict]:
    """An ask's serving rows: the engines of engine_choice (llmbench.report.serving) measured on
    its platform, model and GPU count, in their rank, one group per workload, each with the KV
    cache its records report and the requests of the workload's length it holds at once; then
    vLLM's and SGLang's predicted KV cache for the paper's burst where that engine was not
    measured (llmbench.serve.capacity), unranked: no model predicts serving throughput."""
    mine = choice[(choice["platform"] == ask["platform"]) & (choice["model"] == ask["model"])
                  & (choice["gpus"] == ask["gpus"])]
    base = {"platform": ask["platform"], "model": ask["model"], "gpus": ask["gpus"], "stage": SERVE,
            "goal": ask["goal"], "technique": None}
    rows = []
    for r in mine.to_dict("records"):
        within, kv = r["within_output_tokens_per_s"], r["kv_cache_tokens"]
        rows.append({**r, **base, "basis": "measured", "tokens_per_s": within,
                     "tokens_per_s_per_gpu": within / ask["gpus"] if pd.notna(within) else None,
                     "resident_requests": int(capacity.resident(kv, r["input_len"] + r["output_len"]))
                     if pd.notna(kv) else None,
                     "evidence": "our records",
                     "why_not": "" if pd.notna(r["within_point"]) else
                     f"none of its {r['points']} load{'s' if r['points'] != 1 else ''} within the targets"})
    if platform.gpu_memory_gib is None or platform.accelerator != "cuda":
        return rows
    i, o = BURST_TOKENS
    served = set(mine["engine"])
    for engine in (e for e in capacity.SHARE if e not in served):
        c = capacity.predict(engine, model, platform.gpu_memory_gib, ask["gpus"])
        rows.append({**base, "engine": engine, "basis": "predicted", "fits": c.fits, "input_len": i,
                     "output_len": o, "ttft_target_s": metrics.TTFT_TARGET_S, "tpot_target_s": metrics.TPOT_TARGET_S,
                     "kv_cache_tokens": c.kv_tokens if c.fits else None,
                     "resident_requests": c.resident(i + o) if c.fits else None,
                     "evidence": "predicted KV cache (llmbench.serve.capacity); no model predicts its throughput",
                     "why_not": c.why_not()})
    return rows


def _speed(r: dict) -> float:
    """What a row ranks by for throughput: its measured tokens/s, or its interval's low end."""
    value = r["tokens_per_s_low"] if r["basis"] == "predicted" else r["tokens_per_s"]
    return -math.inf if value is None or pd.isna(value) else float(value)


def _rank(group: list[dict], goal: str) -> list[dict]:
    """The group's rows in order, fitting ones ranked 1.. (unfitting last, unranked)."""
    fit = [r for r in group if r["fits"] is not False]
    rest = [r for r in group if r["fits"] is False]
    if goal == "throughput":
        key = lambda r: (-_speed(r), -(r["predicted_max_batch"] or 0), r["technique"])  # noqa: E731
    elif goal == "memory":
        key = lambda r: (r["memory_gib"], -_speed(r), r["technique"])  # noqa: E731
    else:
        key = lambda r: (-(r["predicted_max_batch"] or r["batch_size"] or 0), -_speed(r), r["technique"])  # noqa: E731
    fit.sort(key=key)
    for i, r in enumerate(fit, 1):
        r["rank"] = i
    for r in rest:
        r["rank"] = None
    return fit + rest


def build(tidy: pd.DataFrame, advice: dict[str, Any] | None = None, config_cells: list[tuple[str, str]] = (),
          root: Path | None = None, platform_names: list[str] | None = None) -> pd.DataFrame:
    """The advice table for a tidy table and an ``advice`` request."""
    root = root or REPO_ROOT
    names = set(platform_names or []) | {p for p, _ in config_cells}
    names |= set(_as_list((advice or {}).get("platforms") or (advice or {}).get("platform")))
    if "platform" in tidy:
        names |= set(tidy.loc[tidy["stage"].isin((*STAGES, SERVE)), "platform"])
    platforms = {}
    for n in names:
        try:
            platforms[n] = Platform.load(n, root)
        except ConfigError as exc:
            raise ConfigError(f"advice: platform {n!r}: {exc}") from None
    asks = request(advice, list(config_cells), tidy, platforms)
    return advise(tidy, asks, platforms, root)


def _interval(r) -> str:
    low, high = r.tokens_per_s_low, r.tokens_per_s_high
    return "" if low is None or pd.isna(low) else f"{low:,.0f}-{high:,.0f}"


def _serving_parts(p: str, g: int, m: str, grp: pd.DataFrame) -> list[render.Part]:
    """A serving ask's parts: one per workload, its engines in their rank."""
    parts = []
    for (i, o, ttft, tpot), w in grp.groupby(["input_len", "output_len", "ttft_target_s", "tpot_target_s"],
                                             sort=True):
        rows = [["" if pd.isna(r.rank) else str(int(r.rank)), runs.engine_label(r.engine, r.engine_version), r.basis,
                 fmt(r.tokens_per_s, ",.0f"),
                 r.within_point if pd.notna(r.within_point) else "",
                 f"{fmt(r.within_p99_ttft_s, '.2f')} / {fmt(r.within_p99_tpot_s, '.3f')}" if pd.notna(r.within_point)
                 else "",
                 fmt(r.most_output_tokens_per_s, ",.0f"), r.most_point if pd.notna(r.most_point) else "",
                 fmt(r.most_goodput_share, ".2f"),
                 "" if pd.isna(r.kv_cache_tokens) else
                 f"{fmt(r.kv_cache_tokens, ',.0f')} ({fmt(r.resident_requests, ',.0f')})",
                 "" if pd.isna(r.points) else f"{int(r.points)} ({int(r.runs)})", r.why_not or r.evidence]
                for r in w.itertuples()]
        parts.append(render.Part(
            frame=pd.DataFrame(rows, columns=["Rank", "Engine", "Basis", "Out tok/s within targets", "Its load",
                                              "Its TTFT / TPOT p99 s", "Most out tok/s", "Load of the most",
                                              "Goodput of the most", "KV tokens (requests resident)",
                                              "Loads (runs)", "Evidence / why not"]),
            heading=f"{m}, serve, {p} x {g} GPU{'s' if g > 1 else ''} ({fmt(i, '.0f')} in / {fmt(o, '.0f')} out; "
                    f"goal: the most output tokens/s with {serving.WITHIN_TARGETS:.0%} of requests within TTFT "
                    f"{fmt(ttft, 'g')} s and TPOT {fmt(tpot, 'g')} s)"))
    return parts


def table(df: pd.DataFrame) -> render.Table:
    """The advisor's page: one part per (platform, GPUs, model, stage), a serving one per workload."""
    parts = []
    for (p, g, m, s), grp in df.groupby(["platform", "gpus", "model", "stage"], sort=True):
        if s == SERVE:
            parts += _serving_parts(p, g, m, grp)
            continue
        rows = [["" if pd.isna(r.rank) else str(int(r.rank)), r.technique, r.basis,
                 "" if r.fits is None or (not isinstance(r.fits, bool) and pd.isna(r.fits)) else
                 ("yes" if r.fits else "no"), fmt(r.tokens_per_s, ",.0f"), _interval(r), fmt(r.batch_size, ".0f"),
                 fmt(r.predicted_max_batch, ".0f"), fmt(r.memory_gib, ".1f"), r.why_not or r.evidence]
                for r in grp.itertuples()]
        parts.append(render.Part(
            frame=pd.DataFrame(rows, columns=["Rank", "Method", "Basis", "Fits", "Tokens/s", "Interval", "Batch",
                                              "Predicted max batch", "Memory GiB (BS 1)", "Evidence / why not"]),
            heading=f"{m}, {s}, {p} x {g} GPU{'s' if g > 1 else ''} (goal: {grp['goal'].iloc[0]})"))
    note = ("Basis: measured (an ok record of this cell here: tokens/s at its best batch measured; or an oom record "
            "at batch 1: it does not fit), paper (the paper's own measurement, config/reference Tables II, III, IV "
            "and IX on 8 GPUs: its best tokens/s over the batches it printed), or predicted (the memory model, "
            "llmbench.memory: fits with its safety margin, largest batch, memory at batch 1; and the throughput "
            "model, llmbench.throughput: tokens/s at that batch with an interval as wide as the share of held-out "
            "cells the evidence column states needed, wider where the cell lies outside what the calibration records "
            "cover, which the evidence column names). A measurement of ours below the largest batch predicted to fit "
            "gives way to the prediction at that batch where the prediction's low end is faster. Throughput ranks "
            "measured and paper rows by tokens/s and predicted rows by their interval's low end. Sequence length "
            "350; LoRA rank 64 on every decoder linear (Table IX). Serving parts: the engines measured here, "
            "ranked by the most output tokens/s among their loads (runs pooled by their mean) with at least "
            f"{serving.WITHIN_TARGETS:.0%} of requests within the TTFT and TPOT targets (MLPerf's server "
            "scenario), then by the most they served at all; shared-prefix loads left out; KV tokens: the cache "
            "the engine reserved (its records) and the requests of the workload's length it holds at once. Where "
            "vLLM or SGLang was not measured: its KV cache predicted for the paper's burst (llmbench.serve.capacity: "
            "the GPU's share less the sharded bf16 weights and the engine's own overhead, within 1 % of every "
            "committed engine report), or why the model does not fit; unranked, as no model predicts serving "
            "throughput and the paper prints no serving numbers.")
    if not parts:
        parts = [render.Part(frame=pd.DataFrame(columns=["Rank", "Method"]))]
    parts[-1] = render.Part(frame=parts[-1].frame, heading=parts[-1].heading, note=note)
    return render.Table(title=catalog.get("table", "advice").title, long=df, parts=tuple(parts))
