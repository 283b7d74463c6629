"""End-to-end: a real single-node Slurm runs a 2-rule workflow via profiles/slurm_ci."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# tests/e2e is not a package; make the sibling module importable under any
# pytest import mode.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_cluster import MARKER_VAR, _marked_pids, slurm_available, slurm_cluster  # noqa: E402

from llmbench.procs import alive  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "slurm_ci"
VENV_BIN = Path(sys.executable).parent  # not resolved: keep the venv's bin dir

SNAKEFILE = textwrap.dedent(
    """\
    localrules: all

    rule all:
        input: "b.txt"

    rule a:
        output: "a.txt"
        shell: "echo $SLURM_JOB_ID > {output}"

    rule b:
        input: "a.txt"
        output: "b.txt"
        shell: "cat {input} > {output}; echo $SLURM_JOB_ID >> {output}"
    """
)


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


@pytest.mark.slurm
@pytest.mark.skipif(
    not slurm_available(),
    reason="Slurm/munge not installed (run envs/install-slurm.sh as root)",
)
@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() != 0, reason="needs root to start Slurm daemons")
def test_workflow_runs_through_real_slurm(tmp_path: Path) -> None:
    snakemake = VENV_BIN / "snakemake"
    assert snakemake.exists(), f"snakemake not found next to {sys.executable}"
    wf = tmp_path / "wf"
    wf.mkdir()
    (wf / "Snakefile").write_text(SNAKEFILE)

    with slurm_cluster(tmp_path / "slurm") as cluster:
        print(f"\ncluster start-up: {cluster.startup_seconds:.1f} s")
        assert cluster.partition == "cpu"
        env = {**os.environ, **cluster.env}
        # Jobs run `<this python> -m snakemake` (sbatch --export=ALL): same venv.
        env["PATH"] = os.pathsep.join([str(VENV_BIN), env.get("PATH", "")])
        t0 = time.monotonic()
        r = subprocess.run(
            [
                str(snakemake),
                "--profile", str(PROFILE),
                "--directory", str(wf),
                "--snakefile", str(wf / "Snakefile"),
            ],
            cwd=wf,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        elapsed = time.monotonic() - t0
        print(f"workflow: {elapsed:.1f} s")
        logs = "\n".join(
            f"--- {p} ---\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted((wf / ".snakemake" / "slurm_logs").rglob("*.log"))
        ) if (wf / ".snakemake" / "slurm_logs").exists() else ""
        assert r.returncode == 0, f"snakemake failed:\n{r.stdout}\n{r.stderr}\n{logs}"

        a = (wf / "a.txt").read_text().split()
        b = (wf / "b.txt").read_text().split()
        assert len(a) == 1 and a[0].isdigit() and int(a[0]) > 0, a
        assert len(b) == 2 and all(x.isdigit() for x in b), b
        assert b[0] == a[0]
        assert b[1] != a[0], "the two rules should have run as two Slurm jobs"

        # a job's time limit is its cells' deadline (llmbench.launch, from scontrol's EndTime):
        # a job of 2 minutes, just started, has at most 120 s left
        code = "import time; from llmbench.launch import deadline_from_env; print(deadline_from_env() - time.time())"
        job = subprocess.run(["srun", "-p", cluster.partition, "--time=2", sys.executable, "-c", code],
                             env={**env, "PYTHONPATH": str(REPO / "workflow" / "scripts")},
                             capture_output=True, text=True, timeout=120)
        assert job.returncode == 0, job.stdout + job.stderr
        assert 60 < float(job.stdout.split()[-1]) <= 121, job.stdout
        marker = cluster.env[MARKER_VAR]
        pids = dict(cluster.pids)
        conf = cluster.conf

    # After the context: nothing of this cluster is left running.
    running = {name: pid for name, pid in pids.items() if alive(pid)}
    assert not running, f"daemons still running after teardown: {running}"
    assert not _processes_using(conf), _processes_using(conf)
    assert not _marked_pids(marker), "processes of the test cluster survived teardown"
