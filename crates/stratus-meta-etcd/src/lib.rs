//! The coordinator's metadata store on etcd, and coordinator leadership decided by etcd.
//!
//! With etcd, several coordinators run: one is active, the others stand by. The active one
//! holds the leadership ([`Leadership`]: a key attached to an etcd lease it keeps alive) and
//! keeps its metadata in etcd ([`EtcdMetaStore`], which implements the same
//! [`MetaStore`](stratus_meta::MetaStore) trait as the embedded file store and passes the same
//! conformance suite). When it dies, its lease expires and a standby takes the leadership,
//! loads the metadata from etcd and carries on like a restarted coordinator.
//!
//! Keys, under a namespace (default `/stratus/default/`) so several clusters can share an
//! etcd:
//! - `<namespace>leader`: the active coordinator's identity, attached to its lease.
//! - `<namespace>data/<key>`: the metadata map.
//!
//! etcd is spoken to through its JSON gateway over HTTP/1.1 ([`client`]), which needs no
//! generated code and no protobuf compiler to build. etcd must allow transactions and requests
//! as large as the coordinator's largest batch: start it with `--max-txn-ops` of at least
//! [`TXN_OPERATIONS_MAX`] and `--max-request-bytes` of at least [`REQUEST_BYTES_MIN`]
//! (docs/design/coordinator-failover.md).

pub mod client;
mod leadership;
pub mod local;
mod store;

pub use client::{EtcdClient, EtcdError};
pub use leadership::{Leadership, LeadershipConfig};
pub use store::EtcdMetaStore;

/// Most keys one metadata batch may touch. The coordinator's batches touch a few keys (a table,
/// a server, a counter), a recovery one per table of the crashed master; etcd refuses more than
/// its `--max-txn-ops` (128 by default), so etcd must be started with at least this.
pub const TXN_OPERATIONS_MAX: usize = 4096;

/// The `--max-request-bytes` etcd needs so that the largest batch the store accepts
/// ([`stratus_meta::BATCH_BYTES_MAX`]) fits, with room for the transaction's framing.
pub const REQUEST_BYTES_MIN: usize = stratus_meta::BATCH_BYTES_MAX + (1 << 20);

/// Largest answer read from etcd. A range read is paged, so this bounds one page of
/// [`SCAN_PAGE_KEYS`] pairs, each at most [`stratus_meta::VALUE_BYTES_MAX`] (base64 makes it a
/// third larger).
pub const RESPONSE_BYTES_MAX: u64 = 512 << 20;

/// Keys per page of a range read.
pub const SCAN_PAGE_KEYS: usize = 16;

/// The default namespace.
pub const DEFAULT_NAMESPACE: &str = "/stratus/default/";

/// The leader key of `namespace`.
pub(crate) fn leader_key(namespace: &str) -> Vec<u8> {
    format!("{namespace}leader").into_bytes()
}

/// The key naming a holder a standby deposed because it judged it gone, on a lease that lasts
/// as long as that holder could still believe itself active (see `Leadership`).
pub(crate) fn deposed_key(namespace: &str) -> Vec<u8> {
    format!("{namespace}deposed").into_bytes()
}
