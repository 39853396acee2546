"""The kubelet probes that call the livenessprobe sidecar wait as long as the sidecar waits for the driver."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.render import containers, flag_values, only, render_values, resolved_args, run_helm

# Every kubelet probe that goes through the livenessprobe sidecar's /healthz: (workload kind, probe).
HEALTH_PROBES = [
    ("Deployment", "livenessProbe"),
    ("Deployment", "readinessProbe"),
    ("DaemonSet", "livenessProbe"),
]


def probe_values(probe_timeout: str | None) -> dict[str, Any]:
    return {} if probe_timeout is None else {"sidecars": {"livenessProbe": {"probeTimeout": probe_timeout}}}


@pytest.mark.parametrize(
    ("probe_timeout", "sidecar_flag", "kubelet_seconds"),
    [
        pytest.param(None, "10s", 11, id="default-notices-a-hung-driver-within-a-minute"),
        pytest.param("5s", "5s", 6, id="short"),
        pytest.param("45s", "45s", 46, id="longer-than-the-old-fixed-3s"),
    ],
)
def test_kubelet_waits_for_the_sidecar_probe_timeout(
    probe_timeout: str | None, sidecar_flag: str, kubelet_seconds: int
) -> None:
    objects = render_values(probe_values(probe_timeout))
    for kind, probe in HEALTH_PROBES:
        workload = only(objects, kind)
        sidecar = containers(workload)["liveness-probe"]
        assert flag_values(resolved_args(sidecar), "--probe-timeout") == [sidecar_flag], kind
        health = containers(workload)["ballast-plugin"][probe]
        assert health["httpGet"]["port"] == "healthz", (kind, probe)
        assert health["timeoutSeconds"] == kubelet_seconds, (kind, probe)
        # Five failures in a row, probed every max(period, timeout): about a minute with the default.
        if probe_timeout is None:
            assert health["failureThreshold"] * max(health["periodSeconds"], kubelet_seconds) <= 60


@pytest.mark.parametrize(
    "probe_timeout",
    [
        pytest.param("1m", id="minutes"),
        pytest.param("1.5s", id="fraction"),
        pytest.param("500ms", id="milliseconds"),
        pytest.param("0s", id="zero"),
        pytest.param("10", id="no-unit"),
    ],
)
def test_schema_refuses_a_probe_timeout_that_is_not_whole_seconds(probe_timeout: str) -> None:
    result = run_helm(["template", "ballast"], probe_values(probe_timeout))
    assert result.returncode != 0, f"helm accepted probeTimeout={probe_timeout}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert "probeTimeout" in result.stderr
