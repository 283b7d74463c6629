"""GPU telemetry over a serving cell's measured window (llmbench.serve.telemetry), with a
stand-in for NVML: what it samples, its summary per GPU, its file, and no crash without GPUs."""

import os
import sys
import threading

import pandas as pd
import pytest

from llmbench.serve import telemetry
from llmbench.serve.telemetry import METRICS, Telemetry

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
from fake_nvml import fake_pynvml  # noqa: E402


def counting_reader(reads_before_close: threading.Event, n: int = 3):
    """A reader whose i-th call reports i for every metric of GPU 0 and 10 i for GPU 1; it
    sets the event after n calls so a test can close the window only then."""
    calls = []

    def read(ids):
        calls.append(list(ids))
        if len(calls) >= n:
            reads_before_close.set()
        i = len(calls)
        return [dict.fromkeys(METRICS, float(i)), dict.fromkeys(METRICS, 10.0 * i)]
    read.calls = calls
    return read


def test_samples_in_the_window_give_mean_and_max_per_gpu_and_a_file(tmp_path):
    seen = threading.Event()
    reader = counting_reader(seen)
    with Telemetry(["0", "1"], interval_s=0.01, reader=reader) as t:
        assert seen.wait(10)
    rows = pd.DataFrame(t.rows())
    n = len(reader.calls)
    assert n >= 4 and t.summary()["gpu_telemetry_samples"] == n  # three or more, then one at the window's end
    assert all(c == ["0", "1"] for c in reader.calls) and len(rows) == 2 * n
    s = t.summary(file=telemetry.FILE)
    assert (s["gpu_telemetry_source"], s["gpu_telemetry_gpus"], s["gpu_telemetry_file"]) == ("nvml", "0,1",
                                                                                            telemetry.FILE)
    for m in METRICS:
        assert s[f"gpu0_{m}_mean"] == pytest.approx((n + 1) / 2) and s[f"gpu0_{m}_max"] == n
        assert s[f"gpu1_{m}_mean"] == pytest.approx(10 * (n + 1) / 2) and s[f"gpu1_{m}_max"] == 10 * n
    t.write(tmp_path / telemetry.FILE)
    back = pd.read_csv(tmp_path / telemetry.FILE, dtype={"gpu": str})
    assert list(back.columns) == ["t_s", "gpu", *METRICS] and len(back) == 2 * n
    assert back["t_s"].is_monotonic_increasing and set(back["gpu"]) == {"0", "1"}


def test_nvml_readings_in_their_units_and_a_reading_a_board_lacks_is_none(monkeypatch):
    nvml = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with Telemetry(["0", "1"], interval_s=0.01) as t:
        pass
    s = t.summary()
    assert (s["gpu0_sm_clock_mhz_max"], s["gpu0_power_w_max"], s["gpu0_mem_used_gib_max"], s["gpu0_util_pct_max"]) \
        == (1980, 350.0, 40.0, 97)
    assert s["gpu1_power_w_mean"] is None and s["gpu1_util_pct_mean"] == 12  # its power raised NVMLError
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_without_gpus_or_nvml_the_summary_says_why_and_nothing_runs(monkeypatch):
    with Telemetry(None) as t:
        pass
    assert t.summary() == {"gpu_telemetry_source": None,
                           "gpu_telemetry_unavailable": "no GPU: the cell runs on the CPU"}
    assert t.rows() == []

    broken = fake_pynvml()
    broken.nvmlInit = lambda: (_ for _ in ()).throw(broken.NVMLError("Driver Not Loaded"))
    monkeypatch.setitem(sys.modules, "pynvml", broken)
    with Telemetry(["0"]) as t:
        pass
    assert t.summary()["gpu_telemetry_unavailable"] == "NVML could not be read: NVMLError: Driver Not Loaded"
    assert Telemetry(["0"]).summary()["gpu_telemetry_source"] is None  # never entered: no window


def test_a_failed_read_is_a_counted_gap():
    calls = []

    def flaky(ids):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("transient")
        return [dict.fromkeys(METRICS, 1.0)]
    with Telemetry(["0"], interval_s=0.01, reader=flaky) as t:
        pass
    s = t.summary()
    assert s["gpu_telemetry_read_errors"] == 1 and s["gpu_telemetry_samples"] == len(calls) - 1 >= 1
    with pytest.raises(ValueError, match="interval_s"):
        Telemetry(["0"], interval_s=0)
