"""Paired sets through real processes (llmbench.launch.run_set): the cells' repeats run
interleaved, round by round, each a process of the stand-in worker
(tests/fixtures/fake_worker.py), and the records say so (provenance.paired_set.order,
repeat_started) with the machine they ran on; a failed cell stops only itself; a set
stopped at its deadline resumes where it stopped. And Snakemake's plan: the set's rule
makes a set's record, and a set with a record missing stops the workflow before any job."""

import json
import os
import subprocess
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import BIN, REPO

from llmbench import backends, grid, launch, ledger, provenance

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


@pytest.fixture
def paired_set(monkeypatch, tmp_path):
    """A set of three tiny CPU cells run by the stand-in worker: (specs, record paths, plan)."""
    monkeypatch.setitem(backends.BACKENDS, "deepspeed", replace(backends.BACKENDS["deepspeed"], worker="fake_worker"))
    monkeypatch.setenv("PYTHONPATH", os.path.abspath(FIXTURES))
    monkeypatch.setenv("FAKE_MODE", "ok")

    def make(order="shuffle", repeats=2):
        g = grid.expand({
            "results_dir": str(tmp_path / "results"), "paired_order": order,
            "protocol": {"warmup_steps": 0, "measured_steps": 1, "repeats": repeats, "seq_len": 8, "timeout_s": 60},
            "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive", "Z2", "Z3"],
                          "batch_sizes": [1], "paired": "t3"}],
        })
        (s,) = g.sets
        return [g.spec(c) for c in s.cells], [Path(p) for p in s.record_paths(g.results_dir)], s.plan()

    return make


def run(specs, paths, plan, log):
    return launch.run_set(specs, paths, log, plan=plan)


def as_run(records):
    """(cell index, repeat) in the order the repeats started, from the records' times."""
    started = [(datetime.fromisoformat(t), i, r) for i, rec in enumerate(records)
               for r, t in enumerate(rec.provenance["repeat_started"])]
    return [(i, r) for _, i, r in sorted(started)]


def read(path):
    return json.loads(path.read_text())


def test_a_sets_repeats_alternate_and_its_records_say_how_and_where(paired_set, tmp_path):
    specs, paths, plan = paired_set("rotate")
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert [r.status for r in records] == ["ok"] * 3
    assert plan["rounds"] == [[0, 1, 2], [1, 2, 0]]
    assert as_run(records) == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1)]  # A B C, B C A
    here = provenance.host()
    for path, rec in zip(paths, records):
        on_disk = read(path)["provenance"]
        assert on_disk["paired_set"] == {"id": "t3-cpu", "cells": plan["cells"], "order": [[0, 1, 2], [1, 2, 0]],
                                         "ordering": "rotate", "seed": None}
        assert on_disk["machine"] == {"boot_id": here["boot_id"], "gpu_uuids": [], "cpu": here["cpu"], "driver": None,
                                      "hostname": here["hostname"]}
        assert len(on_disk["repeat_started"]) == 2 and len(rec.metrics.tokens_per_s_runs) == 2
    assert not list(tmp_path.rglob(".repeat-*.json"))  # the records hold them now


def test_a_shuffled_set_runs_each_round_in_its_seeded_order(paired_set, tmp_path):
    specs, paths, plan = paired_set("shuffle", repeats=3)
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert records[0].provenance["paired_set"]["order"] == plan["rounds"] and plan["seed"] == 0
    assert as_run(records) == [(i, r) for r, order in enumerate(plan["rounds"]) for i in order]


def test_a_cell_whose_repeat_fails_stops_its_own_repeats_and_the_others_go_on(paired_set, tmp_path, monkeypatch):
    specs, paths, plan = paired_set("rotate")
    real = launch.run_repeat

    def z2_fails(spec, workdir, index, *args):
        if spec["cell"]["technique"] == "Z2":
            return launch.Outcome(status="error", reason="Z2 failed on purpose")
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", z2_fails)
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert [r.status for r in records] == ["ok", "error", "ok"] and "on purpose" in records[1].reason
    assert records[0].provenance["paired_set"]["order"] == [[0, 1, 2], [2, 0]]
    assert [len(r.provenance["repeat_started"]) for r in records] == [2, 1, 2]
    assert all(p.exists() for p in paths)


def _repeats_of_100_s(monkeypatch):
    """Every repeat takes 100 s of the test's clock (launch's repeat seconds, the ledger's
    deadline clock, starting at 1000): (the clock, the (technique, repeat) run, in order)."""
    clock, ran, real = [1000.0], [], launch.run_repeat
    fake_time = SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    monkeypatch.setattr(launch, "time", fake_time)
    monkeypatch.setattr(ledger, "time", fake_time)

    def taking_100_s(spec, workdir, index, *args):
        ran.append((spec["cell"]["technique"], index))
        outcome = real(spec, workdir, index, *args)
        clock[0] += 100.0
        return outcome

    monkeypatch.setattr(launch, "run_repeat", taking_100_s)
    return clock, ran


def test_a_set_stopped_at_its_deadline_resumes_with_what_it_kept_in_the_same_order(paired_set, tmp_path, monkeypatch):
    """Repeats of 100 s (the test's clock) and a deadline 250 s away: the first two repeats
    start (none timed yet; then 150 s left > 1.2 x 100), the third does not (50 s). Nothing
    is written but the two kept repeats; the next run, with time, runs the four others in
    the planned order and writes the three records."""
    specs, paths, plan = paired_set("rotate")
    clock, ran = _repeats_of_100_s(monkeypatch)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1250")
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-g1/record"
                                                   r"\.json: repeat 0 \(of 0-1\) at the deadline: 50 s left"):
        run(specs, paths, plan, tmp_path / "set.log")
    assert ran == [("Naive", 0), ("Z2", 0)] and not any(p.exists() for p in paths)
    assert [p.name for p in sorted(tmp_path.rglob(".repeat-*.json"))] == [".repeat-0.json"] * 2

    ran.clear()
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 1000))
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert ran == [("Z3", 0), ("Z2", 1), ("Z3", 1), ("Naive", 1)]
    assert [r.status for r in records] == ["ok"] * 3 and all(p.exists() for p in paths)
    assert as_run(records) == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1)]
    assert records[0].provenance["paired_set"]["order"] == [[0, 1, 2], [1, 2, 0]]
    assert [[k["index"] for k in r.provenance.get("resumed_repeats", [])] for r in records] == [[0], [0], []]
    assert not list(tmp_path.rglob(".repeat-*.json"))



def test_a_round_stopped_part_way_runs_whole_again_on_another_machine(paired_set, tmp_path, monkeypatch):
    """The set of the test above, stopped after two of round 0's three repeats on one machine
    and resumed on another (another boot id): round 0's two kept repeats are set aside and
    run again with the third, so that the round pairs on one machine; what they measured is
    in the records' provenance, not in their numbers. Resumed on the same machine, they are
    kept (the test above)."""
    specs, paths, plan = paired_set("rotate")
    boot = ["boot-a-1234"]
    monkeypatch.setattr(provenance, "boot_id", lambda: boot[0])
    clock, ran = _repeats_of_100_s(monkeypatch)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1250")
    with pytest.raises(ledger.DeadlineStop):
        run(specs, paths, plan, tmp_path / "set.log")
    assert ran == [("Naive", 0), ("Z2", 0)]

    ran.clear()
    boot[0] = "boot-b-5678"
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 1000))
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert ran == [("Naive", 0), ("Z2", 0), ("Z3", 0), ("Z2", 1), ("Z3", 1), ("Naive", 1)]
    assert [r.status for r in records] == ["ok"] * 3 and all(p.exists() for p in paths)
    assert as_run(records) == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1)]
    aside = [r.provenance.get("set_aside_repeats", []) for r in records]
    assert [[(a["index"], a["boot_id"]) for a in x] for x in aside] == [[(0, "boot-a-1234")]] * 2 + [[]]
    assert all(a["tokens_per_s"] > 0 for x in aside for a in x)
    assert not any(r.provenance.get("resumed_repeats") for r in records)
    assert "round 0 was stopped part-way on another machine" in (tmp_path / "set.log").read_text()
    assert not list(tmp_path.rglob(".repeat-*.json")) and not list(tmp_path.rglob(".set-aside-*.json"))


def test_a_set_stops_before_a_cell_whose_predicted_repeat_does_not_fit_the_time_left(paired_set, tmp_path,
                                                                                       monkeypatch):
    """Repeats of 20 s (the test's clock), 70 s to the deadline. Naive and Z2 run (no timing,
    no prediction: the first starts; then the set's 20 s x 1.2); Z3, not timed yet, is
    predicted at 30 s a repeat (x 1.5: 45 s), more than the 30 s left: the set stops before
    it, although the set's repeats so far (24 s wanted) would have let it start. With 46 s,
    the next run resumes with Z3 alone."""
    from llmbench import estimate

    specs, paths, plan = paired_set("rotate", repeats=1)
    clock = [1000.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    monkeypatch.setattr(launch, "time", fake_time)
    monkeypatch.setattr(ledger, "time", fake_time)
    real, ran = launch.run_repeat, []

    def taking_20_s(spec, workdir, index, *args):
        ran.append(spec["cell"]["technique"])
        outcome = real(spec, workdir, index, *args)
        clock[0] += 20.0
        return outcome

    real_estimate = estimate.repeat

    def z3_predicted(cell, model, root=None):  # the CPU cells are not predicted; Z3 stands in for one that is
        est = real_estimate(cell, model)
        return replace(est, predicted_s=30.0, note="fixture") if cell.technique == "Z3" else est

    monkeypatch.setattr(launch, "run_repeat", taking_20_s)
    monkeypatch.setattr(estimate, "repeat", z3_predicted)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1070")
    with pytest.raises(ledger.DeadlineStop, match=r"Z3/bs1-g1/record\.json: repeat 0 \(of 0-0\) at the deadline: "
                                                   r"30 s left, none timed yet, it is predicted to need 45 s"):
        run(specs, paths, plan, tmp_path / "set.log")
    assert ran == ["Naive", "Z2"] and not any(p.exists() for p in paths)
    log = (tmp_path / "set.log").read_text()
    assert "Z3/bs1-g1/record.json: a repeat is predicted at 30 s (fixture)" in log
    assert "Naive/bs1-g1/record.json: no predicted repeat (platform 'cpu'" in log

    ran.clear()
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 46))
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert ran == ["Z3"] and [r.status for r in records] == ["ok"] * 3


def test_a_resumed_set_keeps_a_cell_that_ran_out_of_memory(paired_set, tmp_path, monkeypatch):
    """An out-of-memory repeat is a result (it ends its cell's repeats): a set stopped at its
    deadline and run again keeps it, and does not run out of memory a second time."""
    specs, paths, plan = paired_set("rotate")
    real, ran = launch.run_repeat, []

    def naive_oom(spec, workdir, index, *args):
        ran.append((spec["cell"]["technique"], index))
        if spec["cell"]["technique"] == "Naive":
            return launch.Outcome(status="oom", reason="CUDA out of memory (on purpose)")
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", naive_oom)
    monkeypatch.setattr(launch, "deadline_stop", lambda deadline, walls, what, predicted_s=None, timed="":
                        "stopped" if len(ran) >= 2 else None)
    with pytest.raises(ledger.DeadlineStop):
        run(specs, paths, plan, tmp_path / "set.log")
    assert ran == [("Naive", 0), ("Z2", 0)]
    ran.clear()
    monkeypatch.setattr(launch, "deadline_stop", lambda deadline, walls, what, predicted_s=None, timed="": None)
    records = run(specs, paths, plan, tmp_path / "set.log")
    assert ("Naive", 0) not in ran and [r.status for r in records] == ["oom", "ok", "ok"]
    assert "on purpose" in records[0].reason

SET_CONFIG = """
results_dir: {results}
protocol: {{warmup_steps: 0, measured_steps: 1, repeats: 2, seq_len: 8, timeout_s: 60}}
pretrain:
  - platforms: [cpu]
    models: [tiny]
    techniques: [Naive, Z2]
    batch_sizes: [1]
    paired: t2
  - platforms: [cpu]
    models: [tiny]
    techniques: [R]
    batch_sizes: [1]
"""


def dry_run(tmp_path, *targets):
    config = tmp_path / "paired.yaml"
    config.write_text(SET_CONFIG.format(results="res"))
    return subprocess.run([BIN / "snakemake", *targets, "-n", "--nolock", "--cores", "2", "-s", REPO / "Snakefile",
                           "-d", tmp_path, "--configfile", config], cwd=tmp_path, capture_output=True, text=True)


def test_snakemake_makes_a_sets_record_with_the_sets_rule_and_stops_on_a_set_with_a_record_missing(tmp_path):
    cell = "res/runs/pretrain/cpu/tiny/deepspeed/{}/bs1-g1/record.json"
    out = dry_run(tmp_path, cell.format("Z2"), cell.format("R"))
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = {m.split("\n")[0]: m for m in out.stdout.split("rule ")[1:]}
    assert f"output: {cell.format('Naive')}, {cell.format('Z2')}" in jobs["run_paired_set_t2_cpu:"]
    assert "log: res/logs/paired/t2-cpu.log" in jobs["run_paired_set_t2_cpu:"]
    assert f"output: {cell.format('R')}" in jobs["run_training_cell:"]  # a cell of no set: its own job

    present = tmp_path / cell.format("Naive")
    present.parent.mkdir(parents=True)
    present.write_text("{}")
    out = dry_run(tmp_path, cell.format("R"))  # any target: the set would lose its record to the next run of it
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "paired set t2-cpu: 1 of its 2 records are present, 1 missing." in said
    assert f"missing: {cell.format('Z2')}" in said and f"present: {cell.format('Naive')}" in said
    assert f"mv {cell.format('Naive')} res/superseded/{cell.format('Naive')[4:]}" in said
    assert present.read_text() == "{}"  # nothing was deleted
