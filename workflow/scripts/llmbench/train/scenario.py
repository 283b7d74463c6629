"""The training scenario, written once: seeding, synthetic token ids, warm-up and timed window,
peak memory, and a typed RepeatResult. DeepSpeed and Megatron-LM are backends that provide
``build`` and ``step`` (llmbench.train.deepspeed_worker, llmbench.train.megatron_worker).

The timed window is llmbench.protocol.run_window (device synchronised at both ends, host
clock). Nothing is read back from the device inside it: a step's loss stays a device tensor
until the window has closed, so no step waits on its kernels.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol as Interface

from ..nodes import NODE_T0_VAR
from ..protocol import Protocol, Window, run_window

#: Offset of the synthetic-id generator's seed from the protocol's (weights use the seed itself).
IDS_SEED_OFFSET = 1000


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


#: What Phases.mark writes to rank 0's stderr (the cell's log)
PHASE_LINE = "llmbench: phase {name} done: {seconds:.1f} s"


class Phases:
    """Where a repeat's wall time goes: seconds from one mark to the next, as summary keys
    ``phase_<name>_s`` (the first, ``phase_start_s``, from process start: interpreter and
    the worker's own imports). Marks are host clock reads; a mark after device work must
    follow a synchronize to mean the device's time too. ``run`` marks build, window and
    after_window; a worker marks what it does before (imports, init_distributed). Rank 0
    says each mark in its log as it passes it (PHASE_LINE, flushed; none inside the timed
    window), so the log of a repeat killed part-way tells where its time went."""

    def __init__(self) -> None:
        age = process_age_s()
        self.seconds: dict[str, float] = {} if age is None else {"phase_start_s": age}
        node_t0 = os.environ.get(NODE_T0_VAR)
        if age is not None and node_t0:
            # a cell over several nodes: from its node launcher's start to this rank's
            # start, i.e. torchrun's start-up and the c10d rendezvous across the nodes
            self.seconds["phase_rendezvous_s"] = time.time() - age - float(node_t0)
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[f"phase_{name}_s"] = now - self._last
        self._last = now
        if os.environ.get("RANK", "0") == "0":
            print(PHASE_LINE.format(name=name, seconds=self.seconds[f"phase_{name}_s"]), file=sys.stderr, flush=True)


@dataclass(kw_only=True, slots=True, frozen=True)
class Layout:
    """How a built backend's ranks split the data."""

    data_rank: int
    """This rank's data-parallel index: ranks of one index see the same batch."""
    data_parallel: int
    """Data-parallel replicas; tokens per step = batch size x sequence length x this."""


class Backend(Interface):
    """A training stack the scenario drives (DeepSpeed, Megatron-LM)."""

    def build(self) -> Layout:
        """Build the model and optimizer (the global seed is already set)."""

    def step(self, ids: Any) -> Any:
        """One optimizer step on ``ids`` ([batch, seq] token ids, inputs and labels); returns
        the loss as a device tensor, or None where this rank has none (a pipeline stage)."""

    def synchronize(self) -> None:
        """Wait for the device's queued work."""


@dataclass(kw_only=True, slots=True, frozen=True)
class PeakMemory:
    """Peak memory of one repeat, max over ranks, in GiB."""

    allocated_gib: float | None
    """Device memory allocated by tensors since the build (None: no CUDA device)."""
    reserved_gib: float | None
    """Device memory reserved by the caching allocator since the build (None: no CUDA device)."""
    rss_gib: float
    """Host resident set size over the whole process's life."""


@dataclass(kw_only=True, slots=True, frozen=True)
class RepeatResult:
    """One repeat of a training cell as measured by the scenario."""

    world_size: int
    """Ranks of the repeat."""
    window: Window
    """The timed window."""
    global_batch_tokens: int
    """Tokens per optimizer step over all data-parallel replicas."""
    peak: PeakMemory
    """Peak memory."""
    loss_last: float | None
    """This rank's loss at the last measured step (None: this rank computes no loss)."""

    def __post_init__(self) -> None:
        if self.window.elapsed_s <= 0:
            raise ValueError(f"window.elapsed_s must be > 0, got {self.window.elapsed_s}")
        if self.global_batch_tokens < 1:
            raise ValueError(f"global_batch_tokens must be >= 1, got {self.global_batch_tokens}")

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second over all ranks: tokens of the window's steps over its wall time."""
        return self.global_batch_tokens * self.window.steps / self.window.elapsed_s

    def payload(self) -> dict[str, Any]:
        """The result keys every training worker writes (llmbench.aggregate.build_record reads them)."""
        return {
            "world_size": self.world_size,
            "elapsed_s": self.window.elapsed_s,
            "steps": self.window.steps,
            "step_times_s": list(self.window.step_times_s),
            "tokens_per_s": self.tokens_per_s,
            "step_time_s": self.window.elapsed_s / self.window.steps,
            "global_batch_tokens": self.global_batch_tokens,
            "peak_mem_allocated_gib": self.peak.allocated_gib,
            "peak_mem_reserved_gib": self.peak.reserved_gib,
            "peak_rss_gib": self.peak.rss_gib,
            "loss_last": self.loss_last,
        }


def seed(value: int) -> None:
    """Seed torch's generators (CPU and every CUDA device): the random weights."""
    import torch

    torch.manual_seed(value)


def synthetic_ids(vocab_size: int, batch_size: int, seq_len: int, seed_value: int, data_rank: int,
                  device: Any) -> Any:
    """``[batch_size, seq_len]`` token ids uniform in [0, vocab_size), drawn on the CPU from a
    generator of their own (seed + IDS_SEED_OFFSET + data_rank, so the weights' stream is not
    consumed and every data-parallel replica gets its own batch), then moved to ``device``."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed_value + IDS_SEED_OFFSET + data_rank)
    return torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen).to(device)


def peak_memory(device: Any, accelerator: str) -> PeakMemory:
    """Peak allocated and reserved device memory and peak host RSS, the max over the ranks of
    the default process group (a collective where it has several ranks: every rank calls it).

    One rank reads its own peaks and calls no collective. Before the collective the caching
    allocator's free blocks go back to the GPU (the peaks are read by then): a communicator
    the collective creates first (NCCL's, lazily) must find memory, or a cell near the
    memory limit that ran all its steps would fail here, in the harness, not in the cell."""
    import torch
    import torch.distributed as dist

    cuda, gib = accelerator == "cuda", 2.0**30
    peak = torch.tensor([
        torch.cuda.max_memory_allocated(device) / gib if cuda else -1.0,
        torch.cuda.max_memory_reserved(device) / gib if cuda else -1.0,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
    ], dtype=torch.float64, device=device if cuda else "cpu")
    if world_size() > 1:
        if cuda:
            torch.cuda.empty_cache()
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    values = peak.tolist()
    return PeakMemory(allocated_gib=values[0] if cuda else None, reserved_gib=values[1] if cuda else None,
                      rss_gib=values[2])


def world_size() -> int:
    """Ranks of the default process group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def run(backend: Backend, protocol: Protocol, *, batch_size: int, vocab_size: int, accelerator: str,
        device: Any, after_window: Callable[[Callable[[], None]], None] | None = None,
        phases: Phases | None = None) -> RepeatResult:
    """One repeat: seed, ``backend.build()``, synthetic ids, ``protocol.warmup_steps`` steps,
    then ``protocol.measured_steps`` timed steps, peak memory since the build.

    ``after_window(step)`` runs more steps on the same batch after the timed window and before
    peak memory is read (a profile cell's traced steps); the window is already measured then.
    ``phases`` gets the marks build (model and engine, the backend's checksum included),
    window (warm-up and measured steps, ending synchronised) and after_window."""
    import torch

    seed(protocol.seed)
    layout = backend.build()
    if phases is not None:
        phases.mark("build")
    ids = synthetic_ids(vocab_size, batch_size, protocol.seq_len, protocol.seed, layout.data_rank, device)
    last: list[Any] = [None]

    def step() -> None:
        last[0] = backend.step(ids)

    if accelerator == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    window = run_window(step, protocol, backend.synchronize)
    if phases is not None:
        phases.mark("window")
    if after_window is not None:
        after_window(step)
    peak = peak_memory(device, accelerator)
    if phases is not None:
        phases.mark("after_window")
    loss = last[0]
    return RepeatResult(
        world_size=world_size(), window=window, global_batch_tokens=batch_size * protocol.seq_len * layout.data_parallel,
        peak=peak, loss_last=None if loss is None else float(loss.detach().float().item()))
