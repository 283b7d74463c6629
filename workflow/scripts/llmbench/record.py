"""Records: what a cell leaves behind. Typed, versioned, written atomically.

A Record is the only thing later stages read (tables, figures). Status is data:
ok | oom | error | timeout | skipped; every non-ok record says why (reason, log tail).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

#: 2: summary and samples (serving, microbenchmarks). Version 1 records (training only) are read as 2.
#: 3: a max-batch search's probe answered from its frontier file, which runs nothing, is
#: ``skipped`` with the answer in provenance["frontier"]; version 2 wrote it ok (with the
#: peak the batch once had) or oom, and is read as 3 (from_dict).
SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
STATUSES = ("ok", "oom", "error", "timeout", "skipped")
#: provenance["command"] of a probe answered from a max-batch search's frontier (llmbench.search)
FRONTIER_COMMAND = ["llmbench.search (frontier)"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Metrics:
    """Measured quantities of one cell (None where not measured or not meaningful)."""

    tokens_per_s_mean: float | None = None
    """Global tokens per second (all GPUs), mean over repeats."""
    tokens_per_s_std: float | None = None
    """Sample standard deviation over repeats."""
    tokens_per_s_runs: tuple[float, ...] = ()
    """Per-repeat tokens per second."""
    step_time_s_mean: float | None = None
    """Seconds per optimizer step, mean over repeats."""
    step_time_s_runs: tuple[float, ...] = ()
    """Per-repeat mean step time."""
    peak_mem_allocated_gib: float | None = None
    """Peak device memory allocated by tensors, max over ranks and repeats (GPU only)."""
    peak_mem_reserved_gib: float | None = None
    """Peak device memory reserved by the caching allocator, max over ranks and repeats."""
    peak_rss_gib: float | None = None
    """Peak host resident set size of one rank, max over ranks and repeats."""
    mfu: float | None = None
    """Model FLOPs utilisation against the platform's peak (formula in mfu_formula)."""
    mfu_formula: str | None = None
    """How mfu was computed, or why it is absent."""
    mfu_fp8_peak: float | None = None
    """FP8 cells (techniques FP8, FP8R): the same model FLOP/s against the platform's dense FP8
    peak (peak_fp8_tflops), beside mfu against the bf16 peak; None for other cells."""
    total_params: int | None = None
    """Parameters of the model as built."""
    trainable_params: int | None = None
    """Parameters the optimizer updates."""
    trainable_desc: str | None = None
    """Which parameters train (e.g. for Q: embeddings, norms and lm_head)."""
    frozen_params_unchanged: bool | None = None
    """Frozen (base) weights bit-identical after training (None: nothing frozen)."""
    optimizer_param_numel: int | None = None
    """Elements the optimizer updates, summed over ranks (ZeRO pads partitions a little)."""
    attention: str | None = None
    """Attention implementation actually used (e.g. sdpa[flash], eager)."""
    compute_dtype: str | None = None
    """Dtype the model computed in: bf16 (the paper's) or fp32 (the platform's compute_dtype)."""
    global_batch_tokens: int | None = None
    """Tokens per optimizer step over all GPUs."""
    loss_last: float | None = None
    """Loss at the last measured step of the last repeat (a sanity check, not a result)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Record:
    """One cell's result."""

    schema_version: int = SCHEMA_VERSION
    """Record format version."""
    cell: dict[str, Any]
    """The cell (llmbench.cells.Cell.to_dict())."""
    status: str
    """ok | oom | error | timeout | skipped."""
    reason: str = ""
    """Why the status is what it is (empty for ok)."""
    log_tail: str = ""
    """Last lines of the failing process's output (non-ok records)."""
    metrics: Metrics = field(default_factory=Metrics)
    """What was measured."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """Versions, hardware, git sha, resolved config, command, times."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Flat summary of a non-training cell, units in the key names. Serving: the load's
    throughput, TTFT/TPOT/ITL/end-to-end percentiles and failures
    (llmbench.serve.metrics.summarize), server memory and start-up time. Profile cells:
    phase times (torch backend) or time per kernel class (deepspeed backend,
    llmbench.profile.kernels). Empty for other training cells (their numbers are in metrics)."""
    samples: dict[str, list] = field(default_factory=dict)
    """Raw values, one list per column, one item per measured thing: serving, one per
    request (ttft_s, e2e_s, output_tokens, ok, ...) so latency CDFs are exact;
    microbenchmarks, one per measured point (shape, size, op)."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if self.status != "ok" and not self.reason:
            raise ValueError(f"a {self.status} record needs a reason")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """Inverse of to_dict; rejects records of another schema version."""
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"record schema_version {version!r}, this llmbench reads {READABLE_VERSIONS}")
        data = {**data, "schema_version": SCHEMA_VERSION}  # 1 -> 2 adds fields with defaults
        if version < 3:
            data = _frontier_answer_skipped(data)
        known = {f.name for f in fields(Metrics)}
        m = {k: v for k, v in (data.get("metrics") or {}).items() if k in known}
        for k in ("tokens_per_s_runs", "step_time_s_runs"):
            m[k] = tuple(m.get(k) or ())
        return cls(**{**data, "metrics": Metrics(**m)})


def _frontier_answer_skipped(data: dict[str, Any]) -> dict[str, Any]:
    """2 -> 3: a probe answered from the frontier ran nothing: skipped, its answer (the
    status and peak the batch once had) moved from status and metrics to provenance."""
    prov = data.get("provenance") or {}
    if prov.get("command") != FRONTIER_COMMAND or data.get("status") == "skipped":
        return data
    peaks = [v for k, v in (data.get("metrics") or {}).items() if k.startswith("peak_") and v is not None]
    answer = {"status": data["status"], "peak_gib": peaks[0] if peaks else None}
    return {**data, "status": "skipped", "metrics": {}, "provenance": {**prov, "frontier": answer}}


def write_json_atomic(path: Path | str, data: Any) -> None:
    """Write JSON to a temporary file in the same folder, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True, allow_nan=False)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def wall_s(provenance: dict[str, Any]) -> float | None:
    """Seconds from a record's provenance ``started`` to ``finished`` (None where either is
    missing or unreadable)."""
    try:
        return (datetime.fromisoformat(provenance["finished"])
                - datetime.fromisoformat(provenance["started"])).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def own_wall(provenance: dict[str, Any]) -> bool:
    """Whether a record's wall time (wall_s) is its repeats' alone: not where repeats were
    resumed from an earlier run (``resumed_repeats``), nor for a paired set's record, whose
    wall time spans every cell of the set, their repeats interleaved (``paired_set``:
    llmbench.grid.paired)."""
    return not (provenance.get("resumed_repeats") or provenance.get("paired_set"))


def repeat_timing(rec: dict[str, Any]) -> tuple[float, float, int, int] | None:
    """(set-up seconds a repeat, timed-window seconds a repeat, steps in the window, measured
    steps of all its repeats: how much it saw) of an ok record or probe. The set-up is its
    wall time a repeat less its window (the window covers the warm-up and measured steps,
    llmbench.protocol.run_window); where the wall time is not its repeats' alone (own_wall:
    resumed repeats, a paired set's record), it is the worker's other phases
    (llmbench.train.scenario.Phases: from the process's start, so without the launcher's few
    seconds before it). None where the record lacks a window or steps."""
    try:
        summary = rec["summary"]
        window = float(summary["phase_window_s"])
        protocol = rec["cell"]["protocol"]
        steps = int(protocol["warmup_steps"]) + int(protocol["measured_steps"])
    except (KeyError, TypeError, ValueError):
        return None
    if rec.get("status") != "ok" or not steps:
        return None
    provenance = rec.get("provenance") or {}
    wall = wall_s(provenance)
    repeats = len((rec.get("metrics") or {}).get("tokens_per_s_runs") or ()) or 1
    if wall is None or not own_wall(provenance):
        setup = sum(v for k, v in summary.items()
                    if k.startswith("phase_") and k != "phase_window_s" and isinstance(v, (int, float)))
    else:
        setup = max(wall / repeats - window, 0.0)
    return setup, window, steps, int(protocol["measured_steps"]) * repeats


def write(record: Record, path: Path | str) -> None:
    """Write a Record atomically."""
    write_json_atomic(path, record.to_dict())


class RecordError(ValueError):
    """A record file that cannot be read (cut short, hand-edited, of another llmbench): one
    line naming the file, what is wrong with it and how to rerun its cell."""

    def __init__(self, path: Path | str, problem: str, remedy: str | None = None):
        self.path, self.problem = str(path), problem
        self.remedy = rerun_hint(path) if remedy is None else remedy
        super().__init__(f"{self.path}: {problem}; {self.remedy}")

    def with_remedy(self, remedy: str) -> RecordError:
        """The same error with another way to redo the record (e.g. for another results
        folder's record, which this run's grid does not rerun)."""
        return RecordError(self.path, self.problem, remedy)


def rerun_hint(path: Path | str) -> str:
    """How to rerun the cell whose record ``path`` is (its target is its path; a max-batch
    probe is redone by its search, whose folder is the target)."""
    from .cells import parse

    parsed = parse(path)
    if parsed is None:
        return "delete it and rerun the cell that wrote it"
    if parsed.is_probe:
        folder = Path(path).parent.parent
        return f"to rerun its max-batch search, delete {folder} and run snakemake {folder} (with the run's config)"
    return f"to rerun its cell, delete it and run snakemake {path} (with the run's config)"


def read(path: Path | str) -> Record:
    """Read a Record; a file that holds none (cut short, not JSON, not a record this
    llmbench reads) raises RecordError naming it."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as exc:
        raise RecordError(path, f"not UTF-8 text (byte offset {exc.start})") from None
    if not text.strip():
        raise RecordError(path, "empty file (a copy or a write cut short)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # write_json_atomic ends every record with its closing brace: without it, the file
        # was cut short (an interrupted copy); with it, edited into something else
        what = "not valid JSON" if text.rstrip().endswith("}") else "cut short (not valid JSON)"
        raise RecordError(path, f"{what} at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise RecordError(path, f"not a record: a JSON {type(data).__name__}, not an object")
    try:
        return Record.from_dict(data)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a field missing, unknown or of a wrong type
        raise RecordError(path, f"not a record this llmbench reads: {exc}") from None
