"""The contract (llmbench.cells): every cell's path reads back, through the wildcard
regexes, to the fields that made it, and from them to the same cell; the grammar has one
copy, which the workflow's templates and the report's path readers use."""

import re
from pathlib import Path

import pytest

from llmbench import cells, grid
from llmbench.cells import Cell, MicroCell, Search, ServeCell

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def every_kind():
    """The tests' own grid (every backend and technique family, serving, micro, a search)
    and the paper's (megatron layouts, 4-bit, three platforms)."""
    return [grid.load(REPO / ".test" / "config.yaml"), grid.load(REPO / "config" / "paper.yaml")]


def snakemake_wildcards(template: str, path: str) -> dict[str, str]:
    """The wildcards Snakemake would read from ``path`` for an output ``template``: each
    {field} as its constraint (common.smk's wildcard_constraints), the rest literal."""
    regex, pos = "", 0
    for m in re.finditer(r"\{(\w+)\}", template):
        regex += re.escape(template[pos:m.start()]) + f"(?P<{m.group(1)}>{cells.WILDCARD_CONSTRAINTS[m.group(1)]})"
        pos = m.end()
    m = re.fullmatch(regex + re.escape(template[pos:]), path)
    assert m, (template, path)
    return {k: v for k, v in m.groupdict().items() if k in cells.WILDCARD_CONSTRAINTS}


def test_every_cell_round_trips_cell_path_wildcards_cell(every_kind):
    kinds = set()
    for g in every_kind:
        for cell in g.cells:
            path = cell.record_path("results")
            parsed = cells.parse(path)
            assert parsed is not None and parsed.pattern == cell.pattern and parsed.root == "results", path
            assert parsed.wildcards == {k: str(v) for k, v in cell.key.items()}
            assert snakemake_wildcards(f"results/{cell.pattern}", path) == {
                k: v for k, v in parsed.wildcards.items() if f"{{{k}}}" in cell.pattern}
            assert g.find(**parsed.wildcards) == cell  # what the rules' input functions do
            assert cells.cell_from_dict(cell.to_dict()) == cell
            kinds.add((type(cell).__name__, getattr(cell, "backend", None)))
    assert {k for k, _ in kinds} == {"Cell", "ServeCell", "MicroCell"}
    assert {b for _, b in kinds} >= {"deepspeed", "megatron", "torch", "inference"}


def test_searches_and_their_probes_and_frontier_round_trip(every_kind):
    searches = [s for g in every_kind for s in g.searches]
    assert searches
    for s in searches:
        folder = s.record_path("results")
        assert cells.parse(folder, (cells.SEARCH_PATTERN,)).wildcards == {k: str(v) for k, v in s.key.items()}
        probe = cells.parse(f"{folder}/bs7/record.json")
        assert probe.is_probe and probe.wildcards == {**{k: str(v) for k, v in s.key.items()}, "batch_size": "7"}
        assert probe.root == "results"
        frontier = cells.parse(s.frontier_path("results"), (cells.FRONTIER_PATTERN,))
        assert frontier.wildcards == {k: str(v) for k, v in s.key.items()}
        measured = s.measured(7)
        assert cells.parse(measured.record_path("r")).wildcards["batch_size"] == "7"
        summary = cells.SEARCH_SUMMARY_PATTERN.format(**cells.parse(measured.record_path("r")).wildcards)
        assert f"r/{summary}" == f"{s.record_path('r')}/search.json"


def test_paths_that_follow_no_pattern_are_not_read_as_cells():
    for path in ["results/runs/pretrain/cpu/tiny/deepspeed/Z3/record.json",  # no bs-g folder
                 "results/runs/train/cpu/tiny/deepspeed/Z3/bs1-g1/record.json",  # no such stage
                 "results/runs/micro/cpu/fft/x-g1/record.json",  # no such bench
                 "results/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-g1/spec.json",
                 "results/myruns/serve/cpu/tiny/vllm/burst-g1/record.json"]:  # "runs" must be a whole folder
        assert cells.parse(path) is None, path


def test_workflow_templates_are_the_patterns():
    assert cells.cell_dir(cells.RECORD_PATTERN) == "{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}"
    assert cells.cell_dir(cells.SERVE_RECORD_PATTERN) == "{platform}/{model}/{engine}/{load}-g{gpus}"
    assert cells.cell_dir(cells.MICRO_RECORD_PATTERN) == "{platform}/{bench}/{case}-g{gpus}"
    assert cells.cell_dir(cells.SEARCH_PATTERN) == "{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}"
    rules = "".join(f.read_text() for f in (REPO / "workflow" / "rules").glob("*.smk"))
    # no rule spells a record path of its own: outputs come from common.smk's RECORD ... names
    assert not re.search(r'\{R\}/runs/', rules)
    for name in ("RECORD_PATTERN", "SERVE_RECORD_PATTERN", "MICRO_RECORD_PATTERN", "SEARCH_PATTERN"):
        assert f"lbcells.{name}" in rules


def test_the_patterns_are_written_once_in_the_library():
    lib = REPO / "workflow" / "scripts" / "llmbench"
    for needle in ("-g{gpus}", "runs/serve/", "runs/micro/"):
        holders = sorted(str(f.relative_to(lib)) for f in lib.rglob("*.py")
                         if needle in f.read_text() and f.name != "cells.py")
        assert holders == [], (needle, holders)


def test_cells_are_frozen_and_light():
    cell = Cell(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", technique="Z3",
                batch_size=1, gpus=1, protocol=grid.expand({"protocol": {}, "pretrain": [
                    {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1]}]}).cells[0].protocol)
    with pytest.raises(AttributeError):
        cell.batch_size = 2
    source = (REPO / "workflow" / "scripts" / "llmbench" / "cells.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+(torch|pandas|numpy)\b", source, re.M)
    assert {ServeCell.PATTERN, MicroCell.PATTERN, Cell.PATTERN, Search.PATTERN} == {
        cells.SERVE_RECORD_PATTERN, cells.MICRO_RECORD_PATTERN, cells.RECORD_PATTERN, cells.SEARCH_PATTERN}


def test_record_dirs_hold_every_record_of_their_stage(every_kind):
    assert cells.record_dirs() == ["runs"]
    for g in every_kind:
        for c in g.cells:
            assert any(c.record_path("r").startswith(f"r/{d}/") for d in cells.record_dirs(c.stage))
        for s in g.searches:
            assert any(f"{s.record_path('r')}/bs1/record.json".startswith(f"r/{d}/") for d in cells.record_dirs(s.cell.stage))
