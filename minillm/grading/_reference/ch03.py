"""Chapter 3's reference answers (teacher only): blocks needed, the requests a KV budget admits,
copy-on-write when a request appends a token to a block it shares (after a fork), and the
tokens the forward passes process with and without a cache, preemption included."""
from __future__ import annotations


def blocks_needed(num_tokens, block_size):
    return -(-num_tokens // block_size)


def requests_that_fit(cfg, num_bytes, block_size, dtype_bytes, prompt_lens):
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    blocks_left = num_bytes // (block_size * per_token)         # a partial block of memory holds no token
    for i, prompt_len in enumerate(prompt_lens):
        needed = blocks_needed(prompt_len, block_size)          # each request rounds up to whole blocks
        if needed > blocks_left:
            return i                                            # first come, first served: it blocks the rest
        blocks_left -= needed
    return len(prompt_lens)


def append_slot(block_table, num_tokens, ref_counts, free_blocks, block_size):
    """The slot of the request's next token (position num_tokens); (new table, slot, copy or None).

    A full last block (or none): take a fresh block. Room in a block this request alone
    holds: write there. Room in a SHARED block: copy it first (copy-on-write), so the
    other holders never see this request's token; the old block loses one holder."""
    table = list(block_table)
    offset = num_tokens % block_size
    if offset == 0:
        block = free_blocks.pop(0)
        ref_counts[block] = 1
        table.append(block)
        return table, block * block_size, None
    last = table[-1]
    if ref_counts[last] == 1:
        return table, last * block_size + offset, None
    block = free_blocks.pop(0)
    ref_counts[block] = 1
    ref_counts[last] -= 1
    table[-1] = block
    return table, block * block_size + offset, (last, block)


def forward_tokens(prompt_len, num_output_tokens, preempted_after=None):
    n = num_output_tokens
    without_cache = n * prompt_len + n * (n - 1) // 2          # pass i reads the prompt and i outputs
    with_cache = prompt_len + n - 1                            # one prefill, then one token per decode
    if preempted_after is not None:                            # recompute what it had: prompt + k - 1 more
        with_cache += prompt_len + preempted_after - 1
    return without_cache, with_cache
