//! Client leases (RIFL, docs/design/exactly-once.md): the coordinator grants each client a
//! lease id, unique in the cluster's lifetime, valid for a term after each renewal.
//!
//! Only the ids are durable, as a high-water mark reserved in blocks
//! ([`CLIENT_LEASE_IDS_PER_RESERVATION`]): an id is granted only below a mark already durable,
//! so no restart or failover grants it again. Expiry times live in the active coordinator's
//! memory: one that starts (or takes over) treats every id below the mark it loaded as valid
//! for one term from its start, so clients that renew within that term keep their leases
//! and masters keep their results; a lease not renewed expires a term later.

use std::collections::HashMap;
use std::time::Duration;

use stratus_types::limits::{
    CLIENT_LEASES_MAX, CLIENT_LEASE_IDS_PER_RESERVATION, CLIENT_LEASE_TERM_MILLIS,
};
use stratus_types::LeaseId;
use tokio::time::Instant;

/// A client lease's term.
pub(crate) const CLIENT_LEASE_TERM: Duration = Duration::from_millis(CLIENT_LEASE_TERM_MILLIS);

/// Why a lease was not granted or renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseRefusal {
    /// The lease expired (or was never granted): the client takes a new one.
    Expired,
    /// No id is reserved: reserve up to this mark durably, then ask again.
    NeedsReservation(u64),
    /// [`CLIENT_LEASES_MAX`] leases are live.
    TooMany,
}

/// A keyed permutation of the 64-bit ids: a four-round Feistel network over two 32-bit halves
/// whose round function is HMAC-SHA-256 under a key derived from the cluster secret (a
/// pseudo-random permutation, Luby–Rackoff), so every coordinator of the cluster maps a
/// sequence number to the same id, and nobody without the secret can tell which ids were
/// granted.
#[derive(Clone)]
pub struct LeaseIdPermutation {
    key: [u8; 32],
}

impl std::fmt::Debug for LeaseIdPermutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseIdPermutation(<redacted>)")
    }
}

const FEISTEL_ROUNDS: u8 = 4;

impl LeaseIdPermutation {
    /// The permutation under `key` (derived from the cluster secret for this purpose alone).
    pub fn new(key: [u8; 32]) -> LeaseIdPermutation {
        LeaseIdPermutation { key }
    }

    fn round(&self, round: u8, half: u32) -> u32 {
        use hmac::{Hmac, Mac};
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&self.key)
            .expect("HMAC takes a key of any length");
        mac.update(&[round]);
        mac.update(&half.to_le_bytes());
        let tag = mac.finalize().into_bytes();
        u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]])
    }

    /// The id clients see for sequence number `sequence`.
    pub fn hide(&self, sequence: u64) -> u64 {
        let (mut left, mut right) = ((sequence >> 32) as u32, sequence as u32);
        for round in 0..FEISTEL_ROUNDS {
            (left, right) = (right, left ^ self.round(round, right));
        }
        (u64::from(left) << 32) | u64::from(right)
    }

    /// The sequence number of the id `id` ([`LeaseIdPermutation::hide`]'s inverse).
    pub fn reveal(&self, id: u64) -> u64 {
        let (mut left, mut right) = ((id >> 32) as u32, id as u32);
        for round in (0..FEISTEL_ROUNDS).rev() {
            (left, right) = (right ^ self.round(round, left), left);
        }
        (u64::from(left) << 32) | u64::from(right)
    }
}

/// The client leases of the active coordinator.
#[derive(Debug)]
pub(crate) struct ClientLeases {
    /// When each live lease expires.
    expiries: HashMap<LeaseId, Instant>,
    /// The next id to grant.
    next_id: u64,
    /// Ids below this are durably reserved.
    reserved_below: u64,
    /// Ids below this may have been granted by an earlier coordinator: valid until
    /// `grace_until` unless known otherwise.
    inherited_below: u64,
    grace_until: Instant,
    /// Hides the sequence numbers (with a cluster secret); `None`: ids are the numbers.
    permutation: Option<LeaseIdPermutation>,
}

impl ClientLeases {
    /// The leases of a coordinator that starts now, whose metadata says ids below
    /// `reserved_below` may have been granted.
    pub(crate) fn starting(reserved_below: u64, now: Instant) -> ClientLeases {
        let reserved_below = reserved_below.max(1);
        ClientLeases {
            expiries: HashMap::new(),
            next_id: reserved_below,
            reserved_below,
            inherited_below: reserved_below,
            grace_until: now + CLIENT_LEASE_TERM,
            permutation: None,
        }
    }

    /// Hands out ids through `permutation` from now on. Set once at start, before any lease
    /// is granted: every coordinator of a cluster must use the same one.
    pub(crate) fn hide_ids(&mut self, permutation: LeaseIdPermutation) {
        debug_assert!(self.expiries.is_empty(), "ids hidden after leases were granted");
        self.permutation = Some(permutation);
    }

    fn id_of(&self, sequence: u64) -> u64 {
        self.permutation.as_ref().map_or(sequence, |permutation| permutation.hide(sequence))
    }

    fn sequence_of(&self, lease: LeaseId) -> u64 {
        self.permutation.as_ref().map_or(lease.0, |permutation| permutation.reveal(lease.0))
    }

    /// The mark was durably raised to `reserved_below`.
    pub(crate) fn reserved(&mut self, reserved_below: u64) {
        self.reserved_below = self.reserved_below.max(reserved_below);
    }

    /// A new lease, valid for a term from `now`.
    pub(crate) fn open(&mut self, now: Instant) -> Result<LeaseId, LeaseRefusal> {
        if self.expiries.len() >= CLIENT_LEASES_MAX {
            self.expiries.retain(|_, expires| *expires > now);
            if self.expiries.len() >= CLIENT_LEASES_MAX {
                return Err(LeaseRefusal::TooMany);
            }
        }
        loop {
            if self.next_id >= self.reserved_below {
                return Err(LeaseRefusal::NeedsReservation(
                    self.next_id.saturating_add(CLIENT_LEASE_IDS_PER_RESERVATION),
                ));
            }
            let lease = LeaseId(self.id_of(self.next_id));
            self.next_id += 1;
            // Id 0 asks CLIENT_LEASE for a new lease: the one sequence number the permutation
            // maps to it is skipped.
            if lease.0 != 0 {
                self.expiries.insert(lease, now + CLIENT_LEASE_TERM);
                return Ok(lease);
            }
        }
    }

    /// Renews `lease` for a term from `now`, if it is still valid.
    pub(crate) fn renew(&mut self, lease: LeaseId, now: Instant) -> Result<(), LeaseRefusal> {
        if self.remaining(lease, now).is_zero() {
            self.expiries.remove(&lease);
            return Err(LeaseRefusal::Expired);
        }
        self.expiries.insert(lease, now + CLIENT_LEASE_TERM);
        Ok(())
    }

    /// How long `lease` stays valid at least (zero: expired, or never granted).
    pub(crate) fn remaining(&self, lease: LeaseId, now: Instant) -> Duration {
        match self.expiries.get(&lease) {
            Some(expires) => expires.saturating_duration_since(now),
            None if lease.0 != 0 && self.sequence_of(lease) < self.inherited_below => {
                self.grace_until.saturating_duration_since(now)
            }
            None => Duration::ZERO,
        }
    }

    /// Live leases (for metrics).
    pub(crate) fn live(&self, now: Instant) -> usize {
        self.expiries.values().filter(|expires| **expires > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ids_are_granted_only_below_a_durable_reservation() {
        let now = Instant::now();
        let mut leases = ClientLeases::starting(1, now);
        let mark = match leases.open(now) {
            Err(LeaseRefusal::NeedsReservation(mark)) => mark,
            other => panic!("{other:?}"),
        };
        assert_eq!(mark, 1 + CLIENT_LEASE_IDS_PER_RESERVATION);
        leases.reserved(mark);
        assert_eq!(leases.open(now), Ok(LeaseId(1)));
        assert_eq!(leases.open(now), Ok(LeaseId(2)));
        // A restarted coordinator starts at the mark: no id is granted twice.
        let mut restarted = ClientLeases::starting(mark, now);
        assert!(matches!(restarted.open(now), Err(LeaseRefusal::NeedsReservation(_))));
        restarted.reserved(mark + CLIENT_LEASE_IDS_PER_RESERVATION);
        assert_eq!(restarted.open(now), Ok(LeaseId(mark)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lasts_a_term_after_each_renewal() {
        let start = Instant::now();
        let mut leases = ClientLeases::starting(1, start);
        leases.reserved(100);
        let lease = leases.open(start).unwrap();
        assert_eq!(leases.remaining(lease, start), CLIENT_LEASE_TERM);
        let later = start + CLIENT_LEASE_TERM / 2;
        leases.renew(lease, later).unwrap();
        assert_eq!(leases.remaining(lease, later), CLIENT_LEASE_TERM);
        let after = later + CLIENT_LEASE_TERM;
        assert_eq!(leases.remaining(lease, after), Duration::ZERO);
        assert_eq!(leases.renew(lease, after), Err(LeaseRefusal::Expired));
        assert_eq!(leases.renew(lease, later), Err(LeaseRefusal::Expired), "gone for good");
        assert_eq!(leases.remaining(LeaseId(99), start), Duration::ZERO, "never granted");
        assert_eq!(leases.remaining(LeaseId(0), start), Duration::ZERO);
    }

    #[test]
    fn the_permutation_is_a_bijection_that_hides_the_sequence() {
        let permutation = LeaseIdPermutation::new([7; 32]);
        let other = LeaseIdPermutation::new([8; 32]);
        let mut seen = std::collections::HashSet::new();
        for sequence in (1..2_000u64).chain([u64::MAX, 1 << 40]) {
            let id = permutation.hide(sequence);
            assert_eq!(permutation.reveal(id), sequence);
            assert!(seen.insert(id), "two numbers map to {id}");
            assert_ne!(id, other.hide(sequence));
        }
        // Consecutive numbers give ids that share nothing visible.
        let (a, b) = (permutation.hide(5), permutation.hide(6));
        assert!((a ^ b).count_ones() > 8, "{a:#x} {b:#x}");
        assert!(format!("{permutation:?}").contains("redacted"));
    }

    #[tokio::test(start_paused = true)]
    async fn hidden_ids_are_granted_renewed_and_inherited_like_plain_ones() {
        let start = Instant::now();
        let permutation = LeaseIdPermutation::new([3; 32]);
        let mut leases = ClientLeases::starting(1, start);
        leases.hide_ids(permutation.clone());
        leases.reserved(100);
        let lease = leases.open(start).unwrap();
        assert_ne!(lease.0, 1, "the id is not the sequence number");
        assert_eq!(permutation.reveal(lease.0), 1);
        leases.renew(lease, start).unwrap();
        // A successor with the same key honours it during its grace term; a guessed id is
        // not honoured.
        let mut successor = ClientLeases::starting(100, start);
        successor.hide_ids(permutation);
        assert_eq!(successor.remaining(lease, start), CLIENT_LEASE_TERM);
        assert_eq!(successor.remaining(LeaseId(2), start), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_of_an_earlier_coordinator_live_one_term_unless_renewed() {
        let start = Instant::now();
        let mut leases = ClientLeases::starting(50, start);
        assert_eq!(leases.remaining(LeaseId(7), start), CLIENT_LEASE_TERM);
        assert_eq!(leases.remaining(LeaseId(50), start), Duration::ZERO, "at the mark: new");
        let later = start + CLIENT_LEASE_TERM / 2;
        leases.renew(LeaseId(7), later).unwrap();
        let after_grace = start + CLIENT_LEASE_TERM + Duration::from_secs(1);
        assert!(leases.remaining(LeaseId(7), after_grace) > Duration::ZERO, "renewed");
        assert_eq!(leases.remaining(LeaseId(8), after_grace), Duration::ZERO, "not renewed");
        assert_eq!(leases.renew(LeaseId(8), after_grace), Err(LeaseRefusal::Expired));
    }
}
