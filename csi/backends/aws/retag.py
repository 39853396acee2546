"""The tag changes of a VolumeAttributesClass, applied to an existing volume by ControllerModifyVolume.

`tagSpecification_<n>` sets a tag, its template (tagvalues.py) rendered over the claim's names that
the external-resizer passes with --extra-modify-metadata (the chart runs it so); `tagDeletion_<n>`
removes the tag it names. Only what differs from the volume's tags is sent, with CreateTags and
DeleteTags, so a repeated modify changes nothing. At creation a class's tags are the volume's first
(volumes.create_parameters) and its deletions have nothing to remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from csi.backends.aws import params as P
from csi.backends.aws.ec2 import Ec2
from csi.backends.aws.tagvalues import VOLUME_FIELDS


class TagChanges(NamedTuple):
    put: dict[str, str]
    delete: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)


def tag_changes(mutable: Mapping[str, str], metadata: Mapping[str, str]) -> TagChanges:
    """The changes among validated mutable parameters (params.validate_mutable), rendered. A template
    these names cannot render -> InvalidParameterError."""
    deleted = {value.strip() for key, value in mutable.items() if key.startswith(P.TAG_DELETION_PREFIX)}
    return TagChanges(P.spec_tags(mutable, VOLUME_FIELDS, metadata), tuple(sorted(deleted)))


def settings(mutable: Mapping[str, str]) -> dict[str, str]:
    """The mutable parameters ModifyVolume takes (type, iops, throughput)."""
    return {key: value for key, value in mutable.items() if key in P.MUTABLE_KEYS}


def apply(ec2: Ec2, vid: str, changes: TagChanges, current: Mapping[str, str]) -> None:
    """Make the tags of volume `vid`, `current` now, match `changes`."""
    put = {key: value for key, value in changes.put.items() if current.get(key) != value}
    gone = [key for key in changes.delete if key in current]
    if put:
        ec2.call("create_tags", Resources=[vid], Tags=[{"Key": k, "Value": v} for k, v in put.items()])
    if gone:
        ec2.call("delete_tags", Resources=[vid], Tags=[{"Key": k} for k in gone])
