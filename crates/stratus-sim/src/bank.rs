//! The bank workload (docs/design/simulation.md, "Bank"): multi-object transactions
//! (docs/design/transactions.md) under the simulation's faults.
//!
//! A table `bank` of [`BankOptions::accounts`] accounts, its tablets spread over every master,
//! each account opened with [`BankOptions::opening_balance`]. Transfer clients move random
//! amounts between random pairs of accounts, each transfer one transaction, in one of three
//! shapes: read both and write both with an explicit `commit` (declining when the source
//! holds less than the amount), `run_transaction` with two increments, or `run_transaction`
//! reading and writing the source and incrementing the destination. Auditors sum every
//! account in read-only transactions (reading one account after another or all at once, and
//! committing explicitly or through `run_transaction`).
//!
//! Every transfer and every committed audit is logged with its interval of simulated time
//! and its outcome: committed, not applied (aborted, declined, refused, its reads failed), or
//! unknown (the commit's outcome could not be learnt: `Err(Timeout)`). After the run:
//! - every committed audit sums to the opening total;
//! - every committed audit saw a state some set of transfers explains: all the transfers
//!   that committed before it began, none that began after it ended, a prefix of each
//!   client's committed ones that overlapped it (a client's transfers are sequential), and
//!   any of the unknown ones that began before it ended (strict serializability of read-only
//!   transactions against transfers, which conserve money and so pass the sum check even
//!   when a snapshot is stale);
//! - the final balances, read with plain reads by the verifier once the faults are over,
//!   sum to the total, and equal the opening balances moved by every committed transfer and
//!   some subset of the unknown ones (each committed transfer applied exactly once, no
//!   aborted one applied, no lost update);
//! - every account is readable at the end (a final read of a locked account answers RETRY
//!   until its 30 s timeout), and no live master holds a prepared operation;
//! - at least one transfer committed.
//!
//! The searches for an explaining set are bounded ([`SEARCH_NODES_MAX`]); an audit whose
//! search gives up is counted as unchecked (its sum is still checked).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use stratus_client::{Client, Status, TableId, TransactionError, TxOutcome};

use crate::nodes::{self, ServingObservations};
use crate::schedule::Choices;
use crate::{client_config, network, SimulationOptions, Workload};

/// The bank workload's shape ([`SimulationOptions::bank`]).
#[derive(Clone, Debug)]
pub struct BankOptions {
    /// Accounts in the bank table.
    pub accounts: u64,
    /// Each account's balance when opened.
    pub opening_balance: i64,
    /// Clients moving money, one transfer at a time each.
    pub transfer_clients: u32,
    /// Clients summing every account in read-only transactions.
    pub auditors: u32,
    /// A transfer client waits up to this long between transfers (an auditor a quarter of
    /// it between audits).
    pub think_time_max: Duration,
    /// The bank clients' operation timeout (a commit's PREPARE and its decision each get
    /// one): shorter than the main clients' 8 s, more commits end with an unknown outcome.
    pub operation_timeout: Duration,
    /// NOT YET SUPPORTED, keep false. A client crashing in the middle of a commit leaves its
    /// prepared objects locked until the participant-side recovery manager (TX_REQUEST_ABORT,
    /// TX_PARTICIPANTS; docs/design/transactions.md, "The client dies mid-commit") finishes
    /// its transaction, and that manager is not built yet: the final reads would find the
    /// locks. This is the place for the fault once it is: a transfer client run as a turmoil
    /// host (clients cannot be crashed), crashed by the harness while a commit of it is in
    /// flight, its transfer logged unknown, and the no-lock-left check given the recovery's
    /// bound. `run` refuses the option until then.
    pub crash_a_client_mid_commit: bool,
}

impl Default for BankOptions {
    fn default() -> BankOptions {
        BankOptions {
            accounts: 16,
            opening_balance: 1_000,
            transfer_clients: 3,
            auditors: 2,
            think_time_max: Duration::from_millis(80),
            operation_timeout: Duration::from_secs(8),
            crash_a_client_mid_commit: false,
        }
    }
}

impl BankOptions {
    /// The total every audit and the final balances must sum to.
    pub fn total(&self) -> i64 {
        self.opening_balance * self.accounts as i64
    }
}

/// The bank's name for the coordinator.
const TABLE: &str = "bank";

/// Most transfers one client makes (it stops earlier, once the faults are over and the
/// other clients are done).
const TRANSFERS_PER_CLIENT_MAX: u32 = 2_000;

/// Nodes the search for an explaining set of transfers may visit, per audit or final state.
const SEARCH_NODES_MAX: u64 = 2_000_000;

/// How long the verifier waits for every live master's sampled prepared operations to be 0.
const PREPARED_PATIENCE: Duration = Duration::from_secs(2);

/// The key of account `index`.
pub fn account_key(index: u64) -> Bytes {
    Bytes::from(format!("account-{index:02}"))
}

/// How one transfer ended.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Committed: applied exactly once.
    Committed,
    /// Known not applied, ever: aborted, declined (the source held less than the amount),
    /// refused, or its reads failed before any commit.
    NotApplied(String),
    /// The commit's outcome could not be learnt (`Err(Timeout)`): applied once or never.
    Unknown(String),
}

/// One transfer, as its client saw it (the fields only the log shows are read through
/// `Debug`).
#[derive(Clone, Debug)]
#[allow(dead_code)]
struct Transfer {
    client: u32,
    sequence: u32,
    /// 0: read both, write both, commit; 1: run_transaction with two increments; 2:
    /// run_transaction reading and writing the source and incrementing the destination.
    shape: u64,
    from: usize,
    to: usize,
    amount: i64,
    /// Simulated time before the transaction began and after its outcome was returned.
    began: Duration,
    ended: Duration,
    outcome: Outcome,
}

/// One committed audit.
#[derive(Clone, Debug)]
struct Audit {
    auditor: u32,
    began: Duration,
    ended: Duration,
    balances: Vec<i64>,
}

/// What the bank clients share with the harness.
#[derive(Debug, Default)]
pub(crate) struct BankState {
    table: Mutex<Option<TableId>>,
    opened: AtomicBool,
    transfer_clients_done: AtomicU32,
    auditors_done: AtomicU32,
    transfers: Mutex<Vec<Transfer>>,
    audits: Mutex<Vec<Audit>>,
    /// Audits that aborted or failed.
    audits_not_committed: AtomicU32,
    /// Balances the verifier read at the end.
    finals: Mutex<Option<Vec<i64>>>,
    /// What a client saw that no correct run shows (an account absent or not an integer).
    violations: Mutex<Vec<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl BankState {
    fn violation(&self, what: String) {
        lock(&self.violations).push(what);
    }

    /// Whether every transfer client and auditor is done.
    pub(crate) fn done(&self, options: &BankOptions) -> bool {
        self.transfer_clients_done.load(Ordering::Acquire) >= options.transfer_clients
            && self.auditors_done.load(Ordering::Acquire) >= options.auditors
    }

    /// Every transfer and committed audit, one per line (two runs of a seed must agree).
    pub(crate) fn log(&self) -> Vec<String> {
        let mut log: Vec<String> =
            lock(&self.transfers).iter().map(|transfer| format!("{transfer:?}")).collect();
        log.extend(lock(&self.audits).iter().map(|audit| format!("{audit:?}")));
        log.push(format!("finals {:?}", lock(&self.finals)));
        log
    }

    /// The bank's table once opened.
    pub(crate) async fn table_once_opened(&self) -> TableId {
        loop {
            if self.opened.load(Ordering::Acquire) {
                if let Some(table) = *lock(&self.table) {
                    return table;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// An account's balance from its value; `None` for an absent account or another length.
fn balance(value: Option<&[u8]>) -> Option<i64> {
    Some(i64::from_le_bytes(value?.try_into().ok()?))
}

fn bank_client(seed: u64, name: &str, bank: &BankOptions) -> Client {
    let mut config = client_config();
    config.operation_timeout = bank.operation_timeout;
    Client::with_environment(config, network::client_environment(seed, name, 0))
}

/// The bank table: created (span: every master) by the opener, looked up by the others.
async fn create_table(client: &Client, span: u32) -> Result<TableId, String> {
    for _ in 0..400 {
        if let Ok(table) = client.create_table(TABLE, span).await {
            return Ok(table);
        }
        if let Ok(table) = client.get_table_id(TABLE).await {
            return Ok(table);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err("bank: no table".to_string())
}

/// Creates the table and opens every account, with blind writes retried until acknowledged
/// (nothing else writes an account before they are all open, so a repeated write is
/// harmless).
async fn open_accounts(
    client: &Client,
    options: &SimulationOptions,
    bank: &BankOptions,
    state: &BankState,
) -> Result<(), String> {
    let table = create_table(client, options.servers as u32).await?;
    for index in 0..bank.accounts {
        let mut attempts = 0;
        while let Err(error) =
            client.write(table, &account_key(index), &bank.opening_balance.to_le_bytes()).await
        {
            attempts += 1;
            if attempts >= 100 {
                return Err(format!("bank: account {index} could not be opened: {error}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    *lock(&state.table) = Some(table);
    state.opened.store(true, Ordering::Release);
    Ok(())
}

/// The outcome of a commit called directly.
fn commit_outcome(committed: stratus_client::Result<TxOutcome>) -> Outcome {
    match committed {
        Ok(TxOutcome::Committed) => Outcome::Committed,
        Ok(TxOutcome::Aborted(reason)) => Outcome::NotApplied(format!("aborted: {reason}")),
        Err(error) if error.status == Status::Timeout => Outcome::Unknown(error.to_string()),
        Err(error) => Outcome::NotApplied(format!("refused: {error}")),
    }
}

/// The outcome of `run_transaction`: a failure with TIMEOUT may be the commit's unknown
/// outcome (or a read of the body that timed out: counted unknown too, which only weakens
/// the check).
fn run_outcome(ran: Result<(), TransactionError>) -> Outcome {
    match ran {
        Ok(()) => Outcome::Committed,
        Err(TransactionError::Aborted(reason)) => Outcome::NotApplied(format!("aborted: {reason}")),
        Err(TransactionError::Failed(error)) if error.status == Status::Timeout => {
            Outcome::Unknown(error.to_string())
        }
        Err(TransactionError::Failed(error)) => Outcome::NotApplied(format!("failed: {error}")),
    }
}

/// One transfer of `amount` from account `from` to `to`, in shape `shape`.
async fn transfer(
    client: &Client,
    table: TableId,
    (shape, from, to, amount): (u64, usize, usize, i64),
    state: &BankState,
) -> Outcome {
    let (source, destination) = (account_key(from as u64), account_key(to as u64));
    match shape {
        0 => {
            let tx = client.transaction();
            let mut balances = [0; 2];
            for (slot, key) in [&source, &destination].into_iter().enumerate() {
                match tx.read(table, key).await {
                    Ok(value) => match balance(value.as_deref()) {
                        Some(value) => balances[slot] = value,
                        None => {
                            state.violation(format!(
                                "a transfer read {} as {value:?}, not a balance",
                                key.escape_ascii()
                            ));
                            return Outcome::NotApplied("broken account".to_string());
                        }
                    },
                    Err(error) => return Outcome::NotApplied(format!("read: {error}")),
                }
            }
            if balances[0] < amount {
                // Dropped without a commit: nothing was sent, nothing is applied.
                return Outcome::NotApplied("declined: insufficient funds".to_string());
            }
            let writes =
                tx.write(table, &source, &(balances[0] - amount).to_le_bytes()).and_then(|()| {
                    tx.write(table, &destination, &(balances[1] + amount).to_le_bytes())
                });
            if let Err(error) = writes {
                return Outcome::NotApplied(format!("buffer: {error}"));
            }
            commit_outcome(tx.commit().await)
        }
        1 => run_outcome(
            client
                .run_transaction(|tx| {
                    let (source, destination) = (source.clone(), destination.clone());
                    async move {
                        tx.increment(table, &source, -amount).await?;
                        tx.increment(table, &destination, amount).await?;
                        Ok(())
                    }
                })
                .await,
        ),
        _ => run_outcome(
            client
                .run_transaction(|tx| {
                    let (source, destination) = (source.clone(), destination.clone());
                    async move {
                        let value = tx.read(table, &source).await?;
                        // An absent or malformed account: the transfer declines (and the
                        // auditors and the verifier report the account).
                        let Some(held) = balance(value.as_deref()) else { return Ok(()) };
                        tx.write(table, &source, &(held - amount).to_le_bytes())?;
                        tx.increment(table, &destination, amount).await?;
                        Ok(())
                    }
                })
                .await,
        ),
    }
}

/// A transfer client: client 0 opens the bank first; each moves money until the faults are
/// over and the main workload's clients are done.
pub(crate) async fn run_transfers(
    seed: u64,
    index: u32,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let bank = options.bank.clone().ok_or("no bank options")?;
    let state = &workload.bank;
    let client = bank_client(seed, &format!("bank-client-{index}"), &bank);
    if index == 0 {
        open_accounts(&client, &options, &bank, state).await?;
    }
    let table = state.table_once_opened().await;
    let mut choices = Choices::new(seed ^ 0xBA4C_0000 ^ u64::from(index));
    let accounts = bank.accounts;
    for sequence in 0..TRANSFERS_PER_CLIENT_MAX {
        if workload.faults_over.load(Ordering::Acquire)
            && workload.clients_done.load(Ordering::Acquire) >= options.clients
        {
            break;
        }
        let from = choices.below(accounts);
        let to = (from + 1 + choices.below(accounts - 1)) % accounts;
        let amount = 1 + choices.below(100) as i64;
        let shape = choices.below(3);
        let began = now();
        let outcome =
            transfer(&client, table, (shape, from as usize, to as usize, amount), state).await;
        let ended = now();
        lock(&state.transfers).push(Transfer {
            client: index,
            sequence,
            shape,
            from: from as usize,
            to: to as usize,
            amount,
            began,
            ended,
            outcome,
        });
        tokio::time::sleep(Duration::from_millis(
            choices.below(bank.think_time_max.as_millis() as u64 + 1),
        ))
        .await;
    }
    state.transfer_clients_done.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// Reads every account in one read-only transaction and commits it: the balances if it
/// committed. Shape 0 reads one account after another (from a random first one on) and
/// commits explicitly, 1 does the same through `run_transaction`, 2 reads them all at once
/// (a task each) and commits explicitly.
async fn audit(
    client: &Client,
    table: TableId,
    accounts: u64,
    (shape, first): (u64, u64),
    state: &BankState,
) -> Option<Vec<i64>> {
    let read_all = |tx: stratus_client::Transaction| async move {
        let mut balances = vec![0; accounts as usize];
        for offset in 0..accounts {
            let index = (first + offset) % accounts;
            let value = tx.read(table, &account_key(index)).await?;
            match balance(value.as_deref()) {
                Some(value) => balances[index as usize] = value,
                None => {
                    state.violation(format!(
                        "an audit read account {index} as {value:?}, not a balance"
                    ));
                    return Err(stratus_client::Error::new(Status::InvalidObject, "broken"));
                }
            }
        }
        Ok(balances)
    };
    let tx = client.transaction();
    let balances = match shape {
        0 => read_all(tx.clone()).await.ok()?,
        1 => return client.run_transaction(read_all).await.ok(),
        _ => {
            let reads: Vec<_> = (0..accounts)
                .map(|index| {
                    let tx = tx.clone();
                    tokio::spawn(async move { tx.read(table, &account_key(index)).await })
                })
                .collect();
            let mut balances = Vec::with_capacity(accounts as usize);
            for (index, read) in reads.into_iter().enumerate() {
                let value = read.await.ok()?.ok()?;
                let Some(value) = balance(value.as_deref()) else {
                    state.violation(format!(
                        "an audit read account {index} as {value:?}, not a balance"
                    ));
                    return None;
                };
                balances.push(value);
            }
            balances
        }
    };
    match tx.commit().await {
        Ok(TxOutcome::Committed) => Some(balances),
        _ => None,
    }
}

/// An auditor: sums every account in read-only transactions until the transfer clients are
/// done.
pub(crate) async fn run_auditor(
    seed: u64,
    index: u32,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let bank = options.bank.clone().ok_or("no bank options")?;
    let state = &workload.bank;
    let client = bank_client(seed, &format!("bank-auditor-{index}"), &bank);
    let table = state.table_once_opened().await;
    let mut choices = Choices::new(seed ^ 0xA0D1_0000 ^ u64::from(index));
    while state.transfer_clients_done.load(Ordering::Acquire) < bank.transfer_clients {
        let shape = (choices.below(3), choices.below(bank.accounts));
        let began = now();
        let audited = audit(&client, table, bank.accounts, shape, state).await;
        let ended = now();
        match audited {
            Some(balances) => {
                lock(&state.audits).push(Audit { auditor: index, began, ended, balances })
            }
            None => {
                state.audits_not_committed.fetch_add(1, Ordering::AcqRel);
            }
        }
        tokio::time::sleep(Duration::from_millis(
            choices.below(bank.think_time_max.as_millis() as u64 / 4 + 1),
        ))
        .await;
    }
    state.auditors_done.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The verifier's part, once the faults are over and the bank's clients done: every account
/// read with a plain read (a locked one answers RETRY until the client's timeout), and no
/// live master left holding a prepared operation.
pub(crate) async fn verify_accounts(
    client: &Client,
    bank: &BankOptions,
    state: &BankState,
    observations: &Mutex<ServingObservations>,
    live_sample_age_max: Duration,
) -> Result<(), String> {
    let table = state.table_once_opened().await;
    let mut finals = Vec::with_capacity(bank.accounts as usize);
    for index in 0..bank.accounts {
        let key = account_key(index);
        let value = match client.read(table, &key).await {
            Ok((value, _)) => value,
            Err(error) => {
                let touching: Vec<String> = lock(&state.transfers)
                    .iter()
                    .filter(|transfer| {
                        transfer.from == index as usize || transfer.to == index as usize
                    })
                    .filter(|transfer| transfer.outcome != Outcome::Committed)
                    .map(|transfer| format!("{transfer:?}"))
                    .collect();
                return Err(format!(
                    "bank: account {index} is unreadable after the faults stopped (a lock left \
                     behind?): {error}; its transfers not known committed: {touching:?}"
                ));
            }
        };
        let value = balance(Some(&value))
            .ok_or_else(|| format!("bank: account {index} holds {value:?}, not a balance"))?;
        finals.push(value);
    }
    *lock(&state.finals) = Some(finals);
    no_prepared_operations_left(observations, live_sample_age_max, "bank").await
}

/// Waits up to [`PREPARED_PATIENCE`] for every live master's sampled prepared operations to
/// be 0 (a workload's transactions are all over, so every lock must go); `workload` names
/// the workload in the error.
pub(crate) async fn no_prepared_operations_left(
    observations: &Mutex<ServingObservations>,
    live_sample_age_max: Duration,
    workload: &str,
) -> Result<(), String> {
    let mut waited = Duration::ZERO;
    loop {
        let at = now();
        let holding: Vec<String> = lock(observations)
            .prepared_ops
            .iter()
            .filter(|(_, (sampled, prepared))| {
                at.saturating_sub(*sampled) <= live_sample_age_max && *prepared > 0
            })
            .map(|(server_id, (_, prepared))| format!("server {server_id}: {prepared}"))
            .collect();
        if holding.is_empty() {
            return Ok(());
        }
        if waited >= PREPARED_PATIENCE {
            return Err(format!(
                "{workload}: prepared operations (locks) left on live masters after every \
                 transaction ended ({})",
                holding.join(", ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
}

/// What the bank did in one run.
#[derive(Clone, Debug, Default)]
pub struct BankSummary {
    /// Transfers committed, known not applied, and of unknown outcome.
    pub transfers: (u64, u64, u64),
    /// Audits committed, and aborted or failed.
    pub audits: (u64, u64),
    /// Committed audits whose snapshot the search checked, and those it gave up on.
    pub snapshots: (u64, u64),
}

/// One transfer's effect: `amount` out of `from`, into `to`.
type Move = (usize, usize, i64);

fn apply(balances: &mut [i64], (from, to, amount): Move) {
    balances[from] -= amount;
    balances[to] += amount;
}

/// Choices of effect on the balances, one of which is taken: for a transfer of unknown
/// outcome, none or its move; for one client's transfers that committed while an audit ran,
/// a prefix of them (its transfers are sequential, so one that serialized before the audit
/// follows every earlier one that did too).
type Group = Vec<Vec<i64>>;

/// The group of one optional move: applied or not.
fn either(accounts: usize, movement: Move) -> Group {
    let mut moved = vec![0; accounts];
    apply(&mut moved, movement);
    vec![vec![0; accounts], moved]
}

/// The group of a sequence of moves: the first k of them, for every k.
fn prefixes(accounts: usize, moves: &[Move]) -> Group {
    let mut choices = vec![vec![0; accounts]];
    for &movement in moves {
        let mut next = choices.last().expect("not empty").clone();
        apply(&mut next, movement);
        choices.push(next);
    }
    choices
}

/// Whether taking one choice of each group moves the balances by exactly `residual` (the
/// observed balances minus the expected ones); `None` when the search gave up
/// ([`SEARCH_NODES_MAX`]). A depth-first search over the groups (the largest last, matched by a
/// scan), pruned where an account's residual lies beyond what the remaining groups can reach.
fn explainable(residual: &[i64], groups: &[Group]) -> Option<bool> {
    let accounts = residual.len();
    let mut groups: Vec<&Group> = groups.iter().filter(|group| group.len() > 1).collect();
    groups.sort_by_key(|group| group.len());
    // reach[i][a]: the lowest and highest change groups i.. can make to account a.
    let mut reach = vec![vec![(0i64, 0i64); accounts]; groups.len() + 1];
    for (i, group) in groups.iter().enumerate().rev() {
        reach[i] = reach[i + 1].clone();
        for account in 0..accounts {
            let low = group.iter().map(|choice| choice[account]).min().unwrap_or(0);
            let high = group.iter().map(|choice| choice[account]).max().unwrap_or(0);
            reach[i][account].0 += low;
            reach[i][account].1 += high;
        }
    }
    struct Search<'a> {
        groups: Vec<&'a Group>,
        reach: Vec<Vec<(i64, i64)>>,
        nodes: u64,
    }
    impl Search<'_> {
        fn run(&mut self, index: usize, residual: &mut [i64]) -> Option<bool> {
            self.nodes += 1;
            if self.nodes > SEARCH_NODES_MAX {
                return None;
            }
            for (account, &left) in residual.iter().enumerate() {
                let (low, high) = self.reach[index][account];
                if left < low || left > high {
                    return Some(false);
                }
            }
            match self.groups.len() - index {
                0 => return Some(residual.iter().all(|&left| left == 0)),
                1 => {
                    let found = self.groups[index].iter().any(|choice| choice == residual);
                    return Some(found);
                }
                _ => {}
            }
            let group = self.groups[index];
            for choice in group {
                residual.iter_mut().zip(choice).for_each(|(left, change)| *left -= change);
                let found = self.run(index + 1, residual);
                residual.iter_mut().zip(choice).for_each(|(left, change)| *left += change);
                if found != Some(false) {
                    return found;
                }
            }
            Some(false)
        }
    }
    let mut search = Search { groups, reach, nodes: 0 };
    search.run(0, &mut residual.to_vec())
}

/// Checks the invariants the run's log must keep (see the module documentation).
pub(crate) fn check(state: &BankState, bank: &BankOptions) -> Result<BankSummary, String> {
    if let Some(violation) = lock(&state.violations).first() {
        return Err(format!("bank: {violation}"));
    }
    let transfers = lock(&state.transfers).clone();
    let audits = lock(&state.audits).clone();
    let mut summary = BankSummary::default();
    for transfer in &transfers {
        match transfer.outcome {
            Outcome::Committed => summary.transfers.0 += 1,
            Outcome::NotApplied(_) => summary.transfers.1 += 1,
            Outcome::Unknown(_) => summary.transfers.2 += 1,
        }
    }
    summary.audits =
        (audits.len() as u64, u64::from(state.audits_not_committed.load(Ordering::Acquire)));
    if summary.transfers.0 == 0 {
        return Err(format!(
            "bank: no transfer committed ({} not applied, {} unknown): the workload did not run",
            summary.transfers.1, summary.transfers.2
        ));
    }
    let total = bank.total();
    let accounts = bank.accounts as usize;
    let opening = vec![bank.opening_balance; accounts];
    let movement = |transfer: &Transfer| (transfer.from, transfer.to, transfer.amount);
    for audit in &audits {
        let sum: i64 = audit.balances.iter().sum();
        if sum != total {
            return Err(format!(
                "bank: a committed audit (auditor {}, {} to {} ms) summed to {sum}, not {total}: \
                 {:?}",
                audit.auditor,
                audit.began.as_millis(),
                audit.ended.as_millis(),
                audit.balances
            ));
        }
        // Before the audit began: committed transfers must show; after it ended: none may;
        // of each client's committed transfers that overlapped it, a prefix; of the unknown
        // ones that began before it ended, any.
        let mut expected = opening.clone();
        let mut groups = Vec::new();
        let mut overlapping = vec![Vec::new(); bank.transfer_clients as usize];
        for transfer in &transfers {
            let overlaps = transfer.began <= audit.ended;
            match transfer.outcome {
                Outcome::Committed if transfer.ended < audit.began => {
                    apply(&mut expected, movement(transfer))
                }
                Outcome::Committed if overlaps => overlapping[transfer.client as usize]
                    .push((transfer.sequence, movement(transfer))),
                Outcome::Unknown(_) if overlaps => {
                    groups.push(either(accounts, movement(transfer)))
                }
                _ => {}
            }
        }
        let mut optional = groups.len();
        for mut moves in overlapping {
            moves.sort_by_key(|(sequence, _)| *sequence);
            optional += moves.len();
            let moves: Vec<Move> = moves.into_iter().map(|(_, movement)| movement).collect();
            groups.push(prefixes(accounts, &moves));
        }
        let residual: Vec<i64> =
            audit.balances.iter().zip(&expected).map(|(seen, expected)| seen - expected).collect();
        match explainable(&residual, &groups) {
            Some(true) => summary.snapshots.0 += 1,
            None => summary.snapshots.1 += 1,
            Some(false) => {
                return Err(format!(
                    "bank: a committed audit (auditor {}, {} to {} ms) saw {:?}, which no set of \
                     transfers explains: every transfer committed before it began moves the \
                     opening balances to {expected:?}, and none of the {} that committed or may \
                     have during it makes up the difference {residual:?} (a stale or torn \
                     snapshot)",
                    audit.auditor,
                    audit.began.as_millis(),
                    audit.ended.as_millis(),
                    audit.balances,
                    optional
                ));
            }
        }
    }
    let finals = lock(&state.finals).clone().ok_or("bank: the verifier read no final balances")?;
    let sum: i64 = finals.iter().sum();
    if sum != total {
        return Err(format!(
            "bank: the final balances sum to {sum}, not {total} (money created or destroyed): \
             {finals:?}"
        ));
    }
    let mut expected = opening;
    let mut unknown = Vec::new();
    for transfer in &transfers {
        match transfer.outcome {
            Outcome::Committed => apply(&mut expected, movement(transfer)),
            Outcome::Unknown(_) => unknown.push(either(accounts, movement(transfer))),
            Outcome::NotApplied(_) => {}
        }
    }
    let residual: Vec<i64> = finals
        .iter()
        .zip(&expected)
        .map(|(final_value, expected)| final_value - expected)
        .collect();
    if explainable(&residual, &unknown) == Some(false) {
        return Err(format!(
            "bank: the final balances {finals:?} are not the opening balances moved by every \
             committed transfer ({expected:?}) and some of the {} of unknown outcome: off by \
             {residual:?} (a committed transfer lost or applied twice, an aborted one applied, or \
             a lost update)",
            unknown.len()
        ));
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subset_of_moves_explains_a_residual_or_none_does() {
        let moves = [(0, 1, 5), (1, 2, 7), (2, 0, 3), (0, 2, 5)];
        let each: Vec<Group> = moves.iter().map(|&movement| either(3, movement)).collect();
        assert_eq!(explainable(&[0, 0, 0], &each), Some(true));
        // The first and the third: 0 loses 5 and gains 3, 1 gains 5, 2 loses 3.
        assert_eq!(explainable(&[-2, 5, -3], &each), Some(true));
        assert_eq!(explainable(&[-10, 5, 5], &each), Some(true));
        assert_eq!(explainable(&[-1, 1, 0], &each), Some(false));
        // Applied twice is not a subset.
        assert_eq!(explainable(&[-10, 10, 0], &each), Some(false));
        assert_eq!(explainable(&[1, -1, 0], &[]), Some(false));
        // As one client's sequence, only prefixes: the first and the third is not one.
        let sequence = [prefixes(3, &moves)];
        assert_eq!(explainable(&[-5, -2, 7], &sequence), Some(true));
        assert_eq!(explainable(&[-2, 5, -3], &sequence), Some(false));
    }

    fn millis(value: u64) -> Duration {
        Duration::from_millis(value)
    }

    /// Three accounts of 100; a transfer of 10 from 0 to 1 committed over 10–20 ms, one of 5
    /// from 1 to 2 of unknown outcome over 30–40 ms; the final balances as given.
    fn bank_run(audits: Vec<Audit>, finals: Vec<i64>) -> (BankState, BankOptions) {
        let bank = BankOptions { accounts: 3, opening_balance: 100, ..BankOptions::default() };
        let state = BankState::default();
        let mut sequence = 0;
        let mut transfer = |from, to, amount, (began, ended), outcome| Transfer {
            client: 0,
            sequence: {
                sequence += 1;
                sequence
            },
            shape: 0,
            from,
            to,
            amount,
            began: millis(began),
            ended: millis(ended),
            outcome,
        };
        lock(&state.transfers).extend([
            transfer(0, 1, 10, (10, 20), Outcome::Committed),
            transfer(1, 2, 5, (30, 40), Outcome::Unknown("timeout".to_string())),
            transfer(2, 0, 7, (45, 50), Outcome::NotApplied("aborted".to_string())),
        ]);
        *lock(&state.audits) = audits;
        *lock(&state.finals) = Some(finals);
        (state, bank)
    }

    fn audit(began: u64, ended: u64, balances: Vec<i64>) -> Audit {
        Audit { auditor: 0, began: millis(began), ended: millis(ended), balances }
    }

    #[test]
    fn audits_and_final_balances_that_transfers_explain_pass() {
        let audits = vec![
            audit(0, 5, vec![100, 100, 100]),
            // Overlapping the committed transfer: either state.
            audit(15, 25, vec![100, 100, 100]),
            audit(15, 25, vec![90, 110, 100]),
            // The unknown one may show, once it began.
            audit(35, 50, vec![90, 105, 105]),
            audit(50, 60, vec![90, 110, 100]),
        ];
        for finals in [vec![90, 110, 100], vec![90, 105, 105]] {
            let (state, bank) = bank_run(audits.clone(), finals);
            let summary = check(&state, &bank).unwrap();
            assert_eq!(summary.transfers, (1, 1, 1));
            assert_eq!(summary.snapshots, (5, 0));
        }
    }

    #[test]
    fn a_stale_or_torn_audit_fails_even_when_its_sum_is_right() {
        // After the committed transfer ended, an audit still sees the opening balances.
        let (state, bank) = bank_run(vec![audit(21, 30, vec![100, 100, 100])], vec![90, 110, 100]);
        let error = check(&state, &bank).unwrap_err();
        assert!(error.contains("which no set of transfers explains"), "{error}");
        // Half a transfer: the sum is wrong.
        let (state, bank) = bank_run(vec![audit(21, 30, vec![90, 100, 100])], vec![90, 110, 100]);
        assert!(check(&state, &bank).unwrap_err().contains("summed to 290"));
        // The unknown transfer cannot show before it began.
        let (state, bank) = bank_run(vec![audit(21, 29, vec![90, 105, 105])], vec![90, 110, 100]);
        assert!(check(&state, &bank).is_err());
    }

    #[test]
    fn final_balances_must_apply_every_committed_transfer_once_and_no_aborted_one() {
        for finals in [
            vec![100, 100, 100], // the committed transfer lost
            vec![80, 120, 100],  // applied twice
            vec![97, 110, 93],   // the aborted one applied
        ] {
            let (state, bank) = bank_run(Vec::new(), finals);
            let error = check(&state, &bank).unwrap_err();
            assert!(error.contains("not the opening balances moved"), "{error}");
        }
        let (state, bank) = bank_run(Vec::new(), vec![90, 110, 101]);
        assert!(check(&state, &bank).unwrap_err().contains("sum to 301"));
    }

    #[test]
    fn a_run_without_a_committed_transfer_fails() {
        let (state, bank) = bank_run(Vec::new(), vec![100, 100, 100]);
        lock(&state.transfers).retain(|transfer| transfer.outcome != Outcome::Committed);
        assert!(check(&state, &bank).unwrap_err().contains("no transfer committed"));
    }
}
