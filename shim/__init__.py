"""Migration shim: in-tree <-> CSI translation with Kubernetes' csi-translation-lib behaviour.

`Translator` is imported on first use, so `import shim.gates` (which the driver does at start-up to
validate --feature-gates) does not load every plugin translator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shim.errors import TranslationError

if TYPE_CHECKING:
    from shim.translate import Translator

__all__ = ["TranslationError", "Translator"]


def __getattr__(name: str) -> Any:
    if name == "Translator":
        from shim.translate import Translator

        return Translator
    raise AttributeError(f"module 'shim' has no attribute {name!r}")
