"""Checkers for the exercise notebooks: they grade the method, not only the number.

Conventions (chapter 8's checkers and any new exercise follow them):

Layout
    minillm/grading/chNN.py        the checkers of exercises/NN_*.ipynb; `__all__`
                                   lists only `check_*` functions.
    minillm/grading/_common.py     fail / passed / `checker` (the decorator every
                                   check_* wears), `learner_call` (call the learner's
                                   function: forbidden names raise, a crash becomes one
                                   clean message), `call_text` (the failing case as a
                                   call: `my_causal_mask(1, 7)`), `forbid` (engine
                                   functions that are the answer raise while the
                                   learner runs), `spy` (record the learner's calls to
                                   an allowed engine function, e.g. the steps passed to
                                   predict_step), `record_forward` (count and inspect
                                   forward passes), `grade_prediction` (a "predict,
                                   then measure" answer against the measurement).
    minillm/grading/_reference/    reference solutions and engine-driven expected
                                   values (private: never re-exported here, never
                                   imported by an exercise notebook nor, from issue
                                   39 on, by chapters 1-5's public checkers).
    minillm/grading/_hidden/       teacher-only cases per checker: HIDDEN =
                                   {check_name: [kwargs, ...]} (other seeds) and
                                   hidden_check_name(fn) (the reference answers on
                                   shapes the public check does not try).
    minillm/grading/grade.py       `python -m minillm grade [notebook or folder]`.
    This package exports only the `check_*` functions of the chNN modules.

A checker
    `@checker def check_<task>(fn, seed=None, ...)`: the decorator makes seed=None a
    FIXED seed per checker (stable_seed(name)), so the failing case a learner is
    debugging does not move between runs, and makes a pass return None, so the check
    cell shows the pass line and no stray `True`.
    1. Computes the expected values first (engine or _reference), THEN calls the
       learner's function through `learner_call(fn, *args, forbidden=(...), why=...,
       explain=...)`, so a learner who calls the engine's own function gets a message
       saying so, and a crash in the learner's code becomes one message naming the
       call (`explain(exc)` may diagnose it: a raw einsum error becomes "K and V have
       2 heads, q has 4: expand them (GQA)").
    2. Checks the method where there is one: `record_forward(model)` counts the
       forward passes and their query/cached lengths and positions; intermediate
       values are compared, not only the result; some inputs are ones the
       engine's helpers refuse (so a wrapper around them cannot pass).
    3. Starts with a few hand-picked cases that catch the usual slips, then
       random ones; a hard-coded answer for the default inputs fails there.
    4. On the first problem calls `fail(message)`: raises ExerciseFailed (an
       AssertionError) which a notebook shows ONCE as "Not yet: message", with no
       traceback through the checker (its `_render_traceback_`); the cell still
       fails. The FIRST LINE of the message is what the grade table shows: the
       failing case as a call with the learner's function's name (`call_text`), what
       it returned, what was expected and the likely mistake by name ("that is the
       TOP-LEFT mask: the chunk's queries are the last ...").
    5. On success calls `passed(message)` (prints "✓ message").
    6. Never catches NotImplementedError: a stub left as is propagates it and
       the grade command counts the task "not attempted".
    7. Each chapter has transfer tasks (the chapter's reasoning on a case it did
       not print) and a "predict, then measure" task (`grade_prediction`: the
       learner's number against the engine's measurement, with a stated
       tolerance, and the method checked too); a learner who copies the
       chapter's printed code earns at most half the points.

An exercise notebook (source: exercises/solutions/src/NN_topic.py)
    - imports `minillm.grading as ex` and only what the tasks may use (never
      the module that holds the answer, never minillm.book.figures internals);
    - each task: a markdown cell "## N. Title" with the statement (what may and
      may not be called) and a collapsed hint `<details><summary>Hint</summary>...
      </details>` that gives the idea and the question to ask, never the
      expression to copy (tests/test_exercise_hints.py: no line of the answer in
      a hint), a code cell with the function between `### BEGIN SOLUTION` /
      `### END SOLUTION`, and a check cell whose first line is
      `ex.check_<task>(fn)  # points: P`;
    - at least three tasks, warm-up to hard; the whole notebook under 60 s.
    tools/nb.py turns that into the solution notebook, the learner copy (stubs)
    and nbgrader metadata (solution cells: grade_id = the function; check cells:
    grade_id = the checker, points = P).

Tests
    tests/test_grading_shortcuts.py (the shared machinery), tests/test_grading_ch01_05.py,
    tests/test_grading_ch06_10.py and tests/test_grading_ch09.py list, per checker, a correct answer and
    shortcut attempts (the engine's own function, skipping the method, a
    hard-coded value for the default inputs, a wrong-but-close variant, the
    chapter's printed code on a transfer task); each must fail with a message
    that names the mistake. tests/test_exercise_sync.py checks that the learner
    copies fail only at their stubs; tests/test_exercise_hints.py that no hint
    holds a line of its answer.
"""
import importlib
import pkgutil

__all__: list[str] = []
for _info in pkgutil.iter_modules(__path__):
    if _info.name.startswith("_") or not _info.name.startswith("ch"):
        continue
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_module, "__all__", ()):
        if not _name.startswith("check_"):
            raise ImportError(f"{_module.__name__}.__all__ lists {_name!r}: only check_* functions are exported")
        if _name in __all__:      # one flat namespace: a second chapter's checker would shadow the first's
            raise ImportError(f"{_module.__name__}.{_name}: another chapter already exports a checker of that name")
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
for _leftover in ("_info", "_module", "_name"):
    globals().pop(_leftover, None)
