"""Hostile input: hypothesis-generated requests for every unary CSI RPC over the real unix socket, plus
raw wire bytes that are not valid requests at all.

Requests are built from the message descriptors, every field drawn from pools that mix well-formed
values (real volume and snapshot ids, paths under the kubelet dir, known parameter keys, allow-listed
mount flags) with hostile ones (traversal, paths elsewhere, control characters, unicode, strings and
maps past the spec's 128-byte / 4 KiB limits, unknown enum values, extreme integers). The driver must
never crash, never answer UNKNOWN, INTERNAL or UNAVAILABLE, never echo a secret in an error, and never
touch anything outside its data dir and the kubelet dir: a sentinel tree, the mount table and the loop
devices are compared before and after.
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

from csi import loop
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


# ---------------------------------------------------------------------------- the world under test


@dataclass
class Fuzzed:
    env: Local
    sentinel: Path
    volume_id: str
    snapshot_id: str
    publish_context: dict[str, str]
    before: dict[str, Any]

    @property
    def client(self) -> CsiClient:
        return self.env.client


def snapshot_fs(sentinel: Path) -> dict[str, Any]:
    """The sentinel tree (names, sizes, modes, mtimes), the mount table and the bound loop devices."""
    tree = {}
    for root, dirs, files in os.walk(sentinel):
        for name in dirs + files:
            p = os.path.join(root, name)
            st_ = os.lstat(p)
            tree[p] = (st_.st_size, st_.st_mode, st_.st_mtime_ns)
    mounts = {(m.mount_point, m.source) for m in Mounter().mounts()}
    loops = {dev: loop.backing_file(dev) for dev in loop._bound_devices()}
    return {"tree": tree, "mounts": mounts, "loops": loops}


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
    before = snapshot_fs(sentinel)
    env = start_local(tmp)
    os.symlink(sentinel, env.kubelet / "escape")  # a symlink under the root pointing out of it
    try:
        vid = env.create(16 * MiB, name="fuzz-seed")
        pc = env.publish_context(vid)
        snap = env.client.controller.CreateSnapshot(
            csi_pb2.CreateSnapshotRequest(name="fuzz-seed-snap", source_volume_id=vid), timeout=30
        ).snapshot.snapshot_id
        yield Fuzzed(env, sentinel, vid, snap, pc, before)
        assert env.client.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value
        after = snapshot_fs(sentinel)
        assert after["tree"] == before["tree"], "the sentinel tree changed"
        # Other test sessions on this host may mount and attach under their own pytest directories.
        others = str(tmp_path_factory.getbasetemp().parent) + "/"

        def foreign(path: str, allowed: Path) -> bool:
            inside = path.startswith(str(allowed) + "/")
            return not inside and (path.startswith(str(tmp) + "/") or not path.startswith(others))

        new_mounts = after["mounts"] - before["mounts"]
        outside = [m for m in new_mounts if foreign(m[0], env.kubelet)]
        assert not outside, f"mounts outside the kubelet dir: {outside}"
        new_loops = {d: b for d, b in after["loops"].items() if before["loops"].get(d) != b}
        stray = {d: b for d, b in new_loops.items() if b and foreign(b, env.data_dir)}
        assert not stray, f"loop devices over files outside the data dir: {stray}"
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


def check_answer(call: Any, request: Any) -> None:
    try:
        call(request, timeout=60)
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""
        assert code in ALLOWED, f"{code.name}: {details} for {request!r:.2000}"
        assert SECRET not in details, "a secret was echoed in an error message"
        assert "Traceback" not in details
        assert details, "an error without a message"


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
    k = str(f.env.kubelet)
    n = draw(SMALL_NAME)
    staging, target = f"{k}/plugins/{n}/globalmount", f"{k}/pods/{n}/mount"
    size = csi_pb2.CapacityRange(required_bytes=draw(st.sampled_from([MiB, 16 * MiB, 32 * MiB])))
    cap = mount_cap(draw(st.sampled_from(["", "ext4"])))
    vid = f.volume_id
    bases: dict[str, Any] = {
        "CreateVolume": lambda: csi_pb2.CreateVolumeRequest(
            name=f"fz-{n}", capacity_range=size, volume_capabilities=[cap]
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
        "ControllerExpandVolume": lambda: csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vid, capacity_range=size
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
    call = getattr(_stub(fuzzed, service), method)

    @SETTINGS
    @given(st.data())
    def run(data: st.DataObject) -> None:
        check_answer(call, data.draw(hostile(method, descriptor, fuzzed)))

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
        loop.backing_file(d) == str(fuzzed.sentinel / "etc" / "passwd") for d in loop._bound_devices()
    )
    assert NODE_ID
