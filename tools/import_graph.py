"""The import graph of the ``comlrl`` package: cycles and upward arrows against the layer order.

    python tools/import_graph.py            # a report; exit status 1 when there is a cycle or an upward arrow
    python tools/import_graph.py --edges    # also every edge, "importer -> imported  (line)"

Every ``import`` / ``from ... import`` statement counts, wherever it is written: at module level,
inside a function, under ``if TYPE_CHECKING:``. A function-level import still makes its module
depend on the imported one, so hiding a cycle inside a function does not remove it. The graph is
read with ``ast`` only; nothing of ``comlrl`` is imported.

An edge goes from a module to the module it names: ``from comlrl.a import b`` names
``comlrl.a.b`` when that is a module (a file or package), else ``comlrl.a``. Importing a
submodule does not add an edge to its parent packages' ``__init__``.

The layers (docs/design.md, bottom-up; an import only points down or sideways within a package):

    core < models < rollout < parallel < checkpoint < telemetry < adapters < config < trainers < envs < runplan < cli < utils, schedulers

with two extra rules: ``comlrl.envs`` imports nothing of the training stack (only ``adapters`` and
itself), and the 1.4.x faces ``comlrl.utils`` / ``comlrl.schedulers`` may import anything but
nothing else imports them. ``comlrl/__init__.py`` (``__version__``, importing nothing of comlrl)
is below everything; ``comlrl/__main__.py`` is the top.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

LAYERS: Tuple[Tuple[str, ...], ...] = (
    ("core",), ("models",), ("rollout",), ("parallel",), ("checkpoint",), ("telemetry",), ("adapters",), ("config",),
    ("trainers",), ("envs",), ("runplan",), ("cli",), ("utils", "schedulers"),
)
"""Packages of ``comlrl`` from the bottom up; packages in one tuple share a level."""

ALLOWED: Dict[str, Set[str]] = {"envs": {"adapters"}}
"""Packages that may import only the listed others (and themselves), whatever their level."""

ROOT = "__root__"  # comlrl/__init__.py: below every layer (it imports nothing of comlrl)
TOP = "__main__"  # comlrl/__main__.py: above every layer


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  (line {self.line})"


def modules(root: str, package: str = "comlrl") -> Dict[str, str]:
    """Dotted module name -> file path, for every ``.py`` file under ``root/package``."""
    found: Dict[str, str] = {}
    base = os.path.join(root, package)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _absolute(module: str, is_package: bool, level: int, name: Optional[str]) -> str:
    """The absolute module a relative ``from`` names."""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def imports_of(module: str, path: str, known: Set[str], package: str = "comlrl") -> List[Edge]:
    """The edges from ``module`` to the modules of ``known`` it imports, anywhere in its file."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), filename=path)
    is_package = os.path.basename(path) == "__init__.py"
    edges: List[Edge] = []

    def add(target: str, line: int) -> None:
        while target and target not in known:  # comlrl.a.b.Name -> comlrl.a.b
            target = target.rpartition(".")[0]
        if target and target != module:
            edges.append(Edge(module, target, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module) if node.level else (node.module or "")
            if not (base == package or base.startswith(package + ".")):
                continue
            for alias in node.names:
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base, node.lineno)
    return edges


def graph(root: str, package: str = "comlrl") -> List[Edge]:
    """Every import edge between modules of ``package`` under ``root`` (one per statement and name)."""
    found = modules(root, package)
    known = set(found)
    return [edge for module, path in found.items() for edge in imports_of(module, path, known, package)]


def cycles(edges: Iterable[Edge]) -> List[List[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    adjacency: Dict[str, Set[str]] = {}
    for edge in edges:
        adjacency.setdefault(edge.source, set()).add(edge.target)
        adjacency.setdefault(edge.target, set())
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []
    counter = [0]

    def visit(start: str) -> None:  # iterative, so a deep graph cannot overflow the recursion limit
        work = [(start, iter(sorted(adjacency[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(adjacency[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(adjacency):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_package(module: str, package: str = "comlrl") -> str:
    """The first-level package of a module (``comlrl.cli.train`` -> ``cli``; ``comlrl`` -> ``ROOT``,
    ``comlrl.__main__`` -> ``TOP``)."""
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT
    return TOP if parts[1:] == ["__main__"] else parts[1]


def level(name: str, layers: Sequence[Tuple[str, ...]] = LAYERS) -> int:
    """The level of a first-level package (``ROOT`` below, ``TOP`` above everything); unknown packages raise."""
    if name == ROOT:
        return -1
    if name == TOP:
        return len(layers)
    for rank, names in enumerate(layers):
        if name in names:
            return rank
    raise ValueError(f"package comlrl.{name} is in no layer of tools/import_graph.py LAYERS; add it where it belongs.")


def upward(edges: Iterable[Edge], layers: Sequence[Tuple[str, ...]] = LAYERS,
           allowed: Optional[Dict[str, Set[str]]] = None) -> List[Edge]:
    """Edges that point up the layer order, sideways between two packages of one level, or out of an
    ``ALLOWED`` package's list."""
    allowed = ALLOWED if allowed is None else allowed
    bad = []
    for edge in edges:
        source, target = layer_package(edge.source), layer_package(edge.target)
        if source == target:
            continue
        if source in allowed:
            if target not in allowed[source]:
                bad.append(edge)
            continue
        if level(target, layers) >= level(source, layers):
            bad.append(edge)
    return bad


def package_cycles(edges: Iterable[Edge]) -> List[List[str]]:
    """Cycles between first-level packages (``cli`` <-> ``config``, ...)."""
    lifted = [Edge(layer_package(e.source), layer_package(e.target), e.line) for e in edges]
    return cycles(e for e in lifted if e.source != e.target)


def report(root: str, show_edges: bool = False) -> Tuple[str, int]:
    edges = graph(root)
    module_cycles, between, arrows = cycles(edges), package_cycles(edges), upward(edges)
    lines = [f"{len({e.source for e in edges} | {e.target for e in edges})} modules, {len(edges)} import statements"]
    lines.append(f"module cycles: {len(module_cycles)}")
    lines += ["  " + " <-> ".join(c) for c in module_cycles]
    lines.append(f"package cycles: {len(between)}")
    lines += ["  " + " <-> ".join(c) for c in between]
    lines.append(f"upward arrows: {len(arrows)}")
    lines += [f"  {e}" for e in arrows]
    if show_edges:
        lines += ["edges:"] + [f"  {e}" for e in edges]
    return "\n".join(lines), int(bool(module_cycles or between or arrows))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        help="the folder holding the comlrl package (default: this repository)")
    parser.add_argument("--edges", action="store_true", help="print every edge too")
    args = parser.parse_args(argv)
    text, status = report(args.root, args.edges)
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
