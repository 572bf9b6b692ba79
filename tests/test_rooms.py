"""The rooms of the tree, held by their imports.

The front (the gymnasium contract) knows no processes, pipes, shared memory or Ray: it imports
none of the process backend's modules, nor Ray's, nor the system modules they stand on. And
no two modules of ``subvec`` import each other, even for types only, through any path.

Both checks read the source (``ast``): every import counts, at the top, inside a function or
under ``if TYPE_CHECKING:``. The rooms are the table below: a name is a module, or a package
and every module in it.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

import subvec

#: The gymnasium contract over any backend.
FRONT = ("subvec._front",)
#: What the front may not import: the process backend, Ray, and what they stand on.
NOT_FOR_THE_FRONT = (
    "subvec._process",
    "subvec._ray",
    "subvec._ray_actor",
    "subvec.ray",
    "ray",
    "multiprocessing",
    "select",
)
#: The backends, which never import the front (only the public classes see both rooms).
BACKENDS = ("subvec._process", "subvec._ray", "subvec._ray_actor")

PACKAGE_DIR = Path(subvec.__file__).parent


def _file_of(name: str) -> Path | None:
    """The source of module ``name`` (a package's ``__init__.py``), None if there is none."""
    parts = name.split(".")
    assert parts[0] == "subvec", name
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _modules_in(name: str) -> list[str]:
    """``name`` itself and, for a package, every module in it (none if it does not exist)."""
    path = _file_of(name)
    if path is None:
        return []
    if path.name != "__init__.py":
        return [name]
    found = []
    for file in sorted(path.parent.rglob("*.py")):
        rel = file.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(".".join(parts))
    return found


def _all_modules() -> list[str]:
    return _modules_in("subvec")


def _is_package(name: str) -> bool:
    path = _file_of(name)
    return path is not None and path.name == "__init__.py"


def _imports(name: str) -> Iterator[tuple[str, int]]:
    """Every module ``name`` imports, with the line (see :func:`_imports_in`)."""
    path = _file_of(name)
    assert path is not None, name
    package = name if _is_package(name) else name.rpartition(".")[0]
    return _imports_in(path.read_text(), package, str(path))


def _imports_in(source: str, package: str, where: str = "<source>") -> Iterator[tuple[str, int]]:
    """Every module ``source`` (a module of ``package``) imports, anywhere in it, with the
    line: absolute names, relative ones resolved; ``from P import m`` yields ``P.m`` too
    where that is a module of ours."""
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module, node.lineno
            for alias in node.names:
                child = f"{module}.{alias.name}"
                if child.startswith("subvec.") and _file_of(child) is not None:
                    yield child, node.lineno


def _within(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


def test_every_import_counts() -> None:
    source = """
from typing import TYPE_CHECKING
import select
if TYPE_CHECKING:
    from subvec._process.shm import BlockLayout
def later():
    import multiprocessing.connection
    from .._process import pool
    from ._x import y
"""
    found = {name for name, _ in _imports_in(source, "subvec._front")}
    assert {"select", "subvec._process.shm", "multiprocessing.connection"} <= found
    assert {
        "subvec._process.pool",
        "subvec._front._x",
    } <= found  # relative, from a package's module


def _front_modules() -> list[str]:
    return [m for name in FRONT for m in _modules_in(name)]


def test_the_room_table_names_real_modules() -> None:
    # A typo in the table would make the rule below pass by checking nothing.
    missing = [n for n in FRONT + BACKENDS if _file_of(n) is None]
    assert not missing
    assert len(_front_modules()) >= 10
    for name in NOT_FOR_THE_FRONT:
        if name.startswith("subvec."):
            assert _file_of(name) is not None, name
        else:
            assert importlib.util.find_spec(name) is not None or name == "ray", name


@pytest.mark.parametrize("module", _front_modules())
def test_the_front_imports_no_process_or_ray_module(module: str) -> None:
    wrong = sorted(
        f"{imported} (line {line})"
        for imported, line in _imports(module)
        if any(_within(imported, room) for room in NOT_FOR_THE_FRONT)
    )
    assert not wrong, f"{module} imports what the front may not: {wrong}"


def test_the_front_reaches_no_process_or_ray_module_through_another() -> None:
    # The shared modules the front imports (the vocabulary, the spaces, the batch arrays...)
    # must not lead back into a backend either, type-only imports included.
    graph = _graph()
    came_from: dict[str, str] = {m: m for m in _front_modules()}
    todo = list(came_from)
    while todo:
        module = todo.pop()
        for imported in graph[module]:
            if imported not in came_from:
                came_from[imported] = module
                todo.append(imported)

    def path(module: str) -> str:
        chain = [module]
        while came_from[chain[-1]] != chain[-1]:
            chain.append(came_from[chain[-1]])
        return " -> ".join(reversed(chain))

    wrong = [
        path(m)
        for m in sorted(came_from)
        if any(_within(m, room) for room in NOT_FOR_THE_FRONT if room.startswith("subvec."))
    ]
    assert not wrong, "the front reaches a backend's module:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", [m for name in BACKENDS for m in _modules_in(name)])
def test_a_backend_imports_no_front_module(module: str) -> None:
    wrong = sorted(
        f"{imported} (line {line})"
        for imported, line in _imports(module)
        if _within(imported, "subvec._front")
    )
    assert not wrong, f"{module} imports the front: {wrong}"


def _graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports. Importing ``a.b.c`` runs ``a`` and ``a.b``
    first, so those count too, except a package the importer is inside (it is running)."""
    ours = set(_all_modules())
    graph: dict[str, set[str]] = {}
    for module in ours:
        edges = set()
        for imported, _ in _imports(module):
            parts = imported.split(".")
            for k in range(1, len(parts) + 1):
                target = ".".join(parts[:k])
                if target in ours and target != module and not _within(module, target):
                    edges.add(target)
        graph[module] = edges
    return graph


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module: each is one cycle or
    more (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(set(component))
    return components


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the first module of ``component`` (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & component):
            if child == start:
                return [*paths[node], start]
            if child not in paths:
                paths[child] = [*paths[node], child]
                queue.append(child)
    raise AssertionError(f"no cycle in {component}")


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _components(graph) == [{"a", "b", "c"}]
    assert _cycle_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    graph["c"].add("b")
    assert _cycle_in(graph, {"a", "b", "c"}) == ["a", "b", "c", "a"]
    assert _components({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    graph = _graph()
    assert graph.get("subvec._front.front")  # the graph was read
    cycles = [
        " -> ".join(_cycle_in(graph, c)) + f" (modules in cycles together: {sorted(c)})"
        for c in _components(graph)
    ]
    assert not cycles, "import cycles (type-only ones included):\n" + "\n".join(cycles)
