"""EBS volume modifications (ModifyVolume) as ControllerExpandVolume and ControllerModifyVolume see them:
one ModifyVolume per coalesced batch (coalesce.py), waited for until EC2 reports it `optimizing`, when
the new size and performance are usable.

EBS runs one modification of a volume at a time. A call whose wait timed out leaves its modification
`modifying`; the CO's retry then finds the volume already described at the new size, so a batch first
waits for a modification in flight (as the EBS CSI driver waits when nothing is left to change), and
`usable` reports such a volume at its original size, so that a repeated ControllerExpandVolume reaches
that wait instead of answering at once.
"""

from __future__ import annotations

from typing import Any

from csi.backends.aws import mutable, records
from csi.backends.aws.coalesce import Modification
from csi.backends.aws.ec2 import Ec2
from csi.backends.base import Disk, GiB
from csi.failures import DriverError


class Modifications:
    """ModifyVolume and its waits for one backend."""

    def __init__(self, ec2: Ec2, zone_key: str) -> None:
        self._ec2 = ec2
        self._zone_key = zone_key

    def apply(self, vid: str, change: Modification) -> Disk:
        """One ModifyVolume for a coalesced batch, after any modification in flight, waited for until
        it is usable; nothing to change -> the volume as it is (once what is in flight is usable)."""
        volume = self._settled(vid, ours=False)
        args = mutable.modify_arguments(volume, change.size_bytes, change.parameters)
        if not args:
            return self._disk(volume)
        self._ec2.call("modify_volume", VolumeId=vid, **args)
        disk = self._disk(self._settled(vid, ours=True))
        if "Size" in args and disk.size_bytes < args["Size"] * GiB:  # EC2 lags behind a resize
            disk = disk._replace(size_bytes=args["Size"] * GiB)
        return disk

    def usable(self, vid: str, disk: Disk) -> Disk:
        """`disk` (volume `vid`) at its original size while a resize of it is still `modifying`."""
        latest = self._latest(vid)
        if latest is None or latest.get("ModificationState") != "modifying":
            return disk
        original = int(latest.get("OriginalSize") or 0) * GiB
        return disk._replace(size_bytes=min(original, disk.size_bytes) or disk.size_bytes)

    def _disk(self, volume: dict[str, Any]) -> Disk:
        return records.to_disk(volume, self._zone_key)

    def _latest(self, vid: str) -> dict[str, Any] | None:
        """EC2's latest modification of the volume, None if it was never modified. A filter, not
        VolumeIds: EC2 answers the id of a volume never modified with an error."""
        filters = [{"Name": "volume-id", "Values": [vid]}]
        found = self._ec2.call("describe_volumes_modifications", Filters=filters).get("VolumesModifications")
        return dict(found[-1]) if found else None

    def _settled(self, vid: str, ours: bool) -> dict[str, Any]:
        """The volume's record once its latest modification is past `modifying` (optimizing or
        completed, or none). `ours`: the one just asked for, whose failure -> DriverError; an older
        failed one is over, and in the way of nothing."""

        def check() -> dict[str, Any] | None:
            latest = self._latest(vid) or {}
            state = latest.get("ModificationState", "completed")
            if state == "failed" and ours:
                raise DriverError(f"EBS failed to modify volume {vid}: {latest.get('StatusMessage', '')}")
            return self._ec2.describe_volume(vid) if state != "modifying" else None

        return self._ec2.poll(f"modification of {vid}", check)
