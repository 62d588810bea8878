"""From logits to the next token: greedy, temperature, top-k, top-p, seeds."""
from __future__ import annotations

import torch

from .request import SamplingParams


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [vocab] -> one token id."""
    if params.temperature == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(sampling_probs(logits, params).cpu(), 1, generator=generator))


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [vocab] -> the distribution a sample is drawn from (float64): softmax at the
    temperature, then top-k and top-p (unnormalised after the filters: multinomial
    normalises). Speculative sampling verifies drafts against this very distribution."""
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    if params.top_k is not None and params.top_k < probs.numel():
        # Exactly top_k tokens survive; among tied ones the lowest id wins, as in
        # argmax, so top_k=1 is greedy even when logits tie.
        order = torch.sort(probs, descending=True, stable=True).indices
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[:params.top_k]] = True
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        # Keep the smallest set of most likely tokens whose mass reaches top_p.
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, 0) - sorted_probs
        sorted_probs = torch.where(mass_before < params.top_p * sorted_probs.sum(), sorted_probs,
                                   torch.zeros_like(sorted_probs))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs


def make_generator(params: SamplingParams, fallback_seed: int) -> torch.Generator | None:
    """A per-request generator, so a seeded request samples the same tokens
    whatever else is in the batch."""
    if params.temperature == 0:
        return None
    seed = params.seed if params.seed is not None else fallback_seed
    return torch.Generator().manual_seed(seed)
