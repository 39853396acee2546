"""The image recipe, checked without a container engine: stages, OS packages, user, entrypoint, context."""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from csi.mount import REQUIRED_TOOLS
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
# Shared libraries Python packages load at run time (not programs csi/mount.py runs).
LIBRARY_PACKAGES = {"libudev1": "pyudev loads libudev.so.1"}


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction: comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the build stages, in order."""
    args: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            words = rest.split()
            base = words[0]
            for name, value in args.items():
                base = base.replace("${" + name + "}", value).replace("$" + name, value)
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(base, alias))
        elif not found:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, value = rest.partition("=")
            args[name] = value
        else:
            found[-1].instructions.append((keyword, rest))
    return args, found


def apt_packages(stage: Stage) -> list[str]:
    """Packages named by `apt-get install` in the stage's RUN instructions."""
    packages: list[str] = []
    for run in stage.all("RUN"):
        for command in run.split("&&"):
            words = shlex.split(command)
            if "apt-get" in words and "install" in words:
                packages += [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]
    return packages


@pytest.fixture(scope="module")
def parsed() -> tuple[dict[str, str], list[Stage]]:
    return stages(DOCKERFILE.read_text())


def runtime(parsed: tuple[dict[str, str], list[Stage]]) -> Stage:
    return parsed[1][-1]


def test_two_stages_build_a_wheel_then_install_it(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    _, all_stages = parsed
    assert len(all_stages) == 2
    build, final = all_stages
    assert any(run.startswith("pip wheel") for run in build.all("RUN"))
    assert any(f"--from={build.name}" in copy for copy in final.all("COPY"))
    assert any("pip install" in run and "--no-index" in run for run in final.all("RUN"))
    for stage in all_stages:
        assert stage.base.startswith("python:3.11-slim"), stage.base


def test_runtime_installs_exactly_the_tools_the_node_runs(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    installed = apt_packages(runtime(parsed))
    assert len(installed) == len(set(installed)), "a package is listed twice"
    assert set(installed) == set(REQUIRED_TOOLS.values()) | set(LIBRARY_PACKAGES)
    assert apt_packages(parsed[1][0]) == [], "the build stage needs no OS packages"


def test_apt_layer_is_lean(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    (run,) = [r for r in runtime(parsed).all("RUN") if "apt-get install" in r]
    assert "--no-install-recommends" in run
    assert "rm -rf /var/lib/apt/lists/*" in run


def test_default_user_is_not_root(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    users = runtime(parsed).all("USER")
    assert users, "the runtime stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in ("0", "root")
    # The chart's controller runs as this uid; a mismatch would leave the local data dir unwritable.
    chart_values = (REPO / "charts" / "ballast-csi" / "values.yaml").read_text()
    assert f"runAsUser: {user}" in chart_values


def test_entrypoint_is_the_installed_console_script(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    (entrypoint,) = runtime(parsed).all("ENTRYPOINT")
    assert json.loads(entrypoint) == ["ballast-csi"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "ballast-csi" in project["scripts"]


def installed_extras(stage: Stage, command: str) -> set[str]:
    """Extras named by `pip <command> ... ballast-csi[a,b]` / `".[a,b]"` in the stage's RUN lines."""
    for run in stage.all("RUN"):
        for part in run.split("&&"):
            words = shlex.split(part)
            if words[:2] == ["pip", command] or words[:3] == ["python", "-m", command]:
                for word in words:
                    if "[" in word and word.endswith("]"):
                        return set(word[word.index("[") + 1 : -1].split(","))
    return set()


def test_image_carries_the_kube_extra_for_the_migration_controller(
    parsed: tuple[dict[str, str], list[Stage]],
) -> None:
    build, final = parsed[1]
    assert {"aws", "kube"} <= installed_extras(build, "wheel")
    assert installed_extras(final, "install") == installed_extras(build, "wheel")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("kubernetes") for dep in extras["kube"])


def test_chart_migration_deployment_runs_an_installed_console_script() -> None:
    """The chart overrides the entrypoint with `ballast-migrate controller`: the image must have it."""
    from tests.chart.render import containers, only, render

    container = containers(only(render("migration"), "Deployment", of="migration"))["ballast-migrate"]
    assert container["command"] == ["ballast-migrate"]
    assert container["args"][0] == "controller"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["ballast-migrate"] == "shim.cli:main"


def copy_sources(stage: Stage) -> list[str]:
    sources: list[str] = []
    for copy in stage.all("COPY"):
        words = [w for w in copy.split() if not w.startswith("--")]
        sources += words[:-1]
    return sources


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore excludes `path` or one of its parent directories (no `!` rules used)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        for candidate in candidates:
            if fnmatch.fnmatch(candidate, pattern) or fnmatch.fnmatch(candidate.split("/")[-1], bare):
                return True
    return False


def test_build_context_keeps_what_the_build_copies(parsed: tuple[dict[str, str], list[Stage]]) -> None:
    patterns = [
        p.strip() for p in DOCKERIGNORE.read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns)
    sources = copy_sources(parsed[1][0])
    assert {"pyproject.toml", "csi", "shim"} <= set(sources)
    for source in sources:
        assert not ignored(source, patterns), f".dockerignore drops {source}, which the build copies"
    for heavy in (".venv", ".git", "tests", "charts", ".tools"):
        assert ignored(heavy, patterns), f"{heavy} would bloat the build context"


def test_copied_sources_build_a_complete_wheel(
    parsed: tuple[dict[str, str], list[Stage]], tmp_path: Path
) -> None:
    """What the build stage copies is enough to build the wheel, and the wheel carries the whole driver."""
    context = tmp_path / "context"
    context.mkdir()
    for source in copy_sources(parsed[1][0]):
        for path in REPO.glob(source):
            target = context / path.relative_to(REPO)
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(path, target)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            ".",
        ],
        cwd=context,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("ballast_csi-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = ("csi/server.py", "csi/mount.py", "csi/_proto/csi_pb2.py", "shim/cli.py", "shim/gates.py")
    for module in (*modules, "shim/migrate/controller.py", "shim/migrate/engine.py"):
        assert module in names, module
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "ballast-csi = csi.__main__:main" in text
    assert "ballast-migrate = shim.cli:main" in text
