"""Micro blocks -> MicroCells: one per GEMM curve or shape set, one memcpy sweep, and one
collectives cell per P2P setting, on each platform."""

from __future__ import annotations

from typing import Any

from .. import fp8
from ..cells import MICRO_BENCHES, MicroCell
from ..config import ConfigError
from ..platforms import Platform
from .base import Builder


def expand(b: Builder) -> None:
    """Add every micro block's cells to ``b``."""
    for i, block in enumerate(b.config["micro"]):
        where = f"micro[{i}]"
        b.check_names(block["platforms"], "platform", f"{where}.platforms")
        if not any(k in block for k in MICRO_BENCHES):
            raise ConfigError(f"{where}: names no benchmark; give one or more of {', '.join(MICRO_BENCHES)}")
        for plat_name, platform in b.block_platforms(block):
            for cell in _cells(block, where, plat_name, platform):
                b.add(cell, where)


def _cells(block: dict[str, Any], where: str, plat_name: str, platform: Platform) -> list[MicroCell]:
    """One micro block's cells on one platform."""
    from ..micro import shapes as shapes_of  # torch-free

    common = dict(platform=plat_name, warmup=block["warmup"], iters=block["iters"], timeout_s=block["timeout_s"])
    cells = []
    gemm = block.get("gemm")
    if gemm is not None and gemm["dtype"].startswith("float8") and not platform.supports_fp8:
        raise ConfigError(f"{where}.gemm.dtype: {gemm['dtype']} runs on FP8 tensor cores (torch._scaled_mm, CUDA "
                          f"SM 8.9+: Ada, Hopper, Blackwell); platform {plat_name!r} has none (no peak_fp8_tflops "
                          f"in config/platforms/{plat_name}.yaml)")
    if gemm is not None:
        for name, c in gemm["curves"].items():
            if c["m_start"] > c["m_stop"]:
                raise ConfigError(f"{where}.gemm.curves.{name}: m_start {c['m_start']} > m_stop {c['m_stop']}")
            shapes = [list(s) for s in shapes_of.sweep(**c)]
            _check_fp8_dims(gemm["dtype"], shapes, f"{where}.gemm.curves.{name}")
            cells.append(MicroCell(bench="gemm", case=name, gpus=1, params={"dtype": gemm["dtype"], "shapes": shapes},
                                   **common))
        for name, shapes in gemm["shapes"].items():
            if name in gemm["curves"]:
                raise ConfigError(f"{where}.gemm.shapes.{name}: also a curve name; names share one path")
            _check_fp8_dims(gemm["dtype"], shapes, f"{where}.gemm.shapes.{name}")
            # a shape set is also timed as plain back-to-back torch.matmul: the bar the
            # harness is held to (within 3%), in the same process and clock state
            cells.append(MicroCell(bench="gemm", case=name, gpus=1, params={
                "dtype": gemm["dtype"], "shapes": shapes, "plain_check": True}, **common))
    memcpy = block.get("memcpy")
    if memcpy is not None:
        if memcpy["min_bytes"] > memcpy["max_bytes"]:
            raise ConfigError(f"{where}.memcpy.min_bytes: {memcpy['min_bytes']} > max_bytes {memcpy['max_bytes']}")
        cells.append(MicroCell(bench="memcpy", case="sweep", gpus=1,
                               params={"sizes_bytes": shapes_of.sizes(memcpy["min_bytes"], memcpy["max_bytes"])},
                               **common))
    coll = block.get("collectives")
    if coll is not None:
        ranks = coll["ranks"] or platform.gpus_per_node
        if ranks < 2:
            raise ConfigError(f"{where}.collectives.ranks: platform {plat_name!r} has {platform.gpus_per_node} "
                              "GPU(s) per node; a collective needs at least 2 ranks (set ranks)")
        if False in coll["p2p"] and platform.accelerator != "cuda":
            raise ConfigError(f"{where}.collectives.p2p: false disables NCCL peer-to-peer; platform "
                              f"{plat_name!r} runs gloo on its CPU, where it means nothing")
        if coll["min_bytes"] > coll["max_bytes"]:
            raise ConfigError(f"{where}.collectives.min_bytes: {coll['min_bytes']} > max_bytes {coll['max_bytes']}")
        for p2p in coll["p2p"]:
            cells.append(MicroCell(bench="collectives", case="p2p" if p2p else "nop2p", gpus=ranks,
                                   params={"ops": list(coll["ops"]), "p2p": p2p,
                                           "sizes_bytes": shapes_of.sizes(coll["min_bytes"], coll["max_bytes"])},
                                   **common))
    return cells


def _check_fp8_dims(dtype: str, shapes: list, key: str) -> None:
    """An FP8 GEMM's N and K are multiples of 16 (torch._scaled_mm), or ConfigError naming ``key``."""
    bad = next((s for s in shapes if not fp8.dims_ok(s[1], s[2])), None) if dtype.startswith("float8") else None
    if bad is not None:
        raise ConfigError(f"{key}: dtype {dtype} needs N and K multiples of 16 (torch._scaled_mm); "
                          f"[M, N, K] = {list(bad)} is not")
