"""Chunks of equal work instead of equal tokens.

A chunk of n tokens after s cached ones costs its matmuls (the same for every
token) plus its attention (one query-key pair per key each token sees:
n*s + n(n+1)/2 pairs). With a fixed chunk size the last chunk of a long
prompt sees the whole prefix and is the slowest step of the prefill: the
longest gap the decoding streams riding along must wait through.

Counted in one unit, a token's matmul work is worth `break_even` query-key
pairs, where break_even is the cached length at which a token's attention
costs as much as its matmuls (`ModelConfig.attention_break_even_len` by the
FLOPs; smaller where attention runs slower per FLOP than the matmuls, as on a
CPU). So the work of tokens [s, s+n) is

    n * (break_even + s) + n (n+1) / 2

an integer. Splitting a prompt into as many chunks as chunk_size gives, but
with boundaries that give each chunk the same work, keeps the number of steps
(so the fixed price per step stays the same) and makes every step cost what
the average chunk costs: early chunks longer than chunk_size, late ones
shorter. Sarathi-Serve's scheduler has a schedule like it
(`enable_dynamic_chunking_schedule` in sarathi/core/scheduler/
sarathi_scheduler.py: chunk sizes stepping down as the prompt's processed
tokens grow; experimental, off by default), and SGLang's
`--enable-dynamic-chunking` (pipeline parallelism; off by default) sizes
chunks by a function fitted to keep their execution times equal
(python/sglang/srt/arg_groups/fields/schedule.py; server_args.py before 0.5.20).
"""
from __future__ import annotations

import math

from .validation import check_int

__all__ = ["causal_pairs", "prefill_work", "chunk_end", "tokens_within", "equal_work_chunks"]


def causal_pairs(num_new_tokens: int, num_cached_tokens: int) -> int:
    """(query, key) pairs of a chunk: each new token sees the cache and the new tokens up to itself."""
    n, c = num_new_tokens, num_cached_tokens
    return n * c + n * (n + 1) // 2


def prefill_work(start: int, num_tokens: int, break_even: int) -> int:
    """Work of prefilling tokens [start, start + num_tokens), in query-key pairs:
    each token's matmuls count break_even, its attention one per key it sees."""
    return num_tokens * break_even + causal_pairs(num_tokens, start)


def _tokens_for_work(start: int, work: float, break_even: int) -> int:
    """The most tokens n from start with prefill_work(start, n) <= work."""
    b = break_even + start + 0.5          # work = n^2/2 + b n
    n = max(0, int(-b + math.sqrt(b * b + 2 * max(work, 0))))
    while n > 0 and prefill_work(start, n, break_even) > work:     # float rounding, either way
        n -= 1
    while prefill_work(start, n + 1, break_even) <= work:
        n += 1
    return n


def chunk_end(first: int, end: int, num_chunks: int, position: int, break_even: int,
              align: int = 1) -> int:
    """Where the chunk that starts at `position` ends, for a prompt whose tokens
    [first, end) are split into num_chunks chunks of equal work: the first
    boundary past position (boundary k is where the work done from `first`
    reaches k/num_chunks of the total), rounded to a multiple of align (the
    scheduler passes the KV block size when a chunk holds 8 blocks or more:
    chunks then fill whole blocks)."""
    total = prefill_work(first, end - first, break_even)
    done = prefill_work(first, position - first, break_even)
    k = done * num_chunks // total + 1                 # the boundary this chunk heads for
    while k < num_chunks:
        # smallest m with work(first, m) * num_chunks >= k * total
        m = _tokens_for_work(first, k * total / num_chunks, break_even)
        while prefill_work(first, m, break_even) * num_chunks < k * total:
            m += 1
        boundary = (first + m + align // 2) // align * align
        if position < boundary < end:
            return boundary
        k += 1
    return end


def tokens_within(start: int, work: float, break_even: int) -> int:
    """The most tokens from start whose work fits in `work` (at least 1, so a
    step always makes progress)."""
    return max(1, _tokens_for_work(start, work, break_even))


def equal_work_chunks(num_tokens: int, chunk_size: int, break_even: int, start: int = 0,
                      align: int = 1) -> list[int]:
    """The chunk sizes of a prompt's tokens [start, start + num_tokens): as many
    chunks as chunk_size makes (ceil(num_tokens / chunk_size)), each with the
    same work. break_even=0 would be attention only; a huge one, equal tokens."""
    num_tokens = check_int("num_tokens", num_tokens, 1, hint="2048")
    chunk_size = check_int("chunk_size", chunk_size, 1, hint="256")
    break_even = check_int("break_even", break_even, 0, hint="ModelConfig.attention_break_even_len")
    start = check_int("start", start, 0, hint="0, or the cached prefix")
    align = check_int("align", align, 1, hint="1, or the KV block size")
    end = start + num_tokens
    num_chunks = -(-num_tokens // chunk_size)
    sizes, position = [], start
    while position < end:
        stop = chunk_end(start, end, num_chunks, position, break_even, align)
        sizes.append(stop - position)
        position = stop
    return sizes
