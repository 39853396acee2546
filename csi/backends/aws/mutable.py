"""The mutable parameters of the aws backend (VolumeAttributesClass): `type`, `iops`, `throughput`, which
ModifyVolume changes (modify_arguments, which also keeps a class's iopsPerGB across a resize when it
said allowAutoIOPSIncreaseOnModify), and tag changes.

`tagSpecification_<n>` sets a tag, its template (tagvalues.py) rendered over the claim's names that
the external-resizer passes with --extra-modify-metadata (the chart runs it so); `tagDeletion_<n>`
removes the tag it names. On an existing volume only what differs from its tags is sent, with
CreateTags and DeleteTags, so a repeated modify changes nothing. At creation a class's tags are the
volume's first (volumes.create_parameters) and its deletions have nothing to remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from csi.backends.aws import params as P
from csi.backends.aws.records import tags
from csi.backends.aws.tagvalues import VOLUME_FIELDS
from csi.failures import InvalidParameterError, OutOfRangeError

if TYPE_CHECKING:  # validation alone (the local backend standing in for EBS) needs no EC2 client
    from csi.backends.aws.ec2 import Ec2


def _deleted_tag(key: str, value: str) -> str:
    name = value.strip()
    if not name:
        raise InvalidParameterError(f"parameter {key}: expected the key of the tag to delete")
    if P.reserved_tag(name):
        raise InvalidParameterError(f"parameter {key}: tag key {name!r} is reserved for the driver or AWS")
    return name


# The EBS CSI driver's deprecated spelling of `type` (DeprecatedModificationKeyVolumeType): accepted as
# its alias; `type` wins when a class gives both.
DEPRECATED_TYPE = "volumeType"


def _mutable_key(key: str) -> str:
    for prefix in (P.TAG_PREFIX, P.TAG_DELETION_PREFIX):
        tag_key = P.prefixed(key, prefix)
        if tag_key is not None:
            return tag_key
    canonical = P.canonical_key(key)
    if canonical not in P.MUTABLE_KEYS:
        raise InvalidParameterError(
            f"mutable parameter {key!r} is not supported by the EBS backend "
            f"(supported: {', '.join(P.MUTABLE_KEYS)}, {P.TAG_PREFIX}<n>, {P.TAG_DELETION_PREFIX}<n>)"
        )
    return canonical


def _type_alias(parameters: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """`parameters` without the deprecated `volumeType` (any case), and its value (None: not given)."""
    aliases = [key for key in parameters if key.lower() == DEPRECATED_TYPE.lower()]
    if len(aliases) > 1:
        raise InvalidParameterError(f"parameter {DEPRECATED_TYPE} is given twice (keys are case-insensitive)")
    rest = {key: value for key, value in parameters.items() if key not in aliases}
    return rest, parameters[aliases[0]] if aliases else None


def validate(parameters: Mapping[str, str], lenient_tags: bool = False) -> dict[str, str]:
    """Canonical VolumeAttributesClass parameters: `type` (or its alias `volumeType`), `iops`,
    `throughput`, and tag changes:
    `tagSpecification_<n>` (key=template, as in a StorageClass) sets a tag, `tagDeletion_<n>` (a tag
    key) removes one; a key both set and removed -> InvalidParameterError."""
    out: dict[str, str] = {}
    changed: dict[str, list[str]] = {P.TAG_PREFIX: [], P.TAG_DELETION_PREFIX: []}
    given, alias = _type_alias(parameters)
    for key, value in given.items():
        canonical = _mutable_key(key)
        if canonical in out:
            raise InvalidParameterError(f"parameter {key!r} is given twice (keys are case-insensitive)")
        if canonical.startswith(P.TAG_PREFIX):
            changed[P.TAG_PREFIX].append(P.check_tag(key, value, lenient_tags))
        elif canonical.startswith(P.TAG_DELETION_PREFIX):
            changed[P.TAG_DELETION_PREFIX].append(_deleted_tag(key, value))
        out[canonical] = value.strip()
    both = sorted(set(changed[P.TAG_PREFIX]) & set(changed[P.TAG_DELETION_PREFIX]))
    if both:
        raise InvalidParameterError(f"tag(s) {', '.join(both)} both set and deleted by one class")
    if alias is not None and P.TYPE not in out:
        out[P.TYPE] = alias
    if P.TYPE in out:
        out[P.TYPE] = P.check_type(out[P.TYPE])
    for key in (P.IOPS, P.THROUGHPUT):
        if key in out:
            out[key] = str(P.whole_number(key, out[key]))
    return out


class TagChanges(NamedTuple):
    put: dict[str, str]
    delete: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)


def tag_changes(
    parameters: Mapping[str, str], metadata: Mapping[str, str], lenient_tags: bool = False
) -> TagChanges:
    """The tag changes among validated `parameters` (validate), rendered over the claim's
    `metadata`. A template these names cannot render -> InvalidParameterError (`lenient_tags`: the
    tag left off, P.tag_entry)."""
    deleted = {v.strip() for k, v in parameters.items() if k.startswith(P.TAG_DELETION_PREFIX)}
    return TagChanges(P.spec_tags(parameters, VOLUME_FIELDS, metadata, lenient_tags), tuple(sorted(deleted)))


def settings(parameters: Mapping[str, str]) -> dict[str, str]:
    """The validated `parameters` ModifyVolume takes (type, iops, throughput)."""
    return {key: value for key, value in parameters.items() if key in P.MUTABLE_KEYS}


def apply(ec2: Ec2, vid: str, changes: TagChanges, current: Mapping[str, str]) -> None:
    """Make the tags of volume `vid`, `current` now, match `changes`."""
    put = {key: value for key, value in changes.put.items() if current.get(key) != value}
    gone = [key for key in changes.delete if key in current]
    if put:
        ec2.call("create_tags", Resources=[vid], Tags=[{"Key": k, "Value": v} for k, v in put.items()])
    if gone:
        ec2.call("delete_tags", Resources=[vid], Tags=[{"Key": k} for k in gone])


def modify_arguments(
    volume: Mapping[str, Any], size_bytes: int | None, changes: Mapping[str, str]
) -> dict[str, Any]:
    """ModifyVolume arguments taking the EC2 volume record to `size_bytes` (None: keep; never smaller)
    and the validated mutable parameters `changes`; {} when it is there already. A combination the
    volume type does not allow -> InvalidParameterError (OutOfRangeError: a size past the type's)."""
    current = int(volume["Size"])
    args: dict[str, Any] = {}
    if size_bytes is not None and P.gib(size_bytes) > current:  # not bigger: satisfied (EBS never shrinks)
        args["Size"] = P.gib(size_bytes)
    kind = changes.get(P.TYPE, volume.get("VolumeType", P.DEFAULT_TYPE))
    if kind != volume.get("VolumeType"):
        args["VolumeType"] = kind
    for key, field in ((P.IOPS, "Iops"), (P.THROUGHPUT, "Throughput")):
        if key in changes and int(changes[key]) != volume.get(field):
            args[field] = int(changes[key])
    if "Size" in args and P.IOPS not in changes:
        args.update(kept_iops(volume, kind, args["Size"]))
    if args:
        _check_size(kind, int(args.get("Size", current)), "VolumeType" in args)
        _check_performance(kind, int(args.get("Size", current)), args)
    return args


def _check_size(kind: str, size_gib: int, type_changes: bool) -> None:
    """A size the type cannot have: OutOfRangeError for a resize, InvalidParameterError when the new
    type is what refuses it. Spec, ControllerModifyVolume: INVALID_ARGUMENT when "the specified volume
    cannot support the specified parameters" (the external-resizer gives up only on that code)."""
    try:
        P.check_size(kind, size_gib)
    except OutOfRangeError as exc:
        if not type_changes:
            raise
        raise InvalidParameterError(f"volume type {kind} cannot hold this volume: {exc}") from exc


def check_at_creation(kind: str, size_gib: int, parameters: Mapping[str, str]) -> None:
    """The `iops` and `throughput` among a CreateVolume's validated mutable `parameters`, checked as a
    modification to them is (InvalidParameterError): a class's values are made exactly or refused,
    never capped as a StorageClass's IOPS are."""
    fields = ((P.IOPS, "Iops"), (P.THROUGHPUT, "Throughput"))
    wanted = {field: int(parameters[key]) for key, field in fields if key in parameters}
    _check_performance(kind, size_gib, wanted)


def _check_performance(kind: str, size_gib: int, args: Mapping[str, Any]) -> None:
    """IOPS and throughput within what the type allows at this size (P.VOLUME_TYPES, as at creation)
    -> else InvalidParameterError, before anything is sent: EC2 would refuse the ModifyVolume, and the
    spec's INVALID_ARGUMENT means nothing was changed."""
    limits = P.VOLUME_TYPES[kind]
    if "Iops" in args:
        if not limits.max_iops:
            raise InvalidParameterError(f"volume type {kind} has no provisioned IOPS")
        top = P.max_iops(kind, size_gib, block_express=True)
        if not limits.min_iops <= args["Iops"] <= top:
            raise InvalidParameterError(
                f"a {size_gib} GiB {kind} volume takes {limits.min_iops}..{top} IOPS, not {args['Iops']}"
            )
    if "Throughput" in args:
        if limits.throughput is None:
            raise InvalidParameterError(f"volume type {kind} takes no throughput")
        low, high = limits.throughput
        if not low <= args["Throughput"] <= high:
            raise InvalidParameterError(f"{kind} allows {low}..{high} MiB/s, not {args['Throughput']}")


def iops_per_gib_tag(params: Mapping[str, str]) -> dict[str, str]:
    """The tag that makes resizes keep a class's iopsPerGB (allowAutoIOPSIncreaseOnModify=true)."""
    if P.IOPS_PER_GB not in params or params.get(P.ALLOW_AUTO_IOPS_ON_MODIFY) != "true":
        return {}
    express = ":block-express" if params.get(P.BLOCK_EXPRESS) == "true" else ""
    return {P.TAG_IOPS_PER_GIB: params[P.IOPS_PER_GB] + express}


def kept_iops(volume: Mapping[str, Any], kind: str, size_gib: int) -> dict[str, int]:
    """{"Iops": n} raising a volume made with iopsPerGB and allowAutoIOPSIncreaseOnModify to its ratio
    at `size_gib` (capped as at creation, params.max_iops), as the EBS driver does on a resize; {}
    for any other volume, or when it has as many already."""
    ratio, _, express = tags(volume).get(P.TAG_IOPS_PER_GIB, "").partition(":")
    if not ratio.isdigit() or not P.VOLUME_TYPES[kind].max_iops:
        return {}
    wanted = min(int(ratio) * size_gib, P.max_iops(kind, size_gib, express == "block-express"))
    return {"Iops": wanted} if wanted > int(volume.get("Iops") or 0) else {}
