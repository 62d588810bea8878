"""The lecture's live demo: one call, both policies on the real engine, a figure."""
import re

import pytest

from minillm.book import lecture


def test_stall_demo_draws_both_policies_with_measured_titles():
    fig = lecture.stall_demo(prompt_len=96, num_decoders=2, chunk_size=32, decode_tokens=4, device="cpu")
    left, right = fig.axes
    assert left.get_title().startswith("no chunking: worst gap ")
    assert right.get_title().startswith("chunks of 32: worst gap ")
    for ax in (left, right):
        worst_ms, ttft_ms = map(float, re.findall(r"(\d+) ms", ax.get_title()))
        assert worst_ms > 0 and ttft_ms > 0
        assert len(ax.lines) == 2, "one line of token gaps per decoding stream"
    assert "96-token prompt" in fig._suptitle.get_text()


@pytest.mark.parametrize("kwargs, name", [
    ({"prompt_len": 0}, "prompt_len"), ({"prompt_len": 5000}, "prompt_len"),
    ({"num_decoders": 1.5}, "num_decoders"), ({"chunk_size": True}, "chunk_size"),
    ({"decode_tokens": -1}, "decode_tokens"),
])
def test_stall_demo_names_the_bad_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}="):
        lecture.stall_demo(**kwargs)
