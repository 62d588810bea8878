"""The engine's log-probabilities ({token_id: logprob} per position, the chosen token
first, then the top k: minillm/logprobs.py) in the two shapes OpenAI's API uses.

/v1/completions, the legacy shape (what lm-evaluation-harness reads):
    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}, ...],
     "text_offset": [...]}
  one entry per token; a position with nothing to be predicted from (a prompt's
  first token, echoed) has None in token_logprobs and top_logprobs. top_logprobs
  holds the chosen token and the k most likely (k + 1 entries, or k when the chosen
  one is among them), keyed by their text; text_offset is where each token's text
  starts in the choice's text. As vLLM writes it: OpenAIServingCompletion.
  _create_completion_logprobs, vllm/entrypoints/openai/completion/serving.py at commit
  030ea52effcb05071543c8c42b8f0145e94cee43.
/v1/chat/completions: {"content": [{"token", "logprob", "bytes", "top_logprobs":
  [{"token", "logprob", "bytes"}, ...]}, ...]}, top_logprobs the k most likely
  tokens in descending order (OpenAI's meaning: the chosen token appears there only
  if it is among them).
Both clamp a logprob at -9999.0, the number OpenAI and vLLM send for -inf (JSON has
no infinity). A token's text is its own decode, so a token that holds half a UTF-8
character reads as U+FFFD, as in vLLM; `bytes` is that text's UTF-8.
"""
from __future__ import annotations

MIN_LOGPROB = -9999.0


def token_text(tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def completion_logprobs(token_ids, entries, tokenizer, first_offset: int = 0) -> dict:
    """The legacy shape for these tokens; entries[i] is token_ids[i]'s dict, or None."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = first_offset
    for token_id, entry in zip(token_ids, entries, strict=True):
        text = token_text(tokenizer, token_id)
        out["tokens"].append(text)
        out["text_offset"].append(offset)
        offset += len(text)
        if entry is None:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        out["token_logprobs"].append(_clamp(entry[token_id]))
        top: dict[str, float] = {}
        for other_id, logprob in entry.items():        # the chosen token first: two ids with
            top.setdefault(token_text(tokenizer, other_id), _clamp(logprob))   # one text keep its
        out["top_logprobs"].append(top)
    return out


def _chat_entry(text: str, logprob: float) -> dict:
    return {"token": text, "logprob": _clamp(logprob), "bytes": list(text.encode("utf-8", errors="replace"))}


def chat_logprobs(token_ids, entries, top_k: int, tokenizer) -> list[dict]:
    """`logprobs.content` items for these output tokens."""
    content = []
    for token_id, entry in zip(token_ids, entries, strict=True):
        item = _chat_entry(token_text(tokenizer, token_id), entry[token_id])
        ranked = sorted(entry.items(), key=lambda kv: -kv[1])[:top_k]
        item["top_logprobs"] = [_chat_entry(token_text(tokenizer, t), lp) for t, lp in ranked]
        content.append(item)
    return content
