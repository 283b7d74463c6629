"""The run spec, parsed once: what one job of the grid carries (llmbench.grid.Grid.spec).

A spec is JSON::

    {"cell": {...}, "platform": {...}, "model": {...}}      a training, profile or serving cell
    {"cell": {...}, "platform": {...}}                       a microbenchmark cell
    ... "engine_python": "..."                               a serving cell, an engine profile
    ... "search": {start, max, headroom, probe_protocol[, step]}   a max-batch search

Its JSON form is a contract: it is Snakemake's params rerun trigger (a changed spec reruns
the cell) and every record keeps it (``provenance.spec``), so nothing here rewrites it.
RunSpec keeps it as written (``raw``) beside the typed objects parsed from it once: the
launcher, the record builders, the memory model and the workers read the typed fields, and
hand ``raw`` on where JSON crosses a boundary (the spec.json a worker reads, a record, the
digest of a kept repeat). A function that is given a spec by a Snakemake adapter, a test
or another process takes either form (``RunSpec.of``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, replace
from typing import Any

from .cells import Cell, MicroCell, ServeCell, cell_class
from .config import ConfigError
from .models import ModelSpec
from .platforms import Platform
from .techniques import Technique

#: The keys every spec has, and those some have.
REQUIRED = ("cell", "platform")
OPTIONAL = ("model", "engine_python", "search")


@dataclass(kw_only=True, slots=True, frozen=True)
class RunSpec:
    """A job's spec parsed once: its cell, platform, model and technique, typed, and the JSON as written."""

    cell: Cell | ServeCell | MicroCell
    """The cell (llmbench.cells)."""
    platform: Platform
    """What it runs on: its platform file less the Slurm block."""
    model: ModelSpec | None
    """The model it trains or serves; None for a microbenchmark."""
    tech: Technique | None
    """A training or profile cell's technique, parsed; None for serving and microbenchmark cells."""
    engine_python: str | None = None
    """The serving engine's interpreter (a serving cell, an engine profile; None: the workflow's)."""
    search: dict[str, Any] | None = None
    """A max-batch search's settings (start, max, headroom, probe_protocol, step where not 1:
    llmbench.cells.Search.to_dict);
    None for a cell."""
    raw: dict[str, Any]
    """The spec as written (a copy; do not modify): what a worker reads, a record keeps and a
    digest hashes."""

    @classmethod
    def parse(cls, spec: Mapping[str, Any]) -> RunSpec:
        """The typed spec of ``spec`` (a spec's JSON form); ConfigError naming the bad key."""
        if not isinstance(spec, Mapping):
            raise ConfigError(f"run spec: expected a mapping with keys {', '.join(REQUIRED)}, got {type(spec).__name__}")
        if unknown := sorted(set(spec) - {*REQUIRED, *OPTIONAL}):
            raise ConfigError(f"run spec: unknown key(s) {', '.join(map(repr, unknown))}; allowed keys: "
                              f"{', '.join(REQUIRED + OPTIONAL)}")
        if missing := [k for k in REQUIRED if k not in spec]:
            raise ConfigError(f"run spec: missing key {missing[0]!r}")
        raw = copy.deepcopy(dict(spec))
        stage = raw["cell"].get("stage") if isinstance(raw["cell"], Mapping) else None
        kind = cell_class(stage)
        cell = _part("cell", raw["cell"], kind, kind.from_dict)
        platform = _part("platform", raw["platform"], Platform, Platform.from_dict)
        model = None
        if raw.get("model") is not None:
            model = _part("model", raw["model"], ModelSpec, ModelSpec.from_dict)
        elif not isinstance(cell, MicroCell):
            raise ConfigError(f"run spec: missing key 'model' (a {cell.stage} cell trains or serves a model)")
        engine_python = raw.get("engine_python")
        if engine_python is not None and not isinstance(engine_python, str):
            raise ConfigError(f"run spec: engine_python: expected a path or null, got {engine_python!r}")
        search = raw.get("search")
        if search is not None and not isinstance(search, Mapping):
            raise ConfigError(f"run spec: search: expected a mapping, got {type(search).__name__}")
        return cls(cell=cell, platform=platform, model=model, tech=_tech(cell), engine_python=engine_python,
                   search=search, raw=raw)

    @classmethod
    def of(cls, spec: RunSpec | Mapping[str, Any]) -> RunSpec:
        """``spec`` itself where it is parsed already, else RunSpec.parse(spec)."""
        return spec if isinstance(spec, RunSpec) else cls.parse(spec)

    def with_cell(self, **changes: Any) -> RunSpec:
        """This spec with its cell's fields ``changes`` replaced (a search's probe: batch_size,
        protocol): a new RunSpec whose ``raw`` differs from this one's in those keys of its
        cell only (each in the cell's plain-data form)."""
        cell = replace(self.cell, **changes)
        new, old = cell.to_dict(), self.raw["cell"]
        raw_cell = {k: new[k] if k in changes else v for k, v in old.items() if k not in changes or k in new}
        raw_cell.update({k: new[k] for k in changes if k in new and k not in old})
        return replace(self, cell=cell, tech=_tech(cell), raw={**self.raw, "cell": raw_cell})

    def without_search(self) -> RunSpec:
        """This spec less its search's settings (a search's probe is a cell of its own)."""
        return replace(self, search=None, raw={k: v for k, v in self.raw.items() if k != "search"})


def raw_of(spec: RunSpec | Mapping[str, Any]) -> dict[str, Any]:
    """A spec's JSON form, whichever form it is given in (nothing is parsed)."""
    return spec.raw if isinstance(spec, RunSpec) else dict(spec)


def _tech(cell: Cell | ServeCell | MicroCell) -> Technique | None:
    return cell.tech if isinstance(cell, Cell) else None


def _part(key: str, data: Any, kind: type, make: Callable[[dict[str, Any]], Any]) -> Any:
    """One part of a spec (its cell, platform or model) as ``kind``, by ``make``; ConfigError
    naming ``key`` and, for an unknown or missing field, the field."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"run spec: {key}: expected a mapping, got {type(data).__name__}")
    names = [f.name for f in fields(kind) if f.init]
    if unknown := sorted(set(data) - set(names)):
        raise ConfigError(f"run spec: {key}.{unknown[0]}: unknown key of a {kind.__name__}; allowed keys: "
                          f"{', '.join(names)}")
    required = [f.name for f in fields(kind) if f.init and f.default is MISSING and f.default_factory is MISSING]
    if missing := [n for n in required if n not in data]:
        raise ConfigError(f"run spec: {key}.{missing[0]}: missing (a {kind.__name__} needs {', '.join(required)})")
    try:
        return make(dict(data))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"run spec: {key}: {exc}") from None
