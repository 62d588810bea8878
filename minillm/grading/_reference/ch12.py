"""Reference answers for exercises/12_speculative_decoding (teacher only: the public
checkers never import this module; tests and the hidden cases do)."""
from __future__ import annotations

import math

import torch


def verify_packed_step(logits, query_lens, drafts):
    """Greedy verification of every request of a packed step (see the exercise)."""
    emitted, start = [], 0
    for n, request_drafts in zip(query_lens, drafts):
        rows = logits[start:start + n]
        start += n
        if request_drafts is None:                     # a chunk in the middle of a prompt
            emitted.append([])
            continue
        targets = rows[n - 1 - len(request_drafts):].argmax(dim=-1).tolist()
        out = []
        for draft, target in zip(request_drafts, targets):
            out.append(target)
            if target != draft:
                break
        else:
            out.append(targets[len(request_drafts)])
        emitted.append(out)
    return emitted


def plan_step(stream_drafts, prompt_left, token_budget, chunk_size):
    """vLLM V1's order, every stream keeping its own token: (drafts per stream, chunk)."""
    left = token_budget - len(stream_drafts)
    scheduled = []
    for available in stream_drafts:
        take = max(0, min(available, left))
        scheduled.append(take)
        left -= take
    return scheduled, max(0, min(chunk_size, prompt_left, left))


def predict_long_prompt_steps(prompt_len, num_streams, k, token_budget, chunk_size, draft_budget):
    """Steps from the prompt's arrival to its first token while every stream verifies k drafts."""
    if draft_budget == "drafts_first":
        chunk = min(chunk_size, token_budget - num_streams * (1 + k))
    else:                                  # "chunk_first": the chunk before any draft
        chunk = min(chunk_size, token_budget - num_streams)
    return math.inf if chunk <= 0 else math.ceil(prompt_len / chunk)


def speculative_sample(probs, drafts, generator):
    """Rejection sampling with point-mass drafts (accept with p(d), else sample p without d)."""
    out = []
    for i, draft in enumerate(drafts):
        p = probs[i]
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[draft]):
            out.append(int(draft))
            continue
        residual = p.clone()
        residual[draft] = 0
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out


def best_k(alpha, step_time_s, max_k):
    """The k in 0..max_k with the most expected tokens per second of verification steps."""
    def rate(k):
        tokens = k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
        return tokens / step_time_s(k)
    return max(range(max_k + 1), key=lambda k: (rate(k), -k))
