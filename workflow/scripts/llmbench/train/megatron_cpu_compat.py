"""Running megatron-core 0.16.1 on a CPU: every stub of a hard-coded CUDA call, in one place.

megatron-core is written for NVIDIA GPUs: besides its kernels (which it falls back from
when Apex / TransformerEngine are missing), it creates many small tensors with
``device="cuda"`` or ``device=torch.cuda.current_device()`` and keeps its RNG states in
CUDA generators. On a CPU-only torch each of those raises "Torch not compiled with CUDA
enabled". llmbench.train.megatron_worker calls :func:`apply` when, and only when, the
cell's platform has ``accelerator: cpu``; on a GPU nothing here is touched.

What is stubbed, and why (file:line refer to megatron-core 0.16.1):

1. ``torch.cuda.current_device`` -> 0, without initialising CUDA. Used as a device index
   for buffers and tensors: distributed/param_and_grad_buffer.py:783-806 (the gradient
   buffers of Megatron's DDP), optimizer/distrib_optimizer.py:791, models/gpt/gpt_model.py:415,
   tensor_parallel/layers.py, models/common/embeddings/rotary_pos_embedding.py:162 (RoPE
   moves its inv_freq "to the GPU" at the first forward). Stub 2 turns the index into cpu.
2. :class:`CudaToCpuMode`, a TorchFunctionMode active for the whole run, rewrites every
   ``device=`` argument that names CUDA ("cuda", "cuda:N", an int index, a cuda
   torch.device) to the CPU, and makes ``Tensor.cuda()`` a no-op. Covers the literal
   ``device="cuda"`` scalars of the mixed-precision optimizer (optimizer/optimizer.py:473-485:
   found_inf, overflow buffer, scale one), gradient clipping (optimizer/clip_grads.py:90-115,
   207), the schedules' token counter (pipeline_parallel/schedules.py:596, 983) and rule 1's
   indices. Autograd's C++ backward does not pass through it; nothing there names a device.
   Its cost: a Python call per torch function in the forward pass (microseconds each),
   which a tiny CPU cell's tokens/s includes.
3. The same mode answers ``Tensor.type()`` (no argument) for a CPU tensor with the CUDA
   type name ("torch.cuda.BFloat16Tensor"): the bf16 optimizer and the distributed
   optimizer accept only CUDA type names when they make fp32 master copies
   (optimizer/optimizer.py:671-699, optimizer/distrib_optimizer.py:361-435, 582).
4. The RNG tracker (tensor_parallel/random.py): ``_get_cuda_rng_state`` /
   ``_set_cuda_rng_state`` read and write the CPU default generator's state instead of a
   CUDA generator's, and ``CudaRNGStatesTracker.add`` seeds a CPU state. Used by
   ``model_parallel_cuda_manual_seed``, by every ``get_cuda_rng_tracker().fork()``
   (dropout, weight init) and by full recomputation's CheckpointFunction, which saves and
   restores the RNG state around the recomputed forward (random.py:470-520).
5. ``CheckpointFunction.backward`` runs inside a CudaToCpuMode: autograd's engine does
   not carry Python TorchFunctionModes into backward, and full recomputation re-runs the
   layer's forward there, which builds the causal mask with ``device="cuda"``
   (transformer/utils.py:35).
6. The warning "CPU RNG state changed within GPU RNG context" of the tracker's fork()
   (random.py:264) is filtered out: with stub 4 the tracked "GPU" generator *is* the CPU
   generator, so every random op inside a fork (dropout, even at p=0) trips it, falsely.

The arithmetic is unchanged: the same megatron-core modules, optimizer and schedules run,
on CPU tensors. What cannot run on a CPU is not stubbed but avoided by configuration (the
worker says which): fused kernels (bias/activation, RoPE, softmax, gradient-accumulation
fusion: CUDA/Apex/TE only), CUDA streams (overlap_grad_reduce), the device synchronize
after batched pipeline send/receive (batch_p2p_sync), TransformerEngine specs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

#: Set once apply() has patched this process.
_APPLIED = False


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Stubs 2 and 3 of the module docstring: CUDA devices become the CPU, ``.cuda()`` is a
    no-op, and ``Tensor.type()`` answers with the CUDA type name."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


def _cpu_get_rng_state(device: Any = "cuda", clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    state = torch.get_rng_state()
    return state.clone() if clone else state


def _cpu_set_rng_state(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _cpu_tracker_add(self, name: str, seed: int) -> None:
    """CudaRNGStatesTracker.add with the CPU generator in place of the CUDA one."""
    self._is_initialized = True
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    self.seeds_.add(seed)
    if name in self.states_:
        raise Exception(f"rng state {name} already exists")
    orig = torch.get_rng_state()
    torch.manual_seed(seed)
    self.states_[name] = torch.get_rng_state()
    torch.set_rng_state(orig)


class _DropFalseRngWarning(logging.Filter):
    """Stub 6: drops the tracker's CPU-RNG warning, false by construction under stub 4."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _backward_on_cpu(backward):
    """Stub 5: ``backward`` (an autograd Function's) run inside a CudaToCpuMode."""

    def wrapped(ctx, *grads):
        with CudaToCpuMode():
            return backward(ctx, *grads)

    wrapped.__wrapped__ = backward
    return staticmethod(wrapped)


def apply(accelerator: str) -> CudaToCpuMode | None:
    """Patch this process for megatron-core on a CPU; a no-op (None) on any other accelerator.

    Returns the :class:`CudaToCpuMode` to enter around everything that builds or runs the
    model (``with mode: ...``).
    """
    global _APPLIED
    if accelerator != "cpu":
        return None
    from megatron.core.tensor_parallel import random as mrandom

    if not _APPLIED:
        torch.cuda.current_device = lambda: 0  # stub 1
        mrandom._get_cuda_rng_state = _cpu_get_rng_state  # stub 4
        mrandom._set_cuda_rng_state = _cpu_set_rng_state
        mrandom.CudaRNGStatesTracker.add = _cpu_tracker_add
        mrandom.CheckpointFunction.backward = _backward_on_cpu(mrandom.CheckpointFunction.backward)  # stub 5
        logging.getLogger(mrandom.__name__).addFilter(_DropFalseRngWarning())  # stub 6
        _APPLIED = True
    return CudaToCpuMode()


def applied() -> bool:
    """Whether apply() has patched this process."""
    return _APPLIED
