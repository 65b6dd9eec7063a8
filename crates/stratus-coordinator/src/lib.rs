//! The coordinator.
//!
//! It knows the cluster's servers (ids are handed out at enlistment and never reused), the
//! tables (name → id, ids never reused) and the tablet map (which master serves which range of
//! which table). It is never on the read/write path: clients fetch the tablet map once and talk
//! to masters directly.
//!
//! Every change is made durable in the [`MetaStore`](stratus_meta::MetaStore) before it is
//! acknowledged or acted on, in one atomic batch, so a coordinator killed at any point restarts
//! with every acknowledged table. Telling masters about their tablets is idempotent and is
//! repeated after a restart, which covers a crash between persisting a table and informing its
//! masters. The byte layout of the records is in docs/design/coordinator-records.md.

mod client_leases;
mod metrics;
mod records;
mod recovery;
mod service;
mod standby;
mod users;

pub use client_leases::LeaseIdPermutation;
pub use metrics::CoordinatorMetrics;
pub use records::{CoordinatorState, LogHead, TableRecord, TabletRecord, TabletSplit};
pub use recovery::FailureDetectorConfig;
pub use service::{Authority, Coordinator};
pub use standby::{StandbyGate, STANDBY_ANSWER};
pub use users::USER_DIRECTORY_POLL;
