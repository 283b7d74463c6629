"""A throw-away Slurm cluster for the end-to-end tests, of one node or several.

``slurm_cluster(workdir)`` writes its own slurm.conf into *workdir*, starts
munged (unless one already answers), slurmctld and ``slurmd -N localhost``,
waits until the node is idle, yields a :class:`SlurmCluster` and always tears
the daemons down again. ``slurm_cluster(workdir, nodes=2)`` starts one slurmd
per node instead, ``n1``, ``n2``, ..., each with a loopback address of its own
(127.0.0.2, 127.0.0.3, ...; Linux routes all of 127/8 to lo) and its own port,
spool, pid and log file (``%n`` in slurm.conf): Debian's slurmd, built without
--enable-multiple-slurmd, runs that way. Every node is this machine, so jobs
see the same files (a shared file system, as on a cluster) and all traffic
stays on loopback.  Requires root and the Debian packages installed by
``envs/install-slurm.sh`` (slurmctld slurmd slurm-client munge).

Nothing here imports pytest, so conftest.py can import it freely.

Design notes (Snakemake 9.27, snakemake-executor-plugin-slurm 2.8):

* All daemons run in the foreground (``-D`` / ``-F``) as children of this
  process, so we know their pids exactly and never have to kill by name.
* Every process we start carries the environment variable
  ``LLMBENCH_SLURM_CLUSTER=<uuid>``, and so does ``.env``: slurmstepd inherits
  it from slurmd, jobs get it through ``sbatch --export=ALL`` and anything the
  caller starts with ``.env`` (e.g. a snakemake run) has it.  On exit,
  teardown kills (by pid, found in /proc) whatever still carries it, without
  touching another Slurm on the same machine.
* The jobstep of snakemake-executor-plugin-slurm drops SLURM_CONF before its
  inner ``srun``; ``.env["PATH"]`` starts with a per-cluster ``srun`` wrapper
  that sets it again.
* Ports are picked free at start-up; if something listens on them when the
  daemons are about to start, we refuse with a clear error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflow" / "scripts"))  # run as a script (main)
from llmbench.procs import alive  # noqa: E402

__all__ = ["SlurmCluster", "SlurmClusterError", "slurm_available", "slurm_cluster"]

PARTITION = "cpu"
NODE = "localhost"
CLUSTER_NAME = "llmbench-ci"
MARKER_VAR = "LLMBENCH_SLURM_CLUSTER"

MUNGE_RUN_DIR = Path("/run/munge")
MUNGE_SOCKET = MUNGE_RUN_DIR / "munge.socket.2"  # slurm's auth/munge default
MUNGE_PIDFILE = MUNGE_RUN_DIR / "munged.pid"
MUNGE_KEY = Path("/etc/munge/munge.key")

# Daemons live in /usr/sbin, which a non-login shell may not have on PATH.
_SEARCH_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
)


class SlurmClusterError(RuntimeError):
    """The test cluster could not be started (message holds the log tails)."""


def _which(name: str) -> str | None:
    return shutil.which(name, path=_SEARCH_PATH)


def slurm_available() -> bool:
    """True if the Slurm and munge binaries needed here are installed."""
    return all(
        _which(b)
        for b in (
            "slurmctld", "slurmd", "sbatch", "srun", "squeue", "sinfo", "scancel",
            "munged", "munge", "unmunge",
        )
    )


@dataclass
class SlurmCluster:
    """What the context manager yields."""

    workdir: Path
    conf: Path
    # Merge into os.environ for subprocesses: SLURM_CONF, PATH (with the srun
    # wrapper first) and the teardown marker.
    env: dict[str, str]
    partition: str = PARTITION
    node: str = NODE
    nodes: tuple[str, ...] = (NODE,)
    slurmctld_port: int = 0
    slurmd_port: int = 0
    cpus: int = 1
    real_memory_mb: int = 0
    startup_seconds: float = 0.0
    pids: dict[str, int] = field(default_factory=dict)  # daemons we started

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, squeue, ...) against this cluster."""
        return subprocess.run(
            list(cmd),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
        )


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def _free_port() -> int:
    # Bind on all interfaces: slurmctld/slurmd listen on 0.0.0.0.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return True  # something is listening
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _mem_total_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024  # kB -> MiB
    raise SlurmClusterError("MemTotal not found in /proc/meminfo")


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(text[-lines:]) or "<empty>"


def _munge_works(env: dict[str, str]) -> bool:
    """True if a munged answers on the default socket (credential round trip)."""
    munge, unmunge = _which("munge"), _which("unmunge")
    if not (munge and unmunge and MUNGE_SOCKET.exists()):
        return False
    try:
        cred = subprocess.run([munge, "-n"], capture_output=True, timeout=5, env=env)
        if cred.returncode != 0:
            return False
        back = subprocess.run([unmunge], input=cred.stdout, capture_output=True, timeout=5, env=env)
        return back.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _marked_pids(marker: str) -> list[int]:
    """Pids of processes whose environment carries our marker (not ourselves)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    spare = {os.getpid(), os.getppid()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spare:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(entry))
    return found


def _stop(proc: subprocess.Popen | None, timeout: float = 15) -> None:
    """SIGTERM one child of ours, then SIGKILL after *timeout*; always reap it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _node_lines(names: tuple[str, ...], ports: tuple[int, ...], cpus: int, real_mem: int) -> str:
    """slurm.conf's node lines: one node at 127.0.0.1 (SlurmdPort), or each of several at a
    loopback address and port of its own."""
    if names == (NODE,):
        return f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={real_mem} State=UNKNOWN"
    return "\n".join(f"NodeName={n} NodeAddr=127.0.0.{i + 2} Port={port} CPUs={cpus} RealMemory={real_mem} "
                     "State=UNKNOWN" for i, (n, port) in enumerate(zip(names, ports)))


def _write_conf(
    workdir: Path, ctld_port: int, slurmd_port: int, cpus: int, real_mem: int, def_mem: int,
    names: tuple[str, ...] = (NODE,), ports: tuple[int, ...] = (),
) -> Path:
    d = {k: workdir / k for k in ("state", "spool", "log", "run")}
    for p in d.values():
        p.mkdir(parents=True, exist_ok=True)
    conf = workdir / "slurm.conf"
    multi = names != (NODE,)
    conf.write_text(
        f"""\
# Written by tests/e2e/slurm_cluster.py -- a throw-away cluster on this machine.
ClusterName={CLUSTER_NAME}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={d['state']}
SlurmdSpoolDir={d['spool']}{'/%n' if multi else ''}
SlurmctldPidFile={d['run']}/slurmctld.pid
SlurmdPidFile={d['run']}/slurmd{'-%n' if multi else ''}.pid
SlurmctldLogFile={d['log']}/slurmctld.log
SlurmdLogFile={d['log']}/slurmd{'-%n' if multi else ''}.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in a container without systemd: track processes by parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
# No slurmdbd: sacct cannot work, so the profile polls with squeue.
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Consumable cores+memory; with a DefMemPerCPU jobs share the node instead of
# each job taking all memory (and the node) and running one at a time.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU={def_mem}
# squeue-based status polling only sees finished jobs for MinJobAge seconds;
# the slurm executor plugin polls at most every 180 s, so keep this above it.
MinJobAge=300
# A node that went DOWN (e.g. slurmd restarted) comes back as soon as it registers.
ReturnToService=2
# Use the configured CPUs/RealMemory even if slurmd detects a different
# topology (CI machines vary); avoids the node being drained as "inval".
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
Waittime=0
{_node_lines(names, ports, cpus, real_mem)}
PartitionName={PARTITION} Nodes={','.join(names)} Default=YES MaxTime=INFINITE State=UP
"""
    )
    # Not read with proctrack/linuxproc + task/none, but slurmd looks for it in
    # some code paths; an explicit file keeps it from probing the host's cgroups.
    (workdir / "cgroup.conf").write_text("# no cgroup plugins in use\nCgroupAutomount=no\n")
    return conf


# --------------------------------------------------------------------------- #
# the context manager
# --------------------------------------------------------------------------- #
@contextlib.contextmanager
def slurm_cluster(
    workdir: Path,
    *,
    startup_timeout: float = 60.0,
    slurmctld_port: int | None = None,
    slurmd_port: int | None = None,
    nodes: int = 1,
) -> Iterator[SlurmCluster]:
    """Start a Slurm of ``nodes`` nodes in *workdir*; stop everything it started on exit."""
    if not slurm_available():
        raise SlurmClusterError(
            "Slurm/munge binaries not found; run envs/install-slurm.sh (as root)"
        )
    if os.geteuid() != 0:
        raise SlurmClusterError("the test Slurm cluster must be started as root")

    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    marker = uuid.uuid4().hex
    ctld_port = slurmctld_port or _free_port()
    d_port = slurmd_port or _free_port()
    while d_port == ctld_port:
        d_port = _free_port()
    names = (NODE,) if nodes == 1 else tuple(f"n{i + 1}" for i in range(nodes))
    node_ports: list[int] = []
    while len(node_ports) < (nodes if nodes > 1 else 0):
        port = _free_port()
        if port not in (ctld_port, d_port, *node_ports):
            node_ports.append(port)
    cpus = os.cpu_count() or 1
    mem_total = _mem_total_mb()
    # "A little under" the machine: slurmd would drain the node if RealMemory
    # exceeded what it sees, and jobs should not be able to eat the last bits.
    real_mem = max(256, mem_total - max(512, mem_total // 20))
    def_mem = max(100, min(1024, real_mem // cpus))
    conf = _write_conf(workdir, ctld_port, d_port, cpus, real_mem, def_mem, names, tuple(node_ports))
    log = workdir / "log"

    # snakemake-executor-plugin-slurm-jobstep (0.6.1) strips every SLURM_*
    # variable except job ids before it runs `srun ... python -m snakemake`
    # inside the job, SLURM_CONF included; srun then finds no config (no
    # /etc/slurm/slurm.conf here) and dies with "DNS SRV lookup failed".
    # Jobs keep PATH, so wrappers first on PATH put SLURM_CONF back: srun, and the
    # client commands a cell over several nodes reads its allocation with (llmbench.nodes).
    bindir = workdir / "bin"
    bindir.mkdir(exist_ok=True)
    for client in ("srun", "scontrol", "squeue", "scancel"):
        wrapper = bindir / client
        wrapper.write_text(
            "#!/bin/sh\n"
            f"# {client} for the llmbench test cluster: restore SLURM_CONF (see slurm_cluster.py)\n"
            f"SLURM_CONF='{conf}'\nexport SLURM_CONF\n"
            f'exec \'{_which(client)}\' "$@"\n'
        )
        wrapper.chmod(0o755)
    # The marker also goes into .env: sbatch --export=ALL hands it to the jobs,
    # so teardown can find job processes (or a workflow subprocess) of ours
    # that outlive the cluster.
    env = {
        "SLURM_CONF": str(conf),
        MARKER_VAR: marker,
        "PATH": os.pathsep.join([str(bindir), os.environ.get("PATH", "")]),
    }
    # Daemon environment: ours + the conf + the marker (slurmstepd inherits it
    # from slurmd; see _marked_pids).
    daemon_env = {
        **os.environ,
        "SLURM_CONF": str(conf),
        MARKER_VAR: marker,
        "PATH": _SEARCH_PATH,
    }
    # Client commands in here must not see job variables of an outer Slurm job.
    client_env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    client_env["SLURM_CONF"] = str(conf)
    client_env["PATH"] = _SEARCH_PATH

    procs: dict[str, subprocess.Popen] = {}
    logs: list = []
    cluster = SlurmCluster(
        workdir=workdir,
        conf=conf,
        env=env,
        slurmctld_port=ctld_port,
        slurmd_port=d_port,
        cpus=cpus,
        real_memory_mb=real_mem,
        nodes=names,
    )

    def spawn(name: str, argv: list[str], **kw) -> subprocess.Popen:
        out = open(log / f"{name}.stdout", "ab")
        logs.append(out)
        p = subprocess.Popen(
            argv,
            env=daemon_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            # Own session: a Ctrl-C in the terminal reaches only us; teardown
            # then stops the daemons in order.
            start_new_session=True,
            **kw,
        )
        procs[name] = p
        cluster.pids[name] = p.pid
        return p

    def diagnostics(reason: str) -> SlurmClusterError:
        parts = [reason, f"conf: {conf}"]
        for name, p in procs.items():
            parts.append(f"{name}: pid {p.pid}, exit code {p.poll()}")
        daemons = [f"{n}.stdout" for n in procs] + ["slurmctld.log"] + [
            f"slurmd{'' if names == (NODE,) else '-' + n}.log" for n in names]
        for f in daemons:
            if (log / f).exists():
                parts.append(f"--- {f} (tail) ---\n{_tail(log / f)}")
        if "munged" in procs:
            parts.append(f"--- /var/log/munge/munged.log (tail) ---\n{_tail(Path('/var/log/munge/munged.log'))}")
        return SlurmClusterError("\n".join(parts))

    # SIGTERM (a CI timeout, `kill`) would end Python without running the
    # finally below and leave daemons behind: turn it into SystemExit while
    # the cluster lives (main thread only; an existing handler is respected).
    old_term = None
    with contextlib.suppress(ValueError):
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            old_term = signal.signal(signal.SIGTERM, _raise_system_exit)

    t0 = time.monotonic()
    try:
        # ---------------- munged ----------------
        if _munge_works(client_env):
            pass  # someone else's munged: reuse it, never stop it
        else:
            MUNGE_RUN_DIR.mkdir(parents=True, exist_ok=True)
            kw = {}
            # munged insists that the key is owned by the uid it runs as.
            # Debian ships the key owned by "munge": run munged as that user.
            key_uid = MUNGE_KEY.stat().st_uid if MUNGE_KEY.exists() else 0
            if key_uid != os.geteuid():
                pw = pwd.getpwuid(key_uid)
                for dirpath in (MUNGE_RUN_DIR, Path("/var/log/munge"), Path("/var/lib/munge")):
                    dirpath.mkdir(parents=True, exist_ok=True)
                    os.chown(dirpath, pw.pw_uid, pw.pw_gid)
                kw = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            spawn("munged", [_which("munged"), "-F", f"--pid-file={MUNGE_PIDFILE}"], **kw)
            deadline = time.monotonic() + 15
            while not _munge_works(client_env):
                if procs["munged"].poll() is not None or time.monotonic() > deadline:
                    raise diagnostics("munged did not start")
                time.sleep(0.1)

        # ---------------- slurmctld / slurmd ----------------
        for what, port in (("SlurmctldPort", ctld_port), ("SlurmdPort", d_port)):
            if _port_in_use(port):
                raise SlurmClusterError(
                    f"refusing to start: something already listens on {what} {port} "
                    "(another slurmctld/slurmd?); stop it or pass other ports"
                )
        # -D: foreground (we own the pid); -c: clear any old state in workdir
        spawn("slurmctld", [_which("slurmctld"), "-D", "-c", "-f", str(conf)])
        slurmds = ["slurmd"] if names == (NODE,) else [f"slurmd-{n}" for n in names]
        for daemon, name in zip(slurmds, names):
            spawn(daemon, [_which("slurmd"), "-D", "-N", name, "-f", str(conf)])

        deadline = time.monotonic() + startup_timeout
        last = ""
        while True:
            for name in ("slurmctld", *slurmds):
                if procs[name].poll() is not None:
                    raise diagnostics(f"{name} exited during start-up")
            r = subprocess.run(
                [_which("sinfo"), "-h", "-N", "-n", ",".join(names), "-o", "%t"],
                env=client_env, capture_output=True, text=True, timeout=15,
            )
            last = (r.stdout + r.stderr).strip()
            if r.returncode == 0 and r.stdout.split() == ["idle"] * len(names):
                break
            if time.monotonic() > deadline:
                raise diagnostics(
                    f"node(s) {','.join(names)} not idle after {startup_timeout:.0f} s (last sinfo: {last!r})"
                )
            time.sleep(0.2)
        cluster.startup_seconds = time.monotonic() - t0

        yield cluster
    finally:
        try:
            _teardown(procs, client_env, marker)
        finally:
            for f in logs:
                f.close()
            if old_term is not None:
                with contextlib.suppress(ValueError):
                    signal.signal(signal.SIGTERM, old_term)


def _raise_system_exit(signum, frame):  # pragma: no cover - signal path
    raise SystemExit(128 + signum)


def _teardown(procs: dict[str, subprocess.Popen], client_env: dict[str, str], marker: str) -> None:
    """Cancel jobs, stop slurmd, slurmctld, then our munged; kill leftovers of ours.

    Each step is independent, and SIGINT/SIGTERM are ignored while it runs, so
    a second Ctrl-C cannot cut the teardown short.
    """
    old_handler = old_term = None
    with contextlib.suppress(ValueError):  # not in main thread
        old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        old_term = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        ctld = procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                q = subprocess.run(
                    [_which("squeue"), "-h", "-o", "%i"],
                    env=client_env, capture_output=True, text=True, timeout=10,
                )
                ids = q.stdout.split()
                if ids:
                    subprocess.run([_which("scancel"), *ids], env=client_env,
                                   capture_output=True, timeout=10)
                    # Give slurmd a moment to kill the job steps (KillWait=5).
                    deadline = time.monotonic() + 15
                    while time.monotonic() < deadline:
                        q = subprocess.run(
                            [_which("squeue"), "-h", "-t", "PD,R,CG,S", "-o", "%i"],
                            env=client_env, capture_output=True, text=True, timeout=10,
                        )
                        if not q.stdout.strip():
                            break
                        time.sleep(0.3)
        for name in (*(n for n in procs if n.startswith("slurmd")), "slurmctld", "munged"):
            with contextlib.suppress(Exception):
                _stop(procs.get(name))
        # slurmstepd and job processes inherit our marker; anything still
        # alive is ours by construction: kill it by pid.
        deadline = time.monotonic() + 10
        while True:
            left = [p for p in _marked_pids(marker) if alive(p)]
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if time.monotonic() > deadline - 5 else signal.SIGTERM)
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ValueError, TypeError):
            if old_handler is not None:
                signal.signal(signal.SIGINT, old_handler)
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)


def main(argv: list[str] | None = None) -> int:
    """Run one command inside a throw-away cluster (stopped when the command ends), e.g. the
    committed two-node CPU run (results/reference/cpu-2node-slurm-2026-11-25/README.md):

        python tests/e2e/slurm_cluster.py --nodes 2 -- \\
            .venv/bin/snakemake --profile "$PWD/profiles/slurm_ci" \\
            --configfile results/reference/cpu-2node-slurm-2026-11-25/config.yaml
    """
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=main.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1, help="slurmd daemons (n1, n2, ...; 1: 'localhost')")
    ap.add_argument("--workdir", type=Path, default=None, help="the cluster's state and logs (default: a temp folder)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give a command after --")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="llmbench-slurm-"))
    with slurm_cluster(workdir, nodes=args.nodes) as cluster:
        print(f"slurm_cluster: {', '.join(cluster.nodes)} up in {cluster.startup_seconds:.1f} s ({workdir})",
              flush=True)
        # the interpreter's bin first: jobs run python -m snakemake of the same venv
        env = {**os.environ, **cluster.env}
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]])
        return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
