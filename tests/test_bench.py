"""The benchmarks run end to end on a small case (their numbers live in the README)."""
from minillm.book import bench


def test_chunk_cost_times_the_engine_path_and_predicts_from_the_step_floor():
    r = bench.bench_chunk_cost("gqa2", prompt_len=128, chunk_sizes=(64, 32), num_decodes=2, repeats=1)
    assert set(r["chunks_over_whole"]) == {"C=64", "C=32", "C=64 + 2 decodes"}
    assert all(ratio > 0 for ratio in r["chunks_over_whole"].values())
    assert r["step_floor_s"] > 0 and r["whole_prefill_s"] > 0
    # More steps, more fixed costs: the prediction grows as the chunk shrinks.
    assert 1 < r["predicted"]["C=64"] < r["predicted"]["C=32"]


def test_prefill_seconds_returns_the_cache_it_used():
    model = bench.bench_model("gqa2")
    runner = bench._runner(model, 64)
    free = runner.block_manager.num_free_blocks
    tokens = list(range(64))
    assert bench._prefill_seconds(runner, tokens, 16) > 0
    assert runner.block_manager.num_free_blocks == free
