//! The log cleaner: the balancer, combined cleaning and in-memory compaction
//! (docs/design/cleaner.md).
//!
//! The cleaner is driven from outside: a server thread calls [`ObjectStore::clean_once`] in a
//! loop, concurrently with requests; tests call it between writes. Each call does at most one
//! unit of work (one combined pass or one compaction) and only when the balancer says memory is
//! short, so an idle loop costs a few counter reads. Time arrives as an argument.
//!
//! Correctness rests on three rules:
//! - **Relocation is conditional.** An object moves only under its bucket lock and only if the
//!   hash table still points at the old reference (pointer equality); a writer holding the lock
//!   first wins, and the cleaner then finds the reference changed and skips the dead copy.
//! - **Tombstones live while the segment they name is in the log** (or is a survivor); they are
//!   dropped only when that segment is already gone or about to be dropped by the next digest.
//! - **Memory is reused after the epoch.** Cleaned segments leave the log through the next
//!   head's digest, which fuses the survivors in at the same time; their seglets are retired
//!   then and handed back only once every reader pinned before is gone.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use stratus_index::ResizeProgress;
use stratus_log::format::{
    decode_completion_unverified, decode_object_unverified, decode_prepared_unverified,
    decode_tombstone, decode_tx_participants_unverified, encode_flash_object, segment_named_by,
    FlashLocator, ENTRY_HEADER_BYTES_MAX, SEGMENT_HEADER_CONTENT_BYTES,
};
use stratus_log::{
    AppendEntry, AppendPriority, Certificate, CleaningCandidate, EntryType, LogConfig, Reference,
    SideLog,
};
use stratus_types::{key_hash, LeaseId, RpcId, SegmentId};

use crate::completions::Relocation;
use crate::{ObjectStore, WallTime};

/// Percent of a segment's allocated memory that may be live for combined cleaning to choose it
/// (RAMCloud's `MAX_CLEANABLE_MEMORY_UTILIZATION`): every cleaned segment frees at least 2 %,
/// which with the one-seglet minimum below bounds the survivors' tail waste.
pub const CLEANABLE_UTILIZATION_MAX_PERCENT: u64 = 98;

/// Most live data one combined pass moves, in segments (RAMCloud's
/// `MAX_LIVE_SEGMENTS_PER_DISK_PASS` and the LFS simulator's "up to ten segments").
pub const PASS_LIVE_SEGMENTS_MAX: u64 = 10;

/// Percent of memory the unallocated seglets may take at most before cleaning starts (the
/// first half of RAMCloud's trigger `F <= min(10 %, (1 - L) / 2)`).
pub const CLEAN_FREE_PERCENT_MAX: u64 = 10;

/// Default tombstone ratio of the balancer, in percent (RAMCloud's default
/// `tombstoneRatio:0.40`): combined cleaning runs when tombstones take this share of the memory
/// not holding live objects.
pub const TOMBSTONE_RATIO_PERCENT_DEFAULT: u32 = 40;

/// Percent of the log's segment limit ([`stratus_log::LogConfig::segment_count_max`]) past
/// which combined cleaning is forced (the text's "on-disk log above 90 % of its limit").
pub const SEGMENT_COUNT_FORCE_PERCENT: u64 = 90;

/// Percent of the flash budget's images past which combined cleaning of imaged segments is
/// forced ([`Goal::Flash`]). Demotion needs a free image for every segment it moves out; a tier
/// allowed to fill before cleaning starts has only dead bytes in images left to win, and
/// winning them takes survivor memory that the objects waiting for demotion have taken by then:
/// writes stop (seen by `stratus bench flash` at 80 % live data). The same share as the
/// segment limit's trigger.
pub const FLASH_CLEAN_FORCE_PERCENT: u64 = 90;

/// Default memory target of a server (`--memory-target-percent`): live bytes are 90 % of the
/// log's resident memory, the utilization RAMCloud's cleaner is measured at (the cleaner's cost
/// rises steeply above it).
pub const MEMORY_TARGET_PERCENT_DEFAULT: u32 = 90;

/// Room above the memory target, in segments: the head fills a segment before anything in it
/// can be cleaned, and a combined pass needs free seglets for its survivors.
pub const MEMORY_TARGET_HEADROOM_SEGMENTS: u64 = 1;

/// The memory target never asks for less than this many segments' worth: below it cleaning
/// would gain little and run often.
pub const MEMORY_TARGET_FLOOR_SEGMENTS: u64 = 2;

/// Most live data one combined pass moves, in segments, with a memory target: its survivors
/// are written before the cleaned segments leave, so a pass overshoots the target by up to
/// this much (RAMCloud's ten would be 80 MB at the default segment size).
pub const MEMORY_TARGET_PASS_LIVE_SEGMENTS_MAX: u64 = 2;

/// Most seglets given back to the operating system per call of the cleaner: bounds the time of
/// one call (one madvise per seglet) so the loop stays responsive.
pub const RELEASE_SEGLETS_PER_CALL_MAX: usize = 256;

/// Most units of hash-table migration (one bucket split or two merged, each under its stripe's
/// lock alone) per call of the cleaner: a few milliseconds, so a table that must double during
/// a bulk load catches up within a few calls of a cleaner thread that does not sleep meanwhile.
pub const INDEX_RESIZE_UNITS_PER_CALL: u64 = 16_384;

/// Units of hash-table migration a writer does when the background resize has fallen behind
/// ([`ObjectStore::help_resize_index_if_behind`]): small, so one write waits little.
pub const INDEX_RESIZE_UNITS_BY_WRITER: u64 = 64;

/// Segments cleaned between two dead-tombstone scans (RAMCloud's
/// `SCAN_TOMBSTONES_EVERY_N_SEGMENTS`): scanning cost then grows with cleaning, so with the
/// write load.
pub const TOMBSTONE_SCAN_EVERY_SEGMENTS: u64 = 5;

/// Percent of a compacted segment's seglets that may be live (RAMCloud's compactor keeps every
/// segment it writes at most 98 % utilized).
pub const COMPACTED_UTILIZATION_MAX_PERCENT: u64 = 98;

/// How many entries ahead the cleaner prefetches the hash-table bucket of the object it will
/// relocate: far enough that the bucket arrives (a memory access is a few hundred ns, one
/// relocation well under that when the bucket is cached), near enough that it is still cached.
const PREFETCH_DISTANCE_ENTRIES: usize = 8;

/// How the combined cleaner ranks segments (`u` = live fraction of the segment's allocated
/// memory, `age` = seconds since the segment was created, plus one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostBenefit {
    /// `(1 − u) · age / u`: RAMCloud's code at f52d5bcc. The cost of cleaning in memory is
    /// copying the live fraction `u`; nothing is read from disk. The default.
    AgeOverUtilization,
    /// `(1 − u) · age / (1 + u)`: the dissertation's Eq. 7.3 (LFS's cost, which counts reading
    /// the segment as well as writing its live data).
    AgeOverOnePlusUtilization,
}

impl CostBenefit {
    /// The score of a segment: higher is cleaned first.
    pub fn score(self, live_fraction: f64, age_seconds: u64) -> f64 {
        let age = (age_seconds + 1) as f64;
        let free = 1.0 - live_fraction;
        match self {
            CostBenefit::AgeOverUtilization if live_fraction <= 0.0 => f64::INFINITY,
            CostBenefit::AgeOverUtilization => free * age / live_fraction,
            CostBenefit::AgeOverOnePlusUtilization => free * age / (1.0 + live_fraction),
        }
    }
}

/// The cleaner's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanerConfig {
    /// Segment ranking for combined cleaning.
    pub cost_benefit: CostBenefit,
    /// Balancer: combined cleaning when tombstone bytes / (memory − live object bytes) reaches
    /// this percentage; otherwise compaction.
    pub tombstone_ratio_percent: u32,
    /// Replicas of the log. 0 is the memory-only mode: compaction is pointless without backups
    /// (it exists to keep the 1:1 memory/disk segment mapping), so only the combined cleaner
    /// runs, in memory.
    pub replicas: u32,
    /// Memory that tracks the data: keep the log's resident memory near its live bytes / this
    /// percentage ([`ObjectStore::memory_target_bytes`]), cleaning ahead of need once the
    /// allocated seglets pass it and giving free seglets' pages back to the operating system.
    /// `None`: the log may fill its whole region before cleaning starts and keeps every page it
    /// touched (RAMCloud's dedicated machine; `--prefault-memory`).
    pub memory_target_percent: Option<u32>,
}

impl Default for CleanerConfig {
    fn default() -> CleanerConfig {
        CleanerConfig {
            cost_benefit: CostBenefit::AgeOverUtilization,
            tombstone_ratio_percent: TOMBSTONE_RATIO_PERCENT_DEFAULT,
            replicas: 0,
            memory_target_percent: None,
        }
    }
}

/// What one [`ObjectStore::clean_once`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanOutcome {
    /// Memory is not short: nothing to do (call again later).
    Idle,
    /// Memory is not short, but the hash table was being resized and more may remain: call
    /// again soon.
    IndexResized,
    /// Memory is short but no segment is worth cleaning now (all too full, or chosen by
    /// another cleaner).
    NothingToClean,
    /// A combined pass ran.
    Combined {
        /// Segments dropped from the log.
        segments_cleaned: u64,
        /// Survivor segments written.
        survivor_segments: u64,
        /// Bytes of live entries moved.
        bytes_relocated: u64,
    },
    /// A segment was compacted in place.
    Compacted {
        /// The segment.
        segment_id: SegmentId,
        /// Seglets freed.
        seglets_freed: u64,
    },
    /// A combined pass moved its survivors, but they could not all be made durable: the pass
    /// waits (no other combined pass starts meanwhile), and the next `clean_once` tries again.
    /// After a [final](DurabilityError::is_final) error nothing will succeed again: the caller
    /// stops cleaning.
    SurvivorsNotDurable(DurabilityError),
}

/// What one [`ObjectStore::clean_step`] call did.
#[derive(Debug)]
#[must_use = "a pending pass must be finished with ObjectStore::finish_combined_pass"]
pub enum CleanStep {
    /// The unit of work is done (as [`ObjectStore::clean_once`] would report it).
    Finished(CleanOutcome),
    /// A combined pass moved its survivors into side segments, which must be on every replica
    /// before they join the log: replicate each of
    /// [`PendingCombinedPass::survivor_segments`], then call
    /// [`ObjectStore::finish_combined_pass`]. Requests are served meanwhile (they read the
    /// survivors); no other combined pass starts until this one is finished.
    Replicate(PendingCombinedPass),
}

/// A combined pass between relocation and commit (see [`CleanStep::Replicate`]).
#[derive(Debug)]
pub struct PendingCombinedPass {
    chosen: Vec<SegmentId>,
    chosen_seglets: Vec<u64>,
    survivor_segments: Vec<SegmentId>,
    /// How many of `survivor_segments`, from the first, the durability hook made durable
    /// (a pass whose hook failed goes on from there).
    survivors_durable: usize,
    remaining: Vec<usize>,
    out_of_memory: bool,
    object_bytes: u64,
    tombstone_bytes: u64,
    completion_bytes: u64,
    tombstones_dropped: u64,
}

impl PendingCombinedPass {
    /// The survivor segments to replicate (complete: they take no more entries).
    pub fn survivor_segments(&self) -> &[SegmentId] {
        &self.survivor_segments
    }
}

/// Counters of the cleaner's work since the store was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanerStatistics {
    /// Combined passes completed.
    pub combined_passes: u64,
    /// Segments dropped from the log by combined cleaning.
    pub segments_cleaned: u64,
    /// Survivor segments written.
    pub survivor_segments_written: u64,
    /// Bytes of objects moved by combined cleaning.
    pub object_bytes_relocated: u64,
    /// Bytes of tombstones moved by combined cleaning.
    pub tombstone_bytes_relocated: u64,
    /// Bytes of unacknowledged completion records moved by combined cleaning.
    pub completion_bytes_relocated: u64,
    /// Tombstones dropped because the segment they name left the log.
    pub tombstones_dropped: u64,
    /// Seglets of the segments combined cleaning dropped.
    pub seglets_cleaned: u64,
    /// Compactions completed.
    pub compactions: u64,
    /// Bytes moved by compaction.
    pub bytes_compacted: u64,
    /// Seglets freed by compaction.
    pub seglets_freed_by_compaction: u64,
    /// Compactions that freed nothing (each forces the next unit to be combined cleaning).
    pub compactions_failed: u64,
    /// Segments scanned for dead tombstones.
    pub tombstone_scans: u64,
    /// Bytes of dead tombstones the scans found.
    pub dead_tombstone_bytes_found: u64,
    /// `clean_once` calls that found memory short but nothing worth cleaning.
    pub nothing_to_clean: u64,
    /// Expired objects dropped by cleaning (combined or compaction) instead of moved.
    pub expired_objects_dropped: u64,
    /// Their bytes.
    pub expired_bytes_dropped: u64,
    /// Times the durability hook failed to make a survivor durable (its pass waited).
    pub survivors_not_durable: u64,
    /// Free seglets whose pages were given back to the operating system (memory target).
    pub seglets_released: u64,
    /// Combined passes cut short because an object could not be read back from flash (the
    /// segment stays in the log, whole; the error is the flash tier's, not the data's).
    pub flash_read_failures: u64,
}

/// A hook replication provides: the cleaner blocks on it for every survivor segment before the
/// survivors are fused into the log (RAMCloud waits until survivors are fully replicated).
pub trait SegmentDurability: Send + Sync + std::fmt::Debug {
    /// Makes `bytes` (the whole survivor segment, committed by `certificate`) durable, waiting
    /// at most a bound of the hook's own: `Ok` once it is on every replica.
    fn make_durable(
        &self,
        segment_id: SegmentId,
        bytes: &[u8],
        certificate: Certificate,
    ) -> Result<(), DurabilityError>;
}

/// Why a survivor segment was not made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityError {
    /// Not on every replica within the hook's bound (backups slow or down): it may be later.
    TimedOut,
    /// This master was declared crashed (a backup or the coordinator refused it): nothing it
    /// writes can become durable any more.
    Fenced,
    /// Replication has stopped (the process is stopping).
    Stopped,
}

impl DurabilityError {
    /// True when no later attempt can succeed: the caller stops cleaning.
    pub fn is_final(self) -> bool {
        !matches!(self, DurabilityError::TimedOut)
    }
}

impl std::fmt::Display for DurabilityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DurabilityError::TimedOut => "survivor not replicated in time",
            DurabilityError::Fenced => "this master was declared crashed",
            DurabilityError::Stopped => "replication has stopped",
        })
    }
}

impl std::error::Error for DurabilityError {}

/// The cleaner's shared state inside the store.
#[derive(Debug, Default)]
pub(crate) struct CleanerState {
    /// Held by the one combined cleaner (RAMCloud: at most one combined-cleaning thread).
    pub(crate) combined: std::sync::Mutex<()>,
    /// A combined pass relocated its survivors and waits for them to be replicated (by the
    /// caller of [`ObjectStore::clean_step`], or by `clean_once` through the hook): no other
    /// combined pass may start until it is finished.
    pub(crate) pass_pending: AtomicBool,
    /// The pending pass whose survivors the hook failed to make durable, for the next
    /// `clean_once` to go on with.
    pub(crate) stalled_pass: std::sync::Mutex<Option<PendingCombinedPass>>,
    pub(crate) statistics: std::sync::Mutex<CleanerStatistics>,
    /// The last compaction freed nothing: the next unit is combined cleaning.
    pub(crate) compaction_failed: AtomicBool,
    pub(crate) durability: std::sync::RwLock<Option<Arc<dyn SegmentDurability>>>,
    /// Passes that could not roll the head to fuse at once (they fuse at the next roll).
    pub(crate) deferred_fusions: AtomicU64,
    /// Segments cleaned or compacted since the last dead-tombstone scan.
    pub(crate) segments_since_tombstone_scan: AtomicU64,
}

/// A live entry found in a segment being cleaned.
struct Survivor {
    timestamp: u32,
    reference: Reference,
    entry_type: EntryType,
    /// An object's key hash (its bucket is prefetched ahead of its relocation); 0 otherwise.
    key_hash: u64,
    /// Index of its segment in the pass.
    segment_index: usize,
}

/// Which kind of work the balancer picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Combined(Goal),
    Compaction,
    /// Flash nears its budget: a combined pass for flash first; if no segment with an image is
    /// worth cleaning, `memory`'s work (when memory needs any) in the same unit, so flash
    /// pressure never stops memory's cleaning.
    Flash {
        memory: Option<MemoryWork>,
    },
}

/// What memory alone would need of the cleaner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemoryWork {
    Combined,
    Compaction,
}

/// What a combined pass is for: it chooses segments and accepts a plan by this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Goal {
    /// Memory is short: rank by memory utilization (live / allocated seglets) and run only a
    /// pass that frees more seglets than it uses.
    Memory,
    /// The log nears its segment limit (compaction shrinks segments but never removes one):
    /// rank by disk utilization (live / full segment, RAMCloud's disk cleaner) and accept a
    /// pass that lowers the segment count even if it frees no memory. Without this a log of
    /// many small, densely compacted segments stops every write at the limit while memory is
    /// almost empty, and no pass that must free memory is ever worth running.
    Segments,
    /// The flash tier nears its budget: rank segments with images by their survivors against a
    /// whole segment, as for the segment limit, and clean only those (their images are
    /// deleted when the pass commits; the survivors are demoted again later, densely).
    Flash,
}

impl ObjectStore {
    /// Installs the hook the cleaner calls before survivors join the log (replication).
    pub fn set_segment_durability(&self, durability: Option<Arc<dyn SegmentDurability>>) {
        *self.cleaner.durability.write().expect("durability hook lock poisoned") = durability;
    }

    /// The cleaner's counters.
    pub fn cleaner_statistics(&self) -> CleanerStatistics {
        *self.cleaner.statistics.lock().expect("cleaner statistics poisoned")
    }

    fn count(&self, update: impl FnOnce(&mut CleanerStatistics)) {
        update(&mut self.cleaner.statistics.lock().expect("cleaner statistics poisoned"));
    }

    /// Does one unit of cleaning if the balancer says memory is short: reclaims seglets whose
    /// readers are gone, then runs one combined pass or one compaction. Safe to call from any
    /// number of threads concurrently with requests (one combined cleaner at a time; other
    /// callers compact, or return [`CleanOutcome::NothingToClean`] in memory-only mode).
    ///
    /// A combined pass's survivors are made durable through the [`SegmentDurability`] hook,
    /// with the combined-cleaner lock released: the hook waits for backups, and nothing else
    /// needs to wait for it (no other combined pass starts while one is pending). A pass
    /// whose survivors the hook could not make durable is kept, and the next call goes on with
    /// it ([`CleanOutcome::SurvivorsNotDurable`]).
    pub fn clean_once(&self, now: WallTime) -> CleanOutcome {
        if let Some(pass) = self.take_stalled_pass() {
            return self.replicate_then_finish(pass);
        }
        match self.clean_unit(now) {
            CleanStep::Finished(outcome) => outcome,
            CleanStep::Replicate(pass) => self.replicate_then_finish(pass),
        }
    }

    fn take_stalled_pass(&self) -> Option<PendingCombinedPass> {
        self.cleaner.stalled_pass.lock().expect("stalled pass lock poisoned").take()
    }

    /// Makes the survivors of `pass` durable through the hook (those not yet), then commits
    /// the pass; keeps it for the next call if the hook fails. Holds no cleaner lock.
    fn replicate_then_finish(&self, mut pass: PendingCombinedPass) -> CleanOutcome {
        debug_assert!(self.cleaner.pass_pending.load(Ordering::Acquire), "an unpended pass");
        // The hook may have been removed since the pass began: then nothing needs replicas.
        if let Some(durability) = self.durability_hook() {
            while let Some(&segment_id) = pass.survivor_segments.get(pass.survivors_durable) {
                let (bytes, certificate) =
                    self.log.segment_contents(segment_id).expect("survivor segment");
                if let Err(error) = durability.make_durable(segment_id, &bytes, certificate) {
                    self.count(|statistics| statistics.survivors_not_durable += 1);
                    *self.cleaner.stalled_pass.lock().expect("stalled pass lock poisoned") =
                        Some(pass);
                    return CleanOutcome::SurvivorsNotDurable(error);
                }
                pass.survivors_durable += 1;
            }
        }
        self.finish_combined_pass(pass)
    }

    fn durability_hook(&self) -> Option<Arc<dyn SegmentDurability>> {
        self.cleaner.durability.read().expect("durability hook lock poisoned").clone()
    }

    /// Like [`ObjectStore::clean_once`], for a caller that must not block (a task on an async
    /// runtime: the deterministic simulator runs the cleaner this way): a combined pass stops
    /// after moving its survivors and hands them back to be replicated; the caller then calls
    /// [`ObjectStore::finish_combined_pass`]. Without replication (no durability hook), or for
    /// a compaction, the step is finished at once.
    pub fn clean_step(&self, now: WallTime) -> CleanStep {
        self.clean_unit(now)
    }

    /// Commits a pass [`ObjectStore::clean_step`] returned, once its survivors are durable:
    /// they join the log (the next digest lists them and omits the cleaned segments).
    pub fn finish_combined_pass(&self, pass: PendingCombinedPass) -> CleanOutcome {
        let outcome = {
            let _lock = self.cleaner.combined.lock().expect("combined cleaner lock poisoned");
            let outcome = self.commit_pass(pass);
            self.cleaner.pass_pending.store(false, Ordering::Release);
            outcome
        };
        self.log.reclaim();
        outcome
    }

    /// The combined-cleaner lock, unless another holds it or a pass is pending.
    fn try_combined(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        let lock = self.cleaner.combined.try_lock().ok()?;
        (!self.cleaner.pass_pending.load(Ordering::Acquire)).then_some(lock)
    }

    fn clean_unit(&self, now: WallTime) -> CleanStep {
        self.log.observe_time(now.seconds());
        self.log.reclaim();
        self.release_memory_above_target();
        let resized = self.resize_index_step();
        let Some(work) = self.balance() else {
            return CleanStep::Finished(if resized {
                CleanOutcome::IndexResized
            } else {
                CleanOutcome::Idle
            });
        };
        let step = match work {
            Work::Combined(goal) => self.combined_unit(now, goal),
            Work::Compaction => self.compaction_unit(now),
            Work::Flash { memory } => match self.combined_unit(now, Goal::Flash) {
                CleanStep::Finished(CleanOutcome::NothingToClean) => match memory {
                    Some(MemoryWork::Combined) => self.combined_unit(now, Goal::Memory),
                    Some(MemoryWork::Compaction) => self.compaction_unit(now),
                    None => CleanStep::Finished(CleanOutcome::NothingToClean),
                },
                step => step,
            },
        };
        if matches!(step, CleanStep::Finished(CleanOutcome::NothingToClean)) {
            self.count(|statistics| statistics.nothing_to_clean += 1);
        }
        self.log.reclaim();
        step
    }

    /// A combined pass for `goal`, or a compaction while another thread runs one (with
    /// replicas: a memory-only log compacts nothing).
    fn combined_unit(&self, now: WallTime, goal: Goal) -> CleanStep {
        match self.try_combined() {
            Some(_lock) => self.clean_combined(now, goal),
            None if self.config.cleaner.replicas > 0 => CleanStep::Finished(self.compact_one(now)),
            None => CleanStep::Finished(CleanOutcome::NothingToClean),
        }
    }

    /// A compaction, or a combined pass for memory when no segment is worth compacting.
    fn compaction_unit(&self, now: WallTime) -> CleanStep {
        match self.compact_one(now) {
            CleanOutcome::NothingToClean => match self.try_combined() {
                Some(_lock) => self.clean_combined(now, Goal::Memory),
                None => CleanStep::Finished(CleanOutcome::NothingToClean),
            },
            outcome => CleanStep::Finished(outcome),
        }
    }

    /// Runs one combined pass now, whatever the balancer says (tests, tools, and a server that
    /// wants memory back before an operation). Waits for a concurrent combined pass to finish;
    /// a pass whose survivors could not be made durable is this one (it goes on).
    pub fn clean_combined_now(&self, now: WallTime) -> CleanOutcome {
        self.log.observe_time(now.seconds());
        self.log.reclaim();
        loop {
            if let Some(pass) = self.take_stalled_pass() {
                return self.replicate_then_finish(pass);
            }
            let lock = self.cleaner.combined.lock().expect("combined cleaner lock poisoned");
            if !self.cleaner.pass_pending.load(Ordering::Acquire) {
                let step = self.clean_combined(now, Goal::Memory);
                drop(lock);
                return match step {
                    CleanStep::Finished(outcome) => outcome,
                    CleanStep::Replicate(pass) => self.replicate_then_finish(pass),
                };
            }
            // A pass waits for its replication (each wait of the hook is bounded): let it
            // finish first.
            drop(lock);
            std::thread::yield_now();
        }
    }

    /// [`ObjectStore::clean_combined_now`] for the segment limit: segments are ranked by what
    /// their survivors would take against a whole segment (those whose objects are on flash
    /// included), as when the log nears its segment limit.
    #[cfg(test)]
    pub(crate) fn clean_for_segments_now(&self, now: WallTime) -> CleanOutcome {
        self.log.observe_time(now.seconds());
        self.log.reclaim();
        let lock = self.cleaner.combined.lock().expect("combined cleaner lock poisoned");
        let step = self.clean_combined(now, Goal::Segments);
        drop(lock);
        match step {
            CleanStep::Finished(outcome) => outcome,
            CleanStep::Replicate(pass) => self.replicate_then_finish(pass),
        }
    }

    /// One combined pass now, whatever the balancer says, for a caller that must not block (a
    /// recovery master making room for a replay): `None` while another combined pass runs or
    /// waits for its survivors' replication (look again once it is done); otherwise as
    /// [`ObjectStore::clean_step`]. `for_segments` ranks segments to lower the segment count
    /// (accepting a pass that frees no memory) rather than to free memory.
    pub fn clean_combined_step(&self, now: WallTime, for_segments: bool) -> Option<CleanStep> {
        self.log.observe_time(now.seconds());
        self.log.reclaim();
        let lock = self.try_combined()?;
        let goal = if for_segments { Goal::Segments } else { Goal::Memory };
        let step = self.clean_combined(now, goal);
        drop(lock);
        self.log.reclaim();
        Some(step)
    }

    /// Runs one compaction now, whatever the balancer says (tests and tools).
    pub fn compact_now(&self, now: WallTime) -> CleanOutcome {
        self.log.observe_time(now.seconds());
        self.log.reclaim();
        let outcome = self.compact_one(now);
        self.log.reclaim();
        outcome
    }

    /// RAMCloud's trigger: the usable free seglets (reserves excluded; those waiting for
    /// readers count as free, as RAMCloud counts them) are at most min(10 %, (1 − L)/2) of the
    /// region.
    fn memory_short(log: &LogConfig, statistics: &stratus_log::LogStatistics) -> bool {
        let total = statistics.seglets_total as f64;
        let free = statistics.seglets_free + statistics.seglets_waiting_for_readers;
        let reserves = u64::from(log.reserve_seglets() + log.cleaner_reserve_seglets());
        let usable_free = free.saturating_sub(reserves);
        let live_fraction =
            statistics.log_bytes_live_objects as f64 / statistics.log_bytes_total as f64;
        let threshold = (total * (CLEAN_FREE_PERCENT_MAX as f64 / 100.0))
            .min(total * (1.0 - live_fraction) / 2.0);
        usable_free as f64 <= threshold
    }

    /// The log's resident memory the memory target asks for: live bytes / the target
    /// percentage plus [`MEMORY_TARGET_HEADROOM_SEGMENTS`], at least
    /// [`MEMORY_TARGET_FLOOR_SEGMENTS`], at most the region. `None` without a target.
    pub fn memory_target_bytes(&self) -> Option<u64> {
        self.target_bytes_for(&self.log.statistics())
    }

    /// [`ObjectStore::memory_target_bytes`] from statistics already taken.
    pub(crate) fn target_bytes_for(&self, statistics: &stratus_log::LogStatistics) -> Option<u64> {
        let percent = u64::from(self.config.cleaner.memory_target_percent?.clamp(1, 100));
        let segment_bytes = u64::from(self.log.config().segment_bytes);
        let target = (statistics.log_bytes_live * 100 / percent
            + MEMORY_TARGET_HEADROOM_SEGMENTS * segment_bytes)
            .max(MEMORY_TARGET_FLOOR_SEGMENTS * segment_bytes)
            .min(statistics.log_bytes_total);
        Some(target)
    }

    /// With a memory target: gives back the pages of free seglets beyond what the target
    /// leaves room for (at most [`RELEASE_SEGLETS_PER_CALL_MAX`] per call). Returns how many.
    fn release_memory_above_target(&self) -> usize {
        // Without a target, not even the statistics (a pass over the segments).
        if self.config.cleaner.memory_target_percent.is_none() {
            return 0;
        }
        let statistics = self.log.statistics();
        let Some(target) = self.target_bytes_for(&statistics) else { return 0 };
        let seglet_bytes = u64::from(self.log.config().seglet_bytes);
        let in_use =
            statistics.log_bytes_allocated + statistics.seglets_waiting_for_readers * seglet_bytes;
        let keep = (target.saturating_sub(in_use) / seglet_bytes) as usize;
        let released = self.log.release_free_seglets(keep, RELEASE_SEGLETS_PER_CALL_MAX);
        if released > 0 {
            self.count(|statistics| {
                statistics.seglets_released += released as u64;
            });
        }
        released
    }

    /// One step of keeping the hash table sized for the live objects (a growable table, which
    /// a store with a memory target has): returns true if it migrated anything.
    fn resize_index_step(&self) -> bool {
        let entries = self.objects_live.load(Ordering::Relaxed);
        let progress = self.resize_index(entries, INDEX_RESIZE_UNITS_PER_CALL);
        matches!(progress, ResizeProgress::Migrating | ResizeProgress::Finished)
    }

    /// [`HashTable::resize_step`](stratus_index::HashTable::resize_step) with the store's hash
    /// of each entry (its object's key hash, read from the log). The caller holds no bucket
    /// lock.
    fn resize_index(&self, entries: u64, units_max: u64) -> ResizeProgress {
        let epoch = self.log.pin();
        self.index.resize_step(entries, units_max, |reference| {
            let (_, content) = self.log.entry(&epoch, Reference(reference));
            let object = decode_object_unverified(&content).expect("corrupt object in the log");
            key_hash(object.table, object.key).0
        })
    }

    /// Resizes a growable hash table for `entries` now, before they arrive (a recovery's
    /// replay); waits for a resize another thread has under way. Bounded: each call of the
    /// loop migrates or finds the size right, and the sizes are finite.
    pub(crate) fn size_index_for(&self, entries: u64) {
        for _ in 0..1_000_000 {
            match self.resize_index(entries, INDEX_RESIZE_UNITS_PER_CALL) {
                ResizeProgress::Idle => return,
                ResizeProgress::Busy => std::thread::yield_now(),
                ResizeProgress::Migrating | ResizeProgress::Finished => {}
            }
        }
    }

    /// From the write path, with no bucket lock held: when the background resize has fallen
    /// far behind the objects (twice the load that starts a resize), the writer migrates a few
    /// units itself, so chains stay short during a bulk load.
    pub(crate) fn help_resize_index_if_behind(&self) {
        if !self.index.can_resize() {
            return;
        }
        let entries = self.objects_live.load(Ordering::Relaxed);
        let count = self.index.bucket_count();
        if entries > count * stratus_index::GROW_ENTRIES_PER_BUCKET * 2
            && count < self.index.bucket_count_max()
        {
            self.resize_index(entries, INDEX_RESIZE_UNITS_BY_WRITER);
        }
    }

    /// Whether to clean, and how (docs/design/cleaner.md, "Balancer").
    fn balance(&self) -> Option<Work> {
        let log = self.log.config();
        let statistics = self.log.statistics();
        let total_bytes = statistics.log_bytes_total as f64;
        let live_fraction = statistics.log_bytes_live_objects as f64 / total_bytes;
        let memory_short = Self::memory_short(log, &statistics);
        // Counted as the limit counts them: survivors waiting to be fused take a slot, segments
        // waiting to be dropped do not.
        let segment_pressure = statistics.segments_in_next_digest * 100
            >= log.segment_count_max() as u64 * SEGMENT_COUNT_FORCE_PERCENT;
        // Past the memory target the log cleans ahead of need, as if its region ended there.
        let above_target = self
            .target_bytes_for(&statistics)
            .is_some_and(|target| statistics.log_bytes_allocated > target);
        let flash_pressure = self.flash_pressure();
        if !memory_short && !segment_pressure && !above_target && !flash_pressure {
            return None;
        }
        let memory_only = self.config.cleaner.replicas == 0;
        let tombstone_fraction = statistics.log_bytes_tombstones as f64 / total_bytes;
        let tombstones_heavy = tombstone_fraction
            >= f64::from(self.config.cleaner.tombstone_ratio_percent) / 100.0
                * (1.0 - live_fraction);
        let compaction_failed = self.cleaner.compaction_failed.swap(false, Ordering::Relaxed);
        let memory = (memory_short || above_target).then_some(
            if memory_only || tombstones_heavy || compaction_failed {
                MemoryWork::Combined
            } else {
                MemoryWork::Compaction
            },
        );
        if segment_pressure {
            Some(Work::Combined(Goal::Segments))
        } else if flash_pressure {
            Some(Work::Flash { memory })
        } else {
            match memory? {
                MemoryWork::Combined => Some(Work::Combined(Goal::Memory)),
                MemoryWork::Compaction => Some(Work::Compaction),
            }
        }
    }

    /// Candidates for combined cleaning, best first, with the 98 % rule applied (and, when the
    /// pass is for memory, the one-seglet minimum).
    fn ranked_candidates(&self, now: WallTime, goal: Goal) -> Vec<(CleaningCandidate, f64)> {
        let seglet_bytes = u64::from(self.log.config().seglet_bytes);
        let segment_bytes = u64::from(self.log.config().segment_bytes);
        let candidates = self.log.cleaning_candidates(now.millis());
        // For the flash budget, only segments with images: cleaning them deletes images.
        let imaged = (goal == Goal::Flash).then(|| self.imaged_segments());
        let mut ranked: Vec<(CleaningCandidate, f64)> = candidates
            .into_iter()
            .filter(|candidate| {
                imaged.as_ref().is_none_or(|imaged| imaged.contains(&candidate.segment_id))
            })
            .filter(|candidate| {
                // What cleaning writes (flash objects whole) against what it frees: a segment
                // whose objects are on flash frees little memory and writes them all back, so
                // only the segment limit (which counts images too) makes it worth cleaning.
                let allocated = u64::from(candidate.seglets) * seglet_bytes;
                let frees = match goal {
                    Goal::Memory => allocated,
                    Goal::Segments | Goal::Flash => allocated.max(segment_bytes),
                };
                candidate.survivor_bytes * 100 <= frees * CLEANABLE_UTILIZATION_MAX_PERCENT
            })
            .map(|candidate| {
                let capacity = match goal {
                    // Cleaning a segment also kills the tombstones that name it, elsewhere in
                    // the log: memory the next compaction of their segments gets back. Counted
                    // as if the segment held it (compaction makes the segment itself dense, so
                    // that is often the larger part of what cleaning it is worth).
                    Goal::Memory => {
                        u64::from(candidate.seglets) * seglet_bytes
                            + candidate.tombstone_bytes_naming
                    }
                    Goal::Segments | Goal::Flash => segment_bytes,
                };
                let live_fraction = candidate.survivor_bytes as f64 / capacity as f64;
                let age = u64::from(now.seconds().saturating_sub(candidate.creation_seconds));
                (candidate, self.config.cleaner.cost_benefit.score(live_fraction, age))
            })
            .collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.segment_id.cmp(&b.0.segment_id)));
        ranked
    }

    /// Scans the segment most likely to hold dead tombstones (highest tombstone bytes × time
    /// since its last scan) once [`TOMBSTONE_SCAN_EVERY_SEGMENTS`] segments were cleaned, or
    /// when `stuck` (nothing else is worth cleaning).
    fn scan_tombstones_if_due(&self, now: WallTime, stuck: bool) {
        let since = self.cleaner.segments_since_tombstone_scan.load(Ordering::Relaxed);
        if since < TOMBSTONE_SCAN_EVERY_SEGMENTS && !stuck {
            return;
        }
        let seglet_bytes = f64::from(self.log.config().seglet_bytes);
        let best = self
            .log
            .cleaning_candidates(now.millis())
            .into_iter()
            .filter(|candidate| candidate.tombstone_bytes > 0)
            .map(|candidate| {
                let waited = now.seconds().saturating_sub(candidate.tombstone_scan_seconds);
                let score = candidate.tombstone_bytes as f64 / seglet_bytes * f64::from(waited + 1);
                (candidate.segment_id, score)
            })
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)));
        if let Some((segment_id, _)) = best {
            self.cleaner.segments_since_tombstone_scan.store(0, Ordering::Relaxed);
            let found = self.log.scan_dead_tombstones(segment_id);
            self.count(|statistics| {
                statistics.tombstone_scans += 1;
                statistics.dead_tombstone_bytes_found += found;
            });
        }
    }

    /// One combined pass (the caller holds the combined-cleaner lock), preceded by a
    /// dead-tombstone scan when one is due.
    fn clean_combined(&self, now: WallTime, goal: Goal) -> CleanStep {
        self.scan_tombstones_if_due(now, false);
        match self.clean_combined_pass(now, goal) {
            CleanStep::Finished(CleanOutcome::NothingToClean) => {
                // Segments full of dead tombstones look live until scanned: scan, retry once.
                self.scan_tombstones_if_due(now, true);
                self.clean_combined_pass(now, goal)
            }
            step => step,
        }
    }

    /// One combined pass without the scan, up to its survivors' replication: with a durability
    /// hook installed the pass is pending when this returns, and whoever holds it replicates
    /// the survivors (without the combined-cleaner lock) and then finishes it.
    fn clean_combined_pass(&self, now: WallTime, goal: Goal) -> CleanStep {
        let log_config = *self.log.config();
        let statistics = self.log.statistics();
        // Survivors may use every free seglet but those a commit head needs (the writes'
        // reserves keep at least a segment's worth free for them), at most ten segments'
        // worth. Never plan with memory that is not there: a pass that runs out of memory
        // midway frees nothing.
        let free = statistics.seglets_free;
        // With a memory target a pass's survivors sit beside the segments they come from until
        // it commits, above the target: smaller passes keep that overshoot (and the pass's own
        // work list) small.
        // Only when cleaning ahead of need: a pass for the segment limit, or one the region
        // itself runs short for, moves as much as it can.
        let ahead_of_need = self.config.cleaner.memory_target_percent.is_some()
            && goal == Goal::Memory
            && !Self::memory_short(&log_config, &statistics);
        let pass_live_segments_max = if ahead_of_need {
            MEMORY_TARGET_PASS_LIVE_SEGMENTS_MAX
        } else {
            PASS_LIVE_SEGMENTS_MAX
        };
        let budget_seglets = free
            .saturating_sub(u64::from(log_config.head_seglets_max()))
            .min(pass_live_segments_max * u64::from(log_config.seglets_per_segment()));
        let segment_count_max = log_config.segment_count_max() as u64;
        let ranked = self.ranked_candidates(now, goal);
        // Segments holding promoted copies whose sources are still in the log go only with
        // those sources (auto_tier.rs, invariant 3). Read after the candidates: a promotion
        // records its pin while its head is still the head (no candidate), so a head pinned
        // after this read closed after it too, and is not among the candidates read before.
        let pins = self.promotion_pins();
        let mut plan = PassPlan::default();
        let mut waiting_for_sources: Vec<&CleaningCandidate> = Vec::new();
        for (candidate, _) in &ranked {
            // A segment with an object that did not read back from flash in an earlier pass
            // waits until it does (and so does whatever is pinned to it).
            if !self.cleanable_despite_flash(candidate.segment_id) {
                continue;
            }
            if !plan.has_sources_of(candidate.segment_id, &pins) {
                waiting_for_sources.push(candidate);
                continue;
            }
            if !plan.try_add(candidate, &log_config, budget_seglets) {
                continue;
            }
            // The choice may complete the sources of pinned candidates seen before it.
            while let Some(index) = waiting_for_sources
                .iter()
                .position(|waiting| plan.has_sources_of(waiting.segment_id, &pins))
            {
                let released = waiting_for_sources.remove(index);
                plan.try_add(released, &log_config, budget_seglets);
            }
        }
        let PassPlan {
            chosen,
            chosen_seglets,
            movable_total,
            freed_seglets,
            largest_entry_bytes,
            tombstones_killed_bytes,
        } = plan;
        let (planned_survivors, survivor_seglets) =
            survivor_seglets_max(&log_config, movable_total, largest_entry_bytes);
        let cost_seglets = survivor_seglets + u64::from(log_config.head_seglets_max());
        let chosen_count = chosen.len() as u64;
        let frees_memory = cost_seglets < freed_seglets;
        // A pass that gives back at least what it takes and kills tombstones is progress too:
        // where compaction has left every segment dense, the dead tombstones are the memory
        // left to win, and only cleaning the segments they name kills them.
        let kills_tombstones = cost_seglets <= freed_seglets && tombstones_killed_bytes > 0;
        // The commit head takes a slot too.
        let lowers_count = planned_survivors + 1 < chosen_count;
        let worth_it = match goal {
            Goal::Memory => frees_memory || kills_tombstones,
            // Memory for the survivors is there: the plan fits in the budget.
            // Fewer segments also means fewer images (the survivors' segments are demoted
            // again as one each).
            Goal::Segments | Goal::Flash => frees_memory || lowers_count,
        };
        let count_after = statistics.segments_in_next_digest + planned_survivors + 1;
        if chosen.is_empty()
            || !worth_it
            || count_after > segment_count_max + chosen_count
            || !self.log.begin_cleaning(&chosen)
        {
            return CleanStep::Finished(CleanOutcome::NothingToClean);
        }
        let pass = self.relocate(chosen, chosen_seglets, now);
        // Replication makes the survivors durable before they join the log.
        if self.durability_hook().is_none() {
            return CleanStep::Finished(self.commit_pass(pass));
        }
        self.cleaner.pass_pending.store(true, Ordering::Release);
        CleanStep::Replicate(pass)
    }

    /// Moves the live entries of `chosen` (marked as being cleaned) into survivor segments
    /// sorted by age; the pass is committed (`commit_pass`) once they are
    /// durable.
    fn relocate(
        &self,
        chosen: Vec<SegmentId>,
        chosen_seglets: Vec<u64>,
        now: WallTime,
    ) -> PendingCombinedPass {
        let epoch = self.log.pin();
        let mut survivors = Vec::new();
        let mut remaining = vec![0usize; chosen.len()];
        let mut tombstones_dropped = 0u64;
        for (segment_index, &segment_id) in chosen.iter().enumerate() {
            let entries =
                self.log.segment_entries(&epoch, segment_id).expect("segment being cleaned");
            for (reference, entry_type) in entries {
                let (_, content) = self.log.entry(&epoch, reference);
                let (timestamp, key_hash) = match entry_type {
                    EntryType::Object | EntryType::FlashObject => {
                        let object =
                            decode_object_unverified(&content).expect("corrupt object in the log");
                        (object.timestamp, key_hash(object.table, object.key).0)
                    }
                    EntryType::Tombstone => {
                        let tombstone = decode_tombstone(&content).expect("corrupt tombstone");
                        if !self.log.tombstone_target_alive(tombstone.segment_id, &[]) {
                            tombstones_dropped += 1;
                            continue;
                        }
                        (tombstone.timestamp, 0)
                    }
                    EntryType::Completion => {
                        let record = decode_completion_unverified(&content)
                            .expect("corrupt completion in the log");
                        if !self.completions.names(&record, reference) {
                            continue;
                        }
                        // Results live until their client's next requests acknowledge them:
                        // as young as anything in the log.
                        (now.seconds(), 0)
                    }
                    EntryType::Prepared => {
                        let prepared = decode_prepared_unverified(&content)
                            .expect("corrupt prepared entry in the log");
                        let id = (LeaseId(prepared.lease_id), RpcId(prepared.rpc_id));
                        if !self.prepared.names(id, reference) {
                            continue;
                        }
                        // Decided within a few round trips: young.
                        (now.seconds(), 0)
                    }
                    EntryType::TxParticipants => {
                        let record = decode_tx_participants_unverified(&content)
                            .expect("corrupt transaction participants in the log");
                        let id = (LeaseId(record.lease_id), RpcId(record.transaction));
                        if !self.prepared.names_transaction(id, reference) {
                            continue;
                        }
                        (now.seconds(), 0)
                    }
                    EntryType::PreparedTombstone => {
                        let named = segment_named_by(entry_type, &content)
                            .expect("corrupt prepared tombstone in the log");
                        if !self.log.tombstone_target_alive(named, &[]) {
                            tombstones_dropped += 1;
                            continue;
                        }
                        (now.seconds(), 0)
                    }
                    // Headers, digests and safe versions are superseded by the next head.
                    _ => continue,
                };
                remaining[segment_index] += 1;
                survivors.push(Survivor {
                    timestamp,
                    reference,
                    entry_type,
                    key_hash,
                    segment_index,
                });
            }
        }
        // Oldest first: segregates old (stable) data from young (volatile) data.
        survivors.sort_by_key(|survivor| survivor.timestamp);

        let mut side_log = SideLog::new(AppendPriority::Cleaner);
        let mut flash_failed = false;
        let mut unreadable_segments: Vec<SegmentId> = Vec::new();
        let mut object_bytes = 0u64;
        let mut tombstone_bytes = 0u64;
        let mut completion_bytes = 0u64;
        let mut out_of_memory = false;
        for (position, survivor) in survivors.iter().enumerate() {
            if let Some(ahead) = survivors.get(position + PREFETCH_DISTANCE_ENTRIES) {
                if matches!(ahead.entry_type, EntryType::Object | EntryType::FlashObject) {
                    self.index.prefetch(ahead.key_hash);
                }
            }
            let (_, content) = self.log.entry(&epoch, survivor.reference);
            let entry = AppendEntry::new(survivor.entry_type, &content);
            let relocated = match survivor.entry_type {
                EntryType::Object | EntryType::FlashObject => {
                    let mut bucket = self.index.lock(survivor.key_hash);
                    match bucket.find(|found| found == survivor.reference.0) {
                        // Overwritten or removed since: the old copy is dead, nothing to move.
                        None => Ok(0),
                        Some((slot, _))
                            if self.drop_if_expired(
                                &epoch,
                                &mut bucket,
                                (slot, survivor.reference),
                                &content,
                                now,
                            ) =>
                        {
                            Ok(0)
                        }
                        Some((slot, _)) => {
                            // Survivors are replicated, so they hold the whole object: a
                            // FLASH_OBJECT's is read back from its segment's image, under the
                            // bucket lock (nothing moves it meanwhile).
                            let object = if survivor.entry_type == EntryType::FlashObject {
                                match self.flash_object_content(survivor.reference, &content) {
                                    Ok(object) => Cow::Owned(object),
                                    Err(_) => {
                                        // The object is not counted as moved, so its segment
                                        // stays in the log (commit_pass keeps what is pinned
                                        // to it and pins the survivors to it); the pass goes
                                        // on with the other entries.
                                        flash_failed = true;
                                        unreadable_segments.push(chosen[survivor.segment_index]);
                                        continue;
                                    }
                                }
                            } else {
                                Cow::Borrowed(&content[..])
                            };
                            let whole = AppendEntry::new(EntryType::Object, &object);
                            side_log.append(&self.log, &whole).map(|(moved, _)| {
                                bucket.replace(slot, moved.0);
                                let table = decode_object_unverified(&object)
                                    .expect("an object the index points at")
                                    .table;
                                // An auto table's FLASH_OBJECT leaves the flash figures.
                                let key_shard = bucket.bucket_index();
                                self.free_index_entry(
                                    &epoch,
                                    (key_shard, survivor.reference),
                                    table,
                                );
                                object_bytes += whole.entry_bytes() as u64;
                                whole.entry_bytes()
                            })
                        }
                    }
                }
                EntryType::Completion | EntryType::Prepared | EntryType::TxParticipants => {
                    // Records an in-memory table names (a result until acknowledged, a
                    // prepared operation until decided, a transaction's list while any of its
                    // operations is prepared here): moved only while it still names them.
                    let reference = survivor.reference;
                    let copied = match survivor.entry_type {
                        EntryType::Completion => {
                            let record = decode_completion_unverified(&content)
                                .expect("corrupt completion in the log");
                            copy_while_named(&mut side_log, &self.log, &entry, |copy| {
                                self.completions.relocate(&record, reference, copy)
                            })
                        }
                        EntryType::Prepared => {
                            let prepared = decode_prepared_unverified(&content)
                                .expect("corrupt prepared entry in the log");
                            let id = (LeaseId(prepared.lease_id), RpcId(prepared.rpc_id));
                            copy_while_named(&mut side_log, &self.log, &entry, |copy| {
                                self.prepared.relocate(id, reference, copy)
                            })
                        }
                        _ => {
                            let record = decode_tx_participants_unverified(&content)
                                .expect("corrupt transaction participants in the log");
                            let id = (LeaseId(record.lease_id), RpcId(record.transaction));
                            copy_while_named(&mut side_log, &self.log, &entry, |copy| {
                                self.prepared.relocate_transaction(id, reference, copy)
                            })
                        }
                    };
                    match copied {
                        Ok(true) => {
                            self.log.free(&epoch, survivor.reference);
                            completion_bytes += entry.entry_bytes() as u64;
                            Ok(entry.entry_bytes())
                        }
                        // Acknowledged or decided since it was chosen: nothing to move.
                        Ok(false) => Ok(0),
                        Err(error) => Err(error),
                    }
                }
                _ => {
                    let named =
                        segment_named_by(survivor.entry_type, &content).expect("corrupt tombstone");
                    if self.log.tombstone_target_alive(named, &[]) {
                        side_log.append(&self.log, &entry).map(|_| {
                            tombstone_bytes += entry.entry_bytes() as u64;
                            entry.entry_bytes()
                        })
                    } else {
                        tombstones_dropped += 1;
                        Ok(0)
                    }
                }
            };
            match relocated {
                Ok(_) => remaining[survivor.segment_index] -= 1,
                Err(_) => {
                    // No memory for survivors (should not happen: the pass was planned within
                    // the free seglets). Keep what is not fully moved in the log.
                    out_of_memory = true;
                    break;
                }
            }
        }
        drop(epoch);
        if flash_failed {
            self.count(|statistics| statistics.flash_read_failures += 1);
            self.note_unreadable(&unreadable_segments);
        }
        PendingCombinedPass {
            chosen,
            chosen_seglets,
            survivor_segments: side_log.segments().to_vec(),
            survivors_durable: 0,
            remaining,
            out_of_memory,
            object_bytes,
            tombstone_bytes,
            completion_bytes,
            tombstones_dropped,
        }
    }

    /// Commits a relocated pass whose survivors are durable: they join the log, the cleaned
    /// segments leave it.
    fn commit_pass(&self, pass: PendingCombinedPass) -> CleanOutcome {
        let PendingCombinedPass {
            chosen,
            chosen_seglets,
            survivor_segments,
            survivors_durable: _,
            remaining,
            out_of_memory,
            object_bytes,
            tombstone_bytes,
            completion_bytes,
            tombstones_dropped,
        } = pass;
        let stays = segments_that_stay(&chosen, &remaining, &self.promotion_pins());
        let mut cleaned = Vec::new();
        let mut kept = Vec::new();
        let mut seglets_cleaned = 0u64;
        for (index, &segment_id) in chosen.iter().enumerate() {
            if stays[index] {
                kept.push(segment_id);
            } else {
                cleaned.push(segment_id);
                seglets_cleaned += chosen_seglets[index];
            }
        }
        debug_assert!(!out_of_memory || !kept.is_empty());
        self.log.commit_cleaning(&survivor_segments, &cleaned);
        // Objects of the kept segments may have moved into the survivors already: their old
        // copies stay in the kept segments (and their replicas), and a later remove writes a
        // tombstone naming the survivor. So the survivors are pinned to the kept segments
        // exactly as a promotion's head is to its source, before any pass can choose them.
        if !kept.is_empty() {
            self.pin_to_sources(&survivor_segments, &kept);
        }
        self.log.end_cleaning(&kept);
        // Their objects live in the survivors now (read back whole): the images can go.
        self.forget_images(&cleaned);
        // Fuse now: the new head's digest lists the survivors and omits the cleaned segments.
        if self.log.roll_head(AppendPriority::CleanerCommit).is_err() {
            self.cleaner.deferred_fusions.fetch_add(1, Ordering::Relaxed);
        }
        self.log.reclaim();
        // The cleaned segments left the log with the new head: their images can go.
        self.retire_images();
        self.count(|statistics| {
            statistics.combined_passes += 1;
            statistics.segments_cleaned += cleaned.len() as u64;
            statistics.survivor_segments_written += survivor_segments.len() as u64;
            statistics.object_bytes_relocated += object_bytes;
            statistics.tombstone_bytes_relocated += tombstone_bytes;
            statistics.completion_bytes_relocated += completion_bytes;
            statistics.tombstones_dropped += tombstones_dropped;
            statistics.seglets_cleaned += seglets_cleaned;
        });
        self.cleaner
            .segments_since_tombstone_scan
            .fetch_add(cleaned.len() as u64, Ordering::Relaxed);
        CleanOutcome::Combined {
            segments_cleaned: cleaned.len() as u64,
            survivor_segments: survivor_segments.len() as u64,
            bytes_relocated: object_bytes + tombstone_bytes + completion_bytes,
        }
    }

    /// Drops the object the index points at from `found`'s slot (its entry at `found`'s
    /// reference, whose `content` is given, in a segment being cleaned) if it is expired at
    /// `now`: out of the index, its bytes dead, counted. No tombstone is written: its expiry
    /// is absolute, so any older copy a backup holds of the segment, replayed by a recovery,
    /// is just as expired and never served; and versions stay above it through the safe
    /// version, as for any object. The caller holds the bucket lock and moves nothing when
    /// this returns true.
    fn drop_if_expired(
        &self,
        epoch: &stratus_log::EpochGuard<'_>,
        bucket: &mut stratus_index::BucketGuard<'_>,
        found: (stratus_index::Slot, Reference),
        content: &[u8],
        now: WallTime,
    ) -> bool {
        let object = decode_object_unverified(content).expect("corrupt object in the log");
        if !now.has_passed(object.expires_at) {
            return false;
        }
        let (slot, reference) = found;
        bucket.remove(slot);
        let key_shard = bucket.bucket_index();
        let bytes = self.free_index_entry(epoch, (key_shard, reference), object.table);
        self.log.table_tallies().object_removed(key_shard, object.table, bytes);
        self.objects_live.fetch_sub(1, Ordering::Relaxed);
        self.count(|statistics| {
            statistics.expired_objects_dropped += 1;
            statistics.expired_bytes_dropped += bytes;
        });
        true
    }

    /// Moves the live entries of `segment_id` (whose compaction has begun) into its compacted
    /// copy. With `image` (the offset and size of each of `entries` in the segment's image on
    /// flash), live objects of flash tables become FLASH_OBJECT entries naming their place in it.
    pub(crate) fn compact_entries(
        &self,
        epoch: &stratus_log::EpochGuard<'_>,
        segment_id: SegmentId,
        entries: &[(Reference, EntryType)],
        image: Option<&[(u32, u32)]>,
        demote_auto: bool,
        now: WallTime,
    ) -> CompactedEntries {
        let mut bytes_moved = 0u64;
        let mut demoted = 0u64;
        let mut tombstones_dropped = 0u64;
        // The objects' key hashes, in segment order, so their buckets can be prefetched ahead.
        let object_hashes: Vec<u64> = entries
            .iter()
            .filter(|(_, kind)| matches!(kind, EntryType::Object | EntryType::FlashObject))
            .map(|&(reference, _)| {
                let (_, content) = self.log.entry(epoch, reference);
                let object = decode_object_unverified(&content).expect("corrupt object");
                key_hash(object.table, object.key).0
            })
            .collect();
        // The segment header first (the segment keeps its identity), then tombstones (so
        // tombstone scans can stop early), then completion records, then objects.
        let passes = [
            EntryType::SegmentHeader,
            EntryType::Tombstone,
            EntryType::PreparedTombstone,
            EntryType::Completion,
            EntryType::Prepared,
            EntryType::TxParticipants,
            EntryType::FlashObject,
            EntryType::Object,
        ];
        // Each entry's place in `object_hashes` (objects and flash objects, in segment order).
        let mut hash_index_of = vec![usize::MAX; entries.len()];
        let object_positions = entries
            .iter()
            .enumerate()
            .filter(|(_, (_, kind))| matches!(kind, EntryType::Object | EntryType::FlashObject));
        for (index, (position, _)) in object_positions.enumerate() {
            hash_index_of[position] = index;
        }
        for pass in passes {
            for (position, &(reference, entry_type)) in
                entries.iter().enumerate().filter(|(_, (_, kind))| *kind == pass)
            {
                let (_, content) = self.log.entry(epoch, reference);
                let entry = AppendEntry::new(entry_type, &content);
                match entry_type {
                    EntryType::Object | EntryType::FlashObject => {
                        let object_index = hash_index_of[position];
                        if let Some(&ahead) =
                            object_hashes.get(object_index + PREFETCH_DISTANCE_ENTRIES)
                        {
                            self.index.prefetch(ahead);
                        }
                        let hash = object_hashes[object_index];
                        let mut bucket = self.index.lock(hash);
                        if let Some((slot, _)) = bucket.find(|found| found == reference.0) {
                            let found = (slot, reference);
                            if self.drop_if_expired(epoch, &mut bucket, found, &content, now) {
                                continue;
                            }
                            // An object of a flash table in a segment with an image: in memory
                            // only its FLASH_OBJECT, naming its entry in the image.
                            let stub = image.filter(|_| entry_type == EntryType::Object).and_then(
                                |offsets| {
                                    let object =
                                        decode_object_unverified(&content).expect("corrupt object");
                                    let auto = demote_auto && self.is_auto_table(object.table);
                                    let moves = (self.is_flash_table(object.table) || auto)
                                        && crate::flash::demotable(&object);
                                    if moves && auto {
                                        self.auto_object_demoted(
                                            bucket.bucket_index(),
                                            object.table,
                                            entry.entry_bytes() as u64,
                                        );
                                    }
                                    moves.then(|| {
                                        let (entry_offset, entry_bytes) = offsets[position];
                                        let locator = FlashLocator { entry_offset, entry_bytes };
                                        encode_flash_object(&content, locator)
                                            .expect("an object decodes")
                                    })
                                },
                            );
                            let moved = match &stub {
                                Some(stub) => {
                                    demoted += 1;
                                    let stub_entry = AppendEntry::new(EntryType::FlashObject, stub);
                                    bytes_moved += stub_entry.entry_bytes() as u64;
                                    self.log.append_to_compacted(segment_id, &stub_entry)
                                }
                                None => {
                                    bytes_moved += entry.entry_bytes() as u64;
                                    self.log.append_to_compacted(segment_id, &entry)
                                }
                            };
                            bucket.replace(slot, moved.0);
                            self.log.free(epoch, reference);
                        }
                    }
                    EntryType::Tombstone | EntryType::PreparedTombstone => {
                        let named =
                            segment_named_by(entry_type, &content).expect("corrupt tombstone");
                        if self.log.tombstone_target_alive(named, &[]) {
                            self.log.append_to_compacted(segment_id, &entry);
                            bytes_moved += entry.entry_bytes() as u64;
                        } else {
                            tombstones_dropped += 1;
                        }
                    }
                    EntryType::Completion => {
                        let record = decode_completion_unverified(&content)
                            .expect("corrupt completion in the log");
                        let relocation = self.completions.relocate(&record, reference, || {
                            Some(self.log.append_to_compacted(segment_id, &entry))
                        });
                        if relocation == Relocation::Moved {
                            self.log.free(epoch, reference);
                            bytes_moved += entry.entry_bytes() as u64;
                        }
                    }
                    EntryType::Prepared => {
                        let prepared = decode_prepared_unverified(&content)
                            .expect("corrupt prepared entry in the log");
                        let id = (LeaseId(prepared.lease_id), RpcId(prepared.rpc_id));
                        let relocation = self.prepared.relocate(id, reference, || {
                            Some(self.log.append_to_compacted(segment_id, &entry))
                        });
                        if relocation == Relocation::Moved {
                            self.log.free(epoch, reference);
                            bytes_moved += entry.entry_bytes() as u64;
                        }
                    }
                    EntryType::TxParticipants => {
                        let record = decode_tx_participants_unverified(&content)
                            .expect("corrupt transaction participants in the log");
                        let id = (LeaseId(record.lease_id), RpcId(record.transaction));
                        let relocation = self.prepared.relocate_transaction(id, reference, || {
                            Some(self.log.append_to_compacted(segment_id, &entry))
                        });
                        if relocation == Relocation::Moved {
                            self.log.free(epoch, reference);
                            bytes_moved += entry.entry_bytes() as u64;
                        }
                    }
                    _ => {
                        self.log.append_to_compacted(segment_id, &entry);
                    }
                }
            }
        }
        CompactedEntries { bytes_moved, tombstones_dropped, demoted }
    }

    /// One in-memory compaction: the segment whose compaction frees the most memory per live
    /// byte is rewritten in place (same id and creation time) in fewer seglets, tombstones
    /// first, then objects; the old seglets are reused after the epoch. No survivor segment,
    /// no new digest, no replication work.
    fn compact_one(&self, now: WallTime) -> CleanOutcome {
        let seglet_bytes = u64::from(self.log.config().seglet_bytes);
        let header_bytes = 2 + stratus_log::format::SEGMENT_HEADER_CONTENT_BYTES as u64;
        let best = self
            .log
            .cleaning_candidates(now.millis())
            .into_iter()
            .filter_map(|candidate| {
                let live = candidate.movable_bytes + header_bytes;
                let needed =
                    u64::from(compacted_seglets_needed(self.log.config(), candidate.movable_bytes));
                let seglets = u64::from(candidate.seglets);
                (needed < seglets).then(|| {
                    let score = (seglets - needed) as f64 * seglet_bytes as f64 / live as f64;
                    (candidate.segment_id, needed, score)
                })
            })
            .max_by(|a, b| a.2.total_cmp(&b.2).then(b.0.cmp(&a.0)));
        let Some((segment_id, needed, _)) = best else {
            self.cleaner.compaction_failed.store(true, Ordering::Relaxed);
            self.count(|statistics| statistics.compactions_failed += 1);
            return CleanOutcome::NothingToClean;
        };
        // The access time moves with the segment to its new seglets (auto tiering).
        let access = self.cleaner_candidate_access(segment_id, now);
        if !self.log.begin_compaction(segment_id, needed as u32) {
            return CleanOutcome::NothingToClean;
        }
        let epoch = self.log.pin();
        let entries =
            self.log.segment_entries(&epoch, segment_id).expect("segment being compacted");
        let CompactedEntries { bytes_moved, tombstones_dropped, .. } =
            self.compact_entries(&epoch, segment_id, &entries, None, false, now);
        drop(epoch);
        let seglets_freed = u64::from(self.log.finish_compaction(segment_id));
        if let Some(access) = access {
            self.carry_access(segment_id, access);
        }
        self.cleaner.segments_since_tombstone_scan.fetch_add(1, Ordering::Relaxed);
        if seglets_freed == 0 {
            // Forces the next unit to be combined cleaning (RAMCloud's compactionFailed()).
            self.cleaner.compaction_failed.store(true, Ordering::Relaxed);
        }
        self.count(|statistics| {
            statistics.compactions += 1;
            statistics.bytes_compacted += bytes_moved;
            statistics.seglets_freed_by_compaction += seglets_freed;
            statistics.tombstones_dropped += tombstones_dropped;
            if seglets_freed == 0 {
                statistics.compactions_failed += 1;
            }
        });
        CleanOutcome::Compacted { segment_id, seglets_freed }
    }
}

impl ObjectStore {
    /// The access time of `segment_id` when auto tables exist (None otherwise, or when it is
    /// no candidate).
    pub(crate) fn cleaner_candidate_access(
        &self,
        segment_id: SegmentId,
        now: WallTime,
    ) -> Option<crate::auto_tier::SegmentAccess> {
        if !self.is_auto_tiering() {
            return None;
        }
        let candidate = self
            .log
            .cleaning_candidates(now.millis())
            .into_iter()
            .find(|candidate| candidate.segment_id == segment_id)?;
        self.segment_access(segment_id, candidate.creation_seconds)
    }
}

/// Seglets the compacted copy of a segment with `movable_bytes` needs: its live bytes and
/// header at most [`COMPACTED_UTILIZATION_MAX_PERCENT`] utilized (RAMCloud's rule).
pub(crate) fn compacted_seglets_needed(config: &LogConfig, movable_bytes: u64) -> u32 {
    let seglet_bytes = u64::from(config.seglet_bytes);
    let header_bytes = 2 + stratus_log::format::SEGMENT_HEADER_CONTENT_BYTES as u64;
    let live = movable_bytes + header_bytes;
    let needed = live
        .div_ceil(seglet_bytes)
        .max(100 * (live + seglet_bytes) / seglet_bytes / COMPACTED_UTILIZATION_MAX_PERCENT);
    needed as u32
}

/// What moving a segment's entries into its compacted copy did.
pub(crate) struct CompactedEntries {
    /// Bytes appended to the copy.
    pub(crate) bytes_moved: u64,
    /// Tombstones no longer needed, left out.
    pub(crate) tombstones_dropped: u64,
    /// Objects of flash tables now in memory as FLASH_OBJECT entries only.
    pub(crate) demoted: u64,
}

/// Copies `entry` into `side_log` for a table's `relocate`, which calls the copy only while it
/// names the entry (and then names the copy): whether it was moved, or the append's error.
fn copy_while_named(
    side_log: &mut SideLog,
    log: &stratus_log::Log,
    entry: &AppendEntry<'_>,
    relocate: impl FnOnce(&mut dyn FnMut() -> Option<Reference>) -> Relocation,
) -> Result<bool, stratus_log::AppendError> {
    let mut refused = None;
    let relocation = relocate(&mut || match side_log.append(log, entry) {
        Ok((moved, _)) => Some(moved),
        Err(error) => {
            refused = Some(error);
            None
        }
    });
    match (relocation, refused) {
        (Relocation::Moved, _) => Ok(true),
        (Relocation::Failed, Some(error)) => Err(error),
        _ => Ok(false),
    }
}

/// Which of a pass's `chosen` segments stay in the log when it commits: those not wholly
/// moved (`remaining` entries left: a flash read failed, or memory ran out), and every segment
/// pinned to one that stays, directly or through others (auto_tier.rs, invariant 3: a head
/// never leaves before its sources), however far along its own relocation got.
pub(crate) fn segments_that_stay(
    chosen: &[SegmentId],
    remaining: &[usize],
    pins: &BTreeMap<SegmentId, BTreeSet<SegmentId>>,
) -> Vec<bool> {
    let mut stays: Vec<bool> = remaining.iter().map(|&left| left > 0).collect();
    loop {
        let kept: BTreeSet<SegmentId> =
            chosen.iter().zip(&stays).filter(|(_, &stays)| stays).map(|(id, _)| *id).collect();
        let mut changed = false;
        for (index, segment_id) in chosen.iter().enumerate() {
            let pinned_to_kept = pins
                .get(segment_id)
                .is_some_and(|sources| sources.iter().any(|source| kept.contains(source)));
            if !stays[index] && pinned_to_kept {
                stays[index] = true;
                changed = true;
            }
        }
        if !changed {
            return stays;
        }
    }
}

/// The segments a combined pass takes, chosen one by one, and what they add up to.
#[derive(Debug, Default)]
struct PassPlan {
    chosen: Vec<SegmentId>,
    chosen_seglets: Vec<u64>,
    movable_total: u64,
    freed_seglets: u64,
    largest_entry_bytes: u64,
    tombstones_killed_bytes: u64,
}

impl PassPlan {
    /// Whether `segment_id` may join: it is pinned to no source, or every source it is pinned
    /// to is in the plan already (they leave the log together; auto_tier.rs, invariant 3).
    fn has_sources_of(
        &self,
        segment_id: SegmentId,
        pins: &BTreeMap<SegmentId, BTreeSet<SegmentId>>,
    ) -> bool {
        pins.get(&segment_id)
            .is_none_or(|sources| sources.iter().all(|source| self.chosen.contains(source)))
    }

    /// Adds `candidate` if its survivors still fit in `budget_seglets`; false if not.
    fn try_add(
        &mut self,
        candidate: &CleaningCandidate,
        log_config: &LogConfig,
        budget_seglets: u64,
    ) -> bool {
        let movable = self.movable_total + candidate.survivor_bytes;
        let largest = self.largest_entry_bytes.max(candidate.largest_entry_bytes);
        if survivor_seglets_max(log_config, movable, largest).1 > budget_seglets {
            return false;
        }
        self.chosen.push(candidate.segment_id);
        self.chosen_seglets.push(u64::from(candidate.seglets));
        self.movable_total = movable;
        self.largest_entry_bytes = largest;
        self.freed_seglets += u64::from(candidate.seglets);
        self.tombstones_killed_bytes += candidate.tombstone_bytes_naming;
        true
    }
}

/// An upper bound on the survivor segments, and on the seglets they take, when `movable`
/// bytes whose largest entry is `largest_entry_bytes` are relocated (a pass that ran out of
/// memory midway would free nothing, so the plan must never be short). A survivor is closed
/// only when the next entry does not fit, so each but the last holds at least a segment less
/// its header and the largest entry; survivors take seglets as they grow, so each wastes less
/// than one seglet at its end.
fn survivor_seglets_max(config: &LogConfig, movable: u64, largest_entry_bytes: u64) -> (u64, u64) {
    let seglet_bytes = u64::from(config.seglet_bytes);
    let header_bytes = (ENTRY_HEADER_BYTES_MAX + SEGMENT_HEADER_CONTENT_BYTES) as u64;
    let usable =
        u64::from(config.segment_bytes).saturating_sub(header_bytes + largest_entry_bytes).max(1);
    let survivors = movable.div_ceil(usable);
    let seglets = (movable + survivors * header_bytes).div_ceil(seglet_bytes) + survivors;
    (survivors, seglets)
}
