"""How long a training cell's repeat should take, predicted before it runs, and what follows:
the Slurm time limit of its job and the deadline check of a repeat not timed yet.

A repeat's predicted duration is its start-up (startup_s: the process, its imports, the
process group, the model and engine built) plus its warm-up and measured steps times the
step time of the throughput model (llmbench.throughput). Two margins over it, for two costs:

- DEADLINE_MARGIN: a job with a deadline (llmbench.ledger.deadline_stop) starts a repeat of a
  cell that no repeat has timed yet only where this much of the prediction is left: it covers
  the p95 of measured / predicted repeat time over the committed records (`python -m
  llmbench.throughput score`, its repeat table; docs/throughput-model.md), all but the
  start-up-bound tail (short repeats whose ranks were exec'ed). A timed repeat of the cell,
  once there is one, replaces it.
- SLURM_MARGIN and SLURM_SLACK_MIN: a Slurm job's time limit (runtime_min) is twice the
  prediction of every repeat plus ten minutes (Snakemake's own start inside the job, op
  builds on a fresh node). Slurm kills a job at its limit inside a repeat, which costs the
  repeat, so its margin is wider than the deadline check's, which costs only the rest of
  the job: twice covers every repeat of the same records. It never exceeds the
  timeout-based bound (timeout_runtime_min: every repeat may use its whole timeout), nor
  falls under SLURM_FLOOR_MIN. tests/calibration holds both margins to the records.

The model predicts only what it was fitted on and checked against (why_not): pre-training
and fine-tuning with DeepSpeed, with PyTorch FSDP2 and with Megatron-LM as plain data parallel
(llmbench.throughput.model.BACKENDS), one node, no torch.compile, no FP8, no adapter but LoRA
(QLoRA too), on the platforms whose records calibrated it
(llmbench.throughput.CALIBRATION_PLATFORMS). Elsewhere the bound is today's, the protocol's
timeout: on CPU platforms (no FLOP/s peak), for serving and microbenchmark cells, for
profile cells, plain torch's among them (a profiler's overhead), for FSDP2 with CPU
offload and FP8 training (llmbench.throughput.model.not_modelled), for Megatron-LM with
tensor or pipeline parallelism and for cells over several nodes (not modelled), and on the
paper's platforms (A800, RTX 4090, RTX 3090), where the model's step time is up to 5x too
short against the paper's own offload cells and 5-13x on the RTX servers
(docs/throughput-model.md): no margin that still shortens the limit would hold there. Also
where the model's constants, or the records its hardware numbers are read from, are missing
(its ConfigError is the estimate's note).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .cells import SEARCH_STAGES, Cell, MicroCell, ServeCell
from .config import REPO_ROOT, ConfigError
from .grid.paired import engine_sessions
from .models import ModelSpec
from .techniques import Technique

#: Minutes a serving job adds per engine it starts, beyond the engine's ready_timeout_s (serve_runtime_min)
SERVE_SLACK_MIN = 10
#: Seconds of the prediction a job's deadline check wants left before an untimed repeat (module docstring).
DEADLINE_MARGIN = 1.5
#: A Slurm time limit is this times the predicted repeats ...
SLURM_MARGIN = 2.0
#: ... plus these minutes (Snakemake's own start inside the job, op builds on a fresh node)
SLURM_SLACK_MIN = 10
#: The shortest time limit a predicted cell asks for, in minutes (the timeout-based bound wins where it is shorter)
SLURM_FLOOR_MIN = 15
#: Start-up seconds every repeat pays: the ranks' imports where they are exec'ed (11-17 s in the
#: committed records' phase_imports_s; 0 under the fork server), the process group (1-3 s,
#: phase_init_distributed_s) and the launcher's own (wall time less the worker's phases: p95 20 s)
STARTUP_FIXED_S = 30.0
#: Build seconds per 1e9 parameters where each rank builds the whole model (phase_build_s:
#: p95 34 s for llama2-7b, 14 s for llama2-13b, 55 s for llama2-70b with 4-bit weights on four ranks)
BUILD_S_PER_GPARAM = 1.0
#: Build seconds per 1e9 parameters of a rank's shard with DeepSpeed's ZeRO-3 or with offload
#: (partitioning, host buffers, the CPU optimizer: phase_build_s p95 61 s for llama2-7b Z3+O,
#: 92 s for llama2-13b Z3+O, on one GPU). FSDP2's full sharding pays none of it: it shards a
#: model built on the meta device and materialises the shards (phase_build_s at most 1.1 s for
#: llama2-7b and llama3.1-8b Z3 on one or two GPUs), so its build is the whole-model term.
BUILD_SHARDED_S_PER_GPARAM = 5.0
#: Adapters the model covers (llmbench.throughput.model.trainable_params counts LoRA's matrices)
ADAPTERS = (None, "lora")


@dataclass(kw_only=True, slots=True, frozen=True)
class RepeatEstimate:
    """One repeat of a cell: predicted seconds where the throughput model covers it, else its timeout."""

    predicted_s: float | None
    """Predicted seconds of one repeat (startup_s + steps x step_s); None where the model cannot predict."""
    startup_s: float | None
    """The start-up part of it (startup_s)."""
    step_s: float | None
    """Predicted seconds per step (llmbench.throughput.step_time_s)."""
    steps: int
    """Warm-up and measured steps of a repeat."""
    timeout_s: float
    """The repeat's timeout: the launcher stops it there, so no repeat takes longer."""
    note: str
    """What the prediction came from, or why there is none (why_not)."""

    @property
    def predicted(self) -> bool:
        """Whether the throughput model predicted it."""
        return self.predicted_s is not None

    def bound_s(self, margin: float) -> float:
        """``margin`` times the prediction, at most the timeout; the timeout where there is no prediction."""
        if self.predicted_s is None:
            return float(self.timeout_s)
        return min(margin * self.predicted_s, float(self.timeout_s))


def why_not(cell: Cell | ServeCell | MicroCell) -> str | None:
    """Why the throughput model does not predict ``cell`` (module docstring), or None where it does."""
    if not isinstance(cell, Cell) or cell.stage not in SEARCH_STAGES:
        return f"a {cell.stage} cell: the throughput model predicts pre-training and fine-tuning steps only"
    from .throughput.model import not_modelled

    tech = cell.tech
    scope = not_modelled(cell.backend, tech)
    reasons = [
        (scope is not None, scope),
        (cell.parallel is not None and (cell.parallel.get("tensor_parallel", 1) > 1
                                        or cell.parallel.get("pipeline_parallel", 1) > 1),
         "Megatron-LM with tensor or pipeline parallelism is not modelled"),
        (cell.nodes > 1, "a cell over several nodes: the network between them is not modelled"),
        (tech.compiled, "torch.compile is not modelled"),
        (tech.adapter not in ADAPTERS, f"adapter {tech.adapter!r} is not modelled"),
    ]
    if why := next((why for bad, why in reasons if bad), None):
        return why
    from .throughput.calibrate import CALIBRATION_PLATFORMS  # imported only where it decides

    if cell.platform not in CALIBRATION_PLATFORMS:
        return (f"platform {cell.platform!r} calibrated none of the model's constants, and where it was checked "
                "off them (the paper's platforms) its step times fall short by more than a margin covers")
    return None


def startup_s(cell: Cell, model: ModelSpec) -> float:
    """Seconds a repeat of ``cell`` takes before its first step (startup_of)."""
    return startup_of(cell.tech, cell.gpus, model, cell.backend)


def startup_of(tech: Technique, gpus: int, model: ModelSpec, backend: str = "deepspeed") -> float:
    """Seconds a repeat of a cell of ``tech`` over ``gpus`` under ``backend`` takes before its
    first step: STARTUP_FIXED_S plus the model's build, BUILD_S_PER_GPARAM of the whole model,
    or BUILD_SHARDED_S_PER_GPARAM of a rank's shard with DeepSpeed's ZeRO-3 or with offload
    (whichever is larger)."""
    gparams = model.param_counts()["total"] / 1e9
    build = BUILD_S_PER_GPARAM * gparams
    if (tech.zero_stage == 3 and backend != "fsdp2") or tech.offload:
        build = max(build, BUILD_SHARDED_S_PER_GPARAM * gparams / gpus)
    return STARTUP_FIXED_S + build


@cache
def _constants(root: Path) -> dict[str, float]:
    """The throughput model's calibrated constants, read once."""
    from .throughput.model import calibrated_constants

    return calibrated_constants(root)


def step_s(cell: Cell, model: ModelSpec, root: Path = REPO_ROOT) -> float:
    """The throughput model's seconds per step of a training cell with the calibrated constants
    (llmbench.throughput.step_time_s; the host's CPUs: its platform's)."""
    from .throughput.model import TrainCell, step_time_s

    train = TrainCell(stage=cell.stage, platform=cell.platform, model=model, technique=cell.tech,
                      batch_size=cell.batch_size, gpus=cell.gpus, seq_len=cell.protocol.seq_len, backend=cell.backend)
    return step_time_s(train, _constants(root), root)


def repeat(cell: Cell | ServeCell | MicroCell, model: ModelSpec | None, root: Path = REPO_ROOT) -> RepeatEstimate:
    """One repeat of ``cell`` (``model``: its model's dimensions): predicted from the throughput
    model where it covers the cell (why_not), else only its timeout (a serving cell's: its
    engine's start and its load's)."""
    if isinstance(cell, ServeCell):
        return RepeatEstimate(predicted_s=None, startup_s=None, step_s=None, steps=0,
                              timeout_s=cell.ready_timeout_s + cell.timeout_s, note=why_not(cell))
    if isinstance(cell, MicroCell):
        return RepeatEstimate(predicted_s=None, startup_s=None, step_s=None, steps=0, timeout_s=cell.timeout_s,
                              note=why_not(cell))
    p = cell.protocol
    steps = p.warmup_steps + p.measured_steps
    if (why := why_not(cell)) is not None:
        return RepeatEstimate(predicted_s=None, startup_s=None, step_s=None, steps=steps, timeout_s=p.timeout_s,
                              note=why)
    if model is None:
        raise ValueError(f"{cell.record_path()}: a training cell's estimate needs its model's dimensions")
    try:
        step = step_s(cell, model, root)
    except ConfigError as exc:  # its constants or the records its hardware is read from are not there
        return RepeatEstimate(predicted_s=None, startup_s=None, step_s=None, steps=steps, timeout_s=p.timeout_s,
                              note=f"the throughput model cannot predict it: {exc}")
    start = startup_s(cell, model)
    return RepeatEstimate(predicted_s=start + steps * step, startup_s=start, step_s=step, steps=steps,
                          timeout_s=p.timeout_s,
                          note=f"throughput model: {start:.0f} s start-up + {steps} steps x {step:.2f} s")


def timeout_runtime_min(cell: Cell) -> int:
    """A training cell's Slurm time limit where every repeat may use its whole timeout, plus
    SLURM_SLACK_MIN: the bound no prediction exceeds."""
    p = cell.protocol
    return p.repeats * (p.timeout_s // 60 + 1) + SLURM_SLACK_MIN


def serve_runtime_min(cell: ServeCell, starts_engine: bool = True) -> int:
    """A serving run's share of its job's Slurm time limit, in minutes: its load's bound
    (timeout_s) and, where the run starts its engine, the engine's (ready_timeout_s) and
    SERVE_SLACK_MIN (the engine's stop, the model folder's check); a run an engine already
    serves (a set that shares engines) adds a minute for the load generator's backstop and
    its record. Serving is not predicted (why_not): these are the bounds its job enforces."""
    if starts_engine:
        return (cell.ready_timeout_s + cell.timeout_s) // 60 + SERVE_SLACK_MIN
    return cell.timeout_s // 60 + 1


def serve_set_runtime_min(cells: Sequence[ServeCell], rounds: Sequence[Sequence[int]], share_engine: bool) -> int:
    """A paired serving set's Slurm time limit, in minutes: its runs one after the other
    (serve_runtime_min), each round's engine starts as the set makes them
    (llmbench.grid.paired.engine_sessions): one a run, or, where the set shares engines, one
    for the consecutive runs of one launch in a round. ``rounds``: the plan's, cell indices."""
    opens = {g[0] for r in rounds for g in engine_sessions(r, cells, share_engine)}
    return sum(serve_runtime_min(c, i in opens) for i, c in enumerate(cells))


def runtime_min(cell: Cell, model: ModelSpec | None, root: Path = REPO_ROOT) -> int:
    """A training cell's Slurm time limit in minutes: SLURM_MARGIN times its predicted repeats
    plus SLURM_SLACK_MIN, at least SLURM_FLOOR_MIN, at most timeout_runtime_min (which is
    also the limit where the model cannot predict the cell)."""
    bound = timeout_runtime_min(cell)
    est = repeat(cell, model, root)
    if est.predicted_s is None:
        return bound
    want = math.ceil(cell.protocol.repeats * SLURM_MARGIN * est.predicted_s / 60) + SLURM_SLACK_MIN
    return min(bound, max(SLURM_FLOOR_MIN, want))
