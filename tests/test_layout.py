"""The tree shows the architecture: the library at the root of `shared`, the service's parts in
subpackages, no import cycles, and neither FastAPI nor Celery anywhere in `shared`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import shared

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "shared"
SUBPACKAGES = {
    "client",
    "commands",
    "counting",
    "formats",
    "providers",
    "service",
    "store",
    "strategies",
    "summaries",
}


def modules() -> dict[str, Path]:
    """Every module of `shared`, by dotted name (a package by its own name)."""
    out = {}
    for path in SHARED.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `shared` that `path` imports, at any depth (TYPE_CHECKING included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shared"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), packages' own
    re-exports of their submodules left out."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                out.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_shared_modules_import_each_other_without_cycles() -> None:
    """No two modules of `shared` need each other (calibration/counters and planning/policy
    were the last two)."""
    known = modules()
    graph = {
        name: {m for m in imports(path, known) if m in known and not m.startswith(f"{name}.")}
        for name, path in known.items()
    }
    assert cycles(graph) == []


def test_the_library_is_at_the_root_and_the_service_in_subpackages() -> None:
    """`shared`'s packages are the ones the design names, and the library's public names are
    importable from `shared` itself."""
    packages = {p.parent.name for p in SHARED.glob("*/__init__.py")}
    assert packages == SUBPACKAGES
    public = {"ContextPolicy", "SummaryBook", "TiktokenCounter", "PrefitClient"}
    assert public <= set(shared.__all__)


def test_shared_imports_neither_fastapi_nor_celery() -> None:
    """Importing every module of `shared` loads neither framework (a fresh interpreter)."""
    names = sorted(modules())
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('fastapi', 'celery', 'starlette') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
