"""OS layer of the node plugin: mount table, blkid probe, mkfs, fsck, mount/bind/unmount, grow, stats.

Every program runs through an injected `Runner` as an argv list (never a shell string). mount(2) and
umount2(2) are called through libc when `syscalls=True` (the default: faster, no parsing); the `mount`
and `umount` programs are the documented fallback (`syscalls=False`, or libc unavailable).

Contracts:
- `unmount(path)`: not mounted or missing -> success (returns False); unmounted -> True.
- `probe(device)`: what blkid finds (filesystem type, partition table type); ambiguous -> MountError.
- `mkfs` is only ever called by the node after `probe` found neither a filesystem nor a partition table;
  mkfs.ext*/mkfs.xfs are also run without their force flags, so they refuse to overwrite a signature.
- Option allow-lists live here: `check_fs_type`, `check_mount_flags`, `mkfs_argv` raise InvalidArgument.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from csi import keys
from csi.errors import InvalidArgument

# Program -> Debian package that ships it (the Dockerfile installs exactly these packages).
REQUIRED_TOOLS: dict[str, str] = {
    "blkid": "util-linux",
    "partx": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "losetup": "mount",
    "mkfs.ext3": "e2fsprogs",
    "mkfs.ext4": "e2fsprogs",
    "e2fsck": "e2fsprogs",
    "resize2fs": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "xfs_growfs": "xfsprogs",
    "udevadm": "udev",
}

FS_TYPES = ("ext4", "ext3", "xfs")
DEFAULT_FS_TYPE = "ext4"
EXT_TYPES = frozenset({"ext3", "ext4"})
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# ---------------------------------------------------------------------------- command runner


class Result(NamedTuple):
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result: ...


class MountError(Exception):
    """An OS operation failed; the message says which command and why."""


class OnlineGrowthDenied(MountError):
    """The kernel refused to grow a mounted filesystem for lack of privilege (ext*: CAP_SYS_RESOURCE).

    The filesystem is untouched; it can still grow offline, which staging does."""


class SubprocessRunner:
    """Runs argv lists with subprocess (no shell); programs are looked up in the sbin directories too."""

    def __call__(self, argv: Sequence[str], timeout: float | None = None) -> Result:
        program = shutil.which(argv[0], path=os.environ.get("PATH", "") + ":" + SBIN_PATH)
        if program is None:
            raise MountError(
                f"{argv[0]} is not installed (Debian package {REQUIRED_TOOLS.get(argv[0], '?')})"
            )
        try:
            done = subprocess.run(
                [program, *argv[1:]],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise MountError(f"{argv[0]} did not finish within {timeout}s") from exc
        return Result(tuple(argv), done.returncode, done.stdout, done.stderr)


def _fail(result: Result, what: str) -> MountError:
    detail = (result.stderr or result.stdout).strip().splitlines()
    tail = detail[-1] if detail else f"exit code {result.returncode}"
    return MountError(f"{what} failed: {tail}")


# ---------------------------------------------------------------------------- allow-lists

# VFS flags: name -> (MS_* bits to set, bits to clear). Valid for every filesystem and for bind mounts.
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_SYNCHRONOUS, MS_REMOUNT = 1, 2, 4, 8, 16, 32
MS_DIRSYNC, MS_NOATIME, MS_NODIRATIME, MS_BIND = 128, 1024, 2048, 4096
MS_RELATIME, MS_STRICTATIME, MS_LAZYTIME = 1 << 21, 1 << 24, 1 << 25
MNT_DETACH, UMOUNT_NOFOLLOW = 2, 8
VFS_FLAGS: dict[str, tuple[int, int]] = {
    "ro": (MS_RDONLY, 0),
    "rw": (0, MS_RDONLY),
    "nosuid": (MS_NOSUID, 0),
    "nodev": (MS_NODEV, 0),
    "noexec": (MS_NOEXEC, 0),
    "sync": (MS_SYNCHRONOUS, 0),
    "async": (0, MS_SYNCHRONOUS),
    "dirsync": (MS_DIRSYNC, 0),
    "noatime": (MS_NOATIME, 0),
    "nodiratime": (MS_NODIRATIME, 0),
    "relatime": (MS_RELATIME, 0),
    "strictatime": (MS_STRICTATIME, 0),
    "lazytime": (MS_LAZYTIME, 0),
}
_NUM = r"[0-9]{1,9}"
# Filesystem options passed as mount data: exact names, or name=value with the value pattern.
FS_OPTIONS: dict[str, dict[str, str | None]] = {
    "ext4": {
        "discard": None,
        "nodiscard": None,
        "barrier": None,
        "nobarrier": None,
        "barrier=": "[01]",
        "data=": "ordered|writeback|journal",
        "commit=": _NUM,
        "errors=": "remount-ro|continue",
        "acl": None,
        "user_xattr": None,
        "auto_da_alloc": None,
        "noauto_da_alloc": None,
        "delalloc": None,
        "nodelalloc": None,
        "dioread_nolock": None,
        "journal_checksum": None,
        "stripe=": _NUM,
    },
    "xfs": {
        "discard": None,
        "nodiscard": None,
        "inode64": None,
        "inode32": None,
        "largeio": None,
        "nolargeio": None,
        "wsync": None,
        "nouuid": None,
        "filestreams": None,
        "noquota": None,
        "uquota": None,
        "gquota": None,
        "pquota": None,
        "prjquota": None,
        "allocsize=": r"[0-9]{1,6}[kmg]?",
        "logbufs=": "[2-8]",
        "logbsize=": r"[0-9]{1,6}[k]?",
    },
}
FS_OPTIONS["ext3"] = {k: v for k, v in FS_OPTIONS["ext4"].items() if k not in ("dioread_nolock",)}


# SELinux: kubelet mounts a volume with the pod's label (`-o context="<user>:<role>:<type>:<level>"`)
# when the CSIDriver has seLinuxMount. The level may hold commas (s0:c1,c2), so kubelet quotes the value.
_SELINUX_NAME = r"[a-z_][a-z0-9_]{0,63}"
_SELINUX_CATEGORIES = r"c[0-9]{1,4}(?:[.,]c[0-9]{1,4})*"
_SELINUX_LEVEL = rf"s[0-9]{{1,2}}(?::{_SELINUX_CATEGORIES})?"
SELINUX_CONTEXT = re.compile(
    rf"{_SELINUX_NAME}:{_SELINUX_NAME}:{_SELINUX_NAME}:{_SELINUX_LEVEL}(?:-{_SELINUX_LEVEL})?"
)
# Security options valid on every filesystem (never for raw block): name= -> value check.
SECURITY_OPTIONS = ("context=",)


def _selinux_context_ok(value: str) -> bool:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    elif "," in value:
        return False
    return SELINUX_CONTEXT.fullmatch(value) is not None


def _split_options(raw: str) -> list[str]:
    """Split a mount option string on commas outside double quotes (context="...:s0:c1,c2")."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for char in raw:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if quoted:
        raise InvalidArgument(f"mount flags {raw!r}: unbalanced double quote")
    parts.append("".join(current))
    return parts


def check_fs_type(fs_type: str) -> str:
    """The filesystem to use: '' -> ext4; anything outside ext4/ext3/xfs -> InvalidArgument."""
    fs_type = fs_type or DEFAULT_FS_TYPE
    if fs_type not in FS_TYPES:
        raise InvalidArgument(f"fs type {fs_type!r} is not supported; use one of {', '.join(FS_TYPES)}")
    return fs_type


def check_mount_flags(flags: Sequence[str], fs_type: str | None) -> list[str]:
    """Allow-listed mount flags, split on commas; anything else -> InvalidArgument naming the flag.

    `fs_type` None (block access or bind mounts) allows only the VFS flags.
    """
    out: list[str] = []
    allowed = FS_OPTIONS.get(fs_type or "", {})
    for raw in flags:
        for flag in _split_options(raw):
            flag = flag.strip()
            if not flag:
                continue
            if flag in VFS_FLAGS or _fs_option_ok(flag, allowed):
                out.append(flag)
                continue
            if fs_type and flag.startswith(SECURITY_OPTIONS):
                if not _selinux_context_ok(flag[len("context=") :]):
                    raise InvalidArgument(
                        f"mount flag {flag!r}: not an SELinux context; expected context="
                        '"user:role:type:level", e.g. context="system_u:object_r:container_file_t:s0:c1,c2"'
                    )
                out.append(flag)
                continue
            where = f"for {fs_type}" if fs_type else "for this access type"
            raise InvalidArgument(
                f"mount flag {flag!r} is not allowed {where}; allowed: "
                + ", ".join(
                    sorted(
                        set(VFS_FLAGS)
                        | {k.rstrip("=") for k in allowed}
                        | ({k.rstrip("=") for k in SECURITY_OPTIONS} if fs_type else set())
                    )
                )
            )
    return out


def _fs_option_ok(flag: str, allowed: Mapping[str, str | None]) -> bool:
    if "=" not in flag:
        return flag in allowed and allowed[flag] is None
    name, _, value = flag.partition("=")
    pattern = allowed.get(name + "=")
    return pattern is not None and re.fullmatch(pattern, value) is not None


def split_flags(flags: Sequence[str]) -> tuple[int, int, list[str]]:
    """(MS_* bits to set, bits to clear, filesystem data options) of already checked flags."""
    set_bits = clear_bits = 0
    data: list[str] = []
    for flag in flags:
        if flag in VFS_FLAGS:
            on, off = VFS_FLAGS[flag]
            set_bits, clear_bits = (set_bits | on) & ~off, (clear_bits | off) & ~on
        else:
            data.append(flag)
    return set_bits, clear_bits, data


def _int_option(options: Mapping[str, str], key: str, low: int, high: int, pow2: bool) -> int | None:
    value = options.get(key, "")
    if value == "":
        return None
    if not re.fullmatch(r"[0-9]{1,12}", value):
        raise InvalidArgument(f"volume attribute {key}={value!r} must be a whole number")
    number = int(value)
    if not low <= number <= high or (pow2 and number & (number - 1)):
        kind = "a power of two " if pow2 else ""
        raise InvalidArgument(f"volume attribute {key}={value} must be {kind}between {low} and {high}")
    return number


def mkfs_argv(device: str, fs_type: str, options: Mapping[str, str]) -> list[str]:
    """mkfs command for `device`; format options (keys.FORMAT_KEYS) are validated again here."""
    fs_type = check_fs_type(fs_type)
    opts = {k: v for k, v in options.items() if k in keys.FORMAT_KEYS and v != ""}
    if fs_type == "xfs":
        bad = sorted(set(opts) - {keys.BLOCK_SIZE, keys.INODE_SIZE})
        if bad:
            raise InvalidArgument(f"volume attribute(s) {', '.join(bad)} do not apply to xfs")
        argv = ["mkfs.xfs", "-q"]
        block = _int_option(opts, keys.BLOCK_SIZE, 512, 65536, True)
        inode = _int_option(opts, keys.INODE_SIZE, 256, 2048, True)
        if block:
            argv += ["-b", f"size={block}"]
        if inode:
            argv += ["-i", f"size={inode}"]
        return [*argv, device]
    argv = [f"mkfs.{fs_type}", "-q"]
    block = _int_option(opts, keys.BLOCK_SIZE, 1024, 65536, True)
    inode = _int_option(opts, keys.INODE_SIZE, 128, 4096, True)
    ratio = _int_option(opts, keys.BYTES_PER_INODE, 1024, 64 * 1024**2, False)
    count = _int_option(opts, keys.NUMBER_OF_INODES, 1, 2**32 - 1, False)
    bigalloc = opts.get(keys.EXT4_BIGALLOC, "false")
    if bigalloc not in ("true", "false"):
        raise InvalidArgument(f"volume attribute {keys.EXT4_BIGALLOC} must be true or false")
    cluster = _int_option(opts, keys.EXT4_CLUSTER_SIZE, 1024, 2**29, True)
    if (bigalloc == "true" or cluster) and fs_type != "ext4":
        raise InvalidArgument(f"{keys.EXT4_BIGALLOC}/{keys.EXT4_CLUSTER_SIZE} apply to ext4 only")
    if cluster and bigalloc != "true":
        raise InvalidArgument(f"{keys.EXT4_CLUSTER_SIZE} needs {keys.EXT4_BIGALLOC}=true")
    if block:
        argv += ["-b", str(block)]
    if inode:
        argv += ["-I", str(inode)]
    if ratio:
        argv += ["-i", str(ratio)]
    if count:
        argv += ["-N", str(count)]
    if bigalloc == "true":
        argv += ["-O", "bigalloc"]
    if cluster:
        argv += ["-C", str(cluster)]
    return [*argv, device]


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
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[MountInfo]:
    """Parse mountinfo text (proc(5)); malformed lines are skipped."""
    out = []
    for line in text.splitlines():
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


class Stats(NamedTuple):
    total_bytes: int
    available_bytes: int
    used_bytes: int
    total_inodes: int
    free_inodes: int
    used_inodes: int


def fs_size(device: str, fs_type: str) -> int | None:
    """Filesystem size in bytes from its superblock (ext*, xfs); None when unreadable or unknown."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if fs_type in EXT_TYPES:
            sb = os.pread(fd, 1024, 1024)
            if len(sb) < 0x158 or struct.unpack_from("<H", sb, 0x38)[0] != 0xEF53:
                return None
            lo, log_block = struct.unpack_from("<I", sb, 0x4)[0], struct.unpack_from("<I", sb, 0x18)[0]
            incompat = struct.unpack_from("<I", sb, 0x60)[0]
            hi = struct.unpack_from("<I", sb, 0x150)[0] if incompat & 0x80 else 0
            return int(((hi << 32) | lo) * (1024 << log_block))
        if fs_type == "xfs":
            sb = os.pread(fd, 16, 0)
            if len(sb) < 16 or sb[:4] != b"XFSB":
                return None
            block, dblocks = struct.unpack_from(">IQ", sb, 4)
            return int(block * dblocks)
        return None
    finally:
        os.close(fd)


BLKROSET, BLKROGET = 0x125D, 0x125E


def device_readonly(device: str) -> bool:
    """The kernel's read-only flag of a block device (BLKROGET)."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        value = ctypes.c_int(0)
        fcntl.ioctl(fd, BLKROGET, value)
        return bool(value.value)
    finally:
        os.close(fd)


def set_device_readonly(device: str, readonly: bool) -> None:
    """Set the kernel's read-only flag of a block device (BLKROSET): writes through any node fail."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, BLKROSET, ctypes.c_int(1 if readonly else 0))
    finally:
        os.close(fd)


def stats(path: str) -> Stats:
    st = os.statvfs(path)
    return Stats(
        total_bytes=st.f_blocks * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        total_inodes=st.f_files,
        free_inodes=st.f_ffree,
        used_inodes=st.f_files - st.f_ffree,
    )


# ---------------------------------------------------------------------------- the mounter


class _Libc:
    """mount(2)/umount2(2) through ctypes."""

    def __init__(self) -> None:
        # The interpreter's own symbols include libc; ctypes.util.find_library would run ldconfig in a
        # subprocess, about 10 ms of start-up.
        lib = ctypes.CDLL(None, use_errno=True)
        self._mount = lib.mount
        self._mount.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_ulong,
            ctypes.c_char_p,
        ]
        self._umount2 = lib.umount2
        self._umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

    def mount(self, source: str | None, target: str, fs_type: str | None, flags: int, data: str) -> None:
        rc = self._mount(
            source.encode() if source else None,
            target.encode(),
            fs_type.encode() if fs_type else None,
            flags,
            data.encode() if data else None,
        )
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)

    def umount2(self, target: str, flags: int) -> None:
        if self._umount2(target.encode(), flags) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)


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
        self._libc: _Libc | None = None
        if syscalls:
            try:
                self._libc = _Libc()
            except (OSError, AttributeError):
                self._libc = None  # fall back to the mount programs

    # ---- mount table

    def mounts(self) -> list[MountInfo]:
        with open(self.mountinfo_path, encoding="utf-8", errors="surrogateescape") as fh:
            return parse_mountinfo(fh.read())

    def mount_at(self, path: str) -> MountInfo | None:
        """The top-most mount whose mount point is exactly `path`, or None."""
        found = None
        for entry in self.mounts():
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

    def mkfs(self, device: str, fs_type: str, options: Mapping[str, str]) -> None:
        result = self.runner(mkfs_argv(device, fs_type, options), timeout=1800)
        if result.returncode != 0:
            raise _fail(result, f"mkfs.{fs_type} on {device}")

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
                    f"{error} (online ext4 growth needs CAP_SYS_RESOURCE in the node plugin; "
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
                raise MountError(f"mounting {source} ({fs_type}) at {target} failed: {exc.strerror}") from exc
        argv = ["mount", "-t", fs_type]
        if flags:
            argv += ["-o", ",".join(flags)]
        result = self.runner([*argv, source, target], timeout=300)
        if result.returncode != 0:
            raise _fail(result, f"mounting {source} at {target}")

    def bind(self, source: str, target: str, flags: Sequence[str]) -> None:
        """Bind-mount `source` on `target`, then apply VFS `flags` (e.g. ro) with a bind remount."""
        set_bits, _, _ = split_flags(flags)
        vfs = [f for f in flags if f in VFS_FLAGS]
        # Security options (context=) travel with the bind: on an SELinux kernel kubelet's pod label.
        security = [f for f in flags if f.startswith(SECURITY_OPTIONS)]
        if self._libc is not None:
            try:
                self._libc.mount(source, target, None, MS_BIND, ",".join(security))
                if set_bits:
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
