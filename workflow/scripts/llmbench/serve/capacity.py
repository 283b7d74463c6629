"""How much an engine can hold before it runs: the KV cache it will reserve on a platform,
how many requests of a length it keeps resident, and whether the model fits at all (the
advisor's serving parts, llmbench.report.advice; ``python -m llmbench.serve.capacity``).

An engine reserves a share of each GPU's memory for the weights and the KV cache (vLLM
``--gpu-memory-utilization``, SGLang ``--mem-fraction-static``: llmbench.serve.engines), keeps
part of it for itself (activations of its largest prefill batch, sampling buffers, CUDA
graphs: OVERHEAD_GIB), and fills the rest with KV blocks::

    kv_tokens = (share x GPU GiB - weights / t - overhead) / (2 x layers x kv_heads_per_gpu x head_dim x 2 B)

with t the tensor-parallel size, the weights in bf16 sharded over the t GPUs, and
kv_heads_per_gpu = max(1, kv_heads / t) (an engine replicates a key/value head where t exceeds
them). A request of n tokens (input and output) holds n of those tokens, so kv_tokens // n
requests are resident at once; more in flight wait for blocks, which is where a sweep's
throughput stops growing. OVERHEAD_GIB is what the committed records leave over once their
engines' own KV reports are taken out (tests/calibration/test_serving_capacity.py keeps every
one within CALIBRATION_TOLERANCE). LightLLM takes its KV size from its launch
(``--max_total_token_num``): nothing to predict.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..models import ModelSpec
from . import engines
from .model_dir import GIB
from .model_dir import WEIGHT_BYTES as BF16_BYTES  # the dtype of the folder's weights, and so of the KV cache

#: GiB per GPU an engine keeps for itself inside its share, from the committed records
#: (h200, llama2-7b/13b/70b and llama3.1-8b, tensor parallel 1 and 2): vLLM 1.08-1.92,
#: SGLang 1.11-1.16 (the module docstring's formula solved for it)
OVERHEAD_GIB = {"vllm": 1.6, "sglang": 1.15}
#: the share of GPU memory each engine reserves as llmbench launches it
SHARE = {"vllm": engines.VLLM_GPU_MEMORY_UTILIZATION, "sglang": engines.SGLANG_MEM_FRACTION}
#: how close a prediction from a record's own GPU total and share must come to its engine's
#: KV report (relative)
CALIBRATION_TOLERANCE = 0.01


@dataclass(frozen=True)
class Capacity:
    """An engine's predicted KV cache on ``gpus`` GPUs of ``gpu_gib`` each."""

    engine: str
    gpus: int
    weights_gib: float
    """Per GPU, bf16, sharded over the tensor-parallel GPUs."""
    budget_gib: float
    """Per GPU: the share less the weights and the engine's own overhead (negative: no fit)."""
    kv_bytes_per_token: int
    """Per GPU."""

    @property
    def fits(self) -> bool:
        return self.budget_gib > 0

    @property
    def kv_tokens(self) -> int:
        return max(0, int(self.budget_gib * GIB // self.kv_bytes_per_token))

    def resident(self, tokens_per_request: int) -> int:
        """How many requests of that many tokens (input + output) the cache holds at once."""
        return resident(self.kv_tokens, tokens_per_request)

    def why_not(self) -> str:
        return "" if self.fits else (
            f"weights {self.weights_gib:.1f} GiB a GPU (tensor parallel {self.gpus}) and the engine's "
            f"{OVERHEAD_GIB[self.engine]} GiB exceed its share of the GPU by {-self.budget_gib:.1f} GiB")


def resident(kv_tokens, tokens_per_request):
    """How many requests of ``tokens_per_request`` tokens (input + output) a KV cache of
    ``kv_tokens`` holds at once (numbers, or pandas Series of them)."""
    return kv_tokens // tokens_per_request


def kv_bytes_per_token(model: ModelSpec, gpus: int) -> int:
    """Bytes of K and V a token holds on each of ``gpus`` tensor-parallel GPUs (bf16)."""
    heads = max(1, model.num_key_value_heads // gpus)
    return 2 * model.num_hidden_layers * heads * model.head_dim * BF16_BYTES


def predict(engine: str, model: ModelSpec, gpu_gib: float, gpus: int = 1, share: float | None = None,
            overhead_gib: float | None = None) -> Capacity:
    """The KV cache ``engine`` (vllm or sglang) reserves for ``model`` on ``gpus`` GPUs of
    ``gpu_gib`` each, at its launch share (SHARE) unless given."""
    if engine not in SHARE:
        raise ValueError(f"engine: {engine!r} has no KV-cache model (one of {sorted(SHARE)}; LightLLM's KV size "
                         "is its launch's --max_total_token_num)")
    if gpus < 1:
        raise ValueError(f"gpus: {gpus} is not a GPU count")
    share = SHARE[engine] if share is None else share
    overhead = OVERHEAD_GIB[engine] if overhead_gib is None else overhead_gib
    weights = model.param_counts()["total"] * BF16_BYTES / GIB / gpus
    return Capacity(engine=engine, gpus=gpus, weights_gib=weights, budget_gib=share * gpu_gib - weights - overhead,
                    kv_bytes_per_token=kv_bytes_per_token(model, gpus))


def main(argv: list[str] | None = None) -> int:
    """``python -m llmbench.serve.capacity --platform h200 --model llama2-70b --gpus 2``: each
    engine's predicted KV tokens and resident requests, runs nothing."""
    from ..platforms import Platform

    p = argparse.ArgumentParser(prog="python -m llmbench.serve.capacity", description=main.__doc__)
    p.add_argument("--platform", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--tokens", type=int, default=640, help="a request's input + output tokens (default 512 + 128)")
    args = p.parse_args(argv)
    plat, model = Platform.load(args.platform), ModelSpec.load(args.model)
    for engine in SHARE:
        c = predict(engine, model, plat.gpu_memory_gib, args.gpus)
        print(f"{engine}: " + (f"{c.kv_tokens:,} KV tokens, {c.resident(args.tokens):,} requests of {args.tokens} "
                               f"tokens resident" if c.fits else f"does not fit: {c.why_not()}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
