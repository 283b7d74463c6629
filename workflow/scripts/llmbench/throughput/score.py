"""Score the throughput model where it cannot have been tuned.

1. The paper's Tables II, III, IV and IX (config/reference, read through
   llmbench.report.paper_frame: 8 GPUs, sequence length 350): tokens/s predicted from the
   platform files and config/throughput/constants.yaml with the constants fitted on our
   records only, per table and platform: n, median |error| %, and the Spearman rank
   correlation of methods within each (platform, model, batch regime) group.
2. Held out from our own records: H200 cells from an H100-only fit; multi-GPU cells from a
   1-GPU-only fit.
3. The repeat time that deadlines and Slurm limits are set by (llmbench.estimate.repeat: a
   start-up plus the steps at this model's step time) against each record's own repeat
   (llmbench.record.repeat_timing: its set-up and timed window), for every training record and
   probe of the combined view that the estimate predicts: measured / predicted, whose p95 and
   maximum estimate.DEADLINE_MARGIN and SLURM_MARGIN must cover.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from .. import estimate
from ..cells import cell_from_dict
from ..config import REPO_ROOT
from ..models import ModelSpec
from ..record import own_wall, repeat_timing
from ..report import paper_frame
from ..report.catalog import SOURCES
from . import calibrate
from .model import TERMS, calibrated_constants, step_time_s, terms

#: Groups of fewer methods than this get no rank correlation.
MIN_RANKED = 3


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN if either side is constant."""
    ra = pd.Series(list(a)).rank().to_numpy(float)
    rb = pd.Series(list(b)).rank().to_numpy(float)
    if len(ra) < 2 or ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def paper_rows(root: Path = REPO_ROOT) -> pd.DataFrame:
    """The paper's training cells that ran and print a usable tokens/s (flagged values out)."""
    df = paper_frame.frame(root)
    df = df[df["table"].isin(list(paper_frame.TABLES)) & (df["status"] == "ok")]
    df = df[df["tokens_per_s_compared"].notna()]
    return df.reset_index(drop=True)


def predict_rows(df: pd.DataFrame, constants: dict[str, float], root: Path = REPO_ROOT,
                 measured: str = "tokens_per_s_mean") -> pd.DataFrame:
    """Each row with predicted tokens/s, signed error (pred/meas - 1) and the seconds per term."""
    out = []
    for row in df.to_dict("records"):
        cell = calibrate.cell_of(row, root)
        parts = terms(cell, constants, root)
        step = step_time_s(cell, constants, root)
        pred = cell.tokens_per_step / step
        out.append({**{k: row.get(k) for k in ("table", "stage", "platform", "model", "backend", "technique",
                                               "batch_size", "gpus", "seq_len", "run")},
                    "tokens_per_s_measured": row[measured], "tokens_per_s_predicted": pred,
                    "error": pred / row[measured] - 1, "step_s_predicted": step,
                    "dominant_term": max(parts, key=parts.get),
                    **{f"{k}_s": parts[k] for k in TERMS}})
    return pd.DataFrame(out)


def _regime(df: pd.DataFrame) -> pd.Series:
    """Batch regime of a paper row: Table III and IX are batch 1, Table IV each method's largest
    batch, Table II both (its two batch sizes per framework are one group: 'mixed')."""
    return df["table"].map({"table2": "mixed"}).fillna("one")


def summarise(pred: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """n, median |error| %, median signed error %, and the mean rank correlation of methods
    within (platform, model) groups of each summary row (n_ranked groups of >= MIN_RANKED)."""
    rows = []
    for key, grp in pred.groupby(by, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        rhos = []
        for _, g in grp.groupby(["platform", "model"]):
            if len(g) >= MIN_RANKED:
                rho = spearman(g["tokens_per_s_predicted"], g["tokens_per_s_measured"])
                if not np.isnan(rho):
                    rhos.append(rho)
        rows.append({**dict(zip(by, key)), "n": len(grp),
                     "median_abs_error_pct": 100 * float(np.median(np.abs(grp["error"]))),
                     "median_error_pct": 100 * float(np.median(grp["error"])),
                     "rank_corr": float(np.mean(rhos)) if rhos else float("nan"), "n_ranked": len(rhos)})
    return pd.DataFrame(rows)


def held_out(root: Path = REPO_ROOT) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-cell predictions, summary) of the held-out splits of our records."""
    df = calibrate.load_records(root)
    splits = {
        "h200 from h100 fit": (df["platform"] == "h100", df["platform"].str.startswith("h200")),
        "multi-GPU from 1-GPU fit": (df["gpus"] == 1, df["gpus"] > 1),
        "in-sample (all records)": (df["platform"].notna(), df["platform"].notna()),
    }
    cells, rows = [], []
    for name, (train, test) in splits.items():
        consts = calibrate.fit(df[train], root)
        pred = predict_rows(df[test], consts, root).assign(split=name)
        cells.append(pred)
        summary = summarise(pred.assign(table=name), ["table"]).rename(columns={"table": "split"})
        summary["n_fit"] = int(train.sum())
        rows.append(summary)
        if name.startswith("multi"):
            per = summarise(pred.assign(table=name + ", gpus"), ["table", "gpus"])
            per["split"] = per.pop("table") + "=" + per.pop("gpus").astype(str)
            per["n_fit"] = int(train.sum())
            rows.append(per)
    return pd.concat(cells, ignore_index=True), pd.concat(rows, ignore_index=True)


def repeat_rows(root: Path = REPO_ROOT) -> pd.DataFrame:
    """One row per ok training record and probe of the combined view on a calibration platform
    whose repeat llmbench.estimate predicts, those that later runs of their cells superseded
    too (each timed a repeat): the record's measured seconds a repeat (set-up + timed window,
    llmbench.record.repeat_timing) and its set-up, the prediction and its start-up, and their
    ratio. The cell and model are the record's own (its ``cell`` and the model dimensions of
    its run spec)."""
    combined = root / calibrate.RECORDS_CSV.parent.parent  # the folder of the combined view's tables
    tables = [root / calibrate.RECORDS_CSV, combined / SOURCES["superseded"]]
    df = pd.concat([pd.read_csv(t, low_memory=False) for t in tables if t.is_file()], ignore_index=True)
    df = df[df["stage"].isin(["pretrain", "finetune"]) & (df["status"] == "ok")
            & df["platform"].isin(calibrate.CALIBRATION_PLATFORMS)]
    rows = []
    for path, kind in zip(df["record_path"], df["kind"]):
        rec = json.loads((root / path).read_text(encoding="utf-8"))
        timing = repeat_timing(rec)
        spec = ((rec.get("provenance") or {}).get("spec") or {}).get("model")
        if timing is None or not spec:
            continue
        pred = estimate.repeat(cell_from_dict(rec["cell"]), ModelSpec.from_dict(spec), root)
        if not pred.predicted:
            continue
        setup, window, steps, _ = timing
        provenance = rec.get("provenance") or {}
        rows.append({"record_path": path, "kind": kind, "steps": steps,
                     "launcher": (provenance.get("launchers") or ["?"])[0],
                     "setup_from": "wall" if own_wall(provenance) else "phases",
                     "measured_s": setup + window, "predicted_s": pred.predicted_s, "setup_s": setup,
                     "startup_predicted_s": pred.startup_s, "ratio": (setup + window) / pred.predicted_s})
    return pd.DataFrame(rows)


def repeat_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """n, median, p95 and maximum of measured / predicted repeat time, for every row and per
    kind (cell, probe), and how many exceed the deadline check's and the Slurm limit's margins."""
    out = []
    for name, grp in [("all", rows), *((k, g) for k, g in rows.groupby("kind"))]:
        r = grp["ratio"]
        out.append({"records": name, "n": len(grp), "median": float(r.median()), "p95": float(r.quantile(0.95)),
                    "max": float(r.max()), "over_deadline_margin": int((r > estimate.DEADLINE_MARGIN).sum()),
                    "over_slurm_margin": int((r > estimate.SLURM_MARGIN).sum())})
    return pd.DataFrame(out)


def run(out: Path, root: Path = REPO_ROOT) -> dict[str, pd.DataFrame]:
    """Write paper-predictions.csv, paper-score.csv, heldout-predictions.csv, heldout-score.csv,
    repeats-predictions.csv and repeats-score.csv into ``out``; return the three summaries."""
    out.mkdir(parents=True, exist_ok=True)
    constants = calibrated_constants(root)
    pred = predict_rows(paper_rows(root), constants, root, measured="tokens_per_s_compared")
    paper = summarise(pred, ["table", "platform"])
    cells, held = held_out(root)
    pred.to_csv(out / "paper-predictions.csv", index=False)
    paper.to_csv(out / "paper-score.csv", index=False)
    cells.to_csv(out / "heldout-predictions.csv", index=False)
    held.to_csv(out / "heldout-score.csv", index=False)
    reps = repeat_rows(root)
    repeats = repeat_summary(reps)
    reps.to_csv(out / "repeats-predictions.csv", index=False)
    repeats.to_csv(out / "repeats-score.csv", index=False)
    return {"paper": paper, "heldout": held, "repeats": repeats}
