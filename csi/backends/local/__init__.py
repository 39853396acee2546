"""The embedded default backend: sparse files in a data dir, attached through loop devices."""

from csi.backends.local.backend import LocalBackend

__all__ = ["LocalBackend"]
