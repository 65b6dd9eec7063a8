//! Reads that may wait on flash, kept off the request runtime's workers.
//!
//! A value on flash is read with one positioned read of its segment's image, inside the store
//! and under the object's bucket lock (docs/design/flash-tier.md). Requests are handled on the
//! async runtime's workers, one per core: a worker blocked in a read stops every connection
//! queued on it, and the reads in flight would be no more than the workers. So a read of a
//! table not in memory runs under `block_in_place`, which hands the worker's other tasks to
//! another thread for the read's duration: as many reads are in flight as connections ask
//! for, up to [`FLASH_READS_BLOCKING_MAX`]. Beyond it a read blocks its worker as before,
//! which slows the runtime's intake: the bound is the backpressure.
//!
//! Memory tables' reads never come here: they take no system call and must not pay a
//! thread hand-off.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Reads of flash tables that may block outside the runtime's workers at once. An SSD
/// serves its most IOPS at 32–64 reads in flight (T2 and the read benchmark use 32);
/// beyond that, more threads add latency, not throughput, and each costs a stack.
pub(crate) const FLASH_READS_BLOCKING_MAX: usize = 64;

/// Counts the flash reads running under `block_in_place`.
#[derive(Debug, Default)]
pub(crate) struct FlashReadGate {
    blocking_in_flight: AtomicUsize,
}

impl FlashReadGate {
    /// Runs `read`, off the runtime's worker when it `may_wait_on_flash`, the runtime can
    /// hand the worker's tasks over (a multi-threaded one), and fewer than
    /// [`FLASH_READS_BLOCKING_MAX`] already are; otherwise in place.
    pub(crate) fn run<T>(&self, may_wait_on_flash: bool, read: impl FnOnce() -> T) -> T {
        if !may_wait_on_flash || !on_multi_threaded_runtime() {
            return read();
        }
        let admitted = self
            .blocking_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |running| {
                (running < FLASH_READS_BLOCKING_MAX).then_some(running + 1)
            })
            .is_ok();
        if !admitted {
            return read();
        }
        let _leave = Leave(&self.blocking_in_flight);
        tokio::task::block_in_place(read)
    }

    /// Reads running off the runtime's workers now.
    #[cfg(test)]
    fn blocking_in_flight(&self) -> usize {
        self.blocking_in_flight.load(Ordering::Acquire)
    }
}

/// Gives the admission back when the read ends, also if it panics.
struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `block_in_place` panics on a current-thread runtime (tests drive masters on one) and
/// outside any runtime.
fn on_multi_threaded_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|runtime| runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn outside_a_runtime_reads_run_in_place() {
        let gate = FlashReadGate::default();
        assert_eq!(gate.run(true, || 7), 7);
        assert_eq!(gate.blocking_in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn on_a_current_thread_runtime_reads_run_in_place() {
        let gate = FlashReadGate::default();
        assert_eq!(gate.run(true, || gate.blocking_in_flight()), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flash_reads_leave_the_worker_and_memory_reads_do_not() {
        let gate = FlashReadGate::default();
        assert_eq!(gate.run(true, || gate.blocking_in_flight()), 1);
        assert_eq!(gate.run(false, || gate.blocking_in_flight()), 0);
        assert_eq!(gate.blocking_in_flight(), 0);
    }

    /// More blocked reads than workers proceed at once (the point of the gate), and no more
    /// than the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn blocked_reads_outnumber_the_workers_up_to_the_bound() {
        let gate = Arc::new(FlashReadGate::default());
        let together = 8;
        let barrier = Arc::new(Barrier::new(together));
        let reads: Vec<_> = (0..together)
            .map(|_| {
                let (gate, barrier) = (gate.clone(), barrier.clone());
                // Each read waits until all are in flight: with the two workers blocked in
                // place this would never finish.
                tokio::spawn(async move {
                    gate.run(true, || {
                        barrier.wait();
                        gate.blocking_in_flight()
                    })
                })
            })
            .collect();
        for read in reads {
            let seen = read.await.unwrap();
            assert!((1..=together).contains(&seen), "{seen}");
        }
        assert_eq!(gate.blocking_in_flight(), 0);
        // At the bound, a read runs in place (not counted).
        gate.blocking_in_flight.store(FLASH_READS_BLOCKING_MAX, Ordering::Release);
        assert_eq!(gate.run(true, || gate.blocking_in_flight()), FLASH_READS_BLOCKING_MAX);
    }
}
