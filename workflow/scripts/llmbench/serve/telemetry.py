"""GPU telemetry over a serving cell's measured window: a thread that reads, every
``interval_s``, each of the cell's GPUs' SM clock, power draw, memory in use and utilisation
through NVML (pynvml, as llmbench.gpus reads them), keeps every sample, and sums them up
as mean and max per metric per GPU.

Where there is no GPU to read (a CPU platform, no NVML library, no driver) it samples
nothing and says why; a serving cell never fails for want of telemetry.

    with Telemetry(["0"]) as t:      # or as run_load's ``window``
        ...                          # the measured load
    t.summary(); t.rows(); t.write(path)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: what one sample holds per GPU, units in the names
METRICS = ("sm_clock_mhz", "power_w", "mem_used_gib", "util_pct")
#: seconds between samples: NVML refreshes power about every 20-100 ms and utilisation over
#: a 1/6 s to 1 s window (its documentation), so sampling faster adds reads, not information
INTERVAL_S = 0.2
#: the file of a cell's samples, beside its record.json
FILE = "gpu-telemetry.csv"
GIB = 2**30

#: GPU ids in, one dict of METRICS per GPU out (values None where NVML has no reading)
Reader = Callable[[list[str]], list[dict[str, float | None]]]


class _Nvml:
    """An NVML session with one handle per GPU, read as a Reader."""

    def __init__(self, ids: list[str]):
        import pynvml

        from ..gpus import handle

        pynvml.nvmlInit()
        self.nvml = pynvml
        try:
            self.handles = [handle(pynvml, gid) for gid in ids]
        except pynvml.NVMLError:
            pynvml.nvmlShutdown()
            raise

    def _one(self, get: Callable[[], float]) -> float | None:
        try:
            return float(get())
        except self.nvml.NVMLError:  # a board that does not report it (power on some parts)
            return None

    def __call__(self, ids: list[str]) -> list[dict[str, float | None]]:
        n = self.nvml
        return [{"sm_clock_mhz": self._one(lambda h=h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                 "power_w": self._one(lambda h=h: n.nvmlDeviceGetPowerUsage(h) / 1000),  # mW
                 "mem_used_gib": self._one(lambda h=h: n.nvmlDeviceGetMemoryInfo(h).used / GIB),
                 "util_pct": self._one(lambda h=h: n.nvmlDeviceGetUtilizationRates(h).gpu)}
                for h in self.handles]

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class Telemetry(contextlib.AbstractContextManager):
    """Samples the GPUs ``ids`` from __enter__ to __exit__ in a thread of its own. ``reader``
    stands in for NVML in tests; ``ids`` None or empty: nothing to sample (a CPU cell)."""

    def __init__(self, ids: list[str] | None, interval_s: float = INTERVAL_S, reader: Reader | None = None):
        if not interval_s > 0:
            raise ValueError(f"telemetry interval_s must be > 0, got {interval_s}")
        self.ids, self.interval_s, self.reader = list(ids or []), interval_s, reader
        self.unavailable: str | None = None
        self.samples: list[tuple[float, list[dict[str, float | None]]]] = []
        self.read_errors = 0
        self._nvml: _Nvml | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._entered = False

    def __enter__(self) -> Telemetry:
        self._entered = True
        if not self.ids:
            self.unavailable = "no GPU: the cell runs on the CPU"
            return self
        if self.reader is None:
            try:
                self._nvml = _Nvml(self.ids)
            except Exception as exc:  # noqa: BLE001 - no NVML library or driver: say so, measure on
                self.unavailable = f"NVML could not be read: {type(exc).__name__}: {exc}"
                return self
            self.reader = self._nvml
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        now = time.perf_counter() - self._t0
        try:
            self.samples.append((now, self.reader(self.ids)))
        except Exception:  # noqa: BLE001 - one failed read is a gap, counted, not the end
            self.read_errors += 1

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                break
        self._sample()  # the window's end

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def rows(self) -> list[dict[str, Any]]:
        """Every sample, one row per GPU: t_s (seconds after the window opened), gpu, METRICS."""
        return [{"t_s": t, "gpu": gid, **{m: g.get(m) for m in METRICS}}
                for t, per_gpu in self.samples for gid, g in zip(self.ids, per_gpu)]

    def summary(self, file: str | None = None) -> dict[str, Any]:
        """What a record's flat summary keeps, keys prefixed ``gpu_telemetry_``: the source
        (or, with source None, why there is none), the interval, the sample count, the GPUs
        read (their ids, comma-separated) and the samples' ``file``; then per GPU, by its
        place k among the cell's GPUs, ``gpu<k>_<metric>_mean`` and ``_max`` (None where no
        sample had a value)."""
        if not self._entered or self.unavailable is not None:
            why = self.unavailable or "no measured window: the load did not start"
            return {"gpu_telemetry_source": None, "gpu_telemetry_unavailable": why}
        out: dict[str, Any] = {
            "gpu_telemetry_source": "nvml", "gpu_telemetry_interval_s": self.interval_s,
            "gpu_telemetry_samples": len(self.samples), "gpu_telemetry_read_errors": self.read_errors,
            "gpu_telemetry_gpus": ",".join(self.ids), "gpu_telemetry_file": file}
        for i in range(len(self.ids)):
            for m in METRICS:
                vals = np.array([g[i][m] for _, g in self.samples if g[i].get(m) is not None], dtype=float)
                out[f"gpu{i}_{m}_mean"] = float(vals.mean()) if vals.size else None
                out[f"gpu{i}_{m}_max"] = float(vals.max()) if vals.size else None
        return out

    def write(self, path: Path) -> None:
        """The samples as CSV (t_s, gpu, METRICS), written atomically."""
        import pandas as pd

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        pd.DataFrame(self.rows(), columns=["t_s", "gpu", *METRICS]).to_csv(tmp, index=False)
        tmp.replace(path)
