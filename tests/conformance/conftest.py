"""csi-sanity harness: run the suite against a driver started by tests.conformance.driver and read
per-spec results from its JUnit report.

`start_driver`/`running_driver` (driver.py) and `run_sanity` are plain functions so other suites (node
specs, the aws backend) reuse them with their own arguments. Every skipped spec is listed in
SKIPPED_SPECS with its reason; nothing is skipped anywhere else.
"""

from __future__ import annotations

import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conformance.driver import DRIVER, Driver, running_driver
from tests.conftest import require_tool

# The one list of csi-sanity specs we do not run: regex over the spec text -> reason. Everything else in
# the suite runs; a spec that skips itself for any other reason fails the conformance test.
SKIPPED_SPECS: dict[str, str] = {
    r"ListVolumes pagination should detect volumes added between pages": (
        "disabled upstream: the spec is an XIt (pending) in csi-test v5.6.0"
    ),
    r"should succeed when creating a snapshot with accessibility requirements": (
        "broken upstream in csi-test v5.6.0 for every driver that reports the optional accessible_topology: "
        "it compares the returned Topology with gomega Equal (reflect.DeepEqual), and the expected one was "
        "marshalled into the request before, which set its internal size cache, so two equal messages "
        "differ (proto.Equal: true, reflect.DeepEqual: false). The same check, made with proto equality, "
        "runs in tests/integration/test_controller.py::test_snapshot_accessibility_over_the_socket"
    ),
}


@dataclass
class SanityResult:
    returncode: int
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # spec -> failure message
    skipped: dict[str, str] = field(default_factory=dict)  # spec -> skip message
    output: str = ""

    def self_skipped(self) -> dict[str, str]:
        """Specs that were selected but skipped themselves (a missing capability or flag), with why."""
        return {n: m for n, m in self.skipped.items() if m not in ("skipped", "pending")}

    def summary(self) -> str:
        lines = [f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.skipped)} skipped"]
        lines += [f"FAILED {name}\n    {msg[:1500]}" for name, msg in self.failed.items()]
        return "\n".join(lines)


def _parse_junit(path: Path, result: SanityResult) -> None:
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            result.failed[name] = (failure.get("message") or "") + "\n" + (failure.text or "")
        elif (skipped := case.find("skipped")) is not None:
            result.skipped[name] = skipped.get("message") or ""
        else:
            result.passed.append(name)


def run_sanity(
    driver: Driver,
    workdir: Path,
    *,
    focus: Sequence[str] = (),
    skip: Sequence[str] = (),
    flags: Sequence[str] = (),
    timeout: float = 900,
    known_skips: bool = True,
) -> SanityResult:
    """Run csi-sanity against `driver`; `focus`/`skip` are ginkgo regexes (SKIPPED_SPECS applies unless
    `known_skips` is False), `flags` extra `-csi.*` options. Staging and mount dirs live under `workdir`."""
    sanity = require_tool("csi-sanity")
    junit = workdir / "sanity-junit.xml"
    argv = [
        sanity,
        f"-csi.endpoint={driver.socket}",
        f"-csi.stagingdir={workdir / 'staging'}",
        f"-csi.mountdir={workdir / 'mount'}",
        f"-ginkgo.junit-report={junit}",
        "-ginkgo.no-color",
        *[f"-ginkgo.focus={f}" for f in focus],
        *[f"-ginkgo.skip={s}" for s in (*skip, *(SKIPPED_SPECS if known_skips else ()))],
        *flags,
    ]
    proc = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, cwd=workdir)
    output = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    result = SanityResult(returncode=proc.returncode, output=output)
    if junit.exists():
        _parse_junit(junit, result)
    return result


@pytest.fixture
def sanity_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short work dir (unix socket paths are limited to 108 bytes)."""
    path = Path(tmp_path_factory.mktemp("sanity", numbered=True))
    if len(str(path / "csi.sock")) > 100:
        path = Path(tempfile.mkdtemp(prefix="sanity-"))
    return path


@pytest.fixture
def driver(sanity_dir: Path) -> Iterator[Driver]:
    """The driver in `all` mode with the local backend; stopped (and the process reaped) even when the
    test fails."""
    require_tool("csi-sanity")
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} missing: run scripts/setup", pytrace=False)
    with running_driver(sanity_dir) as d:
        yield d


def write_yaml_map(path: Path, values: dict[str, str]) -> Path:
    """A flat YAML map (what the -csi.test*parameters flags read)."""
    path.write_text("".join(f'{k}: "{v}"\n' for k, v in values.items()))
    return path
