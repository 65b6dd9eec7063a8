//! The in-memory log of a Stratus master (RAMCloud's log-structured memory).
//!
//! One preallocated region is divided into seglets (64 KiB by default); a segment is a list of
//! up to `segment_bytes / seglet_bytes` seglets, allocated to the head lazily as it grows.
//! Entries may span seglets but never segments. The byte formats in [`format`] are final:
//! backups and recovery depend on them (see docs/design/log-format.md).
//!
//! This version has no cleaner: memory is never freed, only counted dead. The engine does no
//! I/O, spawns no threads and never reads the clock.

pub mod format;
pub mod iterator;
pub mod log;
pub mod seglet_memory;

pub use format::{Certificate, Entry, EntryType, FormatError, ObjectView, TombstoneView};
pub use iterator::{IteratedEntry, SegmentIterator};
pub use log::{
    AppendEntry, AppendError, AppendPriority, Appended, Log, LogConfig, LogStatistics, Reference,
    SegmentStatistics, LOG_BYTES_MAX, REFERENCE_BITS,
};
