"""Log-probabilities of tokens, for the requests that ask for them.

`SamplingParams(logprobs=k)` asks, for every output token, for its
log-probability and the k most likely tokens at that position;
`prompt_logprobs=k` asks the same for every prompt token after the first
(the first has nothing before it to be predicted from). Evaluation tools
score a model this way: lm-evaluation-harness sums a continuation's prompt
log-probabilities to rank the answers of a multiple-choice question.

The convention is vLLM V1's default (`logprobs_mode="raw_logprobs"`,
`Sampler.forward` in vllm/v1/sample/sampler.py at commit 003df29): the
model's raw logits, before temperature, top-k or top-p, normalised by
log_softmax in float32; each position gets one dict holding the chosen
token (sampled, or the prompt's own) and the k most likely tokens, so k + 1
entries, or k when the chosen token is among them.

Only the requests that ask pay: the model computes the LM head for the
rows whose logits are wanted (model_runner.StepChunk.logits_rows), and this
module runs only on those requests' rows.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from .validation import check_int

# vLLM's default cap on k (ModelConfig.max_logprobs = 20); OpenAI's API allows 0-20 too.
MAX_LOGPROBS = 20


def check_num_logprobs(name: str, value) -> int | None:
    """None (not asked), or how many top tokens to return besides the chosen one."""
    return check_int(name, value, 0, MAX_LOGPROBS, allow_none=True,
                     hint=f"None, 0 for the chosen token only, up to {MAX_LOGPROBS}")


def logprob_dicts(logits: torch.Tensor, chosen: Sequence[int], k: int) -> list[dict[int, float]]:
    """One {token_id: logprob} per row of logits [n, vocab]: the chosen token of
    that row first, then the k most likely in descending order (no duplicate)."""
    if logits.shape[0] != len(chosen):
        raise ValueError(f"chosen has {len(chosen)} tokens for {logits.shape[0]} rows of logits")
    if logits.shape[0] == 0:
        return []
    # float64 models keep float64 (the book compares against float64 references).
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logprobs = torch.log_softmax(logits.to(compute_dtype), dim=-1)                  # [n, V]
    chosen_ids = torch.as_tensor(list(chosen), dtype=torch.long, device=logits.device)
    chosen_values = logprobs.gather(1, chosen_ids[:, None])[:, 0].tolist()        # [n]
    if k:
        top = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)             # [n, k]
        top_ids, top_values = top.indices.tolist(), top.values.tolist()
    else:
        top_ids = top_values = [[] for _ in chosen_values]
    dicts = []
    for token, value, ids, values in zip(chosen, chosen_values, top_ids, top_values):
        entry = {int(token): value}
        for token_id, token_value in zip(ids, values):
            entry.setdefault(token_id, token_value)
        dicts.append(entry)
    return dicts
