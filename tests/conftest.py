"""Shared test helpers: repository paths, the venv's executables, and the tiers.

The tiers are folders (README, Tests): tests/unit (pure: `make test-fast`), tests/calibration
(pure too, but pinning the committed evidence under results/reference: counts, values, replays;
`make test-calibration`), tests/integration (real processes on the CPU: workers, the fork server,
engines' test doubles, torch.compile, Megatron-LM), tests/e2e (the workflow on .test/config.yaml,
and Slurm) and tests/smoke (the embedded default, config/config.yaml, statuses only). Each test
gets its folder's marker, so `-m "not e2e"` and the like select tiers as the folders do."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the fork servers the tests' CPU cells start (llmbench.forkserver) stay for the session rather
# than exit after a minute idle and start again (each start imports torch, DeepSpeed and
# transformers: about 10 s of a core); the session's end stops them (pytest_sessionfinish)
os.environ.setdefault("LLMBENCH_FORK_SERVER_IDLE_S", "900")
TESTS = REPO / "tests"
sys.path.insert(0, str(REPO / "workflow" / "scripts"))
BIN = Path(sys.executable).parent
#: folder -> marker (pyproject.toml registers them)
TIERS = {"calibration": "calibration", "integration": "integration", "e2e": "e2e", "smoke": "smoke"}
#: the modules that read the one run of the embedded default and the tests' grid (grid_runs),
#: in the order they run: the smoke test first (it reads the run as made; the e2e module
#: then reruns parts of it)
ONE_RUN = ("tests/smoke/test_default_grid.py", "tests/e2e/test_workflow.py")


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder in TIERS:
            item.add_marker(TIERS[folder])
        # `make test` spreads the test files over pytest-xdist processes (--dist loadfile: a
        # file's tests on one process, in order); the Slurm modules (one test cluster, its
        # daemons) are one unit of work there (pytest_xdist_make_scheduler), and -m slurm
        # selects them alone
        if _slurm_module(Path(item.path).resolve().relative_to(TESTS)):
            item.add_marker(pytest.mark.slurm)
    # the longest units of work first, each in its order (stable: in-module order kept): the
    # modules of one run in ONE_RUN's order, then the Slurm modules, then the rest as named.
    # Under `make test` pytest-xdist then gives the first unit to one process and the second
    # to another at the start (--no-loadscope-reorder keeps this order), so the two longest
    # chains of the suite start at once
    module = {item: _one_run(item) for item in items}

    def unit(item) -> tuple[int, int]:
        if module[item] is not None:
            return 0, module[item]
        try:
            slurm = _slurm_module(Path(item.path).resolve().relative_to(TESTS))
        except ValueError:
            slurm = False
        return (1, 0) if slurm else (2, 0)

    items[:] = sorted(items, key=unit)


def _slurm_module(path: Path) -> bool:
    """Whether a test module (its path under tests/) needs the test Slurm cluster."""
    return path.parent.as_posix() == "e2e" and "slurm" in path.stem


def _one_run(item) -> int | None:
    """The index in ONE_RUN of the item's module, None for the others."""
    try:
        path = Path(item.path).resolve().relative_to(REPO).as_posix()
    except ValueError:
        return None
    return ONE_RUN.index(path) if path in ONE_RUN else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `--dist loadfile` (make test) the ONE_RUN modules are one unit of work: one
    process runs both, so grid_runs makes their run once. So are the Slurm modules: they
    share one test cluster, so one process runs them one after the other."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneRunScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            if scope in ONE_RUN:
                return ONE_RUN[0]
            path = Path(scope)
            return "tests/e2e/slurm" if path.parts[:1] == ("tests",) and _slurm_module(path.relative_to("tests")) \
                else scope

    return OneRunScheduling(config, log)


@pytest.fixture(scope="session")
def grid_runs(request, tmp_path_factory):
    """The embedded default and the tests' grid through the workflow (workspaces.run_grids):
    one run of the two where the session runs both tiers' modules, else the one it needs."""
    from workspaces import run_grids

    selected = {_one_run(item) for item in request.session.items}
    return run_grids(tmp_path_factory.mktemp, default=0 in selected, tests=1 in selected)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _unit_tests_start_no_worker(request, monkeypatch):
    """tests/unit and tests/calibration are pure: a test there that would start a cell's ranks
    or a fork server fails, naming the tier it belongs in."""
    if Path(request.node.path).resolve().parent not in (TESTS / "unit", TESTS / "calibration"):
        return

    def refuse(*_, **__):
        raise AssertionError("a unit test starts no worker or fork server: it belongs in tests/integration")

    from llmbench import forkserver, launch

    monkeypatch.setattr(launch, "start_ranks", refuse, raising=False)
    monkeypatch.setattr(forkserver, "launch", refuse, raising=False)


def pytest_sessionfinish(session):
    """The fork servers of the session's cells are asked to exit once idle: by the one process
    of a plain run, or by pytest-xdist's controller once every worker has finished (a worker
    leaves them: another worker's cells may be using them)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from llmbench import forkserver

    forkserver.stop_all()
