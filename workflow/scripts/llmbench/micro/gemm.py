"""GEMM throughput against shape (paper Section VII-A, Fig. 11, Table XII).

C = A @ B with A (m, k) and B (k, n), as torch.matmul computes it; FLOPs = 2*m*n*k
(one multiply and one add per term). The paper's M is the token dimension (batch x
sequence), N and K the weight's dimensions.
"""

from __future__ import annotations

import math
import time

import torch

from .shapes import sweep  # noqa: F401 - the GEMM shapes of a curve live there (torch-free)
from .timing import device_of, summary, time_fn

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
"""Names accepted for ``dtype`` (the config spells dtypes as strings)."""

# Fig. 11: M from 4096 to 16384 in steps of 512 at fixed (N, K); the unaligned curve
# shifts both ends by 13 ("starts from 4096+13 ... increases to 16384+13", Section VII-A).
FIG11_CURVES = {
    "N4096_K4096": dict(n=4096, k=4096, m_start=4096, m_stop=16384, m_step=512),
    "N11008_K4096": dict(n=11008, k=4096, m_start=4096, m_stop=16384, m_step=512),
    "N16384_K16384": dict(n=16384, k=16384, m_start=4096, m_stop=16384, m_step=512),
    "unaligned_N11008_K4096": dict(n=11008, k=4096, m_start=4096, m_stop=16384, m_step=512, m_offset=13),
}
"""Keyword arguments of ``sweep`` for each curve of the paper's Fig. 11."""

# Table XII: the first MLP GEMM of Llama2-7B (gate projection), batch 2 without and
# batch 32 with recomputation; (M, N, K) as printed.
TABLE12_SHAPES = {"naive": (666, 11008, 4096), "recomputation": (10624, 11008, 4096)}
"""(m, n, k) of the paper's Table XII columns."""

_CHECK_ROWS = 128
_CHECK_COLS = 128


def alignment(dtype: str) -> int:
    """Elements per 16 bytes: the multiple every GEMM dimension needs for tensor cores."""
    # NVIDIA's "Matrix Multiplication Background" guide: with cuBLAS >= 11 tensor cores
    # are used (and most efficient) when M, N and K are multiples of 16 bytes, i.e. of
    # 8 elements for FP16/BF16, 4 for TF32. Fig. 11's unaligned curve (M = 4096+13 ...)
    # breaks this on purpose.
    return 16 // _dtype(dtype).itemsize


def tolerance(dtype: str) -> float:
    """Largest relative (Frobenius) error of a GEMM result accepted as correct."""
    # Two units of the dtype's machine epsilon: the bf16/fp16 output rounding alone gives
    # about eps/4 on random normal data; cuBLAS may reduce split-K partial sums in 16 bits
    # (torch's allow_*_reduced_precision_reduction). float32 may run as TF32 (10-bit
    # mantissa) when torch allows it, so its bound is TF32's.
    eps = 2.0**-10 if dtype == "float32" else torch.finfo(_dtype(dtype)).eps
    return 2.0 * eps


def relative_error(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> float:
    """Relative Frobenius error of a corner of ``out`` against A @ B in float64."""
    # A 128 x 128 corner over the full K: every output element sums all of K, so this
    # checks the whole reduction at a cost independent of M and N.
    rows, cols = min(out.shape[0], _CHECK_ROWS), min(out.shape[1], _CHECK_COLS)
    ref = a[:rows].double() @ b[:, :cols].double()
    err = torch.linalg.matrix_norm(out[:rows, :cols].double() - ref)
    return float(err / torch.linalg.matrix_norm(ref))


def run(
    shapes: list[tuple[int, int, int]],
    *,
    dtype: str = "bfloat16",
    accelerator: str,
    warmup: int,
    iters: int,
    peak_tflops: float | None,
    seed: int = 0,
    plain_check: bool = False,
) -> list[dict]:
    """Time torch.matmul for each (m, n, k); one row per shape. ``plain_check``: also time
    plain back-to-back torch.matmul (best_matmul_tflops) right after each shape, and
    record it and the harness's share of it (``plain_tflops``, ``vs_plain``)."""
    dev = device_of(accelerator)
    rows = []
    for m, n, k in shapes:
        row = _row(m, n, k, dtype, dev, warmup, iters, peak_tflops, seed)
        if plain_check:
            plain = best_matmul_tflops(m, n, k, dtype=dtype, accelerator=accelerator, warmup=warmup,
                                       iters=iters, seed=seed)
            row.update(plain_tflops=plain, vs_plain=row["tflops"] / plain)
        rows.append(row)
    return rows


def _row(
    m: int, n: int, k: int, dtype: str, dev: torch.device, warmup: int, iters: int,
    peak_tflops: float | None, seed: int,
) -> dict:
    """Time one shape; its tensors are freed on return, before the next shape allocates."""
    tdtype, align = _dtype(dtype), alignment(dtype)
    a, b = _operands(m, n, k, tdtype, dev, seed)
    out = torch.empty(m, n, dtype=tdtype, device=dev)  # out= keeps the allocator out of the timing
    times = time_fn(lambda: torch.matmul(a, b, out=out), device=dev, warmup=warmup, iters=iters)
    stats = summary(times)
    err = relative_error(a, b, out)  # out holds the last timed call's result
    tflops = 2.0 * m * n * k / stats["median_s"] / 1e12
    return {
        "m": m, "n": n, "k": k, "dtype": dtype,
        "aligned": m % align == 0 and n % align == 0 and k % align == 0,
        "time_s": stats["median_s"], "time_s_min": stats["min_s"],
        "time_s_mean": stats["mean_s"], "time_s_std": stats["std_s"], "iters": iters,
        "tflops": tflops,
        "pct_of_peak": 100.0 * tflops / peak_tflops if peak_tflops else None,
        "rel_err": err,
        "correct": math.isfinite(err) and err <= tolerance(dtype),
    }


def best_matmul_tflops(
    m: int, n: int, k: int, *, dtype: str = "bfloat16", accelerator: str, warmup: int, iters: int,
    seed: int = 0,
) -> float:
    """TFLOP/s of plain back-to-back torch.matmul calls, timed as one window on the host clock."""
    # The reference the harness is checked against: no events, no out=, no per-call
    # bookkeeping, just a synchronize at both ends of the window.
    dev = device_of(accelerator)
    a, b = _operands(m, n, k, _dtype(dtype), dev, seed)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        torch.matmul(a, b)
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        torch.matmul(a, b)
    sync()
    elapsed = time.perf_counter() - start
    return 2.0 * m * n * k * iters / elapsed / 1e12


def _operands(m: int, n: int, k: int, dtype: torch.dtype, dev: torch.device, seed: int):
    """Random normal A (m, k) and B (k, n)."""
    # Never zeros: zero operands draw less power, so a GPU holds higher clocks and the
    # TFLOP/s would be better than on real weights and activations.
    gen = torch.Generator(device=dev).manual_seed(seed)
    a = torch.randn(m, k, dtype=dtype, device=dev, generator=gen)
    b = torch.randn(k, n, dtype=dtype, device=dev, generator=gen)
    return a, b


def _dtype(name: str) -> torch.dtype:
    """The torch dtype for a config name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None
