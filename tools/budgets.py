"""The size budgets of docs/design.md: modules over 500 lines, functions over 60 lines (AST spans).

    python tools/budgets.py [ROOT]      exit 1 when anything is over
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Iterator, List, Tuple

MODULE_LINES = 500
FUNCTION_LINES = 60


def python_files(root: str) -> Iterator[str]:
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def over_budget(root: str) -> List[Tuple[str, str, int]]:
    """``(path, what, lines)`` of every module and function over its budget."""
    found = []
    for path in python_files(root):
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
        lines = source.count("\n") + (0 if source.endswith("\n") else 1)
        if lines > MODULE_LINES:
            found.append((path, "module", lines))
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                span = node.end_lineno - node.lineno + 1
                if span > FUNCTION_LINES:
                    found.append((path, f"{node.name}()", span))
    return found


def main(argv: List[str]) -> int:
    root = argv[0] if argv else "comlrl"
    found = over_budget(root)
    for path, what, lines in found:
        print(f"{path}: {what} {lines} lines")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
