"""The max-batch search's runner: probes run through the launcher, each a recorded cell.

Per (stage, platform, model, backend, technique, gpus) the search probes batch sizes
(llmbench.search.algorithm chooses them), each probe a real cell run with a short protocol
and recorded like any other (its record under ``runs/search/.../bs<N>/record.json``), keeps
what ran in the frontier file (llmbench.search.frontier) and writes the search's summary,
``search.json``. The workflow then measures the largest batch that fits with the full
protocol.

A batch fits when its probe ran and, where the capacity is known, its peak memory left
``headroom`` (default 5%) of it free: a probe whose peak came closer is ``tight`` and
counts as too large. Without headroom the cell measured at the boundary can run out of
memory where its probe did not (on the CPU a probe peaked at 1.99 GiB under a 2 GiB cap,
the measured run at 2.03 GiB). Probes run the cell's own warm-up and measured steps (one
repeat) unless the block's ``probe`` says fewer.

A probe the frontier answers (a batch at or above a known OOM, or one that ran before)
runs nothing: its record is ``skipped``, its reason names the frontier file, its
fingerprint and the batch that answers, and ``provenance["frontier"]`` holds the answer;
in ``search.json`` the probe has the status the batch showed when it ran and ``source:
frontier``. Tables therefore never count it as a measurement, and seed_frontier never
takes it as news. ``reprobe`` (``snakemake --config reprobe=true``) ignores the frontier
file and runs every probe again.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import cells
from ..record import FRONTIER_COMMAND, wall_s
from .algorithm import BOUNDING, Probe, State, next_probe
from ..spec import RunSpec
from .frontier import Frontier, capacity_and_metric, fingerprint, probe_spec


RAN = ("run", "resumed")
"""Probe sources that ran for the search (Probe.source): what its n_run and search_wall_s count."""


def summary(state: State, group: dict[str, Any], frontier_path: Path | str, reprobe: bool) -> dict[str, Any]:
    """The search's result: the largest batch that fits and how it was found. Its cost
    (``n_run``, ``search_wall_s``) counts every probe that ran for it, those of an earlier,
    stopped run of the same search (resumed) included."""
    stopped = next((p for p in state.probes if p.status not in BOUNDING), None)
    ran = [p for p in state.probes if p.source in RAN]
    wall = sum(p.wall_s for p in ran)
    return {
        **group,
        "status": "ok" if stopped is None else stopped.status,
        "reason": "" if stopped is None else f"probe at batch {stopped.batch_size}: {stopped.reason}",
        "largest_ok": state.lo or None,
        "smallest_oom": state.hi if state.hi <= state.max_batch else None,
        "start": state.start, "max_batch": state.max_batch, "step": state.step, "fit_limit_gib": state.capacity_gib,
        "algorithm": state.algorithm,
        "probes": [asdict(p) for p in state.probes],
        "n_probes": len(state.probes), "n_run": len(ran), "bound": state.bound,
        "search_wall_s": wall, "search_gpu_s": wall * group["gpus"],
        "frontier": str(frontier_path), "reprobe": reprobe,
    }


def _predicted_probe_s(at: RunSpec, log: Path) -> float | None:
    """What the first probe to run is predicted to need at the deadline: its repeat's predicted
    duration times estimate.DEADLINE_MARGIN, at most its timeout (the check a cell's untimed
    repeat gets, llmbench.launch), said in the search's log; None where the throughput model
    cannot predict it (then only a deadline already passed stops it)."""
    from .. import estimate

    est = estimate.repeat(at.cell, at.model)
    with open(log, "a") as fh:
        if not est.predicted:
            fh.write(f"no predicted probe ({est.note})\n")
            return None
        need = est.bound_s(estimate.DEADLINE_MARGIN)
        fh.write(f"the probe at batch {at.cell.batch_size} is predicted at {est.predicted_s:.0f} s ({est.note}); "
                 f"untimed, it starts only with {need:.0f} s left\n")
    return need


def run(spec: RunSpec | dict[str, Any], out_dir: Path | str, frontier_path: Path | str, log: Path | str,
        threads: int = 1, reprobe: bool = False, gpu_busy: Any = None, hint: int | None = None,
        hint_slope_gib: float | None = None) -> dict[str, Any]:
    """Run a search (every probe a recorded cell under ``out_dir``) and write its summary
    (``out_dir/search.json``); returns it. ``gpu_busy``: a probe's policy for busy GPUs
    (llmbench.gpus.BusyPolicy); ``hint``: a predicted largest batch that fits, probed first
    (llmbench.search.algorithm.State.hint; None: start at the search's ``start``), and
    ``hint_slope_gib`` its predicted GiB per further batch element (State.hint_slope_gib).
    ``spec``: the search's run spec (llmbench.spec.RunSpec, or its JSON form, rerun_spec)."""
    from ..aggregate import Outcome, build_record
    from ..launch import run_cell
    from ..ledger import deadline_from_env, deadline_stop, stop_at_deadline
    from ..record import write, write_json_atomic

    out_dir, log = Path(out_dir), Path(log)
    deadline = deadline_from_env()  # a bad value fails here, before any probe
    spec = RunSpec.of(spec)
    search, template = spec.search, spec.cell
    capacity, metric = capacity_and_metric(spec)
    frontier = Frontier(path=Path(frontier_path), fingerprint=fingerprint(spec)) if reprobe else \
        Frontier.load(frontier_path, fingerprint(spec))
    # a batch fits when its peak leaves the headroom free (run-to-run noise and the longer
    # measured run must not push the measured cell over); the model aims at that limit
    limit = None if capacity is None else capacity * (1 - search["headroom"])
    state = State(start=search["start"], max_batch=search["max"], capacity_gib=limit, hint=hint,
                  hint_slope_gib=hint_slope_gib, step=search.get("step", 1))
    group = {k: v for k, v in template.key.items() if k != "batch_size"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(f"search {group}: start {state.start}, hint {hint} (slope {hint_slope_gib} GiB), max {state.max_batch}, "
                 f"step {state.step}, bound {state.bound} probes, capacity {capacity} GiB ({metric})\n")
    while (nxt := next_probe(state)) is not None:
        bs, why = nxt
        at = probe_spec(spec, bs)
        probe_dir = out_dir / cells.PROBE_DIR.format(batch_size=bs)
        record_path = probe_dir / "record.json"
        answer = frontier.answer(bs)
        t0 = time.monotonic()
        if answer is not None:
            # nothing runs: the probe's own record is put back if it ran into this folder
            # (a stopped search resumed), else the record says skipped and why; the search
            # goes on with what the batch showed when it ran (status, peak)
            resumed = frontier.restore(bs, probe_dir)
            if not resumed:
                record = build_record(at, [Outcome(status="skipped", reason=answer.reason)],
                                      datetime.now(UTC).isoformat(), FRONTIER_COMMAND)
                write(replace(record, provenance={**record.provenance,
                                                  "frontier": {**answer.to_dict(), "metric": metric}}), record_path)
            status, peak, reason = answer.status, answer.peak_gib, answer.reason
            source = "resumed" if resumed else "frontier"
        else:
            # the job's deadline (llmbench.ledger): a probe that would not finish is not started;
            # the frontier file holds every probe so far, and the next run resumes from it
            # (not ``why``: that is why next_probe chose this batch, recorded with the probe and read
            # by next_probe again, e.g. whether the first probe was the hint)
            walls = [p.wall_s for p in state.probes if p.source in RAN]
            if stop := deadline_stop(deadline, walls, f"the probe at batch {bs}",
                                     None if walls or deadline is None else _predicted_probe_s(at, log)):
                stop_at_deadline(f"{stop} ({len(state.probes)} probe(s) so far are in the frontier file: the next "
                                 "run resumes there)", log)
            record = run_cell(at.raw, record_path, probe_dir / "probe.log", threads=threads,
                              gpu_busy=gpu_busy)
            peak = getattr(record.metrics, metric) if record.status == "ok" else None
            status, reason, source = record.status, record.reason, "run"
        if status == "ok" and limit is not None and peak is not None and peak > limit:
            status, reason = "tight", (f"ran, but its peak {peak:.3f} GiB leaves less than headroom "
                                       f"{search['headroom']:.0%} of {capacity:g} GiB free")
        took = (_record_wall_s(record_path) or 0.0) if source == "resumed" else time.monotonic() - t0
        probe = Probe(batch_size=bs, status=status, peak_gib=peak, wall_s=took, source=source, chosen_by=why,
                      reason=reason)
        state.probes.append(probe)
        frontier.add(probe)
        if source == "run" and probe.status in BOUNDING:
            frontier.keep_run(bs, probe_dir)
        frontier.save()
        with open(log, "a") as fh:
            fh.write(f"probe {len(state.probes)}: batch {bs} ({why}) -> {probe.status} "
                     f"{'' if peak is None else f'{peak:.3f} GiB '}({source}, {probe.wall_s:.1f} s) {probe.reason}\n")
    result = {**summary(state, group, frontier_path, reprobe), "capacity_gib": capacity,
              "headroom": search["headroom"], "hint": hint, "hint_slope_gib": hint_slope_gib}
    write_json_atomic(out_dir / cells.SEARCH_SUMMARY, result)
    return result


def read_summary(out_dir: Path | str) -> dict[str, Any]:
    """A finished search's summary. One written before resumed probes were told apart
    (Probe.source) marked a probe an earlier, stopped run of the search had run as
    ``frontier``, and left its seconds out: such a probe's record in the folder ran (a
    frontier answer's says skipped), so it is read as resumed, with the record's seconds,
    and ``n_run``, ``search_wall_s`` and ``search_gpu_s`` count it."""
    out_dir = Path(out_dir)
    s = json.loads((out_dir / cells.SEARCH_SUMMARY).read_text())
    probes = s.get("probes") or []
    upgraded = False
    for p in probes:
        if p.get("source") != "frontier":
            continue
        took = _record_wall_s(out_dir / cells.PROBE_DIR.format(batch_size=p["batch_size"]) / "record.json")
        if took is not None:
            p.update(source="resumed", wall_s=took)
            upgraded = True
    if upgraded:
        ran = [p for p in probes if p.get("source") in RAN]
        wall = sum(p.get("wall_s") or 0.0 for p in ran)
        s.update(n_run=len(ran), search_wall_s=wall, search_gpu_s=wall * s.get("gpus", 1))
    return s


def _record_wall_s(path: Path) -> float | None:
    """The seconds of the probe record at ``path`` where it ran (not skipped: a frontier
    answer's), from its provenance; None where there is none or it did not run."""
    rec = read_json(path)
    if rec is None or rec.get("status") == "skipped":
        return None
    return wall_s(rec.get("provenance") or {})


def read_json(path: Path) -> dict[str, Any] | None:
    """A record's (or any JSON file's) content, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def measured_batch(folder: Path | str) -> int | None:
    """The batch a finished search's cell is measured at: the largest batch whose probe fit,
    unless the cell measured there (its record beside the search, cells.RECORD_PATTERN)
    ran out of memory; then the next smaller batch whose probe fit, and so on. None where
    no probe fit, or where the cell ran out of memory at every batch that did.

    A measured cell can run out of memory where its probe did not: it runs more steps,
    and the caching allocator's fragmentation can grow past what a short probe showed
    (headroom covers most of it, not all). Its record stays ``oom``, a true result
    (measured_out_of_memory lists them); the report and the next run use the next batch
    down. ValueError: ``folder`` is no search folder (cells.SEARCH_PATTERN)."""
    return _measured(folder)[0]


def measured_out_of_memory(folder: Path | str) -> list[int]:
    """The batches above measured_batch whose measured cell ran out of memory, largest
    first (their records belong in the report beside the cell measured)."""
    return _measured(folder)[1]


def _measured(folder: Path | str) -> tuple[int | None, list[int]]:
    text = str(folder).rstrip("/")
    parsed = cells.parse(text, (cells.SEARCH_PATTERN,))
    if parsed is None or not text.endswith(cells.SEARCH_PATTERN.format(**parsed.wildcards)):
        raise ValueError(f"{folder}: not a search folder (results/{cells.SEARCH_PATTERN})")
    summary = read_summary(text)
    largest = summary.get("largest_ok")
    if not largest:
        return None, []
    fit = {int(p["batch_size"]) for p in summary.get("probes", [])
           if p["status"] == "ok" and p["batch_size"] <= largest} | {int(largest)}
    ran_out = []
    for batch in sorted(fit, reverse=True):
        try:
            status = json.loads(Path(measured_record(text, batch)).read_text()).get("status")
        except (OSError, ValueError):
            status = None  # not measured yet (or unreadable: measuring it again says why)
        if status != "oom":
            return batch, ran_out
        ran_out.append(batch)
    return None, ran_out


def measured_record(folder: Path | str, batch_size: int) -> str:
    """The record path of a search folder's cell at ``batch_size`` (under the same results
    folder as the search)."""
    text = str(folder).rstrip("/")
    parsed = cells.parse(text, (cells.SEARCH_PATTERN,))
    record = cells.RECORD_PATTERN.format(**parsed.wildcards, batch_size=int(batch_size))
    return f"{parsed.root}/{record}" if parsed.root else record
