"""The values schema refuses what the driver would refuse at start, so a bad value fails `helm install`
instead of crash-looping a pod; what it accepts renders to a command line the driver parses."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from csi.config import Config, parse_args
from tests.chart.render import RENDER_KUBE_VERSION, containers, only, resolved_args, run_helm, values_of

SCHEMA_ERROR = "values don't meet the specifications of the schema"


def helm_template(values: dict[str, Any]) -> tuple[bool, str, list[Any]]:
    """(rendered, stderr, objects) of `helm template` with `values`."""
    result = run_helm(
        ["template", "ballast", "-n", "kube-system", "--kube-version", RENDER_KUBE_VERSION], values
    )
    objects = [d for d in yaml.safe_load_all(result.stdout) if d] if result.returncode == 0 else []
    return result.returncode == 0, result.stderr, objects


def driver_config(objects: list[Any], kind: str) -> Config:
    """The rendered plugin command line parsed by the driver (argparse exits on a refused value)."""
    config, _ = parse_args(resolved_args(containers(only(objects, kind))["ballast-plugin"]))
    return config


def driver_refuses(*argv: str) -> bool:
    try:
        parse_args(["--mode=node", *argv])
    except SystemExit:
        return True
    return False


def check(values: dict[str, Any], field: str, accepted: bool) -> list[Any]:
    rendered, stderr, objects = helm_template(values)
    if accepted:
        assert rendered, stderr
    else:
        assert not rendered, f"helm accepted {values}"
        assert SCHEMA_ERROR in stderr and field in stderr
    return objects


def with_block_size(size: str) -> dict[str, Any]:
    values = values_of("snapshot-metadata")
    values["snapshotMetadata"] = {**values["snapshotMetadata"], "blockSize": size}
    return values


@pytest.mark.parametrize(
    ("size", "size_bytes"),
    [
        pytest.param("", 0, id="empty-backend-default"),
        pytest.param("0", 0, id="zero-backend-default"),
        pytest.param("0Ki", 0, id="zero-with-unit"),
        pytest.param("4Ki", 4096, id="smallest-4Ki"),
        pytest.param("64Ki", 65536, id="64Ki"),
        pytest.param("064Ki", 65536, id="leading-zero"),
        pytest.param("1024Ki", 1048576, id="1024Ki-is-1Mi"),
        pytest.param("1Mi", 1048576, id="largest-1Mi"),
        pytest.param("4096", 4096, id="bytes-4096"),
        pytest.param("1048576", 1048576, id="bytes-1Mi"),
        pytest.param("2Ki", None, id="below-4Ki"),
        pytest.param("2048", None, id="bytes-below-4Ki"),
        pytest.param("2Mi", None, id="above-1Mi"),
        pytest.param("2048Ki", None, id="2048Ki-above-1Mi"),
        pytest.param("1Gi", None, id="1Gi"),
        pytest.param("48Ki", None, id="not-a-power-of-two"),
        pytest.param("4000", None, id="bytes-not-a-power-of-two"),
        pytest.param("4K", None, id="decimal-unit"),
        pytest.param("64KiB", None, id="unit-with-B"),
        pytest.param("64ki", None, id="lower-case-unit"),
        pytest.param("64 Ki", None, id="space-before-unit"),
        pytest.param("-64Ki", None, id="negative"),
        pytest.param("Ki", None, id="unit-alone"),
    ],
)
def test_block_size_schema_matches_the_driver(size: str, size_bytes: int | None) -> None:
    """`size_bytes`: what the driver makes of it (0: the backend's own), None: refused."""
    objects = check(with_block_size(size), "blockSize", size_bytes is not None)
    if size_bytes is not None:
        assert driver_config(objects, "Deployment").server.snapshot_metadata_block_size == size_bytes
    else:
        assert driver_refuses("--snapshot-metadata-block-size=" + size)


PATHS = [
    pytest.param("/var/lib/kubelet", True, id="plain"),
    pytest.param("/var/lib/kubelet/", True, id="one-trailing-slash"),
    pytest.param("/var/snap/microk8s/common/var/lib/kubelet", True, id="deep"),
    pytest.param("/mnt/.hidden/...x/..y", True, id="dotted-names"),
    pytest.param("/", False, id="root"),
    pytest.param("", False, id="empty"),
    pytest.param("var/lib/kubelet", False, id="relative"),
    pytest.param("/var//lib", False, id="double-slash"),
    pytest.param("/var/./lib", False, id="dot"),
    pytest.param("/var/lib/.", False, id="trailing-dot"),
    pytest.param("/var/../lib", False, id="dot-dot"),
    pytest.param("/var/lib/..", False, id="trailing-dot-dot"),
]


@pytest.mark.parametrize(("path", "accepted"), PATHS)
def test_kubelet_path_schema_matches_the_driver(path: str, accepted: bool) -> None:
    objects = check({"node": {"kubeletPath": path}}, "kubeletPath", accepted)
    if accepted:
        assert driver_config(objects, "DaemonSet").node.kubelet_dir == path.removesuffix("/")
    else:  # the chart drops one trailing slash before passing the path on
        assert driver_refuses("--kubelet-dir=" + path.removesuffix("/"))


@pytest.mark.parametrize(("path", "accepted"), PATHS)
def test_allowed_path_prefix_schema_matches_the_driver(path: str, accepted: bool) -> None:
    objects = check({"node": {"allowedPathPrefixes": ["/mnt/ok", path]}}, "allowedPathPrefixes", accepted)
    if accepted:
        assert driver_config(objects, "DaemonSet").node.allowed_path_prefixes == ("/mnt/ok", path)
    else:
        assert driver_refuses("--allowed-path-prefix=" + path)


@pytest.mark.parametrize(
    ("field", "flag"), [("kubeletPath", "--kubelet-dir"), ("allowedPathPrefixes", "--allowed-path-prefix")]
)
@pytest.mark.parametrize(
    "path",
    [
        pytest.param("//var/lib/kubelet", id="leading-double-slash"),
        pytest.param("/var/lib/kubelet//", id="two-trailing-slashes"),
    ],
)
def test_where_the_schema_is_stricter_than_the_driver(field: str, flag: str, path: str) -> None:
    """The driver takes these as written (POSIX leaves a leading `//` to the system; it strips trailing
    slashes); the chart refuses them rather than render paths with `//` in them."""
    value = path if field == "kubeletPath" else [path]
    check({"node": {field: value}}, field, accepted=False)
    assert not driver_refuses(f"{flag}={path}")


LABEL_VALUES = [
    pytest.param("eu-west-1a", True, id="zone-like"),
    pytest.param("a", True, id="one-character"),
    pytest.param("Rack_7.row-2", True, id="dots-dashes-underscores"),
    pytest.param("x" * 63, True, id="63-characters"),
    pytest.param("x" * 64, False, id="64-characters"),
    pytest.param("-zone", False, id="leading-dash"),
    pytest.param("zone.", False, id="trailing-dot"),
    pytest.param("_zone", False, id="leading-underscore"),
    pytest.param("zone a", False, id="space"),
    pytest.param("zone/a", False, id="slash"),
    pytest.param("zöne", False, id="non-ascii"),
]


@pytest.mark.parametrize("field", ["zone", "region"])
@pytest.mark.parametrize(("value", "accepted"), LABEL_VALUES)
def test_zone_and_region_must_be_label_values(field: str, value: str, accepted: bool) -> None:
    objects = check({"backend": {"local": {field: value}}}, field, accepted)
    if accepted:
        assert getattr(driver_config(objects, "DaemonSet").backend, field) == value
    else:
        assert driver_refuses(f"--{field}={value}")


@pytest.mark.parametrize(("field", "driver_default"), [("zone", "local"), ("region", "")])
def test_an_empty_zone_or_region_leaves_the_driver_default(field: str, driver_default: str) -> None:
    objects = check({"backend": {"local": {field: ""}}}, field, accepted=True)
    args = resolved_args(containers(only(objects, "DaemonSet"))["ballast-plugin"])
    assert not [a for a in args if a.startswith(f"--{field}=")]
    assert getattr(driver_config(objects, "DaemonSet").backend, field) == driver_default


@pytest.mark.parametrize(
    ("limit", "accepted"),
    [
        pytest.param(2147483647, True, id="csinode-int32-max"),
        pytest.param(2147483648, False, id="over-int32"),
    ],
)
def test_max_volumes_per_node_schema_matches_the_driver(limit: int, accepted: bool) -> None:
    objects = check({"node": {"maxVolumesPerNode": limit}}, "maxVolumesPerNode", accepted)
    if accepted:
        assert driver_config(objects, "DaemonSet").node.max_volumes_per_node == limit
    else:
        assert driver_refuses(f"--max-volumes-per-node={limit}")
