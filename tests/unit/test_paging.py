"""csi/backends/paging.py's seek paging: a page is cut only when more items remain than fit in it."""

from __future__ import annotations

import pytest

from csi.backends.paging import SEEK_TOKEN_PREFIX, seek_page
from csi.failures import InvalidTokenError

ITEMS = ["c", "a", "e", "b", "d"]


def _same(item: str) -> str:
    return item


@pytest.mark.parametrize(
    ("max_entries", "token", "items", "next_token"),
    [
        pytest.param(0, "", "abcde", "", id="no-limit-one-page"),
        pytest.param(5, "", "abcde", "", id="exactly-max-entries-left-is-the-last-page"),
        pytest.param(6, "", "abcde", "", id="fewer-than-max-entries-left"),
        pytest.param(4, "", "abcd", "after:d", id="one-more-than-max-entries-left"),
        pytest.param(2, "after:c", "de", "", id="resumed-with-exactly-max-entries-left"),
        pytest.param(1, "after:c", "d", "after:d", id="resumed-with-more-left"),
        pytest.param(3, "after:e", "", "", id="resumed-past-the-end"),
    ],
)
def test_seek_page(max_entries: int, token: str, items: str, next_token: str) -> None:
    page = seek_page(ITEMS, _same, max_entries, token)
    assert ("".join(page.items), page.next_token) == (items, next_token)


def test_every_item_once_over_pages_that_end_exactly_at_the_last_one() -> None:
    seen: list[str] = []
    token = ""
    for _ in range(len(ITEMS)):
        page = seek_page(ITEMS, _same, 1, token)
        seen += page.items
        token = page.next_token
    assert seen == sorted(ITEMS) and token == "", "a full last page must end the listing"


@pytest.mark.parametrize("token", ["bogus", SEEK_TOKEN_PREFIX], ids=["foreign", "prefix-only"])
def test_a_token_not_issued_here_is_refused(token: str) -> None:
    with pytest.raises(InvalidTokenError):
        seek_page(ITEMS, _same, 2, token)
