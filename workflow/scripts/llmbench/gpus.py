"""The state of a cell's GPUs before it starts: who holds them, how much memory is free.

A process that another cell, user or crashed run left on a GPU makes the next cell fail
with a CUDA out-of-memory error that looks like a real one; an ``oom`` record must mean the
cell did not fit, not that the GPU was taken. So before a GPU cell (training, profile,
microbenchmark, serving) starts anything, its GPUs are read through NVML (``pynvml``, the
package nvidia-ml-py): processes with memory on them and memory used and free. A GPU with
a process on it, or with more than ``BusyPolicy.used_threshold_gib`` in use, is busy: by
default the cell is recorded as ``error`` with the holders in its reason and nothing runs;
with the config's ``gpu_busy: wait`` it waits up to ``gpu_busy_wait_s`` for them to go.
A GPU whose product name lacks the platform's ``gpu_name`` (a cell of platform h200 on an
H100: a mixed Slurm partition, a lent machine of another kind) is refused the same way,
at once: a record must say what it ran on.
Every GPU record carries what was read at its start in ``provenance["gpu_state"]``.
CPU platforms are not read.

Which GPUs a cell runs on: those a scheduler gave the job (CUDA_VISIBLE_DEVICES, Slurm's
variables: cell_gpu_ids); outside a scheduler, on a node with more GPUs than the cell
needs (Snakemake running several one-GPU jobs at once, ``--resources gpu_slots=8`` on an
8-GPU server), the job claims free ones for the rest of its process (claim_gpus: a lock
file a GPU under LLMBENCH_GPU_LOCK_DIR, held by flock, so a killed job frees its GPUs) and
sets CUDA_VISIBLE_DEVICES for its workers (unclaimed, every such job would take GPUs 0..n-1).
Concurrent cells share the node's CPUs, host memory and PCIe: a host-bound cell (batch 1,
offload) is timed alone (gpu_slots=1).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import check_schema, schema_defaults
from .spec import RunSpec

if TYPE_CHECKING:
    from .record import Record

GIB = 2**30


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    """Its pid as NVML reports it (the host's pid namespace, also inside a container)."""
    used_gib: float | None
    """GPU memory it holds (None where the driver does not say, e.g. without permission)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuInfo:
    """One GPU as read before a cell starts."""

    id: str
    """The GPU as the cell names it: an index or a UUID (CUDA_VISIBLE_DEVICES' entry)."""
    name: str = ""
    """Product name."""
    total_gib: float
    """Memory of the GPU."""
    used_gib: float
    """Memory in use (by any process, driver reservations included)."""
    free_gib: float
    """Memory free."""
    processes: tuple[GpuProcess, ...] = ()
    """Processes with memory on it (compute and graphics)."""
    board: dict[str, Any] = field(default_factory=dict)
    """Which GPU it is and what sets its speed, where NVML tells (``board``): uuid, the PCIe
    link's generation and width (current, which idles lower, and maximum), the SM clock's
    maximum (MHz) and the enforced power limit (W)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the record's provenance: lists, as JSON reads them back)."""
        return {**asdict(self), "processes": [asdict(p) for p in self.processes]}


Reader = Callable[[list[str]], list[GpuInfo]]


#: the config keys of BusyPolicy's fields; their defaults and bounds are the config schema's
_KEYS = {"action": "gpu_busy", "wait_s": "gpu_busy_wait_s"}
_DEFAULTS = schema_defaults("")


@dataclass(kw_only=True, slots=True, frozen=True)
class BusyPolicy:
    """What a cell does when its GPUs are busy (config keys gpu_busy, gpu_busy_wait_s)."""

    action: str = _DEFAULTS["gpu_busy"]
    """error: record status error and run nothing; wait: wait for the GPUs, then error."""
    wait_s: float = float(_DEFAULTS["gpu_busy_wait_s"])
    """Longest wait for busy GPUs (action wait)."""
    used_threshold_gib: float = 1.0
    """Memory in use above which a GPU with no listed process still counts as busy (an
    idle GPU shows a few hundred MiB of driver reservations; a process in another
    container may not be listed)."""
    poll_s: float = 5.0
    """Seconds between reads while waiting."""

    def __post_init__(self) -> None:
        check_schema({key: getattr(self, f) for f, key in _KEYS.items()}, "", "")

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> BusyPolicy:
        """The policy a workflow config sets (the schema's defaults where it sets none)."""
        config = config or {}
        return cls(**{f: config[key] for f, key in _KEYS.items() if key in config})


@dataclass(kw_only=True, slots=True)
class Check:
    """The outcome of checking a cell's GPUs."""

    refused: str | None = None
    """Why the cell must not run (the record's reason): its GPUs are busy or not the
    platform's; None: they are free and the platform's."""
    state: list[dict[str, Any]] | dict[str, Any] | None = None
    """What was read (per GPU), {"error": ...} where NVML could not be read, None on a CPU."""
    waited_s: float = 0.0
    """Seconds spent waiting for busy GPUs."""

    def provenance(self) -> dict[str, Any]:
        """The record's provenance entries (none on a CPU)."""
        if self.state is None:
            return {}
        return {"gpu_state": {"gpus": self.state, "waited_s": round(self.waited_s, 3)}
                if isinstance(self.state, list) else self.state}


#: The variables through which a scheduler gives a job its GPUs (cell_gpu_ids reads them)
SCHEDULER_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
#: Where local jobs claim GPUs (one lock file a GPU; module docstring), else LOCK_DIR
LOCK_DIR_VAR = "LLMBENCH_GPU_LOCK_DIR"
LOCK_DIR = Path(tempfile.gettempdir()) / "llmbench-gpus"
#: This process's claim (claim_gpus): the GPU ids, the open lock files that hold them and the
#: CUDA_DEVICE_ORDER it replaced
_HELD: dict[str, Any] = {}


def nvml_count() -> int | None:
    """The node's GPUs as NVML counts them; None where NVML cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library, no driver
        return None


def lock_free(count: int, total: int, lock_dir: Path) -> tuple[list[str], list[int]] | None:
    """Lock ``count`` of GPUs 0..total-1 that no other process holds, the lowest indices
    first (flock, non-blocking, on ``lock_dir``/gpu-<i>.lock): their ids and the open file
    descriptors that hold them (closing one frees its GPU; so does the process's end).
    None where fewer than ``count`` are free (nothing is held then)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(lock_dir, 0o1777)  # other users' jobs on the node claim through it too
    except OSError:
        pass
    ids, fds = [], []
    for i in range(total):
        fd = os.open(lock_dir / f"gpu-{i}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        ids.append(str(i))
        fds.append(fd)
        if len(ids) == count:
            return ids, fds
    for fd in fds:
        os.close(fd)
    return None


def claim_gpus(count: int, accelerator: str, policy: BusyPolicy | None = None, *,
               env: dict[str, str] | None = None, total: int | None = None, lock_dir: Path | None = None,
               sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> tuple[list[str] | None, str | None]:
    """Claim ``count`` GPUs for this process where no scheduler gave it any and the node has
    more (module docstring): (their ids, None), CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
    (PCI_BUS_ID, so that CUDA's index is NVML's) set in ``env`` (default os.environ) for the
    workers. The claim lasts until the process ends or claims another count, so a search's
    probes keep their GPUs. (None, None) where there is nothing to claim (a CPU, a scheduler's
    GPUs, as many GPUs as the cell needs or fewer, NVML unreadable). (None, why) where all
    are held by other jobs after the policy's wait (BusyPolicy: error at once, or wait)."""
    env = os.environ if env is None else env
    if accelerator != "cuda":
        return None, None
    if _HELD.get("count") == count:
        return list(_HELD["ids"]), None
    if _HELD:  # another count: give those back first
        for fd in _HELD["fds"]:
            os.close(fd)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # a claim is made only where no scheduler set it
        if _HELD["order"] is None:
            env.pop("CUDA_DEVICE_ORDER", None)
        else:
            env["CUDA_DEVICE_ORDER"] = _HELD["order"]
        _HELD.clear()
    if any(env.get(var, "").strip() for var in SCHEDULER_VARS):
        return None, None
    total = nvml_count() if total is None else total
    if total is None or total <= count:
        return None, None
    lock_dir = Path(env.get(LOCK_DIR_VAR) or LOCK_DIR) if lock_dir is None else lock_dir
    policy = policy or BusyPolicy()
    start = clock()
    while (got := lock_free(count, total, lock_dir)) is None:
        waited = clock() - start
        if policy.action != "wait" or waited >= policy.wait_s:
            return None, (f"no {count} free GPU(s) of the node's {total}: the others are claimed by other llmbench "
                          f"jobs ({lock_dir}; Snakemake's gpu_slots over the node's GPUs?)"
                          + (f" (still, after waiting {waited:.0f} s of gpu_busy_wait_s={policy.wait_s:g})"
                             if policy.action == "wait" else "") + " (nothing ran)")
        sleep(min(policy.poll_s, max(0.0, policy.wait_s - waited)))
    ids, fds = got
    _HELD.update(count=count, ids=ids, fds=fds, order=env.get("CUDA_DEVICE_ORDER"))
    env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return ids, None


def cell_gpu_ids(count: int, accelerator: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """The GPUs a cell runs on (None on a CPU): the first ``count`` entries of
    CUDA_VISIBLE_DEVICES (which Slurm sets for a job's GPUs; indices or UUIDs), else of
    Slurm's SLURM_STEP_GPUS / SLURM_JOB_GPUS, else 0..count-1."""
    if accelerator != "cuda":
        return None
    env = os.environ if env is None else env
    for var in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        entries = [x.strip() for x in env.get(var, "").split(",") if x.strip()]
        if entries:
            return entries[:count]
    return [str(i) for i in range(count)]


def board(pynvml: Any, handle: Any) -> dict[str, Any]:
    """What tells two GPUs of one product apart, each query where the driver answers it: the
    UUID (which physical GPU a record ran on), the PCIe link (offload's copies cross it), the
    SM clock's maximum and the enforced power limit. The product name and the driver do not
    tell two machines apart; these say which GPU it was and what bounds its speed."""
    queries = {
        "uuid": lambda: pynvml.nvmlDeviceGetUUID(handle),
        "pcie_gen": lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        "pcie_gen_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
        "pcie_width": lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle),
        "pcie_width_max": lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
        "sm_clock_max_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
    }
    out: dict[str, Any] = {}
    for key, query in queries.items():
        try:
            value = query()
        except pynvml.NVMLError:
            continue
        out[key] = value.decode() if isinstance(value, bytes) else value
    return out


def handle(pynvml: Any, gid: str) -> Any:
    """NVML's handle of a GPU as a cell names it. An index is NVML's (PCI bus order, which
    CUDA follows with CUDA_DEVICE_ORDER=PCI_BUS_ID, as Slurm's indices do); a UUID names one
    GPU in any order."""
    return pynvml.nvmlDeviceGetHandleByIndex(int(gid)) if gid.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(gid)


def read_nvml(ids: list[str]) -> list[GpuInfo]:
    """Read these GPUs through NVML (ids: as handle() takes them)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        out = []
        for gid in ids:
            dev = handle(pynvml, gid)
            mem = pynvml.nvmlDeviceGetMemoryInfo(dev)
            name = pynvml.nvmlDeviceGetName(dev)
            procs: dict[int, GpuProcess] = {}
            for get in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                try:
                    listed = get(dev)
                except pynvml.NVMLError:
                    continue
                for p in listed:
                    used = getattr(p, "usedGpuMemory", None)
                    procs[p.pid] = GpuProcess(pid=p.pid, used_gib=used / GIB if isinstance(used, int) else None)
            out.append(GpuInfo(id=gid, name=name.decode() if isinstance(name, bytes) else str(name),
                               total_gib=mem.total / GIB, used_gib=mem.used / GIB, free_gib=mem.free / GIB,
                               processes=tuple(procs.values()), board=board(pynvml, dev)))
        return out
    finally:
        pynvml.nvmlShutdown()


class UsedMemory:
    """Memory in use on some GPUs, summed, read through NVML as often as a sampler asks
    (llmbench.serve.server, every half second while a load is measured): one NVML session
    and one handle per GPU for as long as it is open, so a read is one driver call a GPU, not
    a process forked (nvidia-smi) beside the load. Use it as a context manager.

    ``reader`` stands in for NVML in tests (a Reader, as check() takes); read() is None
    where there are no GPUs or NVML cannot be read."""

    def __init__(self, ids: list[str] | None, reader: Reader | None = None):
        self.ids, self.reader = list(ids or []), reader
        self._pynvml: Any = None
        self._handles: list[Any] = []

    def __enter__(self) -> UsedMemory:
        if self.ids and self.reader is None:
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception:  # noqa: BLE001 - no NVML library, no driver: read() says None
                return self
            self._pynvml = pynvml
            try:
                self._handles = [handle(pynvml, gid) for gid in self.ids]
            except pynvml.NVMLError:
                self._handles = []
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pynvml is not None:
            self._pynvml.nvmlShutdown()
            self._pynvml, self._handles = None, []

    def read(self) -> float | None:
        """GiB in use on the GPUs now (by any process, driver reservations included)."""
        if self.reader is not None:
            return sum(g.used_gib for g in self.reader(self.ids)) if self.ids else None
        if not self._handles:
            return None
        try:
            return sum(self._pynvml.nvmlDeviceGetMemoryInfo(h).used for h in self._handles) / GIB
        except self._pynvml.NVMLError:
            return None


def busy_reason(gpus: list[GpuInfo], policy: BusyPolicy, own_pids: frozenset[int] = frozenset()) -> str | None:
    """Why these GPUs are busy ("GPU busy: pid N holds X GiB on GPU i; ..."), or None."""
    parts = []
    for g in gpus:
        foreign = [p for p in g.processes if p.pid not in own_pids]
        for p in foreign:
            held = "memory" if p.used_gib is None else f"{p.used_gib:.2f} GiB"
            parts.append(f"pid {p.pid} holds {held} on GPU {g.id}")
        if not foreign and g.used_gib > policy.used_threshold_gib:
            parts.append(f"GPU {g.id} has {g.used_gib:.2f} GiB in use by no listed process "
                         f"(over {policy.used_threshold_gib:g} GiB; another container's?)")
    return "GPU busy: " + "; ".join(parts) if parts else None


def wrong_gpu_reason(gpus: list[GpuInfo], gpu_name: str | None, platform: str = "") -> str | None:
    """Why these GPUs are not the platform's ("GPU 0 is 'NVIDIA H100 80GB HBM3', not ...
    'H200'"), or None: every name contains ``gpu_name`` (case-insensitive), or it is unset."""
    if not gpu_name:
        return None
    wrong = [f"GPU {g.id} is '{g.name}'" for g in gpus if gpu_name.lower() not in g.name.lower()]
    if not wrong:
        return None
    whose = f"platform {platform}'s" if platform else "the platform's"
    return f"wrong GPU: {'; '.join(wrong)}, not {whose} gpu_name '{gpu_name}' (nothing ran)"


def check(accelerator: str, count: int, policy: BusyPolicy | None = None, *, reader: Reader | None = None,
          env: Mapping[str, str] | None = None, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic, gpu_name: str | None = None,
          platform: str = "") -> Check:
    """Read the cell's GPUs before it starts and decide whether it may (module docstring):
    not on GPUs whose name lacks ``gpu_name`` (the platform ``platform``'s), nor on busy ones.

    ``reader`` stands in for NVML in tests (default: read_nvml). A GPU that cannot be
    read does not stop the cell (the state says why), as before this check existed."""
    ids = cell_gpu_ids(count, accelerator, env)
    if ids is None:
        return Check()
    policy = policy or BusyPolicy()
    read = reader or read_nvml
    start = clock()
    own = frozenset({os.getpid()})
    while True:
        waited = clock() - start  # before the read: NVML's start-up is no waiting
        try:
            gpus = read(ids)
        except Exception as exc:  # noqa: BLE001 - no NVML library, no driver, a bad id
            return Check(state={"error": f"{type(exc).__name__}: {exc}", "gpus": ids})
        state = [g.to_dict() for g in gpus]
        if wrong := wrong_gpu_reason(gpus, gpu_name, platform):  # waiting cannot change it
            return Check(refused=wrong, state=state, waited_s=waited)
        reason = busy_reason(gpus, policy, own)
        if reason is None:
            return Check(state=state, waited_s=waited)
        if policy.action != "wait" or waited >= policy.wait_s:
            if policy.action == "wait":
                reason = f"{reason} (still, after waiting {waited:.0f} s of gpu_busy_wait_s={policy.wait_s:g})"
            return Check(refused=reason, state=state, waited_s=waited)
        sleep(min(policy.poll_s, max(0.0, policy.wait_s - waited)))


def check_cell(spec: RunSpec | dict, count: int, policy: BusyPolicy | None, log: Path) -> Check:
    """check() for a cell about to start (its spec's platform, ``count`` GPUs); its log says
    what was found. ``spec``: the cell's RunSpec, or a spec's JSON form, of which only the
    platform's accelerator, gpu_name and name are read."""
    if isinstance(spec, RunSpec):
        accelerator, gpu_name, name = spec.platform.accelerator, spec.platform.gpu_name, spec.platform.name
    else:
        platform = spec["platform"]
        accelerator, gpu_name, name = platform["accelerator"], platform.get("gpu_name"), platform.get("name", "")
    claimed, refused = claim_gpus(count, accelerator, policy)
    if refused:
        with open(log, "a") as fh:
            fh.write(f"=== GPU claim: {refused}\n")
        return Check(refused=refused, state={"error": refused})
    found = check(accelerator, count, policy, gpu_name=gpu_name, platform=name)
    if found.state is not None:
        with open(log, "a") as fh:
            if claimed:
                fh.write(f"=== GPU claim: GPU(s) {','.join(claimed)} of the node's, for this job "
                         f"(CUDA_VISIBLE_DEVICES={','.join(claimed)})\n")
            fh.write(f"=== GPU state at start: {found.refused or 'free'} {json.dumps(found.state)}\n")
    return found


def with_state(record: Record, found: Check) -> Record:
    """``record`` with the GPU state read at its start in its provenance (GPU cells)."""
    extra = found.provenance()
    return dataclasses.replace(record, provenance={**record.provenance, **extra}) if extra else record
