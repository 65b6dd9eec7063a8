//! Concurrent clients on a small key set across 2 masters, every call recorded; the history
//! must be linearizable per key (stratus-history's checker), also when the coordinator is
//! killed with SIGKILL and restarted mid-run. Masters are not killed: crash recovery of masters
//! does not exist yet.
//!
//! Every segment is replicated on 2 backups, so writes take the real path (acknowledged only
//! once replicated). Once masters can crash and recover, the same workload with master kills
//! is the next step.
//!
//! Each client's choices come from its own seed, so the workload is the same every run; the
//! interleaving is not, and the verdict must not depend on it.
//!
//! The clients take each mutation into effect at most once (`retry_ambiguous_mutations` off, as
//! the simulation's and `stratus workload`'s do): what is checked is the cluster, and a history
//! is exact only if each recorded call is one operation. A client that resends a write after
//! an attempt of unknown outcome (a request timeout while replication stalls, RETRY after the
//! write applied) may apply it twice, which without exactly-once RPCs is a documented property
//! of that mode (README, "Status"), not a fault of the cluster. Such an attempt is recorded as
//! an unknown outcome instead.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{Client, ClientConfig, Status, TableId, Version};
use stratus_history::workload::{mixed_operation, unique_value, Choices};
use stratus_history::{check, CheckOptions, History, Outcome, Recorder, RecordingClient};

/// Concurrent clients; with the operations per client this bounds the run to a few thousand
/// operations.
const CLIENTS: u32 = 8;
/// Operations each client issues.
const OPERATIONS_PER_CLIENT: u32 = 500;
/// Keys shared by every client: few, so that operations on a key overlap often.
const KEYS: u64 = 8;
/// A client replaces its `Client` (empty tablet-map cache, new connections) this often, so
/// that the coordinator stays on the path of some operations during the run.
const OPERATIONS_PER_FRESH_CLIENT: u32 = 50;

/// The whole workload, restart included, must end within this (a hang is a failure, not a
/// test that never ends).
const WORKLOAD_PATIENCE: Duration = Duration::from_secs(300);

/// A coordinator and three servers, every segment replicated on the two others: the history
/// is checked on the real write path (acknowledged only once replicated).
fn start_cluster() -> TestCluster {
    TestCluster::start_with_replicas(3, 2)
}

/// Client i's choices come from seed `CLIENT_SEED_BASE + i`.
const CLIENT_SEED_BASE: u64 = 0x5EED_0000;

fn fresh_client(coordinator_address: &str) -> Client {
    let mut config = at_most_once_config(coordinator_address);
    // Long enough to ride out a coordinator restart, short enough to bound the test.
    config.operation_timeout = Duration::from_secs(20);
    Client::new(config)
}

/// A client configuration whose mutations take effect at most once (see the module
/// documentation).
fn at_most_once_config(coordinator_address: &str) -> ClientConfig {
    let mut config = ClientConfig::new(coordinator_address.to_string());
    config.retry_ambiguous_mutations = false;
    config
}

/// One client's workload: mixed reads, writes, conditional writes, removes and increments.
/// Failures are part of the history, never a reason to stop.
async fn run_client(
    coordinator_address: String,
    recorder: Arc<Recorder>,
    table: TableId,
    client_id: u32,
) {
    let mut choices = Choices::new(CLIENT_SEED_BASE + u64::from(client_id));
    let mut last_seen = [Version(0); KEYS as usize];
    let mut client =
        RecordingClient::new(fresh_client(&coordinator_address), recorder.clone(), client_id);
    for sequence in 0..OPERATIONS_PER_CLIENT {
        if sequence % OPERATIONS_PER_FRESH_CLIENT == OPERATIONS_PER_FRESH_CLIENT - 1 {
            client = RecordingClient::new(
                fresh_client(&coordinator_address),
                recorder.clone(),
                client_id,
            );
        }
        let key_index = choices.below(KEYS) as usize;
        let key = format!("key-{key_index}");
        let value = unique_value(client_id, sequence);
        let seen = mixed_operation(
            &client,
            table,
            key.as_bytes(),
            value,
            last_seen[key_index],
            &mut choices,
        )
        .await;
        if let Some(version) = seen {
            last_seen[key_index] = version;
        }
    }
}

/// Writes a waiting client issues, at most, until one has a known outcome: a master whose
/// lease ran out while the coordinator was down answers RETRY until it has renewed it (a few
/// renewal intervals after the coordinator is back); far more than that takes.
const WAITING_WRITES_MAX: u32 = 100;

/// The pause before a waiting client issues another write.
const WAITING_WRITE_PAUSE: Duration = Duration::from_millis(50);

/// The value of a waiting client's `attempt`-th write of key `key_index`: negative, so no other
/// client writes it, and unique (the impatient clients' values lie in between: -100 - key).
fn waiting_value(key_index: u64, attempt: u32) -> [u8; 8] {
    (-1 - key_index as i64 - 1000 * i64::from(attempt)).to_le_bytes()
}

/// What a client that started while the coordinator was down saw.
struct Waited {
    /// Every one of its calls that must get a known outcome got one.
    known: bool,
    /// Calls it recorded.
    operations: usize,
}

/// Kills the coordinator with SIGKILL, starts recorded operations from fresh clients (empty
/// tablet-map caches, so they need the coordinator) while it is down, then restarts it on the
/// same directory. Returns those operations' tasks: they must get known outcomes once it is
/// back. Impatient clients also write while it is down and give up (unknown outcomes that
/// never took effect, which the checker must accept).
async fn restart_coordinator_with_operations_waiting(
    cluster: &mut TestCluster,
    recorder: &Arc<Recorder>,
    table: TableId,
) -> tokio::task::JoinSet<Waited> {
    cluster.coordinator.signal(libc::SIGKILL);
    let exited = tokio::task::block_in_place(|| {
        cluster.coordinator.wait_exit(Duration::from_secs(10)).is_some()
    });
    assert!(exited, "the coordinator did not exit after SIGKILL");
    let mut waiting = tokio::task::JoinSet::new();
    for key_index in 0..KEYS {
        let client = RecordingClient::new(
            fresh_client(&cluster.coordinator_address),
            recorder.clone(),
            CLIENTS + 1 + key_index as u32,
        );
        waiting.spawn(async move {
            let key = format!("key-{key_index}");
            // The first write waits for the coordinator (its client needs the tablet map). If
            // the masters' leases ran out meanwhile, the master answers RETRY, which for an
            // at-most-once client is an unknown outcome (a write that applied and was not
            // confirmed durable gets RETRY too): recorded so, and a new write with a value of
            // its own goes, until one has a known outcome.
            let mut operations = 0;
            let written = loop {
                let value = waiting_value(key_index, operations);
                let written = client.write(table, key.as_bytes(), &value).await;
                operations += 1;
                let answered_retry = written.as_ref().is_err_and(|e| e.status == Status::Retry);
                if !answered_retry || operations == WAITING_WRITES_MAX {
                    break written;
                }
                tokio::time::sleep(WAITING_WRITE_PAUSE).await;
            };
            let read = client.read(table, key.as_bytes()).await;
            // Known outcomes: other clients may remove the key in between, so the read may
            // find nothing, but neither call may time out.
            let known = |status: Option<Status>| status.is_none_or(Outcome::is_refusal);
            let known = known(written.err().map(|error| error.status))
                && known(read.err().map(|error| error.status));
            // The writes and the read.
            Waited { known, operations: operations as usize + 1 }
        });
    }
    for key_index in 0..KEYS {
        let mut config = at_most_once_config(&cluster.coordinator_address);
        config.operation_timeout = Duration::from_millis(20);
        let client_id = CLIENTS + 1 + (KEYS + key_index) as u32;
        let client = RecordingClient::new(Client::new(config), recorder.clone(), client_id);
        waiting.spawn(async move {
            let key = format!("key-{key_index}");
            let value = (-100 - key_index as i64).to_le_bytes();
            // Whatever happens is part of the history; usually a timeout.
            let _ = client.write(table, key.as_bytes(), &value).await;
            Waited { known: true, operations: 1 }
        });
    }
    // Pacing only (nothing asserts on it): lets the waiting clients reach the dead coordinator.
    tokio::time::sleep(Duration::from_millis(100)).await;
    cluster.coordinator = tokio::task::block_in_place(|| {
        TestCluster::start_coordinator(&cluster.coordinator_address, &cluster.directory)
    });
    waiting
}

/// Runs the workload to the end (bounded), restarting the coordinator once a third of the
/// operations are done if `restart_coordinator`; then reads every key once more and checks the
/// history.
async fn run_and_check(cluster: &mut TestCluster, restart_coordinator: bool) {
    let client = cluster.client();
    let table = client.create_table("history", 2).await.expect("create the table");
    let recorder = Recorder::new();
    let mut tasks = tokio::task::JoinSet::new();
    for client_id in 0..CLIENTS {
        let address = cluster.coordinator_address.clone();
        tasks.spawn(run_client(address, recorder.clone(), table, client_id));
    }
    let total = (CLIENTS * OPERATIONS_PER_CLIENT) as usize;
    // Waits at most 60 s for a third of the operations (fewer if every client is done).
    for _ in 0..6000 {
        if recorder.len() >= total / 3 || tasks.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut waiting = tokio::task::JoinSet::new();
    if restart_coordinator {
        waiting = restart_coordinator_with_operations_waiting(cluster, &recorder, table).await;
    }
    let mut waiting_operations = 0;
    let finished = tokio::time::timeout(WORKLOAD_PATIENCE, async {
        while let Some(joined) = tasks.join_next().await {
            joined.expect("a client task panicked");
        }
        while let Some(joined) = waiting.join_next().await {
            let waited = joined.expect("a waiting client task panicked");
            assert!(
                waited.known,
                "an operation issued while the coordinator was down got no known outcome"
            );
            waiting_operations += waited.operations;
        }
    })
    .await;
    assert!(finished.is_ok(), "the workload did not finish within {WORKLOAD_PATIENCE:?}");
    // The last word on every key, after every write has completed.
    let final_reader =
        RecordingClient::new(fresh_client(&cluster.coordinator_address), recorder.clone(), CLIENTS);
    for key_index in 0..KEYS {
        let _ = final_reader.read(table, format!("key-{key_index}").as_bytes()).await;
    }

    let history = recorder.history();
    assert_eq!(history.len(), total + waiting_operations + KEYS as usize, "every call recorded");
    let report = check(&history, &CheckOptions::default());
    let steps: u64 = report.keys.iter().map(|key| key.steps).sum();
    let count = |predicate: fn(&Outcome) -> bool| {
        history.operations.iter().filter(|operation| predicate(&operation.outcome)).count()
    };
    let acknowledged_writes = count(|outcome| outcome.created_version().is_some());
    let refused = count(|outcome| matches!(outcome, Outcome::Refused { .. }));
    let unknown = count(Outcome::is_unknown);
    eprintln!(
        "checked {} operations on {} keys in {steps} search steps: {acknowledged_writes} \
         acknowledged writes, {refused} refused, {unknown} unknown outcomes, {} concurrent with \
         another operation on the same key",
        report.operations(),
        report.keys.len(),
        concurrent_operations(&history)
    );
    assert_eq!(report.undecided().count(), 0, "every key must be decided:\n{report}");
    assert!(
        report.is_linearizable(),
        "{report}(client i chose its operations from seed {CLIENT_SEED_BASE:#x} + i; the \
         interleaving came from the machine)"
    );
    assert!(acknowledged_writes > 0, "the workload must write something:\n{history}");
    assert_checker_catches_a_corrupted_read(history);
}

/// Operations whose interval overlaps an earlier-invoked operation's on the same key: a
/// measure of how much the run exercised concurrency (reported, not asserted: it depends on
/// scheduling).
fn concurrent_operations(history: &History) -> usize {
    let mut latest_completion: HashMap<&[u8], u64> = HashMap::new();
    let mut concurrent = 0;
    for operation in &history.operations {
        let latest = latest_completion.entry(&operation.key[..]).or_insert(0);
        concurrent += usize::from(operation.invoked < *latest);
        *latest = (*latest).max(operation.completed);
    }
    concurrent
}

/// A canary: the same history with one successful read changed to a value nobody wrote must
/// fail, so a passing run cannot come from a checker that accepts everything.
fn assert_checker_catches_a_corrupted_read(mut history: History) {
    let read = history
        .operations
        .iter_mut()
        .find(|operation| matches!(operation.outcome, Outcome::Read { .. }))
        .expect("the workload reads successfully at least once");
    let Outcome::Read { version, .. } = read.outcome else { unreachable!("matched above") };
    read.outcome = Outcome::Read { value: Bytes::from_static(b"never written"), version };
    let corrupted_key = read.key.clone();
    let report = check(&history, &CheckOptions::default());
    let violating: Vec<&Bytes> = report.violations().map(|key| &key.key).collect();
    assert_eq!(violating, vec![&corrupted_key], "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_on_two_masters_are_linearizable() {
    let mut cluster = start_cluster();
    run_and_check(&mut cluster, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn history_stays_linearizable_across_a_coordinator_sigkill_and_restart() {
    let mut cluster = start_cluster();
    run_and_check(&mut cluster, true).await;
}
