"""The memory model's validation table (llmbench.memory.validate) as the report shows it:
the figures of ours and of DeepSpeed's and accelerate's estimators, then every training
record, predicted beside measured."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..config import REPO_ROOT
from ..memory import validate
from ..memory.constants import FAMILY_MARGINS, MARGIN
from . import catalog, render
from .render import fmt


def build(tidy: pd.DataFrame, root: Path | None = None,
          reference: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(one row per training record, the figures, the paper's cells: validate.paper_check)."""
    root = root or REPO_ROOT
    df = validate.build(tidy, root)
    paths = [p for p in (reference or []) if Path(p).stem in validate.PAPER_TABLES]
    return df, validate.figures(df), validate.paper_check(paths, root)


def _pct(v) -> str:
    return fmt(v, ".1f") + ("%" if fmt(v, ".1f") else "")


def _paper_part(paper: pd.DataFrame) -> render.Part:
    """Per paper table and status: how many cells, how many predicted not to fit."""
    if paper.empty:
        return render.Part(frame=pd.DataFrame(), heading="Against the paper's statuses")
    g = paper.groupby(["table", "paper_status"]).agg(cells=("predicted_fits", "size"),
                                                    not_fit=("predicted_fits", lambda s: int((~s.astype(bool)).sum())))
    rows = [[t, st, str(r.cells), str(r.not_fit)] for (t, st), r in g.iterrows()]
    miss = paper[(paper["paper_status"] == "ok") & ~paper["predicted_fits"].astype(bool)]
    by = ", ".join(f"{k} {v}" for k, v in miss.groupby("technique").size().sort_values(ascending=False).items())
    return render.Part(frame=pd.DataFrame(rows, columns=["Paper table", "Paper status", "Cells",
                                                          "Predicted not to fit"]),
                       heading="Against the paper's statuses (Tables III, IV, IX: ok or '-')", note=(
        "Each cell on its platform file's GPUs per node, at the paper's batch, sequence 350, with the same margin. "
        "The paper ran its own implementation: an ok cell predicted not to fit says where ours needs more memory "
        f"than the paper's did (here: {by or 'none'}); offload cells are held to the host memory of the platform "
        "file's Slurm mem_mb."))


def _near_limit_part(df: pd.DataFrame) -> render.Part:
    """Where a fit is decided (validate.near_limit): the reserved peak's error near the GPU's
    limit, and the ok records on the margin's far side."""
    near = validate.near_limit(df)
    rows = [[r.group, str(r.rows), _pct(r.median_abs_error_pct), _pct(r.p90_abs_error_pct),
             _pct(r.median_signed_error_pct),
             "" if pd.isna(r.min_reserved_share) else f"{r.min_reserved_share:.0%}-{r.max_reserved_share:.0%}",
             str(r.above_tight), str(r.probes)] for r in near.itertuples()]
    return render.Part(frame=pd.DataFrame(rows, columns=[
        "ok GPU records", "Rows", "Median |error| (reserved)", "90th pct |error|", "Median signed error",
        "GPU reserved", f"Above {validate.TIGHT:.0%}", "Search probes"]),
        heading="Near the limit: the reserved peak, where a fit is decided", note=(
            "Error: (predicted reserved - measured reserved) / measured reserved, over the ok GPU records that "
            f"held at least {validate.NEAR_LIMIT:.0%} of their GPU reserved; the signed median is the bias. "
            "A search's largest batch sits at the margin's edge by construction, so an unbiased model puts about "
            "half of them on its far side: the second row, whose cells still run under skip_predicted_oom where "
            f"a search's probe ran their batch. Above {validate.TIGHT:.0%}: a search's 'tight' at its default "
            "headroom."))


def table(df: pd.DataFrame, figures: pd.DataFrame, paper: pd.DataFrame | None = None) -> render.Table:
    """Four parts: the figures, the reserved peak near the limit, the paper's statuses, then
    the records."""
    fig_rows = [[f.estimator, str(f.rows), _pct(f.median_abs_error_pct), _pct(f.p90_abs_error_pct),
                 f"{f.oom_predicted_not_to_fit} / {f.oom_rows}", f"{f.ok_predicted_not_to_fit} / {f.ok_rows}"]
                for f in figures.itertuples()]
    fig = pd.DataFrame(fig_rows, columns=["Estimator", "Rows it applies to", "Median |error| (ok, measured)",
                                          "90th pct |error|", "OOM predicted not to fit", "ok predicted not to fit"])
    rows = [[r.platform, r.stage, r.model, r.backend + (f" {r.layout}" if isinstance(r.layout, str) else ""),
             r.technique, fmt(r.batch_size, ".0f"), fmt(r.gpus, ".0f"), r.kind or "", r.status,
             fmt(r.measured_gib, ".1f"), fmt(r.predicted_gib, ".1f"), _pct(r.error_pct),
             fmt(r.measured_reserved_gib, ".1f"), fmt(r.predicted_reserved_gib, ".1f"),
             "" if pd.isna(r.predicted_fits) else ("yes" if r.predicted_fits else "no"),
             fmt(r.deepspeed_gib, ".1f"), fmt(r.accelerate_gib, ".1f"), r.fit_reason or ""]
            for r in df.itertuples()]
    head = ["Platform", "Stage", "Model", "Backend", "Method", "BS", "GPUs", "Kind", "Status", "Measured GiB",
            "Predicted GiB", "Error", "Reserved GiB", "Predicted reserved GiB", "Fits", "DeepSpeed GiB",
            "accelerate GiB", "Why not"]
    per_family = ", ".join(f"{k} {v:.1%}" for k, v in FAMILY_MARGINS.items())
    return render.Table(title=catalog.get("table", "memory-model").title, long=df, parts=(
        render.Part(frame=fig, lead=(
            f"Safety margin per technique family ({per_family}; {MARGIN:.0%} for the others: "
            "tables/memory-model-heldout, llmbench.memory.constants.FAMILY_MARGINS): a cell fits when its predicted reserved peak (allocated plus the blocks the "
            "caching allocator keeps beside the loss's) x (1 + margin) is at most the platform's "
            "gpu_memory_gib (and, with offload, the host memory holds every rank's share: the platform file's Slurm "
            "mem_mb, or the machine's the record ran on where smaller). Errors over the ok GPU "
            "records with a measured peak (allocated by tensors); each estimator over the records it applies to."),
            note=("DeepSpeed: estimate_zero2/zero3_model_states_mem_needs (model states only, full-parameter ZeRO "
                  "cells); accelerate: estimate-memory's 'Training using Adam' (bf16, full-parameter cells without "
                  "ZeRO); an estimator that applies to 0 rows here may not be installed where the table was built "
                  "(each needs torch). Targets (reported, not asserted): median |error| <= 10%, >= 90% of OOM cells "
                  "predicted not to fit, no ok cell predicted not to fit.")),
        _near_limit_part(df),
        _paper_part(paper if paper is not None else pd.DataFrame()),
        render.Part(frame=pd.DataFrame(rows, columns=head), heading="Every training record", note=(
            "Measured: peak GPU memory allocated by tensors (empty on a CPU, or for a probe answered from the "
            "search's frontier file, or where the cell did not finish). Error: (predicted - measured) / "
            "measured. Kind: cell, or a max-batch search's probe.")),
    ))


def build_heldout(tidy: pd.DataFrame, root: Path | None = None,
                  searches: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the held-out summary per split and family, the margins it gives): heldout.build."""
    from ..memory import heldout

    _, _, summary, margins = heldout.build(tidy, root or REPO_ROOT, searches or [])
    return summary, margins


def heldout_table(summary: pd.DataFrame, margins: pd.DataFrame) -> render.Table:
    """Two parts: the held-out errors per split and family, then the margin per family they
    give beside the one the model uses (constants.FAMILY_MARGINS)."""
    from ..memory import heldout

    def band(med, p90, p95) -> str:
        return " / ".join(_pct(v) or "-" for v in (med, p90, p95))

    rows = [[r.split, r.family, str(r.rows), fmt(r.training_rows, ".0f"),
             band(r.alloc_median_signed_pct, r.alloc_p90_signed_pct, r.alloc_p95_signed_pct),
             band(r.alloc_median_abs_pct, r.alloc_p90_abs_pct, r.alloc_p95_abs_pct),
             band(r.reserved_median_signed_pct, r.reserved_p90_signed_pct, r.reserved_p95_signed_pct),
             band(r.reserved_median_abs_pct, r.reserved_p90_abs_pct, r.reserved_p95_abs_pct),
             f"{r.search_off_over_10pct} of {r.searches}" if r.searches else "",
             _pct(r.search_median_abs_pct), _pct(r.search_max_abs_pct)] for r in summary.itertuples()]
    head = ["Split", "Family", "Held-out records", "Fitted on", "Allocated: signed error (median / p90 / p95)",
            "Allocated: |error|", "Reserved: signed error (median / p90 / p95)", "Reserved: |error|",
            "Searches' largest batch off > 10 %", "Median |error|", "Largest |error|"]
    m_rows = [[r.family, _pct(100 * r.margin), r.source, str(r.rows),
               _pct(100 * FAMILY_MARGINS.get(r.family, MARGIN))] for r in margins.itertuples()]
    return render.Table(title=catalog.get("table", "memory-model-heldout").title, long=summary, parts=(
        render.Part(frame=pd.DataFrame(rows, columns=head), lead=(
            "Each record predicted by constants fitted without it (llmbench.memory.fit.fit_from_scratch). time: "
            f"the earliest {heldout.TIME_SHARE:.0%} of the records by start time fit, the later ones are scored; "
            "family: each technique family left out in turn (a constant only that family's records fit stays "
            "unfitted, so this measures how the model carries over to a family it has never seen). Families "
            "(llmbench.memory.model.family): megatron; qlora and lora (DeepSpeed adapters on a 4-bit or a bf16 "
            "base); then full-parameter 4-bit, offload, zero3, recompute, zero2, naive, the first that applies."),
            note=("Error: (predicted - measured) / measured over the ok GPU records with a measured peak; the "
                  "reserved peak is the one a fit is decided on; a negative signed error is the unsafe side. "
                  "Searches: the largest batch predicted to fit the search's own limit (no margin) against the "
                  "one it found, for the searches held out.")),
        render.Part(frame=pd.DataFrame(m_rows, columns=["Family", "Margin it gives", "From split",
                                                        "Records near the limit", "Margin in use"]),
                    heading="The margin per family", note=(
            f"The {heldout.QUANTILE:.0%} quantile of how far the measured reserved peak went beyond the "
            f"prediction, as a share of the prediction, over the held-out records that held at least "
            f"{heldout.NEAR_LIMIT:.0%} of their GPU reserved (time split first, else family), at least "
            f"{heldout.MARGIN_FLOOR:.0%} (only ok records are scored: they can show that a family needs more than "
            f"the default, not that it can do with less); fewer than {heldout.MIN_ROWS} such records: the default "
            f"{MARGIN:.0%}. "
            "Margin in use: llmbench.memory.constants.FAMILY_MARGINS, set from this table.")),
    ))
