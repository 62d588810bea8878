"""What every checker shares: how it fails, how it passes, and how it keeps a
learner from handing in the engine's own function or skipping the method."""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])      # minillm/


class ExerciseFailed(AssertionError):
    """A check found a mistake; the first line of the message says which.

    In a notebook, IPython shows an exception through its `_render_traceback_`
    when it has one: this one renders as "Not yet: <message>" (and, for a crash
    in the learner's code, the learner's own frames), never a traceback through
    the checker's source. The cell still fails, so nbval and the grade command
    see the failure; `str(exc)` is the message, whose first line the grade table shows.
    """

    def __init__(self, message: str, details: list[str] | tuple[str, ...] = ()):
        super().__init__(message)
        self.details = list(details)

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return ["Not yet: " + lines[0], *lines[1:], *self.details]


def fail(message: str, details: list[str] | tuple[str, ...] = ()):
    """Raise ExerciseFailed(message): shown once, as "Not yet: message", with no traceback."""
    raise ExerciseFailed(message, details)


def passed(message: str) -> bool:
    """Print the pass line ("✓ message"); returns True (a checker decorated with
    @checker returns None instead, so the check cell echoes nothing)."""
    print("✓ " + message)
    return True


def stable_seed(name: str) -> int:
    """The seed a checker uses when called with seed=None: fixed per checker, so the
    failing case a learner is debugging does not move between runs."""
    return zlib.crc32(name.encode())


def checker(check):
    """Decorate a check_* function: seed=None becomes stable_seed(its name) (the same
    cases every run), and a pass returns None, so a check cell shows only the pass line."""
    signature = inspect.signature(check)
    has_seed = "seed" in signature.parameters

    @functools.wraps(check)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if has_seed and bound.arguments.get("seed") is None:
            bound.arguments["seed"] = stable_seed(check.__name__)
        check(*bound.args, **bound.kwargs)
        return None

    return wrapper


# ---------------------------------------------------------------------------
# Naming the learner's call
# ---------------------------------------------------------------------------
def function_name(fn) -> str:
    """The learner's function's own name (for messages): `my_causal_mask`, not `fn`."""
    name = getattr(fn, "__name__", None) or getattr(getattr(fn, "__func__", None), "__name__", None)
    return "your function" if not name or name == "<lambda>" else name


def show(value, limit: int = 60) -> str:
    """A short, readable form of an argument: tensors by shape and dtype, long lists cut."""
    if isinstance(value, torch.Tensor):
        if value.numel() <= 8 and value.dim() <= 1:
            return f"tensor({value.tolist()})"
        return f"<tensor {list(value.shape)} {str(value.dtype).removeprefix('torch.')}>"
    if isinstance(value, torch.nn.Module):
        return f"<{type(value).__name__}>"
    if hasattr(value, "name") and hasattr(value, "num_layers"):        # a ModelConfig or a shape object
        return f"<{type(value).__name__} {value.name!r}>"
    text = repr(value)
    if len(text) > limit:
        text = text[:limit - 4] + " ...]" if text[:1] in "[(" else text[:limit - 3] + "..."
    return text


def call_text(fn, *args, **kwargs) -> str:
    """`my_causal_mask(1, 7)`: the failing case as a call the learner can paste into a cell."""
    parts = [show(a) for a in args] + [f"{k}={show(v)}" for k, v in kwargs.items()]
    return f"{function_name(fn)}({', '.join(parts)})"


def learner_frames(exc: BaseException) -> list[str]:
    """The traceback of a crash, cut to the learner's own code: no checker frames, no engine or
    library internals (the deepest of those is named in one line)."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not f.filename.startswith(_PACKAGE_DIR) and "site-packages" not in f.filename
           and not f.filename.startswith(sys.prefix)]
    if not own:
        return []
    lines = ["Traceback (your code):", *"".join(traceback.format_list(own[-4:])).rstrip().splitlines()]
    if frames and frames[-1] is not own[-1]:
        last = frames[-1]
        lines.append(f"  ... which failed inside {Path(last.filename).name}, line {last.lineno}, in {last.name}")
    return lines


def crashed(fn, args: tuple, kwargs: dict, exc: BaseException, explain=None):
    """Turn a crash in the learner's function into one clean message, with a diagnosis when one is known."""
    first = (str(exc).strip().splitlines() or [""])[0]
    hint = explain(exc) if explain is not None else None
    message = f"{call_text(fn, *args, **kwargs)} raised {type(exc).__name__}: {first}"
    if hint:
        message = f"{call_text(fn, *args, **kwargs)} crashed: {hint} ({type(exc).__name__}: {first})"
    raise ExerciseFailed(message, learner_frames(exc)) from None


# ---------------------------------------------------------------------------
# Forbidding the answer
# ---------------------------------------------------------------------------
def learner_function(fn):
    """The learner's own function behind the grade command's wrapper (`_harness.guarded`)."""
    return vars(fn).get("_graded_function", fn) if hasattr(fn, "__dict__") else fn


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
    notebook binds the name there), and its default arguments and closure cells.
    The grade command hands checkers a wrapper around the learner's function: it is looked
    through (once, by the attribute the grader sets on its own wrapper)."""
    fn = learner_function(fn)
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
    task = function_name(fn)
    for dotted in dotted_names:                # handing in the engine's function itself
        resolved = _resolve(dotted)
        handed_in = learner_function(fn)           # through the grade command's wrapper
        if resolved is not None and (handed_in is getattr(*resolved)
                                     or getattr(handed_in, "__func__", None) is getattr(*resolved)):
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
    block_tables: list[list[int]] = field(default_factory=list)
    block_size: int | None = None


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
            cached_lens=list(getattr(batch, "cached_lens", [])),
            block_tables=[list(t) for t in getattr(batch, "block_tables", None) or []],
            block_size=getattr(batch, "block_size", None)))
        return original(token_ids, positions, batch, *args, **kwargs)

    model.forward = recording_forward      # instance attribute: nn.Module.__call__ finds it first
    try:
        yield record
    finally:
        del model.forward


def learner_call(fn, *args, forbidden: tuple[str, ...] = (), why: str = "write it yourself.", explain=None,
                 **kwargs):
    """fn(*args, **kwargs) with the forbidden engine functions raising.

    A crash inside the learner's function (anything but NotImplementedError, which
    means "not attempted") becomes ExerciseFailed naming the call, with
    `explain(exc)`'s diagnosis when it returns one, and only the learner's frames.
    """
    with forbid(fn, *forbidden, why=why):
        try:
            return fn(*args, **kwargs)
        except (NotImplementedError, ExerciseFailed):
            raise
        except Exception as exc:           # noqa: BLE001 (any crash of the learner's code is reported)
            crashed(fn, args, kwargs, exc, explain)


def grade_prediction(name: str, predicted, measured: float, rel_tol: float, why: str = "",
                     unit: str = "") -> float:
    """A "predict, then measure" answer: `predicted` (the learner's number, from the
    chapter's reasoning) against `measured` (the engine's or simulator's), within a
    stated relative tolerance. Returns the relative error; fails naming both numbers,
    the tolerance and, in `why`, the reasoning to revisit."""
    if isinstance(predicted, torch.Tensor) and predicted.numel() == 1:
        predicted = predicted.item()
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        fail(f"{name}: your prediction is {show(predicted)}; expected a number")
    if predicted != predicted:                              # NaN
        fail(f"{name}: your prediction is NaN")
    error = abs(predicted - measured) / max(abs(measured), 1e-300)
    if error > rel_tol:
        allowed = "an exact count" if rel_tol == 0 else f"{rel_tol * 100:g}%"
        fail(f"{name}: you predicted {predicted:,.6g}{unit}, the engine measures {measured:,.6g}{unit}, "
             f"{error * 100:.3g}% off (allowed: {allowed}){': ' + why if why else ''}")
    return error


# ---------------------------------------------------------------------------
# Added for issue 39 (chapters 1-5): exact counts, and K/V copies watched
# ---------------------------------------------------------------------------
def grade_count(name: str, predicted, measured: int, why: str = "", unit: str = "") -> None:
    """A "predict, then measure" answer that is an exact count (tolerance 0): fails naming both
    counts and their difference, never a percentage (a measured count may be 0, and a relative
    error against 0 is a division by zero: "6.4e+303% off")."""
    if isinstance(predicted, torch.Tensor) and predicted.numel() == 1:
        predicted = predicted.item()
    if isinstance(predicted, float) and predicted.is_integer():
        predicted = int(predicted)
    if isinstance(predicted, bool) or not isinstance(predicted, int):
        fail(f"{name}: your prediction is {show(predicted)}; expected a whole number{unit}")
    if predicted != measured:
        difference = predicted - measured
        fail(f"{name}: you predicted {predicted:,}{unit}, the engine counts {measured:,}{unit} "
             f"({abs(difference):,} too {'many' if difference > 0 else 'few'})"
             f"{': ' + why if why else ''}")


_GROWING_OPS = ("repeat_interleave", "repeat", "expand", "expand_as", "tile", "broadcast_to",
                "index_select", "__getitem__", "gather", "cat", "stack", "concat", "concatenate")


@contextlib.contextmanager
def watch_copies(*tensors: torch.Tensor):
    """Record the torch calls that turn one of `tensors` into a LARGER tensor (a repeat, an
    expand, a gather, a concatenation of it with itself...): a grouped-query attention that
    copies K or V to every query head shows up here; one that folds the query heads does not.
    Yields the list of (op name, input shape, output shape) found."""
    from torch.overrides import TorchFunctionMode

    watched = {t.data_ptr() for t in tensors}
    found: list[tuple[str, tuple, tuple]] = []

    def touches(value) -> torch.Tensor | None:
        if isinstance(value, torch.Tensor) and value.numel() and value.data_ptr() in watched:
            return value
        if isinstance(value, (list, tuple)):
            return next((t for t in map(touches, value) if t is not None), None)
        return None

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", str(func))
            if name in _GROWING_OPS and isinstance(out, torch.Tensor):
                source = touches(list(args))
                if source is None:
                    source = touches(list((kwargs or {}).values()))
                if source is not None and out.numel() > source.numel():
                    found.append((name, tuple(source.shape), tuple(out.shape)))
            return out

    with Watch():
        yield found
