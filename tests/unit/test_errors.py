"""Every failure reaches the client as the right gRPC code with an actionable message and no traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from csi import errors, failures, logs
from csi._proto import csi_pb2, csi_pb2_grpc
from tests.csiclient import CsiClient, assert_code, connect


class Raising(csi_pb2_grpc.IdentityServicer):
    """Raises whatever the test put in `exc`."""

    exc: BaseException = RuntimeError("unset")

    def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext) -> None:
        raise self.exc


@pytest.fixture
def raising(tmp_path: Path) -> Iterator[tuple[Raising, CsiClient]]:
    servicer = Raising()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[logs.LoggingInterceptor(), errors.ErrorInterceptor()],
    )
    csi_pb2_grpc.add_IdentityServicer_to_server(servicer, server)
    sock = tmp_path / "e.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    client = connect(str(sock))
    yield servicer, client
    client.close()
    server.stop(None)


CASES = [
    pytest.param(failures.NotFoundError("volume lv-1 not found"), grpc.StatusCode.NOT_FOUND, id="not-found"),
    pytest.param(failures.AlreadyExistsError("name taken"), grpc.StatusCode.ALREADY_EXISTS, id="exists"),
    pytest.param(
        failures.InvalidParameterError("bad key x"), grpc.StatusCode.INVALID_ARGUMENT, id="invalid-param"
    ),
    pytest.param(failures.OutOfRangeError("too small"), grpc.StatusCode.OUT_OF_RANGE, id="out-of-range"),
    pytest.param(failures.LimitExceededError("node full"), grpc.StatusCode.RESOURCE_EXHAUSTED, id="limit"),
    pytest.param(failures.OutOfCapacityError("no space"), grpc.StatusCode.RESOURCE_EXHAUSTED, id="capacity"),
    pytest.param(
        failures.FailedPreconditionError("in use"), grpc.StatusCode.FAILED_PRECONDITION, id="precondition"
    ),
    pytest.param(failures.TransientError("throttled"), grpc.StatusCode.UNAVAILABLE, id="transient"),
    pytest.param(failures.InvalidTokenError("bad token"), grpc.StatusCode.ABORTED, id="bad-token"),
    pytest.param(failures.BusyError("in progress"), grpc.StatusCode.ABORTED, id="busy"),
    pytest.param(failures.UnsupportedError("no snapshots"), grpc.StatusCode.UNIMPLEMENTED, id="unsupported"),
    pytest.param(failures.DriverError("odd failure"), grpc.StatusCode.INTERNAL, id="driver-error"),
]


@pytest.mark.parametrize(("exc", "code"), CASES)
def test_error_maps_to_code(
    raising: tuple[Raising, CsiClient], exc: Exception, code: grpc.StatusCode
) -> None:
    servicer, client = raising
    servicer.exc = exc
    message = assert_code(client.identity.GetPluginInfo, csi_pb2.GetPluginInfoRequest(), code)
    assert message == str(exc)


def test_every_error_class_has_a_code() -> None:
    classes = {
        c for c in vars(failures).values() if isinstance(c, type) and issubclass(c, failures.DriverError)
    }
    assert classes == set(errors.CODES)


def test_a_subclass_gets_the_code_of_its_nearest_listed_base() -> None:
    class Throttled(failures.TransientError):
        pass

    assert errors.status_for(Throttled("slow down")) == (grpc.StatusCode.UNAVAILABLE, "slow down")


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(ZeroDivisionError("division by zero in /secret/path"), id="zero-division"),
        pytest.param(KeyError("password"), id="key-error"),
        pytest.param(OSError(5, "Input/output error"), id="os-error"),
    ],
)
def test_unexpected_exception_is_internal_without_details(
    raising: tuple[Raising, CsiClient], exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    servicer, client = raising
    servicer.exc = exc
    with caplog.at_level(logging.ERROR, logger="ballast.errors"):
        message = assert_code(
            client.identity.GetPluginInfo, csi_pb2.GetPluginInfoRequest(), grpc.StatusCode.INTERNAL
        )
    assert str(exc) not in message and type(exc).__name__ not in message
    assert "reference" in message
    stacks = [r for r in caplog.records if r.exc_info]
    assert len(stacks) == 1, "an unexpected exception is logged exactly once, with its stack"
    ref = message.split("reference ")[1].split(")")[0]
    assert ref in stacks[0].getMessage()


def test_unimplemented_rpc_is_unimplemented(raising: tuple[Raising, CsiClient]) -> None:
    servicer, client = raising
    servicer.exc = NotImplementedError("Method not implemented!")
    assert_code(client.identity.GetPluginInfo, csi_pb2.GetPluginInfoRequest(), grpc.StatusCode.UNIMPLEMENTED)
