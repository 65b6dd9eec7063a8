"""Every client call against a real local cluster (``stratus up``, see conftest.py)."""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter

import pytest

import conftest
import stratus_client
from stratus_client import (
    Expiry,
    IncrementItem,
    KeyItem,
    RejectRules,
    TabletState,
    Tier,
    WriteItem,
    key_hash,
)
from stratus_client.key_hash import reverse_bits


def as_integer(value: bytes) -> int:
    return struct.unpack("<q", value)[0]


# ---------------------------------------------------------------------------------------------
# Tables.


def test_table_lifecycle(client, table_name):
    table_id = client.create_table(table_name, span=2)
    assert table_id > 0
    assert client.create_table(table_name, span=2) == table_id, "an existing name keeps its id"
    assert client.get_table_id(table_name) == table_id
    entries = {entry.name: entry for entry in client.list_tables()}
    assert entries[table_name].table_id == table_id
    assert entries[table_name].tablet_count == 2
    tablets = client.tablet_map(table_id)
    assert len(tablets) == 2
    assert tablets[0].range.start == 0 and tablets[-1].range.end == (1 << 64) - 1
    assert tablets[0].range.end + 1 == tablets[1].range.start
    assert all(tablet.state is TabletState.NORMAL for tablet in tablets)

    client.write(table_id, b"k", b"v")
    client.drop_table(table_name)
    assert table_name not in {entry.name for entry in client.list_tables()}
    with pytest.raises(stratus_client.TableDoesNotExist):
        client.get_table_id(table_name)
    with pytest.raises(stratus_client.TableDoesNotExist):
        client.read(table_id, b"k")
    with pytest.raises(stratus_client.TableDoesNotExist):
        client.drop_table(table_name)


def test_a_flash_table_is_listed_with_its_tier_which_never_changes(client, table_name):
    table_id = client.create_table(table_name, span=2, tier="flash")
    entries = {entry.name: entry for entry in client.list_tables()}
    assert entries[table_name].tier is Tier.FLASH
    assert str(entries[table_name].tier) == "flash"
    assert client.create_table(table_name, span=2, tier=Tier.FLASH) == table_id
    # Asked for with another tier, the existing table is refused, not answered with its id.
    with pytest.raises(stratus_client.InvalidParameter, match="exists with tier flash"):
        client.create_table(table_name, span=2)
    client.write(table_id, b"k", b"on flash")
    assert client.read(table_id, b"k")[0] == b"on flash"
    memory_name = table_name + "-memory"
    client.create_table(memory_name)
    entries = {entry.name: entry for entry in client.list_tables()}
    assert entries[memory_name].tier is Tier.MEMORY
    with pytest.raises(ValueError, match="is not one of"):
        client.create_table(table_name + "-disk", tier="disk")
    client.drop_table(table_name)
    client.drop_table(memory_name)


def test_a_client_with_a_stale_map_learns_the_table_was_dropped(cluster, client, table_name):
    table_id = client.create_table(table_name, span=3)
    with cluster.client() as other:
        other.write(table_id, b"k", b"v")  # caches the map
        client.drop_table(table_name)
        with pytest.raises(stratus_client.TableDoesNotExist):
            other.read(table_id, b"k")


def test_server_list(client):
    servers = client.server_list()
    assert len(servers) == 3
    assert len({server.server_id for server in servers}) == 3
    for server in servers:
        assert server.status is stratus_client.ServerStatus.UP
        assert server.is_master and server.is_backup
        assert server.address.startswith("127.0.0.1:")


def test_table_parameters_are_checked_by_the_coordinator(client, table_name):
    with pytest.raises(stratus_client.InvalidParameter):
        client.create_table(table_name, span=0)
    with pytest.raises(stratus_client.InvalidParameter):
        client.create_table(table_name, span=1025)
    with pytest.raises(stratus_client.TableDoesNotExist):
        client.get_table_id(table_name)


# ---------------------------------------------------------------------------------------------
# Objects.


def test_write_read_remove(client, table_name):
    table_id = client.create_table(table_name, span=3)
    first = client.write(table_id, b"alice", b"hello")
    assert client.read(table_id, b"alice") == (b"hello", first)
    second = client.write(table_id, b"alice", b"world")
    assert second > first, "versions strictly increase"
    assert client.read(table_id, b"alice") == (b"world", second)

    assert client.remove(table_id, b"alice") == second
    with pytest.raises(stratus_client.ObjectDoesNotExist) as missing:
        client.read(table_id, b"alice")
    assert missing.value.version == 0
    assert client.remove(table_id, b"alice") == 0, "removing a missing object removes nothing"

    third = client.write(table_id, b"alice", b"again")
    assert third > second, "a re-created object never reuses a version"


def test_keys_and_values_are_binary_and_str_is_utf8(client, table_name):
    table_id = client.create_table(table_name, span=3)
    every_byte = bytes(range(256))
    client.write(table_id, every_byte, every_byte)
    assert client.read(table_id, every_byte)[0] == every_byte
    client.write(table_id, "clé", "été ☀")
    assert client.read(table_id, "clé".encode())[0] == "été ☀".encode()
    client.write(table_id, bytearray(b"empty"), b"")
    assert client.read(table_id, memoryview(b"empty"))[0] == b""


def test_size_limits(cluster, client, table_name):
    table_id = client.create_table(table_name, span=1)
    longest_key = b"k" * 65535
    client.write(table_id, longest_key, b"v")
    assert client.read(table_id, longest_key)[0] == b"v"
    largest = bytes(range(256)) * (cluster.value_bytes_max // 256)
    client.write(table_id, b"large", largest)
    assert client.read(table_id, b"large")[0] == largest
    with pytest.raises(stratus_client.ValueTooLarge):
        client.write(table_id, b"larger", largest + b"!")
    with pytest.raises(stratus_client.InvalidKey):
        client.write(table_id, b"", b"v")
    with pytest.raises(stratus_client.InvalidKey):
        client.write(table_id, longest_key + b"k", b"v")


def test_reject_rules_on_write(client, table_name):
    table_id = client.create_table(table_name, span=3)

    with pytest.raises(stratus_client.ObjectDoesNotExist) as missing:
        client.write(table_id, b"k", b"v0", RejectRules.only_if_exists())
    assert missing.value.version == 0
    with pytest.raises(stratus_client.WrongVersion) as wrong:
        client.write(table_id, b"k", b"v0", RejectRules.only_if_version(3))
    assert wrong.value.version == 0

    created = client.write(table_id, b"k", b"v1", RejectRules.only_if_missing())
    with pytest.raises(stratus_client.ObjectExists) as exists:
        client.write(table_id, b"k", b"v2", RejectRules.only_if_missing())
    assert exists.value.version == created
    with pytest.raises(stratus_client.WrongVersion) as stale:
        client.write(table_id, b"k", b"v2", RejectRules.only_if_version(created + 1))
    assert stale.value.version == created
    with pytest.raises(stratus_client.WrongVersion):
        client.write(table_id, b"k", b"v2", RejectRules.only_if_newer_than(created))
    assert client.read(table_id, b"k") == (b"v1", created), "a rejected write changes nothing"

    updated = client.write(table_id, b"k", b"v2", RejectRules.only_if_version(created))
    assert updated > created
    newer = client.write(table_id, b"k", b"v3", RejectRules.only_if_newer_than(created))
    assert newer > updated
    also = client.write(table_id, b"k", b"v4", RejectRules.only_if_exists())
    assert client.read(table_id, b"k") == (b"v4", also)


def test_reject_rules_on_read_remove_and_increment(client, table_name):
    table_id = client.create_table(table_name, span=3)
    version = client.write(table_id, b"k", b"v")
    assert client.read(table_id, b"k", RejectRules.only_if_version(version)) == (b"v", version)
    with pytest.raises(stratus_client.WrongVersion) as wrong:
        client.read(table_id, b"k", RejectRules.only_if_version(version + 5))
    assert wrong.value.version == version
    with pytest.raises(stratus_client.ObjectDoesNotExist):
        # A read of a missing object answers this before any rule is checked.
        client.read(table_id, b"absent", RejectRules.only_if_version(0))

    with pytest.raises(stratus_client.WrongVersion):
        client.remove(table_id, b"k", RejectRules.only_if_version(version + 1))
    with pytest.raises(stratus_client.ObjectDoesNotExist):
        client.remove(table_id, b"absent", RejectRules.only_if_exists())
    assert client.remove(table_id, b"k", RejectRules.only_if_version(version)) == version

    with pytest.raises(stratus_client.ObjectDoesNotExist):
        client.increment(table_id, b"counter", 1, RejectRules.only_if_exists())
    counted = client.increment(table_id, b"counter", 1, RejectRules.only_if_missing())
    assert counted[0] == 1
    with pytest.raises(stratus_client.ObjectExists) as exists:
        client.increment(table_id, b"counter", 1, RejectRules.only_if_missing())
    assert exists.value.version == counted[1]


def test_increment(client, table_name):
    table_id = client.create_table(table_name, span=3)
    value, first = client.increment(table_id, b"visits", 5)
    assert value == 5
    value, second = client.increment(table_id, b"visits", -7)
    assert (value, second > first) == (-2, True)
    stored, version = client.read(table_id, b"visits")
    assert (len(stored), as_integer(stored), version) == (8, -2, second)

    client.write(table_id, b"text", b"not a number")
    with pytest.raises(stratus_client.InvalidObject):
        client.increment(table_id, b"text", 1)
    client.write(table_id, b"largest", struct.pack("<q", (1 << 63) - 1))
    with pytest.raises(stratus_client.InvalidObject):
        client.increment(table_id, b"largest", 1)
    assert client.increment(table_id, b"largest", -((1 << 63) - 1))[0] == 0


def test_a_resent_increment_is_applied_once(client, table_name):
    """What a retry after a lost answer does: the same INCREMENT, identity included, reaches
    the master twice. The second answer is the first one's, and the delta was added once."""
    from stratus_client import codec
    from stratus_client.codec import Opcode
    from stratus_client.retry import Attempts

    table_id = client.create_table(table_name, span=1)
    client.increment(table_id, b"n", 10)
    attempts = Attempts("resend", 30.0)
    (tablet,) = client.tablet_map(table_id)
    ticket = client._lease_agent.ticket(attempts)
    try:
        body = codec.increment_body(table_id, b"n", 5, None, ticket.identity())
        answers = [
            client._send(tablet.owner_address, Opcode.INCREMENT, body, attempts) for _ in range(2)
        ]
    finally:
        ticket.release()
    assert answers[0] == answers[1]
    status, (version, value) = answers[0]
    assert (status, value) == (stratus_client.Status.OK, 15)
    stored, stored_version = client.read(table_id, b"n")
    assert (as_integer(stored), stored_version) == (15, version)
    # Later mutations acknowledge it; the client goes on as usual.
    assert client.increment(table_id, b"n", 1)[0] == 16
    assert client.multi_increment([(table_id, b"n", 1), (table_id, b"m", 2)]) == [
        (17, client.read(table_id, b"n")[1]),
        (2, client.read(table_id, b"m")[1]),
    ]


def test_a_client_without_exactly_once_still_works(cluster, table_name):
    with cluster.client(exactly_once=False) as client:
        table_id = client.create_table(table_name, span=2)
        assert client.increment(table_id, b"n", 3)[0] == 3
        client.write(table_id, b"k", b"v")
        assert client.multi_remove([(table_id, b"k"), (table_id, b"n")])[0] > 0
        with pytest.raises(stratus_client.ObjectDoesNotExist):
            client.read(table_id, b"k")


# ---------------------------------------------------------------------------------------------
# Multi-operations: one result per item, values and typed errors mixed.


def test_objects_expire(client, table_name):
    table = client.create_table(table_name)
    client.write(table, "session", b"token", ttl=3600)
    value, version, expires_in = client.read_object(table, "session")
    assert value == b"token"
    assert 3500 < expires_in <= 3600
    # A plain write clears the expiry; KEEP keeps it.
    client.write(table, "session", b"token2", expiry=Expiry.after(60))
    client.write(table, "session", b"token3", expiry=Expiry.KEEP)
    assert 50 < client.read_object(table, "session").expires_in <= 60
    client.write(table, "session", b"token4")
    assert client.read_object(table, "session").expires_in is None
    # set_expiry keeps the value and makes a new version.
    version = client.set_expiry(table, "session", Expiry.after(0.2))
    assert client.read(table, "session") == (b"token4", version)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.read(table, "session")
        except stratus_client.ObjectDoesNotExist:
            break
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.05)
    with pytest.raises(stratus_client.ObjectDoesNotExist):
        client.set_expiry(table, "session", Expiry.NEVER)
    with pytest.raises(ValueError):
        client.write(table, "k", b"v", expiry=Expiry.NEVER, ttl=5)
    # Multi-writes take an expiry per item.
    results = client.multi_write(
        [WriteItem(table, "a", b"1", expiry=Expiry.after(3600)), WriteItem(table, "b", b"2")]
    )
    assert all(isinstance(result, int) for result in results), results
    assert client.read_object(table, "a").expires_in > 3500
    assert client.read_object(table, "b").expires_in is None


def test_multi_operations_with_mixed_results(client, table_name):
    table_id = client.create_table(table_name, span=3)
    client.write(table_id, b"existing", b"old")
    client.write(table_id, b"text", b"abc")

    written = client.multi_write(
        [WriteItem(table_id, f"key-{number}", f"value-{number}") for number in range(30)]
        + [
            WriteItem(table_id, b"existing", b"new", RejectRules.only_if_missing()),
            WriteItem(table_id, b"", b"empty key"),
            WriteItem(table_id + 10_000, b"k", b"no such table"),
            (table_id, b"tuple", b"form"),
        ]
    )
    assert all(isinstance(version, int) and version > 0 for version in written[:30])
    assert isinstance(written[30], stratus_client.ObjectExists)
    assert written[30].version > 0
    assert isinstance(written[31], stratus_client.InvalidKey)
    assert isinstance(written[32], stratus_client.TableDoesNotExist)
    assert isinstance(written[33], int)

    read = client.multi_read(
        [KeyItem(table_id, f"key-{number}") for number in range(30)]
        + [
            KeyItem(table_id, b"missing"),
            KeyItem(table_id, b"existing", RejectRules.only_if_version(written[0] + 10_000)),
            (table_id, b"existing"),
        ]
    )
    assert read[:30] == [(f"value-{number}".encode(), written[number]) for number in range(30)]
    assert isinstance(read[30], stratus_client.ObjectDoesNotExist)
    assert isinstance(read[31], stratus_client.WrongVersion)
    assert read[32][0] == b"old"

    incremented = client.multi_increment(
        [IncrementItem(table_id, b"counter-a", 2), IncrementItem(table_id, b"counter-b", -3)]
        + [IncrementItem(table_id, b"text", 1), IncrementItem(table_id, b"counter-a", 10)]
    )
    assert incremented[0][0] == 2 and incremented[1][0] == -3
    assert isinstance(incremented[2], stratus_client.InvalidObject)
    assert incremented[3][0] == 12, "items of one key apply in order"

    removed = client.multi_remove(
        [KeyItem(table_id, f"key-{number}") for number in range(30)]
        + [
            KeyItem(table_id, b"missing"),
            KeyItem(table_id, b"existing", RejectRules.only_if_version(1 << 40)),
        ]
    )
    assert removed[:30] == written[:30]
    assert removed[30] == 0
    assert isinstance(removed[31], stratus_client.WrongVersion)
    after = client.multi_read([KeyItem(table_id, f"key-{number}") for number in range(30)])
    assert all(isinstance(result, stratus_client.ObjectDoesNotExist) for result in after)


def test_multi_operations_larger_than_one_request(client, table_name):
    table_id = client.create_table(table_name, span=1)  # one master: every item in one group
    items = [WriteItem(table_id, f"bulk-{number}", b"x" * 10) for number in range(5000)]
    versions = client.multi_write(items)
    assert all(isinstance(version, int) for version in versions)
    read = client.multi_read([KeyItem(table_id, item.key) for item in items])
    assert read == [(b"x" * 10, version) for version in versions]


# ---------------------------------------------------------------------------------------------
# Enumeration.

OBJECT_COUNT = 3000


@pytest.fixture
def filled_table(client, table_name):
    """A table over three masters holding OBJECT_COUNT objects; (table id, {key: (value,
    version)})."""
    table_id = client.create_table(table_name, span=3)
    items = [
        WriteItem(table_id, f"object-{number:05}", f"value-{number}" * (number % 7))
        for number in range(OBJECT_COUNT)
    ]
    versions = client.multi_write(items)
    assert all(isinstance(version, int) for version in versions)
    expected = {
        item.key.encode(): (item.value.encode(), version)
        for item, version in zip(items, versions, strict=True)
    }
    return table_id, expected


def test_enumeration_returns_every_object_exactly_once(client, filled_table):
    table_id, expected = filled_table
    tablets = client.tablet_map(table_id)
    assert len(tablets) == 3
    objects = list(client.enumerate(table_id, batch_bytes=2048))
    keys = Counter(key for key, _, _ in objects)
    assert len(objects) == OBJECT_COUNT and set(keys.values()) == {1}
    assert {key: (value, version) for key, value, version in objects} == expected

    # The order of the specification: tablet by tablet (in hash order), and within a tablet
    # by bit-reversed key hash.
    tablet_of = [
        next(
            index
            for index, tablet in enumerate(tablets)
            if tablet.range.contains(key_hash(table_id, key))
        )
        for key, _, _ in objects
    ]
    assert tablet_of == sorted(tablet_of)
    assert set(tablet_of) == {0, 1, 2}
    order = [
        (tablet, reverse_bits(key_hash(table_id, key)), key)
        for tablet, (key, _, _) in zip(tablet_of, objects, strict=True)
    ]
    assert order == sorted(order)


def test_enumeration_in_batches(client, filled_table):
    table_id, expected = filled_table
    enumeration = client.enumerate(table_id, batch_bytes=10_000)
    batches = []
    while (batch := enumeration.next_batch()) is not None:
        assert batch
        batches.append(batch)
    assert len(batches) > 3, "small batches take many round trips"
    assert sorted(key for batch in batches for key, _, _ in batch) == sorted(expected)
    assert enumeration.position.finished
    assert enumeration.next_batch() is None


@pytest.mark.parametrize("stop_after", [1, 777, 1500, OBJECT_COUNT - 1])
def test_enumeration_resumes_from_its_position(cluster, client, filled_table, stop_after):
    table_id, expected = filled_table
    first = client.enumerate(table_id, batch_bytes=4096)
    seen = [next(first).key for _ in range(stop_after)]
    position = first.position
    assert not position.finished
    with cluster.client() as other:  # the position does not depend on the client
        seen += [key for key, _, _ in other.enumerate(table_id, resume_from=position)]
    assert Counter(seen) == Counter(expected.keys())


def test_enumerating_an_empty_or_missing_table(client, table_name):
    table_id = client.create_table(table_name, span=3)
    assert list(client.enumerate(table_id)) == []
    client.drop_table(table_name)
    with pytest.raises(stratus_client.TableDoesNotExist):
        list(client.enumerate(table_id))
    with pytest.raises(ValueError):
        client.enumerate(table_id + 1, resume_from=client.enumerate(table_id).position)


# ---------------------------------------------------------------------------------------------
# Sharing and lifetime.


def test_one_client_shared_by_threads(client, table_name):
    table_id = client.create_table(table_name, span=3)
    failures = []

    def writer(thread_number: int) -> None:
        try:
            for number in range(100):
                client.write(table_id, f"t{thread_number}-{number}", str(number))
        except Exception as error:  # reported below, with the thread that failed
            failures.append((thread_number, error))

    threads = [threading.Thread(target=writer, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert failures == []
    assert len(list(client.enumerate(table_id))) == 400


def test_context_manager_closes_the_client(cluster):
    with cluster.client() as client:
        client.list_tables()
    with pytest.raises(RuntimeError):
        client.list_tables()


def test_several_coordinator_addresses_find_the_one_that_listens(cluster, table_name):
    # Standby coordinators do not listen: the client skips addresses it cannot reach, in both
    # orders, and keeps using the one that answered.
    dead = f"127.0.0.1:{conftest.free_loopback_port()}"
    for addresses in (f"{dead},{cluster.coordinator}", f"{cluster.coordinator},{dead}"):
        with stratus_client.Client(addresses, timeout=10.0) as client:
            table_id = client.create_table(table_name, span=1)
            client.write(table_id, b"k", b"v")
            assert client.read(table_id, b"k")[0] == b"v"
            assert client.get_table_id(table_name) == table_id
