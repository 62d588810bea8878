"""model_runner.py: packing a step, decoding with the cache."""
import pytest
import torch

import minillm
from minillm import prefill_kv
from minillm.config import ModelConfig
from minillm.kv_cache import BlockManager
from minillm.model_runner import ModelRunner, StepChunk

CFG = ModelConfig(name="small", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2,
                  num_heads=4, num_kv_heads=2, max_position=256)


@pytest.fixture(scope="module")
def model64():
    model = minillm.build_model(CFG, seed=0, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(10)      # sharper attention: a wrong cache read would show
    return model


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_decoding_with_the_cache_equals_recomputing_from_scratch(model64, backend):
    prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(0)).tolist()
    blocks = BlockManager(num_blocks=8, block_size=4)
    runner = ModelRunner(model64, blocks, backend=backend)
    blocks.allocate("r", len(prompt))
    logits = runner.execute([StepChunk("r", prompt, num_cached=0)])[0]
    tokens = list(prompt)
    for _ in range(12):
        _, fresh = prefill_kv(model64, tokens, backend=backend)
        assert (logits - fresh[-1]).abs().max() <= 1e-10
        next_token = int(logits.argmax())
        blocks.allocate("r", len(tokens) + 1)
        logits = runner.execute([StepChunk("r", [next_token], num_cached=len(tokens))])[0]
        tokens.append(next_token)
    kv_cached = runner.kv_cache.gather(blocks.block_tables["r"], len(tokens) - 1)
    kv_fresh, _ = prefill_kv(model64, tokens[:-1], backend=backend)
    assert (kv_cached - kv_fresh).abs().max() <= 1e-10


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_a_packed_step_of_prefill_chunks_and_decodes_equals_each_request_alone(model64, backend):
    gen = torch.Generator().manual_seed(1)
    prompts = {r: torch.randint(0, 64, (n,), generator=gen).tolist()
               for r, n in (("a", 13), ("b", 5), ("c", 7), ("d", 20))}
    blocks = BlockManager(num_blocks=40, block_size=4)
    runner = ModelRunner(model64, blocks, backend=backend)
    # Cache a prefix of every request, then run one mixed step:
    # a and d are mid-prefill chunks, b and c decode one token each.
    cached = {"a": 6, "b": 4, "c": 6, "d": 0}
    new = {"a": 4, "b": 1, "c": 1, "d": 11}
    for r, p in prompts.items():
        blocks.allocate(r, cached[r] + new[r])
        if cached[r]:
            runner.execute([StepChunk(r, p[:cached[r]], 0, sample=False)])
    step = [StepChunk(r, prompts[r][cached[r]:cached[r] + new[r]], cached[r]) for r in "abcd"]
    logits = runner.execute(step)
    assert logits.shape == (4, 64)
    for row, r in enumerate("abcd"):
        _, alone = prefill_kv(model64, prompts[r][:cached[r] + new[r]], backend=backend)
        assert (logits[row] - alone[-1]).abs().max() <= 1e-10


def test_execute_returns_only_the_sampled_rows_unless_all_logits(model64):
    blocks = BlockManager(num_blocks=4, block_size=4)
    runner = ModelRunner(model64, blocks)
    blocks.allocate(0, 5)
    blocks.allocate(1, 3)
    chunks = [StepChunk(0, [1, 2, 3, 4, 5], 0, sample=False), StepChunk(1, [6, 7, 8], 0)]
    assert runner.execute(chunks).shape == (1, 64)
    assert runner.execute(chunks, all_logits=True).shape == (8, 64)


def test_prepare_packs_absolute_positions_and_the_slot_mapping(model64):
    blocks = BlockManager(num_blocks=6, block_size=4)
    runner = ModelRunner(model64, blocks)
    blocks.allocate("x", 7)          # blocks 0, 1
    blocks.allocate("y", 2)          # block 2
    token_ids, positions, batch, logits_indices = runner.prepare(
        [StepChunk("x", [5, 6, 7], num_cached=4), StepChunk("y", [9], num_cached=1)])
    assert token_ids.tolist() == [5, 6, 7, 9]
    assert positions.tolist() == [4, 5, 6, 1]
    assert batch.slot_mapping.tolist() == [4, 5, 6, 9]
    assert batch.seq_lens == [7, 2] and logits_indices.tolist() == [2, 3]
