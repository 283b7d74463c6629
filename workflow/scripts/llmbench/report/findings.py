"""The paper's findings as data (config/reference/findings.yaml), judged on any hardware.

A finding is a claim of the paper and the checks that decide it. A check compares one
metric of two selections of cells (``ratio``: a / b), of one selection (``value``), of a
selection against the best of the others (``best``: a / max of the rest), or asks whether a
selection runs at all (``runs``: 1 if ok, 0 if out of memory), and states the interval the
claim implies (``expect``: ``min``/``max``, or ``about`` with the finding's relative
``tolerance``). The engine evaluates every check per group of cells (by default platform,
model and GPU count), on our records and, the same way, on the paper's own numbers
(llmbench.report.paper_frame), and gives each group one verdict:

- ``holds``: every check is inside its interval;
- ``contradicts``: no check is, and at least one was decided;
- ``partly``: some checks hold and others contradict, or some hold and others could not be
  decided;
- ``untestable``: no check could be decided; ``missing`` names the cells that would.

Comparisons across hardware go through per-GPU throughput, MFU and ratios of two cells of
the same platform and model, never through platform names alone; a finding that names
paper platforms (RTX4090 against RTX3090, say) is decided only where those platforms ran.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from .. import techniques
from ..config import REPO_ROOT, ConfigError, available, load_yaml, validate
from . import paper_frame, scaling
from . import runs as runs_rule
from . import tidy as tidy_table

VERDICTS = ("holds", "contradicts", "partly", "untestable")
RELATIONS = {
    "ratio": "metric(a) / metric(b)",
    "value": "metric(a)",
    "best": "metric(a) / the largest metric(x) of the other cells x of the group (among)",
    "runs": "1 if a ran (ok), 0 if it ran out of memory",
}
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


def _sel_text(sel: dict | None) -> str:
    if not sel:
        return ""
    parts = []
    for k, v in sel.items():
        v = "/".join(map(str, v)) if isinstance(v, list) else v
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
                 lo=lo, hi=hi)


def load(path: Path | str = REPO_ROOT / "config" / "reference" / "findings.yaml") -> list[Finding]:
    """Load and validate the findings file. A bad entry raises ConfigError naming its id."""
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
        out.append(Finding(id=fid, section=entry["section"], claim=entry["claim"], quote=entry["quote"],
                           how=entry["how"], stage=entry["stage"], checks=checks,
                           where=_canonical_selection(entry.get("where") or {}, f"{where}.where"),
                           group_by=tuple(group_by), platforms=entry.get("platforms") or {},
                           paper=entry.get("paper") or {}, tolerance=tol))
    return out


# --- the facts: tidy rows with the derived metrics --------------------------------------

@lru_cache(maxsize=None)
def _platform_facts(name: str) -> dict:
    try:
        p = paper_frame.platform_spec(name)
    except ConfigError:
        return {}
    return {"gpu_memory_gib": p.get("gpu_memory_gib"), "gpus_per_node": p.get("gpus_per_node"),
            "interconnect": p.get("interconnect", "")}


def derive(df: pd.DataFrame) -> pd.DataFrame:
    """Metrics computed from other columns the same way for ours and the paper's rows."""
    df = df.copy()
    for col in ("forward", "backward", "optimizer"):
        for k in ("wall", "kernel", "gemm"):
            if f"{col}_{k}_s" not in df:
                df[f"{col}_{k}_s"] = float("nan")
    step = df["forward_wall_s"] + df["backward_wall_s"] + df["optimizer_wall_s"]
    df["optimizer_share"] = df["optimizer_wall_s"] / step
    for phase in ("forward", "backward", "optimizer"):
        df[f"{phase}_idle_share"] = 1 - df[f"{phase}_kernel_s"] / df[f"{phase}_wall_s"]
    for phase in ("forward", "backward"):
        df[f"{phase}_gemm_share"] = df[f"{phase}_gemm_s"] / df[f"{phase}_wall_s"]
    for m in METRICS:
        if m not in df:
            df[m] = float("nan")
    return df


def _from_profile_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """Per profile cell: the attention core's time per phase and the MLP's lead."""
    keys = ["platform", "model", "backend", "technique", "batch_size", "gpus"]
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
    return out.join(lead, how="outer").reset_index()


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
          micro_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """Our records as the engine reads them: the tidy table, cells only (not search
    probes), with per-GPU throughput, memory in GB, scaling efficiency and the metrics
    read from the per-row profile and microbenchmark tables."""
    df = tidy.copy()
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
    prof = _from_profile_rows(profile_rows)
    if len(prof):
        keys = ["platform", "model", "backend", "technique", "batch_size", "gpus"]
        prof = prof.assign(stage="profile")
        df = df.merge(prof, on=["stage"] + keys, how="left", suffixes=("", "_p"))
    micro = _from_micro_rows(micro_rows)
    if len(micro):
        df = df.merge(micro.assign(stage="micro"), on=["stage", "platform", "bench", "case", "gpus"], how="left",
                      suffixes=("", "_m"))
    return derive(df)


# --- evaluation --------------------------------------------------------------------------

@dataclass(slots=True)
class Outcome:
    """One check on one group."""

    value: float | None = None
    verdict: str = "missing"
    missing: list = field(default_factory=list)
    runs: set = field(default_factory=set)
    protocols: set = field(default_factory=set)
    """Warm-up/measured steps/repeats of the training cells the value came from."""


def _match(df: pd.DataFrame, sel: dict) -> pd.DataFrame:
    for k, v in sel.items():
        if k == "batch_size" and v == "max":
            continue
        if k not in df:
            return df.iloc[0:0]
        df = df[df[k].isin(v) if isinstance(v, list) else df[k] == v]
    if sel.get("batch_size") == "max":
        ok = df[df["status"] == "ok"]
        if len(ok):
            df = df[df["batch_size"] == ok["batch_size"].max()]
    return df


def _cell_text(stage: str, group: dict, sel: dict) -> str:
    s = {**group, **sel}
    parts = [stage, s.get("platform", "any platform"), s.get("model", "")]
    for k in ("backend", "layout", "engine", "load", "mode", "bench", "case"):
        if k in s:
            parts.append(str(s[k]))
    if "technique" in s:
        parts.append("/".join(s["technique"]) if isinstance(s["technique"], list) else s["technique"])
    for key, prefix in (("batch_size", "bs"), ("gpus", "g")):
        if key in s and s[key] is not None and not (isinstance(s[key], float) and math.isnan(s[key])):
            v = s[key]
            parts.append(f"{prefix}{int(v) if isinstance(v, float) else v}")
    return " ".join(p for p in parts if p)


def _protocols(rows: pd.DataFrame) -> set:
    """'warm-up/measured/repeats' of each training row (none for cells without a step protocol)."""
    cols = ["warmup_steps", "measured_steps", "repeats"]
    if rows.empty or any(c not in rows for c in cols):
        return set()
    return {runs_rule.steps_label(*r) for r in rows[cols].dropna().itertuples(index=False)}


def _measure(grp: pd.DataFrame, sel: dict, metric: str, stage: str,
             group: dict) -> tuple[float | None, list, set, set]:
    """The metric of the cells ``sel`` picks in ``grp`` (mean over the ok ones; the tidy table
    holds one record per cell, llmbench.report.runs), or why not; with the runs and the
    protocols it came from."""
    rows = _match(grp, sel)
    cell = _cell_text(stage, group, sel)
    spec = {"stage": stage, **group, **sel}
    if rows.empty:
        need = sel.get("gpus")
        have = _platform_facts(group.get("platform", "")).get("gpus_per_node") if "platform" in group else None
        why = f"needs {need} GPUs, the platform has {have}" if need and have and need > have else "not run"
        return None, [(cell, why, spec)], set(), set()
    ok = rows[rows["status"] == "ok"]
    if ok.empty:
        st = sorted(set(rows["status"].astype(str)))
        return (None, [(cell, "out of memory" if st == ["oom"] else "status " + "/".join(st), spec)],
                set(rows["run"]), set())
    vals = ok[metric].dropna() if metric in ok else pd.Series(dtype=float)
    if vals.empty:
        return None, [(cell, f"{metric} not measured", spec)], set(ok["run"]), set()
    return float(vals.mean()), [], set(ok["run"]), _protocols(ok.loc[vals.index])


def _judge(check: Check, value: float | None) -> str:
    if value is None:
        return "missing"
    inside = (check.lo is None or value >= check.lo) and (check.hi is None or value <= check.hi)
    return "holds" if inside else "contradicts"


def evaluate_check(check: Check, finding: Finding, grp: pd.DataFrame, group: dict) -> Outcome:
    """One check on one group of cells."""
    sel_a = {**finding.where, **check.a}
    if check.relation == "runs":
        rows = _match(grp, sel_a)
        cell = _cell_text(finding.stage, group, sel_a)
        if (rows["status"] == "ok").any():
            return Outcome(1.0, _judge(check, 1.0), [], set(rows["run"]))
        if (rows["status"] == "oom").any():
            return Outcome(0.0, _judge(check, 0.0), [], set(rows["run"]))
        why = "not run" if rows.empty else "status " + "/".join(sorted(set(rows["status"].astype(str))))
        return Outcome(None, "missing", [(cell, why, {"stage": finding.stage, **group, **sel_a})],
                       set(rows["run"]) if len(rows) else set())
    a, miss, runs, protos = _measure(grp, sel_a, check.metric, finding.stage, group)
    if check.relation == "value":
        return Outcome(a, _judge(check, a), miss, runs, protos)
    if check.relation == "ratio":
        b, miss_b, runs_b, protos_b = _measure(grp, {**finding.where, **check.b}, check.metric, finding.stage, group)
        value = a / b if a is not None and b else None
        return Outcome(value, _judge(check, value), miss + miss_b, runs | runs_b,
                       protos | protos_b if value is not None else set())
    # best: a against the best other cell of the group
    among = _match(grp, {**finding.where, **(check.among or {})})
    mine = _match(among, sel_a).index
    others = among.drop(index=mine)
    others = others[(others["status"] == "ok") & others[check.metric].notna()]
    if others.empty:
        among_sel = {**finding.where, **(check.among or {})}
        miss = miss + [(_cell_text(finding.stage, group, among_sel), "no other cell to compare with",
                        {"stage": finding.stage, **group, **among_sel})]
        return Outcome(None, "missing", miss, runs)
    by = ["technique", "backend", "engine", "case", "batch_size"]
    best = others.groupby([k for k in by if k in others], dropna=False)[check.metric].mean().max()
    value = a / best if a is not None and best else None
    return Outcome(value, _judge(check, value), miss, runs | set(others["run"]),
                   protos | _protocols(others) if value is not None else set())


def combine(verdicts: list[str]) -> str:
    """One verdict from the checks' (holds / contradicts / missing)."""
    s = set(verdicts)
    if s == {"missing"}:
        return "untestable"
    if s == {"holds"}:
        return "holds"
    if "holds" in s:
        return "partly"
    return "contradicts"


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


def _candidates(df: pd.DataFrame, f: Finding) -> pd.DataFrame:
    df = df[df["stage"] == f.stage] if "stage" in df else df.iloc[0:0]
    for k in ("model", "platform", "backend"):
        v = f.where.get(k)
        if v is not None and all(k not in c.a and k not in (c.b or {}) for c in f.checks):
            df = df[df[k].isin(v) if isinstance(v, list) else df[k] == v]
    if f.platforms:
        df = df[df["platform"].map(lambda p: platform_ok(f, p))]
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


def evaluate_finding(f: Finding, frame: pd.DataFrame) -> list[dict]:
    """Per group: the checks' values, verdicts and missing cells, and whether the group
    has any cell the finding names."""
    out = []
    for group, grp in _groups(_candidates(frame, f), f):
        outcomes = [evaluate_check(c, f, grp, group) for c in f.checks]
        out.append({"group": group, "outcomes": outcomes, "verdict": combine([o.verdict for o in outcomes]),
                    "relevant": _relevant(f, grp)})
    return out


def _empty_result(f: Finding, frame_columns: list[str], group: dict) -> dict:
    empty = pd.DataFrame(columns=frame_columns)
    outcomes = [evaluate_check(c, f, empty, group) for c in f.checks]
    return {"group": group, "outcomes": outcomes, "verdict": "untestable", "relevant": False}


def _values_text(outcomes: list[Outcome]) -> str:
    return ", ".join("n/a" if o.value is None else _num(o.value) for o in outcomes)


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


def evaluate(findings: list[Finding], ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
    """The findings table: one row per finding and group of our cells (one untestable row
    when none of our cells can speak to it), with the paper's values beside ours."""
    rows = []
    for f in findings:
        mine, theirs = evaluate_finding(f, ours), evaluate_finding(f, paper)
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
            paper_value, paper_check = _paper_text(f, theirs, g.get("model", f.where.get("model")))
            missing = [_missing_text(cell, why, spec) for o in r["outcomes"] for cell, why, spec in o.missing]
            rows.append({
                "finding": f.id, "section": f.section, "claim": f.claim, "compares": f.compares(),
                "platform": g.get("platform", "-"), "model": g.get("model", f.where.get("model", "-")),
                "gpus": g.get("gpus"), "batch_size": g.get("batch_size"), "paper_value": paper_value, "ours_value": _values_text(r["outcomes"]),
                "verdict": r["verdict"], "tolerance": "; ".join(
                    interval_text(c.lo, c.hi) if c.relation != "runs" else "runs" if c.lo == 1.0 else "out of memory"
                    for c in f.checks),
                "missing": "; ".join(dict.fromkeys(missing)) if r["verdict"] != "holds" else "",
                "runs": ", ".join(sorted(set().union(*(o.runs for o in r["outcomes"])) - {"paper"})),
                "protocols": ", ".join(sorted(set().union(*(o.protocols for o in r["outcomes"])),
                                              key=lambda p: (-runs_rule.label_strength(p), p))),
                "paper_check": paper_check, "how": f.how,
            })
    df = pd.DataFrame(rows)
    return df


COLUMNS = ["finding", "section", "claim", "compares", "platform", "model", "gpus", "batch_size", "paper_value",
           "ours_value",
           "verdict", "tolerance", "missing", "runs", "protocols", "paper_check", "how"]


#: The GPUs this project is lent for its runs (one H100, one H200): where missing cells are ranked.
LENT = (("h100", 1), ("h200", 1))
#: Engines no longer maintained upstream (TGI: archived in March 2026): kept runnable and
#: judged where they ran, never ranked as a cell worth GPU time.
LEGACY_ENGINES = ("tgi",)
#: The paper's models, for ranking cells a finding names without a model.
PAPER_MODELS = ("llama2-7b", "llama2-13b", "llama2-70b")


def _fit_note(spec: dict) -> str:
    """'' where the cell may fit its GPU, else why it cannot (its model states alone)."""
    from .. import memory
    from ..models import ModelSpec

    tech, model, plat = spec.get("technique"), spec.get("model"), spec.get("platform")
    cap = _platform_facts(plat).get("gpu_memory_gib") if plat else None
    if not model or not cap:
        return ""
    try:
        spec_model = ModelSpec.load(model)
        if spec.get("stage") == "serve":  # bf16 weights alone
            need, what = spec_model.param_counts()["total"] * memory.WEIGHTS_BF16 / memory.GIB, "bf16 weights"
        elif spec.get("stage") in ("pretrain", "finetune") and isinstance(tech, str):
            need, what = memory.model_states_gib(spec_model, tech, int(spec.get("gpus") or 1)), "model states"
        else:
            return ""
    except (ConfigError, techniques.TechniqueError):
        return ""
    return f"cannot fit: {what} {need:.0f} GiB > {cap:g} GiB" if need > cap else ""


def _predicted_note(spec: dict) -> str:
    """'' unless the memory model (with its margin, llmbench.report.advice.predicted) says a
    training cell at batch 1 on a stated GPU count does not fit, then why."""
    from ..models import ModelSpec
    from .advice import predicted

    if spec.get("stage") not in ("pretrain", "finetune") or spec.get("batch_size") != 1 or not spec.get("gpus") \
            or not isinstance(spec.get("technique"), str) or not spec.get("model") or not spec.get("platform"):
        return ""
    try:
        p = predicted(paper_frame.platform_spec(spec["platform"]), ModelSpec.load(spec["model"]), spec["technique"],
                      int(spec["gpus"]))
    except (ConfigError, techniques.TechniqueError):
        return ""
    return p["why"] if p is not None and p["fits"] is False else ""  # "predicted GPU peak ... > ..."


def _missing_text(cell: str, why: str, spec: dict) -> str:
    """A cell a check could not use and why; one not run says where it cannot fit its GPU
    (its model states alone, else the memory model with its margin), so that a claim a
    single GPU cannot test reads as such."""
    note = (_fit_note(spec) or _predicted_note(spec)) if why == "not run" else ""
    return f"{cell}: {why} ({note})" if note else f"{cell}: {why}"


def missing_cells(findings: list[Finding], ours: pd.DataFrame, lent=LENT) -> pd.DataFrame:
    """The cells that would decide the most undecided findings on the lent GPUs, ranked.

    A finding some group of ours already decided (holds or contradicts) counts no more;
    one only partly decided counts the cells its partly groups miss; one no group decided
    counts, for every lent (platform, GPUs) and model, the cells its checks name that did
    not run (or not ok) there. A cell whose model states alone exceed the GPU
    (llmbench.memory) is ranked after those that may fit: it would only confirm an OOM."""
    count: dict[tuple[str, str], set] = {}
    spec_of: dict[tuple[str, str], dict] = {}

    lent_gpus = dict(lent)

    def add(f: Finding, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            for cell, why, spec in o.missing:
                # only cells a lent GPU can run; an out-of-memory cell already ran (rerunning
                # it cannot decide anything)
                plat = spec.get("platform")
                if plat not in lent_gpus or (spec.get("gpus") or lent_gpus[plat]) > lent_gpus[plat] \
                        or why == "out of memory" or "any platform" in cell or spec.get("engine") in LEGACY_ENGINES:
                    continue
                count.setdefault((cell, why), set()).add(f.id)
                spec_of[(cell, why)] = spec

    for f in findings:
        real = [r for r in evaluate_finding(f, ours) if r["relevant"]]
        if any(r["verdict"] in ("holds", "contradicts") for r in real):
            continue
        partly = [r for r in real if r["verdict"] == "partly"]
        if partly:
            for r in partly:
                add(f, r["outcomes"])
            continue
        models = [f.where["model"]] if isinstance(f.where.get("model"), str) else list(PAPER_MODELS)
        if "model" not in f.group_by:
            models = [None]
        for plat, gpus in lent:
            if not platform_ok(f, plat):
                continue
            for model in models:
                group = {k: v for k, v in (("platform", plat), ("model", model), ("gpus", gpus)) if k in f.group_by}
                rows = ours[ours["stage"] == f.stage] if "stage" in ours else ours.iloc[0:0]
                for k, v in group.items():
                    rows = rows[rows[k] == v] if k in rows else rows.iloc[0:0]
                add(f, [evaluate_check(c, f, rows, group) for c in f.checks])
    out = [{"cell": c, "why": w, "findings": len(ids), "finding_ids": ", ".join(sorted(ids)),
            "predicted": _fit_note(spec_of[(c, w)])} for (c, w), ids in count.items()]
    df = pd.DataFrame(out, columns=["cell", "why", "findings", "finding_ids", "predicted"])
    df["_cannot"] = df["predicted"] != ""
    df = df.sort_values(["_cannot", "findings", "cell"], ascending=[True, False, True], ignore_index=True)
    return df.drop(columns="_cannot")


def counts(table: pd.DataFrame) -> dict[str, int]:
    """Rows per verdict, in VERDICTS order."""
    vc = table["verdict"].value_counts() if len(table) else {}
    return {v: int(vc.get(v, 0)) for v in VERDICTS}


def summary_line(table: pd.DataFrame) -> str:
    """'N findings x groups: a holds, b contradicts, c partly, d untestable'."""
    c = counts(table)
    n = table["finding"].nunique() if len(table) else 0
    return (f"{n} findings over {len(table)} (platform, model) groups: " +
            ", ".join(f"{c[v]} {v}" for v in VERDICTS))


#: the findings table's columns shown in Markdown and HTML (the CSV has them all)
SHOWN = ["finding", "section", "claim", "platform", "model", "gpus", "batch_size", "verdict", "ours_value",
         "paper_value", "tolerance", "missing", "runs", "protocols"]
NOTE = (
    "How to read it: each row judges one claim of the paper on one group of our cells (platform, model, GPUs). "
    "`ours_value` and `paper_value` are the same comparison (listed in `compares` in the CSV) computed on our records "
    "and on the paper's printed numbers (per paper platform); `tolerance` is the interval the claim implies. "
    "Comparisons across hardware use per-GPU throughput, MFU and ratios of cells of one platform, so a GPU the paper "
    "never ran is judged on the same terms. `missing` names the cells a check could not use (not run, out of "
    "memory, ...): those that would decide an untestable or partly decided claim, or the rest of a contradicted "
    "one. `protocols`: warm-up/measured steps/repeats of the training cells behind our value (the paper's is "
    "30/100/3); a row with several compares cells measured under different protocols, which the reader should "
    "weigh. The CSV adds `compares`, `paper_check` (does the paper's own table bear the claim out?) and `how`.")
MISSING_HEADING = "Cells that would decide the most undecided findings on the lent GPUs (one H100, one H200)"
MISSING_LEAD = ("Ranked by how many findings no run has decided yet each is named by. A cell that runs out of "
                "memory decides only the checks that ask whether it runs; a cell whose model states alone exceed the "
                "GPU (`predicted`, llmbench.memory, a lower bound) is ranked last: it could only confirm the OOM.")
MISSING_SHOWN = 15


def report_table(table: pd.DataFrame, missing: pd.DataFrame):
    """The findings as the report shows them (llmbench.report.render): the counts per
    verdict first, every row, then the cells that would decide the most."""
    from . import catalog, render

    parts = [render.Part(frame=table.reindex(columns=SHOWN), lead=summary_line(table) + ".", note=NOTE)]
    if len(missing):
        parts.append(render.Part(frame=missing.head(MISSING_SHOWN), heading=MISSING_HEADING, lead=MISSING_LEAD))
    return render.Table(title=catalog.get("table", "findings").title, long=table[COLUMNS], parts=tuple(parts))


def build(tidy: pd.DataFrame, profile_rows: pd.DataFrame | None = None, micro_rows: pd.DataFrame | None = None,
          path: Path | str | None = None, root: Path = REPO_ROOT,
          models: list[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The findings table and the ranked missing cells, from the tidy table of our records
    (``models``: judge only cells of these models; None: every model, a tiny one too)."""
    fs = load(path or root / "config" / "reference" / "findings.yaml")
    ours = facts(tidy, profile_rows, micro_rows)
    if models is not None:
        ours = ours[ours["model"].isin(models) | ours["model"].isna()]
    paper = derive(paper_frame.frame(root))
    table = evaluate(fs, ours, paper)
    return table, missing_cells(fs, ours)
