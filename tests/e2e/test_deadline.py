"""A job's deadline through Snakemake for real: envs/offline-batch.sh gives each job its
deadline (LLMBENCH_DEADLINE), the launcher does not start a repeat, nor the search a probe,
that cannot finish by it, the job's adapter exits with llmbench.ledger.DEADLINE_EXIT's line
through Snakemake's output, and the batch repeats it and ends with status 3. Here the
deadline has passed before the jobs start (DEADLINE_SLACK_S beyond the batch's own), so
the stop is certain on any machine; the stop between repeats by their timing is
tests/integration/test_launch_cells.py's. Then a batch with time runs the cell whole."""

from __future__ import annotations

import json
import subprocess

import pytest
from workspaces import snakemake_env

pytestmark = pytest.mark.e2e

CONFIG = "deadlinetest.yaml"
R = "deadline-results"
GRID = f"""
results_dir: {R}
protocol: {{warmup_steps: 1, measured_steps: 1, repeats: 2, seq_len: 32, timeout_s: 600, seed: 0}}
pretrain:
  - name: a cell of two repeats and a max-batch search
    platforms: [cpu]
    models: [tiny]
    techniques: [Naive]
    batch_sizes: [1]
    max_batch: {{max: 4}}
"""
CELL = f"{R}/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g1/record.json"
SEARCH = f"{R}/runs/search/pretrain/cpu/tiny/deepspeed/Naive-g1"


def batch(workspace, targets, **env):
    runner = workspace / "venv-run.sh"  # offline-run.sh's stand-in: the venv's snakemake, not the wheelhouse's
    runner.write_text('#!/usr/bin/env bash\nshift\nexec snakemake "$@"\n')
    listing = workspace / "todo.txt"
    listing.write_text("".join(f"{t}\n" for t in targets))
    done = subprocess.run(["bash", str(workspace / "envs/offline-batch.sh"), "WHL", "600", str(listing),
                           "--configfile", CONFIG, "--cores", "2"], cwd=workspace, capture_output=True, text=True,
                          env=snakemake_env({"OFFLINE_RUN": str(runner), "FIRST_S": "1", **env}), timeout=1200)
    return done, [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]


def test_jobs_past_their_deadline_stop_before_running_and_say_so(workspace):
    (workspace / CONFIG).write_text(GRID)
    for target, what in ((CELL, "repeat 0 (of 0-1)"), (SEARCH, "the probe at batch")):
        done, lines = batch(workspace, [target], DEADLINE_SLACK_S="1000")
        assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
        assert len(lines) == 1 and lines[0].startswith(f"offline-batch: {target}  stopped before {what}"), lines
        assert "at the deadline: 0 s left, no time is left" in lines[0]
    assert not (workspace / CELL).exists() and not (workspace / SEARCH / "search.json").exists()
    assert not list((workspace / CELL).parent.glob(".repeat-*.json"))  # nothing ran

    done, lines = batch(workspace, [CELL])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((workspace / CELL).read_text())
    assert record["status"] == "ok" and len(record["metrics"]["tokens_per_s_runs"]) == 2
    assert lines[0].startswith(f"offline-batch: {CELL}  ok  ")
