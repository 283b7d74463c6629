"""Figures drawn from fixture tables: the verdict's forest plot and the training figures'
colours (no cell runs)."""

import math

import pandas as pd
import pytest

from llmbench.report import catalog, figures


def check(finding, platform, verdict, value, lo, hi, claim_lo, claim_hi, *, gpus=1, n=0, model="llama2-7b"):
    """One row of tables/findings-checks.csv."""
    return {"finding": finding, "platform": platform, "model": model, "gpus": gpus, "check": n,
            "compares": "tokens_per_s_per_gpu QL / L", "layout": None, "row_verdict": verdict, "verdict": verdict,
            "value": value, "lo": lo, "hi": hi, "claim_lo": claim_lo, "claim_hi": claim_hi, "n": "3/3",
            "pairing": "set", "method": "paired rounds (3), t(2)"}


def chart_data(chart) -> list[dict]:
    datasets = chart.to_dict()["datasets"]
    assert len(datasets) == 1
    return next(iter(datasets.values()))


@pytest.fixture
def verdict_tables():
    checks = pd.DataFrame([
        check("qlora-faster", "h100", "holds", 1.5, 1.2, 1.8, 1.0, None),
        check("qlora-faster", "h200", "contradicts", 0.7, 0.6, 0.8, 1.0, None, gpus=2),
        check("share-small", "h100", "inconclusive", 0.0, 0.0, 0.2, None, 0.1),
        check("share-small", "h100", "holds", None, 0.0, float("inf"), 24.0, None, n=1),
        check("not-run", "h100", "missing", None, None, None, 1.0, None),
    ])
    findings = pd.DataFrame({"finding": ["share-small", "qlora-faster", "qlora-faster", "not-run"],
                             "verdict": ["inconclusive", "holds", "contradicts", "untestable"]})
    return {"findings": findings, "findings-checks": checks}


def test_the_verdict_is_a_forest_plot_of_every_check_with_a_value(verdict_tables, tmp_path):
    """One row per check with a value or an interval, coloured by its verdict; a missing check
    has no row; the counts per verdict of the findings table in the subtitle; a zero and an open
    end drawn at the log axis' edge while the tooltip keeps the exact numbers."""
    chart = figures.verdict_chart(verdict_tables)
    rows = chart_data(chart)
    assert sorted((r["finding"], r["platform"], r["verdict"]) for r in rows) == [
        ("qlora-faster", "h100", "holds"), ("qlora-faster", "h200", "contradicts"),
        ("share-small", "h100", "holds"), ("share-small", "h100", "inconclusive")]
    spec = chart.to_dict()
    subtitle = " ".join(spec["title"]["subtitle"])
    assert "4 rows: 1 holds, 1 contradicts, 0 partly, 1 inconclusive, 1 untestable" in subtitle
    assert "2 holds, 1 contradicts, 1 inconclusive" in subtitle
    lo, hi = spec["spec"]["layer"][0]["encoding"]["x"]["scale"]["domain"]
    assert lo == pytest.approx(0.05) and hi == pytest.approx(48.0)  # half the least, twice the most
    zero = next(r for r in rows if r["verdict"] == "inconclusive")
    assert zero["value"] == 0 and zero["x_value"] == pytest.approx(lo) and zero["x_claim_lo"] == pytest.approx(lo)
    assert zero["x_claim_hi"] == pytest.approx(0.1)
    open_end = next(r for r in rows if r["finding"] == "share-small" and r["verdict"] == "holds")
    assert open_end["x_hi"] == pytest.approx(hi) and open_end["x_claim_hi"] == pytest.approx(hi)
    assert open_end["value"] is None or math.isnan(open_end["value"])
    assert next(r for r in rows if r["platform"] == "h200")["row"] == "h200 · llama2-7b · 2 GPUs · check 0"
    # the panels in the findings table's order; the palette says which verdict is which
    assert spec["facet"]["row"]["sort"] == ["share-small", "qlora-faster"]
    colour = spec["spec"]["layer"][1]["encoding"]["color"]["scale"]
    assert colour["domain"] == ["holds", "contradicts", "inconclusive"] and len(set(colour["range"])) == 3
    out = figures.save(chart, tmp_path / "verdict")
    assert out[1].read_text().lstrip().startswith("<svg") and "cdn.jsdelivr" not in out[0].read_text()


def test_the_verdict_without_a_value_still_draws_and_counts(verdict_tables, tmp_path):
    checks = verdict_tables["findings-checks"]
    tables = {**verdict_tables, "findings-checks": checks[checks["verdict"] == "missing"]}
    chart = figures.verdict_chart(tables)
    assert "1 untestable" in chart.to_dict()["title"]
    assert figures.save(chart, tmp_path / "v")[1].read_text().lstrip().startswith("<svg")


def test_the_verdict_figure_leads_the_verdict_section():
    entries = catalog.by_section()[catalog.VERDICT]
    assert [(e.kind, e.name) for e in entries][:2] == [("table", "findings"), ("figure", "verdict")]
    assert catalog.inputs(catalog.get("figure", "verdict"), "R")["findings_checks"] == "R/tables/findings-checks.csv"


def table9_row(model, technique, platform, run, gpus, tps, paper_tps=None):
    """One row of tables/table9.csv (ours, and the paper's value for that platform)."""
    return {"model": model, "technique": technique, "platform": platform, "run": run, "gpus": gpus,
            "status": "ok" if tps else None, "batch_size": 1, "tokens_per_s_per_gpu": tps,
            "relative_tokens_per_s": 1.0 if tps else None, "mfu": 0.1 if tps else None,
            "paper_status": "ok" if paper_tps else None, "paper_batch_size": 1 if paper_tps else None,
            "paper_tokens_per_s_per_gpu": paper_tps, "paper_relative_tokens_per_s": 1.0 if paper_tps else None,
            "paper_mfu": 0.2 if paper_tps else None}


def test_training_figures_colour_hardware_never_runs_and_split_by_model():
    """Two runs of one platform and GPU count share one colour (the run in the tooltip, not in
    the legend); the paper's platforms have colours of their own, hollow; one panel per model."""
    t9 = pd.DataFrame([table9_row("llama2-7b", "L", "h100", "2026-01-01-h100-a", 1, 900.0),
                       table9_row("llama2-7b", "QL", "h100", "2026-01-02-h100-b", 1, 500.0),
                       table9_row("llama2-13b", "L", "h200", "2026-01-03-h200-c", 2, 700.0),
                       table9_row("llama2-7b", "L", "a800", None, None, None, paper_tps=1500.0),
                       table9_row("llama2-13b", "L", "a800", None, None, None, paper_tps=800.0)])
    chart = figures.finetune_chart({"table9": t9})
    spec, rows = chart.to_dict(), chart_data(chart)
    assert {r["series"] for r in rows} == {"h100 · 1 GPU", "h200 · 2 GPUs", "a800 (paper)"}
    assert {r["run"] for r in rows if r["series"] == "h100 · 1 GPU"} == {"2026-01-01-h100-a", "2026-01-02-h100-b"}
    layers = spec["spec"]["layer"]
    scale = layers[0]["encoding"]["color"]["scale"]
    assert scale["domain"] == ["h100 · 1 GPU", "h200 · 2 GPUs", "a800 (paper)"]
    assert len(set(scale["range"])) == 3 and set(scale["range"]) <= set(figures.HARDWARE_COLOURS[:8])
    assert "run" in [t if isinstance(t, str) else t["field"] for t in layers[0]["encoding"]["tooltip"]]
    assert [(lay["mark"]["shape"], lay["mark"]["filled"]) for lay in layers[:2]] == [("circle", True),
                                                                                     ("triangle-up", False)]
    assert spec["facet"]["row"]["sort"] == ["Table IX: batch 1 · llama2-7b", "Table IX: batch 1 · llama2-13b"]
