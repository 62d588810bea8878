"""What every checker shares: how it fails, how it passes, and how it keeps a
learner from handing in the engine's own function or skipping the method."""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field

import torch


class ExerciseFailed(AssertionError):
    """A check found a mistake; the first line of the message says which."""


def fail(message: str):
    print("Not yet: " + message)
    raise ExerciseFailed(message)


def passed(message: str) -> bool:
    print("✓ " + message)
    return True


# ---------------------------------------------------------------------------
# Forbidding the answer
# ---------------------------------------------------------------------------
def _resolve(dotted: str):
    """'minillm.kv_cache.BlockManager.slot_mapping' -> (owner object, attribute name), or None.

    Only modules already imported count: a learner's code cannot have reached a
    module nobody imported, and importing one here can take seconds
    (torch.nn.attention.bias pulls in the compiler stack).
    """
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        owner = sys.modules.get(".".join(parts[:i]))
        if owner is None:
            continue
        try:
            for name in parts[i:-1]:
                owner = getattr(owner, name)
            getattr(owner, parts[-1])
        except AttributeError:
            return None
        return owner, parts[-1]
    return None


_REEXPORTS: dict = {}


def _reexports(owner, name: str, original) -> list:
    """Every (minillm module, attribute) bound to the same object, found once per set of loaded modules."""
    key = (id(owner), name, len(sys.modules))
    if key not in _REEXPORTS:
        modules = [m for key, m in list(sys.modules.items()) if key.startswith("minillm") and m is not None]
        _REEXPORTS[key] = [(module, attr) for module in modules if module is not owner
                           for attr, value in list(vars(module).items()) if value is original]
    return _REEXPORTS[key]


def _raiser(dotted: str, task: str, why: str):
    def forbidden(*args, **kwargs):
        raise ExerciseFailed(f"{task} calls {dotted}, the engine's own answer: {why}")
    forbidden.__name__ = dotted.rsplit(".", 1)[-1]
    return forbidden


_INHERITED = object()


@contextlib.contextmanager
def _replaced_everywhere(fn, replacements: dict):
    """Bind each dotted name to replacements[dotted](original) wherever a learner can reach it:
    the defining module or class, every loaded minillm module that re-exports the same
    object, the learner's globals (`from minillm.attention import causal_mask` in the
    notebook binds the name there), and its default arguments and closure cells."""
    learner_globals = getattr(fn, "__globals__", None)
    patches = []   # (namespace: dict or object, name, original)
    try:
        for dotted, make in replacements.items():
            resolved = _resolve(dotted)
            if resolved is None:
                continue
            owner, name = resolved
            original = vars(owner)[name] if isinstance(owner, type) and name in vars(owner) else getattr(owner, name)
            is_property = isinstance(original, property)            # e.g. RequestMetrics.tpot
            fake = property(make(original.fget)) if is_property else make(original)
            targets = [(owner, name)] + ([] if is_property else _reexports(owner, name, original))
            if learner_globals is not None:
                targets += [(learner_globals, attr) for attr, value in list(learner_globals.items())
                            if value is original]
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    if cell.cell_contents is original:
                        patches.append((cell, "cell_contents", original))
                        cell.cell_contents = fake
                except ValueError:          # an empty cell
                    pass
            defaults = getattr(fn, "__defaults__", None)
            if defaults and any(d is original for d in defaults):
                patches.append((fn, "__defaults__", defaults))
                fn.__defaults__ = tuple(fake if d is original else d for d in defaults)
            for target, attr in targets:
                if isinstance(target, dict):
                    patches.append((target, attr, target[attr]))
                    target[attr] = fake
                else:
                    # a class attribute may be inherited: then restoring means deleting ours
                    own = vars(target).get(attr, _INHERITED) if isinstance(target, type) else getattr(target, attr)
                    patches.append((target, attr, own))
                    setattr(target, attr, fake)
        yield
    finally:
        for target, attr, original in reversed(patches):
            if isinstance(target, dict):
                target[attr] = original
            elif original is _INHERITED:
                delattr(target, attr)
            else:
                setattr(target, attr, original)


@contextlib.contextmanager
def forbid(fn, *dotted_names: str, why: str = "write it yourself."):
    """While the block runs, the named engine functions raise ExerciseFailed.

    Names that do not exist in this checkout are skipped, so a checker may list
    helpers a later version adds. Compute the expected values BEFORE entering:
    the engine itself may use them.
    """
    task = getattr(fn, "__name__", "your function")
    if task == "<lambda>":
        task = "your function"
    for dotted in dotted_names:                # handing in the engine's function itself
        resolved = _resolve(dotted)
        if resolved is not None and (fn is getattr(*resolved) or getattr(fn, "__func__", None) is getattr(*resolved)):
            fail(f"you handed in {dotted}, the engine's own answer: {why}")
    with _replaced_everywhere(fn, {d: (lambda original, d=d: _raiser(d, task, why)) for d in dotted_names}):
        yield


@contextlib.contextmanager
def spy(fn, dotted: str):
    """Record the (args, kwargs) of every call the learner's code makes to an allowed
    engine function (it still runs): compare intermediate values, not only the result."""
    calls = []

    def make(original):
        def recording(*args, **kwargs):
            calls.append((args, kwargs))
            return original(*args, **kwargs)
        return recording

    with _replaced_everywhere(fn, {dotted: make}):
        yield calls


# ---------------------------------------------------------------------------
# Watching the forward passes
# ---------------------------------------------------------------------------
@dataclass
class ForwardCall:
    num_tokens: int
    positions: list[int]
    query_lens: list[int]
    cached_lens: list[int]


@dataclass
class ForwardRecord:
    calls: list[ForwardCall] = field(default_factory=list)


@contextlib.contextmanager
def record_forward(model):
    """Record every model.forward(token_ids, positions, batch, ...) made in the block."""
    record = ForwardRecord()
    original = model.forward

    def recording_forward(token_ids, positions, batch, *args, **kwargs):
        positions_list = positions.tolist() if isinstance(positions, torch.Tensor) else list(positions)
        record.calls.append(ForwardCall(
            num_tokens=int(len(token_ids)), positions=positions_list,
            query_lens=list(getattr(batch, "query_lens", [])),
            cached_lens=list(getattr(batch, "cached_lens", []))))
        return original(token_ids, positions, batch, *args, **kwargs)

    model.forward = recording_forward      # instance attribute: nn.Module.__call__ finds it first
    try:
        yield record
    finally:
        del model.forward


def learner_call(fn, *args, forbidden: tuple[str, ...] = (), why: str = "write it yourself.", **kwargs):
    """fn(*args, **kwargs) with the forbidden engine functions raising."""
    with forbid(fn, *forbidden, why=why):
        return fn(*args, **kwargs)
