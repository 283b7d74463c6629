"""Profile worker: the module-wise breakdown of one training step (backend torch) or of
serving forward passes (backend inference: ``run_inference``), run by torchrun.

    torchrun ... -m llmbench.profile.worker --spec spec.json --out repeat.json [--trace-dir DIR]

Contract with llmbench.launch (as llmbench.train.deepspeed_worker): rank 0 writes ``--out``
(JSON) on success; on an out-of-memory error it writes ``<out>.oom.rank<r>`` with the
message and exits with code OOM_EXIT (llmbench.train.contract). It also writes the Chrome trace of the profiled steps
into ``--trace-dir`` (default: the folder of ``--out``).

One process, plain PyTorch: the random-initialised Llama in the platform's compute dtype
(llmbench.platforms.compute_dtype; bf16 on GPUs: weights, gradients and AdamW state all
bf16, no fp32 master copy, unlike DeepSpeed's bf16 mode; fp32 on the CPU platform), AdamW (fused on
CUDA, foreach on CPU) with gradient clipping at 1.0 as the DeepSpeed runs have, the
technique flags F (attention kernel, llmbench.train.build.attention_choice) and R
(non-reentrant gradient checkpointing of every decoder layer). ``protocol.warmup_steps``
plain steps (the later half of them give the unprofiled step time), then
``protocol.measured_steps`` steps under torch.profiler (paper Section IV-B: ten steps).
The host clock is read at the step's start and at the end of each phase (after a device
synchronize), so the phases partition the step and unaccounted_s is 0 up to rounding.

Result keys: rows [{phase, module, time_s, share, gemm_time_s, recompute_s}], phases
{forward|backward|optimizer: {wall_s, kernel_s, gemm_s, attributed_s,
unattributed_kernel_s, recompute_s}}, step_time_s, unaccounted_s, unprofiled_step_time_s,
tokens_per_s, attention, trace, method, and context (technique, batch, steps, loss,
versions, devices). Attribution: llmbench.profile.attribution.
"""

from __future__ import annotations

import contextlib
import functools
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import backends, techniques
from ..spec import RunSpec
from ..train import contract  # one contract (OOM marker, exit code) for every worker
from . import attribution as attr
from . import kernels

SCHEMA_VERSION = 1
#: The flags plain PyTorch runs (the registry's; the grid rejects the rest at config time).
SUPPORTED_FLAGS = backends.get("torch").flags  # the grid rejects the others before any job; this guards direct runs
UNSUPPORTED = ("profile cells support the flags F and R (plain PyTorch); ZeRO, offload and 4-bit "
               "steps are profiled by kernel class with backend: deepspeed")
#: Decoder submodules by attribute name -> module kind (Table VI rows).
KIND_BY_NAME = {"embed_tokens": "embedding", "q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv",
                "o_proj": "output", "mlp": "mlp", "lm_head": "lm_head", "rotary_emb": "rope"}


class UnsupportedTechnique(ValueError):
    """A technique the profile worker does not run (only F and R are plain PyTorch)."""


def check_technique(name: str) -> techniques.Technique:
    """The parsed technique, or UnsupportedTechnique naming it (ZeRO, offload, 4-bit, adapters)."""
    tech = techniques.parse(name)  # memoised: a cell's RunSpec.tech is this same object
    extra = [f for f in tech.flags if f not in SUPPORTED_FLAGS]
    if extra or tech.adapter:
        asks = ", ".join(extra) if extra else f"the fine-tuning method {tech.adapter_token}"
        raise UnsupportedTechnique(f"technique {name!r} asks for {asks}: {UNSUPPORTED}")
    return tech


def _ranged(fn: Callable, name: str) -> Callable:
    """``fn`` run inside a record_function range ``name``."""
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(name):
            return fn(*args, **kwargs)

    return wrapper


class _RangedAttention:
    """Stands in for transformers' ALL_ATTENTION_FUNCTIONS in modeling_llama: the attention
    function it hands out (eager, SDPA or flash-attn) runs inside the core range."""

    def __init__(self, interface: Any) -> None:
        self._interface = interface

    def get_interface(self, attn_implementation: str, default: Callable) -> Callable:
        return _ranged(self._interface.get_interface(attn_implementation, default), attr.ATTENTION_CORE)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._interface, name)


def module_range_name(qualified: str, module: Any) -> str | None:
    """The llmbench range a module's forward opens (None: not instrumented)."""
    leaf = qualified.rsplit(".", 1)[-1]
    cls = type(module).__name__
    if cls.endswith("RMSNorm"):
        return attr.module_range("rmsnorm")
    if cls.endswith("Attention") and leaf == "self_attn":
        return attr.ATTENTION_BLOCK
    kind = KIND_BY_NAME.get(leaf)
    return attr.module_range(kind) if kind else None


@contextlib.contextmanager
def instrument(model: Any) -> Iterator[None]:
    """Open the llmbench ranges around the model's modules and functions while inside.

    Modules: forward pre-hook enters a record_function, forward hook (always_call, so an
    exception such as checkpointing's early stop still closes it) exits it. Functions:
    modeling_llama's apply_rotary_pos_emb and ALL_ATTENTION_FUNCTIONS (looked up from the
    module's globals at call time) are replaced, and the model's loss function wrapped;
    all are restored on exit.
    """
    import transformers.models.llama.modeling_llama as llama
    from torch.profiler import record_function

    open_ranges: dict[int, list] = defaultdict(list)

    def pre_hook(name: str):
        def hook(module, args):
            rf = record_function(name)
            rf.__enter__()
            open_ranges[id(module)].append(rf)
        return hook

    def post_hook(module, args, output):
        stack = open_ranges.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    handles = []
    for qualified, module in model.named_modules():
        name = module_range_name(qualified, module)
        if name is not None:
            handles.append(module.register_forward_pre_hook(pre_hook(name)))
            handles.append(module.register_forward_hook(post_hook, always_call=True))
    rope, interface, loss = llama.apply_rotary_pos_emb, llama.ALL_ATTENTION_FUNCTIONS, model.loss_function
    llama.apply_rotary_pos_emb = _ranged(rope, attr.module_range("rope"))
    llama.ALL_ATTENTION_FUNCTIONS = _RangedAttention(interface)
    model.loss_function = _ranged(loss, attr.module_range("loss"))
    try:
        yield
    finally:
        llama.apply_rotary_pos_emb, llama.ALL_ATTENTION_FUNCTIONS, model.loss_function = rope, interface, loss
        for h in handles:
            h.remove()


def _device(cuda: bool) -> tuple[Any, Callable[[], None]]:
    """The process's device and how to wait for it (CPU ops are synchronous)."""
    import torch

    device = contract.local_device("cuda" if cuda else "cpu")
    return device, (torch.cuda.synchronize if cuda else (lambda: None))


def _set_up(spec: RunSpec, tech: techniques.Technique, seed: int) -> tuple[Any, ...]:
    """What both profile entry points start from: (cuda, device, sync, model spec, the seeded
    random-initialised model on the device in the platform's compute dtype with the
    technique's attention (train.build), that dtype, the attention's context and label)."""
    from .. import platforms
    from ..train import build, scenario

    accelerator = spec.platform.accelerator
    cuda = accelerator == "cuda"
    device, sync = _device(cuda)
    scenario.seed(seed)
    attn_impl, attn_ctx, attn_label = build.attention_choice(tech, accelerator)
    dtype = platforms.compute_dtype(spec.platform)
    model_spec = spec.model
    model = build.build_llama(model_spec, attn_impl, dtype, device)
    return cuda, device, sync, model_spec, model, dtype, attn_ctx, attn_label


def _peaks(peak: Any) -> dict[str, float | None]:
    """A repeat's peak memory (train.scenario.peak_memory: device memory since the model's
    build, host RSS over the process) as the result keys training workers write."""
    return {"peak_mem_allocated_gib": peak.allocated_gib, "peak_mem_reserved_gib": peak.reserved_gib,
            "peak_rss_gib": peak.rss_gib}


def _attribute(prof: Any, walls: dict[str, float], profiled: dict[str, float], steps: int,
               phases_run: tuple[str, ...], cuda: bool) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """A finished profiler's events -> rows adding up to ``walls`` and phase totals
    (llmbench.profile.attribution), each phase with its ``profiled`` wall time beside; on a
    GPU each phase also gets its device activity, the check on the attributed time."""
    events = prof.events()
    ops = attr.op_records(events, use_device=cuda)
    rows, phases = attr.aggregate(attr.assign(ops), walls, steps, phases_run,
                                  device_us=attr.device_time(events) if cuda else None)
    for phase in phases:
        phases[phase]["profiled_wall_s"] = profiled[phase]
    return rows, phases


def run(spec: RunSpec | dict, out: Path, trace_dir: Path) -> dict:
    """Build the model, run warm-up and profiled steps, attribute, write the result (rank 0)."""
    spec = RunSpec.of(spec)
    cell = spec.cell
    tech = check_technique(cell.technique)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != 1 or cell.gpus != 1:
        raise ValueError(f"profile cells run as one process on one device (gpus: 1); got gpus {cell.gpus}, "
                         f"world size {world}")
    proto = cell.protocol
    if proto.warmup_steps < 1:
        raise ValueError("profile cells need protocol.warmup_steps >= 1: the unprofiled step time is "
                         "measured on the warm-up steps")

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from .. import platforms, provenance
    from ..train import build, scenario

    cuda, device, sync, model_spec, model, dtype, attn_ctx, attn_label = _set_up(spec, tech, proto.seed)
    if tech.recompute:
        build.enable_recompute(model)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # the DeepSpeed runs' optimizer settings (train.deepspeed_worker.ds_config)
    opt = torch.optim.AdamW(params, lr=1e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            **({"fused": True} if cuda else {"foreach": True}))
    ids = scenario.synthetic_ids(model_spec.vocab_size, cell.batch_size, proto.seq_len, proto.seed, 0, device)
    losses = []

    def step() -> list[float]:
        """One step; the host clock at its start and at the end of each phase."""
        marks = [time.perf_counter()]
        with record_function(attr.phase_range("forward")):
            with attn_ctx():
                loss = model(input_ids=ids, labels=ids).loss
            sync()
        marks.append(time.perf_counter())
        with record_function(attr.phase_range("backward")):
            with attn_ctx():  # R recomputes the forward here: it must pick the same kernel
                loss.backward()
            sync()
        marks.append(time.perf_counter())
        with record_function(attr.phase_range("optimizer")):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sync()
        marks.append(time.perf_counter())
        losses.append(loss.detach())
        return marks

    sync()
    warm = [step() for _ in range(proto.warmup_steps)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with instrument(model), profile(activities=activities) as prof:
        measured = [step() for _ in range(proto.measured_steps)]

    peak = scenario.peak_memory(device, spec.platform.accelerator)
    trace_dir.mkdir(parents=True, exist_ok=True)
    trace = trace_dir / f"{out.stem}{kernels.TRACE_SUFFIX}"
    prof.export_chrome_trace(str(trace))
    walls, profiled, basis = attr.step_walls(warm, measured, attr.PHASES, cuda)
    rows, phases = _attribute(prof, walls, profiled, proto.measured_steps, attr.PHASES, cuda)

    step_time = statistics.fmean(m[-1] - m[0] for m in measured)
    unprofiled = statistics.fmean(m[-1] - m[0] for m in attr.settled(warm))
    tokens = cell.batch_size * proto.seq_len
    return {
        "schema_version": SCHEMA_VERSION,
        "rows": rows,
        "phases": phases,
        "wall_basis": basis,
        "step_time_s": step_time,
        "unaccounted_s": step_time - sum(profiled.values()),
        "unprofiled_step_time_s": unprofiled,
        "tokens_per_s": tokens / unprofiled,
        "global_batch_tokens": tokens,
        "attention": attn_label,
        "compute_dtype": platforms.dtype_name(dtype),
        "technique": tech.name,
        "recompute": tech.recompute,
        "world_size": 1,
        "warmup_steps": proto.warmup_steps,
        "profiled_steps": proto.measured_steps,
        "loss_last": float(losses[-1].float().item()),
        **_peaks(peak),
        "trace": str(trace),
        "method": attr.METHOD,
        "versions": provenance.versions(),
        "devices": provenance.devices(),
    }


def run_inference(spec: RunSpec | dict, out: Path, trace_dir: Path) -> dict:
    """Serving forward passes (backend inference, Tables X and XI): the model as a serving
    engine in this environment runs it (transformers: a batch of prompts prefilled, then
    decode steps with its KV cache, greedy), module-wise under torch.profiler.

    A batch of ``batch_size`` prompts of ``seq_len`` synthetic token ids; ``warmup_steps``
    unprofiled generations of ``measured_steps`` decode steps first, then one profiled: a
    prefill phase and a decode phase (``measured_steps`` steps), each a phase range ending
    in a device synchronize. Rows are per phase (the decode phase's are all its steps).
    """
    spec = RunSpec.of(spec)
    cell = spec.cell
    tech = check_technique(cell.technique)
    if tech.recompute:
        raise UnsupportedTechnique(f"technique {cell.technique!r} asks for R: serving forward passes have no "
                                   "backward pass to recompute for (backend inference takes F only)")
    if cell.gpus != 1 or int(os.environ.get("WORLD_SIZE", "1")) != 1:
        raise ValueError(f"inference profile cells run as one process on one device (gpus: 1); got {cell.gpus}")
    proto = cell.protocol

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from .. import platforms, provenance
    from ..train import scenario

    cuda, device, sync, model_spec, model, dtype, attn_ctx, attn_label = _set_up(spec, tech, proto.seed)
    model.eval()
    prompts = scenario.synthetic_ids(model_spec.vocab_size, cell.batch_size, proto.seq_len, proto.seed, 0, device)

    @torch.no_grad()
    def generate(ranges: bool) -> list[float]:
        """Prefill, then ``measured_steps`` decode steps; host clock at the start and at the
        end of each phase."""
        phase = record_function if ranges else (lambda name: contextlib.nullcontext())
        marks = [time.perf_counter()]
        with phase(attr.phase_range("prefill")), attn_ctx():
            out = model(input_ids=prompts, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            sync()
        marks.append(time.perf_counter())
        with phase(attr.phase_range("decode")), attn_ctx():
            past = out.past_key_values
            for _ in range(proto.measured_steps):
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            sync()
        marks.append(time.perf_counter())
        return marks

    sync()
    warm = [generate(False) for _ in range(proto.warmup_steps)]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with instrument(model), profile(activities=activities) as prof:
        marks = generate(True)
    peak = scenario.peak_memory(device, spec.platform.accelerator)
    trace_dir.mkdir(parents=True, exist_ok=True)
    trace = trace_dir / f"{out.stem}{kernels.TRACE_SUFFIX}"
    prof.export_chrome_trace(str(trace))
    walls, profiled, basis = attr.step_walls(warm, [marks], attr.INFERENCE_PHASES, cuda)
    rows, phases = _attribute(prof, walls, profiled, 1, attr.INFERENCE_PHASES, cuda)
    unprofiled = statistics.fmean(m[-1] - m[0] for m in warm) if warm else marks[-1] - marks[0]
    tokens = cell.batch_size * (proto.measured_steps + 1)  # the prefill makes each first token
    return {
        "schema_version": SCHEMA_VERSION, "rows": rows, "phases": phases, "wall_basis": basis,
        "step_time_s": marks[-1] - marks[0], "unaccounted_s": (marks[-1] - marks[0]) - sum(profiled.values()),
        "unprofiled_step_time_s": unprofiled, "tokens_per_s": tokens / unprofiled, "global_batch_tokens": tokens,
        "decode_steps": proto.measured_steps, "attention": attn_label, "technique": tech.name,
        "compute_dtype": platforms.dtype_name(dtype),
        "recompute": False, "world_size": 1, "warmup_steps": proto.warmup_steps, "profiled_steps": 1,
        "loss_last": None, **_peaks(peak), "trace": str(trace),
        "method": ("Serving forward passes: prefill of the batch's prompts, then decode steps with the KV cache "
                   "(transformers' model, greedy); " + attr.METHOD),
        "versions": provenance.versions(), "devices": provenance.devices(),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point (one rank; llmbench.train.contract)."""
    from .. import backends

    def runner(spec: dict, out: Path, trace_dir: Path | None) -> dict:
        spec = RunSpec.parse(spec)  # the worker's spec.json, parsed once
        # what is profiled is the kind the backend registry gives the cell's backend
        work = {"inference": run_inference, "training": run}[backends.get(spec.cell.backend).profile]
        return work(spec, out, trace_dir or out.parent)

    return contract.main(runner, argv, __doc__)


if __name__ == "__main__":
    contract.leave(main())
