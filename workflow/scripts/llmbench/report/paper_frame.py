"""The paper's published numbers as rows of the tidy table (run = "paper").

The findings engine and the paper tables compare ours with the paper's through the same
columns: a Table III cell of the paper becomes a pretrain row of platform a800, 8 GPUs,
with tokens/s, tokens/s per GPU, MFU and memory in GB; a Table V phase becomes a profile
row's phase walls; a Table XIV share a profile row's memcpy share. So every comparison is
computed the same way on both sides.

Assumptions, stated where they are used:
- every paper cell ran on the whole 8-GPU node (Table I: "Each platform has 8x Nvidia
  GPUs"; Tables II-IV and IX are whole-node runs), so tokens/s per GPU = printed / 8;
- the paper's sequence length is 350 (Section III) and its "GB" column is compared with
  our peak *allocated* GPU memory expressed in GB (10^9 bytes): see MEMORY_BASIS;
- MFU uses each paper platform's dense bf16 peak (config/platforms, with its source) and
  the PaLM FLOPs per token of llmbench.models; none for 4-bit cells (DESIGN.md);
- a value the transcription flags (config/reference ``flag`` column, e.g. a typo of the
  paper) is kept for display but never enters a ratio, a relative or a finding.
"""

from __future__ import annotations

from functools import cache, lru_cache
from pathlib import Path

import pandas as pd

from .. import techniques
from ..config import REPO_ROOT, ConfigError, load_named
from ..models import ModelSpec, flops_per_token
from . import reference
from .tidy import GIB_TO_GB  # noqa: F401 - the paper's GB against our GiB, re-exported for its users

#: GPUs of every paper platform (Table I).
PAPER_GPUS = 8
#: Sequence length of every paper training cell (Section III, "Datasets").
PAPER_SEQ_LEN = 350
#: Which of our memories the paper's "GB" corresponds to, and why (table notes print it).
MEMORY_BASIS = (
    "The paper's 'M (GB)' is compared with our peak allocated GPU memory (torch.cuda."
    "max_memory_allocated) in GB (10^9 bytes), not with reserved memory: the paper's Q "
    "cell (9.8 GB) equals the allocated peak of the same cell on one H100 (9.15 GiB = 9.82 "
    "GB) while its reserved peak is 22.3 GiB, and the paper's ZeRO-2 memory grows with the "
    "batch (37.8 GB at 1, 58.0 at 8) whereas our reserved memory of every ZeRO-2 cell is "
    "the allocator's cache (88.8 GiB at any batch on the H200 pair). Reserved stays beside it."
)
#: The paper tables read here: name -> (stage, default backend).
TABLES = {"table2": "pretrain", "table3": "pretrain", "table4": "pretrain", "table9": "finetune"}


@cache
def platform_spec(name: str, root: Path = REPO_ROOT) -> dict:
    """config/platforms/<name>.yaml, validated, loaded once."""
    return load_named("platform", name, root)


@cache
def _model(name: str, root: Path = REPO_ROOT) -> ModelSpec:
    return ModelSpec.load(name, root)


def flops_per_token_of(model: str, technique: str, seq_len: int, root: Path = REPO_ROOT) -> float | None:
    """PaLM training FLOPs per token of a cell, None for a 4-bit cell or an unknown model."""
    try:
        tech = techniques.parse(technique)
        spec = _model(model, root)
    except (techniques.TechniqueError, ConfigError):
        return None
    if tech.quant4:
        return None
    return flops_per_token(spec, seq_len, frozen_base=tech.adapter is not None)


def mfu_of(tokens_per_s: float, model: str, technique: str, platform: str, gpus: int, seq_len: int,
           root: Path = REPO_ROOT) -> float | None:
    """Model FLOPs utilisation of a cell against its platform's dense bf16 peak."""
    fpt = flops_per_token_of(model, technique, seq_len, root)
    peak = platform_spec(platform, root).get("peak_bf16_tflops")
    if fpt is None or not peak or tokens_per_s is None or pd.isna(tokens_per_s):
        return None
    return tokens_per_s * fpt / (gpus * peak * 1e12)


def _training(root: Path) -> pd.DataFrame:
    frames = []
    for table, stage in TABLES.items():
        ref = reference.load(table, root)
        if "flag" not in ref.columns:
            ref["flag"] = None
        df = pd.DataFrame({
            "stage": stage, "platform": ref["platform"], "model": ref["model"],
            "backend": ref["framework"] if "framework" in ref.columns else "deepspeed",
            "technique": ref["technique"] if "technique" in ref.columns else techniques.NAIVE,
            "batch_size": ref["batch_size"], "gpus": PAPER_GPUS, "seq_len": PAPER_SEQ_LEN,
            "status": ref["status"], "tokens_per_s_mean": ref["tokens_per_s"],
            "tokens_per_s_std": ref.get("tokens_per_s_std"), "peak_mem_gb": ref["mem_gb"],
            "flag": ref["flag"].astype(object).where(ref["flag"].notna(), None), "table": table,
        })
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    # a flagged value (a typo of the paper) is shown, never compared
    flagged = df["flag"].notna()
    df["tokens_per_s_compared"] = df["tokens_per_s_mean"].where(~flagged)
    df["peak_mem_gb_printed"] = df["peak_mem_gb"]
    df["peak_mem_gb"] = df["peak_mem_gb"].where(~flagged)
    df["tokens_per_s_per_gpu"] = df["tokens_per_s_compared"] / df["gpus"]
    df["mfu"] = [mfu_of(t, m, tq, p, g, s, root) for t, m, tq, p, g, s in
                 zip(df["tokens_per_s_compared"], df["model"], df["technique"], df["platform"], df["gpus"],
                     df["seq_len"])]
    return df


def _profile(root: Path) -> pd.DataFrame:
    """Tables V, VII (phases), VIII (attention core), XIII (GEMM share), XIV and XVI
    (copies and communication per iteration) as profile rows of the A800."""
    rows = []
    phases = reference.load("profile_phases", root)
    for (tech, bs), grp in phases.groupby(["technique", "batch_size"]):
        row = {"stage": "profile", "platform": "a800", "model": grp["model"].iloc[0], "backend": "torch",
               "technique": tech, "batch_size": bs, "gpus": PAPER_GPUS, "status": "ok"}
        for r in grp.itertuples():
            row[f"{r.phase}_wall_s"] = r.wall_ms / 1e3
            row[f"{r.phase}_kernel_s"] = r.kernel_ms / 1e3
            if not pd.isna(r.gemm_share_pct):
                row[f"{r.phase}_gemm_s"] = r.wall_ms / 1e3 * r.gemm_share_pct / 100  # share of the phase
        rows.append(row)
    att = reference.load("profile_attention", root)
    for col, tech in (("naive_ms", techniques.NAIVE), ("flash_ms", "F")):
        row = {"stage": "profile", "platform": "a800", "model": att["model"].iloc[0], "backend": "torch",
               "technique": tech, "batch_size": int(att["batch_size"].iloc[0]), "gpus": PAPER_GPUS, "status": "ok",
               "attention_scope": "one decoder layer"}
        for r in att.itertuples():
            row[f"attention_core_{r.phase}_s"] = getattr(r, col) / 1e3
        rows.append(row)
    comm = reference.load("profile_comm", root)
    names = {"ZeRO-2": "Z2", "ZeRO-3": "Z3"}
    for (method, model), grp in comm.groupby(["method", "model"], dropna=False):
        tech = names.get(method, techniques.canonical(method) if method in ("Naive", "F", "R", "R+F") else method)
        bs = grp["batch_size"].dropna()
        row = {"stage": "profile", "platform": "a800", "model": model, "backend": "deepspeed", "technique": tech,
               "batch_size": int(bs.iloc[0]) if len(bs) else None, "gpus": PAPER_GPUS, "status": "ok"}
        for r in grp.itertuples():
            key = {"memcpy": "memcpy", "comm": "comm", "allreduce": "comm_AllReduce"}[r.kind]
            row[f"{key}_s_per_iter"] = r.time_s
            row[f"{key}_share"] = r.pct / 100
        rows.append(row)
    return pd.DataFrame(rows)


def _scaling(root: Path) -> pd.DataFrame:
    """Fig. 4's printed efficiencies as the 8-GPU cell's scaling efficiency."""
    fig = reference.load("fig4", root)
    return pd.DataFrame({
        "stage": "pretrain", "platform": fig["platform"], "model": fig["model"], "backend": "deepspeed",
        "technique": fig["technique"], "batch_size": fig["batch_size"], "gpus": fig["gpus"], "status": "ok",
        "scaling_efficiency": fig["efficiency_pct"] / 100, "table": "fig4",
    })


def _micro(root: Path) -> pd.DataFrame:
    """Table XII's two GEMMs as the micro row of its MLP sweep (% of the A800's peak, small and large M)."""
    t12 = reference.load("table12", root).sort_values("m")
    lo, hi = t12["peak_pct"].iloc[0], t12["peak_pct"].iloc[-1]
    return pd.DataFrame([{
        "stage": "micro", "platform": t12["platform"].iloc[0], "bench": "gemm", "case": "table12-mlp", "gpus": 1,
        "status": "ok", "gemm_large_over_small_m": hi / lo, "gemm_large_m_pct_of_peak": hi, "table": "table12",
    }])


@lru_cache(maxsize=4)
def frame(root: Path = REPO_ROOT) -> pd.DataFrame:
    """Every published number the engine compares, as tidy rows (run = "paper", kind = "cell")."""
    df = pd.concat([_training(root), _scaling(root), _profile(root), _micro(root)], ignore_index=True)
    df["run"] = "paper"
    df["kind"] = "cell"
    return df
