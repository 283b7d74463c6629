"""llmbench.launch: exit -> status, with a stand-in worker (the real one runs in tests/e2e)."""

import os
import time

import psutil
import pytest

from llmbench import grid, launch

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


@pytest.fixture
def spec_for(monkeypatch):
    monkeypatch.setitem(launch.WORKERS, "deepspeed", "fake_worker")
    monkeypatch.setenv("PYTHONPATH", os.path.abspath(FIXTURES))

    def make(mode, repeats=1, timeout_s=60, mem_cap_gib=None, gpus=1, technique="Z3"):
        monkeypatch.setenv("FAKE_MODE", mode)
        g = grid.expand({
            "protocol": {"warmup_steps": 0, "measured_steps": 1, "repeats": repeats, "seq_len": 8, "timeout_s": timeout_s},
            "pretrain": [{"platforms": ["cpu"], "models": ["tiny"], "techniques": [technique], "batch_sizes": [1],
                          "gpus": gpus, "mem_cap_gib": mem_cap_gib}],
        })
        return g.spec(g.cells[0])

    return make


def run(spec, tmp_path):
    return launch.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log")


def test_ok_aggregates_repeats(spec_for, tmp_path):
    rec = run(spec_for("ok", repeats=3), tmp_path)
    assert rec.status == "ok"
    assert rec.metrics.tokens_per_s_runs == (100.0, 100.0, 100.0)
    assert rec.metrics.tokens_per_s_std == 0.0
    assert rec.metrics.mfu is None and "no peak" in rec.metrics.mfu_formula  # cpu platform
    assert rec.provenance["spec"]["cell"]["technique"] == "Z3"
    assert (tmp_path / "record.json").exists()


def test_crash_is_error_with_root_cause(spec_for, tmp_path):
    rec = run(spec_for("crash", repeats=3), tmp_path)
    assert rec.status == "error"
    assert "ValueError: bad things on purpose" in rec.reason
    assert "bad things on purpose" in rec.log_tail
    assert rec.log_tail.count("=== repeat") <= 1  # stopped after the first failed repeat


def test_oom_file_is_oom(spec_for, tmp_path):
    rec = run(spec_for("oomfile"), tmp_path)
    assert rec.status == "oom" and "out of memory" in rec.reason


def test_sigkill_is_oom(spec_for, tmp_path):
    rec = run(spec_for("sigkill"), tmp_path)
    assert rec.status == "oom" and "SIGKILL" in rec.reason


def test_memory_cap_kills_and_records_oom(spec_for, tmp_path):
    rec = run(spec_for("alloc", mem_cap_gib=0.3), tmp_path)
    assert rec.status == "oom"
    assert "mem_cap_gib=0.3" in rec.reason


def test_timeout_stops_the_whole_group(spec_for, tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("FAKE_PIDFILE", str(pidfile))
    rec = run(spec_for("sleep", timeout_s=10, gpus=2), tmp_path)
    assert rec.status == "timeout" and "timeout_s=10" in rec.reason
    pid = int(pidfile.read_text())
    time.sleep(0.5)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_q_cells_have_no_mfu(spec_for, tmp_path):
    spec = spec_for("ok", technique="Q")
    spec["platform"]["peak_bf16_tflops"] = 100.0
    rec = run(spec, tmp_path)
    assert rec.metrics.mfu is None and "4-bit" in rec.metrics.mfu_formula


def test_mfu_formula(spec_for, tmp_path, monkeypatch):
    from llmbench.models import ModelSpec, flops_per_token

    monkeypatch.setenv("FAKE_TPS", "1000")
    spec = spec_for("ok")
    spec["platform"]["peak_bf16_tflops"] = 1.0
    rec = run(spec, tmp_path)
    expected = 1000 * flops_per_token(ModelSpec.load("tiny"), 8) / 1e12
    assert rec.metrics.mfu == pytest.approx(expected)


def test_mean_summary_averages_numbers_and_keeps_the_rest():
    from llmbench.launch import mean_summary

    s = mean_summary([{"comm_s_per_iter": 1.0, "traces": ["a"], "memcpy_s_per_iter": None},
                      {"comm_s_per_iter": 3.0, "traces": ["b"], "memcpy_s_per_iter": None}])
    assert s == {"comm_s_per_iter": 2.0, "traces": ["b"], "memcpy_s_per_iter": None}
    assert mean_summary([{}, {}]) == {}


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
