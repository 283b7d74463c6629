"""llmbench.serve: dialects, load generator and metrics, against protocol test doubles (no engine)."""

import asyncio
import json
import os
import sys
import time

import numpy as np
import pytest

from llmbench.serve import dialects as d
from llmbench.serve.loadgen import (LoadResult, LoadSpec, RequestSample, SSEParser, make_prompts,
                                    make_shared_prefix_prompts, prompt_text, run, schedule)
from llmbench.serve.metrics import cdf, goodput, summarize

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))
from fake_servers import FakeServer  # noqa: E402

VLLM = d.OpenAICompletions(token_ids=True, ignore_eos=True)
TRANSFORMERS = d.OpenAICompletions(token_ids=False, ignore_eos=False)


def load(srv, dialect, **kw):
    """The measured load alone (no warm-up requests) unless ``kw`` asks for them."""
    spec = LoadSpec(**{"num_requests": 20, "input_len": 8, "output_len": 10, "warmup_requests": 0, **kw})
    return run(srv.url, dialect, spec, model="fake", vocab_size=1000)


# ---- prompts and schedule ----

def test_prompts_distinct_in_range_and_tokenize_back():
    from tokenizers import Tokenizer, models, pre_tokenizers

    prompts = make_prompts(300, 16, vocab_size=1000, seed=0, offset=3)
    assert len(prompts) == 300 and all(len(p) == 16 for p in prompts)
    assert len({p[0] for p in prompts}) == 300  # no two prompts share a prefix
    flat = np.array(prompts)
    assert flat.min() >= 3 and flat.max() < 1000
    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(3, 1000)} | {"<unk>": 0}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    for p in prompts[:20]:
        assert tok.encode(prompt_text(p)).ids == p
    assert prompt_text([5, 17]) == "t5 t17"


def test_prompts_use_the_whole_range_and_skip_special_ids():
    ids = set(np.ravel(make_prompts(50, 100, vocab_size=10, seed=1, offset=3)).tolist())
    assert ids == set(range(3, 10))
    assert make_prompts(4, 8, 1000, seed=7) == make_prompts(4, 8, 1000, seed=7) != make_prompts(4, 8, 1000, seed=8)


@pytest.mark.parametrize("kw, field", [
    ({"mode": "closed"}, "mode"), ({"num_requests": 0}, "num_requests"), ({"output_len": 0}, "output_len"),
    ({"mode": "poisson"}, "rate_per_s"), ({"rate_per_s": 2.0}, "rate_per_s"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"warmup_requests": -1}, "warmup_requests"), ({"request_timeout_s": 0}, "request_timeout_s"),
    ({"mode": "concurrency"}, "max_concurrency"), ({"mode": "concurrency", "max_concurrency": 2, "rate_per_s": 1.0},
                                                   "rate_per_s"),
    ({"ramp_up_s": 5.0}, "ramp_up_s"), ({"mode": "poisson", "rate_per_s": 1.0, "ramp_up_s": -1}, "ramp_up_s"),
    ({"prefix_len": 512}, "prefix_len"), ({"prefix_len": -1}, "prefix_len"),
])
def test_load_spec_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        LoadSpec(**{"output_len": 8, **kw})


def test_burst_is_all_at_t0_and_poisson_has_the_asked_rate():
    assert schedule(LoadSpec(num_requests=5, output_len=1)) == (0.0,) * 5
    spec = LoadSpec(mode="poisson", num_requests=4000, output_len=1, rate_per_s=50.0, seed=3)
    at = np.array(schedule(spec))
    gaps = np.diff(at)
    assert at[0] == 0.0 and (gaps > 0).all()
    assert abs((len(at) - 1) / at[-1] / 50.0 - 1) < 0.05  # mean rate; its sd here is about 1.6 %
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1  # exponential gaps (CV 1), not evenly spaced
    assert schedule(spec) == tuple(at) != schedule(LoadSpec(mode="poisson", num_requests=4000, output_len=1,
                                                            rate_per_s=50.0, seed=4))


# ---- SSE framing and dialect parsing ----

def test_sse_parser_any_split():
    stream = (b": keep-alive\n\ndata:{\"a\": 1}\n\nevent: message\r\ndata: {\"b\": 2}\r\n\r\n"
              b"data: [DONE]\n\ndata: line1\ndata: line2\n\nid: 7\ndata:{\"last\": true}")
    want = [b'{"a": 1}', b'{"b": 2}', b"[DONE]", b"line1\nline2", b'{"last": true}']
    for size in (1, 3, 7, len(stream)):
        parser, got = SSEParser(), []
        for i in range(0, len(stream), size):
            got += parser.feed(stream[i:i + size])
        assert got + parser.close() == want


def test_openai_parse_counts_ids_then_logprobs_then_text_events():
    p = VLLM.parse_event
    assert p(b"[DONE]") is None and p(b"  ") is None
    assert p(b'{"choices": [{"index": 0, "text": "", "token_ids": [5, 6, 7], "finish_reason": null}]}').tokens == 3
    assert p(b'{"choices": [{"text": "ab", "logprobs": {"tokens": ["a", "b"]}}]}').tokens == 2
    assert p(b'{"choices": [{"text": "a"}]}').tokens == 1
    end = p(b'{"choices": [{"text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 9}}')
    assert (end.tokens, end.done, end.usage_output_tokens) == (0, True, 9)
    usage = p(b'{"id": "x", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 10, "total_tokens": 18}}')
    assert (usage.tokens, usage.done, usage.usage_output_tokens) == (0, True, 10)
    err = p(b'{"error": {"message": "boom", "type": "BadRequestError", "code": 400}}')
    assert err.error == "server error in stream (BadRequestError): boom"
    assert "no space left" in TRANSFORMERS.parse_event(b'{"error": "no space left"}').error


@pytest.mark.parametrize("payload, message", [
    (b"{not json", "not JSON"), (b"[1, 2]", "not a JSON object"), (b'{"id": "x"}', "neither 'choices' nor 'usage'"),
    (b'{"choices": [{"index": 0}]}', "'text'"),
    (b'{"choices": [], "usage": {"completion_tokens": "9"}}', "completion_tokens"),
])
def test_openai_malformed_payload_names_the_problem(payload, message):
    with pytest.raises(d.StreamError, match=message):
        VLLM.parse_event(payload)


def test_tgi_and_lightllm_parse_their_documented_events():
    tgi = d.TGI()
    mid = tgi.parse_event(b'{"index":1,"token":{"id":5,"text":" a","logprob":-0.1,"special":false},'
                          b'"generated_text":null,"details":null}')
    assert (mid.tokens, mid.done, mid.usage_output_tokens) == (1, False, None)
    last = tgi.parse_event(b'{"index":4,"token":{"id":2,"text":"","logprob":-0.1,"special":true},"generated_text":"x",'
                           b'"details":{"finish_reason":"eos_token","generated_tokens":4,"seed":null}}')
    assert (last.tokens, last.done, last.usage_output_tokens) == (1, True, 4)
    err = tgi.parse_event(b'{"error":"Incomplete generation","error_type":"incomplete_generation"}')
    assert err.error == "server error in stream (incomplete_generation): Incomplete generation"
    with pytest.raises(d.StreamError, match="'token'"):
        tgi.parse_event(b'{"generated_text": null}')
    ll = d.LightLLM()
    tok = b'{"token":{"id":9,"text":" a","logprob":-1.0,"special":false,"count_output_tokens":%d},' \
          b'"generated_text":null,"finished":%s,"finish_reason":%s,"details":null}'
    assert ll.parse_event(tok % (1, b"false", b"null")) == d.StreamEvent(tokens=1)
    assert ll.parse_event(tok % (7, b"true", b'"length"')) == d.StreamEvent(tokens=1, done=True, usage_output_tokens=7)
    with pytest.raises(d.StreamError, match="'finished'"):
        ll.parse_event(b'{"token": {"id": 1}}')


def test_sglang_parses_its_documented_incremental_chunks():
    sg = d.SGLang()
    chunk = b'{"text":" a b","output_ids":%s,"meta_info":{"id":"r1","finish_reason":%s,"prompt_tokens":8,' \
            b'"completion_tokens":%d,"cached_tokens":0}}'
    assert sg.parse_event(chunk % (b"[5, 6]", b"null", 2)) == d.StreamEvent(tokens=2, usage_output_tokens=2)
    last = sg.parse_event(chunk % (b"[7]", b'{"type":"length","length":3}', 3))
    assert last == d.StreamEvent(tokens=1, done=True, usage_output_tokens=3)
    assert sg.parse_event(b"[DONE]") is None
    err = sg.parse_event(b'{"error": {"message": "prompt too long"}}')
    assert err.done and err.error == "server error in stream: prompt too long"
    with pytest.raises(d.StreamError, match="'output_ids'"):
        sg.parse_event(b'{"text": "a", "meta_info": {"completion_tokens": 1}}')
    with pytest.raises(d.StreamError, match="'completion_tokens'"):
        sg.parse_event(b'{"output_ids": [1], "meta_info": {"finish_reason": null}}')


def test_request_bodies():
    path, body = VLLM.request([5, 6], "t5 t6", 4, "m")
    assert path == "/v1/completions" and body == {
        "model": "m", "prompt": [5, 6], "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True},
        "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    _, body = TRANSFORMERS.request([5, 6], "t5 t6", 4, "m")
    assert body["prompt"] == "t5 t6" and "ignore_eos" not in body and "return_token_ids" not in body  # 422 there
    assert d.TGI().request([5], "t5", 4, "m") == (
        "/generate_stream", {"inputs": "t5", "parameters": {"max_new_tokens": 4, "details": True, "do_sample": False}})
    assert d.LightLLM().request([5], "t5", 4, "m") == (
        "/generate_stream", {"inputs": "t5", "parameters": {"max_new_tokens": 4, "ignore_eos": True}})
    assert d.SGLang().request([5, 6], "t5 t6", 4, "m") == (
        "/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True,
                                                                "temperature": 0}, "stream": True})
    assert set(d.DIALECTS) == {"openai", "tgi", "lightllm", "sglang"}


# ---- the load generator against the fake servers ----

@pytest.mark.parametrize("server, dialect, events", [
    (("openai", {"tokens_per_event": 3}), VLLM, (3, 3, 3, 1)),  # vLLM's multi-token chunks
    (("openai", {"tokens_per_event": 3}), TRANSFORMERS, (1, 1, 1, 1)),  # text only: usage gives the count
    (("openai", {"flavour": "transformers"}), TRANSFORMERS, (1,) * 10),
    (("tgi", {}), d.TGI(), (1,) * 10),
    (("lightllm", {}), d.LightLLM(), (1,) * 10),
    (("sglang", {"tokens_per_event": 4}), d.SGLang(), (4, 4, 2)),  # SGLang's multi-token chunks
])
def test_token_counts_exact(server, dialect, events):
    with FakeServer(server[0], **server[1]) as srv:
        res = load(srv, dialect)
    prompts = make_prompts(20, 8, 1000, seed=0)
    assert [s.index for s in res.samples] == list(range(20))
    for s in res.samples:
        assert s.ok, s.error
        assert (s.output_tokens, s.event_tokens, len(s.itl_s), s.http_status) == (10, events, len(events) - 1, 200)
        assert s.input_tokens == 8 and 0 <= s.ttft_s <= s.e2e_s
    sent = [b.get("prompt", b.get("inputs", b.get("input_ids"))) for b in srv.stats.bodies]
    want = prompts if dialect is VLLM or isinstance(dialect, d.SGLang) else [prompt_text(p) for p in prompts]
    assert sorted(map(str, sent)) == sorted(map(str, want))


def test_burst_puts_every_request_in_flight_at_once():
    # The server holds each request until 200 are open together (or 10 s pass, and this fails).
    with FakeServer("openai", gate_inflight=200) as srv:
        res = load(srv, VLLM, num_requests=200, output_len=4)
    assert srv.stats.max_in_flight == 200
    assert all(s.ok for s in res.samples)
    assert res.client_cpu_s > 0 and res.client_cpu_per_request_s == res.client_cpu_s / 200


def test_max_concurrency_is_respected():
    with FakeServer("tgi", gate_inflight=5, token_delay_s=0.001) as srv:
        res = load(srv, d.TGI(), num_requests=30, max_concurrency=5)
    assert srv.stats.max_in_flight == 5  # the gate makes it reach 5; the semaphore keeps it there
    assert all(s.ok for s in res.samples) and srv.stats.received == 30


def test_warmup_requests_are_sent_first_and_not_counted():
    with FakeServer("lightllm") as srv:
        res = load(srv, d.LightLLM(), num_requests=5, warmup_requests=3)
    assert srv.stats.received == 8 and len(res.samples) == 5 and res.warmup_failed == 0
    prompts = [prompt_text(p) for p in make_prompts(8, 8, 1000, seed=0)]
    assert sorted(b["inputs"] for b in srv.stats.bodies[:3]) == sorted(prompts[:3])  # awaited before the load
    assert sorted(b["inputs"] for b in srv.stats.bodies[3:]) == sorted(prompts[3:])


def test_a_connection_idle_past_the_keepalive_is_not_reused_for_the_measured_load():
    """A warm-up's connections sit idle until the measured load starts; one reused after the
    server's keep-alive closed it fails unanswered (as on vLLM's server, 5 s). The server here
    drops a request on a connection idle longer than loadgen.KEEPALIVE_S + 0.1 s; the load
    starts KEEPALIVE_S + 0.4 s after its warm-up (its window's entry waits), so a reused
    connection would fail; none is."""
    from llmbench.serve import loadgen

    class Pause:
        def __enter__(self):
            time.sleep(loadgen.KEEPALIVE_S + 0.4)

        def __exit__(self, *exc):
            return False

    spec = LoadSpec(num_requests=4, input_len=8, output_len=4, warmup_requests=2)
    with FakeServer("openai", stale_after_s=loadgen.KEEPALIVE_S + 0.1) as srv:
        res = asyncio.run(loadgen.run_load(srv.url, VLLM, spec, model="fake", vocab_size=1000, window=Pause()))
    assert res.warmup_failed == 0 and [s.error for s in res.samples] == [""] * 4
    assert srv.stats.received == 6


def test_a_prompt_seed_draws_other_prompts_and_keeps_the_arrivals():
    """The n-th load on a shared engine (llmbench.serve.bench.EngineSession): its prompts from
    prompt_seed, its Poisson arrivals from the cell's seed, as on an engine of its own."""
    with FakeServer("lightllm") as srv:
        load(srv, d.LightLLM(), num_requests=5, warmup_requests=0, prompt_seed=3)
    assert sorted(b["inputs"] for b in srv.stats.bodies) == sorted(prompt_text(p) for p in
                                                                   make_prompts(5, 8, 1000, seed=3))
    kw = {"mode": "poisson", "rate_per_s": 5.0, "num_requests": 50, "output_len": 1}
    assert schedule(LoadSpec(**kw, prompt_seed=3)) == schedule(LoadSpec(**kw))


def test_failures_are_recorded_with_reasons_and_the_rest_succeed():
    # Arrival n: HTTP 500 when n % 4 == 0, malformed event when n % 5 == 0, dropped when n % 7 == 0.
    with FakeServer("openai", http_500_every=4, malformed_every=5, drop_every=7) as srv:
        res = load(srv, VLLM, num_requests=28)
    errors = [s.error for s in res.samples if not s.ok]
    assert sum(s.ok for s in res.samples) == 14 and len(errors) == 14
    assert sum(e.startswith("HTTP 500") and "fake overload" in e for e in errors) == 7
    assert sum("openai: event is not JSON" in e for e in errors) == 4
    dropped = [e for e in errors if not e.startswith("HTTP 500") and "not JSON" not in e]
    assert len(dropped) == 3 and all("ClientPayloadError" in e or "ended before" in e for e in dropped), dropped
    assert all(s.http_status == 500 for s in res.samples if s.error.startswith("HTTP"))
    assert summarize(res, 10)["failed"] == 14


def test_error_event_truncation_timeout_and_refused_connection():
    with FakeServer("tgi", error_event_every=2) as srv:
        res = load(srv, d.TGI(), num_requests=6)
    assert sum("Request failed during generation" in s.error for s in res.samples) == 3
    with FakeServer("lightllm", truncate_every=3) as srv:
        res = load(srv, d.LightLLM(), num_requests=6)
    assert [s.error for s in res.samples if not s.ok] == ["stream ended before the final event (2 tokens received)"] * 2
    with FakeServer("openai", token_delay_s=1.0) as srv:
        res = load(srv, VLLM, num_requests=2, request_timeout_s=0.2)
    assert all(not s.ok and s.error.startswith("timeout after 0.2") for s in res.samples)
    res = load(srv, VLLM, num_requests=2)  # the server has stopped: nothing listens
    assert all(not s.ok and s.http_status is None and "Connect" in s.error for s in res.samples)


def test_tgi_eos_shortfall_is_reported():
    with FakeServer("tgi", eos_after=6) as srv:
        res = load(srv, d.TGI(), num_requests=4)
    m = summarize(res, output_len=10)
    assert all(s.ok and s.output_tokens == 6 for s in res.samples)
    assert (m["output_shortfall_requests"], m["output_tokens_total"], m["output_tokens_expected"]) == (4, 24, 40)


def test_load_result_round_trips_through_json():
    with FakeServer("openai", tokens_per_event=2) as srv:
        res = load(srv, VLLM, num_requests=3, output_len=5)
    assert LoadResult.from_dict(json.loads(json.dumps(res.to_dict()))) == res
    with pytest.raises(ValueError, match="schema_version"):
        LoadResult.from_dict({**res.to_dict(), "schema_version": 0})


# ---- metrics on hand-made samples ----

def sample(i, ttft, e2e, out, itl=(), ok=True):
    return RequestSample(index=i, input_tokens=100, scheduled_s=0.0, queued_s=0.0, sent_s=0.01 * i, ttft_s=ttft,
                         e2e_s=e2e, itl_s=itl, event_tokens=(1,) * out, output_tokens=out, ok=ok,
                         error="" if ok else "HTTP 500: x", http_status=200 if ok else 500)


def test_summarize_on_hand_made_samples():
    samples = (sample(0, 1.0, 5.0, 5, (1.0, 1.0, 1.0, 1.0)), sample(1, 2.0, 4.0, 3, (0.5, 1.5)),
               sample(2, 3.0, 3.0, 1), sample(3, 4.0, 4.0, 1), sample(4, None, None, 0, ok=False))
    res = LoadResult(samples=samples, duration_s=10.0, started_at="2026-01-01T00:00:00+00:00", client_cpu_s=0.5,
                     client_cpu_per_request_s=0.1, send_lag_mean_s=0.02, warmup_failed=0)
    m = summarize(res, output_len=5)
    assert (m["num_requests"], m["completed"], m["failed"]) == (5, 4, 1)
    assert m["request_throughput_per_s"] == pytest.approx(0.4)
    assert m["output_tokens_per_s"] == pytest.approx(1.0) and m["total_tokens_per_s"] == pytest.approx(41.0)
    assert (m["mean_ttft_s"], m["p50_ttft_s"], m["p90_ttft_s"], m["p99_ttft_s"]) == pytest.approx((2.5, 2.5, 3.7, 3.97))
    assert (m["mean_tpot_s"], m["p50_tpot_s"]) == pytest.approx((1.0, 1.0))  # (5-1)/4 and (4-2)/2; 1-token ones out
    assert (m["mean_itl_s"], m["p50_itl_s"], m["p99_itl_s"]) == pytest.approx((1.0, 1.0, 1.475))
    assert m["p90_e2e_latency_s"] == pytest.approx(4.7)
    assert (m["output_shortfall_requests"], m["output_tokens_expected"]) == (3, 20)
    assert m["mean_send_lag_s"] == pytest.approx(0.02) and m["client_cpu_per_request_s"] == 0.1
    assert m["one_read_requests"] == 0  # the 1-token requests have no TPOT at all
    empty = summarize(LoadResult(samples=samples[4:], duration_s=1.0, started_at="", client_cpu_s=0.0,
                                 client_cpu_per_request_s=0.0, send_lag_mean_s=0.0, warmup_failed=0), 5)
    assert empty["completed"] == 0 and empty["p99_ttft_s"] is None and empty["mean_tpot_s"] is None


def test_cdf_is_exact():
    xs, fs = cdf([3.0, 1.0, 2.0, 2.0])
    assert xs == (1.0, 2.0, 2.0, 3.0) and fs == (0.25, 0.5, 0.75, 1.0)


def test_tokens_that_arrive_in_one_read_give_tpot_zero_and_are_counted():
    """An overloaded host delivers a request's whole stream in one read: TPOT is 0 by
    vLLM's definition, and the summary says how many requests that happened to."""
    samples = (sample(0, 2.0, 2.0, 4, itl=(0.0, 0.0, 0.0)), sample(1, 1.0, 4.0, 4, itl=(1.0, 1.0, 1.0)),
               sample(2, 3.0, 3.0, 4, itl=(0.0, 0.0, 0.0)))
    res = LoadResult(samples=samples, duration_s=5.0, started_at="", client_cpu_s=0.0,
                     client_cpu_per_request_s=0.0, send_lag_mean_s=0.0, warmup_failed=0)
    m = summarize(res, output_len=4)
    assert m["one_read_requests"] == 2
    assert (m["p50_tpot_s"], m["mean_tpot_s"]) == pytest.approx((0.0, 1 / 3))


def test_goodput_counts_requests_within_both_targets_over_all_measured():
    """Goodput as `vllm bench serve --goodput` counts it: a request meets the targets when it
    completed, its TTFT is within the TTFT target and its TPOT within the TPOT target; the
    share is over every measured request (a failed one misses), the rate over the load."""
    samples = (sample(0, 1.0, 5.0, 5),    # TTFT 1, TPOT 1: meets (2, 1.0), misses TPOT 0.5
               sample(1, 0.5, 1.0, 6),    # TTFT 0.5, TPOT 0.1: meets both
               sample(2, 2.5, 2.5, 1),    # one token: TPOT has no value, TTFT 2.5 misses 2
               sample(3, 2.0, 2.0, 1),    # one token at the TTFT target: meets
               sample(4, None, None, 0, ok=False))
    res = LoadResult(samples=samples, duration_s=4.0, started_at="", client_cpu_s=0.0,
                     client_cpu_per_request_s=0.0, send_lag_mean_s=0.0, warmup_failed=0)
    m = summarize(res, output_len=5, ttft_target_s=2.0, tpot_target_s=1.0)
    assert (m["goodput_requests"], m["goodput_share"], m["goodput_requests_per_s"]) == (3, 0.6, 0.75)
    assert (m["goodput_ttft_target_s"], m["goodput_tpot_target_s"]) == (2.0, 1.0)
    assert goodput(res, 2.0, 0.5)["goodput_requests"] == 2
    assert goodput(res, 0.4, 10.0)["goodput_requests"] == 0
    default = summarize(res, output_len=5)  # MLPerf's Llama-2-70B server targets
    assert (default["goodput_ttft_target_s"], default["goodput_tpot_target_s"]) == (2.0, 0.2)
    with pytest.raises(ValueError):
        goodput(res, 0.0, 1.0)
    with pytest.raises(ValueError, match="tpot_target_s"):
        LoadSpec(output_len=4, tpot_target_s=0)


# ---- load kinds: concurrency, shared prefix, ramp-up ----

@pytest.mark.parametrize("level", [3, 8])
def test_a_concurrency_load_holds_its_level(level):
    """The closed loop keeps ``level`` requests in flight: the gate holds every request until
    that many are open (so the level is reached), the limiter must keep it from going past."""
    with FakeServer("openai", gate_inflight=level, token_delay_s=0.001) as srv:
        res = load(srv, VLLM, mode="concurrency", max_concurrency=level, num_requests=4 * level, output_len=4)
    assert srv.stats.max_in_flight == level and srv.stats.received == 4 * level
    assert all(s.ok for s in res.samples) and {s.scheduled_s for s in res.samples} == {0.0}
    assert max(s.queued_s for s in res.samples) > 0  # the later requests waited for a slot


def test_goodput_is_counted_for_a_concurrency_load():
    with FakeServer("openai") as srv:
        res = load(srv, VLLM, mode="concurrency", max_concurrency=4, num_requests=12, output_len=4)
    assert summarize(res, 4, ttft_target_s=600.0, tpot_target_s=600.0)["goodput_requests"] == 12
    assert summarize(res, 4, ttft_target_s=1e-12, tpot_target_s=600.0)["goodput_requests"] == 0


def test_shared_prefix_prompts_share_exactly_the_prefix():
    prompts = make_shared_prefix_prompts(50, 16, 6, vocab_size=1000, seed=1)
    assert all(len(p) == 22 for p in prompts) and min(min(p) for p in prompts) >= 3
    assert len({tuple(p[:16]) for p in prompts}) == 1
    assert len({p[16] for p in prompts}) == 50  # every suffix is its own from its first id
    # no prefix: the prompts of before (make_prompts), so unshared loads are unchanged
    assert make_shared_prefix_prompts(50, 0, 22, 1000, seed=1) == make_prompts(50, 22, 1000, seed=1)


def test_a_shared_prefix_load_sends_the_prefix_in_every_request_warmup_included():
    with FakeServer("openai") as srv:
        res = load(srv, VLLM, num_requests=6, warmup_requests=2, input_len=12, prefix_len=9, output_len=3)
    sent = [b["prompt"] for b in srv.stats.bodies]
    assert len(sent) == 8 and all(len(p) == 12 for p in sent)
    assert len({tuple(p[:9]) for p in sent}) == 1 and len({tuple(p[9:]) for p in sent}) == 8
    assert all(s.ok and s.input_tokens == 12 for s in res.samples)


def test_a_ramp_moves_the_steady_arrivals_by_the_inverse_of_its_expected_count():
    """Rate R·t/k over the first k s: an arrival of the steady process at s lands at
    sqrt(2ks) while s <= k/2, at s + k/2 after; so the first k s get half the arrivals."""
    kw = dict(mode="poisson", num_requests=3000, output_len=1, rate_per_s=100.0, seed=5)
    steady = np.array(schedule(LoadSpec(**kw)))
    ramped = np.array(schedule(LoadSpec(**kw, ramp_up_s=10.0)))
    early = steady <= 5.0
    assert ramped[early] == pytest.approx(np.sqrt(20.0 * steady[early]))
    assert ramped[~early] == pytest.approx(steady[~early] + 5.0)
    assert (np.diff(ramped) > 0).all() and ramped[0] == 0.0
    # expected 500 of 1000 in the first 10 s (Poisson sd about 22)
    assert 400 < (ramped < 10.0).sum() < 600 and (steady < 10.0).sum() > 900
