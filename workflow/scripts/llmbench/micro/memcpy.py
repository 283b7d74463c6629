"""Host<->device copy latency and throughput against size (paper Section VII-B, Fig. 12).

Fig. 12 is what ZeRO offload pays: "H to D" uploads and "D to H" offloads. Throughput
is in decimal GB/s (1e9 bytes) of bytes copied, as bandwidth tools print it.
"""

from __future__ import annotations

import torch

from .shapes import sizes  # noqa: F401 - powers of two, torch-free (the grid uses them too)
from .timing import device_of, summary, time_fn

HOST_COPY_LABEL = "host memory copy (no accelerator): NOT a host<->device transfer"
"""Label of every row measured without an accelerator."""

_LABELS = {
    ("h2d", True): "host->device, pinned host buffer (non_blocking)",
    ("h2d", False): "host->device, pageable host buffer (staged by the driver)",
    ("d2h", True): "device->host, pinned host buffer (non_blocking)",
    ("d2h", False): "device->host, pageable host buffer (staged by the driver)",
    # Counted once, like the others; the memory itself moves 2x (one read, one write).
    ("d2d", False): "device->device copy in one GPU's memory (DRAM traffic is 2x bytes)",
}


def run(sizes_bytes: list[int], *, accelerator: str, warmup: int, iters: int) -> list[dict]:
    """Time copies of each size; CUDA: h2d/d2h pinned and pageable, d2d; CPU: h2h only."""
    dev = device_of(accelerator)
    rows = []
    for nbytes in sizes_bytes:
        if nbytes < 1:
            raise ValueError(f"sizes_bytes must be >= 1, got {nbytes}")
        if dev.type == "cuda":
            rows += _cuda_rows(nbytes, dev, warmup, iters)
        else:
            rows.append(_host_copy_row(nbytes, warmup, iters))
    return rows


def _host_copy_row(nbytes: int, warmup: int, iters: int) -> dict:
    """One host-to-host copy row: all a machine without an accelerator can measure."""
    src, dst = _filled(nbytes, torch.device("cpu")), torch.empty(nbytes, dtype=torch.uint8)
    times = time_fn(lambda: dst.copy_(src), device="cpu", warmup=warmup, iters=iters)
    return _row("h2h", False, nbytes, times, HOST_COPY_LABEL)


def _cuda_rows(nbytes: int, dev: torch.device, warmup: int, iters: int) -> list[dict]:
    """The five CUDA copy kinds for one size."""
    on_dev = _filled(nbytes, dev)
    dev_dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    rows = _host_device_rows(nbytes, on_dev, dev_dst, True, warmup, iters)
    rows += _host_device_rows(nbytes, on_dev, dev_dst, False, warmup, iters)
    d2d = time_fn(lambda: dev_dst.copy_(on_dev), device=dev, warmup=warmup, iters=iters)
    rows.append(_row("d2d", False, nbytes, d2d, _LABELS["d2d", False]))
    return rows


def _host_device_rows(nbytes, on_dev, dev_dst, pinned, warmup, iters) -> list[dict]:
    """h2d and d2h rows through one host buffer, freed on return (pinned memory is scarce)."""
    host = _filled(nbytes, torch.device("cpu"), pin=pinned)
    # Pageable memory cannot be read by the copy engine directly: the driver stages it
    # through a pinned bounce buffer, so non_blocking would not overlap anything there.
    h2d = time_fn(lambda: dev_dst.copy_(host, non_blocking=pinned), device=dev_dst.device, warmup=warmup, iters=iters)
    d2h = time_fn(lambda: host.copy_(on_dev, non_blocking=pinned), device=dev_dst.device, warmup=warmup, iters=iters)
    return [_row("h2d", pinned, nbytes, h2d, _LABELS["h2d", pinned]),
            _row("d2h", pinned, nbytes, d2h, _LABELS["d2h", pinned])]


def _row(direction: str, pinned: bool, nbytes: int, times: list[float], label: str) -> dict:
    """One result row: median time and the throughput it implies."""
    stats = summary(times)
    return {
        "direction": direction, "pinned": pinned, "bytes": nbytes,
        "time_s": stats["median_s"], "time_s_min": stats["min_s"],
        "time_s_mean": stats["mean_s"], "time_s_std": stats["std_s"], "iters": len(times),
        "gb_per_s": nbytes / stats["median_s"] / 1e9,
        "label": label,
    }


def _filled(nbytes: int, dev: torch.device, pin: bool = False) -> torch.Tensor:
    """A byte buffer of random content (untouched pages would not be resident yet)."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev, pin_memory=pin)
    return buf.random_(0, 256)
