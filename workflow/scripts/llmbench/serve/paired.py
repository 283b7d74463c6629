"""A paired set of serving cells (llmbench.grid.paired): its cells run in one job on one
machine, round by round as the set's plan orders them, each with a fresh engine started on
127.0.0.1 and always stopped (llmbench.serve.bench.measure), and their Records are written
together at the end, so that a set's records are either all there or none is. A set that
shares engines (``share_engine``) serves the consecutive runs of one launch in a round from
one engine (llmbench.serve.bench.EngineSession), stopped after the last of them; its runs'
times exclude the engine's start, which the deadline check adds where a run opens an engine.

A serving point's runs (loads ``<point>-1``, ``<point>-2``, ...) are its repeats: round r
runs run r+1 of every point, so two engines alternate burst after burst. As for a training
cell's repeats (llmbench.launch.run_set), a point whose run is not ok runs no more: its
later runs get a ``skipped`` record that names the run that failed, and the other points go
on. A finished ok run is kept beside its record (KEPT, with its spec's digest) until the set
is written; a set stopped at the job's deadline (``LLMBENCH_DEADLINE``, llmbench.ledger:
no run starts where the time left is under REPEAT_MARGIN times the longest run of its point
so far, or of the set's where the point has none) writes no record, and its next run keeps
the runs of the very same specs and runs the rest, in the same order. A kept run's engine log
is kept beside it too (KEPT_SERVER_LOG) and put back in its place when the set resumes:
Snakemake empties a job's logs before it runs the job again.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import gpus, provenance
from ..aggregate import Outcome, provenance_of
from ..grid.paired import engine_sessions, serving_points
from ..ledger import deadline_from_env, deadline_stop, spec_digest, stop_at_deadline
from ..record import Record, write, write_json_atomic
from ..spec import RunSpec
from . import telemetry
from .bench import EngineSession, measure

#: A finished ok run of a set, kept beside its record until the set's records are written
KEPT = ".paired-run.json"
#: Its engine's log, kept with it (module docstring)
KEPT_SERVER_LOG = ".paired-run.server.log"


def run_set(specs: Sequence[RunSpec | dict], model_dirs: Sequence[Path], record_paths: Sequence[Path], log: Path,
            server_logs: Sequence[Path], plan: dict[str, Any], gpu_busy: gpus.BusyPolicy | None = None,
            ) -> list[Record]:
    """Run the serving cells of a paired set (``plan``: llmbench.grid.paired's
    PairedSet.plan, its ``rounds`` the cells' indices) and write their Records at the end
    (module docstring). ``specs``, ``model_dirs``, ``record_paths`` and ``server_logs``: one
    per cell, in the set's order; ``log``: the set's. Raises DeadlineStop, writing no record,
    where a run would not finish by the job's deadline.

    Every record's provenance gets ``machine`` (llmbench.provenance.machine) and
    ``paired_set``: its ``id``, its ``cells`` (record paths relative to the results folder,
    in the set's order), the ``order`` its rounds ran in (the cells' indices per round, a
    kept run in its place, a skipped one left out), the ``ordering`` rule and its ``seed``."""
    n = len(specs)
    if not n or not len(model_dirs) == len(record_paths) == len(server_logs) == n:
        raise ValueError(f"run_set: {n} spec(s), {len(model_dirs)} model folder(s), {len(record_paths)} record "
                         f"path(s), {len(server_logs)} server log(s)")
    if sorted(i for r in plan["rounds"] for i in r) != list(range(n)):
        raise ValueError(f"paired set {plan['id']}: its rounds must run each of its {n} cells once")
    deadline = deadline_from_env()  # a bad value fails here, before any engine starts
    parsed = [RunSpec.of(s) for s in specs]  # a bad spec fails here too
    cells = [p.cell for p in parsed]
    point = {i: p for p, runs in enumerate(serving_points(cells)) for i in runs}
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"paired set {plan['id']}: " + "; ".join(f"cell {i} {c}" for i, c in enumerate(plan["cells"]))
                   + "\n")
    records: dict[int, Record] = {}
    walls: dict[int, list[float]] = {}  # a point's runs, seconds
    for i in range(n):
        if (kept := _kept(Path(record_paths[i]), parsed[i])) is not None:
            _restore_server_log(Path(record_paths[i]), Path(server_logs[i]))
            records[i] = kept[0]
            walls.setdefault(point[i], []).append(kept[1])
            _say(log, f"=== {plan['cells'][i]}: kept from an earlier run of the set, finished "
                      f"{kept[0].provenance.get('finished')}")
    failed: dict[int, int] = {}  # point -> its run that was not ok
    order: list[list[int]] = []
    share = bool(plan.get("share_engine"))
    starts: list[float] = []  # a shared engine's start-ups, seconds (a shared set's walls are its loads')
    with contextlib.ExitStack() as open_session:  # the engine of a shared launch, stopped in every case
        for planned in plan["rounds"]:
            order.append([])
            to_run = [i for i in planned if i not in records and point[i] not in failed]
            first_of = {g[0]: g for g in engine_sessions(to_run, cells, share)}
            session = None
            for i in planned:
                if i in records:  # kept by an earlier run (ok)
                    order[-1].append(i)
                    continue
                if point[i] in failed:
                    records[i] = _skipped(parsed[i], plan, records[failed[point[i]]])
                    _say(log, f"=== {plan['cells'][i]}: skipped: {records[i].reason}")
                    continue
                history = walls.get(point[i]) or [w for x in walls.values() for w in x]
                if share and i in first_of:  # this run starts an engine too
                    history = [w + max(starts, default=0.0) for w in history]
                if why := deadline_stop(deadline, history, plan["cells"][i]):
                    stop_at_deadline(f"{why}; the set's finished runs are kept: the next run of the set resumes "
                                     "there", log, mark="=== ")
                _say(log, f"\n=== {plan['cells'][i]}")
                telemetry_path = Path(record_paths[i]).parent / telemetry.FILE
                t0 = time.monotonic()
                if share and (group := first_of.get(i)) is not None:
                    session = open_session.enter_context(EngineSession(
                        [specs[k] for k in group], Path(model_dirs[i]), log, Path(server_logs[i]), gpu_busy,
                        names=[plan["cells"][k] for k in group]))
                    starts.append(time.monotonic() - t0)
                    t0 = time.monotonic()
                if session is not None:
                    records[i] = session.measure(specs[i], telemetry_path, Path(server_logs[i]))
                    if session.loads == len(session.specs):
                        open_session.close()  # the engine is stopped before the next starts
                        session = None
                else:
                    records[i] = measure(specs[i], Path(model_dirs[i]), log, Path(server_logs[i]), gpu_busy,
                                         telemetry_path)
                walls.setdefault(point[i], []).append(time.monotonic() - t0)
                order[-1].append(i)
                if records[i].status == "ok":
                    _keep(Path(record_paths[i]), parsed[i], records[i], walls[point[i]][-1], Path(server_logs[i]))
                else:
                    failed.setdefault(point[i], i)
    paired = {"id": plan["id"], "cells": list(plan["cells"]), "order": order, "ordering": plan["ordering"],
              "seed": plan["seed"]}
    out = []
    for i in range(n):
        prov = {**records[i].provenance, "paired_set": paired}
        prov["machine"] = provenance.machine(prov)
        out.append(replace(records[i], provenance=prov))
    for path, record in zip(record_paths, out):
        write(record, path)
    for path in record_paths:  # the records and the server logs hold them now
        (Path(path).parent / KEPT).unlink(missing_ok=True)
        (Path(path).parent / KEPT_SERVER_LOG).unlink(missing_ok=True)
    return out


def _say(log: Path, line: str) -> None:
    with open(log, "a") as fh:
        fh.write(line + "\n")


def _skipped(spec: RunSpec, plan: dict[str, Any], failed: Record) -> Record:
    """The record of a run not made because an earlier run of its point was not ok."""
    cell = spec.cell
    reason = (f"not run: load {failed.cell['load']!r} of the same point in paired set {plan['id']} was "
              f"{failed.status} ({failed.reason.splitlines()[0][:300] if failed.reason else 'no reason'}); "
              "a point whose run is not ok runs no more")
    now = datetime.now(UTC).isoformat()
    prov = provenance_of(spec, [Outcome(status="skipped", reason=reason)], now, [sys.executable, *sys.argv])
    return Record(cell=cell.to_dict(), status="skipped", reason=reason, provenance=prov)


def _keep(record_path: Path, spec: RunSpec, record: Record, wall_s: float, server_log: Path) -> None:
    """Keep a finished ok run beside its record (KEPT), and its engine's log
    (KEPT_SERVER_LOG), until the set's records are written."""
    if server_log.exists():
        record_path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(server_log, record_path.parent / KEPT_SERVER_LOG)
    write_json_atomic(record_path.parent / KEPT, {
        "spec_sha256": spec_digest(spec), "record": record.to_dict(), "wall_s": wall_s,
        "hostname": socket.gethostname(), "boot_id": provenance.boot_id()})


def _restore_server_log(record_path: Path, server_log: Path) -> None:
    """Put a kept run's engine log back where its job's log is (Snakemake removed it)."""
    kept = record_path.parent / KEPT_SERVER_LOG
    if kept.exists():
        server_log.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, server_log)


def _kept(record_path: Path, spec: RunSpec) -> tuple[Record, float] | None:
    """The run an earlier, stopped run of the set kept for this very spec (its Record and
    seconds), else None; one kept for another spec (a changed config) is deleted."""
    path = record_path.parent / KEPT
    try:
        data = json.loads(path.read_text())
        record = Record.from_dict(data["record"])
    except (OSError, ValueError, KeyError, TypeError):
        path.unlink(missing_ok=True)
        (record_path.parent / KEPT_SERVER_LOG).unlink(missing_ok=True)
        return None
    if data.get("spec_sha256") != spec_digest(spec) or record.status != "ok":
        path.unlink(missing_ok=True)
        (record_path.parent / KEPT_SERVER_LOG).unlink(missing_ok=True)
        return None
    return record, float(data.get("wall_s") or 0.0)
