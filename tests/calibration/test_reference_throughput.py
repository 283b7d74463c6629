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


def test_the_repeat_margins_cover_the_committed_repeats():
    """llmbench.estimate's margins against the repeats the committed records ran
    (llmbench.throughput.score.repeat_rows): the deadline check's covers the p95 of measured /
    predicted repeat time, the Slurm limit's every one; a record that breaks either means the
    prediction or the margin must change, not the test."""
    from llmbench import estimate
    from llmbench.throughput import score

    rows = score.repeat_rows(REPO)
    assert len(rows) > 100 and {"cell", "probe"} <= set(rows["kind"])
    assert rows["ratio"].quantile(0.95) <= estimate.DEADLINE_MARGIN
    worst = rows.loc[rows["ratio"].idxmax()]
    assert worst["ratio"] <= estimate.SLURM_MARGIN, worst.to_dict()
