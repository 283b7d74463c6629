"""Planning a lent or offline machine's calls: what a target list costs and what to run next.

What envs/offline-batch.sh asks before it starts a target, and what a person asks before a
call or an allocation (``python -m llmbench.offline``, llmbench.offline.cli):

- estimate_s: how long a cell's repeat should take (its search's probe at that batch, an
  earlier record of the cell, the repeats an earlier run kept or one a deadline stopped:
  llmbench.ledger), and Estimate.start_s, the seconds left offline-batch wants to start it;
- search_estimate_s: a search not yet run, its probes and the cell it measures;
- plan: the seconds of each target of a list, and the cells no call of a given length starts;
- schedule: the calls of a given length a list should take (offline-batch's rules played on
  the estimates);
- recorded_in: whether results folders (SKIP_RECORDED) already hold a target;
- measured_target: the record path of the cell a finished search measures, the target
  offline-batch runs after a search folder.

It reads records, searches and the resume ledger; nothing of llmbench's measuring layers
reads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import cells, techniques
from .. import estimate as lbestimate
from ..record import repeat_timing
from ..search.runner import measured_batch, measured_record, read_json


def whole_s(seconds: float) -> int:
    """Whole seconds, rounded up, that an estimate asks for: a product of floats that lands a
    hair above an integer (0.1 x 200) is that integer, not one more."""
    return math.ceil(round(seconds, 6))


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
    untimed_need_s: float | None = None
    """The seconds left the cell's own deadline check wants before a repeat where none of its
    repeats is timed: its predicted repeat times llmbench.estimate.DEADLINE_MARGIN, at most its
    timeout (llmbench.ledger.deadline_stop); None where the throughput model does not predict it
    or repeats of it are kept (then they decide)."""

    @property
    def left(self) -> int:
        """The repeats still to run."""
        return max(self.repeats - self.kept, 0)

    @property
    def start_s(self) -> int:
        """The seconds left that envs/offline-batch.sh wants before it starts the cell: a
        repeat plus 20 s, a probe's estimate of a repeat taken 1.25 times first (how the
        committed cells' wall times compare with the estimate: docs/offline-gpu-nodes.md, what a
        target is estimated at), an earlier record's estimate or a kept or a stopped repeat's time
        ledger.REPEAT_MARGIN times (what the cell's own deadline check wants of them: offline-batch
        gives the cell a probe's or a record's estimate, ledger.REPEAT_VAR; so that it starts no
        cell that stops at once). A call shorter than this never starts the
        cell, as a cell stops only between repeats. A cell whose repeats are all kept runs none: 20 s."""
        from ..ledger import REPEAT_MARGIN

        repeat = whole_s(self.repeat_s) if self.left else 0
        if self.source == "probe":
            repeat = repeat * 5 // 4
        elif self.source != PREDICTED_SOURCE:  # kept, stopped, or an earlier record's path
            repeat = whole_s(repeat * REPEAT_MARGIN)
        if self.source == PREDICTED_SOURCE and self.untimed_need_s is not None:
            # what the cell's own check wants before an untimed repeat: else it would stop at once
            repeat = max(repeat, whole_s(self.untimed_need_s))
        return repeat + 20


#: Estimate.source where a stopped repeat's time is the estimate
STOPPED_SOURCE = "stopped"
#: Estimate.source where the throughput model's predicted repeat is the estimate (llmbench.estimate)
PREDICTED_SOURCE = "predicted"
#: Estimate.source where the longest kept repeat's time is the estimate
KEPT_SOURCE = "kept"


def estimate_s(target: Path | str, configfile: Path | str, earlier: Sequence[Path | str] = ()) -> Estimate | None:
    """How long the cell of record ``target`` should take a repeat, per the cell's protocol
    (``configfile``'s grid): the set-up (wall time less timed window) of a run of the same
    cell plus its seconds a step times the cell's warm-up and measured steps. The run read
    is the max-batch search's probe at that batch beside ``target`` where one ran (one the
    frontier answered keeps no timing), else the record of the cell with the most measured
    steps in the results folders ``earlier`` (any protocol: a sweep's 3 + 10 steps tell a
    protocol rerun's 30 + 100). A repeat of the cell with those steps that a signal stopped
    unfinished beside ``target`` (llmbench.ledger.STOPPED: a deadline the estimate missed) is
    the estimate where it ran longer (source ``stopped``). Where none of these is there, the
    throughput model's predicted repeat (llmbench.estimate.repeat; source ``predicted``), and
    None where it cannot predict the cell or the config has no such cell. The repeats of this very spec an earlier run kept beside
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

    predicted = lbestimate.repeat(cell, grid.models.get(cell.model))
    untimed = predicted.bound_s(lbestimate.DEADLINE_MARGIN) if predicted.predicted and not walls else None

    def estimate(repeat_s: float, source: str) -> Estimate:
        # a kept out-of-memory repeat ended the cell: none is left to run
        done = cell.protocol.repeats if any(k["outcome"]["status"] != "ok" for k in kept.values()) else len(kept)
        return Estimate(repeat_s=repeat_s, repeats=cell.protocol.repeats, source=source, kept=done,
                        untimed_need_s=untimed)

    found = None
    if walls:  # repeats of this very cell: they, not a probe's or another run's figure
        found = estimate(max(walls), KEPT_SOURCE)
    else:
        timing, source = None, "probe"
        for root in (parsed.root, *earlier):  # the search beside it, or one an earlier folder holds
            probe = read_json(Path(root) / cells.PROBE_RECORD_PATTERN.format(**parsed.wildcards))
            if probe is not None and (timing := repeat_timing(probe)) is not None:
                break
        if timing is None:
            paths = [Path(d) / cells.RECORD_PATTERN.format(**parsed.wildcards) for d in earlier]
            runs = [(path, read_json(path)) for path in paths]
            timed = [(tm, str(path)) for path, rec in runs if rec is not None and (tm := repeat_timing(rec)) is not None]
            if timed:
                timing, source = max(timed, key=lambda found: found[0][3])  # the most measured steps
        if timing is not None:
            setup, window, run_steps, _ = timing
            found = estimate(setup + window / run_steps * steps, source)
        elif predicted.predicted:  # nothing of the cell ran: the throughput model's figure
            found = estimate(predicted.predicted_s, PREDICTED_SOURCE)
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
    """(wildcards, repeat_timing, sequence length, path) of each ok record and probe in ``earlier``
    that ``key`` (cells.RECORD_PATTERN's wildcards, ``*`` for any) matches."""
    for d in earlier:
        for pattern in (cells.RECORD_PATTERN, cells.PROBE_RECORD_PATTERN):
            for path in Path(d).glob(pattern.format(**key)):
                ref, rec = cells.parse(str(path), (pattern,)), read_json(path)
                if ref is None or rec is None or (timing := repeat_timing(rec)) is None:
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
            out.append((target, whole_s(est[0]), f"a search: {est[1]}"
                        + _start_clause(est[2], call_s, "its cell at that batch ", "will want")))
            continue
        est = estimate_s(target, configfile, earlier)
        if est is None:
            out.append((target, None, "no probe at its batch nor an earlier record of the cell"))
        else:
            repeat = whole_s(est.repeat_s)  # whole seconds, as estimate prints it
            kept = f"; {est.kept} of {est.repeats} repeats kept beside it" if est.kept else ""
            out.append((target, repeat * est.left, f"{est.left} x {repeat} s from {est.source}{kept}"
                        + _start_clause(est, call_s, "", "wants")))
    return out


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a schedule: the cells it runs repeats of, in order."""

    ran: tuple[tuple[str, int, int], ...]
    """(target, repeats run in this call, repeats the cell has left after it), in list order."""
    used_s: float
    """Seconds of the call those repeats take (estimates)."""


def schedule(targets: Sequence[str], configfile: Path | str, call_s: int, earlier: Sequence[Path | str] = (),
             skip_recorded: Sequence[Path | str] = ()) -> tuple[list[Call], list[tuple[str, str]]]:
    """The calls of ``call_s`` seconds a target list should take, the list given again to
    every call as envs/offline-batch.sh wants it: its rules played on the cells' estimates
    (estimate_s). In a call, a cell starts where the time left holds Estimate.start_s (with
    repeats of it kept from an earlier call: ledger.REPEAT_MARGIN times a repeat, plus 20 s),
    else the list goes on; inside its job, a repeat starts where the time left exceeds
    REPEAT_MARGIN times a repeat (before any is timed, a predicted cell's untimed_need_s, the
    job's own check: llmbench.ledger); a job stopped there, the list goes on with the time
    left. A repeat takes its estimate; a call's set-up (wheels, op build), Snakemake's
    start per target and the job's deadline slack are not counted, so the figure is a lower
    bound where the estimates hold. Returns the calls, and (target, why) for each target it
    leaves out: recorded in ``skip_recorded``, a search (its probes are not known before it
    runs), no estimate, or no call of ``call_s`` starting it."""
    from ..ledger import REPEAT_MARGIN

    cells_left: list[tuple[str, Estimate]] = []
    left_out: list[tuple[str, str]] = []
    for target in targets:
        found = recorded_in(target, skip_recorded)
        if found is not None and found[0] == "skip":
            left_out.append((target, f"already recorded in {found[1]}"))
            continue
        if found is not None:
            target = found[1]
        est = estimate_s(target, configfile, earlier) if target.endswith(".json") else None
        if est is None:
            left_out.append((target, "a search: its probes are not known before it runs" if not target.endswith(".json")
                             else "no probe at its batch nor an earlier record of the cell"))
        elif est.left:
            cells_left.append((target, est))
    repeats = {target: est.left for target, est in cells_left}
    timed = {target: est.kept > 0 or est.source != PREDICTED_SOURCE for target, est in cells_left}
    calls: list[Call] = []
    while any(repeats.values()):
        left, ran = float(call_s), []
        for target, est in cells_left:
            if not repeats[target]:
                continue
            # resumed with repeats an earlier call kept: timed by them, as a kept source is
            need = est.start_s if repeats[target] == est.left else whole_s(whole_s(est.repeat_s) * REPEAT_MARGIN) + 20
            if left < need:
                continue
            n = 0
            while repeats[target]:
                job_need = REPEAT_MARGIN * est.repeat_s if timed[target] else (est.untimed_need_s or 0.0)
                if not left > job_need:  # the job stops between repeats; the list goes on
                    break
                left -= est.repeat_s
                repeats[target] -= 1
                timed[target] = True
                n += 1
            if n:
                ran.append((target, n, repeats[target]))
        if not ran:
            break
        calls.append(Call(ran=tuple(ran), used_s=call_s - left))
    left_out += [(target, f"{NEVER_STARTS} of {call_s} s (with {repeats[target]} of its repeats left)")
                 for target, _ in cells_left if repeats[target]]
    return calls, left_out
