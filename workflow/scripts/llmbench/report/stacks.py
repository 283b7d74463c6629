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

Then the same comparisons at the largest batch (``view`` "largest"): one row per method of the
other stack that a max-batch search answered (llmbench.search; tidy's searched_max_batch), each
side at the largest batch it ran ok, and the table says whether that batch is its search's
answer. There the baseline's cell of a method is the method less the flags the baseline does not
run with it (ZeRO-3 with C, FP8): each stack at what it runs best, FSDP2's F+Z3+C beside
DeepSpeed's F+Z3; an FP8 cell's bf16 cell is at its own largest batch. A ratio is given only
where both sides were searched: a largest batch measured without a search may be far under
what fits, and a ratio against it would say nothing about the stacks.

The technique names map onto FSDP2 as docs/methods.md says (Z3: resharding after forward,
Z2: no resharding, no Z flag: replication): a row compares the two frameworks' realisation of
one method name, not identical algorithms.
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import pandas as pd

from .. import backends, techniques
from . import evidence, render
from .render import fmt

#: The stacks side by side, baseline first: backend -> its column label.
STACKS = {"deepspeed": "DeepSpeed", "fsdp2": "FSDP2"}
BASELINE = "deepspeed"
#: One comparison: the cell but its backend.
KEY = ["stage", "platform", "gpus", "model", "technique", "batch_size"]
#: A method's cells at every batch: the largest batch view's group.
GROUP = [k for k in KEY if k != "batch_size"]
#: Flags that make a method faster without changing what it holds where: at the largest batch
#: the baseline's cell of a method drops those it does not run with the method's other flags.
SPEED_FLAGS = ("C", "FP8", "FP8R")
#: The rows' views: each batch alone, then each side at its largest ok batch.
VIEWS = {"batch": "At each batch", "largest": "At each side's largest batch"}
COLUMNS = ["view"] + KEY + [f"{s}_{m}" for s in STACKS for m in (
    "status", "technique", "batch_size", "searched_max_batch", "tokens_per_s_per_gpu", "sd", "n", "mfu",
    "mfu_fp8_peak", "allocated_gib", "reserved_gib", "run")] + [
    "ratio", "ratio_lo", "ratio_hi", "pairing", "method", "memory_ratio",
    # an FP8 cell over the same stack's cell of its method in bf16 (the FP8 flag dropped)
    "fp8_ratio", "fp8_ratio_lo", "fp8_ratio_hi", "fp8_pairing", "fp8_bf16_batch_size"]


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
                         run=str(row.get("run") or ""), rounds=evidence.round_keys(row, len(vals)),
                         pace=evidence.pace_of(row))


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
    searched = row.get("searched_max_batch")
    out.update({f"{stack}_status": "ok", f"{stack}_technique": row["technique"],
                f"{stack}_batch_size": int(row["batch_size"]),
                f"{stack}_searched_max_batch": None if searched is None or pd.isna(searched) else int(searched),
                f"{stack}_tokens_per_s_per_gpu": statistics.fmean(vals),
                f"{stack}_sd": statistics.stdev(vals) if len(vals) > 1 else None, f"{stack}_n": len(vals),
                f"{stack}_mfu": row.get("mfu"), f"{stack}_mfu_fp8_peak": row.get("mfu_fp8_peak"),
                f"{stack}_allocated_gib": row.get("peak_mem_allocated_gib"),
                f"{stack}_reserved_gib": row.get("peak_mem_reserved_gib"), f"{stack}_run": row.get("run")})


def _bf16_of(rows: pd.DataFrame, other: pd.Series, largest: pd.DataFrame | None = None) -> pd.DataFrame:
    """The records of ``other``'s cell in bf16 (its FP8 flag dropped; same stack, method,
    model, platform, GPUs and batch, or, given ``largest``, the batch the bf16 method runs
    largest there); empty where ``other`` is no FP8 cell."""
    tech = techniques.parse(other["technique"])
    if tech.fp8 is None:
        return rows.iloc[0:0]
    bf16 = dataclasses.replace(tech, fp8=None).name
    return _cells(rows, other["backend"], {**{k: other[k] for k in KEY}, "technique": bf16}, largest)


def _cells(rows: pd.DataFrame, backend: str, key: dict, largest: pd.DataFrame | None = None) -> pd.DataFrame:
    """``rows`` of one backend's cell ``key``; given ``largest`` (the rows the report uses),
    of its method at the largest batch it ran ok there instead of ``key``'s batch."""
    mask = rows["backend"] == backend
    for k in GROUP:
        mask &= rows[k] == key[k]
    if largest is not None:
        batch = _largest_batch(largest, backend, key)
        if batch is None:
            return rows.iloc[0:0]
        key = {**key, "batch_size": batch}
    return rows[mask & (rows["batch_size"] == key["batch_size"])]


def _searched(row: pd.Series) -> bool:
    """Whether a max-batch search of the row's method answered (its largest ok batch is then
    known, not only the largest measured)."""
    found = row.get("searched_max_batch")
    return found is not None and not pd.isna(found)


def _largest_batch(used: pd.DataFrame, backend: str, key: dict) -> int | None:
    """The largest batch at which ``backend`` ran ``key``'s method ok (the rows the report uses)."""
    mask = used["backend"] == backend
    for k in GROUP:
        mask &= used[k] == key[k]
    batches = used.loc[mask, "batch_size"]
    return int(batches.max()) if len(batches) else None


def baseline_technique(technique: str) -> str:
    """The baseline's cell of a method at the largest batch: ``technique`` less the flags of
    SPEED_FLAGS that the baseline does not run (FP8) or does not run with the method's other
    flags (C with ZeRO-3), so that each stack is shown at what it runs best."""
    base = backends.get(BASELINE)
    tech = techniques.parse(technique)
    drop = {f for f in tech.flags if f in SPEED_FLAGS and f in base.rejected_flags(tech.flags)}
    combo = base.rejected_combination(set(tech.flags) - drop)
    drop |= {f for f in (combo[0] if combo else ()) if f in SPEED_FLAGS}
    if "C" in drop:
        tech = dataclasses.replace(tech, compiled=False)
    if drop & set(techniques.FP8_RECIPES):
        tech = dataclasses.replace(tech, fp8=None)
    return tech.name


def build(tidy: pd.DataFrame, superseded: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per training cell of a stack other than the baseline, with the baseline's cell;
    then one per method of it at the largest batch each side ran (view "largest")."""
    used = _ok(tidy)
    rows = pd.concat([used, _ok(superseded)], ignore_index=True) if superseded is not None else used
    if rows.empty:
        return pd.DataFrame(columns=COLUMNS)
    ctx = _Context(tidy, used, rows, superseded)
    others = used[used["backend"] != BASELINE].sort_values(KEY + ["backend"])
    out = [ctx.row("batch", other, _cells(rows, BASELINE, {k: other[k] for k in KEY}),
                   _bf16_of(rows, other)) for _, other in others.iterrows()]
    for _, group in others.groupby(GROUP + ["backend"], sort=False):
        other = group.loc[group["batch_size"].idxmax()]
        key = {**{k: other[k] for k in KEY}, "technique": baseline_technique(other["technique"])}
        if not _searched(other):
            continue  # its largest batch measured is not known to be the largest that fits
        base = _cells(rows, BASELINE, key, largest=used)
        out.append(ctx.row("largest", other, base, _bf16_of(rows, other, largest=used), key))
    return pd.DataFrame(out).reindex(columns=COLUMNS)


@dataclasses.dataclass
class _Context:
    """What every row of one build pairs with: the tidy frames, the pooled repeat spread and
    the machine-to-machine spread (llmbench.report.evidence)."""

    tidy: pd.DataFrame
    used: pd.DataFrame
    rows: pd.DataFrame
    superseded: dataclasses.InitVar[pd.DataFrame | None]

    def __post_init__(self, superseded: pd.DataFrame | None) -> None:
        self.used_paths = set(self.used["record_path"].astype(str)) if "record_path" in self.used else set()
        self.pooled = evidence.pooled_cv(self.tidy)
        both = pd.concat([self.tidy, superseded], ignore_index=True) if superseded is not None else self.tidy
        self.spread = evidence.machine_spreads(both)

    def row(self, view: str, other: pd.Series, base: pd.DataFrame, bf16: pd.DataFrame,
            base_key: dict | None = None) -> dict:
        """One comparison: ``other``'s cell beside the baseline's records ``base`` (one is
        picked: llmbench.report.evidence's pairing) and its bf16 records ``bf16``."""
        key = {k: other[k] for k in KEY}
        row = {"view": view, **key}
        _fill(row, other["backend"], other)

        def paired(r: pd.Series) -> bool:  # at the largest batch: both batches their searches' answers
            return view != "largest" or _searched(r)

        picked = _pick(base, other, self.used_paths)
        if picked is None and len(_oom(self.tidy, base_key or key)):
            row[f"{BASELINE}_status"] = "oom"  # the paper's '-': memory ran out
        if picked is not None:
            found, pairing = picked
            _fill(row, BASELINE, found)
            if paired(found):
                est = evidence.ratio(_side(other), _side(found), pairing, self.pooled, self.spread)
                a, b = other.get("peak_mem_allocated_gib"), found.get("peak_mem_allocated_gib")
                row.update({"ratio": est.value, "ratio_lo": est.lo, "ratio_hi": est.hi, "pairing": est.pairing,
                            "method": est.method,
                            "memory_ratio": a / b if a and b and a == a and b == b else None})
        picked = _pick(bf16, other, self.used_paths)
        if picked is not None and paired(picked[0]):
            found, pairing = picked
            est = evidence.ratio(_side(other), _side(found), pairing, self.pooled, self.spread)
            row.update({"fp8_ratio": est.value, "fp8_ratio_lo": est.lo, "fp8_ratio_hi": est.hi,
                        "fp8_pairing": est.pairing, "fp8_bf16_batch_size": int(found["batch_size"])})
        return row


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


def _batch(r: pd.Series, s: str) -> str:
    """A side's batch in the largest view: its method (where not the row's) and batch, and
    whether that batch is its search's answer."""
    bs = r.get(f"{s}_batch_size")
    if bs is None or bs != bs:
        return ""
    tech = r.get(f"{s}_technique")
    text = (f"{tech} " if isinstance(tech, str) and tech != r["technique"] else "") + f"{int(bs)}"
    found = r.get(f"{s}_searched_max_batch")
    if found is None or found != found:
        return text + " (not searched)"
    return text + (" (searched)" if int(found) == int(bs) else f" (search: {int(found)})")


NOTE = ("tok/s/GPU: mean ± sample std over repeats (n); MFU against the bf16 peak (an FP8 cell's against the FP8 peak "
        "beside it); memory: allocated / reserved peak a GPU. The ratio's interval pairs as the verdicts do: 'set' (one "
        "paired set, per-round ratios), 'machine' (one machine), 'machines' (two machines, their spread added). The "
        "method names map onto FSDP2 as docs/methods.md says (Z3: reshard after forward; Z2: no resharding, parameters "
        "still sharded at rest; no Z flag: replication): a row compares each framework's realisation of one method, not "
        "identical algorithms. '-': out of memory (the paper's '-'). FP8 / bf16: an FP8 cell over the same stack's cell "
        "of its method without the FP8 flag, paired the same way.")


def table(df: pd.DataFrame) -> render.Table:
    parts = []
    for view, heading in VIEWS.items():
        rows = []
        for _, r in df[df["view"] == view].iterrows() if "view" in df else ():
            ratio = _ratio(r, "ratio")
            fp8 = _ratio(r, "fp8_ratio")
            if fp8:
                bf16_bs = r.get("fp8_bf16_batch_size")
                at = f" bs {int(bf16_bs)}" if view == "largest" and bf16_bs == bf16_bs and bf16_bs is not None else ""
                fp8 += f" ({r['fp8_pairing']}{', bf16 at' + at if at else ''})"
            sides = [x for s in STACKS for x in (([_batch(r, s)] if view == "largest" else [])
                                                 + [_tps(r, s), _mfu(r, s), _gib(r, s)])]
            rows.append([r["stage"], r["platform"], fmt(r["gpus"], ".0f"), r["model"], r["technique"]]
                        + ([] if view == "largest" else [fmt(r["batch_size"], ".0f")]) + sides
                        + [ratio, r["pairing"] if isinstance(r["pairing"], str) else "",
                           fmt(r["memory_ratio"], ".2f"), fp8])
        head = ["Stage", "Platform", "GPUs", "Model", "Method"] + ([] if view == "largest" else ["BS"]) + [
            x for s in STACKS.values() for x in (([f"{s} BS"] if view == "largest" else [])
                                                 + [f"{s} tok/s/GPU", f"{s} MFU %", f"{s} GiB alloc / rsv"])] + [
            "FSDP2 / DeepSpeed tok/s [95 %]", "pairing", "FSDP2 / DeepSpeed memory", "FP8 / bf16 tok/s [95 %]"]
        if view == "batch":
            lead = ("Every training cell PyTorch FSDP2 ran, beside DeepSpeed's cell of the same method, model, "
                    "platform, GPU count and batch (the paper's framework; the baseline).")
            note = NOTE
        else:
            lead = ("Each FSDP2 method a max-batch search answered, at the largest batch it ran ok, beside "
                    "DeepSpeed's at the largest batch it ran ok. DeepSpeed's cell is the method less what it does not "
                    "run with it (C under ZeRO-3, FP8): its method is named in its BS column where it differs. BS: "
                    "'(searched)' where that batch is the method's search answer, '(search: N)' where the search "
                    "answered N and a cell ran ok at another batch, '(not searched)' where no search ran: then it is "
                    "only the largest batch measured, and no ratio is given. An FP8 cell's bf16 cell is at its own "
                    "largest batch.")
            note = ""
        parts.append(render.Part(frame=pd.DataFrame(rows, columns=head), heading="" if view == "batch" else heading,
                                 lead=lead, note=note))
    from . import catalog

    return render.Table(title=catalog.get("table", "stacks").title, long=df, parts=tuple(parts))
