//! The list-append part of `stratus workload`: multi-object transactions under the faults the
//! harness injects, checked for every anomaly strict serializability forbids by
//! stratus-history's Elle-style checker ([`stratus_history::list_append`]).
//!
//! A table of `--list-append-keys` lists; each list is one object whose value is its u64
//! elements, 8 bytes little-endian each (an absent object is the empty list). Clients run
//! transactions that read 1–3 lists and append a unique element to 1–2 lists (an append is a
//! transactional read of the list and a write of the list extended; every list a transaction
//! touches is read in one `read_many`), and one transaction in five only reads 2–4 lists (the
//! read-only commit path). Every transaction is recorded with invocation and completion stamps
//! of one counter shared by every client, its operations (what each read returned, for a
//! committed transaction) and its outcome: committed; aborted (the commit said so, or a read
//! failed before any commit was sent: never applied); or unknown (the commit failed or timed
//! out: applied once or never).
//!
//! After the run (and the bank's final check) every list is read in one read-only transaction,
//! retried until `--settle-seconds` runs out, and added to the history; the whole history must
//! show no anomaly (no incompatible orders, aborted or intermediate reads, lost updates, stale
//! reads or lost appends, and no G0, G1c, G-single, G2 or real-time cycle).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stratus_client::{Client, TableId, TxOutcome};
use stratus_history::list_append::{
    check_list_append, decode_list, encode_list, CheckLimits, HistoryError, ListAppendHistory,
    ListAppendReport, MicroOp, Transaction, TransactionOutcome,
};

/// Pause between two transactions of one client (keeps the history, hence the check, small
/// and leaves read-only transactions a chance against the appends).
const TRANSACTION_PAUSE: Duration = Duration::from_millis(5);

/// Transactions recorded at most in one run: each read keeps the whole list it saw, so the
/// history grows faster than linearly with the run; past this the clients stop (the rest of
/// the workload goes on), and the check stays within seconds.
const HISTORY_TRANSACTIONS_MAX: usize = 100_000;

/// Backoff after a transaction whose outcome is unknown (the cluster may be recovering).
const FAULT_BACKOFF: Duration = Duration::from_millis(100);

/// The key of list `index`.
pub fn list_key(index: u64) -> Vec<u8> {
    format!("list-{index:04}").into_bytes()
}

/// The element client `client` appends in slot `slot` of its transaction `sequence`: unique
/// across the run (slots are below 2).
fn element(client: u32, sequence: u64, slot: u64) -> u64 {
    ((u64::from(client) + 1) << 40) | ((sequence * 2 + slot) & 0xFF_FFFF_FFFF)
}

/// What the list-append clients share: the clock and the history.
#[derive(Debug, Default)]
pub struct ListAppendState {
    /// Invocations and completions: one counter for every client, so its order is the order
    /// in which things happened.
    clock: AtomicU64,
    history: Mutex<ListAppendHistory>,
    /// What a client saw that no correct run shows (a list that does not decode).
    violations: Mutex<Vec<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl ListAppendState {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::AcqRel)
    }

    /// Records `transaction`; false once the history is full (the client stops).
    fn record(&self, transaction: Transaction) -> bool {
        let mut history = lock(&self.history);
        history.push(transaction);
        history.transactions.len() < HISTORY_TRANSACTIONS_MAX
    }
}

/// One planned transaction: the lists it reads, and the (list, element) appends.
#[derive(Clone, Debug, Default)]
struct Plan {
    reads: Vec<u64>,
    appends: Vec<(u64, u64)>,
}

impl Plan {
    /// Every list the transaction reads (its appends' lists included), each once.
    fn touched(&self) -> Vec<u64> {
        let mut keys = self.reads.clone();
        for &(key, _) in &self.appends {
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// The operations of a transaction that did not commit: its appends, and reads with no
    /// observation (nothing it read is trusted).
    fn unobserved(&self) -> Vec<MicroOp> {
        let reads = self.touched().into_iter().map(|key| MicroOp::Read { key, observed: None });
        let appends = self.appends.iter().map(|&(key, element)| MicroOp::Append { key, element });
        reads.chain(appends).collect()
    }
}

/// A small xorshift64 stream: the seed decides the choices.
struct Choices(u64);

impl Choices {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }

    /// `count` distinct lists below `keys`, in a random order.
    fn distinct(&mut self, keys: u64, count: u64) -> Vec<u64> {
        let mut chosen = Vec::new();
        while (chosen.len() as u64) < count.min(keys) {
            let key = self.below(keys);
            if !chosen.contains(&key) {
                chosen.push(key);
            }
        }
        chosen
    }
}

/// A transaction's plan: one in five reads 2–4 lists only; the others read 1–3 lists and
/// append to 1–2.
fn plan_transaction(choices: &mut Choices, keys: u64, client: u32, sequence: u64) -> Plan {
    if choices.below(5) == 0 {
        let count = 2 + choices.below(3);
        return Plan { reads: choices.distinct(keys, count), appends: Vec::new() };
    }
    let reads = 1 + choices.below(3);
    let appends = 1 + choices.below(2);
    let reads = choices.distinct(keys, reads);
    let appends = (choices.distinct(keys, appends).into_iter().enumerate())
        .map(|(slot, key)| (key, element(client, sequence, slot as u64)))
        .collect();
    Plan { reads, appends }
}

/// Reads every list of `keys` in `tx` with one `read_many`.
async fn read_lists(
    tx: &stratus_client::Transaction,
    table: TableId,
    keys: &[u64],
    state: &ListAppendState,
) -> Result<Vec<Vec<u64>>, String> {
    let names: Vec<Vec<u8>> = keys.iter().map(|&key| list_key(key)).collect();
    let objects: Vec<(TableId, &[u8])> = names.iter().map(|name| (table, &name[..])).collect();
    let values = tx.read_many(&objects).await.map_err(|error| error.to_string())?;
    let mut lists = Vec::with_capacity(keys.len());
    for (&key, value) in keys.iter().zip(values) {
        let list = match value {
            None => Vec::new(),
            Some(value) => decode_list(&value).ok_or_else(|| {
                let what = format!("a transaction read list {key} as {} bytes", value.len());
                lock(&state.violations).push(what.clone());
                what
            })?,
        };
        lists.push(list);
    }
    Ok(lists)
}

/// Runs one transaction: its outcome and operations (observed if committed).
async fn execute(
    client: &Client,
    table: TableId,
    plan: &Plan,
    state: &ListAppendState,
) -> (TransactionOutcome, Vec<MicroOp>) {
    let tx = client.transaction();
    let keys = plan.touched();
    let lists = match read_lists(&tx, table, &keys, state).await {
        Ok(lists) => lists,
        // Dropped without a commit: nothing was sent, nothing is applied.
        Err(_) => return (TransactionOutcome::Aborted, plan.unobserved()),
    };
    let mut ops: Vec<MicroOp> = (keys.iter().zip(&lists))
        .map(|(&key, list)| MicroOp::Read { key, observed: Some(list.clone()) })
        .collect();
    for &(key, element) in &plan.appends {
        let position = keys.iter().position(|&touched| touched == key).unwrap_or_default();
        let mut list = lists[position].clone();
        list.push(element);
        if tx.write(table, &list_key(key), &encode_list(&list)).is_err() {
            return (TransactionOutcome::Aborted, plan.unobserved());
        }
        ops.push(MicroOp::Append { key, element });
    }
    match tx.commit().await {
        Ok(TxOutcome::Committed) => (TransactionOutcome::Committed, ops),
        Ok(TxOutcome::Aborted(_)) => (TransactionOutcome::Aborted, plan.unobserved()),
        // The commit was sent and its outcome not learnt.
        Err(_) => (TransactionOutcome::Unknown, plan.unobserved()),
    }
}

/// A list-append client until `stop`.
pub async fn run_list_append_client(
    client: Client,
    table: TableId,
    keys: u32,
    index: u32,
    seed: u64,
    state: Arc<ListAppendState>,
    stop: Arc<AtomicBool>,
) {
    let mut choices = Choices(seed | 1);
    let mut sequence = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let plan = plan_transaction(&mut choices, u64::from(keys), index, sequence);
        sequence += 1;
        let invoked_at = state.tick();
        let (outcome, ops) = execute(&client, table, &plan, &state).await;
        let completed_at = state.tick();
        let room_left = state.record(Transaction {
            process: u64::from(index),
            invoked_at,
            completed_at: (outcome != TransactionOutcome::Unknown).then_some(completed_at),
            outcome,
            ops,
        });
        if !room_left {
            tracing::warn!(
                "list-append client {index} stops: the history holds \
                 {HISTORY_TRANSACTIONS_MAX} transactions"
            );
            return;
        }
        if outcome == TransactionOutcome::Unknown {
            tokio::time::sleep(FAULT_BACKOFF).await;
        }
        tokio::time::sleep(TRANSACTION_PAUSE).await;
    }
}

/// Reads every list in one read-only transaction, retried until it commits or `deadline`
/// passes, and records it (process `process`, after the clients'). `Err` says why no final
/// read committed.
pub async fn final_read(
    client: &Client,
    table: TableId,
    keys: u32,
    process: u32,
    state: &ListAppendState,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    let plan = Plan { reads: (0..u64::from(keys)).collect(), appends: Vec::new() };
    loop {
        let invoked_at = state.tick();
        let (outcome, ops) = execute(client, table, &plan, state).await;
        let completed_at = state.tick();
        if outcome == TransactionOutcome::Committed {
            state.record(Transaction {
                process: u64::from(process),
                invoked_at,
                completed_at: Some(completed_at),
                outcome,
                ops,
            });
            return Ok(());
        }
        // A read-only transaction that did not commit changed nothing: left out.
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "the final read-only transaction of every list did not commit within \
                 --settle-seconds ({outcome:?})"
            ));
        }
        tokio::time::sleep(FAULT_BACKOFF).await;
    }
}

/// What the list-append workload did and what the checker found.
#[derive(Debug)]
pub struct ListAppendFindings {
    /// Transactions committed, aborted, and of unknown outcome (the final read included).
    pub committed: u64,
    pub aborted: u64,
    pub unknown: u64,
    /// Committed transactions that appended.
    pub committed_appends: u64,
    /// The checker's report, or why the history could not be checked.
    pub report: Result<ListAppendReport, HistoryError>,
    /// Lists that did not decode.
    pub violations: Vec<String>,
}

impl ListAppendFindings {
    /// Anomalies found (every instance counted), plus lists that did not decode.
    pub fn anomalies(&self) -> u64 {
        let found = match &self.report {
            Ok(report) => report.counts.values().sum(),
            Err(_) => 0,
        };
        found + self.violations.len() as u64
    }

    /// Committed reads the checker checked.
    pub fn reads_checked(&self) -> usize {
        self.report.as_ref().map_or(0, |report| report.committed_reads_checked)
    }
}

/// Checks the history.
pub fn check(state: &ListAppendState) -> ListAppendFindings {
    let history = lock(&state.history).clone();
    let (mut committed, mut aborted, mut unknown, mut committed_appends) = (0, 0, 0, 0);
    for transaction in &history.transactions {
        match transaction.outcome {
            TransactionOutcome::Committed => {
                committed += 1;
                if transaction.ops.iter().any(|op| matches!(op, MicroOp::Append { .. })) {
                    committed_appends += 1;
                }
            }
            TransactionOutcome::Aborted => aborted += 1,
            TransactionOutcome::Unknown => unknown += 1,
        }
    }
    let report = check_list_append(&history, &CheckLimits::default());
    ListAppendFindings {
        committed,
        aborted,
        unknown,
        committed_appends,
        report,
        violations: lock(&state.violations).clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_unique_and_plans_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for client in 0..3 {
            let mut choices = Choices(u64::from(client) * 77 + 1);
            for sequence in 0..5_000 {
                let plan = plan_transaction(&mut choices, 8, client, sequence);
                assert!(plan.appends.len() <= 2 && !plan.reads.is_empty());
                assert!(plan.reads.len() <= 4 && plan.touched().len() <= 5);
                for (key, element) in plan.appends {
                    assert!(key < 8);
                    assert!(seen.insert(element), "{element} appended twice");
                }
            }
        }
    }

    #[test]
    fn a_committed_read_of_an_aborted_append_is_an_anomaly() {
        let state = ListAppendState::default();
        state.record(Transaction {
            process: 0,
            invoked_at: 0,
            completed_at: Some(1),
            outcome: TransactionOutcome::Aborted,
            ops: vec![MicroOp::Append { key: 0, element: 5 }],
        });
        state.record(Transaction {
            process: 1,
            invoked_at: 2,
            completed_at: Some(3),
            outcome: TransactionOutcome::Committed,
            ops: vec![MicroOp::Read { key: 0, observed: Some(vec![5]) }],
        });
        let findings = check(&state);
        assert_eq!((findings.committed, findings.aborted), (1, 1));
        assert!(findings.anomalies() > 0, "{:?}", findings.report);
    }
}
