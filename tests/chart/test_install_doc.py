"""The helm commands docs/install.md tells people to run render with the chart as written: each
`helm install`/`helm upgrade` of its shell blocks, and each `--set` snippet meant to be added to one,
goes through `helm template` (values schema included) and must succeed."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

import pytest

from tests.chart.render import CHART, RENDER_KUBE_VERSION, run_helm
from tests.conftest import REPO

INSTALL = REPO / "docs" / "install.md"
SHELL_BLOCK = re.compile(r"^[ \t]*```(?:sh|bash|shell|console)\n(.*?)^[ \t]*```", re.M | re.S)
INLINE_SET = re.compile(r"`(--set(?:-string)?\s[^`]+)`")
# Plausible stand-ins for the `<placeholder>`s the reader replaces; anything else gets DEFAULT_FILL.
FILLS = {"node": "node-1", "account": "111122223333", "role": "ballast", "release": "ballast"}
DEFAULT_FILL = "example"
VALUE_FLAGS = {"-n", "--namespace", "-f", "--values", "--version", "--timeout"}
VALUE_FLAGS |= {"--set", "--set-string", "--set-file", "--set-json", "--set-literal"}
# Flags about the release helm keeps in the cluster; `helm template` has none to reuse or reset.
RELEASE_ONLY = {"--reuse-values", "--reset-values", "--reset-then-reuse-values", "--install", "-i"}


@dataclass(frozen=True)
class Documented:
    line: int
    text: str  # with line continuations joined and placeholders filled


def fill(text: str) -> str:
    return re.sub(r"<([^<>\s]+)>", lambda m: FILLS.get(m[1], DEFAULT_FILL), text)


def shell_commands(markdown: str) -> list[Documented]:
    """Every command of the shell code blocks, a backslash-newline joining its lines."""
    found = []
    for block in SHELL_BLOCK.finditer(markdown):
        first = markdown.count("\n", 0, block.start(1)) + 1
        lines = block[1].split("\n")
        start, pending = first, ""
        for offset, line in enumerate(lines):
            if not pending:
                start = first + offset
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            if pending.strip():
                found.append(Documented(start, fill(pending.strip())))
            pending = ""
    return found


def inline_snippets(markdown: str) -> list[Documented]:
    """`--set ...` spans of the prose: options the reader adds to the install command."""
    return [
        Documented(markdown.count("\n", 0, m.start()) + 1, fill(m[1])) for m in INLINE_SET.finditer(markdown)
    ]


def documented() -> tuple[list[Documented], list[Documented]]:
    """(helm install/upgrade commands, `--set` snippets) of docs/install.md."""
    markdown = INSTALL.read_text()
    commands = shell_commands(markdown)
    helm = [c for c in commands if re.match(r"helm (install|upgrade)\s", c.text)]
    snippets = [c for c in commands if c.text.startswith("--set")] + inline_snippets(markdown)
    return helm, snippets


def as_template(argv: list[str]) -> tuple[list[str], str]:
    """`helm install|upgrade NAME CHART flags...` -> (`template NAME flags...`, CHART)."""
    positional: list[str] = []
    flags: list[str] = []
    words = iter(argv[2:])
    for word in words:
        if word in RELEASE_ONLY:
            continue
        if word.startswith("-"):
            flags.append(word)
            if word in VALUE_FLAGS:
                flags.append(next(words))
        else:
            positional.append(word)
    assert len(positional) == 2, f"expected NAME CHART, got {positional}"
    return ["template", positional[0], *flags], positional[1]


def render_ok(args: list[str]) -> None:
    result = run_helm([*args, "--kube-version", RENDER_KUBE_VERSION], {})
    assert result.returncode == 0, result.stderr


COMMANDS, SNIPPETS = documented()


def test_the_guide_has_install_and_upgrade_commands() -> None:
    verbs = {shlex.split(c.text)[1] for c in COMMANDS}
    assert verbs == {"install", "upgrade"}
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("command", COMMANDS, ids=[f"install.md:{c.line}" for c in COMMANDS])
def test_documented_helm_command_renders(command: Documented) -> None:
    args, chart = as_template(shlex.split(command.text))
    assert (REPO / chart).resolve() == CHART.resolve()
    render_ok(args)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"install.md:{s.line}" for s in SNIPPETS])
def test_documented_set_snippet_renders(snippet: Documented) -> None:
    render_ok(["template", "ballast", "-n", "kube-system", *shlex.split(snippet.text)])


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        pytest.param(
            "```sh\nhelm install a \\\n  --set x=1\n```\n",
            [Documented(2, "helm install a   --set x=1")],
            id="continuation-joined",
        ),
        pytest.param(
            "text\n```bash\nkubectl get x\n\nhelm upgrade a\n```\n",
            [Documented(3, "kubectl get x"), Documented(5, "helm upgrade a")],
            id="one-per-command",
        ),
        pytest.param("```yaml\nhelm install a\n```\n", [], id="other-language-skipped"),
        pytest.param(
            "```sh\n--set k=<node>,v=<x>\n```\n", [Documented(2, "--set k=node-1,v=example")], id="filled"
        ),
    ],
)
def test_shell_commands_are_extracted(markdown: str, expected: list[Documented]) -> None:
    assert shell_commands(markdown) == expected


def test_a_shell_eaten_backslash_is_caught() -> None:
    """The failure this guards against: unquoted `a\\.b` loses its backslash and nests the key."""
    args = shlex.split(r"--set controller.nodeSelector.kubernetes\.io/hostname=node-1")
    result = run_helm(["template", "ballast", *args, "--kube-version", RENDER_KUBE_VERSION], {})
    assert result.returncode != 0
