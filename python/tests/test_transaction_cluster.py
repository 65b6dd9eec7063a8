"""Transactions against a real local cluster (the session's ``stratus up``, conftest.py): a
transfer across masters, conflicts, concurrent transfers retried by ``run_transaction`` with
the total invariant, and read-only transactions that see consistent totals.

Every test uses tables of its own; each is bounded (a few seconds on a loaded machine).
"""

from __future__ import annotations

import random
import struct
import threading
import time

import pytest

from stratus_client import AbortKind, AbortReason, ObjectDoesNotExist, TxOutcome


def money(amount: int) -> bytes:
    return struct.pack("<q", amount)


def balance(value: bytes | None) -> int:
    return 0 if value is None else struct.unpack("<q", value)[0]


def owner(client, table_id: int) -> str:
    (tablet,) = client.tablet_map(table_id)
    return tablet.owner_address


def two_tables_on_two_masters(client, name: str) -> tuple[int, int]:
    """Two one-tablet tables whose tablets two different masters own."""
    first = client.create_table(f"{name}-0", span=1)
    for number in range(1, 6):
        second = client.create_table(f"{name}-{number}", span=1)
        if owner(client, second) != owner(client, first):
            return first, second
    pytest.fail("the coordinator put every table on one master")


def test_a_transfer_between_accounts_on_two_masters_commits(client, table_name):
    checking, savings = two_tables_on_two_masters(client, table_name)
    alice_version = client.write(checking, "alice", money(100))
    client.write(savings, "bob", money(5))

    tx = client.transaction()
    assert balance(tx.read(checking, "alice")) == 100
    assert tx.increment(checking, "alice", -30) == 70
    assert tx.increment(savings, "bob", 30) == 35
    assert balance(tx.read(checking, "alice")) == 70, "a transaction reads its own writes"
    assert client.read(checking, "alice")[0] == money(100), "nothing applied before commit"
    outcome = tx.commit()
    assert outcome == TxOutcome.COMMITTED and outcome.committed

    value, version = client.read(checking, "alice")
    assert balance(value) == 70 and version > alice_version
    assert balance(client.read(savings, "bob")[0]) == 35


def test_a_write_between_read_and_commit_makes_the_commit_abort_in_a_conflict(
    cluster, client, table_name
):
    checking, savings = two_tables_on_two_masters(client, table_name)
    client.write(checking, "alice", money(100))
    client.write(savings, "bob", money(0))
    with cluster.client() as other:
        tx = client.transaction()
        tx.increment(checking, "alice", -10)
        tx.increment(savings, "bob", 10)
        other.write(checking, "alice", money(500))  # between the read and the commit
        outcome = tx.commit()
    assert not outcome
    assert outcome.reason == AbortReason.conflict(checking, b"alice")
    assert outcome.reason.kind is AbortKind.CONFLICT
    # Nothing of the transaction was applied, and its locks are gone: plain writes go on.
    assert balance(client.read(checking, "alice")[0]) == 500
    assert balance(client.read(savings, "bob")[0]) == 0
    client.write(savings, "bob", money(1))


def test_of_two_transactions_writing_what_both_read_only_the_first_commits(client, table_name):
    table = client.create_table(table_name, span=3)
    client.write(table, "x", money(1))
    first, second = client.transaction(), client.transaction()
    for tx, delta in ((first, 10), (second, 20)):
        tx.increment(table, "x", delta)
    assert first.commit().committed
    assert second.commit() == TxOutcome.aborted(AbortReason.conflict(table, b"x"))
    assert balance(client.read(table, "x")[0]) == 11


def test_removals_and_blind_writes_commit_too(client, table_name):
    table = client.create_table(table_name, span=3)
    client.write(table, "old", b"gone soon")
    tx = client.transaction()
    tx.remove(table, "old")
    assert tx.read(table, "old") is None, "its own removal"
    tx.write(table, "new", b"created")  # never read: its version is read at commit
    assert tx.read(table, "absent") is None
    assert tx.commit().committed
    with pytest.raises(ObjectDoesNotExist):
        client.read(table, "old")
    assert client.read(table, "new")[0] == b"created"
    with pytest.raises(ObjectDoesNotExist):
        client.read(table, "absent")


def test_an_expected_version_is_checked_at_commit(client, table_name):
    table = client.create_table(table_name, span=1)
    version = client.write(table, "watched", b"v1")
    tx = client.transaction()
    tx.expect_version(table, "watched", version)
    tx.write(table, "other", b"x")
    assert tx.commit().committed
    client.write(table, "watched", b"v2")
    tx = client.transaction()
    tx.expect_version(table, "watched", version)
    assert tx.commit() == TxOutcome.aborted(AbortReason.conflict(table, b"watched"))


def test_a_read_only_transaction_sees_a_consistent_total(cluster, client, table_name):
    table = client.create_table(table_name, span=3)
    accounts = [f"account-{number}" for number in range(6)]
    for account in accounts:
        client.write(table, account, money(100))
    # A read-only transaction whose reads are still current commits without locking.
    tx = client.transaction()
    assert sum(balance(tx.read(table, account)) for account in accounts) == 600
    assert tx.commit().committed
    # One whose read is overwritten before its commit does not.
    tx = client.transaction()
    assert sum(balance(tx.read(table, account)) for account in accounts) == 600
    with cluster.client() as other:
        other.run_transaction(
            lambda other_tx: (
                other_tx.increment(table, accounts[0], -1),
                other_tx.increment(table, accounts[5], 1),
            )
        )
    outcome = tx.commit()
    assert outcome.reason is not None and outcome.reason.is_conflict
    # run_transaction retries it to a consistent snapshot.
    total = client.run_transaction(
        lambda tx: sum(balance(tx.read(table, account)) for account in accounts)
    )
    assert total == 600


def test_concurrent_transfers_retried_by_run_transaction_keep_the_total(
    cluster, client, table_name
):
    table = client.create_table(table_name, span=3)
    accounts = [f"account-{number}" for number in range(5)]
    initial = 100
    for account in accounts:
        client.write(table, account, money(initial))
    total = initial * len(accounts)
    transfers_per_thread = 25
    committed: list[tuple[str, str, int]] = []
    audits: list[int] = []
    failures: list[BaseException] = []
    attempts = {"bodies": 0}
    lock = threading.Lock()
    transferring = threading.Event()

    def transfer(seed: int) -> None:
        generator = random.Random(seed)
        try:
            with cluster.client() as own:
                for _ in range(transfers_per_thread):
                    source, target = generator.sample(accounts, 2)
                    amount = generator.randint(1, 20)

                    def body(tx, source=source, target=target, amount=amount):
                        with lock:
                            attempts["bodies"] += 1
                        tx.increment(table, source, -amount)
                        tx.increment(table, target, amount)

                    own.run_transaction(body)
                    with lock:
                        committed.append((source, target, amount))
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            failures.append(error)

    def audit() -> None:
        try:
            with cluster.client() as own:
                while transferring.is_set():
                    audits.append(
                        own.run_transaction(
                            lambda tx: sum(balance(tx.read(table, a)) for a in accounts)
                        )
                    )
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            failures.append(error)

    transferring.set()
    threads = [threading.Thread(target=transfer, args=(seed,)) for seed in range(4)]
    auditor = threading.Thread(target=audit)
    started = time.monotonic()
    auditor.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    transferring.clear()
    auditor.join(timeout=60)
    assert not any(thread.is_alive() for thread in [*threads, auditor]), "a thread hung"
    assert not failures, failures
    assert len(committed) == 4 * transfers_per_thread
    # Every read-only transaction saw the total; every committed transfer applied once.
    assert audits and set(audits) == {total}
    expected = dict.fromkeys(accounts, initial)
    for source, target, amount in committed:
        expected[source] -= amount
        expected[target] += amount
    final = {account: balance(client.read(table, account)[0]) for account in accounts}
    assert final == expected
    assert sum(final.values()) == total
    print(
        f"{len(committed)} transfers in {time.monotonic() - started:.2f} s, "
        f"{attempts['bodies']} attempts, {len(audits)} audits"
    )
