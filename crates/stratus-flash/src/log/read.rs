//! Reading an entry by address: from the flush buffer that holds its slot, or from the device.
//!
//! A read is one synchronous positioned read on the caller's thread (two when the entry is
//! longer than the first fetch). Many reads are in flight when many threads read;
//! [`crate::io::ReadPool`] gives a bounded set of such threads to callers that must not block.
//! Chosen over io_uring for now: it needs no unsafe code (the workspace denies it) and no
//! kernel feature probing, and flash_raw measured the pool at depth 32 within a few percent of
//! 32 threads of raw pread.

use std::sync::atomic::Ordering;

use super::FlashLog;
use crate::address::FlashAddress;
use crate::aligned::{align_down, align_up, AlignedBuffer};
use crate::constants::{ENTRY_HEADER_BYTES, READ_FIRST_BYTES};
use crate::error::FlashError;
use crate::format::{decode_entry, entry_bytes_from_header, Decoded, OwnedEntry};
use crate::segments::ReadRefusal;

/// A registered read: ends its epoch when dropped, so a freed segment's space waits for it.
pub(crate) struct ReadGuard<'a> {
    log: &'a FlashLog,
    epoch: u64,
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.log.table().end_read(self.epoch);
    }
}

impl FlashLog {
    /// The entry at `address`. `SegmentFreed` when its segment was cleaned and freed (the
    /// caller's index moved on: look again), `NotWritten` when nothing was appended there,
    /// `Format` when the bytes do not verify, `Io` when the device fails.
    pub fn read(&self, address: FlashAddress) -> Result<OwnedEntry, FlashError> {
        self.read_sized(address, READ_FIRST_BYTES)
    }

    /// [`FlashLog::read`] with the entry's size when the caller knows it (its index does): the
    /// first device read then covers exactly the entry's blocks. A wrong hint costs a second
    /// read, never a wrong answer.
    pub fn read_sized(
        &self,
        address: FlashAddress,
        entry_bytes_hint: usize,
    ) -> Result<OwnedEntry, FlashError> {
        let _guard = self.begin_read(address)?;
        if address.0 >= self.durable_end.load(Ordering::SeqCst) {
            if let Some(entry) = self.read_buffered(address)? {
                return Ok(entry);
            }
            if address.0 >= self.durable_end.load(Ordering::SeqCst) {
                return Err(FlashError::NotWritten { address });
            }
        }
        self.read_device(address, entry_bytes_hint)
    }

    /// Registers a read of `address`'s segment for as long as the guard lives: the segment's
    /// space is not freed meanwhile. `SegmentFreed` or `NotWritten` when it may not be read.
    pub(crate) fn begin_read(&self, address: FlashAddress) -> Result<ReadGuard<'_>, FlashError> {
        let segment = self.config.geometry.segment_of(address);
        let epoch = self.table().begin_read(segment).map_err(|refusal| match refusal {
            ReadRefusal::Freed => FlashError::SegmentFreed { address },
            ReadRefusal::NotWritten => FlashError::NotWritten { address },
        })?;
        Ok(ReadGuard { log: self, epoch })
    }

    /// The entry from the buffer holding its slot; `None` when no buffer holds it (any more).
    fn read_buffered(&self, address: FlashAddress) -> Result<Option<OwnedEntry>, FlashError> {
        let geometry = self.config.geometry;
        let slot = geometry.slot_of(address).0;
        let offset = address.0 - slot;
        let format_error = |error| FlashError::Format { address, error };
        for buffer in self.buffers.iter() {
            if buffer.base() != slot {
                continue;
            }
            if !address.0.is_multiple_of(8) || offset + ENTRY_HEADER_BYTES as u64 > buffer.fill().0
            {
                // The buffer may have been recycled between the two loads (its `fill` reset, or
                // set for its next slot): then the entry is on the device, not unwritten.
                // `recycle` clears `base` before it resets `fill`, so checking `base` again
                // after the `fill` load tells the two apart.
                if buffer.base() != slot {
                    return Ok(None);
                }
                return Err(FlashError::NotWritten { address });
            }
            let mut header = [0u8; ENTRY_HEADER_BYTES];
            if !buffer.read_if_holding(slot, offset, &mut header) {
                return Ok(None);
            }
            let entry_bytes = entry_bytes_from_header(&header).map_err(format_error)?;
            if offset + entry_bytes as u64 > geometry.buffer_bytes() {
                return Err(format_error(crate::error::FormatError::Truncated));
            }
            let mut bytes = vec![0u8; entry_bytes];
            if !buffer.read_if_holding(slot, offset, &mut bytes) {
                return Ok(None);
            }
            return decode_owned(&bytes).map(Some).map_err(|error| match error {
                None => FlashError::NotWritten { address },
                Some(error) => format_error(error),
            });
        }
        Ok(None)
    }

    /// The entry from the device: one aligned read of the blocks covering the hinted size, and a
    /// second if the entry is longer.
    fn read_device(
        &self,
        address: FlashAddress,
        entry_bytes_hint: usize,
    ) -> Result<OwnedEntry, FlashError> {
        let geometry = self.config.geometry;
        let segment = geometry.segment_of(address);
        let offset = geometry.offset_in_segment(address);
        let slot_end =
            geometry.offset_in_segment(geometry.slot_of(address)) + geometry.buffer_bytes();
        let start = align_down(offset);
        let lead = (offset - start) as usize;
        let first_bytes = align_up((lead + entry_bytes_hint.max(ENTRY_HEADER_BYTES)) as u64)
            .min(slot_end - start);
        let format_error = |error| FlashError::Format { address, error };
        let mut block = AlignedBuffer::zeroed(first_bytes as usize);
        self.device.read_at(segment, start, block.as_mut_slice())?;
        let header = block.as_slice().get(lead..).unwrap_or_default();
        if header.first() == Some(&0) {
            return Err(FlashError::NotWritten { address });
        }
        let entry_bytes = entry_bytes_from_header(header).map_err(format_error)?;
        if offset + entry_bytes as u64 > slot_end {
            return Err(format_error(crate::error::FormatError::Truncated));
        }
        if lead + entry_bytes > block.len() {
            block = AlignedBuffer::zeroed(align_up((lead + entry_bytes) as u64) as usize);
            self.device.read_at(segment, start, block.as_mut_slice())?;
        }
        decode_owned(&block.as_slice()[lead..lead + entry_bytes]).map_err(|error| match error {
            None => FlashError::NotWritten { address },
            Some(error) => format_error(error),
        })
    }
}

/// Decodes an entry into an owned one; `Err(None)` for padding.
fn decode_owned(bytes: &[u8]) -> Result<OwnedEntry, Option<crate::error::FormatError>> {
    match decode_entry(bytes) {
        Ok(Decoded::Entry(entry, _)) => Ok(entry.to_owned_entry()),
        Ok(Decoded::Padding) => Err(None),
        Err(error) => Err(Some(error)),
    }
}
