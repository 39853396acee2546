"""Device names on both sides of an EBS attachment.

Controller: `DeviceNames` hands out `/dev/xvdba`, `/dev/xvdbb`, ... per instance, skipping names the
instance already uses and names reserved by attachments still in flight in this process.

Node: `DeviceFinder` turns (volume id, publish context) into the block device of that volume and proves
it. Nitro instances expose EBS volumes as NVMe namespaces whose serial is the volume id without its dash
(`vol0123...`); udev links them as /dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123.... The
serial read from sysfs must name the requested volume, otherwise nothing is returned. Xen instances have
no serial: there the device named in the publish context (`/dev/xvdba`) is used when it exists and is
not an NVMe device. All paths live under an injectable root so tests use a fake tree.
"""

from __future__ import annotations

import os
import string
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from csi import keys
from csi.failures import FailedPreconditionError, LimitExceededError, NotFoundError

BY_ID_PREFIX = "nvme-Amazon_Elastic_Block_Store_"
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"  # the NVMe model of an instance store volume
DEVICE_PREFIX = "/dev/xvd"
# /dev/xvdba .. /dev/xvdzz: two-letter names, clear of the root device's /dev/xvda and /dev/sda1.
CANDIDATES = tuple(
    f"{DEVICE_PREFIX}{a}{b}" for a in string.ascii_lowercase[1:] for b in string.ascii_lowercase
)


def serial_of(volume_id: str) -> str:
    """NVMe serial EBS reports for a volume: `vol-0abc` -> `vol0abc`."""
    return volume_id.replace("-", "", 1)


def _short(name: str) -> str:
    """`/dev/sdf` and `/dev/xvdf` name the same slot; compare by the letters after the prefix."""
    base = name.rsplit("/", 1)[-1]
    for prefix in ("xvd", "sd"):
        if base.startswith(prefix):
            return base[len(prefix) :].rstrip(string.digits)
    return base


class DeviceNames:
    """Per-instance device-name allocation; thread safe. A name stays reserved until released."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reserved: dict[str, set[str]] = {}

    def reserve(self, instance_id: str, in_use: Iterable[str]) -> str:
        """A free name for a new attachment. None left -> LimitExceededError."""
        used = {_short(n) for n in in_use}
        with self._lock:
            mine = self._reserved.setdefault(instance_id, set())
            for name in CANDIDATES:
                if _short(name) not in used and name not in mine:
                    mine.add(name)
                    return name
        raise LimitExceededError(f"node {instance_id} has no free EBS device name left")

    def release(self, instance_id: str, name: str) -> None:
        """Forget a reservation. Idempotent."""
        with self._lock:
            self._reserved.get(instance_id, set()).discard(name)


class DeviceFinder:
    """Finds and verifies the local block device of an EBS volume under `root` (default `/`).

    `udev_lookup(serial)` may return a device path for a serial when the by-id link is missing (stale or
    slow udev); by default pyudev is asked when `root` is `/`.
    """

    def __init__(
        self,
        root: str = "/",
        timeout: float = 10.0,
        interval: float = 0.2,
        udev_lookup: Callable[[str], str | None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = Path(root)
        self.timeout = timeout
        self.interval = interval
        self._udev = udev_lookup if udev_lookup is not None else (_pyudev_lookup if root == "/" else None)
        self._sleep = sleep

    def _host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _visible(self, host: Path) -> str:
        """Device path as the node sees it (without the fake root)."""
        return "/" + str(host.relative_to(self.root)) if self.root != Path("/") else str(host)

    def instance_stores(self) -> int:
        """NVMe instance store volumes of this instance (sysfs model of each NVMe controller): on types
        with a shared attachment limit each takes a slot an EBS volume cannot have."""
        found = 0
        for model in self._host("/sys/class/nvme").glob("*/model"):
            try:
                found += model.read_text().strip() == INSTANCE_STORE_MODEL
            except OSError:
                continue
        return found

    def serial(self, device: Path) -> str | None:
        """Serial of a block device from sysfs, None when the device has none (not NVMe)."""
        sysfs = self._host(f"/sys/class/block/{device.name}/device/serial")
        try:
            return sysfs.read_text().strip()
        except OSError:
            return None

    def _candidates(self, volume_id: str, publish_context: Mapping[str, str]) -> list[Path]:
        serial = serial_of(volume_id)
        found: list[Path] = []
        link = self._host(f"/dev/disk/by-id/{BY_ID_PREFIX}{serial}")
        if link.exists():
            found.append(link.resolve())
        if self._udev is not None:
            path = self._udev(serial)
            if path:
                found.append(self._host(path).resolve())
        named = publish_context.get(keys.PC_DEVICE_PATH, "")
        if named:
            host = self._host(named)
            if host.exists():
                found.append(host.resolve())
        return found

    def _verified(self, volume_id: str, device: Path) -> bool:
        serial = self.serial(device)
        if serial is None:
            return not device.name.startswith("nvme")
        if serial != serial_of(volume_id):
            raise FailedPreconditionError(
                f"device {self._visible(device)} belongs to EBS volume {serial!r}, not {volume_id}; "
                "refusing to use it"
            )
        return True

    def find(self, volume_id: str, publish_context: Mapping[str, str], *, wait: bool = True) -> str:
        """The verified device of `volume_id`, waiting up to `timeout` for it to appear (`wait` False:
        only what is there now).

        Not present in time -> NotFoundError. Present but another volume's (serial mismatch), or an NVMe
        device without readable serial -> FailedPreconditionError."""
        deadline = time.monotonic() + (self.timeout if wait else 0)
        while True:
            candidates = self._candidates(volume_id, publish_context)
            for device in candidates:
                if self._verified(volume_id, device):
                    return self._visible(device)
            if time.monotonic() >= deadline:
                break
            self._sleep(self.interval)
        if candidates:
            seen = ", ".join(self._visible(d) for d in candidates)
            raise FailedPreconditionError(f"cannot prove that {seen} is EBS volume {volume_id}")
        named = publish_context.get(keys.PC_DEVICE_PATH) or "no devicePath"
        raise NotFoundError(
            f"no block device for EBS volume {volume_id} on this node (looked for /dev/disk/by-id/"
            f"{BY_ID_PREFIX}{serial_of(volume_id)} and {named})"
        )


def _pyudev_lookup(serial: str) -> str | None:
    """Block device whose udev ID_SERIAL_SHORT (or ID_SERIAL) is `serial`, via pyudev."""
    try:
        import pyudev
    except ImportError:
        return None
    try:
        context = pyudev.Context()
        for device in context.list_devices(subsystem="block", DEVTYPE="disk"):
            if serial in (device.get("ID_SERIAL_SHORT"), device.get("ID_SERIAL")):
                node = device.device_node
                return str(node) if node and os.path.exists(node) else None
    except (OSError, pyudev.DeviceNotFoundError):
        return None
    return None
