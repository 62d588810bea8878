"""Chapter 5's checkers: a correct answer passes, every shortcut fails with a message that
names the mistake, and the chapter's own printed code does not pass the transfer tasks.

For each checker, a correct function and shortcut attempts: the engine's own function,
skipping the method, a hard-coded value, wrong-but-close variants, and (for the tasks
that go past the chapter) the code the chapter prints, adapted to the task's signature.
A last test holds that a learner who copies the chapter's printed code can earn at most
half of each chapter's points. (Chapters 6-8's checkers are tested in tests/test_grading_ch06_10.py.)
"""
import ast
import random
import re
from pathlib import Path

import pytest

import minillm
import minillm.grading as ex
from minillm.grading import ch05
from minillm.grading._reference import ch05 as ref05
from minillm.sim.accounting import step_cost

ROOT = Path(__file__).resolve().parents[1]


def printed(chapter: str, name: str):
    """A function the chapter prints, taken from its source (notebooks/src/NN_*.py) and
    defined here on its own, as a learner who copies it would have it."""
    source = next((ROOT / "notebooks" / "src").glob(f"{chapter}_*.py")).read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = {}
    module = ast.fix_missing_locations(ast.Module(
        [ast.Import([ast.alias("hashlib")]), ast.ImportFrom("array", [ast.alias("array")], 0), node], []))
    exec(compile(module, f"<chapter {chapter}>", "exec"), namespace)
    return namespace[name]


# ---- correct answers (the tests' own; the notebooks have theirs) --------------------------
def layer_flops(cfg, n, c, window=None):
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    gemm = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 4 * n * d * inter + 2 * n * inter * d
    pairs = sum(p + 1 if window is None else min(p + 1, window) for p in range(c, c + n))
    return gemm + 4 * pairs * cfg.head_dim * cfg.num_heads


def kv_bytes(cfg, dtype_bytes):
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


def step_traffic(cfg, requests, dtype_bytes, lm_head=True):
    sampled = sum(1 for r in requests if len(r) == 2 or r[2])
    d, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    flops = cfg.num_layers * sum(layer_flops(cfg, r[0], r[1]) for r in requests) \
        + (2 * sampled * d * cfg.vocab_size if lm_head else 0)
    weights = (cfg.num_layers * (d * (q + 2 * kv) + q * d + 3 * d * inter) + (d * cfg.vocab_size if sampled else 0)) \
        * dtype_bytes
    read = sum(r[1] for r in requests) * kv_bytes(cfg, dtype_bytes)
    write = sum(r[0] for r in requests) * kv_bytes(cfg, dtype_bytes)
    return {"flops": flops, "bytes_weights": weights, "bytes_kv_read": read, "bytes_kv_write": write,
            "intensity": flops / (weights + read + write)}


def tile_chunk(num_decodes, chunk_size, tile_rows):
    return (num_decodes + chunk_size) // tile_rows * tile_rows - num_decodes


def _traffic_from(cost):
    return {"flops": cost.flops, "bytes_weights": cost.bytes_weights, "bytes_kv_read": cost.bytes_kv_read,
            "bytes_kv_write": cost.bytes_kv_write, "intensity": cost.intensity}


def _no_window(cfg, n, c, window=None):
    """Chapter 5's printed sketch, which counts full causal attention."""
    return printed("05", "layer_flops_sketch")(cfg, n, c)


# ---- the table: checker, correct answer, shortcuts (name, function, what the message says) --
CASES = {
    "check_layer_flops": (layer_flops, [
        ("engine", lambda cfg, n, c, w=None: step_cost(cfg, [(n, c, False)]).flops // cfg.num_layers,
         "engine's own answer"),
        ("chapter_sketch", _no_window, "without the window"),
        ("same_keys_per_query", lambda cfg, n, c, w=None: layer_flops(cfg, n, c) if w is None else
         layer_flops(cfg, n, c) - 4 * cfg.head_dim * cfg.num_heads * (sum(p + 1 for p in range(c, c + n))
                                                                       - n * min(w, c + n)), "same number of keys"),
        ("window_off_by_one", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, None if w is None else w + 1),
         "INCLUDING its own"),
        ("window_on_cache_only", lambda cfg, n, c, w=None: layer_flops(cfg, n, c) if w is None else
         layer_flops(cfg, n, 0) + 4 * n * min(c, w) * cfg.head_dim * cfg.num_heads, "cached or new"),
        ("one_flop_per_mac", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w) // 2, "2*M*N*K"),
        ("kv_heads", lambda cfg, n, c, w=None: layer_flops(cfg, n, c, w) if w is not None else layer_flops(cfg, n, c)
         - 4 * (n * c + n * (n + 1) // 2) * cfg.head_dim * (cfg.num_heads - cfg.num_kv_heads), "QUERY head"),
        ("reference", lambda cfg, n, c, w=None: ref05.window_layer_flops(cfg, n, c, w), "engine's own answer"),
    ]),
    "check_kv_bytes_per_token": (kv_bytes, [
        ("engine", lambda cfg, d: cfg.kv_bytes_per_token(d), "engine's own answer"),
        ("k_only", lambda cfg, d: kv_bytes(cfg, d) // 2, "K only"),
        ("one_layer", lambda cfg, d: kv_bytes(cfg, d) // cfg.num_layers, "one layer"),
        ("query_heads", lambda cfg, d: 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * d, "query heads"),
    ]),
    "check_step_traffic": (step_traffic, [
        ("engine", lambda cfg, r, d: _traffic_from(step_cost(cfg, r, d)), "engine's own answer"),
        ("no_lm_head", lambda cfg, r, d: step_traffic(cfg, r, d, lm_head=False), "LM head"),
        ("with_activations", lambda cfg, r, d: {**step_traffic(cfg, r, d), "intensity": 0.9
                                                * step_traffic(cfg, r, d)["intensity"]}, "intensity"),
    ]),
    "check_tile_aligned_chunk": (tile_chunk, [
        ("untrimmed", lambda n, c, t: c, "which rows does the GEMM see"),
        ("chunk_rounded", lambda n, c, t: c // t * t, "rounded the chunk to the tile"),
        ("every_decode_out", lambda n, c, t: c - n, "only the rows that spill"),
        ("rounded_up", lambda n, c, t: -(-(n + c) // t) * t - n, "over chunk_size"),
        ("a_tile_too_few", lambda n, c, t: max(tile_chunk(n, c, t) - t, tile_chunk(n, c, t)) if n + c < 2 * t
         else tile_chunk(n, c, t) - t, "not the largest"),
        ("reference", lambda n, c, t: ref05.tile_aligned_chunk(n, c, t), "engine's own answer"),
    ]),
}

# The chapters' printed code, adapted to a task's signature, on the tasks that go past the chapter.
PRINTED_ON_TRANSFER = [
    ("check_layer_flops", _no_window),
    ("check_tile_aligned_chunk", lambda n, c, t: c),                          # chapter 5 sizes the chunk alone
]

# Per chapter, the tasks a learner can finish by copying what the chapter prints (its
# sketches, the engine code it renders, its formulas in prose): at most half the points.
COPYABLE = {
    "05": {"check_kv_bytes_per_token", "check_step_traffic"},
}
MODULES = {"05": ch05}


def test_every_chapter_5_checker_is_tested_here():
    for module in MODULES.values():
        assert set(module.__all__) <= set(CASES), f"{module.__name__}: a checker without a case here"
    assert set(CASES) == {name for module in MODULES.values() for name in module.__all__}


@pytest.mark.parametrize("checker", sorted(CASES))
def test_a_correct_answer_passes(checker, capsys):
    assert getattr(ex, checker)(CASES[checker][0], seed=3) is None
    out = capsys.readouterr().out
    assert out.startswith("✓") and out.count("\n") == 1, out


SHORTCUTS = [(checker, name, fn, says) for checker, (_, attempts) in sorted(CASES.items())
             for name, fn, says in attempts]


@pytest.mark.parametrize("checker, name, fn, says", SHORTCUTS, ids=[f"{c}-{n}" for c, n, _, _ in SHORTCUTS])
def test_a_shortcut_fails_with_a_helpful_message(checker, name, fn, says, capsys):
    with pytest.raises(AssertionError) as failure:
        getattr(ex, checker)(fn, seed=3)
    first_line = str(failure.value).splitlines()[0]
    assert says in first_line, f"{checker} on {name!r}: the message does not point at the mistake: {first_line}"
    assert failure.value._render_traceback_()[0] == "Not yet: " + first_line
    assert "Not yet" not in capsys.readouterr().out


@pytest.mark.parametrize("checker, fn", PRINTED_ON_TRANSFER, ids=[c for c, _ in PRINTED_ON_TRANSFER])
def test_the_chapters_printed_code_does_not_pass_the_transfer_tasks(checker, fn):
    with pytest.raises(AssertionError):
        getattr(ex, checker)(fn)
    with pytest.raises(AssertionError):
        getattr(ex, checker)(fn, seed=11)


def test_the_chapters_sketches_still_are_what_the_transfer_tests_copy():
    # if a chapter renames or drops what it prints, the copies above must follow it
    sketch = printed("05", "layer_flops_sketch")
    cfg = minillm.ModelConfig.preset("llama-3-8b")
    assert sketch(cfg, 512, 1024) == layer_flops(cfg, 512, 1024)


def _points(chapter: str) -> dict:
    source = next((ROOT / "exercises" / "solutions" / "src").glob(f"{chapter}_*.py")).read_text()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"ex\.(check_\w+)\(.*#\s*points:\s*(\d+)", source)}


@pytest.mark.parametrize("chapter", sorted(COPYABLE))
def test_copying_the_chapter_earns_at_most_half_the_points(chapter):
    points = _points(chapter)
    assert set(points) == set(MODULES[chapter].__all__), "every checker is a graded task of its notebook"
    transfer = set(points) - COPYABLE[chapter]
    assert transfer & {c for c, _ in PRINTED_ON_TRANSFER}, "a transfer task the printed code is tried on"
    assert sum(points[c] for c in COPYABLE[chapter]) * 2 <= sum(points.values())


@pytest.mark.parametrize("chapter", sorted(COPYABLE))
def test_each_chapter_has_a_predict_then_measure_task(chapter):
    measured = {"05": "check_tile_aligned_chunk"}[chapter]
    assert measured in _points(chapter) and measured not in COPYABLE[chapter]


# ---- the references and the measurements the checkers rest on --------------------------------
def test_the_window_pairs_match_a_brute_force_count():
    rng = random.Random(0)
    for _ in range(300):
        n, c = rng.randint(1, 60), rng.randint(0, 80)
        window = rng.choice([None, rng.randint(1, 150)])
        brute = sum(1 for q in range(c, c + n) for k in range(q + 1) if window is None or q - k < window)
        assert ref05.window_pairs(n, c, window) == brute


def test_reference_step_traffic_equals_the_accounting_module():
    rng = random.Random(1)
    for cfg in ch05._random_configs(rng, 10):
        requests = [(rng.randint(1, 600), rng.randint(0, 3000), rng.random() < 0.5) for _ in range(rng.randint(1, 5))]
        cost, traffic = step_cost(cfg, requests, 2), ref05.step_traffic(cfg, requests, 2)
        assert (cost.flops, cost.bytes_weights, cost.bytes_kv_read, cost.bytes_kv_write) == \
            (traffic["flops"], traffic["bytes_weights"], traffic["bytes_kv_read"], traffic["bytes_kv_write"])
        n, c = requests[0][:2]
        assert ref05.layer_flops(cfg, n, c) == step_cost(cfg, [(n, c, False)]).flops // cfg.num_layers
        assert ref05.window_layer_flops(cfg, n, c, None) == ref05.layer_flops(cfg, n, c)


def test_the_a100_profiles_show_the_128_row_tile_the_statement_quotes():
    tables = ch05._a100_linear_ms()
    assert len(tables) == 4
    llama3 = tables["Meta-Llama-3-8B"]
    assert round(llama3[128], 3) == 0.377 and round(llama3[136], 3) == 0.529     # quoted in the statement
    for ms in tables.values():                                                    # every A100 file jumps there
        for boundary in (128, 256, 384, 512):
            assert ms[boundary + 8] > 1.1 * ms[boundary]


