"""Building the random-initialised model a training cell runs: attention kernel, 4-bit.

Shared by every backend that trains a transformers Llama (pre-training, fine-tuning).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

import torch
# Imported here, not inside build_llama: deepspeed.zero.Init patches tensor constructors,
# and importing transformers' modeling code inside that context fails.
from transformers import LlamaForCausalLM

from ..models import ModelSpec
from ..platforms import dtype_name
from ..techniques import Technique

#: Linear layers of a Llama decoder layer that Q replaces by 4-bit NF4 layers.
DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

def q_trainable(dtype: torch.dtype) -> str:
    """What trains in a Q cell, in words (the record's trainable_desc)."""
    d = dtype_name(dtype)
    return (f"Q: the decoder's linear layers (q,k,v,o,gate,up,down) hold frozen 4-bit NF4 weights "
            f"with double quantization and {d} compute (bitsandbytes, as QLoRA); the embeddings, "
            f"RMSNorm weights and lm_head stay {d} and train")


def attention_choice(tech: Technique, accelerator: str) -> tuple[str, Callable[[], Any], str]:
    """(transformers attn_implementation, context manager factory, label) for a cell.

    GPU: F -> flash-attn 2 if installed, else SDPA restricted to its flash kernel;
         no F -> eager attention (the paper's baseline).
    CPU: F -> SDPA with its default kernels (a flash-style kernel on CPU);
         no F -> SDPA restricted to the math kernel.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if accelerator == "cuda":
        if not tech.flash:
            return "eager", contextlib.nullcontext, "eager"
        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2", contextlib.nullcontext, "flash_attention_2"
        return "sdpa", lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION]), "sdpa[flash]"
    if tech.flash:
        return "sdpa", contextlib.nullcontext, "sdpa[default]"
    return "sdpa", lambda: sdpa_kernel([SDPBackend.MATH]), "sdpa[math]"


def build_llama(spec: ModelSpec, attn_impl: str, dtype: torch.dtype, device: str | torch.device, *,
                quant4: bool = False):
    """A LlamaForCausalLM with random weights on ``device`` in ``dtype``; with ``quant4`` its
    decoder linears are frozen NF4 layers (quantize_4bit).

    Built on the meta device, then materialised one part at a time (embeddings, each decoder
    layer, final norm, lm_head) with init_random, and each decoder layer quantised as soon as
    it exists: the peak while building is the final model plus one layer in ``dtype``. Built
    in full first, llama2-70b took 78 GiB of an 80 GB GPU in its constructor, before any
    quantisation. Under DeepSpeed's zero.Init (ZeRO-3) the constructor runs on ``device``
    instead: zero.Init partitions each parameter as it is created, and meta tensors would
    bypass it."""
    config = spec.hf_config(attn_implementation=attn_impl)
    if _zero_init_active():
        with torch.device(device):
            model = LlamaForCausalLM._from_config(config, dtype=dtype)
        if quant4:
            quantize_4bit(model, dtype, device)
    else:
        with torch.device("meta"):
            model = LlamaForCausalLM._from_config(config, dtype=dtype)
        std = config.initializer_range
        inner = model.model
        parts = [(inner.embed_tokens, False), *((layer, quant4) for layer in inner.layers), (inner.norm, False)]
        if not config.tie_word_embeddings:
            parts.append((model.lm_head, False))
        for part, quantize in parts:
            part.to_empty(device=device)
            init_random(part, std)
            if quantize:
                quantize_4bit(part, dtype, device)
        # RoPE's inverse frequencies are buffers computed in the constructor, not weights
        with torch.device(device):
            inner.rotary_emb = type(inner.rotary_emb)(config)
        if config.tie_word_embeddings:
            model.lm_head.weight = inner.embed_tokens.weight
    model.config.use_cache = False
    return model


def _zero_init_active() -> bool:
    """Whether DeepSpeed's zero.Init context is open (it patches nn.Module construction)."""
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")  # not imported: not open
    return bool(zero is not None and zero.zero_init_context)


def init_random(module: torch.nn.Module, std: float, seed: int | None = None, threads: int = 1,
                skip: frozenset[int] = frozenset()) -> None:
    """transformers' own initialisation of a Llama, applied to ``module``'s parameters: linear
    and embedding weights from N(0, std) (std = initializer_range, 0.02), RMSNorm weights 1,
    biases 0. The one initialiser of every random model here (training and profile builds,
    the serving model directory).

    ``seed`` None: drawn from the global generator on the device the parameters are on, so a
    GPU build pays no host work. ``seed`` given (the serving model directory, on the host):
    the i-th of ``module.named_parameters()`` draws from its own generator seeded
    ``seed * 1_000_003 + i``, ``threads`` tensors at a time (torch's CPU normal_ is serial:
    llama2-7b took 5.6 min on one core), and the values do not depend on ``threads``.
    ``skip``: ids of parameters left as they are (drawn elsewhere: FSDP2's NF4 base)."""
    kinds: dict[int, str] = {}
    for sub in module.modules():
        if isinstance(sub, (torch.nn.Linear, torch.nn.Embedding)):
            kinds[id(sub.weight)] = "normal"
            if getattr(sub, "bias", None) is not None:
                kinds[id(sub.bias)] = "zero"
        elif type(sub).__name__.endswith("RMSNorm"):
            kinds[id(sub.weight)] = "one"

    @torch.no_grad()
    def fill(item: tuple[int, tuple[str, torch.nn.Parameter]]) -> None:
        i, (_, param) = item
        kind = None if id(param) in skip else kinds.get(id(param))
        if kind == "normal":
            gen = None if seed is None else torch.Generator(param.device).manual_seed(seed * 1_000_003 + i)
            param.normal_(0.0, std, generator=gen)
        elif kind == "zero":
            param.zero_()
        elif kind == "one":
            param.fill_(1.0)

    named = list(enumerate(module.named_parameters()))
    if seed is None or threads <= 1:
        for item in named:
            fill(item)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(fill, named))


def enable_recompute(model: torch.nn.Module) -> None:
    """Activation recomputation (R), non-reentrant. transformers 5.2x names it
    ``activation_checkpointing_enable`` (``gradient_checkpointing_enable`` is its deprecated
    alias, to go in v6); earlier 5.x, as on the GPU machines (5.17), has only the old name."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def compile_layers(model: torch.nn.Module) -> int:
    """C: compile every decoder layer with torch.compile (inductor), in place; returns how
    many. Regional compilation, PyTorch's recipe for transformer stacks: the layers share
    one compiled graph (their code and shapes are the same), so the compile time is one
    layer's, paid in the warm-up steps. It wraps nn.Module's call, so a recomputed layer (R)
    recomputes the compiled one."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    layers = [m for m in model.modules() if isinstance(m, LlamaDecoderLayer)]
    for layer in layers:
        layer.compile()
    return len(layers)


def compile_stats(layers: int) -> dict[str, int]:
    """What torch.compile did in this process, read after the steps ran: the ``layers``
    compile_layers compiled, graphs compiled and graph breaks (a break splits a layer into
    eagerly joined pieces, so more than one graph means lost fusion)."""
    from torch._dynamo.utils import counters

    return {"compiled_layers": layers,
            "compile_unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "compile_graph_breaks": int(sum(counters["graph_break"].values()))}


def quantize_4bit(model: torch.nn.Module, compute_dtype: torch.dtype, device: str | torch.device) -> int:
    """Replace every decoder linear layer by a frozen bitsandbytes NF4 layer (double quant).

    Returns the number of layers replaced. The weights are quantised from the random
    ones (in the compute dtype) on ``device`` (bitsandbytes quantises when a Params4bit moves to a device).
    """
    import bitsandbytes as bnb

    replaced = 0
    for _, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if child_name in DECODER_LINEARS and isinstance(child, torch.nn.Linear):
                q = bnb.nn.Linear4bit(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4",
                    device="meta",
                )
                q.weight = bnb.nn.Params4bit(
                    child.weight.data.to("cpu") if str(device) == "cpu" else child.weight.data,
                    requires_grad=False, compress_statistics=True, quant_type="nf4",
                )
                q = q.to(device)
                setattr(module, child_name, q)
                del child
                replaced += 1
    return replaced
