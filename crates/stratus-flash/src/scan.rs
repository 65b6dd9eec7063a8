//! Walking the entries of one segment's bytes, as restart and the cleaner do. Every entry is
//! verified; at bytes that do not verify (a torn write's tail, or corruption) the walk records a
//! tear and goes on at the next buffer slot: slots are written whole and in order, so after a
//! crash nothing follows a torn slot, and after media corruption the later slots are intact.
//! Never panics, whatever the bytes.

use crate::address::{FlashAddress, Geometry, SegmentNumber};
use crate::constants::SEGMENT_HEADER_BYTES;
use crate::error::FormatError;
use crate::format::{decode_entry, Decoded, EntryRef};

/// One entry found in a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentItem<'a> {
    /// Where it is.
    pub address: FlashAddress,
    /// The entry.
    pub entry: EntryRef<'a>,
    /// Bytes it occupies (padding included).
    pub entry_bytes: usize,
}

/// Bytes that did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tear {
    /// Where the bad bytes start.
    pub address: FlashAddress,
    /// What is wrong with them.
    pub error: FormatError,
}

/// What a walk skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Entries yielded.
    pub entries: u64,
    /// Every place bytes did not verify.
    pub tears: Vec<Tear>,
    /// Bytes from each tear to the end of its slot's present bytes, not read past.
    pub unreadable_bytes: u64,
}

/// An iterator over the verified entries of one segment's bytes (its present prefix; missing
/// bytes are empty slots).
#[derive(Debug)]
pub struct SegmentEntries<'a> {
    bytes: &'a [u8],
    segment: SegmentNumber,
    geometry: Geometry,
    /// Offset of the next entry in the segment.
    position: usize,
    report: ScanReport,
}

impl<'a> SegmentEntries<'a> {
    /// Walks `bytes`, the segment's bytes from offset 0 (its header already verified).
    pub fn new(bytes: &'a [u8], segment: SegmentNumber, geometry: Geometry) -> SegmentEntries<'a> {
        SegmentEntries {
            bytes,
            segment,
            geometry,
            position: SEGMENT_HEADER_BYTES,
            report: ScanReport::default(),
        }
    }

    /// What the walk has skipped so far.
    pub fn report(&self) -> &ScanReport {
        &self.report
    }

    /// The report, consuming the walk.
    pub fn into_report(self) -> ScanReport {
        self.report
    }

    fn next_slot(&mut self) {
        let slot_bytes = self.geometry.buffer_bytes() as usize;
        self.position = (self.position / slot_bytes + 1) * slot_bytes;
    }
}

impl<'a> Iterator for SegmentEntries<'a> {
    type Item = SegmentItem<'a>;

    fn next(&mut self) -> Option<SegmentItem<'a>> {
        let slot_bytes = self.geometry.buffer_bytes() as usize;
        let end = self.bytes.len().min(self.geometry.segment_bytes() as usize);
        while self.position < end {
            let slot_end = ((self.position / slot_bytes + 1) * slot_bytes).min(end);
            let address = self.geometry.address(self.segment, self.position as u64);
            match decode_entry(&self.bytes[self.position..slot_end]) {
                Ok(Decoded::Entry(entry, entry_bytes)) => {
                    self.position += entry_bytes;
                    self.report.entries += 1;
                    return Some(SegmentItem { address, entry, entry_bytes });
                }
                Ok(Decoded::Padding) => self.next_slot(),
                Err(error) => {
                    self.report.tears.push(Tear { address, error });
                    self.report.unreadable_bytes += (slot_end - self.position) as u64;
                    self.next_slot();
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{EntryRef, SegmentHeader};

    fn geometry() -> Geometry {
        Geometry::new(16 << 10, 4 << 10).unwrap()
    }

    fn segment_with(entries_per_slot: &[&[EntryRef<'_>]]) -> Vec<u8> {
        let mut bytes = vec![0u8; 16 << 10];
        let header = SegmentHeader { log_id: 1, segment: SegmentNumber(1), geometry: geometry() };
        bytes[..SEGMENT_HEADER_BYTES].copy_from_slice(&header.encode());
        for (slot, entries) in entries_per_slot.iter().enumerate() {
            let mut position = if slot == 0 { SEGMENT_HEADER_BYTES } else { slot * 4096 };
            for entry in *entries {
                let encoded = entry.encode();
                bytes[position..position + encoded.len()].copy_from_slice(&encoded);
                position += encoded.len();
            }
        }
        bytes
    }

    #[test]
    fn every_entry_of_every_slot_is_found_in_order() {
        let a = EntryRef::object(1, b"a", b"1", 1);
        let b = EntryRef::object(1, b"b", b"2", 2);
        let c = EntryRef::tombstone(1, b"a", 1, FlashAddress(16 << 10));
        let bytes = segment_with(&[&[a, b], &[], &[c]]);
        let mut walk = SegmentEntries::new(&bytes, SegmentNumber(1), geometry());
        let found: Vec<_> =
            walk.by_ref().map(|item| (item.address.0 - (16 << 10), item.entry)).collect();
        assert_eq!(found, vec![(40, a), (88, b), (8192, c)]);
        assert_eq!(walk.report().tears, vec![]);
    }

    #[test]
    fn a_torn_slot_is_reported_and_the_walk_goes_on_at_the_next_slot() {
        let a = EntryRef::object(1, b"a", &[7u8; 100], 1);
        let b = EntryRef::object(1, b"b", b"2", 2);
        let mut bytes = segment_with(&[&[a, a], &[b]]);
        bytes[40 + 148 + 60] ^= 1; // inside the second copy of a
        let mut walk = SegmentEntries::new(&bytes, SegmentNumber(1), geometry());
        let found: Vec<_> = walk.by_ref().map(|item| item.entry).collect();
        assert_eq!(found, vec![a, b]);
        assert_eq!(walk.report().tears.len(), 1);
        assert_eq!(walk.report().tears[0].error, FormatError::ChecksumMismatch);
        // A prefix that ends inside an entry: truncated, never a panic.
        let mut walk = SegmentEntries::new(&bytes[..100], SegmentNumber(1), geometry());
        assert_eq!(walk.next(), None);
        assert_eq!(walk.report().tears[0].error, FormatError::Truncated);
    }
}
