"""The model directory a serving engine loads: config, random weights, a matching tokenizer.

Nothing comes from a hub. The directory holds
  config.json              the Llama config of the model spec (transformers' format)
  generation_config.json   greedy decoding, and no EOS token (below)
  model.safetensors        random bf16 weights as transformers initialises them (llmbench.train.build.init_random),
                           seeded (omitted with weights="dummy":
                           engines that can, e.g. vLLM's --load-format dummy, make their own)
  tokenizer.json           a word-level tokenizer whose token for id i is the word "t<i>"
  tokenizer_config.json, special_tokens_map.json

The tokenizer makes text and token ids interchangeable: the synthetic prompt
``"t17 t2005 ..."`` (llmbench.serve.loadgen.prompt_text) tokenizes to exactly the ids
17, 2005, ..., so engines whose API takes text (TGI, LightLLM, transformers serve) get
the same prompts, token for token, as engines that take ids (vLLM).

Ids 0, 1, 2 are <unk>, <s>, </s> as in Llama 2; synthetic prompts never use them
(loadgen's token_offset). The generation config names no EOS token, so an engine
without an ``ignore_eos`` request option (TGI) still generates the full max_new_tokens
from random weights; the load generator checks and reports any shortfall anyway.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..models import ModelSpec

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
#: First id a synthetic prompt may use (ids below are the special tokens).
TOKEN_OFFSET = len(SPECIAL_TOKENS)
WEIGHTS = ("random", "dummy")
#: Bytes a weight takes: bf16, the folder's dtype (config.json), in the safetensors files and in
#: host memory while filled; an engine holds it, and its KV cache, in the same dtype (serve.capacity).
WEIGHT_BYTES = 2
#: Room beyond the weights the check asks for (safetensors headers, config and tokenizer files).
ROOM_MARGIN = 1.02
GIB = 2**30


class NoRoom(RuntimeError):
    """The node cannot hold a model directory's random weights (disk or host memory)."""


def word(i: int) -> str:
    """The vocabulary word of token id ``i`` (special tokens keep their Llama names)."""
    return SPECIAL_TOKENS[i] if i < TOKEN_OFFSET else f"t{i}"


def tokenizer_json(vocab_size: int) -> dict:
    """A tokenizers-library WordLevel tokenizer: whitespace split, "t<i>" <-> i."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {word(i): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # decode joins words with spaces (WordPiece's decoder without a continuation prefix)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return json.loads(tok.to_str())


def build(spec: ModelSpec, out_dir: Path | str, weights: str = "random", seed: int = 0, threads: int = 1) -> Path:
    """Write the model directory for ``spec`` into ``out_dir``; returns it. ``threads``
    fill the random weights, one tensor each at a time."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    out = Path(out_dir)
    if weights == "random":
        check_room(spec, out)
    out.mkdir(parents=True, exist_ok=True)
    config = spec.hf_config()
    config.use_cache = True  # serving: the KV cache is the point
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, None
    config.dtype = "bfloat16"
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    _legacy_keys(out)
    # greedy, no EOS: every engine generates max_new_tokens (see the module docstring)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 1, "eos_token_id": [], "do_sample": False, "_from_model_config": False}, indent=2))
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json(spec.vocab_size)))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": spec.max_position_embeddings,
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>",
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>"}, indent=2))
    if weights == "random":
        _write_random_weights(spec, out, seed, threads)
    return out


def folder_bytes(spec: ModelSpec) -> float:
    """The room a model directory of ``spec``'s random bf16 weights asks for, on disk and in
    host memory while they are filled (ROOM_MARGIN over the weights)."""
    return spec.param_counts()["total"] * WEIGHT_BYTES * ROOM_MARGIN


def check_room(spec: ModelSpec, out: Path) -> None:
    """Raise NoRoom, before anything is written, where the disk under ``out`` or the host's
    available memory cannot hold ``spec``'s random bf16 weights: they are filled in host
    memory and saved whole (llama2-70b: 128 GiB of each), and a node short of either would
    fail minutes later with a full disk or a killed job rather than this message."""
    need = spec.param_counts()["total"] * WEIGHT_BYTES
    room = folder_bytes(spec)
    base = out
    while not base.exists():  # the folder is made later: measure the disk it will be on
        base = base.parent
    free = shutil.disk_usage(base).free
    hint = ("engines that initialise their own weights need no folder of them (serve block key weights: dummy; "
            "vLLM and SGLang), LightLLM and TGI read safetensors")
    if room > free:
        raise NoRoom(f"{spec.name}: its random bf16 weights take {need / GIB:.1f} GiB, but the disk of {base} has "
                     f"{free / GIB:.1f} GiB free; {hint}")
    avail = mem_available_bytes()
    if avail is not None and room > avail:
        raise NoRoom(f"{spec.name}: its random bf16 weights take {need / GIB:.1f} GiB of host memory while they "
                     f"are filled, but {avail / GIB:.1f} GiB is available; {hint}")


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The host memory available to a new process (Linux's MemAvailable), or None where
    the kernel does not say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _write_random_weights(spec: ModelSpec, out: Path, seed: int, threads: int) -> None:
    """Random bf16 weights, saved as safetensors: the training builds' initialiser
    (llmbench.train.build.init_random), seeded per tensor so the files are reproducible."""
    import torch
    from transformers import LlamaForCausalLM

    from ..train.build import init_random

    config = spec.hf_config()
    with torch.device("meta"):  # no serial default initialisation first
        model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    model = model.to_empty(device="cpu")
    init_random(model, config.initializer_range, seed=seed, threads=threads)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
    # save_pretrained rewrites config.json from the training config: restore the serving one
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(use_cache=True, bos_token_id=1, eos_token_id=2)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    _legacy_keys(out)


def _legacy_keys(out: Path) -> None:
    """Also write the config keys older engines read (transformers 5 nests rope_theta and the
    RoPE scaling in rope_parameters and renamed torch_dtype; LightLLM 2024, TGI and
    transformers 4 read rope_theta and rope_scaling)."""
    cfg = json.loads((out / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default":  # Llama 3.1's llama3 scaling
        cfg.setdefault("rope_scaling", {k: v for k, v in rope.items() if k != "rope_theta"})
    cfg.setdefault("torch_dtype", cfg.get("dtype", "bfloat16"))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
