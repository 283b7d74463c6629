"""Benchmark of the harness's overhead (numbers, not assertions; not collected by pytest).

For each technique (L, QL, Q by default) at batch 1 and at ``--batch`` (a number, or
``searched``: each technique's largest batch, as the committed max-batch searches found it
for the model and platform, searched_batch), the pipeline's cell
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
times (medians; a 7B LoRA step at batch 1 is host-bound and moves between windows), and
gives each side's coefficient of variation over its rounds (``plain_cv``, ``cell_cv``): with
the paper's 30 + 100 steps and 3 rounds, whether a cell's spread between its repeats is the
harness's and DeepSpeed's or already the plain loop's on that machine.

The plain child also times ``--variants`` of its loop on the same model (VARIANTS), to split
the cell's cost: ``overflow`` adds DeepSpeed's own per-tensor gradient-overflow check (what
its bf16 mode runs at ZeRO stage 0, a host read per trainable tensor), ``master`` adds fp32
master weights and gradients as DeepSpeed's bf16 mode keeps them. Each is printed over the
plain loop of the same child (``overflow_over_plain``, ``master_over_plain``).

    # one GPU (deepspeed, bitsandbytes, peft on PYTHONPATH, e.g. /tmp/site from envs/offline-run.sh)
    python3 tests/bench_overhead.py --model llama2-7b --device cuda --batch 8 --rounds 3 --json overhead.json
    # the run-to-run spread under the paper's protocol, at batch 1 only (plain_cv beside cell_cv)
    python3 tests/bench_overhead.py --model llama2-7b --device cuda --techniques L --batch 1 --rounds 3 \
        --warmup 30 --steps 100 --variants plain --json spread.json
    # at each technique's searched largest batch (results/reference's searches for llama2-7b on h100)
    python3 tests/bench_overhead.py --model llama2-7b --device cuda --batch searched --json overhead.json
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


def gpu_platform(names: list[str]) -> str:
    """The platform (config/platforms) a run on GPUs of these NVML product names takes when
    --platform is not given: the one whose ``gpu_name`` every name contains, the one with the
    fewest GPUs a node where several do (h200 before h200x4). ValueError naming the GPUs
    where none matches."""
    from llmbench.platforms import Platform
    from llmbench.config import available

    found = [p for p in map(Platform.load, available("platform")) if p.accelerator == "cuda" and p.gpu_name
             and all(p.gpu_name.lower() in n.lower() for n in names)]
    if not found:
        raise ValueError(f"no config/platforms/*.yaml has a gpu_name in GPU name(s) {names}: pass --platform")
    return min(found, key=lambda p: (p.gpus_per_node, p.name)).name


def platform_for(device: str, platform: str | None, count: int = 1) -> tuple[str, list[dict]]:
    """(platform, the state of the GPUs as llmbench.gpus reads it) a run on ``device`` takes:
    the CPU platform on a CPU; on CUDA the ``count`` GPUs the cells run on
    (llmbench.gpus.cell_gpu_ids), its platform from their name unless ``platform`` names one,
    which must match them as a pipeline cell's must (llmbench.gpus.wrong_gpu_reason).
    ValueError otherwise."""
    from llmbench import gpus
    from llmbench.platforms import Platform

    if device == "cpu":
        return platform or "cpu", []
    found = gpus.read_nvml(gpus.cell_gpu_ids(count, "cuda"))
    if platform is None:
        return gpu_platform([g.name for g in found]), [g.to_dict() for g in found]
    if wrong := gpus.wrong_gpu_reason(found, Platform.load(platform).gpu_name, platform):
        raise ValueError(f"--platform {platform}: {wrong}")
    return platform, [g.to_dict() for g in found]


def cell_spec(technique: str, model: str, platform: str, batch: int, warmup: int, steps: int, seq_len: int,
              timeout_s: int) -> dict:
    """The resolved spec of the pipeline's cell (llmbench.grid) on one GPU: a finetune cell for
    a fine-tuning method, a pretrain cell otherwise; LoRA settings are the schema's defaults."""
    from llmbench import grid, techniques

    stage = "finetune" if techniques.parse(technique).adapter else "pretrain"
    g = grid.expand({
        "protocol": {"warmup_steps": warmup, "measured_steps": steps, "repeats": 1, "seq_len": seq_len,
                     "timeout_s": timeout_s},
        # one GPU: the plain loop is one process (the h200 platform's node is a pair)
        stage: [{"platforms": [platform], "models": [model], "techniques": [technique], "batch_sizes": [batch],
                 "gpus": 1}],
    })
    return g.spec(g.cells[0])


def searched_batch(spec: dict, reference: Path) -> int:
    """The largest batch of ``spec``'s cell (any batch size) that the max-batch searches in
    the results folders under ``reference`` found: the search the report reads where several
    folders hold it (llmbench.report.runs.choose_searches), at the batch its cell is measured
    (llmbench.search.measured_batch). The search must have ended with its answer (status ok;
    one a probe's error stopped has a lower bound only) and probed the spec's sequence length.
    ValueError, naming the technique and where it looked, where none did."""
    from llmbench import cells
    from llmbench.report import runs
    from llmbench.search import measured_batch, read_summary

    cell = spec["cell"]
    key = cells.Cell.from_dict(cell).key
    search = cells.SEARCH_PATTERN.format(**key)
    seq_len = cell["protocol"]["seq_len"]
    found = [str(f) for f in sorted(reference.glob(f"*/{search}"))
             if any(json.loads(r.read_text())["cell"]["protocol"]["seq_len"] == seq_len
                    for r in f.glob("bs*/record.json"))]
    for folder in runs.choose_searches(found):  # one, or none: each found folder holds the same search
        batch = measured_batch(folder) if read_summary(folder)["status"] == "ok" else None
        if batch is not None:
            return batch
    raise ValueError(f"--batch searched: no max-batch search of {key['technique']} ({key['model']} on "
                     f"{key['platform']}, seq {seq_len}) found a batch under {reference}/*/{search}")


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


def run_plain(spec: dict, workdir: Path, index: int, threads: int, variants: tuple[str, ...]) -> dict:
    """The plain loop of the same cell and its ``variants``, in a process of its own (``--plain-child``)."""
    from llmbench import launch

    spec_path, out, log = (workdir / f"plain-{index}.{ext}" for ext in ("spec.json", "json", "log"))
    spec_path.write_text(json.dumps(spec))
    env = launch.worker_env(spec["platform"]["env"], threads, 1)  # the cell's threads and variables
    timeout_s = spec["cell"]["protocol"]["timeout_s"]
    with open(log, "w") as fh:
        try:
            proc = subprocess.run([sys.executable, __file__, "--plain-child", str(spec_path), str(out),
                                   "--variants", ",".join(variants)], env=env,
                                  stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "reason": [f"past {timeout_s} s"], "log": str(log)}
    if proc.returncode != 0 or not out.exists():
        lines = log.read_text().strip().splitlines()
        return {"status": "error", "reason": lines[-1:] or [f"exit {proc.returncode}"], "log": str(log)}
    return {"status": "ok", **json.loads(out.read_text())}


#: The plain loop's variants, each timed in the same child on the same model (--variants).
#: ``plain``: bf16 parameters, gradients and AdamW; what the cell would cost without an engine.
#: ``overflow``: plain plus DeepSpeed's own gradient-overflow check as its bf16 mode (FP16_Optimizer,
#: ZeRO stage 0) runs it every step (deepspeed.runtime.utils.CheckOverflow.has_overflow: one
#: reduction and one host read per trainable tensor).
#: ``master``: mixed precision as DeepSpeed's bf16 mode keeps it (fp32 master weights and
#: gradients, AdamW on fp32, bf16 copies back), written with torch's multi-tensor ops.
VARIANTS = ("plain", "overflow", "master")


def plain_loop(spec: dict, variants: tuple[str, ...] = ("plain",)) -> dict:
    """Train the cell's model with a plain PyTorch loop, one timed window per variant
    (VARIANTS) in this order and the plain one again at the end; tokens/s of each (plain:
    the mean of its two windows), peak memory over all of them."""
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
    adamw = dict(lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                 **({"fused": True} if cuda else {"foreach": True}))
    ids = scenario.synthetic_ids(model_spec.vocab_size, cell.batch_size, proto.seq_len, proto.seed, 0, device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def backward():
        with built.attn_ctx():
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        return loss

    def make_step(variant: str):
        if variant == "master":
            master = [p.detach().float().clone().requires_grad_(True) for p in params]
            opt = torch.optim.AdamW(master, **adamw)

            def step():
                loss = backward()
                for m, p in zip(master, params):  # fp32 gradients (DeepSpeed flattens them into one buffer)
                    m.grad = p.grad.float()
                    p.grad = None
                torch.nn.utils.clip_grad_norm_(master, 1.0, foreach=True)
                opt.step()
                opt.zero_grad(set_to_none=True)
                torch._foreach_copy_([p.data for p in params], master)  # bf16 weights from the masters
                return loss
            return step

        opt = torch.optim.AdamW(params, **adamw)
        checker = None
        if variant == "overflow":
            from deepspeed.runtime.utils import CheckOverflow

            checker = CheckOverflow(param_groups=[params])

        def step():
            loss = backward()
            if checker is not None and checker.check():
                raise RuntimeError("DeepSpeed's overflow check found a non-finite gradient")
            torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def window(variant: str) -> float:
        nonlocal loss
        step = make_step(variant)
        for _ in range(proto.warmup_steps):
            step()
        sync()
        start = time.perf_counter()
        for _ in range(proto.measured_steps):
            loss = step()
        sync()
        return cell.batch_size * proto.seq_len * proto.measured_steps / (time.perf_counter() - start)

    loss = None
    # plain first and again last: the reference is their mean, so a drift of the machine
    # over the child's windows (clocks, a host-bound step's jitter) does not land on one variant
    tps = {v: window(v) for v in variants}
    if len(variants) > 1:
        tps["plain_last"] = window("plain")
        tps["plain_first"] = tps["plain"]
        tps["plain"] = statistics.fmean([tps["plain_first"], tps["plain_last"]])
    peak = scenario.peak_memory(device, accelerator)
    return {"tokens_per_s": tps["plain"], "variants_tokens_per_s": tps,
            "peak_mem_allocated_gib": peak.allocated_gib, "peak_rss_gib": peak.rss_gib, "attention": built.attn_label,
            "trainable_params": sum(p.numel() for p in params), "trainable_tensors": len(params),
            "loss_last": float(loss.float().item())}


def median(rounds: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rounds if r["status"] == "ok" and r.get(key) is not None]
    return statistics.median(vals) if vals else None


def cv(rounds: list[dict], key: str = "tokens_per_s") -> float | None:
    """The coefficient of variation of ``key`` over the ok rounds (sample standard deviation
    over the mean, llmbench.protocol.summarize), None under two. Each round is a process of
    its own, as each of the protocol's repeats is: the plain loop's is the run-to-run spread
    of the machine and the model's step without DeepSpeed or the harness, beside the cell's."""
    from llmbench.protocol import summarize

    vals = [r[key] for r in rounds if r["status"] == "ok" and r.get(key) is not None]
    if len(vals) < 2:
        return None
    s = summarize(vals)
    return s.std / s.mean


def failures(plain: list[dict], cell: list[dict]) -> str:
    """Each round that was not ok, side by side: its status, reason and log ('' where all were)."""
    return "; ".join(f"{side} {r['status']}: {' '.join(r['reason'])} ({r['log']})"
                     for side, rs in (("plain", plain), ("cell", cell)) for r in rs if r["status"] != "ok")


def emit(rows: list[dict], args: argparse.Namespace, platform: str, gpu_state: list[dict]) -> None:
    """The last point on stderr, and every point so far to --json: a benchmark stopped by its
    time limit keeps what it measured."""
    print(json.dumps({k: v for k, v in rows[-1].items() if not k.endswith("_rounds")}), file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "platform": platform,
                                         "gpus": gpu_state, "rows": rows}, indent=2))


def print_table(rows: list[dict], header: str) -> None:
    """The points as a table under ``header`` (the rounds are in --json)."""
    import pandas as pd

    table = pd.DataFrame(rows).drop(columns=["plain_rounds", "cell_rounds"])
    print(header)
    with pd.option_context("display.width", 200, "display.max_colwidth", 80, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plain-child", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--model", default="tiny", help="config/models/<name>.yaml (default tiny)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--platform", default=None, help="config/platforms/<name>.yaml (default: cpu, or on cuda the "
                    "platform whose gpu_name the GPU's name holds: h100 or h200)")
    ap.add_argument("--techniques", default="L,QL,Q", help="comma-separated (default L,QL,Q)")
    ap.add_argument("--batch", default="8", help="the larger batch, measured besides batch 1: a number, or "
                    "'searched' for each technique's largest batch from --reference's max-batch searches (default 8)")
    ap.add_argument("--reference", type=Path, default=REPO / "results" / "reference",
                    help="results folders whose max-batch searches --batch searched reads (default results/reference)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=350)
    ap.add_argument("--rounds", type=int, default=1, help="plain/cell pairs per point; medians are printed")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout-s", type=int, default=1800)
    ap.add_argument("--json", type=Path, default=None, help="also write every round's numbers here")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"plain-loop variants, the first the reference (default {','.join(VARIANTS)}; see VARIANTS)")
    args = ap.parse_args(argv)
    if args.batch != "searched" and not (args.batch.isdigit() and int(args.batch) >= 1):
        ap.error(f"--batch: a batch size >= 1 or 'searched'; got {args.batch!r}")
    variants = tuple(args.variants.split(","))
    if variants[0] != "plain" or not set(variants) <= set(VARIANTS):
        ap.error(f"--variants: plain first, then any of {', '.join(VARIANTS[1:])}; got {args.variants!r}")
    if args.plain_child:
        spec_path, out = map(Path, args.plain_child)
        spec = json.loads(spec_path.read_text())
        if spec["platform"]["accelerator"] == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # as the DeepSpeed worker does (overflow variant)
        out.write_text(json.dumps(plain_loop(spec, variants)))
        return 0

    try:
        platform, gpu_state = platform_for(args.device, args.platform)
    except ValueError as e:
        ap.error(str(e))
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    rows, index = [], 0
    # device memory allocated on a GPU; on a CPU the host's peak RSS (no allocator statistics there)
    peak_key = "peak_mem_allocated_gib" if args.device == "cuda" else "peak_rss_gib"
    specs = {}  # the larger batch of each technique first, so a missing search stops the benchmark before it runs
    for technique in args.techniques.split(","):
        spec = cell_spec(technique, args.model, platform, 1, args.warmup, args.steps, args.seq_len, args.timeout_s)
        try:
            larger = searched_batch(spec, args.reference) if args.batch == "searched" else int(args.batch)
        except ValueError as e:
            ap.error(str(e))
        specs[technique] = [cell_spec(technique, args.model, platform, batch, args.warmup, args.steps, args.seq_len,
                                      args.timeout_s) for batch in sorted({1, larger})]
    for technique, batch_specs in specs.items():
        for spec in batch_specs:
            batch = spec["cell"]["batch_size"]
            plain, cell = [], []
            for _ in range(args.rounds):
                plain.append(run_plain(spec, workdir, index, args.threads, variants))
                cell.append(run_cell(spec, workdir, index, args.threads))
                index += 1
            p_tps, c_tps = median(plain, "tokens_per_s"), median(cell, "tokens_per_s")
            status = failures(plain, cell)
            # each variant's tokens/s over the plain loop's in the same child, median over rounds
            shares = {f"{v}_over_plain": statistics.median(r["variants_tokens_per_s"][v] / r["tokens_per_s"]
                                                           for r in plain if r["status"] == "ok")
                      if any(r["status"] == "ok" for r in plain) else None for v in variants[1:]}
            rows.append({"technique": technique, "batch": batch, "plain_tokens_per_s": p_tps,
                         "cell_tokens_per_s": c_tps, "cell_over_plain": c_tps / p_tps if p_tps and c_tps else None,
                         "plain_cv": cv(plain), "cell_cv": cv(cell),
                         **shares, "trainable_tensors": next((r["trainable_tensors"] for r in plain
                                                              if r["status"] == "ok"), None),
                         "plain_peak_gib": median(plain, peak_key), "cell_peak_gib": median(cell, peak_key),
                         "attention": next((r["attention"] for r in cell + plain if r["status"] == "ok"), None),
                         "status": status or "ok", "plain_rounds": plain, "cell_rounds": cell})
            emit(rows, args, platform, gpu_state)
    print_table(rows, f"model {args.model}, platform {platform}, seq {args.seq_len}, {args.warmup} warm-up + "
                f"{args.steps} measured steps, {args.rounds} round(s), medians; peak: {peak_key}; logs in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
