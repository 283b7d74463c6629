"""The grid: config blocks expanded into Cells, and the path grammar of their records.

Path grammar (relative to results_dir):
    runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json
A Cell's path is a pure function of these fields; every other field (protocol, caps) must
agree between blocks that produce the same path, or the grid is rejected.

The {backend} path component is the backend's name, except for Megatron-LM cells, whose
parallel layout is part of what is measured: ``megatron-tp{T}pp{P}`` and, with Megatron's
distributed optimizer, ``megatron-tp{T}pp{P}-distopt`` (data parallel = gpus / (T*P)
follows from the path's g{gpus}). Cell.backend stays "megatron"; the layout is Cell.parallel.
Every other backend's paths and specs are what they were before Megatron came.
"""

from __future__ import annotations

import copy
import itertools
import os
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from . import techniques
from .config import REPO_ROOT, ConfigError, available, load_yaml, validate
from .models import ModelSpec
from .platforms import Platform
from .protocol import Protocol

RECORD_PATTERN = (
    "runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json"
)
#: a max-batch search's folder: its probes' records (bs<N>/record.json) and search.json
SEARCH_PATTERN = (
    "runs/search/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}"
)
#: what a search learnt about a cell's memory, kept across reruns of the search
FRONTIER_PATTERN = "frontier/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}.json"
#: Serving cells (stage "serve"): one engine under one load.
SERVE_RECORD_PATTERN = "runs/serve/{platform}/{model}/{engine}/{load}-g{gpus}/record.json"
#: Microbenchmark cells (stage "micro"): one benchmark case on one platform.
MICRO_RECORD_PATTERN = "runs/micro/{platform}/{bench}/{case}-g{gpus}/record.json"
MICRO_BENCHES = ("gemm", "memcpy", "collectives")
#: Wildcard regexes for Snakemake (common.smk), one per path field.
WILDCARD_CONSTRAINTS: dict[str, str] = {
    "stage": "pretrain|finetune|profile",
    "platform": "[a-z0-9][a-z0-9-]*",
    "model": "[a-z0-9][a-z0-9.-]*",
    "backend": "[a-z]+|megatron-tp[0-9]+pp[0-9]+(-distopt)?",
    "technique": "[A-Za-z0-9+]+",
    "batch_size": "[0-9]+",
    "gpus": "[0-9]+",
    "engine": "[a-z]+",
    "load": "[a-z0-9][a-z0-9-]*",
    "bench": "|".join(MICRO_BENCHES),
    "case": "[a-z0-9][a-z0-9-]*",
}
TRAIN_KEY = ("stage", "platform", "model", "backend", "technique", "batch_size", "gpus")
SERVE_KEY = ("stage", "platform", "model", "engine", "load", "gpus")
MICRO_KEY = ("stage", "platform", "bench", "case", "gpus")
SEARCH_KEY = ("stage", "platform", "model", "backend", "technique", "gpus")


def layout_name(parallel: dict[str, Any] | None) -> str | None:
    """A Megatron cell's layout as in its path: tp{T}pp{P}, with -distopt for the
    distributed optimizer; None for a cell without one."""
    if parallel is None:
        return None
    opt = "-distopt" if parallel["distributed_optimizer"] else ""
    return f"tp{parallel['tensor_parallel']}pp{parallel['pipeline_parallel']}{opt}"


class _Addressed:
    """The path of a cell's record: a pure function of the fields its PATTERN names."""

    __slots__ = ()
    KEY: ClassVar[tuple[str, ...]]
    PATTERN: ClassVar[str]

    @property
    def key(self) -> dict[str, Any]:
        """The fields that name the cell's path."""
        return {k: getattr(self, k) for k in self.KEY}

    def record_path(self, results_dir: str = "results") -> str:
        """Where this cell's Record lives."""
        return f"{results_dir}/" + self.PATTERN.format(**self.key)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return asdict(self)


@dataclass(kw_only=True, slots=True, frozen=True)
class Cell(_Addressed):
    """One point of the grid: everything a runner needs to produce one Record."""

    KEY: ClassVar[tuple[str, ...]] = TRAIN_KEY
    PATTERN: ClassVar[str] = RECORD_PATTERN

    stage: str
    """Pipeline stage ('pretrain')."""
    platform: str
    """Platform id."""
    model: str
    """Model id."""
    backend: str
    """Training backend ('deepspeed')."""
    technique: str
    """Canonical technique name (llmbench.techniques)."""
    batch_size: int
    """Per-GPU micro-batch size (global batch = batch_size * gpus)."""
    gpus: int
    """GPUs (ranks) the cell runs on, all on one node."""
    protocol: Protocol
    """How it is measured."""
    mem_cap_gib: float | None = None
    """Per-rank host-RSS cap in GiB (None: none)."""
    adapter: dict[str, Any] | None = None
    """Resolved fine-tuning settings (lora: rank, alpha, dropout, target_modules; or
    prompt_tuning: num_virtual_tokens); None for pre-training."""
    parallel: dict[str, Any] | None = None
    """Megatron-LM's layout: tensor_parallel, pipeline_parallel, data_parallel (gpus over
    their product) and distributed_optimizer; None for every other backend (and then left
    out of to_dict, so their specs are unchanged)."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.gpus < 1:
            raise ConfigError(f"gpus must be >= 1, got {self.gpus}")
        if techniques.canonical(self.technique) != self.technique:
            raise ConfigError(f"technique {self.technique!r} is not canonical")
        if (self.backend == "megatron") != (self.parallel is not None):
            raise ConfigError("a Cell has a parallel layout exactly when its backend is 'megatron'")

    @property
    def backend_dir(self) -> str:
        """The {backend} component of the record path (the module docstring's grammar)."""
        return self.backend if self.parallel is None else f"{self.backend}-{layout_name(self.parallel)}"

    @property
    def key(self) -> dict[str, Any]:
        """The fields that name the cell's path (backend: backend_dir)."""
        return {k: self.backend_dir if k == "backend" else getattr(self, k) for k in self.KEY}

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready); ``parallel`` only where it is set."""
        data = asdict(self)
        if data["parallel"] is None:
            del data["parallel"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Cell":
        """Inverse of to_dict."""
        return cls(**{**data, "protocol": Protocol(**data["protocol"])})


@dataclass(kw_only=True, slots=True, frozen=True)
class ServeCell(_Addressed):
    """One serving point of the grid: one engine on one model under one load."""

    KEY: ClassVar[tuple[str, ...]] = SERVE_KEY
    PATTERN: ClassVar[str] = SERVE_RECORD_PATTERN

    stage: str = "serve"
    """Always 'serve'."""
    platform: str
    """Platform id."""
    model: str
    """Model id."""
    engine: str
    """Serving engine (llmbench.serve.engines.ENGINES)."""
    load: str
    """Name of the load (the block's loads map key)."""
    gpus: int
    """GPUs the engine uses (tensor parallel), all on one node."""
    load_spec: dict[str, Any]
    """The load: mode, num_requests, input_len, output_len, rate_per_s, max_concurrency,
    warmup_requests, request_timeout_s (llmbench.serve.loadgen.LoadSpec)."""
    weights: str = "random"
    """random: safetensors written by the model-directory rule; dummy: the engine makes
    its own random weights where it can (vLLM --load-format dummy)."""
    engine_args: tuple[str, ...] = ()
    """Extra engine arguments, appended to its launch command."""
    ready_timeout_s: int = 600
    """Seconds the engine may take to become ready."""
    timeout_s: int = 3600
    """Wall-clock limit of the whole load; past it the cell is recorded as timeout."""
    seed: int = 0
    """Seed of the synthetic prompts and arrival times."""

    def __post_init__(self) -> None:
        if self.stage != "serve":
            raise ConfigError(f"a ServeCell's stage is 'serve', got {self.stage!r}")
        if self.gpus < 1:
            raise ConfigError(f"gpus must be >= 1, got {self.gpus}")

    @property
    def max_model_len(self) -> int:
        """Longest sequence a request needs: prompt plus output."""
        return int(self.load_spec["input_len"]) + int(self.load_spec["output_len"])

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return {**asdict(self), "engine_args": list(self.engine_args)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ServeCell":
        """Inverse of to_dict."""
        return cls(**{**data, "engine_args": tuple(data.get("engine_args") or ())})


@dataclass(kw_only=True, slots=True, frozen=True)
class MicroCell(_Addressed):
    """One microbenchmark point of the grid: a GEMM curve or shape set, the memcpy sweep,
    or the collectives over the ranks of a node (with or without P2P)."""

    KEY: ClassVar[tuple[str, ...]] = MICRO_KEY
    PATTERN: ClassVar[str] = MICRO_RECORD_PATTERN

    stage: str = "micro"
    """Always 'micro'."""
    platform: str
    """Platform id."""
    bench: str
    """gemm | memcpy | collectives."""
    case: str
    """gemm: the curve or shape-set name; memcpy: 'sweep'; collectives: 'p2p' or 'nop2p'."""
    gpus: int
    """Processes (GPUs) the benchmark uses: 1, or the ranks of a collective."""
    params: dict[str, Any]
    """What is measured: gemm {dtype, shapes: [[m, n, k], ...]}; memcpy {sizes_bytes};
    collectives {ops, sizes_bytes, p2p}."""
    warmup: int = 10
    """Untimed calls before timing each point."""
    iters: int = 50
    """Timed calls per point."""
    timeout_s: int = 1800
    """Wall-clock limit of the cell."""

    def __post_init__(self) -> None:
        if self.stage != "micro":
            raise ConfigError(f"a MicroCell's stage is 'micro', got {self.stage!r}")
        if self.bench not in MICRO_BENCHES:
            raise ConfigError(f"bench must be one of {MICRO_BENCHES}, got {self.bench!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MicroCell":
        """Inverse of to_dict."""
        return cls(**data)


@dataclass(kw_only=True, slots=True, frozen=True)
class Search(_Addressed):
    """A max-batch search (llmbench.search): the largest batch of ``cell`` that fits, found
    by probes (short-protocol runs of the cell, each recorded in the search's folder),
    then measured as ``cell`` at that batch size. Its path names a folder, not a record."""

    KEY: ClassVar[tuple[str, ...]] = SEARCH_KEY
    PATTERN: ClassVar[str] = SEARCH_PATTERN

    cell: Cell
    """The measured cell; its batch_size is the search's start."""
    start: int = 1
    """First batch probed."""
    max: int = 1024
    """Largest batch probed (the search space is 1..max)."""
    probe_protocol: Protocol
    """A probe's protocol: one repeat; the cell's steps unless the block's probe says fewer."""
    headroom: float = 0.05
    """Share of the capacity a fitting probe must leave free (llmbench.search)."""

    @property
    def key(self) -> dict[str, Any]:
        """The measured cell's path fields but its batch size (backend: its path form)."""
        return {k: self.cell.key[k] for k in self.KEY}

    def frontier_path(self, results_dir: str = "results") -> str:
        """The OOM frontier file later searches of this cell read (llmbench.search)."""
        return f"{results_dir}/" + FRONTIER_PATTERN.format(**self.key)

    def measured(self, batch_size: int) -> Cell:
        """The cell measured at the batch the search found."""
        return replace(self.cell, batch_size=int(batch_size))

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "max": self.max, "headroom": self.headroom,
                "probe_protocol": asdict(self.probe_protocol)}


def cell_from_dict(data: dict[str, Any]) -> "Cell | ServeCell | MicroCell":
    """A training, serving or microbenchmark cell from its plain-data form."""
    kind = {"serve": ServeCell, "micro": MicroCell}.get(data.get("stage"), Cell)
    return kind.from_dict(data)


@dataclass(kw_only=True, slots=True)
class Grid:
    """A validated config: its cells and the platforms and models they use."""

    results_dir: str
    cells: list[Cell | ServeCell | MicroCell]
    platforms: dict[str, Platform] = field(default_factory=dict)
    models: dict[str, ModelSpec] = field(default_factory=dict)
    engine_python: dict[str, str] = field(default_factory=dict)
    """Interpreter of each serving engine's environment (absent: the workflow's own)."""
    searches: list[Search] = field(default_factory=list)
    """Max-batch searches; the cells they measure are known only once they ran."""
    _indexed: tuple | None = field(default=None, init=False, repr=False, compare=False)
    """find's index of cells and how many cells it covers."""

    def platform(self, name: str, root: Path) -> Platform:
        """config/platforms/<name>.yaml, loaded and validated once per grid."""
        if name not in self.platforms:
            self.platforms[name] = Platform.load(name, root)
        return self.platforms[name]

    def model(self, name: str, root: Path) -> ModelSpec:
        """config/models/<name>.yaml, loaded and validated once per grid."""
        if name not in self.models:
            self.models[name] = ModelSpec.load(name, root)
        return self.models[name]

    def by_path(self) -> dict[str, Cell | ServeCell | MicroCell]:
        """Record path -> Cell."""
        return {c.record_path(self.results_dir): c for c in self.cells}

    def find(self, **key: Any) -> Cell | ServeCell | MicroCell:
        """The cell whose path fields equal ``key`` (values compared as strings; a serving
        cell's path has no stage field, so it may be left out)."""
        want = {k: str(v) for k, v in key.items() if k in WILDCARD_CONSTRAINTS}
        wanted = frozenset(want.items())
        for index in self._index():  # exact fields first, then fields less the stage
            if wanted in index:
                return index[wanted]
        if "batch_size" in want:  # the cell a search measures at the batch it found
            search = self.find_search(**want)
            return search.measured(int(want["batch_size"]))
        raise KeyError(f"no cell with {want}")

    def _index(self) -> tuple[dict[frozenset, Any], dict[frozenset, Any]]:
        """Cells by their path fields (as strings), and by those less ``stage``: Snakemake
        asks ``find`` once per job and rule function (~1,200 times for the paper grid)."""
        size = len(self.cells)
        if self._indexed is None or self._indexed[1] != size:  # cells are appended while expanding
            full: dict[frozenset, Any] = {}
            bare: dict[frozenset, Any] = {}
            for c in self.cells:
                have = {k: str(v) for k, v in c.key.items()}
                full.setdefault(frozenset(have.items()), c)
                bare.setdefault(frozenset((k, v) for k, v in have.items() if k != "stage"), c)
            self._indexed = ((full, bare), size)
        return self._indexed[0]

    def find_search(self, **key: Any) -> Search:
        """The search whose path fields equal ``key`` (other keys ignored)."""
        want = {k: str(v) for k, v in key.items() if k in SEARCH_KEY}
        for s in self.searches:
            if {k: str(v) for k, v in s.key.items()} == want:
                return s
        raise KeyError(f"no max-batch search with {want}")

    def spec(self, cell: Cell | ServeCell | MicroCell | Search) -> dict[str, Any]:
        """The fully resolved cell config a runner gets: cell, platform and model (a search:
        its measured cell's, plus its bounds and probe protocol)."""
        if isinstance(cell, Search):
            return {**self.spec(cell.cell), "search": cell.to_dict()}
        platform = self.platforms[cell.platform].to_dict()
        # where a job is queued is not part of the experiment: a partition edit must not
        # change the spec (the params rerun trigger) of every cell of the platform
        platform.pop("slurm")
        spec = {"cell": cell.to_dict(), "platform": platform}
        if not isinstance(cell, MicroCell):
            spec["model"] = self.models[cell.model].to_dict()
        if isinstance(cell, ServeCell):
            spec["engine_python"] = self.engine_python.get(cell.engine)
        return spec


def _check_names(values: list[str], kind: str, where: str, root: Path) -> None:
    allowed = available(kind, root)
    for i, v in enumerate(values):
        if v not in allowed:
            raise ConfigError(f"{where}[{i}]: unknown {kind} {v!r}; allowed: {', '.join(allowed)}")


#: Linear layers of a Llama decoder layer (LoRA targets must be among them).
LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Stages whose cells train (their blocks share one schema); "serve" and "micro" have their own.
STAGES = ("pretrain", "finetune", "profile")
#: Backends each training stage allows; the first is the default.
#: stages whose blocks may search their largest batch (max_batch)
SEARCH_STAGES = ("pretrain", "finetune")
BACKENDS = {"pretrain": ("deepspeed", "megatron"), "finetune": ("deepspeed",),
            "profile": ("torch", "deepspeed", "inference")}
#: Technique flags a profile cell supports (plain PyTorch; ZeRO, offload, 4-bit need DeepSpeed).
PROFILE_FLAGS = ("F", "R")
#: Technique flags a Megatron-LM cell supports (ZeRO, offload and 4-bit are DeepSpeed's and
#: bitsandbytes'; Megatron's own sharding is the distributed_optimizer block key).
MEGATRON_FLAGS = ("F", "R")
#: Block keys of Megatron-LM's parallel layout (null in the schema: not given).
MEGATRON_KEYS = ("tensor_parallel", "pipeline_parallel", "distributed_optimizer")


def _techniques(block: dict, where: str, stage: str) -> list[str]:
    names = []
    for t, text in enumerate(block["techniques"]):
        key = f"{where}.techniques[{t}]"
        try:
            tech = techniques.parse(text)
        except techniques.TechniqueError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        if stage in ("pretrain", "profile") and tech.adapter:
            raise ConfigError(f"{key}: {text!r} is a fine-tuning method; put it in a finetune block")
        if stage == "profile" and tech.compiled:
            raise ConfigError(f"{key}: {text!r}: C (torch.compile) is for pretrain and finetune cells; a profile "
                              "attributes time through module hooks and kernel names, which compiled regions fuse away")
        if stage == "profile" and block.get("backend") == "inference" and set(tech.flags) - {"F"}:
            raise ConfigError(f"{key}: inference profile cells (serving forward passes) support the flag F; "
                              f"{text!r} asks for {', '.join(sorted(set(tech.flags) - {'F'}))}")
        if stage == "profile" and block.get("backend") in (None, "torch") and set(tech.flags) - set(PROFILE_FLAGS):
            raise ConfigError(f"{key}: module-wise profile cells (backend torch, plain PyTorch) support the flags "
                              f"{', '.join(PROFILE_FLAGS)}; {text!r} asks for "
                              f"{', '.join(sorted(set(tech.flags) - set(PROFILE_FLAGS)))} (backend: deepspeed profiles "
                              "a DeepSpeed step's communication and copies for any pre-training technique)")
        if stage == "finetune" and not tech.adapter:
            methods = ", ".join(techniques.ADAPTERS)
            raise ConfigError(f"{key}: {text!r} names no fine-tuning method; start it with one of {methods}")
        if block.get("backend") == "megatron" and set(tech.flags) - set(MEGATRON_FLAGS):
            raise ConfigError(f"{key}: backend 'megatron' supports the flags {', '.join(MEGATRON_FLAGS)}; "
                              f"{text!r} asks for {', '.join(sorted(set(tech.flags) - set(MEGATRON_FLAGS)))} "
                              "(ZeRO, offload and 4-bit run with backend deepspeed)")
        names.append(tech.name)
    return names


def _parallel(block: dict, where: str, backend: str, model: ModelSpec, gpus: int,
              gpus_key: str) -> dict[str, Any] | None:
    """Megatron-LM's layout of one cell, checked against the model and the GPU count
    (errors name the block key); None for other backends, which may not set the keys."""
    if backend != "megatron":
        for k in MEGATRON_KEYS:
            if block[k] is not None:
                raise ConfigError(f"{where}.{k}: only for backend 'megatron' (this block's backend is {backend!r})")
        return None
    tp, pp = block["tensor_parallel"] or 1, block["pipeline_parallel"] or 1
    if gpus % (tp * pp):
        key = "pipeline_parallel" if tp == 1 else "tensor_parallel"
        raise ConfigError(f"{where}.{key}: tensor_parallel {tp} x pipeline_parallel {pp} = {tp * pp} "
                          f"must divide {gpus_key} ({gpus} GPUs); data parallel = gpus / (tp*pp)")
    for heads in ("num_attention_heads", "num_key_value_heads"):
        if getattr(model, heads) % tp:
            raise ConfigError(f"{where}.tensor_parallel: {tp} must divide model {model.name!r}'s "
                              f"{heads} ({getattr(model, heads)})")
    if model.num_hidden_layers % pp:
        raise ConfigError(f"{where}.pipeline_parallel: {pp} must divide model {model.name!r}'s "
                          f"num_hidden_layers ({model.num_hidden_layers})")
    return {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": gpus // (tp * pp),
            "distributed_optimizer": bool(block["distributed_optimizer"])}


def _gpu_counts(value: int | list[int] | None, platform: Platform, where: str) -> list[int]:
    """The GPU-count axis of a training block: a count, a list of counts (Fig. 4's scaling),
    or null for all GPUs of the node. On a GPU platform no count may exceed the node."""
    counts = value if isinstance(value, list) else [value or platform.gpus_per_node]
    for i, n in enumerate(counts):
        if platform.accelerator == "cuda" and n > platform.gpus_per_node:
            at = f"{where}[{i}]" if isinstance(value, list) else where
            raise ConfigError(f"{at}: {n} GPUs, but platform {platform.name!r} has {platform.gpus_per_node} per node "
                              "(cells run on one node)")
    return counts


def _adapter(block: dict, where: str, tech: str) -> dict[str, Any] | None:
    kind = techniques.parse(tech).adapter
    if kind is None:
        return None
    if kind == "prompt_tuning":
        return {"kind": kind, **block["prompt_tuning"]}
    lora = block["lora"]
    for i, mod in enumerate(lora["target_modules"]):
        if mod not in LLAMA_LINEARS:
            raise ConfigError(f"{where}.lora.target_modules[{i}]: {mod!r} is not a linear layer of "
                              f"a Llama decoder; allowed: {', '.join(LLAMA_LINEARS)}")
    return {"kind": kind, **lora}


def expand(config: dict[str, Any], root: Path = REPO_ROOT, source: str = "config") -> Grid:
    """Validate a config mapping and expand it into a Grid.

    Raises ConfigError (naming the key and the allowed values) before anything runs.
    """
    raw = copy.deepcopy(dict(config))
    # a block's protocol overrides only the keys it names (validation fills in defaults)
    given = {
        stage: [dict(b.get("protocol") or {}) if isinstance(b, dict) else {} for b in raw.get(stage) or []]
        if isinstance(raw.get(stage), list) else []
        for stage in STAGES
    }
    config = validate(raw, "config", source)
    only = config.get("only_platforms")
    if only is not None:
        _check_names(only, "platform", "only_platforms", root)
    grid = Grid(results_dir=config["results_dir"], cells=[])
    seen: dict[str, Cell] = {}
    for stage in STAGES:
        for b, block in enumerate(config[stage]):
            where = f"{stage}[{b}]"
            _check_names(block["platforms"], "platform", f"{where}.platforms", root)
            _check_names(block["models"], "model", f"{where}.models", root)
            names = _techniques(block, where, stage)
            backend = block["backend"] or BACKENDS[stage][0]
            if backend not in BACKENDS[stage]:
                raise ConfigError(f"{where}.backend: {backend!r} does not run {stage} cells; "
                                  f"allowed: {', '.join(BACKENDS[stage])}")
            sizes, search = block["batch_sizes"], block["max_batch"]
            if sizes is None and search is None:
                raise ConfigError(f"{where}: give batch_sizes, max_batch (the search for the largest batch), or both")
            if search is not None and stage not in SEARCH_STAGES:
                raise ConfigError(f"{where}.max_batch: the search runs {' and '.join(SEARCH_STAGES)} cells, "
                                  f"not {stage} cells")
            if isinstance(sizes, dict):
                canon = {}
                for text, lst in sizes.items():
                    try:
                        canon[techniques.canonical(text)] = lst
                    except techniques.TechniqueError as exc:
                        raise ConfigError(f"{where}.batch_sizes.{text}: {exc}") from None
                missing = sorted(set(names) - set(canon))
                if missing:
                    raise ConfigError(f"{where}.batch_sizes: no batch sizes for technique(s) {', '.join(missing)}")
            protocol = Protocol(**{**config["protocol"], **given[stage][b]})
            for plat_name in block["platforms"]:
                if only is not None and plat_name not in only:
                    continue
                platform = grid.platform(plat_name, root)
                gpu_counts = _gpu_counts(block["gpus"], platform, f"{where}.gpus")
                for model_name, tech, gpus in itertools.product(block["models"], names, gpu_counts):
                    if techniques.parse(tech).quant4 and not platform.supports_4bit:
                        raise ConfigError(f"{where}: technique {tech!r} needs bitsandbytes 4-bit, which "
                                          f"platform {plat_name!r} does not support (supports_4bit: false)")
                    model = grid.model(model_name, root)
                    if protocol.seq_len > model.max_position_embeddings:
                        key = f"{where}.protocol.seq_len" if "seq_len" in given[stage][b] else "protocol.seq_len"
                        raise ConfigError(f"{key}: {protocol.seq_len} is past the positions of model "
                                          f"{model_name!r} (max_position_embeddings {model.max_position_embeddings})")
                    gpus_key = f"{where}.gpus" + (f"[{block['gpus'].index(gpus)}]" if isinstance(block["gpus"], list) else "")
                    parallel = _parallel(block, where, backend, model, gpus, gpus_key)
                    if search is not None:
                        _add_search(grid, where, search, Cell(
                            stage=stage, platform=plat_name, model=model_name, backend=backend, technique=tech,
                            batch_size=search["start"], gpus=gpus, protocol=protocol,
                            mem_cap_gib=block["mem_cap_gib"], adapter=_adapter(block, where, tech), parallel=parallel))
                    for bs in (canon[tech] if isinstance(sizes, dict) else sizes or []):
                        cell = Cell(
                            stage=stage, platform=plat_name, model=model_name,
                            backend=backend, technique=tech, batch_size=bs, gpus=gpus,
                            protocol=protocol, mem_cap_gib=block["mem_cap_gib"],
                            adapter=_adapter(block, where, tech), parallel=parallel,
                        )
                        path = cell.record_path(grid.results_dir)
                        if path in seen and seen[path] != cell:
                            raise ConfigError(f"{where}: cell {path} is defined twice with different settings")
                        if path not in seen:
                            seen[path] = cell
                            grid.cells.append(cell)
    _serve_cells(config, grid, root, seen)
    _micro_cells(config, grid, root, seen)
    grid.engine_python = dict(config["engine_python"])
    return grid


def check_engine_python(grid: Grid) -> None:
    """Every engine_python of an engine the grid serves with names an interpreter that exists
    (a path, relative to the working directory as the serving cell resolves it, or a
    command on PATH): a typo would otherwise surface as one failed engine start per cell.
    The workflow calls it at parse time (common.smk); expand does not, so a config can be
    planned and read where its engines' environments are not (the GPU configs' wrappers
    are made on the GPU node by envs/offline-run.sh)."""
    used = {c.engine for c in grid.cells if isinstance(c, ServeCell)}
    for engine, python in sorted(grid.engine_python.items()):
        if engine not in used:
            continue
        found = Path(python).absolute() if "/" in python else shutil.which(python)
        if found is None or not Path(found).is_file() or not os.access(found, os.X_OK):
            raise ConfigError(f"engine_python.{engine}: {python!r} is not an executable interpreter "
                              f"(looked for {found or 'it on PATH'}); create that environment or fix the path")


def _add_search(grid: Grid, where: str, search: dict[str, Any], cell: Cell) -> None:
    """Add a max-batch search of ``cell`` (one per path; two blocks must agree on it)."""
    if search["start"] > search["max"]:
        raise ConfigError(f"{where}.max_batch.start: {search['start']} is above max_batch.max {search['max']}")
    probe = replace(cell.protocol, repeats=1, **{k: v for k, v in search["probe"].items() if v is not None})
    new = Search(cell=cell, start=search["start"], max=search["max"], probe_protocol=probe,
                 headroom=search["headroom"])
    for old in grid.searches:
        if old.key == new.key:
            if old != new:
                raise ConfigError(f"{where}.max_batch: the search {new.record_path(grid.results_dir)} is defined "
                                  "twice with different settings")
            return
    grid.searches.append(new)


def _serve_cells(config: dict[str, Any], grid: Grid, root: Path, seen: dict[str, Any]) -> None:
    """Expand the serve blocks into ServeCells (engine x platform checks named by key)."""
    from .serve.engines import ENGINES  # no heavy imports there

    only = config.get("only_platforms")
    for b, block in enumerate(config["serve"]):
        where = f"serve[{b}]"
        _check_names(block["platforms"], "platform", f"{where}.platforms", root)
        _check_names(block["models"], "model", f"{where}.models", root)
        for name, load in block["loads"].items():
            if load["mode"] == "poisson" and load["rate_per_s"] is None:
                raise ConfigError(f"{where}.loads.{name}.rate_per_s: required when mode is 'poisson'")
        for e, engine_name in enumerate(block["engines"]):
            engine = ENGINES[engine_name]
            if block["weights"] == "dummy" and not engine.dummy_weights:
                can = ", ".join(n for n, x in ENGINES.items() if x.dummy_weights)
                raise ConfigError(f"{where}.weights: 'dummy' needs an engine that makes its own weights "
                                  f"({can}); engine {engine_name!r} loads them (use weights: random)")
            for plat_name in block["platforms"]:
                if only is not None and plat_name not in only:
                    continue
                platform = grid.platform(plat_name, root)
                if platform.accelerator not in engine.accelerators:
                    raise ConfigError(
                        f"{where}.engines[{e}]: engine {engine_name!r} runs on {' or '.join(engine.accelerators)}, "
                        f"platform {plat_name!r} is {platform.accelerator}")
                gpus = block["gpus"] or (platform.gpus_per_node if engine.tensor_parallel else 1)
                if gpus > 1 and not engine.tensor_parallel:
                    raise ConfigError(f"{where}.gpus: engine {engine_name!r} has no tensor parallelism; use gpus: 1")
                for model_name, (load_name, load) in itertools.product(block["models"], block["loads"].items()):
                    positions = grid.model(model_name, root).max_position_embeddings
                    if load["input_len"] + load["output_len"] > positions:
                        raise ConfigError(f"{where}.loads.{load_name}: input_len + output_len = "
                                          f"{load['input_len'] + load['output_len']} is past the positions of "
                                          f"model {model_name!r} (max_position_embeddings {positions})")
                    cell = ServeCell(
                        platform=plat_name, model=model_name, engine=engine_name, load=load_name, gpus=gpus,
                        load_spec=dict(load), weights=block["weights"],
                        engine_args=tuple(block["engine_args"].get(engine_name, ())),
                        ready_timeout_s=block["ready_timeout_s"], timeout_s=block["timeout_s"],
                        seed=config["protocol"]["seed"],
                    )
                    path = cell.record_path(grid.results_dir)
                    if path in seen and seen[path] != cell:
                        raise ConfigError(f"{where}: cell {path} is defined twice with different settings")
                    if path not in seen:
                        seen[path] = cell
                        grid.cells.append(cell)


def _micro_cells(config: dict[str, Any], grid: Grid, root: Path, seen: dict[str, Any]) -> None:
    """Expand the micro blocks into MicroCells, one per GEMM curve or shape set, one memcpy
    sweep, and one collectives cell per P2P setting."""
    from .micro import shapes as shapes_of  # torch-free

    only = config.get("only_platforms")
    for b, block in enumerate(config["micro"]):
        where = f"micro[{b}]"
        _check_names(block["platforms"], "platform", f"{where}.platforms", root)
        if not any(k in block for k in MICRO_BENCHES):
            raise ConfigError(f"{where}: names no benchmark; give one or more of {', '.join(MICRO_BENCHES)}")
        for plat_name in block["platforms"]:
            if only is not None and plat_name not in only:
                continue
            platform = grid.platform(plat_name, root)
            common = dict(platform=plat_name, warmup=block["warmup"], iters=block["iters"], timeout_s=block["timeout_s"])
            cells = []
            gemm = block.get("gemm")
            if gemm is not None:
                for name, c in gemm["curves"].items():
                    if c["m_start"] > c["m_stop"]:
                        raise ConfigError(f"{where}.gemm.curves.{name}: m_start {c['m_start']} > m_stop {c['m_stop']}")
                    shapes = [list(s) for s in shapes_of.sweep(**c)]
                    cells.append(MicroCell(bench="gemm", case=name, gpus=1, params={"dtype": gemm["dtype"], "shapes": shapes}, **common))
                for name, shapes in gemm["shapes"].items():
                    if name in gemm["curves"]:
                        raise ConfigError(f"{where}.gemm.shapes.{name}: also a curve name; names share one path")
                    # a shape set is also timed as plain back-to-back torch.matmul: the bar the
                    # harness is held to (issue 5), in the same process and clock state
                    cells.append(MicroCell(bench="gemm", case=name, gpus=1, params={
                        "dtype": gemm["dtype"], "shapes": shapes, "plain_check": True}, **common))
            memcpy = block.get("memcpy")
            if memcpy is not None:
                if memcpy["min_bytes"] > memcpy["max_bytes"]:
                    raise ConfigError(f"{where}.memcpy.min_bytes: {memcpy['min_bytes']} > max_bytes {memcpy['max_bytes']}")
                cells.append(MicroCell(bench="memcpy", case="sweep", gpus=1,
                                       params={"sizes_bytes": shapes_of.sizes(memcpy["min_bytes"], memcpy["max_bytes"])}, **common))
            coll = block.get("collectives")
            if coll is not None:
                ranks = coll["ranks"] or platform.gpus_per_node
                if ranks < 2:
                    raise ConfigError(f"{where}.collectives.ranks: platform {plat_name!r} has {platform.gpus_per_node} "
                                      "GPU(s) per node; a collective needs at least 2 ranks (set ranks)")
                if False in coll["p2p"] and platform.accelerator != "cuda":
                    raise ConfigError(f"{where}.collectives.p2p: false disables NCCL peer-to-peer; platform "
                                      f"{plat_name!r} runs gloo on its CPU, where it means nothing")
                if coll["min_bytes"] > coll["max_bytes"]:
                    raise ConfigError(f"{where}.collectives.min_bytes: {coll['min_bytes']} > max_bytes {coll['max_bytes']}")
                for p2p in coll["p2p"]:
                    cells.append(MicroCell(bench="collectives", case="p2p" if p2p else "nop2p", gpus=ranks,
                                           params={"ops": list(coll["ops"]), "p2p": p2p,
                                                   "sizes_bytes": shapes_of.sizes(coll["min_bytes"], coll["max_bytes"])},
                                           **common))
            for cell in cells:
                path = cell.record_path(grid.results_dir)
                if path in seen and seen[path] != cell:
                    raise ConfigError(f"{where}: cell {path} is defined twice with different settings")
                if path not in seen:
                    seen[path] = cell
                    grid.cells.append(cell)


def load(configfile: Path, root: Path = REPO_ROOT) -> Grid:
    """Load a config file and expand it."""
    data = load_yaml(configfile)
    if not isinstance(data, dict):
        raise ConfigError(f"{configfile}: expected a mapping at the top level")
    return expand(data, root, str(configfile))
