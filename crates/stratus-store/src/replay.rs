//! Replay: rebuilding objects from segments of another master's log (crash recovery) or of a
//! tablet being moved (migration).
//!
//! Segments may be replayed in any order and come from replicas: each is verified first (its
//! certificate and every entry's checksum), and a segment that does not verify is refused
//! whole, so the caller can read another replica. Within the replayed set the rules are
//! RAMCloud's: for each key the object with the highest version wins, unless a tombstone names
//! that version or a higher one (then the key is dead). The winner is written into this store
//! with its original version, if this store holds no newer version of it; the safe version is
//! raised past every version and safe-version entry seen, so versions are never reused.
//!
//! Replay reads the set once, verifying each segment as it goes, and keeps the newest object of
//! each key and the highest tombstone of each removed key before it writes anything, so it
//! needs memory for one small record per key of the set: it replays a partition sized for one
//! recovery master, not a whole cluster. The winners are copied into the log as they were read
//! (their checksums were verified, not computed again).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use std::sync::atomic::Ordering;

use stratus_log::format::{CompletionRecord, ObjectPrefix, TombstonePrefix};
use stratus_log::{
    AppendEntry, AppendPriority, Certificate, Entry, EntryType, FormatError, ObjectView,
    SegmentIterator, SideLog, TombstoneView,
};
use stratus_types::{key_hash, ExpiresAt, IntegerHashing, KeyHash, SegmentId, TableId, Version};

use crate::{append_error, tombstone_entry, NewObject, ObjectError, ObjectStore, WallTime};

/// Why a replay stopped. Objects already replayed stay; replaying the same set again is
/// harmless (versions decide).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayError {
    /// A segment failed verification: read another replica of it.
    CorruptSegment {
        /// Which segment of the set (index into the slice given).
        index: usize,
        /// What was wrong.
        reason: String,
    },
    /// The store is out of memory for the replayed objects (a recovery master sized too small).
    StoreFull,
    /// The store has no room for the replay now, found before anything was appended: the
    /// caller may clean and try again ([`ObjectStore::replay_room_shortage`]).
    NoRoom(RoomShortage),
    /// A replayed object is larger than this store admits (its value limit, set by its segment
    /// size, is below the crashed master's): it cannot hold this partition.
    ObjectTooLarge {
        /// The object's value length.
        value_bytes: usize,
    },
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::CorruptSegment { index, reason } => {
                write!(f, "segment {index} of the replayed set is corrupt: {reason}")
            }
            ReplayError::StoreFull => f.write_str("the store is full"),
            ReplayError::NoRoom(shortage) => shortage.fmt(f),
            ReplayError::ObjectTooLarge { value_bytes } => write!(
                f,
                "a replayed value of {value_bytes} bytes is larger than this store admits"
            ),
        }
    }
}

impl std::error::Error for ReplayError {}

/// What a replay did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayStatistics {
    /// Segments verified and read.
    pub segments: u64,
    /// Objects written into the store (winners newer than what it held).
    pub objects_replayed: u64,
    /// Objects skipped: older than the winner of their key, dead, or outside the filter.
    pub objects_skipped: u64,
    /// Objects of this store removed because a replayed tombstone named them.
    pub objects_removed: u64,
    /// Results of mutations kept for their clients' retries.
    pub completions_replayed: u64,
    /// Transaction operations prepared and not decided in the replayed log: locked again here.
    pub prepared_replayed: u64,
}

/// A replayed key, borrowed from the segment it was read from, with its key hash (computed
/// once: the filter, the maps and the store's index all use it).
#[derive(Clone, Copy, Debug)]
struct ReplayedKey<'a> {
    table: TableId,
    key: &'a [u8],
    hash: KeyHash,
}

impl PartialEq for ReplayedKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.table == other.table && self.key == other.key
    }
}

impl Eq for ReplayedKey<'_> {}

impl Hash for ReplayedKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash.0);
    }
}

/// The newest object of a key so far, and its verified entry content.
#[derive(Clone, Copy, Debug)]
struct Winner<'a> {
    object: ObjectView<'a>,
    content: &'a [u8],
}

/// The maps of a replay hash by the key hash alone, which is already computed (a 64-bit hash
/// of table and key): no second hash of the key bytes per object, one multiplication
/// ([`IntegerHashing`]). The maps iterate in the same order on every run, as they must: the
/// winners are appended to the log in that order, and a replay must be a function of its input
/// (the deterministic simulation replays and compares). A client that chose keys to collide
/// could slow one recovery, not corrupt it.
type KeyHashOnly = IntegerHashing;

/// Where a replay writes the objects it keeps.
pub enum ReplayInto<'a> {
    /// This store's log head, replicated with every other write (a replay of the store's own
    /// segments, tests).
    Head,
    /// A side log beside this store's log (crash recovery, RAMCloud's design): replay does not
    /// interleave with the head's writes, `closed` is told of each side segment as it fills so
    /// it can be replicated while replay goes on, and the caller fuses the side log into the
    /// log once it is durable ([`stratus_log::Log::fuse_side_segments`]) or abandons it
    /// whole. The new head of the fusion records the raised safe version; replay opens a head
    /// for it only when the side log stayed empty.
    SideLog {
        /// The side log written to.
        side_log: &'a mut SideLog,
        /// Told of each side segment that is full (nothing is appended to it again).
        closed: &'a mut dyn FnMut(SegmentId),
    },
}

impl std::fmt::Debug for ReplayInto<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayInto::Head => f.write_str("Head"),
            ReplayInto::SideLog { side_log, .. } => {
                f.debug_struct("SideLog").field("side_log", side_log).finish_non_exhaustive()
            }
        }
    }
}

/// The first half of a replay, segment by segment in any order: each segment is verified
/// (certificate, then every entry's checksum), and its tombstones, the newest object of each
/// key and the highest version are noted. Nothing is written until
/// [`ObjectStore::replay_collected`]: a later segment may hold a newer version or the
/// tombstone of an object seen earlier. Keys and contents are borrowed from the segments,
/// which must outlive it.
pub struct ReplayCollector<'a> {
    accept: &'a dyn Fn(usize, TableId, KeyHash) -> bool,
    dead: HashMap<ReplayedKey<'a>, Version, KeyHashOnly>,
    winners: HashMap<ReplayedKey<'a>, Winner<'a>, KeyHashOnly>,
    highest_version: Version,
    objects_seen: u64,
    statistics: ReplayStatistics,
    /// Results of mutations (by lease and rpc id: a cleaned segment's record may be seen twice,
    /// and the order must be the same on every run).
    completions: BTreeMap<(u64, u64), CompletionRecord>,
    /// Prepared transaction operations (by lease and rpc id), with their entries' content.
    prepared: BTreeMap<(u64, u64), &'a [u8]>,
    /// Operations whose PREPARED entry a PREPARED_TOMBSTONE marks decided.
    decided: BTreeSet<(u64, u64)>,
    /// The participant lists of transactions (by lease and transaction), with their entries'
    /// content: kept for the transactions of the prepared operations replayed.
    participants: BTreeMap<(u64, u64), &'a [u8]>,
}

impl std::fmt::Debug for ReplayCollector<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayCollector")
            .field("segments", &self.statistics.segments)
            .field("objects_seen", &self.objects_seen)
            .field("winners", &self.winners.len())
            .field("tombstoned_keys", &self.dead.len())
            .finish()
    }
}

impl<'a> ReplayCollector<'a> {
    /// A collector keeping the objects `accept(segment index, table, key hash)` accepts (see
    /// [`ObjectStore::replay_filtered`]).
    pub fn new(accept: &'a dyn Fn(usize, TableId, KeyHash) -> bool) -> ReplayCollector<'a> {
        ReplayCollector {
            accept,
            dead: HashMap::default(),
            winners: HashMap::default(),
            highest_version: Version(0),
            objects_seen: 0,
            statistics: ReplayStatistics::default(),
            completions: BTreeMap::new(),
            prepared: BTreeMap::new(),
            decided: BTreeSet::new(),
            participants: BTreeMap::new(),
        }
    }

    /// Verifies segment `index` of the set (`bytes`, committed by `certificate`) and notes
    /// what it holds. A segment that fails verification is refused whole (`CorruptSegment`
    /// naming `index`), and whatever it held before the failure is dropped with the
    /// collector: the caller reads another replica and starts over, or gives up.
    pub fn add(
        &mut self,
        index: usize,
        bytes: &'a [u8],
        certificate: &Certificate,
    ) -> Result<(), ReplayError> {
        self.note(index, SegmentIterator::new(bytes, certificate))
    }

    /// [`ReplayCollector::add`] for bytes that already passed `stratus_log::verify_replica`
    /// with `certificate` (a recovery master verifies each replica as it reads it, to try
    /// another backup's when one fails): objects' checksums are not computed a second time.
    pub fn add_verified(
        &mut self,
        index: usize,
        bytes: &'a [u8],
        certificate: &Certificate,
    ) -> Result<(), ReplayError> {
        self.note(index, SegmentIterator::of_verified(bytes, certificate))
    }

    fn note(
        &mut self,
        index: usize,
        iterator: Result<SegmentIterator<'a>, FormatError>,
    ) -> Result<(), ReplayError> {
        let corrupt = |reason: String| ReplayError::CorruptSegment { index, reason };
        for entry in iterator.map_err(|error| corrupt(error.to_string()))? {
            let entry = entry.map_err(|error| corrupt(error.to_string()))?;
            match entry.entry {
                Entry::Object(object) => {
                    self.objects_seen += 1;
                    self.highest_version = self.highest_version.max(object.version);
                    let hash = key_hash(object.table, object.key);
                    if !(self.accept)(index, object.table, hash) {
                        continue;
                    }
                    let key = ReplayedKey { table: object.table, key: object.key, hash };
                    let candidate = Winner { object, content: entry.content };
                    self.winners
                        .entry(key)
                        .and_modify(|winner| {
                            if winner.object.version < object.version {
                                *winner = candidate;
                            }
                        })
                        .or_insert(candidate);
                }
                Entry::Tombstone(tombstone) => {
                    let hash = key_hash(tombstone.table, tombstone.key);
                    if (self.accept)(index, tombstone.table, hash) {
                        let key = ReplayedKey { table: tombstone.table, key: tombstone.key, hash };
                        let killed = self.dead.entry(key).or_insert(Version(0));
                        *killed = (*killed).max(tombstone.object_version);
                        self.highest_version = self.highest_version.max(tombstone.object_version);
                    }
                }
                Entry::SafeVersion(version) => {
                    self.highest_version = self.highest_version.max(version);
                }
                Entry::Completion(record) => {
                    // A result goes with its object's tablet, as the object does.
                    if (self.accept)(index, record.table, KeyHash(record.key_hash)) {
                        self.completions.insert((record.lease_id, record.rpc_id), record);
                    }
                }
                Entry::Prepared(prepared) => {
                    // A prepared operation goes with its object's tablet, as the object does.
                    if (self.accept)(index, prepared.table, KeyHash(prepared.key_hash)) {
                        let id = (prepared.lease_id, prepared.rpc_id);
                        self.prepared.insert(id, entry.content);
                    }
                }
                Entry::PreparedTombstone(decided) => {
                    if (self.accept)(index, decided.table, KeyHash(decided.key_hash)) {
                        self.decided.insert((decided.lease_id, decided.rpc_id));
                    }
                }
                Entry::TxParticipants(record) => {
                    // Every partition gets it (backups send it to all): kept here only if an
                    // undecided operation of its transaction is.
                    let id = (record.lease_id, record.transaction);
                    self.participants.insert(id, entry.content);
                }
                Entry::SegmentHeader(_) | Entry::LogDigest(_) | Entry::TableStats(_) => {}
            }
        }
        self.statistics.segments += 1;
        Ok(())
    }
}

/// What a replay into a side log appends, at most: the bytes of its entries and the largest
/// one (objects that a tombstone turns out to kill are counted too).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayRoom {
    /// Bytes of every entry the replay may append, headers included.
    pub entry_bytes: u64,
    /// The largest of them: a segment may leave up to that much unused at its end.
    pub largest_entry_bytes: u64,
}

/// Why this store cannot take a replay now, in the terms an operator acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoomShortage {
    /// What the replay appends.
    pub room: ReplayRoom,
    /// Log memory the replay needs (its entries, the heads that open and fuse it).
    pub bytes_needed: u64,
    /// Log memory free for it (beyond the reserves kept for the cleaner and for writes).
    pub bytes_free: u64,
    /// Segments the replay adds to the log (side segments and two heads).
    pub segments_needed: u64,
    /// Segments the log may still add before its limit.
    pub segments_free: u64,
}

impl RoomShortage {
    /// True when memory is what is short (otherwise the segment count is).
    pub fn memory_short(&self) -> bool {
        self.bytes_needed > self.bytes_free
    }
}

impl std::fmt::Display for RoomShortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
        write!(
            f,
            "the replay needs {:.1} MiB and {} segments of this server's log; after cleaning, \
             {:.1} MiB and {} segments are free (give servers a larger --log-mib, or add servers)",
            mib(self.bytes_needed),
            self.segments_needed,
            mib(self.bytes_free),
            self.segments_free
        )
    }
}

impl ReplayCollector<'_> {
    /// What replaying what was collected so far may append.
    pub fn room_needed(&self) -> ReplayRoom {
        let entry_bytes = |content: usize| (content + stratus_log::ENTRY_HEADER_BYTES_MAX) as u64;
        let objects = self.winners.values().map(|winner| entry_bytes(winner.content.len()));
        let (objects_bytes, largest) =
            objects.fold((0, 0), |(sum, largest), bytes| (sum + bytes, largest.max(bytes)));
        let completion = entry_bytes(stratus_log::COMPLETION_CONTENT_BYTES_MAX);
        let completions = self.completions.len() as u64 * completion;
        // Each prepared operation may bring its transaction's list (counted once per
        // operation: an upper bound).
        let prepared = self.prepared.values().map(|content| {
            let view = stratus_log::format::decode_prepared_unverified(content)
                .expect("verified by the collector");
            let listed = self.participants.get(&(view.lease_id, view.transaction));
            entry_bytes(content.len()) + listed.map_or(0, |list| entry_bytes(list.len()))
        });
        let (prepared_bytes, largest_prepared) =
            prepared.fold((0, 0), |(sum, largest), bytes| (sum + bytes, largest.max(bytes)));
        let largest = largest.max(largest_prepared);
        ReplayRoom {
            entry_bytes: objects_bytes + completions + prepared_bytes,
            largest_entry_bytes: if self.completions.is_empty() {
                largest
            } else {
                largest.max(completion)
            },
        }
    }
}

impl ObjectStore {
    /// Whether this store's log has room for a replay into a side log of `room` now, and if
    /// not, what is short. Counts what [`ObjectStore::replay_collected`] and the fusing of its
    /// side log take: the side segments (each entry whole in one segment), a seglet begun per
    /// entry's segment, and new heads (the recovery's creation head and the head that fuses
    /// the side log: `heads` of them), all from memory that ordinary appends may use.
    pub fn replay_room_shortage(&self, room: &ReplayRoom, heads: u64) -> Option<RoomShortage> {
        let config = self.log.config();
        let statistics = self.log.statistics();
        let segment_bytes = u64::from(config.segment_bytes);
        let seglet_bytes = u64::from(config.seglet_bytes);
        // Entries are never split across segments: at most one entry's worth of each segment
        // is left unused (and its header takes a little), so a segment holds at least
        // segment_bytes − largest entry − header.
        let header_bytes = 64;
        let usable_per_segment =
            segment_bytes.saturating_sub(room.largest_entry_bytes + header_bytes).max(1);
        let side_segments = room.entry_bytes.div_ceil(usable_per_segment);
        let seglets_needed = room.entry_bytes.div_ceil(seglet_bytes)
            + side_segments
            + heads * u64::from(config.head_seglets_max());
        let reserves = u64::from(config.reserve_seglets() + config.cleaner_reserve_seglets());
        let seglets_free = (statistics.seglets_free + statistics.seglets_waiting_for_readers)
            .saturating_sub(reserves);
        // Ordinary heads keep the last slot for the cleaner's commit head.
        let segments_allowed = config.segment_count_max() as u64 - 1;
        let segments_free = segments_allowed.saturating_sub(statistics.segments_in_next_digest);
        let segments_needed = side_segments + heads;
        if seglets_needed <= seglets_free && segments_needed <= segments_free {
            return None;
        }
        Some(RoomShortage {
            room: *room,
            bytes_needed: seglets_needed * seglet_bytes,
            bytes_free: seglets_free * seglet_bytes,
            segments_needed,
            segments_free,
        })
    }

    /// Replays `segments` (bytes and the certificate committing them) into this store, keeping
    /// only objects for which `accept(table, key hash)` holds (the tablets being recovered).
    /// `now` is the time given to the log (replayed objects keep their own timestamps and
    /// expiry times).
    pub fn replay(
        &self,
        segments: &[(&[u8], Certificate)],
        accept: &dyn Fn(TableId, KeyHash) -> bool,
        now: WallTime,
    ) -> Result<ReplayStatistics, ReplayError> {
        let accept = |_, table, hash| accept(table, hash);
        self.replay_filtered(segments, &accept, now, ReplayInto::Head)
    }

    /// [`ObjectStore::replay`] where an object is kept only if `accept(segment index, table,
    /// key hash)` holds: a recovery ignores objects of a tablet found in segments older than
    /// the tablet's creation in that log (a tablet that left the master and came back leaves
    /// its old objects behind, and their tombstones may be in another master's log). Tombstones
    /// are filtered by table and hash only: an old tombstone names an old version, which can
    /// only kill objects at least as old.
    pub fn replay_filtered(
        &self,
        segments: &[(&[u8], Certificate)],
        accept: &dyn Fn(usize, TableId, KeyHash) -> bool,
        now: WallTime,
        into: ReplayInto<'_>,
    ) -> Result<ReplayStatistics, ReplayError> {
        let mut collector = ReplayCollector::new(accept);
        for (index, (bytes, certificate)) in segments.iter().enumerate() {
            collector.add(index, bytes, certificate)?;
        }
        self.replay_collected(collector, now, into)
    }

    /// Writes what `collector` gathered into this store: the second half of
    /// [`ObjectStore::replay_filtered`], for a caller that adds the segments itself (the
    /// recovery master adds replicas it already verified with [`ReplayCollector::add_verified`]).
    pub fn replay_collected(
        &self,
        collector: ReplayCollector<'_>,
        now: WallTime,
        mut into: ReplayInto<'_>,
    ) -> Result<ReplayStatistics, ReplayError> {
        let ReplayCollector {
            dead,
            mut winners,
            highest_version,
            objects_seen,
            mut statistics,
            completions,
            mut prepared,
            decided,
            participants,
            ..
        } = collector;
        prepared.retain(|id, _| !decided.contains(id));
        // A key's newest object is live unless a tombstone names its version or a newer one
        // (then every older object of the key is dead too).
        winners.retain(|key, winner| {
            dead.get(key).is_none_or(|killed| *killed < winner.object.version)
        });
        // Checked before anything is written: an object this store cannot hold would otherwise
        // break the log's invariants half-way through.
        for (key, winner) in &winners {
            let value_bytes = winner.object.value.len();
            if key.key.is_empty()
                || key.key.len() > stratus_types::limits::KEY_BYTES_MAX
                || value_bytes > self.config.value_bytes_max as usize
            {
                return Err(ReplayError::ObjectTooLarge { value_bytes });
            }
        }
        statistics.objects_skipped = objects_seen - winners.len() as u64;
        self.log.observe_time(now.seconds());
        // Versions are never reused: new writes here get versions above everything replayed.
        self.log.raise_safe_version(Version(highest_version.0 + 1));
        // A growable hash table is sized for what arrives before it arrives: inserting a whole
        // recovery into a table sized for far fewer would walk long chains for every object.
        self.size_index_for(
            self.objects_live.load(std::sync::atomic::Ordering::Relaxed) + winners.len() as u64,
        );
        for (key, winner) in winners {
            match self.replay_object(key.hash, winner.object, Some(winner.content), &mut into) {
                Ok(true) => statistics.objects_replayed += 1,
                Ok(false) => statistics.objects_skipped += 1,
                Err(ObjectError::LogFull) => return Err(ReplayError::StoreFull),
                Err(error) => unreachable!("replaying a verified object failed: {error:?}"),
            }
        }
        // The results of mutations of these tablets that their clients have not acknowledged:
        // a retry that reaches this master now gets the original result.
        let mut marks: HashMap<u64, u64> = HashMap::new();
        for record in completions.values() {
            let mark = marks.entry(record.lease_id).or_default();
            *mark = (*mark).max(record.acknowledged);
        }
        let unacknowledged =
            completions.values().filter(|record| record.rpc_id > marks[&record.lease_id]);
        for record in unacknowledged {
            match self.import_completion(record, &mut into) {
                Ok(true) => statistics.completions_replayed += 1,
                Ok(false) => {}
                Err(ObjectError::LogFull) => return Err(ReplayError::StoreFull),
                Err(error) => unreachable!("replaying a verified completion failed: {error:?}"),
            }
        }
        // Operations of transactions still undecided: their objects are locked again here,
        // so nothing reads or writes around them until the decision arrives.
        for content in prepared.values() {
            let view = stratus_log::format::decode_prepared_unverified(content)
                .expect("verified by the collector");
            let listed = participants.get(&(view.lease_id, view.transaction)).copied();
            match self.import_prepared(content, listed, now, &mut into) {
                Ok(true) => statistics.prepared_replayed += 1,
                Ok(false) => {}
                Err(ObjectError::LogFull) => return Err(ReplayError::StoreFull),
                Err(error) => unreachable!("replaying a verified prepared entry failed: {error:?}"),
            }
        }
        // Objects this store already held that a replayed tombstone names are dead too.
        for (ReplayedKey { table, key, hash }, killed) in dead {
            // No request runs on a tablet while it is being replayed, so the version read here
            // is still current when the remove runs.
            let rules = stratus_types::RejectRules::NONE;
            let current = self.current_version(table, key, hash);
            if current.is_some_and(|version| version <= killed) {
                match self.remove(table, key, hash, &rules, now) {
                    Ok(_) => statistics.objects_removed += 1,
                    Err(ObjectError::LogFull) => return Err(ReplayError::StoreFull),
                    Err(error) => unreachable!("removing a replayed-dead object failed: {error:?}"),
                }
            }
        }
        // The raised safe version is only in memory so far, and a key removed in the replayed
        // log may have left nothing else here (its tombstone is not copied). A new head records
        // it (every head starts with the safe version): once the caller has replicated the log,
        // the floor survives this store too, and a later recovery of it cannot hand out those
        // versions again. (The simulation found versions reused after two recoveries in a row.)
        // Into a side log, the head that fuses it records the floor; with no side segment
        // there is no such head (every key of the set was dead, or filtered out), and this one
        // must record it instead (the simulation's reuse of versions again, otherwise).
        let fusing_head_follows = match &into {
            ReplayInto::Head => false,
            ReplayInto::SideLog { side_log, .. } => !side_log.segments().is_empty(),
        };
        if highest_version.0 > 0 && !fusing_head_follows {
            self.log.roll_head(AppendPriority::Normal).map_err(|_| ReplayError::StoreFull)?;
        }
        Ok(statistics)
    }

    /// Writes an object copied from another master's store (tablet migration) with its
    /// original `version`, unless this store holds a version at least as new. Returns whether
    /// it was written. The caller raises the safe version to the source's first, so versions
    /// handed out here later stay above every version the source used.
    pub fn insert_migrated(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        version: Version,
        expires_at: Option<ExpiresAt>,
        now: WallTime,
    ) -> Result<bool, ObjectError> {
        if key.is_empty() || key.len() > stratus_types::limits::KEY_BYTES_MAX {
            return Err(ObjectError::InvalidKey);
        }
        if value.len() > self.config.value_bytes_max as usize {
            return Err(ObjectError::ValueTooLarge);
        }
        self.log.observe_time(now.seconds());
        self.log.raise_safe_version(Version(version.0.saturating_add(1)));
        let object =
            ObjectView { table, version, timestamp: now.seconds(), expires_at, key, value };
        self.replay_object(key_hash(table, key), object, None, &mut ReplayInto::Head)
    }

    /// Removes an object copied from another master's store (tablet migration) that the
    /// source removed while it copied the tablet: only if this store holds it at a version
    /// below `below` (the source's safe version once it held writes, which is above every
    /// version it removed; a version at or above it is newer than the removal). Raises the safe
    /// version to `below`, so a re-created object gets a higher version than the removed one.
    /// Returns whether it was removed.
    pub fn remove_migrated(
        &self,
        table: TableId,
        key: &[u8],
        below: Version,
        now: WallTime,
    ) -> Result<bool, ObjectError> {
        if key.is_empty() || key.len() > stratus_types::limits::KEY_BYTES_MAX {
            return Err(ObjectError::InvalidKey);
        }
        self.log.raise_safe_version(below);
        self.log.observe_time(now.seconds());
        let hash = key_hash(table, key);
        let epoch = self.log.pin();
        let mut guard = self.index.lock(hash.0);
        // Whatever it holds, live or expired: the source removed the key.
        match self.lookup(&epoch, &guard, table, key) {
            Some(current) if current.version < below => {
                self.remove_current(&epoch, &mut guard, current, (table, key), now, None, None)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The version of the object stored under (`table`, `key`), if any.
    fn current_version(&self, table: TableId, key: &[u8], hash: KeyHash) -> Option<Version> {
        let epoch = self.log.pin();
        let guard = self.index.lock(hash.0);
        self.lookup(&epoch, &guard, table, key).map(|current| current.version)
    }

    /// Writes one replayed object with its original version unless this store holds a version
    /// at least as new. Returns whether it was written. `content` is the object's entry content
    /// as read from a verified segment: a side log copies it as it is (its checksum verified
    /// once, not computed again); without it the entry is encoded anew.
    fn replay_object(
        &self,
        hash: KeyHash,
        object: ObjectView<'_>,
        content: Option<&[u8]>,
        into: &mut ReplayInto<'_>,
    ) -> Result<bool, ObjectError> {
        let ObjectView { table, version, timestamp, expires_at, key, value } = object;
        let epoch = self.log.pin();
        let mut guard = self.index.lock(hash.0);
        let current = self.lookup(&epoch, &guard, table, key);
        if current.as_ref().is_some_and(|current| current.version >= version) {
            return Ok(false);
        }
        let ReplayInto::SideLog { side_log, closed } = into else {
            let new = NewObject { table, key, value, expires_at, timestamp };
            self.store_version(&epoch, &mut guard, current, new, version, (None, None), None)?;
            return Ok(true);
        };
        let prefix;
        let object = match content {
            Some(content) => AppendEntry::new(EntryType::Object, content),
            None => {
                prefix = ObjectPrefix::new(table, version, timestamp, expires_at, key, value);
                AppendEntry {
                    entry_type: EntryType::Object,
                    pieces: [prefix.as_bytes(), key, value],
                }
            }
        };
        let mut append = |entry: &AppendEntry<'_>| {
            let (reference, full) = side_log.append(&self.log, entry).map_err(append_error)?;
            if let Some(full) = full {
                closed(full);
            }
            Ok::<_, ObjectError>(reference)
        };
        // The older version this store held dies with a tombstone in the side log (it is in
        // the log, so a later replay of this store must see it die). The tombstone goes
        // first: if the object then finds no room, nothing unreferenced holds an object.
        if let Some(current) = &current {
            let tombstone = TombstonePrefix::new(&TombstoneView {
                table,
                segment_id: self.log.segment_of(current.reference),
                object_version: current.version,
                timestamp,
                key,
            });
            append(&tombstone_entry(&tombstone, key))?;
        }
        let reference = append(&object)?;
        let new_bytes = object.entry_bytes() as u64;
        match current {
            Some(current) => {
                guard.replace(current.slot, reference.0);
                let old_bytes =
                    self.free_index_entry(&epoch, (guard.bucket_index(), current.reference), table);
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
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use stratus_types::{HashRange, RejectRules, ServerId};

    use super::*;
    use crate::{ByteSink, CleanStep, Expiry, StoreConfig};

    const TABLE: TableId = TableId(3);

    struct Collect(Vec<u8>);

    impl ByteSink for Collect {
        fn put_slice(&mut self, bytes: &[u8]) {
            self.0.extend_from_slice(bytes);
        }
    }

    fn read(store: &ObjectStore, key: &[u8]) -> Option<(Version, Vec<u8>)> {
        let mut value = Collect(Vec::new());
        let hash = key_hash(TABLE, key);
        store
            .read(TABLE, key, hash, &RejectRules::NONE, WallTime::from_seconds(0), &mut value)
            .ok()
            .map(|v| (v, value.0))
    }

    /// Key → its object (version and value), or `None` once removed.
    type Model = BTreeMap<Vec<u8>, Option<(Version, Vec<u8>)>>;

    /// A store after many writes, overwrites and removes (and cleaning), and what it holds.
    fn source() -> (ObjectStore, Model) {
        let store = ObjectStore::new(StoreConfig::for_testing(), ServerId(9)).unwrap();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut model = BTreeMap::new();
        for step in 0..6_000u64 {
            let key = format!("key-{}", next() % 300).into_bytes();
            let hash = key_hash(TABLE, &key);
            if next() % 5 == 0 {
                store
                    .remove(TABLE, &key, hash, &RejectRules::NONE, WallTime::from_seconds(1))
                    .unwrap();
                model.insert(key, None);
            } else {
                let value = vec![(step % 251) as u8; (next() % 3_000) as usize];
                let version = store
                    .write(
                        TABLE,
                        &key,
                        hash,
                        &value,
                        &RejectRules::NONE,
                        Expiry::Never,
                        WallTime::from_seconds(1),
                    )
                    .unwrap();
                model.insert(key, Some((version, value)));
            }
            if step % 1_000 == 999 {
                store.clean_combined_now(WallTime::from_seconds(2));
            }
        }
        (store, model)
    }

    fn segments(store: &ObjectStore) -> Vec<(Vec<u8>, Certificate)> {
        let log = store.log();
        log.segment_ids().into_iter().filter_map(|id| log.segment_contents(id)).collect()
    }

    #[test]
    fn a_collector_fed_verified_replicas_as_they_arrive_replays_like_the_whole_set() {
        let (source, model) = source();
        let copies = segments(&source);
        for (bytes, certificate) in &copies {
            let header = SegmentIterator::new(bytes, certificate).unwrap().next().unwrap();
            let Entry::SegmentHeader(header) = header.unwrap().entry else { panic!("header") };
            stratus_log::verify_replica(bytes, certificate, header.log_id, header.segment_id)
                .unwrap();
        }
        let accept = |_: usize, _: TableId, _: KeyHash| true;
        let mut collector = ReplayCollector::new(&accept);
        // Arrival order: odd-indexed segments first, then the even ones from the end.
        let order: Vec<usize> = (0..copies.len())
            .filter(|index| index % 2 == 1)
            .chain((0..copies.len()).rev().filter(|index| index % 2 == 0))
            .collect();
        for &index in &order {
            let (bytes, certificate) = &copies[index];
            collector.add_verified(index, bytes, certificate).unwrap();
        }
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        let statistics = target
            .replay_collected(collector, WallTime::from_seconds(5), ReplayInto::Head)
            .unwrap();
        assert_eq!(statistics.segments, copies.len() as u64);
        for (key, expected) in &model {
            assert_eq!(&read(&target, key), expected, "key {:?}", String::from_utf8_lossy(key));
        }
    }

    /// A store whose log is full of dead versions has no room for a replay until it cleans;
    /// the shortage says so before anything is appended, and a few combined passes make the
    /// room (a recovery master once failed a partition with LogFull on a log holding under
    /// 1 MB of live data).
    #[test]
    fn a_log_full_of_dead_data_makes_room_for_a_replay_by_cleaning() {
        let (source, model) = source();
        let copies = segments(&source);
        let accept = |_: usize, _: TableId, _: KeyHash| true;
        let mut collector = ReplayCollector::new(&accept);
        for (index, (bytes, certificate)) in copies.iter().enumerate() {
            collector.add(index, bytes, certificate).unwrap();
        }
        let room = collector.room_needed();
        assert!(room.entry_bytes > 0 && room.largest_entry_bytes > 0);
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        assert_eq!(target.replay_room_shortage(&room, 1), None, "an empty log has room");
        // Ten keys overwritten until the log refuses: almost all of it is dead.
        let value = vec![7u8; 8 << 10];
        'fill: for round in 0u64.. {
            for key in 0..10u64 {
                let key = format!("dead-{key}").into_bytes();
                let hash = key_hash(TABLE, &key);
                let rules = RejectRules::NONE;
                let now = WallTime::from_seconds(round as u32);
                match target.write(TABLE, &key, hash, &value, &rules, Expiry::Never, now) {
                    Ok(_) => {}
                    Err(crate::ObjectError::LogFull) => break 'fill,
                    Err(error) => panic!("{error:?}"),
                }
            }
        }
        let shortage = target.replay_room_shortage(&room, 1).expect("no room in a full log");
        assert!(shortage.memory_short(), "{shortage}");
        assert!(shortage.to_string().contains("--log-mib"), "{shortage}");
        let mut passes = 0;
        while let Some(shortage) = target.replay_room_shortage(&room, 1) {
            passes += 1;
            assert!(passes <= 32, "cleaning made no room: {shortage}");
            match target.clean_combined_step(WallTime::from_seconds(100), !shortage.memory_short())
            {
                Some(CleanStep::Finished(_)) => {}
                other => panic!("a pass without replication finishes at once: {other:?}"),
            }
        }
        target.replay_collected(collector, WallTime::from_seconds(101), ReplayInto::Head).unwrap();
        for (key, expected) in &model {
            assert_eq!(&read(&target, key), expected, "key {:?}", String::from_utf8_lossy(key));
        }
        // More than the whole log can hold is short whatever is cleaned.
        let huge = ReplayRoom { entry_bytes: 64 << 20, largest_entry_bytes: 1_000 };
        assert!(target.replay_room_shortage(&huge, 1).is_some_and(|short| short.memory_short()));
    }

    /// Replaying every segment of a log, in any order, rebuilds exactly its objects with
    /// their versions; removed keys stay removed; new versions stay above the replayed ones.
    #[test]
    fn replay_in_any_order_rebuilds_the_store() {
        let (source, model) = source();
        let mut copies = segments(&source);
        copies.reverse();
        let third = copies.len() / 3;
        copies.rotate_left(third);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        let statistics = target.replay(&borrowed, &|_, _| true, WallTime::from_seconds(5)).unwrap();
        assert_eq!(statistics.segments, copies.len() as u64);
        for (key, expected) in &model {
            assert_eq!(&read(&target, key), expected, "key {:?}", String::from_utf8_lossy(key));
        }
        // Replaying again changes nothing.
        let again = target.replay(&borrowed, &|_, _| true, WallTime::from_seconds(5)).unwrap();
        assert_eq!(again.objects_replayed, 0);
        // A new object gets a version above every replayed one (the safe version was
        // raised), so no version of the replayed log is ever reused.
        let newest = model.values().flatten().map(|(version, _)| *version).max().unwrap();
        let key = b"a-key-never-written";
        let version = target
            .write(
                TABLE,
                key,
                key_hash(TABLE, key),
                b"x",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(6),
            )
            .unwrap();
        assert!(version > newest);
    }

    /// Replay into a side log: the objects are readable through the index at once but not in
    /// the log (its segments are beside it) until fused; full side segments are reported as
    /// they close; after fusing, the target's own log replays into exactly the source's
    /// objects, safe version included.
    #[test]
    fn a_side_log_replay_joins_the_log_only_when_fused() {
        let (source, mut model) = source();
        // Enough more objects that the replay fills several side segments.
        for index in 0..2_500u32 {
            let key = format!("bulk-{index}").into_bytes();
            let value = vec![index as u8; 1_000];
            let hash = key_hash(TABLE, &key);
            let version = source
                .write(
                    TABLE,
                    &key,
                    hash,
                    &value,
                    &RejectRules::NONE,
                    Expiry::Never,
                    WallTime::from_seconds(2),
                )
                .unwrap();
            model.insert(key, Some((version, value)));
        }
        let copies = segments(&source);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        let in_log_before = target.log().segment_ids();
        let mut side_log = SideLog::new(AppendPriority::Normal);
        let mut closed = Vec::new();
        let into =
            ReplayInto::SideLog { side_log: &mut side_log, closed: &mut |id| closed.push(id) };
        target
            .replay_filtered(&borrowed, &|_, _, _| true, WallTime::from_seconds(5), into)
            .unwrap();
        let side = side_log.segments().to_vec();
        assert!(side.len() >= 2, "the test needs more than one side segment");
        assert_eq!(closed, side[..side.len() - 1], "every side segment but the last closed");
        assert_eq!(target.log().segment_ids(), in_log_before, "nothing joined the log yet");
        for (key, expected) in &model {
            assert_eq!(&read(&target, key), expected);
        }
        let head = target.log().fuse_side_segments(&side, AppendPriority::Normal).unwrap();
        let in_log = target.log().segment_ids();
        assert!(side.iter().all(|id| in_log.contains(id)) && in_log.contains(&head));
        // A recovery of the target (its log alone) finds every object again.
        let copies = segments(&target);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let third = ObjectStore::new(StoreConfig::for_testing(), ServerId(11)).unwrap();
        third.replay(&borrowed, &|_, _| true, WallTime::from_seconds(6)).unwrap();
        for (key, expected) in &model {
            assert_eq!(&read(&third, key), expected);
        }
        let newest = model.values().flatten().map(|(version, _)| *version).max().unwrap();
        let key = b"a-key-never-written";
        let version = third
            .write(
                TABLE,
                key,
                key_hash(TABLE, key),
                b"x",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(7),
            )
            .unwrap();
        assert!(version > newest, "the fused head carried the raised safe version");
    }

    /// An abandoned side log leaves nothing: its objects are gone from the index (dropped by
    /// range first), its segments never join the log, replication hears they are dropped, and
    /// their memory comes back.
    #[test]
    fn an_abandoned_side_log_leaves_nothing_behind() {
        let (source, _) = source();
        let copies = segments(&source);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        let free_before = target.statistics().seglets_free;
        let mut side_log = SideLog::new(AppendPriority::Normal);
        let into = ReplayInto::SideLog { side_log: &mut side_log, closed: &mut |_| {} };
        let replayed = target
            .replay_filtered(&borrowed, &|_, _, _| true, WallTime::from_seconds(5), into)
            .unwrap();
        assert!(replayed.objects_replayed > 0);
        assert!(target.statistics().seglets_free < free_before);
        target.drop_range(TABLE, HashRange::FULL);
        target.log().abandon_side_segments(side_log.segments());
        assert_eq!(target.log().take_dropped_segments(), side_log.segments());
        assert_eq!(target.statistics().objects_live, 0);
        assert!(target.log().segment_ids().iter().all(|id| !side_log.segments().contains(id)));
        target.log().reclaim();
        assert_eq!(target.statistics().seglets_free, free_before, "side memory returned");
    }

    /// A migrated object the source removed is removed here only below the source's safe
    /// version, and the safe version is raised past it.
    #[test]
    fn a_migrated_removal_removes_only_older_versions() {
        let store = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        store
            .insert_migrated(TABLE, b"old", b"v", Version(5), None, WallTime::from_seconds(1))
            .unwrap();
        assert!(store
            .remove_migrated(TABLE, b"old", Version(20), WallTime::from_seconds(2))
            .unwrap());
        assert!(!store
            .remove_migrated(TABLE, b"absent", Version(20), WallTime::from_seconds(2))
            .unwrap());
        assert_eq!(read(&store, b"old"), None);
        let key = b"old";
        let again = store.write(
            TABLE,
            key,
            key_hash(TABLE, key),
            b"x",
            &RejectRules::NONE,
            Expiry::Never,
            WallTime::from_seconds(3),
        );
        assert!(again.unwrap() >= Version(20), "a re-created object is newer than the removal");
        store
            .insert_migrated(TABLE, b"newer", b"v", Version(50), None, WallTime::from_seconds(1))
            .unwrap();
        assert!(!store
            .remove_migrated(TABLE, b"newer", Version(20), WallTime::from_seconds(2))
            .unwrap());
        assert_eq!(read(&store, b"newer").map(|(version, _)| version), Some(Version(50)));
        assert_eq!(
            store.remove_migrated(TABLE, b"", Version(20), WallTime::from_seconds(2)),
            Err(ObjectError::InvalidKey)
        );
    }

    /// The safe version a replay raised survives a replay of the replaying store: a key
    /// removed in the first log leaves no object or tombstone behind, so only the safe version
    /// in the new store's log keeps its versions from being handed out again.
    #[test]
    fn a_replayed_safe_version_survives_the_next_replay() {
        let first = ObjectStore::new(StoreConfig::for_testing(), ServerId(9)).unwrap();
        let key = b"removed-key";
        let hash = key_hash(TABLE, key);
        let mut newest = Version(0);
        for round in 0..5u8 {
            newest = first
                .write(
                    TABLE,
                    key,
                    hash,
                    &[round; 16],
                    &RejectRules::NONE,
                    Expiry::Never,
                    WallTime::from_seconds(1),
                )
                .unwrap();
        }
        first.remove(TABLE, key, hash, &RejectRules::NONE, WallTime::from_seconds(1)).unwrap();
        let copies = segments(&first);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let second = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        second.replay(&borrowed, &|_, _| true, WallTime::from_seconds(5)).unwrap();
        assert_eq!(read(&second, key), None, "removed stays removed");
        // The same into a side log: nothing is live, so the side log stays empty and no
        // fusing head will come; the replay's own head records the floor.
        let side = ObjectStore::new(StoreConfig::for_testing(), ServerId(12)).unwrap();
        let mut side_log = SideLog::new(AppendPriority::Normal);
        let into = ReplayInto::SideLog { side_log: &mut side_log, closed: &mut |_| {} };
        side.replay_filtered(&borrowed, &|_, _, _| true, WallTime::from_seconds(5), into).unwrap();
        assert!(side_log.segments().is_empty());
        let copies_of_side = segments(&side);
        let borrowed_side: Vec<(&[u8], Certificate)> =
            copies_of_side.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let after_side = ObjectStore::new(StoreConfig::for_testing(), ServerId(13)).unwrap();
        after_side.replay(&borrowed_side, &|_, _| true, WallTime::from_seconds(6)).unwrap();
        let recreated = after_side
            .write(
                TABLE,
                key,
                hash,
                b"again",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(7),
            )
            .unwrap();
        assert!(recreated > newest, "version {recreated:?} reused after a side-log replay");
        // The second store crashes before anything else is written; a third replays its log.
        let copies = segments(&second);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let third = ObjectStore::new(StoreConfig::for_testing(), ServerId(11)).unwrap();
        third.replay(&borrowed, &|_, _| true, WallTime::from_seconds(6)).unwrap();
        let recreated = third
            .write(
                TABLE,
                key,
                hash,
                b"again",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(7),
            )
            .unwrap();
        assert!(recreated > newest, "version {recreated:?} reused (the key reached {newest:?})");
    }

    /// Only keys the filter accepts are replayed (a recovery master takes one partition).
    #[test]
    fn replay_keeps_only_the_accepted_tablets() {
        let (source, model) = source();
        let copies = segments(&source);
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let low_half = HashRange { start: 0, end: u64::MAX / 2 };
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        target
            .replay(
                &borrowed,
                &|table, hash| table == TABLE && low_half.contains(hash),
                WallTime::from_seconds(5),
            )
            .unwrap();
        for (key, expected) in &model {
            let hash = key_hash(TABLE, key);
            let wanted = if low_half.contains(hash) { expected.clone() } else { None };
            assert_eq!(read(&target, key), wanted);
        }
    }

    /// A corrupt replica is refused whole, naming the segment, so another can be read.
    #[test]
    fn a_corrupt_segment_is_refused() {
        let (source, _) = source();
        let mut copies = segments(&source);
        let victim = copies.len() / 2;
        let middle = copies[victim].0.len() / 2;
        copies[victim].0[middle] ^= 0x40;
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        match target.replay(&borrowed, &|_, _| true, WallTime::from_seconds(5)) {
            Err(ReplayError::CorruptSegment { index, .. }) => assert_eq!(index, victim),
            other => panic!("a corrupt segment was accepted: {other:?}"),
        }
    }

    /// A migrated object keeps its version, a newer one held is kept, and new versions stay
    /// above it.
    #[test]
    fn migrated_objects_keep_their_versions() {
        let store = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        assert_eq!(
            store.insert_migrated(TABLE, b"k", b"v9", Version(9), None, WallTime::from_seconds(1)),
            Ok(true)
        );
        assert_eq!(read(&store, b"k"), Some((Version(9), b"v9".to_vec())));
        assert_eq!(
            store.insert_migrated(TABLE, b"k", b"v5", Version(5), None, WallTime::from_seconds(1)),
            Ok(false)
        );
        assert_eq!(read(&store, b"k"), Some((Version(9), b"v9".to_vec())));
        let other = b"never-migrated";
        let version = store
            .write(
                TABLE,
                other,
                key_hash(TABLE, other),
                b"x",
                &RejectRules::NONE,
                Expiry::Never,
                WallTime::from_seconds(2),
            )
            .unwrap();
        assert!(version > Version(9));
        assert_eq!(
            store.insert_migrated(TABLE, b"", b"v", Version(3), None, WallTime::from_seconds(1)),
            Err(ObjectError::InvalidKey)
        );
        let too_large = vec![0u8; StoreConfig::for_testing().value_bytes_max as usize + 1];
        assert_eq!(
            store.insert_migrated(
                TABLE,
                b"big",
                &too_large,
                Version(3),
                None,
                WallTime::from_seconds(1)
            ),
            Err(ObjectError::ValueTooLarge)
        );
    }

    /// Objects the filter refuses for their segment are not replayed, while tombstones and
    /// objects of accepted segments are.
    #[test]
    fn a_filter_by_segment_skips_objects_of_older_segments() {
        let source = ObjectStore::new(StoreConfig::for_testing(), ServerId(9)).unwrap();
        let write = |key: &[u8], value: &[u8]| {
            source
                .write(
                    TABLE,
                    key,
                    key_hash(TABLE, key),
                    value,
                    &RejectRules::NONE,
                    Expiry::Never,
                    WallTime::from_seconds(1),
                )
                .unwrap()
        };
        write(b"stale", b"old");
        let creation = source.log().roll_head(stratus_log::AppendPriority::Normal).unwrap();
        write(b"fresh", b"new");
        let copies = segments(&source);
        let ids: Vec<stratus_types::SegmentId> = source
            .log()
            .segment_ids()
            .into_iter()
            .filter(|id| source.log().segment_contents(*id).is_some())
            .collect();
        assert_eq!(ids.len(), copies.len());
        let borrowed: Vec<(&[u8], Certificate)> =
            copies.iter().map(|(bytes, certificate)| (&bytes[..], *certificate)).collect();
        let target = ObjectStore::new(StoreConfig::for_testing(), ServerId(10)).unwrap();
        let accept = |index: usize, _: TableId, _: KeyHash| ids[index] >= creation;
        target
            .replay_filtered(&borrowed, &accept, WallTime::from_seconds(5), ReplayInto::Head)
            .unwrap();
        assert_eq!(read(&target, b"stale"), None);
        assert_eq!(read(&target, b"fresh").map(|(_, value)| value), Some(b"new".to_vec()));
    }
}
