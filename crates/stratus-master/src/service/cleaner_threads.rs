//! The cleaner threads: the store's cleaner run beside requests.

use std::sync::Arc;

use stratus_store::{CleanOutcome, WallTime};

use super::Master;

/// How long a cleaner thread sleeps when the balancer finds nothing to do. Short enough that
/// the cleaner reacts long before the free seglets (at least the cleaning threshold of the log)
/// run out; long enough that an idle server costs no CPU to speak of.
pub(super) const CLEANER_IDLE_SLEEP: std::time::Duration = std::time::Duration::from_millis(10);

impl Master {
    /// Starts the log cleaner on `threads` threads of its own, concurrent with requests: each
    /// asks the store for one unit of work at a time (the store's balancer decides whether to
    /// clean and how; only one thread at a time runs combined cleaning, the others compact).
    /// The threads end when the master is dropped, or once survivors can no longer be made
    /// durable (the master was declared crashed, or replication stopped).
    pub fn start_cleaner(&self, threads: usize) -> std::io::Result<()> {
        for index in 0..threads {
            let store = Arc::downgrade(&self.store);
            let clock = self.wall_clock.clone();
            std::thread::Builder::new().name(format!("cleaner-{index}")).spawn(move || {
                while let Some(store) = store.upgrade() {
                    let outcome = store.clean_once(WallTime::from_millis(clock.now_millis()));
                    drop(store);
                    match outcome {
                        // Fenced, or replication stopped: no survivor can become durable
                        // again, so no combined pass can finish; this thread is done.
                        CleanOutcome::SurvivorsNotDurable(error) if error.is_final() => {
                            tracing::warn!(%error, "the cleaner stops");
                            return;
                        }
                        CleanOutcome::Idle
                        | CleanOutcome::NothingToClean
                        | CleanOutcome::SurvivorsNotDurable(_) => {
                            std::thread::sleep(CLEANER_IDLE_SLEEP)
                        }
                        CleanOutcome::Combined { .. }
                        | CleanOutcome::Compacted { .. }
                        | CleanOutcome::IndexResized => {}
                    }
                }
            })?;
        }
        Ok(())
    }
}
