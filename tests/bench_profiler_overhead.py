"""Benchmark of what profiling costs a training step (numbers, not assertions).

The profile cells' phase walls on a GPU are those of unprofiled steps
(llmbench.profile.attribution.step_walls) because torch.profiler costs host time per
operator and kernel. This measures that cost: the profile worker's step (plain PyTorch,
AdamW, a device synchronize after each phase) timed plain, inside the worker's module
hooks (llmbench.profile.worker.instrument), under torch.profiler, and under both; median
ms per phase over ``--steps`` steps after ``--warmup``.

    python tests/bench_profiler_overhead.py [--model llama2-7b] [--cells F:2,Naive:2,R:8]

Needs torch, transformers, pyyaml and jsonschema (the venv, or a GPU machine's Python with
PYTHONPATH=/tmp/site after envs/offline-run.sh). --accelerator cpu --model tiny checks that
it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from llmbench import techniques  # noqa: E402
from llmbench.models import ModelSpec  # noqa: E402
from llmbench.profile.worker import instrument  # noqa: E402
from llmbench.train import build  # noqa: E402


def cell_times(model_name: str, technique: str, batch: int, accelerator: str, warmup: int, steps: int) -> dict:
    """Median ms per phase and step for each variant of one cell."""
    tech = techniques.parse(technique)
    spec = ModelSpec.load(model_name, REPO)
    cuda = accelerator == "cuda"
    attn_impl, attn_ctx, _ = build.attention_choice(tech, accelerator)
    dtype = torch.bfloat16 if cuda else torch.float32
    model = build.build_llama(spec, attn_impl, dtype, "cuda" if cuda else "cpu")
    if tech.recompute:
        build.enable_recompute(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, **({"fused": True} if cuda else {"foreach": True}))
    ids = torch.randint(0, spec.vocab_size, (batch, 350), device=params[0].device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step() -> list[float]:
        """One step as the profile worker runs it: host clock at the start and after each phase."""
        marks = [time.perf_counter()]
        with record_function("forward"), attn_ctx():
            loss = model(input_ids=ids, labels=ids).loss
            sync()
        marks.append(time.perf_counter())
        with record_function("backward"), attn_ctx():
            loss.backward()
            sync()
        marks.append(time.perf_counter())
        with record_function("optimizer"):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        marks.append(time.perf_counter())
        return marks

    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    variants = {
        "plain": lambda: [],
        "module hooks": lambda: [instrument(model)],
        "profiler": lambda: [profile(activities=activities)],
        "hooks + profiler": lambda: [instrument(model), profile(activities=activities)],
    }
    out = {}
    for name, contexts in variants.items():
        with contextlib.ExitStack() as stack:
            for ctx in contexts():
                stack.enter_context(ctx)
            marks = [step() for _ in range(steps)]
        phases = [1e3 * statistics.median(m[i + 1] - m[i] for m in marks) for i in range(3)]
        out[name] = phases + [sum(phases)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--cells", default="F:2,Naive:2,R:8", help="technique:batch, comma-separated")
    ap.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args(argv)
    print("| cell | variant | forward ms | backward ms | optimizer ms | step ms |\n|---|---|---|---|---|---|")
    for item in args.cells.split(","):
        technique, batch = item.split(":")
        times = cell_times(args.model, technique, int(batch), args.accelerator, args.warmup, args.steps)
        for variant, (f, b, o, s) in times.items():
            print(f"| {technique} bs{batch} | {variant} | {f:.1f} | {b:.1f} | {o:.1f} | {s:.1f} |", flush=True)
        if args.accelerator == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
