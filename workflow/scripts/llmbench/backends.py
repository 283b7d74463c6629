"""The training backends: which stages each runs, which technique flags it accepts, its
worker module and the function that turns its repeats' outcomes into a Record; and, for
those that run profile cells, the kind of profile each runs.

A profile block names a kind of profile (its ``profile`` key: training, inference,
communication, engine), not a framework; the backend that runs that kind is what its cells'
``backend`` field and record paths hold (torch, inference, deepspeed, vllm). ``backend:`` in a
profile block, naming that backend directly, is the older spelling and still accepted.

The one registry: the grid validates blocks against it, the launcher starts a cell's
worker from it, and the config schema's ``backend`` enum lists its names (a unit test
holds the two equal). Adding a backend is one entry here and its worker module.

Module and builder are dotted names, not imports, so this module stays light (the grid
and common.smk read it at parse time) and imports nothing of llmbench.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Backend:
    """How one backend is driven and what it accepts."""

    name: str
    """The config's ``backend`` value and the {backend} path component."""
    stages: tuple[str, ...]
    """Training stages whose cells it runs."""
    default_for: tuple[str, ...] = ()
    """Stages whose blocks get it when they name no backend."""
    flags: tuple[str, ...] | None = None
    """Technique flags it accepts (llmbench.techniques); None: every flag."""
    flags_why: str = ""
    """Why the other flags are not accepted (said in the config error)."""
    rejects: tuple[tuple[tuple[str, ...], str], ...] = ()
    """Combinations of accepted flags it does not run together, each with why (said in the
    config error)."""
    adapters: tuple[str, ...] | None = None
    """Fine-tuning method tokens it runs (llmbench.techniques.ADAPTERS); None: every one. Why
    the others are not: ``flags_why``."""
    adapter_only: tuple[tuple[str, ...], str] = ((), "")
    """Accepted flags it runs only under a fine-tuning method (as its QL, not pre-training's
    Q), with why (said in the config error)."""
    worker: str
    """Module run as ``python -m`` on each rank (llmbench.train.contract)."""
    record_builder: str = "llmbench.aggregate:build_record"
    """``module:function`` that builds the cell's Record from its repeats' outcomes."""
    profile: str | None = None
    """The kind of profile it runs in a profile block (the block's ``profile`` key); None
    for a backend that runs no profile cells."""
    engine: str | None = None
    """The serving engine (llmbench.serve.engines) it starts and profiles, if any; its cells'
    specs carry the config's engine_python for it."""
    paper_methods: bool = False
    """Its cells are the paper's methods (the technique axis: ZeRO stages, offload, 4-bit,
    recomputation, FlashAttention): the tables of methods (III, IV, IX), the coverage table
    and the advisor's measured rows read these backends' cells only, so that a method's rows
    compare one scenario (a framework comparison such as Table II reads its own)."""
    description: str = ""
    """What a cell of it measures."""

    def rejected_flags(self, flags: tuple[str, ...] | list[str] | set[str]) -> list[str]:
        """The given technique flags this backend does not accept, sorted."""
        return [] if self.flags is None else sorted(set(flags) - set(self.flags))

    def rejected_combination(self, flags: tuple[str, ...] | list[str] | set[str]) -> tuple[tuple[str, ...], str] | None:
        """The first combination of ``rejects`` that the given flags hold, with why; None if none."""
        return next(((combo, why) for combo, why in self.rejects if set(combo) <= set(flags)), None)

    def rejected_adapter(self, token: str | None) -> bool:
        """Whether it does not run the fine-tuning method ``token`` (None: pre-training)."""
        return token is not None and self.adapters is not None and token not in self.adapters

    def build_record(self) -> Callable[..., Any]:
        """The record builder itself (imported on first use)."""
        module, func = self.record_builder.split(":")
        return getattr(importlib.import_module(module), func)


BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend(name="deepspeed", stages=("pretrain", "finetune", "profile"), default_for=("pretrain", "finetune"),
            worker="llmbench.train.deepspeed_worker", profile="communication", paper_methods=True,
            flags=("F", "R", "Z2", "Z3", "O", "Q", "C"),
            flags_why="FP8 training (torchao.float8) runs with backend fsdp2: torchao builds and tests it on "
                      "FSDP2's DTensor shards (FP8 all-gather, one all-reduce of the weights' scales) and under "
                      "torch.compile; DeepSpeed's ZeRO partitions parameters outside DTensor, its bf16 optimizer "
                      "keeps master weights of its own, and its ZeRO-3 does not run C, so FP8 under DeepSpeed would "
                      "be untested on both sides",
            rejects=((("Z3", "C"), "ZeRO-3's parameter hooks on every module split each compiled layer (13 graphs "
                                   "and 37 breaks for the tiny model's 2 layers); use C with Z2 or no ZeRO, or "
                                   "backend fsdp2"),),
            description="DeepSpeed (pretrain, finetune; in a profile block: a DeepSpeed step's communication "
                        "and memory copies by kernel class, Tables XIV-XVI)"),
    Backend(name="megatron", stages=("pretrain",), flags=("F", "R"),
            flags_why="ZeRO, offload and 4-bit run with backend deepspeed",
            worker="llmbench.train.megatron_worker",
            description="Megatron-LM's megatron-core (pretrain, Table II)"),
    Backend(name="fsdp2", stages=("pretrain", "finetune"),
            flags=("F", "R", "Z2", "Z3", "O", "C", "Q", "FP8", "FP8R"), adapters=("L", "LFA", "QL"),
            adapter_only=(("Q",), "its 4-bit base is torchao's NF4 tensor, frozen: under FSDP2 4-bit weights train "
                                  "nothing but LoRA adapters beside them (QL)"),
            rejects=((("FP8", "O"), "torchao's FP8 all-gather casts each shard where it lives, which CPUOffloadPolicy "
                                    "puts on the host; FP8 with offload is neither built nor tested by torchao"),
                     (("FP8R", "O"), "FP8 training with CPU offload is neither built nor tested by torchao"),
                     (("Q", "O"), "torchao's NF4 tensor shards for FSDP2 but is neither built nor tested for "
                                  "CPUOffloadPolicy"),
                     (("Q", "C"), "the NF4 base's dequantisation (torchao's NF4 tensor, a tensor subclass) is not "
                                  "compiled here: torchtune compiles its QLoRA layers, this backend has not been "
                                  "checked to")),
            flags_why="DoRA's magnitude and prompt tuning's virtual tokens are initialised from the whole base "
                      "model, which FSDP2 cells never hold (they build it sharded from the meta device)",
            worker="llmbench.train.fsdp2_worker",
            description="PyTorch FSDP2 (torch.distributed.fsdp.fully_shard; pretrain, finetune): Z3 = "
                        "reshard after forward, Z2 = no reshard after forward, Naive = full replication; FP8, "
                        "FP8R = torchao float8 training of the decoder's linears; QL = LoRA on torchao's NF4 "
                        "base (llmbench.train.fsdp2_worker)"),
    Backend(name="torch", stages=("profile",), default_for=("profile",), flags=("F", "R"),
            flags_why="profile: communication profiles a DeepSpeed step's communication and copies for any "
                      "pre-training technique",
            worker="llmbench.profile.worker", record_builder="llmbench.profile.results:build_record",
            profile="training",
            description="a training step module-wise, plain PyTorch under torch.profiler (Tables V-VIII, XIII)"),
    Backend(name="inference", stages=("profile",), flags=("F",),
            flags_why="serving forward passes have no backward pass to recompute",
            worker="llmbench.profile.worker", record_builder="llmbench.profile.results:build_record",
            profile="inference",
            description="serving forward passes module-wise, prefill then decode (Tables X, XI)"),
    Backend(name="vllm", stages=("profile",), flags=(),
            flags_why="the engine chooses its own attention kernels, CUDA graphs and compilation",
            worker="llmbench.profile.engine", record_builder="llmbench.profile.engine:build_record",
            profile="engine", engine="vllm",
            description="a served burst under vLLM's own torch profiler: the engine's kernels by class per "
                        "engine step (Table X)"),
)}


def get(name: str) -> Backend:
    """The backend called ``name`` (KeyError naming the known ones)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


def for_stage(stage: str) -> tuple[str, ...]:
    """Names of the backends that run ``stage`` cells, the stage's default first."""
    runs = [b.name for b in BACKENDS.values() if stage in b.stages]
    return tuple(sorted(runs, key=lambda n: stage not in BACKENDS[n].default_for))


def default(stage: str) -> str:
    """The backend of a ``stage`` block that names none."""
    return next(b.name for b in BACKENDS.values() if stage in b.default_for)


def method_backends() -> tuple[str, ...]:
    """Names of the backends whose cells are the paper's methods (Backend.paper_methods)."""
    return tuple(b.name for b in BACKENDS.values() if b.paper_methods)


#: Kind of profile -> the backend that runs it (a profile block's ``profile`` key).
PROFILES: dict[str, str] = {b.profile: b.name for b in BACKENDS.values() if b.profile is not None}


def for_profile(kind: str) -> str:
    """The backend that runs profile cells of ``kind`` (KeyError naming the known kinds)."""
    try:
        return PROFILES[kind]
    except KeyError:
        raise KeyError(f"unknown profile {kind!r}; known: {', '.join(PROFILES)}") from None
