"""DeepSpeed pre-training worker: one repeat of one cell, run by torchrun on every rank.

    torchrun ... -m llmbench.train.deepspeed_worker --spec spec.json --out repeat.json [--trace-dir DIR]

The contract with llmbench.launch (out-of-memory marker, exit code, what rank 0 writes) is
llmbench.train.contract. With --trace-dir (profile cells) a Chrome trace is kept there.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spec import RunSpec
from . import contract, scenario


def ds_config(tech, batch_size: int, accelerator: str, *, bf16: bool) -> dict:
    """The DeepSpeed config for a technique (AdamW, ZeRO stage and offload; bf16 mode, with
    fp32 master weights, unless the platform computes in fp32: then no mixed precision)."""
    zero: dict = {"stage": tech.zero_stage}
    pin = accelerator == "cuda"  # pinned host memory needs a CUDA device
    if tech.offload:
        # Z2+O: optimizer state on CPU; Z3+O: optimizer state and parameters (paper §IV-A).
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
        if tech.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    if tech.zero_stage >= 2:
        zero.update(overlap_comm=accelerator == "cuda", contiguous_gradients=True)
    return {
        "train_micro_batch_size_per_gpu": batch_size,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": bf16},
        "optimizer": {
            "type": "AdamW",
            # On CPU without offload DeepSpeed's fused Adam (CUDA) is unavailable: torch's.
            "params": {"lr": 1e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0,
                       **({"torch_adam": True} if accelerator == "cpu" and not tech.offload else {})},
        },
        "zero_optimization": zero,
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer (on by default) synchronises the device at the start
        # of every forward and at the end of every step to time them for a log line we never
        # print: two host waits per step inside our timed window, which cost most at small
        # batches where the host's kernel launches would otherwise run ahead of the GPU.
        # Our own window (llmbench.protocol.run_window) synchronises only at its ends.
        "timers": {"throughput": {"enabled": False}},
    }


def _optimizer_numel(engine) -> int:
    """Elements this rank's inner torch optimizer updates (its share of what trains)."""
    opt = engine.optimizer
    flat = getattr(opt, "fp32_partitioned_groups_flat", None)  # ZeRO-3 keeps its own flat groups
    if flat:
        return sum(t.numel() for t in flat)
    inner = getattr(opt, "optimizer", opt)
    return sum(p.numel() for g in inner.param_groups for p in g["params"])


def profile_window(step, steps: int, synchronize, accelerator: str, trace_dir: Path, out: Path,
                   rank: int) -> dict | None:
    """``steps`` more steps under torch.profiler (every rank: they communicate); rank 0 keeps
    the Chrome trace and returns where the time went by kernel class (llmbench.profile.kernels)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    from ..profile import kernels

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if accelerator == "cuda" else [])
    synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
    if rank != 0:
        return None
    trace_dir.mkdir(parents=True, exist_ok=True)
    trace = trace_dir / f"{Path(out).stem}.rank0{kernels.TRACE_SUFFIX}"
    prof.export_chrome_trace(str(trace))
    events = kernels.load_events(trace)
    return {**kernels.breakdown(events, steps, elapsed / steps, accelerator), "traces": [trace.name]}


@dataclass(kw_only=True, slots=True)
class BuiltModel:
    """A cell's model as built before DeepSpeed wraps it (shared with tests/bench_overhead.py,
    whose plain loop trains the same model)."""

    model: Any
    """The transformers model, PEFT-wrapped for a fine-tuning method."""
    params: list
    """The parameters that train (floating point, requires_grad)."""
    trainable_desc: str
    """What trains, in words (the record's trainable_desc)."""
    attn_ctx: Callable[[], Any]
    """Context manager factory that selects the attention kernel (build.attention_choice)."""
    attn_label: str
    """The attention implementation, as recorded."""
    compiled_layers: int
    """Decoder layers compiled with torch.compile (C), else 0."""


def build_model(cell, model_spec, accelerator: str, device, dtype, config: dict | None = None) -> BuiltModel:
    """The random-initialised model of a DeepSpeed cell: attention kernel, 4-bit (Q), the
    fine-tuning method's adapters, recomputation (R), torch.compile (C); non-float parameters
    frozen. ``config`` (the DeepSpeed config): ZeRO-3 builds under zero.Init with it."""
    from . import adapters, build

    tech = cell.tech
    attn_impl, attn_ctx, attn_label = build.attention_choice(tech, accelerator)
    if tech.zero_stage == 3 and not tech.quant4:
        import deepspeed

        # Parameters are partitioned as they are created: a 70B model never exists whole.
        # No dtype= here: zero.Init takes it from the config's bf16 section. DeepSpeed 0.19's
        # Init._set_dtype ignores an explicit dtype where the accelerator has no fp16 (CPU:
        # `dtype or fp16 if fp16_supported else bf16 ...`), so fp32 Z3 cells became bf16.
        with deepspeed.zero.Init(config_dict_or_path=config):
            model = build.build_llama(model_spec, attn_impl, dtype, "cpu" if accelerator == "cpu" else device)
    else:
        # 4-bit: each decoder layer is quantised as it is built (build_llama)
        model = build.build_llama(model_spec, attn_impl, dtype, device, quant4=tech.quant4)
    trainable_desc = "all parameters"
    if tech.quant4:
        trainable_desc = build.q_trainable(dtype)
    if tech.adapter:
        model, trainable_desc = adapters.apply(model, tech, cell.adapter)
    if tech.recompute and not (tech.adapter and tech.quant4):  # QL: done by k-bit preparation
        build.enable_recompute(model)
    compiled_layers = build.compile_layers(model) if tech.compiled else 0
    model.train()
    params = [p for p in model.parameters() if p.requires_grad and p.dtype.is_floating_point]
    for p in model.parameters():
        if not p.dtype.is_floating_point:
            p.requires_grad_(False)
    return BuiltModel(model=model, params=params, trainable_desc=trainable_desc, attn_ctx=attn_ctx,
                      attn_label=attn_label, compiled_layers=compiled_layers)


class DeepSpeedBackend:
    """The scenario's backend (llmbench.train.scenario): a cell's model in a DeepSpeed engine."""

    def __init__(self, cell, model_spec, accelerator: str, device, dtype, config: dict) -> None:
        self.cell, self.model_spec, self.accelerator = cell, model_spec, accelerator
        self.device, self.dtype, self.config = device, dtype, config
        self.built: BuiltModel | None = None
        self.engine = None
        self.frozen_before: float | None = None
        # logical parameter count from the spec: 4-bit layers store two weights per byte
        self.total_params = int(model_spec.param_counts()["total"])
        self.trainable_params = 0

    def build(self) -> scenario.Layout:
        """Build the model and initialise DeepSpeed; note the frozen weights' checksum."""
        import deepspeed
        import torch.distributed as dist
        from deepspeed.accelerator import get_accelerator

        from . import adapters

        tech = self.cell.tech
        self.built = build_model(self.cell, self.model_spec, self.accelerator, self.device, self.dtype, self.config)
        # full sizes, counted before DeepSpeed partitions anything (ZeRO-3: ds_numel, not the shard)
        self.trainable_params = int(sum(getattr(p, "ds_numel", p.numel()) for p in self.built.params))
        self.engine, _, _, _ = deepspeed.initialize(model=self.built.model, model_parameters=self.built.params,
                                                    config=self.config)
        if not (tech.adapter and tech.quant4):  # QLoRA's k-bit preparation keeps the rest in fp32
            built = self.engine.module.get_output_embeddings().weight.dtype
            if built != self.dtype:
                raise RuntimeError(f"the model trains in {built}, not the platform's compute dtype {self.dtype}")
        if self.has_frozen:
            self.frozen_before = adapters.frozen_checksum(self.engine.module)
        self._sync = get_accelerator().synchronize
        return scenario.Layout(data_rank=dist.get_rank(), data_parallel=dist.get_world_size())

    @property
    def has_frozen(self) -> bool:
        """Whether part of the model is frozen (adapters, 4-bit)."""
        return self.trainable_params < self.total_params

    def step(self, ids):
        """Forward, backward and optimizer step through the engine; the loss, not read back."""
        engine = self.engine
        with self.built.attn_ctx():
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
        engine.step()
        return loss

    def synchronize(self) -> None:
        """DeepSpeed's accelerator synchronize (CUDA: the device; CPU: nothing queued)."""
        self._sync()


def run(spec: RunSpec | dict, out: Path, trace_dir: Path | None = None) -> dict | None:
    """Build the model, initialise DeepSpeed, run the scenario (llmbench.train.scenario); rank 0
    returns the result. With ``trace_dir`` (profile cells) a second window of ``measured_steps``
    runs under torch.profiler after the timed one, and the result's summary says where its time went."""
    phases = scenario.Phases()
    spec = RunSpec.of(spec)  # the worker's spec.json, parsed once
    cell, model_spec, tech, platform = spec.cell, spec.model, spec.tech, spec.platform
    accelerator = platform.accelerator
    if accelerator == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed's ZeRO calls torch's deprecated all_gather_into_tensor / reduce_scatter_tensor,
    # and torch warns at every call: hundreds of lines that bury a log's, and a node's, tail
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
                            r"is deprecated", category=FutureWarning)
    import deepspeed
    import torch
    import torch.distributed as dist

    from .. import platforms, provenance
    from . import adapters, build, jit_ops

    phases.mark("imports")
    jit_ops.guard_jit_loads()  # before init_distributed: it loads the first op on CPU
    proto = cell.protocol

    deepspeed.init_distributed(dist_backend="gloo" if accelerator == "cpu" else "nccl")
    rank = dist.get_rank()
    device = contract.local_device(accelerator)
    dtype = platforms.compute_dtype(platform)
    config = ds_config(tech, cell.batch_size, accelerator, bf16=dtype == torch.bfloat16)
    backend = DeepSpeedBackend(cell, model_spec, accelerator, device, dtype, config)
    phases.mark("init_distributed")
    summary: dict = {}

    def traced(step) -> None:
        if trace_dir is not None:
            summary.update(profile_window(step, proto.measured_steps, backend.synchronize, accelerator, trace_dir,
                                          out, rank) or {})

    result = scenario.run(backend, proto, batch_size=cell.batch_size, vocab_size=model_spec.vocab_size,
                          accelerator=accelerator, device=device, after_window=traced, phases=phases)

    engine = backend.engine
    frozen_unchanged = None
    if backend.has_frozen:
        frozen_unchanged = adapters.frozen_checksum(engine.module) == backend.frozen_before
    opt_numel = torch.tensor([float(_optimizer_numel(engine))], dtype=torch.float64,
                             device=device if accelerator == "cuda" else "cpu")
    dist.all_reduce(opt_numel)

    if rank == 0:
        return {
            **result.payload(),
            "total_params": backend.total_params,
            "trainable_params": backend.trainable_params,
            "trainable_desc": backend.built.trainable_desc,
            "attention": backend.built.attn_label,
            "compute_dtype": platforms.dtype_name(dtype),
            "frozen_params_unchanged": frozen_unchanged,
            "optimizer_param_numel": int(opt_numel.item()),
            "ds_config": config,
            "summary": {**summary, **(build.compile_stats(backend.built.compiled_layers) if tech.compiled else {}),
                        **phases.seconds, **result.window.summary()},
            "versions": provenance.versions(),
            "devices": provenance.devices(),
        }
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point for one rank (llmbench.train.contract)."""
    return contract.main(run, argv, __doc__)


if __name__ == "__main__":
    contract.leave(main())
