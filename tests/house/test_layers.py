"""Every import points down: a lower layer never imports an upper one, and no module circles.

Layers, bottom to top (docs/architecture.md, "The house"):

0. `schemas`: the shared contract; imports nothing of the project.
1. `runtime`: the shared runtime (db, Kafka, outbox, consumer runtime, logging, errors,
   configuration files, health probes, embedded services): used by the services.
2. `indexer` and `relayer`: the services; neither imports the other.
3. `escrowd`: the application (CLI, `run`, pipeline wiring, devnet, traffic, harness).
4. `bench` and `tests`; `bench` does not import `tests`.

Imports are read with `ast` from every file, including imports inside functions (a lazy
import is still a dependency); only `if TYPE_CHECKING:` blocks are skipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "runtime", "escrowd", "indexer", "relayer", "bench", "tests")


def layer(module: str) -> tuple[int, str]:
    """(rank, name) of the layer `module` belongs to."""
    top = module.split(".")[0]
    if top == "schemas":
        return 0, "schemas"
    if top == "runtime":
        return 1, "runtime"
    if top == "escrowd":
        return 3, "escrowd application"
    if top in ("indexer", "relayer"):
        return 2, top
    return 4, top


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path, known: set[str]) -> set[str]:
    """Project modules `path` imports (resolved to modules where `from pkg import mod`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in child.names if f"{base}.{a.name}" in known)
            visit(child)

    visit(tree)
    return {m for m in found if m.split(".")[0] in PACKAGES and m != this}


def graph() -> dict[str, set[str]]:
    files = list(project_files())
    known = {module_name(f) for f in files}
    edges: dict[str, set[str]] = {}
    for f in files:
        # A parent package is imported implicitly with its children: not an edge of its own.
        edges[module_name(f)] = {m for m in imports(f, known) if not module_name(f).startswith(m + ".")}
    return edges


def test_every_import_points_down() -> None:
    violations = []
    for module, targets in sorted(graph().items()):
        rank, name = layer(module)
        for target in sorted(targets):
            target_rank, target_name = layer(target)
            upward = target_rank > rank
            sideways = rank == target_rank == 2 and name != target_name
            bench_to_tests = name == "bench" and target_name == "tests"
            if upward or sideways or bench_to_tests:
                violations.append(f"{module} ({name}) imports {target} ({target_name})")
    assert not violations, "imports against the layers:\n" + "\n".join(violations)


def test_no_import_circles() -> None:
    edges = graph()
    # Tarjan's strongly connected components over the project modules.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "source,target,bad",
    [("schemas/x.py", "runtime.kafka", True), ("runtime/db.py", "escrowd.cli", True), ("indexer/x.py", "relayer.api", True),
     ("runtime/db.py", "indexer.store", True), ("bench/x.py", "tests.support", True),
     ("relayer/x.py", "runtime.outbox", False), ("escrowd/run.py", "relayer.api", False)],
)  # fmt: skip
def test_the_rule_catches_upward_imports(source: str, target: str, bad: bool) -> None:
    """The checker itself: an upward or sideways import is a violation, a downward one is not."""
    rank, name = layer(source.removesuffix(".py").replace("/", "."))
    target_rank, target_name = layer(target)
    flagged = target_rank > rank or (rank == target_rank == 2 and name != target_name) or (
        name == "bench" and target_name == "tests"
    )
    assert flagged is bad
