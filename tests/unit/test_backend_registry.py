"""Backends by name: the built-in ones without reading entry points, the rest through them."""

from __future__ import annotations

import pytest

from csi import backend_registry as registry
from csi.backends.base import Backend
from csi.config import parse_args
from csi.server import build_backend


@pytest.mark.parametrize("name", list(registry.BUILTIN))
def test_a_builtin_backend_is_the_class_its_entry_names_with_its_driver_name(name: str) -> None:
    cls = registry.load(name)
    assert isinstance(cls, type) and issubclass(cls, Backend)
    assert registry.BUILTIN[name].driver_name == cls.default_driver_name == registry.default_driver_name(name)


def test_an_unknown_name_is_refused_listing_what_exists() -> None:
    with pytest.raises(registry.UnknownBackend, match="unknown backend 'tape'; available: local, aws"):
        registry.check_name("tape")


def test_the_command_line_refuses_an_unknown_backend(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--backend", "tape"])
    assert exited.value.code == 2
    assert "unknown backend 'tape'" in capsys.readouterr().err


def test_a_name_that_is_not_a_backend_class_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    config, _ = parse_args(["--data-dir", "/nonexistent/ballast"])
    monkeypatch.setitem(registry.BUILTIN, "local", registry.Builtin("csi.keys:topology_zone_key", "x"))
    with pytest.raises(registry.UnknownBackend, match=r"not a csi\.backends\.base\.Backend"):
        build_backend(config)
