"""The memory model through the workflow on the CPU, for real: with skip_predicted_oom a cell
predicted not to fit its memory cap gets a skipped record and runs nothing, the one that fits
runs; the validation table has a row per record; forcing (skip_predicted_oom=false) runs the
skipped cell, which then really runs out of memory. Tests in this module run in order on one
workspace."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from workspaces import snakemake

pytestmark = pytest.mark.e2e

CONFIG = "memtest.yaml"
R = "memtest-results"
GRID = f"""
results_dir: {R}
skip_predicted_oom: true
protocol: {{warmup_steps: 1, measured_steps: 2, repeats: 1, seq_len: 350, timeout_s: 600, seed: 0}}
pretrain:
  - name: fits
    platforms: [cpu]
    models: [tiny]
    techniques: [Naive]
    batch_sizes: [1]
  - name: the logits of 64 x 350 tokens alone exceed the cap
    platforms: [cpu]
    models: [tiny]
    techniques: [Naive]
    batch_sizes: [64]
    mem_cap_gib: 1.5
"""
FITS = f"{R}/runs/pretrain/cpu/tiny/deepspeed/Naive/bs1-g1/record.json"
SKIPPED = f"{R}/runs/pretrain/cpu/tiny/deepspeed/Naive/bs64-g1/record.json"
TABLE = f"{R}/tables/memory-model.csv"


def run(workspace, *args):
    return snakemake(workspace, *args, "--configfile", CONFIG, "--cores", "2")


def test_the_cell_predicted_not_to_fit_is_skipped_and_the_table_has_every_record(workspace):
    (workspace / CONFIG).write_text(GRID)
    done = run(workspace, TABLE, f"{R}/tables/memory-model.md")
    assert done.returncode == 0, done.stderr[-3000:]
    fits, skipped = (json.loads((workspace / p).read_text()) for p in (FITS, SKIPPED))
    assert fits["status"] == "ok"
    assert skipped["status"] == "skipped" and "predicted not to fit" in skipped["reason"]
    assert skipped["summary"]["predicted_gpu_gib"] > skipped["summary"]["capacity_gib"] == 1.5
    assert skipped["summary"]["margin"] > 0 and skipped["provenance"]["launchers"] == ["not started"]
    table = pd.read_csv(workspace / TABLE).set_index("batch_size")
    assert len(table) == 2 and table.loc[1, "status"] == "ok" and table.loc[64, "status"] == "skipped"
    assert pd.isna(table.loc[1, "predicted_fits"])  # no cap: nothing to compare with
    assert not table.loc[64, "predicted_fits"] and table.loc[64, "capacity_gib"] == 1.5
    assert all(math.isfinite(v) and v > 0 for v in table["predicted_gib"])
    assert "Median |error|" in (workspace / R / "tables/memory-model.md").read_text()


def test_forcing_runs_the_skipped_cell(workspace):
    (workspace / SKIPPED).unlink()
    done = run(workspace, SKIPPED, "--config", "skip_predicted_oom=false")
    assert done.returncode == 0, done.stderr[-3000:]
    forced = json.loads((workspace / SKIPPED).read_text())
    assert forced["status"] == "oom", forced["reason"]  # the prediction was right: it does not fit
