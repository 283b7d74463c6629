"""Serve blocks -> ServeCells: engines x platforms x models x loads, each engine checked
against the platform (llmbench.serve.engines) and each load against the model; a block's
``paired`` key puts its cells into a paired set (llmbench.grid.paired)."""

from __future__ import annotations

import itertools

from ..cells import ServeCell
from ..config import ConfigError
from .base import Builder
from .paired import check_block


def check_load(load: dict, where: str) -> None:
    """The rules between a load's keys that its schema cannot say (llmbench.serve.loadgen.LoadSpec
    checks them again), named by key."""
    mode = load["mode"]
    if mode == "poisson" and load["rate_per_s"] is None:
        raise ConfigError(f"{where}.rate_per_s: required when mode is 'poisson'")
    if mode != "poisson" and load["rate_per_s"] is not None:
        raise ConfigError(f"{where}.rate_per_s: applies to mode 'poisson' only (mode {mode!r} sends all at t=0)")
    if mode == "concurrency" and load["max_concurrency"] is None:
        raise ConfigError(f"{where}.max_concurrency: required when mode is 'concurrency' (the requests kept in flight)")
    if load.get("ramp_up_s") and mode != "poisson":
        raise ConfigError(f"{where}.ramp_up_s: applies to mode 'poisson' only, not {mode!r}")
    if load.get("prefix_len", 0) >= load["input_len"]:
        raise ConfigError(f"{where}.prefix_len: {load['prefix_len']} must be below input_len {load['input_len']} "
                          "(each prompt keeps a unique suffix)")


def rope_scaling_type(rope_scaling: dict | None) -> str | None:
    """A model's RoPE scaling type (``rope_type``, or ``type`` as older configs name it);
    None without scaling."""
    if not rope_scaling:
        return None
    return rope_scaling.get("rope_type", rope_scaling.get("type"))


def expand(b: Builder) -> None:
    """Add every serve block's cells to ``b`` (engine x platform checks named by key)."""
    from ..serve.engines import ENGINES  # no heavy imports there

    config = b.config
    for i, block in enumerate(config["serve"]):
        where = f"serve[{i}]"
        b.check_names(block["platforms"], "platform", f"{where}.platforms")
        b.check_names(block["models"], "model", f"{where}.models")
        check_block(block, where)
        for name, load in block["loads"].items():
            check_load(load, f"{where}.loads.{name}")
        for e, engine_name in enumerate(block["engines"]):
            engine = ENGINES[engine_name]
            if block["weights"] == "dummy" and not engine.dummy_weights:
                can = ", ".join(n for n, x in ENGINES.items() if x.dummy_weights)
                raise ConfigError(f"{where}.weights: 'dummy' needs an engine that makes its own weights "
                                  f"({can}); engine {engine_name!r} loads them (use weights: random)")
            if engine.rope_scaling_types is not None:
                for model_name in block["models"]:
                    rope = rope_scaling_type(b.model(model_name).rope_scaling)
                    if rope is not None and rope not in engine.rope_scaling_types:
                        raise ConfigError(
                            f"{where}.engines[{e}]: engine {engine_name!r} does not implement the RoPE scaling "
                            f"{rope!r} of model {model_name!r} (it implements "
                            f"{', '.join(map(repr, engine.rope_scaling_types))}): it would serve the model with "
                            "other position encodings; give the model to another engine")
            args = list(block["engine_args"].get(engine_name, ()))
            if block["prefix_caching"] is not None:
                if engine.prefix_caching_args is None:
                    can = ", ".join(n for n, x in ENGINES.items() if x.prefix_caching_args is not None)
                    raise ConfigError(f"{where}.prefix_caching: engine {engine_name!r} has no prefix-cache switch "
                                      f"here ({can} have); leave it null for this engine")
                # before the block's engine_args, so an explicit engine argument still wins
                args = engine.prefix_caching_args(block["prefix_caching"]) + args
            for plat_name, platform in b.block_platforms(block):
                if platform.accelerator not in engine.accelerators:
                    raise ConfigError(
                        f"{where}.engines[{e}]: engine {engine_name!r} runs on {' or '.join(engine.accelerators)}, "
                        f"platform {plat_name!r} is {platform.accelerator}")
                gpus = block["gpus"] or (platform.gpus_per_node if engine.tensor_parallel else 1)
                if gpus > 1 and not engine.tensor_parallel:
                    raise ConfigError(f"{where}.gpus: engine {engine_name!r} has no tensor parallelism; use gpus: 1")
                for model_name, (load_name, load) in itertools.product(block["models"], block["loads"].items()):
                    positions = b.model(model_name).max_position_embeddings
                    if load["input_len"] + load["output_len"] > positions:
                        raise ConfigError(f"{where}.loads.{load_name}: input_len + output_len = "
                                          f"{load['input_len'] + load['output_len']} is past the positions of "
                                          f"model {model_name!r} (max_position_embeddings {positions})")
                    cell = ServeCell(
                        platform=plat_name, model=model_name, engine=engine_name, load=load_name, gpus=gpus,
                        load_spec=dict(load), weights=block["weights"],
                        engine_args=tuple(args),
                        ready_timeout_s=block["ready_timeout_s"], timeout_s=block["timeout_s"],
                        seed=config["protocol"]["seed"],
                    )
                    b.add(cell, where)
                    b.paired.add(block, where, cell, b.results_dir)
