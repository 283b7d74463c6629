"""The memory model against every training record (tables/memory-model.{csv,md}), with
DeepSpeed's and accelerate's estimators beside it where they apply.

- DeepSpeed: ``estimate_zero2_model_states_mem_needs`` (deepspeed.runtime.zero.stage_1_and_2)
  for full-parameter Z2 and Z2+O cells, ``estimate_zero3_model_states_mem_needs``
  (deepspeed.runtime.zero.stage3; largest layer: the embedding) for Z3 and Z3+O: the
  real functions, called with the cell's parameters and GPUs. Model states only.
- accelerate: ``estimate-memory``'s "Training using Adam" column, i.e. the largest value of
  ``accelerate.commands.estimate.estimate_training_usage(total_size, "bfloat16")`` with the
  total size from ``accelerate.utils.calculate_maximum_sizes`` on the model built on the
  meta device (``init_empty_weights``, as the command builds it), for full-parameter cells
  without ZeRO (accelerate's estimate knows no sharding, offload, 4-bit or adapters).

The figures (reported, not asserted): median |error| of ours (and theirs) over the ok GPU
rows with a measured peak; the share of oom rows predicted not to fit; the ok rows
predicted not to fit; each record at its technique family's margin
(llmbench.memory.constants.margin_for) unless one margin is given.
"""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from pathlib import Path

import pandas as pd

from .. import techniques
from ..cells import Search
from ..config import REPO_ROOT
from .constants import margin_for
from .fit import platform_file, rows
from .model import GIB, Workload, fits, host_memory_gib, machine_host_gib, predict

COLUMNS = ["platform", "accelerator", "stage", "model", "backend", "layout", "technique", "batch_size", "gpus", "seq_len", "run",
           "kind", "status", "measured_gib", "measured_reserved_gib", "measured_rss_gib", "predicted_gib",
           "predicted_reserved_gib", "predicted_phase", "predicted_host_gib", "capacity_gib", "family", "margin",
           "predicted_fits",
           "fit_reason", "error_pct",
           "deepspeed_gib", "deepspeed_host_gib", "deepspeed_fits", "deepspeed_error_pct", "accelerate_gib", "accelerate_fits",
           "accelerate_error_pct", "record_path"]


def deepspeed_estimate_gib(w: Workload) -> tuple[float, float] | None:
    """DeepSpeed's model-states estimate of a full-parameter ZeRO-2/3 cell, (per GPU, host
    per node) in GiB, or None."""
    tech = w.tech
    if w.backend != "deepspeed" or tech.adapter or tech.quant4 or tech.zero_stage not in (2, 3):
        return None
    counts = w.model.param_counts()
    n = counts["total"]
    if tech.zero_stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        cpu, gpu = estimate_zero2_model_states_mem_needs(n, num_gpus_per_node=w.gpus, num_nodes=1,
                                                         cpu_offload=tech.offload)
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        largest = max(counts["embedding"], counts["lm_head"])
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(n, largest, num_gpus_per_node=w.gpus, num_nodes=1,
                                                          cpu_offload=tech.offload, cpu_offload_params=tech.offload)
    return gpu / GIB, cpu / GIB


@cache
def _accelerate_total_bytes(model_json: str) -> int:
    """accelerate's total size of the model built on the meta device (fp32, as the command)."""
    import json

    from accelerate import init_empty_weights
    from accelerate.utils import calculate_maximum_sizes
    from transformers import LlamaForCausalLM

    from ..models import ModelSpec

    spec = ModelSpec.from_dict(json.loads(model_json))
    with init_empty_weights():
        model = LlamaForCausalLM(spec.hf_config())
    total, _ = calculate_maximum_sizes(model.float())
    return int(total)


def accelerate_estimate_gib(w: Workload) -> float | None:
    """accelerate estimate-memory's "Training using Adam" (bf16) of a full-parameter cell without
    ZeRO, or None."""
    import json

    tech = w.tech
    if w.backend != "deepspeed" or tech.adapter or tech.quant4 or tech.zero_stage:
        return None
    from accelerate.commands.estimate import estimate_training_usage

    usage = estimate_training_usage(_accelerate_total_bytes(json.dumps(w.model.to_dict(), sort_keys=True)),
                                    "bfloat16")
    return max(usage.values()) / GIB


def available() -> dict[str, bool]:
    """Which estimators this environment can call (the report rules' conda env has no torch,
    hence neither DeepSpeed nor accelerate: their columns are left empty there)."""
    from importlib.util import find_spec

    torch = find_spec("torch") is not None
    return {"deepspeed": torch and find_spec("deepspeed") is not None,
            "accelerate": torch and find_spec("accelerate") is not None and find_spec("transformers") is not None}


def _error(pred: float | None, measured: float | None) -> float | None:
    if pred is None or measured is None or pd.isna(measured) or not measured:
        return None
    return 100.0 * (pred - measured) / measured


def build(tidy: pd.DataFrame, root: Path = REPO_ROOT, margin: float | None = None,
          estimators: bool = True) -> pd.DataFrame:
    """One row per training record of the tidy table (cells and search probes), each at
    ``margin`` (None: its technique family's)."""
    have = available() if estimators else {"deepspeed": False, "accelerate": False}
    out = []
    for r, row in rows(tidy, root):
        w = row.workload
        plat = platform_file(row.platform, str(root)) or {}
        gpu = plat.get("accelerator") == "cuda"
        # as llmbench.memory.cells.check: a CPU cell's capacity is its RSS cap, against the tensors
        cap = plat.get("gpu_memory_gib") if gpu else row.mem_cap_gib
        pred = predict(w)
        m = margin_for(pred.family) if margin is None else margin
        host_cap = machine_host_gib(plat, r.get("host_mem_gib"))
        ok, why = fits(pred, cap, host_cap if gpu else None, min(w.gpus, plat.get("gpus_per_node") or 1), m)
        if not gpu and why:
            why = why.replace("GPU peak", "tensors' peak") + " (the cell's mem_cap_gib)"
        ds_both = deepspeed_estimate_gib(w) if have["deepspeed"] else None
        ds, ds_host = ds_both if ds_both else (None, None)
        ds_fits = None
        if ds is not None and cap:  # its host estimate counts where there is offload, as ours
            ds_fits = ds * (1 + m) <= cap and not (w.tech.offload and host_cap and ds_host * (1 + m) > host_cap)
        acc = accelerate_estimate_gib(w) if have["accelerate"] else None
        out.append({
            "platform": row.platform, "accelerator": plat.get("accelerator"), "stage": r["stage"], "model": r["model"], "backend": r["backend"],
            "layout": r.get("layout"), "technique": r["technique"], "batch_size": r["batch_size"], "gpus": r["gpus"],
            "seq_len": r["seq_len"], "run": r.get("run"), "kind": r.get("kind"), "status": row.status,
            "measured_gib": row.measured_gib, "measured_reserved_gib": row.reserved_gib,
            "measured_rss_gib": row.rss_gib, "predicted_gib": pred.gpu_gib,
            "predicted_reserved_gib": pred.reserved_gib, "predicted_phase": pred.phase,
            "predicted_host_gib": pred.host_gib, "capacity_gib": cap, "family": pred.family, "margin": m,
            "predicted_fits": ok if cap else None, "fit_reason": why,
            "error_pct": _error(pred.gpu_gib, row.measured_gib),
            "deepspeed_gib": ds, "deepspeed_host_gib": ds_host, "deepspeed_fits": ds_fits if gpu else None,
            "deepspeed_error_pct": _error(ds, row.measured_gib),
            "accelerate_gib": acc,
            "accelerate_fits": (acc * (1 + m) <= cap) if acc is not None and cap and gpu else None,
            "accelerate_error_pct": _error(acc, row.measured_gib), "record_path": r["record_path"],
        })
    return pd.DataFrame(out, columns=COLUMNS)


def figures(df: pd.DataFrame) -> pd.DataFrame:
    """The validation figures of ours, DeepSpeed's and accelerate's estimators: over the GPU
    rows where each applies, median |error| of the ok rows with a measured peak, oom rows
    predicted not to fit (of all oom rows it applies to) and ok rows predicted not to fit;
    ``margin``: the one margin the rows were built with, or ``per family``."""
    margins = set(df["margin"].dropna()) if "margin" in df else set()
    margin = f"{next(iter(margins)):g}" if len(margins) == 1 else "per family"
    gpu = df[(df["accelerator"] == "cuda") & df["capacity_gib"].notna()]
    out = []
    for name, pred, fit_col, err in (("llmbench", "predicted_gib", "predicted_fits", "error_pct"),
                                     ("deepspeed", "deepspeed_gib", "deepspeed_fits", "deepspeed_error_pct"),
                                     ("accelerate", "accelerate_gib", "accelerate_fits", "accelerate_error_pct")):
        mine = gpu[gpu[pred].notna()]
        ok, oom = mine[mine["status"] == "ok"], mine[mine["status"] == "oom"]
        errs = ok[err].dropna().abs()
        out.append({
            "estimator": name, "margin": margin, "rows": len(mine), "ok_measured": len(errs),
            "median_abs_error_pct": float(errs.median()) if len(errs) else None,
            "p90_abs_error_pct": float(errs.quantile(0.9)) if len(errs) else None,
            "oom_rows": len(oom), "oom_predicted_not_to_fit": int((oom[fit_col] == False).sum()),  # noqa: E712
            "oom_recall": float((oom[fit_col] == False).mean()) if len(oom) else None,  # noqa: E712
            "ok_rows": len(ok), "ok_predicted_not_to_fit": int((ok[fit_col] == False).sum()),  # noqa: E712
        })
    return pd.DataFrame(out)


#: a record "near the limit" has at least this share of its GPU reserved
NEAR_LIMIT = 0.85
#: a search's "tight" at its default headroom: a probe with more than this share reserved
TIGHT = 1 - next(f.default for f in fields(Search) if f.name == "headroom")


def near_limit(df: pd.DataFrame, share: float = NEAR_LIMIT) -> pd.DataFrame:
    """Where a fit is decided: the ok GPU records that held at least ``share`` of their GPU
    reserved, and how close the predicted reserved peak came to the measured one (median and
    90th percentile of |error|, and the median signed error: its bias), then the ok records
    predicted not to fit (those on the margin's far side) with the lowest and highest share of
    their GPU reserved, how many held more than TIGHT, and how many were a search's probes.
    One row per group; errors in percent of the measured reserved peak."""
    gpu = df[(df["accelerator"] == "cuda") & df["capacity_gib"].notna() & (df["status"] == "ok")]
    gpu = gpu[gpu["measured_reserved_gib"].notna() & gpu["predicted_reserved_gib"].notna()]
    gpu = gpu.assign(held=gpu["measured_reserved_gib"] / gpu["capacity_gib"])
    near = gpu[gpu["held"] >= share]
    far = gpu[gpu["predicted_fits"] == False]  # noqa: E712
    err = (near["predicted_reserved_gib"] - near["measured_reserved_gib"]) / near["measured_reserved_gib"] * 100

    def q(x: pd.Series, how: str) -> float | None:
        return None if x.empty else float(x.quantile(0.9) if how == "p90" else getattr(x, how)())

    def group(name: str, rows: pd.DataFrame, err: pd.Series) -> dict:
        return {"group": name, "rows": len(rows), "median_abs_error_pct": q(err.abs(), "median"),
                "p90_abs_error_pct": q(err.abs(), "p90"), "median_signed_error_pct": q(err, "median"),
                "min_reserved_share": q(rows["held"], "min"), "max_reserved_share": q(rows["held"], "max"),
                "above_tight": int((rows["held"] > TIGHT).sum()), "probes": int((rows["kind"] == "probe").sum())}

    return pd.DataFrame([group(f"ok, >= {share:.0%} reserved", near, err),
                         group("ok, predicted not to fit", far, pd.Series(dtype=float))])


#: the paper's tables whose cells say ok or '-' (out of memory) per method and platform
PAPER_TABLES = ("table3", "table4", "table9")


def paper_check(paths: list[str | Path], root: Path = REPO_ROOT, margin: float | None = None) -> pd.DataFrame:
    """The model against the paper's own statuses (config/reference/table3, table4, table9:
    ok or '-'), each cell on its platform file's GPUs per node at the paper's batch (1 where
    the paper gives none), LoRA rank 64 on every decoder linear for Table IX."""
    from ..models import ModelSpec

    lora = {"kind": "lora", "rank": 64, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]}
    out = []
    for path in paths:
        for r in pd.read_csv(path).itertuples():
            if r.status not in ("ok", "oom"):
                continue
            plat = platform_file(r.platform, str(root))
            if plat is None:
                continue
            tech = techniques.canonical(r.method)
            g = plat["gpus_per_node"]
            w = Workload(model=ModelSpec.load(r.model, root), technique=tech, seq_len=350, gpus=g,
                         batch_size=1 if pd.isna(r.batch_size) else int(r.batch_size),
                         adapter=lora if techniques.parse(tech).adapter else None)
            pred = predict(w)
            ok, why = fits(pred, plat["gpu_memory_gib"], host_memory_gib(plat), g, margin)
            out.append({"table": r.table, "platform": r.platform, "model": r.model, "technique": tech,
                        "batch_size": w.batch_size, "gpus": g, "paper_status": r.status,
                        "paper_mem_gb": r.mem_gb, "predicted_gib": pred.gpu_gib, "predicted_host_gib": pred.host_gib,
                        "predicted_fits": ok, "fit_reason": why})
    return pd.DataFrame(out)
