"""csi/mount.py on a real loop device, through libc and through the documented program fallback."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi import loop
from csi.devices import fs_size
from csi.mount import Mounter
from tests.conftest import require_root, require_tool

MiB = 1024**2


@pytest.fixture
def device(tmp_path: Path) -> Iterator[str]:
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck", "mount", "umount"):
        require_tool(tool)
    image = tmp_path / "disk.img"
    with open(image, "wb") as fh:
        fh.truncate(64 * MiB)
    dev = loop.attach(str(image))
    yield dev
    mounter = Mounter()
    for m in reversed(mounter.mounts()):
        if m.mount_point.startswith(str(tmp_path) + "/"):
            mounter.unmount(m.mount_point)
    loop.detach_file(str(image))


@pytest.mark.parametrize("syscalls", [pytest.param(True, id="libc"), pytest.param(False, id="programs")])
def test_format_mount_bind_readonly_unmount(device: str, tmp_path: Path, syscalls: bool) -> None:
    m = Mounter(syscalls=syscalls)
    assert m.probe(device).blank
    m.mkfs(device, "ext4", {})
    assert m.probe(device).fs_type == "ext4"
    assert fs_size(device, "ext4") == 64 * MiB
    m.fsck(device, "ext4")
    staging, target = tmp_path / "staging", tmp_path / "target"
    staging.mkdir()
    target.mkdir()
    m.mount(device, str(staging), "ext4", ["noatime"])
    info = m.mount_at(str(staging))
    assert info is not None and info.source == device and "noatime" in info.options
    m.bind(str(staging), str(target), ["ro", "nodev"])
    bound = m.mount_at(str(target))
    assert bound is not None and bound.readonly and "nodev" in bound.options
    with pytest.raises(OSError) as err:
        (target / "x").write_text("no")
    assert err.value.errno == errno.EROFS
    (staging / "y").write_text("yes")
    assert (target / "y").read_text() == "yes"
    assert m.unmount(str(target)) is True
    assert m.unmount(str(target)) is False, "not mounted is success"
    assert m.unmount(str(staging)) is True
    assert m.mount_at(str(staging)) is None
    assert os.listdir(target) == []
