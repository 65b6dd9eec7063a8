//! The log: segments built from seglets of one preallocated region, a single head that accepts
//! appends, per-segment statistics and certificates, and reads of entries by reference.
//!
//! Appends are serialized by one mutex (the log lock). Reads take no log lock: a reference is a
//! byte offset into the region, and the seglet tables needed to follow an entry across seglets
//! are atomics written before the entry's bytes are published (see `seglet_memory`).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use stratus_types::{SegmentId, ServerId, Version};

use crate::format::{
    decode_entry_header, encode_log_digest, encode_safe_version,
    entry_header_bytes_from_first_byte, log_digest_content_bytes, Certificate, CertificateBuilder,
    EntryHeader, EntryType, SegmentHeader, ENTRY_HEADER_BYTES_MAX, ENTRY_TYPE_SLOTS,
    SAFE_VERSION_CONTENT_BYTES, SEGMENT_HEADER_CONTENT_BYTES,
};
use crate::seglet_memory::SegletMemory;

/// Bits of a reference: the hash table stores references in 47 bits.
pub const REFERENCE_BITS: u32 = 47;

/// Largest log region a reference can address (128 TiB).
pub const LOG_BYTES_MAX: u64 = 1 << REFERENCE_BITS;

/// Marks "no next seglet" in the seglet chain table.
const NO_SEGLET: u32 = u32::MAX;

/// Marks a seglet that belongs to no segment in the owner table (segment ids start at 1).
const NO_SEGMENT: u64 = 0;

/// The location of an entry: the byte offset of its header in the log region. Always below
/// 2^47, and never 0 for an object or tombstone (offset 0 holds the first segment header), so a
/// hash-table word is never all-zero for a stored reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference(pub u64);

/// Sizes of the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Bytes of the log region (rounded down to whole seglets).
    pub log_bytes: u64,
    /// Capacity of one segment; a multiple of `seglet_bytes`.
    pub segment_bytes: u32,
    /// Bytes per seglet, the unit of memory allocation.
    pub seglet_bytes: u32,
}

impl LogConfig {
    /// Seglets kept back for appends that may use the reserve (tombstones of removes): two
    /// segments' worth, so that deletes, which free memory once the cleaner exists, can still
    /// be logged when ordinary writes are refused.
    pub fn reserve_seglets(&self) -> u32 {
        2 * (self.segment_bytes / self.seglet_bytes)
    }

    /// Seglets in the region.
    pub fn seglet_count(&self) -> u32 {
        (self.log_bytes / u64::from(self.seglet_bytes)).min(u64::from(u32::MAX - 1)) as u32
    }

    /// Most segments the log can hold in this version (no compaction): every segment but the
    /// head is closed only when an append does not fit, so each uses at least half its
    /// capacity (appends are at most a quarter segment, see [`LogConfig::validate`]).
    pub fn segment_count_max(&self) -> usize {
        (self.log_bytes / (u64::from(self.segment_bytes) / 2)) as usize + 2
    }

    /// Bytes a new head's fixed entries (header, digest, safe version) can take at most.
    pub fn head_entries_bytes_max(&self) -> usize {
        2 * ENTRY_HEADER_BYTES_MAX
            + SEGMENT_HEADER_CONTENT_BYTES
            + log_digest_content_bytes(self.segment_count_max())
            + ENTRY_HEADER_BYTES_MAX
            + SAFE_VERSION_CONTENT_BYTES
    }

    /// Checks the sizes; `Err` names the broken rule.
    pub fn validate(&self) -> Result<(), &'static str> {
        if !self.seglet_bytes.is_power_of_two() || self.seglet_bytes < 1024 {
            return Err("seglet_bytes must be a power of two >= 1 KiB");
        }
        if self.segment_bytes == 0
            || !self.segment_bytes.is_multiple_of(self.seglet_bytes)
            || self.segment_bytes > (1 << 30)
        {
            return Err("segment_bytes must be a non-zero multiple of seglet_bytes, <= 1 GiB");
        }
        if self.log_bytes >= LOG_BYTES_MAX {
            return Err("log_bytes must be below 2^47 (47-bit references)");
        }
        if self.log_bytes / u64::from(self.seglet_bytes) >= u64::from(u32::MAX - 1) {
            return Err("too many seglets");
        }
        // Room for the reserve plus at least two ordinary segments.
        if self.log_bytes < 4 * u64::from(self.segment_bytes) {
            return Err("log_bytes must hold at least 4 segments");
        }
        if self.head_entries_bytes_max() > self.segment_bytes as usize / 4 {
            return Err("segment_bytes too small for a log digest of this log");
        }
        Ok(())
    }
}

/// Whether an append may use the reserved seglets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendPriority {
    /// Ordinary writes: refused when only the reserve is left.
    Normal,
    /// Tombstones of removes: may use the reserve, so deletes work when memory is full.
    MayUseReserve,
}

/// Why an append failed. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendError {
    /// Not enough free seglets (the caller answers RETRY).
    LogFull,
    /// The entries cannot fit in one segment even when it is empty.
    TooLarge,
}

/// One entry to append: its type and its content as up to three pieces (so an object's key and
/// value are copied straight from the request into the log).
#[derive(Clone, Copy, Debug)]
pub struct AppendEntry<'a> {
    /// The entry's type.
    pub entry_type: EntryType,
    /// The content, concatenated in order.
    pub pieces: [&'a [u8]; 3],
}

impl<'a> AppendEntry<'a> {
    /// An entry with a single-piece content.
    pub fn new(entry_type: EntryType, content: &'a [u8]) -> AppendEntry<'a> {
        AppendEntry { entry_type, pieces: [content, &[], &[]] }
    }

    fn content_bytes(&self) -> usize {
        self.pieces.iter().map(|piece| piece.len()).sum()
    }
}

/// Where an append went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The segment holding every appended entry.
    pub segment_id: SegmentId,
    /// The references of the entries, in order.
    pub references: Vec<Reference>,
}

/// Per-segment soft-state counters. They only increase: on append and on free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStatistics {
    /// Bytes (header + content) appended, per entry type code.
    pub entry_bytes: [u64; ENTRY_TYPE_SLOTS],
    /// Bytes freed, per entry type code.
    pub dead_bytes: [u64; ENTRY_TYPE_SLOTS],
    /// Entries appended, per entry type code.
    pub entry_count: [u64; ENTRY_TYPE_SLOTS],
    /// Entries freed, per entry type code.
    pub dead_count: [u64; ENTRY_TYPE_SLOTS],
}

impl SegmentStatistics {
    /// Bytes appended and not freed.
    pub fn live_bytes(&self) -> u64 {
        self.entry_bytes.iter().sum::<u64>() - self.dead_bytes.iter().sum::<u64>()
    }
}

/// Totals over the whole log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStatistics {
    /// Bytes of the region.
    pub log_bytes_total: u64,
    /// Bytes of all entries appended and not freed (segment headers, digests and safe versions
    /// count as live in this version).
    pub log_bytes_live: u64,
    /// Bytes of seglets allocated to segments.
    pub log_bytes_allocated: u64,
    /// Seglets in the region.
    pub seglets_total: u64,
    /// Seglets not allocated to any segment.
    pub seglets_free: u64,
    /// Segments in the log, head included.
    pub segments_in_log: u64,
    /// The next version a new object would receive.
    pub safe_version: u64,
}

/// A segment's bookkeeping, owned by the log state.
#[derive(Debug)]
struct SegmentRecord {
    /// Seglets in order; the segment's bytes are their concatenation.
    seglets: Vec<u32>,
    /// Bytes appended.
    length: u32,
    /// Running certificate over the entry headers.
    certificate: CertificateBuilder,
    statistics: SegmentStatistics,
}

/// State changed only under the log lock.
#[derive(Debug)]
struct LogState {
    /// Free seglets (a stack: recently freed seglets are reused first, once freeing exists).
    free_seglets: Vec<u32>,
    segments: BTreeMap<SegmentId, SegmentRecord>,
    head: Option<SegmentId>,
    next_segment_id: u64,
}

/// The log of one master.
#[derive(Debug)]
pub struct Log {
    memory: SegletMemory,
    config: LogConfig,
    log_id: ServerId,
    /// Per seglet: the id of the segment that owns it (the seglet → segment table).
    seglet_owner: Box<[AtomicU64]>,
    /// Per seglet: the next seglet of the same segment, to gather spanning entries.
    seglet_next: Box<[AtomicU32]>,
    /// The master-wide version counter: the next version a new object receives.
    safe_version: AtomicU64,
    state: Mutex<LogState>,
}

impl Log {
    /// Creates an empty log (no head yet; the first append opens one). Panics on an invalid
    /// configuration: callers validate first.
    pub fn new(config: LogConfig, log_id: ServerId) -> Log {
        if let Err(reason) = config.validate() {
            panic!("invalid log configuration: {reason}");
        }
        let seglet_count = config.seglet_count();
        Log {
            memory: SegletMemory::new(seglet_count, config.seglet_bytes),
            config,
            log_id,
            seglet_owner: (0..seglet_count).map(|_| AtomicU64::new(NO_SEGMENT)).collect(),
            seglet_next: (0..seglet_count).map(|_| AtomicU32::new(NO_SEGLET)).collect(),
            safe_version: AtomicU64::new(1),
            state: Mutex::new(LogState {
                // Reversed so that seglets are handed out in ascending order (easier to debug).
                free_seglets: (0..seglet_count).rev().collect(),
                segments: BTreeMap::new(),
                head: None,
                next_segment_id: 1,
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// The log's owner.
    pub fn log_id(&self) -> ServerId {
        self.log_id
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A panic while holding the log lock means a broken invariant; the state may be
        // inconsistent, so refuse to continue rather than corrupt the log.
        self.state.lock().expect("log lock poisoned by a panic in the storage path")
    }

    // -----------------------------------------------------------------------------------------
    // Versions
    // -----------------------------------------------------------------------------------------

    /// Returns the next version for a new object and advances the counter.
    pub fn allocate_version(&self) -> Version {
        Version(self.safe_version.fetch_add(1, Ordering::AcqRel))
    }

    /// Raises the counter to at least `version` (after a remove: removed version + 1).
    pub fn raise_safe_version(&self, version: Version) {
        self.safe_version.fetch_max(version.0, Ordering::AcqRel);
    }

    /// The next version a new object would receive.
    pub fn safe_version(&self) -> Version {
        Version(self.safe_version.load(Ordering::Acquire))
    }

    // -----------------------------------------------------------------------------------------
    // Appending
    // -----------------------------------------------------------------------------------------

    /// Appends `entries` atomically to the head: all go into the same segment, contiguously and
    /// in order. If they do not fit in the current head, a new head is opened first. Fails
    /// without writing anything if memory is short.
    pub fn append(
        &self,
        entries: &[AppendEntry<'_>],
        priority: AppendPriority,
    ) -> Result<Appended, AppendError> {
        let append_bytes: usize = entries
            .iter()
            .map(|entry| {
                let content = entry.content_bytes();
                EntryHeader::new(entry.entry_type, content_length(content)).header_bytes() + content
            })
            .sum();
        if append_bytes + self.config.head_entries_bytes_max() > self.config.segment_bytes as usize
        {
            return Err(AppendError::TooLarge);
        }
        let mut state = self.lock();
        let head_fits = state.head.is_some_and(|head| {
            state.segments[&head].length as usize + append_bytes
                <= self.config.segment_bytes as usize
        });
        if !head_fits {
            let head_entries = self.new_head_entry_bytes(&state);
            let needed = self.seglets_for(head_entries + append_bytes);
            self.check_free_seglets(&state, needed, priority)?;
            self.open_head(&mut state);
        } else {
            let head = &state.segments[&state.head.expect("head exists")];
            let needed = self
                .seglets_for(head.length as usize + append_bytes)
                .saturating_sub(head.seglets.len());
            self.check_free_seglets(&state, needed, priority)?;
        }
        let head_id = state.head.expect("a head was opened above");
        let references =
            entries.iter().map(|entry| self.append_entry(&mut state, head_id, entry)).collect();
        Ok(Appended { segment_id: head_id, references })
    }

    /// Closes the current head and opens a new one (a clean position for tablet creation).
    pub fn roll_head(&self, priority: AppendPriority) -> Result<SegmentId, AppendError> {
        let mut state = self.lock();
        let needed = self.seglets_for(self.new_head_entry_bytes(&state));
        self.check_free_seglets(&state, needed, priority)?;
        Ok(self.open_head(&mut state))
    }

    fn seglets_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.config.seglet_bytes as usize)
    }

    fn check_free_seglets(
        &self,
        state: &LogState,
        needed: usize,
        priority: AppendPriority,
    ) -> Result<(), AppendError> {
        let reserve = match priority {
            AppendPriority::Normal => self.config.reserve_seglets() as usize,
            AppendPriority::MayUseReserve => 0,
        };
        if state.free_seglets.len() < needed + reserve {
            return Err(AppendError::LogFull);
        }
        Ok(())
    }

    /// Bytes of the header, digest and safe version a new head would start with.
    fn new_head_entry_bytes(&self, state: &LogState) -> usize {
        let digest = log_digest_content_bytes(state.segments.len() + 1);
        EntryHeader::new(EntryType::SegmentHeader, SEGMENT_HEADER_CONTENT_BYTES as u32)
            .header_bytes()
            + SEGMENT_HEADER_CONTENT_BYTES
            + EntryHeader::new(EntryType::LogDigest, digest as u32).header_bytes()
            + digest
            + EntryHeader::new(EntryType::SafeVersion, SAFE_VERSION_CONTENT_BYTES as u32)
                .header_bytes()
            + SAFE_VERSION_CONTENT_BYTES
    }

    /// Opens a new head holding SEGMENT_HEADER, LOG_DIGEST (every segment in the log, the new
    /// head included) and SAFE_VERSION. The caller checked that enough seglets are free.
    fn open_head(&self, state: &mut LogState) -> SegmentId {
        let segment_id = SegmentId(state.next_segment_id);
        state.next_segment_id += 1;
        assert!(
            state.segments.len() < self.config.segment_count_max(),
            "more segments than the digest was sized for"
        );
        state.segments.insert(
            segment_id,
            SegmentRecord {
                seglets: Vec::new(),
                length: 0,
                certificate: CertificateBuilder::default(),
                statistics: SegmentStatistics::default(),
            },
        );
        state.head = Some(segment_id);
        let header = SegmentHeader {
            log_id: self.log_id,
            segment_id,
            capacity_bytes: self.config.segment_bytes,
        }
        .encode();
        let segment_ids: Vec<SegmentId> = state.segments.keys().copied().collect();
        let digest = encode_log_digest(&segment_ids);
        let safe_version = encode_safe_version(self.safe_version());
        for entry in [
            AppendEntry::new(EntryType::SegmentHeader, &header),
            AppendEntry::new(EntryType::LogDigest, &digest),
            AppendEntry::new(EntryType::SafeVersion, &safe_version),
        ] {
            self.append_entry(state, segment_id, &entry);
        }
        segment_id
    }

    /// Writes one entry at the end of segment `segment_id`, allocating seglets as it grows.
    fn append_entry(
        &self,
        state: &mut LogState,
        segment_id: SegmentId,
        entry: &AppendEntry<'_>,
    ) -> Reference {
        let content_bytes = entry.content_bytes();
        let header = EntryHeader::new(entry.entry_type, content_length(content_bytes));
        let LogState { free_seglets, segments, .. } = state;
        let segment = segments.get_mut(&segment_id).expect("appending to a missing segment");
        let start = segment.length as usize;
        let entry_bytes = header.header_bytes() + content_bytes;
        assert!(
            start + entry_bytes <= self.config.segment_bytes as usize,
            "entry crosses the end of its segment"
        );
        self.write_bytes(free_seglets, segment, segment_id, header.as_bytes());
        for piece in entry.pieces {
            self.write_bytes(free_seglets, segment, segment_id, piece);
        }
        segment.certificate.add_header(header.as_bytes());
        let type_index = entry.entry_type.code() as usize;
        segment.statistics.entry_bytes[type_index] += entry_bytes as u64;
        segment.statistics.entry_count[type_index] += 1;
        let seglet_bytes = self.config.seglet_bytes as usize;
        let seglet = segment.seglets[start / seglet_bytes];
        Reference(u64::from(seglet) * seglet_bytes as u64 + (start % seglet_bytes) as u64)
    }

    /// Copies `bytes` to the end of `segment`, allocating seglets (from the free list, whose
    /// size the caller checked) as the segment grows.
    fn write_bytes(
        &self,
        free_seglets: &mut Vec<u32>,
        segment: &mut SegmentRecord,
        segment_id: SegmentId,
        mut bytes: &[u8],
    ) {
        let seglet_bytes = self.config.seglet_bytes as usize;
        while !bytes.is_empty() {
            let position = segment.length as usize;
            let seglet_position = position / seglet_bytes;
            if seglet_position == segment.seglets.len() {
                let seglet = free_seglets.pop().expect("free seglets were counted before append");
                // Publish the seglet's owner and link before any entry bytes in it are
                // published (the seglet memory's Release store orders these before them).
                self.seglet_owner[seglet as usize].store(segment_id.0, Ordering::Release);
                self.seglet_next[seglet as usize].store(NO_SEGLET, Ordering::Release);
                if let Some(&previous) = segment.seglets.last() {
                    self.seglet_next[previous as usize].store(seglet, Ordering::Release);
                }
                segment.seglets.push(seglet);
            }
            let offset = position % seglet_bytes;
            let chunk = bytes.len().min(seglet_bytes - offset);
            self.memory.write(segment.seglets[seglet_position], offset as u32, &bytes[..chunk]);
            segment.length += chunk as u32;
            bytes = &bytes[chunk..];
        }
    }

    // -----------------------------------------------------------------------------------------
    // Reading
    // -----------------------------------------------------------------------------------------

    fn split_reference(&self, reference: Reference) -> (u32, u32) {
        let seglet_bytes = u64::from(self.config.seglet_bytes);
        let seglet = reference.0 / seglet_bytes;
        assert!(seglet < u64::from(self.memory.seglet_count()), "reference outside the log");
        (seglet as u32, (reference.0 % seglet_bytes) as u32)
    }

    /// Copies `length` bytes starting at `reference`, following the segment's seglet chain.
    fn gather(&self, reference: Reference, length: usize, out: &mut Vec<u8>) {
        let (mut seglet, mut offset) = self.split_reference(reference);
        let mut remaining = length;
        loop {
            let chunk = remaining.min((self.config.seglet_bytes - offset) as usize);
            out.extend_from_slice(self.memory.read(seglet, offset, chunk));
            remaining -= chunk;
            if remaining == 0 {
                return;
            }
            seglet = self.seglet_next[seglet as usize].load(Ordering::Acquire);
            assert_ne!(seglet, NO_SEGLET, "entry runs past the end of its segment");
            offset = 0;
        }
    }

    /// The type and content of the entry at `reference`: borrowed from the log when contiguous
    /// (the common case), gathered into a copy when it spans seglets. Panics if the reference
    /// does not point at a valid entry header: references come from the hash table and a bad
    /// one is a broken invariant.
    pub fn entry(&self, reference: Reference) -> (EntryType, Cow<'_, [u8]>) {
        let (seglet, offset) = self.split_reference(reference);
        let first = self.memory.read(seglet, offset, 1)[0];
        let header_bytes = entry_header_bytes_from_first_byte(first);
        let fits = |bytes: usize| offset as usize + bytes <= self.config.seglet_bytes as usize;
        let header = if fits(header_bytes) {
            decode_entry_header(self.memory.read(seglet, offset, header_bytes))
        } else {
            let mut bytes = Vec::with_capacity(header_bytes);
            self.gather(reference, header_bytes, &mut bytes);
            decode_entry_header(&bytes)
        }
        .expect("reference does not point at a valid entry header");
        let entry_bytes = header.header_bytes + header.content_bytes as usize;
        if fits(entry_bytes) {
            let content = self.memory.read(
                seglet,
                offset + header_bytes as u32,
                header.content_bytes as usize,
            );
            (header.entry_type, Cow::Borrowed(content))
        } else {
            let mut bytes = Vec::with_capacity(entry_bytes);
            self.gather(reference, entry_bytes, &mut bytes);
            bytes.drain(..header_bytes);
            (header.entry_type, Cow::Owned(bytes))
        }
    }

    /// The segment holding the entry at `reference`.
    pub fn segment_of(&self, reference: Reference) -> SegmentId {
        let (seglet, _) = self.split_reference(reference);
        let owner = self.seglet_owner[seglet as usize].load(Ordering::Acquire);
        assert_ne!(owner, NO_SEGMENT, "reference into a free seglet");
        SegmentId(owner)
    }

    /// Records the entry at `reference` as dead in its segment's statistics. Memory is not
    /// reclaimed in this version (the cleaner will).
    pub fn free(&self, reference: Reference) {
        let segment_id = self.segment_of(reference);
        let (entry_type, content) = self.entry(reference);
        let content_bytes = content.len();
        let entry_bytes = EntryHeader::new(entry_type, content_length(content_bytes))
            .header_bytes()
            + content_bytes;
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("freeing into a missing segment");
        let type_index = entry_type.code() as usize;
        segment.statistics.dead_bytes[type_index] += entry_bytes as u64;
        segment.statistics.dead_count[type_index] += 1;
        assert!(
            segment.statistics.dead_bytes[type_index] <= segment.statistics.entry_bytes[type_index],
            "more bytes freed than appended"
        );
    }

    // -----------------------------------------------------------------------------------------
    // Segments
    // -----------------------------------------------------------------------------------------

    /// Ids of every segment in the log, ascending.
    pub fn segment_ids(&self) -> Vec<SegmentId> {
        self.lock().segments.keys().copied().collect()
    }

    /// The current head, if any append happened yet.
    pub fn head_segment_id(&self) -> Option<SegmentId> {
        self.lock().head
    }

    /// A segment's current certificate.
    pub fn certificate(&self, segment_id: SegmentId) -> Option<Certificate> {
        let state = self.lock();
        let segment = state.segments.get(&segment_id)?;
        Some(segment.certificate.certificate(segment.length))
    }

    /// A copy of a segment's bytes with the certificate that commits exactly them (what a
    /// backup receives, and what tests feed to the segment iterator).
    pub fn segment_contents(&self, segment_id: SegmentId) -> Option<(Vec<u8>, Certificate)> {
        let state = self.lock();
        let segment = state.segments.get(&segment_id)?;
        let mut bytes = Vec::with_capacity(segment.length as usize);
        if segment.length > 0 {
            let first =
                Reference(u64::from(segment.seglets[0]) * u64::from(self.config.seglet_bytes));
            self.gather(first, segment.length as usize, &mut bytes);
        }
        Some((bytes, segment.certificate.certificate(segment.length)))
    }

    /// A segment's statistics.
    pub fn segment_statistics(&self, segment_id: SegmentId) -> Option<SegmentStatistics> {
        self.lock().segments.get(&segment_id).map(|segment| segment.statistics)
    }

    /// Totals over the log.
    pub fn statistics(&self) -> LogStatistics {
        let state = self.lock();
        let seglets_total = u64::from(self.memory.seglet_count());
        let seglets_free = state.free_seglets.len() as u64;
        LogStatistics {
            log_bytes_total: seglets_total * u64::from(self.config.seglet_bytes),
            log_bytes_live: state.segments.values().map(|s| s.statistics.live_bytes()).sum(),
            log_bytes_allocated: (seglets_total - seglets_free)
                * u64::from(self.config.seglet_bytes),
            seglets_total,
            seglets_free,
            segments_in_log: state.segments.len() as u64,
            safe_version: self.safe_version().0,
        }
    }
}

/// An entry content length as the u32 the header stores; contents are bounded by the segment
/// size (<= 1 GiB), so a larger one is a broken invariant.
fn content_length(content_bytes: usize) -> u32 {
    u32::try_from(content_bytes).expect("entry content larger than 4 GiB")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{encode_object, encode_tombstone, Entry, TombstoneView};
    use crate::iterator::SegmentIterator;
    use stratus_types::TableId;

    fn small_config() -> LogConfig {
        LogConfig { log_bytes: 64 << 10, segment_bytes: 8 << 10, seglet_bytes: 1 << 10 }
    }

    fn object_entry(content: &[u8]) -> AppendEntry<'_> {
        AppendEntry::new(EntryType::Object, content)
    }

    #[test]
    fn first_append_opens_a_head_with_header_digest_and_safe_version() {
        let log = Log::new(small_config(), ServerId(7));
        let object = encode_object(TableId(1), Version(1), 10, b"k", b"v");
        let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        assert_eq!(appended.segment_id, SegmentId(1));
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let entries: Vec<_> =
            SegmentIterator::new(&bytes, &certificate).unwrap().map(Result::unwrap).collect();
        assert_eq!(entries.len(), 4);
        assert!(matches!(entries[0].entry, Entry::SegmentHeader(header)
            if header.segment_id == SegmentId(1) && header.log_id == ServerId(7)));
        assert_eq!(entries[1].entry, Entry::LogDigest(vec![SegmentId(1)]));
        assert_eq!(entries[2].entry, Entry::SafeVersion(Version(1)));
        assert!(matches!(entries[3].entry, Entry::Object(view) if view.key == b"k"));
        assert_eq!(u64::from(entries[3].offset), appended.references[0].0);
        let (entry_type, content) = log.entry(appended.references[0]);
        assert_eq!(entry_type, EntryType::Object);
        assert_eq!(&content[..], &object[..]);
    }

    #[test]
    fn entries_spanning_seglets_read_back_equal() {
        let log = Log::new(small_config(), ServerId(1));
        let mut written = Vec::new();
        for index in 0..40u32 {
            let value = vec![index as u8; 300 + (index as usize * 37) % 700];
            let object =
                encode_object(TableId(1), Version(u64::from(index) + 1), 0, b"key", &value);
            let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
            written.push((appended.references[0], object));
        }
        for (reference, object) in &written {
            let (_, content) = log.entry(*reference);
            assert_eq!(&content[..], &object[..]);
        }
        assert!(log.segment_ids().len() > 1, "test should have rolled the head");
        for segment_id in log.segment_ids() {
            let (bytes, certificate) = log.segment_contents(segment_id).unwrap();
            for entry in SegmentIterator::new(&bytes, &certificate).unwrap() {
                entry.unwrap();
            }
        }
        // The last digest lists every segment.
        let last = *log.segment_ids().last().unwrap();
        let (bytes, certificate) = log.segment_contents(last).unwrap();
        let digest = SegmentIterator::new(&bytes, &certificate)
            .unwrap()
            .find_map(|entry| match entry.unwrap().entry {
                Entry::LogDigest(ids) => Some(ids),
                _ => None,
            })
            .unwrap();
        assert_eq!(digest, log.segment_ids());
    }

    #[test]
    fn multi_entry_append_stays_in_one_segment() {
        let log = Log::new(small_config(), ServerId(1));
        let filler = encode_object(TableId(1), Version(1), 0, b"f", &[0; 1500]);
        let object = encode_object(TableId(1), Version(2), 0, b"key", &[1; 900]);
        let tombstone = encode_tombstone(&TombstoneView {
            table: TableId(1),
            segment_id: SegmentId(1),
            object_version: Version(1),
            timestamp: 0,
            key: b"key",
        });
        for _ in 0..30 {
            let Ok(appended) = log.append(&[object_entry(&filler)], AppendPriority::Normal) else {
                break;
            };
            let pair = log.append(
                &[object_entry(&object), AppendEntry::new(EntryType::Tombstone, &tombstone)],
                AppendPriority::Normal,
            );
            let Ok(pair) = pair else { break };
            assert_eq!(log.segment_of(pair.references[0]), pair.segment_id);
            assert_eq!(log.segment_of(pair.references[1]), pair.segment_id);
            assert!(appended.segment_id <= pair.segment_id);
            let (entry_type, content) = log.entry(pair.references[1]);
            assert_eq!(entry_type, EntryType::Tombstone);
            assert_eq!(&content[..], &tombstone[..]);
        }
    }

    #[test]
    fn log_full_keeps_a_reserve_for_tombstones() {
        let log = Log::new(small_config(), ServerId(1));
        let object = encode_object(TableId(1), Version(1), 0, b"k", &[0; 500]);
        let mut appended = 0;
        while log.append(&[object_entry(&object)], AppendPriority::Normal).is_ok() {
            appended += 1;
            assert!(appended < 1000);
        }
        assert_eq!(
            log.append(&[object_entry(&object)], AppendPriority::Normal),
            Err(AppendError::LogFull)
        );
        let statistics = log.statistics();
        assert!(statistics.seglets_free >= u64::from(small_config().reserve_seglets()));
        log.append(&[object_entry(&object)], AppendPriority::MayUseReserve).unwrap();
        let too_big = vec![0; 8 << 10];
        assert_eq!(
            log.append(&[object_entry(&too_big)], AppendPriority::MayUseReserve),
            Err(AppendError::TooLarge)
        );
    }

    #[test]
    fn free_counts_dead_bytes() {
        let log = Log::new(small_config(), ServerId(1));
        let object = encode_object(TableId(1), Version(1), 0, b"k", b"value");
        let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        let before = log.segment_statistics(appended.segment_id).unwrap();
        log.free(appended.references[0]);
        let after = log.segment_statistics(appended.segment_id).unwrap();
        let object_index = EntryType::Object.code() as usize;
        assert_eq!(after.dead_bytes[object_index], before.entry_bytes[object_index]);
        assert_eq!(after.dead_count[object_index], 1);
        assert_eq!(before.live_bytes() - after.live_bytes(), object.len() as u64 + 2);
    }

    #[test]
    fn segment_corruption_is_detected_without_panics() {
        let log = Log::new(small_config(), ServerId(1));
        for index in 0..3u8 {
            let object = encode_object(TableId(1), Version(1), 0, &[index + 1], &[index; 700]);
            log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        }
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let entries: Vec<_> =
            SegmentIterator::new(&bytes, &certificate).unwrap().map(Result::unwrap).collect();
        let header_positions: Vec<usize> = entries
            .iter()
            .flat_map(|entry| {
                let start = entry.offset as usize;
                let header_bytes = entry_header_bytes_from_first_byte(bytes[start]);
                start..start + header_bytes
            })
            .collect();
        for index in 0..bytes.len() {
            let mut corrupt = bytes.clone();
            corrupt[index] ^= 0x21;
            let outcome: Result<Vec<_>, _> = SegmentIterator::new(&corrupt, &certificate)
                .and_then(|iterator| iterator.collect());
            if header_positions.contains(&index) {
                assert_eq!(outcome.unwrap_err(), crate::format::FormatError::CertificateMismatch);
            } else {
                assert!(outcome.is_err(), "flip at {index} went unnoticed");
            }
        }
        for length in 0..bytes.len() {
            assert!(SegmentIterator::new(&bytes[..length], &certificate).is_err());
            let shorter = CertificateBuilder::default().certificate(length as u32);
            assert!(SegmentIterator::new(&bytes, &shorter).is_err() || length == 0);
        }
        let wrong = Certificate { checksum: certificate.checksum ^ 1, ..certificate };
        assert!(SegmentIterator::new(&bytes, &wrong).is_err());
    }

    #[test]
    fn concurrent_appends_and_reads() {
        let log = Log::new(
            LogConfig { log_bytes: 1 << 20, segment_bytes: 64 << 10, seglet_bytes: 1 << 10 },
            ServerId(1),
        );
        std::thread::scope(|scope| {
            for thread in 0..4u8 {
                let log = &log;
                scope.spawn(move || {
                    for index in 0..100u32 {
                        let value = vec![thread; 50 + (index as usize % 300)];
                        let object =
                            encode_object(TableId(1), Version(1), index, &[thread + 1], &value);
                        let appended =
                            log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
                        let (_, content) = log.entry(appended.references[0]);
                        assert_eq!(&content[..], &object[..]);
                    }
                });
            }
        });
    }
}
