"""The tree follows the map of docs/design.md: packages by idea, one name for one thing."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import shared

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "shared"
CODE = ("shared", "api", "worker")
# The client's typed results mirror the API's response bodies of the same name, by design.
MIRRORED = {"ConversationInfo", "SummaryInfo"}
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


def code_files() -> list[Path]:
    """Every module of the three packages."""
    return sorted(p for package in CODE for p in (ROOT / package).rglob("*.py"))


def test_each_public_name_stands_for_one_thing() -> None:
    """No two modules of `shared`, `api` and `worker` define a public class or function of the
    same name (but the client's results that mirror the API's bodies)."""
    where: dict[str, list[str]] = {}
    for path in code_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twins = {
        name: paths
        for name, paths in where.items()
        if len(paths) > 1 and not name.startswith("_") and name not in MIRRORED
    }
    assert twins == {}


def test_every_module_opens_with_a_one_line_summary() -> None:
    """A module's docstring starts with one line, then a blank line or its end."""
    long = []
    for path in code_files():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        lines = (doc or "").strip("\n").split("\n")
        if doc is None or (len(lines) > 1 and lines[1].strip()):
            long.append(str(path.relative_to(ROOT)))
    assert long == []


def map_sections() -> dict[str, str]:
    """The subsections of docs/design.md's "The map", by heading (`shared/`, `api/`, ...)."""
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("## The map")
    end = text.index("\n## ", start + 1)
    parts = re.split(r"^### (.+)$", text[start:end], flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_the_design_map_names_every_module_and_package() -> None:
    """docs/design.md's map names each module at the top of `shared`, `api` and `worker` and
    each of their subpackages, and every module it names exists."""
    sections = map_sections()
    for package in CODE:
        text = sections[f"{package}/"]
        named = set(re.findall(r"`(\w+)\.py`", text))
        top = {p.stem for p in (ROOT / package).glob("*.py")} - {"__init__"}
        packages = {p.parent.name for p in (ROOT / package).glob("*/__init__.py")}
        existing = {p.stem for p in (ROOT / package).rglob("*.py")}
        assert top - named == set(), package
        assert {f"{name}/" for name in packages} - set(re.findall(r"`(\w+/)`", text)) == set()
        assert named - existing == set(), package


def test_the_api_never_imports_the_workers() -> None:
    """`api` enqueues tasks by name: no module of it imports `worker`."""
    found = []
    for path in (ROOT / "api").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "worker"]
    assert found == []


def test_the_tests_mirror_the_packages() -> None:
    """Every test package but the root's stands for a package of the code of the same path."""
    tests = ROOT / "tests"
    strays = [
        str(p.parent.relative_to(tests))
        for p in tests.rglob("__init__.py")
        if p.parent != tests and not (ROOT / p.parent.relative_to(tests)).is_dir()
    ]
    assert strays == []
