//! Every limit of the flash log, in one place, each with its reason. Relations between them are
//! checked at compile time, so a change to one cannot silently break another. The geometry a
//! log actually runs with is a [`crate::Geometry`] (tests use small segments); these are its
//! defaults and its bounds.

/// Alignment of every device write and read, in bytes: offsets, lengths and memory. Direct I/O
/// (O_DIRECT) needs the logical block size, which is 512 or 4096 on every disk we run on; 4096
/// is the page size and the flash page of current SSDs, so aligned writes never cause a
/// read-modify-write inside the drive either.
pub const IO_ALIGNMENT_BYTES: usize = 4096;

/// Default segment size (8 MiB): the unit of allocation, cleaning and freeing. The same as the
/// memory log's segment (`stratus_types::limits::SEGMENT_BYTES_DEFAULT`), so a segment's worth
/// of cleaning work is comparable in both tiers; large enough that cleaning reads a segment in
/// one sequential I/O at full bandwidth and the per-segment table (a few dozen bytes per
/// segment) stays small (2 TiB of flash = 256 K segments); small enough that a mostly-dead
/// segment is found and freed without copying much.
pub const SEGMENT_BYTES_DEFAULT: usize = 8 << 20;

/// Default flush buffer size (1 MiB), T2's size (its Figure 5.3): one write of this size runs
/// an SSD at its sequential bandwidth (measured by `examples/flash_raw.rs`), and it bounds the
/// largest entry (an entry never straddles a buffer).
pub const FLUSH_BUFFER_BYTES_DEFAULT: usize = 1 << 20;

/// Default number of flush buffers (4): one filling, one being written, and two so appenders
/// rarely find no ready buffer while a flush and its fdatasync are in flight. Appenders never
/// spin for a buffer (T2's documented deadlock): with none ready they get
/// `FlashError::BuffersBusy` and the caller flushes or waits.
pub const FLUSH_BUFFERS_DEFAULT: usize = 4;

/// Fewest flush buffers: one current and one being flushed, or appends stop during every flush.
pub const FLUSH_BUFFERS_MIN: usize = 2;

/// Most flush buffers: the ring is scanned linearly on a read of a buffered address, and more
/// than 64 MiB of unflushed data per log only delays durability.
pub const FLUSH_BUFFERS_MAX: usize = 64;

/// Smallest flush buffer: one aligned block.
pub const FLUSH_BUFFER_BYTES_MIN: usize = IO_ALIGNMENT_BYTES;

/// Largest flush buffer (16 MiB): buffer offsets fit 32 bits with room to spare, and one flush
/// stays short enough that appenders waiting for a buffer are not starved for long.
pub const FLUSH_BUFFER_BYTES_MAX: usize = 16 << 20;

/// Largest segment (1 GiB): a cleaning pass reads a whole segment into memory.
pub const SEGMENT_BYTES_MAX: usize = 1 << 30;

/// Bytes of the segment header at the start of every segment (docs/design/flash-format.md).
pub const SEGMENT_HEADER_BYTES: usize = 40;

/// Bytes of an entry header (object or tombstone).
pub const ENTRY_HEADER_BYTES: usize = 40;

/// Entries start on 8-byte boundaries, so concurrent appenders copying into one flush buffer
/// never share a 64-bit word (the buffer is an array of atomic words; see `buffers.rs`).
pub const ENTRY_ALIGNMENT_BYTES: usize = 8;

/// Largest key: its length is a 16-bit field (the same bound as the memory log's keys).
pub const KEY_BYTES_MAX: usize = u16::MAX as usize;

/// Bytes from an entry's start that a read without a size hint fetches in its first I/O (the
/// aligned blocks covering them: one or two 4 KiB blocks), so an entry of up to 4 KiB is always
/// /// one I/O whatever its offset. With only the block holding the start, a quarter of 1 KiB
/// entries straddle a block and need a second I/O: flash_raw measured p99 123 µs, against 72 µs
/// with this (p50 57 against 53 µs; raw 4 KiB pread: 46 / 63 µs).
pub const READ_FIRST_BYTES: usize = IO_ALIGNMENT_BYTES;

/// Most reads a `ReadPool` keeps in flight: a queue-depth bound. NVMe drives reach their random
/// read throughput near depth 32-64; past that, more threads only add context switches.
pub const READ_POOL_DEPTH_MAX: usize = 64;

/// Default segments kept for the cleaner (2): relocating a segment's live entries needs at
/// most one new segment when the victim is not full (`CLEANABLE_LIVE_PERCENT_MAX`), plus one
/// because the head may be part-filled when the pass starts. Without a reserve, a full disk
/// could never be cleaned: every relocation would be refused for want of the space it frees.
pub const CLEANER_RESERVE_SEGMENTS_DEFAULT: u64 = 2;

/// Percent of live bytes above which a segment is not worth cleaning: copying 95 % to free 5 %
/// costs 19 bytes written per byte freed.
pub const CLEANABLE_LIVE_PERCENT_MAX: u64 = 95;

const _: () = assert!(SEGMENT_BYTES_DEFAULT.is_multiple_of(FLUSH_BUFFER_BYTES_DEFAULT));
const _: () = assert!(FLUSH_BUFFER_BYTES_DEFAULT.is_multiple_of(IO_ALIGNMENT_BYTES));
const _: () = assert!(FLUSH_BUFFERS_DEFAULT >= FLUSH_BUFFERS_MIN);
const _: () = assert!(FLUSH_BUFFERS_DEFAULT <= FLUSH_BUFFERS_MAX);
const _: () = assert!(SEGMENT_HEADER_BYTES.is_multiple_of(ENTRY_ALIGNMENT_BYTES));
const _: () = assert!(ENTRY_HEADER_BYTES.is_multiple_of(ENTRY_ALIGNMENT_BYTES));
// The largest key with its header fits in the default buffer after the segment header.
const _: () =
    assert!(SEGMENT_HEADER_BYTES + ENTRY_HEADER_BYTES + KEY_BYTES_MAX < FLUSH_BUFFER_BYTES_DEFAULT);
// A buffer offset and an entry length fit the format's 32-bit fields.
const _: () = assert!(FLUSH_BUFFER_BYTES_MAX <= u32::MAX as usize);
