//! Bounded exponential backoff with jitter.

use std::time::Duration;

use stratus_env::Entropy;

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
