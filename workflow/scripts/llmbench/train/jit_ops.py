"""Safe concurrent loads of DeepSpeed's JIT-compiled ops across cells.

torch.utils.cpp_extension guards an op's build folder with a plain ``lock`` file (its
FileBaton: created with O_EXCL, removed on release, no owner recorded), and DeepSpeed
takes it on every load of a JIT op, built or not. Two failure modes follow when cells run
side by side:

- a worker killed while holding it (the memory cap, a timeout, Snakemake stopping a job)
  leaves the file behind, and every later load waits on it forever (seen in CI: a ZeRO-3
  cell hung until its timeout after the forced-OOM cell);
- removing that file by its age cannot tell a dead holder from a slow live one: a live
  holder whose file was removed fails in its own release (``os.remove`` of a file that is
  gone, or of the next holder's), and DeepSpeed reports "cpu_adam op failed to build/load"
  (seen in CI on a loaded 2-core machine).

:func:`guard_jit_loads` wraps DeepSpeed's ``OpBuilder.jit_load`` in an ``fcntl.flock`` on
a file beside the build folder. The kernel drops a flock when its holder dies, and every
loader in llmbench's workers holds it, so a ``lock`` file found while holding the flock
belongs to a dead process and is removed: no timing guess. On a file system without flock
(Lustre mounted without ``-o flock``) loads go on unguarded, as DeepSpeed's own. Set-up
(envs/setup.sh) builds the CPU ops before any cell runs, under the same guard; on GPU
machines the first cell that needs an op builds it while the others wait.
"""
from __future__ import annotations

import fcntl
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: torch.utils.file_baton's lock file, inside the op's build folder
BATON_NAME = "lock"


def build_dir(name: str) -> Path:
    """The folder torch JIT-builds op ``name`` in (TORCH_EXTENSIONS_DIR or torch's default)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


@contextmanager
def op_load_lock(folder: Path) -> Iterator[bool]:
    """Hold the flock of one op's build ``folder``; yields whether a dead process's baton
    was found there and removed."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.llmbench-flock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)  # released by close, or by the kernel if we die
        except OSError as err:  # a file system without flock (Lustre mounted without -o flock)
            print(f"llmbench: no flock on {fh.name} ({err}); loading op {folder.name} unguarded", flush=True)
            yield False  # a baton found here may be a live holder's: leave it
            return
        baton = folder / BATON_NAME
        stale = baton.exists()
        if stale:  # every live loader holds this flock: the baton's holder is gone
            baton.unlink()
        yield stale


def guard_jit_loads() -> None:
    """Wrap DeepSpeed's ``OpBuilder.jit_load`` (once per process) in :func:`op_load_lock`."""
    from deepspeed.ops.op_builder.builder import OpBuilder

    original = OpBuilder.jit_load
    if getattr(original, "_llmbench_guarded", False):
        return

    @functools.wraps(original)
    def jit_load(self, verbose=True):
        with op_load_lock(build_dir(self.name)) as stale:
            if stale:
                print(f"llmbench: removed the JIT build lock of op {self.name} left by a dead process",
                      flush=True)
            return original(self, verbose)

    jit_load._llmbench_guarded = True
    OpBuilder.jit_load = jit_load
