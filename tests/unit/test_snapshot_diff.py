"""`ballast-csi snapshot-diff` as a client (csi/snapshot_diff.py), without a driver: where a failed
stream says to resume, which endpoint forms it connects to, and the table's share of the volume."""

from __future__ import annotations

import grpc
import pytest

from csi import snapshot_diff
from csi._proto import csi_pb2
from csi.config import parse_args
from csi.snapshot_diff import Diff, render_table, run_snapshot_diff

GiB, MiB = 1024**3, 1024**2


class Broken(grpc.RpcError):
    """How a stream cut short surfaces from grpc."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection reset"


@pytest.mark.parametrize(
    ("starting_offset", "received", "resume"),
    [
        pytest.param(0, [(0, 4096), (8192, 4096)], 12288, id="after-the-end-of-the-last-range"),
        pytest.param(4096, [], 4096, id="nothing-received-resumes-where-it-started"),
    ],
)
def test_a_broken_stream_prints_nothing_and_says_where_to_resume(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    starting_offset: int,
    received: list[tuple[int, int]],
    resume: int,
) -> None:
    """Resuming at the START of the last range would fetch that range again."""

    def fetch(
        endpoint: str, request: csi_pb2.GetMetadataDeltaRequest, timeout: float, into: list[tuple[int, int]]
    ) -> Diff:
        into.extend(received)
        raise Broken()

    monkeypatch.setattr(snapshot_diff, "fetch", fetch)
    _, ns = parse_args(["snapshot-diff", "s-1", "s-2", "--starting-offset", str(starting_offset)])
    assert run_snapshot_diff(ns, "unix:///nowhere.sock") == 1
    out, err = capsys.readouterr()
    assert out == "", "no partial answer"
    assert f"after {len(received)} range(s): UNAVAILABLE: connection reset" in err, err
    assert err.rstrip().endswith(f"resume with --starting-offset {resume}"), err


@pytest.mark.parametrize(
    ("endpoint", "target"),
    [
        pytest.param("tcp://127.0.0.1:9000", "127.0.0.1:9000", id="tcp"),
        pytest.param("unix:///run/csi/csi.sock", "unix:///run/csi/csi.sock", id="unix"),
        pytest.param("/run/csi/csi.sock", "unix:///run/csi/csi.sock", id="bare-path"),
    ],
)
def test_the_endpoint_forms_become_grpc_targets(endpoint: str, target: str) -> None:
    assert snapshot_diff._target(endpoint) == target


@pytest.mark.parametrize(
    ("capacity", "ranges", "summary"),
    [
        pytest.param(GiB, [(0, 256 * MiB)], "1 range(s), 268435456 bytes changed (25.00% of", id="quarter"),
        pytest.param(GiB, [(0, GiB)], f"1 range(s), {GiB} bytes changed (100.00% of", id="all"),
        pytest.param(0, [], "0 range(s), 0 bytes changed (0.00% of", id="capacity-unknown"),
    ],
)
def test_the_table_ends_with_the_share_of_the_volume_changed(
    capacity: int, ranges: list[tuple[int, int]], summary: str
) -> None:
    table = render_table(Diff("VARIABLE_LENGTH", capacity, ranges))
    assert table.splitlines()[-1] == summary + " the volume)"
