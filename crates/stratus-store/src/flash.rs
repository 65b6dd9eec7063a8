//! The flash tier of a master (issue 25, docs/design/flash-tier.md): objects of flash tables
//! leave memory through compaction and are read back from their segment's image on flash.
//!
//! Design in one paragraph. A flash table's writes go through the memory log as any table's
//! (appended, replicated to R backups, acknowledged under the same rule), so exactly-once
//! operations, transactions, recovery and migration see ordinary objects. When the cleaner
//! demotes a closed, fully replicated segment, the store first writes the segment's bytes as they
//! are in memory — a valid segment, the very bytes a backup could hold — to the master's flash
//! as the segment's **image**, then compacts the segment in place, writing for each live object
//! of a flash table a FLASH_OBJECT entry (the object's prefix and key, and where its entry sits
//! in the image) instead of the object. Lookups, versions, reject rules, locks and expiry need
//! only the FLASH_OBJECT; a read of the value reads the entry from the image and verifies its
//! checksum. Combined cleaning reads survivors back from the image and writes them whole into
//! survivor segments (replicated, then demoted again later), so the memory log's disk-level
//! cleaner is also the flash tier's garbage collector: an image is deleted when its segment
//! leaves the log. A backup lost meanwhile is re-replicated from the image, never from the
//! compacted memory (which lacks the values).
//!
//! The store reaches flash only through [`FlashImages`], which the server implements with files
//! (and tests with memory): writes from the cleaner's thread, reads under the object's bucket
//! lock (so the cleaner cannot move the object and delete its image meanwhile).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use stratus_log::format::{
    decode_entry_header, decode_flash_object, decode_object, decode_object_unverified, Certificate,
    EntryHeader, FlashLocator, ObjectView, FLASH_LOCATOR_BYTES,
};
use stratus_log::{EntryType, Reference, SegmentIterator};
use stratus_types::{SegmentId, TableId, Tier};

use crate::{ObjectError, ObjectStore, WallTime};

/// Why flash could not do what the store asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashImageError {
    /// The flash budget has no room for another image: demotion waits for cleaning to delete
    /// some (objects stay in memory meanwhile).
    Full,
    /// The image does not exist (its segment left the log).
    Missing(SegmentId),
    /// The device failed.
    Io(std::io::ErrorKind),
    /// The image is shorter than the bytes asked for.
    ShortRead,
    /// The image's bytes do not verify (entry checksums against its certificate).
    Corrupt,
}

impl std::fmt::Display for FlashImageError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlashImageError::Full => write!(formatter, "the flash budget is full"),
            FlashImageError::Missing(segment) => write!(formatter, "no image of segment {segment}"),
            FlashImageError::Io(kind) => write!(formatter, "flash I/O failed: {kind}"),
            FlashImageError::ShortRead => write!(formatter, "the image is shorter than asked"),
            FlashImageError::Corrupt => write!(formatter, "the image does not verify"),
        }
    }
}

impl std::error::Error for FlashImageError {}

/// Where segment images live: the master's flash directory, or memory in tests.
pub trait FlashImages: Send + Sync + std::fmt::Debug {
    /// Stores the image of `segment` (replacing none: a segment is imaged once).
    fn write_image(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), FlashImageError>;
    /// Reads `length` bytes at `offset` of the image of `segment`.
    fn read(
        &self,
        segment: SegmentId,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, FlashImageError>;
    /// Deletes the image of `segment` (its segment left the log). Reads already running may
    /// finish; later ones get `Missing`.
    fn delete_image(&self, segment: SegmentId);
}

/// What the store knows of its flash tier.
#[derive(Debug, Default)]
pub(crate) struct FlashTier {
    images: Option<Arc<dyn FlashImages>>,
    state: Mutex<FlashState>,
    /// [`FlashTotals::values_read`] (counted outside the state's lock: reads run in parallel).
    values_read: AtomicU64,
    /// [`FlashTotals::reads_failed`].
    reads_failed: AtomicU64,
}

#[derive(Debug, Default)]
struct FlashState {
    /// Counters since the store was made.
    totals: FlashTotals,
    /// Segments in which a combined pass could not read a live object back from its image: a
    /// pass takes one again only once all its live flash objects read back (an image that
    /// stays bad would otherwise be chosen by every pass, each keeping it and pinning new
    /// survivors to it, until the log filled).
    unreadable: BTreeSet<SegmentId>,
    /// Segments with an image, and the certificate of the image's bytes.
    imaged: BTreeMap<SegmentId, Certificate>,
    /// Closed segments found to hold no live flash-table object (not looked at again until a
    /// table is newly on flash: a closed segment gains no objects).
    nothing_to_demote: BTreeSet<SegmentId>,
    /// Cleaned segments whose images go once the segments have left the log.
    leaving: BTreeSet<SegmentId>,
    /// Flash refused an image for want of room while it held images of ours, and no image was
    /// deleted since: only a deleted image gives room back, so demotion does not try (and
    /// compact a segment for nothing) until one is. A refusal while it held none is not
    /// remembered (no deletion could ever follow): demotion tries again after its pause.
    full: bool,
}

/// Counters of the flash tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlashStatistics {
    /// Segments with an image on flash now.
    pub images: u64,
    /// Bytes of those images.
    pub image_bytes: u64,
    /// What happened since the store was made.
    pub totals: FlashTotals,
}

/// Counts of the flash tier's work since the store was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlashTotals {
    /// Segments demoted (imaged and compacted with their flash objects).
    pub demotions: u64,
    /// Objects that left memory by those demotions.
    pub objects_demoted: u64,
    /// Bytes of images written.
    pub image_bytes_written: u64,
    /// Images flash refused (full or failing); their segments were compacted as usual.
    pub images_refused: u64,
    /// Images deleted because their segments were cleaned.
    pub images_deleted: u64,
    /// Values of flash tables' objects read back from images for requests (reads,
    /// increments, enumeration, migration, transaction reads); auto tables' reads from flash
    /// are counted in `AutoStatistics::reads_from_flash`.
    pub values_read: u64,
    /// Reads of images that failed or did not verify (the request, the pass or the
    /// promotion that needed them failed; nothing wrong was served).
    pub reads_failed: u64,
}

/// What one demotion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demoted {
    /// The segment imaged and compacted.
    pub segment_id: SegmentId,
    /// Objects now on flash.
    pub objects: u64,
    /// Seglets of memory the compaction freed.
    pub seglets_freed: u32,
}

impl FlashTier {
    fn state(&self) -> MutexGuard<'_, FlashState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ObjectStore {
    /// Gives the store a flash tier: from now on `demote_once` moves flash tables' objects to
    /// images in `images`. Called once, before the master serves.
    pub fn attach_flash(&mut self, images: Arc<dyn FlashImages>) {
        assert!(self.flash.images.is_none(), "a flash tier is attached once");
        self.flash.images = Some(images);
    }

    /// Whether a flash tier is attached.
    pub fn has_flash(&self) -> bool {
        self.flash.images.is_some()
    }

    /// Counters of the flash tier.
    pub fn flash_statistics(&self) -> FlashStatistics {
        let state = self.flash.state();
        let mut totals = state.totals;
        totals.values_read = self.flash.values_read.load(Ordering::Relaxed);
        totals.reads_failed = self.flash.reads_failed.load(Ordering::Relaxed);
        FlashStatistics {
            images: state.imaged.len() as u64,
            image_bytes: state.imaged.values().map(|c| u64::from(c.segment_length)).sum(),
            totals,
        }
    }

    /// Segments with an image now, but for those already cleaned (their images go once the
    /// segments have left the log).
    /// A combined pass could not read a live object of each of `segments` back from flash.
    pub(crate) fn note_unreadable(&self, segments: &[SegmentId]) {
        self.flash.state().unreadable.extend(segments.iter().copied());
    }

    /// Whether a combined pass may take `segment_id`: yes unless a pass met an object of it it
    /// could not read back, and one of its live flash objects still does not read back (then
    /// every segment pinned to it waits too). A segment that reads back whole is forgotten.
    pub(crate) fn cleanable_despite_flash(&self, segment_id: SegmentId) -> bool {
        if !self.flash.state().unreadable.contains(&segment_id) {
            return true;
        }
        let epoch = self.log.pin();
        let Some(entries) = self.log.segment_entries(&epoch, segment_id) else { return false };
        for (reference, entry_type) in entries {
            if entry_type != EntryType::FlashObject {
                continue;
            }
            let (_, content) = self.log.entry(&epoch, reference);
            let object = decode_object_unverified(&content).expect("corrupt flash object");
            let hash = stratus_types::key_hash(object.table, object.key);
            let bucket = self.index.lock(hash.0);
            let live = bucket.find(|found| found == reference.0).is_some();
            if live && self.flash_object_content(reference, &content).is_err() {
                return false;
            }
        }
        self.flash.state().unreadable.remove(&segment_id);
        true
    }

    pub(crate) fn imaged_segments(&self) -> BTreeSet<SegmentId> {
        let state = self.flash.state();
        state.imaged.keys().copied().filter(|segment| !state.leaving.contains(segment)).collect()
    }

    /// Whether the flash tier nears its budget (`StoreConfig::flash_image_bytes`, whole
    /// segments: an image takes a segment's slot), or refused an image for want of room
    /// since it last deleted one: combined cleaning of imaged segments is due
    /// ([`crate::FLASH_CLEAN_FORCE_PERCENT`]).
    pub(crate) fn flash_pressure(&self) -> bool {
        if self.flash.images.is_none() {
            return false;
        }
        let images_max = self.config.flash_image_bytes / u64::from(self.config.segment_bytes);
        let state = self.flash.state();
        let images = state.imaged.len().saturating_sub(state.leaving.len()) as u64;
        // No budget configured (tests with unbounded images): only a refusal tells.
        let near_budget =
            images_max > 0 && images * 100 >= images_max * crate::FLASH_CLEAN_FORCE_PERCENT;
        state.full || near_budget
    }

    /// Whether `segment_id` has an image (new replicas of it come from
    /// [`ObjectStore::replication_image`]).
    pub fn has_image(&self, segment_id: SegmentId) -> bool {
        self.flash.state().imaged.contains_key(&segment_id)
    }

    /// The bytes and certificate a new replica of `segment_id` must receive when the segment
    /// has an image (its memory holds FLASH_OBJECT entries, which never leave the master):
    /// the image, read back. `None` when the segment has no image (replicate from memory).
    pub fn replication_image(
        &self,
        segment_id: SegmentId,
    ) -> Option<Result<(Vec<u8>, Certificate), FlashImageError>> {
        let certificate = *self.flash.state().imaged.get(&segment_id)?;
        let images = self.flash.images.as_ref().expect("an image without a flash tier");
        let read = images.read(segment_id, 0, certificate.segment_length).and_then(|bytes| {
            // The certificate covers only entry headers: every entry's checksum is checked too,
            // so a corrupt image never replaces a good replica.
            let verified = SegmentIterator::new(&bytes, &certificate)
                .is_ok_and(|mut entries| entries.all(|entry| entry.is_ok()));
            if verified {
                Ok((bytes, certificate))
            } else {
                Err(FlashImageError::Corrupt)
            }
        });
        Some(read)
    }

    /// Moves the objects of flash tables out of one closed, replicated segment: writes its
    /// image, then compacts it with a FLASH_OBJECT in place of each such live object. When auto
    /// tables hold more DRAM than their budget, their objects go too, and if no segment holds
    /// flash tables' objects, the segment whose auto objects were accessed least recently is
    /// demoted for them (auto_tier.rs). `None` when no segment has any to move (or no flash
    /// tier is attached). An image that cannot be written leaves the segment's objects in
    /// memory and is the error.
    pub fn demote_once(&self, now: WallTime) -> Result<Option<Demoted>, FlashImageError> {
        let Some(images) = self.flash.images.clone() else { return Ok(None) };
        self.retire_images();
        if self.flash.state().full {
            return Err(FlashImageError::Full);
        }
        let auto_over_budget = self.auto_over_budget();
        if self.has_flash_tables() {
            let candidates: Vec<SegmentId> = {
                let state = self.flash.state();
                self.log
                    .cleaning_candidates(now.millis())
                    .into_iter()
                    .map(|candidate| candidate.segment_id)
                    .filter(|id| {
                        !state.imaged.contains_key(id) && !state.nothing_to_demote.contains(id)
                    })
                    .collect()
            };
            for segment_id in candidates {
                if self.live_objects_to_demote(segment_id, false, now) == 0 {
                    self.flash.state().nothing_to_demote.insert(segment_id);
                    continue;
                }
                if let Some(demoted) =
                    self.demote_segment(&images, segment_id, auto_over_budget, now)
                {
                    return demoted.map(Some);
                }
            }
        }
        if !auto_over_budget {
            return Ok(None);
        }
        for segment_id in self.auto_demotion_order(now) {
            if self.has_image(segment_id) || self.live_objects_to_demote(segment_id, true, now) == 0
            {
                self.note_no_auto_objects(segment_id);
                continue;
            }
            if let Some(demoted) = self.demote_segment(&images, segment_id, true, now) {
                if demoted.is_ok() {
                    self.auto_demotion_done();
                }
                return demoted.map(Some);
            }
        }
        Ok(None)
    }

    /// Images and compacts `segment_id` (auto tables' objects too when `demote_auto`). `None`
    /// when the segment cannot be compacted now (being cleaned, or no room).
    fn demote_segment(
        &self,
        images: &Arc<dyn FlashImages>,
        segment_id: SegmentId,
        demote_auto: bool,
        now: WallTime,
    ) -> Option<Result<Demoted, FlashImageError>> {
        // The live bytes first, then what the FLASH_OBJECTs save of them: an object that dies
        // in between is in neither, so the copy's size stays bounded (see demotion_seglets).
        let movable_bytes = self.demotion_movable_bytes(segment_id, now)?;
        let saved_bytes = self.demotion_saved_bytes(segment_id, demote_auto, now);
        let seglets = crate::cleaner::compacted_seglets_needed(
            self.log.config(),
            movable_bytes.saturating_sub(saved_bytes),
        );
        let access = self.cleaner_candidate_access(segment_id, now);
        if !self.log.begin_compaction(segment_id, seglets) {
            return None;
        }
        // The segment's bytes stay as they are until the compaction finishes.
        let (bytes, certificate) =
            self.log.segment_contents(segment_id).expect("a segment being compacted");
        let written = images.write_image(segment_id, &bytes);
        {
            let mut state = self.flash.state();
            if written.is_ok() {
                state.imaged.insert(segment_id, certificate);
                state.totals.image_bytes_written += bytes.len() as u64;
            } else {
                state.totals.images_refused += 1;
                // Only a deleted image gives room back: without one to delete, the refusal
                // is not remembered, or demotion would never try again.
                state.full =
                    matches!(written, Err(FlashImageError::Full)) && !state.imaged.is_empty();
            }
        }
        let offsets = match &written {
            Ok(()) => entry_offsets(&bytes),
            // The seglets set aside fit the segment with its objects on flash only: it stays
            // as it is (compaction, which keeps them, takes it when it is worth it).
            Err(error) => {
                self.log.abandon_compaction(segment_id);
                return Some(Err(*error));
            }
        };
        let epoch = self.log.pin();
        let entries =
            self.log.segment_entries(&epoch, segment_id).expect("a segment being compacted");
        assert_eq!(offsets.len(), entries.len(), "the image and the segment disagree");
        let compacted =
            self.compact_entries(&epoch, segment_id, &entries, Some(&offsets), demote_auto, now);
        drop(epoch);
        let seglets_freed = self.log.finish_compaction(segment_id);
        if let Some(access) = access {
            self.carry_access(segment_id, access);
        }
        let mut state = self.flash.state();
        state.totals.demotions += 1;
        state.totals.objects_demoted += compacted.demoted;
        drop(state);
        Some(Ok(Demoted { segment_id, objects: compacted.demoted, seglets_freed }))
    }

    /// Whether any table this store knows is on flash.
    fn has_flash_tables(&self) -> bool {
        let tiers = self.table_tiers.read().expect("table tiers poisoned");
        tiers.values().any(|tier| *tier == Tier::Flash)
    }

    /// Calls `visit` with each object of `segment_id` a demotion could move to flash: long
    /// enough to gain from moving ([`demotable`]), not expired at `now`, of a table `moves`
    /// selects, its entry's reference and content, and the reference of its key's current
    /// object (looked up under the key's bucket lock; keys with no current object are left
    /// out). Whether the entry is that current object is the caller's question: by segment or
    /// by reference (see the two callers).
    fn for_each_demotable(
        &self,
        segment_id: SegmentId,
        now: WallTime,
        moves: impl Fn(TableId) -> bool,
        mut visit: impl FnMut(Reference, &[u8], &ObjectView<'_>, Reference),
    ) {
        let epoch = self.log.pin();
        let Some(entries) = self.log.segment_entries(&epoch, segment_id) else { return };
        for (reference, entry_type) in entries {
            if entry_type != EntryType::Object {
                continue;
            }
            let (_, content) = self.log.entry(&epoch, reference);
            let object = decode_object_unverified(&content).expect("corrupt object in the log");
            if !moves(object.table) || !demotable(&object) || now.has_passed(object.expires_at) {
                continue;
            }
            let hash = stratus_types::key_hash(object.table, object.key);
            let bucket = self.index.lock(hash.0);
            if let Some(current) = self.lookup(&epoch, &bucket, object.table, object.key) {
                visit(reference, &content, &object, current.reference);
            }
        }
    }

    /// Objects a demotion would move that are live in `segment_id`: of flash tables, or
    /// (`auto`) of auto tables instead. Live: the key's current object is in this segment.
    /// Asked by segment, not by reference, so a compaction of the segment meanwhile (which
    /// moves its entries within it) does not hide them; an older version beside the current
    /// one in the same segment is counted too, which only matters for "none".
    fn live_objects_to_demote(&self, segment_id: SegmentId, auto: bool, now: WallTime) -> u64 {
        let moves = |table| {
            if auto {
                self.is_auto_table(table)
            } else {
                self.is_flash_table(table)
            }
        };
        let mut count = 0;
        self.for_each_demotable(segment_id, now, moves, |_, _, _, current| {
            if self.log.segment_of(current) == segment_id {
                count += 1;
            }
        });
        count
    }

    /// The live bytes of `segment_id` a compaction would copy whole (`None`: the segment is
    /// no candidate now).
    fn demotion_movable_bytes(&self, segment_id: SegmentId, now: WallTime) -> Option<u64> {
        let candidate = self
            .log
            .cleaning_candidates(now.millis())
            .into_iter()
            .find(|candidate| candidate.segment_id == segment_id)?;
        Some(candidate.movable_bytes)
    }

    /// What a demotion of `segment_id` saves of its live bytes: for each live object it moves
    /// to flash (as [`ObjectStore::compact_entries`] decides, auto tables' too when
    /// `demote_auto`), its entry less its FLASH_OBJECT's. The compacted copy's seglets are
    /// sized for the rest: a demotion that set aside room for every object whole could not run
    /// when memory is full of objects waiting to go to flash, which is when it must.
    ///
    /// Counted after the movable bytes were taken: objects only die meanwhile (a closed
    /// segment gains none), and a dead object is in neither count, while each saving is at most
    /// its object's size; so the live bytes less these savings bound what the copy receives.
    /// Expired objects are in neither either: the movable bytes leave them out and the
    /// compaction drops them (`drop_if_expired`, by the same `now`), so they save nothing.
    fn demotion_saved_bytes(&self, segment_id: SegmentId, demote_auto: bool, now: WallTime) -> u64 {
        let moves =
            |table| self.is_flash_table(table) || (demote_auto && self.is_auto_table(table));
        let mut saved = 0;
        // By reference: an older version beside the current one in this segment is dead, and
        // saves nothing.
        self.for_each_demotable(segment_id, now, moves, |reference, content, object, current| {
            if current != reference {
                return;
            }
            let entry_bytes = EntryHeader::new(EntryType::Object, content.len() as u32)
                .header_bytes()
                + content.len();
            let stub_content_bytes = content.len() - object.value.len() + FLASH_LOCATOR_BYTES;
            let stub_bytes = EntryHeader::new(EntryType::FlashObject, stub_content_bytes as u32)
                .header_bytes()
                + stub_content_bytes;
            saved += (entry_bytes - stub_bytes) as u64;
        });
        saved
    }

    /// The value of the object whose entry (of type `entry_type`, content `content`) is at
    /// `reference`: borrowed from memory, or read from its segment's image and verified. The
    /// caller holds the object's bucket lock (so the cleaner cannot move it and delete the
    /// image meanwhile).
    pub(crate) fn object_value<'c>(
        &self,
        reference: Reference,
        entry_type: EntryType,
        content: &'c [u8],
    ) -> Result<Cow<'c, [u8]>, ObjectError> {
        if entry_type == EntryType::Object {
            let object = decode_object_unverified(content).expect("corrupt object in the log");
            return Ok(Cow::Borrowed(object.value));
        }
        assert_eq!(entry_type, EntryType::FlashObject, "hash table points at a non-object");
        let (stub, locator) = decode_flash_object(content).expect("corrupt flash object");
        let segment_id = self.log.segment_of(reference);
        let bytes = self.read_image_entry(segment_id, locator)?;
        let header = decode_entry_header(&bytes).map_err(|_| ObjectError::FlashCorrupt)?;
        let object = (header.entry_type == EntryType::Object)
            .then(|| decode_object(&bytes[header.header_bytes..]).ok())
            .flatten()
            .filter(|object| {
                (object.table, object.key, object.version) == (stub.table, stub.key, stub.version)
                    && same_checksum(content, &bytes[header.header_bytes..])
            });
        let Some(object) = object else {
            self.flash.reads_failed.fetch_add(1, Ordering::Relaxed);
            return Err(ObjectError::FlashCorrupt);
        };
        self.flash.values_read.fetch_add(1, Ordering::Relaxed);
        Ok(Cow::Owned(object.value.to_vec()))
    }

    /// The whole OBJECT entry (header and content) a FLASH_OBJECT stands for.
    fn read_image_entry(
        &self,
        segment_id: SegmentId,
        locator: FlashLocator,
    ) -> Result<Vec<u8>, ObjectError> {
        let images = self.flash.images.as_ref().expect("a flash object without a flash tier");
        let read = images.read(segment_id, locator.entry_offset, locator.entry_bytes);
        let bytes = read.inspect_err(|_| {
            self.flash.reads_failed.fetch_add(1, Ordering::Relaxed);
        });
        let bytes = bytes.map_err(ObjectError::FlashRead)?;
        if bytes.len() != locator.entry_bytes as usize {
            self.flash.reads_failed.fetch_add(1, Ordering::Relaxed);
            return Err(ObjectError::FlashCorrupt);
        }
        Ok(bytes)
    }

    /// The OBJECT content a FLASH_OBJECT at `reference` stands for, verified (for combined
    /// cleaning, which writes it whole into a survivor).
    pub(crate) fn flash_object_content(
        &self,
        reference: Reference,
        content: &[u8],
    ) -> Result<Vec<u8>, ObjectError> {
        let (stub, locator) = decode_flash_object(content).expect("corrupt flash object");
        let bytes = self.read_image_entry(self.log.segment_of(reference), locator)?;
        let header = decode_entry_header(&bytes).map_err(|_| ObjectError::FlashCorrupt)?;
        let object_content = &bytes[header.header_bytes..];
        let verified = header.entry_type == EntryType::Object
            && same_checksum(content, object_content)
            && decode_object(object_content).is_ok_and(|object| {
                (object.table, object.key, object.version) == (stub.table, stub.key, stub.version)
            });
        if !verified {
            self.flash.reads_failed.fetch_add(1, Ordering::Relaxed);
            return Err(ObjectError::FlashCorrupt);
        }
        Ok(object_content.to_vec())
    }

    /// Marks the images of `segments` (just cleaned) for deletion once the segments have left
    /// the log: until the next head's digest omits them they are still the log's, and a
    /// backup lost meanwhile is re-replicated from their images.
    pub(crate) fn forget_images(&self, segments: &[SegmentId]) {
        if self.flash.images.is_none() {
            return;
        }
        let mut state = self.flash.state();
        for segment in segments {
            state.nothing_to_demote.remove(segment);
            if state.imaged.contains_key(segment) {
                state.leaving.insert(*segment);
            }
        }
        drop(state);
        self.retire_images();
    }

    /// Deletes the images of cleaned segments that are no longer in the log.
    pub(crate) fn retire_images(&self) {
        let Some(images) = &self.flash.images else { return };
        if self.flash.state().leaving.is_empty() {
            return;
        }
        let in_log: BTreeSet<SegmentId> = self.log.segment_ids().into_iter().collect();
        let mut state = self.flash.state();
        let gone: Vec<SegmentId> =
            state.leaving.iter().copied().filter(|segment| !in_log.contains(segment)).collect();
        for segment in gone {
            state.leaving.remove(&segment);
            state.unreadable.remove(&segment);
            state.imaged.remove(&segment);
            images.delete_image(segment);
            state.totals.images_deleted += 1;
            state.full = false;
        }
    }

    /// A new table is on flash: segments found to hold no flash object may hold its objects.
    pub(crate) fn flash_table_added(&self) {
        self.flash.state().nothing_to_demote.clear();
    }

    /// The table's tier as the cleaner sees it (tests set tiers directly).
    pub(crate) fn is_flash_table(&self, table: TableId) -> bool {
        self.table_tier(table) == Tier::Flash
    }
}

/// Whether a FLASH_OBJECT's content and an OBJECT's content carry the same checksum (the
/// FLASH_OBJECT keeps the checksum of the object it stands for).
fn same_checksum(flash_object: &[u8], object: &[u8]) -> bool {
    flash_object.get(..4).is_some_and(|checksum| object.get(..4) == Some(checksum))
}

/// Whether moving `object` to flash saves memory: its FLASH_OBJECT (prefix, key and an 8-byte
/// locator) must be smaller than it, so its value must be longer than the locator.
pub(crate) fn demotable(object: &ObjectView<'_>) -> bool {
    object.value.len() > FLASH_LOCATOR_BYTES
}

/// The offset and size of every entry of a segment's bytes, in order.
fn entry_offsets(segment: &[u8]) -> Vec<(u32, u32)> {
    let mut offsets = Vec::new();
    let mut position = 0usize;
    while position < segment.len() {
        let header =
            decode_entry_header(&segment[position..]).expect("a segment's own bytes parse");
        let bytes = header.header_bytes + header.content_bytes as usize;
        offsets.push((position as u32, bytes as u32));
        position += bytes;
    }
    offsets
}

/// Segment images in memory, for tests (and a model of what the server's files must do).
#[derive(Debug, Default)]
pub struct MemoryImages {
    images: Mutex<BTreeMap<SegmentId, Vec<u8>>>,
    /// Images beyond this many are refused (`Full`).
    images_max: Option<usize>,
}

impl MemoryImages {
    /// An empty store of images that refuses any beyond `images_max` (`Full`).
    pub fn with_images_max(images_max: usize) -> MemoryImages {
        MemoryImages { images_max: Some(images_max), ..MemoryImages::default() }
    }

    /// Images held now.
    pub fn image_count(&self) -> usize {
        self.images.lock().expect("images poisoned").len()
    }

    /// Flips one byte of an image (tests of corruption).
    pub fn corrupt(&self, segment: SegmentId, offset: usize) {
        let mut images = self.images.lock().expect("images poisoned");
        let image = images.get_mut(&segment).expect("no such image");
        image[offset] ^= 0xFF;
    }
}

impl FlashImages for MemoryImages {
    fn write_image(&self, segment: SegmentId, bytes: &[u8]) -> Result<(), FlashImageError> {
        let mut images = self.images.lock().expect("images poisoned");
        if self.images_max.is_some_and(|max| images.len() >= max) {
            return Err(FlashImageError::Full);
        }
        images.insert(segment, bytes.to_vec());
        Ok(())
    }

    fn read(
        &self,
        segment: SegmentId,
        offset: u32,
        length: u32,
    ) -> Result<Vec<u8>, FlashImageError> {
        let images = self.images.lock().expect("images poisoned");
        let image = images.get(&segment).ok_or(FlashImageError::Missing(segment))?;
        let range = offset as usize..offset as usize + length as usize;
        image.get(range).map(<[u8]>::to_vec).ok_or(FlashImageError::ShortRead)
    }

    fn delete_image(&self, segment: SegmentId) {
        self.images.lock().expect("images poisoned").remove(&segment);
    }
}
