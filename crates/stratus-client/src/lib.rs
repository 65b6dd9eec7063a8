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
//! A [`Transaction`] reads and writes objects on any masters and commits them atomically,
//! strictly serializable (docs/design/transactions.md): reads go to the masters as they
//! come, writes are buffered, and the commit prepares every object on its master (in
//! parallel) and then tells each master the decision; [`Client::run_transaction`] runs one
//! again after a conflict. [`Client::finish_transaction`] is for participants: a master
//! finishing a transaction whose client died.
//!
//! This crate depends on no server crate: only the shared types, the wire protocol and the RPC
//! layer.
//!
//! Mutations are exactly-once (RIFL, docs/design/exactly-once.md): the client holds a lease
//! from the coordinator and gives every mutation an id that all its attempts carry, so a
//! mutation retried after an attempt whose outcome is unknown is applied once, and the retry
//! gets the first answer. A client with [`ClientConfig::exactly_once`] off sends no identity:
//! then such a retry may apply a mutation twice, unless
//! [`ClientConfig::retry_ambiguous_mutations`] is off too (the caller gets the ambiguous error).

mod blocking;
mod client;
mod enumeration;
mod error;
mod exactly_once;
mod multi;
mod overview;
mod transaction;
mod users;

pub use blocking::BlockingClient;
pub use client::{Client, ClientConfig, ObjectRead};
pub use enumeration::Enumeration;
pub use error::{Error, Result};
pub use overview::{dram_hit_ratio, ClusterOverview, ServerOverview, OVERVIEW_ASKS_IN_FLIGHT_MAX};
pub use stratus_rpc::UserPassword;
pub use stratus_types::{ExpiresAt, Expiry, RejectRules, TableId, Tier, Version};
pub use stratus_types::{LeaseId, RpcId, RpcIdentity, TxDecision};
pub use stratus_wire::users::validate_user_name;
pub use stratus_wire::{
    EnumeratedObject, IncrementItem, KeyItem, ServerEntry, ServerStatistics, ServerStatus, Status,
    TableEntry, TabletEntry, TxDecisionOp, WriteItem,
};
pub use stratus_wire::{Identity, TableAccess, TableGrant, UserSummary};
pub use transaction::{AbortReason, BlockingTransaction, Transaction, TransactionError, TxOutcome};
pub use users::UserSettings;
