"""vLLM's knobs for short prompts stuck behind a long one, with vLLM's meanings."""
import pytest
import torch

import minillm
from minillm import LLMEngine, SamplingParams
from minillm.kv_cache import BlockManager
from minillm.request import Request
from minillm.scheduler import Scheduler, SchedulerConfig
from minillm.sim.chat_workloads import long_then_short
from minillm.sim.simulator import simulate


@pytest.mark.parametrize("kwargs, arg", [
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
    (dict(long_prefill_token_threshold=2.5), "long_prefill_token_threshold"),
    (dict(max_num_partial_prefills=0), "max_num_partial_prefills"),
    (dict(max_long_partial_prefills=0), "max_long_partial_prefills"),
    (dict(max_num_partial_prefills=2, max_long_partial_prefills=3), "max_long_partial_prefills"),
    (dict(policy="prefill_first", long_prefill_token_threshold=64), "long_prefill_token_threshold"),
    (dict(policy="decode_first", max_num_partial_prefills=2), "max_num_partial_prefills"),
])
def test_bad_knobs_are_value_errors_naming_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        SchedulerConfig(**kwargs)


def test_threshold_defaults_to_four_percent_of_the_context_with_partial_prefills():
    assert SchedulerConfig().long_prefill_threshold(8192) == 0
    assert SchedulerConfig(max_num_partial_prefills=2).long_prefill_threshold(8192) == 327
    assert SchedulerConfig(max_num_partial_prefills=2, long_prefill_token_threshold=100).long_prefill_threshold(8192) == 100


def waiting_scheduler(config, prompt_lens, num_blocks=1000):
    sched = Scheduler(config, BlockManager(num_blocks, 16), max_model_len=100_000)
    requests = [Request(i, None, SamplingParams(max_tokens=4), 0.0, prompt_len=n) for i, n in enumerate(prompt_lens)]
    for r in requests:
        sched.add(r)
    return sched, requests


def advance(step):
    for r, n in step.scheduled:
        r.num_computed_tokens += n
        if r.num_computed_tokens == r.num_tokens:
            r.output_token_ids.append(0)


def test_threshold_caps_one_requests_tokens_and_gives_the_rest_to_the_queue():
    sched, (long, *shorts) = waiting_scheduler(
        SchedulerConfig(chunk_size=512, long_prefill_token_threshold=128), [5000, 64, 64, 64])
    step = sched.schedule()
    got = {r.request_id: n for r, n in step.scheduled}
    assert got == {0: 128, 1: 64, 2: 64, 3: 64}          # FCFS would give the long prompt all 512


def test_fcfs_default_lets_the_long_prompt_take_the_whole_chunk():
    sched, _ = waiting_scheduler(SchedulerConfig(chunk_size=512), [5000, 64, 64])
    assert [(r.request_id, n) for r, n in sched.schedule().scheduled] == [(0, 512)]


def test_partial_prefills_share_the_chunk_and_shorts_overtake_a_second_long():
    config = SchedulerConfig(chunk_size=512, max_num_partial_prefills=3, max_long_partial_prefills=1,
                             long_prefill_token_threshold=1000)
    sched, requests = waiting_scheduler(config, [5000, 4000, 100, 100, 100])
    step = sched.schedule()
    got = {r.request_id: n for r, n in step.scheduled}
    assert set(got) == {0, 2, 3}                          # the second long prompt waits; shorts jump it
    assert got[0] == 512 // 3 and got[2] == 100 and got[3] == 100
    for _ in range(40):                                   # never more than 3 mid-prefill, 1 long
        advance(step)
        step = sched.schedule()
        prefilling = [r for r, _ in step.scheduled if not r.is_decoding]
        assert len(prefilling) <= 3
        assert sum(r.num_uncomputed_tokens > 1000 for r in prefilling) <= 1


def test_knobs_change_no_greedy_token_on_the_real_engine():
    model = minillm.build_model("tiny", seed=0, dtype=torch.float64, device="cpu")
    prompts = [list(range(1, 200)), [5] * 20, [7] * 30, [9] * 12]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    outs = []
    for config in (SchedulerConfig(chunk_size=64),
                   SchedulerConfig(chunk_size=64, long_prefill_token_threshold=24),
                   SchedulerConfig(chunk_size=64, max_num_partial_prefills=3, long_prefill_token_threshold=40)):
        outs.append([o.output_token_ids for o in LLMEngine(model, config).generate(prompts, params)])
    assert outs[0] == outs[1] == outs[2]


def test_short_prompts_stop_waiting_for_the_long_one_and_the_long_one_pays():
    wl = long_then_short(long_len=6000, num_short=6, short_len=64, output_len=8)
    run = lambda config: simulate(wl, config, model="llama-3-8b", hardware="H100-SXM").summary()
    fcfs = run(SchedulerConfig(chunk_size=512))
    capped = run(SchedulerConfig(chunk_size=512, long_prefill_token_threshold=256))
    partial = run(SchedulerConfig(chunk_size=512, max_num_partial_prefills=4))
    for knob in (capped, partial):
        assert knob["short"]["ttft"]["max"] < 0.3 * fcfs["short"]["ttft"]["mean"]
        assert knob["long"]["ttft"]["max"] > fcfs["long"]["ttft"]["max"]
