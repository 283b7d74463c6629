"""Process lifecycle, in one place: process groups, signals, parent death, the memory
watchdog, ports, log tails and what a log says about out-of-memory.

Every process a cell starts (torchrun and its ranks, a single rank, a serving engine and
its children) is started by start_group at the head of a new session, behind a *leash*:
a small stdlib-only process (this file run as a script) that runs the real command as
its child and kills every process it started when the launcher dies, even by SIGKILL,
which no signal handler sees. Without it a killed Snakemake left the cells' workers
computing (they sit in sessions of their own), and on a GPU node such orphans hold the
GPU for the next cell. The leash:

- watches the launcher through a pidfd (``os.pidfd_open``: readable once it has exited);
- is the child subreaper of what it starts, so a process that leaves its parent (torchrun
  starts every rank in a session of its own) still hangs below it and is found and killed;
- passes its child's exit status through unchanged (a child killed by signal s kills the
  leash with s), so ``Popen.returncode`` means what it meant without it (launch reads -9
  as a SIGKILL, an OOM only when the kernel's OOM killer ran meanwhile: oom_kills);
- forwards SIGTERM, SIGINT and SIGHUP to its child (its handlers are in place before the
  child starts): the graceful stop of stop_group still works;
- once its child has ended, kills what the child left behind (orphans re-parented to it).

Each node of a cell over several nodes runs its torchrun behind a leash too, tied to the
Slurm task's parent (llmbench.nodes).

Ranks forked by llmbench.forkserver have no leash; their leader watches the launcher
with ``watch_launcher`` instead.

Importable without heavy packages (psutil only where the watchdog and the memory
samplers need it): the leash runs under ``python -I`` with nothing but the stdlib.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: What an out-of-memory error looks like in a worker's or an engine's log: PyTorch's
#: device and host allocators, NCCL's device allocations (its "unhandled cuda error" then
#: says "Last error: Failed to CUDA calloc async 608 bytes"), cuBLAS's failed allocation of a
#: handle or workspace (CUBLAS_STATUS_ALLOC_FAILED: "usually caused by a cudaMalloc() failure",
#: cuBLAS's documentation; the autograd thread creates its own handle in the first backward
#: pass), and the serving engines' start-up messages (vLLM's KV cache, its CPU backend's
#: "Not enough memory")
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "DefaultCPUAllocator: can't allocate memory",
               "out of memory", "Failed to CUDA calloc", "Failed to CUDA malloc", "CUBLAS_STATUS_ALLOC_FAILED",
               "Not enough memory", "No available memory for the cache blocks",
               # Slurm's step (cgroup) OOM report: the evidence a rank on another node was OOM-killed
               "oom-kill event", "oom_kill event")
LOG_TAIL_LINES = 40
#: seconds between SIGTERM and SIGKILL when a group is stopped
GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------- logs

def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log (empty if it cannot be read)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


#: a Python exception line: "ValueError: ...", "torch.OutOfMemoryError: ..."
_EXCEPTION = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception|Interrupt)\b.*")
#: what else names an error in an engine's log (C++ aborts, the shell's "Killed", log levels)
_ERROR_WORD = re.compile(r"(Error|Exception|error:|FATAL|Killed)\b")
#: prefixes that launchers put before a rank's or an engine process's lines: torchrun's
#: "[rank0]:", vLLM's "(EngineCore_DP0 pid=123)"
_PREFIX = re.compile(r"^(\[rank\d+\]:|\(\w+ pid=\d+\))\s*")


def last_error(path: Path, lines: int = 400) -> str:
    """The line of a log that most likely names the root cause: the last Python exception
    line (torchrun's ChildFailedError wrapper skipped), else the last line naming an error,
    else the last line."""
    try:
        text = Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return "no log"
    text = [_PREFIX.sub("", ln).strip() for ln in text]
    exceptions = [ln for ln in text if _EXCEPTION.match(ln) and "ChildFailedError" not in ln]
    if exceptions:
        return exceptions[-1][:500]
    errors = [ln for ln in text if _ERROR_WORD.search(ln)]
    if errors:
        return errors[-1][:500]
    text = [ln for ln in text if ln]
    return (f"no exception in the log; its last line: {text[-1]}" if text else "empty log")[:500]


def says_oom(text: str) -> bool:
    """Whether a log's text reports running out of memory (OOM_MARKERS)."""
    return any(m in text for m in OOM_MARKERS)


def oom_kills(path: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (``oom_kill`` in
    /proc/vmstat, Linux 4.13+; the host's count, a cgroup's OOM included); None where it
    cannot be read. A SIGKILL'd rank is an OOM only if this went up while it ran."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def log_says_oom(path: Path, chars: int = 200_000) -> bool:
    """Whether the end of a log reports running out of memory."""
    try:
        return says_oom(Path(path).read_text(errors="replace")[-chars:])
    except OSError:
        return False


# ---------------------------------------------------------------- ports

#: The kernel's range of ports for outgoing connections, and the default where it cannot be read
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_EPHEMERAL_DEFAULT = (32768, 60999)
#: free_port picks among this many ports below that range
_PORT_SPAN = 16384


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_DEFAULT[0]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now, for a rank's rendezvous or an
    engine's server. Picked at random (not from a seeded generator) below the kernel's
    ephemeral range: a port the OS hands out for bind(0) and that is then released may be
    given to an outgoing connection (a load generator's thousand requests, another cell's
    client) before the rank listens on it, and the rank fails with EADDRINUSE. The OS's pick
    where no port of the span binds."""
    low = _ephemeral_low()
    first = max(1024, low - _PORT_SPAN)
    pick = random.SystemRandom()
    for _ in range(64):
        port = pick.randrange(first, low) if low > first else 0
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return sock.getsockname()[1]
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        return sock.connect_ex((host, port)) == 0


# ---------------------------------------------------------------- parent death

def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the thread that forked it exits
    (PR_SET_PDEATHSIG; Linux only, a no-op elsewhere). Call it in the child right after
    the fork, with the parent's pid taken before it: a parent that died before the call
    is caught by comparing that pid with the parent's now."""
    if _prctl(_PR_SET_PDEATHSIG, int(sig)) and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def _open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it has exited); None where the kernel has none.
    Raises ProcessLookupError when ``pid`` is gone already."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, PermissionError):
        return None
    except OSError as exc:
        if isinstance(exc, ProcessLookupError):
            raise
        return None  # ENOSYS: a kernel before 5.3


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait_for_death(pid: int, poll_s: float = 0.5) -> None:
    """Block until process ``pid`` has exited (through a pidfd; by polling without one)."""
    try:
        fd = _open_pidfd(pid)
    except ProcessLookupError:
        return
    if fd is None:
        while alive(pid):
            time.sleep(poll_s)
        return
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 5.0)
            if ready or not alive(pid):  # the second: a pid namespace the pidfd cannot see
                return
    finally:
        os.close(fd)


def _proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            table[int(name)] = (int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), read from /proc."""
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in _proc_table().items():
        children.setdefault(ppid, []).append(p)
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def kill_tree(pid: int, rounds: int = 50) -> None:
    """SIGKILL every descendant of ``pid``, round after round until none is left. ``pid``
    should be a child subreaper (the leash is), so that a process orphaned while its parent
    is being killed is re-parented to ``pid`` and found in the next round."""
    for _ in range(rounds):
        found = descendants(pid)
        if not found:
            return
        for p in found:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        time.sleep(0.02)


def watch_launcher(pid: int, on_death: Callable[[], None]) -> threading.Thread | None:
    """Call ``on_death`` in a daemon thread once process ``pid`` has exited (at once if it
    is gone already). Used where a leash cannot be put in front: the fork server's
    per-repeat leader watches the launcher that asked for the repeat."""
    if not pid:
        return None
    thread = threading.Thread(target=lambda: (wait_for_death(pid), on_death()), daemon=True,
                              name=f"watch-{pid}")
    thread.start()
    return thread


# ---------------------------------------------------------------- the leash

def leash_argv(argv: list[str], launcher_pid: int | None = None, python: str = sys.executable) -> list[str]:
    """``argv`` behind a leash tied to ``launcher_pid`` (default: this process)."""
    return [python, "-I", str(Path(__file__).resolve()), "leash", "--pid",
            str(launcher_pid or os.getpid()), "--", *argv]


def _exit_like(status: int) -> None:
    """End this process as a process with wait status ``status`` ended."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    with contextlib.suppress(ValueError, OSError):
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the child dumped core already, if at all
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled anyway
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal that does not end a process by default


def leash(launcher_pid: int, argv: list[str]) -> None:
    """Run ``argv`` as this process's child, end as it ends, and kill everything below this
    process (and this process group) once ``launcher_pid`` exits. Never returns."""
    if os.getpgid(0) != os.getpid():
        os.setpgid(0, 0)  # never kill the group of whoever started us
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    try:
        launcher = _open_pidfd(launcher_pid)
    except ProcessLookupError:
        os._exit(128 + signal.SIGKILL)
    me = os.getpid()
    child = status = None
    held: list[int] = []  # what came before the child was there to take it

    def forward(signum, _frame) -> None:
        # os.kill, not Popen.send_signal: that may reap the child behind the loop's back
        if child is None:
            held.append(signum)
        elif status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    # Handlers first, child second: a signal sent once the child is up (it may be up before
    # Popen returns here) must reach it, never end the leash alone or, where whoever started
    # us ignores it, be lost. The child starts with them at their defaults (exec resets caught
    # signals), whatever this process inherited.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        # the child dies with the leash too (a leash killed alone, say by the OOM killer)
        child = subprocess.Popen(argv, preexec_fn=lambda: die_with_parent(me))
    except OSError as exc:
        print(f"leash: cannot start {argv[0]}: {exc}", file=sys.stderr, flush=True)
        os._exit(127)
    for signum in held:
        forward(signum, None)
    child_fd = _open_pidfd(child.pid) if launcher is not None else None
    while status is None:
        if launcher is not None and child_fd is not None:
            ready, _, _ = select.select([launcher, child_fd], [], [], 1.0)
            dead = launcher in ready
        else:
            time.sleep(0.2)
            dead = not alive(launcher_pid)
        # reap: our child, and orphans re-parented to us (we are their subreaper)
        with contextlib.suppress(ChildProcessError):
            while True:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                if pid == child.pid:
                    status = st
        if dead:
            kill_tree(os.getpid())
            os.killpg(0, signal.SIGKILL)
    kill_tree(os.getpid())  # what the child left running (a rank orphaned by its torchrun)
    _exit_like(status)


def _main(argv: list[str]) -> None:
    if len(argv) < 5 or argv[0] != "leash" or argv[1] != "--pid" or argv[3] != "--":
        print("usage: procs.py leash --pid LAUNCHER_PID -- COMMAND...", file=sys.stderr)
        sys.exit(2)
    leash(int(argv[2]), argv[4:])


# ---------------------------------------------------------------- groups

def kill_group(proc) -> None:
    """SIGTERM the process group led by ``proc`` (a Popen or anything with pid, wait and
    returncode), then SIGKILL what is left after a grace period."""
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, GRACE_S)):
        if sig == signal.SIGKILL:
            # torchrun starts every rank in a session of its own, out of reach of killpg
            for pid in descendants(proc.pid):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            # ranks may outlive torchrun briefly; give the group the same grace
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.1)
        except subprocess.TimeoutExpired:
            continue


class RssWatchdog(threading.Thread):
    """Kills a process group when one of its processes' RSS exceeds a cap; ``fired`` says
    why once it has."""

    def __init__(self, proc, cap_bytes: float, interval_s: float = 0.05):
        super().__init__(daemon=True)
        self.proc, self.cap, self.interval = proc, cap_bytes, interval_s
        self.fired: str | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.proc.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop.is_set() and self.proc.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                if rss > self.cap:
                    self.fired = (f"process {p.pid} reached {rss / 2**30:.2f} GiB RSS, over the cell's "
                                  f"mem_cap_gib={self.cap / 2**30:g}: killed (out of memory)")
                    kill_group(self.proc)
                    return
            self._stop.wait(self.interval)

    def stop(self) -> None:
        """Stop watching."""
        self._stop.set()


_ACTIVE: list = []


def track(proc) -> None:
    """Stop ``proc``'s group with the others when a signal is caught (stop_groups_on_signal);
    start_group tracks what it starts itself."""
    _ACTIVE.append(proc)


def _on_signal(signum, _frame) -> None:
    """Stop every running process group, then exit (Snakemake cancel, Ctrl-C)."""
    for proc in list(_ACTIVE):
        kill_group(proc)
    sys.exit(128 + signum)


@contextlib.contextmanager
def stop_groups_on_signal() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT stop every group started by start_group, then exit."""
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def start_group(argv: list[str], *, env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group), output appended to ``log``,
    behind a leash to this process (see the module's docstring): the Popen's pid is the
    leash's, and ``argv`` runs as its child.

    Config values reach it as an argument list, never through a shell. Stop it with
    stop_group; until then a signal caught by stop_groups_on_signal stops it too."""
    with open(log, "a") as fh:
        fh.write(f"\n=== {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.Popen(leash_argv(argv), stdout=fh, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True)
    track(proc)
    return proc


def stop_group(proc) -> None:
    """Stop the whole process group of ``proc`` (TERM, then KILL) and forget it."""
    kill_group(proc)
    if proc in _ACTIVE:
        _ACTIVE.remove(proc)


if __name__ == "__main__":
    _main(sys.argv[1:])
