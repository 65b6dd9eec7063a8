//! The object store of a Stratus master: the log ([`stratus_log`]) and the hash table
//! ([`stratus_index`]) combined into objects with RAMCloud's semantics.
//!
//! Every operation on a key holds that key's bucket lock across lookup → reject-rule check →
//! append → index update, so concurrent operations on one key serialize. Versions: a new object
//! takes the master-wide safe version (post-increment), an overwrite takes current + 1, and a
//! remove raises the safe version to removed + 1, so a key's versions strictly increase even
//! across delete and re-create. Every overwrite appends the new object and a tombstone for the
//! old version atomically (one append, one segment); a remove appends a tombstone.
//!
//! Memory-full rule: ordinary writes (and increments) fail with [`ObjectError::LogFull`] (the
//! master answers RETRY) once only the log's reserves are free: the tombstone reserve (two
//! segments' worth of seglets), which removes may use, so deletes keep working when memory is
//! full, and the cleaner reserve, which only the cleaner may use, so it can always run.
//!
//! Expiry: an object may carry an absolute expiry time ([`ExpiresAt`]). Every operation takes
//! the master's clock as an argument ([`WallTime`]; the engine reads no clock) and treats an
//! object expired at that time as missing — for reads, reject rules, increments and
//! enumeration — while still overwriting or removing its bytes as usual (so versions keep
//! increasing). The cleaner drops expired objects it meets, without a tombstone.
//!
//! Exactly-once (RIFL, docs/design/exactly-once.md): a mutation may carry its client's
//! [`RpcIdentity`] ([`ObjectStore::mutate`]). One that takes effect appends a COMPLETION entry
//! with its result in the same append as its object or tombstone, and the completion table
//! (`completions.rs`) keeps the result until the client acknowledges it; the same RPC arriving
//! again is answered from there, under the same bucket lock, without applying anything.
//!
//! Memory is reclaimed by the cleaner ([`ObjectStore::clean_once`], see `cleaner.rs` and
//! docs/design/cleaner.md), which a server thread drives concurrently with requests. Every
//! operation pins an epoch for as long as it holds bytes of the log, so the cleaner never
//! reuses memory a request can still read.

mod auto_figures;
mod auto_tier;
mod cleaner;
mod completions;
mod config;
mod enumerate;
mod flash;
mod prepared;
mod replay;
mod transactions;

pub use auto_figures::AutoTableCounts;
pub use auto_tier::{AutoStatistics, AutoTableStatistics};
pub use cleaner::{
    CleanOutcome, CleanStep, CleanerConfig, CleanerStatistics, CostBenefit, DurabilityError,
    PendingCombinedPass, SegmentDurability, CLEANABLE_UTILIZATION_MAX_PERCENT,
    CLEAN_FREE_PERCENT_MAX, COMPACTED_UTILIZATION_MAX_PERCENT, FLASH_CLEAN_FORCE_PERCENT,
    MEMORY_TARGET_PERCENT_DEFAULT, PASS_LIVE_SEGMENTS_MAX, SEGMENT_COUNT_FORCE_PERCENT,
    TOMBSTONE_RATIO_PERCENT_DEFAULT, TOMBSTONE_SCAN_EVERY_SEGMENTS,
};
pub use completions::{CompletionResult, CompletionStatistics};
pub use config::{
    ConfigError, PromotionAdmission, StoreConfig, AUTO_DRAM_SHARE_OF_LOG_DIVISOR,
    PROMOTION_BYTES_PER_SECOND_MAX_DEFAULT,
};
pub use enumerate::{EnumerationCursor, ENUMERATE_BUCKETS_PER_CALL_MAX};
pub use flash::{
    Demoted, FlashImageError, FlashImages, FlashStatistics, FlashTotals, MemoryImages,
};
pub use prepared::{PreparedStatistics, TransactionToFinish};
pub use replay::{
    ReplayCollector, ReplayError, ReplayInto, ReplayRoom, ReplayStatistics, RoomShortage,
};
pub use stratus_types::{ExpiresAt, Expiry};
pub use transactions::{TxDecided, TxPrepareOp, TxVoted};

use std::sync::atomic::{AtomicU64, Ordering};

use stratus_index::{BucketGuard, HashTable, Slot};
use stratus_log::format::{
    decode_object_unverified, CompletionRecord, ObjectPrefix, TombstonePrefix,
};
use stratus_log::{
    AppendEntry, AppendError, AppendPriority, EntryType, EpochGuard, Log, Reference,
    SegmentStatistics, TombstoneView,
};
use stratus_types::limits::KEY_BYTES_MAX;
use stratus_types::{HashRange, KeyHash, RejectReason, RejectRules, RpcIdentity};
use stratus_types::{SegmentId, ServerId, TableId, Tier, Version};

/// A reading of the master's wall clock, taken by the caller of every operation that needs
/// the time (the engine reads no clock): object timestamps (the cleaner's ages) use its
/// seconds, expiry its milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WallTime {
    millis: u64,
}

impl WallTime {
    /// The time `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> WallTime {
        WallTime { millis }
    }

    /// The time `seconds` seconds after the Unix epoch.
    pub const fn from_seconds(seconds: u32) -> WallTime {
        WallTime { millis: seconds as u64 * 1_000 }
    }

    /// Milliseconds since the Unix epoch.
    pub const fn millis(self) -> u64 {
        self.millis
    }

    /// Whole seconds since the Unix epoch (saturating in 2106).
    pub fn seconds(self) -> u32 {
        u32::try_from(self.millis / 1_000).unwrap_or(u32::MAX)
    }

    /// Whether an object that expires at `expires_at` (if ever) is expired now.
    pub fn has_passed(self, expires_at: Option<ExpiresAt>) -> bool {
        expires_at.is_some_and(|expires_at| expires_at.has_passed(self.millis))
    }
}

/// What a read found: the live object's version, the segment that holds it, and when it
/// expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoundObject {
    /// Its version.
    pub version: Version,
    /// The segment holding it (a replicated master answers only once it is durable).
    pub segment_id: SegmentId,
    /// When it expires, if it does.
    pub expires_at: Option<ExpiresAt>,
}

/// Where read values are copied to (the master implements it for its response buffer).
pub trait ByteSink {
    /// Appends `bytes`.
    fn put_slice(&mut self, bytes: &[u8]);
}

impl ByteSink for Vec<u8> {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Why an object operation failed. Nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectError {
    /// A reject rule matched (or a read found no object); `current` is the object's version, 0
    /// when missing.
    Rejected {
        /// Which rule.
        reason: RejectReason,
        /// The current version.
        current: Version,
    },
    /// No memory for the append; retry later.
    LogFull,
    /// Increment of a value that is not 8 bytes.
    NotAnInteger {
        /// The current version.
        current: Version,
    },
    /// Increment would overflow an i64.
    IncrementOverflow {
        /// The current version.
        current: Version,
    },
    /// The key is empty or longer than 65535 bytes.
    InvalidKey,
    /// The value is longer than the configured maximum.
    ValueTooLarge,
    /// The client acknowledged this RPC already: the request is an old duplicate, and nothing
    /// was applied (RIFL's STALE_RPC).
    StaleRpc,
    /// The client's lease holds as many unacknowledged results as it may: retry once it has
    /// acknowledged some.
    TooManyUnacknowledged,
    /// The RPC identity cannot be right (lease 0, rpc 0, or an rpc that acknowledges itself).
    InvalidRpcIdentity,
    /// A transaction has the object locked between its prepare and its decision: retry (the
    /// decision is a round trip away, or the recovery's delay when its client died).
    Locked,
    /// A transaction's operation that its own participant list does not name (the list is
    /// what finishes the transaction if its client dies, so it must be whole).
    NotAParticipant,
    /// The object's value is on flash and could not be read (the device failed).
    FlashRead(FlashImageError),
    /// The object's value on flash does not verify (its checksum, or it is another object):
    /// the master's flash is corrupt; the durable copies on backups are not affected.
    FlashCorrupt,
}

/// A change to one object, as [`ObjectStore::mutate`] applies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation<'a> {
    /// Create or overwrite with `value`, expiring as `expiry` says.
    Write {
        /// The new value.
        value: &'a [u8],
        /// When the new object expires ([`Expiry::Keep`]: when the one it replaces would have).
        expiry: Expiry,
    },
    /// Remove (a missing object is no error unless the rules say so).
    Remove,
    /// Add `delta` to an 8-byte little-endian i64 (a missing object counts as 0).
    Increment {
        /// The amount.
        delta: i64,
    },
    /// Change when a live object expires, keeping its value.
    SetExpiry {
        /// The new expiry.
        expiry: Expiry,
    },
}

/// What a mutation answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mutated {
    /// The new version; for a remove, the removed version (0 when there was none).
    pub version: Version,
    /// An increment's new value.
    pub integer: Option<i64>,
    /// True when this was a retry of an RPC already applied, answered from its record.
    pub repeated: bool,
}

/// Totals for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStatistics {
    /// Bytes of the log region.
    pub log_bytes_total: u64,
    /// Bytes of log entries not yet dead.
    pub log_bytes_live: u64,
    /// Bytes of seglets allocated to segments.
    pub log_bytes_allocated: u64,
    /// Seglets in the region.
    pub seglets_total: u64,
    /// Seglets not allocated.
    pub seglets_free: u64,
    /// Segments in the log.
    pub segments_in_log: u64,
    /// Objects reachable through the hash table.
    pub objects_live: u64,
    /// The next version a new object would receive.
    pub safe_version: u64,
    /// Main hash-table buckets.
    pub hash_table_buckets: u64,
    /// Bytes of the hash table's buckets in use: the main buckets of its current size and the
    /// overflow buckets allocated.
    pub hash_table_bytes: u64,
    /// Bytes of live objects (entry headers included).
    pub log_bytes_live_objects: u64,
    /// Bytes of tombstones still in the log (their death is learnt by cleaning).
    pub log_bytes_tombstones: u64,
    /// Seglets of cleaned segments waiting for readers before reuse.
    pub seglets_waiting_for_readers: u64,
    /// Cleaner survivor segments not yet fused into the log.
    pub segments_side: u64,
    /// Bytes of the log region whose pages are resident, at most (allocated, waiting for
    /// readers, and free seglets not given back).
    pub log_bytes_resident: u64,
    /// What the memory target asks the resident log to stay near; 0 without a target.
    pub log_bytes_target: u64,
    /// The cleaner's work.
    pub cleaner: CleanerStatistics,
}

impl StoreStatistics {
    /// Live entry bytes over allocated seglet bytes (the paper's memory utilization); 0 when
    /// nothing is allocated.
    pub fn memory_utilization(&self) -> f64 {
        if self.log_bytes_allocated == 0 {
            return 0.0;
        }
        self.log_bytes_live as f64 / self.log_bytes_allocated as f64
    }

    /// Live object bytes over the whole log region.
    pub fn live_object_fraction(&self) -> f64 {
        if self.log_bytes_total == 0 {
            return 0.0;
        }
        self.log_bytes_live_objects as f64 / self.log_bytes_total as f64
    }
}

/// The object store. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct ObjectStore {
    config: StoreConfig,
    log: Log,
    index: HashTable,
    objects_live: AtomicU64,
    cleaner: cleaner::CleanerState,
    completions: completions::CompletionTable,
    prepared: prepared::PreparedTable,
    /// The tier of every table whose objects do not live in memory (absent: memory).
    table_tiers: std::sync::RwLock<std::collections::HashMap<TableId, Tier>>,
    /// Segment images on flash, when the server gave the store a flash tier.
    flash: flash::FlashTier,
    /// Access times and figures of auto tables.
    auto: auto_tier::AutoTier,
}

/// The current object of a key, found under its bucket lock: live, or expired and not yet
/// dropped by the cleaner.
struct Current {
    slot: Slot,
    reference: Reference,
    version: Version,
    expires_at: Option<ExpiresAt>,
}

/// The object a key holds as callers see it at `now`: `None` if there is none or it expired.
fn live(current: Option<&Current>, now: WallTime) -> Option<&Current> {
    current.filter(|current| !now.has_passed(current.expires_at))
}

/// The version reject rules see at `now`: the live object's, 0 when missing or expired.
fn live_version(current: Option<&Current>, now: WallTime) -> Version {
    live(current, now).map_or(Version::NONEXISTENT, |current| current.version)
}

impl ObjectStore {
    /// An empty store whose log belongs to `log_id`.
    pub fn new(config: StoreConfig, log_id: ServerId) -> Result<ObjectStore, ConfigError> {
        config.validate()?;
        let memory = config.log_config().allocate_memory();
        ObjectStore::with_memory(config, log_id, memory)
    }

    /// [`ObjectStore::new`] with its log in `memory`, allocated before by
    /// `config.log_config().allocate_memory()` (a server prefaults it before it enlists and
    /// learns its id).
    pub fn with_memory(
        config: StoreConfig,
        log_id: ServerId,
        memory: stratus_log::seglet_memory::SegletMemory,
    ) -> Result<ObjectStore, ConfigError> {
        config.validate()?;
        Ok(ObjectStore {
            log: Log::with_memory(config.log_config(), log_id, memory),
            // With a memory target the table starts small and follows the object count;
            // otherwise it has its configured size from the start.
            index: if config.cleaner.memory_target_percent.is_some() {
                HashTable::growable(config.hash_table_bytes)
            } else {
                HashTable::new(config.hash_table_bytes)
            },
            config,
            objects_live: AtomicU64::new(0),
            cleaner: cleaner::CleanerState::default(),
            completions: completions::CompletionTable::default(),
            prepared: prepared::PreparedTable::default(),
            table_tiers: Default::default(),
            flash: Default::default(),
            auto: auto_tier::AutoTier::new(config.log_config().seglet_count()),
        })
    }

    /// Records the tier of `table`, as its master learns it with a tablet (idempotent; a
    /// table's tier never changes after creation, so a later call with another tier is a bug
    /// of the caller and stops the server rather than mixing tiers).
    pub fn set_table_tier(&self, table: TableId, tier: Tier) {
        let mut tiers = self.table_tiers.write().expect("table tiers poisoned");
        let previous = if tier == Tier::Memory {
            tiers.get(&table).copied()
        } else {
            tiers.insert(table, tier)
        };
        assert!(
            previous.is_none_or(|previous| previous == tier),
            "table {table:?} changed tier from {previous:?} to {tier:?}"
        );
        drop(tiers);
        if tier == Tier::Flash && previous.is_none() {
            self.flash_table_added();
        }
        if tier == Tier::Auto && previous.is_none() {
            self.auto_table_added();
        }
    }

    /// The tier of `table` (memory unless `set_table_tier` said otherwise).
    pub fn table_tier(&self, table: TableId) -> Tier {
        let tiers = self.table_tiers.read().expect("table tiers poisoned");
        tiers.get(&table).copied().unwrap_or_default()
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// The log (for replication, recovery and tests: segment contents and certificates).
    pub fn log(&self) -> &Log {
        &self.log
    }

    fn check_key(key: &[u8]) -> Result<(), ObjectError> {
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(ObjectError::InvalidKey);
        }
        Ok(())
    }

    /// Finds the object of (`table`, `key`) in the locked bucket.
    fn lookup(
        &self,
        epoch: &EpochGuard<'_>,
        guard: &BucketGuard<'_>,
        table: TableId,
        key: &[u8],
    ) -> Option<Current> {
        let mut version = Version::NONEXISTENT;
        let mut expires_at = None;
        let (slot, reference) = guard.find(|reference| {
            let (entry_type, content) = self.log.entry(epoch, Reference(reference));
            assert!(
                matches!(entry_type, EntryType::Object | EntryType::FlashObject),
                "hash table points at a non-object"
            );
            let object = decode_object_unverified(&content).expect("corrupt object in the log");
            let found = object.table == table && object.key == key;
            if found {
                version = object.version;
                expires_at = object.expires_at;
            }
            found
        })?;
        Some(Current { slot, reference: Reference(reference), version, expires_at })
    }

    /// Reads an object at `now`: appends its value to `value_out` and returns its version. A
    /// missing or expired object is always `Rejected { ObjectDoesntExist, 0 }`; otherwise
    /// `rules` are checked against its version.
    pub fn read(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        rules: &RejectRules,
        now: WallTime,
        value_out: &mut dyn ByteSink,
    ) -> Result<Version, ObjectError> {
        self.read_located(table, key, hash, rules, now, value_out).map(|found| found.version)
    }

    /// [`ObjectStore::read`], also saying which segment holds the object — a replicated master
    /// must not answer with an object that is not durable yet (if it crashed, the object would
    /// vanish after a client had seen it) — and when it expires.
    pub fn read_located(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        rules: &RejectRules,
        now: WallTime,
        value_out: &mut dyn ByteSink,
    ) -> Result<FoundObject, ObjectError> {
        Self::check_key(key)?;
        let epoch = self.log.pin();
        let mut guard = self.index.lock(hash.0);
        if self.prepared.holder(table, key).is_some() {
            return Err(ObjectError::Locked);
        }
        let current = self.lookup(&epoch, &guard, table, key);
        let Some(current) = live(current.as_ref(), now) else {
            return Err(ObjectError::Rejected {
                reason: RejectReason::ObjectDoesntExist,
                current: Version::NONEXISTENT,
            });
        };
        check_rules(rules, current.version)?;
        let (entry_type, content) = self.log.entry(&epoch, current.reference);
        if self.is_auto_table(table) {
            if entry_type == EntryType::FlashObject {
                // May promote: the answer names the segment the object was found in, whose
                // replicas hold it (the promoted copy's durability is not waited for).
                let segment_id = self.log.segment_of(current.reference);
                let found = (&epoch, &mut guard);
                self.read_from_flash(found, table, current, &content, now, value_out)?;
                let expires_at = current.expires_at;
                return Ok(FoundObject { version: current.version, segment_id, expires_at });
            }
            self.note_dram_read((guard.bucket_index(), table), current.reference, now);
        }
        value_out.put_slice(&self.object_value(current.reference, entry_type, &content)?);
        Ok(FoundObject {
            version: current.version,
            segment_id: self.log.segment_of(current.reference),
            expires_at: current.expires_at,
        })
    }

    /// Writes an object (create or overwrite) at `now` and returns its new version. `expiry`
    /// decides when the new object expires ([`Expiry::Keep`]: when the object it replaces
    /// would have).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        value: &[u8],
        rules: &RejectRules,
        expiry: Expiry,
        now: WallTime,
    ) -> Result<Version, ObjectError> {
        let mutation = Mutation::Write { value, expiry };
        self.mutate((table, key, hash), rules, mutation, None, now).map(|done| done.version)
    }

    /// Sets when a live object expires, keeping its value: a new version of it, with the
    /// expiry `expiry` gives (`Never` removes its expiry). A missing or expired object is
    /// `Rejected { ObjectDoesntExist, 0 }`; `rules` are checked against its version.
    pub fn set_expiry(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        expiry: Expiry,
        rules: &RejectRules,
        now: WallTime,
    ) -> Result<Version, ObjectError> {
        let mutation = Mutation::SetExpiry { expiry };
        self.mutate((table, key, hash), rules, mutation, None, now).map(|done| done.version)
    }

    /// Removes an object at `now`; returns the removed version, or 0 if there was none (or it
    /// had expired, which removes its bytes all the same) and the rules allowed that.
    pub fn remove(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        rules: &RejectRules,
        now: WallTime,
    ) -> Result<Version, ObjectError> {
        self.mutate((table, key, hash), rules, Mutation::Remove, None, now).map(|done| done.version)
    }

    /// Adds `delta` to an 8-byte little-endian i64 value at `now` (a missing or expired object
    /// counts as 0 and is created). The object keeps its expiry, as Redis's INCR keeps a
    /// key's. Returns the new version and value.
    pub fn increment(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
        delta: i64,
        rules: &RejectRules,
        now: WallTime,
    ) -> Result<(Version, i64), ObjectError> {
        let mutation = Mutation::Increment { delta };
        let done = self.mutate((table, key, hash), rules, mutation, None, now)?;
        Ok((done.version, done.integer.expect("an increment answers its value")))
    }

    /// Applies `mutation` to the object of (`table`, `key`, its `hash`) at `now`, if `rules`
    /// allow it. With `rpc`, exactly once: the RPC's result is recorded with its effect (one
    /// append), and the same RPC arriving again is answered with it (`repeated`) without
    /// applying anything; an RPC the client acknowledged already is refused
    /// ([`ObjectError::StaleRpc`]). A mutation refused, or one that changes nothing (the
    /// remove of a missing object), records nothing: applying it again is as correct as the
    /// first time, since nothing of the first was visible.
    pub fn mutate(
        &self,
        object: (TableId, &[u8], KeyHash),
        rules: &RejectRules,
        mutation: Mutation<'_>,
        rpc: Option<RpcIdentity>,
        now: WallTime,
    ) -> Result<Mutated, ObjectError> {
        let result = self.mutate_locked(object, rules, mutation, rpc, now);
        // With the bucket lock released: a resize takes stripe locks.
        self.help_resize_index_if_behind();
        result
    }

    /// [`ObjectStore::mutate`] under the key's bucket lock.
    fn mutate_locked(
        &self,
        (table, key, hash): (TableId, &[u8], KeyHash),
        rules: &RejectRules,
        mutation: Mutation<'_>,
        rpc: Option<RpcIdentity>,
        now: WallTime,
    ) -> Result<Mutated, ObjectError> {
        Self::check_key(key)?;
        if let Mutation::Write { value, .. } = mutation {
            if value.len() > self.config.value_bytes_max as usize {
                return Err(ObjectError::ValueTooLarge);
            }
        }
        if rpc.is_some_and(|rpc| rpc.validate().is_err()) {
            return Err(ObjectError::InvalidRpcIdentity);
        }
        self.log.observe_time(now.seconds());
        let epoch = self.log.pin();
        let mut guard = self.index.lock(hash.0);
        let mut free = |reference| self.log.free(&epoch, reference);
        if let Some(rpc) = &rpc {
            match self.completions.check(rpc, (table, hash.0), &mut free) {
                Ok(completions::Check::New) => {}
                Ok(completions::Check::Completed(result)) => {
                    let CompletionResult { version, integer } = result;
                    return Ok(Mutated { version, integer, repeated: true });
                }
                Err(completions::CheckError::Stale) => return Err(ObjectError::StaleRpc),
                Err(completions::CheckError::TooManyUnacknowledged) => {
                    return Err(ObjectError::TooManyUnacknowledged)
                }
                Err(completions::CheckError::OtherObject) => {
                    return Err(ObjectError::InvalidRpcIdentity)
                }
            }
        }
        if self.prepared.holder(table, key).is_some() {
            return Err(ObjectError::Locked);
        }
        let current = self.lookup(&epoch, &guard, table, key);
        let draft = rpc.map(|rpc| CompletionDraft { rpc, key_hash: hash.0 });
        let (result, completion) = match mutation {
            Mutation::Write { value, expiry } => {
                check_rules(rules, live_version(current.as_ref(), now))?;
                let kept = live(current.as_ref(), now).and_then(|current| current.expires_at);
                let expires_at = expiry.resolve(now.millis(), kept);
                let new = NewObject { table, key, value, expires_at, timestamp: now.seconds() };
                let stored = self.store_object(&epoch, &mut guard, current, new, draft, None)?;
                (CompletionResult { version: stored.0, integer: None }, stored.1)
            }
            Mutation::SetExpiry { expiry } => {
                let Some(live_object) = live(current.as_ref(), now) else {
                    return Err(ObjectError::Rejected {
                        reason: RejectReason::ObjectDoesntExist,
                        current: Version::NONEXISTENT,
                    });
                };
                check_rules(rules, live_object.version)?;
                let expires_at = expiry.resolve(now.millis(), live_object.expires_at);
                let (entry_type, content) = self.log.entry(&epoch, live_object.reference);
                let value = &*self.object_value(live_object.reference, entry_type, &content)?;
                let new = NewObject { table, key, value, expires_at, timestamp: now.seconds() };
                let stored = self.store_object(&epoch, &mut guard, current, new, draft, None)?;
                (CompletionResult { version: stored.0, integer: None }, stored.1)
            }
            Mutation::Remove => {
                let removed_version = live_version(current.as_ref(), now);
                check_rules(rules, removed_version)?;
                let result = CompletionResult { version: removed_version, integer: None };
                let completion = match current {
                    Some(current) => {
                        let draft = draft.map(|draft| (draft, result));
                        let (table_key, decided) = ((table, key), None);
                        self.remove_current(
                            &epoch, &mut guard, current, table_key, now, draft, decided,
                        )?
                    }
                    None => None,
                };
                (result, completion)
            }
            Mutation::Increment { delta } => {
                let current_version = live_version(current.as_ref(), now);
                check_rules(rules, current_version)?;
                let live_object = live(current.as_ref(), now);
                let expires_at = live_object.and_then(|current| current.expires_at);
                let old_value = match live_object {
                    None => 0,
                    Some(current) => {
                        let (entry_type, content) = self.log.entry(&epoch, current.reference);
                        let value = self.object_value(current.reference, entry_type, &content)?;
                        let bytes: [u8; 8] = value
                            .as_ref()
                            .try_into()
                            .map_err(|_| ObjectError::NotAnInteger { current: current_version })?;
                        i64::from_le_bytes(bytes)
                    }
                };
                let new_value = old_value
                    .checked_add(delta)
                    .ok_or(ObjectError::IncrementOverflow { current: current_version })?;
                let value = new_value.to_le_bytes();
                let new =
                    NewObject { table, key, value: &value, expires_at, timestamp: now.seconds() };
                let integer = Some(new_value);
                let stored = self.store_object(&epoch, &mut guard, current, new, draft, integer)?;
                (CompletionResult { version: stored.0, integer }, stored.1)
            }
        };
        if let (Some(rpc), Some(entry)) = (rpc, completion) {
            // Under the bucket lock still: the same RPC arriving now waits for it, then finds
            // the record.
            self.completions.record(&rpc, (table, hash.0), result, entry, &mut free);
        }
        let CompletionResult { version, integer } = result;
        Ok(Mutated { version, integer, repeated: false })
    }

    /// Appends a new version of an object (plus the old version's tombstone, plus the
    /// COMPLETION entry recording it for `completion`'s RPC) and points the index at it.
    /// `current` is what the key holds, expired or not: its bytes die either way, and the new
    /// version is above it. The caller holds the bucket lock and has checked the rules.
    /// Returns the new version and the completion entry's reference and bytes.
    fn store_object(
        &self,
        epoch: &EpochGuard<'_>,
        guard: &mut BucketGuard<'_>,
        current: Option<Current>,
        new: NewObject<'_>,
        completion: Option<CompletionDraft>,
        integer: Option<i64>,
    ) -> Result<(Version, Option<(Reference, u64)>), ObjectError> {
        let version = match &current {
            Some(current) => Version(current.version.0 + 1),
            None => self.log.allocate_version(),
        };
        self.store_version(epoch, guard, current, new, version, (completion, integer), None)
    }

    /// [`ObjectStore::store_object`] at a given `version` (replay keeps the versions objects
    /// had in the replayed log). `decided` is the content of a PREPARED_TOMBSTONE appended with
    /// the object (a transaction's write applied at its commit).
    #[allow(clippy::too_many_arguments)]
    fn store_version(
        &self,
        epoch: &EpochGuard<'_>,
        guard: &mut BucketGuard<'_>,
        current: Option<Current>,
        new: NewObject<'_>,
        version: Version,
        (completion, integer): (Option<CompletionDraft>, Option<i64>),
        decided: Option<&[u8]>,
    ) -> Result<(Version, Option<(Reference, u64)>), ObjectError> {
        let NewObject { table, key, value, expires_at, timestamp } = new;
        let prefix = ObjectPrefix::new(table, version, timestamp, expires_at, key, value);
        let object =
            AppendEntry { entry_type: EntryType::Object, pieces: [prefix.as_bytes(), key, value] };
        let tombstone = current.as_ref().map(|current| {
            TombstonePrefix::new(&TombstoneView {
                table,
                segment_id: self.log.segment_of(current.reference),
                object_version: current.version,
                timestamp,
                key,
            })
        });
        let completion_content = completion
            .map(|draft| draft.record(table, CompletionResult { version, integer }).encode());
        let mut entries = Vec::with_capacity(4);
        entries.push(object);
        if let Some(tombstone) = &tombstone {
            entries.push(tombstone_entry(tombstone, key));
        }
        if let Some(content) = decided {
            entries.push(AppendEntry::new(EntryType::PreparedTombstone, content));
        }
        if let Some(content) = &completion_content {
            entries.push(AppendEntry::new(EntryType::Completion, content.as_bytes()));
        }
        let appended = self.log.append(&entries, AppendPriority::Normal).map_err(append_error)?;
        let reference = appended.references[0];
        let completion_entry = completion_content.map(|_| {
            let last = entries.len() - 1;
            (appended.references[last], entries[last].entry_bytes() as u64)
        });
        let new_bytes = object.entry_bytes() as u64;
        match current {
            Some(current) => {
                guard.replace(current.slot, reference.0);
                let old_bytes =
                    self.free_index_entry(epoch, (guard.bucket_index(), current.reference), table);
                self.log.table_tallies().object_replaced(
                    guard.bucket_index(),
                    table,
                    old_bytes,
                    new_bytes,
                );
            }
            None => {
                guard.insert(reference.0);
                self.objects_live.fetch_add(1, Ordering::Relaxed);
                self.log.table_tallies().object_added(guard.bucket_index(), table, new_bytes);
            }
        }
        Ok((version, completion_entry))
    }

    /// Removes `current`, what the key holds (live or expired): a tombstone for its version
    /// (with the COMPLETION entry of `completion`, in the same append), the index entry gone,
    /// its bytes dead. The caller holds the bucket lock. Returns the completion entry's
    /// reference and bytes. `decided`: as for [`ObjectStore::store_version`].
    #[allow(clippy::too_many_arguments)]
    fn remove_current(
        &self,
        epoch: &EpochGuard<'_>,
        guard: &mut BucketGuard<'_>,
        current: Current,
        (table, key): (TableId, &[u8]),
        now: WallTime,
        completion: Option<(CompletionDraft, CompletionResult)>,
        decided: Option<&[u8]>,
    ) -> Result<Option<(Reference, u64)>, ObjectError> {
        let tombstone = TombstonePrefix::new(&TombstoneView {
            table,
            segment_id: self.log.segment_of(current.reference),
            object_version: current.version,
            timestamp: now.seconds(),
            key,
        });
        let completion_content =
            completion.map(|(draft, result)| draft.record(table, result).encode());
        let mut entries = vec![tombstone_entry(&tombstone, key)];
        if let Some(content) = decided {
            entries.push(AppendEntry::new(EntryType::PreparedTombstone, content));
        }
        if let Some(content) = &completion_content {
            entries.push(AppendEntry::new(EntryType::Completion, content.as_bytes()));
        }
        let appended =
            self.log.append(&entries, AppendPriority::MayUseReserve).map_err(append_error)?;
        // A re-created object must get a higher version than any it replaces.
        self.log.raise_safe_version(Version(current.version.0 + 1));
        guard.remove(current.slot);
        let old_bytes =
            self.free_index_entry(epoch, (guard.bucket_index(), current.reference), table);
        self.log.table_tallies().object_removed(guard.bucket_index(), table, old_bytes);
        self.objects_live.fetch_sub(1, Ordering::Relaxed);
        let last = entries.len() - 1;
        Ok(completion_content
            .map(|_| (appended.references[last], entries[last].entry_bytes() as u64)))
    }

    /// Forgets every object of `table` whose key hash lies in `range`: removes it from the
    /// index and counts its bytes dead (no tombstones: the tablet is gone from this master).
    /// Returns how many objects were dropped.
    pub fn drop_range(&self, table: TableId, range: HashRange) -> u64 {
        // The scan takes one bucket's lock at a time, and an epoch per entry (a reference read
        // under it stays readable), so neither writers nor memory reuse wait for the whole scan.
        let dropped = self.index.retain(|reference| {
            let epoch = self.log.pin();
            let (_, content) = self.log.entry(&epoch, Reference(reference));
            let object = decode_object_unverified(&content).expect("corrupt object in the log");
            let hash = stratus_types::key_hash(table, object.key);
            let drop = object.table == table && range.contains(hash);
            // Counted dead under the bucket lock, as every other free is: once the entry is
            // out of the index and the lock released, the cleaner takes the copy for dead and
            // may clean its segment away, and a free after that would find no segment (a
            // migration target under memory pressure did).
            if drop {
                // The tallies and figures are sharded by the key's bucket, as the store's
                // other calls pass it (its shard bits never change as the table resizes).
                let shard = self.index.bucket_index(hash.0);
                let bytes = self.free_index_entry(&epoch, (shard, Reference(reference)), table);
                self.log.table_tallies().object_removed(shard, table, bytes);
            }
            !drop
        });
        self.objects_live.fetch_sub(dropped, Ordering::Relaxed);
        // The tablet's results go with it: its new master has its own copies (a transfer
        // carries them), and this master answers nothing of the tablet any more.
        let epoch = self.log.pin();
        let mut free = |reference| self.log.free(&epoch, reference);
        self.completions.forget_range(table, range, &mut free);
        // Its prepared transaction operations too: a tablet migrates only when none is
        // prepared, so these belong to a dropped table, whose transactions can only abort.
        for (released, finished) in self.prepared.remove_range(table, range) {
            free(released.reference);
            if let Some(transaction) = finished {
                free(transaction.reference);
            }
        }
        dropped
    }

    /// Totals for monitoring.
    pub fn statistics(&self) -> StoreStatistics {
        let log = self.log.statistics();
        StoreStatistics {
            log_bytes_total: log.log_bytes_total,
            log_bytes_live: log.log_bytes_live,
            log_bytes_allocated: log.log_bytes_allocated,
            seglets_total: log.seglets_total,
            seglets_free: log.seglets_free,
            segments_in_log: log.segments_in_log,
            objects_live: self.objects_live.load(Ordering::Relaxed),
            safe_version: log.safe_version,
            hash_table_buckets: self.index.bucket_count(),
            hash_table_bytes: self.index.main_bucket_bytes()
                + self.index.overflow_bucket_count() * stratus_index::BUCKET_BYTES,
            log_bytes_live_objects: log.log_bytes_live_objects,
            log_bytes_tombstones: log.log_bytes_tombstones,
            seglets_waiting_for_readers: log.seglets_waiting_for_readers,
            segments_side: log.segments_side,
            log_bytes_resident: log.log_bytes_resident,
            // From the figures above, not a second pass over the log's segments.
            log_bytes_target: self.target_bytes_for(&log).unwrap_or(0),
            cleaner: self.cleaner_statistics(),
        }
    }

    /// Every segment's statistics (live and dead bytes and counts per entry type), for the
    /// segments in the log and the cleaner's survivors.
    pub fn segment_statistics(&self) -> Vec<(SegmentId, SegmentStatistics)> {
        self.log.all_segment_statistics()
    }

    /// The segment that currently holds the object of (`table`, `key`), if any (for tests and
    /// diagnostics).
    pub fn segment_of_object(
        &self,
        table: TableId,
        key: &[u8],
        hash: KeyHash,
    ) -> Option<SegmentId> {
        let epoch = self.log.pin();
        let guard = self.index.lock(hash.0);
        self.lookup(&epoch, &guard, table, key)
            .map(|current| self.log.segment_of(current.reference))
    }
}

/// An object version to append: what [`ObjectStore::store_object`] writes.
struct NewObject<'a> {
    table: TableId,
    key: &'a [u8],
    value: &'a [u8],
    expires_at: Option<ExpiresAt>,
    /// Wall-clock seconds of the write (the cleaner sorts survivors by it).
    timestamp: u32,
}

/// The identity of an RPC whose result is to be recorded with its effect, and its key's hash.
#[derive(Clone, Copy, Debug)]
struct CompletionDraft {
    rpc: RpcIdentity,
    key_hash: u64,
}

impl CompletionDraft {
    /// The COMPLETION entry recording `result` for this RPC on `table`.
    fn record(&self, table: TableId, result: CompletionResult) -> CompletionRecord {
        CompletionRecord {
            table,
            key_hash: self.key_hash,
            lease_id: self.rpc.lease.0,
            rpc_id: self.rpc.rpc.0,
            acknowledged: self.rpc.acknowledged.0,
            version: result.version,
            integer: result.integer,
        }
    }
}

fn check_rules(rules: &RejectRules, current: Version) -> Result<(), ObjectError> {
    rules.check(current).map_err(|reason| ObjectError::Rejected { reason, current })
}

/// A tombstone entry of two pieces, its prefix and the key, so nothing is copied before the
/// log's own copy.
fn tombstone_entry<'a>(prefix: &'a TombstonePrefix, key: &'a [u8]) -> AppendEntry<'a> {
    AppendEntry { entry_type: EntryType::Tombstone, pieces: [prefix.as_bytes(), key, &[]] }
}

fn append_error(error: AppendError) -> ObjectError {
    match error {
        AppendError::LogFull => ObjectError::LogFull,
        // The store checks key and value sizes against limits that `StoreConfig::validate`
        // proved fit in a segment, so this is unreachable unless those checks are broken.
        AppendError::TooLarge => panic!("append larger than a segment passed the size checks"),
    }
}

#[cfg(test)]
mod auto_tier_tests;
#[cfg(test)]
mod cleaner_tests;
#[cfg(test)]
mod completion_tests;
#[cfg(test)]
mod expiry_tests;
#[cfg(test)]
mod flash_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod transaction_tests;
