"""Fail naming every import cycle between modules and between folders of the host's packages.

Builds the import graph with the standard library's ``ast`` (every ``import`` and ``from ... import``
anywhere in a module, including those under ``TYPE_CHECKING`` and inside functions), then looks for:

- two or more modules that import each other, directly or round a loop;
- two or more folders (packages) that import each other: a module's folder is the package it sits in, so a
  package and its parent count as two folders (``bot/channels`` importing ``bot.inbound`` while
  ``bot.commands`` imports ``bot.channels`` is a cycle).

Run by ``make lint``; exits 1 and prints each cycle with one import that makes each of its steps.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "bot", "runner", "container", "crewbot")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def folder_of(module: str, packages: set[str]) -> str:
    return module if module in packages else module.rpartition(".")[0]


def find_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            modules[module_name(path)] = path
    return modules


def imported(node: ast.AST, module: str, is_package: bool, modules: dict[str, Path]) -> list[str]:
    """The host modules one import statement names (a ``from`` import of a submodule names it)."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = module.split(".")
            if not is_package:
                anchor = anchor[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)] if node.level > 1 else anchor
            base = ".".join([*anchor, base] if base else anchor)
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = []
    for target in targets:
        while target and target not in modules:  # `import a.b.c` of a name inside a module
            target = target.rpartition(".")[0]
        if target and target != module:
            found.append(target)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            for target in imported(node, name, is_package, modules):
                graph[name].setdefault(target, node.lineno)  # type: ignore[attr-defined]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
    return found


def main() -> int:
    modules = find_modules()
    graph = import_graph(modules)
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    failed = False
    for component in cycles({name: set(targets) for name, targets in graph.items()}):
        failed = True
        print(f"module cycle: {', '.join(component)}")
        members = set(component)
        for name in component:
            for target, line in sorted(graph[name].items()):
                if target in members:
                    print(f"    {modules[name].relative_to(ROOT)}:{line} imports {target}")
    folder_edges: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for name, targets in graph.items():
        for target, line in targets.items():
            source, dest = folder_of(name, packages), folder_of(target, packages)
            if source != dest:
                folder_edges[source][dest].append(f"{modules[name].relative_to(ROOT)}:{line} imports {target}")
    folder_graph = {folder: set(folder_edges.get(folder, {})) for folder in packages}
    for component in cycles(folder_graph):
        failed = True
        print(f"folder cycle: {', '.join(component)}")
        members = set(component)
        for folder in component:
            for dest, where in sorted(folder_edges[folder].items()):
                if dest in members:
                    print(
                        f"    {folder} -> {dest}: {where[0]}" + (f" (+{len(where) - 1} more)" if len(where) > 1 else "")
                    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
