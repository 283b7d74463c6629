"""What FP8 needs of the hardware, in one place: FP8 training (techniques FP8, FP8R;
llmbench.train.fsdp2_worker), the FP8 GEMM (llmbench.micro.gemm) and the grid's checks of
both (llmbench.grid). Torch is imported only to ask a GPU what it is."""

from __future__ import annotations

#: FP8 tensor cores: CUDA compute capability 8.9 and later (Ada, Hopper, Blackwell).
MIN_SM = (8, 9)
#: torch._scaled_mm wants every operand dim a multiple of this (16 bytes of float8).
DIM_MULTIPLE = 16


def dims_ok(*dims: int) -> bool:
    """Whether dims are all multiples of DIM_MULTIPLE (an FP8 GEMM's N and K; a linear's)."""
    return all(d % DIM_MULTIPLE == 0 for d in dims)


def check_device(what: str, accelerator: str, device=None) -> None:
    """Refuse ``what`` (an FP8 GEMM, FP8 training) where there are no FP8 tensor cores: a CPU,
    or a CUDA GPU before SM 8.9. ValueError naming the device."""
    if accelerator != "cuda":
        raise ValueError(f"{what} needs a CUDA GPU with FP8 tensor cores (SM 8.9+); this cell runs on "
                         f"{accelerator!r}")
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < MIN_SM:
        raise ValueError(f"{what} needs FP8 tensor cores (SM 8.9+: Ada, Hopper, Blackwell); "
                         f"{torch.cuda.get_device_name(device)} is SM {major}.{minor}")
