"""The filesystems the node creates, and the allow-lists of what a request may ask of them: fs types,
mount flags, and mkfs options. Pure checks: nothing here runs a program or touches a device.

Each check raises InvalidParameterError naming the value and what is allowed; values that pass are
safe to place in an argv list (they never reach a shell).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping, Sequence

from csi import keys, mkfs_limits
from csi.failures import InvalidParameterError
from csi.values import Parser, boolean, checked, choice, power_of_two, whole

FS_TYPES = ("ext4", "ext3", "ext2", "xfs")
DEFAULT_FS_TYPE = "ext4"
EXT_TYPES = frozenset({"ext2", "ext3", "ext4"})  # made, checked and grown by e2fsprogs
PAGE_SIZE = max(os.sysconf("SC_PAGE_SIZE"), 1024)  # mke2fs refuses ext blocks larger than a page
# The smallest device each filesystem is made on: mkfs.xfs (xfsprogs 5.19 and later) refuses less.
MIN_DEVICE_BYTES = {"xfs": 300 * 1024 * 1024}


def parse_fs_type(value: str) -> str:
    """A filesystem the node can create, in any case: one of FS_TYPES (ValueError otherwise)."""
    fs = value.strip().lower()
    if fs not in FS_TYPES:
        raise ValueError(f"one of {', '.join(FS_TYPES)}")
    return fs


def requested_fs_type(cap_fs_type: str, volume_context: Mapping[str, str]) -> str:
    """The filesystem a mount asks for: the capability's fs_type, else the volume's fsType attribute;
    '' when neither does (check_fs_type then picks DEFAULT_FS_TYPE)."""
    return cap_fs_type or volume_context.get(keys.VC_FS_TYPE, "")


def check_fs_type(value: str, what: str = "fs type") -> str:
    """The filesystem to use: '' -> ext4; anything else outside FS_TYPES -> InvalidParameterError."""
    if not value:
        return DEFAULT_FS_TYPE
    try:
        return parse_fs_type(value)
    except ValueError:
        raise InvalidParameterError(
            f"{what} {value!r} is not supported; use one of {', '.join(FS_TYPES)}"
        ) from None


# ---------------------------------------------------------------------------- mount flags

# VFS flags: name -> (MS_* bits to set, bits to clear). Valid for every filesystem and for bind mounts.
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_SYNCHRONOUS, MS_REMOUNT = 1, 2, 4, 8, 16, 32
MS_DIRSYNC, MS_NOATIME, MS_NODIRATIME, MS_BIND = 128, 1024, 2048, 4096
MS_RELATIME, MS_STRICTATIME, MS_LAZYTIME = 1 << 21, 1 << 24, 1 << 25
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

_SUFFIX_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30}


def _xfs_size(low: int, high: int, *, zero: bool = False) -> Parser:
    """A size as xfs reads it (bytes, or with a k, m or g suffix) that is a power of two from `low` to
    `high` bytes (or 0, the default, when `zero`): what the kernel takes, or a subset of it."""
    said = f"{'0 or ' if zero else ''}a power of two from {_kmg(low)} to {_kmg(high)} (bytes, or k, m or g)"

    def parse(value: str) -> str:
        found = re.fullmatch(r"([0-9]{1,10})([kKmMgG]?)", value)
        n = int(found[1]) << _SUFFIX_SHIFT[found[2].lower()] if found else -1
        if not (zero and n == 0) and not (low <= n <= high and n & (n - 1) == 0):
            raise ValueError(said)
        return value

    return parse


def _kmg(n: int) -> str:
    """`n` bytes with the largest of the suffixes k, m, g that divides it ("16k", "1g")."""
    shift, unit = max((shift, u) for u, shift in _SUFFIX_SHIFT.items() if n % (1 << shift) == 0)
    return f"{n >> shift}{unit}"


# commit= (seconds): the kernel refuses more than INT_MAX / HZ; 2147483 is within that for any HZ.
MAX_COMMIT_SECONDS = (2**31 - 1) // 1000
# Filesystem options passed as mount data: exact names (None), or name= with a parser of the value. The
# ext4 driver mounts ext3 and ext2 too (CONFIG_EXT4_USE_FOR_EXT2, as distribution kernels build it), and
# refuses there the options it marks ext4-only (MOPT_EXT4_ONLY), and on ext2 the journal's (MOPT_NO_EXT2).
_EXT_OPTIONS: dict[str, Parser | None] = {
    "discard": None,
    "nodiscard": None,
    "barrier": None,
    "nobarrier": None,
    "barrier=": choice("0", "1"),
    "errors=": choice("remount-ro", "continue"),
    "acl": None,
    "user_xattr": None,
    "auto_da_alloc": None,
    "noauto_da_alloc": None,
    "stripe=": whole(0, 999_999_999),
}
_JOURNAL_OPTIONS: dict[str, Parser | None] = {
    "data=": choice("ordered", "writeback", "journal"),
    "commit=": whole(0, MAX_COMMIT_SECONDS),
}
_EXT4_ONLY = ("delalloc", "nodelalloc", "dioread_nolock", "journal_checksum")
FS_OPTIONS: dict[str, dict[str, Parser | None]] = {
    "ext4": {**_EXT_OPTIONS, **_JOURNAL_OPTIONS, **dict.fromkeys(_EXT4_ONLY)},
    "ext3": {**_EXT_OPTIONS, **_JOURNAL_OPTIONS},
    "ext2": _EXT_OPTIONS,
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
        # the kernel takes an allocsize whose lowest set bit is from a page to 1 GiB
        "allocsize=": _xfs_size(PAGE_SIZE, 2**30),
        "logbufs=": whole(2, 8),
        "logbsize=": _xfs_size(16 * 1024, 256 * 1024, zero=True),  # a version 2 log's (every v5 xfs)
    },
}


# SELinux: kubelet mounts a volume with the pod's label (`-o context="<user>:<role>:<type>:<level>"`)
# when the CSIDriver has seLinuxMount. The level may hold commas (s0:c1,c2), so kubelet quotes the value.
_SELINUX_NAME = r"[a-z_][a-z0-9_]{0,63}"
_SELINUX_CATEGORIES = r"c[0-9]{1,4}(?:[.,]c[0-9]{1,4})*"
_SELINUX_LEVEL = rf"s[0-9]{{1,2}}(?::{_SELINUX_CATEGORIES})?"
SELINUX_CONTEXT = re.compile(
    rf"{_SELINUX_NAME}:{_SELINUX_NAME}:{_SELINUX_NAME}:{_SELINUX_LEVEL}(?:-{_SELINUX_LEVEL})?"
)
# Security options valid on every filesystem (never for raw block), passed at stage and publish.
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
        raise InvalidParameterError(f"mount flags {raw!r}: unbalanced double quote")
    parts.append("".join(current))
    return parts


def check_mount_flags(flags: Sequence[str], fs_type: str | None) -> list[str]:
    """Allow-listed mount flags, split on commas (outside double quotes); anything else ->
    InvalidParameterError naming the flag.

    `fs_type` None (block access) allows only the VFS flags; filesystems also take their own options
    and `context=` with a value checked as an SELinux context.
    """
    out: list[str] = []
    allowed = FS_OPTIONS.get(fs_type or "", {})
    for raw in flags:
        for flag in (f.strip() for f in _split_options(raw)):
            if not flag:
                continue
            if fs_type and flag.startswith(SECURITY_OPTIONS):
                if not _selinux_context_ok(flag[len("context=") :]):
                    raise InvalidParameterError(
                        f"mount flag {flag!r}: not an SELinux context; expected context="
                        '"user:role:type:level", e.g. context="system_u:object_r:container_file_t:s0:c1,c2"'
                    )
            elif flag not in VFS_FLAGS and (expected := _fs_option_refused(flag, allowed)) is not None:
                raise _not_allowed(flag, fs_type, expected)
            out.append(flag)
    _check_consistent(out)
    return out


def _not_allowed(flag: str, fs_type: str | None, expected: str) -> InvalidParameterError:
    """The refusal of `flag`: what its value should be (`expected`), or the names allowed for `fs_type`."""
    where = f"for {fs_type}" if fs_type else "for this access type"
    if expected:
        return InvalidParameterError(f"mount flag {flag!r} is not allowed {where}: expected {expected}")
    security = {k.rstrip("=") for k in SECURITY_OPTIONS} if fs_type else set()
    names = {k.rstrip("=") for k in FS_OPTIONS.get(fs_type or "", {})}
    return InvalidParameterError(
        f"mount flag {flag!r} is not allowed {where}; allowed: "
        + ", ".join(sorted(set(VFS_FLAGS) | names | security))
    )


def check_mount_flags_any(flags: Sequence[str]) -> list[str]:
    """Flags for a mount that names no fs type: the device may already hold any filesystem, so they
    pass when one of FS_TYPES takes them all (the default's refusal otherwise); the stage checks them
    again against the filesystem it finds."""
    refusal: InvalidParameterError | None = None
    for fs_type in (DEFAULT_FS_TYPE, *(f for f in FS_TYPES if f != DEFAULT_FS_TYPE)):
        try:
            return check_mount_flags(flags, fs_type)
        except InvalidParameterError as exc:
            refusal = refusal or exc
    assert refusal is not None
    raise refusal


def _check_consistent(flags: Sequence[str]) -> None:
    """VFS flags that undo each other (ro and rw, sync and async) -> InvalidParameterError: the kernel
    would take the last one, while the request's own reading (is it read-only?) may take the other.
    So is ext4's delalloc with data=journal (the last data= counts), which the kernel refuses."""
    data = [f for f in flags if f.startswith("data=")]
    if data and data[-1] == "data=journal" and "delalloc" in flags:
        raise InvalidParameterError(
            "mount flags 'data=journal' and 'delalloc' contradict each other (ext4 does not delay "
            "allocation while it journals data); keep one of them"
        )
    vfs = [f for f in dict.fromkeys(flags) if f in VFS_FLAGS]
    for i, first in enumerate(vfs):
        for second in vfs[i + 1 :]:
            if VFS_FLAGS[first][0] & VFS_FLAGS[second][1] or VFS_FLAGS[first][1] & VFS_FLAGS[second][0]:
                raise InvalidParameterError(
                    f"mount flags {first!r} and {second!r} contradict each other; keep one of them"
                )


def _fs_option_refused(flag: str, allowed: Mapping[str, Parser | None]) -> str | None:
    """None when `allowed` takes `flag`; else what its value should be ('' when its name is unknown)."""
    name, equals, value = flag.partition("=")
    if not equals:
        return None if flag in allowed and allowed[flag] is None else ""
    parser = allowed.get(name + "=")
    if parser is None:
        return ""
    try:
        parser(value)
    except ValueError as exc:
        return f"{name}= {exc}"
    return None


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


def mount_failure(source: str, target: str, fs_type: str, flags: Sequence[str], error: OSError) -> str:
    """The message of a mount(2) that failed with `error`, naming the flags it had: for EINVAL the
    kernel refused the filesystem or one of them (its log, dmesg, says which)."""
    said = f"mounting {source} ({fs_type}) at {target} with flags {','.join(flags) or '(none)'} failed"
    if error.errno == errno.EINVAL:
        return f"{said}: {error.strerror}; the kernel refused the filesystem or one of these flags"
    return f"{said}: {error.strerror}"


# ---------------------------------------------------------------------------- mkfs options

# Format option (keys.FORMAT_KEYS) -> (mkfs flag, value prefix, parser), in argv order. The ranges are
# what the programs take on their own; what they refuse in combination is csi.mkfs_limits'.
MkfsTable = dict[str, tuple[str, str, Parser]]
_XFS_MKFS: MkfsTable = {  # mkfs.xfs makes CRC-enabled (v5) filesystems: no 512-byte blocks, 256-byte inodes
    keys.BLOCK_SIZE: ("-b", "size=", power_of_two(1024, 65536)),
    keys.INODE_SIZE: ("-i", "size=", power_of_two(512, 2048)),
}
_EXT_MKFS: MkfsTable = {
    keys.BLOCK_SIZE: ("-b", "", power_of_two(1024, PAGE_SIZE)),
    keys.INODE_SIZE: ("-I", "", power_of_two(128, 4096)),
    keys.BYTES_PER_INODE: ("-i", "", whole(1024, 64 * 1024**2)),
    keys.NUMBER_OF_INODES: ("-N", "", whole(mkfs_limits.MIN_INODES, 2**32 - 1)),
}
# mke2fs: "invalid cluster size" unless above 1024 bytes (EXT2_MIN_CLUSTER_SIZE) and at most 2^29
_EXT4_CLUSTER: MkfsTable = {keys.EXT4_CLUSTER_SIZE: ("-C", "", power_of_two(2048, 2**29))}


VOLUME_ATTRIBUTE = "volume attribute"


def mke2fs_version(said: str) -> tuple[int, ...]:
    """The version in what `mkfs.ext* -V` printed ("mke2fs 1.47.0 (5-Feb-2023)" -> (1, 47, 0)); (0,)
    when it names none."""
    found = re.search(r"mke2fs (\d+)\.(\d+)(?:\.(\d+))?", said)
    return tuple(int(n or 0) for n in found.groups()) if found else (0,)


def zeroed_flags(fs_type: str, mke2fs_version: tuple[int, ...]) -> list[str]:
    """mkfs flags for a device that reads zeros everywhere (a volume never written): there is nothing
    to discard (xfs -K, ext* -E nodiscard), and with mke2fs 1.47.0 or later nothing to zero either
    (assume_storage_prezeroed: no journal or inode table is written with zeros, neither by mkfs nor by
    the kernel's lazy inode-table init after the first mount, so a sparse backing file stays sparse)."""
    if check_fs_type(fs_type) == "xfs":
        return ["-K"]
    if mke2fs_version >= (1, 47, 0):
        return ["-E", "nodiscard,assume_storage_prezeroed=1"]
    return ["-E", "nodiscard"]


def mkfs_argv(
    device: str,
    fs_type: str,
    options: Mapping[str, str],
    what: str = VOLUME_ATTRIBUTE,
    extra: Sequence[str] = (),
) -> list[str]:
    """mkfs command for `device`, with `extra` flags (zeroed_flags) before the options; format options
    (keys.FORMAT_KEYS) are validated again here. The one statement of which options each filesystem
    takes: an option it refuses -> InvalidParameterError naming it as `what` (where the user wrote it)
    and what is allowed."""
    fs_type = check_fs_type(fs_type)
    opts = {k: v for k, v in options.items() if k in keys.FORMAT_KEYS and v != ""}
    if fs_type == "xfs":
        bad = sorted(set(opts) - set(_XFS_MKFS))
        if bad:
            raise InvalidParameterError(f"{what}(s) {', '.join(bad)} do not apply to xfs")
        flags = _mkfs_flags(opts, _XFS_MKFS, f"xfs {what}")
        mkfs_limits.check_xfs(opts, what)
        return ["mkfs.xfs", "-q", *extra, *flags, device]
    bigalloc = checked(boolean, keys.EXT4_BIGALLOC, opts.get(keys.EXT4_BIGALLOC, "false"), what)
    cluster = keys.EXT4_CLUSTER_SIZE in opts
    if (bigalloc == "true" or cluster) and fs_type != "ext4":
        raise InvalidParameterError(
            f"{what}s {keys.EXT4_BIGALLOC}/{keys.EXT4_CLUSTER_SIZE} apply to ext4 only, not {fs_type}"
        )
    if cluster and bigalloc != "true":
        raise InvalidParameterError(f"{what} {keys.EXT4_CLUSTER_SIZE} needs {keys.EXT4_BIGALLOC}=true")
    flags = _mkfs_flags(opts, _EXT_MKFS, f"{fs_type} {what}")
    cluster_flags = _mkfs_flags(opts, _EXT4_CLUSTER, f"{fs_type} {what}")
    mkfs_limits.check_ext(opts, f"{fs_type} {what}")
    bigalloc_flags = ["-O", "bigalloc"] if bigalloc == "true" else []
    return [f"mkfs.{fs_type}", "-q", *extra, *flags, *bigalloc_flags, *cluster_flags, device]


def _mkfs_flags(opts: Mapping[str, str], table: MkfsTable, what: str) -> list[str]:
    """mkfs arguments for the options in `table`, each value checked (a bad one named as `what`)."""
    out: list[str] = []
    for key, (flag, prefix, parser) in table.items():
        if key in opts:
            out += [flag, prefix + checked(parser, key, opts[key], what)]
    return out
