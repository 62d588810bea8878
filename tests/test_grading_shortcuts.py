"""The checkers' shared machinery (minillm/grading/_common.py): fixed seeds, one clean message
naming the learner's call, crashes cut to the learner's frames, the engine's own function
refused however it is handed in and restored after the check; and every exported checker
is tested somewhere.

Each chapter's correct answers and shortcut attempts live in their own files:
tests/test_grading_ch01_05.py (chapters 1-5), tests/test_grading_ch06_10.py (6-8 and 10),
tests/test_grading_ch09.py.
"""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import minillm
import minillm.grading as ex
from minillm import kernels
from minillm.attention import causal_mask
from minillm.request import RequestMetrics
from test_grading_ch01_05 import attention, mask, packed


def _engine_metrics(arrival, times):
    m = RequestMetrics(arrival_time=arrival, first_token_time=times[0], token_times=list(times), finish_time=times[-1])
    return {"ttft": m.ttft, "tpot": m.tpot, "itl": m.itl}


def test_the_package_exports_only_checkers_and_every_one_is_tested():
    assert all(name.startswith("check_") for name in ex.__all__)
    assert not [name for name in dir(ex) if not name.startswith("_") and callable(getattr(ex, name))
                and not name.startswith("check_")]
    from test_grading_ch01_05 import CASES as CH01_05
    from test_grading_ch06_10 import CASES as CH06_10
    # chapters 9 and later: each checker is named in some test file of its own
    later = "\n".join(path.read_text() for path in Path(__file__).parent.glob("test_*.py"))
    untested = [name for name in ex.__all__ if name not in CH01_05 and name not in CH06_10 and name not in later]
    assert not untested, f"checkers no test calls: {untested}"
    assert set(CH01_05) <= set(ex.__all__) and set(CH06_10) <= set(ex.__all__)


def test_sdpa_with_the_right_mask_is_accepted_where_the_task_is_the_mask():
    def sdpa(q, k, v):
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(
            q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
            v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=mask(q.shape[0], k.shape[0])).transpose(0, 1)
    assert ex.check_attention(sdpa) is None


@pytest.mark.skipif(not kernels.paged_decode_available(), reason="the paged decode kernel is not built here")
@pytest.mark.parametrize("via_ops", [False, True])
def test_the_engines_paged_kernel_is_refused_as_attention(via_ops):
    with pytest.raises(AssertionError, match="engine's own answer"):
        ex.check_attention(lambda q, k, v: _paged_kernel_attention(q, k, v, via_ops), seed=3)


def _paged_kernel_attention(q, k, v, via_ops):
    """Each query row as a decode over its visible keys, through the engine's paged kernel."""
    n, m = q.shape[0], k.shape[0]
    kernel = torch.ops.minillm.paged_decode if via_ops else kernels.paged_decode
    rows = []
    for i in range(n):
        visible = m - n + i + 1
        rows.append(kernel(q[i:i + 1].contiguous(), k[None, :visible].contiguous(), v[None, :visible].contiguous(),
                           torch.zeros(1, 1, dtype=torch.long), torch.tensor([visible]), q.shape[-1] ** -0.5))
    return torch.cat(rows)


# ---- the shared machinery (minillm/grading/_common.py) --------------------------------------
def test_seed_none_gives_the_same_failing_case_every_run():
    """seed=None is a fixed seed per checker: the case a learner debugs does not move."""
    def wrong(q_len, k_len):
        return torch.ones(q_len, k_len, dtype=torch.bool) if q_len > 4 else mask(q_len, k_len)
    messages = []
    for _ in range(2):
        with pytest.raises(AssertionError) as failure:
            ex.check_causal_mask(wrong)
        messages.append(str(failure.value))
    assert messages[0] == messages[1]
    # and another checker gets another seed
    from minillm.grading._common import stable_seed
    assert stable_seed("check_causal_mask") != stable_seed("check_attention")


def test_the_failing_case_is_a_call_with_the_learners_function_name():
    def my_causal_mask(q_len, k_len):
        return torch.ones(q_len, k_len).tril().bool()
    with pytest.raises(AssertionError) as failure:
        ex.check_causal_mask(my_causal_mask)
    assert str(failure.value).startswith("my_causal_mask(1, 7) is wrong: that is the TOP-LEFT mask")
    assert "fn(" not in str(failure.value)


def test_a_failure_renders_once_without_the_checkers_traceback(capsys):
    """In IPython an exception with _render_traceback_ is shown through it: one "Not yet" message, no frames
    of the checker's source; nothing printed besides (the message used to appear twice)."""
    with pytest.raises(AssertionError) as failure:
        ex.check_merge_attention(lambda oa, la, ob, lb: ((oa + ob) / 2, torch.logaddexp(la, lb)))
    rendered = failure.value._render_traceback_()
    assert rendered[0].startswith("Not yet: your function(")                 # a lambda has no name
    assert not any("File " in line or "_common.py" in line or "ch01.py" in line for line in rendered)
    assert capsys.readouterr().out == ""


def test_a_crash_in_the_learners_code_is_one_message_with_only_the_learners_frames():
    def my_attention(q, k, v):
        return torch.einsum("nhd,mhd->hnm", q, k)          # no GQA expansion: einsum fails on 4 vs 2 heads
    with pytest.raises(AssertionError) as failure:
        ex.check_attention(my_attention)
    message = str(failure.value)
    assert message.startswith("my_attention(<tensor [") and " crashed: q has 4 heads" in message
    assert "expand K and V to 4 heads" in message and "RuntimeError" in message
    rendered = failure.value._render_traceback_()
    frames = [line for line in rendered if line.strip().startswith("File ")]
    assert frames and all("test_grading_shortcuts.py" in line for line in frames)   # the learner's code only


def test_a_passing_check_returns_none_so_a_cell_echoes_nothing(capsys):
    assert ex.check_causal_mask(mask) is None
    assert capsys.readouterr().out.count("\n") == 1        # one plain pass line


def test_grade_prediction_states_both_numbers_and_the_tolerance():
    from minillm.grading._common import grade_prediction
    assert grade_prediction("x", 101, 100, 0.02) == pytest.approx(0.01)
    with pytest.raises(AssertionError, match=r"you predicted 110, the engine measures 100, 10% off \(allowed: 2%\)"):
        grade_prediction("x", 110, 100, 0.02)
    with pytest.raises(AssertionError, match="expected a number"):
        grade_prediction("x", "110", 100, 0.02)


def test_forbidden_functions_are_restored_after_a_check():
    before = (minillm.attention.causal_mask, minillm.prefill_kv, minillm.request.RequestMetrics.__dict__["tpot"])
    with pytest.raises(AssertionError):
        ex.check_causal_mask(lambda q, k: causal_mask(q, k), seed=0)
    with pytest.raises(AssertionError):
        ex.check_packed_chunked_prefill(lambda m, ps, c: [minillm.prefill_kv(m, p)[0] for p in ps], seed=0)
    with pytest.raises(AssertionError):
        ex.check_stream_metrics(_engine_metrics, seed=0)
    assert before == (minillm.attention.causal_mask, minillm.prefill_kv,
                      minillm.request.RequestMetrics.__dict__["tpot"])
    assert causal_mask(2, 3).shape == (2, 3)


def test_the_engines_function_is_refused_however_it_is_handed_in():
    def default_arg(q_len, k_len, _answer=causal_mask):
        return _answer(q_len, k_len)
    answer = causal_mask
    closure = lambda q_len, k_len: answer(q_len, k_len)
    for fn in (causal_mask, default_arg, closure, lambda q, k: minillm.attention.causal_mask(q, k)):
        with pytest.raises(AssertionError, match="engine's own answer"):
            ex.check_causal_mask(fn, seed=0)
    assert default_arg.__defaults__[0] is causal_mask and answer is causal_mask
