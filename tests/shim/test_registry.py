"""One registry row per in-tree plugin: the translators, the gates and the manifest checks agree with it."""

from __future__ import annotations

import pytest

from shim.gates import GATES_BY_NAME, PLUGIN_GATES
from shim.objects import IN_TREE_SOURCES
from shim.plugins import registry
from shim.translate import default_plugins, translator

INFOS = [pytest.param(p, id=p.in_tree_name.removeprefix("kubernetes.io/")) for p in registry.PLUGINS]


@pytest.mark.parametrize("info", INFOS)
def test_the_translator_a_row_names_describes_itself_with_that_row(info: registry.PluginInfo) -> None:
    plugin = translator(info)
    assert plugin.info is info
    assert (plugin.in_tree_name, plugin.csi_name, plugin.source_key) == info[:3]


@pytest.mark.parametrize("info", INFOS)
def test_gates_and_source_checks_come_from_the_row(info: registry.PluginInfo) -> None:
    gates = PLUGIN_GATES[info.in_tree_name]
    assert GATES_BY_NAME[gates.migration].kubernetes_history == info.migration_history
    assert GATES_BY_NAME[gates.unregister].plugin == info.in_tree_name
    schema = IN_TREE_SOURCES[info.source_key]
    assert schema.plugin == info.in_tree_name
    assert all(schema.typed[field] is str for field in info.required)


def test_every_row_is_translated_once_and_nothing_else_is() -> None:
    assert [p.info for p in default_plugins()] == list(registry.PLUGINS)
    assert len({p.in_tree_name for p in registry.PLUGINS}) == len({p.csi_name for p in registry.PLUGINS}) == 7
    assert list(PLUGIN_GATES) == [p.in_tree_name for p in registry.PLUGINS]
