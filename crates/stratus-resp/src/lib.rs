//! The Redis-protocol front end of a Stratus cluster.
//!
//! It speaks RESP2 and RESP3 to Redis clients (redis-cli, redis-benchmark, redis-py, ...) and
//! Stratus's native protocol to the cluster through [`stratus_client::Client`]. It runs in two
//! places:
//!
//! - inside every storage server started with `--resp-listen`: its client reaches that
//!   server's own master in process (`Client::with_in_process_server`), so keys the server
//!   owns cost no extra hop, and forwards other keys to their masters;
//! - as a separate gateway process, `stratus resp --listen 127.0.0.1:6380`, which forwards
//!   every key (one extra hop) and scales separately from the masters.
//!
//! # Why forward, not redirect
//!
//! The client library already maps every key to its master through the cached tablet map and
//! refreshes and retries when tablets move, so any key a Redis client names reaches the right
//! master with no redirection that Redis clients would have to understand. Redis Cluster's
//! `MOVED` redirection names one of 16 384 CRC16 slots, which Stratus's key-hash tablets are
//! not, so a cluster-aware Redis client could not follow Stratus's map anyway.
//!
//! # Data model mapping
//!
//! - Database `n` (SELECT n, 0 ≤ n < `databases`, default 16) is the Stratus table named
//!   `<table-prefix><n>`, `redis-db-<n>` by default, created with `--table-span` masters
//!   (default 1) the first time a command uses it.
//! - A Redis string is one Stratus object: key and value are the same bytes (binary-safe).
//!   Stratus refuses empty keys and keys over 65 535 bytes; the gateway answers those with an
//!   error. Values are limited by the cluster's value limit (1 MiB by default).
//! - Integers (INCR family) are stored as decimal ASCII, exactly as Redis stores them, not as
//!   Stratus's native 8-byte little-endian counters, so `SET k 10` then `INCR k` and `GET k`
//!   behave as in Redis and values read by any client stay Redis-compatible. INCR is a read
//!   and a write conditional on the version read (`version_ne_given`), retried up to
//!   [`commands::CONDITIONAL_UPDATE_ATTEMPTS_MAX`] times under contention: atomic, like Redis.
//!   APPEND and SET ... GET work the same way.
//! - SET NX is the `exists` reject rule (refuse if the object exists), SET XX the
//!   `doesnt_exist` rule. Expiry (EX, PX, EXAT, PXAT, KEEPTTL) does not exist in Stratus and
//!   is refused with an error, never ignored.
//! - DEL and EXISTS are one multi-remove / multi-read; MGET and MSET one multi-read /
//!   multi-write, fanned out to masters in parallel. MSET is not atomic across keys.
//! - MULTI / EXEC / WATCH: EXEC runs the queued commands as one Stratus transaction, atomic
//!   across keys on any masters; a changed WATCHed key makes it answer a null array
//!   (`transaction`, and docs/design/transactions.md).
//! - DBSIZE and KEYS enumerate the whole table (KEYS is bounded by reply size). SCAN keeps a
//!   Stratus enumeration in the gateway under a cursor number (at most `scans_open_max` open,
//!   oldest forgotten first): a key present for the whole scan is returned exactly once; a
//!   cursor works once, on the gateway that issued it, for the same database.
//! - FLUSHDB drops the database's table (FLUSHALL every database's); the next command
//!   recreates it empty.
//! - A hash is one object whose value starts with [`hash::HASH_MARKER`], then its fields in
//!   the order they were first set (docs/design/resp-hash-format.md). HSET, HDEL and HINCRBY
//!   are a read and a write conditional on the version read, like INCR; strings that would
//!   start with the marker are refused, and string commands on a hash (or hash commands on a
//!   string) answer WRONGTYPE, as in Redis.
//!
//! # Protocol
//!
//! Requests are RESP arrays of bulk strings or inline commands; many commands in one read
//! (pipelining) are answered in order. Malformed input gets `-ERR Protocol error: ...` and the
//! connection is closed, as Redis does. Every request is bounded ([`RequestLimits`]).
//! `HELLO 3` switches a connection's replies to RESP3 (maps, `_` nulls).
//!
//! # Users
//!
//! With the client password (`GatewayConfig::password`), a connection must AUTH first: as the
//! default user (the client password), or as one of the cluster's named users, whose commands
//! then go out with a client acting as that user, so that the cluster applies the user's table
//! grants (a refusal is `-NOPERM`). `ACL` manages users in the subset that maps onto table
//! grants (docs/design/resp-acl.md).

mod acl;
pub mod commands;
mod expiry;
mod gateway;
mod glob;
pub mod hash;
pub mod request;
mod server;
mod transaction;
pub mod value;

pub use gateway::{
    Gateway, GatewayConfig, GatewayStatistics, RespPassword, Session, UserClients,
    USER_CHECKS_AT_ONCE_MAX, USER_CLIENTS_CACHED_MAX,
};
pub use request::{Parsed, ProtocolError, RequestLimits, RequestParser};
pub use server::{serve, serve_connection, OUTPUT_FLUSH_BYTES};
pub use value::{parse_value, ParseError, Protocol, Value};

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
