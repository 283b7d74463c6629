"""llmbench.launch without processes: summaries, thread shares, the launch command. Its
cells through real processes: tests/integration/test_launch_cells.py."""

import os
import subprocess
import sys
from pathlib import Path

from llmbench import launch


def test_mean_summary_averages_numbers_and_keeps_the_rest():
    from llmbench.aggregate import mean_summary

    s = mean_summary([{"comm_s_per_iter": 1.0, "traces": ["a"], "memcpy_s_per_iter": None},
                      {"comm_s_per_iter": 3.0, "traces": ["b"], "memcpy_s_per_iter": None}])
    # the kernel breakdown of each repeat is kept beside the mean (a comparison's spread)
    assert s == {"comm_s_per_iter": 2.0, "traces": ["b"], "memcpy_s_per_iter": None,
                 "kernel_runs": {"comm_s_per_iter": [1.0, 3.0]}}
    assert mean_summary([{"comm_s_per_iter": 1.0}]) == {"comm_s_per_iter": 1.0}  # one repeat: no runs
    assert mean_summary([{}, {}]) == {}


def test_each_repeats_step_times_are_kept_as_samples_and_give_the_spread_within_a_repeat():
    import pytest

    from llmbench.aggregate import step_samples
    from llmbench.record import Record
    from llmbench.report.tidy import _cv_in_repeat

    s = step_samples([{"step_times_s": [1.0, 1.0, 1.0]}, {"step_times_s": [1.0, 2.0, 3.0]}])
    assert s == {"repeat": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
                 "step_time_s": [1.0, 1.0, 1.0, 1.0, 2.0, 3.0]}
    assert Record.from_dict(Record(cell={}, status="ok", samples=s).to_dict()).samples == s  # survives the file
    assert _cv_in_repeat(s) == pytest.approx(0.5 * (0.0 + 1.0 / 2.0))  # the median of 0 and 0.5
    assert step_samples([{"step_times_s": [1.0]}, {}]) == {} and _cv_in_repeat({}) is None
    assert _cv_in_repeat(step_samples([{"step_times_s": [2.0]}])) is None  # one step: no spread


def test_the_drift_within_a_repeat_says_whether_its_steps_still_sped_up():
    import pytest

    from llmbench.aggregate import step_samples
    from llmbench.report.tidy import _drift_in_repeat

    # a repeat whose first third ran at 1.5 s a step and its last at 1.0 (still warming up),
    # a steady one, and one still warming up less: the median of 0.5, 0 and 0.2
    s = step_samples([{"step_times_s": [1.5, 1.5, 1.2, 1.0, 1.0, 1.0]}, {"step_times_s": [1.0] * 6},
                      {"step_times_s": [1.2, 1.1, 1.0]}])
    assert _drift_in_repeat(s) == pytest.approx(0.2)
    assert _drift_in_repeat(step_samples([{"step_times_s": [1.0, 2.0]}])) is None  # fewer than three steps
    assert _drift_in_repeat({}) is None


def test_each_rank_gets_its_share_of_the_jobs_threads(monkeypatch):
    """Snakemake exports the job's thread count; a 2-rank cell of 2 threads must run each
    rank with 1 (with 2 each it oversubscribed the cores and measured 24% scaling)."""
    from llmbench.launch import THREAD_VARS, worker_env

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    env = worker_env({}, threads=2, ranks=2)
    assert all(env[v] == "1" for v in THREAD_VARS)
    assert worker_env({}, threads=16, ranks=4)["OMP_NUM_THREADS"] == "4"
    assert worker_env({"OMP_NUM_THREADS": "3"}, threads=2, ranks=2)["OMP_NUM_THREADS"] == "3"  # the platform's wins


def test_one_rank_runs_without_torchrun_with_the_env_torchrun_gives(tmp_path):
    argv, env = launch.rank_launch(1, "llmbench.train.deepspeed_worker",
                                   launch.worker_args(tmp_path / "s.json", tmp_path / "o.json"))
    assert argv[1:3] == ["-m", "llmbench.train.deepspeed_worker"] and "torch.distributed.run" not in argv
    assert env["RANK"] == env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
    argv, env = launch.rank_launch(2, "m", launch.worker_args(tmp_path / "s.json", tmp_path / "o.json", "--trace-dir", "t"))
    assert argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=2" in argv and env == {}
    assert argv[-2:] == ["--trace-dir", "t"]


def test_the_kernels_oom_kill_count_is_read_from_vmstat(tmp_path):
    from llmbench import procs

    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 12\noom_kill 3\nnr_free_pages 9\n")
    assert procs.oom_kills(str(vmstat)) == 3
    vmstat.write_text("pgfault 12\n")  # a kernel before 4.13 does not count
    assert procs.oom_kills(str(vmstat)) is None
    assert procs.oom_kills(str(tmp_path / "absent")) is None
    assert isinstance(procs.oom_kills(), int)  # this machine's kernel counts them


def test_a_fork_servers_idle_time_comes_from_the_environment():
    """LLMBENCH_FORK_SERVER_IDLE_S sets how long a new fork server waits for work (60 s
    unset); the test session sets it for its own servers (tests/conftest.py)."""
    code = "from llmbench import forkserver; print(forkserver.IDLE_S)"
    scripts = str(Path(launch.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k != "LLMBENCH_FORK_SERVER_IDLE_S"} | {"PYTHONPATH": scripts}
    out = [subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True).stdout
           for e in (env, {**env, "LLMBENCH_FORK_SERVER_IDLE_S": "900"})]
    assert [float(x) for x in out] == [60.0, 900.0]
