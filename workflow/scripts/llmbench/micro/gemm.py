"""GEMM throughput against shape (paper Section VII-A, Fig. 11, Table XII).

C = A @ B with A (m, k) and B (k, n), as torch.matmul computes it; FLOPs = 2*m*n*k
(one multiply and one add per term). The paper's M is the token dimension (batch x
sequence), N and K the weight's dimensions.

dtype ``float8_e4m3fn`` (beyond the paper): the GEMM of FP8 training, torch._scaled_mm with A
and B in float8 e4m3 (B column-major, as cuBLASLt wants it), one float32 scale each
(tensorwise), FP32 accumulation and a bf16 result: where against bf16 FP8 pays. It needs FP8
tensor cores (CUDA SM 8.9+); on a CPU or an older GPU it is refused before any shape runs
(``check_fp8``), and the grid refuses it on platforms without an FP8 peak. N and K must be
multiples of 16 (torch._scaled_mm's requirement); M may be unaligned.
"""

from __future__ import annotations

import math
import time

import torch

from .. import fp8
from .shapes import sweep  # noqa: F401 - the GEMM shapes of a curve live there (torch-free)
from .timing import device_of, summary, time_fn

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float8_e4m3fn": torch.float8_e4m3fn}
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

FP8 = "float8_e4m3fn"
"""The FP8 dtype name: inputs e4m3, result bf16 (FP8_OUT)."""
FP8_OUT = torch.bfloat16
#: torch._scaled_mm's fast accumulation (use_fast_accum) is off: full FP32 accumulation, the
#: setting torchao's float8 training uses for its two backward GEMMs (its forward GEMM turns it on).
FP8_FAST_ACCUM = False

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
    # FP8: products of the float8 operands are exact in the FP32 accumulator, so the error is
    # the bf16 result's rounding (checked against the float8 operands as given, in float64)
    eps = 2.0**-10 if dtype == "float32" else torch.finfo(FP8_OUT if dtype == FP8 else _dtype(dtype)).eps
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
    record it and the harness's share of it (``plain_tflops``, ``vs_plain``). FP8 (dtype
    float8_e4m3fn): ValueError before any shape where it cannot run (``check_fp8``)."""
    dev = device_of(accelerator)
    if dtype == FP8:
        check_fp8(accelerator, shapes)
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
    out = torch.empty(m, n, dtype=FP8_OUT if dtype == FP8 else tdtype, device=dev)  # out=: no allocator in the timing
    times = time_fn(_gemm(a, b, dtype, out), device=dev, warmup=warmup, iters=iters)
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
    if dtype == FP8:
        check_fp8(accelerator, [(m, n, k)])
    a, b = _operands(m, n, k, _dtype(dtype), dev, seed)
    gemm = _gemm(a, b, dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        gemm()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        gemm()
    sync()
    elapsed = time.perf_counter() - start
    return 2.0 * m * n * k * iters / elapsed / 1e12


def check_fp8(accelerator: str, shapes: list[tuple[int, int, int]]) -> None:
    """Refuse an FP8 GEMM where torch._scaled_mm cannot run it: ValueError naming why (no FP8
    tensor cores, llmbench.fp8; N or K not a multiple of 16)."""
    fp8.check_device(f"dtype {FP8}: torch._scaled_mm", accelerator)
    bad = [s for s in shapes if not fp8.dims_ok(s[1], s[2])]
    if bad:
        raise ValueError(f"dtype {FP8}: N and K must be multiples of 16 (torch._scaled_mm); {bad[0]} is not")


def _gemm(a: torch.Tensor, b: torch.Tensor, dtype: str, out: torch.Tensor | None = None):
    """The timed call: torch.matmul, or for FP8 torch._scaled_mm with unit tensorwise scales."""
    if dtype != FP8:
        return (lambda: torch.matmul(a, b, out=out)) if out is not None else (lambda: torch.matmul(a, b))
    one = torch.ones((), dtype=torch.float32, device=a.device)  # the operands are N(0, 1): within e4m3's range

    def scaled():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=FP8_OUT, use_fast_accum=FP8_FAST_ACCUM,
                                **({"out": out} if out is not None else {}))
    return scaled


def _operands(m: int, n: int, k: int, dtype: torch.dtype, dev: torch.device, seed: int):
    """Random normal A (m, k) and B (k, n); float8: drawn in bf16 and cast, B column-major."""
    # Never zeros: zero operands draw less power, so a GPU holds higher clocks and the
    # TFLOP/s would be better than on real weights and activations.
    gen = torch.Generator(device=dev).manual_seed(seed)
    if dtype == torch.float8_e4m3fn:
        a = torch.randn(m, k, dtype=FP8_OUT, device=dev, generator=gen).to(dtype)
        b = torch.randn(n, k, dtype=FP8_OUT, device=dev, generator=gen).to(dtype).t()  # (k, n), column-major
        return a, b
    a = torch.randn(m, k, dtype=dtype, device=dev, generator=gen)
    b = torch.randn(k, n, dtype=dtype, device=dev, generator=gen)
    return a, b


def _dtype(name: str) -> torch.dtype:
    """The torch dtype for a config name."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}") from None
