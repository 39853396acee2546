"""The failpoint names the code defines and the ones docs/recovery.md lists, read from the source.

A name is a string literal passed to `failpoints.hit(...)`, or a string in a module-level constant whose
name ends in `FAILPOINTS` (for steps chosen by a table, such as CreateVolume's by content source). The
docs list each name in backticks in the first column of a table row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("csi", "shim")
RECOVERY = REPO / "docs" / "recovery.md"
NAME = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)+")
DOC_ROW = re.compile(r"^\|\s*`([a-z0-9.-]+)`\s*\|", re.M)


def _hit_argument(node: ast.AST) -> str | None:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    func = node.func
    if func.attr != "hit" or not (isinstance(func.value, ast.Name) and func.value.id == "failpoints"):
        return None
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _table_strings(node: ast.AST) -> list[str]:
    if not isinstance(node, ast.Assign | ast.AnnAssign):
        return []
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not any(isinstance(t, ast.Name) and t.id.endswith("FAILPOINTS") for t in targets):
        return []
    if node.value is None:
        return []
    return [
        c.value
        for c in ast.walk(node.value)
        if isinstance(c, ast.Constant) and isinstance(c.value, str) and NAME.fullmatch(c.value)
    ]


def in_code() -> dict[str, str]:
    """Every failpoint name in csi/ and shim/ -> where it is (path:line)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            where = str(path.relative_to(REPO))
            for node in ast.walk(tree):
                name = _hit_argument(node)
                if name is not None:
                    found.setdefault(name, f"{where}:{getattr(node, 'lineno', 0)}")
            for node in tree.body:
                for name in _table_strings(node):
                    found.setdefault(name, f"{where}:{node.lineno}")
    return found


def in_docs(path: Path = RECOVERY) -> list[str]:
    """The names docs/recovery.md lists (in table order, duplicates kept so a test can see them)."""
    return DOC_ROW.findall(path.read_text())
