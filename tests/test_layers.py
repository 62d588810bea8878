"""The package's layers: the core never imports the simulator or the book's
tools, the simulator never imports the book, and `import minillm` stays light."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minillm"
CORE = sorted(p for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
SIM = sorted((PACKAGE / "sim").glob("*.py"))
HEAVY = ("matplotlib", "ipywidgets", "IPython")


def imported_modules(path: Path, package: str) -> set[str]:
    """Absolute names of every module a file imports (relative imports resolved)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def test_there_is_a_core_and_a_simulator():
    assert {p.stem for p in CORE} >= {"engine", "scheduler", "kv_cache", "attention", "model"}
    assert {p.stem for p in SIM} >= {"simulator", "cost_model", "accounting", "hardware", "workloads"}


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_imports_neither_simulator_nor_book(path):
    bad = {m for m in imported_modules(path, "minillm")
           if m.startswith(("minillm.sim", "minillm.book", "minillm.grading", "minillm.serve"))
           or m.split(".")[0] in HEAVY}
    assert not bad, f"core module {path.name} imports {sorted(bad)}: arrows point down only"


@pytest.mark.parametrize("path", SIM, ids=lambda p: p.name)
def test_simulator_module_never_imports_the_book(path):
    bad = {m for m in imported_modules(path, "minillm.sim")
           if m.startswith(("minillm.book", "minillm.grading")) or m.split(".")[0] in HEAVY}
    assert not bad, f"simulator module {path.name} imports {sorted(bad)}"


SERVE = sorted((PACKAGE / "serve").glob("*.py"))


@pytest.mark.parametrize("path", SERVE, ids=lambda p: p.name)
def test_server_module_uses_only_the_core(path):
    bad = {m for m in imported_modules(path, "minillm.serve")
           if m.startswith(("minillm.sim", "minillm.book", "minillm.grading")) or m.split(".")[0] in HEAVY}
    assert not bad, f"server module {path.name} imports {sorted(bad)}"


def test_import_minillm_loads_no_plotting_stack_and_no_simulator():
    code = ("import sys, minillm; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('matplotlib', 'ipywidgets') or m.startswith(('minillm.sim', 'minillm.book'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.strip()
    assert out == "[]", f"import minillm loads {out}"


def test_outer_layers_stay_reachable_by_their_old_names():
    import minillm
    assert minillm.simulator.simulate is minillm.simulate
    assert callable(minillm.hardware.calibrate) and callable(minillm.widgets.lab)
    assert callable(minillm.workloads.long_prompt_interference)
    assert callable(minillm.accounting.step_cost)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        minillm.nope


def _module_of(name: str) -> str | None:
    """The package module a dotted import name lands in (None outside minillm)."""
    if not name or not name.startswith("minillm"):
        return None
    parts = name.split(".")
    while parts:
        base = PACKAGE.parent.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts)
        parts.pop()
    return None


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, function-level imports included."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = name if rel.name == "__init__" else name.rsplit(".", 1)[0]
        targets = {_module_of(m) for m in imported_modules(path, package)} - {None, name}
        # `from . import x` names x itself; the package's own __init__ is only an edge
        # when nothing more precise was named
        graph[name] = {t for t in targets if not any(o.startswith(t + ".") for o in targets)}
    return graph


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(node):                                   # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles (function-level imports count): {cycles}"
