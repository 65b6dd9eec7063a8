//! The in-memory log of a Stratus master (RAMCloud's log-structured memory).
//!
//! One preallocated region is divided into seglets (64 KiB by default); a segment is a list of
//! up to `segment_bytes / seglet_bytes` seglets, allocated to the head lazily as it grows.
//! Entries may span seglets but never segments. The byte formats in [`mod@format`] are final:
//! backups and recovery depend on them (see docs/design/log-format.md).
//!
//! Memory is freed by the cleaner (in `stratus-store`, which owns the hash table it needs):
//! this crate provides its mechanisms: side-log survivor segments fused into the log by the
//! next head's digest, epoch guards that keep dropped seglets alive while a reader can see
//! them, and per-segment statistics. The engine does no I/O, spawns no threads and never reads
//! the clock (time arrives as an argument).

pub mod format;
mod free_seglets;
pub mod iterator;
pub mod log;
pub mod seglet_memory;
pub mod table_tallies;

pub use format::{
    Certificate, Entry, EntryType, FormatError, ObjectView, PreparedTombstoneRecord, PreparedView,
    TableStats, TableTally, TombstoneView, TxParticipant, TxParticipantsRecord,
    COMPLETION_CONTENT_BYTES_MAX, ENTRY_HEADER_BYTES_MAX,
};
pub use iterator::{
    filter_segment, partition_segment, verify_replica, IteratedEntry, SegmentIterator,
    VerifiedReplica,
};
pub use log::{
    AppendEntry, AppendError, AppendPriority, Appended, CleaningCandidate, Log, LogConfig,
    LogStatistics, Reference, SegmentStatistics, SideLog, DISK_EXPANSION_FACTOR,
    DROPPED_SEGMENTS_REMEMBERED_MAX, LOG_BYTES_MAX, REFERENCE_BITS,
};
pub use seglet_memory::{EpochGuard, EPOCH_SLOTS};
pub use table_tallies::TableTallies;
