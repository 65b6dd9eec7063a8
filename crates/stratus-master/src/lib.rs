//! The master service.
//!
//! A master owns a set of tablets and stores their objects in an [`ObjectStore`] (log-structured
//! memory plus hash index). Every object request is checked against the owned tablets before the
//! store sees it: a key outside them gets UNKNOWN_TABLET, which tells the client its tablet map
//! is stale. Requests are handled synchronously on the connection's task: the store does no I/O,
//! so there is nothing to wait for until replication arrives (a later issue).
//!
//! Reads copy the value straight from the log into the response frame: one copy, no
//! intermediate buffer.

mod ownership;
mod service;

pub use ownership::TabletOwnership;
pub use service::{Master, MasterConfig};
