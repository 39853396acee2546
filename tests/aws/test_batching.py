"""Batched Describe calls (--aws-describe-batch-window) and ListVolumes over EC2's own paging.

The batcher is checked on its own (one fetch for the keys that arrive together, each caller gets its
own records, an error reaches every caller) and through the backend against moto behind the proxy,
which counts calls and holds volumes `creating` and attachments `attaching` as EC2 does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from csi import failures
from csi.backends import base
from csi.backends.aws import AwsBackend
from csi.backends.aws.batching import MAX_KEYS, Batcher, grouped
from csi.backends.aws.ec2 import Backoff
from csi.backends.aws.listing import Listings
from csi.config import parse_args
from tests.motoproxy import MotoProxy, running_proxy
from tests.motoserver import make_client, run_instance

GiB = base.GiB


def opts() -> base.DiskOptions:
    return base.DiskOptions(size_bytes=GiB, parameters={"type": "gp3"})


# ---------------------------------------------------------------------------- the batcher alone


class Fetches:
    """A fetch that records its calls and holds the first until released."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.fail: Exception | None = None

    def __call__(self, keys: list[str]) -> dict[str, list[dict[str, Any]]]:
        self.calls.append(keys)
        if self.fail is not None:
            raise self.fail
        return {k: [{"Key": k}] for k in keys if not k.startswith("missing")}


def lookups(batcher: Batcher, keys: list[str]) -> list[Any]:
    """Look every key up at once; each result, or the exception raised."""
    start = threading.Barrier(len(keys))

    def one(key: str) -> Any:
        start.wait()
        try:
            return batcher.get(key)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(keys)) as pool:
        return list(pool.map(one, keys))


def test_lookups_in_one_window_share_one_call_and_get_their_own_records() -> None:
    fetch = Fetches()
    keys = ["vol-a", "vol-b", "missing-c", "vol-a"]
    results = lookups(Batcher(fetch, window=1.0), keys)
    assert fetch.calls == [["missing-c", "vol-a", "vol-b"]]
    assert results == [[{"Key": "vol-a"}], [{"Key": "vol-b"}], [], [{"Key": "vol-a"}]]


def test_a_failed_call_fails_every_lookup_of_its_batch() -> None:
    fetch = Fetches()
    fetch.fail = failures.TransientError("EC2 DescribeVolumes: throttled")
    results = lookups(Batcher(fetch, window=1.0), ["vol-a", "vol-b"])
    assert len(fetch.calls) == 1
    assert all(isinstance(r, failures.TransientError) and "throttled" in str(r) for r in results)


def test_a_full_batch_is_sent_without_waiting_out_the_window() -> None:
    fetch = Fetches()
    keys = [f"vol-{i:04d}" for i in range(MAX_KEYS)]
    results = lookups(Batcher(fetch, window=600.0), keys)  # a wait for the window would time the test out
    assert [len(c) for c in fetch.calls] == [MAX_KEYS]
    assert results == [[{"Key": k}] for k in keys]


def test_grouped_drops_records_without_a_key() -> None:
    records: list[dict[str, Any]] = [{"Id": "a"}, {"Id": "b"}, {"Other": 1}, {"Id": "a", "n": 2}]
    assert grouped(records, lambda r: r.get("Id")) == {
        "a": [{"Id": "a"}, {"Id": "a", "n": 2}],
        "b": [{"Id": "b"}],
    }


@pytest.mark.parametrize(
    ("flag", "window"), [pytest.param("0", 0.0, id="off"), pytest.param("0.25", 0.25, id="quarter-second")]
)
def test_the_window_flag(flag: str, window: float) -> None:
    config, _ = parse_args(["--backend", "aws", "--aws-describe-batch-window", flag])
    assert config.backend.aws_describe_batch_window == window


@pytest.mark.parametrize("flag", ["0.6", "-1", "soon", "1e-3x"])
def test_the_window_flag_refuses_what_is_not_0_to_half_a_second(flag: str) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--backend", "aws", "--aws-describe-batch-window", flag])


# ---------------------------------------------------------------------------- through moto


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[MotoProxy]:
    with running_proxy(moto_endpoint, seed=11) as served:
        yield served


@pytest.fixture
def via_proxy(
    make_backend: Callable[..., AwsBackend], proxy: MotoProxy, account: str
) -> Callable[..., AwsBackend]:
    def build(**overrides: Any) -> AwsBackend:
        return make_backend(client=make_client(proxy.endpoint, account), **overrides)

    return build


def create_and_attach(backend: AwsBackend, names: list[str], node: str) -> list[str]:
    def one(name: str) -> str:
        disk = backend.create_volume(name, opts())
        backend.attach(disk.id, node, False)
        return disk.id

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(one, names))


def describes(proxy: MotoProxy) -> int:
    return sum(n for action, n in proxy.calls.items() if action.startswith("Describe"))


def test_batching_serves_concurrent_creates_and_attaches_with_fewer_describe_calls(
    via_proxy: Callable[..., AwsBackend], proxy: MotoProxy, ec2: Any
) -> None:
    node = run_instance(ec2)
    proxy.hold("creating", 2)
    proxy.hold("attaching", 2)
    counts = {}
    for window in (0.0, 0.2):
        backend = via_proxy(describe_batch_window=window, wait_timeout=30.0)
        proxy.calls.clear()
        ids = create_and_attach(backend, [f"pvc-w{window}-{i}" for i in range(12)], node)
        counts[window] = describes(proxy)
        for vid in ids:  # every volume really is attached where it was asked to be
            attachments = backend.get_volume(vid).attachments
            assert [a.node_id for a in attachments] == [node]
    assert counts[0.2] * 2 < counts[0.0], counts


def test_a_batched_lookup_of_an_unknown_volume_fails_alone(
    via_proxy: Callable[..., AwsBackend], proxy: MotoProxy
) -> None:
    backend = via_proxy(describe_batch_window=0.2)
    known = [backend.create_volume(f"pvc-k{i}", opts()).id for i in range(3)]
    proxy.calls.clear()
    lookups_at_once = [*known, "vol-0123456789abcdef0"]
    start = threading.Barrier(len(lookups_at_once))

    def get(vid: str) -> Any:
        start.wait()
        try:
            return backend.get_volume(vid).id
        except failures.NotFoundError as exc:
            return exc

    with ThreadPoolExecutor(len(lookups_at_once)) as pool:
        results = list(pool.map(get, lookups_at_once))
    assert results[:3] == known
    assert isinstance(results[3], failures.NotFoundError)
    assert proxy.calls["DescribeVolumes"] == 1


def test_batched_operations_ride_out_throttling(
    via_proxy: Callable[..., AwsBackend], proxy: MotoProxy, ec2: Any
) -> None:
    node = run_instance(ec2)
    backend = via_proxy(
        describe_batch_window=0.05,
        backoff=Backoff(attempts=8, initial=0.001, maximum=0.01),
        wait_timeout=30.0,
    )
    proxy.fail("*", "RequestLimitExceeded", rate=0.1)
    ids = create_and_attach(backend, [f"pvc-busy-{i}" for i in range(10)], node)
    assert len(set(ids)) == 10
    assert sum(proxy.refused.values()) > 0, "the proxy throttled nothing"
    assert sum(backend.retries().values()) == sum(proxy.refused.values())


# ---------------------------------------------------------------------------- ListVolumes paging


def page_through(backend: AwsBackend, max_entries: int) -> tuple[list[str], int]:
    seen: list[str] = []
    token, pages = "", 0
    while True:
        page = backend.list_volumes(max_entries=max_entries, starting_token=token)
        pages += 1
        assert max_entries == 0 or len(page.items) <= max_entries
        seen.extend(d.id for d in page.items)
        token = page.next_token
        if not token:
            return seen, pages


@pytest.mark.parametrize("max_entries", [0, 1, 2, 5, 7, 40])
def test_a_listing_sweeps_ec2_once_however_small_its_pages(
    via_proxy: Callable[..., AwsBackend], proxy: MotoProxy, max_entries: int
) -> None:
    backend = via_proxy(page_size=10)
    made = sorted(backend.create_volume(f"pvc-list-{i}", opts()).id for i in range(23))
    proxy.calls.clear()
    seen, pages = page_through(backend, max_entries)
    assert seen == made, "not every volume once, in id order"
    assert pages == (1 if max_entries == 0 else -(-len(made) // max_entries))
    # one sweep for the whole listing: 3 pages of 10 for CSIVolumeName, 1 empty for the in-tree tag
    assert proxy.calls["DescribeVolumes"] == 4


def test_a_listing_is_one_consistent_snapshot_and_misses_nothing_that_stayed(
    via_proxy: Callable[..., AwsBackend],
) -> None:
    backend = via_proxy(page_size=10)
    made = sorted(backend.create_volume(f"pvc-snap-{i}", opts()).id for i in range(8))
    first = backend.list_volumes(max_entries=3)
    assert [d.id for d in first.items] == made[:3] and first.next_token
    backend.delete_volume(made[2])  # the last of the page
    backend.delete_volume(made[5])  # one still to come
    added = backend.create_volume("pvc-snap-new", opts()).id
    rest: list[str] = []
    token = first.next_token
    while token:
        page = backend.list_volumes(max_entries=3, starting_token=token)
        rest.extend(d.id for d in page.items)
        token = page.next_token
    assert rest == made[3:], "the pages after the first are not the snapshot the first page was cut from"
    fresh = {d.id for d in backend.list_volumes().items}
    assert fresh == (set(made) - {made[2], made[5]}) | {added}


def test_snapshots_are_bounded_and_a_token_outlives_its_snapshot() -> None:
    now = [0.0]
    volumes = [{"VolumeId": f"vol-{i:017x}"} for i in range(6)]
    sweeps: list[int] = []  # one entry per sweep of EC2

    def sweep() -> list[dict[str, str]]:
        sweeps.append(len(volumes))
        return list(volumes)

    held = Listings(sweep, keep=2, ttl=60.0, clock=lambda: now[0])
    first = held.page(2, "")
    others = [held.page(2, "") for _ in range(2)]  # two more listings: the first one's snapshot is evicted
    assert len(sweeps) == 3 and all(o.next_token for o in others)
    volumes.pop(3)  # gone before the first listing resumes
    resumed = held.page(0, first.next_token)
    assert len(sweeps) == 4, "an evicted snapshot was not swept again"
    assert [v["VolumeId"] for v in resumed.items] == [f"vol-{i:017x}" for i in (2, 4, 5)]
    second = held.page(2, others[1].next_token)
    now[0] = 61.0
    held.page(2, second.next_token)
    assert len(sweeps) == 5, "an expired snapshot was served"


@pytest.mark.parametrize(
    "token",
    ["after:vol-1", "lvs::vol-0123456789abcdef0", "lvs:abc:vol-1", "ec2:0::", "vol-0123456789abcdef0"],
)
def test_a_token_this_driver_did_not_issue_is_refused(token: str) -> None:
    with pytest.raises(failures.InvalidTokenError):
        Listings(list).page(0, token)
