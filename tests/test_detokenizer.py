"""detokenizer.py and the engine's text: streamed text is the decoded text,
and never shows half a character."""
from hypothesis import given, strategies as st

import minillm
from minillm import tokenizer
from minillm.detokenizer import IncrementalDetokenizer


@given(st.lists(st.integers(0, 257), max_size=40))
def test_streamed_pieces_add_up_to_the_decoded_ids(ids):
    detok = IncrementalDetokenizer(tokenizer.ByteTokenizer())
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == detok.text == tokenizer.decode(ids)


@given(st.text(max_size=30))
def test_valid_text_streams_without_replacement_characters(text):
    detok = IncrementalDetokenizer(tokenizer.ByteTokenizer())
    pieces = [detok.push(i) for i in tokenizer.encode(text, add_bos=False)]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in text


def test_engine_outputs_carry_text_only_with_a_tokenizer():
    model = minillm.build_model("tiny", seed=0)
    params = minillm.SamplingParams(max_tokens=12, ignore_eos=True)
    plain = minillm.LLMEngine(model).generate([tokenizer.encode("hello")], params)[0]
    assert plain.text is None
    engine = minillm.LLMEngine(model, tokenizer=tokenizer.ByteTokenizer())
    rid = engine.add_request(tokenizer.encode("hello"), params)
    texts = []
    while engine.has_unfinished_requests():
        texts += [o.text for o in engine.step() if o.request_id == rid]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))     # text only grows
    final = engine.requests[rid].to_output()
    assert final.text == tokenizer.decode(final.output_token_ids)
    assert final.output_token_ids == plain.output_token_ids          # text changes nothing else
