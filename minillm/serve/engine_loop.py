"""One thread runs the engine; the HTTP side talks to it through queues.

The engine is not thread-safe: its scheduler, block tables and requests are
touched by exactly one thread, the one here. The asyncio side (uvicorn's
event loop) puts commands ("add", "abort") into a thread-safe inbox; between
two steps the engine thread drains it, runs a step, and hands every new
token back to the event loop with `loop.call_soon_threadsafe`, once per step
for all streams (one wake-up of the event loop per step, not per token).

Why a thread and not an asyncio task: a step is a blocking forward pass
(tens of ms on a CPU). Run on the event loop it would freeze every stream's
I/O for that long; in a thread, torch releases the GIL inside its kernels and
the event loop keeps writing chunks while the next step computes.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass, field

from ..request import RequestStatus
from .metrics_export import ServerMetrics
from .protocol import APIError, openai_finish_reason

log = logging.getLogger("minillm.serve")


@dataclass
class TokenEvent:
    """What a stream receives per step: the new tokens and the text they complete."""
    token_ids: list[int]             # new since the last event (a step may bring several)
    text: str                        # new text ("" while a character is incomplete)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_output_tokens: int = 0
    logprobs: list[dict] | None = None         # one per new token, for a request that asked
    prompt_logprobs: list | None = None        # the whole prompt's, on a request's first event


@dataclass
class Stream:
    """One request's mailbox on the asyncio side. The engine thread writes to it
    only through loop.call_soon_threadsafe."""
    loop: asyncio.AbstractEventLoop
    tag: str
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    admitted: asyncio.Future | None = None
    request_id: int | None = None    # the engine's id, once admitted
    abandoned: bool = False          # the client left before admission
    sent_chars: int = 0              # engine thread: text already handed over
    sent_tokens: int = 0             # engine thread: tokens already handed over

    def __post_init__(self):
        self.admitted = self.loop.create_future()


_STOP = object()


class EngineLoop:
    """Owns an LLMEngine and the one thread that steps it.

    max_waiting: most requests submitted and not yet scheduled (None: no bound);
    one more is refused at once with HTTP 429, never queued to hang.
    """

    def __init__(self, engine, max_waiting: int | None = None, log_size: int = 4096):
        self.engine = engine
        self.max_waiting = max_waiting
        self.metrics = ServerMetrics()
        self.finished_log: deque[dict] = deque(maxlen=log_size)   # the engine's own stamps
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._num_queued = 0              # submitted, not yet scheduled (HTTP side and engine side)
        self._waiting_ids: set[int] = set()
        self._streams: dict[int, Stream] = {}
        self._stopping = False
        self._hits_seen = 0
        self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)

    # ---- the asyncio side -----------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def num_waiting(self) -> int:
        return self._num_queued

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    async def submit(self, prompt_token_ids: list[int], params, tag: str) -> Stream:
        """Queue a request; returns its Stream once the engine accepted it.
        APIError 429 (queue full), 503 (shutting down) or 400 (the engine refused it)."""
        with self._lock:
            if self._stopping:
                raise APIError(503, "the server is shutting down", type_="service_unavailable")
            if self.max_waiting is not None and self._num_queued >= self.max_waiting:
                raise APIError(429, f"{self._num_queued} requests are already waiting (--max-waiting "
                               f"{self.max_waiting}); retry later", type_="rate_limit_error")
            self._num_queued += 1
        stream = Stream(asyncio.get_running_loop(), tag)
        # Arrival on the engine's clock, now: the engine's TTFT then counts the
        # wait in the inbox, as a client's does.
        arrival = self.engine.clock.now()
        self._inbox.put(("add", stream, prompt_token_ids, params, arrival))
        try:
            await stream.admitted
        except asyncio.CancelledError:
            self.abort(stream)
            raise
        return stream

    def abort(self, stream: Stream) -> None:
        """The client left: free its blocks at the next step boundary."""
        self._inbox.put(("abort", stream))

    def finish_on_stop_string(self, stream: Stream) -> None:
        """A stop string matched in the text (the HTTP side matches them): free the blocks
        at the next step boundary, and count a finish with reason "stop", as vLLM does."""
        self._inbox.put(("stop", stream))

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort what is left, end the thread."""
        with self._lock:
            self._stopping = True
        self._inbox.put((_STOP,))
        self._thread.join(timeout_s)

    # ---- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                busy = self.engine.has_unfinished_requests()
                if not self._drain(block=not busy):
                    break
                if not self.engine.has_unfinished_requests():
                    continue
                self._step()
        except Exception:                   # noqa: BLE001 -- log it; /health then answers 503
            log.exception("engine loop died")
        finally:
            self._abort_all("the server is shutting down")
            with self._lock:
                self._stopping = True

    def _drain(self, block: bool) -> bool:
        """Run the queued commands; False when told to stop."""
        try:
            command = self._inbox.get(timeout=0.1) if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command[0] is _STOP:
                return False
            if command[0] == "add":
                self._add(*command[1:])
            elif command[0] == "stop":
                self._finish_on_stop_string(command[1])
            else:
                self._abort(command[1])
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _add(self, stream: Stream, prompt_token_ids, params, arrival: float) -> None:
        try:
            rid = self.engine.add_request(prompt_token_ids, params, arrival_time=arrival, tag=stream.tag)
        except (ValueError, TypeError) as e:      # the engine's own checks: a 400 for this request alone
            with self._lock:
                self._num_queued -= 1
            error = APIError(400, str(e), param="prompt")
            stream.loop.call_soon_threadsafe(_set_exception, stream.admitted, error)
            return
        stream.request_id = rid
        self._streams[rid] = stream
        self._waiting_ids.add(rid)
        self.metrics.on_arrival()
        if stream.abandoned:
            self._abort(stream)
            return
        stream.loop.call_soon_threadsafe(_set_result, stream.admitted, rid)

    def _abort(self, stream: Stream) -> None:
        if stream.request_id is None:
            stream.abandoned = True          # its "add" is still to come, or was refused
            return
        rid = stream.request_id
        if self._streams.pop(rid, None) is None:
            return                           # already finished
        output = self.engine.abort_request(rid)
        self._leave_waiting(rid)
        if output is not None:
            self.metrics.on_finish(output, "abort")

    def _finish_on_stop_string(self, stream: Stream) -> None:
        rid = stream.request_id
        if rid is None or self._streams.pop(rid, None) is None:
            return                           # it finished in the engine first (EOS, length)
        output = self.engine.abort_request(rid)
        if output is not None:
            # e2e ends at the token that completed the stop string, not at this abort
            output.finish_reason = "stop"
            if output.metrics.token_times:
                output.metrics.finish_time = output.metrics.token_times[-1]
            self.metrics.on_finish(output, "stop")
            self.finished_log.append(_stamps(output))

    def _leave_waiting(self, rid: int) -> None:
        if rid in self._waiting_ids:
            self._waiting_ids.discard(rid)
            with self._lock:
                self._num_queued -= 1

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as e:                # noqa: BLE001 -- the step failed as a whole
            log.exception("engine step failed; aborting the running requests")
            self._abort_all(f"engine step failed: {type(e).__name__}: {e}")
            return
        self._note_scheduled()
        posts: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            text, first = out.text or "", stream.sent_tokens
            event = TokenEvent(out.output_token_ids[first:], text[stream.sent_chars:], out.finished,
                               out.finish_reason, out.error, len(out.output_token_ids),
                               logprobs=None if out.logprobs is None else out.logprobs[first:],
                               prompt_logprobs=out.prompt_logprobs if first == 0 else None)
            stream.sent_chars, stream.sent_tokens = len(text), len(out.output_token_ids)
            posts.setdefault(stream.loop, []).append((stream.events, event))
            self.metrics.on_token(out)
            if out.finished:
                del self._streams[out.request_id]
                self.metrics.on_finish(out, openai_finish_reason(out.finish_reason))
                self.finished_log.append(_stamps(out))
        for loop, items in posts.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:              # the event loop is closed: nobody listens
                pass

    def _note_scheduled(self) -> None:
        """Requests that left the waiting queue this step: queue time, prefix-cache queries."""
        if not self._waiting_ids:
            return
        step_start = self.engine.trace[-1].start if self.engine.trace else self.engine.clock.now()
        for rid in list(self._waiting_ids):
            request = self.engine.requests.get(rid)
            if request is not None and request.status is RequestStatus.WAITING:
                continue
            self._leave_waiting(rid)
            if request is not None:
                self.metrics.on_scheduled(step_start - request.metrics.arrival_time, request.prompt_len)
        hits = getattr(self.engine.block_manager, "num_hit_tokens", 0)
        self.metrics.on_prefix_hits(hits - self._hits_seen)
        self._hits_seen = hits

    def _abort_all(self, reason: str) -> None:
        posts: dict = {}
        for rid, stream in list(self._streams.items()):
            output = self.engine.abort_request(rid)
            self._leave_waiting(rid)
            if output is not None:
                self.metrics.on_finish(output, "abort")
            posts.setdefault(stream.loop, []).append(
                (stream.events, TokenEvent([], "", True, "abort", reason)))
        self._streams.clear()
        for loop, items in posts.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:
                pass


def _deliver(items) -> None:
    for events, event in items:
        events.put_nowait(event)


def _set_result(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _stamps(out) -> dict:
    """A finished request's timestamps on the engine's clock, for comparison with a client's."""
    m = out.metrics
    return {"id": out.tag, "engine_request_id": out.request_id, "prompt_tokens": out.prompt_len,
            "completion_tokens": len(out.output_token_ids), "finish_reason": out.finish_reason,
            "arrival_time": m.arrival_time, "first_token_time": m.first_token_time,
            "finish_time": m.finish_time, "token_times": list(m.token_times),
            "ttft": m.ttft, "tpot": m.tpot, "e2el": m.e2e}
