"""`python -m minillm bench spec` (chapter 12): what a run holds, on the tiny model (~3 s).
The measured numbers live in data/measured/bench_spec.json and the README; timings are
never asserted here."""
import torch

import minillm
from minillm.book import bench_spec
from minillm.tokenizer import ByteTokenizer


class ChatBytes(ByteTokenizer):
    def apply_chat_template(self, messages, add_generation_prompt=True):
        return self.encode(messages[-1]["content"])


def test_bench_spec_measures_every_k_and_the_long_prompt(capsys):
    model = minillm.build_model("tiny", seed=0, dtype=torch.float32)
    r = bench_spec.bench_spec(ks=(0, 2), rounds=2, num_requests=2, max_tokens=8, budgets=(64,),
                              long_prompt_len=100, model=model, tokenizer=ChatBytes(), num_one_at_a_time=1)
    for name in ("copy", "free"):
        assert [row["k"] for row in r["sweep_one_at_a_time"][name]] == [0, 2]
        assert r["sweep_one_at_a_time"][name][1]["tokens"] == 8
        rows = r["sweep"][name]
        assert [row["k"] for row in rows] == [0, 2]
        assert rows[0]["speedup"] == 1.0 and rows[0]["identical_texts"] == 2
        assert rows[1]["tokens"] == 2 * 8 and rows[1]["steps"] <= rows[0]["steps"]
        low, high = rows[1]["speedup_range"]
        assert low <= rows[1]["speedup"] <= high
    long = {row["k"]: row for row in r["long_prompt"]}
    assert long[0]["ttft_vs_k0"] == 1.0 and long[4]["steps"] >= long[0]["steps"]
    assert long[0]["first_chunks"][0] == 64 - 2 and long[4]["first_chunks"][0] <= 64 - 2
    bench_spec.report(r)
    out = capsys.readouterr().out
    assert "copy-heavy" in out and "free-form" in out and "long prompt (100 tokens)" in out
    assert "1 chats one at a time" in out


def test_the_committed_result_has_the_issue_s_sweep():
    r = bench_spec.load_committed()
    for name in ("copy", "free"):
        assert [row["k"] for row in r["sweep"][name]] == [0, 2, 4, 8]
        assert [row["k"] for row in r["sweep_one_at_a_time"][name]] == [0, 2, 4, 8]
    assert sorted({(row["budget"], row["k"]) for row in r["long_prompt"]}) == [(256, 0), (256, 4), (1024, 0), (1024, 4)]
