"""csi-sanity (kubernetes-csi/csi-test v5) against the real driver with the local backend.

Every controller capability is on (snapshots with accessibility constraints, clone, expand, capacity,
volume health, modify with mutable parameters, single-node multi-writer, attach limit) plus the group
controller. The specs not run
are listed with their reasons in conftest.SKIPPED_SPECS.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.conftest import run_sanity, write_yaml_map
from tests.conformance.driver import running_driver
from tests.conftest import require_tool

pytestmark = pytest.mark.slow

# Controller, identity and group controller specs (ginkgo focus regexes).
CONTROLLER_FOCUS = (r"\[Controller Server\]", r"Identity Service", r"GroupController")
# Mutable parameters the local backend accepts (csi/backends/local/backend.py MUTABLE_PARAMETERS).
MUTABLE_PARAMETERS = {"iops": "3000", "tier": "performance"}
# A small attach limit keeps the attach-limit spec (which fills the node) quick.
MAX_VOLUMES_PER_NODE = "4"


def test_controller_identity_and_group_specs(sanity_dir: Path) -> None:
    require_tool("csi-sanity")
    mutable = write_yaml_map(sanity_dir / "mutable.yaml", MUTABLE_PARAMETERS)
    with running_driver(sanity_dir, "--max-volumes-per-node", MAX_VOLUMES_PER_NODE) as driver:
        result = run_sanity(
            driver,
            sanity_dir,
            focus=CONTROLLER_FOCUS,
            flags=[f"-csi.testvolumemutableparameters={mutable}", "-csi.testnodevolumeattachlimit"],
        )
    assert result.passed, f"no spec ran:\n{result.output[-4000:]}"
    assert not result.failed, result.summary()
    assert not result.self_skipped(), (
        f"specs skipped themselves; fix or list in SKIPPED_SPECS: {result.self_skipped()}"
    )
    assert result.returncode == 0, result.output[-4000:]
    ran = "\n".join(result.passed)
    for feature in (
        "ModifyVolume",
        "GroupController",
        "CreateSnapshot",
        "ExpandVolume",
        "max attach limit",
        "ControllerGetVolumeHealth",
        "ControllerListVolumeHealth",
    ):
        assert feature in ran, f"no {feature} spec passed; is the capability advertised?"
    assert driver.proc.returncode == 0, f"driver did not stop cleanly:\n{driver.log.read_text()[-4000:]}"
