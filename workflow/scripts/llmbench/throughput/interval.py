"""A throughput prediction with an interval, and a note for each way a cell lies outside
what the calibration records cover (docs/throughput-model.md, "Intervals").

The interval is multiplicative: [value / e^w, value x e^w], where w is a half-width in log
space read from config/throughput/interval.yaml. Each width there is the QUANTILE of
|ln(predicted / measured)| over cells the fit never saw:

  in_range        leave-one-run-out over the calibration records (each run predicted from a
                  fit on the others)
  gpus            cells on more GPUs than the fit saw (multi-GPU cells from a 1-GPU-only fit)
  platform_<link> cells of a platform the fit never saw, by its link kind (the paper's
                  measurements: NVLink from its A800 cells, PCIe from its RTX cells; these
                  give the interval's width only and never enter the fit of the constants)
  seq_len, vocab_size, architecture, params, flags
                  no record lies outside these, so no held-out error exists: the largest
                  width our own records measured (the GPU-count one), stated as an assumption

A cell outside some dimensions D gets w = sqrt(w_in^2 + sum over D of (w_d^2 - w_in^2)):
out of one dimension, exactly that dimension's held-out width; out of several, their excess
over the in-range width adds in quadrature (errors of independent causes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from ..config import REPO_ROOT, ConfigError, parse_yaml
from ..platforms import Platform
from .model import Hardware, TrainCell, calibrated_constants, load_constants, step_time_s, terms

#: The interval file, relative to the repository root.
INTERVAL_FILE = Path("config") / "throughput" / "interval.yaml"
#: Share of held-out cells the interval is meant to hold (its widths are this quantile).
QUANTILE = 0.8
#: Dimensions a cell can lie outside of, and what a note calls each.
DIMENSIONS = {
    "platform": "platform",
    "gpus": "GPU count",
    "seq_len": "sequence length",
    "vocab_size": "vocabulary",
    "architecture": "model family",
    "params": "model size",
    "flags": "technique",
}
#: Dimensions no held-out split measures: their width is an assumption (module docstring).
ASSUMED = ("seq_len", "vocab_size", "architecture", "params", "flags")


@dataclass(kw_only=True, slots=True, frozen=True)
class Prediction:
    """Predicted tokens/s of a training cell with its interval and why it is as wide as it is."""

    value: float
    """Predicted tokens/s over all GPUs."""
    low: float
    """Low end of the interval (tokens/s)."""
    high: float
    """High end of the interval (tokens/s)."""
    step_time_s: float
    """Predicted seconds per optimizer step."""
    width: float
    """Half-width of the interval, ln(high / value)."""
    quantile: float
    """Share of held-out cells an interval this wide held."""
    outside: tuple[str, ...] = ()
    """Dimensions (DIMENSIONS) where the cell lies outside the calibration records."""
    notes: tuple[str, ...] = ()
    """One sentence per dimension outside, naming the value and what the records cover."""

    @property
    def step_time_high_s(self) -> float:
        """The slow end of the step time (the interval's low tokens/s)."""
        return self.step_time_s * math.exp(self.width)

    @property
    def step_time_low_s(self) -> float:
        """The fast end of the step time."""
        return self.step_time_s * math.exp(-self.width)


def log_errors(predicted, measured) -> np.ndarray:
    """|ln(predicted / measured)| of paired values."""
    return np.abs(np.log(np.asarray(predicted, float) / np.asarray(measured, float)))


def width_of(predicted, measured, quantile: float = QUANTILE) -> float:
    """The half-width that holds ``quantile`` of the cells: that quantile of |ln(pred/meas)|."""
    err = log_errors(predicted, measured)
    if not len(err):
        raise ValueError("no held-out cells to take a width from")
    return float(np.quantile(err, quantile))


def combine(widths: dict[str, float], outside) -> float:
    """The half-width of a cell outside the dimensions ``outside`` (module docstring)."""
    base = widths["in_range"]
    total = base**2 + sum(max(0.0, widths[d] ** 2 - base**2) for d in outside)
    return math.sqrt(total)


@cache
def load(root: Path = REPO_ROOT) -> dict:
    """config/throughput/interval.yaml, checked: ``covered`` and ``widths`` with a value and a
    source for every dimension (ConfigError naming the file and the key)."""
    path = root / INTERVAL_FILE
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for key in ("quantile", "covered", "widths"):
        if key not in (data or {}):
            raise ConfigError(f"{path}: missing key {key!r}; run `python -m llmbench.throughput interval --write`")
    needed = {"in_range", "gpus", "platform_nvlink", "platform_pcie", *ASSUMED}
    for name in sorted(needed):
        entry = data["widths"].get(name)
        if not isinstance(entry, dict) or "value" not in entry or not entry.get("source"):
            raise ConfigError(f"{path}: widths.{name} needs a value and a source")
    for name in ("platforms", "gpus", "seq_len", "vocab_size", "architecture", "params", "flags"):
        if name not in data["covered"]:
            raise ConfigError(f"{path}: covered.{name} is missing")
    return data


def _base_platform(name: str, root: Path) -> str:
    """The platform whose hardware a platform shares (the constants file's ``same_as``), else itself."""
    hw = load_constants(root)["hardware"]
    seen = name
    while isinstance(hw.get(seen), dict) and hw[seen].get("same_as"):
        seen = hw[seen]["same_as"]
    return seen


def link_kind(name: str, root: Path) -> str:
    """'nvlink' or 'pcie': the platform's link kind in the constants file (a platform it does
    not list is taken as PCIe, the wider width)."""
    hw = load_constants(root)["hardware"]
    base = _base_platform(name, root)
    link = (hw.get(base) or {}).get("link")
    if link is None:
        try:  # a platform file with NVLink between its GPUs
            interconnect = str(Platform.load(name, root).to_dict().get("interconnect") or "")
        except ConfigError:
            interconnect = ""
        link = "nvlink" if "nvlink" in interconnect.lower() else "pcie"
    return str(link)


def _within(value, bounds) -> bool:
    lo, hi = bounds
    return lo <= value <= hi


def outside(cell: TrainCell, covered: dict, root: Path = REPO_ROOT) -> dict[str, str]:
    """Dimension -> note, for each dimension where the cell lies outside ``covered``."""
    out = {}
    plats = set(covered["platforms"])
    if cell.platform not in plats and _base_platform(cell.platform, root) not in plats:
        out["platform"] = (f"platform {cell.platform} is not calibrated (records of {', '.join(sorted(plats))}): "
                           f"its {link_kind(cell.platform, root)} width applies")
    if not _within(cell.gpus, covered["gpus"]):
        lo, hi = covered["gpus"]
        out["gpus"] = f"{cell.gpus} GPUs is outside the {lo}-{hi} GPUs of the calibration records"
    elif (own := covered.get("gpus_by_backend", {}).get(cell.backend)) and cell.gpus > own[1]:
        # a backend's collectives follow its own volumes, which only its multi-GPU records test
        out["gpus"] = (f"{cell.gpus} GPUs is more than the {own[1]} of the {cell.backend} "
                       "calibration records")
    if not _within(cell.seq_len, covered["seq_len"]):
        lo, hi = covered["seq_len"]
        out["seq_len"] = f"sequence length {cell.seq_len} is outside the records' {lo}-{hi}"
    m = cell.model
    if not _within(m.vocab_size, covered["vocab_size"]):
        lo, hi = covered["vocab_size"]
        out["vocab_size"] = f"vocabulary {m.vocab_size} is outside the records' {lo}-{hi}"
    if m.family not in covered["architecture"]:  # the architecture and its RoPE scaling (ModelSpec.family)
        out["architecture"] = (f"model family {m.family} is not among the records' "
                               f"{', '.join(covered['architecture'])}")
    params_b = m.param_counts()["total"] / 1e9
    if not _within(round(params_b, 1), covered["params"]):
        lo, hi = covered["params"]
        out["params"] = f"{params_b:.1f}B parameters is outside the records' {lo}-{hi}B"
    flags = sorted(set(cell.technique.flags) - set(covered["flags"]))
    if cell.technique.adapter is not None and cell.technique.adapter not in covered.get("adapters", ["lora"]):
        flags.append(cell.technique.adapter)
    if flags:
        out["flags"] = f"technique {'+'.join(flags)} is not in the calibration records"
    return out


def predict(cell: TrainCell, constants: dict[str, float] | None = None, root: Path = REPO_ROOT,
            hw: Hardware | None = None) -> Prediction:
    """The cell's predicted tokens/s with its interval and notes (module docstring). Raises
    ConfigError where the model has no hardware entry for the platform."""
    constants = constants if constants is not None else calibrated_constants(root)
    data = load(root)
    step = step_time_s(cell, constants, root, hw)
    value = cell.tokens_per_step / step
    why = outside(cell, data["covered"], root)
    widths = {k: float(v["value"]) for k, v in data["widths"].items()}
    dims = [f"platform_{link_kind(cell.platform, root)}" if d == "platform" else d for d in why]
    w = combine(widths, dims)
    return Prediction(value=value, low=value * math.exp(-w), high=value * math.exp(w), step_time_s=step,
                      width=w, quantile=float(data["quantile"]), outside=tuple(why), notes=tuple(why.values()))


def anchored(at: TrainCell, measured_at: TrainCell, measured_tokens_per_s: float,
             constants: dict[str, float] | None = None, root: Path = REPO_ROOT) -> Prediction:
    """The cell ``at`` predicted from a measurement of the same cell at another batch (or GPU
    count): the measured tokens/s times the model's ratio between the two. The platform's and
    the software stack's level cancel in the ratio, so the interval is the in-range width
    whatever the platform (an assumption: no held-out split measures ratios); the notes of
    the dimensions the measurement does not cancel (sequence length, model, technique) stay."""
    constants = constants if constants is not None else calibrated_constants(root)
    data = load(root)
    target = predict(at, constants, root)
    base = predict(measured_at, constants, root)
    value = measured_tokens_per_s * target.value / base.value
    # never above the compute bound: the cell's FLOPs at the GEMM efficiency, nothing else
    parts = terms(at, constants, root)
    bound = at.tokens_per_step / (parts["gemm"] + parts["recompute"])
    capped = value > bound
    value = min(value, bound)
    widths = {k: float(v["value"]) for k, v in data["widths"].items()}
    keep = [d for d in target.outside if d not in ("platform", "gpus")]
    why = outside(at, data["covered"], root)
    w = combine(widths, keep)
    note = (f"scaled from {measured_tokens_per_s:,.0f} tokens/s measured at batch {measured_at.batch_size} on "
            f"{measured_at.gpus} GPUs by the model's ratio" + (", held to the compute bound" if capped else ""))
    return Prediction(value=value, low=value * math.exp(-w), high=value * math.exp(w),
                      step_time_s=at.tokens_per_step / value, width=w, quantile=float(data["quantile"]),
                      outside=tuple(keep), notes=(note, *(why[d] for d in keep)))


def covered_by(records: pd.DataFrame, root: Path = REPO_ROOT) -> dict:
    """What a set of calibration records covers, per dimension (ranges as [low, high])."""
    from ..models import ModelSpec
    from ..techniques import parse

    models = [ModelSpec.load(m, root) for m in sorted(records["model"].unique())]
    techs = [parse(t) for t in records["technique"].unique()]
    params = [round(m.param_counts()["total"] / 1e9, 1) for m in models]
    return {
        "platforms": sorted(records["platform"].unique()),
        "gpus": [int(records["gpus"].min()), int(records["gpus"].max())],
        "gpus_by_backend": ({str(b): [int(g.min()), int(g.max())] for b, g in records.groupby("backend")["gpus"]}
                            if "backend" in records.columns else {}),
        "seq_len": [int(records["seq_len"].min()), int(records["seq_len"].max())],
        "vocab_size": [min(m.vocab_size for m in models), max(m.vocab_size for m in models)],
        "architecture": sorted({m.family for m in models}),
        "params": [min(params), max(params)],
        "flags": sorted({f for t in techs for f in t.flags}),
        "adapters": sorted({t.adapter for t in techs if t.adapter is not None}),
    }
