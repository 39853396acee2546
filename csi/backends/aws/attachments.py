"""Attaching EBS volumes to instances and detaching them, each waited for until EC2 reports it done.

EBS has no read-only attachments: the node's mount enforces `readonly`, and the flag is remembered in a
volume tag so that a republish to the same node with the other flag is refused (AlreadyExistsError).
Device names come from devices.DeviceNames, which skips names in use or reserved by attachments still in
flight in this process. A node's attach slots count its attaches in flight in this process too
(slots.NodeSlots), so concurrent publishes to one node cannot pass its limit together. Attach and detach
of one volume never interleave (a per-volume lock).

DetachVolume answers that say the attachment is already gone (ALREADY_DETACHED, the codes the AWS EBS CSI
driver's DetachDisk treats so) are waited out like a detach in progress; any other refusal (permissions,
instance state, opt-in) is raised at once instead of being waited on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from csi import keys
from csi.backends.aws.batching import grouped
from csi.backends.aws.devices import DeviceNames
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.errors import error_code
from csi.backends.aws.metadata import attach_limit
from csi.backends.aws.params import TAG_READONLY_PREFIX
from csi.backends.aws.records import ATTACHED_STATES, tags
from csi.backends.aws.slots import NodeSlots
from csi.failures import (
    AlreadyExistsError,
    DriverError,
    FailedPreconditionError,
    InvalidParameterError,
    LimitExceededError,
    NotFoundError,
    TransientError,
)
from csi.keylocks import KeyedLocks
from shim import failpoints

NAME_ATTEMPTS = 3  # device names taken concurrently by another attacher before we give up
# DetachVolume error codes that mean "not attached there (any more)"; every other error is raised.
ALREADY_DETACHED = frozenset({"IncorrectState", "InvalidAttachment.NotFound", "InvalidVolume.NotFound"})


def _ec2_code(exc: DriverError) -> str:
    """The EC2 error code behind a translated error ("" when it did not come from an EC2 answer)."""
    cause = exc.__cause__
    return error_code(cause) if isinstance(cause, ClientError) else ""


class Attacher:
    """Attachments of EBS volumes; `max_volumes` (0: none) caps the volumes per instance."""

    def __init__(self, ec2: Ec2, max_volumes: int = 0) -> None:
        self._ec2 = ec2
        self._max_volumes = max_volumes
        self._names = DeviceNames()
        self._locks = KeyedLocks()
        self._slots = NodeSlots()

    def attach(self, vid: str, node_id: str, readonly: bool) -> dict[str, str]:
        """Attach under a free device name and wait until EC2 reports it attached. Idempotent per
        (volume, node); another readonly flag -> AlreadyExistsError; attached elsewhere and not
        Multi-Attach, or in another zone -> FailedPreconditionError; node full, counting the attaches to
        it in flight in this process -> LimitExceededError."""
        with self._locks.hold(vid):
            volume = self._ec2.describe_volume(vid)
            device, used = self._plan(volume, node_id, readonly)
            if device:
                self._wait_attached(vid, node_id)
                return {keys.PC_DEVICE_PATH: device}
            try:
                if readonly or TAG_READONLY_PREFIX + node_id in tags(volume):  # set, or clear a stale one
                    self._mark_readonly(vid, node_id, readonly)
                return {keys.PC_DEVICE_PATH: self._attach_under_free_name(vid, node_id, used)}
            finally:
                self._slots.give_back(node_id, vid)

    def _plan(self, volume: Mapping[str, Any], node_id: str, readonly: bool) -> tuple[str, list[str]]:
        """(device of the existing attachment, []) or ("", device names in use) with an attach slot of
        the node reserved (slots.NodeSlots: the caller gives it back). Refuses what attach refuses."""
        with self._slots.counting(node_id) as flying:
            instance = self._instance(node_id)
            device = self._current_device(volume, node_id, readonly)
            if device:
                return device, []
            zone = instance.get("Placement", {}).get("AvailabilityZone", "")
            if zone and zone != volume["AvailabilityZone"]:
                raise FailedPreconditionError(
                    f"volume {volume['VolumeId']} is in zone {volume['AvailabilityZone']} but node "
                    f"{node_id} is in {zone}"
                )
            used = self._used_names(instance, node_id, flying)
            self._slots.take(node_id, volume["VolumeId"])
            return "", used

    def _current_device(self, volume: Mapping[str, Any], node_id: str, readonly: bool) -> str:
        """The device of an existing attachment to `node_id` ("" when none); refuses what conflicts."""
        vid = volume["VolumeId"]
        for a in volume.get("Attachments", []):
            if a.get("State") not in ATTACHED_STATES:
                continue
            if a["InstanceId"] == node_id:
                if (TAG_READONLY_PREFIX + node_id in tags(volume)) != readonly:
                    raise AlreadyExistsError(
                        f"volume {vid} is already published to {node_id} with readonly={not readonly}"
                    )
                return str(a["Device"])
            if not volume.get("MultiAttachEnabled"):
                raise FailedPreconditionError(f"volume {vid} is attached to node {a['InstanceId']}")
        return ""

    def _used_names(self, instance: Mapping[str, Any], node_id: str, flying: frozenset[str]) -> list[str]:
        """Device names the instance uses (its root included). The node's attach slots are
        --max-volumes-per-node or what its instance type allows; every volume attached besides the root
        (by this driver or not), and every attach to it in flight in this process (`flying`), takes one.
        None free -> LimitExceededError (RESOURCE_EXHAUSTED)."""
        mappings = instance.get("BlockDeviceMappings", [])
        used = [m["DeviceName"] for m in mappings]
        root = instance.get("RootDeviceName", "")
        on_instance = {m.get("Ebs", {}).get("VolumeId") for m in mappings}
        coming = len(flying - on_instance)
        attached = len([u for u in used if u != root]) + coming
        limit = self._max_volumes or attach_limit(instance.get("InstanceType", ""))
        if attached >= limit:
            source = (
                "--max-volumes-per-node"
                if self._max_volumes
                else f"instance type {instance.get('InstanceType')}"
            )
            raise LimitExceededError(
                f"node {node_id} has no free attach slot: {attached} volumes attached, "
                f"limit {limit} ({source})" + (f"; {coming} of them are being attached now" if coming else "")
            )
        return [*used, root]

    def _attach_under_free_name(self, vid: str, node_id: str, used: list[str]) -> str:
        for _ in range(NAME_ATTEMPTS):
            device = self._names.reserve(node_id, used)
            try:
                try:
                    self._ec2.call("attach_volume", VolumeId=vid, InstanceId=node_id, Device=device)
                except InvalidParameterError as exc:
                    if "in use" not in str(exc):
                        raise
                    used.append(device)  # taken by someone else since DescribeInstances: next name
                    continue
                failpoints.hit("aws.attach.requested")
                self._wait_attached(vid, node_id)
                failpoints.hit("aws.attach.attached")
                return device
            finally:
                self._names.release(node_id, device)
        raise TransientError(f"device names on {node_id} keep being taken concurrently; retry")

    def _instance(self, node_id: str) -> dict[str, Any]:
        if not node_id.startswith("i-"):
            raise NotFoundError(f"node {node_id!r} not found: not an EC2 instance id")
        if self._ec2.batch_window > 0:
            instances = self._ec2.lookup("instance-id", node_id, self._instances)
        else:
            reservations = self._ec2.call("describe_instances", InstanceIds=[node_id]).get("Reservations", [])
            instances = [i for r in reservations for i in r.get("Instances", [])]
        for instance in instances:
            if instance.get("State", {}).get("Name") not in ("terminated", "shutting-down"):
                return instance
        raise NotFoundError(f"node {node_id} not found (no running EC2 instance)")

    def _instances(self, ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """The instances of `ids` by id, through a filter (an unknown id is left out, not an error)."""
        found: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self._ec2.call(
                "describe_instances",
                Filters=[{"Name": "instance-id", "Values": ids}],
                **({"NextToken": token} if token else {}),
            )
            found.extend(i for r in page.get("Reservations", []) for i in r.get("Instances", []))
            token = page.get("NextToken", "")
            if not token:
                return grouped(found, lambda i: str(i["InstanceId"]))

    def _mark_readonly(self, vid: str, node_id: str, readonly: bool) -> None:
        key = TAG_READONLY_PREFIX + node_id
        if readonly:
            self._ec2.call("create_tags", Resources=[vid], Tags=[{"Key": key, "Value": "true"}])
        else:
            self._ec2.call("delete_tags", Resources=[vid], Tags=[{"Key": key}])

    def _wait_attached(self, vid: str, node_id: str) -> None:
        def check() -> bool | None:
            for a in self._ec2.describe_volume(vid).get("Attachments", []):
                if a["InstanceId"] == node_id and a.get("State") == "attached":
                    return True
            return None

        self._ec2.poll(f"volume {vid} to attach to {node_id}", check)

    def detach(self, vid: str, node_id: str) -> None:
        """Not attached there (or the node is gone) -> no-op; waits until EC2 reports it detached. A
        DetachVolume refusal other than ALREADY_DETACHED is raised at once (mapped by errors.AWS_ERRORS)."""
        with self._locks.hold(vid):
            volume = self._ec2.describe_volume(vid)
            if not any(a["InstanceId"] == node_id for a in volume.get("Attachments", [])):
                return
            self._request_detach(vid, node_id)
            failpoints.hit("aws.detach.requested")

            def check() -> bool | None:
                attachments = self._ec2.describe_volume(vid).get("Attachments", [])
                attached = any(
                    a["InstanceId"] == node_id and a.get("State") != "detached" for a in attachments
                )
                return None if attached else True

            self._ec2.poll(f"volume {vid} to detach from {node_id}", check)
            failpoints.hit("aws.detach.detached")
            if TAG_READONLY_PREFIX + node_id in tags(volume):
                self._mark_readonly(vid, node_id, False)

    def _request_detach(self, vid: str, node_id: str) -> None:
        """DetachVolume; an answer that the attachment is already gone (ALREADY_DETACHED) is no error."""
        try:
            self._ec2.call("detach_volume", VolumeId=vid, InstanceId=node_id)
        except DriverError as exc:
            if _ec2_code(exc) not in ALREADY_DETACHED:
                raise
