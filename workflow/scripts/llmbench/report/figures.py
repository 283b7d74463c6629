"""Altair figures from the tidy table, saved so they open offline (inline JS, SVG, PNG)."""

from __future__ import annotations

from pathlib import Path

import altair as alt
import pandas as pd


def pretrain_chart(tidy: pd.DataFrame) -> alt.VConcatChart:
    """Throughput and peak memory per technique, coloured by platform, one column per model."""
    df = tidy[(tidy["stage"] == "pretrain") & (tidy["status"] == "ok")].copy()
    df["cell"] = df["technique"] + " bs" + df["batch_size"].astype(str)
    base = alt.Chart(df).encode(
        x=alt.X("cell:N", title="technique, batch size", sort=None),
        color=alt.Color("platform:N", title="platform"),
        xOffset="platform:N",
        tooltip=["platform", "model", "technique", "batch_size", "gpus",
                 alt.Tooltip("tokens_per_s_mean:Q", format=",.1f"),
                 alt.Tooltip("peak_mem_gib:Q", format=".2f"), "peak_mem_kind", "mfu"],
    )
    tps = base.mark_bar().encode(y=alt.Y("tokens_per_s_mean:Q", title="tokens/s (all GPUs)"))
    mem = base.mark_bar().encode(y=alt.Y("peak_mem_gib:Q", title="peak memory per GPU (GiB)"))
    column = alt.Column("model:N", title=None)
    return alt.vconcat(
        tps.properties(width=360, height=220).facet(column=column),
        mem.properties(width=360, height=160).facet(column=column),
    ).properties(title="Pre-training: throughput and peak memory per technique (ok cells)")


def finetune_chart(tidy: pd.DataFrame) -> alt.FacetChart:
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
CHARTS = {"pretrain": pretrain_chart, "finetune": finetune_chart}
