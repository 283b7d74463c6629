"""A copy of the workflow in a temporary folder, and snakemake runs in it (the e2e and smoke
tiers, and tests/bench_harness.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin (not resolved: keep the venv)
# everything a run reads: envs/ too (Snakemake records the conda env file of every job
# in its metadata, even without --use-conda; a missing one fails the job); .test/ is the
# tests' own grid
COPY = ("Snakefile", "workflow", "config", "profiles", "envs", ".test")
#: the e2e tier's grid and where it writes (.test/config.yaml's results_dir)
TEST_CONFIG = ".test/config.yaml"
TEST_RESULTS = ".test/results"


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
