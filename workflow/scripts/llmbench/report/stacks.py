"""The paper's training stack and today's (tables/stacks.{csv,md,html}): every training cell
that PyTorch FSDP2 ran, beside DeepSpeed's cell of the same method, model, platform, GPU
count and batch (the paper's framework, the baseline: 1.00).

Per side: tokens/s per GPU (mean ± sample std over its repeats, n), MFU against the bf16
peak (an FP8 cell's against the FP8 peak too), and the allocated and reserved peak GPU
memory. Then FSDP2 over DeepSpeed in tokens/s with a 95 % interval and in allocated memory,
paired as the findings pair two cells (llmbench.report.evidence): both from one paired set
(per-round ratios), else from one machine, else from two machines with the machine-to-machine
spread added. A method FSDP2 ran that DeepSpeed did not shows its one side, and '-' where
DeepSpeed's cell ran out of memory.
An FP8 cell (FP8, FP8R) is also set over the same stack's cell of its method in bf16 (the
FP8 flag dropped), paired the same way.

The technique names map onto FSDP2 as docs/methods.md says (Z3: resharding after forward,
Z2: no resharding, no Z flag: replication): a row compares the two frameworks' realisation of
one method name, not identical algorithms.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd

from .. import techniques
from . import evidence, render
from .render import fmt

#: The stacks side by side, baseline first: backend -> its column label.
STACKS = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2"}
BASELINE = "deepspeed"
#: One comparison: the cell but its backend.
KEY = ["stage", "platform", "gpus", "model", "technique", "batch_size"]
COLUMNS = KEY + [f"{s}_{m}" for s in STACKS for m in ("status", "tokens_per_s_per_gpu", "sd", "n", "mfu",
                                                      "mfu_fp8_peak", "allocated_gib", "reserved_gib", "run")] + [
    "ratio", "ratio_lo", "ratio_hi", "pairing", "method", "memory_ratio",
    # an FP8 cell over the same stack's cell of its method in bf16 (the FP8 flag dropped)
    "fp8_ratio", "fp8_ratio_lo", "fp8_ratio_hi", "fp8_pairing"]


def _ok(frame: pd.DataFrame | None) -> pd.DataFrame:
    if frame is None or frame.empty or "backend" not in frame:
        return pd.DataFrame()
    keep = frame["stage"].isin(["pretrain", "finetune"]) & (frame["status"] == "ok") & frame["backend"].isin(list(STACKS))
    if "kind" in frame:
        keep &= frame["kind"].fillna("cell") == "cell"
    return frame[keep & frame["tokens_per_s_mean"].notna()]


def _repeats(row: pd.Series) -> list[float]:
    """Tokens/s per GPU of each repeat of one tidy row (as the verdicts read it)."""
    per_gpu = row.copy()
    per_gpu["tokens_per_s_per_gpu"] = float(row["tokens_per_s_mean"]) / float(row["gpus"])
    return [v for v in evidence.repeat_values(per_gpu, "tokens_per_s_per_gpu") if v > 0]


def _side(row: pd.Series) -> evidence.Side:
    vals = _repeats(row)
    return evidence.Side([math.log(v) for v in vals], machine=str(row.get("machine") or ""),
                         paired_set=row.get("paired_set") if isinstance(row.get("paired_set"), str) else None,
                         run=str(row.get("run") or ""), rounds=evidence.round_keys(row, len(vals)))


def _pick(base: pd.DataFrame, other: pd.Series, used: set[str]) -> tuple[pd.Series, str] | None:
    """DeepSpeed's record to compare ``other`` with: one of its paired set, else one of its
    machine, else the record the report uses for that cell (llmbench.report.runs)."""
    if base.empty:
        return None
    pset = other.get("paired_set")
    if isinstance(pset, str) and pset:
        same = base[base["paired_set"] == pset]
        if len(same):
            return same.iloc[0], "set"
    same = base[base["machine"] == other.get("machine")]
    if len(same):
        return same.iloc[0], "machine"
    chosen = base[base["record_path"].astype(str).isin(used)] if "record_path" in base else base.iloc[0:0]
    return (chosen.iloc[0] if len(chosen) else base.iloc[0]), "machines"


def _oom(tidy: pd.DataFrame, key: dict) -> pd.DataFrame:
    """The baseline's out-of-memory records of one cell."""
    mask = (tidy["backend"] == BASELINE) & (tidy["status"] == "oom")
    for k, v in key.items():
        mask &= tidy[k] == v
    return tidy[mask]


def _fill(out: dict, stack: str, row: pd.Series | None) -> None:
    if row is None:
        return
    vals = _repeats(row)
    out.update({f"{stack}_status": "ok", f"{stack}_tokens_per_s_per_gpu": statistics.fmean(vals),
                f"{stack}_sd": statistics.stdev(vals) if len(vals) > 1 else None, f"{stack}_n": len(vals),
                f"{stack}_mfu": row.get("mfu"), f"{stack}_mfu_fp8_peak": row.get("mfu_fp8_peak"),
                f"{stack}_allocated_gib": row.get("peak_mem_allocated_gib"),
                f"{stack}_reserved_gib": row.get("peak_mem_reserved_gib"), f"{stack}_run": row.get("run")})


def _bf16_of(rows: pd.DataFrame, other: pd.Series) -> pd.DataFrame:
    """The records of ``other``'s cell in bf16 (its FP8 flag dropped; same stack, method,
    model, platform, GPUs and batch); empty where ``other`` is no FP8 cell."""
    tech = techniques.parse(other["technique"])
    if tech.fp8 is None:
        return rows.iloc[0:0]
    mask = (rows["backend"] == other["backend"]) & (rows["technique"] == dataclasses.replace(tech, fp8=None).name)
    for k in KEY:
        if k != "technique":
            mask &= rows[k] == other[k]
    return rows[mask]


def build(tidy: pd.DataFrame, superseded: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per training cell of a stack other than the baseline, with the baseline's cell."""
    used = _ok(tidy)
    rows = pd.concat([used, _ok(superseded)], ignore_index=True) if superseded is not None else used
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    used_paths = set(used["record_path"].astype(str)) if "record_path" in used else set()
    pooled = evidence.pooled_cv(tidy)
    spread, _ = evidence.machine_spread(pd.concat([tidy, superseded], ignore_index=True)
                                        if superseded is not None else tidy)
    out = []
    others = used[used["backend"] != BASELINE]
    for _, other in others.sort_values(KEY + ["backend"]).iterrows():
        key = {k: other[k] for k in KEY}
        mask = (rows["backend"] == BASELINE)
        for k, v in key.items():
            mask &= rows[k] == v
        row = {**key}
        _fill(row, other["backend"], other)
        picked = _pick(rows[mask], other, used_paths)
        if picked is None and len(_oom(tidy, key)):
            row[f"{BASELINE}_status"] = "oom"  # the paper's '-': memory ran out
        if picked is not None:
            base, pairing = picked
            _fill(row, BASELINE, base)
            est = evidence.ratio(_side(other), _side(base), pairing, pooled, spread)
            a, b = other.get("peak_mem_allocated_gib"), base.get("peak_mem_allocated_gib")
            row.update({"ratio": est.value, "ratio_lo": est.lo, "ratio_hi": est.hi, "pairing": est.pairing,
                        "method": est.method, "memory_ratio": a / b if a and b and a == a and b == b else None})
        bf16 = _pick(_bf16_of(rows, other), other, used_paths)
        if bf16 is not None:
            est = evidence.ratio(_side(other), _side(bf16[0]), bf16[1], pooled, spread)
            row.update({"fp8_ratio": est.value, "fp8_ratio_lo": est.lo, "fp8_ratio_hi": est.hi,
                        "fp8_pairing": est.pairing})
        out.append(row)
    return pd.DataFrame(out).reindex(columns=COLUMNS)


def _tps(r: pd.Series, s: str) -> str:
    v = r.get(f"{s}_tokens_per_s_per_gpu")
    if r.get(f"{s}_status") == "oom":
        return "- (out of memory)"
    if v is None or v != v:
        return ""
    sd = r.get(f"{s}_sd")
    return f"{v:,.1f}" + (f" ± {sd:,.1f}" if sd is not None and sd == sd else "") + f" (n {int(r[f'{s}_n'])})"


def _gib(r: pd.Series, s: str) -> str:
    a, b = r.get(f"{s}_allocated_gib"), r.get(f"{s}_reserved_gib")
    return "" if a is None or a != a else f"{a:.2f} / {b:.2f}"


def _mfu(r: pd.Series, s: str) -> str:
    """MFU % against the bf16 peak, and against the FP8 peak beside it for an FP8 cell."""
    bf16, fp8 = r.get(f"{s}_mfu"), r.get(f"{s}_mfu_fp8_peak")
    text = fmt(100 * bf16 if bf16 is not None and bf16 == bf16 else None, ".1f")
    return text + (f" (FP8 peak {100 * fp8:.1f})" if fp8 is not None and fp8 == fp8 else "")


def _ratio(r: pd.Series, col: str) -> str:
    v = r.get(col)
    return "" if v is None or v != v else f"{v:.2f} [{r[col + '_lo']:.2f}, {r[col + '_hi']:.2f}]"


def table(df: pd.DataFrame) -> render.Table:
    rows = []
    for _, r in df.iterrows():
        ratio = _ratio(r, "ratio")
        fp8 = _ratio(r, "fp8_ratio")
        if fp8:
            fp8 += f" ({r['fp8_pairing']})"
        rows.append([r["stage"], r["platform"], fmt(r["gpus"], ".0f"), r["model"], r["technique"],
                     fmt(r["batch_size"], ".0f")]
                    + [x for s in STACKS for x in (_tps(r, s), _mfu(r, s), _gib(r, s))]
                    + [ratio, r["pairing"] if isinstance(r["pairing"], str) else "",
                       fmt(r["memory_ratio"], ".2f"), fp8])
    head = ["Stage", "Platform", "GPUs", "Model", "Method", "BS"] + [
        x for s in STACKS.values() for x in (f"{s} tok/s/GPU", f"{s} MFU %", f"{s} GiB alloc / rsv")] + [
        "FSDP2 / DeepSpeed tok/s [95 %]", "pairing", "FSDP2 / DeepSpeed memory", "FP8 / bf16 tok/s [95 %]"]
    return render.simple(
        "stacks", df, head, rows,
        "Every training cell PyTorch FSDP2 ran, beside DeepSpeed's cell of the same method, model, platform, GPU "
        "count and batch (the paper's framework; the baseline). tok/s/GPU: mean ± sample std over repeats (n); MFU "
        "against the bf16 peak (an FP8 cell's against the FP8 peak beside it); memory: allocated / reserved peak a GPU. The ratio's interval pairs as the verdicts "
        "do: 'set' (one paired set, per-round ratios), 'machine' (one machine), 'machines' (two machines, their "
        "spread added). The method names map onto FSDP2 as docs/methods.md says (Z3: reshard after forward; Z2: no "
        "resharding, parameters still sharded at rest; no Z flag: replication): a row compares each framework's "
        "realisation of one method, not identical algorithms. '-': out of memory (the paper's '-'). FP8 / bf16: an "
        "FP8 cell over the same stack's cell of its method without the FP8 flag, paired the same way.")
