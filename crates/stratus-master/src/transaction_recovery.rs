//! Finishing transactions whose client died mid-commit (docs/design/transactions.md, "The
//! client dies mid-commit"): every participant keeps the list of its transactions' operations
//! while any of them is prepared here, and when one stays undecided past its delay
//! (`TX_RECOVERY_DELAY_MILLIS`, doubling), this master finishes the transaction itself through
//! the client library's `finish_transaction`: it makes every operation's vote final with
//! TX_REQUEST_ABORT, decides from the votes exactly as the client would (so a client that is
//! only slow, and any other participant doing the same, reaches the same decision), and
//! delivers the decision.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stratus_client::{Client, ClientConfig};
use stratus_env::Environment;
use stratus_store::{ObjectStore, TransactionToFinish, WallTime};
use stratus_types::limits::{TX_RECOVERIES_IN_FLIGHT_MAX, TX_RECOVERY_DELAY_MILLIS};
use stratus_types::{LeaseId, RpcId};
use stratus_wire::TxDecisionOp;

/// How often the store is asked for transactions due for recovery: a fifth of the delay, so
/// a transaction is finished at most 20 % after it is due.
const SWEEP_INTERVAL: Duration = Duration::from_millis(TX_RECOVERY_DELAY_MILLIS / 5);

/// Runs forever: finishes the transactions of this master's store that their clients leave
/// undecided, at most [`TX_RECOVERIES_IN_FLIGHT_MAX`] at once.
pub async fn finish_abandoned_transactions(
    store: Arc<ObjectStore>,
    coordinator: String,
    environment: Environment,
) {
    let wall_clock = environment.wall_clock.clone();
    let mut config = ClientConfig::new(coordinator);
    // The finisher acts under each transaction's own lease; it needs none of its own.
    config.exactly_once = false;
    let client = Client::with_environment(config, environment);
    let in_flight: Arc<Mutex<HashSet<(LeaseId, RpcId)>>> = Arc::default();
    loop {
        tokio::time::sleep(SWEEP_INTERVAL).await;
        let now = WallTime::from_millis(wall_clock.now_millis());
        let room = TX_RECOVERIES_IN_FLIGHT_MAX.saturating_sub(lock(&in_flight).len());
        for transaction in store.transactions_to_finish(now, room) {
            let key = (transaction.lease, transaction.transaction);
            if !lock(&in_flight).insert(key) {
                continue;
            }
            let (client, in_flight) = (client.clone(), in_flight.clone());
            tokio::spawn(async move {
                finish(&client, &transaction).await;
                lock(&in_flight).remove(&key);
            });
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

async fn finish(client: &Client, transaction: &TransactionToFinish) {
    let participants: Vec<TxDecisionOp> = transaction
        .participants
        .iter()
        .map(|participant| TxDecisionOp {
            table_id: participant.table,
            key_hash: participant.key_hash,
            rpc: RpcId(participant.rpc_id),
        })
        .collect();
    let (lease, id) = (transaction.lease, transaction.transaction);
    match client.finish_transaction(lease, id, &participants).await {
        Ok(decision) => {
            tracing::info!(%lease, transaction = %id, %decision, "finished a transaction its client left undecided")
        }
        // Due again later (the store pushed its next attempt back): a participant may be
        // recovering, or the coordinator failing over.
        Err(error) => {
            tracing::debug!(%lease, transaction = %id, %error, "could not finish a transaction yet")
        }
    }
}
