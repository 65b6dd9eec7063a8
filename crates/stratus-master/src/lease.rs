//! The master's lease (docs/design/recovery.md, "Zombies"): a master serves requests only while
//! the coordinator has recently confirmed that it is a member of the cluster.
//!
//! The master asks for the lease (RENEW_LEASE) and counts it from the moment it *sent* the
//! request, so its lease ends no later than the coordinator's idea of it, which counts from when
//! the request *arrived*. The coordinator declares a master crashed only after the lease it last
//! granted has run out, and grants none after that. So a master that was paused (SIGSTOP, a long
//! stall) and resumes after being declared crashed finds its lease expired before it serves
//! anything, asks again, is told it crashed, and exits: it serves no stale read and acknowledges
//! no write after its tablets moved. Time is tokio's monotonic clock, so a simulator with paused
//! time drives leases too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::ServerId;
use stratus_wire::{Request, Response, ResponseBody, Status};

/// Time between two lease requests: several per lease, so one lost request or a slow
/// coordinator does not let the lease run out.
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_millis(150);

/// How long one lease request may take before the next is sent.
const LEASE_REQUEST_TIMEOUT: Duration = Duration::from_millis(250);

/// A master's permission to serve.
#[derive(Debug)]
pub struct Lease {
    /// Monotonic origin of the nanosecond counters below.
    origin: Instant,
    /// Nanoseconds after `origin` when the lease ends; 0 before the first grant.
    expires_nanos: AtomicU64,
    /// The coordinator said this server was declared crashed: never serve again.
    crashed: AtomicBool,
    /// The server is stopping in order and gave its lease up: never serve again.
    surrendered: AtomicBool,
}

impl Default for Lease {
    fn default() -> Lease {
        Lease {
            origin: Instant::now(),
            expires_nanos: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            surrendered: AtomicBool::new(false),
        }
    }
}

impl Lease {
    /// A lease not granted yet.
    pub fn new() -> Arc<Lease> {
        Arc::new(Lease::default())
    }

    fn nanos_since_origin(&self, instant: Instant) -> u64 {
        u64::try_from(instant.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    /// True while the master may serve.
    pub fn valid(&self) -> bool {
        !self.crashed.load(Ordering::Acquire)
            && !self.surrendered.load(Ordering::Acquire)
            && self.nanos_since_origin(Instant::now()) < self.expires_nanos.load(Ordering::Acquire)
    }

    /// The server stops in order: from now on it serves nothing, before it tells the
    /// coordinator (whose recovery of its tablets then cannot overlap a request it serves).
    pub fn surrender(&self) {
        self.surrendered.store(true, Ordering::Release);
    }

    /// Records a grant of `length` for a request sent at `sent_at`.
    pub fn granted(&self, sent_at: Instant, length: Duration) {
        let until = self.nanos_since_origin(sent_at + length);
        self.expires_nanos.fetch_max(until, Ordering::AcqRel);
    }

    /// The coordinator declared this server crashed.
    pub fn mark_crashed(&self) {
        self.crashed.store(true, Ordering::Release);
    }

    /// True once the coordinator declared this server crashed.
    pub fn is_crashed(&self) -> bool {
        self.crashed.load(Ordering::Acquire)
    }
}

/// Keeps `lease` renewed with the coordinator until the coordinator says this server crashed.
pub async fn keep_lease(
    lease: Arc<Lease>,
    server_id: ServerId,
    coordinator: String,
    network: Arc<dyn stratus_env::Network>,
) {
    let config = RpcConfig { request_timeout: LEASE_REQUEST_TIMEOUT, ..RpcConfig::default() };
    let pool = ChannelPool::new(network, config);
    let request = Request::RenewLease { server_id };
    let mut failures = 0u64;
    loop {
        let sent_at = Instant::now();
        match pool.call_coordinator(&coordinator, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::RenewLease { lease_ms }))) => {
                lease.granted(sent_at, Duration::from_millis(u64::from(lease_ms)));
                failures = 0;
            }
            // A server that stops in order is refused its lease once it said so: not news.
            _ if lease.surrendered.load(Ordering::Acquire) => return,
            Ok((Status::ServerCrashed, _)) => {
                tracing::error!(%server_id, "the coordinator declared this server crashed");
                lease.mark_crashed();
                return;
            }
            other => {
                failures += 1;
                // Once per second of failures, not every attempt.
                if failures % 7 == 1 {
                    tracing::warn!(%server_id, ?other, "lease not renewed");
                }
            }
        }
        tokio::time::sleep(LEASE_RENEW_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_surrendered_lease_is_never_valid_again() {
        let lease = Lease::new();
        lease.granted(Instant::now(), Duration::from_secs(60));
        assert!(lease.valid());
        lease.surrender();
        assert!(!lease.valid());
        lease.granted(Instant::now(), Duration::from_secs(60));
        assert!(!lease.valid(), "a later grant does not bring it back");
    }

    #[test]
    fn a_lease_counts_from_the_request_and_ends() {
        let lease = Lease::new();
        assert!(!lease.valid(), "no lease before the first grant");
        lease.granted(Instant::now(), Duration::from_secs(60));
        assert!(lease.valid());
        // A grant for an older request never shortens the lease.
        lease.granted(Instant::now() - Duration::from_secs(120), Duration::from_secs(1));
        assert!(lease.valid());
        lease.mark_crashed();
        assert!(!lease.valid());
        assert!(lease.is_crashed());

        let expired = Lease::new();
        expired.granted(Instant::now() - Duration::from_secs(2), Duration::from_secs(1));
        assert!(!expired.valid(), "a grant for a request sent 2 s ago, lasting 1 s, is over");
    }
}
