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
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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
    with EngineSession([spec], model_dir, log, server_log, gpu_busy) as session:
        return session.measure(spec, telemetry_path)


def session_launch(specs: list[RunSpec]) -> dict[str, Any]:
    """What an engine's launch takes from the loads it will serve (llmbench.serve.engines.Launch):
    the longest prompt plus output of any of them, and the most requests any of them keeps in
    flight (its max_concurrency, else all its requests)."""
    loads = [s.cell.load_spec for s in specs]
    return {"max_model_len": max(s.cell.max_model_len for s in specs),
            "max_num_seqs": max(x.get("max_concurrency") or x["num_requests"] for x in loads)}


class EngineSession:
    """One engine started for one or more serving cells of one launch (the same platform,
    model, engine, GPUs, weights and engine arguments), their loads fired one after the
    other on it, and the engine always stopped when the session ends (a context manager).

    A cell's own engine is a session of one (measure). A paired set whose blocks say
    ``share_engine`` serves the consecutive runs of one launch in a round from one session
    (llmbench.serve.paired), as ``vllm bench sweep serve`` starts its server once per
    server configuration: a sweep's points then cost one engine start, not one each. The
    launch is sized for every load of the session (session_launch). The n-th load's prompts
    are drawn with the cell's seed + n, so that no load finds another's prompts in a prefix
    cache; its Poisson arrivals keep the cell's seed, as on an engine of its own. Its record
    names the session (provenance.engine_session) and the prompts' seed (summary.prompt_seed).
    The engine log is the first cell's; each other cell's own log gets what the engine wrote
    during its load. An engine that does not start fails every load of the session; one
    that dies fails the load it died in and every later one."""

    def __init__(self, specs: list[RunSpec | dict], model_dir: Path, log: Path, server_log: Path,
                 gpu_busy: gpus.BusyPolicy | None = None, names: list[str] | None = None) -> None:
        self.specs = [RunSpec.of(s) for s in specs]
        if not self.specs:
            raise ValueError("an engine session serves at least one cell")
        first = self.specs[0]
        keys = {s.cell.launch_key for s in self.specs}
        if len(keys) > 1:
            raise ValueError(f"an engine session's cells must share one launch, got {len(keys)}: {sorted(keys)}")
        self.cell, self.platform, self.gpu_busy = first.cell, first.platform, gpu_busy
        self.engine = ENGINES[self.cell.engine]
        self.log, self.server_log = Path(log), Path(server_log)
        self.names = names
        self.launch = Launch(model_dir=Path(model_dir).absolute(), served_name=self.cell.model, host=HOST,
                             port=free_port(HOST), gpus=self.cell.gpus, accelerator=self.platform.accelerator,
                             python=_interpreter(first.engine_python), dummy_weights=self.cell.weights == "dummy",
                             extra_args=self.cell.engine_args, **session_launch(self.specs))
        self.argv = self.engine.command(self.launch)
        self.env = {**self.platform.env, **self.engine.env(self.launch)}
        self.server = None
        self.error: ServerError | None = None
        self.observed: dict = {}
        self.loads = 0
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> EngineSession:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.server_log.parent.mkdir(parents=True, exist_ok=True)
        self.server_log.write_text("")
        with open(self.log, "a") as fh:
            if self.names is not None or len(self.specs) > 1:
                fh.write(f"engine session of {len(self.specs)} cell(s): {self.names or ''}\n")
            fh.write(f"serving cell {self.cell.record_path()}\nengine command: {self.argv}\n"
                     f"server log: {self.server_log}\n")
        try:
            self._stack.enter_context(stop_groups_on_signal())
            # first: it may claim the job's GPUs; once, before the session's own engine holds them
            self.check = gpus.check_cell(self.specs[0], self.cell.gpus, self.gpu_busy, self.log)
            self.gpu_ids = gpus.cell_gpu_ids(self.cell.gpus, self.platform.accelerator)
            try:
                if self.check.refused:
                    raise ServerError(self.check.refused)  # before the engine starts: nothing to stop
                self.server = self._stack.enter_context(
                    serve(self.argv, env=self.env, host=HOST, port=self.launch.port,
                          health_path=self.engine.health_path, log=self.server_log,
                          ready_timeout_s=self.cell.ready_timeout_s, gpu_ids=self.gpu_ids))
                self.observed = self.engine.observe(self.server.base_url)
            except ServerError as exc:
                self.error = exc
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> bool | None:
        return self._stack.__exit__(*exc)

    def measure(self, spec: RunSpec | dict, telemetry_path: Path | None = None,
                cell_server_log: Path | None = None) -> Record:
        """Fire one cell's load on the session's engine: its Record, not written (never raises
        for a bad engine). ``cell_server_log``: the cell's own engine log, where it is not the
        session's (what the engine wrote during the load is put there after it)."""
        started = datetime.now(UTC).isoformat()
        spec = RunSpec.of(spec)
        if spec.cell.launch_key != self.cell.launch_key:
            raise ValueError(f"cell {spec.cell.record_path()} is not of this engine session's launch")
        cell, model, position = spec.cell, spec.model, self.loads
        self.loads += 1
        offset = self.server_log.stat().st_size if self.server_log.exists() else 0
        load = LoadSpec(**cell.load_spec, seed=cell.seed, prompt_seed=cell.seed + position)
        if position:
            with open(self.log, "a") as fh:
                fh.write(f"serving cell {cell.record_path()} on the session's engine (load {position + 1})\n")
        status, reason, result, serving, exit_code = "ok", "", None, {}, None
        sampler = telemetry.Telemetry(self.gpu_ids)
        if self.error is not None:
            status, reason = ("oom" if self.error.oom else "error"), str(self.error)
        elif (code := self.server.proc.poll()) is not None:
            status = "oom" if log_says_oom(self.server_log) else "error"
            reason = (f"the session's engine had exited (code {code}) before this load, after {position} "
                      f"load(s) of its session. {last_error(self.server_log)}")
        else:
            server = self.server
            dialect = dialect_for(cell.engine)
            # the measured load is cut at timeout_s, keeping what finished before; the
            # backstop bounds the warm-up too
            coro = run_load(server.base_url, dialect, load, model=cell.model if self.engine.name != "transformers"
                            else str(self.launch.model_dir), vocab_size=model.vocab_size, token_offset=TOKEN_OFFSET,
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
            serving.update(server.memory.peaks(), server_ready_s=server.ready_s)
            if status == "ok" and exit_code is not None:
                done = sum(s.ok for s in result.samples) if result is not None else 0
                total = len(result.samples) if result is not None else load.num_requests
                status = "oom" if log_says_oom(self.server_log) else "error"
                reason = (f"the server exited (code {exit_code}) during the load: {done} of {total} requests had "
                          f"completed; the record keeps them. {last_error(self.server_log)}")

        requests: dict[str, list] = {}
        if result is not None:
            serving.update(metrics.summarize(result, load.output_len, load.ttft_target_s, load.tpot_target_s))
            serving.update(warmup_failed=result.warmup_failed, warmup_requests=load.warmup_requests,
                           prefix_len=load.prefix_len, suffix_len=load.suffix_len)
            requests = request_columns(result)
            failed = [s for s in result.samples if not s.ok]
            if status == "ok" and failed:
                status = "oom" if log_says_oom(self.server_log) else "error"
                reason = f"{len(failed)} of {len(result.samples)} requests failed; first: {failed[0].error}"
        written = None
        if sampler.samples and telemetry_path is not None:
            sampler.write(Path(telemetry_path))
            written = Path(telemetry_path).name
        serving.update(sampler.summary(file=written))
        serving.update(engine_settings(cell.engine, self.argv, self.env, self.platform.accelerator, self.observed))
        serving.update(engine=cell.engine, dialect=self.engine.dialect,
                       prompts="token ids" if self.engine.token_id_prompts else "text (word-level tokenizer, same ids)",
                       ignore_eos=self.engine.ignore_eos, prompt_seed=load.prompt_seed)
        # the one provenance builder (llmbench.aggregate), plus the engine's own
        prov = {
            **provenance_of(spec, [Outcome(status=status, reason=reason, launcher="engine server")], started,
                            [sys.executable, *sys.argv]),
            "engine_versions": provenance.engine_versions(self.launch.python),
            "engine_command": self.argv,
            "engine_env": self.env,
            **self.check.provenance(),
        }
        if self.names is not None or len(self.specs) > 1:  # a shared set's (llmbench.serve.paired)
            prov["engine_session"] = {"cells": self.names or [s.cell.record_path() for s in self.specs],
                                      "position": position}
        prov["machine"] = provenance.machine(prov)
        record = Record(cell=cell.to_dict(), status=status, reason=reason,
                        log_tail=tail(self.server_log) if status != "ok" else "",
                        summary=serving, samples=requests, provenance=prov)
        with open(self.log, "a") as fh:
            fh.write(f"status {status} {reason}\n")
        if cell_server_log is not None and Path(cell_server_log).absolute() != self.server_log.absolute():
            Path(cell_server_log).parent.mkdir(parents=True, exist_ok=True)
            with open(self.server_log, "rb") as src, open(cell_server_log, "wb") as dst:
                dst.write(f"[llmbench] the engine's log during this load, from byte {offset} of its session's log "
                          f"{self.server_log} (its start-up and earlier loads are there)\n".encode())
                src.seek(offset)
                shutil.copyfileobj(src, dst)
        return record

