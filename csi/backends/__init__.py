"""Cloud backends behind one interface (csi.backends.base.Backend); `build_backend` picks one by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csi.backends.base import Backend
    from csi.config import Config


def build_backend(config: Config) -> Backend:
    """Instantiate the configured backend; each is imported only when chosen (boto3 only for aws)."""
    name = config.backend.name
    if name == "local":
        from csi.backends.local import LocalBackend

        return LocalBackend.from_config(config)
    if name == "aws":
        from csi.backends.aws import AwsBackend

        return AwsBackend.from_config(config)
    raise ValueError(f"unknown backend {name!r}")
