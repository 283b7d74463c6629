"""Hardware platforms (config/platforms/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .config import REPO_ROOT, load_named

#: Short names of dtypes, as records, tables and docs write them.
DTYPE_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}
#: The compute dtypes a platform may ask for (its compute_dtype), by short name.
DTYPE_NAMES = {name: DTYPE_SHORT[name] for name in ("bfloat16", "float32")}


#: Optional fields that a cell spec carries only where a platform file sets them.
_OMIT_UNSET = ("gpu_name", "peak_fp8_tflops", "peak_fp8_source", "disk_gib")


@dataclass(kw_only=True, slots=True, frozen=True)
class Platform:
    """One hardware platform: what a cell runs on."""

    name: str
    """Platform id (the file name)."""
    description: str
    """Human-readable hardware summary."""
    accelerator: str
    """'cuda' or 'cpu'."""
    gpus_per_node: int
    """GPUs per node (CPU: ranks per node)."""
    gpu_memory_gib: float | None
    """Memory per GPU in GiB."""
    peak_bf16_tflops: float | None
    """Dense bf16 peak per GPU in TFLOP/s (None: no MFU)."""
    peak_source: str
    """Datasheet row the peak comes from."""
    peak_fp8_tflops: float | None = None
    """Dense FP8 (e4m3, FP32 accumulate) tensor peak per GPU in TFLOP/s; None: the platform
    has no FP8 tensor cores (before SM 8.9), and FP8 cells are refused on it."""
    peak_fp8_source: str | None = None
    """Datasheet row the FP8 peak comes from (required with peak_fp8_tflops)."""
    interconnect: str
    """GPU-GPU link."""
    compute_dtype: str = "bfloat16"
    """Dtype training and profile cells compute in: 'bfloat16' (the paper's) or 'float32'."""
    supports_4bit: bool = True
    """bitsandbytes 4-bit (Q, QL) runs on this platform."""
    gpu_name: str | None = None
    """Text in every GPU's product name (NVML's, case-insensitive), e.g. 'H100': a cell on
    GPUs named otherwise is refused (llmbench.gpus). None: not checked."""
    disk_gib: float | None = None
    """Disk free for results/ on this platform's nodes, in GiB (the serving cells' model
    folders): the plan's fit notes read it; None: not known. No cell spec carries it."""
    fork_server: bool = False
    """Fork each repeat's ranks from a warm server (llmbench.forkserver), not exec them."""
    env: dict = field(default_factory=dict)
    """Environment variables for every process of a cell."""
    slurm: dict = field(default_factory=dict)
    """Slurm defaults: partition, gres, cpus_per_task, mem_mb."""

    def __post_init__(self) -> None:
        if self.peak_fp8_tflops is not None and not self.peak_fp8_source:
            raise ValueError(f"platform {self.name!r}: peak_fp8_tflops needs peak_fp8_source (its datasheet row)")
        if self.peak_fp8_tflops is not None and self.accelerator != "cuda":
            raise ValueError(f"platform {self.name!r}: peak_fp8_tflops is for CUDA GPUs with FP8 tensor cores, "
                             f"not accelerator {self.accelerator!r}")

    @property
    def supports_fp8(self) -> bool:
        """FP8 tensor cores (SM 8.9+): FP8 training cells and FP8 GEMMs run here."""
        return self.peak_fp8_tflops is not None

    @classmethod
    def load(cls, name: str, root: Path = REPO_ROOT) -> Platform:
        """Load and validate config/platforms/<name>.yaml."""
        return cls(**load_named("platform", name, root))

    @classmethod
    def from_dict(cls, data: dict) -> Platform:
        """Inverse of to_dict; a run spec's platform too, which leaves ``slurm`` out
        (llmbench.grid.Grid.spec) and, in an older spec, keys added since (their defaults)."""
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain-data form (for cell specs and provenance). An optional key added later is
        left out where unset, so that it changes no spec, and reruns no measured cell, of a
        platform that does not set it (the spec is Snakemake's params rerun trigger)."""
        return {f: getattr(self, f) for f in self.__slots__ if f not in _OMIT_UNSET or getattr(self, f) is not None}


def compute_dtype(platform: Platform | dict):
    """The torch dtype a platform's training and profile cells compute in (a Platform, or a
    cell spec's platform dict; ``compute_dtype`` is bfloat16, the paper's, unless the file
    says float32)."""
    import torch

    name = platform.compute_dtype if isinstance(platform, Platform) else platform.get("compute_dtype", "bfloat16")
    return getattr(torch, name)


def dtype_name(dtype) -> str:
    """'bf16' or 'fp32' for a torch dtype, as records and docs write it."""
    return DTYPE_NAMES[str(dtype).removeprefix("torch.")]
