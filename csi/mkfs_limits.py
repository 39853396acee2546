"""What mkfs.ext4, mkfs.ext3, mkfs.ext2 and mkfs.xfs refuse in combination, and the volume size mkfs
options need: the limits filesystems.mkfs_argv holds the options to beyond each value's own range, and that
validation.filesystem_floor holds a CreateVolume's size to, so that no volume is created that the node
could never format. Pure arithmetic over already-checked option strings; the numbers are mke2fs's and
mkfs.xfs's (mke2fs.conf defaults for what mke2fs picks itself), and tests/integration/test_mkfs_options.py
holds them against the real programs.
"""

from __future__ import annotations

from collections.abc import Mapping

from csi import keys
from csi.failures import InvalidParameterError

SMALL_EXT_BLOCK = 1024  # the block size mke2fs picks for a volume under 512 MiB when none is given
DEFAULT_EXT_BLOCK, DEFAULT_INODE = 4096, 256  # the largest it picks otherwise (mke2fs.conf defaults)


def _sizes(opts: Mapping[str, str]) -> tuple[int, int, int]:
    """(blockSize, inodeSize, bytesPerInode) of checked options, 0 for each one not given."""
    block, inode, ratio = (
        int(opts.get(k) or 0) for k in (keys.BLOCK_SIZE, keys.INODE_SIZE, keys.BYTES_PER_INODE)
    )
    return block, inode, ratio


def check_xfs(opts: Mapping[str, str], what: str) -> None:
    """mkfs.xfs: "allowable inode size with <b> byte blocks is between 256 and <b/2>"."""
    block, inode, _ = _sizes(opts)
    if block and inode and 2 * inode > block:
        raise InvalidParameterError(
            f"xfs {what}s {keys.INODE_SIZE}={inode} and {keys.BLOCK_SIZE}={block}: an xfs inode is at most "
            f"half a block; use an {keys.INODE_SIZE} of at most {block // 2} or a larger {keys.BLOCK_SIZE}"
        )


def check_ext(opts: Mapping[str, str], what: str) -> None:
    """What mke2fs refuses in combination, whatever the volume's size: an inode larger than a block
    ("invalid inode size"), an inode ratio that leaves no room beside the inode table, a bigalloc
    cluster smaller than a block, fewer bytes per inode than a cluster (at most one inode per cluster)."""
    block, inode, ratio = _sizes(opts)
    if inode > (block or SMALL_EXT_BLOCK):
        fix = f"at most {block}" if block else f"at most {SMALL_EXT_BLOCK}, or set {keys.BLOCK_SIZE} too"
        raise InvalidParameterError(
            f"{what}s {keys.INODE_SIZE}={inode} and {keys.BLOCK_SIZE}={block or 'unset'}: an inode must fit "
            f"in a block (and mke2fs makes {SMALL_EXT_BLOCK}-byte blocks on a volume under 512 MiB unless "
            f"told otherwise); use an {keys.INODE_SIZE} of {fix}"
        )
    least = 2 * (inode or DEFAULT_INODE)
    if ratio and ratio < least:
        raise InvalidParameterError(
            f"{what} {keys.BYTES_PER_INODE}={ratio}: leaves no room beside inodes of {least // 2} bytes; "
            f"use at least {least}"
        )
    cluster = _cluster(opts)
    _check_cluster(opts, block, what)
    if ratio and cluster and ratio < cluster:
        raise InvalidParameterError(
            f"{what} {keys.BYTES_PER_INODE}={ratio}: a bigalloc filesystem has at most one inode per "
            f"cluster ({cluster} bytes); use at least {cluster}"
        )


def _check_cluster(opts: Mapping[str, str], block: int, what: str) -> None:
    """mke2fs: "The cluster size may not be smaller than the block size." Without blockSize the block
    is the largest mke2fs may pick, DEFAULT_EXT_BLOCK (it picks SMALL_EXT_BLOCK only under 512 MiB)."""
    cluster = int(opts.get(keys.EXT4_CLUSTER_SIZE) or 0)
    if not cluster or cluster >= (block or DEFAULT_EXT_BLOCK):
        return
    why = f"use an {keys.EXT4_CLUSTER_SIZE} of at least {block or DEFAULT_EXT_BLOCK}"
    if not block:
        why = (
            f"mke2fs makes {DEFAULT_EXT_BLOCK}-byte blocks on a volume of 512 MiB or more unless told "
            f"otherwise: {why}, or set {keys.BLOCK_SIZE} too"
        )
    raise InvalidParameterError(
        f"{what}s {keys.EXT4_CLUSTER_SIZE}={cluster} and {keys.BLOCK_SIZE}={block or 'unset'}: a bigalloc "
        f"cluster is at least a block; {why}"
    )


def _cluster(opts: Mapping[str, str]) -> int:
    """The bigalloc cluster size of checked ext4 options (the largest mke2fs may pick when none is
    given: 16 blocks); 0 without bigalloc."""
    if opts.get(keys.EXT4_BIGALLOC, "").lower() != "true":
        return 0
    return int(opts.get(keys.EXT4_CLUSTER_SIZE) or 16 * int(opts.get(keys.BLOCK_SIZE) or DEFAULT_EXT_BLOCK))


MIN_INODES = 16  # fewer leave no room for the reserved inodes and lost+found
MIN_CLUSTERS = 16  # a bigalloc filesystem on fewer clusters has no room for its root directory
JOURNAL_ROOM = 4 * 1024**2  # the journal mke2fs makes on a volume under 256 MiB, at most
SMALL_VOLUME, SMALL_RATIO = 512 * 1024**2, 4096  # under it mke2fs makes an inode per 4 KiB by default


def mkfs_floor(fs_type: str, options: Mapping[str, str]) -> tuple[int, str]:
    """(the least volume size mke2fs makes a filesystem of `fs_type` (one filesystems.check_fs_type
    accepts) with options filesystems.mkfs_argv accepted on, the parameter
    that asks for it); (0, "") for xfs or none. Inode tables take at most half the volume (the rest holds
    what each group needs beside them, and the journal): `numberOfInodes` needs twice the bytes of its
    inodes, or two bigalloc clusters per inode (a group has no more inodes than clusters), and room for
    the journal; `bytesPerInode` or `inodeSize`: _ratio_floor; bigalloc MIN_CLUSTERS clusters. The
    tests hold it against the real mkfs.ext4 and mkfs.ext3."""
    if fs_type.strip().lower() not in ("ext2", "ext3", "ext4"):
        return 0, ""
    _, inode, ratio = _sizes(options)
    cluster, count = _cluster(options), int(options.get(keys.NUMBER_OF_INODES) or 0)
    floors = [
        (
            MIN_CLUSTERS * cluster,
            keys.EXT4_CLUSTER_SIZE if keys.EXT4_CLUSTER_SIZE in options else keys.EXT4_BIGALLOC,
        )
    ]
    if count:
        floors.append(
            (count * 2 * max(inode or DEFAULT_INODE, cluster) + JOURNAL_ROOM, keys.NUMBER_OF_INODES)
        )
    elif ratio or inode:
        floors.append(
            (
                _ratio_floor(ratio or SMALL_RATIO, inode or DEFAULT_INODE),
                keys.BYTES_PER_INODE if ratio else keys.INODE_SIZE,
            )
        )
    return max(floors)


def _ratio_floor(ratio: int, inode: int) -> int:
    """The least volume size with inodes of `inode` bytes, one per `ratio` bytes: room for MIN_INODES of
    them, and for the journal beside their tables. A ratio no larger than the inode can only be
    mke2fs's default for a volume under 512 MiB (SMALL_RATIO): larger ones get a larger ratio."""
    if ratio <= inode:
        return SMALL_VOLUME
    return max(MIN_INODES * ratio, 2 * JOURNAL_ROOM * ratio // (ratio - inode))
