"""Migration shim: in-tree <-> CSI translation with Kubernetes' csi-translation-lib behaviour."""

from __future__ import annotations

from shim.errors import TranslationError
from shim.translate import Translator

__all__ = ["TranslationError", "Translator"]
