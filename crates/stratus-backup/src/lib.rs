//! The Stratus backup service: replicas of masters' log segments, kept in bounded RAM buffers
//! and a preallocated storage file, and found again after a restart.
//!
//! - [`BackupService`]: the BACKUP_WRITE, BACKUP_FREE, BACKUP_LIST_REPLICAS,
//!   BACKUP_READ_REPLICA and BACKUP_GET_STATISTICS handlers (docs/design/wire-protocol.md), as a
//!   [`stratus_rpc::Service`]; [`BackupRouter`] serves it beside a master on one port.
//! - [`Durability`]: `buffered` (acknowledge from RAM; a replica goes to disk in one
//!   sequential write when it is closed) or `fsync` (acknowledge after fdatasync, with group
//!   commit).
//! - [`ReplicaStorage`]: the narrow disk interface ([`FileStorage`], [`MemoryStorage`]); the
//!   layout on it is docs/design/backup-format.md ([`format`]).
//!
//! Request handlers never touch the disk: disk work goes through a bounded queue to one I/O
//! thread, and a handler that must wait for it answers later ([`stratus_rpc::Handled::Later`]).
//! A failed write or sync poisons the backup: it refuses every later write with
//! BACKUP_STORAGE_FAILED instead of acknowledging data it may not hold.

pub mod format;
mod garbage;
mod io;
mod partitioning;
mod scan;
mod service;
pub mod storage;

pub use garbage::{collect_garbage, collect_once, GARBAGE_COLLECTION_INTERVAL};
pub use partitioning::{
    PARTITIONINGS_MAX, PARTITIONING_IDLE_TIMEOUT, RECOVERY_PARTITIONED_BYTES_MAX,
};
pub use scan::validate_replica;
pub use service::{
    is_backup_opcode, BackupConfig, BackupError, BackupRouter, BackupService, BackupStatistics,
    Durability, Pending, ReplicaContents, ReplicaWrite, RestartReport, DISK_READS_IN_FLIGHT_MAX,
    STORAGE_FILE_NAME,
};
pub use storage::{
    DirectFileStorage, FileStorage, MemoryStorage, ReplicaStorage, DIRECT_IO_BLOCK_BYTES,
};
