"""The pipeline through a real single-node Slurm (slurmctld, slurmd, munge on 127.0.0.1)
with the slurm executor plugin and profiles/slurm_ci: cells become Slurm jobs, an OOM
cell is a record, the tables come out; a job's time limit is its cells' deadline. The
cluster is stopped also when the test fails, and nothing of it is left running after.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workspaces import make_workspace, record_mtimes, snakemake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import MARKER_VAR, _marked_pids, slurm_available, slurm_cluster  # noqa: E402

from llmbench.procs import alive  # noqa: E402

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slurm,
    pytest.mark.skipif(not slurm_available(), reason="Slurm/munge not installed (envs/install-slurm.sh)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="starting Slurm daemons needs root"),
]

TABLE_AND_FIGURE = ("results/tables/table3.md", "results/figures/pretrain.svg")
CONFIG = {
    "protocol": {"warmup_steps": 1, "measured_steps": 3, "repeats": 1, "seq_len": 350, "timeout_s": 600},
    "pretrain": [
        # one cell that runs and one that runs out of memory: each is a Slurm job that starts its
        # worker cold (no fork server in a job), so what other methods add here is start-up time;
        # ZeRO-3 through Slurm is tests/e2e/test_slurm_nodes.py's
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [1]},
        {"platforms": ["cpu"], "models": ["tiny"], "techniques": ["Naive"], "batch_sizes": [64], "mem_cap_gib": 1.5},
    ],
}


def test_pipeline_through_slurm(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    (ws / "slurm.yaml").write_text(yaml.safe_dump(CONFIG))
    with slurm_cluster(tmp_path / "slurm") as cluster:
        # the cells, and one table and figure of theirs: tables and figures are local rules, built
        # where snakemake runs (every one of them: the tests' grid in test_workflow.py)
        res = snakemake(ws, "pretrain", *TABLE_AND_FIGURE, "--profile", str(ws / "profiles" / "slurm_ci"),
                        "--configfile", "slurm.yaml", env=cluster.env, timeout=1500)
        logs = sorted((ws / ".snakemake" / "slurm_logs").rglob("*.log"))
        detail = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)
        assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}\n{detail}"
        # a job's time limit is its cells' deadline (llmbench.launch, from scontrol's EndTime):
        # a job of 2 minutes, just started, has at most 120 s left
        code = "import time; from llmbench.launch import deadline_from_env; print(deadline_from_env() - time.time())"
        job = subprocess.run(["srun", "-p", cluster.partition, "--time=2", sys.executable, "-c", code],
                             env={**os.environ, **cluster.env, "PYTHONPATH": str(ws / "workflow" / "scripts")},
                             capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stdout + job.stderr
        assert 60 < float(job.stdout.split()[-1]) <= 121, job.stdout
        marker, pids, conf = cluster.env[MARKER_VAR], dict(cluster.pids), cluster.conf
    # after the context: nothing of this cluster is left running
    assert not {name: pid for name, pid in pids.items() if alive(pid)}, "daemons still running after teardown"
    assert not _processes_using(conf), _processes_using(conf)
    assert not _marked_pids(marker), "processes of the test cluster survived teardown"
    records = {p: json.loads((ws / p).read_text()) for p in record_mtimes(ws)}
    assert len(records) == 2
    statuses = {r["cell"]["technique"] + f"/bs{r['cell']['batch_size']}": r["status"] for r in records.values()}
    assert statuses == {"Naive/bs1": "ok", "Naive/bs64": "oom"}
    # every cell ran inside a Slurm job of the test cluster
    job_ids = {r["provenance"]["host"]["slurm_job_id"] for r in records.values()}
    assert None not in job_ids and len(job_ids) == 2
    # a Slurm job execs its worker: no fork server outlives a job on a node it does not keep
    assert {tuple(r["provenance"]["launchers"]) for r in records.values()} == {("exec",)}
    assert any("run_training_cell" in str(p) for p in logs)
    assert all((ws / target).stat().st_size > 0 for target in TABLE_AND_FIGURE)


def _processes_using(conf: Path) -> list[str]:
    """Live processes whose command line names this cluster's slurm.conf."""
    hits = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(conf) in cmd and alive(int(entry)):
            hits.append(f"{entry}: {cmd}")
    return hits
