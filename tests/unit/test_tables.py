"""Tidy table and paper layouts built from fixture records (no cell runs)."""

import dataclasses
import pandas as pd
import pytest

from llmbench import grid, record
from llmbench.record import Metrics, Record
from llmbench.report import figures, paper_tables, tidy


def write_records(tmp_path, rows, stage="pretrain", results="results"):
    """rows: (platform, model, technique, batch_size, status, tokens_per_s, mem_gib[, gpus])."""
    paths = []
    for plat, model, tech, bs, status, tps, mem, *gpus in rows:
        block = {"platforms": [plat], "models": [model], "techniques": [tech], "batch_sizes": [bs]}
        g = grid.expand({"protocol": {"repeats": 2}, stage: [{**block, **({"gpus": gpus} if gpus else {})}]})
        cell = g.cells[0]
        m = Metrics(tokens_per_s_mean=tps, tokens_per_s_std=1.0, tokens_per_s_runs=(tps - 1, tps + 1),
                    peak_mem_reserved_gib=mem, peak_mem_allocated_gib=mem, peak_rss_gib=3.0) if status == "ok" else Metrics()
        r = Record(cell=cell.to_dict(), status=status, reason="" if status == "ok" else "CUDA out of memory", metrics=m)
        path = tmp_path / cell.record_path(results)
        record.write(r, path)
        paths.append(path)
    return paths


def md_rows(md: str) -> list[dict]:
    """The rows of the (first) pipe table in ``md`` as dicts keyed by its header."""
    lines = [line for line in md.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in lines]
    return [dict(zip(cells[0], row)) for row in cells[2:]]


@pytest.fixture
def table(tmp_path):
    paths = write_records(tmp_path, [
        ("a800", "llama2-7b", "Naive", 1, "ok", 7000.0, 60.0),
        ("a800", "llama2-7b", "Z3+F", 1, "ok", 5000.0, 30.0),
        ("a800", "llama2-7b", "Z3+F", 8, "ok", 20000.0, 70.0),
        ("a800", "llama2-7b", "Z3+F", 32, "oom", None, None),
        ("rtx4090", "llama2-7b", "Naive", 1, "oom", None, None),
        ("h100", "llama2-7b", "Q", 1, "ok", 2000.0, 9.0),
    ])
    return tidy.build(paths)


def test_tidy_table_one_row_per_record(table, tmp_path):
    assert len(table) == 6
    assert set(table["status"]) == {"ok", "oom"}
    ok = table[table.status == "ok"]
    assert (ok["peak_mem_kind"] == "gpu_reserved").all()
    assert table.loc[table.status == "oom", "tokens_per_s_mean"].isna().all()
    tidy.write(table, tmp_path / "t.csv", tmp_path / "t.parquet")
    assert len(pd.read_parquet(tmp_path / "t.parquet")) == 6
    assert len(pd.read_csv(tmp_path / "t.csv")) == 6


def test_table3_beside_paper(table):
    long = paper_tables.build(table, "table3")
    naive = long[(long.model == "llama2-7b") & (long.technique == "Naive") & (long.platform == "a800")].iloc[0]
    assert naive.paper_tokens_per_s == pytest.approx(7488.3)
    assert naive.ratio_tokens_per_s == pytest.approx(7000.0 / 7488.3)
    f_z3 = long[(long.technique == "F+Z3") & (long.platform == "a800")].iloc[0]  # paper's "F+Z3"
    assert f_z3.tokens_per_s == 5000.0 and f_z3.paper_tokens_per_s == pytest.approx(5590.1)
    oom = long[(long.technique == "Naive") & (long.platform == "rtx4090")].iloc[0]
    assert oom.status == "oom" and oom.paper_status == "oom"
    md = paper_tables.markdown(long, "Table III", "table3")
    row = next(r for r in md_rows(md) if (r["Model"], r["Method"]) == ("llama2-7b", "Naive"))
    # a800: ours, the paper's, ratio; rtx4090 (the paper's only, ours OOM too): "-"
    assert row["a800 tok/s"].startswith("7000.0") and row["a800 paper tok/s"] == "7488.3"
    assert row["a800 ratio"] == "0.93" and row["a800 tok/s/GPU"] == "875.0"
    assert row["rtx4090 tok/s"] == "-" and row["rtx4090 paper tok/s"] == "-" and row["rtx4090 paper M GB"] == "-"
    # our extra platform (h100) has a column, the paper's rows for 13B are not shown
    assert "h100 tok/s" in md and "llama2-13b" not in md


def test_report_page_of_a_paper_table_keeps_every_cell(table):
    """The report's HTML page of a table has its title, each row's cells in order (OOM '-'
    and empty cells kept), its note, and escapes what HTML would read as markup."""
    from html.parser import HTMLParser

    from llmbench.report import markdown

    md = paper_tables.markdown(paper_tables.build(table, "table3"), "Table III", "table3")
    md += "\nnote with <b>markup</b> & a `code` span\n"

    class Rows(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.tags, self.cell = [], [], None

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "tr":
                self.rows.append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.rows[-1].append(self.cell)
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    page = markdown.to_html(md)
    parsed = Rows()
    parsed.feed(page)
    table_lines = [line for line in md.splitlines() if line.startswith("|")]
    expected = [[c.strip() for c in line.strip()[1:-1].split("|")] for line in table_lines]
    assert parsed.rows == [expected[0]] + expected[2:]  # the separator row is not a row
    assert "<title>Table III" in page and "<h3>Table III" in page
    assert "&lt;b&gt;markup&lt;/b&gt; &amp; a <code>code</code> span" in page and "b" not in parsed.tags


def test_scaling_table_prints_batch_sizes_as_integers():
    """A tidy table with micro or serving rows has NaN batch sizes, so the column is float
    there; Fig. 4's table still says batch 2, not 2.0 (the default grid printed 2.0)."""
    from llmbench.report import scaling

    base = dict(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", layout=None,
                technique="Q", batch_size=2.0, status="ok")
    tidy = pd.DataFrame([{**base, "gpus": 1.0, "tokens_per_s_mean": 1000.0},
                         {**base, "gpus": 2.0, "tokens_per_s_mean": 1900.0},
                         {**base, "stage": "micro", "batch_size": None, "gpus": 1.0, "tokens_per_s_mean": None}])
    md = scaling.markdown(scaling.build(tidy))
    assert "| cpu | tiny | pretrain | Q | 2 | 2 | 1,900.0 | 2,000.0 | 95.0 |" in md


def test_table4_picks_best_batch(table):
    long = paper_tables.build(table, "table4")
    f_z3 = long[(long.technique == "F+Z3") & (long.platform == "a800")].iloc[0]
    assert f_z3.batch_size == 8 and f_z3.tokens_per_s == 20000.0
    assert f_z3.paper_batch_size == 16
    md = paper_tables.markdown(long, "Table IV", "table4")
    row = next(r for r in md_rows(md) if (r["Model"], r["Method"]) == ("llama2-7b", "F+Z3"))
    # no max-batch search ran: the best batch run is not the largest that fits
    assert row["a800 BS"] == "8 (not maximised)" and row["a800 paper BS"] == "16"


def test_table4_compares_cells_of_the_most_gpus(tmp_path):
    """Global tokens/s of different GPU counts do not compare: the table shows the cells
    with the most GPUs (ranks on a CPU) run, as Table III does, even where a 1-rank cell at
    a larger batch had more tokens/s."""
    paths = write_records(tmp_path, [
        ("cpu", "tiny", "Q", 1, "ok", 100.0, 1.0, 1), ("cpu", "tiny", "Q", 8, "ok", 200.0, 1.6, 1),
        ("cpu", "tiny", "Q", 1, "ok", 150.0, 1.0, 2), ("cpu", "tiny", "Q", 2, "ok", 180.0, 1.1, 2),
        ("cpu", "tiny", "Z2", 4, "ok", 90.0, 1.5, 1),
    ])
    long = paper_tables.build(tidy.build(paths), "table4")
    q = long[(long.technique == "Q") & (long.platform == "cpu")]
    assert len(q) == 1 and (q.iloc[0].batch_size, q.iloc[0].tokens_per_s) == (2, 180.0)
    z2 = long[(long.technique == "Z2") & (long.platform == "cpu")].iloc[0]
    assert (z2.batch_size, z2.tokens_per_s) == (4, 90.0)


def test_figure_saves_offline(table, tmp_path):
    out = figures.save(figures.pretrain_chart(table), tmp_path / "fig" / "pretrain")
    html = out[0].read_text()
    assert "cdn.jsdelivr" not in html and "vega-lite" in html.lower()
    assert out[1].read_text().lstrip().startswith("<svg")
    assert out[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_lists_every_record(tmp_path):
    from llmbench.report import summary

    write_records(tmp_path, [("a800", "llama2-7b", "Naive", 1, "ok", 7000.0, 60.0),
                             ("rtx4090", "llama2-7b", "Naive", 1, "oom", None, None)])
    text = summary.render(tmp_path / "results" / "runs")
    lines = text.splitlines()
    assert len(lines) == 3
    assert "7,000.0" in lines[1] and "oom" in lines[2] and "CUDA out of memory" in lines[2]


def test_table9_and_finetune_figure(tmp_path):
    paths = write_records(tmp_path, [("a800", "llama2-7b", "L", 1, "ok", 3000.0, 20.0),
                                     ("a800", "llama2-7b", "R+F+QL", 1, "ok", 1500.0, 8.0)], stage="finetune")
    df = tidy.build(paths)
    long = paper_tables.build(df, "table9")
    ql = long[(long.technique == "QL+F+R") & (long.platform == "a800")].iloc[0]
    assert ql.tokens_per_s == 1500.0 and ql.paper_tokens_per_s > 0
    assert ql.ratio_tokens_per_s == pytest.approx(1500.0 / ql.paper_tokens_per_s)
    assert paper_tables.build(df, "table3")["status"].isna().all()  # fine-tuning is not Table III
    out = figures.save(figures.CHARTS["finetune"](df), tmp_path / "ft")
    assert out[1].read_text().lstrip().startswith("<svg")


def write_serve_records(tmp_path):
    """Two engines on one platform: one ok with three requests, one oom."""
    g = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"],
                                                 "engines": ["vllm", "transformers"],
                                                 "loads": {"burst": {"num_requests": 3, "input_len": 8, "output_len": 4}}}]})
    paths = []
    for cell in g.cells:
        ok = cell.engine == "vllm"
        serving = {"num_requests": 3, "completed": 3, "failed": 0, "output_tokens_per_s": 120.0,
                   "request_throughput_per_s": 30.0, "p50_ttft_s": 0.1, "p90_ttft_s": 0.2, "p99_ttft_s": 0.3,
                   "p50_e2e_latency_s": 0.5, "server_peak_rss_gib": 1.5, "server_peak_gpu_mem_gib": None} if ok else {}
        requests = {"index": [0, 1, 2], "ttft_s": [0.1, 0.2, 0.3], "e2e_s": [0.6, 0.4, 0.5], "tpot_s": [0.1] * 3,
                    "scheduled_s": [0.0] * 3, "sent_s": [0.01] * 3, "output_tokens": [4] * 3,
                    "ok": [True] * 3, "error": [""] * 3} if ok else {}
        r = Record(cell=cell.to_dict(), status="ok" if ok else "oom", reason="" if ok else "CUDA out of memory",
                   summary=serving, samples=requests)
        path = tmp_path / cell.record_path("results")
        record.write(r, path)
        paths.append(path)
    return paths


def test_serving_rows_requests_table_and_figures(tmp_path):
    from llmbench.report import serving, summary

    paths = write_serve_records(tmp_path)
    df = tidy.build(paths)
    vllm = df[df.engine == "vllm"].iloc[0]
    assert (vllm.stage, vllm.load, vllm.output_tokens_per_s, vllm.peak_mem_gib, vllm.peak_mem_kind) == (
        "serve", "burst", 120.0, 1.5, "host_rss")
    req = tidy.build_samples(paths, "serve")
    assert len(req) == 3 and set(req.engine) == {"vllm"} and list(req.e2e_s) == [0.6, 0.4, 0.5]
    table = serving.build(df)
    assert list(table.engine) == ["transformers", "vllm"] and list(table.status) == ["oom", "ok"]
    md = serving.markdown(table)
    assert "| cpu | tiny | vllm | burst (burst, 8 in / 4 out) | 1 | ok | 3 (0) | 30.00 | 120.0 | 0.100 / 0.200 / 0.300 |" in md
    assert "| transformers | burst (burst, 8 in / 4 out) | 1 | - (oom) |" in md
    assert "vllm" in summary.render(tmp_path / "results" / "runs")
    # the CDF is exact: one step per request, ending at 1
    chart = figures.serve_latency_cdf_chart(df, {"requests": req}).to_dict()
    values = next(iter(chart["datasets"].values()))
    assert sorted(v["cdf"] for v in values) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [v["e2e_s"] for v in sorted(values, key=lambda v: v["cdf"])] == [0.4, 0.5, 0.6]
    for name in ("serve-throughput", "serve-latency-cdf"):
        out = figures.save(figures.CHARTS[name](df, {"requests": req}), tmp_path / name)
        assert out[1].read_text().lstrip().startswith("<svg")


def test_a_load_cut_at_its_timeout_is_plotted_as_a_fraction_of_all_its_requests(tmp_path):
    """A timeout cell keeps the requests that completed before the cut: its CDF steps over
    the completed ones and ends at completed / requests (the cut ones never finished); an
    oom cell has no curve."""
    paths = write_serve_records(tmp_path)
    cut = record.read(paths[0])  # vllm, ok, three requests
    samples = {**cut.samples, "ok": [True, False, True], "error": ["", "cut", ""], "e2e_s": [0.6, None, 0.5]}
    record.write(dataclasses.replace(cut, status="timeout", reason="the load ran past timeout_s=1",
                                     samples=samples), paths[0])
    df = tidy.build(paths)
    req = tidy.build_samples(paths, "serve")
    values = next(iter(figures.serve_latency_cdf_chart(df, {"requests": req}).to_dict()["datasets"].values()))
    assert sorted((v["e2e_s"], v["cdf"]) for v in values) == [(0.5, pytest.approx(1 / 3)), (0.6, pytest.approx(2 / 3))]
    assert {v["engine"] for v in values} == {"vllm"}


def test_every_figure_builds_from_a_table_without_its_cells(tmp_path):
    """A config without pre-training (or serving, or micro) cells still gets every figure."""
    empty = tidy.build([])
    tables = {"requests": tidy.build_samples([], "serve"), "micro": tidy.build_samples([], "micro")}
    for name, chart in figures.CHARTS.items():
        out = figures.save(chart(empty, tables), tmp_path / name)
        assert out[1].read_text().lstrip().startswith("<svg"), name


def test_every_table_builds_without_its_cells(tmp_path):
    """A config without serving, micro or profile cells still gets every table (empty)."""
    from llmbench.report import micro, profile, scaling, search, serving

    empty = tidy.build([])
    assert serving.build(empty).empty and scaling.build(empty).empty
    assert search.build([], []).empty and search.markdown(search.build([], [])).startswith("### ")
    for name, builder in micro.BUILDERS.items():
        table, md = builder(tidy.build_samples([], "micro"))
        assert md.startswith("### "), name
    for name, builder in profile.BUILDERS.items():
        table, md = builder(empty, tidy.build_samples([], "profile"))
        assert md.startswith("### ") and table.empty, name


def test_mfu_against_the_measured_gemm_ceiling(tmp_path):
    """Model FLOP/s per GPU from the record's own model spec; against the platform's best
    measured bf16 GEMM where a GEMM microbenchmark ran there (DESIGN.md), never for 4-bit."""
    from llmbench.models import ModelSpec, flops_per_token

    g = grid.expand({"protocol": {"repeats": 1, "seq_len": 350}, "pretrain": [
        {"platforms": ["a800"], "models": ["llama2-7b"], "techniques": ["Naive", "Q"], "batch_sizes": [1]}],
        "micro": [{"platforms": ["a800"], "gemm": {"curves": {}, "shapes": {"mlp": [[666, 11008, 4096]]}}}]})
    paths = []
    for cell in g.cells:
        spec = g.spec(cell)
        if cell.stage == "micro":
            r = Record(cell=cell.to_dict(), status="ok", summary={"bench": "gemm", "best_tflops": 200.0}, provenance={"spec": spec})
        else:
            r = Record(cell=cell.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=8000.0), provenance={"spec": spec})
        paths.append(tmp_path / cell.record_path("results"))
        record.write(r, paths[-1])
    df = tidy.build(paths).set_index("technique")
    fpt = flops_per_token(ModelSpec.load("llama2-7b"), 350)
    assert df.loc["Naive", "model_tflops_per_gpu"] == pytest.approx(8000 * fpt / 8 / 1e12)
    assert df.loc["Naive", "mfu_vs_gemm"] == pytest.approx(8000 * fpt / 8 / 1e12 / 200.0)
    assert pd.isna(df.loc["Q", "mfu_vs_gemm"])  # 4-bit matmuls are no bf16 GEMMs


def test_table3_takes_batch_1_at_the_most_gpus_it_ran(tmp_path):
    """A scaling axis at batch 2 on more GPUs must not hide a method's batch-1 cell."""
    paths = write_records(tmp_path, [("cpu", "tiny", "Q", 1, "ok", 100.0, 1.0, 1), ("cpu", "tiny", "Q", 2, "ok", 180.0, 1.1, 2)])
    long = paper_tables.build(tidy.build(paths), "table3")
    q = long[(long.technique == "Q") & (long.platform == "cpu")]
    assert len(q) == 1 and (q.iloc[0].batch_size, q.iloc[0].gpus, q.iloc[0].tokens_per_s) == (1, 1, 100.0)


def test_an_h100_row_meets_the_a800_column_through_per_gpu_mfu_and_relatives(tmp_path):
    """Nobody has the paper's A800s: an H100 cell compares with them through tokens/s per
    GPU, MFU against each platform's peak and the method's throughput relative to Z3 (Table
    III's baseline), ours beside the paper's; the raw ratio stays empty (other hardware)."""
    from llmbench.report import paper_frame

    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0),
                                     ("h100", "llama2-7b", "Z3", 1, "ok", 600.0, 20.0)])
    long = paper_tables.build(tidy.build(paths), "table3")
    at = {(r.technique, r.platform): r for r in long.itertuples()}
    q, z3, paper_q = at[("Q", "h100")], at[("Z3", "h100")], at[("Q", "a800")]
    assert (q.gpus, q.tokens_per_s_per_gpu, q.relative_tokens_per_s) == (1, 1800.0, 3.0)
    assert pd.isna(q.mfu) and pd.isna(q.ratio_tokens_per_s)  # no MFU for 4-bit; no ratio across hardware
    assert z3.relative_tokens_per_s == 1.0
    assert paper_q.paper_tokens_per_s_per_gpu == pytest.approx(10813.4 / 8)
    assert paper_q.paper_relative_tokens_per_s == pytest.approx(10813.4 / 5491.4)
    row = next(r for r in md_rows(paper_tables.markdown(long, "Table III", "table3")) if r["Method"] == "Q")
    assert row["h100 x Z3"] == "3.00" and row["a800 (paper) x Z3"] == f"{10813.4 / 5491.4:.2f}"
    assert row["h100 tok/s/GPU"] == "1800.0" and row["a800 (paper) tok/s/GPU"] == f"{10813.4 / 8:.1f}"
    assert row["h100 M GB"] == f"{9.0 * 2**30 / 1e9:.1f}" and row["h100 GPUs"] == "1"


def test_a_missing_baseline_is_said_not_substituted(tmp_path):
    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0)])
    long = paper_tables.build(tidy.build(paths), "table3")
    assert long[long.platform == "h100"]["relative_tokens_per_s"].isna().all()
    assert "Baseline Z3 missing (its relatives empty, no other method substituted): h100 llama2-7b 1 GPU(s) (not run)" \
        in paper_tables.markdown(long, "Table III", "table3")


def test_the_papers_typo_is_printed_and_never_compared(tmp_path):
    paths = write_records(tmp_path, [("h200", "llama2-13b", "R+Z2+O", 64, "ok", 6000.0, 70.0)])
    long = paper_tables.build(tidy.build(paths), "table4")
    typo = long[(long.technique == "R+Z2+O") & (long.platform == "a800") & (long.model == "llama2-13b")].iloc[0]
    assert typo.paper_tokens_per_s == 640435 and typo.paper_flag == "typo"
    assert pd.isna(typo.paper_tokens_per_s_per_gpu) and pd.isna(typo.paper_relative_tokens_per_s)
    row = next(r for r in md_rows(paper_tables.markdown(long, "Table IV", "table4")) if r["Method"] == "R+Z2+O")
    assert row["a800 (paper) tok/s"] == "640435.0 (typo, not compared)"


def test_two_runs_of_one_cell_both_stay_with_their_run(tmp_path):
    """The combined view reads several results folders: a cell two of them measured keeps
    a row for each, saying which run it came from."""
    a = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0)], results="run-a")
    b = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1700.0, 9.1)], results="run-b")
    df = tidy.build(a + b)
    assert sorted(df["run"]) == ["run-a", "run-b"]
    long = paper_tables.build(df, "table3")
    ours = long[long.platform == "h100"]
    assert len(ours) == 2 and set(ours["tokens_per_s"]) == {1800.0, 1700.0}
    rows = [r for r in md_rows(paper_tables.markdown(long, "Table III", "table3")) if r["Method"] == "Q"]
    assert len(rows) == 2 and {r["h100 run"] for r in rows} == {"run-a", "run-b"}


def test_origin_names_the_results_folder_and_tells_probes_apart():
    assert tidy.origin("results/reference/2026-11-22-h100/runs/pretrain/h100/x/deepspeed/Q/bs1-g1/record.json") \
        == ("2026-11-22-h100", "cell")
    assert tidy.origin("res/runs/search/pretrain/h100/x/deepspeed/Q-g1/bs8/record.json") == ("res", "probe")
