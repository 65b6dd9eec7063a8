//! The list-append workload (docs/design/simulation.md, "List-append"): multi-object
//! transactions under the simulation's faults, checked for every anomaly strict
//! serializability forbids by stratus-history's Elle-style checker
//! ([`stratus_history::list_append`]).
//!
//! A table `lists` of [`ListAppendOptions::keys`] keys, its tablets spread over every master;
//! each key holds a list of u64 elements, stored as one object (the elements, 8 bytes little
//! endian each; an absent object is the empty list). Clients run transactions that read
//! 1–3 keys and append a unique element to 1–2 keys, in a random order (an append is a
//! transactional read of the list and a write of the list extended, so a transaction that
//! reads a key after appending to it sees its own append), and one transaction in five
//! reads 2–4 keys only. Each commits explicitly or through `run_transaction`.
//!
//! Every transaction is recorded with its invocation and completion (stamps of one counter
//! that the simulation's single thread advances, so they order events as they happened), its
//! operations (a read's list, for a committed transaction) and its outcome: committed;
//! aborted (a conflict, a refusal, a read that failed before any commit: never applied); or
//! unknown (the commit timed out: applied once or never). After the faults the verifier
//! reads every list, one by one with plain reads and then all in one read-only transaction,
//! and the whole history must show no anomaly: no incompatible orders, aborted or
//! intermediate reads, lost updates, stale reads or lost appends, and no G0, G1c, G-single,
//! G2 or real-time cycle. No lock may be left behind (the final reads succeed, and every live
//! master's prepared operations drop to 0), and some transaction must have committed an
//! append.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use stratus_client::{Client, Status, TableId, TransactionError, TxOutcome};
use stratus_history::list_append::{
    check_list_append, decode_list, encode_list, CheckLimits, ListAppendHistory, ListAppendReport,
    MicroOp, Transaction, TransactionOutcome,
};

use crate::nodes::{self, ServingObservations};
use crate::schedule::{self, Choices};
use crate::{client_config, network, SimulationOptions, Workload};

/// The list-append workload's shape ([`SimulationOptions::list_append`]).
#[derive(Clone, Debug)]
pub struct ListAppendOptions {
    /// Lists in the table.
    pub keys: u64,
    /// Clients running transactions, one at a time each.
    pub clients: u32,
    /// A client waits up to this long between transactions.
    pub think_time_max: Duration,
    /// The clients' operation timeout (a commit's PREPARE and its decision each get one):
    /// shorter, more commits end with an unknown outcome.
    pub operation_timeout: Duration,
}

impl Default for ListAppendOptions {
    fn default() -> ListAppendOptions {
        ListAppendOptions {
            keys: 8,
            clients: 3,
            think_time_max: Duration::from_millis(60),
            operation_timeout: Duration::from_secs(8),
        }
    }
}

/// The table's name for the coordinator.
pub const TABLE: &str = "lists";

/// Most transactions one client runs (it stops earlier, once the faults are over and the
/// main workload's clients are done).
const TRANSACTIONS_PER_CLIENT_MAX: u32 = 2_000;

/// The key of list `index`.
pub fn list_key(index: u64) -> Bytes {
    Bytes::from(format!("list-{index}"))
}

/// The element client `client` appends in slot `slot` of its transaction `sequence`: unique
/// across the run (slots are below 2, sequences below [`TRANSACTIONS_PER_CLIENT_MAX`]).
fn element(client: u32, sequence: u32, slot: u64) -> u64 {
    (u64::from(client) + 1) * 1_000_000 + u64::from(sequence) * 2 + slot
}

/// What the workload's clients share with the harness.
#[derive(Debug, Default)]
pub(crate) struct ListAppendState {
    table: Mutex<Option<TableId>>,
    /// The clock of invocations and completions: one counter, advanced by the simulation's
    /// one thread, so its order is the order in which things happened.
    clock: AtomicU64,
    clients_done: AtomicU32,
    history: Mutex<ListAppendHistory>,
    /// Per transaction, as recorded: the client, its sequence, the shape, the simulated
    /// interval (the history itself has only the clock's stamps).
    log: Mutex<Vec<String>>,
    /// The final reads were made.
    finals_read: AtomicBool,
    /// What a client saw that no correct run shows (a list that does not decode).
    violations: Mutex<Vec<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl ListAppendState {
    /// Whether every client is done.
    pub(crate) fn done(&self, options: &ListAppendOptions) -> bool {
        self.clients_done.load(Ordering::Acquire) >= options.clients
    }

    /// Every transaction, one per line (two runs of a seed must agree).
    pub(crate) fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::AcqRel)
    }

    fn violation(&self, what: String) {
        lock(&self.violations).push(what);
    }

    fn record(&self, transaction: Transaction, what: String) {
        let mut history = lock(&self.history);
        lock(&self.log).push(format!("T{} {what} {transaction:?}", history.transactions.len()));
        history.push(transaction);
    }
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The table: created (span: every master) by whichever client gets there first.
async fn table_id(client: &Client, span: u32, state: &ListAppendState) -> Result<TableId, String> {
    for _ in 0..400 {
        let table = match client.create_table(TABLE, span).await {
            Ok(table) => Some(table),
            Err(_) => client.get_table_id(TABLE).await.ok(),
        };
        if let Some(table) = table {
            *lock(&state.table) = Some(table);
            return Ok(table);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("list-append: no table".to_string())
}

/// One planned operation: a read of a list, or an append of an element to it.
#[derive(Clone, Copy, Debug)]
enum Planned {
    Read(u64),
    Append(u64, u64),
}

/// How a transaction is committed.
#[derive(Clone, Copy, Debug)]
enum Commit {
    /// Its operations, then `commit`.
    Explicit,
    /// Through `run_transaction` (retried on conflicts).
    RunTransaction,
}

/// The list at `key` as the transaction sees it.
async fn read_list(
    tx: &stratus_client::Transaction,
    table: TableId,
    key: u64,
    state: &ListAppendState,
) -> stratus_client::Result<Vec<u64>> {
    let value = tx.read(table, &list_key(key)).await?;
    let Some(value) = value else { return Ok(Vec::new()) };
    decode_list(&value).ok_or_else(|| {
        state.violation(format!("a transaction read list {key} as {} bytes", value.len()));
        stratus_client::Error::new(Status::InvalidObject, "not a list")
    })
}

/// Runs the planned operations in `tx`: what each read returned and each append.
async fn run_operations(
    tx: &stratus_client::Transaction,
    table: TableId,
    plan: &[Planned],
    state: &ListAppendState,
) -> stratus_client::Result<Vec<MicroOp>> {
    let mut ops = Vec::with_capacity(plan.len() * 2);
    for &planned in plan {
        match planned {
            Planned::Read(key) => {
                let list = read_list(tx, table, key, state).await?;
                ops.push(MicroOp::Read { key, observed: Some(list) });
            }
            Planned::Append(key, element) => {
                // A read, then a write of the list extended: the read is an observation too.
                let mut list = read_list(tx, table, key, state).await?;
                ops.push(MicroOp::Read { key, observed: Some(list.clone()) });
                list.push(element);
                tx.write(table, &list_key(key), &encode_list(&list))?;
                ops.push(MicroOp::Append { key, element });
            }
        }
    }
    Ok(ops)
}

/// The operations of a transaction that did not commit: its appends, and reads with no
/// observation (nothing it read is trusted).
fn unobserved(plan: &[Planned]) -> Vec<MicroOp> {
    plan.iter()
        .flat_map(|&planned| match planned {
            Planned::Read(key) => vec![MicroOp::Read { key, observed: None }],
            Planned::Append(key, element) => {
                vec![MicroOp::Read { key, observed: None }, MicroOp::Append { key, element }]
            }
        })
        .collect()
}

/// Runs one transaction; its outcome and operations (observed if committed), and what
/// happened in words.
async fn execute(
    client: &Client,
    table: TableId,
    plan: &[Planned],
    commit: Commit,
    state: &ListAppendState,
) -> (TransactionOutcome, Vec<MicroOp>, String) {
    match commit {
        Commit::Explicit => {
            let tx = client.transaction();
            let ops = match run_operations(&tx, table, plan, state).await {
                Ok(ops) => ops,
                // Dropped without a commit: nothing was sent, nothing is applied.
                Err(error) => {
                    return (TransactionOutcome::Aborted, unobserved(plan), format!("{error}"))
                }
            };
            match tx.commit().await {
                Ok(TxOutcome::Committed) => (TransactionOutcome::Committed, ops, String::new()),
                Ok(TxOutcome::Aborted(reason)) => {
                    (TransactionOutcome::Aborted, unobserved(plan), format!("aborted: {reason}"))
                }
                // The commit's outcome could not be learnt.
                Err(error) if error.status == Status::Timeout => {
                    (TransactionOutcome::Unknown, unobserved(plan), format!("{error}"))
                }
                // Did not commit, and never will.
                Err(error) => {
                    (TransactionOutcome::Aborted, unobserved(plan), format!("refused: {error}"))
                }
            }
        }
        Commit::RunTransaction => {
            // Whether the last attempt's operations all ran, so that its commit was sent: a
            // TIMEOUT before that is a read that failed, and nothing was committed.
            let committing = Arc::new(AtomicBool::new(false));
            let ran = client
                .run_transaction(|tx| {
                    let committing = committing.clone();
                    async move {
                        committing.store(false, Ordering::Release);
                        let ops = run_operations(&tx, table, plan, state).await?;
                        committing.store(true, Ordering::Release);
                        Ok(ops)
                    }
                })
                .await;
            match ran {
                Ok(ops) => (TransactionOutcome::Committed, ops, String::new()),
                Err(TransactionError::Aborted(reason)) => {
                    (TransactionOutcome::Aborted, unobserved(plan), format!("aborted: {reason}"))
                }
                Err(TransactionError::Failed(error))
                    if error.status == Status::Timeout && committing.load(Ordering::Acquire) =>
                {
                    (TransactionOutcome::Unknown, unobserved(plan), format!("{error}"))
                }
                Err(TransactionError::Failed(error)) => {
                    (TransactionOutcome::Aborted, unobserved(plan), format!("failed: {error}"))
                }
            }
        }
    }
}

/// `count` distinct keys below `keys`, in a random order.
fn distinct_keys(choices: &mut Choices, keys: u64, count: u64) -> Vec<u64> {
    let mut chosen = Vec::new();
    while (chosen.len() as u64) < count.min(keys) {
        let key = choices.below(keys);
        if !chosen.contains(&key) {
            chosen.push(key);
        }
    }
    chosen
}

/// A transaction's plan: one in five reads 2–4 keys only; the others read 1–3 keys and
/// append to 1–2, the operations shuffled.
fn plan_transaction(choices: &mut Choices, keys: u64, client: u32, sequence: u32) -> Vec<Planned> {
    if schedule::percent(choices, 20) {
        let count = 2 + choices.below(3);
        return distinct_keys(choices, keys, count).into_iter().map(Planned::Read).collect();
    }
    let reads = 1 + choices.below(3);
    let appends = 1 + choices.below(2);
    let mut plan: Vec<Planned> =
        distinct_keys(choices, keys, reads).into_iter().map(Planned::Read).collect();
    for (slot, key) in distinct_keys(choices, keys, appends).into_iter().enumerate() {
        plan.push(Planned::Append(key, element(client, sequence, slot as u64)));
    }
    // Fisher–Yates, from the seed.
    for index in (1..plan.len()).rev() {
        plan.swap(index, choices.below(index as u64 + 1) as usize);
    }
    plan
}

/// A client: runs transactions until the faults are over and the main workload's clients
/// are done.
pub(crate) async fn run_client(
    seed: u64,
    index: u32,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let lists = options.list_append.clone().ok_or("no list-append options")?;
    let state = &workload.lists;
    let name = format!("list-client-{index}");
    let mut config = client_config();
    config.operation_timeout = lists.operation_timeout;
    let client = Client::with_environment(config, network::client_environment(seed, &name, 0));
    let table = table_id(&client, options.servers as u32, state).await?;
    let mut choices = Choices::new(seed ^ 0x115A_0000 ^ u64::from(index));
    for sequence in 0..TRANSACTIONS_PER_CLIENT_MAX {
        if workload.faults_over.load(Ordering::Acquire)
            && workload.clients_done.load(Ordering::Acquire) >= options.clients
        {
            break;
        }
        let plan = plan_transaction(&mut choices, lists.keys, index, sequence);
        let commit = if choices.below(2) == 0 { Commit::Explicit } else { Commit::RunTransaction };
        let (began, invoked_at) = (now(), state.tick());
        let (outcome, ops, why) = execute(&client, table, &plan, commit, state).await;
        let (ended, completed_at) = (now(), state.tick());
        state.record(
            Transaction {
                process: u64::from(index),
                invoked_at,
                completed_at: (outcome != TransactionOutcome::Unknown).then_some(completed_at),
                outcome,
                ops,
            },
            format!(
                "client {index} #{sequence} {commit:?} {} to {} ms {why}",
                began.as_millis(),
                ended.as_millis()
            ),
        );
        tokio::time::sleep(Duration::from_millis(
            choices.below(lists.think_time_max.as_millis() as u64 + 1),
        ))
        .await;
    }
    state.clients_done.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The verifier's part, once the faults are over and the clients done: every list read
/// with a plain read (a locked one answers RETRY until the client's timeout, 30 s), then all
/// of them in one read-only transaction, each recorded as a committed transaction; and no
/// live master left holding a prepared operation.
pub(crate) async fn verify_lists(
    client: &Client,
    lists: &ListAppendOptions,
    state: &ListAppendState,
    observations: &Mutex<ServingObservations>,
    live_sample_age_max: Duration,
) -> Result<(), String> {
    let Some(table) = *lock(&state.table) else {
        return Err("list-append: no client found the table".to_string());
    };
    // The verifier's process id: after the clients'.
    let process = u64::from(lists.clients);
    for key in 0..lists.keys {
        let invoked_at = state.tick();
        let list = match client.read(table, &list_key(key)).await {
            Ok((value, _)) => decode_list(&value)
                .ok_or_else(|| format!("list-append: list {key} holds {} bytes", value.len()))?,
            Err(error) if error.status == Status::ObjectDoesntExist => Vec::new(),
            Err(error) => {
                return Err(format!(
                    "list-append: list {key} is unreadable after the faults stopped (a lock \
                     left behind?): {error}"
                ))
            }
        };
        let completed_at = state.tick();
        state.record(
            Transaction {
                process,
                invoked_at,
                completed_at: Some(completed_at),
                outcome: TransactionOutcome::Committed,
                ops: vec![MicroOp::Read { key, observed: Some(list) }],
            },
            format!("final read at {} ms", now().as_millis()),
        );
    }
    let plan: Vec<Planned> = (0..lists.keys).map(Planned::Read).collect();
    let invoked_at = state.tick();
    let (outcome, ops, why) = execute(client, table, &plan, Commit::RunTransaction, state).await;
    let completed_at = state.tick();
    if outcome != TransactionOutcome::Committed {
        return Err(format!(
            "list-append: the final read-only transaction of every list did not commit after \
             the faults stopped: {outcome:?} {why}"
        ));
    }
    state.record(
        Transaction { process, invoked_at, completed_at: Some(completed_at), outcome, ops },
        format!("final read-only transaction at {} ms", now().as_millis()),
    );
    state.finals_read.store(true, Ordering::Release);
    crate::bank::no_prepared_operations_left(observations, live_sample_age_max, "list-append").await
}

/// What the list-append workload did in one run, and its history.
#[derive(Clone, Debug, Default)]
pub struct ListAppendSummary {
    /// Transactions committed, aborted, and of unknown outcome (final reads included).
    pub transactions: (u64, u64, u64),
    /// Committed transactions that appended, and committed appends.
    pub committed_appends: (u64, u64),
    /// What the checker found (no anomaly, in a run that passed).
    pub report: ListAppendReport,
    /// The whole history (for tests that check the checker on it).
    pub history: ListAppendHistory,
}

/// Checks the run's history (see the module documentation): what the workload did, and
/// whether the run keeps the workload's invariants (the reason when not).
pub(crate) fn check(state: &ListAppendState) -> (ListAppendSummary, Result<(), String>) {
    let history = lock(&state.history).clone();
    let mut summary = ListAppendSummary::default();
    for transaction in &history.transactions {
        match transaction.outcome {
            TransactionOutcome::Committed => {
                summary.transactions.0 += 1;
                let appends = transaction
                    .ops
                    .iter()
                    .filter(|op| matches!(op, MicroOp::Append { .. }))
                    .count() as u64;
                if appends > 0 {
                    summary.committed_appends.0 += 1;
                    summary.committed_appends.1 += appends;
                }
            }
            TransactionOutcome::Aborted => summary.transactions.1 += 1,
            TransactionOutcome::Unknown => summary.transactions.2 += 1,
        }
    }
    let report = check_list_append(&history, &CheckLimits::default());
    summary.history = history;
    if let Some(violation) = lock(&state.violations).first() {
        return (summary, Err(format!("list-append: {violation}")));
    }
    if !state.finals_read.load(Ordering::Acquire) {
        return (summary, Err("list-append: the verifier made no final reads".to_string()));
    }
    if summary.committed_appends.0 == 0 {
        let reason = format!(
            "list-append: no transaction committed an append ({} aborted, {} unknown): the \
             workload did not run",
            summary.transactions.1, summary.transactions.2
        );
        return (summary, Err(reason));
    }
    let report = match report {
        Ok(report) => report,
        Err(error) => {
            return (summary, Err(format!("list-append: the history is malformed: {error}")))
        }
    };
    summary.report = report.clone();
    if report.is_valid() {
        return (summary, Ok(()));
    }
    let mut reason = format!("list-append: the history is not strictly serializable: {report}");
    // The transactions of the examples, whole, on request (their lists can be long).
    if std::env::var_os("STRATUS_SIM_VERBOSE").is_some() {
        let involved: std::collections::BTreeSet<usize> = report
            .anomalies
            .iter()
            .flat_map(|anomaly| anomaly.transactions.iter().copied())
            .collect();
        let log = lock(&state.log);
        reason.push_str("\nthe transactions involved:");
        for line in involved.into_iter().filter_map(|index| log.get(index)) {
            reason.push_str(&format!("\n  {line}"));
        }
    }
    (summary, Err(reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_unique_and_plans_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        let mut choices = Choices::new(5);
        for client in 0..3 {
            for sequence in 0..TRANSACTIONS_PER_CLIENT_MAX {
                let plan = plan_transaction(&mut choices, 8, client, sequence);
                let appends: Vec<u64> = plan
                    .iter()
                    .filter_map(|planned| match planned {
                        Planned::Append(_, element) => Some(*element),
                        Planned::Read(_) => None,
                    })
                    .collect();
                assert!(appends.len() <= 2 && plan.len() <= 5 && !plan.is_empty());
                for element in appends {
                    assert!(seen.insert(element), "{element} appended twice");
                }
            }
        }
    }
}
