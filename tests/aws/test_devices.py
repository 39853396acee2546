"""Node-side device resolution on a fake /dev + /sys tree, and controller-side device-name allocation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from csi.backends.aws.devices import CANDIDATES, DeviceFinder, DeviceNames
from csi.failures import FailedPreconditionError, LimitExceededError, NotFoundError

VOL = "vol-0123456789abcdef0"
OTHER = "vol-0fedcba9876543210"


class FakeTree:
    """A fake root with /dev block nodes, /dev/disk/by-id links and sysfs serials."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "dev/disk/by-id").mkdir(parents=True)

    def nvme(self, name: str, volume_id: str | None, link: bool = True, serial: str | None = None) -> None:
        (self.root / "dev" / name).write_text("")
        sysfs = self.root / "sys/class/block" / name / "device"
        sysfs.mkdir(parents=True)
        if volume_id is not None:
            (sysfs / "serial").write_text((serial or volume_id.replace("-", "", 1)) + "   \n")
        if link and volume_id is not None:
            (
                self.root / f"dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{volume_id.replace('-', '', 1)}"
            ).symlink_to(f"../../{name}")

    def alias(self, path: str, target: str) -> None:
        """A udev alias such as /dev/xvdba -> nvme1n1."""
        (self.root / path.lstrip("/")).symlink_to(target)

    def xen(self, name: str) -> None:
        (self.root / "dev" / name).write_text("")


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
    return FakeTree(tmp_path)


def finder(tree: FakeTree, udev: dict[str, str] | None = None) -> DeviceFinder:
    table = udev or {}
    return DeviceFinder(root=str(tree.root), timeout=0, udev_lookup=table.get)


def test_nvme_by_id_link_with_matching_serial(tree: FakeTree) -> None:
    tree.nvme("nvme1n1", VOL)
    assert finder(tree).find(VOL, {"devicePath": "/dev/xvdba"}) == "/dev/nvme1n1"


def test_device_path_alias_is_followed_and_verified(tree: FakeTree) -> None:
    tree.nvme("nvme2n1", VOL, link=False)
    tree.alias("/dev/xvdba", "nvme2n1")
    assert finder(tree).find(VOL, {"devicePath": "/dev/xvdba"}) == "/dev/nvme2n1"


def test_udev_lookup_covers_a_missing_by_id_link(tree: FakeTree) -> None:
    tree.nvme("nvme3n1", VOL, link=False)
    assert finder(tree, {"vol0123456789abcdef0": "/dev/nvme3n1"}).find(VOL, {}) == "/dev/nvme3n1"


def test_device_path_of_another_volume_is_refused(tree: FakeTree) -> None:
    tree.nvme("nvme1n1", OTHER, link=False)
    tree.alias("/dev/xvdba", "nvme1n1")
    with pytest.raises(FailedPreconditionError, match=OTHER.replace("-", "", 1)):
        finder(tree).find(VOL, {"devicePath": "/dev/xvdba"})


def test_stale_by_id_link_to_another_volume_is_refused(tree: FakeTree) -> None:
    tree.nvme("nvme1n1", VOL, serial="vol0fedcba9876543210")
    with pytest.raises(FailedPreconditionError, match="refusing"):
        finder(tree).find(VOL, {})


def test_nvme_without_readable_serial_is_not_trusted(tree: FakeTree) -> None:
    tree.nvme("nvme4n1", None)
    tree.alias("/dev/xvdbb", "nvme4n1")
    with pytest.raises(FailedPreconditionError, match="cannot prove"):
        finder(tree).find(VOL, {"devicePath": "/dev/xvdbb"})


def test_xen_device_named_by_the_attachment_is_used(tree: FakeTree) -> None:
    tree.xen("xvdba")
    assert finder(tree).find(VOL, {"devicePath": "/dev/xvdba"}) == "/dev/xvdba"


def test_missing_device_is_not_found(tree: FakeTree) -> None:
    with pytest.raises(NotFoundError, match="nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"):
        finder(tree).find(VOL, {"devicePath": "/dev/xvdba"})


def test_waits_for_a_device_that_appears_late(tree: FakeTree) -> None:
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            tree.nvme("nvme5n1", VOL)

    found = DeviceFinder(
        root=str(tree.root), timeout=60, interval=0.01, udev_lookup=lambda s: None, sleep=sleep
    )
    assert found.find(VOL, {}) == "/dev/nvme5n1"
    assert len(naps) == 2


def never_sleep(seconds: float) -> None:
    raise AssertionError("find(wait=False) slept")


@pytest.mark.parametrize(
    ("present", "found"),
    [
        pytest.param(True, "/dev/nvme1n1", id="present-is-found"),
        pytest.param(False, None, id="missing-is-not-found-at-once"),
    ],
)
def test_a_lookup_that_must_not_wait_looks_once(tree: FakeTree, present: bool, found: str | None) -> None:
    """find(wait=False) (prepared_device: NodeUnstage, NodeGetVolumeStats, health) answers from what is
    there now, never holding the call for the attach timeout."""
    if present:
        tree.nvme("nvme1n1", VOL)
    lookup = DeviceFinder(root=str(tree.root), timeout=60, udev_lookup=lambda s: None, sleep=never_sleep)
    if found is None:
        with pytest.raises(NotFoundError):
            lookup.find(VOL, {}, wait=False)
    else:
        assert lookup.find(VOL, {}, wait=False) == found


def test_device_names_skip_used_and_reserved() -> None:
    names = DeviceNames()
    first = names.reserve("i-1", ["/dev/sda1", "/dev/xvda"])
    second = names.reserve("i-1", ["/dev/sda1"])
    assert (first, second) == ("/dev/xvdba", "/dev/xvdbb")
    assert names.reserve("i-1", ["/dev/sdbc"]) == "/dev/xvdbd"  # sdbc and xvdbc are the same slot
    assert names.reserve("i-2", []) == "/dev/xvdba"  # per instance
    names.release("i-1", first)
    assert names.reserve("i-1", []) == "/dev/xvdba"


def test_device_names_are_unique_under_concurrency() -> None:
    names = DeviceNames()
    got: list[str] = []
    lock = threading.Lock()

    def take() -> None:
        name = names.reserve("i-1", [])
        with lock:
            got.append(name)

    threads = [threading.Thread(target=take) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 50


def test_device_names_run_out() -> None:
    names = DeviceNames()
    with pytest.raises(LimitExceededError):
        names.reserve("i-1", list(CANDIDATES))
