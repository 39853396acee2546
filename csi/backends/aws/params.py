"""EBS StorageClass / VolumeAttributesClass parameters, volume-type limits and volume handles.

Pure functions: nothing here talks to EC2. Parameter keys are matched case-insensitively (as the EBS CSI
driver does, and as migrated in-tree StorageClasses need: translation writes `allowautoiopspergbincrease`)
and come back under one canonical spelling.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from csi import keys
from csi.backends.aws.tagvalues import VOLUME_FIELDS, Template, parse
from csi.failures import InvalidParameterError, NotFoundError, OutOfRangeError

log = logging.getLogger("ballast.aws")

# ---- canonical parameter keys
TYPE = "type"
IOPS = "iops"
IOPS_PER_GB = "iopsPerGB"
ALLOW_AUTO_IOPS = "allowAutoIOPSPerGBIncrease"
ALLOW_AUTO_IOPS_ON_MODIFY = "allowAutoIOPSIncreaseOnModify"  # with iopsPerGB: resizes keep the ratio
THROUGHPUT = "throughput"
ENCRYPTED = "encrypted"
KMS_KEY_ID = "kmsKeyId"
BLOCK_EXPRESS = "blockExpress"  # io2: "true" lifts the IOPS cap from IO2_MOUNTABLE_IOPS to the type maximum
INITIALIZATION_RATE = "volumeInitializationRate"  # MiB/s a restore reads its snapshot at
INITIALIZATION_RATES = (100, 300)  # EC2's range
TAG_PREFIX = "tagSpecification_"
TAG_DELETION_PREFIX = "tagDeletion_"  # VolumeAttributesClass only: the value is a tag key to remove
LEGACY_FS_TYPE = "fstype"  # deprecated in the EBS driver; the filesystem comes from the capability

_CANONICAL = {k.lower(): k for k in (TYPE, IOPS, IOPS_PER_GB, ALLOW_AUTO_IOPS, ALLOW_AUTO_IOPS_ON_MODIFY)}
_CANONICAL |= {k.lower(): k for k in (THROUGHPUT, ENCRYPTED, KMS_KEY_ID, BLOCK_EXPRESS, INITIALIZATION_RATE)}
_PASS_THROUGH = {k.lower(): k for k in keys.FORMAT_KEYS}  # and every csi.storage.k8s.io/ key
MUTABLE_KEYS = (TYPE, IOPS, THROUGHPUT)  # and tag changes (mutable.py)

DEFAULT_TYPE = "gp3"

# ---- tags the driver owns: the one list of the keys it writes or reads, so that user tags
# (tagSpecification_N) can be refused any of them (`reserved_tag`)
TAG_VOLUME_NAME = "CSIVolumeName"
TAG_SNAPSHOT_NAME = "CSIVolumeSnapshotName"
TAG_DRIVER = "ebs.csi.aws.com/cluster"
TAG_SOURCE_VOLUME = "CSISourceVolumeId"  # set on clones: CreateVolume idempotency compares it
TAG_CREATED_FOR = (
    "kubernetes.io/created-for/"  # in-tree era tags: .../pvc/name, .../pvc/namespace, .../pv/name
)
TAG_NAMESPACE = "ballast.dev/"  # every tag Ballast adds beyond the EBS driver's lives under it
TAG_READONLY_PREFIX = TAG_NAMESPACE + "published-readonly/"  # + instance id: published read-only there
TAG_CONTEXT_PREFIX = TAG_NAMESPACE + "volume-context/"  # one tag per generic volume_context entry
# iopsPerGB with allowAutoIOPSIncreaseOnModify: "<ratio>" or "<ratio>:block-express" (mutable.kept_iops)
TAG_IOPS_PER_GIB = TAG_NAMESPACE + "iops-per-gib"
# On snapshots: the zones (comma-separated) a CreateSnapshot with accessibility requirements was promised.
TAG_ACCESSIBLE_ZONES = TAG_NAMESPACE + "accessible-zones"
RESERVED_TAGS = frozenset({TAG_VOLUME_NAME, TAG_SNAPSHOT_NAME, TAG_DRIVER, TAG_SOURCE_VOLUME})
RESERVED_TAG_PREFIXES = (TAG_CREATED_FOR, TAG_NAMESPACE)


def prefixed(key: str, prefix: str) -> str | None:
    """`key` with `prefix` in its canonical spelling when it starts with it in any case, else None."""
    return prefix + key[len(prefix) :] if key.lower().startswith(prefix.lower()) else None


def canonical_key(key: str) -> str | None:
    """The canonical spelling of a known StorageClass key (keys are case-insensitive), or None."""
    return _CANONICAL.get(key.lower())


def reserved_tag(key: str) -> bool:
    """True for a tag key a user may not set: AWS's own (`aws:`, any case) and every key or key prefix
    the driver writes or reads."""
    return key.lower().startswith("aws:") or key in RESERVED_TAGS or key.startswith(RESERVED_TAG_PREFIXES)


@dataclass(frozen=True)
class VolumeType:
    """Documented EBS limits of one volume type (sizes in GiB, throughput in MiB/s)."""

    min_gib: int
    max_gib: int
    min_iops: int = 0  # 0: IOPS cannot be provisioned
    max_iops: int = 0
    max_iops_per_gib: int = 0
    iops_required: bool = False
    throughput: tuple[int, int] | None = None


# EBS raises these from time to time, and a stale figure here refuses or silently caps what EC2 would
# accept: gp3 as EBS has allowed since September 2025 (64 TiB, 80,000 IOPS, 2,000 MiB/s).
VOLUME_TYPES: dict[str, VolumeType] = {
    "gp3": VolumeType(1, 65536, 3000, 80000, 500, throughput=(125, 2000)),
    "gp2": VolumeType(1, 16384),
    "io1": VolumeType(4, 16384, 100, 64000, 50, iops_required=True),
    "io2": VolumeType(4, 65536, 100, 256000, 1000, iops_required=True),
    "st1": VolumeType(125, 16384),
    "sc1": VolumeType(125, 16384),
    "standard": VolumeType(1, 1024),
}
MULTI_ATTACH_TYPES = frozenset({"io1", "io2"})
# io2 IOPS without blockExpress=true, as the EBS CSI driver caps them: more would not mount on an
# instance without io2 Block Express support.
IO2_MOUNTABLE_IOPS = 64000


# ---- handles


VOLUME_ID = re.compile(r"vol-[0-9A-Za-z]+")
SNAPSHOT_ID = re.compile(r"snap-[0-9A-Za-z]+")


def volume_id(handle: str) -> str:
    """`vol-...` from a CSI handle or an in-tree id (`aws://zone/vol-...`, `aws:///vol-...`, `vol-...`).

    Anything else raises NotFoundError: no EBS volume can have that id.
    """
    candidate = handle
    if handle.startswith("aws://"):
        try:
            candidate = unquote(urlsplit(handle).path).strip("/")
        except ValueError as exc:
            raise NotFoundError(f"volume {handle!r} not found: not an EBS volume id") from exc
    if not VOLUME_ID.fullmatch(candidate):
        raise NotFoundError(f"volume {handle!r} not found: not an EBS volume id (vol-...)")
    return candidate


def snapshot_id(handle: str) -> str:
    """`snap-...` or NotFoundError."""
    if not SNAPSHOT_ID.fullmatch(handle):
        raise NotFoundError(f"snapshot {handle!r} not found: not an EBS snapshot id (snap-...)")
    return handle


# ---- parsing helpers


def whole_number(key: str, value: str, minimum: int = 1) -> int:
    text = value.strip()
    if not text.isdigit() or int(text) < minimum:
        raise InvalidParameterError(f"parameter {key}: expected a whole number >= {minimum}, got {value!r}")
    return int(text)


def _bool(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidParameterError(f"parameter {key}: expected true or false, got {value!r}")
    return lowered == "true"


def check_tag(key: str, value: str, lenient: bool = False) -> str:
    """The tag name of a `tagSpecification_<n>` parameter, checked before anything is made; unless
    `lenient` (--aws-warn-on-invalid-tag: tag_entry's turn) a reserved name or bad template is refused."""
    name, tag_value = _split_tag(key, value)
    if not lenient:
        _template(key, name, tag_value, VOLUME_FIELDS)
    return name


def tag_entry(
    key: str, value: str, fields: Mapping[str, str], metadata: Mapping[str, str], lenient: bool = False
) -> tuple[str, str] | None:
    """(name, value) of a `tagSpecification_<n>` parameter, its template rendered over the sidecar's
    `metadata` (tagvalues.py). A reserved name or a template these names cannot render ->
    InvalidParameterError, or with `lenient` a warning and None: the tag is left off, as the EBS CSI
    driver's --warn-on-invalid-tag does."""
    name, tag_value = _split_tag(key, value)
    try:
        return name, _template(key, name, tag_value, fields).render(metadata)
    except InvalidParameterError as refused:
        if not lenient:
            raise
        log.warning("tag left off (--aws-warn-on-invalid-tag): %s", refused)
        return None


def _split_tag(key: str, value: str) -> tuple[str, str]:
    """(name, template text) of `name=template`; no `name=` -> InvalidParameterError, lenient or not."""
    name, sep, tag_value = value.partition("=")
    name = name.strip()
    if not sep or not name:
        raise InvalidParameterError(f"parameter {key}: expected key=value, got {value!r}")
    return name, tag_value


def _template(key: str, name: str, tag_value: str, fields: Mapping[str, str]) -> Template:
    if reserved_tag(name):
        raise InvalidParameterError(f"parameter {key}: tag key {name!r} is reserved for the driver or AWS")
    return parse(key, tag_value.strip(), fields)


def check_type(value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in VOLUME_TYPES:
        raise InvalidParameterError(
            f"parameter {TYPE}: unsupported EBS volume type {value!r} (use one of {', '.join(VOLUME_TYPES)})"
        )
    return lowered


def validate(parameters: Mapping[str, str], lenient_tags: bool = False) -> dict[str, str]:
    """Canonical, checked StorageClass parameters. Unknown keys and bad values raise
    InvalidParameterError naming the key. Format keys and `csi.storage.k8s.io/` keys pass through.
    `lenient_tags`: tags are checked as check_tag(lenient=True) does."""
    out = _canonical(parameters, lenient_tags)
    kind = check_type(out.get(TYPE, DEFAULT_TYPE))
    out[TYPE] = kind
    _check_iops(out, kind)
    _check_throughput(out, kind)
    for key in (ALLOW_AUTO_IOPS, ALLOW_AUTO_IOPS_ON_MODIFY, ENCRYPTED, BLOCK_EXPRESS):
        if key in out:
            out[key] = str(_bool(key, out[key])).lower()
    # a key encrypts (as with the EBS CSI driver, which sets Encrypted with it); "false" contradicts it
    if KMS_KEY_ID in out and out.setdefault(ENCRYPTED, "true") != "true":
        raise InvalidParameterError(f"parameter {KMS_KEY_ID} needs {ENCRYPTED}=true, or no {ENCRYPTED}")
    if INITIALIZATION_RATE in out:
        low, high = INITIALIZATION_RATES
        rate = whole_number(INITIALIZATION_RATE, out[INITIALIZATION_RATE])
        if not low <= rate <= high:
            raise InvalidParameterError(
                f"parameter {INITIALIZATION_RATE}: EC2 allows {low}..{high} MiB/s, got {rate}"
            )
        out[INITIALIZATION_RATE] = str(rate)
    return out


def _canonical(parameters: Mapping[str, str], lenient_tags: bool) -> dict[str, str]:
    """Parameters under their canonical spelling (keys are case-insensitive); a key given twice or an
    unknown key -> InvalidParameterError."""
    out: dict[str, str] = {}
    for key, value in parameters.items():
        lowered = key.lower()
        if lowered in _PASS_THROUGH or lowered.startswith(keys.PREFIX_K8S):
            out[key] = value
            continue
        if lowered == LEGACY_FS_TYPE:
            continue  # the filesystem travels in the volume capability
        tag_key = prefixed(key, TAG_PREFIX)
        if lowered in _CANONICAL:
            canonical = _CANONICAL[lowered]
        elif tag_key is not None:
            check_tag(key, value, lenient_tags)
            canonical = tag_key
        else:
            raise InvalidParameterError(f"unknown parameter {key!r} for the EBS backend")
        if canonical in out:
            raise InvalidParameterError(f"parameter {key!r} is given twice (keys are case-insensitive)")
        out[canonical] = value.strip()
    return out


def _check_iops(out: dict[str, str], kind: str) -> None:
    """Whole numbers, not both; the range depends on the size and is applied at creation
    (provisioned_iops). On a type without provisioned IOPS they are left out with a warning, as the EBS
    CSI driver ignores them there: a class written for it works unchanged."""
    limits = VOLUME_TYPES[kind]
    if IOPS in out and IOPS_PER_GB in out:
        raise InvalidParameterError(f"parameters {IOPS} and {IOPS_PER_GB} are mutually exclusive")
    for key in (IOPS, IOPS_PER_GB):
        if key in out:
            whole_number(key, out[key])
            if not limits.max_iops:
                log.warning("parameter %s is ignored: volume type %s has no provisioned IOPS", key, kind)
                del out[key]
    if limits.iops_required and IOPS not in out and IOPS_PER_GB not in out:
        raise InvalidParameterError(f"volume type {kind} needs parameter {IOPS} or {IOPS_PER_GB}")


def _check_throughput(out: dict[str, str], kind: str) -> None:
    """A whole number in gp3's range; on another type left out with a warning, as _check_iops does."""
    if THROUGHPUT not in out:
        return
    mibs = whole_number(THROUGHPUT, out[THROUGHPUT])
    limits = VOLUME_TYPES[kind].throughput
    if limits is None:
        log.warning(
            "parameter %s is ignored: volume type %s takes no throughput (only gp3 does)", THROUGHPUT, kind
        )
        del out[THROUGHPUT]
        return
    low, high = limits
    if not low <= mibs <= high:
        raise InvalidParameterError(f"parameter {THROUGHPUT}: gp3 allows {low}..{high} MiB/s, got {mibs}")


def gib(size_bytes: int) -> int:
    """Whole GiB holding `size_bytes` (rounded up, at least 1)."""
    return max(1, -(-size_bytes // 1024**3))


def check_size(kind: str, size_gib: int) -> None:
    limits = VOLUME_TYPES[kind]
    if not limits.min_gib <= size_gib <= limits.max_gib:
        raise OutOfRangeError(
            f"EBS {kind} volumes are {limits.min_gib}..{limits.max_gib} GiB; {size_gib} GiB was requested"
        )


def max_iops(kind: str, size_gib: int, block_express: bool = False) -> int:
    """The most IOPS to provision for a `kind` volume of `size_gib`: the type maximum (io2 without
    `block_express`: IO2_MOUNTABLE_IOPS), and at most its IOPS-per-GiB ratio times the size, though
    never less than the type minimum (a 1 GiB gp3 has 3000)."""
    limits = VOLUME_TYPES[kind]
    top = limits.max_iops if block_express or kind != "io2" else IO2_MOUNTABLE_IOPS
    return min(top, max(limits.min_iops, limits.max_iops_per_gib * size_gib))


def provisioned_iops(params: Mapping[str, str], size_gib: int) -> int | None:
    """IOPS to request for a volume of `size_gib` (None: the type's default), as the EBS CSI driver
    computes them: explicit `iops`, or `iopsPerGB` x size, capped at max_iops. Below the type minimum it is
    raised to the minimum with allowAutoIOPSPerGBIncrease=true, else InvalidParameterError."""
    kind = params.get(TYPE, DEFAULT_TYPE)
    limits = VOLUME_TYPES[kind]
    if IOPS in params:
        requested, given = int(params[IOPS]), f"{IOPS}={params[IOPS]} is"
    elif IOPS_PER_GB in params:
        requested = int(params[IOPS_PER_GB]) * size_gib
        given = f"{IOPS_PER_GB}={params[IOPS_PER_GB]} on {size_gib} GiB gives {requested} IOPS, which is"
    else:
        return None
    if requested < limits.min_iops:
        if params.get(ALLOW_AUTO_IOPS) != "true":
            raise InvalidParameterError(
                f"{given} below the {kind} minimum {limits.min_iops}; "
                f"set {ALLOW_AUTO_IOPS}=true to raise it automatically"
            )
        return limits.min_iops
    return min(requested, max_iops(kind, size_gib, params.get(BLOCK_EXPRESS) == "true"))


def described(fields: Mapping[str, Any]) -> dict[str, object]:
    """Size, type, IOPS and throughput (what ModifyVolume can change) as DescribeVolumes reports them,
    from a volume record or from CreateVolume arguments: IOPS only for the types that provision them and
    throughput only for gp3, each at the type's baseline (its minimum) when not given, as EC2 sets it."""
    kind = str(fields.get("VolumeType", DEFAULT_TYPE))
    limits = VOLUME_TYPES.get(kind)
    out: dict[str, object] = {"Size": int(fields["Size"]), "VolumeType": kind}
    if limits is not None and limits.max_iops:
        out["Iops"] = int(fields.get("Iops") or limits.min_iops)
    if limits is not None and limits.throughput is not None:
        out["Throughput"] = int(fields.get("Throughput") or limits.throughput[0])
    return out


def create_arguments(params: Mapping[str, str], size_gib: int) -> dict[str, object]:
    """CreateVolume / CopyVolumes arguments (besides zone, token, tags, source) for these parameters."""
    kind = params.get(TYPE, DEFAULT_TYPE)
    check_size(kind, size_gib)
    args: dict[str, object] = {"VolumeType": kind, "Size": size_gib}
    iops = provisioned_iops(params, size_gib)
    if iops is not None:
        args["Iops"] = iops
    if THROUGHPUT in params:
        args["Throughput"] = int(params[THROUGHPUT])
    if params.get(ENCRYPTED) == "true":
        args["Encrypted"] = True
        if KMS_KEY_ID in params:
            args["KmsKeyId"] = params[KMS_KEY_ID]
    return args


def restore_arguments(params: Mapping[str, str]) -> dict[str, object]:
    """CreateVolume arguments only a restore from a snapshot takes: the volume initialization rate
    (EC2 refuses it for an empty volume, so a class serving both kinds of claim sends it to restores
    alone)."""
    if INITIALIZATION_RATE not in params:
        return {}
    return {"VolumeInitializationRate": int(params[INITIALIZATION_RATE])}


def spec_tags(
    params: Mapping[str, str], fields: Mapping[str, str], metadata: Mapping[str, str], lenient: bool = False
) -> dict[str, str]:
    """Tags from the tagSpecification_N keys of `params`, their templates over `fields` (tagvalues.py)
    rendered with the sidecar's `metadata`; `lenient`: see tag_entry."""
    entries = (
        tag_entry(key, params[key], fields, metadata, lenient)
        for key in sorted(params)
        if key.startswith(TAG_PREFIX)
    )
    return dict(entry for entry in entries if entry is not None)


def created_for_tags(metadata: Mapping[str, str]) -> dict[str, str]:
    """The in-tree era `kubernetes.io/created-for/*` tags of a claim (DiskOptions.metadata)."""
    named = ((keys.PVC_NAME, "pvc/name"), (keys.PVC_NAMESPACE, "pvc/namespace"), (keys.PV_NAME, "pv/name"))
    return {TAG_CREATED_FOR + suffix: metadata[key] for key, suffix in named if metadata.get(key)}
