"""The tidy table: one row per cell (per Record of one results folder; where several runs
hold a cell, the record llmbench.report.runs chooses), flat columns with units in their names."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from .. import cells
from ..platforms import DTYPE_SHORT
from ..profile import kernels
from ..serve.engines import engine_version
from ..serve.runs import engine_args, warm_engine
from ..record import Record, RecordError, read
from ..search import measured_batch, read_summary
from . import render, runs

COLUMNS = [
    "stage", "platform", "model", "backend", "technique", "batch_size", "gpus",
    "nodes",  # training cells: the nodes its gpus span (1 unless the block set nodes)
    "seq_len", "status", "reason", "tokens_per_s_mean", "tokens_per_s_std", "tokens_per_s_runs",
    "step_time_s_mean",
    "step_time_cv_in_repeat",  # training: the median over repeats of each one's step-time CV (record samples)
    "step_time_drift_in_repeat",  # training: the median over repeats of first third's mean step / last third's - 1
    "peak_mem_gib", "peak_mem_kind", "peak_mem_allocated_gib",
    "peak_mem_reserved_gib", "peak_rss_gib",
    "host_mem_gib",  # the host memory of the machine the cell ran on (its provenance)
    "mfu", "model_tflops_per_gpu", "mfu_vs_gemm",
    "mfu_fp8_peak",  # FP8 cells: the same model FLOP/s against the platform's dense FP8 peak
    "total_params", "trainable_params",
    "attention", "compute_dtype", "warmup_steps", "measured_steps", "repeats", "git_sha", "record_path",
    "layout",  # Megatron-LM cells' parallel layout (llmbench.cells.layout_name); empty otherwise
    # where the record comes from: the results folder ("run") and whether it is a measured
    # cell or a max-batch search's probe ("kind"); several folders feed the combined view,
    # and where several hold one cell, which record is used and why (llmbench.report.runs)
    "run", "kind", *runs.COLUMNS,
    "started",  # the record's start time in UTC (llmbench.report.runs.started; '' where unknown)
    # the machine a record ran on (its boot id; a record whose repeats ran on several boots names
    # them all; without a boot id, its results folder) and the paired set it was measured in
    # (llmbench.launch.run_set), which the findings pair comparisons by
    "machine", "paired_set",
    # a record whose repeats ran on several boots (a set resumed on another lent machine): the
    # boot of each repeat, ';'-joined in repeat order; empty where one boot ran them all
    "repeat_machines",
    "paired_round",  # serving cells of a paired set: the round the cell ran in (its burst's place)
    # training cells: the largest batch a max-batch search of the same method found (empty
    # where none ran: Table IV then says "not maximised"), and whether that search stopped at
    # its max_batch with every batch fitting (so the batch is a lower bound: coverage asks for
    # a search past it); per-GPU throughput; memory in GB
    "searched_max_batch", "searched_to_cap", "tokens_per_s_per_gpu", "peak_mem_allocated_gb",
]
#: Serving cells' columns (empty for training rows): the load, then llmbench.serve.metrics
#: names (units in the names), then the server's memory and start-up.
SERVE_LOAD_COLUMNS = ["engine", "engine_version", "load", "mode", "num_requests", "input_len", "output_len",
                      "rate_per_s", "max_concurrency", "prefix_len", "ramp_up_s", "warmup_requests",
                      # served by an engine that had served a load before (a shared engine's
                      # later loads, llmbench.serve.bench.EngineSession), not a fresh one
                      "warm_engine",
                      # the block's launch arguments for its engine (prefix cache switch first),
                      # space-separated: cells that differ here are different points
                      "engine_args"]
#: load keys a record's load spec may lack (added after it was written): their value then
LOAD_ABSENT = {"prefix_len": 0, "ramp_up_s": 0}
SERVE_METRIC_COLUMNS = [
    "completed", "failed", "duration_s", "request_throughput_per_s", "output_tokens_per_s",
    "total_tokens_per_s", "output_tokens_total", "output_shortfall_requests", "one_read_requests",
    *[f"{s}_{m}" for m in ("ttft_s", "tpot_s", "itl_s", "e2e_latency_s") for s in ("mean", "p50", "p90", "p99")],
    "server_peak_gpu_mem_gib", "server_peak_rss_gib", "server_ready_s", "client_cpu_per_request_s",
    # goodput (llmbench.serve.metrics.goodput) and the engine's settings (llmbench.serve.engines.SETTINGS)
    "goodput_share", "goodput_requests_per_s", "goodput_ttft_target_s", "goodput_tpot_target_s",
    "max_num_seqs", "max_batch_tokens", "kv_cache_tokens", "kv_cache_source", "gpu_memory_utilization",
    "cuda_graphs", "chunked_prefill", "prefix_caching", "tensor_parallel",
    # GPU telemetry over the measured window (llmbench.serve.telemetry), its first GPU's
    "gpu_telemetry_source", "gpu0_sm_clock_mhz_mean", "gpu0_power_w_mean", "gpu0_power_w_max",
    "gpu0_util_pct_mean",
]
#: Microbenchmark cells' columns (empty elsewhere): what ran and its headline numbers.
MICRO_COLUMNS = ["bench", "case", "points", "all_correct", "best_tflops", "best_pct_of_peak"]
#: Profile cells' phase times (empty elsewhere; their module rows are in the per-row table).
PROFILE_COLUMNS = [f"{p}_{k}_s" for p in ("forward", "backward", "optimizer", "prefill", "decode")
                   for k in ("wall", "profiled_wall", "kernel", "gemm", "device")] + [
    "wall_basis", "profiled_step_time_s", "unaccounted_s", "decode_steps"] + kernels.COLUMNS + [
    "kernel_runs",  # a profiled cell of several repeats: each repeat's kernel breakdown (JSON: metric -> values)
    "profile_repeats"]  # ... and each repeat's phase times and module rows (JSON, llmbench.profile.results)
ALL_COLUMNS = COLUMNS + SERVE_LOAD_COLUMNS + SERVE_METRIC_COLUMNS + MICRO_COLUMNS + PROFILE_COLUMNS
#: Per-sample tables (one row per request, or per microbenchmark point): the cell's path
#: fields, then the record's samples columns.
SAMPLE_KEYS = {"serve": ["platform", "model", "engine", "load", "gpus"],
               "micro": ["platform", "bench", "case", "gpus"],
               "profile": ["platform", "model", "backend", "technique", "batch_size", "gpus"]}
REQUEST_COLUMNS = SAMPLE_KEYS["serve"] + ["index", "scheduled_s", "sent_s", "ttft_s", "tpot_s", "e2e_s",
                                          "output_tokens", "ok", "error"]


def serve_row(record: Record, path: str) -> dict:
    """Flatten one serving Record. peak_mem_gib is the server's GPU memory in use (its
    process-tree RSS on a CPU platform)."""
    c, sv = record.cell, record.summary
    load = c["load_spec"]
    gpu = sv.get("server_peak_gpu_mem_gib")
    out = {k: None for k in ALL_COLUMNS}
    out.update(
        stage="serve", platform=c["platform"], model=c["model"], backend=c["engine"], technique=None,
        engine_version=engine_version(c["engine"], record.provenance.get("engine_versions") or {}),
        gpus=c["gpus"], status=record.status, reason=record.reason, engine=c["engine"], load=c["load"],
        **{k: load.get(k, LOAD_ABSENT.get(k)) for k in ("mode", "num_requests", "input_len", "output_len",
                                                        "rate_per_s", "max_concurrency", "prefix_len", "ramp_up_s",
                                                        "warmup_requests")},
        warm_engine=warm_engine(record.provenance), engine_args=engine_args(c),
        **{k: sv.get(k) for k in SERVE_METRIC_COLUMNS},
        peak_mem_gib=gpu if gpu is not None else sv.get("server_peak_rss_gib"),
        peak_mem_kind=("gpu_used" if gpu is not None else "host_rss" if sv.get("server_peak_rss_gib") else None),
        git_sha=(record.provenance.get("git") or {}).get("sha"), record_path=path,
    )
    return out


def micro_row(record: Record, path: str) -> dict:
    """Flatten one microbenchmark Record (its points are in the per-point table)."""
    c, sm = record.cell, record.summary
    out = {k: None for k in ALL_COLUMNS}
    out.update(stage="micro", platform=c["platform"], gpus=c["gpus"], status=record.status, reason=record.reason,
               bench=c["bench"], case=c["case"], **{k: sm.get(k) for k in MICRO_COLUMNS[2:]},
               compute_dtype=DTYPE_SHORT.get((c.get("params") or {}).get("dtype")),
               git_sha=(record.provenance.get("git") or {}).get("sha"), record_path=path)
    return out


ROWS = {"serve": serve_row, "micro": micro_row}


def row(record: Record, path: str) -> dict:
    """Flatten one Record. peak_mem_gib is the paper's "M": reserved GPU memory on a GPU
    (what the allocator holds, close to what nvidia-smi shows), peak RSS on a CPU."""
    c, m = record.cell, record.metrics
    proto = c["protocol"]
    gpu_mem = m.peak_mem_reserved_gib
    tflops = _model_tflops_per_gpu(record)
    return {
        "stage": c["stage"], "platform": c["platform"], "model": c["model"],
        "backend": c["backend"], "technique": c["technique"], "batch_size": c["batch_size"],
        "gpus": c["gpus"], "nodes": c.get("nodes", 1), "seq_len": proto["seq_len"], "status": record.status,
        "reason": record.reason, "tokens_per_s_mean": m.tokens_per_s_mean,
        # a single run has no spread: leave std empty rather than print a misleading 0
        "tokens_per_s_std": m.tokens_per_s_std if len(m.tokens_per_s_runs) > 1 else None,
        "tokens_per_s_runs": ";".join(f"{v:.6g}" for v in m.tokens_per_s_runs),
        "step_time_s_mean": m.step_time_s_mean, "step_time_cv_in_repeat": _cv_in_repeat(record.samples),
        "step_time_drift_in_repeat": _drift_in_repeat(record.samples),
        "peak_mem_gib": gpu_mem if gpu_mem is not None else m.peak_rss_gib,
        "peak_mem_kind": "gpu_reserved" if gpu_mem is not None else ("host_rss" if m.peak_rss_gib is not None else None),
        "peak_mem_allocated_gib": m.peak_mem_allocated_gib,
        "peak_mem_reserved_gib": m.peak_mem_reserved_gib, "peak_rss_gib": m.peak_rss_gib,
        "host_mem_gib": (record.provenance.get("host") or {}).get("mem_total_gib"),
        "mfu": _mfu(record, tflops), "model_tflops_per_gpu": tflops, "mfu_fp8_peak": _mfu_fp8(record, tflops),
        "total_params": m.total_params, "trainable_params": m.trainable_params,
        "attention": m.attention, "compute_dtype": m.compute_dtype, "warmup_steps": proto["warmup_steps"],
        "measured_steps": proto["measured_steps"], "repeats": proto["repeats"],
        "git_sha": (record.provenance.get("git") or {}).get("sha"), "record_path": path,
        "layout": cells.layout_name(c.get("parallel")),
        **{k: record.summary.get(k) for k in PROFILE_COLUMNS},
        "kernel_runs": json.dumps(record.summary["kernel_runs"], sort_keys=True) if record.summary.get("kernel_runs") else None,
        "profile_repeats": json.dumps(record.summary["repeats"]) if record.summary.get("repeats") else None,
    }


def _by_repeat(samples: dict[str, list]) -> list[list[float]]:
    """Each repeat's measured step times, in step order, from a training record's samples
    (llmbench.aggregate.step_samples); [] without them."""
    if not samples or "step_time_s" not in samples or "repeat" not in samples:
        return []
    by: dict[int, list[float]] = {}
    for rep, t in zip(samples["repeat"], samples["step_time_s"]):
        by.setdefault(rep, []).append(t)
    return list(by.values())


def _cv_in_repeat(samples: dict[str, list]) -> float | None:
    """The median over repeats of each repeat's step-time CV (sample std / mean) from a
    training record's samples; None without them or with fewer than two steps a repeat."""
    cvs = [statistics.stdev(v) / statistics.fmean(v) for v in _by_repeat(samples)
           if len(v) > 1 and statistics.fmean(v) > 0]
    return statistics.median(cvs) if cvs else None


def _drift_in_repeat(samples: dict[str, list]) -> float | None:
    """The median over repeats of how much slower a repeat's first third of measured steps
    ran than its last third (mean over mean, less 1): well above 0, the warm-up steps did not
    reach the steady state and the cell's mean understates it. None without samples or with
    fewer than three steps a repeat."""
    drifts = []
    for v in _by_repeat(samples):
        n = len(v) // 3
        if n and statistics.fmean(v[-n:]) > 0:
            drifts.append(statistics.fmean(v[:n]) / statistics.fmean(v[-n:]) - 1)
    return statistics.median(drifts) if drifts else None


def _model_tflops_per_gpu(record: Record) -> float | None:
    """Model FLOP/s per GPU (the MFU numerator, llmbench.models.flops_per_token) of an ok
    pre-training or fine-tuning cell; None for 4-bit cells (no bf16 GEMMs) and others."""
    from .. import techniques
    from ..models import ModelSpec, flops_per_token

    c, spec = record.cell, record.provenance.get("spec") or {}
    if record.status != "ok" or c.get("stage") not in ("pretrain", "finetune") or "model" not in spec:
        return None
    tech = techniques.parse(c["technique"])
    if tech.quant4 or record.metrics.tokens_per_s_mean is None:
        return None
    fpt = flops_per_token(ModelSpec(**spec["model"]), c["protocol"]["seq_len"], frozen_base=tech.adapter is not None)
    return record.metrics.tokens_per_s_mean * fpt / c["gpus"] / 1e12


def _mfu(record: Record, tflops: float | None) -> float | None:
    """MFU by today's formula (llmbench.models.flops_per_token over the record's own platform
    peak), so records written under an older formula compare with newer ones (LoRA cells
    measured before the frozen-base count was 6N, not 4N); the record's own value where the
    record lacks what the formula needs. ``tflops``: the record's _model_tflops_per_gpu."""
    peak = ((record.provenance.get("spec") or {}).get("platform") or {}).get("peak_bf16_tflops")
    return tflops / peak if tflops is not None and peak else record.metrics.mfu


def _mfu_fp8(record: Record, tflops: float | None) -> float | None:
    """An FP8 cell's model FLOP/s against its platform's dense FP8 peak (beside ``mfu``,
    which is against the bf16 peak as for every cell); None for cells without FP8."""
    from .. import techniques

    technique = record.cell.get("technique")
    if not technique or techniques.parse(technique).fp8 is None:
        return None
    peak = ((record.provenance.get("spec") or {}).get("platform") or {}).get("peak_fp8_tflops")
    return tflops / peak if tflops is not None and peak else record.metrics.mfu_fp8_peak


def _gemm_ceiling(df: pd.DataFrame) -> pd.DataFrame:
    """mfu_vs_gemm: model FLOP/s per GPU against the best bf16 GEMM the platform's GEMM
    microbenchmark measured (DESIGN: MFU against the measured ceiling, beside the peak; of the
    GEMM records the report uses, not those another run superseded; never an FP8 GEMM's, whose
    ceiling is another dtype's)."""
    gemm = df[(df["stage"] == "micro") & (df["bench"] == "gemm") & (df["status"] == "ok")
              & df["superseded_by"].isna() & (df["compute_dtype"] != "fp8")]
    best = gemm.groupby("platform")["best_tflops"].max()
    df["mfu_vs_gemm"] = df["model_tflops_per_gpu"] / df["platform"].map(best)
    return df


#: Bytes of a GiB over bytes of a GB (the paper prints GB; the allocator counts GiB).
GIB_TO_GB = 2**30 / 1e9


def per_gpu(df: pd.DataFrame) -> pd.DataFrame:
    """Add the columns that compare across hardware: tokens/s per GPU of the cell and the
    allocated memory in GB (the paper's unit). The one place they are computed."""
    df["tokens_per_s_per_gpu"] = df["tokens_per_s_mean"] / df["gpus"]
    df["peak_mem_allocated_gb"] = df["peak_mem_allocated_gib"] * GIB_TO_GB
    return df


def machine_of(record: Record, run: str) -> str:
    """Which machine a record ran on: its boot id (lent machines and cluster nodes share
    hostnames), every boot's where kept repeats of an earlier run came from another (joined by
    '+', so it equals no single machine), or ``run:<results folder>`` for a record without one."""
    boot, kept = _boots(record)
    if not boot:
        return f"run:{run}"
    return "+".join(sorted({boot, *kept.values()}))


def _boots(record: Record) -> tuple[str | None, dict[int, str]]:
    """(the boot id the record was written on, repeat index -> boot id of each kept repeat an
    earlier run of it made)."""
    from .. import provenance

    prov = record.provenance
    boot = (prov.get("machine") or provenance.machine(prov)).get("boot_id")  # an older record: from its host
    return boot, {r.get("index"): r["boot_id"] for r in prov.get("resumed_repeats") or () if r.get("boot_id")}


def repeat_machines(record: Record) -> str | None:
    """The boot each repeat ran on (';'-joined, repeat order) where kept repeats of an earlier
    run came from another boot than the record's own (the others ran on its own); None where
    one boot ran them all, or the record names no boot."""
    boot, kept = _boots(record)
    if not boot or not kept or set(kept.values()) == {boot}:
        return None
    n = max(len(record.metrics.tokens_per_s_runs), 1 + max(i for i in kept if isinstance(i, int)))
    return ";".join(str(kept.get(i, boot)) for i in range(n))


def paired_round(record: Record, path: str) -> int | None:
    """The round a serving cell of a paired set ran in (a training cell's repeats are its rounds
    0, 1, ...: None), from its set's ``cells`` and ``order``; None outside a set."""
    pset = record.provenance.get("paired_set") or {}
    if record.cell.get("stage") != "serve" or not pset.get("cells"):
        return None
    mine = [i for i, c in enumerate(pset["cells"]) if str(path).replace("\\", "/").endswith(str(c))]
    for r, indices in enumerate(pset.get("order") or []):
        if mine and mine[0] in indices:
            return r
    return None


def origin(path: str | Path) -> tuple[str, str]:
    """(run, kind) of a record path: the name of the results folder that holds its runs/,
    and 'probe' for a max-batch search's probe (runs/search/...), else 'cell'."""
    parsed = cells.parse(path)
    if parsed is None:
        return "", "cell"
    return Path(parsed.root).name, "probe" if parsed.is_probe else "cell"


def search_answer(path: str | Path) -> tuple[int | None, bool]:
    """The largest batch the max-batch search of this training cell's (or probe's) method
    found, read from the search folder beside it (runs/search/<stage>/.../<technique>-g<gpus>/):
    the batch its cell is measured at (llmbench.search.measured_batch: below a batch whose
    measured cell ran out of memory where its probe fit); and whether the search stopped at
    its max_batch with no batch out of memory (that batch is then a lower bound)."""
    parsed = cells.parse(path, (cells.RECORD_PATTERN, cells.PROBE_RECORD_PATTERN))
    if parsed is None or parsed.wildcards["stage"] not in cells.SEARCH_STAGES:
        return None, False
    folder = Path(parsed.root) / cells.SEARCH_PATTERN.format(**parsed.wildcards)
    try:
        summary = read_summary(folder)
    except (OSError, ValueError):
        return None, False
    batch = measured_batch(folder)
    return batch, batch is not None and summary.get("smallest_oom") is None and batch == summary.get("max_batch")


@contextmanager
def _fields_of(path: str | Path) -> Iterator[None]:
    """A record that reads as JSON but lacks a field the table needs (a hand edit, another
    llmbench's record): RecordError naming the file and the field, not a bare KeyError."""
    try:
        yield
    except KeyError as exc:
        raise RecordError(path, f"no field {exc} where this llmbench reads one") from None
    except (AttributeError, TypeError, ValueError) as exc:
        raise RecordError(path, f"a field of an unexpected type or value: {exc}") from None


def evidence_remedy(path: str | Path) -> str:
    """How to redo a record of another results folder (evidence_dirs), which this run's grid
    does not rerun, so deleting it would only drop its row."""
    parsed = cells.parse(path)
    folder = parsed.root if parsed is not None and parsed.root else "its results folder"
    return (f"it is a record of evidence_dirs' {folder}, which this run does not rerun: restore it "
            f"(git checkout -- {path}) or rerun its cell with the config that made {folder}")


def record_error(exc: RecordError, results_dir: str | Path) -> str:
    """The one line that says which record could not be read, what is wrong with it and how
    to redo it: rerun its cell where it is this run's (under ``results_dir``), restore it
    where it is another results folder's. A bad record stops the build rather than being
    skipped: a table silently short of a cell would read as if the cell were never run."""
    parsed = cells.parse(exc.path)
    own = parsed is None or Path(parsed.root or ".").resolve() == Path(results_dir).resolve()
    return str(exc if own else exc.with_remedy(evidence_remedy(exc.path)))


def unique(paths: Iterable[str | Path]) -> list[str]:
    """The record paths once each, in their first order."""
    return list(dict.fromkeys(str(p) for p in paths))


def build_all(paths: Iterable[str | Path]) -> pd.DataFrame:
    """Every given record's row (sorted by their path fields), with which record of its cell
    the report uses where several runs hold one (llmbench.report.runs: ``runs``,
    ``superseded_by``, ``choice``). A path given twice is one record, one row (a grid's cell
    and the batch a max-batch search measured can be the same cell)."""
    rows, candidates = [], []
    for p in unique(paths):
        rec = read(p)
        with _fields_of(p):
            r = ROWS.get(rec.cell.get("stage"), row)(rec, str(p))
            r["run"], r["kind"] = origin(p)
        r["machine"], r["paired_set"] = machine_of(rec, r["run"]), (rec.provenance.get("paired_set") or {}).get("id")
        r["paired_round"] = paired_round(rec, str(p))
        r["started"] = runs.started(rec.provenance)
        r["repeat_machines"] = repeat_machines(rec)
        rows.append(r)
        with _fields_of(p):
            candidates.append(runs.candidate(rec, str(p), r["run"]))
    chosen = runs.choose(candidates)
    for r in rows:
        r.update(chosen[r["record_path"]])
    df = _gemm_ceiling(pd.DataFrame(rows, columns=ALL_COLUMNS))
    staged = df["stage"].isin(["pretrain", "finetune"])
    answers = [search_answer(p) if t else (None, False) for p, t in zip(df["record_path"], staged)]
    searched = pd.Series([a[0] for a in answers], index=df.index, dtype="Int64")
    # a cell measured again in a run without the search (a rerun under a stronger protocol, a
    # second machine), or a search whose run holds its probes but not yet its measured cell:
    # the method's search from another run still answers Table IV's question (cells only)
    group = [df[k] for k in (*cells.SEARCH_KEY, "seq_len")]
    found = searched.groupby(group, dropna=False).transform("max")
    # that batch is a lower bound only where no search that reached it found the limit
    at_found = (searched == found).fillna(False)
    found_limit = (at_found & ~pd.Series([a[1] for a in answers], index=df.index)).groupby(group, dropna=False)
    cell = staged & (df["kind"] == "cell")
    df["searched_max_batch"] = found.where(cell)
    df["searched_to_cap"] = (found.notna() & ~found_limit.transform("any")).where(cell & found.notna())
    df["runs"] = df["runs"].astype("Int64")
    per_gpu(df)
    return df.sort_values(["stage", "platform", "model", "backend", "technique", "load", "bench", "case",
                           "batch_size", "gpus", "run"], ignore_index=True, na_position="first")


def used(df: pd.DataFrame) -> pd.DataFrame:
    """The rows the report uses: one per cell (those no other run's record superseded)."""
    return df[df["superseded_by"].isna()].reset_index(drop=True)


def superseded(df: pd.DataFrame) -> pd.DataFrame:
    """The rows another run's record of the same cell superseded (tables/records-superseded.csv)."""
    return df[df["superseded_by"].notna()].reset_index(drop=True)


def build(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The tidy table of the given record files: one row per cell, the record the report
    uses where several runs hold it (sorted by their path fields)."""
    return used(build_all(paths))


def build_samples(paths: Iterable[str | Path], stage: str) -> pd.DataFrame:
    """One row per sample of every record of ``stage`` the report uses (the tidy table's
    choice where several runs hold a cell): a request of a serving cell (exact latency CDFs),
    a measured point of a microbenchmark cell."""
    key = SAMPLE_KEYS[stage]
    recs = [(p, read(p)) for p in unique(paths)]
    recs = [(p, rec) for p, rec in recs if rec.cell.get("stage") == stage]
    candidates = []
    for p, rec in recs:
        with _fields_of(p):
            candidates.append(runs.candidate(rec, p, origin(p)[0]))
    choice = runs.choose(candidates)
    frames = []
    for p, rec in recs:
        if not rec.samples or choice[p]["superseded_by"] is not None:
            continue
        with _fields_of(p):
            df = pd.DataFrame(rec.samples)
            for k in key:
                df[k] = rec.cell[k]
        frames.append(df[key + [c for c in df.columns if c not in key]])
    if not frames:
        cols = REQUEST_COLUMNS if stage == "serve" else key
        return pd.DataFrame({c: pd.Series(dtype="object") for c in cols})
    df = pd.concat(frames, ignore_index=True)
    return df.reindex(columns=REQUEST_COLUMNS) if stage == "serve" else df


def build_slice(paths: Iterable[str | Path], stage: str) -> pd.DataFrame:
    """The tidy table's rows of one stage (a training stage's records come with the
    microbenchmark records, for MFU against the measured GEMM ceiling; only the stage's
    rows are kept)."""
    df = build(paths)
    return df[df["stage"] == stage].reset_index(drop=True)


def write(df: pd.DataFrame, csv: Path | str, parquet: Path | str | None = None) -> None:
    """Write the tidy table as CSV (and Parquet), counts (batch size, GPUs, ...) as integers
    (nullable Int64: a serving row has no batch size, and a float column would print 1.0)."""
    Path(csv).parent.mkdir(parents=True, exist_ok=True)
    df = render.integers(df)
    df.to_csv(csv, index=False)
    if parquet is not None:
        df.to_parquet(parquet, index=False)
