"""Engine events become OpenAI answers: one choice per prompt, each built event by
event (stop strings cut the text, echo puts the prompt first, log-probabilities in
the endpoint's shape), streamed as SSE chunks or collected whole.

A request with several prompts (/v1/completions' batch) is several engine
requests; their events are merged as they come, each chunk naming its choice's
`index` (vLLM merges its generators the same way: merge_async_iterators in
OpenAIServingCompletion.create_completion).
"""
from __future__ import annotations

import asyncio

from fastapi import Request

from .engine_loop import EngineLoop, TokenEvent
from .openai_logprobs import chat_logprobs, completion_logprobs
from .protocol import APIError, ChoiceDelta, openai_finish_reason, sse, stream_chunk, usage_chunk

_DISCONNECTED = TokenEvent([], "", True, "abort", "client disconnected")


async def submit_all(engine_loop: EngineLoop, req) -> list:
    """One engine request per prompt; if one is refused, the others are aborted."""
    streams = []
    try:
        for i, ids in enumerate(req.prompts):
            tag = req.request_id if len(req.prompts) == 1 else f"{req.request_id}-{i}"
            streams.append(await engine_loop.submit(ids, req.params, tag=tag))
    except BaseException:
        for stream in streams:
            engine_loop.abort(stream)
        raise
    return streams


async def watch_disconnect(request: Request, streams) -> None:
    """Wait for the client to go away; then wake the streams' readers."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for stream in streams:
                stream.events.put_nowait(_DISCONNECTED)
            return


class _StopMatcher:
    """OpenAI's `stop` strings: end the text before the first match, never print it.
    Text that could be the start of a stop string is held back until it cannot."""

    def __init__(self, stop_strings):
        self.stop_strings = stop_strings
        self.held = ""

    def push(self, text: str) -> tuple[str, bool]:
        """(text safe to send, whether a stop string matched)."""
        if not self.stop_strings:
            return text, False
        self.held += text
        hits = [i for i in (self.held.find(s) for s in self.stop_strings) if i >= 0]
        if hits:
            out, self.held = self.held[:min(hits)], ""
            return out, True
        keep = max((k for s in self.stop_strings for k in range(1, len(s)) if self.held.endswith(s[:k])), default=0)
        out = self.held[:len(self.held) - keep]
        self.held = self.held[len(self.held) - keep:]
        return out, False

    def flush(self) -> str:
        out, self.held = self.held, ""
        return out


async def _events(req, stream, engine_loop):
    """(event, text, OpenAI finish_reason or None) per engine event, the text cut at a
    stop string (which finishes the request, counted as "stop")."""
    matcher = _StopMatcher(req.stop_strings)
    while True:
        event = await stream.events.get()
        if event is _DISCONNECTED:
            engine_loop.abort(stream)
            raise _ClientGone()
        text, stopped = matcher.push(event.text)
        if stopped:
            engine_loop.finish_on_stop_string(stream)
            yield event, text, "stop"
            return
        if event.finished:
            yield event, text + matcher.flush(), openai_finish_reason(event.finish_reason)
            return
        yield event, text, None


class _ClientGone(Exception):
    pass


class _Choice:
    """One choice of the answer, event by event: the echoed prompt first (text and
    log-probabilities), then the generated text, token ids and log-probabilities.
    Streaming sends each delta; otherwise final() holds the whole."""

    def __init__(self, req, index: int, tokenizer):
        self.req, self.index, self.tokenizer = req, index, tokenizer
        self.text, self.token_ids = "", []
        self.logprob_ids, self.logprob_entries = [], []     # echoed prompt, then output
        self.finish_reason = self.error = None
        self.num_tokens = 0                                 # what the engine computed (usage)
        self.started = False

    def add(self, event, text: str, reason: str | None) -> ChoiceDelta:
        ids = list(event.token_ids)
        entries = list(event.logprobs) if event.logprobs is not None else [None] * len(ids)
        if self.req.echo_only:             # the prompt alone: the one computed token is dropped
            text, ids, entries = "", [], []
        logprob_ids, logprob_entries = list(ids), entries
        if self.req.echo and not self.started:
            prompt = self.req.prompts[self.index]
            text = self.req.prompt_texts[self.index] + text
            logprob_ids = prompt + logprob_ids
            logprob_entries = list(event.prompt_logprobs or [None] * len(prompt)) + logprob_entries
        offset = len(self.text)
        self.started = True
        self.text += text
        self.token_ids += ids
        self.logprob_ids += logprob_ids
        self.logprob_entries += logprob_entries
        self.num_tokens = event.num_output_tokens
        self.finish_reason = reason
        if event.error is not None and reason != "stop":
            self.error = event.error
        return ChoiceDelta(self.index, text, reason, ids, self._logprobs(logprob_ids, logprob_entries, offset))

    def final(self) -> ChoiceDelta:
        return ChoiceDelta(self.index, self.text, self.finish_reason, self.token_ids,
                           self._logprobs(self.logprob_ids, self.logprob_entries, 0))

    def _logprobs(self, ids, entries, offset: int):
        if self.req.top_logprobs is None:
            return None
        if self.req.kind == "completion":
            return completion_logprobs(ids, entries, self.tokenizer, first_offset=offset)
        return {"content": chat_logprobs(ids, entries, self.req.top_logprobs, self.tokenizer)}


async def _merged(generators):
    """(index, item) from several async generators, in the order items come."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index, generator):
        try:
            async for item in generator:
                queue.put_nowait((index, item, None))
        except Exception as e:                # noqa: BLE001 -- re-raised in the reader
            queue.put_nowait((index, None, e))
        else:
            queue.put_nowait((index, None, done))

    tasks = [asyncio.create_task(pump(i, g)) for i, g in enumerate(generators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item, end = await queue.get()
            if end is done:
                remaining -= 1
            elif end is not None:
                raise end
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


async def sse_events(req, streams, engine_loop, tokenizer, watcher):
    choices = [_Choice(req, i, tokenizer) for i in range(len(streams))]
    try:
        async for index, (event, text, reason) in _merged([_events(req, s, engine_loop) for s in streams]):
            if event.error is not None and reason != "stop":
                yield sse(APIError(500, f"generation failed: {event.error}", type_="server_error").body())
                break
            first = not choices[index].started
            yield sse(stream_chunk(req, choices[index].add(event, text, reason), first))
        if req.include_usage:
            yield sse(usage_chunk(req, sum(c.num_tokens for c in choices)))
        yield sse("[DONE]")
    except _ClientGone:
        return
    finally:
        watcher.cancel()
        for choice, stream in zip(choices, streams):
            if choice.finish_reason is None:   # the client left, or the server is stopping
                engine_loop.abort(stream)      # a no-op when it already finished


async def collect(req, index: int, stream, engine_loop, tokenizer) -> _Choice:
    choice = _Choice(req, index, tokenizer)
    try:
        async for event, text, reason in _events(req, stream, engine_loop):
            choice.add(event, text, reason)
    except _ClientGone:
        pass
    return choice
