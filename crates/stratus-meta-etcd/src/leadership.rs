//! [`Leadership`]: which of several coordinators is the active one, decided by etcd.
//!
//! The active coordinator is the one whose identity is in the leader key
//! (`<namespace>leader`), a key attached to an etcd lease that the coordinator keeps alive.
//! Taking the leadership is one transaction that creates the key only if it does not exist, so
//! at most one coordinator holds it at a time. When the holder dies its lease expires after its
//! TTL, etcd deletes the key, and a standby's next attempt succeeds.
//!
//! Two rules make this safe against a holder that does not know it was deposed (paused,
//! partitioned from etcd):
//! - Every metadata write is conditional on the leader key holding the writer's identity
//!   ([`crate::EtcdMetaStore`]), so a deposed coordinator changes nothing.
//! - [`Leadership::holds`] is true only until the last renewal's send time plus the TTL etcd
//!   granted, less a margin. etcd measures the same TTL from when it received that renewal,
//!   which is later, so while `holds` is true no other coordinator can have taken over. The
//!   coordinator grants master leases only while it holds the leadership, which keeps a
//!   deposed coordinator from keeping a master alive that its successor declared crashed.
//!
//! This module reads the monotonic clock and sleeps on its own thread: it is an adapter to a
//! real external system, like the file store, and is not used by the simulator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::client::{Compare, EtcdClient, EtcdError, TxnOperation};
use crate::{deposed_key, leader_key};

/// How the leadership is held.
#[derive(Clone, Copy, Debug)]
pub struct LeadershipConfig {
    /// TTL of the leadership lease: how long after the holder's last renewal a standby can take
    /// over. etcd raises TTLs below its minimum (1.5 election timeouts rounded up to whole
    /// seconds: 2 s with its default election timeout).
    pub lease_ttl: Duration,
    /// How often a standby tries to take the leadership.
    pub standby_poll_interval: Duration,
    /// How long a coordinator that took the leadership holds it before acting on it. A
    /// predecessor that does not know it was deposed notices within a renewal (its keep-alive
    /// answers 0, or the leader key is no longer its own); waiting this long first means the two
    /// never act at once even if etcd ended the predecessor's lease early (etcd before 3.4.25
    /// and 3.5.8 could revoke leases from a stale leader: etcd-io/etcd#15247).
    pub takeover_delay: Duration,
}

impl Default for LeadershipConfig {
    fn default() -> LeadershipConfig {
        // Two seconds, etcd's least TTL with its default election timeout: a failover takes
        // about this long, and three renewals (every quarter TTL) may fail in a row before the
        // holder gives up.
        LeadershipConfig {
            lease_ttl: Duration::from_secs(2),
            standby_poll_interval: Duration::from_millis(250),
            takeover_delay: Duration::from_secs(2),
        }
    }
}

/// The share of the TTL the holder gives up before etcd would expire its lease: covers the
/// difference between this machine's clock rate and etcd's.
const SAFETY_MARGIN_DIVISOR: u32 = 10;

/// Renewals per TTL.
const RENEWALS_PER_TTL: u32 = 4;

/// How long one request of a standby may take.
const STANDBY_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// What the renewal thread checks it still owns.
#[derive(Debug)]
struct Owner {
    leader: Vec<u8>,
    identity: Vec<u8>,
    lease_id: i64,
}

/// Leadership held by this process, kept alive by a renewal thread until dropped.
#[derive(Debug)]
pub struct Leadership {
    client: Arc<EtcdClient>,
    identity: Vec<u8>,
    lease_id: i64,
    shared: Arc<Shared>,
    renewer: Option<JoinHandle<()>>,
    /// How long a recently deposed holder could still act, counted from the win.
    predecessor_grace: Option<Duration>,
}

#[derive(Debug)]
struct Shared {
    /// Until when the leadership is certainly held (renewal send time + granted TTL - margin).
    held_until: Mutex<Instant>,
    /// Why it was lost, once it was.
    lost: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Shared {
    fn lose(&self, reason: String) {
        let mut lost = self.lost.lock().unwrap_or_else(|poison| poison.into_inner());
        if lost.is_none() {
            tracing::error!(%reason, "coordinator leadership lost");
            *lost = Some(reason);
        }
    }

    /// Gives the leadership up on purpose (a clean stop): not an error.
    fn give_up(&self) {
        let mut lost = self.lost.lock().unwrap_or_else(|poison| poison.into_inner());
        if lost.is_none() {
            tracing::info!("coordinator leadership given up");
            *lost = Some("resigned".to_string());
        }
    }
}

/// The point until which a lease renewed at `sent_at` for `ttl_seconds` is certainly alive.
fn held_until(sent_at: Instant, ttl_seconds: u64) -> Instant {
    let ttl = Duration::from_secs(ttl_seconds);
    sent_at + ttl - ttl / SAFETY_MARGIN_DIVISOR
}

impl Leadership {
    /// Waits until this process holds the leadership of `namespace`, recording `identity`
    /// (what other coordinators and operators see as the holder) in the leader key. Gives up
    /// with an error only when `should_stop` returns true.
    pub fn campaign(
        client: Arc<EtcdClient>,
        namespace: &str,
        identity: &str,
        config: LeadershipConfig,
        should_stop: &dyn Fn() -> bool,
    ) -> Result<Leadership, String> {
        Self::campaign_probing(client, namespace, identity, config, should_stop, &|_| false)
    }

    /// [`Leadership::campaign`] that also asks `holder_gone` about the holder's identity on
    /// every try. When it answers true, the holder's process is gone (the caller knows how to
    /// tell: a coordinator's listening address that refuses connections), so nothing acts on
    /// its leadership any more: it is deposed at once (see [`Leadership::depose`]) and this
    /// process takes over without the TTL's wait and without the takeover delay, which guards
    /// only against a predecessor that still runs. It must mean gone, not slow: a paused or
    /// unreachable holder is waited out. Should it be wrong anyway, whoever wins learns how
    /// long the deposed holder could still act ([`Leadership::predecessor_grace`]).
    pub fn campaign_probing(
        client: Arc<EtcdClient>,
        namespace: &str,
        identity: &str,
        config: LeadershipConfig,
        should_stop: &dyn Fn() -> bool,
        holder_gone: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Leadership, String> {
        let leader = leader_key(namespace);
        let deposed = deposed_key(namespace);
        // Set when this process deposed the holder it then succeeds: no predecessor runs.
        let mut deposed_by_this_process = false;
        let ttl_seconds = config.lease_ttl.as_secs().max(1);
        let mut lease: Option<(i64, Instant, u64)> = None;
        let mut last_holder: Option<Vec<u8>> = None;
        loop {
            if should_stop() {
                if let Some((id, _, _)) = lease {
                    let _ = client.lease_revoke(id);
                }
                return Err("stopped before taking the leadership".to_string());
            }
            match Self::attempt(&client, &leader, identity, ttl_seconds, &mut lease) {
                Ok(None) => {
                    let won = lease.expect("a won attempt holds a lease");
                    let leadership =
                        Self::take_over(client, &leader, &deposed, identity.as_bytes(), won)?;
                    if !deposed_by_this_process {
                        std::thread::sleep(config.takeover_delay);
                    }
                    return match leadership.holds() {
                        true => Ok(leadership),
                        false => Err(format!(
                            "lost the leadership while taking over: {}",
                            leadership.lost().unwrap_or_default()
                        )),
                    };
                }
                Ok(Some((holder, holder_lease))) => {
                    // A holder this process did not depose (another standby won the race).
                    deposed_by_this_process = false;
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(
                            holder = %String::from_utf8_lossy(&holder),
                            "standing by: another coordinator is active"
                        );
                        last_holder = Some(holder.clone());
                    }
                    if holder_lease != 0 && holder_gone(&holder) {
                        tracing::warn!(
                            holder = %String::from_utf8_lossy(&holder),
                            "the active coordinator is gone: ending its leadership now"
                        );
                        match Self::depose(&client, &leader, &deposed, &holder, holder_lease) {
                            Ok(true) => {
                                deposed_by_this_process = true;
                                continue;
                            }
                            Ok(false) => {}
                            Err(error) => {
                                tracing::warn!(%error, "could not depose the gone holder")
                            }
                        }
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot reach etcd to take the leadership"),
            }
            std::thread::sleep(config.standby_poll_interval);
        }
    }

    /// Holds the leadership just won on `lease` (id, renewal send time, TTL): reads whether a
    /// predecessor was deposed recently (a winner that cannot tell gives the leadership back
    /// rather than guess), then starts the renewal thread.
    fn take_over(
        client: Arc<EtcdClient>,
        leader: &[u8],
        deposed: &[u8],
        identity: &[u8],
        (lease_id, sent_at, ttl): (i64, Instant, u64),
    ) -> Result<Leadership, String> {
        let identity_text = String::from_utf8_lossy(identity);
        tracing::info!(identity = %identity_text, lease_id, "took the coordinator leadership");
        let predecessor_grace = deposed_grace(&client, deposed).map_err(|error| {
            let _ = client.lease_revoke(lease_id);
            format!(
                "took the leadership but cannot read whether a predecessor was deposed: {error}"
            )
        })?;
        let shared = Arc::new(Shared {
            held_until: Mutex::new(held_until(sent_at, ttl)),
            lost: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let renewer = {
            let client = client.clone();
            let shared = shared.clone();
            let interval = Duration::from_secs(ttl) / RENEWALS_PER_TTL;
            let owner = Owner { leader: leader.to_vec(), identity: identity.to_vec(), lease_id };
            std::thread::Builder::new()
                .name("leadership-renewer".into())
                .spawn(move || renew(&client, &owner, interval, &shared))
                .map_err(|error| format!("starting the renewal thread: {error}"))?
        };
        Ok(Leadership {
            client,
            identity: identity.to_vec(),
            lease_id,
            shared,
            renewer: Some(renewer),
            predecessor_grace,
        })
    }

    /// Deposes `holder` (whose leader key is on `holder_lease`): in one transaction, if the
    /// leader key still names it, deletes that key and records the holder in the deposed key,
    /// on a fresh lease as long as the holder's own TTL plus a second: as long as it could
    /// still believe itself active, were it alive after all. Then revokes the holder's lease,
    /// so a live holder's renewer learns at its next renewal. False when there is nothing to
    /// depose (the key changed, or the lease ended meanwhile: the usual path takes over).
    fn depose(
        client: &EtcdClient,
        leader: &[u8],
        deposed: &[u8],
        holder: &[u8],
        holder_lease: i64,
    ) -> Result<bool, EtcdError> {
        let (left, granted) = client.lease_time_to_live(holder_lease)?;
        if left == 0 || granted == 0 {
            return Ok(false);
        }
        let (marker_lease, _) = client.lease_grant(granted + 1)?;
        let outcome = client.txn(
            &[Compare::ValueEquals { key: leader.to_vec(), value: holder.to_vec() }],
            &[
                TxnOperation::Delete { key: leader.to_vec() },
                TxnOperation::Put {
                    key: deposed.to_vec(),
                    value: holder.to_vec(),
                    lease: marker_lease,
                },
            ],
            &[],
        )?;
        if !outcome.succeeded {
            let _ = client.lease_revoke(marker_lease);
            return Ok(false);
        }
        if let Err(error) = client.lease_revoke(holder_lease) {
            tracing::warn!(%error, "deposed the holder, but its lease lives on until it expires");
        }
        Ok(true)
    }

    /// One try: renews (or grants) this standby's lease, then creates the leader key if it is
    /// absent. Ok(None): won; Ok(Some((holder, its lease))): someone else holds it (lease 0:
    /// it vanished between the comparison and the read). A key that already holds
    /// this identity on this lease is a win too: an earlier try's transaction was applied but
    /// its answer lost (identities are unique per process start).
    fn attempt(
        client: &EtcdClient,
        leader: &[u8],
        identity: &str,
        ttl_seconds: u64,
        lease: &mut Option<(i64, Instant, u64)>,
    ) -> Result<Option<(Vec<u8>, i64)>, EtcdError> {
        // Renew before every try, so that a won key's lease has a known, recent start.
        let sent_at = Instant::now();
        let renewed = match *lease {
            Some((id, _, _)) => match client.lease_keep_alive(id, STANDBY_REQUEST_TIMEOUT)? {
                0 => None,
                ttl => Some((id, sent_at, ttl)),
            },
            None => None,
        };
        *lease = match renewed {
            Some(renewed) => Some(renewed),
            None => {
                let sent_at = Instant::now();
                let (id, ttl) = client.lease_grant(ttl_seconds)?;
                Some((id, sent_at, ttl))
            }
        };
        let (lease_id, _, _) = lease.expect("just set");
        let outcome = client.txn(
            &[Compare::Absent { key: leader.to_vec() }],
            &[TxnOperation::Put {
                key: leader.to_vec(),
                value: identity.as_bytes().to_vec(),
                lease: lease_id,
            }],
            &[TxnOperation::Get { key: leader.to_vec() }],
        )?;
        if outcome.succeeded {
            return Ok(None);
        }
        let holder = outcome.ranges.first().and_then(|pairs| pairs.first());
        match holder {
            Some(pair) if pair.value == identity.as_bytes() && pair.lease == lease_id => Ok(None),
            Some(pair) => Ok(Some((pair.value.clone(), pair.lease))),
            // Expired between the comparison and the read: try again.
            None => Ok(Some((Vec::new(), 0))),
        }
    }

    /// When a holder was deposed shortly before this process took the leadership (by this
    /// process or by another standby that lost the race to it): how much longer, from when
    /// this process won, that holder could believe itself active were it alive after all.
    /// What it does meanwhile on its own authority (a coordinator: granting master leases)
    /// must be allowed for.
    pub fn predecessor_grace(&self) -> Option<Duration> {
        self.predecessor_grace
    }

    /// The identity in the leader key: the fence for [`crate::EtcdMetaStore`].
    pub fn identity(&self) -> &[u8] {
        &self.identity
    }

    /// True while no other coordinator can hold the leadership.
    pub fn holds(&self) -> bool {
        if self.lost().is_some() {
            return false;
        }
        let held_until =
            *self.shared.held_until.lock().unwrap_or_else(|poison| poison.into_inner());
        if Instant::now() < held_until {
            return true;
        }
        self.shared.lose("the leadership lease could not be renewed in time".to_string());
        false
    }

    /// Why the leadership was lost, once it was. It is never regained: a coordinator that lost
    /// it must stop (its successor may already have changed the metadata).
    pub fn lost(&self) -> Option<String> {
        self.shared.lost.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    /// Gives the leadership up now (a clean stop), so a standby takes over at once instead of
    /// after the TTL. The leadership is lost first (so nothing is granted on it from then on),
    /// then its lease revoked. Shared holders may call it: the renewer stops at its next step.
    pub fn resign(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.give_up();
        if let Err(error) = self.client.lease_revoke(self.lease_id) {
            tracing::warn!(%error, "could not revoke the leadership lease; it will expire");
        }
    }

    fn stop_renewing(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(renewer) = self.renewer.take() {
            let _ = renewer.join();
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

/// The renewal thread: renews at once, then every `interval`, until stopped or lost. Each
/// renewal may take `interval` per member, so a slow member costs one renewal, not the
/// leadership. After each renewal it checks that the leader key is still this holder's: a key
/// deleted by hand, or revoked early by etcd, loses the leadership even if the lease lives.
fn renew(client: &EtcdClient, owner: &Owner, interval: Duration, shared: &Shared) {
    // Sleep in short steps so that a stop is noticed quickly.
    let step = interval.min(Duration::from_millis(50));
    let mut next = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(step);
            continue;
        }
        next = Instant::now() + interval;
        let sent_at = Instant::now();
        let renewed = client.lease_keep_alive(owner.lease_id, interval).and_then(|ttl| {
            let pairs = client.range(&owner.leader, &[])?;
            let ours = pairs.iter().any(|pair| {
                pair.key == owner.leader
                    && pair.value == owner.identity
                    && pair.lease == owner.lease_id
            });
            Ok((ttl, ours))
        });
        match renewed {
            Ok((0, _)) => {
                shared.lose("the leadership lease expired in etcd".to_string());
                return;
            }
            Ok((_, false)) => {
                shared.lose("the leader key is no longer this coordinator's".to_string());
                return;
            }
            Ok((ttl, true)) => {
                *shared.held_until.lock().unwrap_or_else(|poison| poison.into_inner()) =
                    held_until(sent_at, ttl);
            }
            Err(error) => {
                let held_until =
                    *shared.held_until.lock().unwrap_or_else(|poison| poison.into_inner());
                tracing::warn!(%error, "leadership lease not renewed");
                if Instant::now() >= held_until {
                    shared.lose(format!("the leadership lease could not be renewed: {error}"));
                    return;
                }
            }
        }
    }
}

/// The time left on the deposed key's lease, plus a second for its whole-second rounding;
/// None when no holder was deposed recently (no key, or its lease ended).
fn deposed_grace(client: &EtcdClient, deposed: &[u8]) -> Result<Option<Duration>, EtcdError> {
    let pairs = client.range(deposed, &[])?;
    let Some(pair) = pairs.into_iter().find(|pair| pair.key == deposed) else { return Ok(None) };
    if pair.lease == 0 {
        return Ok(None);
    }
    let (left, _) = client.lease_time_to_live(pair.lease)?;
    Ok((left > 0).then(|| Duration::from_secs(left + 1)))
}
