//! The coordinator's durable records and their byte layout (docs/design/coordinator-records.md).
//!
//! Keys in the MetaStore:
//! - `counter/next-server-id`, `counter/next-table-id`, `counter/assignment-epoch`,
//!   `counter/next-client-lease`: u64 little-endian.
//! - `server/<id, 20 decimal digits>`: a [`ServerEntry`].
//! - `table/<name>`: a [`TableRecord`] with its tablets.
//! - `loghead/<id, 20 decimal digits>`: a master's [`LogHead`].
//! - `user/<name>`: a named user ([`UserRecord`]: stored keys, never a password).

use std::collections::BTreeMap;

use stratus_meta::{MetaError, MetaOperation, MetaStore};
use stratus_types::{HashRange, SegmentId, ServerId, TableId, Tier};
use stratus_wire::{ServerEntry, ServerStatus, ServiceMask, UserRecord};

/// Key of the next server id counter.
pub const NEXT_SERVER_ID_KEY: &str = "counter/next-server-id";
/// Key of the next table id counter.
pub const NEXT_TABLE_ID_KEY: &str = "counter/next-table-id";
/// Key of the client lease ids reserved so far: every id below it may have been granted
/// (docs/design/exactly-once.md, "Leases across coordinator restarts and failover").
pub const NEXT_CLIENT_LEASE_KEY: &str = "counter/next-client-lease";
/// Key of the last tablet assignment epoch handed out (wire-protocol.md, "Assignment epochs").
pub const ASSIGNMENT_EPOCH_KEY: &str = "counter/assignment-epoch";
const SERVER_PREFIX: &str = "server/";
const TABLE_PREFIX: &str = "table/";
const LOG_HEAD_PREFIX: &str = "loghead/";
const USER_PREFIX: &str = "user/";
/// The format byte that opens a user record; the rest is the wire protocol's user record.
const USER_RECORD_FORMAT_VERSION: u8 = 1;
const RECORD_FORMAT_VERSION: u8 = 1;
/// Server records since failure domains: the domain follows the address. Version 1 server
/// records are still read (no domain).
const SERVER_RECORD_FORMAT_VERSION: u8 = 2;
/// Table records since storage tiers: the table's tier follows its id. Version 2 records
/// (each tablet with its creation segment) and version 1 records (creation segment 0) are
/// still read, as memory tables: every table created before tiers existed is one.
const TABLE_RECORD_FORMAT_VERSION: u8 = 3;

/// One tablet of a table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabletRecord {
    /// Its key-hash range.
    pub range: HashRange,
    /// The master serving it.
    pub owner: ServerId,
    /// Where the tablet starts in its owner's log: recovery ignores the tablet's objects in
    /// older segments of that log, left from an earlier time the owner served the range (a
    /// tablet migrated away and back, or recovered onto a master that once had it). 0 for a
    /// tablet its owner has had since the table was created.
    pub creation_segment: SegmentId,
}

/// A table and its tablets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableRecord {
    /// The table's id.
    pub table_id: TableId,
    /// Where its objects live, chosen at creation and never changed: every assignment of one
    /// of its tablets carries it.
    pub tier: Tier,
    /// Its tablets, ascending by range, covering the whole hash space.
    pub tablets: Vec<TabletRecord>,
}

/// What splitting a table's tablet at a hash comes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TabletSplit {
    /// The hash already starts a tablet: nothing to do.
    AlreadyBoundary,
    /// The tablet at `index` becomes `low` and `high` (same owner).
    Split {
        /// Position of the tablet in the table's list.
        index: usize,
        /// `[start, split hash − 1]`.
        low: TabletRecord,
        /// `[split hash, end]`.
        high: TabletRecord,
    },
    /// No tablet holds the hash: the tablets do not cover the hash space (corrupt).
    Uncovered,
}

impl TableRecord {
    /// How the tablet holding `split_hash` would be cut there (nothing changes yet).
    pub fn split_at(&self, split_hash: u64) -> TabletSplit {
        let hash = stratus_types::KeyHash(split_hash);
        let Some(index) = self.tablets.iter().position(|tablet| tablet.range.contains(hash)) else {
            return TabletSplit::Uncovered;
        };
        let tablet = &self.tablets[index];
        if tablet.range.start == split_hash {
            return TabletSplit::AlreadyBoundary;
        }
        // start < split_hash ≤ end, so neither bound under- or overflows.
        let low = TabletRecord {
            range: HashRange { start: tablet.range.start, end: split_hash - 1 },
            owner: tablet.owner,
            creation_segment: tablet.creation_segment,
        };
        let high = TabletRecord {
            range: HashRange { start: split_hash, end: tablet.range.end },
            owner: tablet.owner,
            creation_segment: tablet.creation_segment,
        };
        TabletSplit::Split { index, low, high }
    }

    /// Replaces the tablet at `index` by `low` and `high` (as [`TableRecord::split_at`] said).
    pub fn apply_split(&mut self, index: usize, low: TabletRecord, high: TabletRecord) {
        self.tablets.splice(index..=index, [low, high]);
    }
}

/// The newest log head a master reported before acknowledging any write in it: recovery must
/// find this segment, at this replica epoch or newer, or the log it sees is not the whole log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogHead {
    /// The head segment.
    pub segment_id: SegmentId,
    /// Its replica epoch.
    pub epoch: u64,
}

/// Everything the coordinator keeps, as loaded from the MetaStore.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordinatorState {
    /// The next server index to hand out (indexes start at 1; a server new to the cluster
    /// gets the id of this index at generation 0).
    pub next_server_index: u64,
    /// The next table id to hand out (ids start at 1).
    pub next_table_id: u64,
    /// The last tablet assignment epoch handed out (0: none yet).
    pub assignment_epoch: u64,
    /// Client lease ids below this may have been granted (ids start at 1).
    pub client_lease_ids_reserved: u64,
    /// Servers by id.
    pub servers: BTreeMap<ServerId, ServerEntry>,
    /// Tables by name.
    pub tables: BTreeMap<String, TableRecord>,
    /// Masters' newest reported log heads (none: the master never replicated a write). The
    /// coordinator moves them under a lock of their own when it opens.
    pub log_heads: BTreeMap<ServerId, LogHead>,
    /// Named users by name.
    pub users: BTreeMap<String, UserRecord>,
}

impl CoordinatorState {
    /// The servers in `status`.
    pub fn servers_in(&self, status: ServerStatus) -> impl Iterator<Item = &ServerEntry> {
        self.servers.values().filter(move |server| server.status == status)
    }

    /// The servers that crashed or stopped and are not recovered yet.
    pub fn servers_awaiting_recovery(&self) -> impl Iterator<Item = &ServerEntry> {
        self.servers.values().filter(|server| server.status.awaits_recovery())
    }

    /// The id the next server to enlist gets: a restart at `previous`'s index (the next
    /// generation of it) when the coordinator issued `previous`, otherwise a new index at
    /// generation 0. The second value says whether `previous` was honoured.
    pub fn id_for_enlistment(&self, previous: ServerId) -> (ServerId, bool) {
        let generations_of_index = self
            .servers
            .keys()
            .filter(|id| previous.is_valid() && id.index() == previous.index())
            .map(|id| id.generation());
        match generations_of_index.max() {
            Some(newest) => (ServerId::new(previous.index(), newest.saturating_add(1)), true),
            None => {
                let index = u32::try_from(self.next_server_index)
                    .expect("indexes stay below SERVERS_MAX, far under 2^32");
                (ServerId::new(index, 0), false)
            }
        }
    }

    /// A new tablet assignment epoch, above every one handed out before, and the operation
    /// that persists it. It goes in the batch that persists the decision it belongs to, and no
    /// message carries it before that batch is durable, so that a restarted coordinator never
    /// hands out an epoch a master has seen. (A failed batch leaves a gap, which is harmless.)
    pub fn next_assignment_epoch(&mut self) -> (u64, MetaOperation) {
        self.assignment_epoch += 1;
        (self.assignment_epoch, put_counter(ASSIGNMENT_EPOCH_KEY, self.assignment_epoch))
    }

    /// True if `server_id` owns a tablet of any table.
    pub fn owns_tablets(&self, server_id: ServerId) -> bool {
        self.tables
            .values()
            .any(|table| table.tablets.iter().any(|tablet| tablet.owner == server_id))
    }
}

/// The operation that stores `server_id`'s log head.
pub fn put_log_head(server_id: ServerId, head: LogHead) -> MetaOperation {
    let mut value = vec![RECORD_FORMAT_VERSION];
    value.extend_from_slice(&head.segment_id.0.to_le_bytes());
    value.extend_from_slice(&head.epoch.to_le_bytes());
    MetaOperation::Put { key: format!("{LOG_HEAD_PREFIX}{:020}", server_id.0), value }
}

fn decode_log_head(key: &str, bytes: &[u8]) -> Result<(ServerId, LogHead), MetaError> {
    let server_id = key
        .strip_prefix(LOG_HEAD_PREFIX)
        .and_then(|digits| digits.parse::<u64>().ok())
        .map(ServerId)
        .ok_or_else(|| corrupt(key, "log head key without a server id"))?;
    let mut reader = RecordReader { bytes, key };
    if reader.u8()? != RECORD_FORMAT_VERSION {
        return Err(corrupt(key, "unknown record version"));
    }
    let head = LogHead { segment_id: SegmentId(reader.u64()?), epoch: reader.u64()? };
    reader.finish()?;
    Ok((server_id, head))
}

/// The MetaStore key of a server.
pub fn server_key(server_id: ServerId) -> String {
    format!("{SERVER_PREFIX}{:020}", server_id.0)
}

/// The MetaStore key of user `name`.
pub fn user_key(name: &str) -> String {
    format!("{USER_PREFIX}{name}")
}

/// The operation that stores `user` (its stored keys, never a password).
pub fn put_user(user: &UserRecord) -> MetaOperation {
    let mut value = vec![USER_RECORD_FORMAT_VERSION];
    value.extend_from_slice(&stratus_wire::encode_user_record(user));
    MetaOperation::Put { key: user_key(&user.name), value }
}

fn decode_user(key: &str, bytes: &[u8]) -> Result<UserRecord, MetaError> {
    match bytes.split_first() {
        Some((&USER_RECORD_FORMAT_VERSION, rest)) => {
            let user = stratus_wire::decode_user_record(bytes::Bytes::copy_from_slice(rest))
                .map_err(|error| corrupt(key, &format!("user record: {error:?}")))?;
            if key.strip_prefix(USER_PREFIX) != Some(user.name.as_str()) {
                return Err(corrupt(key, "user record names another user"));
            }
            Ok(user)
        }
        _ => Err(corrupt(key, "unknown user record format")),
    }
}

/// The MetaStore key of a table.
pub fn table_key(name: &str) -> String {
    format!("{TABLE_PREFIX}{name}")
}

/// The operation that stores counter `key` with `value`.
pub fn put_counter(key: &str, value: u64) -> MetaOperation {
    MetaOperation::Put { key: key.to_string(), value: value.to_le_bytes().to_vec() }
}

/// The operation that stores `server`.
pub fn put_server(server: &ServerEntry) -> MetaOperation {
    let mut value = vec![SERVER_RECORD_FORMAT_VERSION];
    value.extend_from_slice(&server.server_id.0.to_le_bytes());
    value.extend_from_slice(&server.services.0.to_le_bytes());
    value.push(server.status as u8);
    let address = server.address.as_bytes();
    let address_length = u16::try_from(address.len()).expect("addresses are checked at enlistment");
    value.extend_from_slice(&address_length.to_le_bytes());
    value.extend_from_slice(address);
    let domain = server.failure_domain.as_bytes();
    let domain_length =
        u8::try_from(domain.len()).expect("failure domains are checked at enlistment");
    value.push(domain_length);
    value.extend_from_slice(domain);
    MetaOperation::Put { key: server_key(server.server_id), value }
}

/// The operation that stores table `name`.
pub fn put_table(name: &str, table: &TableRecord) -> MetaOperation {
    let mut value = vec![TABLE_RECORD_FORMAT_VERSION];
    value.extend_from_slice(&table.table_id.0.to_le_bytes());
    value.push(table.tier.code());
    let count =
        u32::try_from(table.tablets.len()).expect("tablet count is bounded by the span limit");
    value.extend_from_slice(&count.to_le_bytes());
    for tablet in &table.tablets {
        value.extend_from_slice(&tablet.range.start.to_le_bytes());
        value.extend_from_slice(&tablet.range.end.to_le_bytes());
        value.extend_from_slice(&tablet.owner.0.to_le_bytes());
        value.extend_from_slice(&tablet.creation_segment.0.to_le_bytes());
    }
    MetaOperation::Put { key: table_key(name), value }
}

/// Reads fixed-width fields from a record, failing on truncation.
struct RecordReader<'a> {
    bytes: &'a [u8],
    key: &'a str,
}

impl<'a> RecordReader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], MetaError> {
        if self.bytes.len() < count {
            return Err(corrupt(self.key, "record truncated"));
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, MetaError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, MetaError> {
        let bytes = self.take(2)?;
        Ok(u16::from_le_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, MetaError> {
        let mut array = [0u8; 4];
        array.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(array))
    }

    fn u64(&mut self) -> Result<u64, MetaError> {
        let mut array = [0u8; 8];
        array.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(array))
    }

    fn finish(&self) -> Result<(), MetaError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(corrupt(self.key, "trailing bytes"))
        }
    }
}

fn corrupt(key: &str, reason: &str) -> MetaError {
    MetaError::Corrupt { offset: 0, reason: format!("coordinator record {key}: {reason}") }
}

fn decode_server(key: &str, bytes: &[u8]) -> Result<ServerEntry, MetaError> {
    let mut reader = RecordReader { bytes, key };
    let format_version = reader.u8()?;
    if format_version != 1 && format_version != SERVER_RECORD_FORMAT_VERSION {
        return Err(corrupt(key, "unknown record version"));
    }
    let server_id = ServerId(reader.u64()?);
    let services = ServiceMask(reader.u32()?);
    let status = match reader.u8()? {
        0 => ServerStatus::Up,
        1 => ServerStatus::Crashed,
        2 => ServerStatus::Removed,
        3 => ServerStatus::Stopped,
        _ => return Err(corrupt(key, "unknown server status")),
    };
    let address_length = usize::from(reader.u16()?);
    let address = String::from_utf8(reader.take(address_length)?.to_vec())
        .map_err(|_| corrupt(key, "address is not UTF-8"))?;
    let failure_domain = if format_version == 1 {
        String::new()
    } else {
        let length = usize::from(reader.u8()?);
        String::from_utf8(reader.take(length)?.to_vec())
            .map_err(|_| corrupt(key, "failure domain is not UTF-8"))?
    };
    reader.finish()?;
    Ok(ServerEntry { server_id, address, services, status, failure_domain })
}

fn decode_table(key: &str, bytes: &[u8]) -> Result<TableRecord, MetaError> {
    let mut reader = RecordReader { bytes, key };
    let format_version = reader.u8()?;
    if !(1..=TABLE_RECORD_FORMAT_VERSION).contains(&format_version) {
        return Err(corrupt(key, "unknown record version"));
    }
    let table_id = TableId(reader.u64()?);
    let tier = if format_version < 3 {
        Tier::Memory
    } else {
        // An unknown code is a record written by a newer version: refuse to start rather
        // than serve the table from the wrong tier.
        let code = reader.u8()?;
        Tier::from_code(code)
            .ok_or_else(|| corrupt(key, &format!("unknown storage tier code {code}")))?
    };
    let count = reader.u32()?;
    let mut tablets = Vec::new();
    for _ in 0..count {
        let start = reader.u64()?;
        let end = reader.u64()?;
        let owner = ServerId(reader.u64()?);
        let creation_segment = SegmentId(if format_version == 1 { 0 } else { reader.u64()? });
        let range =
            HashRange::new(start, end).ok_or_else(|| corrupt(key, "tablet range start > end"))?;
        tablets.push(TabletRecord { range, owner, creation_segment });
    }
    reader.finish()?;
    Ok(TableRecord { table_id, tier, tablets })
}

fn decode_counter(key: &str, bytes: &[u8]) -> Result<u64, MetaError> {
    let mut reader = RecordReader { bytes, key };
    let value = reader.u64()?;
    reader.finish()?;
    Ok(value)
}

impl CoordinatorState {
    /// Loads the state from `store` (an empty store gives the initial state).
    pub fn load(store: &dyn MetaStore) -> Result<CoordinatorState, MetaError> {
        let mut state = CoordinatorState {
            next_server_index: 1,
            next_table_id: 1,
            client_lease_ids_reserved: 1,
            ..Default::default()
        };
        if let Some(bytes) = store.get(NEXT_SERVER_ID_KEY)? {
            state.next_server_index = decode_counter(NEXT_SERVER_ID_KEY, &bytes)?;
        }
        if let Some(bytes) = store.get(NEXT_TABLE_ID_KEY)? {
            state.next_table_id = decode_counter(NEXT_TABLE_ID_KEY, &bytes)?;
        }
        if let Some(bytes) = store.get(ASSIGNMENT_EPOCH_KEY)? {
            state.assignment_epoch = decode_counter(ASSIGNMENT_EPOCH_KEY, &bytes)?;
        }
        if let Some(bytes) = store.get(NEXT_CLIENT_LEASE_KEY)? {
            state.client_lease_ids_reserved = decode_counter(NEXT_CLIENT_LEASE_KEY, &bytes)?.max(1);
        }
        for (key, bytes) in store.scan_prefix(SERVER_PREFIX)? {
            let server = decode_server(&key, &bytes)?;
            if u64::from(server.server_id.index()) >= state.next_server_index {
                return Err(corrupt(&key, "server index at or above the next-index counter"));
            }
            state.servers.insert(server.server_id, server);
        }
        for (key, bytes) in store.scan_prefix(TABLE_PREFIX)? {
            let table = decode_table(&key, &bytes)?;
            if table.table_id.0 >= state.next_table_id {
                return Err(corrupt(&key, "table id at or above the next-id counter"));
            }
            let name = key.strip_prefix(TABLE_PREFIX).unwrap_or_default().to_string();
            state.tables.insert(name, table);
        }
        for (key, bytes) in store.scan_prefix(USER_PREFIX)? {
            let user = decode_user(&key, &bytes)?;
            state.users.insert(user.name.clone(), user);
        }
        for (key, bytes) in store.scan_prefix(LOG_HEAD_PREFIX)? {
            let (server_id, head) = decode_log_head(&key, &bytes)?;
            state.log_heads.insert(server_id, head);
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_meta::MemoryMetaStore;

    #[test]
    fn records_round_trip_through_a_store() {
        let store = MemoryMetaStore::new();
        let server = ServerEntry {
            server_id: ServerId(3),
            address: "127.0.0.1:7401".to_string(),
            services: ServiceMask(ServiceMask::MASTER),
            status: ServerStatus::Up,
            failure_domain: "rack-2".to_string(),
        };
        let table = TableRecord {
            table_id: TableId(9),
            tier: Tier::Flash,
            tablets: HashRange::split_evenly(2)
                .into_iter()
                .enumerate()
                .map(|(index, range)| TabletRecord {
                    range,
                    owner: ServerId(3),
                    creation_segment: SegmentId(index as u64 * 7),
                })
                .collect(),
        };
        store
            .apply(&[
                put_counter(NEXT_SERVER_ID_KEY, 4),
                put_counter(NEXT_TABLE_ID_KEY, 10),
                put_server(&server),
                put_table("users", &table),
                put_log_head(ServerId(3), LogHead { segment_id: SegmentId(12), epoch: 2 }),
            ])
            .unwrap();
        let state = CoordinatorState::load(&store).unwrap();
        assert_eq!(
            state.log_heads.get(&ServerId(3)),
            Some(&LogHead { segment_id: SegmentId(12), epoch: 2 })
        );
        assert_eq!(state.next_server_index, 4);
        assert_eq!(state.next_table_id, 10);
        assert_eq!(state.servers.get(&ServerId(3)), Some(&server));
        assert_eq!(state.tables.get("users"), Some(&table));
        assert_eq!(state.assignment_epoch, 0, "none handed out yet");
    }

    #[test]
    fn assignment_epochs_continue_after_a_reload() {
        let store = MemoryMetaStore::new();
        let mut state = CoordinatorState::load(&store).unwrap();
        let (first, persist_first) = state.next_assignment_epoch();
        let (second, persist_second) = state.next_assignment_epoch();
        assert!(first >= 1 && second > first);
        store.apply(&[persist_first, persist_second]).unwrap();
        // A coordinator that restarts (or a standby that takes over) hands out newer ones.
        let mut reloaded = CoordinatorState::load(&store).unwrap();
        let (third, _) = reloaded.next_assignment_epoch();
        assert!(third > second, "{third} after {second}");
    }

    #[test]
    fn splitting_cuts_one_tablet_and_keeps_the_map_covering() {
        let mut table = TableRecord {
            table_id: TableId(1),
            tier: Tier::Memory,
            tablets: HashRange::split_evenly(2)
                .into_iter()
                .zip([ServerId(1), ServerId(2)])
                .map(|(range, owner)| TabletRecord { range, owner, creation_segment: SegmentId(4) })
                .collect(),
        };
        assert_eq!(table.split_at(0), TabletSplit::AlreadyBoundary);
        assert_eq!(table.split_at(1 << 63), TabletSplit::AlreadyBoundary);
        let TabletSplit::Split { index, low, high } = table.split_at(u64::MAX) else {
            panic!("the last hash splits the second tablet");
        };
        assert_eq!(index, 1);
        assert_eq!(low.range, HashRange { start: 1 << 63, end: u64::MAX - 1 });
        assert_eq!(high.range, HashRange { start: u64::MAX, end: u64::MAX });
        assert_eq!((low.owner, high.owner), (ServerId(2), ServerId(2)));
        // Both halves start where the tablet started in the owner's log.
        assert_eq!((low.creation_segment, high.creation_segment), (SegmentId(4), SegmentId(4)));
        table.apply_split(index, low, high);
        let TabletSplit::Split { index, low, high } = table.split_at(1) else {
            panic!("hash 1 splits the first tablet");
        };
        table.apply_split(index, low, high);
        let ranges: Vec<(u64, u64)> =
            table.tablets.iter().map(|tablet| (tablet.range.start, tablet.range.end)).collect();
        assert_eq!(
            ranges,
            vec![(0, 0), (1, (1 << 63) - 1), (1 << 63, u64::MAX - 1), (u64::MAX, u64::MAX)]
        );
        assert_eq!(table.split_at(1), TabletSplit::AlreadyBoundary);
        let empty = TableRecord { table_id: TableId(2), tier: Tier::Memory, tablets: Vec::new() };
        assert_eq!(empty.split_at(5), TabletSplit::Uncovered);
    }

    #[test]
    fn version_1_table_records_load_with_creation_segment_0() {
        let store = MemoryMetaStore::new();
        let mut value = vec![1u8];
        value.extend_from_slice(&5u64.to_le_bytes());
        value.extend_from_slice(&1u32.to_le_bytes());
        for field in [0u64, u64::MAX, 2] {
            value.extend_from_slice(&field.to_le_bytes());
        }
        store
            .apply(&[
                put_counter(NEXT_TABLE_ID_KEY, 6),
                MetaOperation::Put { key: table_key("old"), value },
            ])
            .unwrap();
        let state = CoordinatorState::load(&store).unwrap();
        let expected = TableRecord {
            table_id: TableId(5),
            tier: Tier::Memory,
            tablets: vec![TabletRecord {
                range: HashRange::FULL,
                owner: ServerId(2),
                creation_segment: SegmentId(0),
            }],
        };
        assert_eq!(state.tables.get("old"), Some(&expected));
        // Written back, it is a version 3 record (with the tier) that loads the same.
        let MetaOperation::Put { value, .. } = put_table("old", &expected) else { unreachable!() };
        assert_eq!(value[0], TABLE_RECORD_FORMAT_VERSION);
        assert_eq!(value.len(), 1 + 8 + 1 + 4 + 32);
    }

    #[test]
    fn version_2_table_records_load_as_memory_tables_and_version_3_keeps_the_tier() {
        let store = MemoryMetaStore::new();
        let tablet = TabletRecord {
            range: HashRange::FULL,
            owner: ServerId(2),
            creation_segment: SegmentId(9),
        };
        // A record as the coordinator wrote it before tiers: version 2, no tier byte.
        let mut old = vec![2u8];
        old.extend_from_slice(&5u64.to_le_bytes());
        old.extend_from_slice(&1u32.to_le_bytes());
        for field in [0u64, u64::MAX, 2, 9] {
            old.extend_from_slice(&field.to_le_bytes());
        }
        let flash =
            TableRecord { table_id: TableId(6), tier: Tier::Flash, tablets: vec![tablet.clone()] };
        store
            .apply(&[
                put_counter(NEXT_TABLE_ID_KEY, 7),
                MetaOperation::Put { key: table_key("old"), value: old },
                put_table("new", &flash),
            ])
            .unwrap();
        let state = CoordinatorState::load(&store).unwrap();
        let old = TableRecord { table_id: TableId(5), tier: Tier::Memory, tablets: vec![tablet] };
        assert_eq!(state.tables.get("old"), Some(&old));
        assert_eq!(state.tables.get("new"), Some(&flash));
        // The version 3 layout: format, table id, tier, then the tablets.
        let MetaOperation::Put { value, .. } = put_table("new", &flash) else { unreachable!() };
        assert_eq!(&value[..10], &[3, 6, 0, 0, 0, 0, 0, 0, 0, Tier::Flash.code()]);
    }

    #[test]
    fn a_table_record_with_an_unknown_tier_is_refused() {
        let store = MemoryMetaStore::new();
        let table = TableRecord { table_id: TableId(1), tier: Tier::Flash, tablets: Vec::new() };
        let MetaOperation::Put { key, mut value } = put_table("t", &table) else { unreachable!() };
        value[9] = 7;
        store
            .apply(&[put_counter(NEXT_TABLE_ID_KEY, 2), MetaOperation::Put { key, value }])
            .unwrap();
        let refusal = CoordinatorState::load(&store).unwrap_err();
        assert!(refusal.to_string().contains("unknown storage tier code 7"), "{refusal}");
    }

    #[test]
    fn version_1_server_records_load_without_a_failure_domain() {
        let store = MemoryMetaStore::new();
        let mut value = vec![1u8];
        value.extend_from_slice(&7u64.to_le_bytes());
        value.extend_from_slice(&ServiceMask::BACKUP.to_le_bytes());
        value.push(0);
        value.extend_from_slice(&3u16.to_le_bytes());
        value.extend_from_slice(b"a:1");
        store
            .apply(&[
                put_counter(NEXT_SERVER_ID_KEY, 8),
                MetaOperation::Put { key: server_key(ServerId(7)), value },
            ])
            .unwrap();
        let state = CoordinatorState::load(&store).unwrap();
        let expected = ServerEntry {
            server_id: ServerId(7),
            address: "a:1".to_string(),
            services: ServiceMask(ServiceMask::BACKUP),
            status: ServerStatus::Up,
            failure_domain: String::new(),
        };
        assert_eq!(state.servers.get(&ServerId(7)), Some(&expected));
        // Written back, it is a version 2 record: the domain's length byte follows the address.
        let MetaOperation::Put { value, .. } = put_server(&expected) else { unreachable!() };
        assert_eq!(value[0], SERVER_RECORD_FORMAT_VERSION);
        assert_eq!(value.len(), 1 + 8 + 4 + 1 + 2 + 3 + 1);
        // A version 2 record cut inside its domain is refused.
        let with_domain = ServerEntry { failure_domain: "r1".to_string(), ..expected };
        let MetaOperation::Put { key, mut value } = put_server(&with_domain) else {
            unreachable!()
        };
        value.pop();
        store.apply(&[MetaOperation::Put { key, value }]).unwrap();
        assert!(CoordinatorState::load(&store).is_err());
    }

    #[test]
    fn truncated_records_are_refused() {
        let store = MemoryMetaStore::new();
        let table = TableRecord {
            table_id: TableId(1),
            tier: Tier::Memory,
            tablets: vec![TabletRecord {
                range: HashRange::FULL,
                owner: ServerId(1),
                creation_segment: SegmentId(0),
            }],
        };
        let MetaOperation::Put { key, mut value } = put_table("t", &table) else { unreachable!() };
        value.pop();
        store
            .apply(&[put_counter(NEXT_TABLE_ID_KEY, 5), MetaOperation::Put { key, value }])
            .unwrap();
        assert!(CoordinatorState::load(&store).is_err());
    }
}
