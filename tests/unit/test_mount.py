"""csi/mount.py against the shared FakeRunner: argv built, allow-lists enforced, mount table parsed."""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from csi import keys, mountapi
from csi.devices import fs_size
from csi.failures import InvalidParameterError
from csi.filesystems import (
    MS_BIND,
    MS_NOEXEC,
    MS_RDONLY,
    PAGE_SIZE,
    check_fs_type,
    check_mount_flags,
    check_mount_flags_any,
    mkfs_argv,
    mount_failure,
    split_flags,
)
from csi.mount import Mounter, MountError, parse_mountinfo
from tests.fake_runner import FakeRunner

MOUNTINFO = (
    "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard\n"
    "90 22 7:0 / /var/lib/kubelet/plugins/x/globalmount rw,relatime shared:50 - ext4 /dev/loop0 rw\n"
    "91 22 7:0 / /var/lib/kubelet/pods/p/volumes/a\\040b/mount ro,noexec - ext4 /dev/loop0 rw\n"
    "92 22 0:5 /loop3 /var/lib/kubelet/pods/p/volumeDevices/dev rw - devtmpfs udev rw\n"
    "garbage line\n"
)


def fake_mounter(tmp_path: Path, runner: FakeRunner, text: str = MOUNTINFO) -> Mounter:
    info = tmp_path / "mountinfo"
    info.write_text(text)
    return Mounter(runner, syscalls=False, mountinfo_path=str(info))


# ---------------------------------------------------------------- allow-lists


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param("", "ext4", id="default-ext4"),
        pytest.param("ext4", "ext4", id="ext4"),
        pytest.param("ext3", "ext3", id="ext3"),
        pytest.param("ext2", "ext2", id="ext2"),
        pytest.param("xfs", "xfs", id="xfs"),
        pytest.param("EXT4", "ext4", id="any-case"),
    ],
)
def test_fs_types_allowed(given: str, expected: str) -> None:
    assert check_fs_type(given) == expected


@pytest.mark.parametrize(
    "fs_type",
    [
        pytest.param("btrfs", id="btrfs"),
        pytest.param("vfat", id="vfat"),
        pytest.param("ext4 -O x", id="argv-injection"),
        pytest.param("nfs", id="network-fs"),
    ],
)
def test_fs_types_rejected(fs_type: str) -> None:
    with pytest.raises(InvalidParameterError, match="not supported"):
        check_fs_type(fs_type)


@pytest.mark.parametrize(
    ("flags", "fs_type", "expected"),
    [
        pytest.param(["ro", "noatime"], "ext4", ["ro", "noatime"], id="vfs-flags"),
        pytest.param(["nodev,nosuid"], "ext4", ["nodev", "nosuid"], id="comma-joined"),
        pytest.param(
            ["data=writeback", "commit=30"], "ext4", ["data=writeback", "commit=30"], id="ext4-data"
        ),
        pytest.param(["inode64", "logbufs=8"], "xfs", ["inode64", "logbufs=8"], id="xfs-specific"),
        pytest.param(["discard"], "xfs", ["discard"], id="discard-xfs"),
        pytest.param(["logbsize=16k", "logbsize=262144"], "xfs", None, id="xfs-logbsize-edges"),
        pytest.param(["logbsize=0", "logbsize=64K"], "xfs", None, id="xfs-logbsize-default-and-upper-k"),
        pytest.param(
            ["allocsize=1g", "allocsize=64m", f"allocsize={PAGE_SIZE}"], "xfs", None, id="xfs-allocsize"
        ),
        pytest.param(["commit=2147483"], "ext4", None, id="ext4-longest-commit-any-hz-takes"),
        pytest.param(["data=journal", "nodelalloc"], "ext4", None, id="ext4-data-journal-nodelalloc"),
        pytest.param(["delalloc", "data=journal", "data=ordered"], "ext4", None, id="ext4-last-data-counts"),
        pytest.param(["data=journal", "commit=5"], "ext3", None, id="ext3-journal-options"),
        pytest.param(["errors=remount-ro", "acl", "discard"], "ext2", None, id="ext2-options"),
        pytest.param(["noexec"], None, ["noexec"], id="vfs-on-block"),
        pytest.param([], "ext4", [], id="none"),
    ],
)
def test_mount_flags_allowed(flags: list[str], fs_type: str | None, expected: list[str] | None) -> None:
    assert check_mount_flags(flags, fs_type) == (flags if expected is None else expected)


@pytest.mark.parametrize(
    ("flags", "fs_type", "message"),
    [
        pytest.param(["delalloc"], "ext3", "'delalloc' is not allowed for ext3", id="ext3-delalloc"),
        pytest.param(["nodelalloc"], "ext3", "'nodelalloc' is not allowed for ext3", id="ext3-nodelalloc"),
        pytest.param(
            ["journal_checksum"], "ext3", "'journal_checksum' is not allowed", id="ext3-journal-checksum"
        ),
        pytest.param(["dioread_nolock"], "ext3", "'dioread_nolock' is not allowed", id="ext3-dioread-nolock"),
        pytest.param(
            ["logbsize=1024"], "xfs", "logbsize= 0 or a power of two from 16k to 256k", id="logbsize-1024"
        ),
        pytest.param(["logbsize=7k"], "xfs", "'logbsize=7k' is not allowed for xfs", id="logbsize-7k"),
        pytest.param(["logbsize=512k"], "xfs", "'logbsize=512k'", id="logbsize-over-256k"),
        pytest.param(["logbsize=16kk"], "xfs", "'logbsize=16kk'", id="logbsize-two-suffixes"),
        pytest.param(["allocsize=3k"], "xfs", "allocsize= a power of two from", id="allocsize-3k"),
        pytest.param(["allocsize=12k"], "xfs", "'allocsize=12k'", id="allocsize-not-a-power-of-two"),
        pytest.param(["allocsize=0"], "xfs", "'allocsize=0'", id="allocsize-0"),
        pytest.param(["allocsize=2g"], "xfs", "'allocsize=2g'", id="allocsize-over-1g"),
        pytest.param(
            ["commit=999999999"], "ext4", "commit= a whole number from 0 to 2147483", id="commit-too-long"
        ),
        pytest.param(
            ["data=journal", "delalloc"], "ext4", "'data=journal' and 'delalloc'", id="journal-delalloc"
        ),
        pytest.param(
            ["delalloc,nodelalloc,data=journal"], "ext4", "'delalloc'", id="delalloc-undone-still-refused"
        ),
        pytest.param(
            ["data=ordered"], "ext2", "'data=ordered' is not allowed for ext2", id="ext2-no-journal"
        ),
        pytest.param(["commit=5"], "ext2", "'commit=5' is not allowed for ext2", id="ext2-no-commit"),
        pytest.param(["delalloc"], "ext2", "'delalloc' is not allowed for ext2", id="ext2-ext4-only"),
    ],
)
def test_mount_flags_the_kernel_refuses_are_refused_first(
    flags: list[str], fs_type: str, message: str
) -> None:
    """The kernel refuses these with EINVAL (checked on the real kernel by
    tests/integration/test_mount_flags_kernel.py): refused here, before the device is formatted."""
    with pytest.raises(InvalidParameterError, match=re.escape(message)):
        check_mount_flags(flags, fs_type)


@pytest.mark.parametrize(
    ("errno_", "said"),
    [
        pytest.param(errno.EINVAL, "Invalid argument; the kernel refused the filesystem or one", id="einval"),
        pytest.param(errno.EBUSY, "failed: Device or resource busy", id="other"),
    ],
)
def test_a_failed_mount_names_its_flags(errno_: int, said: str) -> None:
    message = mount_failure(
        "/dev/loop3", "/s", "xfs", ["noatime", "logbufs=8"], OSError(errno_, os.strerror(errno_))
    )
    assert message.startswith("mounting /dev/loop3 (xfs) at /s with flags noatime,logbufs=8 failed: ")
    assert said in message


@pytest.mark.parametrize(
    ("flags", "fs_type"),
    [
        pytest.param(["exec;rm -rf /"], "ext4", id="shell-injection"),
        pytest.param(["$(reboot)"], "ext4", id="command-substitution"),
        pytest.param(["bogus"], "ext4", id="unknown"),
        pytest.param(["inode64"], "ext4", id="xfs-option-on-ext4"),
        pytest.param(["data=ordered"], "xfs", id="ext4-option-on-xfs"),
        pytest.param(["data=evil"], "ext4", id="bad-value"),
        pytest.param(["commit=1;x"], "ext4", id="value-injection"),
        pytest.param(["errors=panic"], "ext4", id="errors-panic"),
        pytest.param(["discard"], None, id="fs-option-on-block"),
        pytest.param(["suid"], "ext4", id="suid"),
        pytest.param(["remount"], "ext4", id="remount"),
        pytest.param(["bind"], "ext4", id="bind"),
    ],
)
def test_mount_flags_rejected(flags: list[str], fs_type: str | None) -> None:
    with pytest.raises(InvalidParameterError, match="not allowed"):
        check_mount_flags(flags, fs_type)


@pytest.mark.parametrize(
    ("flags", "accepted"),
    [
        pytest.param(["noatime"], True, id="vfs-flag"),
        pytest.param(["data=ordered"], True, id="ext4-only"),
        pytest.param(["logbufs=4", "nouuid"], True, id="xfs-only"),
        pytest.param(["data=ordered", "logbufs=4"], False, id="no-filesystem-takes-both"),
        pytest.param(["bogus"], False, id="none-takes-it"),
    ],
)
def test_flags_for_a_mount_naming_no_fs_type(flags: list[str], accepted: bool) -> None:
    """The device may hold any filesystem: flags pass when one filesystem takes them all."""
    if accepted:
        assert check_mount_flags_any(flags) == flags
        return
    with pytest.raises(InvalidParameterError, match="for ext4"):
        check_mount_flags_any(flags)


@pytest.mark.parametrize(
    ("flags", "fs_type"),
    [
        pytest.param(["ro", "rw"], "ext4", id="ro-then-rw"),
        pytest.param(["rw", "ro"], "xfs", id="rw-then-ro"),
        pytest.param(["ro,noatime,rw"], "ext4", id="in-one-string"),
        pytest.param(["sync", "async"], None, id="sync-async-block"),
    ],
)
def test_contradicting_mount_flags_rejected(flags: list[str], fs_type: str | None) -> None:
    """The kernel keeps the last of ro/rw, while the node reads "ro" anywhere as read-only: a staged
    volume the driver takes for read-only would be writable, and an identical retry answer
    ALREADY_EXISTS. Such a pair is refused."""
    with pytest.raises(InvalidParameterError, match="contradict"):
        check_mount_flags(flags, fs_type)


def test_repeated_mount_flag_is_not_a_contradiction() -> None:
    assert check_mount_flags(["ro", "ro", "noexec"], "ext4") == ["ro", "ro", "noexec"]


def test_split_flags_turns_vfs_flags_into_bits() -> None:
    set_bits, clear_bits, data = split_flags(["ro", "noexec", "data=ordered"])
    assert set_bits == MS_RDONLY | MS_NOEXEC
    assert clear_bits == 0
    assert data == ["data=ordered"]


# ---------------------------------------------------------------- mkfs options


def test_mke2fs_version_is_asked_again_after_a_failed_answer(tmp_path: Path) -> None:
    """A failed `mkfs.ext4 -V` is not remembered as an unknown version (which would cost every later
    format of a zeroed volume its assume_storage_prezeroed)."""
    runner = FakeRunner().on("mkfs.ext4", "-V", returncode=1, stderr="mkfs.ext4: Resource busy", times=1)
    runner.on("mkfs.ext4", "-V", stderr="mke2fs 1.47.0 (5-Feb-2023)\n")
    m = fake_mounter(tmp_path, runner)
    assert m.mke2fs_version("ext4") == (0,)
    assert m.mke2fs_version("ext4") == (1, 47, 0)
    assert m.mke2fs_version("ext4") == (1, 47, 0)
    assert runner.calls.count(("mkfs.ext4", "-V")) == 2


@pytest.mark.parametrize(
    ("fs_type", "options", "expected"),
    [
        pytest.param("ext4", {}, ["mkfs.ext4", "-q", "/dev/x"], id="ext4-plain"),
        pytest.param("xfs", {}, ["mkfs.xfs", "-q", "/dev/x"], id="xfs-plain"),
        pytest.param(
            "ext4",
            {keys.BLOCK_SIZE: "4096", keys.INODE_SIZE: "256", keys.BYTES_PER_INODE: "16384"},
            ["mkfs.ext4", "-q", "-b", "4096", "-I", "256", "-i", "16384", "/dev/x"],
            id="ext4-sizes",
        ),
        pytest.param(
            "ext4",
            {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "65536"},
            ["mkfs.ext4", "-q", "-O", "bigalloc", "-C", "65536", "/dev/x"],
            id="ext4-bigalloc",
        ),
        pytest.param(
            "xfs",
            {keys.BLOCK_SIZE: "4096", keys.INODE_SIZE: "512"},
            ["mkfs.xfs", "-q", "-b", "size=4096", "-i", "size=512", "/dev/x"],
            id="xfs-sizes",
        ),
        pytest.param(
            "ext3", {keys.NUMBER_OF_INODES: "1000"}, ["mkfs.ext3", "-q", "-N", "1000", "/dev/x"], id="ext3"
        ),
        pytest.param(
            "ext2", {keys.BLOCK_SIZE: "1024"}, ["mkfs.ext2", "-q", "-b", "1024", "/dev/x"], id="ext2"
        ),
        pytest.param("ext4", {"other": "x"}, ["mkfs.ext4", "-q", "/dev/x"], id="non-format-keys-ignored"),
    ],
)
def test_mkfs_argv(fs_type: str, options: dict[str, str], expected: list[str]) -> None:
    assert mkfs_argv("/dev/x", fs_type, options) == expected


@pytest.mark.parametrize(
    ("fs_type", "options"),
    [
        pytest.param("ext4", {keys.BLOCK_SIZE: "3000"}, id="not-power-of-two"),
        pytest.param("ext4", {keys.BLOCK_SIZE: "4096 -O x"}, id="injection"),
        pytest.param("ext4", {keys.BLOCK_SIZE: "²"}, id="unicode-digit"),
        pytest.param("ext4", {keys.INODE_SIZE: "64"}, id="inode-too-small"),
        pytest.param("xfs", {keys.BYTES_PER_INODE: "4096"}, id="ext-only-on-xfs"),
        pytest.param("ext3", {keys.EXT4_BIGALLOC: "true"}, id="bigalloc-on-ext3"),
        pytest.param("ext2", {keys.EXT4_BIGALLOC: "true"}, id="bigalloc-on-ext2"),
        pytest.param("ext4", {keys.EXT4_BIGALLOC: "yes"}, id="bigalloc-not-bool"),
        pytest.param("ext4", {keys.EXT4_CLUSTER_SIZE: "65536"}, id="cluster-without-bigalloc"),
        pytest.param("btrfs", {}, id="fs-not-allowed"),
        pytest.param("xfs", {keys.BLOCK_SIZE: "512"}, id="xfs-block-512-needs-no-crc"),
        pytest.param("xfs", {keys.INODE_SIZE: "256"}, id="xfs-inode-256-needs-no-crc"),
        pytest.param(
            "xfs", {keys.BLOCK_SIZE: "2048", keys.INODE_SIZE: "2048"}, id="xfs-inode-over-half-a-block"
        ),
        pytest.param("ext4", {keys.BLOCK_SIZE: str(2 * PAGE_SIZE)}, id="ext-block-over-a-page"),
        pytest.param(
            "ext3", {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "2048"}, id="ext-inode-over-the-block"
        ),
        pytest.param("ext4", {keys.INODE_SIZE: "2048"}, id="ext-inode-over-the-small-volume-block"),
        pytest.param(
            "ext4", {keys.INODE_SIZE: "1024", keys.BYTES_PER_INODE: "1024"}, id="ext-ratio-of-one-inode"
        ),
        pytest.param(
            "ext4",
            {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "1048576", keys.BYTES_PER_INODE: "65536"},
            id="ext-bigalloc-ratio-under-the-cluster",
        ),
        pytest.param("ext4", {keys.NUMBER_OF_INODES: "15"}, id="ext-fewer-than-16-inodes"),
        pytest.param("ext4", {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "1024"}, id="cluster-1024"),
        pytest.param(
            "ext4",
            {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "1024", keys.BLOCK_SIZE: "1024"},
            id="cluster-1024-even-with-1024-blocks",
        ),
        pytest.param(
            "ext4",
            {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "2048", keys.BLOCK_SIZE: "4096"},
            id="cluster-under-the-block",
        ),
    ],
)
def test_mkfs_argv_rejects(fs_type: str, options: dict[str, str]) -> None:
    with pytest.raises(InvalidParameterError):
        mkfs_argv("/dev/x", fs_type, options)


@pytest.mark.parametrize(
    ("fs_type", "options", "what", "message"),
    [
        pytest.param(
            "xfs",
            {keys.INODE_SIZE: "128"},
            {},
            "xfs volume attribute inodeSize='128': expected a power of two from 512 to 2048",
            id="node-names-a-volume-attribute",
        ),
        pytest.param(
            "ext4",
            {keys.BLOCK_SIZE: "512"},
            {"what": "parameter"},
            f"ext4 parameter blockSize='512': expected a power of two from 1024 to {PAGE_SIZE}",
            id="create-names-a-parameter",
        ),
        pytest.param(
            "xfs",
            {keys.BYTES_PER_INODE: "4096"},
            {"what": "parameter"},
            "parameter(s) bytesPerInode do not apply to xfs",
            id="not-for-xfs",
        ),
        pytest.param(
            "ext4",
            {keys.EXT4_CLUSTER_SIZE: "65536"},
            {"what": "parameter"},
            "parameter ext4ClusterSize needs ext4BigAlloc=true",
            id="cluster-without-bigalloc",
        ),
        pytest.param(
            "ext4",
            {keys.EXT4_BIGALLOC: "true", keys.EXT4_CLUSTER_SIZE: "2048"},
            {"what": "parameter"},
            "ext4 parameters ext4ClusterSize=2048 and blockSize=unset: a bigalloc cluster is at least a "
            "block; mke2fs makes 4096-byte blocks on a volume of 512 MiB or more unless told otherwise: "
            "use an ext4ClusterSize of at least 4096, or set blockSize too",
            id="cluster-under-the-block-mke2fs-picks",
        ),
    ],
)
def test_mkfs_argv_names_the_option_where_the_user_wrote_it(
    fs_type: str, options: dict[str, str], what: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidParameterError) as refused:
        mkfs_argv("/dev/x", fs_type, options, **what)
    assert str(refused.value) == message


# ---------------------------------------------------------------- mount table


def test_parse_mountinfo_fields_and_escapes() -> None:
    entries = parse_mountinfo(MOUNTINFO.split("\n"))
    assert len(entries) == 4, "the garbage line is skipped"
    pod = entries[2]
    assert pod.mount_point == "/var/lib/kubelet/pods/p/volumes/a b/mount"
    assert (pod.major, pod.minor, pod.fs_type, pod.source) == (7, 0, "ext4", "/dev/loop0")
    assert pod.readonly and "noexec" in pod.options
    assert entries[3].root == "/loop3"


def test_mount_at_returns_the_top_most_mount(tmp_path: Path) -> None:
    text = MOUNTINFO + "93 90 7:1 / /var/lib/kubelet/plugins/x/globalmount rw - xfs /dev/loop1 rw\n"
    m = fake_mounter(tmp_path, FakeRunner(), text)
    top = m.mount_at("/var/lib/kubelet/plugins/x/globalmount")
    assert top is not None and top.source == "/dev/loop1"
    assert m.mount_at("/var/lib/kubelet/nothing") is None


@pytest.mark.parametrize(
    ("path", "source"),
    [
        pytest.param("/var/lib/kubelet/pods/p/volumes/a b/mount", "/dev/loop0", id="escaped-space"),
        pytest.param("/mnt/back\\slash", "/dev/loop4", id="escaped-backslash"),
        pytest.param("/mnt/line\u2028break", "/dev/loop5", id="unicode-line-separator"),
        pytest.param("/var/lib/kubelet/named-as-root-only", None, id="path-only-as-another-mounts-root"),
        pytest.param("/var/lib/kubelet/plugins/x", None, id="a-prefix-of-a-mount-point"),
    ],
)
def test_mount_at_reads_only_lines_that_spell_the_path(tmp_path: Path, path: str, source: str | None) -> None:
    text = (
        MOUNTINFO
        + "94 22 7:2 /var/lib/kubelet/named-as-root-only /mnt/other rw - ext4 /dev/loop2 rw\n"
        + "95 22 7:4 / /mnt/back\\134slash rw - ext4 /dev/loop4 rw\n"
        + "96 22 7:5 / /mnt/line\u2028break rw - ext4 /dev/loop5 rw\n"
    )
    m = fake_mounter(tmp_path, FakeRunner(), text)
    found = m.mount_at(path)
    assert (found.source if found else None) == source
    assert m.mount_at(path, m.mounts()) == found, "the same answer as a search of the whole table"


@pytest.mark.parametrize(
    ("paths", "numbers", "ids"),
    [
        pytest.param((), (), [22, 90, 91, 92], id="whole-table"),
        pytest.param((), ((7, 0),), [90, 91], id="device-numbers"),
        pytest.param(
            ("/var/lib/kubelet/plugins/x/globalmount",), ((0, 5),), [90, 92], id="numbers-or-a-path"
        ),
        pytest.param(("/var/lib/kubelet/pods/p/volumes/a b/mount",), (), [91], id="escaped-path"),
        pytest.param((), ((7, 9),), [], id="nothing-spells-it"),
    ],
)
def test_mounts_parses_the_lines_that_spell_a_path_or_device(
    tmp_path: Path, paths: tuple[str, ...], numbers: tuple[tuple[int, int], ...], ids: list[int]
) -> None:
    m = fake_mounter(tmp_path, FakeRunner())
    assert [e.mount_id for e in m.mounts(paths, numbers)] == ids


# ---------------------------------------------------------------- commands


@pytest.mark.parametrize(
    ("returncode", "stdout", "fs_type", "pt_type"),
    [
        pytest.param(2, "", "", "", id="blank"),
        pytest.param(0, "DEVNAME=/dev/x\nTYPE=ext4\nUUID=1\n", "ext4", "", id="filesystem"),
        pytest.param(0, "DEVNAME=/dev/x\nPTUUID=a\nPTTYPE=gpt\n", "", "gpt", id="partition-table"),
        pytest.param(0, "TYPE=swap\n", "swap", "", id="swap"),
    ],
)
def test_probe(tmp_path: Path, returncode: int, stdout: str, fs_type: str, pt_type: str) -> None:
    runner = FakeRunner().on("blkid", returncode=returncode, stdout=stdout)
    probe = fake_mounter(tmp_path, runner).probe("/dev/x")
    assert (probe.fs_type, probe.pt_type) == (fs_type, pt_type)
    assert probe.blank == (not fs_type and not pt_type)
    assert runner.calls == [("blkid", "-p", "-o", "export", "/dev/x")]


@pytest.mark.parametrize(
    "returncode",
    [
        pytest.param(4, id="usage-or-other-error"),  # blkid(8): only 2 means "nothing found"
        pytest.param(8, id="ambivalent"),
    ],
)
def test_probe_failure_is_an_error_not_blank(tmp_path: Path, returncode: int) -> None:
    """Read as blank, a device blkid could not probe would be formatted next: its data lost."""
    runner = FakeRunner().on("blkid", returncode=returncode, stderr="blkid: error")
    with pytest.raises(MountError, match="refusing to format"):
        fake_mounter(tmp_path, runner).probe("/dev/x")


@pytest.mark.parametrize(
    ("returncode", "ok"),
    [
        pytest.param(0, True, id="clean"),
        pytest.param(1, True, id="corrected"),
        pytest.param(2, True, id="corrected-reboot-advised"),  # the filesystem is fixed: stage goes on
        pytest.param(3, True, id="corrected-both"),
        pytest.param(4, False, id="uncorrected"),
        pytest.param(8, False, id="operational-error"),
    ],
)
def test_fsck_exit_codes(tmp_path: Path, returncode: int, ok: bool) -> None:
    runner = FakeRunner().on("e2fsck", returncode=returncode, stderr="x")
    m = fake_mounter(tmp_path, runner)
    if ok:
        m.fsck("/dev/x", "ext4")
    else:
        with pytest.raises(MountError, match="e2fsck"):
            m.fsck("/dev/x", "ext4")
    assert runner.calls == [("e2fsck", "-p", "/dev/x")]


def test_fsck_skips_xfs(tmp_path: Path) -> None:
    runner = FakeRunner()
    fake_mounter(tmp_path, runner).fsck("/dev/x", "xfs")
    assert runner.calls == []


@pytest.mark.parametrize(
    ("fs_type", "expected"),
    [
        pytest.param("ext4", ("resize2fs", "/dev/x"), id="ext4"),
        pytest.param("xfs", ("xfs_growfs", "-d", "/mnt/m"), id="xfs"),
    ],
)
def test_grow(tmp_path: Path, fs_type: str, expected: tuple[str, ...]) -> None:
    runner = FakeRunner()
    fake_mounter(tmp_path, runner).grow("/dev/x", "/mnt/m", fs_type)
    assert runner.calls == [expected]


@pytest.mark.parametrize("fs_type", ["ext2", "ext3", "ext4"])
def test_grow_permission_error_names_the_missing_capability(tmp_path: Path, fs_type: str) -> None:
    runner = FakeRunner().on(
        "resize2fs", returncode=1, stderr="resize2fs: Permission denied to resize filesystem"
    )
    with pytest.raises(MountError, match=f"online {fs_type} growth needs CAP_SYS_RESOURCE"):
        fake_mounter(tmp_path, runner).grow("/dev/x", "/mnt/m", fs_type)


def test_mount_program_fallback_argv(tmp_path: Path) -> None:
    runner = FakeRunner()
    fake_mounter(tmp_path, runner).mount("/dev/x", "/mnt/m", "ext4", ["noatime", "data=ordered"])
    assert runner.calls == [("mount", "-t", "ext4", "-o", "noatime,data=ordered", "/dev/x", "/mnt/m")]


def test_bind_readonly_program_fallback_remounts(tmp_path: Path) -> None:
    runner = FakeRunner()
    fake_mounter(tmp_path, runner).bind("/a", "/b", ["ro", "nodev"])
    assert runner.calls == [("mount", "--bind", "/a", "/b"), ("mount", "-o", "remount,bind,ro,nodev", "/b")]


class RefusingRemount:
    """libc mount(2) that binds, then refuses the bind remount that sets the flags; records umount2."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None, str]] = []

    def mount(self, source: str | None, target: str, fs_type: str | None, flags: int, data: str) -> None:
        self.calls.append(("mount", source, target))
        if source is None:  # the MS_REMOUNT
            raise OSError(errno.EPERM, os.strerror(errno.EPERM), target)

    def umount2(self, target: str, flags: int) -> None:
        self.calls.append(("umount2", None, target))


@pytest.mark.parametrize("syscalls", [pytest.param(True, id="libc"), pytest.param(False, id="programs")])
def test_a_bind_whose_read_only_remount_fails_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, syscalls: bool
) -> None:
    """The bind first, then the remount that makes it read-only (mount programs; libc on a kernel
    before 5.12): a failed remount must not leave a WRITABLE bind of the volume at the target."""
    runner = FakeRunner().on("mount", "-o", returncode=32, stderr="mount: /b: permission denied.")
    m = fake_mounter(tmp_path, runner, MOUNTINFO + "93 22 7:0 / /b rw,relatime - ext4 /dev/loop0 rw\n")
    libc = RefusingRemount()
    if syscalls:
        m._libc = libc  # type: ignore[assignment]
        monkeypatch.setattr(mountapi, "bind", lambda *args: False)  # open_tree and co. unavailable
    with pytest.raises(MountError):
        m.bind("/a", "/b", ["ro"])
    undone = ("umount2", None, "/b") in libc.calls if syscalls else ("umount", "/b") in runner.calls
    assert undone, (libc.calls, runner.calls)


@pytest.mark.parametrize(
    ("stderr", "stdout", "said"),
    [
        pytest.param("device is busy\n", "", "device is busy", id="one-line"),
        pytest.param(
            "Filesystem must be larger than 300MB.\nUsage: mkfs.xfs\n\n<value> is xxx (512 byte blocks).\n",
            "",
            "Filesystem must be larger than 300MB.; <value> is xxx (512 byte blocks).",
            id="cause-first-then-usage",
        ),
        pytest.param(
            "mke2fs 1.47.0 (5-Feb-2023)\n\nmke2fs: Device or resource busy while setting up superblock\n",
            "",
            "mke2fs 1.47.0 (5-Feb-2023); mke2fs: Device or resource busy while setting up superblock",
            id="banner-first-then-cause",
        ),
        pytest.param("", "only on stdout\n", "only on stdout", id="stdout-when-stderr-is-empty"),
        pytest.param("", "", "exit code 1", id="silent"),
    ],
)
def test_mkfs_failure_names_the_command_and_what_it_said(
    tmp_path: Path, stderr: str, stdout: str, said: str
) -> None:
    runner = FakeRunner().on("mkfs.ext4", returncode=1, stderr=stderr, stdout=stdout)
    with pytest.raises(MountError) as raised:
        fake_mounter(tmp_path, runner).mkfs("/dev/x", "ext4", {})
    assert str(raised.value) == f"mkfs.ext4 on /dev/x failed: {said}"


MKE2FS_1_47 = "mke2fs 1.47.0 (5-Feb-2023)\n\tUsing EXT2FS Library version 1.47.0\n"


@pytest.mark.parametrize(
    ("fs_type", "said", "expected_calls"),
    [
        pytest.param(
            "ext4",
            MKE2FS_1_47,
            [
                ("mkfs.ext4", "-V"),
                ("mkfs.ext4", "-q", "-E", "nodiscard,assume_storage_prezeroed=1", "/dev/x"),
            ],
            id="mke2fs-1.47-nothing-discarded-or-zeroed",
        ),
        pytest.param(
            "ext3",
            "mke2fs 1.46.5 (30-Dec-2021)\n",
            [("mkfs.ext3", "-V"), ("mkfs.ext3", "-q", "-E", "nodiscard", "/dev/x")],
            id="older-mke2fs-nothing-discarded",
        ),
        pytest.param(
            "ext4",
            "",
            [("mkfs.ext4", "-V"), ("mkfs.ext4", "-q", "-E", "nodiscard", "/dev/x")],
            id="version-not-said-nothing-discarded",
        ),
        pytest.param("xfs", "", [("mkfs.xfs", "-q", "-K", "/dev/x")], id="xfs-nothing-discarded"),
    ],
)
def test_a_zeroed_device_is_formatted_without_discarding_or_zeroing(
    tmp_path: Path, fs_type: str, said: str, expected_calls: list[tuple[str, ...]]
) -> None:
    runner = FakeRunner().on(f"mkfs.{fs_type}", "-V", stderr=said)
    mounter = fake_mounter(tmp_path, runner)
    mounter.mkfs("/dev/x", fs_type, {}, zeroed=True)
    assert runner.calls == expected_calls
    mounter.mkfs("/dev/y", fs_type, {}, zeroed=True)  # the version is asked once per mounter
    assert runner.calls[len(expected_calls) :] == [(*expected_calls[-1][:-1], "/dev/y")]


def test_a_device_not_known_zeroed_is_formatted_with_mkfs_defaults(tmp_path: Path) -> None:
    runner = FakeRunner().on("mkfs.ext4", "-V", stderr=MKE2FS_1_47)
    fake_mounter(tmp_path, runner).mkfs("/dev/x", "ext4", {keys.BLOCK_SIZE: "4096"})
    assert runner.calls == [("mkfs.ext4", "-q", "-b", "4096", "/dev/x")]


@pytest.mark.parametrize(
    ("path", "mounted", "expected_calls"),
    [
        pytest.param("/var/lib/kubelet/plugins/x/globalmount", True, 1, id="mounted"),
        pytest.param("/var/lib/kubelet/not-mounted", False, 0, id="not-mounted-is-success"),
    ],
)
def test_unmount_program_fallback(tmp_path: Path, path: str, mounted: bool, expected_calls: int) -> None:
    runner = FakeRunner()
    assert fake_mounter(tmp_path, runner).unmount(path) is mounted
    assert len(runner.calls) == expected_calls


def test_libc_unmount_of_a_missing_path_is_success(tmp_path: Path) -> None:
    assert Mounter(FakeRunner()).unmount(str(tmp_path / "missing")) is False


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        pytest.param(["ro"], (mountapi.MOUNT_ATTR_RDONLY, 0), id="ro"),
        pytest.param(
            ["ro", "nodev", "nosuid", "noexec"],
            (
                mountapi.MOUNT_ATTR_RDONLY
                | mountapi.MOUNT_ATTR_NODEV
                | mountapi.MOUNT_ATTR_NOSUID
                | mountapi.MOUNT_ATTR_NOEXEC,
                0,
            ),
            id="several",
        ),
        pytest.param(["noatime"], (mountapi.MOUNT_ATTR_NOATIME, mountapi.MOUNT_ATTR__ATIME), id="noatime"),
        pytest.param(
            ["strictatime"], (mountapi.MOUNT_ATTR_STRICTATIME, mountapi.MOUNT_ATTR__ATIME), id="strict"
        ),
        pytest.param(["nodiratime"], (mountapi.MOUNT_ATTR_NODIRATIME, 0), id="nodiratime"),
        pytest.param(["sync", "lazytime"], (0, 0), id="superblock-flags-are-not-per-mount"),
    ],
)
def test_bind_flags_become_mount_attributes(flags: list[str], expected: tuple[int, int]) -> None:
    assert mountapi.attributes(split_flags(flags)[0]) == expected


def test_bind_flag_constant_matches_the_kernel() -> None:
    assert MS_BIND == 4096


# ---------------------------------------------------------------- superblocks


def test_fs_size_reads_ext4_superblock(tmp_path: Path) -> None:
    sb = bytearray(2048)
    struct.pack_into("<I", sb, 1024 + 0x4, 1000)  # blocks
    struct.pack_into("<I", sb, 1024 + 0x18, 2)  # 1024 << 2 = 4096-byte blocks
    struct.pack_into("<H", sb, 1024 + 0x38, 0xEF53)
    image = tmp_path / "ext4.img"
    image.write_bytes(bytes(sb))
    assert fs_size(str(image), "ext4") == 1000 * 4096


def test_fs_size_reads_xfs_superblock(tmp_path: Path) -> None:
    image = tmp_path / "xfs.img"
    image.write_bytes(b"XFSB" + struct.pack(">IQ", 4096, 512) + bytes(100))
    assert fs_size(str(image), "xfs") == 512 * 4096


def test_fs_size_of_garbage_is_none(tmp_path: Path) -> None:
    image = tmp_path / "zero.img"
    image.write_bytes(bytes(4096))
    assert fs_size(str(image), "ext4") is None
    assert fs_size(str(image), "xfs") is None


# ---- SELinux: kubelet's `context=` option (CSIDriver seLinuxMount) is passed at stage and publish

POD_LABEL = "system_u:object_r:container_file_t:s0:c123,c456"


@pytest.mark.parametrize(
    ("flags", "fs_type", "expected"),
    [
        pytest.param([f'context="{POD_LABEL}"'], "ext4", [f'context="{POD_LABEL}"'], id="quoted-categories"),
        pytest.param(
            [f'nodev,context="{POD_LABEL}",noatime'],
            "xfs",
            ["nodev", f'context="{POD_LABEL}"', "noatime"],
            id="comma-joined-keeps-quoted-commas",
        ),
        pytest.param(
            ["context=system_u:object_r:container_file_t:s0"],
            "ext4",
            ["context=system_u:object_r:container_file_t:s0"],
            id="unquoted-no-categories",
        ),
        pytest.param(
            ["context=system_u:system_r:spc_t:s0-s0:c0.c1023"],
            "ext4",
            ["context=system_u:system_r:spc_t:s0-s0:c0.c1023"],
            id="level-range",
        ),
    ],
)
def test_selinux_context_is_allowed_on_filesystems(
    flags: list[str], fs_type: str, expected: list[str]
) -> None:
    assert check_mount_flags(flags, fs_type) == expected


@pytest.mark.parametrize(
    ("flags", "fs_type", "message"),
    [
        pytest.param([f'context="{POD_LABEL}"'], None, "not allowed", id="on-raw-block"),
        pytest.param(["context=system_u:object_r:x_t"], "ext4", "not an SELinux context", id="no-level"),
        pytest.param(['context="a:b:c:s0;reboot"'], "ext4", "not an SELinux context", id="injection"),
        pytest.param(["context=System_u:object_r:x_t:s0"], "ext4", "not an SELinux context", id="upper-case"),
        pytest.param(['context="system_u:object_r:x_t:s0'], "ext4", "unbalanced", id="unbalanced-quote"),
        pytest.param(['context="a:b:c:s0",x"'], "ext4", "unbalanced", id="quote-in-the-middle"),
        pytest.param(["context="], "ext4", "not an SELinux context", id="empty"),
        pytest.param(["fscontext=system_u:object_r:x_t:s0"], "ext4", "not allowed", id="other-context-kind"),
    ],
)
def test_selinux_context_values_are_checked_strictly(
    flags: list[str], fs_type: str | None, message: str
) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        check_mount_flags(flags, fs_type)


def test_stage_mount_passes_the_selinux_context(tmp_path: Path) -> None:
    runner = FakeRunner()
    flags = check_mount_flags([f'context="{POD_LABEL}"', "noatime"], "ext4")
    fake_mounter(tmp_path, runner).mount("/dev/x", "/mnt/stage", "ext4", flags)
    assert runner.calls == [
        ("mount", "-t", "ext4", "-o", f'context="{POD_LABEL}",noatime', "/dev/x", "/mnt/stage")
    ]


def test_publish_bind_passes_the_selinux_context(tmp_path: Path) -> None:
    runner = FakeRunner()
    flags = check_mount_flags([f'context="{POD_LABEL}"', "ro"], "ext4")
    fake_mounter(tmp_path, runner).bind("/mnt/stage", "/mnt/pod", flags)
    assert runner.calls == [
        ("mount", "--bind", "-o", f'context="{POD_LABEL}"', "/mnt/stage", "/mnt/pod"),
        ("mount", "-o", "remount,bind,ro", "/mnt/pod"),
    ]
