"""The backend registry (llmbench.backends) is the one list of backends: the schema's enum,
the grid's checks and the launcher's worker all come from it."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import yaml

from llmbench import backends, grid, launch
from llmbench.cells import TRAINING_STAGES
from llmbench.config import ConfigError

REPO = Path(__file__).resolve().parents[2]


def schema_enum(key: str) -> list:
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get(key), dict) and "enum" in node[key]:
                found.append(node[key]["enum"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    assert len(found) == 1, f"one {key} key with an enum in the schema (the training blocks')"
    return found[0]


def test_the_schemas_enums_are_the_registry():
    # as sets: the schema lists them in the order its description explains them
    assert schema_enum("backend")[-1] is None and set(schema_enum("backend")) == {*backends.BACKENDS, None}
    assert schema_enum("profile")[-1] is None and set(schema_enum("profile")) == {*backends.PROFILES, None}
    assert backends.PROFILES == {"training": "torch", "inference": "inference", "communication": "deepspeed",
                                 "engine": "vllm"}


def test_every_backend_has_a_worker_module_and_a_record_builder():
    for b in backends.BACKENDS.values():
        assert importlib.util.find_spec(b.worker) is not None, b.name
        module, func = b.record_builder.split(":")
        assert importlib.util.find_spec(module) is not None, b.name
        assert callable(b.build_record()), b.name
        assert set(b.stages) <= set(TRAINING_STAGES) and set(b.default_for) <= set(b.stages), b.name


def test_each_training_stage_has_one_default_and_it_is_listed_first():
    for stage in TRAINING_STAGES:
        defaults = [b.name for b in backends.BACKENDS.values() if stage in b.default_for]
        assert len(defaults) == 1, stage
        assert backends.for_stage(stage)[0] == backends.default(stage) == defaults[0]
    assert backends.for_stage("profile") == ("torch", "deepspeed", "inference", "vllm")
    with pytest.raises(KeyError, match="unknown backend 'jax'; known: deepspeed, megatron, fsdp2, torch, inference, vllm"):
        backends.get("jax")


def test_the_grid_checks_technique_flags_against_the_registry(monkeypatch):
    block = {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["R+Z2"], "batch_sizes": [1]}
    grid.expand({"protocol": {}, "pretrain": [block]})  # deepspeed takes every flag
    monkeypatch.setitem(backends.BACKENDS, "deepspeed", dataclasses.replace(
        backends.BACKENDS["deepspeed"], flags=("R",), flags_why="a test says so"))
    with pytest.raises(ConfigError, match=r"pretrain\[0\]\.techniques\[0\]: backend 'deepspeed' supports the flags R; "
                                          r"'R\+Z2' asks for Z2 \(a test says so\)"):
        grid.expand({"protocol": {}, "pretrain": [block]})


def test_a_new_backend_is_one_registry_entry(monkeypatch, tmp_path):
    """Registered, a backend runs its stages (the grid's check) and the launcher starts its
    worker module; the schema's enum is the one other edit (test_the_schemas_enum_is_the_registry)."""
    monkeypatch.setitem(backends.BACKENDS, "fake", backends.Backend(
        name="fake", stages=("pretrain",), worker="fake_worker", flags=("F",), flags_why="it is fake"))
    assert backends.for_stage("pretrain") == ("deepspeed", "megatron", "fsdp2", "fake")
    started = []
    monkeypatch.setattr(launch, "run_worker", lambda ranks, module, *a, **k: started.append(module))
    g = grid.expand({"protocol": {}, "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["F"],
                                                   "batch_sizes": [1]}]})
    cell = dataclasses.replace(g.cells[0], backend="fake")
    launch.run_repeat({**g.spec(g.cells[0]), "cell": cell.to_dict()}, tmp_path, 0, tmp_path / "log", 1)
    assert started == ["fake_worker"]
    assert cell.record_path().startswith("results/runs/pretrain/cpu/tiny/fake/F/")


@pytest.mark.parametrize("profile, builder", [("training", "profile"), ("inference", "profile"),
                                              ("communication", "aggregate")])
def test_the_launcher_builds_a_profile_cells_record_with_its_backends_builder(monkeypatch, tmp_path, profile, builder):
    """Module-wise profiles (torch, inference) give profile rows; a DeepSpeed profile the
    training record (its kernel classes ride in the result), as before the registry."""
    from llmbench import aggregate
    from llmbench.profile import results

    built = []
    for name, module in (("profile", results), ("aggregate", aggregate)):
        real = module.build_record
        monkeypatch.setattr(module, "build_record", lambda *a, _n=name, _r=real: built.append(_n) or _r(*a))
    monkeypatch.setattr(launch, "run_repeat", lambda *a, **k: aggregate.Outcome(status="error", reason="not run"))
    g = grid.expand({"protocol": {"repeats": 1}, "profile": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["F"],
                                                             "batch_sizes": [1], "profile": profile}]})
    rec = launch.run_cell(g.spec(g.cells[0]), tmp_path / "record.json", tmp_path / "log")
    assert built == [builder] and rec.status == "error"
