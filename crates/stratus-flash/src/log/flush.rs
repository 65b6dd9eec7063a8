//! Flushing: write sealed buffers to the device in log order, fdatasync, advance the durable
//! end, recycle the buffers (processing → ready), and retire cleaned segments whose copies are
//! now durable.

use std::sync::atomic::Ordering;

use super::{lock, FlashLog};
use crate::address::FlashAddress;
use crate::aligned::align_up;
use crate::buffers::NO_SLOT;
use crate::error::FlashError;

/// What one `flush_ready` call did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlushProgress {
    /// Buffers written and synced.
    pub buffers_written: usize,
    /// The next buffer is sealed but an appender is still copying into it: call again.
    pub waiting_for_appenders: bool,
}

impl FlashLog {
    /// Writes every sealed buffer, in log order, stopping at the first that is not sealed or
    /// still has an appender copying; then one fdatasync per segment written, and only then
    /// are the buffers counted durable and recycled (several sealed buffers share one sync).
    /// On a device error nothing of this call is counted durable: the buffers stay sealed
    /// (their entries stay readable from DRAM and are not acknowledged) and the next call
    /// writes them again.
    pub fn flush_ready(&self) -> Result<FlushProgress, FlashError> {
        let mut progress = FlushProgress::default();
        let mut flusher = lock(&self.flusher);
        let geometry = self.config.geometry;
        // (buffer index, slot, fill) of each buffer written by this call, in log order.
        let mut written: Vec<(usize, u64, u64)> = Vec::new();
        let mut index = flusher.next;
        // Bounded by the ring: a buffer written here stays sealed until recycled below.
        while written.len() < self.buffers.len() {
            let buffer = &self.buffers[index];
            let slot = buffer.base();
            let (fill, sealed) = buffer.fill();
            if slot == NO_SLOT || !sealed {
                break;
            }
            if buffer.writers() > 0 {
                progress.waiting_for_appenders = true;
                break;
            }
            let write_bytes = align_up(fill) as usize;
            let staging = flusher.staging.as_mut_slice();
            buffer.load_words(0, &mut staging[..fill as usize]);
            staging[fill as usize..write_bytes].fill(0);
            let address = FlashAddress(slot);
            let (segment, offset) =
                (geometry.segment_of(address), geometry.offset_in_segment(address));
            self.device.write_at(segment, offset, &flusher.staging.as_slice()[..write_bytes])?;
            written.push((index, slot, fill));
            index = (index + 1) % self.buffers.len();
        }
        let mut synced = None;
        for &(_, slot, _) in &written {
            let segment = geometry.segment_of(FlashAddress(slot));
            if synced != Some(segment) {
                self.device.sync(segment)?;
                synced = Some(segment);
            }
        }
        for &(index, slot, fill) in &written {
            self.count_durable(slot, fill);
            self.buffers[index].recycle();
            flusher.next = (index + 1) % self.buffers.len();
            progress.buffers_written += 1;
        }
        drop(flusher);
        self.table().retire_cleaned(self.durable_end.load(Ordering::SeqCst));
        self.reclaim()?;
        Ok(progress)
    }

    /// Accounts a synced slot: its entry bytes, its segment closed if it was the last slot,
    /// and the durable end past it, before its buffer is recycled (a reader that finds the
    /// buffer gone then reads the device).
    fn count_durable(&self, slot: u64, fill: u64) {
        let geometry = self.config.geometry;
        let address = FlashAddress(slot);
        let segment = geometry.segment_of(address);
        let mut table = self.table();
        table.add_appended(segment, fill - self.prefix_bytes(slot));
        if geometry.offset_in_segment(address) + geometry.buffer_bytes() == geometry.segment_bytes()
        {
            table.close(segment);
        }
        drop(table);
        self.durable_end.store(slot + geometry.buffer_bytes(), Ordering::SeqCst);
    }

    /// Seals the current buffer and flushes until every entry appended before the call is
    /// durable. Returns the durable end.
    pub fn sync(&self) -> Result<FlashAddress, FlashError> {
        self.seal_current();
        loop {
            let progress = self.flush_ready()?;
            if !progress.waiting_for_appenders {
                return Ok(self.durable_end());
            }
            // An appender is between its reservation and the end of its copy: a few hundred
            // nanoseconds of memcpy, never a wait on anything else.
            std::thread::yield_now();
        }
    }
}
