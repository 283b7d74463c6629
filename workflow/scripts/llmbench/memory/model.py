"""The memory model: predicted peak GPU memory (allocated by tensors) of one rank of a
training cell, and its host memory where there is offload.

A step has two peaks and the model takes the larger (``Prediction.phase``):

- forward/backward: the model states that live through the step (``StateRow.fb`` of
  constants.DEEPSPEED or MEGATRON) plus the activations saved for the backward pass, the
  logits, DeepSpeed's communication buckets and a fixed overhead (CUDA/cuBLAS workspaces);
  ZeRO-1/2's buckets live only through the backward pass, so for an adapter they count
  beside a recomputed layer but not beside the logits (``beside_activations_bytes``);
- optimizer step: the model states plus the flat buffers the optimizer allocates for the
  step (``StateRow.step``; no activations are alive by then), plus ZeRO-3's bucket and the
  overhead.

Model states, in bytes per parameter, ``full + sharded / data-parallel ranks``
(``StateBytes``), for DeepSpeed's bf16 mode (bf16 weights and gradients, fp32 master
weights, fp32 Adam momentum and variance: ZeRO paper, Rajbhandari et al. 2020, §3.1) and
Megatron-LM's (fp32 main gradients, distributed optimizer). The rows and where each number
comes from are in llmbench.memory.constants.

Activations saved for the backward pass, per token and decoder layer, in bytes, from
Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
§4.1, eq. 1 and, with t-way tensor parallelism and no sequence parallelism, eq. 2):

    h * (10 + 24 / t) + 5 * a * s / t      (2-byte activations; a heads, s sequence, h width)

The ``5·a·s`` part is the attention scores, softmax and its dropout (2 + 2 + 1 bytes per
score): FlashAttention (F) never materialises them, so it drops out. Llama has no dropout
and a SwiGLU MLP of width f ≈ 2.7h with three matrices where GPT has 4h and two: their
saved tensors come to about the same 24h, so the formula is kept and its scale fitted per
backend (``act_scale``; torch.compile (C) saves fewer: ``COMPILED_ACT_SCALE``; a cell
under ZeRO-3 1.4 times as many: ``ZERO3_ACT_SCALE``, and an adapter's recomputed layer under
it 1.54 times: ``ZERO3_RECOMPUTED_ADAPTER_SCALE``; a 4-bit full-parameter cell (Q) 1.1 times:
``QUANT4_ACT_SCALE``). LoRA adds, unscaled, what its
own dropout keeps: 3 bytes per input element of each target linear
(``adapter_dropout_bytes``). With
recomputation (R) each checkpointed layer keeps only its 2-byte input (``2h`` per token and
layer), and one layer's full activations are alive while it is recomputed (after the logits
are freed: the larger of the two counts). The logits (vocabulary V per token: bf16 logits, their fp32 upcast and
the loss's fp32 gradient) are ``logits_bytes · V`` per token (fitted), split over tensor-
parallel ranks (Megatron-LM's vocabulary-parallel loss).

Parameters that do not train (a 4-bit or adapter base) take 2 bytes (bf16) or ``NF4``
bytes (4-bit with double quantization; embeddings, lm_head and norms stay bf16); what
trains (adapters; the embeddings, norms and lm_head under Q) takes the technique's state
bytes. ZeRO-3 shards a frozen base too; with offload (Z3+O) it moves the frozen bf16 base
to the host (``StateRow.frozen_host``) but for the parameters in use
(``ZERO3_MAX_LIVE_PARAMETERS``).

Reserved memory (``Prediction.reserved_gib``): PyTorch's caching allocator keeps freed
blocks, and at a large batch the loss's blocks leave the others cached: reserved runs ahead
of allocated by ``CACHED_LOGITS_BYTES · V`` per token plus ``CACHED_ACTIVATION_FRACTION`` of
the saved activations (both fitted), on top of the forward/backward peak; through a ZeRO-1/2
optimizer step the freed whole bf16 gradients stay cached (``ZERO2_STEP_CACHED_GRAD_BYTES``),
and with offload through the backward pass that hands them to the host
(``OFFLOAD_CACHED_GRAD_BYTES``).

``margin``: a cell is predicted to fit when ``reserved_gib · (1 + margin)`` is at most the
platform's ``gpu_memory_gib`` (and, with offload, the host memory holds every rank's host
share). The margin covers the rest of the allocator's slack and the model's error; it is
set per technique family (``family``) from the held-out error (llmbench.memory.heldout), and
its values and how they were chosen are in llmbench.memory.constants (FAMILY_MARGINS, MARGIN).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import techniques
from ..models import ModelSpec
from ..platforms import Platform
from ..spec import RunSpec
from .constants import (BACKENDS, BUCKETS, CACHED_ACTIVATION_FRACTION, CACHED_LOGITS_BYTES, COMPILED_ACT_SCALE,
                        DEEPSPEED, FP8_ACT_SCALE, FSDP2_COMPILED_ACT_SCALE, FSDP2_FULL_ACT_SCALE,
                        FSDP2_GATHERED_BYTES, FSDP2_LIVE_LAYERS, FSDP2_REDUCE_BYTES,
                        FSDP2_REPLICATED, FSDP2_ROOT_REDUCE_BYTES, FSDP2_SHARDED, MEGATRON,
                        MEGATRON_DISTOPT, OFFLOAD_CACHED_GRAD_BYTES, QUANT4_ACT_SCALE, RECOMPUTED_LAYER_PEAK,
                        ZERO3_ACT_SCALE, ZERO2_STEP_CACHED_GRAD_BYTES, ZERO3_MAX_LIVE_PARAMETERS,
                        ZERO3_RECOMPUTED_ADAPTER_SCALE,
                        ZERO3_REDUCE_BUCKET_ELEMENTS, ZERO3_REDUCE_BUCKETS_IN_FLIGHT,
                        ZERO3_STEP_GRAD_COPY_BYTES, ZERO3_SUB_GROUP_SIZE, margin_for)

GIB = 2**30
#: bytes per parameter of the model states (kept for the findings' lower bound)
WEIGHTS_BF16 = 2.0
GRADS = 4.0  # DeepSpeed's bf16 mode keeps fp32 gradient accumulation
ADAM_FP32 = 12.0  # fp32 master weights, momentum, variance
NF4 = 0.53  # 4 bits + double-quantized block constants (QLoRA paper, Dettmers et al. 2023, §2: 4.127 bits)
#: Llama decoder linears: name -> (input width, output width) as functions of the spec
LINEAR_SHAPES = {
    "q_proj": lambda m: (m.hidden_size, m.hidden_size),
    "k_proj": lambda m: (m.hidden_size, m.num_key_value_heads * m.head_dim),
    "v_proj": lambda m: (m.hidden_size, m.num_key_value_heads * m.head_dim),
    "o_proj": lambda m: (m.hidden_size, m.hidden_size),
    "gate_proj": lambda m: (m.hidden_size, m.intermediate_size),
    "up_proj": lambda m: (m.hidden_size, m.intermediate_size),
    "down_proj": lambda m: (m.intermediate_size, m.hidden_size),
}


@dataclass(kw_only=True, slots=True, frozen=True)
class Workload:
    """What decides one rank's memory: a training cell without its platform."""

    model: ModelSpec
    """The model's dimensions."""
    technique: str
    """Technique name (llmbench.techniques)."""
    batch_size: int
    """Per-GPU micro-batch."""
    seq_len: int
    """Tokens per sequence."""
    gpus: int = 1
    """Ranks of the cell."""
    backend: str = "deepspeed"
    """deepspeed, megatron or fsdp2 (BACKENDS; ``modelled``)."""
    parallel: dict[str, Any] | None = None
    """Megatron-LM's layout (tensor_parallel, pipeline_parallel, distributed_optimizer)."""
    adapter: dict[str, Any] | None = None
    """The cell's resolved adapter settings (lora: rank, target_modules; prompt_tuning)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.gpus < 1:
            raise ValueError(f"gpus must be >= 1, got {self.gpus}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {self.backend!r}")
        if not modelled(self.backend, self.technique):
            raise ValueError(f"{self.backend} {self.technique}: not modelled (FSDP2's CPU offload has one record)")

    @property
    def tech(self) -> techniques.Technique:
        """The technique's flags (techniques.parse, memoised: parsed once per name)."""
        return techniques.parse(self.technique)

    @classmethod
    def from_spec(cls, spec: RunSpec | dict[str, Any], batch_size: int | None = None) -> Workload:
        """The workload of a training cell's run spec (llmbench.spec.RunSpec, or its JSON form:
        llmbench.grid.Grid.spec)."""
        spec = RunSpec.of(spec)
        cell = spec.cell
        return cls(model=spec.model, technique=cell.technique, batch_size=batch_size or cell.batch_size,
                   seq_len=cell.protocol.seq_len, gpus=cell.gpus, backend=cell.backend, parallel=cell.parallel,
                   adapter=cell.adapter)

    def with_batch(self, batch_size: int) -> Workload:
        """The same workload at another batch size."""
        return Workload(model=self.model, technique=self.technique, batch_size=batch_size, seq_len=self.seq_len,
                        gpus=self.gpus, backend=self.backend, parallel=self.parallel, adapter=self.adapter)


@dataclass(kw_only=True, slots=True, frozen=True)
class Prediction:
    """Predicted memory of one rank of a cell (GiB)."""

    gpu_gib: float
    """Peak GPU memory allocated by tensors (the larger of the two phases)."""
    host_gib: float
    """Peak host RSS of one rank (the process plus what offload keeps there)."""
    phase: str
    """'forward-backward' or 'optimizer step': where the peak is."""
    terms: dict[str, float] = field(default_factory=dict)
    """Each term in GiB: states_fb, states_step, activations, recomputed_layer, logits, buffers,
    beside (what the forward/backward peak holds beside states and saved activations: the
    logits or a recomputed layer, and the buckets where they are there), overhead,
    host_offload, cached (reserved beyond allocated at the forward/backward peak), cached_step
    (the same at the optimizer step)."""
    reserved_gib: float | None = None
    """Peak GPU memory reserved by the caching allocator: the forward/backward peak plus the
    blocks it keeps cached (``terms['cached']``), or the step's peak if larger; what a cell
    must fit (``fits``) and what a max-batch search measures. None: as ``gpu_gib``."""
    family: str = ""
    """The cell's technique family (``family``): which safety margin ``fits`` applies."""

    def __post_init__(self) -> None:
        if self.reserved_gib is None:
            object.__setattr__(self, "reserved_gib", self.gpu_gib)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (for records)."""
        return {"gpu_gib": self.gpu_gib, "reserved_gib": self.reserved_gib, "host_gib": self.host_gib,
                "phase": self.phase, "family": self.family, "terms": dict(self.terms)}


#: The technique families the held-out validation leaves out one at a time and the safety
#: margin is set per (llmbench.memory.heldout, constants.FAMILY_MARGINS): each groups the
#: cells whose memory the same terms and fitted constants decide. A cell takes the first that
#: applies, in this order.
FAMILIES = ("megatron", "fsdp2", "qlora", "lora", "4-bit", "offload", "zero3", "recompute", "zero2", "naive")


def modelled(backend: str, technique: str) -> bool:
    """Whether the model predicts a training cell of ``backend`` and ``technique``: DeepSpeed's
    and Megatron-LM's, and FSDP2's but with CPU offload (not_modelled says why not)."""
    return not_modelled(backend, technique) is None


def not_modelled(backend: str, technique: str) -> str | None:
    """Why the model predicts no cell of ``backend`` and ``technique``; None where it does
    (as llmbench.throughput.model.not_modelled answers for step times)."""
    if backend not in BACKENDS:
        return (f"backend {backend!r} is not modelled (the model predicts {', '.join(sorted(BACKENDS))}; "
                "a profile cell's plain PyTorch step and serving forward passes have no fitted constants)")
    if backend == "fsdp2" and techniques.parse(technique).offload:
        return f"{backend} with CPU offload ({technique}) is not modelled: one record, too few to fit its constants"
    return None


def family(w: Workload) -> str:
    """A workload's technique family (FAMILIES): Megatron-LM; FSDP2; DeepSpeed's adapters on a 4-bit
    base (QLoRA) or on a bf16 one (LoRA, LoRA-FA, DoRA, prompt tuning); then full-parameter
    cells by the term that sets them apart: 4-bit (Q: QUANT4_ACT_SCALE), offload (+O: the
    offload rows' fitted GPU and host bytes), ZeRO-3 (ZERO3_ACT_SCALE and its sub-group copy),
    recomputation (R: layer inputs, a recomputed layer), ZeRO-2 (sharded optimizer, buckets),
    and the rest (ZeRO-0, with or without F and C)."""
    tech = w.tech
    if w.backend in ("megatron", "fsdp2"):
        return w.backend
    if tech.adapter is not None:
        return "qlora" if tech.quant4 else "lora"
    if tech.quant4:
        return "4-bit"
    if tech.offload:
        return "offload"
    if tech.zero_stage == 3:
        return "zero3"
    if tech.recompute:
        return "recompute"
    return "zero2" if tech.zero_stage in (1, 2) else "naive"


def adapter_params(model: ModelSpec, adapter: dict[str, Any] | None) -> tuple[int, int]:
    """(trainable, frozen extra) parameters an adapter adds: LoRA r·(in + out) per target
    linear and layer (Hu et al. 2021); DoRA adds a magnitude per output (Liu et al. 2024);
    LoRA-FA trains only B (r·out) and keeps A frozen (Zhang et al. 2023); prompt tuning
    trains num_virtual_tokens · h."""
    if not adapter:
        return 0, 0
    kind = adapter.get("kind", "lora")
    if kind == "prompt_tuning":
        return int(adapter.get("num_virtual_tokens", 0)) * model.hidden_size, 0
    r = int(adapter.get("rank", 0))
    trainable = frozen = 0
    for name in adapter.get("target_modules") or ():
        fan_in, fan_out = LINEAR_SHAPES[name](model)
        if kind == "lora_fa":
            trainable += r * fan_out
            frozen += r * fan_in
        else:
            trainable += r * (fan_in + fan_out) + (fan_out if kind == "dora" else 0)
    return trainable * model.num_hidden_layers, frozen * model.num_hidden_layers


def _layout(w: Workload) -> tuple[int, int, int, bool]:
    """(tensor-parallel, pipeline-parallel, data-parallel ranks, distributed optimizer)."""
    p = w.parallel or {}
    tp, pp = int(p.get("tensor_parallel", 1)), int(p.get("pipeline_parallel", 1))
    return tp, pp, max(1, w.gpus // (tp * pp)), bool(p.get("distributed_optimizer", False))


def state_bytes(w: Workload) -> tuple[float, float, float]:
    """(forward/backward, optimizer step, host offload) bytes of one rank's model states."""
    tech = w.tech
    counts = w.model.param_counts()
    n = counts["total"]
    if w.backend == "megatron":
        tp, pp, dp, distopt = _layout(w)
        row = MEGATRON_DISTOPT if distopt else MEGATRON
        local = n / (tp * pp)
        return row.fb.per_rank(local, dp), row.step.per_rank(local, dp), 0.0
    if w.backend == "fsdp2":
        return _fsdp2_state_bytes(w)
    row = DEEPSPEED[(tech.zero_stage, tech.offload)]
    g = w.gpus
    if tech.adapter is not None:
        trainable, frozen_extra = adapter_params(w.model, w.adapter)
        base = _frozen_base_bytes(counts, quant4=tech.quant4) + 2.0 * frozen_extra
    elif tech.quant4:  # 4-bit pre-training: embeddings, norms and lm_head train
        trainable = n - counts["decoder_linear"]
        base = counts["decoder_linear"] * NF4
    else:
        trainable, base = n, 0.0
    host = row.host.per_rank(trainable, g)
    if row.frozen_host and tech.adapter is not None and not tech.quant4:
        # ZeRO-3 + O: the frozen bf16 base is partitioned to the host with the rest, and the
        # GPU holds the gathered parameters in use (a 4-bit base is left as it is:
        # bitsandbytes' packed weights under offload_param are untried)
        frozen = base / WEIGHTS_BF16
        host, base = host + row.frozen_host * frozen / g, WEIGHTS_BF16 * min(frozen, ZERO3_MAX_LIVE_PARAMETERS)
    elif tech.zero_stage == 3:
        base = base / g
    step = base + row.step.per_rank(trainable, g)
    if tech.zero_stage == 3 and not tech.offload:  # one optimizer sub-group's gradient copy
        step += ZERO3_STEP_GRAD_COPY_BYTES * min(ZERO3_SUB_GROUP_SIZE, trainable / g)
    return base + row.fb.per_rank(trainable, g), step, host


def _fsdp2_state_bytes(w: Workload) -> tuple[float, float, float]:
    """FSDP2's model states of one rank (constants.FSDP2_*): the trained parameters' row,
    sharded or (no Z flag) replicated; an adapter's frozen base in shards (bf16, or on an NF4
    base (QL) the decoder's linears in NF4 and the rest in bf16); through
    forward/backward the all-gathered bf16 copies (fsdp2_gathered_bytes); at the step, where
    sharded over several ranks, the root's fp32 gradients to reduce."""
    tech = w.tech
    shard = 1 if tech.zero_stage == 0 else w.gpus
    row = FSDP2_REPLICATED if tech.zero_stage == 0 else FSDP2_SHARDED
    if tech.adapter is not None:  # QL: the decoder's linears in torchao's NF4, sharded as they are
        trainable, frozen_extra = adapter_params(w.model, w.adapter)
        base = (_frozen_base_bytes(w.model.param_counts(), quant4=tech.quant4) + WEIGHTS_BF16 * frozen_extra) / shard
    else:
        trainable, base = w.model.param_counts()["total"], 0.0
    fb = base + fsdp2_gathered_bytes(w) + row.fb.per_rank(trainable, shard)
    step = base + row.step.per_rank(trainable, shard)
    if shard > 1 and tech.adapter is None:  # the root's fp32 gradients to reduce (FSDP2_ROOT_REDUCE_BYTES)
        step += FSDP2_ROOT_REDUCE_BYTES * _fsdp2_units(w.model)[0]
    return fb, step, 0.0


def fsdp2_gathered_bytes(w: Workload) -> float:
    """FSDP2's all-gathered parameters alive at the forward pass's end: every layer's without
    resharding after forward (Z2, no Z flag), else the root's and FSDP2_LIVE_LAYERS decoder
    layers' (constants.FSDP2_GATHERED_BYTES a bf16 parameter; on an NF4 base (QL) the
    decoder's linears are gathered in NF4, as they are stored); 0 for another backend."""
    if w.backend != "fsdp2":
        return 0.0
    extra = sum(adapter_params(w.model, w.adapter)) if w.tech.adapter is not None else 0
    linear = w.model.param_counts()["decoder_linear"] if w.tech.quant4 else 0
    if w.tech.zero_stage != 3:
        return FSDP2_GATHERED_BYTES * (w.model.param_counts()["total"] + extra - linear) + NF4 * linear
    root, layer = _fsdp2_units(w.model, extra)
    per_layer = linear / w.model.num_hidden_layers
    return (FSDP2_GATHERED_BYTES * (root + FSDP2_LIVE_LAYERS * (layer - per_layer))
            + NF4 * FSDP2_LIVE_LAYERS * per_layer)


def _fsdp2_units(model: ModelSpec, extra: float = 0.0) -> tuple[float, float]:
    """Parameters of FSDP2's root unit (embeddings, final norm, lm_head) and of one decoder
    layer's unit (``extra``: an adapter's, spread over the layers)."""
    counts = model.param_counts()
    root = counts["embedding"] + counts["lm_head"] + model.hidden_size
    return root, (counts["total"] + extra - root) / model.num_hidden_layers


def fsdp2_step_cached_bytes(w: Workload, beyond_states: float) -> float:
    """What FSDP2's caching allocator keeps reserved through the optimizer step beyond what it
    allocates: what the forward/backward peak held beyond the trained states (``beyond_states``:
    activations, logits, gathered copies) and FSDP2_LIVE_LAYERS layers' reduce-scatter buffers
    (constants.FSDP2_REDUCE_BYTES per parameter of a layer)."""
    layer = _fsdp2_units(w.model)[1]
    trains_layers = w.tech.adapter is None  # an adapter's layers reduce only the adapters' gradients
    return beyond_states + (FSDP2_LIVE_LAYERS * FSDP2_REDUCE_BYTES * layer if trains_layers else 0.0)


def _frozen_base_bytes(counts: dict[str, int], quant4: bool) -> float:
    """Bytes of a frozen base: bf16, or 4-bit decoder linears with the rest in bf16."""
    if not quant4:
        return WEIGHTS_BF16 * counts["total"]
    return counts["decoder_linear"] * NF4 + (counts["total"] - counts["decoder_linear"]) * WEIGHTS_BF16


def layer_activation_bytes(model: ModelSpec, seq_len: int, flash: bool, tp: int = 1) -> float:
    """Korthikanti et al. 2022, eq. 1 (tp = 1) and eq. 2 (no sequence parallelism): bytes
    per token and decoder layer, 2-byte activations, before the backend's scale.

    Grouped-query attention is left out on purpose: the formula counts keys and values h
    wide (multi-head attention's 2h bytes each), also where num_key_value_heads x head_dim is
    narrower. Eager attention (no F) repeats them to every query head before its matmuls
    (transformers' repeat_kv), so it does save h-wide copies; FlashAttention could save them
    kv wide, 4(h - kv) fewer bytes, but the records of the one GQA model measured say it
    does not: llama2-70b QL+F on one H100 grew 13.20 GiB from batch 1 to 2, 13.27 with h-wide
    keys and values, 12.54 with kv-wide ones, and at batch 6 on one H200 held 125.17 GiB,
    125.24 predicted h wide and 120.88 (3.4 % short) kv wide. GQA enters the model through
    the parameter counts (ModelSpec.param_counts, LINEAR_SHAPES: k_proj and v_proj are kv
    wide), which set the model states and the adapters' sizes."""
    h, a = model.hidden_size, model.num_attention_heads
    return h * (10 + 24 / tp) + (0.0 if flash else 5.0 * a * seq_len / tp)


def adapter_dropout_bytes(model: ModelSpec, adapter: dict[str, Any] | None) -> float:
    """Bytes per token and decoder layer that LoRA's dropout saves (exact, not scaled): PEFT
    applies a dropout of its own to each target linear's input, and the backward pass keeps
    its output (2 bytes, lora_A's input) and its mask (1 byte) for every input element; q,
    k and v each keep a copy of the same input. 0 without dropout and for prompt tuning."""
    if not adapter or adapter.get("kind", "lora") == "prompt_tuning" or not adapter.get("dropout"):
        return 0.0
    return 3.0 * sum(LINEAR_SHAPES[name](model)[0] for name in adapter.get("target_modules") or ())


def zero3_scale(tech: techniques.Technique) -> float:
    """What ZeRO-3 multiplies a cell's saved activations by: ZERO3_ACT_SCALE without
    recomputation (an adapter's dropout copies too), ZERO3_RECOMPUTED_ADAPTER_SCALE on an
    adapter's recomputed layer, 1 otherwise (a full-parameter recomputed layer, no ZeRO-3)."""
    if tech.zero_stage != 3:
        return 1.0
    if tech.recompute:
        return ZERO3_RECOMPUTED_ADAPTER_SCALE if tech.adapter is not None else 1.0
    return ZERO3_ACT_SCALE


def quant4_full_parameter(tech: techniques.Technique) -> bool:
    """A 4-bit full-parameter cell (Q without an adapter) without recomputation: its
    activations take QUANT4_ACT_SCALE."""
    return tech.quant4 and tech.adapter is None and not tech.recompute


def compiled_scale(w: Workload) -> float:
    """What compiled layers (C) save over the eager cell's activations at the backend's scale
    (1 without C): a full-parameter FSDP2 cell's own FSDP2_COMPILED_ACT_SCALE (its eager
    cell's FSDP2_FULL_ACT_SCALE not taken), else COMPILED_ACT_SCALE."""
    if not w.tech.compiled:
        return 1.0
    return FSDP2_COMPILED_ACT_SCALE if w.backend == "fsdp2" and w.tech.adapter is None else COMPILED_ACT_SCALE


def activation_bytes(w: Workload) -> tuple[float, float, float]:
    """(saved activations, one recomputed layer, logits) in bytes of one rank for one
    micro-batch. Without recomputation no layer is recomputed (0); a recomputed layer's
    backward holds RECOMPUTED_LAYER_PEAK times what the layer saves."""
    tech = w.tech
    k = BACKENDS[w.backend]
    tp = _layout(w)[0] if w.backend == "megatron" else 1
    seq = w.seq_len + (int((w.adapter or {}).get("num_virtual_tokens", 0)) if tech.adapter == "prompt_tuning" else 0)
    tokens = w.batch_size * seq
    zero3 = zero3_scale(tech) if w.backend == "deepspeed" else 1.0  # DeepSpeed's ZeRO-3 wrapper's copies
    scale = (k.act_scale * compiled_scale(w) * zero3 * (QUANT4_ACT_SCALE if quant4_full_parameter(tech) else 1.0)
             * (FSDP2_FULL_ACT_SCALE if w.backend == "fsdp2" and tech.adapter is None and not tech.compiled else 1.0)
             * (FP8_ACT_SCALE if tech.fp8 else 1.0))
    per_layer = tokens * (scale * layer_activation_bytes(w.model, seq, tech.flash, tp)
                          + zero3 * adapter_dropout_bytes(w.model, w.adapter))
    logits = tokens * k.logits_bytes * w.model.vocab_size / tp
    if tech.recompute:
        return (tokens * w.model.num_hidden_layers * 2.0 * w.model.hidden_size,
                per_layer * RECOMPUTED_LAYER_PEAK, logits)
    return w.model.num_hidden_layers * per_layer, 0.0, logits


def buffer_bytes(w: Workload) -> float:
    """DeepSpeed's communication buckets (llmbench.memory.constants.BUCKETS), none elsewhere."""
    if w.backend != "deepspeed":
        return 0.0
    return BUCKETS.get(w.tech.zero_stage, 0.0)


def buckets_in_backward_only(w: Workload) -> bool:
    """Whether the buckets live only through the backward pass: ZeRO-1/2 allocate them at
    the first gradient (DeepSpeed's ``setup_buckets``, from ``process_gradients``) and free
    them at the backward's end (``_release_ipg_buffers``), so neither the forward pass nor
    the optimizer step holds them; ZeRO-3 allocates its bucket once, at start-up."""
    return w.backend == "deepspeed" and w.tech.zero_stage in (1, 2)


def beside_activations_bytes(w: Workload, logits: float, layer: float, buffers: float) -> float:
    """What the forward/backward peak holds beside the model states and the saved activations:
    the larger of the forward pass's end (the logits and the loss) and the backward pass (a
    recomputed layer, and the buckets). The logits' gradient is freed once the output
    layer's backward has run; a full-parameter cell's first gradient (the output layer's
    weight) comes while it is alive, so its buckets sit beside the logits, but an adapter's
    first gradient comes after it (the records that show it: tables/memory-model of the combined view)."""
    if buckets_in_backward_only(w) and w.tech.adapter is not None:
        return max(logits, layer + buffers)
    return max(logits, layer) + buffers


def cached_bytes(w: Workload, activations: float) -> float:
    """What the caching allocator keeps reserved beyond the forward/backward peak of one
    rank: CACHED_LOGITS_BYTES per vocabulary entry and token (split as the logits are), and
    CACHED_ACTIVATION_FRACTION of the saved ``activations`` (bytes)."""
    tp = _layout(w)[0] if w.backend == "megatron" else 1
    return (w.batch_size * w.seq_len * CACHED_LOGITS_BYTES * w.model.vocab_size / tp
            + CACHED_ACTIVATION_FRACTION * activations)


def _trained_params(w: Workload) -> int:
    """The parameters ``w`` trains: an adapter's, or under 4-bit those outside the decoder's
    linears, else all."""
    counts = w.model.param_counts()
    if w.tech.adapter is not None:
        return adapter_params(w.model, w.adapter)[0]
    if w.tech.quant4:
        return counts["total"] - counts["decoder_linear"]
    return counts["total"]


def step_cached_bytes(w: Workload) -> float:
    """What the caching allocator keeps reserved through the optimizer step beyond what it
    allocates: under DeepSpeed's ZeRO-1/2 without offload the whole bf16 gradients of the
    trained parameters, freed as the step begins (ZERO2_STEP_CACHED_GRAD_BYTES); 0 elsewhere."""
    tech = w.tech
    if w.backend != "deepspeed" or tech.zero_stage not in (1, 2) or tech.offload:
        return 0.0
    return ZERO2_STEP_CACHED_GRAD_BYTES * _trained_params(w)


def offload_cached_bytes(w: Workload) -> float:
    """What the caching allocator keeps reserved through the forward/backward pass beyond
    ``cached_bytes``: under DeepSpeed's ZeRO-1/2 with offload the whole bf16 gradients of the
    trained parameters, freed as they go to the host (OFFLOAD_CACHED_GRAD_BYTES); 0 elsewhere."""
    tech = w.tech
    if w.backend != "deepspeed" or tech.zero_stage not in (1, 2) or not tech.offload:
        return 0.0
    return OFFLOAD_CACHED_GRAD_BYTES * _trained_params(w)


def stream_pool_bytes(w: Workload) -> float:
    """What DeepSpeed's ZeRO-3 keeps reserved for its all-gather and reduce-scatter streams over
    several data-parallel ranks, in both phases (constants.ZERO3_REDUCE_BUCKETS_IN_FLIGHT); 0
    elsewhere and on one rank."""
    if w.backend != "deepspeed" or w.tech.zero_stage != 3 or w.gpus < 2:
        return 0.0
    gathered = WEIGHTS_BF16 * ZERO3_MAX_LIVE_PARAMETERS
    reduced = 0.0 if w.tech.adapter is not None else (
        ZERO3_REDUCE_BUCKETS_IN_FLIGHT * ZERO3_REDUCE_BUCKET_ELEMENTS * WEIGHTS_BF16)
    return gathered + reduced


def predict(w: Workload) -> Prediction:
    """The predicted peak memory of one rank of ``w``."""
    fb_states, step_states, host = state_bytes(w)
    acts, layer, logits = activation_bytes(w)
    buffers = buffer_bytes(w)
    k = BACKENDS[w.backend]
    overhead = k.overhead_gib * GIB
    # the end of the forward pass (the logits and the loss) or the backward pass (a
    # recomputed layer; the logits are gone by then): the larger counts
    beside = beside_activations_bytes(w, logits, layer, buffers)
    fb = fb_states + acts + beside + overhead
    step = step_states + (0.0 if buckets_in_backward_only(w) else buffers) + overhead
    cached, cached_step = cached_bytes(w, acts) + offload_cached_bytes(w), step_cached_bytes(w)
    if w.backend == "fsdp2":  # a compiled layer's freed blocks are eager-sized (constants.FSDP2_REDUCE_BYTES)
        eager = acts / compiled_scale(w)
        cached_step = fsdp2_step_cached_bytes(w, eager + beside + fsdp2_gathered_bytes(w))
    pools = stream_pool_bytes(w)
    terms = {"states_fb": fb_states, "states_step": step_states, "activations": acts, "recomputed_layer": layer,
             "logits": logits, "buffers": buffers, "beside": beside, "overhead": overhead, "host_offload": host,
             "cached": cached, "cached_step": cached_step, "stream_pools": pools}
    return Prediction(gpu_gib=max(fb, step) / GIB, reserved_gib=(max(fb + cached, step + cached_step) + pools) / GIB,
                      host_gib=(host / GIB) + k.host_base_gib, family=family(w),
                      phase="forward-backward" if fb >= step else "optimizer step",
                      terms={n: v / GIB for n, v in terms.items()})


def batch_slope_gib(w: Workload) -> float:
    """GiB of reserved forward/backward peak each further batch element adds at ``w``'s
    batch (its activations, the larger of the logits and a recomputed layer, and the
    allocator's cached blocks): the slope of the line a max-batch search draws through its
    probes' reserved peaks (llmbench.search.algorithm)."""
    def grows(p: Prediction) -> float:
        return p.terms["activations"] + p.terms["beside"] + p.terms["cached"]
    return grows(predict(w.with_batch(w.batch_size + 1))) - grows(predict(w))


def fits(pred: Prediction, gpu_memory_gib: float | None, host_memory_gib: float | None = None,
         ranks_per_node: int = 1, margin: float | None = None) -> tuple[bool, str]:
    """Whether a prediction fits a GPU of ``gpu_memory_gib`` (and, with offload, a host of
    ``host_memory_gib`` shared by ``ranks_per_node`` ranks), with ``margin`` (None: its
    family's, constants.margin_for); and why not."""
    margin = margin_for(pred.family) if margin is None else margin
    if gpu_memory_gib and pred.reserved_gib * (1 + margin) > gpu_memory_gib:
        held = f"{pred.gpu_gib:.1f} allocated, " if f"{pred.gpu_gib:.1f}" != f"{pred.reserved_gib:.1f}" else ""
        return False, (f"predicted GPU peak {pred.reserved_gib:.1f} GiB reserved ({held}{pred.phase}) x "
                       f"(1 + margin {margin:g}) > {gpu_memory_gib:g} GiB")
    host = pred.host_gib * ranks_per_node
    if host_memory_gib and pred.terms.get("host_offload", 0.0) > 0 and host * (1 + margin) > host_memory_gib:
        return False, (f"predicted host memory {host:.1f} GiB ({ranks_per_node} rank(s) with offload) x "
                       f"(1 + margin {margin:g}) > {host_memory_gib:g} GiB")
    return True, ""


def predicted_max_batch(w: Workload, gpu_memory_gib: float, host_memory_gib: float | None = None,
                        ranks_per_node: int = 1, margin: float | None = None, max_batch: int = 4096) -> int:
    """The largest batch (at most ``max_batch``) predicted to fit; 0 where batch 1 does not.
    Memory grows with the batch, so the largest fitting one is found by bisection."""
    def ok(b: int) -> bool:
        return fits(predict(w.with_batch(b)), gpu_memory_gib, host_memory_gib, ranks_per_node, margin)[0]

    if not ok(1):
        return 0
    lo, hi = 1, max_batch + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def model_states_gib(model: ModelSpec, technique: str, gpus: int = 1) -> float:
    """GPU memory of the model states of one rank, in GiB: the larger of forward/backward's
    and the optimizer step's (no activations or buckets). Every cell steps, so this is a
    lower bound of any cell of the technique."""
    w = Workload(model=model, technique=technique, batch_size=1, seq_len=1, gpus=gpus)
    return max(state_bytes(w)[:2]) / GIB


def cannot_fit(model: ModelSpec, technique: str, gpus: int, gpu_memory_gib: float | None) -> bool:
    """Whether the model states alone exceed the GPU (a cell that surely runs out of memory)."""
    if not gpu_memory_gib:
        return False
    return model_states_gib(model, technique, gpus) > gpu_memory_gib


def host_memory_gib(platform: Platform | dict[str, Any]) -> float | None:
    """A platform's host memory per job in GiB (its Slurm mem_mb, which Slurm counts in
    MiB), or None."""
    slurm = platform.slurm if isinstance(platform, Platform) else platform.get("slurm")
    mb = (slurm or {}).get("mem_mb")
    return mb / 1024 if mb else None


def machine_host_gib(platform: dict[str, Any], machine_gib: float | None) -> float | None:
    """The host memory an offload cell had: its platform file's (Slurm mem_mb), or the
    machine's where that is smaller (a record's provenance: a one-GPU machine lent under a
    platform file that describes a larger node)."""
    on_file = host_memory_gib(platform)
    if machine_gib is None or machine_gib != machine_gib:  # None or NaN (a tidy table's empty cell)
        return on_file
    return min(on_file, float(machine_gib)) if on_file else float(machine_gib)
