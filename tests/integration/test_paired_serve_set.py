"""Paired sets of serving cells through real engine processes (llmbench.serve.paired.run_set),
with the PROTOCOL test double of tests/fixtures/fake_servers.py as both engines: the two
engines' bursts alternate run by run, each with a fresh engine that is stopped before the
next starts, and the records say so (provenance.paired_set, machine); an engine that fails
stops only its own point; a set stopped at its deadline resumes with the runs it kept. And
Snakemake's plan: the set's rule makes a serving set's records, and a set with a record
missing stops the workflow before any job."""

import dataclasses
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from conftest import BIN, REPO

from llmbench import grid, ledger, provenance, record
from llmbench.serve import engines
from llmbench.serve import paired as serve_paired

FAKE = str(Path(__file__).resolve().parents[1] / "fixtures" / "fake_servers.py")
SERVE = [{"platforms": ["cpu"], "models": ["tiny"], "engines": [engine], "paired": "eng",
          "loads": {f"burst-{k}": {"num_requests": 6, "input_len": 8, "output_len": 4, "warmup_requests": 0,
                                   "request_timeout_s": 20} for k in (1, 2, 3)},
          "ready_timeout_s": 30, "timeout_s": 60} for engine in ("transformers", "vllm")]


def fake(argv: list[str] | None = None) -> engines.Engine:
    """The transformers engine's entry, its command replaced by the fake server (one process
    of its own on the cell's port, as an engine runs)."""
    def command(x: engines.Launch) -> list[str]:
        return argv or [sys.executable, FAKE, "--dialect", "openai", "--port", str(x.port),
                        "--knobs", json.dumps({"flavour": "transformers"})]
    return dataclasses.replace(engines.ENGINES["transformers"], command=command, env=lambda x: {})


@pytest.fixture
def serving_set(monkeypatch, tmp_path):
    """vLLM and transformers (both the test double) under burst-1..3 on the CPU as one set:
    run(order, vllm=None) -> (records, plan, record paths)."""
    def run(order="rotate", vllm=None):
        monkeypatch.setitem(engines.ENGINES, "transformers", fake())
        monkeypatch.setitem(engines.ENGINES, "vllm", vllm or fake())
        g = grid.expand({"results_dir": str(tmp_path / "res"), "paired_order": order, "protocol": {"seed": 0},
                         "serve": SERVE})
        (s,) = g.sets
        paths = [Path(p) for p in s.record_paths(g.results_dir)]
        logs = [tmp_path / "logs" / f"{i}.server.log" for i in range(len(paths))]
        plan = s.plan()
        records = serve_paired.run_set([g.spec(c) for c in s.cells], [tmp_path] * len(paths), paths,
                                       tmp_path / "set.log", logs, plan)
        return records, plan, paths

    return run


def no_orphans() -> bool:
    """No fake engine is left behind: none among this process's descendants, and none
    orphaned (its parent gone, adopted by init). Another test process's engines that are still
    running under their own cell (pytest-xdist) are neither."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    return not [p for p in psutil.process_iter(["cmdline", "ppid"])
                if FAKE in (p.info["cmdline"] or []) and (p.pid in mine or p.info["ppid"] == 1)]


def as_run(records):
    """Cell indices in the order their engines served, from the records' start times."""
    return [i for _, i in sorted((datetime.fromisoformat(r.provenance["started"]), i) for i, r in enumerate(records))]


def test_two_engines_alternate_burst_after_burst_and_each_engine_is_stopped_before_the_next(serving_set, tmp_path):
    records, plan, paths = serving_set("rotate")
    assert [r.status for r in records] == ["ok"] * 6, [r.reason for r in records]
    assert [(r.cell["engine"], r.cell["load"]) for r in records] == [
        (e, f"burst-{k}") for e in ("transformers", "vllm") for k in (1, 2, 3)]
    assert plan["rounds"] == [[0, 3], [4, 1], [2, 5]]
    assert as_run(records) == [0, 3, 4, 1, 2, 5]  # t1 v1, v2 t2, t3 v3
    # one engine at a time: each stopped (its record finished) before the next started
    spans = sorted((datetime.fromisoformat(r.provenance["started"]), datetime.fromisoformat(r.provenance["finished"]))
                   for r in records)
    assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
    assert len({tuple(r.provenance["engine_command"]) for r in records}) == 6  # a fresh engine, a port, each
    here = provenance.host()
    for path, rec in zip(paths, records):
        on_disk = record.read(path)
        assert on_disk == rec
        assert on_disk.provenance["paired_set"] == {"id": "eng-cpu", "cells": plan["cells"],
                                                    "order": [[0, 3], [4, 1], [2, 5]], "ordering": "rotate",
                                                    "seed": None}
        assert on_disk.provenance["machine"]["boot_id"] == here["boot_id"]
        assert on_disk.summary["completed"] == 6
    assert no_orphans()
    assert not list(tmp_path.rglob(serve_paired.KEPT))  # the records hold them now
    log = (tmp_path / "set.log").read_text()
    assert log.startswith("paired set eng-cpu: cell 0 runs/serve/cpu/tiny/transformers/burst-1-g1/record.json;")


def test_a_shuffled_serving_set_runs_each_round_in_its_seeded_order(serving_set):
    records, plan, _ = serving_set("shuffle")
    assert plan["ordering"] == "shuffle" and plan["seed"] == 0
    assert as_run(records) == [i for r in plan["rounds"] for i in r]
    assert records[0].provenance["paired_set"]["order"] == plan["rounds"]


def test_an_engine_that_cannot_start_stops_its_own_runs_and_the_other_goes_on(serving_set):
    argv = [sys.executable, "-c", "import sys; print('OSError: cannot load model from /nowhere'); sys.exit(3)"]
    records, plan, paths = serving_set("rotate", vllm=fake(argv))
    assert [r.status for r in records] == ["ok", "ok", "ok", "error", "skipped", "skipped"]
    assert "cannot load model from /nowhere" in records[3].reason
    assert records[4].reason.startswith("not run: load 'burst-1' of the same point in paired set eng-cpu was error")
    assert records[0].provenance["paired_set"]["order"] == [[0, 3], [1], [2]]
    assert all(p.exists() for p in paths) and no_orphans()


def test_a_serving_set_stopped_at_its_deadline_resumes_with_the_runs_it_kept(serving_set, tmp_path, monkeypatch):
    """Runs of 100 s (the test's clock) and a deadline 250 s away: the first two start (none
    timed yet; then 150 s left > 1.2 x 100), the third does not. Nothing is written but the
    two kept runs; the next run of the set, with time, runs the four others in the planned
    order and writes the six records."""
    clock = [1000.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    monkeypatch.setattr(serve_paired, "time", fake_time)
    monkeypatch.setattr(ledger, "time", fake_time)
    real, ran = serve_paired.measure, []

    def taking_100_s(spec, *args):
        ran.append((spec["cell"]["engine"], spec["cell"]["load"]))
        out = real(spec, *args)
        clock[0] += 100.0
        return out

    monkeypatch.setattr(serve_paired, "measure", taking_100_s)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1250")
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before runs/serve/cpu/tiny/vllm/burst-2-g1/record\.json "
                                                   r"at the deadline: 50 s left"):
        serving_set("rotate")
    assert ran == [("transformers", "burst-1"), ("vllm", "burst-1")]
    assert not list((tmp_path / "res").rglob("record.json"))
    assert len(list((tmp_path / "res").rglob(serve_paired.KEPT))) == 2
    assert no_orphans()
    kept_logs = {i: (tmp_path / "logs" / f"{i}.server.log").read_text() for i in (0, 3)}  # as_run: cells 0, 3 ran
    assert all(kept_logs.values())
    for i in kept_logs:  # Snakemake removes a job's logs before it runs the job again
        (tmp_path / "logs" / f"{i}.server.log").unlink()

    ran.clear()
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 1000))
    records, plan, paths = serving_set("rotate")
    assert ran == [("vllm", "burst-2"), ("transformers", "burst-2"), ("transformers", "burst-3"), ("vllm", "burst-3")]
    assert [r.status for r in records] == ["ok"] * 6 and all(p.exists() for p in paths)
    assert as_run(records) == [0, 3, 4, 1, 2, 5]
    assert records[0].provenance["paired_set"]["order"] == [[0, 3], [4, 1], [2, 5]]
    assert {i: (tmp_path / "logs" / f"{i}.server.log").read_text() for i in kept_logs} == kept_logs  # put back
    assert not list(tmp_path.rglob(serve_paired.KEPT)) and not list(tmp_path.rglob(serve_paired.KEPT_SERVER_LOG))


def test_a_set_that_shares_engines_starts_one_engine_per_launch_and_round_and_serves_its_points_on_it(
        monkeypatch, tmp_path):
    """A concurrency sweep of three points, two runs each, for two engines, share_engine: each
    round starts each engine once and fires its three points on it in the block's order; the
    n-th load on an engine draws its prompts with seed + n; every record names its session,
    each cell's engine log holds the engine it ran on, and no engine is left behind."""
    monkeypatch.setitem(engines.ENGINES, "transformers", fake())
    monkeypatch.setitem(engines.ENGINES, "vllm", fake())
    sweep = {f"c{c}-{k}": {"mode": "concurrency", "max_concurrency": c, "num_requests": 4, "input_len": 8,
                           "output_len": 4, "warmup_requests": 1, "request_timeout_s": 20}
             for c in (1, 2, 4) for k in (1, 2)}
    blocks = [{**b, "loads": sweep, "share_engine": True} for b in SERVE]
    g = grid.expand({"results_dir": str(tmp_path / "res"), "paired_order": "rotate", "protocol": {"seed": 7},
                     "serve": blocks})
    (s,) = g.sets
    assert s.share_engine
    plan = s.plan()
    # cells: transformers c1-1 c1-2 c2-1 c2-2 c4-1 c4-2 (0-5), vllm the same (6-11)
    assert plan["share_engine"] and plan["rounds"] == [[0, 2, 4, 6, 8, 10], [7, 9, 11, 1, 3, 5]]
    paths = [Path(p) for p in s.record_paths(g.results_dir)]
    logs = [tmp_path / "logs" / f"{i}.server.log" for i in range(len(paths))]
    records = serve_paired.run_set([g.spec(c) for c in s.cells], [tmp_path] * len(paths), paths,
                                   tmp_path / "set.log", logs, plan)
    assert [r.status for r in records] == ["ok"] * 12, [r.reason for r in records]
    assert as_run(records) == [i for r in plan["rounds"] for i in r]
    for session in ([0, 2, 4], [6, 8, 10], [7, 9, 11], [1, 3, 5]):
        # one engine (one command, one port) for the session's three loads, launched for the largest
        assert len({tuple(records[i].provenance["engine_command"]) for i in session}) == 1
        assert [records[i].provenance["engine_session"] for i in session] == [
            {"cells": [plan["cells"][k] for k in session], "position": n} for n in range(3)]
        assert [records[i].summary["prompt_seed"] for i in session] == [7, 8, 9]
        whole = logs[session[0]].read_text()  # the session's engine log; the others, their loads' part
        assert whole and all(logs[i].read_text().startswith("[llmbench] the engine's log during this load, from byte")
                             and logs[i].read_text().split("\n", 1)[1] in whole for i in session[1:])
        assert records[session[0]].provenance["started"] < records[session[-1]].provenance["started"]
    assert len({tuple(r.provenance["engine_command"]) for r in records}) == 4  # 2 engines x 2 rounds
    assert all(r.summary["completed"] == 4 for r in records)
    assert no_orphans()


def test_a_shared_engines_start_counts_once_against_the_deadline(monkeypatch, tmp_path):
    """Engine start-ups of 300 s and loads of 100 s (the test's clock), 750 s to the deadline:
    the first engine starts and serves both its loads (the second needs 1.2 x 100 s, not its
    start again); the second engine would need 1.2 x (100 + 300) s, with 250 s left, so the set
    stops before it, keeping the two loads it served."""
    monkeypatch.setitem(engines.ENGINES, "transformers", fake())
    monkeypatch.setitem(engines.ENGINES, "vllm", fake())
    clock = [1000.0]
    fake_time = SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    monkeypatch.setattr(serve_paired, "time", fake_time)
    monkeypatch.setattr(ledger, "time", fake_time)
    enter, measure, ran = serve_paired.EngineSession.__enter__, serve_paired.EngineSession.measure, []

    def starting_300_s(self):
        out = enter(self)
        clock[0] += 300.0
        return out

    def taking_100_s(self, spec, *args):
        ran.append((spec["cell"]["engine"], spec["cell"]["load"]))
        out = measure(self, spec, *args)
        clock[0] += 100.0
        return out

    monkeypatch.setattr(serve_paired.EngineSession, "__enter__", starting_300_s)
    monkeypatch.setattr(serve_paired.EngineSession, "measure", taking_100_s)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1750")
    loads = {n: {"num_requests": 2, "input_len": 8, "output_len": 4, "warmup_requests": 0} for n in ("a", "b")}
    g = grid.expand({"results_dir": str(tmp_path / "res"), "paired_order": "rotate", "protocol": {"seed": 0},
                     "serve": [{**b, "loads": loads, "share_engine": True} for b in SERVE]})
    (s,) = g.sets
    paths = [Path(p) for p in s.record_paths(g.results_dir)]
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before runs/serve/cpu/tiny/vllm/a-g1/record\.json "
                                                   r"at the deadline: 250 s left"):
        serve_paired.run_set([g.spec(c) for c in s.cells], [tmp_path] * 4, paths, tmp_path / "set.log",
                             [tmp_path / f"{i}.server.log" for i in range(4)], s.plan())
    assert ran == [("transformers", "a"), ("transformers", "b")]
    assert len(list((tmp_path / "res").rglob(serve_paired.KEPT))) == 2
    assert no_orphans()


SET_CONFIG = """
results_dir: res
protocol: {seed: 0}
serve:
  - platforms: [cpu]
    models: [tiny]
    engines: [transformers, vllm]
    paired: eng
    loads:
      burst-1: &b {num_requests: 4, input_len: 4, output_len: 4}
      burst-2: *b
  - platforms: [cpu]
    models: [tiny]
    engines: [transformers]
    loads:
      solo: *b
"""


def dry_run(tmp_path, *targets):
    config = tmp_path / "paired.yaml"
    config.write_text(SET_CONFIG)
    return subprocess.run([BIN / "snakemake", *targets, "-n", "--nolock", "--cores", "2", "-s", REPO / "Snakefile",
                           "-d", tmp_path, "--configfile", config], cwd=tmp_path, capture_output=True, text=True)


def test_snakemake_makes_a_serving_sets_records_with_its_rule_and_stops_on_a_set_with_a_record_missing(tmp_path):
    cell = "res/runs/serve/cpu/tiny/{}/{}-g1/record.json"
    out = dry_run(tmp_path, cell.format("vllm", "burst-2"), cell.format("transformers", "solo"))
    assert out.returncode == 0, out.stderr[-3000:]
    # one block per job, without the job-stats summary the dry run prints after the last one
    jobs = {m.split("\n")[0]: m.split("\nJob stats")[0] for m in out.stdout.split("\nrule ")[1:]}
    job = jobs["run_paired_set_eng_cpu:"]
    assert ("output: " + ", ".join(cell.format(e, f"burst-{k}") for e in ("transformers", "vllm") for k in (1, 2))
            in job)
    assert "log: res/logs/paired/eng-cpu.log, res/logs/serve/cpu/tiny/transformers/burst-1-g1.server.log" in job
    assert "input: res/models/tiny/random" in job
    assert f"output: {cell.format('transformers', 'solo')}" in jobs["run_serving_cell:"]  # no set's: its own job
    assert "run_training_cell:" not in jobs and "run_paired_set_eng_cpu" not in jobs.get("run_serving_cell:", "")

    present = tmp_path / cell.format("vllm", "burst-1")
    present.parent.mkdir(parents=True)
    present.write_text("{}")
    out = dry_run(tmp_path, cell.format("transformers", "solo"))
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "paired set eng-cpu: 1 of its 4 records are present, 3 missing." in said
    assert f"present: {cell.format('vllm', 'burst-1')}" in said
    assert present.read_text() == "{}"  # nothing was deleted
