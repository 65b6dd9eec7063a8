//! Bounded exponential backoff with jitter.

use std::time::Duration;

use stratus_env::Entropy;

/// The instant `timeout` from now on tokio's clock (virtual in a paused runtime, as the
/// simulation runs it; `std`'s is [`crate::deadline_after`]); a timeout too long to add
/// (`Duration::MAX`, say) is as good as none, and gives an instant more than a century away
/// instead of a panic.
pub fn deadline_in(timeout: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(timeout).unwrap_or(now + Duration::from_secs(1 << 32))
}

/// Delays between retries: `initial`, doubling up to `max`, each scaled by a random factor in
/// [0.5, 1.0) so that clients retrying after the same event do not retry in lockstep.
#[derive(Clone, Debug)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` and capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        assert!(initial <= max, "backoff initial delay above its cap");
        Backoff { next: initial, max }
    }

    /// The usual client retry schedule: 1 ms doubling to 100 ms.
    pub fn for_client() -> Backoff {
        Backoff::new(Duration::from_millis(1), Duration::from_millis(100))
    }

    /// The next delay to sleep before retrying.
    pub fn next_delay(&mut self, entropy: &dyn Entropy) -> Duration {
        let base = self.next;
        self.next = (self.next * 2).min(self.max);
        let jitter_per_mille = 500 + entropy.below(500);
        base * u32::try_from(jitter_per_mille).unwrap_or(1000) / 1000
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_env::SeededEntropy;

    #[test]
    fn a_deadline_too_far_to_add_saturates_instead_of_panicking() {
        let now = tokio::time::Instant::now();
        assert!(deadline_in(Duration::MAX) > now + Duration::from_secs(100 * 365 * 86_400));
        assert!(deadline_in(Duration::from_millis(5)) <= now + Duration::from_secs(5));
    }

    #[test]
    fn delays_grow_and_stay_capped() {
        let entropy = SeededEntropy::new(1);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(80));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay(&entropy)).collect();
        assert!(delays[0] >= Duration::from_millis(5) && delays[0] < Duration::from_millis(10));
        for delay in &delays {
            assert!(*delay < Duration::from_millis(80));
        }
        assert!(delays[7] >= Duration::from_millis(40));
    }
}
