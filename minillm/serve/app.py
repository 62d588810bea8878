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
boundary. How engine events become answers (stop strings, echo,
log-probabilities, several prompts in one request): answers.py.
"""
from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .answers import collect, sse_events, submit_all, watch_disconnect
from .engine_loop import EngineLoop
from .protocol import APIError, check_model, full_response, parse_chat, parse_completion, parse_json


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
        check_model(body, model_name)
        req = parse(body, tokenizer, max_model_len, default_max_tokens)
        req.model = req.model or model_name
        streams = await submit_all(engine_loop, req)
        watcher = asyncio.create_task(watch_disconnect(request, streams))
        if req.stream:
            return StreamingResponse(sse_events(req, streams, engine_loop, tokenizer, watcher),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            choices = await asyncio.gather(*(collect(req, i, s, engine_loop, tokenizer)
                                             for i, s in enumerate(streams)))
        finally:
            watcher.cancel()
        for choice in choices:
            if choice.error is not None:
                raise APIError(500, f"generation failed: {choice.error}", type_="server_error")
        return full_response(req, [c.final() for c in choices], sum(c.num_tokens for c in choices))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, parse_completion)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, parse_chat)

    return app
