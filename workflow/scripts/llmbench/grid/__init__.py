"""The grid: a config, validated, expanded into cells (llmbench.cells) and max-batch
searches, once per stage (training.py, serving.py, micro.py), into one immutable Grid.
Errors name the config key, before any job runs.

The cell types and the path grammar are llmbench.cells'; the names below that come from
there and from llmbench.backends are kept for callers written before the split (new
code imports them from their modules)."""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

from ..cells import (  # noqa: F401  (the contract, re-exported for older callers)
    FRONTIER_PATTERN, MICRO_BENCHES, MICRO_KEY, MICRO_RECORD_PATTERN, RECORD_PATTERN, SEARCH_KEY,
    SEARCH_PATTERN, SEARCH_STAGES, SERVE_KEY, SERVE_RECORD_PATTERN, TRAIN_KEY, TRAINING_STAGES,
    WILDCARD_CONSTRAINTS, Cell, MicroCell, Search, ServeCell, cell_from_dict, layout_name)
from .. import backends
from ..config import REPO_ROOT, ConfigError, load_yaml, validate
from . import micro, serving, training
from .base import Builder, Grid
from .training import LLAMA_LINEARS, MEGATRON_KEYS  # noqa: F401

#: Stages whose cells train (llmbench.cells.TRAINING_STAGES).
STAGES = TRAINING_STAGES
# Read from the registry (llmbench.backends), for callers written before it:
#: backends each training stage allows, the default first
BACKENDS = {stage: backends.for_stage(stage) for stage in TRAINING_STAGES}
#: technique flags of module-wise profile cells and of Megatron-LM cells
PROFILE_FLAGS = backends.get("torch").flags
MEGATRON_FLAGS = backends.get("megatron").flags

__all__ = ["Grid", "expand", "load", "check_engine_python", "STAGES", "LLAMA_LINEARS", "MEGATRON_KEYS"]


def expand(config: dict[str, Any], root: Path = REPO_ROOT, source: str = "config") -> Grid:
    """Validate a config mapping and expand it into a Grid.

    Raises ConfigError (naming the key and the allowed values) before anything runs.
    """
    raw = copy.deepcopy(dict(config))
    # a block's protocol overrides only the keys it names (validation fills in defaults)
    given = {
        stage: [dict(b.get("protocol") or {}) if isinstance(b, dict) else {} for b in raw.get(stage) or []]
        if isinstance(raw.get(stage), list) else []
        for stage in TRAINING_STAGES
    }
    config = validate(raw, "config", source)
    b = Builder(config, root)
    if b.only is not None:
        b.check_names(b.only, "platform", "only_platforms")
    training.expand(b, given)
    serving.expand(b)
    micro.expand(b)
    return b.grid()


def check_engine_python(grid: Grid) -> None:
    """Every engine_python of an engine the grid serves with names an interpreter that exists
    (a path, relative to the working directory as the serving cell resolves it, or a
    command on PATH): a typo would otherwise surface as one failed engine start per cell.
    The workflow calls it at parse time (common.smk); expand does not, so a config can be
    planned and read where its engines' environments are not (the GPU configs' wrappers
    are made on the GPU node by envs/offline-run.sh)."""
    used = {c.engine for c in grid.cells if isinstance(c, ServeCell)} | {
        backends.get(c.backend).engine for c in grid.cells if c.stage == "profile"} - {None}
    for engine, python in sorted(grid.engine_python.items()):
        if engine not in used:
            continue
        found = Path(python).absolute() if "/" in python else shutil.which(python)
        if found is None or not Path(found).is_file() or not os.access(found, os.X_OK):
            raise ConfigError(f"engine_python.{engine}: {python!r} is not an executable interpreter "
                              f"(looked for {found or 'it on PATH'}); create that environment or fix the path")


def load(configfile: Path, root: Path = REPO_ROOT) -> Grid:
    """Load a config file and expand it."""
    data = load_yaml(configfile)
    if not isinstance(data, dict):
        raise ConfigError(f"{configfile}: expected a mapping at the top level")
    return expand(data, root, str(configfile))
