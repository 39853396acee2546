"""csi-sanity with every spec (controller, node, whole lifecycles) against the real driver in `all` mode
with the local backend on real loop devices: once with mount access, once with raw block access.

Reuses the controller harness (tests/conformance/conftest.py); its SKIPPED_SPECS list is the only place
specs are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conformance.conftest import SKIPPED_SPECS, run_sanity, write_yaml_map
from tests.conformance.driver import running_driver
from tests.conformance.test_sanity import MAX_VOLUMES_PER_NODE, MUTABLE_PARAMETERS
from tests.conftest import require_root, require_tool

pytestmark = pytest.mark.slow

# Small volumes keep mkfs quick; the expand size exercises online growth.
SIZE_FLAGS = ["-csi.testvolumesize=67108864", "-csi.testvolumeexpandsize=134217728"]
NODE_SPECS = (
    "NodeStageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume should remove target path",
    "NodeExpandVolume should work",
    "NodeGetVolumeStats",
    "NodeGetVolumeHealth",
    "NodeGetStorageHealth",
    "ControllerGetVolumeHealth",
    "Node Service should work",
    "Node Service should be idempotent",
)


@pytest.mark.parametrize(
    "access_flags",
    [
        pytest.param([], id="mount"),
        pytest.param(["-csi.testvolumeaccesstype=block"], id="block"),
    ],
)
def test_all_specs_with_node(sanity_dir: Path, access_flags: list[str]) -> None:
    require_root()
    require_tool("csi-sanity")
    for tool in ("mkfs.ext4", "blkid", "e2fsck"):
        require_tool(tool)
    mutable = write_yaml_map(sanity_dir / "mutable.yaml", MUTABLE_PARAMETERS)
    with running_driver(sanity_dir, "--max-volumes-per-node", MAX_VOLUMES_PER_NODE) as driver:
        result = run_sanity(
            driver,
            sanity_dir,
            flags=[
                *SIZE_FLAGS,
                *access_flags,
                f"-csi.testvolumemutableparameters={mutable}",
                "-csi.testnodevolumeattachlimit",
            ],
        )
    assert result.passed, f"no spec ran:\n{result.output[-4000:]}"
    assert not result.failed, result.summary() + "\n" + driver.log.read_text()[-3000:]
    assert not result.self_skipped(), (
        f"specs skipped themselves; fix or list in SKIPPED_SPECS: {result.self_skipped()}"
    )
    assert result.returncode == 0, result.output[-4000:]
    assert set(result.skipped) <= {n for n in result.skipped if any(re.search(p, n) for p in SKIPPED_SPECS)}
    print(result.summary().splitlines()[0])
    ran = "\n".join(result.passed)
    for spec in NODE_SPECS:
        assert spec in ran, f"no {spec!r} spec passed"
    assert driver.proc.returncode == 0, f"driver did not stop cleanly:\n{driver.log.read_text()[-4000:]}"
