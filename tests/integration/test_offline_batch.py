"""envs/offline-batch.sh, the deadline-bound runner of a list of record targets, with a
stand-in for envs/offline-run.sh (it writes the target's record after FAKE_S seconds): it
never starts a target that the time left cannot hold, and prints a line per target."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

STAND_IN = """#!/usr/bin/env bash
# offline-run.sh's stand-in: WHEELHOUSE TARGET [snakemake arguments] -> the target's record;
# a search folder -> its search.json (largest batch FAKE_LARGEST, none where it is empty;
# probes FAKE_PROBES, a JSON list); a record whose path holds FAKE_OOM_AT -> status oom;
# the job's LLMBENCH_DEADLINE -> TARGET.deadline, its LLMBENCH_REPEAT_S -> TARGET.repeat;
# --install-only -> a line in ./installs; --unlock -> its arguments in ./unlocks
whl=$1; target=$2; shift 2
if [[ $target == --install-only ]]; then echo "$whl" >> "$(dirname "$0")/installs"; exit 0; fi
if [[ $target == --unlock ]]; then echo "$*" >> "$(dirname "$0")/unlocks"; exit 0; fi
[[ -f $target ]] && exit 0
# the job's deadline, as Snakemake's job would see it; FAKE_STOP_LINE: the line a job that
# stopped at it exits with (llmbench.ledger.DEADLINE_EXIT), where it names this target
mkdir -p "$(dirname "$target")"
echo "${LLMBENCH_DEADLINE:-none}" > "$target.deadline"
echo "${LLMBENCH_REPEAT_S:-none}" > "$target.repeat"
if [[ -n ${FAKE_STOP_LINE:-} && $FAKE_STOP_LINE == *"$target:"* ]]; then echo "$FAKE_STOP_LINE" >&2; exit 1; fi
sleep "$FAKE_S"
if [[ $target != *.json ]]; then
    mkdir -p "$target"
    printf '{"status": "ok", "largest_ok": %s, "n_probes": 3, "probes": %s}' "${FAKE_LARGEST:-null}" \
        "${FAKE_PROBES:-[]}" > "$target/search.json"
    exit 0
fi
mkdir -p "$(dirname "$target")"
status=${FAKE_STATUS:-ok}
[[ -n ${FAKE_OOM_AT:-} && $target == *"$FAKE_OOM_AT"* ]] && status=oom
printf '{"status": "%s", "reason": "%s", "metrics": {"tokens_per_s_mean": 123.4, "tokens_per_s_std": 5.6, "tokens_per_s_runs": [118, 123, 129]}}' \
    "$status" "${FAKE_REASON:-}" > "$target"
echo "$@" > "$target.args"
"""


@pytest.fixture
def batch(tmp_path):
    runner = tmp_path / "fake-offline-run.sh"
    runner.write_text(STAND_IN)
    targets = [tmp_path / f"runs/{name}/record.json" for name in ("a", "b", "c")]
    listing = tmp_path / "todo.txt"
    listing.write_text("# a comment, then a blank line\n\n" + "".join(f"{t}\n" for t in targets))

    def run(deadline_s, fake_s, first_s, **env):
        return subprocess.run(
            ["bash", str(REPO / "envs/offline-batch.sh"), "WHL", str(deadline_s), str(listing), "--cores", "1"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "OFFLINE_RUN": str(runner), "FAKE_S": str(fake_s), "FIRST_S": str(first_s), **env})
    return run, targets


def test_it_stops_before_a_target_the_time_left_cannot_hold(batch):
    run, targets = batch
    # the first target takes 6 s: 6 s of slack for its start on a loaded machine, after which
    # what is left (at most 6 s) cannot hold another (6 s, times the runner's 1.2)
    done = run(deadline_s=12, fake_s=6, first_s=1)
    assert done.returncode == 3, done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {targets[0]}  ok  123.4 tok/s ± 5.6  ")
    assert "the longest cell took" in lines[1] and f"not starting {targets[1]}" in lines[1]
    assert f"not starting {targets[2]}" in lines[2]  # the list goes on: nor does the next fit
    assert targets[0].exists() and not targets[1].exists() and not targets[2].exists()
    # passed through, after --rerun-incomplete: a target stopped at a deadline resumes
    assert (targets[0].parent / "record.json.args").read_text().split() == ["--rerun-incomplete", "--cores", "1"]
    # the same list again: the recorded target is skipped, the others run
    again = run(deadline_s=30, fake_s=0, first_s=1, FAKE_STATUS="oom", FAKE_REASON="CUDA out of memory")
    assert again.returncode == 0, again.stderr
    assert all(t.exists() for t in targets) and json.loads(targets[0].read_text())["status"] == "ok"
    assert f"offline-batch: {targets[0]}  ok  123.4 tok/s ± 5.6  recorded before: skipped" in again.stdout
    assert f"offline-batch: {targets[2]}  oom  123.4 tok/s ± 5.6" in again.stdout and "CUDA out of memory" in again.stdout


def test_a_list_recorded_before_ends_at_once_whatever_the_time_left(batch, tmp_path):
    """Targets recorded in the results folder are neither run again (Snakemake could replace
    a record whose config changed) nor held back by the deadline check (the batch would end
    with status 3, as if a target were left): each says so, and the batch ends with 0."""
    run, targets = batch
    for t in targets:
        t.parent.mkdir(parents=True)
        t.write_text(json.dumps({"status": "ok", "metrics": {"tokens_per_s_mean": 50.0}}))
    done = run(deadline_s=1, fake_s=0, first_s=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines == [f"offline-batch: {t}  ok  50.0 tok/s  recorded before: skipped  " for t in targets]
    assert not any((t.parent / "record.json.args").exists() for t in targets)  # no Snakemake run


def test_a_target_still_running_at_the_deadline_is_stopped_there(batch, tmp_path):
    """A target longer than the longest so far (a search's probes, a first cell) does not
    outlive the deadline: it is stopped, the batch says so and stops with status 3."""
    run, targets = batch
    # 6 s: the first target starts whatever a loaded machine costs the batch's start (which can
    # leave less than the 1.2 s the first cell's 1 s asks of a 2 s deadline), and its 20 s outlive it
    done = run(deadline_s=6, fake_s=20, first_s=1)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {targets[0]}  stopped at the deadline after ")
    assert len(lines) == 1 and not any(t.exists() for t in targets)
    # a stopped Snakemake leaves its lock: every batch removes stale locks before its first target
    assert (tmp_path / "unlocks").read_text().split() == ["--cores", "1"]


def test_each_job_is_given_the_deadline_and_the_list_goes_on_after_one_stopped_at_it(batch, tmp_path):
    """Each target's job gets the batch's deadline, less DEADLINE_SLACK_S, as
    LLMBENCH_DEADLINE (llmbench.launch stops a cell between repeats by it: llmbench.ledger); a job that
    stopped there exits with DEADLINE_EXIT's line, which the batch repeats; the time left may
    still hold a later target, which runs, and the batch ends with status 3."""
    import time

    from llmbench.ledger import DEADLINE_EXIT

    run, targets = batch
    why = "stopped before repeat 1 (of 0-2) at the deadline: 80 s left, the longest so far took 100 s (x 1.2)"
    t0 = time.time()
    done = run(deadline_s=300, fake_s=0, first_s=1, DEADLINE_SLACK_S="20",
               FAKE_STOP_LINE=DEADLINE_EXIT.format(target=targets[1], why=why))
    t1 = time.time()
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {targets[0]}  ok  ")
    assert lines[1].startswith(f"offline-batch: {targets[1]}  {why}  after ")
    assert lines[2].startswith(f"offline-batch: {targets[2]}  ok  ") and len(lines) == 3
    assert targets[0].exists() and not targets[1].exists() and targets[2].exists()
    for t in targets:  # the batch's deadline less the slack, in Unix seconds
        assert int(t0) + 300 - 20 - 1 <= int(Path(f"{t}.deadline").read_text()) <= int(t1) + 300 - 20


def test_a_search_starts_where_a_cell_would_not_as_it_guards_its_own_probes(batch, tmp_path):
    """A cell took 5 s and its start, under 5 s are left: another cell would not start (the
    longest cell so far), but a search does, needing only FIRST_S: its job starts no probe its
    deadline cannot hold (llmbench.search.runner), and what it probed stays in its frontier.
    (A call of twice the cell's 5 s: whatever the first cell's start takes on a loaded
    machine, up to 4 s, leaves less than it and at least FIRST_S.)"""
    run, targets = batch
    folder = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L-g1"
    (tmp_path / "todo.txt").write_text(f"{targets[0]}\n{folder}\n{targets[1]}\n")
    done = run(deadline_s=10, fake_s=5, first_s=1)
    assert done.returncode == 3, done.stdout + done.stderr
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {targets[0]}  ok")
    assert lines[1].startswith(f"offline-batch: {folder}  stopped at the deadline after "), lines
    assert len(lines) == 2 and not targets[1].exists()


def test_a_target_without_a_record_says_so(batch, tmp_path):
    run, targets = batch
    (tmp_path / "fake-offline-run.sh").write_text("#!/usr/bin/env bash\nexit 1\n")  # Snakemake failed
    done = run(deadline_s=30, fake_s=0, first_s=1)
    assert done.returncode == 1
    assert f"offline-batch: {targets[0]}  no record (FileNotFoundError)" in done.stdout


def test_a_search_folder_is_followed_by_the_cell_it_measures(batch, tmp_path):
    """A search folder target: its line, then the cell at the batch it found, before the
    next target; a search that found nothing adds no cell."""
    import sys

    run, targets = batch
    folder = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L-g1"
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{folder}\n{targets[0]}\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # llmbench.offline's yaml, jsonschema
    done = run(deadline_s=30, fake_s=0, first_s=1, FAKE_LARGEST="7", PATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
    measured = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L/bs7-g1/record.json"
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {folder}  search ok: largest batch 7 in 3 probes")
    assert re.search(r" in 3 probes  \d+s  ", lines[0])  # its seconds, once
    assert lines[1].startswith(f"offline-batch: {measured}  ok  123.4 tok/s") and measured.exists()
    assert lines[2].startswith(f"offline-batch: {targets[0]}  ok") and len(lines) == 3
    # no batch fit: the search's line, no measured cell
    other = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/QL-g1"
    listing.write_text(f"{other}\n")
    done = run(deadline_s=30, fake_s=0, first_s=1, PATH=path)
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 0 and len(lines) == 1 and "largest batch None" in lines[0]


def test_a_skip_recorded_folder_it_cannot_read_stops_the_batch(batch, tmp_path):
    """SKIP_RECORDED is read by python -m llmbench.offline recorded-in, after the wheels are
    installed; where that fails the batch does not run the target as if nothing held it:
    it stops, says why, and exits 2."""
    run, targets = batch
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python3").write_text("#!/bin/sh\necho 'no llmbench here' >&2\nexit 1\n")
    (fake / "python3").chmod(0o755)
    done = run(deadline_s=30, fake_s=0, first_s=1, SKIP_RECORDED=str(tmp_path), PATH=f"{fake}{os.pathsep}{os.environ['PATH']}")
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 2 and "no llmbench here" in done.stderr
    assert lines == [f"offline-batch: {targets[0]}  cannot tell whether SKIP_RECORDED holds it (above): the batch stops here"]
    assert not targets[0].exists() and (tmp_path / "installs").read_text() == "WHL\n"


def test_targets_recorded_in_a_skip_recorded_folder_are_skipped(batch, tmp_path):
    """SKIP_RECORDED: a record target that a listed results folder holds is not run; a
    search folder is skipped only once the cell it measures is recorded there too."""
    import sys

    run, targets = batch
    ref = tmp_path / "reference"
    (ref / "runs/b").mkdir(parents=True)
    (ref / "runs/b/record.json").write_text('{"status": "ok"}')
    rel = "runs/search/finetune/h100/llama2-7b/deepspeed/L-g1"
    done_search, open_search = ref / rel, ref / rel.replace("/L-g1", "/QL-g1")
    for folder in (done_search, open_search):
        folder.mkdir(parents=True)
        (folder / "search.json").write_text('{"status": "ok", "largest_ok": 7, "n_probes": 2}')
    measured = ref / "runs/finetune/h100/llama2-7b/deepspeed/L/bs7-g1/record.json"
    measured.parent.mkdir(parents=True)
    measured.write_text('{"status": "ok"}')
    listing = tmp_path / "todo.txt"
    local = [tmp_path / "results" / rel, tmp_path / "results" / rel.replace("/L-g1", "/QL-g1")]
    recorded = tmp_path / "results/runs/b/record.json"
    listing.write_text("".join(f"{t}\n" for t in [targets[0], recorded, *local]))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = run(deadline_s=30, fake_s=0, first_s=1, SKIP_RECORDED=f"{tmp_path}/nothing {ref}", PATH=path,
               FAKE_LARGEST="7")
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].startswith(f"offline-batch: {targets[0]}  ok")
    assert lines[1] == f"offline-batch: {recorded}  already recorded in {ref}: skipped" and not recorded.exists()
    assert lines[2] == f"offline-batch: {local[0]}  already recorded in {ref}: skipped" and not local[0].exists()
    # the QL search is there but not the cell it measures: that cell runs alone, the search not again
    cell = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/QL/bs7-g1/record.json"
    assert lines[3] == f"offline-batch: {local[1]}  searched in SKIP_RECORDED, its cell not measured: {cell} next"
    assert lines[4].startswith(f"offline-batch: {cell}  ok") and len(lines) == 5 and not local[1].exists()
    assert cell.exists()


def test_a_measured_cell_that_runs_out_of_memory_is_followed_by_the_batch_below(batch, tmp_path):
    """A searched batch whose measured cell runs out of memory (its probe fit): the cell at
    the next batch whose probe fit runs next, here and where SKIP_RECORDED holds the search
    and the cell that ran out."""
    import sys

    run, _ = batch
    rel = "runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1"
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{tmp_path}/results/{rel}\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    probes = '[{"batch_size": 203, "status": "ok"}, {"batch_size": 208, "status": "tight"}, {"batch_size": 207, "status": "ok"}]'
    done = run(deadline_s=30, fake_s=0, first_s=1, FAKE_LARGEST="207", FAKE_PROBES=probes, FAKE_OOM_AT="/bs207-",
               PATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
    cell = f"{tmp_path}/results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs{{}}-g1/record.json"
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {tmp_path}/results/{rel}  search ok: largest batch 207")
    assert lines[1].startswith(f"offline-batch: {cell.format(207)}  oom")
    assert lines[2] == (f"offline-batch: {cell.format(207)}  ran out of memory where its search's probe fit: "
                        f"{cell.format(203)} next")
    assert lines[3].startswith(f"offline-batch: {cell.format(203)}  ok") and len(lines) == 4
    # a fresh machine, the search and the cell that ran out committed: the cell below alone
    ref = tmp_path / "reference"
    (tmp_path / "results").rename(ref)
    (ref / cell.format(203).split("/results/")[1]).unlink()
    done = run(deadline_s=30, fake_s=0, first_s=1, PATH=path, SKIP_RECORDED=str(ref))
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    below = cell.format(203)
    assert lines == [f"offline-batch: {tmp_path}/results/{rel}  searched in SKIP_RECORDED, its cell not measured: "
                     f"{below} next", lines[1]] and lines[1].startswith(f"offline-batch: {below}  ok"), done.stdout
    assert Path(below).exists() and not (tmp_path / "results" / rel).exists()


def test_seed_frontier_installs_then_seeds_before_the_first_target(batch, tmp_path):
    """SEED_FRONTIER: the wheels are installed (offline-run.sh --install-only), then each
    folder's probe records seed the frontier (python -m llmbench.search seed-frontier;
    tests/unit/test_search.py tests what it adds), then the targets run."""
    import sys

    run, targets = batch
    empty = tmp_path / "reference/runs"
    empty.mkdir(parents=True)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = run(deadline_s=30, fake_s=0, first_s=1, SEED_FRONTIER=str(empty), PATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "installs").read_text().split() == ["WHL"]
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0] == f"offline-batch: seed: no probe records under {empty} to add"
    assert lines[1].startswith(f"offline-batch: {targets[0]}  ok") and len(lines) == 4
    # without it nothing is installed ahead of the targets
    (tmp_path / "installs").unlink()
    for t in targets:
        t.unlink()
    run(deadline_s=30, fake_s=0, first_s=1, PATH=path)
    assert not (tmp_path / "installs").exists()


def test_a_target_the_time_left_cannot_hold_is_passed_over_for_a_later_one_that_fits(tmp_path):
    """The list's order is its priority, but a long cell first does not keep the shorter
    ones after it from the time left: it is not started, they run, the exit status says
    a target was left."""
    import sys

    from search_fixtures import ESTIMATE_CONFIG, probe_record

    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    (tmp_path / "fake-offline-run.sh").write_text(STAND_IN)
    cells = {}
    for bs, (wall, window) in {203: (40, 9.0), 10: (4, 1.5)}.items():  # 70 s a repeat; 9 s
        cells[bs] = tmp_path / f"results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs{bs}-g1/record.json"
        probe = tmp_path / f"results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs{bs}/record.json"
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(probe_record(wall_s=wall, window_s=window))
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{cells[203]}\n{cells[10]}\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", str(REPO / "envs/offline-batch.sh"), "WHL", "60", str(listing), "--cores", "1",
         "--configfile", str(config)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "OFFLINE_RUN": str(tmp_path / "fake-offline-run.sh"), "FAKE_S": "0", "FIRST_S": "1",
             "PATH": path})
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"(x 1.25 + 20 s: 107s): not starting {cells[203]}" in lines[0]
    assert lines[1].startswith(f"offline-batch: {cells[10]}  ok  123.4 tok/s")
    assert cells[10].exists() and not cells[203].exists()


def test_a_searched_cell_starts_only_where_its_estimate_fits_the_time_left(tmp_path):
    """A cell its search probed at that batch is weighed by its estimate of a repeat (1.25 x
    + 20 s: a cell stops between repeats at its deadline), not by the longest target so far:
    one too long for the time left is not started; a short one starts though an earlier
    target took longer than the time left. Without a probe, its record in ESTIMATE_FROM's
    folders times it (1.2 x the estimate + 20 s). The job gets the probe's or the record's
    estimate of a repeat (LLMBENCH_REPEAT_S), which its own deadline check judges the cell's
    first repeat by; a kept repeat's or a stopped one's it reads itself, and gets none."""
    import sys

    from search_fixtures import ESTIMATE_CONFIG, probe_record

    config = tmp_path / "config.yaml"
    config.write_text(ESTIMATE_CONFIG)
    (tmp_path / "fake-offline-run.sh").write_text(STAND_IN)
    target = tmp_path / "results/runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"
    probe = tmp_path / "results/runs/search/finetune/h100/llama2-7b/deepspeed/L+R-g1/bs203/record.json"
    probe.parent.mkdir(parents=True)
    probe.write_text(probe_record(wall_s=40, window_s=9.0))  # 70 s a repeat: needs 107 s
    listing = tmp_path / "todo.txt"
    listing.write_text(f"{target}\n")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"

    def run(deadline_s, first_s, **env):
        return subprocess.run(
            ["bash", str(REPO / "envs/offline-batch.sh"), "WHL", str(deadline_s), str(listing), "--cores", "1",
             "--configfile", str(config)], capture_output=True, text=True, timeout=60,
            env={**os.environ, "OFFLINE_RUN": str(tmp_path / "fake-offline-run.sh"), "FAKE_S": "0",
                 "FIRST_S": str(first_s), "PATH": path, **env})

    done = run(deadline_s=100, first_s=1)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "its search's probe puts a repeat at 70s (x 1.25 + 20 s: 107s): not starting" in done.stdout
    assert "no call of 100s starts it: a longer one must" in done.stdout  # 107 s > the whole call
    assert not target.exists()
    probe.write_text(probe_record(wall_s=4, window_s=1.5))  # 2.5 + 0.5 x 13 = 9 s a repeat: needs 31 s
    done = run(deadline_s=200, first_s=1000)
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 0 and lines[0].startswith(f"offline-batch: {target}  ok  123.4 tok/s"), done.stdout
    assert "s (estimated 18s)" in lines[0]  # both repeats
    assert (target.parent / "record.json.repeat").read_text().split() == ["9"]
    # no probe: an earlier run's record of the cell (1 + 2 steps in 9 s, 40 s in all) puts a repeat at 70 s
    target.unlink()
    probe.unlink()
    sweep = tmp_path / "reference/sweep"
    earlier = sweep / "runs/finetune/h100/llama2-7b/deepspeed/L+R/bs203-g1/record.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text(probe_record(wall_s=40, window_s=9.0))
    done = run(deadline_s=100, first_s=1, ESTIMATE_FROM=str(sweep))
    assert done.returncode == 3 and f"its record in {sweep} puts a repeat at 70s (x 1.2 + 20 s: 104s): not " \
        "starting" in done.stdout, done.stdout + done.stderr
    done = run(deadline_s=120, first_s=1000, ESTIMATE_FROM=str(sweep))
    assert done.returncode == 0 and "s (estimated 140s)" in done.stdout, done.stdout + done.stderr
    assert (target.parent / "record.json.repeat").read_text().split() == ["70"]
    # a repeat of it stopped unfinished after 90 s (the estimate fell short): 1.2 x 90 + 20 = 128 s wanted
    target.unlink()
    (target.parent / ".stopped-repeat.json").write_text(json.dumps({"ran_s": 90.0, "steps": 13}))
    done = run(deadline_s=120, first_s=1, ESTIMATE_FROM=str(sweep))
    assert done.returncode == 3 and "a repeat of it was stopped unfinished after 90s (x 1.2 + 20 s: 128s): " \
        "not starting" in done.stdout and "no call of 120s starts it" in done.stdout, done.stdout + done.stderr
    # one repeat of two kept (100 s): timed by it as the cell's own deadline check will (1.2 x 100 + 20 s),
    # and only the other repeat is left to run
    from llmbench import cells, grid as grids, ledger
    from llmbench.aggregate import Outcome

    (target.parent / ".stopped-repeat.json").unlink()
    g = grids.load(config)
    ledger.keep_repeat(target.parent, 0, g.spec(g.find(**cells.parse(str(target), (cells.RECORD_PATTERN,)).wildcards)),
                       Outcome(status="ok"), wall_s=100.0)
    done = run(deadline_s=139, first_s=1, ESTIMATE_FROM=str(sweep))
    assert done.returncode == 3 and "the longest repeat it kept took 100s (x 1.2 + 20 s: 140s): not starting" \
        in done.stdout, done.stdout + done.stderr
    done = run(deadline_s=150, first_s=1000, ESTIMATE_FROM=str(sweep))  # 140 s and a start's slack
    assert done.returncode == 0 and "s (estimated 100s)" in done.stdout, done.stdout + done.stderr
    assert (target.parent / "record.json.repeat").read_text().split() == ["none"]  # the job reads its kept repeat


def test_on_a_gpu_machine_deepspeeds_ops_are_built_before_the_first_target(batch, tmp_path):
    """Where nvidia-smi lists a GPU, the wheels are installed and DeepSpeed's JIT ops built
    (llmbench.train.jit_ops) for each platform the list's targets name, in its environment,
    before the first target, so no cell compiles them inside its repeat. A failed build (here:
    h100's on a machine with no CUDA) says its last line and where its log is, and the batch
    goes on. BUILD_OPS=0, or no GPU, builds nothing."""
    pytest.importorskip("deepspeed")
    run, _ = batch
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: a stand-in'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    # python3 is this interpreter (the one with DeepSpeed), as on the device after the wheels;
    # not its whole bin folder: a ninja of another version there would build every op again
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    gpu_path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    ops_log = tmp_path / "jit-ops.log"
    listing = tmp_path / "todo.txt"

    def targets(platform):
        found = [tmp_path / f"results/runs/finetune/{platform}/tiny/deepspeed/{t}/bs1-g1/record.json"
                 for t in ("L", "QL")]
        listing.write_text("".join(f"{t}\n" for t in found))
        return found

    cpu = targets("cpu")
    done = run(deadline_s=120, fake_s=0, first_s=1, PATH=gpu_path, OPS_LOG=str(ops_log))
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert [x.split()[3] for x in lines[:2]] == ["cpu_adam", "deepspeed_shm_comm"], done.stdout
    assert all(x.startswith("offline-batch: DeepSpeed op ") and " for platform cpu (" in x for x in lines[:2])
    assert lines[2].startswith(f"offline-batch: {cpu[0]}  ok") and (tmp_path / "installs").read_text() == "WHL\n"
    h100 = targets("h100")
    done = run(deadline_s=120, fake_s=0, first_s=1, PATH=gpu_path, OPS_LOG=str(ops_log))
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[0].startswith("offline-batch: DeepSpeed's ops not built ahead (") and lines[0].endswith(
        f"; {ops_log}); the first cells build them"), lines[0]
    last = [x for x in ops_log.read_text().splitlines() if x.strip()][-1]
    assert "Traceback" in ops_log.read_text() and f"({last[:200]};" in lines[0]
    assert lines[1].startswith(f"offline-batch: {h100[0]}  ok")
    for env in ({"PATH": gpu_path, "BUILD_OPS": "0"}, {}):
        for t in h100:
            t.unlink()
        ops_log.unlink(missing_ok=True)
        done = run(deadline_s=60, fake_s=0, first_s=1, OPS_LOG=str(ops_log), **env)
        assert done.returncode == 0 and "DeepSpeed" not in done.stdout and not ops_log.exists()