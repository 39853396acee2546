"""ControllerService and GroupControllerService over the FakeBackend: validation, codes, responses."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from csi import failures, keys
from csi._proto import csi_pb2
from csi.backends import base
from csi.capabilities import Capabilities
from csi.controller import ControllerService
from csi.errors import status_for
from csi.filesystems import PAGE_SIZE
from csi.group_controller import GroupControllerService
from csi.inflight import InFlight
from tests.fakes import FAKE_NODE, FAKE_ZONE_KEY, FakeBackend, all_capabilities

AM = csi_pb2.VolumeCapability.AccessMode
Code = grpc.StatusCode
GiB, MiB = base.GiB, base.MiB
CTX: Any = None  # handlers never touch the context: they raise


def mount(mode: Any = AM.SINGLE_NODE_WRITER, fs: str = "") -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(fs_type=fs), access_mode=AM(mode=mode)
    )


def block(mode: Any = AM.SINGLE_NODE_WRITER) -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=AM(mode=mode))


def code_of(call: Callable[[Any, Any], Any], request: Any) -> Code:
    """The gRPC code the interceptor would send for this call (OK when it succeeds)."""
    try:
        call(request, None)
    except Exception as exc:
        return status_for(exc)[0]
    return Code.OK


class Env:
    def __init__(self, **caps: Any) -> None:
        self.backend = FakeBackend(all_capabilities(**caps))
        self.inflight = InFlight()
        capabilities = Capabilities(self.backend.capabilities, serves_controller=True, serves_node=True)
        self.ctl = ControllerService(self.backend, capabilities, self.inflight)
        self.group = GroupControllerService(self.backend, capabilities, self.inflight)

    def create(self, name: str = "pvc-1", **kw: Any) -> csi_pb2.Volume:
        kw.setdefault("volume_capabilities", [mount()])
        return self.ctl.CreateVolume(csi_pb2.CreateVolumeRequest(name=name, **kw), CTX).volume


@pytest.fixture
def env() -> Env:
    return Env()


CREATE_ERRORS = [
    pytest.param({"name": ""}, Code.INVALID_ARGUMENT, id="no-name"),
    pytest.param({"name": "x" * 129}, Code.INVALID_ARGUMENT, id="name-129-bytes"),
    pytest.param({"volume_capabilities": []}, Code.INVALID_ARGUMENT, id="no-capabilities"),
    pytest.param(
        {"volume_capabilities": [mount(AM.MULTI_NODE_MULTI_WRITER)]},
        Code.INVALID_ARGUMENT,
        id="multi-writer-filesystem",
    ),
    pytest.param({"volume_capabilities": [mount(fs="ntfs")]}, Code.INVALID_ARGUMENT, id="unsupported-fs"),
    pytest.param({"parameters": {"bogus": "1"}}, Code.INVALID_ARGUMENT, id="unknown-parameter"),
    pytest.param({"parameters": {keys.FS_TYPE: "zfs"}}, Code.INVALID_ARGUMENT, id="bad-fstype-parameter"),
    pytest.param({"parameters": {keys.BLOCK_SIZE: "1000"}}, Code.INVALID_ARGUMENT, id="block-size-not-pow2"),
    pytest.param(
        {"parameters": {keys.FS_TYPE: "xfs", keys.EXT4_BIGALLOC: "true"}},
        Code.INVALID_ARGUMENT,
        id="ext4-option-on-xfs",
    ),
    pytest.param({"mutable_parameters": {"color": "red"}}, Code.INVALID_ARGUMENT, id="unknown-mutable"),
    pytest.param(
        {"capacity_range": csi_pb2.CapacityRange(required_bytes=10, limit_bytes=5)},
        Code.OUT_OF_RANGE,
        id="required-above-limit",
    ),
    pytest.param(
        {"capacity_range": csi_pb2.CapacityRange(required_bytes=2**63 - 1)},
        Code.OUT_OF_RANGE,
        id="required-int64-max-rounds-past-int64",
    ),
    pytest.param({"name": "pvc\x7f1"}, Code.INVALID_ARGUMENT, id="name-with-del"),
    pytest.param(
        {
            "volume_content_source": csi_pb2.VolumeContentSource(
                snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id="fs-nope")
            )
        },
        Code.NOT_FOUND,
        id="missing-source-snapshot",
    ),
    pytest.param(
        {
            "volume_content_source": csi_pb2.VolumeContentSource(
                volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id="fv-nope")
            )
        },
        Code.NOT_FOUND,
        id="missing-source-volume",
    ),
    pytest.param(
        {
            "accessibility_requirements": csi_pb2.TopologyRequirement(
                requisite=[csi_pb2.Topology(segments={FAKE_ZONE_KEY: "elsewhere"})]
            )
        },
        Code.RESOURCE_EXHAUSTED,
        id="unsatisfiable-topology",
    ),
]


@pytest.mark.parametrize(("fields", "code"), CREATE_ERRORS)
def test_create_volume_rejects(env: Env, fields: dict[str, Any], code: Code) -> None:
    req = {"name": "pvc-1", "volume_capabilities": [mount()], **fields}
    assert code_of(env.ctl.CreateVolume, csi_pb2.CreateVolumeRequest(**req)) == code
    assert env.backend.volumes == {}


# Format parameters NodeStageVolume would refuse for the filesystem it creates (the capability's fs_type,
# else the fsType parameter, else ext4): refused at CreateVolume, naming the parameter and what is allowed.
FORMAT_REFUSED = [
    pytest.param([mount()], {keys.FS_TYPE: "xfs", keys.INODE_SIZE: "128"}, "512 to 2048", id="xfs-inode-128"),
    pytest.param(
        [mount()], {keys.FS_TYPE: "xfs", keys.INODE_SIZE: "4096"}, "512 to 2048", id="xfs-inode-4096"
    ),
    pytest.param([mount()], {"fsType": "XFS", keys.INODE_SIZE: "128"}, "512 to 2048", id="legacy-fstype-key"),
    pytest.param(
        [mount()], {keys.FS_TYPE: "ext4", keys.BLOCK_SIZE: "512"}, f"1024 to {PAGE_SIZE}", id="ext4-block-512"
    ),
    pytest.param([mount()], {keys.BLOCK_SIZE: "512"}, f"1024 to {PAGE_SIZE}", id="default-ext4-block-512"),
    pytest.param(
        [mount()],
        {keys.EXT4_CLUSTER_SIZE: "65536"},
        f"needs {keys.EXT4_BIGALLOC}=true",
        id="cluster-no-bigalloc",
    ),
    pytest.param(
        [mount()],
        {keys.FS_TYPE: "ext3", keys.EXT4_BIGALLOC: "true"},
        "ext4 only, not ext3",
        id="bigalloc-on-ext3",
    ),
    pytest.param(
        [mount()],
        {keys.FS_TYPE: "xfs", keys.BYTES_PER_INODE: "4096"},
        "do not apply to xfs",
        id="ext-only-on-xfs",
    ),
    pytest.param([mount(fs="xfs")], {keys.INODE_SIZE: "128"}, "512 to 2048", id="xfs-from-capability"),
    pytest.param(
        [mount(fs="xfs")],
        {keys.FS_TYPE: "ext4", keys.NUMBER_OF_INODES: "1000"},
        "do not apply to xfs",
        id="capability-fs-wins-over-parameter",
    ),
    pytest.param(
        [mount(), mount(fs="xfs")], {keys.INODE_SIZE: "128"}, "512 to 2048", id="any-mount-capability"
    ),
    pytest.param([block()], {keys.BLOCK_SIZE: "512"}, f"1024 to {PAGE_SIZE}", id="block-only-default-ext4"),
]


@pytest.mark.parametrize(("caps", "params", "allowed"), FORMAT_REFUSED)
def test_create_volume_refuses_format_parameters_the_node_would_refuse(
    env: Env, caps: list[csi_pb2.VolumeCapability], params: dict[str, str], allowed: str
) -> None:
    with pytest.raises(failures.InvalidParameterError) as refused:
        env.create(volume_capabilities=caps, parameters=params)
    code, message = status_for(refused.value)
    assert code == Code.INVALID_ARGUMENT
    key = next(k for k in params if k in keys.FORMAT_KEYS)
    assert "parameter" in message and key in message, message
    assert allowed in message and "volume attribute" not in message, message
    assert env.backend.volumes == {}


@pytest.mark.parametrize(
    ("caps", "params"),
    [
        pytest.param([mount()], {keys.FS_TYPE: "xfs", keys.INODE_SIZE: "512"}, id="xfs-inode-512"),
        pytest.param([mount()], {keys.BLOCK_SIZE: "1024", keys.INODE_SIZE: "128"}, id="ext4-smallest"),
        pytest.param(
            [mount()],
            {keys.EXT4_BIGALLOC: "TRUE", keys.EXT4_CLUSTER_SIZE: "65536"},
            id="bigalloc-with-cluster",
        ),
        pytest.param(
            [mount()], {keys.FS_TYPE: "ext3", keys.EXT4_BIGALLOC: "false"}, id="ext3-bigalloc-false"
        ),
        pytest.param(
            [mount(fs="ext4")], {keys.FS_TYPE: "xfs", keys.BYTES_PER_INODE: "4096"}, id="capability-ext4-wins"
        ),
        pytest.param(
            [block()], {keys.FS_TYPE: "xfs", keys.BLOCK_SIZE: "1024"}, id="block-only-xfs-parameter"
        ),
    ],
)
def test_create_volume_accepts_format_parameters_the_node_accepts(
    env: Env, caps: list[csi_pb2.VolumeCapability], params: dict[str, str]
) -> None:
    vol = env.create(volume_capabilities=caps, parameters=params)
    assert vol.volume_id in env.backend.volumes


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        pytest.param(None, GiB, id="default-1GiB"),
        pytest.param(csi_pb2.CapacityRange(required_bytes=1), MiB, id="rounded-up-to-1MiB"),
        pytest.param(csi_pb2.CapacityRange(required_bytes=5 * MiB + 1), 6 * MiB, id="rounded-to-MiB"),
        pytest.param(csi_pb2.CapacityRange(limit_bytes=10 * MiB), 10 * MiB, id="limit-only-caps-default"),
    ],
)
def test_create_volume_sizes(env: Env, capacity: csi_pb2.CapacityRange | None, expected: int) -> None:
    vol = env.create(capacity_range=capacity)
    assert vol.capacity_bytes == expected


@pytest.mark.parametrize(
    ("required", "limit", "code"),
    [
        pytest.param(GiB, 4 * GiB, Code.OK, id="range-holding-it"),
        pytest.param(0, 0, Code.OK, id="no-range"),
        pytest.param(3 * GiB, 0, Code.ALREADY_EXISTS, id="required-above-it"),
        pytest.param(GiB, GiB, Code.ALREADY_EXISTS, id="limit-below-it"),
    ],
)
def test_a_repeated_create_passes_its_capacity_range_to_the_backend(
    env: Env, required: int, limit: int, code: Code
) -> None:
    first = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB))
    repeat = csi_pb2.CreateVolumeRequest(
        name="pvc-1",
        volume_capabilities=[mount()],
        capacity_range=csi_pb2.CapacityRange(required_bytes=required, limit_bytes=limit),
    )
    assert code_of(env.ctl.CreateVolume, repeat) == code
    assert list(env.backend.volumes) == [first.volume_id]


XFS_FLOOR = 300 * MiB  # mkfs.xfs refuses a smaller device


@pytest.mark.parametrize(
    ("caps", "params", "capacity", "expected"),
    [
        pytest.param([mount(fs="xfs")], {}, 100 * MiB, XFS_FLOOR, id="xfs-capability-raised-to-its-floor"),
        pytest.param([mount()], {keys.FS_TYPE: "xfs"}, 100 * MiB, XFS_FLOOR, id="xfs-parameter-raised"),
        pytest.param([mount(fs="xfs")], {}, 400 * MiB, 400 * MiB, id="xfs-above-its-floor"),
        pytest.param([mount(fs="ext4"), mount(fs="xfs")], {}, MiB, XFS_FLOOR, id="largest-floor-of-all"),
        pytest.param([mount()], {}, 100 * MiB, 100 * MiB, id="ext4-has-no-floor"),
        pytest.param([block()], {keys.FS_TYPE: "xfs"}, 100 * MiB, 100 * MiB, id="block-is-never-formatted"),
    ],
)
def test_create_volume_is_never_too_small_for_its_filesystem(
    env: Env, caps: list[csi_pb2.VolumeCapability], params: dict[str, str], capacity: int, expected: int
) -> None:
    vol = env.create(
        volume_capabilities=caps,
        parameters=params,
        capacity_range=csi_pb2.CapacityRange(required_bytes=capacity),
    )
    assert vol.capacity_bytes == expected


def test_create_volume_limited_below_its_filesystems_floor_is_out_of_range(env: Env) -> None:
    request = csi_pb2.CreateVolumeRequest(
        name="small-xfs",
        volume_capabilities=[mount(fs="xfs")],
        capacity_range=csi_pb2.CapacityRange(required_bytes=100 * MiB, limit_bytes=200 * MiB),
    )
    with pytest.raises(
        failures.OutOfRangeError, match="an xfs filesystem needs a volume of at least 314572800"
    ):
        env.ctl.CreateVolume(request, CTX)
    assert env.backend.volumes == {}


def test_create_volume_limited_to_exactly_its_filesystems_floor_is_that_size(env: Env) -> None:
    vol = env.create(
        volume_capabilities=[mount(fs="xfs")],
        capacity_range=csi_pb2.CapacityRange(limit_bytes=XFS_FLOOR),
    )
    assert vol.capacity_bytes == XFS_FLOOR


def test_create_volume_response_carries_context_topology_and_strips_k8s_keys(env: Env) -> None:
    params = {keys.FS_TYPE: "XFS", keys.PVC_NAME: "data", keys.BLOCK_SIZE: "4096", "type": "gp3"}
    vol = env.create(parameters=params)
    assert dict(vol.volume_context) == {keys.VC_FS_TYPE: "xfs", keys.BLOCK_SIZE: "4096"}
    assert [dict(t.segments) for t in vol.accessible_topology] == [{FAKE_ZONE_KEY: "zone-a"}]
    assert env.backend.options[vol.volume_id].parameters == {"type": "gp3"}
    assert env.backend.options[vol.volume_id].metadata == {keys.PVC_NAME: "data"}, "the claim, apart"


def test_create_volume_is_idempotent_by_name(env: Env) -> None:
    first = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=GiB))
    again = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=GiB))
    assert again.volume_id == first.volume_id
    bigger = csi_pb2.CreateVolumeRequest(
        name="pvc-1",
        volume_capabilities=[mount()],
        capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB),
    )
    assert code_of(env.ctl.CreateVolume, bigger) == Code.ALREADY_EXISTS


def test_create_volume_from_sources_sets_content_source(env: Env) -> None:
    src = env.create("src")
    snap = env.ctl.CreateSnapshot(
        csi_pb2.CreateSnapshotRequest(name="snap", source_volume_id=src.volume_id),
        CTX,
    ).snapshot
    from_snap = env.create(
        "restored",
        volume_content_source=csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snap.snapshot_id)
        ),
    )
    clone = env.create(
        "clone",
        volume_content_source=csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=src.volume_id)
        ),
    )
    assert from_snap.content_source.snapshot.snapshot_id == snap.snapshot_id
    assert clone.content_source.volume.volume_id == src.volume_id
    too_small = csi_pb2.CreateVolumeRequest(
        name="small",
        volume_capabilities=[mount()],
        capacity_range=csi_pb2.CapacityRange(required_bytes=MiB),
        volume_content_source=clone.content_source,
    )
    assert code_of(env.ctl.CreateVolume, too_small) == Code.OUT_OF_RANGE


def test_create_volume_concurrent_duplicate_is_aborted(env: Env) -> None:
    with env.inflight.hold("create:pvc-1"):
        req = csi_pb2.CreateVolumeRequest(name="pvc-1", volume_capabilities=[mount()])
        assert code_of(env.ctl.CreateVolume, req) == Code.ABORTED
        other = csi_pb2.CreateVolumeRequest(name="pvc-2", volume_capabilities=[mount()])
        assert code_of(env.ctl.CreateVolume, other) == Code.OK


def test_unrelated_create_does_not_wait_for_a_slow_one(env: Env) -> None:
    entered, release = threading.Event(), threading.Event()
    original = env.backend.create_volume

    def slow(name: str, options: base.DiskOptions) -> base.Disk:
        if name == "slow":
            entered.set()
            release.wait(5)
        return original(name, options)

    env.backend.create_volume = slow  # type: ignore[method-assign]
    t = threading.Thread(target=env.create, args=("slow",))
    t.start()
    try:
        assert entered.wait(5)
        assert env.create("fast").volume_id
        assert not release.is_set()
    finally:
        release.set()
        t.join()


def test_delete_volume_codes(env: Env) -> None:
    vol = env.create()
    publish = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=vol.volume_id, node_id=FAKE_NODE, volume_capability=mount()
    )
    env.ctl.ControllerPublishVolume(publish, CTX)
    delete = csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id)
    assert code_of(env.ctl.DeleteVolume, delete) == Code.FAILED_PRECONDITION
    env.ctl.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id=FAKE_NODE),
        CTX,
    )
    assert code_of(env.ctl.DeleteVolume, delete) == Code.OK
    assert code_of(env.ctl.DeleteVolume, delete) == Code.OK  # already gone
    assert code_of(env.ctl.DeleteVolume, csi_pb2.DeleteVolumeRequest()) == Code.INVALID_ARGUMENT


PUBLISH_ERRORS = [
    pytest.param({"volume_id": ""}, Code.INVALID_ARGUMENT, id="no-volume-id"),
    pytest.param({"node_id": ""}, Code.INVALID_ARGUMENT, id="no-node-id"),
    pytest.param({"volume_capability": None}, Code.INVALID_ARGUMENT, id="no-capability"),
    pytest.param({"volume_id": "fv-missing"}, Code.NOT_FOUND, id="unknown-volume"),
    pytest.param({"node_id": "node-x"}, Code.NOT_FOUND, id="unknown-node"),
    pytest.param({"readonly": True}, Code.ALREADY_EXISTS, id="republish-other-readonly"),
]


@pytest.mark.parametrize(("fields", "code"), PUBLISH_ERRORS)
def test_publish_rejects(env: Env, fields: dict[str, Any], code: Code) -> None:
    vol = env.create()
    base_req: dict[str, Any] = {
        "volume_id": vol.volume_id,
        "node_id": FAKE_NODE,
        "volume_capability": mount(),
    }
    env.ctl.ControllerPublishVolume(csi_pb2.ControllerPublishVolumeRequest(**base_req), CTX)
    req = csi_pb2.ControllerPublishVolumeRequest(**{**base_req, **fields})
    assert code_of(env.ctl.ControllerPublishVolume, req) == code


def test_publish_is_idempotent_and_limited(env: Env) -> None:
    env.backend.capabilities = all_capabilities(max_volumes_per_node=1)
    a, b = env.create("a"), env.create("b")
    req = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=a.volume_id, node_id=FAKE_NODE, volume_capability=mount()
    )
    first = env.ctl.ControllerPublishVolume(req, CTX)
    assert env.ctl.ControllerPublishVolume(req, CTX) == first
    req_b = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=b.volume_id, node_id=FAKE_NODE, volume_capability=mount()
    )
    assert code_of(env.ctl.ControllerPublishVolume, req_b) == Code.RESOURCE_EXHAUSTED


def test_unpublish_missing_volume_or_not_attached_is_ok(env: Env) -> None:
    vol = env.create()
    for vid in (vol.volume_id, "fv-missing"):
        req = csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid, node_id=FAKE_NODE)
        assert code_of(env.ctl.ControllerUnpublishVolume, req) == Code.OK
    assert code_of(env.ctl.ControllerUnpublishVolume, csi_pb2.ControllerUnpublishVolumeRequest()) == (
        Code.INVALID_ARGUMENT
    )


def test_unpublish_without_node_detaches_everywhere(env: Env) -> None:
    vol = env.create(volume_capabilities=[block(AM.MULTI_NODE_MULTI_WRITER)])
    env.backend.nodes.add("node-2")
    for node in (FAKE_NODE, "node-2"):
        req = csi_pb2.ControllerPublishVolumeRequest(
            volume_id=vol.volume_id, node_id=node, volume_capability=block()
        )
        env.ctl.ControllerPublishVolume(req, CTX)
    env.ctl.ControllerUnpublishVolume(csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id), CTX)
    assert env.backend.volumes[vol.volume_id].attachments == ()


@pytest.mark.parametrize(
    ("caps", "params", "confirmed"),
    [
        pytest.param([mount()], {}, True, id="single-writer-mount"),
        pytest.param([block(AM.SINGLE_NODE_MULTI_WRITER)], {}, True, id="single-node-multi-writer"),
        pytest.param([mount(AM.MULTI_NODE_READER_ONLY)], {}, False, id="multi-node-on-single-node-volume"),
        pytest.param([mount(AM.MULTI_NODE_MULTI_WRITER)], {}, False, id="multi-writer-filesystem"),
        pytest.param([mount(fs="btrfs")], {}, False, id="unsupported-fs"),
        pytest.param([mount()], {"bogus": "1"}, False, id="unknown-parameter"),
        pytest.param([mount(fs="xfs")], {keys.INODE_SIZE: "128"}, False, id="format-parameter-node-refuses"),
        pytest.param([mount(fs="xfs")], {keys.INODE_SIZE: "512"}, True, id="format-parameter-node-accepts"),
    ],
)
def test_validate_volume_capabilities(
    env: Env, caps: list[csi_pb2.VolumeCapability], params: dict[str, str], confirmed: bool
) -> None:
    vol = env.create()
    req = csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=vol.volume_id, volume_capabilities=caps, parameters=params
    )
    resp = env.ctl.ValidateVolumeCapabilities(req, CTX)
    assert resp.HasField("confirmed") is confirmed
    assert bool(resp.message) is not confirmed


def test_validate_volume_capabilities_codes(env: Env) -> None:
    missing = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id="fv-x", volume_capabilities=[mount()])
    assert code_of(env.ctl.ValidateVolumeCapabilities, missing) == Code.NOT_FOUND
    no_caps = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id="fv-x")
    assert code_of(env.ctl.ValidateVolumeCapabilities, no_caps) == Code.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "cap",
    [
        pytest.param(
            csi_pb2.VolumeCapability(access_mode=AM(mode=AM.SINGLE_NODE_WRITER)), id="no-access-type"
        ),
        pytest.param(mount(AM.UNKNOWN), id="access-mode-unknown"),
        pytest.param(
            csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume()), id="no-access-mode"
        ),
        pytest.param(mount(99), id="access-mode-out-of-enum"),
    ],
)
def test_validate_volume_capabilities_refuses_a_malformed_capability(
    env: Env, cap: csi_pb2.VolumeCapability
) -> None:
    """Spec: a malformed capability is INVALID_ARGUMENT, for a volume that exists as for one that does not
    (the request is checked before the lookup); only a well-formed one can be merely unsupported."""
    vol = env.create()
    for vid in (vol.volume_id, "fv-x"):
        req = csi_pb2.ValidateVolumeCapabilitiesRequest(volume_id=vid, volume_capabilities=[mount(), cap])
        assert code_of(env.ctl.ValidateVolumeCapabilities, req) == Code.INVALID_ARGUMENT


def test_list_volumes_pages_and_reports_published_nodes(env: Env) -> None:
    ids = [env.create(f"v{i}").volume_id for i in range(5)]
    env.ctl.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=ids[0], node_id=FAKE_NODE, volume_capability=mount()
        ),
        CTX,
    )
    seen: list[csi_pb2.ListVolumesResponse.Entry] = []
    token = ""
    while True:
        resp = env.ctl.ListVolumes(csi_pb2.ListVolumesRequest(max_entries=2, starting_token=token), CTX)
        seen += resp.entries
        token = resp.next_token
        if not token:
            break
    assert [e.volume.volume_id for e in seen] == ids
    assert list(seen[0].status.published_node_ids) == [FAKE_NODE]
    assert [f.name for f, _ in seen[0].status.ListFields()] == ["published_node_ids"]  # v1.13: no condition
    bad = csi_pb2.ListVolumesRequest(starting_token="not-a-token")
    assert code_of(env.ctl.ListVolumes, bad) == Code.ABORTED


def test_get_capacity_honours_topology(env: Env) -> None:
    resp = env.ctl.GetCapacity(csi_pb2.GetCapacityRequest(), CTX)
    assert resp.available_capacity == env.backend.capacity
    elsewhere = csi_pb2.GetCapacityRequest(
        accessible_topology=csi_pb2.Topology(segments={FAKE_ZONE_KEY: "z9"})
    )
    assert env.ctl.GetCapacity(elsewhere, CTX).available_capacity == 0


def test_snapshot_lifecycle(env: Env) -> None:
    vol = env.create()
    req = csi_pb2.CreateSnapshotRequest(
        name="snap",
        source_volume_id=vol.volume_id,
        parameters={"csi.storage.k8s.io/volumesnapshot/name": "x"},
    )
    snap = env.ctl.CreateSnapshot(req, CTX).snapshot
    assert snap.ready_to_use and snap.size_bytes == vol.capacity_bytes and snap.creation_time.seconds > 0
    (_, params, _, metadata) = next(args[1:] for name, args in env.backend.calls if name == "create_snapshot")
    assert (params, metadata) == ({}, {keys.VOLUMESNAPSHOT_NAME: "x"}), "the VolumeSnapshot's name, apart"
    assert env.ctl.CreateSnapshot(req, CTX).snapshot.snapshot_id == snap.snapshot_id
    other = env.create("other")
    clash = csi_pb2.CreateSnapshotRequest(name="snap", source_volume_id=other.volume_id)
    assert code_of(env.ctl.CreateSnapshot, clash) == Code.ALREADY_EXISTS
    by_source = env.ctl.ListSnapshots(csi_pb2.ListSnapshotsRequest(source_volume_id=vol.volume_id), CTX)
    assert [e.snapshot.snapshot_id for e in by_source.entries] == [snap.snapshot_id]
    unknown = env.ctl.ListSnapshots(csi_pb2.ListSnapshotsRequest(snapshot_id="fs-x"), CTX)
    assert list(unknown.entries) == []
    got = env.ctl.GetSnapshot(csi_pb2.GetSnapshotRequest(snapshot_id=snap.snapshot_id), CTX)
    assert got.snapshot == snap
    delete = csi_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id)
    assert code_of(env.ctl.DeleteSnapshot, delete) == Code.OK
    assert code_of(env.ctl.DeleteSnapshot, delete) == Code.OK
    assert (
        code_of(env.ctl.GetSnapshot, csi_pb2.GetSnapshotRequest(snapshot_id=snap.snapshot_id))
        == Code.NOT_FOUND
    )


@pytest.mark.parametrize(
    ("cap", "node_expansion"),
    [
        pytest.param(mount(), True, id="mount-needs-node-expansion"),
        pytest.param(block(), False, id="block-needs-none"),
        pytest.param(None, True, id="no-capability-assumes-mount"),
    ],
)
def test_expand_volume(env: Env, cap: csi_pb2.VolumeCapability | None, node_expansion: bool) -> None:
    vol = env.create()
    req = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id,
        capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB),
        volume_capability=cap,
    )
    resp = env.ctl.ControllerExpandVolume(req, CTX)
    assert (resp.capacity_bytes, resp.node_expansion_required) == (2 * GiB, node_expansion)
    assert env.backend.volumes[vol.volume_id].size_bytes == 2 * GiB


@pytest.mark.parametrize("target", [GiB, 2 * GiB], ids=["lower-than-current", "equal-to-current"])
def test_expand_retried_with_a_target_not_above_the_current_size_answers_the_current_size(
    env: Env, target: int
) -> None:
    """RecoverVolumeExpansionFailure: after a failed expansion Kubernetes retries with a lower target."""
    vol = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB))
    lower = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=target)
    )
    resp = env.ctl.ControllerExpandVolume(lower, CTX)
    assert resp.capacity_bytes == 2 * GiB
    assert env.backend.volumes[vol.volume_id].size_bytes == 2 * GiB
    # Answered from the volume's recorded size: no backend is ever asked to shrink.
    assert [c for c in env.backend.calls if c[0] == "expand_volume"] == []


@pytest.mark.parametrize("limit", [2 * GiB, 200 * GiB], ids=["limit-above-current", "limit-above-default"])
def test_expand_with_only_a_limit_grows_nothing(env: Env, limit: int) -> None:
    """Spec: required_bytes 0 "is equal to an unspecified field value"; a limit alone asks for no
    growth (not for the backend's default size of a new volume)."""
    vol = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=GiB // 2))
    only_limit = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(limit_bytes=limit)
    )
    assert env.ctl.ControllerExpandVolume(only_limit, CTX).capacity_bytes == GiB // 2
    assert env.backend.volumes[vol.volume_id].size_bytes == GiB // 2
    below = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(limit_bytes=GiB // 4)
    )
    assert code_of(env.ctl.ControllerExpandVolume, below) == Code.OUT_OF_RANGE


def test_expand_volume_codes(env: Env) -> None:
    vol = env.create(capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB))
    smaller = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=GiB)
    )
    assert env.ctl.ControllerExpandVolume(smaller, CTX).capacity_bytes == 2 * GiB, "already large enough"
    shrink = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=GiB, limit_bytes=GiB)
    )
    assert code_of(env.ctl.ControllerExpandVolume, shrink) == Code.OUT_OF_RANGE, "at most 1 GiB: a shrink"
    assert env.backend.volumes[vol.volume_id].size_bytes == 2 * GiB
    missing = csi_pb2.ControllerExpandVolumeRequest(volume_id="fv-x", capacity_range=smaller.capacity_range)
    assert code_of(env.ctl.ControllerExpandVolume, missing) == Code.NOT_FOUND
    no_range = csi_pb2.ControllerExpandVolumeRequest(volume_id=vol.volume_id)
    assert code_of(env.ctl.ControllerExpandVolume, no_range) == Code.INVALID_ARGUMENT


def test_expand_with_a_capability_the_volume_cannot_serve_is_invalid(env: Env) -> None:
    """Spec, ControllerExpandVolume: "Exceeds capabilities" -> INVALID_ARGUMENT; nothing grows."""
    vol = env.create()  # SINGLE_NODE_WRITER
    req = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id,
        capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB),
        volume_capability=block(AM.MULTI_NODE_MULTI_WRITER),
    )
    assert code_of(env.ctl.ControllerExpandVolume, req) == Code.INVALID_ARGUMENT
    assert env.backend.volumes[vol.volume_id].size_bytes == GiB


def test_expand_published_volume_without_online_support_fails(env: Env) -> None:
    env = Env(expand_online=False)
    vol = env.create()
    env.ctl.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=vol.volume_id, node_id=FAKE_NODE, volume_capability=mount()
        ),
        CTX,
    )
    req = csi_pb2.ControllerExpandVolumeRequest(
        volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GiB)
    )
    assert code_of(env.ctl.ControllerExpandVolume, req) == Code.FAILED_PRECONDITION


def test_get_volume_reports_the_volume_and_where_it_is_published(env: Env) -> None:
    vol = env.create()
    publish = csi_pb2.ControllerPublishVolumeRequest(
        volume_id=vol.volume_id, node_id=FAKE_NODE, volume_capability=mount()
    )
    env.ctl.ControllerPublishVolume(publish, CTX)
    resp = env.ctl.ControllerGetVolume(csi_pb2.ControllerGetVolumeRequest(volume_id=vol.volume_id), CTX)
    assert resp.volume.volume_id == vol.volume_id
    assert list(resp.status.published_node_ids) == [FAKE_NODE]
    missing = csi_pb2.ControllerGetVolumeRequest(volume_id="fv-x")
    assert code_of(env.ctl.ControllerGetVolume, missing) == Code.NOT_FOUND


@pytest.mark.parametrize(
    ("params", "code", "after"),
    [
        pytest.param({"iops": "300"}, Code.OK, {"iops": "300"}, id="supported"),
        pytest.param(
            {"iops": "300", "color": "red"}, Code.INVALID_ARGUMENT, {}, id="one-unknown-key-no-change"
        ),
        pytest.param({"tier": "gold"}, Code.INVALID_ARGUMENT, {}, id="bad-value"),
        pytest.param({}, Code.INVALID_ARGUMENT, {}, id="empty-is-invalid"),
    ],
)
def test_modify_volume(env: Env, params: dict[str, str], code: Code, after: dict[str, str]) -> None:
    vol = env.create()
    req = csi_pb2.ControllerModifyVolumeRequest(volume_id=vol.volume_id, mutable_parameters=params)
    assert code_of(env.ctl.ControllerModifyVolume, req) == code
    assert dict(env.backend.volumes[vol.volume_id].parameters) == after


def test_modify_volume_passes_the_resizers_names_apart(env: Env) -> None:
    """--extra-modify-metadata adds the claim's names to mutable_parameters: metadata, not parameters."""
    vol = env.create()
    given = {"iops": "300", keys.PVC_NAME: "db", keys.PV_NAME: "pvc-1"}
    req = csi_pb2.ControllerModifyVolumeRequest(volume_id=vol.volume_id, mutable_parameters=given)
    env.ctl.ControllerModifyVolume(req, CTX)
    (_, params, metadata) = next(args for name, args in env.backend.calls if name == "modify_volume")
    assert (params, metadata) == ({"iops": "300"}, {keys.PVC_NAME: "db", keys.PV_NAME: "pvc-1"})


def test_modify_volume_missing(env: Env) -> None:
    req = csi_pb2.ControllerModifyVolumeRequest(volume_id="fv-x", mutable_parameters={"iops": "1"})
    assert code_of(env.ctl.ControllerModifyVolume, req) == Code.NOT_FOUND
    assert (
        code_of(env.ctl.ControllerModifyVolume, csi_pb2.ControllerModifyVolumeRequest())
        == Code.INVALID_ARGUMENT
    )


@pytest.mark.parametrize(
    ("caps", "rpc", "req"),
    [
        pytest.param(
            {"snapshots": False},
            "CreateSnapshot",
            csi_pb2.CreateSnapshotRequest(name="s", source_volume_id="v"),
            id="snapshots-off",
        ),
        pytest.param(
            {"expand_online": False, "expand_offline": False},
            "ControllerExpandVolume",
            csi_pb2.ControllerExpandVolumeRequest(volume_id="v"),
            id="expand-off",
        ),
        pytest.param(
            {"modify_volume": False},
            "ControllerModifyVolume",
            csi_pb2.ControllerModifyVolumeRequest(volume_id="v"),
            id="modify-off",
        ),
        pytest.param({"get_capacity": False}, "GetCapacity", csi_pb2.GetCapacityRequest(), id="capacity-off"),
    ],
)
def test_disabled_capabilities_are_unimplemented(caps: dict[str, Any], rpc: str, req: Any) -> None:
    env = Env(**caps)
    assert code_of(getattr(env.ctl, rpc), req) == Code.UNIMPLEMENTED


def test_controller_capabilities_advertise_single_node_multi_writer(env: Env) -> None:
    resp = env.ctl.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest(), CTX)
    rpcs = {c.rpc.type for c in resp.capabilities}
    RPC = csi_pb2.ControllerServiceCapability.RPC
    assert {RPC.SINGLE_NODE_MULTI_WRITER, RPC.MODIFY_VOLUME, RPC.GET_VOLUME_HEALTH, RPC.CLONE_VOLUME} <= rpcs
    assert RPC.LIST_VOLUME_HEALTH in rpcs


# ---- group snapshots


def test_group_snapshot_lifecycle(env: Env) -> None:
    ids = [env.create(f"v{i}").volume_id for i in range(3)]
    req = csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=ids)
    group = env.group.CreateVolumeGroupSnapshot(req, CTX).group_snapshot
    assert sorted(s.source_volume_id for s in group.snapshots) == sorted(ids)
    assert {s.group_snapshot_id for s in group.snapshots} == {group.group_snapshot_id}
    assert len({s.creation_time.ToNanoseconds() for s in group.snapshots}) == 1
    assert env.group.CreateVolumeGroupSnapshot(req, CTX).group_snapshot == group
    clash = csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=ids[:2])
    assert code_of(env.group.CreateVolumeGroupSnapshot, clash) == Code.ALREADY_EXISTS
    member = csi_pb2.DeleteSnapshotRequest(snapshot_id=group.snapshots[0].snapshot_id)
    assert code_of(env.ctl.DeleteSnapshot, member) == Code.INVALID_ARGUMENT
    get = csi_pb2.GetVolumeGroupSnapshotRequest(group_snapshot_id=group.group_snapshot_id)
    assert env.group.GetVolumeGroupSnapshot(get, CTX).group_snapshot == group
    wrong = csi_pb2.DeleteVolumeGroupSnapshotRequest(
        group_snapshot_id=group.group_snapshot_id, snapshot_ids=["x"]
    )
    assert code_of(env.group.DeleteVolumeGroupSnapshot, wrong) == Code.INVALID_ARGUMENT
    delete = csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group.group_snapshot_id)
    assert code_of(env.group.DeleteVolumeGroupSnapshot, delete) == Code.OK
    assert code_of(env.group.DeleteVolumeGroupSnapshot, delete) == Code.OK
    assert env.backend.snapshots == {}
    assert code_of(env.group.GetVolumeGroupSnapshot, get) == Code.NOT_FOUND


@pytest.mark.parametrize(
    ("req", "code"),
    [
        pytest.param(
            csi_pb2.CreateVolumeGroupSnapshotRequest(source_volume_ids=["a"]),
            Code.INVALID_ARGUMENT,
            id="no-name",
        ),
        pytest.param(
            csi_pb2.CreateVolumeGroupSnapshotRequest(name="g"), Code.INVALID_ARGUMENT, id="no-volumes"
        ),
        pytest.param(
            csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=["fv-x"]),
            Code.NOT_FOUND,
            id="unknown-volume",
        ),
    ],
)
def test_create_group_snapshot_rejects(env: Env, req: Any, code: Code) -> None:
    assert code_of(env.group.CreateVolumeGroupSnapshot, req) == code


def test_group_rpcs_unimplemented_when_backend_lacks_them() -> None:
    env = Env(group_snapshots=False)
    req = csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=["a"])
    assert code_of(env.group.CreateVolumeGroupSnapshot, req) == Code.UNIMPLEMENTED


def test_publish_to_a_second_node_needs_a_multi_node_volume(env: Env) -> None:
    env.backend.nodes.add("node-2")
    single = env.create("single")
    multi = env.create("multi", volume_capabilities=[block(AM.MULTI_NODE_MULTI_WRITER)])
    for vol, second_code in ((single, Code.FAILED_PRECONDITION), (multi, Code.OK)):
        for node, code in ((FAKE_NODE, Code.OK), ("node-2", second_code)):
            req = csi_pb2.ControllerPublishVolumeRequest(
                volume_id=vol.volume_id, node_id=node, volume_capability=block()
            )
            assert code_of(env.ctl.ControllerPublishVolume, req) == code, (vol.volume_id, node)


def test_list_snapshots_pages_and_rejects_foreign_tokens(env: Env) -> None:
    vol = env.create()
    ids = [
        env.ctl.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name=f"s{i}", source_volume_id=vol.volume_id), CTX
        ).snapshot.snapshot_id
        for i in range(3)
    ]
    first = env.ctl.ListSnapshots(csi_pb2.ListSnapshotsRequest(max_entries=2), CTX)
    rest = env.ctl.ListSnapshots(csi_pb2.ListSnapshotsRequest(starting_token=first.next_token), CTX)
    assert [e.snapshot.snapshot_id for e in (*first.entries, *rest.entries)] == ids
    assert rest.next_token == ""
    bad = csi_pb2.ListSnapshotsRequest(starting_token="nope")
    assert code_of(env.ctl.ListSnapshots, bad) == Code.ABORTED
    assert (
        code_of(env.ctl.ListSnapshots, csi_pb2.ListSnapshotsRequest(max_entries=-1)) == Code.INVALID_ARGUMENT
    )
