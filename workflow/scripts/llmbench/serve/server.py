"""Server lifecycle: start an engine in its own process group on 127.0.0.1 and a free port,
wait until it is ready, sample its memory, and always stop the whole group.

The group is stopped on success, on failure, on Ctrl-C and when Snakemake cancels the
job (SIGTERM): the process is started through llmbench.procs.start_group, whose
signal handler stops every group it started, behind a leash that kills the engine and its
children when the launcher dies (SIGKILL included).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..gpus import UsedMemory
from ..launch import THREAD_VARS
from ..procs import last_error, log_says_oom, port_in_use, start_group, stop_group


# THREAD_VARS (llmbench.launch) are set by Snakemake to the job's thread count; an engine
# sizes and pins its own thread pools (vLLM's CPU backend binds OpenMP threads to cores and
# reserves one for its front end: OMP_NUM_THREADS=2 from the job put two threads on one
# core, 4x slower), so they do not reach it.


class ServerError(RuntimeError):
    """The engine did not become ready, or died."""

    def __init__(self, message: str, *, oom: bool = False):
        super().__init__(message)
        self.oom = oom


class MemorySampler(threading.Thread):
    """Peak memory of a server while it runs: RSS of its process tree, and GPU memory in
    use on the cell's GPUs (``gpu_used``: GiB, e.g. llmbench.gpus.UsedMemory.read, through
    NVML; minus ``baseline_gib``, what was in use before the server started)."""

    def __init__(self, pid: int, gpu_used: Callable[[], float | None] | None, baseline_gib: float | None,
                 interval_s: float = 0.5, skip_root: bool = False):
        super().__init__(daemon=True)
        self.pid, self.gpu_used, self.interval = pid, gpu_used, interval_s
        self.skip_root = skip_root  # ``pid`` is a leash (llmbench.procs), not the engine
        self.peak_rss_bytes = 0
        self.peak_gpu_used_gib: float | None = None
        self.gpu_baseline_gib = baseline_gib
        self._stopping = threading.Event()

    def sample(self) -> None:
        """Take one sample now."""
        try:
            root = psutil.Process(self.pid)
            procs = [*([] if self.skip_root else [root]), *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        rss = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                rss += p.memory_info().rss
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        used = self.gpu_used() if self.gpu_used is not None else None
        if used is not None:
            self.peak_gpu_used_gib = max(self.peak_gpu_used_gib or 0.0, used)

    def run(self) -> None:
        while not self._stopping.is_set():
            self.sample()
            self._stopping.wait(self.interval)

    def stop(self) -> dict[str, float | None]:
        """Stop sampling (its last sample done); the peaks in GiB."""
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout=10)  # a sample takes milliseconds; past this NVML says None
        return self.peaks()

    def peaks(self) -> dict[str, float | None]:
        """The peaks so far in GiB, after one more sample now (sampling goes on, as it does
        over an engine that serves several loads one after the other)."""
        if not self._stopping.is_set():
            self.sample()
        gpu = None
        if self.peak_gpu_used_gib is not None:
            gpu = self.peak_gpu_used_gib - (self.gpu_baseline_gib or 0.0)
        return {"server_peak_rss_gib": self.peak_rss_bytes / 2**30, "server_peak_gpu_mem_gib": gpu}


@dataclass(kw_only=True, slots=True)
class Running:
    """A ready server."""

    proc: subprocess.Popen
    """The engine's process (leader of its group)."""
    base_url: str
    """http://host:port"""
    ready_s: float
    """Seconds from start to the first 200 of the health probe."""
    memory: MemorySampler
    """Its memory sampler (running)."""

    def check_alive(self) -> None:
        """Raise ServerError if the engine has exited."""
        if self.proc.poll() is not None:
            raise ServerError(f"server exited with code {self.proc.returncode} while serving")


def _probe(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def serve(argv: list[str], *, env: dict[str, str], host: str, port: int, health_path: str,
          log: Path, ready_timeout_s: float, gpu_ids: list[str] | None = None) -> Iterator[Running]:
    """Start ``argv``, wait until GET health_path answers 200, yield, then stop the group.

    Raises ServerError (with the log's last error line) if the port is taken, the server
    exits before it is ready, or it is not ready within ready_timeout_s.
    """
    if port_in_use(host, port):
        raise ServerError(f"port {port} on {host} is already in use")
    log.parent.mkdir(parents=True, exist_ok=True)
    with UsedMemory(gpu_ids) as gpu_used:
        baseline = gpu_used.read()
        start = time.monotonic()
        inherited = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
        proc = start_group(argv, env={**inherited, **env}, log=log)
        # from the start: loading weights can be the peak on the host; proc is the leash
        # (procs.start_group), not the engine, so its own memory is left out
        sampler = MemorySampler(proc.pid, gpu_used.read, baseline, skip_root=True)
        sampler.start()
        try:
            url = f"http://{host}:{port}{health_path}"
            while not _probe(url):
                if proc.poll() is not None:
                    raise ServerError(f"server exited with code {proc.returncode} before it was ready: "
                                      f"{last_error(log)}", oom=log_says_oom(log))
                if time.monotonic() - start > ready_timeout_s:
                    raise ServerError(f"server not ready after ready_timeout_s={ready_timeout_s:g}: "
                                      f"{last_error(log)}")
                time.sleep(0.5)
            yield Running(proc=proc, base_url=f"http://{host}:{port}", ready_s=time.monotonic() - start,
                          memory=sampler)
        finally:
            sampler.stop()  # before NVML's session closes under it
            stop_group(proc)
