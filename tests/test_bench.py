"""The benchmarks run end to end on a small case (their numbers live in docs/benchmarks.md)."""
import math
import pytest
import torch

from minillm.book import bench


def test_chunk_cost_times_the_engine_path_and_predicts_from_the_step_floor():
    r = bench.bench_chunk_cost("gqa2", prompt_len=128, chunk_sizes=(64, 32), num_decodes=2, repeats=1)
    assert set(r["chunks_over_whole"]) == {"C=64", "C=32", "C=64 + 2 decodes"}
    assert all(ratio > 0 for ratio in r["chunks_over_whole"].values())
    assert r["step_floor_s"] > 0 and r["whole_prefill_s"] > 0 and r["hf_step_floor_s"] > 0
    # More steps, more fixed costs: the prediction grows as the chunk shrinks.
    assert 1 < r["predicted"]["C=64"] < r["predicted"]["C=32"]
    # The matmul part: the whole prompt's matmul time, and the chunks' pace against it,
    # added on top of the fixed costs.
    m = r["matmuls"]
    assert m["whole_s"] > 0 and set(m["chunked_over_whole"]) == {"C=64", "C=32"}
    for name, ratio in m["chunked_over_whole"].items():
        assert r["predicted_with_matmuls"][name] == pytest.approx(
            r["predicted"][name] + m["whole_s"] * (ratio - 1) / r["whole_prefill_s"])


def test_matmul_rows_times_the_same_rows_whole_and_in_chunks():
    model = bench.bench_model("gqa2")
    m = bench.bench_matmul_rows(model, 256, (64,), repeats=1)
    assert m["whole_s"] > 0
    assert m["chunked_over_whole"]["C=64"] > 0


def test_prefill_seconds_returns_the_cache_it_used():
    model = bench.bench_model("gqa2")
    runner = bench._runner(model, 64)
    free = runner.block_manager.num_free_blocks
    tokens = list(range(64))
    assert bench._prefill_seconds(runner, tokens, 16) > 0
    assert runner.block_manager.num_free_blocks == free


def test_interference_rounds_report_medians_and_the_range_of_each_headline():
    r = bench.bench_interference(prompt_len=96, num_decoders=2, chunk_sizes=(32, 256), shape="gqa2",
                                 progress=False, rounds=3)
    assert r["rounds"] == 3
    assert [row["policy"] for row in r["rows"]] == ["prefill_first", "decode_first", "chunked", "chunked"]
    for key, value in r["chunked256_vs_prefill_first"].items():
        low, high = r["headline_spread"][key]
        assert 0 < low <= value <= high


def test_interference_races_both_chunk_sizings_in_each_round():
    r = bench.bench_interference(prompt_len=96, num_decoders=2, chunk_sizes=(32,), shape="gqa2",
                                 progress=False, chunk_sizings=("fixed", "equal_work"))
    assert [(row["policy"], row["sizing"]) for row in r["rows"]] == [
        ("prefill_first", "-"), ("decode_first", "-"), ("chunked", "fixed"), ("chunked", "equal_work")]
    assert set(r["by_sizing"]) == {"fixed", "equal_work"}
    assert r["chunked256_vs_prefill_first"] == r["by_sizing"]["fixed"]["chunked256_vs_prefill_first"]


def test_rounds_below_one_are_refused_naming_the_argument():
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="rounds="):
            bench.bench_interference(shape="gqa2", rounds=bad, progress=False)
        with pytest.raises(ValueError, match="rounds="):
            bench.bench_hf(shape="gqa2", rounds=bad)


def test_median_row_takes_each_number_across_rounds_and_keeps_the_labels():
    runs = [{"policy": "chunked", "chunk_size": 256, "itl_max_s": t, "steps": 41} for t in (0.3, 0.1, 0.2)]
    assert bench._median_row(runs) == {"policy": "chunked", "chunk_size": 256, "itl_max_s": 0.2, "steps": 41}


@pytest.mark.timing
def test_hf_race_rounds_report_the_median_speedup_within_its_range_and_identical_tokens():
    r = bench.bench_hf(num_requests=3, shape="gqa2", rounds=2)
    low, high = r["speedup_spread"]
    assert r["rounds"] == 2 and 0 < low <= r["speedup"] <= high
    assert r["identical_requests"] == 3 and r["first_mismatch"] is None
    k = r["minillm_steps"]                      # the last round's steps, by kind
    assert k["prefill_steps"] >= 1 and k["decode_steps"] >= 1 and k["prompt_tokens"] >= 3 * 32
    assert 0.5 * k["wall_s"] < k["prefill_s"] + k["decode_s"] <= k["wall_s"]     # steps are most of the run


def test_bench_steps_times_each_step_on_both_sides_of_the_allocator_setting():
    from minillm.book.bench_steps import bench_steps, report

    r = bench_steps("gqa2", processes=1, repeats=1, steps={"decode 2 x 40": [(1, 40)] * 2, "prefill 24": [(24, 0)]})
    assert [row["step"] for row in r["rows"]] == ["decode 2 x 40", "prefill 24"]
    for row in r["rows"]:
        assert row["before_s"] > 0 and row["after_s"] > 0
        assert row["after_over_before"] == pytest.approx(row["after_s"] / row["before_s"])
    assert "prefill 24" in report(r)
    with pytest.raises(ValueError, match="processes=0"):
        bench_steps("gqa2", processes=0)


def test_bench_model_offers_the_real_model_by_name_and_names_it_when_refusing():
    model = bench.bench_model("smollm2")
    assert model.cfg.num_layers == 30 and model.dtype == torch.float32
    # the headline names it from the GGUF's header, without loading the weights a second time
    assert bench._describe("smollm2") == (f"hidden {model.cfg.hidden_size}, {model.cfg.num_heads} query heads / "
                                          f"{model.cfg.num_kv_heads} KV heads, head_dim {model.cfg.head_dim}, 30 layers")
    with pytest.raises(ValueError, match=r"shape='nope'.*smollm2"):
        bench.bench_model("nope")


def test_break_even_measurement_reports_both_lengths():
    # timings are noisy: docs/benchmarks.md reports the measured lengths; here, what the result holds
    model = bench.bench_model("gqa2")
    r = bench.bench_break_even(model, chunk=64, num_cached=512, repeats=1)
    assert r["flops"] == model.cfg.attention_break_even_len and (r["chunk"], r["num_cached"]) == (64, 512)
    assert math.isfinite(r["measured"])


def test_median_row_takes_lists_position_by_position():
    runs = [{"long_prompt_steps_s": steps} for steps in ([0.3, 0.1], [0.1, 0.2], [0.2, 0.9])]
    assert bench._median_row(runs) == {"long_prompt_steps_s": [0.2, 0.2]}


def test_tables_fit_their_longest_cell_text_left_numbers_right():
    rows = [{"step": "chunk 256 over 1792 + 8 decodes over 2048", "ms": 47.31},
            {"step": "prefill 256", "ms": 5.0}]
    header, rule, *lines = bench._table(rows, [("step", "step", ""), ("ms", "time (ms)", ".1f")]).splitlines()
    assert len({len(header), len(rule), *map(len, lines)}) == 1          # every line as wide
    assert lines[1].startswith("prefill 256 ") and lines[1].endswith("  5.0")
    assert header.index("time (ms)") > len(rows[0]["step"])              # no cell runs into the next


def test_the_command_line_usage_lists_every_bench():
    from minillm.__main__ import USAGE

    listed = USAGE.split("bench [", 1)[1].split("]", 1)[0].split("|")
    assert listed == list(bench.BENCH_COMMANDS)


def test_compile_probe_counts_every_weight_but_the_embedding_table():
    from minillm.book import bench_compile

    model = bench.bench_model("gqa2")
    cfg = model.cfg
    embedding_bytes = cfg.vocab_size * cfg.hidden_size * 4                    # float32
    assert bench_compile.weight_read_bytes(model) == cfg.num_parameters() * 4 - embedding_bytes


def test_compile_probe_splits_each_layer_around_eager_attention_without_changing_the_logits():
    from minillm.book import bench_compile
    from minillm.prefill import prepare_step

    model = bench.bench_model("gqa2")
    traced = bench_compile.piecewise_compiled(model, backend="eager")     # traced, no code generated
    assert all(isinstance(layer, bench_compile._PiecewiseLayer) for layer in traced.model.layers)
    with torch.no_grad():
        for shape in ([(5, 0)], [(3, 16), (1, 9)]):                        # a prefill; a chunk and a decode
            torch.testing.assert_close(prepare_step(traced, shape)(), prepare_step(model, shape)())


def test_compile_probe_refuses_bad_rows_and_repeats_naming_them():
    from minillm.book import bench_compile

    with pytest.raises(ValueError, match="rows="):
        bench_compile.bench_compile_probe("gqa2", rows=(0,))
    with pytest.raises(ValueError, match="repeats="):
        bench_compile.bench_compile_probe("gqa2", repeats=0)


def test_every_command_of_the_command_line_answers_help():
    """Each command imports what it runs before parsing: --help catches a name that moved."""
    import subprocess
    import sys
    for args in (["figures", "--help"], ["serve", "--help"], ["bench", "serve", "--help"]):
        done = subprocess.run([sys.executable, "-m", "minillm", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"python -m minillm {' '.join(args)}: {done.stderr[-500:]}"
