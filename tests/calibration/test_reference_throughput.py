"""The throughput model's calibrated constants and its interval file against the committed
records: the stated values are the fit of the combined view's records, and the file's
``covered`` block spans them, so a run added without ``python -m llmbench.throughput
calibrate --write`` and ``interval --write`` is caught here rather than left stale."""

import pytest

from llmbench.throughput import calibrate, interval
from llmbench.throughput.model import calibrated_constants

from conftest import REPO


@pytest.fixture(scope="module")
def records():
    return calibrate.load_records(REPO)


def test_the_stated_constants_are_the_fit_of_the_committed_records(records):
    fitted, stated = calibrate.fit(records, REPO), calibrated_constants(REPO)
    for name, value in stated.items():
        assert fitted[name] == pytest.approx(value, rel=1e-3, abs=1e-9), name


def test_the_interval_file_covers_what_the_records_span(records):
    assert interval.load(REPO)["covered"] == {**interval.covered_by(records, REPO),
                                              "source": interval.load(REPO)["covered"]["source"]}
