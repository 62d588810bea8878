"""The chapter-6 checkers accept a correct answer and catch the usual mistakes."""
import math

import pytest

from minillm.grading import ch06
from minillm.grading._reference import ch06 as ref06


def schedule_chunked(decoding, prefilling, chunk_size, token_budget):
    plan = [(rid, 1) for rid in decoding]
    left = chunk_size if token_budget is None else min(chunk_size, token_budget - len(decoding))
    for rid, tokens_left in prefilling:
        if left <= 0:
            break
        n = min(tokens_left, left)
        plan.append((rid, n))
        left -= n
    return plan


def stream_metrics(arrival_time, token_times):
    itl = [b - a for a, b in zip(token_times, token_times[1:])]
    return {"ttft": token_times[0] - arrival_time, "tpot": sum(itl) / len(itl) if itl else None, "itl": itl}


def num_prefill_steps(prompt_len, chunk_size, num_decoding, token_budget):
    per_step = chunk_size if token_budget is None else min(chunk_size, token_budget - num_decoding)
    return math.ceil(prompt_len / per_step)


def test_correct_answers_pass(capsys):
    ch06.check_schedule_chunked(schedule_chunked, seed=1)
    ch06.check_stream_metrics(stream_metrics, seed=1)
    ch06.check_num_prefill_steps(num_prefill_steps, seed=1)
    assert capsys.readouterr().out.count("correct") == 3


def test_correct_answers_pass_on_other_seeds():
    for seed in range(2, 5):
        ch06.check_schedule_chunked(schedule_chunked, seed=seed, num_states=100)
        ch06.check_num_prefill_steps(num_prefill_steps, seed=seed)


def ignores_budget(decoding, prefilling, chunk_size, token_budget):
    return schedule_chunked(decoding, prefilling, chunk_size, None)


def prefill_before_decodes(decoding, prefilling, chunk_size, token_budget):
    plan = schedule_chunked([], prefilling, chunk_size if token_budget is None else min(chunk_size, token_budget), None)
    left = (token_budget or 10**9) - sum(n for _, n in plan)
    return plan + [(rid, 1) for rid in decoding[:max(0, left)]]


def chunk_per_request(decoding, prefilling, chunk_size, token_budget):
    # chunk_size applied to each prompt instead of to the step's prefill in all
    plan = [(rid, 1) for rid in decoding]
    return plan + [(rid, min(left, chunk_size)) for rid, left in prefilling]


def overgrants(decoding, prefilling, chunk_size, token_budget):
    plan = [(rid, 1) for rid in decoding]
    if prefilling:
        plan.append((prefilling[0][0], chunk_size))
    return plan


def skips_big_prompt(decoding, prefilling, chunk_size, token_budget):
    # packs whichever prompts fit whole: not first come, first served
    plan, left = [(rid, 1) for rid in decoding], chunk_size
    if token_budget is not None:
        left = min(left, token_budget - len(decoding))
    for rid, tokens_left in prefilling:
        if tokens_left <= left:
            plan.append((rid, tokens_left))
            left -= tokens_left
    return plan


def zero_entries(decoding, prefilling, chunk_size, token_budget):
    plan = schedule_chunked(decoding, prefilling, chunk_size, token_budget)
    scheduled = {rid for rid, _ in plan}
    return plan + [(rid, 0) for rid, _ in prefilling if rid not in scheduled]


@pytest.mark.parametrize("broken", [ignores_budget, prefill_before_decodes, chunk_per_request, overgrants,
                                    skips_big_prompt, zero_entries])
def test_schedule_checker_catches_broken_policies(broken, capsys):
    with pytest.raises(AssertionError):
        ch06.check_schedule_chunked(broken, seed=0)
    assert "Not yet" in capsys.readouterr().out


def test_engine_scheduler_plan_meets_the_invariants_itself():
    import random
    rng = random.Random(0)
    for _ in range(200):
        state = ch06._random_state(rng)
        plan = list(ref06.engine_schedule_chunked(*state, rng=rng).items())
        assert ch06._check_plan_invariants(plan, *state) is None


def tpot_over_all_tokens(arrival_time, token_times):
    m = stream_metrics(arrival_time, token_times)
    return {**m, "tpot": (token_times[-1] - arrival_time) / len(token_times)}


def itl_includes_ttft(arrival_time, token_times):
    m = stream_metrics(arrival_time, token_times)
    return {**m, "itl": [token_times[0] - arrival_time] + m["itl"]}


def tpot_zero_for_one_token(arrival_time, token_times):
    m = stream_metrics(arrival_time, token_times)
    return {**m, "tpot": m["tpot"] if m["tpot"] is not None else 0.0}


def ttft_from_zero(arrival_time, token_times):
    return {**stream_metrics(arrival_time, token_times), "ttft": token_times[0]}


@pytest.mark.parametrize("broken", [tpot_over_all_tokens, itl_includes_ttft, tpot_zero_for_one_token,
                                    ttft_from_zero])
def test_metrics_checker_catches_wrong_formulas(broken):
    with pytest.raises(AssertionError):
        ch06.check_stream_metrics(broken, seed=0)


def ignores_decodes(prompt_len, chunk_size, num_decoding, token_budget):
    return math.ceil(prompt_len / chunk_size)


def floor_division(prompt_len, chunk_size, num_decoding, token_budget):
    per_step = chunk_size if token_budget is None else min(chunk_size, token_budget - num_decoding)
    return prompt_len // per_step


def budget_for_prefill_alone(prompt_len, chunk_size, num_decoding, token_budget):
    return math.ceil(prompt_len / (chunk_size if token_budget is None else min(chunk_size, token_budget)))


@pytest.mark.parametrize("broken", [ignores_decodes, floor_division, budget_for_prefill_alone])
def test_step_count_checker_catches_wrong_predictions(broken):
    with pytest.raises(AssertionError):
        ch06.check_num_prefill_steps(broken, seed=0)


def test_engine_step_count_matches_the_articles_example():
    # A 2048-token prompt in 512-token chunks needs 4 steps, decodes riding along.
    assert ref06.engine_num_prefill_steps(2048, 512, 4, None) == 4
    # With a budget of 516 and 8 streams, each step has 508 prefill tokens left.
    assert ref06.engine_num_prefill_steps(2048, 512, 8, 516) == math.ceil(2048 / 508)
