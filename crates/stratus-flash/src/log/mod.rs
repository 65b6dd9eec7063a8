//! The flash log: appends into DRAM flush buffers, flushes them to the device in log order,
//! reads from a buffer or the device, and tracks segments for the cleaner.
//!
//! Concurrency: `append` and `read` take `&self` and run on any number of threads (appends are
//! lock-free except when a buffer fills; reads take the segment table's lock twice, briefly, to
//! register and end their read epoch).
//! `flush_ready`, `sync` and cleaning may run on any thread, serialised by their own locks.
//! The log itself never starts threads or reads clocks: the caller drives flushes, or runs the
//! optional background flusher in [`crate::io`]. That keeps it usable in the deterministic
//! simulator.

mod append;
mod flush;
mod read;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::address::{FlashAddress, Geometry, SegmentNumber, SEGMENT_NUMBER_FIRST};
use crate::aligned::AlignedBuffer;
use crate::buffers::FlushBuffer;
use crate::constants::{
    CLEANER_RESERVE_SEGMENTS_DEFAULT, FLUSH_BUFFERS_DEFAULT, FLUSH_BUFFERS_MAX, FLUSH_BUFFERS_MIN,
};
use crate::device::FlashDevice;
use crate::error::FlashError;
use crate::segments::{CostBenefit, SegmentStats, SegmentTable};

pub(crate) use append::Appender;
pub use flush::FlushProgress;

/// How a log is laid out and run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashConfig {
    /// Segment and buffer sizes.
    pub geometry: Geometry,
    /// Number of flush buffers (`FLUSH_BUFFERS_MIN..=FLUSH_BUFFERS_MAX`).
    pub flush_buffers: usize,
    /// Identifies the log in every segment header, so a restart refuses another log's segments.
    pub log_id: u64,
    /// How the cleaner ranks segments.
    pub cost_benefit: CostBenefit,
    /// Segments of the device's budget that only the cleaner's relocations may allocate, so a
    /// full disk can still be cleaned (`Full` for everyone else once only these are left).
    pub cleaner_reserve_segments: u64,
}

impl FlashConfig {
    /// The defaults (8 MiB segments, four 1 MiB buffers) for the log `log_id`.
    pub fn new(log_id: u64) -> FlashConfig {
        FlashConfig {
            geometry: Geometry::DEFAULT,
            flush_buffers: FLUSH_BUFFERS_DEFAULT,
            log_id,
            cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
            cleaner_reserve_segments: CLEANER_RESERVE_SEGMENTS_DEFAULT,
        }
    }
}

impl FlashConfig {
    /// Checks what the geometry alone cannot: the number of flush buffers is within bounds and
    /// at most the slots of a segment. Buffers in flight (sealed or current) then span at most
    /// two segments, so after a crash only the highest segment can lack its header (the
    /// restart scan discards it); with more buffers than slots, several segments could be
    /// allocated ahead of the flusher and a crash would leave header-less ones below the
    /// highest, which recovery must refuse.
    pub fn check(&self) -> Result<(), FlashError> {
        let slots_per_segment = self.geometry.segment_bytes() / self.geometry.buffer_bytes();
        let in_bounds = (FLUSH_BUFFERS_MIN..=FLUSH_BUFFERS_MAX).contains(&self.flush_buffers);
        if !in_bounds || self.flush_buffers as u64 > slots_per_segment {
            return Err(FlashError::FlushBuffersInvalid {
                flush_buffers: self.flush_buffers,
                slots_per_segment,
            });
        }
        Ok(())
    }
}

/// The head: which buffer is current and which slot comes next. Changed only under its lock.
#[derive(Debug)]
struct Head {
    /// Index of the buffer assigned last (the current one, unless it is sealed).
    current: usize,
    /// The address of the next slot to assign.
    next_slot: u64,
}

/// The flusher's place in the ring.
#[derive(Debug)]
struct Flusher {
    /// Index of the next buffer to write (buffers are assigned and written in ring order, which
    /// is address order).
    next: usize,
    /// Aligned staging for a buffer's bytes on their way to the device.
    staging: AlignedBuffer,
}

/// The flash log; see the module documentation.
#[derive(Debug)]
pub struct FlashLog {
    device: Arc<dyn FlashDevice>,
    config: FlashConfig,
    buffers: Box<[FlushBuffer]>,
    /// Hint for appenders: the index of the current buffer.
    current: AtomicUsize,
    head: Mutex<Head>,
    flusher: Mutex<Flusher>,
    /// Every address below this is on the device and synced.
    durable_end: AtomicU64,
    table: Mutex<SegmentTable>,
    /// Serialises `reclaim`.
    reclaiming: Mutex<()>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves no half-done state that matters more than
    // the panic itself; later callers go on.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FlashLog {
    /// A new, empty log on `device`, which must hold no segments (use [`crate::recover`] for a
    /// device that does).
    pub fn create(
        device: Arc<dyn FlashDevice>,
        config: FlashConfig,
    ) -> Result<FlashLog, FlashError> {
        config.check()?;
        if !device.segments()?.is_empty() {
            return Err(FlashError::DeviceNotEmpty);
        }
        Ok(FlashLog::with_table(
            device,
            config,
            SegmentTable::new(config.geometry.segment_bytes()),
            SEGMENT_NUMBER_FIRST,
        ))
    }

    pub(crate) fn with_table(
        device: Arc<dyn FlashDevice>,
        config: FlashConfig,
        table: SegmentTable,
        first_segment: SegmentNumber,
    ) -> FlashLog {
        assert_eq!(config.check(), Ok(()), "a log opened with a config not checked");
        let geometry = config.geometry;
        let buffers =
            (0..config.flush_buffers).map(|_| FlushBuffer::new(geometry.buffer_bytes())).collect();
        let first_slot = geometry.segment_start(first_segment).0;
        FlashLog {
            device,
            config,
            buffers,
            current: AtomicUsize::new(config.flush_buffers - 1),
            head: Mutex::new(Head { current: config.flush_buffers - 1, next_slot: first_slot }),
            flusher: Mutex::new(Flusher {
                next: 0,
                staging: AlignedBuffer::zeroed(geometry.buffer_bytes() as usize),
            }),
            durable_end: AtomicU64::new(first_slot),
            table: Mutex::new(table),
            reclaiming: Mutex::new(()),
        }
    }

    /// The log's configuration.
    pub fn config(&self) -> &FlashConfig {
        &self.config
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn FlashDevice> {
        &self.device
    }

    /// Every address below this is on the device and synced: an entry is acknowledged durable
    /// once it ends at or below it.
    pub fn durable_end(&self) -> FlashAddress {
        FlashAddress(self.durable_end.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Records `bytes` at `address` as dead (its object was overwritten or deleted, or its
    /// tombstone is no longer needed), for the cleaner's live-byte counts. Contract: each entry
    /// is noted dead at most once, with its `entry_bytes`. Noting more than a segment holds is
    /// a caller's bug: a debug assertion in tests, clamped in release builds (the counts only
    /// steer which segment is cleaned first; cleaning relocates whatever the index says is
    /// live).
    pub fn note_dead(&self, address: FlashAddress, bytes: usize) {
        let segment = self.config.geometry.segment_of(address);
        lock(&self.table).note_dead(segment, bytes as u64);
    }

    /// Every segment's state and live bytes, in log order.
    pub fn segment_stats(&self) -> Vec<SegmentStats> {
        lock(&self.table).stats()
    }

    /// Closed segments worth cleaning, best first by the configured cost-benefit formula.
    pub fn segments_to_clean(&self) -> Vec<SegmentNumber> {
        lock(&self.table).candidates(self.config.cost_benefit)
    }

    /// Frees every retired segment no read can still point into, in the order they were
    /// retired. Called by `flush_ready`; call it also after reads end when space is needed.
    /// A segment whose free fails stays `Freeing` (holding its budget) and is retried by the
    /// next call; the segments retired after it wait for it (see below).
    pub fn reclaim(&self) -> Result<usize, FlashError> {
        // One reclaim at a time: a segment stays in the table until its free succeeded, so two
        // calls could otherwise free it twice.
        let _reclaiming = lock(&self.reclaiming);
        let reclaimable = lock(&self.table).reclaimable();
        let mut freed = 0;
        for &segment in &reclaimable {
            // In retirement order, stopping at the first failure: a segment retired later may
            // hold the last copy of a tombstone that protects against an entry of this one (the
            // cleaner dropped the tombstone because this segment was already going), so freeing
            // it first would let a crash bring that entry back.
            self.device.free(segment)?;
            lock(&self.table).forget(segment);
            freed += 1;
        }
        Ok(freed)
    }

    pub(crate) fn table(&self) -> MutexGuard<'_, SegmentTable> {
        lock(&self.table)
    }
}

#[cfg(test)]
mod tests;
