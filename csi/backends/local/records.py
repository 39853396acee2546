"""Volume records of the local backend as Disk values: what a row of the state database says about a
volume, and the creation arguments compared when a name is created again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from csi import keys
from csi.backends.base import Attachment, ContentSource, Disk, DiskOptions, SourceKind, size_fits
from csi.backends.local.rows import AttachmentRow, VolumeRow
from csi.failures import AlreadyExistsError


def spec(options: DiskOptions) -> dict[str, Any]:
    """The creation arguments recorded with a volume and compared for idempotency."""
    src = options.source
    return {
        "size": options.size_bytes,
        "parameters": dict(options.parameters),
        "context": dict(options.context),
        "mutable": dict(options.mutable_parameters),
        "source": [src.kind.value, src.id] if src else None,
        "multi_node": options.multi_node,
    }


def check_same(row: VolumeRow, wanted: dict[str, Any], options: DiskOptions) -> None:
    """A second create of the name must ask for what the first did, its size aside, which only has to
    fit the request (size_fits: the volume's size now, or with no range the size it was made with);
    AlreadyExistsError otherwise, naming in request terms what this request asks differently."""
    size = row.size if options.size_range is not None else row.spec.get("size", row.size)
    differs = [
        _asked(k, row.spec.get(k), wanted[k])
        for k in sorted(wanted)
        if k != "size" and row.spec.get(k) != wanted[k]
    ]
    if not size_fits(size, options):
        differs.append(f"a capacity_range that a volume of {row.size} bytes does not fit")
    if differs:
        raise AlreadyExistsError(
            f"volume {row.name!r} already exists ({row.id}), but this request asks for {'; '.join(differs)}; "
            "repeat the request it was made with, or choose another name"
        )


def _asked(key: str, theirs: Any, ours: Any) -> str:
    """What the request asks for that the volume was not made with (a `spec` entry, in request terms)."""
    if key == "multi_node":
        return (
            "a multi-node access mode (the volume was made for single-node access only)"
            if ours
            else "single-node access only (the volume was made for a multi-node access mode)"
        )
    if key == "source":
        made = f"from {theirs[0]} {theirs[1]}" if theirs else "empty"
        return f"another volume_content_source (the volume was made {made})"
    if key == "context":  # the fs type and mkfs parameters, from the request's parameters
        theirs, ours = theirs or {}, ours or {}
        names = sorted(k for k in {*theirs, *ours} if theirs.get(k) != ours.get(k))
        return "; ".join(
            f"{'fs type' if k == keys.VC_FS_TYPE else 'parameter ' + repr(k)} {_value(ours, k)} "
            f"(the volume was made with {_value(theirs, k)})"
            for k in names
        )
    field = {"parameters": "parameters", "mutable": "mutable_parameters"}.get(key, key)
    return f"other {field} ({_items(ours)}; the volume was made with {_items(theirs or {})})"


def _value(values: Mapping[str, str], key: str) -> str:
    return repr(values[key]) if key in values else "none"


def _items(values: Mapping[str, str]) -> str:
    return ", ".join(f"{k!r}: {v!r}" for k, v in sorted(values.items())) or "none"


def to_disk(
    row: VolumeRow, attachments: Sequence[AttachmentRow], path: str, topology: Mapping[str, str]
) -> Disk:
    """The Disk of a volume row whose backing file is `path`."""
    src = row.spec.get("source")
    return Disk(
        id=row.id,
        name=row.name,
        size_bytes=row.size,
        topology=dict(topology),
        parameters={**row.spec.get("parameters", {}), **row.mutable},
        volume_context=dict(row.spec.get("context", {})),
        source=ContentSource(SourceKind(src[0]), src[1]) if src else None,
        attachments=tuple(
            Attachment(a.node_id, a.readonly, {keys.PC_VOLUME_FILE: path}) for a in attachments
        ),
        multi_node=bool(row.spec.get("multi_node")),
    )
