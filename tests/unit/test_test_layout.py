"""pytest imports test modules by basename (rootdir-relative, no packages), so two tiers holding
the same file name stop collection of the whole suite; this keeps the basenames unique."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique_across_tiers():
    names = Counter(p.name for p in TESTS.glob("*/test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []
