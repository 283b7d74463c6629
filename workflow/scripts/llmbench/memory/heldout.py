"""The memory model scored on records its constants were not fitted to (tables/memory-model-heldout).

    python -m llmbench.memory heldout [TIDY_CSV] [--share 0.7] [--csv F]

Each split fits the constants (``fit.fit_from_scratch``: from ``fit.UNFITTED``, refitted
until they settle) on one part of the training records and predicts the other part:

- ``time``: the records ordered by when their run started (provenance ``started``); the
  earliest ``share`` of them fit, the later ones are scored. The cut falls between two start
  times, never inside one. Records without a start time (a probe answered from a search's
  frontier file ran nothing) take part in neither side.
- ``family``: each technique family (llmbench.memory.model.FAMILIES) left out in turn: the
  other families' records fit, the family's own are scored. A constant that only the left-out
  family's records fit (ZeRO-3's activation scale, the 4-bit scale, offload's bytes) stays
  unfitted, as it would be for a family the model has never seen: this split measures how the
  model carries over to a family, not how well it knows one.

Scored: the ok GPU records with a measured allocated peak, allocated and reserved (the one
that decides what fits) as ``(predicted - measured) / measured``; and, where a max-batch
search found its answer, the largest batch predicted to fit its own limit (the search's
``fit_limit_gib``, no margin) against the one it found.

The per-family margin (``margins``, constants.FAMILY_MARGINS) comes from the ``time`` split
where a family has enough later records, else from ``family``: the 95th percentile of how far
the reserved peak fell short, as a share of the prediction (the margin multiplies the
prediction), over the records that held at least ``NEAR_LIMIT`` of their GPU reserved (where
a fit is decided), never under ``MARGIN_FLOOR`` (the default margin); a family with fewer than ``MIN_ROWS`` such
records in either split keeps the default margin (constants.MARGIN).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..config import REPO_ROOT
from .constants import MARGIN
from .fit import Row, applied, fit_from_scratch, platform_file, record_spec, rows
from .model import FAMILIES, Workload, family, modelled, predict, predicted_max_batch

#: The share of the records (by start time) the ``time`` split fits on.
TIME_SHARE = 0.7
#: The fewest scored records of a family that set its margin; fewer keep constants.MARGIN.
MIN_ROWS = 10
#: The quantile of the reserved peak's shortfall a family's margin covers.
QUANTILE = 0.95
#: The records a margin is set from: those that held at least this share of their GPU
#: reserved, where a fit is decided (as llmbench.memory.validate.NEAR_LIMIT). Further from the
#: limit the reserved peak follows the allocator's start-up and load-time blocks, which the
#: model does not try to predict (constants.MARGIN).
NEAR_LIMIT = 0.85
#: The smallest margin a family gets: the default. Only ok records have a measured peak, so
#: the held-out shortfall near the limit is that of cells that fitted: a cell the model
#: under-predicted by more ran out of memory and is not scored. The ok records can say a
#: family needs more than the default, not that it can do with less (a lower ZeRO-3 margin
#: would have hinted one H200's Z3 and F+Z3 searches batches that ran out of memory).
MARGIN_FLOOR = MARGIN
SPLITS = ("time", "family")
SUMMARY_COLUMNS = [
    "split", "family", "rows", "training_rows", "alloc_median_signed_pct", "alloc_p90_signed_pct",
    "alloc_p95_signed_pct", "alloc_median_abs_pct", "alloc_p90_abs_pct", "alloc_p95_abs_pct",
    "reserved_rows", "reserved_median_signed_pct", "reserved_p90_signed_pct", "reserved_p95_signed_pct",
    "reserved_median_abs_pct", "reserved_p90_abs_pct", "reserved_p95_abs_pct", "reserved_p95_shortfall_pct",
    "searches", "search_median_abs_pct", "search_off_over_10pct", "search_max_abs_pct"]


@dataclass(frozen=True, slots=True)
class Fold:
    """One fit and what it scores: indices into the rows."""

    split: str
    label: str
    """What is held out: a family's name, or ``later`` (time)."""
    train: tuple[int, ...]
    test: tuple[int, ...]
    cutoff: str | None = None
    """The time split's first held-out start time (None for the family split)."""


def scored(row: Row, root: Path = REPO_ROOT) -> bool:
    """Whether a record is scored: an ok GPU record with a measured allocated peak."""
    plat = platform_file(row.platform, str(root)) or {}
    return row.status == "ok" and row.measured_gib is not None and plat.get("accelerator") == "cuda"


def time_folds(training: list[Row], share: float = TIME_SHARE) -> list[Fold]:
    """The ``time`` split: the earliest ``share`` of the rows with a start time fit, the rest
    are held out; the cut moves forward past rows that started at the same time as the
    last fitted one. No fold where either side would be empty."""
    if not 0 < share < 1:
        raise ValueError(f"share must be in (0, 1), got {share}")
    timed = sorted((r.started, i) for i, r in enumerate(training) if r.started)
    if len(timed) < 2:
        return []
    k = max(1, int(round(share * len(timed))))
    while k < len(timed) and timed[k][0] == timed[k - 1][0]:
        k += 1
    if k >= len(timed):
        return []
    return [Fold("time", "later", tuple(sorted(i for _, i in timed[:k])), tuple(sorted(i for _, i in timed[k:])),
                 cutoff=timed[k][0])]


def family_folds(training: list[Row]) -> list[Fold]:
    """The ``family`` split: one fold per family present, its rows held out, the rest fit."""
    fams = [family(r.workload) for r in training]
    return [Fold("family", f, tuple(i for i, g in enumerate(fams) if g != f),
                 tuple(i for i, g in enumerate(fams) if g == f)) for f in FAMILIES if f in fams]


def folds(training: list[Row], share: float = TIME_SHARE) -> list[Fold]:
    """Both splits' folds."""
    return time_folds(training, share) + family_folds(training)


def _pct(pred: float | None, measured: float | None) -> float | None:
    if pred is None or measured is None or not measured or pd.isna(measured):
        return None
    return 100.0 * (pred - measured) / measured


def score(training: list[Row], all_folds: list[Fold], root: Path = REPO_ROOT,
          searches: list[dict] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per held-out record and fold, one row per held-out search and fold): each
    fold's constants fitted on its training rows, then its held-out rows predicted."""
    recs, found = [], []
    for fold in all_folds:
        constants = fit_from_scratch([training[i] for i in fold.train], root)
        with applied(constants):
            for i in fold.test:
                row = training[i]
                if not scored(row, root):
                    continue
                p = predict(row.workload)
                w = row.workload
                cap = (platform_file(row.platform, str(root)) or {}).get("gpu_memory_gib")
                recs.append({
                    "split": fold.split, "fold": fold.label, "family": family(w), "platform": row.platform,
                    "model": w.model.name, "technique": w.technique, "backend": w.backend, "batch_size": w.batch_size,
                    "gpus": w.gpus, "run": row.run, "started": row.started, "training_rows": len(fold.train),
                    "measured_gib": row.measured_gib, "predicted_gib": p.gpu_gib,
                    "measured_reserved_gib": row.reserved_gib, "predicted_reserved_gib": p.reserved_gib,
                    "capacity_gib": cap,
                    "reserved_share": None if row.reserved_gib is None or not cap else row.reserved_gib / cap,
                    "error_pct": _pct(p.gpu_gib, row.measured_gib),
                    "reserved_error_pct": _pct(p.reserved_gib, row.reserved_gib),
                    # how far the measured reserved peak went beyond the prediction, as a share
                    # of the prediction: the margin a fit needed
                    "reserved_shortfall_pct": None if row.reserved_gib is None or not p.reserved_gib
                    else 100.0 * (row.reserved_gib / p.reserved_gib - 1.0)})
            for s in searches or ():
                if not _held_out(s, fold):
                    continue
                limit = s.get("fit_limit_gib") or s["capacity_gib"]
                pmb = predicted_max_batch(s["workload"], limit, margin=0.0, max_batch=s["max_batch"])
                found.append({"split": fold.split, "fold": fold.label, "family": s["family"],
                              "platform": s["platform"], "model": s["model"], "technique": s["technique"],
                              "gpus": s["gpus"], "largest_ok": s["largest_ok"], "predicted_max_batch": pmb,
                              "error_pct": _pct(pmb, s["largest_ok"]), "search": s["path"]})
    return pd.DataFrame(recs), pd.DataFrame(found)


def _held_out(search: dict, fold: Fold) -> bool:
    if fold.split == "family":
        return search["family"] == fold.label
    return bool(search["started"]) and fold.cutoff is not None and search["started"] >= fold.cutoff


def load_searches(folders: list[str | Path], root: Path = REPO_ROOT) -> list[dict]:
    """The max-batch searches that found their answer (search.json with status ok and a
    largest batch), each with its workload (from its first record), family and start time."""
    out = []
    for folder in folders:
        path = Path(folder) / "search.json"
        path = path if path.is_absolute() else root / path
        if not path.exists():
            continue
        s = json.loads(path.read_text())
        first = sorted(path.parent.glob("bs*/record.json"))
        if s.get("status") != "ok" or not s.get("largest_ok") or not first:
            continue
        spec = record_spec(first[0], root)
        if not modelled(spec.cell.backend, spec.cell.technique) or spec.platform.accelerator != "cuda":
            continue
        w = Workload.from_spec(spec)
        started = min(filter(None, ((json.loads(p.read_text()).get("provenance") or {}).get("started")
                                    for p in first)), default=None)
        out.append({**{k: s[k] for k in ("platform", "model", "technique", "gpus", "largest_ok", "max_batch",
                                         "capacity_gib")},
                    "fit_limit_gib": s.get("fit_limit_gib"), "workload": w, "family": family(w),
                    "started": started, "path": str(path.parent)})
    return out


def _q(x: pd.Series, q: float | str) -> float | None:
    x = x.dropna().astype(float)
    if x.empty:
        return None
    return float(x.median()) if q == "median" else float(x.quantile(q))


def summary(records: pd.DataFrame, found: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per split and family (and ``all``): rows, median, 90th and 95th percentile of the
    signed and the absolute error of the allocated and the reserved peak, the 95th
    percentile of the reserved shortfall, and the searches' largest batch: median |error|,
    how many were off by more than 10 %, the largest |error|."""
    out = []
    if records.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    found = found if found is not None else pd.DataFrame()
    for split in [s for s in SPLITS if s in set(records["split"])]:
        mine = records[records["split"] == split]
        s_mine = found[found["split"] == split] if not found.empty else found
        for fam in [f for f in FAMILIES if f in set(mine["family"])] + ["all"]:
            r = mine if fam == "all" else mine[mine["family"] == fam]
            s = s_mine if fam == "all" or s_mine.empty else s_mine[s_mine["family"] == fam]
            a, res = r["error_pct"], r["reserved_error_pct"]
            serr = s["error_pct"].abs() if not s.empty else pd.Series(dtype=float)
            out.append({
                "split": split, "family": fam, "rows": len(r),
                "training_rows": int(r["training_rows"].min()) if fam != "all" else None,
                "alloc_median_signed_pct": _q(a, "median"), "alloc_p90_signed_pct": _q(a, 0.9),
                "alloc_p95_signed_pct": _q(a, 0.95), "alloc_median_abs_pct": _q(a.abs(), "median"),
                "alloc_p90_abs_pct": _q(a.abs(), 0.9), "alloc_p95_abs_pct": _q(a.abs(), 0.95),
                "reserved_rows": int(res.notna().sum()),
                "reserved_median_signed_pct": _q(res, "median"), "reserved_p90_signed_pct": _q(res, 0.9),
                "reserved_p95_signed_pct": _q(res, 0.95), "reserved_median_abs_pct": _q(res.abs(), "median"),
                "reserved_p90_abs_pct": _q(res.abs(), 0.9), "reserved_p95_abs_pct": _q(res.abs(), 0.95),
                "reserved_p95_shortfall_pct": _q(r["reserved_shortfall_pct"], QUANTILE),
                "searches": len(s), "search_median_abs_pct": _q(serr, "median"),
                "search_off_over_10pct": int((serr > 10).sum()), "search_max_abs_pct": _q(serr, 1.0)})
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def margins(records: pd.DataFrame, min_rows: int = MIN_ROWS, quantile: float = QUANTILE,
            floor: float = MARGIN_FLOOR, default: float = MARGIN, near: float = NEAR_LIMIT) -> pd.DataFrame:
    """Per family: the margin its held-out reserved shortfall asks for (see the module
    docstring) over the records that held at least ``near`` of their GPU reserved, the split
    it came from and over how many records; ``default`` where neither split has ``min_rows``
    such records of the family."""
    out = []
    if not records.empty:
        records = records[records["reserved_share"].astype(float) >= near]
    for fam in FAMILIES:
        chosen = None
        for split in SPLITS:
            r = records[(records["split"] == split) & (records["family"] == fam)] if not records.empty else records
            short = r["reserved_shortfall_pct"].dropna() if len(r) else pd.Series(dtype=float)
            if len(short) >= min_rows:
                q = float(np.quantile(short.astype(float), quantile)) / 100.0
                chosen = {"family": fam, "margin": round(max(floor, q), 3), "source": split,
                          "rows": len(short), "shortfall_quantile": q}
                break
        out.append(chosen or {"family": fam, "margin": default, "source": "default", "rows": 0,
                              "shortfall_quantile": None})
    return pd.DataFrame(out)


def build(tidy: pd.DataFrame, root: Path = REPO_ROOT, search_folders: list[str | Path] | None = None,
          share: float = TIME_SHARE) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(per held-out record, per held-out search, the summary, the margins) of a tidy table."""
    training = [row for _, row in rows(tidy, root)]
    recs, found = score(training, folds(training, share), root, load_searches(search_folders or [], root))
    return recs, found, summary(recs, found), margins(recs)


def main(tidy_csv: str | Path, share: float = TIME_SHARE, csv: str | None = None,
         results: str | Path = "results/reference") -> int:
    """Print the held-out summary and the margins it gives (and write the summary as CSV)."""
    folders = sorted(str(p.parent) for p in Path(results).glob("*/runs/search/**/search.json"))
    recs, found, summ, marg = build(pd.read_csv(tidy_csv), REPO_ROOT, folders, share)
    if csv:
        summ.to_csv(csv, index=False)
    print(summ.to_markdown(index=False, floatfmt=".1f"))
    print()
    print(marg.to_markdown(index=False, floatfmt=".3f"))
    return 0
