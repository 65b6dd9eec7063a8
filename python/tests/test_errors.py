"""Typed errors: one class per status a caller handles, all carrying the status."""

from __future__ import annotations

import pickle

import pytest

import stratus_client
from stratus_client import Status
from stratus_client.errors import error_for_status


def test_status_codes_are_the_specifications():
    # docs/design/wire-protocol.md, "Statuses": codes are never renumbered.
    assert [status.value for status in Status] == list(range(33))
    assert Status.OBJECT_DOESNT_EXIST == 3 and Status.IN_PROGRESS == 28
    assert Status.STALE_RPC == 29 and Status.EXPIRED_LEASE == 30
    assert Status.AUTHENTICATION_FAILED == 31 and Status.PERMISSION_DENIED == 32
    assert Status.from_code(33) is None
    assert {status for status in Status if status.carries_operation_body} == {
        Status.OK,
        Status.OBJECT_DOESNT_EXIST,
        Status.OBJECT_EXISTS,
        Status.WRONG_VERSION,
    }


@pytest.mark.parametrize(
    "status, error_class",
    [
        (Status.UNKNOWN_TABLET, stratus_client.UnknownTablet),
        (Status.AUTHENTICATION_FAILED, stratus_client.AuthenticationFailed),
        (Status.PERMISSION_DENIED, stratus_client.PermissionDenied),
        (Status.TABLE_DOESNT_EXIST, stratus_client.TableDoesNotExist),
        (Status.OBJECT_DOESNT_EXIST, stratus_client.ObjectDoesNotExist),
        (Status.OBJECT_EXISTS, stratus_client.ObjectExists),
        (Status.WRONG_VERSION, stratus_client.WrongVersion),
        (Status.NO_TABLE_SPACE, stratus_client.NoTableSpace),
        (Status.REQUEST_FORMAT_ERROR, stratus_client.RequestFormatError),
        (Status.UNIMPLEMENTED_REQUEST, stratus_client.UnimplementedRequest),
        (Status.RETRY, stratus_client.RetryLater),
        (Status.TIMEOUT, stratus_client.Timeout),
        (Status.INTERNAL_ERROR, stratus_client.InternalError),
        (Status.WRONG_SERVER, stratus_client.WrongServer),
        (Status.REQUEST_TOO_LARGE, stratus_client.RequestTooLarge),
        (Status.INVALID_KEY, stratus_client.InvalidKey),
        (Status.VALUE_TOO_LARGE, stratus_client.ValueTooLarge),
        (Status.PROTOCOL_VERSION_MISMATCH, stratus_client.ProtocolVersionMismatch),
        (Status.COULDNT_CONNECT, stratus_client.CouldNotConnect),
        (Status.SERVICE_NOT_AVAILABLE, stratus_client.ServiceNotAvailable),
        (Status.INVALID_OBJECT, stratus_client.InvalidObject),
        (Status.INVALID_PARAMETER, stratus_client.InvalidParameter),
        (Status.SERVER_CRASHED, stratus_client.StratusError),
        (Status.IN_PROGRESS, stratus_client.StratusError),
        (Status.STALE_RPC, stratus_client.StaleRpc),
        (Status.EXPIRED_LEASE, stratus_client.ExpiredLease),
        (Status.BACKUP_OPEN_REJECTED, stratus_client.StratusError),
    ],
)
def test_each_status_has_its_error_class(status, error_class):
    error = error_for_status(status, "detail", version=0)
    assert type(error) is error_class
    assert isinstance(error, stratus_client.StratusError)
    assert error.status is status
    assert error.status_name == status.name
    assert error.message == "detail"
    assert status.name in str(error) and "detail" in str(error)


def test_ok_is_not_an_error():
    with pytest.raises(ValueError):
        error_for_status(Status.OK)


def test_object_outcomes_report_the_current_version():
    error = error_for_status(Status.WRONG_VERSION, version=12)
    assert error.version == 12
    assert "current version 12" in str(error)


def test_transient_failures_are_unavailable():
    for error_class in (
        stratus_client.Timeout,
        stratus_client.CouldNotConnect,
        stratus_client.RetryLater,
        stratus_client.ServiceNotAvailable,
    ):
        assert issubclass(error_class, stratus_client.Unavailable)
    assert not issubclass(stratus_client.ObjectExists, stratus_client.Unavailable)
    # Neither is retried as it stands: a stale rpc is a bug, an expired lease needs a new one.
    assert not issubclass(stratus_client.StaleRpc, stratus_client.Unavailable)
    assert not issubclass(stratus_client.ExpiredLease, stratus_client.Unavailable)
    assert issubclass(stratus_client.ProtocolVersionMismatch, stratus_client.ProtocolError)


def test_errors_survive_pickling():
    error = error_for_status(Status.OBJECT_EXISTS, "m", version=3)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), copy.status, copy.message, copy.version) == (
        stratus_client.ObjectExists,
        Status.OBJECT_EXISTS,
        "m",
        3,
    )
    timeout = stratus_client.Timeout("late", last_error=stratus_client.CouldNotConnect("down"))
    copy = pickle.loads(pickle.dumps(timeout))
    assert isinstance(copy.last_error, stratus_client.CouldNotConnect)
    assert copy.last_error.message == "down"


def test_running_out_of_time_does_not_hide_the_failure_that_explains_a_timeout():
    from stratus_client.retry import Attempts

    refused = stratus_client.CouldNotConnect("127.0.0.1:1: connection refused")
    late = stratus_client.Timeout("127.0.0.1:1: ran out of time waiting")
    expired = Attempts("read", timeout=0.0)
    assert expired.note(late) is late, "nothing earlier explains it"
    expired = Attempts("read", timeout=0.0)
    assert expired.note(refused) is refused
    assert expired.note(late) is refused
    with pytest.raises(stratus_client.Timeout) as raised:
        expired.wait_before_retry(late)
    assert raised.value.last_error is refused
    # Before the deadline a timeout is news, and other failures always are.
    running = Attempts("read", timeout=60.0)
    running.note(refused)
    assert running.note(late) is late
    other = stratus_client.RetryLater("busy")
    assert expired.note(other) is other
