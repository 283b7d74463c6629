"""Coverage (tables/coverage.{csv,md,html}): every training row of the paper's Tables III, IV
(pre-training) and IX (fine-tuning), on each GPU platform the records ran on, with what is
known of it and what is left to do. No row is left out: a row nobody ran says so. A row the
paper has not, run there at batch 1 for one of its models (llama2-70b QL), follows them
(extra_rows), so that its search is on the to-do lists too.

The GPU count of a platform is the one most of its batch-1 training records used (one for
records made on single GPUs; eight for a user's 8-GPU node): the platforms and their counts
come from the records, none is named here. Beside each row stands the status the paper
reports on its own platform (PAPER_PLATFORM).

Each row's ``answer``:
  measured              an ok record at batch 1 (its tokens/s, protocol and coefficient of variation)
  out of memory         an ``oom`` record at batch 1 (``why``: its reason; host memory for offload)
  error / timeout       a record that failed for another reason (``why``: its reason)
  skipped               a ``skipped`` record: the memory model kept the cell from running
  predicted not to fit  no record; the memory model (llmbench.memory, with its margin) says it
                        needs more than the platform holds (``why``)
  not run               no record, and it is predicted to fit

``to_do`` (empty where nothing is left): ``run batch 1`` (not run, or failed); ``rerun under
the paper's protocol`` (an ok record with fewer than 30 warm-up or 100 measured steps, or fewer
than 3 repeats: the protocol of Tables III and IX); ``search the largest batch`` (an ok row
whose largest batch no max-batch search found: Table IV's batch; also where the search stopped
at its max_batch with every batch fitting, so its batch is a lower bound: the to-do then says
``past max_batch N``, and the search wants a config with a larger max); ``measure the searched batch``
(a search found the batch, but no cell ran ok there: not measured yet, or measured where its
cell then ran out of memory, and llmbench.search.measured_batch stepped down to the next
batch whose probe fit). A predicted-not-to-fit row has nothing to do: the prediction is its
answer, and the GPU hours stay unspent.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from .. import backends
from ..config import REPO_ROOT, ConfigError
from ..models import ModelSpec
from ..platforms import Platform
from . import catalog, reference, render
from .advice import offload_host_gib, predicted
from .runs import steps_label
from .render import fmt

#: The protocol of the paper's Tables III and IX: 30 warm-up steps, the mean of 100 measured
#: steps, three independent runs (mean and standard deviation over them).
PAPER_PROTOCOL = {"warmup_steps": 30, "measured_steps": 100, "repeats": 3}
#: The platform of the paper's reference column (its 8 x A800 node): each row shows the status
#: the paper reports there in Tables III and IX beside ours (column ``paper_a800_status``); a
#: fact of the paper, not a choice of machine.
PAPER_PLATFORM = "a800"
#: The spread a cell under the protocol should stay within (coefficient of variation, std / mean).
CV_GOAL = 0.02
#: stage -> (the paper table whose rows it covers, the tables those rows appear in)
STAGES = {"pretrain": ("table3", "III, IV"), "finetune": ("table9", "IX")}
ANSWERS = ("measured", "out of memory", "error", "timeout", "skipped", "predicted not to fit", "not run")
COLUMNS = [
    "platform", "gpus", "stage", "paper_tables", "model", "technique", "answer", "status", "tokens_per_s",
    "tokens_per_s_std", "cv", "cv_in_repeat", "drift_in_repeat", "warmup_steps", "measured_steps", "repeats",
    "paper_protocol", "run",
    "best_batch_size", "best_tokens_per_s", "searched_max_batch", "peak_mem_allocated_gib", "predicted_gib_bs1",
    "capacity_gib", "predicted_fits", "predicted_max_batch", "why", "to_do", "paper_a800_status",
]


def paper_rows(root: Path = REPO_ROOT) -> pd.DataFrame:
    """(stage, paper_tables, model, technique, paper_a800_status: the status on PAPER_PLATFORM)
    of every row of Tables III and IX, in the paper's order (Table IV has Table III's rows)."""
    out = []
    for stage, (table, shown) in STAGES.items():
        ref = reference.load(table, root)
        a800 = ref[ref["platform"] == PAPER_PLATFORM].set_index(["model", "technique"])["status"]
        for model, tech in dict.fromkeys(zip(ref["model"], ref["technique"])):
            out.append({"stage": stage, "paper_tables": shown, "model": model, "technique": tech,
                        "paper_a800_status": a800.get((model, tech))})
    return pd.DataFrame(out)


def extra_rows(records: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The rows beyond the paper's that a platform's batch-1 ``records`` ran, for the paper's
    models (llama2-70b QL: Table IX has no 70B QL row), in the shape of
    paper_rows with ``paper_tables`` "beyond III" or "beyond IX": covered as the paper's
    rows are, so that a measured row is not left out of the to-do lists."""
    known = set(zip(rows["stage"], rows["model"], rows["technique"]))
    bs1 = records[(records["batch_size"] == 1) & records["model"].isin(set(rows["model"]))]
    extra = sorted({k for k in zip(bs1["stage"], bs1["model"], bs1["technique"]) if k not in known},
                   key=lambda k: (list(STAGES).index(k[0]), k[1], k[2]))
    return pd.DataFrame([{"stage": stage, "paper_tables": "beyond " + STAGES[stage][1].split(",")[0], "model": model,
                          "technique": tech, "paper_a800_status": None} for stage, model, tech in extra],
                        columns=rows.columns)


def _training(tidy: pd.DataFrame) -> pd.DataFrame:
    """The measured training cells of the paper's methods in the tidy table (their backends:
    llmbench.backends.method_backends, DeepSpeed), not a search's probes."""
    if tidy.empty or "stage" not in tidy:
        return tidy.iloc[0:0]
    df = tidy[tidy["stage"].isin(list(STAGES)) & tidy["backend"].isin(backends.method_backends())]
    if "kind" in df:
        df = df[df["kind"].fillna("cell") == "cell"]
    return df


def platform_gpus(train: pd.DataFrame, root: Path = REPO_ROOT) -> list[tuple[str, dict, int]]:
    """(name, platform dict, GPU count) of every GPU platform with training records: the GPU
    count most of its batch-1 records used (the smaller one on a tie)."""
    out = []
    for name in sorted(set(train["platform"])):
        try:
            plat = Platform.load(name, root).to_dict()
        except ConfigError:
            continue  # a record of a platform file since removed: nothing to predict against
        if plat.get("accelerator") != "cuda":
            continue
        bs1 = train[(train["platform"] == name) & (train["batch_size"] == 1)]
        counts = (bs1 if not bs1.empty else train[train["platform"] == name])["gpus"].value_counts()
        gpus = int(sorted(counts.index, key=lambda g: (-counts[g], g))[0])
        out.append((name, plat, gpus))
    return out


def meets_protocol(row) -> bool:
    """Whether a record ran at least the paper's protocol."""
    return all(pd.notna(row[k]) and row[k] >= v for k, v in PAPER_PROTOCOL.items())


def _answer(rec, pred: dict | None) -> tuple[str, str]:
    """(answer, why) of one row from its batch-1 record (None: no record) and the prediction."""
    if rec is not None:
        status = rec["status"]
        if status == "ok":
            return "measured", ""
        return ("out of memory" if status == "oom" else status), render.brief(rec["reason"])
    if pred is not None and pred["fits"] is False:
        return "predicted not to fit", pred["why"]
    return "not run", ""


def _to_do(answer: str, rec, searched, to_cap: bool, measured_ok: bool) -> list[str]:
    if answer in ("not run", "error", "timeout"):
        return ["run batch 1"]
    if answer != "measured":
        return []
    todo = [] if meets_protocol(rec) else ["rerun under the paper's protocol"]
    if pd.isna(searched):
        todo.append(SEARCH_TODO)
    elif to_cap:
        todo.append(f"{SEARCH_TODO} past max_batch {int(searched)}")
    elif not measured_ok:
        todo.append(MEASURE_TODO)
    return todo


def build(tidy: pd.DataFrame, root: Path | None = None) -> pd.DataFrame:
    """One row per (GPU platform with training records, paper row), then the platform's
    extra_rows."""
    root = root or REPO_ROOT
    train = _training(tidy)
    rows = paper_rows(root)
    out = []
    models: dict[str, ModelSpec] = {}
    for name, plat, gpus in platform_gpus(train, root):
        mine = train[(train["platform"] == name) & (train["gpus"] == gpus)]
        host = offload_host_gib(train, plat, gpus)  # the machine's where smaller than the file's
        for r in pd.concat([rows, extra_rows(mine, rows)], ignore_index=True).itertuples():
            cells = mine[(mine["stage"] == r.stage) & (mine["model"] == r.model) & (mine["technique"] == r.technique)]
            bs1 = cells[cells["batch_size"] == 1]
            rec = bs1.iloc[0] if not bs1.empty else None  # the tidy table holds one record per cell
            if r.model not in models:
                models[r.model] = ModelSpec.load(r.model, root)
            pred = predicted(plat, models[r.model], r.technique, gpus, host_gib=host)
            answer, why = _answer(rec, pred)
            ok = cells[cells["status"] == "ok"]
            best = ok.sort_values("tokens_per_s_mean").iloc[-1] if not ok.empty else None
            searched = cells["searched_max_batch"].max() if "searched_max_batch" in cells and len(cells) else None
            to_cap = pd.notna(searched) and "searched_to_cap" in cells and bool(
                cells.loc[cells["searched_max_batch"] == searched, "searched_to_cap"].fillna(False).astype(bool).any())
            measured_ok = pd.notna(searched) and bool((ok["batch_size"] == searched).any())
            tps = rec["tokens_per_s_mean"] if answer == "measured" else None
            std = rec["tokens_per_s_std"] if answer == "measured" else None
            out.append({
                "platform": name, "gpus": gpus, "stage": r.stage, "paper_tables": r.paper_tables, "model": r.model,
                "technique": r.technique, "answer": answer, "status": None if rec is None else rec["status"],
                "tokens_per_s": tps, "tokens_per_s_std": std,
                "cv": std / tps if tps and std is not None and pd.notna(std) else None,
                # the spread of step times within a process, beside the spread between them
                "cv_in_repeat": rec.get("step_time_cv_in_repeat") if answer == "measured" else None,
                # and whether its steps still sped up: the warm-up did not reach the steady state
                "drift_in_repeat": rec.get("step_time_drift_in_repeat") if answer == "measured" else None,
                **{k: (None if rec is None else rec[k]) for k in PAPER_PROTOCOL},
                "paper_protocol": None if rec is None else meets_protocol(rec),
                "run": None if rec is None else rec["run"],
                "best_batch_size": None if best is None else best["batch_size"],
                "best_tokens_per_s": None if best is None else best["tokens_per_s_mean"],
                "searched_max_batch": searched if pd.notna(searched) else None,
                "peak_mem_allocated_gib": None if rec is None else rec["peak_mem_allocated_gib"],
                "predicted_gib_bs1": None if pred is None else pred["gib_bs1"],
                "capacity_gib": None if pred is None else pred["capacity_gib"],
                "predicted_fits": None if pred is None else pred["fits"],
                "predicted_max_batch": None if pred is None else pred["max_batch"],
                "why": why, "to_do": "; ".join(_to_do(answer, rec, searched, to_cap, measured_ok)),
                "paper_a800_status": r.paper_a800_status,
            })
    return pd.DataFrame(out, columns=COLUMNS)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per platform and stage: how many rows have each answer, how many measured rows ran the
    paper's protocol and met the CV goal, how many are searched, and how many are left to do."""
    rows = []
    for (plat, gpus, stage), g in df.groupby(["platform", "gpus", "stage"], sort=False):
        measured = g[g["answer"] == "measured"]
        row = {"Platform": plat, "GPUs": str(int(gpus)), "Stage": stage, "Rows": str(len(g))}
        row.update({a: str(int((g["answer"] == a).sum())) for a in ANSWERS if a not in ("error", "timeout", "skipped")})
        row["failed or skipped"] = str(int(g["answer"].isin(["error", "timeout", "skipped"]).sum()))
        row["under the protocol"] = str(int(measured["paper_protocol"].fillna(False).astype(bool).sum()))
        row[f"CV <= {CV_GOAL:.0%}"] = str(int((measured["cv"].astype(float) <= CV_GOAL).sum()))
        row["largest batch searched"] = str(int(measured["searched_max_batch"].notna().sum()))
        row["rows to do"] = str(int((g["to_do"].fillna("") != "").sum()))
        rows.append(row)
    return pd.DataFrame(rows)


def _protocol(r) -> str:
    return "" if pd.isna(r.warmup_steps) else steps_label(r.warmup_steps, r.measured_steps, r.repeats)


def _tokens(r) -> str:
    if r.tokens_per_s is None or pd.isna(r.tokens_per_s):
        return ""
    s = fmt(r.tokens_per_s, ",.1f")
    return s + (f" ± {r.tokens_per_s_std:,.1f}" if pd.notna(r.tokens_per_s_std) else "")


def _best(r) -> str:
    if pd.isna(r.best_batch_size):
        return ""
    return f"{int(r.best_batch_size)} ({fmt(r.best_tokens_per_s, ',.0f')})"


def _memory(r) -> str:
    if pd.isna(r.predicted_gib_bs1):
        return ""
    return f"{r.predicted_gib_bs1:.1f} / {fmt(r.capacity_gib, 'g')}"


def table(df: pd.DataFrame) -> render.Table:
    """The summary, then one part per platform: every paper row with its answer and what is left."""
    title = catalog.get("table", "coverage").title
    if df.empty:
        return render.Table(title=title, long=df, parts=(render.Part(
            frame=pd.DataFrame(columns=["Platform", "Rows"]),
            note="No training record ran on a GPU platform: nothing to cover (the paper's rows are about GPUs)."),))
    parts = [render.Part(frame=summary(df), heading="Summary")]
    for (plat, gpus), g in df.groupby(["platform", "gpus"], sort=False):
        frame = pd.DataFrame([{
            "Tables": r.paper_tables, "Model": r.model, "Method": r.technique, "Answer": r.answer,
            "tok/s (BS 1)": _tokens(r), "CV %": fmt(100 * r.cv if pd.notna(r.cv) else None, ".1f"),
            "Step CV in repeat %": fmt(100 * r.cv_in_repeat if pd.notna(r.cv_in_repeat) else None, ".1f"),
            "Step drift in repeat %": fmt(100 * r.drift_in_repeat if pd.notna(r.drift_in_repeat) else None, ".1f"),
            "Protocol": _protocol(r), "Best BS (tok/s)": _best(r), "Max BS searched": fmt(r.searched_max_batch, ".0f"),
            "Predicted GiB BS 1 / GPU GiB": _memory(r), "Predicted max BS": fmt(r.predicted_max_batch, ".0f"),
            "Why": r.why or "", "To do": r.to_do or "", "Run": r.run or "",
        } for r in g.itertuples()])
        parts.append(render.Part(frame=frame, heading=f"{plat} x {int(gpus)} GPU{'s' if gpus > 1 else ''}"))
    note = (
        "One row per row of the paper's Tables III/IV (pre-training) and IX (fine-tuning) on each GPU platform the "
        "records ran on, at the GPU count most of its batch-1 records used, then the rows beyond the paper's that "
        "ran there at batch 1 for its models (Tables: beyond III, beyond IX). Answer: measured (an ok record at batch "
        "1), out of memory (its record's reason), error/timeout/skipped (a record that did not measure), predicted "
        "not to fit (no record; the memory model with its safety margin needs more than the GPU, or, with offload, "
        "the host memory of the platform file's Slurm mem_mb or of the machine its records ran on, the smaller), "
        "not run (no record; predicted to fit). Protocol: "
        "warm-up/measured steps/repeats; the paper's is "
        f"{PAPER_PROTOCOL['warmup_steps']}/{PAPER_PROTOCOL['measured_steps']}/{PAPER_PROTOCOL['repeats']}. CV: "
        f"sample std over repeats / mean (goal {CV_GOAL:.0%}); step CV in repeat: the median over repeats of "
        "each one's step-time std / mean (records that keep their step times), the spread within a process "
        "beside the CV's between processes; step drift in repeat: the median over repeats of the first third of "
        "its measured steps' mean step time over the last third's, less 1 (well above 0: its steps still sped up, "
        "the warm-up did not reach the steady state, and the mean understates the cell). Best BS: the ok batch "
        "with the most tokens/s of any run; Max BS searched: what a max-batch search found (Table IV). To do: "
        "what is left for the row; a row "
        "predicted not to fit is answered by the prediction and is not run. A measured answer wins over the "
        "prediction: where both disagree, the record is right and the model (or the platform file's host "
        "memory) is not.")
    parts[-1] = render.Part(frame=parts[-1].frame, heading=parts[-1].heading, note=note)
    return render.Table(title=title, long=df, parts=tuple(parts))


# The next GPU session's targets ---------------------------------------------------------------

#: the to-dos that name a grid's max-batch searches (their folders), not its batch-1 cells:
#: envs/offline-batch.sh runs a search folder's measured cell after it (or alone, where a
#: SKIP_RECORDED folder holds the search)
SEARCH_TODO = "search the largest batch"
MEASURE_TODO = "measure the searched batch"


def targets(cov: pd.DataFrame, grid, wanted: tuple[str, ...] = ("run batch 1",),
            platforms: list[str] | None = None) -> list[str]:
    """The record paths of ``grid``'s batch-1 training cells (of ``platforms``, or all) whose
    coverage row (same platform, GPUs, stage, model and method) still has one of ``wanted``
    to do, in the config's order; with SEARCH_TODO or MEASURE_TODO wanted, the folders of
    its max-batch searches whose row has that to do, after them (envs/offline-batch.sh runs
    a search folder's measured cell once the search has found its batch). A cell of a
    platform the coverage does not know (no record ran there yet) counts as not run."""
    todo = {}
    for r in cov.itertuples():
        todo[(r.platform, int(r.gpus), r.stage, r.model, r.technique)] = "" if pd.isna(r.to_do) else str(r.to_do)
    known_platforms = set(cov["platform"])
    out = []
    for c in grid.cells:
        if getattr(c, "stage", None) not in STAGES or getattr(c, "batch_size", None) != 1:
            continue
        if platforms and c.platform not in platforms:
            continue
        key = (c.platform, c.gpus, c.stage, c.model, c.technique)
        if key in todo:
            if any(w in todo[key] for w in wanted):
                out.append(c.record_path(grid.results_dir))
        elif c.platform not in known_platforms and "run batch 1" in wanted:
            out.append(c.record_path(grid.results_dir))
    searching = [w for w in wanted if w in (SEARCH_TODO, MEASURE_TODO)]
    for search in grid.searches if searching else []:
        c = search.cell
        row = todo.get((c.platform, c.gpus, c.stage, c.model, c.technique), "")
        if (not platforms or c.platform in platforms) and any(w in row for w in searching):
            out.append(search.record_path(grid.results_dir))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.report.coverage targets COVERAGE_CSV CONFIG [--to-do WHAT ...]``:
    print the record targets of CONFIG's cells that COVERAGE_CSV (a tables/coverage.csv, e.g.
    the combined view's) says are still to do, one per line, for ``snakemake <targets>``."""
    import argparse

    from ..grid import load

    ap = argparse.ArgumentParser(prog="python -m llmbench.report.coverage", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("targets", help="record paths of a config's cells still to do")
    t.add_argument("coverage", type=Path, help="a tables/coverage.csv")
    t.add_argument("config", type=Path, help="the config whose cells to run")
    t.add_argument("--to-do", action="append",
                   choices=["run batch 1", "rerun under the paper's protocol", SEARCH_TODO, MEASURE_TODO],
                   help="which to-do to select (repeatable; default: run batch 1); "
                        f"'{SEARCH_TODO}' and '{MEASURE_TODO}': the config's search folders")
    t.add_argument("--platform", action="append", help="only these platforms (repeatable)")
    args = ap.parse_args(argv)
    try:
        grid = load(args.config)
    except ConfigError as exc:
        ap.exit(2, f"{exc}\n")
    if not args.coverage.exists():
        ap.exit(2, f"{args.coverage}: no such file (build it: snakemake tables)\n")
    paths = targets(pd.read_csv(args.coverage), grid, tuple(args.to_do or ["run batch 1"]), args.platform)
    print("\n".join(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
