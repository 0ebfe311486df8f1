"""Class checks that only fail when they run: `isinstance(x, A | B | T)` where `T` is a tuple of
classes raises TypeError (a union of classes cannot take a tuple), and so does `except A | T:`.

The consumer runtime had exactly that on its retry path, so the first retryable failure of a
batch crashed the consumer instead of retrying it; mypy does not see it. This reads every
module's source: a name bound at module level to a tuple literal must not appear in a `|`
union of an `isinstance`/`issubclass` call or an `except` clause (splat it into a tuple:
`(A, B, *T)`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "runtime", "chain", "indexer", "relayer", "verification", "lifecycle", "panels", "api",
            "escrowd", "bench")  # fmt: skip


def _tuple_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Tuple):
            targets = [node.target]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _union_members(node: ast.expr) -> Iterator[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        yield from _union_members(node.left)
        yield from _union_members(node.right)
    else:
        yield node


def _checked_unions(tree: ast.Module) -> Iterator[tuple[int, ast.expr]]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2):
            yield node.lineno, node.args[1]
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            yield node.lineno, node.type


def problems(source: str, where: str) -> list[str]:
    """Each union that carries a module-level tuple, as `where:line: name`."""
    tree = ast.parse(source)
    tuples = _tuple_names(tree)
    found = []
    for line, expr in _checked_unions(tree):
        if not (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr)):
            continue
        for member in _union_members(expr):
            if isinstance(member, ast.Tuple) or (isinstance(member, ast.Name) and member.id in tuples):
                found.append(f"{where}:{line}: {ast.unparse(member)} is a tuple inside a `|` union")
    return found


def test_the_check_finds_the_bug_it_is_for() -> None:
    source = (
        "_T = (KeyError, ValueError)\n"
        "def f(exc):\n"
        "    return isinstance(exc, OSError | RuntimeError | _T)\n"
        "def g():\n"
        "    try:\n        pass\n    except OSError | _T:\n        pass\n"
        "def h(exc):\n"
        "    return isinstance(exc, (OSError, *_T)) or isinstance(exc, OSError | KeyError)\n"
    )
    assert [p.split(": ", 1)[0] for p in problems(source, "m.py")] == ["m.py:3", "m.py:7"]


def test_no_class_union_carries_a_tuple() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found += problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert found == []
