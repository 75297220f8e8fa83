"""The code's shape in a few figures, read from ``src/opendrs`` with :mod:`ast` (nothing is run).

``python -m bench.structure [--root src/opendrs] [--top 5] [--json FILE]``

* the longest functions and the largest files, in lines;
* import cycles between files (strongly connected sets of modules that import each other, a
  function-level import included) and between opendrs's packages (``engine``, ``controller``…);
* private names used across modules: ``from M import _name`` or ``M._name`` where ``M`` is
  another opendrs module, and private attributes read on an object other than ``self`` or
  ``cls`` (``state._rows``: another class's insides) — tests are not read.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "opendrs"


@dataclass
class Module:
    name: str
    path: Path
    lines: int
    tree: ast.Module
    imports: set[str] = field(default_factory=set)
    private_uses: list[str] = field(default_factory=list)
    private_attributes: list[str] = field(default_factory=list)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.name.split(".")
    if module.path.name != "__init__.py":
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def read(root: Path) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = _module_name(root, path)
        modules[name] = Module(name, path, text.count("\n"), ast.parse(text))
    for module in modules.values():
        _read_imports(module, modules)
    return modules


def _known(name: str, modules: dict[str, Module]) -> str | None:
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _read_imports(module: Module, modules: dict[str, Module]) -> None:
    aliases: dict[str, str] = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target and target != module.name:
                    module.imports.add(target)
                    if alias.asname:
                        aliases[alias.asname] = target
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                whole = f"{source}.{alias.name}"
                target = whole if whole in modules else _known(source, modules)
                if target is None or target == module.name:
                    continue
                module.imports.add(target)
                if whole in modules:
                    aliases[alias.asname or alias.name] = whole
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    module.private_uses.append(f"{alias.name} from {target}")
    for node in ast.walk(module.tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            module.private_uses.append(f"{node.attr} of {aliases[node.value.id]}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            and not (isinstance(node.value, ast.Name) and node.value.id in aliases)
        ):
            module.private_attributes.append(f"{ast.unparse(node)} (line {node.lineno})")


def _functions(module: Module) -> Iterator[tuple[int, str]]:
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                yield length, f"{module.name}:{name}"
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    return walk(module.tree, "")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def _package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


def _is_package(module: Module) -> bool:
    return module.path.name == "__init__.py"


def measure(root: Path, top: int) -> dict[str, Any]:
    modules = read(root)
    functions = sorted(
        (f for m in modules.values() for f in _functions(m)), key=lambda f: (-f[0], f[1])
    )
    files = sorted(((m.lines, str(m.path)) for m in modules.values()), key=lambda f: (-f[0], f[1]))
    # A package's __init__ that only hands names on ties every module to its siblings: the
    # cycles are read between modules, each import pointing at the module that defines a name.
    file_graph = {
        m.name: {i for i in m.imports if not _is_package(modules[i])}
        for m in modules.values()
        if not _is_package(m)
    }
    package_graph: dict[str, set[str]] = defaultdict(set)
    for name, targets in file_graph.items():
        for target in targets:
            if _package(target) != _package(name):
                package_graph[_package(name)].add(_package(target))
    private = sorted(f"{m.name}: {use}" for m in modules.values() for use in m.private_uses)
    return {
        "longest_functions": [{"lines": n, "function": f} for n, f in functions[:top]],
        "functions_over_60_lines": sum(1 for n, _ in functions if n > 60),
        "median_function_lines": functions[len(functions) // 2][0] if functions else 0,
        "largest_files": [{"lines": n, "file": f} for n, f in files[:top]],
        "files_over_1000_lines": sum(1 for n, _ in files if n > 1000),
        "module_cycles": cycles(file_graph),
        "package_cycles": cycles(package_graph),
        "private_names_across_modules": private,
        "private_attributes_of_other_objects": sorted(
            f"{m.name}: {use}" for m in modules.values() for use in m.private_attributes
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.structure", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path("src") / PACKAGE)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    result = measure(args.root, args.top)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
