//! The bytes of a backup's storage (docs/design/backup-format.md): the file header, the frame
//! geometry, and the metadata block that describes the replica in a frame. All integers are
//! little-endian; all checksums are CRC32C.

use stratus_types::{SegmentId, ServerId};
use stratus_wire::ReplicaCertificate;

/// Bytes reserved for the file header at offset 0 (one 4 KiB block, so frames stay aligned).
pub const FILE_HEADER_BLOCK_BYTES: u64 = 4096;
/// Bytes of one metadata slot; a frame starts with two of them.
pub const METADATA_SLOT_BYTES: u64 = 4096;
/// Metadata slots per frame (written alternately, so a torn write leaves the previous one).
pub const METADATA_SLOTS: u64 = 2;
/// Alignment of every frame and of every frame's data area.
pub const ALIGNMENT_BYTES: u64 = 4096;

/// Magic of the file header: "STRABKUP".
pub const FILE_MAGIC: [u8; 8] = *b"STRABKUP";
/// Version of the file layout.
pub const FILE_FORMAT_VERSION: u32 = 1;
/// Bytes of the encoded file header (the rest of its block is zero).
pub const FILE_HEADER_BYTES: usize = 28;

/// Magic of a metadata block: "SRPL".
pub const METADATA_MAGIC: [u8; 4] = *b"SRPL";
/// Version of the metadata block layout.
pub const METADATA_FORMAT_VERSION: u16 = 1;
/// Bytes of an encoded metadata block (the rest of its slot is zero).
pub const METADATA_BLOCK_BYTES: usize = 56;

const METADATA_CLOSED: u8 = 1 << 0;
const METADATA_PRIMARY: u8 = 1 << 1;
const METADATA_FLAGS_KNOWN: u8 = METADATA_CLOSED | METADATA_PRIMARY;

/// The geometry of a storage area: how many frames, and how many segment bytes each holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of segment data a frame holds (the replica capacity).
    pub segment_bytes: u32,
    /// Number of frames (the most replicas stored at once).
    pub frame_count: u32,
}

impl Geometry {
    /// Bytes of the data area of a frame: the segment bytes rounded up to the alignment.
    pub fn data_area_bytes(&self) -> u64 {
        u64::from(self.segment_bytes).div_ceil(ALIGNMENT_BYTES) * ALIGNMENT_BYTES
    }

    /// Bytes of one frame: the metadata slots, then the data area.
    pub fn frame_bytes(&self) -> u64 {
        METADATA_SLOTS * METADATA_SLOT_BYTES + self.data_area_bytes()
    }

    /// Bytes of the whole storage area.
    pub fn total_bytes(&self) -> u64 {
        FILE_HEADER_BLOCK_BYTES + u64::from(self.frame_count) * self.frame_bytes()
    }

    /// Offset of a frame's first byte.
    pub fn frame_offset(&self, frame: u32) -> u64 {
        FILE_HEADER_BLOCK_BYTES + u64::from(frame) * self.frame_bytes()
    }

    /// Offset of a frame's metadata slot (0 or 1).
    pub fn slot_offset(&self, frame: u32, slot: u8) -> u64 {
        self.frame_offset(frame) + u64::from(slot) * METADATA_SLOT_BYTES
    }

    /// Offset of a frame's first data byte.
    pub fn data_offset(&self, frame: u32) -> u64 {
        self.frame_offset(frame) + METADATA_SLOTS * METADATA_SLOT_BYTES
    }

    /// The file header for this geometry.
    pub fn encode_header(&self) -> [u8; FILE_HEADER_BYTES] {
        let mut bytes = [0u8; FILE_HEADER_BYTES];
        bytes[0..8].copy_from_slice(&FILE_MAGIC);
        bytes[8..12].copy_from_slice(&FILE_FORMAT_VERSION.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.segment_bytes.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.frame_count.to_le_bytes());
        // 20..24 reserved, zero.
        let checksum = crc32c::crc32c(&bytes[0..24]);
        bytes[24..28].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Parses a file header. `Ok(None)` for an all-zero header (a new, never-used file).
    pub fn decode_header(bytes: &[u8]) -> Result<Option<Geometry>, String> {
        let bytes = bytes.get(..FILE_HEADER_BYTES).ok_or("file header is truncated")?;
        if bytes.iter().all(|&byte| byte == 0) {
            return Ok(None);
        }
        if bytes[0..8] != FILE_MAGIC {
            return Err("not a Stratus backup file (bad magic)".to_string());
        }
        if crc32c::crc32c(&bytes[0..24]) != read_u32(bytes, 24) {
            return Err("backup file header fails its checksum".to_string());
        }
        let version = read_u32(bytes, 8);
        if version != FILE_FORMAT_VERSION {
            return Err(format!("backup file format version {version} is not supported"));
        }
        if read_u32(bytes, 20) != 0 {
            return Err("backup file header has non-zero reserved bytes".to_string());
        }
        Ok(Some(Geometry { segment_bytes: read_u32(bytes, 12), frame_count: read_u32(bytes, 16) }))
    }
}

/// What a frame's metadata block says about the replica in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaMetadata {
    /// Write generation within the frame: the newer of two valid slots is tried first.
    pub sequence: u64,
    /// The master whose segment this is.
    pub master_id: ServerId,
    /// The segment.
    pub segment_id: SegmentId,
    /// Replica epoch.
    pub epoch: u64,
    /// The certificate of the bytes in the frame's data area.
    pub certificate: ReplicaCertificate,
    /// The segment is complete.
    pub closed: bool,
    /// The primary replica.
    pub primary: bool,
}

impl ReplicaMetadata {
    /// The 56-byte block.
    pub fn encode(&self) -> [u8; METADATA_BLOCK_BYTES] {
        let mut bytes = [0u8; METADATA_BLOCK_BYTES];
        bytes[0..4].copy_from_slice(&METADATA_MAGIC);
        bytes[4..6].copy_from_slice(&METADATA_FORMAT_VERSION.to_le_bytes());
        let mut flags = 0u8;
        if self.closed {
            flags |= METADATA_CLOSED;
        }
        if self.primary {
            flags |= METADATA_PRIMARY;
        }
        bytes[6] = flags;
        // 7 reserved, zero.
        bytes[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.master_id.0.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.segment_id.0.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.epoch.to_le_bytes());
        bytes[40..44].copy_from_slice(&self.certificate.segment_length.to_le_bytes());
        bytes[44..48].copy_from_slice(&self.certificate.checksum.to_le_bytes());
        // 48..52 reserved, zero.
        let checksum = crc32c::crc32c(&bytes[0..52]);
        bytes[52..56].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Parses a metadata block. `Ok(None)` for an all-zero block (never written, or cleared
    /// when its replica was freed).
    pub fn decode(bytes: &[u8]) -> Result<Option<ReplicaMetadata>, String> {
        let bytes = bytes.get(..METADATA_BLOCK_BYTES).ok_or("metadata block is truncated")?;
        if bytes.iter().all(|&byte| byte == 0) {
            return Ok(None);
        }
        if bytes[0..4] != METADATA_MAGIC {
            return Err("bad metadata magic".to_string());
        }
        if crc32c::crc32c(&bytes[0..52]) != read_u32(bytes, 52) {
            return Err("metadata block fails its checksum (torn or corrupt)".to_string());
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != METADATA_FORMAT_VERSION {
            return Err(format!("metadata format version {version} is not supported"));
        }
        let flags = bytes[6];
        if flags & !METADATA_FLAGS_KNOWN != 0 || bytes[7] != 0 || read_u32(bytes, 48) != 0 {
            return Err("metadata block has unknown flags or non-zero reserved bytes".to_string());
        }
        Ok(Some(ReplicaMetadata {
            sequence: read_u64(bytes, 8),
            master_id: ServerId(read_u64(bytes, 16)),
            segment_id: SegmentId(read_u64(bytes, 24)),
            epoch: read_u64(bytes, 32),
            certificate: ReplicaCertificate {
                segment_length: read_u32(bytes, 40),
                checksum: read_u32(bytes, 44),
            },
            closed: flags & METADATA_CLOSED != 0,
            primary: flags & METADATA_PRIMARY != 0,
        }))
    }
}

/// Reads a little-endian u32 at `offset` (zero if out of range; callers checked the length).
fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    if let Some(source) = bytes.get(offset..offset + 4) {
        word.copy_from_slice(source);
    }
    u32::from_le_bytes(word)
}

/// Reads a little-endian u64 at `offset` (zero if out of range; callers checked the length).
fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    if let Some(source) = bytes.get(offset..offset + 8) {
        word.copy_from_slice(source);
    }
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata() -> ReplicaMetadata {
        ReplicaMetadata {
            sequence: 7,
            master_id: ServerId(2),
            segment_id: SegmentId(3),
            epoch: 1,
            certificate: ReplicaCertificate { segment_length: 109, checksum: 0xe582_93f4 },
            closed: true,
            primary: false,
        }
    }

    #[test]
    fn metadata_round_trips_and_detects_every_flipped_bit() {
        let encoded = metadata().encode();
        assert_eq!(ReplicaMetadata::decode(&encoded), Ok(Some(metadata())));
        for bit in 0..METADATA_BLOCK_BYTES * 8 {
            let mut corrupt = encoded;
            corrupt[bit / 8] ^= 1 << (bit % 8);
            assert!(ReplicaMetadata::decode(&corrupt).is_err(), "bit {bit} flip undetected");
        }
        assert_eq!(ReplicaMetadata::decode(&[0u8; METADATA_BLOCK_BYTES]), Ok(None));
        assert!(ReplicaMetadata::decode(&encoded[..10]).is_err());
    }

    #[test]
    fn header_round_trips_and_refuses_corruption() {
        let geometry = Geometry { segment_bytes: 1 << 20, frame_count: 5 };
        let encoded = geometry.encode_header();
        assert_eq!(Geometry::decode_header(&encoded), Ok(Some(geometry)));
        assert_eq!(Geometry::decode_header(&[0u8; FILE_HEADER_BYTES]), Ok(None));
        let mut corrupt = encoded;
        corrupt[13] ^= 1;
        assert!(Geometry::decode_header(&corrupt).is_err());
        let mut foreign = encoded;
        foreign[0] = b'X';
        assert!(Geometry::decode_header(&foreign).is_err());
    }

    #[test]
    fn frames_are_aligned() {
        let geometry = Geometry { segment_bytes: 1_000_000, frame_count: 3 };
        assert_eq!(geometry.data_area_bytes(), 1_003_520);
        for frame in 0..3 {
            assert_eq!(geometry.frame_offset(frame) % ALIGNMENT_BYTES, 0);
            assert_eq!(geometry.data_offset(frame) % ALIGNMENT_BYTES, 0);
            assert_eq!(geometry.slot_offset(frame, 1), geometry.frame_offset(frame) + 4096);
        }
        assert_eq!(geometry.total_bytes(), 4096 + 3 * (8192 + 1_003_520));
    }
}
