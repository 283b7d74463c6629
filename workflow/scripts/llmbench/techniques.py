"""The technique grammar: "F+R+Z3+O" parsed into flags, in one place.

Flags (paper, Section IV-A):
  F   FlashAttention (GPU: flash-attn if installed, else PyTorch's flash SDPA kernel;
      CPU: SDPA's default kernel; without F: eager attention on GPU, SDPA math on CPU)
  R   activation recomputation (gradient checkpointing of every decoder layer)
  Z2  DeepSpeed ZeRO stage 2 (optimizer state and gradients sharded)
  Z3  DeepSpeed ZeRO stage 3 (optimizer state, gradients and parameters sharded)
  O   CPU offload: with Z2 the optimizer state, with Z3 optimizer state and parameters
  Q   4-bit NF4 weights with double quantization (bitsandbytes, as QLoRA)
  C   torch.compile of every decoder layer (inductor; beyond the paper: fuses the norms,
      RoPE, SwiGLU and residual adds that run as separate memory-bound kernels otherwise)
  FP8   FP8 training of the decoder's linears, tensorwise scaling (torchao.float8; beyond the
        paper: FP8 tensor cores, SM 8.9+: Ada, Hopper and later)
  FP8R  the same with rowwise scaling (one scale per row: finer, slower casts)
Fine-tuning methods (paper Section V, Table IX; one per technique, written first):
  L     LoRA (PEFT) on a bf16 base
  QL    QLoRA: LoRA on a 4-bit NF4 base (Q implied; "L+Q" means the same)
  LFA   LoRA-FA: LoRA with the A matrices frozen (Zhang et al. 2023, the paper's authors)
  DORA  DoRA: weight-decomposed LoRA (PEFT use_dora)
  PT    prompt tuning (PEFT): trainable virtual-token embeddings, frozen model
"Naive" is the empty set (ZeRO stage 0, nothing else). Order does not matter on input;
the canonical name orders flags as the paper prints them (F+R+Z3+O, R+Q, QL+F+R).
The flags are DeepSpeed's terms; another backend states what each means on it and which
flags and combinations it does not run (llmbench.backends: FSDP2's Z3 is resharding after
forward, its Z2 no resharding; DeepSpeed does not run C with Z3). FP8 and FP8R are one
choice (the scaling recipe), exclusive, and pre-training only: float8 training converts the
trained full-precision linears, which neither a 4-bit base (Q) nor an adapter's frozen base is.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

NAIVE = "Naive"
#: Canonical order of flags in names and paths (the paper's Tables III and IV order).
FLAG_ORDER: tuple[str, ...] = ("F", "R", "Z2", "Z3", "O", "Q", "C", "FP8", "FP8R")
#: FP8 flags -> torchao's float8 recipe name (Float8LinearConfig.from_recipe_name).
FP8_RECIPES: dict[str, str] = {"FP8": "tensorwise", "FP8R": "rowwise"}
#: Fine-tuning method tokens -> (adapter kind, implies 4-bit base).
ADAPTERS: dict[str, tuple[str, bool]] = {
    "L": ("lora", False),
    "QL": ("lora", True),
    "LFA": ("lora_fa", False),
    "DORA": ("dora", False),
    "PT": ("prompt_tuning", False),
}
FLAG_MEANING: dict[str, str] = {
    "F": "FlashAttention",
    "R": "activation recomputation",
    "Z2": "ZeRO stage 2",
    "Z3": "ZeRO stage 3",
    "O": "CPU offload (Z2: optimizer state; Z3: optimizer state and parameters)",
    "Q": "4-bit NF4 weights with double quantization",
    "C": "torch.compile of every decoder layer (inductor)",
    "FP8": "FP8 training of the decoder's linears, tensorwise scaling (torchao.float8)",
    "FP8R": "FP8 training of the decoder's linears, rowwise scaling (torchao.float8)",
}


class TechniqueError(ValueError):
    """A technique string that does not parse or contradicts itself."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Technique:
    """One point of the technique axis, as flags."""

    zero_stage: int = 0
    """DeepSpeed ZeRO stage: 0 (none), 2 or 3."""
    offload: bool = False
    """Offload to CPU RAM (requires zero_stage 2 or 3)."""
    recompute: bool = False
    """Activation recomputation (gradient checkpointing)."""
    flash: bool = False
    """FlashAttention kernels."""
    quant4: bool = False
    """4-bit NF4 base weights with double quantization (bitsandbytes)."""
    compiled: bool = False
    """Decoder layers compiled by torch.compile (regional compilation)."""
    adapter: str | None = None
    """Fine-tuning method: lora | lora_fa | dora | prompt_tuning (None: full parameters)."""
    fp8: str | None = None
    """FP8 training recipe of the decoder's linears: tensorwise | rowwise (None: no FP8)."""

    def __post_init__(self) -> None:
        if self.fp8 is not None and self.fp8 not in FP8_RECIPES.values():
            raise TechniqueError(f"fp8 must be one of {sorted(FP8_RECIPES.values())} or None, got {self.fp8!r}")
        if self.adapter is not None and self.adapter not in {a for a, _ in ADAPTERS.values()}:
            raise TechniqueError(f"unknown adapter {self.adapter!r}")
        if self.zero_stage not in (0, 2, 3):
            raise TechniqueError(f"zero_stage must be 0, 2 or 3, got {self.zero_stage}")
        if self.offload and self.zero_stage == 0:
            raise TechniqueError("O (offload) needs Z2 or Z3: DeepSpeed offloads ZeRO partitions")

    @property
    def flags(self) -> tuple[str, ...]:
        """The set flags in canonical order."""
        on = {
            "F": self.flash,
            "R": self.recompute,
            "Z2": self.zero_stage == 2,
            "Z3": self.zero_stage == 3,
            "O": self.offload,
            "Q": self.quant4,
            "C": self.compiled,
            **{flag: self.fp8 == recipe for flag, recipe in FP8_RECIPES.items()},
        }
        return tuple(f for f in FLAG_ORDER if on[f])

    @property
    def adapter_token(self) -> str | None:
        """The fine-tuning method token (QL for LoRA on a 4-bit base), or None."""
        if self.adapter is None:
            return None
        if self.adapter == "lora" and self.quant4:
            return "QL"
        return next(tok for tok, (kind, _) in ADAPTERS.items() if kind == self.adapter)

    @property
    def name(self) -> str:
        """Canonical name, used in paths and tables ("Naive" when no flag is set)."""
        head = self.adapter_token
        flags = [f for f in self.flags if not (head == "QL" and f == "Q")]
        return "+".join(([head] if head else []) + flags) or NAIVE


@functools.lru_cache(maxsize=1024)
def parse(text: str) -> Technique:
    """Parse "F+R+Z3+O" (any order, any case of "naive") into a Technique.

    Raises TechniqueError naming the bad token and the allowed ones. Memoised: a pure
    function of its string returning a frozen Technique, so a caller may parse wherever it
    needs the flags (a grid's cells, a record's workload) without parsing the text again.
    """
    if not isinstance(text, str) or not text.strip():
        raise TechniqueError(f"technique must be a non-empty string, got {text!r}")
    if text.strip().lower() == NAIVE.lower():
        return Technique()
    tokens = [t.strip() for t in text.split("+")]
    allowed = ", ".join(FLAG_ORDER + tuple(ADAPTERS))
    seen: set[str] = set()
    adapters = []
    for tok in tokens:
        if tok.upper() in ADAPTERS and tok not in FLAG_MEANING:
            adapters.append(tok.upper())
            continue
        if tok not in FLAG_MEANING:
            raise TechniqueError(
                f"unknown flag {tok!r} in technique {text!r}; flags are {allowed} "
                f"joined with '+', or {NAIVE!r}"
            )
        if tok in seen:
            raise TechniqueError(f"flag {tok!r} repeated in technique {text!r}")
        seen.add(tok)
    if len(adapters) > 1:
        raise TechniqueError(f"technique {text!r} names several fine-tuning methods {adapters}; choose one")
    adapter, implies_q = ADAPTERS[adapters[0]] if adapters else (None, False)
    fp8 = sorted(seen & set(FP8_RECIPES))
    if len(fp8) > 1:
        raise TechniqueError(f"technique {text!r} asks for both FP8 (tensorwise) and FP8R (rowwise); choose one "
                             "FP8 recipe")
    if fp8 and ("Q" in seen or implies_q):
        raise TechniqueError(f"technique {text!r}: {fp8[0]} (FP8 training) and 4-bit weights (Q) are two formats "
                             "of one weight; choose one")
    if fp8 and adapter is not None:
        raise TechniqueError(f"technique {text!r}: {fp8[0]} (FP8 training) converts the trained full-precision "
                             f"linears; fine-tuning methods train adapters on a frozen base, so {fp8[0]} goes in "
                             "pretrain blocks only")
    if {"Z2", "Z3"} <= seen:
        raise TechniqueError(f"technique {text!r} asks for both Z2 and Z3; choose one ZeRO stage")
    if "O" in seen and not seen & {"Z2", "Z3"}:
        raise TechniqueError(
            f"technique {text!r}: O (offload) needs Z2 or Z3 (DeepSpeed offloads ZeRO partitions)"
        )
    return Technique(
        zero_stage=3 if "Z3" in seen else 2 if "Z2" in seen else 0,
        offload="O" in seen,
        recompute="R" in seen,
        flash="F" in seen,
        quant4="Q" in seen or implies_q,
        compiled="C" in seen,
        adapter=adapter,
        fp8=FP8_RECIPES[fp8[0]] if fp8 else None,
    )


def canonical(text: str) -> str:
    """The canonical name of a technique string."""
    return parse(text).name
