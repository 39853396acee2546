"""Typed access to plain Kubernetes JSON dicts, plus the few Go behaviours translations depend on.

Readers treat a missing key and JSON null alike (Go decodes both to the zero value) and raise
TranslationError when a field has the wrong JSON type, as Go's decoder would refuse it.
"""

from __future__ import annotations

import re
from typing import Any

from shim.errors import TranslationError

JSON = dict[str, Any]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_ATOI = re.compile(r"[+-]?[0-9]+")

# Go's unicode.IsSpace: ASCII white space, U+0085, U+00A0 and the Unicode Z categories in use.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)


def obj(value: Any, what: str) -> JSON | None:
    """`value` as a JSON object, or None for null; any other type is an error."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TranslationError(f"{what} must be an object, got {type(value).__name__}")
    return value


def child(parent: JSON, key: str) -> JSON | None:
    """The object under `key`, or None when missing or null."""
    return obj(parent.get(key), key)


def ensure_child(parent: JSON, key: str) -> JSON:
    """The object under `key`, created empty when missing or null."""
    found = child(parent, key)
    if found is None:
        found = {}
        parent[key] = found
    return found


def string(parent: JSON | None, key: str) -> str:
    """The string under `key`; "" when missing or null."""
    value = opt_string(parent, key)
    return "" if value is None else value


def opt_string(parent: JSON | None, key: str) -> str | None:
    """The string under `key`, or None when missing or null (a Go *string)."""
    value = None if parent is None else parent.get(key)
    if value is None or isinstance(value, str):
        return value
    raise TranslationError(f"{key} must be a string, got {type(value).__name__}")


def boolean(parent: JSON | None, key: str) -> bool:
    """The bool under `key`; False when missing or null."""
    value = opt_bool(parent, key)
    return bool(value)


def opt_bool(parent: JSON | None, key: str) -> bool | None:
    """The bool under `key`, or None when missing or null (a Go *bool)."""
    value = None if parent is None else parent.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise TranslationError(f"{key} must be a boolean, got {type(value).__name__}")


def int32(parent: JSON | None, key: str) -> int:
    """The int32 under `key`; 0 when missing or null."""
    value = None if parent is None else parent.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TranslationError(f"{key} must be an integer, got {type(value).__name__}")
    if not INT32_MIN <= value <= INT32_MAX:
        raise TranslationError(f"{key} {value} does not fit in int32")
    return value


def string_map(parent: JSON | None, key: str) -> dict[str, str] | None:
    """The string->string map under `key`, or None when missing or null."""
    value = None if parent is None else parent.get(key)
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise TranslationError(f"{key} must be a map of strings")
    return value


def set_metadata(obj: JSON, field: str, key: str, value: str) -> None:
    """Set metadata.<field>[key] (labels, annotations), creating metadata and the map when missing."""
    meta = ensure_child(obj, "metadata")
    found = string_map(meta, field)
    if found is None:
        found = {}
        meta[field] = found
    found[key] = value


def obj_list(parent: JSON | None, key: str) -> list[JSON] | None:
    """The list of objects under `key`, or None when missing or null."""
    value = None if parent is None else parent.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise TranslationError(f"{key} must be a list of objects")
    return value


def str_list(parent: JSON | None, key: str) -> list[str] | None:
    """The list of strings under `key`, or None when missing or null."""
    value = None if parent is None else parent.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TranslationError(f"{key} must be a list of strings")
    return value


def source(holder: JSON, key: str) -> JSON | None:
    """The volume source object under `key` (present and non-null), else None."""
    return obj(holder.get(key), key)


def compact(fields: JSON, keep: tuple[str, ...] = ()) -> JSON:
    """`fields` without Go's omitempty zero values ("", False, 0, None, {}, []), except the `keep` keys."""
    return {k: v for k, v in fields.items() if k in keep or not is_zero(v)}


def is_zero(value: Any) -> bool:
    """Whether Go's encoding/json omitempty would drop `value`."""
    if value is None or value is False:
        return True
    if isinstance(value, bool):
        return False
    if isinstance(value, str | dict | list):
        return len(value) == 0
    return isinstance(value, int) and value == 0


def atoi(text: str) -> int:
    """Go strconv.Atoi followed by int32(): optional sign, ASCII digits only, int64 range, wraps to int32."""
    if not _ATOI.fullmatch(text):
        raise TranslationError(f'strconv.Atoi: parsing "{text}": invalid syntax')
    value = int(text)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise TranslationError(f'strconv.Atoi: parsing "{text}": value out of range')
    return (value + 2**31) % 2**32 - 2**31


def go_string(raw: bytes) -> str:
    """Bytes as Go's JSON encoder shows a string: valid UTF-8 kept, each invalid byte becomes U+FFFD."""
    out: list[str] = []
    start = 0
    while start < len(raw):
        try:
            out.append(raw[start:].decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(raw[start : start + err.start].decode("utf-8"))
            out.append("\ufffd")
            start += err.start + 1
    return "".join(out)


def go_lower(text: str) -> str:
    """Go strings.ToLower (per-rune simple lower-casing; U+0130 maps to a plain 'i')."""
    if text.isascii():
        return text.lower()
    return "".join("i" if c == "\u0130" else (c.lower() if len(c.lower()) == 1 else c) for c in text)


def go_trim_space(text: str) -> str:
    """Go strings.TrimSpace (unicode.IsSpace, which differs from str.isspace on U+001C..U+001F)."""
    return text.strip(_GO_SPACE)
