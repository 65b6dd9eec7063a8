//! Request and response bodies: encoding into whole frames, and decoding bodies that arrive from
//! the network.
//!
//! Decoding treats every byte as hostile: every read is bounds-checked, lengths are compared with
//! the bytes actually present before anything is sliced, no list is pre-allocated beyond what the
//! remaining bytes could hold, and every error is a [`DecodeError`], never a panic. Keys and
//! values are zero-copy slices of the received body.
//!
//! Encoding trusts its caller (the caller validated the values, or built them itself), but still
//! never panics and never produces a frame whose fields disagree with its length prefixes; see
//! the notes on [`encode_request`].

use std::fmt;

use bytes::{Bytes, BytesMut};
use stratus_types::limits::{
    CLIENT_LEASES_PER_CHECK_MAX, FAILURE_DOMAIN_BYTES_MAX, FRAME_BYTES_MAX,
    MIGRATION_COMPLETIONS_PER_BATCH_MAX, MULTI_OP_ITEMS_MAX, SERVERS_MAX, SERVER_ADDRESS_BYTES_MAX,
    TABLES_MAX, TABLETS_PER_TABLE_MAX, TABLE_NAME_BYTES_MAX, TRANSACTION_OBJECTS_MAX,
};
use stratus_types::limits::{
    GRANTS_PER_USER_MAX, TABLE_PATTERN_BYTES_MAX, USERS_MAX, USER_NAME_BYTES_MAX,
};
use stratus_types::Version;
use stratus_types::{ExpiresAt, Expiry, HashRange, RejectRules, SegmentId, ServerId, TableId};
use stratus_types::{LeaseId, RpcId, RpcIdentity, TabletState, Tier, TxDecision, TxOpKind, TxVote};

use crate::frame::{begin_frame, patch_length, FrameKind};
use crate::message::{
    AutoTableFigures, BackupDurability, BackupServiceStatistics, BackupWriteFlags,
    EnumeratedObject, EnumerationCursor, IncrementItem, IncrementItemResult, KeyItem,
    MigratedCompletion, Opcode, ReadItemResult, RecoveryReplica, RecoverySegment, RecoveryTablet,
    RemoveItem, ReplicaCertificate, ReplicaEntry, Request, Response, ServerEntry, ServerStatistics,
    ServerStatus, ServiceMask, TableEntry, TabletEntry, TxDecisionOp, TxOp, TxVoteItem,
    VersionItemResult, WriteItem, AUTO_TABLES_REPORTED_MAX,
};
use crate::put::{put_i64, put_u16, put_u32, put_u64, put_u8, put_version};
use crate::status::Status;
use crate::users::{
    Identity, TableAccess, TableGrant, UserCredentials, UserDirectorySnapshot, UserRecord,
    UserSummary,
};

/// Longest error message an error body carries, in bytes; longer messages are cut at a
/// character boundary by the encoder and refused by the decoder.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// Bit of the reject-rules flags byte: reject if the object does not exist.
const RULE_DOESNT_EXIST: u8 = 1 << 0;
/// Bit of the reject-rules flags byte: reject if the object exists.
const RULE_EXISTS: u8 = 1 << 1;
/// Bit of the reject-rules flags byte: reject if the version is <= the given one.
const RULE_VERSION_LE_GIVEN: u8 = 1 << 2;
/// Bit of the reject-rules flags byte: reject if the version is != the given one.
const RULE_VERSION_NE_GIVEN: u8 = 1 << 3;
/// Every defined reject-rules bit.
const RULES_KNOWN: u8 =
    RULE_DOESNT_EXIST | RULE_EXISTS | RULE_VERSION_LE_GIVEN | RULE_VERSION_NE_GIVEN;

/// Most tablets in one tablet map: every table spread as widely as allowed. The frame size
/// bounds it much further in practice.
const TABLETS_MAX: usize = TABLES_MAX * TABLETS_PER_TABLE_MAX;

/// Most objects in one enumeration response: as many of the smallest possible object (empty key
/// and value) as fit in a frame.
const ENUMERATED_OBJECTS_MAX: usize = FRAME_BYTES_MAX / (2 + 4 + 8);
/// Removed keys in one RECEIVE_MIGRATION_DATA: each takes at least its 2-byte length.
const REMOVED_KEYS_MAX: usize = FRAME_BYTES_MAX / 2;

/// Largest segment replica a backup stores, in bytes (8 MiB, the default segment size). A
/// BACKUP_READ_REPLICA response carries a whole replica in one frame, so this must leave room
/// for the response header and fields within `FRAME_BYTES_MAX`; a master replicates only
/// segments of at most this size.
pub const REPLICA_BYTES_MAX: usize = 8 << 20;

/// Most replicas one BACKUP_LIST_REPLICAS response lists (and so the most replicas one backup
/// may hold): 262 144 entries of 33 bytes fit a frame with room to spare.
pub const BACKUP_REPLICAS_MAX: usize = 262_144;

/// Bit of a replica entry's flags byte: the replica is closed.
const REPLICA_CLOSED: u8 = 1 << 0;
/// Bit of a replica entry's flags byte: the replica is the primary one.
const REPLICA_PRIMARY: u8 = 1 << 1;
/// Every defined replica flag bit.
const REPLICA_FLAGS_KNOWN: u8 = REPLICA_CLOSED | REPLICA_PRIMARY;

/// Most tablets one RECOVER_TABLETS request hands a recovery master (a crashed master's tablets,
/// each cut into at most one part per recovery master).
pub const RECOVERY_TABLETS_MAX: usize = 65_536;

/// Most partitions (recovery masters) one BACKUP_START_PARTITIONING names: one per server at
/// most. Together they hold at most `RECOVERY_TABLETS_MAX` tablets.
pub const RECOVERY_PARTITIONS_MAX: usize = SERVERS_MAX;

/// Most segments one RECOVER_TABLETS request lists: as many as a backup may hold replicas of.
pub const RECOVERY_SEGMENTS_MAX: usize = BACKUP_REPLICAS_MAX;

/// Most replicas one RECOVER_TABLETS request locates for one segment: more than any
/// replication factor in use; the coordinator sends only the newest epoch's.
pub const RECOVERY_REPLICAS_PER_SEGMENT_MAX: usize = 16;

/// Most replicas one RECOVER_TABLETS request locates in all: three per segment for logs of up
/// to 131 072 segments (1 TiB of 8 MiB segments), one and a half per segment at the most
/// segments. The coordinator sends fewer per segment (at least one) when a log has more.
pub const RECOVERY_REPLICAS_MAX: usize = 393_216;

/// Bytes of one located replica in RECOVER_TABLETS: backup index `u16`, epoch `u64`, length
/// `u32`, primary `u8`.
const RECOVERY_REPLICA_BYTES: usize = 2 + 8 + 4 + 1;
/// Bytes of a RECOVER_TABLETS segment without its replicas: id `u64`, replica count `u32`.
const RECOVERY_SEGMENT_BYTES_MIN: usize = 8 + 4;

// A RECOVER_TABLETS request at every maximum (tablets, backups of the longest address,
// segments, replicas) fits a frame.
const _: () = assert!(
    RECOVERY_TABLETS_MAX * RECOVERY_TABLET_BYTES
        + SERVERS_MAX * (2 + SERVER_ADDRESS_BYTES_MAX)
        + RECOVERY_SEGMENTS_MAX * RECOVERY_SEGMENT_BYTES_MIN
        + RECOVERY_REPLICAS_MAX * RECOVERY_REPLICA_BYTES
        + 4_096
        < FRAME_BYTES_MAX
);
// A replica names its backup by a u16 index.
const _: () = assert!(SERVERS_MAX <= u16::MAX as usize + 1);

// So does a BACKUP_START_PARTITIONING at every maximum.
const _: () = assert!(
    RECOVERY_TABLETS_MAX * RECOVERY_TABLET_BYTES
        + RECOVERY_SEGMENTS_MAX * 8
        + RECOVERY_PARTITIONS_MAX * 4
        + 4_096
        < FRAME_BYTES_MAX
);

const _: () = assert!(REPLICA_BYTES_MAX + 4_096 < FRAME_BYTES_MAX);
const _: () = assert!(BACKUP_REPLICAS_MAX * REPLICA_ENTRY_BYTES + 4_096 < FRAME_BYTES_MAX);

/// Why a body could not be decoded. The server answers with [`DecodeError::status`] and keeps the
/// connection (the frame envelope was fine, only this request is bad).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The body ends in the middle of a field.
    Truncated,
    /// Bytes remain after the last field.
    TrailingBytes,
    /// The opcode is not one this version defines.
    UnknownOpcode(u16),
    /// A field holds a value outside its domain (the name says which field).
    InvalidField(&'static str),
    /// A list is longer than its limit.
    TooManyItems {
        /// The count on the wire.
        count: u64,
        /// The limit.
        max: u64,
    },
    /// A string field is not valid UTF-8.
    InvalidUtf8,
    /// A storage tier code this version does not define (a newer peer's tier, or garbage):
    /// refused rather than read as the default, which would put a table's objects in the
    /// wrong tier.
    UnknownTier(u8),
}

impl DecodeError {
    /// The status a server answers with: UNIMPLEMENTED_REQUEST for an unknown opcode (a newer
    /// client), REQUEST_FORMAT_ERROR for everything else.
    pub fn status(&self) -> Status {
        match self {
            DecodeError::UnknownOpcode(_) => Status::UnimplementedRequest,
            _ => Status::RequestFormatError,
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("body is truncated"),
            DecodeError::TrailingBytes => f.write_str("body has trailing bytes"),
            DecodeError::UnknownOpcode(code) => write!(f, "unknown opcode {code}"),
            DecodeError::InvalidField(field) => write!(f, "invalid {field}"),
            DecodeError::UnknownTier(code) => {
                let known: Vec<String> =
                    Tier::ALL.iter().map(|tier| format!("{} {tier}", tier.code())).collect();
                write!(f, "unknown storage tier code {code} (known: {})", known.join(", "))
            }
            DecodeError::TooManyItems { count, max } => {
                write!(f, "list of {count} items exceeds the maximum of {max}")
            }
            DecodeError::InvalidUtf8 => f.write_str("string is not valid UTF-8"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A decoded response body: the operation's body, or the error message that replaces it for
/// statuses that do not carry one (see [`Status::carries_operation_body`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseBody {
    /// The operation's own body.
    Operation(Response),
    /// An error body.
    Error {
        /// Human-readable detail (may be empty).
        message: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Whole frames.

/// Appends one whole request frame for `request`.
///
/// The caller is responsible for sizes: a frame over `FRAME_BYTES_MAX` is still written, and
/// the server answers REQUEST_TOO_LARGE and closes the connection, so clients check sizes first.
/// A key longer than 65 535 bytes is sent as the empty key (which every master refuses with
/// INVALID_KEY) rather than cut to a different key; a name longer than 65 535 bytes is cut at a
/// character boundary (still over the name limit, so refused).
pub fn encode_request(out: &mut BytesMut, request_id: u64, request: &Request) {
    let start = begin_frame(out, FrameKind::Request, request.opcode().code(), request_id, None);
    encode_request_body(out, request);
    patch_length(out, start);
}

/// Appends one whole response frame carrying the operation body `response`, with `status`
/// (which must be one that carries an operation body). The opcode is taken from the variant.
///
/// If the frame would exceed `FRAME_BYTES_MAX`, it is replaced by an INTERNAL_ERROR error
/// response for the same request, so the client gets an answer instead of a dropped connection.
pub fn encode_response(out: &mut BytesMut, request_id: u64, status: Status, response: &Response) {
    debug_assert!(status.carries_operation_body(), "{status:?} carries an error body");
    let opcode = response.opcode();
    let start = begin_frame(out, FrameKind::Response, opcode.code(), request_id, Some(status));
    encode_response_body(out, response);
    let total = patch_length(out, start);
    if total > FRAME_BYTES_MAX {
        out.truncate(start.position());
        let message = format!(
            "response of {total} bytes exceeds the maximum frame size of {FRAME_BYTES_MAX} bytes"
        );
        encode_error_response(out, request_id, opcode.code(), Status::InternalError, &message);
    }
}

/// Appends one whole response frame with an error body: `message` (cut at a character boundary
/// to [`ERROR_MESSAGE_BYTES_MAX`] bytes). `opcode_code` is raw so an unknown opcode can be echoed.
pub fn encode_error_response(
    out: &mut BytesMut,
    request_id: u64,
    opcode_code: u16,
    status: Status,
    message: &str,
) {
    let start = begin_frame(out, FrameKind::Response, opcode_code, request_id, Some(status));
    put_string(out, truncate_at_char_boundary(message, ERROR_MESSAGE_BYTES_MAX));
    patch_length(out, start);
}

/// Decodes a request body (the bytes after the request header). Keys and values in the result
/// are slices of `body`, not copies.
pub fn decode_request(opcode_code: u16, body: Bytes) -> Result<Request, DecodeError> {
    let opcode = Opcode::from_code(opcode_code).ok_or(DecodeError::UnknownOpcode(opcode_code))?;
    let mut reader = Reader::new(body);
    let request = decode_request_body(opcode, &mut reader)?;
    reader.finish()?;
    Ok(request)
}

/// Decodes a response body (the bytes after the response header) for a request with `opcode`
/// that was answered with `status`.
pub fn decode_response(
    opcode: Opcode,
    status: Status,
    body: Bytes,
) -> Result<ResponseBody, DecodeError> {
    let mut reader = Reader::new(body);
    let decoded = if status.carries_operation_body() {
        ResponseBody::Operation(decode_response_body(opcode, &mut reader)?)
    } else {
        let message = reader.string(ERROR_MESSAGE_BYTES_MAX, "error message")?;
        ResponseBody::Error { message }
    };
    reader.finish()?;
    Ok(decoded)
}

// ---------------------------------------------------------------------------------------------
// Bodies: encoding.

fn encode_request_body(out: &mut BytesMut, request: &Request) {
    match request {
        Request::Ping
        | Request::GetServerList
        | Request::ListTables
        | Request::ListUsers
        | Request::WhoAmI
        | Request::GetServerStatistics
        | Request::BackupGetStatistics => {}
        Request::EnlistServer { address, services, previous_server_id, failure_domain } => {
            put_string(out, address);
            put_u32(out, services.0);
            put_u64(out, previous_server_id.0);
            put_string(out, failure_domain);
        }
        Request::CreateTable { name, server_span, tier } => {
            put_string(out, name);
            put_u32(out, *server_span);
            put_u8(out, tier.code());
        }
        Request::DropTable { name } | Request::GetTableId { name } => put_string(out, name),
        Request::GetTabletMap { table_id } => put_u64(out, table_id.0),
        Request::AwaitTabletMap { table_id, wait_millis, stale_owner } => {
            put_u64(out, table_id.0);
            put_u32(out, *wait_millis);
            put_u64(out, stale_owner.0);
        }
        Request::SplitTablet { name, split_hash } => {
            put_string(out, name);
            put_u64(out, *split_hash);
        }
        Request::MigrateTablet { name, start_hash, target } => {
            put_string(out, name);
            put_u64(out, *start_hash);
            put_u64(out, target.0);
        }
        Request::TransferTablet {
            master_id,
            table_id,
            range,
            assignment_epoch,
            target,
            target_address,
        } => {
            put_u64(out, master_id.0);
            put_u64(out, table_id.0);
            put_range(out, range);
            put_u64(out, *assignment_epoch);
            put_u64(out, target.0);
            put_string(out, target_address);
        }
        Request::ReceiveMigrationData {
            table_id,
            range,
            assignment_epoch,
            source,
            transfer_id,
            safe_version,
            first,
            tier,
            objects,
            removed_keys,
            completions,
        } => {
            put_u64(out, table_id.0);
            put_range(out, range);
            put_u64(out, *assignment_epoch);
            put_u64(out, source.0);
            put_u64(out, *transfer_id);
            put_version(out, *safe_version);
            put_u8(out, u8::from(*first));
            put_u8(out, tier.code());
            put_enumerated_objects(out, objects);
            put_count(out, removed_keys.len());
            for key in removed_keys {
                put_key(out, key);
            }
            put_count(out, completions.len());
            for completion in completions {
                put_migrated_completion(out, completion);
            }
        }
        Request::Read { table_id, key, rules } => put_key_item(out, *table_id, key, rules),
        Request::Remove { table_id, key, rules, rpc } => {
            put_key_item(out, *table_id, key, rules);
            put_rpc(out, rpc);
        }
        Request::Write { table_id, key, value, rules, expiry, rpc } => {
            put_u64(out, table_id.0);
            put_key(out, key);
            put_value(out, value);
            put_rules(out, rules);
            put_expiry(out, expiry);
            put_rpc(out, rpc);
        }
        Request::SetExpiry { table_id, key, expiry, rules, rpc } => {
            put_u64(out, table_id.0);
            put_key(out, key);
            put_expiry(out, expiry);
            put_rules(out, rules);
            put_rpc(out, rpc);
        }
        Request::Increment { table_id, key, delta, rules, rpc } => {
            put_u64(out, table_id.0);
            put_key(out, key);
            put_i64(out, *delta);
            put_rules(out, rules);
            put_rpc(out, rpc);
        }
        Request::MultiRead { items } => {
            put_count(out, items.len());
            for item in items {
                put_key_item(out, item.table_id, &item.key, &item.rules);
            }
        }
        Request::MultiRemove { items } => {
            put_count(out, items.len());
            for item in items {
                put_key_item(out, item.table_id, &item.key, &item.rules);
                put_rpc(out, &item.rpc);
            }
        }
        Request::MultiWrite { items } => {
            put_count(out, items.len());
            for item in items {
                put_u64(out, item.table_id.0);
                put_key(out, &item.key);
                put_value(out, &item.value);
                put_rules(out, &item.rules);
                put_expiry(out, &item.expiry);
                put_rpc(out, &item.rpc);
            }
        }
        Request::MultiIncrement { items } => {
            put_count(out, items.len());
            for item in items {
                put_u64(out, item.table_id.0);
                put_key(out, &item.key);
                put_i64(out, item.delta);
                put_rules(out, &item.rules);
                put_rpc(out, &item.rpc);
            }
        }
        Request::TxPrepare {
            lease,
            acknowledged,
            transaction,
            validate_only,
            ops,
            participants,
        } => {
            put_transaction(out, *lease, *acknowledged, *transaction);
            put_u8(out, u8::from(*validate_only));
            put_count(out, ops.len());
            for op in ops {
                put_u64(out, op.table_id.0);
                put_key(out, &op.key);
                put_u64(out, op.rpc.0);
                put_u8(out, op.kind.code());
                put_version(out, op.version_read);
                put_value(out, &op.value);
            }
            put_tx_decision_ops(out, participants);
        }
        Request::TxDecision { lease, acknowledged, transaction, decision, ops } => {
            put_transaction(out, *lease, *acknowledged, *transaction);
            put_u8(out, decision.code());
            put_tx_decision_ops(out, ops);
        }
        Request::TxRequestAbort { lease, transaction, ops } => {
            put_u64(out, lease.0);
            put_u64(out, transaction.0);
            put_tx_decision_ops(out, ops);
        }
        Request::ClientLease { lease } => put_u64(out, lease.0),
        Request::SetUser { user } => put_user_record(out, user),
        Request::DeleteUser { name } => put_string(out, name),
        Request::GetUserDirectory { known_version } => put_u64(out, *known_version),
        Request::CheckClientLeases { leases } => {
            put_count(out, leases.len());
            for lease in leases {
                put_u64(out, lease.0);
            }
        }
        Request::Enumerate { table_id, range, cursor, bytes_max } => {
            put_u64(out, table_id.0);
            put_range(out, range);
            put_cursor(out, cursor);
            put_u32(out, *bytes_max);
        }
        Request::TakeTabletOwnership { master_id, table_id, range, assignment_epoch, tier } => {
            put_u64(out, master_id.0);
            put_u64(out, table_id.0);
            put_range(out, range);
            put_u64(out, *assignment_epoch);
            put_u8(out, tier.code());
        }
        Request::DropTabletOwnership { master_id, table_id, range, assignment_epoch }
        | Request::AbandonMigration { master_id, table_id, range, assignment_epoch } => {
            put_u64(out, master_id.0);
            put_u64(out, table_id.0);
            put_range(out, range);
            put_u64(out, *assignment_epoch);
        }
        Request::BackupWrite { master_id, segment_id, epoch, offset, flags, certificate, data } => {
            put_u64(out, master_id.0);
            put_u64(out, segment_id.0);
            put_u64(out, *epoch);
            put_u32(out, *offset);
            put_u8(out, flags.to_byte());
            put_certificate(out, certificate);
            put_value(out, data);
        }
        Request::BackupFree { master_id, segment_id }
        | Request::BackupReadReplica { master_id, segment_id } => {
            put_u64(out, master_id.0);
            put_u64(out, segment_id.0);
        }
        Request::BackupListReplicas { master_id } | Request::BackupFenceMaster { master_id } => {
            put_u64(out, master_id.0)
        }
        Request::RenewLease { server_id }
        | Request::HintServerCrashed { server_id }
        | Request::ServerStopping { server_id }
        | Request::RecoveryAcceptLoss { server_id } => put_u64(out, server_id.0),
        Request::SetLogHead { server_id, segment_id, epoch } => {
            put_u64(out, server_id.0);
            put_u64(out, segment_id.0);
            put_u64(out, *epoch);
        }
        Request::BackupGetRecoveryData { master_id, segment_id, tablets } => {
            put_u64(out, master_id.0);
            put_u64(out, segment_id.0);
            put_count(out, tablets.len());
            for tablet in tablets {
                put_recovery_tablet(out, tablet);
            }
        }
        Request::BackupStartPartitioning { master_id, segments, partitions } => {
            put_u64(out, master_id.0);
            put_count(out, segments.len());
            for segment in segments {
                put_u64(out, segment.0);
            }
            put_count(out, partitions.len());
            for tablets in partitions {
                put_count(out, tablets.len());
                for tablet in tablets {
                    put_recovery_tablet(out, tablet);
                }
            }
        }
        Request::ReplicasNeeded { master_id, segment_ids } => {
            put_u64(out, master_id.0);
            put_segment_ids(out, segment_ids);
        }
        Request::RecoverTablets {
            master_id,
            crashed_master,
            tablets,
            backups,
            segments,
            assignment_epoch,
        } => {
            put_u64(out, master_id.0);
            put_u64(out, crashed_master.0);
            put_count(out, tablets.len());
            for tablet in tablets {
                put_recovery_tablet(out, tablet);
            }
            put_count(out, backups.len());
            for backup in backups {
                put_string(out, backup);
            }
            put_count(out, segments.len());
            for segment in segments {
                put_u64(out, segment.segment_id.0);
                put_count(out, segment.replicas.len());
                for replica in &segment.replicas {
                    put_u16(out, replica.backup);
                    put_u64(out, replica.epoch);
                    put_u32(out, replica.length);
                    put_u8(out, u8::from(replica.primary));
                }
            }
            put_u64(out, *assignment_epoch);
        }
    }
}

fn encode_response_body(out: &mut BytesMut, response: &Response) {
    match response {
        Response::Ping
        | Response::DropTable
        | Response::TakeTabletOwnership
        | Response::DropTabletOwnership
        | Response::BackupWrite
        | Response::BackupFree
        | Response::BackupFenceMaster
        | Response::SetLogHead
        | Response::HintServerCrashed
        | Response::ServerStopping
        | Response::RecoveryAcceptLoss
        | Response::SplitTablet
        | Response::MigrateTablet => {}
        Response::TransferTablet { creation_segment, objects_sent } => {
            put_u64(out, creation_segment.0);
            put_u64(out, *objects_sent);
        }
        Response::ReceiveMigrationData { creation_segment } => put_u64(out, creation_segment.0),
        Response::ReplicasNeeded { not_needed } => put_segment_ids(out, not_needed),
        Response::AbandonMigration { objects_dropped } => put_u64(out, *objects_dropped),
        Response::RenewLease { lease_ms } => put_u32(out, *lease_ms),
        Response::ClientLease { lease, term_ms } => {
            put_u64(out, lease.0);
            put_u32(out, *term_ms);
        }
        Response::SetUser { created } => put_u8(out, u8::from(*created)),
        Response::DeleteUser { existed } => put_u8(out, u8::from(*existed)),
        Response::ListUsers { users } => {
            put_count(out, users.len());
            for user in users {
                put_string(out, &user.name);
                put_u8(out, u8::from(user.enabled) | (u8::from(user.has_password) << 1));
                put_grants(out, &user.grants);
            }
        }
        Response::WhoAmI { identity } => put_identity(out, identity),
        Response::GetUserDirectory { directory: None } => put_u8(out, 0),
        Response::GetUserDirectory { directory: Some(directory) } => {
            put_u8(out, 1);
            put_u64(out, directory.version);
            put_u64(out, directory.next_table_id.0);
            put_count(out, directory.users.len());
            for user in &directory.users {
                put_user_record(out, user);
            }
            put_count(out, directory.tables.len());
            for (table_id, name) in &directory.tables {
                put_u64(out, table_id.0);
                put_string(out, name);
            }
        }
        Response::CheckClientLeases { remaining_ms } => {
            put_count(out, remaining_ms.len());
            for remaining in remaining_ms {
                put_u32(out, *remaining);
            }
        }
        Response::BackupStartPartitioning { replicas_to_partition } => {
            put_u32(out, *replicas_to_partition)
        }
        Response::BackupGetRecoveryData { certificate, data } => {
            put_certificate(out, certificate);
            put_value(out, data);
        }
        Response::BackupListReplicas { replicas } => {
            put_count(out, replicas.len());
            for replica in replicas {
                put_u64(out, replica.master_id.0);
                put_u64(out, replica.segment_id.0);
                put_u64(out, replica.epoch);
                put_certificate(out, &replica.certificate);
                put_u8(out, replica_flags(replica.closed, replica.primary));
            }
        }
        Response::RecoverTablets {
            segments_replayed,
            replica_bytes_read,
            objects_replayed,
            creation_segment,
        } => {
            put_u64(out, *segments_replayed);
            put_u64(out, *replica_bytes_read);
            put_u64(out, *objects_replayed);
            put_u64(out, creation_segment.0);
        }
        Response::BackupReadReplica { epoch, certificate, closed, primary, data } => {
            put_u64(out, *epoch);
            put_certificate(out, certificate);
            put_u8(out, replica_flags(*closed, *primary));
            put_value(out, data);
        }
        Response::BackupGetStatistics { statistics } => {
            let BackupServiceStatistics {
                durability,
                replicas,
                replicas_open,
                buffers_in_use,
                buffer_count,
                frames_free,
                frame_count,
                disk_syncs,
                disk_write_jobs,
                disk_data_bytes_written,
                storage_failure,
            } = statistics;
            put_u8(out, *durability as u8);
            for field in
                [replicas, replicas_open, buffers_in_use, buffer_count, frames_free, frame_count]
            {
                put_u32(out, *field);
            }
            for field in [disk_syncs, disk_write_jobs, disk_data_bytes_written] {
                put_u64(out, *field);
            }
            match storage_failure {
                None => put_u8(out, 0),
                Some(reason) => {
                    put_u8(out, 1);
                    put_string(out, truncate_at_char_boundary(reason, ERROR_MESSAGE_BYTES_MAX));
                }
            }
        }
        Response::EnlistServer { server_id } => put_u64(out, server_id.0),
        Response::GetServerList { servers } => {
            put_count(out, servers.len());
            for server in servers {
                put_u64(out, server.server_id.0);
                put_string(out, &server.address);
                put_u32(out, server.services.0);
                put_u8(out, server_status_code(server.status));
                put_string(out, &server.failure_domain);
            }
        }
        Response::CreateTable { table_id } | Response::GetTableId { table_id } => {
            put_u64(out, table_id.0);
        }
        Response::ListTables { tables } => {
            put_count(out, tables.len());
            for table in tables {
                put_string(out, &table.name);
                put_u64(out, table.table_id.0);
                put_u32(out, table.tablet_count);
                put_u8(out, table.tier.code());
            }
        }
        Response::GetTabletMap { tablets } | Response::AwaitTabletMap { tablets } => {
            put_count(out, tablets.len());
            for tablet in tablets {
                put_u64(out, tablet.table_id.0);
                put_range(out, &tablet.range);
                put_u64(out, tablet.owner.0);
                put_string(out, &tablet.owner_address);
                put_u8(out, tablet_state_code(tablet.state));
            }
        }
        Response::Read { version, value, expires_in_millis } => {
            put_version(out, *version);
            put_value(out, value);
            put_u64(out, *expires_in_millis);
        }
        Response::Write { version }
        | Response::Remove { version }
        | Response::SetExpiry { version } => put_version(out, *version),
        Response::Increment { version, value } => {
            put_version(out, *version);
            put_i64(out, *value);
        }
        Response::MultiRead { results } => {
            put_count(out, results.len());
            for result in results {
                put_u16(out, result.status.code());
                put_version(out, result.version);
                put_value(out, &result.value);
            }
        }
        Response::MultiWrite { results } | Response::MultiRemove { results } => {
            put_count(out, results.len());
            for result in results {
                put_u16(out, result.status.code());
                put_version(out, result.version);
            }
        }
        Response::MultiIncrement { results } => {
            put_count(out, results.len());
            for result in results {
                put_u16(out, result.status.code());
                put_version(out, result.version);
                put_i64(out, result.value);
            }
        }
        Response::TxPrepare { votes } | Response::TxRequestAbort { votes } => {
            put_count(out, votes.len());
            for vote in votes {
                put_u16(out, vote.status.code());
                put_u8(out, vote.vote.code());
                put_version(out, vote.version);
            }
        }
        Response::TxDecision { results } => {
            put_count(out, results.len());
            for status in results {
                put_u16(out, status.code());
            }
        }
        Response::Enumerate { objects, next } => {
            put_enumerated_objects(out, objects);
            match next {
                None => put_u8(out, 0),
                Some(cursor) => {
                    put_u8(out, 1);
                    put_cursor(out, cursor);
                }
            }
        }
        Response::GetServerStatistics { statistics } => {
            let ServerStatistics {
                server_id,
                log_bytes_total,
                log_bytes_live,
                log_bytes_allocated,
                seglets_total,
                seglets_free,
                segments_in_log,
                objects_live,
                tablets_owned,
                requests_served,
                replicas,
                log_bytes_live_objects,
                bytes_replicated,
                cleaner_bytes_replicated,
                segments_cleaned,
                cleaner_bytes_relocated,
                compactions,
                bytes_compacted,
                process_resident_bytes,
                log_bytes_resident,
                log_bytes_target,
                hash_table_bytes,
                auto_tables,
            } = statistics;
            put_u64(out, server_id.0);
            for field in [
                log_bytes_total,
                log_bytes_live,
                log_bytes_allocated,
                seglets_total,
                seglets_free,
                segments_in_log,
                objects_live,
            ] {
                put_u64(out, *field);
            }
            put_u32(out, *tablets_owned);
            put_u64(out, *requests_served);
            put_u32(out, *replicas);
            for field in [
                log_bytes_live_objects,
                bytes_replicated,
                cleaner_bytes_replicated,
                segments_cleaned,
                cleaner_bytes_relocated,
                compactions,
                bytes_compacted,
                process_resident_bytes,
                log_bytes_resident,
                log_bytes_target,
                hash_table_bytes,
            ] {
                put_u64(out, *field);
            }
            // A master reports at most AUTO_TABLES_REPORTED_MAX; more would not decode.
            let reported = &auto_tables[..auto_tables.len().min(AUTO_TABLES_REPORTED_MAX)];
            put_count(out, reported.len());
            for table in reported {
                put_u64(out, table.table_id.0);
                for field in [
                    table.dram_objects,
                    table.dram_bytes,
                    table.flash_objects,
                    table.flash_bytes,
                    table.reads_from_dram,
                    table.reads_from_flash,
                    table.promotions,
                    table.objects_demoted,
                ] {
                    put_u64(out, field);
                }
            }
        }
    }
}

/// The longest prefix of `text` of at most `max` bytes that ends on a character boundary.
fn truncate_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    // Index 0 is always a boundary, so the search always succeeds.
    let end = (0..=max).rev().find(|&index| text.is_char_boundary(index)).unwrap_or(0);
    text.get(..end).unwrap_or("")
}

/// u16 length + UTF-8. Strings longer than a u16 can count are cut (see [`encode_request`]).
fn put_string(out: &mut BytesMut, text: &str) {
    let text = truncate_at_char_boundary(text, usize::from(u16::MAX));
    // Fits: cut to u16::MAX above.
    put_u16(out, text.len() as u16);
    out.extend_from_slice(text.as_bytes());
}

/// A list of objects as ENUMERATE returns them and RECEIVE_MIGRATION_DATA carries them.
fn put_enumerated_objects(out: &mut BytesMut, objects: &[EnumeratedObject]) {
    put_count(out, objects.len());
    for object in objects {
        put_key(out, &object.key);
        put_value(out, &object.value);
        put_version(out, object.version);
        put_expires_at(out, object.expires_at);
    }
}

/// An expiry as a write asks for it: a kind byte (0 never, 1 keep, 2 after milliseconds, 3 at
/// milliseconds since the Unix epoch), then a u64 (0 for never and keep).
fn put_expiry(out: &mut BytesMut, expiry: &Expiry) {
    let (kind, millis) = match *expiry {
        Expiry::Never => (EXPIRY_NEVER, 0),
        Expiry::Keep => (EXPIRY_KEEP, 0),
        Expiry::AfterMillis(millis) => (EXPIRY_AFTER_MILLIS, millis),
        Expiry::AtMillis(millis) => (EXPIRY_AT_MILLIS, millis),
    };
    put_u8(out, kind);
    put_u64(out, millis);
}

/// An exactly-once identity as an option: a tag byte (0 none, 1 present), then the lease id,
/// the rpc id and the acknowledged mark, u64 each.
fn put_rpc(out: &mut BytesMut, rpc: &Option<RpcIdentity>) {
    match rpc {
        None => put_u8(out, 0),
        Some(rpc) => {
            put_u8(out, 1);
            put_u64(out, rpc.lease.0);
            put_u64(out, rpc.rpc.0);
            put_u64(out, rpc.acknowledged.0);
        }
    }
}

/// A transaction's identity as TX_PREPARE and TX_DECISION open with it: the lease, the
/// acknowledged mark and the transaction's first rpc id, u64 each.
fn put_transaction(out: &mut BytesMut, lease: LeaseId, acknowledged: RpcId, transaction: RpcId) {
    put_u64(out, lease.0);
    put_u64(out, acknowledged.0);
    put_u64(out, transaction.0);
}

/// A list of transaction ops named by table, key hash and rpc id (u64 each).
fn put_tx_decision_ops(out: &mut BytesMut, ops: &[TxDecisionOp]) {
    put_count(out, ops.len());
    for op in ops {
        put_u64(out, op.table_id.0);
        put_u64(out, op.key_hash);
        put_u64(out, op.rpc.0);
    }
}

/// A migrated completion: key hash, lease, rpc id, acknowledged, version (u64 each), then the
/// increment's value as an option (tag byte, i64).
fn put_migrated_completion(out: &mut BytesMut, completion: &MigratedCompletion) {
    put_u64(out, completion.key_hash);
    put_u64(out, completion.lease.0);
    put_u64(out, completion.rpc.0);
    put_u64(out, completion.acknowledged.0);
    put_version(out, completion.version);
    match completion.integer {
        None => put_u8(out, 0),
        Some(integer) => {
            put_u8(out, 1);
            put_i64(out, integer);
        }
    }
}

/// An object's expiry time, as an option of u64 milliseconds since the Unix epoch.
fn put_expires_at(out: &mut BytesMut, expires_at: Option<ExpiresAt>) {
    match expires_at {
        None => put_u8(out, 0),
        Some(ExpiresAt(millis)) => {
            put_u8(out, 1);
            put_u64(out, millis);
        }
    }
}

/// u16 length + bytes. A key too long for its prefix is sent empty (see [`encode_request`]).
fn put_key(out: &mut BytesMut, key: &[u8]) {
    match u16::try_from(key.len()) {
        Ok(length) => {
            put_u16(out, length);
            out.extend_from_slice(key);
        }
        Err(_) => put_u16(out, 0),
    }
}

/// u32 length + bytes. A value over 4 GiB cannot be in a legal frame; it is cut so the prefix
/// stays consistent, and the frame is refused by its size.
fn put_value(out: &mut BytesMut, value: &[u8]) {
    let length = u32::try_from(value.len()).unwrap_or(u32::MAX);
    put_u32(out, length);
    out.extend_from_slice(value.get(..length as usize).unwrap_or(value));
}

/// u32 item count (saturating; such a list is far over the frame limit).
/// A user record's bytes as SET_USER carries it (wire-protocol.md, "Users"), for stores
/// that keep users in the same layout (the coordinator's records).
pub fn encode_user_record(user: &UserRecord) -> BytesMut {
    let mut out = BytesMut::new();
    put_user_record(&mut out, user);
    out
}

/// Parses [`encode_user_record`]'s bytes, validated as a received one is.
pub fn decode_user_record(bytes: Bytes) -> Result<UserRecord, DecodeError> {
    let mut reader = Reader::new(bytes);
    let user = reader.user_record()?;
    reader.finish()?;
    Ok(user)
}

/// A user record (SET_USER, GET_USER_DIRECTORY): name, flags (bit 0 enabled, bit 1
/// credentials follow), the credentials, the grants.
fn put_user_record(out: &mut BytesMut, user: &UserRecord) {
    put_string(out, &user.name);
    put_u8(out, u8::from(user.enabled) | (u8::from(user.credentials.is_some()) << 1));
    if let Some(credentials) = &user.credentials {
        out.extend_from_slice(&credentials.salt);
        out.extend_from_slice(&credentials.stored_key);
        out.extend_from_slice(&credentials.server_key);
    }
    put_grants(out, &user.grants);
}

fn put_grants(out: &mut BytesMut, grants: &[TableGrant]) {
    put_count(out, grants.len());
    for grant in grants {
        put_string(out, &grant.pattern);
        put_u8(out, grant.access.bits());
    }
}

fn put_identity(out: &mut BytesMut, identity: &Identity) {
    match identity {
        Identity::Open => put_u8(out, IDENTITY_OPEN),
        Identity::Member => put_u8(out, IDENTITY_MEMBER),
        Identity::Default => put_u8(out, IDENTITY_DEFAULT),
        Identity::Anonymous => put_u8(out, IDENTITY_ANONYMOUS),
        Identity::User { name, grants } => {
            put_u8(out, IDENTITY_USER);
            put_string(out, name);
            put_grants(out, grants);
        }
    }
}

fn put_count(out: &mut BytesMut, count: usize) {
    put_u32(out, u32::try_from(count).unwrap_or(u32::MAX));
}

fn put_rules(out: &mut BytesMut, rules: &RejectRules) {
    put_version(out, rules.given_version);
    let mut flags = 0;
    if rules.doesnt_exist {
        flags |= RULE_DOESNT_EXIST;
    }
    if rules.exists {
        flags |= RULE_EXISTS;
    }
    if rules.version_le_given {
        flags |= RULE_VERSION_LE_GIVEN;
    }
    if rules.version_ne_given {
        flags |= RULE_VERSION_NE_GIVEN;
    }
    put_u8(out, flags);
}

fn put_key_item(out: &mut BytesMut, table_id: TableId, key: &[u8], rules: &RejectRules) {
    put_u64(out, table_id.0);
    put_key(out, key);
    put_rules(out, rules);
}

fn put_range(out: &mut BytesMut, range: &HashRange) {
    put_u64(out, range.start);
    put_u64(out, range.end);
}

fn recovery_tablet(reader: &mut Reader) -> Result<RecoveryTablet, DecodeError> {
    Ok(RecoveryTablet {
        table_id: reader.table_id()?,
        range: reader.range()?,
        creation_segment: reader.segment_id()?,
        tier: reader.tier()?,
    })
}

/// A tablet map (GET_TABLET_MAP's and AWAIT_TABLET_MAP's answers).
fn tablet_entries(reader: &mut Reader) -> Result<Vec<TabletEntry>, DecodeError> {
    reader.list(TABLETS_MAX, TABLET_ENTRY_BYTES_MIN, |reader| {
        Ok(TabletEntry {
            table_id: reader.table_id()?,
            range: reader.range()?,
            owner: reader.server_id()?,
            owner_address: reader.string(SERVER_ADDRESS_BYTES_MAX, "server address")?,
            state: reader.tablet_state()?,
        })
    })
}

/// RECOVER_TABLETS' segments, each with its located replicas: at most
/// `RECOVERY_REPLICAS_PER_SEGMENT_MAX` each and `RECOVERY_REPLICAS_MAX` in all, each naming
/// one of the request's `backup_count` backups.
fn recovery_segments(
    reader: &mut Reader,
    backup_count: usize,
) -> Result<Vec<RecoverySegment>, DecodeError> {
    let mut replicas_left = RECOVERY_REPLICAS_MAX;
    reader.list(RECOVERY_SEGMENTS_MAX, RECOVERY_SEGMENT_BYTES_MIN, |reader| {
        let segment_id = reader.segment_id()?;
        let replicas =
            reader.list(RECOVERY_REPLICAS_PER_SEGMENT_MAX, RECOVERY_REPLICA_BYTES, |reader| {
                let backup = reader.u16()?;
                if usize::from(backup) >= backup_count {
                    return Err(DecodeError::InvalidField("replica's backup index"));
                }
                Ok(RecoveryReplica {
                    backup,
                    epoch: reader.u64()?,
                    length: reader.u32()?,
                    primary: reader.bool("replica's primary flag")?,
                })
            })?;
        replicas_left = replicas_left.checked_sub(replicas.len()).ok_or_else(|| {
            // The replicas so far, this segment's included.
            let count = RECOVERY_REPLICAS_MAX - replicas_left + replicas.len();
            DecodeError::TooManyItems { count: count as u64, max: RECOVERY_REPLICAS_MAX as u64 }
        })?;
        Ok(RecoverySegment { segment_id, replicas })
    })
}

fn put_recovery_tablet(out: &mut BytesMut, tablet: &RecoveryTablet) {
    put_u64(out, tablet.table_id.0);
    put_range(out, &tablet.range);
    put_u64(out, tablet.creation_segment.0);
    put_u8(out, tablet.tier.code());
}

fn put_cursor(out: &mut BytesMut, cursor: &EnumerationCursor) {
    put_u64(out, cursor.reversed_hash);
    match &cursor.after_key {
        None => put_u8(out, 0),
        Some(key) => {
            put_u8(out, 1);
            put_key(out, key);
        }
    }
}

fn put_certificate(out: &mut BytesMut, certificate: &ReplicaCertificate) {
    put_u32(out, certificate.segment_length);
    put_u32(out, certificate.checksum);
}

fn replica_flags(closed: bool, primary: bool) -> u8 {
    let mut flags = 0;
    if closed {
        flags |= REPLICA_CLOSED;
    }
    if primary {
        flags |= REPLICA_PRIMARY;
    }
    flags
}

fn server_status_code(status: ServerStatus) -> u8 {
    status as u8
}

fn tablet_state_code(state: TabletState) -> u8 {
    match state {
        TabletState::Normal => 0,
        TabletState::Recovering => 1,
        TabletState::Unavailable => 2,
    }
}

// ---------------------------------------------------------------------------------------------
// Bodies: decoding.

/// A bounds-checked cursor over a received body.
struct Reader {
    body: Bytes,
    position: usize,
}

impl Reader {
    fn new(body: Bytes) -> Reader {
        Reader { body, position: 0 }
    }

    fn remaining(&self) -> usize {
        self.body.len().saturating_sub(self.position)
    }

    /// The next `length` bytes as a zero-copy slice of the body.
    fn bytes(&mut self, length: usize) -> Result<Bytes, DecodeError> {
        if length > self.remaining() {
            return Err(DecodeError::Truncated);
        }
        // In range: position + length <= body.len().
        let end = self.position + length;
        let bytes = self.body.slice(self.position..end);
        self.position = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self.position.checked_add(N).ok_or(DecodeError::Truncated)?;
        let array = self
            .body
            .get(self.position..end)
            .and_then(|slice| <[u8; N]>::try_from(slice).ok())
            .ok_or(DecodeError::Truncated)?;
        self.position = end;
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        let [byte] = self.array::<1>()?;
        Ok(byte)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.array().map(u16::from_le_bytes)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        self.array().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        self.array().map(i64::from_le_bytes)
    }

    fn version(&mut self) -> Result<Version, DecodeError> {
        self.u64().map(Version)
    }

    /// A list of objects as ENUMERATE returns them and RECEIVE_MIGRATION_DATA carries them.
    fn enumerated_objects(&mut self) -> Result<Vec<EnumeratedObject>, DecodeError> {
        self.list(ENUMERATED_OBJECTS_MAX, ENUMERATED_OBJECT_BYTES_MIN, |reader| {
            Ok(EnumeratedObject {
                key: reader.key()?,
                value: reader.value()?,
                version: reader.version()?,
                expires_at: reader.expires_at()?,
            })
        })
    }

    /// An expiry (see [`put_expiry`]); a kind out of range, or a never or keep that carries
    /// a time, is a format error (the encoding is canonical).
    fn expiry(&mut self) -> Result<Expiry, DecodeError> {
        let kind = self.u8()?;
        let millis = self.u64()?;
        match (kind, millis) {
            (EXPIRY_NEVER, 0) => Ok(Expiry::Never),
            (EXPIRY_KEEP, 0) => Ok(Expiry::Keep),
            (EXPIRY_AFTER_MILLIS, millis) => Ok(Expiry::AfterMillis(millis)),
            (EXPIRY_AT_MILLIS, millis) => Ok(Expiry::AtMillis(millis)),
            _ => Err(DecodeError::InvalidField("expiry")),
        }
    }

    /// An option of an exactly-once identity (see [`put_rpc`]); one that cannot be right
    /// (lease 0, rpc 0, an rpc acknowledging itself) is a format error.
    fn rpc(&mut self) -> Result<Option<RpcIdentity>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => {
                let rpc = RpcIdentity {
                    lease: LeaseId(self.u64()?),
                    rpc: RpcId(self.u64()?),
                    acknowledged: RpcId(self.u64()?),
                };
                rpc.validate().map_err(|_| DecodeError::InvalidField("rpc identity"))?;
                Ok(Some(rpc))
            }
            _ => Err(DecodeError::InvalidField("rpc identity tag")),
        }
    }

    /// A transaction's identity (see [`put_transaction`]): lease 0, transaction id 0, or a
    /// transaction the client says it acknowledged, is a format error.
    fn transaction(&mut self) -> Result<(LeaseId, RpcId, RpcId), DecodeError> {
        let lease = LeaseId(self.u64()?);
        let acknowledged = RpcId(self.u64()?);
        let transaction = RpcId(self.u64()?);
        if lease.0 == 0 {
            return Err(DecodeError::InvalidField("transaction lease"));
        }
        if transaction.0 == 0 || acknowledged >= transaction {
            return Err(DecodeError::InvalidField("transaction id"));
        }
        Ok((lease, acknowledged, transaction))
    }

    /// The rpc id of one operation of a transaction: 0, or one the client says it
    /// acknowledged, is a format error (as for an rpc identity).
    fn transaction_op_rpc(&mut self, acknowledged: RpcId) -> Result<RpcId, DecodeError> {
        let rpc = RpcId(self.u64()?);
        if rpc.0 == 0 || acknowledged >= rpc {
            return Err(DecodeError::InvalidField("transaction op rpc id"));
        }
        Ok(rpc)
    }

    /// One TX_PREPARE op (see [`TxOp`]); a value on an op other than a write, or an op other
    /// than a read in a validate-only request, is a format error.
    fn tx_op(&mut self, acknowledged: RpcId, validate_only: bool) -> Result<TxOp, DecodeError> {
        let table_id = self.table_id()?;
        let key = self.key()?;
        let rpc = self.transaction_op_rpc(acknowledged)?;
        let kind = TxOpKind::from_code(self.u8()?)
            .ok_or(DecodeError::InvalidField("transaction op kind"))?;
        if validate_only && kind != TxOpKind::Read {
            return Err(DecodeError::InvalidField("validate-only op kind"));
        }
        let version_read = self.version()?;
        let value = self.value()?;
        if kind != TxOpKind::Write && !value.is_empty() {
            return Err(DecodeError::InvalidField("transaction op value"));
        }
        Ok(TxOp { table_id, key, rpc, kind, version_read, value })
    }

    /// A list of at most `max` transaction ops named by table, key hash and rpc id (see
    /// [`put_tx_decision_ops`]); each rpc id must be above `acknowledged` (so never 0).
    fn tx_decision_ops(
        &mut self,
        max: usize,
        acknowledged: RpcId,
    ) -> Result<Vec<TxDecisionOp>, DecodeError> {
        self.list(max, TX_DECISION_OP_BYTES, |reader| {
            Ok(TxDecisionOp {
                table_id: reader.table_id()?,
                key_hash: reader.u64()?,
                rpc: reader.transaction_op_rpc(acknowledged)?,
            })
        })
    }

    /// TX_PREPARE, TX_DECISION or TX_REQUEST_ABORT votes (see [`TxVoteItem`]).
    fn tx_votes(&mut self) -> Result<Vec<TxVoteItem>, DecodeError> {
        self.list(MULTI_OP_ITEMS_MAX, TX_VOTE_BYTES, |reader| {
            Ok(TxVoteItem {
                status: reader.status()?,
                vote: TxVote::from_code(reader.u8()?)
                    .ok_or(DecodeError::InvalidField("transaction vote"))?,
                version: reader.version()?,
            })
        })
    }

    /// A migrated completion (see [`put_migrated_completion`]).
    fn migrated_completion(&mut self) -> Result<MigratedCompletion, DecodeError> {
        let completion = MigratedCompletion {
            key_hash: self.u64()?,
            lease: LeaseId(self.u64()?),
            rpc: RpcId(self.u64()?),
            acknowledged: RpcId(self.u64()?),
            version: self.version()?,
            integer: match self.u8()? {
                0 => None,
                1 => Some(self.i64()?),
                _ => return Err(DecodeError::InvalidField("completion integer tag")),
            },
        };
        let identity = RpcIdentity {
            lease: completion.lease,
            rpc: completion.rpc,
            acknowledged: completion.acknowledged,
        };
        identity.validate().map_err(|_| DecodeError::InvalidField("completion rpc identity"))?;
        Ok(completion)
    }

    /// An option of an expiry time (see [`put_expires_at`]).
    fn expires_at(&mut self) -> Result<Option<ExpiresAt>, DecodeError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(ExpiresAt(self.u64()?))),
            _ => Err(DecodeError::InvalidField("expiry time tag")),
        }
    }

    fn table_id(&mut self) -> Result<TableId, DecodeError> {
        self.u64().map(TableId)
    }

    fn server_id(&mut self) -> Result<ServerId, DecodeError> {
        self.u64().map(ServerId)
    }

    /// u16 length + UTF-8, at most `max` bytes.
    fn string(&mut self, max: usize, field: &'static str) -> Result<String, DecodeError> {
        let length = usize::from(self.u16()?);
        let bytes = self.bytes(length)?;
        // Checked after reading, so a truncated body reports Truncated, not a length error.
        if length > max {
            return Err(DecodeError::InvalidField(field));
        }
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8)
    }

    /// u16 length + bytes (empty allowed: the master answers INVALID_KEY).
    fn key(&mut self) -> Result<Bytes, DecodeError> {
        let length = usize::from(self.u16()?);
        self.bytes(length)
    }

    /// u32 length + bytes (the master checks its configured maximum).
    fn value(&mut self) -> Result<Bytes, DecodeError> {
        let length = usize::try_from(self.u32()?).map_err(|_| DecodeError::Truncated)?;
        self.bytes(length)
    }

    fn rules(&mut self) -> Result<RejectRules, DecodeError> {
        let given_version = self.version()?;
        let flags = self.u8()?;
        if flags & !RULES_KNOWN != 0 {
            return Err(DecodeError::InvalidField("reject rules flags"));
        }
        Ok(RejectRules {
            given_version,
            doesnt_exist: flags & RULE_DOESNT_EXIST != 0,
            exists: flags & RULE_EXISTS != 0,
            version_le_given: flags & RULE_VERSION_LE_GIVEN != 0,
            version_ne_given: flags & RULE_VERSION_NE_GIVEN != 0,
        })
    }

    fn range(&mut self) -> Result<HashRange, DecodeError> {
        let start = self.u64()?;
        let end = self.u64()?;
        HashRange::new(start, end).ok_or(DecodeError::InvalidField("hash range"))
    }

    fn cursor(&mut self) -> Result<EnumerationCursor, DecodeError> {
        let reversed_hash = self.u64()?;
        let after_key = match self.u8()? {
            0 => None,
            1 => Some(self.key()?),
            _ => return Err(DecodeError::InvalidField("cursor key flag")),
        };
        Ok(EnumerationCursor { reversed_hash, after_key })
    }

    fn segment_id(&mut self) -> Result<SegmentId, DecodeError> {
        Ok(SegmentId(self.u64()?))
    }

    fn certificate(&mut self) -> Result<ReplicaCertificate, DecodeError> {
        Ok(ReplicaCertificate { segment_length: self.u32()?, checksum: self.u32()? })
    }

    /// A replica flags byte: (closed, primary).
    fn replica_flags(&mut self) -> Result<(bool, bool), DecodeError> {
        let flags = self.u8()?;
        if flags & !REPLICA_FLAGS_KNOWN != 0 {
            return Err(DecodeError::InvalidField("replica flags"));
        }
        Ok((flags & REPLICA_CLOSED != 0, flags & REPLICA_PRIMARY != 0))
    }

    fn status(&mut self) -> Result<Status, DecodeError> {
        let code = self.u16()?;
        Status::from_code(code).ok_or(DecodeError::InvalidField("status"))
    }

    fn services(&mut self) -> Result<ServiceMask, DecodeError> {
        let bits = self.u32()?;
        if bits & !ServiceMask::KNOWN != 0 {
            return Err(DecodeError::InvalidField("service mask"));
        }
        Ok(ServiceMask(bits))
    }

    fn server_status(&mut self) -> Result<ServerStatus, DecodeError> {
        match self.u8()? {
            0 => Ok(ServerStatus::Up),
            1 => Ok(ServerStatus::Crashed),
            2 => Ok(ServerStatus::Removed),
            3 => Ok(ServerStatus::Stopped),
            _ => Err(DecodeError::InvalidField("server status")),
        }
    }

    fn tier(&mut self) -> Result<Tier, DecodeError> {
        let code = self.u8()?;
        Tier::from_code(code).ok_or(DecodeError::UnknownTier(code))
    }

    fn tablet_state(&mut self) -> Result<TabletState, DecodeError> {
        match self.u8()? {
            0 => Ok(TabletState::Normal),
            1 => Ok(TabletState::Recovering),
            2 => Ok(TabletState::Unavailable),
            _ => Err(DecodeError::InvalidField("tablet state")),
        }
    }

    /// A u32 count then that many items. Refuses counts over `max`; pre-allocates no more items
    /// than the remaining bytes could hold at `item_bytes_min` each, so a lying count costs
    /// nothing.
    fn list<T>(
        &mut self,
        max: usize,
        item_bytes_min: usize,
        mut item: impl FnMut(&mut Reader) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, DecodeError> {
        let count = self.u32()?;
        if u64::from(count) > max as u64 {
            return Err(DecodeError::TooManyItems { count: u64::from(count), max: max as u64 });
        }
        let count = count as usize;
        let affordable = self.remaining() / item_bytes_min.max(1);
        let mut items = Vec::with_capacity(count.min(affordable));
        for _ in 0..count {
            items.push(item(self)?);
        }
        Ok(items)
    }

    /// A u8 that must be 0 (false) or 1 (true).
    fn bool(&mut self, field: &'static str) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::InvalidField(field)),
        }
    }

    fn grants(&mut self) -> Result<Vec<TableGrant>, DecodeError> {
        self.list(GRANTS_PER_USER_MAX, GRANT_BYTES_MIN, |reader| {
            let pattern = reader.string(TABLE_PATTERN_BYTES_MAX, "table pattern")?;
            let access = TableAccess::from_bits(reader.u8()?)
                .ok_or(DecodeError::InvalidField("table access"))?;
            let grant = TableGrant { pattern, access };
            grant.validate().map_err(|_| DecodeError::InvalidField("grant"))?;
            Ok(grant)
        })
    }

    fn user_record(&mut self) -> Result<UserRecord, DecodeError> {
        let name = self.string(USER_NAME_BYTES_MAX, "user name")?;
        let flags = self.u8()?;
        if flags & !0b11 != 0 {
            return Err(DecodeError::InvalidField("user flags"));
        }
        let credentials = if flags & 2 != 0 {
            Some(UserCredentials {
                salt: self.array()?,
                stored_key: self.array()?,
                server_key: self.array()?,
            })
        } else {
            None
        };
        let user =
            UserRecord { name, enabled: flags & 1 != 0, credentials, grants: self.grants()? };
        user.validate().map_err(|_| DecodeError::InvalidField("user"))?;
        Ok(user)
    }

    fn identity(&mut self) -> Result<Identity, DecodeError> {
        Ok(match self.u8()? {
            IDENTITY_OPEN => Identity::Open,
            IDENTITY_MEMBER => Identity::Member,
            IDENTITY_DEFAULT => Identity::Default,
            IDENTITY_ANONYMOUS => Identity::Anonymous,
            IDENTITY_USER => Identity::User {
                name: self.string(USER_NAME_BYTES_MAX, "user name")?,
                grants: self.grants()?,
            },
            _ => return Err(DecodeError::InvalidField("identity")),
        })
    }

    fn user_directory(&mut self) -> Result<UserDirectorySnapshot, DecodeError> {
        let version = self.u64()?;
        let next_table_id = self.table_id()?;
        let users = self.list(USERS_MAX, USER_RECORD_BYTES_MIN, Reader::user_record)?;
        let tables = self.list(TABLES_MAX, 8 + 2, |reader| {
            Ok((reader.table_id()?, reader.string(TABLE_NAME_BYTES_MAX, "table name")?))
        })?;
        let directory = UserDirectorySnapshot { version, next_table_id, users, tables };
        directory.validate().map_err(|_| DecodeError::InvalidField("user directory"))?;
        Ok(directory)
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}

/// Smallest encodings of list items, for bounding pre-allocation.
const KEY_ITEM_BYTES_MIN: usize = 8 + 2 + 9;
const REMOVE_ITEM_BYTES_MIN: usize = KEY_ITEM_BYTES_MIN + 1;
const WRITE_ITEM_BYTES_MIN: usize = 8 + 2 + 4 + 9 + EXPIRY_BYTES + 1;
const INCREMENT_ITEM_BYTES_MIN: usize = 8 + 2 + 8 + 9 + 1;
const MIGRATED_COMPLETION_BYTES_MIN: usize = 5 * 8 + 1;
const SERVER_ENTRY_BYTES_MIN: usize = 8 + 2 + 4 + 1 + 2;
const TABLE_ENTRY_BYTES_MIN: usize = 2 + 8 + 4 + 1;
const TABLET_ENTRY_BYTES_MIN: usize = 8 + 16 + 8 + 2 + 1;
const READ_RESULT_BYTES_MIN: usize = 2 + 8 + 4;
const VERSION_RESULT_BYTES_MIN: usize = 2 + 8;
const INCREMENT_RESULT_BYTES_MIN: usize = 2 + 8 + 8;
const ENUMERATED_OBJECT_BYTES_MIN: usize = 2 + 4 + 8 + 1;
const TX_OP_BYTES_MIN: usize = 8 + 2 + 8 + 1 + 8 + 4;
const TX_DECISION_OP_BYTES: usize = 8 + 8 + 8;
const TX_VOTE_BYTES: usize = 2 + 1 + 8;
const STATUS_BYTES: usize = 2;
const GRANT_BYTES_MIN: usize = 2 + 1 + 1;
const USER_RECORD_BYTES_MIN: usize = 2 + 1 + 1 + 4;
const USER_SUMMARY_BYTES_MIN: usize = USER_RECORD_BYTES_MIN;
/// The kinds of a WHO_AM_I identity.
const IDENTITY_OPEN: u8 = 0;
const IDENTITY_MEMBER: u8 = 1;
const IDENTITY_DEFAULT: u8 = 2;
const IDENTITY_ANONYMOUS: u8 = 3;
const IDENTITY_USER: u8 = 4;
/// An expiry on the wire: kind byte and u64.
const EXPIRY_BYTES: usize = 1 + 8;
const EXPIRY_NEVER: u8 = 0;
const EXPIRY_KEEP: u8 = 1;
const EXPIRY_AFTER_MILLIS: u8 = 2;
const EXPIRY_AT_MILLIS: u8 = 3;
/// Bytes of one BACKUP_LIST_REPLICAS entry (fixed size).
const REPLICA_ENTRY_BYTES: usize = 8 + 8 + 8 + 8 + 1;
const RECOVERY_TABLET_BYTES: usize = 8 + 16 + 8 + 1;

fn key_item(reader: &mut Reader) -> Result<KeyItem, DecodeError> {
    Ok(KeyItem { table_id: reader.table_id()?, key: reader.key()?, rules: reader.rules()? })
}

fn remove_item(reader: &mut Reader) -> Result<RemoveItem, DecodeError> {
    let KeyItem { table_id, key, rules } = key_item(reader)?;
    Ok(RemoveItem { table_id, key, rules, rpc: reader.rpc()? })
}

fn decode_request_body(opcode: Opcode, reader: &mut Reader) -> Result<Request, DecodeError> {
    Ok(match opcode {
        Opcode::Ping => Request::Ping,
        Opcode::EnlistServer => Request::EnlistServer {
            address: reader.string(SERVER_ADDRESS_BYTES_MAX, "server address")?,
            services: reader.services()?,
            previous_server_id: reader.server_id()?,
            failure_domain: reader.string(FAILURE_DOMAIN_BYTES_MAX, "failure domain")?,
        },
        Opcode::GetServerList => Request::GetServerList,
        Opcode::CreateTable => Request::CreateTable {
            name: reader.string(TABLE_NAME_BYTES_MAX, "table name")?,
            server_span: reader.u32()?,
            tier: reader.tier()?,
        },
        Opcode::DropTable => {
            Request::DropTable { name: reader.string(TABLE_NAME_BYTES_MAX, "table name")? }
        }
        Opcode::GetTableId => {
            Request::GetTableId { name: reader.string(TABLE_NAME_BYTES_MAX, "table name")? }
        }
        Opcode::ListTables => Request::ListTables,
        Opcode::GetTabletMap => Request::GetTabletMap { table_id: reader.table_id()? },
        Opcode::AwaitTabletMap => Request::AwaitTabletMap {
            table_id: reader.table_id()?,
            wait_millis: reader.u32()?,
            stale_owner: reader.server_id()?,
        },
        Opcode::SplitTablet => Request::SplitTablet {
            name: reader.string(TABLE_NAME_BYTES_MAX, "table name")?,
            split_hash: reader.u64()?,
        },
        Opcode::MigrateTablet => Request::MigrateTablet {
            name: reader.string(TABLE_NAME_BYTES_MAX, "table name")?,
            start_hash: reader.u64()?,
            target: reader.server_id()?,
        },
        Opcode::TransferTablet => Request::TransferTablet {
            master_id: reader.server_id()?,
            table_id: reader.table_id()?,
            range: reader.range()?,
            assignment_epoch: reader.u64()?,
            target: reader.server_id()?,
            target_address: reader.string(SERVER_ADDRESS_BYTES_MAX, "server address")?,
        },
        Opcode::ReceiveMigrationData => Request::ReceiveMigrationData {
            table_id: reader.table_id()?,
            range: reader.range()?,
            assignment_epoch: reader.u64()?,
            source: reader.server_id()?,
            transfer_id: reader.u64()?,
            safe_version: reader.version()?,
            first: match reader.u8()? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::InvalidField("first batch flag")),
            },
            tier: reader.tier()?,
            objects: reader.enumerated_objects()?,
            removed_keys: reader.list(REMOVED_KEYS_MAX, 2, |reader| reader.key())?,
            completions: reader.list(
                MIGRATION_COMPLETIONS_PER_BATCH_MAX,
                MIGRATED_COMPLETION_BYTES_MIN,
                |reader| reader.migrated_completion(),
            )?,
        },
        Opcode::Read => {
            let KeyItem { table_id, key, rules } = key_item(reader)?;
            Request::Read { table_id, key, rules }
        }
        Opcode::Write => Request::Write {
            table_id: reader.table_id()?,
            key: reader.key()?,
            value: reader.value()?,
            rules: reader.rules()?,
            expiry: reader.expiry()?,
            rpc: reader.rpc()?,
        },
        Opcode::SetExpiry => Request::SetExpiry {
            table_id: reader.table_id()?,
            key: reader.key()?,
            expiry: reader.expiry()?,
            rules: reader.rules()?,
            rpc: reader.rpc()?,
        },
        Opcode::Remove => {
            let RemoveItem { table_id, key, rules, rpc } = remove_item(reader)?;
            Request::Remove { table_id, key, rules, rpc }
        }
        Opcode::Increment => Request::Increment {
            table_id: reader.table_id()?,
            key: reader.key()?,
            delta: reader.i64()?,
            rules: reader.rules()?,
            rpc: reader.rpc()?,
        },
        Opcode::MultiRead => Request::MultiRead {
            items: reader.list(MULTI_OP_ITEMS_MAX, KEY_ITEM_BYTES_MIN, key_item)?,
        },
        Opcode::MultiWrite => Request::MultiWrite {
            items: reader.list(MULTI_OP_ITEMS_MAX, WRITE_ITEM_BYTES_MIN, |reader| {
                Ok(WriteItem {
                    table_id: reader.table_id()?,
                    key: reader.key()?,
                    value: reader.value()?,
                    rules: reader.rules()?,
                    expiry: reader.expiry()?,
                    rpc: reader.rpc()?,
                })
            })?,
        },
        Opcode::MultiRemove => Request::MultiRemove {
            items: reader.list(MULTI_OP_ITEMS_MAX, REMOVE_ITEM_BYTES_MIN, remove_item)?,
        },
        Opcode::MultiIncrement => Request::MultiIncrement {
            items: reader.list(MULTI_OP_ITEMS_MAX, INCREMENT_ITEM_BYTES_MIN, |reader| {
                Ok(IncrementItem {
                    table_id: reader.table_id()?,
                    key: reader.key()?,
                    delta: reader.i64()?,
                    rules: reader.rules()?,
                    rpc: reader.rpc()?,
                })
            })?,
        },
        Opcode::TxPrepare => {
            let (lease, acknowledged, transaction) = reader.transaction()?;
            let validate_only = match reader.u8()? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::InvalidField("validate-only flag")),
            };
            let ops = reader.list(MULTI_OP_ITEMS_MAX, TX_OP_BYTES_MIN, |reader| {
                reader.tx_op(acknowledged, validate_only)
            })?;
            let participants = reader.tx_decision_ops(TRANSACTION_OBJECTS_MAX, acknowledged)?;
            // A validation locks nothing, so nobody has anything to finish; a prepare locks,
            // and its participants must be able to finish it.
            if validate_only != participants.is_empty() {
                return Err(DecodeError::InvalidField("transaction participants"));
            }
            Request::TxPrepare {
                lease,
                acknowledged,
                transaction,
                validate_only,
                ops,
                participants,
            }
        }
        Opcode::TxDecision => {
            let (lease, acknowledged, transaction) = reader.transaction()?;
            let decision = TxDecision::from_code(reader.u8()?)
                .ok_or(DecodeError::InvalidField("transaction decision"))?;
            let ops = reader.tx_decision_ops(MULTI_OP_ITEMS_MAX, acknowledged)?;
            Request::TxDecision { lease, acknowledged, transaction, decision, ops }
        }
        Opcode::TxRequestAbort => {
            // As a transaction's identity with nothing acknowledged.
            let lease = LeaseId(reader.u64()?);
            let transaction = RpcId(reader.u64()?);
            if lease.0 == 0 {
                return Err(DecodeError::InvalidField("transaction lease"));
            }
            if transaction.0 == 0 {
                return Err(DecodeError::InvalidField("transaction id"));
            }
            let ops = reader.tx_decision_ops(MULTI_OP_ITEMS_MAX, RpcId(0))?;
            Request::TxRequestAbort { lease, transaction, ops }
        }
        Opcode::Enumerate => Request::Enumerate {
            table_id: reader.table_id()?,
            range: reader.range()?,
            cursor: reader.cursor()?,
            bytes_max: reader.u32()?,
        },
        Opcode::TakeTabletOwnership => Request::TakeTabletOwnership {
            master_id: reader.server_id()?,
            table_id: reader.table_id()?,
            range: reader.range()?,
            assignment_epoch: reader.u64()?,
            tier: reader.tier()?,
        },
        Opcode::DropTabletOwnership => Request::DropTabletOwnership {
            master_id: reader.server_id()?,
            table_id: reader.table_id()?,
            range: reader.range()?,
            assignment_epoch: reader.u64()?,
        },
        Opcode::AbandonMigration => Request::AbandonMigration {
            master_id: reader.server_id()?,
            table_id: reader.table_id()?,
            range: reader.range()?,
            assignment_epoch: reader.u64()?,
        },
        Opcode::GetServerStatistics => Request::GetServerStatistics,
        Opcode::BackupWrite => Request::BackupWrite {
            master_id: reader.server_id()?,
            segment_id: reader.segment_id()?,
            epoch: reader.u64()?,
            offset: reader.u32()?,
            flags: BackupWriteFlags::from_byte(reader.u8()?)
                .ok_or(DecodeError::InvalidField("backup write flags"))?,
            certificate: reader.certificate()?,
            data: reader.value()?,
        },
        Opcode::BackupFree => {
            Request::BackupFree { master_id: reader.server_id()?, segment_id: reader.segment_id()? }
        }
        Opcode::BackupListReplicas => {
            Request::BackupListReplicas { master_id: reader.server_id()? }
        }
        Opcode::BackupReadReplica => Request::BackupReadReplica {
            master_id: reader.server_id()?,
            segment_id: reader.segment_id()?,
        },
        Opcode::BackupGetStatistics => Request::BackupGetStatistics,
        Opcode::BackupFenceMaster => Request::BackupFenceMaster { master_id: reader.server_id()? },
        Opcode::RenewLease => Request::RenewLease { server_id: reader.server_id()? },
        Opcode::ClientLease => Request::ClientLease { lease: LeaseId(reader.u64()?) },
        Opcode::SetUser => Request::SetUser { user: reader.user_record()? },
        Opcode::DeleteUser => {
            Request::DeleteUser { name: reader.string(USER_NAME_BYTES_MAX, "user name")? }
        }
        Opcode::ListUsers => Request::ListUsers,
        Opcode::WhoAmI => Request::WhoAmI,
        Opcode::GetUserDirectory => Request::GetUserDirectory { known_version: reader.u64()? },
        Opcode::CheckClientLeases => Request::CheckClientLeases {
            leases: reader
                .list(CLIENT_LEASES_PER_CHECK_MAX, 8, |reader| reader.u64().map(LeaseId))?,
        },
        Opcode::HintServerCrashed => Request::HintServerCrashed { server_id: reader.server_id()? },
        Opcode::ServerStopping => Request::ServerStopping { server_id: reader.server_id()? },
        Opcode::RecoveryAcceptLoss => {
            Request::RecoveryAcceptLoss { server_id: reader.server_id()? }
        }
        Opcode::SetLogHead => Request::SetLogHead {
            server_id: reader.server_id()?,
            segment_id: reader.segment_id()?,
            epoch: reader.u64()?,
        },
        Opcode::BackupGetRecoveryData => Request::BackupGetRecoveryData {
            master_id: reader.server_id()?,
            segment_id: reader.segment_id()?,
            tablets: reader.list(RECOVERY_TABLETS_MAX, RECOVERY_TABLET_BYTES, recovery_tablet)?,
        },
        Opcode::BackupStartPartitioning => {
            let master_id = reader.server_id()?;
            let segments = reader.list(RECOVERY_SEGMENTS_MAX, 8, |reader| reader.segment_id())?;
            let partitions = reader.list(RECOVERY_PARTITIONS_MAX, 4, |reader| {
                reader.list(RECOVERY_TABLETS_MAX, RECOVERY_TABLET_BYTES, recovery_tablet)
            })?;
            let tablets: usize = partitions.iter().map(Vec::len).sum();
            if tablets > RECOVERY_TABLETS_MAX {
                return Err(DecodeError::TooManyItems {
                    count: tablets as u64,
                    max: RECOVERY_TABLETS_MAX as u64,
                });
            }
            Request::BackupStartPartitioning { master_id, segments, partitions }
        }
        Opcode::ReplicasNeeded => Request::ReplicasNeeded {
            master_id: reader.server_id()?,
            segment_ids: reader.list(BACKUP_REPLICAS_MAX, 8, |reader| reader.segment_id())?,
        },
        Opcode::RecoverTablets => {
            let master_id = reader.server_id()?;
            let crashed_master = reader.server_id()?;
            let tablets =
                reader.list(RECOVERY_TABLETS_MAX, RECOVERY_TABLET_BYTES, recovery_tablet)?;
            let backups = reader.list(SERVERS_MAX, 2, |reader| {
                reader.string(SERVER_ADDRESS_BYTES_MAX, "backup address")
            })?;
            let segments = recovery_segments(reader, backups.len())?;
            Request::RecoverTablets {
                master_id,
                crashed_master,
                tablets,
                backups,
                segments,
                assignment_epoch: reader.u64()?,
            }
        }
    })
}

/// A list of segment ids: count, then each id as a u64.
fn put_segment_ids(out: &mut BytesMut, segment_ids: &[SegmentId]) {
    put_count(out, segment_ids.len());
    for segment_id in segment_ids {
        put_u64(out, segment_id.0);
    }
}

fn decode_response_body(opcode: Opcode, reader: &mut Reader) -> Result<Response, DecodeError> {
    Ok(match opcode {
        Opcode::Ping => Response::Ping,
        Opcode::EnlistServer => Response::EnlistServer { server_id: reader.server_id()? },
        Opcode::GetServerList => Response::GetServerList {
            servers: reader.list(SERVERS_MAX, SERVER_ENTRY_BYTES_MIN, |reader| {
                Ok(ServerEntry {
                    server_id: reader.server_id()?,
                    address: reader.string(SERVER_ADDRESS_BYTES_MAX, "server address")?,
                    services: reader.services()?,
                    status: reader.server_status()?,
                    failure_domain: reader.string(FAILURE_DOMAIN_BYTES_MAX, "failure domain")?,
                })
            })?,
        },
        Opcode::CreateTable => Response::CreateTable { table_id: reader.table_id()? },
        Opcode::DropTable => Response::DropTable,
        Opcode::GetTableId => Response::GetTableId { table_id: reader.table_id()? },
        Opcode::ListTables => Response::ListTables {
            tables: reader.list(TABLES_MAX, TABLE_ENTRY_BYTES_MIN, |reader| {
                Ok(TableEntry {
                    name: reader.string(TABLE_NAME_BYTES_MAX, "table name")?,
                    table_id: reader.table_id()?,
                    tablet_count: reader.u32()?,
                    tier: reader.tier()?,
                })
            })?,
        },
        Opcode::GetTabletMap => Response::GetTabletMap { tablets: tablet_entries(reader)? },
        Opcode::AwaitTabletMap => Response::AwaitTabletMap { tablets: tablet_entries(reader)? },
        Opcode::Read => Response::Read {
            version: reader.version()?,
            value: reader.value()?,
            expires_in_millis: reader.u64()?,
        },
        Opcode::Write => Response::Write { version: reader.version()? },
        Opcode::SetExpiry => Response::SetExpiry { version: reader.version()? },
        Opcode::Remove => Response::Remove { version: reader.version()? },
        Opcode::Increment => {
            Response::Increment { version: reader.version()?, value: reader.i64()? }
        }
        Opcode::MultiRead => Response::MultiRead {
            results: reader.list(MULTI_OP_ITEMS_MAX, READ_RESULT_BYTES_MIN, |reader| {
                Ok(ReadItemResult {
                    status: reader.status()?,
                    version: reader.version()?,
                    value: reader.value()?,
                })
            })?,
        },
        Opcode::MultiWrite => Response::MultiWrite { results: version_results(reader)? },
        Opcode::MultiRemove => Response::MultiRemove { results: version_results(reader)? },
        Opcode::MultiIncrement => Response::MultiIncrement {
            results: reader.list(MULTI_OP_ITEMS_MAX, INCREMENT_RESULT_BYTES_MIN, |reader| {
                Ok(IncrementItemResult {
                    status: reader.status()?,
                    version: reader.version()?,
                    value: reader.i64()?,
                })
            })?,
        },
        Opcode::TxPrepare => Response::TxPrepare { votes: reader.tx_votes()? },
        Opcode::TxRequestAbort => Response::TxRequestAbort { votes: reader.tx_votes()? },
        Opcode::TxDecision => Response::TxDecision {
            results: reader.list(MULTI_OP_ITEMS_MAX, STATUS_BYTES, |reader| reader.status())?,
        },
        Opcode::Enumerate => Response::Enumerate {
            objects: reader.enumerated_objects()?,
            next: match reader.u8()? {
                0 => None,
                1 => Some(reader.cursor()?),
                _ => return Err(DecodeError::InvalidField("next cursor flag")),
            },
        },
        Opcode::TakeTabletOwnership => Response::TakeTabletOwnership,
        Opcode::DropTabletOwnership => Response::DropTabletOwnership,
        Opcode::GetServerStatistics => Response::GetServerStatistics {
            statistics: ServerStatistics {
                server_id: reader.server_id()?,
                log_bytes_total: reader.u64()?,
                log_bytes_live: reader.u64()?,
                log_bytes_allocated: reader.u64()?,
                seglets_total: reader.u64()?,
                seglets_free: reader.u64()?,
                segments_in_log: reader.u64()?,
                objects_live: reader.u64()?,
                tablets_owned: reader.u32()?,
                requests_served: reader.u64()?,
                replicas: reader.u32()?,
                log_bytes_live_objects: reader.u64()?,
                bytes_replicated: reader.u64()?,
                cleaner_bytes_replicated: reader.u64()?,
                segments_cleaned: reader.u64()?,
                cleaner_bytes_relocated: reader.u64()?,
                compactions: reader.u64()?,
                bytes_compacted: reader.u64()?,
                process_resident_bytes: reader.u64()?,
                log_bytes_resident: reader.u64()?,
                log_bytes_target: reader.u64()?,
                hash_table_bytes: reader.u64()?,
                auto_tables: reader.list(AUTO_TABLES_REPORTED_MAX, 9 * 8, |reader| {
                    Ok(AutoTableFigures {
                        table_id: reader.table_id()?,
                        dram_objects: reader.u64()?,
                        dram_bytes: reader.u64()?,
                        flash_objects: reader.u64()?,
                        flash_bytes: reader.u64()?,
                        reads_from_dram: reader.u64()?,
                        reads_from_flash: reader.u64()?,
                        promotions: reader.u64()?,
                        objects_demoted: reader.u64()?,
                    })
                })?,
            },
        },
        Opcode::RecoverTablets => Response::RecoverTablets {
            segments_replayed: reader.u64()?,
            replica_bytes_read: reader.u64()?,
            objects_replayed: reader.u64()?,
            creation_segment: reader.segment_id()?,
        },
        Opcode::BackupWrite => Response::BackupWrite,
        Opcode::BackupFree => Response::BackupFree,
        Opcode::BackupFenceMaster => Response::BackupFenceMaster,
        Opcode::RenewLease => Response::RenewLease { lease_ms: reader.u32()? },
        Opcode::ClientLease => {
            Response::ClientLease { lease: LeaseId(reader.u64()?), term_ms: reader.u32()? }
        }
        Opcode::SetUser => Response::SetUser { created: reader.bool("created")? },
        Opcode::DeleteUser => Response::DeleteUser { existed: reader.bool("existed")? },
        Opcode::ListUsers => Response::ListUsers {
            users: reader.list(USERS_MAX, USER_SUMMARY_BYTES_MIN, |reader| {
                let name = reader.string(USER_NAME_BYTES_MAX, "user name")?;
                let flags = reader.u8()?;
                if flags & !0b11 != 0 {
                    return Err(DecodeError::InvalidField("user flags"));
                }
                let grants = reader.grants()?;
                Ok(UserSummary {
                    name,
                    enabled: flags & 1 != 0,
                    has_password: flags & 2 != 0,
                    grants,
                })
            })?,
        },
        Opcode::WhoAmI => Response::WhoAmI { identity: reader.identity()? },
        Opcode::GetUserDirectory => Response::GetUserDirectory {
            directory: if reader.bool("directory changed")? {
                Some(reader.user_directory()?)
            } else {
                None
            },
        },
        Opcode::CheckClientLeases => Response::CheckClientLeases {
            remaining_ms: reader.list(CLIENT_LEASES_PER_CHECK_MAX, 4, |reader| reader.u32())?,
        },
        Opcode::SetLogHead => Response::SetLogHead,
        Opcode::HintServerCrashed => Response::HintServerCrashed,
        Opcode::ServerStopping => Response::ServerStopping,
        Opcode::RecoveryAcceptLoss => Response::RecoveryAcceptLoss,
        Opcode::SplitTablet => Response::SplitTablet,
        Opcode::MigrateTablet => Response::MigrateTablet,
        Opcode::TransferTablet => Response::TransferTablet {
            creation_segment: reader.segment_id()?,
            objects_sent: reader.u64()?,
        },
        Opcode::AbandonMigration => Response::AbandonMigration { objects_dropped: reader.u64()? },
        Opcode::ReplicasNeeded => Response::ReplicasNeeded {
            not_needed: reader.list(BACKUP_REPLICAS_MAX, 8, |reader| reader.segment_id())?,
        },
        Opcode::ReceiveMigrationData => {
            Response::ReceiveMigrationData { creation_segment: reader.segment_id()? }
        }
        Opcode::BackupStartPartitioning => {
            Response::BackupStartPartitioning { replicas_to_partition: reader.u32()? }
        }
        Opcode::BackupGetRecoveryData => {
            let certificate = reader.certificate()?;
            let data = reader.value()?;
            if data.len() != certificate.segment_length as usize {
                return Err(DecodeError::InvalidField("recovery data length"));
            }
            Response::BackupGetRecoveryData { certificate, data }
        }
        Opcode::BackupListReplicas => Response::BackupListReplicas {
            replicas: reader.list(BACKUP_REPLICAS_MAX, REPLICA_ENTRY_BYTES, |reader| {
                let master_id = reader.server_id()?;
                let segment_id = reader.segment_id()?;
                let epoch = reader.u64()?;
                let certificate = reader.certificate()?;
                let (closed, primary) = reader.replica_flags()?;
                Ok(ReplicaEntry { master_id, segment_id, epoch, certificate, closed, primary })
            })?,
        },
        Opcode::BackupReadReplica => {
            let epoch = reader.u64()?;
            let certificate = reader.certificate()?;
            let (closed, primary) = reader.replica_flags()?;
            let data = reader.value()?;
            if data.len() != certificate.segment_length as usize {
                return Err(DecodeError::InvalidField("replica data length"));
            }
            Response::BackupReadReplica { epoch, certificate, closed, primary, data }
        }
        Opcode::BackupGetStatistics => Response::BackupGetStatistics {
            statistics: BackupServiceStatistics {
                durability: match reader.u8()? {
                    0 => BackupDurability::Buffered,
                    1 => BackupDurability::Fsync,
                    _ => return Err(DecodeError::InvalidField("backup durability")),
                },
                replicas: reader.u32()?,
                replicas_open: reader.u32()?,
                buffers_in_use: reader.u32()?,
                buffer_count: reader.u32()?,
                frames_free: reader.u32()?,
                frame_count: reader.u32()?,
                disk_syncs: reader.u64()?,
                disk_write_jobs: reader.u64()?,
                disk_data_bytes_written: reader.u64()?,
                storage_failure: match reader.u8()? {
                    0 => None,
                    1 => Some(reader.string(ERROR_MESSAGE_BYTES_MAX, "storage failure")?),
                    _ => return Err(DecodeError::InvalidField("storage failure flag")),
                },
            },
        },
    })
}

fn version_results(reader: &mut Reader) -> Result<Vec<VersionItemResult>, DecodeError> {
    reader.list(MULTI_OP_ITEMS_MAX, VERSION_RESULT_BYTES_MIN, |reader| {
        Ok(VersionItemResult { status: reader.status()?, version: reader.version()? })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_messages_at_char_boundaries() {
        assert_eq!(truncate_at_char_boundary("héllo", 2), "h");
        assert_eq!(truncate_at_char_boundary("héllo", 3), "hé");
        assert_eq!(truncate_at_char_boundary("abc", 10), "abc");
        let long = "é".repeat(1000);
        let mut out = BytesMut::new();
        encode_error_response(&mut out, 1, 30, Status::InternalError, &long);
        let body = Bytes::copy_from_slice(&out[crate::RESPONSE_HEADER_BYTES..]);
        match decode_response(Opcode::Read, Status::InternalError, body).unwrap() {
            ResponseBody::Error { message } => assert_eq!(message, "é".repeat(512)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn lying_counts_do_not_allocate() {
        // 4 billion items announced, none present: refused for the limit or for truncation,
        // without reserving memory for the claim.
        let body = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff]);
        assert_eq!(
            decode_request(Opcode::MultiRead.code(), body.clone()),
            Err(DecodeError::TooManyItems { count: u64::from(u32::MAX), max: 4096 })
        );
        let body = Bytes::from_static(&[0x00, 0x10, 0x00, 0x00]);
        assert_eq!(decode_request(Opcode::MultiRead.code(), body), Err(DecodeError::Truncated));
        let body = Bytes::from_static(&[0x00, 0x00, 0x10, 0x00, 0]);
        assert_eq!(
            decode_response(Opcode::Enumerate, Status::Ok, body),
            Err(DecodeError::Truncated)
        );
    }

    #[test]
    fn over_long_key_is_sent_empty() {
        let key = Bytes::from(vec![b'k'; 65_536]);
        let request = Request::Read { table_id: TableId(1), key, rules: RejectRules::NONE };
        let mut out = BytesMut::new();
        encode_request(&mut out, 1, &request);
        let body = Bytes::copy_from_slice(&out[crate::REQUEST_HEADER_BYTES..]);
        match decode_request(Opcode::Read.code(), body).unwrap() {
            Request::Read { key, .. } => assert!(key.is_empty()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn oversized_response_becomes_internal_error() {
        let value = Bytes::from(vec![0u8; FRAME_BYTES_MAX]);
        let mut out = BytesMut::new();
        encode_response(
            &mut out,
            5,
            Status::Ok,
            &Response::Read { version: Version(1), value, expires_in_millis: 0 },
        );
        let header = crate::decode_frame_header(&out).unwrap();
        assert_eq!(header.status, Status::InternalError);
        assert_eq!(header.request_id, 5);
        assert_eq!(crate::frame_length(&out).unwrap(), Some(out.len()));
    }
}
