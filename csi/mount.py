"""OS layer of the node plugin: mount table, blkid probe, mkfs, fsck, mount/bind/unmount, grow.

Every program runs through an injected `Runner` as an argv list (never a shell string). mount(2) and
umount2(2) are called through libc when `syscalls=True` (the default: faster, no parsing); the `mount`
and `umount` programs are the documented fallback (`syscalls=False`, or libc unavailable).

Contracts:
- `unmount(path)`: not mounted or missing -> success (returns False); unmounted -> True.
- `probe(device)`: what blkid finds (filesystem type, partition table type); ambiguous -> MountError.
- `mkfs` is only ever called by the node after `probe` found neither a filesystem nor a partition table,
  or on a device the backend proved never written (then `zeroed`: nothing discarded or zeroed);
  mkfs.ext*/mkfs.xfs are also run without their force flags, so they refuse to overwrite a signature.
- Flags and mkfs options reaching this module were checked against the allow-lists of csi/filesystems.py.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from csi import mountapi, programs
from csi.failures import DriverError
from csi.filesystems import (
    EXT_TYPES,
    MS_BIND,
    MS_REMOUNT,
    SECURITY_OPTIONS,
    VFS_FLAGS,
    mke2fs_version,
    mkfs_argv,
    mount_failure,
    split_flags,
    zeroed_flags,
)
from csi.mountapi import Libc
from shim import failpoints

# Program -> Debian package that ships it (the Dockerfile installs exactly these packages).
REQUIRED_TOOLS: dict[str, str] = {
    "blkid": "util-linux",
    "partx": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "losetup": "mount",
    "mkfs.ext2": "e2fsprogs",
    "mkfs.ext3": "e2fsprogs",
    "mkfs.ext4": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "resize2fs": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "xfs_growfs": "xfsprogs",
    "udevadm": "udev",
}

MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# ---------------------------------------------------------------------------- command runner


class Result(NamedTuple):
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result: ...


class MountError(DriverError):
    """An OS operation failed; the message says which command and why (INTERNAL)."""


class OnlineGrowthDenied(MountError):
    """The kernel refused to grow a mounted filesystem for lack of privilege (ext*: CAP_SYS_RESOURCE);
    the filesystem is untouched and can still grow offline, which staging does."""


class SubprocessRunner:
    """Runs argv lists with subprocess (no shell); programs are looked up in the sbin directories too."""

    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result:
        program = shutil.which(argv[0], path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
        if program is None:
            raise MountError(
                f"{argv[0]} is not installed (Debian package {REQUIRED_TOOLS.get(argv[0], '?')})"
            )
        try:
            status, out, err = programs.run([program, *argv[1:]], timeout)
        except subprocess.TimeoutExpired as exc:
            raise MountError(f"{argv[0]} did not finish within {timeout}s") from exc
        return Result(tuple(argv), status, out, err)


def _fail(result: Result, what: str) -> MountError:
    """`what` failed, in the program's first line (most give the cause there) and last (e2fsprogs)."""
    lines = [line.strip() for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    said = "; ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else f"exit code {result.returncode}"
    return MountError(f"{what} failed: {said}")


# ---------------------------------------------------------------------------- mount table


class MountInfo(NamedTuple):
    """One /proc/self/mountinfo line."""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mount_point: str
    options: tuple[str, ...]
    fs_type: str
    source: str
    super_options: tuple[str, ...]

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(text: str) -> str:
    if "\\" not in text:  # the common case: nothing escaped
        return text
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def _escape(path: str) -> str:
    """`path` as mountinfo spells it (proc(5)): space, tab, newline and backslash as octal escapes."""
    if not any(c in path for c in " \t\n\\"):  # the common case: nothing to escape
        return path
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def parse_mountinfo(lines: Iterable[str]) -> list[MountInfo]:
    """Parse mountinfo lines (proc(5)); malformed lines are skipped."""
    out = []
    for line in lines:
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            major, minor = fields[2].split(":")
            out.append(
                MountInfo(
                    mount_id=int(fields[0]),
                    parent_id=int(fields[1]),
                    major=int(major),
                    minor=int(minor),
                    root=_unescape(fields[3]),
                    mount_point=_unescape(fields[4]),
                    options=tuple(fields[5].split(",")),
                    fs_type=fields[sep + 1],
                    source=_unescape(fields[sep + 2]),
                    super_options=tuple(fields[sep + 3].split(",")) if len(fields) > sep + 3 else (),
                )
            )
        except (ValueError, IndexError):
            continue
    return out


# ---------------------------------------------------------------------------- probing


class Probe(NamedTuple):
    """What blkid found on a device: filesystem type and partition table type ('' when none)."""

    fs_type: str = ""
    pt_type: str = ""

    @property
    def blank(self) -> bool:
        return not self.fs_type and not self.pt_type


# ---------------------------------------------------------------------------- the mounter


class Mounter:
    """The node's OS operations. `runner` runs programs; `syscalls` selects libc mount/umount."""

    def __init__(
        self,
        runner: Runner | None = None,
        *,
        syscalls: bool = True,
        mountinfo_path: str = "/proc/self/mountinfo",
    ) -> None:
        self.runner: Runner = runner or SubprocessRunner()
        self.mountinfo_path = mountinfo_path
        self._mke2fs: tuple[int, ...] | None = None
        self._libc: Libc | None = None
        if syscalls:
            try:
                self._libc = Libc()
            except (OSError, AttributeError):
                self._libc = None  # fall back to the mount programs

    # ---- mount table

    def mounts(self, paths: Iterable[str] = (), numbers: Iterable[tuple[int, int]] = ()) -> list[MountInfo]:
        """The current mount table. Given `paths` or device `numbers`, only the entries whose line
        holds one of them as a whole field: a superset of those the caller then matches exactly,
        without parsing the rest (a node with many pods has hundreds of lines). Neither: every entry."""
        tokens = [f" {_escape(p)} " for p in paths] + [f" {major}:{minor} " for major, minor in numbers]
        with open(self.mountinfo_path, encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().split("\n")  # not splitlines(): a path may hold U+2028 or U+0085
        if not tokens:
            return parse_mountinfo(lines)
        return parse_mountinfo(line for line in lines if any(t in line for t in tokens))

    def mount_at(self, path: str, table: Sequence[MountInfo] | None = None) -> MountInfo | None:
        """The top-most mount whose mount point is exactly `path`, or None; in `table` when given (a
        mount table just read), else in the current one."""
        found = None
        for entry in self.mounts((path,)) if table is None else table:
            if entry.mount_point == path:
                found = entry
        return found

    # ---- devices

    def probe(self, device: str) -> Probe:
        """blkid low-level probe. Nothing found -> blank Probe; ambivalent result -> MountError."""
        result = self.runner(["blkid", "-p", "-o", "export", device], timeout=60)
        if result.returncode == 2:
            return Probe()
        if result.returncode != 0:
            raise _fail(result, f"blkid on {device} (refusing to format a device that cannot be probed)")
        values = dict(
            line.split("=", 1)
            for line in result.stdout.splitlines()
            if "=" in line and not line.startswith("#")
        )
        return Probe(fs_type=values.get("TYPE", ""), pt_type=values.get("PTTYPE", ""))

    def mkfs(self, device: str, fs_type: str, options: Mapping[str, str], *, zeroed: bool = False) -> None:
        """Make a filesystem. `zeroed`: the device reads zeros everywhere, so nothing is discarded or
        zeroed (filesystems.zeroed_flags, for the mke2fs version installed)."""
        extra = zeroed_flags(fs_type, self.mke2fs_version(fs_type)) if zeroed else []
        result = self.runner(mkfs_argv(device, fs_type, options, extra=extra), timeout=1800)
        if result.returncode != 0:
            raise _fail(result, f"mkfs.{fs_type} on {device}")

    def mke2fs_version(self, fs_type: str) -> tuple[int, ...]:
        """Version of the mke2fs behind mkfs.<fs_type> ((0,): not ext* or not said); kept once said."""
        if fs_type not in EXT_TYPES:
            return (0,)
        if self._mke2fs is not None:
            return self._mke2fs
        said = self.runner([f"mkfs.{fs_type}", "-V"], timeout=60)
        version = mke2fs_version(said.stderr + said.stdout)
        if said.returncode == 0:
            self._mke2fs = version
        return version

    def fsck(self, device: str, fs_type: str, *, full: bool = False) -> None:
        """Repair what is safe to repair (e2fsck -p; `full` forces a complete check, as an offline
        resize2fs demands). xfs is not checked: it replays its log on mount."""
        if fs_type not in EXT_TYPES:
            return
        argv = ["e2fsck", "-f", "-p", device] if full else ["e2fsck", "-p", device]
        result = self.runner(argv, timeout=1800)
        if result.returncode & ~3:  # 1: errors corrected, 2: corrected, reboot advised
            raise _fail(result, f"e2fsck on {device} found errors it cannot fix safely; repair it by hand")

    def grow(self, device: str, mount_point: str, fs_type: str) -> None:
        """Grow a filesystem to fill its device (xfs: mounted at `mount_point`; ext*: mounted or not).
        Already full size -> no-op. Online ext* growth needs CAP_SYS_RESOURCE."""
        if fs_type in EXT_TYPES:
            result = self.runner(["resize2fs", device], timeout=1800)
        else:
            result = self.runner(["xfs_growfs", "-d", mount_point], timeout=1800)
        if result.returncode != 0:
            error = _fail(result, f"growing the {fs_type} filesystem on {device}")
            if fs_type in EXT_TYPES and "Permission denied" in result.stderr:
                error = OnlineGrowthDenied(
                    f"{error} (online {fs_type} growth needs CAP_SYS_RESOURCE in the node plugin; "
                    "the filesystem grows when the volume is next staged)"
                )
            raise error

    def settle(self) -> None:
        """Wait for udev to create device nodes (partitions); a missing udevadm is not an error."""
        try:
            self.runner(["udevadm", "settle", "--timeout=10"], timeout=15)
        except MountError:
            return

    def add_partitions(self, device: str) -> None:
        """Ask the kernel to create nodes for the partitions blkid reads on `device` (partx --add);
        for kernels without the partition-table parser. Failures are left to the caller's check."""
        self.runner(["partx", "--add", device], timeout=60)

    # ---- mount / unmount

    def mount(self, source: str, target: str, fs_type: str, flags: Sequence[str]) -> None:
        """Mount a filesystem. `flags` must come from check_mount_flags."""
        set_bits, _, data = split_flags(flags)
        if self._libc is not None:
            try:
                self._libc.mount(source, target, fs_type, set_bits, ",".join(data))
                return
            except OSError as exc:
                raise MountError(mount_failure(source, target, fs_type, flags, exc)) from exc
        argv = ["mount", "-t", fs_type, *(["-o", ",".join(flags)] if flags else []), source, target]
        result = self.runner(argv, timeout=300)
        if result.returncode != 0:
            raise _fail(result, f"mounting {source} at {target}")

    def bind(self, source: str, target: str, flags: Sequence[str]) -> None:
        """Bind-mount `source` on `target` with the VFS `flags` (e.g. ro). Through the syscalls the bind
        is attached with its flags already set (csi/mountapi.py): a crash leaves nothing or the finished
        mount at the target. The mount programs, or a kernel before 5.12: a bind, then a bind remount."""
        set_bits, _, _ = split_flags(flags)
        vfs = [f for f in flags if f in VFS_FLAGS]
        # Security options (context=) travel with the bind: on an SELinux kernel kubelet's pod label.
        security = [f for f in flags if f.startswith(SECURITY_OPTIONS)]
        if self._libc is not None:
            try:  # attached last: a failure leaves nothing at the target
                if set_bits and mountapi.bind(source, target, set_bits, _flagged):
                    return
            except OSError as exc:
                raise MountError(f"bind-mounting {source} at {target} failed: {exc.strerror}") from exc
            try:
                self._libc.mount(source, target, None, MS_BIND, ",".join(security))
                if set_bits:
                    _flagged()
                    self._libc.mount(None, target, None, MS_BIND | MS_REMOUNT | set_bits, "")
                return
            except OSError as exc:
                self._undo_bind(target)
                raise MountError(f"bind-mounting {source} at {target} failed: {exc.strerror}") from exc
        options = ["-o", ",".join(security)] if security else []
        result = self.runner(["mount", "--bind", *options, source, target], timeout=300)
        if result.returncode != 0:
            raise _fail(result, f"bind-mounting {source} at {target}")
        if vfs:
            result = self.runner(["mount", "-o", ",".join(["remount", "bind", *vfs]), target], timeout=300)
            if result.returncode != 0:
                self._undo_bind(target)
                raise _fail(result, f"remounting {target} with {','.join(vfs)}")

    def _undo_bind(self, target: str) -> None:
        try:
            self.unmount(target)
        except MountError:
            return

    def unmount(self, target: str) -> bool:
        """Unmount `target` (the top-most mount). Not mounted or missing -> False; done -> True."""
        if self._libc is not None:
            try:
                self._libc.umount2(target, UMOUNT_NOFOLLOW)
                return True
            except OSError as exc:
                if exc.errno in (errno.EINVAL, errno.ENOENT):
                    return False
                raise MountError(f"unmounting {target} failed: {exc.strerror}") from exc
        if self.mount_at(target) is None:
            return False
        result = self.runner(["umount", target], timeout=300)
        if result.returncode != 0:
            if self.mount_at(target) is None:
                return True
            raise _fail(result, f"unmounting {target}")
        return True


def _flagged() -> None:
    failpoints.hit("node.publish.flagged")  # the bind made and flagged, not attached at the target yet
