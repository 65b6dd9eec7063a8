//! Automatic tiering (docs/design/flash-tier.md, "Automatic tiering"): the objects of `auto`
//! tables stay in DRAM up to the store's budget (`StoreConfig::auto_dram_bytes_max`); past it
//! the cleaner demotes the segment holding auto objects that was read or written least
//! recently, and a read of an auto object on flash may bring it back (promotion).
//!
//! Invariants:
//!
//! 1. **One live copy.** The index points at exactly one entry per object, whatever its tier;
//!    a promotion switches it from the FLASH_OBJECT to the promoted OBJECT under the object's
//!    bucket lock, then frees the FLASH_OBJECT, so no reader ever sees two.
//! 2. **A promotion keeps the version.** The promoted OBJECT is the image's entry byte for byte
//!    (its checksum, timestamp, version and expiry), so a client that read version v before
//!    the promotion sees v after it, and conditional writes behave as before.
//! 3. **The source leaves the log first.** After a promotion of an object from segment S into
//!    the head H, the object's version is in S's replicas (they hold the whole object: a
//!    FLASH_OBJECT never leaves the master) and in H. A later remove or overwrite writes one
//!    tombstone, naming H. The cleaner drops a tombstone once the segment it names has left
//!    the log, so if H left before S, recovery could replay S's copy with no tombstone left
//!    to kill it. Hence H is not cleaned (combined cleaning drops segments; compaction keeps
//!    them) while a segment it received promotions from is still in the log
//!    ([`ObjectStore::promotion_pins`]), unless they leave in the same pass: then neither is
//!    replayed, and the tombstone naming H is kept by that pass (H is still in the log while
//!    it runs) and dropped by a later one, once both are gone. Taking H only with its sources
//!    matters: every head that receives promotions is pinned to older segments, so when the
//!    whole log is imaged segments that received promotions (a small budget), only the oldest
//!    would ever be free to clean, and a pass of one segment neither lowers the segment count
//!    nor frees memory: at the segment limit the cleaner stalled for good (simulation, auto
//!    seeds 5 and 11). Together with the replica manager's rule that a
//!    dropped segment's replicas are freed only once a head after its drop is durable, S's
//!    replicas also outlive the promoted copy's first durable write.
//! 4. **Access times only grow between compactions.** A seglet's access time is the latest
//!    second one of its auto objects was read; a segment's is the largest over its seglets and
//!    its creation time (so it is never older than its newest write). A compaction moves a
//!    segment to other seglets and carries the time over; a seglet reused by a new segment
//!    keeps its former owner's time, which is never later than the new segment's creation
//!    (the seglet was free in between), so it changes nothing.
//! 5. **Read counts decay.** A seglet's reads of auto objects are counted and halved once per
//!    second (when demotion ranks segments), so a segment's count says how often it is read
//!    now; a compaction spreads the count over the new seglets, and a seglet not read since
//!    its segment was made (its access time older than the segment) counts nothing, so a
//!    reused seglet's former reads are not its new owner's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use stratus_index::BucketGuard;
use stratus_log::format::decode_object;
use stratus_log::{AppendEntry, AppendPriority, EntryType, EpochGuard, Reference};
use stratus_types::{SegmentId, TableId, Tier};

use crate::auto_figures::{AutoTableCounts, AutoTableFigures};
use crate::config::PromotionAdmission;
use crate::{ByteSink, Current, ObjectError, ObjectStore, WallTime};

/// What the store knows of its auto tables.
#[derive(Debug)]
pub(crate) struct AutoTier {
    /// Whether any table is auto (reads of other tables then skip all of this).
    has_auto_tables: AtomicBool,
    /// Per seglet of the log region: the latest second an auto object in it was read.
    seglet_access_seconds: Box<[AtomicU32]>,
    /// Per seglet: reads of auto objects in it, halved every second (invariant 5) — how often,
    /// where the access time only says how lately.
    seglet_reads: Box<[AtomicU32]>,
    /// The second up to which `seglet_reads` were halved.
    reads_decayed_seconds: AtomicU32,
    /// Recent reads from flash, for admission to DRAM on a second read (made when the first
    /// auto table is).
    recent_flash_reads: OnceLock<RecentFlashReads>,
    /// Per auto table: objects and bytes on flash now (at full size, as the tallies count
    /// them: the tallies' share of a table minus these is what it holds in DRAM), and its
    /// reads, promotions and demoted objects since the store was made.
    tables: AutoTableFigures,
    /// Counters since the store was made that belong to no one table.
    promotions_refused: AtomicU64,
    demotions: AtomicU64,
    /// State of the promotion draw (a xorshift generator: the engine reads no entropy).
    draw: AtomicU64,
    state: Mutex<AutoState>,
}

#[derive(Debug, Default)]
struct AutoState {
    /// Promotion bytes that may be written now (at most one second's worth), as of
    /// `refilled_millis`.
    tokens: u64,
    refilled_millis: u64,
    /// Invariant 3: head segments that received promotions, and the segments they came from
    /// that may still be in the log.
    promoted_into: BTreeMap<SegmentId, BTreeSet<SegmentId>>,
    /// Closed segments found to hold no auto object in DRAM (a closed segment gains none).
    no_auto_objects: BTreeSet<SegmentId>,
}

/// Figures of the auto tables of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoStatistics {
    /// Objects of auto tables in DRAM.
    pub dram_objects: u64,
    /// Their bytes (entries with headers).
    pub dram_bytes: u64,
    /// Objects of auto tables on flash (a FLASH_OBJECT in DRAM each).
    pub flash_objects: u64,
    /// Their bytes at full size.
    pub flash_bytes: u64,
    /// The DRAM budget (`StoreConfig::auto_dram_bytes_max`).
    pub dram_bytes_max: u64,
    /// Reads of auto objects served from DRAM, since the store was made.
    pub reads_from_dram: u64,
    /// Reads of auto objects served from flash.
    pub reads_from_flash: u64,
    /// Objects promoted from flash into DRAM.
    pub promotions: u64,
    /// Their bytes.
    pub promoted_bytes: u64,
    /// Promotions drawn but not done: over the byte rate, or no memory for the copy.
    pub promotions_refused: u64,
    /// Segments demoted because auto tables were over their DRAM budget.
    pub demotions: u64,
    /// Auto objects moved to flash (by those demotions or with a flash table's).
    pub objects_demoted: u64,
}

/// Figures of one auto table of a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoTableStatistics {
    /// The table.
    pub table: TableId,
    /// Its objects in DRAM.
    pub dram_objects: u64,
    /// Their bytes (entries with headers).
    pub dram_bytes: u64,
    /// Where the rest are, and its reads and moves.
    pub counts: AutoTableCounts,
}

impl AutoStatistics {
    /// Reads served from DRAM over all reads of auto objects; 1 when there were none.
    pub fn dram_hit_ratio(&self) -> f64 {
        let reads = self.reads_from_dram + self.reads_from_flash;
        if reads == 0 {
            return 1.0;
        }
        self.reads_from_dram as f64 / reads as f64
    }
}

/// How lately and how often a segment's auto objects were accessed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentAccess {
    /// The latest second it was written or read (invariant 4).
    pub(crate) seconds: u32,
    /// Its seglets' decayed reads (invariant 5).
    pub(crate) reads: u32,
    /// Its seglets.
    pub(crate) seglets: u32,
}

impl SegmentAccess {
    /// Reads per seglet: what keeping the segment's memory in DRAM is worth per byte.
    fn reads_per_seglet(&self) -> u32 {
        self.reads / self.seglets.max(1)
    }
}

/// A seglet's read count is halved on the read that finds it this high, so it never wraps
/// while no demotion decays the counts.
const SEGLET_READS_HALVED_AT: u32 = 1 << 30;

/// Bytes of the auto DRAM budget per entry of the recent-flash-reads table: 256 gives about
/// four entries per object that fits the budget at 1 KiB, so an object read twice while about
/// four budgets' worth of other objects were read from flash is still remembered; the table
/// costs 8 bytes per entry (1/32 of the budget).
const BUDGET_BYTES_PER_RECENT_FLASH_READ: u64 = 256;
/// Bounds on the table's entries (8 KiB to 8 MiB).
const RECENT_FLASH_READS_MIN: usize = 1 << 10;
const RECENT_FLASH_READS_MAX: usize = 1 << 20;

/// The FLASH_OBJECTs read recently, in a direct-mapped table of their log references: a
/// read that finds its own reference there is a second read, and admits the object to DRAM
/// (`PromotionAdmission::SecondRead`). An object read once in a long while is forgotten (its
/// slot taken by later reads) before it comes back, so it never displaces a hotter one.
#[derive(Debug)]
struct RecentFlashReads {
    slots: Box<[AtomicU64]>,
}

impl RecentFlashReads {
    fn new(auto_dram_bytes_max: u64) -> RecentFlashReads {
        let wanted = (auto_dram_bytes_max / BUDGET_BYTES_PER_RECENT_FLASH_READ) as usize;
        let entries = wanted.clamp(RECENT_FLASH_READS_MIN, RECENT_FLASH_READS_MAX);
        RecentFlashReads { slots: (0..entries).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Records a read of the FLASH_OBJECT at `reference`; true if it was the latest read
    /// recorded in its slot (a second read), which then forgets it.
    fn read_again(&self, reference: Reference) -> bool {
        // Tags are references plus one (0: empty); the slot is a multiplicative hash of it.
        let tag = reference.0.wrapping_add(1);
        let index = (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % self.slots.len();
        let previous = self.slots[index].swap(tag, Ordering::Relaxed);
        if previous == tag {
            self.slots[index].store(0, Ordering::Relaxed);
            return true;
        }
        false
    }
}

impl AutoTier {
    pub(crate) fn new(seglets: u32) -> AutoTier {
        AutoTier {
            has_auto_tables: AtomicBool::new(false),
            seglet_access_seconds: (0..seglets).map(|_| AtomicU32::new(0)).collect(),
            seglet_reads: (0..seglets).map(|_| AtomicU32::new(0)).collect(),
            reads_decayed_seconds: AtomicU32::new(0),
            recent_flash_reads: OnceLock::new(),
            tables: AutoTableFigures::default(),
            promotions_refused: AtomicU64::new(0),
            demotions: AtomicU64::new(0),
            draw: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
            state: Mutex::new(AutoState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, AutoState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ObjectStore {
    /// Figures of the auto tables.
    pub fn auto_statistics(&self) -> AutoStatistics {
        let auto = &self.auto;
        let (total_objects, total_bytes) = self.auto_table_totals();
        let sum = auto.tables.sum();
        AutoStatistics {
            dram_objects: total_objects.saturating_sub(sum.flash_objects),
            dram_bytes: total_bytes.saturating_sub(sum.flash_bytes),
            flash_objects: sum.flash_objects,
            flash_bytes: sum.flash_bytes,
            dram_bytes_max: self.config.auto_dram_bytes_max,
            reads_from_dram: sum.reads_from_dram,
            reads_from_flash: sum.reads_from_flash,
            promotions: sum.promotions,
            promoted_bytes: sum.promoted_bytes,
            promotions_refused: auto.promotions_refused.load(Ordering::Relaxed),
            demotions: auto.demotions.load(Ordering::Relaxed),
            objects_demoted: sum.objects_demoted,
        }
    }

    /// Figures of the auto tables this store holds (in DRAM, on flash, reads and moves): the
    /// `tables_max` with the most bytes, ascending by table.
    pub fn auto_table_statistics(&self, tables_max: usize) -> Vec<AutoTableStatistics> {
        if !self.auto.has_auto_tables.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let tables: Vec<TableId> = {
            let tiers = self.table_tiers.read().expect("table tiers poisoned");
            tiers.iter().filter(|(_, tier)| **tier == Tier::Auto).map(|(table, _)| *table).collect()
        };
        let counts = self.auto.tables.by_table();
        let tallies = self.log.table_tallies().by_table();
        let mut statistics: Vec<AutoTableStatistics> = tables
            .into_iter()
            .map(|table| {
                let tally = tallies.get(&table).copied().unwrap_or_default();
                let counts = counts.get(&table).copied().unwrap_or_default();
                AutoTableStatistics {
                    table,
                    dram_objects: tally.objects.saturating_sub(counts.flash_objects),
                    dram_bytes: tally.bytes.saturating_sub(counts.flash_bytes),
                    counts,
                }
            })
            .collect();
        if statistics.len() > tables_max {
            let bytes = |table: &AutoTableStatistics| table.dram_bytes + table.counts.flash_bytes;
            statistics.sort_unstable_by(|a, b| bytes(b).cmp(&bytes(a)).then(a.table.cmp(&b.table)));
            statistics.truncate(tables_max);
        }
        statistics.sort_unstable_by_key(|table| table.table);
        statistics
    }

    /// Live objects and bytes of every auto table, from the per-table tallies.
    fn auto_table_totals(&self) -> (u64, u64) {
        if !self.auto.has_auto_tables.load(Ordering::Relaxed) {
            return (0, 0);
        }
        let tables: Vec<TableId> = {
            let tiers = self.table_tiers.read().expect("table tiers poisoned");
            tiers.iter().filter(|(_, tier)| **tier == Tier::Auto).map(|(table, _)| *table).collect()
        };
        let tallies = self.log.table_tallies().by_table();
        tables
            .into_iter()
            .filter_map(|table| tallies.get(&table))
            .fold((0, 0), |(objects, bytes), tally| (objects + tally.objects, bytes + tally.bytes))
    }

    /// Whether auto tables hold more DRAM than their budget (the cleaner demotes then).
    pub(crate) fn auto_over_budget(&self) -> bool {
        if !self.auto.has_auto_tables.load(Ordering::Relaxed) {
            return false;
        }
        let (_, total_bytes) = self.auto_table_totals();
        let dram_bytes = total_bytes.saturating_sub(self.auto.tables.sum().flash_bytes);
        dram_bytes > self.config.auto_dram_bytes_max
    }

    /// Whether any table is auto.
    pub(crate) fn is_auto_tiering(&self) -> bool {
        self.auto.has_auto_tables.load(Ordering::Relaxed)
    }

    /// A table became auto.
    pub(crate) fn auto_table_added(&self) {
        self.auto
            .recent_flash_reads
            .get_or_init(|| RecentFlashReads::new(self.config.auto_dram_bytes_max));
        self.auto.has_auto_tables.store(true, Ordering::Relaxed);
        self.auto.state().no_auto_objects.clear();
    }

    /// Whether `table` is auto (cheap when no table is).
    pub(crate) fn is_auto_table(&self, table: TableId) -> bool {
        self.auto.has_auto_tables.load(Ordering::Relaxed) && self.table_tier(table) == Tier::Auto
    }

    /// Records that the entry at `reference`, the index's object of `table`, is being freed:
    /// an auto table's FLASH_OBJECT leaves the flash figures. Frees it and returns its bytes
    /// (as [`stratus_log::Log::free`]). The caller holds the object's bucket lock.
    pub(crate) fn free_index_entry(
        &self,
        epoch: &EpochGuard<'_>,
        (key_shard, reference): (u64, Reference),
        table: TableId,
    ) -> u64 {
        let leaves_flash = self.is_auto_table(table)
            && self.log.entry(epoch, reference).0 == EntryType::FlashObject;
        let bytes = self.log.free(epoch, reference);
        if leaves_flash {
            self.auto.tables.left_flash(key_shard, table, bytes);
        }
        bytes
    }

    /// An object of auto table `table` of `bytes` (full size) became a FLASH_OBJECT by a
    /// demotion; `key_shard` is its key's bucket (whose lock the caller holds).
    pub(crate) fn auto_object_demoted(&self, key_shard: u64, table: TableId, bytes: u64) {
        self.auto.tables.update(key_shard, table, |counts| {
            counts.flash_objects += 1;
            counts.flash_bytes += bytes;
            counts.objects_demoted += 1;
        });
    }

    /// A read of an auto object in DRAM at `reference`: counted, and its seglet's access time
    /// raised to `now` — written only when it changes, so a hot seglet's cache line is not
    /// written by every read.
    pub(crate) fn note_dram_read(
        &self,
        (key_shard, table): (u64, TableId),
        reference: Reference,
        now: WallTime,
    ) {
        self.auto.tables.update(key_shard, table, |counts| counts.reads_from_dram += 1);
        let seglet = self.log.seglet_of(reference) as usize;
        let reads = self.auto.seglet_reads[seglet].fetch_add(1, Ordering::Relaxed);
        if reads >= SEGLET_READS_HALVED_AT {
            // Nobody decays them while the budget holds (no demotion ranks segments): halve
            // here rather than wrap. A racing increment may be lost; it is a heuristic.
            self.auto.seglet_reads[seglet].store(reads / 2, Ordering::Relaxed);
        }
        let cell = &self.auto.seglet_access_seconds[seglet];
        let seconds = now.seconds();
        if cell.load(Ordering::Relaxed) < seconds {
            cell.fetch_max(seconds, Ordering::Relaxed);
        }
    }

    /// How lately and how often `segment_id` was accessed: the latest second it was written
    /// (its creation) or one of its auto objects read (invariant 4), and the decayed reads of
    /// its seglets (invariant 5). `None` when the segment is not in memory.
    pub(crate) fn segment_access(
        &self,
        segment_id: SegmentId,
        creation_seconds: u32,
    ) -> Option<SegmentAccess> {
        let seglets = self.log.segment_seglets(segment_id)?;
        let mut access = SegmentAccess { seconds: creation_seconds, reads: 0, seglets: 0 };
        for seglet in seglets {
            let seconds = self.auto.seglet_access_seconds[seglet as usize].load(Ordering::Relaxed);
            access.seconds = access.seconds.max(seconds);
            access.seglets += 1;
            // A seglet not read since this segment was made holds a former owner's reads.
            if seconds >= creation_seconds {
                let reads = self.auto.seglet_reads[seglet as usize].load(Ordering::Relaxed);
                access.reads = access.reads.saturating_add(reads);
            }
        }
        Some(access)
    }

    /// After a compaction moved `segment_id` to other seglets: they take the access time it
    /// had before (invariant 4) and share its reads (invariant 5).
    pub(crate) fn carry_access(&self, segment_id: SegmentId, access: SegmentAccess) {
        let Some(seglets) = self.log.segment_seglets(segment_id) else { return };
        let share = access.reads / (seglets.len() as u32).max(1);
        for seglet in seglets {
            self.auto.seglet_access_seconds[seglet as usize]
                .store(access.seconds, Ordering::Relaxed);
            self.auto.seglet_reads[seglet as usize].store(share, Ordering::Relaxed);
        }
    }

    /// Halves every seglet's reads once per second passed since the last time (invariant 5).
    fn decay_seglet_reads(&self, now: WallTime) {
        let now_seconds = now.seconds();
        let last = self.auto.reads_decayed_seconds.swap(now_seconds, Ordering::Relaxed);
        // The first ranking starts the clock (0: never decayed); the counts so far are recent.
        let halvings = if last == 0 { 0 } else { now_seconds.saturating_sub(last) };
        if halvings == 0 {
            return;
        }
        for reads in self.auto.seglet_reads.iter() {
            let value = reads.load(Ordering::Relaxed);
            if value > 0 {
                reads.store(value.checked_shr(halvings).unwrap_or(0), Ordering::Relaxed);
            }
        }
    }

    /// Reads an auto object on flash (the index's `current`, a FLASH_OBJECT whose content is
    /// `stub`) into `value_out` and, if drawn and within the byte rate, promotes it: its entry,
    /// read from the image and verified, is appended at the log head unchanged (invariant 2)
    /// and the index switched to it. The caller holds the bucket lock (`guard`) and has checked
    /// that no transaction holds the object, so no write can come between the read and the
    /// switch: a concurrent write, remove or prepare waits for the lock and then finds the
    /// promoted copy, exactly as it would have found the FLASH_OBJECT.
    pub(crate) fn read_from_flash(
        &self,
        (epoch, guard): (&EpochGuard<'_>, &mut BucketGuard<'_>),
        table: TableId,
        current: &Current,
        stub: &[u8],
        now: WallTime,
        value_out: &mut dyn ByteSink,
    ) -> Result<(), ObjectError> {
        self.auto.tables.update(guard.bucket_index(), table, |counts| counts.reads_from_flash += 1);
        let content = self.flash_object_content(current.reference, stub)?;
        let object = decode_object(&content).map_err(|_| ObjectError::FlashCorrupt)?;
        value_out.put_slice(object.value);
        if self.promotion_admitted(current.reference) && self.promotion_drawn() {
            self.promote(epoch, guard, table, current, &content, now);
        }
        Ok(())
    }

    /// Whether this read of the FLASH_OBJECT at `reference` may promote it: every read, or
    /// (the default) only a second read while the first is remembered.
    fn promotion_admitted(&self, reference: Reference) -> bool {
        match self.config.promotion_admission {
            PromotionAdmission::FirstRead => true,
            PromotionAdmission::SecondRead => self
                .auto
                .recent_flash_reads
                .get()
                .is_some_and(|recent| recent.read_again(reference)),
        }
    }

    /// Whether this read promotes: one in `promotion_one_in_reads`.
    fn promotion_drawn(&self) -> bool {
        let one_in = u64::from(self.config.promotion_one_in_reads);
        if one_in <= 1 {
            return true;
        }
        // xorshift64: a race between readers may repeat a draw, which only skews the odds.
        let mut x = self.auto.draw.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.auto.draw.store(x, Ordering::Relaxed);
        x.is_multiple_of(one_in)
    }

    /// Appends `content` (the OBJECT a FLASH_OBJECT stands for) at the head and points the
    /// index at it; refused (counted) over the byte rate or when memory is short.
    fn promote(
        &self,
        epoch: &EpochGuard<'_>,
        guard: &mut BucketGuard<'_>,
        table: TableId,
        current: &Current,
        content: &[u8],
        now: WallTime,
    ) {
        let entry = AppendEntry::new(EntryType::Object, content);
        let bytes = entry.entry_bytes() as u64;
        let source = self.log.segment_of(current.reference);
        // The state lock is held from the append until the pin is recorded (invariant 3): the
        // head the copy lands in is no cleaning candidate before then (it is the head), and a
        // pass choosing candidates takes this lock.
        let mut state = self.auto.state();
        if !take_tokens(&mut state, self.config.promotion_bytes_per_second_max, bytes, now) {
            self.auto.promotions_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // Normal priority: a promotion never takes the reserves that removes and the cleaner
        // need; without room it is simply not done.
        let Ok(appended) = self.log.append(&[entry], AppendPriority::Normal) else {
            self.auto.promotions_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let reference = appended.references[0];
        let head = self.log.segment_of(reference);
        state.promoted_into.entry(head).or_default().insert(source);
        drop(state);
        guard.replace(current.slot, reference.0);
        let key_shard = guard.bucket_index();
        let old_bytes = self.free_index_entry(epoch, (key_shard, current.reference), table);
        assert_eq!(old_bytes, bytes, "a promoted copy is the object it stands for");
        self.log.table_tallies().object_replaced(key_shard, table, old_bytes, bytes);
        self.auto.tables.update(key_shard, table, |counts| {
            counts.promotions += 1;
            counts.promoted_bytes += bytes;
        });
    }

    /// Pins each of `heads` to every one of `sources` (invariant 3): for survivors of a pass
    /// that kept some of its segments, which may hold objects whose older copies the kept
    /// segments still hold.
    pub(crate) fn pin_to_sources(&self, heads: &[SegmentId], sources: &[SegmentId]) {
        let mut state = self.auto.state();
        for head in heads {
            state.promoted_into.entry(*head).or_default().extend(sources.iter().copied());
        }
    }

    /// Segments combined cleaning may take only together with the segments they name
    /// (invariant 3): those that received promotions from segments still in the log, each with
    /// those sources. Forgets pins whose sources have all left.
    pub(crate) fn promotion_pins(&self) -> BTreeMap<SegmentId, BTreeSet<SegmentId>> {
        let mut state = self.auto.state();
        if state.promoted_into.is_empty() {
            return BTreeMap::new();
        }
        let in_log: BTreeSet<SegmentId> = self.log.segment_ids().into_iter().collect();
        state.promoted_into.retain(|head, sources| {
            sources.retain(|source| in_log.contains(source));
            // A head the log still knows keeps its pin: a pass's survivors are pinned while
            // they wait to be fused into the log (a deferred fusion can leave them so across
            // passes), and a pin lost then would let them leave before their sources.
            !sources.is_empty()
                && (in_log.contains(head) || self.log.segment_seglets(*head).is_some())
        });
        state.promoted_into.clone()
    }

    /// Closed, replicated segments that may hold auto objects in DRAM, as candidates for an
    /// auto demotion: the least read per seglet first (decayed reads, invariant 5), then the
    /// least recently accessed, then the oldest.
    pub(crate) fn auto_demotion_order(&self, now: WallTime) -> Vec<SegmentId> {
        let candidates = self.log.cleaning_candidates(now.millis());
        let skip = {
            // Segments no longer candidates (cleaned, mostly) are forgotten, so the set stays
            // as small as the log.
            let mut state = self.auto.state();
            let ids: BTreeSet<SegmentId> =
                candidates.iter().map(|candidate| candidate.segment_id).collect();
            state.no_auto_objects.retain(|id| ids.contains(id));
            state.no_auto_objects.clone()
        };
        self.decay_seglet_reads(now);
        let mut ranked: Vec<(u32, u32, SegmentId)> = candidates
            .into_iter()
            .filter(|candidate| !skip.contains(&candidate.segment_id))
            .filter_map(|candidate| {
                let access =
                    self.segment_access(candidate.segment_id, candidate.creation_seconds)?;
                Some((access.reads_per_seglet(), access.seconds, candidate.segment_id))
            })
            .collect();
        ranked.sort_unstable();
        ranked.into_iter().map(|(_, _, segment_id)| segment_id).collect()
    }

    /// `segment_id` was found to hold no auto object in DRAM that a demotion could move (none,
    /// or it has an image already: a segment is imaged once).
    pub(crate) fn note_no_auto_objects(&self, segment_id: SegmentId) {
        self.auto.state().no_auto_objects.insert(segment_id);
    }

    /// A demotion chosen for the auto budget was done.
    pub(crate) fn auto_demotion_done(&self) {
        self.auto.demotions.fetch_add(1, Ordering::Relaxed);
    }
}

/// Takes `bytes` from the promotion bucket (refilled at `rate` bytes per second, holding one
/// second's worth at most); false, taking nothing, when it lacks them.
fn take_tokens(state: &mut AutoState, rate: u64, bytes: u64, now: WallTime) -> bool {
    let elapsed = now.millis().saturating_sub(state.refilled_millis);
    if elapsed > 0 {
        let refill = rate.saturating_mul(elapsed) / 1_000;
        state.tokens = state.tokens.saturating_add(refill).min(rate);
        state.refilled_millis = now.millis();
    }
    if state.tokens < bytes {
        return false;
    }
    state.tokens -= bytes;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flash_read_is_remembered_until_its_second_read_or_until_another_takes_its_slot() {
        let recent = RecentFlashReads::new(0);
        assert_eq!(recent.slots.len(), RECENT_FLASH_READS_MIN);
        assert!(!recent.read_again(Reference(42)), "a first read");
        assert!(recent.read_again(Reference(42)), "the second read");
        assert!(!recent.read_again(Reference(42)), "forgotten once admitted");
        // Reference 0 is a reference like any other (tags are offset from the empty slot).
        assert!(!recent.read_again(Reference(0)));
        assert!(recent.read_again(Reference(0)));
        // Enough other reads take every slot: the first read is forgotten.
        assert!(!recent.read_again(Reference(7)));
        for other in 1_000..1_000 + 64 * RECENT_FLASH_READS_MIN as u64 {
            recent.read_again(Reference(other));
        }
        assert!(!recent.read_again(Reference(7)), "pushed out by later reads");
        let large = RecentFlashReads::new(16 << 20);
        assert_eq!(large.slots.len(), 65_536, "a 16 MiB budget: 256 bytes per entry");
        assert_eq!(RecentFlashReads::new(u64::MAX).slots.len(), RECENT_FLASH_READS_MAX);
    }

    #[test]
    fn the_token_bucket_refills_at_its_rate_and_holds_one_second_at_most() {
        let mut state = AutoState::default();
        let start = WallTime::from_millis(10_000);
        // Ten seconds since time 0: full, one second's worth.
        assert!(take_tokens(&mut state, 1_000, 1_000, start));
        assert!(!take_tokens(&mut state, 1_000, 1, start));
        assert!(take_tokens(&mut state, 1_000, 500, WallTime::from_millis(10_500)));
        assert!(!take_tokens(&mut state, 1_000, 1, WallTime::from_millis(10_500)));
        assert!(!take_tokens(&mut state, 0, 1, WallTime::from_millis(99_000)));
    }
}
