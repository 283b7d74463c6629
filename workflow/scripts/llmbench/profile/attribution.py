"""Attributing profiled op and kernel time to the modules of one Llama training step.

The paper (Section IV-B/C) splits a step into forward, backward and optimizer (Tables V,
VII), the forward and backward into module kinds (Table VI, Fig. 5; KINDS below), the
attention into its parts (Table VIII) and each phase into GEMM and the rest (Table XIII).
The method, in full (METHOD is the short form every result carries):

Phases. A step runs as three phases, each a ``record_function`` range named
``llmbench/phase/<phase>`` that ends with a device synchronize; the worker reads the host
clock at every boundary, so a phase's wall time is exact and the phases add up to the step.
An op belongs to the phase whose range (on any thread) holds its start.

Time of an op. On a GPU: the summed durations of the device activities (kernels, memcpy,
memset) it launched itself; kineto links each to the innermost op that was running when it
was launched (``FunctionEvent.kernels``), so every kernel is counted once. Only operators
count (``_is_op``): torch.profiler's parser hands a device activity to every CPU event
whose id equals the activity's correlation id, and the CPU events other than operators
(runtime calls such as cudaLaunchKernel, kineto's own "Activity Buffer Request" and "Buffer
Flush") have ids from another counter, so some of them carry copies of an operator's
kernels. torch 2.13 marks operators (``activity_type`` cpu_op); torch 2.11, which the H100
runs used, has no ``activity_type``, so those events passed as operators there and a
phase's kernels were counted twice (an optimizer phase held more kernel time than its
wall). Without ``activity_type``, runtime
calls and the kineto events seen so far are told by name, and of several events that share
an id and hold kernels only the operator counts (``_shadowed``: the one named ``ns::op``,
else one inside the op tree), so an event kineto adds later cannot double count. A range
(``record_function``) holds no operator's kernels; an entry named like the range itself
(kineto's gpu_user_annotation span of the kernels launched in it, where a torch version
links it to the range) is not a kernel and is dropped; any other device activity a range
holds outside every op counts as a pseudo-op of that range.
The check: every GPU phase also carries ``device_s``, the summed durations of all device
activities that started in it, read from the device events themselves, so the attributed
``kernel_s`` can be held against it (``kernel_s`` <= ``device_s``, equal when every
activity was launched by an op; tables flag a phase that holds more). On a CPU: the
op's self CPU time (its span minus its child ops' spans), so nested ops (``aten::linear`` >
``aten::matmul`` > ``aten::mm``) are not counted twice.

Forward. Forward pre-hooks open and forward post-hooks (``always_call=True``, so an
exception, such as checkpointing's early stop, still closes them) close a range
``llmbench/module/<kind>`` around embed_tokens, q/k/v_proj (qkv), o_proj (output), the MLP,
every RMSNorm and lm_head; wrappers do the same around functions that are no module:
``apply_rotary_pos_emb`` and the rotary table (rope), the attention function
(``llmbench/attention/core``) and the loss function. The attention module itself gets a
range ``llmbench/attention/block``. An op takes the kind of its innermost range. (Full
backward hooks mis-nest on HF attention and ``with_modules=True`` only sees TorchScript, so
neither is used.)

Attention core. If the core range of one call holds a fused attention op (flash,
memory-efficient or cuDNN SDPA, flash-attn) or, on a GPU, an op that launched an attention
kernel (flash, fmha), every op in it is ``attention_fused``.
Otherwise its ops, in start order, are split at the softmax: ops before the first softmax
op are ``attn_scores`` (the paper's Bmm0: QK^T with scaling, mask and the repeat_kv and
transposes that feed it); from the softmax op to the first matmul after it, ``softmax``
(with its dtype casts and dropout); from that matmul on, ``attn_values`` (Bmm1: PV and the
transpose back). Ops directly in the attention block, outside its child ranges (the
reshapes into and out of heads), are qkv before the core and output after it.

Backward, through sequence numbers. What torch 2.13's profiler offers: every op event
(``FunctionEvent``) has ``sequence_nr`` (the autograd sequence number current when the op
was dispatched through autograd; -1 for ops below autograd, e.g. inside a kernel or in
backward) and ``thread`` (the profiler's thread id); the autograd engine records each node
it runs twice, as ``autograd::engine::evaluate_function: MmBackward0`` (scope FUNCTION) and
``MmBackward0`` (scope BACKWARD_FUNCTION), both with the node's ``sequence_nr`` and
``fwd_thread`` (the thread id of the forward op that made it, same id space as
``thread``). The ops of the backward pass run inside these nodes with ``sequence_nr`` -1.
So a backward op takes the kind of the forward op with the same (thread, sequence_nr) as
its nearest node. Several forward ops can share one sequence number (a composite op and
its children, ops that make no node); the node is made by the last of them to start, so
that one decides. Nodes without a forward op (AccumulateGrad, sequence_nr -1) stay
unattributed. ``FunctionEvent.is_legacy`` is False for kineto events; legacy events (a
fake kernel per op from CUDA events) are not expected and not handled specially.

Recomputation (R). Non-reentrant checkpointing reruns each decoder layer's forward inside
the backward pass, in the node that first needs a saved tensor; the module hooks fire
again, so those ops sit in module ranges inside a node. Such an op counts in its module's
backward row and is also reported as ``recompute_s`` (per row and per phase): the paper's
Fig. 5 "backward without the recomputation part" is time_s - recompute_s. A recomputed op
outside every module (a residual add) is told from backward work by its sequence_nr: the
backward pass runs with grad mode off (no create_graph), so its own ops carry -1, while
rerun forward ops carry a number; it stays unattributed ('other').

Optimizer. Every op of the optimizer phase (gradient clipping, AdamW, zero_grad) is
``optimizer``.

GEMM. CPU: the time of matmul ops (aten::mm, addmm, bmm, baddbmm, matmul, linear, ...).
GPU: the time of kernels named like GEMMs (gemm, cutlass, cublas, nvjet, xmma, sm90_...),
less attention kernels (flash, fmha), whose matmuls are counted with attention.

other. In every phase ``other`` = wall time - attributed time: ops outside every module
(residual adds, mask and position set-up, AccumulateGrad), Python and launch overhead and
device idle time. So each phase's rows add up to its wall time and its shares to 1. On a
GPU, kernels of several streams that overlap can make it negative.

Which wall time (``step_walls``). torch.profiler costs host time per operator and kernel
(tests/bench_profiler_overhead.py measures it; on the H100s a step under the profiler and
the module hooks took up to 1.6 times its unprofiled wall). Op times on a GPU are device
times, which that host cost does
not change, so on a GPU the phases take the wall times of the settled unprofiled steps (the
later half of the warm-up, run with the same syncs) and the rows add up to the step the
profiler did not slow down; 'other' there is mostly the device waiting for the host. On a
CPU op times are host times taken under the profiler, so the phases keep the profiled
steps' walls (the unprofiled ones are recorded beside them).

Everything here is pure (no torch import): the worker hands over torch.profiler events,
``op_records`` reduces them to OpRecords, ``assign`` gives each a kind, ``aggregate`` makes
the rows. The unit tests drive them with synthetic records.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import fmean
from typing import Any

PHASES = ("forward", "backward", "optimizer")
#: Phases of serving forward passes (profile backend inference): the prompts' prefill, then
#: the decode steps with the KV cache. Their ops are attributed as forward ops are.
INFERENCE_PHASES = ("prefill", "decode")
#: Module kinds in the paper's Table VI order (attn_scores = Bmm0, attn_values = Bmm1,
#: lm_head = "Linear"); attention_fused replaces the three attention parts under F.
KINDS = ("embedding", "qkv", "rope", "attn_scores", "softmax", "attn_values", "attention_fused",
         "output", "mlp", "rmsnorm", "lm_head", "loss", "optimizer")
EAGER_ATTENTION = ("attn_scores", "softmax", "attn_values")
FUSED_ATTENTION = "attention_fused"
OTHER = "other"

PHASE_PREFIX = "llmbench/phase/"
MODULE_PREFIX = "llmbench/module/"
ATTENTION_BLOCK = "llmbench/attention/block"
ATTENTION_CORE = "llmbench/attention/core"
_CONTEXT_PREFIXES = (MODULE_PREFIX, "llmbench/attention/")
#: device activity types (torch.profiler ``activity_type``) that take device time
DEVICE_ACTIVITIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})

#: Matmul-class operators (CPU GEMM time; the attention core's matmul boundaries).
MATMUL_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
    "aten::linear", "aten::_addmm_activation", "aten::mv", "aten::addmv", "aten::_int_mm",
    "aten::_scaled_mm",
})
_GEMM_KERNEL = re.compile(r"gemm|cutlass|cublas|nvjet|xmma|^sm\d+_", re.IGNORECASE)
_ATTENTION_KERNEL = re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)
_FUSED_ATTENTION_OP = re.compile(r"flash|efficient_attention|cudnn_attention|fused_attention")

METHOD = (
    "Each step runs as forward, backward and optimizer phases, each a torch.profiler "
    "record_function range ending in a device synchronize and timed on the host clock, so "
    "phase wall times are exact and add up to the step. An op's time is the summed duration "
    "of the device kernels it launched (GPU) or its self CPU time (CPU). Forward pre/post "
    "hooks and function wrappers open named ranges around embed_tokens, q/k/v_proj, "
    "apply_rotary_pos_emb and the rotary table, the attention function, o_proj, the MLP, every "
    "RMSNorm, lm_head and the loss; an op takes the kind of its innermost range. In the "
    "attention function a fused kernel op makes the whole call attention_fused; otherwise ops "
    "before the softmax are attn_scores (Bmm0), from the softmax to the next matmul softmax, "
    "and the rest attn_values (Bmm1). A backward op takes the kind of the forward op whose "
    "(thread, sequence_nr) equals its autograd node's (fwd_thread, sequence_nr). With "
    "recomputation the hooks fire again inside the backward pass; those forward ops count in "
    "the backward row of their module and in recompute_s. Optimizer-phase ops are "
    "'optimizer'. GEMM time: matmul ops (CPU) or GEMM-named kernels (GPU). 'other' is each "
    "phase's wall time minus the attributed time (ops outside modules, overhead, idle), so a "
    "phase's rows sum to its wall time. Wall times: GPU, the unprofiled steps' (the later half "
    "of the warm-up; the profiler's host cost would otherwise land in 'other'); CPU, the "
    "profiled steps'. Details: llmbench/profile/attribution.py."
)


def settled(warm: list) -> list:
    """The warm-up steps that count as unprofiled steps: the later half (the first ones pay
    allocation and kernel selection)."""
    return warm[len(warm) // 2:]


def step_walls(warm: list[list[float]], measured: list[list[float]], phases: tuple[str, ...],
               use_device: bool) -> tuple[dict[str, float], dict[str, float], str]:
    """(the walls the rows add up to, the profiled steps' walls, which of the two), each the
    mean wall time per phase from steps' host-clock marks (a step's start, then each phase's
    end). GPU (``use_device``): the ``settled`` warm-up steps; CPU, or fewer than two warm-up
    steps (the only one is the cold one): the profiled steps (see the module docstring)."""
    def walls(marks: list[list[float]]) -> dict[str, float]:
        return {p: fmean(m[i + 1] - m[i] for m in marks) for i, p in enumerate(phases)}

    profiled = walls(measured)
    if use_device and len(warm) >= 2:
        return walls(settled(warm)), profiled, "unprofiled"
    return profiled, profiled, "profiled"


def phase_range(phase: str) -> str:
    """The record_function name of a phase."""
    return PHASE_PREFIX + phase


def module_range(kind: str) -> str:
    """The record_function name of a module kind."""
    return MODULE_PREFIX + kind


def is_matmul_op(name: str) -> bool:
    """A matmul-class operator (aten::mm, bmm, matmul, linear, ...)."""
    return name in MATMUL_OPS


def is_gemm_kernel(name: str) -> bool:
    """A device kernel that is a GEMM (cuBLAS, cuBLASLt nvjet, CUTLASS), not attention."""
    return bool(_GEMM_KERNEL.search(name)) and not _ATTENTION_KERNEL.search(name)


def is_softmax_op(name: str) -> bool:
    """A softmax operator (aten::softmax, _softmax, _safe_softmax)."""
    return "softmax" in name and "log_softmax" not in name


def is_fused_attention_op(name: str) -> bool:
    """An operator that runs attention as one fused kernel (flash, memory-efficient, cuDNN)."""
    return bool(_FUSED_ATTENTION_OP.search(name))


@dataclass(kw_only=True, slots=True, frozen=True)
class OpRecord:
    """One profiled operator, reduced to what attribution needs."""

    name: str
    """Operator name (aten::mm)."""
    start_us: float
    """Start on the profiler clock (orders the ops)."""
    phase: str | None
    """forward | backward | optimizer: the phase range holding its start (None: outside)."""
    time_us: float
    """Its own time: GPU, summed durations of the device activities it launched; CPU, self CPU time."""
    gemm_us: float = 0.0
    """The part of time_us that is GEMM."""
    ranges: tuple[tuple[str, int], ...] = ()
    """llmbench module/attention ranges around it as (name, instance id), outermost first,
    up to its nearest autograd node."""
    node: tuple[int, int] | None = None
    """(fwd_thread, sequence_nr) of its nearest autograd node (backward ops); None without one."""
    thread: int = 0
    """Profiler thread id it started on."""
    seq: int = -1
    """Its sequence_nr (>= 0 for ops dispatched through autograd in the forward pass)."""
    attention_kernel: bool = False
    """It launched a fused attention kernel (flash, fmha): GPU runs."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Attributed:
    """An op and the module kind its time goes to."""

    op: OpRecord
    kind: str | None
    """A KINDS entry, or None (unattributed: counted in 'other')."""
    recomputed: bool = False
    """A forward op rerun inside the backward pass (activation recomputation)."""


class _Attention:
    """Per-call state of attention ranges: which core calls are fused, where each core call
    is in its eager sequence, which attention blocks have passed their core."""

    def __init__(self, ops: list[OpRecord]) -> None:
        self.fused = {uid for op in ops if op.attention_kernel or is_fused_attention_op(op.name)
                      for name, uid in op.ranges if name == ATTENTION_CORE}
        self.state: dict[int, str] = {}
        self.block_past_core: set[int] = set()

    def core_kind(self, op: OpRecord, uid: int) -> str:
        for name, block in op.ranges:
            if name == ATTENTION_BLOCK:
                self.block_past_core.add(block)
        if uid in self.fused:
            return FUSED_ATTENTION
        state = self.state.get(uid, "attn_scores")
        if state == "attn_scores" and is_softmax_op(op.name):
            state = "softmax"
        elif state == "softmax" and is_matmul_op(op.name):
            state = "attn_values"
        self.state[uid] = state
        return state

    def block_kind(self, uid: int) -> str:
        return "output" if uid in self.block_past_core else "qkv"


def _range_kind(op: OpRecord, attention: _Attention) -> str | None:
    name, uid = op.ranges[-1]
    if name == ATTENTION_CORE:
        return attention.core_kind(op, uid)
    if name == ATTENTION_BLOCK:
        return attention.block_kind(uid)
    kind = name[len(MODULE_PREFIX):] if name.startswith(MODULE_PREFIX) else None
    return kind if kind in KINDS else None


def assign(ops: Iterable[OpRecord]) -> list[Attributed]:
    """Give every op its module kind (see the module docstring), in start order."""
    ops = sorted(ops, key=lambda o: o.start_us)
    attention = _Attention(ops)
    kinds: list[str | None] = []
    for op in ops:
        if op.phase == "optimizer":
            kinds.append("optimizer")
        elif op.phase is not None and op.ranges:
            kinds.append(_range_kind(op, attention))
        else:
            kinds.append(None)
    # (thread, sequence_nr) -> kind of the forward op that made that autograd node: of the
    # ops sharing a number the last to start made it (the counter moves on when it does).
    by_seq: dict[tuple[int, int], str | None] = {}
    for op, kind in zip(ops, kinds):
        if op.phase == "forward" and op.seq >= 0:
            by_seq[(op.thread, op.seq)] = kind
    out = []
    for op, kind in zip(ops, kinds):
        # backward runs with grad mode off, so its ops carry sequence_nr -1; an op of the
        # backward phase inside a module range or with a sequence number is forward work
        # rerun by recomputation (a residual add between modules has no range)
        recomputed = op.phase == "backward" and (bool(op.ranges) or op.seq >= 0)
        if op.phase == "backward" and not recomputed and op.node is not None:
            kind = by_seq.get(op.node)
        out.append(Attributed(op=op, kind=kind, recomputed=recomputed))
    return out


def aggregate(attributed: Iterable[Attributed], phase_wall_s: Mapping[str, float],
              steps: int, phases_run: tuple[str, ...] = PHASES,
              device_us: Mapping[str, float] | None = None) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Rows (phase, module kind, time per step, share of the phase, GEMM time, recomputed
    time) and per-phase totals, from the attributed ops of ``steps`` steps and each phase's
    mean wall time per step. Each phase ends with the row 'other' = wall - attributed, so
    its rows sum to its wall time and its shares to 1. ``phases_run``: the phases (PHASES
    for a training step, INFERENCE_PHASES for serving forward passes). ``device_us``
    (``device_time``, GPU runs): each phase's total device activity, kept per step as
    ``device_s`` beside the attributed ``kernel_s``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    time: dict[str, dict[str, float]] = {p: defaultdict(float) for p in phases_run}
    gemm: dict[str, dict[str, float]] = {p: defaultdict(float) for p in phases_run}
    recompute: dict[str, dict[str, float]] = {p: defaultdict(float) for p in phases_run}
    seen: dict[str, set[str]] = {p: set() for p in phases_run}
    totals = {p: {"kernel": 0.0, "gemm": 0.0, "recompute": 0.0} for p in phases_run}
    for a in attributed:
        phase = a.op.phase
        if phase not in time:
            continue
        t, g = a.op.time_us / 1e6 / steps, a.op.gemm_us / 1e6 / steps
        totals[phase]["kernel"] += t
        totals[phase]["gemm"] += g
        totals[phase]["recompute"] += t if a.recomputed else 0.0
        if a.kind is None:
            continue
        seen[phase].add(a.kind)
        time[phase][a.kind] += t
        gemm[phase][a.kind] += g
        if a.recomputed:
            recompute[phase][a.kind] += t
    rows: list[dict[str, Any]] = []
    phases: dict[str, dict[str, float]] = {}
    for phase in phases_run:
        wall = float(phase_wall_s[phase])
        kinds = [k for k in KINDS if k in seen[phase]]
        attributed_s = sum(time[phase][k] for k in kinds)
        attributed_gemm = sum(gemm[phase][k] for k in kinds)
        for k in kinds:
            rows.append(_row(phase, k, time[phase][k], wall, gemm[phase][k], recompute[phase][k]))
        rows.append(_row(phase, OTHER, wall - attributed_s, wall, totals[phase]["gemm"] - attributed_gemm,
                         totals[phase]["recompute"] - sum(recompute[phase].values())))
        phases[phase] = {
            "wall_s": wall,
            "kernel_s": totals[phase]["kernel"],
            "gemm_s": totals[phase]["gemm"],
            "attributed_s": attributed_s,
            "unattributed_kernel_s": totals[phase]["kernel"] - attributed_s,
            "recompute_s": totals[phase]["recompute"],
        }
        if device_us is not None:
            phases[phase]["device_s"] = device_us.get(phase, 0.0) / 1e6 / steps
    return rows, phases


def _row(phase: str, module: str, time_s: float, wall: float, gemm_s: float, recompute_s: float) -> dict[str, Any]:
    return {"phase": phase, "module": module, "time_s": time_s, "share": time_s / wall if wall > 0 else None,
            "gemm_time_s": gemm_s, "recompute_s": recompute_s}


def _is_node(event: Any) -> bool:
    """An autograd node the engine runs (scope 1 = BACKWARD_FUNCTION, or its evaluate_function)."""
    return event.scope == 1 or event.name.startswith("autograd::engine::evaluate_function")


def _on_cpu(event: Any) -> bool:
    return getattr(event.device_type, "name", str(event.device_type)).upper().endswith("CPU")


#: CPU events that are no operator, by name, for torch versions whose FunctionEvent has no
#: activity_type (2.11): CUDA runtime and driver calls (cudaLaunchKernel, cuLaunchKernelEx,
#: cudaStreamIsCapturing, ...) and kineto's own events
_NOT_OP_NAME = re.compile(r"^(cuda|cu|nccl|cupti)[A-Z]\w*$|^(Activity Buffer Request|Buffer Flush|"
                          r"Command Buffer Full|CUPTI Overhead|Overhead)$")


def _is_op(event: Any) -> bool:
    """A CPU operator: not a range, an autograd node, a runtime call, one of the profiler's
    own events or a device activity."""
    activity = getattr(event, "activity_type", None)
    if activity is not None and activity != "cpu_op":
        return False
    if activity is None and _NOT_OP_NAME.match(event.name):
        return False
    return (_on_cpu(event) and not event.is_async and not event.is_user_annotation and event.scope == 0
            and not event.name.startswith("autograd::"))


def _shadowed(events: list[Any]) -> set[int]:
    """Events (by Python id) that hold copies of an operator's kernels: of the operator
    candidates that share a profiler id and hold kernels, all but the operator (named
    ``ns::op``, else one with a parent in the op tree). Operators' ids come from one counter,
    so a real group holds one operator and other events (see the module docstring)."""
    groups: dict[int, list[Any]] = defaultdict(list)
    for e in events:
        if _is_op(e) and e.kernels:
            groups[e.id].append(e)
    out: set[int] = set()
    for group in groups.values():
        if len(group) > 1:
            keep = max(group, key=lambda e: ("::" in e.name, e.cpu_parent is not None))
            out.update(id(e) for e in group if e is not keep)
    return out


def _is_device_activity(event: Any) -> bool:
    """A device activity that takes device time (kernel, memcpy, memset): on the device and
    no user-annotation span (gpu_user_annotation)."""
    activity = getattr(event, "activity_type", None)
    if activity is not None:
        return activity in DEVICE_ACTIVITIES
    return not _on_cpu(event) and not event.is_user_annotation


def _context(event: Any) -> tuple[tuple[tuple[str, int], ...], tuple[int, int] | None]:
    """The llmbench ranges around an event up to its nearest autograd node, and that node."""
    ranges = []
    parent = event.cpu_parent
    while parent is not None:
        if _is_node(parent):
            node = (parent.fwd_thread, parent.sequence_nr) if parent.sequence_nr >= 0 else None
            return tuple(reversed(ranges)), node
        if parent.name.startswith(_CONTEXT_PREFIXES):
            ranges.append((parent.name, id(parent)))
        parent = parent.cpu_parent
    return tuple(reversed(ranges)), None


def _phase_at(events: list[Any]):
    """A function: profiler time -> the phase whose range holds it (None: outside)."""
    spans = sorted((e.time_range.start, e.time_range.end, e.name[len(PHASE_PREFIX):]) for e in events
                   if e.is_user_annotation and _on_cpu(e) and e.name.startswith(PHASE_PREFIX))
    starts = [s[0] for s in spans]

    def phase_at(t: float) -> str | None:
        i = bisect.bisect_right(starts, t) - 1
        return spans[i][2] if i >= 0 and t <= spans[i][1] else None

    return phase_at


def _launched(e: Any) -> list[Any]:
    """The device activities an event launched: its ``kernels`` less a range's own
    gpu_user_annotation mirror (named like the range; see the module docstring)."""
    if e.is_user_annotation:
        return [k for k in e.kernels if k.name != e.name]
    return list(e.kernels)


def device_time(events: Iterable[Any]) -> dict[str, float]:
    """Microseconds of device activity (kernels, memcpy, memset) per phase, from the
    device events themselves: each counts in the phase whose range holds its start (a
    phase ends with a device synchronize, so its activities run inside its range). The
    independent total the attributed kernel time is checked against."""
    events = list(events)
    phase_at = _phase_at(events)
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if _is_device_activity(e):
            phase = phase_at(e.time_range.start)
            if phase is not None:
                out[phase] += e.time_range.end - e.time_range.start
    return dict(out)


def op_records(events: Iterable[Any], use_device: bool) -> list[OpRecord]:
    """torch.profiler FunctionEvents (``prof.events()``) -> OpRecords.

    use_device: time ops by the device activities they launched (a GPU run with CUDA
    activity) rather than by their self CPU time.
    """
    events = list(events)
    phase_at = _phase_at(events)
    shadowed = _shadowed(events) if use_device else set()
    out = []
    for e in events:
        own: tuple[tuple[str, int], ...] = ()
        if _is_op(e):
            if id(e) in shadowed:
                continue
        elif use_device and _on_cpu(e) and e.is_user_annotation and _launched(e):
            # device activity launched inside a range but outside any operator (a library
            # calling CUDA directly): a pseudo-op of the range itself, so it is not lost
            own = ((e.name, id(e)),) if e.name.startswith(_CONTEXT_PREFIXES) else ()
        else:
            continue
        if use_device:
            launched = _launched(e)
            t = sum(k.duration for k in launched)
            g = sum(k.duration for k in launched if is_gemm_kernel(k.name))
            fused = any(_ATTENTION_KERNEL.search(k.name) for k in launched)
        else:
            t = e.self_cpu_time_total
            g = t if is_matmul_op(e.name) else 0.0
            fused = False
        ranges, node = _context(e)
        out.append(OpRecord(name=e.name, start_us=e.time_range.start, phase=phase_at(e.time_range.start),
                            time_us=float(t), gemm_us=float(g), ranges=ranges + own, node=node,
                            thread=e.thread, seq=e.sequence_nr, attention_kernel=fused))
    return out
