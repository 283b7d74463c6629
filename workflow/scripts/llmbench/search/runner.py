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
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import cells, techniques
from ..record import FRONTIER_COMMAND, wall_s
from .algorithm import BOUNDING, Probe, State, bound, next_probe
from .frontier import Frontier, capacity_and_metric, fingerprint, seed_frontier


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
        "start": state.start, "max_batch": state.max_batch, "fit_limit_gib": state.capacity_gib,
        "algorithm": state.algorithm,
        "probes": [asdict(p) for p in state.probes],
        "n_probes": len(state.probes), "n_run": len(ran), "bound": bound(state.max_batch),
        "search_wall_s": wall, "search_gpu_s": wall * group["gpus"],
        "frontier": str(frontier_path), "reprobe": reprobe,
    }


def run(spec: dict[str, Any], out_dir: Path | str, frontier_path: Path | str, log: Path | str,
        threads: int = 1, reprobe: bool = False, gpu_busy: Any = None, hint: int | None = None,
        hint_slope_gib: float | None = None) -> dict[str, Any]:
    """Run a search (every probe a recorded cell under ``out_dir``) and write its summary
    (``out_dir/search.json``); returns it. ``gpu_busy``: a probe's policy for busy GPUs
    (llmbench.gpus.BusyPolicy); ``hint``: a predicted largest batch that fits, probed first
    (llmbench.search.algorithm.State.hint; None: start at the search's ``start``), and
    ``hint_slope_gib`` its predicted GiB per further batch element (State.hint_slope_gib)."""
    from ..aggregate import Outcome, build_record
    from ..cells import Cell
    from ..launch import run_cell
    from ..ledger import deadline_from_env, deadline_stop, stop_at_deadline
    from ..record import write, write_json_atomic

    out_dir, log = Path(out_dir), Path(log)
    deadline = deadline_from_env()  # a bad value fails here, before any probe
    search = spec["search"]
    template = Cell.from_dict(spec["cell"])
    capacity, metric = capacity_and_metric(spec)
    frontier = Frontier(path=Path(frontier_path), fingerprint=fingerprint(spec)) if reprobe else \
        Frontier.load(frontier_path, fingerprint(spec))
    # a batch fits when its peak leaves the headroom free (run-to-run noise and the longer
    # measured run must not push the measured cell over); the model aims at that limit
    limit = None if capacity is None else capacity * (1 - search["headroom"])
    state = State(start=search["start"], max_batch=search["max"], capacity_gib=limit, hint=hint,
                  hint_slope_gib=hint_slope_gib)
    group = {k: v for k, v in template.key.items() if k != "batch_size"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(f"search {group}: start {state.start}, hint {hint} (slope {hint_slope_gib} GiB), max {state.max_batch}, "
                 f"bound {bound(state.max_batch)} probes, capacity {capacity} GiB ({metric})\n")
    while (nxt := next_probe(state)) is not None:
        bs, why = nxt
        probe_spec = {**spec, "cell": {**spec["cell"], "batch_size": bs, "protocol": search["probe_protocol"]}}
        probe_spec.pop("search")
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
                record = build_record(probe_spec, [Outcome(status="skipped", reason=answer.reason)],
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
            if stop := deadline_stop(deadline, [p.wall_s for p in state.probes if p.source in RAN],
                                     f"the probe at batch {bs}"):
                stop_at_deadline(f"{stop} ({len(state.probes)} probe(s) so far are in the frontier file: the next "
                                 "run resumes there)", log)
            record = run_cell(probe_spec, record_path, probe_dir / "probe.log", threads=threads,
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
    rec = _read_json(path)
    if rec is None or rec.get("status") == "skipped":
        return None
    return wall_s(rec.get("provenance") or {})


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


def measured_target(folder: Path | str) -> str | None:
    """The record path (for ``snakemake``) of the cell a finished search measures: the
    search's cell at measured_batch (the largest batch that fit, below any where the
    measured cell ran out of memory); None where there is none. ValueError: ``folder`` is
    no search folder (cells.SEARCH_PATTERN)."""
    batch = measured_batch(folder)
    return None if batch is None else measured_record(folder, batch)


@dataclass(frozen=True, slots=True)
class Estimate:
    """How long a cell's repeat should take (estimate_s)."""

    repeat_s: float
    """Seconds one repeat of the cell's protocol should take."""
    repeats: int
    """The cell's repeats (each a process of its own, and a cell stops between two at its deadline)."""
    source: str
    """``probe`` (its search's probe at that batch), the path of the earlier record read,
    ``kept`` (the longest repeat an earlier run of this very spec kept: KEPT_SOURCE), or
    ``stopped`` (a repeat of the cell ran this long and was stopped unfinished: llmbench.ledger.STOPPED)."""
    kept: int = 0
    """Repeats an earlier run of this very spec kept beside the record (llmbench.ledger.read_kept,
    a cell stopped between repeats): the cell resumes with them and runs only the others."""

    @property
    def left(self) -> int:
        """The repeats still to run."""
        return max(self.repeats - self.kept, 0)

    @property
    def start_s(self) -> int:
        """The seconds left that envs/offline-batch.sh wants before it starts the cell: a
        repeat plus 20 s, a probe's estimate of a repeat taken 1.25 times first (how the
        committed cells' wall times compare with the estimate: README, the paragraph on
        offline-batch), a kept or a stopped repeat's time ledger.REPEAT_MARGIN times (what the
        cell's own deadline check wants of them, so that offline-batch starts no cell that
        stops at once and ends the batch). A call shorter than this never starts the cell, as
        a cell stops only between repeats. A cell whose repeats are all kept runs none: 20 s."""
        from ..ledger import REPEAT_MARGIN

        repeat = math.ceil(self.repeat_s) if self.left else 0
        if self.source == "probe":
            repeat = repeat * 5 // 4
        elif self.source in (KEPT_SOURCE, STOPPED_SOURCE):
            repeat = math.ceil(repeat * REPEAT_MARGIN)
        return repeat + 20


#: Estimate.source where a stopped repeat's time is the estimate
STOPPED_SOURCE = "stopped"
#: Estimate.source where the longest kept repeat's time is the estimate
KEPT_SOURCE = "kept"


def _read_json(path: Path) -> dict[str, Any] | None:
    """A record's JSON, or None where it is missing or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _timing(rec: dict[str, Any]) -> tuple[float, float, int, int] | None:
    """(set-up seconds a repeat, timed-window seconds a repeat, steps in the window, measured
    steps of all its repeats: how much it saw) of an ok record or probe. The set-up is its
    wall time a repeat less its window (the window covers the warm-up and measured steps,
    llmbench.protocol.run_window); where the wall time is not its repeats' alone (repeats
    resumed from an earlier run), it is the worker's other phases (llmbench.train.scenario.Phases:
    from the process's start, so without the launcher's few seconds before it). None where
    the record lacks a window or steps."""
    try:
        summary = rec["summary"]
        window = float(summary["phase_window_s"])
        protocol = rec["cell"]["protocol"]
        steps = int(protocol["warmup_steps"]) + int(protocol["measured_steps"])
    except (KeyError, TypeError, ValueError):
        return None
    if rec.get("status") != "ok" or not steps:
        return None
    provenance = rec.get("provenance") or {}
    wall = wall_s(provenance)
    repeats = len((rec.get("metrics") or {}).get("tokens_per_s_runs") or ()) or 1
    if wall is None or provenance.get("resumed_repeats"):
        setup = sum(v for k, v in summary.items()
                    if k.startswith("phase_") and k != "phase_window_s" and isinstance(v, (int, float)))
    else:
        setup = max(wall / repeats - window, 0.0)
    return setup, window, steps, int(protocol["measured_steps"]) * repeats


def estimate_s(target: Path | str, configfile: Path | str, earlier: Sequence[Path | str] = ()) -> Estimate | None:
    """How long the cell of record ``target`` should take a repeat, per the cell's protocol
    (``configfile``'s grid): the set-up (wall time less timed window) of a run of the same
    cell plus its seconds a step times the cell's warm-up and measured steps. The run read
    is the max-batch search's probe at that batch beside ``target`` where one ran (one the
    frontier answered keeps no timing), else the record of the cell with the most measured
    steps in the results folders ``earlier`` (any protocol: a sweep's 3 + 10 steps tell a
    protocol rerun's 30 + 100). A repeat of the cell with those steps that a signal stopped
    unfinished beside ``target`` (llmbench.ledger.STOPPED: a deadline the estimate missed) is
    the estimate where it ran longer (source ``stopped``). None where none of these is there
    or the config has no such cell. The repeats of this very spec an earlier run kept beside
    ``target`` count as run (Estimate.kept), and the longest of them is the estimate (source
    ``kept``; a stopped repeat where that ran longer): this cell's own repeats, by which its
    deadline check (llmbench.ledger) judges the next.
    envs/offline-batch.sh compares it with the time left before it starts the cell.
    Snakemake's own start is not in it."""
    parsed = cells.parse(str(target), (cells.RECORD_PATTERN,))
    if parsed is None:
        return None
    from ..grid import load
    from ..ledger import read_kept, stopped_repeat

    try:
        grid = load(Path(configfile))
        cell = grid.find(**parsed.wildcards)
    except (KeyError, LookupError, ValueError):
        return None
    kept = read_kept(Path(target).parent, grid.spec(cell), cell.protocol.repeats)[0]
    walls = [float(k["wall_s"]) for k in kept.values() if k.get("wall_s")]
    steps = cell.protocol.warmup_steps + cell.protocol.measured_steps

    def estimate(repeat_s: float, source: str) -> Estimate:
        return Estimate(repeat_s=repeat_s, repeats=cell.protocol.repeats, source=source, kept=len(kept))

    found = None
    if walls:  # repeats of this very cell: they, not a probe's or another run's figure
        found = estimate(max(walls), KEPT_SOURCE)
    else:
        timing, source = None, "probe"
        for root in (parsed.root, *earlier):  # the search beside it, or one an earlier folder holds
            probe = _read_json(Path(root) / cells.PROBE_RECORD_PATTERN.format(**parsed.wildcards))
            if probe is not None and (timing := _timing(probe)) is not None:
                break
        if timing is None:
            paths = [Path(d) / cells.RECORD_PATTERN.format(**parsed.wildcards) for d in earlier]
            runs = [(path, _read_json(path)) for path in paths]
            timed = [(tm, str(path)) for path, rec in runs if rec is not None and (tm := _timing(rec)) is not None]
            if timed:
                timing, source = max(timed, key=lambda found: found[0][3])  # the most measured steps
        if timing is not None:
            setup, window, run_steps, _ = timing
            found = estimate(setup + window / run_steps * steps, source)
    # a repeat of the cell (its steps) stopped unfinished beside the target: at least that long
    stopped = stopped_repeat(Path(target).parent)
    if stopped is not None and stopped.get("steps") == steps and \
            (found is None or float(stopped["ran_s"]) > found.repeat_s):
        return estimate(float(stopped["ran_s"]), STOPPED_SOURCE)
    return found


def recorded_in(target: str, folders: Sequence[Path | str]) -> tuple[str, str] | None:
    """Whether results folders (a reference run's, holding runs/...) already hold a target
    of a list such as envs/offline-batch.sh runs (``results/runs/...``, its SKIP_RECORDED):
    ``("skip", folder)`` where one holds it (a search folder once the cell it measures is
    there too, or where no batch fit); ``("cell", path)`` where one holds the search but
    not that cell (path: the cell's record beside ``target``, the target to run instead);
    None where none holds it."""
    rel = target.split("results/", 1)[1] if "results/" in target else target
    cell = None
    for d in (str(f).rstrip("/") for f in folders):
        if not Path(d, rel).exists():
            continue
        if not target.endswith(".json"):  # a search: recorded once the cell it measures is too
            try:
                measured = measured_target(f"{d}/{rel}")
            except (ValueError, OSError):
                continue
            if measured and not Path(measured).exists():
                cell = cell or target[:len(target) - len(rel)] + measured.removeprefix(f"{d}/")
                continue
        return "skip", d
    return ("cell", cell) if cell else None


#: the probes plan counts for a search: about what the committed searches need from the
#: memory model's hint (python -m llmbench.memory replay gives the count)
PLAN_PROBES = 3
#: what plan says of a cell no call of the given length starts (plan's call_s)
NEVER_STARTS = "never starts in a call"


def _timed_records(earlier: Sequence[Path | str],
                   key: dict[str, str]) -> Iterator[tuple[dict[str, str], tuple, int, str]]:
    """(wildcards, _timing, sequence length, path) of each ok record and probe in ``earlier``
    that ``key`` (cells.RECORD_PATTERN's wildcards, ``*`` for any) matches."""
    for d in earlier:
        for pattern in (cells.RECORD_PATTERN, cells.PROBE_RECORD_PATTERN):
            for path in Path(d).glob(pattern.format(**key)):
                ref, rec = cells.parse(str(path), (pattern,)), _read_json(path)
                if ref is None or rec is None or (timing := _timing(rec)) is None:
                    continue
                yield ref.wildcards, timing, int(rec["cell"]["protocol"].get("seq_len") or 0), str(path)


def _technique_distance(a: str, b: str) -> int:
    """How many flags (the adapter counted as one) two techniques differ in."""
    def parts(name: str) -> set[str]:
        tech = techniques.parse(name)
        return set(tech.flags) | {tech.adapter_token or ""}

    return len(parts(a) ^ parts(b))


def search_estimate_s(folder: Path | str, configfile: Path | str, earlier: Sequence[Path | str] = ()) \
        -> tuple[float, str, Estimate] | None:
    """(seconds, why, the cell's Estimate) a search folder's search and the cell it measures
    should take, for a plan: PLAN_PROBES probes and the cell's repeats, all at the memory
    model's hint (the search's start where the model does not apply), each its set-up plus its
    steps. The seconds a token and the set-up come from the ok record or probe of the same
    cell (any platform, any batch) in ``earlier`` with the largest batch (the same platform's
    first where batches tie): a large batch's seconds a token is what the searched batch runs
    at, where batch 1's is often host-bound. From another GPU the figure carries that GPU's
    speed (from a slower one, an over-estimate). Where that batch is far below the hint (under
    a quarter), the seconds a token come instead from the record, on the same platform, model,
    stage and GPUs, of the technique closest to the cell's (fewest flags apart, then the batch
    nearest the hint) that ran within a quarter of the hint; where none did, the batch-1
    figure stands, an upper bound. None where the config has no such search or ``earlier`` no
    such record."""
    from .. import memory
    from ..grid import load

    parsed = cells.parse(str(folder).rstrip("/"), (cells.SEARCH_PATTERN,))
    if parsed is None:
        return None
    try:
        grid = load(Path(configfile))
        found = grid.find_search(**parsed.wildcards)
    except (KeyError, LookupError, ValueError):
        return None
    spec = grid.spec(found)
    batch = memory.start_hint(spec) or found.start
    wildcards, seq_len = parsed.wildcards, found.cell.protocol.seq_len
    best = None
    for ref, timing, seq, path in _timed_records(earlier, {**wildcards, "platform": "*", "batch_size": "*"}):
        rank = (int(ref["batch_size"]), ref["platform"] == wildcards["platform"])
        if best is None or rank > best[0]:
            best = (rank, timing, seq or seq_len, path)
    if best is None:
        return None
    (ref_batch, _), (setup, window, steps, _), seq, source = best
    token_s, far = window / steps / (ref_batch * seq), ""
    if 4 * ref_batch < batch:
        near = None
        for ref, (_, w, n, _), seq, path in _timed_records(earlier, {**wildcards, "technique": "*", "batch_size": "*"}):
            b = int(ref["batch_size"])
            if 4 * b >= batch:
                rank = (_technique_distance(ref["technique"], wildcards["technique"]), abs(math.log(b / batch)))
                if near is None or rank < near[0]:
                    near = (rank, w / n / (b * (seq or seq_len)), f"{ref['technique']} at batch {b}, {path}")
        if near is None:
            far = f"; its batch {ref_batch} is far below, so an upper bound"
        else:
            token_s, far = near[1], f" (its batch {ref_batch} is far below: a step's seconds a token from {near[2]})"
    step_s = token_s * batch * seq_len
    probe_steps = found.probe_protocol.warmup_steps + found.probe_protocol.measured_steps
    cell = found.cell.protocol
    total = (PLAN_PROBES * (setup + probe_steps * step_s)
             + cell.repeats * (setup + (cell.warmup_steps + cell.measured_steps) * step_s))
    # the cell as offline-batch will weigh it once a probe at its batch has run
    measured = Estimate(repeat_s=setup + (cell.warmup_steps + cell.measured_steps) * step_s, repeats=cell.repeats,
                        source="probe")
    return total, (f"{PLAN_PROBES} probes and {cell.repeats} repeat(s) at batch {batch}, {step_s:.1f} s a step "
                   f"from {source}{far}"), measured


def _start_clause(est: Estimate, call_s: int | None, what: str, wants: str) -> str:
    """The seconds left offline-batch wants before it starts ``est``'s cell (Estimate.start_s:
    a call's deadline less what the call spends before the cell, its install and op build,
    must hold them), or the plan's NEVER_STARTS clause where a call of ``call_s`` s is too short."""
    if call_s is None or est.start_s <= call_s:
        return f"; {what}starts with {est.start_s} s left"
    return f"; {what}{NEVER_STARTS} of {call_s} s: offline-batch {wants} {est.start_s} s left to start it"


def plan(targets: Sequence[str], configfile: Path | str, earlier: Sequence[Path | str] = (),
         skip_recorded: Sequence[Path | str] = (), call_s: int | None = None) -> list[tuple[str, float | None, str]]:
    """(target, seconds, why) for each target of a list such as envs/offline-batch.sh runs,
    with its SKIP_RECORDED folders ``skip_recorded`` (recorded_in): 0 for a target they
    hold; for a search they hold without its cell, that cell; a cell's estimate_s times its
    repeats still to run (Estimate.left: those kept beside the target from a stopped run
    count as run; why: where the estimate comes from), a search folder's search_estimate_s (its
    probes are not known before it runs: a rougher figure), or None where nothing times
    the target. Each timed why ends with the seconds left offline-batch wants to start the
    cell (Estimate.start_s; a search: its cell at the batch it is timed at). With ``call_s``
    (offline-batch's deadline: a lent machine's call, a Slurm allocation), a cell whose
    Estimate.start_s exceeds it says so instead (NEVER_STARTS): no call of that length starts
    it; so does a search whose cell would not start (the search still finds its batch)."""
    out: list[tuple[str, float | None, str]] = []
    for target in targets:
        found = recorded_in(target, skip_recorded)
        if found is not None and found[0] == "skip":
            out.append((target, 0, f"already recorded in {found[1]}"))
            continue
        if found is not None:
            target = found[1]  # searched there: its cell alone
        if not target.endswith(".json"):
            est = search_estimate_s(target, configfile, earlier)
            if est is None:
                out.append((target, None, "a search: no earlier record of its cell times it"))
                continue
            out.append((target, math.ceil(est[0]), f"a search: {est[1]}"
                        + _start_clause(est[2], call_s, "its cell at that batch ", "will want")))
            continue
        est = estimate_s(target, configfile, earlier)
        if est is None:
            out.append((target, None, "no probe at its batch nor an earlier record of the cell"))
        else:
            repeat = math.ceil(est.repeat_s)  # whole seconds, as estimate prints it
            kept = f"; {est.kept} of {est.repeats} repeats kept beside it" if est.kept else ""
            out.append((target, repeat * est.left, f"{est.left} x {repeat} s from {est.source}{kept}"
                        + _start_clause(est, call_s, "", "wants")))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.search seed-frontier RECORDS [--results DIR]`` (seed_frontier);
    ``python -m llmbench.search measured-target FOLDER`` (measured_target: prints the
    record path, or nothing where no batch fit); ``python -m llmbench.search estimate
    TARGET CONFIG [--earlier DIR ...]`` (estimate_s: prints a repeat's whole seconds, the
    repeats still to run (Estimate.left), the seconds left offline-batch wants to start it (Estimate.start_s) and the
    source, or nothing where there is no estimate); ``python -m llmbench.search plan LIST
    CONFIG [--earlier DIR ...] [--skip-recorded DIR ...] [--call-s S]`` (plan: the seconds of
    each target of a target list, then their sum and what it leaves out);
    ``python -m llmbench.search recorded-in TARGET [DIR ...]`` (recorded_in: prints ``skip
    DIR``, ``cell PATH``, or ``none`` where no folder holds the target)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m llmbench.search", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    seed = sub.add_parser("seed-frontier", help=seed_frontier.__doc__.split("\n")[0])
    seed.add_argument("records", type=Path, help="folder holding probe records (bs<N>/record.json) at any depth")
    seed.add_argument("--results", type=Path, default=Path("results"), help="results folder of the frontier files")
    measured = sub.add_parser("measured-target", help=measured_target.__doc__.split("\n")[0])
    measured.add_argument("folder", type=Path, help="a finished search's folder (holding search.json)")
    timing = argparse.ArgumentParser(add_help=False)  # what estimate and plan time a cell by
    timing.add_argument("--earlier", nargs="*", type=Path, default=[],
                        help="results folders whose records of a cell time it where no probe did")
    estimate = sub.add_parser("estimate", parents=[timing], help=estimate_s.__doc__.split("\n")[0])
    estimate.add_argument("target", type=Path, help="a training cell's record path")
    estimate.add_argument("config", type=Path, help="the config whose cell it is")
    planned = sub.add_parser("plan", parents=[timing], help=plan.__doc__.split("\n")[0])
    planned.add_argument("targets", type=Path, help="a file of targets, one a line (coverage targets writes one)")
    planned.add_argument("config", type=Path, help="the config whose cells they are")
    planned.add_argument("--skip-recorded", nargs="*", type=Path, default=[],
                         help="results folders whose records count as done (offline-batch's SKIP_RECORDED)")
    planned.add_argument("--call-s", type=int, default=None,
                         help="seconds of one call (offline-batch's DEADLINE_S): name the cells it never starts")
    recorded = sub.add_parser("recorded-in", help=recorded_in.__doc__.split("\n")[0])
    recorded.add_argument("target", help="a target (results/runs/...: a record or a search folder)")
    recorded.add_argument("folders", nargs="*", help="results folders holding runs/...")
    args = parser.parse_args(argv)
    if args.command == "recorded-in":
        print(*(recorded_in(args.target, args.folders) or ("none",)))
        return 0
    if args.command == "plan":
        try:
            lines = (t.strip() for t in args.targets.read_text().splitlines())
            listed = [t for t in lines if t and not t.startswith("#")]  # as offline-batch reads it
        except OSError as exc:
            parser.exit(2, f"{exc}\n")
        rows = plan(listed, args.config, args.earlier, args.skip_recorded, args.call_s)
        for target, secs, why in rows:
            print(f"{'?' if secs is None else int(secs):>6}  {target}  ({why})")
        timed = [secs for _, secs, _ in rows if secs is not None]
        never = sum(NEVER_STARTS in why for _, _, why in rows)
        print(f"total: {int(sum(timed))} s for {len(timed)} of {len(rows)} targets"
              + (f"; {len(rows) - len(timed)} not timed (above)" if len(timed) < len(rows) else "")
              + (f"; {never} {NEVER_STARTS} of {args.call_s} s (above)" if never else ""))
        return 0
    if args.command == "estimate":
        est = estimate_s(args.target, args.config, args.earlier)
        if est is not None:
            print(math.ceil(est.repeat_s), est.left, est.start_s, est.source)
        return 0
    if args.command == "measured-target":
        try:
            target = measured_target(args.folder)
        except (ValueError, OSError) as exc:
            parser.exit(2, f"{exc}\n")
        if target:
            print(target)
        return 0
    added = seed_frontier(args.records, args.results)
    for target, n in sorted(added.items()):
        print(f"{target}: {n} probe outcomes")
    if not added:
        print(f"no probe records under {args.records} to add")
    return 0
