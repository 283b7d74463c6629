"""llmbench.gpus: a busy GPU is an error, not an OOM. NVML is faked (this machine has no
GPU): the reader is injected. The runners on a busy GPU, run for real, are in
tests/integration/test_gpus_cells.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llmbench import config, gpus
from llmbench.gpus import BusyPolicy

FIXTURES = str(Path(__file__).resolve().parents[1] / "fixtures")
sys.path.insert(0, FIXTURES)
from fake_nvml import FREE, HELD, gpu, reader_of  # noqa: E402


def test_the_cells_gpus_come_from_the_scheduler_then_the_count():
    assert gpus.cell_gpu_ids(2, "cpu", {"CUDA_VISIBLE_DEVICES": "0,1"}) is None
    assert gpus.cell_gpu_ids(1, "cuda", {"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2"]
    assert gpus.cell_gpu_ids(2, "cuda", {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert gpus.cell_gpu_ids(2, "cuda", {"SLURM_JOB_GPUS": "4,5"}) == ["4", "5"]
    assert gpus.cell_gpu_ids(2, "cuda", {}) == ["0", "1"]


def test_free_gpus_pass_and_their_state_goes_to_provenance():
    check = gpus.check("cuda", 2, reader=reader_of(FREE), env={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert check.refused is None
    state = check.provenance()["gpu_state"]
    assert [g["id"] for g in state["gpus"]] == ["3", "1"] and state["gpus"][0]["free_gib"] == pytest.approx(79.7)


def test_a_foreign_process_makes_the_gpu_busy():
    check = gpus.check("cuda", 1, reader=reader_of(HELD), env={})
    assert check.refused == "GPU busy: pid 4242 holds 30.00 GiB on GPU 0"
    assert check.provenance()["gpu_state"]["gpus"][0]["processes"] == [{"pid": 4242, "used_gib": 30.0}]


def test_memory_in_use_without_a_listed_process_is_busy_past_the_threshold():
    hidden = lambda gid: gpu(gid, used=12.0)  # noqa: E731
    assert "12.00 GiB in use by no listed process" in gpus.check("cuda", 1, reader=reader_of(hidden), env={}).refused
    assert gpus.check("cuda", 1, BusyPolicy(used_threshold_gib=20), reader=reader_of(hidden), env={}).refused is None


def test_wait_polls_until_the_gpu_is_free_or_the_wait_is_over():
    now = [0.0]
    clock, sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    read = reader_of(HELD, HELD, FREE)
    check = gpus.check("cuda", 1, BusyPolicy(action="wait", wait_s=60, poll_s=5), reader=read, env={},
                       sleep=sleep, clock=clock)
    assert check.refused is None and check.waited_s == 10 and len(read.calls) == 3
    now[0] = 0.0
    check = gpus.check("cuda", 1, BusyPolicy(action="wait", wait_s=12, poll_s=5), reader=reader_of(HELD), env={},
                       sleep=sleep, clock=clock)
    assert check.refused.startswith("GPU busy: pid 4242") and "after waiting 12 s of gpu_busy_wait_s=12" in check.refused


def test_a_gpu_not_named_as_the_platform_says_is_refused_at_once_even_when_waiting():
    read = reader_of(FREE)
    check = gpus.check("cuda", 2, BusyPolicy(action="wait", wait_s=60), reader=read, env={},
                       gpu_name="H200", platform="h200", sleep=lambda s: pytest.fail("waited"))
    assert check.refused == ("wrong GPU: GPU 0 is 'Fake H100'; GPU 1 is 'Fake H100', "
                             "not platform h200's gpu_name 'H200' (nothing ran)")
    assert len(read.calls) == 1 and check.provenance()["gpu_state"]["gpus"][1]["name"] == "Fake H100"
    # case-insensitive; unset is not checked; a busy GPU of the right kind is still busy
    assert gpus.check("cuda", 1, reader=reader_of(FREE), env={}, gpu_name="h100").refused is None
    assert gpus.check("cuda", 1, reader=reader_of(FREE), env={}, gpu_name=None).refused is None
    assert gpus.check("cuda", 1, reader=reader_of(HELD), env={}, gpu_name="H100").refused.startswith("GPU busy")


def test_the_platform_files_name_their_gpus_and_an_unset_name_stays_out_of_the_spec():
    from llmbench.platforms import Platform
    assert Platform.load("h100").gpu_name == "H100" and Platform.load("h200").to_dict()["gpu_name"] == "H200"
    assert "gpu_name" not in Platform.load("cpu").to_dict()  # no CPU spec changed: no measured cell reruns


def test_no_nvml_does_not_stop_the_cell_and_says_why():
    def broken(ids):
        raise ModuleNotFoundError("No module named 'pynvml'")
    check = gpus.check("cuda", 1, reader=broken, env={})
    assert check.refused is None and "pynvml" in check.provenance()["gpu_state"]["error"]


def test_cpu_cells_read_nothing():
    def never(ids):
        raise AssertionError("read on a CPU")
    assert gpus.check("cpu", 1, reader=never).provenance() == {}


def test_the_policy_comes_from_the_config_and_the_schema_checks_it():
    assert BusyPolicy.from_config({}) == BusyPolicy()
    assert BusyPolicy.from_config({"gpu_busy": "wait", "gpu_busy_wait_s": 30}).wait_s == 30.0
    with pytest.raises(ValueError, match="gpu_busy: 'maybe' is not allowed"):
        BusyPolicy(action="maybe")
    base = {"protocol": {}}
    assert config.validate(dict(base), "config", "t")["gpu_busy"] == "error"
    with pytest.raises(config.ConfigError, match="gpu_busy"):
        config.validate({**base, "gpu_busy": "maybe"}, "config", "t")


def test_nvml_reads_which_gpu_it_is_and_what_bounds_its_speed(monkeypatch):
    """The board (UUID, PCIe link, SM clock, power limit) goes to the record's provenance with
    the memory state; a query the driver does not answer is left out, not an error. NVML is
    a stand-in module with pynvml's names."""
    import types

    class NVMLError(Exception):
        pass

    def unsupported(handle):
        raise NVMLError("Not Supported")

    mem = types.SimpleNamespace(total=80 * 2**30, used=2**29, free=80 * 2**30 - 2**29)
    fake = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_CLOCK_SM=1, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}", nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetComputeRunningProcesses=lambda h: [], nvmlDeviceGetGraphicsRunningProcesses=unsupported,
        nvmlDeviceGetUUID=lambda h: b"GPU-1234", nvmlDeviceGetCurrPcieLinkGeneration=lambda h: 1,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5, nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlDeviceGetMaxPcieLinkWidth=lambda h: 16, nvmlDeviceGetMaxClockInfo=lambda h, clock: 1980,
        nvmlDeviceGetEnforcedPowerLimit=unsupported)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    [info] = gpus.read_nvml(["0"])
    assert info.name == "NVIDIA H100 80GB HBM3" and info.used_gib == 0.5
    assert info.board == {"uuid": "GPU-1234", "pcie_gen": 1, "pcie_gen_max": 5, "pcie_width": 16,
                          "pcie_width_max": 16, "sm_clock_max_mhz": 1980}
    state = gpus.check("cuda", 1, reader=gpus.read_nvml, env={"CUDA_VISIBLE_DEVICES": "0"}).provenance()
    assert state["gpu_state"]["gpus"][0]["board"]["uuid"] == "GPU-1234"


def test_the_host_says_which_boot_of_which_machine_it_is():
    from llmbench import provenance

    host = provenance.host()
    assert host["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def no_claim():
    """This process holds no GPU claim before and after the test (gpus._HELD)."""
    def release():
        for fd in gpus._HELD.get("fds", ()):
            os.close(fd)
        gpus._HELD.clear()

    release()
    yield
    release()


def test_a_job_outside_a_scheduler_claims_free_gpus_of_a_larger_node(tmp_path, no_claim):
    """Several one-GPU jobs at once on a node of more GPUs (Snakemake's gpu_slots): each
    claims the lowest free one through a lock file and hands it to its workers through
    CUDA_VISIBLE_DEVICES (with CUDA's order NVML's), where each used to run on GPU 0."""
    env: dict[str, str] = {}
    assert gpus.claim_gpus(1, "cuda", env=env, total=2, lock_dir=tmp_path) == (["0"], None)
    assert env == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert gpus.cell_gpu_ids(1, "cuda", env) == ["0"]
    assert gpus.claim_gpus(1, "cuda", env=env, total=2, lock_dir=tmp_path) == (["0"], None)  # kept: a search's probes
    # another job's process gets the other GPU, and none is left for a third
    other = ("import json, sys; from pathlib import Path; from llmbench import gpus; env = {}; "
             f"got = gpus.claim_gpus(1, 'cuda', env=env, total=2, lock_dir=Path({str(tmp_path)!r})); "
             "print(json.dumps([got, env]))")
    out = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout
    assert json.loads(out) == [[["1"], None], {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}]
    held = gpus.lock_free(1, 2, tmp_path)  # that process ended: its GPU is free again
    assert held is not None and held[0] == ["1"]
    assert gpus.lock_free(1, 2, tmp_path) is None  # both held now
    # another count (a node of 3): GPU 0 goes back first, then the two lowest free are 0 and 2
    assert gpus.claim_gpus(2, "cuda", env=env, total=3, lock_dir=tmp_path) == (["0", "2"], None)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2" and gpus._HELD["ids"] == ["0", "2"]
    os.close(held[1][0])


def test_a_claim_waits_as_the_busy_policy_says_then_refuses(tmp_path, no_claim):
    held = gpus.lock_free(2, 2, tmp_path)
    clock, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        clock[0] += s

    ids, why = gpus.claim_gpus(1, "cuda", BusyPolicy(action="wait", wait_s=10), env={}, total=2, lock_dir=tmp_path,
                               sleep=sleep, clock=lambda: clock[0])
    assert ids is None and slept == [5.0, 5.0] and "after waiting 10 s of gpu_busy_wait_s=10" in why
    assert gpus.claim_gpus(1, "cuda", env={}, total=2, lock_dir=tmp_path) == (
        None, f"no 1 free GPU(s) of the node's 2: the others are claimed by other llmbench jobs ({tmp_path}; "
        "Snakemake's gpu_slots over the node's GPUs?) (nothing ran)")  # gpu_busy: error, at once
    for fd in held[1]:
        os.close(fd)


def test_nothing_is_claimed_on_a_cpu_under_a_scheduler_or_where_the_node_has_no_more_gpus(tmp_path, no_claim):
    for accelerator, env, total in [("cpu", {}, 8), ("cuda", {"CUDA_VISIBLE_DEVICES": "3"}, 8),
                                    ("cuda", {"SLURM_JOB_GPUS": "2"}, 8), ("cuda", {}, 1)]:
        before = dict(env)
        assert gpus.claim_gpus(1, accelerator, env=env, total=total, lock_dir=tmp_path) == (None, None)
        assert env == before
    assert not list(tmp_path.iterdir())


def test_a_cell_reads_the_gpu_it_claimed_and_its_log_says_so(tmp_path, monkeypatch, no_claim):
    """check_cell claims before it reads: the cell's state and log are of the claimed GPU;
    with none free the cell is refused by name, nothing read."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    for var in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(gpus.LOCK_DIR_VAR, str(tmp_path / "locks"))
    monkeypatch.setattr(gpus, "nvml_count", lambda: 2)
    read = reader_of(FREE)
    monkeypatch.setattr(gpus, "read_nvml", read)
    other = gpus.lock_free(1, 2, tmp_path / "locks")  # another job holds GPU 0
    spec = {"platform": {"accelerator": "cuda", "name": "h100", "gpu_name": "H100"}}
    log = tmp_path / "cell.log"
    check = gpus.check_cell(spec, 1, None, log)
    assert check.refused is None and read.calls == [["1"]] and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "=== GPU claim: GPU(s) 1 of the node's, for this job (CUDA_VISIBLE_DEVICES=1)" in log.read_text()
    for fd in gpus._HELD.pop("fds"):  # as if this job's process had ended
        os.close(fd)
    gpus._HELD.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    held = gpus.lock_free(1, 2, tmp_path / "locks")  # now both are held
    check = gpus.check_cell(spec, 1, None, log)
    assert check.refused.startswith("no 1 free GPU(s) of the node's 2") and read.calls == [["1"]]
    assert "=== GPU claim: no 1 free GPU(s)" in log.read_text()
    for fd in other[1] + held[1]:
        os.close(fd)
