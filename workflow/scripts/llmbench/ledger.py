"""What a cell's job leaves for its next run, and when it must stop: the resume ledger.

A cell of several repeats (or a paired set, llmbench.launch.run_set) keeps each ok repeat
beside its record (PARTIAL, ``.repeat-<i>.json``: the outcome with its spec's digest, time,
host and commit; keep_repeat) until the record is written. A cell (a set) stopped between
repeats (a call's or allocation's deadline, a killed job) leaves no record, so the next run
runs it again, and that run keeps the repeats of the very same spec and runs only the rest
(kept_repeats; read_kept reads them without deleting); the record's
``provenance.resumed_repeats`` names the kept ones, where and when they ran (a paired set's
round stopped part-way and resumed on another machine runs whole again: its kept repeats
are set aside, ``set_aside``, and named in ``provenance.set_aside_repeats``). The paper's
protocol (three repeats of 30 + 100 steps) of a slow cell can so span several jobs that are
each shorter than the cell.

A job may carry a deadline, ``LLMBENCH_DEADLINE`` (Unix seconds; envs/offline-batch.sh sets
it to its call's end), and a Slurm job without it has its time limit's end (scontrol's
EndTime, llmbench.nodes.job_end: a cell the Slurm profiles submit) (deadline_from_env): a
repeat is not started where the time left is shorter than REPEAT_MARGIN times the longest
repeat of this cell so far (run here, or kept with its wall time by an earlier run), and a
max-batch search's probe likewise (llmbench.search.runner) (deadline_stop). A job's first
repeat of a cell pays what later ones do not (the fork server's start, the first build's
caches: keep_repeat keeps which it was, ``job_first``), so a repeat that follows another
of the cell in the same job is judged by the longest of such later repeats where one has
run (here or in an earlier job), and by the longest of all until then. A repeat of a cell
that none has timed yet is judged by its predicted duration with its margin (llmbench.estimate:
the throughput model's step time, on the platforms it was calibrated on), or, in a job of one
cell whose caller timed that cell elsewhere, by REPEAT_MARGIN times the caller's figure,
``LLMBENCH_REPEAT_S`` (seconds: envs/offline-batch.sh gives the estimate it started the cell
on, from a max-batch search's probe or the cell's earlier record, llmbench.offline), as a
repeat kept from an earlier job is (repeat_from_env): a run of the very cell, where the
model's figure is a fit over many, and the check the caller made before starting the cell is
then the one the cell makes. The job then
stops between repeats with DeadlineStop (no record, its finished repeats kept; the Snakemake
adapters exit with DEADLINE_EXIT's line, which envs/offline-batch.sh reads), instead of being
killed inside a repeat that could not finish, which is GPU time spent on nothing. With neither a
repeat timed nor a prediction, the first starts. A repeat stopped inside by a signal (the TERM of a
deadline the estimate missed, a cancel) leaves how long it ran beside the record (STOPPED,
keep_stopped) until the record is written: a lower bound on a repeat of that spec, which the
next run's deadline check counts as a repeat's time, so that it is not started again into the
same deadline (stopped_repeat; a planner of lent calls reads it too).

The launcher writes and reads this ledger; it knows nothing of who gave the deadline.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import NoReturn

from . import nodes, provenance
from .aggregate import Outcome
from .record import write_json_atomic
from .spec import RunSpec, raw_of

#: A finished repeat kept beside its record until the record is written (llmbench.launch.run_set).
PARTIAL = ".repeat-{index}.json"
#: A repeat stopped unfinished by a signal: how long it ran (keep_stopped; module docstring)
STOPPED = ".stopped-repeat.json"
#: A kept repeat of a paired set's round run again on another machine (set_aside): what it
#: measured stays for the record's provenance, not for its numbers
SET_ASIDE = ".set-aside-{index}-{boot}.json"
#: The job's deadline, Unix seconds (module docstring)
DEADLINE_VAR = "LLMBENCH_DEADLINE"
#: A repeat starts only where the time left is at least this times the longest repeat so far
REPEAT_MARGIN = 1.2
#: Seconds a repeat of the job's cell took where it ran before, given by the job's caller (module docstring)
REPEAT_VAR = "LLMBENCH_REPEAT_S"
#: The line a Snakemake adapter exits with after DeadlineStop (envs/offline-batch.sh reads it)
DEADLINE_EXIT = "llmbench: stopped at the deadline: {target}: {why}"


class DeadlineStop(RuntimeError):
    """A job stopped between repeats (or probes): the next would not finish by the deadline."""


def deadline_from_env(environ=os.environ) -> float | None:
    """The job's deadline: ``LLMBENCH_DEADLINE`` (Unix seconds), else, inside a Slurm job,
    the job's end (llmbench.nodes.job_end: its time limit), else None."""
    value = environ.get(DEADLINE_VAR, "").strip()
    if not value:
        return nodes.job_end(environ)
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{DEADLINE_VAR}={value!r}: not a time in Unix seconds") from None


def repeat_from_env(environ=os.environ) -> float | None:
    """A repeat's seconds the job's caller timed its cell at (``LLMBENCH_REPEAT_S``), else
    None; a value that is no positive number of seconds is a ValueError naming it."""
    value = environ.get(REPEAT_VAR, "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{REPEAT_VAR}={value!r}: not a positive number of seconds")
    return seconds


def deadline_stop(deadline: float | None, walls: list[float], what: str,
                  predicted_s: float | None = None, timed: str = "the longest so far") -> str | None:
    """Why ``what`` (a repeat, a search's probe) must not start before ``deadline`` (Unix
    seconds): the time left is under REPEAT_MARGIN times the longest of ``walls`` (the same
    kind of run timed so far; ``timed`` says which, in the reason); with none timed, under
    ``predicted_s`` (what it is predicted to need, its margin included: llmbench.estimate);
    or none is left at all. None where it may start: with neither a timing nor a
    prediction, whenever time is left."""
    if deadline is None:
        return None
    left = deadline - time.time()
    if walls:
        need, took = REPEAT_MARGIN * max(walls), f"{timed} took {max(walls):.0f} s (x {REPEAT_MARGIN})"
    elif predicted_s is not None:
        need, took = predicted_s, f"none timed yet, it is predicted to need {predicted_s:.0f} s"
    else:
        need, took = 0.0, "no time is left"
    if left > 0 and left > need:
        return None
    return f"stopped before {what} at the deadline: {max(left, 0):.0f} s left, {took}"


def stop_at_deadline(why: str, log: Path, mark: str = "") -> NoReturn:
    """Say ``why`` in the job's ``log`` (after ``mark``), then raise DeadlineStop."""
    with open(log, "a") as fh:
        fh.write(f"{mark}{why}\n")
    raise DeadlineStop(why)


def spec_digest(spec: RunSpec | dict) -> str:
    """What a kept repeat must match to count for a cell: its whole resolved spec (its JSON form)."""
    return hashlib.sha256(json.dumps(raw_of(spec), sort_keys=True).encode()).hexdigest()


KEPT_STATUSES = ("ok", "oom")
"""The repeats a cell stopped between two keeps: a measurement, or memory that ran out (a
result, the paper's "-", which ends the cell's repeats)."""


def keep_repeat(keep_dir: Path, index: int, spec: RunSpec | dict, outcome: Outcome, wall_s: float | None = None,
                started: str | None = None, job_first: bool | None = None) -> None:
    """Keep an ok (or out-of-memory) repeat beside the cell's record, with when it started
    (``started``, ISO) and finished, where, at which commit and in how many seconds
    (``wall_s``) it ran, and whether it was its job's first repeat of the cell
    (``job_first``; None: not known), so that a cell stopped between repeats (a call's
    deadline, a killed job) resumes with the repeats it has, not from the first. The
    machine's boot id goes with it: lent machines and cluster nodes share hostnames."""
    state = provenance.git_state()
    write_json_atomic(keep_dir / PARTIAL.format(index=index), {
        "spec_sha256": spec_digest(spec), "index": index, "outcome": asdict(outcome), "started": started,
        "finished": datetime.now(UTC).isoformat(), "hostname": socket.gethostname(),
        "boot_id": provenance.boot_id(), "git_sha": state.get("sha"), "wall_s": wall_s, "job_first": job_first})


def read_kept(keep_dir: Path, spec: RunSpec | dict, repeats: int) -> tuple[dict[int, dict], list[Path]]:
    """What keep_repeat kept in ``keep_dir``, read only: the ok and out-of-memory repeats of
    this very spec (index -> what keep_repeat wrote) and the files that do not count (another
    spec's, a changed config or protocol; another status). kept_repeats resumes from the
    first and deletes the second; a planner of lent calls counts the first."""
    digest, kept, stale = spec_digest(spec), {}, []
    for index in range(repeats):
        path = keep_dir / PARTIAL.format(index=index)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("spec_sha256") == digest and data.get("outcome", {}).get("status") in KEPT_STATUSES:
            kept[index] = data
        else:
            stale.append(path)
    return kept, stale


def kept_repeats(keep_dir: Path, spec: RunSpec | dict, repeats: int, log: Path) -> dict[int, dict]:
    """The ok (or out-of-memory) repeats an earlier run of this very spec kept (index -> what
    keep_repeat wrote, its ``outcome`` an Outcome again). A kept repeat of another spec (a changed
    config or protocol) is deleted."""
    found, stale = read_kept(keep_dir, spec, repeats)
    for path in stale:
        path.unlink(missing_ok=True)
    kept = {index: {**data, "outcome": Outcome(**{**data["outcome"], "nodes": tuple(data["outcome"]["nodes"])})}
            for index, data in found.items()}
    if kept:
        here = provenance.boot_id()
        elsewhere = [i for i in sorted(kept) if kept[i].get("boot_id") != here]
        with open(log, "a") as fh:
            fh.write(f"=== resuming: repeat(s) {sorted(kept)} kept from an earlier run of this cell "
                     f"({', '.join(kept[i]['finished'] for i in sorted(kept))})"
                     + (f"; repeat(s) {elsewhere} ran on another machine or boot (boot id), so the spread "
                        "between repeats includes the machines'" if elsewhere else "") + "\n")
    return kept


def keep_stopped(keep_dir: Path, index: int, spec: RunSpec | dict, ran_s: float) -> None:
    """Keep beside the cell's record that its repeat ``index`` ran ``ran_s`` seconds without
    finishing (a signal stopped it), with the spec's digest and its steps a repeat, where,
    when and at which commit; the longest such run of the spec is kept."""
    earlier = stopped_repeat(keep_dir, spec)
    if earlier is not None and earlier["ran_s"] >= ran_s:
        return
    protocol = RunSpec.of(spec).cell.protocol
    write_json_atomic(keep_dir / STOPPED, {
        "spec_sha256": spec_digest(spec), "index": index, "ran_s": round(ran_s, 1),
        "steps": protocol.warmup_steps + protocol.measured_steps,
        "stopped": datetime.now(UTC).isoformat(), "hostname": socket.gethostname(),
        "boot_id": provenance.boot_id(), "git_sha": provenance.git_state().get("sha")})


def stopped_repeat(keep_dir: Path, spec: RunSpec | dict | None = None) -> dict | None:
    """What keep_stopped kept in ``keep_dir``: for ``spec`` only (one of another spec is
    deleted), or, with no spec, whatever is there (read-only: an estimate, which matches
    the steps itself). None where there is none."""
    path = keep_dir / STOPPED
    try:
        data = json.loads(path.read_text())
        float(data["ran_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if spec is not None and data.get("spec_sha256") != spec_digest(spec):
        path.unlink(missing_ok=True)
        return None
    return data


def forget(keep_dir: Path, repeats: int) -> None:
    """Delete what a cell of ``repeats`` repeats kept in ``keep_dir`` (its kept repeats, the
    ones set aside and its stopped-repeat marker): its record, now written, holds them."""
    for index in range(repeats):
        (keep_dir / PARTIAL.format(index=index)).unlink(missing_ok=True)
    for path in keep_dir.glob(SET_ASIDE.format(index="*", boot="*")):
        path.unlink(missing_ok=True)
    (keep_dir / STOPPED).unlink(missing_ok=True)


def set_aside(keep_dir: Path, index: int, kept: dict) -> None:
    """Move kept repeat ``index`` (what keep_repeat wrote, ``kept``) out of the repeats a run
    resumes with, to be run again: a paired set's round that would otherwise span two
    machines (llmbench.launch.run_set). Its file stays, renamed, until the record is written."""
    path = keep_dir / PARTIAL.format(index=index)
    boot = str(kept.get("boot_id") or "unknown")[:8]
    if path.exists():
        path.replace(keep_dir / SET_ASIDE.format(index=index, boot=boot))


def set_aside_repeats(keep_dir: Path) -> list[dict]:
    """The repeats set_aside moved out of ``keep_dir``'s kept ones (what keep_repeat wrote),
    by index then finish time."""
    out = []
    for path in keep_dir.glob(SET_ASIDE.format(index="*", boot="*")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: (d.get("index", 0), str(d.get("finished"))))


def kept_started(kept: dict) -> str | None:
    """When a kept repeat started: as keep_repeat wrote it, else its end less its wall time."""
    if kept.get("started"):
        return kept["started"]
    try:
        return (datetime.fromisoformat(kept["finished"]) - timedelta(seconds=float(kept["wall_s"]))).isoformat()
    except (KeyError, TypeError, ValueError):
        return None
