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
Every OpenAI parameter is supported, refused with a 400, or ignored on purpose:
openai_params.py holds the table (docs/serving.md shows it). Other fields, clients'
vendor extras, are ignored, as OpenAI-compatible servers do.

Errors follow vLLM's body (create_error_response in
vllm/frontend/entrypoints/serve/exception_handling/error_response.py at commit
055e47c28003156421365af985d676fc921cb075): `code` is the HTTP status, an int. Where
OpenAI names the error (model_not_found, context_length_exceeded) that name is the
`type`; otherwise the type is OpenAI's class (invalid_request_error...).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from ..logprobs import MAX_LOGPROBS
from ..request import MAX_SEED, SamplingParams
from .openai_params import first_refused


class APIError(Exception):
    """An HTTP error in the OpenAI shape: {"error": {"message", "type", "param", "code"}},
    code the HTTP status as an int (vLLM's)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 type_: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.type = status, message, param, type_

    @property
    def code(self) -> int:
        return self.status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


def bad_request(param: str, message: str) -> APIError:
    return APIError(400, f"{param}: {message}", param=param)


def check_model(body: dict, served_name: str) -> None:
    """vLLM's _check_model (vllm/frontend/entrypoints/serve/engine/serving.py at commit
    055e47c2): no model, or the served name; any other name is a 404."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", f"must be a string, got {model!r}")
    if model and model != served_name:
        raise APIError(404, f"model: the model `{model}` does not exist; this server serves `{served_name}` "
                       "(GET /v1/models)", param="model", type_="model_not_found")


@dataclass
class GenerationRequest:
    """A parsed request: what the engine runs (one engine request per prompt) and how
    the answer is shaped (one choice per prompt, `index` in order)."""
    kind: str                              # "completion" or "chat"
    model: str
    prompts: list[list[int]]               # token ids of each prompt (chat: one)
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    stop_strings: list[str] = field(default_factory=list)
    return_token_ids: bool = False         # vLLM's extension: each choice also carries its token ids
    echo: bool = False                     # completions: the prompt's text (and logprobs) come first
    prompt_texts: list[str] = field(default_factory=list)   # what echo writes, per prompt
    echo_only: bool = False                # echo with max_tokens 0: the prompt alone (see parse_completion)
    top_logprobs: int | None = None        # alternatives per token in the answer; None: no logprobs
    request_id: str = ""

    def __post_init__(self):
        prefix = "cmpl" if self.kind == "completion" else "chatcmpl"
        self.request_id = self.request_id or f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    @property
    def prompt_token_ids(self) -> list[int]:
        """The first (for chat, the only) prompt."""
        return self.prompts[0]


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
    # no cap on their number, as vLLM: lm-evaluation-harness sends a task's stop strings
    # and the EOS text, which can be more than OpenAI's 4
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise bad_request("stop", f"must be a non-empty string or a list of them, got {stop!r}")
    return stop


def max_tokens_for(body: dict, max_model_len: int, prompt_len: int, default_max_tokens: int,
                   minimum: int = 1) -> int:
    """The request's max_tokens (the chat API's newer name wins, as in OpenAI's server):
    the default capped by the room the context leaves, or the number asked, which must
    fit: prompt + max_tokens past the context is a 400 naming the numbers (OpenAI and
    vLLM refuse it: vLLM's TokenizeParams, vllm/renderers/params.py at commit
    017638d70159114c71e4c28cc95f54c3f7699079)."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name, None, minimum=minimum)
    room = max_model_len - prompt_len
    if max_tokens is None:
        return max(1, min(default_max_tokens, room))
    if max_tokens > room:
        raise bad_request(name, f"{max_tokens} tokens do not fit: the prompt has {prompt_len} tokens and this "
                          f"model's context is {max_model_len}, so at most {room} can follow it "
                          f"({prompt_len} + {max_tokens} > {max_model_len})")
    return max_tokens


def sampling_params(body: dict, max_tokens: int, logprobs: int | None = None,
                    prompt_logprobs: int | None = None) -> SamplingParams:
    n = _int(body, "n", 1)
    if n != 1:
        raise bad_request("n", f"must be 1 (one choice per prompt; send several prompts instead), got {n}")
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
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


def _check_length(param: str, prompt_len: int, max_model_len: int) -> None:
    if prompt_len == 0:
        raise bad_request(param, "the prompt is empty")
    if prompt_len >= max_model_len:
        raise APIError(400, f"{param}: the prompt has {prompt_len} tokens; this model's context is "
                       f"{max_model_len} tokens, so a prompt may have at most {max_model_len - 1}",
                       param=param.split("[")[0], type_="context_length_exceeded")


def _stream_options(body: dict, stream: bool) -> bool:
    """include_usage. stream_options without stream is a 400, as vLLM's
    validate_stream_options (vllm/entrypoints/openai/completion/protocol.py at commit
    002032ee2b18e1f7bd924ec47b62504ba3866063)."""
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("stream_options", f"must be an object, got {options!r}")
    if options and not stream:
        raise bad_request("stream_options", "is allowed only with stream: true")
    # continuous_usage_stats (vLLM) is accepted: usage comes once, at the end
    return stream and _bool(options, "include_usage", False)


def _refuse_unsupported(body: dict, endpoint: str) -> None:
    refused = first_refused(body, endpoint)
    if refused is not None:
        raise bad_request(*refused)


def _is_token_list(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value)


def completion_prompts(prompt, tokenizer) -> list[tuple[list[int], str]]:
    """(token ids, text) per prompt. A prompt is a string or a list of token ids; a
    list of either is a batch (one choice each). The text of token ids is their
    decode, special tokens kept (what echo writes)."""
    if isinstance(prompt, str) or _is_token_list(prompt):
        prompt = [prompt]
    elif not isinstance(prompt, list) or not prompt:
        raise bad_request("prompt", "must be a string, a list of token ids, or a non-empty list of either, "
                          f"got {prompt!r:.60}")
    vocab = getattr(tokenizer, "vocab_size", None) or 2**31
    out = []
    for i, one in enumerate(prompt):
        where = "prompt" if len(prompt) == 1 else f"prompt[{i}]"
        if isinstance(one, str):
            out.append((tokenizer.encode(one), one))
        elif _is_token_list(one):
            if any(t < 0 or t >= vocab for t in one):
                raise APIError(400, f"{where}: token ids must be in [0, {vocab})", param="prompt")
            out.append((list(one), tokenizer.decode(one, skip_special_tokens=False)))
        else:
            raise APIError(400, f"{where}: must be a string or a non-empty list of token ids, got {one!r:.60}",
                           param="prompt")
    return out


def parse_completion(body: dict, tokenizer, max_model_len: int, default_max_tokens: int = 256) -> GenerationRequest:
    """A completion request. echo with max_tokens 0 is served as vLLM serves it
    (CompletionRequest.to_sampling_params and request_output_to_completion_response,
    vllm/entrypoints/openai/completion/ at commits 002032ee and 030ea52e): the engine
    runs max_tokens=1, the answer holds the prompt alone, and usage counts the one
    token computed. prompt_logprobs follow logprobs when echo is set (vLLM's rule)."""
    _refuse_unsupported(body, "/v1/completions")
    prompts = completion_prompts(body.get("prompt"), tokenizer)
    for i, (ids, _) in enumerate(prompts):
        _check_length("prompt" if len(prompts) == 1 else f"prompt[{i}]", len(ids), max_model_len)
    echo = _bool(body, "echo", False)
    longest = max(len(ids) for ids, _ in prompts)
    max_tokens = max_tokens_for(body, max_model_len, longest, default_max_tokens, minimum=0)
    if max_tokens == 0 and not echo:
        raise bad_request("max_tokens", "must be at least 1, got 0 (0 is allowed with echo: true, which "
                          "returns the prompt and its log-probabilities alone)")
    logprobs = _int(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        "completion", _model(body), [ids for ids, _ in prompts],
        sampling_params(body, max(1, max_tokens), logprobs, logprobs if echo else None),
        stream=stream, include_usage=_stream_options(body, stream), stop_strings=_stop(body),
        return_token_ids=_bool(body, "return_token_ids", False), echo=echo,
        prompt_texts=[text for _, text in prompts], echo_only=echo and max_tokens == 0, top_logprobs=logprobs)


def _model(body: dict) -> str:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("model", f"must be a string, got {model!r}")
    return model or ""


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
    _refuse_unsupported(body, "/v1/chat/completions")
    ids = render_chat(body.get("messages"), tokenizer)
    _check_length("messages", len(ids), max_model_len)
    # logprobs: true asks; top_logprobs says how many alternatives, and needs it (vLLM's
    # check_logprobs, vllm/entrypoints/openai/chat_completion/protocol.py)
    wanted = _bool(body, "logprobs", False)
    top = _int(body, "top_logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
    if top and not wanted:
        raise bad_request("top_logprobs", f"{top} needs logprobs: true")
    k = (top or 0) if wanted else None
    stream = _bool(body, "stream", False)
    return GenerationRequest(
        "chat", _model(body), [ids],
        sampling_params(body, max_tokens_for(body, max_model_len, len(ids), default_max_tokens), k),
        stream=stream, include_usage=_stream_options(body, stream), stop_strings=_stop(body),
        return_token_ids=_bool(body, "return_token_ids", False), top_logprobs=k)


# ---- answers ---------------------------------------------------------------------
@dataclass
class ChoiceDelta:
    """What one engine event (streaming) or the whole answer adds to one choice."""
    index: int
    text: str
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: dict | None = None           # in the endpoint's shape (openai_logprobs.py)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_chunk(req: GenerationRequest, delta: ChoiceDelta, first: bool) -> dict:
    """One SSE chunk carrying new text. The chat API's first chunk names the role
    in the same delta as the first token's text: no role-only chunk before the
    prompt is done, so a client's first chunk IS its first token."""
    if req.kind == "completion":
        choice = {"index": delta.index, "text": delta.text, "logprobs": delta.logprobs,
                  "finish_reason": delta.finish_reason}
        obj = "text_completion"
    else:
        message = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
        choice = {"index": delta.index, "delta": message, "logprobs": delta.logprobs,
                  "finish_reason": delta.finish_reason}
        obj = "chat.completion.chunk"
    if req.return_token_ids:
        choice["token_ids"] = list(delta.token_ids)
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model,
            "choices": [choice]}


def usage_chunk(req: GenerationRequest, completion_tokens: int) -> dict:
    obj = "text_completion" if req.kind == "completion" else "chat.completion.chunk"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model, "choices": [],
            "usage": usage(sum(map(len, req.prompts)), completion_tokens)}


def full_response(req: GenerationRequest, choices: list[ChoiceDelta], completion_tokens: int) -> dict:
    out = []
    for c in choices:
        if req.kind == "completion":
            choice = {"index": c.index, "text": c.text, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
        else:
            choice = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                      "logprobs": c.logprobs, "finish_reason": c.finish_reason}
        if req.return_token_ids:
            choice["token_ids"] = list(c.token_ids)
        out.append(choice)
    obj = "text_completion" if req.kind == "completion" else "chat.completion"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model,
            "choices": out, "usage": usage(sum(map(len, req.prompts)), completion_tokens)}


def openai_finish_reason(engine_reason: str | None) -> str | None:
    """The engine's reasons in OpenAI's words: eos and stop are both "stop"."""
    return {"eos": "stop", "stop": "stop", "length": "length", "abort": "abort"}.get(engine_reason, engine_reason)


def sse(payload) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
