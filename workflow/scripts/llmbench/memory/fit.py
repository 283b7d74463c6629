"""Fit the memory model's per-backend constants to committed records.

    python -m llmbench.memory fit [results/reference/combined/tables/records.csv]

From the tidy table's ok GPU training rows (with their records' specs):

- ``logits_bytes`` (both backends): least squares of ``measured - states_fb - buckets -
  layer inputs = logits_bytes·V·tokens + c`` over the DeepSpeed rows with recomputation
  (R) whose peak is in the forward/backward phase: there the decoder keeps only its layer
  inputs, known exactly. (Without R the logits and the activations both grow with tokens
  alone, at one sequence length and vocabulary in every record: they cannot be told apart.)
  Megatron-LM has no R rows and takes the same value;
- ``RECOMPUTED_LAYER_PEAK``: the median of what the R rows hold beyond states, buckets,
  layer inputs and overhead, over the layer's saved activations, among the rows where that
  exceeds their logits by more than 5% (the recomputed layer's backward sets their peak;
  ZeRO-3 rows left out: their gathered parameters come on top). Step 1 leaves these rows
  out (their peak is not the logits');
- ``overhead_gib`` per backend: the median of what the rows of models under 1e8
  parameters (the tiny model: its states and activations are a few MiB) leave over
  states, buckets and logits (0 for a backend without such rows);
- ``act_scale`` per backend: least squares through the origin of ``measured - states_fb -
  buckets - logits - LoRA's dropout copies - overhead = act_scale·A`` over the other rows without recomputation,
  torch.compile or offload whose predicted peak is in the forward/backward phase (A:
  Korthikanti et al.'s activations at scale 1). The phase is decided with the constants in
  llmbench.memory.constants, so a fit that moved a row across phases is rerun after the
  constants are updated;
- ``COMPILED_ACT_SCALE``: the mean ratio of the activations the C rows leave to eager's;
- ``ZERO3_ACT_SCALE``: the same for the DeepSpeed ZeRO-3 rows without recomputation whose
  predicted peak is in the forward/backward phase, adapters' and full-parameter ones (left out
  of ``act_scale``'s rows; the tiny model's too: its activations are a few MiB);
- ``QUANT4_ACT_SCALE``: the same for the 4-bit full-parameter rows (Q) without recomputation
  whose predicted peak is in the forward/backward phase (left out of ``act_scale``'s rows);
- ``FSDP2_FULL_ACT_SCALE``: the same for FSDP2's full-parameter rows (no adapter) without
  recomputation or compile whose predicted peak is in the forward/backward phase;
  ``FSDP2_COMPILED_ACT_SCALE`` for those with compiled layers (C) in bf16, and
  ``FP8_ACT_SCALE`` for the FP8 ones (over the same cell in bf16);
- ``ZERO3_RECOMPUTED_ADAPTER_SCALE``: the adapter rows under ZeRO-3 with recomputation whose
  peak the recomputed layer sets (as for ``RECOMPUTED_LAYER_PEAK``): the median of what
  they hold beyond states, buckets, layer inputs and overhead over the layer's activations
  times ``RECOMPUTED_LAYER_PEAK``;
- ``CACHED_LOGITS_BYTES`` and ``CACHED_ACTIVATION_FRACTION``: least squares through the
  origin of reserved - allocated = a·V·tokens + b·saved activations over the DeepSpeed rows
  whose peak is in the forward/backward phase and at least ``CACHED_FIT_LOAD`` of the GPU
  (there the slack decides what fits), full-parameter 4-bit rows left out (they keep their
  load-time reservation as well), and ZeRO-3's (its gathered parameters come and go through
  the same cache: see ``CACHED_LOGITS_BYTES``);
- ``host_base_gib``: the median host RSS of the rows without offload; the offload rows'
  host bytes per sharded parameter come with them (``offload_host_bytes``), and their GPU
  bytes per sharded parameter (``offload_fb_bytes``) beside the accounting's value, both
  from full-parameter rows; the adapter rows with a bf16 base give the host bytes of a
  frozen parameter under ZeRO-3 + O (``offload_frozen_host_bytes``).

The results are printed; llmbench.memory.constants holds them (rounded) with this as their
source. ``fit_from_scratch`` starts from the unfitted values (``UNFITTED``) and refits until
the constants settle, whatever constants are in force: the held-out validation
(llmbench.memory.heldout) fits each part of the records that way (``applied`` sets a fit's
constants for the model while it predicts).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import REPO_ROOT, ConfigError
from ..models import ModelSpec
from ..platforms import Platform
from ..spec import RunSpec
from .constants import (ACTIVATIONS_OF, BACKENDS, COMPILED_ACT_SCALE, DEEPSPEED, FP8_ACT_SCALE,
                        FSDP2_COMPILED_ACT_SCALE, FSDP2_FULL_ACT_SCALE,
                        QUANT4_ACT_SCALE, RECOMPUTED_LAYER_PEAK, ZERO3_ACT_SCALE, ZERO3_RECOMPUTED_ADAPTER_SCALE)
from .model import (GIB, Workload, activation_bytes, adapter_dropout_bytes, adapter_params,
                    beside_activations_bytes, buffer_bytes, layer_activation_bytes, modelled, offload_cached_bytes,
                    predict, quant4_full_parameter, state_bytes)

TRAIN_STAGES = ("pretrain", "finetune")
#: The rows the allocator's slack is fitted on: an allocated peak at least this share of
#: the GPU (where the slack decides what fits, and the allocator has had to reuse blocks).
CACHED_FIT_LOAD = 0.6


@cache
def platform_file(name: str, root: str) -> dict[str, Any] | None:
    """A platform's file as a dict (None where there is none), read once per run."""
    try:
        return Platform.load(name, Path(root)).to_dict()
    except ConfigError:
        return None


@dataclass(frozen=True, slots=True)
class Row:
    """One training record: what the model needs and what was measured."""

    workload: Workload
    status: str
    measured_gib: float | None
    """Peak GPU memory allocated (None on a CPU or where not measured)."""
    reserved_gib: float | None
    """Peak GPU memory reserved by the caching allocator (None where not measured)."""
    rss_gib: float | None
    platform: str
    mem_cap_gib: float | None = None
    """The cell's per-rank RSS cap (CPU cells), or None."""
    started: str | None = None
    """When the record's run started (its provenance, ISO 8601), or None (a probe answered
    from a search's frontier file ran nothing)."""
    run: str | None = None
    """The reference run the record belongs to (the tidy table's ``run``), or None."""


def record_spec(path: Path, root: Path = REPO_ROOT) -> RunSpec:
    """A training record's run spec, parsed: its provenance's, or (a probe answered from the
    search's frontier file, which ran nothing) rebuilt from its cell, config/models and
    config/platforms as the grid builds a spec."""
    rec = json.loads(path.read_text())
    spec = (rec.get("provenance") or {}).get("spec")
    if spec and "model" in spec:
        return RunSpec.parse(spec)
    cell = rec["cell"]
    platform = {k: v for k, v in Platform.load(cell["platform"], root).to_dict().items() if k != "slurm"}
    return RunSpec.parse({"cell": cell, "platform": platform, "model": ModelSpec.load(cell["model"], root).to_dict()})


def rows(tidy: pd.DataFrame, root: Path = REPO_ROOT) -> list[tuple[pd.Series, Row]]:
    """The tidy table's training rows (cells and probes) of the backends the model predicts
    (model.modelled: not FSDP2's with CPU offload), with their workloads."""
    out = []
    for _, r in tidy[tidy["stage"].isin(TRAIN_STAGES) & tidy["backend"].isin(list(BACKENDS))].iterrows():
        if not modelled(r["backend"], r["technique"]):
            continue
        path = Path(r["record_path"])
        full = path if path.is_absolute() else root / path
        if holds_whole_nf4_base(full):
            continue
        spec = record_spec(full, root)
        measured, reserved = r["peak_mem_allocated_gib"], r.get("peak_mem_reserved_gib")
        rss = r["peak_rss_gib"]
        out.append((r, Row(workload=Workload.from_spec(spec), status=r["status"],
                           measured_gib=None if pd.isna(measured) else float(measured),
                           reserved_gib=None if reserved is None or pd.isna(reserved) else float(reserved),
                           rss_gib=None if pd.isna(rss) else float(rss), platform=r["platform"],
                           mem_cap_gib=spec.cell.mem_cap_gib, started=_started(full),
                           run=None if pd.isna(r.get("run")) else str(r.get("run")))))
    return out


def holds_whole_nf4_base(path: Path) -> bool:
    """Whether an FSDP2 QLoRA record was made by the worker that kept each rank's rows of an NF4
    weight as a view of the whole quantised weight, so that every rank held the whole 4-bit base
    (llmbench.train.fsdp2_worker.materialise_nf4, fixed since): its fsdp2_config.nf4 has no
    storage_bytes, or they exceed local_bytes. The model predicts the sharded base, so such
    records enter neither its fit nor its scores (the run's README says by how much they hold
    more)."""
    rec = json.loads(path.read_text())
    nf4 = ((rec.get("provenance") or {}).get("fsdp2_config") or {}).get("nf4")
    if not nf4 or (rec.get("cell") or {}).get("backend") != "fsdp2":
        return False
    return "storage_bytes" not in nf4 or nf4["storage_bytes"] > nf4.get("local_bytes", 0)


def _started(path: Path) -> str | None:
    """A record's start time from its provenance (None where it has none)."""
    return (json.loads(path.read_text()).get("provenance") or {}).get("started")


def fit(tidy: pd.DataFrame, root: Path = REPO_ROOT) -> dict[str, Any]:
    """The fitted constants (see the module docstring) from a tidy table."""
    return fit_rows([row for _, row in rows(tidy, root)], root)


def fit_rows(training: list[Row], root: Path = REPO_ROOT) -> dict[str, Any]:
    """The fitted constants from training rows (``rows``' second items), each step with the
    constants in force (llmbench.memory.constants, or those ``applied`` sets). A constant
    without rows to fit it is None (per backend: the backend is left out)."""
    ok = [row for row in training if row.status == "ok" and row.measured_gib is not None]
    out: dict[str, Any] = {}
    logits_bytes = BACKENDS["deepspeed"].logits_bytes
    # 1. logits_bytes from the recomputation rows: there the decoder keeps only its layer
    #    inputs (known exactly) and the logits are the rest of what grows with the batch
    xs, ys = [], []
    for r in ok:
        w, tech = r.workload, r.workload.tech
        if not tech.recompute or tech.offload or w.backend != "deepspeed":
            continue
        acts, layer, logits = activation_bytes(w)
        beside = beside_activations_bytes(w, logits, layer, buffer_bytes(w))
        if layer + buffer_bytes(w) > logits or predict(w).phase != "forward-backward":
            continue
        xs.append([logits / BACKENDS[w.backend].logits_bytes / GIB, 1.0])
        # what the logits' peak holds beyond them: the buckets, where they are there
        ys.append(r.measured_gib - (state_bytes(w)[0] + beside - logits + acts) / GIB)
    if len(xs) >= 2:
        (logits_bytes, _), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
        out["logits_bytes"] = float(logits_bytes)
        out["logits_rows"] = len(xs)
    # 1b. a recomputed layer's backward peak over what it saves, from the rows whose peak it
    #     sets: what they hold beyond states, buckets, layer inputs and overhead exceeds
    #     their logits by more than 5% (ZeRO-3's gathered parameters left out)
    # 1c. an adapter's recomputed layer under ZeRO-3 (offload or not): the same measure, as
    #     a scale of the layer's activations (beside which 1b's rows leave
    #     RECOMPUTED_LAYER_PEAK)
    peaks, zero3_layer = [], []
    for r in ok:
        w, tech = r.workload, r.workload.tech
        if (not tech.recompute or tech.compiled or w.backend != "deepspeed"
                or predict(w).phase != "forward-backward"):
            continue
        acts, layer, logits = activation_bytes(w)
        rest = r.measured_gib * GIB - state_bytes(w)[0] - buffer_bytes(w) - acts \
            - BACKENDS[w.backend].overhead_gib * GIB
        if rest <= 1.05 * logits:
            continue
        if tech.adapter is not None and tech.zero_stage == 3:
            zero3_layer.append(rest / (layer / ZERO3_RECOMPUTED_ADAPTER_SCALE))
        elif not tech.offload and tech.zero_stage != 3:
            peaks.append(rest / (layer / RECOMPUTED_LAYER_PEAK))
    out["recomputed_layer_peak"] = float(np.median(peaks)) if peaks else None
    out["recomputed_layer_rows"] = len(peaks)
    out["zero3_recomputed_adapter_scale"] = float(np.median(zero3_layer)) if zero3_layer else None
    out["zero3_recomputed_adapter_rows"] = len(zero3_layer)
    # 2. overhead per backend: what the smallest models' rows (under 1e8 parameters: their
    #    states and activations are a few MiB) leave over states, buckets and logits; 0
    #    where the backend has none. 3. act_scale: least squares through the origin of what
    #    the larger rows leave over states, buckets, logits and overhead (the activations
    #    and the logits grow together with the tokens: see 1.)
    for backend in BACKENDS:
        if backend in ACTIVATIONS_OF:  # another backend's activations (constants.ACTIVATIONS_OF)
            continue
        mine = [r for r in ok if r.workload.backend == backend]
        small, plain, xs, ys = [], [], [], []
        for r in mine:
            tech, w = r.workload.tech, r.workload
            # ZeRO-3 rows by their stage, not by their scale: a fit from scratch starts it at 1
            if (tech.recompute or tech.compiled or tech.offload or tech.zero_stage == 3
                    or quant4_full_parameter(tech) or predict(w).phase != "forward-backward"):
                continue
            tp = int((w.parallel or {}).get("tensor_parallel", 1))
            tokens = w.batch_size * w.seq_len
            acts = tokens * w.model.num_hidden_layers * layer_activation_bytes(w.model, w.seq_len, tech.flash, tp)
            logits = logits_bytes * tokens * w.model.vocab_size / tp
            rest = r.measured_gib - (state_bytes(w)[0] + beside_activations_bytes(w, logits, 0.0, buffer_bytes(w))
                                     + tokens * w.model.num_hidden_layers
                                     * adapter_dropout_bytes(w.model, w.adapter)) / GIB
            if w.model.param_counts()["total"] < 1e8:
                small.append(rest)
            else:
                xs.append(acts / GIB)
                ys.append(rest)
                plain.append(r)
        if not xs:
            continue
        overhead = float(np.median(small)) if small else 0.0
        x, y = np.array(xs), np.array(ys) - overhead
        scale = float(x @ y / (x @ x))
        base = [r.rss_gib for r in mine if r.rss_gib is not None and not r.workload.tech.offload]
        out[backend] = {"act_scale": scale, "overhead_gib": overhead,
                        "host_base_gib": float(np.median(base)) if base else None, "rows": len(mine),
                        "rows_fitted": len(plain), "rows_overhead": len(small)}
    # 4. the allocator's cached blocks near the GPU's limit: least squares (through the
    #    origin) of reserved - allocated over the loss's elements (V·tokens) and the saved
    #    activations, ZeRO-3 left out
    xs, ys = [], []
    for r in ok:
        tech, w = r.workload.tech, r.workload
        capacity = (platform_file(r.platform, str(root)) or {}).get("gpu_memory_gib")
        if (w.backend != "deepspeed" or r.reserved_gib is None or not capacity
                or r.measured_gib < CACHED_FIT_LOAD * capacity or (tech.quant4 and tech.adapter is None)
                or tech.zero_stage == 3 or predict(w).phase != "forward-backward"):
            continue
        xs.append([w.batch_size * w.seq_len * w.model.vocab_size / GIB, predict(w).terms["activations"]])
        ys.append(r.reserved_gib - r.measured_gib - offload_cached_bytes(w) / GIB)
    if len(xs) >= 2:
        (per_element, fraction), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
        out["cached_logits_bytes"], out["cached_activation_fraction"] = float(per_element), float(fraction)
    else:
        out["cached_logits_bytes"] = out["cached_activation_fraction"] = None
    out["cached_rows"] = len(xs)
    compiled, zero3, quant4, fsdp2, fsdp2_compiled, fp8 = [], [], [], [], [], []
    off_fb, off_host, off_frozen = {}, {}, {}
    for r in ok:
        tech, w = r.workload.tech, r.workload
        if w.backend not in ("deepspeed", "fsdp2"):
            continue
        k = BACKENDS[w.backend]
        acts, layer, logits = activation_bytes(w)
        rest = (beside_activations_bytes(w, logits, layer, buffer_bytes(w)) + k.overhead_gib * GIB) / GIB
        # what the row leaves for its activations over what the model gives them: times the
        # stated scale, the scale the row needs
        left = (r.measured_gib - state_bytes(w)[0] / GIB - rest) * GIB / acts
        if w.backend == "fsdp2":  # a full-parameter FSDP2 row whose forward/backward pass sets the peak
            if tech.adapter is None and not tech.recompute and predict(w).phase == "forward-backward":
                if tech.fp8:
                    fp8.append(left * FP8_ACT_SCALE)
                elif tech.compiled:
                    fsdp2_compiled.append(left * FSDP2_COMPILED_ACT_SCALE)
                else:
                    fsdp2.append(left * FSDP2_FULL_ACT_SCALE)
            continue
        if tech.compiled and not tech.recompute:
            compiled.append(left * COMPILED_ACT_SCALE)
        if (tech.zero_stage == 3 and not tech.recompute and not tech.compiled
                and predict(w).phase == "forward-backward" and w.model.param_counts()["total"] >= 1e8):
            zero3.append(left * ZERO3_ACT_SCALE)
        if quant4_full_parameter(tech) and predict(w).phase == "forward-backward":
            quant4.append(left * QUANT4_ACT_SCALE)
        if not tech.offload or tech.quant4:
            continue
        row = DEEPSPEED[(tech.zero_stage, True)]
        if tech.adapter is not None:
            # a frozen bf16 base on the host (Z3+O): what the RSS holds beyond the trainable
            # parameters' host bytes, per frozen parameter of the rank's shard
            trainable, frozen_extra = adapter_params(w.model, w.adapter)
            if row.frozen_host and r.rss_gib is not None:
                frozen = (w.model.param_counts()["total"] + frozen_extra) / w.gpus
                host = (r.rss_gib - BACKENDS[w.backend].host_base_gib) * GIB - row.host.per_rank(trainable, w.gpus)
                off_frozen.setdefault(f"Z{tech.zero_stage}+O", []).append(host / frozen)
        else:
            # full-parameter rows: the row's bytes are per trained parameter
            n = w.model.param_counts()["total"]
            per_rank = n / w.gpus
            gpu = (r.measured_gib * GIB - row.fb.full * n - acts - rest * GIB) / per_rank
            off_fb.setdefault(f"Z{tech.zero_stage}+O", []).append(gpu)
            if r.rss_gib is not None:
                host = (r.rss_gib - BACKENDS[w.backend].host_base_gib) * GIB / per_rank
                off_host.setdefault(f"Z{tech.zero_stage}+O", []).append(host)
    out["compiled_act_scale"] = float(np.mean(compiled)) if compiled else None
    out["zero3_act_scale"] = float(np.mean(zero3)) if zero3 else None
    out["zero3_rows"] = len(zero3)
    out["quant4_act_scale"] = float(np.mean(quant4)) if quant4 else None
    out["quant4_rows"] = len(quant4)
    out["fsdp2_full_act_scale"] = float(np.mean(fsdp2)) if fsdp2 else None
    out["fsdp2_full_rows"] = len(fsdp2)
    out["fsdp2_compiled_act_scale"] = float(np.mean(fsdp2_compiled)) if fsdp2_compiled else None
    out["fsdp2_compiled_rows"] = len(fsdp2_compiled)
    out["fp8_act_scale"] = float(np.mean(fp8)) if fp8 else None
    out["fp8_rows"] = len(fp8)
    out["offload_fb_bytes"] = {k: float(np.mean(v)) for k, v in off_fb.items()}
    out["offload_host_bytes"] = {k: float(np.mean(v)) for k, v in off_host.items()}
    out["offload_frozen_host_bytes"] = {k: float(np.mean(v)) for k, v in off_frozen.items()}
    return out


def main(tidy_csv: str | Path = "results/reference/combined/tables/records.csv") -> int:
    """Print the fit of ``tidy_csv`` as JSON."""
    print(json.dumps(fit(pd.read_csv(tidy_csv)), indent=2))
    return 0


#: Each fitted constant without a fit: the accounting's value where there is one, else no
#: correction (a scale of 1, an extra of 0). ``fit_from_scratch`` starts here, and a held-out
#: fit (llmbench.memory.heldout) keeps it for a constant none of its training rows can fit (a
#: family it has never seen keeps no correction of its own).
UNFITTED: dict[str, Any] = {
    "logits_bytes": 10.0,  # bf16 logits 2 + their fp32 upcast 4 + the loss's fp32 gradient 4
    "recomputed_layer_peak": 1.0, "zero3_recomputed_adapter_scale": 1.0,
    "deepspeed": {"act_scale": 1.0, "overhead_gib": 0.0, "host_base_gib": 0.0},
    "megatron": {"act_scale": 1.0, "overhead_gib": 0.0, "host_base_gib": 0.0},
    "cached_logits_bytes": 0.0, "cached_activation_fraction": 0.0,
    "compiled_act_scale": 1.0, "zero3_act_scale": 1.0, "quant4_act_scale": 1.0, "fsdp2_full_act_scale": 1.0,
    "fsdp2_compiled_act_scale": 1.0, "fp8_act_scale": 1.0,
    # bf16 gradient partition on the GPU; fp32 master, Adam and fp32 gradients on the host
    # (16), plus the bf16 parameter partition under ZeRO-3's offload_param; a frozen bf16 base
    "offload_fb_bytes": {"Z2+O": 2.0, "Z3+O": 2.0},
    "offload_host_bytes": {"Z2+O": 16.0, "Z3+O": 18.0},
    "offload_frozen_host_bytes": {"Z3+O": 2.0},
}


def stated() -> dict[str, Any]:
    """The constants in force (llmbench.memory.constants, or those ``applied`` sets), in the
    form ``fit_rows`` returns them."""
    from . import constants as C

    ds = C.DEEPSPEED
    return {
        "logits_bytes": C.BACKENDS["deepspeed"].logits_bytes, "recomputed_layer_peak": C.RECOMPUTED_LAYER_PEAK,
        "zero3_recomputed_adapter_scale": C.ZERO3_RECOMPUTED_ADAPTER_SCALE,
        **{b: {"act_scale": k.act_scale, "overhead_gib": k.overhead_gib, "host_base_gib": k.host_base_gib}
           for b, k in C.BACKENDS.items()},
        "cached_logits_bytes": C.CACHED_LOGITS_BYTES, "cached_activation_fraction": C.CACHED_ACTIVATION_FRACTION,
        "compiled_act_scale": C.COMPILED_ACT_SCALE, "zero3_act_scale": C.ZERO3_ACT_SCALE,
        "quant4_act_scale": C.QUANT4_ACT_SCALE, "fsdp2_full_act_scale": C.FSDP2_FULL_ACT_SCALE,
        "fsdp2_compiled_act_scale": C.FSDP2_COMPILED_ACT_SCALE, "fp8_act_scale": C.FP8_ACT_SCALE,
        "offload_fb_bytes": {f"Z{z}+O": ds[(z, True)].fb.sharded for z in (2, 3)},
        "offload_host_bytes": {f"Z{z}+O": ds[(z, True)].host.sharded for z in (2, 3)},
        "offload_frozen_host_bytes": {"Z3+O": ds[(3, True)].frozen_host},
    }


def merged(base: dict[str, Any], fitted: dict[str, Any]) -> dict[str, Any]:
    """``base`` (``stated``'s form) with every constant ``fitted`` holds a value for; the
    rest (None, or left out) as in ``base``."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for key, value in fitted.items():
        if key not in out or value is None:
            continue
        if isinstance(out[key], dict):
            out[key].update({k: v for k, v in value.items() if k in out[key] and v is not None})
        else:
            out[key] = float(value)
    return out


@contextmanager
def applied(values: dict[str, Any]) -> Iterator[None]:
    """The model with ``values`` (``stated``'s form) as its fitted constants inside the block,
    restored after it. It rebinds the names llmbench.memory.constants, .model and .fit hold,
    so it is for one thread: the held-out scoring and the fit from scratch."""
    from dataclasses import replace

    from . import constants as C, model as M

    v = merged(stated(), values)
    ds = dict(C.DEEPSPEED)
    for z in (2, 3):
        row = ds[(z, True)]
        fb = replace(row.fb, sharded=v["offload_fb_bytes"][f"Z{z}+O"])
        ds[(z, True)] = replace(row, fb=fb, step=replace(row.step, sharded=fb.sharded),
                                host=replace(row.host, sharded=v["offload_host_bytes"][f"Z{z}+O"]),
                                frozen_host=v["offload_frozen_host_bytes"]["Z3+O"] if z == 3 else row.frozen_host)
    for b, of in C.ACTIVATIONS_OF.items():
        v[b] = {**v[b], "act_scale": v[of]["act_scale"]}
    names = {
        "BACKENDS": {b: C.BackendConstants(act_scale=v[b]["act_scale"], logits_bytes=v["logits_bytes"],
                                           overhead_gib=v[b]["overhead_gib"], host_base_gib=v[b]["host_base_gib"])
                     for b in C.BACKENDS},
        "LOGITS_BYTES": v["logits_bytes"], "RECOMPUTED_LAYER_PEAK": v["recomputed_layer_peak"],
        "ZERO3_RECOMPUTED_ADAPTER_SCALE": v["zero3_recomputed_adapter_scale"],
        "CACHED_LOGITS_BYTES": v["cached_logits_bytes"], "CACHED_ACTIVATION_FRACTION": v["cached_activation_fraction"],
        "COMPILED_ACT_SCALE": v["compiled_act_scale"], "ZERO3_ACT_SCALE": v["zero3_act_scale"],
        "QUANT4_ACT_SCALE": v["quant4_act_scale"], "FSDP2_FULL_ACT_SCALE": v["fsdp2_full_act_scale"],
        "FSDP2_COMPILED_ACT_SCALE": v["fsdp2_compiled_act_scale"], "FP8_ACT_SCALE": v["fp8_act_scale"],
        "DEEPSPEED": ds,
    }
    modules = [C, M, sys.modules[__name__]]
    saved = [(m, n, getattr(m, n)) for m in modules for n in names if hasattr(m, n)]
    try:
        for m, n, _ in saved:
            setattr(m, n, names[n])
        yield
    finally:
        for m, n, old in saved:
            setattr(m, n, old)


#: How many passes ``fit_from_scratch`` makes at most: the rows each step selects depend on
#: the phase and the terms the constants give, so a pass's constants move the next one's rows.
PASSES = 6


def fit_from_scratch(training: list[Row], root: Path = REPO_ROOT, start: dict[str, Any] | None = None,
                     passes: int = PASSES) -> dict[str, Any]:
    """The constants (``stated``'s form) fitted to ``training`` from ``start`` (default
    ``UNFITTED``), refitted with each pass's constants until a pass changes none by more than
    1e-6 (at most ``passes``). Constants without rows keep ``start``'s value. Depends on the
    rows alone, not on the constants in force."""
    values = merged(UNFITTED, {}) if start is None else merged(UNFITTED, start)
    for _ in range(passes):
        with applied(values):
            nxt = merged(values, fit_rows(training, root))
        if _close(nxt, values):
            return nxt
        values = nxt
    return values


def _close(a: dict[str, Any], b: dict[str, Any], tol: float = 1e-6) -> bool:
    for k, v in a.items():
        if isinstance(v, dict):
            if not _close(v, b[k], tol):
                return False
        elif abs(v - b[k]) > tol * max(1.0, abs(v)):
            return False
    return True
