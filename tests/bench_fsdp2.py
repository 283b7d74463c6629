"""Benchmark of the FSDP2 backend against a plain FSDP2 loop (numbers, not assertions; not
collected by pytest).

For each technique (Z3, Z2 by default) at batch 1 and at ``--batch`` (or at ``--batch`` alone,
``--no-batch-1``), the pipeline's FSDP2
cell runs through the real launch path (llmbench.launch.run_repeat: the fsdp2 worker on
``--gpus`` ranks, as every cell runs) and, beside it, a plain FSDP2 loop written here as
torchtitan's recipe and PyTorch's FSDP2 tutorial write it trains the same model: a Llama
built on the meta device from the cell's model config, ``fully_shard`` on each decoder layer
(resharding after forward for Z3, not for Z2) and on the root,
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, fp32 parameters, random
normal(0, 0.02) weights, recomputation of each layer with R, fused AdamW with the cells'
settings, clipping at 1.0, the same synthetic ids. It shares nothing with the worker but the
model's config and the attention kernel the cell's technique selects
(llmbench.train.build.attention_choice), so a cost the worker adds (its scenario, its
build) shows in the ratio. Both are timed the same way: warm-up steps, a device synchronize,
``--steps`` steps, a synchronize. Printed per point: tokens/s of each (medians over
``--rounds``, the two alternating), cell / plain, each side's coefficient of variation and
peak allocated memory. The goal for the pipeline's cell: 0.97 of the plain loop or better at
the largest batch.

    # one GPU (the GPU image's torch, transformers and peft suffice)
    python3 tests/bench_fsdp2.py --model llama2-7b --device cuda --techniques Z3,Z2,F+Z3 --batch 8 --rounds 3
    # a searched largest batch alone (the search's answer for the technique on that GPU)
    python3 tests/bench_fsdp2.py --model llama2-7b --device cuda --techniques Z3 --batch 9 --no-batch-1
    # the CPU smoke run (gloo, fp32)
    .venv/bin/python tests/bench_fsdp2.py --model tiny --device cpu --batch 2 --warmup 1 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "workflow" / "scripts"))
sys.path.insert(0, str(REPO / "tests"))

# the launch path, statistics and output of the DeepSpeed overhead benchmark
from bench_overhead import cv, emit, failures, median, platform_for, print_table, run_cell  # noqa: E402

#: AdamW as the cells step (llmbench.train.fsdp2_worker.ADAMW, written out: the loop shares nothing with it).
ADAMW = dict(lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


def cell_spec(technique: str, model: str, platform: str, batch: int, gpus: int, warmup: int, steps: int,
              seq_len: int, timeout_s: int) -> dict:
    """The resolved spec of the pipeline's FSDP2 pre-training cell (llmbench.grid)."""
    from llmbench import grid

    g = grid.expand({
        "protocol": {"warmup_steps": warmup, "measured_steps": steps, "repeats": 1, "seq_len": seq_len,
                     "timeout_s": timeout_s},
        "pretrain": [{"backend": "fsdp2", "platforms": [platform], "models": [model], "techniques": [technique],
                      "batch_sizes": [batch], "gpus": gpus}],
    })
    return g.spec(g.cells[0])


def plain_loop(spec: dict) -> dict | None:
    """One rank of the plain FSDP2 loop (torchrun sets the rank); rank 0's numbers."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import LlamaForCausalLM

    from llmbench import platforms
    from llmbench.cells import Cell
    from llmbench.models import ModelSpec
    from llmbench.train import build, contract, scenario

    cell, model_spec = Cell.from_dict(spec["cell"]), ModelSpec(**spec["model"])
    accelerator, proto, tech = spec["platform"]["accelerator"], cell.protocol, cell.tech
    cuda = accelerator == "cuda"
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    device = contract.local_device(accelerator)
    if cuda:
        torch.cuda.set_device(device)
    dtype = platforms.compute_dtype(spec["platform"])
    torch.manual_seed(proto.seed)
    attn_impl, attn_ctx, attn_label = build.attention_choice(tech, accelerator)
    config = model_spec.hf_config(attn_implementation=attn_impl)
    with torch.device("meta"):
        model = LlamaForCausalLM._from_config(config, dtype=torch.float32)
    model.config.use_cache = False
    if tech.recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=None if dtype == torch.float32 else dtype, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=tech.zero_stage == 3)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)
    model.to_empty(device=device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # RMSNorm
                p.fill_(1.0)
            else:
                p.normal_(0.0, config.initializer_range)
    with torch.device(device):  # RoPE's inverse frequencies: a buffer the meta build left empty
        model.model.rotary_emb = type(model.model.rotary_emb)(config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, **ADAMW, fused=cuda, foreach=not cuda)
    rank, world = dist.get_rank(), dist.get_world_size()
    ids = scenario.synthetic_ids(model_spec.vocab_size, cell.batch_size, proto.seq_len, proto.seed, rank, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        with attn_ctx():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(proto.warmup_steps):
        step()
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(proto.measured_steps):
        loss = step()
    sync()
    took = time.perf_counter() - start
    peak = scenario.peak_memory(device, accelerator)
    loss_last = float(loss.detach().float().item())
    dist.destroy_process_group()
    if rank:
        return None
    return {"tokens_per_s": world * cell.batch_size * proto.seq_len * proto.measured_steps / took,
            "peak_mem_allocated_gib": peak.allocated_gib, "peak_rss_gib": peak.rss_gib, "attention": attn_label,
            "loss_last": loss_last}


def run_plain(spec: dict, workdir: Path, index: int, threads: int) -> dict:
    """The plain loop on the cell's ranks, under torchrun, in processes of their own."""
    from llmbench import launch

    spec_path, out, log = (workdir / f"plain-{index}.{ext}" for ext in ("spec.json", "json", "log"))
    spec_path.write_text(json.dumps(spec))
    gpus = spec["cell"]["gpus"]
    env = launch.worker_env(spec["platform"]["env"], threads, gpus)
    timeout_s = spec["cell"]["protocol"]["timeout_s"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", __file__,
           "--plain-child", str(spec_path), str(out)]
    with open(log, "w") as fh:
        try:
            proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "reason": [f"past {timeout_s} s"], "log": str(log)}
    if proc.returncode != 0 or not out.exists():
        lines = log.read_text().strip().splitlines()
        errors = [x for x in lines if "Error" in x and not x.startswith("torch.distributed.elastic")]
        return {"status": "error", "reason": errors[-1:] or lines[-1:] or [f"exit {proc.returncode}"], "log": str(log)}
    return {"status": "ok", **json.loads(out.read_text())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain-child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="tiny", help="config/models/<name>.yaml (default tiny)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--platform", default=None, help="config/platforms/<name>.yaml (default: cpu, or on cuda the "
                    "platform whose gpu_name the GPU's name holds)")
    ap.add_argument("--techniques", default="Z3,Z2", help="comma-separated FSDP2 flags (default Z3,Z2)")
    ap.add_argument("--batch", type=int, default=8, help="the larger batch, measured besides batch 1 (default 8)")
    ap.add_argument("--no-batch-1", action="store_true",
                    help="measure --batch alone: a searched largest batch in a call too short for both points")
    ap.add_argument("--gpus", type=int, default=1, help="ranks of both sides (default 1)")
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
        result = plain_loop(json.loads(spec_path.read_text()))
        if result is not None:
            out.write_text(json.dumps(result))
        return 0
    if args.batch < 1 or args.gpus < 1:
        ap.error(f"--batch and --gpus: at least 1; got {args.batch} and {args.gpus}")

    try:
        platform, gpu_state = platform_for(args.device, args.platform, args.gpus)
    except ValueError as e:
        ap.error(str(e))
    workdir = Path(tempfile.mkdtemp(prefix="bench-fsdp2-"))
    peak_key = "peak_mem_allocated_gib" if args.device == "cuda" else "peak_rss_gib"
    rows, index = [], 0
    for technique in args.techniques.split(","):
        for batch in [args.batch] if args.no_batch_1 else sorted({1, args.batch}):
            spec = cell_spec(technique, args.model, platform, batch, args.gpus, args.warmup, args.steps,
                             args.seq_len, args.timeout_s)
            plain, cell = [], []
            for _ in range(args.rounds):
                plain.append(run_plain(spec, workdir, index, args.threads))
                cell.append(run_cell(spec, workdir, index, args.threads))
                index += 1
            p_tps, c_tps = median(plain, "tokens_per_s"), median(cell, "tokens_per_s")
            status = failures(plain, cell)
            rows.append({"technique": technique, "batch": batch, "gpus": args.gpus, "plain_tokens_per_s": p_tps,
                         "cell_tokens_per_s": c_tps, "cell_over_plain": c_tps / p_tps if p_tps and c_tps else None,
                         "plain_cv": cv(plain), "cell_cv": cv(cell),
                         "plain_peak_gib": median(plain, peak_key), "cell_peak_gib": median(cell, peak_key),
                         "attention": next((r["attention"] for r in cell + plain if r["status"] == "ok"), None),
                         "status": status or "ok", "plain_rounds": plain, "cell_rounds": cell})
            emit(rows, args, platform, gpu_state)
    print_table(rows, f"model {args.model}, platform {platform}, {args.gpus} rank(s), seq {args.seq_len}, "
                f"{args.warmup} warm-up + {args.steps} measured steps, {args.rounds} round(s), medians; peak: "
                f"{peak_key}; logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
