"""The server layer: an OpenAI-compatible HTTP server over one engine loop,
and the client-side benchmark that measures any such server.

    python -m minillm serve --model tiny|smollm2-135m-instruct|PATH.gguf [...]
    python -m minillm bench serve --base-url http://127.0.0.1:8000 [...]

Modules: protocol (the wire format, errors), openai_params (every OpenAI
parameter: supported, refused or ignored on purpose), openai_logprobs
(log-probabilities in OpenAI's two shapes), engine_loop (the engine's thread
and its queues), answers (engine events become choices: stop strings, echo,
log-probabilities, several prompts), app (the FastAPI routes), metrics_export
(/metrics), cli (the serve command), bench_client (the benchmark), launch (a
server in a child process, for tests and chapter 10), peer and side_by_side
(llama.cpp's server beside ours), eval_harness (lm-evaluation-harness as a
client: `make eval`).
The core never imports this package; importing it does not import FastAPI
(only app and cli do, when a server is built).
"""
