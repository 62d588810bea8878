"""Chapter 3's expected values: copy-on-write when a request appends a token to a
block it shares (after a fork), and the engine's measured forward tokens."""
from __future__ import annotations


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
