"""Render the engine's own source in a notebook, so chapters never copy code."""
from __future__ import annotations

import inspect


def show_source(obj, start: str | None = None, end: str | None = None):
    """Display the source of a function, class or module, highlighted.

    start/end: optional substrings; show only the lines from the first line
    containing `start` up to and including the first later line containing `end`.
    """
    from IPython.display import Code

    source = inspect.getsource(obj)
    if start is not None or end is not None:
        lines = source.splitlines()
        i = next((k for k, l in enumerate(lines) if start is None or start in l), None)
        if i is None:
            raise ValueError(f"start={start!r}: not found in the source of {obj!r}")
        j = next((k for k, l in enumerate(lines[i + 1:], i + 1) if end is not None and end in l), len(lines) - 1)
        source = "\n".join(lines[i:j + 1])
    return Code(source, language="python")
