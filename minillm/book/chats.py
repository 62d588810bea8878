"""Real requests for the real model: chat questions and a long document.

The chapters and `bench hf-real` serve these to SmolLM2-135M-Instruct. The
questions are short or padded with a passage to read, so prompt lengths mix
(34 to 649 tokens with the chat template); the long document is this
book's own README (about 4800 tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

QUESTIONS = [
    "What is the capital of France?",
    "Write one sentence about the sea.",
    "List three colors of the rainbow.",
    "What is 12 times 12?",
    "Name a famous painter.",
    "Why is the sky blue? Answer in one sentence.",
    "Give me a synonym for happy.",
    "What do bees make?",
    "Translate 'good morning' into French.",
    "What is the largest planet in the solar system?",
    "Suggest a name for a black cat.",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "Write a haiku about autumn.",
    "Who wrote Romeo and Juliet?",
    "What is photosynthesis?",
]

PASSAGES = [
    "A language model writes text one token at a time. Before the first token it must read the "
    "whole prompt: that reading is called the prefill. Each later token is a decode step, which "
    "reads every weight of the model to produce a single token.",
    "Chunked prefill splits a long prompt into pieces and runs each piece together with the "
    "decode steps of the other requests, so that nobody waits for one huge prompt to finish. "
    "It trades a little time to the first token of the long request for smooth streams for "
    "everyone else. The idea comes from the SARATHI and Sarathi-Serve papers. vLLM uses it by "
    "default; SGLang splits long prompts by default but mixes the pieces with decode steps "
    "only when asked to.",
]


def chat_requests(num_requests: int = 32) -> list[str]:
    """User messages of mixed lengths: every third one asks about a passage."""
    messages = []
    for i in range(num_requests):
        question = QUESTIONS[i % len(QUESTIONS)]
        if i % 3 == 2:
            passage = " ".join(PASSAGES[:1 + (i // 3) % 2] * (1 + i % 4))
            question = f"Read this:\n{passage}\n\nIn one sentence, what is it about?"
        messages.append(question)
    return messages


def long_document() -> str:
    """A long real text (the README of this book, a few thousand tokens)."""
    return (Path(__file__).resolve().parents[2] / "README.md").read_text()


@dataclass
class TextEvent:
    """One piece of text reaching a user: when, for which request, what."""
    time_s: float
    request_id: int
    text: str


def serve_with_late_arrival(engine, prompts, late_prompt, params, late_params=None, after_tokens: int = 6):
    """Serve `prompts` on `engine` (which has a tokenizer); when every one of them
    has `after_tokens` output tokens, `late_prompt` arrives. Returns (outputs in
    order, late request last; the text events as the engine produced them)."""
    ids = [engine.add_request(p, params) for p in prompts]
    late_id = None
    shown: dict[int, str] = {}
    events: list[TextEvent] = []
    while engine.has_unfinished_requests() or late_id is None:
        if late_id is None and all(len(engine.requests[i].output_token_ids) >= after_tokens
                                   or engine.requests[i].is_finished for i in ids):
            late_id = engine.add_request(late_prompt, late_params or params)
        for out in engine.step():
            text = out.text or ""
            events.append(TextEvent(out.metrics.token_times[-1], out.request_id,
                                    text[len(shown.get(out.request_id, "")):]))
            shown[out.request_id] = text
    return [engine.requests[i].to_output() for i in ids + [late_id]], events
