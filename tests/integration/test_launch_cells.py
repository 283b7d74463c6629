"""llmbench.launch through real processes: a stand-in worker (tests/fixtures/fake_worker.py)
run by the launcher as a cell's repeats (forked from the CPU platform's fork server), its
exit classified as ok | error | oom | timeout, the whole group stopped."""

import json
import os
from dataclasses import replace
import time
from types import SimpleNamespace

import psutil
import pytest

from llmbench import backends, grid, launch, ledger
from llmbench.report import tidy

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures")


@pytest.fixture
def spec_for(monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "deepspeed", replace(backends.BACKENDS["deepspeed"], worker="fake_worker"))
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


@pytest.fixture
def clock(monkeypatch):
    """A clock of the test's for a repeat's seconds and the deadline's: ``clock[0]`` is now
    (Unix seconds), which a stand-in repeat advances."""
    now = [1000.0]
    fake_time = SimpleNamespace(time=lambda: now[0], monotonic=lambda: now[0])
    monkeypatch.setattr(launch, "time", fake_time)  # a repeat's seconds
    monkeypatch.setattr(ledger, "time", fake_time)  # the deadline's clock
    return now


def run(spec, tmp_path):
    return launch.run_cell(spec, tmp_path / "record.json", tmp_path / "run.log")


def repeats_taking(seconds, monkeypatch, clock) -> list[int]:
    """Each repeat runs for real and takes ``seconds`` of the test's clock; returns the list
    of the repeats' indices as they run."""
    real, ran = launch.run_repeat, []

    def taking(spec, workdir, index, *args):
        ran.append(index)
        outcome = real(spec, workdir, index, *args)
        clock[0] += seconds
        return outcome

    monkeypatch.setattr(launch, "run_repeat", taking)
    return ran


def test_ok_aggregates_repeats(spec_for, tmp_path):
    rec = run(spec_for("ok", repeats=3), tmp_path)
    assert rec.status == "ok"
    assert rec.metrics.tokens_per_s_runs == (100.0, 100.0, 100.0)
    assert rec.metrics.tokens_per_s_std == 0.0
    assert rec.metrics.mfu is None and "no peak" in rec.metrics.mfu_formula  # cpu platform
    assert rec.provenance["spec"]["cell"]["technique"] == "Z3"
    assert (tmp_path / "record.json").exists()
    # a cell alone is no paired set, but says where and when each repeat ran as a set's do
    assert "paired_set" not in rec.provenance and len(rec.provenance["repeat_started"]) == 3
    assert rec.provenance["repeat_started"] == sorted(rec.provenance["repeat_started"])
    machine = rec.provenance["machine"]
    assert machine["boot_id"] == launch.provenance.boot_id() and machine["gpu_uuids"] == []


def test_crash_is_error_with_root_cause(spec_for, tmp_path):
    rec = run(spec_for("crash", repeats=3), tmp_path)
    assert rec.status == "error"
    assert "ValueError: bad things on purpose" in rec.reason
    assert "bad things on purpose" in rec.log_tail
    assert rec.log_tail.count("=== repeat") <= 1  # stopped after the first failed repeat


@pytest.mark.parametrize("error, status", [
    # the autograd thread's cuBLAS handle found no GPU memory (one H100, 7B L+F at batch 23)
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", "oom"),
    ("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`", "error"),
])
def test_a_worker_dying_of_a_device_librarys_failed_allocation_is_oom(spec_for, tmp_path, monkeypatch, error, status):
    """The launcher reads the dead worker's log (llmbench.procs.OOM_MARKERS), not its exception."""
    monkeypatch.setenv("FAKE_ERROR", error)
    rec = run(spec_for("raise"), tmp_path)
    assert rec.status == status and error in rec.log_tail


def test_oom_file_is_oom(spec_for, tmp_path):
    rec = run(spec_for("oomfile"), tmp_path)
    assert rec.status == "oom" and "out of memory" in rec.reason


def test_sigkill_while_the_kernels_oom_killer_ran_is_oom(spec_for, tmp_path, monkeypatch):
    counts = iter([7, 8])  # /proc/vmstat oom_kill before the repeat, and after it
    monkeypatch.setattr(launch, "oom_kills", lambda: next(counts))
    rec = run(spec_for("sigkill"), tmp_path)
    assert rec.status == "oom" and "host out of memory" in rec.reason and "oom_kill 7 -> 8" in rec.reason


def test_sigkill_without_the_kernels_oom_killer_is_an_error(spec_for, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "oom_kills", lambda: 7)
    rec = run(spec_for("sigkill"), tmp_path)
    assert rec.status == "error" and "SIGKILL, not by the kernel's OOM killer" in rec.reason


def test_sigkill_where_the_kill_count_cannot_be_read_is_taken_for_the_oom_killer(spec_for, tmp_path, monkeypatch):
    monkeypatch.setattr(launch, "oom_kills", lambda: None)
    rec = run(spec_for("sigkill"), tmp_path)
    assert rec.status == "oom" and "could not be read" in rec.reason


def test_memory_cap_kills_and_records_oom(spec_for, tmp_path):
    # a cap above what a repeat's leader shares with the fork server (about 0.3 GiB of RSS,
    # torch and DeepSpeed imported): only the rank's own allocations can pass it
    rec = run(spec_for("alloc", mem_cap_gib=1.0), tmp_path)
    assert rec.status == "oom", f"{rec.status}: {rec.reason}\n{(tmp_path / 'run.log').read_text()[-3000:]}"
    assert "mem_cap_gib=1" in rec.reason


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


def test_a_cell_stopped_between_repeats_resumes_with_the_repeats_it_has(spec_for, tmp_path, monkeypatch):
    spec = spec_for("ok", repeats=3)
    real, ran = launch.run_repeat, []

    def stopped_at_the_third(spec, workdir, index, *args):
        if index == 2:
            raise KeyboardInterrupt("the call's deadline")  # as when the job is stopped mid-cell
        ran.append(index)
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", stopped_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        run(spec, tmp_path)
    assert not (tmp_path / "record.json").exists() and ran == [0, 1]
    assert sorted(p.name for p in tmp_path.glob(".repeat-*.json")) == [".repeat-0.json", ".repeat-1.json"]

    def counted(spec, workdir, index, *args):
        ran.append(index)
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", counted)
    monkeypatch.setenv("FAKE_TPS", "200")  # the new repeat is told apart from the kept ones
    rec = run(spec, tmp_path)
    assert ran == [0, 1, 2] and rec.status == "ok"
    assert rec.metrics.tokens_per_s_runs == (100.0, 100.0, 200.0)
    assert len(rec.provenance["repeat_started"]) == 3 and all(rec.provenance["repeat_started"])  # the kept ones' too
    assert [r["index"] for r in rec.provenance["resumed_repeats"]] == [0, 1]
    assert all(r["finished"] and r["hostname"] for r in rec.provenance["resumed_repeats"])
    assert {r["boot_id"] for r in rec.provenance["resumed_repeats"]} == {launch.provenance.host()["boot_id"]}
    assert "=== resuming: repeat(s) [0, 1]" in (tmp_path / "run.log").read_text()
    assert "another machine" not in (tmp_path / "run.log").read_text()
    assert not list(tmp_path.glob(".repeat-*.json"))  # the record holds them now


def test_a_repeat_kept_on_another_machine_counts_and_the_log_says_so(spec_for, tmp_path, monkeypatch):
    spec, real = spec_for("ok", repeats=2), launch.run_repeat

    def stopped_at_the_second(spec, workdir, index, *args):
        if index == 1:
            raise KeyboardInterrupt("the call's deadline")
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        run(spec, tmp_path)
    kept = tmp_path / ".repeat-0.json"
    kept.write_text(kept.read_text().replace(launch.provenance.host()["boot_id"], "another-boot"))
    monkeypatch.setattr(launch, "run_repeat", real)
    rec = run(spec, tmp_path)
    assert rec.status == "ok" and len(rec.metrics.tokens_per_s_runs) == 2
    assert rec.provenance["resumed_repeats"][0]["boot_id"] == "another-boot"
    assert "repeat(s) [0] ran on another machine or boot" in (tmp_path / "run.log").read_text()
    here = launch.provenance.host()["boot_id"]  # the tidy table names each repeat's machine
    assert tidy.repeat_machines(rec) == f"another-boot;{here}"
    assert tidy.machine_of(rec, "r") == "+".join(sorted(["another-boot", here]))


def test_kept_repeats_of_another_spec_do_not_count(spec_for, tmp_path, monkeypatch):
    first = spec_for("ok", repeats=3)
    ledger.keep_repeat(tmp_path, 0, first, launch.Outcome(status="ok", result={"tokens_per_s": 1.0}))
    changed = spec_for("ok", repeats=3, timeout_s=61)  # another protocol: another cell run
    rec = run(changed, tmp_path)
    assert rec.metrics.tokens_per_s_runs == (100.0, 100.0, 100.0) and "resumed_repeats" not in rec.provenance
    assert not list(tmp_path.glob(".repeat-*.json"))


def test_a_cell_stops_before_a_repeat_its_deadline_cannot_hold_and_resumes_there(spec_for, tmp_path, monkeypatch, clock):
    """LLMBENCH_DEADLINE (a call's end): repeats of 100 s (a clock of the test's), a deadline
    250 s away. Repeats 0 and 1 start (150 s left > 1.2 x 100), repeat 2 does not (50 s):
    the cell stops between repeats with its two kept, not inside the third. The next run's
    deadline is judged by the kept repeats' time; with room, it runs only repeat 2."""

    spec = spec_for("ok", repeats=3)
    ran = repeats_taking(100.0, monkeypatch, clock)
    monkeypatch.setenv("LLMBENCH_DEADLINE", "1250")
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before repeat 2 \(of 0-2\) at the deadline: 50 s left, "
                                                   r"the longest after its job's first so far took 100 s .*repeat\(s\) \[0, 1\] kept"):
        run(spec, tmp_path)
    assert ran == [0, 1] and not (tmp_path / "record.json").exists()
    assert [json.loads((tmp_path / f".repeat-{i}.json").read_text())["wall_s"] for i in (0, 1)] == [100.0, 100.0]
    assert "=== stopped before repeat 2" in (tmp_path / "run.log").read_text()

    ran.clear()  # a fresh run with 110 s left: the kept repeats say a repeat takes 100 s
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 110))
    with pytest.raises(ledger.DeadlineStop, match="stopped before repeat 2"):
        run(spec, tmp_path)
    assert ran == []
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 121))
    rec = run(spec, tmp_path)
    assert ran == [2] and rec.status == "ok" and len(rec.metrics.tokens_per_s_runs) == 3
    assert [r["index"] for r in rec.provenance["resumed_repeats"]] == [0, 1]


def test_a_repeat_after_its_jobs_first_is_judged_by_the_later_ones(spec_for, tmp_path, monkeypatch, clock):
    """A job's first repeat of a cell takes 200 s of the test's clock (it pays the job's
    start-up), later ones 150 s. With 200 s left after two, the third starts: it is judged
    by the later repeat (1.2 x 150), not by the first (1.2 x 200). The kept repeats say
    which was their job's first, and a fresh job's first repeat is judged by the longest of
    all again."""

    spec = spec_for("ok", repeats=3)
    real, ran = launch.run_repeat, []

    def first_200_s_then_150_s(spec, workdir, index, *args):
        outcome = real(spec, workdir, index, *args)
        clock[0] += 200.0 if ran[-1] == "job" else 150.0
        ran.append(index)
        return outcome

    monkeypatch.setattr(launch, "run_repeat", first_200_s_then_150_s)
    ran.append("job")
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 550))  # 350 s left before repeat 1, 200 before 2
    rec = run(spec, tmp_path)
    assert ran == ["job", 0, 1, 2] and rec.status == "ok"

    (tmp_path / "record.json").unlink()
    ran.append("job")
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 500))  # 150 s left before repeat 2: under 1.2 x 150
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before repeat 2 \(of 0-2\) at the deadline: 150 s left, "
                                                   r"the longest after its job's first so far took 150 s"):
        run(spec, tmp_path)
    assert [json.loads((tmp_path / f".repeat-{i}.json").read_text())["job_first"] for i in (0, 1)] == [True, False]

    ran.append("job")  # a fresh job: its first repeat is judged by the longest of all (the kept first)
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 230))
    with pytest.raises(ledger.DeadlineStop, match=r"230 s left, the longest so far took 200 s"):
        run(spec, tmp_path)
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 241))
    rec = run(spec, tmp_path)
    assert ran[-2:] == ["job", 2] and rec.status == "ok" and len(rec.metrics.tokens_per_s_runs) == 3


def test_a_cell_its_caller_timed_is_judged_by_that_time_not_by_its_prediction(spec_for, tmp_path, monkeypatch, clock):
    """A cell no repeat has timed, predicted at 100 s a repeat (x 1.5: 150 s), 130 s before
    its deadline, stops at once; given LLMBENCH_REPEAT_S=100 (envs/offline-batch.sh's
    estimate from a probe or an earlier record of the cell) it wants 1.2 x 100 s, so its
    first repeat runs; its own repeat then judges the next. A value that is no positive
    number of seconds fails before anything runs, naming the variable."""
    from llmbench import estimate

    spec = spec_for("ok", repeats=2, timeout_s=600)  # the timeout caps what a repeat needs: not here
    ran = repeats_taking(100.0, monkeypatch, clock)
    real_estimate = estimate.repeat
    monkeypatch.setattr(estimate, "repeat", lambda cell, model, root=None:
                        replace(real_estimate(cell, model), predicted_s=100.0, note="fixture"))
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 130))
    with pytest.raises(ledger.DeadlineStop, match=r"130 s left, none timed yet, it is predicted to need 150 s"):
        run(spec, tmp_path)
    assert ran == []
    monkeypatch.setenv("LLMBENCH_REPEAT_S", "100")
    with pytest.raises(ledger.DeadlineStop, match=r"before repeat 1 \(of 0-1\) at the deadline: 30 s left, the "
                                                   r"longest so far took 100 s"):
        run(spec, tmp_path)
    assert ran == [0]
    log = (tmp_path / "run.log").read_text()
    assert "a repeat was timed at 100 s by the job's caller (LLMBENCH_REPEAT_S" in log
    assert "it starts only with 120 s left (x 1.2)" in log
    for bad in ("soon", "0", "-5", "nan"):
        monkeypatch.setenv("LLMBENCH_REPEAT_S", bad)
        with pytest.raises(ValueError, match=f"LLMBENCH_REPEAT_S='{bad}': not a positive number of seconds"):
            run(spec, tmp_path)
    assert ran == [0]


def test_a_repeat_stopped_inside_counts_as_a_repeats_time_at_the_next_deadline(spec_for, tmp_path, monkeypatch, clock):
    """A repeat stopped unfinished by a signal (the TERM of a call's end that the estimate
    missed) after 100 s of the test's clock leaves that time beside the record: the next
    run with 110 s left does not start it again (1.2 x 100 > 110), one with 121 s does; the
    record, once written, holds the cell and the note goes. A note of another spec is
    dropped."""

    spec = spec_for("ok", repeats=1)
    real, ran = launch.run_repeat, []

    def stopped_after_100_s(spec, workdir, index, *args):
        clock[0] += 100.0
        raise SystemExit(143)  # procs' handler of the deadline's SIGTERM exits so

    monkeypatch.setattr(launch, "run_repeat", stopped_after_100_s)
    with pytest.raises(SystemExit):
        run(spec, tmp_path)
    note = json.loads((tmp_path / ledger.STOPPED).read_text())
    assert (note["index"], note["ran_s"], note["steps"]) == (0, 100.0, 1) and not (tmp_path / "record.json").exists()

    def counted(spec, workdir, index, *args):
        ran.append(index)
        return real(spec, workdir, index, *args)

    monkeypatch.setattr(launch, "run_repeat", counted)
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 110))
    with pytest.raises(ledger.DeadlineStop, match=r"stopped before repeat 0 \(of 0-0\) at the deadline: 110 s left, "
                                                   r"the longest so far took 100 s"):
        run(spec, tmp_path)
    assert ran == [] and "repeat 0 of an earlier run was stopped unfinished after 100 s" in \
        (tmp_path / "run.log").read_text()
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 121))
    assert run(spec, tmp_path).status == "ok" and ran == [0]
    assert not (tmp_path / ledger.STOPPED).exists()

    ledger.keep_stopped(tmp_path, 0, spec_for("ok", repeats=1, timeout_s=61), 500.0)  # another spec's
    monkeypatch.setenv("LLMBENCH_DEADLINE", str(clock[0] + 121))
    (tmp_path / "record.json").unlink()
    assert run(spec, tmp_path).status == "ok" and ran == [0, 0]


def test_a_deadline_that_is_not_a_time_is_refused_before_anything_runs(spec_for, tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(launch, "run_repeat", lambda *a: ran.append(a))
    monkeypatch.setenv("LLMBENCH_DEADLINE", "tomorrow")
    with pytest.raises(ValueError, match="LLMBENCH_DEADLINE='tomorrow': not a time in Unix seconds"):
        run(spec_for("ok", repeats=3), tmp_path)
    assert ran == [] and not (tmp_path / "record.json").exists()
