"""The serving load kinds and engine settings in the tidy table and the serving table: a
concurrency sweep, a shared-prefix load with prefix caching on and off, a ramped rate,
GPU telemetry; and a record written before those keys existed reads as before."""

import itertools

import pandas as pd

from llmbench import grid, record
from llmbench.record import Record
from llmbench.report import render, serving, tidy

BASE = {"num_requests": 8, "input_len": 16, "output_len": 4}
LOADS = {"c2": {**BASE, "mode": "concurrency", "max_concurrency": 2},
         "c4": {**BASE, "mode": "concurrency", "max_concurrency": 4},
         "shared": {**BASE, "prefix_len": 12},
         "ramp": {**BASE, "mode": "poisson", "rate_per_s": 2, "ramp_up_s": 5}}


def md_rows(md: str) -> list[dict]:
    """The rows of the page's first table (a later part, e.g. the sweeps' knees, has its own head)."""
    body = md.splitlines()
    start = next(i for i, l in enumerate(body) if l.startswith("|"))
    lines = list(itertools.takewhile(lambda l: l.startswith("|"), body[start:]))
    head = [h.strip() for h in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in l.strip("|").split("|")))) for l in lines[2:]]


def write_records(tmp_path, caching: bool) -> list:
    g = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm"],
                                                 "loads": LOADS, "prefix_caching": caching}]})
    paths = []
    for cell in g.cells:
        summary = {"num_requests": 8, "completed": 8, "failed": 0, "output_tokens_per_s": 10.0,
                   "prefix_caching": caching, "tensor_parallel": cell.gpus, "goodput_share": 1.0,
                   "gpu_telemetry_source": "nvml", "gpu0_sm_clock_mhz_mean": 1755.0, "gpu0_power_w_mean": 412.4,
                   "gpu0_power_w_max": 500.0, "gpu0_util_pct_mean": 88.0}
        path = tmp_path / cell.record_path("results")
        record.write(Record(cell=cell.to_dict(), status="ok", summary=summary), path)
        paths.append(path)
    return paths


def test_load_kinds_and_prefix_caching_reach_the_tidy_and_serving_tables(tmp_path):
    df = tidy.build(write_records(tmp_path, caching=False)).set_index("load")
    assert (df.loc["c4", "mode"], df.loc["c4", "max_concurrency"]) == ("concurrency", 4)
    assert (df.loc["shared", "prefix_len"], df.loc["c2", "prefix_len"], df.loc["ramp", "ramp_up_s"]) == (12, 0, 5)
    assert not df["prefix_caching"].any() and (df["tensor_parallel"] == 1).all()
    assert (df["gpu0_power_w_mean"] == 412.4).all() and (df["warmup_requests"] == 4).all()
    rows = {r["Load"].split()[0]: r for r in md_rows(render.markdown(serving.table(serving.build(df.reset_index()))))}
    assert rows["c4"]["Load"] == "c4 (concurrency 4 in flight, 16 in / 4 out)"
    assert rows["shared"]["Load"] == "shared (burst, prefix 12, 16 in / 4 out)"
    assert rows["ramp"]["Load"] == "ramp (poisson, 2/s ramp 5 s, 16 in / 4 out)"
    assert all("no prefix cache" in r["settings"] for r in rows.values())
    assert rows["c2"]["GPU MHz / W"] == "1755 / 412"


def test_concurrency_levels_are_points_of_their_own():
    """Two levels of one sweep never pool."""
    rows = []
    for load, level in (("c16", 16), ("c4", 4)):
        rows.append({k: None for k in tidy.ALL_COLUMNS} | dict(
            stage="serve", platform="cpu", model="tiny", engine="vllm", load=load, gpus=1, status="ok",
            mode="concurrency", num_requests=8, input_len=16, output_len=4, max_concurrency=level,
            prefix_len=0, ramp_up_s=0, output_tokens_per_s=10.0 * level))
    pooled = serving.points(pd.DataFrame(rows))
    assert list(pooled["point"]) == ["c4", "c16"]  # by level, not by name
    assert list(pooled["output_tokens_per_s_mean"]) == [40.0, 160.0]


def test_a_record_from_before_the_new_keys_reads_as_no_prefix_no_ramp(tmp_path):
    [cell] = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"],
                                                      "engines": ["transformers"], "loads": {"burst": BASE}}]}).cells
    assert "prefix_len" not in cell.load_spec
    path = tmp_path / cell.record_path("results")
    record.write(Record(cell=cell.to_dict(), status="ok", summary={"completed": 8}), path)
    row = tidy.build([path]).iloc[0]
    assert (row["prefix_len"], row["ramp_up_s"], row["prefix_caching"], row["gpu_telemetry_source"]) == (
        0, 0, None, None)
    [r] = md_rows(render.markdown(serving.table(serving.build(tidy.build([path])))))
    assert r["Load"] == "burst (burst, 16 in / 4 out)" and r["GPU MHz / W"] == ""


def test_requests_that_ended_short_of_the_output_length_are_counted_in_the_table(tmp_path):
    """An engine that stops ignore_eos requests early (SGLang at its context length) says so."""
    [cell] = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"],
                                                      "engines": ["vllm"], "loads": {"burst": BASE}}]}).cells
    rows = []
    for short in (0, 8):
        path = tmp_path / str(short) / cell.record_path("results")
        record.write(Record(cell=cell.to_dict(), status="ok", summary={
            "num_requests": 8, "completed": 8, "failed": 0, "output_shortfall_requests": short}), path)
        [r] = md_rows(render.markdown(serving.table(serving.build(tidy.build([path])))))
        rows.append(r["Requests (failed)"])
    assert rows == ["8 (0)", "8 (0), 8 short"]


def test_a_load_on_a_warm_engine_says_so_and_never_pools_with_a_fresh_engines(tmp_path):
    """Two runs of one burst on fresh engines and a third on a shared engine after other loads
    (provenance.engine_session position 3): the tidy table flags the third, the serving table
    labels it, and the points over runs keep it apart."""
    loads = {f"b-{k}": dict(BASE) for k in (1, 2, 3)}
    g = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm"],
                                                 "loads": loads}]})
    paths = []
    for cell, position in zip(g.cells, (None, 0, 3)):
        prov = {} if position is None else {"engine_session": {"cells": [], "position": position}}
        path = tmp_path / cell.record_path("results")
        record.write(Record(cell=cell.to_dict(), status="ok", provenance=prov,
                            summary={"num_requests": 8, "completed": 8, "failed": 0, "output_tokens_per_s": 10.0}),
                     path)
        paths.append(path)
    df = tidy.build(paths)
    assert list(df.sort_values("load")["warm_engine"]) == [False, False, True]
    table = serving.table(serving.build(df))
    rows = {r["Load"].split()[0]: r for r in md_rows(render.markdown(table)) if " in / " in r["Load"]}
    assert rows["b-3"]["Load"] == "b-3 (burst, warm engine, 16 in / 4 out)" and "warm" not in rows["b-1"]["Load"]
    points = serving.points(serving.build(df)).set_index("point")
    assert points.loc["b", "runs"] == 2 and points.loc["b-3 (warm engine)", "runs"] == 1


def test_prefix_caching_on_and_off_are_points_and_series_of_their_own(tmp_path):
    """Two blocks alike but for prefix_caching, each with runs of one shared-prefix load: the
    runs of each block pool, the two blocks never pool with each other (their engine arguments
    differ), and the sweep figure draws each as a series of its own, named by its cache."""
    from llmbench.report import figures

    paths = []
    for caching in (True, False):
        loads = {f"{'on' if caching else 'off'}-c2-{k}": {**BASE, "mode": "concurrency", "max_concurrency": 2,
                                                          "prefix_len": 12} for k in (1, 2)}
        g = grid.expand({"protocol": {}, "serve": [{"platforms": ["cpu"], "models": ["tiny"], "engines": ["vllm"],
                                                     "loads": loads, "prefix_caching": caching}]})
        for cell, tok_s in zip(g.cells, (10.0, 12.0)):
            path = tmp_path / cell.record_path("results")
            record.write(Record(cell=cell.to_dict(), status="ok", summary={
                "num_requests": 8, "completed": 8, "failed": 0, "output_tokens_per_s": tok_s * (2 if caching else 1),
                "prefix_caching": caching}), path)
            paths.append(path)
    df = tidy.build(paths)
    assert set(df["engine_args"]) == {"--enable-prefix-caching", "--no-enable-prefix-caching"}
    points = serving.points(serving.build(df)).set_index("point")
    assert (points.loc["on-c2", "runs"], points.loc["off-c2", "runs"]) == (2, 2)
    assert (points.loc["on-c2", "output_tokens_per_s_mean"], points.loc["off-c2", "output_tokens_per_s_mean"]) == (
        22.0, 11.0)
    render.write(serving.table(serving.build(df)), tmp_path / "serving.csv", tmp_path / "serving.md",
                 tmp_path / "serving.html")
    chart = figures.serve_sweep_chart({"serving": render.read_csv(tmp_path / "serving.csv")}).to_dict()
    series = {r["series"] for d in chart["datasets"].values() for r in d}
    assert series == {"vllm · cpu · tiny · prefix 12, cache on", "vllm · cpu · tiny · prefix 12, cache off"}
