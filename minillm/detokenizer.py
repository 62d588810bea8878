"""Incremental detokenization: text that grows token by token, never a
broken character.

One token is not one character: a byte-level BPE token may hold half of
"é" or of an emoji, so decoding each new token alone would print "\ufffd"
(the replacement character) mid-stream. We decode a short window of recent
ids instead and release new text only when it does not end in an incomplete
character (the method of vLLM's and TGI's detokenizers).
"""
from __future__ import annotations

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Feed ids one at a time; `push` returns the text they complete."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer           # anything with decode(ids) -> str
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0              # start of the window we decode
        self._read_offset = 0                # ids before this are in self.text

    def push(self, token_id: int) -> str:
        self.token_ids.append(int(token_id))
        window = self.token_ids[self._prefix_offset:]
        before = self.tokenizer.decode(window[:self._read_offset - self._prefix_offset])
        after = self.tokenizer.decode(window)
        if len(after) <= len(before) or after.endswith(REPLACEMENT_CHAR):
            return ""                        # nothing new, or a character still incomplete
        delta = after[len(before):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a stream: whatever is left, even an incomplete character."""
        rest = self.tokenizer.decode(self.token_ids[self._prefix_offset:])
        rest = rest[len(self.tokenizer.decode(self.token_ids[self._prefix_offset:self._read_offset])):]
        self._prefix_offset = self._read_offset = len(self.token_ids)
        self.text += rest
        return rest
