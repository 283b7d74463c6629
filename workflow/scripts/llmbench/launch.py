"""Launcher: one cell, each repeat in its own process group, exit -> status, -> Record.

Each repeat runs ``torchrun --standalone --nproc-per-node <gpus> -m <worker>`` (one rank:
``python -m <worker>`` with the environment torchrun gives a rank, see ``rank_launch``) in a
new session behind a leash (llmbench.procs.start_group), so the whole group (torchrun and
every rank) can be stopped together: on a timeout, on a per-rank memory cap, or when this
process is told to stop (Snakemake cancelling the job, Ctrl-C); and it dies with this
process, also when this process is killed by SIGKILL. A cell over several nodes runs
``srun`` instead, one torchrun per node with a c10d rendezvous (llmbench.nodes), in the
same process group. On a platform with ``fork_server`` the ranks are
forked instead from a server that has the heavy imports done (llmbench.forkserver), in a
new session too, with the same classification (start_ranks). Status is data:
  ok       every repeat wrote its result
  oom      a rank reported an out-of-memory error, exceeded the cell's mem_cap_gib
           (killed by the watchdog) or was killed by SIGKILL while the kernel's OOM killer ran
           (its kill count, procs.oom_kills, went up); a SIGKILL without it is an error
  timeout  a repeat ran past protocol.timeout_s
  error    anything else (the reason and log tail say what)
  skipped  with ``skip_predicted_oom``, a cell the memory model (llmbench.memory) predicts
           not to fit: nothing runs; the record keeps the prediction and the margin

The cells of a paired set (llmbench.grid.paired) run in one job, their repeats interleaved
round by round, and their records are written together at its end (run_set; run_cell is a
set of one cell). Every record says when each repeat started and on which machine it was
made (llmbench.provenance.machine); a set's records also name the set and the order it ran in.

A cell of several repeats (or of a set) keeps each ok repeat beside its record until the
record is written, and a job stops between repeats where the next would not finish by its
deadline (``LLMBENCH_DEADLINE``, or a Slurm job's time limit): that resume ledger (kept
repeats, the stopped-repeat marker, the deadline) is llmbench.ledger's; this module runs
the repeats it says to run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import backends, estimate, forkserver, gpus, nodes, provenance
from .aggregate import Outcome
from .cells import Cell
from .ledger import (KEPT_STATUSES, REPEAT_MARGIN, REPEAT_VAR, deadline_from_env, deadline_stop, forget, keep_repeat,
                     keep_stopped, kept_repeats, kept_started, repeat_from_env, set_aside, set_aside_repeats,
                     stop_at_deadline, stopped_repeat)
from .procs import (RssWatchdog, free_port, kill_group, last_error, oom_kills, says_oom, start_group, stop_group,
                    stop_groups_on_signal, tail, track)
from .record import Record, write
from .spec import RunSpec
from .train import jit_ops

#: Thread-count variables of the BLAS/OpenMP runtimes (Snakemake sets them to a job's threads)
THREAD_VARS = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")



def worker_env(platform_env: dict[str, str], threads: int, ranks: int) -> dict[str, str]:
    """The environment of a worker process: the platform's variables, threads per rank,
    DeepSpeed's op cache, and PYTHONPATH to the llmbench of this checkout.

    Threads per rank = the job's threads / ranks, set over what the environment holds:
    Snakemake exports the job's whole thread count, and every rank taking all of it put
    4 threads on 2 cores (a 2-rank CPU cell ran at 24% scaling efficiency). A platform
    file that sets a thread variable itself wins."""
    env = {**os.environ, **platform_env}
    for var in THREAD_VARS:
        if var not in platform_env:
            env[var] = str(max(1, threads // ranks))
    jit_ops.op_env(env)  # the op folder and the ninja jit_ops.build builds with
    env["PYTHONUNBUFFERED"] = "1"
    # workers run in a scratch folder: the config's relative paths (engine_python) are
    # relative to the directory the launcher ran in
    env["LLMBENCH_LAUNCH_DIR"] = os.getcwd()
    # workers import llmbench from this checkout, installed or not
    pkg_parent = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    return env


def rank_env(rank: int, ranks: int, master_port: int) -> dict[str, str]:
    """The variables torchrun --standalone gives a rank of a one-node job."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(ranks), "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)}


def rank_launch(ranks: int, module: str, args: list[str]) -> tuple[list[str], dict[str, str]]:
    """The argument list that execs ``module`` with ``args`` on ``ranks`` local processes, and
    the variables it needs besides the worker environment.

    Several ranks: torchrun --standalone. One rank: the module itself, with the variables
    torchrun would give its only rank. torchrun's own process (an interpreter importing
    torch, ~2 s of a CPU) bought nothing there, and the embedded default starts ~70 of them."""
    if ranks > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                "-m", module, *args], {}
    return [sys.executable, "-m", module, *args], rank_env(0, 1, free_port())


def worker_args(spec_path: Path, out: Path, *extra: str) -> list[str]:
    """A worker's arguments (llmbench.train.contract)."""
    return ["--spec", str(spec_path), "--out", str(out), *extra]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a repeat of a cell over several nodes runs: the allocation, and what its srun
    and torchrun need (llmbench.nodes)."""

    alloc: nodes.Allocation
    rdzv_id: str
    cpus_per_node: int
    join_timeout_s: int


def start_ranks(ranks: int, module: str, args: list[str], *, env: dict[str, str], log: Path, workdir: Path,
                fork_server: str | None = None, placement: Placement | None = None) -> tuple[Any, str]:
    """Start ``ranks`` processes of worker ``module`` in one new session; returns the process
    that leads it (Popen or forkserver.Forked) and how it was started.

    ``placement``: the ranks span its nodes, ranks / nodes on each, started by srun.
    ``fork_server`` (forkserver.server_for: the platform's accelerator where its key is set,
    not under Slurm; None: exec): fork the ranks from a server for that accelerator that has
    torch, DeepSpeed and transformers imported. If that server cannot be had, the log says
    why and the ranks are exec'ed as without it."""
    if placement is not None:
        alloc = placement.alloc
        argv = nodes.srun_argv(alloc, ranks // len(alloc.hostnames), module, args,
                               port=free_port(alloc.host), rdzv_id=placement.rdzv_id,
                               cpus_per_node=placement.cpus_per_node, join_timeout_s=placement.join_timeout_s)
        return start_group(argv, env=env, log=log, cwd=workdir), "srun"
    if fork_server:
        try:
            port = free_port()
            proc = forkserver.launch(module, args, [{**env, **rank_env(r, ranks, port)} for r in range(ranks)],
                                     cwd=workdir, log=log, server_env=env, accelerator=fork_server)
            track(proc)
            return proc, "fork server"
        except forkserver.Unavailable as exc:
            with open(log, "a") as fh:
                fh.write(f"=== fork server unavailable, exec instead: {exc}\n")
    argv, rank_vars = rank_launch(ranks, module, args)
    return start_group(argv, env={**env, **rank_vars}, log=log, cwd=workdir), "exec"


def run_worker(ranks: int, module: str, args: list[str], *, env: dict[str, str], log: Path, workdir: Path,
               out: Path, timeout_s: float, mem_cap_gib: float | None = None, label: str = "run",
               fork_server: str | None = None, placement: Placement | None = None) -> Outcome:
    """Run a worker's ranks in their own process group (start_ranks) and classify how it ended.

    Contract: the worker writes ``out`` (JSON) on success; a rank that runs out of memory
    may write ``<out>.oom.rank<r>`` with the message. Over several nodes (``placement``)
    ``workdir`` must be on a file system every node sees, and the log tail is each node's.
    """
    with open(log, "a") as fh:
        fh.write(f"\n=== {label}\n")
    start = log.stat().st_size
    kills_before = oom_kills()
    proc, launcher = start_ranks(ranks, module, args, env=env, log=log, workdir=workdir, fork_server=fork_server,
                                 placement=placement)
    try:
        outcome = _classify(proc, log=log, workdir=workdir, out=out, timeout_s=timeout_s,
                            mem_cap_gib=mem_cap_gib, label=label, sigkill_is_oom=placement is None,
                            oom_kills_before=kills_before)
    finally:
        if placement is not None:
            left = nodes.cancel_step(placement.alloc, placement.rdzv_id)
            if left:
                with open(log, "a") as fh:
                    fh.write(f"=== cancelled Slurm step(s) still listed after srun ended: {' '.join(left)}\n")
    if placement is not None:
        outcome.nodes = placement.alloc.hostnames
        if outcome.status != "ok":  # what each node said, not the interleaved last lines
            with open(log, errors="replace") as fh:
                fh.seek(start)
                text = fh.read()
            outcome.log_tail = nodes.node_tails(text, placement.alloc.hostnames)
            if outcome.status == "error" and (first := nodes.first_failure(text)):
                outcome.reason = f"{label}: first failure: {first}; {outcome.reason}"
    outcome.launcher = launcher
    return outcome


def _classify(proc, *, log: Path, workdir: Path, out: Path, timeout_s: float, mem_cap_gib: float | None,
              label: str, sigkill_is_oom: bool = True, oom_kills_before: int | None = None) -> Outcome:
    """Wait for a started worker (timeout, memory cap) and say how it ended.

    On one node a rank killed by SIGKILL is an OOM if the kernel's OOM killer ran meanwhile
    (its kill count went up from ``oom_kills_before``), and an error if it did not: somebody
    else killed it. Where the count cannot be read, SIGKILL is taken for the OOM killer, its
    usual sender, and the reason says so. Over several nodes (``sigkill_is_oom`` False) a
    SIGKILL is no OOM at all: srun reports any task killed by a signal, for any reason, and a
    node's OOM is said in the log (Slurm's oom-kill event, a worker's OOM message or marker
    file). A repeat forked by a fork server that went away while it ran has no exit code: an
    error that says so (and whether the OOM killer ran), never a result."""
    dog = None
    if mem_cap_gib:
        dog = RssWatchdog(proc, mem_cap_gib * 2**30)
        dog.start()
    try:
        rc = proc.wait(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc)
        rc, timed_out = proc.returncode, True
    finally:
        if dog:
            dog.stop()
        stop_group(proc)  # no orphan rank survives its torchrun
    log_tail_text = tail(log)
    ooms = sorted(workdir.glob(f"{out.name}.oom.rank*"))
    if timed_out:
        return Outcome(status="timeout", reason=f"{label} ran past timeout_s={timeout_s}", log_tail=log_tail_text)
    if dog and dog.fired:
        return Outcome(status="oom", reason=dog.fired, log_tail=log_tail_text)
    if ooms:
        return Outcome(status="oom", reason=ooms[0].read_text(), log_tail=log_tail_text)
    if rc == 0 and out.exists():
        return Outcome(status="ok", result=json.loads(out.read_text()))
    if says_oom(log_tail_text):
        return Outcome(status="oom", reason="out-of-memory error in the log", log_tail=log_tail_text)
    if sigkill_is_oom and ("Signal 9 (SIGKILL)" in log_tail_text or rc in (-9, 137)):
        after = oom_kills()
        if oom_kills_before is None or after is None:
            return Outcome(status="oom", reason="a rank was killed by SIGKILL (the kernel's OOM killer is the usual "
                           "sender; its kill count, /proc/vmstat oom_kill, could not be read)", log_tail=log_tail_text)
        if after > oom_kills_before:
            return Outcome(status="oom", reason="host out of memory: a rank was killed by SIGKILL while the kernel's "
                           f"OOM killer ran (/proc/vmstat oom_kill {oom_kills_before} -> {after})", log_tail=log_tail_text)
        return Outcome(status="error", reason=f"{label}: a rank was killed by SIGKILL, not by the kernel's OOM killer "
                       f"(/proc/vmstat oom_kill stayed at {after})", log_tail=log_tail_text)
    if isinstance(proc, forkserver.Forked) and rc == forkserver.LOST:
        after = oom_kills()
        killer = (f"; the kernel's OOM killer ran meanwhile (/proc/vmstat oom_kill {oom_kills_before} -> {after})"
                  if None not in (oom_kills_before, after) and after > oom_kills_before else "")
        return Outcome(status="error", reason=f"{label}: its fork server went away while it ran, so its exit code is "
                       f"unknown{killer}: {last_error(log)}", log_tail=log_tail_text)
    return Outcome(status="error", reason=f"{label} exited with code {rc}: {last_error(log)}", log_tail=log_tail_text)


def run_repeat(spec: dict, workdir: Path, index: int, log: Path, threads: int,
               keep_dir: Path | None = None, alloc: nodes.Allocation | None = None) -> Outcome:
    """Run one repeat of a training cell (``rank_launch``; over ``alloc``'s nodes for a cell
    of several) in its own session. ``spec`` is the cell's spec as JSON (RunSpec.raw): the
    process boundary, written for the worker, which parses it at its start. A profile
    cell's worker writes its Chrome trace into ``keep_dir`` (the record's folder)."""
    parsed = RunSpec.parse(spec)
    cell = parsed.cell
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    out = workdir / f"repeat-{index}.json"
    extra = ("--trace-dir", str(keep_dir)) if cell.stage == "profile" and keep_dir else ()
    placement = None
    if alloc is not None:
        placement = Placement(alloc=alloc, rdzv_id=f"{alloc.job_id}-{workdir.name.lstrip('.')}-r{index}", cpus_per_node=threads,
                              join_timeout_s=min(600, cell.protocol.timeout_s))
    return run_worker(cell.gpus, backends.get(cell.backend).worker, worker_args(spec_path, out, *extra),
                      env=worker_env(parsed.platform.env, threads, cell.ranks_per_node), log=log, workdir=workdir,
                      out=out, timeout_s=cell.protocol.timeout_s, mem_cap_gib=cell.mem_cap_gib, label=f"repeat {index}",
                      fork_server=None if alloc else forkserver.server_for(parsed.platform.to_dict()),
                      placement=placement)


def searched_fit(spec: RunSpec, record_path: Path) -> dict[str, Any] | None:
    """What a max-batch search's probe showed at this cell's batch, where one ran it without
    running out of memory (the frontier file of the record's results folder, for the same
    memory fingerprint: llmbench.search.frontier), else None."""
    from .cells import FRONTIER_PATTERN, parse
    from .search.frontier import Frontier, fingerprint

    parsed = parse(str(record_path))
    if parsed is None:
        return None
    cell = spec.cell
    path = Path(parsed.root or ".") / FRONTIER_PATTERN.format(**cell.key)
    return Frontier.load(path, fingerprint(spec)).known_fit(cell.batch_size)


def predicted_oom_record(spec: RunSpec, record_path: Path, log: Path, started: str,
                         command: list[str]) -> Record | None:
    """Where the memory model predicts the cell not to fit: its ``skipped`` Record (for the
    caller to write), with the prediction and the margin in its summary (nothing runs);
    else None. A batch a max-batch search's probe ran without running out of memory is not
    skipped: the record wins over the prediction (a search's largest batch sits at the
    margin's edge)."""
    from . import memory

    verdict = memory.check(spec)
    if verdict is None or verdict.fits:
        return None
    if (ran := searched_fit(spec, record_path)) is not None:
        with open(log, "a") as fh:
            fh.write(f"predicted not to fit ({verdict.reason}), but a max-batch search's probe ran this batch at "
                     f"{ran.get('at')} with a peak of {ran['peak_gib']:.3f} GiB: running it\n")
        return None
    reason = (f"skip_predicted_oom: predicted not to fit: {verdict.reason} (llmbench.memory; "
              "--config skip_predicted_oom=false runs it)")
    build = backends.get(spec.cell.backend).build_record()
    record = build(spec, [Outcome(status="skipped", reason=reason)], started, command)
    record = replace(record, summary=verdict.summary())
    with open(log, "a") as fh:
        fh.write(f"skipped: {reason}\n")
    return record


@dataclass(kw_only=True, slots=True)
class _Run:
    """One cell of a set while the set runs (run_set): where it goes, and what it has so far."""

    spec: RunSpec
    record_path: Path
    label: str
    """How the log names it: its record path relative to the results folder in a set; "" alone."""
    threads: int
    keep_dir: Path = field(init=False)
    """Its record's folder: its kept repeats and stopped-repeat marker wait there (llmbench.ledger)."""
    alloc: nodes.Allocation | None = None
    workdir: Path | None = None
    record: Record | None = None
    """Its record where it is settled before any repeat runs (predicted not to fit)."""
    check: gpus.Check | None = None
    kept: dict[int, dict] = field(default_factory=dict)
    walls: list[float] = field(default_factory=list)
    """Seconds the repeats of this spec took so far (run here, kept, or a lower bound: a
    repeat stopped unfinished)."""
    later_walls: list[float] = field(default_factory=list)
    """Those of ``walls`` that followed another repeat of the cell in their job (or a lower
    bound: a repeat stopped unfinished): what a repeat after this job's first is judged by
    (llmbench.ledger)."""
    ran_here: int = 0
    """Repeats of the cell this job ran (not kept ones)."""
    predicted_s: float | None = None
    """Seconds a repeat is predicted to need at the deadline, margin included (llmbench.estimate,
    read only where the job has a deadline); None where the throughput model cannot predict it."""
    outcomes: list[Outcome] = field(default_factory=list)
    started: list[str | None] = field(default_factory=list)
    """When each of its repeats started (ISO; a kept one's as its earlier run wrote it)."""

    def __post_init__(self) -> None:
        self.keep_dir = self.record_path.parent.absolute()  # workers run in a temporary cwd

    @property
    def cell(self) -> Cell:
        """The cell (its spec's)."""
        return self.spec.cell

    @property
    def done(self) -> bool:
        """It needs no further repeat: settled, every repeat run, or one not ok (a refused check's too)."""
        return (self.record is not None or len(self.outcomes) >= self.cell.protocol.repeats
                or any(o.status != "ok" for o in self.outcomes))


def run_cell(spec: RunSpec | dict, record_path: Path, log: Path, threads: int = 1,
             gpu_busy: gpus.BusyPolicy | None = None, skip_predicted_oom: bool = False) -> Record:
    """Run every repeat of a cell (stopping at the first that is not ok) and write its Record:
    run_set of one cell, without a set. ``spec``: its RunSpec, or its JSON form."""
    return run_set([spec], [record_path], log, threads, gpu_busy, skip_predicted_oom)[0]


def run_set(specs: Sequence[RunSpec | dict], record_paths: Sequence[Path], log: Path, threads: int | Sequence[int] = 1,
            gpu_busy: gpus.BusyPolicy | None = None, skip_predicted_oom: bool = False,
            plan: dict[str, Any] | None = None) -> list[Record]:
    """Run the cells of a paired set together and write their Records, all at the end, so
    that a set's records are either all there or none is (``plan``: llmbench.grid.paired's
    PairedSet.plan; without one, the cells are no set: run_cell). ``specs``: the cells' run
    specs (llmbench.spec.RunSpec, or their JSON form), each parsed once here.

    Round r runs repeat r of every cell that still needs one, in the round's order
    (``plan["rounds"][r]``, the cells' indices), each repeat a process of its own
    (run_repeat); a cell whose repeat is not ok runs no more, the others go on. ``threads``:
    the threads of every cell, or each cell's (what it holds when it runs alone). Nothing runs
    on busy GPUs (``gpu_busy``: what to do then, llmbench.gpus), nor, with
    ``skip_predicted_oom``, a cell the memory model predicts not to fit. Raises DeadlineStop,
    writing no record, where a cell's next repeat would not finish by the job's deadline
    (``LLMBENCH_DEADLINE``, llmbench.ledger; a cell not timed yet is judged by the repeat its
    caller timed, ``LLMBENCH_REPEAT_S``, in a job of one cell, else by its predicted repeat,
    llmbench.estimate, and one the throughput model cannot predict by the set's repeats so
    far): the finished repeats are kept, and the next run of the same cells resumes at the
    same place of the same order (on another machine, a round stopped part-way is run whole
    again: _rejoin_split_rounds).

    Every record's provenance gets ``repeat_started`` (when each repeat started) and
    ``machine`` (llmbench.provenance.machine); a set's records ``paired_set`` too: its
    ``id``, its ``cells`` (record paths relative to the results folder, in the set's order),
    the ``order`` its rounds ran in (the cells' indices per round, a kept repeat in its
    place), the ``ordering`` rule and its ``seed``."""
    if not specs or len(specs) != len(record_paths):
        raise ValueError(f"run_set: {len(specs)} spec(s) for {len(record_paths)} record path(s)")
    deadline = deadline_from_env()  # a bad value fails here, before anything runs
    # a repeat's time the caller gave, for a job of one cell (a set's cells each differ)
    given_s = repeat_from_env() if len(specs) == 1 else None
    started = datetime.now(UTC).isoformat()
    command = [sys.executable, *sys.argv]
    labels = list(plan["cells"]) if plan else [""]
    runs = [_Run(spec=RunSpec.of(spec), record_path=Path(path), label=label, threads=n)
            for spec, path, label, n in zip(specs, record_paths, labels,
                                            [threads] * len(specs) if isinstance(threads, int) else threads)]
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"paired set {plan['id']}: " + "; ".join(f"cell {i} {r.label}" for i, r in enumerate(runs)) + "\n"
                   if plan else f"cell {runs[0].cell.record_path()}\n")
    if skip_predicted_oom:
        for run in runs:
            run.record = predicted_oom_record(run.spec, run.record_path, log, started, command)
    rounds = plan["rounds"] if plan else [[0]] * runs[0].cell.protocol.repeats
    try:
        with stop_groups_on_signal():
            # the smaller cells' GPUs are checked first: a claim (llmbench.gpus.claim_gpus)
            # lasts until one of another count, so the job ends holding the set's largest
            for run in sorted((r for r in runs if r.record is None), key=lambda r: r.cell.ranks_per_node):
                _prepare(run, gpu_busy, log, deadline, given_s)
            if plan:
                _rejoin_split_rounds(runs, rounds, log)
            order: list[list[int]] = []
            for r, planned in enumerate(rounds):
                order.append([i for i in planned if not runs[i].done])
                for i in order[-1]:
                    _repeat(runs[i], r, deadline, [w for x in runs for w in x.walls], log, keep=len(runs) > 1)
            records = [_record(run, started, command, plan, order) for run in runs]
            for run, record in zip(runs, records):
                write(record, run.record_path)
            for run in runs:  # the records hold them now
                forget(run.keep_dir, run.cell.protocol.repeats)
            return records
    finally:
        for run in runs:
            if run.workdir is not None:
                shutil.rmtree(run.workdir, ignore_errors=True)


def _rejoin_split_rounds(runs: list[_Run], rounds: Sequence[Sequence[int]], log: Path) -> None:
    """A set stopped in the middle of a round and resumed on another machine (boot id): the
    round's kept repeats that ran elsewhere are set aside (llmbench.ledger.set_aside) and run
    again here, so that the round's repeats all run on one machine and the round pairs (a
    round split over two machines pairs nothing, llmbench.report.evidence). What they
    measured stays in their records' provenance (``set_aside_repeats``), not in the numbers.
    Only ok repeats are run again: an out-of-memory one ends its cell wherever it ran."""
    here = provenance.boot_id()
    for r, planned in enumerate(rounds):
        todo = [i for i in planned if r not in runs[i].kept and not runs[i].done
                and not any(runs[i].kept[k]["outcome"].status != "ok" for k in runs[i].kept if k < r)]
        away = [i for i in planned if r in runs[i].kept and runs[i].kept[r].get("boot_id") != here
                and runs[i].kept[r]["outcome"].status == "ok"]
        if not (todo and away):
            continue
        for i in away:
            set_aside(runs[i].keep_dir, r, runs[i].kept.pop(r))
        with open(log, "a") as fh:
            fh.write(f"=== round {r} was stopped part-way on another machine: "
                     + "; ".join(f"{runs[i].label} repeat {r}" for i in away)
                     + " set aside and run again here, so that the round pairs on one machine\n")


def _prepare(run: _Run, gpu_busy: gpus.BusyPolicy | None, log: Path, deadline: float | None = None,
             given_s: float | None = None) -> None:
    """Before a cell's first repeat: its folders, its allocation over several nodes, its GPUs'
    check, the repeats an earlier run of it kept (and how long a stopped one ran), and, where
    the job has a ``deadline``, what an untimed repeat needs: by ``given_s`` (the caller's
    timing of the cell, llmbench.ledger.REPEAT_VAR) where given, else by its predicted
    repeat (llmbench.estimate)."""
    run.keep_dir.mkdir(parents=True, exist_ok=True)
    # a cell over several nodes: its Slurm allocation (no allocation: the job fails, no
    # record), and a work folder every node sees (the results folder is on a shared one)
    run.alloc = nodes.allocation(run.cell.nodes) if run.cell.nodes > 1 else None
    run.workdir = Path(tempfile.mkdtemp(prefix=".llmbench-cell-", dir=run.keep_dir if run.alloc else None))
    # over several nodes: the launcher's node's GPUs (the others' are not read)
    run.check = gpus.check_cell(run.spec, run.cell.ranks_per_node, gpu_busy, log)
    if run.check.refused:
        run.outcomes.append(Outcome(status="error", reason=run.check.refused))
        return
    run.kept = kept_repeats(run.keep_dir, run.spec, run.cell.protocol.repeats, log)
    run.walls = [k["wall_s"] for k in run.kept.values() if k.get("wall_s")]  # the repeats timed so far
    run.later_walls = [k["wall_s"] for k in run.kept.values() if k.get("wall_s") and k.get("job_first") is False]
    if stopped := stopped_repeat(run.keep_dir, run.spec):  # a lower bound on a repeat
        run.walls.append(float(stopped["ran_s"]))
        run.later_walls.append(float(stopped["ran_s"]))
        with open(log, "a") as fh:
            fh.write(f"=== {run.label + ': ' if run.label else ''}repeat {stopped['index']} of an earlier run was "
                     f"stopped unfinished after {float(stopped['ran_s']):.0f} s ({stopped['stopped']}): counted as "
                     "a repeat's time at the deadline\n")
    if deadline is not None:
        run.predicted_s = _predicted_s(run, log, given_s)


def _predicted_s(run: _Run, log: Path, given_s: float | None = None) -> float | None:
    """What a repeat of ``run``'s cell is predicted to need at the deadline, said in the log:
    ``given_s`` (the caller's timing of the cell) times ledger.REPEAT_MARGIN where given, else
    its predicted duration times estimate.DEADLINE_MARGIN (estimate.repeat); at most its
    timeout. None where neither is there (the throughput model cannot predict the cell)."""
    name = f"{run.label}: " if run.label else ""
    if given_s is not None:
        need = min(REPEAT_MARGIN * given_s, float(run.cell.protocol.timeout_s))
        with open(log, "a") as fh:
            fh.write(f"=== {name}a repeat was timed at {given_s:.0f} s by the job's caller ({REPEAT_VAR}: a probe "
                     f"or an earlier record of the cell); untimed here, it starts only with {need:.0f} s left "
                     f"(x {REPEAT_MARGIN}{', capped at its timeout' if need < REPEAT_MARGIN * given_s else ''})\n")
        return need
    est = estimate.repeat(run.cell, run.spec.model)
    with open(log, "a") as fh:
        if not est.predicted:
            fh.write(f"=== {run.label + ': ' if run.label else ''}no predicted repeat ({est.note})\n")
            return None
        need = est.bound_s(estimate.DEADLINE_MARGIN)
        fh.write(f"=== {run.label + ': ' if run.label else ''}a repeat is predicted at {est.predicted_s:.0f} s "
                 f"({est.note}); untimed, it starts only with {need:.0f} s left (x {estimate.DEADLINE_MARGIN}"
                 f"{', capped at its timeout' if need < estimate.DEADLINE_MARGIN * est.predicted_s else ''})\n")
    return need


def _repeat(run: _Run, i: int, deadline: float | None, set_walls: list[float], log: Path, keep: bool) -> None:
    """Repeat ``i`` of a cell: the one an earlier run kept, or run now, unless the deadline
    comes first (DeadlineStop). ``keep``: keep it even where the cell has one repeat (a set's
    records are written at its end). Judged by the cell's own repeats so far (one after this
    job's first, by those that followed another in their job where one has), else by its
    prediction, else by ``set_walls``: the set's repeats so far."""
    name = f"{run.label}: " if run.label else ""
    if i in run.kept:
        outcome, started = run.kept[i]["outcome"], kept_started(run.kept[i])
    else:
        repeats = run.cell.protocol.repeats
        walls, timed = run.walls or ([] if run.predicted_s is not None else set_walls), "the longest so far"
        if run.ran_here and run.later_walls:  # this job's start-up is paid: later repeats say what one takes
            walls, timed = run.later_walls, "the longest after its job's first so far"
        if why := deadline_stop(deadline, walls, f"{name}repeat {i} (of 0-{repeats - 1})", run.predicted_s, timed):
            stop_at_deadline(f"{why}; " + (
                "the set's finished repeats are kept: the next run of the set resumes there" if run.label else
                f"repeat(s) {sorted({*range(i), *run.kept})} kept: the next run of this cell resumes there"),
                log, mark="=== ")
        if run.label:
            with open(log, "a") as fh:
                fh.write(f"\n=== {run.label}\n")
        started = datetime.now(UTC).isoformat()
        t0 = time.monotonic()
        try:
            outcome = run_repeat(run.spec.raw, run.workdir, i, log, run.threads, run.keep_dir, run.alloc)
        except (SystemExit, KeyboardInterrupt):  # a signal inside it: a deadline's TERM, a cancel
            keep_stopped(run.keep_dir, i, run.spec, time.monotonic() - t0)
            raise
        run.walls.append(time.monotonic() - t0)
        if run.ran_here:
            run.later_walls.append(run.walls[-1])
        run.ran_here += 1
        # an out-of-memory repeat is a result too (it ends the cell's repeats): a resumed set
        # keeps it rather than running out of memory again
        if outcome.status in KEPT_STATUSES and (repeats > 1 or keep):
            keep_repeat(run.keep_dir, i, run.spec, outcome, wall_s=run.walls[-1], started=started,
                        job_first=run.ran_here == 1)
    run.outcomes.append(outcome)
    run.started.append(started)
    with open(log, "a") as fh:
        fh.write(f"=== {name}repeat {i}: {outcome.status} {outcome.reason}{' (kept)' if i in run.kept else ''}\n")


def _record(run: _Run, started: str, command: list[str], plan: dict[str, Any] | None,
            order: list[list[int]]) -> Record:
    """A cell's Record once its set has run: from its outcomes (or as settled before), with
    the GPU state read at its start, the repeats an earlier run kept, when each repeat
    started, the machine, and its set."""
    record = run.record
    if record is None:
        build = backends.get(run.cell.backend).build_record()  # module-wise rows for profile kinds
        record = gpus.with_state(build(run.spec, run.outcomes, started, command), run.check)
    prov = {**record.provenance, "repeat_started": list(run.started)}
    if run.kept:  # the record says which repeats an earlier run made, where and when
        prov["resumed_repeats"] = [{k: run.kept[i].get(k) for k in ("index", "finished", "hostname", "boot_id",
                                                                      "git_sha")} for i in sorted(run.kept)]
    if aside := set_aside_repeats(run.keep_dir):  # measured, run again on one machine with its round
        prov["set_aside_repeats"] = [{**{k: a.get(k) for k in ("index", "finished", "hostname", "boot_id", "git_sha",
                                                               "wall_s")},
                                      "tokens_per_s": ((a.get("outcome") or {}).get("result") or {}).get("tokens_per_s")}
                                     for a in aside]
    prov["machine"] = provenance.machine(prov)
    if plan:
        prov["paired_set"] = {"id": plan["id"], "cells": list(plan["cells"]), "order": order,
                              "ordering": plan["ordering"], "seed": plan["seed"]}
    return replace(record, provenance=prov)
