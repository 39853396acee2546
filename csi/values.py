"""Small parsers for the string values of StorageClass parameters, mutable parameters and volume
attributes. Each parser returns the normalised value or raises ValueError whose text completes the
sentence "expected ..."; `checked` turns that into InvalidParameterError naming the key."""

from __future__ import annotations

import re
from collections.abc import Callable

from csi.failures import InvalidParameterError

Parser = Callable[[str], str]
_DIGITS = re.compile(r"[0-9]{1,20}")


def _number(value: str) -> int | None:
    return int(value) if _DIGITS.fullmatch(value) else None


def whole(low: int, high: int) -> Parser:
    """A whole number from `low` to `high`, normalised (no leading zeros)."""

    def parse(value: str) -> str:
        n = _number(value)
        if n is None or not low <= n <= high:
            raise ValueError(f"a whole number from {low} to {high}")
        return str(n)

    return parse


def power_of_two(low: int, high: int) -> Parser:
    """A power of two from `low` to `high`."""

    def parse(value: str) -> str:
        n = _number(value)
        if n is None or not low <= n <= high or n & (n - 1):
            raise ValueError(f"a power of two from {low} to {high}")
        return str(n)

    return parse


def boolean(value: str) -> str:
    """true or false, any case; returned in lower case."""
    if value.lower() not in ("true", "false"):
        raise ValueError("true or false")
    return value.lower()


def choice(*allowed: str) -> Parser:
    """Exactly one of `allowed`."""

    def parse(value: str) -> str:
        if value not in allowed:
            raise ValueError(f"one of {', '.join(allowed)}")
        return value

    return parse


def checked(parser: Parser, key: str, value: str, what: str = "parameter") -> str:
    """`parser(value)`; a bad value -> InvalidParameterError "<what> <key>=<value>: expected ..."."""
    try:
        return parser(value)
    except ValueError as exc:
        raise InvalidParameterError(f"{what} {key}={value!r}: expected {exc}") from exc
