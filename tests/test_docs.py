"""The docs keep up with the code: every driver flag, env fallback and chart value is documented."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from csi.config import build_parser
from shim.cli import build_parser as build_migrate_parser
from shim.gates import GATES
from tests.conftest import REPO

DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"
CHART = REPO / "charts" / "ballast-csi"
GUIDES = (
    "README.md",
    "install.md",
    "configuration.md",
    "migration.md",
    "writing-a-backend.md",
    "architecture.md",
)


def mentioned(text: str, token: str) -> bool:
    """`token` appears as a whole word (a `--data-dir` mention does not count for `--data`)."""
    return re.search(rf"(?<![\w.-]){re.escape(token)}(?![\w-])", text) is not None


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def flags(parser: argparse.ArgumentParser) -> list[str]:
    return [
        opt
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for opt in action.option_strings
        if opt.startswith("--")
    ]


def env_fallbacks(parser: argparse.ArgumentParser) -> list[str]:
    """Environment variables named in the help texts as `[NAME]` or `[NAME, ...]`."""
    return [m for a in parser._actions for m in re.findall(r"\[([A-Z][A-Z0-9_]+)[,\]]", a.help or "")]


def leaf_paths(values: Any, schema: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Dotted paths of the chart's settings: recurse where the schema lists properties, else a leaf."""
    properties = schema.get("properties")
    if isinstance(values, dict) and values and properties is not None:
        for key, value in values.items():
            yield from leaf_paths(value, properties[key], f"{prefix}{key}.")
    else:
        yield prefix.rstrip(".")


def chart_leaves() -> list[str]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    return list(leaf_paths(values, schema))


@pytest.fixture(scope="module")
def configuration() -> str:
    return CONFIGURATION.read_text()


def test_every_driver_flag_is_documented(configuration: str) -> None:
    parser = build_parser()
    expected = flags(parser)
    for name, sub in subparsers(parser).items():
        assert mentioned(configuration, f"ballast-csi {name}"), name
        expected += flags(sub)
    assert len(expected) >= 20
    assert [f for f in expected if not mentioned(configuration, f)] == []


def test_every_env_fallback_is_documented(configuration: str) -> None:
    names = env_fallbacks(build_parser())
    assert "CSI_ENDPOINT" in names and "CSI_NODE_ID" in names
    assert [n for n in names if not mentioned(configuration, n)] == []


def test_every_feature_gate_is_documented(configuration: str) -> None:
    assert [g.name for g in GATES if not mentioned(configuration, g.name)] == []


def test_every_chart_value_is_documented(configuration: str) -> None:
    leaves = chart_leaves()
    assert "backend.aws.credentialsSecret.name" in leaves and "migration.enabled" in leaves
    assert "controller.nodeSelector.kubernetes.io/os" not in leaves  # free-form maps are one setting
    assert [leaf for leaf in leaves if not mentioned(configuration, leaf)] == []


def test_docs_name_no_chart_value_that_does_not_exist(configuration: str) -> None:
    """A renamed value must not linger in the reference under its old name."""
    leaves = set(chart_leaves())
    prefixes = {leaf.split(".")[0] for leaf in leaves}
    documented = set(re.findall(r"`([a-z][A-Za-z]*(?:\.[A-Za-z]+)+)`", configuration))
    stale = {
        d
        for d in documented
        if d.split(".")[0] in prefixes and not any(leaf == d or leaf.startswith(d + ".") for leaf in leaves)
    }
    assert stale == set()


@pytest.mark.parametrize("guide", GUIDES)
def test_guide_links_resolve(guide: str) -> None:
    text = (DOCS / guide).read_text()
    assert text.startswith("# ")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (DOCS / target).resolve().exists(), f"{guide}: broken link {target}"


def test_migration_guide_uses_real_cli_commands() -> None:
    text = (DOCS / "migration.md").read_text()
    commands = subparsers(build_migrate_parser())
    used = set(re.findall(r"ballast-migrate ([a-z-]+)", text))
    assert {"plan", "translate"} <= used
    assert used <= set(commands)
    for command in ("plan", "translate"):
        for flag in re.findall(rf"ballast-migrate {command}\b[^\n`]*", text):
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", flag):
                assert option in flags(commands[command]), f"ballast-migrate {command} has no {option}"


def test_backend_guide_names_every_abstract_method() -> None:
    from csi.backends.base import Backend

    text = (DOCS / "writing-a-backend.md").read_text()
    assert [m for m in sorted(Backend.__abstractmethods__) if not mentioned(text, m)] == []


def test_the_architecture_names_only_files_that_exist() -> None:
    text = (DOCS / "architecture.md").read_text()
    named = set(re.findall(r"(?<![\w/])((?:csi|shim|tests)/[\w/.<>-]*\w)", text))
    assert {"csi/staging.py", "csi/errors.py", "shim/plugins/registry.py"} <= named
    missing = [n for n in named if "<" not in n and not (REPO / n).exists()]
    assert missing == []
