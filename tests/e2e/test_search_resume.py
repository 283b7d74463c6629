"""A max-batch search stopped mid-way and resumed, through Snakemake for real: Snakemake is
sent TERM (as envs/offline-batch.sh's deadline does) while the search probes, and leaves its
folder incomplete and its lock behind, or removes the folder as a failed job's output;
envs/offline-batch.sh, given the target again, removes any lock and reruns it with
--rerun-incomplete, which deletes what is left of the folder; the search
answers the probes that ran from its frontier file and puts their records back
(llmbench.search.frontier.Frontier.restore) instead of losing them, and goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from workspaces import BIN, snakemake, snakemake_env

pytestmark = pytest.mark.e2e

CONFIG = "resumetest.yaml"
R = "resume-results"
GRID = f"""
results_dir: {R}
protocol: {{warmup_steps: 1, measured_steps: 1, repeats: 1, seq_len: 350, timeout_s: 600, seed: 0}}
pretrain:
  - name: a search of several probes under a real host-RSS cap
    platforms: [cpu]
    models: [tiny]
    techniques: [Naive]
    max_batch: {{max: 32}}
    mem_cap_gib: 1.25
"""
FOLDER = f"{R}/runs/search/pretrain/cpu/tiny/deepspeed/Naive-g1"
FRONTIER = f"{R}/frontier/pretrain/cpu/tiny/deepspeed/Naive-g1.json"


def run(workspace, *args):
    return snakemake(workspace, FOLDER, *args, "--configfile", CONFIG, "--cores", "2")


def test_a_search_stopped_mid_way_resumes_with_the_records_of_its_probes(workspace):
    (workspace / CONFIG).write_text(GRID)
    folder = workspace / FOLDER
    proc = subprocess.Popen([str(BIN / "snakemake"), FOLDER, "--configfile", CONFIG, "--cores", "2"],
                            cwd=workspace, env=snakemake_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 900
        while proc.poll() is None and time.monotonic() < end and len(list(folder.glob("bs*/record.json"))) < 2:
            time.sleep(0.5)
        assert proc.poll() is None, "the search ended before it could be stopped"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not (folder / "search.json").exists()
    # the probes that ran and that the frontier kept: their records as the stopped run wrote
    # them, read from the frontier's copies (what Frontier.restore puts back)
    kept = {b: v for b, v in json.loads((workspace / FRONTIER).read_text())["probes"].items() if "record" in v}
    assert kept
    copies = (workspace / FRONTIER).with_suffix(".probes")
    before = {b: (copies / f"bs{b}" / "record.json").read_text() for b in kept}

    # Snakemake, stopping, either left the folder incomplete with its lock behind, or had
    # already handled the killed job as failed and removed its output (which of the two
    # depends on which process the TERM reached first). Left: a plain rerun is refused.
    # Either way envs/offline-batch.sh, given the same target (through a stand-in for
    # offline-run.sh: the venv's snakemake instead of the wheelhouse's), removes any lock,
    # reruns it with --rerun-incomplete, then measures
    if folder.exists():
        assert all((folder / f"bs{b}" / "record.json").read_text() == text for b, text in before.items())
        refused = run(workspace)
        assert refused.returncode != 0 and "incomplete" in (refused.stdout + refused.stderr).lower()
    runner = workspace / "venv-run.sh"
    runner.write_text('#!/usr/bin/env bash\nshift\nexec snakemake "$@"\n')
    listing = workspace / "todo.txt"
    listing.write_text(f"{FOLDER}\n")
    done = subprocess.run(["bash", str(workspace / "envs/offline-batch.sh"), "WHL", "900", str(listing),
                           "--configfile", CONFIG, "--cores", "2"], cwd=workspace, capture_output=True, text=True,
                          env=snakemake_env({"OFFLINE_RUN": str(runner), "FIRST_S": "1"}), timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [x for x in done.stdout.splitlines() if x.startswith("offline-batch:")]
    assert lines[0].startswith(f"offline-batch: {FOLDER}  search ok") and "  ok  " in lines[1]
    summary = json.loads((folder / "search.json").read_text())
    source = {str(p["batch_size"]): p["source"] for p in summary["probes"]}
    for b, text in before.items():
        assert source[b] == "resumed"  # it ran in the stopped run, not again
        assert (folder / f"bs{b}" / "record.json").read_text() == text  # the record that ran, not skipped
        assert json.loads(text)["status"] in ("ok", "oom")
    assert summary["largest_ok"] and any(s == "run" for s in source.values())  # it went on where it was
    # its cost counts the probes of both runs
    assert summary["n_run"] == sum(s in ("run", "resumed") for s in source.values()) > len(before)
