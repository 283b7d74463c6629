"""The contract between the grid, the workflow and the records: cell types, the path
grammar of their records, and the wildcard regexes that parse it. Light on purpose (no
torch, no pandas): common.smk, the grid and the report read it.

Path grammar (relative to results_dir; every pattern below is the one copy):
    runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json
    runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-n{nodes}-g{gpus}/record.json
                                                                        a cell over nodes >= 2
    runs/search/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}/            a search
    runs/search/.../{technique}-g{gpus}/bs{batch_size}/record.json                   its probes
    frontier/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}.json
    runs/serve/{platform}/{model}/{engine}/{load}-g{gpus}/record.json
    runs/micro/{platform}/{bench}/{case}-g{gpus}/record.json
A Cell's path is a pure function of the fields its pattern names; every other field
(protocol, caps) must agree between blocks that produce the same path, or the grid is
rejected (llmbench.grid).

The {backend} path component is the backend's name, except for Megatron-LM cells, whose
parallel layout is part of what is measured: ``megatron-tp{T}pp{P}`` and, with Megatron's
distributed optimizer, ``megatron-tp{T}pp{P}-distopt`` (data parallel = gpus / (T*P)
follows from the path's g{gpus}). Cell.backend stays "megatron"; the layout is Cell.parallel.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import PurePosixPath
from typing import Any, ClassVar

from . import techniques
from .config import ConfigError
from .protocol import Protocol

#: Stages whose cells train (their blocks share one schema); "serve" and "micro" have their own.
TRAINING_STAGES = ("pretrain", "finetune", "profile")
#: Stages whose blocks may search their largest batch (max_batch).
SEARCH_STAGES = ("pretrain", "finetune")
MICRO_BENCHES = ("gemm", "memcpy", "collectives")

#: A training cell's record (stage: one of TRAINING_STAGES).
RECORD_PATTERN = (
    "runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-g{gpus}/record.json"
)
#: A training cell over several nodes (nodes >= 2; g{gpus} counts the GPUs of all of them).
#: A one-node cell keeps RECORD_PATTERN: its path and spec are what they were before nodes.
NODES_RECORD_PATTERN = (
    "runs/{stage}/{platform}/{model}/{backend}/{technique}/bs{batch_size}-n{nodes}-g{gpus}/record.json"
)
#: a max-batch search's folder: its probes' records (PROBE_RECORD_PATTERN) and search.json
SEARCH_PATTERN = (
    "runs/search/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}"
)
#: what a search found (llmbench.search writes it; the tidy table reads largest_ok)
#: inside a search folder: its summary, and one probe's folder (record.json, probe.log)
SEARCH_SUMMARY = "search.json"
PROBE_DIR = "bs{batch_size}"
SEARCH_SUMMARY_PATTERN = SEARCH_PATTERN + "/" + SEARCH_SUMMARY
#: one probe of a max-batch search: a short run of the cell at one batch size
PROBE_RECORD_PATTERN = SEARCH_PATTERN + "/" + PROBE_DIR + "/record.json"
#: what a search learnt about a cell's memory, kept across reruns of the search
FRONTIER_PATTERN = "frontier/{stage}/{platform}/{model}/{backend}/{technique}-g{gpus}.json"
#: Serving cells (stage "serve"): one engine under one load.
SERVE_RECORD_PATTERN = "runs/serve/{platform}/{model}/{engine}/{load}-g{gpus}/record.json"
#: Microbenchmark cells (stage "micro"): one benchmark case on one platform.
MICRO_RECORD_PATTERN = "runs/micro/{platform}/{bench}/{case}-g{gpus}/record.json"
#: Wildcard regexes for Snakemake (common.smk), one per path field; parse() uses them too.
WILDCARD_CONSTRAINTS: dict[str, str] = {
    "stage": "|".join(TRAINING_STAGES),
    "platform": "[a-z0-9][a-z0-9-]*",
    "model": "[a-z0-9][a-z0-9.-]*",
    "backend": "[a-z][a-z0-9]*|megatron-tp[0-9]+pp[0-9]+(-distopt)?",
    "technique": "[A-Za-z0-9+]+",
    "batch_size": "[0-9]+",
    "gpus": "[0-9]+",
    "nodes": "[2-9]|[1-9][0-9]+",
    "engine": "[a-z]+",
    "load": "[a-z0-9][a-z0-9-]*",
    "bench": "|".join(MICRO_BENCHES),
    "case": "[a-z0-9][a-z0-9-]*",
}
TRAIN_KEY = ("stage", "platform", "model", "backend", "technique", "batch_size", "gpus")
NODES_TRAIN_KEY = (*TRAIN_KEY, "nodes")
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


def cell_dir(pattern: str) -> str:
    """The fields of a pattern as one relative path: what lies between its fixed top
    folders and its fixed file name, e.g. ``{platform}/{bench}/{case}-g{gpus}`` for
    MICRO_RECORD_PATTERN. A cell's log and benchmark files are named by it (common.smk)."""
    parts = pattern.split("/")
    first = next(i for i, p in enumerate(parts) if "{" in p)
    last = max(i for i, p in enumerate(parts) if "{" in p)
    return "/".join(parts[first:last + 1])


def record_dirs(stage: str | None = None) -> list[str]:
    """The folders under a results_dir that hold every record (stage None) or one stage's:
    its cells' and its max-batch searches' probes (the patterns' fixed folders)."""
    if stage is None:
        return [RECORD_PATTERN.split("/")[0]]
    return [RECORD_PATTERN.split("{stage}")[0] + stage, SEARCH_PATTERN.split("{stage}")[0] + stage]


def glob(pattern: str) -> str:
    """A pattern as a glob: every field a ``*`` (serving records: runs/serve/*/*/*/*-g*/record.json)."""
    return re.sub(r"\{\w+\}", "*", pattern)


def _regex(pattern: str) -> re.Pattern[str]:
    """The pattern as a regex with a named group per field (its wildcard constraint),
    matching at the end of a path under any results folder."""
    out, pos = [], 0
    for m in re.finditer(r"\{(\w+)\}", pattern):
        out += [re.escape(pattern[pos:m.start()]), f"(?P<{m.group(1)}>{WILDCARD_CONSTRAINTS[m.group(1)]})"]
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("(?:^|(?<=/))" + "".join(out) + "$")


class _Addressed:
    """The path of a cell's record: a pure function of the fields its PATTERN names."""

    __slots__ = ()
    KEY: ClassVar[tuple[str, ...]]
    PATTERN: ClassVar[str]

    @property
    def key(self) -> dict[str, Any]:
        """The fields that name the cell's path."""
        return {k: getattr(self, k) for k in self.KEY}

    @property
    def pattern(self) -> str:
        """The path pattern of this cell's record."""
        return self.PATTERN

    def record_path(self, results_dir: str = "results") -> str:
        """Where this cell's Record lives."""
        return f"{results_dir}/" + self.pattern.format(**self.key)

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
    """GPUs (ranks) the cell runs on, over all its nodes."""
    protocol: Protocol
    """How it is measured."""
    nodes: int = 1
    """Nodes the ranks span, gpus / nodes on each (llmbench.nodes: one torchrun per node,
    started by srun inside a Slurm allocation); left out of to_dict where 1."""
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
        if self.nodes < 1 or self.gpus % self.nodes:
            raise ConfigError(f"nodes must be >= 1 and divide gpus ({self.gpus}), got {self.nodes}")
        if techniques.canonical(self.technique) != self.technique:
            raise ConfigError(f"technique {self.technique!r} is not canonical")
        if (self.backend == "megatron") != (self.parallel is not None):
            raise ConfigError("a Cell has a parallel layout exactly when its backend is 'megatron'")

    @property
    def tech(self) -> techniques.Technique:
        """The technique's flags (llmbench.techniques.parse, memoised: parsed once per name)."""
        return techniques.parse(self.technique)

    @property
    def backend_dir(self) -> str:
        """The {backend} component of the record path (the module docstring's grammar)."""
        return self.backend if self.parallel is None else f"{self.backend}-{layout_name(self.parallel)}"

    @property
    def ranks_per_node(self) -> int:
        """Ranks (GPUs) on each node."""
        return self.gpus // self.nodes

    @property
    def pattern(self) -> str:
        """RECORD_PATTERN, or NODES_RECORD_PATTERN for a cell over several nodes."""
        return self.PATTERN if self.nodes == 1 else NODES_RECORD_PATTERN

    @property
    def key(self) -> dict[str, Any]:
        """The fields that name the cell's path (backend: backend_dir; nodes where > 1)."""
        names = self.KEY if self.nodes == 1 else NODES_TRAIN_KEY
        return {k: self.backend_dir if k == "backend" else getattr(self, k) for k in names}

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready); ``parallel`` only where it is set, ``nodes`` only
        where it is > 1 (so one-node specs, the params rerun trigger, are unchanged)."""
        data = asdict(self)
        if data["parallel"] is None:
            del data["parallel"]
        if data["nodes"] == 1:
            del data["nodes"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Cell:
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

    @property
    def launch_key(self) -> str:
        """What its engine's launch depends on besides the loads it serves: cells with one
        key can be served by one engine (llmbench.serve.bench.EngineSession)."""
        return json.dumps({k: v for k, v in self.to_dict().items() if k not in _LOAD_FIELDS}, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-ready)."""
        return {**asdict(self), "engine_args": list(self.engine_args)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeCell:
        """Inverse of to_dict."""
        return cls(**{**data, "engine_args": tuple(data.get("engine_args") or ())})


#: A serving cell's fields that are its load's, not its engine's (ServeCell.launch_key)
_LOAD_FIELDS = ("load", "load_spec", "timeout_s", "seed")


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
    def from_dict(cls, data: dict[str, Any]) -> MicroCell:
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
    step: int = 1
    """The batches probed are multiples of it (llmbench.search.algorithm, rule 5)."""

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
        """The search's own settings (its spec's "search"; the measured cell has its own)."""
        # step only where it is not 1: a search spec without it is a search of every batch
        return {"start": self.start, "max": self.max, "headroom": self.headroom,
                "probe_protocol": asdict(self.probe_protocol), **({"step": self.step} if self.step != 1 else {})}


def cell_class(stage: str | None) -> type[Cell] | type[ServeCell] | type[MicroCell]:
    """The cell type of a stage: ServeCell for "serve", MicroCell for "micro", else Cell."""
    return {"serve": ServeCell, "micro": MicroCell}.get(stage, Cell)


def cell_from_dict(data: dict[str, Any]) -> Cell | ServeCell | MicroCell:
    """A training, serving or microbenchmark cell from its plain-data form."""
    return cell_class(data.get("stage")).from_dict(data)


#: The patterns of record files, each with the stage its records belong to (None: the
#: path's {stage} field).
RECORD_PATTERNS: dict[str, str | None] = {
    RECORD_PATTERN: None, NODES_RECORD_PATTERN: None, PROBE_RECORD_PATTERN: None, SERVE_RECORD_PATTERN: "serve",
    MICRO_RECORD_PATTERN: "micro",
}
_REGEXES = {p: _regex(p) for p in (*RECORD_PATTERNS, SEARCH_PATTERN, FRONTIER_PATTERN, SEARCH_SUMMARY_PATTERN)}


@dataclass(frozen=True, slots=True)
class Parsed:
    """A path read back through the grammar."""

    pattern: str
    """The pattern it matched (RECORD_PATTERN, PROBE_RECORD_PATTERN, ...)."""
    root: str
    """The results folder it lies under ('' for a path relative to one)."""
    wildcards: dict[str, str]
    """Its fields as Snakemake would give them: strings, backend in its path form."""

    @property
    def is_probe(self) -> bool:
        """A max-batch search's probe, not a cell of the grid."""
        return self.pattern == PROBE_RECORD_PATTERN


def parse(path: str | PurePosixPath, patterns: tuple[str, ...] = tuple(RECORD_PATTERNS)) -> Parsed | None:
    """The pattern ``path`` ends with and its fields (None where it follows none of
    ``patterns``): the inverse of record_path, for the report and the tests."""
    text = PurePosixPath(path).as_posix()
    for pattern in patterns:
        m = _REGEXES[pattern].search(text)
        if m:
            fields = {k: v for k, v in m.groupdict().items() if k in WILDCARD_CONSTRAINTS}
            if pattern in RECORD_PATTERNS and RECORD_PATTERNS[pattern] is not None:
                fields = {"stage": RECORD_PATTERNS[pattern], **fields}
            return Parsed(pattern=pattern, root=text[:m.start()].rstrip("/"), wildcards=fields)
    return None
