//! The coordinator's figures for its metrics endpoint: what the cluster looks like now, and
//! counters of what the coordinator has done since it started.

use std::sync::atomic::{AtomicU64, Ordering};

use stratus_types::ServerId;
use stratus_wire::ServerStatus;

use crate::service::Coordinator;

/// Counters of the coordinator's work since it started (one relaxed add per event; none is on
/// a client's read or write path).
#[derive(Debug, Default)]
pub(crate) struct CoordinatorCounters {
    pub(crate) enlistments: AtomicU64,
    pub(crate) lease_renewals_granted: AtomicU64,
    pub(crate) lease_renewals_refused: AtomicU64,
    pub(crate) servers_declared_crashed: AtomicU64,
    pub(crate) servers_stopped_in_order: AtomicU64,
    pub(crate) recoveries_started: AtomicU64,
    pub(crate) recoveries_completed: AtomicU64,
    pub(crate) recovery_attempts_incomplete: AtomicU64,
    pub(crate) recoveries_abandoned: AtomicU64,
    pub(crate) crash_hints_received: AtomicU64,
    pub(crate) crash_hints_dropped: AtomicU64,
}

impl CoordinatorCounters {
    pub(crate) fn count(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }
}

/// The coordinator's figures at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorMetrics {
    /// Servers up.
    pub servers_up: u64,
    /// Servers declared crashed whose recovery has not finished.
    pub servers_crashed: u64,
    /// Servers removed for good (recovered).
    pub servers_removed: u64,
    /// Servers that stopped in order whose recovery has not finished.
    pub servers_stopped: u64,
    /// Tables.
    pub tables: u64,
    /// Tablets served by a master that is up.
    pub tablets_normal: u64,
    /// Tablets whose master is not up (being recovered).
    pub tablets_recovering: u64,
    /// Of those, tablets whose recovery is impossible (no complete log) and whose loss no
    /// operator accepted yet: nothing serves them.
    pub tablets_unavailable: u64,
    /// Crashed masters being recovered now.
    pub recoveries_in_flight: u64,
    /// Servers enlisted since this coordinator started.
    pub enlistments: u64,
    /// RENEW_LEASE requests granted.
    pub lease_renewals_granted: u64,
    /// RENEW_LEASE requests refused (the server is not up, or does not answer pings).
    pub lease_renewals_refused: u64,
    /// Servers declared crashed (missed pings, gone at restart, or replaced at their address).
    pub servers_declared_crashed: u64,
    /// Servers that said they were stopping (SERVER_STOPPING) while up.
    pub servers_stopped_in_order: u64,
    /// Recoveries of crashed masters started.
    pub recoveries_started: u64,
    /// Recoveries finished: every tablet has a new owner.
    pub recoveries_completed: u64,
    /// Recovery attempts that left work to do (retried after a backoff).
    pub recovery_attempts_incomplete: u64,
    /// Recoveries given up after every attempt (tablets unavailable until a restart).
    pub recoveries_abandoned: u64,
    /// HINT_SERVER_CRASHED requests about servers that were up.
    pub crash_hints_received: u64,
    /// Suspects not checked because too many checks were running.
    pub crash_hints_dropped: u64,
}

impl Coordinator {
    /// The figures for the metrics endpoint. Takes the state lock briefly (behind a metadata
    /// write in progress, if one is).
    pub async fn metrics(&self) -> CoordinatorMetrics {
        let inner = &self.inner;
        let mut metrics = CoordinatorMetrics::default();
        let unavailable: std::collections::BTreeSet<ServerId> = inner
            .unrecoverable()
            .iter()
            .filter(|(_, unrecoverable)| !unrecoverable.loss_accepted)
            .map(|(server_id, _)| *server_id)
            .collect();
        {
            let state = inner.state.lock().await;
            for server in state.servers.values() {
                match server.status {
                    ServerStatus::Up => metrics.servers_up += 1,
                    ServerStatus::Crashed => metrics.servers_crashed += 1,
                    ServerStatus::Removed => metrics.servers_removed += 1,
                    ServerStatus::Stopped => metrics.servers_stopped += 1,
                }
            }
            metrics.tables = state.tables.len() as u64;
            for tablet in state.tables.values().flat_map(|table| &table.tablets) {
                let serving = state
                    .servers
                    .get(&tablet.owner)
                    .is_some_and(|owner| owner.status == ServerStatus::Up);
                if serving {
                    metrics.tablets_normal += 1;
                } else {
                    metrics.tablets_recovering += 1;
                    if unavailable.contains(&tablet.owner) {
                        metrics.tablets_unavailable += 1;
                    }
                }
            }
        }
        metrics.recoveries_in_flight = inner.recoveries.lock().await.len() as u64;
        let counters = &inner.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        metrics.enlistments = load(&counters.enlistments);
        metrics.lease_renewals_granted = load(&counters.lease_renewals_granted);
        metrics.lease_renewals_refused = load(&counters.lease_renewals_refused);
        metrics.servers_declared_crashed = load(&counters.servers_declared_crashed);
        metrics.servers_stopped_in_order = load(&counters.servers_stopped_in_order);
        metrics.recoveries_started = load(&counters.recoveries_started);
        metrics.recoveries_completed = load(&counters.recoveries_completed);
        metrics.recovery_attempts_incomplete = load(&counters.recovery_attempts_incomplete);
        metrics.recoveries_abandoned = load(&counters.recoveries_abandoned);
        metrics.crash_hints_received = load(&counters.crash_hints_received);
        metrics.crash_hints_dropped = load(&counters.crash_hints_dropped);
        metrics
    }
}
