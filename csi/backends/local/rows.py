"""The rows of the local backend's state database (state.py, schema.py) as values: what the store
returns and what callers hand back to it."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, NamedTuple


class VolumeRow(NamedTuple):
    seq: int
    id: str
    name: str
    size: int
    spec: dict[str, Any]  # creation arguments, compared for idempotency
    mutable: dict[str, str]  # current mutable parameters
    created: float


class AttachmentRow(NamedTuple):
    volume_id: str
    node_id: str
    readonly: bool


class SnapshotRow(NamedTuple):
    seq: int
    id: str
    name: str
    source_volume_id: str
    size: int
    created: float
    group_id: str


class GroupRow(NamedTuple):
    id: str
    name: str
    volume_ids: tuple[str, ...]
    created: float
    parameters: dict[str, str] | None = None  # normalised, compared for idempotency; None: not recorded


def volume_row(r: sqlite3.Row) -> VolumeRow:
    return VolumeRow(
        r["seq"], r["id"], r["name"], r["size"], json.loads(r["spec"]), json.loads(r["mutable"]), r["created"]
    )


def snapshot_row(r: sqlite3.Row) -> SnapshotRow:
    return SnapshotRow(
        r["seq"], r["id"], r["name"] or "", r["source_volume_id"], r["size"], r["created"], r["group_id"]
    )


def group_row(r: sqlite3.Row) -> GroupRow:
    parameters = None if r["parameters"] is None else json.loads(r["parameters"])
    return GroupRow(r["id"], r["name"], tuple(json.loads(r["volume_ids"])), r["created"], parameters)
