//! Cleaning: read a closed segment, relocate its live entries through the normal append path,
//! and retire it. The index belongs to the caller, so the cleaner asks it (through
//! [`RelocationIndex`]) which objects are live and moves each with a compare on the old
//! address, made under the index's lock before any copy exists: an object written or locked
//! meanwhile is never copied, so every copy in the log is one the index points at.
//!
//! Tombstones: a tombstone is kept while the segment of the object version it kills still holds
//! entries (RAMCloud's rule): until then, a restart could find that version and needs the
//! tombstone to know it is dead. Relocation makes a second copy of an object version, and the
//! original stays on the device until its segment is freed, which a pass that gives up (a locked
//! object, an error) or a crash may put off indefinitely; so a tombstone is also kept while any
//! other segment may hold a stale copy of its key (`SegmentTable::may_hold_stale`): the cleaner
//! records the key in the victim's table entry before each copy, and a restart records every
//! object it finds dead that no tombstone names by its segment.

use crate::address::{FlashAddress, Geometry, SegmentNumber};
use crate::aligned::AlignedBuffer;
use crate::error::{FlashError, IoOperation};
use crate::format::{EntryKind, EntryRef};
use crate::log::{Appender, FlashLog};
use crate::scan::{SegmentEntries, SegmentItem};
use crate::segments::{key_hash, SegmentState};

/// The caller's index, as the cleaner needs it.
///
/// Contract: a copy of an object exists in the log only if the index points at it. A copy that
/// the index refused (the object was overwritten, deleted or locked meanwhile) would be a
/// duplicate no tombstone names: a later delete names the original's address, its tombstone is
/// dropped once the original's segment is freed, and a restart would bring the copy back. So
/// the index decides *before* the copy is made, and makes it inside its own atomic step.
pub trait RelocationIndex {
    /// Whether the index points at `address` for this object (it is the live version). A hint
    /// that saves copying dead objects; `relocate` decides.
    fn is_live(&mut self, entry: &EntryRef<'_>, address: FlashAddress) -> bool;

    /// Moves the object from `old` as one atomic step in the index, with the object's entry
    /// held stable (under its lock in the index) throughout:
    ///
    /// - the index no longer points at `old`: return `Superseded` without calling `copy`;
    /// - the object is locked (a transaction holds it): return `Locked` without calling `copy`;
    /// - otherwise call `copy` exactly once; on `Ok(new)` point the index at `new` and return
    ///   `Moved`; on `Err` leave the index as it is and return the error.
    ///
    /// `copy` appends the object (it may flush, so it may do device I/O). The cleaner asserts
    /// this contract: a copy made for any answer but `Moved` panics.
    fn relocate(
        &mut self,
        entry: &EntryRef<'_>,
        old: FlashAddress,
        copy: &mut dyn FnMut() -> Result<FlashAddress, FlashError>,
    ) -> Result<Relocation, FlashError>;
}

/// The index's answer to a relocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relocation {
    /// The index now points at the copy.
    Moved,
    /// The index no longer points at the old address (a write or delete came first): the old
    /// entry is dead and no copy was made.
    Superseded,
    /// The index still points at the old address but the object is locked (a transaction holds
    /// it): no copy was made, and the segment must stay, so this pass gives it up.
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
}

impl FlashLog {
    /// Cleans `segment` (which must be closed): relocates its live entries and marks it cleaned;
    /// it is freed once the copies are durable (a later `flush_ready`) and every read that could
    /// point into it has ended. On `BuffersBusy` the cleaner flushes and retries. A locked
    /// object (`Relocation::Locked`) or any error leaves the segment closed: copies already made
    /// are moved in the index, and a later pass finishes the work (the originals left behind
    /// are stale copies, which keep the tombstones of their keys alive; see below). A segment
    /// that is not closed is `SegmentNotClosed`.
    ///
    /// Bytes that do not verify: a segment the restart scan found torn (a write cut by the
    /// crash) is cleaned when its walk stops at exactly the places the restart scan stopped,
    /// since nothing past them was ever indexed. Any other tear (bytes that rotted since) is
    /// `Format`, before anything is copied, and the segment stays closed: cleaning it would
    /// free the live objects its walk cannot see past the tear.
    pub fn clean_segment(
        &self,
        segment: SegmentNumber,
        index: &mut dyn RelocationIndex,
    ) -> Result<CleanOutcome, FlashError> {
        let state = self.table().state(segment);
        if state != Some(SegmentState::Closed) {
            return Err(FlashError::SegmentNotClosed { segment, state });
        }
        let geometry = self.config().geometry;
        let image = self.read_segment(segment)?;
        let mut check = image.entries();
        check.by_ref().for_each(drop);
        let tears = check.into_report().tears;
        {
            let table = self.table();
            let known = table.recovered_tears(segment);
            if let Some(tear) = tears.iter().find(|tear| !known.contains(&tear.address)) {
                return Err(FlashError::Format { address: tear.address, error: tear.error });
            }
        }
        let mut outcome = CleanOutcome::default();
        let mut entries = image.entries();
        for item in entries.by_ref() {
            let SegmentItem { address, entry, entry_bytes } = item;
            let key_hash = key_hash(entry.table_id, entry.key);
            let keep = match entry.kind {
                EntryKind::Object => index.is_live(&entry, address),
                EntryKind::Tombstone => {
                    // Needed while a restart could still find a version it kills: in the
                    // segment its dead address names (unless that is this one, going now), or
                    // as a stale copy in any other segment (an original the cleaner copied
                    // out of a segment not yet freed, or one a restart found twice).
                    let dead_segment = geometry.segment_of(entry.dead_address);
                    let table = self.table();
                    (dead_segment != segment && table.holds_entries(dead_segment))
                        || table.may_hold_stale(key_hash, segment)
                }
            };
            if !keep {
                outcome.entries_dropped += 1;
                continue;
            }
            if entry.kind == EntryKind::Tombstone {
                self.append_flushing(&entry)?;
                outcome.bytes_relocated += entry_bytes as u64;
                outcome.tombstones_kept += 1;
                continue;
            }
            let mut copied = None;
            let mut copy = || {
                assert!(copied.is_none(), "RelocationIndex::relocate copied an object twice");
                // Before the copy exists: from the moment the index points at it, a delete's
                // tombstone names the copy, and must outlive the original left here until this
                // segment is freed (which a pass that gives up, or a crash, may delay forever).
                self.table().note_stale(segment, key_hash);
                let new_address = self.append_flushing(&entry)?;
                copied = Some(new_address);
                Ok(new_address)
            };
            let relocation = index.relocate(&entry, address, &mut copy);
            match (relocation, copied) {
                (Ok(Relocation::Moved), Some(_)) => {
                    outcome.bytes_relocated += entry_bytes as u64;
                    // Counted so a pass that gives up later leaves the segment's count right.
                    self.note_dead(address, entry_bytes);
                    outcome.objects_relocated += 1;
                }
                (Ok(Relocation::Moved), None) => {
                    panic!("RelocationIndex::relocate answered Moved without copying")
                }
                (Ok(Relocation::Superseded), None) => outcome.objects_superseded += 1,
                (Ok(Relocation::Locked), None) => {
                    outcome.gave_up_on_lock = true;
                    return Ok(outcome);
                }
                (Err(error), None) => return Err(error),
                (answer, Some(copy)) => panic!(
                    "RelocationIndex::relocate copied the object to {copy:?} but answered \
                     {answer:?}: the copy would be a duplicate no tombstone names"
                ),
            }
        }
        assert_eq!(entries.into_report().tears, tears, "the segment's bytes are read once");
        // The segment may go once everything appended so far is durable: its copies, and also
        // the tombstones and newer versions that made its other objects dead. Were it freed
        // while a delete's tombstone was still in a buffer, a crash would lose both the delete
        // (unacknowledged: allowed) and the object it killed (acknowledged: not allowed).
        let durable_at = self.appended_end();
        self.table().mark_cleaned(segment, durable_at);
        Ok(outcome)
    }

    /// A segment's bytes as on the device, to walk its entries (`SegmentImage::entries`): what
    /// the cleaner relocates from, for inspection. Relocate only through `clean_segment`: a
    /// copy appended by the caller leaves an original the segment table does not know is a
    /// stale copy, and a later delete's tombstone could be dropped before it. Reads one segment
    /// (8 MiB by default) in one I/O. The read holds a read epoch like `read`, so the segment
    /// is not freed under it; a segment freed or being freed is `SegmentFreed`, one never
    /// allocated `NotWritten`.
    pub fn read_segment(&self, segment: SegmentNumber) -> Result<SegmentImage, FlashError> {
        let geometry = self.config().geometry;
        let _reading = self.begin_read(geometry.segment_start(segment))?;
        let mut bytes = AlignedBuffer::zeroed(geometry.segment_bytes() as usize);
        let present = self.device().read_at(segment, 0, bytes.as_mut_slice())?;
        Ok(SegmentImage { bytes, present, segment, geometry })
    }

    /// Appends, flushing when every buffer is busy (the cleaner is a flusher's caller too).
    fn append_flushing(&self, entry: &EntryRef<'_>) -> Result<FlashAddress, FlashError> {
        loop {
            match self.append_all_as(std::slice::from_ref(entry), Appender::Cleaner).map(|a| a[0]) {
                Err(FlashError::BuffersBusy) => match self.flush_ready() {
                    Ok(_) => {}
                    // The flush itself was done; only freeing a retired segment failed, and it
                    // stays `Freeing` for the next reclaim. A stuck unlink must not stop every
                    // pass (and with it the return of space).
                    Err(FlashError::Io { operation: IoOperation::Free, .. }) => {}
                    Err(error) => return Err(error),
                },
                other => return other,
            }
        }
    }
}
