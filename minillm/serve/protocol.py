"""The OpenAI wire format: request bodies in, SSE chunks and error bodies out.

Pure functions over dicts, no HTTP and no engine, so each rule is testable
alone. What a benchmark client sends and expects was read in:
  vLLM 0.33  vllm/benchmarks/lib/endpoint_request_func.py (sends
             `repetition_penalty`, `logprobs: null`, `ignore_eos`,
             `max_completion_tokens`, `stream_options.include_usage`; TTFT is the
             first chunk whose `choices` is not empty, even with empty text)
  guidellm   src/guidellm/backends/openai/request_handlers.py
  openai     the official client: raises on an `error` key in a chunk; retries
             408/409/429/5xx twice, so a refusal must be fast.
Unknown fields are ignored, as OpenAI-compatible servers do.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..request import MAX_SEED, SamplingParams


class APIError(Exception):
    """An HTTP error in the OpenAI shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code if self.code is not None else str(self.status)}}


def bad_request(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


@dataclass
class GenerationRequest:
    """A parsed request: what the engine runs and how the answer is shaped."""
    kind: str                              # "completion" or "chat"
    model: str
    prompt_token_ids: list[int]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    stop_strings: list[str] = field(default_factory=list)
    return_token_ids: bool = False         # our extension: each choice also carries its token ids
    request_id: str = ""

    def __post_init__(self):
        prefix = "cmpl" if self.kind == "completion" else "chatcmpl"
        self.request_id = self.request_id or f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())


def parse_json(raw: bytes) -> dict:
    """The body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"body: malformed JSON ({e})", param="body") from None
    if not isinstance(body, dict):
        raise APIError(400, f"body: must be a JSON object, got {type(body).__name__}", param="body")
    return body


# ---- field checks: each names the field, its value and what is allowed --------------
def _int(body: dict, name: str, default, minimum: int | None = None, maximum: int | None = None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(name, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise bad_request(name, f"must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise bad_request(name, f"must be at most {maximum}, got {value}")
    return value


def _number(body: dict, name: str, default: float, minimum: float, maximum: float | None = None,
            exclusive_minimum: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(name, f"must be a number, got {value!r}")
    if value < minimum or (exclusive_minimum and value == minimum) or (maximum is not None and value > maximum):
        bounds = f"{'>' if exclusive_minimum else '>='} {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise bad_request(name, f"must be {bounds}, got {value}")
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(name, f"must be true or false, got {value!r}")
    return value


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise bad_request("stop", f"must be a non-empty string or a list of up to 4, got {stop!r}")
    return stop


def sampling_params(body: dict, max_model_len: int, prompt_len: int, default_max_tokens: int) -> SamplingParams:
    """vLLM's defaults: max_tokens=None means "up to the context"; we cap it at default_max_tokens."""
    # the chat API's newer name wins over the old one, as in OpenAI's server
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, None, minimum=1)
    room = max_model_len - prompt_len
    if max_tokens is None:
        max_tokens = max(1, min(default_max_tokens, room))
    n = _int(body, "n", 1)
    if n != 1:
        raise bad_request("n", f"must be 1 (one choice per request), got {n}")
    top_k = _int(body, "top_k", None)
    if top_k is not None and top_k <= 0:          # vLLM: -1 or 0 mean "off"
        top_k = None
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and (not isinstance(stop_ids, list)
                                 or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                            for t in stop_ids)):
        raise bad_request("stop_token_ids", f"must be a list of token ids, got {stop_ids!r}")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, exclusive_minimum=True),
        top_k=top_k,
        seed=_int(body, "seed", None, minimum=0, maximum=MAX_SEED),
        stop_token_ids=stop_ids,
        ignore_eos=_bool(body, "ignore_eos", False),
    )


def _check_length(param: str, prompt_len: int, max_model_len: int) -> None:
    if prompt_len == 0:
        raise bad_request(param, "the prompt is empty")
    if prompt_len >= max_model_len:
        raise APIError(400, f"{param}: the prompt has {prompt_len} tokens; this model's context is "
                       f"{max_model_len} tokens, so a prompt may have at most {max_model_len - 1}",
                       param=param, code="context_length_exceeded")


def _model(body: dict) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", f"must be a string, got {model!r}")
    return model or ""


def _stream_options(body: dict) -> bool:
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("stream_options", f"must be an object, got {options!r}")
    # continuous_usage_stats (vLLM) is ignored: usage comes once, at the end
    return stream and _bool(options, "include_usage", False)


def parse_completion(body: dict, tokenizer, max_model_len: int, default_max_tokens: int = 256) -> GenerationRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                 # a batch of one, as some clients send
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        vocab = getattr(tokenizer, "vocab_size", None) or 2**31
        if any(t < 0 or t >= vocab for t in prompt):
            raise bad_request("prompt", f"token ids must be in [0, {vocab})")
        ids = list(prompt)
    else:
        raise bad_request("prompt", f"must be a string or a list of token ids, got {type(prompt).__name__}")
    _check_length("prompt", len(ids), max_model_len)
    return GenerationRequest("completion", _model(body), ids,
                             sampling_params(body, max_model_len, len(ids), default_max_tokens),
                             stream=_bool(body, "stream", False), include_usage=_stream_options(body),
                             stop_strings=_stop(body), return_token_ids=_bool(body, "return_token_ids", False))


def message_text(content, index: int) -> str:
    """A message's content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise bad_request(f"messages[{index}].content",
                                  f"parts must be {{'type': 'text', 'text': ...}} (text only), got {part!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{index}].content", f"must be a string or a list of text parts, got {content!r}")


# For a tokenizer without a chat template (the tiny byte model): ChatML's shape.
FALLBACK_TEMPLATE = "{role}: {content}\n"


def render_chat(messages, tokenizer) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", f"must be a non-empty list of messages, got {messages!r}")
    plain = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}]", f"must be an object with a 'role' string, got {m!r}")
        plain.append({"role": m["role"], "content": message_text(m.get("content"), i)})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(plain, add_generation_prompt=True)
    text = "".join(FALLBACK_TEMPLATE.format(**m) for m in plain) + "assistant: "
    return tokenizer.encode(text)


def parse_chat(body: dict, tokenizer, max_model_len: int, default_max_tokens: int = 256) -> GenerationRequest:
    ids = render_chat(body.get("messages"), tokenizer)
    _check_length("messages", len(ids), max_model_len)
    return GenerationRequest("chat", _model(body), ids,
                             sampling_params(body, max_model_len, len(ids), default_max_tokens),
                             stream=_bool(body, "stream", False), include_usage=_stream_options(body),
                             stop_strings=_stop(body), return_token_ids=_bool(body, "return_token_ids", False))


# ---- answers ---------------------------------------------------------------------
def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_chunk(req: GenerationRequest, text: str, finish_reason: str | None, first: bool,
                 token_ids: list[int] = ()) -> dict:
    """One SSE chunk carrying new text. The chat API's first chunk names the role
    in the same delta as the first token's text: no role-only chunk before the
    prompt is done, so a client's first chunk IS its first token."""
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    if req.return_token_ids:
        choice["token_ids"] = list(token_ids)
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [choice]}


def usage_chunk(req: GenerationRequest, completion_tokens: int) -> dict:
    obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model, "choices": [],
            "usage": usage(len(req.prompt_token_ids), completion_tokens)}


def full_response(req: GenerationRequest, text: str, finish_reason: str, completion_tokens: int,
                  token_ids: list[int] = ()) -> dict:
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    if req.return_token_ids:
        choice["token_ids"] = list(token_ids)
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [choice], "usage": usage(len(req.prompt_token_ids), completion_tokens)}


def openai_finish_reason(engine_reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words: eos and stop are both "stop"."""
    return {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}.get(engine_reason, engine_reason)


def sse(payload) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
