//! Every limit of the system, in one place, each with its reason. Related limits are tied
//! together by compile-time assertions so a change to one cannot silently break another.

/// Largest key, in bytes. Keys carry a 16-bit length on the wire and in the log.
pub const KEY_BYTES_MAX: usize = 65_535;

/// Default largest value, in bytes (1 MiB). RAMCloud's rule: at most a segment / 8, so that the
/// cleaner can always pack survivors into segments with bounded tail waste.
pub const VALUE_BYTES_MAX_DEFAULT: usize = 1 << 20;

/// Default log segment size (8 MiB): large enough that a backup writes a whole segment in one
/// sequential I/O, small enough that a digest of all segments stays small.
pub const SEGMENT_BYTES_DEFAULT: usize = 8 << 20;

/// Largest segment a replicated master may use (8 MiB, RAMCloud's size): a segment travels to a
/// backup in one BACKUP_WRITE, because a certificate only commits a prefix that ends on an entry
/// boundary, so a segment must fit in one frame.
pub const SEGMENT_BYTES_MAX: usize = 8 << 20;

/// Default seglet size (64 KiB): the unit of memory allocation inside segments; compaction frees
/// memory in seglets.
pub const SEGLET_BYTES_DEFAULT: usize = 64 << 10;

/// Largest frame on the wire (header + body), in bytes. Must hold one maximum-size write
/// (key + value + headers) with room to spare; a peer that announces a longer frame is cut off.
pub const FRAME_BYTES_MAX: usize = 16 << 20;

/// Largest table name, in bytes (UTF-8).
pub const TABLE_NAME_BYTES_MAX: usize = 256;

/// Largest server address string ("host:port"), in bytes.
pub const SERVER_ADDRESS_BYTES_MAX: usize = 256;

/// Largest failure domain name (`stratus server --failure-domain`, e.g. a rack), in bytes of
/// printable ASCII (0x21..=0x7E; empty: no domain). A domain is only compared for equality by
/// replica placement and shown to operators: a short label is all it needs, and the bound keeps
/// every server list entry (sent to every master, stored in every server record) small.
pub const FAILURE_DOMAIN_BYTES_MAX: usize = 64;

/// Why `name` is not a valid failure domain (`None`: it is; the empty name means "no domain").
pub fn failure_domain_problem(name: &str) -> Option<String> {
    if name.len() > FAILURE_DOMAIN_BYTES_MAX {
        return Some(format!(
            "a failure domain has at most {FAILURE_DOMAIN_BYTES_MAX} bytes ({} given)",
            name.len()
        ));
    }
    if let Some(byte) = name.bytes().find(|byte| !(0x21..=0x7E).contains(byte)) {
        return Some(format!(
            "a failure domain is printable ASCII without spaces (byte 0x{byte:02x} is not)"
        ));
    }
    None
}

/// Largest number of items in one multi-operation request. Bounds the work one request can ask
/// of a master; the client splits larger batches.
pub const MULTI_OP_ITEMS_MAX: usize = 4_096;

/// Largest number of masters a table can be spread over at creation.
pub const SERVER_SPAN_MAX: u32 = 1_024;

/// Largest number of tablets one table may be cut into (by creation and SPLIT_TABLET). Bounds
/// the coordinator's table record and makes a table's whole tablet map fit one GET_TABLET_MAP
/// response even with the longest server addresses (asserted below).
pub const TABLETS_PER_TABLE_MAX: usize = 16_384;

/// Keys a transfer remembers as changed while it copies a tablet that still takes writes, and
/// their bytes: at the end, with writes held, only those keys are sent again. Past either
/// bound the transfer stops remembering and copies the whole tablet again with writes held
/// (which is what every transfer did before), so the memory a busy tablet can take here
/// stays bounded: about 16 MiB.
pub const MIGRATION_CHANGED_KEYS_MAX: usize = 65_536;
/// See [`MIGRATION_CHANGED_KEYS_MAX`].
pub const MIGRATION_CHANGED_KEY_BYTES_MAX: usize = 8 << 20;

/// Key and value bytes one RECEIVE_MIGRATION_DATA batch carries at most (it carries at least
/// one object when one remains): large enough that a transfer is a few round trips per
/// segment, small enough that the target's answer (which waits for its backups) comes quickly
/// and a batch never comes near a frame's size.
pub const MIGRATION_BATCH_BYTES_MAX: usize = 1 << 20;

/// Assignment epochs a master remembers (one per range it was told about; past this the
/// oldest is forgotten): enough to recognise a stale TAKE, DROP or transfer of any range it
/// has been assigned. Four times the tablets of one table, 40 bytes each (2.6 MB at most), and
/// scanned once per assignment, which is rare.
pub const ASSIGNMENTS_REMEMBERED_MAX: usize = 4 * TABLETS_PER_TABLE_MAX;

/// Most requests a client keeps outstanding on one connection (pipelining window).
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX: usize = 1_024;

/// Connections one RPC server (a storage server's port, a coordinator's) keeps open at once.
/// Its peers are the other servers (replication, pings, migrations, and a recovery's reads,
/// which may come from every master at once: up to [`SERVERS_MAX`]) and the client processes
/// (one connection each by default); twice the largest cluster leaves as many for clients.
/// Past it a new connection is closed at once and counted, so sockets that clients open and
/// abandon cannot pile up without bound (each holds buffers and a task).
pub const RPC_CONNECTIONS_PER_SERVER_MAX: usize = 2 * SERVERS_MAX;

/// Bytes of responses one connection of an RPC server may have unwritten (its peer reads
/// slowly or not at all) before the server reads no more of its requests: backpressure
/// instead of unbounded memory, large enough that a fast peer never waits on it (it is over
/// a hundred 64 KiB writes).
pub const RPC_OUTPUT_BYTES_PER_CONNECTION_MAX: usize = 8 << 20;

/// Bytes of responses all the connections of one RPC server together may have unwritten
/// before a connection that has any of its own unwritten reads no more requests. Without it
/// [`RPC_CONNECTIONS_PER_SERVER_MAX`] peers that send requests and never read the answers would
/// hold 256 GiB; with it, one response per connection more at most (a connection with nothing
/// unwritten still gets its next request answered, so peers that read are never shut out by
/// peers that do not), besides the answers of requests whose handlers wait (for replication:
/// counted when they arrive, not held back; at most 1 024 such requests per connection). As
/// much as a storage server's default log (`--log-mib 256`): unwritten
/// answers never take more memory than the data they come from, and 32 slow peers' worth of
/// the per-connection bound fit before it matters.
pub const RPC_OUTPUT_BYTES_PER_SERVER_MAX: usize = 256 << 20;

/// Bytes of objects one enumeration response may carry; it always carries at least one object
/// when one remains, so this must exceed the largest object.
pub const ENUMERATE_RESPONSE_BYTES_MAX: usize = 4 << 20;

/// Replica buffers a backup keeps allocated while no replica uses them, for the next replicas
/// it opens. A fresh buffer costs a page fault per 4 KiB of the segment (the kernel zeroes
/// each page: about a fifth of a recovery's CPU before the pool existed); a kept one is
/// already mapped. Eight segments (64 MiB at the default size) cover the replicas a busy
/// backup opens in a burst, such as a recovery's side segments, without holding on to all of
/// its buffers after the burst.
pub const BACKUP_BUFFERS_KEPT_FREE_MAX: usize = 8;

/// Largest number of tables in a cluster (bounds the coordinator's state and LIST_TABLES).
pub const TABLES_MAX: usize = 65_536;

/// Largest number of servers in a cluster (bounds the server list and its RPC).
pub const SERVERS_MAX: usize = 16_384;

/// Longest user name, in bytes (ASCII letters, digits and `_ . @ -`): a login, not a document;
/// it travels in every user's membership preamble.
pub const USER_NAME_BYTES_MAX: usize = 64;

/// Most named users in a cluster. Every server holds the whole user directory (a few hundred
/// bytes a user), so it is bounded like the server list.
pub const USERS_MAX: usize = 1_024;

/// Most grants (table pattern and access) of one user: each request checks a user's grants in
/// turn, so the list stays short; a pattern covers any number of tables.
pub const GRANTS_PER_USER_MAX: usize = 32;

/// Longest table pattern of a grant: a table name with wildcards.
pub const TABLE_PATTERN_BYTES_MAX: usize = TABLE_NAME_BYTES_MAX;

/// Shortest password a named user may have, in bytes. Each guess costs an Argon2id (19 MiB),
/// online or offline, so eight characters are a floor, not a recommendation.
pub const USER_PASSWORD_BYTES_MIN: usize = 8;

/// Longest password a named user may have, in bytes (Redis's clients send any length; a
/// password is a line, not a document).
pub const USER_PASSWORD_BYTES_MAX: usize = 4_096;

/// Largest encoded user directory (bytes) the coordinator hands its servers: at every maximum
/// above the users alone take about 9 MiB; past this a change that would grow it is refused,
/// so the directory always fits one frame.
pub const USER_DIRECTORY_BYTES_MAX: usize = 12 << 20;

/// Failed user authentications a process accepts per user name and second on the native
/// protocol before it refuses that name's preambles unchecked for the rest of the second (the
/// RESP front end has its own bound on AUTH).
pub const USER_AUTHENTICATION_FAILURES_PER_SECOND_MAX: u32 = 20;

const _: () = assert!(USER_DIRECTORY_BYTES_MAX + (1 << 20) < FRAME_BYTES_MAX);
const _: () = assert!(VALUE_BYTES_MAX_DEFAULT <= SEGMENT_BYTES_DEFAULT / 8);
const _: () = assert!(SEGMENT_BYTES_DEFAULT.is_multiple_of(SEGLET_BYTES_DEFAULT));
const _: () = assert!(FRAME_BYTES_MAX > VALUE_BYTES_MAX_DEFAULT + KEY_BYTES_MAX + 4_096);
const _: () = assert!(ENUMERATE_RESPONSE_BYTES_MAX > VALUE_BYTES_MAX_DEFAULT + KEY_BYTES_MAX);
const _: () = assert!(ENUMERATE_RESPONSE_BYTES_MAX < FRAME_BYTES_MAX);
const _: () = assert!(SEGMENT_BYTES_MAX + 4_096 < FRAME_BYTES_MAX);
const _: () = assert!(SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
const _: () = assert!(TABLETS_PER_TABLE_MAX >= SERVER_SPAN_MAX as usize);
const _: () = assert!(RPC_CONNECTIONS_PER_SERVER_MAX >= SERVERS_MAX);
const _: () = assert!(RPC_OUTPUT_BYTES_PER_CONNECTION_MAX <= RPC_OUTPUT_BYTES_PER_SERVER_MAX);
// A batch over the limit by its last object (the largest value a segment admits).
const _: () = assert!(
    MIGRATION_BATCH_BYTES_MAX + SEGMENT_BYTES_MAX / 8 + KEY_BYTES_MAX + 4_096 < FRAME_BYTES_MAX
);
// A server list entry (id, address, services, status, failure domain) fits many times in a frame.
const _: () = assert!(
    SERVERS_MAX * (8 + 2 + SERVER_ADDRESS_BYTES_MAX + 4 + 1 + 2 + FAILURE_DOMAIN_BYTES_MAX)
        < FRAME_BYTES_MAX
);
// A tablet map entry: table id, range, owner id, address string, state.
const _: () = assert!(
    TABLETS_PER_TABLE_MAX * (8 + 16 + 8 + 2 + SERVER_ADDRESS_BYTES_MAX + 1) + 4_096
        < FRAME_BYTES_MAX
);

/// The longest a coordinator holds an AWAIT_TABLET_MAP while a tablet in the map recovers: a
/// recovery takes about a second or two, and a client whose operation has longer left asks
/// again. Bounded so that a request in flight is not mistaken for a lost one by the RPC
/// layer's timeouts, and waiting requests do not pile up.
pub const TABLET_MAP_AWAIT_MILLIS_MAX: u32 = 2_000;

/// How long a client lease lasts after its last renewal (RIFL, docs/design/exactly-once.md):
/// a client's unacknowledged results are kept at least this long after it was last heard of.
/// Long enough that a client paused by a garbage collector or a busy machine keeps its lease,
/// short enough that a dead client's results are not kept for long.
pub const CLIENT_LEASE_TERM_MILLIS: u64 = 30_000;

/// How often a client renews its lease: three tries per term, so two lost renewals in a row
/// still leave it valid.
pub const CLIENT_LEASE_RENEW_INTERVAL_MILLIS: u64 = CLIENT_LEASE_TERM_MILLIS / 3;

/// TLS handshakes a listener runs at once. Each holds a connection, a task and rustls's
/// buffers (tens of KiB: 1 024 of them, a few tens of MiB); past this the listener stops
/// accepting until one finishes, so a flood of connections that never finish their handshake
/// cannot grow memory without bound. With [`TLS_HANDSHAKE_TIMEOUT_MILLIS`], a peer must open
/// over 300 silent connections a second to keep a listener from accepting (and is then one
/// source among few, for a firewall to see).
pub const TLS_HANDSHAKES_IN_FLIGHT_MAX: usize = 1_024;

/// How long a TLS handshake may take before its connection is closed (milliseconds): a
/// handshake is two round trips and a few signatures, so this is generous even on a loaded
/// network, and short enough that a peer that opens a connection and says nothing holds one
/// of [`TLS_HANDSHAKES_IN_FLIGHT_MAX`] only briefly.
pub const TLS_HANDSHAKE_TIMEOUT_MILLIS: u64 = 3_000;

/// Largest certificate, key or CA file read (bytes): a chain of a few certificates is a few
/// KiB; a path pointing at something else by mistake is refused rather than read whole.
pub const TLS_PEM_FILE_BYTES_MAX: u64 = 1 << 20;

/// Unacknowledged results a master keeps per client lease. A client acknowledges every result
/// it has up to its oldest outstanding mutation, so it holds about as many as it has
/// mutations in flight: this bounds a client whose oldest mutation is stuck while the others
/// go on (past it, its new mutations get RETRY until it acknowledges). About 100 bytes each
/// (28 in the log, the rest in the table): under 1 MiB per client.
pub const COMPLETIONS_PER_LEASE_MAX: usize = 8_192;

/// Leases one CHECK_CLIENT_LEASES request asks about (a master checks the leases it holds
/// results of in batches of this size).
pub const CLIENT_LEASES_PER_CHECK_MAX: usize = 1_024;

/// Client leases a coordinator keeps at once: bounds its memory (about 48 bytes each). Past
/// it, new leases are refused with RETRY until old ones expire.
pub const CLIENT_LEASES_MAX: usize = 1 << 20;

/// Lease ids a coordinator reserves with one metadata write: ids are unique across coordinator
/// restarts and failovers because the next free id is persisted before any id below it is
/// granted, and reserving in blocks keeps that to one write per this many leases.
pub const CLIENT_LEASE_IDS_PER_RESERVATION: u64 = 1_024;

/// Objects one multi-object transaction reads or writes, at most
/// (docs/design/transactions.md). Each takes one of its client lease's unacknowledged results
/// ([`COMPLETIONS_PER_LEASE_MAX`]) from its PREPARE until the transaction is decided, so a
/// transaction must leave room for its client's other mutations (half of them, here); and at
/// most [`MULTI_OP_ITEMS_MAX`], all of a transaction's ops on one master fit one TX_PREPARE by
/// count. RAMCloud's transactions are meant for a handful of objects; this bounds the odd
/// large one.
pub const TRANSACTION_OBJECTS_MAX: usize = 4_096;

/// Bytes of keys (of every object) and buffered values (of its writes) one transaction holds,
/// at most (64 MiB): bounds what a client keeps in memory for an uncommitted transaction and
/// what its commit sends, and leaves room for four transactions of that size in a client's
/// memory before it is a concern. More is refused before anything is sent.
pub const TRANSACTION_BYTES_MAX: usize = 64 << 20;

/// Bytes of ops one TX_PREPARE or TX_DECISION carries at most (8 MiB): the client splits a
/// master's ops into several requests past it (a request always carries at least one op), so
/// a transaction of [`TRANSACTION_BYTES_MAX`] never makes a frame too large.
pub const TRANSACTION_REQUEST_BYTES_MAX: usize = 8 << 20;

const _: () = assert!(TRANSACTION_OBJECTS_MAX <= MULTI_OP_ITEMS_MAX);
const _: () = assert!(2 * TRANSACTION_OBJECTS_MAX <= COMPLETIONS_PER_LEASE_MAX);
// A request at the limit by its last op (the largest key and value), with every op's fixed
// fields (31 bytes of TX_PREPARE), the transaction's participants (24 bytes each) and the
// request's own.
const _: () = assert!(
    TRANSACTION_REQUEST_BYTES_MAX
        + VALUE_BYTES_MAX_DEFAULT
        + KEY_BYTES_MAX
        + MULTI_OP_ITEMS_MAX * 31
        + TRANSACTION_OBJECTS_MAX * 24
        + 4_096
        < FRAME_BYTES_MAX
);

/// Completion records one RECEIVE_MIGRATION_DATA batch carries at most (about 50 bytes each on
/// the wire).
pub const MIGRATION_COMPLETIONS_PER_BATCH_MAX: usize = 16_384;

const _: () = assert!(MIGRATION_COMPLETIONS_PER_BATCH_MAX * 64 + 4_096 < FRAME_BYTES_MAX);
const _: () = assert!(CLIENT_LEASES_PER_CHECK_MAX * 16 + 4_096 < FRAME_BYTES_MAX);

/// How long a participant waits, after preparing an operation of a transaction, before it
/// finishes the transaction itself (asks every operation for its vote, decides, delivers the
/// decision): the client normally decides within a few round trips, so 250 ms means its client
/// died or lost touch. RAMCloud starts at 50 µs-scale RPCs with 50 ms; our round trips on
/// loopback and shared cores are 10–100× slower, and a recovery that starts early is harmless
/// (it decides what the client decides) but costs requests.
pub const TX_RECOVERY_DELAY_MILLIS: u64 = 250;

/// The delay doubles after each recovery attempt that could not finish (a participant down,
/// the coordinator unreachable), up to this.
pub const TX_RECOVERY_DELAY_MAX_MILLIS: u64 = 4_000;

/// Committed transactions one client delivers decisions for in the background at once, at
/// most (its commits return once every vote is PREPARED): a commit past it delivers its own
/// decision before returning, so masters that stopped answering slow that client's commits
/// down instead of piling up its background work. Each costs one small task while its
/// decision is on its way (normally one round trip).
pub const TX_BACKGROUND_DECISIONS_MAX: usize = 1_024;

/// Transactions one master finishes at once, at most: bounds the requests a master sends for
/// recoveries when many clients died together.
pub const TX_RECOVERIES_IN_FLIGHT_MAX: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_domains_are_short_printable_ascii() {
        assert_eq!(failure_domain_problem(""), None);
        assert_eq!(failure_domain_problem("rack-12/row_b"), None);
        assert_eq!(failure_domain_problem(&"r".repeat(FAILURE_DOMAIN_BYTES_MAX)), None);
        assert!(failure_domain_problem(&"r".repeat(FAILURE_DOMAIN_BYTES_MAX + 1)).is_some());
        assert!(failure_domain_problem("rack 1").is_some());
        assert!(failure_domain_problem("rack\n").is_some());
        assert!(failure_domain_problem("räck").is_some());
    }
}
