//! The bytes of the flash log: the segment header and the two entry types. Restart rebuilds the
//! index from these bytes, so they are specified byte by byte in docs/design/flash-format.md;
//! change that document and these functions together. Everything is little-endian, checksums
//! are CRC32C (as in the memory log). Decoders return errors, never panic, on any input.

use crate::address::{FlashAddress, Geometry, SegmentNumber};
use crate::constants::{
    ENTRY_ALIGNMENT_BYTES, ENTRY_HEADER_BYTES, KEY_BYTES_MAX, SEGMENT_HEADER_BYTES,
};
use crate::error::FormatError;

/// The first four bytes of every segment.
pub const SEGMENT_MAGIC: [u8; 4] = *b"SFL1";

/// The segment format version this code writes and reads.
pub const SEGMENT_FORMAT_VERSION: u16 = 1;

/// Entry type code of padding: no entry starts here; the rest of the buffer slot is unused.
pub const ENTRY_TYPE_PADDING: u8 = 0;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A key-value object at a version.
    Object = 1,
    /// Marks one version of an object dead (a delete, or the version an overwrite replaced).
    Tombstone = 2,
}

impl EntryKind {
    fn from_code(code: u8) -> Result<EntryKind, FormatError> {
        match code {
            1 => Ok(EntryKind::Object),
            2 => Ok(EntryKind::Tombstone),
            other => Err(FormatError::InvalidEntryType(other)),
        }
    }
}

/// An entry, borrowing its key and value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryRef<'a> {
    /// Object or tombstone.
    pub kind: EntryKind,
    /// The table the key belongs to.
    pub table_id: u64,
    /// The key.
    pub key: &'a [u8],
    /// The value (empty for a tombstone).
    pub value: &'a [u8],
    /// The object's version; for a tombstone, the version it kills.
    pub version: u64,
    /// For a tombstone, the address of the object version it kills (the tombstone is needed
    /// while that address's segment exists); `FlashAddress(0)` for an object.
    pub dead_address: FlashAddress,
}

impl<'a> EntryRef<'a> {
    /// An object entry.
    pub fn object(table_id: u64, key: &'a [u8], value: &'a [u8], version: u64) -> EntryRef<'a> {
        EntryRef {
            kind: EntryKind::Object,
            table_id,
            key,
            value,
            version,
            dead_address: FlashAddress(0),
        }
    }

    /// A tombstone for the object version `version` stored at `dead_address`.
    pub fn tombstone(
        table_id: u64,
        key: &'a [u8],
        version: u64,
        dead_address: FlashAddress,
    ) -> EntryRef<'a> {
        EntryRef { kind: EntryKind::Tombstone, table_id, key, value: &[], version, dead_address }
    }

    /// Bytes the entry occupies in the log, padding included.
    pub fn encoded_bytes(&self) -> usize {
        padded(ENTRY_HEADER_BYTES + self.key.len() + self.value.len())
    }

    /// A copy that owns its key and value.
    pub fn to_owned_entry(&self) -> OwnedEntry {
        OwnedEntry {
            kind: self.kind,
            table_id: self.table_id,
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            version: self.version,
            dead_address: self.dead_address,
        }
    }

    /// Checks the rules of the format that the decoder checks on fields an `EntryRef` can get
    /// wrong: exactly tombstones carry a dead address, and tombstones carry no value.
    pub fn check(&self) -> Result<(), FormatError> {
        if self.kind == EntryKind::Tombstone && !self.value.is_empty() {
            return Err(FormatError::Malformed("tombstone with a value"));
        }
        if (self.kind == EntryKind::Object) != (self.dead_address.0 == 0) {
            return Err(FormatError::Malformed("dead address"));
        }
        Ok(())
    }

    /// Encodes the entry into `out`, which must be exactly `encoded_bytes()` long.
    pub fn encode_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.encoded_bytes(), "entry buffer of the wrong size");
        assert!(self.key.len() <= KEY_BYTES_MAX, "key length checked by the appender");
        assert!(self.kind == EntryKind::Object || self.value.is_empty(), "tombstone with a value");
        out[0] = self.kind as u8;
        out[1] = 0;
        out[2..4].copy_from_slice(&(self.key.len() as u16).to_le_bytes());
        out[4..8].copy_from_slice(&(self.value.len() as u32).to_le_bytes());
        out[8..16].copy_from_slice(&self.table_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.version.to_le_bytes());
        out[24..32].copy_from_slice(&self.dead_address.0.to_le_bytes());
        out[36..40].fill(0);
        let key_end = ENTRY_HEADER_BYTES + self.key.len();
        let value_end = key_end + self.value.len();
        out[ENTRY_HEADER_BYTES..key_end].copy_from_slice(self.key);
        out[key_end..value_end].copy_from_slice(self.value);
        out[value_end..].fill(0);
        let crc = entry_checksum(&out[..value_end]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
    }

    /// The entry encoded into a new vector.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.encoded_bytes()];
        self.encode_into(&mut out);
        out
    }
}

/// An entry that owns its key and value (what a read returns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedEntry {
    /// Object or tombstone.
    pub kind: EntryKind,
    /// The table the key belongs to.
    pub table_id: u64,
    /// The key.
    pub key: Vec<u8>,
    /// The value (empty for a tombstone).
    pub value: Vec<u8>,
    /// The object's version; for a tombstone, the version it kills.
    pub version: u64,
    /// For a tombstone, the address of the version it kills; 0 for an object.
    pub dead_address: FlashAddress,
}

impl OwnedEntry {
    /// The entry borrowed.
    pub fn as_entry_ref(&self) -> EntryRef<'_> {
        EntryRef {
            kind: self.kind,
            table_id: self.table_id,
            key: &self.key,
            value: &self.value,
            version: self.version,
            dead_address: self.dead_address,
        }
    }
}

/// `length` rounded up to the entry alignment.
pub fn padded(length: usize) -> usize {
    length.div_ceil(ENTRY_ALIGNMENT_BYTES) * ENTRY_ALIGNMENT_BYTES
}

/// CRC32C of an encoded entry (up to the end of its value, padding excluded), skipping the
/// checksum field itself (bytes 32..36).
fn entry_checksum(entry: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&entry[..32]);
    crc32c::crc32c_append(crc, &entry[36..])
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([bytes[offset], bytes[offset + 1]])
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(field)
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(field)
}

/// What lies at a position in a buffer slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// An entry that verified, and the bytes it occupies (padding included).
    Entry(EntryRef<'a>, usize),
    /// Padding: no more entries in this slot.
    Padding,
}

/// The padded size of the entry whose header starts `bytes`, from the header alone (a reader
/// learns how much more to fetch). Checks the fields the size depends on, not the checksum.
pub fn entry_bytes_from_header(bytes: &[u8]) -> Result<usize, FormatError> {
    if bytes.len() < ENTRY_HEADER_BYTES {
        return Err(FormatError::Truncated);
    }
    let kind = EntryKind::from_code(bytes[0])?;
    let key_bytes = usize::from(u16_at(bytes, 2));
    let value_bytes = u32_at(bytes, 4) as usize;
    if kind == EntryKind::Tombstone && value_bytes != 0 {
        return Err(FormatError::Malformed("tombstone with a value"));
    }
    Ok(padded(ENTRY_HEADER_BYTES + key_bytes + value_bytes))
}

/// Decodes and verifies what starts `bytes` (the rest of a buffer slot, or more).
pub fn decode_entry(bytes: &[u8]) -> Result<Decoded<'_>, FormatError> {
    match bytes.first() {
        None | Some(&ENTRY_TYPE_PADDING) => return Ok(Decoded::Padding),
        Some(_) => {}
    }
    let entry_bytes = entry_bytes_from_header(bytes)?;
    if bytes.len() < entry_bytes {
        return Err(FormatError::Truncated);
    }
    let key_bytes = usize::from(u16_at(bytes, 2));
    let value_bytes = u32_at(bytes, 4) as usize;
    let key_end = ENTRY_HEADER_BYTES + key_bytes;
    let value_end = key_end + value_bytes;
    if u32_at(bytes, 32) != entry_checksum(&bytes[..value_end]) {
        return Err(FormatError::ChecksumMismatch);
    }
    if bytes[1] != 0 {
        return Err(FormatError::Malformed("entry flags"));
    }
    if u32_at(bytes, 36) != 0 {
        return Err(FormatError::Malformed("entry reserved field"));
    }
    let kind = EntryKind::from_code(bytes[0])?;
    let dead_address = FlashAddress(u64_at(bytes, 24));
    if (kind == EntryKind::Object) != (dead_address.0 == 0) {
        return Err(FormatError::Malformed("dead address"));
    }
    let entry = EntryRef {
        kind,
        table_id: u64_at(bytes, 8),
        key: &bytes[ENTRY_HEADER_BYTES..key_end],
        value: &bytes[key_end..value_end],
        version: u64_at(bytes, 16),
        dead_address,
    };
    Ok(Decoded::Entry(entry, entry_bytes))
}

/// The header at the start of every segment: identifies the log, the segment and the geometry,
/// so restart recognises its own segments and refuses others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The log this segment belongs to.
    pub log_id: u64,
    /// The segment's number (its place in log order).
    pub segment: SegmentNumber,
    /// The geometry the segment was written with.
    pub geometry: Geometry,
}

impl SegmentHeader {
    /// Encodes the 40 bytes.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut bytes = [0u8; SEGMENT_HEADER_BYTES];
        bytes[0..4].copy_from_slice(&SEGMENT_MAGIC);
        bytes[4..6].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.log_id.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.segment.0.to_le_bytes());
        bytes[24..28].copy_from_slice(&(self.geometry.segment_bytes() as u32).to_le_bytes());
        bytes[28..32].copy_from_slice(&(self.geometry.buffer_bytes() as u32).to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..36]);
        bytes[36..40].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and verifies the header at the start of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, FormatError> {
        if bytes.len() < SEGMENT_HEADER_BYTES {
            return Err(FormatError::Truncated);
        }
        if u32_at(bytes, 36) != crc32c::crc32c(&bytes[..36]) {
            return Err(FormatError::ChecksumMismatch);
        }
        if bytes[0..4] != SEGMENT_MAGIC {
            return Err(FormatError::BadMagic);
        }
        let version = u16_at(bytes, 4);
        if version != SEGMENT_FORMAT_VERSION {
            return Err(FormatError::UnknownFormatVersion(version));
        }
        if u16_at(bytes, 6) != 0 || u32_at(bytes, 32) != 0 {
            return Err(FormatError::Malformed("segment header reserved field"));
        }
        let geometry = Geometry::new(u32_at(bytes, 24) as usize, u32_at(bytes, 28) as usize)
            .map_err(|_| FormatError::Malformed("segment geometry"))?;
        let segment = SegmentNumber(u64_at(bytes, 16));
        if segment.0 == 0 {
            return Err(FormatError::Malformed("segment number 0"));
        }
        Ok(SegmentHeader { log_id: u64_at(bytes, 8), segment, geometry })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_object_round_trips_and_is_padded_to_eight_bytes() {
        let entry = EntryRef::object(7, b"key", b"value!", 42);
        let bytes = entry.encode();
        assert_eq!(bytes.len(), 56, "40 + 3 + 6 = 49, padded to 56");
        assert_eq!(decode_entry(&bytes), Ok(Decoded::Entry(entry, 56)));
        assert_eq!(entry_bytes_from_header(&bytes), Ok(56));
    }

    #[test]
    fn a_tombstone_round_trips_with_its_dead_address() {
        let entry = EntryRef::tombstone(7, b"key", 41, FlashAddress(8 << 20));
        let bytes = entry.encode();
        assert_eq!(decode_entry(&bytes), Ok(Decoded::Entry(entry, 48)));
    }

    #[test]
    fn a_zero_type_byte_or_nothing_is_padding() {
        assert_eq!(decode_entry(&[]), Ok(Decoded::Padding));
        assert_eq!(decode_entry(&[0u8; 64]), Ok(Decoded::Padding));
    }

    #[test]
    fn every_flipped_bit_of_an_entry_is_detected() {
        let bytes = EntryRef::object(1, b"k", b"v", 3).encode();
        let content_bytes = ENTRY_HEADER_BYTES + 2;
        for bit in 8..content_bytes * 8 {
            let mut corrupt = bytes.clone();
            corrupt[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_entry(&corrupt).is_err(), "bit {bit} flipped went unnoticed");
        }
    }

    #[test]
    fn a_segment_header_round_trips_and_refuses_corruption() {
        let header = SegmentHeader {
            log_id: 99,
            segment: SegmentNumber(5),
            geometry: Geometry::new(64 << 10, 16 << 10).unwrap(),
        };
        let bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        for byte in 0..SEGMENT_HEADER_BYTES {
            let mut corrupt = bytes;
            corrupt[byte] ^= 0x10;
            assert!(SegmentHeader::decode(&corrupt).is_err(), "byte {byte}");
        }
        assert_eq!(SegmentHeader::decode(&bytes[..39]), Err(FormatError::Truncated));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_entry(&bytes);
            let _ = entry_bytes_from_header(&bytes);
            let _ = SegmentHeader::decode(&bytes);
        }

        #[test]
        fn any_entry_round_trips(
            table_id in any::<u64>(),
            key in proptest::collection::vec(any::<u8>(), 0..64),
            value in proptest::collection::vec(any::<u8>(), 0..300),
            version in any::<u64>(),
        ) {
            let entry = EntryRef::object(table_id, &key, &value, version);
            let mut bytes = entry.encode();
            let length = bytes.len();
            bytes.extend_from_slice(&[0xAB; 16]);
            prop_assert_eq!(decode_entry(&bytes), Ok(Decoded::Entry(entry, length)));
        }
    }
}

#[cfg(test)]
mod golden {
    //! The worked example of docs/design/flash-format.md: these bytes are the format.
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn worked_example_bytes_are_stable() {
        let header =
            SegmentHeader { log_id: 1, segment: SegmentNumber(2), geometry: Geometry::DEFAULT };
        assert_eq!(
            hex(&header.encode()),
            "53 46 4c 31 01 00 00 00 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 \
             00 00 80 00 00 00 10 00 00 00 00 00 24 60 2f d9"
        );
        assert_eq!(
            hex(&EntryRef::object(7, b"key", b"value!", 42).encode()),
            "01 00 03 00 06 00 00 00 07 00 00 00 00 00 00 00 2a 00 00 00 00 00 00 00 \
             00 00 00 00 00 00 00 00 7c f2 b3 98 00 00 00 00 6b 65 79 76 61 6c 75 65 \
             21 00 00 00 00 00 00 00"
        );
        let object_address = FlashAddress((2 << 23) + 40);
        assert_eq!(
            hex(&EntryRef::tombstone(7, b"key", 42, object_address).encode()),
            "02 00 03 00 00 00 00 00 07 00 00 00 00 00 00 00 2a 00 00 00 00 00 00 00 \
             28 00 00 01 00 00 00 00 7f d2 13 00 00 00 00 00 6b 65 79 00 00 00 00 00"
        );
    }
}
