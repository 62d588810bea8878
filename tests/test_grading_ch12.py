"""Chapter 12's checkers: a correct answer passes, each usual mistake fails with its name.

Costs: each checker runs in well under a second, speculative_sample in 1-3 s (3,000 draws
of 4 distributions); the whole module ~30 s on the busy 2-core machine.
"""
import math

import pytest
import torch

import minillm.grading as ex
from minillm.grading._common import ExerciseFailed
from minillm.grading._hidden import ch12 as hidden
from minillm.grading._reference import ch12 as ref
from minillm.speculative import rejection_sample, verify_greedy


# ---- 1. verification of a packed step -------------------------------------------------------
def _verify(logits, query_lens, drafts, rule):
    out, start = [], 0
    for n, d in zip(query_lens, drafts):
        rows = logits[start:start + n]
        start += n
        out.append([] if d is None else rule(rows[n - 1 - len(d):].argmax(-1).tolist(), d))
    return out


def past_first_mismatch(logits, query_lens, drafts):
    # every row's target is emitted, as if a wrong draft did not spoil the rows after it
    return _verify(logits, query_lens, drafts, lambda targets, d: targets[:len(d) + 1])


def no_bonus(logits, query_lens, drafts):
    def rule(targets, d):
        out = []
        for t, x in zip(targets, d):
            out.append(t)
            if t != x:
                return out
        return out or [targets[0]]
    return _verify(logits, query_lens, drafts, rule)


def draft_at_mismatch(logits, query_lens, drafts):
    def rule(targets, d):
        out = []
        for t, x in zip(targets, d):
            out.append(x)
            if t != x:
                return out
        return out + [targets[len(d)]]
    return _verify(logits, query_lens, drafts, rule)


def pasted_verify_greedy(logits, draft_token_ids):    # chapter 12 prints the engine's, this is a paste
    targets = torch.argmax(logits, dim=-1).tolist()
    emitted = []
    for draft, target in zip(draft_token_ids, targets):
        emitted.append(target)
        if target != draft:
            return emitted
    emitted.append(targets[len(draft_token_ids)])
    return emitted


def first_rows(logits, query_lens, drafts):        # a request's first rows, not its last ones
    out, start = [], 0
    for n, d in zip(query_lens, drafts):
        rows = logits[start:start + n]
        start += n
        out.append([] if d is None else pasted_verify_greedy(rows[:len(d) + 1], d))
    return out


def mid_prompt_emits(logits, query_lens, drafts):
    out = ref.verify_packed_step(logits, query_lens, drafts)
    start = 0
    for i, (n, d) in enumerate(zip(query_lens, drafts)):
        start += n
        if d is None:
            out[i] = [int(logits[start - 1].argmax())]
    return out


def per_request(verify_one):
    """A packed step walked request by request, each verified by `verify_one(rows, drafts)`."""
    def walk(logits, query_lens, drafts):
        out, start = [], 0
        for n, d in zip(query_lens, drafts):
            rows = logits[start:start + n]
            start += n
            out.append([] if d is None else verify_one(rows[n - 1 - len(d):], d))
        return out
    return walk


def engine_per_request(logits, query_lens, drafts):  # the engine's own rule, called per request
    return per_request(verify_greedy)(logits, query_lens, drafts)


def printed_code_on_the_whole_step(logits, query_lens, drafts):   # the chapter's function, pasted as is
    return [pasted_verify_greedy(logits[:len(d) + 1], d) if d is not None else [] for d in drafts]


# ---- 2. the plan -------------------------------------------------------------------------
def drafts_free(stream_drafts, prompt_left, token_budget, chunk_size):
    return list(stream_drafts), max(0, min(chunk_size, prompt_left, token_budget - len(stream_drafts)))


def chunk_first(stream_drafts, prompt_left, token_budget, chunk_size):
    chunk = max(0, min(chunk_size, prompt_left, token_budget - len(stream_drafts)))
    free = token_budget - len(stream_drafts) - chunk
    out = []
    for d in stream_drafts:
        out.append(max(0, min(d, free)))
        free -= out[-1]
    return out, chunk


def vllm_loop_without_reserve(stream_drafts, prompt_left, token_budget, chunk_size):
    free, out = token_budget, []
    for d in stream_drafts:                        # each stream takes 1 + d before the next gets its token
        take = max(0, min(1 + d, free))
        out.append(max(0, take - 1))
        free -= take
    return out, max(0, min(chunk_size, prompt_left, free))


# ---- 3. the prediction ---------------------------------------------------------------------
def steps_drafts_free(prompt_len, n, k, budget, chunk, draft_budget):
    return math.ceil(prompt_len / min(chunk, budget - n))


def steps_k_not_1_plus_k(prompt_len, n, k, budget, chunk, draft_budget):
    c = min(chunk, budget - (n * k if draft_budget == "drafts_first" else n))
    return math.inf if c <= 0 else math.ceil(prompt_len / c)


def steps_no_chunk_size(prompt_len, n, k, budget, chunk, draft_budget):
    c = budget - (n * (1 + k) if draft_budget == "drafts_first" else n)
    return math.inf if c <= 0 else math.ceil(prompt_len / c)


def steps_never_inf(prompt_len, n, k, budget, chunk, draft_budget):
    c = min(chunk, budget - (n * (1 + k) if draft_budget == "drafts_first" else n))
    return math.ceil(prompt_len / max(c, 1))


def steps_ignoring_placement(prompt_len, n, k, budget, chunk, draft_budget):
    c = min(chunk, budget - n * (1 + k))
    return math.inf if c <= 0 else math.ceil(prompt_len / c)


def steps_by_running_the_engine(prompt_len, n, k, budget, chunk, draft_budget):
    from minillm.grading.ch12 import measured_long_prompt_steps
    return measured_long_prompt_steps(prompt_len, n, k, budget, chunk, draft_budget)


# ---- 4. sampling ---------------------------------------------------------------------------
def accept_every_draft(probs, drafts, generator):
    return list(drafts) + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


def continue_after_rejection(probs, drafts, generator):
    out = []
    for i, d in enumerate(drafts):
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(probs[i, d]):
            out.append(d)
        else:
            p = probs[i].clone()
            p[d] = 0
            out.append(int(torch.multinomial(p, 1, generator=generator)))      # ... and go on
    return out + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


def sampler_without_bonus(probs, drafts, generator):
    out = ref.speculative_sample(probs, drafts, generator)
    return out[:len(drafts)] if len(out) == len(drafts) + 1 else out


def residual_with_the_draft(probs, drafts, generator):
    out = []
    for i, d in enumerate(drafts):
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(probs[i, d]):
            out.append(d)
            continue
        return out + [int(torch.multinomial(probs[i], 1, generator=generator))]
    return out + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


def accept_when_likely(probs, drafts, generator):    # greedy-minded: keep a draft when p(d) >= 1/2
    out = []
    for i, d in enumerate(drafts):
        if float(probs[i, d]) >= 0.5:
            out.append(d)
            continue
        p = probs[i].clone()
        p[d] = 0
        return out + [int(torch.multinomial(p, 1, generator=generator))]
    return out + [int(torch.multinomial(probs[len(drafts)], 1, generator=generator))]


# ---- 5. choosing k -------------------------------------------------------------------------
def best_k_without_bonus(alpha, step_time_s, max_k):
    rates = [sum(alpha ** i for i in range(1, k + 1)) / step_time_s(k) for k in range(max_k + 1)]
    return max(range(max_k + 1), key=lambda k: (rates[k], -k))


def best_k_largest_on_a_tie(alpha, step_time_s, max_k):
    rates = [sum(alpha ** i for i in range(k + 1)) / step_time_s(k) for k in range(max_k + 1)]
    return max(range(max_k + 1), key=lambda k: (rates[k], k))


def best_k_k_terms(alpha, step_time_s, max_k):       # (1 - a^k) / (1 - a): E(0) = 0
    rates = [(1 - alpha ** k) / (1 - alpha) if alpha < 1 else k for k in range(max_k + 1)]
    return max(range(max_k + 1), key=lambda k: (rates[k] / step_time_s(k), -k))


def best_k_closed_form(alpha, step_time_s, max_k):   # the closed form, unguarded at alpha = 1
    return max(range(max_k + 1), key=lambda k: ((1 - alpha ** (k + 1)) / (1 - alpha) / step_time_s(k), -k))


def sampler_on_the_global_generator(probs, drafts, generator):
    return ref.speculative_sample(probs, drafts, torch.Generator().manual_seed(int(torch.randint(2**31, ()))))


def plan_all_or_nothing(stream_drafts, prompt_left, token_budget, chunk_size):
    free, drafts = token_budget - len(stream_drafts), []
    for proposed in stream_drafts:
        drafts.append(proposed if proposed <= free else 0)
        free -= drafts[-1]
    return drafts, min(chunk_size, prompt_left, free)


def plan_even_shares(stream_drafts, prompt_left, token_budget, chunk_size):
    free = token_budget - len(stream_drafts)
    drafts = list(stream_drafts) if sum(stream_drafts) <= free else \
        [min(p, free // len(stream_drafts)) for p in stream_drafts]
    return drafts, min(chunk_size, prompt_left, free - sum(drafts))


def best_k_ignoring_time(alpha, step_time_s, max_k):
    return max_k


def best_k_with_the_engine_formula(alpha, step_time_s, max_k):
    from minillm.speculative import expected_tokens_per_verification
    return max(range(max_k + 1), key=lambda k: expected_tokens_per_verification(alpha, k) / step_time_s(k))


def plan_with_the_engine_scheduler(stream_drafts, prompt_left, token_budget, chunk_size):
    from minillm.grading.ch12 import engine_plan
    return engine_plan(stream_drafts, prompt_left, token_budget, chunk_size)


CORRECT = {"check_verify_packed_step": ref.verify_packed_step, "check_plan_step": ref.plan_step,
           "check_long_prompt_steps": ref.predict_long_prompt_steps,
           "check_speculative_sample": ref.speculative_sample, "check_best_k": ref.best_k}
SHORTCUTS = [   # (checker, attempt, what the first line of the message must say)
    ("check_verify_packed_step", past_first_mismatch, "accepting past the first mismatch"),
    ("check_verify_packed_step", no_bonus, "forgetting the bonus token"),
    ("check_verify_packed_step", draft_at_mismatch, "emit the target"),
    ("check_verify_packed_step", first_rows, "its last 1 + len(drafts) rows"),
    ("check_verify_packed_step", mid_prompt_emits, "middle of a prompt emits nothing"),
    ("check_verify_packed_step", engine_per_request, "the engine's own answer"),
    ("check_verify_packed_step", printed_code_on_the_whole_step, "its last 1 + len(drafts) rows"),
    ("check_plan_step", drafts_free, "counting the drafts as free"),
    ("check_plan_step", chunk_first, "chunk-first rule"),
    ("check_plan_step", vllm_loop_without_reserve, "keeps its own token"),
    ("check_long_prompt_steps", steps_drafts_free, "counting the drafts as free"),
    ("check_long_prompt_steps", steps_k_not_1_plus_k, "1 + k tokens, not k"),
    ("check_long_prompt_steps", steps_no_chunk_size, "capped by chunk_size"),
    ("check_long_prompt_steps", steps_never_inf, "return math.inf"),
    ("check_long_prompt_steps", steps_ignoring_placement, "under chunk_first"),
    ("check_long_prompt_steps", steps_by_running_the_engine, "the engine's own answer"),
    ("check_speculative_sample", accept_every_draft, "accept with probability p(d)"),
    ("check_speculative_sample", continue_after_rejection, "accepting past the first mismatch"),
    ("check_speculative_sample", sampler_without_bonus, "forgetting the bonus token"),
    ("check_speculative_sample", residual_with_the_draft, "p without the draft"),
    ("check_speculative_sample", accept_when_likely, "accept with probability p(d)"),
    ("check_best_k", best_k_without_bonus, "forgetting the bonus token"),
    ("check_best_k", best_k_ignoring_time, "divide the tokens by the step's time"),
    ("check_best_k", best_k_with_the_engine_formula, "the engine's own answer"),
    ("check_plan_step", plan_with_the_engine_scheduler, "the engine's own answer"),
    ("check_plan_step", plan_all_or_nothing, "whose drafts do not all fit got none"),
    ("check_plan_step", plan_even_shares, "shared the drafts evenly"),
    ("check_best_k", best_k_largest_on_a_tie, "a tie: return the smallest"),
    ("check_best_k", best_k_k_terms, "(k = 0) still emits 1 token"),
    ("check_best_k", best_k_closed_form, "at alpha = 1 the closed form"),
    ("check_speculative_sample", sampler_on_the_global_generator, "draw every random number from `generator`"),
]


@pytest.mark.parametrize("checker", sorted(CORRECT))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CORRECT[checker], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


@pytest.mark.parametrize("checker,fn,says", SHORTCUTS, ids=[f"{c}-{f.__name__}" for c, f, _ in SHORTCUTS])
def test_a_usual_mistake_fails_with_its_name(checker, fn, says):
    with pytest.raises(ExerciseFailed) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, first_line
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line


def test_the_chapter_does_not_print_the_answers_to_tasks_1_and_4():
    """Pasting the engine's verify_greedy (+ a row walk) passed task 1 and its rejection_sample
    passed task 4, about half the notebook: chapter 12 now prints verify_greedy's contract and
    the sampler up to its acceptance probability. No line of their bodies past that is in the
    executed chapter (sources or outputs)."""
    import inspect
    import json
    from pathlib import Path
    chapter = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / "12_speculative_decoding.ipynb")
                         .read_text())
    shown = json.dumps(chapter["cells"])
    body = lambda fn, after: [line.strip() for line in inspect.getsource(fn).split(after, 1)[1].splitlines()[1:]
                              if line.strip() and not line.strip().startswith("#")]
    for line in body(verify_greedy, "(the bonus token)") + body(rejection_sample, "accept_probability = min("):
        if len(line) > 12:
            assert json.dumps(line)[1:-1] not in shown, line
    assert "def verify_greedy" in shown and "accept_probability = min(" in shown   # what it still prints


def test_the_pasted_engine_rule_with_a_row_walk_passes_task_1_only_because_it_is_right():
    """The trial's paste route P1, kept to show the rule is the answer: with the chapter no longer
    printing it, writing it is the task."""
    ex.check_verify_packed_step(per_request(pasted_verify_greedy), seed=3)


def test_the_public_checkers_do_not_import_the_answers():
    import ast
    from pathlib import Path
    source = Path(ex.check_best_k.__code__.co_filename).read_text()
    imported = {node.module or "" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not any("_reference" in m or "_hidden" in m for m in imported), imported


@pytest.mark.parametrize("name", sorted(hidden.HIDDEN))
def test_hidden_cases_pass_the_reference_and_fail_a_mistake(name):
    mistakes = {"check_verify_packed_step": no_bonus, "check_plan_step": drafts_free,
                "check_long_prompt_steps": steps_drafts_free, "check_speculative_sample": accept_every_draft,
                "check_best_k": best_k_without_bonus}
    for kwargs in hidden.HIDDEN[name]:
        getattr(ex, name)(CORRECT[name], **kwargs)
    with pytest.raises(ExerciseFailed):
        getattr(ex, name)(mistakes[name], **hidden.HIDDEN[name][0])


def test_hidden_reference_checks():
    hidden.hidden_check_verify_packed_step(ref.verify_packed_step)
    hidden.hidden_check_long_prompt_steps(ref.predict_long_prompt_steps)
    with pytest.raises(ExerciseFailed):
        hidden.hidden_check_long_prompt_steps(steps_drafts_free)
