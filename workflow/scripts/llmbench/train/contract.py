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
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

OOM_EXIT = 75


def is_oom(exc: BaseException) -> bool:
    """An out-of-memory error of the device or the host allocator, or of NCCL's device
    allocations (llmbench.procs.OOM_MARKERS)."""
    import torch

    from ..procs import says_oom

    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc)
    return says_oom(text) or "out of memory" in text.lower()


def local_device(accelerator: str) -> Any:
    """This rank's device: its local GPU (made current) on a GPU platform, else the CPU."""
    import torch

    if accelerator == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


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
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a rank of torchrun: it never outlives its torchrun
        from ..procs import die_with_parent

        die_with_parent(os.getppid())
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
    without an active exception": a 2-rank ZeRO-3 profile cell on the CPU),
    which turned a measured repeat into an error. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
