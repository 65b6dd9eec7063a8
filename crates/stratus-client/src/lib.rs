//! The Stratus client library.
//!
//! [`Client`] is async (tokio); [`BlockingClient`] is for synchronous code: it sends a
//! single-object request whose master it knows over a blocking socket of its own, and runs
//! everything else on an async `Client` inside. A client asks
//! the coordinator for a table's tablet map once, caches it, and sends each request straight to
//! the master that owns the key. When a master answers UNKNOWN_TABLET or WRONG_SERVER, or cannot
//! be reached, the client drops the cached map, fetches a fresh one and retries with backoff;
//! RETRY is retried with backoff too. Every operation has a deadline
//! ([`ClientConfig::operation_timeout`]) after which it fails with a clear status.
//!
//! Multi-operations group their items by master and send one request per master, all in
//! parallel, and return one result per item in the caller's order; each item is retried as a
//! single-object request of its own would be. Enumerations, table calls and statistics
//! calls end by the operation's deadline too, each request bounded by the time left.
//!
//! This crate depends on no server crate: only the shared types, the wire protocol and the RPC
//! layer.
//!
//! Until exactly-once RPCs exist, a mutation retried after an attempt whose outcome is unknown
//! may run twice (for `increment`, the delta applied twice), unless
//! [`ClientConfig::retry_ambiguous_mutations`] is off: then the caller gets the ambiguous
//! error instead.

mod blocking;
mod client;
mod enumeration;
mod error;
mod multi;
mod overview;

pub use blocking::BlockingClient;
pub use client::{Client, ClientConfig, ObjectRead};
pub use enumeration::Enumeration;
pub use error::{Error, Result};
pub use overview::{ClusterOverview, ServerOverview, OVERVIEW_ASKS_IN_FLIGHT_MAX};
pub use stratus_types::{ExpiresAt, Expiry, RejectRules, TableId, Version};
pub use stratus_wire::{
    EnumeratedObject, IncrementItem, KeyItem, ServerEntry, ServerStatistics, ServerStatus, Status,
    TableEntry, TabletEntry, WriteItem,
};
