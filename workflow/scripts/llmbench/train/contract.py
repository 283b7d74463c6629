"""The worker contract with llmbench.launch, written once for every worker (DeepSpeed,
Megatron-LM, the profile worker):

    torchrun ... -m <worker> --spec spec.json --out repeat.json [--trace-dir DIR]

(one rank: ``python -m <worker> ...`` with torchrun's variables, launch.rank_launch).

Rank 0 writes ``--out`` (JSON) on success. A rank that runs out of memory writes
``<out>.oom.rank<r>`` with the message and exits with OOM_EXIT; the launcher reads that as
status oom. Any other exception propagates (status error, with the log's last exception).
The process group is destroyed before exit (a 2-rank ZeRO-3 run aborts at exit without).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

OOM_EXIT = 75


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of the device or the host allocator."""
    import torch

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return "out of memory" in text.lower() or "can't allocate memory" in text or "DefaultCPUAllocator" in text


def local_device(accelerator: str) -> Any:
    """This rank's device: its local GPU (made current) on a GPU platform, else the CPU."""
    import torch

    if accelerator == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def window_result(window: Any, tokens_per_step: int) -> dict[str, Any]:
    """A training loop's timed window as result keys (tokens/s over all ranks)."""
    return {
        "elapsed_s": window.elapsed_s,
        "steps": window.steps,
        "step_times_s": list(window.step_times_s),
        "tokens_per_s": tokens_per_step * window.steps / window.elapsed_s,
        "step_time_s": window.elapsed_s / window.steps,
        "global_batch_tokens": tokens_per_step,
    }


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """Where a repeat's wall time goes: seconds from one mark to the next, as summary keys
    ``phase_<name>_s`` (the first, ``phase_start_s``, from process start: interpreter and
    the worker's own imports). Marks are host clock reads; a mark after device work must
    follow a synchronize to mean the device's time too."""

    def __init__(self) -> None:
        age = process_age_s()
        self.seconds: dict[str, float] = {} if age is None else {"phase_start_s": age}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[f"phase_{name}_s"] = now - self._last
        self._last = now


def peak_memory(device: Any, accelerator: str) -> dict[str, float | None]:
    """Peak allocated and reserved device memory and peak host RSS in GiB, the max over the
    ranks of the default process group (a collective: every rank calls it)."""
    import resource

    import torch
    import torch.distributed as dist

    cuda, gib = accelerator == "cuda", 2.0**30
    peak = torch.tensor([
        torch.cuda.max_memory_allocated(device) / gib if cuda else -1.0,
        torch.cuda.max_memory_reserved(device) / gib if cuda else -1.0,
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB on Linux
    ], dtype=torch.float64, device=device if cuda else "cpu")
    if dist.is_initialized():
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"peak_mem_allocated_gib": peak[0].item() if cuda else None,
            "peak_mem_reserved_gib": peak[1].item() if cuda else None,
            "peak_rss_gib": peak[2].item()}


def main(run: Callable[..., dict | None], argv: list[str] | None, doc: str | None,
         teardown: Callable[[], None] | None = None) -> int:
    """Parse the contract's arguments, call ``run(spec, out, trace_dir)``, and apply the
    contract: rank 0 writes what ``run`` returns (a worker that writes ``--out`` itself
    returns None); an OOM writes its marker and returns OOM_EXIT; the process group goes."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", required=True, type=Path, help="resolved cell spec (JSON)")
    ap.add_argument("--out", required=True, type=Path, help="where rank 0 writes the repeat result")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="profile cells: where the Chrome trace goes (the worker's default otherwise)")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    rank = int(os.environ.get("RANK", 0))
    try:
        result = run(spec, args.out, args.trace_dir)
        if result is not None and rank == 0:
            args.out.write_text(json.dumps(result, indent=2))
    except BaseException as exc:  # noqa: BLE001 - classify, then re-raise or exit
        if is_oom(exc):
            Path(f"{args.out}.oom.rank{rank}").write_text(f"{type(exc).__name__}: {exc}"[:2000])
            traceback.print_exc()
            return OOM_EXIT
        raise
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            try:
                if teardown is not None:
                    teardown()
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
    return 0


def leave(code: int) -> None:
    """End a worker process run as a script with ``code``, skipping interpreter teardown.

    The work is done (rank 0 wrote ``--out``, the process group is gone): what follows is
    C++ destructors and atexit hooks, and one of them once aborted a rank ("terminate called
    without an active exception": a 2-rank ZeRO-3 profile cell on the CPU, 2026-11-23),
    which turned a measured repeat into an error. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
