"""Benchmark of the harness's overhead (numbers, not assertions; not collected by pytest).

For each technique (L, QL, Q by default) at batch 1 and at ``--batch``, the pipeline's cell
runs through the real launch path (llmbench.launch.run_repeat: the DeepSpeed worker in its
own process, as every cell runs) and, beside it in a process of its own, a plain PyTorch
(+PEFT) loop trains the same model: built by the worker's own builder
(deepspeed_worker.build_model: the same random Llama, attention kernel, 4-bit layers and
adapters; the LoRA settings are the grid's, from the schema's defaults), the same
synthetic ids (llmbench.train.scenario), parameters in the compute dtype as DeepSpeed's
bf16 mode casts them, AdamW with the cells' settings (fused on CUDA, foreach on a CPU) on
the trainable parameters, gradient clipping at 1.0 as the cells. Both are timed the same
way: warm-up steps, a device synchronize, ``--steps`` steps, a synchronize. The plain loop
keeps no fp32 master copy of the trainable parameters and no fp32 gradient buffer, as
DeepSpeed's bf16 mode does: what that and DeepSpeed's engine cost is in the ratio. Printed: tokens/s
of each, cell / plain, and peak allocated memory; ``--rounds`` alternates the two that many
times (medians; a 7B LoRA step at batch 1 is host-bound and moves between windows).

    # one GPU (deepspeed, bitsandbytes, peft on PYTHONPATH, e.g. /tmp/site from envs/offline-run.sh)
    python3 tests/bench_overhead.py --model llama2-7b --device cuda --batch 8 --rounds 3 --json overhead.json
    # the CPU smoke run (fp32, the CPU platform's dtype)
    .venv/bin/python tests/bench_overhead.py --model tiny --device cpu --batch 4 --warmup 2 --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))

#: --device -> the platform a cell runs on when --platform is not given
DEFAULT_PLATFORM = {"cpu": "cpu", "cuda": "h100"}


def cell_spec(technique: str, model: str, platform: str, batch: int, warmup: int, steps: int, seq_len: int,
              timeout_s: int) -> dict:
    """The resolved spec of the pipeline's cell (llmbench.grid): a finetune cell for a
    fine-tuning method, a pretrain cell otherwise; LoRA settings are the schema's defaults."""
    from llmbench import grid, techniques

    stage = "finetune" if techniques.parse(technique).adapter else "pretrain"
    g = grid.expand({
        "protocol": {"warmup_steps": warmup, "measured_steps": steps, "repeats": 1, "seq_len": seq_len,
                     "timeout_s": timeout_s},
        stage: [{"platforms": [platform], "models": [model], "techniques": [technique], "batch_sizes": [batch]}],
    })
    return g.spec(g.cells[0])


def run_cell(spec: dict, workdir: Path, index: int, threads: int) -> dict:
    """The cell's repeat through the launcher, as the workflow runs it."""
    from llmbench import launch

    log = workdir / f"cell-{index}.log"
    outcome = launch.run_repeat(spec, workdir, index, log, threads)
    if outcome.status != "ok":
        return {"status": outcome.status, "reason": outcome.reason.strip().splitlines()[-1:] or [""], "log": str(log)}
    r = outcome.result
    return {"status": "ok", "tokens_per_s": r["tokens_per_s"], "peak_mem_allocated_gib": r["peak_mem_allocated_gib"],
            "peak_rss_gib": r["peak_rss_gib"], "attention": r["attention"], "trainable_params": r["trainable_params"]}


def run_plain(spec: dict, workdir: Path, index: int, threads: int) -> dict:
    """The plain loop of the same cell, in a process of its own (``--plain-child``)."""
    from llmbench import launch

    spec_path, out, log = (workdir / f"plain-{index}.{ext}" for ext in ("spec.json", "json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = launch.worker_env(spec["platform"]["env"], threads, 1)  # the cell's threads and variables
    timeout_s = spec["cell"]["protocol"]["timeout_s"]
    with open(log, "w") as fh:
        try:
            proc = subprocess.run([sys.executable, __file__, "--plain-child", str(spec_path), str(out)], env=env,
                                  stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "reason": [f"past {timeout_s} s"], "log": str(log)}
    if proc.returncode != 0 or not out.exists():
        lines = log.read_text().strip().splitlines()
        return {"status": "error", "reason": lines[-1:] or [f"exit {proc.returncode}"], "log": str(log)}
    return {"status": "ok", **json.loads(out.read_text())}


def plain_loop(spec: dict) -> dict:
    """Train the cell's model with a plain PyTorch loop; tokens/s and peak memory."""
    import torch

    from llmbench import platforms
    from llmbench.cells import Cell
    from llmbench.models import ModelSpec
    from llmbench.train import contract, scenario
    from llmbench.train.deepspeed_worker import build_model

    cell, model_spec = Cell.from_dict(spec["cell"]), ModelSpec(**spec["model"])
    accelerator, proto = spec["platform"]["accelerator"], cell.protocol
    cuda = accelerator == "cuda"
    device = contract.local_device(accelerator)
    dtype = platforms.compute_dtype(spec["platform"])
    scenario.seed(proto.seed)
    built = build_model(cell, model_spec, accelerator, device, dtype)
    model = built.model
    for p in model.parameters():  # DeepSpeed's bf16 mode casts every floating parameter so
        if p.dtype.is_floating_point and p.dtype != dtype:
            p.data = p.data.to(dtype)
    params = built.params
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            **({"fused": True} if cuda else {"foreach": True}))
    ids = scenario.synthetic_ids(model_spec.vocab_size, cell.batch_size, proto.seq_len, proto.seed, 0, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step():
        with built.attn_ctx():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(proto.warmup_steps):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(proto.measured_steps):
        loss = step()
    sync()
    elapsed = time.perf_counter() - start
    peak = scenario.peak_memory(device, accelerator)
    return {"tokens_per_s": cell.batch_size * proto.seq_len * proto.measured_steps / elapsed,
            "peak_mem_allocated_gib": peak.allocated_gib, "peak_rss_gib": peak.rss_gib, "attention": built.attn_label,
            "trainable_params": sum(p.numel() for p in params), "loss_last": float(loss.float().item())}


def median(rounds: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rounds if r["status"] == "ok" and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain-child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="tiny", help="config/models/<name>.yaml (default tiny)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--platform", default=None, help="config/platforms/<name>.yaml (default: cpu, or h100 on cuda)")
    ap.add_argument("--techniques", default="L,QL,Q", help="comma-separated (default L,QL,Q)")
    ap.add_argument("--batch", type=int, default=8, help="the larger batch, measured besides batch 1 (default 8)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=350)
    ap.add_argument("--rounds", type=int, default=1, help="plain/cell pairs per point; medians are printed")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--json", type=Path, default=None, help="also write every round's numbers here")
    args = ap.parse_args(argv)
    if args.plain_child:
        spec_path, out = map(Path, args.plain_child)
        out.write_text(json.dumps(plain_loop(json.loads(spec_path.read_text()))))
        return 0

    import pandas as pd

    platform = args.platform or DEFAULT_PLATFORM[args.device]
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    rows, index = [], 0
    # device memory allocated on a GPU; on a CPU the host's peak RSS (no allocator statistics there)
    peak_key = "peak_mem_allocated_gib" if args.device == "cuda" else "peak_rss_gib"
    for technique in args.techniques.split(","):
        for batch in sorted({1, args.batch}):
            spec = cell_spec(technique, args.model, platform, batch, args.warmup, args.steps, args.seq_len,
                             args.timeout_s)
            plain, cell = [], []
            for _ in range(args.rounds):
                plain.append(run_plain(spec, workdir, index, args.threads))
                cell.append(run_cell(spec, workdir, index, args.threads))
                index += 1
            p_tps, c_tps = median(plain, "tokens_per_s"), median(cell, "tokens_per_s")
            status = "; ".join(f"{side} {r['status']}: {' '.join(r['reason'])} ({r['log']})"
                               for side, rs in (("plain", plain), ("cell", cell)) for r in rs if r["status"] != "ok")
            rows.append({"technique": technique, "batch": batch, "plain_tokens_per_s": p_tps,
                         "cell_tokens_per_s": c_tps, "cell_over_plain": c_tps / p_tps if p_tps and c_tps else None,
                         "plain_peak_gib": median(plain, peak_key), "cell_peak_gib": median(cell, peak_key),
                         "attention": next((r["attention"] for r in cell + plain if r["status"] == "ok"), None),
                         "status": status or "ok", "plain_rounds": plain, "cell_rounds": cell})
            print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_rounds")}), file=sys.stderr,
                  flush=True)
    table = pd.DataFrame(rows).drop(columns=["plain_rounds", "cell_rounds"])
    print(f"model {args.model}, platform {platform}, seq {args.seq_len}, {args.warmup} warm-up + {args.steps} "
          f"measured steps, {args.rounds} round(s), medians; peak: {peak_key}; logs in {workdir}")
    with pd.option_context("display.width", 200, "display.max_colwidth", 80, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "platform": platform,
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
