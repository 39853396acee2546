"""Where the local backend keeps things, and the id formats it issues: the one place that spells them.

    <data-dir>/state.db                     SQLite state (state.py), with its -wal and -shm files
    <data-dir>/state.reserve                1 MiB kept allocated for deletes on a full disk (reserve.py)
    <data-dir>/owner.lock                   the owner lock (startup.lock_data_dir)
    <data-dir>/freeze.sock                  the node plugin's freeze service (freeze_service.py)
    <data-dir>/volumes/lv-<32 hex>.img      one sparse file per volume (vol-<32 hex> standing in for EBS)
    <data-dir>/snapshots/ls-<32 hex>.img    one file per snapshot
    <data-dir>/orphans/volumes/, snapshots/ files start-up found without a record but holding data
                                            (startup.reconcile; docs/recovery.md)
    <data-dir>/state.db.building, .new      recover-state's new database while it is built, then once
                                            complete, until it replaces state.db (recovery.py)
    <data-dir>/state.db.broken-<time>[-<n>] an old database recover-state replaced, kept

Group snapshots are `lg-<32 hex>`; paging tokens `lvt-<seq>` (volumes) and `lst-<seq>` (snapshots).
A string that does not match an id format is never turned into a path: it names nothing we issued.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from csi.backends.local import ownership
from csi.failures import InvalidTokenError, NotFoundError

VOLUME_ID = re.compile(r"(?:lv|vol)-[0-9a-f]{32}")  # vol-: EBS spelling, see `volume_prefix`
SNAPSHOT_ID = re.compile(r"ls-[0-9a-f]{32}")
GROUP_ID = re.compile(r"lg-[0-9a-f]{32}")
VOLUME_TOKEN = re.compile(r"lvt-([0-9]{1,18})")
SNAPSHOT_TOKEN = re.compile(r"lst-([0-9]{1,18})")
SNAPSHOT_PREFIX, GROUP_PREFIX = "ls-", "lg-"
VOLUME_TOKEN_PREFIX, SNAPSHOT_TOKEN_PREFIX = "lvt-", "lst-"
EBS_DRIVER_NAME = "ebs.csi.aws.com"

STATE_DB = "state.db"
RESERVE_FILE = "state.reserve"
ORPHANS = "orphans"
LOCK_FILE = "owner.lock"
FREEZE_SOCKET = "freeze.sock"
IMAGE_SUFFIX = ".img"


def new_id(prefix: str) -> str:
    """A fresh id: `prefix` and 32 random hex digits, the form the *_ID patterns check."""
    return prefix + os.urandom(16).hex()


def volume_prefix(driver_name: str) -> str:
    """Standing in for EBS, volume ids look like EBS ids, so migrated `aws://<zone>/vol-...` handles
    translate to volumes of this backend."""
    return "vol-" if driver_name == EBS_DRIVER_NAME else "lv-"


class Layout:
    """The paths of one data dir."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.volumes_dir = os.path.join(data_dir, "volumes")
        self.snapshots_dir = os.path.join(data_dir, "snapshots")
        self.state_db = os.path.join(data_dir, STATE_DB)
        self.reserve_file = os.path.join(data_dir, RESERVE_FILE)
        self.lock_file = os.path.join(data_dir, LOCK_FILE)
        self.freeze_socket = os.path.join(data_dir, FREEZE_SOCKET)
        self.orphans_dir = os.path.join(data_dir, ORPHANS)
        self.building_db = self.state_db + ".building"
        self.rebuilt_db = self.state_db + ".new"

    def create(self) -> None:
        """Make the data dir and its subdirectories (owner only). Idempotent. A subdirectory a root
        process makes is the data dir's owner's (ownership.py)."""
        os.makedirs(self.data_dir, mode=0o700, exist_ok=True)
        for d in (self.volumes_dir, self.snapshots_dir):
            ownership.make_dir(d, 0o700, self.data_dir)

    def volume_file(self, volume_id: str) -> str:
        """Backing file of a volume id; a malformed id -> NotFoundError (never a path outside the dir)."""
        if not VOLUME_ID.fullmatch(volume_id):
            raise NotFoundError(f"volume {volume_id!r} not found (not an id issued by this driver)")
        return os.path.join(self.volumes_dir, volume_id + IMAGE_SUFFIX)

    def snapshot_file(self, snapshot_id: str) -> str:
        """Backing file of a snapshot id; a malformed id -> NotFoundError."""
        if not SNAPSHOT_ID.fullmatch(snapshot_id):
            raise NotFoundError(f"snapshot {snapshot_id!r} not found (not an id issued by this driver)")
        return os.path.join(self.snapshots_dir, snapshot_id + IMAGE_SUFFIX)

    @staticmethod
    def images(directory: str) -> list[str]:
        """Names of the image files in `directory`, sorted; a missing directory has none."""
        try:
            return sorted(e for e in os.listdir(directory) if e.endswith(IMAGE_SUFFIX))
        except FileNotFoundError:
            return []

    @staticmethod
    def id_of(image: str) -> str:
        """The id an image file name stands for (its name without the suffix)."""
        return image.removesuffix(IMAGE_SUFFIX)


def page_start(token: str, pattern: re.Pattern[str], issued: Callable[[], int]) -> int:
    """The `seq` a paging token continues after (0 for no token); a token we did not issue (not of
    `pattern`, or past `issued()`, the highest seq the table ever gave) -> InvalidTokenError (ABORTED,
    as the spec has it: "Indicates that `starting_token` is not valid")."""
    if not token:
        return 0
    m = pattern.fullmatch(token)
    if m is None or int(m.group(1)) > issued():
        raise InvalidTokenError(f"starting_token {token!r} was not issued by this driver")
    return int(m.group(1))
