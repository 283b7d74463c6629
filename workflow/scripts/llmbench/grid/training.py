"""Training blocks (pretrain, finetune, profile) -> Cells and max-batch Searches: platforms x
models x techniques x GPU counts x batch sizes, each checked against its backend
(llmbench.backends), platform and model, errors naming the block key."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import replace
from typing import Any

from .. import backends, fp8, nf4, techniques
from ..cells import SEARCH_STAGES, TRAINING_STAGES, Cell, Search
from ..config import ConfigError
from ..models import LLAMA_LINEARS, ModelSpec
from ..platforms import Platform
from ..protocol import Protocol
from .base import Builder
from .paired import check_block

#: Block keys of Megatron-LM's parallel layout (null in the schema: not given).
MEGATRON_KEYS = ("tensor_parallel", "pipeline_parallel", "distributed_optimizer")


def expand(b: Builder, given: dict[str, list[dict[str, Any]]]) -> None:
    """Add every training block's cells and searches to ``b``. ``given``: each block's own
    protocol keys as written (before validation filled in defaults), per stage."""
    config = b.config
    for stage in TRAINING_STAGES:
        for i, block in enumerate(config[stage]):
            _block(b, stage, block, f"{stage}[{i}]", Protocol(**{**config["protocol"], **given[stage][i]}),
                   "seq_len" in given[stage][i])


def _block(b: Builder, stage: str, block: dict[str, Any], where: str, protocol: Protocol,
           own_seq_len: bool) -> None:
    b.check_names(block["platforms"], "platform", f"{where}.platforms")
    b.check_names(block["models"], "model", f"{where}.models")
    backend = _backend(block, stage, where)
    names = _techniques(block, where, stage, backends.get(backend))
    sizes, search = block["batch_sizes"], block["max_batch"]
    if sizes is None and search is None:
        raise ConfigError(f"{where}: give batch_sizes, max_batch (the search for the largest batch), or both")
    if search is not None and stage not in SEARCH_STAGES:
        raise ConfigError(f"{where}.max_batch: the search runs {' and '.join(SEARCH_STAGES)} cells, "
                          f"not {stage} cells")
    canon = _sizes_by_technique(sizes, names, where) if isinstance(sizes, dict) else None
    nodes = _nodes(block, stage, where)
    check_block(block, where)
    for plat_name, platform in b.block_platforms(block):
        gpu_counts = _gpu_counts(block["gpus"], platform, f"{where}.gpus", nodes)
        for model_name, tech, gpus in itertools.product(block["models"], names, gpu_counts):
            parsed = techniques.parse(tech)
            if parsed.quant4 and not platform.supports_4bit:
                raise ConfigError(f"{where}: technique {tech!r} needs bitsandbytes 4-bit, which "
                                  f"platform {plat_name!r} does not support (supports_4bit: false)")
            if parsed.fp8 and not platform.supports_fp8:
                raise ConfigError(
                    f"{where}: cell {stage}/{plat_name}/{model_name}/{backend}/{tech} asks for FP8 training, which "
                    f"needs FP8 tensor cores (SM 8.9+: Ada, Hopper, Blackwell); platform {plat_name!r} has none "
                    f"(no peak_fp8_tflops in config/platforms/{plat_name}.yaml)")
            model = b.model(model_name)
            if protocol.seq_len > model.max_position_embeddings:
                key = f"{where}.protocol.seq_len" if own_seq_len else "protocol.seq_len"
                raise ConfigError(f"{key}: {protocol.seq_len} is past the positions of model "
                                  f"{model_name!r} (max_position_embeddings {model.max_position_embeddings})")
            gpus_key = f"{where}.gpus" + (f"[{block['gpus'].index(gpus)}]" if isinstance(block["gpus"], list) else "")
            parallel = _parallel(block, where, backend, model, gpus, gpus_key)
            shards = gpus if parsed.zero_stage >= 2 else 1  # FSDP2 without a Z flag replicates
            if parsed.quant4 and backend == "fsdp2" and (bad := nf4.unshardable(model, shards)):
                raise ConfigError(f"{where}: cell {stage}/{plat_name}/{model_name}/{backend}/{tech} on {gpus} GPU(s): "
                                  f"{bad}")

            cell = functools.partial(Cell, stage=stage, platform=plat_name, model=model_name, backend=backend,
                                     technique=tech, gpus=gpus, nodes=nodes, protocol=protocol,
                                     mem_cap_gib=block["mem_cap_gib"], adapter=_adapter(block, where, tech),
                                     parallel=parallel)
            if search is not None:
                step = _search_step(where, search, tech, parsed.fp8, protocol.seq_len)
                b.add_search(_search(where, search, cell(batch_size=search["start"]), step), where)
            for bs in (canon[tech] if canon is not None else sizes or []):
                if parsed.fp8 and not fp8.dims_ok(bs * protocol.seq_len):
                    raise ConfigError(_fp8_tokens_error(f"{where}.batch_sizes", tech, protocol.seq_len, bs))
                b.add(cell(batch_size=bs), where)
                b.paired.add(block, where, cell(batch_size=bs), b.results_dir)


def _fp8_step(seq_len: int) -> int:
    """The smallest batch whose tokens an FP8 cell's GEMMs take (_fp8_tokens_error says
    why): the batches they take are its multiples."""
    return fp8.DIM_MULTIPLE // math.gcd(fp8.DIM_MULTIPLE, seq_len)


def _fp8_tokens_error(key: str, tech: str, seq_len: int, batch_size: int, what: str = "") -> str:
    """Why an FP8 cell of this batch (of a search: its step) cannot run: the backward's
    weight-gradient GEMM takes a rank's micro-batch tokens as one dimension, which
    torch._scaled_mm wants a multiple of fp8.DIM_MULTIPLE (else the first backward raises
    "Expected self.size(1) to be divisible by 16")."""
    return (f"{key}: technique {tech!r} trains in FP8, whose GEMMs (torch._scaled_mm) need a rank's micro-batch "
            f"tokens to be a multiple of {fp8.DIM_MULTIPLE}: {what}batch {batch_size} x seq_len {seq_len} = "
            f"{batch_size * seq_len} tokens; at seq_len {seq_len}, batch sizes that are multiples of "
            f"{_fp8_step(seq_len)}")


def _search_step(where: str, search: dict[str, Any], tech: str, is_fp8: bool, seq_len: int) -> int:
    """A search's step (llmbench.search.algorithm, rule 5): the block's ``max_batch.step``,
    else 1, or for an FP8 technique the smallest batch its GEMMs take; a given step an FP8
    technique cannot take is an error naming the key."""
    given = search.get("step")
    if given is None:
        return _fp8_step(seq_len) if is_fp8 else 1
    if is_fp8 and not fp8.dims_ok(given * seq_len):
        raise ConfigError(_fp8_tokens_error(f"{where}.max_batch.step", tech, seq_len, given, "a search probes "
                                            "multiples of its step, and "))
    return given


def _backend(block: dict[str, Any], stage: str, where: str) -> str:
    """The backend that runs the block's cells: the one its ``profile`` kind names (profile
    blocks), else its ``backend`` (in a profile block the older spelling of the same
    choice, still accepted), else the stage's default."""
    given, kind = block["backend"], block["profile"]
    if kind is not None:
        if stage != "profile":
            raise ConfigError(f"{where}.profile: only in profile blocks (what is profiled); a {stage} block "
                              "names its framework with backend")
        runs = backends.for_profile(kind)
        if given is not None and given != runs:
            raise ConfigError(f"{where}.backend: {given!r} disagrees with profile {kind!r} (which runs on "
                              f"{runs!r}); in a profile block give profile alone")
        return runs
    backend = given or backends.default(stage)
    allowed = backends.for_stage(stage)
    if backend not in allowed:
        raise ConfigError(f"{where}.backend: {backend!r} does not run {stage} cells; allowed: {', '.join(allowed)}")
    return backend


def _sizes_by_technique(sizes: dict[str, list[int]], names: list[str], where: str) -> dict[str, list[int]]:
    """batch_sizes given per technique, keyed by canonical technique name; every technique has some."""
    canon = {}
    for text, lst in sizes.items():
        try:
            canon[techniques.canonical(text)] = lst
        except techniques.TechniqueError as exc:
            raise ConfigError(f"{where}.batch_sizes.{text}: {exc}") from None
    missing = sorted(set(names) - set(canon))
    if missing:
        raise ConfigError(f"{where}.batch_sizes: no batch sizes for technique(s) {', '.join(missing)}")
    return canon


def _search(where: str, search: dict[str, Any], cell: Cell, step: int = 1) -> Search:
    """A max-batch search of ``cell`` (its batch size is the search's start, rounded up to
    a multiple of ``step``; max is rounded down to one)."""
    cell = replace(cell, batch_size=-(-cell.batch_size // step) * step)
    top = search["max"] // step * step
    if top < step:
        raise ConfigError(f"{where}.max_batch.max: {search['max']} is below the search's step {step}, the "
                          "smallest batch it may probe")
    if cell.batch_size > top:
        raise ConfigError(f"{where}.max_batch.start: {search['start']}" + (f" (a multiple of the step {step}: "
                          f"{cell.batch_size})" if step > 1 else "") + f" is above max_batch.max {top}")
    probe = replace(cell.protocol, repeats=1, **{k: v for k, v in search["probe"].items() if v is not None})
    return Search(cell=cell, start=cell.batch_size, max=top, probe_protocol=probe,
                  headroom=search["headroom"], step=step)


def _techniques(block: dict, where: str, stage: str, backend: backends.Backend) -> list[str]:
    """The block's techniques, canonical, each checked against the stage and the backend."""
    names = []
    for t, text in enumerate(block["techniques"]):
        key = f"{where}.techniques[{t}]"
        try:
            tech = techniques.parse(text)
        except techniques.TechniqueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if stage in ("pretrain", "profile") and tech.adapter:
            raise ConfigError(f"{key}: {text!r} is a fine-tuning method; put it in a finetune block")
        if stage == "profile" and tech.compiled:
            raise ConfigError(f"{key}: {text!r}: C (torch.compile) is for pretrain and finetune cells; a profile "
                              "attributes time through module hooks and kernel names, which compiled regions fuse away")
        if stage == "finetune" and not tech.adapter:
            methods = ", ".join(techniques.ADAPTERS)
            raise ConfigError(f"{key}: {text!r} names no fine-tuning method; start it with one of {methods}")
        rejected = backend.rejected_flags(tech.flags)
        what = f"profile {backend.profile!r}" if stage == "profile" else f"backend {backend.name!r}"
        if rejected:
            raise ConfigError(f"{key}: {what} supports the flags {', '.join(backend.flags)}; "
                              f"{text!r} asks for {', '.join(rejected)} ({backend.flags_why})")
        if combo := backend.rejected_combination(tech.flags):
            raise ConfigError(f"{key}: {what} does not run {' with '.join(combo[0])} ({text!r}): {combo[1]}")
        only, why = backend.adapter_only
        if not tech.adapter and (under := sorted(set(tech.flags) & set(only))):
            raise ConfigError(f"{key}: {what} runs {', '.join(under)} only under a fine-tuning method ({text!r} "
                              f"has none): {why}")
        if backend.rejected_adapter(tech.adapter_token):
            raise ConfigError(f"{key}: {what} runs the fine-tuning methods {', '.join(backend.adapters)}; "
                              f"{text!r} asks for {tech.adapter_token} ({backend.flags_why})")
        names.append(tech.name)
    return names


def _parallel(block: dict, where: str, backend: str, model: ModelSpec, gpus: int,
              gpus_key: str) -> dict[str, Any] | None:
    """Megatron-LM's layout of one cell, checked against the model and the GPU count
    (errors name the block key); None for other backends, which may not set the keys."""
    if backend != "megatron":
        for k in MEGATRON_KEYS:
            if block[k] is not None:
                raise ConfigError(f"{where}.{k}: only for backend 'megatron' (this block's backend is {backend!r})")
        return None
    tp, pp = block["tensor_parallel"] or 1, block["pipeline_parallel"] or 1
    if gpus % (tp * pp):
        key = "pipeline_parallel" if tp == 1 else "tensor_parallel"
        raise ConfigError(f"{where}.{key}: tensor_parallel {tp} x pipeline_parallel {pp} = {tp * pp} "
                          f"must divide {gpus_key} ({gpus} GPUs); data parallel = gpus / (tp*pp)")
    for heads in ("num_attention_heads", "num_key_value_heads"):
        if getattr(model, heads) % tp:
            raise ConfigError(f"{where}.tensor_parallel: {tp} must divide model {model.name!r}'s "
                              f"{heads} ({getattr(model, heads)})")
    if model.num_hidden_layers % pp:
        raise ConfigError(f"{where}.pipeline_parallel: {pp} must divide model {model.name!r}'s "
                          f"num_hidden_layers ({model.num_hidden_layers})")
    return {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": gpus // (tp * pp),
            "distributed_optimizer": bool(block["distributed_optimizer"])}


def _nodes(block: dict[str, Any], stage: str, where: str) -> int:
    """The block's node count, checked against what a cell over several nodes can do."""
    nodes = block["nodes"]
    if nodes == 1:
        return nodes
    if stage not in SEARCH_STAGES:
        raise ConfigError(f"{where}.nodes: {nodes}: a {stage} cell runs on one node (cells over nodes are "
                          f"{' and '.join(SEARCH_STAGES)} cells)")
    if block["max_batch"] is not None:
        raise ConfigError(f"{where}.max_batch: the max-batch search runs on one node; a block with nodes: "
                          f"{nodes} gives batch_sizes")
    if block["mem_cap_gib"] is not None:
        raise ConfigError(f"{where}.mem_cap_gib: the cap is watched on the launcher's node only; a block "
                          f"with nodes: {nodes} cannot have one")
    return nodes


def _gpu_counts(value: int | list[int] | None, platform: Platform, where: str, nodes: int = 1) -> list[int]:
    """The GPU-count axis of a training block: a count, a list of counts (Fig. 4's scaling),
    or null for all GPUs of its nodes. Each count splits evenly over the nodes, and on a GPU
    platform no node gets more than it has."""
    counts = value if isinstance(value, list) else [value or platform.gpus_per_node * nodes]
    for i, n in enumerate(counts):
        at = f"{where}[{i}]" if isinstance(value, list) else where
        if n % nodes:
            raise ConfigError(f"{at}: {n} GPUs do not split evenly over nodes: {nodes}")
        if platform.accelerator == "cuda" and n // nodes > platform.gpus_per_node:
            per = "" if nodes == 1 else f" ({n // nodes} on each of {nodes} nodes)"
            raise ConfigError(f"{at}: {n} GPUs{per}, but platform {platform.name!r} has {platform.gpus_per_node} "
                              f"per node ({'cells run on one node unless the block sets nodes' if nodes == 1 else 'raise nodes'})")
    return counts


def _adapter(block: dict, where: str, tech: str) -> dict[str, Any] | None:
    """A fine-tuning cell's resolved adapter settings (LoRA targets checked); None otherwise."""
    kind = techniques.parse(tech).adapter
    if kind is None:
        return None
    if kind == "prompt_tuning":
        return {"kind": kind, **block["prompt_tuning"]}
    lora = block["lora"]
    for i, mod in enumerate(lora["target_modules"]):
        if mod not in LLAMA_LINEARS:
            raise ConfigError(f"{where}.lora.target_modules[{i}]: {mod!r} is not a linear layer of "
                              f"a Llama decoder; allowed: {', '.join(LLAMA_LINEARS)}")
    return {"kind": kind, **lora}
