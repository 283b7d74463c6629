"""Cells over several nodes: the Slurm allocation, the srun that starts one torchrun per
node, and that torchrun's c10d rendezvous. Stdlib only (each node runs ``python -m
llmbench.nodes node ...`` before torch is imported).

How a cell of ``nodes: N`` runs (N >= 2; one-node cells never come here):
1. The cell's job is a Slurm job of N nodes, one task per node (workflow/rules/training.smk:
   the slurm executor plugin's ``nodes``, ``tasks`` and ``mpi`` resources; with ``mpi`` the
   plugin runs the job's command in the batch script, on the allocation's first node,
   instead of wrapping it in ``srun -n1``, which would leave no tasks for a second srun).
2. The launcher (llmbench.launch) reads the allocation (``allocation``): its hostnames
   from ``scontrol show hostnames`` of the job's node list, each node's address from
   ``scontrol show node`` (its NodeAddr), and checks that it runs on the first node.
3. It starts ``srun --nodes N --ntasks-per-node 1 --kill-on-bad-exit --label ...
   python -m llmbench.nodes node ...`` (``srun_argv``) in its process group. Each task is
   a node launcher (``node_main``) that runs torchrun behind a leash (llmbench.procs) with
   ``--rdzv-backend c10d --rdzv-endpoint <first node's address>:<port>`` (as torchtitan's
   and Megatron-LM's multi-node Slurm scripts do), ``is_host`` set on the first node only
   (so the store never depends on hostname matching), and ``--local-addr`` its own address.
4. One node's task dying ends the step: srun's ``--kill-on-bad-exit`` kills the other
   tasks (their torchrun stops its ranks); a task that ends without error while others
   run is followed by the rest within ``--wait``. The launcher's timeout and leash stop
   srun (it forwards SIGTERM to every task), and ``cancel_step`` cancels whatever step of
   the cell Slurm still lists.

Every line of the step's output carries its node's task id (srun --label): ``node_tails``
splits a log into each node's tail for the record.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime

from . import procs

#: Variable each node launcher sets to its wall-clock start (time.time()): a rank reads it
#: to report how long torchrun's start-up and the rendezvous took (scenario.Phases).
NODE_T0_VAR = "LLMBENCH_NODE_T0"
#: Seconds srun waits, after the first task ended without error, before it ends the others.
SRUN_WAIT_S = 60
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_SRUN_ERROR = re.compile(r"^srun: error: (\S+): tasks? ([0-9,-]+): (.+)$", re.M)


class NodesError(RuntimeError):
    """A cell over several nodes cannot start here (the message says why)."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """The Slurm allocation a cell's nodes come from."""

    job_id: str
    """SLURM_JOB_ID."""
    hostnames: tuple[str, ...]
    """Its nodes in Slurm's order (the first runs the launcher and hosts the rendezvous)."""
    addresses: dict[str, str]
    """Each node's address (NodeAddr; the hostname where Slurm gives none)."""

    @property
    def host(self) -> str:
        """The first node's address: the rendezvous endpoint's host."""
        return self.addresses[self.hostnames[0]]


def _scontrol(*args: str) -> str:
    exe = shutil.which("scontrol")
    if exe is None:
        raise NodesError("scontrol is not on PATH: a cell over several nodes reads its allocation through it")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise NodesError(f"scontrol {' '.join(args)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def _field(text: str, name: str) -> str | None:
    m = re.search(rf"(?:^|\s){name}=(\S+)", text)
    return m.group(1) if m else None


def job_end(env: dict[str, str] | None = None) -> float | None:
    """When the Slurm job this process runs in ends (its EndTime: the start plus its time
    limit, in this host's local time as scontrol prints it), in Unix seconds; None outside a
    job, for a job without a time limit, or where scontrol cannot say (a job's deadline,
    llmbench.launch, is then none)."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        end = _field(_scontrol("show", "job", "-o", job_id), "EndTime")
        return datetime.fromisoformat(end).timestamp() if end else None
    except (NodesError, OSError, subprocess.SubprocessError, ValueError):  # EndTime=Unknown: no limit
        return None


def allocation(nodes: int, env: dict[str, str] | None = None) -> Allocation:
    """The allocation of the Slurm job this process runs in, checked to hold ``nodes``
    nodes and to have this process on its first node."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise NodesError(f"a cell over {nodes} nodes runs inside a Slurm job of {nodes} nodes (a Slurm "
                         "profile: snakemake --profile slurm_a800 ...); SLURM_JOB_ID is not set here")
    # the jobstep plugin keeps only the job's id in the environment; scontrol knows the rest
    nodelist = env.get("SLURM_JOB_NODELIST") or _field(_scontrol("show", "job", "-o", job_id), "NodeList")
    if not nodelist:
        raise NodesError(f"Slurm job {job_id}: no node list (scontrol show job)")
    hostnames = tuple(_scontrol("show", "hostnames", nodelist).split())
    if len(hostnames) < nodes:
        raise NodesError(f"Slurm job {job_id} holds {len(hostnames)} node(s) ({nodelist}); the cell needs {nodes}")
    hostnames = hostnames[:nodes]
    addresses = {h: _field(_scontrol("show", "node", "-o", h), "NodeAddr") or h for h in hostnames}
    here = env.get("SLURMD_NODENAME")
    if here and here != hostnames[0]:
        raise NodesError(f"the launcher runs on node {here!r}, not on the allocation's first node "
                         f"{hostnames[0]!r} (where the rendezvous is hosted)")
    return Allocation(job_id=job_id, hostnames=hostnames, addresses=addresses)


def step_name(rdzv_id: str) -> str:
    """The Slurm step name of one repeat (cancel_step finds it by it)."""
    return f"llmbench-{rdzv_id}"


def srun_argv(alloc: Allocation, ranks_per_node: int, module: str, args: list[str], *, port: int,
              rdzv_id: str, cpus_per_node: int, join_timeout_s: int,
              python: str = sys.executable) -> list[str]:
    """The srun command that runs ``module`` on ``ranks_per_node`` ranks of every node of
    ``alloc``: one task per node, each a node launcher (``node_main``)."""
    nodes = len(alloc.hostnames)
    return [
        shutil.which("srun") or "srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
        f"--nodelist={','.join(alloc.hostnames)}", f"--cpus-per-task={cpus_per_node}",
        "--kill-on-bad-exit=1", f"--wait={SRUN_WAIT_S}", "--label", f"--job-name={step_name(rdzv_id)}",
        python, "-m", "llmbench.nodes", "node", f"--nnodes={nodes}", f"--nproc-per-node={ranks_per_node}",
        f"--endpoint={alloc.host}:{port}", f"--rdzv-id={rdzv_id}", f"--join-timeout={join_timeout_s}",
        *[f"--addr={h}={a}" for h, a in alloc.addresses.items()], "--", "-m", module, *args,
    ]


def torchrun_argv(opts: argparse.Namespace, node_id: int, node_name: str,
                  python: str = sys.executable) -> list[str]:
    """The torchrun command of one node: c10d rendezvous at the endpoint, hosted by node 0."""
    addrs = dict(a.split("=", 1) for a in opts.addr)
    if node_name not in addrs:
        raise NodesError(f"node {node_name!r} is not among the cell's nodes ({', '.join(addrs)})")
    return [
        python, "-m", "torch.distributed.run", f"--nnodes={opts.nnodes}", f"--nproc-per-node={opts.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={opts.endpoint}", f"--rdzv-id={opts.rdzv_id}",
        f"--rdzv-conf=is_host={'true' if node_id == 0 else 'false'},join_timeout={opts.join_timeout}",
        f"--local-addr={addrs[node_name]}", "--max-restarts=0", *opts.command,
    ]


def node_main(argv: list[str]) -> None:
    """One node's launcher (an srun task): run torchrun for this node behind a leash, and
    end as it ends. Never returns."""
    parser = argparse.ArgumentParser(prog="python -m llmbench.nodes node")
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--rdzv-id", required=True)
    parser.add_argument("--join-timeout", type=int, default=600)
    parser.add_argument("--addr", action="append", default=[], help="NODE=ADDRESS, one per node")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.command[:1] == ["--"]:
        opts.command = opts.command[1:]
    node_id = int(os.environ.get("SLURM_NODEID", "-1"))
    node_name = os.environ.get("SLURMD_NODENAME", "")
    if node_id < 0 or not node_name:
        raise NodesError("llmbench.nodes node runs as an srun task (SLURM_NODEID and SLURMD_NODENAME unset)")
    argv = torchrun_argv(opts, node_id, node_name)
    os.environ[NODE_T0_VAR] = repr(time.time())
    print(f"llmbench.nodes: node {node_id} ({node_name}): {' '.join(argv[1:])}", flush=True)
    # torchrun behind a leash tied to the task's parent (slurmstepd): it dies with this
    # task, and ranks it leaves behind are killed (Slurm's proctrack plugins other than
    # cgroup lose processes that leave their parent)
    procs.leash(os.getppid(), argv)


def node_tails(text: str, hostnames: tuple[str, ...], lines: int = 20) -> str:
    """Each node's last ``lines`` lines of a log written by srun --label, node by node,
    then the lines that carry no node's label (the launcher's own)."""
    per: dict[int, list[str]] = {i: [] for i in range(len(hostnames))}
    own: list[str] = []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m and int(m.group(1)) in per:
            per[int(m.group(1))].append(m.group(2))
        else:
            own.append(line)
    parts = [f"--- node {i} ({hostnames[i]}) ---\n" + ("\n".join(per[i][-lines:]) or "<no output>")
             for i in per]
    return "\n".join(parts + (["--- launcher ---\n" + "\n".join(own[-lines:])] if own else []))


def first_failure(text: str) -> str | None:
    """The first task failure srun reported in a log ("srun: error: n2: task 1: Killed"),
    as "node n2 (task 1): Killed"; None where srun reported none."""
    m = _SRUN_ERROR.search(text)
    return f"node {m.group(1)} (task {m.group(2)}): {m.group(3).strip()}" if m else None


def cancel_step(alloc: Allocation, rdzv_id: str) -> list[str]:
    """Cancel (SIGKILL) the steps of this repeat that Slurm still lists after its srun was
    stopped; returns their ids. A step outlives a killed srun until Slurm notices."""
    squeue, scancel = shutil.which("squeue"), shutil.which("scancel")
    if not (squeue and scancel):
        return []
    listed = subprocess.run([squeue, "-h", "-s", "-j", alloc.job_id, "-o", "%i %j"], capture_output=True,
                            text=True, timeout=60)
    steps = [line.split()[0] for line in listed.stdout.splitlines()
             if len(line.split()) == 2 and line.split()[1] == step_name(rdzv_id)]
    for step in steps:
        subprocess.run([scancel, "--signal=KILL", step], capture_output=True, timeout=60)
    return steps


if __name__ == "__main__":
    if sys.argv[1:2] != ["node"]:
        print("usage: python -m llmbench.nodes node --nnodes N --nproc-per-node G --endpoint HOST:PORT "
              "--rdzv-id ID --addr NODE=ADDR ... -- -m MODULE ARGS", file=sys.stderr)
        sys.exit(2)
    try:
        node_main(sys.argv[2:])
    except NodesError as exc:
        print(f"llmbench.nodes: {exc}", file=sys.stderr)
        sys.exit(1)
