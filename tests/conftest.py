"""Shared test helpers: repository paths, the venv's executables, the tiers, and the
fixtures of a searched cell's estimate.

The tiers are folders (README, Tests): tests/unit (pure: `make test-fast`), tests/integration
(real processes on the CPU: workers, the fork server, engines' test doubles, torch.compile,
Megatron-LM), tests/e2e (the workflow on .test/config.yaml, and Slurm) and tests/smoke (the
embedded default, config/config.yaml, statuses only). Each test gets its folder's marker, so
`-m "not e2e"` and the like select tiers as the folders do."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
sys.path.insert(0, str(REPO / "workflow" / "scripts"))
BIN = Path(sys.executable).parent
#: folder -> marker (pyproject.toml registers them)
TIERS = {"integration": "integration", "e2e": "e2e", "smoke": "smoke"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            folder = Path(item.path).resolve().relative_to(TESTS).parts[0]
        except ValueError:
            continue
        if folder in TIERS:
            item.add_marker(TIERS[folder])


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True)
def _unit_tests_start_no_worker(request, monkeypatch):
    """tests/unit is the fast tier: a test there that would start a cell's ranks or a fork
    server fails, naming the tier it belongs in."""
    if Path(request.node.path).resolve().parent != TESTS / "unit":
        return

    def refuse(*_, **__):
        raise AssertionError("a unit test starts no worker or fork server: it belongs in tests/integration")

    from llmbench import forkserver, launch

    monkeypatch.setattr(launch, "start_ranks", refuse, raising=False)
    monkeypatch.setattr(forkserver, "launch", refuse, raising=False)


@pytest.fixture(autouse=True, scope="session")
def _stop_fork_servers():
    """Fork servers started by the tests' CPU cells (llmbench.forkserver) exit once idle;
    at the end of the session they are asked to now rather than after IDLE_S."""
    yield
    from llmbench import forkserver

    forkserver.stop_all()


#: a config whose searched cell offline-batch and llmbench.search estimate (3 + 10 steps, 2 repeats)
ESTIMATE_CONFIG = """
protocol: {warmup_steps: 3, measured_steps: 10, repeats: 2, seq_len: 350}
finetune:
  - platforms: [h100]
    models: [llama2-7b]
    techniques: [L+R]
    gpus: 1
    max_batch: {max: 512, probe: {warmup_steps: 1, measured_steps: 2}}
"""


def probe_record(wall_s: float, window_s: float, status: str = "ok") -> str:
    """A probe record's JSON with what an estimate reads: its protocol (1 + 2 steps), timed
    window and wall time."""
    return json.dumps({"status": status, "cell": {"protocol": {"warmup_steps": 1, "measured_steps": 2}},
                       "summary": {"phase_window_s": window_s},
                       "provenance": {"started": "2026-11-26T06:00:00+00:00",
                                      "finished": f"2026-11-26T06:{int(wall_s) // 60:02d}:{int(wall_s) % 60:02d}+00:00"}})
