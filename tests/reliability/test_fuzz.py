"""Hostile input: hypothesis-generated requests for every unary CSI RPC over the real unix socket, plus
raw wire bytes that are not valid requests at all, plus a table of malformed requests per RPC.

Requests are built from the message descriptors, every field drawn from pools that mix well-formed
values (real volume and snapshot ids, paths under the kubelet dir, known parameter keys, allow-listed
mount flags) with hostile ones (traversal, paths elsewhere, control characters, unicode, strings and
maps past the spec's 128-byte / 4 KiB limits, unknown enum values, extreme integers). The driver must
never crash, never answer UNKNOWN, INTERNAL or UNAVAILABLE, never echo a secret in an error, and a call
that fails must leave no trace: the sentinel tree, the mounts under the test's directory, the loop
devices over its files and the data dir's files are exactly equal before and after it. (The comparison
is scoped to what this driver could create because other test sessions share the machine.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csi import loop, loopfind
from csi._proto import csi_pb2
from csi.mount import Mounter
from tests.conftest import require_root, require_tool
from tests.csiclient import CsiClient
from tests.integration.conftest import force_clean
from tests.reliability.conftest import MiB, mount_cap
from tests.reliability.inprocess import NODE_ID, Local, start_local

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXAMPLES = int(os.environ.get("BALLAST_FUZZ_EXAMPLES", "100"))
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,  # a starting_token this driver did not issue (spec)
    grpc.StatusCode.UNIMPLEMENTED,
}
SECRET = "fuzz-secret-7f3a9c"
SERVICES = ("Identity", "Controller", "Node", "GroupController")
METHODS = [
    pytest.param(service, m.name, id=f"{service}.{m.name}")
    for service in SERVICES
    for m in csi_pb2.DESCRIPTOR.services_by_name[service].methods
]

UNARY = {
    m.name: (service, m)
    for service in SERVICES
    for m in csi_pb2.DESCRIPTOR.services_by_name[service].methods
    if not m.client_streaming and not m.server_streaming
}


# ---------------------------------------------------------------------------- the world under test


@dataclass
class Fuzzed:
    env: Local
    tmp: Path
    sentinel: Path
    volume_id: str
    snapshot_id: str
    publish_context: dict[str, str]

    @property
    def client(self) -> CsiClient:
        return self.env.client


def tree_of(sentinel: Path) -> dict[str, tuple[int, int, int]]:
    """The sentinel tree: names, sizes, modes, mtimes."""
    tree = {}
    for root, dirs, files in os.walk(sentinel):
        for name in dirs + files:
            p = os.path.join(root, name)
            st_ = os.lstat(p)
            tree[p] = (st_.st_size, st_.st_mode, st_.st_mtime_ns)
    return tree


def host_state(f: Fuzzed) -> dict[str, Any]:
    """Everything a call could change that this test owns: the sentinel tree, mounts under the test's
    directory (or of a file in it), loop devices over files in it, and the data dir's image files."""
    scope = str(f.tmp) + "/"
    mounts = sorted(
        (m.mount_point, m.major, m.minor, m.root, m.readonly)
        for m in Mounter().mounts()
        if m.mount_point.startswith(scope) or m.source.startswith(scope)
    )
    loops = sorted(
        (dev, backing)
        for dev in loopfind.bound_devices()
        if (backing := loop.backing_file(dev) or "").startswith(scope)
    )
    data = f.env.data_dir
    images = sorted(
        str(p.relative_to(data)) for sub in ("volumes", "snapshots") for p in (data / sub).iterdir()
    )
    return {"tree": tree_of(f.sentinel), "mounts": mounts, "loops": loops, "images": images}


def global_mounts_and_loops() -> tuple[set[str], set[str]]:
    """Every mount point and every loop device's backing file on the machine."""
    mounts = {m.mount_point for m in Mounter().mounts()}
    return mounts, {loop.backing_file(d) or "" for d in loopfind.bound_devices()}


def take_down(f: Fuzzed) -> None:
    """Undo what the fuzzed calls that succeeded set up, through the API: unpublish every mount under
    the kubelet dir (deepest first), then unstage the seed volume, which releases its loop device."""
    node = f.client.node
    points = [m[0] for m in host_state(f)["mounts"] if m[0].startswith(str(f.env.kubelet) + "/")]
    for point in sorted(points, key=len, reverse=True):
        node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=f.volume_id, target_path=point), timeout=60
        )
    staging = str(f.env.kubelet / "plugins" / "teardown")
    node.NodeUnstageVolume(
        csi_pb2.NodeUnstageVolumeRequest(volume_id=f.volume_id, staging_target_path=staging), timeout=60
    )


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    require_root()
    for tool in ("mkfs.ext4", "blkid", "e2fsck"):
        require_tool(tool)
    tmp = tmp_path_factory.mktemp("fuzz")
    sentinel = tmp / "sentinel"
    (sentinel / "etc").mkdir(parents=True)
    (sentinel / "etc" / "passwd").write_text("root:x:0:0\n")
    (sentinel / "kubelet-lookalike" / "pods").mkdir(parents=True)
    os.symlink(sentinel / "etc", tmp / "kubelet-link")
    tree_before = tree_of(sentinel)
    mounts_before, loops_before = global_mounts_and_loops()
    env = start_local(tmp)
    os.symlink(sentinel, env.kubelet / "escape")  # a symlink under the root pointing out of it
    try:
        vid = env.create(16 * MiB, name="fuzz-seed")
        pc = env.publish_context(vid)
        snap = env.client.controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name="fuzz-seed-snap", source_volume_id=vid), timeout=30
        ).snapshot.snapshot_id
        f = Fuzzed(env, tmp, sentinel, vid, snap, pc)
        yield f
        assert env.client.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value
        assert tree_of(sentinel) == tree_before, "the sentinel tree changed"
        # Anything outside this test's directory: other sessions mount and attach only under theirs.
        others = str(tmp_path_factory.getbasetemp().parent) + "/"
        mounts_after, loops_after = global_mounts_and_loops()
        outside = [m for m in mounts_after - mounts_before if not m.startswith(others)]
        assert not outside, f"mounts outside any test directory: {outside}"
        stray = [b for b in loops_after - loops_before if b and not b.startswith(others)]
        assert not stray, f"loop devices over files outside any test directory: {stray}"
        mine = host_state(f)
        assert all(m[0].startswith(str(env.kubelet) + "/") for m in mine["mounts"]), mine["mounts"]
        assert all(b.startswith(str(env.data_dir) + "/") for _, b in mine["loops"]), mine["loops"]
        take_down(f)
        left = host_state(f)
        assert left["mounts"] == [] and left["loops"] == [], f"left behind: {left}"
        assert sorted(p.name for p in tmp.iterdir()) == [
            "csi.sock",
            "data",
            "kubelet",
            "kubelet-link",
            "sentinel",
        ]
    finally:
        env.stop()
        force_clean(tmp, tmp)


# ---------------------------------------------------------------------------- value pools


def _text(max_size: int = 40) -> st.SearchStrategy[str]:
    return st.text(max_size=max_size)


OVERSIZE = st.sampled_from(["x" * 129, "é" * 65, "v" * 4097, "lv-" + "0" * 200])
HEX32 = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)


def ids(f: Fuzzed) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([f.volume_id, f.snapshot_id, "", "lv-", "../../etc/passwd", "lv-../../../etc"]),
        HEX32.map(lambda h: "lv-" + h),
        HEX32.map(lambda h: "ls-" + h),
        HEX32.map(lambda h: "lg-" + h),
        st.just(f.volume_id).map(lambda v: v + "\x00"),
        _text(),
        OVERSIZE,
    )


def paths(f: Fuzzed) -> st.SearchStrategy[str]:
    k = str(f.env.kubelet)
    return st.one_of(
        st.sampled_from(
            [
                "",
                "/",
                k,
                k + "/",
                f"{k}/../sentinel/etc",
                f"{k}/escape",
                f"{k}/escape/etc",
                str(f.sentinel / "etc"),
                str(f.sentinel / "etc" / "passwd"),
                "/etc",
                "/proc/self/root/etc",
                "relative/path",
                f"{k}//double",
                f"{k}/./dot",
                f"{k}/pods/a\nb",
                f"{k}/pods/x" + "y" * 5000,
            ]
        ),
        st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=30).map(
            lambda t: f"{k}/pods/{t}"
        ),
        st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,3}", fullmatch=True).map(lambda t: f"{k}/{t}"),
        _text().map(lambda t: "/" + t),
    )


PARAM_KEYS = st.sampled_from(
    [
        "csi.storage.k8s.io/fstype",
        "fsType",
        "partition",
        "blockSize",
        "inodeSize",
        "bytesPerInode",
        "numberOfInodes",
        "iops",
        "throughput",
        "tier",
        "volumeFile",
        "devicePath",
        "topology.local.csi.ballast.dev/zone",
    ]
)
PARAM_VALUES = st.one_of(
    st.sampled_from(["", "0", "1", "4096", "ext4", "xfs", "-1", "99999999999999999999", "/etc/passwd"]),
    _text(20),
)


def maps(field: str, f: Fuzzed) -> st.SearchStrategy[dict[str, str]]:
    if field == "secrets":
        return st.one_of(
            st.just({"password": SECRET}),
            st.dictionaries(_text(10), st.just(SECRET), max_size=3),
            st.just({"k" * 4000: SECRET + "v" * 200}),
        )
    small = st.dictionaries(st.one_of(PARAM_KEYS, _text(15)), PARAM_VALUES, max_size=4)
    big = st.integers(1, 64).map(lambda n: {f"k{i}": "v" * 100 for i in range(n)})
    extra = [st.just(dict(f.publish_context))] if field == "publish_context" else []
    return st.one_of(small, big, *extra)


MOUNT_FLAGS = st.lists(
    st.one_of(
        st.sampled_from(["ro", "rw", "noatime", "nosuid", "discard", "data=journal", "errors=panic", "bind"]),
        st.sampled_from(["exec;rm -rf /", "remount", "-o", "loop", "uid=0", "x" * 300]),
        _text(12),
    ),
    max_size=4,
)
FS_TYPES = st.one_of(
    st.sampled_from(["", "ext4", "ext3", "xfs", "btrfs", "ext4 ", "EXT4", "tmpfs", "proc"]), _text(8)
)
INTS = st.one_of(
    st.sampled_from([0, 1, -1, 4096, 64 * MiB, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]),
    st.integers(-(2**63), 2**63 - 1),
)


# ---------------------------------------------------------------------------- requests from descriptors


def _string(field: FieldDescriptor, f: Fuzzed) -> st.SearchStrategy[str]:
    name = field.name
    if name.endswith("_id") or name.endswith("_ids"):
        return ids(f)
    if "path" in name:
        return paths(f)
    if name == "fs_type":
        return FS_TYPES
    if name == "mount_flags":
        return st.one_of(*[st.just(x) for x in ("ro", "noatime")], _text(12))
    if name == "starting_token":
        return st.one_of(st.sampled_from(["", "lvt-1", "lst-0", "lvt-99999999999999999999", "x"]), _text())
    return st.one_of(_text(), OVERSIZE, st.sampled_from(["fuzz-seed", "fuzz-seed-snap"]))


def _scalar(field: FieldDescriptor, f: Fuzzed) -> st.SearchStrategy[Any]:
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return _string(field, f)
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.one_of(
            st.sampled_from([v.number for v in _some(field.enum_type).values]), st.integers(-5, 2**31 - 1)
        )
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32):
        return st.integers(-(2**31), 2**31 - 1)
    if t in (FieldDescriptor.TYPE_UINT32,):
        return st.integers(0, 2**32 - 1)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    return INTS


T = TypeVar("T")
AccessModeValue = csi_pb2.VolumeCapability.AccessMode.Mode


def _some(value: T | None) -> T:
    """A descriptor the field type guarantees (message and enum fields always have one)."""
    assert value is not None
    return value


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@st.composite
def message(
    draw: st.DrawFn, descriptor: Descriptor, f: Fuzzed, depth: int = 0, sparse: bool = False
) -> Message:
    cls = csi_pb2.__dict__.get(descriptor.name) if descriptor.containing_type is None else None
    msg: Message = cls() if cls is not None else _nested_class(descriptor)()
    if descriptor.full_name == "csi.v1.VolumeCapability" and draw(st.booleans()):
        cap = mount_cap(draw(FS_TYPES))
        cap.mount.mount_flags.extend(draw(MOUNT_FLAGS))
        modes = [1, 1, 2, 3, 5, 6, 7, 0, 99]  # 4 and 0 invalid for a mount, 99 unknown
        cap.access_mode.mode = cast(AccessModeValue, draw(st.sampled_from(modes)))
        return cap
    for field in descriptor.fields:
        if not (draw(st.integers(0, 5)) == 0 if sparse else draw(st.booleans())):
            continue
        if _is_map(field):
            value_field = _some(field.message_type).fields_by_name["value"]
            if value_field.type == FieldDescriptor.TYPE_STRING:
                getattr(msg, field.name).update(draw(maps(field.name, f)))
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            sub_type = _some(field.message_type)
            if depth >= 4 or (
                sub_type.full_name.startswith("google.protobuf.")
                and (sub_type.name not in ("Int64Value", "BoolValue"))
            ):
                continue
            count = draw(st.integers(0, 3)) if field.is_repeated else 1
            for _ in range(count):
                sub = draw(message(sub_type, f, depth + 1))
                if field.is_repeated:
                    getattr(msg, field.name).add().CopyFrom(sub)
                else:
                    getattr(msg, field.name).CopyFrom(sub)
            continue
        if field.is_repeated:
            values = (
                draw(MOUNT_FLAGS)
                if field.name == "mount_flags"
                else draw(st.lists(_scalar(field, f), max_size=4))
            )
            getattr(msg, field.name).extend(values)
        else:
            setattr(msg, field.name, draw(_scalar(field, f)))
    return msg


def _nested_class(descriptor: Descriptor) -> type[Message]:
    chain = []
    d: Descriptor | None = descriptor
    while d is not None:
        chain.append(d.name)
        d = d.containing_type
    obj: Any = csi_pb2
    for name in reversed(chain):
        obj = getattr(obj, name)
    return obj  # type: ignore[no-any-return]


def _stub(f: Fuzzed, service: str) -> Any:
    return {
        "Identity": f.client.identity,
        "Controller": f.client.controller,
        "Node": f.client.node,
        "GroupController": f.client.group,
    }[service]


# RPCs that only read: whatever they answer, the host stays exactly as it was.
READS = frozenset(
    {
        "GetPluginInfo",
        "GetPluginCapabilities",
        "Probe",
        "ValidateVolumeCapabilities",
        "ListVolumes",
        "GetCapacity",
        "ControllerGetCapabilities",
        "ListSnapshots",
        "GetSnapshot",
        "ControllerGetVolume",
        "GroupControllerGetCapabilities",
        "GetVolumeGroupSnapshot",
        "NodeGetVolumeStats",
        "NodeGetCapabilities",
        "NodeGetInfo",
    }
)


def answer(f: Fuzzed, method: str, request: Any) -> grpc.StatusCode:
    """Call `method`; an error must carry a spec code and an actionable message without secrets or
    traceback. A call that fails, or only reads, must leave the host exactly as it was. Returns the code."""
    call = _call(f, method)
    before = host_state(f)
    try:
        call(request, timeout=60)
        if method in READS:
            assert host_state(f) == before, f"{method} only reads but changed the host: {request!r:.2000}"
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
        assert code in ALLOWED, f"{code.name}: {details} for {request!r:.2000}"
        assert SECRET not in details, "a secret was echoed in an error message"
        assert "Traceback" not in details
        assert details, "an error without a message"
        after = host_state(f)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        assert not changed, f"{code.name} ({details}) changed the host: {changed} for {request!r:.2000}"
        return code
    return grpc.StatusCode.OK


# ---------------------------------------------------------------------------- the tests


SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not os.environ.get("BALLAST_FUZZ_RANDOM"),
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


SMALL_NAME = st.text(alphabet="abc", min_size=1, max_size=3)


def _base(method: str, f: Fuzzed, draw: st.DrawFn) -> Message | None:
    """A well-formed request for `method`, to be partly overwritten with hostile values."""
    n = draw(SMALL_NAME)
    size = draw(st.sampled_from([MiB, 16 * MiB, 32 * MiB]))
    return well_formed(method, f, n, size, draw(st.sampled_from(["", "ext4"])))


def well_formed(
    method: str, f: Fuzzed, n: str = "wf", size: int = 16 * MiB, fs: str = "ext4"
) -> Message | None:
    """A well-formed request for `method` on the seed volume (None for the RPCs without one here)."""
    k = str(f.env.kubelet)
    staging, target = f"{k}/plugins/{n}/globalmount", f"{k}/pods/{n}/mount"
    cap = mount_cap(fs)
    vid = f.volume_id
    sizes = csi_pb2.CapacityRange(required_bytes=size)
    bases: dict[str, Any] = {
        "CreateVolume": lambda: csi_pb2.CreateVolumeRequest(
            name=f"fz-{n}", capacity_range=sizes, volume_capabilities=[cap]
        ),
        "DeleteVolume": lambda: csi_pb2.DeleteVolumeRequest(volume_id=vid),
        "ControllerPublishVolume": lambda: csi_pb2.ControllerPublishVolumeRequest(
            volume_id=vid, node_id=NODE_ID, volume_capability=cap
        ),
        "ControllerUnpublishVolume": lambda: csi_pb2.ControllerUnpublishVolumeRequest(volume_id=vid),
        "ValidateVolumeCapabilities": lambda: csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=vid, volume_capabilities=[cap]
        ),
        "CreateSnapshot": lambda: csi_pb2.CreateSnapshotRequest(name=f"fz-{n}", source_volume_id=vid),
        "DeleteSnapshot": lambda: csi_pb2.DeleteSnapshotRequest(snapshot_id=f.snapshot_id),
        "GetSnapshot": lambda: csi_pb2.GetSnapshotRequest(snapshot_id=f.snapshot_id),
        "ListSnapshots": lambda: csi_pb2.ListSnapshotsRequest(source_volume_id=vid),
        "ControllerGetVolume": lambda: csi_pb2.ControllerGetVolumeRequest(volume_id=vid),
        "GetVolumeGroupSnapshot": lambda: csi_pb2.GetVolumeGroupSnapshotRequest(
            group_snapshot_id="lg-" + "0" * 32
        ),
        "DeleteVolumeGroupSnapshot": lambda: csi_pb2.DeleteVolumeGroupSnapshotRequest(
            group_snapshot_id="lg-" + "0" * 32
        ),
        "ControllerExpandVolume": lambda: csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=sizes
        ),
        "ControllerModifyVolume": lambda: csi_pb2.ControllerModifyVolumeRequest(
            volume_id=vid, mutable_parameters={"iops": "100"}
        ),
        "CreateVolumeGroupSnapshot": lambda: csi_pb2.CreateVolumeGroupSnapshotRequest(
            name=f"fz-{n}", source_volume_ids=[vid]
        ),
        "NodeStageVolume": lambda: csi_pb2.NodeStageVolumeRequest(
            volume_id=vid,
            staging_target_path=staging,
            volume_capability=cap,
            publish_context=f.publish_context,
        ),
        "NodeUnstageVolume": lambda: csi_pb2.NodeUnstageVolumeRequest(
            volume_id=vid, staging_target_path=staging
        ),
        "NodePublishVolume": lambda: csi_pb2.NodePublishVolumeRequest(
            volume_id=vid,
            staging_target_path=staging,
            target_path=target,
            volume_capability=cap,
            publish_context=f.publish_context,
        ),
        "NodeUnpublishVolume": lambda: csi_pb2.NodeUnpublishVolumeRequest(volume_id=vid, target_path=target),
        "NodeGetVolumeStats": lambda: csi_pb2.NodeGetVolumeStatsRequest(volume_id=vid, volume_path=target),
        "NodeExpandVolume": lambda: csi_pb2.NodeExpandVolumeRequest(volume_id=vid, volume_path=staging),
    }
    make = bases.get(method)
    return make() if make else None


@st.composite
def hostile(draw: st.DrawFn, method: str, descriptor: Descriptor, f: Fuzzed) -> Message:
    """Either a request built from scratch, or a well-formed one with a few fields overwritten."""
    base = _base(method, f, draw)
    if base is None or draw(st.integers(0, 3)) == 0:
        return draw(message(descriptor, f))
    base.MergeFrom(draw(message(descriptor, f, sparse=True)))
    return base


@pytest.mark.parametrize(("service", "method"), METHODS)
def test_every_rpc_answers_hostile_requests_with_a_spec_code(
    fuzzed: Fuzzed, service: str, method: str
) -> None:
    descriptor = csi_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method].input_type

    @SETTINGS
    @given(st.data())
    def run(data: st.DataObject) -> None:
        answer(fuzzed, method, data.draw(hostile(method, descriptor, fuzzed)))

    run()


@pytest.mark.parametrize(("service", "method"), METHODS)
def test_undecodable_bytes_are_invalid_argument(fuzzed: Fuzzed, service: str, method: str) -> None:
    """Bytes that are no valid request (truncated, bad wire types, a string that is not UTF-8) are
    refused with INVALID_ARGUMENT, never INTERNAL."""
    raw = fuzzed.client.channel.unary_unary(
        f"/csi.v1.{service}/{method}", request_serializer=None, response_deserializer=None
    )
    cls = _nested_class(csi_pb2.DESCRIPTOR.services_by_name[service].methods_by_name[method].input_type)

    @SETTINGS
    @given(
        st.one_of(
            st.binary(min_size=1, max_size=200),
            st.binary(max_size=40).map(lambda b: b"\x0a" + bytes([len(b) + 1]) + b"\xff" + b),
            st.binary(max_size=20).map(lambda b: b"\x12\x05lv-\xc3\x28" + b),
        )
    )
    def run(payload: bytes) -> None:
        try:
            cls.FromString(payload)
            decodable = True
        except Exception:
            decodable = False
        try:
            raw(payload, timeout=30)
        except grpc.RpcError as err:
            code = err.code()
            assert code in ALLOWED, f"{code.name}: {err.details()} for {payload!r}"
            if not decodable:
                assert code == grpc.StatusCode.INVALID_ARGUMENT, err.details()

    run()


def test_node_id_and_publish_context_cannot_redirect_to_another_file(fuzzed: Fuzzed) -> None:
    """A publish context naming another file (here the sentinel) is refused before any loop device
    is bound to it."""
    k = fuzzed.env.kubelet
    req = csi_pb2.NodeStageVolumeRequest(
        volume_id=fuzzed.volume_id,
        staging_target_path=f"{k}/plugins/redirect/globalmount",
        volume_capability=mount_cap(),
        publish_context={"volumeFile": str(fuzzed.sentinel / "etc" / "passwd")},
    )
    try:
        fuzzed.client.node.NodeStageVolume(req, timeout=30)
        raise AssertionError("staging with a foreign volumeFile succeeded")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    assert not any(
        loop.backing_file(d) == str(fuzzed.sentinel / "etc" / "passwd") for d in loopfind.bound_devices()
    )
    assert NODE_ID


# ---------------------------------------------------------------------------- malformed, per RPC

Code = grpc.StatusCode
BAD_IDS = [pytest.param("i" * 129, id="over-128-bytes"), pytest.param("lv-\x01", id="control-character")]


def _id_fields(descriptor: Descriptor, prefix: str = "", depth: int = 0) -> Iterator[str]:
    """Dotted paths of every id field (`*_id`, `*_ids`) of a request, nested messages included."""
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_STRING and field.name.endswith(("_id", "_ids")):
            yield prefix + field.name
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not _is_map(field) and depth < 3:
            yield from _id_fields(_some(field.message_type), f"{prefix}{field.name}.", depth + 1)


ID_CASES = [
    pytest.param(method, path, id=f"{method}.{path}")
    for method, (_, m) in UNARY.items()
    for path in _id_fields(m.input_type)
]


def _set(request: Message, path: str, value: str) -> None:
    *parents, leaf = path.split(".")
    target: Any = request
    for name in parents:
        target = getattr(target, name)
    if isinstance(getattr(target, leaf), str):
        setattr(target, leaf, value)
    else:
        del getattr(target, leaf)[:]
        getattr(target, leaf).append(value)


def _request(f: Fuzzed, method: str) -> Message:
    m = UNARY[method][1]
    base = well_formed(method, f)
    return base if base is not None else _nested_class(m.input_type)()


def _call(f: Fuzzed, method: str) -> Any:
    return getattr(_stub(f, UNARY[method][0]), method)


def test_the_id_table_covers_every_rpc_with_an_id() -> None:
    covered = {case.values[0] for case in ID_CASES}
    assert {"DeleteVolume", "NodeStageVolume", "CreateVolumeGroupSnapshot", "ListSnapshots"} <= covered
    assert any(case.values[1] == "volume_content_source.snapshot.snapshot_id" for case in ID_CASES)


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize(("method", "path"), ID_CASES)
def test_an_id_past_the_limits_is_invalid_argument_in_every_rpc(
    fuzzed: Fuzzed, method: str, path: str, bad: str
) -> None:
    """Spec "Size Limits" and string rules: an id over 128 bytes or with control characters is a malformed
    request, whatever RPC carries it (a delete too, where an unknown id would be OK)."""
    request = _request(fuzzed, method)
    _set(request, path, bad)
    assert answer(fuzzed, method, request) == Code.INVALID_ARGUMENT


REQUIRED = {
    "CreateVolume": ["name", "volume_capabilities"],
    "DeleteVolume": ["volume_id"],
    "ControllerPublishVolume": ["volume_id", "node_id", "volume_capability"],
    "ControllerUnpublishVolume": ["volume_id"],
    "ValidateVolumeCapabilities": ["volume_id", "volume_capabilities"],
    "CreateSnapshot": ["name", "source_volume_id"],
    "DeleteSnapshot": ["snapshot_id"],
    "GetSnapshot": ["snapshot_id"],
    "ControllerExpandVolume": ["volume_id", "capacity_range"],
    "ControllerGetVolume": ["volume_id"],
    "ControllerModifyVolume": ["volume_id", "mutable_parameters"],
    "CreateVolumeGroupSnapshot": ["name", "source_volume_ids"],
    "DeleteVolumeGroupSnapshot": ["group_snapshot_id"],
    "GetVolumeGroupSnapshot": ["group_snapshot_id"],
    "NodeStageVolume": ["volume_id", "staging_target_path", "volume_capability"],
    "NodeUnstageVolume": ["volume_id", "staging_target_path"],
    "NodePublishVolume": ["volume_id", "target_path", "volume_capability", "staging_target_path"],
    "NodeUnpublishVolume": ["volume_id", "target_path"],
    "NodeGetVolumeStats": ["volume_id", "volume_path"],
    "NodeExpandVolume": ["volume_id", "volume_path"],
}
# Where the spec names another code than INVALID_ARGUMENT for a missing field.
SPEC_CODE = {("NodePublishVolume", "staging_target_path"): Code.FAILED_PRECONDITION}


@pytest.mark.parametrize(
    ("method", "field"),
    [pytest.param(m, fld, id=f"{m}-no-{fld}") for m, fields in REQUIRED.items() for fld in fields],
)
def test_a_missing_required_field_is_invalid_argument(fuzzed: Fuzzed, method: str, field: str) -> None:
    request = _request(fuzzed, method)
    assert request.ListFields(), f"no well-formed {method} request to start from"
    request.ClearField(field)
    expected = SPEC_CODE.get((method, field), Code.INVALID_ARGUMENT)
    assert answer(fuzzed, method, request) == expected


AM = csi_pb2.VolumeCapability.AccessMode
NO_ACCESS_TYPE = csi_pb2.VolumeCapability(access_mode=AM(mode=AM.SINGLE_NODE_WRITER))
MODE_UNKNOWN = csi_pb2.VolumeCapability(
    mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=AM(mode=AM.UNKNOWN)
)
CAPABILITY_FIELDS = {
    "CreateVolume": "volume_capabilities",
    "ValidateVolumeCapabilities": "volume_capabilities",
    "ControllerPublishVolume": "volume_capability",
    "ControllerExpandVolume": "volume_capability",
    "NodeStageVolume": "volume_capability",
    "NodePublishVolume": "volume_capability",
    "NodeExpandVolume": "volume_capability",
    "GetCapacity": "volume_capabilities",
}


@pytest.mark.parametrize(
    "cap", [pytest.param(NO_ACCESS_TYPE, id="no-access-type"), pytest.param(MODE_UNKNOWN, id="mode-unknown")]
)
@pytest.mark.parametrize("method", list(CAPABILITY_FIELDS))
def test_a_malformed_capability_is_invalid_argument(
    fuzzed: Fuzzed, method: str, cap: csi_pb2.VolumeCapability
) -> None:
    """Every RPC that takes a capability refuses a malformed one (ValidateVolumeCapabilities too: only a
    well-formed capability can be merely unsupported)."""
    request = _request(fuzzed, method)
    field = getattr(request, CAPABILITY_FIELDS[method])
    if isinstance(field, csi_pb2.VolumeCapability):
        field.CopyFrom(cap)
    else:
        field.append(cap)
    assert answer(fuzzed, method, request) == Code.INVALID_ARGUMENT


UNKNOWN_VOLUME = "lv-" + "0" * 32
UNKNOWN_SNAPSHOT = "ls-" + "0" * 32
UNKNOWN = {
    # method: (field path, unknown id, the spec's code)
    "DeleteVolume": ("volume_id", UNKNOWN_VOLUME, Code.OK),
    "ControllerPublishVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "ControllerUnpublishVolume": ("volume_id", UNKNOWN_VOLUME, Code.OK),
    "ValidateVolumeCapabilities": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "CreateSnapshot": ("source_volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "DeleteSnapshot": ("snapshot_id", UNKNOWN_SNAPSHOT, Code.OK),
    "GetSnapshot": ("snapshot_id", UNKNOWN_SNAPSHOT, Code.NOT_FOUND),
    "ListSnapshots": ("source_volume_id", UNKNOWN_VOLUME, Code.OK),
    "ControllerExpandVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "ControllerGetVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "ControllerModifyVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "CreateVolume": ("volume_content_source.snapshot.snapshot_id", UNKNOWN_SNAPSHOT, Code.NOT_FOUND),
    "CreateVolumeGroupSnapshot": ("source_volume_ids", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "DeleteVolumeGroupSnapshot": ("group_snapshot_id", "lg-" + "1" * 32, Code.OK),
    "GetVolumeGroupSnapshot": ("group_snapshot_id", "lg-" + "1" * 32, Code.NOT_FOUND),
    "NodeStageVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "NodeUnstageVolume": ("volume_id", UNKNOWN_VOLUME, Code.OK),
    "NodePublishVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "NodeUnpublishVolume": ("volume_id", UNKNOWN_VOLUME, Code.OK),
    "NodeGetVolumeStats": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
    "NodeExpandVolume": ("volume_id", UNKNOWN_VOLUME, Code.NOT_FOUND),
}


@pytest.mark.parametrize("method", list(UNKNOWN))
def test_an_unknown_id_is_not_found_or_ok_where_the_spec_says(fuzzed: Fuzzed, method: str) -> None:
    path, unknown, expected = UNKNOWN[method]
    request = _request(fuzzed, method)
    _set(request, path, unknown)
    assert answer(fuzzed, method, request) == expected


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("NodeGetVolumeStats", "kubelet", id="stats-at-the-kubelet-root"),
        pytest.param("NodeGetVolumeStats", "sentinel", id="stats-outside-the-roots"),
        pytest.param("NodeExpandVolume", "kubelet", id="expand-at-the-kubelet-root"),
        pytest.param("NodeExpandVolume", "sentinel", id="expand-outside-the-roots"),
    ],
)
def test_reads_outside_the_allowed_roots_are_not_found(fuzzed: Fuzzed, method: str, path: str) -> None:
    """A staged volume asked about at an existing directory that is no volume path (the kubelet root
    itself, a directory elsewhere): NOT_FOUND, the volume is not there (csi-sanity expects that code for a
    relative path), and (checked by `answer`) nothing changes."""
    env = fuzzed.env
    vid = env.create(16 * MiB, name=f"staged-{method}-{path}")
    env.client.node.NodeStageVolume(env.stage_request(vid, env.publish_context(vid)), timeout=60)
    try:
        request: Any = _request(fuzzed, method)
        request.volume_id = vid
        request.volume_path = str(env.kubelet if path == "kubelet" else fuzzed.sentinel / "etc")
        assert answer(fuzzed, method, request) == Code.NOT_FOUND
    finally:
        env.unstage(vid)


@pytest.mark.parametrize("method", ["NodeGetVolumeStats", "NodeExpandVolume"])
def test_reads_of_an_unstaged_volume_are_not_found_and_prepare_nothing(fuzzed: Fuzzed, method: str) -> None:
    """A volume that exists but is not staged, asked about at an existing path under the roots: NOT_FOUND,
    and no loop device is bound over its file (the bug this replaces bound one and never released it)."""
    unstaged = fuzzed.env.create(16 * MiB, name=f"unstaged-{method}")
    (fuzzed.env.kubelet / "plugins" / "unstaged").mkdir(parents=True, exist_ok=True)
    request: Any = _request(fuzzed, method)
    request.volume_id = unstaged
    request.volume_path = str(fuzzed.env.kubelet / "plugins" / "unstaged")
    assert answer(fuzzed, method, request) == Code.NOT_FOUND
    assert not [b for _, b in host_state(fuzzed)["loops"] if unstaged in b]


ESCAPES = [
    pytest.param("escape", id="the-link-itself"),
    pytest.param("escape/etc", id="a-directory-it-leads-to"),
    pytest.param("escape/kubelet-lookalike/pods", id="an-empty-directory-it-leads-to"),
    pytest.param("escape/new/mount", id="a-new-directory-beyond-it"),
]
ESCAPING_FIELDS = [
    pytest.param("NodeStageVolume", "staging_target_path", id="stage"),
    pytest.param("NodeUnstageVolume", "staging_target_path", id="unstage"),
    pytest.param("NodePublishVolume", "target_path", id="publish-target"),
    pytest.param("NodePublishVolume", "staging_target_path", id="publish-staging"),
    pytest.param("NodeUnpublishVolume", "target_path", id="unpublish"),
]


@pytest.mark.parametrize("escape", ESCAPES)
@pytest.mark.parametrize(("method", "field"), ESCAPING_FIELDS)
def test_a_path_through_the_planted_escape_link_is_invalid_argument(
    fuzzed: Fuzzed, method: str, field: str, escape: str
) -> None:
    """`<kubelet>/escape` links to the sentinel tree: a staging or target path through it resolves out
    of the allowed roots (or is the link itself), so it is an unusable path and, checked by `answer`,
    nothing changes. (The reads answer NOT_FOUND for it: test_node_symlinks covers them.)"""
    request: Any = _request(fuzzed, method)
    setattr(request, field, f"{fuzzed.env.kubelet}/{escape}")
    assert answer(fuzzed, method, request) == Code.INVALID_ARGUMENT
