"""GET /metrics: the quantities vLLM exports, in Prometheus' text format.

Names follow vLLM's (vllm/v1/metrics/loggers.py, vLLM 0.33) with our prefix:
  minillm:time_to_first_token_seconds   histogram, per request
  minillm:inter_token_latency_seconds   histogram, every gap between two steps that gave a
                                        stream tokens (a step that emits several, with
                                        speculative decoding, is one gap, as a streaming
                                        client and vLLM's per-iteration ITL see it)
  minillm:e2e_request_latency_seconds   histogram, arrival to last token
  minillm:request_queue_time_seconds    histogram, arrival to first scheduled step
  minillm:num_requests_running / _waiting   gauges
  minillm:prefix_cache_queries_total / _hits_total   counters, in tokens
  minillm:prompt_tokens_total, minillm:generation_tokens_total   counters
  minillm:request_success_total{finished_reason=...}   counter
Every series carries a `model_name` label (the served name), and the finish
reasons are vLLM's: an EOS token and a stop string both finish as "stop" and
both count in the e2e histogram (vLLM's PrometheusStatLogger,
vllm/v1/metrics/loggers.py at commit 005a810bc40faa25b8870fbc8559c3462581eee3,
labels every metric with model_name and observes e2e for each finished request;
its reasons are stop, length, abort: vllm/v1/engine/__init__.py at commit
0015f3f6a0e6ccca781c3f0b127101153c12ebbe). Aborted requests (the client left)
are counted but kept out of the e2e histogram: they have no end to measure.
Written by hand (no prometheus_client): a histogram is a list of bucket
counts, a sum and a count. Only the engine thread updates; /metrics reads
under the same lock.
"""
from __future__ import annotations

import bisect
import threading

# vLLM's buckets for these histograms (seconds)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                  7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                     120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    def __init__(self, buckets):
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)       # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """labels: 'key="value",...' added to every line's own."""
        out, cumulative = [], 0
        extra = f",{labels}" if labels else ""
        for bound, n in zip(self.buckets + (float("inf"),), self.counts):
            cumulative += n
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.append(f'{name}_bucket{{le="{le}"{extra}}} {cumulative}')
        braces = f"{{{labels}}}" if labels else ""
        return out + [f"{name}_sum{braces} {self.sum!r}", f"{name}_count{braces} {self.count}"]


class ServerMetrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)
        self.e2e = Histogram(REQUEST_BUCKETS_S)
        self.queue_time = Histogram(REQUEST_BUCKETS_S)
        self.num_arrived = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.finished: dict[str, int] = {}
        self._last_token_count: dict[int, int] = {}

    # ---- the engine thread -----------------------------------------------------------
    def on_arrival(self) -> None:
        with self._lock:
            self.num_arrived += 1

    def on_scheduled(self, queue_time_s: float, prompt_len: int) -> None:
        with self._lock:
            self.queue_time.observe(max(0.0, queue_time_s))
            self.prefix_queries += prompt_len

    def on_prefix_hits(self, num_tokens: int) -> None:
        if num_tokens:
            with self._lock:
                self.prefix_hits += num_tokens

    def on_token(self, out) -> None:
        times = out.metrics.token_times
        with self._lock:
            seen = self._last_token_count.get(out.request_id, 0)
            new = len(times) - seen
            if new <= 0:
                return
            self.generation_tokens += new
            if seen == 0:
                self.ttft.observe(out.metrics.ttft)
                self.prompt_tokens += out.prompt_len
            for a, b in zip(times[max(seen - 1, 0):], times[max(seen, 1):]):
                if b != a:                     # tokens of one step share a timestamp: no gap
                    self.itl.observe(b - a)
            self._last_token_count[out.request_id] = len(times)

    def on_finish(self, out, reason: str | None) -> None:
        with self._lock:
            self._last_token_count.pop(out.request_id, None)
            reason = reason or "unknown"
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if out.metrics.e2e is not None and reason not in ("abort", "error"):
                self.e2e.observe(out.metrics.e2e)

    # ---- /metrics ---------------------------------------------------------------------
    def render(self, num_running: int, num_waiting: int, model_name: str = "") -> str:
        p, label = "minillm:", f'model_name="{_escape(model_name)}"'
        with self._lock:
            lines = [
                f"# HELP {p}num_requests_running Requests in the running batch.",
                f"# TYPE {p}num_requests_running gauge", f"{p}num_requests_running{{{label}}} {num_running}",
                f"# HELP {p}num_requests_waiting Requests submitted and not yet scheduled.",
                f"# TYPE {p}num_requests_waiting gauge", f"{p}num_requests_waiting{{{label}}} {num_waiting}",
            ]
            for name, value, help_ in (
                    ("request_arrivals_total", self.num_arrived, "Requests the engine accepted."),
                    ("prompt_tokens_total", self.prompt_tokens, "Prompt tokens of requests that got a first token."),
                    ("generation_tokens_total", self.generation_tokens, "Output tokens generated."),
                    ("prefix_cache_queries_total", self.prefix_queries, "Prompt tokens looked up in the prefix cache."),
                    ("prefix_cache_hits_total", self.prefix_hits, "Prompt tokens served by the prefix cache.")):
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} counter", f"{p}{name}{{{label}}} {value}"]
            lines += [f"# HELP {p}request_success_total Finished requests by finish reason (vLLM's: stop, "
                      "length, abort, error).", f"# TYPE {p}request_success_total counter"]
            lines += [f'{p}request_success_total{{finished_reason="{r}",{label}}} {n}'
                      for r, n in sorted(self.finished.items())]
            for name, hist, help_ in (
                    ("time_to_first_token_seconds", self.ttft, "Time to first token, arrival to first token."),
                    ("inter_token_latency_seconds", self.itl, "Every gap between two steps that gave a stream tokens."),
                    ("e2e_request_latency_seconds", self.e2e, "Arrival to last token, finished requests."),
                    ("request_queue_time_seconds", self.queue_time, "Arrival to the first step that schedules it.")):
                lines += [f"# HELP {p}{name} {help_}", f"# TYPE {p}{name} histogram"] + hist.lines(p + name, label)
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """A label value as Prometheus' text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_prometheus(text: str) -> dict[str, float]:
    """{'name{labels}': value} of a Prometheus text page (tests and the chapter read /metrics with it)."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            values[key] = float(value)
    return values
