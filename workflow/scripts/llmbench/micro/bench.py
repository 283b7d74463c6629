"""A microbenchmark cell: run its worker in a process group, classify, write the Record.

Status: ok; oom (an allocation failed: a GEMM or buffer too large for the device);
timeout; error (a crash, or any point whose result was wrong: a collective that does not
sum, a GEMM off its float64 reference; the measured rows stay in the record).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from .. import forkserver, gpus, provenance
from ..aggregate import Outcome, provenance_of
from ..launch import run_worker, worker_args, worker_env
from ..procs import stop_groups_on_signal
from ..record import Record, write
from ..spec import RunSpec

WORKER = "llmbench.micro.worker"


def columns(rows: list[dict]) -> dict[str, list]:
    """Rows -> one list per column (keys in first-seen order; absent values None)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return {k: [r.get(k) for r in rows] for k in keys}


def summarize(bench: str, rows: list[dict]) -> dict:
    """The cell's headline numbers (flat, units in names)."""
    if not rows:
        return {}
    correct = all(r.get("correct", True) for r in rows)
    if bench == "gemm":
        best = max(rows, key=lambda r: r["tflops"])
        return {"points": len(rows), "all_correct": correct, "best_tflops": best["tflops"],
                "best_pct_of_peak": best.get("pct_of_peak"), "best_shape": [best["m"], best["n"], best["k"]]}
    if bench == "memcpy":
        out = {"points": len(rows), "all_correct": correct}
        for r in rows:
            key = f"{r['direction']}_{'pinned' if r.get('pinned') else 'pageable'}"
            out[f"max_gb_per_s_{key}"] = max(out.get(f"max_gb_per_s_{key}", 0.0), r["gb_per_s"])
        return out
    out = {"points": len(rows), "all_correct": correct}
    for r in rows:
        out[f"max_busbw_gb_per_s_{r['op']}"] = max(out.get(f"max_busbw_gb_per_s_{r['op']}", 0.0), r["busbw_gb_per_s"])
    return out


def run_cell(spec: RunSpec | dict, record_path: Path, log: Path, threads: int = 1,
             gpu_busy: gpus.BusyPolicy | None = None) -> Record:
    """Run one microbenchmark cell and write its Record (nothing runs on busy GPUs,
    llmbench.gpus). ``spec``: its run spec (llmbench.spec.RunSpec, or its JSON form)."""
    started = datetime.now(UTC).isoformat()
    spec = RunSpec.of(spec)
    cell = spec.cell
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"cell {cell.record_path()}\n")
    env_vars = dict(spec.platform.env)
    if cell.bench == "collectives" and not cell.params["p2p"]:
        env_vars["NCCL_P2P_DISABLE"] = "1"  # no NVLink / PCIe peer-to-peer: through host memory
    workdir = Path(tempfile.mkdtemp(prefix="llmbench-micro-"))
    try:
        spec_path, out = workdir / "spec.json", workdir / "result.json"
        spec_path.write_text(json.dumps(spec.raw, indent=2))
        check = gpus.check_cell(spec, cell.gpus, gpu_busy, log)
        with stop_groups_on_signal():
            if check.refused:
                outcome = Outcome(status="error", reason=check.refused)
            else:
                outcome = run_worker(cell.gpus, WORKER, worker_args(spec_path, out),
                                     env=worker_env(env_vars, threads, cell.gpus), log=log, workdir=workdir,
                                     out=out, timeout_s=cell.timeout_s, label=f"{cell.bench} {cell.case}",
                                     fork_server=forkserver.server_for(spec.platform.to_dict()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    rows = (outcome.result or {}).get("rows") or []
    status, reason = outcome.status, outcome.reason
    wrong = [r for r in rows if r.get("correct") is False]
    if status == "ok" and wrong:
        status, reason = "error", f"{len(wrong)} of {len(rows)} points computed a wrong result; first: {wrong[0]}"
    prov = {**provenance_of(spec, [outcome], started, [sys.executable, *sys.argv]), "env": env_vars}
    record = Record(cell=cell.to_dict(), status=status, reason=reason,
                    log_tail=outcome.log_tail if status != "ok" else "",
                    summary=summarize(cell.bench, rows), samples=columns(rows), provenance=prov)
    record = gpus.with_state(record, check)
    record = replace(record, provenance={**record.provenance, "machine": provenance.machine(record.provenance)})
    write(record, record_path)
    return record
