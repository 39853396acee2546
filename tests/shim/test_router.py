"""Migration router: routing by gates, shared identity and staging layout, the per-volume lock, flips and
rollback, with fake paths; and the legacy path against FakeBackend and a fake mount layer."""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from csi.backends.base import FailedPreconditionError
from csi.errors import InvalidArgument
from csi.migration import DeviceError, LegacyPath, partition_device
from csi.mount import MountInfo, Probe
from shim.errors import TranslationError
from shim.gates import FeatureGates
from shim.router import (
    GateSwitch,
    LegacyPathRefused,
    MigrationError,
    MigrationLocks,
    Operation,
    Provisioned,
    ProvisionRequest,
    Route,
    RouteEvent,
    Router,
    Volume,
    VolumeSpec,
    provision_request,
    staging_path,
)
from tests.fakes import FakeBackend

EBS = "kubernetes.io/aws-ebs"
EBS_CSI = "ebs.csi.aws.com"
OFF = ""
ON = "CSIMigration=true,CSIMigrationAWS=true"
COMPLETE = ON + ",InTreePluginAWSUnregister=true"
NODE = "node-1"


def ebs_pv(volume_id: str = "aws://us-east-1a/vol-1", **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "pv-1", "labels": {"topology.kubernetes.io/zone": "us-east-1a"}},
        "spec": {"awsElasticBlockStore": {"volumeID": volume_id, "fsType": "ext4", **extra}},
    }


# --------------------------------------------------------------------------- fakes


@dataclass
class World:
    """Durable state both fake paths share: what is attached, staged, mounted."""

    attached: set[tuple[str, str]] = field(default_factory=set)
    staged: dict[str, str] = field(default_factory=dict)
    mounted: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    active: Counter[str] = field(default_factory=Counter)
    max_active: int = 0
    guard: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, path: str, op: str, key: str) -> None:
        with self.guard:
            self.log.append((path, op, key))
            self.active[key] += 1
            self.max_active = max(self.max_active, self.active[key])

    def leave(self, key: str) -> None:
        with self.guard:
            self.active[key] -= 1


class FakePath:
    """A VolumePath over World; `hold[op]` (an Event) makes that operation wait until it is set."""

    def __init__(self, name: str, world: World) -> None:
        self.name = name
        self.world = world
        self.hold: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}

    def _do(self, op: str, key: str) -> None:
        self.world.enter(self.name, op, key)
        entered = self.entered.get(op)
        if entered is not None:
            entered.set()
        gate = self.hold.get(op)
        if gate is not None:
            assert gate.wait(10), f"{op} was never released"
        time.sleep(0.0005)
        self.world.leave(key)

    def provision(self, driver: str, request: ProvisionRequest) -> Provisioned:
        self._do("provision", request.name)
        self.world.sizes["vol-new"] = request.size_bytes
        return Provisioned("vol-new", request.size_bytes, {"topology.ebs.csi.aws.com/zone": "us-east-1a"})

    def delete(self, volume: Volume) -> None:
        self._do("delete", volume.key)
        self.world.sizes.pop(volume.handle, None)

    def attach(self, volume: Volume, node_id: str) -> dict[str, str]:
        self._do("attach", volume.key)
        self.world.attached.add((volume.handle, node_id))
        return {"devicePath": f"/dev/{volume.handle}"}

    def detach(self, volume: Volume, node_id: str) -> None:
        self._do("detach", volume.key)
        self.world.attached.discard((volume.handle, node_id))

    def mount_device(self, volume: Volume, publish_context: Mapping[str, str], staging: str) -> None:
        self._do("mount_device", volume.key)
        assert publish_context == {"devicePath": f"/dev/{volume.handle}"}
        self.world.staged[staging] = volume.handle

    def unmount_device(self, volume: Volume, staging: str) -> None:
        self._do("unmount_device", volume.key)
        self.world.staged.pop(staging, None)

    def mount(self, volume: Volume, publish_context: Mapping[str, str], staging: str, target: str) -> None:
        self._do("mount", volume.key)
        assert self.world.staged.get(staging) == volume.handle, "mount before mount_device"
        self.world.mounted[target] = volume.handle

    def unmount(self, volume: Volume, target: str) -> None:
        self._do("unmount", volume.key)
        self.world.mounted.pop(target, None)

    def expand(self, volume: Volume, size_bytes: int, staging: str) -> int:
        self._do("expand", volume.key)
        self.world.sizes[volume.handle] = size_bytes
        return size_bytes


@dataclass
class Setup:
    router: Router
    switch: GateSwitch
    world: World
    legacy: FakePath
    csi: FakePath
    events: list[RouteEvent]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    world = World()
    legacy, csi = FakePath("legacy", world), FakePath("csi", world)
    switch = GateSwitch()
    events: list[RouteEvent] = []
    router = Router(
        gates=switch,
        csi=csi,
        legacy={EBS: legacy},
        kubelet_dir=str(tmp_path / "kubelet"),
        locks=MigrationLocks(str(tmp_path / "locks")),
        on_route=events.append,
    )
    return Setup(router, switch, world, legacy, csi, events)


# --------------------------------------------------------------------------- routing


@pytest.mark.parametrize(
    ("gates", "expected"),
    [
        pytest.param(OFF, Route.LEGACY, id="defaults-legacy"),
        pytest.param("CSIMigration=true", Route.LEGACY, id="umbrella-only-legacy"),
        pytest.param("CSIMigrationAWS=true", Route.LEGACY, id="plugin-gate-only-legacy"),
        pytest.param(ON, Route.CSI, id="enabled-csi"),
        pytest.param(COMPLETE, Route.CSI, id="complete-csi"),
        pytest.param(ON + ",CSIMigrationGCE=false", Route.CSI, id="other-plugin-gate-irrelevant"),
    ],
)
def test_route_follows_gates(setup: Setup, gates: str, expected: Route) -> None:
    setup.switch.set(gates)
    assert setup.router.route(EBS) is expected
    setup.router.attach(VolumeSpec.of_pv(ebs_pv()), NODE)
    assert setup.world.log == [(expected.value, "attach", f"{EBS_CSI}/vol-1")]


@pytest.mark.parametrize(
    "gates",
    [
        pytest.param("InTreePluginAWSUnregister=true", id="unregistered-migration-off"),
        pytest.param("CSIMigration=true,InTreePluginAWSUnregister=true", id="unregistered-plugin-gate-off"),
    ],
)
def test_legacy_path_refused_when_plugin_unregistered(setup: Setup, gates: str) -> None:
    setup.switch.set(gates)
    with pytest.raises(LegacyPathRefused, match=r"InTreePluginAWSUnregister=true.*CSIMigrationAWS"):
        setup.router.attach(VolumeSpec.of_pv(ebs_pv()), NODE)
    assert setup.world.log == []
    assert setup.world.attached == set()
    assert len(setup.router.locks) == 0


def test_missing_legacy_path_is_a_clear_error(tmp_path: Path) -> None:
    world = World()
    router = Router(gates=GateSwitch(), csi=FakePath("csi", world), legacy={}, kubelet_dir=str(tmp_path))
    with pytest.raises(MigrationError, match=r"no legacy path is configured for kubernetes\.io/aws-ebs"):
        router.attach(VolumeSpec.of_pv(ebs_pv()), NODE)
    assert world.log == []


def test_spec_without_migratable_source_is_rejected(setup: Setup) -> None:
    nfs = {"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "s", "path": "/"}}}
    with pytest.raises(TranslationError, match="could not find in-tree plugin"):
        setup.router.attach(VolumeSpec.of_pv(nfs), NODE)
    assert setup.world.log == []


# --------------------------------------------------------------------------- identity


@pytest.mark.parametrize(
    ("spec", "volume"),
    [
        pytest.param(
            VolumeSpec.of_pv(ebs_pv()),
            Volume(EBS, EBS_CSI, "vol-1", "ext4", False, {"partition": "0"}),
            id="pv-aws-url-handle",
        ),
        pytest.param(
            VolumeSpec.of_pv(ebs_pv("vol-1", partition=2, readOnly=True)),
            Volume(EBS, EBS_CSI, "vol-1", "ext4", True, {"partition": "2"}),
            id="pv-bare-handle-partition-readonly",
        ),
        pytest.param(
            VolumeSpec.inline({"name": "data", "awsElasticBlockStore": {"volumeID": "aws:///vol-1"}}, "ns"),
            Volume(EBS, EBS_CSI, "vol-1", "", False, {"partition": "0"}),
            id="inline-volume",
        ),
    ],
)
def test_resolve_translates_to_the_backend_volume(setup: Setup, spec: VolumeSpec, volume: Volume) -> None:
    assert setup.router.resolve(spec) == volume


def test_every_handle_form_shares_one_lock_key_and_staging_path(setup: Setup, tmp_path: Path) -> None:
    forms = [
        VolumeSpec.of_pv(ebs_pv("aws://us-east-1a/vol-1")),
        VolumeSpec.of_pv(ebs_pv("vol-1")),
        VolumeSpec.inline({"name": "d", "awsElasticBlockStore": {"volumeID": "aws:///vol-1"}}, "ns"),
    ]
    volumes = [setup.router.resolve(s) for s in forms]
    assert {v.key for v in volumes} == {f"{EBS_CSI}/vol-1"}
    digest = hashlib.sha256(b"vol-1").hexdigest()
    expected = str(tmp_path / "kubelet/plugins/kubernetes.io/csi/ebs.csi.aws.com" / digest / "globalmount")
    assert {setup.router.staging_path(v) for v in volumes} == {expected}
    assert staging_path(str(tmp_path / "kubelet"), EBS_CSI, "vol-1") == expected


# --------------------------------------------------------------------------- flips


def _bring_up(router: Router, spec: VolumeSpec, target: str) -> tuple[dict[str, str], str]:
    context = router.attach(spec, NODE)
    staged = router.mount_device(spec, context)
    router.mount(spec, context, target)
    return context, staged


def _tear_down(router: Router, spec: VolumeSpec, target: str) -> None:
    router.unmount(spec, target)
    router.unmount_device(spec)
    router.detach(spec, NODE)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(OFF, ON, id="migrate-legacy-then-csi"),
        pytest.param(ON, OFF, id="rollback-csi-then-legacy"),
    ],
)
def test_flip_mid_life_undoes_through_the_other_path(setup: Setup, before: str, after: str) -> None:
    spec, target = VolumeSpec.of_pv(ebs_pv()), "/pods/p1/volumes/data"
    setup.switch.set(before)
    _, staged = _bring_up(setup.router, spec, target)
    assert setup.world.attached == {("vol-1", NODE)}
    assert setup.world.staged == {staged: "vol-1"}
    assert setup.world.mounted == {target: "vol-1"}
    setup.switch.set(after)
    _tear_down(setup.router, spec, target)
    assert (setup.world.attached, setup.world.staged, setup.world.mounted) == (set(), {}, {})
    first, second = ("legacy", "csi") if before == OFF else ("csi", "legacy")
    assert [path for path, _, _ in setup.world.log] == [first] * 3 + [second] * 3
    assert [e.operation for e in setup.events] == [
        Operation.ATTACH,
        Operation.MOUNT_DEVICE,
        Operation.MOUNT,
        Operation.UNMOUNT,
        Operation.UNMOUNT_DEVICE,
        Operation.DETACH,
    ]


def test_flip_during_an_operation_neither_repeats_it_nor_overlaps(setup: Setup) -> None:
    """Attach starts on the legacy path and blocks; the gate flips and a detach is issued meanwhile.
    The detach waits for the attach, then runs on the CSI path; the attach ran once, on legacy."""
    spec = VolumeSpec.of_pv(ebs_pv())
    release, entered = threading.Event(), threading.Event()
    setup.legacy.hold["attach"], setup.legacy.entered["attach"] = release, entered
    attacher = threading.Thread(target=setup.router.attach, args=(spec, NODE))
    attacher.start()
    assert entered.wait(5)
    setup.switch.set(ON)
    detacher = threading.Thread(target=setup.router.detach, args=(spec, NODE))
    detacher.start()
    time.sleep(0.2)
    assert setup.world.log == [("legacy", "attach", f"{EBS_CSI}/vol-1")], "detach overtook the attach"
    release.set()
    attacher.join(5)
    detacher.join(5)
    assert setup.world.log == [
        ("legacy", "attach", f"{EBS_CSI}/vol-1"),
        ("csi", "detach", f"{EBS_CSI}/vol-1"),
    ]
    assert setup.world.attached == set()
    assert setup.world.max_active == 1


def test_concurrent_operations_while_flipping_each_run_exactly_once(setup: Setup) -> None:
    spec = VolumeSpec.of_pv(ebs_pv())
    calls: Counter[str] = Counter()
    calls_lock = threading.Lock()
    stop = threading.Event()

    def flipper() -> None:
        on = False
        while not stop.is_set():
            on = not on
            setup.switch.set(ON if on else OFF)
            time.sleep(0.0003)

    def worker(n: int) -> None:
        for i in range(40):
            op = "attach" if (n + i) % 2 else "detach"
            getattr(setup.router, op)(spec, NODE)
            with calls_lock:
                calls[op] += 1

    flip = threading.Thread(target=flipper)
    flip.start()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    stop.set()
    flip.join(5)
    done = Counter(op for _, op, _ in setup.world.log)
    assert done == calls
    assert sum(1 for e in setup.events) == sum(calls.values())
    assert {path for path, _, _ in setup.world.log} == {"legacy", "csi"}, "the flips never took effect"
    assert [(e.route.value, e.operation.value) for e in setup.events] == [
        (path, op) for path, op, _ in setup.world.log
    ]
    assert setup.world.max_active == 1
    assert len(setup.router.locks) == 0


# --------------------------------------------------------------------------- locks


def test_lock_files_serialise_separate_lock_tables(tmp_path: Path) -> None:
    """Two MigrationLocks (as in two processes) on one lock dir exclude each other through flock."""
    first, second = MigrationLocks(str(tmp_path)), MigrationLocks(str(tmp_path))
    order: list[str] = []

    def take_second() -> None:
        with second.hold("ebs.csi.aws.com/vol-1"):
            order.append("second")

    with first.hold("ebs.csi.aws.com/vol-1"):
        waiter = threading.Thread(target=take_second)
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive(), "the second lock table did not wait for the lock file"
        order.append("first")
    waiter.join(5)
    assert order == ["first", "second"]
    assert len(first) == len(second) == 0
    path = first.lock_file("ebs.csi.aws.com/vol-1")
    assert path is not None and os.path.dirname(path) == str(tmp_path)


def test_router_holds_the_lock_file_of_the_volume_during_an_operation(setup: Setup, tmp_path: Path) -> None:
    """Another process (here: another lock table on the same dir) cannot take the volume mid-operation."""
    release, entered = threading.Event(), threading.Event()
    setup.legacy.hold["attach"], setup.legacy.entered["attach"] = release, entered
    attacher = threading.Thread(target=setup.router.attach, args=(VolumeSpec.of_pv(ebs_pv()), NODE))
    attacher.start()
    assert entered.wait(5)
    other = MigrationLocks(str(tmp_path / "locks"))
    path = other.lock_file(f"{EBS_CSI}/vol-1")
    assert path is not None and os.path.exists(path)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        release.set()
        attacher.join(5)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the operation is over
    finally:
        os.close(fd)


def test_unrelated_volumes_do_not_wait(tmp_path: Path) -> None:
    locks = MigrationLocks(str(tmp_path))
    with locks.hold("d/vol-1"):
        done = threading.Event()

        def other() -> None:
            with locks.hold("d/vol-2"):
                done.set()

        t = threading.Thread(target=other)
        t.start()
        assert done.wait(2)
        t.join()
    assert len(locks) == 0


# --------------------------------------------------------------------------- provisioning


@pytest.mark.parametrize(
    ("parameters", "fs_type", "rest", "segments"),
    [
        pytest.param({"fsType": "xfs"}, "xfs", {}, (), id="fsType"),
        pytest.param(
            {"zone": "us-east-1a"}, "", {}, ({"topology.ebs.csi.aws.com/zone": "us-east-1a"},), id="zone"
        ),
        pytest.param(
            {"zones": "us-east-1a,us-east-1b", "type": "gp2"},
            "",
            {"type": "gp2"},
            (
                {"topology.ebs.csi.aws.com/zone": "us-east-1a"},
                {"topology.ebs.csi.aws.com/zone": "us-east-1b"},
            ),
            id="zones-and-backend-parameter",
        ),
    ],
)
def test_legacy_storage_class_parameters_become_a_csi_request(
    setup: Setup,
    parameters: dict[str, str],
    fs_type: str,
    rest: dict[str, str],
    segments: tuple[dict[str, str], ...],
) -> None:
    sc = {"provisioner": EBS, "parameters": parameters}
    csi_sc = setup.router._translator.translate_in_tree_storage_class_to_csi(EBS, sc)
    request = provision_request("pvc-1", 2 << 30, csi_sc)
    assert request == ProvisionRequest("pvc-1", 2 << 30, fs_type, rest, segments)


@pytest.mark.parametrize("gates", [pytest.param(OFF, id="legacy"), pytest.param(ON, id="csi")])
def test_provision_returns_an_in_tree_pv_on_either_path(setup: Setup, gates: str) -> None:
    setup.switch.set(gates)
    sc = {"provisioner": EBS, "parameters": {"fsType": "ext4", "zone": "us-east-1a"}}
    pv = setup.router.provision(EBS, sc, "pvc-1", 1 << 30)
    assert pv["spec"]["awsElasticBlockStore"] == {"volumeID": "vol-new", "fsType": "ext4"}
    assert pv["spec"]["capacity"] == {"storage": str(1 << 30)}
    assert pv["metadata"]["labels"]["topology.kubernetes.io/zone"] == "us-east-1a"
    assert "csi" not in pv["spec"]
    assert setup.world.log == [("csi" if gates else "legacy", "provision", "pvc-1")]
    # the PV it returns is routable again: delete reaches the same volume
    setup.router.delete(VolumeSpec.of_pv(pv))
    assert setup.world.log[-1][1:] == ("delete", f"{EBS_CSI}/vol-new")


# --------------------------------------------------------------------------- legacy path (fake OS)


class FakeMounter:
    """The mount layer's surface used by LegacyPath, over an in-memory mount table."""

    def __init__(self, probe: Probe | None = None) -> None:
        self.table: dict[str, tuple[str, str]] = {}  # mount point -> (source, fs type)
        self.found = probe or Probe()
        self.calls: list[tuple[str, ...]] = []

    def mount_at(self, path: str) -> MountInfo | None:
        if path not in self.table:
            return None
        source, fs = self.table[path]
        return MountInfo(1, 0, 7, 0, "/", path, ("rw",), fs, source, ())

    def mounts(self) -> list[MountInfo]:
        return [info for path in self.table if (info := self.mount_at(path)) is not None]

    def probe(self, device: str) -> Probe:
        self.calls.append(("probe", device))
        return self.found

    def mkfs(self, device: str, fs_type: str, options: Mapping[str, str]) -> None:
        self.calls.append(("mkfs", device, fs_type))
        self.found = Probe(fs_type=fs_type)

    def fsck(self, device: str, fs_type: str) -> None:
        self.calls.append(("fsck", device))

    def settle(self) -> None:
        self.calls.append(("settle",))

    def add_partitions(self, device: str) -> None:
        self.calls.append(("add_partitions", device))

    def mount(self, source: str, target: str, fs_type: str, flags: list[str]) -> None:
        self.calls.append(("mount", source, target, fs_type))
        self.table[target] = (source, fs_type)

    def bind(self, source: str, target: str, flags: list[str]) -> None:
        self.calls.append(("bind", source, target, *flags))
        self.table[target] = self.table[source]

    def unmount(self, target: str) -> bool:
        return self.table.pop(target, None) is not None

    def grow(self, device: str, mount_point: str, fs_type: str) -> None:
        self.calls.append(("grow", device, mount_point))


@dataclass
class Legacy:
    path: LegacyPath
    backend: FakeBackend
    mounter: FakeMounter
    volume: Volume
    staging: str
    target: str


@pytest.fixture
def legacy(tmp_path: Path) -> Legacy:
    backend, mounter = FakeBackend(), FakeMounter()
    path = LegacyPath(backend, mounter, allowed_roots=(str(tmp_path),))  # type: ignore[arg-type]
    created = path.provision(EBS_CSI, ProvisionRequest("pvc-1", 1 << 30, "ext4"))
    volume = Volume(EBS, EBS_CSI, created.handle, "ext4", False, {"partition": "0"})
    staging = staging_path(str(tmp_path), EBS_CSI, created.handle)
    return Legacy(path, backend, mounter, volume, staging, str(tmp_path / "pods/p/volumes/v/mount"))


def test_legacy_stage_formats_a_blank_device_once_and_publish_binds(legacy: Legacy) -> None:
    lp, vol = legacy.path, legacy.volume
    context = lp.attach(vol, NODE)
    lp.mount_device(vol, context, legacy.staging)
    lp.mount_device(vol, context, legacy.staging)  # idempotent
    lp.mount(vol, context, legacy.staging, legacy.target)
    device = f"/dev/fake-{vol.handle}"
    assert [c for c in legacy.mounter.calls if c[0] in ("mkfs", "mount", "bind")] == [
        ("mkfs", device, "ext4"),
        ("mount", device, legacy.staging, "ext4"),
        ("bind", legacy.staging, legacy.target),
    ]
    lp.unmount(vol, legacy.target)
    lp.unmount_device(vol, legacy.staging)
    lp.detach(vol, NODE)
    assert legacy.mounter.table == {}
    assert legacy.backend.released == [vol.handle]
    assert legacy.backend.volumes[vol.handle].attachments == ()
    assert not os.path.exists(legacy.target)
    assert not os.path.exists(os.path.dirname(legacy.staging))


def test_legacy_unstage_refuses_while_published(legacy: Legacy) -> None:
    lp, vol = legacy.path, legacy.volume
    lp.mount_device(vol, {}, legacy.staging)
    lp.mount(vol, {}, legacy.staging, legacy.target)
    with pytest.raises(DeviceError, match=r"still mounted at .*/pods/p/volumes/v/mount"):
        lp.unmount_device(vol, legacy.staging)
    assert set(legacy.mounter.table) == {legacy.staging, legacy.target}
    assert legacy.backend.released == []


def test_legacy_stage_never_formats_an_existing_filesystem(legacy: Legacy) -> None:
    legacy.mounter.found = Probe(fs_type="ext4")
    legacy.path.mount_device(legacy.volume, {}, legacy.staging)
    assert [c[0] for c in legacy.mounter.calls] == ["probe", "fsck", "mount"]


@pytest.mark.parametrize(
    ("found", "fs_type", "match"),
    [
        pytest.param(Probe(pt_type="dos"), "ext4", "partition table", id="partition-table-no-fs"),
        pytest.param(Probe(fs_type="xfs"), "ext4", "already holds xfs", id="other-filesystem"),
    ],
)
def test_legacy_stage_refuses_foreign_content(legacy: Legacy, found: Probe, fs_type: str, match: str) -> None:
    legacy.mounter.found = found
    volume = Volume(EBS, EBS_CSI, legacy.volume.handle, fs_type, False, {})
    with pytest.raises(DeviceError, match=match):
        legacy.path.mount_device(volume, {}, legacy.staging)
    assert legacy.mounter.table == {}
    assert not any(c[0] == "mkfs" for c in legacy.mounter.calls)


def test_legacy_stage_uses_the_partition_attribute(legacy: Legacy) -> None:
    volume = Volume(EBS, EBS_CSI, legacy.volume.handle, "ext4", False, {"partition": "1"})
    with pytest.raises(DeviceError, match=r"partition /dev/fake-.*1 of volume .* does not exist"):
        legacy.path.mount_device(volume, {}, legacy.staging)
    assert [c[0] for c in legacy.mounter.calls] == ["settle", "add_partitions"]


@pytest.mark.parametrize(
    ("device", "partition", "expected"),
    [
        pytest.param("/dev/loop3", "", "/dev/loop3", id="absent-whole-device"),
        pytest.param("/dev/loop3", "0", "/dev/loop3", id="zero-whole-device"),
        pytest.param("/dev/loop3", "2", "/dev/loop3p2", id="loop-p-separator"),
        pytest.param("/dev/nvme1n1", "1", "/dev/nvme1n1p1", id="nvme-p-separator"),
        pytest.param("/dev/xvdba", "1", "/dev/xvdba1", id="xvd-no-separator"),
    ],
)
def test_partition_device_naming(device: str, partition: str, expected: str) -> None:
    assert partition_device(device, partition) == expected


def test_partition_must_be_a_number() -> None:
    with pytest.raises(DeviceError, match="not a whole number"):
        partition_device("/dev/loop3", "x")


def test_legacy_paths_outside_the_allowed_roots_are_refused(legacy: Legacy) -> None:
    with pytest.raises(InvalidArgument, match="outside the allowed directories"):
        legacy.path.mount_device(legacy.volume, {}, "/etc/ballast/globalmount")
    with pytest.raises(InvalidArgument, match="must not contain"):
        legacy.path.unmount(legacy.volume, legacy.target + "/../x")
    assert legacy.mounter.calls == []


def test_legacy_undo_of_a_missing_volume_is_done(legacy: Legacy) -> None:
    gone = Volume(EBS, EBS_CSI, "fv-missing", "ext4")
    legacy.path.detach(gone, NODE)
    legacy.path.delete(gone)
    legacy.path.delete(legacy.volume)
    legacy.path.delete(legacy.volume)
    assert legacy.volume.handle not in legacy.backend.volumes


def test_legacy_attach_conflicts_surface_backend_errors(legacy: Legacy) -> None:
    legacy.backend.nodes.add("node-2")
    legacy.path.attach(legacy.volume, NODE)
    with pytest.raises(FailedPreconditionError, match=NODE):
        legacy.path.attach(legacy.volume, "node-2")


def test_legacy_expand_grows_a_staged_filesystem(legacy: Legacy) -> None:
    lp, vol = legacy.path, legacy.volume
    assert lp.expand(vol, 2 << 30, legacy.staging) == 2 << 30
    assert not any(c[0] == "grow" for c in legacy.mounter.calls), "grew an unstaged volume"
    lp.mount_device(vol, {}, legacy.staging)
    assert lp.expand(vol, 3 << 30, legacy.staging) == 3 << 30
    assert ("grow", f"/dev/fake-{vol.handle}", legacy.staging) in legacy.mounter.calls
    assert legacy.backend.volumes[vol.handle].size_bytes == 3 << 30


def test_legacy_provision_is_idempotent_and_records_the_fs_type(legacy: Legacy) -> None:
    again = legacy.path.provision(EBS_CSI, ProvisionRequest("pvc-1", 1 << 30, "ext4"))
    assert again.handle == legacy.volume.handle
    assert again.attributes == {"fsType": "ext4"}
    with pytest.raises(InvalidArgument, match="not supported"):
        legacy.path.provision(EBS_CSI, ProvisionRequest("pvc-2", 1 << 30, "zfs"))


def test_gate_switch_accepts_flag_strings() -> None:
    switch = GateSwitch()
    assert not switch().is_migration_enabled(EBS)
    switch.set(ON)
    assert switch().is_migration_enabled(EBS)
    switch.set(FeatureGates())
    assert switch() == FeatureGates()
