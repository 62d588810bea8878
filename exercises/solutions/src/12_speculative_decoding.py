# %% [markdown]
# # Exercises 12: speculative decoding inside the token budget
#
# Five functions around chapter 12: verify the drafts of a whole packed step, plan a step
# where drafts and a prompt's chunk share the budget, predict how long a prompt's prefill
# takes among speculating streams (then the engine measures it), sample speculatively
# without changing the distribution, and choose k. Each checker compares your function
# with the engine (its verification, its scheduler, its steps) on fresh cases, with the
# engine's own answers switched off while yours runs. Fill in the bodies where it says
# `raise NotImplementedError`.

# %%
import math

import torch

import minillm.grading as ex

# %% [markdown]
# ## 1. Verify a packed step
#
# One forward pass ran a packed step; `logits` holds **every** row of it (`[T, vocab]`),
# request after request, `query_lens[i]` rows for request `i`. `drafts[i]` says what
# request `i` was:
#
# * a list of draft tokens (possibly empty): the request was decoding; its rows are its
#   pending token followed by those drafts (so `query_lens[i] == 1 + len(drafts[i])` for
#   a decode, but a prompt's **last** chunk also comes with `[]` and several rows: it
#   emits the token predicted by its last row);
# * `None`: a chunk in the middle of a prompt; it emits nothing.
#
# Return, per request, the tokens greedy speculative decoding emits. The engine runs
# this rule one request at a time on the rows it asked for; here you find each request's
# rows yourself. You may not call the engine's verification (chapter 12 shows only its
# contract).
#
# <details><summary>Hint</summary>
#
# Walk the requests with a running row offset. Which of a request's rows predict the
# token after each draft, and which predicts the token after the last one? Then: how many
# tokens does a verification emit when its second draft is the first wrong one, and which
# token is the last of them?
#
# </details>

# %%
def verify_packed_step(logits, query_lens, drafts):
    ### BEGIN SOLUTION
    emitted, start = [], 0
    for n, request_drafts in zip(query_lens, drafts):
        rows = logits[start:start + n]
        start += n
        if request_drafts is None:
            emitted.append([])
            continue
        targets = rows[n - 1 - len(request_drafts):].argmax(dim=-1).tolist()
        out = []
        for draft, target in zip(request_drafts, targets):
            out.append(target)
            if target != draft:
                break
        else:
            out.append(targets[len(request_drafts)])
        emitted.append(out)
    return emitted
    ### END SOLUTION


# %%
ex.check_verify_packed_step(verify_packed_step)  # points: 3

# %% [markdown]
# ## 2. Plan a step: drafts and a chunk share one budget
#
# Streams are decoding and one prompt is waiting, with `prompt_left` tokens still to
# prefill. `stream_drafts[i]` is how many drafts stream `i`'s drafter proposes this step.
# Plan the step as the engine does under vLLM V1's order with `token_budget` tokens in all:
#
# * every stream gets its own pending token first (whatever the drafts);
# * then the streams' drafts, stream after stream, each cut to what the budget has left;
# * then the prompt's chunk: at most `chunk_size`, at most what is left of the prompt and
#   of the budget.
#
# `token_budget` is always more than the number of streams (the engine refuses a budget
# below its running requests). Return `(drafts, chunk)`: a list with the number of drafts
# scheduled for each stream, and the chunk's tokens. Work it out from the rules; the checker runs the engine's
# scheduler on the same state.
#
# <details><summary>Hint</summary>
#
# Keep one number, the budget still free, and let each stage take from it in turn. How
# much is free before the first draft is scheduled?
#
# </details>

# %%
def plan_step(stream_drafts, prompt_left, token_budget, chunk_size):
    ### BEGIN SOLUTION
    free = token_budget - len(stream_drafts)
    scheduled = []
    for proposed in stream_drafts:
        take = max(0, min(proposed, free))
        scheduled.append(take)
        free -= take
    return scheduled, max(0, min(chunk_size, prompt_left, free))
    ### END SOLUTION


# %%
ex.check_plan_step(plan_step)  # points: 2

# %% [markdown]
# ## 3. Predict, then measure: a long prompt among speculating streams
#
# `num_streams` streams decode and each verifies exactly `k` drafts every step (their
# drafter always has k to offer, and they outlive the prompt). A prompt of `prompt_len`
# tokens arrives. Predict how many steps it takes from its arrival to its first token,
# with `token_budget` tokens a step, chunks of at most `chunk_size`, and the drafts placed
# by `draft_budget`:
#
# * `"drafts_first"` (vLLM V1): the streams' tokens and drafts are scheduled before the
#   prompt's chunk;
# * `"chunk_first"`: the streams' own tokens, then the chunk, then the drafts get what is left.
#
# Return `math.inf` when the prompt gets no token at all while the streams run. The
# checker then runs the engine's steps and compares the count exactly; you may not run the
# engine. (Chapter 12, section 5 ran one such case.)
#
# <details><summary>Hint</summary>
#
# Every step of the prefill gets the same chunk (but the last). What is that chunk under
# each placement, and when is it zero?
#
# </details>

# %%
def long_prompt_steps(prompt_len, num_streams, k, token_budget, chunk_size, draft_budget):
    ### BEGIN SOLUTION
    first = num_streams * (1 + k) if draft_budget == "drafts_first" else num_streams
    chunk = min(chunk_size, token_budget - first)
    return math.inf if chunk <= 0 else math.ceil(prompt_len / chunk)
    ### END SOLUTION


# %%
ex.check_long_prompt_steps(long_prompt_steps)  # points: 2
print(f"8 streams at k = 4, budget 256: the 2048-token prompt takes {long_prompt_steps(2048, 8, 4, 256, 256, 'drafts_first')} "
      f"steps, against {long_prompt_steps(2048, 8, 0, 256, 256, 'drafts_first')} at k = 0")

# %% [markdown]
# ## 4. Speculative sampling with prompt-lookup drafts
#
# At temperature > 0 the engine must emit tokens with exactly the target's distribution.
# `probs` is `[k + 1, vocab]`: row `i` is the target's sampling distribution at the
# position of draft `i` (row `k`: after the last draft); `drafts` are the k proposed
# tokens, each a point mass (prompt lookup proposes one token, with certainty). Return the
# emitted tokens, drawing every random number from `generator` (`torch.rand(...,
# generator=generator)`, `torch.multinomial(..., generator=generator)`), so that one seed
# replays a run. The checker draws thousands of times and compares the distributions of
# your tokens with `probs`; it also replays one seed. (Chapter 12 prints the engine's
# sampler only up to its acceptance probability.)
#
# <details><summary>Hint</summary>
#
# Start from Leviathan et al.'s rule (accept with min(1, p(d) / q(d)); on a rejection,
# sample the residual max(0, p - q), renormalised) and ask what q is here. After how
# many rejections do you stop, and what is emitted when nothing was rejected?
#
# </details>

# %%
def speculative_sample(probs, drafts, generator):
    ### BEGIN SOLUTION
    out = []
    for i, draft in enumerate(drafts):
        p = probs[i]
        if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(p[draft]):
            out.append(int(draft))
            continue
        without_draft = p.clone()
        without_draft[draft] = 0
        out.append(int(torch.multinomial(without_draft, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[len(drafts)], 1, generator=generator)))
    return out
    ### END SOLUTION


# %%
ex.check_speculative_sample(speculative_sample)  # points: 2

# %% [markdown]
# ## 5. Choose k
#
# Each draft is accepted with probability `alpha` until the first rejection, and a
# verification of k drafts takes `step_time_s(k)` seconds (a function you are given: the
# longer the chunk, the longer the step, sometimes with a jump where a CUDA graph's capture
# size ends). Return the k in `0..max_k` that emits the most tokens per second (the
# smallest such k on a tie). Write the expected tokens per verification yourself: the
# engine's formula is switched off while your function runs.
#
# <details><summary>Hint</summary>
#
# Count what one verification emits on average: the accepted drafts, and what else?
# Then it is a search over a handful of k.
#
# </details>

# %%
def best_k(alpha, step_time_s, max_k):
    ### BEGIN SOLUTION
    def tokens_per_second(k):
        expected = sum(alpha ** i for i in range(k + 1))
        return expected / step_time_s(k)
    rates = [tokens_per_second(k) for k in range(max_k + 1)]
    top = max(rates)
    return next(k for k, rate in enumerate(rates) if rate >= top * (1 - 1e-12))
    ### END SOLUTION


# %%
ex.check_best_k(best_k)  # points: 1
print("alpha 0.7, a step 2% longer per draft: k =", best_k(0.7, lambda k: 0.02 * (1 + 0.02 * k), 16))

# %% [markdown]
# Done: the packed verification, the budget rule, the cost of drafts to a long prompt,
# an exact sampler, and a k chosen by its cost.
