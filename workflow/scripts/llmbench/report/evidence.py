"""The uncertainty of a compared value: how the findings engine (llmbench.report.findings)
turns the records behind one comparison into a value with a 95 % interval.

Throughput (tokens/s, MFU, output tokens/s) is a noisy measurement: each record holds one
value per repeat (a fresh process each, llmbench.protocol), and the same cell moves between
machines (a host-bound batch-1 cell by 10-20 % between two lent machines of one kind). So:

- Every interval is on the log scale (a ratio of two positive means is symmetric there)
  and 95 %, with Student's t on its degrees of freedom.
- **One set** (both sides measured in one paired set, llmbench.launch.run_set: repeats
  interleaved round by round on one machine): the per-round log ratios, their mean and
  t-interval (n - 1 degrees of freedom). Slow drifts of the machine cancel round by round. A
  set resumed on another boot (a lent call's machine is not the next call's) pairs only the
  rounds whose two repeats ran on one machine; the method says how many it left out.
  **Several sets** holding both sides whose repeats measure alike (the same warm-up and
  measured steps, sequence and engine versions; their numbers of rounds may differ): their
  rounds pooled, each set's its own, so that how the ratio moves between the sets' machines
  is in the interval; otherwise one set, the strongest protocol's, then the later one
  (llmbench.report.findings). A set run again under its own name (a recipe rerun, say after
  a fix) stays one set, its later records replacing the earlier ones.
- **One machine** (both sides on one boot, not in one set): Welch's interval of the
  difference of the two sides' mean log values (Welch-Satterthwaite degrees of freedom).
- **Two machines**: as one machine, and each side carries the machine-to-machine spread
  as well (``machine_spread``: the variance of a cell's mean between the machines that
  measured it, less what its repeats explain, pooled over every cell measured on more than
  one machine); a cross-machine ratio then decides only effects larger than that spread.
  The spread is pooled by how a training cell's step is paced (``pace``, ``machine_spreads``):
  where the host sets the pace (batch 1, CPU offload) a cell moves between machines by tens of
  percent, where the GPU does (batch 8 and more, no offload) by a few; each side carries its
  class's spread, the spread of every cell where its class has too few degrees of freedom
  (``MIN_SPREAD_DF``) or it is in neither class (batch 2-7, serving).
- A throughput measured once (one repeat) has no spread of its own: it takes the pooled
  repeat-to-repeat CV of every cell with several repeats (``pooled_cv``), said so in the
  method. A profiled cell of several repeats keeps each repeat's breakdown (its record's
  ``summary.kernel_runs``: communication and copy seconds and shares; ``summary.repeats``:
  phase times and module rows, whose metrics llmbench.report.findings derives per repeat
  into the same ``kernel_runs``), so its values have their repeats' spread and pair round by
  round in a set. Other metrics measured once (a microbenchmark's best point, a profile's
  shares from one repeat, or from a record made before the breakdown was kept per repeat)
  have none to borrow: they are taken as measured ("one measurement, no spread measured"),
  and a reader weighs a value near its bound accordingly.
- Memory (allocated peak) is deterministic for a given stack: exact, no interval; a bound
  of 1 on a ratio is then strict (``findings``: "more" is not "equal").
- An out-of-memory cell bounds its peak from below (``OOM_SHARE`` of its GPU's memory), so
  a memory comparison with it is a one-sided interval.
- The paper's printed numbers are taken as exact (``exact=True``): its tables print one
  number a cell.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

import pandas as pd

#: two-sided 95 % quantiles of Student's t, degrees of freedom 1..30
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
Z975 = 1.959964
#: throughputs: measured once per repeat (per-repeat values in the record), noisy between repeats;
#: scaling efficiency is a ratio of two of them
NOISY = ("tokens_per_s_per_gpu", "mfu", "output_tokens_per_s", "scaling_efficiency")
#: metrics that do not change between runs of the same stack (allocator peaks)
EXACT = ("peak_mem_gb",)
#: an out-of-memory cell needed at least this share of its GPU's memory (the CUDA context and
#: the allocator's fragmentation take the rest before the failed request)
OOM_SHARE = 0.9
GIB_TO_GB = 2**30 / 1e9
#: pairings, strongest first (a comparison says which it had)
PAIRINGS = ("set", "machine", "machines", "exact")
#: A training cell without CPU offload from this batch a GPU up is GPU-paced (pace)
GPU_PACED_BATCH = 8
#: A pace class's machine spread stands for its cells from these degrees of freedom; below,
#: its cells carry the spread pooled over every cell (machine_spreads)
MIN_SPREAD_DF = 10


def t975(df: float) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` degrees of freedom (fractional
    df rounds down, so the interval errs wide; above 30, Cornish-Fisher's expansion)."""
    if df is None or df != df or df < 1:
        return float("inf")
    if df <= 30:
        return _T975[int(math.floor(df)) - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True, slots=True)
class Spread:
    """A pooled log-scale standard deviation, with its degrees of freedom and where it came from."""

    sd: float
    """Standard deviation of log values (about the relative spread)."""
    df: float
    """Degrees of freedom of the pooled estimate (0: none measured)."""
    cells: int = 0
    """How many cells it was pooled from."""

    def pct(self) -> str:
        return f"{100 * (math.exp(self.sd) - 1):.1f} %"


NO_SPREAD = Spread(0.0, 0.0, 0)


@dataclass(slots=True)
class Side:
    """One side of a comparison: the records of one cell behind it, as log values."""

    logs: list[float]
    """Log of the metric per repeat (one value where the record holds one)."""
    machine: str = ""
    paired_set: str | None = None
    run: str = ""
    exact: bool = False
    """Deterministic (memory), or the paper's printed number."""
    lower_bound: bool = False
    """An out-of-memory cell: the value is a lower bound (memory only)."""
    rounds: list = field(default_factory=list)
    """The round of each value, to pair rounds of one set: (repeat index, machine), so that a
    round pairs only repeats that ran on one machine (a set resumed on another boot has rounds
    whose repeats did not)."""
    noisy: bool = True
    """A throughput (NOISY): a value measured once takes the pooled repeat CV. Other metrics
    measured once (a microbenchmark's best point, a profile's share) have no spread of their
    own and none to borrow: they are taken as measured, and the method says so."""
    paired_rounds: bool = False
    """Its values are per-round ratios of two cells of one paired set (a scaling efficiency
    against its base): its interval is a set's paired one."""
    pace: str = ""
    """How its cell's step is paced (``pace``): which machine spread it carries."""

    @property
    def n(self) -> int:
        return len(self.logs)

    @property
    def point(self) -> float:
        return math.exp(statistics.fmean(self.logs))


@dataclass(frozen=True, slots=True)
class Estimate:
    """A compared value with its 95 % interval."""

    value: float | None
    """Point estimate (None: only a bound is known)."""
    lo: float
    hi: float
    n: str = ""
    """Repeats behind each side, e.g. '3/3'."""
    pairing: str = "exact"
    """One of PAIRINGS."""
    method: str = ""
    """How the interval was made, in words."""
    machines: tuple[str, ...] = ()
    rounds: int = 0
    """Paired rounds behind a set's interval (0: not paired by round)."""

    def text(self) -> str:
        """'0.553 [0.521, 0.587]' (or '>= 1.21' for a bound)."""
        if self.value is None:
            return f">= {_g(self.lo)}" if math.isinf(self.hi) else f"<= {_g(self.hi)}"
        if self.lo == self.hi:
            return _g(self.value)
        return f"{_g(self.value)} [{_g(self.lo)}, {_g(self.hi)}]"


def _g(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.3g}"


def repeat_machines(row: pd.Series, n: int) -> list[str]:
    """The machine each of a tidy row's ``n`` repeats ran on: its ``repeat_machines`` where a
    set resumed on another boot, else the row's one machine for all."""
    own = str(row.get("machine") or "")
    per = row.get("repeat_machines")
    boots = str(per).split(";") if isinstance(per, str) and per else []
    return [boots[i] if i < len(boots) else own for i in range(n)]


def round_keys(row: pd.Series, n: int) -> list[tuple[int, str]]:
    """Side.rounds for a tidy row's ``n`` repeat values: (repeat index, machine) each."""
    return list(zip(range(n), repeat_machines(row, n)))


def repeat_values(row: pd.Series, metric: str) -> list[float]:
    """The metric per repeat of one tidy row: the record's tokens/s of each repeat scaled to
    the metric (per GPU, MFU: both proportional to tokens/s), else the row's one value."""
    value = row.get(metric)
    if value is None or value != value:
        return []
    if metric == "scaling_efficiency" and isinstance(row.get("scaling_efficiency_runs"), str):
        return [float(x) for x in row["scaling_efficiency_runs"].split(";") if x]  # one per round of a set
    runs = row.get("tokens_per_s_runs")
    mean = row.get("tokens_per_s_mean")
    if metric in ("tokens_per_s_per_gpu", "mfu") and isinstance(runs, str) and runs and mean:
        vals = [float(x) for x in runs.split(";") if x]
        return [float(value) * v / float(mean) for v in vals if v > 0]
    kernel = row.get("kernel_runs")  # a profiled cell's breakdown per repeat (module docstring)
    if isinstance(kernel, str) and kernel and len(per := json.loads(kernel).get(metric) or []) > 1:
        return [float(v) for v in per]
    return [float(value)]


def _sd(logs: list[float]) -> float:
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


def pooled_cv(frame: pd.DataFrame) -> Spread:
    """The pooled repeat-to-repeat spread (log scale) of every ok training row with several
    repeats: what a side measured once is taken to have."""
    ss, df, cells = 0.0, 0, 0
    for _, row in _training_ok(frame).iterrows():
        logs = [math.log(v) for v in repeat_values(row, "tokens_per_s_per_gpu") if v > 0]
        if len(logs) > 1:
            ss += _sd(logs) ** 2 * (len(logs) - 1)
            df += len(logs) - 1
            cells += 1
    return Spread(math.sqrt(ss / df), df, cells) if df else NO_SPREAD


#: the stages whose records are training cells (their throughput is tokens/s of steps)
TRAINING_STAGES = ("pretrain", "finetune")


def _training_ok(frame: pd.DataFrame) -> pd.DataFrame:
    if frame.empty or "stage" not in frame:
        return frame.iloc[0:0]
    keep = frame["stage"].isin(TRAINING_STAGES) & (frame["status"] == "ok")
    if "kind" in frame:
        keep &= frame["kind"].fillna("cell") == "cell"
    return frame[keep & frame["tokens_per_s_mean"].notna()]


def machine_spread(frame: pd.DataFrame) -> tuple[Spread, pd.DataFrame]:
    """The machine-to-machine spread of a cell's mean throughput (log scale), pooled over every
    training cell measured on more than one machine, and those cells (one row per cell and
    machine: its mean, repeats, machine, run). The variance between machines' means less
    the part their own repeats explain (s^2 / n), floored at 0."""
    rows = _training_ok(frame)
    if rows.empty or "record_path" not in rows:
        return NO_SPREAD, pd.DataFrame()
    from .runs import identity

    rows = rows.assign(cell_id=rows["record_path"].map(lambda p: identity(str(p))))
    between, within, df, cells, listed = 0.0, 0.0, 0, 0, []
    for cell, g in rows.groupby("cell_id"):
        by_machine = {}
        for _, r in g.iterrows():
            if "+" in str(r["machine"]):
                continue  # its repeats ran on several machines: neither one's
            logs = [math.log(v) for v in repeat_values(r, "tokens_per_s_per_gpu") if v > 0]
            if logs and r["machine"] not in by_machine:
                by_machine[r["machine"]] = (logs, r)
        if len(by_machine) < 2:
            continue
        means = [statistics.fmean(logs) for logs, _ in by_machine.values()]
        k = len(means)
        between += statistics.variance(means) * (k - 1)
        within += statistics.fmean(_sd(logs) ** 2 / len(logs) for logs, _ in by_machine.values()) * (k - 1)
        df += k - 1
        cells += 1
        for m, (logs, r) in by_machine.items():
            listed.append({"cell": cell, "machine": m, "run": r["run"], "repeats": len(logs),
                           "tokens_per_s_per_gpu": math.exp(statistics.fmean(logs))})
    if not df:
        return NO_SPREAD, pd.DataFrame(listed)
    return Spread(math.sqrt(max(0.0, (between - within) / df)), df, cells), pd.DataFrame(listed)


def pace(batch_size: object, technique: object) -> str:
    """How a training cell's step is paced, for its machine-to-machine spread: ``host`` where
    the host sets it (batch 1: launches and hooks outweigh the GPU's work; CPU offload: the
    optimizer steps on the host), ``gpu`` from GPU_PACED_BATCH a GPU up without offload, ``""``
    in between or unknown (not a training cell)."""
    try:
        batch = int(batch_size)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return ""
    if batch == 1 or "O" in str(technique).split("+"):
        return "host"
    return "gpu" if batch >= GPU_PACED_BATCH else ""


def pace_of(row: pd.Series | dict) -> str:
    """A tidy row's pace (``pace``); ``""`` for a record that is not a training cell's."""
    if row.get("stage") not in TRAINING_STAGES:
        return ""
    return pace(row.get("batch_size"), row.get("technique"))


def machine_spreads(frame: pd.DataFrame) -> dict[str, Spread]:
    """The machine spread (machine_spread) of every training cell (key ``""``) and of each pace
    class's cells (``host``, ``gpu``); a class with fewer than MIN_SPREAD_DF degrees of freedom
    takes the spread of every cell."""
    every = machine_spread(frame)[0]
    out = {"": every}
    rows = _training_ok(frame)
    paces = [pace_of(r) for _, r in rows.iterrows()]
    for cls in ("host", "gpu"):
        own = machine_spread(rows[[p == cls for p in paces]])[0]
        out[cls] = own if own.df >= MIN_SPREAD_DF else every
    return out


def _spread_of(spread: Spread | dict[str, Spread], side: Side) -> Spread:
    """The machine spread a side carries: its pace class's where the spreads are by class."""
    return spread.get(side.pace, spread[""]) if isinstance(spread, dict) else spread


def _side_var(side: Side, pooled: Spread) -> tuple[float, float, str]:
    """(variance of the side's mean log value, its degrees of freedom, a note)."""
    if side.n > 1:
        return _sd(side.logs) ** 2 / side.n, side.n - 1, ""
    if not side.noisy:
        return 0.0, float("inf"), "one measurement, no spread measured"
    return pooled.sd ** 2, pooled.df, "one repeat: pooled CV"


def ratio(a: Side, b: Side, pairing: str, pooled: Spread = NO_SPREAD,
          spread: Spread | dict[str, Spread] = NO_SPREAD) -> Estimate:
    """a / b with its 95 % interval (module docstring), ``pairing`` as the caller found it;
    ``spread``: the machine spread, one for every side or by pace class (machine_spreads)."""
    machines = tuple(sorted({a.machine, b.machine} - {""}))
    n = f"{a.n}/{b.n}"
    if a.exact and b.exact:
        if a.lower_bound or b.lower_bound:
            lo = a.point / b.point if a.lower_bound and not b.lower_bound else 0.0
            hi = math.inf if a.lower_bound else a.point / b.point
            if a.lower_bound and b.lower_bound:
                return Estimate(None, 0.0, math.inf, n, pairing, "both out of memory: no bound", machines)
            return Estimate(None, lo, hi, n, pairing, "out of memory: a bound", machines)
        v = a.point / b.point
        return Estimate(v, v, v, n, "exact" if pairing != "set" else pairing, "exact (deterministic)", machines)
    if pairing == "set":
        by_a = dict(zip(a.rounds, a.logs))
        by_b = dict(zip(b.rounds, b.logs))
        common = sorted(set(by_a) & set(by_b), key=str)
        if len(common) >= 2:
            d = [by_a[r] - by_b[r] for r in common]
            m, se = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d))
            t = t975(len(d) - 1)
            across = len({i for i, _ in by_a} & {i for i, _ in by_b}) - len(common)  # same round, two machines
            note = f"; {across} round(s) across machines left out" if across > 0 else ""
            sets = {r[0][0] for r in common if isinstance(r[0], tuple)}  # pooled sets' rounds: ((set, i), machine)
            where = f" from {len(sets)} sets" if len(sets) > 1 else ""
            return Estimate(math.exp(m), math.exp(m - t * se), math.exp(m + t * se), n, "set",
                            f"paired rounds ({len(d)}{where}), t({len(d) - 1}){note}", machines, len(d))
        # fewer than two common rounds: as two sides of one machine, or of two
        pairing = "machine" if a.machine == b.machine and "+" not in a.machine else "machines"
    va, dfa, na = _side_var(a, pooled)
    vb, dfb, nb = _side_var(b, pooled)
    parts = [(va, dfa), (vb, dfb)]
    notes = [x for x in (na, nb) if x]
    if pairing == "machines":
        sa, sb = _spread_of(spread, a), _spread_of(spread, b)
        parts += [(sa.sd ** 2, sa.df), (sb.sd ** 2, sb.df)]
        both = sa.pct() if sa == sb else f"{sa.pct()} / {sb.pct()}"
        notes.append(f"+ machine spread {both}" + ("" if sa.df and sb.df else " (none measured)"))
    var = sum(v for v, _ in parts)
    m = statistics.fmean(a.logs) - statistics.fmean(b.logs)
    if var <= 0:
        return Estimate(math.exp(m), math.exp(m), math.exp(m), n, pairing,
                        "; ".join(dict.fromkeys(notes)) or "no spread measured", machines)
    denom = sum(v * v / d for v, d in parts if v > 0 and d > 0)
    df = var * var / denom if denom else float("inf")
    t = t975(df) if math.isfinite(df) else Z975
    se = math.sqrt(var)
    method = f"Welch, t({df:.0f})" + (f"; {'; '.join(notes)}" if notes else "")
    return Estimate(math.exp(m), math.exp(m - t * se), math.exp(m + t * se), n, pairing, method, machines)


def value(a: Side, pooled: Spread = NO_SPREAD) -> Estimate:
    """One side's value with its 95 % interval (its repeats; one repeat: the pooled CV)."""
    machines = (a.machine,) if a.machine else ()
    if a.exact:
        if a.lower_bound:
            return Estimate(None, a.point, math.inf, str(a.n), "exact", "out of memory: a bound", machines)
        return Estimate(a.point, a.point, a.point, str(a.n), "exact", "exact", machines)
    var, df, note = _side_var(a, pooled)
    pairing, note = ("set", f"paired rounds ({a.n})") if a.paired_rounds else ("machine", note)
    m = statistics.fmean(a.logs)
    if var <= 0:
        return Estimate(math.exp(m), math.exp(m), math.exp(m), str(a.n), pairing, note or "no spread measured",
                        machines)
    t = t975(df)
    se = math.sqrt(var)
    method = f"{note}, t({df:.0f})" if a.paired_rounds else f"t({df:.0f})" + (f"; {note}" if note else "")
    return Estimate(math.exp(m), math.exp(m - t * se), math.exp(m + t * se), str(a.n), pairing, method, machines)


#: the most rounds in all a plan proposes for one comparison; beyond it the ratio sits too
#: close to its bound for more rounds of the same cells to decide it
MAX_ROUNDS = 60


def rounds_to_decide(est: Estimate | None, lo: float | None, hi: float | None) -> int | None:
    """How many more paired rounds, pooled with those of ``est`` (a set measuring each repeat
    alike), would clear the claim's nearest bound if the ratio and its round-to-round spread
    stay as measured: the least total N with t(N-1) s / sqrt(N) under the log distance from
    the value to that bound, less the rounds there are. None where ``est`` is not paired by
    round (or by fewer than two), has no spread, sits on a bound, or would need more than
    MAX_ROUNDS in all. A planning figure, not a promise: the next rounds move the mean too."""
    if est is None or est.pairing != "set" or est.rounds < 2:
        return None
    total = _total_to_decide(est, est.rounds, lo, hi)
    return None if total is None else total - est.rounds


def repeats_to_decide(est: Estimate | None, lo: float | None, hi: float | None) -> int | None:
    """How many repeats a new record of one cell would need for its value (a value check
    read from one record's own repeats, not paired by round) to clear the claim's nearest
    bound if the value and its repeat-to-repeat spread stay as measured: the least N with
    t(N-1) s / sqrt(N) under the log distance to that bound. A new record of the cell with
    more repeats replaces the one read (the stronger protocol: report/runs.py), so N is all
    its repeats, never pooled with the earlier ones. None where the value comes from fewer
    than two repeats (the pooled CV), from paired rounds, has no spread, sits on a bound, or
    would need more than MAX_ROUNDS. A planning figure, as rounds_to_decide's."""
    if est is None or est.rounds or not est.n.isdigit() or int(est.n) < 2:
        return None
    return _total_to_decide(est, int(est.n), lo, hi)


def _total_to_decide(est: Estimate, n: int, lo: float | None, hi: float | None) -> int | None:
    """The least N over n, up to MAX_ROUNDS, with t(N-1) s / sqrt(N) under the log distance
    from ``est``'s value to the claim's nearest bound, s the spread its interval of n
    measurements implies (half-width = t(n-1) s / sqrt(n)); None without one."""
    if est.value is None or est.lo <= 0:
        return None
    spread = (math.log(est.hi) - math.log(est.lo)) / 2 * math.sqrt(n) / t975(n - 1)
    gaps = [abs(math.log(est.value) - math.log(b)) for b in (lo, hi) if b is not None and b > 0]
    if not gaps or spread <= 0 or min(gaps) == 0:
        return None
    for total in range(n + 1, MAX_ROUNDS + 1):
        if t975(total - 1) * spread / math.sqrt(total) < min(gaps):
            return total
    return None


def judge(est: Estimate | None, lo: float | None, hi: float | None, strict_lo: bool = False,
          strict_hi: bool = False) -> str:
    """'holds' where the whole interval lies inside [lo, hi] (a strict bound excludes itself),
    'contradicts' where it lies wholly outside, 'inconclusive' where it straddles a bound,
    'missing' without an estimate."""
    if est is None:
        return "missing"

    def inside(x: float) -> bool:
        ok_lo = lo is None or (x > lo if strict_lo else x >= lo)
        ok_hi = hi is None or (x < hi if strict_hi else x <= hi)
        return ok_lo and ok_hi

    below = lo is not None and (est.hi <= lo if strict_lo else est.hi < lo)
    above = hi is not None and (est.lo >= hi if strict_hi else est.lo > hi)
    if below or above:
        return "contradicts"
    if inside(est.lo) and inside(est.hi):
        return "holds"
    return "inconclusive"
