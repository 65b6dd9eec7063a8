//! The client's side of exactly-once operations (RIFL, docs/design/exactly-once.md): its
//! lease, the ids of its mutations, and what it has acknowledged.
//!
//! Every mutation takes an [`RpcTicket`] before its first attempt: the lease and a fresh rpc
//! id, which every attempt of the mutation carries, so the master that applied it answers
//! the retries with the first result. The ticket is given back when the mutation ends (with
//! an answer or an error: either way the client will not send it again), and the client then
//! acknowledges it: every request carries the highest id below which no ticket is out, and
//! the masters forget the results up to it.
//!
//! The lease is opened by the first mutation, renewed in the background while mutations
//! keep coming (a renewal starts when a mutation or a retry finds it due), and reopened by
//! the first mutation after it lapsed (an idle client needs no lease: nothing of it is kept).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use stratus_types::limits::CLIENT_LEASE_RENEW_INTERVAL_MILLIS;
use stratus_types::{LeaseId, RpcId, RpcIdentity};
use stratus_wire::{Request, Response, Status};
use tokio::time::Instant;

use crate::client::Inner;
use crate::error::{Error, Result};

/// How much earlier than the coordinator's term the client stops using a lease: the
/// coordinator counts the term from when it received the request, the client from when it
/// sent it, and clocks run at slightly different rates.
const LEASE_SAFETY_MARGIN: Duration = Duration::from_secs(2);

/// How long after a failed renewal the next one may start (a coordinator that cannot be
/// reached is not asked on every mutation).
const RENEWAL_RETRY_DELAY: Duration = Duration::from_secs(1);

/// The lease a client holds.
#[derive(Clone, Copy, Debug)]
struct HeldLease {
    id: LeaseId,
    /// Past this the client does not use it (the term, less the margin).
    usable_until: Instant,
    /// From this on, the next mutation starts a renewal.
    renew_at: Instant,
}

#[derive(Debug, Default)]
struct AgentState {
    lease: Option<HeldLease>,
    /// The next rpc id of the current lease.
    next_rpc: u64,
    /// Tickets out: (lease, rpc id).
    outstanding: BTreeSet<(LeaseId, RpcId)>,
}

/// A client's lease and rpc ids.
#[derive(Debug, Default)]
pub(crate) struct LeaseAgent {
    state: Arc<Mutex<AgentState>>,
    /// Held while a lease is being opened, so concurrent mutations open one, not many.
    opening: tokio::sync::Mutex<()>,
    /// True while a renewal runs.
    renewing: AtomicBool,
}

/// The identity of one mutation, held from before its first attempt to its end; dropping it
/// acknowledges the mutation.
#[derive(Debug)]
pub(crate) struct RpcTicket {
    state: Arc<Mutex<AgentState>>,
    lease: LeaseId,
    rpc: RpcId,
}

fn lock(state: &Mutex<AgentState>) -> MutexGuard<'_, AgentState> {
    state.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// The next rpc id of `lease` (the current lease of `locked`, the state behind `shared`), out
/// as a ticket.
fn issue(shared: &Arc<Mutex<AgentState>>, locked: &mut AgentState, lease: LeaseId) -> RpcTicket {
    let rpc = RpcId(locked.next_rpc);
    locked.next_rpc += 1;
    locked.outstanding.insert((lease, rpc));
    RpcTicket { state: shared.clone(), lease, rpc }
}

impl RpcTicket {
    /// The lease it is under.
    pub(crate) fn lease(&self) -> LeaseId {
        self.lease
    }

    /// Its rpc id.
    pub(crate) fn rpc(&self) -> RpcId {
        self.rpc
    }

    /// What the mutation's next attempt carries: its lease and id, and the highest id of the
    /// lease below which no ticket is out.
    pub(crate) fn identity(&self) -> RpcIdentity {
        let state = lock(&self.state);
        let oldest = state
            .outstanding
            .range((self.lease, RpcId(0))..)
            .next()
            .filter(|(lease, _)| *lease == self.lease)
            .map_or(self.rpc, |(_, rpc)| *rpc);
        RpcIdentity { lease: self.lease, rpc: self.rpc, acknowledged: RpcId(oldest.0 - 1) }
    }
}

impl Drop for RpcTicket {
    fn drop(&mut self) {
        lock(&self.state).outstanding.remove(&(self.lease, self.rpc));
    }
}

impl LeaseAgent {
    /// A ticket under the current lease, if one is usable now; starts a renewal when one is
    /// due.
    pub(crate) fn ticket_now(&self, inner: &Weak<Inner>) -> Option<RpcTicket> {
        let mut state = lock(&self.state);
        let lease = self.usable_lease(&state, inner)?;
        Some(issue(&self.state, &mut state, lease))
    }

    /// `count` tickets under the current lease, with consecutive rpc ids, if a lease is usable
    /// now: the ops of one transaction, which must share a lease (the transaction's id is its
    /// lease and its first op's rpc id), so they are taken in one go.
    pub(crate) fn tickets_now(&self, inner: &Weak<Inner>, count: usize) -> Option<Vec<RpcTicket>> {
        let mut state = lock(&self.state);
        let lease = self.usable_lease(&state, inner)?;
        Some((0..count).map(|_| issue(&self.state, &mut state, lease)).collect())
    }

    /// A ticket, opening a lease first if none is usable (within `deadline`).
    pub(crate) async fn ticket(&self, inner: &Inner, deadline: Instant) -> Result<RpcTicket> {
        loop {
            if let Some(ticket) = self.ticket_now(inner.me()) {
                return Ok(ticket);
            }
            self.open_lease(inner, deadline).await?;
        }
    }

    /// [`LeaseAgent::tickets_now`], opening a lease first if none is usable (within
    /// `deadline`).
    pub(crate) async fn tickets(
        &self,
        inner: &Inner,
        count: usize,
        deadline: Instant,
    ) -> Result<Vec<RpcTicket>> {
        loop {
            if let Some(tickets) = self.tickets_now(inner.me(), count) {
                return Ok(tickets);
            }
            self.open_lease(inner, deadline).await?;
        }
    }

    /// The current lease if it is usable now; starts a renewal when one is due.
    fn usable_lease(&self, state: &AgentState, inner: &Weak<Inner>) -> Option<LeaseId> {
        let now = Instant::now();
        let lease = state.lease.filter(|lease| now < lease.usable_until)?;
        if now >= lease.renew_at {
            self.start_renewal(inner, lease.id);
        }
        Some(lease.id)
    }

    /// Opens a lease (within `deadline`) unless another caller did while this one waited.
    async fn open_lease(&self, inner: &Inner, deadline: Instant) -> Result<()> {
        let _opening = self.opening.lock().await;
        if self.has_usable_lease() {
            return Ok(());
        }
        let sent = Instant::now();
        let request = Request::ClientLease { lease: LeaseId(0) };
        match inner.coordinator_call_until(&request, deadline).await? {
            Response::ClientLease { lease, term_ms } if lease.0 != 0 => {
                self.hold(lease, sent, term_ms);
                tracing::debug!(%lease, "client lease opened");
                Ok(())
            }
            other => Err(Error::new(
                Status::InternalError,
                format!("the coordinator answered CLIENT_LEASE with {other:?}"),
            )),
        }
    }

    /// Starts a renewal if one is due (a mutation's retries keep the lease it carries alive).
    pub(crate) fn renew_if_due(&self, inner: &Weak<Inner>) {
        let lease = lock(&self.state).lease;
        if let Some(lease) = lease.filter(|lease| Instant::now() >= lease.renew_at) {
            self.start_renewal(inner, lease.id);
        }
    }

    fn has_usable_lease(&self) -> bool {
        lock(&self.state).lease.is_some_and(|lease| Instant::now() < lease.usable_until)
    }

    /// Takes `lease`, newly opened for `term_ms` from `sent`, as the current lease: its rpc
    /// ids start at 1.
    fn hold(&self, lease: LeaseId, sent: Instant, term_ms: u32) {
        let term = Duration::from_millis(u64::from(term_ms));
        let renew_after = Duration::from_millis(CLIENT_LEASE_RENEW_INTERVAL_MILLIS).min(term / 3);
        let held = HeldLease {
            id: lease,
            usable_until: sent + term.saturating_sub(LEASE_SAFETY_MARGIN),
            renew_at: sent + renew_after,
        };
        let mut state = lock(&self.state);
        debug_assert!(state.lease.is_none_or(|current| current.id != lease), "lease reopened");
        state.next_rpc = 1;
        state.lease = Some(held);
    }

    /// Extends `lease`, renewed for `term_ms` from `sent`, if it is still the current lease (a
    /// renewal that comes back after the client moved to a new lease changes nothing: taking
    /// the old lease back would reuse its rpc ids).
    fn renewed(&self, lease: LeaseId, sent: Instant, term_ms: u32) {
        let mut state = lock(&self.state);
        if let Some(held) = state.lease.as_mut().filter(|held| held.id == lease) {
            let term = Duration::from_millis(u64::from(term_ms));
            let renew_after =
                Duration::from_millis(CLIENT_LEASE_RENEW_INTERVAL_MILLIS).min(term / 3);
            held.usable_until =
                held.usable_until.max(sent + term.saturating_sub(LEASE_SAFETY_MARGIN));
            held.renew_at = sent + renew_after;
        }
    }

    /// Forgets `lease` (a master or the coordinator said it expired): the next mutation opens
    /// a new one.
    pub(crate) fn lost(&self, lease: LeaseId) {
        let mut state = lock(&self.state);
        if state.lease.is_some_and(|held| held.id == lease) {
            tracing::info!(%lease, "client lease expired; the next mutation takes a new one");
            state.lease = None;
        }
    }

    /// Starts a renewal in the background unless one runs.
    fn start_renewal(&self, inner: &Weak<Inner>, lease: LeaseId) {
        if self.renewing.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = inner.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.renewing.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(async move {
            let Some(inner) = inner.upgrade() else { return };
            inner.lease_agent().renew(&inner, lease).await;
            inner.lease_agent().renewing.store(false, Ordering::Release);
        });
    }

    async fn renew(&self, inner: &Inner, lease: LeaseId) {
        let sent = Instant::now();
        let deadline = sent + Duration::from_millis(CLIENT_LEASE_RENEW_INTERVAL_MILLIS);
        match inner.coordinator_call_until(&Request::ClientLease { lease }, deadline).await {
            Ok(Response::ClientLease { lease: renewed, term_ms }) if renewed == lease => {
                self.renewed(lease, sent, term_ms);
            }
            Err(error) if error.status == Status::ExpiredLease => self.lost(lease),
            outcome => {
                tracing::debug!(%lease, ?outcome, "client lease renewal failed; trying again");
                let mut state = lock(&self.state);
                if let Some(held) = state.lease.as_mut().filter(|held| held.id == lease) {
                    held.renew_at = Instant::now() + RENEWAL_RETRY_DELAY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn acknowledgements_trail_the_oldest_ticket_out() {
        let agent = LeaseAgent::default();
        agent.hold(LeaseId(4), Instant::now(), 30_000);
        let nobody = Weak::new();
        let first = agent.ticket_now(&nobody).unwrap();
        let second = agent.ticket_now(&nobody).unwrap();
        let third = agent.ticket_now(&nobody).unwrap();
        assert_eq!(
            first.identity(),
            RpcIdentity { lease: LeaseId(4), rpc: RpcId(1), acknowledged: RpcId(0) }
        );
        assert_eq!(third.identity().acknowledged, RpcId(0));
        drop(second);
        assert_eq!(third.identity().acknowledged, RpcId(0), "rpc 1 is still out");
        drop(first);
        assert_eq!(third.identity().acknowledged, RpcId(2));
        let fourth = agent.ticket_now(&nobody).unwrap();
        drop(third);
        assert_eq!(
            fourth.identity(),
            RpcIdentity { lease: LeaseId(4), rpc: RpcId(4), acknowledged: RpcId(3) }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_transactions_tickets_share_one_lease_and_follow_each_other() {
        let agent = LeaseAgent::default();
        let nobody = Weak::new();
        assert!(agent.tickets_now(&nobody, 3).is_none(), "no lease yet");
        agent.hold(LeaseId(5), Instant::now(), 30_000);
        let before = agent.ticket_now(&nobody).unwrap();
        let tickets = agent.tickets_now(&nobody, 3).unwrap();
        let rpcs: Vec<(LeaseId, RpcId)> =
            tickets.iter().map(|ticket| (ticket.lease(), ticket.rpc())).collect();
        assert_eq!(rpcs, [(LeaseId(5), RpcId(2)), (LeaseId(5), RpcId(3)), (LeaseId(5), RpcId(4))]);
        drop(before);
        // Acknowledged stays below the transaction's first op while its tickets are out.
        assert!(tickets.iter().all(|ticket| ticket.identity().acknowledged == RpcId(1)));
        drop(tickets);
        assert_eq!(agent.ticket_now(&nobody).unwrap().identity().acknowledged, RpcId(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_of_a_lease_the_client_left_changes_nothing() {
        let agent = LeaseAgent::default();
        let nobody = Weak::new();
        agent.hold(LeaseId(1), Instant::now(), 30_000);
        drop(agent.ticket_now(&nobody).unwrap());
        agent.lost(LeaseId(1));
        agent.hold(LeaseId(2), Instant::now(), 30_000);
        let before = agent.ticket_now(&nobody).unwrap().identity();
        // Lease 1's renewal answer arrives late.
        agent.renewed(LeaseId(1), Instant::now(), 30_000);
        let after = agent.ticket_now(&nobody).unwrap().identity();
        assert_eq!((before.lease, after.lease), (LeaseId(2), LeaseId(2)));
        assert_eq!(after.rpc, RpcId(before.rpc.0 + 1), "no rpc id is reused");
        // Lease 2's own renewal extends it.
        tokio::time::advance(Duration::from_secs(20)).await;
        agent.renewed(LeaseId(2), Instant::now(), 30_000);
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(agent.ticket_now(&nobody).unwrap().identity().lease, LeaseId(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_gives_no_ticket_and_a_new_one_starts_at_rpc_1() {
        let agent = LeaseAgent::default();
        let nobody = Weak::new();
        assert!(agent.ticket_now(&nobody).is_none(), "no lease yet");
        agent.hold(LeaseId(1), Instant::now(), 30_000);
        let old = agent.ticket_now(&nobody).unwrap();
        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(agent.ticket_now(&nobody).is_none(), "within the margin of its end");
        agent.hold(LeaseId(2), Instant::now(), 30_000);
        let new = agent.ticket_now(&nobody).unwrap();
        assert_eq!(
            new.identity(),
            RpcIdentity { lease: LeaseId(2), rpc: RpcId(1), acknowledged: RpcId(0) }
        );
        // A ticket of the old lease ending does not touch the new lease's.
        drop(old);
        assert_eq!(new.identity().acknowledged, RpcId(0));
        agent.lost(LeaseId(1));
        assert!(agent.ticket_now(&nobody).is_some(), "losing an old lease keeps the new one");
        agent.lost(LeaseId(2));
        assert!(agent.ticket_now(&nobody).is_none());
    }
}
