"""The HTTP routes (FastAPI), over one EngineLoop.

  POST /v1/completions, /v1/chat/completions   SSE when "stream": true
  GET  /v1/models                              [{"id", "root", ...}]
  GET  /health                                 200 while the engine thread runs
  GET  /metrics                                Prometheus text (metrics_export.py)
  POST /tokenize                               vLLM's shape: {"tokens", "count", "max_model_len"}
  GET  /debug/requests                         the engine's own stamps of recent requests
                                               (what the chapter compares a client's numbers with)
  GET  /debug/steps                            the engine's last steps (trace): tokens per step
  GET  /debug/engine                           free KV blocks, running and waiting requests

Streaming: one chunk per engine step that gave the request a token, sent as
soon as the event loop sees it; the first chunk is the first token's (no
role-only chunk before the prompt is done, so a client's TTFT is the
engine's TTFT plus the trip). A client that disconnects is noticed by a
watcher on the ASGI receive channel, even while its request still waits, and
the request is aborted: its blocks go back to the pool at the next step
boundary.
"""
from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .engine_loop import EngineLoop, TokenEvent
from .protocol import (APIError, full_response, openai_finish_reason, parse_chat, parse_completion, parse_json,
                       sse, stream_chunk, usage_chunk)

_DISCONNECTED = TokenEvent(None, "", True, "abort", "client disconnected")


def error_response(error: APIError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status in (429, 503) else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def create_app(engine_loop: EngineLoop, tokenizer, model_name: str, max_model_len: int,
               default_max_tokens: int = 256, manage_loop: bool = True) -> FastAPI:
    """The app. manage_loop: start the engine thread at startup and stop it at
    shutdown (uvicorn's lifespan; after SIGTERM, once open streams are done)."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        if manage_loop:
            engine_loop.start()
        yield
        if manage_loop:
            await asyncio.get_running_loop().run_in_executor(None, engine_loop.stop)

    app = FastAPI(title="minillm", lifespan=lifespan)
    created = int(time.time())

    @app.exception_handler(APIError)
    async def _api_error(request, error: APIError):
        return error_response(error)

    @app.get("/health")
    async def health():
        if engine_loop.alive:
            return PlainTextResponse("ok")
        return error_response(APIError(503, "the engine loop is not running", type_="service_unavailable"))

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "minillm", "root": model_name, "parent": None,
                                            "max_model_len": max_model_len}]}

    @app.get("/metrics")
    async def metrics():
        text = engine_loop.metrics.render(engine_loop.num_running, engine_loop.num_waiting, model_name)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/debug/requests")
    async def debug_requests():
        return {"requests": list(engine_loop.finished_log)}

    @app.get("/debug/steps")
    async def debug_steps(last: int = 2000):
        trace = engine_loop.engine.trace[-max(1, min(last, 10_000)):]    # a slice: atomic under the GIL
        return {"steps": [{"start": s.start, "end": s.end, "scheduled": s.scheduled,
                           "num_prefill_tokens": s.num_prefill_tokens, "num_decode_tokens": s.num_decode_tokens}
                          for s in trace]}

    @app.get("/debug/engine")
    async def debug_engine():
        blocks = engine_loop.engine.block_manager
        return {"num_blocks": blocks.num_blocks, "num_free_blocks": blocks.num_free_blocks,
                "num_running": engine_loop.num_running, "num_waiting": engine_loop.num_waiting,
                "has_unfinished_requests": engine_loop.engine.has_unfinished_requests()}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = parse_json(await request.body())
        text = body.get("prompt")
        if not isinstance(text, str):
            raise APIError(400, f"prompt: must be a string, got {text!r}", param="prompt")
        ids = tokenizer.encode(text)
        return {"tokens": ids, "count": len(ids), "max_model_len": max_model_len}

    async def generate(request: Request, parse):
        body = parse_json(await request.body())
        req = parse(body, tokenizer, max_model_len, default_max_tokens)
        req.model = req.model or model_name
        stream = await engine_loop.submit(req.prompt_token_ids, req.params, tag=req.request_id)
        if req.stream:
            watcher = asyncio.create_task(_watch_disconnect(request, stream))
            return StreamingResponse(_sse_events(req, stream, engine_loop, watcher),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        watcher = asyncio.create_task(_watch_disconnect(request, stream))
        try:
            text, reason, num_tokens, error, token_ids = await _collect(req, stream, engine_loop)
        finally:
            watcher.cancel()
        if error is not None and reason != "stop":
            raise APIError(500, f"generation failed: {error}", type_="server_error")
        return full_response(req, text, reason, num_tokens, token_ids)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, parse_chat)

    return app


async def _watch_disconnect(request: Request, stream) -> None:
    """Wait for the client to go away; then wake the stream's reader."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
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
    """(text, finish_reason or None, num_tokens, error, token ids) per engine event;
    aborts the request on a stop string."""
    matcher = _StopMatcher(req.stop_strings)
    while True:
        event = await stream.events.get()
        if event is _DISCONNECTED:
            engine_loop.abort(stream)
            raise _ClientGone()
        ids = [] if event.token_id is None else [event.token_id]
        text, stopped = matcher.push(event.text)
        if stopped:
            engine_loop.abort(stream)
            yield text, "stop", event.num_output_tokens, None, ids
            return
        if event.finished:
            yield (text + matcher.flush(), openai_finish_reason(event.finish_reason), event.num_output_tokens,
                   event.error, ids)
            return
        yield text, None, event.num_output_tokens, None, ids


class _ClientGone(Exception):
    pass


async def _sse_events(req, stream, engine_loop, watcher):
    first, num_tokens, reason = True, 0, None
    try:
        async for text, reason, num_tokens, error, ids in _events(req, stream, engine_loop):
            if error is not None and reason != "stop":
                yield sse(APIError(500, f"generation failed: {error}", type_="server_error").body())
                break
            yield sse(stream_chunk(req, text, reason, first, ids))
            first = False
        if req.include_usage:
            yield sse(usage_chunk(req, num_tokens))
        yield sse("[DONE]")
    except _ClientGone:
        return
    finally:
        watcher.cancel()
        if reason is None:                 # the client left, or the server is stopping
            engine_loop.abort(stream)      # a no-op when it already finished


async def _collect(req, stream, engine_loop):
    parts, token_ids, reason, num_tokens, error = [], [], None, 0, None
    try:
        async for text, reason, num_tokens, error, ids in _events(req, stream, engine_loop):
            parts.append(text)
            token_ids += ids
    except _ClientGone:
        pass
    return "".join(parts), reason, num_tokens, error, token_ids
