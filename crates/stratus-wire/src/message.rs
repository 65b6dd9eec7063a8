//! Every RPC's request and response body, as Rust types. Byte layouts are in
//! docs/design/wire-protocol.md and implemented in `codec.rs`.
//!
//! Keys and values are `Bytes` so a decoded request borrows the received frame instead of
//! copying it.

use bytes::Bytes;
use stratus_types::{ExpiresAt, Expiry, HashRange, RejectRules, SegmentId, ServerId, TableId};
use stratus_types::{LeaseId, RpcId, RpcIdentity};
use stratus_types::{TabletState, Tier, TxDecision, TxOpKind, TxVote, Version};

use crate::status::Status;
use crate::users::{Identity, UserDirectorySnapshot, UserRecord, UserSummary};

/// Operation codes. On the wire: a little-endian u16. Never renumber.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    /// Liveness check, served by every role.
    Ping = 1,
    /// Coordinator: a server joins the cluster and receives its id.
    EnlistServer = 10,
    /// Coordinator: the list of servers.
    GetServerList = 11,
    /// Coordinator: create a table spread over `server_span` masters.
    CreateTable = 12,
    /// Coordinator: drop a table and all its objects.
    DropTable = 13,
    /// Coordinator: resolve a table name to its id.
    GetTableId = 14,
    /// Coordinator: every table.
    ListTables = 15,
    /// Coordinator: the tablets of one table (or of all tables).
    GetTabletMap = 16,
    /// Coordinator (from a master): extend the master's lease to serve requests.
    RenewLease = 17,
    /// Coordinator (from a master): the master's log head, before writes in it are acknowledged.
    SetLogHead = 18,
    /// Coordinator (from a server): a peer did not answer a ping; the coordinator checks it
    /// itself before declaring it crashed.
    HintServerCrashed = 19,
    /// Coordinator (from an operator): hand a crashed master's tablets over empty although
    /// its log cannot be recovered.
    RecoveryAcceptLoss = 20,
    /// Coordinator: split the tablet holding a key hash into two at that hash.
    SplitTablet = 21,
    /// Coordinator: move a tablet to another master while clients keep running.
    MigrateTablet = 22,
    /// Coordinator (from a server): the server is stopping in order and serves nothing from
    /// now on; its tablets are recovered from its replicas as a crashed server's are.
    ServerStopping = 23,
    /// Coordinator (from a client): open a client lease (lease id 0) or renew one.
    ClientLease = 24,
    /// Coordinator (from a master): how long each of some client leases remains valid.
    CheckClientLeases = 25,
    /// Coordinator (from a cluster administrator): create a user or replace one's password,
    /// enabled flag and grants.
    SetUser = 26,
    /// Coordinator (from a cluster administrator): delete a user.
    DeleteUser = 27,
    /// Coordinator (from a cluster administrator): every user, without keys.
    ListUsers = 28,
    /// Any server: who this connection authenticated as. Answered by the RPC layer, which
    /// alone knows.
    WhoAmI = 29,
    /// Master: read one object.
    Read = 30,
    /// Master: write one object.
    Write = 31,
    /// Master: remove one object.
    Remove = 32,
    /// Master: add to an 8-byte integer object.
    Increment = 33,
    /// Master: read several objects.
    MultiRead = 34,
    /// Master: write several objects.
    MultiWrite = 35,
    /// Master: remove several objects.
    MultiRemove = 36,
    /// Master: increment several objects.
    MultiIncrement = 37,
    /// Master: the next batch of a table enumeration.
    Enumerate = 38,
    /// Master: set (or clear) when an object expires, keeping its value.
    SetExpiry = 39,
    /// Master (from the coordinator): start serving a tablet.
    TakeTabletOwnership = 40,
    /// Master (from the coordinator): stop serving a tablet and drop its objects.
    DropTabletOwnership = 41,
    /// Master: statistics for `stratus status`.
    GetServerStatistics = 42,
    /// Master (from the coordinator): replay a crashed master's tablets from its replicas.
    RecoverTablets = 43,
    /// Master (from the coordinator): copy a tablet to another master, then stop serving it.
    TransferTablet = 44,
    /// Master (from a master transferring a tablet): objects of the tablet, kept with their
    /// versions and made durable before the answer.
    ReceiveMigrationData = 45,
    /// Master (from a backup): which of the backup's replicas of this master's segments it no
    /// longer needs (the backup frees them).
    ReplicasNeeded = 46,
    /// Master (from the coordinator): a transfer into this master failed; drop what it copied
    /// here, unless a recovery or an assignment of the range overtook it.
    AbandonMigration = 47,
    /// Coordinator (from a server): the user directory, if it differs from the version the
    /// server has; held by the coordinator up to a few seconds until it does (a long poll).
    GetUserDirectory = 48,
    /// Coordinator (from a client that found a tablet recovering): the tablet map of one table
    /// (or of all), held up to a few seconds until no tablet in it is recovering (a long poll).
    AwaitTabletMap = 49,
    /// Master (from a client committing a transaction): vote on the transaction's operations
    /// on this master's objects, locking each one voted PREPARED (or, validate-only, check
    /// that read objects are unchanged and unlocked).
    TxPrepare = 60,
    /// Master (from a client that decided a transaction): apply (commit) or drop (abort) the
    /// transaction's prepared operations on this master's objects, and unlock them.
    TxDecision = 61,
    /// Master (from a participant finishing a transaction whose client went silent): make
    /// the votes of some of the transaction's operations on this master final (an operation
    /// that never voted is recorded as voting ABORT), and answer them.
    TxRequestAbort = 62,
    /// Backup: append to a replica of a master's segment (opening or closing it), then store
    /// the certificate that commits it.
    BackupWrite = 50,
    /// Backup: free a replica (idempotent).
    BackupFree = 51,
    /// Backup: the replicas it holds (of one master, or of all).
    BackupListReplicas = 52,
    /// Backup: the certified bytes of one replica, for recovery.
    BackupReadReplica = 53,
    /// Backup: its durability mode and counters, for `stratus status`.
    BackupGetStatistics = 54,
    /// Backup (from the coordinator): refuse every further write of a master declared crashed.
    BackupFenceMaster = 55,
    /// Backup (from a recovery master): the entries of one replica that fall in a partition.
    BackupGetRecoveryData = 56,
    /// Backup (from the coordinator): read the listed replicas of a crashed master once and
    /// cut each into the recovery's partitions ahead of the recovery masters' requests.
    BackupStartPartitioning = 57,
}

impl Opcode {
    /// Every opcode.
    pub const ALL: [Opcode; 52] = [
        Opcode::Ping,
        Opcode::EnlistServer,
        Opcode::GetServerList,
        Opcode::CreateTable,
        Opcode::DropTable,
        Opcode::GetTableId,
        Opcode::ListTables,
        Opcode::GetTabletMap,
        Opcode::RenewLease,
        Opcode::SetLogHead,
        Opcode::HintServerCrashed,
        Opcode::RecoveryAcceptLoss,
        Opcode::SplitTablet,
        Opcode::MigrateTablet,
        Opcode::ServerStopping,
        Opcode::ClientLease,
        Opcode::CheckClientLeases,
        Opcode::SetUser,
        Opcode::DeleteUser,
        Opcode::ListUsers,
        Opcode::WhoAmI,
        Opcode::Read,
        Opcode::Write,
        Opcode::Remove,
        Opcode::Increment,
        Opcode::MultiRead,
        Opcode::MultiWrite,
        Opcode::MultiRemove,
        Opcode::MultiIncrement,
        Opcode::Enumerate,
        Opcode::SetExpiry,
        Opcode::TakeTabletOwnership,
        Opcode::DropTabletOwnership,
        Opcode::GetServerStatistics,
        Opcode::RecoverTablets,
        Opcode::TransferTablet,
        Opcode::ReceiveMigrationData,
        Opcode::ReplicasNeeded,
        Opcode::AbandonMigration,
        Opcode::GetUserDirectory,
        Opcode::AwaitTabletMap,
        Opcode::TxPrepare,
        Opcode::TxDecision,
        Opcode::TxRequestAbort,
        Opcode::BackupWrite,
        Opcode::BackupFree,
        Opcode::BackupListReplicas,
        Opcode::BackupReadReplica,
        Opcode::BackupGetStatistics,
        Opcode::BackupFenceMaster,
        Opcode::BackupGetRecoveryData,
        Opcode::BackupStartPartitioning,
    ];

    /// The wire code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The opcode for a wire code, if it is one.
    pub fn from_code(code: u16) -> Option<Opcode> {
        Opcode::ALL.iter().copied().find(|opcode| opcode.code() == code)
    }

    /// Who may send the opcode with wire code `code`, if it is one: a table lookup, for the
    /// RPC layer's check of every request on a connection that did not prove the cluster
    /// secret.
    pub fn access_of_code(code: u16) -> Option<Access> {
        ACCESS_BY_CODE.get(usize::from(code)).copied().flatten()
    }

    /// Who may send this opcode to a server that runs with a cluster secret. The match names
    /// every opcode, so a new one cannot be added without deciding.
    pub const fn access(self) -> Access {
        match self {
            // What clients, the CLI and the RESP gateway send.
            Opcode::Ping
            | Opcode::GetServerList
            | Opcode::CreateTable
            | Opcode::DropTable
            | Opcode::GetTableId
            | Opcode::ListTables
            | Opcode::GetTabletMap
            | Opcode::AwaitTabletMap
            | Opcode::RecoveryAcceptLoss
            | Opcode::SplitTablet
            | Opcode::MigrateTablet
            | Opcode::ClientLease
            | Opcode::Read
            | Opcode::Write
            | Opcode::Remove
            | Opcode::Increment
            | Opcode::MultiRead
            | Opcode::MultiWrite
            | Opcode::MultiRemove
            | Opcode::MultiIncrement
            | Opcode::Enumerate
            | Opcode::SetExpiry
            | Opcode::GetServerStatistics
            | Opcode::TxPrepare
            | Opcode::TxDecision
            // A client whose PREPARE answers were lost asks the participants for final votes;
            // it can already abort its own transaction with TX_DECISION, so this grants nothing.
            | Opcode::TxRequestAbort
            | Opcode::BackupGetStatistics
            // The user opcodes: the RPC layer checks that the user administers the cluster
            // (`Request::access_needed`); WHO_AM_I is anyone's.
            | Opcode::SetUser
            | Opcode::DeleteUser
            | Opcode::ListUsers
            | Opcode::WhoAmI => Access::Client,
            // What only the coordinator and the servers send each other: each one can change
            // who owns data, forge or fence a log, or read a master's replicas.
            Opcode::EnlistServer
            | Opcode::RenewLease
            | Opcode::SetLogHead
            | Opcode::HintServerCrashed
            | Opcode::ServerStopping
            | Opcode::CheckClientLeases
            | Opcode::TakeTabletOwnership
            | Opcode::DropTabletOwnership
            | Opcode::RecoverTablets
            | Opcode::TransferTablet
            | Opcode::ReceiveMigrationData
            | Opcode::ReplicasNeeded
            | Opcode::AbandonMigration
            // The directory carries every user's stored keys.
            | Opcode::GetUserDirectory
            | Opcode::BackupWrite
            | Opcode::BackupFree
            | Opcode::BackupListReplicas
            | Opcode::BackupReadReplica
            | Opcode::BackupFenceMaster
            | Opcode::BackupGetRecoveryData
            | Opcode::BackupStartPartitioning => Access::Member,
        }
    }
}

/// One past the largest opcode's wire code.
const OPCODE_CODES: usize = 64;

/// [`Opcode::access`] by wire code; `None` where no opcode has the code.
const ACCESS_BY_CODE: [Option<Access>; OPCODE_CODES] = {
    let mut table = [None; OPCODE_CODES];
    let mut index = 0;
    while index < Opcode::ALL.len() {
        let opcode = Opcode::ALL[index];
        table[opcode as usize] = Some(opcode.access());
        index += 1;
    }
    table
};

/// Who may send an opcode to a server that runs with a cluster secret (docs/design/security.md).
/// A server without one serves every opcode to every connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// Any connection (clients are not authenticated yet).
    Client,
    /// Only a connection that proved the cluster secret in the membership preamble.
    Member,
}

/// Services a server runs; a bit mask on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceMask(pub u32);

impl ServiceMask {
    /// The master service (stores objects).
    pub const MASTER: u32 = 1;
    /// The backup service (stores other masters' segment replicas).
    pub const BACKUP: u32 = 2;
    /// The master keeps no replicas of its log (memory only): its data dies with it, so the
    /// coordinator cannot recover its tablets.
    pub const UNREPLICATED: u32 = 4;
    /// Every bit that has a meaning; others must be zero.
    pub const KNOWN: u32 = Self::MASTER | Self::BACKUP | Self::UNREPLICATED;

    /// True if the master bit is set.
    pub fn has_master(self) -> bool {
        self.0 & Self::MASTER != 0
    }

    /// True if the backup bit is set.
    pub fn has_backup(self) -> bool {
        self.0 & Self::BACKUP != 0
    }

    /// True if the master keeps no replicas of its log.
    pub fn is_unreplicated(self) -> bool {
        self.0 & Self::UNREPLICATED != 0
    }
}

/// A server's state in the coordinator's server list. On the wire: u8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServerStatus {
    /// Enlisted and believed alive.
    Up = 0,
    /// Declared crashed; its tablets are being recovered.
    Crashed = 1,
    /// Recovered (or never owned a tablet): nothing of it is needed any more.
    Removed = 2,
    /// Stopped in order (it said so, SERVER_STOPPING); its tablets are being recovered, as a
    /// crashed server's are.
    Stopped = 3,
}

impl ServerStatus {
    /// Gone, crashed or stopped, and not recovered yet: its tablets are being recovered from
    /// its replicas.
    pub fn awaits_recovery(self) -> bool {
        matches!(self, ServerStatus::Crashed | ServerStatus::Stopped)
    }
}

/// One entry of the server list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerEntry {
    /// The server's id.
    pub server_id: ServerId,
    /// Where it listens, "host:port".
    pub address: String,
    /// Which services it runs.
    pub services: ServiceMask,
    /// Its state.
    pub status: ServerStatus,
    /// Its failure domain (`stratus server --failure-domain`, e.g. a rack): replica placement
    /// puts a segment's copies in distinct domains. Empty: none given.
    pub failure_domain: String,
}

/// One table, as listed by the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableEntry {
    /// The table's name.
    pub name: String,
    /// The table's id.
    pub table_id: TableId,
    /// How many tablets it has.
    pub tablet_count: u32,
    /// Where its objects live, chosen when it was created.
    pub tier: Tier,
}

/// One tablet of the tablet map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabletEntry {
    /// The table it belongs to.
    pub table_id: TableId,
    /// Its key-hash range.
    pub range: HashRange,
    /// The master serving it.
    pub owner: ServerId,
    /// The owner's address, "host:port".
    pub owner_address: String,
    /// Normal or recovering. On the wire: u8, 0 = normal, 1 = recovering.
    pub state: TabletState,
}

/// Where an enumeration resumes within one hash range. Objects are enumerated in ascending order
/// of their *bit-reversed* key hash (then key bytes), an order that does not depend on the
/// master's hash-table size, so a cursor stays valid when a tablet moves.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EnumerationCursor {
    /// Resume at objects whose bit-reversed key hash is >= this.
    pub reversed_hash: u64,
    /// If present, skip objects whose bit-reversed hash equals `reversed_hash` and whose key is
    /// <= this key (they were already returned).
    pub after_key: Option<Bytes>,
}

/// One object returned by enumeration or multi-read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnumeratedObject {
    /// The key.
    pub key: Bytes,
    /// The value.
    pub value: Bytes,
    /// The version.
    pub version: Version,
    /// When it expires (by its master's clock), if it does.
    pub expires_at: Option<ExpiresAt>,
}

/// An item of a MULTI_READ request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyItem {
    /// Table.
    pub table_id: TableId,
    /// Key.
    pub key: Bytes,
    /// Conditions.
    pub rules: RejectRules,
}

/// An item of a MULTI_REMOVE request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveItem {
    /// Table.
    pub table_id: TableId,
    /// Key.
    pub key: Bytes,
    /// Conditions.
    pub rules: RejectRules,
    /// The item's exactly-once identity (docs/design/exactly-once.md), if its client has one.
    pub rpc: Option<RpcIdentity>,
}

/// An item of a MULTI_WRITE request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteItem {
    /// Table.
    pub table_id: TableId,
    /// Key.
    pub key: Bytes,
    /// Value.
    pub value: Bytes,
    /// Conditions.
    pub rules: RejectRules,
    /// When the new object expires.
    pub expiry: Expiry,
    /// The item's exactly-once identity, if its client has one.
    pub rpc: Option<RpcIdentity>,
}

/// An item of a MULTI_INCREMENT request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncrementItem {
    /// Table.
    pub table_id: TableId,
    /// Key.
    pub key: Bytes,
    /// Amount to add (wrapping on overflow is refused: see the master).
    pub delta: i64,
    /// Conditions.
    pub rules: RejectRules,
    /// The item's exactly-once identity, if its client has one.
    pub rpc: Option<RpcIdentity>,
}

/// One operation of a TX_PREPARE: what the transaction does to one object, and the version
/// it observed (docs/design/transactions.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOp {
    /// Table.
    pub table_id: TableId,
    /// Key.
    pub key: Bytes,
    /// The operation's rpc id under the request's lease: its vote is the RIFL result of this
    /// id, so every attempt of the operation carries the same one.
    pub rpc: RpcId,
    /// Read, write or remove.
    pub kind: TxOpKind,
    /// The version the transaction observed ([`Version::NONEXISTENT`]: the object was
    /// absent): the participant votes PREPARED only if the object is still at it.
    pub version_read: Version,
    /// The new value of a write; empty for every other kind (the decoder refuses a value on
    /// a read or a remove).
    pub value: Bytes,
}

/// One operation of a transaction, named by its object's table and key hash and its rpc id:
/// an op of TX_DECISION and TX_REQUEST_ABORT, and a participant of TX_PREPARE. A participant
/// finds a prepared operation by (lease, rpc id), and routes and records it by table and key
/// hash, so no key is needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxDecisionOp {
    /// The object's table.
    pub table_id: TableId,
    /// The object's key hash (`stratus_types::key_hash`).
    pub key_hash: u64,
    /// The rpc id of the operation's PREPARE.
    pub rpc: RpcId,
}

/// Per-operation answer of TX_PREPARE and TX_REQUEST_ABORT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxVoteItem {
    /// OK: `vote` is the participant's vote. Any other status (UNKNOWN_TABLET, RETRY, ...):
    /// the operation was not voted on (nor, for TX_REQUEST_ABORT, recorded), and the sender
    /// sends it again (to the master the status points to) with the same rpc id; `vote` is
    /// then meaningless.
    pub status: Status,
    /// The vote, when `status` is OK.
    pub vote: TxVote,
    /// The object's current version (0 when absent), for information.
    pub version: Version,
}

/// The unacknowledged result of a mutation of a tablet being transferred, as
/// RECEIVE_MIGRATION_DATA carries it (the table is the request's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigratedCompletion {
    /// The key hash of the mutated object.
    pub key_hash: u64,
    /// The client's lease.
    pub lease: LeaseId,
    /// The RPC, and what its client had acknowledged when it sent it.
    pub rpc: stratus_types::RpcId,
    /// See [`MigratedCompletion::rpc`].
    pub acknowledged: stratus_types::RpcId,
    /// The version answered.
    pub version: Version,
    /// The value an increment answered.
    pub integer: Option<i64>,
}

/// Per-item result of MULTI_READ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadItemResult {
    /// The item's status.
    pub status: Status,
    /// Current version (0 if missing).
    pub version: Version,
    /// The value (empty unless status is OK).
    pub value: Bytes,
}

/// Per-item result of MULTI_WRITE and MULTI_REMOVE.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionItemResult {
    /// The item's status.
    pub status: Status,
    /// The new version (write), the removed version (remove), or the current version on
    /// rejection.
    pub version: Version,
}

/// Per-item result of MULTI_INCREMENT.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IncrementItemResult {
    /// The item's status.
    pub status: Status,
    /// The new version, or the current one on rejection.
    pub version: Version,
    /// The value after the increment (0 unless status is OK).
    pub value: i64,
}

/// Statistics a master reports for `stratus status`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServerStatistics {
    /// The reporting server.
    pub server_id: ServerId,
    /// Bytes of the log region.
    pub log_bytes_total: u64,
    /// Bytes held by live log entries (objects and live tombstones).
    pub log_bytes_live: u64,
    /// Bytes in allocated seglets.
    pub log_bytes_allocated: u64,
    /// Number of seglets.
    pub seglets_total: u64,
    /// Seglets not allocated to any segment.
    pub seglets_free: u64,
    /// Segments in the log.
    pub segments_in_log: u64,
    /// Live objects.
    pub objects_live: u64,
    /// Tablets this master owns.
    pub tablets_owned: u32,
    /// Requests served since start.
    pub requests_served: u64,
    /// Replicas of each segment (0: memory-only).
    pub replicas: u32,
    /// Bytes of live objects in the log (entry headers included).
    pub log_bytes_live_objects: u64,
    /// Bytes sent to backups, each copy counted.
    pub bytes_replicated: u64,
    /// Of those, bytes of the cleaner's survivor segments (the cleaner's replication cost).
    pub cleaner_bytes_replicated: u64,
    /// Segments dropped from the log by combined cleaning.
    pub segments_cleaned: u64,
    /// Bytes moved by combined cleaning.
    pub cleaner_bytes_relocated: u64,
    /// Compactions completed.
    pub compactions: u64,
    /// Bytes moved by compaction.
    pub bytes_compacted: u64,
    /// Bytes of the server process resident in RAM (0 where the system does not say).
    pub process_resident_bytes: u64,
    /// Bytes of the log region whose pages are resident, at most.
    pub log_bytes_resident: u64,
    /// What the memory target asks the resident log to stay near (0: no target).
    pub log_bytes_target: u64,
    /// Bytes of the hash table's buckets in use.
    pub hash_table_bytes: u64,
    /// Figures of the auto tables this master stores (at most
    /// [`AUTO_TABLES_REPORTED_MAX`], the ones with the most bytes), ascending by table.
    pub auto_tables: Vec<AutoTableFigures>,
}

/// Auto tables a GET_SERVER_STATISTICS reports one by one at most: as many as a new head's
/// TABLE_STATS names, so a master with many tables answers in a bounded frame (9 u64 each).
pub const AUTO_TABLES_REPORTED_MAX: usize = 128;

/// Where one auto table's objects are on one master, and how its reads were served
/// (docs/design/flash-tier.md, "Automatic tiering"). Counters count since the master started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AutoTableFigures {
    /// The table.
    pub table_id: TableId,
    /// Objects in DRAM, and their bytes (whole entries).
    pub dram_objects: u64,
    pub dram_bytes: u64,
    /// Objects on flash, and their bytes at full size.
    pub flash_objects: u64,
    pub flash_bytes: u64,
    /// Reads served from DRAM and from flash.
    pub reads_from_dram: u64,
    pub reads_from_flash: u64,
    /// Objects a read brought back into DRAM.
    pub promotions: u64,
    /// Objects moved to flash.
    pub objects_demoted: u64,
}

/// A segment certificate as carried on the wire: the length of the segment prefix it commits
/// and a CRC32C over that prefix's entry headers (docs/design/log-format.md, "Certificate").
/// The backup checks it with the log crate's validating iterator; the wire only carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ReplicaCertificate {
    /// Bytes of the segment that are valid.
    pub segment_length: u32,
    /// CRC32C over the entry headers, then the 4 LE bytes of `segment_length`.
    pub checksum: u32,
}

/// The flags of a BACKUP_WRITE. On the wire: u8, bit 0 open, bit 1 close, bit 2 primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BackupWriteFlags {
    /// Create the replica (refused with BACKUP_OPEN_REJECTED when the backup has no buffer or
    /// storage frame for it). Idempotent: opening a replica the backup holds is a plain write.
    pub open: bool,
    /// The replica is complete after this write; it accepts no new bytes.
    pub close: bool,
    /// This is the segment's primary replica (the one recovery reads first).
    pub primary: bool,
}

impl BackupWriteFlags {
    /// Bit of the flags byte: open.
    pub const OPEN: u8 = 1 << 0;
    /// Bit of the flags byte: close.
    pub const CLOSE: u8 = 1 << 1;
    /// Bit of the flags byte: primary.
    pub const PRIMARY: u8 = 1 << 2;
    /// Every defined bit; others must be zero.
    pub const KNOWN: u8 = Self::OPEN | Self::CLOSE | Self::PRIMARY;

    /// The flags byte.
    pub fn to_byte(self) -> u8 {
        let mut byte = 0;
        if self.open {
            byte |= Self::OPEN;
        }
        if self.close {
            byte |= Self::CLOSE;
        }
        if self.primary {
            byte |= Self::PRIMARY;
        }
        byte
    }

    /// The flags of a byte, or `None` if an undefined bit is set.
    pub fn from_byte(byte: u8) -> Option<BackupWriteFlags> {
        if byte & !Self::KNOWN != 0 {
            return None;
        }
        Some(BackupWriteFlags {
            open: byte & Self::OPEN != 0,
            close: byte & Self::CLOSE != 0,
            primary: byte & Self::PRIMARY != 0,
        })
    }
}

/// One replica a backup holds, as listed by BACKUP_LIST_REPLICAS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplicaEntry {
    /// The master whose segment this replicates.
    pub master_id: ServerId,
    /// The segment.
    pub segment_id: SegmentId,
    /// The replica epoch of the last write (recovery ignores replicas of an older epoch).
    pub epoch: u64,
    /// The certificate of the last write: the replica's valid prefix.
    pub certificate: ReplicaCertificate,
    /// True once a write with the close flag arrived: the segment is complete.
    pub closed: bool,
    /// True if the master marked this the primary replica.
    pub primary: bool,
}

/// When a backup acknowledges a replica write. On the wire: u8, 0 buffered, 1 fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackupDurability {
    /// Once the bytes are in the backup's RAM.
    Buffered = 0,
    /// Once the bytes are on the backup's disk (after fdatasync).
    Fsync = 1,
}

/// A backup's state, as BACKUP_GET_STATISTICS reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupServiceStatistics {
    /// Durability mode.
    pub durability: BackupDurability,
    /// Replicas held.
    pub replicas: u32,
    /// Replicas not closed yet.
    pub replicas_open: u32,
    /// RAM buffers in use.
    pub buffers_in_use: u32,
    /// RAM buffers configured.
    pub buffer_count: u32,
    /// Storage frames holding no replica.
    pub frames_free: u32,
    /// Storage frames.
    pub frame_count: u32,
    /// Disk syncs issued (each a group commit of a batch of writes).
    pub disk_syncs: u64,
    /// Disk write jobs those syncs completed.
    pub disk_write_jobs: u64,
    /// Segment bytes written to disk.
    pub disk_data_bytes_written: u64,
    /// Why the backup refuses writes, if its storage failed (at most 1 024 bytes).
    pub storage_failure: Option<String>,
}

/// A request body, one variant per opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// PING.
    Ping,
    /// ENLIST_SERVER.
    EnlistServer {
        /// Address the server listens on.
        address: String,
        /// Services it runs.
        services: ServiceMask,
        /// The id the server had before it restarted (kept in its data directory), whose
        /// index it takes again; `ServerId(0)` for a server new to the cluster.
        previous_server_id: ServerId,
        /// The server's failure domain (e.g. its rack; at most `FAILURE_DOMAIN_BYTES_MAX`
        /// bytes of printable ASCII): empty for none.
        failure_domain: String,
    },
    /// GET_SERVER_LIST.
    GetServerList,
    /// CREATE_TABLE.
    CreateTable {
        /// Table name (1..=256 bytes of UTF-8).
        name: String,
        /// Number of masters to spread it over (1..=1024).
        server_span: u32,
        /// Where its objects live (fixed for the table's life): a repeat of the request
        /// must name the same tier.
        tier: Tier,
    },
    /// DROP_TABLE.
    DropTable {
        /// Table name.
        name: String,
    },
    /// GET_TABLE_ID.
    GetTableId {
        /// Table name.
        name: String,
    },
    /// LIST_TABLES.
    ListTables,
    /// GET_TABLET_MAP; table id 0 means every table.
    GetTabletMap {
        /// Table, or `TableId(0)` for all.
        table_id: TableId,
    },
    /// AWAIT_TABLET_MAP: GET_TABLET_MAP's answer, once no tablet in it is recovering or owned
    /// by `stale_owner`, or after `wait_millis` (at most `TABLET_MAP_AWAIT_MILLIS_MAX`),
    /// whichever comes first.
    AwaitTabletMap {
        /// Table, or `TableId(0)` for all.
        table_id: TableId,
        /// How long the coordinator may hold the answer.
        wait_millis: u32,
        /// A master the client could not connect to (0: none): the answer waits until no
        /// tablet of the map is owned by it any more.
        stale_owner: ServerId,
    },
    /// SPLIT_TABLET: the tablet of table `name` that holds `split_hash` becomes two, the
    /// second starting at `split_hash`, both on the same master.
    SplitTablet {
        /// Table name.
        name: String,
        /// The first key hash of the second half.
        split_hash: u64,
    },
    /// MIGRATE_TABLET: the tablet of table `name` that starts at `start_hash` moves to the
    /// master `target`.
    MigrateTablet {
        /// Table name.
        name: String,
        /// The first key hash of the tablet.
        start_hash: u64,
        /// The master that is to serve it.
        target: ServerId,
    },
    /// TRANSFER_TABLET: the master serving `range` of `table_id` copies it to `target` and
    /// stops serving it.
    TransferTablet {
        /// The master this is meant for: another server at its address (a restarted process
        /// with a new id) answers WRONG_SERVER.
        master_id: ServerId,
        /// Table.
        table_id: TableId,
        /// The tablet (exactly one the master owns).
        range: HashRange,
        /// The coordinator's assignment epoch of this decision (wire-protocol.md, "Assignment
        /// epochs"): a master ignores an assignment older than one it has seen for the range.
        assignment_epoch: u64,
        /// The master that receives it.
        target: ServerId,
        /// Its address.
        target_address: String,
    },
    /// RECEIVE_MIGRATION_DATA: objects of `range` of `table_id` from the master transferring it.
    ReceiveMigrationData {
        /// Table.
        table_id: TableId,
        /// The tablet being transferred.
        range: HashRange,
        /// The assignment epoch of the transfer (the TRANSFER_TABLET's).
        assignment_epoch: u64,
        /// The master transferring it.
        source: ServerId,
        /// Which of the source's transfers this batch belongs to: a batch of a transfer that
        /// a later first batch superseded is refused.
        transfer_id: u64,
        /// The source's safe version: the receiver's versions stay above it.
        safe_version: Version,
        /// True for the first batch: the receiver starts the tablet afresh in its log.
        first: bool,
        /// The table's tier, as the source learnt it with the tablet: the receiver stores
        /// the objects in that tier from the first batch on.
        tier: Tier,
        /// Objects with their versions.
        objects: Vec<EnumeratedObject>,
        /// Keys removed at the source while it copied the tablet: the receiver removes each one
        /// it holds at a version below `safe_version`.
        removed_keys: Vec<Bytes>,
        /// Unacknowledged results of the tablet's mutations (sent once writes are held), so
        /// their retries are answered at the target.
        completions: Vec<MigratedCompletion>,
    },
    /// REPLICAS_NEEDED: a backup asks `master_id` about replicas of its segments it holds.
    ReplicasNeeded {
        /// The master asked (another server at its address answers WRONG_SERVER).
        master_id: ServerId,
        /// Segments of that master the backup holds a replica of (at most
        /// `BACKUP_REPLICAS_MAX`).
        segment_ids: Vec<SegmentId>,
    },
    /// SET_USER: create the user, or replace its enabled flag and grants (and its password,
    /// unless `user.credentials` is `None`).
    SetUser {
        /// The user.
        user: UserRecord,
    },
    /// DELETE_USER.
    DeleteUser {
        /// The user's name.
        name: String,
    },
    /// LIST_USERS.
    ListUsers,
    /// WHO_AM_I.
    WhoAmI,
    /// GET_USER_DIRECTORY: the directory, unless the coordinator's is still at
    /// `known_version` when the poll's time is up.
    GetUserDirectory {
        /// The version the server has (0: none).
        known_version: u64,
    },
    /// READ.
    Read {
        /// Table.
        table_id: TableId,
        /// Key.
        key: Bytes,
        /// Conditions.
        rules: RejectRules,
    },
    /// WRITE.
    Write {
        /// Table.
        table_id: TableId,
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
        /// Conditions.
        rules: RejectRules,
        /// When the new object expires.
        expiry: Expiry,
        /// Exactly-once identity, if the client has one.
        rpc: Option<RpcIdentity>,
    },
    /// SET_EXPIRY.
    SetExpiry {
        /// Table.
        table_id: TableId,
        /// Key.
        key: Bytes,
        /// The object's new expiry (`Keep` changes nothing but the version).
        expiry: Expiry,
        /// Conditions.
        rules: RejectRules,
        /// Exactly-once identity, if the client has one.
        rpc: Option<RpcIdentity>,
    },
    /// REMOVE.
    Remove {
        /// Table.
        table_id: TableId,
        /// Key.
        key: Bytes,
        /// Conditions.
        rules: RejectRules,
        /// Exactly-once identity, if the client has one.
        rpc: Option<RpcIdentity>,
    },
    /// INCREMENT.
    Increment {
        /// Table.
        table_id: TableId,
        /// Key.
        key: Bytes,
        /// Amount to add.
        delta: i64,
        /// Conditions.
        rules: RejectRules,
        /// Exactly-once identity, if the client has one.
        rpc: Option<RpcIdentity>,
    },
    /// MULTI_READ.
    MultiRead {
        /// Items.
        items: Vec<KeyItem>,
    },
    /// MULTI_WRITE.
    MultiWrite {
        /// Items.
        items: Vec<WriteItem>,
    },
    /// MULTI_REMOVE.
    MultiRemove {
        /// Items.
        items: Vec<RemoveItem>,
    },
    /// MULTI_INCREMENT.
    MultiIncrement {
        /// Items.
        items: Vec<IncrementItem>,
    },
    /// TX_PREPARE: vote on `ops`, operations of the transaction `(lease, transaction)` on
    /// objects of this master.
    TxPrepare {
        /// The client's lease: every op's rpc id is under it.
        lease: LeaseId,
        /// The client has the result of every rpc of the lease at or below this one.
        acknowledged: RpcId,
        /// The rpc id of the transaction's first operation: with `lease`, the transaction's
        /// id, unique in the cluster's lifetime.
        transaction: RpcId,
        /// A read-only transaction's validation: every op is a READ, nothing is locked or
        /// logged, and each vote says whether the object is unlocked and still at its
        /// version read.
        validate_only: bool,
        /// The operations (at most `MULTI_OP_ITEMS_MAX`).
        ops: Vec<TxOp>,
        /// Every operation of the transaction, on every master, in the client's order (at
        /// most `TRANSACTION_OBJECTS_MAX`), so that each participant can finish the
        /// transaction if its client dies. Empty when `validate_only` (the decoder refuses
        /// otherwise), not empty otherwise (likewise); every op of the request must be in it
        /// (the master checks that, not the decoder).
        participants: Vec<TxDecisionOp>,
    },
    /// TX_DECISION: the transaction `(lease, transaction)` is decided; apply or drop its
    /// operations `ops` on this master, and unlock their objects.
    TxDecision {
        /// The client's lease.
        lease: LeaseId,
        /// The client has the result of every rpc of the lease at or below this one.
        acknowledged: RpcId,
        /// The rpc id of the transaction's first operation.
        transaction: RpcId,
        /// Commit or abort.
        decision: TxDecision,
        /// The operations (at most `MULTI_OP_ITEMS_MAX`).
        ops: Vec<TxDecisionOp>,
    },
    /// TX_REQUEST_ABORT: a participant finishing the transaction `(lease, transaction)` (its
    /// client went silent) asks for the final vote of each of `ops`; an op that never voted
    /// is recorded as voting ABORT first, so a PREPARE of it arriving later votes ABORT. The
    /// sender acknowledges nothing of the lease.
    TxRequestAbort {
        /// The transaction's client lease (not 0).
        lease: LeaseId,
        /// The rpc id of the transaction's first operation (at least 1).
        transaction: RpcId,
        /// The operations (at most `MULTI_OP_ITEMS_MAX`; rpc ids at least 1).
        ops: Vec<TxDecisionOp>,
    },
    /// ENUMERATE.
    Enumerate {
        /// Table.
        table_id: TableId,
        /// The part of the hash space to enumerate (must lie in one tablet of the server).
        range: HashRange,
        /// Where to resume.
        cursor: EnumerationCursor,
        /// Most bytes of objects to return (the server caps it further).
        bytes_max: u32,
    },
    /// TAKE_TABLET_OWNERSHIP.
    TakeTabletOwnership {
        /// The master this is meant for: another server at its address (a restarted process
        /// with a new id) answers WRONG_SERVER.
        master_id: ServerId,
        /// Table.
        table_id: TableId,
        /// Tablet range.
        range: HashRange,
        /// The coordinator's assignment epoch of this decision (wire-protocol.md, "Assignment
        /// epochs"): a master ignores an assignment older than one it has seen for the range.
        assignment_epoch: u64,
        /// The table's tier: the master stores the tablet's objects there.
        tier: Tier,
    },
    /// DROP_TABLET_OWNERSHIP.
    DropTabletOwnership {
        /// The master this is meant for: another server at its address (a restarted process
        /// with a new id) answers WRONG_SERVER.
        master_id: ServerId,
        /// Table.
        table_id: TableId,
        /// Tablet range.
        range: HashRange,
        /// The coordinator's assignment epoch of this decision (wire-protocol.md, "Assignment
        /// epochs"): a master ignores an assignment older than one it has seen for the range.
        assignment_epoch: u64,
    },
    /// ABANDON_MIGRATION: the transfer of `range` into `master_id` at `assignment_epoch`
    /// failed; its partial copy there is dropped unless the range was recovered or assigned
    /// there since.
    AbandonMigration {
        /// The target of the transfer (another server at its address answers WRONG_SERVER).
        master_id: ServerId,
        /// Table.
        table_id: TableId,
        /// The tablet's range, exactly as transferred.
        range: HashRange,
        /// The transfer's assignment epoch (TRANSFER_TABLET's), which names the transfer.
        assignment_epoch: u64,
    },
    /// GET_SERVER_STATISTICS.
    GetServerStatistics,
    /// RECOVER_TABLETS: become the owner-to-be of `tablets` of the crashed master by replaying
    /// the segments of its log (the newest digest's members) read from the replicas the
    /// coordinator located for each.
    RecoverTablets {
        /// The recovery master this is meant for: another server at its address (a restarted
        /// process with a new id) answers WRONG_SERVER.
        master_id: ServerId,
        /// The crashed master (the log id in its segments' headers).
        crashed_master: ServerId,
        /// The partition this master recovers: (table, hash range) pairs.
        tablets: Vec<RecoveryTablet>,
        /// Addresses of the backups holding the replicas below, which name them by index.
        backups: Vec<String>,
        /// Every segment of the crashed master's log, from its newest digest, each with the
        /// replicas to read it from (the coordinator asked every backup which it holds, so the
        /// recovery master need not ask again).
        segments: Vec<RecoverySegment>,
        /// An assignment epoch the coordinator persisted for this recovery attempt: above every
        /// assignment made before it, so the recovery master refuses batches of any earlier
        /// transfer of these ranges (wire-protocol.md, RECOVER_TABLETS).
        assignment_epoch: u64,
    },
    /// BACKUP_WRITE: append `data` at `offset` of the replica of (`master_id`, `segment_id`),
    /// then store `certificate`.
    BackupWrite {
        /// The master whose segment this is.
        master_id: ServerId,
        /// The segment.
        segment_id: SegmentId,
        /// The replica epoch (the backup keeps the highest it has seen).
        epoch: u64,
        /// Where `data` goes in the segment; must equal the bytes the backup holds, unless
        /// `data` re-sends bytes it already holds identically.
        offset: u32,
        /// Open, close, primary.
        flags: BackupWriteFlags,
        /// The certificate committing the segment's prefix after this write.
        certificate: ReplicaCertificate,
        /// Segment bytes (may be empty, for example a close alone).
        data: Bytes,
    },
    /// BACKUP_FREE: drop the replica (idempotent).
    BackupFree {
        /// The master whose segment this is.
        master_id: ServerId,
        /// The segment.
        segment_id: SegmentId,
    },
    /// BACKUP_LIST_REPLICAS: the replicas of one master, or of every master for id 0.
    BackupListReplicas {
        /// The master, or `ServerId(0)` for all.
        master_id: ServerId,
    },
    /// BACKUP_READ_REPLICA: one replica's certified bytes.
    BackupReadReplica {
        /// The master whose segment this is.
        master_id: ServerId,
        /// The segment.
        segment_id: SegmentId,
    },
    /// BACKUP_GET_STATISTICS.
    BackupGetStatistics,
    /// BACKUP_FENCE_MASTER: refuse every further BACKUP_WRITE of `master_id`.
    BackupFenceMaster {
        /// The master the coordinator declared crashed.
        master_id: ServerId,
    },
    /// CLIENT_LEASE: a client asks for a new lease (`lease` 0) or to renew its lease.
    ClientLease {
        /// The lease to renew, or `LeaseId(0)` for a new one.
        lease: LeaseId,
    },
    /// CHECK_CLIENT_LEASES: a master asks how long each lease remains valid.
    CheckClientLeases {
        /// The leases (at most `CLIENT_LEASES_PER_CHECK_MAX`).
        leases: Vec<LeaseId>,
    },
    /// RENEW_LEASE: the master `server_id` asks to keep serving.
    RenewLease {
        /// The asking master.
        server_id: ServerId,
    },
    /// SET_LOG_HEAD: the master `server_id` is about to acknowledge writes in `segment_id`
    /// replicated at `epoch`.
    SetLogHead {
        /// The master.
        server_id: ServerId,
        /// Its head segment.
        segment_id: SegmentId,
        /// The replica epoch the head is written at.
        epoch: u64,
    },
    /// HINT_SERVER_CRASHED: the sender's ping of `server_id` went unanswered.
    HintServerCrashed {
        /// The suspect.
        server_id: ServerId,
    },
    /// SERVER_STOPPING.
    ServerStopping {
        /// The server that stops.
        server_id: ServerId,
    },
    /// RECOVERY_ACCEPT_LOSS: an operator accepts that the data of crashed master `server_id`
    /// is lost; its tablets are handed over empty.
    RecoveryAcceptLoss {
        /// The crashed master.
        server_id: ServerId,
    },
    /// BACKUP_GET_RECOVERY_DATA: the replica of (`master_id`, `segment_id`) reduced to the
    /// entries a recovery master of `tablets` needs.
    BackupGetRecoveryData {
        /// The crashed master.
        master_id: ServerId,
        /// The segment.
        segment_id: SegmentId,
        /// The recovery master's partition.
        tablets: Vec<RecoveryTablet>,
    },
    /// BACKUP_START_PARTITIONING: read this backup's primary replicas of `master_id`'s
    /// `segments` once each and cut every one into `partitions` (each the tablets of one
    /// recovery master, exactly as its RECOVER_TABLETS names them), so that the
    /// BACKUP_GET_RECOVERY_DATA of each partition finds its part ready.
    BackupStartPartitioning {
        /// The crashed master.
        master_id: ServerId,
        /// The segments of its log that recovery replays (the newest digest's).
        segments: Vec<SegmentId>,
        /// One list of tablets per recovery master.
        partitions: Vec<Vec<RecoveryTablet>>,
    },
}

/// One part of a crashed master's tablets, recovered by one recovery master.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecoveryTablet {
    /// Table.
    pub table_id: TableId,
    /// Part of the table's hash space.
    pub range: HashRange,
    /// The tablet's creation segment in the crashed master's log: its objects in older
    /// segments are left from an earlier time that master served the range, and are ignored.
    pub creation_segment: SegmentId,
    /// The table's tier: a recovery master replays the part into that tier. Backups, which
    /// filter entries by table and range only, ignore it.
    pub tier: Tier,
}

/// One segment of a crashed master's log that a recovery master replays, with the replicas the
/// coordinator located for it (RECOVER_TABLETS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoverySegment {
    /// The segment.
    pub segment_id: SegmentId,
    /// Replicas to read it from, best first: the newest epoch only (an older replica is one the
    /// master abandoned and may miss acknowledged writes), then the longest, then the primary.
    pub replicas: Vec<RecoveryReplica>,
}

/// One replica of a crashed master's segment, as its backup listed it to the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecoveryReplica {
    /// Index of the backup's address in the request's backups.
    pub backup: u16,
    /// The replica epoch the backup holds.
    pub epoch: u64,
    /// Bytes of the segment the replica holds (its certificate's length).
    pub length: u32,
    /// The master marked it primary: its backup cuts it for every partition ahead of the
    /// recovery masters' requests (BACKUP_START_PARTITIONING).
    pub primary: bool,
}

/// A response body for a status that carries the operation's body (see
/// [`Status::carries_operation_body`]); one variant per opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// SET_USER.
    SetUser {
        /// True if the user did not exist before.
        created: bool,
    },
    /// DELETE_USER.
    DeleteUser {
        /// True if the user existed.
        existed: bool,
    },
    /// LIST_USERS.
    ListUsers {
        /// Every user, ascending by name.
        users: Vec<UserSummary>,
    },
    /// WHO_AM_I.
    WhoAmI {
        /// Who the connection is.
        identity: Identity,
    },
    /// GET_USER_DIRECTORY: `None` if the directory is still at the version the server has.
    GetUserDirectory {
        /// The new directory.
        directory: Option<UserDirectorySnapshot>,
    },
    /// PING.
    Ping,
    /// ENLIST_SERVER.
    EnlistServer {
        /// The new server's id.
        server_id: ServerId,
    },
    /// GET_SERVER_LIST.
    GetServerList {
        /// Servers.
        servers: Vec<ServerEntry>,
    },
    /// CREATE_TABLE.
    CreateTable {
        /// The table's id (the existing one if the name was taken).
        table_id: TableId,
    },
    /// DROP_TABLE.
    DropTable,
    /// GET_TABLE_ID.
    GetTableId {
        /// The table's id.
        table_id: TableId,
    },
    /// LIST_TABLES.
    ListTables {
        /// Tables.
        tables: Vec<TableEntry>,
    },
    /// GET_TABLET_MAP.
    GetTabletMap {
        /// Tablets, sorted by table id then range start.
        tablets: Vec<TabletEntry>,
    },
    /// AWAIT_TABLET_MAP: as GET_TABLET_MAP's.
    AwaitTabletMap {
        /// Tablets, sorted by table id then range start.
        tablets: Vec<TabletEntry>,
    },
    /// READ.
    Read {
        /// Current version (0 if missing).
        version: Version,
        /// Value (empty unless OK).
        value: Bytes,
        /// Milliseconds until the object expires, by its master's clock, rounded up; 0 when
        /// it has no expiry (an expired object is never returned).
        expires_in_millis: u64,
    },
    /// WRITE.
    Write {
        /// The new version, or the current one on rejection.
        version: Version,
    },
    /// SET_EXPIRY.
    SetExpiry {
        /// The new version, or the current one on rejection (0 if missing or expired).
        version: Version,
    },
    /// REMOVE.
    Remove {
        /// The removed version, or the current one on rejection (0 if missing).
        version: Version,
    },
    /// INCREMENT.
    Increment {
        /// The new version, or the current one on rejection.
        version: Version,
        /// The new value.
        value: i64,
    },
    /// MULTI_READ.
    MultiRead {
        /// One result per request item, in order.
        results: Vec<ReadItemResult>,
    },
    /// MULTI_WRITE.
    MultiWrite {
        /// One result per request item, in order.
        results: Vec<VersionItemResult>,
    },
    /// MULTI_REMOVE.
    MultiRemove {
        /// One result per request item, in order.
        results: Vec<VersionItemResult>,
    },
    /// MULTI_INCREMENT.
    MultiIncrement {
        /// One result per request item, in order.
        results: Vec<IncrementItemResult>,
    },
    /// TX_PREPARE.
    TxPrepare {
        /// One per request op, in order.
        votes: Vec<TxVoteItem>,
    },
    /// TX_DECISION: per op, in order, OK once the decision is applied (or nothing was
    /// prepared for the op: the decision is idempotent); any other status: the client sends
    /// that op's decision again (to the master the status points to).
    TxDecision {
        /// One per request op, in order.
        results: Vec<Status>,
    },
    /// TX_REQUEST_ABORT: per op, in order, status OK with the op's final vote (PREPARED if
    /// the op is prepared, or was prepared and is decided; ABORT if it voted ABORT or had not
    /// voted, which is now recorded); any other status (UNKNOWN_TABLET, RETRY, ...): nothing
    /// was recorded, and the sender asks again (where the status points).
    TxRequestAbort {
        /// One per request op, in order.
        votes: Vec<TxVoteItem>,
    },
    /// ENUMERATE.
    Enumerate {
        /// Objects in enumeration order.
        objects: Vec<EnumeratedObject>,
        /// Where to resume; `None` when the range is exhausted.
        next: Option<EnumerationCursor>,
    },
    /// TAKE_TABLET_OWNERSHIP.
    TakeTabletOwnership,
    /// DROP_TABLET_OWNERSHIP.
    DropTabletOwnership,
    /// ABANDON_MIGRATION: what the target dropped.
    AbandonMigration {
        /// Objects of the abandoned copy dropped (0 when there was none, or it was ignored).
        objects_dropped: u64,
    },
    /// GET_SERVER_STATISTICS.
    GetServerStatistics {
        /// Statistics.
        statistics: ServerStatistics,
    },
    /// BACKUP_FENCE_MASTER.
    BackupFenceMaster,
    /// SET_LOG_HEAD: recorded durably.
    SetLogHead,
    /// SERVER_STOPPING.
    ServerStopping,
    /// HINT_SERVER_CRASHED: noted (the suspect is checked, or already was).
    HintServerCrashed,
    /// RECOVERY_ACCEPT_LOSS: the loss is accepted; the tablets are handed over empty.
    RecoveryAcceptLoss,
    /// SPLIT_TABLET: the split is durable in the tablet map (or the hash already was a
    /// tablet boundary).
    SplitTablet,
    /// MIGRATE_TABLET: the tablet is served by the target, and the change is durable.
    MigrateTablet,
    /// TRANSFER_TABLET: every object is durable on the target; this master no longer serves the
    /// tablet.
    TransferTablet {
        /// Where the tablet starts in the target's log (see RECEIVE_MIGRATION_DATA).
        creation_segment: SegmentId,
        /// Objects copied.
        objects_sent: u64,
    },
    /// RECEIVE_MIGRATION_DATA: the batch is durable on this master's backups.
    ReceiveMigrationData {
        /// The segment this master's log started the tablet in (the head it rolled to for the
        /// first batch): recovery of this master ignores the tablet's entries in older segments.
        creation_segment: SegmentId,
    },
    /// REPLICAS_NEEDED: the segments of the request this master will never need again (it
    /// neither holds them nor replicates them: freed, abandoned, or never its own), in the
    /// request's order. A segment it may still need is left out.
    ReplicasNeeded {
        /// Segments whose replicas the backup may free.
        not_needed: Vec<SegmentId>,
    },
    /// BACKUP_GET_RECOVERY_DATA: a segment of the header, safe versions, and the objects and
    /// tombstones of the partition, with the certificate that commits it.
    BackupGetRecoveryData {
        /// Certificate of `data`; `data` is exactly its length.
        certificate: ReplicaCertificate,
        /// The filtered segment.
        data: Bytes,
    },
    /// BACKUP_START_PARTITIONING: how many of the listed segments this backup holds a primary
    /// replica of, and will partition.
    BackupStartPartitioning {
        /// Replicas the backup will read and partition.
        replicas_to_partition: u32,
    },
    /// CLIENT_LEASE: the lease, valid for `term_ms` milliseconds from when the client sent the
    /// request.
    ClientLease {
        /// The lease granted or renewed.
        lease: LeaseId,
        /// How long it stays valid.
        term_ms: u32,
    },
    /// CHECK_CLIENT_LEASES: for each lease asked about, in order, how many more milliseconds
    /// it stays valid at least; 0 when it expired (or was never granted).
    CheckClientLeases {
        /// One per lease of the request.
        remaining_ms: Vec<u32>,
    },
    /// RENEW_LEASE: the master may serve for `lease_ms` milliseconds from when it sent the
    /// request.
    RenewLease {
        /// Lease length in milliseconds.
        lease_ms: u32,
    },
    /// RECOVER_TABLETS: the partition is replayed and durable on this master's backups.
    RecoverTablets {
        /// Segments verified and replayed.
        segments_replayed: u64,
        /// Bytes of recovery data received from backups (the partition's share of the
        /// replicas).
        replica_bytes_read: u64,
        /// Objects written into this master's store.
        objects_replayed: u64,
        /// The segment this master's log started the recovered tablets in.
        creation_segment: SegmentId,
    },
    /// BACKUP_WRITE.
    BackupWrite,
    /// BACKUP_FREE.
    BackupFree,
    /// BACKUP_LIST_REPLICAS.
    BackupListReplicas {
        /// Replicas, sorted by master id then segment id.
        replicas: Vec<ReplicaEntry>,
    },
    /// BACKUP_READ_REPLICA.
    BackupReadReplica {
        /// The replica's epoch.
        epoch: u64,
        /// Its certificate; `data` is exactly `certificate.segment_length` bytes.
        certificate: ReplicaCertificate,
        /// True if the replica is closed (the segment is complete).
        closed: bool,
        /// True if it is the primary replica.
        primary: bool,
        /// The certified bytes of the segment.
        data: Bytes,
    },
    /// BACKUP_GET_STATISTICS.
    BackupGetStatistics {
        /// The backup's state.
        statistics: BackupServiceStatistics,
    },
}

impl Request {
    /// The opcode of this request.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Ping => Opcode::Ping,
            Request::EnlistServer { .. } => Opcode::EnlistServer,
            Request::GetServerList => Opcode::GetServerList,
            Request::CreateTable { .. } => Opcode::CreateTable,
            Request::DropTable { .. } => Opcode::DropTable,
            Request::GetTableId { .. } => Opcode::GetTableId,
            Request::ListTables => Opcode::ListTables,
            Request::GetTabletMap { .. } => Opcode::GetTabletMap,
            Request::AwaitTabletMap { .. } => Opcode::AwaitTabletMap,
            Request::Read { .. } => Opcode::Read,
            Request::Write { .. } => Opcode::Write,
            Request::SetExpiry { .. } => Opcode::SetExpiry,
            Request::Remove { .. } => Opcode::Remove,
            Request::Increment { .. } => Opcode::Increment,
            Request::MultiRead { .. } => Opcode::MultiRead,
            Request::MultiWrite { .. } => Opcode::MultiWrite,
            Request::MultiRemove { .. } => Opcode::MultiRemove,
            Request::MultiIncrement { .. } => Opcode::MultiIncrement,
            Request::TxPrepare { .. } => Opcode::TxPrepare,
            Request::TxDecision { .. } => Opcode::TxDecision,
            Request::TxRequestAbort { .. } => Opcode::TxRequestAbort,
            Request::Enumerate { .. } => Opcode::Enumerate,
            Request::TakeTabletOwnership { .. } => Opcode::TakeTabletOwnership,
            Request::DropTabletOwnership { .. } => Opcode::DropTabletOwnership,
            Request::AbandonMigration { .. } => Opcode::AbandonMigration,
            Request::GetServerStatistics => Opcode::GetServerStatistics,
            Request::RecoverTablets { .. } => Opcode::RecoverTablets,
            Request::BackupFenceMaster { .. } => Opcode::BackupFenceMaster,
            Request::RenewLease { .. } => Opcode::RenewLease,
            Request::SetLogHead { .. } => Opcode::SetLogHead,
            Request::HintServerCrashed { .. } => Opcode::HintServerCrashed,
            Request::ServerStopping { .. } => Opcode::ServerStopping,
            Request::ClientLease { .. } => Opcode::ClientLease,
            Request::CheckClientLeases { .. } => Opcode::CheckClientLeases,
            Request::SetUser { .. } => Opcode::SetUser,
            Request::DeleteUser { .. } => Opcode::DeleteUser,
            Request::ListUsers => Opcode::ListUsers,
            Request::WhoAmI => Opcode::WhoAmI,
            Request::GetUserDirectory { .. } => Opcode::GetUserDirectory,
            Request::RecoveryAcceptLoss { .. } => Opcode::RecoveryAcceptLoss,
            Request::SplitTablet { .. } => Opcode::SplitTablet,
            Request::MigrateTablet { .. } => Opcode::MigrateTablet,
            Request::TransferTablet { .. } => Opcode::TransferTablet,
            Request::ReceiveMigrationData { .. } => Opcode::ReceiveMigrationData,
            Request::ReplicasNeeded { .. } => Opcode::ReplicasNeeded,
            Request::BackupGetRecoveryData { .. } => Opcode::BackupGetRecoveryData,
            Request::BackupStartPartitioning { .. } => Opcode::BackupStartPartitioning,
            Request::BackupWrite { .. } => Opcode::BackupWrite,
            Request::BackupFree { .. } => Opcode::BackupFree,
            Request::BackupListReplicas { .. } => Opcode::BackupListReplicas,
            Request::BackupReadReplica { .. } => Opcode::BackupReadReplica,
            Request::BackupGetStatistics => Opcode::BackupGetStatistics,
        }
    }
}

impl Response {
    /// The opcode of the request this answers.
    pub fn opcode(&self) -> Opcode {
        match self {
            Response::Ping => Opcode::Ping,
            Response::EnlistServer { .. } => Opcode::EnlistServer,
            Response::GetServerList { .. } => Opcode::GetServerList,
            Response::CreateTable { .. } => Opcode::CreateTable,
            Response::DropTable => Opcode::DropTable,
            Response::GetTableId { .. } => Opcode::GetTableId,
            Response::ListTables { .. } => Opcode::ListTables,
            Response::GetTabletMap { .. } => Opcode::GetTabletMap,
            Response::Read { .. } => Opcode::Read,
            Response::Write { .. } => Opcode::Write,
            Response::SetExpiry { .. } => Opcode::SetExpiry,
            Response::Remove { .. } => Opcode::Remove,
            Response::Increment { .. } => Opcode::Increment,
            Response::MultiRead { .. } => Opcode::MultiRead,
            Response::MultiWrite { .. } => Opcode::MultiWrite,
            Response::MultiRemove { .. } => Opcode::MultiRemove,
            Response::MultiIncrement { .. } => Opcode::MultiIncrement,
            Response::TxPrepare { .. } => Opcode::TxPrepare,
            Response::TxDecision { .. } => Opcode::TxDecision,
            Response::TxRequestAbort { .. } => Opcode::TxRequestAbort,
            Response::Enumerate { .. } => Opcode::Enumerate,
            Response::TakeTabletOwnership => Opcode::TakeTabletOwnership,
            Response::DropTabletOwnership => Opcode::DropTabletOwnership,
            Response::GetServerStatistics { .. } => Opcode::GetServerStatistics,
            Response::RecoverTablets { .. } => Opcode::RecoverTablets,
            Response::BackupFenceMaster => Opcode::BackupFenceMaster,
            Response::RenewLease { .. } => Opcode::RenewLease,
            Response::SetLogHead => Opcode::SetLogHead,
            Response::HintServerCrashed => Opcode::HintServerCrashed,
            Response::ServerStopping => Opcode::ServerStopping,
            Response::ClientLease { .. } => Opcode::ClientLease,
            Response::CheckClientLeases { .. } => Opcode::CheckClientLeases,
            Response::SetUser { .. } => Opcode::SetUser,
            Response::DeleteUser { .. } => Opcode::DeleteUser,
            Response::ListUsers { .. } => Opcode::ListUsers,
            Response::WhoAmI { .. } => Opcode::WhoAmI,
            Response::GetUserDirectory { .. } => Opcode::GetUserDirectory,
            Response::AwaitTabletMap { .. } => Opcode::AwaitTabletMap,
            Response::RecoveryAcceptLoss => Opcode::RecoveryAcceptLoss,
            Response::SplitTablet => Opcode::SplitTablet,
            Response::MigrateTablet => Opcode::MigrateTablet,
            Response::TransferTablet { .. } => Opcode::TransferTablet,
            Response::ReceiveMigrationData { .. } => Opcode::ReceiveMigrationData,
            Response::AbandonMigration { .. } => Opcode::AbandonMigration,
            Response::ReplicasNeeded { .. } => Opcode::ReplicasNeeded,
            Response::BackupGetRecoveryData { .. } => Opcode::BackupGetRecoveryData,
            Response::BackupStartPartitioning { .. } => Opcode::BackupStartPartitioning,
            Response::BackupWrite => Opcode::BackupWrite,
            Response::BackupFree => Opcode::BackupFree,
            Response::BackupListReplicas { .. } => Opcode::BackupListReplicas,
            Response::BackupReadReplica { .. } => Opcode::BackupReadReplica,
            Response::BackupGetStatistics { .. } => Opcode::BackupGetStatistics,
        }
    }
}
