"""Validation of staging and target paths before anything touches the filesystem.

A path is accepted only when it is absolute, already normalised (no `.`/`..` components, no repeated or
trailing slashes), free of NUL and control characters, and strictly inside one of the allowed roots.
Violations raise InvalidParameterError. Pure string checks: symlinks are not resolved here (the mount layer
refuses to follow a symlinked target separately).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from csi.failures import InvalidParameterError

MAX_PATH_BYTES = 4096


def check_path(path: str, field: str, allowed_roots: Sequence[str]) -> str:
    """Return `path` unchanged when it is safe to use, else raise InvalidParameterError naming `field`."""
    check_path_form(path, field)
    problem = misplaced(path, allowed_roots)
    if problem:
        raise InvalidParameterError(f"{field} {problem}")
    return path


def check_path_form(path: str, field: str) -> None:
    """A present path within the length limit and free of control characters (a malformed string)."""
    if not path:
        raise InvalidParameterError(f"{field} is required")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidParameterError(f"{field} is longer than {MAX_PATH_BYTES} bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidParameterError(f"{field} contains control characters")


def misplaced(path: str, allowed_roots: Sequence[str]) -> str:
    """Why a well-formed path can hold no volume (relative, not normalised, outside the allowed roots),
    or "" when it can."""
    if not path.startswith("/"):
        return f"must be an absolute path, got {path!r}"
    if ".." in path.split("/"):
        return f"must not contain '..', got {path!r}"
    if os.path.normpath(path) != path:
        return f"must be normalised (no '.', '//' or trailing '/'), got {path!r}"
    if not under_roots(path, allowed_roots):
        roots = ", ".join(allowed_roots) or "(none configured)"
        return f"{path!r} is outside the allowed directories ({roots}); add one with --allowed-path-prefix"
    return ""


def under_roots(path: str, roots: Sequence[str]) -> bool:
    """True when `path` lies strictly below one of `roots` (a root itself is not a valid volume path)."""
    for root in roots:
        root = os.path.normpath(root)
        prefix = root if root.endswith("/") else root + "/"
        if path.startswith(prefix) and len(path) > len(prefix):
            return True
    return False
