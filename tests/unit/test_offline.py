"""The planner of lent and offline machines' calls (llmbench.offline): a cell's estimate, a
target list's plan, SKIP_RECORDED and the cell a finished search measures, as
envs/offline-batch.sh asks them."""

import json
import math
from pathlib import Path

import pytest

from search_fixtures import ESTIMATE_CONFIG, probe_record
from llmbench import estimate, ledger, offline
from llmbench.offline import cli, planner


def predicted_repeat(seconds: float | None):
    """llmbench.estimate.repeat as a stub: ``seconds`` a repeat predicted (None: not predicted)."""
    def repeat(cell, model, root=None):
        return estimate.RepeatEstimate(predicted_s=seconds, startup_s=None, step_s=None, steps=13, timeout_s=600,
                                       note="a stub")
    return repeat


@pytest.fixture(autouse=True)
def _no_prediction(monkeypatch):
    """The tests below time cells from their probes, records and ledgers: the throughput
    model's figure (whose constants move with each calibration) is stubbed out, except where
    a test sets one."""
    monkeypatch.setattr(planner.lbestimate, "repeat", predicted_repeat(None))


def test_the_measured_target_of_a_finished_search_is_its_cell_at_the_largest_batch(tmp_path, repo, monkeypatch):
    """What envs/offline-batch.sh runs after a search folder: Search.measured(largest)'s
    record path, under the same results folder; nothing where no batch fit."""
    from llmbench import grid

    base = {"protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 16, "timeout_s": 60},
            "finetune": [{"platforms": ["h100"], "models": ["llama2-7b"], "techniques": ["L+F"], "gpus": 1,
                          "max_batch": {"max": 64}}]}
    s = grid.expand(base, repo).searches[0]
    folder = tmp_path / s.record_path("results")
    folder.mkdir(parents=True)
    (folder / "search.json").write_text(json.dumps({"largest_ok": 17}))
    assert offline.measured_target(folder) == str(tmp_path / s.measured(17).record_path("results"))
    monkeypatch.chdir(tmp_path)  # as Snakemake's targets are: relative to the working directory
    assert offline.measured_target(s.record_path("results")) == s.measured(17).record_path("results")
    (folder / "search.json").write_text(json.dumps({"largest_ok": None}))
    assert offline.measured_target(folder) is None
    with pytest.raises(ValueError, match="not a search folder"):
        offline.measured_target(folder / "bs17")
    with pytest.raises(ValueError, match="not a search folder"):
        offline.measured_target(tmp_path / "results/runs/finetune/h100")


def probed_cell(tmp_path: Path) -> tuple[Path, Path, Path]:
    """ESTIMATE_CONFIG's L+R cell at batch 203 and its search's probe there (40 s in all, 9 s
    of window over 1 + 2 steps: 70 s a repeat of the cell's 3 + 10, 2 repeats): (config,
    the cell's record path, the probe's record path)."""
    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    target = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"
    probe = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs203/record.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=40, window_s=9.0))
    return config, target, probe


def test_a_searched_cell_is_estimated_from_its_probe_and_its_own_protocol(tmp_path, capsys):
    """What offline-batch weighs against the time left: per repeat, the probe's set-up (its
    wall time less its timed window) plus its seconds a step times the cell's steps."""
    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    target = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"
    probe = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs203/record.json"
    assert offline.estimate_s(target, config) is None  # no probe at that batch
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=40, window_s=9.0))
    # a repeat: 31 s of set-up + 3 s a step x 13 steps; the cell has 2
    assert offline.estimate_s(target, config) == offline.Estimate(repeat_s=70.0, repeats=2, source="probe")
    # and the seconds left offline-batch wants to start it: 1.25 x 70 + 20
    assert offline.estimate_s(target, config).start_s == 107
    assert cli.main(["estimate", str(target), str(config)]) == 0 and capsys.readouterr().out == "70 2 107 probe\n"
    other = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L/bs203-g1/record.json"
    assert offline.estimate_s(other, config) is None  # no such cell in the config (nor probe)
    probe.write_text(probe_record(wall_s=40, window_s=9.0, status="skipped"))  # answered by the frontier
    assert offline.estimate_s(target, config) is None
    assert cli.main(["estimate", str(target), str(config)]) == 0 and capsys.readouterr().out == ""


def test_a_plan_sums_the_estimates_of_a_target_list_and_names_what_it_cannot_time(tmp_path, capsys):
    """Before a call or an allocation: each cell of the list timed as offline-batch would
    time it (all its repeats), a search folder and a cell nothing times named as untimed."""
    config, cell, _ = probed_cell(tmp_path)  # 70 s a repeat, 2 repeats
    untimed = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs100-g1/record.json"
    folder = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"
    listing = tmp_path / "todo.txt"
    listing.write_text(f"# a comment\n{cell}\n{folder}\n\n{untimed}\n")
    assert cli.main(["plan", str(listing), str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"   140  {cell}  (2 x 70 s from probe; starts with 107 s left)"  # 1.25 x 70 + 20
    assert out[1].startswith(f"     ?  {folder}  (a search") and out[2].startswith(f"     ?  {untimed}  (no probe")
    assert out[3] == "total: 140 s for 1 of 3 targets; 2 not timed (above)"
    # a call of 106 s never starts the cell (offline-batch wants 1.25 x 70 + 20 = 107 s left); one of 107 does
    assert cli.main(["plan", str(listing), str(config), "--call-s", "106"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"   140  {cell}  (2 x 70 s from probe; never starts in a call of 106 s: offline-batch "
                      "wants 107 s left to start it)")
    assert out[3] == "total: 140 s for 1 of 3 targets; 2 not timed (above); 1 never starts in a call of 106 s (above)"
    assert cli.main(["plan", str(listing), str(config), "--call-s", "107"]) == 0
    out = capsys.readouterr().out
    assert "never" not in out and f"{cell}  (2 x 70 s from probe; starts with 107 s left)" in out
    with pytest.raises(SystemExit):
        cli.main(["plan", str(tmp_path / "missing.txt"), str(config)])


def test_a_plan_times_a_search_at_the_hint_from_the_largest_batch_an_earlier_folder_ran(tmp_path, capsys):
    """A search not yet run: PLAN_PROBES probes (1 + 2 steps) and the cell's 2 repeats
    (3 + 10 steps) at the memory model's hint, each the set-up plus its steps at the seconds a
    token of the earlier record with the largest batch (another GPU's probe at 100, not this
    GPU's batch-1 cell, which is host-bound). A search a --skip-recorded folder finished is
    its cell alone (as offline-batch's SKIP_RECORDED), timed by the search's probe there,
    and nothing once that cell is measured too."""
    from llmbench import grid as grids, memory
    from llmbench.offline import PLAN_PROBES

    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    ref = tmp_path / "ref"
    other = ref / "runs/search/finetune/h200/llama2-7b/deepspeed/L+R-g1/bs100/record.json"
    other.parent.mkdir(parents=True)
    other.write_text(probe_record(wall_s=40, window_s=30.0))  # 10 s set-up; 10 s a step at 100
    small = ref / "runs/finetune/h100/llama2-7b/deepspeed/L+R/bs1-g1/record.json"
    small.parent.mkdir(parents=True)
    small.write_text(probe_record(wall_s=20, window_s=15.0))  # 5 s a step at batch 1
    folder = "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{folder}\n")
    g = grids.load(config)
    hint = memory.start_hint(g.spec(g.searches[0]))
    step = 10.0 / 100 * hint
    want = math.ceil(PLAN_PROBES * (10 + 3 * step) + 2 * (10 + 13 * step))
    need = math.ceil(10 + 13 * step) * 5 // 4 + 20  # its cell there: its probe's estimate x 1.25 + 20 s
    assert cli.main(["plan", str(listing), str(config), "--earlier", str(ref)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"{want:>6}  {folder}  (a search: {PLAN_PROBES} probes and 2 repeat(s) at batch {hint}, "
                      f"{step:.1f} s a step from {other}; its cell at that batch starts with {need} s left)")
    # a call too short for the cell at that batch is named
    assert cli.main(["plan", str(listing), str(config), "--earlier", str(ref), "--call-s", str(need - 1)]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        f"; its cell at that batch never starts in a call of {need - 1} s: offline-batch will want {need} s left "
        "to start it)")
    assert cli.main(["plan", str(listing), str(config), "--earlier", str(ref), "--call-s", str(need)]) == 0
    assert "never" not in capsys.readouterr().out
    # searched in the earlier folder: the cell at its largest batch, timed by the probe there
    done = ref / folder.removeprefix("results/")
    done.mkdir(parents=True)
    (done / "search.json").write_text(json.dumps({"largest_ok": 100, "probes": [
        {"batch_size": 100, "status": "ok"}]}))
    probe = done / "bs100/record.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=40, window_s=30.0))
    both = ["--earlier", str(ref), "--skip-recorded", str(ref)]
    assert cli.main(["plan", str(listing), str(config), *both]) == 0
    cell = "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs100-g1/record.json"
    assert capsys.readouterr().out.splitlines()[0] == f"   280  {cell}  (2 x 140 s from probe; starts with 195 s left)"
    measured = ref / cell.removeprefix("results/")
    measured.parent.mkdir(parents=True)
    measured.write_text(probe_record(wall_s=40, window_s=30.0))  # measured there too: nothing to do
    assert cli.main(["plan", str(listing), str(config), *both]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"     0  {folder}  (already recorded in {ref})"


def test_a_plan_times_a_search_whose_only_record_is_far_below_from_the_closest_technique(tmp_path, capsys):
    """Batch 1's seconds a token, scaled to the hint, over-state a large batch's many times (a
    host-bound step). Where the cell's only record is under a quarter of the hint, the seconds a token
    come from the same platform's record, near the hint, of the technique fewest flags away
    (L for L+R, not QL+F, nor another GPU's); the set-up stays the cell's own."""
    from llmbench import grid as grids, memory
    from llmbench.offline import PLAN_PROBES

    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    g = grids.load(config)
    hint = memory.start_hint(g.spec(g.searches[0]))
    ref = tmp_path / "ref"

    def record(platform, technique, batch, wall_s, window_s):
        path = ref / f"runs/finetune/{platform}/llama2-7b/deepspeed/{technique}/bs{batch}-g1/record.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(probe_record(wall_s=wall_s, window_s=window_s))
        return path

    record("h100", "L+R", 1, wall_s=20, window_s=15.0)  # 5 s of set-up; 5 s a step at batch 1
    folder = "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{folder}\n")
    assert cli.main(["plan", str(listing), str(config), "--earlier", str(ref)]) == 0
    assert "its batch 1 is far below, so an upper bound; its cell at that batch starts with" in capsys.readouterr().out
    near = record("h100", "L", hint, wall_s=40, window_s=30.0)  # 10 s a step at the hint
    record("h100", "QL+F", hint, wall_s=10, window_s=3.0)  # five flags away
    record("h200", "L", hint, wall_s=100, window_s=90.0)  # another GPU
    record("h100", "L", max(hint // 3, 1), wall_s=10, window_s=3.0)  # as close, farther from the hint
    want = math.ceil(PLAN_PROBES * (5 + 3 * 10.0) + 2 * (5 + 13 * 10.0))
    assert cli.main(["plan", str(listing), str(config), "--earlier", str(ref)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"{want:>6}  {folder}  (a search: {PLAN_PROBES} probes and 2 repeat(s) at batch {hint}, 10.0 s a step from "
        f"{ref}/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs1-g1/record.json (its batch 1 is far below: a step's "
        f"seconds a token from L at batch {hint}, {near}); its cell at that batch starts with "
        f"{135 * 5 // 4 + 20} s left)")  # 5 s of set-up and 13 steps of 10 s, x 1.25 + 20 s


def test_recorded_in_reads_skip_recorded_folders_as_offline_batch_does(tmp_path, capsys):
    """A record a folder holds: skip; a search it holds with its cell: skip; without its
    cell: that cell, beside the given target; none: None (the CLI prints ``none``). A
    folder given with a trailing slash (``ls -d DIR/``) reads the same."""
    from llmbench.offline import recorded_in

    ref = tmp_path / "ref"
    rel = "runs/search/finetune/h100/llama2-7b/deepspeed/QL-g1"
    (ref / rel).mkdir(parents=True)
    (ref / rel / "search.json").write_text(json.dumps({"largest_ok": 7, "probes": [{"batch_size": 7, "status": "ok"}]}))
    target = f"{tmp_path}/results/{rel}"
    cell = f"{tmp_path}/results/runs/finetune/h100/llama2-7b/deepspeed/QL/bs7-g1/record.json"
    for folder in (ref, f"{ref}/"):
        assert recorded_in(target, [tmp_path / "nothing", folder]) == ("cell", cell)
    measured = ref / "runs/finetune/h100/llama2-7b/deepspeed/QL/bs7-g1/record.json"
    measured.parent.mkdir(parents=True)
    measured.write_text('{"status": "ok"}')
    assert recorded_in(target, [f"{ref}/"]) == ("skip", str(ref)) == recorded_in(cell, [ref])
    assert recorded_in(f"{tmp_path}/results/runs/other/record.json", [ref]) is None
    assert cli.main(["recorded-in", f"{tmp_path}/results/runs/other/record.json", str(ref)]) == 0
    assert capsys.readouterr().out == "none\n"


def test_without_a_probe_a_cell_is_estimated_from_its_own_earlier_record(tmp_path, capsys):
    """A cell no search probed (a protocol rerun of a swept cell) is timed by its record in
    the earlier results folders with the most measured steps: per repeat, its wall time a
    repeat less its window, plus its seconds a step times the cell's steps; where its
    repeats were resumed from another run, or ran in a paired set among other cells' (the
    wall time is not theirs), its worker's other phases are the set-up. Probes, records of
    other cells and failed records are not read."""
    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    target = "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"

    def earlier(run, measured, runs, wall_s, window_s, status="ok", resumed=False, paired=False, **phases):
        path = tmp_path / run / target.removeprefix("results/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "status": status, "cell": {"protocol": {"warmup_steps": 3, "measured_steps": measured}},
            "metrics": {"tokens_per_s_runs": [1.0] * runs}, "summary": {"phase_window_s": window_s, **phases},
            "provenance": {"started": "2026-11-26T06:00:00+00:00",
                           "finished": f"2026-11-26T06:{wall_s // 60:02d}:{wall_s % 60:02d}+00:00",
                           **({"resumed_repeats": [{"index": 0}]} if resumed else {}),
                           **({"paired_set": {"id": "set", "cells": [target, "other"]}} if paired else {})}}))
        return tmp_path / run

    sweep = earlier("sweep", 10, 1, 65, 26.0)  # 39 s of set-up, 2 s a step: 39 + 2 x 13 = 65 s
    failed = earlier("failed", 100, 3, 50, 10.0, status="error")
    assert offline.estimate_s(target, config) is None  # no earlier folders given
    assert offline.estimate_s(target, config, [sweep, failed]) == offline.Estimate(
        repeat_s=65.0, repeats=2, source=str(sweep / target.removeprefix("results/")))
    # the most measured steps x repeats: 3 repeats of 100 steps, 240 s each, 206 s of it stepping
    protocol = earlier("protocol", 100, 3, 720, 206.0)
    assert offline.estimate_s(target, config, [sweep, protocol]).repeat_s == pytest.approx(34 + 2 * 13)
    resumed = earlier("resumed", 100, 3, 240, 206.0, resumed=True, phase_start_s=1.0, phase_build_s=20.0,
                      phase_after_window_s=1.0)
    assert offline.estimate_s(target, config, [resumed]).repeat_s == pytest.approx(22 + 2 * 13)
    # a paired set's 3 repeats among another cell's 3: 24 min of wall time, its own repeats 240 s each
    paired = earlier("paired", 100, 3, 1440 - 1, 206.0, paired=True, phase_start_s=1.0, phase_build_s=20.0,
                     phase_after_window_s=1.0)
    assert offline.estimate_s(target, config, [paired]).repeat_s == pytest.approx(22 + 2 * 13)
    assert cli.main(["estimate", target, str(config), "--earlier", str(sweep)]) == 0
    assert capsys.readouterr().out == f"65 2 98 {sweep / target.removeprefix('results/')}\n"  # 1.2 x 65 + 20 s


def test_a_repeat_stopped_unfinished_beside_the_cell_is_its_estimate_where_it_ran_longer(tmp_path, capsys):
    """A repeat the deadline stopped inside (llmbench.ledger.STOPPED beside the record: the
    estimate fell short) ran at least that long: where that is longer than the estimate it
    is the estimate, and offline-batch wants 1.2 times it (the cell's own deadline check)
    plus 20 s left. Only a repeat of the cell's own steps counts; with no other estimate,
    it is the estimate."""
    config, target, probe = probed_cell(tmp_path)  # 70 s a repeat
    target.parent.mkdir(parents=True)
    note = target.parent / ledger.STOPPED

    def stopped(ran_s, steps=13):
        note.write_text(json.dumps({"spec_sha256": "any", "index": 0, "ran_s": ran_s, "steps": steps}))

    stopped(60.0)  # shorter than the estimate: the probe's stands
    assert offline.estimate_s(target, config).source == "probe"
    stopped(90.0)
    assert offline.estimate_s(target, config) == offline.Estimate(repeat_s=90.0, repeats=2, source="stopped")
    assert offline.estimate_s(target, config).start_s == 128  # 1.2 x 90 + 20
    assert cli.main(["estimate", str(target), str(config)]) == 0 and capsys.readouterr().out == "90 2 128 stopped\n"
    stopped(90.0, steps=130)  # another protocol's repeat
    assert offline.estimate_s(target, config).source == "probe"
    probe.unlink()
    stopped(90.0)
    assert offline.estimate_s(target, config).source == "stopped"
    assert note.exists()  # read, not consumed: the launcher deletes it with the record


def test_repeats_kept_beside_a_cell_count_as_run_in_its_estimate_and_its_plan(tmp_path, capsys):
    """A cell stopped between repeats (a call's deadline) resumes with the repeats it kept
    (llmbench.ledger.keep_repeat): its estimate and a plan count only the others, so a
    protocol cell spread over calls is planned at what is left, and the longest kept repeat
    is the estimate, wanting what the cell's own deadline check wants of it (1.2 x it + 20 s),
    so offline-batch starts no cell that stops at once. A kept repeat of another spec (a
    changed config) does not count, and the estimate leaves it where it is (the launcher
    deletes it when the cell runs); nor does one that kept no time, for the estimate."""
    from llmbench import grid as grids
    from llmbench.aggregate import Outcome

    config, target, _ = probed_cell(tmp_path)  # 70 s a repeat, 2 repeats
    target.parent.mkdir(parents=True)
    g = grids.load(config)
    spec = g.spec(g.find(stage="finetune", platform="h100", model="llama2-7b", backend="deepspeed",
                         technique="L+R", batch_size="203", gpus="1"))
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{target}\n")
    ledger.keep_repeat(target.parent, 0, {**spec, "cell": {**spec["cell"], "batch_size": 204}}, Outcome(status="ok"))
    assert offline.estimate_s(target, config) == offline.Estimate(repeat_s=70.0, repeats=2, source="probe")
    assert (target.parent / ledger.PARTIAL.format(index=0)).exists()  # read, not deleted
    ledger.keep_repeat(target.parent, 0, spec, Outcome(status="ok"))  # no time kept: the probe's estimate
    est = offline.estimate_s(target, config)
    assert (est.kept, est.left, est.source, est.start_s) == (1, 1, "probe", 107)  # 1.25 x 70 + 20
    ledger.keep_repeat(target.parent, 0, spec, Outcome(status="ok"), wall_s=80.0)
    est = offline.estimate_s(target, config)
    assert (est.kept, est.left, est.repeat_s, est.source, est.start_s) == (1, 1, 80.0, "kept", 116)  # 1.2 x 80 + 20
    assert cli.main(["estimate", str(target), str(config)]) == 0 and capsys.readouterr().out == "80 1 116 kept\n"
    assert cli.main(["plan", str(listing), str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"    80  {target}  (1 x 80 s from kept; 1 of 2 repeats kept beside it; starts with 116 s left)"
    ledger.keep_repeat(target.parent, 1, spec, Outcome(status="ok"), wall_s=69.0)
    est = offline.estimate_s(target, config)
    assert (est.kept, est.left, est.start_s) == (2, 0, 20)  # all kept: the cell writes its record
    assert offline.plan([str(target)], config)[0][1] == 0


def test_a_cell_nothing_timed_is_estimated_from_its_prediction_and_its_own_check(tmp_path, monkeypatch):
    """No probe, no earlier record: the throughput model's predicted repeat is the estimate,
    and offline-batch wants what the cell's own deadline check wants before an untimed repeat
    (its prediction x estimate.DEADLINE_MARGIN) left. A probe, where one ran, decides."""
    monkeypatch.setattr(planner.lbestimate, "repeat", predicted_repeat(100.0))
    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    target = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"
    est = offline.estimate_s(target, config)
    assert (est.repeat_s, est.source, est.repeats) == (100.0, "predicted", 2)
    assert est.start_s == math.ceil(100 * estimate.DEADLINE_MARGIN) + 20
    probe = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs203/record.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=40, window_s=9.0))  # 70 s a repeat
    est = offline.estimate_s(target, config)
    assert (est.repeat_s, est.source) == (70.0, "probe")
    assert est.start_s == 70 * 5 // 4 + 20


def test_a_schedule_plays_the_batchs_rules_over_calls_of_a_length(tmp_path, capsys):
    """A list of a cell of 70 s a repeat (its probe's; 1.25 x 70 + 20 = 107 s to start) and
    one of 15 s, two repeats each, in calls of 150 s: the first call runs the long cell's
    first repeat, its job stops before the second (80 s left, under 1.2 x 70), and the list
    goes on with the short cell's two; the second call resumes the long cell (1.2 x 70 + 20
    = 104 s to start, as its kept repeat wants). In calls of 100 s the long cell never
    starts, and the schedule says so."""
    config, long_cell, _ = probed_cell(tmp_path)
    short_cell = Path(str(long_cell).replace("bs203", "bs100"))
    probe = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs100/record.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=10, window_s=1.5))  # 8.5 + 0.5 x 13 = 15 s a repeat
    listed = [str(long_cell), str(short_cell)]
    calls, left_out = planner.schedule(listed, config, 150)
    assert [(c.ran, c.used_s) for c in calls] == [(((str(long_cell), 1, 1), (str(short_cell), 2, 0)), 100.0),
                                                  (((str(long_cell), 1, 0),), 70.0)]
    assert left_out == []
    calls, left_out = planner.schedule(listed, config, 100)
    assert [c.ran for c in calls] == [((str(short_cell), 2, 0),)]
    assert left_out == [(str(long_cell), f"{offline.NEVER_STARTS} of 100 s (with 2 of its repeats left)")]
    listing = tmp_path / "todo.txt"
    listing.write_text("\n".join(listed) + "\n")
    assert cli.main(["plan", str(listing), str(config), "--call-s", "150"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == ["  call 1: 100 s: finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1 x1 (1 left), "
                        "finetune/h100/llama2-7b/deepspeed/L+R/bs100-g1 x2",
                        "  call 2: 70 s: finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1 x1", "2 call(s)"]
