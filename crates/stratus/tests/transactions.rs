//! Multi-object transactions (docs/design/transactions.md) with real processes: money moves
//! between accounts spread over several masters, concurrently, while read-only transactions
//! sum every account; the total never changes, before, during and after a participant is
//! killed with SIGKILL and recovered from its replicas.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestCluster;
use stratus_client::{Client, ClientConfig, TableId, TxOutcome};
use stratus_types::TabletState;

/// How long the test waits for an operation, a recovery, a transaction.
const PATIENCE: Duration = Duration::from_secs(60);
const ACCOUNTS: u64 = 24;
const OPENING_BALANCE: i64 = 1_000;

fn patient_client(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = PATIENCE;
    Client::new(config)
}

fn account(index: u64) -> Vec<u8> {
    format!("account-{index:03}").into_bytes()
}

fn balance(value: Option<bytes::Bytes>) -> i64 {
    let value = value.expect("every account exists");
    i64::from_le_bytes(value[..].try_into().expect("an 8-byte balance"))
}

async fn open_accounts(client: &Client, table: TableId) {
    for index in 0..ACCOUNTS {
        client.write(table, &account(index), &OPENING_BALANCE.to_le_bytes()).await.unwrap();
    }
}

/// Sums every account in one read-only transaction; `None` when it aborted (a transfer
/// changed an account between its reads).
async fn audited_total(client: &Client, table: TableId) -> Option<i64> {
    let audit = client.transaction();
    let mut total = 0;
    for index in 0..ACCOUNTS {
        total += balance(audit.read(table, &account(index)).await.unwrap());
    }
    match audit.commit().await.unwrap() {
        TxOutcome::Committed => Some(total),
        TxOutcome::Aborted(_) => None,
    }
}

/// Moves money between pseudo-random pairs of accounts until `stop`; returns how many
/// transfers committed.
async fn transfer_until(client: Client, table: TableId, seed: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut committed = 0;
    while !stop.load(Ordering::Acquire) {
        let from = next() % ACCOUNTS;
        let to = (from + 1 + next() % (ACCOUNTS - 1)) % ACCOUNTS;
        let amount = (next() % 50) as i64;
        let moved = client
            .run_transaction(|tx| async move {
                let source = balance(tx.read(table, &account(from)).await?);
                tx.write(table, &account(from), &(source - amount).to_le_bytes())?;
                tx.increment(table, &account(to), amount).await?;
                Ok(())
            })
            .await;
        match moved {
            Ok(()) => committed += 1,
            // A transfer that timed out (a recovery took long) may or may not have committed:
            // the invariant holds either way, and the next one goes on.
            Err(error) => eprintln!("transfer {from} -> {to}: {error}"),
        }
        // A pause between transfers, so that audits (24 reads each) are not starved: an
        // optimistic read-only transaction aborts whenever a transfer touched what it read.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    committed
}

async fn wait_for_a_clean_audit(client: &Client, table: TableId) -> i64 {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(total) = audited_total(client, table).await {
            return total;
        }
        assert!(tokio::time::Instant::now() < deadline, "no audit committed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transfers_keep_the_total_through_a_participant_crash() {
    let mut cluster = TestCluster::start_with_replicas(4, 2);
    let client = patient_client(&cluster);
    let table = client.create_table("bank", 3).await.unwrap();
    let owners: std::collections::BTreeSet<_> =
        client.tablet_map(table).await.unwrap().into_iter().map(|tablet| tablet.owner).collect();
    assert_eq!(owners.len(), 3, "the accounts are spread over three masters");
    open_accounts(&client, table).await;
    let total = OPENING_BALANCE * ACCOUNTS as i64;
    assert_eq!(wait_for_a_clean_audit(&client, table).await, total);

    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|seed| tokio::spawn(transfer_until(client.clone(), table, seed, stop.clone())))
        .collect();
    let audits = Arc::new(AtomicU64::new(0));
    let auditor = {
        let (client, stop, audits) = (client.clone(), stop.clone(), audits.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                if let Some(seen) = audited_total(&client, table).await {
                    assert_eq!(seen, total, "a read-only transaction saw money appear or vanish");
                    audits.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // Transfers run before, during and after the crash of a participant and its recovery.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tablet = client.tablet_map(table).await.unwrap().remove(0);
    let victim = cluster
        .servers
        .iter_mut()
        .find(|process| process.address.as_deref() == Some(tablet.owner_address.as_str()))
        .expect("the owner's process");
    victim.kill();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let recovered = map.iter().all(|entry| {
            entry.state == TabletState::Normal && entry.owner_address != tablet.owner_address
        });
        if recovered {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Release);
    let mut committed = 0;
    for worker in workers {
        committed += worker.await.unwrap();
    }
    auditor.await.unwrap();
    assert!(committed > 0, "no transfer committed");
    assert!(audits.load(Ordering::Relaxed) > 0, "no audit committed during the transfers");
    // Every lock was released (plain reads get through) and not a unit was lost.
    let mut sum = 0;
    for index in 0..ACCOUNTS {
        let (value, _) = client.read(table, &account(index)).await.unwrap();
        sum += balance(Some(value));
    }
    assert_eq!(sum, total);
    eprintln!("{committed} transfers committed, {} audits", audits.load(Ordering::Relaxed));
}

/// A client that dies between its PREPAREs and its decision, simulated with raw requests: a
/// lease, PREPAREs sent straight to the masters, no decision ever.
struct DyingClient {
    pool: stratus_rpc::ChannelPool,
    lease: stratus_client::LeaseId,
}

impl DyingClient {
    async fn open(coordinator: &str) -> DyingClient {
        use stratus_wire::{Request, Response, ResponseBody, Status};
        let pool = stratus_rpc::ChannelPool::new(
            stratus_env::Environment::system().network,
            stratus_rpc::RpcConfig::default(),
        );
        let request = Request::ClientLease { lease: stratus_client::LeaseId(0) };
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Ok((Status::Ok, ResponseBody::Operation(Response::ClientLease { lease, .. }))) =
                pool.call_coordinator(coordinator, &request).await
            {
                return DyingClient { pool, lease };
            }
            assert!(tokio::time::Instant::now() < deadline, "no client lease");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Prepares `ops` (key, rpc id, new value, version read) of the transaction listing
    /// `participants`, each at its master, and returns the votes.
    async fn prepare(
        &self,
        client: &Client,
        table: TableId,
        ops: &[(&[u8], u64, i64, stratus_client::Version)],
        participants: &[stratus_wire::TxDecisionOp],
    ) -> Vec<stratus_types::TxVote> {
        use stratus_wire::{Request, Response, ResponseBody, Status, TxOp};
        let mut votes = Vec::new();
        for &(key, rpc, value, version_read) in ops {
            let hash = stratus_types::key_hash(table, key);
            let request = Request::TxPrepare {
                lease: self.lease,
                acknowledged: stratus_client::RpcId(0),
                transaction: stratus_client::RpcId(participants[0].rpc.0),
                validate_only: false,
                ops: vec![TxOp {
                    table_id: table,
                    key: bytes::Bytes::copy_from_slice(key),
                    rpc: stratus_client::RpcId(rpc),
                    kind: stratus_types::TxOpKind::Write,
                    version_read,
                    value: bytes::Bytes::copy_from_slice(&value.to_le_bytes()),
                }],
                participants: participants.to_vec(),
            };
            let deadline = tokio::time::Instant::now() + PATIENCE;
            loop {
                let map = client.tablet_map(table).await.unwrap();
                let owner = map.into_iter().find(|tablet| tablet.range.contains(hash)).unwrap();
                match self.pool.call(&owner.owner_address, &request).await {
                    Ok((
                        Status::Ok,
                        ResponseBody::Operation(Response::TxPrepare { votes: got }),
                    )) if got[0].status == Status::Ok => {
                        votes.push(got[0].vote);
                        break;
                    }
                    _ => {}
                }
                assert!(tokio::time::Instant::now() < deadline, "no vote for {key:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        votes
    }
}

fn participant(table: TableId, key: &[u8], rpc: u64) -> stratus_wire::TxDecisionOp {
    stratus_wire::TxDecisionOp {
        table_id: table,
        key_hash: stratus_types::key_hash(table, key).0,
        rpc: stratus_client::RpcId(rpc),
    }
}

/// A client that prepared every operation and died: the participants commit the transaction
/// (every vote was PREPARED, so its client may have told its user "committed"). One that died
/// before preparing them all: the participants abort it, and the PREPARE that comes late votes
/// ABORT. Either way the locks go, and plain reads get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn participants_finish_the_transactions_of_a_dead_client() {
    let cluster = TestCluster::start_with_replicas(3, 1);
    let client = patient_client(&cluster);
    let table = client.create_table("orphans", 3).await.unwrap();
    let keys: [&[u8]; 4] = [b"a-from", b"a-to", b"b-from", b"b-to"];
    let mut versions = Vec::new();
    for key in keys {
        versions.push(client.write(table, key, &100i64.to_le_bytes()).await.unwrap());
    }
    let dying = DyingClient::open(&cluster.coordinator_address).await;

    // Transaction 1 (rpc ids 1, 2): both operations prepared, then the client is gone.
    let first = [participant(table, keys[0], 1), participant(table, keys[1], 2)];
    let ops = [(keys[0], 1, 90, versions[0]), (keys[1], 2, 110, versions[1])];
    let votes = dying.prepare(&client, table, &ops, &first).await;
    assert_eq!(votes, vec![stratus_types::TxVote::Prepared; 2]);
    // Transaction 2 (rpc ids 3, 4): only its first operation prepared.
    let second = [participant(table, keys[2], 3), participant(table, keys[3], 4)];
    let votes = dying.prepare(&client, table, &[(keys[2], 3, 50, versions[2])], &second).await;
    assert_eq!(votes, vec![stratus_types::TxVote::Prepared]);

    // Plain reads wait out the locks (RETRY) until the participants finish both.
    let balance_of = |value: bytes::Bytes| i64::from_le_bytes(value[..].try_into().unwrap());
    let mut after = Vec::new();
    for key in keys {
        after.push(balance_of(client.read(table, key).await.unwrap().0));
    }
    assert_eq!(after, vec![90, 110, 100, 100], "the first committed, the second aborted");
    // The second transaction's missing PREPARE, arriving now, cannot lock anything.
    let late = dying.prepare(&client, table, &[(keys[3], 4, 150, versions[3])], &second).await;
    assert_eq!(late, vec![stratus_types::TxVote::Abort]);
    client.write(table, keys[3], &7i64.to_le_bytes()).await.unwrap();
    assert_eq!(balance_of(client.read(table, keys[3]).await.unwrap().0), 7);
}
