"""The run spec parsed once (llmbench.spec.RunSpec): its JSON form kept as written, its typed
fields those the grid holds, a bad spec named by its key, the technique parsed once."""

import copy
import dataclasses
import json

import pytest

from llmbench import grid, techniques
from llmbench.cells import Cell, MicroCell, ServeCell
from llmbench.config import ConfigError, available
from llmbench.memory.model import Workload, predict
from llmbench.platforms import Platform
from llmbench.search.frontier import probe_spec, rerun_spec
from llmbench.spec import RunSpec

from conftest import REPO

CONFIGS = ("config/config.yaml", ".test/config.yaml")


def kind(cell):
    """training, profile, serve or micro."""
    return cell.stage if cell.stage in ("profile", "serve", "micro") else "training"


@pytest.fixture(scope="module", params=CONFIGS)
def loaded(request):
    return grid.load(REPO / request.param, REPO)


def test_every_cell_of_a_grid_parses_to_its_typed_fields_and_keeps_its_json_as_written(loaded):
    seen = set()
    for cell in loaded.cells:
        spec = loaded.spec(cell)
        rs = RunSpec.parse(spec)
        assert json.dumps(rs.raw) == json.dumps(spec)  # as written: same keys, same order
        assert rs.cell == cell and type(rs.cell) is type(cell)
        # the platform file less its Slurm block (where a job queues is not in the spec)
        assert rs.platform == dataclasses.replace(loaded.platforms[cell.platform], slurm={})
        assert rs.model == (None if isinstance(cell, MicroCell) else loaded.models[cell.model])
        assert rs.tech == (techniques.parse(cell.technique) if isinstance(cell, Cell) else None)
        assert rs.engine_python == spec.get("engine_python") and rs.search is None
        assert RunSpec.of(rs) is rs
        seen.add(kind(cell))
    assert "training" in seen  # every grid here has training cells; .test's has each kind (below)


def test_the_test_grid_has_a_cell_of_each_kind():
    g = grid.load(REPO / ".test/config.yaml", REPO)
    assert {kind(c) for c in g.cells} == {"training", "profile", "serve", "micro"}
    served = next(c for c in g.cells if isinstance(c, ServeCell))
    assert RunSpec.parse(g.spec(served)).tech is None


def test_a_spec_changed_after_parsing_does_not_change_what_was_parsed(loaded):
    spec = loaded.spec(next(c for c in loaded.cells if isinstance(c, Cell)))
    rs = RunSpec.parse(spec)
    spec["cell"]["batch_size"] += 1
    spec["platform"]["env"]["ADDED"] = "1"
    assert rs.raw["cell"]["batch_size"] == rs.cell.batch_size == spec["cell"]["batch_size"] - 1
    assert "ADDED" not in rs.raw["platform"]["env"] and "ADDED" not in rs.platform.env


def test_every_platform_and_model_round_trips():
    for name in available("platform", REPO):
        p = Platform.load(name, REPO)
        assert Platform.from_dict(p.to_dict()) == p
    g = grid.load(REPO / ".test/config.yaml", REPO)
    for m in g.models.values():
        assert type(m).from_dict(m.to_dict()) == m


@pytest.fixture
def spec():
    g = grid.load(REPO / ".test/config.yaml", REPO)
    return g.spec(next(c for c in g.cells if isinstance(c, Cell) and c.stage == "pretrain"))


@pytest.mark.parametrize("change, needle", [
    (lambda s: s["platform"].update(colour="blue"), r"run spec: platform\.colour: unknown key of a Platform"),
    (lambda s: s["platform"].pop("accelerator"), r"run spec: platform\.accelerator: missing"),
    (lambda s: s["model"].pop("hidden_size"), r"run spec: model\.hidden_size: missing"),
    (lambda s: s.pop("model"), r"run spec: missing key 'model' \(a pretrain cell"),
    (lambda s: s.pop("platform"), r"run spec: missing key 'platform'"),
    (lambda s: s.update(extra=1), r"run spec: unknown key\(s\) 'extra'"),
    (lambda s: s["cell"].update(colour="blue"), r"run spec: cell\.colour: unknown key of a Cell"),
    (lambda s: s["cell"].update(technique="Z4"), r"run spec: cell: unknown flag 'Z4'"),
    (lambda s: s["model"].update(num_attention_heads=3), r"run spec: model: num_attention_heads: 3"),
    (lambda s: s["cell"]["protocol"].update(seq_len=0), r"run spec: cell: protocol\.seq_len"),
])
def test_a_bad_spec_is_refused_naming_the_key(spec, change, needle):
    RunSpec.parse(spec)  # as the grid made it: fine
    bad = copy.deepcopy(spec)
    change(bad)
    with pytest.raises(ConfigError, match=needle):
        RunSpec.parse(bad)


def test_with_cell_changes_only_those_keys_of_the_cell(spec):
    rs = RunSpec.parse(spec)
    at = rs.with_cell(batch_size=7)
    assert at.cell.batch_size == 7 and at.raw["cell"]["batch_size"] == 7 and at.tech is rs.tech
    assert {**at.raw, "cell": {**at.raw["cell"], "batch_size": spec["cell"]["batch_size"]}} == spec
    assert rs.raw == spec and rs.cell.batch_size == spec["cell"]["batch_size"]  # the original as it was


def test_a_search_probe_spec_is_the_search_spec_rewritten_as_before():
    """A probe's spec (its record's provenance.spec) and a search's rerun trigger are the
    JSON they were when the runner rewrote the dict itself: same keys, values and order."""
    g = grid.load(REPO / ".test/config.yaml", REPO)
    search = g.spec(g.searches[0])
    settings = search["search"]
    trigger = rerun_spec(search)
    assert json.dumps(trigger) == json.dumps(
        {**search, "cell": {**search["cell"], "batch_size": settings["start"], "protocol": settings["probe_protocol"]}})
    rs = RunSpec.parse(trigger)
    assert rs.search == settings
    probe = probe_spec(rs, 5)
    expected = {k: v for k, v in trigger.items() if k != "search"}
    expected["cell"] = {**trigger["cell"], "batch_size": 5}
    assert json.dumps(probe.raw) == json.dumps(expected) and probe.search is None and probe.cell.batch_size == 5


def test_a_technique_is_parsed_once_per_name():
    """Many specs of a few techniques: techniques.parse runs once per name (its cache's
    misses), and the memory model's workload reads the same parsed object, parsing nothing."""
    g = grid.load(REPO / ".test/config.yaml", REPO)
    specs = [g.spec(c) for c in g.cells if isinstance(c, Cell)]
    names = {s["cell"]["technique"] for s in specs}
    assert len(specs) > len(names) > 1
    techniques.parse.cache_clear()
    parsed = [RunSpec.parse(s) for s in specs]
    info = techniques.parse.cache_info()
    assert info.misses == len(names) and info.hits >= len(specs) - len(names)
    by_name = {}
    for rs in parsed:
        assert by_name.setdefault(rs.cell.technique, rs.tech) is rs.tech  # one object per name
    modelled = next(rs for rs in parsed if rs.cell.backend == "deepspeed" and rs.tech.zero_stage == 3)
    before = techniques.parse.cache_info()
    w = Workload.from_spec(modelled)
    predict(w)
    assert w.tech is modelled.tech and techniques.parse.cache_info().misses == before.misses
