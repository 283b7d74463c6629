"""Cells over several nodes, without a cluster: the block key and its checks, the record path,
the allocation read through scontrol (a fake one on PATH), the srun and torchrun commands,
each node's log tail, and the paper grid's two-node plan in Snakemake's dry run. The real
two-node runs and the fault: tests/e2e/test_slurm_nodes.py."""

from __future__ import annotations

import argparse
import copy
import re
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO
from llmbench import cells, grid, launch, nodes
from llmbench.config import ConfigError

BASE = {
    "protocol": {"warmup_steps": 1, "measured_steps": 2, "repeats": 1, "seq_len": 16, "timeout_s": 60},
    "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Z3"], "batch_sizes": [1], "nodes": 2,
                  "gpus": [2, 4]}],
}


def cfg(stage: str = "pretrain", **block):
    c = copy.deepcopy(BASE)
    c[stage] = c.pop("pretrain") if stage != "pretrain" else c["pretrain"]
    c[stage][0].update(block)
    return c


def test_a_block_over_nodes_gives_cells_whose_path_names_them():
    g = grid.expand(cfg())
    assert [(c.nodes, c.gpus, c.ranks_per_node) for c in g.cells] == [(2, 2, 1), (2, 4, 2)]
    path = g.cells[1].record_path("r")
    assert path == "r/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-n2-g4/record.json"
    parsed = cells.parse(path)
    assert parsed.pattern == cells.NODES_RECORD_PATTERN and parsed.wildcards["nodes"] == "2"
    assert g.find(**parsed.wildcards) == g.cells[1]
    assert g.cells[1].to_dict()["nodes"] == 2 and cells.Cell.from_dict(g.cells[1].to_dict()) == g.cells[1]


def test_a_one_node_cell_keeps_its_path_and_spec():
    one = grid.expand(cfg(nodes=1, gpus=[2])).cells[0]
    assert one.record_path("r") == "r/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-g2/record.json"
    assert "nodes" not in one.to_dict() and "nodes" not in one.key
    # the two patterns never match the same path
    assert cells.parse("r/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-g2/record.json").pattern == cells.RECORD_PATTERN
    assert cells.parse("r/runs/pretrain/cpu/tiny/deepspeed/Z3/bs1-n1-g2/record.json") is None


def test_a_gpu_block_over_nodes_takes_every_gpu_of_each_node_by_default():
    g = grid.expand(cfg(platforms=["a800"], models=["llama2-7b"], gpus=None))
    assert [(c.gpus, c.ranks_per_node) for c in g.cells] == [(16, 8)]


@pytest.mark.parametrize("stage,block,needle", [
    ("pretrain", {"gpus": [3]}, r"pretrain\[0\]\.gpus\[0\]: 3 GPUs do not split evenly over nodes: 2"),
    ("pretrain", {"platforms": ["a800"], "models": ["llama2-7b"], "gpus": [32]},
     r"pretrain\[0\]\.gpus\[0\]: 32 GPUs \(16 on each of 2 nodes\), but platform 'a800' has 8 per node"),
    ("pretrain", {"batch_sizes": None, "max_batch": {"max": 8}}, r"pretrain\[0\]\.max_batch: the max-batch search runs on one node"),
    ("pretrain", {"mem_cap_gib": 2.0}, r"pretrain\[0\]\.mem_cap_gib: .*launcher's node only"),
    ("profile", {"techniques": ["Naive"]}, r"profile\[0\]\.nodes: 2: a profile cell runs on one node"),
    ("pretrain", {"nodes": 0}, r"nodes"),
])
def test_bad_node_settings_name_the_key(stage, block, needle):
    with pytest.raises(ConfigError, match=needle):
        grid.expand(cfg(stage, **block))


def _fake_scontrol(tmp_path: Path, nodelist: str = "n[1-2]") -> dict[str, str]:
    """An scontrol that answers for a job of nodes n1, n2 (addresses 10.0.0.1, 10.0.0.2)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "scontrol"
    script.write_text(f"""#!/bin/sh
case "$1 $2" in
  "show job") echo "JobId=$4 JobName=x NodeList={nodelist} BatchHost=n1" ;;
  "show hostnames") echo n1; echo n2 ;;
  "show node") echo "NodeName=$4 Arch=x86_64 NodeAddr=10.0.0.${{4#n}} NodeHostName=$4" ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac
""")
    script.chmod(0o755)
    return {"PATH": f"{bindir}:/usr/bin:/bin"}


def test_the_allocation_comes_from_scontrol_never_localhost(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _fake_scontrol(tmp_path)["PATH"])
    alloc = nodes.allocation(2, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n1"})
    assert alloc.hostnames == ("n1", "n2") and alloc.addresses == {"n1": "10.0.0.1", "n2": "10.0.0.2"}
    assert alloc.host == "10.0.0.1"
    with pytest.raises(nodes.NodesError, match="SLURM_JOB_ID is not set"):
        nodes.allocation(2, {})
    with pytest.raises(nodes.NodesError, match="holds 2 node.*the cell needs 3"):
        nodes.allocation(3, {"SLURM_JOB_ID": "42"})
    with pytest.raises(nodes.NodesError, match="runs on node 'n2', not on the allocation's first node 'n1'"):
        nodes.allocation(2, {"SLURM_JOB_ID": "42", "SLURMD_NODENAME": "n2"})


def test_a_slurm_jobs_deadline_is_its_end_time_unless_one_is_given(tmp_path, monkeypatch):
    """Inside a Slurm job a cell's deadline (llmbench.launch) is the job's EndTime (start plus
    time limit, local time, as scontrol prints it); LLMBENCH_DEADLINE wins; no job, a job
    without a limit (EndTime=Unknown) or no scontrol: no deadline."""
    from datetime import datetime

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text('#!/bin/sh\n[ "$4" = 7 ] && echo "JobId=7 EndTime=Unknown" && exit 0\n'
                                     'echo "JobId=$4 JobName=x StartTime=2026-11-26T10:00:00 EndTime=2026-11-26T10:30:00 '
                                     'Deadline=N/A"\n')
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    end = datetime(2026, 11, 26, 10, 30).timestamp()  # local time
    assert nodes.job_end({"SLURM_JOB_ID": "42"}) == end
    assert launch.deadline_from_env({"SLURM_JOB_ID": "42"}) == end
    assert launch.deadline_from_env({"SLURM_JOB_ID": "42", "LLMBENCH_DEADLINE": "1000"}) == 1000.0
    assert nodes.job_end({"SLURM_JOB_ID": "7"}) is None and nodes.job_end({}) is None
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol on PATH
    assert nodes.job_end({"SLURM_JOB_ID": "42"}) is None


def test_srun_starts_one_node_launcher_per_node_and_torchrun_meets_on_the_first():
    alloc = nodes.Allocation(job_id="42", hostnames=("n1", "n2"), addresses={"n1": "10.0.0.1", "n2": "10.0.0.2"})
    argv = nodes.srun_argv(alloc, 8, "llmbench.train.deepspeed_worker", ["--spec", "s.json"], port=29400,
                           rdzv_id="42-r0", cpus_per_node=16, join_timeout_s=300, python="py")
    assert argv[0].endswith("srun")
    for flag in ("--nodes=2", "--ntasks-per-node=1", "--nodelist=n1,n2", "--kill-on-bad-exit=1", "--label",
                 "--cpus-per-task=16"):
        assert flag in argv
    head = argv.index("py")
    assert argv[head:head + 4] == ["py", "-m", "llmbench.nodes", "node"]
    assert "--endpoint=10.0.0.1:29400" in argv and argv[-4:] == ["-m", "llmbench.train.deepspeed_worker", "--spec", "s.json"]
    opts = argparse.Namespace(nnodes=2, nproc_per_node=8, endpoint="10.0.0.1:29400", rdzv_id="42-r0",
                              join_timeout=300, addr=["n1=10.0.0.1", "n2=10.0.0.2"],
                              command=["-m", "llmbench.train.deepspeed_worker"])
    first, second = nodes.torchrun_argv(opts, 0, "n1", "py"), nodes.torchrun_argv(opts, 1, "n2", "py")
    assert "--rdzv-backend=c10d" in first and "--rdzv-endpoint=10.0.0.1:29400" in second
    assert "--rdzv-conf=is_host=true,join_timeout=300" in first
    assert "--rdzv-conf=is_host=false,join_timeout=300" in second
    assert "--local-addr=10.0.0.2" in second and "--nproc-per-node=8" in second
    with pytest.raises(nodes.NodesError, match="'n3' is not among the cell's nodes"):
        nodes.torchrun_argv(opts, 2, "n3", "py")


def test_each_nodes_tail_and_the_first_failure_come_out_of_a_labelled_log():
    log = "\n".join(["=== srun ...", "0: llmbench.nodes: node 0 (n1)", "1: llmbench.nodes: node 1 (n2)",
                     *[f"0: step {i}" for i in range(30)], "1: Traceback", "1: RuntimeError: boom",
                     "srun: error: n2: task 1: Exited with exit code 1",
                     "srun: error: n1: task 0: Killed"])
    tails = nodes.node_tails(log, ("n1", "n2"), lines=5)
    node0, rest = tails.split("--- node 1 (n2) ---")
    assert "step 29" in node0 and "step 24" not in node0 and "RuntimeError" not in node0
    assert "RuntimeError: boom" in rest.split("--- launcher ---")[0]
    assert "srun: error: n2" in rest.split("--- launcher ---")[1]
    assert nodes.first_failure(log) == "node n2 (task 1): Exited with exit code 1"
    assert nodes.first_failure("0: all fine") is None


def test_a_cell_over_nodes_outside_slurm_runs_nothing_and_writes_no_record(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    g = grid.expand(cfg())
    record = tmp_path / "record.json"
    with pytest.raises(nodes.NodesError, match="runs inside a Slurm job of 2 nodes"):
        launch.run_cell(g.spec(g.cells[0]), record, tmp_path / "cell.log")
    assert not record.exists()


def test_the_paper_grid_plans_its_two_node_cells_as_slurm_jobs_of_two_nodes():
    """Table III's llama2-70b rows and Fig. 4's 16-GPU point over 2 nodes of 8 A800s, in
    Snakemake's dry run: a job of the multi-node rule each, with the plugin's node, task and
    mpi resources (workflow/rules/training.smk)."""
    out = subprocess.run([BIN / "snakemake", "pretrain", "-n", "--nolock", "--cores", "2", "-d", str(REPO),
                          "--configfile", "config/paper.yaml", "--config", "only_platforms=[a800]"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    jobs = [j for j in re.split(r"\n(?=rule |localrule )", out) if j.startswith("rule run_multinode_training_cell")]
    outputs = {re.search(r"output: (\S+)", j).group(1) for j in jobs}
    assert len(outputs) == 22 + 1
    assert "results/runs/pretrain/a800/llama2-70b/deepspeed/F+R+Z3+O/bs1-n2-g16/record.json" in outputs
    assert "results/runs/pretrain/a800/llama2-7b/deepspeed/Q/bs2-n2-g16/record.json" in outputs
    for job in jobs:
        resources = re.search(r"resources: (.*)", job).group(1)
        for want in ("nodes=2", "tasks=2", "mpi=srun", "tasks_per_gpu=0", "gres=gpu:8"):
            assert want in resources, (want, resources)
