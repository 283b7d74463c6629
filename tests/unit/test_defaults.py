"""Defaults in one place: the config schema. The dataclasses built from config keys take
their defaults and bounds from it, so a direct call and a run through Snakemake (which fills
the schema's defaults in) agree; these tests fail when a literal default or bound drifts
back into a dataclass."""

import dataclasses

import pytest

from llmbench import config
from llmbench.gpus import BusyPolicy
from llmbench.protocol import Protocol
from llmbench.serve.loadgen import LoadSpec

try:  # the cell types' module (llmbench.grid until they move)
    from llmbench.cells import MicroCell, Search, ServeCell
except ImportError:
    from llmbench.cells import MicroCell, Search, ServeCell

#: dataclass, the schema object its keys live in, and field -> key where they differ
BUILT_FROM_SCHEMA = [
    (Protocol, "/$defs/protocol", {}),
    (LoadSpec, "/$defs/load", {}),
    (BusyPolicy, "", {"action": "gpu_busy", "wait_s": "gpu_busy_wait_s"}),
]
#: the grid's cell types: the grid always passes these keys from the validated config, so
#: their own defaults matter only to direct callers; still, they must say the same
CELL_TYPES = [
    # a cell's engine_args are its engine's list; the block's, a map engine -> list
    (ServeCell, "/$defs/serve_block", {"engine_args": None}),
    (MicroCell, "/$defs/micro_block", {}),
    # a search's step is the block's or derived from its technique (null: 1, an FP8 cell's own)
    (Search, "/$defs/max_batch", {"step": None}),
]


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


@pytest.mark.parametrize("cls, pointer, keys", BUILT_FROM_SCHEMA + CELL_TYPES, ids=lambda v: getattr(v, "__name__", None))
def test_a_dataclass_default_is_the_schema_default(cls, pointer, keys):
    """Where the schema has a default, the dataclass's is the same value; where it has
    none (a key the config must give, or one whose absence the code fills in), the
    schema's description states the dataclass's default, so a user reads it there."""
    props = config.schema_properties(pointer)
    checked = 0
    for f in dataclasses.fields(cls):
        key = keys.get(f.name, f.name)
        if key not in props or _default(f) is dataclasses.MISSING:
            continue
        entry, default = props[key], _default(f)
        if "default" in entry:
            assert default == entry["default"] and type(default) in (type(entry["default"]), float), (cls, key)
        else:
            assert f"{default:g}" in entry["description"], (cls, key, default, entry["description"])
        checked += 1
    assert checked >= 2, (cls, "no field of it has a schema entry")


@pytest.mark.parametrize("cls, pointer, keys", BUILT_FROM_SCHEMA, ids=lambda v: getattr(v, "__name__", None))
def test_a_dataclass_accepts_exactly_the_schema_bounds(cls, pointer, keys):
    """A value at a schema bound is accepted, one past it is refused with the key named."""
    required = {"output_len": 1} if cls is LoadSpec else {}
    props = config.schema_properties(pointer)
    tried = 0
    for f in dataclasses.fields(cls):
        entry = props.get(keys.get(f.name, f.name), {})
        for bound, past, ok_at_bound in (("minimum", -1, True), ("exclusiveMinimum", 0, False), ("maximum", 1, True)):
            if bound not in entry:
                continue
            at = entry[bound]
            if ok_at_bound:
                cls(**{**required, f.name: at})
            with pytest.raises(ValueError, match=keys.get(f.name, f.name)):
                cls(**{**required, f.name: at + past})
            tried += 1
    assert tried >= 1


def test_the_values_that_drifted_are_the_schemas():
    """LoadSpec said 0 warm-up requests and a 600 s request timeout where the schema (what
    Snakemake gives every serving cell) says 4 and 3600; Protocol took a seq_len of 1 and a
    timeout of 1 s that the schema refuses."""
    load = LoadSpec(output_len=1)
    assert (load.warmup_requests, load.request_timeout_s) == (4, 3600)
    for bad in ({"seq_len": 1}, {"timeout_s": 5}):
        with pytest.raises(ValueError, match=f"protocol.{next(iter(bad))}"):
            Protocol(**bad)
    assert BusyPolicy() == BusyPolicy.from_config({}) and (BusyPolicy().action, BusyPolicy().wait_s) == ("error", 600)
