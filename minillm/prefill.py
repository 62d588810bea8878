"""One prompt, or one step of a chosen shape, through the engine by hand.

The engine's loop (engine.py) schedules steps itself. The book and the
benchmarks also need to drive the runner directly: `prefill_kv` runs one
prompt whole or in chunks and returns its KV (the proof chapter compares
them), and `prepare_step` builds one step of a given shape to time or to
count (chapters 0 and 5, the simulator's calibration). Both share the
argument checks of the public entry points.
"""
from __future__ import annotations

import torch

from .batch_invariant import check_batch_invariant
from .kv_cache import BlockManager, PagedKVCache, blocks_for
from .model_runner import ModelRunner, StepChunk
from .validation import check_int, is_int


# ---------------------------------------------------------------------------
# Argument checks shared by the public entry points
# ---------------------------------------------------------------------------
def check_prompt(model, token_ids, arg: str = "token_ids") -> list[int]:
    if isinstance(token_ids, torch.Tensor):
        token_ids = token_ids.flatten().tolist()
    try:
        token_ids = list(token_ids)
    except TypeError:
        raise TypeError(f"{arg} must be a list of token ids, got {type(token_ids).__name__}") from None
    if not token_ids:
        raise ValueError(f"{arg}=[]: the prompt is empty; give at least one token id")
    if not all(is_int(t) for t in token_ids):
        raise TypeError(f"{arg} must contain integers only")
    vocab = model.cfg.vocab_size
    bad = next((t for t in token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ValueError(f"{arg} contains {bad}: token ids must be in [0, {vocab})")
    if len(token_ids) > model.cfg.max_position:
        raise ValueError(f"{arg} has {len(token_ids)} tokens: longer than the model's maximum "
                         f"position {model.cfg.max_position}")
    return [int(t) for t in token_ids]


def check_chunk_size(chunk_size, arg: str = "chunk_size"):
    if chunk_size is None:
        return None
    return check_int(arg, chunk_size, 1, hint="256 or 512; None for no chunking")


# ---------------------------------------------------------------------------
# One prompt through the cache, whole or in chunks
# ---------------------------------------------------------------------------
def prefill_kv(model, token_ids, chunk_size=None, backend=None, block_size: int = 16,
               batch_invariant: bool = False, neighbours=(), seed: int = 0):
    """Run a prompt through the engine's paged cache and forward pass.

    chunk_size=None: one full prefill; else chunks of chunk_size tokens, each
    attending to the cache the earlier chunks wrote.
    batch_invariant=True: the same bits for every chunk size and neighbours (batch_invariant.py).
    neighbours: other requests packed into every step beside the prompt's chunk, as
    prepare_step's (num_new_tokens, num_cached_tokens) pairs: (1, 300) a decode after
    300 tokens, (64, 0) another prompt's first chunk. Their tokens and cached K/V are
    seeded random: they change nothing but the shape of each step.
    Returns kv [num_layers, 2, T, num_kv_heads, head_dim] (K after RoPE) and
    the logits of every position [T, vocab].
    """
    token_ids = check_prompt(model, token_ids)
    chunk_size = check_chunk_size(chunk_size)
    check_batch_invariant(batch_invariant, backend or model.backend)
    riders = check_step_shape(neighbours, "neighbours", allow_empty=True)
    num_tokens = len(token_ids)
    step = chunk_size or num_tokens
    blocks = BlockManager(blocks_for(num_tokens, block_size)
                          + sum(blocks_for(n + c, block_size) for n, c, _ in riders), block_size)
    blocks.allocate("prompt", num_tokens)
    runner = ModelRunner(model, blocks, backend=backend, batch_invariant=batch_invariant)
    rider_chunks = _random_requests(runner, riders, seed, first_id=1)
    logits = []
    for start in range(0, num_tokens, step):
        chunk = StepChunk("prompt", token_ids[start:start + step], num_cached=start)
        logits.append(runner.execute([chunk] + rider_chunks, all_logits=True)[:len(chunk.token_ids)])
    kv = runner.kv_cache.gather(blocks.block_tables["prompt"], num_tokens)
    return kv, torch.cat(logits)


def check_step_shape(shape, arg: str = "shape", allow_empty: bool = False) -> list[tuple[int, int, bool]]:
    """[(num_new_tokens, num_cached_tokens[, samples]), ...] -> checked (int, int, bool) triples."""
    entries = []
    for i, item in enumerate(shape):
        num_new, num_cached, samples = (tuple(item) + (True,))[:3]
        if not is_int(num_new) or not is_int(num_cached) or num_new < 1 or num_cached < 0:
            raise ValueError(f"{arg}[{i}]={item!r}: need num_new_tokens >= 1 and num_cached_tokens >= 0")
        entries.append((int(num_new), int(num_cached), bool(samples)))
    if not entries and not allow_empty:
        raise ValueError(f"{arg}=[]: a step needs at least one request")
    return entries


def _random_requests(runner: ModelRunner, entries, seed: int, first_id: int = 0) -> list[StepChunk]:
    """One StepChunk per (num_new, num_cached, samples) entry: seeded random tokens, and
    seeded random K/V in the cached prefix (runner's block manager allocates them)."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(n + c for n, c, _ in entries)
    tokens = torch.randint(0, runner.model.cfg.vocab_size, (total,), generator=generator).tolist()
    chunks, offset = [], 0
    for i, (num_new, num_cached, samples) in enumerate(entries, start=first_id):
        runner.block_manager.allocate(i, num_cached + num_new)
        prompt = tokens[offset:offset + num_cached + num_new]
        offset += num_cached + num_new
        if num_cached:
            _fill_random_kv(runner.kv_cache, runner.block_manager.slot_mapping(i, 0, num_cached), generator)
        chunks.append(StepChunk(i, prompt[num_cached:], num_cached, sample=samples))
    return chunks


def prepare_step(model, shape, seed: int = 0, block_size: int = 16, backend=None):
    """Set up one step of a given shape; return a callable that runs it.

    shape: [(num_new_tokens, num_cached_tokens[, samples]), ...]. Each
    request's cached prefix is filled with seeded random K and V (a step's
    cost depends on the shapes, not the values, and running the model over
    8 x 2048 cached tokens would take longer than the step itself), so the
    returned zero-argument function runs exactly one forward step: the thing
    to time or to count FLOPs of. It returns the logits of the sampled rows.
    """
    entries = check_step_shape(shape)
    blocks = BlockManager(sum(blocks_for(n + c, block_size) for n, c, _ in entries), block_size)
    runner = ModelRunner(model, blocks, backend=backend)
    chunks = _random_requests(runner, entries, seed)
    return lambda: runner.execute(chunks)


def _fill_random_kv(kv_cache: PagedKVCache, slots: list[int], generator: torch.Generator) -> None:
    """Seeded random K and V (unit scale, like RoPE'd keys) in the given slots."""
    data = kv_cache.data                                   # [L, 2, blocks, block_size, Hkv, D]
    flat = data.view(data.shape[0], 2, -1, *data.shape[4:])
    values = torch.randn((data.shape[0], 2, len(slots), *data.shape[4:]), generator=generator)
    flat[:, :, torch.as_tensor(slots, device=data.device)] = values.to(dtype=data.dtype, device=data.device)
