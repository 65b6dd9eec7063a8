//! The completion table (RIFL, docs/design/exactly-once.md): per client lease, the results of
//! its mutations that took effect and that it has not acknowledged yet, each with the
//! reference of the COMPLETION entry that holds it in the log.
//!
//! A record lives exactly as long as its entry: it enters the table in the same step as its
//! entry enters the log (under the key's bucket lock), and it leaves the table exactly when its
//! entry is freed — acknowledged, its lease expired, or its tablet gone — so the log's live
//! bytes and the table agree, and the cleaner keeps an entry exactly when the table still
//! names it. Lock order: bucket lock, then a shard of this table, then the log's own lock.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use stratus_log::format::CompletionRecord;
use stratus_log::{EntryType, Reference};
use stratus_types::limits::COMPLETIONS_PER_LEASE_MAX;
use stratus_types::{HashRange, KeyHash, LeaseId, RpcId, RpcIdentity, TableId, Version};

use crate::ObjectError;

/// Shards of the table: a lease's requests take one shard's lock, so clients on different
/// shards never wait for each other.
const SHARDS: usize = 64;

/// What a mutation answered, as its retries are answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompletionResult {
    /// The version answered (the new version; the removed one for a remove).
    pub version: Version,
    /// The new value an increment answered.
    pub integer: Option<i64>,
}

/// One unacknowledged result.
#[derive(Clone, Copy, Debug)]
struct Recorded {
    result: CompletionResult,
    /// Its COMPLETION entry.
    reference: Reference,
    table: TableId,
    key_hash: u64,
    /// What the client had acknowledged when it sent the RPC (kept in the entry too).
    acknowledged: RpcId,
}

/// A lease's records.
#[derive(Debug, Default)]
struct LeaseCompletions {
    /// Every rpc id at or below this the client has acknowledged: their results are gone, and
    /// a request with one is stale.
    acknowledged: RpcId,
    results: BTreeMap<RpcId, Recorded>,
}

/// What the table says about a mutation about to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Never applied (or applied without effect, which records nothing): apply it.
    New,
    /// Applied before: answer this.
    Completed(CompletionResult),
}

/// Why a mutation may not run now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CheckError {
    /// The client acknowledged this RPC already: the request is an old duplicate.
    Stale,
    /// The lease holds [`COMPLETIONS_PER_LEASE_MAX`] unacknowledged results.
    TooManyUnacknowledged,
    /// The lease's result of this RPC is of another object: a retry names the object of its
    /// first attempt, so this is a client reusing an id, or one using another client's lease
    /// (which must neither read that result nor make the real RPC look done).
    OtherObject,
}

/// What happened to a COMPLETION entry the cleaner met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Relocation {
    /// The table names it: it was moved, the table now names the copy.
    Moved,
    /// Acknowledged, expired or dropped: nothing to move.
    Dead,
    /// The table names it but the copy could not be made: it stays where it is.
    Failed,
}

/// Totals, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompletionStatistics {
    /// Leases holding at least one record or a mark.
    pub leases: u64,
    /// Unacknowledged results held.
    pub records: u64,
    /// Bytes of their COMPLETION entries in the log.
    pub record_bytes: u64,
    /// Mutations answered from a record instead of applied again.
    pub retries_answered: u64,
    /// Requests refused as stale.
    pub stale_refused: u64,
}

/// The completion table of one store.
#[derive(Debug)]
pub(crate) struct CompletionTable {
    shards: Box<[Mutex<HashMap<LeaseId, LeaseCompletions>>]>,
    records: AtomicU64,
    record_bytes: AtomicU64,
    retries_answered: AtomicU64,
    stale_refused: AtomicU64,
}

impl Default for CompletionTable {
    fn default() -> CompletionTable {
        CompletionTable {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            records: AtomicU64::new(0),
            record_bytes: AtomicU64::new(0),
            retries_answered: AtomicU64::new(0),
            stale_refused: AtomicU64::new(0),
        }
    }
}

/// Frees a record's log entry; returns the entry's bytes.
pub(crate) type FreeEntry<'a> = dyn FnMut(Reference) -> u64 + 'a;

impl CompletionTable {
    fn shard(&self, lease: LeaseId) -> MutexGuard<'_, HashMap<LeaseId, LeaseCompletions>> {
        // Lease ids are dense counters: the low bits spread them.
        let index = (lease.0 % SHARDS as u64) as usize;
        self.shards[index].lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Raises `lease`'s mark to `acknowledged`, freeing the results it covers.
    fn acknowledge(
        &self,
        completions: &mut LeaseCompletions,
        acknowledged: RpcId,
        free: &mut FreeEntry<'_>,
    ) {
        if acknowledged <= completions.acknowledged {
            return;
        }
        completions.acknowledged = acknowledged;
        // Popped from the front rather than split off: every mutation of a lease acknowledges
        // its predecessor, and a split allocates a new map each time.
        let covered = std::iter::from_fn(|| {
            let entry = completions.results.first_entry()?;
            (*entry.key() <= acknowledged).then(|| entry.remove())
        });
        self.forget(covered, free);
    }

    fn forget(&self, records: impl Iterator<Item = Recorded>, free: &mut FreeEntry<'_>) -> u64 {
        let mut count = 0u64;
        let mut bytes = 0u64;
        for recorded in records {
            bytes += free(recorded.reference);
            count += 1;
        }
        self.records.fetch_sub(count, Ordering::Relaxed);
        self.record_bytes.fetch_sub(bytes, Ordering::Relaxed);
        count
    }

    /// Takes `rpc.acknowledged` into the lease's mark, then says whether `rpc`, a mutation of
    /// the object `(table, key_hash)`, is new or was applied (its result), or may not run.
    pub(crate) fn check(
        &self,
        rpc: &RpcIdentity,
        (table, key_hash): (TableId, u64),
        free: &mut FreeEntry<'_>,
    ) -> Result<Check, CheckError> {
        let mut shard = self.shard(rpc.lease);
        let completions = shard.entry(rpc.lease).or_default();
        self.acknowledge(completions, rpc.acknowledged, free);
        if rpc.rpc <= completions.acknowledged {
            self.stale_refused.fetch_add(1, Ordering::Relaxed);
            return Err(CheckError::Stale);
        }
        if let Some(recorded) = completions.results.get(&rpc.rpc) {
            if (recorded.table, recorded.key_hash) != (table, key_hash) {
                return Err(CheckError::OtherObject);
            }
            self.retries_answered.fetch_add(1, Ordering::Relaxed);
            return Ok(Check::Completed(recorded.result));
        }
        if completions.results.len() >= COMPLETIONS_PER_LEASE_MAX {
            return Err(CheckError::TooManyUnacknowledged);
        }
        Ok(Check::New)
    }

    /// Records the result of `rpc`, whose COMPLETION entry (of `entry_bytes`) is at
    /// `reference`. An RPC acknowledged meanwhile (a client that gave up on it) or recorded
    /// already (a client that reused an id) has its new entry freed at once.
    pub(crate) fn record(
        &self,
        rpc: &RpcIdentity,
        (table, key_hash): (TableId, u64),
        result: CompletionResult,
        (reference, entry_bytes): (Reference, u64),
        free: &mut FreeEntry<'_>,
    ) {
        let mut shard = self.shard(rpc.lease);
        let completions = shard.entry(rpc.lease).or_default();
        self.acknowledge(completions, rpc.acknowledged, free);
        if rpc.rpc <= completions.acknowledged || completions.results.contains_key(&rpc.rpc) {
            free(reference);
            return;
        }
        let acknowledged = rpc.acknowledged;
        let recorded = Recorded { result, reference, table, key_hash, acknowledged };
        completions.results.insert(rpc.rpc, recorded);
        self.records.fetch_add(1, Ordering::Relaxed);
        self.record_bytes.fetch_add(entry_bytes, Ordering::Relaxed);
    }

    /// Whether the table names the entry at `reference` holding `record`.
    pub(crate) fn names(&self, record: &CompletionRecord, reference: Reference) -> bool {
        let shard = self.shard(LeaseId(record.lease_id));
        shard
            .get(&LeaseId(record.lease_id))
            .and_then(|completions| completions.results.get(&RpcId(record.rpc_id)))
            .is_some_and(|recorded| recorded.reference == reference)
    }

    /// The cleaner met `record` at `reference`: if the table names it, `copy` moves it (returns
    /// the copy's reference, or `None` without memory) and the table names the copy. Under the
    /// lease's shard lock, so an acknowledgement cannot free the entry while it moves.
    pub(crate) fn relocate(
        &self,
        record: &CompletionRecord,
        reference: Reference,
        copy: impl FnOnce() -> Option<Reference>,
    ) -> Relocation {
        let mut shard = self.shard(LeaseId(record.lease_id));
        let recorded = shard
            .get_mut(&LeaseId(record.lease_id))
            .and_then(|completions| completions.results.get_mut(&RpcId(record.rpc_id)))
            .filter(|recorded| recorded.reference == reference);
        let Some(recorded) = recorded else {
            return Relocation::Dead;
        };
        match copy() {
            Some(moved) => {
                recorded.reference = moved;
                Relocation::Moved
            }
            None => Relocation::Failed,
        }
    }

    /// Forgets every record of `lease` (its lease expired); returns how many.
    pub(crate) fn forget_lease(&self, lease: LeaseId, free: &mut FreeEntry<'_>) -> u64 {
        let removed = self.shard(lease).remove(&lease);
        removed.map_or(0, |completions| self.forget(completions.results.into_values(), free))
    }

    /// Forgets every record of `table` whose key hash lies in `range` (the tablet left this
    /// master); returns how many.
    pub(crate) fn forget_range(
        &self,
        table: TableId,
        range: HashRange,
        free: &mut FreeEntry<'_>,
    ) -> u64 {
        let mut forgotten = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            for completions in shard.values_mut() {
                let (gone, kept): (BTreeMap<_, _>, BTreeMap<_, _>) =
                    std::mem::take(&mut completions.results).into_iter().partition(
                        |(_, recorded)| {
                            recorded.table == table && range.contains(KeyHash(recorded.key_hash))
                        },
                    );
                completions.results = kept;
                forgotten += self.forget(gone.into_values(), free);
            }
        }
        forgotten
    }

    /// Every record of `table` whose key hash lies in `range` (a migration sends them with the
    /// tablet).
    pub(crate) fn records_in_range(
        &self,
        table: TableId,
        range: HashRange,
    ) -> Vec<CompletionRecord> {
        let mut records = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            for (lease, completions) in shard.iter() {
                for (rpc, recorded) in &completions.results {
                    if recorded.table == table && range.contains(KeyHash(recorded.key_hash)) {
                        records.push(CompletionRecord {
                            table,
                            key_hash: recorded.key_hash,
                            lease_id: lease.0,
                            rpc_id: rpc.0,
                            acknowledged: recorded.acknowledged.0,
                            version: recorded.result.version,
                            integer: recorded.result.integer,
                        });
                    }
                }
            }
        }
        records.sort_by_key(|record| (record.lease_id, record.rpc_id));
        records
    }

    /// Whether `record` (from a replayed log or a migration) is worth keeping: not covered by
    /// its lease's mark (raised to the record's own `acknowledged` first) and not held
    /// already.
    pub(crate) fn wants(&self, record: &CompletionRecord, free: &mut FreeEntry<'_>) -> bool {
        let lease = LeaseId(record.lease_id);
        let mut shard = self.shard(lease);
        let completions = shard.entry(lease).or_default();
        self.acknowledge(completions, RpcId(record.acknowledged), free);
        RpcId(record.rpc_id) > completions.acknowledged
            && !completions.results.contains_key(&RpcId(record.rpc_id))
    }

    /// The leases the table knows, with records or only a mark (the master checks them with
    /// the coordinator now and then, and forgets those that expired).
    pub(crate) fn leases(&self) -> Vec<LeaseId> {
        let mut leases = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|poison| poison.into_inner());
            leases.extend(shard.keys().copied());
        }
        leases.sort();
        leases
    }

    /// Totals, for metrics.
    pub(crate) fn statistics(&self) -> CompletionStatistics {
        let leases = self
            .shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(|poison| poison.into_inner()).len() as u64)
            .sum();
        CompletionStatistics {
            leases,
            records: self.records.load(Ordering::Relaxed),
            record_bytes: self.record_bytes.load(Ordering::Relaxed),
            retries_answered: self.retries_answered.load(Ordering::Relaxed),
            stale_refused: self.stale_refused.load(Ordering::Relaxed),
        }
    }
}

impl crate::ObjectStore {
    /// Forgets every result of `lease` (the coordinator says it expired: its client will never
    /// retry, and a zombie's requests are refused by the lease check). Returns how many.
    pub fn forget_client_lease(&self, lease: LeaseId) -> u64 {
        let epoch = self.log.pin();
        let mut free = |reference| self.log.free(&epoch, reference);
        self.completions.forget_lease(lease, &mut free)
    }

    /// The client leases this store holds results or an acknowledged mark of.
    pub fn client_leases(&self) -> Vec<LeaseId> {
        self.completions.leases()
    }

    /// The completion table's totals.
    pub fn completion_statistics(&self) -> CompletionStatistics {
        self.completions.statistics()
    }

    /// The unacknowledged results of mutations of `table` in `range` (a tablet transfer sends
    /// them with its objects), ordered by lease and rpc id.
    pub fn completions_in_range(&self, table: TableId, range: HashRange) -> Vec<CompletionRecord> {
        self.completions.records_in_range(table, range)
    }

    /// Takes results of mutations from another master (a tablet transfer): each is appended
    /// to this log and kept, unless its lease's mark covers it or it is held already. Returns
    /// how many were kept.
    pub fn import_completions(&self, records: &[CompletionRecord]) -> Result<u64, ObjectError> {
        let mut kept = 0;
        for record in records {
            if self.import_completion(record, &mut crate::ReplayInto::Head)? {
                kept += 1;
            }
        }
        Ok(kept)
    }

    /// Appends `record` where `into` says and keeps it in the table, unless the table does not
    /// want it. Returns whether it was kept.
    pub(crate) fn import_completion(
        &self,
        record: &CompletionRecord,
        into: &mut crate::ReplayInto<'_>,
    ) -> Result<bool, ObjectError> {
        let epoch = self.log.pin();
        let mut free = |reference| self.log.free(&epoch, reference);
        if !self.completions.wants(record, &mut free) {
            return Ok(false);
        }
        let content = record.encode();
        let entry = stratus_log::AppendEntry::new(EntryType::Completion, content.as_bytes());
        let reference = match into {
            crate::ReplayInto::Head => {
                let appended = self
                    .log
                    .append(&[entry], stratus_log::AppendPriority::Normal)
                    .map_err(crate::append_error)?;
                appended.references[0]
            }
            crate::ReplayInto::SideLog { side_log, closed } => {
                let (reference, full) =
                    side_log.append(&self.log, &entry).map_err(crate::append_error)?;
                if let Some(full) = full {
                    closed(full);
                }
                reference
            }
        };
        let rpc = RpcIdentity {
            lease: LeaseId(record.lease_id),
            rpc: RpcId(record.rpc_id),
            acknowledged: RpcId(record.acknowledged),
        };
        let result = CompletionResult { version: record.version, integer: record.integer };
        let entry_bytes = entry.entry_bytes() as u64;
        let key = (record.table, record.key_hash);
        self.completions.record(&rpc, key, result, (reference, entry_bytes), &mut free);
        Ok(true)
    }
}
