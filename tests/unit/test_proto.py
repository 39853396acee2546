"""proto/csi.proto is wire-identical to CSI v1.13, and the committed stubs are what it generates."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, text_format
from grpc_tools import protoc

from tests.conftest import REPO, require_tool

SPEC_MODULE = "github.com/container-storage-interface/spec@v1.13.0"


def _descriptor(proto_file: Path, tmp_path: Path, tag: str) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / f"{tag}.pb"
    include = Path(protoc.__file__).resolve().parent / "_proto"
    rc = protoc.main(
        ["protoc", f"-I{proto_file.parent}", f"-I{include}", f"--descriptor_set_out={out}", str(proto_file)]
    )
    assert rc == 0, f"protoc failed on {proto_file}"
    fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (fd,) = fds.file
    fd.ClearField("source_code_info")
    return fd


def _official_proto() -> Path:
    go = require_tool("go")
    done = subprocess.run(
        [go, "mod", "download", "-json", SPEC_MODULE], capture_output=True, text=True, cwd="/", check=False
    )
    assert done.returncode == 0, f"go mod download failed: {done.stderr or done.stdout}"
    return Path(json.loads(done.stdout)["Dir"]) / "csi.proto"


def test_proto_matches_official_descriptor(tmp_path: Path) -> None:
    ours = _descriptor(REPO / "proto" / "csi.proto", tmp_path, "ours")
    official = _descriptor(_official_proto(), tmp_path, "official")
    if ours != official:
        diff = difflib.unified_diff(
            text_format.MessageToString(official).splitlines(),
            text_format.MessageToString(ours).splitlines(),
            "official",
            "proto/csi.proto",
            lineterm="",
        )
        pytest.fail("proto/csi.proto drifted from CSI v1.13:\n" + "\n".join(list(diff)[:80]))


def test_secret_fields_are_marked() -> None:
    from csi._proto import csi_pb2

    fd = csi_pb2.CreateVolumeRequest.DESCRIPTOR.fields_by_name["secrets"]
    options: Any = fd.GetOptions()  # the stubs cannot type an extension lookup by a custom option
    assert options.Extensions[csi_pb2.csi_secret] is True


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    committed = REPO / "csi" / "_proto"
    names = sorted(p.name for p in tmp_path.iterdir() if p.suffix in (".py", ".pyi"))
    assert names == sorted(p.name for p in committed.iterdir() if p.suffix in (".py", ".pyi"))
    stale = [n for n in names if (tmp_path / n).read_bytes() != (committed / n).read_bytes()]
    assert not stale, f"stale generated stubs {stale}: run `make proto` and commit"
