"""Shared test helpers: repository paths and the venv's executables."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))
BIN = Path(sys.executable).parent


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(autouse=True, scope="session")
def _stop_fork_servers():
    """Fork servers started by the tests' CPU cells (llmbench.forkserver) exit once idle;
    at the end of the session they are asked to now rather than after IDLE_S."""
    yield
    from llmbench import forkserver

    forkserver.stop_all()
