"""Pages of a listing, and the seek paging most backends use to cut one."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Generic, NamedTuple, TypeVar

from csi.failures import InvalidTokenError

T = TypeVar("T")
SEEK_TOKEN_PREFIX = "after:"


class Page(NamedTuple, Generic[T]):
    """One page of a listing; `next_token` is empty on the last page."""

    items: Sequence[T]
    next_token: str = ""


def seek_page(
    items: Sequence[T],
    ident: Callable[[T], str],
    max_entries: int,
    token: str,
    id_form: re.Pattern[str] | None = None,
) -> Page[T]:
    """Seek paging over items ordered by `ident`: the token is the last id returned, so adding or
    removing items between pages never repeats one. A token not of this form, or whose id does not
    match `id_form` (the backend's ids, when they have one), -> InvalidTokenError: spec, ListVolumes /
    ListSnapshots, "Invalid starting_token ... ABORTED"."""
    ordered = sorted(items, key=ident)
    if token:
        last = token[len(SEEK_TOKEN_PREFIX) :]
        malformed = id_form is not None and not id_form.fullmatch(last)
        if not token.startswith(SEEK_TOKEN_PREFIX) or not last or malformed:
            raise InvalidTokenError(f"starting token {token!r} was not issued by this driver")
        ordered = [i for i in ordered if ident(i) > last]
    if max_entries and len(ordered) > max_entries:
        ordered = ordered[:max_entries]
        return Page(items=ordered, next_token=SEEK_TOKEN_PREFIX + ident(ordered[-1]))
    return Page(items=ordered)
