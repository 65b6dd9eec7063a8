//! The flash log's errors. Callers decide by variant: `Full` and `BuffersBusy` are back-pressure
//! (nothing already appended is lost), `Io` is the device failing, `Format` is bytes that do
//! not verify.

use crate::address::{FlashAddress, SegmentNumber};

/// Why bytes could not be decoded or did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes end before the structure does.
    Truncated,
    /// The entry type code is not one the format defines.
    InvalidEntryType(u8),
    /// The stored checksum does not match the bytes.
    ChecksumMismatch,
    /// The segment header does not start with the flash log's magic.
    BadMagic,
    /// The segment header's format version is not one this code reads.
    UnknownFormatVersion(u16),
    /// A field holds a value the format does not allow.
    Malformed(&'static str),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{self:?}")
    }
}

impl std::error::Error for FormatError {}

/// Which device operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOperation {
    /// Creating a segment's storage.
    Allocate,
    /// A positioned write.
    Write,
    /// A positioned read.
    Read,
    /// fdatasync.
    Sync,
    /// Removing a segment's storage.
    Free,
    /// Listing the segments present at open.
    List,
    /// Opening the device.
    Open,
}

/// An error of the flash log or its device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlashError {
    /// The space budget (or the file system) is full: no new segment can be allocated. Every
    /// entry appended before stays readable and every flushed one durable.
    Full {
        /// The device's space budget.
        budget_bytes: u64,
    },
    /// Every flush buffer is full or being written: flush (`FlashLog::flush_ready`) and retry.
    /// Appenders get this instead of spinning, which is T2's documented deadlock.
    BuffersBusy,
    /// The device failed an operation.
    Io {
        /// What was being done.
        operation: IoOperation,
        /// The segment it was done to (0 when none).
        segment: SegmentNumber,
        /// The operating system's error kind.
        kind: std::io::ErrorKind,
        /// The operating system's error number, when there is one.
        os_code: Option<i32>,
    },
    /// The entry does not fit in a flush buffer.
    EntryTooLarge {
        /// The encoded entry's size.
        entry_bytes: usize,
        /// The largest entry this geometry holds.
        entry_bytes_max: usize,
    },
    /// The key is longer than the format's 16-bit length.
    KeyTooLarge {
        /// The key's length.
        key_bytes: usize,
    },
    /// The entry breaks a rule of the format that the decoder checks (a tombstone without a
    /// dead address or with a value, an object with a dead address): appending it would make
    /// the restart scan skip the rest of its slot.
    InvalidEntry {
        /// The rule it breaks, as the decoder would report it.
        error: FormatError,
    },
    /// The number of flush buffers is out of bounds or exceeds the slots of a segment (then
    /// several segments could be allocated ahead of the flusher, and a crash would leave
    /// header-less segments that are not the highest).
    FlushBuffersInvalid {
        /// The number asked for.
        flush_buffers: usize,
        /// Buffer slots per segment in the geometry.
        slots_per_segment: u64,
    },
    /// `clean_segment` was given a segment that is not closed.
    SegmentNotClosed {
        /// The segment.
        segment: SegmentNumber,
        /// Its state (`None`: not in the table).
        state: Option<crate::segments::SegmentState>,
    },
    /// The segment and buffer sizes do not make a valid layout.
    InvalidGeometry {
        /// The segment size asked for.
        segment_bytes: usize,
        /// The buffer size asked for.
        buffer_bytes: usize,
    },
    /// A segment on the device was written with another geometry than the log was opened with.
    GeometryMismatch {
        /// The segment.
        segment: SegmentNumber,
    },
    /// A new log was asked for on a device that already holds segments (restart with
    /// `recover` instead).
    DeviceNotEmpty,
    /// A segment on the device belongs to another log, is named for another segment, or is
    /// numbered past what 64-bit addresses of this geometry can reach.
    ForeignSegment {
        /// The segment.
        segment: SegmentNumber,
    },
    /// The address's segment has been cleaned and freed.
    SegmentFreed {
        /// The address read.
        address: FlashAddress,
    },
    /// Nothing was ever appended at the address (beyond the log's end, or not an entry start).
    NotWritten {
        /// The address read.
        address: FlashAddress,
    },
    /// Bytes read do not verify.
    Format {
        /// The address (or segment start) they were read at.
        address: FlashAddress,
        /// What is wrong with them.
        error: FormatError,
    },
}

impl FlashError {
    /// The error for a failed device operation: `Full` when the file system is out of space.
    pub fn from_io(
        operation: IoOperation,
        segment: SegmentNumber,
        error: &std::io::Error,
        budget_bytes: u64,
    ) -> FlashError {
        if error.kind() == std::io::ErrorKind::StorageFull
            || error.raw_os_error() == Some(libc::ENOSPC)
        {
            return FlashError::Full { budget_bytes };
        }
        FlashError::Io { operation, segment, kind: error.kind(), os_code: error.raw_os_error() }
    }
}

impl std::fmt::Display for FlashError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{self:?}")
    }
}

impl std::error::Error for FlashError {}
