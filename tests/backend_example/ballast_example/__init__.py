"""An example Ballast backend, shipped as its own package: volumes are sparse files in a directory,
named after the volume, and the node sees them through loop devices.

It implements the required part of csi.backends.base.Backend and nothing optional: no attach step
(attach_required=False), no snapshots, no topology. A name is its own volume id, so create is
idempotent by construction: the same name and size -> the same volume; another size -> AlreadyExistsError.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Self

from csi import loop
from csi.backends.base import Backend, BackendCapabilities, Disk, DiskOptions, NodeIdentity, Page
from csi.config import Config
from csi.failures import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidParameterError,
    InvalidTokenError,
    NotFoundError,
)

VOLUME_ID = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")
MiB = 1024**2


class ExampleBackend(Backend):
    default_driver_name = "example.csi.ballast.dev"

    def __init__(self, directory: str, node_id: str) -> None:
        self.directory = directory
        self.node_id = node_id
        self.capabilities = BackendCapabilities(attach_required=False, list_snapshots=False)

    @classmethod
    def from_config(cls, config: Config) -> Self:
        directory = os.path.join(config.backend.data_dir, "example")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        return cls(directory, config.node.node_id)

    def _path(self, volume_id: str) -> str:
        if not VOLUME_ID.fullmatch(volume_id):
            raise NotFoundError(f"volume {volume_id!r} not found (not an id this backend issues)")
        return os.path.join(self.directory, volume_id)

    def _disk(self, volume_id: str) -> Disk:
        try:
            size = os.stat(self._path(volume_id)).st_size
        except FileNotFoundError:
            raise NotFoundError(f"volume {volume_id} not found") from None
        return Disk(id=volume_id, name=volume_id, size_bytes=size)

    def validate_parameters(self, parameters: Mapping[str, str]) -> dict[str, str]:
        if parameters:
            raise InvalidParameterError(f"the example backend takes no parameters, got {sorted(parameters)}")
        return {}

    def create_volume(self, name: str, options: DiskOptions) -> Disk:
        if not VOLUME_ID.fullmatch(name):
            raise InvalidParameterError(f"name {name!r}: use lower-case letters, digits, '.' and '-'")
        if options.source is not None:
            raise InvalidParameterError("the example backend cannot populate a volume from a source")
        try:
            fd = os.open(self._path(name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            disk = self._disk(name)
            if disk.size_bytes != options.size_bytes:
                raise AlreadyExistsError(f"volume {name} exists with {disk.size_bytes} bytes") from None
            return disk
        try:
            os.ftruncate(fd, options.size_bytes)
        finally:
            os.close(fd)
        return self._disk(name)

    def delete_volume(self, volume_id: str) -> None:
        try:
            os.unlink(self._path(volume_id))
        except FileNotFoundError:
            raise NotFoundError(f"volume {volume_id} not found") from None

    def get_volume(self, volume_id: str) -> Disk:
        return self._disk(volume_id)

    def list_volumes(self, max_entries: int = 0, starting_token: str = "") -> Page[Disk]:
        """In name order; the token is the last name returned, so the next page starts after it."""
        if starting_token and not VOLUME_ID.fullmatch(starting_token):
            raise InvalidTokenError(f"starting_token {starting_token!r} was not issued by this backend")
        names = [n for n in sorted(os.listdir(self.directory)) if n > starting_token]
        page = names[:max_entries] if max_entries else names
        token = page[-1] if max_entries and len(names) > max_entries else ""
        return Page(items=[self._disk(n) for n in page], next_token=token)

    def expand_volume(self, volume_id: str, size_bytes: int) -> int:
        """Grow the file; a size at or below the current one changes nothing (volumes never shrink)."""
        current = self._disk(volume_id).size_bytes
        if size_bytes > current:
            os.truncate(self._path(volume_id), size_bytes)
        return max(current, size_bytes)

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        raise InvalidParameterError("the example backend needs no attach step")

    def detach(self, volume_id: str, node_id: str) -> None:
        raise InvalidParameterError("the example backend needs no attach step")

    def node_identity(self) -> NodeIdentity:
        return NodeIdentity(node_id=self.node_id, max_volumes=16)

    def resolve_device(self, volume_id: str, publish_context: Mapping[str, str]) -> str:
        """The loop device over the volume's file, proven to map exactly that file."""
        path = self._path(volume_id)
        self._disk(volume_id)
        device = loop.attach(path)
        if os.path.realpath(loop.backing_file(device) or "") != os.path.realpath(path):
            raise FailedPreconditionError(f"loop device {device} does not map volume {volume_id}")
        return device

    def release_device(self, volume_id: str) -> None:
        loop.detach_file(self._path(volume_id))
