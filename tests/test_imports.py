"""No module of ``explorer`` imports another in a circle, function-level imports included (issue 25).

The graph is read from the source (``ast``), so a deferred ``import`` inside a function counts like one at the
top: it is a cycle all the same, only hidden. An import that points into ``explorer`` is an edge; one to a
package (``explorer.app``) points at its ``__init__``. A module that imports its own package's ``__init__``
does not count (a package re-exporting its modules is not a knot in the layers).

An import inside a function is allowed only for a heavy or optional dependency, and says so on its (first) line:
``# deferred: <the dependency and its cost>``. Everything else is imported at the top of its module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "explorer"
DEFERRED = re.compile(r"#\s*deferred:\s*\S")  # a comment that names what is deferred and why


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every explorer module a module's source names in an import, at any depth."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}  # ``from pkg import module``
    return {m for m in out if m == "explorer" or m.startswith("explorer.")}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = imported(ast.parse(path.read_text()), name, path.name == "__init__.py")
        own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        graph[name] = {t for t in targets if t in files and t != name and t not in own_packages}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_explorer():
    cycles = find_cycles(import_graph())
    assert not cycles, "modules importing each other in a circle: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_sees_a_cycle_through_a_deferred_import():
    """Negative control: a function-level import that closes a circle is found."""
    a = ast.parse("from explorer.b import x\n")
    b = ast.parse("def f():\n    from explorer.a import y\n")
    graph = {"explorer.a": imported(a, "explorer.a", False), "explorer.b": imported(b, "explorer.b", False)}
    graph = {k: {t for t in v if t in graph} for k, v in graph.items()}
    assert find_cycles(graph) == [["explorer.a", "explorer.b"]]
    assert find_cycles({"explorer.a": {"explorer.b"}, "explorer.b": set()}) == []



def unmarked_deferred_imports(source: str) -> list[int]:
    """The lines of the imports inside a function body whose (first) line has no ``# deferred: <reason>``."""
    lines = source.splitlines()
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not DEFERRED.search(lines[node.lineno - 1]):
                    found.add(node.lineno)
    return sorted(found)


def test_every_function_level_import_says_why_it_is_deferred():
    unmarked = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
                for n in unmarked_deferred_imports(p.read_text())]
    assert not unmarked, ("imports inside a function without '# deferred: <reason>' (move them to the top of the "
                          "module, or name the heavy dependency they defer): " + ", ".join(unmarked))


def test_the_deferral_check_flags_an_unannotated_function_level_import():
    """Negative control: a bare import, an empty reason, a comment off the first line and a nested function's import
    are flagged; a module-level import and an annotated one (also on a multi-line import) are not."""
    source = ("import json\n"
              "def f():\n"
              "    import copy\n"
              "    from transformers import (  # deferred: transformers (~2 s to import)\n"
              "        AutoConfig,\n"
              "    )\n"
              "    from peft import PeftModel  # deferred:\n"
              "    from explorer.app import (\n"
              "        ui,  # deferred: gradio\n"
              "    )\n"
              "    def g():\n"
              "        import csv  # noqa\n")
    assert unmarked_deferred_imports(source) == [3, 7, 8, 12]
    assert unmarked_deferred_imports("def f():\n    import peft  # deferred: peft (optional)\n") == []


def test_every_module_is_under_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) >= 400}
    assert not long, f"modules of 400 lines or more: {long}"


def defined_names(path: Path) -> set[str]:
    """The names a module defines itself: functions, classes and assigned globals (not what it imports)."""
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def test_each_name_has_one_import_path():
    """A name is imported from the module that defines it: ``from explorer.models import X`` only for what
    models.py itself defines (presets, loading), never for a name it imported from runtime or a family."""
    own = defined_names(PACKAGE / "models.py")
    wrong = []
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "explorer.models":
                wrong += [f"{path.relative_to(ROOT)}: {a.name}" for a in node.names if a.name not in own]
    assert not wrong, f"imported from explorer.models but defined elsewhere: {wrong}"
