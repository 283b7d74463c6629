"""Predicted GPU memory of a training cell: today its model states only, a lower bound.

Model states per parameter with bf16 mixed precision and Adam (ZeRO paper, Rajbhandari et
al. 2020, Section 3.1: 2 bytes of bf16 weights, 2 of gradients, 12 of fp32 master weights,
momentum and variance; DeepSpeed's bf16 mode accumulates gradients in fp32, 4 bytes, so 18
here), divided as the technique shards or offloads them:

- Naive, R, F: all on every GPU;
- Z2: weights on every GPU, gradients and optimizer states over the GPUs;
- Z3: everything over the GPUs;
- O: the optimizer states (and with Z3 the weights) on the host instead;
- Q: a 4-bit NF4 base with double quantization (about 0.53 bytes per parameter), only the
  embeddings, norms and lm_head training (full states for those);
- adapters (LoRA and the like): the frozen base (2 bytes, or 0.53 with QLoRA), states for
  the adapters only (negligible against the base at rank 64: left out).

Activations, framework buffers and allocator slack are not counted yet, so a cell
predicted to need more than its GPU holds cannot fit, while one predicted to fit may still
run out of memory. The findings' missing-cell ranking uses it to put cells that cannot fit
last; the full model (activations, fitted constants) is issue 19's.
"""

from __future__ import annotations

from . import techniques
from .models import ModelSpec

GIB = 2**30
#: bytes per parameter of the model states (see the module docstring)
WEIGHTS_BF16 = 2.0
GRADS = 4.0  # DeepSpeed's bf16 mode keeps fp32 gradient accumulation
ADAM_FP32 = 12.0  # fp32 master weights, momentum, variance
NF4 = 0.53  # 4 bits + double-quantized block constants


def model_states_gib(model: ModelSpec, technique: str, gpus: int = 1) -> float:
    """GPU memory of the model states of one rank, in GiB (no activations)."""
    tech = techniques.parse(technique)
    counts = model.param_counts()
    n = counts["total"]
    if tech.adapter is not None:
        return n * (NF4 if tech.quant4 else WEIGHTS_BF16) / GIB
    if tech.quant4:
        trainable = counts["embedding"] + counts["lm_head"] + (2 * model.num_hidden_layers + 1) * model.hidden_size
        frozen = n - trainable
        return (frozen * NF4 + trainable * (WEIGHTS_BF16 + GRADS + ADAM_FP32)) / GIB
    weights, grads, optim = WEIGHTS_BF16 * n, GRADS * n, ADAM_FP32 * n
    if tech.offload:
        optim = 0.0
        if tech.zero_stage == 3:
            weights = 0.0
    if tech.zero_stage >= 2:
        grads, optim = grads / gpus, optim / gpus
    if tech.zero_stage == 3:
        weights = weights / gpus
    return (weights + grads + optim) / GIB


def cannot_fit(model: ModelSpec, technique: str, gpus: int, gpu_memory_gib: float | None) -> bool:
    """Whether the model states alone exceed the GPU (a cell that surely runs out of memory)."""
    if not gpu_memory_gib:
        return False
    return model_states_gib(model, technique, gpus) > gpu_memory_gib
