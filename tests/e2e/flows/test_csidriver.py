"""The CSIDriver fields the chart relies on survive the API server's round trip (an API server that
does not know a field, or has its feature gate off, drops it silently)."""

from __future__ import annotations

import pytest

from tests.e2e.flows.conftest import Bed
from tests.e2e.kube import csi_drivers, csi_nodes
from tests.e2e.kubelet import refresh_allocatable

pytestmark = pytest.mark.slow


def test_csidriver_keeps_the_fields_kubelet_reads(bed: Bed) -> None:
    stored = bed.kube.get(csi_drivers(bed.driver))["spec"]
    assert stored["nodeAllocatableUpdatePeriodSeconds"] == 60  # MutableCSINodeAllocatableCount
    assert stored["seLinuxMount"] is True  # SELinuxMount
    assert stored["attachRequired"] is True


def test_csinode_allocatable_follows_node_get_info(bed: Bed) -> None:
    """kubelet's refresh: CSINode's count is what NodeGetInfo answers now."""
    count = refresh_allocatable(bed.kube, bed.deployment, bed.node.name)
    drivers = bed.kube.get(csi_nodes(bed.node.name))["spec"]["drivers"]
    assert [d["allocatable"]["count"] for d in drivers if d["name"] == bed.driver] == [count]
    assert count > 0
