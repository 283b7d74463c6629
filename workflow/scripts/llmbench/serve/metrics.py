"""Throughput and latency of one load, with the definitions of ``vllm bench serve``.

Latencies come from completed requests only. TPOT = (e2e - ttft) / (output_tokens - 1)
for requests with more than one output token: 0 for a request whose tokens all reached the
client in one read (the engine merged its stream's deltas, or the client read them late:
an overloaded host), counted in ``one_read_requests``; ITL pools the per-event gaps of all
completed requests (see loadgen.RequestSample). Percentiles interpolate linearly
between order statistics (numpy's default), as vLLM's do.

Goodput (as ``vllm bench serve --goodput`` and MLPerf's server scenario count it): the
measured requests that completed within a TTFT target and a TPOT target, as a share of all
measured requests (a failed request misses) and per second of the load. The default targets
are MLPerf Inference's for Llama-2-70B in its server scenario (TTFT <= 2 s, TPOT <= 200 ms);
the record keeps the targets beside the values, and its per-request columns let any other
pair be counted again.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .loadgen import LoadResult

PERCENTILES = (50, 90, 99)
#: MLPerf Inference, Llama-2-70B, server scenario: first token within 2 s, then 200 ms per token
TTFT_TARGET_S = 2.0
TPOT_TARGET_S = 0.2


def _stats(name: str, values: Sequence[float]) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=float)
    out: dict[str, float | None] = {f"mean_{name}": float(arr.mean()) if arr.size else None}
    for p in PERCENTILES:
        out[f"p{p}_{name}"] = float(np.percentile(arr, p)) if arr.size else None
    return out


def goodput(result: LoadResult, ttft_target_s: float = TTFT_TARGET_S,
            tpot_target_s: float = TPOT_TARGET_S) -> dict[str, float | int | None]:
    """Requests that completed within both targets: count, share of the measured requests, per second.

    TPOT is per request, (e2e - ttft) / (output_tokens - 1); a one-token request meets the
    TPOT target by having none.
    """
    if not ttft_target_s > 0 or not tpot_target_s > 0:
        raise ValueError(f"goodput targets must be > 0, got {ttft_target_s=} {tpot_target_s=}")
    met = 0
    for s in result.samples:
        if not s.ok or s.ttft_s is None or s.ttft_s > ttft_target_s:
            continue
        if s.output_tokens > 1 and (s.e2e_s - s.ttft_s) / (s.output_tokens - 1) > tpot_target_s:
            continue
        met += 1
    n, dur = len(result.samples), result.duration_s
    return {"goodput_ttft_target_s": ttft_target_s, "goodput_tpot_target_s": tpot_target_s,
            "goodput_requests": met, "goodput_share": met / n if n else None,
            "goodput_requests_per_s": met / dur if dur > 0 else None}


def summarize(result: LoadResult, output_len: int, ttft_target_s: float = TTFT_TARGET_S,
              tpot_target_s: float = TPOT_TARGET_S) -> dict[str, float | int | None]:
    """Flat metrics of one load (units in the names); None where no completed request gives a
    value. Goodput counts the requests within ttft_target_s and tpot_target_s."""
    done = [s for s in result.samples if s.ok]
    out_tokens = sum(s.output_tokens for s in done)
    in_tokens = sum(s.input_tokens for s in done)
    dur = result.duration_s
    summary: dict[str, float | int | None] = {
        "num_requests": len(result.samples),
        "completed": len(done),
        "failed": len(result.samples) - len(done),
        "duration_s": dur,
        "request_throughput_per_s": len(done) / dur if dur > 0 else None,
        "output_tokens_per_s": out_tokens / dur if dur > 0 else None,
        "total_tokens_per_s": (in_tokens + out_tokens) / dur if dur > 0 else None,
        "output_tokens_total": out_tokens,
        "output_tokens_expected": output_len * len(done),
        # Engines without ignore_eos over HTTP (TGI) stop at EOS: fewer tokens, less work.
        "output_shortfall_requests": sum(s.output_tokens < output_len for s in done),
        # their TPOT is 0: the client saw no decode pace (see the module docstring)
        "one_read_requests": sum(s.output_tokens > 1 and s.e2e_s == s.ttft_s for s in done),
    }
    summary |= _stats("ttft_s", [s.ttft_s for s in done])
    summary |= _stats("tpot_s", [(s.e2e_s - s.ttft_s) / (s.output_tokens - 1) for s in done if s.output_tokens > 1])
    summary |= _stats("itl_s", [gap for s in done for gap in s.itl_s])
    summary |= _stats("e2e_latency_s", [s.e2e_s for s in done])
    summary |= _stats("send_lag_s", [s.sent_s - s.scheduled_s - s.queued_s for s in result.samples])
    summary["client_cpu_per_request_s"] = result.client_cpu_per_request_s
    summary |= goodput(result, ttft_target_s, tpot_target_s)
    return summary


def cdf(values: Sequence[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Exact empirical CDF: the sorted values and the fraction of values <= each, (i+1)/n."""
    xs = np.sort(np.asarray(values, dtype=float))
    return tuple(xs.tolist()), tuple((np.arange(1, xs.size + 1) / xs.size).tolist())
