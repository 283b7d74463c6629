"""End-to-end fixtures: one copy of the workflow per test module (tests/workspaces.py)."""

from __future__ import annotations

import pytest
from workspaces import BIN, REPO, make_workspace  # noqa: F401  (BIN, REPO: `from conftest import` elsewhere)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return make_workspace(tmp_path_factory.mktemp("workspace"))
