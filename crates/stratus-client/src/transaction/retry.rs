//! When [`Client::run_transaction`](crate::Client::run_transaction) (and its blocking twin)
//! runs a transaction again after a conflict.

use std::time::Duration;

use stratus_env::Entropy;
use stratus_rpc::Backoff;

/// The first pause after a conflict: about a commit's two round trips, the time the
/// conflicting transaction needs to finish (its locks last from its PREPARE to its decision).
const CONFLICT_PAUSE_INITIAL: Duration = Duration::from_millis(1);

/// The longest pause: doubling from 1 ms, reached after six conflicts in a row, when many
/// clients contend for the same objects; the jitter (each pause is scaled by a random factor
/// in [0.5, 1)) spreads their next attempts over this much.
const CONFLICT_PAUSE_MAX: Duration = Duration::from_millis(64);

/// Attempts at most: 32 attempts pause about 1.7 s in all at most, a few seconds of a
/// hopeless contention before the caller hears of it; the client's operation timeout since
/// the first attempt bounds them too.
const TRANSACTION_ATTEMPTS_MAX: u32 = 32;

/// The retry budget of one call.
#[derive(Debug)]
pub(crate) struct ConflictRetries {
    backoff: Backoff,
    attempts: u32,
    /// No attempt starts later than this after the first.
    time_budget: Duration,
}

impl ConflictRetries {
    /// The budget of a call that started its first attempt now, bounded by `time_budget`
    /// (the client's operation timeout).
    pub(crate) fn new(time_budget: Duration) -> ConflictRetries {
        ConflictRetries {
            backoff: Backoff::new(CONFLICT_PAUSE_INITIAL, CONFLICT_PAUSE_MAX),
            attempts: 1,
            time_budget,
        }
    }

    /// After an attempt aborted in a conflict, `elapsed` since the first attempt started: the
    /// pause before the next attempt, or `None` when the attempts are spent or the next would
    /// start past the time budget.
    pub(crate) fn next_pause(
        &mut self,
        entropy: &dyn Entropy,
        elapsed: Duration,
    ) -> Option<Duration> {
        if self.attempts >= TRANSACTION_ATTEMPTS_MAX {
            return None;
        }
        let pause = self.backoff.next_delay(entropy);
        if elapsed.saturating_add(pause) >= self.time_budget {
            return None;
        }
        self.attempts += 1;
        Some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_env::SeededEntropy;

    #[test]
    fn conflicts_are_retried_with_growing_pauses_a_bounded_number_of_times() {
        let entropy = SeededEntropy::new(7);
        let mut retries = ConflictRetries::new(Duration::from_secs(10));
        let pauses: Vec<Duration> =
            std::iter::from_fn(|| retries.next_pause(&entropy, Duration::ZERO)).collect();
        assert_eq!(pauses.len(), TRANSACTION_ATTEMPTS_MAX as usize - 1);
        assert!(pauses[0] >= CONFLICT_PAUSE_INITIAL / 2 && pauses[0] < CONFLICT_PAUSE_INITIAL);
        assert!(pauses.iter().all(|pause| *pause < CONFLICT_PAUSE_MAX));
        assert!(pauses.last().is_some_and(|pause| *pause >= CONFLICT_PAUSE_MAX / 2));
        let total: Duration = pauses.iter().sum();
        assert!(total < Duration::from_secs(2), "{total:?}");
    }

    #[test]
    fn no_attempt_starts_past_the_time_budget() {
        let entropy = SeededEntropy::new(7);
        let mut retries = ConflictRetries::new(Duration::from_millis(100));
        assert!(retries.next_pause(&entropy, Duration::from_millis(10)).is_some());
        assert!(retries.next_pause(&entropy, Duration::from_millis(100)).is_none());
    }
}
