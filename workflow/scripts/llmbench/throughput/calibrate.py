"""Fit the throughput model's constants on our own training records.

Input: the combined view's tidy table (one used record per cell). Only our platforms enter
(CALIBRATION_PLATFORMS); the paper's numbers (config/reference) are never read here, so no
constant can be tuned on the tables the model is scored against (llmbench.throughput.score
reads them only after the fit, and a test holds the fit blind to them).

The fit minimises the relative error of the step time, sum(((pred - meas) / meas)^2), over
non-negative constants (Lawson-Hanson NNLS). Each side of a step (host, GPU, serial) is linear
in the constants; the step is the longer of host and GPU plus a share of the shorter
(llmbench.throughput.model.step_of), linear once it is known which side is the longer. So for
each share on a grid (OVERLAP_GRID) the fit starts from the sides added, solves NNLS with each
record's longer side as the last solve left it, and repeats until no record changes side (or
FIT_ROUNDS); the share whose fit has the least error wins. Deterministic: no random start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import techniques
from ..config import REPO_ROOT
from ..models import ModelSpec
from .model import (CALIBRATED, OVERLAP, SIDES, Hardware, TrainCell, features, hardware, load_constants,
                    not_modelled, side_of, step_of)

#: The tidy table calibration reads (relative to the repository root).
RECORDS_CSV = Path("results") / "reference" / "combined" / "tables" / "records.csv"
#: Platforms whose records may calibrate: ours. The paper's platforms never do.
CALIBRATION_PLATFORMS = ("h100", "h200", "h200x4", "h200x8")
#: The overlap shares the fit tries (model.OVERLAP): 0 to 1 in steps of 0.05.
OVERLAP_GRID = tuple(i / 20 for i in range(21))
#: Most NNLS solves per share before the records' longer sides settle.
FIT_ROUNDS = 30


def select(df: pd.DataFrame) -> pd.DataFrame:
    """The records calibration uses: measured training cells that ran (ok), on our platforms,
    with the Llama models; not search probes (2 steps, 1 repeat), not torch.compile or FP8 (not
    modelled), not Megatron-LM with tensor parallelism (modelled as data parallel only), not
    FSDP2 with CPU offload (not modelled)."""
    df = df[df["stage"].isin(["pretrain", "finetune"]) & (df["status"] == "ok")]
    df = df[df["platform"].isin(CALIBRATION_PLATFORMS) & df["model"].astype(str).str.startswith("llama")]
    if "kind" in df.columns:
        df = df[df["kind"].fillna("cell") == "cell"]
    df = df[pd.Series([not_modelled(b, techniques.parse(t)) is None for b, t in zip(df["backend"], df["technique"])],
                      index=df.index, dtype=bool)]
    if "layout" in df.columns:
        df = df[~df["layout"].fillna("").astype(str).str.startswith("tp2")]
    df = df[~df["technique"].map(lambda t: techniques.parse(t).compiled)]
    df = df[df["tokens_per_s_mean"].notna() & (df["tokens_per_s_mean"] > 0)]
    return df.reset_index(drop=True)


def cell_of(row, root: Path = REPO_ROOT) -> TrainCell:
    """A TrainCell from one tidy-table row."""
    return TrainCell(
        stage=row["stage"], platform=row["platform"], model=ModelSpec.load(row["model"], root),
        technique=techniques.parse(row["technique"]), batch_size=int(row["batch_size"]), gpus=int(row["gpus"]),
        seq_len=int(row["seq_len"]), backend=row["backend"],
    )


def measured_step_s(row) -> float:
    """Seconds per step from the record's tokens/s (global tokens of a step / tokens/s)."""
    return row["batch_size"] * row["seq_len"] * row["gpus"] / row["tokens_per_s_mean"]


def design(cells: list[TrainCell], root: Path = REPO_ROOT,
           hw_of=None) -> tuple[np.ndarray, np.ndarray]:
    """(known seconds per cell and side, cells x SIDES; features, cells x SIDES x CALIBRATED)."""
    work = load_constants(root)["work"]
    names = list(CALIBRATED)
    known = np.zeros((len(cells), len(SIDES)))
    X = np.zeros((len(cells), len(SIDES), len(names)))
    for i, cell in enumerate(cells):
        hw: Hardware = hw_of(cell.platform) if hw_of else hardware(cell.platform, root)
        for term, const, value in features(cell, hw, work):
            side = SIDES.index(side_of(term, const))
            if const is None:
                known[i, side] += value
            else:
                X[i, side, names.index(const)] += value
    return known, X


def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 500) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson and Hanson, 1974, ch. 23)."""
    n = A.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    tol = 1e-10 * max(1.0, np.abs(w).max())
    for _ in range(max_iter):
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = np.argmax(np.where(passive, -np.inf, w))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = A.T @ (b - A @ x)
    return x


def _solve(known: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """NNLS of the relative step-time error for one linear form (known seconds, features)."""
    # scale columns so NNLS's tolerance means the same for every constant
    scale = np.abs(X / y[:, None]).max(axis=0)
    scale[scale == 0] = 1.0
    return nnls(X / y[:, None] / scale, (y - known) / y) / scale


def _fit_share(known: np.ndarray, X: np.ndarray, y: np.ndarray, overlap: float) -> tuple[np.ndarray, float]:
    """(constants, sum of squared relative errors) at one overlap share (module docstring)."""
    host, device = SIDES.index("host"), SIDES.index("device")
    weights = np.ones((len(y), len(SIDES)))  # the sides added: the first solve's form
    longer = None
    for _ in range(FIT_ROUNDS):
        coef = _solve((known * weights).sum(1), (X * weights[:, :, None]).sum(1), y)
        sides = known + X @ coef
        now = sides[:, host] >= sides[:, device]
        if longer is not None and (now == longer).all():
            break
        longer = now
        weights = np.ones_like(weights)
        weights[:, device] = np.where(longer, overlap, 1.0)
        weights[:, host] = np.where(longer, 1.0, overlap)
    step = np.array([step_of(*row, overlap) for row in known + X @ coef])  # rows in SIDES' order
    return coef, float((((step - y) / y) ** 2).sum())


def fit(df: pd.DataFrame, root: Path = REPO_ROOT, hw_of=None) -> dict[str, float]:
    """Constants fitted on the given (already selected) records: relative least squares, >= 0,
    with the overlap share (model.OVERLAP) whose fit errs least (module docstring). Constants
    no record informs (all-zero feature) come out 0."""
    cells = [cell_of(row, root) for row in df.to_dict("records")]
    y = np.array([measured_step_s(row) for row in df.to_dict("records")])
    known, X = design(cells, root, hw_of)
    best = min(((_fit_share(known, X, y, share), share) for share in OVERLAP_GRID), key=lambda f: f[0][1])
    (coef, _), share = best
    return {**{name: float(v) for name, v in zip(CALIBRATED, coef)}, OVERLAP: share}


def load_records(root: Path = REPO_ROOT) -> pd.DataFrame:
    """The combined view's tidy table, selected for calibration."""
    return select(pd.read_csv(root / RECORDS_CSV, low_memory=False))


def calibrated_block(constants: dict[str, float], df: pd.DataFrame) -> dict:
    """The YAML block written under the marker of the constants file: each constant with its
    unit, meaning and source (the records it was fitted on)."""
    runs = sorted(df["run"].dropna().unique()) if "run" in df.columns else []
    source = (f"fitted on {len(df)} records of {RECORDS_CSV} ({', '.join(CALIBRATION_PLATFORMS)}; "
              "llmbench.throughput.calibrate.select), relative least squares, non-negative")
    return {"calibrated": {
        "fitted_on": {"table": str(RECORDS_CSV), "records": len(df), "runs": runs},
        "constants": {**{name: {"value": float(f"{constants[name]:.6g}"), "unit": CALIBRATED[name][1],
                                "meaning": CALIBRATED[name][2], "source": source}
                         for name in CALIBRATED},
                      OVERLAP: {"value": constants[OVERLAP], "unit": "share (0-1)",
                                "meaning": "of the shorter of a step's host and GPU time, what the longer does not "
                                           "hide (1: they add; 0: they overlap fully)",
                                "source": source.replace("relative least squares, non-negative",
                                                         "the share of OVERLAP_GRID whose fit has the least "
                                                         "relative squared error")}},
    }}
