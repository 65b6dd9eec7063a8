//! Virtual log addresses. An address is `segment number × segment bytes + offset`: the byte's
//! place in the log, whether it still sits in a DRAM flush buffer or is already on the device.
//! A buffer covers exactly the device range it will be written to, so flushing a buffer never
//! changes an address and never touches the index (T2 §4.2, from LLAMA).
//!
//! Segment numbers grow for the life of a log and are never reused, so an address is never
//! reused either: an index entry left pointing into a freed segment reads as
//! `FlashError::SegmentFreed`, never as another object's bytes.

use crate::constants::{
    FLUSH_BUFFER_BYTES_MAX, FLUSH_BUFFER_BYTES_MIN, IO_ALIGNMENT_BYTES, SEGMENT_BYTES_MAX,
    SEGMENT_HEADER_BYTES,
};
use crate::error::FlashError;

/// A segment's number: its place in log order. Numbering starts at 1, so address 0 is never an
/// entry's (the format uses 0 for "no address").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentNumber(pub u64);

/// The first segment number of a new log.
pub const SEGMENT_NUMBER_FIRST: SegmentNumber = SegmentNumber(1);

/// A position in the virtual log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlashAddress(pub u64);

/// The sizes that give addresses their meaning. Recorded in every segment header, so a log is
/// never reopened with another geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    segment_bytes: u64,
    buffer_bytes: u64,
}

impl Geometry {
    /// The default geometry: 8 MiB segments of eight 1 MiB flush buffers.
    pub const DEFAULT: Geometry = Geometry {
        segment_bytes: crate::constants::SEGMENT_BYTES_DEFAULT as u64,
        buffer_bytes: crate::constants::FLUSH_BUFFER_BYTES_DEFAULT as u64,
    };

    /// A geometry, checked: buffers are whole aligned blocks, a segment is whole buffers, and
    /// both are within the constants' bounds.
    pub fn new(segment_bytes: usize, buffer_bytes: usize) -> Result<Geometry, FlashError> {
        let valid = (FLUSH_BUFFER_BYTES_MIN..=FLUSH_BUFFER_BYTES_MAX).contains(&buffer_bytes)
            && buffer_bytes.is_multiple_of(IO_ALIGNMENT_BYTES)
            && buffer_bytes > SEGMENT_HEADER_BYTES * 2
            && segment_bytes <= SEGMENT_BYTES_MAX
            && segment_bytes >= buffer_bytes
            && segment_bytes.is_multiple_of(buffer_bytes);
        if !valid {
            return Err(FlashError::InvalidGeometry { segment_bytes, buffer_bytes });
        }
        Ok(Geometry { segment_bytes: segment_bytes as u64, buffer_bytes: buffer_bytes as u64 })
    }

    /// Bytes per segment.
    pub fn segment_bytes(self) -> u64 {
        self.segment_bytes
    }

    /// Bytes per flush buffer (and per buffer slot of a segment).
    pub fn buffer_bytes(self) -> u64 {
        self.buffer_bytes
    }

    /// Largest encoded entry: it must fit a buffer slot after a segment header, because an
    /// entry never straddles a slot.
    pub fn entry_bytes_max(self) -> usize {
        (self.buffer_bytes as usize) - SEGMENT_HEADER_BYTES
    }

    /// The address of `offset` in `segment`.
    pub fn address(self, segment: SegmentNumber, offset: u64) -> FlashAddress {
        debug_assert!(offset < self.segment_bytes);
        FlashAddress(segment.0 * self.segment_bytes + offset)
    }

    /// The first address of `segment`.
    pub fn segment_start(self, segment: SegmentNumber) -> FlashAddress {
        self.address(segment, 0)
    }

    /// The segment holding `address`.
    pub fn segment_of(self, address: FlashAddress) -> SegmentNumber {
        SegmentNumber(address.0 / self.segment_bytes)
    }

    /// The offset of `address` inside its segment.
    pub fn offset_in_segment(self, address: FlashAddress) -> u64 {
        address.0 % self.segment_bytes
    }

    /// The first address of the buffer slot holding `address`.
    pub fn slot_of(self, address: FlashAddress) -> FlashAddress {
        FlashAddress(address.0 - address.0 % self.buffer_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_splits_into_its_segment_and_offset() {
        let geometry = Geometry::DEFAULT;
        let address = geometry.address(SegmentNumber(3), 12_345);
        assert_eq!(address.0, 3 * (8 << 20) + 12_345);
        assert_eq!(geometry.segment_of(address), SegmentNumber(3));
        assert_eq!(geometry.offset_in_segment(address), 12_345);
        assert_eq!(geometry.slot_of(address), geometry.segment_start(SegmentNumber(3)));
    }

    #[test]
    fn geometries_that_break_the_layout_are_refused() {
        assert!(Geometry::new(64 << 10, 16 << 10).is_ok());
        assert!(Geometry::new(64 << 10, 10_000).is_err(), "unaligned buffer");
        assert!(Geometry::new(40 << 10, 16 << 10).is_err(), "segment not whole buffers");
        assert!(Geometry::new(8 << 10, 16 << 10).is_err(), "segment smaller than a buffer");
        assert!(Geometry::new(2 << 30, 1 << 20).is_err(), "segment too large");
    }
}
