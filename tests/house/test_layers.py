"""Every import points down: a lower layer never imports an upper one, and no package circles.

Floors, bottom to top (docs/architecture.md, "The house"):

0. `schemas`: the shared contract; imports nothing of the project.
1. `runtime`: the shared runtime (db, Kafka, outbox, consumer runtime, logging, errors,
   configuration files, health probes, the HTTP pieces every router shares, embedded services).
2. `chain`: the chain toolkit (JSON-RPC, ABI, fees, nonces, keys, transactions).
3. `indexer`, `relayer`, `verification`, `lifecycle`, `panels`: the services; none imports another.
4. `api`: the HTTP API, composing the services' routers.
5. `escrowd`: the application (CLI, consumers' CLI, `run`, pipeline wiring, devnet, traffic, harness).
6. `bench` and `tests`; `bench` does not import `tests`.

Imports are read with `ast` from every file, including imports inside functions (a lazy
import is still a dependency) and modules named in `importlib.import_module("...")` calls
with a literal; only `if TYPE_CHECKING:` blocks are skipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS: dict[str, int] = {
    "schemas": 0,
    "runtime": 1,
    "chain": 2,
    "indexer": 3,
    "relayer": 3,
    "verification": 3,
    "lifecycle": 3,
    "panels": 3,
    "api": 4,
    "escrowd": 5,
    "bench": 6,
    "tests": 6,
}
PACKAGES = tuple(FLOORS)
SERVICES = 3


def layer(module: str) -> tuple[int, str]:
    """(floor, package) of the layer `module` belongs to."""
    top = module.split(".")[0]
    return FLOORS.get(top, 6), top


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


def _is_import_module_call(node: ast.AST) -> bool:
    """`importlib.import_module("literal")` (or `import_module("literal")`)."""
    if not isinstance(node, ast.Call) or not node.args or not isinstance(node.args[0], ast.Constant):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name == "import_module" and isinstance(node.args[0].value, str)


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
            elif _is_import_module_call(child):
                assert isinstance(child, ast.Call)
                argument = child.args[0]
                assert isinstance(argument, ast.Constant)
                found.add(str(argument.value))
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
            sideways = rank == target_rank == SERVICES and name != target_name
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
    [("schemas/x.py", "runtime.kafka", True), ("runtime/db.py", "escrowd.cli", True), ("indexer/x.py", "api", True),
     ("runtime/db.py", "indexer.store", True), ("bench/x.py", "tests.support", True),
     ("relayer/x.py", "runtime.outbox", False), ("escrowd/run.py", "api", False),
     ("verification/x.py", "relayer.settlement", True), ("panels/x.py", "verification.structured", True),
     ("api/app.py", "panels.routes", False), ("chain/x.py", "relayer.sender", True),
     ("relayer/x.py", "chain.eth_rpc", False), ("lifecycle/x.py", "api.app", True)],
)  # fmt: skip
def test_the_rule_catches_upward_imports(source: str, target: str, bad: bool) -> None:
    """The checker itself: an upward or sideways import is a violation, a downward one is not."""
    rank, name = layer(source.removesuffix(".py").replace("/", "."))
    target_rank, target_name = layer(target)
    flagged = target_rank > rank or (rank == target_rank == SERVICES and name != target_name) or (
        name == "bench" and target_name == "tests"
    )
    assert flagged is bad


def test_no_package_circles() -> None:
    """At package level too: no two top-level packages import each other, lazily or not."""

    def package_of(module: str) -> str:
        return module.split(".")[0]

    edges: dict[str, set[str]] = {}
    for module, targets in graph().items():
        source = package_of(module)
        edges.setdefault(source, set()).update(package_of(t) for t in targets if package_of(t) != source)
    circles = sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))
    assert not circles, "package circles: " + "; ".join(circles)
