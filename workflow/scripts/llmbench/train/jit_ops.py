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
(Lustre mounted without ``-o flock``) loads go on unguarded, as DeepSpeed's own.

:func:`build` loads (building where needed) the ops a cell of a platform may load (OPS, by
the platform's accelerator), under the same guard, in the environment that cell's workers
have: the platform file's ``env`` over this process's, in the folder the launcher gives
them (llmbench.launch.worker_env, extensions_dir). torch keys a JIT build by its compiler
flags, and DeepSpeed takes its CUDA flags from TORCH_CUDA_ARCH_LIST, which the Hopper
platform files set: an op built under another value is built again by the first cell, and
the GPU image's own value (9.0a) is one DeepSpeed's builder cannot read, so a build without
the platform's environment fails there. Set-up (envs/setup.sh) builds the CPU platform's,
and envs/offline-batch.sh those of each platform of its DeepSpeed targets, on a GPU machine before
its first target (a fresh machine otherwise compiles fused_adam and cpu_adam inside its
first cells, whose repeats then run past their estimates, or past a deadline the estimates
were to keep). ``python -m llmbench.train.jit_ops build --platform NAME`` runs it;
``--targets FILE`` builds for each platform of the DeepSpeed targets a list names, one process each.
"""
from __future__ import annotations

import fcntl
import functools
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

#: torch.utils.file_baton's lock file, inside the op's build folder
BATON_NAME = "lock"
#: DeepSpeed's JIT ops (builder class names) a cell may load, by accelerator: the optimizer's
#: (FusedAdam on a GPU; CPU Adam for offload, and on the CPU) and the CPU's collectives
OPS = {"cuda": ("FusedAdamBuilder", "CPUAdamBuilder"), "cpu": ("CPUAdamBuilder", "ShareMemCommBuilder")}
#: every builder OPS names (the CLI's --ops)
KNOWN_OPS = sorted({name for names in OPS.values() for name in names})


def extensions_dir() -> Path:
    """The folder the launcher's workers JIT-build ops in unless TORCH_EXTENSIONS_DIR says
    otherwise (llmbench.launch.worker_env): beside this Python, so a cache fits its torch."""
    return Path(sys.prefix) / "torch_extensions"


def own_ninja_path(path: str) -> str:
    """``path`` (a PATH) with this interpreter's own ninja first: ``<sys.prefix>/bin/ninja``,
    which pip installs with DeepSpeed, through a folder in the op cache that holds only a link
    to it. torch builds an op by running ``ninja`` from PATH, and a ninja of another version
    takes the build folder's log for a foreign one and builds every op again. So without this
    an activated venv (its ninja first) and a plain ``.venv/bin/python`` (the system's first,
    where there is one) built the ops in turn, each time the other had built them last.
    Set-up, the op build ahead and every worker (llmbench.launch.worker_env) take their PATH
    from here. ``path`` is returned as it is where the interpreter has no ninja of its own or
    the link cannot be written."""
    own = Path(sys.prefix) / "bin" / "ninja"
    if not own.is_file():
        return path
    folder = extensions_dir() / ".ninja"
    link = folder / "ninja"
    try:
        if not (link.is_symlink() and os.readlink(link) == str(own)):
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".ninja.{os.getpid()}"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(own)
            os.replace(tmp, link)  # atomic: a worker starting beside this one sees one link or the other
    except OSError:
        return path
    rest = [p for p in path.split(os.pathsep) if p and p != str(folder)]  # once, where a launcher nests
    return os.pathsep.join([str(folder), *rest])


def op_env(env: MutableMapping[str, str]) -> None:
    """Set in ``env`` what an op's JIT build reads beyond the platform's variables: the op
    folder (extensions_dir, where unset) and PATH with this interpreter's ninja first
    (own_ninja_path). build and every worker (llmbench.launch.worker_env) take it from here,
    so an op built ahead is the one a worker loads."""
    env.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    env["PATH"] = own_ninja_path(env.get("PATH", ""))


def build(platform: str, ops: tuple[str, ...] | None = None) -> list[tuple[str, float]]:
    """Load ``ops`` (default OPS of the platform's accelerator) as a cell of config/platforms/
    ``platform`` would, under the guard, building the ones not yet built: (op name, seconds)
    each. This process takes what of a worker's environment the build reads (not the whole of
    llmbench.launch.worker_env, which imports this module): the platform's env over this
    process's, then op_env; and DS_ACCELERATOR its accelerator. One platform a process:
    DeepSpeed keeps an op once loaded, whatever the environment after."""
    from llmbench.platforms import Platform

    found = Platform.load(platform)
    os.environ.update({key: str(value) for key, value in found.env.items()})
    op_env(os.environ)
    os.environ["DS_ACCELERATOR"] = found.accelerator
    guard_jit_loads()
    from deepspeed.accelerator import get_accelerator

    done = []
    for name in ops or OPS[found.accelerator]:
        builder = get_accelerator().create_op_builder(name)
        t0 = time.monotonic()
        builder.load(verbose=False)
        done.append((builder.NAME, time.monotonic() - t0))
    return done


def target_platforms(lines: list[str]) -> list[str]:
    """The platforms, in first-seen order, of the DeepSpeed cells a target list names (records,
    probes, search folders; llmbench.cells.parse). Serving, microbenchmark and Megatron-LM
    targets load none of these ops; a line that follows no pattern, or a comment, names none."""
    from llmbench import cells

    patterns = (*cells.RECORD_PATTERNS, cells.SEARCH_PATTERN)
    found = (cells.parse(line.strip(), patterns) for line in lines if line.strip() and not line.startswith("#"))
    return list(dict.fromkeys(p.wildcards["platform"] for p in found
                              if p and p.wildcards.get("backend", "").startswith("deepspeed")))


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


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.train.jit_ops build (--platform NAME | --targets FILE) [--ops ...]``."""
    import argparse
    import subprocess

    from llmbench.config import available

    parser = argparse.ArgumentParser(prog="python -m llmbench.train.jit_ops", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("build", help=build.__doc__.split("\n")[0])
    which = one.add_mutually_exclusive_group(required=True)
    which.add_argument("--platform", help="a config/platforms name")
    which.add_argument("--targets", type=Path, help="a target list: build for each platform of its DeepSpeed targets")
    one.add_argument("--ops", default=None, help="builder class names, comma-separated (default: OPS)")
    args = parser.parse_args(argv)
    ops = tuple(args.ops.split(",")) if args.ops else None
    if ops and (unknown := [o for o in ops if o not in KNOWN_OPS]):
        parser.error(f"--ops: unknown builder(s) {unknown}; known: {KNOWN_OPS}")
    if args.targets:
        platforms = target_platforms(args.targets.read_text().splitlines())
    else:
        platforms = [args.platform]
    if unknown := [p for p in platforms if p not in available("platform")]:
        parser.error(f"unknown platform(s) {unknown}; known: {sorted(available('platform'))}")
    if args.targets:  # a process each (build's docstring): the first failure ends it
        more = ["--ops", args.ops] if args.ops else []
        for name in platforms:
            done = subprocess.run([sys.executable, "-m", "llmbench.train.jit_ops", "build", "--platform", name,
                                   *more])
            if done.returncode:
                return done.returncode
        return 0
    for name, seconds in build(args.platform, ops):
        print(f"llmbench: DeepSpeed op {name} ready in {seconds:.1f} s for platform {args.platform} "
              f"({os.environ['TORCH_EXTENSIONS_DIR']})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
