//! The master service.
//!
//! A master owns a set of tablets and stores their objects in an [`ObjectStore`] (log-structured
//! memory plus hash index). Every object request is checked against the owned tablets before the
//! store sees it: a key outside them gets UNKNOWN_TABLET, which tells the client its tablet map
//! is stale. Requests are handled synchronously on the connection's task: the store does no I/O.
//! With replication on, a request that changed the log is answered only after the
//! [`ReplicaManager`] has the log up to it on every replica; the handler returns a future for
//! that wait instead of blocking the connection.
//!
//! Reads copy the value straight from the log into the response frame: one copy, no
//! intermediate buffer.

mod client_leases;
mod flash_images;
mod flash_settings;
mod lease;
mod metrics;
mod migration;
mod ownership;
mod peer_probe;
mod recovery;
mod replication;
mod service;
mod transaction_recovery;

pub use client_leases::{ClientLeaseChecks, LeaseStanding, CLIENT_LEASE_SWEEP_INTERVAL};
pub use flash_images::DeviceImages;
pub use flash_settings::{
    FlashSettings, FlashSettingsError, FLASH_BYTES_MAX_DEFAULT, FLASH_DIRECTORY_NAME,
};
pub use lease::{keep_lease, Lease, LEASE_RENEW_INTERVAL};
pub use metrics::{MasterMetrics, Operation, RecoveryStatistics};
pub use migration::INCOMING_TRANSFERS_REMEMBERED_MAX;
pub use ownership::{AssignmentRefusal, TabletOwnership, WriteRefusal};
pub use peer_probe::{probe_peers, PeerProbeConfig, ServerList, SERVER_LIST_REFRESH_INTERVAL};
pub use recovery::{RecoveryReader, RECOVERY_READS_IN_FLIGHT_MAX};
pub use replication::{
    LogPosition, Placement, ReplicaManager, ReplicationConfig, ReplicationStatistics, SyncError,
    REPLICATION_TIMEOUT_DEFAULT,
};
pub use service::{Master, MasterConfig};
pub use transaction_recovery::finish_abandoned_transactions;
