import math
import sys
import time

import pytest

from llmbench.protocol import Protocol, run_window, summarize


def test_summarize_mean_and_sample_std():
    s = summarize([1.0, 2.0, 3.0, 4.0])
    assert s.mean == 2.5
    assert s.std == pytest.approx(math.sqrt(5 / 3))  # n-1 denominator
    assert s.values == (1.0, 2.0, 3.0, 4.0)


def test_summarize_single_and_bad():
    assert summarize([5.0]).std == 0.0
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("inf")])


def test_window_runs_warmup_then_measured_steps():
    calls, syncs = [], []
    p = Protocol(warmup_steps=3, measured_steps=4, repeats=1, seq_len=8, timeout_s=10)
    w = run_window(lambda: calls.append(1), p, lambda: syncs.append(len(calls)))
    assert len(calls) == 7
    assert syncs == [3, 7]  # synchronised after warm-up and after the last measured step
    assert w.steps == 4 and len(w.step_times_s) == 4 and w.elapsed_s >= sum(w.step_times_s) * 0.999


def test_protocol_validates():
    with pytest.raises(ValueError, match="protocol.measured_steps"):
        Protocol(measured_steps=0)


def test_the_window_says_what_the_hosts_cpus_did(tmp_path, monkeypatch):
    """Steal (a VM's CPUs ready while the hypervisor ran another tenant), busy share and the
    process's own CPU seconds over the measured steps, from /proc/stat read at both ends."""
    from llmbench import protocol, provenance

    first = "cpu  100 0 50 800 10 0 0 40 7 0\ncpu0 1 2 3 4 5 6 7 8\nintr 1\n"
    second = "cpu  400 0 150 1000 30 10 10 200 9 0\n"
    # deltas: user 300, system 100, idle 200, iowait 20, irq 10, softirq 10, steal 160: 800 in all
    assert protocol.host_cpu(*(provenance.cpu_times(_write(tmp_path, t)) for t in (first, second)), 1.5) == {
        "cpu_steal_pct": 20.0, "host_busy_pct": 72.5, "process_cpu_s": 1.5}
    assert provenance.cpu_times(tmp_path / "missing") is None
    assert protocol.host_cpu(None, provenance.cpu_times(_write(tmp_path, second)), 1.0) is None

    readings = iter([first, second])
    real = provenance.cpu_times
    monkeypatch.setattr(protocol, "cpu_times", lambda: real(_write(tmp_path, next(readings))))
    w = run_window(lambda: sum(range(20000)), Protocol(warmup_steps=1, measured_steps=3), lambda: None)
    assert w.host["cpu_steal_pct"] == 20.0 and w.host["process_cpu_s"] > 0
    assert w.summary() == {f"window_{k}": v for k, v in {**w.host, **w.gc}.items()}


def test_the_window_counts_the_garbage_collectors_pauses_in_it():
    import gc

    def cycles():  # objects in reference cycles: only the cyclic collector frees them
        for _ in range(5000):
            a = []
            a.append(a)

    gc.collect()
    w = run_window(cycles, Protocol(warmup_steps=0, measured_steps=5), lambda: None)
    assert w.gc["gc_collections"] > 0 and w.gc["gc_s"] > 0
    assert w.summary()["window_gc_collections"] == w.gc["gc_collections"]
    # a forced full collection in the window is counted as one
    w = run_window(lambda: gc.collect(2), Protocol(warmup_steps=0, measured_steps=3), lambda: None)
    assert w.gc["gc_full_collections"] >= 3
    # nothing is left hooked after the window
    assert all(getattr(cb, "__self__", None).__class__.__name__ != "GcClock" for cb in gc.callbacks)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_on_this_machine_the_window_reads_the_real_proc_stat():
    w = run_window(lambda: time.sleep(0.01), Protocol(warmup_steps=0, measured_steps=20), lambda: None)
    assert 0 <= w.host["cpu_steal_pct"] <= 100 and 0 <= w.host["host_busy_pct"] <= 100


def _write(tmp_path, text):
    path = tmp_path / f"stat-{abs(hash(text))}"
    path.write_text(text)
    return path
