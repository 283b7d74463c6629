"""Megatron-LM pre-training worker (megatron-core): one repeat of one cell, run by torchrun.

    torchrun ... -m llmbench.train.megatron_worker --spec spec.json --out repeat.json

Same contract and same result keys as llmbench.train.deepspeed_worker (rank 0 writes
``--out``; an out-of-memory rank writes ``<out>.oom.rank<r>`` and exits with OOM_EXIT), so
llmbench.aggregate.build_record and the tidy table treat both backends alike. The result adds
``megatron_config`` (what was built and how), which the launcher keeps in provenance.

What runs (paper Section IV-A, Table II; megatron-core 0.16.1 on Python 3.11):
- GPTModel with the Llama 2 architecture from the cell's ModelSpec, random init: RMSNorm,
  SwiGLU (gated_linear_unit + silu), RoPE, no biases, untied embedding and output layer,
  GQA through num_query_groups = num_key_value_heads. Megatron's *local* layer spec
  (megatron-core's own PyTorch modules); TransformerEngine is not used, on CPU or GPU.
- Tensor, pipeline and data parallel from Cell.parallel (data = gpus / (tp*pp)); one
  micro-batch of ``batch_size`` samples per data-parallel rank per step (global batch =
  batch_size x data parallel, as DeepSpeed cells with gradient_accumulation_steps 1);
  the step is Megatron's own forward-backward schedule (pipelined when pp > 1, so a
  pipeline of one micro-batch runs with its bubble).
- R: *full* recomputation of every transformer layer (recompute_granularity "full",
  method "uniform", 1 layer per checkpoint): the same activations discarded as the
  DeepSpeed cells' gradient checkpointing of every decoder layer, so R means one thing in
  Tables II-IV. (Megatron's "selective" recomputation, of core attention only, is not
  what the technique grammar's R names.)
- F: core attention through torch's scaled_dot_product_attention, on a GPU restricted to
  its FlashAttention kernel, on a CPU its default kernel (flash-style). Without F:
  Megatron's local DotProductAttention (explicit QK^T, softmax, PV: "unfused").
- Megatron's optimizer: get_megatron_optimizer with Adam (decoupled weight decay, i.e.
  AdamW: lr 1e-5, betas 0.9/0.95, eps 1e-8, no weight decay, clipping at 1.0, as the
  DeepSpeed cells), in the platform's compute dtype: bf16 parameters with fp32 main
  (master) weights and fp32 gradient reduction (the paper's), or fp32 throughout (the CPU
  platform, config/platforms/cpu.yaml); ``use_distributed_optimizer`` from the cell
  (Megatron's ZeRO-1-like sharding of the fp32 state over data-parallel ranks). Its Adam
  is TransformerEngine's or Apex's fused one where installed, else torch's AdamW
  (recorded in megatron_config).
- GPU: NCCL, one device per local rank. CPU: gloo, and llmbench.train.megatron_cpu_compat
  stubs the hard-coded CUDA calls (applied only when the platform's accelerator is cpu).
  bf16 with fp32 master weights, the distributed optimizer, TP and PP all run on a CPU
  that way; CUDA-only fusions are switched off there (and on GPUs without Apex/TE they
  are left off where megatron-core has no fallback). Without Apex/TE megatron-core's
  RMSNorm is torch's, with fp32 weights (bf16 activations): recorded as it is.
- Verified on a CPU (tests/integration/test_megatron_cpu.py: 1 rank, DP2 with the distributed
  optimizer, TP2, PP2) and on a pair of H200s (NCCL, CUDA memory, jit fusions; llama2-7b
  DP2 with the distributed optimizer and TP2, batch 1 and the searched largest batch: the
  committed Table II runs, results/README.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ..spec import RunSpec
from . import contract, scenario

#: How R recomputes (see the module docstring): every layer, one layer per checkpoint.
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


#: The llama3 RoPE scaling megatron-core applies (its RotaryEmbedding._apply_scaling defaults):
#: only the factor is an argument of GPTModel.
MEGATRON_ROPE_SCALING = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192}


def rope_scaling_kwargs(model_spec) -> dict[str, Any]:
    """GPTModel's RoPE scaling arguments for a model's rope_scaling (none without it). Megatron
    fixes every llama3 constant but the factor, so a model that sets another value is refused
    rather than built with different frequencies than transformers would give it."""
    rs = model_spec.rope_scaling
    if not rs:
        return {}
    other = {k: rs[k] for k in MEGATRON_ROPE_SCALING if rs[k] != MEGATRON_ROPE_SCALING[k]}
    if other:
        raise ValueError(f"rope_scaling: megatron-core's GPTModel takes only the factor and fixes "
                         f"{MEGATRON_ROPE_SCALING}; model {model_spec.name} sets {other}")
    return {"rope_scaling": True, "rope_scaling_factor": float(rs["factor"])}


def transformer_config(model_spec, tech, parallel: dict[str, Any], accelerator: str, dtype):
    """Megatron's TransformerConfig for a Llama 2 ModelSpec, a technique, a layout and the
    platform's compute dtype (bf16 with fp32 main weights, or fp32 throughout)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    cpu = accelerator == "cpu"
    return TransformerConfig(
        num_layers=model_spec.num_hidden_layers,
        hidden_size=model_spec.hidden_size,
        ffn_hidden_size=model_spec.intermediate_size,
        num_attention_heads=model_spec.num_attention_heads,
        num_query_groups=model_spec.num_key_value_heads,
        kv_channels=model_spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=model_spec.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        tensor_model_parallel_size=parallel["tensor_parallel"],
        pipeline_model_parallel_size=parallel["pipeline_parallel"],
        sequence_parallel=False,
        bf16=dtype == torch.bfloat16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        # Weights are initialised where they live: on a GPU by Megatron's own path (its
        # CUDA RNG tracker, seeded below); host initialisation of llama2-7b would make and
        # split a 27 GB fp32 copy per rank and cost every probe of a search a minute.
        use_cpu_initialization=cpu,
        # Fusions: torch.jit kernels (bias+SwiGLU, bias+dropout+add) on a GPU; the fused
        # masked softmax only where its compiled extension (Apex / Megatron-LM's) is
        # importable, since megatron-core imports it without a fallback. None on a CPU.
        bias_activation_fusion=not cpu,
        masked_softmax_fusion=not cpu and importlib.util.find_spec("scaled_upper_triang_masked_softmax_cuda") is not None,
        bias_dropout_fusion=not cpu,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,  # needs Apex's fused weight-gradient kernel
        persist_layer_norm=False,
        # batch_isend_irecv needs no device synchronize on torch >= 2.x; on a CPU it cannot
        batch_p2p_sync=not cpu,
        **(RECOMPUTE if tech.recompute else {}),
    )


def layer_spec(tech, accelerator: str):
    """Megatron's local GPT layer spec (RMSNorm), core attention replaced by SDPA for F."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    if tech.flash:
        spec.submodules.self_attention.submodules.core_attention = sdpa_attention_class(accelerator)
    return spec


def attention_label(tech, accelerator: str) -> str:
    """What runs the attention of a cell (recorded as metrics.attention)."""
    if not tech.flash:
        return "megatron[unfused]"
    return "sdpa[flash]" if accelerator == "cuda" else "sdpa[default]"


def sdpa_attention_class(accelerator: str):
    """A Megatron core-attention module computing causal attention with torch's SDPA
    (FlashAttention kernel only on a GPU); a drop-in for the local DotProductAttention."""
    import contextlib

    import torch
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])) if accelerator == "cuda" else contextlib.nullcontext

    class SdpaAttention(DotProductAttention):
        """Causal self-attention through torch.nn.functional.scaled_dot_product_attention."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            """[s, b, heads, head_dim] query/key/value -> [s, b, heads * head_dim]."""
            assert attention_bias is None and packed_seq_params is None
            groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
            if groups > 1:  # GQA: each key/value head serves `groups` query heads
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            with kernel():
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=self.softmax_scale)
            sq, b = query.shape[0], query.shape[1]
            return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    return SdpaAttention


def _optimizer_numel(optimizer) -> int:
    """Elements this rank's inner torch optimizers update (fp32 main params, its shard)."""
    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return sum(p.numel() for o in parts for g in o.optimizer.param_groups for p in g["params"])


def _optimizer_class(optimizer) -> str:
    parts = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    return ", ".join(sorted({f"{type(o).__name__}({type(o.optimizer).__module__}.{type(o.optimizer).__name__})"
                             for o in parts}))


class MegatronBackend:
    """The scenario's backend (llmbench.train.scenario): megatron-core's GPTModel, DDP wrapper,
    optimizer and forward-backward schedule for a cell."""

    def __init__(self, cell, model_spec, tech, accelerator: str, device, dtype) -> None:
        self.cell, self.model_spec, self.tech = cell, model_spec, tech
        self.accelerator, self.device, self.dtype = accelerator, device, dtype
        self.model = self.optimizer = self.schedule = self.positions = None
        self.local_params = 0

    def build(self) -> scenario.Layout:
        """Model parallel groups, the model (seeded by Megatron's CUDA RNG tracker too), its
        DDP wrapper and Megatron's optimizer."""
        import torch
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.models.gpt import GPTModel
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed, param_is_not_tensor_parallel_duplicate

        cell, model_spec, tech, parallel = self.cell, self.model_spec, self.tech, self.cell.parallel
        bf16 = self.dtype == torch.bfloat16
        ps.initialize_model_parallel(tensor_model_parallel_size=parallel["tensor_parallel"],
                                     pipeline_model_parallel_size=parallel["pipeline_parallel"])
        model_parallel_cuda_manual_seed(cell.protocol.seed)
        config = transformer_config(model_spec, tech, parallel, self.accelerator, self.dtype)
        model = GPTModel(
            config=config, transformer_layer_spec=layer_spec(tech, self.accelerator),
            vocab_size=model_spec.vocab_size, max_sequence_length=model_spec.max_position_embeddings,
            pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
            share_embeddings_and_output_weights=model_spec.tie_word_embeddings,
            position_embedding_type="rope", rotary_base=int(model_spec.rope_theta),
            **rope_scaling_kwargs(model_spec),
        )
        model.to(self.device)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,  # Megatron-LM's default with bf16 (a no-op in fp32)
            use_distributed_optimizer=parallel["distributed_optimizer"],
            overlap_grad_reduce=False, overlap_param_gather=False,  # no CUDA streams on a CPU; kept alike on GPUs
        )
        self.model = DistributedDataParallel(config, ddp_config, model)
        config.finalize_model_grads_func = finalize_model_grads  # the data-parallel gradient reduction
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(optimizer="adam", lr=1e-5, min_lr=1e-5, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.95,
                            adam_eps=1e-8, clip_grad=1.0, bf16=bf16, params_dtype=self.dtype,
                            use_distributed_optimizer=parallel["distributed_optimizer"]),
            [self.model],
        )
        # each weight once per data-parallel replica: TP-replicated ones (norms) on TP rank 0 only
        self.local_params = sum(p.numel() for p in self.model.parameters()
                                if param_is_not_tensor_parallel_duplicate(p))
        self.positions = torch.arange(cell.protocol.seq_len, device=self.device).unsqueeze(0).expand(cell.batch_size, -1)
        self.schedule = get_forward_backward_func()
        # every rank of one data-parallel replica (its TP and PP ranks) sees the same batch
        return scenario.Layout(data_rank=ps.get_data_parallel_rank(), data_parallel=parallel["data_parallel"])

    def step(self, ids):
        """Megatron's forward-backward schedule over one micro-batch, then its optimizer; the
        loss on the last pipeline stage (a device tensor), None on the others."""
        def loss_func(per_token):
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach()}

        def forward_step(_data_iterator, chunk):
            return chunk(ids, self.positions, None, labels=ids), loss_func

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        reduced = self.schedule(forward_step_func=forward_step, data_iterator=None, model=[self.model],
                                num_microbatches=1, seq_length=self.cell.protocol.seq_len,
                                micro_batch_size=self.cell.batch_size, forward_only=False)
        ok, _, _ = self.optimizer.step()
        if not ok:
            raise RuntimeError("Megatron's optimizer skipped a step (non-finite gradients)")
        return reduced[-1]["loss"] if reduced else None  # the last pipeline stage holds the loss

    def synchronize(self) -> None:
        """Wait for the GPU (a CPU's ops are synchronous)."""
        if self.accelerator == "cuda":
            import torch

            torch.cuda.synchronize()


def run(spec: RunSpec | dict, out: Path) -> dict | None:
    """Build the model, Megatron's DDP and optimizer, run the scenario (llmbench.train.scenario),
    return the result (rank 0); its summary has the phase clock (scenario.Phases)."""
    phases = scenario.Phases()
    import contextlib

    import torch
    import torch.distributed as dist

    from .. import platforms, provenance
    from . import megatron_cpu_compat

    spec = RunSpec.of(spec)  # the worker's spec.json, parsed once
    cell, model_spec, tech, platform = spec.cell, spec.model, spec.tech, spec.platform
    dtype = platforms.compute_dtype(platform)
    bf16 = dtype == torch.bfloat16
    accelerator = platform.accelerator
    parallel = cell.parallel

    phases.mark("imports")
    dist.init_process_group(backend="gloo" if accelerator == "cpu" else "nccl")
    rank = dist.get_rank()
    device = contract.local_device(accelerator)
    compat = megatron_cpu_compat.apply(accelerator)  # None on a GPU
    # megatron-core's modules are imported here, outside the CPU mode (MegatronBackend.build uses them)
    import megatron.core.distributed  # noqa: F401
    import megatron.core.models.gpt  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.pipeline_parallel  # noqa: F401
    backend = MegatronBackend(cell, model_spec, tech, accelerator, device, dtype)
    phases.mark("init_distributed")  # and megatron-core's imports

    with compat or contextlib.nullcontext():
        result = scenario.run(backend, cell.protocol, batch_size=cell.batch_size, vocab_size=model_spec.vocab_size,
                              accelerator=accelerator, device=device, phases=phases)
        on = device if accelerator == "cuda" else "cpu"
        counts = torch.tensor([float(backend.local_params), float(_optimizer_numel(backend.optimizer))],
                              dtype=torch.float64, device=on)
        dist.all_reduce(counts)
        last = result.loss_last
        last_loss = torch.tensor([float("nan") if last is None else last], dtype=torch.float64, device=on)
        # the loss lives on the last pipeline stage: bring it to rank 0
        dist.all_reduce(last_loss.nan_to_num_(-1.0), op=dist.ReduceOp.MAX)
        optimizer_class = _optimizer_class(backend.optimizer)

    if rank == 0:
        # the sum over ranks counts each weight once per data-parallel replica
        trainable = int(counts[0].item()) // parallel["data_parallel"]
        return {
            **result.payload(),
            "total_params": int(model_spec.param_counts()["total"]),
            "trainable_params": trainable,
            "trainable_desc": "all parameters",
            "attention": attention_label(tech, accelerator),
            "compute_dtype": platforms.dtype_name(dtype),
            "frozen_params_unchanged": None,
            "optimizer_param_numel": int(counts[1].item()),
            "loss_last": last_loss.item(),
            "megatron_config": {
                **parallel,
                "layer_spec": "local (megatron-core's PyTorch modules; no TransformerEngine)",
                "recompute": dict(RECOMPUTE) if tech.recompute else None,
                "attention": attention_label(tech, accelerator),
                "precision": ("bf16 params and activations; fp32 main weights, Adam states and gradient reduction"
                              if bf16 else "fp32 params, activations, Adam states and gradient reduction"),
                "optimizer": optimizer_class,
                "micro_batches_per_step": 1,
                "process_group": "gloo" if accelerator == "cpu" else "nccl",
                "cpu_compat": megatron_cpu_compat.applied(),
            },
            "summary": {**phases.seconds, **result.window.summary()},
            "versions": provenance.versions(),
            "devices": provenance.devices(),
        }
    return None


def _teardown() -> None:
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()


def main(argv: list[str] | None = None) -> int:
    """Entry point for one rank (llmbench.train.contract)."""
    return contract.main(lambda spec, out, trace_dir: run(spec, out), argv, __doc__, teardown=_teardown)


if __name__ == "__main__":
    contract.leave(main())
