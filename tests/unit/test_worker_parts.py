"""Parts of the training workers that need no worker process: the phase clock of a repeat
(llmbench.train.scenario.Phases), the frozen-base checksum (llmbench.train.adapters) and
what the worker contract counts as out of memory (llmbench.train.contract.is_oom)."""

import time

import torch

from llmbench.train import adapters, contract, scenario


def test_phases_are_consecutive_intervals():
    phases = scenario.Phases()
    time.sleep(0.02)
    phases.mark("build")
    phases.mark("window")
    s = phases.seconds
    assert list(s) == ["phase_start_s", "phase_build_s", "phase_window_s"]
    assert s["phase_build_s"] >= 0.02 and 0 <= s["phase_window_s"] < s["phase_build_s"]
    # from this process's start: positive, and no older than the process
    assert 0 < s["phase_start_s"] <= scenario.process_age_s()


def test_rank_0_says_each_phase_in_its_log_as_it_passes_it(capsys, monkeypatch):
    """A repeat killed part-way (a call's deadline) leaves in its log the phases it finished."""
    monkeypatch.setenv("RANK", "0")
    phases = scenario.Phases()
    phases.mark("build")
    assert capsys.readouterr().err == f"llmbench: phase build done: {phases.seconds['phase_build_s']:.1f} s\n"
    monkeypatch.setenv("RANK", "1")  # one line a cell, not one a rank
    phases.mark("window")
    assert capsys.readouterr().err == ""


def test_frozen_checksum_is_the_float64_sum_of_frozen_storage():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[0].requires_grad_(False)
    packed = torch.nn.Parameter(torch.randint(0, 255, (16,), dtype=torch.uint8), requires_grad=False)
    model.register_parameter("packed", packed)  # 4-bit bases are uint8 storage
    want = sum(p.detach().to(torch.float64).sum().item() for p in (model[0].weight, model[0].bias, packed))
    before = adapters.frozen_checksum(model)
    assert before == want
    with torch.no_grad():
        model[1].weight.add_(1.0)  # a trained parameter moves: not part of the checksum
    assert adapters.frozen_checksum(model) == before
    with torch.no_grad():
        model[0].weight[0, 0] += 1.0
    assert adapters.frozen_checksum(model) != before


def test_out_of_memory_is_the_allocators_and_nccls_and_cublass_device_allocations_not_any_nccl_error():
    assert contract.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 202.00 MiB"))
    assert contract.is_oom(MemoryError())
    # NCCL's first communicator could not get GPU memory (one H100, 7B QLoRA at batch 21)
    nccl = ("NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:93, unhandled cuda error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.28.9\nncclUnhandledCudaError: Call to CUDA function failed.\n"
            "Last error:\nFailed to CUDA calloc async 608 bytes")
    assert contract.is_oom(RuntimeError(nccl))
    illegal = nccl.replace("Failed to CUDA calloc async 608 bytes", "Cuda failure 700 'an illegal memory access'")
    assert not contract.is_oom(RuntimeError(illegal))
    assert not contract.is_oom(RuntimeError("NCCL error: remote process exited or there was a network error"))
    # the autograd thread's cuBLAS handle found no GPU memory (one H100, 7B L+F at batch 23)
    assert contract.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not contract.is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`"))
