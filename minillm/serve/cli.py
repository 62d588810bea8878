"""`python -m minillm serve`: the engine behind an OpenAI-compatible HTTP server."""
from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions,
/v1/models, /health, /metrics) with one engine loop.

Scheduler flags, and what they are in vLLM:
  --max-num-batched-tokens N   vLLM's per-step token budget (decodes + prefill chunks).
                               Here: token_budget=N, and chunk_size=N unless --chunk-size
                               is given, so a step carries at most N tokens of which the
                               prefill gets what the decodes leave (vLLM V1's behaviour).
  --long-prefill-token-threshold N   same name and meaning as vLLM: no request gets more
                               than N prompt tokens in one step (0: off). --policy chunked only.
  --max-num-seqs N             same as vLLM: most requests in the running batch.
  --policy P                   no vLLM flag: chunked (vLLM V1's mixed steps, the default),
                               prefill_first (no chunking: a waiting prompt runs whole and
                               the decodes wait),
                               chunked_prefill_first (SGLang's default: chunks, but steps
                               are prefill-only or decode-only), decode_first.
  --chunk-size N               most prefill tokens in one step (SGLang's
                               --chunked-prefill-size; llama.cpp's -b is close).
  --max-waiting N              requests submitted but not yet scheduled; one more gets
                               HTTP 429 at once (vLLM has no such bound).
  --speculative-config JSON    vLLM's flag: '{"method": "ngram", "num_speculative_tokens": 4}'
                               (prompt_lookup_min / prompt_lookup_max as in vLLM); the drafts
                               count against --max-num-batched-tokens (chapter 12).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m minillm serve", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny",
                   help="tiny (the built-in random model), smollm2-135m-instruct, or a .gguf file")
    p.add_argument("--served-model-name", default=None, help="the name /v1/models reports (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--policy", default="chunked",
                   choices=("chunked", "prefill_first", "decode_first", "chunked_prefill_first"))
    p.add_argument("--chunk-size", type=int, default=None, help="most prefill tokens per step (default 512)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="most tokens of any kind per step (vLLM's name); default: no cap besides --chunk-size")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-waiting", type=int, default=None,
                   help="most requests waiting to be scheduled; more get HTTP 429 (default: no bound)")
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="max_tokens when a request gives none")
    p.add_argument("--seed", type=int, default=0, help="weights of the tiny model")
    p.add_argument("--speculative-config", default=None,
                   help='speculative decoding, vLLM\'s JSON: \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    p.add_argument("--log-level", default="warning")
    return p


def scheduler_config(args):
    from ..scheduler import SchedulerConfig
    chunk_size = args.chunk_size
    if chunk_size is None:
        chunk_size = args.max_num_batched_tokens or 512
    return SchedulerConfig(policy=args.policy, chunk_size=chunk_size, token_budget=args.max_num_batched_tokens,
                           max_num_seqs=args.max_num_seqs,
                           long_prefill_token_threshold=args.long_prefill_token_threshold)


def speculative_config(args):
    """--speculative-config's JSON as a SpeculativeConfig (None when not given)."""
    import json

    from ..speculative import SpeculativeConfig
    text = getattr(args, "speculative_config", None)
    if text is None:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config={text!r}: not JSON ({e.msg}); try "
                         '\'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
    return SpeculativeConfig.from_dict(config)


def load_model(name: str, seed: int = 0):
    """(model, tokenizer) for a model name or a .gguf path."""
    from pathlib import Path
    if name == "tiny":
        from ..loader import build_model
        from ..tokenizer import ByteTokenizer
        return build_model("tiny", seed=seed), ByteTokenizer()
    if Path(name).suffix == ".gguf":
        from ..gguf_loader import load_gguf, read_gguf
        from ..tokenizer import Tokenizer
        return load_gguf(name), Tokenizer.from_gguf(read_gguf(name))
    from ..pretrained_models import PRETRAINED, pretrained
    if name in PRETRAINED:
        return pretrained(name)
    raise ValueError(f"--model={name!r}: choose 'tiny', one of {sorted(PRETRAINED)}, or a path to a .gguf file")


def build_server(args):
    """(app, engine_loop) from parsed arguments."""
    from ..engine import LLMEngine
    from .app import create_app
    from .engine_loop import EngineLoop
    sched = scheduler_config(args)
    speculative = speculative_config(args)          # refused before the model loads
    model, tokenizer = load_model(args.model, args.seed)
    engine = LLMEngine(model, sched, block_size=args.block_size, num_blocks=args.num_blocks,
                       enable_prefix_caching=args.enable_prefix_caching, tokenizer=tokenizer,
                       max_trace_steps=10_000, speculative=speculative)
    if args.max_waiting is not None and args.max_waiting < 1:
        raise ValueError(f"--max-waiting={args.max_waiting}: must be at least 1 (or left out: no bound)")
    loop = EngineLoop(engine, max_waiting=args.max_waiting)
    app = create_app(loop, tokenizer, args.served_model_name or args.model, model.cfg.max_position,
                     default_max_tokens=args.default_max_tokens)
    return app, loop


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        app, _ = build_server(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import signal

    import uvicorn

    # uvicorn stops gracefully on SIGTERM, then raises the signal again once
    # done, which would kill the process (exit -15). A server told to stop that
    # stopped cleanly should exit 0, so the re-raised signal lands here.
    def exit_cleanly(signum, frame):
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, exit_cleanly)
    print(f"minillm: serving {args.model} on http://{args.host}:{args.port} "
          f"(policy={args.policy}, max_num_batched_tokens={args.max_num_batched_tokens})", flush=True)
    # uvicorn handles SIGTERM and SIGINT: stop accepting, let open streams finish
    # (at most timeout_graceful_shutdown s, then cancel them: their requests are
    # aborted), run the lifespan's shutdown (the engine thread ends), return.
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=5, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
