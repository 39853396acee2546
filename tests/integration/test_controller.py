"""The controller and group controller over a real unix socket: the driver runs as a subprocess with
the local backend, and every check looks at both the gRPC answers and the files in the data dir."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from tests.conformance.driver import NODE_ID, Driver, running_driver
from tests.csiclient import CsiClient, assert_code, connect

AM = csi_pb2.VolumeCapability.AccessMode
Code = grpc.StatusCode
MiB, GiB = 1024**2, 1024**3
MOUNT = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)
BLOCK = csi_pb2.VolumeCapability(
    block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


@pytest.fixture
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ctl-") as d:  # short: unix socket paths are limited
        yield Path(d)


@pytest.fixture
def driver(workdir: Path) -> Iterator[Driver]:
    with running_driver(workdir, "--mode", "controller") as d:
        yield d


@pytest.fixture
def client(driver: Driver) -> Iterator[CsiClient]:
    c = connect(driver.endpoint)
    yield c
    c.close()


def create(c: CsiClient, name: str, size: int = 16 * MiB, **kw: object) -> csi_pb2.Volume:
    req = csi_pb2.CreateVolumeRequest(
        name=name,
        volume_capabilities=[kw.pop("cap", MOUNT)],  # type: ignore[list-item]
        capacity_range=csi_pb2.CapacityRange(required_bytes=size),
        **kw,  # type: ignore[arg-type]
    )
    response: csi_pb2.CreateVolumeResponse = c.controller.CreateVolume(req, timeout=30)
    return response.volume


def volume_file(driver: Driver, volume_id: str) -> Path:
    return driver.data_dir / "volumes" / f"{volume_id}.img"


def test_full_controller_journey(driver: Driver, client: CsiClient) -> None:
    c = client.controller
    vol = create(client, "pvc-data", parameters={"csi.storage.k8s.io/fstype": "ext4"})
    path = volume_file(driver, vol.volume_id)
    assert path.stat().st_size == 16 * MiB and dict(vol.volume_context) == {"fsType": "ext4"}
    with open(path, "r+b") as f:
        f.write(b"journey")

    pub = c.ControllerPublishVolume(
        csi_pb2.ControllerPublishVolumeRequest(
            volume_id=vol.volume_id, node_id=NODE_ID, volume_capability=MOUNT
        )
    )
    assert Path(pub.publish_context["volumeFile"]) == path
    listed = {e.volume.volume_id: e for e in c.ListVolumes(csi_pb2.ListVolumesRequest()).entries}
    assert list(listed[vol.volume_id].status.published_node_ids) == [NODE_ID]

    grown = c.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=32 * MiB)
        )
    )
    assert grown.capacity_bytes == 32 * MiB and grown.node_expansion_required
    assert path.stat().st_size == 32 * MiB

    snap = c.CreateSnapshot(
        csi_pb2.CreateSnapshotRequest(name="snap-1", source_volume_id=vol.volume_id)
    ).snapshot
    restored = create(
        client,
        "pvc-restored",
        size=64 * MiB,
        volume_content_source=csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snap.snapshot_id)
        ),
    )
    assert restored.content_source.snapshot.snapshot_id == snap.snapshot_id
    assert volume_file(driver, restored.volume_id).read_bytes()[:7] == b"journey"
    clone = create(
        client,
        "pvc-clone",
        size=32 * MiB,
        cap=BLOCK,
        volume_content_source=csi_pb2.VolumeContentSource(
            volume=csi_pb2.VolumeContentSource.VolumeSource(volume_id=vol.volume_id)
        ),
    )
    assert volume_file(driver, clone.volume_id).read_bytes()[:7] == b"journey"

    group = client.group.CreateVolumeGroupSnapshot(
        csi_pb2.CreateVolumeGroupSnapshotRequest(name="g", source_volume_ids=[vol.volume_id, clone.volume_id])
    ).group_snapshot
    assert len(group.snapshots) == 2

    assert_code(
        c.DeleteVolume,
        csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id),
        Code.FAILED_PRECONDITION,
        contains=NODE_ID,
    )
    c.ControllerUnpublishVolume(
        csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vol.volume_id, node_id=NODE_ID)
    )
    client.group.DeleteVolumeGroupSnapshot(
        csi_pb2.DeleteVolumeGroupSnapshotRequest(group_snapshot_id=group.group_snapshot_id)
    )
    c.DeleteSnapshot(csi_pb2.DeleteSnapshotRequest(snapshot_id=snap.snapshot_id))
    for v in (vol, restored, clone):
        c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=v.volume_id))
    assert driver.files("volumes") == []
    assert driver.files("snapshots") == []


@pytest.mark.parametrize(
    ("rpc", "request_", "code"),
    [
        pytest.param(
            "DeleteVolume",
            csi_pb2.DeleteVolumeRequest(volume_id="../../etc/passwd"),
            Code.OK,
            id="delete-path-traversal-id-is-a-no-op",
        ),
        pytest.param(
            "ControllerGetVolume",
            csi_pb2.ControllerGetVolumeRequest(volume_id="lv-\0"),
            Code.INVALID_ARGUMENT,
            id="nul-in-id",
        ),
        pytest.param(
            "ControllerPublishVolume",
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id="../x", node_id=NODE_ID, volume_capability=MOUNT
            ),
            Code.NOT_FOUND,
            id="publish-traversal",
        ),
        pytest.param(
            "ListVolumes",
            csi_pb2.ListVolumesRequest(starting_token="bogus"),
            Code.ABORTED,
            id="foreign-token",
        ),
        pytest.param(
            "ListVolumes",
            csi_pb2.ListVolumesRequest(starting_token="lvt-99999"),
            Code.ABORTED,
            id="volume-token-never-issued",
        ),
        pytest.param(
            "ListSnapshots",
            csi_pb2.ListSnapshotsRequest(starting_token="lst-99999"),
            Code.ABORTED,
            id="snapshot-token-never-issued",
        ),
        pytest.param(
            "CreateVolume",
            csi_pb2.CreateVolumeRequest(name="v", volume_capabilities=[MOUNT], parameters={"shiny": "yes"}),
            Code.INVALID_ARGUMENT,
            id="unknown-parameter",
        ),
        pytest.param(
            "CreateVolume",
            csi_pb2.CreateVolumeRequest(name="n" * 129, volume_capabilities=[MOUNT]),
            Code.INVALID_ARGUMENT,
            id="name-too-long",
        ),
        *(
            pytest.param(
                "CreateVolume",
                csi_pb2.CreateVolumeRequest(name="v", volume_capabilities=[MOUNT], parameters=params),
                Code.INVALID_ARGUMENT,
                id=f"mkfs-option-nodestage-refuses-{name}",
            )
            for name, params in [
                ("xfs-inode-128", {"fsType": "xfs", "inodeSize": "128"}),
                ("xfs-inode-4096", {"fsType": "xfs", "inodeSize": "4096"}),
                ("ext4-block-512", {"fsType": "ext4", "blockSize": "512"}),
                ("cluster-without-bigalloc", {"ext4ClusterSize": "65536"}),
            ]
        ),
    ],
)
def test_error_codes_over_the_wire(
    driver: Driver, client: CsiClient, rpc: str, request_: object, code: Code
) -> None:
    call = getattr(client.controller, rpc)
    if code == Code.OK:
        call(request_, timeout=10)
    else:
        assert_code(call, request_, code)
    assert driver.files("volumes") == []
    assert not (driver.data_dir.parent / "etc").exists()


EXT4 = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(fs_type="ext4"), access_mode=AM(mode=AM.SINGLE_NODE_WRITER)
)


@pytest.mark.parametrize(
    ("rpc", "fields", "contains"),
    [
        pytest.param(
            "CreateVolume",
            {"capacity_range": csi_pb2.CapacityRange(required_bytes=GiB, limit_bytes=-5)},
            "capacity_range.limit_bytes must not be negative",
            id="negative-limit",
        ),
        pytest.param(
            "CreateVolume",
            {"capacity_range": csi_pb2.CapacityRange(required_bytes=-1)},
            "capacity_range.required_bytes must not be negative",
            id="negative-required",
        ),
        pytest.param("CreateVolume", {"parameters": {"": "v"}}, "local backend: ''", id="empty-key"),
        pytest.param(
            "CreateVolume",
            {"parameters": {"a\nb\x00": "v"}},
            r"local backend: 'a\nb\x00'",
            id="newline-nul-key",
        ),
        pytest.param(
            "CreateSnapshot",
            {"parameters": {"\n": "v"}},
            r"snapshot parameter(s) for the local backend: '\n'",
            id="snapshot-key",
        ),
        pytest.param(
            "CreateVolumeGroupSnapshot",
            {"parameters": {"": "v"}},
            "group snapshot parameter(s) for the local backend: ''",
            id="group-key",
        ),
    ],
)
def test_a_refusal_says_what_to_fix(
    client: CsiClient, rpc: str, fields: dict[str, Any], contains: str
) -> None:
    vid = create(client, "source").volume_id
    requests: dict[str, Callable[[], Any]] = {
        "CreateVolume": lambda: csi_pb2.CreateVolumeRequest(name="v", volume_capabilities=[EXT4], **fields),
        "CreateSnapshot": lambda: csi_pb2.CreateSnapshotRequest(name="s", source_volume_id=vid, **fields),
        "CreateVolumeGroupSnapshot": lambda: csi_pb2.CreateVolumeGroupSnapshotRequest(
            name="g", source_volume_ids=[vid], **fields
        ),
    }
    request = requests[rpc]()
    stub = client.group if rpc == "CreateVolumeGroupSnapshot" else client.controller
    message = assert_code(getattr(stub, rpc), request, Code.INVALID_ARGUMENT, contains=contains)
    assert "\n" not in message and "\x00" not in message


def test_a_repeated_create_names_what_differs_in_request_terms(client: CsiClient) -> None:
    create(client, "pvc", parameters={"csi.storage.k8s.io/fstype": "ext4"})
    multi = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=AM(mode=AM.MULTI_NODE_MULTI_WRITER)
    )
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"cap": multi, "parameters": {"csi.storage.k8s.io/fstype": "ext4"}},
            "asks for a multi-node access mode",
        ),
        (
            {"parameters": {"csi.storage.k8s.io/fstype": "xfs"}},
            "asks for fs type 'xfs' (the volume was made with 'ext4')",
        ),
        (
            {"parameters": {"csi.storage.k8s.io/fstype": "ext4", "blockSize": "4096"}},
            "parameter 'blockSize' '4096'",
        ),
    ]
    for kw, says in cases:
        with pytest.raises(grpc.RpcError) as refused:
            create(client, "pvc", size=300 * MiB, **kw)
        assert refused.value.code() == Code.ALREADY_EXISTS
        assert says in (refused.value.details() or ""), refused.value.details()


def test_concurrent_duplicate_creates_make_one_volume(driver: Driver, client: CsiClient) -> None:
    def attempt(_: int) -> str:
        try:
            return create(client, "same-name").volume_id
        except grpc.RpcError as err:
            assert err.code() == Code.ABORTED, err
            return ""

    with futures.ThreadPoolExecutor(8) as pool:
        ids = {i for i in pool.map(attempt, range(32)) if i}
    assert len(ids) == 1
    assert driver.files("volumes") == [f"{ids.pop()}.img"]


def test_a_token_stays_valid_after_its_volumes_are_deleted(client: CsiClient) -> None:
    """A token names the last volume of its page, which may be deleted before the next call: it still
    continues the listing (from the volumes after it), while one past every seq issued is ABORTED."""
    c = client.controller
    vols = [create(client, f"pvc-{i}") for i in range(3)]
    token = c.ListVolumes(csi_pb2.ListVolumesRequest(max_entries=2)).next_token
    for v in vols[:2]:
        c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=v.volume_id))
    rest = c.ListVolumes(csi_pb2.ListVolumesRequest(starting_token=token))
    assert [e.volume.volume_id for e in rest.entries] == [vols[2].volume_id]
    c.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vols[2].volume_id))
    assert not c.ListVolumes(csi_pb2.ListVolumesRequest(starting_token="lvt-3")).entries
    assert_code(c.ListVolumes, csi_pb2.ListVolumesRequest(starting_token="lvt-4"), Code.ABORTED)


HERE = csi_pb2.Topology(segments={"topology.kubernetes.io/zone": "local"})  # the driver's default zone
ELSEWHERE = csi_pb2.Topology(segments={"topology.kubernetes.io/zone": "other"})


@pytest.mark.parametrize(
    ("requirements", "refused"),
    [
        pytest.param(csi_pb2.TopologyRequirement(requisite=[HERE]), False, id="requisite-here"),
        pytest.param(
            csi_pb2.TopologyRequirement(requisite=[ELSEWHERE, HERE]), False, id="requisite-includes-here"
        ),
        pytest.param(csi_pb2.TopologyRequirement(preferred=[ELSEWHERE]), False, id="preferred-elsewhere"),
        pytest.param(csi_pb2.TopologyRequirement(requisite=[ELSEWHERE]), True, id="requisite-elsewhere"),
    ],
)
def test_a_repeated_create_returns_the_volume_only_where_the_requisite_allows(
    driver: Driver, client: CsiClient, requirements: csi_pb2.TopologyRequirement, refused: bool
) -> None:
    """Spec: an existing volume that is not "accessible from accessibility_requirements" is ALREADY_EXISTS;
    a fresh name with the same requisite stays RESOURCE_EXHAUSTED (nowhere to place it)."""
    first = create(client, "v1")
    if refused:
        again = csi_pb2.CreateVolumeRequest(
            name="v1",
            volume_capabilities=[MOUNT],
            capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
            accessibility_requirements=requirements,
        )
        message = assert_code(client.controller.CreateVolume, again, Code.ALREADY_EXISTS, contains="'v1'")
        assert first.volume_id in message and "accessibility_requirements" in message
        fresh = csi_pb2.CreateVolumeRequest(
            name="v2", volume_capabilities=[MOUNT], accessibility_requirements=requirements
        )
        assert_code(client.controller.CreateVolume, fresh, Code.RESOURCE_EXHAUSTED)
    else:
        assert create(client, "v1", accessibility_requirements=requirements).volume_id == first.volume_id
    assert driver.files("volumes") == [f"{first.volume_id}.img"]


def test_state_survives_a_restart_and_a_vanished_file_is_inaccessible(workdir: Path) -> None:
    with running_driver(workdir, "--mode", "controller") as d:
        c = connect(d.endpoint)
        keep = create(c, "keep")
        lost = create(c, "lost")
        c.controller.ControllerPublishVolume(
            csi_pb2.ControllerPublishVolumeRequest(
                volume_id=keep.volume_id, node_id=NODE_ID, volume_capability=MOUNT
            )
        )
        c.close()
    volume_file(d, lost.volume_id).unlink()
    with running_driver(workdir, "--mode", "controller") as d2:
        c = connect(d2.endpoint)
        entries = {
            e.volume.volume_id: e for e in c.controller.ListVolumes(csi_pb2.ListVolumesRequest()).entries
        }
        assert set(entries) == {keep.volume_id, lost.volume_id}
        assert list(entries[keep.volume_id].status.published_node_ids) == [NODE_ID]
        got = c.controller.ControllerGetVolumeHealth(
            csi_pb2.ControllerGetVolumeHealthRequest(volume_id=lost.volume_id)
        ).volume_health
        assert [(e.status, e.reason) for e in got.health_statuses] == [
            (csi_pb2.INACCESSIBLE, "BackingFileMissing")
        ]
        listed = c.controller.ControllerListVolumeHealth(csi_pb2.ControllerListVolumeHealthRequest())
        assert [e.volume_id for e in listed.entries] == [lost.volume_id]
        assert create(c, "keep").volume_id == keep.volume_id
        c.close()


def test_capacity_and_topology_flags(workdir: Path) -> None:
    with running_driver(
        workdir, "--mode", "controller", "--capacity", "64Mi", "--zone", "z1", "--region", "r1"
    ) as d:
        c = connect(d.endpoint)
        cap = c.controller.GetCapacity(csi_pb2.GetCapacityRequest())
        assert cap.available_capacity == 64 * MiB
        vol = create(c, "placed", size=48 * MiB)
        assert dict(vol.accessible_topology[0].segments) == {
            "topology.local.csi.ballast.dev/zone": "z1",
            "topology.local.csi.ballast.dev/region": "r1",
        }
        assert c.controller.GetCapacity(csi_pb2.GetCapacityRequest()).available_capacity == 16 * MiB
        full = csi_pb2.CreateVolumeRequest(
            name="too-big",
            volume_capabilities=[MOUNT],
            capacity_range=csi_pb2.CapacityRange(required_bytes=GiB),
        )
        assert_code(c.controller.CreateVolume, full, Code.RESOURCE_EXHAUSTED)
        elsewhere = csi_pb2.CreateVolumeRequest(
            name="elsewhere",
            volume_capabilities=[MOUNT],
            capacity_range=csi_pb2.CapacityRange(required_bytes=MiB),
            accessibility_requirements=csi_pb2.TopologyRequirement(
                requisite=[csi_pb2.Topology(segments={"topology.local.csi.ballast.dev/zone": "z2"})]
            ),
        )
        assert_code(c.controller.CreateVolume, elsewhere, Code.RESOURCE_EXHAUSTED, contains="topology")
        c.close()


def test_snapshot_accessibility_over_the_socket(workdir: Path) -> None:
    """What csi-sanity's snapshot accessibility spec checks (conftest.SKIPPED_SPECS says why it cannot run
    there), with proto equality: a snapshot made with the node's topology as requisite reports exactly
    that topology, Get/ListSnapshots report it too, and a restore into another zone is RESOURCE_EXHAUSTED."""
    with running_driver(workdir, "--zone", "z1") as d:
        c = connect(d.endpoint)
        here = c.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).accessible_topology
        caps = c.identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest()).capabilities
        Service = csi_pb2.PluginCapability.Service
        assert Service.SNAPSHOT_ACCESSIBILITY_CONSTRAINTS in {cap.service.type for cap in caps}
        wanted = csi_pb2.TopologyRequirement(requisite=[here], preferred=[here])
        vol = create(c, "topo-vol", accessibility_requirements=wanted)
        snap = c.controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(
                name="topo-snap", source_volume_id=vol.volume_id, accessibility_requirements=wanted
            )
        ).snapshot
        assert list(snap.accessible_topology) == [here]
        got = c.controller.GetSnapshot(csi_pb2.GetSnapshotRequest(snapshot_id=snap.snapshot_id)).snapshot
        assert list(got.accessible_topology) == [here]
        elsewhere = csi_pb2.Topology(segments={k: "z2" for k in here.segments})
        assert_code(
            c.controller.CreateSnapshot,
            csi_pb2.CreateSnapshotRequest(
                name="topo-snap-2",
                source_volume_id=vol.volume_id,
                accessibility_requirements=csi_pb2.TopologyRequirement(requisite=[elsewhere]),
            ),
            Code.RESOURCE_EXHAUSTED,
        )
        source = csi_pb2.VolumeContentSource(
            snapshot=csi_pb2.VolumeContentSource.SnapshotSource(snapshot_id=snap.snapshot_id)
        )
        restore = csi_pb2.CreateVolumeRequest(
            name="restored",
            volume_capabilities=[MOUNT],
            capacity_range=csi_pb2.CapacityRange(required_bytes=16 * MiB),
            volume_content_source=source,
            accessibility_requirements=csi_pb2.TopologyRequirement(requisite=[elsewhere]),
        )
        assert_code(c.controller.CreateVolume, restore, Code.RESOURCE_EXHAUSTED, contains="requisite")
        c.close()
