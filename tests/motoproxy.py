"""An HTTP proxy in front of moto's EC2 server that makes it behave like the real, slower, busier EC2.

moto finishes every state change at once and never throttles. Drivers under test (in this process or as
subprocesses) point their endpoint at the proxy instead, and a test scripts what EC2 would do:

- `hold("creating", n)`: a new volume reads `creating` for its first n DescribeVolumes polls;
  `hold("attaching", n)` / `hold("detaching", n)` do the same for an attachment after Attach/DetachVolume,
  and `hold("optimizing", n)` for DescribeVolumesModifications after ModifyVolume.
- `fail(action, code, times=n)` answers the next n calls of `action` with an EC2 error (HTTP 503 for
  throttling codes, 400 otherwise); `fail(action, code, rate=0.1)` answers that share of calls, drawn
  from a seeded generator so a run can be repeated.
- `answer(action, body)` serves a whole response body for an action moto does not implement
  (DescribeVolumeStatus, for example).
- `calls` counts every call by action, including the refused ones, so tests and benchmarks can assert
  API traffic; `reset()` clears everything.
- `delay(action, seconds)` holds every call of `action` that long before it reaches moto (to make two
  clients' calls overlap).

Two things real EC2 does that moto does not, always on: CreateVolume with a ClientToken seen before
answers the first call's volume instead of making another (concurrent calls with one token are
serialised); and DescribeVolumes pages its answer by MaxResults (5..500, not with VolumeIds, as EC2
insists) with a NextToken.

One proxy serves one test (or one benchmark); the rules live in this process and take effect for the
next request.
"""

from __future__ import annotations

import http.client
import random
import re
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

THROTTLING = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException", "ServiceUnavailable"})
_HOLD_KINDS = ("creating", "attaching", "detaching", "optimizing")
_VOLUME_ID = re.compile(r"<volumeId>(vol-[0-9a-f]+)</volumeId>")


@dataclass
class _Failure:
    code: str
    times: int | None
    rate: float | None


@dataclass
class _Rules:
    holds: dict[str, int] = field(default_factory=dict)
    pending: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, volume id) -> polls left
    detached: dict[str, str] = field(default_factory=dict)  # volume id -> the attachment it still shows
    failures: dict[str, list[_Failure]] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)
    delays: dict[str, float] = field(default_factory=dict)


class MotoProxy:
    """The proxy's rules and counters. Use `running_proxy(moto_endpoint)` to serve it."""

    def __init__(self, upstream: str, seed: int = 0) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self._lock = threading.Lock()
        self._rules = _Rules()
        self._random = random.Random(seed)
        self.calls: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()  # most delayed calls of an action held at once
        self._held: Counter[str] = Counter()
        self.endpoint = ""
        self._tokens: dict[tuple[str, str], tuple[int, dict[str, str], bytes]] = {}
        self._token_locks: dict[tuple[str, str], threading.Lock] = {}

    # ---- scripting

    def hold(self, kind: str, polls: int) -> None:
        """From now on, each new volume/attachment/modification reads `kind` for `polls` polls."""
        if kind not in _HOLD_KINDS:
            raise ValueError(f"hold kind must be one of {_HOLD_KINDS}")
        with self._lock:
            self._rules.holds[kind] = polls

    def fail(self, action: str, code: str, *, times: int | None = None, rate: float | None = None) -> None:
        """Refuse `action` ("*" for every action) with EC2 error `code`, `times` times or at `rate`."""
        if (times is None) == (rate is None):
            raise ValueError("give exactly one of times= and rate=")
        with self._lock:
            self._rules.failures.setdefault(action, []).append(_Failure(code, times, rate))

    def answer(self, action: str, body: str) -> None:
        """Serve `body` (an EC2 XML response) for every call of `action` instead of asking moto."""
        with self._lock:
            self._rules.answers[action] = body

    def delay(self, action: str, seconds: float) -> None:
        """Hold every call of `action` for `seconds` before forwarding it."""
        with self._lock:
            self._rules.delays[action] = seconds

    def reset(self) -> None:
        with self._lock:
            self._rules = _Rules()
            self.calls.clear()
            self.refused.clear()
            self.peak.clear()

    # ---- serving (called from the handler threads)

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        fields = _fields(body)
        action = fields.get("Action", "?")
        with self._lock:
            self.calls[action] += 1
            refusal = self._refusal(action) or _invalid_paging(action, fields)
            canned = self._rules.answers.get(action)
            delay = self._rules.delays.get(action, 0.0)
        if refusal is not None:
            self.refused[action] += 1
            return _error(refusal)
        if canned is not None:
            return 200, {"Content-Type": "text/xml"}, canned.encode()
        if delay:
            self._hold_for(action, delay)
        token = fields.get("ClientToken", "") if action == "CreateVolume" else ""
        if token:
            return self._idempotent(
                (headers.get("x-moto-account-id", ""), token), method, path, headers, body
            )
        status, out_headers, payload = self._forward(method, path, headers, body)
        if status == 200:
            payload = self._rewrite(action, payload)
            if action == "DescribeVolumes" and "MaxResults" in fields:
                payload = _page(
                    payload.decode(), int(fields["MaxResults"]), fields.get("NextToken", "")
                ).encode()
        return status, out_headers, payload

    def _hold_for(self, action: str, delay: float) -> None:
        """Sleep `delay`, counting how many calls of `action` sleep at once (`peak`)."""
        with self._lock:
            self._held[action] += 1
            self.peak[action] = max(self.peak[action], self._held[action])
        try:
            time.sleep(delay)
        finally:
            with self._lock:
                self._held[action] -= 1

    def _idempotent(
        self, key: tuple[str, str], method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """CreateVolume under a client token: the first success is the answer for every later call."""
        with self._lock:
            lock = self._token_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._tokens:
                return self._tokens[key]
            status, out_headers, payload = self._forward(method, path, headers, body)
            if status == 200:
                payload = self._rewrite("CreateVolume", payload)
                self._tokens[key] = (status, out_headers, payload)
            return status, out_headers, payload

    def _refusal(self, action: str) -> str | None:
        for key in (action, "*"):
            for failure in self._rules.failures.get(key, []):
                if failure.times is not None and failure.times > 0:
                    failure.times -= 1
                    return failure.code
                if failure.rate is not None and self._random.random() < failure.rate:
                    return failure.code
        return None

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self._upstream, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers)
            reply = conn.getresponse()
            payload = reply.read()
            kept = {
                k: v
                for k, v in reply.getheaders()
                if k.lower() not in ("content-length", "transfer-encoding")
            }
            return reply.status, kept, payload
        finally:
            conn.close()

    def _rewrite(self, action: str, payload: bytes) -> bytes:
        text = payload.decode()
        with self._lock:
            if action == "CreateVolume":
                self._start("creating", text)
            elif action == "AttachVolume":
                self._start("attaching", text)
            elif action == "DetachVolume":
                self._start("detaching", text)
            elif action == "ModifyVolume":
                self._start("optimizing", text)
            elif action == "DescribeVolumes":
                text = _map_items(text, self._volume_item)
            elif action == "DescribeVolumesModifications":
                text = _map_items(text, self._modification_item)
        return text.encode()

    def _start(self, kind: str, text: str) -> None:
        polls = self._rules.holds.get(kind, 0)
        match = _VOLUME_ID.search(text)
        if polls > 0 and match:
            self._rules.pending[(kind, match.group(1))] = polls
            if kind == "detaching":
                self._rules.detached[match.group(1)] = _detached_attachment(text)

    def _take(self, kind: str, volume_id: str) -> bool:
        left = self._rules.pending.get((kind, volume_id), 0)
        if left <= 0:
            return False
        self._rules.pending[(kind, volume_id)] = left - 1
        return True

    def _volume_item(self, item: str) -> str:
        match = _VOLUME_ID.search(item)
        if not match:
            return item
        volume_id = match.group(1)
        if self._take("creating", volume_id):
            item = _set_volume_status(item, "creating")
        if self._take("attaching", volume_id):
            item = _ATTACHMENT_STATUS.sub(r"\g<1>attaching\g<2>", item, count=1)
        if self._take("detaching", volume_id):
            item = _EMPTY_ATTACHMENTS.sub(self._rules.detached.get(volume_id, ""), item, count=1)
            item = _set_volume_status(item, "in-use")
        return item

    def _modification_item(self, item: str) -> str:
        match = _VOLUME_ID.search(item)
        if match and self._take("optimizing", match.group(1)):
            return _MODIFICATION_STATE.sub("<modificationState>optimizing</modificationState>", item)
        return item


_ATTACHMENT_STATUS = re.compile(r"(<attachmentSet>.*?<status>)\w+(</status>)", re.S)
_EMPTY_ATTACHMENTS = re.compile(r"<attachmentSet\s*/>|<attachmentSet>\s*</attachmentSet>")
_MODIFICATION_STATE = re.compile(r"<modificationState>[\w-]+</modificationState>")
_VOLUME_STATUS = re.compile(r"<status>[\w-]+</status>")


def _map_items(text: str, fn: Callable[[str], str]) -> str:
    """`text` with every top-level <item> of its first result set replaced by fn(item)."""
    out: list[str] = []
    pos = 0
    for start, end in _top_items(text):
        out.append(text[pos:start])
        out.append(fn(text[start:end]))
        pos = end
    out.append(text[pos:])
    return "".join(out)


def _top_items(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each top-level <item> in the first result set (volumeSet / volumeModificationSet).
    Items nest (attachments, tags inside a volume), so the walk counts depth."""
    set_match = re.search(r"<(volumeSet|volumeModificationSet)>", text)
    if not set_match:
        return
    depth, start, i = 0, 0, set_match.end()
    tag = re.compile(r"<(/?)item>")
    for m in tag.finditer(text, i):
        if m.group(1) == "":
            if depth == 0:
                start = m.start()
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                yield start, m.end()
            if depth < 0:
                return


def _set_volume_status(item: str, status: str) -> str:
    """Replace the volume's own <status>, which EC2 writes before its attachmentSet."""
    head, sep, tail = item.partition("<attachmentSet")
    return _VOLUME_STATUS.sub(f"<status>{status}</status>", head, count=1) + sep + tail


def _detached_attachment(response: str) -> str:
    """An attachmentSet in state `detaching`, built from a DetachVolume response."""
    fields = "".join(
        f"<{name}>{m.group(1)}</{name}>"
        for name in ("volumeId", "instanceId", "device")
        if (m := re.search(rf"<{name}>([^<]*)</{name}>", response))
    )
    return f"<attachmentSet><item>{fields}<status>detaching</status></item></attachmentSet>"


def _fields(body: bytes) -> dict[str, str]:
    """The form fields of an EC2 query request (the first value of each)."""
    return {k: v[0] for k, v in urllib.parse.parse_qs(body.decode(errors="replace")).items()}


def _invalid_paging(action: str, fields: dict[str, str]) -> str | None:
    """The error EC2 answers for DescribeVolumes paging it does not allow, or None."""
    if action != "DescribeVolumes" or "MaxResults" not in fields:
        return None
    if any(k.startswith("VolumeId.") for k in fields):
        return "InvalidParameterCombination"
    if not fields["MaxResults"].isdigit() or not 5 <= int(fields["MaxResults"]) <= 500:
        return "InvalidParameterValue"
    return None


def _page(text: str, size: int, token: str) -> str:
    """A DescribeVolumes answer cut to `size` volumes from the offset `token` names, with the next token."""
    spans = list(_top_items(text))
    if not spans:
        return text
    start = int(token.removeprefix("motoproxy-")) if token.startswith("motoproxy-") else 0
    kept = "".join(text[a:b] for a, b in spans[start : start + size])
    tail = text[spans[-1][1] :]
    if start + size < len(spans):
        tail = tail.replace("</volumeSet>", f"</volumeSet><nextToken>motoproxy-{start + size}</nextToken>", 1)
    return text[: spans[0][0]] + kept + tail


def _error(code: str) -> tuple[int, dict[str, str], bytes]:
    status = 503 if code in THROTTLING else 400
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>injected by the moto proxy</Message>"
        "</Error></Errors><RequestID>motoproxy</RequestID></Response>"
    )
    return status, {"Content-Type": "text/xml"}, body.encode()


def _handler(proxy: MotoProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {
                k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")
            }
            status, out_headers, payload = proxy.handle(self.command, self.path, headers, body)
            self.send_response(status)
            for key, value in out_headers.items():
                if key.lower() not in ("connection", "date", "server"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@contextmanager
def running_proxy(upstream: str, seed: int = 0) -> Iterator[MotoProxy]:
    """Serve a MotoProxy for `upstream` on a free loopback port; `proxy.endpoint` is its URL."""
    proxy = MotoProxy(upstream, seed)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="motoproxy", daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
