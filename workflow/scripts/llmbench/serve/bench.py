"""A serving cell: start the engine, fire the load, stop the engine, write the Record.

Status is data, as for training cells:
  ok       the engine became ready and every measured request completed
  oom      the engine ran out of memory (its log says so)
  timeout  the load ran past the cell's timeout_s (the requests that completed before are kept)
  error    the engine never became ready, died during the load, or any request failed
           (the record keeps the measured values and says how many failed and why)
The engine's whole process group is stopped in every case (llmbench.serve.server). A
paired set's cells are measured the same way, one after the other (llmbench.serve.paired).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from .. import gpus, provenance
from ..aggregate import Outcome, provenance_of
from ..procs import free_port, last_error, log_says_oom, stop_groups_on_signal, tail
from ..record import Record, write
from ..spec import RunSpec
from . import metrics, telemetry
from .dialects import DIALECTS
from .engines import ENGINES, Launch
from .loadgen import LoadResult, LoadSpec, run_load
from .model_dir import TOKEN_OFFSET
from .server import ServerError, serve

HOST = "127.0.0.1"
#: seconds past a cell's timeout_s before the load generator itself is stopped (it cuts the
#: measured load at timeout_s; this bounds a warm-up that hangs)
BACKSTOP_S = 60
#: seconds to wait, after a load with failed requests, for the engine to turn out dead
DEATH_GRACE_S = 2.0


def _interpreter(python: str | None) -> str:
    """The engine environment's python: the config's engine_python, else this one."""
    if not python:
        return sys.executable
    path = Path(python)
    return str(path.absolute()) if "/" in python else python


def dialect_for(engine_name: str):
    """The load generator's dialect object for an engine."""
    engine = ENGINES[engine_name]
    cls = DIALECTS[engine.dialect]
    if engine.dialect == "openai":
        return cls(token_ids=engine.token_id_prompts, ignore_eos=engine.ignore_eos)
    return cls()


def request_columns(result: LoadResult) -> dict[str, list]:
    """Per-request raw values, one list per column (exact CDFs downstream)."""
    cols: dict[str, list] = {k: [] for k in ("index", "scheduled_s", "sent_s", "ttft_s", "tpot_s", "e2e_s",
                                             "output_tokens", "ok", "error")}
    for s in result.samples:
        tpot = ((s.e2e_s - s.ttft_s) / (s.output_tokens - 1)
                if s.ok and s.output_tokens > 1 and s.e2e_s is not None and s.ttft_s is not None else None)
        for k, v in (("index", s.index), ("scheduled_s", s.scheduled_s), ("sent_s", s.sent_s),
                     ("ttft_s", s.ttft_s), ("tpot_s", tpot), ("e2e_s", s.e2e_s),
                     ("output_tokens", s.output_tokens), ("ok", s.ok), ("error", s.error)):
            cols[k].append(v)
    return cols


def engine_settings(engine_name: str, argv: list[str], env: dict[str, str], accelerator: str,
                    observed: dict) -> dict:
    """The record's serving settings (llmbench.serve.engines.SETTINGS): what the launch
    command sets, with what the running engine reported over its API in place of what the
    command left to it (vLLM's KV cache, sized at start-up); ``kv_cache_source`` says which."""
    out = ENGINES[engine_name].settings(argv, env, accelerator)
    source = "launch command" if out.get("kv_cache_tokens") is not None else None
    for k, v in observed.items():
        if k == "observe_error":
            out["engine_observe_error"] = v
        elif v is not None:
            out[k] = v
            source = "engine report" if k == "kv_cache_tokens" else source
    return {**out, "kv_cache_source": source}


def run_cell(spec: RunSpec | dict, model_dir: Path, record_path: Path, log: Path, server_log: Path,
             gpu_busy: gpus.BusyPolicy | None = None) -> Record:
    """Run one serving cell end to end and write its Record (never raises for a bad engine),
    its GPU telemetry samples beside it (llmbench.serve.telemetry.FILE). No engine starts on
    busy GPUs (``gpu_busy``: what to do then, llmbench.gpus). ``spec``: its run spec
    (llmbench.spec.RunSpec, or its JSON form)."""
    record = measure(spec, model_dir, log, server_log, gpu_busy,
                     telemetry_path=Path(record_path).parent / telemetry.FILE)
    write(record, record_path)
    return record


def measure(spec: RunSpec | dict, model_dir: Path, log: Path, server_log: Path,
            gpu_busy: gpus.BusyPolicy | None = None, telemetry_path: Path | None = None) -> Record:
    """One serving cell end to end, its engine started and always stopped: its Record, not
    written (run_cell writes it; a paired set writes its records together at its end,
    llmbench.serve.paired). Never raises for a bad engine. The cell's GPUs are sampled
    over the measured window (llmbench.serve.telemetry); the samples go to
    ``telemetry_path`` where there are any and it is given, their summary to the record."""
    started = datetime.now(UTC).isoformat()
    spec = RunSpec.of(spec)
    cell, model, platform = spec.cell, spec.model, spec.platform
    engine = ENGINES[cell.engine]
    python = _interpreter(spec.engine_python)
    log, server_log = Path(log), Path(server_log)
    log.parent.mkdir(parents=True, exist_ok=True)
    server_log.parent.mkdir(parents=True, exist_ok=True)
    server_log.write_text("")
    load = LoadSpec(**cell.load_spec, seed=cell.seed)
    launch = Launch(model_dir=Path(model_dir).absolute(), served_name=cell.model, host=HOST, port=free_port(HOST),
                    gpus=cell.gpus, accelerator=platform.accelerator, python=python,
                    dummy_weights=cell.weights == "dummy", max_model_len=cell.max_model_len,
                    max_num_seqs=load.max_concurrency or load.num_requests, extra_args=cell.engine_args)
    argv = engine.command(launch)
    env = {**platform.env, **engine.env(launch)}
    with open(log, "a") as fh:
        fh.write(f"serving cell {cell.record_path()}\nengine command: {argv}\nserver log: {server_log}\n")

    status, reason, result, serving, observed, exit_code = "ok", "", None, {}, {}, None
    check = gpus.check_cell(spec, cell.gpus, gpu_busy, log)  # first: it may claim the job's GPUs
    gpu_ids = gpus.cell_gpu_ids(cell.gpus, platform.accelerator)
    sampler = telemetry.Telemetry(gpu_ids)
    with stop_groups_on_signal():
        try:
            if check.refused:
                raise ServerError(check.refused)  # before the engine starts: nothing to stop
            with serve(argv, env=env, host=HOST, port=launch.port, health_path=engine.health_path,
                       log=server_log, ready_timeout_s=cell.ready_timeout_s, gpu_ids=gpu_ids) as server:
                observed = engine.observe(server.base_url)
                dialect = dialect_for(cell.engine)
                # the measured load is cut at timeout_s, keeping what finished before; the
                # backstop bounds the warm-up too
                coro = run_load(server.base_url, dialect, load, model=cell.model if engine.name != "transformers"
                                else str(launch.model_dir), vocab_size=model.vocab_size, token_offset=TOKEN_OFFSET,
                                deadline_s=cell.timeout_s, window=sampler)
                try:
                    result = asyncio.run(asyncio.wait_for(coro, timeout=cell.timeout_s + BACKSTOP_S))
                except TimeoutError:
                    status, reason = "timeout", f"the warm-up and load ran past timeout_s={cell.timeout_s} + {BACKSTOP_S} s"
                if result is not None and result.cut_at_s is not None:
                    done = sum(s.ok for s in result.samples)
                    status, reason = "timeout", (f"the load ran past timeout_s={cell.timeout_s}: {done} of "
                                                 f"{len(result.samples)} requests had completed; the record keeps them, "
                                                 "the rest are failed samples")
                exit_code = server.proc.poll()
                if exit_code is None and result is not None and not all(s.ok for s in result.samples):
                    # an engine that dies closes its sockets a moment before it can be reaped
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        exit_code = server.proc.wait(timeout=DEATH_GRACE_S)
                serving.update(server.memory.stop(), server_ready_s=server.ready_s)
            if status == "ok" and exit_code is not None:
                done = sum(s.ok for s in result.samples) if result is not None else 0
                total = len(result.samples) if result is not None else load.num_requests
                status = "oom" if log_says_oom(server_log) else "error"
                reason = (f"the server exited (code {exit_code}) during the load: {done} of {total} requests had "
                          f"completed; the record keeps them. {last_error(server_log)}")
        except ServerError as exc:
            status, reason = ("oom" if exc.oom else "error"), str(exc)

    requests: dict[str, list] = {}
    if result is not None:
        serving.update(metrics.summarize(result, load.output_len, load.ttft_target_s, load.tpot_target_s))
        serving.update(warmup_failed=result.warmup_failed, warmup_requests=load.warmup_requests,
                       prefix_len=load.prefix_len, suffix_len=load.suffix_len)
        requests = request_columns(result)
        failed = [s for s in result.samples if not s.ok]
        if status == "ok" and failed:
            status = "oom" if log_says_oom(server_log) else "error"
            reason = f"{len(failed)} of {len(result.samples)} requests failed; first: {failed[0].error}"
    written = None
    if sampler.samples and telemetry_path is not None:
        sampler.write(Path(telemetry_path))
        written = Path(telemetry_path).name
    serving.update(sampler.summary(file=written))
    serving.update(engine_settings(cell.engine, argv, env, platform.accelerator, observed))
    serving.update(engine=cell.engine, dialect=engine.dialect,
                   prompts="token ids" if engine.token_id_prompts else "text (word-level tokenizer, same ids)",
                   ignore_eos=engine.ignore_eos)
    # the one provenance builder (llmbench.aggregate), plus the engine's own
    prov = {
        **provenance_of(spec, [Outcome(status=status, reason=reason, launcher="engine server")], started,
                        [sys.executable, *sys.argv]),
        "engine_versions": provenance.engine_versions(python),
        "engine_command": argv,
        "engine_env": env,
        **check.provenance(),
    }
    prov["machine"] = provenance.machine(prov)
    record = Record(cell=cell.to_dict(), status=status, reason=reason,
                    log_tail=tail(server_log) if status != "ok" else "",
                    summary=serving, samples=requests, provenance=prov)
    with open(log, "a") as fh:
        fh.write(f"status {status} {reason}\n")
    return record
