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
