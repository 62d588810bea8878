"""tokenizer.py: bytes in, bytes out, BOS and EOS outside the byte range."""
import pytest
from hypothesis import given, strategies as st

from minillm import ModelConfig, tokenizer


@given(st.text(max_size=50))
def test_decode_inverts_encode_for_any_text(text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_encode_starts_with_bos_unless_told_not_to():
    assert tokenizer.encode("hi") == [256, 104, 105]
    assert tokenizer.encode("hi", add_bos=False) == [104, 105]


def test_special_tokens_fit_the_tiny_models_vocabulary():
    cfg = ModelConfig.preset("tiny")
    assert cfg.bos_token_id == tokenizer.BOS_ID and cfg.eos_token_ids == (tokenizer.EOS_ID,)
    assert tokenizer.VOCAB_SIZE <= cfg.vocab_size
    assert max(tokenizer.encode("\u00e9\U0001F600", add_bos=False)) < 256


def test_decode_drops_special_ids():
    assert tokenizer.decode([tokenizer.BOS_ID, 104, 105, tokenizer.EOS_ID, 400]) == "hi"


def test_encode_of_a_non_string_is_a_type_error_naming_text():
    with pytest.raises(TypeError, match="text"):
        tokenizer.encode(b"bytes")
