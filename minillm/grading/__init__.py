"""Checkers for the exercise notebooks: they grade the method, not only the number.

Conventions (chapter 8's checkers and any new exercise follow them):

Layout
    minillm/grading/chNN.py        the checkers of exercises/NN_*.ipynb; `__all__`
                                   lists only `check_*` functions.
    minillm/grading/_common.py     fail / passed, `forbid` (engine functions that
                                   are the answer raise while the learner runs),
                                   `spy` (record the learner's calls to an allowed
                                   engine function, e.g. the steps passed to
                                   predict_step), `record_forward` (count and
                                   inspect forward passes), `learner_call`.
    minillm/grading/_reference/    reference solutions and engine-driven expected
                                   values (private: never re-exported here, never
                                   imported by an exercise notebook).
    minillm/grading/grade.py       `python -m minillm grade [notebook or folder]`.
    This package exports only the `check_*` functions of the chNN modules.

A checker
    `check_<task>(fn, seed=None, ...)`: seed=None draws fresh inputs every run.
    1. Computes the expected values first (engine or _reference), THEN calls the
       learner's function inside `forbid(fn, "minillm.x.the_answer", ...)`, so a
       learner who calls the engine's own function gets a message saying so.
    2. Checks the method where there is one: `record_forward(model)` counts the
       forward passes and their query/cached lengths and positions; intermediate
       values are compared, not only the result; some inputs are ones the
       engine's helpers refuse (so a wrapper around them cannot pass).
    3. Starts with a few hand-picked cases that catch the usual slips, then
       random ones; a hard-coded answer for the default inputs fails there.
    4. On the first problem calls `fail(message)`: prints "Not yet: message" and
       raises ExerciseFailed (an AssertionError). The FIRST LINE of the message
       is what the grade table shows: say the input, what the learner returned,
       what was expected and the likely mistake (chapter 4's messages are the
       model: "that is the TOP-LEFT mask. The chunk's queries are the last ...").
    5. On success calls `passed(message)` (prints "✓ message") and returns True.
    6. Never catches NotImplementedError: a stub left as is propagates it and
       the grade command counts the task "not attempted".

An exercise notebook (source: exercises/solutions/src/NN_topic.py)
    - imports `minillm.grading as ex` and only what the tasks may use (never
      the module that holds the answer, never minillm.book.figures internals);
    - each task: a markdown cell "## N. Title" with the statement and a
      collapsed hint `<details><summary>Hint</summary>...</details>`, a code cell
      with the function between `### BEGIN SOLUTION` / `### END SOLUTION`, and a
      check cell whose first line is `ex.check_<task>(fn)  # points: P`;
    - at least three tasks, warm-up to hard; the whole notebook under 60 s.
    tools/nb.py turns that into the solution notebook, the learner copy (stubs)
    and nbgrader metadata (solution cells: grade_id = the function; check cells:
    grade_id = the checker, points = P).

Tests
    tests/test_grading_shortcuts.py lists, per checker, a correct answer and
    shortcut attempts (the engine's own function, skipping the method, a
    hard-coded value for the default inputs, a wrong-but-close variant); each
    must fail with "Not yet". tests/test_exercise_sync.py checks that the learner
    copies fail only at their stubs.
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
