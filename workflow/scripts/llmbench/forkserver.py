"""Warm start for cells: a fork server that imports torch, DeepSpeed, transformers (and
PEFT, on the CPU) once and forks every repeat's ranks from that state.

Why: on the 2-core CPU machines a tiny cell's repeat computes for ~2 s after ~10 s of
imports (torch ~3 s, transformers' Llama ~5 s, DeepSpeed ~2 s: ``python -X importtime``).
The embedded default runs ~40 such repeats, so imports were most of its time. A repeat
forked from a process that has them imported starts its worker in ~0.1 s. On a GPU node
the same imports take 14-17 s of every repeat and every max-batch probe, whose steps may
take less.

On a GPU a process that forks must not have initialised CUDA: a child of such a process
cannot use the GPU. Importing torch, DeepSpeed (with ``DS_ACCELERATOR`` set, so it does not
probe for an accelerator) and transformers does not initialise it; importing PEFT does, as it
imports bitsandbytes, which reads the GPU's compute capability. So a GPU platform's server
preloads everything but PEFT (``preload_for``) with torch's NVML-based device count
(``PYTORCH_NVML_BASED_CUDA_CHECK``), and checks after each import that CUDA is still
uninitialised; a server whose imports initialised it refuses to start, naming the module.
The launcher then starts one without that module (each rank imports it: where torchao is
installed, transformers' Llama imports it, and it asks for the compute capability), and execs
only where a server cannot start at all. What it learnt stays beside the sockets (a file per
interpreter, accelerator, package sources and import-time variables: ``initialising_path``),
so the next launcher, the next cell's job, reaches that server at once instead of starting
and losing one server per such module first (each had imported torch, DeepSpeed and
transformers before it refused).

What stays as it was: each repeat is its own process (a fork), in its own session (the
launcher stops it with ``os.killpg`` as before), with its own environment (``os.environ``
is replaced by the request's before the worker's code runs; thread counts are applied
through ``torch.set_num_threads``), its own working directory and log. Ranks are forked
by a per-repeat leader, which plays torchrun's part: every rank gets RANK, WORLD_SIZE,
MASTER_ADDR/PORT from the request, and when one rank fails the others are stopped; the
leader exits with the first failure's code (a rank killed by signal s: 128 + s, as torchrun
reports it). ``launch.run_worker`` classifies that exit as it classifies a torchrun's.

Where it is used: platforms with ``fork_server: true`` (config/platforms/cpu.yaml, and the
lent one-GPU machines' h100.yaml and h200.yaml), never inside a Slurm job (a job is one
cell on a node it does not keep). If the server cannot start, the launcher execs the
worker as before and says so in the log. The record's provenance names the launcher that
ran each repeat.

Lifetime: the first launcher that needs a server starts it (its own session, log beside
the socket) and waits until it has imported everything; later launchers connect. It exits
after ``IDLE_S`` seconds (60; LLMBENCH_FORK_SERVER_IDLE_S sets another) with no request and
no repeat running. The socket's name hashes the interpreter, this package's sources and
real path, the preload list and the variables an import may read (import_env), so an edited
checkout, another venv or another TORCH_*/HF_* setting never runs in a stale server. Its
socket, lock and start-up log are in $TMPDIR/llmbench-fork-<uid>/ (mode 0700: the user's
only). ``python -m llmbench.forkserver stop`` ends this user's servers once they are idle.

A repeat never outlives its launcher: the leader watches the launcher's pid (sent with
the request) and kills its whole session when the launcher exits, SIGKILL included
(llmbench.procs.watch_launcher); each rank dies with its leader (PR_SET_PDEATHSIG). The
server itself holds no repeat's resources and exits once idle.

Protocol (one JSON line each way over a Unix socket): request ``{"module", "args",
"envs": [env of rank 0, ...], "cwd", "log", "launcher_pid"}``, reply ``{"pid": leader}``,
then, when the leader has exited, ``{"rc": exit code}`` (Popen's convention: -s for a signal).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import re
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from .procs import die_with_parent, kill_tree, watch_launcher

#: What the server imports before it accepts a request: the heavy libraries a CPU worker
#: imports before its first step, less Megatron (its CPU stubs patch torch.cuda first, per
#: process). Not the worker modules themselves: each rank runs its module afresh as
#: ``__main__`` (runpy), as ``python -m`` would.
PRELOAD = ("torch", "torch.distributed", "deepspeed", "transformers", "peft",
           "transformers.models.llama.modeling_llama", "llmbench.train.build", "llmbench.train.adapters")
#: preloaded modules that initialise CUDA where a GPU is visible (peft imports bitsandbytes,
#: which asks torch for the GPU's compute capability): a GPU platform's server leaves them
#: to each rank
CUDA_INITIALISING = ("peft",)
#: modules a GPU server's import found to initialise CUDA, per (python, accelerator), beyond
#: CUDA_INITIALISING (one that imports torchao where it is installed: its import asks for the
#: GPU's compute capability); learnt once (launch), kept for later launchers in
#: initialising_path's file, then left to each rank
_FOUND_INITIALISING: dict[tuple[str, str], set[str]] = {}
_INITIALISED = re.compile(r"\[fork server\] importing (\S+) initialised CUDA")
#: seconds a server waits for work before it exits; LLMBENCH_FORK_SERVER_IDLE_S sets another
#: (a test session keeps its servers for the session: tests/conftest.py)
IDLE_S = float(os.environ.get("LLMBENCH_FORK_SERVER_IDLE_S", "60"))
START_TIMEOUT_S = 300.0
#: returncode of a repeat whose server went away while it ran (its exit code is unknown)
LOST = -1
#: variables read at import time: a server is shared only by launchers that agree on them
IMPORT_ENV = ("PYTHONPATH", "PYTHONHASHSEED", "LD_LIBRARY_PATH", "LD_PRELOAD")
IMPORT_ENV_PREFIXES = ("TORCH", "PYTORCH", "DS_", "DEEPSPEED", "HF_", "TRANSFORMERS", "PEFT", "BNB_",
                       "CUDA", "KMP_", "GOMP_", "MALLOC_")
#: what the server's environment sets whatever the first launcher's says (DS_ACCELERATOR:
#: the platform's accelerator, server_env_for)
SERVER_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


class Unavailable(RuntimeError):
    """The fork server could not be started or reached (the launcher execs instead)."""


def server_for(platform: dict) -> str | None:
    """The accelerator of the fork server a repeat on ``platform`` (a cell spec's platform
    dict) starts from (its ``accelerator``), or None where repeats are exec'ed."""
    if platform.get("fork_server") and "SLURM_JOB_ID" not in os.environ:
        return platform["accelerator"]
    return None


def preload_for(accelerator: str) -> tuple[str, ...]:
    """What a server for ``accelerator`` imports before it serves."""
    return PRELOAD if accelerator == "cpu" else tuple(m for m in PRELOAD if m not in CUDA_INITIALISING)


def server_env_for(accelerator: str) -> dict[str, str]:
    """What a server for ``accelerator`` sets in its environment over the launcher's."""
    gpu = {} if accelerator == "cpu" else {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    return {**SERVER_ENV, "DS_ACCELERATOR": accelerator, **gpu}


# ---------------------------------------------------------------- client (the launcher)

def import_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` that the preloaded modules may read while importing (the
    rest, per-rank variables and thread counts included, each rank gets before its worker
    code runs)."""
    return {k: v for k, v in env.items() if k in IMPORT_ENV or k.startswith(IMPORT_ENV_PREFIXES)}


def _key(python: str, accelerator: str, preload: tuple[str, ...], env: dict[str, str]) -> str:
    pkg = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for part in (python, accelerator, str(pkg), *preload, json.dumps(import_env(env), sort_keys=True)):
        h.update(part.encode() + b"\0")
    for src in sorted(pkg.rglob("*.py")):
        h.update(str(src.relative_to(pkg)).encode() + b"\0" + src.read_bytes())
    return h.hexdigest()[:16]


def server_dir() -> Path:
    """This user's servers' sockets, locks and start-up logs (mode 0700)."""
    path = Path(tempfile.gettempdir()) / f"llmbench-fork-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:  # whoever can write here can run code as us
        raise Unavailable(f"{path} is not this user's alone (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o})")
    return path


def socket_path(key: str) -> Path:
    return server_dir() / f"{key}.sock"


def initialising_path(python: str, accelerator: str, env: dict[str, str]) -> Path:
    """Where launchers keep the preloaded modules found to initialise CUDA (a JSON list),
    for one interpreter, accelerator, package sources and import-time variables (``_key``
    without a preload): what decides whether an import initialises CUDA."""
    return server_dir() / f"{_key(python, accelerator, (), env)}.initialising"


def _found_initialising(python: str, accelerator: str, env: dict[str, str]) -> set[str]:
    """The modules found to initialise CUDA so far: this process's, and those an earlier
    launcher kept (a file that cannot be read adds none: the server's own check finds them)."""
    found = _FOUND_INITIALISING.setdefault((python, accelerator), set())
    with contextlib.suppress(OSError, ValueError, TypeError):
        found.update(str(m) for m in json.loads(initialising_path(python, accelerator, env).read_text()))
    return found


def _keep_initialising(python: str, accelerator: str, env: dict[str, str], found: set[str]) -> None:
    """Keep ``found`` for later launchers (written whole, then renamed into place)."""
    path = initialising_path(python, accelerator, env)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(sorted(found)))
        os.replace(tmp, path)


class Forked:
    """A repeat forked by the server: the part of subprocess.Popen the launcher uses
    (pid, poll, wait, returncode); ``pid`` leads the repeat's process group. Thread-safe
    (the launcher's memory watchdog polls while the launcher waits), and re-entrant: a
    SIGTERM that lands while the launcher waits runs procs._on_signal in the same thread,
    and its kill_group waits on this repeat again (a plain lock deadlocked there)."""

    def __init__(self, sock: socket.socket, pid: int, args: list[str], buf: bytes = b""):
        """``buf``: what the launcher read from ``sock`` past the server's reply (the exit
        code's line may have come with it)."""
        self._sock: socket.socket | None = sock
        self._buf = b""
        self._lock = threading.RLock()
        self.pid, self.args, self.returncode = pid, args, None
        self._take(buf)

    def _read(self, timeout: float) -> None:
        with self._lock:
            if self.returncode is None:
                self._read_locked(timeout)

    def _read_locked(self, timeout: float) -> None:
        if self._sock is None:  # the server went away: all that is left is whether pid lives
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = LOST
                return
            time.sleep(min(timeout, 0.1))
            return
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return
        data = self._sock.recv(4096)
        if not data:
            self._sock.close()
            self._sock = None
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        self._buf += data
        if b"\n" in self._buf:
            self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["rc"])
            self._sock.close()
            self._sock = None

    def poll(self) -> int | None:
        """As Popen's, it never waits: where another thread is reading (the launcher's wait,
        while the memory watchdog polls), the repeat is still running as far as is known. A
        poll that queued for the lock could lose it to the waiting thread's loop again and
        again, and the watchdog, starved, would not read the ranks' memory."""
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                if self.returncode is None:
                    self._read_locked(0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.5 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(min(left, 0.1))
        return self.returncode


def _connect(path: Path) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        return sock
    except OSError:
        sock.close()
        return None


def _ensure_server(path: Path, python: str, accelerator: str, preload: tuple[str, ...], env: dict[str, str],
                   start_timeout_s: float, idle_s: float) -> socket.socket:
    sock = _connect(path)
    if sock is not None:
        return sock
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one launcher starts it; the others wait here
        sock = _connect(path)
        if sock is not None:
            return sock
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a dead server's socket
        log = path.with_suffix(".log")
        with open(log, "w") as fh:
            server = subprocess.Popen(
                [python, "-m", "llmbench.forkserver", "serve", "--socket", str(path), "--accelerator", accelerator,
                 "--preload", ",".join(preload), "--idle-s", str(idle_s)],
                env={**env, **server_env_for(accelerator)}, stdin=subprocess.DEVNULL, stdout=fh,
                stderr=subprocess.STDOUT, cwd="/", start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            sock = _connect(path)
            if sock is not None:
                return sock
            if server.poll() is not None:
                raise Unavailable(f"the fork server exited with code {server.returncode} while starting: "
                                  f"{log.read_text(errors='replace')[-1500:]}")
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        raise Unavailable(f"the fork server did not start within {start_timeout_s:g} s (log: {log})")


def launch(module: str, args: list[str], envs: list[dict[str, str]], *, cwd: Path, log: Path,
           server_env: dict[str, str], accelerator: str = "cpu", python: str = sys.executable,
           preload: tuple[str, ...] | None = None, start_timeout_s: float = START_TIMEOUT_S,
           idle_s: float = IDLE_S) -> Forked:
    """Fork ``python -m module args`` once per environment in ``envs`` (one per rank) from a
    warm server for ``accelerator`` (cpu | cuda), all in one new session; output appended to
    ``log``. ``server_env``: the environment a new server starts with (its import_env part
    of the server's key); a new server exits after ``idle_s`` without work."""
    wanted = tuple(preload_for(accelerator) if preload is None else preload)
    found = _found_initialising(python, accelerator, server_env) if accelerator != "cpu" else set()
    while True:  # a preload that initialised CUDA is left to the ranks, and the server started without it
        preload = tuple(m for m in wanted if m not in found)
        path = socket_path(_key(python, accelerator, preload, server_env))
        try:
            sock = _ensure_server(path, python, accelerator, preload, server_env, start_timeout_s, idle_s)
            break
        except Unavailable as exc:
            hit = _INITIALISED.search(str(exc))
            if hit is None or hit.group(1) not in preload:
                raise
            found.add(hit.group(1))
            _keep_initialising(python, accelerator, server_env, found)
            with open(log, "a") as fh:
                fh.write(f"=== fork server: importing {hit.group(1)} initialised CUDA; each rank imports it\n")
    try:
        # absolute: the server's working directory is not the launcher's
        request = {"module": module, "args": list(args), "envs": envs, "cwd": str(Path(cwd).absolute()),
                   "log": str(Path(log).absolute()), "launcher_pid": os.getpid()}
        sock.sendall(json.dumps(request).encode() + b"\n")
        sock.settimeout(30)
        line, rest = _read_line(sock)
        sock.settimeout(None)
        reply = json.loads(line) if line else {"error": "the server closed the connection"}
    except (OSError, ValueError) as exc:
        sock.close()
        raise Unavailable(f"fork server request failed: {exc}") from exc
    if "pid" not in reply:
        sock.close()
        raise Unavailable(f"fork server refused the request: {reply.get('error')}")
    return Forked(sock, int(reply["pid"]), [module, *args], rest)


def _read_line(sock: socket.socket) -> tuple[bytes, bytes]:
    """The first line on ``sock`` (b"" where it closed first) and what came after it. Not a
    buffered file over the socket: a repeat that ends at once has its exit code's line sent
    right behind the reply, and a file's buffer would take it and drop it with the file."""
    buf = b""
    while b"\n" not in buf:
        data = sock.recv(4096)
        if not data:
            return b"", b""
        buf += data
    line, rest = buf.split(b"\n", 1)
    return line, rest


def stop_all() -> int:
    """Ask every fork server of this user to exit once idle; returns how many were asked."""
    asked = 0
    try:
        paths = list(server_dir().glob("*.sock"))
    except Unavailable:
        return 0
    for path in paths:
        sock = _connect(path)
        if sock is None:
            continue
        with sock:
            sock.sendall(b'{"stop": true}\n')
            asked += 1
    return asked


# ---------------------------------------------------------------- server

def _rank(module: str, args: list[str], env: dict[str, str]) -> int:
    """Become one rank: the request's environment and thread count, then the module as
    ``python -m`` runs it. Returns its exit code."""
    os.environ.clear()
    os.environ.update(env)
    threads = env.get("OMP_NUM_THREADS")
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - print as python would, exit 1
        traceback.print_exc()
        return 1


def _lead(request: dict) -> int:
    """The repeat's leader (session leader, its process group's id): fork the ranks, wait,
    stop the others when one fails; exit with the first failure's code (signal s: 128 + s)."""
    pids, leader = [], os.getpid()
    for env in request["envs"]:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                die_with_parent(leader)  # a leader killed alone takes its ranks along
                code = _rank(request["module"], request["args"], env)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)

    def orphaned() -> None:  # the launcher is gone: so is this repeat, all of its session
        print(f"[fork server] launcher {request['launcher_pid']} exited; killing this repeat", flush=True)
        kill_tree(leader)
        os.killpg(0, signal.SIGKILL)

    # started after the ranks are forked: a fork copies only the forking thread
    watch_launcher(int(request.get("launcher_pid") or 0), orphaned)
    first, pending = 0, set(pids)
    while pending:
        pid, status = os.wait()
        pending.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by signal s: 128 + s, as torchrun says
        if code and not first:
            first = code
            print(f"[fork server] rank {pids.index(pid)} (pid {pid}) exited with code {code}; "
                  f"stopping the other ranks", flush=True)
            for other in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGTERM)
    return first


def _fork_repeat(request: dict, close: list, close_fds: tuple[int, ...] | list[int] = ()) -> int:
    """Fork the repeat's leader; what can fail before its output goes to the cell's log (the
    log itself, the working directory) fails here, as the reply to the launcher. Returns once
    the leader leads its own session with default signal handlers (or has died trying): the
    launcher may stop the repeat's group the moment it has the pid, and a stop that came
    before the session would find no group and stop nothing."""
    if not os.path.isabs(request["log"]) or not os.path.isdir(request["cwd"]):
        raise ValueError(f"log {request['log']!r} must be absolute and cwd {request['cwd']!r} a folder")
    fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    led_r, led_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(fd)
        os.close(led_w)
        os.read(led_r, 1)  # a byte once the session is led; b"" where the leader died first
        os.close(led_r)
        return pid
    code = 1
    try:
        os.close(led_r)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        for s in close:
            s.close()
        signal.set_wakeup_fd(-1)
        for other in close_fds:  # the server's wake-up pipe
            os.close(other)
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.write(led_w, b"1")
        os.close(led_w)
        os.chdir(request["cwd"])
        code = _lead(request)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _accept(listener: socket.socket, children: dict[int, socket.socket], close_fds: list[int]) -> bool:
    """Answer one launcher: fork its repeat (its leader's exit code goes back on the same
    connection, _reap); True where it asked the server to stop once idle."""
    conn, _ = listener.accept()
    try:
        conn.settimeout(10)
        line = conn.makefile("rb").readline()
        request = json.loads(line)
        if request.get("stop"):
            conn.close()
            return True
        pid = _fork_repeat(request, [listener, *children.values()], close_fds)
        conn.settimeout(None)
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        children[pid] = conn
    except (OSError, ValueError, KeyError, TypeError) as exc:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        conn.close()
    return False


def _reap(children: dict[int, socket.socket]) -> bool:
    """Every leader that has exited: its exit code to its launcher. True where one had."""
    reaped = False
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        reaped = True
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"rc": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()
    return reaped


def serve(path: Path, preload: list[str], idle_s: float, accelerator: str = "cpu") -> None:
    started = time.monotonic()
    for name in preload:
        importlib.import_module(name)
        torch = sys.modules.get("torch")
        if accelerator != "cpu" and torch is not None and torch.cuda.is_initialized():
            raise SystemExit(f"[fork server] importing {name} initialised CUDA: a process that forks GPU "
                             f"workers must not; not serving")
    print(f"[fork server] imported {len(preload)} modules in {time.monotonic() - started:.1f} s; "
          f"serving on {path}", flush=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = Path(f"{path}.{os.getpid()}.tmp")
    listener.bind(str(tmp))
    os.chmod(tmp, 0o600)
    listener.listen(64)
    os.replace(tmp, path)  # connectable only now, once everything is imported
    ino = path.stat().st_ino
    # it sleeps until a launcher connects or a repeat's leader exits (SIGCHLD, written to a
    # pipe by Python's wakeup fd), or until it has been idle for idle_s: no polling, so an
    # idle server costs no CPU (a GPU node's, or a test session's several)
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the signal reaches the fd
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}  # leader pid -> its launcher's connection
    last, stopping = time.monotonic(), False
    while children or not stopping:
        timeout = None if children else max(0.0, idle_s - (time.monotonic() - last))
        events = sel.select(timeout=timeout)
        if not events and not children:
            break  # idle for idle_s
        for key, _ in events:
            if key.fileobj is listener:
                stopping = _accept(listener, children, [wake_r, wake_w]) or stopping
                last = time.monotonic()
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
        if _reap(children):
            last = time.monotonic()
    with contextlib.suppress(OSError):
        if path.stat().st_ino == ino:  # not a successor's socket
            path.unlink()
            path.with_suffix(".log").unlink()  # kept only when a server failed to start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a server (launchers start it themselves)")
    s.add_argument("--socket", required=True, type=Path)
    s.add_argument("--preload", default=",".join(PRELOAD), help="comma-separated modules to import first")
    s.add_argument("--idle-s", type=float, default=IDLE_S)
    s.add_argument("--accelerator", default="cpu", help="cpu | cuda: on a GPU, no preload may initialise CUDA")
    sub.add_parser("stop", help="ask this user's servers to exit once idle")
    args = ap.parse_args(argv)
    if args.command == "stop":
        print(f"asked {stop_all()} fork server(s) to stop")
        return 0
    serve(args.socket, [m for m in args.preload.split(",") if m], args.idle_s, args.accelerator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
