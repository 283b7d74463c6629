"""The paper's findings as data (config/reference/findings.yaml), judged on any hardware.

A finding is a claim of the paper and the checks that decide it. A check compares one
metric of two selections of cells (``ratio``: a / b), of one selection (``value``), of a
selection against the best of the others (``best``: a / max of the rest), or asks whether a
selection runs at all (``runs``: 1 if ok, 0 if out of memory), and states the interval the
claim implies (``expect``: ``min``/``max``, or ``about`` with the finding's relative
``tolerance``). The engine evaluates every check per group of cells (by default platform,
model and GPU count), on our records and, the same way, on the paper's own numbers
(llmbench.report.paper_frame), and gives each group one verdict from its checks' verdicts:
``holds``, ``contradicts``, ``partly``, ``inconclusive`` or ``untestable``, as ``COMBINE``
below says (the one statement of the rule; ``combine`` applies it).

Comparisons across hardware go through per-GPU throughput, MFU and ratios of two cells of
the same platform and model, never through platform names alone; a finding that names
paper platforms (RTX4090 against RTX3090, say) is decided only where those platforms ran.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from .. import backends, techniques
from ..config import REPO_ROOT, ConfigError, available, load_yaml, validate
from . import evidence, paper_frame, scaling
from . import serving as serving_table
from . import runs as runs_rule
from . import tidy as tidy_table

VERDICTS = ("holds", "contradicts", "partly", "inconclusive", "untestable")
#: the verdicts that decide a row (the others leave it open)
DECIDED = ("holds", "contradicts", "partly")
RELATIONS = {
    "ratio": "metric(a) / metric(b)",
    "value": "metric(a)",
    "best": "metric(a) / the largest metric(x) of the other cells x of the group (among)",
    "runs": "1 if a ran (ok), 0 if it ran out of memory",
}
#: modules whose forward share is a metric (``<module>_forward_share``, ``..._forward_busy_share``)
SHARE_MODULES = ("mlp", "qkv", "rmsnorm", "rope")
#: metric -> what it is (every metric is a column of the tidy table or derived in ``derive``)
METRICS: dict[str, str] = {
    "tokens_per_s_per_gpu": "training tokens/s divided by the cell's GPUs",
    "mfu": "model FLOPs utilisation against the platform's dense bf16 peak (6N + 12Lhs)",
    "peak_mem_gb": "peak allocated GPU memory in GB (10^9 bytes; the paper's 'GB', see paper_frame.MEMORY_BASIS)",
    "scaling_efficiency": "tokens/s at n GPUs / (n / n0 x tokens/s at n0), n0 the fewest GPUs run",
    "optimizer_share": "optimizer phase / (forward + backward + optimizer) of a profiled step",
    "forward_idle_share": "1 - kernel time / wall time of the forward phase",
    "backward_idle_share": "1 - kernel time / wall time of the backward phase",
    "optimizer_idle_share": "1 - kernel time / wall time of the optimizer phase",
    "forward_gemm_share": "GEMM kernel time / wall time of the forward phase (Table XIII; as tables/profile-phases)",
    "backward_gemm_share": "GEMM kernel time / wall time of the backward phase",
    "attention_core_forward_s": "forward time of the attention core (QK^T, softmax, PV, or the fused kernel)",
    "attention_core_backward_s": "backward time of the attention core",
    "mlp_over_next_module": "forward time of the MLP / that of the next most expensive decoder module",
    **{f"{m}_forward_share": f"the {m} module's share of a profiled forward pass (Table VI, Fig. 5)"
       for m in SHARE_MODULES},
    **{f"{m}_forward_busy_share": f"the {m} module's share of the time module ranges hold in a profiled forward pass "
       "(the pass less 'other', where a host-paced step's device waits)" for m in SHARE_MODULES},
    "optimizer_s": "the optimizer phase's wall time of a profiled step (s)",
    "memcpy_share": "memory-copy kernels' share of a DeepSpeed step",
    "memcpy_s_per_iter": "memory-copy kernel time per iteration (s)",
    "comm_share": "communication kernels' share of a DeepSpeed step",
    "comm_s_per_iter": "communication kernel time per iteration (s)",
    "comm_AllReduce_share": "AllReduce kernels' share of a step",
    "best_tflops": "the best TFLOP/s a GEMM case reached",
    "best_pct_of_peak": "the best % of the platform's peak a GEMM case reached",
    "memcpy_h2d_gb_per_s": "largest pinned host-to-device copy bandwidth (GB/s)",
    "memcpy_d2h_gb_per_s": "largest pinned device-to-host copy bandwidth (GB/s)",
    "memcpy_d2h_over_h2d": "largest pinned device-to-host over host-to-device copy bandwidth",
    "gemm_large_over_small_m": "% of peak of Table XII's GEMM at its largest M over that at its smallest",
    "gemm_large_m_pct_of_peak": "% of peak of Table XII's GEMM at its largest M",
    "allgather_busbw_gb_per_s": "largest AllGather bus bandwidth (GB/s)",
    "reducescatter_busbw_gb_per_s": "largest ReduceScatter bus bandwidth (GB/s)",
    "output_tokens_per_s": "serving: output tokens/s of a load",
    "p50_e2e_latency_s": "serving: median end-to-end request latency (s)",
    "duration_s": "serving: time to complete the whole load (s)",
}
#: what names a profiled cell (its rows in the per-row profile table)
PROFILE_KEYS = tidy_table.SAMPLE_KEYS["profile"]
#: keys a selection may name (columns of the tidy table)
SELECT_KEYS = ("stage", "platform", "model", "backend", "technique", "batch_size", "gpus", "layout", "engine",
               "load", "mode", "num_requests", "input_len", "output_len", "bench", "case")
#: grouping of each stage's cells when a finding names none
DEFAULT_GROUP = {"micro": ["platform", "gpus"]}
DEFAULT_TOLERANCE = 0.25
SHOW = 3  # significant digits of a value


@dataclass(kw_only=True, slots=True, frozen=True)
class Check:
    """One comparison of a finding."""

    metric: str
    """The metric compared (a key of METRICS)."""
    relation: str
    """How (a key of RELATIONS)."""
    a: dict
    """The cells measured (merged over the finding's ``where``)."""
    b: dict | None = None
    """The cells compared with (ratio)."""
    among: dict | None = None
    """The cells ``a`` must beat (best); default: every other cell of the group."""
    lo: float | None = None
    """Smallest value that holds (None: unbounded)."""
    hi: float | None = None
    """Largest value that holds (None: unbounded)."""
    needs: dict = field(default_factory=dict)
    """What a group must have to test this check (``min_gpus``, ``why``), over the finding's."""

    def strict(self) -> tuple[bool, bool]:
        """Whether (lo, hi) exclude themselves: a bound of 1 on a ratio is strict, since a
        ratio of 1 is no change, which bears out neither "more" nor "less"."""
        rel = self.relation in ("ratio", "best")
        return rel and self.lo == 1.0, rel and self.hi == 1.0

    def label(self) -> str:
        """What the check compares, without its interval, e.g. 'peak_mem_gb Z2 / Naive'."""
        return self.describe().rsplit(" in [", 1)[0].rsplit(" >= ", 1)[0].rsplit(" <= ", 1)[0]

    def describe(self) -> str:
        """The check in words, e.g. 'peak_mem_gb Z2 / Naive in [0.43, 0.71]'."""
        a = _sel_text(self.a)
        if self.relation == "ratio":
            what = f"{self.metric} {a} / {_sel_text(self.b)}"
        elif self.relation == "best":
            what = f"{self.metric} {a} / best other" + (f" ({_sel_text(self.among)})" if self.among else "")
        elif self.relation == "runs":
            what = f"{a} runs"
        else:
            what = f"{self.metric} {a}"
        if self.relation == "runs":
            return what if self.lo == 1.0 else f"{a} runs out of memory"
        return f"{what} {interval_text(self.lo, self.hi)}"


@dataclass(kw_only=True, slots=True, frozen=True)
class Finding:
    """One claim of the paper and how it is decided."""

    id: str
    """Stable id (kebab-case)."""
    section: str
    """Where the paper makes the claim (e.g. 'I (3)', 'IV-A.3', 'Table IX')."""
    claim: str
    """The claim in one line."""
    quote: str
    """The paper's words, verbatim (a test checks them against paper.md)."""
    how: str
    """How the claim is decided and why the interval is what it is."""
    stage: str
    """The stage of the cells compared."""
    checks: tuple[Check, ...]
    """The comparisons; the verdict combines them."""
    where: dict = field(default_factory=dict)
    """Filters every selection shares."""
    group_by: tuple[str, ...] = ("platform", "model", "gpus")
    """One verdict per group of these keys."""
    platforms: dict = field(default_factory=dict)
    """Which platforms the claim is about, e.g. {gpu_memory_gib: {max: 24}}."""
    paper: dict = field(default_factory=dict)
    """Published values the paper's tables do not hold (text only): platform -> value."""
    tolerance: float = DEFAULT_TOLERANCE
    """Relative tolerance of ``about`` intervals."""
    needs: dict = field(default_factory=dict)
    """What a group must have to test the claim: ``min_gpus`` (ZeRO sharding, communication and
    data-parallel claims need several ranks) and ``why``, in words."""

    def compares(self) -> str:
        """Every check in words."""
        where = _sel_text(self.where)
        return (f"{self.stage}{' ' + where if where else ''}: " + "; ".join(c.describe() for c in self.checks))


def interval_text(lo, hi) -> str:
    """'in [a, b]', '>= a' or '<= b'."""
    if lo is not None and hi is not None:
        return f"in [{_num(lo)}, {_num(hi)}]"
    if lo is not None:
        return f">= {_num(lo)}"
    return f"<= {_num(hi)}" if hi is not None else "(any)"


def _num(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.{SHOW}g}"


def _word(v) -> str:
    """A selection's value as one word ('llama2-7b/llama2-13b' for a list)."""
    return "/".join(map(str, v)) if isinstance(v, list) else str(v)


def _sel_text(sel: dict | None) -> str:
    if not sel:
        return ""
    parts = []
    for k, v in sel.items():
        v = _word(v)
        parts.append(str(v) if k == "technique" else f"bs{v}" if k == "batch_size" else f"{k}={v}")
    return " ".join(parts)


# --- loading ----------------------------------------------------------------------------

def _canonical_selection(sel: dict, where: str) -> dict:
    out = {}
    for k, v in sel.items():
        if k not in SELECT_KEYS:
            raise ConfigError(f"{where}: unknown selection key {k!r}; allowed: {', '.join(SELECT_KEYS)}")
        if k == "technique":
            try:
                v = [techniques.canonical(t) for t in v] if isinstance(v, list) else techniques.canonical(v)
            except techniques.TechniqueError as exc:
                raise ConfigError(f"{where}: unknown technique: {exc}") from None
        if k in ("model", "platform"):
            kind = k
            for name in v if isinstance(v, list) else [v]:
                if name not in available(kind):
                    raise ConfigError(f"{where}: unknown {kind} {name!r}; allowed: {', '.join(available(kind))}")
        if k == "batch_size" and not (v == "max" or isinstance(v, int)):
            raise ConfigError(f"{where}: batch_size must be an integer or 'max', got {v!r}")
        out[k] = v
    return out


def _check(raw: dict, where: str, tolerance: float) -> Check:
    metric, relation = raw.get("metric"), raw["relation"]
    if relation not in RELATIONS:
        raise ConfigError(f"{where}: unknown relation {relation!r}; allowed: {', '.join(RELATIONS)}")
    if relation != "runs" and metric not in METRICS:
        raise ConfigError(f"{where}: unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
    if relation == "ratio" and "b" not in raw:
        raise ConfigError(f"{where}: relation 'ratio' needs b (the cells compared with)")
    exp = raw.get("expect") or {}
    if relation in ("runs", "best") and not exp:
        lo, hi = 1.0, None  # it runs (expect {max: 0}: it must not); a beats the rest
    elif "about" in exp:
        lo, hi = exp["about"] * (1 - tolerance), exp["about"] * (1 + tolerance)
    else:
        lo, hi = exp.get("min"), exp.get("max")
        if lo is None and hi is None:
            raise ConfigError(f"{where}: expect needs about, min or max")
    return Check(metric=metric or "status", relation=relation, a=_canonical_selection(raw["a"], f"{where}.a"),
                 b=_canonical_selection(raw["b"], f"{where}.b") if raw.get("b") else None,
                 among=_canonical_selection(raw["among"], f"{where}.among") if raw.get("among") else None,
                 lo=lo, hi=hi, needs=raw.get("needs") or {})


def load(path: Path | str = REPO_ROOT / "config" / "reference" / "findings.yaml") -> list[Finding]:
    """Load and validate a findings file (the paper's, or our own: ``source: ours``, no
    quotes). A bad entry raises ConfigError naming its id."""
    raw = load_yaml(Path(path))
    validate(raw, "findings", str(path))
    out, seen = [], set()
    for i, entry in enumerate(raw["findings"]):
        fid = entry["id"]
        where = f"{path}: finding {fid!r} (entry {i})"
        if fid in seen:
            raise ConfigError(f"{where}: duplicate id")
        seen.add(fid)
        tol = entry.get("tolerance", DEFAULT_TOLERANCE)
        checks = tuple(_check(c, f"{where}.checks[{j}]", tol) for j, c in enumerate(entry["checks"]))
        group_by = entry.get("group_by") or DEFAULT_GROUP.get(entry["stage"], ["platform", "model", "gpus"])
        out.append(Finding(id=fid, section=entry["section"], claim=entry["claim"], quote=entry.get("quote", ""),
                           how=entry["how"], stage=entry["stage"], checks=checks,
                           where=_canonical_selection(entry.get("where") or {}, f"{where}.where"),
                           group_by=tuple(group_by), platforms=entry.get("platforms") or {},
                           paper=entry.get("paper") or {}, tolerance=tol, needs=entry.get("needs") or {}))
    return out


# --- the facts: tidy rows with the derived metrics --------------------------------------

@cache
def _platform_facts(name: str) -> dict:
    try:
        p = paper_frame.platform_spec(name)
    except ConfigError:
        return {}
    return {"gpu_memory_gib": p.get("gpu_memory_gib"), "gpus_per_node": p.get("gpus_per_node"),
            "interconnect": p.get("interconnect", ""), "disk_gib": p.get("disk_gib")}


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """Metrics computed from other columns the same way for ours and the paper's rows."""
    df = df.copy()
    for col in ("forward", "backward", "optimizer"):
        for k in ("wall", "kernel", "gemm"):
            if f"{col}_{k}_s" not in df:
                df[f"{col}_{k}_s"] = float("nan")
    step = df["forward_wall_s"] + df["backward_wall_s"] + df["optimizer_wall_s"]
    df["optimizer_share"] = df["optimizer_wall_s"] / step
    df["optimizer_s"] = df["optimizer_wall_s"]
    for phase in ("forward", "backward", "optimizer"):
        df[f"{phase}_idle_share"] = 1 - df[f"{phase}_kernel_s"] / df[f"{phase}_wall_s"]
    for phase in ("forward", "backward"):
        df[f"{phase}_gemm_share"] = df[f"{phase}_gemm_s"] / df[f"{phase}_wall_s"]
    for m in METRICS:
        if m not in df:
            df[m] = float("nan")
    return df


def _from_profile_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per profile cell: the attention core's time per phase, the MLP's lead and the share
    modules' forward shares (of the whole forward, and of the time module ranges hold)."""
    keys = PROFILE_KEYS
    if rows is None or rows.empty or "module" not in rows:
        return pd.DataFrame(columns=keys)
    core = rows[rows["module"].isin(["attn_scores", "softmax", "attn_values", "attention_fused"])]
    out = core.pivot_table(index=keys, columns="phase", values="time_s", aggfunc="sum")
    out = out.rename(columns={p: f"attention_core_{p}_s" for p in out.columns})
    fwd = rows[(rows["phase"] == "forward") & ~rows["module"].isin(["other", "loss", "embedding"])]
    lead = []
    for key, g in fwd.groupby(keys):
        t = g.groupby("module")["time_s"].sum().sort_values(ascending=False)
        if "mlp" in t and len(t) > 1:
            nxt = t.drop("mlp").iloc[0]
            lead.append({**dict(zip(keys, key)), "mlp_over_next_module": t["mlp"] / nxt if nxt else float("nan")})
    lead = pd.DataFrame(lead, columns=keys + ["mlp_over_next_module"]).set_index(keys)
    # each module's share of the forward pass (Table VI, Fig. 5), of all the forward rows, and
    # of the rows a module range holds (less 'other': where the host paces the step, mostly
    # the device waiting for it)
    fwd_all = rows[rows["phase"] == "forward"]
    total = fwd_all.groupby(keys)["time_s"].sum()
    busy = fwd_all[fwd_all["module"] != "other"].groupby(keys)["time_s"].sum()
    times = fwd_all[fwd_all["module"].isin(SHARE_MODULES)].pivot_table(index=keys, columns="module", values="time_s",
                                                                       aggfunc="sum")
    shares = times.div(total, axis=0).rename(columns={m: f"{m}_forward_share" for m in SHARE_MODULES})
    busy_shares = times.div(busy, axis=0).rename(columns={m: f"{m}_forward_busy_share" for m in SHARE_MODULES})
    return out.join(lead, how="outer").join(shares, how="outer").join(busy_shares, how="outer").reset_index()


def profile_repeat_metrics(keys: dict, phases: dict[str, float], rows: dict[str, list]) -> dict[str, float]:
    """One profiled repeat's metrics, derived from its phase times and module rows (the
    record's summary ``repeats``) as a cell's are from the means (_from_profile_rows,
    derive): the metrics this repeat's data gives a finite value, nothing else (throughput
    and memory are the record's, not a repeat's breakdown)."""
    one = pd.DataFrame([{**keys, **phases}])
    prof = _from_profile_rows(pd.DataFrame(rows).assign(**keys))
    if len(prof):
        one = one.merge(prof, on=PROFILE_KEYS, how="left")
    got = derive(one).iloc[0]
    return {m: float(got[m]) for m in METRICS if m in got and pd.notna(got[m]) and math.isfinite(got[m])}


def _with_profile_repeats(row: pd.Series) -> str:
    """The ``kernel_runs`` (metric -> one value a repeat, llmbench.report.evidence) of a row
    with profiled repeats, the metrics of each repeat (profile_repeat_metrics) added, a metric
    kept where every repeat has it; the kernel breakdown a record already holds stands."""
    runs = json.loads(row["kernel_runs"]) if isinstance(row.get("kernel_runs"), str) and row["kernel_runs"] else {}
    keys = {k: row[k] for k in PROFILE_KEYS}
    per = [profile_repeat_metrics(keys, r["phases"], r["rows"]) for r in json.loads(row["profile_repeats"])]
    for metric in set.intersection(*(set(p) for p in per)) - set(runs):
        runs[metric] = [p[metric] for p in per]
    return json.dumps(runs, sort_keys=True)


def _from_micro_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per micro cell: the largest copy and collective bandwidths."""
    keys = ["platform", "bench", "case", "gpus"]
    if rows is None or rows.empty or "bench" not in rows:
        return pd.DataFrame(columns=keys)
    out = []
    for key, g in rows.groupby(keys):
        r = dict(zip(keys, key))
        if key[1] == "memcpy" and "direction" in g:
            pinned = g[g["pinned"].astype(bool)] if "pinned" in g else g
            for d, col in (("h2d", "memcpy_h2d_gb_per_s"), ("d2h", "memcpy_d2h_gb_per_s")):
                sel = pinned[pinned["direction"].astype(str).str.lower() == d]["gb_per_s"]
                r[col] = sel.max() if len(sel) else float("nan")
            r["memcpy_d2h_over_h2d"] = r["memcpy_d2h_gb_per_s"] / r["memcpy_h2d_gb_per_s"]
        if key[1] == "gemm" and key[2] == "table12-mlp" and "m" in g and g["m"].nunique() > 1:
            lo, hi = g.loc[g["m"].idxmin(), "pct_of_peak"], g.loc[g["m"].idxmax(), "pct_of_peak"]
            r["gemm_large_over_small_m"], r["gemm_large_m_pct_of_peak"] = hi / lo, hi
        if key[1] == "collectives" and "op" in g:
            for op, col in (("all_gather", "allgather_busbw_gb_per_s"),
                            ("reduce_scatter", "reducescatter_busbw_gb_per_s")):
                norm = g["op"].astype(str).str.lower().str.replace("_", "").str.replace("-", "")
                sel = g[norm == op.replace("_", "")]["busbw_gb_per_s"]
                r[col] = sel.max() if len(sel) else float("nan")
        out.append(r)
    return pd.DataFrame(out)


def facts(tidy: pd.DataFrame, profile_rows: pd.DataFrame | None = None,
          micro_rows: pd.DataFrame | None = None, superseded: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our records as the engine reads them: the tidy table, cells only (not search
    probes), with per-GPU throughput, memory in GB, scaling efficiency and the metrics
    read from the per-row profile and microbenchmark tables; plus the training, serving and
    profile records other runs of the same cells superseded (``superseded_by`` set), which pairing
    may take a side from (one set, one machine, several sets pooled), and each row's cell
    (``cell_id``). A superseded profile record's metrics are its own repeats' means
    (``_own_profile_means``): the profile table holds the used record's module rows only."""
    df = tidy.copy()
    if superseded is not None and len(superseded):
        extra = superseded[superseded["stage"].isin(["pretrain", "finetune", "serve", "profile"])]
        df = pd.concat([df, extra], ignore_index=True)
    df = df.copy()  # one block (the tidy table's many columns arrive fragmented)
    if "record_path" in df:
        df["cell_id"] = df["record_path"].map(lambda p: runs_rule.identity(str(p)) if isinstance(p, str) else None)
    for col in ("machine", "paired_set", "paired_round"):
        if col not in df:
            df[col] = None
    if "kind" in df:
        df = df[df["kind"].fillna("cell") == "cell"]
    if "run" not in df:
        df["run"] = "ours"
    df = tidy_table.per_gpu(df)
    # on a CPU platform the host's peak RSS is the only memory there is
    df["peak_mem_gb"] = df["peak_mem_allocated_gb"].where(df["peak_mem_allocated_gb"].notna(),
                                                          df["peak_rss_gib"] * tidy_table.GIB_TO_GB)
    eff = scaling.build(tidy[tidy.get("kind", pd.Series("cell", index=tidy.index)).fillna("cell") == "cell"]
                        if "kind" in tidy else tidy)
    if len(eff):
        eff = eff.rename(columns={"efficiency_pct": "scaling_efficiency"})[
            ["stage", "platform", "model", "backend", "technique", "batch_size", "gpus", "scaling_efficiency"]]
        eff["scaling_efficiency"] = eff["scaling_efficiency"] / 100
        # the fewest GPUs of a series are its base (efficiency 1 by definition): not a result
        base = eff.groupby(["stage", "platform", "model", "backend", "technique", "batch_size"])["gpus"].transform("min")
        eff = eff[eff["gpus"] > base]
        eff = eff.groupby(["stage", "platform", "model", "backend", "technique", "batch_size", "gpus"],
                          as_index=False).mean()
        df = df.merge(eff, on=["stage", "platform", "model", "backend", "technique", "batch_size", "gpus"],
                      how="left")
        df["scaling_efficiency_runs"] = _paired_efficiency_runs(df)
    prof = _from_profile_rows(profile_rows)
    if len(prof):
        prof = prof.assign(stage="profile")
        df = df.merge(prof, on=["stage"] + PROFILE_KEYS, how="left", suffixes=("", "_p"))
        if "superseded_by" in df:  # the used record's module rows: not a superseded record's
            df.loc[(df["stage"] == "profile") & df["superseded_by"].notna(),
                   [c for c in prof.columns if c not in ["stage"] + PROFILE_KEYS]] = float("nan")
    if "profile_repeats" in df and (has := df["profile_repeats"].map(lambda v: isinstance(v, str) and v != "")).any():
        df["kernel_runs"] = df.get("kernel_runs", pd.Series(None, index=df.index)).astype(object)
        df.loc[has, "kernel_runs"] = [_with_profile_repeats(row) for _, row in df[has].iterrows()]
    micro = _from_micro_rows(micro_rows)
    if len(micro):
        df = df.merge(micro.assign(stage="micro"), on=["stage", "platform", "bench", "case", "gpus"], how="left",
                      suffixes=("", "_m"))
    return _own_profile_means(derive(df))


def _own_profile_means(df: pd.DataFrame) -> pd.DataFrame:
    """A superseded profile record (an earlier paired set of the same cells) pairs only
    through its own repeats (``kernel_runs``): each metric its repeats give and the row lacks
    is their mean, so that sets pool their rounds (_contexts); a record without per-repeat
    breakdowns keeps only what its phase times give."""
    if "superseded_by" not in df or "kernel_runs" not in df:
        return df
    old = (df["stage"] == "profile") & df["superseded_by"].notna() & df["kernel_runs"].map(
        lambda v: isinstance(v, str) and v != "")
    for i in df.index[old]:
        for metric, vals in json.loads(df.at[i, "kernel_runs"]).items():
            if metric in METRICS and vals and (metric not in df or pd.isna(df.at[i, metric])):
                df.at[i, metric] = statistics.fmean(float(v) for v in vals)
    return df


def _paired_efficiency_runs(df: pd.DataFrame) -> pd.Series:
    """The scaling efficiency of each round (';'-joined) where a cell and its series' base
    (the fewest GPUs) ran in one paired set with as many repeats: round r's tokens/s per GPU
    over the base's in round r, so that its interval pairs the rounds as a set's ratio does
    (llmbench.report.evidence.ratio); a round whose two repeats ran on different machines (a
    set resumed on another boot) is left out. None elsewhere: the efficiency is one value."""
    out = pd.Series(None, index=df.index, dtype=object)
    if "tokens_per_s_runs" not in df:
        return out
    key = ["stage", "platform", "model", "backend", "technique", "batch_size"]
    ok = df[(df["status"] == "ok") & df["paired_set"].notna() & df["tokens_per_s_runs"].notna()]
    for i, row in ok[ok["scaling_efficiency"].notna()].iterrows():
        series = ok[(ok[key] == row[key]).all(axis=1) & (ok["paired_set"] == row["paired_set"])]
        base = series[series["gpus"] == series["gpus"].min()]
        if base.empty or base["gpus"].iloc[0] >= row["gpus"]:
            continue
        a = [float(x) / row["gpus"] for x in str(row["tokens_per_s_runs"]).split(";") if x]
        b = [float(x) / base["gpus"].iloc[0] for x in str(base["tokens_per_s_runs"].iloc[0]).split(";") if x]
        same = [p == q for p, q in zip(evidence.repeat_machines(row, len(a)), evidence.repeat_machines(base.iloc[0], len(b)))]
        if len(a) == len(b) and sum(same) >= 2 and all(v > 0 for v in a + b):  # rounds on one machine only
            out[i] = ";".join(f"{x / y:.6g}" for x, y, k in zip(a, b, same) if k)
    return out


# --- evaluation --------------------------------------------------------------------------

@dataclass(slots=True)
class Context:
    """What every check of one evaluation shares: whether values are exact (the paper's
    printed numbers) or measured (ours, llmbench.report.evidence), and the spreads."""

    exact: bool = False
    pooled: evidence.Spread = evidence.NO_SPREAD
    """Repeat-to-repeat spread a side measured once is taken to have."""
    spread: evidence.Spread | dict[str, evidence.Spread] = evidence.NO_SPREAD
    """Machine-to-machine spread a cross-machine comparison carries, by pace class
    (evidence.machine_spreads) for our records."""


PAPER = Context(exact=True)


@dataclass(slots=True)
class Outcome:
    """One check on one group."""

    estimate: evidence.Estimate | None = None
    verdict: str = "missing"
    """holds | contradicts | inconclusive | missing | out of scope"""
    missing: list = field(default_factory=list)
    runs: set = field(default_factory=set)
    protocols: set = field(default_factory=set)
    """Warm-up/measured steps/repeats of the training cells the value came from."""
    parts: list = field(default_factory=list)
    """(layout, estimate) where the check was evaluated on each of several layouts."""

    @property
    def value(self) -> float | None:
        return None if self.estimate is None else self.estimate.value


def _one_block(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with its text columns as Python objects, in one block: the engine filters small
    groups of rows thousands of times, and a filter takes every column, one pyarrow call for
    each text column of pandas' string dtype where a block of objects is one numpy take."""
    text = {c: object for c, t in df.dtypes.items() if isinstance(t, pd.StringDtype)}
    return (df.astype(text) if text else df).copy()


def _match(df: pd.DataFrame, sel: dict) -> pd.DataFrame:
    # one mask, one take: selecting key by key copied every column of the wide frame once per key
    mask = np.ones(len(df), dtype=bool)
    for k, v in sel.items():
        if k == "batch_size" and v == "max":
            continue
        if k not in df:
            return df.iloc[0:0]
        mask &= (df[k].isin(v) if isinstance(v, list) else df[k] == v).to_numpy(dtype=bool)
        if not mask.any():
            return df.iloc[0:0]
    df = df[mask] if not mask.all() else df
    if sel.get("batch_size") == "max":
        ok = df[df["status"] == "ok"]
        if len(ok):
            df = df[df["batch_size"] == ok["batch_size"].max()]
    return df


def _cell_text(stage: str, group: dict, sel: dict) -> str:
    s = {**group, **sel}
    parts = [stage, _word(s.get("platform", "any platform")), _word(s.get("model", ""))]
    for k in ("backend", "layout", "engine", "load", "mode", "bench", "case"):
        if k in s:
            parts.append(_word(s[k]))
    if "technique" in s:
        parts.append("/".join(s["technique"]) if isinstance(s["technique"], list) else s["technique"])
    for key, prefix in (("batch_size", "bs"), ("gpus", "g")):
        if key in s and s[key] is not None and not (isinstance(s[key], float) and math.isnan(s[key])):
            v = s[key]
            parts.append(f"{prefix}{int(v) if isinstance(v, float) else v}")
    return " ".join(p for p in parts if p)


def _ok_protocols(*sides: pd.DataFrame) -> set:
    """'warm-up/measured/repeats' of each ok training row of the sides a value came from (none
    for cells without a step protocol)."""
    cols = ["warmup_steps", "measured_steps", "repeats"]
    out = set()
    for rows in sides:
        if rows.empty or any(c not in rows for c in cols):
            continue
        out |= {runs_rule.steps_label(*r) for status, *r in zip(rows["status"], *(rows[c] for c in cols))
                if status == "ok" and not any(pd.isna(x) for x in r)}
    return out


def _runs(*sides: pd.DataFrame) -> set:
    """The runs the sides' rows came from."""
    return set().union(*(set(rows["run"]) for rows in sides))


def _started(rows: pd.DataFrame) -> pd.Series | str:
    """The rows' start times as sortable text ('' where unknown, or for all without the column)."""
    return rows["started"].astype(object).fillna("").astype(str) if "started" in rows else ""


def _used(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows the report uses (one record per cell, llmbench.report.runs)."""
    if "superseded_by" not in rows:
        return rows
    used = rows["superseded_by"].isna().to_numpy()
    return rows if used.all() else rows[used]


_OOM_TRIED = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB)")
_OOM_HELD = re.compile(r"([\d.]+) GiB is allocated by PyTorch")


def oom_bound_gb(row) -> float | None:
    """The least allocated peak (GB) an out-of-memory cell needed: what PyTorch held plus the
    request that failed, where its CUDA error says so; else evidence.OOM_SHARE of its GPU's
    memory for another GPU OOM; None for a host OOM (a SIGKILL, a host-RSS cap): no GPU bound."""
    reason = str(row.get("reason") or "")
    if "CUDA out of memory" in reason or "OutOfMemoryError" in reason:
        tried, held = _OOM_TRIED.search(reason), _OOM_HELD.search(reason)
        if tried and held:
            req = float(tried.group(1)) / (1024 if tried.group(2) == "MiB" else 1)
            return (float(held.group(1)) + req) * evidence.GIB_TO_GB
    if "out of memory" in reason.lower() and "SIGKILL" not in reason and "host" not in reason.lower():
        cap = _platform_facts(str(row.get("platform") or "")).get("gpu_memory_gib")
        return cap * evidence.OOM_SHARE * evidence.GIB_TO_GB if cap else None
    return None


def _side(rows: pd.DataFrame, metric: str, ctx: Context) -> evidence.Side | None:
    """One side from the records of one context (a set, a machine, or the used ones): the
    metric per repeat of each (several cells, such as a serving load's bursts, pool their
    values); an out-of-memory memory side is a lower bound."""
    if rows.empty:
        return None
    # the ok rows with a value, masked on numpy arrays: sides are asked for thousands of times
    has = pd.notna(rows[metric].to_numpy()) if metric in rows else np.zeros(len(rows), dtype=bool)
    keep = (rows["status"].to_numpy() == "ok") & has
    if not keep.any():
        if metric in evidence.EXACT:
            bounds = [b for b in (oom_bound_gb(r) for _, r in rows[rows["status"] == "oom"].iterrows()) if b]
            if bounds:
                r = rows.iloc[0]
                return evidence.Side([math.log(min(bounds))], machine=str(r.get("machine") or ""),
                                     run=str(r.get("run") or ""), exact=True, lower_bound=True)
        return None
    ok = rows if keep.all() else rows[keep]
    exact = ctx.exact or metric in evidence.EXACT  # the paper's number, or a deterministic peak
    logs, rounds, each, sets = [], [], [], []
    for _, r in ok.iterrows():
        vals = [float(r[metric])] if exact else [v for v in evidence.repeat_values(r, metric) if v > 0]
        logs += [math.log(v) for v in vals if v > 0]
        rounds += evidence.round_keys(r, len(vals))
        sets += [str(r.get("paired_set"))] * len(vals)
        each.append(r)
    if not logs:
        return None
    r = each[0]
    machines = {str(x["machine"]) for x in each if pd.notna(x["machine"])} if "machine" in ok else set()
    # several paired sets pooled (_contexts): each set's rounds are its own
    pooled = "paired_set" in ok and ok["paired_set"].notna().all() and ok["paired_set"].nunique() > 1
    if len(ok) > 1:  # several cells pooled (a serving point's bursts): their rounds, where a set ran them
        known = [x["paired_round"] for x in each] if "paired_round" in ok else []
        where = [x["machine"] for x in each] if "machine" in ok else [""] * len(known)
        if known and all(x == x and x is not None for x in known) and len(known) == len(logs):
            rounds = [(int(x), str(m)) for x, m in zip(known, where)]
        elif not (pooled and ok["paired_set"].is_unique):  # one cell's record per set keeps its repeats' rounds
            rounds = []
    if pooled and len(rounds) == len(sets):
        rounds = [((s, i), m) for (i, m), s in zip(rounds, sets)]
    paired_rounds = (metric == "scaling_efficiency" and len(ok) == 1 and not ctx.exact
                     and isinstance(r.get("scaling_efficiency_runs"), str))
    paired_set = "+".join(sorted(set(sets))) if pooled else r.get("paired_set")
    paces = {evidence.pace_of(x) for x in each}
    return evidence.Side(logs, machine="+".join(sorted(machines)), paired_set=paired_set,
                         run=str(r.get("run") or ""), exact=ctx.exact or metric in evidence.EXACT,
                         rounds=rounds, noisy=metric in evidence.NOISY, paired_rounds=paired_rounds,
                         pace=paces.pop() if len(paces) == 1 else "")


def _disagreeing(rows: pd.DataFrame, used: pd.DataFrame, metric: str, ctx: Context, check: Check,
                 verdict: str) -> str | None:
    """Of a value check's one cell (the record the report uses, ``used``), another record on
    another machine whose repeats measure alike (_per_repeat) and that decides the check the
    other way: said in words (the check is then inconclusive: the machines disagree), else
    None. A record that decides nothing does not weigh against the used one's stronger or
    later protocol."""
    if len(used) != 1 or "cell_id" not in rows or "machine" not in rows:
        return None
    u = used.iloc[0]
    others = rows[(rows["cell_id"] == u["cell_id"]) & rows["superseded_by"].notna() & (rows["status"] == "ok")
                  & (rows["machine"].astype(str) != str(u["machine"]))]
    alike = _per_repeat(used)
    for _, o in others.iterrows():
        one = others.loc[[o.name]]
        if _per_repeat(one) != alike or (side := _side(one, metric, ctx)) is None:
            continue
        est = evidence.value(side, ctx.pooled)
        if {verdict, evidence.judge(est, check.lo, check.hi, *check.strict())} == {"holds", "contradicts"}:
            return f"the record of run {o['run']} on another machine gives {est.text()}: the machines disagree"
    return None


def _contexts(a: pd.DataFrame, b: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """Where both sides can come from, strongest pairing first: paired sets, one machine,
    then the records the report uses (two machines, or one by chance). Where several sets
    hold both sides and their repeats measure alike (``_per_repeat``: the strongest set's
    warm-up and measured steps, sequence and engine versions, however many rounds each ran),
    they come first pooled (pairing ``sets``), each set's rounds its own (a round pairs two
    cells on one machine; the sets' spread of the ratio goes into its interval), then one set
    at a time. A set is its name: a recipe run again under it (after a fix, say) is one set
    whose later records replace the earlier ones (``_best_per_cell``), never pooled with
    them. Made as they are asked for: the first with both sides ends the search (``_pair``)."""
    for key, pairing in (("paired_set", "set"), ("machine", "machine")):
        if key not in a or key not in b:
            continue
        common = {str(x) for x in a[key].dropna()} & {str(x) for x in b[key].dropna()}
        common = {c for c in common if c and "+" not in c}
        if not common:
            continue
        ka, kb = a[key].astype(object), b[key].astype(object)
        sides = {c: (_best_per_cell(a[ka == c]), _best_per_cell(b[kb == c])) for c in common}
        # the strongest protocol of the two sides first, then the later run (the latest start
        # among the context's records), as for a cell's records (llmbench.report.runs)
        strength = {c: _strength(sides[c][0]) + _strength(sides[c][1]) for c in common}
        order = sorted(sorted(common), key=lambda c: _latest(*sides[c]), reverse=True)
        order = sorted(order, key=lambda c: -strength[c])
        if pairing == "set":
            alike = _per_repeat(*sides[order[0]])
            pool = [c for c in order if _per_repeat(*sides[c]) == alike]
            if len(pool) > 1:
                yield "sets", *(pd.concat([sides[c][k] for c in pool]) for k in (0, 1))
        for c in order:
            yield pairing, *sides[c]
    ua, ub = _used(a), _used(b)
    same = ("machine" in ua and "machine" in ub and len(ua) and len(ub)
            and ua["machine"].notna().all() and ub["machine"].notna().all()
            and set(ua["machine"]) == set(ub["machine"])
            and ua["machine"].nunique() == 1 and "+" not in str(ua["machine"].iloc[0]))
    yield "machine" if same else "machines", ua, ub


#: what one repeat (a training process, a serving run) of a set measures; sets that agree on
#: all of it pool their rounds (_contexts)
PER_REPEAT = ("warmup_steps", "measured_steps", "seq_len", "engine_version")


def _per_repeat(*sides: pd.DataFrame) -> frozenset:
    """What one repeat of the sides' ok records measures (PER_REPEAT's columns, as far as the
    rows have them); the number of repeats is not part of it."""
    out: set = set()
    for rows in sides:
        ok = rows[rows["status"] == "ok"] if "status" in rows else rows
        cols = [c for c in PER_REPEAT if c in ok]
        out |= {tuple((c, None if pd.isna(v) else v) for c, v in zip(cols, vals))
                for vals in zip(*(ok[c] for c in cols))}
    return frozenset(out)


def _latest(*sides: pd.DataFrame) -> str:
    """The latest start (UTC, ISO 8601) among the records of the sides; '' where none is known."""
    times = [str(t) for s in sides if "started" in s for t in s["started"].dropna() if str(t)]
    return max(times, default="")


def _strengths(rows: pd.DataFrame) -> pd.Series:
    """Each row's protocol strength, measured steps x repeats (llmbench.report.runs' rule); 0 unknown."""
    if "measured_steps" not in rows or "repeats" not in rows:
        return pd.Series(0, index=rows.index)
    return rows["measured_steps"].fillna(0) * rows["repeats"].fillna(0)


def _strength(rows: pd.DataFrame) -> int:
    """The strongest protocol among the rows."""
    return int(_strengths(rows).max()) if len(rows) else 0


def _best_per_cell(rows: pd.DataFrame) -> pd.DataFrame:
    """Of several records of one cell in one context (a set run again under its name, one
    machine), the one with a result, then the one the report uses (not superseded), then the
    strongest protocol, then the later start."""
    if "cell_id" not in rows or rows["cell_id"].is_unique:
        return rows
    key = rows.assign(_ok=rows["status"].isin(runs_rule.RESULTS), _s=_strengths(rows),
                      _u=rows["superseded_by"].isna() if "superseded_by" in rows else True,
                      _t=_started(rows))
    key = key.sort_values(["_ok", "_u", "_s", "_t"], ascending=False, kind="stable")
    return rows.loc[key.drop_duplicates("cell_id").index]


def _pair(a: pd.DataFrame, b: pd.DataFrame, metric: str, ctx: Context
          ) -> tuple[evidence.Estimate | None, pd.DataFrame, pd.DataFrame]:
    """a / b from the strongest pairing that has both sides (module docstring of evidence),
    with the rows of each side it took (where none has both: the used ones)."""
    for pairing, ra, rb in _contexts(a, b):
        sa, sb = _side(ra, metric, ctx), _side(rb, metric, ctx)
        if sa is None or sb is None or (sa.lower_bound and sb.lower_bound):
            continue  # two out-of-memory cells bound nothing between them
        pooled = pairing == "sets"
        if pooled:
            pairing = "set"
        if pairing == "set" and sa.paired_set != sb.paired_set:
            pairing = "machine"
        est = evidence.ratio(sa, sb, "exact" if ctx.exact else pairing, ctx.pooled, ctx.spread)
        if pooled and est.pairing != "set":
            continue  # the pooled sets paired no rounds (a side missing in one): one set at a time
        return est, ra, rb
    return None, ra, rb  # the last context's: the used rows


def _why_missing(rows: pd.DataFrame, metric: str, cell: str, spec: dict, group: dict) -> tuple:
    if rows.empty:
        need = spec.get("gpus")
        have = _platform_facts(group.get("platform", "")).get("gpus_per_node") if "platform" in group else None
        why = f"needs {need} GPUs, the platform has {have}" if need and have and need > have else "not run"
        return (cell, why, spec)
    used = _used(rows)
    ok = used[used["status"] == "ok"]
    if ok.empty:
        st = sorted(set(used["status"].astype(str)))
        if st == ["oom"] and metric in evidence.EXACT:
            return (cell, "out of memory (host, or no bound on its GPU peak)", spec)
        return (cell, "out of memory" if st == ["oom"] else "status " + "/".join(st), spec)
    return (cell, f"{metric} not measured", spec)


def _scope(check: Check, f: Finding, group: dict) -> str | None:
    """Why the group cannot test the check (the claim's ``needs``), or None."""
    needs = {**f.needs, **check.needs}
    least = needs.get("min_gpus")
    gpus = group.get("gpus")
    if least and gpus is not None and gpus == gpus and int(gpus) < int(least):
        return f"needs >= {least} GPUs ({needs.get('why', 'the claim is about several ranks')})"
    return None


def _layouts(check: Check, finding: Finding, grp: pd.DataFrame) -> list[str]:
    """The parallel layouts (Megatron-LM's) among the cells the check reads in a group where
    there are several, else none (nothing to evaluate apart); a group with fewer than two is
    not matched at all."""
    if "layout" not in grp or len({str(v) for v in grp["layout"].dropna() if str(v)}) < 2:
        return []
    found = {str(v) for sel in (check.a, check.b) if sel is not None
             for v in _match(grp, {**finding.where, **sel})["layout"].dropna() if str(v)}
    return sorted(found) if len(found) >= 2 else []


def _techniques(check: Check, finding: Finding, grp: pd.DataFrame) -> list[str]:
    """The techniques a value check reads in a group where its selection names several (a
    claim about 'a DeepSpeed offload step', judged on Z2+O and Z3+O)."""
    if check.relation != "value" or not isinstance({**finding.where, **check.a}.get("technique"), list):
        return []
    rows = _used(_match(grp, {**finding.where, **check.a}))
    if "technique" not in rows or check.metric not in rows:
        return []
    rows = rows[(rows["status"] == "ok") & rows[check.metric].notna()]
    return sorted({str(v) for v in rows["technique"].dropna()})


def evaluate_check(check: Check, finding: Finding, grp: pd.DataFrame, group: dict,
                   ctx: Context = PAPER) -> Outcome:
    """One check on one group of cells. Cells of several parallel layouts (Megatron-LM's DP2
    with its distributed optimizer beside TP2), or of several techniques where a value check
    names a list of them, are never averaged: the check is evaluated on each layout (with the
    cells that have none) or technique, holds where every one holds, contradicts where every
    one contradicts, and is inconclusive otherwise."""
    layouts = _layouts(check, finding, grp)
    if len(layouts) >= 2:
        plain = grp["layout"].isna() | (grp["layout"].astype(object) == "")
        parts = [(lay, _evaluate_one(check, finding, grp[plain | (grp["layout"].astype(object) == lay)], group,
                                     ctx)) for lay in layouts]
    elif len(techs := _techniques(check, finding, grp)) >= 2:
        parts = [(t, _evaluate_one(check, finding, grp[grp["technique"].astype(object) == t], group, ctx))
                 for t in techs]
    else:
        return _evaluate_one(check, finding, grp, group, ctx)
    verdicts = {o.verdict for _, o in parts}
    verdict = (verdicts.pop() if len(verdicts) == 1 else
               "inconclusive" if verdicts & {"holds", "contradicts", "inconclusive"} else "missing")
    first = next((o for _, o in parts if o.estimate is not None), parts[0][1])
    return Outcome(first.estimate, verdict, [m for _, o in parts for m in o.missing],
                   set().union(*(o.runs for _, o in parts)), set().union(*(o.protocols for _, o in parts)),
                   parts=[(lay, o.estimate) for lay, o in parts])


def _evaluate_one(check: Check, finding: Finding, grp: pd.DataFrame, group: dict,
                  ctx: Context = PAPER) -> Outcome:
    """One check on one group of cells of at most one parallel layout."""
    sel_a = {**finding.where, **check.a}
    spec_a = {"stage": finding.stage, **group, **sel_a}
    cell_a = _cell_text(finding.stage, group, sel_a)
    if (why := _scope(check, finding, group)) is not None:
        return Outcome(None, "out of scope", [(cell_a, why, spec_a)])
    rows_a = _match(grp, sel_a)
    if check.relation == "runs":
        used = _used(rows_a)
        if (used["status"] == "ok").any():
            v = 1.0
        elif (used["status"] == "oom").any():
            v = 0.0
        else:
            why = "not run" if used.empty else "status " + "/".join(sorted(set(used["status"].astype(str))))
            return Outcome(None, "missing", [(cell_a, why, spec_a)], set(used["run"]) if len(used) else set())
        est = evidence.Estimate(v, v, v, "1", "exact", "ran" if v else "out of memory")
        return Outcome(est, evidence.judge(est, check.lo, check.hi), [], set(used["run"]))
    metric = check.metric
    if check.relation == "value":
        used = _used(rows_a)
        side = _side(_best_per_cell(used), metric, ctx)
        if side is None:
            return Outcome(None, "missing", [_why_missing(rows_a, metric, cell_a, spec_a, group)],
                           set(used["run"]) if len(rows_a) else set())
        est = evidence.value(side, ctx.pooled)
        verdict = evidence.judge(est, check.lo, check.hi, *check.strict())
        if verdict in ("holds", "contradicts") and (other := _disagreeing(rows_a, used, metric, ctx, check, verdict)):
            est = replace(est, method=f"{est.method}; {other}")
            verdict = "inconclusive"
        return Outcome(est, verdict, [], set(used["run"]), _ok_protocols(used))
    if check.relation == "ratio":
        sel_b = {**finding.where, **check.b}
        spec_b = {"stage": finding.stage, **group, **sel_b}
        rows_b = _match(grp, sel_b)
        if len(rows_a) and len(rows_a) == len(rows_b) \
                and rows_a.reset_index(drop=True).equals(rows_b.reset_index(drop=True)):
            # 'max' resolved to the other side's own cells (batch 1 is the largest measured):
            # a cell over itself is no evidence
            return Outcome(None, "missing", [(cell_a, "no larger batch measured than the other side's",
                                              spec_a)], set(_used(rows_a)["run"]))
        est, ra, rb = _pair(rows_a, rows_b, metric, ctx)
        if est is None:  # ra, rb: the used rows
            miss = []
            if _side(ra, metric, ctx) is None:
                miss.append(_why_missing(rows_a, metric, cell_a, spec_a, group))
            if _side(rb, metric, ctx) is None:
                miss.append(_why_missing(rows_b, metric, _cell_text(finding.stage, group, sel_b), spec_b, group))
            return Outcome(None, "missing", miss, _runs(ra, rb))
        return Outcome(est, evidence.judge(est, check.lo, check.hi, *check.strict()), [], _runs(ra, rb),
                       _ok_protocols(ra, rb))
    # best: a against every other cell of the group; the claim holds where a beats each
    among_sel = {**finding.where, **(check.among or {})}
    among = _match(grp, among_sel)
    others = among.drop(index=_match(among, sel_a).index)
    by = [k for k in ("technique", "backend", "engine", "case", "batch_size") if k in others]
    worst, verdicts, runs, protos = None, [], set(), set()
    side_a = _side(_used(rows_a), metric, ctx)
    if side_a is not None:
        for _, x in others.groupby(by, dropna=False):
            if _side(_used(x), metric, ctx) is None:
                continue
            est, ra, rb = _pair(rows_a, x, metric, ctx)
            if est is None:
                continue
            verdicts.append(evidence.judge(est, check.lo, check.hi, *check.strict()))
            runs |= _runs(ra, rb)
            protos |= _ok_protocols(ra, rb)
            if worst is None or (est.value or 0) < (worst.value or 0):
                worst = est
    if worst is None:
        miss = []
        if side_a is None:
            miss.append(_why_missing(rows_a, metric, cell_a, spec_a, group))
        else:
            miss.append((_cell_text(finding.stage, group, among_sel), "no other cell to compare with",
                         {"stage": finding.stage, **group, **among_sel}))
        return Outcome(None, "missing", miss, runs)
    verdict = ("contradicts" if "contradicts" in verdicts else
               "holds" if set(verdicts) == {"holds"} else "inconclusive")
    return Outcome(worst, verdict, [], runs, protos)


#: how a group's checks combine into its verdict (README, Definitions; tested)
COMBINE = {
    "holds": "every check holds (its whole interval inside the claim's)",
    "contradicts": "every check contradicts (its whole interval outside the claim's)",
    "partly": "checks decided both ways: some hold, some contradict",
    "inconclusive": "some check has a value, but not every check is decided (an interval across the claim's "
                    "bound, or a check without data beside decided ones)",
    "untestable": "no check has a value here (not run, out of memory, or outside the claim's scope)",
}


def combine(verdicts: list[str]) -> str:
    """One verdict from the checks' (holds / contradicts / inconclusive / missing / out of
    scope), as COMBINE says."""
    s = set(verdicts)
    if not s & {"holds", "contradicts", "inconclusive"}:
        return "untestable"
    if {"holds", "contradicts"} <= s:
        return "partly"
    if s == {"holds"}:
        return "holds"
    if s == {"contradicts"}:
        return "contradicts"
    return "inconclusive"


def platform_ok(f: Finding, platform: str) -> bool:
    """Whether a platform is one the finding is about (its ``platforms`` filter: bounds on a
    number such as gpu_memory_gib, or a word its interconnect names)."""
    facts = _platform_facts(platform)
    for attr, want in f.platforms.items():
        have = facts.get(attr)
        if isinstance(want, str):
            if want.lower() not in str(have or "").lower() or "disabled" in str(have or "").lower():
                return False
        elif have is None or have < want.get("min", -math.inf) or have > want.get("max", math.inf):
            return False
    return True


PAPER_METHOD_STAGES = ("pretrain", "finetune")
"""Stages whose findings, naming no backend, are about the paper's methods."""


def _names_backend(f: Finding) -> bool:
    return "backend" in f.where or any("backend" in sel for c in f.checks for sel in (c.a, c.b, c.among) if sel)


def _candidates(df: pd.DataFrame, f: Finding) -> pd.DataFrame:
    df = df[df["stage"] == f.stage] if "stage" in df else df.iloc[0:0]
    for k in ("model", "platform", "backend"):
        v = f.where.get(k)
        if v is not None and all(k not in c.a and k not in (c.b or {}) for c in f.checks):
            df = df[df[k].isin(v) if isinstance(v, list) else df[k] == v]
    if f.stage in PAPER_METHOD_STAGES and not _names_backend(f) and "backend" in df:
        # a claim about the paper's methods reads the backends that run them (DeepSpeed), not
        # another framework's cell of the same technique name (an FSDP2 L beside DeepSpeed's L)
        df = df[df["backend"].isin(list(backends.method_backends()))]
    if f.platforms:
        df = df[df["platform"].map(lambda p: platform_ok(f, p))]
    if f.stage == "serve" and "warm_engine" in df:
        # the paper's runs start an engine each: a load served by an engine that had served
        # others before (a shared engine's, llmbench.serve.bench.EngineSession) is not one
        df = df[df["warm_engine"].map(lambda v: v is not True and v != 1)]
    return df


def _groups(df: pd.DataFrame, f: Finding) -> list[tuple[dict, pd.DataFrame]]:
    keys = [k for k in f.group_by if k in df]
    if df.empty:
        return []
    return [(dict(zip(keys, k if isinstance(k, tuple) else (k,))), g)
            for k, g in df.groupby(keys, dropna=False, sort=True)]


def _relevant(f: Finding, grp: pd.DataFrame) -> bool:
    """Whether any selection of the finding picks a cell of the group (else the group has
    nothing to say about it: a profile of another technique, say)."""
    for c in f.checks:
        for sel in (c.a, c.b, c.among):
            if sel is not None and len(_match(grp, {**f.where, **sel})):
                return True
    return False


def evaluate_finding(f: Finding, frame: pd.DataFrame, ctx: Context = PAPER) -> list[dict]:
    """Per group: the checks' values, verdicts and missing cells, and whether the group
    has any cell the finding names."""
    out = []
    for group, grp in _groups(_candidates(frame, f), f):
        outcomes = [evaluate_check(c, f, grp, group, ctx) for c in f.checks]
        out.append({"group": group, "outcomes": outcomes, "verdict": combine([o.verdict for o in outcomes]),
                    "relevant": _relevant(f, grp)})
    return out


def _empty_result(f: Finding, frame_columns: list[str], group: dict) -> dict:
    empty = pd.DataFrame(columns=frame_columns)
    outcomes = [evaluate_check(c, f, empty, group) for c in f.checks]
    return {"group": group, "outcomes": outcomes, "verdict": "untestable", "relevant": False}


def _values_text(outcomes: list[Outcome]) -> str:
    """The paper's values: one number per check ('n/a' where it printed none)."""
    return ", ".join("n/a" if o.estimate is None else o.estimate.text() for o in outcomes)


def _ours_text(f: Finding, outcomes: list[Outcome]) -> str:
    """Each check in words with its value and 95 % interval: 'peak_mem_gb Z2 / Naive: 0.553 (exact)'."""
    parts = []
    for c, o in zip(f.checks, outcomes):
        if o.parts:
            parts.append(f"{c.label()}: " + ", ".join(f"{lay} {'n/a' if e is None else e.text()}"
                                                      for lay, e in o.parts))
        elif o.estimate is None:
            parts.append(f"{c.label()}: {'out of scope' if o.verdict == 'out of scope' else 'n/a'}")
        else:
            parts.append(f"{c.label()}: {o.estimate.text()}")
    return "; ".join(parts)


def _pairing(outcomes: list[Outcome]) -> str:
    """The weakest pairing of the row's decided values (evidence.PAIRINGS order; exact last)."""
    have = [o.estimate.pairing for o in outcomes if o.estimate is not None]
    noisy = [p for p in have if p != "exact"]
    if not have:
        return ""
    return max(noisy, key=evidence.PAIRINGS.index) if noisy else "exact"


def _paper_text(f: Finding, paper_results: list[dict], model) -> tuple[str, str]:
    """The paper's value of the comparison on each paper platform (of the row's model),
    and whether the paper's own numbers bear the claim out."""
    vals, checks = [], []
    for r in paper_results:
        g = r["group"]
        if model is not None and "model" in g and g["model"] != model:
            continue
        label = g.get("platform") or "paper"
        if "model" in g and model is None:
            label += f" {g['model']}"
        if all(o.value is None for o in r["outcomes"]):
            continue  # the paper printed nothing this comparison can use on that platform
        vals.append(f"{label} {_values_text(r['outcomes'])}")
        checks.append(f"{label} {r['verdict']}")
    for plat, v in f.paper.items():
        vals.append(f"{plat} {v}" + ("" if "(" in str(v) else " (text)"))
    return "; ".join(vals), "; ".join(checks)


def spread_text(spread: evidence.Spread | dict[str, evidence.Spread]) -> str:
    """The machine spread as the findings table states it: every cell's, then each pace
    class's where it has one of its own (evidence.machine_spreads)."""
    by = spread if isinstance(spread, dict) else {"": spread}

    def one(s: evidence.Spread) -> str:
        what = f"{s.cells} cells measured on several machines, {s.df:.0f} df"
        if not s.sd:  # the between-machine variance less the repeats' came out at or below 0
            return f"{s.pct()} (their machines differ no more than their repeats explain: {what})"
        return f"{s.pct()} (log-scale sd from {what})"

    if not by[""].df:
        return "none measured"
    text = one(by[""])
    names = {"host": "host-paced cells (batch 1, CPU offload)",
             "gpu": f"GPU-paced cells (batch {evidence.GPU_PACED_BATCH} and up, no offload)"}
    own = [f"{names[k]} {one(v)}" for k, v in by.items() if k and v != by[""]]
    return text + ("; by pace: " + "; ".join(own) if own else "")


def context(ours: pd.DataFrame) -> Context:
    """Our records' spreads: repeat-to-repeat (pooled) and machine-to-machine."""
    return Context(exact=False, pooled=evidence.pooled_cv(ours), spread=evidence.machine_spreads(ours))


def _engines(rows: pd.DataFrame) -> str:
    if "engine_version" not in rows or rows.empty:
        return ""
    got = rows[["engine", "engine_version"]].dropna(subset=["engine"]).drop_duplicates()
    return ", ".join(f"{e} {v}" if isinstance(v, str) and v else f"{e} (version not recorded)"
                     for e, v in sorted(got.itertuples(index=False), key=lambda t: str(t[0])))


def evaluate(findings: list[Finding], ours: pd.DataFrame, paper: pd.DataFrame,
             ctx: Context | None = None, judged: dict[str, list[dict]] | None = None) -> pd.DataFrame:
    """The findings table: one row per finding and group of our cells (one untestable row
    when none of our cells can speak to it), with the paper's values beside ours.
    ``judged``: evaluate_finding's groups of ours by finding id, where the caller has them
    (None: judged here)."""
    ctx = ctx or context(ours)
    ours, paper = _one_block(ours), _one_block(paper)
    rows, checks = [], []
    for f in findings:
        mine = judged[f.id] if judged is not None else evaluate_finding(f, ours, ctx)
        theirs = evaluate_finding(f, paper, PAPER)
        # one verdict per (platform, model): a GPU count that cannot decide the finding is
        # dropped where another count of the same platform and model can
        by_pm: dict[tuple, list[dict]] = {}
        for r in (r for r in mine if r["relevant"]):
            by_pm.setdefault((r["group"].get("platform"), r["group"].get("model")), []).append(r)
        kept = []
        for rs in by_pm.values():
            decided = [r for r in rs if r["verdict"] != "untestable"]
            kept += decided or [max(rs, key=lambda r: r["group"].get("gpus") or 0)]
        if not kept:
            kept = [_empty_result(f, list(ours.columns), {})]
        for r in kept:
            g = r["group"]
            outcomes = r["outcomes"]
            paper_value, paper_check = _paper_text(f, theirs, g.get("model", f.where.get("model")))
            missing = [_missing_text(cell, why, spec) for o in outcomes for cell, why, spec in o.missing]
            ests = [o.estimate for o in outcomes if o.estimate is not None]
            grp_rows = _match(_candidates(ours, f), g) if f.stage == "serve" else ours.iloc[0:0]
            for i, (c, o) in enumerate(zip(f.checks, outcomes)):
                for layout, e in (o.parts or [("", o.estimate)]):
                    checks.append({
                        "finding": f.id, "platform": g.get("platform", "-"),
                        "model": _word(g.get("model", f.where.get("model", "-"))), "gpus": g.get("gpus"),
                        "check": i, "compares": c.label(), "layout": layout, "row_verdict": r["verdict"],
                        "verdict": o.verdict, "value": None if e is None else e.value,
                        "lo": None if e is None else e.lo, "hi": None if e is None else e.hi,
                        "claim_lo": c.lo, "claim_hi": c.hi, "n": "" if e is None else e.n,
                        "pairing": "" if e is None else e.pairing, "method": "" if e is None else e.method})
            rows.append({
                "finding": f.id, "section": f.section, "claim": f.claim, "compares": f.compares(),
                "platform": g.get("platform", "-"), "model": _word(g.get("model", f.where.get("model", "-"))),
                "gpus": g.get("gpus"), "batch_size": g.get("batch_size"),
                "verdict": r["verdict"], "checks": ", ".join(o.verdict for o in outcomes),
                "ours_value": _ours_text(f, outcomes),
                "n": "; ".join(e.n for e in ests), "pairing": _pairing(outcomes),
                "machines": ", ".join(sorted({m for e in ests for m in e.machines})),
                "method": "; ".join(dict.fromkeys(e.method for e in ests)),
                "paper_value": paper_value, "paper_check": paper_check,
                "tolerance": "; ".join(
                    interval_text(c.lo, c.hi) if c.relation != "runs" else "runs" if c.lo == 1.0 else "out of memory"
                    for c in f.checks),
                "missing": "; ".join(dict.fromkeys(missing)) if r["verdict"] != "holds" else "",
                "runs": ", ".join(sorted(set().union(*(o.runs for o in outcomes)) - {"paper"})),
                "protocols": ", ".join(sorted(set().union(*(o.protocols for o in outcomes)),
                                              key=lambda p: (-runs_rule.label_strength(p), p))),
                "engines": _engines(grp_rows),
                "how": f.how,
            })
    table = pd.DataFrame(rows, columns=COLUMNS)
    table.attrs["checks"] = pd.DataFrame(checks, columns=CHECK_COLUMNS)
    return table


#: tables/findings-checks.csv: one row per check of each findings row (per layout where a check
#: was judged on several), its value and 95 % interval beside the claim's bounds, as numbers
CHECK_COLUMNS = ["finding", "platform", "model", "gpus", "check", "compares", "layout", "row_verdict", "verdict",
                 "value", "lo", "hi", "claim_lo", "claim_hi", "n", "pairing", "method"]


def checks_table(table: pd.DataFrame) -> pd.DataFrame:
    """The findings' checks as numbers (CHECK_COLUMNS), which ``evaluate`` keeps beside its table."""
    return table.attrs.get("checks", pd.DataFrame(columns=CHECK_COLUMNS))


COLUMNS = ["finding", "section", "claim", "compares", "platform", "model", "gpus", "batch_size", "verdict", "checks",
           "ours_value", "n", "pairing", "machines", "method", "paper_value", "paper_check", "tolerance", "missing",
           "runs", "protocols", "engines", "how"]


#: Engines no longer maintained upstream (the serving table's LEGACY, which says why): kept
#: runnable and judged where they ran, never ranked as a cell worth GPU time.
LEGACY_ENGINES = tuple(serving_table.LEGACY)
#: The paper's models, for ranking cells a finding names without a model.
PAPER_MODELS = ("llama2-7b", "llama2-13b", "llama2-70b")


@cache
def _model_spec(name: str):
    """config/models/<name>.yaml, read once: the notes on cells ask for a few models many times."""
    from ..models import ModelSpec

    return ModelSpec.load(name)


#: The share of a GPU's memory a serving engine takes by default (vLLM's
#: ``--gpu-memory-utilization`` 0.9; SGLang's static fraction is lower on large GPUs): weights
#: that fill it leave no KV cache, so the engine cannot serve.
SERVE_MEMORY_SHARE = 0.9


def _fit_note(spec: dict) -> str:
    """'' where the cell may fit its GPU, else why it cannot: a training cell's model states
    alone; a serving cell's bf16 weights per GPU (tensor parallel over its GPUs) against an
    engine's share of the GPU (SERVE_MEMORY_SHARE), then, for an engine that reads its
    weights from a model folder, the folder against the platform's disk (disk_gib)."""
    from .. import memory
    from ..serve import engines, model_dir

    tech, model, plat = spec.get("technique"), spec.get("model"), spec.get("platform")
    cap = _platform_facts(plat).get("gpu_memory_gib") if plat else None
    if not isinstance(model, str) or not model or not cap:  # a list of models has no one model file
        return ""
    try:
        spec_model = _model_spec(model)
        # a cell without a GPU count (a paper platform's) ran on its platform's node
        gpus = spec.get("gpus") or _platform_facts(plat).get("gpus_per_node") or 1
        if spec.get("stage") == "serve":
            need = spec_model.param_counts()["total"] * model_dir.WEIGHT_BYTES / model_dir.GIB / int(gpus)
            share = cap * SERVE_MEMORY_SHARE
            if need > share:
                return (f"cannot fit: bf16 weights {need:.0f} GiB a GPU over {int(gpus)} > {share:.0f} GiB, "
                        f"an engine's {SERVE_MEMORY_SHARE * 100:.0f} % of {cap:g} GiB, with no room for its KV cache")
            engine, disk = engines.ENGINES.get(spec.get("engine")), _platform_facts(plat).get("disk_gib")
            folder = model_dir.folder_bytes(spec_model) / model_dir.GIB
            # vLLM and SGLang can make their own weights (serve weights: dummy); the others read a folder
            if engine is not None and not engine.dummy_weights and disk and folder > disk:
                return (f"cannot fit: its model folder (random bf16 weights) {folder:.0f} GiB > the {disk:g} GiB "
                        f"of disk the platform's nodes have (disk_gib); {engine.name} reads its weights from it")
            return ""
        if spec.get("stage") not in ("pretrain", "finetune") or not isinstance(tech, str):
            return ""
        need, what = memory.model_states_gib(spec_model, tech, int(gpus)), f"model states on {int(gpus)} GPU(s)"
    except (ConfigError, techniques.TechniqueError):
        return ""
    return f"cannot fit: {what} {need:.0f} GiB > {cap:g} GiB" if need > cap else ""


def _predicted_note(spec: dict) -> str:
    """'' unless the memory model (with its margin, llmbench.report.advice.predicted) says a
    training cell at batch 1 on a stated GPU count does not fit under its backend (DeepSpeed
    where the spec names none), then why."""
    from .advice import predicted

    if spec.get("stage") not in ("pretrain", "finetune") or spec.get("batch_size") != 1 or not spec.get("gpus") \
            or not isinstance(spec.get("technique"), str) or not isinstance(spec.get("model"), str) \
            or not spec.get("model") or not spec.get("platform"):
        return ""
    backend = spec.get("backend") or "deepspeed"
    if not isinstance(backend, str):  # a selection of several backends has no one prediction
        return ""
    try:
        p = predicted(paper_frame.platform_spec(spec["platform"]), _model_spec(spec["model"]), spec["technique"],
                      int(spec["gpus"]), backend=backend)
    except (ConfigError, techniques.TechniqueError, ValueError):  # ValueError: a backend's method not modelled
        return ""
    return p["why"] if p is not None and p["fits"] is False else ""  # "predicted GPU peak ... > ..."


def _missing_text(cell: str, why: str, spec: dict) -> str:
    """A cell a check could not use and why; one not run says where it cannot fit its GPU
    (its model states alone, else the memory model with its margin), so that a claim a
    single GPU cannot test reads as such."""
    note = (_fit_note(spec) or _predicted_note(spec)) if why == "not run" else ""
    return f"{cell}: {why} ({note})" if note else f"{cell}: {why}"


@dataclass(frozen=True, slots=True)
class MachineKind:
    """A machine the next runs may use: a platform (config/platforms) and a GPU count."""

    platform: str
    gpus: int

    @classmethod
    def parse(cls, raw: list[dict] | None, ours: pd.DataFrame) -> list[MachineKind]:
        """From a config's ``findings_machines`` ([{platform, gpus: int or list}]); without
        one, every (platform, GPUs) our training records ran on."""
        if raw:
            out = []
            for i, m in enumerate(raw):
                if m.get("platform") not in available("platform"):
                    raise ConfigError(f"findings_machines[{i}].platform: unknown platform {m.get('platform')!r}; "
                                      f"allowed: {', '.join(available('platform'))}")
                for g in m.get("gpus") if isinstance(m.get("gpus"), list) else [m.get("gpus") or 1]:
                    out.append(cls(m["platform"], int(g)))
            return out
        rows = ours[ours["stage"].isin(["pretrain", "finetune"])] if "stage" in ours else ours.iloc[0:0]
        return [cls(p, int(g)) for p, g in sorted(set(zip(rows["platform"], rows["gpus"].fillna(1))))]


TO_RUN_COLUMNS = ["finding", "verdict", "decided_elsewhere", "platform", "gpus", "model", "cells", "n_cells",
                  "more_rounds", "repeats", "round_s", "note"]


def _check_cells(f: Finding, c: Check, group: dict) -> list[dict]:
    """The cells a check reads in a group, as specs (a technique list: one cell each)."""
    out = []
    for sel in (c.a, c.b):
        if sel is None:
            continue
        # a where list (models, say) names the finding's groups: the group's own value is the cell's
        where = {k: v for k, v in f.where.items() if not (isinstance(v, list) and k in group)}
        spec = {"stage": f.stage, **group, **where, **sel}
        techs = spec.get("technique")
        for t in techs if isinstance(techs, list) else [techs]:
            one = {**spec, "technique": t} if t is not None else spec
            out.append(one)
            if c.metric == "scaling_efficiency" and (one.get("gpus") or 1) > 1:
                out.append({**one, "gpus": 1})  # efficiency is against the fewest GPUs: measured together
    return out


def _ran_ok(rows: pd.DataFrame) -> bool:
    """Whether a cell has an ok record: then it fits, whatever a model predicts."""
    return "status" in rows and bool((rows["status"] == "ok").any())


def _repeat_s(rows: pd.DataFrame, sets: set | None = None) -> float | None:
    """Seconds one repeat (a serving run) of a cell takes, the mean over its ok records of
    one run: a training record's start-up (llmbench.estimate.startup_of) plus its warm-up and
    measured steps at its measured step time; a serving run's engine start plus its load.
    The records are the latest paired set's among the runs ``sets`` (those a check's paired
    rounds came from: a set that replicates them measures each repeat as they did, and the
    latest machine is the likeliest next one), else those the report uses. None without
    such a record."""
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows.iloc[0:0]
    paired = ok[ok["run"].isin(sets) & ok["paired_set"].notna()] if sets and {"run", "paired_set"} <= set(ok) \
        else ok.iloc[0:0]
    if not paired.empty:
        latest = paired.assign(_t=_started(paired)).sort_values("_t", ascending=False)["run"].iloc[0]
        ok = paired[paired["run"] == latest]
    else:
        ok = _used(ok)
    took = [s for _, r in ok.iterrows() if (s := _record_s(r)) is not None]
    return sum(took) / len(took) if took else None


def _record_s(r: pd.Series) -> float | None:
    """Seconds one repeat of a record's cell took (_repeat_s), or None where it does not say."""
    from .. import estimate

    if r.get("stage") == "serve":
        if pd.notna(r.get("server_ready_s")) and pd.notna(r.get("duration_s")):
            return float(r["server_ready_s"]) + float(r["duration_s"])
        return None
    step, steps = r.get("step_time_s_mean"), (r.get("warmup_steps"), r.get("measured_steps"))
    if pd.isna(step) or any(pd.isna(x) for x in steps):
        return None
    try:
        start = estimate.startup_of(techniques.parse(str(r["technique"])), int(r["gpus"]),
                                   _model_spec(str(r["model"])), str(r.get("backend") or "deepspeed"))
    except (ConfigError, techniques.TechniqueError, KeyError, ValueError):
        return None
    return start + sum(int(x) for x in steps) * float(step)


def to_run(findings: list[Finding], ours: pd.DataFrame, kinds: list[MachineKind],
           ctx: Context | None = None, judged: dict[str, list[dict]] | None = None) -> pd.DataFrame:
    """For each finding no group of ours decided (every row inconclusive or untestable), the
    smallest paired set that would decide it on the given machine kinds: the cells its
    undecided checks read there (those not run, not ok, or whose interval straddled the
    bound, measured again together), with whether they can fit (model states on the
    kind's GPU count, then the memory model at batch 1; a cell with an ok record fits). For
    a finding that some group decided (``decided_elsewhere``: its verdict over those
    groups), one set per undecided row of the verdict table on a given kind whose cells can
    all fit: the finding holds (say) for 7B on one GPU and that row asks what would decide
    it for 13B there; a kind with no row of it, or cells that cannot fit, gets none (the
    verdict table's row already says why). A check that reads a legacy engine's cell
    (LEGACY_ENGINES) plans none of its cells: the other side alone would not decide it. A
    kind the claim's scope excludes (too few GPUs) or whose platform the claim is not
    about is left out. ``judged``: as ``evaluate``'s."""
    ctx = ctx or context(ours)
    ours = _one_block(ours)
    out = []
    for f in findings:
        mine = judged[f.id] if judged is not None else evaluate_finding(f, ours, ctx)
        real = [r for r in mine if r["relevant"]]
        decided = [r for r in real if r["verdict"] in DECIDED]
        elsewhere = (finding_verdicts(pd.DataFrame({"finding": f.id, "verdict": [r["verdict"] for r in decided]}))
                     .iloc[0] if decided else "")
        undecided = [r for r in real if r["verdict"] not in DECIDED]
        verdict = "inconclusive" if any(r["verdict"] == "inconclusive" for r in real) else "untestable"
        where_model = f.where.get("model")
        models = [where_model] if isinstance(where_model, str) else list(where_model or PAPER_MODELS)
        if "model" not in f.group_by:
            models = [None]
        candidates = _candidates(ours, f)
        for kind in kinds:
            if not platform_ok(f, kind.platform):
                continue
            for model in models:
                group = {k: v for k, v in (("platform", kind.platform), ("model", model), ("gpus", kind.gpus))
                         if k in f.group_by and v is not None}
                if any(_scope(c, f, {"gpus": kind.gpus}) for c in f.checks):
                    continue
                if decided:  # only a row of this group that the table holds undecided
                    rows_here = [r for r in undecided if all(r["group"].get(k) == v for k, v in group.items())]
                    if not rows_here:
                        continue
                    verdict = "inconclusive" if any(r["verdict"] == "inconclusive" for r in rows_here) \
                        else "untestable"
                rows = _match(candidates, group)
                cells, notes, rounds, repeats, stuck, took = {}, [], [], [], [], {}
                for c in f.checks:
                    o = evaluate_check(c, f, rows, group, ctx)
                    if o.verdict in ("holds", "contradicts"):
                        continue
                    specs = _check_cells(f, c, {**group, "gpus": kind.gpus})
                    if any(spec.get("engine") in LEGACY_ENGINES for spec in specs):
                        continue  # no set we would run decides it: its other side alone is no plan
                    paired = o.estimate is not None and o.estimate.rounds >= 2  # paired rounds to go on
                    if paired:
                        more = evidence.rounds_to_decide(o.estimate, c.lo, c.hi)
                        if more is not None:
                            rounds.append(more)
                        else:
                            stuck.append(f"{c.label()} {o.estimate.text()}: more rounds of these cells would not "
                                         f"decide it ({evidence.MAX_ROUNDS} in all at its spread)")
                    elif c.relation == "value" and (n := evidence.repeats_to_decide(o.estimate, c.lo, c.hi)):
                        repeats.append(n)
                    for spec in specs:
                        if spec.get("platform") != kind.platform:
                            continue
                        text = _cell_text(f.stage, {}, spec)
                        cells[text] = spec
                        cell_rows = _match(rows, spec)
                        took[text] = _repeat_s(cell_rows, o.runs if paired else None)
                        if _ran_ok(cell_rows):
                            continue  # it ran: no prediction says it cannot
                        if note := (_fit_note(spec) or _predicted_note(spec)):
                            notes.append(f"{text}: {note}")
                if cells and not (decided and notes):
                    out.append({"finding": f.id, "verdict": verdict, "decided_elsewhere": elsewhere,
                                "platform": kind.platform, "gpus": kind.gpus,
                                "model": model or "", "cells": "; ".join(sorted(cells)), "n_cells": len(cells),
                                "more_rounds": max(rounds) if rounds else None,
                                "repeats": max(repeats) if repeats else None,
                                "round_s": (round(sum(took.values())) if all(v is not None for v in took.values())
                                            else None),
                                "note": "; ".join(notes + stuck), "_unfit": len(notes)})
    df = pd.DataFrame(out, columns=[*TO_RUN_COLUMNS, "_unfit"])
    df["more_rounds"] = df["more_rounds"].astype("Int64")
    df["repeats"] = df["repeats"].astype("Int64")
    df["round_s"] = df["round_s"].astype("Int64")
    df["_cannot"] = df["_unfit"] > 0
    # 0: a finding no group decided; 1, 2: an inconclusive, an untestable row of a decided one
    df["_row"] = (df["decided_elsewhere"] != "") * (1 + (df["verdict"] == "untestable"))
    # per undecided finding, its smallest set (one that may fit first, the fewest cells that
    # cannot, then the fewest cells and GPUs); a decided finding's rows each keep theirs
    df = df.sort_values(["_cannot", "_unfit", "n_cells", "gpus", "platform", "model"])
    df = df[(df["_row"] > 0) | ~df.duplicated("finding")]
    # the sets that may fit first: whole findings, then rows of findings decided elsewhere
    # (inconclusive ones, measured there, before untestable ones)
    df = df.sort_values(["_cannot", "_row", "n_cells", "finding", "platform", "gpus", "model"], ignore_index=True)
    return df.drop(columns=["_cannot", "_unfit", "_row"])


def missing_cells(findings: list[Finding], ours: pd.DataFrame, kinds: list[MachineKind] | None = None,
                  ctx: Context | None = None, judged: dict[str, list[dict]] | None = None) -> pd.DataFrame:
    """What to run next (``to_run``) on the given machine kinds (None: those our records ran on)."""
    return to_run(findings, ours, kinds if kinds is not None else MachineKind.parse(None, ours), ctx, judged)


def counts(table: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict, in VERDICTS order."""
    vc = table["verdict"].value_counts() if len(table) else {}
    return {v: int(vc.get(v, 0)) for v in VERDICTS}


def finding_verdicts(table: pd.DataFrame) -> pd.Series:
    """One word per finding over its rows: the rows' verdict where they agree; 'mixed' where
    decided rows disagree (it holds on one group and not on another); else the strongest of
    inconclusive and untestable."""
    def one(vs: pd.Series) -> str:
        s = set(vs)
        decided = s & set(DECIDED)
        if len(decided) > 1:
            return "mixed"
        if decided:
            return decided.pop()
        return "inconclusive" if "inconclusive" in s else "untestable"
    return table.groupby("finding", sort=False)["verdict"].agg(one) if len(table) else pd.Series(dtype=str)


FINDING_VERDICTS = ("holds", "contradicts", "partly", "mixed", "inconclusive", "untestable")


def summary_line(table: pd.DataFrame) -> str:
    """'N findings: a holds, ... ; M rows (finding x platform, model, GPUs): b holds, ...'."""
    c = counts(table)
    fv = finding_verdicts(table).value_counts()
    n = table["finding"].nunique() if len(table) else 0
    return (f"{n} findings: " + ", ".join(f"{int(fv.get(v, 0))} {v}" for v in FINDING_VERDICTS if fv.get(v, 0))
            + f"; {len(table)} rows (a finding on one platform, model, GPU count and, where it groups by it, batch): "
            + ", ".join(f"{c[v]} {v}" for v in VERDICTS))


#: the findings table's columns shown in Markdown and HTML (the CSV has them all)
SHOWN = ["finding", "section", "claim", "platform", "model", "gpus", "batch_size", "verdict", "ours_value",
         "tolerance", "n", "pairing", "paper_value", "paper_check", "missing", "engines", "protocols"]
NOTE = (
    "How to read it: each row judges one claim of the paper on one group of our cells (platform, model, GPUs; and "
    "batch, `batch_size`, where the finding groups by it). "
    "`ours_value` gives each check in words with its value and 95 % interval (llmbench.report.evidence: from the "
    "repeats; memory is exact; a cell measured once takes the pooled repeat-to-repeat spread); `tolerance` is the "
    "interval the claim implies. A check holds where its whole interval lies inside, contradicts where it lies "
    "wholly outside, and is inconclusive where it straddles a bound; a bound of 1 on a ratio is strict ('more' is "
    "not 'equal'). The row's verdict: holds (every check holds), contradicts (every check contradicts), partly "
    "(some of each), inconclusive (not every check decided), untestable (no value: not run, out of memory, or "
    "outside the claim's scope, e.g. sharding claims on one GPU). `pairing`: set (both sides measured in one paired "
    "set, repeats interleaved), machine (one boot), machines (two: the interval carries the machine-to-machine "
    "spread), exact (deterministic). `n`: repeats behind each side. An out-of-memory cell bounds its peak memory "
    "from below. `paper_value`/`paper_check`: the same comparison on the paper's printed numbers and whether they "
    "bear its own text out. `engines`: the serving engines and versions compared. The CSV adds `compares`, "
    "`machines`, `method` and `how`.")
MISSING_HEADING = "What to run next: the paired sets that would decide each undecided finding and row"
MISSING_LEAD = ("On the machine kinds given (config `findings_machines`; default: the platforms and GPU counts our "
                "records ran on): per undecided finding, its smallest paired set; per finding decided elsewhere "
                "(`decided_elsewhere`: its verdict there), a set for each of its undecided rows on these kinds "
                "whose cells can all fit. The sets that may fit first (whole findings, then inconclusive rows, then "
                "untestable ones); the first {shown} here, findings-missing.csv has them all. `cells`: the cells "
                "its undecided checks read there, to be measured together in one job; `more_rounds`, where a check "
                "already has paired rounds, how many more of them (a set measuring each repeat alike, pooled with "
                "the earlier ones) would clear its nearest bound if the ratio and its spread held; `repeats`, where a "
                "value check reads one record's repeats, how many a new record of the cell (replacing it, never "
                "pooled) would need to clear its bound at that spread; `round_s`, the "
                "seconds a round of these cells takes, where each has a record (a paired set's whose rounds the "
                "check pooled, else the one the tables use): its start-up and its warm-up and measured steps at "
                "its measured step time, or an engine's start and its load; `note` names a cell that cannot fit "
                "(model states alone, or the memory model at batch 1 under its backend; one that ran ok fits), "
                "listed last, or a ratio too close to its bound for more rounds to decide.")
MISSING_SHOWN = 20


#: Our own findings (catalog table findings-ours) have no paper side: these columns are left out.
PAPER_SHOWN = ("paper_value", "paper_check")
NOTE_OURS = ("Claims of this project, not of the paper (config/findings/ours.yaml), judged by the same engine as "
             "the paper's findings: the same intervals, pairing and verdicts (the verdict table's note says how to "
             "read them); there is no paper value.")


def report_table(table: pd.DataFrame, missing: pd.DataFrame, name: str = "findings"):
    """The findings as the report shows them (llmbench.report.render): the counts per
    verdict first, every row, then the cells that would decide the most. ``name``: the
    catalog table (findings, or findings-ours: our own, shown without the paper's side)."""
    from . import catalog, render

    spread = ""
    if "machine_spread" in table.attrs:
        spread = f" Machine-to-machine spread of a cell's throughput: {table.attrs['machine_spread']}."
    ours = name != "findings"
    # batch_size: only where a finding groups its cells by batch (group_by), else every row's is empty
    shown = [c for c in SHOWN if not (ours and c in PAPER_SHOWN)
             and not (c == "batch_size" and table.get(c, pd.Series(dtype=object)).isna().all())]
    parts = [render.Part(frame=table.reindex(columns=shown), lead=summary_line(table) + "." + spread,
                         note=NOTE_OURS if ours else NOTE)]
    if len(missing):
        parts.append(render.Part(frame=missing.head(MISSING_SHOWN), heading=MISSING_HEADING,
                                 lead=MISSING_LEAD.format(shown=MISSING_SHOWN)))
    return render.Table(title=catalog.get("table", name).title, long=table[COLUMNS], parts=tuple(parts))


def build(tidy: pd.DataFrame, profile_rows: pd.DataFrame | None = None, micro_rows: pd.DataFrame | None = None,
          path: Path | str | None = None, root: Path = REPO_ROOT, models: list[str] | None = None,
          superseded: pd.DataFrame | None = None,
          machines: list[dict] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The findings table and what to run next, from the tidy table of our records and the
    records other runs of the same cells superseded (pairing reads them: a comparison takes
    both sides from one set, then one machine). ``models``: judge only cells of these models
    (None: every model, a tiny one too); ``machines``: the machine kinds to plan for
    (MachineKind.parse)."""
    fs = load(path or root / "config" / "reference" / "findings.yaml")
    ours = facts(tidy, profile_rows, micro_rows, superseded)
    if models is not None:
        ours = ours[ours["model"].isin(models) | ours["model"].isna()]
    ours = _one_block(ours)
    paper = derive(paper_frame.frame(root))
    ctx = context(ours)
    judged = {f.id: evaluate_finding(f, ours, ctx) for f in fs}  # the table's groups, and the plan's
    table = evaluate(fs, ours, paper, ctx, judged)
    table.attrs["machine_spread"] = spread_text(ctx.spread)
    return table, missing_cells(fs, ours, MachineKind.parse(machines, ours), ctx, judged)
