"""Health records (CSI v1.13 volume and storage health), grpc-free and shared by every layer.

An `Issue` is one adverse condition of a volume: a status (DEGRADED, INACCESSIBLE, DATA_LOSS), a short
CamelCase reason a machine can match on, and a message that tells a person what happened and what to do.
The spec forbids two entries with the same (status, reason) for one volume; `distinct` drops repeats.
A `StorageIssue` is the same for the storage a node reaches (STORAGE_DEGRADED, STORAGE_UNREACHABLE).
No issues means no adverse condition is known, never "not checked".
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import NamedTuple


class Status(enum.Enum):
    DEGRADED = "degraded"  # usable, but not operating as it should
    INACCESSIBLE = "inaccessible"  # cannot be used (from anywhere, or from this node on the node side)
    DATA_LOSS = "data_loss"  # data is known or strongly suspected to be lost


class StorageStatus(enum.Enum):
    DEGRADED = "degraded"
    UNREACHABLE = "unreachable"


class Issue(NamedTuple):
    status: Status
    reason: str
    message: str


class StorageIssue(NamedTuple):
    status: StorageStatus
    reason: str
    message: str


class VolumeHealth(NamedTuple):
    """The known issues of one volume (empty: none known)."""

    volume_id: str
    issues: tuple[Issue, ...] = ()


def distinct(issues: Iterable[Issue]) -> tuple[Issue, ...]:
    """`issues` in order, keeping the first of each (status, reason)."""
    seen: set[tuple[Status, str]] = set()
    out: list[Issue] = []
    for issue in issues:
        key = (issue.status, issue.reason)
        if key not in seen:
            seen.add(key)
            out.append(issue)
    return tuple(out)
