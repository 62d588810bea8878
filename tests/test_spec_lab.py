"""Chapter 12's lab (book/spec_lab.py): its runs and figures, without widgets' swallowed
errors (the figure functions are called directly). ~3 s: a dozen small simulations."""
import pytest

from minillm.book import spec_lab
from minillm.speculative import expected_tokens_per_verification


def test_a_run_gives_the_long_prompt_what_the_drafts_leave():
    vllm = spec_lab.spec_run(4, 256, 0.7, num_streams=8, prompt_len=2048)
    assert vllm["long_chunks"][0] == 256 - 8 * (1 + 4)
    chunk_first = spec_lab.spec_run(4, 256, 0.7, num_streams=8, prompt_len=2048, draft_budget="chunk_first")
    assert chunk_first["long_chunks"][0] == 256 - 8
    plain = spec_lab.spec_run(0, 256, 0.7, num_streams=8, prompt_len=2048)
    assert vllm["long_ttft_s"] > plain["long_ttft_s"] and vllm["stream_tpot_s"] < plain["stream_tpot_s"]
    assert vllm["tokens_per_verification"] == pytest.approx(expected_tokens_per_verification(0.7, 4), rel=0.08)


def test_starvation_waits_for_the_streams():
    full = spec_lab.spec_run(15, 128, 0.7, num_streams=8, prompt_len=2048, stream_tokens=600)
    plain = spec_lab.spec_run(0, 128, 0.7, num_streams=8, prompt_len=2048, stream_tokens=600)
    assert spec_lab.starvation_share(8, 15, 128) == 1.0
    assert full["long_ttft_s"] > 5 * plain["long_ttft_s"]
    assert full["steps_before_first_chunk"] > 100 and plain["steps_before_first_chunk"] == 0


def test_figures_draw_one_line_per_budget_or_alpha():
    rows = [spec_lab.spec_run(k, b, 0.7) for b in (256, 1024) for k in (0, 2)]
    assert len(spec_lab.plot_tradeoff(rows).axes[0].lines) == 2
    assert len(spec_lab.plot_starvation(rows).axes[0].lines) == 3          # two budgets and the n(1+k) line
    assert len(spec_lab.plot_expected_tokens(alphas=(0.5, 0.9)).axes[0].lines) == 2
    assert len(spec_lab.spec_lab_figure(k=2, token_budget=128).axes) == 2


def test_bad_settings_name_themselves():
    with pytest.raises(ValueError, match="alpha=1.5"):
        spec_lab.spec_run(4, 256, 1.5)
    with pytest.raises(ValueError, match="draft_budget='middle'"):
        spec_lab.spec_run(4, 256, 0.5, draft_budget="middle")
    with pytest.raises(ValueError, match="k=-1"):
        spec_lab.spec_run(-1, 256, 0.5)


def test_the_widget_builds():
    pytest.importorskip("ipywidgets")
    widget = spec_lab.spec_lab()
    assert len(widget.children) == 3
