"""Logging set-up and the request summaries that may be logged.

Only fields named in SUMMARY_FIELDS are ever logged from a request, and never a field carrying the
csi_secret option or a `secrets` map; `safe_dict` renders a whole message with those removed. Logged
values are cut at FIELD_LIMIT characters, and the text format escapes control characters, so no request
can write a line of its own into the log. Other libraries' loggers stay at WARNING whatever --log-level
says: botocore's debug output carries credentials.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from csi._proto import csi_pb2
from csi.interceptors import MethodInterceptor, deadline_passed

# Identifiers worth a log line; none can hold a secret.
SUMMARY_FIELDS = (
    "name",
    "volume_id",
    "source_volume_id",
    "snapshot_id",
    "base_snapshot_id",
    "target_snapshot_id",
    "group_snapshot_id",
    "node_id",
    "staging_target_path",
    "target_path",
    "volume_path",
)

FIELD_LIMIT = 256
# Loggers of the driver itself; everything else (botocore, urllib3, ...) logs at WARNING and above.
OWN_LOGGERS = ("ballast", "csi")
_request_id = threading.local()


def request_id() -> str:
    return getattr(_request_id, "value", "")


def is_secret(fd: Any) -> bool:
    """True for fields the CSI spec marks csi_secret, and for any `secrets` map."""
    opts = fd.GetOptions()
    return bool(opts.Extensions[csi_pb2.csi_secret]) or fd.name == "secrets"


def summary(request: Message) -> dict[str, str]:
    """The identifying fields of a request that are set, for one log line."""
    out: dict[str, str] = {}
    for name in SUMMARY_FIELDS:
        fd: Any = request.DESCRIPTOR.fields_by_name.get(name)
        if fd is None or is_secret(fd) or fd.type != FieldDescriptor.TYPE_STRING:
            continue
        value = getattr(request, name)
        if value:
            out[name] = _cut(value)
    if "volume_ids" in request.DESCRIPTOR.fields_by_name:
        ids = list(request.volume_ids)  # type: ignore[attr-defined]
        if ids:
            out["volume_ids"] = _cut(",".join(ids))
    return out


def _cut(value: str) -> str:
    if len(value) <= FIELD_LIMIT:
        return value
    return f"{value[:FIELD_LIMIT]}...({len(value) - FIELD_LIMIT} more characters)"


def _logfmt(value: object) -> str:
    """`value` as one token of a text line: quoted and escaped when it holds a space, a quote, an `=`
    or any character that is not printable ASCII."""
    text = str(value)
    if text and all(33 <= ord(c) < 127 and c not in '"=' for c in text):
        return text
    return json.dumps(text)


def _escape(line: str) -> str:
    """Control characters (a newline that would start a forged line) as escapes; the rest unchanged."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in line)


def safe_dict(message: Message) -> dict[str, Any]:
    """The message as a dict with every secret field and map replaced by a marker."""
    out: dict[str, Any] = {}
    for fd, value in message.ListFields():
        if is_secret(fd):
            out[fd.name] = "<redacted>"
        elif fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            out[fd.name] = dict(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.is_repeated:
                out[fd.name] = [safe_dict(v) for v in value]
            else:
                out[fd.name] = safe_dict(value)
        else:
            out[fd.name] = list(value) if fd.is_repeated else value
    return out


class JsonFormatter(logging.Formatter):
    """One JSON object per line with time, level, logger, message, request id and any `fields` extra."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", "") or request_id()
        if rid:
            doc["request_id"] = rid
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["stack"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class TextFormatter(logging.Formatter):
    """One line per record (a logged exception's stack follows on lines of its own): the message with
    control characters escaped, then the `fields` extra as key=value tokens."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = _escape(super().formatMessage(record))
        fields = getattr(record, "fields", {})
        if fields:
            line += " " + " ".join(f"{k}={_logfmt(v)}" for k, v in fields.items())
        return line


def setup(log_format: str, level: str, stream: Any = None) -> None:
    """Configure the root logger once (idempotent: replaces earlier Ballast handlers). `level` applies
    to the driver's own loggers; other libraries log at WARNING and above, or at `level` if higher."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name("ballast")
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "ballast"]:
        root.removeHandler(old)
    root.addHandler(handler)
    chosen = logging.getLevelName(level.upper())
    root.setLevel(max(chosen, logging.WARNING))
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(chosen)


# Routine polling RPCs log at debug level when they succeed.
QUIET_METHODS = frozenset({"Probe", "NodeGetCapabilities", "GetPluginInfo", "GetPluginCapabilities"})
_ids = itertools.count(1)


def new_request_id() -> str:
    """Unique within the process and cheap (no syscall): pid plus a counter, in hex."""
    return f"{os.getpid():x}-{next(_ids):x}"


class LoggingInterceptor(MethodInterceptor):
    """Logs one line per RPC: method, identifying fields, duration and resulting code, and for a failed
    call the status message the client got (`error`, cut at FIELD_LIMIT); for a streaming call also the
    number of messages sent, once the stream has ended (or failed, or was cancelled).

    Never logs request bodies beyond `summary()`, so secrets cannot reach the log; status messages hold
    none either (csi/failures.py: they go to the CO as they are). `observe`, if given, is called with
    (method, code name, seconds) for metrics.
    """

    def __init__(self, observe: Any = None) -> None:
        super().__init__()
        self._log = logging.getLogger("ballast.rpc")
        self._observe = observe

    def _done(
        self, method: str, request: Any, outcome: tuple[str, str], start: float, rid: str, **extra: Any
    ) -> None:
        code, error = outcome
        elapsed = time.perf_counter() - start
        level = (
            (logging.DEBUG if method in QUIET_METHODS else logging.INFO) if code == "OK" else logging.WARNING
        )
        if self._log.isEnabledFor(level):
            fields = {
                "method": method,
                **summary(request),
                **extra,
                "code": code,
                **({"error": _cut(error)} if error else {}),
                "ms": round(elapsed * 1000, 3),
            }
            self._log.log(level, "%s %s", method, code, extra={"fields": fields, "request_id": rid})
        if self._observe is not None:
            self._observe(method, code, elapsed)
        _request_id.value = ""

    def wrap(self, full_method: str, inner: Any) -> Any:
        method = full_method.rsplit("/", 1)[-1]

        def logged(request: Any, context: Any) -> Any:
            rid = new_request_id()
            _request_id.value = rid
            start = time.perf_counter()
            outcome = ("OK", "")
            try:
                return inner(request, context)
            except BaseException:
                outcome = _raised(context)
                raise
            finally:
                self._done(method, request, outcome, start, rid)

        return logged

    def wrap_stream(self, full_method: str, inner: Any) -> Any:
        method = full_method.rsplit("/", 1)[-1]

        def logged(request: Any, context: Any) -> Iterator[Any]:
            rid = new_request_id()
            _request_id.value = rid
            start = time.perf_counter()
            outcome, sent = ("OK", ""), 0
            try:
                for response in inner(request, context):
                    sent += 1
                    yield response
                    _request_id.value = rid
            except GeneratorExit:  # the client cancelled, or its deadline passed
                outcome = ("DEADLINE_EXCEEDED" if deadline_passed(context) else "CANCELLED", "")
                raise
            except BaseException:
                outcome = _raised(context)
                raise
            finally:
                self._done(method, request, outcome, start, rid, messages=sent)

        return logged


def _raised(context: Any) -> tuple[str, str]:
    """(code name, status message) a failed call ends with."""
    raised, details = context.code(), context.details()
    message = details.decode(errors="replace") if isinstance(details, bytes) else details or ""
    return (raised.name if raised is not None else "UNKNOWN"), message
