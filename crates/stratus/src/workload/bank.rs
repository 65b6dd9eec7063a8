//! The bank part of `stratus workload` (issue 24): money moves between accounts spread over
//! every master in transactions, while read-only transactions sum every account, all under the
//! faults the harness injects. Money is never created or destroyed, so:
//! - every audit that commits must see the opening total (a read-only transaction is a
//!   consistent snapshot: strictly serializable);
//! - after the run, plain reads of every account must sum to it (a transfer is atomic, whether
//!   its client learnt the outcome or not), and every account must be readable (no lock of a
//!   transaction outlives it: its participants finish it when its client cannot).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stratus_client::{Client, Status, TableId, TxOutcome};

/// Every account's opening balance.
pub const OPENING_BALANCE: i64 = 1_000;

/// Largest amount one transfer moves.
const TRANSFER_AMOUNT_MAX: u64 = 50;

/// Pause between two transactions of one bank client: audits read every account, and an
/// optimistic read-only transaction aborts whenever a transfer touched what it read, so
/// unpaced transfers would starve them.
const TRANSFER_PAUSE: Duration = Duration::from_millis(5);

/// Backoff after a transaction whose outcome is unknown (the cluster may be recovering).
const FAULT_BACKOFF: Duration = Duration::from_millis(100);

pub fn account(index: u32) -> Vec<u8> {
    format!("account-{index:04}").into_bytes()
}

fn balance(value: &[u8]) -> Result<i64, String> {
    let bytes: [u8; 8] = value.try_into().map_err(|_| format!("a {}-byte balance", value.len()))?;
    Ok(i64::from_le_bytes(bytes))
}

/// What the bank clients did.
#[derive(Debug, Default)]
pub struct BankTally {
    /// Transfers that committed.
    pub committed: u64,
    /// Transfers whose outcome the client did not learn (committed or not: either keeps the
    /// total).
    pub unknown: u64,
    /// Audits that committed, all checked.
    pub audits: u64,
    /// Audits that committed with a total other than the opening one: each is a violation.
    pub wrong_audits: Vec<i64>,
}

/// Opens `accounts` accounts in `table`.
pub async fn open_accounts(client: &Client, table: TableId, accounts: u32) -> Result<(), String> {
    for index in 0..accounts {
        client
            .write(table, &account(index), &OPENING_BALANCE.to_le_bytes())
            .await
            .map_err(|error| format!("opening account {index}: {error}"))?;
    }
    Ok(())
}

/// A bank client until `stop`: transfers between pseudo-random pairs of accounts, and every
/// fourth transaction an audit of every account.
pub async fn run_bank_client(
    client: Client,
    table: TableId,
    accounts: u32,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> BankTally {
    let mut state = seed | 1;
    let mut next = move || {
        // xorshift64: the seed decides the choices.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let total = OPENING_BALANCE * i64::from(accounts);
    let mut tally = BankTally::default();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        if round.is_multiple_of(4) {
            match audit(&client, table, accounts).await {
                Ok(Some(seen)) => {
                    tally.audits += 1;
                    if seen != total {
                        tally.wrong_audits.push(seen);
                    }
                }
                Ok(None) => {}
                Err(_) => tokio::time::sleep(FAULT_BACKOFF).await,
            }
        } else {
            let from = (next() % u64::from(accounts)) as u32;
            let to = ((u64::from(from) + 1 + next() % u64::from(accounts - 1))
                % u64::from(accounts)) as u32;
            let amount = (next() % TRANSFER_AMOUNT_MAX) as i64;
            match transfer(&client, table, (from, to), amount).await {
                Ok(true) => tally.committed += 1,
                Ok(false) => {}
                Err(_) => {
                    tally.unknown += 1;
                    tokio::time::sleep(FAULT_BACKOFF).await;
                }
            }
        }
        tokio::time::sleep(TRANSFER_PAUSE).await;
    }
    tally
}

/// One transfer: `Ok(true)` committed, `Ok(false)` aborted (nothing moved), `Err` unknown.
async fn transfer(
    client: &Client,
    table: TableId,
    (from, to): (u32, u32),
    amount: i64,
) -> Result<bool, String> {
    let tx = client.transaction();
    let source = tx.read(table, &account(from)).await.map_err(|error| error.to_string())?;
    let source = balance(&source.ok_or("an account is missing")?)?;
    tx.write(table, &account(from), &(source - amount).to_le_bytes())
        .map_err(|error| error.to_string())?;
    tx.increment(table, &account(to), amount).await.map_err(|error| error.to_string())?;
    match tx.commit().await.map_err(|error| error.to_string())? {
        TxOutcome::Committed => Ok(true),
        TxOutcome::Aborted(_) => Ok(false),
    }
}

/// Sums every account in one read-only transaction: `Ok(None)` when it aborted.
async fn audit(client: &Client, table: TableId, accounts: u32) -> Result<Option<i64>, String> {
    let tx = client.transaction();
    let mut total = 0;
    for index in 0..accounts {
        let value = tx.read(table, &account(index)).await.map_err(|error| error.to_string())?;
        total += balance(&value.ok_or("an account is missing")?)?;
    }
    match tx.commit().await.map_err(|error| error.to_string())? {
        TxOutcome::Committed => Ok(Some(total)),
        TxOutcome::Aborted(_) => Ok(None),
    }
}

/// The sum of every account read with plain reads, retried until `deadline`; `Err` names an
/// account that stayed unreadable (locked or unavailable) or broken.
pub async fn final_total(
    client: &Client,
    table: TableId,
    accounts: u32,
    deadline: tokio::time::Instant,
) -> Result<i64, String> {
    let mut total = 0;
    for index in 0..accounts {
        let value = loop {
            match client.read(table, &account(index)).await {
                Ok((value, _)) => break value,
                Err(error) if error.status == Status::ObjectDoesntExist => {
                    return Err(format!("account {index} is missing"))
                }
                Err(error) if tokio::time::Instant::now() >= deadline => {
                    return Err(format!("account {index} stayed unreadable: {error}"))
                }
                Err(_) => tokio::time::sleep(FAULT_BACKOFF).await,
            }
        };
        total += balance(&value)?;
    }
    Ok(total)
}
