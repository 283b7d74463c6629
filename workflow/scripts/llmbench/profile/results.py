"""A profile cell's repeats -> its Record: the module-wise rows (mean over repeats) as
samples, the phase times as summary, throughput without the profiler as metrics; with
several repeats, each repeat's phase times and rows too (summary ``repeats``), so that a
finding on a profiled cell has the spread of its repeats and pairs them round by round in a
set (llmbench.report.findings derives each repeat's metrics as it derives the mean's)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from statistics import fmean

from ..aggregate import Outcome, largest, provenance_of
from ..protocol import summarize
from ..record import Metrics, Record
from ..spec import RunSpec

#: Per (phase, module) values of a worker's rows; recompute_s: the part of a backward row
#: that reruns forward work under R (Fig. 5 compares backward without it).
VALUES = ("time_s", "share", "gemm_time_s", "recompute_s")
#: a repeat's peak memory (GiB), as training workers report it (llmbench.train.scenario)
PEAKS = ("peak_mem_allocated_gib", "peak_mem_reserved_gib", "peak_rss_gib")


def mean_rows(results: list[dict]) -> dict[str, list]:
    """Rows (phase, module) averaged over repeats, as columns."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for res in results:
        for r in res["rows"]:
            for k in VALUES:
                if r.get(k) is not None:
                    acc[(r["phase"], r["module"])][k].append(r[k])
    cols: dict[str, list] = {"phase": [], "module": [], **{k: [] for k in VALUES}}
    for (phase, module), vals in acc.items():
        cols["phase"].append(phase)
        cols["module"].append(module)
        for k in VALUES:
            cols[k].append(fmean(vals[k]) if vals[k] else None)
    return cols


def phase_summary(phases: dict[str, dict]) -> dict[str, float]:
    """A worker's phase times as summary keys: ``<phase>_<key>`` (forward_wall_s, ...)."""
    return {f"{phase}_{k}": v for phase, keys in phases.items() for k, v in (keys or {}).items()}


def repeats_summary(results: list[dict]) -> list[dict]:
    """Each repeat's phase times (phase_summary) and module rows (mean_rows' columns): the
    summary's ``repeats`` of a cell of several repeats."""
    return [{"phases": phase_summary(r["phases"]), "rows": mean_rows([r])} for r in results]


def build_record(spec: RunSpec | dict, outcomes: list[Outcome], started: str, command: list[str]) -> Record:
    """Aggregate a profile cell's repeat outcomes into its Record (``spec``: its run spec,
    llmbench.spec.RunSpec, or its JSON form)."""
    spec = RunSpec.of(spec)
    cell = spec.cell
    results = [o.result for o in outcomes if o.status == "ok"]
    prov = provenance_of(spec, outcomes, started, command)
    bad = next((o for o in outcomes if o.status != "ok"), None)
    if bad is not None:
        return Record(cell=cell.to_dict(), status=bad.status, reason=bad.reason, log_tail=bad.log_tail,
                      provenance=prov)
    tps = summarize([r["tokens_per_s"] for r in results])
    step = summarize([r["unprofiled_step_time_s"] for r in results])
    summary = {
        "profiled_step_time_s": fmean(r["step_time_s"] for r in results),
        "unprofiled_step_time_s": step.mean,
        "unaccounted_s": fmean(r.get("unaccounted_s") or 0.0 for r in results),
        # file names: the traces sit beside the record (paths would tie it to one machine)
        "traces": [Path(r["trace"]).name for r in results if r.get("trace")],
        "method": results[-1].get("method"),
        # which steps' walls the rows add up to (attribution.step_walls)
        "wall_basis": results[-1].get("wall_basis", "profiled"),
        **({"decode_steps": results[-1]["decode_steps"]} if "decode_steps" in results[-1] else {}),
    }
    phases = [phase_summary(r["phases"]) for r in results]  # forward, backward, optimizer; or prefill, decode
    summary.update({key: fmean(p.get(key) or 0.0 for p in phases) for key in phases[-1]})
    if len(results) > 1:
        summary["repeats"] = repeats_summary(results)
    metrics = Metrics(tokens_per_s_mean=tps.mean, tokens_per_s_std=tps.std, tokens_per_s_runs=tps.values,
                      step_time_s_mean=step.mean, step_time_s_runs=step.values,
                      # the largest over repeats; a result from before peaks were kept has none
                      **{k: largest([r.get(k) for r in results]) for k in PEAKS},
                      attention=results[-1].get("attention"), compute_dtype=results[-1].get("compute_dtype"),
                      global_batch_tokens=cell.batch_size * cell.protocol.seq_len * cell.gpus)
    return Record(cell=cell.to_dict(), status="ok", metrics=metrics, summary=summary,
                  samples=mean_rows(results), provenance=prov)
