"""Altair figures, each from the tables it plots (llmbench.report.catalog names them), saved so
they open offline (inline JS, SVG, PNG).

A chart builder takes ``tables``: the catalog tables it reads, by name (their CSVs as
render.read_csv loads them: integer columns as Int64), and ``requests`` where it reads the
per-request table. Each figure answers one question; its title says which.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import altair as alt
import pandas as pd

from . import catalog, render, serving
from .render import fmt

Tables = Mapping[str, pd.DataFrame]


def load(name: str, paths: Mapping[str, str]) -> dict[str, pd.DataFrame]:
    """The inputs of figure ``name`` (catalog) from ``paths`` (the rule's named inputs)."""
    out = {}
    for source in catalog.get("figure", name).reads:
        key = catalog.input_key(source)
        if source.startswith("table:"):
            out[source.split(":", 1)[1]] = render.read_csv(paths[key])
        else:
            out[source] = pd.read_parquet(paths[key])
    return out


def _title(name: str) -> str:
    return catalog.get("figure", name).title


def _get(tables: Tables | None, name: str, columns: list[str]) -> pd.DataFrame:
    """Table ``name`` with at least ``columns`` (an absent table or column is empty, so a run
    without those cells still gets its figure)."""
    df = (tables or {}).get(name)
    df = pd.DataFrame(columns=columns) if df is None else df
    return df.reindex(columns=list(dict.fromkeys(list(df.columns) + columns))).copy()


def _empty(title: str, x: str, why: str) -> alt.Chart:
    """An empty panel that says why (an empty facet renders to a zero-size SVG)."""
    empty = pd.DataFrame({"value": pd.Series(dtype=float)})
    return alt.Chart(empty).mark_point().encode(x=alt.X("value:Q", title=x)).properties(
        width=420, height=60, title=f"{title}: {why}")


def _bs(v) -> str:
    """A batch size label: '8', never '8.0'."""
    return fmt(v, ".0f")


def _ints(s: pd.Series) -> pd.Series:
    """Integer labels of a column of counts ('8', never '8.0'; empty where missing), as text
    that joins with other text even when the column is empty."""
    return pd.Series([_bs(v) for v in s], index=s.index, dtype=object)


# The verdict -----------------------------------------------------------------------------

#: a check's verdict -> its colour (Okabe-Ito: told apart with any colour vision)
CHECK_COLOURS = {"holds": "#0072B2", "contradicts": "#D55E00", "inconclusive": "#999999"}
CHECKS = ["finding", "platform", "model", "gpus", "check", "compares", "layout", "row_verdict", "verdict", "value",
          "lo", "hi", "claim_lo", "claim_hi", "n", "pairing", "method"]


def verdict_counts(findings_table: pd.DataFrame) -> str:
    """'N rows: a holds, b contradicts, ...' over the findings table's rows (a finding on one
    platform, model and GPU count), in the verdicts' order."""
    from .findings import VERDICTS

    vc = findings_table["verdict"].value_counts() if "verdict" in findings_table else pd.Series(dtype=int)
    return f"{len(findings_table)} rows: " + ", ".join(f"{int(vc.get(v, 0))} {v}" for v in VERDICTS)


def _check_rows(checks: pd.DataFrame) -> pd.DataFrame:
    """The checks with a value or an interval, each with its label and the numbers as drawn on a
    log axis: a zero or an open end (a one-sided claim, an interval without an upper end) at the
    axis' edge, the exact numbers kept for the tooltip."""
    num = ["value", "lo", "hi", "claim_lo", "claim_hi"]
    df = checks.copy()
    for c in num:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    df = df[df["value"].notna() | (df["lo"].notna() & df["hi"].notna())].copy()
    if df.empty:
        return df
    finite = df[num].stack()
    finite = finite[(finite > 0) & (finite < float("inf"))]
    floor = float(finite.min()) / 2 if len(finite) else 0.01
    ceiling = float(finite.max()) * 2 if len(finite) else 100.0
    for c in num:
        df[f"x_{c}"] = df[c].clip(lower=floor, upper=ceiling)
    df["x_claim_lo"] = df["x_claim_lo"].fillna(floor)
    df["x_claim_hi"] = df["x_claim_hi"].fillna(ceiling)
    df["x_lo"] = df["x_lo"].fillna(df["x_value"])
    df["x_hi"] = df["x_hi"].fillna(df["x_value"])
    gpus = pd.Series([f" · {_bs(g)} GPU" + ("" if _bs(g) == "1" else "s") if _bs(g) else "" for g in df["gpus"]],
                     index=df.index, dtype=object)
    layout = df["layout"].astype(object).where(df["layout"].notna(), "")
    model = df["model"].astype(object).map(lambda m: f" · {m}" if isinstance(m, str) and m not in ("", "-") else "")
    df["row"] = (df["platform"].astype(str) + model + gpus + " · check "
                 + _ints(df["check"]) + layout.map(lambda v: f" · {v}" if v else ""))
    df.attrs["domain"] = [floor, ceiling]
    return df


def verdict_chart(tables: Tables | None = None) -> alt.TopLevelMixin:
    """The verdict as one forest plot: per finding, one row per check that has a value (a
    platform, model and GPU count; a parallel layout), our value (dot) and its 95 % interval
    (rule) against the band the paper's claim allows (shaded), coloured by the check's verdict;
    the findings table's counts per verdict in the subtitle. A log axis: most checks are
    ratios (1 = no difference), the rest shares and sizes, each read against its own band."""
    findings_table = _get(tables, "findings", ["finding", "platform", "model", "gpus", "verdict"])
    checks = _get(tables, "findings-checks", CHECKS)
    title = _title("verdict")
    counts = verdict_counts(findings_table)
    df = _check_rows(checks[checks["verdict"].isin(list(CHECK_COLOURS))])
    if df.empty:
        return _empty(f"{title}. {counts}", "ours", "no check has a value")
    per_check = ", ".join(f"{int((df['verdict'] == v).sum())} {v}" for v in CHECK_COLOURS)
    order = list(dict.fromkeys(df.sort_values(["platform", "model", "gpus", "check"])["row"]))
    # the findings in the findings table's order (the paper's sections)
    findings = [f for f in dict.fromkeys(findings_table["finding"]) if f in set(df["finding"])]
    findings += sorted(set(df["finding"]) - set(findings))
    scale = alt.Scale(type="log", domain=df.attrs["domain"], clamp=True)
    axis = alt.Axis(title="ours (a ratio: 1 = no difference; a share; a size)", grid=False, format="~g")
    y = alt.Y("row:N", title=None, sort=order, axis=alt.Axis(labelLimit=320))
    tip = ["finding", "platform", "model", "gpus", "check", "compares", "layout", "verdict",
           alt.Tooltip("row_verdict:N", title="the row's verdict"), alt.Tooltip("value:Q", format=".4~g"),
           alt.Tooltip("lo:Q", format=".4~g", title="95 % low"), alt.Tooltip("hi:Q", format=".4~g", title="95 % high"),
           alt.Tooltip("claim_lo:Q", format=".4~g", title="claim allows from"),
           alt.Tooltip("claim_hi:Q", format=".4~g", title="claim allows to"), "n", "pairing", "method"]
    colour = alt.Color("verdict:N", title="check", scale=alt.Scale(domain=list(CHECK_COLOURS),
                                                                  range=list(CHECK_COLOURS.values())))
    base = alt.Chart().encode(y=y, tooltip=tip)
    band = base.mark_bar(color="#009E73", opacity=0.18, height=alt.RelativeBandSize(0.9)).encode(
        x=alt.X("x_claim_lo:Q", scale=scale, axis=axis), x2="x_claim_hi:Q")
    interval = base.mark_rule(strokeWidth=2).encode(x=alt.X("x_lo:Q", scale=scale, axis=axis), x2="x_hi:Q",
                                                    color=colour)
    point = base.mark_point(filled=True, size=45, opacity=1).encode(x=alt.X("x_value:Q", scale=scale, axis=axis),
                                                                    color=colour)
    one = alt.Chart().mark_rule(color="#555555", strokeDash=[2, 2]).encode(x=alt.datum(1))
    return alt.layer(band, interval, point, one, data=df).properties(width=460, height=alt.Step(12)).facet(
        row=alt.Row("finding:N", title=None, sort=findings,
                    header=alt.Header(labelAngle=0, labelAlign="left", labelAnchor="start", labelOrient="top",
                                      labelFontWeight="bold", labelPadding=2)),
        spacing=6,
    ).resolve_scale(y="independent").properties(title=alt.Title(title, subtitle=[
        f"The findings table: {counts}.",
        f"Checks with a value: {per_check}. Dot: ours; line: its 95 % interval; green band: what the paper's "
        "claim allows (to the axis' edge where one-sided); dashed: 1.",
        "A check without a value (not run, out of scope) has no row: the findings table names what would decide it."]))


# Pre-training and fine-tuning: per method and platform, ours against the paper's -----------

#: the metrics a method figure shows; each compares across hardware (per GPU, relative, MFU)
METHOD_METRICS = ("tokens/s per GPU", "relative to {base} (tokens/s per GPU)", "MFU %")


def _method_points(long: pd.DataFrame, label: str, base: str) -> pd.DataFrame:
    """One point per (model, method, series, metric) of a paper table's long CSV: ours per
    platform, GPU count and run, the paper's per paper platform (8 GPUs); ok cells, and
    out-of-memory cells at 0 (an OOM is a result: no tokens) with status 'oom'."""
    cols = ["model", "technique", "platform", "run", "gpus", "status", "batch_size", "tokens_per_s_per_gpu",
            "relative_tokens_per_s", "mfu", "paper_status", "paper_batch_size", "paper_tokens_per_s_per_gpu",
            "paper_relative_tokens_per_s", "paper_mfu"]
    long = long.reindex(columns=cols)
    # the question is ours against the paper's: the models both have (a run of only the
    # paper's models' smoke model shows its own), the methods we ran (the paper's all if none)
    ran, printed = long[long["status"].notna()], long[long["paper_status"].notna()]
    models = (set(ran["model"]) & set(printed["model"])) or set(ran["model"]) or set(printed["model"])
    methods = set(zip(ran["model"], ran["technique"])) or set(zip(printed["model"], printed["technique"]))
    long = long[[(m, t) in methods and m in models for m, t in zip(long["model"], long["technique"])]]
    ours = long[long["status"].isin(["ok", "oom"])]
    mine = pd.DataFrame({"model": ours["model"], "method": ours["technique"], "platform": ours["platform"],
                         "run": ours["run"].astype(object).where(ours["run"].notna(), ""), "source": "ours",
                         "status": ours["status"], "batch": _ints(ours["batch_size"]), "gpus": ours["gpus"],
                         METHOD_METRICS[0]: ours["tokens_per_s_per_gpu"],
                         METHOD_METRICS[1].format(base=base): ours["relative_tokens_per_s"],
                         METHOD_METRICS[2]: 100 * ours["mfu"].astype(float)})
    paper = long[long["paper_status"].isin(["ok", "oom"])].drop_duplicates(["model", "technique", "platform"])
    theirs = pd.DataFrame({"model": paper["model"], "method": paper["technique"], "platform": paper["platform"],
                           "run": "paper", "source": "paper",
                           "status": paper["paper_status"],
                           "batch": _ints(paper["paper_batch_size"]), "gpus": 8,
                           METHOD_METRICS[0]: paper["paper_tokens_per_s_per_gpu"],
                           METHOD_METRICS[1].format(base=base): paper["paper_relative_tokens_per_s"],
                           METHOD_METRICS[2]: 100 * paper["paper_mfu"].astype(float)})
    both = pd.concat([mine, theirs], ignore_index=True)
    metrics = [m.format(base=base) for m in METHOD_METRICS]
    both.loc[both["status"] == "oom", metrics] = 0.0
    points = both.melt(id_vars=["model", "method", "platform", "run", "source", "status", "batch", "gpus"],
                       value_vars=metrics,
                       var_name="metric", value_name="value").dropna(subset=["value"])
    points["table"] = label
    return points


#: what a reader compares, coloured: hardware and GPU count (Okabe-Ito, then Tableau's
#: colourblind-safe ten where more series than eight are drawn)
HARDWARE_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442",
                    "#1170aa", "#fc7d0b", "#a3acb9", "#57606c", "#5fa2ce", "#c85200", "#7b848f", "#a3cce9")


def _series(points: pd.DataFrame) -> pd.Series:
    """The hardware a point was measured on: platform and GPU count (ours), or the paper's
    platform (its 8-GPU node). Never the run: several runs of one platform and GPU count share
    a colour, and the run is in the tooltip."""
    out = [f"{r.platform} (paper)" if r.source != "ours"
           else f"{r.platform} · {_bs(r.gpus)} GPU" + ("" if _bs(r.gpus) == "1" else "s")
           for r in points.itertuples()]
    return pd.Series(out, index=points.index, dtype=object)


def _hardware_scale(series: pd.Series, source: pd.Series) -> alt.Scale:
    """Ours first (by platform and GPU count), then the paper's, each its own colour."""
    def key(label: str) -> tuple[str, int]:
        platform, _, gpus = label.partition(" · ")
        return platform, int(gpus.split()[0]) if gpus[:1].isdigit() else 0

    ours = sorted(set(series[source == "ours"]), key=key)
    domain = ours + sorted(set(series[source != "ours"]))
    return alt.Scale(domain=domain, range=[HARDWARE_COLOURS[i % len(HARDWARE_COLOURS)] for i in range(len(domain))])


def _methods_chart(points: pd.DataFrame, title: str, base_note: str) -> alt.TopLevelMixin:
    """Dots per method (rows), coloured by hardware: filled circle, ours (platform · GPUs);
    hollow triangle, the paper's platform; cross at 0, out of memory. One column per metric
    (each its own scale), one panel per table and model, so that no panel needs scrolling."""
    if points.empty:
        return _empty(title, "value", "no measured cell of ours or of the paper for these models")
    points = points.assign(series=_series(points), panel=points["table"].astype(str) + " · " + points["model"].astype(str))
    order = list(dict.fromkeys(points["method"]))
    panels = list(dict.fromkeys(points["panel"]))  # the tables' order: table, then model
    base = alt.Chart().encode(
        y=alt.Y("method:N", title=None, sort=order),
        x=alt.X("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color("series:N", title="hardware (platform · GPUs)",
                        scale=_hardware_scale(points["series"], points["source"])),
        tooltip=["table", "model", "method", "series", "source", "run", "status", "batch", "gpus", "metric",
                 alt.Tooltip("value:Q", format=",.3~f")])
    ok = alt.datum.status == "ok"
    ours = base.transform_filter(ok & (alt.datum.source == "ours")).mark_point(
        shape="circle", size=70, filled=True, opacity=0.9)
    paper = base.transform_filter(ok & (alt.datum.source == "paper")).mark_point(
        shape="triangle-up", size=70, filled=False, strokeWidth=2)
    oom = base.transform_filter(alt.datum.status == "oom").mark_point(shape="cross", size=70, filled=True)
    metrics = [m for m in dict.fromkeys(points["metric"])]
    return alt.layer(ours, paper, oom, data=points).properties(width=230, height=alt.Step(16)).facet(
        row=alt.Row("panel:N", title=None, sort=panels, header=alt.Header(
            labelAngle=0, labelAlign="left", labelAnchor="start", labelOrient="top", labelFontWeight="bold")),
        column=alt.Column("metric:N", title=None, sort=metrics),
        align=alt.RowColLayoutAlign(row="each", column="all"),  # a short panel stays short
    ).resolve_scale(x="independent", y="independent").properties(
        title=alt.Title(title, subtitle=[base_note, "Filled circle: ours (platform · GPUs of the cell; the run in the "
                                         "tooltip); hollow triangle: the paper's (8-GPU node); cross at 0: out of "
                                         "memory (ours or the paper's '-'). A cell not run has no mark: see the "
                                         "table."]))


def pretrain_chart(tables: Tables | None = None) -> alt.TopLevelMixin:
    """Per pre-training method and platform, ours against the paper's, through what compares
    across hardware: tokens/s per GPU, the relative to Z3 and MFU, at batch 1 (Table III) and
    at the best batch (Table IV). One dot per cell: a 1-GPU and a 2-GPU cell are two dots."""
    from .paper_tables import BASELINE

    points = pd.concat([_method_points(_get(tables, "table3", []), "Table III: batch 1", BASELINE["table3"]),
                        _method_points(_get(tables, "table4", []), "Table IV: best batch", BASELINE["table4"])],
                       ignore_index=True)
    return _methods_chart(points, _title("pretrain"),
                          f"Relative: a method's tokens/s per GPU over {BASELINE['table3']}'s on the same platform, "
                          "model and GPU count (ours), or the paper's platform. MFU: none for 4-bit methods.")


def finetune_chart(tables: Tables | None = None) -> alt.TopLevelMixin:
    """Per fine-tuning method and platform, ours against the paper's (Table IX, batch 1):
    tokens/s per GPU, the relative to LoRA (L) and MFU."""
    from .paper_tables import BASELINE

    points = _method_points(_get(tables, "table9", []), "Table IX: batch 1", BASELINE["table9"])
    return _methods_chart(points, _title("finetune"),
                          f"Relative: a method's tokens/s per GPU over {BASELINE['table9']}'s on the same platform, "
                          "model and GPU count. MFU with a frozen base (4N + attention); none for 4-bit methods.")


# Fig. 4 ----------------------------------------------------------------------------------

def scaling_chart(tables: Tables | None = None) -> alt.TopLevelMixin:
    """Fig. 4: how tokens/s per GPU holds up as GPUs are added, per training cell run on
    several counts; the linear ideal (the fewest GPUs' per-GPU rate) dashed."""
    df = _get(tables, "scaling", ["stage", "platform", "model", "backend", "layout", "technique", "batch_size", "gpus",
                                  "nodes", "tokens_per_s",
                                  "ideal_tokens_per_s", "efficiency_pct", "tokens_per_s_per_gpu", "mfu",
                                  "paper_efficiency_pct"])
    title = _title("scaling")
    if df.empty:
        return _empty(title, "GPUs", "no cell ran on several GPU counts")
    # a Megatron-LM series names its backend and layout (two layouts are two series)
    layout = pd.Series([f" {b}-{lay}" if isinstance(lay, str) and lay else "" for b, lay in
                        zip(df["backend"], df["layout"])], index=df.index, dtype=object)
    df["cell"] = (df["model"].astype(str) + " " + df["technique"].astype(str) + " bs" + _ints(df["batch_size"])
                  + " " + df["stage"].astype(str) + layout)
    df["ideal_per_gpu"] = df["ideal_tokens_per_s"] / df["gpus"].astype(float)
    long = pd.concat([df.assign(series="measured", value=df["tokens_per_s_per_gpu"]),
                      df.assign(series="linear", value=df["ideal_per_gpu"])], ignore_index=True)
    long["mfu_pct"] = 100 * long["mfu"].astype(float)
    # the nodes the GPUs span: a point over several nodes has a shape of its own (older
    # tables have no such column: one node)
    long["nodes"] = long["nodes"].fillna(1).astype(int).astype(str)
    lines = alt.Chart(long).mark_line(point=True).encode(
        x=alt.X("gpus:Q", title="GPUs", axis=alt.Axis(values=sorted({int(g) for g in df["gpus"]}), format="d")),
        y=alt.Y("value:Q", title="tokens/s per GPU"),
        color=alt.Color("cell:N", title="cell"),
        strokeDash=alt.StrokeDash("series:N", title=None, scale=alt.Scale(domain=["measured", "linear"],
                                                                         range=[[1, 0], [5, 4]])),
        shape=alt.Shape("nodes:N", title="nodes"),
        tooltip=["cell", "gpus", "nodes", "series", alt.Tooltip("value:Q", format=",.1f"),
                 alt.Tooltip("efficiency_pct:Q", format=".1f", title="efficiency %"),
                 alt.Tooltip("mfu_pct:Q", format=".1f", title="MFU %"),
                 alt.Tooltip("paper_efficiency_pct:Q", format=".1f", title="paper efficiency %")])
    return lines.properties(width=320, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title=alt.Title(title, subtitle="Efficiency = the measured line over the linear one; the paper prints only "
                                        "its 8-GPU efficiencies (tooltip), no throughput."))


# Serving ---------------------------------------------------------------------------------

SERVING = ["platform", "model", "engine", "load", "gpus", "status", "num_requests", "completed", "input_len",
           "output_len", "output_tokens_per_s", "request_throughput_per_s", "p50_e2e_latency_s"]


def serve_throughput_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Fig. 6: output-token throughput per engine, grouped by platform, one panel per model.
    A load cut at its timeout shows what completed before the cut (status in the tooltip)."""
    df = _get(tables, "serving", SERVING)
    df = df[df["status"].isin(serving.MEASURED_LOADS)].copy()
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
        title=_title("serve-throughput"))


SWEEP = ["platform", "model", "engine", "engine_version", "load", "gpus", "status", "mode", "rate_per_s",
         "max_concurrency", "prefix_len", "prefix_caching", "output_tokens_per_s", "p50_ttft_s", "p50_tpot_s",
         "p50_e2e_latency_s", "p99_e2e_latency_s", "goodput_share"]


def _sweep_row(df: pd.DataFrame, col: str, label: str, log: bool) -> alt.HConcatChart:
    """One sweep's three panels: output tokens/s, the throughput-latency curve (median and p99
    end-to-end latency, solid and dashed) and goodput."""
    tip = ["series", "load", alt.Tooltip(f"{col}:Q", title=label),
           alt.Tooltip("output_tokens_per_s:Q", format=",.1f"), alt.Tooltip("p50_ttft_s:Q", format=".3f"),
           alt.Tooltip("p50_tpot_s:Q", format=".4f"), alt.Tooltip("p50_e2e_latency_s:Q", format=".2f"),
           alt.Tooltip("p99_e2e_latency_s:Q", format=".2f"), alt.Tooltip("goodput_share:Q", format=".3f")]
    # tableau20: a sweep figure holds more than category10's ten series (engines x models x caches)
    base = alt.Chart(df).mark_line(point=True).encode(
        color=alt.Color("series:N", title="engine · platform · model", legend=alt.Legend(labelLimit=400),
                        scale=alt.Scale(scheme="tableau20")), tooltip=tip)
    x = alt.X(f"{col}:Q", title=label, scale=alt.Scale(type="log", base=2) if log else alt.Undefined)
    served = base.encode(x=x, y=alt.Y("output_tokens_per_s:Q", title="output tokens/s"))
    knees = serving.sweep_knees(df, col)
    if len(knees):  # each series' knee, a diamond on its line
        served = alt.layer(served, alt.Chart(knees).mark_point(shape="diamond", size=150, filled=True).encode(
            x=x, y="output_tokens_per_s:Q", color=alt.Color("series:N"),
            tooltip=["series", alt.Tooltip(f"{col}:Q", title=f"knee: {label}"),
                     alt.Tooltip("output_tokens_per_s:Q", format=",.1f")]))
    curve = base.transform_fold(["p50_e2e_latency_s", "p99_e2e_latency_s"], as_=["percentile", "latency_s"]).encode(
        x=alt.X("output_tokens_per_s:Q", title="output tokens/s"),
        y=alt.Y("latency_s:Q", title="end-to-end latency (s): p50 solid, p99 dashed"),
        strokeDash=alt.StrokeDash("percentile:N", legend=None,
                                  scale=alt.Scale(domain=["p50_e2e_latency_s", "p99_e2e_latency_s"],
                                                  range=[[1, 0], [4, 3]])),
        order=f"{col}:Q")
    good = base.encode(x=x, y=alt.Y("goodput_share:Q", title="goodput (share meeting TTFT and TPOT targets)",
                                    scale=alt.Scale(domain=[0, 1])))
    return alt.hconcat(*(c.properties(width=260, height=220) for c in (served, curve, good)))


def serve_sweep_chart(tables: Tables | None = None) -> alt.VConcatChart | alt.HConcatChart | alt.Chart:
    """Beyond the paper: the sweeps serving users run (vLLM's bench sweep, SGLang's
    bench_serving), per engine: against the offered rate (Poisson arrivals) and against the
    requests kept in flight (a concurrency load), one row each where it ran. How much does
    it serve as the load grows (saturation, its knee a diamond: llmbench.report.serving's
    sweep_knees, the serving table's "Sweeps" part), what does that cost in median and p99
    end-to-end latency (the throughput-latency curve), and which share of requests still meets
    the TTFT and TPOT targets (goodput)? One line per engine (its version), platform and model
    (serving.sweep_loads)."""
    df = serving.sweep_loads(_get(tables, "serving", SWEEP))
    if df.empty:
        return _empty(_title("serve-sweep"), "requests/s offered, or requests in flight",
                      "no Poisson or concurrency load ran")
    rows = [_sweep_row(df[df["mode"] == mode].sort_values(["series", col]), col, label, log)
            for mode, (col, label, log) in serving.SWEEPS.items() if (df["mode"] == mode).any()]
    chart = rows[0] if len(rows) == 1 else alt.vconcat(*rows)
    return chart.properties(title=_title("serve-sweep"))


def serve_latency_cdf_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Figs. 7-10: exact CDF of end-to-end request latency, one line per engine, one panel
    per (platform, model, load): engines on one platform side by side (Figs. 7, 9) and,
    reading across panels, one engine on several platforms (Figs. 8, 10). The fraction is
    of all the cell's requests, so a load cut at its timeout (its unfinished requests count
    as never done) ends below 1 rather than pretending its slowest requests did not exist."""
    keys = ["platform", "model", "engine", "load"]
    req = _get(tables, "requests", keys + ["e2e_s", "ok"])
    cells = _get(tables, "serving", SERVING)
    cells = cells[cells["status"].isin(serving.MEASURED_LOADS)][keys]
    frames = []
    if not req.empty:
        req = req.merge(cells, on=keys)
        for _, grp in req.groupby(keys):
            n = len(grp)
            grp = grp[grp["ok"].astype(bool)].sort_values("e2e_s")
            frames.append(grp.assign(cdf=[(i + 1) / n for i in range(len(grp))]))
    df = pd.concat(frames) if frames else pd.DataFrame(columns=keys + ["e2e_s", "cdf"])
    df = df[keys + ["e2e_s", "cdf"]].copy()
    df["panel"] = df["platform"].astype(str) + " / " + df["model"].astype(str) + " / " + df["load"].astype(str)
    lines = alt.Chart(df).mark_line(interpolate="step-after").encode(
        x=alt.X("e2e_s:Q", title="end-to-end latency (s)"),
        y=alt.Y("cdf:Q", title="fraction of requests", scale=alt.Scale(domain=[0, 1])),
        color=alt.Color("engine:N", title="engine"),
        tooltip=["engine", alt.Tooltip("e2e_s:Q", format=".2f"), alt.Tooltip("cdf:Q", format=".3f")],
    )
    return lines.properties(width=300, height=220).facet(facet=alt.Facet("panel:N", title=None), columns=3).properties(
        title=_title("serve-latency-cdf"))


# Microbenchmarks -------------------------------------------------------------------------

def micro_gemm_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Fig. 11: GEMM TFLOP/s against M, one line per curve (N, K), one panel per platform."""
    df = _get(tables, "micro-gemm", ["platform", "case", "m", "n", "k", "tflops", "pct_of_peak"])
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("m:Q", title="M"), y=alt.Y("tflops:Q", title="TFLOP/s"), color=alt.Color("case:N", title="case"),
        tooltip=["case:N", "m:Q", "n:Q", "k:Q", alt.Tooltip("tflops:Q", format=".1f"),
                 alt.Tooltip("pct_of_peak:Q", format=".1f")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title=_title("micro-gemm"))


def micro_memcpy_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Fig. 12: copy bandwidth against size, one line per direction and host memory kind."""
    df = _get(tables, "micro-memcpy", ["platform", "direction", "pinned", "bytes", "gb_per_s", "time_s"])
    pinned = df["pinned"].map(lambda v: v if isinstance(v, bool) else str(v).lower() == "true")
    df["copy"] = df["direction"].astype(str) + " " + pinned.map({True: "pinned", False: "pageable"}).astype(str)
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("bytes:Q", title="bytes", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("gb_per_s:Q", title="GB/s"), color=alt.Color("copy:N", title="copy"),
        tooltip=["copy:N", "bytes:Q", alt.Tooltip("gb_per_s:Q", format=".2f"), alt.Tooltip("time_s:Q", format=".2e")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title=_title("micro-memcpy"))


def micro_collectives_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Figs. 13-15: bus bandwidth against size per collective, with and without P2P."""
    df = _get(tables, "micro-collectives", ["platform", "case", "op", "bytes", "busbw_gb_per_s", "time_s"])
    lines = alt.Chart(df).mark_line(point=True).encode(
        x=alt.X("bytes:Q", title="bytes", scale=alt.Scale(type="log", base=2)),
        y=alt.Y("busbw_gb_per_s:Q", title="bus bandwidth (GB/s)"), color=alt.Color("op:N", title="collective"),
        strokeDash=alt.StrokeDash("case:N", title="P2P"),
        tooltip=["op:N", "case:N", "bytes:Q", alt.Tooltip("busbw_gb_per_s:Q", format=".2f"),
                 alt.Tooltip("time_s:Q", format=".2e")])
    return lines.properties(width=360, height=240).facet(column=alt.Column("platform:N", title=None)).properties(
        title=_title("micro-collectives"))


# Profiles --------------------------------------------------------------------------------

def _profile_cell(df: pd.DataFrame) -> pd.Series:
    return (df["platform"].astype(str) + " " + df["model"].astype(str) + " " + df["technique"].astype(str)
            + " bs" + _ints(df["batch_size"]))


def profile_modules_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Fig. 5: each module's share of the forward and backward phases, one bar per profile
    cell (technique, batch size) and, beneath it, the paper's A800 bar of the same model,
    method and batch where Table VI has one; one panel per phase."""
    df = _get(tables, "profile-modules", ["platform", "model", "technique", "batch_size", "phase", "module",
                                          "share_pct", "time_ms", "paper_share_pct", "paper_time_ms"])
    df = df[df["phase"].isin(["forward", "backward"])].copy()
    df["cell"] = _profile_cell(df)
    paper = df[df["paper_share_pct"].notna()].drop_duplicates(["model", "technique", "batch_size", "phase", "module"])
    paper = paper.assign(cell="paper a800 " + paper["model"].astype(str) + " " + paper["technique"].astype(str)
                         + " bs" + _ints(paper["batch_size"]), share_pct=paper["paper_share_pct"],
                         time_ms=paper["paper_time_ms"])
    both = pd.concat([df, paper], ignore_index=True)[["cell", "phase", "module", "share_pct", "time_ms"]]
    bars = alt.Chart(both).mark_bar().encode(
        y=alt.Y("cell:N", title=None, sort=list(dict.fromkeys(both["cell"]))),
        x=alt.X("share_pct:Q", title="share of the phase", stack="normalize"),
        color=alt.Color("module:N", title="module", scale=alt.Scale(scheme="tableau20")),  # 13 kinds: no repeats
        tooltip=["cell", "phase", "module", alt.Tooltip("share_pct:Q", format=".1f", title="% of phase"),
                 alt.Tooltip("time_ms:Q", format=".3f", title="ms")])
    return bars.properties(width=420, height=alt.Step(18)).facet(row=alt.Row("phase:N", title=None)).properties(
        title=_title("profile-modules"))


def profile_serve_chart(tables: Tables | None = None) -> alt.FacetChart:
    """Tables X-XI: a serving forward pass (prefill; one decode step) by part of the model
    and by kernel class, one bar per inference cell and phase."""
    df = _get(tables, "profile-serve", ["platform", "model", "technique", "batch_size", "phase", "view", "group",
                                        "ms", "pct"])
    df["cell"] = _profile_cell(df) + " " + df["phase"].astype(str)
    bars = alt.Chart(df).mark_bar().encode(
        y=alt.Y("cell:N", title=None), x=alt.X("ms:Q", title="ms per forward pass", stack="zero"),
        color=alt.Color("group:N", title="part / class"),
        tooltip=["cell", "view", "group", alt.Tooltip("ms:Q", format=".3f"), alt.Tooltip("pct:Q", format=".1f")])
    return bars.properties(width=420, height=140).facet(row=alt.Row("view:N", title=None)).properties(
        title=_title("profile-serve"))


def profile_comm_chart(tables: Tables | None = None) -> alt.Chart:
    """Tables XIV-XVI: what share of a DeepSpeed step goes to memory copies, communication
    and AllReduce, ours beside the paper's A800 value of the same ZeRO stage (or method)."""
    parts = ["memcpy", "comm", "allreduce"]
    df = _get(tables, "profile-comm", ["platform", "model", "technique", "batch_size", "gpus"]
              + [f"{w}_pct" for w in parts] + [f"paper_{w}_pct" for w in parts])
    title = _title("profile-comm")
    if df.empty:
        return _empty(title, "% of the step", "no DeepSpeed profile cell")
    df["cell"] = _profile_cell(df) + " g" + _ints(df["gpus"])
    long = pd.concat([pd.DataFrame({"cell": df["cell"], "what": w, "source": src, "pct": df[col].astype(float)})
                      for w in parts for src, col in (("ours", f"{w}_pct"), ("paper (A800, 8 GPUs)", f"paper_{w}_pct"))],
                     ignore_index=True).dropna(subset=["pct"])
    long["bar"] = long["what"] + " · " + long["source"]
    bars = alt.Chart(long).mark_bar().encode(
        y=alt.Y("cell:N", title=None), yOffset=alt.YOffset("bar:N", sort=[f"{w} · {s}" for w in parts for s in (
            "ours", "paper (A800, 8 GPUs)")]),
        x=alt.X("pct:Q", title="% of the step"), color=alt.Color("what:N", title=None, sort=parts),
        opacity=alt.Opacity("source:N", title=None, scale=alt.Scale(domain=["ours", "paper (A800, 8 GPUs)"],
                                                                     range=[1.0, 0.4])),
        tooltip=["cell", "what", "source", alt.Tooltip("pct:Q", format=".1f")])
    return bars.properties(width=420, height=alt.Step(10), title=alt.Title(
        title, subtitle="Solid: ours; pale: the paper's value for the same ZeRO stage (Tables XIV, XVI) or method "
                        "(Table XV)."))


def vega_bundle() -> str:
    """The vega-embed JavaScript bundle (Vega, Vega-Lite, vega-embed) that a figure's HTML
    page inlines to open offline, as altair's ``save(inline=True)`` makes it. vl-convert
    bundles it anew in each process (seconds), the same for every figure of one vl-convert:
    the workflow makes it once per run (rule vega_bundle) and each figure reads it."""
    import vl_convert
    from altair.utils._importers import vl_version_for_vl_convert

    return vl_convert.javascript_bundle(vl_version=vl_version_for_vl_convert())


class _Inline:
    """altair's inline page template with a bundle made beforehand (vega_bundle)."""

    def __init__(self, bundle: str):
        self.bundle = bundle

    def render(self, **kwargs) -> str:
        from altair.utils.html import INLINE_HTML_TEMPLATE

        return INLINE_HTML_TEMPLATE.render(vegaembed_script=self.bundle, **kwargs)


def save(chart: alt.TopLevelMixin, stem: Path | str, bundle: str | None = None) -> list[Path]:
    """Save ``chart`` as <stem>.html (JavaScript inlined: ``bundle``, else vega_bundle()),
    <stem>.svg and <stem>.png (the SVG rasterised at twice its size: the chart is laid out
    once, and the PNG is the same image as altair's own PNG at scale factor 2)."""
    import vl_convert

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = [stem.with_suffix(".html"), stem.with_suffix(".svg"), stem.with_suffix(".png")]
    chart.save(str(out[0]), format="html", template=_Inline(vega_bundle() if bundle is None else bundle))
    chart.save(str(out[1]))
    out[2].write_bytes(vl_convert.svg_to_png(out[1].read_text(), scale=2))
    return out


#: figure name -> chart builder, one per catalog figure (figures.<name>_chart)
CHARTS = {e.name: globals()[e.function] for e in catalog.FIGURES}
