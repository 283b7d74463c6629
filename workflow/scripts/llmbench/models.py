"""Model architectures (config/models/*.yaml) and their random-initialised instances.

No weights are downloaded: a model is built from its config with random weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .config import REPO_ROOT, ConfigError, check_schema, load_named

#: Linear layers of a Llama decoder layer: LoRA's allowed targets (llmbench.grid), the weights a
#: 4-bit NF4 base holds (llmbench.nf4).
LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelSpec:
    """A Llama-architecture model, by its dimensions."""

    name: str
    """Model id (the file name)."""
    architecture: str
    """Architecture family ('llama')."""
    hidden_size: int
    """Width d."""
    intermediate_size: int
    """SwiGLU MLP width."""
    num_hidden_layers: int
    """Decoder layers L."""
    num_attention_heads: int
    """Query heads."""
    num_key_value_heads: int
    """Key/value heads (fewer than query heads: GQA)."""
    vocab_size: int
    """Vocabulary size."""
    max_position_embeddings: int = 4096
    """RoPE table length."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    rope_theta: float = 10000.0
    """RoPE base."""
    tie_word_embeddings: bool = False
    """Share embedding and lm_head weights."""
    rope_scaling: dict | None = None
    """RoPE frequency scaling (Llama 3.1's rope_type llama3 and its factors); None: plain RoPE."""

    def __post_init__(self) -> None:
        # types and bounds as the model schema says (a spec made without the workflow's
        # validation, e.g. from a record, accepts what a model file may say), then what one
        # key asks of another, which a schema cannot say and a worker would fail on
        check_schema(self.to_dict(), "", "", schema="model")
        d, heads, kv = self.hidden_size, self.num_attention_heads, self.num_key_value_heads
        if d % heads:
            raise ValueError(f"num_attention_heads: {heads} does not divide hidden_size {d} "
                             "(each head is hidden_size / num_attention_heads wide)")
        if (d // heads) % 2:
            raise ValueError(f"num_attention_heads: {heads} gives heads {d // heads} wide (hidden_size {d}); "
                             "RoPE rotates pairs of dimensions, so the width must be even")
        if heads % kv:
            raise ValueError(f"num_key_value_heads: {kv} does not divide num_attention_heads {heads} "
                             "(grouped-query attention shares each key/value head among a whole group)")
        if self.rope_scaling is not None:
            rs = self.rope_scaling
            if rs["high_freq_factor"] <= rs["low_freq_factor"]:
                raise ValueError(f"rope_scaling.high_freq_factor: {rs['high_freq_factor']} is not above "
                                 f"low_freq_factor {rs['low_freq_factor']} (the band between them is interpolated)")
            if rs["original_max_position_embeddings"] >= self.max_position_embeddings:
                raise ValueError(f"rope_scaling.original_max_position_embeddings: "
                                 f"{rs['original_max_position_embeddings']} is not below max_position_embeddings "
                                 f"{self.max_position_embeddings} (scaling extends the original context)")

    @classmethod
    def load(cls, name: str, root: Path = REPO_ROOT) -> ModelSpec:
        """Load and validate config/models/<name>.yaml (ConfigError naming the file and key)."""
        data = load_named("model", name, root)
        try:
            return cls(**data)
        except ValueError as exc:
            raise ConfigError(f"{root / 'config' / 'models' / f'{name}.yaml'}: {exc}") from None

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        """Inverse of to_dict (a run spec's model, a record's)."""
        return cls(**data)

    def to_dict(self) -> dict:
        """Plain-data form. Without RoPE scaling the key is left out, so the run specs (and the
        records) of models that have none read as they did before the key existed."""
        out = {f: getattr(self, f) for f in self.__slots__}
        if out["rope_scaling"] is None:
            del out["rope_scaling"]
        else:
            out["rope_scaling"] = dict(out["rope_scaling"])
        return out

    def __hash__(self) -> int:
        # the dataclass's own hash would hash the rope_scaling dict, and fail
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    @property
    def family(self) -> str:
        """The model family as calibrations tell families apart: the architecture, and its RoPE
        scaling where it has one (Llama 3.1: 'llama+rope-llama3'; Llama 2: 'llama'). Width,
        depth, heads and vocabulary are dimensions of their own, not part of the family."""
        if self.rope_scaling is None:
            return self.architecture
        return f"{self.architecture}+rope-{self.rope_scaling['rope_type']}"

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.hidden_size // self.num_attention_heads

    def param_counts(self) -> dict[str, int]:
        """Exact parameter counts of the transformers Llama built from this spec."""
        d, f, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        kv = self.num_key_value_heads * self.head_dim
        attn = d * d * 2 + d * kv * 2  # q, o: d x d; k, v: d x kv
        mlp = 3 * d * f
        norms = 2 * d
        layers = L * (attn + mlp + norms)
        embed = self.vocab_size * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return {
            "embedding": embed,
            "lm_head": head,
            "decoder_linear": L * (attn + mlp),
            "total": embed + layers + d + head,  # + final norm
            # PaLM/torchtitan convention for MFU: parameters that do matmul work per token,
            # i.e. everything but the embedding lookup (lm_head does count).
            "non_embedding": layers + d + head,
        }

    def hf_config(self, attn_implementation: str = "sdpa"):
        """A transformers LlamaConfig for this spec."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            vocab_size=self.vocab_size,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_word_embeddings,
            rope_scaling=dict(self.rope_scaling) if self.rope_scaling else None,
            attention_bias=False,
            mlp_bias=False,
            use_cache=False,
            attn_implementation=attn_implementation,
        )


def flops_per_token(model: ModelSpec, seq_len: int, frozen_base: bool = False) -> float:
    """Training FLOPs per token, PaLM convention: 6N + 12·L·d·s.

    N = non-embedding parameters (forward 2N, backward 4N per token); 12·L·d·s counts the
    attention score and value matmuls (QK^T and PV) forward and backward. Recomputation
    is not counted (model FLOPs, not hardware FLOPs). With a frozen base (adapters), the
    backward pass computes input gradients only: 4N instead of 6N (adapters are negligible).
    """
    n = model.param_counts()["non_embedding"]
    return (4.0 if frozen_base else 6.0) * n + 12.0 * model.num_hidden_layers * model.hidden_size * seq_len


MFU_FORMULA = (
    "mfu = tokens_per_s * (6*N + 12*L*d*s) / (gpus * peak_bf16_flops) (4*N for a frozen base "
    "with adapters); N = non-embedding params, L layers, d width, s seq_len "
    "(PaLM, Chowdhery et al. 2022, App. B)"
)
