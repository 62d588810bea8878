"""Every parameter of OpenAI's two text endpoints, and what this server does with it.

Three answers, none of them silent:
  supported   honoured (some values refused with a 400 that names them, e.g. n > 1)
  refused     a 400 naming the parameter, unless its value changes nothing (a no-op:
              null, 0, {}, "none"...), which is accepted
  ignored     on purpose: a hint or label for OpenAI's own bookkeeping (user,
              metadata, service_tier, prompt-cache hints), which cannot change a
              token this server makes
Names not in the tables (clients' vendor extras such as vLLM's `repetition_penalty`)
are ignored, as OpenAI-compatible servers do; the few vLLM extras this server
honours are in EXTRAS. The lists are those of the official client's `create()`
(openai 3.63: 18 for completions, 37 for chat); tests/test_serve_params.py checks
the tables cover them, that docs/serving.md shows the same table, and each row.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Param:
    name: str
    how: str                        # "supported", "refused" or "ignored"
    note: str
    noops: tuple = ()               # refused: values accepted because they change nothing
    ok: dict = field(default_factory=dict)     # fields a test sends that must be answered 200
    bad: dict | None = None         # fields a test sends that must be refused...
    bad_status: int = 400           # ...with this status

    def __post_init__(self):
        if self.how not in ("supported", "refused", "ignored"):
            raise ValueError(f"how={self.how!r}: must be supported, refused or ignored")


def _refused(name: str, note: str, noops: tuple, ok_value, bad_value) -> Param:
    return Param(name, "refused", note, noops=noops, ok={name: ok_value}, bad={name: bad_value})


def _ignored(name: str, note: str, value) -> Param:
    return Param(name, "ignored", note, ok={name: value})


_PENALTIES = [_refused(n, "no penalties in the sampler; 0 (no penalty) is accepted", (0, 0.0), 0, 0.5)
              for n in ("frequency_penalty", "presence_penalty")]
_SHARED = [
    Param("model", "supported", "the served name (GET /v1/models) or absent; another name gets 404 "
          "(type model_not_found)", ok={"model": "MODEL"}, bad={"model": "no-such-model"}, bad_status=404),
    *_PENALTIES,
    _refused("logit_bias", "no logit bias in the sampler; an empty map is accepted", ({},), {}, {"50": 100}),
    Param("n", "supported", "1 only: one choice per prompt; n > 1 is refused by name", ok={"n": 1}, bad={"n": 2}),
    Param("seed", "supported", "a per-request generator (below 2**32)", ok={"seed": 7}, bad={"seed": -1}),
    Param("stop", "supported", "a string or a list (any number, as vLLM: lm-evaluation-harness may send "
          "more than OpenAI's 4); the text ends before the first match",
          ok={"stop": ["zz"]}, bad={"stop": [""]}),
    Param("stream", "supported", "server-sent events, one chunk per token", ok={"stream": True},
          bad={"stream": "yes"}),
    Param("stream_options", "supported", "include_usage; continuous_usage_stats is accepted and usage comes "
          "once, at the end; without stream: 400 (as vLLM)",
          ok={"stream": True, "stream_options": {"include_usage": True}},
          bad={"stream_options": {"include_usage": True}}),
    Param("temperature", "supported", "0 to 2; 0 is greedy", ok={"temperature": 0.5}, bad={"temperature": 3}),
    Param("top_p", "supported", "(0, 1]", ok={"top_p": 0.9}, bad={"top_p": 0}),
    _ignored("user", "an end-user label for OpenAI's abuse monitoring", "someone"),
]

COMPLETIONS = (
    Param("prompt", "supported", "a string, a list of token ids, or a list of either (one choice per "
          "prompt, `index` in order)", ok={"prompt": ["a", "b"]}, bad={"prompt": 42}),
    _refused("best_of", "one sample per choice; best_of 1 is accepted", (1,), 1, 2),
    Param("echo", "supported", "the prompt's text (and log-probabilities) before the completion; "
          "max_tokens 0 then returns the prompt alone", ok={"echo": True, "max_tokens": 0}),
    Param("logprobs", "supported", "0 to 20: each token's log-probability and the top k "
          "(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`)", ok={"logprobs": 2}, bad={"logprobs": 21}),
    Param("max_tokens", "supported", "at least 1 (0 with echo); prompt + max_tokens past the context: 400 "
          "naming both", ok={"max_tokens": 3}, bad={"max_tokens": 10**6}),
    _refused("suffix", "no fill-in-the-middle (vLLM refuses it too); an empty suffix is accepted", ("",), "", "end"),
    *_SHARED,
)

CHAT = (
    Param("messages", "supported", "text content: a string or a list of text parts",
          ok={"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
          bad={"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    Param("logprobs", "supported", "true: each output token's log-probability in `choices[].logprobs.content`",
          ok={"logprobs": True}, bad={"logprobs": "yes"}),
    Param("top_logprobs", "supported", "0 to 20, with logprobs true: the most likely tokens at each position",
          ok={"logprobs": True, "top_logprobs": 3}, bad={"top_logprobs": 3}),
    Param("max_completion_tokens", "supported", "wins over max_tokens; past the context: 400",
          ok={"max_completion_tokens": 3}, bad={"max_completion_tokens": 10**6}),
    Param("max_tokens", "supported", "the older name of max_completion_tokens", ok={"max_tokens": 3},
          bad={"max_tokens": 0}),
    _refused("audio", "text only", (None,), None, {"voice": "alloy", "format": "wav"}),
    _refused("function_call", "no tools; 'none' is accepted", ("none",), "none", "auto"),
    _refused("functions", "no tools; an empty list is accepted", ([],), [], [{"name": "f"}]),
    _refused("modalities", "text only; ['text'] is accepted", (["text"],), ["text"], ["text", "audio"]),
    _refused("moderation", "no moderation runs here", (None,), None, {"mode": "on"}),
    _refused("prediction", "no predicted outputs", (None,), None, {"type": "content", "content": "x"}),
    _refused("reasoning_effort", "not a reasoning model", (None,), None, "low"),
    _refused("response_format", "no constrained decoding; {'type': 'text'} is accepted",
             ({"type": "text"},), {"type": "text"}, {"type": "json_object"}),
    _refused("store", "nothing is stored; false is accepted", (False,), False, True),
    _refused("tool_choice", "no tools; 'none' is accepted", ("none",), "none", "auto"),
    _refused("tools", "no tools; an empty list is accepted", ([],), [],
             [{"type": "function", "function": {"name": "f"}}]),
    _refused("verbosity", "no length control besides max_completion_tokens", (None,), None, "low"),
    _refused("web_search_options", "no web search", (None,), None, {}),
    _ignored("metadata", "tags for OpenAI's stored completions (nothing is stored here)", {"k": "v"}),
    _ignored("parallel_tool_calls", "meaningful only with tools, which are refused", True),
    _ignored("prompt_cache_key", "a routing hint: the prefix cache here matches on the tokens themselves",
             "key"),
    _ignored("prompt_cache_options", "a hint: the prefix cache here matches on the tokens themselves",
             {"mode": "implicit"}),
    _ignored("prompt_cache_retention", "a hint: the prefix cache here keeps blocks until memory is needed",
             "24h"),
    _ignored("safety_identifier", "an end-user label for OpenAI's abuse monitoring", "someone"),
    _ignored("service_tier", "one tier here", "auto"),
    *_SHARED,
)

# vLLM's extras that this server honours (clients such as vllm bench serve send them)
EXTRAS = (
    Param("ignore_eos", "supported", "vLLM's: generate past the EOS token", ok={"ignore_eos": True}),
    Param("top_k", "supported", "vLLM's: -1 or 0 mean off", ok={"top_k": 5}),
    Param("stop_token_ids", "supported", "vLLM's: stop at any of these ids", ok={"stop_token_ids": [5]}),
    Param("return_token_ids", "supported", "vLLM's: each choice carries its token ids", ok={"return_token_ids": True}),
    _refused("repetition_penalty", "vLLM's; no penalties here, 1 (none) is accepted (vllm bench serve sends it)",
             (1, 1.0), 1.0, 1.2),
    _refused("prompt_logprobs", "vLLM's; ask with echo and logprobs instead (OpenAI's way)", (None,), None, 1),
)

TABLES = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}


def first_refused(body: dict, endpoint: str) -> tuple[str, str] | None:
    """(parameter, why) for the first refused parameter set to something other than a
    no-op, else None. Supported parameters are checked where they are read."""
    for param in (*TABLES[endpoint], *EXTRAS):
        if param.how != "refused" or body.get(param.name) is None:
            continue
        value = body[param.name]
        if not any(_same(value, noop) for noop in param.noops):
            allowed = " or ".join(repr(n) for n in param.noops if n is not None) or "null"
            return param.name, (f"{value!r} is not supported here ({param.note}); "
                                f"leave it out or send {allowed}")
    return None


def _same(value, noop) -> bool:
    """value == noop, where true/false are not numbers (store: false is a no-op, 0 is not)."""
    if isinstance(value, bool) or isinstance(noop, bool):
        return value is noop
    return value == noop


def markdown_table(endpoint_or_params) -> str:
    """The table docs/serving.md shows for an endpoint, or for EXTRAS (a test keeps
    the two the same)."""
    params = TABLES[endpoint_or_params] if isinstance(endpoint_or_params, str) else endpoint_or_params
    rows = ["| parameter | here | what happens |", "|---|---|---|"]
    rows += [f"| `{p.name}` | {p.how} | {p.note} |" for p in params]
    return "\n".join(rows)
