"""EC2 Describe filter values for one literal string.

EC2 reads `*` (any run of characters) and `?` (one character or none) in a filter value as wildcards,
and a backslash as their escape. A CSI name is an arbitrary string, so a lookup by name tag sends the
escaped name (`literal`) and keeps only the items whose tag is exactly that name (`tagged_exactly`): the
filter narrows the answer, the comparison decides. Emulators do not all read the escapes (moto matches
filter values as fnmatch patterns, where `backup-\\*` matches nothing), so `tag_filter` also sends the
name as it is when escaping changed it: a pattern always matches its own text, and what else it matches
is dropped by the comparison.
"""

from __future__ import annotations

from typing import Any

from csi.backends.aws.records import tags

_ESCAPED = str.maketrans({"\\": "\\\\", "*": "\\*", "?": "\\?"})


def literal(value: str) -> str:
    """`value` as an EC2 filter value that matches only itself: `backup-*` -> `backup-\\*`."""
    return value.translate(_ESCAPED)


def tag_filter(key: str, value: str) -> dict[str, Any]:
    """A filter whose answer holds every item whose tag `key` is `value`, and possibly others (keep the
    exact ones with tagged_exactly)."""
    return {"Name": f"tag:{key}", "Values": list(dict.fromkeys([literal(value), value]))}


def tagged_exactly(items: list[dict[str, Any]], key: str, value: str) -> list[dict[str, Any]]:
    """The items whose tag `key` is exactly `value`."""
    return [item for item in items if tags(item).get(key) == value]
