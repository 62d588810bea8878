"""A toy exercise for the grading tests: its checkers and hidden cases (a package written to a
temporary folder), and its solution source."""
import sys
from pathlib import Path

TOY_CHECKERS = '''
import random
from minillm.grading._common import call_text, checker, fail, learner_call, passed

@checker
def check_double(fn, seed=None):
    """fn(x) -> 2 * x."""
    rng = random.Random(seed)
    for x in [0, 1, -3] + [rng.randint(-1000, 1000) for _ in range(4)]:
        got = learner_call(fn, x)
        if got != 2 * x:
            fail(f"{call_text(fn, x)} returned {got!r}, expected {2 * x}")
    passed("it doubles")

@checker
def check_total(fn, seed=None):
    """fn(list of numbers) -> their sum."""
    rng = random.Random(seed)
    for numbers in [[], [1, 2]] + [[rng.randint(0, 9) for _ in range(5)] for _ in range(3)]:
        got = learner_call(fn, list(numbers))
        if got != sum(numbers):
            fail(f"{call_text(fn, numbers)} returned {got!r}, expected {sum(numbers)}")
    passed("it adds up")
'''
TOY_HIDDEN = '''
from toygrading.ch99 import fail
HIDDEN = {"check_double": [dict(seed=12345), dict(seed=999)]}

def hidden_check_total(fn):
    if fn(list(range(100))) != 4950:
        fail("total(list(range(100))) is not 4950")
'''
TOY_SOURCE = '''# %% [markdown]
# # A toy exercise

# %%
import toygrading.ch99 as ex

# %% [markdown]
# ## 1. Double it

# %%
def double(x):
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION

# %%
ex.check_double(double)  # points: 2

# %% [markdown]
# ## 2. Add them up

# %%
def total(numbers):
    ### BEGIN SOLUTION
    return sum(numbers)
    ### END SOLUTION

# %%
ex.check_total(total)  # points: 3
'''
TOY_MODULES = {"check_double": "toygrading.ch99", "check_total": "toygrading.ch99"}


def write_package(folder: Path) -> Path:
    """toygrading/ch99.py and toygrading/_hidden/ch99.py under `folder`; returns the source's path."""
    package = folder / "toygrading"
    (package / "_hidden").mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "ch99.py").write_text(TOY_CHECKERS)
    (package / "_hidden" / "__init__.py").write_text("")
    (package / "_hidden" / "ch99.py").write_text(TOY_HIDDEN)
    source = folder / "99_toy.py"
    source.write_text(TOY_SOURCE)
    return source


def public_cases(folder: Path) -> list[int]:
    """The inputs the public check_double tries (a learner sees them in its failure messages)."""
    sys.path.insert(0, str(folder))
    try:
        from toygrading import ch99
        seen = []
        ch99.check_double(lambda x: seen.append(x) or 2 * x)
        return seen
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith("toygrading")]:
            del sys.modules[name]


def hard_coded_double(cases: list[int]) -> str:
    """A body for double(*args) that knows the public cases' answers, and nothing else."""
    return f"return {{{', '.join(f'{x}: {2 * x}' for x in cases)}}}.get(args[0], 0)"
