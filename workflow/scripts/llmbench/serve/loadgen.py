"""The load generator: synthetic prompts, a burst, Poisson arrivals or a fixed concurrency,
one streamed request each.

Paper: a burst of 1000 synthetic requests of 512 input tokens sent at once by an asyncio
HTTP client; throughput and latency CDFs. One aiohttp session with an unlimited
connector, so every request really is in flight at once (aiohttp's default caps a
session at 100 connections), whose idle connections are reused for KEEPALIVE_S only. A
failed request is a sample with ok=False and its reason, never an exception out of run_load.

The load kinds follow ``vllm bench serve``: a burst is its ``--request-rate inf``; poisson its
``--request-rate R`` (with ``ramp_up_s``, the rate grows linearly from 0 to R over the first
ramp_up_s seconds, as its ``--ramp-up-strategy linear`` does over the whole run); concurrency
its ``--max-concurrency C`` with every request due at t0, so C requests are in flight while
any are left (SGLang's bench_serving and GuideLLM's ``concurrent`` profile are the same
closed loop). ``prefix_len`` gives every prompt (warm-up included) the same first prefix_len
tokens and a unique suffix, as vLLM's prefix-repetition dataset with one prefix does: the
workload a prefix cache is for.

Times are ``time.perf_counter()`` seconds relative to t0, the start of the measured load.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import aiohttp
import numpy as np

from ..config import check_schema, schema_defaults
from .dialects import Dialect, StreamError, StreamEvent

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
#: the config schema's load entry: LoadSpec's defaults and bounds are written there
_SCHEMA = "/$defs/load"
_DEFAULTS = schema_defaults(_SCHEMA)
#: Seconds a pooled connection may sit idle and still carry the next request. aiohttp's
#: default, 15 s, is above the 5 s after which uvicorn, and so vLLM's server
#: (VLLM_HTTP_TIMEOUT_KEEP_ALIVE), closes an idle connection: a request sent on a connection
#: the server is closing fails (ServerDisconnectedError) though the engine never saw it. A
#: connection idle longer than this (a warm-up's, one between sparse arrivals) is replaced by
#: a new one.
KEEPALIVE_S = 2.0


@dataclass(kw_only=True, slots=True, frozen=True)
class LoadSpec:
    """The offered load. Defaults and bounds: the config schema's ``load`` entry (where it
    has no default, as for the paper's burst size, the default below is stated in that
    entry's description)."""

    mode: Literal["burst", "poisson", "concurrency"] = _DEFAULTS["mode"]
    """burst: every request scheduled at t0; poisson: exponential inter-arrival gaps;
    concurrency: every request due at t0, max_concurrency of them in flight at a time."""
    num_requests: int = 1000
    """Measured requests (the paper's burst: 1000; the config must say)."""
    input_len: int = 512
    """Prompt tokens per request (the paper: 512; the config must say)."""
    output_len: int
    """Output tokens asked for per request."""
    rate_per_s: float | None = _DEFAULTS["rate_per_s"]
    """Mean arrival rate of the Poisson mode (required there, not allowed in a burst)."""
    max_concurrency: int | None = _DEFAULTS["max_concurrency"]
    """Requests in flight at most (None: unlimited; required by the concurrency mode)."""
    prefix_len: int = 0
    """Leading tokens every prompt shares (0: none); the other input_len - prefix_len are its own."""
    ramp_up_s: float = 0.0
    """Poisson mode: seconds over which the arrival rate grows linearly from 0 to rate_per_s (0: none)."""
    warmup_requests: int = _DEFAULTS["warmup_requests"]
    """Requests sent and awaited before the measured load, not counted (compilation, caches)."""
    seed: int = 0
    """Seed of the prompts and of the Poisson arrivals (a serving cell's seed, not a load key)."""
    prompt_seed: int | None = None
    """Seed of the prompts where it is not ``seed`` (the n-th load on a shared engine:
    llmbench.serve.bench.EngineSession); the arrivals keep ``seed``."""
    request_timeout_s: float = _DEFAULTS["request_timeout_s"]
    """Limit on one request from connect to end of stream; past it the sample fails."""
    ttft_target_s: float = 2.0
    """Goodput's time-to-first-token target (llmbench.serve.metrics; MLPerf's Llama-2-70B server scenario)."""
    tpot_target_s: float = 0.2
    """Goodput's time-per-output-token target (as above)."""

    def __post_init__(self) -> None:
        check_schema(asdict(self), _SCHEMA, "load.")
        if self.mode == "poisson" and self.rate_per_s is None:
            raise ValueError(f"load.rate_per_s must be > 0 in poisson mode, got {self.rate_per_s}")
        if self.mode != "poisson" and self.rate_per_s is not None:
            raise ValueError(f"load.rate_per_s applies to poisson mode only ({self.mode} sends all at t0)")
        if self.mode == "concurrency" and self.max_concurrency is None:
            raise ValueError("load.max_concurrency is required in concurrency mode (the requests kept in flight)")
        if self.ramp_up_s and self.mode != "poisson":
            raise ValueError(f"load.ramp_up_s applies to poisson mode only, got mode {self.mode!r}")
        if self.prefix_len >= self.input_len:
            raise ValueError(f"load.prefix_len must be < input_len (each prompt keeps a unique suffix), "
                             f"got prefix_len={self.prefix_len} input_len={self.input_len}")

    @property
    def suffix_len(self) -> int:
        """Tokens of each prompt after the shared prefix (its own)."""
        return self.input_len - self.prefix_len


@dataclass(kw_only=True, slots=True, frozen=True)
class RequestSample:
    """One measured request.

    TTFT is counted from the moment the request was written to the socket (so in a burst
    it includes the time the request waits in the server's queue) to the first event that
    carries a token. ITL follows ``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py):
    one gap per token-carrying event after the first, whatever the number of tokens the
    event delivered. When the server packs k tokens into one event, that is one gap, not
    k, so mean ITL exceeds TPOT; ``event_tokens`` keeps the count per event for a
    per-token view. e2e is sent -> last token event, as vLLM's ``latency``.
    """

    index: int
    """Position in the load (0-based)."""
    input_tokens: int
    """Prompt tokens sent."""
    scheduled_s: float
    """When the request was due (arrival time)."""
    queued_s: float
    """Time spent waiting for a max_concurrency slot after scheduled_s."""
    sent_s: float
    """When the request's body was written (aiohttp trace; time of the attempt if it never was)."""
    ttft_s: float | None
    """First token event minus sent_s (None if no token arrived)."""
    e2e_s: float | None
    """Last token event minus sent_s (None if no token arrived)."""
    itl_s: tuple[float, ...]
    """Gaps between consecutive token-carrying events."""
    event_tokens: tuple[int, ...]
    """Tokens delivered by each token-carrying event."""
    output_tokens: int
    """Output tokens: the server's usage count when it reports one, else the sum of event_tokens."""
    ok: bool
    """The request completed: HTTP 200, a well-formed stream, a final event, at least one token."""
    error: str
    """Why it failed ('' when ok)."""
    http_status: int | None
    """HTTP status (None if no response arrived)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class LoadResult:
    """The samples of one load and the load generator's own cost."""

    schema_version: int = SCHEMA_VERSION
    """Version of this record's layout."""
    samples: tuple[RequestSample, ...]
    """One per measured request, in index order."""
    duration_s: float
    """t0 to the end of the last response."""
    started_at: str
    """Wall-clock time of t0 (ISO 8601, UTC)."""
    client_cpu_s: float
    """CPU seconds of the load generator's event-loop thread during the measured load."""
    client_cpu_per_request_s: float
    """client_cpu_s divided by the measured requests."""
    send_lag_mean_s: float
    """Mean of sent_s - scheduled_s - queued_s: the client's delay in writing a due request."""
    warmup_failed: int
    """Warm-up requests that failed (not counted elsewhere)."""
    cut_at_s: float | None = None
    """Seconds after t0 at which the deadline cut the load (None: it ran to its end). The
    requests unfinished then are failed samples (error CUT_ERROR); the rest are measured."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (tuples become lists once serialised)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoadResult:
        """Inverse of to_dict, also after a JSON round trip."""
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"load result schema_version {d.get('schema_version')} != {SCHEMA_VERSION}")
        samples = tuple(
            RequestSample(**{**s, "itl_s": tuple(s["itl_s"]), "event_tokens": tuple(s["event_tokens"])})
            for s in d["samples"]
        )
        return cls(**{**d, "samples": samples})


def make_prompts(n: int, input_len: int, vocab_size: int, seed: int, offset: int = 3) -> list[list[int]]:
    """n prompts of input_len random token ids in [offset, vocab_size), each with its own first id.

    Ids below ``offset`` (bos, eos, unk, pad in the pipeline's tokenizer) never appear.
    Distinct first ids (while n <= vocab_size - offset) mean no two prompts share a
    prefix, so prefix caching cannot flatter the result.
    """
    span = vocab_size - offset
    if offset < 0 or span < 1 or n < 0 or input_len < 1:
        raise ValueError(f"need 0 <= offset < vocab_size, n >= 0, input_len >= 1; "
                         f"got {offset=} {vocab_size=} {n=} {input_len=}")
    rng = np.random.default_rng((seed, 0))
    ids = rng.integers(offset, vocab_size, size=(n, input_len))
    ids[:, 0] = offset + (rng.permutation(span)[:n] if n <= span else rng.integers(0, span, n))
    return ids.tolist()


def make_shared_prefix_prompts(n: int, prefix_len: int, suffix_len: int, vocab_size: int, seed: int,
                               offset: int = 3) -> list[list[int]]:
    """n prompts of one shared prefix of prefix_len random ids, then suffix_len ids of their own
    (make_prompts's: each suffix starts with its own first id, so the prompts part there)."""
    if prefix_len < 0:
        raise ValueError(f"need prefix_len >= 0, got {prefix_len=}")
    suffixes = make_prompts(n, suffix_len, vocab_size, seed, offset)
    prefix = np.random.default_rng((seed, 2)).integers(offset, vocab_size, size=prefix_len).tolist()
    return [prefix + s for s in suffixes]


def prompt_text(ids: list[int]) -> str:
    """The text whose WordLevel tokenization (word ``t<i>`` for id i, split on spaces) is ``ids``."""
    return " ".join(f"t{i}" for i in ids)


def schedule(spec: LoadSpec) -> tuple[float, ...]:
    """Arrival time of each measured request, relative to t0 (deterministic in the seed).

    A ramp of k seconds is a Poisson process of rate R·min(t/k, 1): the arrivals of the
    steady process (at times s) moved to the t where its expected count R·t²/(2k), then
    R·(t - k/2), reaches R·s. Past the ramp each arrival is the steady one plus k/2."""
    if spec.mode != "poisson":
        return (0.0,) * spec.num_requests
    gaps = np.random.default_rng((spec.seed, 1)).exponential(1.0 / spec.rate_per_s, spec.num_requests - 1)
    steady = np.concatenate(([0.0], np.cumsum(gaps)))
    if spec.ramp_up_s:
        k = spec.ramp_up_s
        steady = np.where(steady <= k / 2, np.sqrt(2 * k * steady), steady + k / 2)
    return tuple(steady.tolist())


class SSEParser:
    """Incremental Server-Sent Events parser: bytes in, ``data`` payloads out.

    Reads split anywhere (mid-line, several events per read); ``data:`` with or without
    the space; ``\\r\\n``; comment lines (``:``) and other fields (``event:``, ``id:``)
    are skipped; the data lines of one event are joined with a newline, as the SSE
    specification says.
    """

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        """Payloads of the events completed by this chunk."""
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        out: list[bytes] = []
        for line in lines:
            self._line(line.rstrip(b"\r"), out)
        return out

    def close(self) -> list[bytes]:
        """Payloads left at end of stream (a last event without its blank line still counts)."""
        out: list[bytes] = []
        self._line(self._buf.rstrip(b"\r"), out)
        self._buf = b""
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self._data:
                out.append(b"\n".join(self._data))
                self._data = []
        elif not line.startswith(b":"):
            field, _, value = line.partition(b":")
            if field == b"data":
                self._data.append(value[1:] if value.startswith(b" ") else value)


class _Progress:
    """Token events of one request as they arrive."""

    __slots__ = ("first", "last", "itl", "event_tokens", "usage", "done")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.itl: list[float] = []
        self.event_tokens: list[int] = []
        self.usage: int | None = None
        self.done = False

    def add(self, event: StreamEvent | None, now: float) -> None:
        if event is None:
            return
        if event.error:
            raise StreamError(event.error)
        if event.tokens > 0:
            if self.last is not None:
                self.itl.append(now - self.last)
            self.first = now if self.first is None else self.first
            self.last = now
            self.event_tokens.append(event.tokens)
        if event.usage_output_tokens is not None:
            self.usage = event.usage_output_tokens  # the last report wins (continuous usage)
        self.done = self.done or event.done


async def _stream(resp: aiohttp.ClientResponse, dialect: Dialect, progress: _Progress) -> None:
    parser = SSEParser()
    # iter_any, not line iteration: no line-length limit (vLLM's first chunk repeats the
    # prompt ids), and one timestamp per read, when those bytes reached the client.
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        for payload in parser.feed(chunk):
            progress.add(dialect.parse_event(payload), now)
    now = time.perf_counter()
    for payload in parser.close():
        progress.add(dialect.parse_event(payload), now)


async def _on_chunk_sent(session: Any, ctx: Any, params: Any) -> None:
    ctx.trace_request_ctx["sent"] = time.perf_counter()


@dataclass(kw_only=True, slots=True)
class _Request:
    index: int
    prompt_len: int
    url: str
    body: bytes
    scheduled_s: float


#: a request the load's deadline cut (llmbench.serve.bench: the cell's timeout_s)
CUT_ERROR = "cut: the load's deadline passed before this request finished"


async def _send(session: aiohttp.ClientSession, req: _Request, dialect: Dialect, t0: float,
                limit: asyncio.Semaphore | None, timeout: aiohttp.ClientTimeout) -> tuple[RequestSample, float]:
    progress, trace, status, error = _Progress(), {"sent": None}, None, ""
    due = start = None
    try:
        delay = t0 + req.scheduled_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        due = time.perf_counter()
        async with limit if limit is not None else contextlib.nullcontext():
            start = time.perf_counter()
            try:
                async with session.post(req.url, data=req.body, headers={"Content-Type": "application/json"},
                                        timeout=timeout, trace_request_ctx=trace) as resp:
                    status = resp.status
                    if status != 200:
                        error = f"HTTP {status}: {(await resp.text(errors='replace'))[:300]}"
                    else:
                        await _stream(resp, dialect, progress)
                        if progress.first is None:
                            error = "stream ended without any token"
                        elif not progress.done:
                            error = f"stream ended before the final event ({sum(progress.event_tokens)} tokens received)"
            except StreamError as e:
                error = str(e)
            except TimeoutError:
                error = f"timeout after {timeout.total} s"
            except Exception as e:  # noqa: BLE001 - one request's failure must not end the load
                error = f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        # run_load cancels what is unfinished at its deadline: the request becomes a failed
        # sample with what it had received (the others' measurements are kept)
        error = CUT_ERROR
    end = time.perf_counter()
    due = end if due is None else due
    start = end if start is None else start
    sent = trace["sent"] or start
    sample = RequestSample(
        index=req.index, input_tokens=req.prompt_len, scheduled_s=req.scheduled_s, queued_s=start - due,
        sent_s=sent - t0,
        ttft_s=None if progress.first is None else progress.first - sent,
        e2e_s=None if progress.last is None else progress.last - sent,
        itl_s=tuple(progress.itl), event_tokens=tuple(progress.event_tokens),
        output_tokens=progress.usage if progress.usage is not None else sum(progress.event_tokens),
        ok=not error, error=error, http_status=status,
    )
    return sample, end - t0


def _raise_fd_limit(needed: int) -> None:
    # One socket per in-flight request: 1000 of them exceed the common soft limit of 1024.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if new < want:
            log.warning("open-file limit %d may be too low for %d concurrent requests", new, needed)


async def run_load(base_url: str, dialect: Dialect, spec: LoadSpec, model: str, vocab_size: int,
                   token_offset: int = 3, deadline_s: float | None = None,
                   window: contextlib.AbstractContextManager | None = None) -> LoadResult:
    """Send the warm-up, then the measured load, to ``base_url``; one sample per measured
    request. ``deadline_s`` after the measured load's start whatever is unfinished is cut
    (cancelled, a failed sample each; ``cut_at_s`` says when). ``window`` is entered once the
    warm-up is done, just before t0, and left when the measured load ends (a GPU sampler,
    llmbench.serve.telemetry)."""
    n_all = spec.warmup_requests + spec.num_requests
    _raise_fd_limit(spec.num_requests if spec.max_concurrency is None else spec.max_concurrency)
    prompts = make_shared_prefix_prompts(n_all, spec.prefix_len, spec.suffix_len, vocab_size,
                                         spec.seed if spec.prompt_seed is None else spec.prompt_seed, token_offset)
    arrivals = (0.0,) * spec.warmup_requests + schedule(spec)
    # Bodies are encoded before t0 so the measured load pays only for sending them.
    reqs = []
    for i, (ids, at) in enumerate(zip(prompts, arrivals)):
        path, body = dialect.request(ids, prompt_text(ids), spec.output_len, model)
        reqs.append(_Request(index=i - spec.warmup_requests, prompt_len=len(ids), url=base_url.rstrip("/") + path,
                             body=json.dumps(body).encode(), scheduled_s=at))
    warmup, measured = reqs[:spec.warmup_requests], reqs[spec.warmup_requests:]
    limit = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    tracing = aiohttp.TraceConfig()
    tracing.on_request_chunk_sent.append(_on_chunk_sent)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[tracing]) as session:
        t_w = time.perf_counter()
        done = await asyncio.gather(*(_send(session, r, dialect, t_w, limit, timeout) for r in warmup))
        warmup_failed = sum(not s.ok for s, _ in done)
        if warmup_failed:
            log.warning("%d of %d warm-up requests failed: %s", warmup_failed, len(warmup),
                        next(s.error for s, _ in done if not s.ok))
        started_at = datetime.now(UTC).isoformat(timespec="seconds")
        with window if window is not None else contextlib.nullcontext():
            # Thread CPU time: the event loop runs in this thread; other threads of the process
            # (an in-process test server, a DNS resolver) are not the load generator's cost.
            cpu0, t0 = time.thread_time(), time.perf_counter()
            tasks = [asyncio.ensure_future(_send(session, r, dialect, t0, limit, timeout)) for r in measured]
            _, pending = await asyncio.wait(tasks, timeout=deadline_s)
            cut_at = time.perf_counter() - t0 if pending else None
            for task in pending:
                task.cancel()
            results = [await task for task in tasks]  # a cut request returns its failed sample
            cpu = time.thread_time() - cpu0
    samples = tuple(s for s, _ in results)
    return LoadResult(
        samples=samples, duration_s=max(end for _, end in results), started_at=started_at,
        client_cpu_s=cpu, client_cpu_per_request_s=cpu / len(samples),
        send_lag_mean_s=float(np.mean([s.sent_s - s.scheduled_s - s.queued_s for s in samples])),
        warmup_failed=warmup_failed, cut_at_s=cut_at,
    )


def run(base_url: str, dialect: Dialect, spec: LoadSpec, model: str, vocab_size: int,
        token_offset: int = 3) -> LoadResult:
    """Synchronous run_load (its own event loop)."""
    return asyncio.run(run_load(base_url, dialect, spec, model, vocab_size, token_offset))
