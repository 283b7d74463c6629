"""The memory model applied to the grid's cells: whether a cell is predicted to fit (the
check a cell makes before it runs under ``skip_predicted_oom``), and the dry run of a whole
config that counts, per platform, the cells that would be skipped.

    python -m llmbench.memory plan config/paper.yaml [--margin 0.05] [--csv out.csv]

Without ``--margin`` each cell takes its technique family's (constants.margin_for).

Capacity: a GPU platform's ``gpu_memory_gib`` (and its host memory, Slurm's ``mem_mb``,
where the technique offloads); on a CPU platform the cell's ``mem_cap_gib`` (the per-rank
RSS cap), against the predicted tensors alone (the interpreter's own RSS comes on top:
a conservative check, it skips only what cannot fit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..cells import Cell
from ..config import REPO_ROOT, ConfigError
from ..platforms import Platform
from ..spec import RunSpec
from .constants import margin_for
from .model import (Prediction, Workload, batch_slope_gib, fits, host_memory_gib, modelled, not_modelled,
                    predict, predicted_max_batch)

#: the stages whose cells the model predicts (training steps)
STAGES = ("pretrain", "finetune", "profile")


@dataclass(kw_only=True, slots=True, frozen=True)
class Verdict:
    """A cell's predicted memory against its platform."""

    fits: bool
    reason: str
    """Why not (empty when it fits)."""
    prediction: Prediction
    capacity_gib: float | None
    """The memory the prediction is compared with (GPU, or a CPU cell's RSS cap)."""
    margin: float

    def summary(self) -> dict[str, Any]:
        """Flat, units in the names: what a skipped record keeps (Record.summary)."""
        return {"predicted_gpu_gib": self.prediction.gpu_gib, "predicted_host_gib": self.prediction.host_gib,
                "predicted_phase": self.prediction.phase, "capacity_gib": self.capacity_gib,
                "margin": self.margin, **{f"predicted_{k}_gib": v for k, v in self.prediction.terms.items()}}


def _host_capacity(platform: Platform, root: Path) -> float | None:
    if platform.slurm:
        return host_memory_gib(platform)
    try:  # a run spec leaves the platform's Slurm block out: read the platform file
        return host_memory_gib(Platform.load(platform.name, root))
    except ConfigError:
        return None


def check(spec: RunSpec | dict[str, Any], margin: float | None = None, root: Path = REPO_ROOT) -> Verdict | None:
    """The verdict on one training cell's run spec (llmbench.spec.RunSpec, or its JSON form),
    with ``margin`` (None: the cell's technique family's); None for a cell the model does not
    predict (serving, microbenchmarks, backends it does not model: model.modelled)."""
    spec = RunSpec.of(spec)
    cell, platform = spec.cell, spec.platform
    if not isinstance(cell, Cell) or cell.stage not in STAGES or not modelled(cell.backend, cell.technique):
        return None  # profile cells of the plain-torch and inference backends, FSDP2's offload: not modelled
    pred = predict(Workload.from_spec(spec))
    margin = margin_for(pred.family) if margin is None else margin
    if platform.accelerator == "cuda":
        cap = platform.gpu_memory_gib
        ok, why = fits(pred, cap, _host_capacity(platform, root), min(cell.gpus, platform.gpus_per_node or 1), margin)
    else:
        cap = cell.mem_cap_gib
        ok, why = fits(pred, cap, margin=margin)
        why = why.replace("GPU peak", "tensors' peak") + (" (the cell's mem_cap_gib)" if why else "")
    return Verdict(fits=ok, reason=why, prediction=pred, capacity_gib=cap, margin=margin)


def start_hint(spec: RunSpec | dict[str, Any]) -> int | None:
    """The start a max-batch search's spec (one with its ``search``) should take: the
    largest batch predicted to fit its GPU (at least 1), within the search's max; None where
    the model does not apply (a CPU platform, a backend it does not model). Replayed on the
    committed searches by llmbench.memory.replay."""
    spec = RunSpec.of(spec)
    cap = spec.platform.gpu_memory_gib if spec.platform.accelerator == "cuda" else None
    if not cap or check(spec) is None:
        return None
    return max(1, predicted_max_batch(Workload.from_spec(spec), cap, max_batch=spec.search["max"]))


def start_slope(spec: RunSpec | dict[str, Any], hint: int | None) -> float | None:
    """The GiB each further batch element adds at the hinted batch (model.batch_slope_gib),
    given to the search with its hint; None without a hint."""
    if hint is None:
        return None
    return batch_slope_gib(Workload.from_spec(spec).with_batch(hint)) or None


def plan(configfile: Path | str, root: Path = REPO_ROOT,
         margin: float | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per training cell of a config with its verdict, per platform: cells, how
    many ``skip_predicted_oom`` would skip, how many run, and how many the model does not
    predict (``not_modelled``: they run unchecked; their rows' ``predicted_fits`` is None and
    ``reason`` says why))."""
    from ..grid import load

    grid = load(Path(configfile), root)
    rows = []
    for cell in grid.cells:
        if not isinstance(cell, Cell) or cell.stage not in STAGES:
            continue
        v = check(grid.spec(cell), margin, root)
        if v is None:
            rows.append({**cell.key, "predicted_fits": None, "reason": not_modelled(cell.backend, cell.technique)})
            continue
        rows.append({**cell.key, "family": v.prediction.family, "margin": v.margin,
                     "predicted_gpu_gib": v.prediction.gpu_gib, "predicted_host_gib": v.prediction.host_gib,
                     "capacity_gib": v.capacity_gib, "predicted_fits": v.fits, "reason": v.reason})
    cells = pd.DataFrame(rows)
    if cells.empty:
        return cells, pd.DataFrame(columns=["platform", "cells", "skipped", "runs", "not_modelled"])
    verdict = cells["predicted_fits"]
    per = cells.assign(skipped=verdict.map(lambda f: f is False), unchecked=verdict.isna()).groupby("platform").agg(
        cells=("predicted_fits", "size"), skipped=("skipped", "sum"), not_modelled=("unchecked", "sum")).reset_index()
    per["runs"] = per["cells"] - per["skipped"]
    return cells, per[["platform", "cells", "skipped", "runs", "not_modelled"]].astype(
        {"skipped": int, "runs": int, "not_modelled": int})
