//! Object expiry (a time to live): what a write asks for, and the absolute time it stores.
//!
//! Whose clock decides: the master's. A write asks for an [`Expiry`]; the master that applies
//! it turns a relative one into an absolute [`ExpiresAt`] with its own wall clock at that
//! moment, and stores that in the object (docs/design/log-format.md). From then on the object
//! is expired, everywhere, once the wall clock of the master serving it passes that time:
//! replicas, recovery, migration and cold start carry the absolute time, so no copy lives
//! longer than the one it was made from. What follows from that, as in Redis:
//! - a client's clock never matters for relative expiries (SET … EX); absolute ones (EXAT)
//!   are compared with the master's clock, so they assume the two agree;
//! - a master's clock that jumps forward expires objects early, one that jumps back keeps
//!   them longer; a tablet moved or recovered onto a master whose clock runs ahead or behind
//!   shifts its objects' expiry by the difference (NTP keeps that to milliseconds).

/// The wall-clock time at which an object expires: milliseconds since the Unix epoch, by the
/// clock of the master that serves it. An object expires when that clock reaches this time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExpiresAt(pub u64);

impl ExpiresAt {
    /// Whether an object with this expiry is expired at `now_millis`.
    pub fn has_passed(self, now_millis: u64) -> bool {
        self.0 <= now_millis
    }

    /// Milliseconds left at `now_millis` (0 once expired).
    pub fn remaining_millis(self, now_millis: u64) -> u64 {
        self.0.saturating_sub(now_millis)
    }
}

/// What a write does to the expiry of the object it writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Expiry {
    /// None: the object lives until it is removed. What a plain write means: it clears an
    /// expiry the object had (Redis's SET does the same).
    #[default]
    Never,
    /// Keep the expiry of the object being replaced (none if there is no live object).
    Keep,
    /// Expire this many milliseconds after the master applies the write.
    AfterMillis(u64),
    /// Expire at this wall-clock time, milliseconds since the Unix epoch.
    AtMillis(u64),
}

impl Expiry {
    /// The expiry to store for a write applied at `now_millis` over an object whose expiry is
    /// `current` (`None`: no live object, or one without expiry). A relative expiry too far
    /// away to add saturates: it never comes.
    pub fn resolve(self, now_millis: u64, current: Option<ExpiresAt>) -> Option<ExpiresAt> {
        match self {
            Expiry::Never => None,
            Expiry::Keep => current,
            Expiry::AfterMillis(millis) => Some(ExpiresAt(now_millis.saturating_add(millis))),
            Expiry::AtMillis(millis) => Some(ExpiresAt(millis)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_resolves_against_the_masters_clock_and_the_current_object() {
        let now = 1_700_000_000_000;
        let current = Some(ExpiresAt(now + 5_000));
        assert_eq!(Expiry::Never.resolve(now, current), None);
        assert_eq!(Expiry::Keep.resolve(now, current), current);
        assert_eq!(Expiry::Keep.resolve(now, None), None);
        assert_eq!(Expiry::AfterMillis(250).resolve(now, current), Some(ExpiresAt(now + 250)));
        assert_eq!(Expiry::AtMillis(42).resolve(now, None), Some(ExpiresAt(42)));
        assert_eq!(Expiry::AfterMillis(u64::MAX).resolve(now, None), Some(ExpiresAt(u64::MAX)));
    }

    #[test]
    fn an_object_is_expired_from_its_expiry_time_on() {
        let expires = ExpiresAt(1_000);
        assert!(!expires.has_passed(999));
        assert!(expires.has_passed(1_000));
        assert_eq!(expires.remaining_millis(400), 600);
        assert_eq!(expires.remaining_millis(2_000), 0);
    }
}
