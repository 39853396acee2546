"""Feature gates: parsing, defaults, precedence, errors, migration predicates."""

from __future__ import annotations

import pytest

from shim.gates import (
    GATES,
    GATES_BY_NAME,
    PLUGIN_GATES,
    FeatureGateError,
    FeatureGates,
    parse_feature_gates,
)

PLUGINS = [
    pytest.param("kubernetes.io/aws-ebs", "CSIMigrationAWS", "InTreePluginAWSUnregister", id="aws-ebs"),
    pytest.param("kubernetes.io/gce-pd", "CSIMigrationGCE", "InTreePluginGCEUnregister", id="gce-pd"),
    pytest.param(
        "kubernetes.io/azure-disk",
        "CSIMigrationAzureDisk",
        "InTreePluginAzureDiskUnregister",
        id="azure-disk",
    ),
    pytest.param(
        "kubernetes.io/azure-file",
        "CSIMigrationAzureFile",
        "InTreePluginAzureFileUnregister",
        id="azure-file",
    ),
    pytest.param(
        "kubernetes.io/cinder", "CSIMigrationOpenStack", "InTreePluginOpenStackUnregister", id="cinder"
    ),
    pytest.param(
        "kubernetes.io/vsphere-volume", "CSIMigrationvSphere", "InTreePluginvSphereUnregister", id="vsphere"
    ),
    pytest.param(
        "kubernetes.io/portworx-volume",
        "CSIMigrationPortworx",
        "InTreePluginPortworxUnregister",
        id="portworx",
    ),
]


def test_known_gates_are_exactly_the_kubernetes_names() -> None:
    assert {g.name for g in GATES} == {
        "CSIMigration",
        "CSIMigrationAWS",
        "CSIMigrationGCE",
        "CSIMigrationAzureDisk",
        "CSIMigrationAzureFile",
        "CSIMigrationOpenStack",
        "CSIMigrationvSphere",
        "CSIMigrationPortworx",
        "InTreePluginAWSUnregister",
        "InTreePluginGCEUnregister",
        "InTreePluginAzureDiskUnregister",
        "InTreePluginAzureFileUnregister",
        "InTreePluginOpenStackUnregister",
        "InTreePluginvSphereUnregister",
        "InTreePluginPortworxUnregister",
    }


def test_defaults_are_all_off() -> None:
    gates = FeatureGates()
    assert dict(gates) == {g.name: False for g in GATES}
    assert str(gates) == ""


def test_kubernetes_lock_table_marks_migration_gates_locked_and_unregister_gates_not() -> None:
    locked = {g.name for g in GATES if g.kubernetes_locked}
    assert locked == {g.name for g in GATES if g.role in ("umbrella", "migration")}
    assert all(g.kubernetes_stage == "alpha" for g in GATES if g.role == "unregister")
    assert all(g.kubernetes_history for g in GATES)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("", {}, id="empty"),
        pytest.param("CSIMigration=true", {"CSIMigration": True}, id="one"),
        pytest.param(
            "CSIMigration=true,CSIMigrationAWS=false",
            {"CSIMigration": True, "CSIMigrationAWS": False},
            id="two",
        ),
        pytest.param(
            " CSIMigration = true ,\tCSIMigrationGCE=  false ",
            {"CSIMigration": True, "CSIMigrationGCE": False},
            id="whitespace",
        ),
        pytest.param("CSIMigration=true,CSIMigration=false", {"CSIMigration": False}, id="later-wins"),
        pytest.param(
            "CSIMigration=1,CSIMigrationAWS=T,CSIMigrationGCE=TRUE,CSIMigrationAzureDisk=0,CSIMigrationAzureFile=F",
            {
                "CSIMigration": True,
                "CSIMigrationAWS": True,
                "CSIMigrationGCE": True,
                "CSIMigrationAzureDisk": False,
                "CSIMigrationAzureFile": False,
            },
            id="go-parsebool-spellings",
        ),
        pytest.param("CSIMigration=true,,", {"CSIMigration": True}, id="trailing-commas"),
    ],
)
def test_parse(text: str, expected: dict[str, bool]) -> None:
    assert parse_feature_gates(text) == expected
    assert FeatureGates.parse(text).explicit == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [pytest.param(v, True, id=f"true-{v}") for v in ("1", "t", "T", "TRUE", "true", "True")]
    + [pytest.param(v, False, id=f"false-{v}") for v in ("0", "f", "F", "FALSE", "false", "False")],
)
def test_every_spelling_go_parsebool_accepts(value: str, expected: bool) -> None:
    """Kubernetes parses gate values with Go's strconv.ParseBool: exactly these twelve spellings."""
    assert parse_feature_gates(f"CSIMigration={value}") == {"CSIMigration": expected}


@pytest.mark.parametrize("value", ["tRUE", "yes", "on", "y", "2", "-1", "FaLsE", "off"])
def test_spellings_go_parsebool_refuses(value: str) -> None:
    with pytest.raises(FeatureGateError, match=repr(value)):
        parse_feature_gates(f"CSIMigration={value}")


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param("CSIMigrationFoo=true", ["'CSIMigrationFoo'", "unrecognized"], id="unknown-gate"),
        pytest.param(
            "CSIMigrationVSphere=true", ["'CSIMigrationVSphere'", "'CSIMigrationvSphere'"], id="typo-hint"
        ),
        pytest.param("csimigration=true", ["'csimigration'"], id="case-sensitive"),
        pytest.param("CSIMigration=yes", ["CSIMigration", "'yes'"], id="non-boolean"),
        pytest.param("CSIMigration=", ["CSIMigration", "''"], id="empty-value"),
        pytest.param("CSIMigration", ["'CSIMigration'", "Name=true"], id="missing-equals"),
        pytest.param("=true", ["'=true'"], id="missing-name"),
        pytest.param("CSIMigrationAWS=true,Bogus=false", ["'Bogus'"], id="second-item-bad"),
        pytest.param(
            "CSIMigration=true, ,CSIMigrationAWS=true", ["''", "Name=true"], id="blank-item-not-empty"
        ),
    ],
)
def test_parse_errors_name_the_offender(text: str, fragments: list[str]) -> None:
    with pytest.raises(FeatureGateError) as info:
        FeatureGates.parse(text)
    for fragment in fragments:
        assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_constructor_rejects_unknown_names_and_non_bool_values() -> None:
    with pytest.raises(FeatureGateError, match="Nope"):
        FeatureGates({"Nope": True})
    with pytest.raises(FeatureGateError, match="CSIMigration"):
        FeatureGates({"CSIMigration": "true"})  # type: ignore[dict-item]


def test_enabled_rejects_unknown_name() -> None:
    with pytest.raises(FeatureGateError, match="Missing"):
        FeatureGates().enabled("Missing")
    with pytest.raises(KeyError):
        FeatureGates()["Missing"]


def test_with_overrides_precedence_and_immutability() -> None:
    base = FeatureGates.parse("CSIMigration=true,CSIMigrationAWS=true")
    changed = base.with_overrides("CSIMigrationAWS=false,CSIMigrationGCE=true")
    assert base.enabled("CSIMigrationAWS") is True
    assert base.enabled("CSIMigrationGCE") is False
    assert changed.enabled("CSIMigrationAWS") is False
    assert changed.enabled("CSIMigrationGCE") is True
    assert changed.enabled("CSIMigration") is True
    assert base.with_overrides({"CSIMigration": False}).enabled("CSIMigration") is False
    with pytest.raises(FeatureGateError, match="Unknown"):
        base.with_overrides({"Unknown": True})


def test_str_round_trips_through_parse() -> None:
    gates = FeatureGates.parse(" CSIMigrationvSphere=TRUE , CSIMigration=1,InTreePluginvSphereUnregister=f")
    assert str(gates) == "CSIMigrationvSphere=true,CSIMigration=true,InTreePluginvSphereUnregister=false"
    assert FeatureGates.parse(str(gates)) == gates
    assert eval(repr(gates), {"FeatureGates": FeatureGates}) == gates


def test_equality_is_by_effective_values() -> None:
    assert FeatureGates.parse("CSIMigration=false") == FeatureGates()
    assert FeatureGates.parse("CSIMigration=true") != FeatureGates()
    assert hash(FeatureGates.parse("CSIMigration=false")) == hash(FeatureGates())


@pytest.mark.parametrize(("plugin", "migration", "unregister"), PLUGINS)
def test_plugin_gate_table(plugin: str, migration: str, unregister: str) -> None:
    assert PLUGIN_GATES[plugin].migration == migration
    assert PLUGIN_GATES[plugin].unregister == unregister
    assert GATES_BY_NAME[migration].plugin == plugin
    assert GATES_BY_NAME[unregister].plugin == plugin


@pytest.mark.parametrize(("plugin", "migration", "unregister"), PLUGINS)
@pytest.mark.parametrize(
    ("umbrella_on", "plugin_on", "unregister_on", "enabled", "complete"),
    [
        pytest.param(False, False, False, False, False, id="all-off"),
        pytest.param(True, False, False, False, False, id="umbrella-only"),
        pytest.param(False, True, False, False, False, id="plugin-only"),
        pytest.param(True, True, False, True, False, id="enabled"),
        pytest.param(True, True, True, True, True, id="complete"),
        pytest.param(False, True, True, False, False, id="no-umbrella-not-complete"),
        pytest.param(True, False, True, False, False, id="unregister-without-migration"),
    ],
)
def test_migration_predicates(
    plugin: str,
    migration: str,
    unregister: str,
    umbrella_on: bool,
    plugin_on: bool,
    unregister_on: bool,
    enabled: bool,
    complete: bool,
) -> None:
    gates = FeatureGates({"CSIMigration": umbrella_on, migration: plugin_on, unregister: unregister_on})
    assert gates.is_migration_enabled(plugin) is enabled
    assert gates.is_migration_complete(plugin) is complete
    assert gates.is_plugin_unregistered(plugin) is unregister_on


def test_one_plugin_gate_does_not_enable_another() -> None:
    gates = FeatureGates.parse("CSIMigration=true,CSIMigrationAWS=true")
    assert gates.is_migration_enabled("kubernetes.io/aws-ebs")
    others = [p for p in PLUGIN_GATES if p != "kubernetes.io/aws-ebs"]
    assert not any(gates.is_migration_enabled(p) for p in others)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("kubernetes.io/nfs", id="not-migratable"),
        pytest.param("ebs.csi.aws.com", id="csi-driver-name"),
        pytest.param("aws-ebs", id="short-name"),
    ],
)
def test_unknown_plugin_is_never_migrated(name: str) -> None:
    everything_on = FeatureGates({g.name: True for g in GATES})
    assert everything_on.is_migration_enabled(name) is False
    assert everything_on.is_migration_complete(name) is False
