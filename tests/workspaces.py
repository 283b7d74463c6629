"""A copy of the workflow in a temporary folder, and snakemake runs in it (the e2e and smoke
tiers, and tests/bench_harness.py); the one run of the embedded default and the tests' grid
that both tiers read (run_grids)."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin (not resolved: keep the venv)
# everything a run reads: envs/ too (Snakemake records the conda env file of every job
# in its metadata, even without --use-conda; a missing one fails the job); .test/ is the
# tests' own grid
COPY = ("Snakefile", "workflow", "config", "profiles", "envs", ".test")
#: the e2e tier's grid and where it writes (.test/config.yaml's results_dir)
TEST_CONFIG = ".test/config.yaml"
TEST_RESULTS = ".test/results"
#: the embedded default (what `make run` runs)
DEFAULT_CONFIG = "config/config.yaml"
#: written into a workspace that runs both grids as one (run_grids): the combined config, and
#: the tests' blocks alone with its other keys (the e2e tier's own grid within the run)
COMBINED_CONFIG = "default-and-tests.yaml"
TESTS_PART = "tests-part.yaml"


def _ignore(folder: str, names: list[str]) -> set[str]:
    """Bytecode caches, and the results a run of the tests' grid left in the repo (.test/results)."""
    skip = {n for n in names if n == "__pycache__"}
    if Path(folder) == REPO / ".test":
        skip |= {"results"} & set(names)
    return skip


def make_workspace(dest: Path) -> Path:
    """A fresh copy of the workflow (no results) to run in."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPY:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=_ignore)
        else:
            shutil.copy2(src, dest / name)
    # the serving engines' own venvs (config engine_python names them relative to the root)
    for venv in (".venv-vllm",):
        if (REPO / venv).exists():
            (dest / venv).symlink_to(REPO / venv)
    return dest


def snakemake_env(env: dict | None = None) -> dict[str, str]:
    """The environment a snakemake of the venv runs in: ours, ``env`` over it (a test
    cluster's), and the venv's bin first on PATH (jobs run python -m snakemake again)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    return full_env


def snakemake(workspace: Path, *args: str, env: dict | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    """Run the venv's snakemake in ``workspace``; output captured as text. The bound is for
    a hung run only: a grid's real time is minutes (README, Tests), and bf16 on a CPU
    without native bf16 can be several times slower."""
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=workspace, env=snakemake_env(env),
                          capture_output=True, text=True, timeout=timeout)


def record_mtimes(workspace: Path, results: str = "results") -> dict[str, int]:
    """Record path -> mtime in ns, for every record under <results>/runs."""
    return {str(p.relative_to(workspace)): p.stat().st_mtime_ns
            for p in (workspace / results / "runs").rglob("record.json")}


#: the config keys that hold blocks (lists); a combined config runs the blocks of both grids
BLOCK_KEYS = ("pretrain", "finetune", "profile", "serve", "micro")


def combine(default: dict, tests: dict) -> dict:
    """The embedded default with the tests' blocks after its own: one grid, one results
    folder. Its top-level keys are the default's (results_dir, protocol: a test block keeps
    its own protocol overrides only), so a cell both grids define alike is one cell, run once."""
    out = copy.deepcopy(default)
    for key, value in tests.items():
        if key in BLOCK_KEYS:
            out[key] = list(out.get(key) or []) + copy.deepcopy(value)
        elif key == "engine_python":
            out[key] = {**value, **out.get(key, {})}
        elif key not in out:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class GridRun:
    """One run of the workflow, as a tier sees it: the config the run read, and the part of
    it that is the tier's own grid (a config of its blocks alone, with the run's other keys)."""

    workspace: Path
    #: the config file the run read, relative to the workspace (config/config.yaml: no --configfile)
    config: str
    #: this tier's grid within the run: a config file of its own blocks, relative to the workspace
    part: str
    #: the run's snakemake
    result: subprocess.CompletedProcess

    def args(self) -> list[str]:
        """snakemake's arguments that select the run's config."""
        return [] if self.config == DEFAULT_CONFIG else ["--configfile", self.config]

    @property
    def results(self) -> str:
        """The run's results_dir."""
        return yaml.safe_load((self.workspace / self.config).read_text())["results_dir"]

    def grid(self):
        """The tier's own grid (llmbench.grid.Grid), its cells as the run defined them."""
        from llmbench import grid

        return grid.load(self.workspace / self.part, self.workspace)

    def compose(self, part: dict) -> dict:
        """The config the run would read with ``part`` (an edited copy of the part's config)
        in place of the part."""
        if self.part == self.config:
            return part
        return combine(yaml.safe_load((self.workspace / DEFAULT_CONFIG).read_text()), part)

    def report(self) -> subprocess.CompletedProcess:
        """`snakemake --report <results>/report.html` (the end of `make run`), made once per
        run (the tiers that share a run share its report)."""
        key = (self.workspace, self.config)
        if key not in _REPORTS:
            _REPORTS[key] = snakemake(self.workspace, "--report", f"{self.results}/report.html", *self.args())
        return _REPORTS[key]


_REPORTS: dict[tuple[Path, str], subprocess.CompletedProcess] = {}


def run_grids(mktemp, default: bool = True, tests: bool = True) -> dict[str, GridRun]:
    """The embedded default (``default``) and the tests' grid (``tests``) through the
    workflow, each in a fresh copy of it (``mktemp(name)`` gives a new folder): where both are
    asked for, as ONE run of the two combined (combine): what they share runs once, and the
    tables, figures and report are made once. Where they define one cell differently (a user's
    edit of config/config.yaml can), they run apart."""
    from llmbench import grid
    from llmbench.config import ConfigError

    runs: dict[str, GridRun] = {}
    if default and tests:
        ws = make_workspace(mktemp("grids"))
        both = combine(yaml.safe_load((ws / DEFAULT_CONFIG).read_text()), yaml.safe_load((ws / TEST_CONFIG).read_text()))
        (ws / COMBINED_CONFIG).write_text(yaml.safe_dump(both, sort_keys=False))
        part = {**{k: v for k, v in both.items() if k not in BLOCK_KEYS},
                **{k: v for k, v in yaml.safe_load((ws / TEST_CONFIG).read_text()).items() if k in BLOCK_KEYS}}
        (ws / TESTS_PART).write_text(yaml.safe_dump(part, sort_keys=False))
        try:
            grid.load(ws / COMBINED_CONFIG, ws)
        except ConfigError as e:
            print(f"the default and the tests' grid run apart: {e}", file=sys.stderr)
        else:
            # three job slots on CI's two cores: the grid's jobs spend much of their time
            # waiting (an engine's start, a cell's ranks meeting), which a third job fills
            res = snakemake(ws, "--cores", "3", "--configfile", COMBINED_CONFIG)
            return {"default": GridRun(workspace=ws, config=COMBINED_CONFIG, part=DEFAULT_CONFIG, result=res),
                    "tests": GridRun(workspace=ws, config=COMBINED_CONFIG, part=TESTS_PART, result=res)}
    if default:
        ws = make_workspace(mktemp("default"))
        runs["default"] = GridRun(workspace=ws, config=DEFAULT_CONFIG, part=DEFAULT_CONFIG,
                                  result=snakemake(ws, "--cores", "2"))
    if tests:
        ws = make_workspace(mktemp("tests"))
        runs["tests"] = GridRun(workspace=ws, config=TEST_CONFIG, part=TEST_CONFIG,
                                result=snakemake(ws, "--cores", "2", "--configfile", TEST_CONFIG))
    return runs
