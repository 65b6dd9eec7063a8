//! The cleaner threads: the store's cleaner run beside requests.

use std::sync::Arc;

use stratus_store::{CleanOutcome, WallTime};

use super::Master;

/// How long a cleaner thread sleeps when the balancer finds nothing to do. Short enough that
/// the cleaner reacts long before the free seglets (at least the cleaning threshold of the log)
/// run out; long enough that an idle server costs no CPU to speak of.
pub(super) const CLEANER_IDLE_SLEEP: std::time::Duration = std::time::Duration::from_millis(10);

/// How long the demoting thread waits after flash refused an image (full or failing) before it
/// tries again: each try costs a compaction of a segment, and space comes back only as the
/// cleaner deletes images.
const DEMOTION_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

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
                let mut demotion_refused = false;
                let mut demotion_paused_until = std::time::Instant::now();
                while let Some(store) = store.upgrade() {
                    let now = WallTime::from_millis(clock.now_millis());
                    // One thread moves flash tables' objects to flash, a segment at a time,
                    // before any cleaning (demotion is what frees their memory).
                    let demote = index == 0
                        && store.has_flash()
                        && std::time::Instant::now() >= demotion_paused_until;
                    if demote {
                        match store.demote_once(now) {
                            Ok(Some(_)) => {
                                demotion_refused = false;
                                continue;
                            }
                            Ok(None) => {}
                            // Full, or failing: the objects stay in memory (logged once until
                            // a demotion succeeds again); cleaning goes on.
                            Err(error) => {
                                if !demotion_refused {
                                    tracing::warn!(%error, "objects of flash tables stay in memory");
                                }
                                demotion_refused = true;
                                // Each try compacts a segment: not again at once.
                                demotion_paused_until =
                                    std::time::Instant::now() + DEMOTION_RETRY_PAUSE;
                            }
                        }
                    }
                    let outcome = store.clean_once(now);
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
