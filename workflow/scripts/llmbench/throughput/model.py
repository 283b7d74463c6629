"""Step time of a training cell, from terms on the host's side and the GPU's (docs/throughput-model.md).

Per GPU and per optimizer step, with T = batch_size x seq_len tokens on each GPU:

  gemm           training FLOPs (PaLM: 6N, or 4N on a frozen base, + 12·L·d·s) / (peak x GEMM efficiency)
  recompute      recomputation's extra forward (2N + 4·L·d·s FLOPs a token) + its host cost per layer
  memory         memory-bound work (norms, RoPE, SwiGLU, residuals; eager attention's scores) over HBM
  optimizer      Adam over the trainable shard: bytes / HBM on the GPU, or the CPU Adam rate when offloaded
  communication  ZeRO gradient reduction and ZeRO-3 weight gathers over the collective bus bandwidth
  offload        ZeRO-Offload traffic over PCIe (gradients down, weights up; ZeRO-3 weights every pass)
  dequant        NF4 dequantisation: bytes / HBM per use of a weight + host cost per layer
  zero3          ZeRO-3's per-parameter hooks (fetch, release, partition), present on one GPU too
  host           per-step and per-layer host work (Python, launches): dominant at batch 1

The terms fall on three sides (SIDES, side_of): the host's (host, zero3's hooks, the per-layer
host costs of recomputation and 4-bit weights), the GPU's (the rest) and a serial one (the
offloaded CPU Adam, which runs while the GPU waits for it). Host work launches GPU work
asynchronously, so the two overlap: a step takes the longer of the host's and the GPU's time,
plus OVERLAP (a fitted share, 0-1) of the shorter, plus the serial time (step_of). Within
the GPU's side, compute and communication add (an upper bound). Hardware facts come from
config/platforms (peaks) and config/throughput/constants.yaml (with a source each), replaced by
our microbenchmark records where a platform has them. The calibrated constants
(llmbench.throughput.calibrate) multiply basis features, so every term is ``known seconds +
sum(constant x feature)``: each side is linear in the constants, and the step piecewise so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

from .. import cells
from ..config import REPO_ROOT, ConfigError, parse_yaml
from ..models import ModelSpec, flops_per_token
from ..platforms import Platform
from ..techniques import Technique

#: The constants file, relative to the repository root.
CONSTANTS_FILE = Path("config") / "throughput" / "constants.yaml"
#: Line after which the calibrated block starts (rewritten by ``calibrate --write``).
CALIBRATED_MARKER = "# --- calibrated:"
#: Training backends the model times.
BACKENDS = ("deepspeed", "megatron", "fsdp2")


def not_modelled(backend: str, tech: Technique) -> str | None:
    """Why the model does not time a cell of this backend and technique, or None where it
    does (what llmbench.estimate says and what calibration leaves out)."""
    if backend not in BACKENDS:
        return f"backend {backend!r} is not modelled"
    if backend == "fsdp2" and tech.offload:
        return "FSDP2 with CPU offload (AdamW on the host) is not modelled"
    if tech.fp8 is not None:
        return "FP8 training is not modelled"
    return None


#: Terms of a step, in report order.
TERMS = ("gemm", "recompute", "memory", "optimizer", "communication", "offload", "dequant", "zero3", "host")
#: The sides a term's seconds fall on (side_of): the host's, the GPU's, and serial to both.
SIDES = ("host", "device", "serial")
#: The calibrated share of the shorter of host and GPU time that a step does not hide behind
#: the longer (step_of): 1 adds them, 0 overlaps them fully. Fitted with the others
#: (llmbench.throughput.calibrate.fit), not a linear constant: it is not in CALIBRATED.
OVERLAP = "host_device_overlap"
#: Calibrated constants: name -> (term it belongs to, unit, meaning).
CALIBRATED = {
    "host_step_s": ("host", "s", "host time per optimizer step (engine step, logging, data)"),
    "host_layer_s": ("host", "s", "DeepSpeed host time per decoder layer per step (launches, hooks, autograd)"),
    "host_layer_megatron_s": ("host", "s", "Megatron-LM host time per decoder layer per step"),
    "host_layer_fsdp2_s": ("host", "s", "PyTorch FSDP2 host time per decoder layer per step (launches, autograd, "
                           "its per-layer all-gather and reduce-scatter calls)"),
    "host_layer_adapter_s": ("host", "s", "extra host time per layer with adapters (PEFT wrappers, small kernels)"),
    "host_layer_recompute_s": ("recompute", "s", "extra host time per layer with recomputation (checkpoint replay)"),
    "host_layer_quant_s": ("dequant", "s", "extra host time per layer with 4-bit weights (bitsandbytes kernels)"),
    "host_layer_nf4_fsdp2_s": ("dequant", "s", "extra host time per layer with FSDP2's 4-bit base (torchao's NF4 "
                               "tensors: gathered in parts, dequantised by several kernels per linear)"),
    "zero3_s_per_gparam": ("zero3", "s per 1e9 params per pass", "ZeRO-3 hook cost per gathered parameter"),
    "zero3_s_per_tensor": ("zero3", "s per tensor per pass",
                           "ZeRO-3 cost per gathered parameter tensor (fetch and release hooks, whatever its size)"),
    "act_bytes_per_token_layer_unit": ("memory", "B", "HBM bytes per token, layer and hidden unit (fwd+bwd)"),
    "attn_eager_bytes_per_score": ("memory", "B", "HBM bytes per attention score (token x head x key) without F"),
    "cpu_adam_s_per_gparam": ("optimizer", "s per 1e9 params stepped on the host (all its ranks' shards)",
                              "DeepSpeed CPU Adam"),
}


@dataclass(kw_only=True, slots=True, frozen=True)
class TrainCell:
    """What the model needs of a training cell."""

    stage: str
    """'pretrain' or 'finetune'."""
    platform: str
    """Platform id (config/platforms)."""
    model: ModelSpec
    """The model's dimensions."""
    technique: Technique
    """Parsed technique."""
    batch_size: int
    """Micro-batch per GPU (sequences)."""
    gpus: int
    """Data-parallel ranks."""
    seq_len: int
    """Tokens per sequence."""
    backend: str = "deepspeed"
    """'deepspeed', 'megatron' (data parallel with the distributed optimizer) or 'fsdp2'
    (PyTorch's fully_shard per decoder layer: Z3 reshards after forward, Z2 does not, no Z
    flag replicates)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "gpus", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "fsdp2" and (why := not_modelled(self.backend, self.technique)):
            raise ValueError(why)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step over all GPUs."""
        return self.batch_size * self.seq_len * self.gpus


@dataclass(kw_only=True, slots=True, frozen=True)
class Hardware:
    """A platform's numbers as the model uses them (bytes/s and FLOP/s), with their sources."""

    platform: str
    """Platform id."""
    peak_flops: float
    """Dense bf16 peak per GPU, FLOP/s."""
    hbm_bytes_per_s: float
    """GPU memory bandwidth."""
    pcie_bytes_per_s: float | None
    """Effective host<->device bandwidth per GPU (None: no memcpy record to take it from;
    sources["pcie"] says why, and only an offloading cell needs it)."""
    bus_bytes_per_s: float | None
    """Effective NCCL bus bandwidth of the collectives (ring: time = bytes x (G-1)/G / bus;
    None: no collectives record to take it from; sources["bus"] says why, and only a cell
    of several GPUs needs it)."""
    gemm_samples: tuple[tuple[int, int, int, float], ...] = ()
    """GEMM microbenchmark points (m, n, k, fraction of peak); empty: use default_gemm_efficiency."""
    default_gemm_efficiency: float = 0.7
    """Fraction of peak for large GEMMs where no sample exists."""
    sources: dict = field(default_factory=dict)
    """Where each number came from."""

    def gemm_efficiency(self, m: int, n: int, k: int) -> float:
        """Fraction of peak for an (m, n, k) GEMM: the median of the 3 measured points nearest in
        log-shape, else the stated default."""
        if not self.gemm_samples:
            return self.default_gemm_efficiency
        import math

        def dist(s):
            return sum(abs(math.log(a / b)) for a, b in zip(s[:3], (m, n, k)))

        near = sorted(self.gemm_samples, key=dist)[:3]
        effs = sorted(s[3] for s in near)
        return effs[len(effs) // 2]


def load_constants(root: Path = REPO_ROOT) -> dict:
    """config/throughput/constants.yaml, parsed (ConfigError naming the file if malformed)."""
    path = root / CONSTANTS_FILE
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    for key in ("hardware", "assumptions", "work"):
        if not isinstance(data.get(key), dict):
            raise ConfigError(f"{path}: missing block {key!r}")
    return data


def calibrated_constants(root: Path = REPO_ROOT) -> dict[str, float]:
    """The calibrated block's values (name -> value)."""
    block = load_constants(root).get("calibrated") or {}
    values = block.get("constants") or {}
    missing = {*CALIBRATED, OVERLAP} - set(values)
    if missing:
        raise ConfigError(f"{root / CONSTANTS_FILE}: calibrated.constants lacks {sorted(missing)}; "
                          "run `python -m llmbench.throughput calibrate --write`")
    return {k: float(values[k]["value"]) for k in (*CALIBRATED, OVERLAP)}


def _facts(name: str, hw: dict) -> dict:
    """A platform's hardware block with ``same_as`` resolved (own keys win)."""
    if name not in hw:
        raise ConfigError(f"{CONSTANTS_FILE}: no hardware entry for platform {name!r}")
    entry = dict(hw[name])
    base = entry.pop("same_as", None)
    return {**_facts(base, hw), **entry} if base else entry


def _micro_records(platform: str, bench: str, root: Path) -> list[dict]:
    out = []
    # the micro record grammar of llmbench.cells, under any committed run
    pattern = "*/" + cells.MICRO_RECORD_PATTERN.format(platform=platform, bench=bench, case="*", gpus="*")
    for path in sorted((root / "results" / "reference").glob(pattern)):
        rec = json.loads(path.read_text())
        if rec.get("status") == "ok":
            rec["_path"] = str(path.relative_to(root))
            out.append(rec)
    return out


def _measured_bus(platform: str, p2p: bool, root: Path) -> tuple[float, str] | None:
    """Median over all_gather, reduce_scatter and all_reduce of the best bus bandwidth at
    messages of 256 MiB and more, from a collectives record of the platform (bytes/s)."""
    for rec in _micro_records(platform, "collectives", root):
        if bool(rec["cell"].get("params", {}).get("p2p", True)) != p2p:
            continue
        s = rec["samples"]
        best: dict[str, float] = {}
        for op, nbytes, bus in zip(s["op"], s["bytes"], s["busbw_gb_per_s"]):
            if op in ("all_gather", "reduce_scatter", "all_reduce") and nbytes >= 2**28:
                best[op] = max(best.get(op, 0.0), bus)
        if best:
            vals = sorted(best.values())
            return vals[len(vals) // 2] * 1e9, rec["_path"]
    return None


def _measured_pcie(platform: str, root: Path) -> tuple[float, str] | None:
    """Median pinned host<->device copy bandwidth at 256 MiB and more (bytes/s)."""
    for rec in _micro_records(platform, "memcpy", root):
        s = rec["samples"]
        vals = sorted(g for d, p, b, g in zip(s["direction"], s["pinned"], s["bytes"], s["gb_per_s"])
                      if d in ("h2d", "d2h") and p and b >= 2**28)
        if vals:
            return vals[len(vals) // 2] * 1e9, rec["_path"]
    return None


@cache
def _work(root: Path) -> dict:
    """The constants file's ``work`` block, read once per root as hardware() reads its blocks:
    terms() runs for every cell the workflow times while it plans (llmbench.estimate)."""
    return load_constants(root)["work"]


def _bandwidth(hw: Hardware, which: str) -> float:
    """The bus or PCIe bandwidth of ``hw``, where a cell needs it; a ConfigError saying which
    record is missing where there is none."""
    value = hw.bus_bytes_per_s if which == "bus" else hw.pcie_bytes_per_s
    if value is None:
        need = "a cell of several GPUs" if which == "bus" else "an offloading cell"
        raise ConfigError(f"platform {hw.platform!r}: {need} needs its {which} bandwidth, and there is "
                          f"{hw.sources[which]}")
    return value


@cache
def hardware(platform: str, root: Path = REPO_ROOT) -> Hardware:
    """A platform's Hardware: peaks from its platform file, facts from the constants file,
    measured bandwidths and GEMM efficiencies from our micro records where they exist."""
    consts = load_constants(root)
    hw, assume = consts["hardware"], consts["assumptions"]
    facts = _facts(platform, hw)
    plat = Platform.load(platform, root)
    if not plat.peak_bf16_tflops:
        raise ConfigError(f"platform {platform!r} has no peak_bf16_tflops: no throughput model")
    sources = {"peak": plat.peak_source}
    p2p = plat.env.get("NCCL_P2P_DISABLE") not in ("1", 1)
    link_kind = facts["link"]
    bus = _measured_bus(platform, p2p, root)
    if bus:
        bus_bps, sources["bus"] = bus[0], f"measured: {bus[1]}"
    else:
        ref = assume["collective_efficiency_from"][link_kind]["value"]
        ref_facts = _facts(ref, hw)
        ref_bus = _measured_bus(ref, link_kind == "nvlink", root)
        if ref_bus is None:
            bus_bps = None
            sources["bus"] = (f"no collectives record of {platform!r}, nor of {ref!r} to take the {link_kind} "
                              "efficiency from (a microbenchmark record under results/reference)")
        else:
            # a PCIe-only ring is bounded by the reference's PCIe link, an NVLink ring by its NVLink
            ref_link = ref_facts["link_gb_per_s" if link_kind == "nvlink" else "pcie_gb_per_s"]["value"]
            eff = ref_bus[0] / (ref_link * 1e9)
            bus_bps = facts["link_gb_per_s"]["value"] * 1e9 * eff
            sources["bus"] = (f"datasheet {facts['link_gb_per_s']['source']} x efficiency {eff:.2f} "
                              f"measured on {ref} ({ref_bus[1]})")
    pcie = _measured_pcie(platform, root)
    if pcie:
        pcie_bps, sources["pcie"] = pcie[0], f"measured: {pcie[1]}"
    else:
        ref = assume["pcie_efficiency_from"]["value"]
        ref_pcie = _measured_pcie(ref, root)
        if ref_pcie is None:
            pcie_bps = None
            sources["pcie"] = (f"no memcpy record of {platform!r}, nor of {ref!r} to take the PCIe efficiency from "
                               "(a microbenchmark record under results/reference)")
        else:
            eff = ref_pcie[0] / (_facts(ref, hw)["pcie_gb_per_s"]["value"] * 1e9)
            pcie_bps = facts["pcie_gb_per_s"]["value"] * 1e9 * eff
            sources["pcie"] = f"datasheet x efficiency {eff:.2f} measured on {ref} ({ref_pcie[1]})"
    gemm_from = facts.get("gemm_records_from", platform)
    samples = []
    for rec in _micro_records(gemm_from, "gemm", root):
        s = rec["samples"]
        samples += [(m, n, k, p / 100) for m, n, k, p in zip(s["m"], s["n"], s["k"], s["pct_of_peak"])]
    sources["gemm"] = (f"measured: GEMM records of {gemm_from}" if samples
                       else assume["gemm_efficiency"]["source"])
    sources["hbm"] = facts["hbm_gb_per_s"]["source"]
    return Hardware(
        platform=platform, peak_flops=plat.peak_bf16_tflops * 1e12,
        hbm_bytes_per_s=facts["hbm_gb_per_s"]["value"] * 1e9, pcie_bytes_per_s=pcie_bps,
        bus_bytes_per_s=bus_bps,
        gemm_samples=tuple(samples), default_gemm_efficiency=float(assume["gemm_efficiency"]["value"]),
        sources=sources,
    )


def trainable_params(model: ModelSpec, tech: Technique, lora_rank: int) -> int:
    """Parameters the optimizer updates: all (full training), the embeddings and lm_head of a
    4-bit pre-training cell (its linears are frozen NF4), or LoRA's A and B on every linear."""
    counts = model.param_counts()
    if tech.adapter is not None:
        d, f, L = model.hidden_size, model.intermediate_size, model.num_hidden_layers
        kv = model.num_key_value_heads * model.head_dim
        per_layer = lora_rank * ((d + d) * 2 + (d + kv) * 2 + 2 * (d + f) + (f + d))
        return L * per_layer
    if tech.quant4:
        return counts["embedding"] + counts["lm_head"]
    return counts["total"]


def param_tensors(model: ModelSpec, tech: Technique) -> int:
    """Parameter tensors of the model as a framework holds them: per decoder layer the seven
    linears and two norms, then the embedding, the final norm and the output layer; LoRA adds
    its A and B to each of the seven linears (trainable_params's targets)."""
    L = model.num_hidden_layers
    return L * 9 + 3 + (L * 7 * 2 if tech.adapter is not None else 0)


def features(cell: TrainCell, hw: Hardware, work: dict) -> list[tuple[str, str | None, float]]:
    """The step's pieces as (term, calibrated constant or None, value): value is seconds where
    the constant is None, else the feature that the constant multiplies (see CALIBRATED)."""
    m, t = cell.model, cell.technique
    w = {k: float(v["value"]) for k, v in work.items()}
    counts = m.param_counts()
    n_lin = counts["non_embedding"]
    L, d, s, G = m.num_hidden_layers, m.hidden_size, cell.seq_len, cell.gpus
    T = cell.batch_size * s  # tokens per GPU per step
    frozen = t.adapter is not None or t.quant4
    r = 1.0 if t.recompute else 0.0
    out: list[tuple[str, str | None, float]] = []
    # GEMM work at the efficiency of the MLP's shape (the largest GEMMs of a layer)
    eff = hw.gemm_efficiency(T, m.intermediate_size, d)
    attn = 12.0 * L * d * s
    out.append(("gemm", None, T * flops_per_token(m, s, frozen_base=frozen) / (hw.peak_flops * eff)))
    out.append(("recompute", None, r * T * (2.0 * n_lin + attn / 3) / (hw.peak_flops * eff)))
    out.append(("recompute", "host_layer_recompute_s", r * L))
    # memory-bound work; recomputation replays the forward's share (about a third)
    replay = 1.0 + r / 3
    out.append(("memory", "act_bytes_per_token_layer_unit", T * L * d * replay / hw.hbm_bytes_per_s))
    scores = 0.0 if t.flash else T * L * m.num_attention_heads * s * replay
    out.append(("memory", "attn_eager_bytes_per_score", scores / hw.hbm_bytes_per_s))
    # optimizer over the trainable shard (ZeRO, FSDP2's Z2/Z3 and Megatron's distributed
    # optimizer shard it)
    n_train = trainable_params(m, t, int(w["lora_rank"]))
    sharded = t.zero_stage >= 1 or cell.backend == "megatron"
    fsdp2 = cell.backend == "fsdp2"
    shard = n_train / G if sharded else n_train
    pcie = _bandwidth(hw, "pcie") if t.offload else math.inf
    bus = _bandwidth(hw, "bus") if G > 1 else math.inf  # one GPU: no collectives
    if t.offload:
        # the host's CPU Adam steps every rank's shard, bound by host memory bandwidth, not by
        # its thread count: 7B's Z2+O step is 3.1 s over 2 H200s on 32 CPUs and 2.9 s over 4 on 64
        out.append(("optimizer", "cpu_adam_s_per_gparam", shard * G / 1e9))
        out.append(("offload", None, shard * w["offload_bytes_per_param"] / pcie))
    else:
        out.append(("optimizer", None, shard * w["adam_bytes_per_param"] / hw.hbm_bytes_per_s))
    # collectives: a ring moves (G-1)/G of the buffer per rank for a reduce-scatter or an
    # all-gather; gradient all-reduce (ZeRO 0) = reduce-scatter + all-gather, as is ZeRO-2's
    # reduce-scatter of gradients + all-gather of updated weights
    ring = (G - 1) / G
    comm = 2 * ring * n_train * w["grad_bytes"] / bus
    passes = 2.0 + r  # ZeRO-3 gathers weights for forward, backward and a replayed forward
    if fsdp2 and t.zero_stage >= 2:
        # FSDP2 shards the weights at rest with Z2 too: each layer is gathered in forward and,
        # resharded after it (Z3), again in backward, where a recomputed layer reuses that
        # gather; gradients are reduce-scattered in fp32 (MixedPrecisionPolicy's reduce_dtype)
        comm = ring * n_train * w["fsdp2_reduce_bytes"] / bus
        # an NF4 base (QL) is gathered as stored: its decoder linears in NF4, the rest in bf16
        linear = counts["decoder_linear"] if t.quant4 else 0
        gathered = linear * w["nf4_bytes_per_param"] + (counts["total"] - linear) * w["param_bytes"]
        comm += (2.0 if t.zero_stage == 3 else 1.0) * ring * gathered / bus
    elif fsdp2:  # replicated (no Z flag): an fp32 all-reduce of the gradients
        comm = 2 * ring * n_train * w["fsdp2_reduce_bytes"] / bus
    elif t.zero_stage == 3:
        comm = ring * n_train * w["grad_bytes"] / bus  # reduce-scatter only
        comm += passes * ring * counts["total"] * w["param_bytes"] / bus
        out.append(("zero3", "zero3_s_per_gparam", passes * counts["total"] / 1e9))
        # ZeRO-3 hooks every tensor, however small: LoRA's 14 adapters a layer more than double
        # the tensors it gathers, at about the same bytes
        out.append(("zero3", "zero3_s_per_tensor", passes * param_tensors(m, t)))
        if t.offload:  # weights live on the host: each rank fetches its shard every pass
            out.append(("offload", None, passes * counts["total"] / G * w["param_bytes"] / pcie))
    out.append(("communication", None, comm))
    if t.quant4:
        uses = 2.0 + r  # forward, backward (input gradients), replayed forward
        out.append(("dequant", None, uses * counts["decoder_linear"] * w["nf4_dequant_bytes_per_param"]
                    / hw.hbm_bytes_per_s))
        out.append(("dequant", "host_layer_nf4_fsdp2_s" if fsdp2 else "host_layer_quant_s", L))
    out.append(("host", "host_step_s", 1.0))
    if cell.backend == "megatron":
        out.append(("host", "host_layer_megatron_s", L))
    elif fsdp2:
        out.append(("host", "host_layer_fsdp2_s", L))
    else:
        out.append(("host", "host_layer_s", L))
    if t.adapter is not None:
        out.append(("host", "host_layer_adapter_s", L))
    return out


def side_of(term: str, const: str | None) -> str:
    """The side (SIDES) of one feature of a step: host work (the host terms, ZeRO-3's hooks,
    recomputation's and 4-bit weights' per-layer host costs), the offloaded CPU Adam (serial:
    the GPU waits for it), else GPU work."""
    if term in ("host", "zero3") or const in ("host_layer_recompute_s", "host_layer_quant_s", "host_layer_nf4_fsdp2_s"):
        return "host"
    if const == "cpu_adam_s_per_gparam":
        return "serial"
    return "device"


def sides(cell: TrainCell, constants: dict[str, float], root: Path = REPO_ROOT,
          hw: Hardware | None = None) -> dict[str, float]:
    """Seconds per step on each side (SIDES) for a cell under the given calibrated constants."""
    hw = hw or hardware(cell.platform, root)
    out = dict.fromkeys(SIDES, 0.0)
    for term, const, value in features(cell, hw, _work(root)):
        out[side_of(term, const)] += value if const is None else constants[const] * value
    return out


def step_of(host: float, device: float, serial: float, overlap: float) -> float:
    """A step's seconds from its sides: the longer of host and GPU time, ``overlap`` of the
    shorter, and the serial time."""
    return max(host, device) + overlap * min(host, device) + serial


def terms(cell: TrainCell, constants: dict[str, float], root: Path = REPO_ROOT,
          hw: Hardware | None = None) -> dict[str, float]:
    """Seconds per step of each term (TERMS) for a cell under the given calibrated constants."""
    hw = hw or hardware(cell.platform, root)
    out = dict.fromkeys(TERMS, 0.0)
    for term, const, value in features(cell, hw, _work(root)):
        out[term] += value if const is None else constants[const] * value
    return out


def step_time_s(cell: TrainCell, constants: dict[str, float], root: Path = REPO_ROOT,
                hw: Hardware | None = None) -> float:
    """Predicted seconds per optimizer step (step_of; without OVERLAP in ``constants``, the
    sides add)."""
    s = sides(cell, constants, root, hw)
    return step_of(s["host"], s["device"], s["serial"], constants.get(OVERLAP, 1.0))


def tokens_per_s(cell: TrainCell, constants: dict[str, float], root: Path = REPO_ROOT,
                 hw: Hardware | None = None) -> float:
    """Predicted tokens/s over all GPUs (as records and the paper's tables count them)."""
    return cell.tokens_per_step / step_time_s(cell, constants, root, hw)
