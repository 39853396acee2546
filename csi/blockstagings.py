"""Where this node staged volumes for raw block access, kept on disk so that a restarted node plugin
still knows: a block stage mounts nothing, so unlike a filesystem staging it leaves nothing in the
mount table to find again, and a staging forgotten on restart let a later stage format the raw volume.

One record per volume, `<root>/plugins/ballast-block-staged/<sha256 of the volume id>` (the volume id
and its staging path, JSON), under the first allowed root that holds the staging path: the kubelet dir,
which outlives the plugin's container. A record is written whole (rename) and removed by NodeUnstage.

Contracts: `staged_at` is the staging path recorded for the volume, or None; `record` replaces the
volume's record; `forget` of a volume without one is a no-op. OS failures propagate (the caller maps
them); a record that is not ours (another volume id under the same name) is ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence

from csi import paths

RECORD_DIR = os.path.join("plugins", "ballast-block-staged")


class BlockStagings:
    """The block stagings recorded under `roots` (the node's allowed roots)."""

    def __init__(self, roots: Sequence[str]) -> None:
        self._roots = roots

    def staged_at(self, volume_id: str) -> str | None:
        """The staging path of the volume's block staging on this node, or None."""
        for directory in self._dirs():
            try:
                with open(_record(directory, volume_id), encoding="utf-8") as fh:
                    record = json.load(fh)
            except FileNotFoundError:
                continue
            except ValueError:  # unreadable as JSON: not a record this module wrote
                continue
            if isinstance(record, dict) and record.get("volume_id") == volume_id:
                return str(record["staging"])
        return None

    def count(self) -> int:
        """Volumes staged for block access on this node."""
        total = 0
        for directory in self._dirs():
            with contextlib.suppress(FileNotFoundError):
                total += sum(1 for name in os.listdir(directory) if not name.startswith("."))
        return total

    def record(self, volume_id: str, staging: str) -> None:
        """Record that the volume is staged for block access at `staging` (a checked path)."""
        root = next(r for r in self._roots if paths.under_roots(staging, (r,)))
        directory = os.path.join(root, RECORD_DIR)
        paths.make_dirs(directory, self._roots, 0o700)
        final = _record(directory, volume_id)
        temporary = os.path.join(directory, "." + os.path.basename(final))
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, json.dumps({"volume_id": volume_id, "staging": staging}).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, final)

    def forget(self, volume_id: str) -> None:
        """Remove the volume's record, wherever it is."""
        for directory in self._dirs():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_record(directory, volume_id))

    def _dirs(self) -> list[str]:
        """The record directory of each root, each once (a root and its resolved form are one)."""
        return list(dict.fromkeys(os.path.realpath(os.path.join(r, RECORD_DIR)) for r in self._roots))


def _record(directory: str, volume_id: str) -> str:
    """A volume id may hold any character and be longer than a file name: its digest names the file."""
    return os.path.join(directory, hashlib.sha256(volume_id.encode()).hexdigest())
