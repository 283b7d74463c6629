"""A serving engine's own torch.profiler trace (vLLM's ``--profiler-config``) -> its GPU
kernels by class: paper Table X's view of serving, measured on the engine that serves.

Classes (by kernel name; the first pattern that matches wins):
  comm          NCCL kernels (tensor parallel)
  gemm          GEMM kernels (cuBLAS/cuBLASLt ``nvjet``/``sm90_xmma``, CUTLASS, ``*gemm*``)
  attention     attention kernels (FlashAttention, ``*fmha*``, ``*attention*``)
  kv_cache      the KV-cache write (vLLM's ``reshape_and_cache``)
  rope          rotary embedding
  rmsnorm       RMSNorm (vLLM's ``rms_norm`` / ``fused_add_rms_norm``)
  sampling      logits to tokens (softmax/argmax/top-k/sort/penalties, sampler kernels)
  element_wise  every other kernel (SiLU-and-mul, adds, casts, copies done by kernels)
``gpu_memcpy``/``gpu_memset`` events are ``memcpy``. A class's time is the union of its
intervals on the trace's timeline; ``busy_s`` is the union of all of them (the time the
GPU did anything), so shares are of device-busy time. Pure: no torch import.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable

from .kernels import union_s

CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comm", re.compile(r"^nccl", re.IGNORECASE)),
    ("kv_cache", re.compile(r"reshape_and_cache|cache_kernel", re.IGNORECASE)),
    ("rope", re.compile(r"rotary|rope", re.IGNORECASE)),
    ("rmsnorm", re.compile(r"rms_?norm", re.IGNORECASE)),
    ("attention", re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|cutlass|cublas|nvjet|xmma|^sm\d+_", re.IGNORECASE)),
    ("sampling", re.compile(r"sampl|argmax|topk|top_k|sort|softmax|penalt|gumbel|multinomial", re.IGNORECASE)),
)
DEVICE_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memcpy"}
ORDER = ("gemm", "attention", "kv_cache", "rope", "rmsnorm", "element_wise", "sampling", "comm", "memcpy")


def kernel_class(name: str) -> str:
    """The class of one kernel, by its name."""
    for cls, pattern in CLASSES:
        if pattern.search(name):
            return cls
    return "element_wise"


def load_events(path: Path | str) -> list[dict[str, Any]]:
    """A Chrome trace's events (``.json`` or ``.json.gz``)."""
    p = Path(path)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as fh:
        data = json.load(fh)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarize(events: Iterable[dict[str, Any]], top: int = 25) -> dict[str, Any]:
    """Seconds and share of device-busy time per class, kernel counts, the top kernels by
    summed duration, and the CPU annotations that count engine steps."""
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    per_name: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    annotations: Counter[str] = Counter()
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        cat = ev.get("cat")
        if cat == "user_annotation" or cat == "gpu_user_annotation":
            annotations[str(ev.get("name"))] += 1
            continue
        kind = DEVICE_CATS.get(cat)
        if kind is None:
            continue
        name = str(ev.get("name", ""))
        cls = "memcpy" if kind == "memcpy" else kernel_class(name)
        start = float(ev["ts"])
        by[cls].append((start, start + float(ev["dur"])))
        per_name[name] += float(ev["dur"])
        calls[name] += 1
    every = [iv for ivs in by.values() for iv in ivs]
    busy = union_s(every)
    span = (max(e for _, e in every) - min(s for s, _ in every)) / 1e6 if every else 0.0
    classes = {c: {"s": union_s(by[c]), "share": union_s(by[c]) / busy if busy else None, "kernels": len(by[c])}
               for c in ORDER if by.get(c)}
    return {"busy_s": busy, "span_s": span, "classes": classes,
            "top_kernels": [{"name": n[:160], "s": t / 1e6, "calls": calls[n], "class": kernel_class(n)}
                            for n, t in per_name.most_common(top)],
            "annotations": dict(annotations.most_common(top))}


def summarize_file(path: Path | str, top: int = 25) -> dict[str, Any]:
    return summarize(load_events(path), top)


def format_summary(summary: dict[str, Any]) -> str:
    """A compact text table of a summary."""
    lines = [f"device busy {summary['busy_s']:.3f} s over a span of {summary['span_s']:.3f} s"]
    for cls, v in summary["classes"].items():
        lines.append(f"  {cls:<13} {v['s']:9.4f} s  {100 * (v['share'] or 0):5.1f} %  {v['kernels']:7d} kernels")
    lines.append("top kernels:")
    for k in summary["top_kernels"]:
        lines.append(f"  {k['s']:9.4f} s {k['calls']:7d}x  {k['class']:<12} {k['name'][:110]}")
    lines.append("annotations: " + ", ".join(f"{n} x{c}" for n, c in summary["annotations"].items()))
    return "\n".join(lines)
