"""Smoke test of the embedded default (config/config.yaml, what `make run` runs): the whole
grid once, in a fresh copy of the workflow, checking statuses only. Users edit that file, so
nothing here names its cells or counts them: the cells expected are those the copy's own
config expands to, and a cell may be out of memory only where the config caps its memory
(mem_cap_gib: the forced OOM cell, a max-batch search's probes and the batch it measures).
What the cells measure is checked on the tests' own grid (tests/e2e, .test/config.yaml).

Where the session runs the e2e tier's workflow module too, the default runs with the tests'
grid after it, as one run (tests/workspaces.py, run_grids): every cell of the default, its
tables, figures and report are still made by that run, from the default's own blocks."""

from __future__ import annotations

import json

from llmbench import grid
from llmbench.report import catalog


def allowed(cell) -> set[str]:
    """ok, or also oom where the config caps the cell's host memory (a forced OOM)."""
    return {"ok", "oom"} if getattr(cell, "mem_cap_gib", None) else {"ok"}


def expected_records(ws, g) -> dict:
    """Record path -> cell, for every cell of ``g`` and the batch each of its searches measured
    (each search's summary ok, its probes ok or oom as the cell allows)."""
    r = g.results_dir
    expected = {c.record_path(r): c for c in g.cells}
    for s in g.searches:
        folder = ws / s.record_path(r)
        summary = json.loads((folder / "search.json").read_text())
        assert summary["status"] == "ok", (folder, summary)
        for probe in folder.glob("bs*/record.json"):
            assert json.loads(probe.read_text())["status"] in allowed(s.cell), probe
        measured = s.measured(summary["largest_ok"])
        expected[measured.record_path(r)] = measured
    return expected


def test_the_embedded_default_runs_and_builds_its_tables_figures_and_report(grid_runs):
    run = grid_runs["default"]
    ws = run.workspace
    assert run.result.returncode == 0, run.result.stderr[-4000:]
    g = grid.load(ws / "config" / "config.yaml", ws)
    r = g.results_dir
    expected = expected_records(ws, g)
    assert expected, "the default grid has no cells"
    bad = {}
    for path, cell in expected.items():
        rec = json.loads((ws / path).read_text())
        if rec["status"] not in allowed(cell):
            bad[path] = (rec["status"], rec["reason"], rec.get("log_tail", "")[-1500:])
    assert not bad, bad
    # every record the run left is one its config asked for (probes apart): the default's,
    # and the tests' where they ran with it
    asked = expected_records(ws, grid.load(ws / run.config, ws)) if run.config != run.part else expected
    assert set(expected) <= set(asked)
    left = {str(p.relative_to(ws)) for p in (ws / r / "runs").rglob("record.json") if "/runs/search/" not in str(p)}
    assert left == set(asked)
    for table in catalog.names("table"):
        for ext in ("csv", "md", "html"):
            assert (ws / r / f"tables/{table}.{ext}").stat().st_size > 0, (table, ext)
    for fig in catalog.names("figure"):
        for ext in ("html", "svg", "png"):
            assert (ws / r / f"figures/{fig}.{ext}").stat().st_size > 0, (fig, ext)
    res = run.report()
    assert res.returncode == 0, res.stderr[-4000:]
    assert (ws / r / "report.html").stat().st_size > 0
