"""Which backends exist, by name. `local` and `aws` come with the driver. Any installed Python
distribution can add more through the `ballast.backends` entry-point group: each entry is
`<name> = "<module>:<Backend subclass>"`, whose `from_config` builds it from the driver's configuration
(docs/writing-a-backend.md). A backend module is imported only when its backend is chosen (boto3 only
for aws); the entry points are read only for a name that is not built in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "ballast.backends"


class Builtin(NamedTuple):
    target: str  # "module:Class"
    driver_name: str  # the class's default_driver_name, known here without importing the module


BUILTIN: dict[str, Builtin] = {
    "local": Builtin("csi.backends.local:LocalBackend", "local.csi.ballast.dev"),
    "aws": Builtin("csi.backends.aws:AwsBackend", "ebs.csi.aws.com"),
}


class UnknownBackend(ValueError):
    """No built-in backend and no installed entry point has this name."""


def _entry_points() -> dict[str, EntryPoint]:
    from importlib.metadata import entry_points  # some 10 ms: only when a name is not built in

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name not in BUILTIN}


def names() -> list[str]:
    """Every backend name this installation offers: the built-in ones, then the installed ones."""
    return [*BUILTIN, *sorted(_entry_points())]


def check_name(name: str) -> str:
    """`name` when a backend of that name exists, else UnknownBackend listing the ones that do."""
    if name in BUILTIN or name in _entry_points():
        return name
    raise UnknownBackend(
        f"unknown backend {name!r}; available: {', '.join(names())} (more arrive as packages declaring "
        f"the {ENTRY_POINT_GROUP!r} entry-point group)"
    )


def load(name: str) -> object:
    """What the backend `name` registers (a Backend subclass, checked by the caller); UnknownBackend
    when there is none."""
    builtin = BUILTIN.get(name)
    if builtin is not None:
        module, _, attribute = builtin.target.partition(":")
        return getattr(importlib.import_module(module), attribute)
    entry = _entry_points().get(check_name(name))
    assert entry is not None
    return entry.load()


def default_driver_name(name: str) -> str:
    """The CSI driver name a backend registers under unless --driver-name says otherwise."""
    builtin = BUILTIN.get(name)
    if builtin is not None:
        return builtin.driver_name
    found = getattr(load(name), "default_driver_name", "")
    if not isinstance(found, str) or not found:
        raise UnknownBackend(f"backend {name!r} declares no default_driver_name; give --driver-name")
    return found
