"""Calibration tier: the max-batch search table over committed searches (results/reference).

Each test reads a committed search's folder and pins what it holds (its probes, its resumed
probes, the cell measured at its answer); they change when a reference run is merged or
moved. The search itself is tested on fixtures in tests/unit/test_search.py."""

import json

import pandas as pd
import pytest

from llmbench import search
from llmbench.record import read


def test_search_table_joins_a_megatron_search_with_its_measured_cell(repo):
    # search.json names the backend in its path form (megatron-tp2pp1); the measured
    # record's cell says backend megatron and its layout apart: the table must join them
    from llmbench.report import search as search_report

    ref = repo / "results/reference/2026-11-22-h200x2-table2/runs"
    folders = sorted((ref / "search").glob("pretrain/h200/llama2-7b/*/Naive-g2"))
    measured = [ref / "pretrain/h200/llama2-7b/megatron-tp1pp1-distopt/Naive/bs17-g2/record.json",
                ref / "pretrain/h200/llama2-7b/megatron-tp2pp1/Naive/bs37-g2/record.json"]
    df = search_report.build(folders, measured)
    assert list(df["largest_ok"]) == [17, 37]
    assert df["measured_status"].tolist() == ["ok", "ok"] and df["measured_tokens_per_s"].notna().all()
    # beside the cell, its probe at the same batch (the search's short protocol) and the ratio
    probes = [read(f / f"bs{b}" / "record.json").metrics.tokens_per_s_mean for f, b in zip(folders, (17, 37))]
    assert df["probe_tokens_per_s"].tolist() == probes
    assert df["measured_over_probe"].tolist() == pytest.approx(list(df["measured_tokens_per_s"] / probes))


def test_a_committed_search_resumed_from_its_kept_probes_counts_them_as_run(repo):
    """The H100's 13B L+F+R+Z3+O search (search-m) resumed from four probes an earlier
    machine ran for it (their records put back); its search.json, written before resumed
    probes were told apart, calls them frontier answers and leaves their seconds out.
    read_summary, and so the search table, counts them as run, with their records' seconds;
    a probe the frontier answered with a skipped record (search-f's 205) keeps its '*'."""
    from llmbench.record import wall_s
    from llmbench.report import search as search_report

    ref = repo / "results/reference"
    folder = ref / "2026-11-25-h100-one-gpu-search-b/runs/search/finetune/h100/llama2-13b/deepspeed/L+F+R+Z3+O-g1"
    written = json.loads((folder / "search.json").read_text())
    assert [p["source"] for p in written["probes"]] == ["frontier"] * 4 + ["run"] and written["n_run"] == 1
    earlier = sum(wall_s(read(folder / f"bs{b}" / "record.json").provenance) for b in (177, 159, 172, 173))
    assert earlier > 400  # four 13B ZeRO-3 offload probes: two minutes each
    summary = search.read_summary(folder)
    assert [p["source"] for p in summary["probes"]] == ["resumed"] * 4 + ["run"] and summary["n_run"] == 5
    assert summary["search_wall_s"] == pytest.approx(written["search_wall_s"] + earlier)
    row = search_report.build([folder], []).iloc[0]
    assert row["probes"] == "177:tight 159:ok 172:ok 173:ok 174:tight" and row["n_run"] == 5
    assert row["search_gpu_s"] == pytest.approx(summary["search_wall_s"])
    answered = ref / "2026-11-26-h100-one-gpu-search-f/runs/search/finetune/h100/llama2-7b/deepspeed/L+F+R+Z2-g1"
    assert "205:ok*" in search_report.build([answered], []).iloc[0]["probes"]


def test_search_table_has_no_probe_throughput_where_the_frontier_answered_the_probe(repo):
    from llmbench.report import search as search_report

    ref = repo / "results/reference"
    folder = ref / "2026-11-26-h100-one-gpu-search-f/runs/search/finetune/h100/llama2-7b/deepspeed/L+F+R+Z2-g1"
    cell = ref / "2026-11-26-h100-one-gpu-search-g/runs/finetune/h100/llama2-7b/deepspeed/L+F+R+Z2/bs205-g1/record.json"
    assert read(folder / "bs205" / "record.json").status == "skipped"  # 205 ran in an earlier call
    row = search_report.build([folder], [cell]).iloc[0]
    assert row["measured_batch_size"] == 205 and row["measured_status"] == "ok"
    assert pd.isna(row["probe_tokens_per_s"]) and pd.isna(row["measured_over_probe"])
