"""Regenerate assets/prompts/code.jsonl and code_edit.jsonl from *held-out* stdlib files.

The tiny models are trained on the CPython standard library minus a held-out split
(explorer.training.tiny.corpus.is_heldout); prompts taken from held-out files were never trained on.

    python benchmarks/make_code_prompts.py
"""

from __future__ import annotations

import ast
import json
import sys
import sysconfig
from pathlib import Path

from explorer.training.tiny.corpus import find_stdlib_files, is_heldout

OUT = Path(__file__).resolve().parent.parent / "assets" / "prompts"
SKIP = ("encodings/", "lib2to3/")  # codec tables and fixers: not functions worth completing
PER_FILE = 2


def heldout_sources() -> list[tuple[str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [p for p in find_stdlib_files(root) if is_heldout(p.relative_to(root).as_posix())]
    return [(p.relative_to(root).as_posix(), p.read_text("utf-8")) for p in paths
            if not p.relative_to(root).as_posix().startswith(SKIP)]


def functions(source: str) -> list[ast.FunctionDef]:
    tree = ast.parse(source)
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and ast.get_docstring(n)
            and not n.name.startswith("__") and n.decorator_list == []]


def completion_prompt(lines: list[str], fn: ast.FunctionDef) -> str:
    """The def line(s) through the first line of the docstring."""
    doc = fn.body[0]
    return "\n".join(lines[fn.lineno - 1:doc.lineno]) + "\n"


def edit_prompt(lines: list[str], fn: ast.FunctionDef) -> str | None:
    """A short function, then the start of the same function renamed: the answer repeats the body."""
    body = lines[fn.lineno - 1:fn.end_lineno]
    if not 4 <= len(body) <= 14:
        return None
    indent = len(body[0]) - len(body[0].lstrip())
    body = [line[indent:] for line in body]
    new_name = fn.name + "_v2"
    return ("\n".join(body) + f"\n\n\n# The same function, renamed to {new_name}:\n"
            + body[0].replace(f"def {fn.name}(", f"def {new_name}(", 1) + "\n")


def main() -> int:
    code, edit = [], []
    for rel, source in heldout_sources():
        lines = source.splitlines()
        fns = functions(source)
        for fn in fns[:PER_FILE]:
            code.append({"id": f"{rel}:{fn.name}", "prompt": completion_prompt(lines, fn)})
        for fn in fns:
            prompt = edit_prompt(lines, fn)
            if prompt is not None and len([e for e in edit if e["id"].startswith(rel)]) < PER_FILE:
                edit.append({"id": f"{rel}:{fn.name}", "prompt": prompt})
    for name, rows in (("code.jsonl", code), ("code_edit.jsonl", edit)):
        with open(OUT / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"{name}: {len(rows)} prompts (Python {sys.version.split()[0]} stdlib, held-out files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
