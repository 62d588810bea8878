"""`python -m minillm bench invariant` (chapter 11): what a run holds, on small workloads
(~10 s, most of it SmolLM2's weights). The measured numbers live in
data/ch11_invariant_cost.json and the README; timings are never asserted here."""
from minillm.book import bench_invariant


def test_bench_invariant_measures_every_workload_in_both_modes():
    r = bench_invariant.bench_invariant_cost(rounds=2, num_chats=2, max_tokens=4, interference_shapes=("tiny", "gqa2"),
                                             prompt_len=96, num_decoders=2, progress=False)
    assert [k for k in r if k == "chats" or k.startswith("interference")] == ["chats", "interference",
                                                                              "interference_gqa2"]
    for name in ("chats", "interference", "interference_gqa2"):
        rows = r[name]["rounds"]
        assert len(rows) == 2
        for row in rows:     # both modes served the same work (greedy, same stops)
            assert row["default_tokens"] == row["invariant_tokens"] > 0
            assert row["slowdown"] == row["default_tok_s"] / row["invariant_tok_s"]
        for key in ("slowdown", "cpu_slowdown"):
            low, high = r[name][key + "_range"]
            assert low <= r[name][key] <= high
    assert r["interference_gqa2"]["shape"] == "gqa2" and r["loadavg_before"] and r["loadavg_after"]
    text = bench_invariant.report(r)
    assert text.count("batch_invariant") == 3 and "gqa2 model, 2 streams + a 96-token prompt" in text
