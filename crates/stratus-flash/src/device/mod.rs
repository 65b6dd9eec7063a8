//! Where segments live: a narrow trait, a file-backed implementation for servers and an
//! in-memory one with injectable faults for tests and the deterministic simulator.
//!
//! Contract (the log keeps it; `MemoryDevice` asserts it so a test breaks where O_DIRECT would):
//! every offset, length and buffer address passed to `write_at` and `read_at` is a multiple of
//! [`crate::constants::IO_ALIGNMENT_BYTES`]; a segment is written only after `allocate` and
//! never after `free`; writes to one segment go in increasing offsets, except a retry of a
//! failed write, which rewrites the same range.

mod file;
mod memory;

pub use file::{FileDevice, IoMode};
pub use memory::MemoryDevice;

use crate::address::SegmentNumber;
use crate::error::FlashError;

/// Storage for the flash log's segments.
pub trait FlashDevice: Send + Sync + std::fmt::Debug {
    /// Creates the storage of a new, empty segment. `FlashError::Full` when the space budget
    /// (or the file system) has no room for another segment.
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError>;

    /// Writes `bytes` at `offset` of `segment`. Durable only after `sync`.
    fn write_at(&self, segment: SegmentNumber, offset: u64, bytes: &[u8])
        -> Result<(), FlashError>;

    /// Reads into `out` from `offset` of `segment`; returns how many bytes were present (fewer
    /// than asked at the end of what was written; what lies past that reads as zeros).
    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError>;

    /// Makes every completed write to `segment` durable (fdatasync).
    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError>;

    /// Removes a segment and returns its space to the budget, durably (a crash after it
    /// returns does not bring the segment back). On an error the segment stays present and
    /// counted, and the free may be retried.
    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError>;

    /// Every segment present, in increasing order (what a restart finds).
    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError>;

    /// The space budget in bytes.
    fn budget_bytes(&self) -> u64;
}
