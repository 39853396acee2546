"""The one exception every shim translation raises."""

from __future__ import annotations


class TranslationError(Exception):
    """An object could not be translated (bad input, unsupported source, or a Kubernetes error case)."""
