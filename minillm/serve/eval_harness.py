"""lm-evaluation-harness (PyPI `lm-eval`) as a real client of `python -m minillm serve`.

    python -m minillm.serve.eval_harness        # make eval: the harness's own table

The harness's `local-completions` model posts to /v1/completions. For a
multiple-choice (log-likelihood) task it sends each question and answer as token
ids with `echo: true`, `logprobs: 1` and `max_tokens: 1`, and sums the prompt
log-probabilities of the answer's tokens (lm_eval/models/openai_completions.py,
lm-eval 0.4.13: it reads `token_logprobs[ctxlen:-1]`, the last entry being the one
generated token's); a `generate_until` task gets greedy text cut at the task's
stop strings. It tokenizes on its side with a Hugging Face tokenizer directory:
write_hf_tokenizer() writes one from the GGUF file's own tokenizer (minillm's
Tokenizer: the same vocabulary, merges, special tokens and chat template).

The tasks ship in data/lm_eval/ (YAML over JSONL files): minillm_capitals (five
multiple-choice questions) and minillm_completions (four greedy completions).
Everything runs offline: HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parents[2] / "data" / "lm_eval"
TASKS = ("minillm_capitals", "minillm_completions")
MODEL = "smollm2-135m-instruct"


def write_hf_tokenizer(tokenizer, folder) -> Path:
    """A Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) for
    minillm's Tokenizer: AutoTokenizer.from_pretrained(folder) then encodes as it does."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tokenizer.bos_token,
              "eos_token": tokenizer.eos_token, "chat_template": tokenizer.chat_template,
              "clean_up_tokenization_spaces": False, "add_bos_token": False,
              "model_max_length": 8192}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return folder


def book_tokenizer():
    """The book model's tokenizer (minillm's, from the GGUF file; from the model cache
    when `minillm.pretrained` or a server has written it: seconds faster)."""
    from ..gguf_loader import read_gguf
    from ..pretrained_models import cache_dir, gguf_path
    from ..tokenizer import Tokenizer
    path = gguf_path(MODEL)
    cached = cache_dir(MODEL, path)
    if (cached / "done").exists():
        return Tokenizer.load(cached / "tokenizer.json")
    return Tokenizer.from_gguf(read_gguf(path))


def offline_env() -> dict[str, str]:
    """Our environment, with the Hugging Face libraries told not to reach the network."""
    return dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")


def lm_eval_command(base_url: str, tokenizer_dir, output_path=None, tasks=TASKS, model: str = MODEL,
                    tasks_dir=TASKS_DIR) -> list[str]:
    """The `lm_eval` command line (as `python -m lm_eval`, the same entry point)."""
    model_args = (f"model={model},base_url={base_url.rstrip('/')}/v1/completions,"
                  f"tokenizer_backend=huggingface,tokenizer={tokenizer_dir},num_concurrent=1,max_retries=1")
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", model_args,
               "--tasks", ",".join(tasks), "--include_path", str(tasks_dir), "--seed", "0"]
    if output_path is not None:
        command += ["--output_path", str(output_path), "--log_samples"]
    return command


def run_lm_eval(base_url: str, tokenizer_dir, output_path=None, tasks=TASKS, model: str = MODEL,
                timeout_s: float = 600) -> str:
    """Run the harness against a server; returns what it printed (its results table).
    RuntimeError with its output if it fails."""
    if not (TASKS_DIR / "minillm_capitals.yaml").is_file():
        raise FileNotFoundError(f"the lm-eval tasks are not at {TASKS_DIR} (they ship in the repository's data/)")
    done = subprocess.run(lm_eval_command(base_url, tokenizer_dir, output_path, tasks, model),
                          env=offline_env(), capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"lm_eval exited with {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def read_samples(output_path) -> dict[str, list[dict]]:
    """{task: its logged samples} from `--output_path ... --log_samples`."""
    samples = {}
    for path in glob.glob(str(Path(output_path) / "**" / "samples_*.jsonl"), recursive=True):
        task = Path(path).name[len("samples_"):].rsplit("_", 1)[0]
        with open(path) as f:
            samples[task] = [json.loads(line) for line in f if line.strip()]
    return samples


def main(argv=None) -> int:
    """Start a server on the book's model, run the shipped tasks through the harness,
    print the harness's own table."""
    import argparse

    from .launch import ServerProcess
    p = argparse.ArgumentParser(prog="python -m minillm.serve.eval_harness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-args", default="", help="more flags for `python -m minillm serve`")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        with ServerProcess(["--model", MODEL, *args.server_args.split()], startup_timeout_s=300) as server:
            write_hf_tokenizer(book_tokenizer(), Path(tmp) / "tokenizer")
            print(run_lm_eval(server.url, Path(tmp) / "tokenizer"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
