"""Per-call timing of a microbenchmark kernel, and its summary statistics.

On CUDA each call is bracketed by CUDA events on the current stream, so the time is
the device's, not the host's launch time; on CPU the host clock around each call is
the time (CPU kernels return when done).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def device_of(accelerator: str) -> torch.device:
    """The torch device for a platform's accelerator ('cuda': the current GPU, 'cpu')."""
    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("accelerator 'cuda' requested but torch sees no CUDA device")
        return torch.device("cuda", torch.cuda.current_device())
    raise ValueError(f"accelerator must be 'cpu' or 'cuda', got {accelerator!r}")


def time_fn(
    fn: Callable[[], object],
    *,
    device: str | torch.device,
    warmup: int,
    iters: int,
    between: Callable[[], None] | None = None,
) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` untimed calls, then ``iters`` timed ones.

    ``between`` runs before every call (warm-up and timed) outside the timed region:
    resetting an in-place buffer, or a barrier so that ranks start a collective together.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    dev = torch.device(device)
    for _ in range(warmup):
        if between is not None:
            between()
        fn()
    if dev.type == "cuda":
        return _time_cuda(fn, dev, iters, between)
    times = []
    for _ in range(iters):
        if between is not None:
            between()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _time_cuda(
    fn: Callable[[], object], dev: torch.device, iters: int, between: Callable[[], None] | None
) -> list[float]:
    """Event-timed calls on a CUDA device; events are read once, after the last call."""
    torch.cuda.synchronize(dev)  # warm-up kernels must not leak into the first interval
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    with torch.cuda.device(dev):
        for start, end in zip(starts, ends):
            if between is not None:
                between()
            start.record()
            fn()
            end.record()
    torch.cuda.synchronize(dev)
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]  # ms -> s


def summary(times: list[float]) -> dict:
    """Median, mean, minimum and sample standard deviation (0 for one value), in seconds."""
    if not times:
        raise ValueError("summary of no times")
    return {
        "median_s": statistics.median(times),
        "mean_s": statistics.fmean(times),
        "min_s": min(times),
        "std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
    }
