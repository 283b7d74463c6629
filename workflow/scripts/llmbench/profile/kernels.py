"""Where a distributed training step's time goes by kernel class: communication (per
collective), memory copies (per direction) and compute, from a torch.profiler Chrome trace.
Paper Tables XIV (memcpy share per iteration, ZeRO-2/3), XV (AllReduce share) and XVI
(communication share, ZeRO-2/3).

Classes (GPU, CUDA activity of the trace):
  comm     NCCL kernels (``ncclDevKernel_<Op>...`` / ``ncclKernel_<Op>...``), per collective
  memcpy   ``gpu_memcpy`` events: HtoD (upload), DtoH (offload), DtoD
  compute  every other kernel
On a CPU platform (gloo) there are no kernels: comm is the time inside gloo's collective
ranges (``gloo:<op>``; gloo runs ReduceScatter as an AllReduce, and the range names what
gloo ran), memcpy does not exist (no device: reported as None, not 0), and compute is left
out.

Times are per iteration: the union of a class's intervals on the trace's timeline (so
kernels on several streams, or nested ranges, are not counted twice), divided by the
profiled steps. Shares are of the profiled step time (host clock, device synchronised at
both ends of the profiled window). ``comm_exposed`` is the part of communication that no
compute kernel overlaps (GPU only): what overlapping would still have to hide.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: how a worker names the Chrome trace it keeps beside its record: gzipped (torch.profiler
#: writes ``.gz`` itself), a tenth of the text or less; Perfetto, chrome://tracing and
#: TensorBoard open it as it is
TRACE_SUFFIX = ".trace.json.gz"


def load_events(path: Path | str) -> list[dict[str, Any]]:
    """A Chrome trace's events (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Reduce", "Broadcast", "SendRecv", "AllToAll")
_NCCL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_GLOO = {"gloo:all_reduce": "AllReduce", "gloo:all_gather": "AllGather", "gloo:reduce_scatter": "ReduceScatter",
         "gloo:reduce": "Reduce", "gloo:broadcast": "Broadcast", "gloo:all_to_all": "AllToAll",
         "gloo:send": "SendRecv", "gloo:recv": "SendRecv"}
_COPY = re.compile(r"Memcpy (HtoD|DtoH|DtoD|HtoH)")
COPIES = ("HtoD", "DtoH", "DtoD")
#: the flat summary keys a breakdown can have (the tidy table's columns)
COLUMNS = ["kernel_step_time_s", "comm_s_per_iter", "comm_share", "comm_exposed_s_per_iter", "memcpy_s_per_iter",
           "memcpy_share", "compute_s_per_iter", "compute_share"] + [
    f"{c}_{sub}_{k}" for c, subs in (("comm", COLLECTIVES), ("memcpy", COPIES)) for sub in subs
    for k in ("s_per_iter", "share")]

Interval = tuple[float, float]


def classify(event: dict[str, Any]) -> tuple[str, str] | None:
    """(class, sub-class) of one trace event, or None for events no class counts."""
    cat, name = event.get("cat"), str(event.get("name", ""))
    if cat == "kernel":
        m = _NCCL.match(name)
        if m:  # the longest known name it starts with ("ReduceScatter", not "Reduce")
            return "comm", max((c for c in COLLECTIVES if m.group(1).startswith(c)), key=len, default=m.group(1))
        return "compute", "kernel"
    if cat == "gpu_memcpy":
        m = _COPY.search(name)
        return "memcpy", m.group(1) if m else "other"
    if name in _GLOO:
        return "comm", _GLOO[name]
    return None


def _merged(intervals: Iterable[Interval]) -> list[Interval]:
    """Intervals merged into disjoint ones, in order."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_s(intervals: Iterable[Interval]) -> float:
    """Length of the union of [start, end) intervals (microseconds in, seconds out)."""
    return sum(e - s for s, e in _merged(intervals)) / 1e6


def _minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of the intervals ``a`` that no interval of ``b`` covers."""
    out: list[Interval] = []
    covered = _merged(b)
    for s, e in a:
        cur = s
        for ms, me in covered:
            if me <= cur or ms >= e:
                continue
            if ms > cur:
                out.append((cur, ms))
            cur = max(cur, me)
            if cur >= e:
                break
        if cur < e:
            out.append((cur, e))
    return out


def breakdown(events: Iterable[dict[str, Any]], steps: int, step_time_s: float, accelerator: str) -> dict[str, Any]:
    """Per-iteration seconds and shares of the step, by class and sub-class (flat keys)."""
    by: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        kind = classify(ev)
        if kind is not None:
            by[kind].append((float(ev["ts"]), float(ev["ts"]) + float(ev["dur"])))
    cls: dict[str, list[Interval]] = defaultdict(list)
    for (c, _), iv in by.items():
        cls[c].extend(iv)

    def per_iter(iv: list[Interval]) -> float:
        return union_s(iv) / steps

    out: dict[str, Any] = {"kernel_steps": steps, "kernel_step_time_s": step_time_s,
                           "kernel_source": "CUDA kernels" if accelerator == "cuda" else "gloo ranges (CPU)"}
    classes = ("comm", "memcpy", "compute") if accelerator == "cuda" else ("comm",)
    for c in classes:
        t = per_iter(cls[c])
        out[f"{c}_s_per_iter"], out[f"{c}_share"] = t, t / step_time_s if step_time_s else None
    if accelerator != "cuda":
        out["memcpy_s_per_iter"] = out["memcpy_share"] = None  # no device, no host<->device copy
    for (c, sub), iv in sorted(by.items()):
        if c in ("comm", "memcpy"):
            t = per_iter(iv)
            out[f"{c}_{sub}_s_per_iter"], out[f"{c}_{sub}_share"] = t, t / step_time_s if step_time_s else None
    if accelerator == "cuda":
        out["comm_exposed_s_per_iter"] = union_s(_minus(cls["comm"], cls["compute"])) / steps
    return out
