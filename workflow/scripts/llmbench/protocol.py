"""The measurement protocol, written once: warm-up, measured steps, repeats, statistics.

Paper (Section IV-A): 30 warm-up steps, throughput averaged over 100 steps, 3 independent
runs, mean and standard deviation. Each repeat runs in its own process (llmbench.launch).
GPU time is read on the host clock after a device synchronize at both ends of the
measured window, so asynchronous kernels are inside it.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .config import check_schema, schema_defaults
from .provenance import cpu_times

#: the config schema's protocol entry: the defaults (the paper's) and bounds are written there
_SCHEMA = "/$defs/protocol"
_DEFAULTS = schema_defaults(_SCHEMA)


@dataclass(kw_only=True, slots=True, frozen=True)
class Protocol:
    """How one cell is measured (defaults and bounds: the config schema's ``protocol``)."""

    warmup_steps: int = _DEFAULTS["warmup_steps"]
    """Steps before timing starts (compilation, allocator warm-up)."""
    measured_steps: int = _DEFAULTS["measured_steps"]
    """Timed steps per repeat."""
    repeats: int = _DEFAULTS["repeats"]
    """Independent runs, each in a fresh process."""
    seq_len: int = _DEFAULTS["seq_len"]
    """Tokens per sample."""
    timeout_s: int = _DEFAULTS["timeout_s"]
    """Wall-clock limit per repeat; past it the cell is recorded as timeout."""
    seed: int = _DEFAULTS["seed"]
    """Seed for random weights and synthetic token ids."""

    def __post_init__(self) -> None:
        check_schema(asdict(self), _SCHEMA, "protocol.")


@dataclass(kw_only=True, slots=True, frozen=True)
class Window:
    """Timing of one repeat's measured window."""

    steps: int
    """Steps in the window."""
    elapsed_s: float
    """Wall-clock seconds of the window (device synchronised at both ends)."""
    step_times_s: tuple[float, ...]
    """Host-clock time between consecutive step returns (not synchronised per step)."""
    host: dict[str, float] | None = None
    """The host's CPUs over the window (host_cpu; None where they cannot be read)."""
    gc: dict[str, float] | None = None
    """Python's cyclic garbage collector in the window (GcClock.reading)."""

    def summary(self) -> dict[str, float]:
        """``window_<key>`` for each of ``host``'s and ``gc``'s keys: a repeat's summary entries."""
        return {f"window_{k}": v for k, v in {**(self.host or {}), **(self.gc or {})}.items()}


class GcClock:
    """What Python's cyclic garbage collector did while the clock is open (``gc.callbacks``):
    its collections, the full ones (generation 2) and the seconds they held the thread. A
    host-bound step (a small batch) can hide a collection's pause, which the step times
    show as an outlier; this says whether one fell in the window. The collector is left as
    it is: the window measures the process as a user runs it."""

    def __init__(self) -> None:
        self.seconds, self.collections, self.full = 0.0, 0, 0
        self._start: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1
            self.full += info.get("generation") == 2
            self._start = None

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def reading(self) -> dict[str, float]:
        """``gc_s``, ``gc_collections`` and ``gc_full_collections``."""
        return {"gc_s": self.seconds, "gc_collections": self.collections, "gc_full_collections": self.full}


def host_cpu(before: dict[str, int] | None, after: dict[str, int] | None, process_s: float) -> dict[str, float] | None:
    """What the host's CPUs did between two provenance.cpu_times readings: the share of the
    machine's CPU time stolen by the hypervisor (``cpu_steal_pct``: a VM host's other
    tenants), the share busy with anything (``host_busy_pct``: not idle, not waiting on
    I/O), and this process's own CPU seconds (``process_cpu_s``, every thread: a
    host-bound step's Python, DeepSpeed's CPU Adam). None where either reading is missing
    or no time passed."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in before}
    total = sum(delta.values())
    if total <= 0:
        return None
    return {"cpu_steal_pct": 100.0 * delta["steal"] / total,
            "host_busy_pct": 100.0 * (total - delta["idle"] - delta["iowait"]) / total,
            "process_cpu_s": process_s}


def run_window(step: Callable[[], None], protocol: Protocol, synchronize: Callable[[], None]) -> Window:
    """Run warm-up steps, then time ``measured_steps`` steps as one window, with what the
    host's CPUs did meanwhile (host_cpu: two reads of /proc/stat, outside the timed steps)
    and Python's garbage collector in it (GcClock)."""
    for _ in range(protocol.warmup_steps):
        step()
    synchronize()
    cpu_before, process_before = cpu_times(), time.process_time()
    with GcClock() as collector:
        start = last = time.perf_counter()
        marks = []
        for _ in range(protocol.measured_steps):
            step()
            now = time.perf_counter()
            marks.append(now - last)
            last = now
        synchronize()
        elapsed = time.perf_counter() - start
    host = host_cpu(cpu_before, cpu_times(), time.process_time() - process_before)
    return Window(steps=protocol.measured_steps, elapsed_s=elapsed, step_times_s=tuple(marks), host=host,
                  gc=collector.reading())


@dataclass(kw_only=True, slots=True, frozen=True)
class Summary:
    """Mean, sample standard deviation and the values themselves."""

    mean: float
    std: float
    values: tuple[float, ...]


def summarize(values: Sequence[float]) -> Summary:
    """Mean and sample standard deviation (n-1; 0 for a single value)."""
    vals = tuple(float(v) for v in values)
    if not vals:
        raise ValueError("no values to summarize")
    if not all(math.isfinite(v) for v in vals):
        raise ValueError(f"non-finite value in {vals}")
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return Summary(mean=statistics.fmean(vals), std=std, values=vals)
