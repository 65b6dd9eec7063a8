//! The closed set of statuses every response carries. The numbering is part of the protocol:
//! never renumber, only append (and bump the protocol version when a client could see a new one).

use std::fmt;

/// Outcome of a request. On the wire: a little-endian u16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// The request succeeded.
    Ok = 0,
    /// The server does not own the tablet holding this key (stale client map). Retryable after
    /// refreshing the tablet map.
    UnknownTablet = 1,
    /// No table with that name or id exists.
    TableDoesntExist = 2,
    /// The object does not exist (read of a missing key, or the `doesnt_exist` reject rule).
    ObjectDoesntExist = 3,
    /// The object exists and the `exists` reject rule refused the operation.
    ObjectExists = 4,
    /// A version reject rule refused the operation; the body carries the current version.
    WrongVersion = 5,
    /// No master has room for a table's data: the coordinator has no master to place a tablet
    /// on, or the master chosen (a migration's target, a recovery master) has no room in its
    /// log for it.
    NoTableSpace = 6,
    /// The request body is malformed (truncated, trailing bytes, bad field value).
    RequestFormatError = 7,
    /// The opcode is unknown to this server or not served by this server's role.
    UnimplementedRequest = 8,
    /// The server is temporarily unable to serve (for example its log is full until the cleaner
    /// frees space); retry after a short delay.
    Retry = 9,
    /// The request did not complete in time (reported by the client library, never sent).
    Timeout = 10,
    /// An unexpected server-side failure; the message says what.
    InternalError = 11,
    /// The request reached a server that is not the one it was meant for.
    WrongServer = 12,
    /// The frame is longer than the protocol's maximum frame size.
    RequestTooLarge = 13,
    /// The key is empty or longer than 65 535 bytes.
    InvalidKey = 14,
    /// The value is longer than the server's configured maximum.
    ValueTooLarge = 15,
    /// The peer speaks a protocol version this server does not.
    ProtocolVersionMismatch = 16,
    /// The client could not connect to the server (reported by the client library, never sent).
    CouldntConnect = 17,
    /// The service asked for is not running on this server (yet).
    ServiceNotAvailable = 18,
    /// The object is not an 8-byte integer, so it cannot be incremented.
    InvalidObject = 19,
    /// A request parameter is out of range (for example a server span of 0 or an empty name).
    InvalidParameter = 20,
    /// A backup cannot open a new replica: it is out of RAM buffers or storage frames. The
    /// master opens the replica on another backup.
    BackupOpenRejected = 21,
    /// The backup holds no replica of that segment (never opened, freed, or lost in a restart).
    BackupBadSegmentId = 22,
    /// The write would end past the replica's capacity.
    BackupSegmentOverflow = 23,
    /// The write's offset is not the end of the bytes the backup holds (and it is not an
    /// identical re-send of bytes it holds); the message says how many bytes it holds.
    BackupOffsetMismatch = 24,
    /// The replica is closed and accepts no new bytes.
    BackupReplicaClosed = 25,
    /// The backup's storage failed (for example an fsync error); it refuses every write until
    /// it is restarted, rather than acknowledge data it may not hold.
    BackupStorageFailed = 26,
    /// The coordinator declared the calling server crashed: the coordinator refuses its lease
    /// and backups refuse its writes. A master that receives it must stop serving and exit.
    ServerCrashed = 27,
    /// What the request asked for was started by an earlier identical request and is still
    /// running: ask again later for its outcome (TRANSFER_TABLET repeated by the coordinator).
    InProgress = 28,
    /// The client acknowledged this RPC already (it said it had the result), so the request
    /// is an old duplicate: nothing was applied. A correct client never sees it.
    StaleRpc = 29,
    /// The client's lease expired (or was never granted): nothing was applied. The client
    /// takes a new lease.
    ExpiredLease = 30,
    /// The peer's credentials were refused (in the membership preamble: the acceptor has no
    /// cluster secret, or the connector's proof is wrong).
    AuthenticationFailed = 31,
    /// The connection is not allowed this operation: a server-to-server opcode on a connection
    /// that did not authenticate as a cluster member. Nothing was done.
    PermissionDenied = 32,
}

impl Status {
    /// Every status, in wire order.
    pub const ALL: [Status; 33] = [
        Status::Ok,
        Status::UnknownTablet,
        Status::TableDoesntExist,
        Status::ObjectDoesntExist,
        Status::ObjectExists,
        Status::WrongVersion,
        Status::NoTableSpace,
        Status::RequestFormatError,
        Status::UnimplementedRequest,
        Status::Retry,
        Status::Timeout,
        Status::InternalError,
        Status::WrongServer,
        Status::RequestTooLarge,
        Status::InvalidKey,
        Status::ValueTooLarge,
        Status::ProtocolVersionMismatch,
        Status::CouldntConnect,
        Status::ServiceNotAvailable,
        Status::InvalidObject,
        Status::InvalidParameter,
        Status::BackupOpenRejected,
        Status::BackupBadSegmentId,
        Status::BackupSegmentOverflow,
        Status::BackupOffsetMismatch,
        Status::BackupReplicaClosed,
        Status::BackupStorageFailed,
        Status::ServerCrashed,
        Status::InProgress,
        Status::StaleRpc,
        Status::ExpiredLease,
        Status::AuthenticationFailed,
        Status::PermissionDenied,
    ];

    /// The wire code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The status for a wire code, if it is one.
    pub fn from_code(code: u16) -> Option<Status> {
        Status::ALL.get(usize::from(code)).copied()
    }

    /// True when the response carries the operation's own body (success, or an object outcome
    /// that reports the current version); otherwise it carries an error message.
    pub fn carries_operation_body(self) -> bool {
        matches!(
            self,
            Status::Ok | Status::ObjectDoesntExist | Status::ObjectExists | Status::WrongVersion
        )
    }

    /// A short human-readable description (used by the CLI: `object doesn't exist`).
    pub fn description(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UnknownTablet => "unknown tablet",
            Status::TableDoesntExist => "table doesn't exist",
            Status::ObjectDoesntExist => "object doesn't exist",
            Status::ObjectExists => "object exists",
            Status::WrongVersion => "wrong version",
            Status::NoTableSpace => "no master has room for the table",
            Status::RequestFormatError => "malformed request",
            Status::UnimplementedRequest => "unimplemented request",
            Status::Retry => "retry later",
            Status::Timeout => "timed out",
            Status::InternalError => "internal error",
            Status::WrongServer => "wrong server",
            Status::RequestTooLarge => "request too large",
            Status::InvalidKey => "invalid key",
            Status::ValueTooLarge => "value too large",
            Status::ProtocolVersionMismatch => "protocol version mismatch",
            Status::CouldntConnect => "couldn't connect",
            Status::ServiceNotAvailable => "service not available",
            Status::InvalidObject => "object is not an 8-byte integer",
            Status::InvalidParameter => "invalid parameter",
            Status::BackupOpenRejected => "backup cannot open another replica",
            Status::BackupBadSegmentId => "backup holds no replica of that segment",
            Status::BackupSegmentOverflow => "write past the replica's capacity",
            Status::BackupOffsetMismatch => "write offset does not match the replica's length",
            Status::BackupReplicaClosed => "replica is closed",
            Status::BackupStorageFailed => "backup storage failed",
            Status::ServerCrashed => "server declared crashed",
            Status::InProgress => "still in progress",
            Status::StaleRpc => "stale rpc: its result was acknowledged already",
            Status::ExpiredLease => "client lease expired",
            Status::AuthenticationFailed => "authentication failed",
            Status::PermissionDenied => "permission denied",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_dense() {
        for (index, status) in Status::ALL.iter().enumerate() {
            assert_eq!(usize::from(status.code()), index);
            assert_eq!(Status::from_code(status.code()), Some(*status));
        }
        assert_eq!(Status::from_code(Status::ALL.len() as u16), None);
        assert_eq!(Status::from_code(u16::MAX), None);
    }
}
