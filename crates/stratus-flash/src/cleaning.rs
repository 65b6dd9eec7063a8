//! Cleaning: read a closed segment, relocate its live entries through the normal append path,
//! and retire it. The index belongs to the caller, so the cleaner asks it (through
//! [`RelocationIndex`]) which objects are live and moves each with a compare on the old
//! address: an object written or locked meanwhile is never overwritten by its old copy, and
//! the copy is noted dead instead.
//!
//! Tombstones: a tombstone is kept while the segment of the object version it kills still holds
//! entries (RAMCloud's rule): until then, a restart could find that version and needs the
//! tombstone to know it is dead.

use crate::address::{FlashAddress, Geometry, SegmentNumber};
use crate::aligned::AlignedBuffer;
use crate::error::FlashError;
use crate::format::{EntryKind, EntryRef};
use crate::log::{Appender, FlashLog};
use crate::scan::{SegmentEntries, SegmentItem};
use crate::segments::SegmentState;

/// The caller's index, as the cleaner needs it.
pub trait RelocationIndex {
    /// Whether the index points at `address` for this object (it is the live version).
    fn is_live(&mut self, entry: &EntryRef<'_>, address: FlashAddress) -> bool;

    /// Points the index at `new` if it still points at `old` and the object is not locked, as
    /// one atomic step in the index (a compare-and-swap on the old address and the lock).
    fn relocate(
        &mut self,
        entry: &EntryRef<'_>,
        old: FlashAddress,
        new: FlashAddress,
    ) -> Relocation;
}

/// The index's answer to a relocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relocation {
    /// The index now points at the copy.
    Moved,
    /// The index no longer points at the old address (a write or delete came first): the old
    /// entry and the copy are both dead.
    Superseded,
    /// The index still points at the old address but the object is locked (a transaction holds
    /// it): the copy is dead and the segment must stay, so this pass gives it up.
    Locked,
}

/// A segment's bytes read from the device.
#[derive(Debug)]
pub struct SegmentImage {
    bytes: AlignedBuffer,
    present: usize,
    segment: SegmentNumber,
    geometry: Geometry,
}

impl SegmentImage {
    /// The segment's verified entries in log order (bytes that do not verify are skipped to the
    /// next slot and reported by the walk).
    pub fn entries(&self) -> SegmentEntries<'_> {
        SegmentEntries::new(&self.bytes.as_slice()[..self.present], self.segment, self.geometry)
    }
}

/// What cleaning one segment did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CleanOutcome {
    /// Objects copied and moved in the index.
    pub objects_relocated: u64,
    /// Objects copied whose index entry had moved on by the compare.
    pub objects_superseded: u64,
    /// The pass stopped at a locked object: the segment stays closed, for a later pass.
    pub gave_up_on_lock: bool,
    /// Tombstones copied (still needed).
    pub tombstones_kept: u64,
    /// Entries dropped (dead objects, tombstones no longer needed).
    pub entries_dropped: u64,
    /// Bytes appended for the copies.
    pub bytes_relocated: u64,
    /// Bytes that were torn or corrupt and not read past (should be zero for a closed segment).
    pub bytes_unreadable: u64,
}

impl FlashLog {
    /// Cleans `segment` (which must be closed): relocates its live entries and marks it cleaned;
    /// it is freed once the copies are durable (a later `flush_ready`) and every read that could
    /// point into it has ended. On `BuffersBusy` the cleaner flushes and retries. A locked
    /// object (`Relocation::Locked`) or any error leaves the segment closed: copies already made
    /// are moved in the index or noted dead, and a later pass finishes the work.
    pub fn clean_segment(
        &self,
        segment: SegmentNumber,
        index: &mut dyn RelocationIndex,
    ) -> Result<CleanOutcome, FlashError> {
        assert_eq!(
            self.table().state(segment),
            Some(SegmentState::Closed),
            "cleaning a segment that is not closed"
        );
        let geometry = self.config().geometry;
        let image = self.read_segment(segment)?;
        let mut outcome = CleanOutcome::default();
        // The log end the copies must be durable up to before the segment may go (0: no copy).
        let mut durable_at = 0;
        let mut entries = image.entries();
        for item in entries.by_ref() {
            let SegmentItem { address, entry, entry_bytes } = item;
            let keep = match entry.kind {
                EntryKind::Object => index.is_live(&entry, address),
                EntryKind::Tombstone => {
                    // Not needed when the version it kills goes with this segment.
                    let dead_segment = geometry.segment_of(entry.dead_address);
                    dead_segment != segment && self.table().holds_entries(dead_segment)
                }
            };
            if !keep {
                outcome.entries_dropped += 1;
                continue;
            }
            let new_address = self.append_flushing(&entry)?;
            durable_at = geometry.slot_of(new_address).0 + geometry.buffer_bytes();
            outcome.bytes_relocated += entry_bytes as u64;
            if entry.kind == EntryKind::Tombstone {
                outcome.tombstones_kept += 1;
                continue;
            }
            match index.relocate(&entry, address, new_address) {
                Relocation::Moved => {
                    // Counted so a pass that gives up later leaves the segment's count right.
                    self.note_dead(address, entry_bytes);
                    outcome.objects_relocated += 1;
                }
                Relocation::Superseded => {
                    self.note_dead(new_address, entry_bytes);
                    outcome.objects_superseded += 1;
                }
                Relocation::Locked => {
                    self.note_dead(new_address, entry_bytes);
                    outcome.gave_up_on_lock = true;
                    return Ok(outcome);
                }
            }
        }
        outcome.bytes_unreadable = entries.report().unreadable_bytes;
        self.table().mark_cleaned(segment, durable_at);
        Ok(outcome)
    }

    /// A segment's bytes as on the device, to walk its entries (`SegmentImage::entries`): what
    /// the cleaner relocates from, for a caller that relocates by itself. Reads one segment
    /// (8 MiB by default) in one I/O.
    pub fn read_segment(&self, segment: SegmentNumber) -> Result<SegmentImage, FlashError> {
        let geometry = self.config().geometry;
        let mut bytes = AlignedBuffer::zeroed(geometry.segment_bytes() as usize);
        let present = self.device().read_at(segment, 0, bytes.as_mut_slice())?;
        Ok(SegmentImage { bytes, present, segment, geometry })
    }

    /// Appends, flushing when every buffer is busy (the cleaner is a flusher's caller too).
    fn append_flushing(&self, entry: &EntryRef<'_>) -> Result<FlashAddress, FlashError> {
        loop {
            match self.append_all_as(std::slice::from_ref(entry), Appender::Cleaner).map(|a| a[0]) {
                Err(FlashError::BuffersBusy) => {
                    self.flush_ready()?;
                }
                other => return other,
            }
        }
    }
}
