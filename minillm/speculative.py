"""Speculative decoding: guess a few tokens cheaply, check them all in one step.

A decode reads every weight of the model to produce one token. If something
cheap could guess the next k tokens, one forward pass over the pending token
and the k guesses (a chunk of 1 + k tokens over the request's cache: the
engine's step already runs such chunks) gives the target model's logits at
all k + 1 positions, and every guess that agrees with the model is a token
gained for the price of one step. Leviathan et al. (2023, "Fast Inference
from Transformers via Speculative Decoding") and Chen et al. (2023,
"Accelerating Large Language Model Decoding with Speculative Sampling").

The guesser here is prompt lookup (vLLM's `ngram` method): find the longest
n-gram (prompt_lookup_min <= n <= prompt_lookup_max) that ends the request's
tokens and occurs earlier in them, and propose the tokens that followed it.
It costs no model, and it works where the output copies its input (quoting,
summarising, editing a given text).

Three rules keep the output exactly what the model alone would produce:
  greedy       accept draft i while it equals the argmax of row i; at the
               first mismatch emit the argmax instead; if all k agree, row k
               gives one more token (the "bonus"). Every step emits 1 + accepted.
  sampling     rejection sampling (Leviathan et al., Algorithm 1): accept
               draft d with probability min(1, p(d) / q(d)); on a rejection
               sample from the residual max(0, p - q), renormalised. For an
               n-gram draft q is a point mass on d, so the rule is "accept with
               probability p(d), else sample from p with d removed": exactly
               the distribution of sampling p and keeping the sample.
  the KV cache a verification writes K and V for all 1 + k positions; only
               1 + accepted of them become computed tokens. The rest are
               released (blocks past the kept tokens go back to the pool) or
               overwritten by the next step, and never named in the prefix
               cache, which names only computed blocks.

The scheduler (scheduler.py) asks `Speculator.propose` for each decode's
drafts; they count against token_budget like any other token (vLLM V1's
`num_tokens_with_spec`, vllm/v1/core/sched/scheduler.py). The executor
verifies (`verify`), and the engine keeps 1 + accepted tokens
(`num_computed_after`) and records (drafted, accepted) per request in
its trace (StepRecord.spec).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import torch

from .request import SamplingParams
from .sampler import sampling_probs
from .validation import check_choice, check_int

SPEC_METHODS = ("ngram",)
# Where a step's drafts stand when token_budget runs short (SpeculativeConfig.draft_budget):
#   "drafts_first"  vLLM V1: the running requests, drafts included, are scheduled before the
#                   waiting ones, so a prompt's chunk gets what the drafts leave and shrinks.
#   "chunk_first"   the drafts get what the prompt's chunk leaves: the chunk keeps its size and
#                   the drafts are cut. (SGLang's answer is a third one: with speculation it turns
#                   mixed chunks off, so drafts and chunks never share a step: policy
#                   "chunked_prefill_first".)
DRAFT_BUDGETS = ("drafts_first", "chunk_first")
# vLLM's defaults when neither lookup bound is given (vllm/config/speculative.py,
# SpeculativeConfig.__post_init__, commit f19b16d: "arbitrarily chosen").
DEFAULT_PROMPT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `--speculative-config` for the ngram method, plus where drafts stand in the budget.

    num_speculative_tokens: drafts per verification, k (0: speculation off, every
    step a plain decode). prompt_lookup_min / prompt_lookup_max: the n-gram sizes
    tried; as in vLLM, both None means 5 and 5, and one None takes the other's value.
    draft_budget: one of DRAFT_BUDGETS.
    """
    method: str = "ngram"
    num_speculative_tokens: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    draft_budget: str = "drafts_first"

    def __post_init__(self):
        check_choice("method", self.method, SPEC_METHODS,
                     hint="'ngram' (prompt lookup); minillm has no draft model")
        if self.num_speculative_tokens is None:
            raise ValueError("num_speculative_tokens=None: give the number of draft tokens per step "
                             "(vLLM requires it too; try 4)")
        k = check_int("num_speculative_tokens", self.num_speculative_tokens, 0, hint="4, or 0 for off")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = DEFAULT_PROMPT_LOOKUP
        low = check_int("prompt_lookup_min", high if low is None else low, 1, hint="1 or 2")
        high = check_int("prompt_lookup_max", low if high is None else high, 1, hint="3 or 5")
        if low > high:
            raise ValueError(f"prompt_lookup_min={low} > prompt_lookup_max={high}: the smallest n-gram "
                             "tried must not be longer than the largest (try prompt_lookup_min=1, "
                             "prompt_lookup_max=3)")
        check_choice("draft_budget", self.draft_budget, DRAFT_BUDGETS)
        for name, value in (("num_speculative_tokens", k), ("prompt_lookup_min", low),
                            ("prompt_lookup_max", high)):
            object.__setattr__(self, name, value)

    @classmethod
    def from_dict(cls, config) -> "SpeculativeConfig":
        """From vLLM's JSON keys (`--speculative-config '{"method": "ngram", ...}'`); an
        unknown key is refused by name rather than ignored."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative config {config!r}: must be a JSON object such as "
                             '{"method": "ngram", "num_speculative_tokens": 4}')
        known = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "draft_budget")
        unknown = sorted(set(config) - set(known))
        if unknown:
            raise ValueError(f"speculative config key {unknown[0]!r}: minillm knows {known}")
        return cls(**config)


# ---------------------------------------------------------------------------
# The drafter: prompt lookup
# ---------------------------------------------------------------------------
def _earliest_occurrence(haystack: bytes, needle: bytes, end_byte: int, itemsize: int) -> int:
    """The first token index where needle's tokens occur in haystack[:end_byte], or -1.
    bytes.find runs in C; a hit that straddles two tokens is skipped."""
    start = 0
    while True:
        at = haystack.find(needle, start, end_byte)
        if at < 0:
            return -1
        if at % itemsize == 0:
            return at // itemsize
        start = at + 1


def ngram_propose(token_ids, prompt_lookup_min: int, prompt_lookup_max: int, num_tokens: int) -> list[int]:
    """Prompt lookup, as vLLM's ngram proposer chooses (vllm/v1/spec_decode/ngram_proposer.py,
    `_find_longest_matched_ngram_and_propose_tokens`, commit adce4e9): the longest n in
    [prompt_lookup_min, prompt_lookup_max] whose last-n-token suffix occurs earlier in
    token_ids (occurrences may overlap the suffix), its earliest occurrence among equals,
    and then up to num_tokens of the tokens that followed it ([] when none matches)."""
    total = len(token_ids)
    if num_tokens <= 0 or total < prompt_lookup_min + 1:
        return []
    tokens = array("i", token_ids)           # vocabularies fit in 32 bits
    haystack = tokens.tobytes()
    end_byte = (total - 1) * tokens.itemsize   # an occurrence must leave one token after it
    for n in range(min(prompt_lookup_max, total - 1), prompt_lookup_min - 1, -1):
        start = _earliest_occurrence(haystack, haystack[(total - n) * tokens.itemsize:], end_byte, tokens.itemsize)
        if start >= 0:
            return list(token_ids[start + n:start + n + num_tokens])
    return []


def max_drafts(request, num_speculative_tokens: int, max_model_len: int | None) -> int:
    """The most drafts worth verifying for request now: k, but no more than its
    remaining max_tokens can emit (a verification emits up to 1 + drafts) and no
    position past the model's context."""
    limit = min(num_speculative_tokens, request.params.max_tokens - len(request.output_token_ids) - 1)
    if max_model_len is not None:
        limit = min(limit, max_model_len - request.num_tokens)
    return max(0, limit)


class Speculator:
    """What the scheduler asks for drafts: prompt lookup over the request's own tokens."""

    def __init__(self, config: SpeculativeConfig):
        if not isinstance(config, SpeculativeConfig):
            raise ValueError(f"speculative={config!r}: give a SpeculativeConfig, e.g. "
                             "SpeculativeConfig(method='ngram', num_speculative_tokens=4)")
        self.config = config

    @property
    def draft_budget(self) -> str:
        return self.config.draft_budget

    def max_drafts(self, request, max_model_len: int | None) -> int:
        return max_drafts(request, self.config.num_speculative_tokens, max_model_len)

    def propose(self, request, max_num_tokens: int) -> list[int]:
        """At most max_num_tokens draft tokens to follow the request's tokens."""
        if max_num_tokens <= 0 or request.prompt_token_ids is None:
            return []
        return ngram_propose(request.token_ids(0, request.num_tokens), self.config.prompt_lookup_min,
                             self.config.prompt_lookup_max, max_num_tokens)


# ---------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------
def verify_greedy(logits: torch.Tensor, draft_token_ids: list[int]) -> list[int]:
    """logits [1 + k, vocab] (row i predicts the token after draft i - 1) -> the tokens
    greedy decoding emits: the drafts up to the first that is not the argmax, then the
    argmax there; after k agreeing drafts, row k's argmax (the bonus token)."""
    targets = torch.argmax(logits, dim=-1).tolist()           # [1 + k]
    emitted = []
    for draft, target in zip(draft_token_ids, targets):
        emitted.append(target)
        if target != draft:
            return emitted
    emitted.append(targets[len(draft_token_ids)])
    return emitted


def rejection_sample(target_probs: torch.Tensor, draft_token_ids: list[int], generator,
                     draft_probs: torch.Tensor | None = None) -> list[int]:
    """Leviathan et al.'s speculative sampling for one request.

    target_probs [1 + k, vocab]: the target's sampling distribution at each row (after
    temperature, top-k, top-p). draft_probs [k, vocab]: the drafter's, or None for a
    point mass on each draft (prompt lookup). Accept draft i with probability
    min(1, p(d) / q(d)); at the first rejection emit a sample of the residual
    max(0, p - q) renormalised and stop; after k acceptances, a sample of row k.
    The emitted tokens are distributed exactly as sampling the target token by token."""
    emitted = []
    for i, draft in enumerate(draft_token_ids):
        p = target_probs[i]
        q = torch.zeros_like(p) if draft_probs is None else draft_probs[i].to(p.dtype)
        if draft_probs is None:
            q[draft] = 1.0
        accept_probability = min(1.0, float(p[draft] / q[draft])) if q[draft] > 0 else 0.0
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < accept_probability:
            emitted.append(int(draft))
            continue
        residual = torch.clamp(p - q, min=0)
        if residual.sum() <= 0:          # p == q: a rejection has probability 0; sample p itself
            residual = p
        emitted.append(int(torch.multinomial(residual.cpu(), 1, generator=generator)))
        return emitted
    emitted.append(int(torch.multinomial(target_probs[len(draft_token_ids)].cpu(), 1, generator=generator)))
    return emitted


def verify(logits: torch.Tensor, draft_token_ids: list[int], params: SamplingParams, generator) -> list[int]:
    """The tokens one verification emits (1 + accepted drafts), greedy or sampled."""
    if params.temperature == 0:
        return verify_greedy(logits, draft_token_ids)
    probs = torch.stack([sampling_probs(row.float(), params) for row in logits])     # [1 + k, vocab]
    probs = probs / probs.sum(dim=-1, keepdim=True)         # top-k / top-p leave the mass short of 1
    return rejection_sample(probs, draft_token_ids, generator)


def num_computed_after(num_computed: int, num_scheduled: int, num_drafts: int, num_emitted: int) -> int:
    """A request's computed tokens after a step that ran num_scheduled tokens, num_drafts
    of them drafts, and emitted num_emitted: the rejected drafts' K and V were written
    but are not the request's tokens, so they do not count (and must never be cached)."""
    if not num_drafts:
        return num_computed + num_scheduled
    rejected = num_drafts - (num_emitted - 1)
    return num_computed + num_scheduled - rejected


# ---------------------------------------------------------------------------
# What speculation bought: from an engine's (or the simulator's) trace
# ---------------------------------------------------------------------------
def expected_tokens_per_verification(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a): the tokens a verification emits
    when each draft is accepted with probability a, independently, until the first
    rejection (Leviathan et al., eq. 1), the bonus or corrected token included."""
    a, k = float(acceptance_rate), int(num_speculative_tokens)
    if not 0 <= a <= 1:
        raise ValueError(f"acceptance_rate={acceptance_rate!r}: must be in [0, 1]")
    if k < 0:
        raise ValueError(f"num_speculative_tokens={num_speculative_tokens!r}: must be >= 0")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def expected_acceptance_rate(acceptance_rate: float, num_speculative_tokens: int) -> float:
    """What vLLM reports as the acceptance rate (accepted / drafted) when each draft is
    accepted with probability a until the first rejection: the drafts after a rejection
    count as drafted and never accepted, so it is below a: (E - 1) / k, E the expected
    tokens per verification."""
    k = int(num_speculative_tokens)
    if k == 0:
        return float("nan")
    return (expected_tokens_per_verification(acceptance_rate, k) - 1) / k


def acceptance_stats(trace) -> dict:
    """Speculation's numbers from a trace's StepRecord.spec, with vLLM's names
    (vllm/v1/spec_decode/metrics.py, commit 016a858): verifications (requests x steps
    that had drafts), draft tokens, accepted tokens, the acceptance rate (accepted /
    drafted, vLLM's "draft acceptance rate"), the mean accepted tokens per verification,
    and mean_tokens_per_verification, which adds the one token every verification emits
    anyway (vLLM's "mean acceptance length"). conditional_acceptance_rate is accepted /
    drafts examined (those up to and including the first rejection): the a of
    expected_tokens_per_verification, the simulator's acceptance_rate."""
    verifications = drafted = accepted = examined = 0
    for record in trace:
        for num_drafts, num_accepted in getattr(record, "spec", {}).values():
            verifications += 1
            drafted += num_drafts
            accepted += num_accepted
            examined += num_accepted + (num_accepted < num_drafts)
    nan = float("nan")
    return {"verifications": verifications, "draft_tokens": drafted, "accepted_tokens": accepted,
            "acceptance_rate": accepted / drafted if drafted else nan,
            "conditional_acceptance_rate": accepted / examined if examined else nan,
            "mean_accepted_per_verification": accepted / verifications if verifications else nan,
            "mean_tokens_per_verification": 1 + accepted / verifications if verifications else nan}
