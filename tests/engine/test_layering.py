"""The engine gives codes and facts; words, the daemon and the command line are built on it, never
the other way round: no module of ``opendrs.engine`` imports from ``opendrs.report``,
``opendrs.controller`` or ``opendrs.cli`` (read from the source, so an import made only inside a
function or under ``TYPE_CHECKING`` counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

import opendrs.engine

ENGINE = Path(opendrs.engine.__file__).parent
#: The packages built on the engine.
EDGES = ("opendrs.report", "opendrs.controller", "opendrs.cli")


def _package(path: Path) -> list[str]:
    """The package of the engine's module ``path``, as its parts."""
    return ["opendrs", *path.relative_to(ENGINE.parent).parts[:-1]]


def _imported(source: str, package: list[str]) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, relative imports resolved."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _edge(module: str) -> bool:
    return any(module == edge or module.startswith(f"{edge}.") for edge in EDGES)


def test_the_engine_imports_nothing_from_the_edge() -> None:
    modules = sorted(ENGINE.rglob("*.py"))
    assert len(modules) > 50  # the whole engine is read
    found = {
        f"{path.relative_to(ENGINE)}: {module}"
        for path in modules
        for module in _imported(path.read_text(), _package(path))
        if _edge(module)
    }
    assert not found


def test_the_check_sees_an_edge_import() -> None:
    # An import of the edge, plain, from, relative or inside a function, is found.
    package = _package(ENGINE / "policy" / "decision.py")
    assert package == ["opendrs", "engine", "policy"]
    assert _edge("opendrs.report.reasons") and not _edge("opendrs.reporting")
    relative = "def f():\n    from ...report.words import decision_words\n"
    assert "opendrs.report.words" in _imported(relative, package)
    assert "opendrs.report" in _imported("from ... import report\n", package)
    assert _imported("import opendrs.cli.main\n", package) == {"opendrs.cli.main"}
    assert _imported("from .needs import Need\n", package) == {
        "opendrs.engine.policy.needs",
        "opendrs.engine.policy.needs.Need",
    }
