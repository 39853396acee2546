"""Creating EBS volumes: from nothing, from a snapshot, or as a clone, idempotent by name.

A volume is found again by its `CSIVolumeName` tag (looked up under a per-name lock) and answers only a
request with the arguments it was made with; CreateVolume carries a client token derived from the name,
so neither a retry nor a concurrent duplicate creates a second volume, and a token EC2 has burned gives
way to the next one derived from the name. Clones stay in their source's zone: CopyVolumes where the
endpoint has it, else a temporary snapshot restored into the new volume.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from csi.backends.aws import mutable, records
from csi.backends.aws import params as P
from csi.backends.aws.batching import grouped
from csi.backends.aws.clones import ScratchSnapshots
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.errors import IdempotentParameterMismatchError, UnsupportedActionError
from csi.backends.aws.ownertags import OwnerTags
from csi.backends.aws.records import tag_spec
from csi.backends.aws.tagvalues import VOLUME_FIELDS
from csi.backends.aws.zones import Zones
from csi.backends.base import ContentSource, Disk, DiskOptions, GiB, SourceKind, fit_source, size_fits
from csi.failures import (
    AlreadyExistsError,
    InvalidParameterError,
    NotFoundError,
    OutOfCapacityError,
    OutOfRangeError,
    TransientError,
)
from csi.keylocks import KeyedLocks
from shim import failpoints

log = logging.getLogger("ballast.aws")
LIVE_VOLUME_STATES = ["creating", "available", "in-use", "error"]
MAX_CLIENT_TOKENS = 8  # burned client tokens of one name passed over in one call, then UNAVAILABLE
Send = Callable[[str], Mapping[str, Any]]  # issues one create call with this client token


def client_token(name: str, attempt: int = 0) -> str:
    """CreateVolume ClientToken for a volume name (64 hex chars, EC2's limit). `attempt` > 0 derives the
    next token once EC2 has burned the previous ones (VolumeCreator._with_token). The NUL separator
    keeps every name's tokens apart (no CSI name holds one)."""
    seed = name if attempt == 0 else f"{name}\x00{attempt}"
    return hashlib.sha256(seed.encode()).hexdigest()


def create_parameters(options: DiskOptions, lenient_tags: bool = False) -> dict[str, str]:
    """The StorageClass parameters with the mutable ones applied on top (explicit iops wins; a
    tagDeletion_<n> has nothing to remove from a new volume), checked together as a StorageClass's are
    (P.validate: a throughput out of range, an io2 without IOPS -> InvalidParameterError)."""
    params = dict(options.parameters)
    if P.IOPS in options.mutable_parameters:
        params.pop(P.IOPS_PER_GB, None)
    params.update(
        (k, v) for k, v in options.mutable_parameters.items() if not k.startswith(P.TAG_DELETION_PREFIX)
    )
    return P.validate(params, lenient_tags)


class Request(NamedTuple):
    """What CreateVolume sends for one request: its arguments (besides zone, token, tags and source),
    every tag, and of those the user's (tagSpecification_N, PVC/PV metadata); `restore`: the arguments
    only a CreateVolume from a snapshot adds (params.restore_arguments), never compared."""

    args: dict[str, object]
    tags: dict[str, str]
    user_tags: dict[str, str]
    restore: dict[str, object]


MODIFIABLE_LABELS = {
    "Size": "size {} GiB",
    "VolumeType": "type {}",
    "Iops": "iops {}",
    "Throughput": "throughput {} MiB/s",
}


def same_kms_key(requested: str, described: str) -> bool:
    """Whether the `kmsKeyId` parameter names the key EC2 describes (always as a key ARN): the same ARN
    or key id. An alias cannot be resolved without KMS, so it is taken to match."""
    if "alias/" in requested:
        return True
    return described.rsplit("/", 1)[-1] == requested.rsplit("/", 1)[-1]


def fixed_differences(
    volume: Mapping[str, Any], args: Mapping[str, object], user_tags: Mapping[str, str]
) -> list[str]:
    """What CreateVolume set that no modification changes and that differs from `args`: encryption and
    its key, Multi-Attach, and the user's tags (each must be on the volume; tags added since are not
    held against it). An encrypted volume answers a request that did not ask for encryption: EC2
    encrypts every volume where the account encrypts by default, and restores of encrypted snapshots."""
    problems = []
    if args.get("Encrypted") and not volume.get("Encrypted"):
        problems.append("encryption (not encrypted)")
    key = str(args.get("KmsKeyId") or "")
    if key and not same_kms_key(key, str(volume.get("KmsKeyId") or "")):
        problems.append(f"KMS key {volume.get('KmsKeyId') or 'none'}")
    multi_attach = bool(volume.get("MultiAttachEnabled"))
    if bool(args.get("MultiAttachEnabled")) != multi_attach:
        problems.append(f"Multi-Attach ({'enabled' if multi_attach else 'disabled'})")
    have = records.tags(volume)
    problems += [
        f"tag {k}={have[k]}" if k in have else f"tags (no {k})"
        for k, v in user_tags.items()
        if have.get(k) != v
    ]
    return problems


class VolumeCreator:
    """The CreateVolume path of the aws backend."""

    def __init__(
        self, ec2: Ec2, zones: Zones, zone_key: str, owner: OwnerTags, lenient_tags: bool = False
    ) -> None:
        self._ec2 = ec2
        self._zones = zones
        self._zone_key = zone_key
        self._owner = owner
        self._lenient_tags = lenient_tags  # --aws-warn-on-invalid-tag (P.tag_entry)
        self._locks = KeyedLocks()
        self._copy_volumes = True  # False once the endpoint answered that it lacks CopyVolumes

    def create(self, name: str, options: DiskOptions) -> Disk:
        """Idempotent by name: the existing volume when made with these arguments (_check_compatible),
        else AlreadyExistsError."""
        options = self._fitted(options)
        params = create_parameters(options, self._lenient_tags)
        request = self._request(name, options, params)
        with self._locks.hold(name):
            existing = self._find_by_name(name)
            if existing is not None:
                return self._existing(existing, name, options, request)
            return self._create(name, options, request)

    def _fitted(self, options: DiskOptions) -> DiskOptions:
        """`options` sized for its content source in whole GiB (base.fit_source). A source EC2 does
        not know leaves them as they are: a volume made from it before it went still answers its
        name, and a new one is NotFound (_create)."""
        source = options.source
        if source is None:
            return options
        try:
            if source.kind is SourceKind.VOLUME:
                size = int(self._ec2.describe_volume(P.volume_id(source.id))["Size"]) * GiB
            else:
                raw = self._ec2.describe_snapshot(P.snapshot_id(source.id))
                size = records.to_snapshot(raw, self._zone_key).size_bytes
        except NotFoundError:
            return options
        return fit_source(options, size, GiB)

    def _request(self, name: str, options: DiskOptions, params: Mapping[str, str]) -> Request:
        """The CreateVolume arguments and tags for `options`; multi-node access on a type without
        Multi-Attach -> InvalidParameterError."""
        args = P.create_arguments(params, P.gib(options.size_bytes))
        mutable.check_at_creation(params[P.TYPE], P.gib(options.size_bytes), options.mutable_parameters)
        if options.multi_node:
            if params[P.TYPE] not in P.MULTI_ATTACH_TYPES:
                raise InvalidParameterError(
                    f"multi-node access needs EBS Multi-Attach: type io2 (or io1), not {params[P.TYPE]}"
                )
            args["MultiAttachEnabled"] = True
        # compared when the name exists
        user_tags = P.spec_tags(params, VOLUME_FIELDS, options.metadata, self._lenient_tags)
        tags = {
            **self._owner.volume(name),  # the operator's: under the class's, not compared either
            P.TAG_VOLUME_NAME: name,
            P.TAG_DRIVER: "true",
            **user_tags,
            **P.created_for_tags(options.metadata),  # the claim's: not held against an existing volume
            **{P.TAG_CONTEXT_PREFIX + k: v for k, v in options.context.items()},
            **mutable.iops_per_gib_tag(params),  # what a resize needs to keep the class's ratio
        }
        return Request(args, tags, user_tags, P.restore_arguments(params))

    def _existing(self, volume: Mapping[str, Any], name: str, options: DiskOptions, request: Request) -> Disk:
        """The named volume, once available, if it answers this request; else AlreadyExistsError."""
        self._check_compatible(volume, name, options, request)
        return self._disk(self._ec2.wait_available(volume["VolumeId"]))

    def _disk(self, volume: Mapping[str, Any]) -> Disk:
        return records.to_disk(volume, self._zone_key)

    def _named(self, names: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Live volumes tagged with any of `names`, by name (one call for many: ec2.Ec2.lookup)."""
        volumes = self._ec2.describe_all(
            "describe_volumes",
            "Volumes",
            Filters=[
                {"Name": f"tag:{P.TAG_VOLUME_NAME}", "Values": names},
                {"Name": "status", "Values": LIVE_VOLUME_STATES},
            ],
        )
        return grouped(volumes, lambda v: records.tags(v).get(P.TAG_VOLUME_NAME))

    def _find_by_name(self, name: str) -> dict[str, Any] | None:
        volumes = self._ec2.lookup("volume-name", name, self._named)
        if not volumes:
            return None
        return min(volumes, key=lambda v: (v.get("CreateTime") or 0, v["VolumeId"]))

    def _check_compatible(
        self, volume: Mapping[str, Any], name: str, options: DiskOptions, request: Request
    ) -> None:
        """AlreadyExistsError naming every difference between the volume and what this request would
        create: its zone (outside the requisite topology), source and volume context, its size, type,
        IOPS and throughput (_modifiable_differences), and its encryption, Multi-Attach and user tags
        (fixed_differences)."""
        disk = self._disk(volume)
        problems = []
        wanted = options.source
        if wanted is not None and wanted.kind is SourceKind.VOLUME:
            wanted = ContentSource(SourceKind.VOLUME, P.volume_id(wanted.id))
        if wanted != disk.source:
            problems.append(f"source {disk.source.id if disk.source else 'none'}")
        allowed = self._zones.requisite(options)
        if allowed is not None and volume["AvailabilityZone"] not in allowed:
            problems.append(f"zone {volume['AvailabilityZone']}")
        if dict(options.context) != dict(disk.volume_context):
            problems.append(f"volume context {dict(disk.volume_context)}")
        problems += self._modifiable_differences(volume, request.args, options)
        problems += fixed_differences(volume, request.args, request.user_tags)
        if problems:
            raise AlreadyExistsError(
                f"volume {name!r} already exists as {volume['VolumeId']} with different {', '.join(problems)}"
            )

    def _modifiable_differences(
        self, volume: Mapping[str, Any], args: Mapping[str, object], options: DiskOptions
    ) -> list[str]:
        """Size (unless it fits the request's range: size_fits), type, IOPS and throughput that differ
        from `args`. Once EC2 reports a modification of the volume (ControllerExpandVolume,
        ModifyVolume), these no longer say what it was created with, and EC2 describes only the latest
        modification, so the creation values cannot be recovered: then only a size above the current
        one differs (EBS volumes only grow). A replay of the original request is so answered with the
        volume, as the EBS CSI driver answers it (EC2 matches its client token against the creation
        request)."""
        have, want = P.described(volume), P.described(args)
        changed = [key for key in want if want[key] != have.get(key)]
        if options.size_range is not None and size_fits(int(volume["Size"]) * GiB, options):
            changed = [key for key in changed if key != "Size"]
        if changed and self._modified(volume["VolumeId"]):
            larger = int(str(args["Size"])) > int(volume["Size"])
            changed = [key for key in changed if key == "Size" and larger]
        return [MODIFIABLE_LABELS[key].format(have.get(key, "none")) for key in changed]

    def _modified(self, vid: str) -> bool:
        """Whether EC2 reports a modification of the volume. A filter, not VolumeIds: EC2 answers the id
        of a volume never modified with an error."""
        filters = [{"Name": "volume-id", "Values": [vid]}]
        return bool(
            self._ec2.call("describe_volumes_modifications", Filters=filters).get("VolumesModifications")
        )

    def _create(self, name: str, options: DiskOptions, request: Request) -> Disk:
        """A new volume: empty, restored from a snapshot (within the zones it was promised for) or a
        clone of a volume."""
        source = options.source
        if source is not None and source.kind is SourceKind.VOLUME:
            return self._clone(name, P.volume_id(source.id), options, request)
        if source is not None:  # its size is fitted to the request already (_fitted)
            raw = self._ec2.describe_snapshot(P.snapshot_id(source.id))
            snap = records.to_snapshot(raw, self._zone_key)
            request = request._replace(args={**request.args, **request.restore, "SnapshotId": snap.id})
            options = self._within(options, snap.id, records.accessible_zones(raw))
        return self._create_in(self._zones.pick(options), name, options, request)

    def _within(self, options: DiskOptions, snapshot_id: str, zones: list[str]) -> DiskOptions:
        """A restore lands in a zone its snapshot was promised for (none promised: anywhere), preferred
        ones first; a requisite that names none of them -> OutOfCapacityError."""
        if not zones:
            return options
        allowed = self._zones.requisite(options)
        if allowed is None:
            requisite: list[Mapping[str, str]] = [{self._zone_key: z} for z in zones]
        else:
            requisite = [s for s in options.requisite if self._zones.zone_of(s) in zones]
        if not requisite:
            raise OutOfCapacityError(
                f"snapshot {snapshot_id} is accessible from {', '.join(zones)}, none of the requisite "
                f"zones {', '.join(allowed or [])}"
            )
        return options._replace(
            requisite=requisite,
            preferred=[s for s in options.preferred if self._zones.zone_of(s) in zones],
        )

    def _create_in(self, zone: str, name: str, options: DiskOptions, request: Request) -> Disk:
        """CreateVolume in `zone`, waited for until available (_with_token)."""

        def send(token: str) -> Mapping[str, Any]:
            created = self._ec2.call(
                "create_volume",
                AvailabilityZone=zone,
                ClientToken=token,
                TagSpecifications=tag_spec("volume", request.tags),
                **request.args,
            )
            failpoints.hit("aws.create.requested")
            return created

        volume = self._with_token(name, options, request, send)
        failpoints.hit("aws.create.available")
        return self._disk(volume)

    def _with_token(self, name: str, options: DiskOptions, request: Request, send: Send) -> dict[str, Any]:
        """The available volume `send` creates with the name's client token, the EBS CSI driver's way:
        EC2 burns a token whose volume failed (answering it with the deleted volume, or with
        IdempotentParameterMismatch for hours), so a burned token moves on to the next one
        (client_token(name, 1), 2, ...). A mismatch is a burned token only when no live volume has
        the name; when one does, that volume answers as it would have to the name lookup
        (_check_compatible: AlreadyExistsError if made with other arguments)."""
        for attempt in range(MAX_CLIENT_TOKENS):
            try:
                created = send(client_token(name, attempt))
            except IdempotentParameterMismatchError:
                existing = self._find_by_name(name)
                if existing is not None:
                    self._check_compatible(existing, name, options, request)
                    return self._ec2.wait_available(existing["VolumeId"])
                log.info("client token %d of %r is burned (EC2 knows it with other arguments)", attempt, name)
                continue
            if created.get("State") not in ("deleting", "deleted"):
                with contextlib.suppress(NotFoundError):  # being deleted, or unlisted past the lag: burned
                    return self._ec2.wait_available(created["VolumeId"])
            log.info(
                "client token %d of %r answered with deleted volume %s", attempt, name, created["VolumeId"]
            )
        raise TransientError(f"EC2 has burned {MAX_CLIENT_TOKENS} client tokens of {name!r}; retry later")

    def _clone(self, name: str, source_id: str, options: DiskOptions, request: Request) -> Disk:
        """Clones stay in the source's zone: CopyVolumes, else snapshot + restore."""
        source = self._ec2.describe_volume(source_id)
        allowed = self._zones.requisite(options)
        if allowed is not None and source["AvailabilityZone"] not in allowed:
            raise OutOfCapacityError(
                f"a clone of {source_id} must be in its zone {source['AvailabilityZone']}, "
                f"which the requested topology excludes"
            )
        if int(source["Size"]) > int(str(request.args["Size"])):
            raise OutOfRangeError(
                f"volume {source_id} is {source['Size']} GiB, "
                f"larger than the requested {request.args['Size']} GiB"
            )
        request = request._replace(tags={**request.tags, P.TAG_SOURCE_VOLUME: source_id})
        if self._copy_volumes:

            def copy(token: str) -> Mapping[str, Any]:
                copied = self._ec2.call(
                    "copy_volumes",
                    SourceVolumeId=source_id,
                    ClientToken=token,
                    TagSpecifications=tag_spec("volume", request.tags),
                    **request.args,
                )
                volume: Mapping[str, Any] = copied["Volumes"][0]
                return volume

            try:
                return self._disk(self._with_token(name, options, request, copy))
            except UnsupportedActionError as exc:
                log.warning("CopyVolumes unavailable at this endpoint (%s); cloning via snapshots", exc)
                self._copy_volumes = False
        return self._disk(self._clone_via_snapshot(name, source, options, request))

    def _clone_via_snapshot(
        self, name: str, source: Mapping[str, Any], options: DiskOptions, request: Request
    ) -> dict[str, Any]:
        """A scratch snapshot of the source restored into the clone with the name's client tokens
        (_with_token), then deleted (clones.py)."""
        restored: dict[str, Any] = {}

        def restore(sid: str) -> str:
            def send(token: str) -> Mapping[str, Any]:
                created: Mapping[str, Any] = self._ec2.call(
                    "create_volume",
                    AvailabilityZone=source["AvailabilityZone"],
                    SnapshotId=sid,
                    ClientToken=token,
                    TagSpecifications=tag_spec("volume", request.tags),
                    **request.args,
                    **request.restore,
                )
                return created

            restored.update(self._with_token(name, options, request, send))
            return str(restored["VolumeId"])

        ScratchSnapshots(self._ec2, self._owner).clone(name, source["VolumeId"], restore)
        return restored
