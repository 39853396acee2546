"""Staging and target paths: the rule every node handler checks a path against before anything touches
the filesystem, and the safe way to create and remove what lies at a checked path.

The rule (check_path, placed): a path is accepted only when it is absolute, already normalised (no
`.`/`..` components, no repeated or trailing slashes), free of NUL and control characters, strictly
inside one of the allowed roots as written, and -- with every symbolic link in it followed -- still
strictly inside one of the allowed roots as they resolve. So a kubelet dir reached through a symlink (a
`/var/lib` that points elsewhere) is fine, while a symlink under the kubelet dir that leads out of it is
not. A path that is itself a symbolic link is refused as well: the node never mounts on, unmounts at or
removes a link. The check returns the resolved path: the node acts on it, and it is the form the mount
table shows. Violations raise InvalidParameterError (the CO gave an unusable path).

Acting (made_parent, found_parent, make_dirs): a symlink planted in a parent directory after the check
must not redirect a creation or a removal to somewhere else. Both walk down from the resolved root one
component at a time, opening each directory relative to the one above with O_NOFOLLOW|O_DIRECTORY, and
the caller creates or removes the last component relative to that directory's fd; a symlink met on the
way raises InvalidParameterError with nothing created or removed.

The window left: mount(2) and umount2(2) take a path string, so a parent swapped for a symlink between
the last check and that syscall still redirects it. Publishing and unmounting (csi/publishing.py) call
`check_reaches` / `recheck` right before the syscall, which narrows this to the gap between two
syscalls; so does the mount of a staged filesystem (csi/staging.py), which makes the staging directory
through make_dirs and re-checks it after the format. Closing the window would take mounting through
/proc/self/fd/N or the new mount API (open_tree/move_mount), which the mount-program fallback of
csi/mount.py cannot use.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import stat
from collections.abc import Iterator, Sequence

from csi.failures import InvalidParameterError

MAX_PATH_BYTES = 4096
_CONTROL = re.compile("[\x00-\x1f\x7f]")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_path(path: str, field: str, allowed_roots: Sequence[str]) -> str:
    """The resolved form of `path` when it is safe to act on, else InvalidParameterError naming `field`."""
    check_path_form(path, field)
    resolved, problem = placed(path, allowed_roots)
    if problem:
        raise InvalidParameterError(f"{field} {problem}")
    return resolved


def check_path_form(path: str, field: str) -> None:
    """A present path within the length limit and free of control characters (a malformed string)."""
    if not path:
        raise InvalidParameterError(f"{field} is required")
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise InvalidParameterError(f"{field} is longer than {MAX_PATH_BYTES} bytes")
    if _CONTROL.search(path):
        raise InvalidParameterError(f"{field} contains control characters")


def placed(path: str, allowed_roots: Sequence[str]) -> tuple[str, str]:
    """(the resolved path, "") when a well-formed path can hold a volume, else ("", why not): misplaced
    as written, outside the allowed roots once its symbolic links are followed, itself a symbolic link,
    or passing through one that does not resolve (a loop)."""
    problem = misplaced(path, allowed_roots)
    if problem:
        return "", problem
    # The last component is not followed: a path that is a link is refused below, not resolved.
    parent, complete = _resolve(os.path.dirname(path))
    resolved = os.path.join(parent, os.path.basename(path))
    roots = _resolved_once(tuple(allowed_roots))
    if not under_roots(resolved, roots):
        return "", (
            f"{path!r} resolves to {resolved!r}, outside the allowed directories ({', '.join(roots)}): "
            "a symbolic link on the way leads out of them"
        )
    # Every directory of a completely resolved parent is no link; else look for the one left standing.
    link = (resolved if _is_link(resolved) else "") if complete else _first_link(resolved)
    if link == resolved:
        return "", f"{path!r} is a symbolic link; staging and target paths must not be links"
    if link:
        return "", f"{path!r} passes through {link!r}, a symbolic link that does not resolve"
    return resolved, ""


def _resolve(directory: str) -> tuple[str, bool]:
    """(`directory` with its symbolic links followed, whether all of it exists and resolved): a missing
    part is kept as written, and a link that does not resolve (a loop) is left in place."""
    try:
        return os.path.realpath(directory, strict=True), True
    except OSError:
        return os.path.realpath(directory), False


def _is_link(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


@functools.lru_cache(maxsize=8)
def _resolved_once(roots: tuple[str, ...]) -> tuple[str, ...]:
    """The allowed roots resolved, once per set of roots: re-pointing a link above a root while the
    driver runs only narrows what is accepted (paths under its new target resolve outside the old
    one), so a stale answer fails closed."""
    return tuple(dict.fromkeys(resolved_roots(roots)))


def misplaced(path: str, allowed_roots: Sequence[str]) -> str:
    """Why a well-formed path can hold no volume as written (relative, not normalised, outside the
    allowed roots), or "" when it can. String checks only; `placed` adds the symbolic links."""
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
    return _root_of(path, roots) != ""


def resolved_roots(roots: Sequence[str]) -> tuple[str, ...]:
    """`roots` with every symbolic link in them followed (a missing part is kept as written)."""
    return tuple(os.path.realpath(root) for root in roots)


def with_resolved(roots: Sequence[str]) -> tuple[str, ...]:
    """`roots` followed by the resolved form of each that differs: the mount table shows resolved
    mount points, so a kubelet dir reached through a symlink is matched in either form."""
    extra = [r for r in resolved_roots(roots) if r not in roots]
    return (*roots, *dict.fromkeys(extra))


def _root_of(path: str, roots: Sequence[str]) -> str:
    """The longest of `roots` that `path` lies strictly below, or ""."""
    found = ""
    for root in roots:
        root = os.path.normpath(root)
        prefix = root if root.endswith("/") else root + "/"
        if path.startswith(prefix) and len(path) > len(prefix) and len(root) > len(found):
            found = root
    return found


def _first_link(path: str) -> str:
    """The first existing component of the absolute `path` that is a symbolic link, or "" (a missing
    component ends the search: nothing below it exists)."""
    current = ""
    for name in path.split("/")[1:]:
        current = f"{current}/{name}"
        try:
            if stat.S_ISLNK(os.lstat(current).st_mode):
                return current
        except OSError:
            return ""
    return ""


# ---------------------------------------------------------------------------- acting on a checked path


@contextlib.contextmanager
def made_parent(path: str, allowed_roots: Sequence[str]) -> Iterator[int]:
    """An fd of the directory holding `path` (a path check_path returned), reached by walking down from
    its allowed root; missing directories on the way are created. A symbolic link on the way (planted
    after the check) -> InvalidParameterError, nothing created below it."""
    fd = _walk(path, allowed_roots, create=True)
    assert fd is not None  # created on the way
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def found_parent(path: str, allowed_roots: Sequence[str]) -> Iterator[int | None]:
    """As made_parent, but nothing is created: None when a directory on the way is missing."""
    fd = _walk(path, allowed_roots, create=False)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def make_dirs(path: str, allowed_roots: Sequence[str], mode: int = 0o777) -> bool:
    """Create the directory `path` (a checked path) and its missing parents, each relative to the one
    above. True when it created `path`; an existing entry of any kind is left for the caller to judge.
    A directory already there (the CO made it, as it usually does) is left without a walk: nothing is
    created, so nothing can be created through a link; the caller's re-check before it mounts there
    still catches a link planted above it."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    with made_parent(path, allowed_roots) as parent:
        try:
            os.mkdir(os.path.basename(path), mode, dir_fd=parent)
        except FileExistsError:
            return False
        return True


def check_reaches(path: str, parent: int) -> None:
    """Right before a syscall that takes `path` as a string: the string must still lead to the directory
    `parent` (an fd from made_parent) and to the same entry in it, so no symbolic link was planted on
    the way since the walk. Else InvalidParameterError. For an entry that is no mount point: stat of
    a mount point reads the mounted filesystem, which may be failing (recheck is for those)."""
    name = os.path.basename(path)
    if not _same_dir(path, parent) or _identity(path, follow=False) != _identity(name, parent, follow=False):
        raise _changed(path, "a symbolic link was planted on the way")


def recheck(path: str, allowed_roots: Sequence[str]) -> None:
    """Before mounting from or unmounting at `path`, a mount point or nothing: walks down to its
    directory again, which the string must still lead to. The entry itself needs no check: a mount
    point cannot be removed or renamed over (EBUSY), and unmounting never follows a link (csi/mount.py)."""
    with found_parent(path, allowed_roots) as parent:
        moved = os.path.lexists(path) if parent is None else not _same_dir(path, parent)
    if moved:
        raise _changed(path, "a symbolic link was planted on the way")


def _same_dir(path: str, parent: int) -> bool:
    """Whether the string `path` leads to the directory `parent` holds (its parent, links followed)."""
    return _identity(os.path.dirname(path)) == _identity(parent)


def _identity(where: str | int, parent: int | None = None, follow: bool = True) -> tuple[int, int] | None:
    """(device, inode) of `where` (a path, an fd, or a name in the directory fd `parent`); None when
    it does not exist."""
    try:
        st = os.stat(where, dir_fd=parent, follow_symlinks=follow)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _changed(path: str, how: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"{path} changed while the driver was using it ({how}); nothing was changed there"
    )


def _walk(path: str, allowed_roots: Sequence[str], create: bool) -> int | None:
    root = _root_of(path, resolved_roots(allowed_roots))
    if not root:
        raise InvalidParameterError(f"{path!r} is outside the allowed directories")
    if create:
        os.makedirs(root, exist_ok=True)  # configured by the operator, not named by the CO
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    for name in path[len(root) + 1 :].split("/")[:-1]:
        try:
            below = _open_dir(fd, name, path, create)
        finally:
            os.close(fd)
        if below is None:
            return None
        fd = below
    return fd


def _open_dir(parent: int, name: str, path: str, create: bool) -> int | None:
    """The directory `name` in `parent`, never through a symbolic link; created first when `create`."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=parent)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if create:
            raise
        return None
    except OSError as exc:  # O_NOFOLLOW|O_DIRECTORY on a link: ENOTDIR (ELOOP without O_DIRECTORY)
        if exc.errno in (errno.ENOTDIR, errno.ELOOP) and stat.S_ISLNK(
            os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        ):
            raise _changed(path, f"{name!r} on the way is now a symbolic link") from None
        raise
