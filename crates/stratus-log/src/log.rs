//! The log: segments built from seglets of one preallocated region, a single head that accepts
//! appends, side-log survivor segments written by the cleaner, per-segment statistics and
//! certificates, reads of entries by reference under an epoch guard, and epoch-based freeing.
//!
//! Appends are serialized by one mutex (the log lock). Reads take no log lock: a reference is a
//! byte offset into the region, and the seglet tables needed to follow an entry across seglets
//! are atomics written before the entry's bytes are published (see `seglet_memory`). Every read
//! holds an [`EpochGuard`]; seglets of segments dropped by the cleaner are reused only after
//! every guard that could see them is gone.
//!
//! Membership: a segment is *in the log* once a log digest lists it. The cleaner's survivor
//! segments live beside the log (a side log) until the next head's digest fuses them in; the
//! segments they replace are dropped by that same digest, and their seglets retired then.
//! Lock order: a hash-table bucket lock may be held while taking the log lock, never the
//! reverse.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use stratus_types::{SegmentId, ServerId, Version};

use crate::format::{
    decode_entry_header, decode_flash_object, decode_tombstone, encode_log_digest,
    encode_safe_version, encode_table_stats, entry_header_bytes_from_first_byte,
    log_digest_content_bytes, object_expiry, segment_named_by, table_stats_content_bytes,
    Certificate, CertificateBuilder, EntryHeader, EntryType, SegmentHeader, ENTRY_HEADER_BYTES_MAX,
    ENTRY_TYPE_SLOTS, SAFE_VERSION_CONTENT_BYTES, SEGMENT_HEADER_CONTENT_BYTES,
    TABLE_STATS_TABLES_MAX,
};
use crate::free_seglets::{FreeSeglets, SegletSource};
use crate::seglet_memory::{EpochGuard, SegletMemory};
use crate::table_tallies::TableTallies;

/// Bits of a reference: the hash table stores references in 47 bits.
pub const REFERENCE_BITS: u32 = 47;

/// Largest log region a reference can address (128 TiB).
pub const LOG_BYTES_MAX: u64 = 1 << REFERENCE_BITS;

/// Segments the log may hold, as a multiple of the segments its memory could hold when full
/// (RAMCloud's disk expansion factor, source default 2.0). It bounds the log digest, and,
/// once replicas exist, the disk log; compaction shrinks segments in memory, so without this
/// bound their number would grow without limit. The balancer forces combined cleaning near it.
pub const DISK_EXPANSION_FACTOR: u64 = 2;

/// Segment ids the cleaner dropped from the log that are remembered for replication until it
/// asks ([`Log::take_dropped_segments`]); older ones are forgotten and only counted
/// ([`Log::dropped_segments_forgotten`]), so replication knows to find them by membership
/// instead (a segment it tracks that is no longer in the log).
pub const DROPPED_SEGMENTS_REMEMBERED_MAX: usize = 4096;

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
    /// Touch every page of the region when the log is created, so appends never fault.
    pub prefault_memory: bool,
    /// Bytes of segment images the master may keep on its flash (0: no flash tier). Segments
    /// whose objects moved to flash stay in the log with little memory, so the segment limit
    /// counts this space too.
    pub flash_image_bytes: u64,
}

impl LogConfig {
    /// Seglets kept back for appends that may use the reserve (tombstones of removes): two
    /// segments' worth, so that deletes, which free memory once cleaned, can still be logged
    /// when ordinary writes are refused.
    pub fn reserve_seglets(&self) -> u32 {
        2 * self.seglets_per_segment()
    }

    /// Seglets only the cleaner may use (RAMCloud's cleaner reserve plus the head that commits
    /// a pass): one segment of survivors and the seglets of a new head. A cleaning pass never
    /// needs more than this, so the cleaner can always run, whatever writes and removes did.
    pub fn cleaner_reserve_seglets(&self) -> u32 {
        self.seglets_per_segment() + self.head_seglets_max()
    }

    /// Seglets in one full segment.
    pub fn seglets_per_segment(&self) -> u32 {
        self.segment_bytes / self.seglet_bytes
    }

    /// Seglets a new head's fixed entries can take at most.
    pub fn head_seglets_max(&self) -> u32 {
        self.head_entries_bytes_max().div_ceil(self.seglet_bytes as usize) as u32
    }

    /// Seglets in the region.
    pub fn seglet_count(&self) -> u32 {
        (self.log_bytes / u64::from(self.seglet_bytes)).min(u64::from(u32::MAX - 1)) as u32
    }

    /// The memory a log of this configuration lives in, prefaulted if the configuration says
    /// so (which takes time in proportion to its size: a server does it before it enlists).
    pub fn allocate_memory(&self) -> SegletMemory {
        SegletMemory::with_prefault(self.seglet_count(), self.seglet_bytes, self.prefault_memory)
    }

    /// Most segments the log may hold: [`DISK_EXPANSION_FACTOR`] times the segments that fit in
    /// memory and in the flash images, plus the head being opened and one spare. New heads are refused beyond it.
    pub fn segment_count_max(&self) -> usize {
        let bytes = self.log_bytes + self.flash_image_bytes;
        (DISK_EXPANSION_FACTOR * (bytes / u64::from(self.segment_bytes))) as usize + 2
    }

    /// Tables a new head's TABLE_STATS entry lists one by one: [`TABLE_STATS_TABLES_MAX`], or
    /// fewer where that entry would take more than 1/64 of a segment (small test logs).
    pub fn table_stats_tables_max(&self) -> usize {
        let room = (self.segment_bytes as usize / 64).saturating_sub(table_stats_content_bytes(0));
        (room / table_stats_content_bytes(1).saturating_sub(table_stats_content_bytes(0)))
            .min(TABLE_STATS_TABLES_MAX)
    }

    /// Bytes a new head's fixed entries (header, digest, safe version, table stats) can take
    /// at most.
    pub fn head_entries_bytes_max(&self) -> usize {
        2 * ENTRY_HEADER_BYTES_MAX
            + SEGMENT_HEADER_CONTENT_BYTES
            + log_digest_content_bytes(self.segment_count_max())
            + ENTRY_HEADER_BYTES_MAX
            + SAFE_VERSION_CONTENT_BYTES
            + ENTRY_HEADER_BYTES_MAX
            + table_stats_content_bytes(self.table_stats_tables_max())
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
        // Room for the tombstone reserve, the cleaner reserve and at least two ordinary
        // segments.
        if self.log_bytes < 6 * u64::from(self.segment_bytes) {
            return Err("log_bytes must hold at least 6 segments");
        }
        if self.head_entries_bytes_max() > self.segment_bytes as usize / 4 {
            return Err("segment_bytes too small for a log digest of this log");
        }
        Ok(())
    }
}

/// Which free seglets an append may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendPriority {
    /// Ordinary writes: refused when only the reserves (tombstones and cleaner) are left.
    Normal,
    /// Tombstones of removes: may use the tombstone reserve, so deletes work when memory is
    /// full for writes.
    MayUseReserve,
    /// The cleaner's survivors and compactions: may use every free seglet but those of one
    /// head, so a pass can always be committed.
    Cleaner,
    /// The head that commits a cleaning pass: may use every free seglet. Only this append may
    /// take the last head's worth; without it a pass whose survivors filled memory could never
    /// be fused, its cleaned segments never freed, and the log would stay full for good.
    CleanerCommit,
}

/// Why an append failed. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendError {
    /// Not enough free seglets (the caller answers RETRY).
    LogFull,
    /// The entries cannot fit in one segment even when it is empty (for a survivor segment:
    /// they do not fit in what is left of it).
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

    /// Bytes the entry takes in the log (header + content).
    pub fn entry_bytes(&self) -> usize {
        let content = self.content_bytes();
        EntryHeader::new(self.entry_type, content_length(content)).header_bytes() + content
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
    /// The largest entry (header + content) ever appended: bounds the tail a survivor segment
    /// may waste when this segment's entries are moved into it.
    pub largest_entry_bytes: u64,
    /// Bytes of objects appended with an expiry time.
    pub expiring_object_bytes: u64,
    /// Of those, bytes freed.
    pub expiring_dead_bytes: u64,
    /// Bytes of the OBJECT entries that this segment's FLASH_OBJECT entries stand for (what
    /// combined cleaning writes back into memory for them).
    pub flash_backed_bytes: u64,
    /// Of those, bytes freed.
    pub flash_backed_dead_bytes: u64,
    /// The latest expiry time of an object appended here (0: none had one): once the clock
    /// passes it, every object here that has an expiry is expired, and the cleaner may count
    /// it as free space before it meets it.
    pub expiry_latest_millis: u64,
}

impl SegmentStatistics {
    /// Bytes appended and not freed.
    pub fn live_bytes(&self) -> u64 {
        self.entry_bytes.iter().sum::<u64>() - self.dead_bytes.iter().sum::<u64>()
    }

    /// Bytes of one type appended and not freed.
    pub fn live_bytes_of(&self, entry_type: EntryType) -> u64 {
        let index = entry_type.code() as usize;
        self.entry_bytes[index] - self.dead_bytes[index]
    }

    /// Bytes the cleaner would have to move: objects and completion records not freed, and
    /// tombstones (whose death is not tracked: they die when the segment they name leaves the
    /// log). Segment headers, digests and safe versions are never moved.
    pub fn movable_bytes(&self) -> u64 {
        self.live_bytes_of(EntryType::Object)
            + self.live_bytes_of(EntryType::Tombstone)
            + self.live_bytes_of(EntryType::Completion)
            + self.live_bytes_of(EntryType::Prepared)
            + self.live_bytes_of(EntryType::PreparedTombstone)
            + self.live_bytes_of(EntryType::TxParticipants)
            + self.live_bytes_of(EntryType::FlashObject)
    }

    /// Bytes combined cleaning would write into survivor segments at most: the movable bytes,
    /// with each live FLASH_OBJECT counted as the OBJECT it stands for (survivors hold whole
    /// objects, since survivors are replicated).
    pub fn survivor_bytes(&self) -> u64 {
        self.movable_bytes() - self.live_bytes_of(EntryType::FlashObject)
            + (self.flash_backed_bytes - self.flash_backed_dead_bytes)
    }

    /// Bytes of live objects that are expired at `now_millis`, as far as these counters can
    /// tell: all of the live expiring ones once the latest expiry has passed, none before (a
    /// lower bound, so the cleaner never expects more free space than it finds).
    pub fn expired_bytes(&self, now_millis: u64) -> u64 {
        if self.expiry_latest_millis == 0 || now_millis < self.expiry_latest_millis {
            return 0;
        }
        self.expiring_object_bytes - self.expiring_dead_bytes
    }
}

/// Totals over the whole log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStatistics {
    /// Bytes of the region.
    pub log_bytes_total: u64,
    /// Bytes of all entries appended and not freed, over the segments in the log and the
    /// cleaner's survivors (segment headers, digests and safe versions count as live).
    pub log_bytes_live: u64,
    /// Bytes of live objects.
    pub log_bytes_live_objects: u64,
    /// Bytes of tombstones (all are counted live until their segment is cleaned).
    pub log_bytes_tombstones: u64,
    /// Bytes of seglets allocated to segments.
    pub log_bytes_allocated: u64,
    /// Seglets in the region.
    pub seglets_total: u64,
    /// Seglets not allocated to any segment.
    pub seglets_free: u64,
    /// Seglets of dropped segments waiting for readers to finish (epochs) before reuse.
    pub seglets_waiting_for_readers: u64,
    /// Free seglets whose pages are resident (freed by cleaning and not given back).
    pub seglets_free_resident: u64,
    /// Bytes of the region whose pages are resident, at most: allocated seglets, those waiting
    /// for readers, and the resident free ones (what the log costs the machine).
    pub log_bytes_resident: u64,
    /// Segments in the log, head included.
    pub segments_in_log: u64,
    /// Segments the next head's digest would list besides itself: the log after the pending
    /// fusions and drops. This is what the segment limit
    /// ([`LogConfig::segment_count_max`]) counts.
    pub segments_in_next_digest: u64,
    /// Survivor segments written by the cleaner, not yet fused into the log.
    pub segments_side: u64,
    /// The next version a new object would receive.
    pub safe_version: u64,
}

/// A segment the cleaner may choose, with what the choice needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CleaningCandidate {
    /// The segment.
    pub segment_id: SegmentId,
    /// When it was created (seconds, from the times the caller reported).
    pub creation_seconds: u32,
    /// Seglets it holds.
    pub seglets: u32,
    /// Bytes of objects not freed and tombstones (what compacting it would move at most).
    pub movable_bytes: u64,
    /// What combined cleaning would write at most: `movable_bytes` with flash objects counted
    /// at their full size ([`SegmentStatistics::survivor_bytes`]).
    pub survivor_bytes: u64,
    /// Bytes of tombstones in it not known to be dead.
    pub tombstone_bytes: u64,
    /// When its tombstones were last scanned for dead ones (its creation time if never).
    pub tombstone_scan_seconds: u32,
    /// Its largest entry (header + content).
    pub largest_entry_bytes: u64,
    /// Bytes of tombstones elsewhere in the log that name it (they die when it is cleaned).
    pub tombstone_bytes_naming: u64,
}

/// Where a segment stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Membership {
    /// Listed by the newest digest.
    InLog,
    /// A survivor being written by the cleaner; not in the log.
    Side,
    /// A finished survivor; the next head's digest lists it.
    FusePending,
    /// Cleaned; the next head's digest omits it, then its seglets are retired.
    DropPending,
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
    /// Creation time (seconds), for the cleaner's age.
    creation_seconds: u32,
    membership: Membership,
    /// Opened as the log head (it starts with a digest), not as a cleaner's survivor. Kept by
    /// compaction. Replication reports such segments to the coordinator before acknowledging
    /// writes in them: recovery needs to know the last one.
    opened_as_head: bool,
    /// A cleaner has chosen it.
    cleaning: bool,
    /// Bytes of tombstones in the log that name it: they all die when it leaves the log
    /// (cleaning it frees them too, once the segments holding them are compacted or cleaned).
    /// Counted when a tombstone is appended at the head; relocation moves a tombstone without
    /// changing what it names, and a tombstone is dropped only once what it names is gone, so
    /// the count stays exact for this log's own tombstones. (A replayed tombstone names a
    /// segment of another master's log; if an id here matches, the count is only high: it
    /// steers the cleaner's choice, never correctness.)
    tombstone_bytes_naming: u64,
    /// When its tombstones were last scanned for dead ones.
    tombstone_scan_seconds: u32,
    /// While it is being compacted: the compacted copy being written (same id), and the
    /// seglets set aside for it.
    compaction: Option<Box<Compaction>>,
    /// Replication reported every byte of it, closed, on all its replicas. When the log
    /// requires replication, only such segments may be cleaned or compacted: compaction
    /// rewrites a segment in place, which would corrupt a replica still receiving its tail.
    replicated: bool,
}

/// A compaction in progress.
#[derive(Debug)]
struct Compaction {
    copy: SegmentRecord,
    spare_seglets: Vec<u32>,
}

/// State changed only under the log lock.
#[derive(Debug)]
struct LogState {
    /// Free seglets: resident ones first (a stack: recently freed seglets are reused first),
    /// then those whose pages were given back or never touched.
    free_seglets: FreeSeglets,
    /// Free seglets taken out of the list while their pages are given back (outside the log
    /// lock); they count as free.
    seglets_releasing: usize,
    segments: BTreeMap<SegmentId, SegmentRecord>,
    head: Option<SegmentId>,
    next_segment_id: u64,
    /// Segments dropped from the log by cleaning, not yet taken by replication.
    dropped: VecDeque<SegmentId>,
    /// Dropped segment ids pushed out of `dropped` before replication took them.
    dropped_forgotten: u64,
    /// Whether segments must be reported replicated before the cleaner may touch them.
    replication_required: bool,
}

impl LogState {
    /// Remembers a dropped segment for replication, forgetting (and counting) the oldest one
    /// when the list is full.
    fn remember_dropped(&mut self, segment_id: SegmentId) {
        if self.dropped.len() == DROPPED_SEGMENTS_REMEMBERED_MAX {
            self.dropped.pop_front();
            self.dropped_forgotten += 1;
        }
        self.dropped.push_back(segment_id);
    }

    /// Segments the newest digest lists.
    fn in_log_count(&self) -> usize {
        self.segments
            .values()
            .filter(|segment| {
                matches!(segment.membership, Membership::InLog | Membership::DropPending)
            })
            .count()
    }
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
    /// The latest time (seconds) a caller reported; stamps new segments.
    latest_seconds: AtomicU32,
    /// Live data per table, kept by the store; every new head records it.
    table_tallies: TableTallies,
    state: Mutex<LogState>,
    /// Run once by the next segment copy between its snapshot and its copy: the only way a
    /// test can act inside that window (and show that the log lock is free there).
    #[cfg(test)]
    copy_hook: Mutex<Option<CopyHook>>,
}

/// What a test runs inside a segment copy.
#[cfg(test)]
struct CopyHook(Box<dyn FnOnce(&Log) + Send>);

#[cfg(test)]
impl std::fmt::Debug for CopyHook {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("CopyHook")
    }
}

impl Log {
    /// Creates an empty log (no head yet; the first append opens one). Panics on an invalid
    /// configuration: callers validate first.
    pub fn new(config: LogConfig, log_id: ServerId) -> Log {
        if let Err(reason) = config.validate() {
            panic!("invalid log configuration: {reason}");
        }
        let memory = config.allocate_memory();
        Log::with_memory(config, log_id, memory)
    }

    /// [`Log::new`] in `memory`, allocated before (by [`LogConfig::allocate_memory`] of the same
    /// configuration): a server prefaults its memory before it enlists, and learns the id its
    /// log carries only then. Panics on an invalid configuration or memory of another shape.
    pub fn with_memory(config: LogConfig, log_id: ServerId, memory: SegletMemory) -> Log {
        if let Err(reason) = config.validate() {
            panic!("invalid log configuration: {reason}");
        }
        let seglet_count = config.seglet_count();
        assert!(
            memory.seglet_count() == seglet_count && memory.seglet_bytes() == config.seglet_bytes,
            "log memory of {} seglets of {} bytes for a log of {seglet_count} of {}",
            memory.seglet_count(),
            memory.seglet_bytes(),
            config.seglet_bytes
        );
        Log {
            memory,
            config,
            log_id,
            seglet_owner: (0..seglet_count).map(|_| AtomicU64::new(NO_SEGMENT)).collect(),
            seglet_next: (0..seglet_count).map(|_| AtomicU32::new(NO_SEGLET)).collect(),
            safe_version: AtomicU64::new(1),
            latest_seconds: AtomicU32::new(0),
            table_tallies: TableTallies::default(),
            state: Mutex::new(LogState {
                // Reversed so that seglets are handed out in ascending order (easier to debug).
                // Seglet 0 is never used: reference 0 means "no entry" in the hash table, and
                // once seglets are reused any entry could otherwise land at offset 0.
                free_seglets: FreeSeglets::new(1..seglet_count, config.prefault_memory),
                seglets_releasing: 0,
                segments: BTreeMap::new(),
                head: None,
                next_segment_id: 1,
                dropped: VecDeque::new(),
                dropped_forgotten: 0,
                replication_required: false,
            }),
            #[cfg(test)]
            copy_hook: Mutex::new(None),
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

    /// Live data per table: the store reports every object's birth and death here, and every
    /// new head records it in a TABLE_STATS entry.
    pub fn table_tallies(&self) -> &TableTallies {
        &self.table_tallies
    }

    fn lock(&self) -> MutexGuard<'_, LogState> {
        // A panic while holding the log lock means a broken invariant; the state may be
        // inconsistent, so refuse to continue rather than corrupt the log.
        self.state.lock().expect("log lock poisoned by a panic in the storage path")
    }

    // -----------------------------------------------------------------------------------------
    // Epochs and time
    // -----------------------------------------------------------------------------------------

    /// Registers a reader (one per operation): entries it reads stay valid until it is dropped.
    pub fn pin(&self) -> EpochGuard<'_> {
        self.memory.pin()
    }

    /// Reports the current time (seconds); new segments are stamped with the latest reported.
    pub fn observe_time(&self, now_seconds: u32) {
        self.latest_seconds.fetch_max(now_seconds, Ordering::Relaxed);
    }

    /// The latest time reported.
    pub fn latest_seconds(&self) -> u32 {
        self.latest_seconds.load(Ordering::Relaxed)
    }

    /// Returns retired seglets that no reader can see any more to the free list; returns how
    /// many. The cleaner calls it; appends call it when memory is short.
    pub fn reclaim(&self) -> usize {
        let mut state = self.lock();
        self.reclaim_locked(&mut state)
    }

    fn reclaim_locked(&self, state: &mut LogState) -> usize {
        let seglets = self.memory.reclaim();
        for &seglet in &seglets {
            self.seglet_owner[seglet as usize].store(NO_SEGMENT, Ordering::Release);
            self.seglet_next[seglet as usize].store(NO_SEGLET, Ordering::Release);
        }
        state.free_seglets.push_resident(seglets.iter().copied());
        seglets.len()
    }

    /// Gives the pages of free resident seglets back to the operating system until at most
    /// `keep_resident` free seglets stay resident, at most `batch_max` per call; returns the
    /// seglets released. The pages are given back outside the log lock (a system call per
    /// seglet), with the seglets taken out of the free list meanwhile and counted free. Appends
    /// take resident seglets first, so the ones given back are those least likely needed soon.
    /// The free list never drops below what every reserve and a new head need while the pages
    /// go back, so no append is refused because of a release.
    pub fn release_free_seglets(&self, keep_resident: usize, batch_max: usize) -> usize {
        let floor = (self.config.reserve_seglets()
            + self.config.cleaner_reserve_seglets()
            + self.config.head_seglets_max()) as usize;
        let seglets = {
            let mut state = self.lock();
            let surplus = state.free_seglets.resident().saturating_sub(keep_resident);
            let above_floor = state.free_seglets.len().saturating_sub(floor);
            let seglets = state.free_seglets.take_resident(surplus.min(batch_max).min(above_floor));
            state.seglets_releasing += seglets.len();
            seglets
        };
        if seglets.is_empty() {
            return 0;
        }
        self.memory.release(&seglets);
        let mut state = self.lock();
        state.seglets_releasing -= seglets.len();
        state.free_seglets.push_released(&seglets);
        seglets.len()
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
        let append_bytes: usize = entries.iter().map(AppendEntry::entry_bytes).sum();
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
            let head_entries = self.new_head_entry_bytes(&state, 0);
            let needed = self.seglets_for(head_entries + append_bytes);
            self.check_free_seglets(&mut state, needed, priority)?;
            self.check_segment_count(&state, priority, 0)?;
            self.open_head(&mut state);
        } else {
            let head = &state.segments[&state.head.expect("head exists")];
            let needed = self
                .seglets_for(head.length as usize + append_bytes)
                .saturating_sub(head.seglets.len());
            self.check_free_seglets(&mut state, needed, priority)?;
        }
        let head_id = state.head.expect("a head was opened above");
        let references =
            entries.iter().map(|entry| self.append_entry(&mut state, head_id, entry)).collect();
        for entry in entries {
            // The first piece holds at least the tombstone's prefix: the whole content, or the
            // prefix with the key as the second piece. A malformed one is not counted.
            let named = segment_named_by(entry.entry_type, entry.pieces[0]);
            if let Some(segment) = named.and_then(|id| state.segments.get_mut(&id)) {
                segment.tombstone_bytes_naming += entry.entry_bytes() as u64;
            }
        }
        Ok(Appended { segment_id: head_id, references })
    }

    /// Closes the current head and opens a new one (a clean position for tablet creation, and
    /// the cleaner's way to commit a pass: the new head's digest fuses survivors in and drops
    /// cleaned segments).
    pub fn roll_head(&self, priority: AppendPriority) -> Result<SegmentId, AppendError> {
        let mut state = self.lock();
        let needed = self.seglets_for(self.new_head_entry_bytes(&state, 0));
        self.check_free_seglets(&mut state, needed, priority)?;
        self.check_segment_count(&state, priority, 0)?;
        Ok(self.open_head(&mut state))
    }

    fn seglets_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.config.seglet_bytes as usize)
    }

    /// Free seglets an append of `priority` must leave untouched.
    fn reserve_for(&self, priority: AppendPriority) -> usize {
        match priority {
            AppendPriority::Normal => {
                (self.config.reserve_seglets() + self.config.cleaner_reserve_seglets()) as usize
            }
            AppendPriority::MayUseReserve => self.config.cleaner_reserve_seglets() as usize,
            AppendPriority::Cleaner => self.config.head_seglets_max() as usize,
            AppendPriority::CleanerCommit => 0,
        }
    }

    fn check_free_seglets(
        &self,
        state: &mut LogState,
        needed: usize,
        priority: AppendPriority,
    ) -> Result<(), AppendError> {
        let wanted = needed + self.reserve_for(priority);
        if state.free_seglets.len() < wanted {
            self.reclaim_locked(state);
        }
        if state.free_seglets.len() < wanted {
            return Err(AppendError::LogFull);
        }
        Ok(())
    }

    /// Refuses a new head (except the cleaner's) when the digest would list more segments than
    /// it was sized for; `fused` side segments join the log with it.
    fn check_segment_count(
        &self,
        state: &LogState,
        priority: AppendPriority,
        fused: usize,
    ) -> Result<(), AppendError> {
        let after = self.digest_members(state).len() + fused + 1;
        // The cleaner's commit head may use the last slot; writes keep one back for it.
        let limit = match priority {
            AppendPriority::Cleaner | AppendPriority::CleanerCommit => {
                self.config.segment_count_max()
            }
            _ => self.config.segment_count_max() - 1,
        };
        if after > limit {
            return Err(AppendError::LogFull);
        }
        Ok(())
    }

    /// Segments the next digest lists (the new head aside).
    fn digest_members(&self, state: &LogState) -> Vec<SegmentId> {
        state
            .segments
            .iter()
            .filter(|(_, segment)| {
                matches!(segment.membership, Membership::InLog | Membership::FusePending)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Bytes of the header, digest, safe version and table stats a new head would start with
    /// at most, when `fused` side segments join the log with it. The table stats are counted at
    /// their largest (at most 1/64 of a segment), so that a write refused for memory does not
    /// snapshot the tallies only to throw them away; the snapshot is taken once the head opens.
    fn new_head_entry_bytes(&self, state: &LogState, fused: usize) -> usize {
        let table_stats = table_stats_content_bytes(self.config.table_stats_tables_max());
        let digest = log_digest_content_bytes(self.digest_members(state).len() + fused + 1);
        EntryHeader::new(EntryType::SegmentHeader, SEGMENT_HEADER_CONTENT_BYTES as u32)
            .header_bytes()
            + SEGMENT_HEADER_CONTENT_BYTES
            + EntryHeader::new(EntryType::LogDigest, digest as u32).header_bytes()
            + digest
            + EntryHeader::new(EntryType::SafeVersion, SAFE_VERSION_CONTENT_BYTES as u32)
                .header_bytes()
            + SAFE_VERSION_CONTENT_BYTES
            + EntryHeader::new(EntryType::TableStats, table_stats as u32).header_bytes()
            + table_stats
    }

    fn new_record(&self, membership: Membership) -> SegmentRecord {
        let now = self.latest_seconds();
        SegmentRecord {
            seglets: Vec::new(),
            length: 0,
            certificate: CertificateBuilder::default(),
            statistics: SegmentStatistics::default(),
            creation_seconds: now,
            membership,
            opened_as_head: false,
            cleaning: false,
            tombstone_bytes_naming: 0,
            tombstone_scan_seconds: now,
            compaction: None,
            replicated: false,
        }
    }

    /// Opens a new head holding SEGMENT_HEADER, LOG_DIGEST (every segment in the log, the new
    /// head included, with pending survivors fused in and cleaned segments dropped),
    /// SAFE_VERSION and TABLE_STATS (the store's tallies now, no larger than the caller's check
    /// allowed for). The caller checked that enough seglets are free.
    fn open_head(&self, state: &mut LogState) -> SegmentId {
        let segment_id = SegmentId(state.next_segment_id);
        state.next_segment_id += 1;
        let mut members = self.digest_members(state);
        members.push(segment_id);
        assert!(
            members.len() <= self.config.segment_count_max(),
            "more segments than the digest was sized for"
        );
        let mut record = self.new_record(Membership::InLog);
        record.opened_as_head = true;
        state.segments.insert(segment_id, record);
        state.head = Some(segment_id);
        let header = SegmentHeader {
            log_id: self.log_id,
            segment_id,
            capacity_bytes: self.config.segment_bytes,
        }
        .encode();
        let digest = encode_log_digest(&members);
        let table_stats =
            encode_table_stats(&self.table_tallies.snapshot(self.config.table_stats_tables_max()));
        assert!(
            table_stats.len() <= table_stats_content_bytes(self.config.table_stats_tables_max()),
            "table stats larger than a new head was sized for"
        );
        let safe_version = encode_safe_version(self.safe_version());
        for entry in [
            AppendEntry::new(EntryType::SegmentHeader, &header),
            AppendEntry::new(EntryType::LogDigest, &digest),
            AppendEntry::new(EntryType::SafeVersion, &safe_version),
            AppendEntry::new(EntryType::TableStats, &table_stats),
        ] {
            self.append_entry(state, segment_id, &entry);
        }
        // The digest is written: survivors are in the log, cleaned segments are out.
        let mut retired = Vec::new();
        let mut dropped_ids = Vec::new();
        for (id, segment) in state.segments.iter_mut() {
            match segment.membership {
                Membership::FusePending => segment.membership = Membership::InLog,
                Membership::DropPending => {
                    retired.extend_from_slice(&segment.seglets);
                    dropped_ids.push(*id);
                }
                Membership::InLog | Membership::Side => {}
            }
        }
        for id in &dropped_ids {
            state.segments.remove(id);
            state.remember_dropped(*id);
        }
        if !retired.is_empty() {
            self.memory.retire(&retired);
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
        let LogState { free_seglets, segments, .. } = state;
        let segment = segments.get_mut(&segment_id).expect("appending to a missing segment");
        self.append_entry_to(free_seglets, segment, segment_id, entry)
    }

    /// Writes one entry at the end of `segment`, taking seglets from `free_seglets`.
    fn append_entry_to(
        &self,
        free_seglets: &mut impl SegletSource,
        segment: &mut SegmentRecord,
        segment_id: SegmentId,
        entry: &AppendEntry<'_>,
    ) -> Reference {
        let content_bytes = entry.content_bytes();
        let header = EntryHeader::new(entry.entry_type, content_length(content_bytes));
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
        segment.statistics.largest_entry_bytes =
            segment.statistics.largest_entry_bytes.max(entry_bytes as u64);
        if entry.entry_type == EntryType::FlashObject {
            let content: Vec<u8> = entry.pieces.concat();
            let (_, locator) = decode_flash_object(&content).expect("malformed flash object");
            let statistics = &mut segment.statistics;
            statistics.flash_backed_bytes += u64::from(locator.entry_bytes);
            statistics.largest_entry_bytes =
                statistics.largest_entry_bytes.max(u64::from(locator.entry_bytes));
        }
        if entry.entry_type == EntryType::Object {
            if let Some(expires_at) = object_expiry(entry.pieces[0]) {
                let statistics = &mut segment.statistics;
                statistics.expiring_object_bytes += entry_bytes as u64;
                statistics.expiry_latest_millis = statistics.expiry_latest_millis.max(expires_at.0);
            }
        }
        let seglet_bytes = self.config.seglet_bytes as usize;
        let seglet = segment.seglets[start / seglet_bytes];
        Reference(u64::from(seglet) * seglet_bytes as u64 + (start % seglet_bytes) as u64)
    }

    /// Copies `bytes` to the end of `segment`, allocating seglets (from the free list, whose
    /// size the caller checked) as the segment grows.
    fn write_bytes(
        &self,
        free_seglets: &mut impl SegletSource,
        segment: &mut SegmentRecord,
        segment_id: SegmentId,
        mut bytes: &[u8],
    ) {
        let seglet_bytes = self.config.seglet_bytes as usize;
        while !bytes.is_empty() {
            let position = segment.length as usize;
            let seglet_position = position / seglet_bytes;
            if seglet_position == segment.seglets.len() {
                let seglet =
                    free_seglets.take_seglet().expect("free seglets were counted before append");
                // Publish the seglet's owner and link before any entry bytes in it are
                // published (the seglet memory's SeqCst store orders these before them).
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
    // The cleaner's side log
    // -----------------------------------------------------------------------------------------

    /// Segments the cleaner may choose: in the log, not the head, not chosen by another
    /// cleaner. Objects known to be expired at `now_millis` do not count as movable: cleaning
    /// drops them.
    pub fn cleaning_candidates(&self, now_millis: u64) -> Vec<CleaningCandidate> {
        let state = self.lock();
        state
            .segments
            .iter()
            .filter(|(id, segment)| {
                segment.membership == Membership::InLog
                    && !segment.cleaning
                    && Some(**id) != state.head
                    && (segment.replicated || !state.replication_required)
            })
            .map(|(id, segment)| CleaningCandidate {
                segment_id: *id,
                creation_seconds: segment.creation_seconds,
                seglets: segment.seglets.len() as u32,
                movable_bytes: segment.statistics.movable_bytes()
                    - segment.statistics.expired_bytes(now_millis),
                survivor_bytes: segment.statistics.survivor_bytes()
                    - segment.statistics.expired_bytes(now_millis),
                tombstone_bytes: segment.statistics.live_bytes_of(EntryType::Tombstone),
                tombstone_scan_seconds: segment.tombstone_scan_seconds,
                largest_entry_bytes: segment.statistics.largest_entry_bytes,
                tombstone_bytes_naming: segment.tombstone_bytes_naming,
            })
            .collect()
    }

    /// Marks segments as chosen by a cleaner. Returns false (marking nothing) if one of them
    /// is no longer a candidate.
    pub fn begin_cleaning(&self, segment_ids: &[SegmentId]) -> bool {
        let mut state = self.lock();
        let head = state.head;
        let replication_required = state.replication_required;
        let available = segment_ids.iter().all(|id| {
            Some(*id) != head
                && state.segments.get(id).is_some_and(|segment| {
                    segment.membership == Membership::InLog
                        && !segment.cleaning
                        && (segment.replicated || !replication_required)
                })
        });
        if available {
            for id in segment_ids {
                state.segments.get_mut(id).expect("checked above").cleaning = true;
            }
        }
        available
    }

    /// Releases segments chosen by [`Log::begin_cleaning`] without cleaning them.
    pub fn end_cleaning(&self, segment_ids: &[SegmentId]) {
        let mut state = self.lock();
        for id in segment_ids {
            if let Some(segment) = state.segments.get_mut(id) {
                segment.cleaning = false;
            }
        }
    }

    /// Whether a tombstone naming `segment_id` is still needed: the segment is in the log or a
    /// survivor, and is not about to be dropped. `cleaning` lists segments being cleaned in the
    /// same pass (they leave the log together with the tombstone's own segment).
    pub fn tombstone_target_alive(&self, segment_id: SegmentId, cleaning: &[SegmentId]) -> bool {
        if cleaning.contains(&segment_id) {
            return false;
        }
        self.lock()
            .segments
            .get(&segment_id)
            .is_some_and(|segment| segment.membership != Membership::DropPending)
    }

    /// Opens a segment beside the log (a side log: the cleaner's survivors, a recovery's
    /// replayed objects): it holds a SEGMENT_HEADER and is not in the log until it is fused by
    /// a head's digest ([`Log::commit_cleaning`], [`Log::fuse_side_segments`]) or dropped
    /// ([`Log::abandon_side_segments`]).
    pub fn open_side_segment(&self, priority: AppendPriority) -> Result<SegmentId, AppendError> {
        let mut state = self.lock();
        let header_bytes =
            EntryHeader::new(EntryType::SegmentHeader, SEGMENT_HEADER_CONTENT_BYTES as u32)
                .header_bytes()
                + SEGMENT_HEADER_CONTENT_BYTES;
        self.check_free_seglets(&mut state, self.seglets_for(header_bytes), priority)?;
        let segment_id = SegmentId(state.next_segment_id);
        state.next_segment_id += 1;
        state.segments.insert(segment_id, self.new_record(Membership::Side));
        let header = SegmentHeader {
            log_id: self.log_id,
            segment_id,
            capacity_bytes: self.config.segment_bytes,
        }
        .encode();
        self.append_entry(
            &mut state,
            segment_id,
            &AppendEntry::new(EntryType::SegmentHeader, &header),
        );
        Ok(segment_id)
    }

    /// Appends one entry to a side segment. `TooLarge` means it does not fit in what is left
    /// of the segment (open another); `LogFull` that no seglet is free for `priority`.
    pub fn append_to_side_segment(
        &self,
        segment_id: SegmentId,
        entry: &AppendEntry<'_>,
        priority: AppendPriority,
    ) -> Result<Reference, AppendError> {
        let mut state = self.lock();
        let segment = state.segments.get(&segment_id).expect("side segment missing");
        assert_eq!(segment.membership, Membership::Side, "appending to a closed side segment");
        let end = segment.length as usize + entry.entry_bytes();
        if end > self.config.segment_bytes as usize {
            return Err(AppendError::TooLarge);
        }
        let needed = self.seglets_for(end).saturating_sub(segment.seglets.len());
        self.check_free_seglets(&mut state, needed, priority)?;
        Ok(self.append_entry(&mut state, segment_id, entry))
    }

    /// Fuses side segments into the log now: a new head is opened whose digest lists them
    /// (and every segment in the log). Either all of them join the log or, when there is no
    /// room for the head or its digest (`LogFull`), none does and they stay beside it. The
    /// caller made them durable first. Returns the new head.
    pub fn fuse_side_segments(
        &self,
        segment_ids: &[SegmentId],
        priority: AppendPriority,
    ) -> Result<SegmentId, AppendError> {
        let mut state = self.lock();
        for id in segment_ids {
            let segment = state.segments.get(id).expect("fusing a missing side segment");
            assert_eq!(segment.membership, Membership::Side, "fusing a segment not beside the log");
        }
        let needed = self.seglets_for(self.new_head_entry_bytes(&state, segment_ids.len()));
        self.check_free_seglets(&mut state, needed, priority)?;
        self.check_segment_count(&state, priority, segment_ids.len())?;
        for id in segment_ids {
            state.segments.get_mut(id).expect("checked above").membership = Membership::FusePending;
        }
        Ok(self.open_head(&mut state))
    }

    /// Drops side segments that will never join the log (a recovery that failed): their
    /// memory is reused once no reader can see it, and replication hears of them through
    /// [`Log::take_dropped_segments`], so replicas already written are freed. The caller
    /// removed every index reference to their objects first.
    pub fn abandon_side_segments(&self, segment_ids: &[SegmentId]) {
        let mut state = self.lock();
        let mut retired = Vec::new();
        for id in segment_ids {
            let segment = state.segments.remove(id).expect("abandoning a missing side segment");
            assert_eq!(segment.membership, Membership::Side, "abandoning a segment in the log");
            // An object still live here is one the index may still point at: dropping its
            // memory would let a reader see another segment's bytes.
            assert_eq!(
                segment.statistics.live_bytes_of(EntryType::Object),
                0,
                "abandoning a side segment whose objects are still referenced"
            );
            retired.extend_from_slice(&segment.seglets);
            state.remember_dropped(*id);
        }
        if !retired.is_empty() {
            self.memory.retire(&retired);
        }
    }

    /// Bytes appended to a segment so far.
    pub fn segment_length(&self, segment_id: SegmentId) -> Option<u32> {
        self.lock().segments.get(&segment_id).map(|segment| segment.length)
    }

    /// Commits a cleaning pass: `survivors` will be fused into the log and `cleaned` dropped
    /// from it by the next head's digest (both at once). The caller made the survivors durable
    /// first. Does not roll the head: call [`Log::roll_head`] with
    /// [`AppendPriority::Cleaner`] to fuse now rather than at the next natural roll.
    pub fn commit_cleaning(&self, survivors: &[SegmentId], cleaned: &[SegmentId]) {
        let mut state = self.lock();
        for id in survivors {
            let segment = state.segments.get_mut(id).expect("survivor segment missing");
            assert_eq!(segment.membership, Membership::Side, "survivor committed twice");
            segment.membership = Membership::FusePending;
        }
        for id in cleaned {
            let segment = state.segments.get_mut(id).expect("cleaned segment missing");
            assert!(
                segment.membership == Membership::InLog && segment.cleaning,
                "committing a segment that was not being cleaned"
            );
            segment.membership = Membership::DropPending;
        }
    }

    /// Ids of the segments dropped from the log by cleaning since the last call (at most
    /// [`DROPPED_SEGMENTS_REMEMBERED_MAX`], oldest first): replication frees their replicas.
    pub fn take_dropped_segments(&self) -> Vec<SegmentId> {
        self.lock().dropped.drain(..).collect()
    }

    /// How many dropped segment ids were forgotten, since the log began, because more than
    /// [`DROPPED_SEGMENTS_REMEMBERED_MAX`] piled up between two calls of
    /// [`Log::take_dropped_segments`]. When it grows, every segment no longer in the log
    /// ([`Log::certificate`] is `None`) counts as dropped.
    pub fn dropped_segments_forgotten(&self) -> u64 {
        self.lock().dropped_forgotten
    }

    /// Dead-tombstone scanning (RAMCloud §4.2.2): tombstones die silently when the segment
    /// they name leaves the log, so a segment full of dead tombstones would look live forever
    /// and never be cleaned. Counts the dead tombstones of `segment_id` into its statistics
    /// (idempotent: tombstones only ever die) and returns the dead tombstone bytes found.
    /// The segment is held like a cleaning candidate during the scan; one a cleaner holds is
    /// skipped (returns 0).
    pub fn scan_dead_tombstones(&self, segment_id: SegmentId) -> u64 {
        if !self.begin_cleaning(&[segment_id]) {
            return 0;
        }
        let guard = self.pin();
        let entries = self.segment_entries(&guard, segment_id).expect("segment held for a scan");
        // Per tombstone-like type: (type, dead bytes, dead count).
        let mut dead = [(EntryType::Tombstone, 0u64, 0u64), (EntryType::PreparedTombstone, 0, 0)];
        for (reference, entry_type) in entries {
            let Some(counted) = dead.iter_mut().find(|(kind, _, _)| *kind == entry_type) else {
                continue;
            };
            let (_, content) = self.entry(&guard, reference);
            let named = match entry_type {
                EntryType::Tombstone => {
                    decode_tombstone(&content).expect("corrupt tombstone in the log").segment_id
                }
                _ => segment_named_by(entry_type, &content).expect("corrupt tombstone in the log"),
            };
            if !self.tombstone_target_alive(named, &[]) {
                counted.1 += (EntryHeader::new(entry_type, content_length(content.len()))
                    .header_bytes()
                    + content.len()) as u64;
                counted.2 += 1;
            }
        }
        let now = self.latest_seconds();
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("segment held for a scan");
        let statistics = &mut segment.statistics;
        let mut dead_bytes = 0;
        for (entry_type, bytes, count) in dead {
            let index = entry_type.code() as usize;
            assert!(bytes <= statistics.entry_bytes[index], "more tombstones dead than written");
            statistics.dead_bytes[index] = statistics.dead_bytes[index].max(bytes);
            statistics.dead_count[index] = statistics.dead_count[index].max(count);
            dead_bytes += bytes;
        }
        segment.tombstone_scan_seconds = now;
        segment.cleaning = false;
        dead_bytes
    }

    // -----------------------------------------------------------------------------------------
    // In-memory compaction
    // -----------------------------------------------------------------------------------------

    /// Starts compacting `segment_id` into a copy of at most `seglets` seglets, set aside from
    /// the free list now (so the copy can never run out of memory half-way). Returns false,
    /// changing nothing, if the segment is not a candidate or the seglets are not free.
    pub fn begin_compaction(&self, segment_id: SegmentId, seglets: u32) -> bool {
        let mut state = self.lock();
        let head = state.head;
        let available = Some(segment_id) != head
            && state.segments.get(&segment_id).is_some_and(|segment| {
                segment.membership == Membership::InLog && !segment.cleaning
            });
        if !available
            || self
                .check_free_seglets(&mut state, seglets as usize, AppendPriority::Cleaner)
                .is_err()
        {
            return false;
        }
        // Reversed: the copy pops them, resident ones first.
        let mut spare_seglets = state.free_seglets.take(seglets as usize);
        spare_seglets.reverse();
        let mut copy = self.new_record(Membership::InLog);
        let segment = state.segments.get_mut(&segment_id).expect("checked above");
        copy.creation_seconds = segment.creation_seconds;
        copy.opened_as_head = segment.opened_as_head;
        segment.cleaning = true;
        segment.compaction = Some(Box::new(Compaction { copy, spare_seglets }));
        true
    }

    /// Appends one entry to the compacted copy of `segment_id`. Panics if the seglets set
    /// aside do not suffice: the caller sized them from the segment's live bytes, an upper
    /// bound of what it copies.
    pub fn append_to_compacted(&self, segment_id: SegmentId, entry: &AppendEntry<'_>) -> Reference {
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("compacted segment missing");
        let compaction = segment.compaction.as_mut().expect("segment is not being compacted");
        let end = compaction.copy.length as usize + entry.entry_bytes();
        assert!(
            self.seglets_for(end) <= compaction.copy.seglets.len() + compaction.spare_seglets.len(),
            "compaction copy outgrew the seglets set aside for it"
        );
        let Compaction { copy, spare_seglets } = &mut **compaction;
        self.append_entry_to(spare_seglets, copy, segment_id, entry)
    }

    /// Gives up a compaction begun with [`Log::begin_compaction`] before anything was
    /// appended to its copy: the segment stays as it was, and the seglets set aside are free
    /// again. Panics if the copy holds an entry (the index may point at it).
    pub fn abandon_compaction(&self, segment_id: SegmentId) {
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("compacted segment missing");
        let compaction = segment.compaction.take().expect("segment is not being compacted");
        let Compaction { copy, mut spare_seglets } = *compaction;
        assert_eq!(copy.length, 0, "abandoning a compaction whose copy holds entries");
        segment.cleaning = false;
        spare_seglets.extend(copy.seglets);
        state.free_seglets.push_resident(spare_seglets);
    }

    /// Replaces the segment by its compacted copy (same id, same creation time), retires the
    /// old seglets and returns the unused spare ones. Returns the seglets freed.
    pub fn finish_compaction(&self, segment_id: SegmentId) -> u32 {
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("compacted segment missing");
        let compaction = segment.compaction.take().expect("segment is not being compacted");
        let Compaction { copy, spare_seglets } = *compaction;
        let old_seglets = std::mem::replace(&mut segment.seglets, copy.seglets);
        segment.length = copy.length;
        segment.certificate = copy.certificate;
        segment.statistics = copy.statistics;
        segment.cleaning = false;
        let freed = old_seglets.len().saturating_sub(segment.seglets.len()) as u32;
        // Counted resident, though some may never have been touched: an upper bound, and
        // giving back an untouched seglet's pages costs a system call and nothing else.
        state.free_seglets.push_resident(spare_seglets);
        self.memory.retire(&old_seglets);
        freed
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
    fn gather(
        &self,
        guard: &EpochGuard<'_>,
        reference: Reference,
        length: usize,
        out: &mut Vec<u8>,
    ) {
        let (mut seglet, mut offset) = self.split_reference(reference);
        let mut remaining = length;
        loop {
            let chunk = remaining.min((self.config.seglet_bytes - offset) as usize);
            out.extend_from_slice(self.memory.read(guard, seglet, offset, chunk));
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
    /// (the common case), gathered into a copy when it spans seglets. The borrow lives no
    /// longer than `guard`. Panics if the reference does not point at a valid entry header:
    /// references come from the hash table and a bad one is a broken invariant.
    pub fn entry<'g>(
        &'g self,
        guard: &'g EpochGuard<'_>,
        reference: Reference,
    ) -> (EntryType, Cow<'g, [u8]>) {
        let (seglet, offset) = self.split_reference(reference);
        let first = self.memory.read(guard, seglet, offset, 1)[0];
        let header_bytes = entry_header_bytes_from_first_byte(first);
        let fits = |bytes: usize| offset as usize + bytes <= self.config.seglet_bytes as usize;
        let header = if fits(header_bytes) {
            decode_entry_header(self.memory.read(guard, seglet, offset, header_bytes))
        } else {
            let mut bytes = Vec::with_capacity(header_bytes);
            self.gather(guard, reference, header_bytes, &mut bytes);
            decode_entry_header(&bytes)
        }
        .expect("reference does not point at a valid entry header");
        let entry_bytes = header.header_bytes + header.content_bytes as usize;
        if fits(entry_bytes) {
            let content = self.memory.read(
                guard,
                seglet,
                offset + header_bytes as u32,
                header.content_bytes as usize,
            );
            (header.entry_type, Cow::Borrowed(content))
        } else {
            let mut bytes = Vec::with_capacity(entry_bytes);
            self.gather(guard, reference, entry_bytes, &mut bytes);
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

    /// Records the entry at `reference` as dead in its segment's statistics (its memory is
    /// reclaimed when the cleaner moves the segment's live entries away). Returns the entry's
    /// bytes, header included; for a FLASH_OBJECT, the bytes of the OBJECT entry it stands for
    /// (the object's size as every tally counts it).
    pub fn free(&self, guard: &EpochGuard<'_>, reference: Reference) -> u64 {
        let segment_id = self.segment_of(reference);
        let (entry_type, content) = self.entry(guard, reference);
        let content_bytes = content.len();
        let entry_bytes = EntryHeader::new(entry_type, content_length(content_bytes))
            .header_bytes()
            + content_bytes;
        let (seglet, _) = self.split_reference(reference);
        let mut state = self.lock();
        let segment = state.segments.get_mut(&segment_id).expect("freeing into a missing segment");
        // An entry already moved into a compacted copy counts against the copy.
        let statistics = match &mut segment.compaction {
            Some(compaction) if compaction.copy.seglets.contains(&seglet) => {
                &mut compaction.copy.statistics
            }
            _ => &mut segment.statistics,
        };
        let type_index = entry_type.code() as usize;
        statistics.dead_bytes[type_index] += entry_bytes as u64;
        statistics.dead_count[type_index] += 1;
        assert!(
            statistics.dead_bytes[type_index] <= statistics.entry_bytes[type_index],
            "more bytes freed than appended"
        );
        if entry_type == EntryType::FlashObject {
            let (_, locator) = decode_flash_object(&content).expect("malformed flash object");
            statistics.flash_backed_dead_bytes += u64::from(locator.entry_bytes);
            assert!(
                statistics.flash_backed_dead_bytes <= statistics.flash_backed_bytes,
                "more flash-backed bytes freed than appended"
            );
            // The object's size, as its birth was counted (per-table tallies).
            return u64::from(locator.entry_bytes);
        }
        if entry_type == EntryType::Object && object_expiry(&content).is_some() {
            statistics.expiring_dead_bytes += entry_bytes as u64;
            assert!(
                statistics.expiring_dead_bytes <= statistics.expiring_object_bytes,
                "more expiring bytes freed than appended"
            );
        }
        entry_bytes as u64
    }

    /// The seglets a segment holds now, in order (`None` when it is not in the log's memory):
    /// an owner of per-seglet data (the store's access times) reads a segment's share of it.
    pub fn segment_seglets(&self, segment_id: SegmentId) -> Option<Vec<u32>> {
        self.lock().segments.get(&segment_id).map(|segment| segment.seglets.clone())
    }

    /// The seglet `reference` points into (see [`Log::segment_seglets`]).
    pub fn seglet_of(&self, reference: Reference) -> u32 {
        self.split_reference(reference).0
    }

    /// The references and types of every entry of a segment, in order (for the cleaner).
    pub fn segment_entries(
        &self,
        guard: &EpochGuard<'_>,
        segment_id: SegmentId,
    ) -> Option<Vec<(Reference, EntryType)>> {
        let (seglets, length) = {
            let state = self.lock();
            let segment = state.segments.get(&segment_id)?;
            (segment.seglets.clone(), segment.length)
        };
        let seglet_bytes = self.config.seglet_bytes as usize;
        let reference_at = |position: usize| {
            Reference(
                u64::from(seglets[position / seglet_bytes]) * seglet_bytes as u64
                    + (position % seglet_bytes) as u64,
            )
        };
        let mut entries = Vec::new();
        let mut position = 0usize;
        let mut header = Vec::with_capacity(ENTRY_HEADER_BYTES_MAX);
        while position < length as usize {
            let reference = reference_at(position);
            let (seglet, offset) = self.split_reference(reference);
            let first = self.memory.read(guard, seglet, offset, 1)[0];
            let header_bytes = entry_header_bytes_from_first_byte(first);
            // The header is almost always inside one seglet: decode it in place.
            let decoded = if offset as usize + header_bytes <= seglet_bytes {
                decode_entry_header(self.memory.read(guard, seglet, offset, header_bytes))
            } else {
                header.clear();
                self.gather(guard, reference, header_bytes, &mut header);
                decode_entry_header(&header)
            }
            .expect("corrupt entry header in the log");
            entries.push((reference, decoded.entry_type));
            position += decoded.header_bytes + decoded.content_bytes as usize;
        }
        assert_eq!(position, length as usize, "segment entries overrun its length");
        Some(entries)
    }

    // -----------------------------------------------------------------------------------------
    // Segments
    // -----------------------------------------------------------------------------------------

    /// Ids of every segment in the log (listed by the newest digest), ascending.
    pub fn segment_ids(&self) -> Vec<SegmentId> {
        let state = self.lock();
        state
            .segments
            .iter()
            .filter(|(_, segment)| {
                matches!(segment.membership, Membership::InLog | Membership::DropPending)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The current head, if any append happened yet.
    pub fn head_segment_id(&self) -> Option<SegmentId> {
        self.lock().head
    }

    /// True if `segment_id` is in memory and was opened as a log head (it holds a digest).
    pub fn opened_as_head(&self, segment_id: SegmentId) -> bool {
        self.lock().segments.get(&segment_id).is_some_and(|segment| segment.opened_as_head)
    }

    /// A segment's current certificate.
    pub fn certificate(&self, segment_id: SegmentId) -> Option<Certificate> {
        let state = self.lock();
        let segment = state.segments.get(&segment_id)?;
        Some(segment.certificate.certificate(segment.length))
    }

    /// A copy of a segment's bytes with the certificate that commits exactly them (what a
    /// backup receives, and what tests feed to the segment iterator). Survivors not yet fused
    /// are included (replication makes them durable before they join the log). `None` for a
    /// segment whose memory holds FLASH_OBJECT entries (its replicas come from its image).
    pub fn segment_contents(&self, segment_id: SegmentId) -> Option<(Vec<u8>, Certificate)> {
        self.segment_tail(segment_id, 0)
    }

    /// From now on the cleaner only touches segments reported with
    /// [`Log::mark_replicated`]. Called once by a master that replicates its log, before its
    /// first write.
    pub fn require_replication(&self) {
        self.lock().replication_required = true;
    }

    /// Replication holds every byte of `segment_id` on all its replicas, closed: the cleaner
    /// may now clean or compact it. Ignored for a segment that is gone.
    pub fn mark_replicated(&self, segment_id: SegmentId) {
        if let Some(segment) = self.lock().segments.get_mut(&segment_id) {
            segment.replicated = true;
        }
    }

    /// The bytes of a segment from `from` to its current end, and the certificate that commits
    /// the whole segment up to that end: what replication sends to a backup that holds the
    /// first `from` bytes. Copies only the tail. `None` if the segment is not there or is
    /// shorter than `from`.
    ///
    /// The bytes are copied outside the log lock, which every append takes: a copy of up to a
    /// whole segment under it would stall every writer for as long. The lock is held only to
    /// snapshot the segment's seglets, length and certificate. The copy then reads under an
    /// epoch guard pinned before the snapshot, so none of those seglets is reused while it
    /// reads (seglet_memory invariant 5), and bytes below the snapshot's length never change
    /// while a seglet is in use (invariant 1): the bytes are exactly what the certificate
    /// commits, even if appends, compaction or cleaning change the segment meanwhile.
    pub fn segment_tail(&self, segment_id: SegmentId, from: u32) -> Option<(Vec<u8>, Certificate)> {
        let guard = self.pin();
        let (seglets, length, certificate) = {
            let state = self.lock();
            let segment = state.segments.get(&segment_id)?;
            // A segment whose memory holds FLASH_OBJECT entries is no replica: its copies come
            // from its image on flash (the store's `replication_image`), never from here.
            let flash_objects =
                segment.statistics.entry_count[EntryType::FlashObject.code() as usize];
            if from > segment.length || flash_objects > 0 {
                return None;
            }
            let certificate = segment.certificate.certificate(segment.length);
            (segment.seglets.clone(), segment.length, certificate)
        };
        #[cfg(test)]
        if let Some(CopyHook(hook)) = self.copy_hook.lock().expect("hook lock").take() {
            hook(self);
        }
        let mut bytes = Vec::with_capacity((length - from) as usize);
        self.copy_from_seglets(&guard, &seglets, from, length, &mut bytes);
        Some((bytes, certificate))
    }

    /// Appends bytes `[from, to)` of a segment made of `seglets` (in order) to `out`.
    fn copy_from_seglets(
        &self,
        guard: &EpochGuard<'_>,
        seglets: &[u32],
        from: u32,
        to: u32,
        out: &mut Vec<u8>,
    ) {
        let seglet_bytes = self.config.seglet_bytes;
        let mut position = from;
        while position < to {
            let offset = position % seglet_bytes;
            let chunk = (seglet_bytes - offset).min(to - position);
            let seglet = seglets[(position / seglet_bytes) as usize];
            out.extend_from_slice(self.memory.read(guard, seglet, offset, chunk as usize));
            position += chunk;
        }
    }

    /// The bytes `[from, to)` of a segment and the certificate that commits exactly its first
    /// `to` bytes (for replication of a range). `None` if the segment is not there, the range
    /// is out of bounds, or `to` is not an entry boundary.
    pub fn segment_range(
        &self,
        segment_id: SegmentId,
        from: u32,
        to: u32,
    ) -> Option<(Vec<u8>, Certificate)> {
        let (bytes, _) = self.segment_contents(segment_id)?;
        if from > to || to as usize > bytes.len() {
            return None;
        }
        let mut builder = CertificateBuilder::default();
        let mut position = 0usize;
        while position < to as usize {
            let header = decode_entry_header(&bytes[position..]).ok()?;
            builder.add_header(&bytes[position..position + header.header_bytes]);
            position += header.header_bytes + header.content_bytes as usize;
        }
        if position != to as usize {
            return None;
        }
        Some((bytes[from as usize..to as usize].to_vec(), builder.certificate(to)))
    }

    /// A segment's statistics.
    pub fn segment_statistics(&self, segment_id: SegmentId) -> Option<SegmentStatistics> {
        self.lock().segments.get(&segment_id).map(|segment| segment.statistics)
    }

    /// Every segment's statistics (log and survivors), by id.
    pub fn all_segment_statistics(&self) -> Vec<(SegmentId, SegmentStatistics)> {
        self.lock().segments.iter().map(|(id, segment)| (*id, segment.statistics)).collect()
    }

    /// Totals over the log.
    pub fn statistics(&self) -> LogStatistics {
        let state = self.lock();
        let seglets_total = u64::from(self.memory.seglet_count());
        let seglets_free = (state.free_seglets.len() + state.seglets_releasing) as u64;
        let seglets_waiting = self.memory.retired_count() as u64;
        let sum = |measure: &dyn Fn(&SegmentStatistics) -> u64| -> u64 {
            state.segments.values().map(|segment| measure(&segment.statistics)).sum()
        };
        LogStatistics {
            log_bytes_total: seglets_total * u64::from(self.config.seglet_bytes),
            log_bytes_live: sum(&|statistics| statistics.live_bytes()),
            log_bytes_live_objects: sum(&|statistics| statistics.live_bytes_of(EntryType::Object)),
            log_bytes_tombstones: sum(&|statistics| statistics.live_bytes_of(EntryType::Tombstone)),
            // Seglet 0 is never allocated (see `Log::new`).
            log_bytes_allocated: (seglets_total - 1 - seglets_free - seglets_waiting)
                * u64::from(self.config.seglet_bytes),
            seglets_total,
            seglets_free,
            seglets_waiting_for_readers: seglets_waiting,
            seglets_free_resident: state.free_seglets.resident() as u64,
            log_bytes_resident: (seglets_total - 1 - seglets_free
                + state.free_seglets.resident() as u64)
                * u64::from(self.config.seglet_bytes),
            segments_in_log: state.in_log_count() as u64,
            segments_in_next_digest: self.digest_members(&state).len() as u64,
            segments_side: state
                .segments
                .values()
                .filter(|segment| {
                    matches!(segment.membership, Membership::Side | Membership::FusePending)
                })
                .count() as u64,
            safe_version: self.safe_version().0,
        }
    }
}

/// An entry content length as the u32 the header stores; contents are bounded by the segment
/// size (<= 1 GiB), so a larger one is a broken invariant.
fn content_length(content_bytes: usize) -> u32 {
    u32::try_from(content_bytes).expect("entry content larger than 4 GiB")
}

/// A side log being written: segments beside the log, filled one after another, that later
/// join the log together ([`Log::fuse_side_segments`], [`Log::commit_cleaning`]) or are
/// dropped together ([`Log::abandon_side_segments`]).
#[derive(Debug)]
pub struct SideLog {
    priority: AppendPriority,
    segments: Vec<SegmentId>,
}

impl SideLog {
    /// An empty side log whose appends use the free seglets `priority` may use.
    pub fn new(priority: AppendPriority) -> SideLog {
        SideLog { priority, segments: Vec::new() }
    }

    /// Its segments, in the order they were opened.
    pub fn segments(&self) -> &[SegmentId] {
        &self.segments
    }

    /// Appends one entry to the last segment, or to a new one when it has no room. Returns the
    /// entry's reference and the segment closed to make room, if any: nothing is appended to
    /// that one again, so it may be replicated now.
    pub fn append(
        &mut self,
        log: &Log,
        entry: &AppendEntry<'_>,
    ) -> Result<(Reference, Option<SegmentId>), AppendError> {
        let closed = self.segments.last().copied();
        if let Some(current) = closed {
            match log.append_to_side_segment(current, entry, self.priority) {
                Err(AppendError::TooLarge) => {}
                other => return other.map(|reference| (reference, None)),
            }
        }
        let segment_id = log.open_side_segment(self.priority)?;
        self.segments.push(segment_id);
        let reference = log.append_to_side_segment(segment_id, entry, self.priority)?;
        Ok((reference, closed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{encode_object, encode_tombstone, Entry, TombstoneView};
    use crate::iterator::SegmentIterator;
    use stratus_types::TableId;

    fn small_config() -> LogConfig {
        LogConfig {
            log_bytes: 96 << 10,
            segment_bytes: 8 << 10,
            seglet_bytes: 1 << 10,
            prefault_memory: false,
            flash_image_bytes: 0,
        }
    }

    fn object_entry(content: &[u8]) -> AppendEntry<'_> {
        AppendEntry::new(EntryType::Object, content)
    }

    /// Copying a segment for a backup holds the log lock only for a snapshot: an append made
    /// while the bytes are being copied goes through, and the copy is exactly what its
    /// certificate commits (without that append's bytes).
    #[test]
    fn appends_go_on_while_a_segment_is_copied() {
        let log = Log::new(small_config(), ServerId(1));
        // Spanning several 1 KiB seglets of one 8 KiB segment.
        for byte in 0..10u8 {
            log.append(&[object_entry(&[byte; 300])], AppendPriority::Normal).unwrap();
        }
        let head = log.head_segment_id().unwrap();
        let (before, _) = log.segment_contents(head).unwrap();
        let length_before = log.segment_length(head).unwrap();
        assert!(length_before > 3 << 10, "{length_before}");
        let appended_during_copy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let appended = appended_during_copy.clone();
        *log.copy_hook.lock().unwrap() = Some(CopyHook(Box::new(move |log: &Log| {
            assert!(log.state.try_lock().is_ok(), "the log lock is held during the copy");
            log.append(&[object_entry(&[0xee; 50])], AppendPriority::Normal).unwrap();
            appended.store(true, Ordering::SeqCst);
        })));
        let (bytes, certificate) = log.segment_contents(head).unwrap();
        assert!(appended_during_copy.load(Ordering::SeqCst), "the hook ran inside the copy");
        assert_eq!(bytes, before, "the copy is the snapshot's bytes");
        assert_eq!(certificate.segment_length, length_before);
        assert_eq!(log.head_segment_id(), Some(head));
        assert!(log.segment_length(head).unwrap() > length_before, "the append landed");
        assert!(
            SegmentIterator::new(&bytes, &certificate).is_ok(),
            "the certificate commits exactly the bytes copied"
        );
    }

    /// A side log fills segments beside the log; fusing it is all or nothing: with no room for
    /// the fusing head none of its segments joins the log, and it can still be abandoned
    /// whole, which returns its memory and reports its segments dropped.
    #[test]
    fn an_abandoned_compaction_leaves_the_segment_and_frees_what_it_set_aside() {
        let log = Log::new(small_config(), ServerId(1));
        for byte in 0..10u8 {
            log.append(&[object_entry(&[byte; 300])], AppendPriority::Normal).unwrap();
        }
        let closed = log.segment_ids()[0];
        log.roll_head(AppendPriority::Normal).unwrap();
        let before = log.statistics();
        let contents = log.segment_contents(closed).unwrap();
        assert!(log.begin_compaction(closed, 3));
        assert_eq!(log.statistics().seglets_free, before.seglets_free - 3);
        // Being compacted: no second compaction or cleaning may start.
        assert!(!log.begin_compaction(closed, 1));
        log.abandon_compaction(closed);
        assert_eq!(log.statistics().seglets_free, before.seglets_free);
        assert_eq!(log.segment_contents(closed).unwrap(), contents);
        // And it may be compacted again.
        assert!(log.begin_compaction(closed, 1));
        log.abandon_compaction(closed);
    }

    #[test]
    fn a_side_log_joins_the_log_whole_or_is_abandoned_whole() {
        let log = Log::new(small_config(), ServerId(1));
        log.append(&[object_entry(&[1; 100])], AppendPriority::Normal).unwrap();
        let in_log = log.segment_ids();
        let mut side_log = SideLog::new(AppendPriority::Normal);
        let mut closed = Vec::new();
        let mut references = Vec::new();
        let error = loop {
            match side_log.append(&log, &object_entry(&[7; 900])) {
                Ok((reference, full)) => {
                    references.push(reference);
                    closed.extend(full);
                }
                Err(error) => break error,
            }
        };
        assert_eq!(error, AppendError::LogFull, "ordinary priority stops at the reserves");
        assert!(side_log.segments().len() >= 3);
        assert_eq!(closed, side_log.segments()[..closed.len()]);
        assert_eq!(closed.len() + 1, side_log.segments().len());
        assert_eq!(log.segment_ids(), in_log, "side segments are not in the log");
        // Take the reserves too, so not even the fusing head fits.
        while log.append(&[object_entry(&[2; 900])], AppendPriority::MayUseReserve).is_ok() {}
        let fused = log.fuse_side_segments(side_log.segments(), AppendPriority::Normal);
        assert_eq!(fused, Err(AppendError::LogFull));
        assert!(log.segment_ids().iter().all(|id| !side_log.segments().contains(id)));
        // Abandon: free every object first (the index would), then drop the side log.
        let guard = log.pin();
        for reference in references {
            log.free(&guard, reference);
        }
        drop(guard);
        let side_seglets: u64 = side_log
            .segments()
            .iter()
            .map(|id| u64::from(log.segment_length(*id).unwrap().div_ceil(1 << 10)))
            .sum();
        let free_filled = log.statistics().seglets_free;
        log.abandon_side_segments(side_log.segments());
        assert_eq!(log.take_dropped_segments(), side_log.segments());
        log.reclaim();
        assert_eq!(log.statistics().seglets_free, free_filled + side_seglets, "memory came back");
    }

    /// More drops than are remembered between two takes: the oldest are forgotten, and
    /// counted, so replication can find them by membership.
    #[test]
    fn drops_past_the_remembered_limit_are_counted_as_forgotten() {
        let log = Log::new(small_config(), ServerId(1));
        log.append(&[object_entry(&[1; 100])], AppendPriority::Normal).unwrap();
        let mut abandoned = Vec::new();
        for _ in 0..DROPPED_SEGMENTS_REMEMBERED_MAX + 3 {
            let mut side_log = SideLog::new(AppendPriority::Normal);
            let (reference, _) = side_log.append(&log, &object_entry(&[7; 100])).unwrap();
            let guard = log.pin();
            log.free(&guard, reference);
            drop(guard);
            log.abandon_side_segments(side_log.segments());
            abandoned.extend_from_slice(side_log.segments());
            log.reclaim();
        }
        assert_eq!(log.dropped_segments_forgotten(), 3);
        assert_eq!(log.take_dropped_segments(), abandoned[3..]);
        assert!(abandoned.iter().all(|&id| log.certificate(id).is_none()));
        assert_eq!(log.dropped_segments_forgotten(), 3, "a take forgets nothing");
    }

    /// Fusing with room: the side segments join the log with the new head, in one digest.
    #[test]
    fn fused_side_segments_are_listed_by_the_new_head() {
        let log = Log::new(small_config(), ServerId(1));
        log.append(&[object_entry(&[1; 100])], AppendPriority::Normal).unwrap();
        let mut side_log = SideLog::new(AppendPriority::Normal);
        for _ in 0..12 {
            side_log.append(&log, &object_entry(&[7; 900])).unwrap();
        }
        let head = log.fuse_side_segments(side_log.segments(), AppendPriority::Normal).unwrap();
        assert_eq!(log.head_segment_id(), Some(head));
        let (bytes, certificate) = log.segment_contents(head).unwrap();
        let digest = SegmentIterator::new(&bytes, &certificate)
            .unwrap()
            .find_map(|entry| match entry.unwrap().entry {
                Entry::LogDigest(digest) => Some(digest),
                _ => None,
            })
            .unwrap();
        for id in side_log.segments() {
            assert!(digest.contains(id), "segment {id} missing from the digest");
        }
        assert_eq!(log.segment_ids(), digest);
    }

    /// Reference 0 means "no entry" in the hash table, so no entry may ever be at byte 0 of
    /// the region, however seglets are handed out and reused.
    #[test]
    fn no_entry_is_ever_at_reference_zero() {
        let log = Log::new(small_config(), ServerId(7));
        // Seglet 0 is never free, so no segment (survivor, compacted copy or head) can start
        // there when seglets are reused.
        assert_eq!(log.statistics().seglets_free, 95);
        let object = encode_object(TableId(1), Version(1), 10, None, b"k", &[7u8; 300]);
        let mut appended = 0;
        while let Ok(done) = log.append(&[object_entry(&object)], AppendPriority::Normal) {
            assert!(done.references.iter().all(|reference| reference.0 >= 1 << 10));
            appended += 1;
        }
        assert!(appended > 100, "the log filled: {appended} appends");
        assert_eq!(log.statistics().seglets_total, 96);
    }

    #[test]
    fn a_filtered_segment_keeps_its_header_and_the_chosen_entries() {
        let log = Log::new(small_config(), ServerId(7));
        let keep = encode_object(TableId(1), Version(1), 10, None, b"keep", b"v1");
        let drop = encode_object(TableId(2), Version(2), 10, None, b"drop", b"v2");
        log.append(&[object_entry(&keep), object_entry(&drop)], AppendPriority::Normal).unwrap();
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let only_table_one = |entry: &Entry<'_>| matches!(entry, Entry::Object(object) if object.table == TableId(1));
        let (filtered, filtered_certificate) =
            crate::filter_segment(&bytes, &certificate, &only_table_one).unwrap();
        let entries: Vec<_> = SegmentIterator::new(&filtered, &filtered_certificate)
            .unwrap()
            .map(|entry| entry.unwrap().entry)
            .collect();
        assert_eq!(entries.len(), 2, "{entries:?}");
        assert!(matches!(entries[0], Entry::SegmentHeader(header) if header.log_id == ServerId(7)));
        assert!(matches!(entries[1], Entry::Object(object) if object.key == b"keep"));
        // The result is a verifiable replica of the same segment.
        let verified =
            crate::verify_replica(&filtered, &filtered_certificate, ServerId(7), SegmentId(1))
                .unwrap();
        assert_eq!(verified.digest, None);
        // A corrupt replica is refused rather than filtered.
        let mut corrupt = bytes.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        assert!(crate::filter_segment(&corrupt, &certificate, &only_table_one).is_err());
    }

    #[test]
    fn a_partitioned_segment_equals_one_filter_per_part() {
        let log = Log::new(small_config(), ServerId(7));
        let objects: Vec<Vec<u8>> = (0..12u64)
            .map(|i| {
                encode_object(TableId(1 + i % 3), Version(i + 1), 10, None, &i.to_le_bytes(), b"v")
            })
            .collect();
        let entries: Vec<_> = objects.iter().map(|object| object_entry(object)).collect();
        log.append(&entries, AppendPriority::Normal).unwrap();
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let table_of = |entry: &Entry<'_>| match entry {
            Entry::Object(object) => Some(object.table.0),
            _ => None,
        };
        // Part 0: table 1; part 1: tables 1 and 2 (an entry may go to several parts); part 2:
        // nothing but the header. Table 3 goes nowhere.
        let parts = crate::partition_segment(
            &bytes,
            &certificate,
            3,
            &|entry, parts| match table_of(entry) {
                Some(1) => {
                    parts[0] = true;
                    parts[1] = true;
                }
                Some(2) => parts[1] = true,
                _ => {}
            },
        )
        .unwrap();
        assert_eq!(parts.len(), 3);
        let tables: [&[u64]; 3] = [&[1], &[1, 2], &[]];
        for (part, tables) in parts.iter().zip(tables) {
            let keep = |entry: &Entry<'_>| table_of(entry).is_some_and(|t| tables.contains(&t));
            let alone = crate::filter_segment(&bytes, &certificate, &keep).unwrap();
            assert_eq!(*part, alone);
            crate::verify_replica(&part.0, &part.1, ServerId(7), SegmentId(1)).unwrap();
        }
        let count =
            |part: &(Vec<u8>, Certificate)| SegmentIterator::new(&part.0, &part.1).unwrap().count();
        assert_eq!([count(&parts[0]), count(&parts[1]), count(&parts[2])], [5, 9, 1]);
        // A corrupt replica is refused whole.
        let mut corrupt = bytes.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        assert!(crate::partition_segment(&corrupt, &certificate, 3, &|_, _| {}).is_err());
    }

    #[test]
    fn verify_replica_checks_identity_and_reports_the_digest() {
        let log = Log::new(small_config(), ServerId(7));
        let object = encode_object(TableId(1), Version(1), 10, None, b"k", b"v");
        log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let verified =
            crate::verify_replica(&bytes, &certificate, ServerId(7), SegmentId(1)).unwrap();
        assert_eq!(verified.digest, Some(vec![SegmentId(1)]));
        assert_eq!(verified.table_stats, Some(crate::TableStats::default()));
        assert_eq!(verified.entries, 5);
        // Another log's or another segment's replica is refused.
        assert!(crate::verify_replica(&bytes, &certificate, ServerId(8), SegmentId(1)).is_err());
        assert!(crate::verify_replica(&bytes, &certificate, ServerId(7), SegmentId(2)).is_err());
        // A flipped byte in an entry is refused.
        let mut corrupt = bytes.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 1;
        assert!(crate::verify_replica(&corrupt, &certificate, ServerId(7), SegmentId(1)).is_err());
        // An empty certified prefix is refused.
        let empty = Certificate { segment_length: 0, checksum: 0 };
        assert!(crate::verify_replica(&bytes, &empty, ServerId(7), SegmentId(1)).is_err());
    }

    #[test]
    fn first_append_opens_a_head_with_header_digest_safe_version_and_table_stats() {
        let log = Log::new(small_config(), ServerId(7));
        let object = encode_object(TableId(1), Version(1), 10, None, b"k", b"v");
        // The store reports live objects; the head records what it reported.
        let tally = crate::TableTally { bytes: 300, objects: 2 };
        log.table_tallies().object_added(0, TableId(4), 100);
        log.table_tallies().object_added(1, TableId(4), 200);
        let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        assert_eq!(appended.segment_id, SegmentId(1));
        let (bytes, certificate) = log.segment_contents(SegmentId(1)).unwrap();
        let entries: Vec<_> =
            SegmentIterator::new(&bytes, &certificate).unwrap().map(Result::unwrap).collect();
        assert_eq!(entries.len(), 5);
        assert!(matches!(entries[0].entry, Entry::SegmentHeader(header)
            if header.segment_id == SegmentId(1) && header.log_id == ServerId(7)));
        assert_eq!(entries[1].entry, Entry::LogDigest(vec![SegmentId(1)]));
        assert_eq!(entries[2].entry, Entry::SafeVersion(Version(1)));
        assert_eq!(
            entries[3].entry,
            Entry::TableStats(crate::TableStats {
                tables: vec![(TableId(4), tally)],
                others: crate::TableTally::default()
            })
        );
        assert!(matches!(entries[4].entry, Entry::Object(view) if view.key == b"k"));
        // The first segment starts at seglet 1 (seglet 0 is never used).
        let seglet_bytes = u64::from(log.config().seglet_bytes);
        assert_eq!(u64::from(entries[4].offset) + seglet_bytes, appended.references[0].0);
        let guard = log.pin();
        let (entry_type, content) = log.entry(&guard, appended.references[0]);
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
                encode_object(TableId(1), Version(u64::from(index) + 1), 0, None, b"key", &value);
            let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
            written.push((appended.references[0], object));
        }
        let guard = log.pin();
        for (reference, object) in &written {
            let (_, content) = log.entry(&guard, *reference);
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
        let filler = encode_object(TableId(1), Version(1), 0, None, b"f", &[0; 1500]);
        let object = encode_object(TableId(1), Version(2), 0, None, b"key", &[1; 900]);
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
            let guard = log.pin();
            let (entry_type, content) = log.entry(&guard, pair.references[1]);
            assert_eq!(entry_type, EntryType::Tombstone);
            assert_eq!(&content[..], &tombstone[..]);
        }
    }

    #[test]
    fn log_full_keeps_a_reserve_for_tombstones() {
        let log = Log::new(small_config(), ServerId(1));
        let object = encode_object(TableId(1), Version(1), 0, None, b"k", &[0; 500]);
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
        let object = encode_object(TableId(1), Version(1), 0, None, b"k", b"value");
        let appended = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        let before = log.segment_statistics(appended.segment_id).unwrap();
        log.free(&log.pin(), appended.references[0]);
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
            let object =
                encode_object(TableId(1), Version(1), 0, None, &[index + 1], &[index; 700]);
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
            LogConfig {
                log_bytes: 1 << 20,
                segment_bytes: 64 << 10,
                seglet_bytes: 1 << 10,
                prefault_memory: false,
                flash_image_bytes: 0,
            },
            ServerId(1),
        );
        std::thread::scope(|scope| {
            for thread in 0..4u8 {
                let log = &log;
                scope.spawn(move || {
                    for index in 0..100u32 {
                        let value = vec![thread; 50 + (index as usize % 300)];
                        let object = encode_object(
                            TableId(1),
                            Version(1),
                            index,
                            None,
                            &[thread + 1],
                            &value,
                        );
                        let appended =
                            log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
                        let guard = log.pin();
                        let (_, content) = log.entry(&guard, appended.references[0]);
                        assert_eq!(&content[..], &object[..]);
                    }
                });
            }
        });
    }

    /// The cleaner's mechanics with a reader racing them, small enough for Miri
    /// (`cargo +nightly miri test -p stratus-log cleaning_mechanics`): an object is moved to a
    /// survivor, its old segment dropped and its seglets reused, then the survivor compacted;
    /// a reader that follows the object's current reference (the hash table's role) under an
    /// epoch guard always reads the object's exact bytes.
    #[test]
    fn cleaning_mechanics_with_a_concurrent_reader() {
        use std::sync::atomic::AtomicBool;
        let log = Log::new(small_config(), ServerId(1));
        let object = encode_object(TableId(1), Version(1), 5, None, b"moving", &[7; 300]);
        let first = log.append(&[object_entry(&object)], AppendPriority::Normal).unwrap();
        let filler = encode_object(TableId(1), Version(2), 5, None, b"filler", &[1; 2000]);
        while log.head_segment_id() == Some(first.segment_id) {
            log.append(&[object_entry(&filler)], AppendPriority::Normal).unwrap();
        }
        let current = AtomicU64::new(first.references[0].0);
        let done = AtomicBool::new(false);
        let survivor = std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut reads = 0;
                while !done.load(Ordering::Acquire) || reads < 3 {
                    let guard = log.pin();
                    let reference = Reference(current.load(Ordering::Acquire));
                    let (entry_type, content) = log.entry(&guard, reference);
                    assert_eq!(entry_type, EntryType::Object);
                    assert_eq!(&content[..], &object[..]);
                    reads += 1;
                    drop(guard);
                    std::thread::yield_now();
                }
            });
            // Combined cleaning of the first segment: move the object to a survivor.
            assert!(log.begin_cleaning(&[first.segment_id]));
            let survivor = log.open_side_segment(AppendPriority::Cleaner).unwrap();
            let moved = log.append_to_side_segment(
                survivor,
                &AppendEntry::new(EntryType::Object, &object),
                AppendPriority::Cleaner,
            );
            current.store(moved.unwrap().0, Ordering::Release);
            log.commit_cleaning(&[survivor], &[first.segment_id]);
            log.roll_head(AppendPriority::CleanerCommit).unwrap();
            assert!(!log.segment_ids().contains(&first.segment_id));
            assert!(log.segment_ids().contains(&survivor));
            assert_eq!(log.take_dropped_segments(), vec![first.segment_id]);
            // Reuse the dropped seglets once the reader lets go of them.
            while log.statistics().seglets_waiting_for_readers > 0 {
                log.reclaim();
                std::thread::yield_now();
            }
            for _ in 0..3 {
                log.append(&[object_entry(&filler)], AppendPriority::Normal).unwrap();
            }
            // Compact the survivor in place: same id, the object moves again.
            let guard = log.pin();
            let entries = log.segment_entries(&guard, survivor).unwrap();
            let (header_reference, header_type) = entries[0];
            assert_eq!(header_type, EntryType::SegmentHeader);
            let (_, header) = log.entry(&guard, header_reference);
            let header = header.into_owned();
            drop(guard);
            assert!(log.begin_compaction(survivor, 1));
            log.append_to_compacted(survivor, &AppendEntry::new(EntryType::SegmentHeader, &header));
            let compacted =
                log.append_to_compacted(survivor, &AppendEntry::new(EntryType::Object, &object));
            current.store(compacted.0, Ordering::Release);
            log.finish_compaction(survivor);
            while log.statistics().seglets_waiting_for_readers > 0 {
                log.reclaim();
                std::thread::yield_now();
            }
            done.store(true, Ordering::Release);
            survivor
        });
        let (bytes, certificate) = log.segment_contents(survivor).unwrap();
        assert_eq!(SegmentIterator::new(&bytes, &certificate).unwrap().count(), 2);
    }
}
