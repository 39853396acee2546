"""Logging set-up of `ballast-migrate controller`: text or JSON lines (--log-format) on stderr.

shim may not import csi, so this is the controller's own small formatter; JSON lines carry time,
level, logger and message (and the stack of an exception), one object per line.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import TextIO

FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["stack"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup(log_format: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one writing `log_format` lines to `stream`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
