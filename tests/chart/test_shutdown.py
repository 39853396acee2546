"""The driver's pods are given longer to stop than the driver takes to drain and to wait for the handlers
of cancelled calls, so kubelet's SIGKILL cannot cut a full drain short; both times are read from the
code, so the two cannot drift apart."""

from __future__ import annotations

import pytest

from csi.server import GRACE_SECONDS, SETTLE_SECONDS
from tests.chart.render import only, pod_spec, render

# Time for what the driver does after the drain: release its socket, close the backend.
MARGIN_SECONDS = 5


@pytest.mark.parametrize(
    "kind", [pytest.param("Deployment", id="controller"), pytest.param("DaemonSet", id="node")]
)
def test_pods_outlast_the_driver_drain(set_id: str, kind: str) -> None:
    grace = pod_spec(only(render(set_id), kind)).get("terminationGracePeriodSeconds", 30)
    assert grace >= GRACE_SECONDS + SETTLE_SECONDS + MARGIN_SECONDS
