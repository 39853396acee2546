"""moto's EC2 server on 127.0.0.1 over real HTTP, shared by the aws backend tests and csi-sanity."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from moto import server as moto_server


@contextmanager
def running_moto() -> Iterator[str]:
    """Start a moto server on a free port; yields its endpoint URL and stops it afterwards.

    Set MOTO_EC2_LOAD_DEFAULT_AMIS=false first: without its ~1300 built-in images moto sets up an
    account in milliseconds instead of a second."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
