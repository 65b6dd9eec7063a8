//! Which client leases this master may apply new mutations under (RIFL,
//! docs/design/exactly-once.md, "Lease checks on masters").
//!
//! A mutation with an exactly-once identity is applied only under a lease the coordinator
//! vouched for: a client whose lease expired may have had its results forgotten, and applying
//! its old request again would apply it twice. The coordinator's answer to CHECK_CLIENT_LEASES
//! says how long each lease stays valid at least; the master believes it until then (counted
//! from when it *sent* the question, less a margin for clock rates), so it asks about a
//! client rarely, not per request.
//!
//! A request under a lease not vouched for is answered RETRY and the lease is checked in the
//! background: the client's retry, a millisecond later, finds it vouched. A lease nearing the
//! end of its vouching is checked again in the background while requests keep being served.
//! A sweep asks now and then about every lease the store holds results of, and forgets the
//! results of leases that expired.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_store::ObjectStore;
use stratus_types::limits::{CLIENT_LEASES_PER_CHECK_MAX, CLIENT_LEASE_TERM_MILLIS};
use stratus_types::LeaseId;
use stratus_wire::{Request, Response, ResponseBody, Status};
use tokio::time::Instant;

/// Subtracted from what the coordinator vouches for: clocks run at slightly different rates.
const VOUCHING_MARGIN: Duration = Duration::from_millis(500);

/// A vouched lease is checked again in the background once less than this remains.
const RECHECK_BEFORE_END: Duration = Duration::from_millis(CLIENT_LEASE_TERM_MILLIS / 3);

/// How often the sweep asks about the leases the store holds results of.
pub const CLIENT_LEASE_SWEEP_INTERVAL: Duration =
    Duration::from_millis(CLIENT_LEASE_TERM_MILLIS / 3);

/// How long one CHECK_CLIENT_LEASES may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// Expired leases remembered (to answer EXPIRED_LEASE rather than RETRY to their requests):
/// lease ids are never reused, so forgetting the oldest only turns their answer back into a
/// check.
const EXPIRED_REMEMBERED_MAX: usize = 65_536;

/// Leases vouched for at once, at most: past it, those whose vouching ended are dropped.
const VOUCHED_MAX: usize = 1 << 20;

/// What this master knows of a lease now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseStanding {
    /// Vouched for by the coordinator until later than now.
    Vouched,
    /// The coordinator said it expired.
    Expired,
    /// Not known (yet): a check is under way.
    Unknown,
}

#[derive(Debug, Default)]
struct State {
    vouched: HashMap<LeaseId, Instant>,
    expired: HashSet<LeaseId>,
    expired_order: VecDeque<LeaseId>,
    checking: HashSet<LeaseId>,
}

impl State {
    fn remember_expired(&mut self, lease: LeaseId) {
        self.vouched.remove(&lease);
        if self.expired.insert(lease) {
            self.expired_order.push_back(lease);
            if self.expired_order.len() > EXPIRED_REMEMBERED_MAX {
                if let Some(oldest) = self.expired_order.pop_front() {
                    self.expired.remove(&oldest);
                }
            }
        }
    }
}

/// The client leases of one master.
#[derive(Debug)]
pub struct ClientLeaseChecks {
    /// How to ask the coordinator; `None` for a master alone (tests): every lease is vouched.
    coordinator: Option<(String, ChannelPool)>,
    store: Arc<ObjectStore>,
    state: Mutex<State>,
}

impl ClientLeaseChecks {
    /// Checks that vouch for every lease (a master without a coordinator).
    pub fn vouching_all(store: Arc<ObjectStore>) -> Arc<ClientLeaseChecks> {
        Arc::new(ClientLeaseChecks { coordinator: None, store, state: Mutex::default() })
    }

    /// Checks asking the coordinator at `coordinator`.
    pub fn new(
        store: Arc<ObjectStore>,
        coordinator: String,
        network: Arc<dyn stratus_env::Network>,
    ) -> Arc<ClientLeaseChecks> {
        let config = RpcConfig { request_timeout: CHECK_TIMEOUT, ..RpcConfig::default() };
        let pool = ChannelPool::new(network, config);
        Arc::new(ClientLeaseChecks {
            coordinator: Some((coordinator, pool)),
            store,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Where `lease` stands; starts a background check when it is unknown or its vouching
    /// nears its end.
    pub fn standing(self: &Arc<Self>, lease: LeaseId) -> LeaseStanding {
        if self.coordinator.is_none() {
            return LeaseStanding::Vouched;
        }
        let now = Instant::now();
        let mut state = self.lock();
        let (standing, recheck) = match state.vouched.get(&lease) {
            Some(&until) if now < until => {
                (LeaseStanding::Vouched, until.saturating_duration_since(now) <= RECHECK_BEFORE_END)
            }
            _ if state.expired.contains(&lease) => (LeaseStanding::Expired, false),
            _ => (LeaseStanding::Unknown, true),
        };
        if recheck && state.checking.insert(lease) {
            drop(state);
            self.start_check(vec![lease]);
        }
        standing
    }

    fn start_check(self: &Arc<Self>, leases: Vec<LeaseId>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            let mut state = self.lock();
            for lease in &leases {
                state.checking.remove(lease);
            }
            return;
        };
        let checks = self.clone();
        runtime.spawn(async move {
            checks.check(&leases).await;
            let mut state = checks.lock();
            for lease in &leases {
                state.checking.remove(lease);
            }
        });
    }

    /// Asks the coordinator about `leases` (at most [`CLIENT_LEASES_PER_CHECK_MAX`]) and
    /// records the answers; the results of leases that expired are forgotten. A check that
    /// gets no answer changes nothing.
    async fn check(&self, leases: &[LeaseId]) {
        let Some((coordinator, pool)) = &self.coordinator else { return };
        debug_assert!(leases.len() <= CLIENT_LEASES_PER_CHECK_MAX);
        let sent = Instant::now();
        let request = Request::CheckClientLeases { leases: leases.to_vec() };
        let remaining_ms = match pool.call_coordinator(coordinator, &request).await {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::CheckClientLeases { remaining_ms }),
            )) if remaining_ms.len() == leases.len() => remaining_ms,
            other => {
                tracing::debug!(?other, "client lease check failed");
                return;
            }
        };
        let mut expired = Vec::new();
        {
            let mut state = self.lock();
            for (&lease, &remaining) in leases.iter().zip(&remaining_ms) {
                if remaining == 0 {
                    state.remember_expired(lease);
                    expired.push(lease);
                    continue;
                }
                let vouched = Duration::from_millis(u64::from(remaining));
                let until = sent + vouched.saturating_sub(VOUCHING_MARGIN);
                state.vouched.insert(lease, until);
            }
            if state.vouched.len() > VOUCHED_MAX {
                let now = Instant::now();
                state.vouched.retain(|_, until| *until > now);
            }
        }
        for lease in expired {
            let forgotten = self.store.forget_client_lease(lease);
            if forgotten > 0 {
                tracing::info!(%lease, forgotten, "client lease expired: its results are forgotten");
            }
        }
    }

    /// Runs forever: every [`CLIENT_LEASE_SWEEP_INTERVAL`], asks about the leases the store
    /// holds results (or a mark) of that are not vouched for long enough, in batches, so
    /// results of clients that went away are forgotten once their lease expired.
    pub async fn sweep(self: Arc<Self>) {
        if self.coordinator.is_none() {
            return;
        }
        loop {
            tokio::time::sleep(CLIENT_LEASE_SWEEP_INTERVAL).await;
            let now = Instant::now();
            let due: Vec<LeaseId> = {
                let state = self.lock();
                self.store
                    .client_leases()
                    .into_iter()
                    .filter(|lease| {
                        state.vouched.get(lease).is_none_or(|until| {
                            until.saturating_duration_since(now) <= CLIENT_LEASE_SWEEP_INTERVAL
                        })
                    })
                    .collect()
            };
            for batch in due.chunks(CLIENT_LEASES_PER_CHECK_MAX) {
                self.check(batch).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_leases_are_remembered_within_a_bound() {
        let mut state = State::default();
        for lease in 0..(EXPIRED_REMEMBERED_MAX as u64 + 10) {
            state.remember_expired(LeaseId(lease + 1));
        }
        assert_eq!(state.expired.len(), EXPIRED_REMEMBERED_MAX);
        assert!(!state.expired.contains(&LeaseId(1)), "the oldest is forgotten");
        assert!(state.expired.contains(&LeaseId(EXPIRED_REMEMBERED_MAX as u64 + 10)));
    }
}
