"""Calibration tier: the committed profile records that keep each repeat's breakdown
(summary.repeats, llmbench.profile.results): every repeat's rows add up to its phase walls,
the record's mean rows and phase times are the mean of its repeats', and there is one
repeat a measured throughput. What the verdicts pair round by round is then the same data
the tables show as means."""

from statistics import fmean

import pytest

from llmbench.record import read

from conftest import REPO


def with_repeats():
    """(path, record) of every committed profile record that keeps its repeats."""
    out = []
    for path in sorted(REPO.glob("results/reference/2026-*/runs/profile/*/*/*/*/*/record.json")):
        rec = read(path)
        if rec.status == "ok" and rec.summary.get("repeats"):
            out.append((path.relative_to(REPO), rec))
    return out


def cells_of(rows: dict[str, list]) -> dict[tuple[str, str], float]:
    return dict(zip(zip(rows["phase"], rows["module"]), rows["time_s"]))


def test_each_kept_repeat_adds_up_and_averages_to_the_record():
    records = with_repeats()
    # the H200's paired profile sets: 7B (six cells) and 13B (two), three repeats each
    assert len(records) >= 8
    for path, rec in records:
        reps = rec.summary["repeats"]
        assert len(reps) == len(rec.metrics.tokens_per_s_runs), path
        for i, rep in enumerate(reps):
            for phase in ("forward", "backward", "optimizer"):
                rows = [t for (p, _), t in cells_of(rep["rows"]).items() if p == phase]
                assert sum(rows) == pytest.approx(rep["phases"][f"{phase}_wall_s"], rel=1e-6), (path, i, phase)
        for key in ("forward_wall_s", "backward_wall_s", "optimizer_wall_s", "forward_kernel_s"):
            assert rec.summary[key] == pytest.approx(fmean(r["phases"][key] for r in reps), rel=1e-9), (path, key)
        mean = cells_of(rec.samples)
        per = [cells_of(r["rows"]) for r in reps]
        for cell, t in mean.items():
            assert t == pytest.approx(fmean(p[cell] for p in per), rel=1e-9), (path, cell)
