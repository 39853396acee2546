"""EBS volume health: DescribeVolumeStatus mapped to CSI health statuses.

moto 5.2.5 does not implement DescribeVolumeStatus (it answers HTTP 500), so the status checks EBS would
report are served by the moto proxy (tests/motoproxy.py `answer`) in EC2's own XML; everything else
(DescribeVolumes, the volumes themselves) is moto's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from csi import failures
from csi.backends.aws import AwsBackend
from csi.backends.aws.health import issues
from csi.backends.base import DiskOptions, GiB
from csi.health import Status
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import ZONE, make_client


def status_xml(*items: str) -> str:
    return (
        '<DescribeVolumeStatusResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
        "<requestId>motoproxy</requestId>"
        f"<volumeStatusSet>{''.join(items)}</volumeStatusSet>"
        "</DescribeVolumeStatusResponse>"
    )


def item(volume_id: str, status: str, checks: dict[str, str], events: tuple[str, ...] = ()) -> str:
    details = "".join(f"<item><name>{k}</name><status>{v}</status></item>" for k, v in checks.items())
    listed = "".join(
        f"<item><eventId>evol-1</eventId><eventType>{e}</eventType><description>{e} on {volume_id}"
        "</description></item>"
        for e in events
    )
    return (
        f"<item><volumeId>{volume_id}</volumeId><availabilityZone>{ZONE}</availabilityZone>"
        f"<volumeStatus><status>{status}</status><details>{details}</details></volumeStatus>"
        f"<eventsSet>{listed}</eventsSet><actionsSet/></item>"
    )


OK = {"io-enabled": "passed", "io-performance": "normal"}


@pytest.fixture
def proxied(
    moto_endpoint: str, account: str, make_backend: Callable[..., AwsBackend]
) -> Iterator[tuple[MotoProxy, AwsBackend]]:
    with running_proxy(moto_endpoint) as proxy:
        yield proxy, make_backend(client=make_client(proxy.endpoint, account))


def _volume(backend: AwsBackend, name: str) -> str:
    return backend.create_volume(name, DiskOptions(size_bytes=GiB)).id


@pytest.mark.parametrize(
    ("status", "checks", "events", "expected"),
    [
        pytest.param("ok", OK, (), [], id="ok"),
        pytest.param(
            "impaired",
            {"io-enabled": "failed", "io-performance": "not-applicable"},
            ("potential-data-inconsistency",),
            [
                (Status.INACCESSIBLE, "VolumeImpaired"),
                (Status.INACCESSIBLE, "IoDisabled"),
                (Status.DATA_LOSS, "PotentialDataInconsistency"),
            ],
            id="io-disabled-inconsistent",
        ),
        pytest.param(
            "warning",
            {"io-enabled": "passed", "io-performance": "degraded"},
            ("io-performance:degraded",),
            [(Status.DEGRADED, "IoPerformanceDegraded")],
            id="io-degraded",
        ),
        pytest.param(
            "warning",
            {"io-enabled": "passed", "io-performance": "severely-degraded"},
            (),
            [(Status.DEGRADED, "IoPerformanceDegraded")],
            id="io-severely-degraded",
        ),
        pytest.param(
            "impaired",
            {"io-enabled": "passed", "io-performance": "stalled"},
            ("io-performance:stalled",),
            [(Status.INACCESSIBLE, "VolumeImpaired"), (Status.DEGRADED, "IoPerformanceStalled")],
            id="io-stalled",
        ),
    ],
)
def test_volume_status_maps_to_health(
    proxied: tuple[MotoProxy, AwsBackend],
    status: str,
    checks: dict[str, str],
    events: tuple[str, ...],
    expected: list[tuple[Status, str]],
) -> None:
    proxy, backend = proxied
    vid, other = _volume(backend, "v"), _volume(backend, "other")
    proxy.answer(
        "DescribeVolumeStatus",
        status_xml(item(other, "impaired", {"io-enabled": "failed"}), item(vid, status, checks, events)),
    )
    got = backend.volume_health(vid)
    assert [(i.status, i.reason) for i in got] == expected
    assert all(vid in i.message for i in got)
    assert proxy.calls["DescribeVolumeStatus"] == 1


def test_a_volume_ebs_has_no_status_for_has_no_issue(proxied: tuple[MotoProxy, AwsBackend]) -> None:
    proxy, backend = proxied
    proxy.answer("DescribeVolumeStatus", status_xml())
    assert backend.volume_health(_volume(backend, "new")) == ()


def test_an_unknown_volume_is_not_found(proxied: tuple[MotoProxy, AwsBackend]) -> None:
    proxy, backend = proxied
    proxy.answer("DescribeVolumeStatus", status_xml())
    with pytest.raises(failures.NotFoundError):
        backend.volume_health("vol-0123456789abcdef0")


def test_list_volume_health_reports_the_drivers_unhealthy_volumes_in_pages(
    proxied: tuple[MotoProxy, AwsBackend], ec2: Any
) -> None:
    proxy, backend = proxied
    vids = sorted(_volume(backend, f"v{i}") for i in range(4))
    foreign = ec2.create_volume(Size=1, AvailabilityZone=ZONE)["VolumeId"]  # not this driver's
    sick = {vids[0]: "impaired", vids[2]: "impaired", vids[3]: "impaired", foreign: "impaired"}
    proxy.answer(
        "DescribeVolumeStatus",
        status_xml(
            *(
                item(v, sick.get(v, "ok"), {"io-enabled": "failed"} if v in sick else OK)
                for v in [*vids, foreign]
            )
        ),
    )
    first = backend.list_volume_health(max_entries=2)
    rest = backend.list_volume_health(max_entries=2, starting_token=first.next_token)
    assert [h.volume_id for h in first.items] == [vids[0], vids[2]] and first.next_token
    assert [h.volume_id for h in rest.items] == [vids[3]] and not rest.next_token
    assert all(h.issues[0].reason == "VolumeImpaired" for h in (*first.items, *rest.items))


@pytest.mark.parametrize("token", ["after:garbage", "after:snap-0123456789abcdef0"])
def test_a_health_token_the_driver_did_not_issue_is_refused(
    proxied: tuple[MotoProxy, AwsBackend], token: str
) -> None:
    proxy, backend = proxied
    proxy.answer("DescribeVolumeStatus", status_xml())
    with pytest.raises(failures.InvalidTokenError):
        backend.list_volume_health(starting_token=token)


def test_without_the_proxy_moto_lacks_describe_volume_status(backend: AwsBackend) -> None:
    """The gap the proxy fills: moto answers DescribeVolumeStatus with an HTML error page."""
    vid = _volume(backend, "plain")
    with pytest.raises(failures.DriverError, match="describe_volume_status"):
        backend.volume_health(vid)


def test_a_volume_in_state_error_is_inaccessible() -> None:
    """moto never puts a volume in state error, so the mapping is checked on its record directly."""
    volume = {"VolumeId": "vol-1", "State": "error"}
    assert [(i.status, i.reason) for i in issues(volume, None)] == [(Status.INACCESSIBLE, "VolumeError")]
