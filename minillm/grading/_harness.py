"""The grader's side of a graded notebook's kernel (`python -m minillm grade`).

The grade command runs, in one kernel: `begin()` (before any of the learner's cells),
then the learner's cells, then one `grade_task(task)` per task of the notebook's manifest
entry. So the checks are the teacher's, run on the functions the learner defined, never
the learner's check cells or their `ex`:

- `begin()` imports the checkers and takes a snapshot of every function, class and module
  bound in the loaded modules of minillm, torch, numpy and the standard helpers, and of
  the methods of their classes;
- `grade_task()` first puts back whatever a learner's cell rebound there (a checker
  replaced, `torch.allclose` made to agree, `fail` made silent) and names it; runs the
  public checker, then the hidden cases of `<package>._hidden.<module>` when the teacher
  has them, on the learner's functions; fails the task if the learner's function rebinds
  any of those while it is checked; and refuses values of a class the notebook made (an
  object equal to everything, a tensor subclass) where the checkers expect plain values.

What it cannot stop: code in the same process that goes after the grader's own state
(IPython's input transformers, the snapshot found through `gc`). Such a notebook is plain
to see when read; docs/teaching.md ("Grading a class") says so.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import inspect
import io
import json
import os
import sys
import sysconfig
import warnings

MARKER = "\x1eminillm-grade-result "
# Modules whose functions and classes a notebook could rebind to fool a check.
PROTECTED = ("minillm", "torch", "numpy", "math", "builtins", "operator", "functools", "itertools", "random",
             "collections", "copy", "inspect", "contextlib", "zlib", "statistics", "types", "re", "json",
             "dataclasses", "fractions", "decimal", "heapq", "bisect")
_HEAP_TYPE = 1 << 9                      # Py_TPFLAGS_HEAPTYPE: a class whose attributes can be set
_MAX_ITEMS = 1_000_000                   # values looked at in one returned structure


class _State:
    snapshot: list = []                  # (namespace owner, {name: original}) pairs
    trusted_types: frozenset = frozenset()   # every class that existed before the learner's cells
    known_ids: set = set()                   # ids of the snapshotted objects
    library_dirs: tuple = ()
    checkers: dict = {}                  # "module.check_name" -> the genuine checker, taken in begin()


def _protected(value) -> bool:
    return callable(value) or isinstance(value, (type(sys), property, staticmethod, classmethod))


def _take_snapshot(roots: set):
    with warnings.catch_warnings():          # some modules warn when a deprecated member is touched
        warnings.simplefilter("ignore")
        return _members_of_protected_modules(roots)


def _members_of_protected_modules(roots: set):
    snapshot = []
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in roots:
            continue
        try:
            members = dict(vars(module))
        except TypeError:
            continue
        snapshot.append((module, {k: v for k, v in members.items() if _protected(v)}))
        for value in members.values():
            if isinstance(value, type) and value.__flags__ & _HEAP_TYPE and getattr(value, "__module__", None) == name:
                snapshot.append((value, {k: v for k, v in vars(value).items() if _protected(v)}))
    return snapshot


def _every_class() -> frozenset:
    """Every class that exists now: a class the notebook defines later is not among them."""
    seen, stack = {object, type}, [object]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
    return frozenset(seen)


def begin(modules: tuple[str, ...] = ()) -> None:
    """Before the learner's first cell: import the checkers (and their hidden cases), remember
    the genuine objects."""
    import minillm.grading  # noqa: F401  (every public checker)
    for module in modules:
        importlib.import_module(module)
        _hidden_module(module)
    roots = set(PROTECTED) | {module.split(".")[0] for module in modules}   # and the checkers' own package
    _State.snapshot, _State.trusted_types = _take_snapshot(roots), _every_class()
    _State.known_ids = {id(value) for _, members in _State.snapshot for value in members.values()}
    _State.library_dirs = _library_dirs()
    _State.checkers = {}
    for module in modules:
        mod = sys.modules[module]
        for name in getattr(mod, "__all__", ()) or [n for n in vars(mod) if n.startswith("check_")]:
            _State.checkers[f"{module}.{name}"] = getattr(mod, name)


def _owner_name(owner) -> str:
    return getattr(owner, "__name__", None) if isinstance(owner, type(sys)) else \
        f"{owner.__module__}.{owner.__qualname__}"


# The kernel itself rebinds these for every cell (ipykernel routes input() to the frontend).
KERNEL_REBINDS = {"builtins.input", "builtins.raw_input"}


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths["stdlib"], paths["platstdlib"], paths["purelib"], paths["platlib"], sys.prefix, sys.base_prefix,
            os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}            # minillm/
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs)


def _defined_in_a_library(value) -> bool:
    """Whether a value that replaced a snapshotted one is a library's own (torch wraps
    torch.manual_seed when torch._dynamo is first imported; it registers properties lazily),
    not the notebook's: new, and its code in a file of the standard library, site-packages or
    minillm. A notebook's cell compiles to a file of its own, elsewhere."""
    if id(value) in _State.known_ids:          # an object that was already there, moved: the notebook's doing
        return False
    if isinstance(value, property):
        value = value.fget
    elif isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    elif isinstance(value, functools.partial):
        value = value.func
    try:
        value = inspect.unwrap(value)
    except ValueError:
        return False
    if isinstance(value, type):
        filename = getattr(sys.modules.get(value.__module__), "__file__", None)
    else:
        filename = getattr(getattr(value, "__code__", None), "co_filename", None)
    return bool(filename) and os.path.realpath(filename).startswith(_State.library_dirs)


def restore() -> list[str]:
    """Put back every snapshotted name the notebook rebound or deleted; return their names.
    A library's own late rebinding (see _defined_in_a_library) is kept and becomes the reference."""
    changed = []
    for owner, members in _State.snapshot:
        current = vars(owner)
        for name, original in list(members.items()):
            now = current.get(name, _State)
            if now is original:
                continue
            dotted = f"{_owner_name(owner)}.{name}"
            if dotted in KERNEL_REBINDS:
                continue
            if now is not _State and _defined_in_a_library(now):
                members[name] = now
                continue
            changed.append(dotted)
            try:
                setattr(owner, name, original)
            except (AttributeError, TypeError):
                pass
    return changed


# ---------------------------------------------------------------------------
# Plain values only
# ---------------------------------------------------------------------------
def _foreign(value, budget: list) -> type | None:
    """The first value's class that was not there before the learner's cells ran, or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            return None
        kind = type(item)
        if kind not in _State.trusted_types:
            return kind
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif getattr(getattr(item, "dtype", None), "kind", None) == "O":     # a numpy array of objects
            stack.extend(item.ravel().tolist())
    return None


def _check_plain(value, what: str):
    from minillm.grading._common import fail
    kind = _foreign(value, [_MAX_ITEMS])
    if kind is not None:
        fail(f"{what} returned an object of class {kind.__qualname__}, which the notebook itself defines: "
             f"return plain values (numbers, strings, lists, tuples, dicts, tensors), as the task asks")
    return value


def guarded(fn, name: str):
    """The learner's function, its results checked for classes the notebook made."""
    if not callable(fn):
        return fn

    @functools.wraps(fn)
    def plain_results(*args, **kwargs):
        return _check_plain(fn(*args, **kwargs), f"{name}(...)")
    plain_results._graded_function = fn      # what forbid() patches around: the learner's globals
    return plain_results


# ---------------------------------------------------------------------------
# One task
# ---------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _hidden_module(module: str):
    package, _, leaf = module.rpartition(".")
    try:
        return importlib.import_module(f"{package}._hidden.{leaf}")
    except ModuleNotFoundError as exc:
        if exc.name in (f"{package}._hidden", f"{package}._hidden.{leaf}"):
            return None                  # a student release, or no hidden cases for this chapter
        raise


def _cases(task: dict) -> list:
    """(label, kwargs for the checker or a hidden_check function): the public case, then the hidden ones."""
    cases = [("", {})]
    hidden = _hidden_module(task["module"])
    if hidden is not None:
        cases += [(f"hidden case {case}", case) for case in getattr(hidden, "HIDDEN", {}).get(task["checker"], [])]
        extra = getattr(hidden, f"hidden_{task['checker']}", None)
        if extra is not None:
            cases.append(("hidden check", extra))
    return cases


def _check(task: dict, check, functions: dict, cases: list) -> tuple[str, str]:
    from minillm.grading._common import ExerciseFailed
    try:
        argument = eval(task["argument"], {"__builtins__": {}}, functions)     # the teacher's expression
        if not callable(argument):
            argument = _check_plain(argument, task["argument"])
        for label, case in cases:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                try:
                    case(argument) if callable(case) else check(argument, **case)
                except (AssertionError, ExerciseFailed) as exc:
                    return "failed", (f"{label}: " if label else "") + _first_line(exc)
    except NotImplementedError:
        return "not attempted", "not attempted (NotImplementedError)"
    except Exception as exc:             # noqa: BLE001 (the learner's code may raise anything)
        return "error", f"{type(exc).__name__}: {_first_line(exc)}"
    return "passed", ""


def run_task(task: dict, namespace: dict) -> dict:
    """Grade one task on the functions in `namespace`: {status, message, tampered, hidden}.

    status: passed, failed, not attempted, missing (the notebook does not define the
    function), error (a crash, or no such checker)."""
    tampered = restore()
    result = {"status": "passed", "message": "", "tampered": tampered, "hidden": 0}
    missing = [name for name in task["functions"] if name not in namespace]
    if missing:
        return {**result, "status": "missing",
                "message": f"the notebook defines no {', '.join(missing)}: the task was deleted or renamed"}
    check = _State.checkers.get(f"{task['module']}.{task['checker']}")
    if check is None:
        return {**result, "status": "error",
                "message": f"no checker {task['module']}.{task['checker']} (is the manifest older than the package?)"}
    cases = _cases(task)
    functions = {name: guarded(namespace[name], name) for name in task["functions"]}
    status, message = _check(task, check, functions, cases)
    during = restore()                   # the learner's function rebound something while it ran
    if during:
        status, message = "failed", f"the learner's code rebinds {', '.join(during[:3])} while it is checked"
    return {**result, "status": status, "message": message, "hidden": len(cases) - 1,
            "tampered": tampered + [name for name in during if name not in tampered]}


def grade_task(task: dict) -> None:
    """What a grading cell runs: one task, its result printed on one marked line."""
    from IPython import get_ipython
    result = run_task(task, get_ipython().user_ns)
    print(MARKER + json.dumps({"id": task["id"], **result}))


def assert_task(task: dict) -> None:
    """The nbgrader route's hidden-tests block: raise unless the task passes the teacher's checks."""
    from IPython import get_ipython
    if f"{task['module']}.{task['checker']}" not in _State.checkers:    # the set-up cell did not run
        begin((task["module"],))
    result = run_task(task, get_ipython().user_ns)
    if result["status"] == "not attempted":
        raise NotImplementedError(result["message"])
    if result["status"] != "passed":
        raise AssertionError(result["message"])
