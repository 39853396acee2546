"""The migration flip end to end: a legacy awsElasticBlockStore volume served by the local backend, once
the old way (backend + mount layer in this process) and once through the real driver process run as
`ebs.csi.aws.com` over its socket, flipping the gates mid-life and back, on real loop devices and mounts.

Fixtures stop the driver, then fail the test on any mount under its directory or loop device over its
data dir (after removing them), so nothing leaks even when a step fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi._proto import csi_pb2
from csi.backends.base import DiskOptions, InvalidParameterError, OutOfCapacityError
from csi.backends.local import LocalBackend
from csi.config import parse_args
from csi.migration import CsiCallError, CsiPath, DeviceError, LegacyPath
from csi.mount import Mounter
from csi.server import Driver
from shim import Translator
from shim.router import GateSwitch, MigrationLocks, Route, RouteEvent, Router, VolumeSpec
from tests.conftest import REPO, require_root, require_tool
from tests.csiclient import client, connect
from tests.integration.conftest import force_clean, leftovers, write_mbr

EBS = "kubernetes.io/aws-ebs"
DRIVER = "ebs.csi.aws.com"
ZONE = "us-east-1a"
NODE = "migration-node"
OFF = ""
ON = "CSIMigration=true,CSIMigrationAWS=true"
SIZE = 64 * 1024**2
STORAGE_CLASS = {"provisioner": EBS, "parameters": {"fsType": "ext4", "zone": ZONE}}


@dataclass
class FlipEnv:
    tmp: Path
    data: Path
    kubelet: Path
    router: Router
    switch: GateSwitch
    backend: LocalBackend
    socket: str = ""
    events: list[RouteEvent] = field(default_factory=list)

    def pv(self, volume_id: str, fs_type: str = "ext4") -> dict[str, Any]:
        """The in-tree PV as a cluster from before CSI would hold it: aws:// URL, legacy zone label."""
        return {
            "metadata": {"name": "legacy-pv", "labels": {"failure-domain.beta.kubernetes.io/zone": ZONE}},
            "spec": {
                "capacity": {"storage": str(SIZE)},
                "accessModes": ["ReadWriteOnce"],
                "awsElasticBlockStore": {"volumeID": f"aws://{ZONE}/{volume_id}", "fsType": fs_type},
            },
        }


def _driver_argv(tmp: Path, data: Path, kubelet: Path, socket: str) -> list[str]:
    return [
        "--driver-name",
        DRIVER,
        "--endpoint",
        f"unix://{socket}",
        "--data-dir",
        str(data),
        "--allowed-path-prefix",
        str(tmp),
        "--kubelet-dir",
        str(kubelet),
        "--node-id",
        NODE,
        "--zone",
        ZONE,
    ]


def _check_clean(tmp: Path, data: Path, problems: list[str]) -> None:
    mounts, loops = leftovers(tmp, data)
    force_clean(tmp, data)
    if mounts or loops:
        problems.append(f"leaked mounts {mounts} and loop devices {loops}")


@pytest.fixture
def flip_env(tmp_path: Path) -> Iterator[FlipEnv]:
    """The real driver as a subprocess, plus a router whose legacy path shares its data dir."""
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck", "resize2fs"):
        require_tool(tool)
    data, kubelet, socket = tmp_path / "data", tmp_path / "kubelet", str(tmp_path / "csi.sock")
    kubelet.mkdir()
    log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115 - closed in the finalizer
    proc = subprocess.Popen(
        [sys.executable, "-m", "csi", *_driver_argv(tmp_path, data, kubelet, socket)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    problems: list[str] = []
    csi_path: CsiPath | None = None
    backend: LocalBackend | None = None
    try:
        connect(socket, timeout=20).close()
        backend = LocalBackend(str(data), driver_name=DRIVER, zone=ZONE, node_id=NODE, reconcile=False)
        csi_path = CsiPath({DRIVER: f"unix://{socket}"})
        legacy = LegacyPath(backend, Mounter(), allowed_roots=(str(kubelet), str(tmp_path)))
        switch = GateSwitch()
        env = FlipEnv(tmp_path, data, kubelet, None, switch, backend, socket)  # type: ignore[arg-type]
        env.router = Router(
            gates=switch,
            csi=csi_path,
            legacy={EBS: legacy},
            kubelet_dir=str(kubelet),
            locks=MigrationLocks(str(tmp_path / "locks")),
            on_route=env.events.append,
        )
        yield env
    finally:
        if csi_path is not None:
            csi_path.close()
        proc.terminate()
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
            problems.append("the driver did not stop on SIGTERM")
        log.close()
        if code != 0:
            problems.append(f"the driver exited with {code}: {(tmp_path / 'driver.log').read_text()[-2000:]}")
        if backend is not None:
            backend.close()
        _check_clean(tmp_path, data, problems)
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)


# --------------------------------------------------------------------------- the flows

# Each step is "<path>:<action>": L = migration off (legacy path), C = migration on (CSI path).
# Actions: attach, stage, publish (to the current pod's target), unpublish, unstage, detach, write (a new
# line through the pod's target), read (every line written so far is there), pod (the next pod).
FLOWS = [
    pytest.param(
        "L:attach L:stage L:publish L:write"
        " C:read C:unpublish C:unstage C:detach"
        " C:pod C:attach C:stage C:publish C:read C:write"
        " L:read L:unpublish L:unstage L:detach"
        " L:pod L:attach L:stage L:publish L:read L:unpublish L:unstage L:detach",
        id="migrate-between-pods-then-roll-back",
    ),
    pytest.param(
        "L:attach L:stage L:publish L:write"
        " C:unpublish C:pod C:publish C:read C:write"
        " L:unpublish L:pod L:publish L:read"
        " C:unpublish C:unstage L:detach"
        " C:pod C:attach C:stage C:publish C:read C:unpublish C:unstage C:detach",
        id="flip-within-a-running-pods-life",
    ),
    pytest.param(
        "C:attach C:stage L:publish C:write L:read C:unpublish L:unstage C:detach"
        " L:attach C:stage C:pod L:publish L:read C:unpublish C:unstage L:detach",
        id="alternate-every-operation",
    ),
]


@dataclass
class State:
    attached: bool = False
    staged: bool = False
    published: bool = False
    pod: int = 1
    lines: list[str] = field(default_factory=list)


def _target(env: FlipEnv, pod: int) -> str:
    return str(env.kubelet / "pods" / f"pod-{pod}" / "volumes" / "kubernetes.io~csi" / "legacy-pv" / "mount")


def _check(env: FlipEnv, spec: VolumeSpec, state: State, context: Mapping[str, str], step: str) -> None:
    """The durable records match what the flow did: attach records, the mount table, the data."""
    volume = env.router.resolve(spec)
    disk = env.backend.get_volume(volume.handle)
    assert [a.node_id for a in disk.attachments] == ([NODE] if state.attached else []), step
    mounter = Mounter()
    staging = env.router.staging_path(volume)
    assert (mounter.mount_at(staging) is not None) == state.staged, f"{step}: staging {staging}"
    target = _target(env, state.pod)
    assert (mounter.mount_at(target) is not None) == state.published, f"{step}: target {target}"
    if state.staged and state.lines:
        with open(os.path.join(staging, "data.txt"), encoding="utf-8") as fh:
            assert fh.read().splitlines() == state.lines, f"{step}: data changed"


def _run(env: FlipEnv, spec: VolumeSpec, flow: str) -> None:
    state, context = State(), {}
    for n, step in enumerate(flow.split()):
        route, action = step.split(":")
        env.switch.set(ON if route == "C" else OFF)
        before = len(env.events)
        target = _target(env, state.pod)
        if action == "attach":
            context = env.router.attach(spec, NODE)
            state.attached = True
        elif action == "stage":
            env.router.mount_device(spec, context)
            state.staged = True
        elif action == "publish":
            env.router.mount(spec, context, target)
            state.published = True
        elif action == "unpublish":
            env.router.unmount(spec, target)
            assert not os.path.exists(target), f"{step}: target left behind"
            state.published = False
        elif action == "unstage":
            env.router.unmount_device(spec)
            state.staged = False
        elif action == "detach":
            env.router.detach(spec, NODE)
            state.attached = False
        elif action == "write":
            line = f"line {len(state.lines)} written at step {n} ({step})"
            with open(os.path.join(target, "data.txt"), "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            state.lines.append(line)
        elif action == "read":
            with open(os.path.join(target, "data.txt"), encoding="utf-8") as fh:
                assert fh.read().splitlines() == state.lines, f"{step}: data lost"
        elif action == "pod":
            state.pod += 1
        else:
            raise AssertionError(f"unknown action {action}")
        if action not in ("write", "read", "pod"):
            expected = Route.CSI if route == "C" else Route.LEGACY
            assert [e.route for e in env.events[before:]] == [expected], f"step {n} {step} took another path"
        _check(env, spec, state, context, f"step {n} {step}")


@pytest.mark.parametrize("flow", FLOWS)
def test_flip_keeps_attachments_mounts_and_data(flip_env: FlipEnv, flow: str) -> None:
    env = flip_env
    pv = env.router.provision(EBS, STORAGE_CLASS, "pvc-migrating", SIZE)
    volume_id = pv["spec"]["awsElasticBlockStore"]["volumeID"]
    assert volume_id.startswith("vol-"), "the local backend standing in for EBS issues EBS-style ids"
    assert pv["metadata"]["labels"]["topology.kubernetes.io/zone"] == ZONE
    spec = VolumeSpec.of_pv(env.pv(volume_id))
    assert env.router.resolve(spec).handle == volume_id
    _run(env, spec, flow)
    env.switch.set(ON)
    env.router.delete(spec)
    assert not (env.data / "volumes" / f"{volume_id}.img").exists()
    assert not list((env.kubelet / "plugins").rglob("globalmount")), "a staging dir was left behind"


def test_expand_on_one_path_after_staging_on_the_other(flip_env: FlipEnv) -> None:
    """xfs: online ext4 growth needs CAP_SYS_RESOURCE (see test_node_lifecycle), xfs_growfs does not."""
    require_tool("mkfs.xfs")
    require_tool("xfs_growfs")
    env, size = flip_env, 320 * 1024**2
    xfs_class = {"provisioner": EBS, "parameters": {"fsType": "xfs", "zone": ZONE}}
    pv = env.router.provision(EBS, xfs_class, "pvc-grow", size)
    spec = VolumeSpec.of_pv(env.pv(pv["spec"]["awsElasticBlockStore"]["volumeID"], "xfs"))
    context = env.router.attach(spec, NODE)
    staging = env.router.mount_device(spec, context)
    before = os.statvfs(staging).f_blocks * os.statvfs(staging).f_frsize
    env.switch.set(ON)
    assert env.router.expand(spec, size + SIZE) == size + SIZE
    grown = os.statvfs(staging).f_blocks * os.statvfs(staging).f_frsize
    assert grown - before > SIZE // 2, "the CSI path did not grow the legacy-staged filesystem"
    env.switch.set(OFF)
    assert env.router.expand(spec, size + 2 * SIZE) == size + 2 * SIZE
    final = os.statvfs(staging).f_blocks * os.statvfs(staging).f_frsize
    assert final - grown > SIZE // 2, "the legacy path did not grow the filesystem"
    env.switch.set(ON)
    env.router.unmount_device(spec)
    env.router.detach(spec, NODE)
    env.router.delete(spec)


# --------------------------------------------------------------------------- what translation produces


def test_partition_attribute_is_honoured_by_both_paths(flip_env: FlipEnv) -> None:
    """In-tree `partition: 1` becomes the CSI attribute "1": both paths stage /dev/loopNp1, and both
    refuse the whole device (it holds a partition table) when the partition is 0."""
    env = flip_env
    pv = env.router.provision(EBS, STORAGE_CLASS, "pvc-part", SIZE)
    volume_id = pv["spec"]["awsElasticBlockStore"]["volumeID"]
    volume_file = str(env.data / "volumes" / f"{volume_id}.img")
    write_mbr(volume_file, 2048, SIZE // 512 - 2048)
    whole = VolumeSpec.of_pv(env.pv(volume_id))
    part = env.pv(volume_id)
    part["spec"]["awsElasticBlockStore"]["partition"] = 1
    spec = VolumeSpec.of_pv(part)
    assert env.router.resolve(spec).attributes == {"partition": "1"}
    context = env.router.attach(spec, NODE)
    with pytest.raises(DeviceError, match="partition table"):
        env.router.mount_device(whole, context)
    env.switch.set(ON)
    with pytest.raises(CsiCallError, match="partition table") as err:
        env.router.mount_device(whole, context)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    target = _target(env, 1)
    for route in (OFF, ON):  # staged and published one way, torn down the other
        env.switch.set(route)
        staging = env.router.mount_device(spec, context)
        env.router.mount(spec, context, target)
        info = Mounter().mount_at(staging)
        assert info is not None and info.source.endswith("p1"), info
        with open(os.path.join(target, "data.txt"), "a", encoding="utf-8") as fh:
            fh.write(f"written with gates {route!r}\n")
        env.switch.set(ON if route == OFF else OFF)
        env.router.unmount(spec, target)
        env.router.unmount_device(spec)
    with open(volume_file, "rb") as fh:
        fh.seek(510)
        assert fh.read(2) == b"\x55\xaa", "the partition table was overwritten"
    env.router.detach(spec, NODE)
    env.router.delete(spec)


def test_translated_node_affinity_is_satisfied_by_the_driver_topology(flip_env: FlipEnv) -> None:
    """A PV carrying only the legacy beta zone label gets node affinity on the EBS CSI key; the driver
    (local backend named ebs.csi.aws.com) reports exactly that key and zone in NodeGetInfo."""
    env = flip_env
    csi_pv = Translator().translate_in_tree_pv_to_csi(env.pv("vol-" + "0" * 32))
    (term,) = csi_pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    required = {e["key"]: e["values"] for e in term["matchExpressions"]}
    assert required == {"topology.ebs.csi.aws.com/zone": [ZONE]}
    with client(f"unix://{env.socket}") as c:
        info = c.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=30)
    segments = dict(info.accessible_topology.segments)
    assert info.node_id == NODE
    assert all(segments.get(key) in values for key, values in required.items()), segments


@pytest.mark.parametrize("gates", [pytest.param(OFF, id="legacy"), pytest.param(ON, id="csi")])
def test_legacy_storage_class_parameters_and_topology(flip_env: FlipEnv, gates: str) -> None:
    """fsType and zones (legacy parameters) provision on either path; the CSI topology key the shim
    writes is the one the driver serves; an unserved zone or an EBS-only parameter fails on both."""
    env = flip_env
    env.switch.set(gates)
    sc = {"provisioner": EBS, "parameters": {"fsType": "xfs", "zones": f"us-east-1b,{ZONE}"}}
    pv = env.router.provision(EBS, sc, "pvc-zones", 320 * 1024**2)
    ebs = pv["spec"]["awsElasticBlockStore"]
    assert ebs["fsType"] == "xfs"
    disk = env.backend.get_volume(ebs["volumeID"])
    assert disk.topology == {"topology.ebs.csi.aws.com/zone": ZONE}
    assert disk.volume_context == {"fsType": "xfs"}
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]} in terms[0][
        "matchExpressions"
    ]
    # the same claim again is the same volume (idempotent by name, on either path)
    env.switch.set(ON if gates == OFF else OFF)
    again = env.router.provision(EBS, sc, "pvc-zones", 320 * 1024**2)
    assert again["spec"]["awsElasticBlockStore"]["volumeID"] == ebs["volumeID"]
    env.switch.set(gates)
    elsewhere = {"provisioner": EBS, "parameters": {"zone": "us-west-2a"}}
    ebs_only = {"provisioner": EBS, "parameters": {"type": "gp3"}}
    for bad, code, backend_error in (
        (elsewhere, grpc.StatusCode.RESOURCE_EXHAUSTED, OutOfCapacityError),
        (ebs_only, grpc.StatusCode.INVALID_ARGUMENT, InvalidParameterError),
    ):
        expected: type[Exception] = CsiCallError if gates == ON else backend_error
        with pytest.raises(expected) as err:
            env.router.provision(EBS, bad, "pvc-bad", SIZE)
        if gates == ON:
            assert isinstance(err.value, CsiCallError) and err.value.code == code
    env.router.delete(VolumeSpec.of_pv(pv))


# --------------------------------------------------------------------------- the race


class CountingBackend(LocalBackend):
    """LocalBackend that counts attach/detach effects and records whether two ever overlapped."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: Counter[str] = Counter()
        self.active = 0
        self.max_active = 0
        self._count_lock = threading.Lock()

    def _counted(self, op: str) -> None:
        with self._count_lock:
            self.counts[op] += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)

    def _done(self) -> None:
        time.sleep(0.002)  # widen the window an overlap would need
        with self._count_lock:
            self.active -= 1

    def attach(self, volume_id: str, node_id: str, readonly: bool) -> dict[str, str]:
        self._counted("attach")
        try:
            return super().attach(volume_id, node_id, readonly)
        finally:
            self._done()

    def detach(self, volume_id: str, node_id: str) -> None:
        self._counted("detach")
        try:
            super().detach(volume_id, node_id)
        finally:
            self._done()


@pytest.fixture
def race_env(tmp_path: Path) -> Iterator[tuple[Driver, CountingBackend, str]]:
    """The driver in this process (so one counting backend sees both paths' effects) on a real socket."""
    data, socket = tmp_path / "data", str(tmp_path / "csi.sock")
    config, _ = parse_args(_driver_argv(tmp_path, data, tmp_path / "kubelet", socket))
    backend = CountingBackend(str(data), driver_name=DRIVER, zone=ZONE, node_id=NODE)
    driver = Driver(config, backend=backend)
    driver.start()
    try:
        yield driver, backend, socket
    finally:
        driver.stop(grace=5)
    assert not os.path.exists(socket)


def test_concurrent_operations_through_both_paths_while_flipping_run_once(
    race_env: tuple[Driver, CountingBackend, str], tmp_path: Path
) -> None:
    """Two routers (as two processes: separate lock tables, one lock dir) and a flipping gate. Every
    attach/detach reaches the backend exactly once, on one path, and never overlaps another."""
    _, backend, socket = race_env
    disk = backend.create_volume("pvc-race", DiskOptions(size_bytes=SIZE))
    spec = VolumeSpec.of_pv(
        {
            "metadata": {"name": "pv"},
            "spec": {"awsElasticBlockStore": {"volumeID": f"aws://{ZONE}/{disk.id}"}},
        }
    )
    switch = GateSwitch()
    events: list[RouteEvent] = []
    paths = [CsiPath({DRIVER: f"unix://{socket}"}) for _ in range(2)]
    routers = [
        Router(
            gates=switch,
            csi=csi,
            legacy={EBS: LegacyPath(backend, Mounter(), allowed_roots=(str(tmp_path),))},
            kubelet_dir=str(tmp_path / "kubelet"),
            locks=MigrationLocks(str(tmp_path / "locks")),
            on_route=events.append,
        )
        for csi in paths
    ]
    issued: Counter[str] = Counter()
    issued_lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def flipper() -> None:
        on = False
        while not stop.is_set():
            on = not on
            switch.set(ON if on else OFF)
            time.sleep(0.001)

    def worker(n: int) -> None:
        router = routers[n % 2]
        try:
            for i in range(15):
                op = "attach" if (n + i) % 2 else "detach"
                getattr(router, op)(spec, NODE)
                with issued_lock:
                    issued[op] += 1
        except BaseException as exc:  # surfaced below with the thread's error
            errors.append(exc)

    flip = threading.Thread(target=flipper)
    flip.start()
    workers = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
    finally:
        stop.set()
        flip.join(5)
        for csi in paths:
            csi.close()
    assert errors == []
    assert backend.counts == issued, "an operation ran twice or not at all"
    assert backend.max_active == 1, "two operations on the volume overlapped"
    routes = Counter(e.route for e in events)
    assert routes[Route.CSI] > 0 and routes[Route.LEGACY] > 0, f"the flips never took effect: {routes}"
    assert sum(routes.values()) == sum(issued.values())
    backend.detach(disk.id, NODE)
    backend.delete_volume(disk.id)
