"""Volume health of EBS volumes: the volume's state (DescribeVolumes) and its status checks
(DescribeVolumeStatus) mapped to CSI health.

| EBS says                                               | status       | reason                     |
|--------------------------------------------------------|--------------|----------------------------|
| volume state `error`                                   | INACCESSIBLE | VolumeError                |
| volume status `impaired`                               | INACCESSIBLE | VolumeImpaired             |
| check `io-enabled` `failed` (EBS stopped I/O)          | INACCESSIBLE | IoDisabled                 |
| event `potential-data-inconsistency`                   | DATA_LOSS    | PotentialDataInconsistency |
| check `io-performance` `degraded`/`severely-degraded`  | DEGRADED     | IoPerformanceDegraded      |
| check `io-performance` `stalled`                       | DEGRADED     | IoPerformanceStalled       |

A volume EBS has no status for (being created, or status not yet known) has no issue from that side.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from csi.backends.aws import params as P
from csi.backends.aws.ec2 import Ec2
from csi.backends.paging import Page, seek_page
from csi.health import Issue, Status, VolumeHealth, distinct

DEGRADED_PERFORMANCE = frozenset({"degraded", "severely-degraded"})


def _checks(status: Mapping[str, Any]) -> dict[str, str]:
    details = status.get("VolumeStatus", {}).get("Details", [])
    return {d.get("Name", ""): d.get("Status", "") for d in details}


def _events(status: Mapping[str, Any]) -> str:
    described = [e.get("Description") or e.get("EventType", "") for e in status.get("Events", [])]
    return "; ".join(d for d in described if d) or "no event given"


def _status_issues(vid: str, status: Mapping[str, Any]) -> Iterator[Issue]:
    checks = _checks(status)
    events = _events(status)
    if status.get("VolumeStatus", {}).get("Status") == "impaired":
        yield Issue(
            Status.INACCESSIBLE,
            "VolumeImpaired",
            f"EBS reports volume {vid} impaired ({events}); see its status checks in the EC2 console",
        )
    if checks.get("io-enabled") == "failed":
        yield Issue(
            Status.INACCESSIBLE,
            "IoDisabled",
            f"EBS disabled I/O to volume {vid} ({events}); check its data for consistency, then enable "
            "I/O again (EnableVolumeIO) or restore the volume from a snapshot",
        )
    if any(e.get("EventType") == "potential-data-inconsistency" for e in status.get("Events", [])):
        yield Issue(
            Status.DATA_LOSS,
            "PotentialDataInconsistency",
            f"EBS suspects the data of volume {vid} is inconsistent ({events}); restore it from a "
            "snapshot, or check it before enabling I/O again",
        )
    performance = checks.get("io-performance", "")
    if performance in DEGRADED_PERFORMANCE or performance == "stalled":
        reason = "IoPerformanceStalled" if performance == "stalled" else "IoPerformanceDegraded"
        yield Issue(
            Status.DEGRADED,
            reason,
            f"EBS reports the I/O performance of volume {vid} {performance} ({events})",
        )


def issues(volume: Mapping[str, Any], status: Mapping[str, Any] | None) -> tuple[Issue, ...]:
    """The issues of one EBS volume from its DescribeVolumes item and DescribeVolumeStatus item."""
    vid = str(volume["VolumeId"])
    found: list[Issue] = []
    if volume.get("State") == "error":
        found.append(
            Issue(
                Status.INACCESSIBLE,
                "VolumeError",
                f"EBS reports volume {vid} in state error: it cannot be used; restore it from a snapshot",
            )
        )
    if status is not None:
        found.extend(_status_issues(vid, status))
    return distinct(found)


class EbsHealth:
    def __init__(self, ec2: Ec2) -> None:
        self._ec2 = ec2

    def volume(self, volume: Mapping[str, Any]) -> tuple[Issue, ...]:
        """Issues of one volume (its DescribeVolumes item) with its status checks."""
        vid = volume["VolumeId"]
        response = self._ec2.call("describe_volume_status", VolumeIds=[vid])
        status = next((s for s in response.get("VolumeStatuses", []) if s.get("VolumeId") == vid), None)
        return issues(volume, status)

    def listing(self, volumes: list[dict[str, Any]], max_entries: int, token: str) -> Page[VolumeHealth]:
        """The volumes among `volumes` with an issue, seek-paged by volume id. One DescribeVolumeStatus
        listing (all pages) covers them all."""
        statuses = {
            s["VolumeId"]: s for s in self._ec2.describe_all("describe_volume_status", "VolumeStatuses")
        }
        unhealthy = [
            VolumeHealth(str(v["VolumeId"]), found)
            for v in volumes
            if (found := issues(v, statuses.get(v["VolumeId"])))
        ]
        return seek_page(unhealthy, lambda h: h.volume_id, max_entries, token, P.VOLUME_ID)
