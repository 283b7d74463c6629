"""Calibration tier: every committed run (results/reference/<run>/) is self-contained.

A folder that holds records holds the config that made them (config.yaml), and every record
in it is a cell of that config, a probe of one of its max-batch searches, or the cell such a
search measured at the batch it found. They change when a run is added, merged or moved."""

import re
from pathlib import Path

import pytest

from llmbench import grid

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "results" / "reference"
#: folders that are no run of their own: the combined view of all the others
NOT_RUNS = {"combined"}


def runs() -> list[Path]:
    return sorted(p for p in REFERENCE.iterdir() if p.is_dir() and p.name not in NOT_RUNS)


def explains(g: grid.Grid, rel: str) -> bool:
    """Whether the record at ``rel`` (below its results folder) belongs to the grid ``g``."""
    if rel in {c.record_path("")[1:] for c in g.cells}:
        return True
    for s in g.searches:
        folder = s.record_path("")[1:]
        measured = re.escape(s.cell.record_path("")[1:]).replace(re.escape(f"/bs{s.cell.batch_size}-"), r"/bs\d+-")
        if rel.startswith(folder + "/") or re.fullmatch(measured, rel):
            return True
    return False


@pytest.mark.parametrize("run", runs(), ids=lambda p: p.name)
def test_a_run_with_records_holds_the_config_that_made_them(run):
    records = sorted(str(p.relative_to(run)) for p in run.rglob("record.json"))
    if not records:
        pytest.skip("no records: a benchmark's output, its README names the command")
    config = run / "config.yaml"
    assert config.is_file(), f"{run.name} holds records but no config.yaml"
    g = grid.load(config)
    assert [r for r in records if not explains(g, r)] == []


def test_explains_tells_a_cell_of_the_config_from_one_that_is_not():
    g = grid.expand({"protocol": {"repeats": 1}, "finetune": [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["L"], "batch_sizes": [1]},
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["L+R"], "max_batch": {"max": 64}}]})
    assert explains(g, "runs/finetune/cpu/tiny/deepspeed/L/bs1-g1/record.json")
    assert not explains(g, "runs/finetune/cpu/tiny/deepspeed/L/bs2-g1/record.json")
    assert explains(g, "runs/search/finetune/cpu/tiny/deepspeed/L+R-g1/bs8/record.json")
    assert explains(g, "runs/finetune/cpu/tiny/deepspeed/L+R/bs37-g1/record.json")
    assert not explains(g, "runs/finetune/cpu/tiny/deepspeed/QL/bs1-g1/record.json")
