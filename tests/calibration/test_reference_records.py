"""Calibration tier: the committed reference records themselves (results/reference).

These tests pin what the committed runs hold (their paths, counts and values), so they
change when a reference run is added, merged or moved, not when the code is wrong; the
code's own behaviour is tested on fixtures in tests/unit. `make test-calibration` runs
this folder; `make test` runs it after tests/unit."""

import json

from llmbench import cells, record
from llmbench.record import Metrics
from llmbench.report import paper_tables, tidy

from conftest import REPO


def test_every_committed_reference_record_path_follows_the_grammar():
    paths = sorted((REPO / "results" / "reference").rglob("record.json"))
    assert len(paths) > 100
    for p in paths:
        rel = p.relative_to(REPO).as_posix()
        parsed = cells.parse(rel)
        assert parsed is not None, rel
        assert parsed.root.startswith("results/reference/")
        if not parsed.is_probe:  # a cell: its own fields rebuild its path
            rec = json.loads(p.read_text())
            assert cells.cell_from_dict(rec["cell"]).record_path(parsed.root) == rel


def test_the_committed_version_2_probes_read_as_skipped():
    """The committed H100 search's probes that its frontier answered were written by schema
    version 2 (ok, with the peak the batch once had); they read as skipped, the answer in
    their provenance (the migration itself: tests/unit/test_record.py)."""
    folder = REPO / "results/reference/2026-11-23-h100-search/runs/search/pretrain/h100/llama2-7b/deepspeed/Q-g1"
    raw = json.loads((folder / "bs28/record.json").read_text())
    assert raw["schema_version"] == 2 and raw["status"] == "ok" and raw["provenance"]["command"] == record.FRONTIER_COMMAND
    r = record.read(folder / "bs28/record.json")
    assert r.status == "skipped" and r.reason == raw["reason"] and r.metrics == Metrics()
    assert r.provenance["frontier"] == {"status": "ok", "peak_gib": raw["metrics"]["peak_mem_reserved_gib"]}


def test_probes_the_frontier_answered_are_skipped_rows_without_a_measurement(repo):
    """The committed H100 search answered 11 probes from its frontier (schema 2 wrote them
    ok, with peaks another run measured): in the tidy table they are skipped probe rows with
    no memory, so nothing counts those peaks twice; the probe that ran keeps its own."""
    folder = repo / "results/reference/2026-11-23-h100-search/runs/search/pretrain/h100/llama2-7b/deepspeed"
    df = tidy.build(sorted(folder.rglob("bs*/record.json")))
    answered = df[df["status"] == "skipped"]
    assert len(answered) == 11 and (answered["kind"] == "probe").all() and answered["peak_mem_gib"].isna().all()
    assert answered["reason"].str.startswith("known to run").all()
    ran = df[df["status"] != "skipped"]
    assert len(ran) == 6 and ran["peak_mem_gib"].notna().all()  # Q: 26; R+Q: 114, 121, 125, 127, 128
    assert paper_tables.build(df, "table4").empty or not (paper_tables.build(df, "table4")["status"] == "skipped").any()


def test_our_findings_judge_llama31_where_the_papers_judge_its_own_models_only():
    """config/combined.yaml: the paper's findings on Llama 2 (findings_models), ours on today's
    models too (findings_ours_models): the 8B pair's largest-batch set decides two of ours."""
    import pandas as pd

    tables = REPO / "results" / "reference" / "combined" / "tables"
    paper, ours = pd.read_csv(tables / "findings.csv"), pd.read_csv(tables / "findings-ours.csv")
    assert not paper["model"].astype(str).str.startswith("llama3.1").any()
    eight = ours[(ours["model"] == "llama3.1-8b") & (ours["gpus"].astype(str) == "2")].set_index("finding")
    assert eight.loc["fp8-faster-than-bf16-at-largest-batch", "verdict"] == "holds"
    assert eight.loc["fsdp2-compiled-faster-than-zero3-at-largest-batch", "verdict"] == "holds"
