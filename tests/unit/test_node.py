"""NodeService with FakeBackend and FakeRunner: validation before side effects, format decisions,
bounded mkfs concurrency, info and capabilities."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from csi._proto import csi_pb2
from csi.capabilities import NRPC, Capabilities
from csi.config import Config, NodeConfig
from csi.devices import names_node, partition_path
from csi.failures import DriverError, FailedPreconditionError, InvalidParameterError
from csi.inflight import InFlight
from csi.mount import Mounter
from csi.node import NodeService
from csi.staging import Filesystem
from csi.validation import parse_partition
from tests.fake_runner import FakeRunner
from tests.fakes import FAKE_NODE, FAKE_ZONE_KEY, FakeBackend

AccessMode = csi_pb2.VolumeCapability.AccessMode
SNW = AccessMode.SINGLE_NODE_WRITER


class Env:
    def __init__(self, tmp: Path, concurrency: int = 2) -> None:
        self.kubelet = tmp / "kubelet"
        self.kubelet.mkdir()
        self.mountinfo = tmp / "mountinfo"
        self.mountinfo.write_text("1 0 254:0 / / rw - ext4 /dev/vda rw\n")
        self.runner = FakeRunner()
        self.backend = FakeBackend()
        config = Config(node=NodeConfig(kubelet_dir=str(self.kubelet), format_concurrency=concurrency))
        caps = Capabilities(backend=self.backend.capabilities, serves_controller=False, serves_node=True)
        mounter = Mounter(self.runner, syscalls=False, mountinfo_path=str(self.mountinfo))
        self.node = NodeService(self.backend, config, caps, InFlight(), mounter)
        self.volume_id = self.backend.create_volume("v", _options()).id

    def touched(self) -> list[str]:
        """Backend node-side calls, programs run and files created: all must stay empty on rejection."""
        device_calls = [m for m, _ in self.backend.calls if m in ("resolve_device", "release_device")]
        created = [str(p) for p in self.kubelet.rglob("*")]
        return device_calls + self.runner.programs() + created


def _options() -> Any:
    from csi.backends.base import DiskOptions

    return DiskOptions(size_bytes=1024**3)


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def mount_cap(
    fs_type: str = "ext4", flags: Sequence[str] = (), mode: AccessMode.Mode = SNW
) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs_type, mount_flags=list(flags)),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode),
    )


def block_cap() -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(mode=SNW),
    )


# ---------------------------------------------------------------- adversarial requests

GOOD_STAGING = "plugins/v/globalmount"
GOOD_TARGET = "pods/p/volumes/v/mount"

BAD_REQUESTS = [
    pytest.param({"staging": "relative/path"}, "absolute", id="relative-staging"),
    pytest.param({"staging": "{k}/plugins/../../../etc"}, "'..'", id="dotdot-staging"),
    pytest.param({"staging": "/etc/ballast"}, "outside", id="staging-outside-roots"),
    pytest.param({"staging": "{k}/plugins//x"}, "normalised", id="unnormalised"),
    pytest.param({"flags": ["exec;rm -rf /"]}, "not allowed", id="flag-shell-injection"),
    pytest.param({"flags": ["bogus"]}, "not allowed", id="flag-unknown"),
    pytest.param({"flags": ["ro,suid"]}, "not allowed", id="flag-suid-hidden-after-comma"),
    pytest.param({"fs_type": "btrfs"}, "not supported", id="fs-btrfs"),
    pytest.param({"fs_type": "ext4;reboot"}, "not supported", id="fs-injection"),
    pytest.param({"context": {"fsType": "ntfs"}}, "not supported", id="fs-from-context"),
    pytest.param({"context": {"partition": "-1"}}, "partition", id="partition-negative"),
    pytest.param({"context": {"partition": "1; rm"}}, "partition", id="partition-injection"),
    pytest.param({"context": {"partition": "999"}}, "partition", id="partition-too-big"),
    pytest.param({"context": {"partition": "01"}}, "partition", id="partition-leading-zero"),
    pytest.param({"context": {"partition": "x"}}, "partition", id="partition-word"),
    pytest.param({"volume_id": ""}, "volume_id", id="no-volume-id"),
    pytest.param({"volume_id": "v\x011"}, "control", id="volume-id-control-chars"),
    pytest.param({"no_cap": True}, "volume_capability", id="no-capability"),
]
STAGE_ONLY = [
    pytest.param({"context": {"blockSize": "4096 -O x"}}, "blockSize", id="mkfs-option-injection"),
    pytest.param({"context": {"inodeSize": "7"}}, "inodeSize", id="mkfs-option-out-of-range"),
]
PUBLISH_ONLY = [
    pytest.param({"target": "relative/target"}, "absolute", id="relative-target"),
    pytest.param({"target": "{k}/pods/../../escape"}, "'..'", id="dotdot-target"),
    pytest.param({"target": "/srv/target"}, "outside", id="target-outside-roots"),
    pytest.param({"target": "{k}/plugins/v/globalmount"}, "differ", id="target-is-staging"),
]


def _paths(env: Env, spec: dict[str, Any]) -> tuple[str, str]:
    k = str(env.kubelet)
    staging = spec.get("staging", f"{k}/{GOOD_STAGING}").replace("{k}", k)
    target = spec.get("target", f"{k}/{GOOD_TARGET}").replace("{k}", k)
    return staging, target


@pytest.mark.parametrize(("spec", "message"), BAD_REQUESTS + STAGE_ONLY)
def test_stage_rejects_before_touching_anything(env: Env, spec: dict[str, Any], message: str) -> None:
    staging, _ = _paths(env, spec)
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=spec.get("volume_id", env.volume_id),
        staging_target_path=staging,
        volume_context=spec.get("context", {}),
    )
    if not spec.get("no_cap"):
        request.volume_capability.CopyFrom(mount_cap(spec.get("fs_type", ""), spec.get("flags", ())))
    with pytest.raises(InvalidParameterError, match=message):
        env.node.NodeStageVolume(request, None)  # type: ignore[arg-type]
    assert env.touched() == []


@pytest.mark.parametrize(("spec", "message"), BAD_REQUESTS + PUBLISH_ONLY)
def test_publish_rejects_before_touching_anything(env: Env, spec: dict[str, Any], message: str) -> None:
    staging, target = _paths(env, spec)
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=spec.get("volume_id", env.volume_id),
        staging_target_path=staging,
        target_path=target,
        volume_context=spec.get("context", {}),
    )
    if not spec.get("no_cap"):
        request.volume_capability.CopyFrom(mount_cap(spec.get("fs_type", ""), spec.get("flags", ())))
    with pytest.raises(InvalidParameterError, match=message):
        env.node.NodePublishVolume(request, None)  # type: ignore[arg-type]
    assert env.touched() == []


@pytest.mark.parametrize(
    ("path", "message"),
    [
        pytest.param("", "required", id="empty"),
        pytest.param("relative", "absolute", id="relative"),
        pytest.param("/var/lib/kubelet/../x", "'..'", id="dotdot"),
        pytest.param("/tmp/elsewhere", "outside", id="outside"),
    ],
)
def test_unpublish_and_unstage_reject_bad_paths(env: Env, path: str, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        env.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=env.volume_id, target_path=path),
            None,  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidParameterError, match=message):
        env.node.NodeUnstageVolume(
            csi_pb2.NodeUnstageVolumeRequest(volume_id=env.volume_id, staging_target_path=path),
            None,  # type: ignore[arg-type]
        )
    assert env.touched() == []


def test_block_stage_rejects_filesystem_mount_flags(env: Env) -> None:
    cap = block_cap()
    request = csi_pb2.NodeStageVolumeRequest(
        volume_id=env.volume_id,
        staging_target_path=f"{env.kubelet}/{GOOD_STAGING}",
        volume_capability=cap,
        volume_context={"partition": "abc"},
    )
    with pytest.raises(InvalidParameterError, match="partition"):
        env.node.NodeStageVolume(request, None)  # type: ignore[arg-type]
    assert env.touched() == []


def test_publish_without_staging_path_is_failed_precondition(env: Env) -> None:
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=env.volume_id, target_path=f"{env.kubelet}/{GOOD_TARGET}", volume_capability=mount_cap()
    )
    with pytest.raises(FailedPreconditionError, match="staging_target_path"):
        env.node.NodePublishVolume(request, None)  # type: ignore[arg-type]


def test_publish_of_an_unstaged_volume_is_failed_precondition(env: Env) -> None:
    request = csi_pb2.NodePublishVolumeRequest(
        volume_id=env.volume_id,
        staging_target_path=f"{env.kubelet}/{GOOD_STAGING}",
        target_path=f"{env.kubelet}/{GOOD_TARGET}",
        volume_capability=mount_cap(),
    )
    with pytest.raises(FailedPreconditionError, match="not staged"):
        env.node.NodePublishVolume(request, None)  # type: ignore[arg-type]
    assert not (env.kubelet / GOOD_TARGET).exists()


# ---------------------------------------------------------------- partition attribute


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(None, 0, id="absent"),
        pytest.param("0", 0, id="zero-whole-device"),
        pytest.param("1", 1, id="one"),
        pytest.param("128", 128, id="max"),
    ],
)
def test_parse_partition(value: str | None, expected: int) -> None:
    assert parse_partition({} if value is None else {"partition": value}) == expected


@pytest.mark.parametrize(
    ("device", "number", "expected"),
    [
        pytest.param("/dev/loop3", 1, "/dev/loop3p1", id="loop-gets-p"),
        pytest.param("/dev/nvme1n1", 2, "/dev/nvme1n1p2", id="nvme-gets-p"),
        pytest.param("/dev/xvdf", 1, "/dev/xvdf1", id="xvd-plain"),
        pytest.param("/dev/xvdf", 0, "/dev/xvdf", id="whole-device"),
    ],
)
def test_partition_path(device: str, number: int, expected: str) -> None:
    assert partition_path(device, number) == expected


@pytest.mark.parametrize(
    ("root", "disk_root", "expected"),
    [
        pytest.param("/loop1", "/loop1", True, id="the-disk"),
        pytest.param("/loop1p2", "/loop1", True, id="its-partition"),
        pytest.param("/loop10", "/loop1", False, id="another-disk-with-the-name-as-prefix"),
        pytest.param("/loop10p1", "/loop1", False, id="a-partition-of-that-disk"),
        pytest.param("/loop1p", "/loop1", False, id="no-partition-number"),
        pytest.param("/xvdf1", "/xvdf", True, id="partition-without-p"),
        pytest.param("/xvdfa", "/xvdf", False, id="another-letter-disk"),
        pytest.param("/nvme0n1p1", "/nvme0n1", True, id="nvme-partition"),
        pytest.param("/nvme0n11", "/nvme0n1", False, id="nvme-other-namespace"),
        pytest.param("/", "/loop1", False, id="devtmpfs-root"),
    ],
)
def test_names_node_is_the_disk_or_its_partitions(root: str, disk_root: str, expected: bool) -> None:
    assert names_node(root, disk_root) is expected


# ---------------------------------------------------------------- format decisions


def _device(tmp: Path, size: int = 64 * 1024**2) -> str:
    """A regular file standing in for a block device (the stage helper only reads it)."""
    path = tmp / "disk.img"
    with open(path, "wb") as fh:
        fh.truncate(size)
    return str(path)


def _stage(
    env: Env, device: str, fs_type: str = "ext4", explicit: bool = True, readonly: bool = False
) -> None:
    staging = str(env.kubelet / "plugins" / "s" / "globalmount")
    env.node.stager.stage_filesystem(device, staging, Filesystem(fs_type, explicit, [], readonly, {}))


@pytest.mark.parametrize(
    ("blkid_rc", "blkid_out", "expected_programs"),
    [
        pytest.param(2, "", ["blkid", "mkfs.ext4", "mount"], id="blank-is-formatted"),
        pytest.param(
            0, "TYPE=ext4\n", ["blkid", "e2fsck", "mount"], id="existing-fs-is-checked-not-formatted"
        ),
    ],
)
def test_format_only_when_blank(
    env: Env, tmp_path: Path, blkid_rc: int, blkid_out: str, expected_programs: list[str]
) -> None:
    env.runner.on("blkid", returncode=blkid_rc, stdout=blkid_out)
    _stage(env, _device(tmp_path))
    assert env.runner.programs() == expected_programs


@pytest.mark.parametrize(
    ("blkid_out", "fs_type", "explicit", "message"),
    [
        pytest.param("PTTYPE=gpt\n", "ext4", True, "partition table", id="partition-table"),
        pytest.param("TYPE=xfs\n", "ext4", True, "never reformatted", id="other-fs-asked-explicitly"),
        pytest.param("TYPE=swap\n", "ext4", False, "never reformatted", id="swap"),
    ],
)
def test_never_formats_a_used_device(
    env: Env, tmp_path: Path, blkid_out: str, fs_type: str, explicit: bool, message: str
) -> None:
    env.runner.on("blkid", stdout=blkid_out)
    with pytest.raises(FailedPreconditionError, match=message):
        _stage(env, _device(tmp_path), fs_type, explicit)
    assert "mkfs.ext4" not in env.runner.programs() and "mount" not in env.runner.programs()


def test_existing_fs_type_is_used_when_none_was_asked_for(env: Env, tmp_path: Path) -> None:
    env.runner.on("blkid", stdout="TYPE=xfs\n")
    _stage(env, _device(tmp_path), "ext4", explicit=False)
    (mount,) = [c for c in env.runner.calls if c[0] == "mount"]
    assert mount[:5] == ("mount", "-t", "xfs", "-o", "nouuid"), "clones share the source's xfs UUID"


def test_blank_device_staged_readonly_is_not_formatted(env: Env, tmp_path: Path) -> None:
    env.runner.on("blkid", returncode=2)
    with pytest.raises(FailedPreconditionError, match="read-only"):
        _stage(env, _device(tmp_path), readonly=True)
    assert env.runner.programs() == ["blkid"]


def test_readonly_stage_skips_fsck_and_mounts_ro(env: Env, tmp_path: Path) -> None:
    env.runner.on("blkid", stdout="TYPE=ext4\n")
    _stage(env, _device(tmp_path), readonly=True)
    assert env.runner.programs() == ["blkid", "mount"]
    assert env.runner.calls[-1][3:5] == ("-o", "ro")


def test_mkfs_and_fsck_run_at_most_format_concurrency_at_once(tmp_path: Path) -> None:
    env = Env(tmp_path, concurrency=2)
    env.runner.on("blkid", returncode=2)
    lock, running, peak = threading.Lock(), [0], [0]

    def slow(argv: Sequence[str]) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    env.runner.on("mkfs.ext4", effect=slow)
    device = _device(tmp_path)
    errors: list[BaseException] = []

    def stage(i: int) -> None:
        try:
            staging = str(env.kubelet / f"s{i}")
            env.node.stager.stage_filesystem(device, staging, Filesystem("ext4", True, [], False, {}))
        except (DriverError, OSError) as exc:
            errors.append(exc)

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert env.runner.programs().count("mkfs.ext4") == 6
    assert peak[0] == 2


# ---------------------------------------------------------------- info


def test_node_get_info(env: Env) -> None:
    info = env.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), None)  # type: ignore[arg-type]
    assert info.node_id == FAKE_NODE
    assert info.max_volumes_per_node == 16
    assert dict(info.accessible_topology.segments) == {FAKE_ZONE_KEY: "zone-a"}


def test_node_capabilities_include_stage_stats_expand_and_health(env: Env) -> None:
    response = env.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), None)  # type: ignore[arg-type]
    got = {c.rpc.type for c in response.capabilities}
    assert {
        NRPC.STAGE_UNSTAGE_VOLUME,
        NRPC.GET_VOLUME_STATS,
        NRPC.EXPAND_VOLUME,
        NRPC.GET_VOLUME_HEALTH,
        NRPC.GET_STORAGE_HEALTH,
    } <= got


def test_staged_count_reads_the_mount_table(env: Env) -> None:
    assert env.node.staged_count() == 0
    k = env.kubelet
    env.mountinfo.write_text(
        "1 0 254:0 / / rw - ext4 /dev/vda rw\n"
        f"2 1 7:0 / {k}/plugins/a/globalmount rw - ext4 /dev/loop0 rw\n"
        f"3 1 7:0 / {k}/pods/p/volumes/a/mount rw - ext4 /dev/loop0 rw\n"
        f"4 1 7:1 / {k}/plugins/b/globalmount rw - xfs /dev/loop1 rw\n"
        "5 1 7:2 / /mnt/elsewhere rw - ext4 /dev/loop2 rw\n"
    )
    assert env.node.staged_count() == 2, (
        "one per device under the roots; publishes and foreign mounts not counted"
    )


@pytest.mark.parametrize(
    ("never_written", "partition", "expected_programs"),
    [
        pytest.param(
            True, 0, ["mkfs.ext4", "mkfs.ext4", "mount"], id="never-written-is-formatted-unprobed-as-zeroed"
        ),
        pytest.param(False, 0, ["blkid", "mkfs.ext4", "mount"], id="unknown-is-probed-first"),
        pytest.param(True, 1, ["blkid", "mkfs.ext4", "mount"], id="a-partition-is-always-probed"),
    ],
)
def test_only_a_volume_the_backend_proves_never_written_skips_the_probe(
    env: Env,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    never_written: bool,
    partition: int,
    expected_programs: list[str],
) -> None:
    """Format only if blank: blkid may be skipped only when the backend proves no byte of the whole
    volume was written (Backend.never_written); a partition, or a volume it cannot vouch for, is probed.
    Only the proven one is formatted as zeroed (mkfs asked its version, nothing discarded)."""
    from csi import devices

    device = _device(tmp_path)
    Path(devices.partition_path(device, 1)).write_bytes(b"")
    env.backend.devices[env.volume_id] = device
    if never_written:
        env.backend.untouched.add(env.volume_id)
    monkeypatch.setattr(devices, "rdev", lambda path: (7, 0))
    env.runner.on("blkid", returncode=2)
    staging = str(env.kubelet / "plugins" / "s" / "globalmount")
    env.node.stager.stage(env.volume_id, {}, partition, staging, Filesystem("ext4", True, [], False, {}))
    assert env.runner.programs() == expected_programs
    (mkfs,) = [call for call in env.runner.calls if call[0] == "mkfs.ext4" and call[1] != "-V"]
    assert ("nodiscard" in " ".join(mkfs)) is (never_written and partition == 0)
