"""Tidy table and paper layouts built from fixture records (no cell runs)."""

import dataclasses
import pandas as pd
import pytest

from llmbench import grid, record
from llmbench.record import Metrics, Record
from llmbench.report import catalog, figures, paper_tables, render, tables, tidy


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


def md(long: pd.DataFrame, name: str) -> str:
    """A paper table's Markdown, as the workflow writes it."""
    return render.markdown(paper_tables.table(long, name))


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
    text = md(long, "table3")
    row = next(r for r in md_rows(text) if (r["Model"], r["Method"]) == ("llama2-7b", "Naive"))
    # a800: ours, the paper's, ratio; rtx4090 (the paper's only, ours OOM too): "-"
    assert row["a800 tok/s"].startswith("7000.0") and row["a800 paper tok/s"] == "7488.3"
    assert row["a800 ratio"] == "0.93" and row["a800 tok/s/GPU"] == "875.0"
    assert row["rtx4090 tok/s"] == "-" and row["rtx4090 paper tok/s"] == "-" and row["rtx4090 paper M GB"] == "-"
    # our extra platform (h100) has a column, the paper's rows for 13B are not shown
    assert "h100 tok/s" in text and "llama2-13b" not in text


def test_report_page_of_a_paper_table_keeps_every_cell(table):
    """The report's HTML page of a table (pandas' Styler) has its title, each row's cells in
    order (OOM '-' and empty cells kept), its note, and escapes what HTML would read as markup."""
    from html.parser import HTMLParser

    built = paper_tables.table(paper_tables.build(table, "table3"), "table3")
    part = built.parts[0]
    built = render.Table(title=built.title, long=built.long, parts=(
        render.Part(frame=part.frame, note=part.note + "\n\nnote with <b>markup</b> & a `code` span"),))

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
                self.rows[-1].append(self.cell.strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    page = render.page(built)
    parsed = Rows()
    parsed.feed(page)
    frame = part.frame
    assert parsed.rows[0] == list(frame.columns)
    assert parsed.rows[1:] == [[str(v) for v in row] for row in frame.itertuples(index=False)]
    assert any("-" in row for row in parsed.rows[1:]) and any("" in row for row in parsed.rows[1:])
    assert "<title>Table III" in page and "<h3>Table III" in page and "<script" not in page
    assert "&lt;b&gt;markup&lt;/b&gt; &amp; a `code` span" in page and "b" not in parsed.tags
    # a rebuild writes the same bytes: Styler's random table ids are fixed per part
    assert render.page(built) == page and 'id="T_part0' in page
    # the Markdown of the same table: the same rows, title first
    text = render.markdown(built)
    assert text.startswith("### Table III") and [list(r.values()) for r in md_rows(text)] == parsed.rows[1:]


def test_scaling_table_prints_batch_sizes_as_integers(tmp_path):
    """A tidy table with micro or serving rows has NaN batch sizes, so the column is float
    there; Fig. 4's table still says batch 2, not 2.0 (the default grid printed 2.0), in its
    Markdown and its CSV; per GPU and MFU stand beside the efficiency."""
    from llmbench.report import scaling

    base = dict(stage="pretrain", platform="cpu", model="tiny", backend="deepspeed", layout=None,
                technique="Q", batch_size=2.0, status="ok", mfu=None)
    tidy = pd.DataFrame([{**base, "gpus": 1.0, "tokens_per_s_mean": 1000.0, "mfu": 0.25},
                         {**base, "gpus": 2.0, "tokens_per_s_mean": 1900.0, "mfu": 0.2375},
                         {**base, "stage": "micro", "batch_size": None, "gpus": 1.0, "tokens_per_s_mean": None}])
    built = scaling.table(scaling.build(tidy))
    rows = md_rows(render.markdown(built))
    assert [(r["BS"], r["GPUs"], r["tok/s"], r["linear tok/s"], r["efficiency %"], r["tok/s/GPU"], r["MFU %"])
            for r in rows] == [("2", "1", "1,000.0", "1,000.0", "100.0", "1,000.0", "25.0"),
                               ("2", "2", "1,900.0", "2,000.0", "95.0", "950.0", "23.8")]
    assert "prints only the efficiency" in built.parts[0].note
    render.write(built, tmp_path / "s.csv", tmp_path / "s.md")
    csv = (tmp_path / "s.csv").read_text().splitlines()
    assert csv[0].split(",")[:8] == ["stage", "platform", "model", "backend", "layout", "technique", "batch_size", "gpus"]
    assert [line.split(",")[6:8] for line in csv[1:]] == [["2", "1"], ["2", "2"]]


def test_table4_picks_best_batch(table):
    long = paper_tables.build(table, "table4")
    f_z3 = long[(long.technique == "F+Z3") & (long.platform == "a800")].iloc[0]
    assert f_z3.batch_size == 8 and f_z3.tokens_per_s == 20000.0
    assert f_z3.paper_batch_size == 16
    row = next(r for r in md_rows(md(long, "table4")) if (r["Model"], r["Method"]) == ("llama2-7b", "F+Z3"))
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


def test_table4_shows_one_row_per_method_over_runs(tmp_path):
    """A method's batch sizes may come from several runs (batch 1 in one folder, a search's
    largest in another): Table IV shows the best ok cell over all of them, once."""
    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1700.0, 9.0)], results="a/2026-01-01-h100")
    paths += write_records(tmp_path, [("h100", "llama2-7b", "Q", 26, "ok", 11000.0, 70.0),
                                      ("h100", "llama2-7b", "Z3", 4, "oom", None, None)],
                           results="b/2026-01-02-h100-search")
    paths += write_records(tmp_path, [("h100", "llama2-7b", "Z3", 1, "oom", None, None)], results="a/2026-01-01-h100")
    long = paper_tables.build(tidy.build(paths), "table4")
    ours = long[long["status"].notna()]
    q = ours[ours.technique == "Q"]
    assert len(q) == 1 and (q.iloc[0].batch_size, q.iloc[0].run) == (26, "2026-01-02-h100-search")
    z3 = ours[ours.technique == "Z3"]
    assert len(z3) == 1 and (z3.iloc[0].status, z3.iloc[0].batch_size) == ("oom", 1)


def built(tmp_path, tidy_df: pd.DataFrame, name: str, kind: str = "table", **frames) -> dict:
    """The workflow's inputs of catalog entry ``name``, made from ``tidy_df`` (and per-row
    ``frames``: profile, micro, requests): the tidy table written and read back as CSV, each
    table a figure reads built by its builder and written by render.write. Returns the
    named input paths (as the rule passes them)."""
    out = tmp_path / "results" / "tables"
    out.mkdir(parents=True, exist_ok=True)
    tidy.write(tidy_df, out / "records.csv", out / "records.parquet")
    samples = {"profile": tidy.build_samples([], "profile"), "micro": tidy.build_samples([], "micro"),
               "requests": tidy.build_samples([], "serve"), **frames}
    for key, frame in samples.items():
        frame.to_parquet(out / f"{key}.parquet", index=False)
    sources = {"tidy": out / "records.csv", **{k: out / f"{k}.parquet" for k in samples}}
    paths = {k: str(v) for k, v in catalog.inputs(catalog.get(kind, name), str(tmp_path / "results")).items()
             if k != "reference"}
    for t in catalog.get(kind, name).tables if kind == "figure" else ():
        if t == "findings-checks":  # written beside the findings table by its rule
            tables.findings_and_missing(tables.Inputs(sources))[2].to_csv(out / f"{t}.csv", index=False)
        else:
            render.write(tables.build(t, tables.Inputs(sources)), out / f"{t}.csv", out / f"{t}.md", out / f"{t}.html")
    return paths


def chart_of(tmp_path, tidy_df: pd.DataFrame, name: str, **frames):
    """Figure ``name`` as the workflow draws it: from the CSVs of the tables it reads."""
    return figures.CHARTS[name](figures.load(name, built(tmp_path, tidy_df, name, "figure", **frames)))


def chart_values(chart) -> list[dict]:
    """The rows a chart plots (its one dataset)."""
    datasets = chart.to_dict()["datasets"]
    assert len(datasets) == 1
    return next(iter(datasets.values()))


def test_figure_saves_offline(table, tmp_path):
    chart = chart_of(tmp_path, table, "pretrain")
    out = figures.save(chart, tmp_path / "fig" / "pretrain")
    html = out[0].read_text()
    assert "cdn.jsdelivr" not in html and "vega-lite" in html.lower()
    assert figures.vega_bundle() in html  # the page carries its JavaScript
    assert out[1].read_text().lstrip().startswith("<svg")
    assert out[2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the workflow's bundle (rule vega_bundle), made once a run, is what the page inlines
    again = figures.save(chart, tmp_path / "again" / "pretrain", bundle="/* the run's bundle */")
    assert "/* the run's bundle */" in again[0].read_text() and figures.vega_bundle() not in again[0].read_text()
    assert again[1].read_text() == out[1].read_text() and again[2].read_bytes() == out[2].read_bytes()


def test_pretrain_figure_puts_each_cell_apart_ours_beside_the_papers(tmp_path):
    """One dot per (method, platform, GPU count, metric): a 1-GPU and a 2-GPU cell of one
    method are two series, never one bar; ours beside the paper's through tokens/s per GPU,
    the relative to Z3 and MFU; batch sizes are labelled as integers."""
    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0, 1),
                                     ("h100", "llama2-7b", "Z3", 1, "ok", 600.0, 20.0, 1),
                                     ("h200", "llama2-7b", "Q", 1, "ok", 3000.0, 9.0, 2),
                                     ("h200", "llama2-7b", "Z3", 1, "ok", 1500.0, 20.0, 2),
                                     ("h100", "llama2-7b", "Naive", 1, "oom", None, None, 1)])
    values = chart_values(chart_of(tmp_path, tidy.build(paths), "pretrain"))
    rel = {(v["series"], v["table"]): v["value"] for v in values
           if v["method"] == "Q" and v["metric"].startswith("relative to Z3")}
    assert rel[("h100 · 1 GPU", "Table III: batch 1")] == pytest.approx(3.0)
    assert rel[("h200 · 2 GPUs", "Table III: batch 1")] == pytest.approx(2.0)
    assert rel[("a800 (paper)", "Table III: batch 1")] == pytest.approx(10813.4 / 5491.4)
    per_gpu = {v["series"]: v["value"] for v in values
               if (v["method"], v["metric"], v["table"]) == ("Q", "tokens/s per GPU", "Table III: batch 1")}
    assert per_gpu["h200 · 2 GPUs"] == pytest.approx(1500.0) and per_gpu["h100 · 1 GPU"] == pytest.approx(1800.0)
    assert {v["batch"] for v in values if v["source"] == "ours"} == {"1"}
    assert {v["source"] for v in values} == {"ours", "paper"}
    assert not any(v["metric"] == "MFU %" and v["method"] == "Q" for v in values)  # none for 4-bit
    # an out-of-memory cell is a result: a mark at 0 in every metric, ours and the paper's (RTX4090 Naive)
    oom = {(v["series"], v["metric"]): v["value"] for v in values
           if (v["method"], v["status"], v["table"]) == ("Naive", "oom", "Table III: batch 1")}
    assert oom[("h100 · 1 GPU", "tokens/s per GPU")] == 0 and oom[("rtx4090 (paper)", "MFU %")] == 0


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
    chart = chart_of(tmp_path, df, "finetune")
    rel = {(v["method"], v["source"]): v["value"] for v in chart_values(chart) if v["metric"].startswith("relative to L")}
    assert rel[("QL+F+R", "ours")] == pytest.approx(0.5) and rel[("L", "ours")] == 1.0 and ("L", "paper") in rel
    out = figures.save(chart, tmp_path / "ft")
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
    rows = md_rows(render.markdown(serving.table(table)))
    assert [(r["Engine"], r["Load"], r["GPUs"], r["Status"]) for r in rows] == [
        ("transformers", "burst (burst, 8 in / 4 out)", "1", "- (oom)"), ("vllm", "burst (burst, 8 in / 4 out)", "1", "ok")]
    assert [rows[1][k] for k in ("Platform", "Model", "Requests (failed)", "req/s", "out tok/s", "TTFT p50/p90/p99 s")] \
        == ["cpu", "tiny", "3 (0)", "30.00", "120.0", "0.100 / 0.200 / 0.300"]
    assert "vllm" in summary.render(tmp_path / "results" / "runs")
    # the CDF is exact: one step per request, ending at 1
    values = chart_values(chart_of(tmp_path, df, "serve-latency-cdf", requests=req))
    assert sorted(v["cdf"] for v in values) == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert [v["e2e_s"] for v in sorted(values, key=lambda v: v["cdf"])] == [0.4, 0.5, 0.6]
    for name in ("serve-throughput", "serve-latency-cdf"):
        out = figures.save(chart_of(tmp_path, df, name, requests=req), tmp_path / name)
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
    values = chart_values(chart_of(tmp_path, df, "serve-latency-cdf", requests=req))
    assert sorted((v["e2e_s"], v["cdf"]) for v in values) == [(0.5, pytest.approx(1 / 3)), (0.6, pytest.approx(2 / 3))]
    assert {v["engine"] for v in values} == {"vllm"}


def test_every_figure_builds_from_a_table_without_its_cells(tmp_path):
    """A config without pre-training (or serving, or micro) cells still gets every figure."""
    for name in catalog.names("figure"):
        out = figures.save(chart_of(tmp_path / name, tidy.build([]), name), tmp_path / name / "fig")
        assert out[1].read_text().lstrip().startswith("<svg"), name


def test_every_table_builds_without_its_cells(tmp_path):
    """A config without serving, micro or profile cells still gets every table (empty), each
    with its catalog title, as CSV, Markdown and an HTML page."""
    empty = tidy.build([])
    built(tmp_path, empty, "table3")
    out = tmp_path / "results" / "tables"
    sources = {"tidy": out / "records.csv", "profile": out / "profile.parquet", "micro": out / "micro.parquet",
               "searches": [], "measured": []}
    for name in catalog.names("table"):
        t = tables.build(name, tables.Inputs(sources))
        render.write(t, out / f"{name}.csv", out / f"{name}.md", out / f"{name}.html")
        title = catalog.get("table", name).title
        assert (out / f"{name}.md").read_text().startswith(f"### {title}\n"), name
        assert f"<h3>{html_escape(title)}</h3>" in (out / f"{name}.html").read_text(), name
        assert (out / f"{name}.csv").exists() and len(t.long.columns), name


def html_escape(text: str) -> str:
    import html

    return html.escape(text, quote=False)


def test_the_catalog_places_every_table_and_figure_once():
    """One list: every table and figure has a section (the verdict first), a builder, and
    a figure reads only tables of the catalog (never the records), so a new record rebuilds
    a figure only through the tables it plots."""
    assert catalog.SECTIONS[0].startswith("1. The verdict") and catalog.TABLES[0].name == "findings"
    assert list(catalog.by_section()) == list(catalog.SECTIONS)
    assert sum(len(v) for v in catalog.by_section().values()) == len(catalog.ENTRIES)
    for e in catalog.TABLES:
        assert callable(getattr(tables, e.function)), e.name
    assert list(figures.CHARTS) == catalog.names("figure")
    for e in catalog.FIGURES:
        assert e.tables and set(e.reads) <= {f"table:{t}" for t in catalog.names("table") + list(catalog.BESIDE)} | {
            "requests"}, e.name
    assert catalog.inputs(catalog.get("figure", "scaling"), "R") == {"scaling": "R/tables/scaling.csv"}
    with pytest.raises(ValueError, match="reads 'records'"):
        catalog.Entry(name="x", kind="figure", section=catalog.PRETRAIN, title="x", reads=("records",))
    with pytest.raises(KeyError, match="no figure 'fig9'"):
        catalog.get("figure", "fig9")


def test_the_tidy_table_writes_counts_as_integers(tmp_path):
    """A serving or micro row has no batch size, so the column is float in memory; the CSV
    still says 1, not 1.0, and Parquet keeps a nullable integer."""
    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0)]) + write_serve_records(tmp_path)
    df = tidy.build(paths)
    assert df["batch_size"].dtype == float  # NaN for the serving rows
    tidy.write(df, tmp_path / "t.csv", tmp_path / "t.parquet")
    csv = pd.read_csv(tmp_path / "t.csv", dtype=str, keep_default_na=False)
    assert set(csv["batch_size"]) == {"1", ""} and "1.0" not in set(csv["gpus"])
    assert str(pd.read_parquet(tmp_path / "t.parquet")["batch_size"].dtype) == "Int64"
    assert render.read_csv(tmp_path / "t.csv")["batch_size"].dtype == "Int64"


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


def test_mfu_is_recomputed_by_one_formula_for_old_and_new_records(tmp_path):
    """A LoRA record written when the frozen base still counted 6N carries an MFU a third too
    high; the tidy table computes every record's MFU by today's formula (4N with a frozen base)
    over the record's own platform peak, so old and new records compare. A record without a
    spec keeps its own value."""
    from llmbench.models import ModelSpec, flops_per_token

    g = grid.expand({"protocol": {"repeats": 1, "seq_len": 350}, "finetune": [
        {"platforms": ["h100"], "models": ["llama2-7b"], "techniques": ["L", "L+R"], "batch_sizes": [1]}]})
    paths = []
    for cell in g.cells:
        spec = g.spec(cell) if cell.technique == "L" else None
        old = 1000.0 * flops_per_token(ModelSpec.load("llama2-7b"), 350) / 989.4e12  # 6N: the old count
        r = Record(cell=cell.to_dict(), status="ok", metrics=Metrics(tokens_per_s_mean=1000.0, mfu=old),
                   provenance={"spec": spec} if spec else {})
        paths.append(tmp_path / cell.record_path("results"))
        record.write(r, paths[-1])
    df = tidy.build(paths).set_index("technique")
    four_n = flops_per_token(ModelSpec.load("llama2-7b"), 350, frozen_base=True)
    assert df.loc["L", "mfu"] == pytest.approx(1000.0 * four_n / 989.4e12)
    assert df.loc["L+R", "mfu"] == pytest.approx(1000.0 * flops_per_token(ModelSpec.load("llama2-7b"), 350) / 989.4e12)


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
    row = next(r for r in md_rows(md(long, "table3")) if r["Method"] == "Q")
    assert row["h100 x Z3"] == "3.00" and row["a800 (paper) x Z3"] == f"{10813.4 / 5491.4:.2f}"
    assert row["h100 tok/s/GPU"] == "1800.0" and row["a800 (paper) tok/s/GPU"] == f"{10813.4 / 8:.1f}"
    assert row["h100 M GB"] == f"{9.0 * 2**30 / 1e9:.1f}" and row["h100 GPUs"] == "1"


def test_a_missing_baseline_is_said_not_substituted(tmp_path):
    paths = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0)])
    long = paper_tables.build(tidy.build(paths), "table3")
    assert long[long.platform == "h100"]["relative_tokens_per_s"].isna().all()
    assert "Baseline Z3 missing (its relatives empty, no other method substituted): h100 llama2-7b 1 GPU(s) (not run)" \
        in md(long, "table3")


def test_the_papers_typo_is_printed_and_never_compared(tmp_path):
    paths = write_records(tmp_path, [("h200", "llama2-13b", "R+Z2+O", 64, "ok", 6000.0, 70.0)])
    long = paper_tables.build(tidy.build(paths), "table4")
    typo = long[(long.technique == "R+Z2+O") & (long.platform == "a800") & (long.model == "llama2-13b")].iloc[0]
    assert typo.paper_tokens_per_s == 640435 and typo.paper_flag == "typo"
    assert pd.isna(typo.paper_tokens_per_s_per_gpu) and pd.isna(typo.paper_relative_tokens_per_s)
    row = next(r for r in md_rows(md(long, "table4")) if r["Method"] == "R+Z2+O")
    assert row["a800 (paper) tok/s"] == "640435.0 (typo, not compared)"


def test_two_runs_of_one_cell_show_one_row_and_the_table_names_each_rows_run(tmp_path):
    """The combined view reads several results folders: a cell two of them measured shows
    the record the tidy table chose (the same protocol here: the later folder name decides,
    as neither record has a start time), and a table whose rows come from several runs names
    each row's run (the choice and the superseded runs: tests/unit/test_runs.py)."""
    a = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1800.0, 9.0),
                                 ("h100", "llama2-7b", "Z3", 1, "ok", 900.0, 9.0)], results="run-a")
    b = write_records(tmp_path, [("h100", "llama2-7b", "Q", 1, "ok", 1700.0, 9.1)], results="run-b")
    df = tidy.build(a + b)
    assert sorted(df["run"]) == ["run-a", "run-b"] and list(df.loc[df.technique == "Q", "run"]) == ["run-b"]
    long = paper_tables.build(df, "table3")
    ours = long[long.platform == "h100"]
    assert len(ours) == 2 and set(ours["tokens_per_s"]) == {900.0, 1700.0}
    rows = [r for r in md_rows(md(long, "table3")) if r["Method"] in ("Q", "Z3")]
    assert [(r["Method"], r["h100 run"]) for r in rows] == [("Z3", "run-a"), ("Q", "run-b")]


def test_origin_names_the_results_folder_and_tells_probes_apart():
    assert tidy.origin("results/reference/2026-11-22-h100/runs/pretrain/h100/x/deepspeed/Q/bs1-g1/record.json") \
        == ("2026-11-22-h100", "cell")
    assert tidy.origin("res/runs/search/pretrain/h100/x/deepspeed/Q-g1/bs8/record.json") == ("res", "probe")


def planned(target: str) -> dict[str, int]:
    """Jobs per rule that Snakemake's dry run of the tests' grid (.test/config.yaml) plans to
    make ``target`` (under its results_dir) from nothing (--forceall): everything the target
    depends on."""
    import re
    import subprocess

    from conftest import BIN, REPO

    out = subprocess.run([BIN / "snakemake", "-n", "--nolock", "--cores", "2", "--forceall", "-d", str(REPO),
                          f".test/results/{target}", "--configfile", ".test/config.yaml"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    stats = out.split("Job stats:", 1)[1].split("\n\n", 1)[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", stats, re.M) if m.group(1) != "total"}


def test_a_figure_depends_only_on_the_cells_it_plots():
    """A figure reads the tables it plots, and those tables their stage's rows: a serving
    figure needs no training or microbenchmark cell, a microbenchmark figure no serving or
    training cell, the fine-tuning figure no serving cell and fewer training cells than the
    pre-training one. (Before, every figure read the tidy table of every record.)"""
    serve = planned("figures/serve-latency-cdf.svg")
    assert serve.get("run_serving_cell") and not {"run_training_cell", "run_micro_cell", "build_tidy_table"} & set(serve)
    micro = planned("figures/micro-gemm.svg")
    assert micro.get("run_micro_cell") and not {"run_training_cell", "run_serving_cell", "build_tidy_table"} & set(micro)
    finetune, pretrain = planned("figures/finetune.svg"), planned("figures/pretrain.svg")
    assert "run_serving_cell" not in finetune and "run_serving_cell" not in pretrain
    assert 0 < finetune["run_training_cell"] < pretrain["run_training_cell"]


def test_serving_runs_of_one_point_pool_and_a_poisson_sweep_is_plotted(tmp_path):
    """Three bursts of one engine (burst-1..3, a fresh engine each) are one point: mean ± std
    in the serving table's second part; Poisson rates are points of their own, and the
    sweep figure draws throughput, latency and goodput against the offered rate."""
    from llmbench.report import figures, render, serving

    base = dict(stage="serve", platform="h100", model="llama2-7b", engine="vllm", gpus=1, status="ok",
                num_requests=1000, input_len=512, output_len=128, max_concurrency=None, p50_e2e_latency_s=20.0,
                p50_ttft_s=14.0, p99_ttft_s=27.0, goodput_share=0.1, cuda_graphs=True, kv_cache_tokens=118288)
    cells = [{**base, "load": f"burst-{k}", "mode": "burst", "rate_per_s": None, "output_tokens_per_s": v}
             for k, v in ((1, 4000.0), (2, 4100.0), (3, 4200.0))]
    cells += [{**base, "load": f"poisson-{r}", "mode": "poisson", "rate_per_s": float(r),
               "output_tokens_per_s": 60.0 * r, "goodput_share": 1.0} for r in (5, 10)]
    df = serving.build(pd.DataFrame(cells))
    t = serving.table(df)
    assert "graphs" in t.parts[0].frame["settings"].iloc[0] and t.parts[0].frame["goodput"].iloc[0] == "0.100"
    pooled = t.parts[1].frame.set_index("load")
    assert pooled.loc["burst", "runs (ok)"] == "3 (3)" and pooled.loc["burst", "out tok/s"] == "4100.0 ± 100.0"
    assert pooled.loc["poisson-5", "runs (ok)"] == "1 (1)"
    render.write(t, tmp_path / "serving.csv", tmp_path / "serving.md", tmp_path / "serving.html")
    chart = figures.serve_sweep_chart({"serving": render.read_csv(tmp_path / "serving.csv")}).to_dict()
    data = next(iter(chart["datasets"].values()))
    assert sorted(r["rate_per_s"] for r in data) == [5.0, 10.0]  # the bursts are not a sweep
    figures.save(figures.serve_sweep_chart({"serving": render.read_csv(tmp_path / "serving.csv")}), tmp_path / "sweep")
    assert (tmp_path / "sweep.svg").stat().st_size > 0


def test_a_concurrency_sweep_is_plotted_against_requests_in_flight_beside_the_rate_sweep(tmp_path):
    """Concurrency loads (that many requests in flight) are a sweep of their own: a second row
    of the sweep figure, its x the requests in flight on a log scale; alone, the only row."""
    from llmbench.report import figures, render, serving

    base = dict(stage="serve", platform="h200", model="llama2-7b", engine="vllm", gpus=1, status="ok",
                num_requests=256, input_len=512, output_len=128, p50_e2e_latency_s=2.0, p50_ttft_s=0.1,
                p50_tpot_s=0.01, goodput_share=1.0)
    conc = [{**base, "load": f"conc-{c}", "mode": "concurrency", "max_concurrency": c, "rate_per_s": None,
             "output_tokens_per_s": 100.0 * c} for c in (1, 8, 64)]
    rate = [{**base, "load": f"poisson-{r}", "mode": "poisson", "rate_per_s": float(r), "max_concurrency": None,
             "output_tokens_per_s": 60.0 * r} for r in (5, 10)]

    def chart(cells):
        render.write(serving.table(serving.build(pd.DataFrame(cells))), tmp_path / "serving.csv",
                     tmp_path / "serving.md", tmp_path / "serving.html")
        return figures.serve_sweep_chart({"serving": render.read_csv(tmp_path / "serving.csv")})

    both = chart(conc + rate).to_dict()
    assert len(both["vconcat"]) == 2  # the rate sweep's row, then the concurrency sweep's
    xs = [row["hconcat"][0]["encoding"]["x"] for row in both["vconcat"]]
    assert [x["field"] for x in xs] == ["rate_per_s", "max_concurrency"]
    assert xs[1]["scale"] == {"type": "log", "base": 2} and "scale" not in xs[0]
    alone = chart(conc).to_dict()
    assert [c["encoding"]["x"]["field"] for c in alone["hconcat"]] == [
        "max_concurrency", "output_tokens_per_s", "max_concurrency"]
    curve = alone["hconcat"][1]  # median and p99 end-to-end latency against throughput, dashed apart
    assert curve["transform"][0]["fold"] == ["p50_e2e_latency_s", "p99_e2e_latency_s"]
    assert curve["encoding"]["strokeDash"]["field"] == "percentile"
    figures.save(chart(conc + rate), tmp_path / "sweep")
    assert (tmp_path / "sweep.svg").stat().st_size > 0
    # still growing at 64 in flight: no knee; saturated from 64 on: the knee at 64, a diamond
    assert serving.sweep_knees(pd.DataFrame(conc).assign(series="s"), "max_concurrency").empty
    flat = conc + [{**conc[-1], "load": f"conc-{c}", "max_concurrency": c, "output_tokens_per_s": v}
                   for c, v in ((256, 6600.0), (512, 6500.0))]
    knee = serving.sweep_knees(pd.DataFrame(flat).assign(series="s"), "max_concurrency")
    assert list(knee["max_concurrency"]) == [64]
    served = chart(flat).to_dict()["hconcat"][0]
    assert served["layer"][1]["mark"]["shape"] == "diamond"


def test_each_sweep_series_gets_its_knee_and_its_most_in_the_serving_table():
    """The serving table's "Sweeps" part: one row per engine, platform, model and kind of load;
    the runs of one load pool by their mean before the knee is found (two sweeps of one engine
    on two machines make one series, not two knees); a series still growing at its heaviest
    load has none; another engine version is a series of its own."""
    from llmbench.report import serving

    base = dict(stage="serve", platform="h200", model="llama2-7b", engine="vllm", engine_version="0.26.0", gpus=1,
                status="ok", num_requests=256, input_len=512, output_len=128, mode="concurrency", rate_per_s=None,
                p50_ttft_s=0.1, p50_tpot_s=0.01, goodput_share=1.0, kv_cache_tokens=230000)
    # vLLM twice (two results folders), saturating at 64 in flight: 5,000 at 256 is the most,
    # 4,600 (>= 0.9 x 5,000) at 64 the lightest load near it; alone, run 2's 64 (4,000) would not be
    tok = {1: (200.0, 200.0), 16: (2000.0, 2000.0), 64: (5200.0, 4000.0), 256: (5000.0, 5000.0)}
    cells = [{**base, "load": f"c{c}", "run": f"run{k}", "max_concurrency": c, "output_tokens_per_s": v[k],
              "goodput_share": 1.0 if c < 256 else 0.5} for c, v in tok.items() for k in (0, 1)]
    # LightLLM still growing at 256 in flight; SGLang of another version on three loads
    cells += [{**base, "engine": "lightllm", "engine_version": "0.0.1", "load": f"c{c}", "max_concurrency": c,
               "output_tokens_per_s": 10.0 * c} for c in (1, 16, 64, 256)]
    cells += [{**base, "engine": "sglang", "engine_version": v, "load": f"c{c}", "max_concurrency": c,
               "output_tokens_per_s": min(100.0 * c, 3000.0)} for v in ("0.5.17", "0.5.23") for c in (1, 64, 256)]
    k = serving.knees(serving.build(pd.DataFrame(cells))).set_index("engine")
    assert list(k.index) == ["lightllm (0.0.1)", "sglang (0.5.17)", "sglang (0.5.23)", "vllm (0.26.0)"]
    assert (k.loc["vllm (0.26.0)", "knee"], k.loc["vllm (0.26.0)", "knee_output_tokens_per_s"]) == (64, 4600.0)
    assert (k.loc["vllm (0.26.0)", "most_output_tokens_per_s"], k.loc["vllm (0.26.0)", "most_at"]) == (5000.0, 256)
    assert (k.loc["vllm (0.26.0)", "loads"], k.loc["vllm (0.26.0)", "runs"]) == (4, 8)
    assert pd.isna(k.loc["lightllm (0.0.1)", "knee"]) and k.loc["lightllm (0.0.1)", "most_at"] == 256
    assert list(k.loc[["sglang (0.5.17)", "sglang (0.5.23)"], "knee"]) == [64, 64]
    part = serving.table(serving.build(pd.DataFrame(cells))).parts[-1]
    assert part.heading == "Sweeps" and part.frame.set_index("engine").loc["lightllm (0.0.1)", "knee"] == "none"
    assert part.frame.set_index("engine").loc["vllm (0.26.0)", "most out tok/s at"] == "5,000.0 at 256"
    # 230,000 KV tokens over 640-token requests: 359 resident, so 512 in flight would queue
    assert part.frame.set_index("engine").loc["vllm (0.26.0)", "requests the KV cache holds"] == "359"
