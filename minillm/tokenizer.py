"""A byte-level tokenizer for the built-in models: token = byte, plus BOS/EOS.

Real checkpoints bring their own tokenizers; the book only needs one that
turns any text into ids and back without a download.
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
