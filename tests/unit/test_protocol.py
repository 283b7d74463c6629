import math

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
