"""Tokenizers: bytes for the built-in models, a real BPE for real checkpoints.

The tiny model reads bytes: token = byte, plus BOS/EOS, no download needed.
A real checkpoint brings its own vocabulary: `Tokenizer.from_gguf` turns a
GGUF file's BPE vocabulary and merges into a Hugging Face `tokenizers`
tokenizer (the same Rust code transformers uses) and applies the file's chat
template the way `apply_chat_template` does. Both kinds answer encode /
decode / eos_token_ids, so the engine can turn tokens into text for either.
"""
from __future__ import annotations

BOS_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258   # the tiny preset rounds its embedding table up to 512


def encode(text: str, add_bos: bool = True) -> list[int]:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return ([BOS_ID] if add_bos else []) + list(text.encode("utf-8"))


def decode(token_ids) -> str:
    """Bytes back to text; special and out-of-byte-range ids are dropped."""
    return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


class ByteTokenizer:
    """The byte tokenizer as an object, for `LLMEngine(..., tokenizer=...)`."""
    eos_token_ids = (EOS_ID,)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return encode(text, add_bos)

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return decode(token_ids)

    def token_name(self, token_id: int) -> str:
        """What one id stands for, printable: a byte, or a special token."""
        if 0 <= token_id < 256:
            return repr(bytes([token_id]))
        return {BOS_ID: "<bos>", EOS_ID: "<eos>"}.get(token_id, f"<unused {token_id}>")


# llama.cpp's "smollm" pre-tokenizer (src/llama-vocab.cpp): every digit alone,
# then GPT-2's regex; tokenizers' Digits + ByteLevel pre-tokenizers do the same.
_DIGITS_ALONE_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva")
_CONTROL = 3   # tokenizer.ggml.token_type of special tokens (<|im_start|>, ...)


class Tokenizer:
    """A real BPE tokenizer with its special tokens and chat template."""

    def __init__(self, backend, chat_template: str | None = None, bos_token: str | None = None,
                 eos_token: str | None = None):
        self.backend = backend                  # a tokenizers.Tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = backend.token_to_id(eos_token) if eos_token else None
        self.eos_token_ids = () if self.eos_token_id is None else (self.eos_token_id,)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Text -> ids. Special tokens written in the text (<|im_start|>) map to their ids."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return ([self.bos_token_id] if add_bos and self.bos_token_id is not None else []) + ids

    def decode(self, token_ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_name(self, token_id: int) -> str:
        return repr(self.backend.decode([token_id], skip_special_tokens=False))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True):
        """The chat template rendered as transformers does (a sandboxed jinja2
        with trim_blocks and lstrip_blocks); ids, or the text if tokenize=False."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat_template; encode the text directly")
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages):
            raise ValueError(f"messages={messages!r}: must be a list of {{'role': ..., 'content': ...}} dicts")
        text = _compiled_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        return self.encode(text) if tokenize else text

    # ---- building and caching ---------------------------------------------------
    @classmethod
    def from_gguf(cls, reader) -> "Tokenizer":
        """From a parsed GGUF file (minillm.gguf_loader.read_gguf): its BPE
        vocabulary, merges, special tokens and chat template."""
        from tokenizers import AddedToken, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as Backend

        from .gguf_loader import field
        kind = field(reader, "tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"tokenizer.ggml.model={kind!r}: only byte-level BPE ('gpt2') is supported")
        tokens = field(reader, "tokenizer.ggml.tokens")
        merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     fuse_unk=False, byte_fallback=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if field(reader, "tokenizer.ggml.pre") in _DIGITS_ALONE_PRE:
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        types = field(reader, "tokenizer.ggml.token_type") or []
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, kind in enumerate(types) if kind == _CONTROL])

        def token(key):
            token_id = field(reader, key)
            return None if token_id is None else tokens[token_id]
        return cls(backend, field(reader, "tokenizer.chat_template"),
                   token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id"))

    def save(self, path) -> None:
        """One JSON file: the tokenizers' own format plus our few extras."""
        import json
        state = {"tokenizer": json.loads(self.backend.to_str()), "chat_template": self.chat_template,
                 "bos_token": self.bos_token, "eos_token": self.eos_token}
        with open(path, "w") as f:
            json.dump(state, f)

    @classmethod
    def load(cls, path) -> "Tokenizer":
        import json

        from tokenizers import Tokenizer as Backend
        with open(path) as f:
            state = json.load(f)
        return cls(Backend.from_str(json.dumps(state["tokenizer"])), state["chat_template"],
                   state["bos_token"], state["eos_token"])


_TEMPLATES: dict[str, object] = {}


def _compiled_template(source: str):
    if source not in _TEMPLATES:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        _TEMPLATES[source] = env.from_string(source)
    return _TEMPLATES[source]
