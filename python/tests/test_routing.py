"""Routing, retries, timeouts and frame validation, against scripted fake servers.

A healthy cluster rarely answers UNKNOWN_TABLET or RETRY, never sends garbage and never stays
silent, so these paths are driven by ``fake_server.FakeServer`` instead: each test scripts a
coordinator and masters, runs one client call, and checks both its result and the requests
the fakes received. Timeouts here are short but generous for loopback; no test asserts a
duration.
"""

from __future__ import annotations

import struct

import pytest
from fake_server import (
    Close,
    FakeServer,
    Request,
    ScriptedCoordinator,
    Silence,
    answers_in_turn,
    error_frame,
    read_request_key,
    response_frame,
    start,
    unused_address,
)

import stratus_client
from stratus_client import Client, IncrementItem, KeyItem, Status, WriteItem, key_hash

TABLE = 5
HALF = 1 << 63
TOP = (1 << 64) - 1
READ, WRITE, INCREMENT, MULTI_READ, MULTI_WRITE, MULTI_REMOVE, ENUMERATE = (
    30,
    31,
    33,
    34,
    35,
    36,
    38,
)
GET_TABLET_MAP, LIST_TABLES = 16, 15
NORMAL, RECOVERING = 0, 1


def key_where(predicate) -> bytes:
    """The first key ``key-N`` of TABLE whose hash satisfies ``predicate``."""
    for number in range(10_000):
        key = f"key-{number}".encode()
        if predicate(key_hash(TABLE, key)):
            return key
    raise AssertionError("no such key")


LOW_KEY = key_where(lambda hash_value: hash_value < HALF)
HIGH_KEY = key_where(lambda hash_value: hash_value >= HALF)


def read_ok(request: Request, version: int, value: bytes) -> bytes:
    body = struct.pack("<QI", version, len(value)) + value + struct.pack("<Q", 0)
    return response_frame(request, 0, body)


def whole_table_on(master: FakeServer, state: int = NORMAL):
    return [(TABLE, 0, TOP, 1, master.address, state)]


# ---------------------------------------------------------------------------------------------
# Routing.


def test_each_key_goes_to_the_master_owning_its_hash(servers):
    low = start(servers, FakeServer(lambda request: read_ok(request, 1, b"low")))
    high = start(servers, FakeServer(lambda request: read_ok(request, 2, b"high")))
    coordinator = start(
        servers,
        ScriptedCoordinator(
            [
                (TABLE, 0, HALF - 1, 1, low.address, NORMAL),
                (TABLE, HALF, TOP, 2, high.address, NORMAL),
            ]
        ),
    )
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, LOW_KEY) == (b"low", 1)
        assert client.read(TABLE, HIGH_KEY) == (b"high", 2)
        assert client.read(TABLE, LOW_KEY.decode()) == (b"low", 1)
    assert [read_request_key(request.body) for request in low.requests] == [
        (TABLE, LOW_KEY),
        (TABLE, LOW_KEY),
    ]
    assert [read_request_key(request.body) for request in high.requests] == [(TABLE, HIGH_KEY)]
    assert coordinator.map_requests == 1, "the tablet map is cached"


def test_unknown_tablet_refreshes_the_map_and_follows_the_new_owner(servers):
    old = start(servers, FakeServer(lambda request: error_frame(request, Status.UNKNOWN_TABLET)))
    new = start(servers, FakeServer(lambda request: read_ok(request, 7, b"moved")))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(old), whole_table_on(new)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, b"k") == (b"moved", 7)
    assert len(old.requests) == 1 and len(new.requests) == 1
    assert coordinator.map_requests == 2


def test_the_active_coordinator_is_found_past_dead_ones_and_standbys(servers):
    # A standby answers RETRY to everything; a dead coordinator refuses connections. Neither
    # is taken as the answer while another address may give one, whatever the order.
    master = start(servers, FakeServer(lambda request: read_ok(request, 7, b"v")))
    active = start(servers, ScriptedCoordinator(whole_table_on(master)))
    standby = start(servers, FakeServer(lambda request: error_frame(request, Status.RETRY, "standby")))
    dead = unused_address()
    for order in (
        [dead, standby.address, active.address],
        [standby.address, active.address, dead],
        [active.address, standby.address, dead],
    ):
        with Client(",".join(order), timeout=5) as client:
            assert client.read(TABLE, b"k") == (b"v", 7)
            assert client.read(TABLE, b"k") == (b"v", 7)
    with Client(f"{dead},{standby.address}", timeout=0.3) as client:
        with pytest.raises(stratus_client.Timeout) as raised:
            client.read(TABLE, b"k")
    assert isinstance(raised.value.last_error, stratus_client.RetryLater)


def test_wrong_server_refreshes_the_map_too(servers):
    old = start(servers, FakeServer(lambda request: error_frame(request, Status.WRONG_SERVER)))
    new = start(
        servers, FakeServer(lambda request: response_frame(request, 0, struct.pack("<Q", 3)))
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(old), whole_table_on(new)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.write(TABLE, b"k", b"v") == 3
    assert coordinator.map_requests == 2


def test_retry_status_is_retried_on_the_same_master(servers):
    master = start(
        servers,
        FakeServer(
            answers_in_turn(
                lambda request: error_frame(request, Status.RETRY, "log full"),
                lambda request: error_frame(request, Status.RETRY, "log full"),
                lambda request: read_ok(request, 4, b"finally"),
            )
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, b"k") == (b"finally", 4)
    assert len(master.requests) == 3
    assert coordinator.map_requests == 1, "RETRY does not invalidate the map"


def test_a_recovering_tablet_is_waited_for(servers):
    master = start(servers, FakeServer(lambda request: read_ok(request, 1, b"back")))
    coordinator = start(
        servers,
        ScriptedCoordinator(
            whole_table_on(master, RECOVERING),
            whole_table_on(master, RECOVERING),
            whole_table_on(master, NORMAL),
        ),
    )
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, b"k") == (b"back", 1)
    assert len(master.requests) == 1, "no request goes to a master whose tablet is recovering"
    assert coordinator.map_requests == 3


def test_a_master_connection_lost_is_reopened(servers):
    master = start(
        servers,
        FakeServer(
            answers_in_turn(lambda request: Close, lambda request: read_ok(request, 2, b"v"))
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.read(TABLE, b"k") == (b"v", 2)
    assert master.connections_accepted == 2
    assert coordinator.map_requests == 2, "a lost master invalidates the map (it may have crashed)"


def test_the_operations_answer_is_not_retried(servers):
    master = start(
        servers,
        FakeServer(lambda request: error_frame(request, Status.INTERNAL_ERROR, "disk on fire")),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.InternalError, match="disk on fire") as raised:
            client.read(TABLE, b"k")
    assert raised.value.status is Status.INTERNAL_ERROR
    assert len(master.requests) == 1


def test_rejections_carry_the_current_version(servers):
    master = start(
        servers,
        FakeServer(
            lambda request: response_frame(request, Status.OBJECT_EXISTS, struct.pack("<Q", 41))
        ),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.ObjectExists) as raised:
            client.write(TABLE, b"k", b"v", stratus_client.RejectRules.only_if_missing())
    assert raised.value.version == 41
    assert raised.value.status_name == "OBJECT_EXISTS"
    # The rules' flags byte, before the expiry (kind and time, 9 bytes) and the rpc identity
    # (tag, lease, rpc id, acknowledged: 25 bytes).
    flags = master.requests[0].body[-35]
    assert flags == 0b10


def test_table_that_does_not_exist_is_reported_at_once(servers):
    def coordinator_answer(request: Request):
        return error_frame(request, Status.TABLE_DOESNT_EXIST, "no table with id 5")

    coordinator = start(servers, FakeServer(coordinator_answer))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.TableDoesNotExist):
            client.read(TABLE, b"k")
    assert len(coordinator.requests) == 1


def test_a_drop_whose_first_answer_was_lost_returns_when_the_table_is_gone(servers):
    # The first DROP_TABLE goes unanswered (its answer lost); the retry finds the table gone.
    gone = lambda request: error_frame(request, Status.TABLE_DOESNT_EXIST, "no table named 't'")
    coordinator = start(servers, FakeServer(answers_in_turn(lambda request: Silence, gone)))
    with Client(coordinator.address, timeout=5, request_timeout=0.2) as client:
        client.drop_table("t")
    assert len(coordinator.requests) == 2


def test_a_drop_of_a_table_that_never_existed_says_so(servers):
    gone = lambda request: error_frame(request, Status.TABLE_DOESNT_EXIST, "no table named 't'")
    coordinator = start(servers, FakeServer(gone))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.TableDoesNotExist):
            client.drop_table("t")
    assert len(coordinator.requests) == 1


# ---------------------------------------------------------------------------------------------
# Timeouts: every operation ends by its deadline with a Timeout naming the last failure.


def test_unreachable_coordinator_times_out_with_the_connection_failure():
    with Client(unused_address(), timeout=0.3) as client:
        with pytest.raises(stratus_client.Timeout) as raised:
            client.list_tables()
    assert isinstance(raised.value.last_error, stratus_client.CouldNotConnect)
    assert isinstance(raised.value, stratus_client.Unavailable)
    assert "list_tables() did not finish within 0.3 s" in str(raised.value)


def test_silent_master_times_out(servers):
    master = start(servers, FakeServer(lambda request: Silence))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=0.6, request_timeout=0.1) as client:
        with pytest.raises(stratus_client.Timeout) as raised:
            client.read(TABLE, b"k")
    assert isinstance(raised.value.last_error, stratus_client.Timeout)
    assert len(master.requests) >= 1


def test_unreachable_master_times_out(servers):
    coordinator = start(
        servers, ScriptedCoordinator([(TABLE, 0, TOP, 1, unused_address(), NORMAL)])
    )
    with Client(coordinator.address, timeout=0.3) as client:
        with pytest.raises(stratus_client.Timeout) as raised:
            client.write(TABLE, b"k", b"v")
    assert isinstance(raised.value.last_error, stratus_client.CouldNotConnect)
    assert coordinator.map_requests >= 2, "each failed attempt refreshes the map"


# ---------------------------------------------------------------------------------------------
# Garbage from a peer is a ProtocolError at once, never retried and never a crash.


def test_a_peer_that_is_not_stratus_is_refused(servers):
    impostor = start(servers, FakeServer(lambda request: Close, hello=b"HTTP/1.1"))
    with Client(impostor.address, timeout=5) as client:
        with pytest.raises(stratus_client.ProtocolError, match="magic"):
            client.list_tables()
    assert impostor.connections_accepted == 1


def test_another_protocol_version_is_refused(servers):
    newer = start(servers, FakeServer(lambda request: Close, hello=b"STRA\x02\x00\x10\x00"))
    with Client(newer.address, timeout=5) as client:
        with pytest.raises(stratus_client.ProtocolVersionMismatch, match="version 2"):
            client.list_tables()
    assert newer.connections_accepted == 1


@pytest.mark.parametrize(
    "garbage, problem",
    [
        (
            lambda request: read_ok(Request(request.opcode, request.request_id + 1, b""), 1, b"v"),
            "answered request id",
        ),
        (
            lambda request: read_ok(Request(WRITE, request.request_id, b""), 1, b"v"),
            "answered opcode",
        ),
        (lambda request: struct.pack("<I", 0xFFFFFFF0), "exceeds the maximum"),
        (lambda request: struct.pack("<I", 3) + b"abc", "shorter than a response header"),
        (
            lambda request: struct.pack("<IBBHQ", 12, 1, 0, request.opcode, request.request_id),
            "shorter than a response header",
        ),
        (
            lambda request: struct.pack("<IBBHQH", 14, 1, 0, request.opcode, request.request_id, 0),
            "request frame",
        ),
        (lambda request: response_frame(request, 0x4242), "unknown status code"),
        (lambda request: response_frame(request, 0, b"\x01\x00"), "truncated"),
    ],
)
def test_garbage_responses_are_protocol_errors(servers, garbage, problem):
    master = start(servers, FakeServer(garbage))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        with pytest.raises(stratus_client.ProtocolError, match=problem):
            client.read(TABLE, b"k")
    assert len(master.requests) == 1, "a protocol violation is not retried"


# ---------------------------------------------------------------------------------------------
# Multi-operations.


def multi_count(request: Request) -> int:
    return struct.unpack_from("<I", request.body)[0]


def multi_read_keys(request: Request) -> list[bytes]:
    keys, offset = [], 4
    for _ in range(multi_count(request)):
        (key_length,) = struct.unpack_from("<H", request.body, offset + 8)
        keys.append(request.body[offset + 10 : offset + 10 + key_length])
        offset += 10 + key_length + 9
    return keys


def test_multi_read_mixes_values_errors_and_retried_items(servers):
    def answer(request: Request):
        results = b""
        for key in multi_read_keys(request):
            if key == b"missing":
                results += struct.pack("<HQI", Status.OBJECT_DOESNT_EXIST, 0, 0)
            elif key == b"busy" and len(master.requests) == 1:
                results += struct.pack("<HQI", Status.RETRY, 0, 0)
            else:
                results += struct.pack("<HQI", 0, 3, len(key)) + key
        return response_frame(request, 0, struct.pack("<I", multi_count(request)) + results)

    master = start(servers, FakeServer(answer))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        results = client.multi_read(
            [KeyItem(TABLE, b"present"), (TABLE, b"missing"), KeyItem(TABLE, "busy"), (TABLE, b"")]
        )
    assert results[0] == (b"present", 3)
    assert isinstance(results[1], stratus_client.ObjectDoesNotExist)
    assert results[2] == (b"busy", 3)
    assert isinstance(results[3], stratus_client.InvalidKey)
    assert [multi_read_keys(request) for request in master.requests] == [
        [b"present", b"missing", b"busy"],
        [b"busy"],
    ]


def test_multi_operation_follows_moved_items(servers):
    def old_answer(request: Request):
        count = multi_count(request)
        return response_frame(
            request,
            0,
            struct.pack("<I", count) + struct.pack("<HQ", Status.UNKNOWN_TABLET, 0) * count,
        )

    def new_answer(request: Request):
        count = multi_count(request)
        return response_frame(
            request, 0, struct.pack("<I", count) + struct.pack("<HQ", 0, 9) * count
        )

    old = start(servers, FakeServer(old_answer))
    new = start(servers, FakeServer(new_answer))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(old), whole_table_on(new)))
    with Client(coordinator.address, timeout=5) as client:
        assert client.multi_write([WriteItem(TABLE, b"a", b"1"), (TABLE, b"b", b"2")]) == [9, 9]
    assert len(old.requests) == 1 and len(new.requests) == 1


def test_a_batch_refused_as_a_whole_fails_every_item_once(servers):
    master = start(
        servers,
        FakeServer(lambda request: error_frame(request, Status.REQUEST_FORMAT_ERROR, "bad body")),
    )
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=5) as client:
        results = client.multi_increment([IncrementItem(TABLE, b"a", 1), (TABLE, b"b", 2)])
    assert all(isinstance(result, stratus_client.RequestFormatError) for result in results)
    assert len(master.requests) == 1


def test_large_multi_operations_are_split_into_4096_item_requests(servers):
    def answer(request: Request):
        count = multi_count(request)
        return response_frame(
            request, 0, struct.pack("<I", count) + struct.pack("<HQ", 0, 1) * count
        )

    master = start(servers, FakeServer(answer))
    coordinator = start(servers, ScriptedCoordinator(whole_table_on(master)))
    with Client(coordinator.address, timeout=10) as client:
        results = client.multi_remove([(TABLE, f"k{number}") for number in range(5000)])
    assert results == [1] * 5000
    assert [multi_count(request) for request in master.requests] == [4096, 904]


def test_multi_items_still_pending_at_the_deadline_time_out(servers):
    coordinator = start(
        servers, ScriptedCoordinator([(TABLE, 0, TOP, 1, unused_address(), NORMAL)])
    )
    with Client(coordinator.address, timeout=0.3) as client:
        results = client.multi_read([(TABLE, b"a"), (TABLE, b"b"), (0, b"c")])
    assert isinstance(results[0], stratus_client.Timeout)
    assert isinstance(results[1], stratus_client.Timeout)
    assert isinstance(results[0].last_error, stratus_client.CouldNotConnect)
    assert isinstance(results[2], stratus_client.TableDoesNotExist)


def test_items_that_cannot_be_sent_are_refused_locally():
    with Client(unused_address(), timeout=5) as client:
        results = client.multi_write(
            [(TABLE, b"", b"v"), (TABLE, bytes(65536), b"v"), (0, b"k", b"v")]
        )
    assert isinstance(results[0], stratus_client.InvalidKey)
    assert isinstance(results[1], stratus_client.InvalidKey)
    assert isinstance(results[2], stratus_client.TableDoesNotExist)


# ---------------------------------------------------------------------------------------------
# Enumeration.


def enumerate_response(request: Request, objects: list[tuple[bytes, bytes, int]], next_cursor):
    body = struct.pack("<I", len(objects))
    for key, value, version in objects:
        body += struct.pack("<H", len(key)) + key + struct.pack("<I", len(value)) + value
        body += struct.pack("<QB", version, 0)
    if next_cursor is None:
        body += b"\x00"
    else:
        reversed_hash, after_key = next_cursor
        body += b"\x01" + struct.pack("<QB", reversed_hash, 1) + struct.pack("<H", len(after_key))
        body += after_key
    return response_frame(request, 0, body)


def enumerate_request_fields(request: Request):
    table_id, start, end, reversed_hash, has_key = struct.unpack_from("<QQQQB", request.body)
    after_key = None
    if has_key:
        (key_length,) = struct.unpack_from("<H", request.body, 33)
        after_key = request.body[35 : 35 + key_length]
    (bytes_max,) = struct.unpack_from("<I", request.body, len(request.body) - 4)
    return table_id, (start, end), (reversed_hash, after_key), bytes_max


def test_enumeration_resumes_each_tablet_at_the_cursor_it_was_given(servers):
    low = start(
        servers,
        FakeServer(
            answers_in_turn(
                lambda request: enumerate_response(
                    request, [(b"a", b"1", 1), (b"b", b"2", 2)], (77, b"b")
                ),
                lambda request: error_frame(request, Status.RETRY, "busy"),
                lambda request: enumerate_response(request, [(b"c", b"3", 3)], None),
            )
        ),
    )
    high = start(
        servers,
        FakeServer(lambda request: enumerate_response(request, [(b"z", b"26", 4)], None)),
    )
    coordinator = start(
        servers,
        ScriptedCoordinator(
            [
                (TABLE, 0, HALF - 1, 1, low.address, NORMAL),
                (TABLE, HALF, TOP, 2, high.address, NORMAL),
            ]
        ),
    )
    with Client(coordinator.address, timeout=5) as client:
        objects = list(client.enumerate(TABLE, batch_bytes=1000))
    assert objects == [(b"a", b"1", 1), (b"b", b"2", 2), (b"c", b"3", 3), (b"z", b"26", 4)]
    assert [enumerate_request_fields(request) for request in low.requests] == [
        (TABLE, (0, HALF - 1), (0, None), 1000),
        (TABLE, (0, HALF - 1), (77, b"b"), 1000),
        (TABLE, (0, HALF - 1), (77, b"b"), 1000),
    ]
    assert [enumerate_request_fields(request) for request in high.requests] == [
        (TABLE, (HALF, TOP), (0, None), 1000)
    ]


def test_enumeration_keeps_its_cursor_when_a_tablet_splits(servers):
    """Objects before the cursor were returned from the whole range, so both halves of a split
    tablet resume at that cursor, not at the start."""
    whole = start(
        servers,
        FakeServer(
            answers_in_turn(
                lambda request: enumerate_response(request, [(b"a", b"1", 1)], (77, b"a")),
                lambda request: error_frame(request, Status.UNKNOWN_TABLET),
            )
        ),
    )
    low = start(
        servers, FakeServer(lambda request: enumerate_response(request, [(b"b", b"2", 2)], None))
    )
    high = start(
        servers, FakeServer(lambda request: enumerate_response(request, [(b"c", b"3", 3)], None))
    )
    coordinator = start(
        servers,
        ScriptedCoordinator(
            whole_table_on(whole),
            [
                (TABLE, 0, HALF - 1, 2, low.address, NORMAL),
                (TABLE, HALF, TOP, 3, high.address, NORMAL),
            ],
        ),
    )
    with Client(coordinator.address, timeout=5) as client:
        keys = [key for key, _, _ in client.enumerate(TABLE, batch_bytes=64)]
    assert keys == [b"a", b"b", b"c"]
    assert [enumerate_request_fields(request) for request in whole.requests] == [
        (TABLE, (0, TOP), (0, None), 64),
        (TABLE, (0, TOP), (77, b"a"), 64),
    ]
    assert [enumerate_request_fields(request) for request in low.requests] == [
        (TABLE, (0, HALF - 1), (77, b"a"), 64)
    ]
    assert [enumerate_request_fields(request) for request in high.requests] == [
        (TABLE, (HALF, TOP), (77, b"a"), 64)
    ]


# ---------------------------------------------------------------------------------------------
# The client's own contract.


def test_a_closed_client_refuses_calls():
    client = Client(unused_address(), timeout=1)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):
        client.list_tables()


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda client: client.read(TABLE, 5), TypeError),
        (lambda client: client.write(TABLE, b"k", 5), TypeError),
        (lambda client: client.read("table", b"k"), TypeError),
        (lambda client: client.increment(TABLE, b"k", 1 << 63), ValueError),
        (lambda client: client.increment(TABLE, b"k", 1.5), TypeError),
        (lambda client: client.read(TABLE, b""), stratus_client.InvalidKey),
        (lambda client: client.read(TABLE, bytes(65536)), stratus_client.InvalidKey),
        (lambda client: client.read(0, b"k"), stratus_client.TableDoesNotExist),
        (lambda client: client.write(TABLE, b"k", b"v", reject_rules="exists"), TypeError),
        (lambda client: client.create_table("", 1), stratus_client.InvalidParameter),
        (lambda client: client.create_table("x" * 257, 1), stratus_client.InvalidParameter),
        (lambda client: client.enumerate(TABLE, batch_bytes=0), ValueError),
    ],
)
def test_invalid_arguments_fail_before_anything_is_sent(call, error):
    with Client(unused_address(), timeout=5) as client:
        with pytest.raises(error):
            call(client)


@pytest.mark.parametrize("address", ["localhost", "host:", ":7400", "host:99999", "host:port"])
def test_malformed_coordinator_addresses_are_refused(address):
    with pytest.raises(ValueError):
        Client(address)


def test_timeouts_must_be_positive():
    with pytest.raises(ValueError):
        Client("127.0.0.1:7400", timeout=0)
    with pytest.raises(ValueError):
        Client("127.0.0.1:7400", request_timeout=-1)
