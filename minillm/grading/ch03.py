"""Checkers for exercises/03_kv_cache: blocks needed (a warm-up), the requests a KV budget
admits (a design question: every request rounds up to whole blocks), copy-on-write when a
forked request appends to a shared block (the engine has none: graded by its invariants),
and a prediction of the tokens the forward passes process with and without a cache,
preemption included, measured on the engine.

Expected values come from the engine (blocks_for, blocks_that_fit, BlockManager's
allocations, the forward passes of LLMEngine and prefill_kv recorded), computed before the
learner's function runs with the engine's own helpers switched off; some inputs are ones
those helpers would not take (a token count far past any cache). Copy-on-write is checked
by what must hold after every append (each request reads back its own tokens, reference
counts equal the tables that hold a block, fresh blocks come from the front of the free
list, only when needed), not against an answer. Teacher-only cases: _hidden/ch03.py.
"""
from __future__ import annotations

import random

from ..config import PRESETS, ModelConfig
from ..kv_cache import BlockManager, OutOfBlocksError, blocks_for, blocks_that_fit
from ._common import (call_text, checker, fail as _fail, grade_count, learner_call, passed, record_forward)

__all__ = ["check_blocks_needed", "check_requests_that_fit", "check_append_slot", "check_forward_tokens"]

_WHY = "the exercise is to compute it yourself."
_BLOCKS_FOR = ("minillm.kv_cache.blocks_for", "minillm.kv_cache.BlockManager.blocks_missing")
_SLOTS = ("minillm.kv_cache.BlockManager.slot_mapping",)
_FIT = ("minillm.kv_cache.blocks_that_fit", "minillm.kv_cache.kv_bytes_per_token",
        "minillm.config.ModelConfig.kv_bytes_per_token", "minillm.kv_cache.BlockManager.allocate",
        "minillm.kv_cache.BlockManager.can_allocate")


@checker
def check_blocks_needed(fn, seed: int | None = None):
    """fn(num_tokens, block_size) -> blocks a request of num_tokens tokens occupies."""
    rng = random.Random(seed)
    # Counts far past any cache, and past float precision (53 bits): math.ceil of a float division
    # rounds 10**18 + 1 tokens to 10**18 // 16 exactly, one block short; a float floor plus an
    # integer remainder test, int(a / b) + (a % b > 0), is two blocks over at 10**18 + 100 tokens.
    cases = [(0, 16), (1, 16), (16, 16), (17, 16), (1, 1), (10**18 + 1, 16), (2**60 + 3, 256),
             (10**18 + 100, 16), (10**18, 7), (10**18 + 15, 3)] + \
        [(rng.randint(0, 5000), rng.choice([1, 8, 16, 32, 256])) for _ in range(50)]
    for num_tokens, block_size in cases:
        expected = blocks_for(num_tokens, block_size)
        got = learner_call(fn, num_tokens, block_size, forbidden=_BLOCKS_FOR, why=_WHY)
        if got != expected:
            hint = "A partly filled last block still counts as a whole block."
            if num_tokens > 2**53:
                hint = (f"As a float, {num_tokens} / {block_size} is {num_tokens / block_size!r}: a float holds 53 "
                        f"bits, this count needs {num_tokens.bit_length()}, so any step through a float (a true "
                        "division, math.ceil, int of a quotient) lands on a neighbouring number. The statement "
                        "asks for integer arithmetic only.")
            elif got == num_tokens // block_size:
                hint = "That is the floor: a partly filled last block still counts as a whole block."
            _fail(f"{call_text(fn, num_tokens, block_size)} returned {got!r}, expected {expected}. {hint}")
    passed(f"check_blocks_needed: correct on {len(cases)} cases")


# ---------------------------------------------------------------------------
# Design: how many requests does a KV budget admit?
# ---------------------------------------------------------------------------
def admitted(num_blocks: int, block_size: int, prompt_lens: list[int]) -> int:
    """Allocate the prompts in order in the engine's BlockManager until one does not fit."""
    manager = BlockManager(num_blocks=max(num_blocks, 1), block_size=block_size)
    if num_blocks == 0:
        return 0
    for i, prompt_len in enumerate(prompt_lens):
        try:
            manager.allocate(i, prompt_len)
        except OutOfBlocksError:
            return i
    return len(prompt_lens)


def _fit_mistake(got, cfg, num_bytes, block_size, dtype_bytes, prompt_lens) -> str:
    """Name the usual slips, each rebuilt with the engine's own helpers on a changed question."""
    blocks = blocks_that_fit(cfg, num_bytes, block_size, dtype_bytes)
    tokens, pooled, served = blocks * block_size, 0, 0
    for prompt_len in prompt_lens:               # tokens pooled: no request rounds up to whole blocks
        if pooled + prompt_len > tokens:
            break
        pooled, served = pooled + prompt_len, served + 1
    if got == served and served != admitted(blocks, block_size, prompt_lens):
        return ("you pool the tokens: each request holds WHOLE blocks (its last one partly empty), so count the "
                "blocks of each request, not the tokens of all")
    derived = cfg.hidden_size // cfg.num_heads
    variants = [(blocks_that_fit(cfg, 2 * num_bytes, block_size, dtype_bytes),
                 "you count K only (or V only): a token stores both"),
                (blocks_that_fit(cfg.replace(num_kv_heads=cfg.num_heads), num_bytes, block_size, dtype_bytes),
                 "you count the query heads: only the KV heads are cached (grouped-query attention)")]
    if derived != cfg.head_dim:
        variants.append((blocks_that_fit(cfg.replace(head_dim=derived), num_bytes, block_size, dtype_bytes),
                         f"use head_dim ({cfg.head_dim}), not hidden_size // num_heads ({derived})"))
    for wrong_blocks, what in variants:
        if wrong_blocks != blocks and got == admitted(wrong_blocks, block_size, prompt_lens):
            return what
    fits = [i for i, n in enumerate(prompt_lens) if blocks_for(n, block_size) <= blocks]
    greedy, used = 0, 0
    for n in prompt_lens:                         # skipping a request that does not fit
        if used + blocks_for(n, block_size) <= blocks:
            used, greedy = used + blocks_for(n, block_size), greedy + 1
    if fits and got == greedy and greedy != admitted(blocks, block_size, prompt_lens):
        return ("you skip a request that does not fit and admit later, smaller ones: first come, first served "
                "stops at the first request that does not fit")
    if got == admitted(blocks, block_size, prompt_lens) + 1:
        return "you count the first request that does NOT fit"
    if isinstance(got, float):
        return "return a whole number of requests"
    return ""


def _fit_cases(rng: random.Random):
    configs = [PRESETS[n] for n in ("llama-3-8b", "llama-2-7b", "qwen3-0.6b")]
    for _ in range(4):
        kv = rng.choice([1, 2, 4, 8])
        configs.append(ModelConfig(name="random", vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                   num_layers=rng.randint(1, 48), num_heads=kv * rng.choice([1, 4]),
                                   num_kv_heads=kv, head_dim=rng.choice([64, 96, 128])))
    cases = []
    for i, cfg in enumerate(configs):
        block_size, dtype_bytes = rng.choice([16, 32, 256]), rng.choice([1, 2, 4])
        block_bytes = block_size * cfg.kv_bytes_per_token(dtype_bytes)
        num_blocks = rng.randint(20, 300)
        num_bytes = num_blocks * block_bytes + rng.randint(0, block_bytes - 1)   # a partial block is unusable
        if i == 0:      # prompts just past a block boundary: pooling the tokens admits far too many
            prompt_lens = [block_size + 1] * (2 * num_blocks + 5)
        else:
            prompt_lens = [rng.randint(1, 6 * block_size) for _ in range(rng.randint(5, 120))]
            if i == 1:  # a long one early, then short ones: stop at the first that does not fit
                prompt_lens = [block_size * (num_blocks // 2)] * 2 + [1] * 40
        cases.append((cfg, num_bytes, block_size, dtype_bytes, prompt_lens))
    return cases


@checker
def check_requests_that_fit(fn, seed: int | None = None):
    """fn(cfg, num_bytes, block_size, dtype_bytes, prompt_lens) -> how many requests, admitted first come,
    first served, hold their prompts' K and V in num_bytes of blocks at once (measured: the engine's
    BlockManager, sized by blocks_that_fit, allocating the prompts in order)."""
    rng = random.Random(seed)
    cases = _fit_cases(rng)
    for cfg, num_bytes, block_size, dtype_bytes, prompt_lens in cases:
        expected = admitted(blocks_that_fit(cfg, num_bytes, block_size, dtype_bytes), block_size, prompt_lens)
        # Always a real ModelConfig: a learner who calls cfg.kv_bytes_per_token (chapter 3 shows it)
        # gets the forbidden-call message, not an AttributeError on a stand-in object.
        got = learner_call(fn, cfg, num_bytes, block_size, dtype_bytes, list(prompt_lens), forbidden=_FIT, why=_WHY)
        if got != expected:
            mistake = _fit_mistake(got, cfg, num_bytes, block_size, dtype_bytes, prompt_lens)
            lens = f"[{', '.join(map(str, prompt_lens[:5]))}{', ...' if len(prompt_lens) > 5 else ''}]"
            call = call_text(fn, cfg, num_bytes, block_size, dtype_bytes, lens).replace("'[", "[").replace("]'", "]")
            _fail(f"{call} ({len(prompt_lens)} prompts) "
                  f"returned {got!r}, expected {expected}{': ' + mistake if mistake else ''}. "
                  f"({cfg.name}: layers {cfg.num_layers}, kv heads {cfg.num_kv_heads}, head_dim {cfg.head_dim}.)")
    passed(f"check_requests_that_fit: correct on {len(cases)} budgets and workloads")


# ---------------------------------------------------------------------------
# Design: copy-on-write after a fork, graded by its invariants
# ---------------------------------------------------------------------------
def _forked_state(rng: random.Random, block_size: int):
    """A pool where a parent and 1-3 forks share the parent's blocks (ref counts > 1), plus an
    unrelated request. Returns (requests {name: [table, tokens]}, contents, ref_counts, free_blocks):
    `contents[block][offset]` is the token stored there, as the cache would hold its K and V."""
    num_blocks = 64
    free = list(range(num_blocks))
    rng.shuffle(free)
    refs = [0] * num_blocks
    contents = [[None] * block_size for _ in range(num_blocks)]
    requests = {}
    for name in ("parent", "other"):
        tokens = [rng.randrange(1000) for _ in range(rng.randint(1, 5 * block_size))]
        table = [free.pop(0) for _ in range(blocks_for(len(tokens), block_size))]
        for p, token in enumerate(tokens):
            contents[table[p // block_size]][p % block_size] = token
        for b in table:
            refs[b] = 1
        requests[name] = [table, tokens]
    for i in range(rng.randint(1, 3)):                 # forks share every block of the parent
        table, tokens = requests["parent"]
        for b in table:
            refs[b] += 1
        requests[f"fork{i}"] = [list(table), list(tokens)]
    return requests, contents, refs, free


def _append_problem(got, name, requests, contents, refs_before, free_before, refs, free, block_size) -> str:
    """What the append broke, by the rules the statement states; '' when every rule holds. Applies the
    learner's copy and write to `contents` (the caller's part) before checking that every request reads
    back its own tokens."""
    table, tokens = requests[name]
    n = len(tokens)
    offset = n % block_size
    last = table[-1] if table else None
    shared = bool(offset) and refs_before[last] > 1
    new_table, slot, copy = got
    taken = [b for b in new_table if b not in table]
    if new_table[:max(len(table) - 1, 0)] != table[:-1] or len(new_table) not in (len(table), len(table) + 1):
        return (f"the table changed beyond its last block: {table} became {new_table}; the earlier blocks hold "
                "tokens this request still reads")
    if offset == 0:
        if copy is not None:
            return "a full last block is never written again: take a fresh block, nothing to copy"
        if len(new_table) != len(table) + 1:
            return f"position {n} starts a new block: the table needs one more"
    elif shared:
        if not isinstance(slot, int) or slot // block_size == last:
            return (f"the last block ({last}) is shared by {refs_before[last]} requests and has room: writing your "
                    "token there changes what the others read. Copy it to a fresh block first (copy-on-write)")
        if copy != (last, new_table[-1]) or len(new_table) != len(table):
            return (f"the fresh block replaces the shared one as the table's last ({table} -> "
                    f"{table[:-1] + ['fresh']}), and copy is (the shared block, the fresh one) = ({last}, fresh); "
                    f"you return the table {new_table} and copy {copy}")
    elif len(new_table) == len(table) + 1:
        return (f"the last block has room (position {n} is offset {offset} of it): only a full last block needs a "
                "new one")
    elif copy is not None or new_table[-1] != last:
        return (f"block {last} is this request's alone (ref count 1): no copy is needed, write at offset {offset} "
                "in place")
    if not isinstance(slot, int) or new_table[n // block_size] != slot // block_size or slot % block_size != offset:
        return (f"slot {slot!r} is not offset {offset} of the table's block for position {n} "
                f"(table {new_table}, block_size {block_size})")
    if len(taken) > 1 or free != free_before[len(taken):] or taken != free_before[:len(taken)]:
        return "take a fresh block from the FRONT of free_blocks (pop(0)), one at most, and only when one is needed"
    # the caller's part: copy the old block's tokens, then write the new token
    if copy is not None:
        contents[copy[1]] = list(contents[copy[0]])
    contents[slot // block_size][slot % block_size] = ("new", name)
    requests[name] = [new_table, tokens + [("new", name)]]
    for other, (other_table, other_tokens) in requests.items():
        read = [contents[other_table[p // block_size]][p % block_size] for p in range(len(other_tokens))]
        if read != other_tokens:
            p = next(i for i, (a, b) in enumerate(zip(read, other_tokens)) if a != b)
            return (f"after the append, request {other!r} reads a wrong token at position {p}: a block it "
                    "holds was written by another request, or its tokens were not copied to the fresh block")
    holders = [0] * len(refs)
    for other_table, _ in requests.values():
        for b in other_table:
            holders[b] += 1
    wrong = [b for b in range(len(refs)) if refs[b] != holders[b]]
    if wrong:
        b = wrong[0]
        if shared and b == last:
            return (f"after the copy this request no longer holds block {last}: its ref count must drop by one "
                    f"(to {holders[b]}), or it is never freed")
        return (f"block {b} has ref count {refs[b]} but {holders[b]} table(s) hold it: every count is the number "
                "of tables that hold the block (a fresh block starts at 1)")
    return ""


@checker
def check_append_slot(fn, seed: int | None = None):
    """fn(block_table, num_tokens, ref_counts, free_blocks, block_size) -> (new_table, slot, copy)."""
    rng = random.Random(seed)
    appends = 0
    for trial in range(30):
        block_size = rng.choice([1, 4, 16]) if trial > 2 else 4
        requests, contents, refs, free = _forked_state(rng, block_size)
        if trial == 0:                                  # a fork appends into the shared, partly filled block
            refs, free = [0] * len(refs), list(range(len(refs)))
            tokens = [rng.randrange(1000) for _ in range(6)]
            table = [free.pop(0), free.pop(0)]
            for p, token in enumerate(tokens):
                contents[table[p // block_size]][p % block_size] = token
            for b in table:
                refs[b] = 2
            requests = {"parent": [table, tokens], "fork0": [list(table), list(tokens)]}
            order = ["fork0"]
        else:
            order = [rng.choice(list(requests)) for _ in range(8)]
        for name in order:
            table, tokens = requests[name]
            refs_before, free_before = list(refs), list(free)
            call = call_text(fn, list(table), len(tokens), "<ref_counts>", "<free_blocks>", block_size).replace("'", "")
            got = learner_call(fn, list(table), len(tokens), refs, free, block_size,
                               forbidden=_SLOTS + ("minillm.kv_cache.BlockManager.allocate",),
                               why="the engine has no copy-on-write: design it from the statement's rules.")
            if not (isinstance(got, (tuple, list)) and len(got) == 3 and isinstance(got[0], (list, tuple))):
                _fail(f"{call} returned {got!r}: return (new_table, slot, copy), copy None or (src, dst)")
            got = (list(got[0]), got[1], None if got[2] is None else tuple(got[2]))
            last = table[-1] if table else None
            state = (f"last block {last}, ref count {refs_before[last] if table else '-'}"
                     f"{', shared' if table and refs_before[last] > 1 else ''}, position {len(tokens)}")
            problem = _append_problem(got, name, requests, contents, refs_before, free_before, refs, free, block_size)
            if problem:
                _fail(f"{call} ({state}) returned {got}: {problem}")
            appends += 1
    passed(f"copy-on-write holds on {appends} appends to forked requests: every request reads its own tokens, "
           "ref counts and free list exact")


# ---------------------------------------------------------------------------
# Predict, then measure: tokens through the forward passes, with and without a cache
# ---------------------------------------------------------------------------
def measured_forward_tokens(model, prompt_len: int, num_output_tokens: int, rng: random.Random,
                            preempted_after: int | None = None):
    """(without a cache, with one): tokens the forward passes process to generate num_output_tokens
    greedy tokens, measured by recording the engine's forward passes. preempted_after=k: once the
    request holds k output tokens, the engine's scheduler preempts it (vLLM's recompute preemption:
    its blocks are freed, it waits, and comes back to recompute what it had)."""
    from ..engine import LLMEngine
    from ..prefill import prefill_kv
    from ..request import SamplingParams
    from ..scheduler import ScheduledStep, SchedulerConfig
    prompt = [rng.randrange(model.cfg.vocab_size) for _ in range(prompt_len)]
    with record_forward(model) as no_cache:
        tokens = list(prompt)
        for _ in range(num_output_tokens):                # recompute everything for every new token
            _, logits = prefill_kv(model, tokens)
            tokens.append(int(logits[-1].argmax()))
    engine = LLMEngine(model, SchedulerConfig(), block_size=16, num_blocks=8)
    with record_forward(model) as cached:
        request = engine.requests[engine.add_request(prompt, SamplingParams(max_tokens=num_output_tokens,
                                                                            ignore_eos=True))]
        while engine.has_unfinished_requests():
            engine.step()
            if preempted_after is not None and request.num_preemptions == 0 and \
                    len(request.output_token_ids) == preempted_after and not request.is_finished:
                engine.scheduler._preempt(request, ScheduledStep())
    return sum(c.num_tokens for c in no_cache.calls), sum(c.num_tokens for c in cached.calls)


def _forward_call(fn, prompt_len, num_out, preempted_after):
    args = (prompt_len, num_out) + (() if preempted_after is None else (preempted_after,))
    got = learner_call(fn, *args, forbidden=("minillm.prefill.prefill_kv", "minillm.engine.LLMEngine.step"),
                       why="predict the counts from how generation runs, without running it.")
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        _fail(f"{call_text(fn, *args)} returned {got!r}: return a pair (without_cache, with_cache)")
    return call_text(fn, *args), got


@checker
def check_forward_tokens(fn, seed: int | None = None):
    """fn(prompt_len, num_output_tokens, preempted_after=None) -> (without_cache, with_cache): predicted
    token counts through the forward passes; the checker measures them on the engine (exact counts).
    preempted_after=k: the request is preempted once it holds k output tokens (1 <= k < num_output_tokens)."""
    from ..config import ModelConfig as _Config
    from ..loader import build_model
    rng = random.Random(seed)
    model = build_model(_Config(name="count", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                                num_heads=2, num_kv_heads=1, max_position=256), seed=0)
    cases = [(5, 1, None), (5, 4, None), (1, 3, None), (5, 4, 2), (3, 6, 1), (10, 5, 4)]
    for _ in range(4):
        prompt_len, num_out = rng.randint(1, 30), rng.randint(2, 8)
        cases.append((prompt_len, num_out, rng.choice([None, rng.randint(1, num_out - 1)])))
    for prompt_len, num_out, k in cases:
        measured = measured_forward_tokens(model, prompt_len, num_out, rng, k)
        call, got = _forward_call(fn, prompt_len, num_out, k)
        for what, g, m in (("without a cache", got[0], measured[0]), ("with a cache", got[1], measured[1])):
            why = "count the tokens each forward pass takes, one pass per generated token"
            if what == "without a cache" and g == m + prompt_len + num_out:
                why = "the last generated token is never fed back: it needs no forward pass"
            elif what == "without a cache" and g == m + num_out:
                why = ("the first pass runs the prompt alone; pass i runs the prompt and the i tokens generated "
                       "before it")
            elif what == "with a cache" and k is None and g == m + 1:
                why = ("the prefill's pass already produces the first output token: only the later tokens need "
                       "a decode pass each")
            elif what == "with a cache" and k is not None:
                if g == m - (prompt_len + k - 1):
                    fed = "the first output token" if k == 2 else f"the first {k - 1} output tokens"
                    had = f"the K and V of its prompt and of {fed}" if k > 1 else "the K and V of its prompt"
                    why = (f"the preemption freed the request's blocks, and with them {had} (output token "
                           f"{k} had not been fed back yet): when it comes back, a pass recomputes what was lost "
                           "(vLLM's recompute preemption)")
                elif g == m - k + 1:
                    why = (f"the K and V of the generated tokens were freed too: the recompute runs the prompt AND "
                           f"the {k} generated tokens")
                elif g == m + 1:
                    follow = num_out - k - 1
                    why = (f"the recompute pass ends on output token {k}, so it produces token {k + 1} itself: only "
                           f"{follow} decode pass{'' if follow == 1 else 'es'} follow{'s' if follow == 1 else ''} it")
            grade_count(f"{call}, {what}", g, m, why, unit=" tokens")
    # far too long to run: the answer must be a pair of whole numbers (its exact value: _hidden/ch03.py)
    call, big = _forward_call(fn, 100_000, 10_000, None)
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in big) or not 0 < big[1] < big[0]:
        _fail(f"{call} returned {big!r}: a pair of whole numbers, fewer tokens with the cache than without")
    passed(f"your predicted token counts match the engine's forward passes on {len(cases)} generations, "
           "preempted ones included")
