"""The shape of the tree, checked: small modules and functions, imports that point one way, and no path
of the machine the code was written on.

Sizes: no module in csi/ or shim/ over 400 lines, no function over 50 (the generated stubs in csi/_proto
aside; tests are exempt). ruff's mccabe and too-many-statements rules (pyproject.toml) bound the
complexity inside those 50 lines. Imports: read from the source (every import statement, including
those inside functions and under TYPE_CHECKING), so a cycle that only shows at type-checking time
counts too.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50
PACKAGES = ("csi", "shim")
GENERATED = ("csi/_proto/",)


def _sources() -> list[Path]:
    found = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    return [p for p in found if not str(p.relative_to(REPO)).startswith(GENERATED)]


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def test_the_size_checks_read_every_module() -> None:
    names = {str(p.relative_to(REPO)) for p in _sources()}
    assert {"csi/node.py", "csi/staging.py", "shim/translate.py", "csi/backends/local/backend.py"} <= names
    assert not any(n.startswith("csi/_proto/") for n in names)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(REPO)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    text = path.read_text()
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split the module by concern"
    long = [
        f"{f.name} (line {f.lineno}): {f.end_lineno - f.lineno + 1} lines"
        for f in _functions(ast.parse(text))
        if f.end_lineno is not None and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


# ---------------------------------------------------------------------------- imports


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules of csi/ and shim/ whose names `path` uses: `from a import b` is an import of the
    module a.b when there is one, else of a (the module defining b)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                member = f"{node.module}.{alias.name}"
                found.add(member if member in known else node.module)
    return found & known


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in _sources()}
    return {name: _imports(path, set(paths)) - {name} for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle, or []."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_no_import_cycles() -> None:
    graph = _graph()
    assert "csi.staging" in graph and "csi.devices" in graph["csi.staging"], "the graph reads the imports"
    cycle = _cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        pytest.param("shim", ("csi", "grpc", "google.protobuf"), id="shim-imports-neither-csi-nor-grpc"),
        pytest.param("csi.backends", ("grpc", "google.protobuf", "csi._proto"), id="backends-never-grpc"),
        pytest.param("csi.failures", ("grpc",), id="the-error-family-is-grpc-free"),
        pytest.param("csi.staging", ("grpc", "csi._proto"), id="the-staging-core-is-grpc-free"),
        pytest.param("csi.publishing", ("grpc", "csi._proto"), id="publishing-is-grpc-free"),
        pytest.param("csi.devices", ("grpc", "csi._proto"), id="devices-is-grpc-free"),
        pytest.param("csi.mount", ("grpc", "csi._proto"), id="mount-is-grpc-free"),
        pytest.param("csi.loop", ("grpc", "csi._proto", "csi.backends"), id="loop-below-the-backends"),
        pytest.param("csi.loopfind", ("grpc", "csi._proto", "csi.backends"), id="loopfind-too"),
    ],
)
def test_dependencies_point_one_way(importer: str, forbidden: tuple[str, ...]) -> None:
    offenders = []
    for path in _sources():
        name = _module_name(path)
        if name != importer and not name.startswith(importer + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{name}: {n}" for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)
            ]
    assert not offenders


def test_make_lint_is_what_ci_runs() -> None:
    makefile = (REPO / "Makefile").read_text()
    lint_recipe = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "scripts/lint" in lint_recipe
    ci = (REPO / "scripts" / "test").read_text()
    assert "scripts/lint" in ci and "ruff" not in ci and "mypy" not in ci, (
        "CI lints only through scripts/lint"
    )


# ---------------------------------------------------------------------------- self-contained

# Absolute paths of a development machine: home and root directories, and the shared workspace.
# Spelled in pieces so that this file does not match itself.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:" + "|".join(["wo" + "rk", "ho" + "me", "ro" + "ot"]) + r")/")


def _tracked_files() -> list[str]:
    """Tracked files and the new ones git does not ignore."""
    argv = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    out = subprocess.run(argv, cwd=REPO, capture_output=True, check=True)
    return [f for f in out.stdout.decode().split("\0") if f]


def test_no_absolute_machine_paths_in_the_tree() -> None:
    files = _tracked_files()
    assert "tests/shim/testdata/translation-vectors.json" in files, "the vectors are part of the tree"
    hits = []
    for name in files:
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        hits += [
            f"{name}:{i}: {line.strip()}"
            for i, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATH.search(line)
        ]
    assert not hits, (
        "absolute paths of one machine (tests and code must use paths in the repository):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    ("line", "found"),
    [
        pytest.param('VECTORS = Path("/' + 'work/shared/x.json")', True, id="workspace"),
        pytest.param("see /" + "home/alice/notes", True, id="home"),
        pytest.param("cache in /" + "root/.cache", True, id="root-home"),
        pytest.param("/proc/self/root/etc", False, id="proc-root-is-not-a-home"),
        pytest.param("{k}/pods/../../root/x", False, id="relative-dotdot"),
        pytest.param("/var/lib/kubelet/pods", False, id="kubelet"),
    ],
)
def test_the_machine_path_pattern(line: str, found: bool) -> None:
    assert bool(MACHINE_PATH.search(line)) is found
