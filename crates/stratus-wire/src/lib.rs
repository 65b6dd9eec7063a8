//! The Stratus wire protocol: the only crate that defines bytes on the network.
//!
//! A connection opens with an 8-byte [`Hello`] in each direction, then carries length-prefixed
//! frames: requests from the client, responses from the server, matched by request id (a client
//! keeps many requests outstanding and responses may arrive out of order). The byte-by-byte
//! specification, with test vectors, is docs/design/wire-protocol.md; `tests/vectors.rs` checks
//! this crate against it.
//!
//! - [`frame`]: the handshake and the frame envelope ([`frame_length`], [`decode_frame_header`]),
//!   and in-place frame building ([`begin_response`], [`finish_frame`]).
//! - [`codec`]: request and response bodies ([`encode_request`], [`decode_request`],
//!   [`encode_response`], [`decode_response`], [`encode_error_response`]).
//! - [`membership`]: the preamble in which cluster members prove the cluster secret to each
//!   other before the hello.
//! - [`put`]: appenders for building a body in place (the master's zero-copy read path).
//! - [`users`]: named users, their grants, and what every request needs of its sender.
//! - [`message`] and [`status`]: the Rust types of every body and the closed set of statuses.
//!
//! Decoders never panic and never trust a length or count from the network; every malformed
//! input is an error value.

pub mod codec;
pub mod frame;
pub mod membership;
pub mod message;
pub mod put;
pub mod status;
pub mod users;

pub use codec::{
    decode_request, decode_response, decode_user_record, encode_error_response, encode_request,
    encode_response, encode_user_record, DecodeError, ResponseBody, BACKUP_REPLICAS_MAX,
    ERROR_MESSAGE_BYTES_MAX, RECOVERY_PARTITIONS_MAX, RECOVERY_SEGMENTS_MAX, RECOVERY_TABLETS_MAX,
    REPLICA_BYTES_MAX,
};
pub use frame::{
    begin_request, begin_response, body_offset, decode_frame_header, finish_frame, frame_length,
    peek_request_identity, FrameError, FrameHeader, FrameKind, FrameStart, Hello, HELLO_BYTES,
    LENGTH_FIELD_BYTES, MAGIC, PROTOCOL_VERSION, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
pub use message::{
    Access, AutoTableFigures, BackupDurability, BackupServiceStatistics, BackupWriteFlags,
    EnumeratedObject, EnumerationCursor, IncrementItem, IncrementItemResult, KeyItem,
    MigratedCompletion, Opcode, ReadItemResult, RecoveryReplica, RecoverySegment, RecoveryTablet,
    RemoveItem, ReplicaCertificate, ReplicaEntry, Request, Response, ServerEntry, ServerStatistics,
    ServerStatus, ServiceMask, TableEntry, TabletEntry, TxDecisionOp, TxOp, TxVoteItem,
    VersionItemResult, WriteItem, AUTO_TABLES_REPORTED_MAX,
};
pub use status::Status;
pub use users::{
    AccessNeeded, Identity, TableAccess, TableGrant, TableNeed, UserCredentials,
    UserDirectorySnapshot, UserRecord, UserSummary,
};
