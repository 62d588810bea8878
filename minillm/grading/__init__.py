"""Checkers for the exercise notebooks, one module per chapter (ch01.py, ...).

Each checker compares the learner's function with the engine on fresh random
inputs, prints what is wrong when it is, and raises AssertionError so that the
notebook stops there.
"""
import importlib
import pkgutil

__all__: list[str] = []
for _info in pkgutil.iter_modules(__path__):
    _module = importlib.import_module(f"{__name__}.{_info.name}")
    for _name in getattr(_module, "__all__", ()):
        globals()[_name] = getattr(_module, _name)
        __all__.append(_name)
