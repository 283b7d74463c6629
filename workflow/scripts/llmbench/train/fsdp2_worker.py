"""PyTorch FSDP2 training worker (``torch.distributed.fsdp.fully_shard``): one repeat of one
cell, run by torchrun on every rank.

    torchrun ... -m llmbench.train.fsdp2_worker --spec spec.json --out repeat.json

Same contract and result keys as llmbench.train.deepspeed_worker (llmbench.train.contract),
so llmbench.aggregate.build_record and the tidy table treat it alike; the result adds
``fsdp2_config`` (what was built, and the torch that ran it), kept in provenance.

What runs, as torchtitan's parallelize_llama does it:
- The model is built on the meta device, ``fully_shard`` is applied to each decoder layer and
  then to the root, and only then are the parameters materialised, as this rank's shards, on
  the device (CPU with O) and random-initialised (llmbench.train.build.init_random): no rank
  ever holds the whole model. A sharded weight's values depend on the sharding (DTensor's
  random ops draw each rank's shard): random, as every benchmark's weights here, but not
  those of the same seed's unsharded build.
- Precision: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; the sharded
  parameters, which AdamW updates, stay fp32 (master weights); each layer's all-gather
  makes its bf16 copy. On an fp32 platform (config/platforms/cpu.yaml) no cast: fp32 throughout.
- The technique flags (DeepSpeed's terms) map to FSDP2 as ``plan`` says: Z3 reshards
  after forward (parameters, gradients and optimizer state sharded: ZeRO-3's counterpart);
  Z2 keeps each layer's gathered bf16 parameters from forward to backward. Unlike ZeRO-2,
  whose ranks keep every full bf16 parameter at rest, FSDP2's Z2 still shards parameters at
  rest and all-gathers them every forward: it saves the backward's all-gather, not the
  forward's. Naive (no Z flag) is full replication: a 2-D (replicate x 1) mesh, so each rank
  holds every parameter, gradient and optimizer state and gradients are all-reduced, what
  DeepSpeed's ZeRO stage 0 and DDP do. O: ``CPUOffloadPolicy`` (sharded parameters, their
  gradients and AdamW's state on the host; the optimizer steps there). R: activation
  checkpointing of each decoder layer (non-reentrant, transformers' own). F: SDPA or
  flash-attn, selected as for the other backends (build.attention_choice). C: each decoder
  layer compiled (build.compile_layers) before it is sharded; dynamo leaves FSDP2's hooks
  outside the graph, so C runs with Z3 here.
- FP8, FP8R: torchao's float8 training (torchao.float8.convert_to_float8_training) swaps the
  decoder layers' linears for Float8Linear on the meta model, before compilation and
  sharding, as torchtitan's float8 converter does: ``fp8_filter`` keeps the LM head (and the
  embeddings, which are no linears) in bf16 and skips any linear whose dims are not multiples
  of 16 (the FP8 tensor cores' requirement). FP8 is the tensorwise recipe with FSDP2's FP8
  all-gather (each shard cast to float8 before it is gathered: half the bytes of bf16) and,
  after every optimizer step, one all-reduce for the scales of all weights
  (precompute_float8_dynamic_scale_for_fsdp), torchtitan's tensorwise settings; FP8R the
  rowwise recipe (weights gathered in bf16, cast per row). The GEMMs run in FP8 through
  torch._scaled_mm, which needs CUDA SM 8.9+ (checked before the build); the casts around them
  are separate kernels unless C compiles them into the layers, so FP8 is fast with C only.
- Fine-tuning (L, LFA): LoRA through PEFT on a frozen base in the platform's compute dtype,
  adapters in fp32 (PEFT keeps adapter weights fp32 on a bf16 base), sharded as above; the
  adapters are re-initialised as PEFT does (A Kaiming-uniform, B zero) once materialised.
- QL: QLoRA as torchtune runs it under FSDP2: the decoder's linears (llmbench.nf4.LINEARS)
  hold their frozen weights as torchao NF4 tensors (4-bit NormalFloat in blocks of 64,
  scalers double-quantised in blocks of 256), which fully_shard splits on dim 0 and
  all-gathers in 4 bits; each forward and backward dequantises a gathered weight to the
  compute dtype for its GEMM (torchao's linear_nf4). Everything else stays in the compute
  dtype (PEFT's prepare_model_for_kbit_training, which casts it to fp32 for bitsandbytes'
  QLoRA, would dequantise an NF4 tensor). The NF4 weights are drawn whole, one at a time, on
  every rank from the same seed, quantised and split (torchtune's loading of an NF4 base):
  no rank holds more than one unquantised weight at a time.
- AdamW (lr 1e-5, betas 0.9/0.95, eps 1e-8, no weight decay; torch's fused kernel, as
  DeepSpeed's fused Adam on a GPU) with clipping at 1.0, as the DeepSpeed and Megatron-LM
  cells; gradients reduced in fp32.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .. import fp8, nf4
from ..spec import RunSpec
from ..techniques import Technique
from . import contract, scenario

#: AdamW as the DeepSpeed and Megatron-LM cells run it.
ADAMW = {"lr": 1e-5, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
CLIP_NORM = 1.0
#: Linears FP8 training leaves in bf16 by name (torchtitan filters its output projection):
#: the LM head, whose softmax input is the most sensitive to rounding.
FP8_SKIP_FQNS = ("lm_head",)


@dataclass(kw_only=True, slots=True, frozen=True)
class Plan:
    """How a technique's flags map to FSDP2 for one cell (``plan``)."""

    sharding: str
    """full (Z3) | no_reshard (Z2) | replicate (Naive)."""
    mesh_shape: tuple[int, ...]
    """The device mesh: (ranks,) to shard over every rank; (ranks, 1) to replicate (HSDP
    with one rank per shard group)."""
    reshard_after_forward: bool
    """fully_shard's reshard_after_forward for the decoder layers (the root never reshards)."""
    cpu_offload: bool
    """CPUOffloadPolicy: shards, gradients and optimizer state on the host."""
    recompute: bool
    """Activation checkpointing of each decoder layer."""
    compiled: bool
    """torch.compile of each decoder layer."""
    fp8: str | None = None
    """torchao float8 recipe of the decoder's linears: tensorwise | rowwise (None: bf16)."""
    fp8_all_gather: bool = False
    """FSDP2 all-gathers the FP8 linears' weights in float8 (tensorwise only)."""
    fp8_precompute_scales: bool = False
    """One all-reduce computes every FP8 weight's scale after each optimizer step (tensorwise
    with FP8 all-gather; torchao's precompute_float8_dynamic_scale_for_fsdp)."""
    nf4: bool = False
    """The decoder's linears a frozen 4-bit base of torchao NF4 tensors (QL)."""
    description: str
    """What the mapping means, in words (kept in provenance)."""


def plan(tech: Technique, ranks: int) -> Plan:
    """The FSDP2 plan of a technique on ``ranks`` ranks (module docstring)."""
    if tech.quant4 and (tech.adapter is None or tech.offload or tech.compiled):
        raise ValueError("FSDP2 cells run 4-bit (Q) weights only under LoRA (QL), without O or C "
                         "(llmbench.backends: fsdp2)")
    if tech.zero_stage == 3:
        sharding, shape, reshard = "full", (ranks,), True
        what = ("parameters, gradients and optimizer state sharded; each layer's parameters gathered for "
                "forward, freed after it and gathered again for backward (ZeRO-3's counterpart)")
    elif tech.zero_stage == 2:
        sharding, shape, reshard = "no_reshard", (ranks,), False
        what = ("parameters, gradients and optimizer state sharded; each layer's gathered parameters kept "
                "from forward to backward (unlike ZeRO-2, parameters are sharded at rest and gathered every "
                "forward; ZeRO-2 keeps full bf16 parameters on every rank)")
    else:
        sharding, shape, reshard = "replicate", (ranks, 1), False
        what = ("full replication: every rank holds all parameters, gradients and optimizer state; gradients "
                "all-reduced (DDP, DeepSpeed's ZeRO stage 0)")
    if tech.offload:
        what += "; sharded parameters, gradients and optimizer state on the host (CPUOffloadPolicy)"
    if tech.fp8 is not None and tech.offload:
        raise ValueError("FSDP2 cells do not run FP8 training with CPU offload (llmbench.backends: fsdp2)")
    if tech.quant4:
        what += ("; the decoder's linears a frozen 4-bit base (torchao NF4 tensors, sharded and all-gathered in "
                 "4 bits, dequantised for each GEMM)")
    tensorwise = tech.fp8 == "tensorwise"
    if tech.fp8 is not None:
        what += (f"; decoder linears in FP8 (torchao float8, {tech.fp8} scaling"
                 + (", weights all-gathered in float8, their scales precomputed after each optimizer step)"
                    if tensorwise else ", weights all-gathered in bf16)"))
    return Plan(sharding=sharding, mesh_shape=shape, reshard_after_forward=reshard, cpu_offload=tech.offload,
                recompute=tech.recompute, compiled=tech.compiled, fp8=tech.fp8, fp8_all_gather=tensorwise,
                fp8_precompute_scales=tensorwise, nf4=tech.quant4, description=what)


def process_group_backend(accelerator: str, tech: Technique) -> str:
    """torch.distributed's backend for a cell: gloo on the CPU, NCCL on GPUs, and with
    CPUOffloadPolicy on GPUs gloo beside NCCL for the host's tensors: the sharded gradients
    live on the host there, and clip_grad_norm_ all-reduces their partial norms where they
    live (torchtitan sets the same pair for its CPU offload)."""
    if accelerator == "cpu":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if tech.offload else "nccl"


def fp8_filter(module, fqn: str) -> bool:
    """Whether FP8 training converts ``module`` (torchao's module_filter_fn, torchtitan's rule):
    an nn.Linear not named in FP8_SKIP_FQNS whose dims are both multiples of 16 (llmbench.fp8)."""
    import torch

    if not isinstance(module, torch.nn.Linear):
        return False
    if any(skip in fqn.split(".") for skip in FP8_SKIP_FQNS):
        return False
    return fp8.dims_ok(*module.weight.shape)


def convert_fp8(model, plan_: Plan, *, emulate: bool = False) -> list[str]:
    """Swap the linears ``fp8_filter`` keeps for torchao's Float8Linear, in place (meta model,
    before compilation and fully_shard); the names of those converted. ``emulate``: torchao's
    FP8 arithmetic in high precision, where torch._scaled_mm cannot run (tests on a CPU); a
    cell never emulates."""
    import dataclasses

    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(plan_.fp8)
    if plan_.fp8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    if plan_.fp8 == "rowwise":
        # torchtitan's setting for rowwise under compile: inductor rounds the casts as eager
        # does, so compiled and eager scales agree (a known inductor gap for rowwise casts)
        torch._inductor.config.emulate_precision_casts = True
    converted: list[str] = []

    def keep(module, fqn: str) -> bool:
        ok = fp8_filter(module, fqn)
        if ok:
            converted.append(fqn)
        return ok

    convert_to_float8_training(model, config=config, module_filter_fn=keep)
    return converted


def check_fp8_device(accelerator: str, device) -> None:
    """Refuse FP8 training where torch._scaled_mm has no FP8 tensor cores (llmbench.fp8)."""
    fp8.check_device("FP8 training", accelerator, device)


def _local(p) -> Any:
    """This rank's part of a parameter (a DTensor's shard, or the tensor itself)."""
    return p.to_local() if hasattr(p, "to_local") else p


def _is_nf4(t) -> bool:
    """Whether a tensor (a parameter's local part) is torchao's NF4 tensor."""
    return type(t).__name__ == "NF4Tensor"


def _frozen_sum(t) -> float:
    """Sum of a frozen tensor's storage, float64: an NF4 tensor's quantised data, scalers and
    their factors (it has no sum of its own)."""
    import torch

    parts = [t.quantized_data, t.quantized_scalers, t.quantization_factor] if _is_nf4(t) else [t]
    return sum(float(x.detach().sum(dtype=torch.float64)) for x in parts)


def nf4_storage_bytes(model) -> tuple[int, int]:
    """(bytes this rank's NF4 parameters reference, bytes their own elements take): the storage
    behind each local NF4 tensor's quantised data, scalers and factors, against what those
    tensors hold. Equal where each rank holds only its shard (materialise_nf4)."""
    referenced = held = 0
    for p in model.parameters():
        t = _local(p)
        if _is_nf4(t):
            for x in (t.quantized_data, t.quantized_scalers, t.quantization_factor):
                referenced += x.untyped_storage().nbytes()
                held += x.numel() * x.element_size()
    return referenced, held


def convert_nf4(model) -> list[str]:
    """Give the decoder's linears (nf4.LINEARS) frozen torchao NF4 weights, in place, on the meta
    model before adapters and fully_shard (torchtune's FrozenNF4Linear); their names."""
    import torch
    from torchao.quantization import to_nf4

    converted = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in nf4.LINEARS:
            module.weight = torch.nn.Parameter(to_nf4(module.weight, nf4.BLOCK, nf4.SCALER_BLOCK),
                                               requires_grad=False)
            converted.append(name)
    return converted


def materialise_nf4(model, device, std: float, seed: int) -> frozenset[int]:
    """Draw each NF4 weight whole from N(0, std) on ``device`` (the same values on every rank:
    a generator seeded per weight), quantise it, copy this rank's rows (its dim-0 chunk in the
    shard group, as fully_shard splits) into a tensor of their own and put it in place of the
    empty shard (torchtune's loading of an NF4 base; FSDP2's load_state_dict hook re-reads the
    new shards); the ids of the new parameters. The copy matters: an NF4 chunk is a view of
    the whole weight's storage, and kept as the shard it would hold the whole base on every
    rank (nf4_storage_bytes counts it)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torchao.quantization import to_nf4

    shards = {}
    for i, (name, p) in enumerate(model.named_parameters()):
        if not (isinstance(p, DTensor) and _is_nf4(p._local_tensor)):
            continue
        mesh = p.device_mesh
        group = mesh["shard"] if mesh.ndim == 2 else mesh
        gen = torch.Generator(device).manual_seed(seed * 1_000_003 + i)
        full = torch.empty(p.shape, dtype=p.dtype, device=device).normal_(0.0, std, generator=gen)
        whole = to_nf4(full, nf4.BLOCK, nf4.SCALER_BLOCK)
        chunk = torch.chunk(whole, group.size(), dim=0)[group.get_local_rank()]
        rows = whole.new_zeros(chunk.size())  # torchtune's way: the rows in storage of their own
        rows.copy_(chunk)
        shards[name] = DTensor.from_local(rows, mesh, p.placements, run_check=False, shape=p.shape,
                                          stride=p.stride())
        del full, whole, chunk
    model.load_state_dict(shards, strict=False, assign=True)
    named = dict(model.named_parameters())
    return frozenset(id(named[n]) for n in shards)


def _decoder_layers(model) -> list:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]


class FSDP2Backend:
    """The scenario's backend (llmbench.train.scenario): a cell's model under fully_shard and
    torch's AdamW."""

    def __init__(self, cell, model_spec, accelerator: str, device, dtype, ranks: int) -> None:
        self.cell, self.model_spec, self.accelerator = cell, model_spec, accelerator
        self.device, self.dtype = device, dtype
        self.plan = plan(cell.tech, ranks)
        self.model = self.optimizer = None
        self.params: list = []
        self.trainable_desc = "all parameters"
        self.compiled_layers = 0
        self.fp8_linears: list[str] = []
        self.nf4_linears: list[str] = []
        self.frozen_before: float | None = None
        self.total_params = int(model_spec.param_counts()["total"])
        self.trainable_params = 0
        self.attn_ctx, self.attn_label = None, ""

    def build(self) -> scenario.Layout:
        """Meta model, adapters, recomputation, compilation, fully_shard per layer and root,
        materialised shards, random init, AdamW."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        from transformers import LlamaForCausalLM

        from . import adapters, build

        tech, plan_ = self.cell.tech, self.plan
        if plan_.fp8 is not None:
            check_fp8_device(self.accelerator, self.device)
        attn_impl, self.attn_ctx, self.attn_label = build.attention_choice(tech, self.accelerator)
        config = self.model_spec.hf_config(attn_implementation=attn_impl)
        # pre-training: fp32 parameters (the master weights); fine-tuning: the frozen base in
        # the compute dtype, adapters fp32 (PEFT's autocast_adapter_dtype)
        base_dtype = self.dtype if tech.adapter else torch.float32
        with torch.device("meta"):
            model = LlamaForCausalLM._from_config(config, dtype=base_dtype)
        model.config.use_cache = False
        if plan_.nf4:
            self.nf4_linears = convert_nf4(model)
        if tech.adapter:
            model, self.trainable_desc = adapters.apply(model, tech, self.cell.adapter, prepare_kbit=False)
        if plan_.fp8 is not None:
            self.fp8_linears = convert_fp8(model, plan_)
        if plan_.recompute:
            build.enable_recompute(model)
        layers = _decoder_layers(model)
        if plan_.compiled:
            self.compiled_layers = build.compile_layers(model)
        mesh_names = ("replicate", "shard") if len(plan_.mesh_shape) == 2 else ("shard",)
        mesh = init_device_mesh(self.device.type, plan_.mesh_shape, mesh_dim_names=mesh_names)
        mp = MixedPrecisionPolicy(param_dtype=None if self.dtype == torch.float32 else self.dtype,
                                  reduce_dtype=torch.float32)
        common: dict[str, Any] = {"mesh": mesh, "mp_policy": mp}
        if plan_.cpu_offload:
            common["offload_policy"] = CPUOffloadPolicy(pin_memory=self.accelerator == "cuda")
        for layer in layers:
            fully_shard(layer, reshard_after_forward=plan_.reshard_after_forward, **common)
        # the root (embeddings, final norm, lm_head): needed first in backward, never resharded
        fully_shard(model, reshard_after_forward=False, **common)
        model.to_empty(device="cpu" if plan_.cpu_offload else self.device)
        drawn = (materialise_nf4(model, self.device, config.initializer_range, self.cell.protocol.seed)
                 if plan_.nf4 else frozenset())
        build.init_random(model, config.initializer_range, skip=drawn)
        for module in model.modules():  # LoRA's own initialisation, on the materialised shards
            if hasattr(module, "reset_lora_parameters"):
                for name in module.lora_A:
                    module.reset_lora_parameters(name, True)
        inner = model.get_base_model().model if tech.adapter else model.model
        with torch.device(self.device):  # RoPE's inverse frequencies: a buffer, not a weight
            inner.rotary_emb = type(inner.rotary_emb)(config)
        model.train()
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.trainable_params = int(sum(p.numel() for p in self.params))  # a DTensor's numel is the whole
        # fused: in place, no temporaries (the foreach path's square root of the second moments
        # is a temporary the parameters' size: 25 GiB more at each step of a 7B model on one
        # GPU); torchtitan's default, for DTensors and host tensors (O) alike
        self.optimizer = torch.optim.AdamW(self.params, **ADAMW, fused=True)
        if self.has_frozen:
            self.frozen_before = self.frozen_checksum()
        return scenario.Layout(data_rank=dist.get_rank(), data_parallel=dist.get_world_size())

    @property
    def has_frozen(self) -> bool:
        """Whether part of the model is frozen (adapters)."""
        return self.trainable_params < self.total_params

    def frozen_checksum(self) -> float:
        """Sum of this rank's shards of every frozen parameter, float64 (no collective)."""
        return sum(_frozen_sum(_local(p)) for p in self.model.parameters() if not p.requires_grad)

    def step(self, ids):
        """Forward, backward (FSDP2 reduce-scatters the gradients), clipping and AdamW; the
        loss, not read back."""
        import torch

        with self.attn_ctx():
            loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, CLIP_NORM)
        self.optimizer.step()
        if self.plan.fp8_precompute_scales:
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            precompute_float8_dynamic_scale_for_fsdp(self.model)  # the next forward's all-gather uses them
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def synchronize(self) -> None:
        """Wait for the GPU (a CPU's ops are synchronous)."""
        if self.accelerator == "cuda":
            import torch

            torch.cuda.synchronize()

    def optimizer_numel(self) -> int:
        """Elements this rank's AdamW updates (its shards, or full copies when replicated)."""
        return sum(_local(p).numel() for g in self.optimizer.param_groups for p in g["params"])

    def config(self) -> dict[str, Any]:
        """What was built and how (the record's provenance.fsdp2_config)."""
        import torch

        bf16 = self.dtype == torch.bfloat16
        base = ("frozen base NF4 (the decoder's linears) and bf16 (the rest)" if self.plan.nf4 else
                "frozen base bf16")
        return {
            "framework": f"torch {torch.__version__}",
            **asdict(self.plan),
            "mixed_precision": ("param_dtype bf16 (each layer's gathered copy), reduce_dtype fp32; sharded "
                                "parameters fp32 (master weights)" if bf16 and not self.cell.tech.adapter else
                                f"param_dtype bf16, reduce_dtype fp32; {base}, adapters fp32" if bf16 else
                                "fp32 throughout"),
            # as built, read from the tensors: what AdamW updates and what stays frozen
            "trained_dtypes": sorted({str(_local(p).dtype).removeprefix("torch.") for p in self.params}),
            "frozen_dtypes": sorted({"nf4" if _is_nf4(_local(p)) else str(_local(p).dtype).removeprefix("torch.")
                                     for p in self.model.parameters() if not p.requires_grad}),
            "wrapped": "fully_shard on each decoder layer, then on the root",
            "optimizer": f"torch.optim.AdamW (fused) {dict(ADAMW, betas=list(ADAMW['betas']))}, clip_grad_norm {CLIP_NORM}",
            "attention": self.attn_label,
            "process_group": "gloo" if self.accelerator == "cpu" else "nccl",
            **({"fp8": {"recipe": self.plan.fp8, "torchao": _torchao_version(),
                        "linears_converted": len(self.fp8_linears),
                        "linears_bf16": sorted(n for n, m in self.model.named_modules()
                                               if isinstance(m, torch.nn.Linear) and n not in self.fp8_linears)}}
               if self.plan.fp8 is not None else {}),
            **({"nf4": {"torchao": _torchao_version(), "linears": len(self.nf4_linears), "block_size": nf4.BLOCK,
                        "scaler_block_size": nf4.SCALER_BLOCK,
                        **dict(zip(("storage_bytes", "local_bytes"), nf4_storage_bytes(self.model)))}}
               if self.plan.nf4 else {}),
        }


def _torchao_version() -> str:
    """torchao's version (FP8 and QL cells only import it)."""
    from importlib.metadata import version

    return version("torchao")


def run(spec: RunSpec | dict, out: Path) -> dict | None:
    """Build the sharded model, run the scenario (llmbench.train.scenario), return the result
    (rank 0); its summary has the phase clock (scenario.Phases) and, with C, compile stats."""
    phases = scenario.Phases()
    import torch
    import torch.distributed as dist

    from .. import platforms, provenance
    from . import build

    spec = RunSpec.of(spec)  # the worker's spec.json, parsed once
    cell, model_spec, platform = spec.cell, spec.model, spec.platform
    accelerator = platform.accelerator
    dtype = platforms.compute_dtype(platform)
    phases.mark("imports")
    dist.init_process_group(backend=process_group_backend(accelerator, cell.tech))
    rank = dist.get_rank()
    device = contract.local_device(accelerator)
    backend = FSDP2Backend(cell, model_spec, accelerator, device, dtype, dist.get_world_size())
    phases.mark("init_distributed")

    result = scenario.run(backend, cell.protocol, batch_size=cell.batch_size, vocab_size=model_spec.vocab_size,
                          accelerator=accelerator, device=device, phases=phases)

    on = device if accelerator == "cuda" else "cpu"
    unchanged = 1.0 if not backend.has_frozen else float(backend.frozen_checksum() == backend.frozen_before)
    counts = torch.tensor([float(backend.optimizer_numel()), unchanged], dtype=torch.float64, device=on)
    dist.all_reduce(counts)  # the second: how many ranks found their frozen shards unchanged
    if rank == 0:
        return {
            **result.payload(),
            "total_params": backend.total_params,
            "trainable_params": backend.trainable_params,
            "trainable_desc": backend.trainable_desc,
            "attention": backend.attn_label,
            "compute_dtype": platforms.dtype_name(dtype),
            "frozen_params_unchanged": (int(counts[1].item()) == dist.get_world_size()) if backend.has_frozen else None,
            "optimizer_param_numel": int(counts[0].item()),
            "fsdp2_config": backend.config(),
            "summary": {**(build.compile_stats(backend.compiled_layers) if backend.plan.compiled else {}),
                        **phases.seconds, **result.window.summary()},
            "versions": provenance.versions(),
            "devices": provenance.devices(),
        }
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point for one rank (llmbench.train.contract)."""
    return contract.main(lambda spec, out, trace_dir: run(spec, out), argv, __doc__)


if __name__ == "__main__":
    contract.leave(main())
