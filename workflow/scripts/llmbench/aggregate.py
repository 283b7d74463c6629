"""Aggregation: how a cell's repeats ended (Outcome) -> its Record, and the provenance every
runner's record carries (training, profile, microbenchmark cells).

The launcher (llmbench.launch) produces Outcomes and knows nothing of metrics; the record
builders here and in llmbench.profile.results read Outcomes and know nothing of processes,
so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from . import provenance
from .models import MFU_FORMULA, flops_per_token
from .profile.kernels import COLUMNS as KERNEL_COLUMNS
from .protocol import summarize
from .record import Metrics, Record
from .spec import RunSpec, raw_of


@dataclass(kw_only=True, slots=True)
class Outcome:
    """How one repeat ended."""

    status: str
    reason: str = ""
    result: dict | None = None
    log_tail: str = ""
    launcher: str = "not started"
    nodes: tuple[str, ...] = ()
    """The hostnames of a repeat over several nodes (llmbench.nodes), first node first."""


def largest(values: list[Any]) -> float | None:
    """The largest of the values (None left out); None where there is none."""
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def provenance_of(spec: RunSpec | dict, outcomes: list[Outcome], started: str, command: list[str]) -> dict[str, Any]:
    """A cell's provenance (training, profile, microbenchmark and serving cells): the last ok
    repeat's versions and devices (this process's versions where no repeat reported them),
    and how each repeat was started (exec, forked from llmbench.forkserver, srun over nodes,
    an engine server). The spec is kept as written (its JSON form)."""
    results = [o.result for o in outcomes if o.status == "ok" and o.result]  # a serving cell's carry none
    return {
        "git": provenance.git_state(),
        "host": provenance.host(),
        "versions": results[-1]["versions"] if results else provenance.versions(),
        "devices": results[-1]["devices"] if results else None,
        # the backend's configuration as built: DeepSpeed's ds_config; a Megatron cell's layout,
        # recomputation, precision and optimizer; an FSDP2 cell's sharding plan and torch version
        **{k: results[-1][k] for k in ("ds_config", "megatron_config", "fsdp2_config") if results and k in results[-1]},
        "spec": raw_of(spec),
        "command": command,
        "launchers": [o.launcher for o in outcomes],
        # a cell over several nodes: the hostnames of its last repeat
        **({"nodes": list(o.nodes)} if (o := next((o for o in reversed(outcomes) if o.nodes), None)) else {}),
        "started": started,
        "finished": datetime.now(UTC).isoformat(),
    }


def build_record(spec: RunSpec | dict, outcomes: list[Outcome], started: str, command: list[str]) -> Record:
    """Aggregate repeat outcomes into the cell's Record (``spec``: a training cell's run spec,
    llmbench.spec.RunSpec, or its JSON form)."""
    spec = RunSpec.of(spec)
    cell = spec.cell
    results = [o.result for o in outcomes if o.status == "ok"]
    bad = next((o for o in outcomes if o.status != "ok"), None)
    prov = provenance_of(spec, outcomes, started, command)
    if bad is not None:
        return Record(cell=cell.to_dict(), status=bad.status, reason=bad.reason,
                      log_tail=bad.log_tail, provenance=prov)
    tps = summarize([r["tokens_per_s"] for r in results])
    step = summarize([r["step_time_s"] for r in results])
    peak = spec.platform.peak_bf16_tflops
    tech = spec.tech
    if tech.quant4:
        mfu, formula = None, "not reported for 4-bit (Q) cells: their matmuls are not bf16 GEMMs"
    elif peak is None:
        mfu, formula = None, f"not reported: platform {cell.platform!r} has no peak bf16 FLOP/s"
    else:
        fpt = flops_per_token(spec.model, cell.protocol.seq_len, frozen_base=tech.adapter is not None)
        mfu = tps.mean * fpt / (cell.gpus * peak * 1e12)
        formula = f"{MFU_FORMULA}; peak {peak} TFLOP/s per GPU ({spec.platform.peak_source})"
    mfu_fp8 = None
    if mfu is not None and tech.fp8 is not None and spec.platform.peak_fp8_tflops:
        # the bf16 peak stays the headline (torchtitan's convention for FP8 runs): comparable
        # with every bf16 cell; against the FP8 peak it says what the FP8 tensor cores could give
        mfu_fp8 = mfu * peak / spec.platform.peak_fp8_tflops
        formula += (f"; mfu_fp8_peak: the same against the dense FP8 peak, {spec.platform.peak_fp8_tflops} "
                    f"TFLOP/s per GPU ({spec.platform.peak_fp8_source})")
    last = results[-1]
    metrics = Metrics(
        tokens_per_s_mean=tps.mean, tokens_per_s_std=tps.std, tokens_per_s_runs=tps.values,
        step_time_s_mean=step.mean, step_time_s_runs=step.values,
        peak_mem_allocated_gib=largest([r["peak_mem_allocated_gib"] for r in results]),
        peak_mem_reserved_gib=largest([r["peak_mem_reserved_gib"] for r in results]),
        peak_rss_gib=largest([r["peak_rss_gib"] for r in results]),
        mfu=mfu, mfu_formula=formula, mfu_fp8_peak=mfu_fp8,
        total_params=last["total_params"], trainable_params=last["trainable_params"],
        trainable_desc=last["trainable_desc"], attention=last["attention"],
        compute_dtype=last.get("compute_dtype"),
        frozen_params_unchanged=last.get("frozen_params_unchanged"),
        optimizer_param_numel=last.get("optimizer_param_numel"),
        global_batch_tokens=last["global_batch_tokens"], loss_last=last["loss_last"],
    )
    return Record(cell=cell.to_dict(), status="ok", metrics=metrics, provenance=prov,
                  summary=mean_summary([r.get("summary") or {} for r in results]), samples=step_samples(results))


def step_samples(results: list[dict[str, Any]]) -> dict[str, list]:
    """Each repeat's measured steps as sample columns (repeat, step, step_time_s: host-clock
    time between step returns, llmbench.protocol.Window): whether a cell's spread is between
    processes or within each (llmbench.report.tidy's step_time_cv_in_repeat). Empty where a
    worker reports no step times."""
    if not results or any(not r.get("step_times_s") for r in results):
        return {}
    out: dict[str, list] = {"repeat": [], "step": [], "step_time_s": []}
    for i, r in enumerate(results):
        for j, t in enumerate(r["step_times_s"]):
            out["repeat"].append(i)
            out["step"].append(j)
            out["step_time_s"].append(t)
    return out


def mean_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """A worker's summaries over repeats: numbers averaged, everything else the last's; with
    several repeats, each repeat's kernel breakdown too (``kernel_runs``: metric -> one value a
    repeat, llmbench.profile.kernels.COLUMNS), so that a comparison of two profiled cells has
    the spread of its repeats (llmbench.report.evidence)."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for s in summaries for k in s):
        vals = [s[key] for s in summaries if key in s]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        out[key] = sum(nums) / len(nums) if nums and len(nums) == len(vals) else vals[-1]
    runs = {key: [s[key] for s in summaries] for key in KERNEL_COLUMNS
            if all(isinstance(s.get(key), (int, float)) and not isinstance(s.get(key), bool) for s in summaries)}
    if len(summaries) > 1 and runs:
        out["kernel_runs"] = runs
    return out
