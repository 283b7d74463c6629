"""Collective-communication latency and bandwidth (paper Section VII-C, Figs. 13-15).

A library (``run`` inside an initialised process group) and a torchrun worker:

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m llmbench.micro.collectives --spec spec.json --out rows.json

Size convention (nccl-tests', so that numbers compare with its output and with
DeepSpeed's comms logger): ``bytes`` is the per-rank buffer nccl-tests prints as
"size". For all_reduce, reduce and broadcast that is the one buffer each rank holds.
For all_gather it is the gathered OUTPUT (world_size x each rank's input); for
reduce_scatter the INPUT (world_size x each rank's output). algbw = bytes / time and
busbw = algbw x BUS_FACTOR[op](n) (nccl-tests' doc/PERFORMANCE.md), which makes the
ops comparable with each other and with the link's bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .timing import time_fn

BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "reduce": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
}
"""busbw / algbw per op for n ranks (nccl-tests, doc/PERFORMANCE.md)."""

OPS = tuple(BUS_FACTOR)
"""Ops this benchmark runs."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Names accepted for ``dtype``."""

ROOT = 0
"""Destination of reduce and source of broadcast."""


def bus_bandwidth(op: str, algbw: float, n: int) -> float:
    """Bus bandwidth of ``op`` over ``n`` ranks, in the unit of ``algbw``."""
    if op not in BUS_FACTOR:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return algbw * BUS_FACTOR[op](n)


@dataclass(kw_only=True, slots=True, frozen=True)
class Spec:
    """What one collectives run measures (the worker's --spec JSON)."""

    ops: tuple[str, ...]
    """Ops to run, from OPS."""
    sizes_bytes: tuple[int, ...]
    """Sizes in nccl-tests' convention (see the module docstring)."""
    warmup: int
    """Untimed calls per (op, size)."""
    iters: int
    """Timed calls per (op, size)."""
    accelerator: str
    """'cuda' (NCCL, one GPU per rank) or 'cpu' (gloo)."""
    dtype: str = "float32"
    """Element type of the buffers."""

    def __post_init__(self) -> None:
        if not self.ops:
            raise ValueError("spec.ops must not be empty")
        for op in self.ops:
            if op not in BUS_FACTOR:
                raise ValueError(f"spec.ops: {op!r} is not one of {OPS}")
        if not self.sizes_bytes or min(self.sizes_bytes) < 1:
            raise ValueError(f"spec.sizes_bytes must be non-empty and >= 1, got {self.sizes_bytes}")
        if self.warmup < 0:
            raise ValueError(f"spec.warmup must be >= 0, got {self.warmup}")
        if self.iters < 1:
            raise ValueError(f"spec.iters must be >= 1, got {self.iters}")
        if self.accelerator not in ("cpu", "cuda"):
            raise ValueError(f"spec.accelerator must be 'cpu' or 'cuda', got {self.accelerator!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"spec.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @classmethod
    def from_dict(cls, data: dict) -> Spec:
        """Build from the JSON form; unknown keys are an error."""
        unknown = set(data) - set(cls.__slots__)
        if unknown:
            raise ValueError(f"spec: unknown keys {sorted(unknown)}")
        return cls(**{**data, "ops": tuple(data.get("ops", ())),
                      "sizes_bytes": tuple(data.get("sizes_bytes", ()))})

    def to_dict(self) -> dict:
        """Plain-data form (round-trips through from_dict)."""
        data = {f: getattr(self, f) for f in self.__slots__}
        return {**data, "ops": list(self.ops), "sizes_bytes": list(self.sizes_bytes)}


# Inputs are random small integers stored as floats: every sum of at most world_size of
# them is exact in the dtype whatever order the library reduces in (ring, tree, chunked),
# so a result is checked for equality, without a tolerance that could hide a wrong chunk.
_EXACT_INT = {torch.float32: 2**24, torch.bfloat16: 2**8, torch.float16: 2**11}


def piece(*, seed: int, rank: int, index: int, numel: int, world_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Chunk ``index`` of rank ``rank``'s input, on the CPU: integers in [-v, v] as ``dtype``."""
    # Drawn from a CPU generator: CUDA's random streams depend on the GPU's SM count,
    # and every rank must be able to regenerate every other rank's input.
    v = max(1, min(8, _EXACT_INT[dtype] // world_size))
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + index)
    return torch.randint(-v, v + 1, (numel,), generator=gen, dtype=torch.int16).to(dtype)


def rank_input(op: str, *, seed: int, rank: int, count: int, world_size: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank ``rank``'s input buffer for ``op``; ``count`` elements per chunk (CPU)."""
    kw = dict(seed=seed, rank=rank, world_size=world_size, dtype=dtype)
    if op == "reduce_scatter":  # one chunk per destination rank
        return torch.cat([piece(index=j, numel=count, **kw) for j in range(world_size)])
    return piece(index=0, numel=count, **kw)


def expected(op: str, *, seed: int, rank: int, count: int, world_size: int, dtype: torch.dtype) -> torch.Tensor | None:
    """What ``op`` must leave in rank ``rank``'s result buffer (CPU); None: nothing defined."""
    kw = dict(seed=seed, numel=count, world_size=world_size, dtype=dtype)
    if op == "all_reduce" or (op == "reduce" and rank == ROOT):
        return _sum(piece(rank=q, index=0, **kw) for q in range(world_size))
    if op == "reduce":
        return None  # a non-root buffer is scratch for some algorithms
    if op == "broadcast":
        return piece(rank=ROOT, index=0, **kw)
    if op == "all_gather":
        return torch.cat([piece(rank=q, index=0, **kw) for q in range(world_size)])
    if op == "reduce_scatter":
        return _sum(piece(rank=q, index=rank, **kw) for q in range(world_size))
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def check(op: str, got: torch.Tensor, *, seed: int, rank: int, count: int, world_size: int) -> bool:
    """Whether ``got`` is exactly the result ``op`` must produce on ``rank``."""
    want = expected(op, seed=seed, rank=rank, count=count, world_size=world_size, dtype=got.dtype)
    return want is None or torch.equal(got.cpu(), want)


def run(
    ops: list[str],
    sizes_bytes: list[int],
    *,
    warmup: int,
    iters: int,
    dtype: str = "float32",
    seed: int = 0,
) -> list[dict]:
    """Time each (op, size) on every rank of the current process group; rows on rank 0, [] elsewhere."""
    if not dist.is_initialized():
        raise RuntimeError("collectives.run needs an initialised process group")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    tdtype = DTYPES[dtype]
    n, rank = dist.get_world_size(), dist.get_rank()
    # NCCL only moves CUDA tensors; each rank's current device is set by the caller.
    dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    rows = []
    for op in ops:
        for requested in sizes_bytes:
            count = _chunk_numel(op, requested, n, tdtype.itemsize)
            times, ok = _measure(op, count, n, rank, tdtype, dev, warmup, iters, seed)
            # The slowest rank sets the time of a collective: MAX over ranks per iteration.
            per_iter = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(per_iter, op=dist.ReduceOp.MAX)
            flag = torch.tensor([int(ok)], dtype=torch.int32, device=dev)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            nbytes = count * tdtype.itemsize * (n if op in ("all_gather", "reduce_scatter") else 1)
            time_s = statistics.median(per_iter.tolist())
            algbw = nbytes / time_s / 1e9
            rows.append({
                "op": op, "bytes": nbytes, "bytes_requested": requested, "dtype": dtype,
                "world_size": n, "backend": dist.get_backend(), "iters": iters,
                "time_s": time_s, "time_s_min": min(per_iter.tolist()),
                "algbw_gb_per_s": algbw, "busbw_gb_per_s": bus_bandwidth(op, algbw, n),
                "correct": bool(flag.item()),
            })
    return rows if rank == 0 else []


def _chunk_numel(op: str, nbytes: int, n: int, itemsize: int) -> int:
    """Elements per rank chunk for a size in nccl-tests' convention (rounded down, >= 1)."""
    per_buffer = nbytes // itemsize
    if op in ("all_gather", "reduce_scatter"):
        return max(1, per_buffer // n)
    return max(1, per_buffer)


def _measure(op, count, n, rank, dtype, dev, warmup, iters, seed) -> tuple[list[float], bool]:
    """This rank's per-call times for one (op, size), and whether its last result is right."""
    pristine = rank_input(op, seed=seed, rank=rank, count=count, world_size=n, dtype=dtype).to(dev)
    if op == "all_gather":
        out = torch.empty(count * n, dtype=dtype, device=dev)
        call, result, reset = (lambda: _all_gather(out, pristine)), out, None
    elif op == "reduce_scatter":
        out = torch.empty(count, dtype=dtype, device=dev)
        call, result, reset = (lambda: _reduce_scatter(out, pristine)), out, None
    else:
        # all_reduce, reduce and broadcast work in place: the buffer is restored before
        # every call (outside the timing), or repeated sums would overflow and the check
        # would see many rounds instead of one.
        buf = pristine.clone()
        call = {"all_reduce": lambda: dist.all_reduce(buf),
                "reduce": lambda: dist.reduce(buf, dst=ROOT),
                "broadcast": lambda: dist.broadcast(buf, src=ROOT)}[op]
        result, reset = buf, (lambda: buf.copy_(pristine))

    def between() -> None:
        # Ranks enter each call together, so a call's time is the op, not the skew of
        # the previous one. NCCL's barrier also waits for this rank's device work.
        if reset is not None:
            reset()
        dist.barrier()

    times = time_fn(call, device=dev, warmup=warmup, iters=iters, between=between)
    ok = check(op, result, seed=seed, rank=rank, count=count, world_size=n)
    return times, ok


def _all_gather(out: torch.Tensor, inp: torch.Tensor) -> None:
    """all_gather_into_tensor, under its torch >= 2.13 name where there is one."""
    # torch 2.13 deprecates *_into_tensor/*_tensor for *_single (same call); the GPU
    # machines run torch 2.11, which has only the old names.
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, inp)


def _reduce_scatter(out: torch.Tensor, inp: torch.Tensor) -> None:
    """reduce_scatter_tensor (sum), under its torch >= 2.13 name where there is one."""
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, inp)


def _sum(tensors) -> torch.Tensor:
    """Sum of an iterable of equal-shape tensors, one at a time (bounded memory)."""
    total = None
    for t in tensors:
        total = t if total is None else total.add_(t)
    return total


def main(argv: list[str] | None = None) -> int:
    """torchrun entry point for one rank: run the spec, rank 0 writes the rows as JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, type=Path, help="JSON: ops, sizes_bytes, warmup, iters, accelerator[, dtype]")
    ap.add_argument("--out", required=True, type=Path, help="where rank 0 writes the rows (JSON list)")
    args = ap.parse_args(argv)
    spec = Spec.from_dict(json.loads(args.spec.read_text()))
    if spec.accelerator == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    try:
        rows = run(list(spec.ops), list(spec.sizes_bytes), warmup=spec.warmup, iters=spec.iters, dtype=spec.dtype)
        if dist.get_rank() == 0:
            tmp = args.out.with_name(args.out.name + ".tmp")
            tmp.write_text(json.dumps(rows, indent=1))
            tmp.replace(args.out)  # atomic: a reader never sees half a file
    finally:
        dist.destroy_process_group()  # a 2-rank run aborts at exit without it (gloo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
