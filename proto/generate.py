"""Regenerate the committed Python stubs in csi/_proto/ from proto/csi.proto.

Usage: python proto/generate.py [OUTPUT_DIR]   (default: csi/_proto; `make proto` runs this)

The grpc stub imports its message module as a top-level name; it is rewritten to the package
path so the stubs work from inside the `csi` package. tests/unit/test_proto.py runs this into a
temporary directory and compares the result with what is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = PROTO_DIR.parent / "csi" / "_proto"


def generate(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_DIR / "csi.proto"),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    grpc_file = out_dir / "csi_pb2_grpc.py"
    package_import = "from csi._proto import csi_pb2 as csi__pb2"
    grpc_file.write_text(grpc_file.read_text().replace("import csi_pb2 as csi__pb2", package_import))
    init = out_dir / "__init__.py"
    init.write_text('"""Generated CSI v1.13 stubs; regenerate with `make proto`, never edit by hand."""\n')
    return sorted(out_dir.glob("*.py*"))


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    for path in generate(target):
        print(path)
