"""Altair figures from the tidy table, saved so they open offline (inline JS, SVG, PNG)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd


def pretrain_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.VConcatChart:
    """Throughput and peak memory per technique, coloured by platform, one column per model."""
    df = tidy[(tidy["stage"] == "pretrain") & (tidy["status"] == "ok")].copy()
    # astype(str): with no such cells the columns are empty floats
    df["cell"] = df["technique"].astype(str) + " bs" + df["batch_size"].astype(str)
    # Megatron-LM cells apart from DeepSpeed's: "Naive bs1 megatron-tp1pp1"
    meg = df["layout"].notna()
    if meg.any():
        df.loc[meg, "cell"] = (df.loc[meg, "cell"] + " " + df.loc[meg, "backend"].astype(str) + "-"
                               + df.loc[meg, "layout"].astype(str))
    base = alt.Chart(df).encode(
        x=alt.X("cell:N", title="technique, batch size", sort=None),
        color=alt.Color("platform:N", title="platform"),
        xOffset="platform:N",
        tooltip=["platform", "model", "technique", "batch_size", "gpus",
                 alt.Tooltip("tokens_per_s_mean:Q", format=",.1f"),
                 alt.Tooltip("peak_mem_gib:Q", format=".2f"), "peak_mem_kind", "mfu",
                 alt.Tooltip("mfu_vs_gemm:Q", format=".1%", title="MFU vs measured GEMM")],
    )
    tps = base.mark_bar().encode(y=alt.Y("tokens_per_s_mean:Q", title="tokens/s (all GPUs)"))
    mem = base.mark_bar().encode(y=alt.Y("peak_mem_gib:Q", title="peak memory per GPU (GiB)"))
    column = alt.Column("model:N", title=None)
    return alt.vconcat(
        tps.properties(width=360, height=220).facet(column=column),
        mem.properties(width=360, height=160).facet(column=column),
    ).properties(title="Pre-training: throughput and peak memory per technique (ok cells)")


def finetune_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Throughput against peak memory per fine-tuning method (Table IX), one panel per model."""
    df = tidy[(tidy["stage"] == "finetune") & (tidy["status"] == "ok")].copy()
    base = alt.Chart(df).encode(
        x=alt.X("peak_mem_gib:Q", title="peak memory per GPU (GiB)"),
        y=alt.Y("tokens_per_s_mean:Q", title="tokens/s (all GPUs)"),
        color=alt.Color("platform:N"),
        tooltip=["platform", "model", "technique", "batch_size", "trainable_params",
                 alt.Tooltip("tokens_per_s_mean:Q", format=",.1f"), alt.Tooltip("peak_mem_gib:Q", format=".2f")],
    )
    points = base.mark_point(filled=True, size=60)
    labels = base.mark_text(align="left", dx=6, fontSize=9).encode(text="technique:N")
    return alt.layer(points, labels, data=df).properties(width=360, height=260).facet(
        column=alt.Column("model:N", title=None)
    ).properties(title="Fine-tuning: throughput against memory per method (ok cells)")


#: serving cells whose numbers a figure shows: complete loads, and loads cut at timeout_s
#: (what completed before the cut; llmbench.serve.bench)
MEASURED_LOADS = ("ok", "timeout")


def serve_throughput_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Fig. 6: output-token throughput per engine, grouped by platform, one panel per model.
    A load cut at its timeout shows what completed before the cut (status in the tooltip)."""
    df = tidy[(tidy["stage"] == "serve") & tidy["status"].isin(MEASURED_LOADS)].copy()
    df["cell"] = df["platform"].astype(str) + " / " + df["load"].astype(str)
    bars = alt.Chart(df).mark_bar().encode(
        x=alt.X("cell:N", title="platform / load", sort=None),
        xOffset="engine:N",
        y=alt.Y("output_tokens_per_s:Q", title="output tokens/s"),
        color=alt.Color("engine:N", title="engine"),
        tooltip=["platform", "model", "engine", "load", "gpus", "status", "num_requests", "completed", "input_len",
                 "output_len", alt.Tooltip("output_tokens_per_s:Q", format=",.1f"),
                 alt.Tooltip("request_throughput_per_s:Q", format=",.2f"),
                 alt.Tooltip("p50_e2e_latency_s:Q", format=".2f")],
    )
    return bars.properties(width=320, height=240).facet(column=alt.Column("model:N", title=None)).properties(
        title="Serving: output-token throughput per engine (ok cells, and timeout cells up to the cut; Fig. 6)")


def serve_latency_cdf_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Figs. 7-10: exact CDF of end-to-end request latency, one line per engine, one panel
    per (platform, model, load): engines on one platform side by side (Figs. 7, 9) and,
    reading across panels, one engine on several platforms (Figs. 8, 10). The fraction is
    of all the cell's requests, so a load cut at its timeout (its unfinished requests count
    as never done) ends below 1 rather than pretending its slowest requests did not exist."""
    req = (tables or {}).get("requests", pd.DataFrame())
    keys = ["platform", "model", "engine", "load"]
    cells = tidy[(tidy["stage"] == "serve") & tidy["status"].isin(MEASURED_LOADS)][keys]
    frames = []
    if not req.empty:
        req = req.merge(cells, on=keys)
        for _, grp in req.groupby(keys):
            n = len(grp)
            grp = grp[grp["ok"].astype(bool)].sort_values("e2e_s")
            frames.append(grp.assign(cdf=[(i + 1) / n for i in range(len(grp))]))
    df = pd.concat(frames) if frames else pd.DataFrame(columns=["platform", "model", "engine", "load", "e2e_s", "cdf"])
    df = df[["platform", "model", "engine", "load", "e2e_s", "cdf"]].copy()
    df["panel"] = df["platform"].astype(str) + " / " + df["model"].astype(str) + " / " + df["load"].astype(str)
    lines = alt.Chart(df).mark_line(interpolate="step-after").encode(
        x=alt.X("e2e_s:Q", title="end-to-end latency (s)"),
        y=alt.Y("cdf:Q", title="fraction of requests", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("engine:N", title="engine"),
        tooltip=["engine", alt.Tooltip("e2e_s:Q", format=".2f"), alt.Tooltip("cdf:Q", format=".3f")],
    )
    return lines.properties(width=300, height=220).facet(facet=alt.Facet("panel:N", title=None), columns=3).properties(
        title="Serving: latency CDF per engine, fraction of all requests (ok and timeout cells; Figs. 7-10)")


def _bench_rows(tables: dict[str, pd.DataFrame] | None, bench: str, columns: list[str]) -> pd.DataFrame:
    """One microbenchmark's rows of the micro table, with exactly ``columns``: a run without
    that benchmark (a collectives-only GPU pair, say) gives an empty frame, not a KeyError."""
    micro = (tables or {}).get("micro", pd.DataFrame())
    rows = micro[micro["bench"] == bench] if "bench" in micro.columns else micro.iloc[0:0]
    return rows.reindex(columns=columns).copy()


def micro_gemm_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Fig. 11: GEMM TFLOP/s against M, one line per curve (N, K), one panel per platform."""
    df = _bench_rows(tables, "gemm", ["platform", "case", "m", "n", "k", "tflops", "pct_of_peak"])
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("m:Q", title="M"), y=alt.Y("tflops:Q", title="TFLOP/s"), color=alt.Color("case:N", title="case"),
        tooltip=["case:N", "m:Q", "n:Q", "k:Q", alt.Tooltip("tflops:Q", format=".1f"),
                 alt.Tooltip("pct_of_peak:Q", format=".1f")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title="GEMM throughput against M (Fig. 11)")


def micro_memcpy_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Fig. 12: copy bandwidth against size, one line per direction and host memory kind."""
    df = _bench_rows(tables, "memcpy", ["platform", "direction", "pinned", "bytes", "gb_per_s", "time_s"])
    df["copy"] = df["direction"].astype(str) + " " + df["pinned"].map({True: "pinned", False: "pageable"}).astype(str)
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("bytes:Q", title="bytes", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("gb_per_s:Q", title="GB/s"), color=alt.Color("copy:N", title="copy"),
        tooltip=["copy:N", "bytes:Q", alt.Tooltip("gb_per_s:Q", format=".2f"), alt.Tooltip("time_s:Q", format=".2e")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title="Memory copies: bandwidth against size (Fig. 12; h2h on a CPU platform is a host copy)")


def micro_collectives_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Figs. 13-15: bus bandwidth against size per collective, with and without P2P."""
    df = _bench_rows(tables, "collectives", ["platform", "case", "op", "bytes", "busbw_gb_per_s", "time_s"])
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("bytes:Q", title="bytes", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("busbw_gb_per_s:Q", title="bus bandwidth (GB/s)"), color=alt.Color("op:N", title="collective"),
        strokeDash=alt.StrokeDash("case:N", title="P2P"),
        tooltip=["op:N", "case:N", "bytes:Q", alt.Tooltip("busbw_gb_per_s:Q", format=".2f"),
                 alt.Tooltip("time_s:Q", format=".2e")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title="Collectives: bus bandwidth against size (Figs. 13-15)")


def profile_modules_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Fig. 5: each module's share of the forward and backward phases, one bar per profile
    cell (technique, batch size), one panel per phase."""
    rows = (tables or {}).get("profile", pd.DataFrame())
    cols = ["platform", "model", "technique", "batch_size", "phase", "module", "share", "time_s"]
    df = rows[rows["backend"] == "torch"][cols].copy() if len(rows) else pd.DataFrame(columns=cols)
    df = df[df["phase"].isin(["forward", "backward"])]
    df["cell"] = (df["platform"].astype(str) + " " + df["model"].astype(str) + " " + df["technique"].astype(str)
                  + " bs" + df["batch_size"].astype(str))
    bars = alt.Chart(df).mark_bar().encode(
        y=alt.Y("cell:N", title=None), x=alt.X("share:Q", title="share of the phase", stack="normalize"),
        color=alt.Color("module:N", title="module"),
        tooltip=["cell", "phase", "module", alt.Tooltip("share:Q", format=".1%"), alt.Tooltip("time_s:Q", format=".2e")])
    return bars.properties(width=420, height=160).facet(row=alt.Row("phase:N", title=None)).properties(
        title="Module-wise time of a training step (Fig. 5, Table VI)")


def profile_serve_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.FacetChart:
    """Tables X-XI: a serving forward pass (prefill; one decode step) by part of the model
    and by kernel class, one bar per inference cell and phase."""
    from . import profile

    rows = (tables or {}).get("profile", pd.DataFrame())
    df, _ = profile.serve(tidy, rows if len(rows) else pd.DataFrame())
    df["cell"] = (df["platform"].astype(str) + " " + df["model"].astype(str) + " " + df["technique"].astype(str)
                  + " bs" + df["batch_size"].astype(str) + " " + df["phase"].astype(str))
    bars = alt.Chart(df).mark_bar().encode(
        y=alt.Y("cell:N", title=None), x=alt.X("ms:Q", title="ms per forward pass", stack="zero"),
        color=alt.Color("group:N", title="part / class"),
        tooltip=["cell", "view", "group", alt.Tooltip("ms:Q", format=".3f"), alt.Tooltip("pct:Q", format=".1f")])
    return bars.properties(width=420, height=140).facet(row=alt.Row("view:N", title=None)).properties(
        title="Serving forward passes: timeline (Table XI) and kernel classes (Table X)")


def profile_comm_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.Chart:
    """Tables XIV-XVI: memcpy, communication and AllReduce share of a DeepSpeed step."""
    from . import profile

    df, _ = profile.comm(tidy)
    df["cell"] = (df["platform"].astype(str) + " " + df["model"].astype(str) + " " + df["technique"].astype(str)
                  + " bs" + df["batch_size"].astype(str) + " g" + df["gpus"].astype(str))
    long = df.melt(id_vars=["cell"], value_vars=["memcpy_pct", "comm_pct", "allreduce_pct"], var_name="what",
                   value_name="pct")
    long["what"] = long["what"].str.replace("_pct", "", regex=False)
    bars = alt.Chart(long).mark_bar().encode(
        y=alt.Y("cell:N", title=None), yOffset="what:N", x=alt.X("pct:Q", title="% of the step"),
        color=alt.Color("what:N", title=None), tooltip=["cell", "what", alt.Tooltip("pct:Q", format=".1f")])
    title = "Memory copies and communication per DeepSpeed step (Tables XIV-XVI)"
    if long.empty:  # bands without a domain render to a zero-size SVG: an empty panel instead
        empty = pd.DataFrame({"pct": pd.Series(dtype=float)})
        return alt.Chart(empty).mark_bar().encode(x=alt.X("pct:Q", title="% of the step")).properties(
            width=420, height=60, title=f"{title}: no DeepSpeed profile cell")
    return bars.properties(width=420, height=alt.Step(12), title=title)


def scaling_chart(tidy: pd.DataFrame, tables: dict[str, pd.DataFrame] | None = None) -> alt.Chart | alt.FacetChart:
    """Fig. 4: tokens/s against GPUs per training cell run on several counts, with the
    linear ideal from the fewest GPUs dashed."""
    from . import scaling

    df = scaling.build(tidy)
    df["cell"] = df["technique"].astype(str) + " bs" + df["batch_size"].astype(str) + " " + df["stage"].astype(str)
    long = pd.concat([df.assign(series="measured", value=df["tokens_per_s"]),
                      df.assign(series="linear", value=df["ideal_tokens_per_s"])])
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("gpus:Q", title="GPUs"), y=alt.Y("value:Q", title="tokens/s (all GPUs)"),
        color=alt.Color("cell:N", title="cell"), strokeDash=alt.StrokeDash("series:N", title=None),
        tooltip=["cell", "gpus", "series", alt.Tooltip("value:Q", format=",.1f"),
                 alt.Tooltip("efficiency_pct:Q", format=".1f")])
    title = "Data-parallel scaling (Fig. 4)"
    if long.empty:  # an empty facet (or untyped columns) renders to a zero-size SVG: an empty panel
        empty = pd.DataFrame({"gpus": pd.Series(dtype=float), "value": pd.Series(dtype=float)})
        return alt.Chart(empty).mark_line().encode(x=alt.X("gpus:Q", title="GPUs"), y=alt.Y("value:Q", title="tokens/s")
                                                   ).properties(width=320, height=240,
                                                                title=f"{title}: no cell ran on several GPU counts")
    return lines.properties(width=320, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title=title)


def save(chart: alt.TopLevelMixin, stem: Path | str) -> list[Path]:
    """Save ``chart`` as <stem>.html (JavaScript inlined), <stem>.svg and <stem>.png."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_suffix(".html"), stem.with_suffix(".svg"), stem.with_suffix(".png")]
    chart.save(str(out[0]), inline=True)
    chart.save(str(out[1]))
    chart.save(str(out[2]), scale_factor=2)
    return out


#: figure name (path stem under figures/) -> chart builder
CHARTS = {"pretrain": pretrain_chart, "finetune": finetune_chart,
          "serve-throughput": serve_throughput_chart, "serve-latency-cdf": serve_latency_cdf_chart,
          "micro-gemm": micro_gemm_chart, "micro-memcpy": micro_memcpy_chart,
          "micro-collectives": micro_collectives_chart, "profile-modules": profile_modules_chart,
          "profile-serve": profile_serve_chart, "profile-comm": profile_comm_chart, "scaling": scaling_chart}
