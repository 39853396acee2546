"""The one csi-sanity spec we skip for a defect in csi-test itself still fails for exactly that reason.

"should succeed when creating a snapshot with accessibility requirements" (csi-test v5.6.0) compares the
Topology the driver returns with the one NodeGetInfo returned, using gomega Equal (reflect.DeepEqual).
The expected message was marshalled into the CreateVolume request first, which filled its internal size
cache, so the two differ in `sizeCache` even when their segments are identical. This test runs the spec
without the skip and checks that its failure is that and nothing else: if our topology were wrong the
segments would differ and this test fails; once csi-test compares with proto equality the spec passes,
this test fails, and the entry in SKIPPED_SPECS must go.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.conformance.conftest import SKIPPED_SPECS, run_sanity
from tests.conformance.driver import Driver

SPEC = "should succeed when creating a snapshot with accessibility requirements"
SEGMENTS = re.compile(r"Segments: \{(.*?)\}", re.S)
SIZE_CACHE = re.compile(r"sizeCache: (\d+)")


def test_the_skipped_accessibility_spec_fails_only_on_its_size_cache(
    driver: Driver, sanity_dir: Path
) -> None:
    assert any(re.search(pattern, SPEC) for pattern in SKIPPED_SPECS), "the spec is listed as skipped"
    result = run_sanity(driver, sanity_dir, focus=[re.escape(SPEC)], known_skips=False, timeout=300)
    failed = [name for name in result.failed if SPEC in name]
    assert failed, f"csi-sanity passes the spec now: remove it from SKIPPED_SPECS\n{result.summary()}"
    assert not result.passed and len(result.failed) == 1, result.summary()
    message = result.failed[failed[0]]
    returned, expected = SEGMENTS.findall(message)[:2]  # the report repeats the message in its text
    assert "topology.local.csi.ballast.dev/zone" in returned
    assert returned.split() == expected.split(), f"the driver returned another topology:\n{message}"
    caches = [int(n) for n in SIZE_CACHE.findall(message)[:2]]
    assert caches[0] == 0 and caches[1] > 0, f"not the size-cache defect:\n{message}"
