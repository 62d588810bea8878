"""The chapter-8 checkers accept a correct answer and refuse the shortcuts."""
import importlib.util
from pathlib import Path

import pytest

from minillm import prefix_cache
from minillm.grading import ch08
from minillm.prefix_cache import ROOT_HASH, block_hashes, hash_block, max_cached_tokens
from minillm.sim.disaggregation import highest_rate_meeting

SOLUTION = Path(__file__).resolve().parents[1] / "exercises" / "solutions" / "src" / "08_chunked_prefill_in_a_server.py"


@pytest.fixture(scope="module")
def solution():
    spec = importlib.util.spec_from_file_location("solution08", SOLUTION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)          # runs every check once
    return module


def test_solutions_pass_on_other_seeds(solution):
    for seed in (3, 4):
        ch08.check_chain_hashes(solution.chain_hashes, seed=seed)
        ch08.check_tokens_to_compute(solution.tokens_to_compute, seed=seed)
        ch08.check_plan_prefill_step(solution.plan_prefill_step, seed=seed)
        ch08.check_goodput_rate(solution.goodput_rate, seed=seed)


def unchained(tokens, block_size):
    return [hash_block(ROOT_HASH, tokens[i:i + block_size]) for i in range(0, len(tokens) // block_size * block_size, block_size)]


def fcfs_without_cap(lens, chunk_size, threshold):
    left, plan = chunk_size, []
    for n in lens:
        plan.append(min(n, left))
        left -= plan[-1]
    return plan


@pytest.mark.parametrize("checker, shortcut", [
    (ch08.check_chain_hashes, unchained),
    (ch08.check_chain_hashes, lambda t, bs: prefix_cache.block_hashes(t, bs)),      # calling the engine
    (ch08.check_tokens_to_compute, lambda p, c, bs: p - c * bs),                      # forgets the last token
    (ch08.check_tokens_to_compute, lambda p, c, bs: p - min(c * bs, prefix_cache.max_cached_tokens(p, bs))),
    (ch08.check_plan_prefill_step, fcfs_without_cap),
    (ch08.check_goodput_rate, lambda d, t: max([r for r, a in d.items() if a >= t], default=0.0)),
    (ch08.check_plan_prefill_step, lambda p, c, t: ch08.engine_plan_prefill_step(p, c, t)),  # the scheduler
    (ch08.check_goodput_rate, lambda d, t: highest_rate_meeting(d, t)),                   # the module's
])
def test_shortcuts_fail(checker, shortcut):
    with pytest.raises(AssertionError):
        checker(shortcut, seed=1)


@pytest.mark.parametrize("checker, imported_by_name", [
    # the chapter imports these by name; a learner who does the same calls the engine
    (ch08.check_chain_hashes, lambda t, bs: block_hashes(t, bs)),
    (ch08.check_tokens_to_compute, lambda p, c, bs: p - min(c * bs, max_cached_tokens(p, bs))),
])
def test_engine_functions_imported_by_name_are_refused_too(checker, imported_by_name):
    with pytest.raises(AssertionError, match="engine's own answer"):
        checker(imported_by_name, seed=1)


def test_a_hash_for_the_partial_last_block_is_named(capsys):
    def with_partial(tokens, block_size):
        hashes, parent = [], ROOT_HASH
        for i in range(0, len(tokens), block_size):
            parent = hash_block(parent, tokens[i:i + block_size])
            hashes.append(parent)
        return hashes
    with pytest.raises(AssertionError, match="partial last block gets no hash"):
        ch08.check_chain_hashes(with_partial, seed=1)
    assert "Not yet" not in capsys.readouterr().out          # shown once, by the exception, not printed


def test_the_checkers_return_none_and_say_so(solution, capsys):
    assert ch08.check_goodput_rate(solution.goodput_rate, seed=5) is None      # nothing echoed in the cell
    assert capsys.readouterr().out.startswith("✓")
