"""The max-batch search table (Table IV's batch sizes): per searched cell, what each probe
showed, the largest batch that fits, the probes against the bound, and the time the search
spent beside the time of the cell measured at that batch.

Beside the measured cell's tokens/s stands its probe's at the same batch (the search's short
protocol, e.g. 1 warm-up and 2 measured steps) and the ratio of the two: it tells where a
probe's throughput stands for the cell's and where it does not (ZeRO-3's first steps, for
one, are far slower than its later ones)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from ..cells import PROBE_DIR, SEARCH_KEY, cell_from_dict
from ..record import read, wall_s
from ..search import measured_batch, measured_out_of_memory, read_summary
from . import render, runs
from .tidy import origin
from .render import fmt

COLUMNS = list(SEARCH_KEY) + [
    "status", "reason", "largest_ok", "smallest_oom", "max_batch", "capacity_gib", "probes", "n_probes", "n_run",
    "bound", "within_bound", "search_wall_s", "search_gpu_s", "measured_batch_size", "measured_out_of_memory",
    "measured_status", "measured_tokens_per_s",
    "measured_wall_s", "measured_gpu_s", "probe_tokens_per_s", "measured_over_probe",
]
MARK = {"ok": "ok", "oom": "oom"}


def build(folders: Iterable[str | Path], measured: Iterable[str | Path]) -> pd.DataFrame:
    """One row per search (its folder's search.json) joined with the record it measured, at
    llmbench.search.measured_batch (the largest batch that fit, below any whose measured
    cell ran out of memory: those batches in ``measured_out_of_memory``). Where several
    results folders hold that cell, the record llmbench.report.runs chooses; where they hold
    the search, give the folder runs.choose_searches chooses."""
    records = {str(p): read(p) for p in measured}
    # a cell several results folders hold (the combined view): the record every table uses
    chosen = runs.choose(runs.candidate(rec, p, origin(p)[0]) for p, rec in records.items())
    by_key = {}
    for p, rec in records.items():
        if chosen[p]["superseded_by"] is None:
            key = cell_from_dict(rec.cell).key  # the path form of the backend, as in search.json
            by_key[tuple(str(key[k]) for k in (*SEARCH_KEY, "batch_size"))] = rec
    rows = []
    for folder in folders:
        s = read_summary(folder)
        batch = measured_batch(folder)
        rec = by_key.get(tuple(str(s[k]) for k in SEARCH_KEY) + (str(batch),))
        wall = wall_s(rec.provenance) if rec is not None else None
        probes = " ".join(f"{p['batch_size']}:{p['status']}{'*' if p['source'] == 'frontier' else ''}"
                          for p in s["probes"])
        probe = _probe_tokens_per_s(Path(folder), batch)
        cell_tps = rec.metrics.tokens_per_s_mean if rec is not None and rec.status == "ok" else None
        rows.append({
            **{k: s[k] for k in SEARCH_KEY}, "status": s["status"], "reason": s["reason"],
            "largest_ok": s["largest_ok"], "smallest_oom": s["smallest_oom"], "max_batch": s["max_batch"],
            "capacity_gib": s["capacity_gib"], "probes": probes, "n_probes": s["n_probes"], "n_run": s["n_run"],
            "bound": s["bound"], "within_bound": s["n_probes"] <= s["bound"],
            "search_wall_s": s["search_wall_s"], "search_gpu_s": s["search_gpu_s"],
            "measured_batch_size": batch,
            "measured_out_of_memory": " ".join(str(b) for b in measured_out_of_memory(folder)),
            "measured_status": rec.status if rec is not None else None,
            "measured_tokens_per_s": rec.metrics.tokens_per_s_mean if rec is not None else None,
            "measured_wall_s": wall, "measured_gpu_s": wall * s["gpus"] if wall is not None else None,
            "probe_tokens_per_s": probe,
            "measured_over_probe": cell_tps / probe if cell_tps is not None and probe else None,
        })
    # by platform, stage (pre-training first), model, backend and method: searches from several runs
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(
        ["platform", "stage", "model", "backend", "technique", "gpus"], ascending=[True, False, True, True, True, True],
        ignore_index=True, kind="stable", key=_by_size)


def _probe_tokens_per_s(folder: Path, batch: int | None) -> float | None:
    """The tokens/s of the search's probe at ``batch`` where that probe ran ok (None where it
    was answered from the frontier file, is not in this folder, or did not run ok)."""
    if batch is None:
        return None
    path = folder / PROBE_DIR.format(batch_size=batch) / "record.json"
    if not path.exists():
        return None
    rec = read(path)
    return rec.metrics.tokens_per_s_mean if rec.status == "ok" else None


def _by_size(column: pd.Series) -> pd.Series:
    """Numbers in a model's name sort by value (llama2-7b before llama2-13b)."""
    if column.name != "model":
        return column
    return column.map(lambda m: re.sub(r"\d+", lambda d: d.group().zfill(8), str(m)))


def table(df: pd.DataFrame) -> render.Table:
    """The search table's display: per search, its probes and the cell it measured."""
    rows = [[r.platform, r.model, r.stage, r.backend, r.technique, fmt(r.gpus, ".0f"), r.status,
             "-" if pd.isna(r.largest_ok) else str(int(r.largest_ok)), r.probes, f"{r.n_probes} / {r.bound}",
             fmt(r.search_gpu_s, ",.1f"), _measured_bs(r), r.measured_status or "", fmt(r.measured_tokens_per_s, ",.1f"),
             fmt(r.measured_gpu_s, ",.1f"), fmt(r.probe_tokens_per_s, ",.1f"), fmt(r.measured_over_probe, ".3f")]
            for r in df.itertuples()]
    return render.simple("search", df, ["Platform", "Model", "Stage", "Backend", "Method", "GPUs", "Search", "Largest BS", "Probes (BS:outcome)",
                  "Probes / bound", "Search GPU·s", "Measured BS", "Measured", "Measured tok/s", "Measured GPU·s",
                  "Probe tok/s", "Measured / probe"], rows,
                 "Probes in the order run; '*': answered by the frontier file (a known OOM, or a batch that ran "
                 "before: its peak) without running (its record: skipped); a probe an earlier, stopped run of the "
                 "same search ran (its record put back) counts as run, in the probes and the seconds. Bound: "
                 "floor(log2(max)) + 3. GPU·s: wall seconds x GPUs (on a CPU platform, x processes). The measured "
                 "cell is the full protocol at the largest batch; '-': no batch fits. Measured BS below the largest: "
                 "the cell measured at the batches in brackets ran out of memory where its probe fit (more steps, "
                 "more fragmentation), so the next batch down whose probe fit is measured. Probe tok/s: the search's "
                 "probe at the measured batch (its short protocol; empty where the frontier answered it), and the "
                 "measured cell's tokens/s over it: near 1, the probe's throughput stands for the cell's.")


def _measured_bs(r) -> str:
    bs = "-" if pd.isna(r.measured_batch_size) else str(int(r.measured_batch_size))
    return f"{bs} ({r.measured_out_of_memory} oom)" if r.measured_out_of_memory else bs

