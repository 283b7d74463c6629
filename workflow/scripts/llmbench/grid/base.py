"""The Grid (a validated config: its cells, searches, platforms and models, immutable once
built) and the Builder that the stages' expansions add to (one de-duplication)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from collections.abc import Iterator, Mapping

from .. import backends
from ..cells import SEARCH_KEY, WILDCARD_CONSTRAINTS, Cell, MicroCell, Search, ServeCell
from ..config import ConfigError, available
from ..models import ModelSpec
from ..platforms import Platform
from .paired import Membership, PairedSet

AnyCell = Cell | ServeCell | MicroCell


@dataclass(kw_only=True, slots=True, frozen=True)
class Grid:
    """A validated config: its cells and the platforms and models they use. Immutable:
    expand builds it whole (llmbench.grid.Builder) and nothing adds to it afterwards."""

    results_dir: str
    """Where the records go (the config's results_dir)."""
    cells: tuple[AnyCell, ...] = ()
    """Every cell, each path once, in the config's order (training stages, serve, micro)."""
    platforms: Mapping[str, Platform] = field(default_factory=dict)
    """The platforms the config names, loaded and validated."""
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    """The models the config names, loaded and validated."""
    engine_python: Mapping[str, str] = field(default_factory=dict)
    """Interpreter of each serving engine's environment (absent: the workflow's own)."""
    searches: tuple[Search, ...] = ()
    """Max-batch searches; the cells they measure are known only once they ran."""
    sets: tuple[PairedSet, ...] = ()
    """Paired sets (llmbench.grid.paired): cells measured together in one job."""
    _index: tuple[dict[frozenset, AnyCell], dict[frozenset, AnyCell]] = field(
        init=False, repr=False, compare=False)
    """Cells by their path fields (as strings), and by those less ``stage``: Snakemake
    asks ``find`` once per job and rule function (~1,200 times for the paper grid)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: the one place the fields are normalised
        set_(self, "cells", tuple(self.cells))
        set_(self, "searches", tuple(self.searches))
        set_(self, "sets", tuple(self.sets))
        for name in ("platforms", "models", "engine_python"):
            set_(self, name, MappingProxyType(dict(getattr(self, name))))
        full: dict[frozenset, AnyCell] = {}
        bare: dict[frozenset, AnyCell] = {}
        for c in self.cells:
            have = {k: str(v) for k, v in c.key.items()}
            full.setdefault(frozenset(have.items()), c)
            bare.setdefault(frozenset((k, v) for k, v in have.items() if k != "stage"), c)
        set_(self, "_index", (full, bare))

    def by_path(self) -> dict[str, AnyCell]:
        """Record path -> Cell."""
        return {c.record_path(self.results_dir): c for c in self.cells}

    def find(self, **key: Any) -> AnyCell:
        """The cell whose path fields equal ``key`` (values compared as strings; a serving
        cell's path has no stage field, so it may be left out)."""
        want = {k: str(v) for k, v in key.items() if k in WILDCARD_CONSTRAINTS}
        wanted = frozenset(want.items())
        for index in self._index:  # exact fields first, then fields less the stage
            if wanted in index:
                return index[wanted]
        if "batch_size" in want:  # the cell a search measures at the batch it found
            search = self.find_search(**want)
            return search.measured(int(want["batch_size"]))
        raise KeyError(f"no cell with {want}")

    def find_search(self, **key: Any) -> Search:
        """The search whose path fields equal ``key`` (other keys ignored)."""
        want = {k: str(v) for k, v in key.items() if k in SEARCH_KEY}
        for s in self.searches:
            if {k: str(v) for k, v in s.key.items()} == want:
                return s
        raise KeyError(f"no max-batch search with {want}")

    def spec(self, cell: AnyCell | Search) -> dict[str, Any]:
        """The fully resolved cell config a runner gets: cell, platform and model (a search:
        its measured cell's, plus its bounds and probe protocol)."""
        if isinstance(cell, Search):
            return {**self.spec(cell.cell), "search": cell.to_dict()}
        platform = self.platforms[cell.platform].to_dict()
        # where a job is queued, and the disk it finds, are not part of the experiment: a
        # partition edit must not change the spec (the params rerun trigger) of every cell
        # of the platform
        platform.pop("slurm")
        platform.pop("disk_gib", None)
        if not _computes_fp8(cell):
            # only FP8 cells read the FP8 peak: adding it to a platform file changes no other
            # cell's spec (the params rerun trigger), so no measured bf16 cell runs again
            for key in ("peak_fp8_tflops", "peak_fp8_source"):
                platform.pop(key, None)
        spec = {"cell": cell.to_dict(), "platform": platform}
        if not isinstance(cell, MicroCell):
            spec["model"] = self.models[cell.model].to_dict()
        if isinstance(cell, ServeCell):
            spec["engine_python"] = self.engine_python.get(cell.engine)
        elif cell.stage == "profile" and backends.get(cell.backend).engine is not None:
            # a profile cell that starts a serving engine (profile: engine)
            spec["engine_python"] = self.engine_python.get(backends.get(cell.backend).engine)
        return spec


class Builder:
    """What the stages' expansions add to while a config is expanded: platforms and models
    loaded once, each cell path once (two blocks that define one path must agree), each
    search once. ``grid()`` freezes it."""

    def __init__(self, config: dict[str, Any], root: Path) -> None:
        self.config = config
        self.root = root
        self.results_dir: str = config["results_dir"]
        self.only: list[str] | None = config.get("only_platforms")
        self.cells: dict[str, AnyCell] = {}
        self.searches: list[Search] = []
        self.platforms: dict[str, Platform] = {}
        self.models: dict[str, ModelSpec] = {}
        self.paired = Membership(config["paired_order"])

    def platform(self, name: str) -> Platform:
        """config/platforms/<name>.yaml, loaded and validated once per grid."""
        if name not in self.platforms:
            self.platforms[name] = Platform.load(name, self.root)
        return self.platforms[name]

    def model(self, name: str) -> ModelSpec:
        """config/models/<name>.yaml, loaded and validated once per grid."""
        if name not in self.models:
            self.models[name] = ModelSpec.load(name, self.root)
        return self.models[name]

    def check_names(self, values: list[str], kind: str, where: str) -> None:
        """Every value names a file of config/<kind>s/ (the error names the key)."""
        allowed = available(kind, self.root)
        for i, v in enumerate(values):
            if v not in allowed:
                raise ConfigError(f"{where}[{i}]: unknown {kind} {v!r}; allowed: {', '.join(allowed)}")

    def block_platforms(self, block: dict[str, Any]) -> Iterator[tuple[str, Platform]]:
        """The block's platforms (checked by name first), less those only_platforms leaves out."""
        for name in block["platforms"]:
            if self.only is None or name in self.only:
                yield name, self.platform(name)

    def add(self, cell: AnyCell, where: str) -> None:
        """Add a cell, once per path; the same path with other settings is an error."""
        path = cell.record_path(self.results_dir)
        if path in self.cells and self.cells[path] != cell:
            raise ConfigError(f"{where}: cell {path} is defined twice with different settings")
        self.cells.setdefault(path, cell)

    def add_search(self, search: Search, where: str) -> None:
        """Add a max-batch search, once per path; two blocks must agree on it."""
        for old in self.searches:
            if old.key == search.key:
                if old != search:
                    raise ConfigError(f"{where}.max_batch: the search {search.record_path(self.results_dir)} "
                                      "is defined twice with different settings")
                return
        self.searches.append(search)

    def grid(self) -> Grid:
        """The finished Grid."""
        return Grid(results_dir=self.results_dir, cells=tuple(self.cells.values()), platforms=self.platforms,
                    models=self.models, engine_python=self.config["engine_python"], searches=tuple(self.searches),
                    sets=self.paired.sets())


def _computes_fp8(cell: AnyCell) -> bool:
    """Whether a cell computes in FP8: a training cell with an FP8 flag, a GEMM in float8."""
    if isinstance(cell, MicroCell):
        return str(cell.params.get("dtype", "")).startswith("float8")
    return isinstance(cell, Cell) and cell.tech.fp8 is not None
