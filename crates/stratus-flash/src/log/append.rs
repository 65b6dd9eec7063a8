//! Appending: reserve in the current buffer with a compare-and-swap on its fill offset, copy
//! concurrently (T2's two-step write), and move the head to the next ready buffer when the
//! current one is full.

use std::sync::atomic::Ordering;

use super::{lock, FlashLog};
use crate::address::FlashAddress;
use crate::buffers::{Reservation, NO_SLOT};
use crate::constants::KEY_BYTES_MAX;
use crate::error::FlashError;
use crate::format::{EntryRef, SegmentHeader};

/// Who appends: the cleaner may use the segments reserved for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Appender {
    /// Everyone but the cleaner.
    Client,
    /// The cleaner's relocations.
    Cleaner,
}

impl FlashLog {
    /// Appends one entry; returns its address. The entry is readable at once and durable once
    /// [`FlashLog::durable_end`] passes it.
    pub fn append(&self, entry: &EntryRef<'_>) -> Result<FlashAddress, FlashError> {
        Ok(self.append_all(std::slice::from_ref(entry))?[0])
    }

    /// Appends entries contiguously in one reservation, so they reach the device in one write:
    /// an overwrite appends the new object *then* the tombstone of the old version, so a prefix
    /// of a torn write that holds the tombstone holds the new object too (a tombstone without
    /// it would kill the acknowledged old version and leave nothing). A prefix with the object
    /// but not the tombstone is safe: the new version wins by version, and the restart scan
    /// records the old version's segment as holding a stale copy (no tombstone names it).
    pub fn append_all(&self, entries: &[EntryRef<'_>]) -> Result<Vec<FlashAddress>, FlashError> {
        self.append_all_as(entries, Appender::Client)
    }

    /// `append_all` for `appender`: only the cleaner may allocate the reserved segments.
    pub(crate) fn append_all_as(
        &self,
        entries: &[EntryRef<'_>],
        appender: Appender,
    ) -> Result<Vec<FlashAddress>, FlashError> {
        let mut total_bytes = 0;
        for entry in entries {
            if entry.key.len() > KEY_BYTES_MAX {
                return Err(FlashError::KeyTooLarge { key_bytes: entry.key.len() });
            }
            // What the decoder would reject must not reach the log: the restart scan would
            // skip the rest of the slot, entries appended after this one included.
            entry.check().map_err(|error| FlashError::InvalidEntry { error })?;
            total_bytes += entry.encoded_bytes();
        }
        let entry_bytes_max = self.config.geometry.entry_bytes_max();
        if total_bytes > entry_bytes_max {
            return Err(FlashError::EntryTooLarge { entry_bytes: total_bytes, entry_bytes_max });
        }
        let mut encoded = vec![0u8; total_bytes];
        let mut offsets = Vec::with_capacity(entries.len());
        let mut position = 0;
        for entry in entries {
            let length = entry.encoded_bytes();
            entry.encode_into(&mut encoded[position..position + length]);
            offsets.push(position as u64);
            position += length;
        }
        loop {
            let index = self.current.load(Ordering::SeqCst);
            let buffer = &self.buffers[index];
            let slot = buffer.base();
            if slot != NO_SLOT {
                if let Reservation::Reserved(guard) = buffer.reserve(slot, total_bytes as u64) {
                    guard.copy(&encoded);
                    let start = slot + guard.offset;
                    return Ok(offsets.iter().map(|offset| FlashAddress(start + offset)).collect());
                }
            }
            self.advance_head(appender)?;
        }
    }

    /// Makes a buffer current if none is (the current one is sealed, or none was assigned):
    /// the next buffer in the ring, if it is ready. Allocates the segment on the device when the
    /// new slot is a segment's first. `BuffersBusy` when the next buffer is still waiting to be
    /// flushed; `Full` when the device has no room for the next segment (or only the cleaner's
    /// reserve, and `appender` is not the cleaner).
    fn advance_head(&self, appender: Appender) -> Result<(), FlashError> {
        let mut head = lock(&self.head);
        let current = &self.buffers[head.current];
        if current.base() != NO_SLOT && !current.fill().1 {
            // Another appender moved the head while this one waited for the lock.
            self.current.store(head.current, Ordering::SeqCst);
            return Ok(());
        }
        let next = (head.current + 1) % self.buffers.len();
        // Not `base` alone: a buffer whose recycle still waits for appenders to leave has no
        // slot but is not ready (buffers.rs, invariant 1).
        if !self.buffers[next].is_ready() {
            return Err(FlashError::BuffersBusy);
        }
        let geometry = self.config.geometry;
        let slot = FlashAddress(head.next_slot);
        let segment = geometry.segment_of(slot);
        if geometry.offset_in_segment(slot) == 0 {
            let budget_bytes = self.device.budget_bytes();
            let segments_max = budget_bytes / geometry.segment_bytes();
            let reserve = match appender {
                Appender::Client => self.config.cleaner_reserve_segments,
                Appender::Cleaner => 0,
            };
            if self.table().allocated() + 1 + reserve > segments_max {
                return Err(FlashError::Full { budget_bytes });
            }
            self.device.allocate(segment)?;
            self.table().open(segment);
            let header = SegmentHeader { log_id: self.config.log_id, segment, geometry };
            self.buffers[next].assign(slot.0, &header.encode());
        } else {
            self.buffers[next].assign(slot.0, &[]);
        }
        head.current = next;
        head.next_slot += geometry.buffer_bytes();
        self.current.store(next, Ordering::SeqCst);
        Ok(())
    }

    /// Seals the current buffer if it holds any entry, so the next flush writes it (`sync`).
    pub(crate) fn seal_current(&self) {
        let head = lock(&self.head);
        let buffer = &self.buffers[head.current];
        let slot = buffer.base();
        if slot == NO_SLOT {
            return;
        }
        let (fill, sealed) = buffer.fill();
        if !sealed && fill > self.prefix_bytes(slot) {
            buffer.seal();
        }
    }

    /// A durable end at or past this covers every entry appended so far: the end of the slot
    /// the head is in when that slot holds entries, else its start (a slot boundary, as the
    /// durable end always is).
    pub(crate) fn appended_end(&self) -> u64 {
        let head = lock(&self.head);
        let buffer = &self.buffers[head.current];
        let slot = buffer.base();
        if slot == NO_SLOT {
            // Recycled (so written and durable) or never assigned: nothing past `next_slot`.
            return head.next_slot;
        }
        // A recycle racing this read only makes the answer smaller than the durable end.
        if buffer.fill().0 > self.prefix_bytes(slot) {
            slot + self.config.geometry.buffer_bytes()
        } else {
            slot
        }
    }

    /// Bytes at the start of the slot at `slot` that are not entries (the segment header).
    pub(crate) fn prefix_bytes(&self, slot: u64) -> u64 {
        if self.config.geometry.offset_in_segment(FlashAddress(slot)) == 0 {
            crate::constants::SEGMENT_HEADER_BYTES as u64
        } else {
            0
        }
    }
}
