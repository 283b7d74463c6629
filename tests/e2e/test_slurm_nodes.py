"""Cells over two nodes, through a real two-node Slurm on this machine (tests/e2e/slurm_cluster.py:
slurmd n1 at 127.0.0.2 and n2 at 127.0.0.3) with the slurm executor plugin and profiles/slurm_ci:
each cell is one Slurm job of two nodes; its launcher starts one torchrun per node with srun,
and the ranks meet in a c10d rendezvous on n1's address (llmbench.nodes). ZeRO-3 and Megatron-LM
data parallelism, 2 nodes x 2 ranks and 2 nodes x 1 rank, gloo. Then the fault: one node's task
is killed while the cell runs; the other node's ranks end, the record says error with both
nodes' log tails, and no process of the cell is left. The cluster is stopped also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from workspaces import BIN, make_workspace, snakemake_env

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import slurm_available, slurm_cluster  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_available(), reason="Slurm/munge not installed (envs/install-slurm.sh)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting Slurm daemons needs root"),
]

R = "nodes-results"
PROTOCOL = {"warmup_steps": 1, "measured_steps": 3, "repeats": 1, "seq_len": 128, "timeout_s": 300}
CONFIG = {
    "results_dir": R,
    "protocol": PROTOCOL,
    "pretrain": [
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1], "nodes": 2,
         "gpus": [4]},
        {"backend": "megatron", "platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"],
         "batch_sizes": [1], "nodes": 2, "gpus": [2]},
    ],
}
#: each backend over two nodes, and each layout once (ranks a node): four ranks of ZeRO-3 over
#: two nodes, Megatron-LM's data parallel with one rank on each (2 x 2 cells would double the
#: time on a 2-core machine and test nothing new)
CELLS = {"deepspeed/Z3/bs1-n2-g4": 2, "megatron-tp1pp1/Naive/bs1-n2-g2": 1}
#: the fault's cell: long enough to be killed while it steps, far inside its timeout
FAULT = {
    "results_dir": R,
    "protocol": {**PROTOCOL, "measured_steps": 100000, "timeout_s": 240},
    "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1], "nodes": 2,
                  "gpus": [2]}],
}
FAULT_RECORD = f"{R}/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-n2-g2/record.json"


def _record(ws: Path, cell: str) -> dict:
    return json.loads((ws / R / "runs" / "pretrain" / "cpu" / "tiny" / cell / "record.json").read_text())


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _cell_processes(marker: str) -> dict[int, str]:
    """Processes of a cell's step on this machine (node launchers, torchrun, ranks) that carry
    the cluster's marker: pid -> the node (SLURMD_NODENAME) it runs on."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            env = _environ(int(entry))
            cmd = _cmdline(int(entry))
            if env.get("LLMBENCH_SLURM_CLUSTER") == marker and ("llmbench." in cmd or "torch.distributed.run" in cmd) \
                    and "snakemake" not in cmd and env.get("SLURMD_NODENAME"):
                out[int(entry)] = env["SLURMD_NODENAME"]
    return out


def _snakemake(ws: Path, cluster, config: str, *targets: str) -> subprocess.Popen:
    """snakemake through the cluster, in the background (the fault test kills a task meanwhile)."""
    return subprocess.Popen([str(BIN / "snakemake"), *targets, "--profile", str(ws / "profiles" / "slurm_ci"),
                             "--configfile", config], cwd=ws, env=snakemake_env(cluster.env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_cluster(tmp_path_factory.mktemp("slurm2"), nodes=2) as c:
        yield c


def test_two_node_cells_run_zero3_and_megatron_over_a_c10d_rendezvous(cluster, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    (ws / "nodes.yaml").write_text(yaml.safe_dump(CONFIG))
    targets = [f"{R}/runs/pretrain/cpu/tiny/{c}/record.json" for c in CELLS]
    run = _snakemake(ws, cluster, "nodes.yaml", *targets)
    out, _ = run.communicate(timeout=1500)
    logs = sorted((ws / ".snakemake" / "slurm_logs").rglob("*.log"))
    detail = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2500:]}" for p in logs)
    assert run.returncode == 0, f"{out[-4000:]}\n{detail}"
    for cell, per_node in CELLS.items():
        rec = _record(ws, cell)
        assert rec["status"] == "ok", (cell, rec["reason"], rec.get("log_tail"))
        assert rec["cell"]["nodes"] == 2 and rec["cell"]["gpus"] == 2 * per_node
        prov = rec["provenance"]
        assert prov["nodes"] == ["n1", "n2"] and prov["launchers"] == ["srun"]
        assert prov["host"]["slurm_job_id"]
        # both nodes' torchrun started, each with its own address, the endpoint on n1's
        log = (ws / R / "logs" / "pretrain" / "cpu" / "tiny" / f"{cell}.log").read_text()
        assert "0: llmbench.nodes: node 0 (n1)" in log and "1: llmbench.nodes: node 1 (n2)" in log
        assert "--rdzv-endpoint=127.0.0.2:" in log and "--local-addr=127.0.0.3" in log
        assert "is_host=true" in log and "is_host=false" in log
        # the ranks of every node took part: tokens over all of them, the rendezvous timed
        metrics = rec["metrics"]
        assert metrics["global_batch_tokens"] == 1 * PROTOCOL["seq_len"] * (2 * per_node)
        assert metrics["tokens_per_s_mean"] > 0 and rec["summary"]["phase_rendezvous_s"] > 0
    # the work folders on the shared file system are gone
    assert not list((ws / R / "runs").rglob(".llmbench-cell-*"))


def test_a_killed_node_task_ends_the_cell_as_an_error_with_both_nodes_tails(cluster, tmp_path):
    ws = make_workspace(tmp_path / "ws")
    (ws / "fault.yaml").write_text(yaml.safe_dump(FAULT))
    marker = cluster.env["LLMBENCH_SLURM_CLUSTER"]
    run = _snakemake(ws, cluster, "fault.yaml", FAULT_RECORD)
    try:
        # wait until both nodes' ranks are stepping (the log has their steps' warnings or
        # the deadline passes), then kill n2's task: its node launcher
        deadline = time.monotonic() + 180
        victim = None
        while time.monotonic() < deadline and run.poll() is None:
            found = _cell_processes(marker)
            ranks = [p for p in found if "deepspeed_worker" in _cmdline(p)]
            if len({found[p] for p in ranks}) == 2:
                time.sleep(8)  # past the rendezvous and the build: in the timed loop
                victim = next(p for p, node in found.items()
                              if node == "n2" and "llmbench.nodes node" in _cmdline(p))
                break
            time.sleep(0.5)
        assert victim is not None, "the cell's ranks never ran on both nodes"
        killed_at = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        out, _ = run.communicate(timeout=PROTOCOL["timeout_s"])
        ended_s = time.monotonic() - killed_at
        print(f"two-node fault: snakemake ended {ended_s:.1f} s after n2's task was killed")  # pytest -s shows it
    finally:
        if run.poll() is None:
            run.kill()
    rec = json.loads((ws / FAULT_RECORD).read_text())
    assert rec["status"] == "error", (rec["status"], rec["reason"])
    # well inside the cell's timeout (240 s): the other node's ranks were stopped, not waited out
    assert ended_s < FAULT["protocol"]["timeout_s"] / 2, ended_s
    assert "--- node 0 (n1) ---" in rec["log_tail"] and "--- node 1 (n2) ---" in rec["log_tail"]
    assert rec["provenance"]["nodes"] == ["n1", "n2"]
    # nothing of the cell is left on either node
    deadline = time.monotonic() + 15
    while _cell_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _cell_processes(marker) == {}
