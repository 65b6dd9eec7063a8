//! The flash log of Stratus's flash tier: objects of flash-resident tables live in
//! log-structured segments on a local disk, with only their index in DRAM.
//!
//! - [`format`]: the bytes (segment header, object and tombstone entries), specified in
//!   docs/design/flash-format.md;
//! - [`FlashAddress`]: a virtual log position that stays valid when its buffer is flushed;
//! - [`FlashLog`]: appends into DRAM flush buffers (current → processing → ready), flushes
//!   them in log order, reads from a buffer or the device;
//! - [`device`]: the [`FlashDevice`] trait, a file-per-segment implementation with O_DIRECT when
//!   the file system allows it, and an in-memory one with injectable faults;
//! - cleaning: live bytes per segment, cost-benefit ranking, relocation with a compare on the
//!   old address ([`RelocationIndex`]), and read epochs before a segment's space is reused;
//! - [`recover`]: the restart scan that rebuilds the index;
//! - [`io`]: the optional background flusher and bounded read pool (the only threads).

pub mod address;
pub mod aligned;
mod buffers;
mod cleaning;
pub mod constants;
pub mod device;
mod error;
pub mod format;
pub mod io;
mod log;
mod recovery;
pub mod scan;
mod segments;

pub use address::{FlashAddress, Geometry, SegmentNumber};
pub use cleaning::{CleanOutcome, Relocation, RelocationIndex, SegmentImage};
pub use device::{FileDevice, FlashDevice, IoMode, MemoryDevice};
pub use error::{FlashError, FormatError, IoOperation};
pub use format::{EntryKind, EntryRef, OwnedEntry};
pub use log::{FlashConfig, FlashLog, FlushProgress};
pub use recovery::{recover, RecoveredObject, Recovery};
pub use segments::{CostBenefit, SegmentState, SegmentStats};
