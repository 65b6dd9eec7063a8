//! The byte formats of the log: entry headers, the ten entry types and segment certificates.
//! Replicas and recovery depend on these bytes, so they are specified byte by byte in
//! docs/design/log-format.md; change that document and these functions together. Everything is
//! little-endian. Decoders return errors (never panic) on any input.

use stratus_types::{ExpiresAt, SegmentId, ServerId, TableId, TxOpKind, Version};

/// The type of a log entry (low 6 bits of the first header byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryType {
    /// First entry of every segment: identifies the log and the segment.
    SegmentHeader = 1,
    /// A key-value object.
    Object = 2,
    /// Marks one version of an object as dead.
    Tombstone = 3,
    /// The ids of every segment in the log when the segment holding it became head.
    LogDigest = 4,
    /// The master's version high-water mark when the segment became head.
    SafeVersion = 5,
    /// Live bytes and objects per table when the segment became head (recovery sizes its
    /// partitions with them).
    TableStats = 6,
    /// The result of a mutation that took effect, kept until its client acknowledges it, so a
    /// retry gets it instead of applying the mutation again (docs/design/exactly-once.md).
    Completion = 7,
    /// A transaction's operation on one object, prepared (locked at the version read) and
    /// awaiting the decision (docs/design/transactions.md).
    Prepared = 8,
    /// Marks a PREPARED entry decided: the lock it took is released.
    PreparedTombstone = 9,
    /// Every operation of a transaction with operations prepared in this log, so this master
    /// can finish the transaction if its client dies.
    TxParticipants = 10,
    /// An object of a flash-tier table whose value lives in its segment's image on the
    /// master's flash (docs/design/flash-tier.md): the OBJECT's prefix and key, then where the
    /// whole OBJECT entry sits in the image. Only ever in a master's memory: compaction writes
    /// it in place of the object, and it is never replicated, never on a backup, never in
    /// recovery data (decoders of replicas refuse it).
    FlashObject = 11,
}

/// Number of slots in per-type arrays (index = the type's code; slot 0 is the invalid type).
pub const ENTRY_TYPE_SLOTS: usize = 12;

impl EntryType {
    /// Every valid type, in code order.
    pub const ALL: [EntryType; 11] = [
        EntryType::SegmentHeader,
        EntryType::Object,
        EntryType::Tombstone,
        EntryType::LogDigest,
        EntryType::SafeVersion,
        EntryType::TableStats,
        EntryType::Completion,
        EntryType::Prepared,
        EntryType::PreparedTombstone,
        EntryType::TxParticipants,
        EntryType::FlashObject,
    ];

    /// The 6-bit code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The type with this code; `None` for 0 (invalid) and the reserved codes 12..63.
    pub fn from_code(code: u8) -> Option<EntryType> {
        EntryType::ALL.into_iter().find(|entry_type| entry_type.code() == code)
    }
}

/// Why bytes could not be decoded or did not verify.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FormatError {
    /// The bytes end before the structure does.
    Truncated,
    /// The type code is 0 or reserved.
    InvalidEntryType(u8),
    /// The entry header's length field is wider than needed (encodings are canonical).
    NonMinimalLength,
    /// A checksum stored in an entry does not match its bytes.
    ChecksumMismatch(EntryType),
    /// A field holds a value the format does not allow.
    Malformed(&'static str),
    /// The certificate does not describe the segment: its checksum does not match the entry
    /// headers, or the headers do not parse, or the entries do not end exactly at its length.
    CertificateMismatch,
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{self:?}")
    }
}

impl std::error::Error for FormatError {}

/// Largest entry header: 1 type byte + 4 length bytes.
pub const ENTRY_HEADER_BYTES_MAX: usize = 5;

/// Largest entry content the 4-byte length field can describe.
pub const ENTRY_CONTENT_BYTES_MAX: u32 = u32::MAX;

/// CRC32C of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of the concatenation of `pieces`.
pub fn checksum_of_pieces(pieces: &[&[u8]]) -> u32 {
    pieces.iter().fold(0, |crc, piece| crc32c::crc32c_append(crc, piece))
}

/// Minimal number of bytes (1..=8) holding `value` little-endian; 0 takes one byte.
fn width_of(value: u64) -> usize {
    (8 - (value.leading_zeros() as usize) / 8).max(1)
}

/// Reads a little-endian unsigned integer of `width` bytes at `*position`, advancing it.
fn read_uint(bytes: &[u8], position: &mut usize, width: usize) -> Result<u64, FormatError> {
    let end = position.checked_add(width).ok_or(FormatError::Truncated)?;
    let field = bytes.get(*position..end).ok_or(FormatError::Truncated)?;
    *position = end;
    Ok(field.iter().rev().fold(0u64, |value, &byte| (value << 8) | u64::from(byte)))
}

fn read_u32(bytes: &[u8], position: &mut usize) -> Result<u32, FormatError> {
    read_uint(bytes, position, 4).map(|value| value as u32)
}

fn push_uint(buffer: &mut [u8], length: &mut usize, value: u64, width: usize) {
    buffer[*length..*length + width].copy_from_slice(&value.to_le_bytes()[..width]);
    *length += width;
}

// ---------------------------------------------------------------------------------------------
// Entry header
// ---------------------------------------------------------------------------------------------

/// An encoded entry header (2..=5 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryHeader {
    bytes: [u8; ENTRY_HEADER_BYTES_MAX],
    length: u8,
}

impl EntryHeader {
    /// The header of an entry of `entry_type` whose content is `content_bytes` long, with the
    /// minimal length width.
    pub fn new(entry_type: EntryType, content_bytes: u32) -> EntryHeader {
        let length_bytes = width_of(u64::from(content_bytes));
        debug_assert!((1..=4).contains(&length_bytes));
        let mut bytes = [0u8; ENTRY_HEADER_BYTES_MAX];
        bytes[0] = entry_type.code() | (((length_bytes - 1) as u8) << 6);
        bytes[1..1 + length_bytes].copy_from_slice(&content_bytes.to_le_bytes()[..length_bytes]);
        EntryHeader { bytes, length: 1 + length_bytes as u8 }
    }

    /// The header's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.length as usize]
    }

    /// Bytes the header occupies.
    pub fn header_bytes(&self) -> usize {
        self.length as usize
    }
}

/// Bytes of the header of an entry whose first byte is `first_byte` (2..=5).
pub fn entry_header_bytes_from_first_byte(first_byte: u8) -> usize {
    2 + (first_byte >> 6) as usize
}

/// A decoded entry header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodedHeader {
    /// The entry's type.
    pub entry_type: EntryType,
    /// Bytes of the header itself.
    pub header_bytes: usize,
    /// Bytes of the content that follows.
    pub content_bytes: u32,
}

/// Decodes the entry header at the start of `bytes`.
pub fn decode_entry_header(bytes: &[u8]) -> Result<DecodedHeader, FormatError> {
    let first = *bytes.first().ok_or(FormatError::Truncated)?;
    let entry_type =
        EntryType::from_code(first & 0x3F).ok_or(FormatError::InvalidEntryType(first & 0x3F))?;
    let header_bytes = entry_header_bytes_from_first_byte(first);
    let mut position = 1;
    let content_bytes = read_uint(bytes, &mut position, header_bytes - 1)? as u32;
    if width_of(u64::from(content_bytes)) != header_bytes - 1 {
        return Err(FormatError::NonMinimalLength);
    }
    Ok(DecodedHeader { entry_type, header_bytes, content_bytes })
}

// ---------------------------------------------------------------------------------------------
// Object
// ---------------------------------------------------------------------------------------------

/// Fixed part of an object before its variable fields: checksum, timestamp, widths.
const OBJECT_FIXED_BYTES: usize = 9;
/// Bytes of an object's expiry time, when it has one.
const OBJECT_EXPIRY_BYTES: usize = 8;
/// Largest object prefix: fixed part + 8-byte table id + 8-byte version + expiry + 2-byte key
/// length.
const OBJECT_PREFIX_BYTES_MAX: usize = OBJECT_FIXED_BYTES + 8 + 8 + OBJECT_EXPIRY_BYTES + 2;
/// The widths bit that says an expiry time follows the version.
const OBJECT_HAS_EXPIRY: usize = 0x80;

/// The encoded part of an object's content that precedes its key (checksum included). The key
/// and value follow it unchanged, so large values are copied into the log only once.
#[derive(Clone, Copy, Debug)]
pub struct ObjectPrefix {
    bytes: [u8; OBJECT_PREFIX_BYTES_MAX],
    length: u8,
}

impl ObjectPrefix {
    /// Encodes the prefix of an object and computes its checksum over prefix, key and value.
    /// `key` must be 1..=65535 bytes (checked by the caller; asserted here).
    pub fn new(
        table: TableId,
        version: Version,
        timestamp: u32,
        expires_at: Option<ExpiresAt>,
        key: &[u8],
        value: &[u8],
    ) -> ObjectPrefix {
        assert!(!key.is_empty() && key.len() <= usize::from(u16::MAX), "invalid key length");
        let table_bytes = width_of(table.0);
        let version_bytes = width_of(version.0);
        let key_length_bytes = width_of(key.len() as u64);
        let mut bytes = [0u8; OBJECT_PREFIX_BYTES_MAX];
        let mut length = 4;
        push_uint(&mut bytes, &mut length, u64::from(timestamp), 4);
        let mut widths =
            (table_bytes - 1) | ((version_bytes - 1) << 3) | ((key_length_bytes - 1) << 6);
        if expires_at.is_some() {
            widths |= OBJECT_HAS_EXPIRY;
        }
        push_uint(&mut bytes, &mut length, widths as u64, 1);
        push_uint(&mut bytes, &mut length, table.0, table_bytes);
        push_uint(&mut bytes, &mut length, version.0, version_bytes);
        if let Some(ExpiresAt(millis)) = expires_at {
            push_uint(&mut bytes, &mut length, millis, OBJECT_EXPIRY_BYTES);
        }
        push_uint(&mut bytes, &mut length, key.len() as u64, key_length_bytes);
        let crc = checksum_of_pieces(&[&bytes[4..length], key, value]);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
        ObjectPrefix { bytes, length: length as u8 }
    }

    /// The prefix bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.length as usize]
    }
}

/// Encodes a whole object content (prefix + key + value) into a new vector.
pub fn encode_object(
    table: TableId,
    version: Version,
    timestamp: u32,
    expires_at: Option<ExpiresAt>,
    key: &[u8],
    value: &[u8],
) -> Vec<u8> {
    let prefix = ObjectPrefix::new(table, version, timestamp, expires_at, key, value);
    [prefix.as_bytes(), key, value].concat()
}

/// A decoded object, borrowing its key and value from the content bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectView<'a> {
    /// The table.
    pub table: TableId,
    /// The object's version.
    pub version: Version,
    /// Wall-clock seconds when it was written.
    pub timestamp: u32,
    /// When it expires, if it does.
    pub expires_at: Option<ExpiresAt>,
    /// The key (1..=65535 bytes).
    pub key: &'a [u8],
    /// The value.
    pub value: &'a [u8],
}

/// Decodes an object's fields without verifying its checksum (the read fast path; the bytes
/// were verified when written and live in memory that is never rewritten).
pub fn decode_object_unverified(content: &[u8]) -> Result<ObjectView<'_>, FormatError> {
    let mut position = 4;
    let timestamp = read_u32(content, &mut position)?;
    let widths = read_uint(content, &mut position, 1)? as usize;
    let table = read_uint(content, &mut position, (widths & 7) + 1)?;
    let version = read_uint(content, &mut position, ((widths >> 3) & 7) + 1)?;
    let expires_at = if widths & OBJECT_HAS_EXPIRY != 0 {
        Some(ExpiresAt(read_uint(content, &mut position, OBJECT_EXPIRY_BYTES)?))
    } else {
        None
    };
    let key_length = read_uint(content, &mut position, ((widths >> 6) & 1) + 1)? as usize;
    if key_length == 0 {
        return Err(FormatError::Malformed("empty object key"));
    }
    let key_end = position.checked_add(key_length).ok_or(FormatError::Truncated)?;
    let key = content.get(position..key_end).ok_or(FormatError::Truncated)?;
    Ok(ObjectView {
        table: TableId(table),
        version: Version(version),
        timestamp,
        expires_at,
        key,
        value: &content[key_end..],
    })
}

/// The expiry of the object whose content starts with `prefix` (at least the bytes up to its
/// expiry field: an [`ObjectPrefix`], or the whole content). `None` for an object without
/// expiry, and for bytes too short or malformed to tell (the log's accounting then counts the
/// object as one that never expires, which only makes the cleaner more conservative).
pub fn object_expiry(prefix: &[u8]) -> Option<ExpiresAt> {
    let widths = usize::from(*prefix.get(OBJECT_FIXED_BYTES - 1)?);
    if widths & OBJECT_HAS_EXPIRY == 0 {
        return None;
    }
    let mut position = OBJECT_FIXED_BYTES + (widths & 7) + 1 + ((widths >> 3) & 7) + 1;
    read_uint(prefix, &mut position, OBJECT_EXPIRY_BYTES).ok().map(ExpiresAt)
}

/// Decodes an object and verifies its checksum.
pub fn decode_object(content: &[u8]) -> Result<ObjectView<'_>, FormatError> {
    let view = decode_object_unverified(content)?;
    verify_leading_checksum(content, EntryType::Object)?;
    Ok(view)
}

/// Checks the u32 checksum at [0..4) against CRC32C of [4..end).
fn verify_leading_checksum(content: &[u8], entry_type: EntryType) -> Result<(), FormatError> {
    let mut position = 0;
    let stored = read_u32(content, &mut position)?;
    if stored != checksum(&content[4..]) {
        return Err(FormatError::ChecksumMismatch(entry_type));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tombstone
// ---------------------------------------------------------------------------------------------

/// A decoded tombstone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TombstoneView<'a> {
    /// The dead object's table.
    pub table: TableId,
    /// The segment that held the dead object (the tombstone is needed while it exists).
    pub segment_id: SegmentId,
    /// The dead object's version.
    pub object_version: Version,
    /// Wall-clock seconds when the tombstone was written.
    pub timestamp: u32,
    /// The dead object's key.
    pub key: &'a [u8],
}

/// Largest tombstone fields before the key: checksum, timestamp, widths, segment width, table
/// id, version, segment id.
const TOMBSTONE_PREFIX_BYTES_MAX: usize = 4 + 4 + 1 + 1 + 8 + 8 + 8;

/// The fields of a tombstone before its key, checksum included: appended as the first piece of
/// the entry with the key as the second, so removes and overwrites build their tombstone on the
/// stack (no allocation on the request path).
#[derive(Clone, Copy, Debug)]
pub struct TombstonePrefix {
    bytes: [u8; TOMBSTONE_PREFIX_BYTES_MAX],
    length: u8,
}

impl TombstonePrefix {
    /// Encodes the prefix of `tombstone` and computes its checksum over prefix and key. The key
    /// must be 1..=65535 bytes (checked by the caller; asserted here).
    pub fn new(tombstone: &TombstoneView<'_>) -> TombstonePrefix {
        assert!(
            !tombstone.key.is_empty() && tombstone.key.len() <= usize::from(u16::MAX),
            "invalid key length"
        );
        let table_bytes = width_of(tombstone.table.0);
        let version_bytes = width_of(tombstone.object_version.0);
        let segment_bytes = width_of(tombstone.segment_id.0);
        let mut bytes = [0u8; TOMBSTONE_PREFIX_BYTES_MAX];
        let mut length = 4;
        push_uint(&mut bytes, &mut length, u64::from(tombstone.timestamp), 4);
        let widths = (table_bytes - 1) | ((version_bytes - 1) << 3);
        push_uint(&mut bytes, &mut length, widths as u64, 1);
        push_uint(&mut bytes, &mut length, (segment_bytes - 1) as u64, 1);
        push_uint(&mut bytes, &mut length, tombstone.table.0, table_bytes);
        push_uint(&mut bytes, &mut length, tombstone.object_version.0, version_bytes);
        push_uint(&mut bytes, &mut length, tombstone.segment_id.0, segment_bytes);
        let crc = checksum_of_pieces(&[&bytes[4..length], tombstone.key]);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
        TombstonePrefix { bytes, length: length as u8 }
    }

    /// The prefix bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.length as usize]
    }
}

/// Encodes a tombstone's whole content (prefix + key) into a new vector.
pub fn encode_tombstone(tombstone: &TombstoneView<'_>) -> Vec<u8> {
    [TombstonePrefix::new(tombstone).as_bytes(), tombstone.key].concat()
}

/// The segment a tombstone names, read from the start of its content (its prefix is enough;
/// the checksum is not verified).
pub fn tombstone_segment_id(content_start: &[u8]) -> Result<SegmentId, FormatError> {
    let mut position = 8;
    let widths = read_uint(content_start, &mut position, 1)? as usize;
    let segment_widths = read_uint(content_start, &mut position, 1)? as usize;
    if widths & 0xC0 != 0 || segment_widths & !7 != 0 {
        return Err(FormatError::Malformed("tombstone width reserved bits set"));
    }
    position += (widths & 7) + 1 + ((widths >> 3) & 7) + 1;
    read_uint(content_start, &mut position, segment_widths + 1).map(SegmentId)
}

/// The segment a tombstone-like entry names — an object's TOMBSTONE or a PREPARED_TOMBSTONE,
/// each needed exactly while that segment is in the log — read from the start of its content
/// (its first piece as appended); `None` for other types and malformed bytes.
pub fn segment_named_by(entry_type: EntryType, content_start: &[u8]) -> Option<SegmentId> {
    match entry_type {
        EntryType::Tombstone => tombstone_segment_id(content_start).ok(),
        EntryType::PreparedTombstone => {
            let mut position = PREPARED_TOMBSTONE_CONTENT_BYTES - 8;
            read_uint(content_start, &mut position, 8).ok().map(SegmentId)
        }
        _ => None,
    }
}

/// Decodes a tombstone and verifies its checksum.
pub fn decode_tombstone(content: &[u8]) -> Result<TombstoneView<'_>, FormatError> {
    let mut position = 4;
    let timestamp = read_u32(content, &mut position)?;
    let widths = read_uint(content, &mut position, 1)? as usize;
    let segment_widths = read_uint(content, &mut position, 1)? as usize;
    if widths & 0xC0 != 0 || segment_widths & !7 != 0 {
        return Err(FormatError::Malformed("tombstone width reserved bits set"));
    }
    let table = read_uint(content, &mut position, (widths & 7) + 1)?;
    let object_version = read_uint(content, &mut position, ((widths >> 3) & 7) + 1)?;
    let segment_id = read_uint(content, &mut position, segment_widths + 1)?;
    let key = &content[position..];
    if key.is_empty() {
        return Err(FormatError::Malformed("empty tombstone key"));
    }
    verify_leading_checksum(content, EntryType::Tombstone)?;
    Ok(TombstoneView {
        table: TableId(table),
        segment_id: SegmentId(segment_id),
        object_version: Version(object_version),
        timestamp,
        key,
    })
}

// ---------------------------------------------------------------------------------------------
// Segment header, log digest, safe version
// ---------------------------------------------------------------------------------------------

/// Magic bytes at the start of every segment header.
pub const SEGMENT_MAGIC: [u8; 4] = *b"SGMT";
/// The segment format version this code writes. Version 2 added TABLE_STATS to every head;
/// version 3 lets an object carry an expiry time (widths bit 7, which older versions refuse);
/// version 4 adds COMPLETION entries (type 7: exactly-once results); version 5 adds
/// PREPARED, PREPARED_TOMBSTONE and TX_PARTICIPANTS entries (types 8 to 10: transactions). Older segments are still read, so a cluster upgraded in place recovers logs written before
/// it. A binary that knows only older versions refuses newer segments by their header, with a
/// clear error, rather than at an unknown entry type or a bit it does not know.
pub const SEGMENT_FORMAT_VERSION: u16 = 5;
/// Every segment format version this code reads.
pub const SEGMENT_FORMAT_VERSIONS_READ: [u16; 5] = [1, 2, 3, 4, 5];
/// Bytes of a segment header's content.
pub const SEGMENT_HEADER_CONTENT_BYTES: usize = 32;

/// A decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The log's owner (the master's server id).
    pub log_id: ServerId,
    /// The segment's id.
    pub segment_id: SegmentId,
    /// The segment's capacity in bytes (the full segment size, not the used length).
    pub capacity_bytes: u32,
}

impl SegmentHeader {
    /// Encodes the 32-byte content.
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_CONTENT_BYTES] {
        let mut bytes = [0u8; SEGMENT_HEADER_CONTENT_BYTES];
        bytes[0..4].copy_from_slice(&SEGMENT_MAGIC);
        bytes[4..6].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.log_id.0.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.segment_id.0.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        let crc = checksum(&bytes[0..28]);
        bytes[28..32].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// Decodes and verifies the content.
    pub fn decode(content: &[u8]) -> Result<SegmentHeader, FormatError> {
        if content.len() != SEGMENT_HEADER_CONTENT_BYTES {
            return Err(FormatError::Malformed("segment header length"));
        }
        let mut position = 28;
        if read_u32(content, &mut position)? != checksum(&content[0..28]) {
            return Err(FormatError::ChecksumMismatch(EntryType::SegmentHeader));
        }
        if content[0..4] != SEGMENT_MAGIC {
            return Err(FormatError::Malformed("segment magic"));
        }
        let mut position = 4;
        let version = read_uint(content, &mut position, 2)?;
        if !SEGMENT_FORMAT_VERSIONS_READ.iter().any(|&known| u64::from(known) == version) {
            return Err(FormatError::Malformed("segment format version"));
        }
        if read_uint(content, &mut position, 2)? != 0 {
            return Err(FormatError::Malformed("segment header reserved field"));
        }
        let log_id = ServerId(read_uint(content, &mut position, 8)?);
        let segment_id = SegmentId(read_uint(content, &mut position, 8)?);
        let capacity_bytes = read_u32(content, &mut position)?;
        Ok(SegmentHeader { log_id, segment_id, capacity_bytes })
    }
}

/// Bytes of a log digest's content listing `segment_count` segments.
pub fn log_digest_content_bytes(segment_count: usize) -> usize {
    8 + 8 * segment_count
}

/// Encodes a log digest listing `segment_ids`.
pub fn encode_log_digest(segment_ids: &[SegmentId]) -> Vec<u8> {
    let count = u32::try_from(segment_ids.len()).expect("digest lists more than 2^32 segments");
    let mut content = Vec::with_capacity(log_digest_content_bytes(segment_ids.len()));
    content.extend_from_slice(&[0; 4]);
    content.extend_from_slice(&count.to_le_bytes());
    for id in segment_ids {
        content.extend_from_slice(&id.0.to_le_bytes());
    }
    let crc = checksum(&content[4..]);
    content[..4].copy_from_slice(&crc.to_le_bytes());
    content
}

/// Decodes and verifies a log digest.
pub fn decode_log_digest(content: &[u8]) -> Result<Vec<SegmentId>, FormatError> {
    let mut position = 4;
    let count = read_u32(content, &mut position)? as usize;
    if content.len() != log_digest_content_bytes(0) + count.saturating_mul(8) {
        return Err(FormatError::Malformed("log digest length"));
    }
    verify_leading_checksum(content, EntryType::LogDigest)?;
    (0..count).map(|_| read_uint(content, &mut position, 8).map(SegmentId)).collect()
}

/// Bytes of a safe-version entry's content.
pub const SAFE_VERSION_CONTENT_BYTES: usize = 12;

/// Encodes a safe-version entry.
pub fn encode_safe_version(version: Version) -> [u8; SAFE_VERSION_CONTENT_BYTES] {
    let mut bytes = [0u8; SAFE_VERSION_CONTENT_BYTES];
    bytes[4..12].copy_from_slice(&version.0.to_le_bytes());
    let crc = checksum(&bytes[4..12]);
    bytes[..4].copy_from_slice(&crc.to_le_bytes());
    bytes
}

/// Decodes and verifies a safe-version entry.
pub fn decode_safe_version(content: &[u8]) -> Result<Version, FormatError> {
    if content.len() != SAFE_VERSION_CONTENT_BYTES {
        return Err(FormatError::Malformed("safe version length"));
    }
    verify_leading_checksum(content, EntryType::SafeVersion)?;
    let mut position = 4;
    Ok(Version(read_uint(content, &mut position, 8)?))
}

/// Tables a TABLE_STATS entry lists one by one: the largest by live bytes; the others are
/// summed into one remainder. Bounds the entry (24 + 24 · 128 = 3 096 bytes) so that it fits
/// beside the digest in every head, however many tables a master holds.
pub const TABLE_STATS_TABLES_MAX: usize = 128;

/// Bytes of a TABLE_STATS entry's content listing `table_count` tables.
pub fn table_stats_content_bytes(table_count: usize) -> usize {
    24 + 24 * table_count
}

/// The live data of one table on a master.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableTally {
    /// Bytes of the table's live objects (whole entries, headers included).
    pub bytes: u64,
    /// Live objects.
    pub objects: u64,
}

/// What a TABLE_STATS entry says: live data per table when the head opened. `tables` is sorted
/// by table id, each at most once; `others` sums the tables not listed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Tables listed one by one (at most [`TABLE_STATS_TABLES_MAX`]), ascending by id.
    pub tables: Vec<(TableId, TableTally)>,
    /// The tables not listed, summed.
    pub others: TableTally,
}

/// Encodes a TABLE_STATS entry. Panics if `statistics.tables` is longer than
/// [`TABLE_STATS_TABLES_MAX`] or not strictly ascending by table id (the log builds it so).
pub fn encode_table_stats(statistics: &TableStats) -> Vec<u8> {
    assert!(statistics.tables.len() <= TABLE_STATS_TABLES_MAX, "too many tables listed");
    assert!(
        statistics.tables.windows(2).all(|pair| pair[0].0 < pair[1].0),
        "table stats must list tables once each, ascending"
    );
    let count = statistics.tables.len() as u32;
    let mut content = Vec::with_capacity(table_stats_content_bytes(statistics.tables.len()));
    content.extend_from_slice(&[0; 4]);
    content.extend_from_slice(&count.to_le_bytes());
    content.extend_from_slice(&statistics.others.bytes.to_le_bytes());
    content.extend_from_slice(&statistics.others.objects.to_le_bytes());
    for (table, tally) in &statistics.tables {
        content.extend_from_slice(&table.0.to_le_bytes());
        content.extend_from_slice(&tally.bytes.to_le_bytes());
        content.extend_from_slice(&tally.objects.to_le_bytes());
    }
    let crc = checksum(&content[4..]);
    content[..4].copy_from_slice(&crc.to_le_bytes());
    content
}

/// Decodes and verifies a TABLE_STATS entry.
pub fn decode_table_stats(content: &[u8]) -> Result<TableStats, FormatError> {
    let mut position = 4;
    let count = read_u32(content, &mut position)? as usize;
    if count > TABLE_STATS_TABLES_MAX {
        return Err(FormatError::Malformed("table stats list too many tables"));
    }
    if content.len() != table_stats_content_bytes(count) {
        return Err(FormatError::Malformed("table stats length"));
    }
    verify_leading_checksum(content, EntryType::TableStats)?;
    let others = TableTally {
        bytes: read_uint(content, &mut position, 8)?,
        objects: read_uint(content, &mut position, 8)?,
    };
    let mut tables: Vec<(TableId, TableTally)> = Vec::with_capacity(count);
    for _ in 0..count {
        let table = TableId(read_uint(content, &mut position, 8)?);
        let tally = TableTally {
            bytes: read_uint(content, &mut position, 8)?,
            objects: read_uint(content, &mut position, 8)?,
        };
        if tables.last().is_some_and(|(previous, _)| *previous >= table) {
            return Err(FormatError::Malformed("table stats not ascending by table id"));
        }
        tables.push((table, tally));
    }
    Ok(TableStats { tables, others })
}

// ---------------------------------------------------------------------------------------------
// Completion
// ---------------------------------------------------------------------------------------------

/// The result of a mutation that took effect, as a COMPLETION entry records it: which client's
/// RPC (lease id, rpc id, and what the client had acknowledged when it sent it), which object
/// (table and key hash, so recovery and migration take it with the object's tablet) and what
/// the client was answered (the version, and the new value of an increment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CompletionRecord {
    /// The object's table.
    pub table: TableId,
    /// The object's key hash.
    pub key_hash: u64,
    /// The client's lease.
    pub lease_id: u64,
    /// The RPC's id within the lease (at least 1).
    pub rpc_id: u64,
    /// Every rpc id at or below this, the client had the result of when it sent the RPC.
    pub acknowledged: u64,
    /// The version answered (the new version; the removed one for a remove).
    pub version: Version,
    /// The value answered by an increment; `None` for other mutations.
    pub integer: Option<i64>,
}

/// Bytes before a completion's variable fields: checksum, widths, key hash.
const COMPLETION_FIXED_BYTES: usize = 4 + 2 + 8;

/// The most bytes a COMPLETION entry's content takes: every field at its widest.
pub const COMPLETION_CONTENT_BYTES_MAX: usize = COMPLETION_FIXED_BYTES + 5 * 8 + 8;

/// The widths bit that says an increment's value follows the version: zigzag-encoded at its
/// minimal width, which is what remains of the content (so a small counter's value takes one
/// or two bytes, and an increment's record stays within 32 bytes with its header).
const COMPLETION_HAS_INTEGER: u16 = 1 << 15;

/// `value` with its sign in the low bit, so that small negative values are small too.
fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(encoded: u64) -> i64 {
    ((encoded >> 1) as i64) ^ -((encoded & 1) as i64)
}

/// A COMPLETION entry's content, encoded on the stack (a mutation of an exactly-once client
/// appends one; no allocation on that path).
#[derive(Clone, Copy, Debug)]
pub struct CompletionContent {
    bytes: [u8; COMPLETION_CONTENT_BYTES_MAX],
    length: usize,
}

impl CompletionContent {
    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.length]
    }
}

impl CompletionRecord {
    /// The entry content: checksum, two bytes of field widths (3 bits each: table, lease,
    /// rpc id, acknowledged, version; bit 15: an integer follows), the key hash, the fields at
    /// their minimal widths, and the integer if any, zigzag-encoded at its minimal width
    /// (docs/design/log-format.md).
    pub fn encode(&self) -> CompletionContent {
        let fields = [self.table.0, self.lease_id, self.rpc_id, self.acknowledged, self.version.0];
        let mut widths = 0u16;
        for (index, field) in fields.iter().enumerate() {
            widths |= ((width_of(*field) - 1) as u16) << (3 * index);
        }
        if self.integer.is_some() {
            widths |= COMPLETION_HAS_INTEGER;
        }
        let mut content = CompletionContent { bytes: [0; COMPLETION_CONTENT_BYTES_MAX], length: 4 };
        let mut put = |bytes: &[u8]| {
            content.bytes[content.length..content.length + bytes.len()].copy_from_slice(bytes);
            content.length += bytes.len();
        };
        put(&widths.to_le_bytes());
        put(&self.key_hash.to_le_bytes());
        for field in fields {
            put(&field.to_le_bytes()[..width_of(field)]);
        }
        if let Some(integer) = self.integer {
            let encoded = zigzag(integer);
            put(&encoded.to_le_bytes()[..width_of(encoded)]);
        }
        let crc = checksum(&content.bytes[4..content.length]);
        content.bytes[..4].copy_from_slice(&crc.to_le_bytes());
        content
    }
}

/// Decodes a COMPLETION entry without verifying its checksum (the log's own, verified copy).
pub fn decode_completion_unverified(content: &[u8]) -> Result<CompletionRecord, FormatError> {
    let mut position = 4;
    let widths = read_uint(content, &mut position, 2)? as u16;
    let key_hash = read_uint(content, &mut position, 8)?;
    let mut fields = [0u64; 5];
    for (index, field) in fields.iter_mut().enumerate() {
        let width = usize::from((widths >> (3 * index)) & 7) + 1;
        *field = read_uint(content, &mut position, width)?;
    }
    let integer = if widths & COMPLETION_HAS_INTEGER != 0 {
        // The integer's width is what remains: 1 to 8 bytes.
        let width = content.len().saturating_sub(position);
        if !(1..=8).contains(&width) {
            return Err(FormatError::Malformed("completion length"));
        }
        Some(unzigzag(read_uint(content, &mut position, width)?))
    } else {
        None
    };
    if position != content.len() {
        return Err(FormatError::Malformed("completion length"));
    }
    let [table, lease_id, rpc_id, acknowledged, version] = fields;
    if rpc_id == 0 {
        return Err(FormatError::Malformed("completion of rpc id 0"));
    }
    Ok(CompletionRecord {
        table: TableId(table),
        key_hash,
        lease_id,
        rpc_id,
        acknowledged,
        version: Version(version),
        integer,
    })
}

/// Decodes and verifies a COMPLETION entry.
pub fn decode_completion(content: &[u8]) -> Result<CompletionRecord, FormatError> {
    let record = decode_completion_unverified(content)?;
    verify_leading_checksum(content, EntryType::Completion)?;
    Ok(record)
}

// ---------------------------------------------------------------------------------------------
// Prepared, prepared tombstone (transactions)
// ---------------------------------------------------------------------------------------------

/// A transaction's operation on one object, as a PREPARED entry holds it: prepared (the object
/// locked at the version the transaction read) and waiting for the transaction's decision. A
/// recovery that replays it without its PREPARED_TOMBSTONE locks the object again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PreparedView<'a> {
    /// The object's table.
    pub table: TableId,
    /// The object's key hash (recovery partitions by it without hashing the key).
    pub key_hash: u64,
    /// The client's lease.
    pub lease_id: u64,
    /// The operation's rpc id within the lease (at least 1).
    pub rpc_id: u64,
    /// Every rpc id at or below this, the client had the result of when it sent the PREPARE.
    pub acknowledged: u64,
    /// The transaction: the rpc id of its first operation, under the same lease.
    pub transaction: u64,
    /// What the operation does.
    pub kind: TxOpKind,
    /// The version the transaction read (0: the object was absent).
    pub version_read: Version,
    /// The object's key (1..=65535 bytes).
    pub key: &'a [u8],
    /// The value a WRITE writes; empty for READ and REMOVE.
    pub value: &'a [u8],
}

/// Bytes of a PREPARED entry's content before its key: checksum, table, key hash, lease, rpc
/// id, acknowledged, transaction, kind, version read, key length.
pub const PREPARED_FIXED_BYTES: usize = 4 + 6 * 8 + 1 + 8 + 2;

impl PreparedView<'_> {
    /// The entry content: the fixed fields at full width (a prepared operation lives for a
    /// few round trips, so compactness matters less than a simple layout), the key, the value
    /// (docs/design/log-format.md). The key must be 1..=65535 bytes and only a WRITE has a
    /// value (checked by the caller; asserted here).
    pub fn encode(&self) -> Vec<u8> {
        assert!(
            !self.key.is_empty() && self.key.len() <= usize::from(u16::MAX),
            "invalid key length"
        );
        assert!(self.kind == TxOpKind::Write || self.value.is_empty(), "value without a write");
        let mut content =
            Vec::with_capacity(PREPARED_FIXED_BYTES + self.key.len() + self.value.len());
        content.extend_from_slice(&[0; 4]);
        for field in [
            self.table.0,
            self.key_hash,
            self.lease_id,
            self.rpc_id,
            self.acknowledged,
            self.transaction,
        ] {
            content.extend_from_slice(&field.to_le_bytes());
        }
        content.push(self.kind.code());
        content.extend_from_slice(&self.version_read.0.to_le_bytes());
        content.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        content.extend_from_slice(self.key);
        content.extend_from_slice(self.value);
        let crc = checksum(&content[4..]);
        content[..4].copy_from_slice(&crc.to_le_bytes());
        content
    }
}

/// Decodes a PREPARED entry without verifying its checksum (the log's own, verified copy).
pub fn decode_prepared_unverified(content: &[u8]) -> Result<PreparedView<'_>, FormatError> {
    let mut position = 4;
    let mut fields = [0u64; 6];
    for field in &mut fields {
        *field = read_uint(content, &mut position, 8)?;
    }
    let [table, key_hash, lease_id, rpc_id, acknowledged, transaction] = fields;
    let kind = TxOpKind::from_code(read_uint(content, &mut position, 1)? as u8)
        .ok_or(FormatError::Malformed("prepared operation kind"))?;
    let version_read = Version(read_uint(content, &mut position, 8)?);
    let key_length = read_uint(content, &mut position, 2)? as usize;
    if key_length == 0 {
        return Err(FormatError::Malformed("empty prepared key"));
    }
    let key = content.get(position..position + key_length).ok_or(FormatError::Truncated)?;
    let value = &content[position + key_length..];
    if lease_id == 0 || rpc_id == 0 || transaction == 0 || transaction > rpc_id {
        return Err(FormatError::Malformed("prepared rpc identity"));
    }
    if kind != TxOpKind::Write && !value.is_empty() {
        return Err(FormatError::Malformed("prepared value without a write"));
    }
    Ok(PreparedView {
        table: TableId(table),
        key_hash,
        lease_id,
        rpc_id,
        acknowledged,
        transaction,
        kind,
        version_read,
        key,
        value,
    })
}

/// Decodes and verifies a PREPARED entry.
pub fn decode_prepared(content: &[u8]) -> Result<PreparedView<'_>, FormatError> {
    let view = decode_prepared_unverified(content)?;
    verify_leading_checksum(content, EntryType::Prepared)?;
    Ok(view)
}

/// A PREPARED_TOMBSTONE: the PREPARED entry of (lease, rpc id) in segment `segment_id` is
/// decided. Like an object's tombstone it is needed exactly while that segment is in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PreparedTombstoneRecord {
    /// The object's table.
    pub table: TableId,
    /// The object's key hash.
    pub key_hash: u64,
    /// The client's lease.
    pub lease_id: u64,
    /// The operation's rpc id.
    pub rpc_id: u64,
    /// The segment holding the PREPARED entry.
    pub segment_id: SegmentId,
}

/// Bytes of a PREPARED_TOMBSTONE's content: checksum and five u64 fields.
pub const PREPARED_TOMBSTONE_CONTENT_BYTES: usize = 4 + 5 * 8;

impl PreparedTombstoneRecord {
    /// The entry content (docs/design/log-format.md).
    pub fn encode(&self) -> [u8; PREPARED_TOMBSTONE_CONTENT_BYTES] {
        let mut content = [0u8; PREPARED_TOMBSTONE_CONTENT_BYTES];
        let mut length = 4;
        for field in [self.table.0, self.key_hash, self.lease_id, self.rpc_id, self.segment_id.0] {
            push_uint(&mut content, &mut length, field, 8);
        }
        let crc = checksum(&content[4..]);
        content[..4].copy_from_slice(&crc.to_le_bytes());
        content
    }
}

/// Decodes a PREPARED_TOMBSTONE without verifying its checksum.
pub fn decode_prepared_tombstone_unverified(
    content: &[u8],
) -> Result<PreparedTombstoneRecord, FormatError> {
    if content.len() != PREPARED_TOMBSTONE_CONTENT_BYTES {
        return Err(FormatError::Malformed("prepared tombstone length"));
    }
    let mut position = 4;
    let mut fields = [0u64; 5];
    for field in &mut fields {
        *field = read_uint(content, &mut position, 8)?;
    }
    let [table, key_hash, lease_id, rpc_id, segment_id] = fields;
    if lease_id == 0 || rpc_id == 0 {
        return Err(FormatError::Malformed("prepared tombstone rpc identity"));
    }
    Ok(PreparedTombstoneRecord {
        table: TableId(table),
        key_hash,
        lease_id,
        rpc_id,
        segment_id: SegmentId(segment_id),
    })
}

/// Decodes and verifies a PREPARED_TOMBSTONE.
pub fn decode_prepared_tombstone(content: &[u8]) -> Result<PreparedTombstoneRecord, FormatError> {
    let record = decode_prepared_tombstone_unverified(content)?;
    verify_leading_checksum(content, EntryType::PreparedTombstone)?;
    Ok(record)
}

/// One operation of a transaction as TX_PARTICIPANTS lists it: its object's table and key hash
/// (enough to route to its master) and its rpc id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxParticipant {
    /// The object's table.
    pub table: TableId,
    /// The object's key hash.
    pub key_hash: u64,
    /// The operation's rpc id.
    pub rpc_id: u64,
}

/// A TX_PARTICIPANTS entry: every operation of the transaction (lease, transaction), on every
/// master, so a participant can ask each for its vote and decide when the client is gone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxParticipantsRecord {
    /// The client's lease.
    pub lease_id: u64,
    /// The transaction: the rpc id of its first operation.
    pub transaction: u64,
    /// Every operation (at least one).
    pub participants: Vec<TxParticipant>,
}

/// Bytes of a TX_PARTICIPANTS entry's content before its list: checksum, lease, transaction,
/// count.
pub const TX_PARTICIPANTS_FIXED_BYTES: usize = 4 + 8 + 8 + 4;
/// Bytes per listed operation.
pub const TX_PARTICIPANT_BYTES: usize = 3 * 8;

impl TxParticipantsRecord {
    /// The entry content (docs/design/log-format.md).
    pub fn encode(&self) -> Vec<u8> {
        let mut content = Vec::with_capacity(
            TX_PARTICIPANTS_FIXED_BYTES + self.participants.len() * TX_PARTICIPANT_BYTES,
        );
        content.extend_from_slice(&[0; 4]);
        content.extend_from_slice(&self.lease_id.to_le_bytes());
        content.extend_from_slice(&self.transaction.to_le_bytes());
        let count = u32::try_from(self.participants.len()).expect("participants fit a u32");
        content.extend_from_slice(&count.to_le_bytes());
        for participant in &self.participants {
            content.extend_from_slice(&participant.table.0.to_le_bytes());
            content.extend_from_slice(&participant.key_hash.to_le_bytes());
            content.extend_from_slice(&participant.rpc_id.to_le_bytes());
        }
        let crc = checksum(&content[4..]);
        content[..4].copy_from_slice(&crc.to_le_bytes());
        content
    }
}

/// Decodes a TX_PARTICIPANTS entry without verifying its checksum.
pub fn decode_tx_participants_unverified(
    content: &[u8],
) -> Result<TxParticipantsRecord, FormatError> {
    let mut position = 4;
    let lease_id = read_uint(content, &mut position, 8)?;
    let transaction = read_uint(content, &mut position, 8)?;
    let count = read_u32(content, &mut position)? as usize;
    // The count is checked against the length before anything is allocated for it.
    if count == 0 || content.len() != TX_PARTICIPANTS_FIXED_BYTES + count * TX_PARTICIPANT_BYTES {
        return Err(FormatError::Malformed("transaction participants length"));
    }
    if lease_id == 0 || transaction == 0 {
        return Err(FormatError::Malformed("transaction participants identity"));
    }
    let mut participants = Vec::with_capacity(count);
    for _ in 0..count {
        let table = TableId(read_uint(content, &mut position, 8)?);
        let key_hash = read_uint(content, &mut position, 8)?;
        let rpc_id = read_uint(content, &mut position, 8)?;
        if rpc_id < transaction {
            return Err(FormatError::Malformed("transaction participant before its transaction"));
        }
        participants.push(TxParticipant { table, key_hash, rpc_id });
    }
    Ok(TxParticipantsRecord { lease_id, transaction, participants })
}

/// Decodes and verifies a TX_PARTICIPANTS entry.
pub fn decode_tx_participants(content: &[u8]) -> Result<TxParticipantsRecord, FormatError> {
    let record = decode_tx_participants_unverified(content)?;
    verify_leading_checksum(content, EntryType::TxParticipants)?;
    Ok(record)
}

// ---------------------------------------------------------------------------------------------
// Decoded entries
// ---------------------------------------------------------------------------------------------

/// A decoded, verified entry of any type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry<'a> {
    /// See [`SegmentHeader`].
    SegmentHeader(SegmentHeader),
    /// See [`ObjectView`].
    Object(ObjectView<'a>),
    /// See [`TombstoneView`].
    Tombstone(TombstoneView<'a>),
    /// The segment ids listed by a log digest.
    LogDigest(Vec<SegmentId>),
    /// A safe version.
    SafeVersion(Version),
    /// Live data per table.
    TableStats(TableStats),
    /// A mutation's result kept for its retries.
    Completion(CompletionRecord),
    /// A transaction's prepared operation.
    Prepared(PreparedView<'a>),
    /// A decided transaction operation.
    PreparedTombstone(PreparedTombstoneRecord),
    /// A transaction's operations.
    TxParticipants(TxParticipantsRecord),
}

/// Decodes and verifies the content of an entry of `entry_type`.
pub fn decode_entry(entry_type: EntryType, content: &[u8]) -> Result<Entry<'_>, FormatError> {
    Ok(match entry_type {
        EntryType::SegmentHeader => Entry::SegmentHeader(SegmentHeader::decode(content)?),
        EntryType::Object => Entry::Object(decode_object(content)?),
        EntryType::Tombstone => Entry::Tombstone(decode_tombstone(content)?),
        EntryType::LogDigest => Entry::LogDigest(decode_log_digest(content)?),
        EntryType::SafeVersion => Entry::SafeVersion(decode_safe_version(content)?),
        EntryType::TableStats => Entry::TableStats(decode_table_stats(content)?),
        EntryType::Completion => Entry::Completion(decode_completion(content)?),
        EntryType::Prepared => Entry::Prepared(decode_prepared(content)?),
        EntryType::PreparedTombstone => {
            Entry::PreparedTombstone(decode_prepared_tombstone(content)?)
        }
        EntryType::TxParticipants => Entry::TxParticipants(decode_tx_participants(content)?),
        // Decoded entries come from replicas and recovery data, where a master's in-memory
        // reference to its flash has no meaning: refused, never trusted.
        EntryType::FlashObject => {
            return Err(FormatError::Malformed("flash object outside a master's memory"))
        }
    })
}

/// Bytes of a [`FlashLocator`] at the end of a FLASH_OBJECT's content.
pub const FLASH_LOCATOR_BYTES: usize = 8;

/// Where an object's whole OBJECT entry (header and content, as first appended) sits in its
/// segment's image on the master's flash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashLocator {
    /// Byte offset of the entry's header in the image (the segment's bytes as written).
    pub entry_offset: u32,
    /// Bytes of the entry, header included.
    pub entry_bytes: u32,
}

/// The content of the FLASH_OBJECT that stands in memory for the OBJECT whose content is
/// `object_content` and whose entry is at `locator` in the image: the object's prefix (its
/// checksum, which still covers the object's bytes on flash) and key, then the locator in place
/// of the value. `decode_object_unverified` reads its table, version, expiry and key as an
/// object's.
pub fn encode_flash_object(
    object_content: &[u8],
    locator: FlashLocator,
) -> Result<Vec<u8>, FormatError> {
    let view = decode_object_unverified(object_content)?;
    let value_start = object_content.len() - view.value.len();
    let mut content = Vec::with_capacity(value_start + FLASH_LOCATOR_BYTES);
    content.extend_from_slice(&object_content[..value_start]);
    content.extend_from_slice(&locator.entry_offset.to_le_bytes());
    content.extend_from_slice(&locator.entry_bytes.to_le_bytes());
    Ok(content)
}

/// A FLASH_OBJECT's fields (its "value" is the locator) and its locator.
pub fn decode_flash_object(content: &[u8]) -> Result<(ObjectView<'_>, FlashLocator), FormatError> {
    let view = decode_object_unverified(content)?;
    let locator: [u8; FLASH_LOCATOR_BYTES] =
        view.value.try_into().map_err(|_| FormatError::Malformed("flash locator length"))?;
    let entry_offset = u32::from_le_bytes(locator[..4].try_into().expect("four bytes"));
    let entry_bytes = u32::from_le_bytes(locator[4..].try_into().expect("four bytes"));
    if entry_bytes == 0 {
        return Err(FormatError::Malformed("empty flash entry"));
    }
    Ok((ObjectView { value: &[], ..view }, FlashLocator { entry_offset, entry_bytes }))
}

// ---------------------------------------------------------------------------------------------
// Certificate
// ---------------------------------------------------------------------------------------------

/// Bytes of a serialized certificate.
pub const CERTIFICATE_BYTES: usize = 8;

/// Per-segment metadata that commits a prefix of the segment: its length and a CRC32C over
/// every entry header in that prefix followed by the length. Not a log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Certificate {
    /// Bytes of the segment that are valid.
    pub segment_length: u32,
    /// CRC32C over the entry headers, then the 4 LE bytes of `segment_length`.
    pub checksum: u32,
}

impl Certificate {
    /// The 8-byte form: segment_length LE, then checksum LE.
    pub fn to_bytes(&self) -> [u8; CERTIFICATE_BYTES] {
        let mut bytes = [0u8; CERTIFICATE_BYTES];
        bytes[..4].copy_from_slice(&self.segment_length.to_le_bytes());
        bytes[4..].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }

    /// Parses the 8-byte form.
    pub fn from_bytes(bytes: &[u8]) -> Result<Certificate, FormatError> {
        let mut position = 0;
        let segment_length = read_u32(bytes, &mut position)?;
        let checksum = read_u32(bytes, &mut position)?;
        Ok(Certificate { segment_length, checksum })
    }
}

/// Accumulates entry headers into a running certificate checksum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CertificateBuilder {
    headers_checksum: u32,
}

impl CertificateBuilder {
    /// Adds one entry header (type byte + length bytes).
    pub fn add_header(&mut self, header: &[u8]) {
        self.headers_checksum = crc32c::crc32c_append(self.headers_checksum, header);
    }

    /// The certificate for a segment of `segment_length` bytes whose headers were all added.
    pub fn certificate(&self, segment_length: u32) -> Certificate {
        let checksum = crc32c::crc32c_append(self.headers_checksum, &segment_length.to_le_bytes());
        Certificate { segment_length, checksum }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flash_object_keeps_the_objects_fields_and_checksum_and_replicas_refuse_it() {
        let object = encode_object(
            TableId(7),
            Version(300),
            1_700,
            Some(ExpiresAt(9_000)),
            b"user:42",
            &[0xAB; 1000],
        );
        let locator = FlashLocator { entry_offset: 4_096, entry_bytes: 1_030 };
        let stub = encode_flash_object(&object, locator).unwrap();
        assert_eq!(stub.len(), object.len() - 1000 + FLASH_LOCATOR_BYTES);
        assert_eq!(stub[..4], object[..4], "the object's checksum travels with it");
        let (view, decoded) = decode_flash_object(&stub).unwrap();
        assert_eq!(decoded, locator);
        let original = decode_object(&object).unwrap();
        assert_eq!(
            (view.table, view.version, view.key),
            (original.table, original.version, original.key)
        );
        assert_eq!((view.timestamp, view.expires_at), (original.timestamp, original.expires_at));
        assert!(view.value.is_empty());
        assert_eq!(object_expiry(&stub), Some(ExpiresAt(9_000)));
        assert!(matches!(
            decode_entry(EntryType::FlashObject, &stub),
            Err(FormatError::Malformed(_))
        ));
        assert_eq!(
            decode_flash_object(&object[..object.len() - 1]).err(),
            Some(FormatError::Malformed("flash locator length"))
        );
        let empty =
            encode_flash_object(&object, FlashLocator { entry_offset: 0, entry_bytes: 0 }).unwrap();
        assert!(decode_flash_object(&empty).is_err());
    }

    #[test]
    fn entry_header_widths_are_minimal() {
        for (length, header_bytes) in
            [(0u32, 2usize), (255, 2), (256, 3), (65_535, 3), (65_536, 4), (1 << 24, 5)]
        {
            let header = EntryHeader::new(EntryType::Object, length);
            assert_eq!(header.header_bytes(), header_bytes);
            let decoded = decode_entry_header(header.as_bytes()).unwrap();
            assert_eq!(decoded.entry_type, EntryType::Object);
            assert_eq!(decoded.content_bytes, length);
            assert_eq!(decoded.header_bytes, header_bytes);
        }
        assert_eq!(decode_entry_header(&[0x02 | 0x40, 5, 0]), Err(FormatError::NonMinimalLength));
        assert_eq!(decode_entry_header(&[0x0C, 5]), Err(FormatError::InvalidEntryType(12)));
        assert_eq!(decode_entry_header(&[0x00, 5]), Err(FormatError::InvalidEntryType(0)));
        assert_eq!(decode_entry_header(&[0x02 | 0x80, 5]), Err(FormatError::Truncated));
        assert_eq!(decode_entry_header(&[]), Err(FormatError::Truncated));
    }

    #[test]
    fn object_round_trip_and_overhead() {
        let key = b"key00001";
        let value = [0xABu8; 100];
        let content = encode_object(TableId(3), Version(70_000), 1_700_000_000, None, key, &value);
        let view = decode_object(&content).unwrap();
        assert_eq!(view.table, TableId(3));
        assert_eq!(view.version, Version(70_000));
        assert_eq!(view.timestamp, 1_700_000_000);
        assert_eq!(view.key, key);
        assert_eq!(view.value, &value[..]);
        // Overhead budget: entry header + object fields + 8-byte hash-table entry <= 32 bytes.
        let header = EntryHeader::new(EntryType::Object, content.len() as u32);
        let overhead = header.header_bytes() + content.len() - key.len() - value.len() + 8;
        assert!(overhead <= 32, "per-object overhead {overhead}");
        // Large ids use wide fields.
        let wide = encode_object(TableId(u64::MAX), Version(u64::MAX), 0, None, &[1; 300], b"");
        let view = decode_object(&wide).unwrap();
        assert_eq!(
            (view.table, view.version, view.key.len()),
            (TableId(u64::MAX), Version(u64::MAX), 300)
        );
        assert!(view.value.is_empty());
    }

    #[test]
    fn object_corruption_is_detected() {
        let content = encode_object(TableId(1), Version(2), 3, None, b"key", b"some value");
        for index in 0..content.len() {
            for bit in 0..8 {
                let mut corrupt = content.clone();
                corrupt[index] ^= 1 << bit;
                assert!(decode_object(&corrupt).is_err(), "flip at {index} bit {bit}");
            }
        }
        for length in 0..content.len() {
            // A truncated object either fails to parse or fails its checksum.
            assert!(decode_object(&content[..length]).is_err());
        }
    }

    #[test]
    fn tombstone_round_trip_and_corruption() {
        let tombstone = TombstoneView {
            table: TableId(9),
            segment_id: SegmentId(300),
            object_version: Version(12),
            timestamp: 77,
            key: b"the key",
        };
        let content = encode_tombstone(&tombstone);
        assert_eq!(decode_tombstone(&content).unwrap(), tombstone);
        for index in 0..content.len() {
            let mut corrupt = content.clone();
            corrupt[index] ^= 0x10;
            assert!(decode_tombstone(&corrupt).is_err(), "flip at {index}");
        }
        for length in 0..content.len() {
            assert!(decode_tombstone(&content[..length]).is_err());
        }
    }

    #[test]
    fn tombstone_prefix_and_key_are_the_encoded_content_and_name_the_segment() {
        for segment_id in [0, 1, 300, u64::from(u32::MAX) + 5, u64::MAX] {
            let tombstone = TombstoneView {
                table: TableId(1 << 40),
                segment_id: SegmentId(segment_id),
                object_version: Version(u64::MAX),
                timestamp: u32::MAX,
                key: &[0xab; 300],
            };
            let prefix = TombstonePrefix::new(&tombstone);
            let content = encode_tombstone(&tombstone);
            assert_eq!([prefix.as_bytes(), tombstone.key].concat(), content);
            assert_eq!(decode_tombstone(&content).unwrap(), tombstone);
            assert_eq!(tombstone_segment_id(prefix.as_bytes()), Ok(SegmentId(segment_id)));
            assert_eq!(tombstone_segment_id(&content), Ok(SegmentId(segment_id)));
            // A prefix cut short is an error, never a wrong segment.
            for length in 0..prefix.as_bytes().len() {
                assert!(tombstone_segment_id(&prefix.as_bytes()[..length]).is_err());
            }
        }
    }

    #[test]
    fn segment_header_digest_safe_version_round_trip() {
        let header = SegmentHeader {
            log_id: ServerId(5),
            segment_id: SegmentId(17),
            capacity_bytes: 8 << 20,
        };
        let bytes = header.encode();
        assert_eq!(SegmentHeader::decode(&bytes).unwrap(), header);
        for index in 0..bytes.len() {
            let mut corrupt = bytes;
            corrupt[index] ^= 1;
            assert!(SegmentHeader::decode(&corrupt).is_err());
        }
        let ids = [SegmentId(1), SegmentId(2), SegmentId(40)];
        let digest = encode_log_digest(&ids);
        assert_eq!(decode_log_digest(&digest).unwrap(), ids);
        for index in 0..digest.len() {
            let mut corrupt = digest.clone();
            corrupt[index] ^= 0x80;
            assert!(decode_log_digest(&corrupt).is_err());
        }
        assert!(decode_log_digest(&digest[..digest.len() - 1]).is_err());
        let safe = encode_safe_version(Version(1234));
        assert_eq!(decode_safe_version(&safe).unwrap(), Version(1234));
        for index in 0..safe.len() {
            let mut corrupt = safe;
            corrupt[index] ^= 4;
            assert!(decode_safe_version(&corrupt).is_err());
        }
    }

    #[test]
    fn certificate_covers_headers_and_length() {
        let mut builder = CertificateBuilder::default();
        builder.add_header(&[0x01, 32]);
        let certificate = builder.certificate(34);
        let expected = checksum_of_pieces(&[&[0x01, 32], &34u32.to_le_bytes()]);
        assert_eq!(certificate.checksum, expected);
        assert_eq!(Certificate::from_bytes(&certificate.to_bytes()).unwrap(), certificate);
        assert!(Certificate::from_bytes(&[1, 2, 3]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn object_round_trips(
            table in proptest::prelude::any::<u64>(),
            version in proptest::prelude::any::<u64>(),
            timestamp in proptest::prelude::any::<u32>(),
            expires_at in proptest::option::of(proptest::prelude::any::<u64>()),
            key in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..600),
            value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        ) {
            let expires_at = expires_at.map(ExpiresAt);
            let content =
                encode_object(TableId(table), Version(version), timestamp, expires_at, &key, &value);
            let view = decode_object(&content).unwrap();
            proptest::prop_assert_eq!(view.table.0, table);
            proptest::prop_assert_eq!(view.version.0, version);
            proptest::prop_assert_eq!(view.timestamp, timestamp);
            proptest::prop_assert_eq!(view.expires_at, expires_at);
            // The prefix alone tells the expiry, as the log's accounting reads it.
            let prefix = ObjectPrefix::new(
                TableId(table), Version(version), timestamp, expires_at, &key, &value,
            );
            proptest::prop_assert_eq!(object_expiry(prefix.as_bytes()), expires_at);
            proptest::prop_assert_eq!(object_expiry(&content), expires_at);
            proptest::prop_assert_eq!(view.key, &key[..]);
            proptest::prop_assert_eq!(view.value, &value[..]);
        }

        #[test]
        fn completion_round_trips(
            table in proptest::prelude::any::<u64>(),
            key_hash in proptest::prelude::any::<u64>(),
            lease_id in proptest::prelude::any::<u64>(),
            rpc_id in 1..u64::MAX,
            acknowledged in proptest::prelude::any::<u64>(),
            version in proptest::prelude::any::<u64>(),
            integer in proptest::option::of(proptest::prelude::any::<i64>()),
        ) {
            let record = CompletionRecord {
                table: TableId(table), key_hash, lease_id, rpc_id, acknowledged,
                version: Version(version), integer,
            };
            let content = record.encode().as_bytes().to_vec();
            proptest::prop_assert!(content.len() <= COMPLETION_CONTENT_BYTES_MAX);
            proptest::prop_assert_eq!(decode_completion(&content), Ok(record));
            // Any single flipped bit is caught.
            let mut corrupt = content.clone();
            let bit = (key_hash as usize) % (corrupt.len() * 8);
            corrupt[bit / 8] ^= 1 << (bit % 8);
            proptest::prop_assert_ne!(decode_completion(&corrupt), Ok(record));
        }

        #[test]
        fn table_stats_round_trip(
            tables in proptest::collection::btree_map(
                proptest::prelude::any::<u64>(),
                (proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
                0..=TABLE_STATS_TABLES_MAX,
            ),
            others in (proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
        ) {
            let statistics = TableStats {
                tables: tables
                    .into_iter()
                    .map(|(table, (bytes, objects))| (TableId(table), TableTally { bytes, objects }))
                    .collect(),
                others: TableTally { bytes: others.0, objects: others.1 },
            };
            let content = encode_table_stats(&statistics);
            proptest::prop_assert_eq!(content.len(), table_stats_content_bytes(statistics.tables.len()));
            proptest::prop_assert_eq!(decode_table_stats(&content).unwrap(), statistics);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = decode_entry_header(&bytes);
            for entry_type in EntryType::ALL {
                let _ = decode_entry(entry_type, &bytes);
            }
        }
    }
}
#[cfg(test)]
mod table_stats_tests {
    use super::*;

    #[test]
    fn older_segment_headers_are_still_read_and_unknown_versions_refused() {
        let header =
            SegmentHeader { log_id: ServerId(2), segment_id: SegmentId(3), capacity_bytes: 1024 };
        let with_version = |version: u16| {
            let mut bytes = header.encode();
            bytes[4..6].copy_from_slice(&version.to_le_bytes());
            let crc = checksum(&bytes[0..28]);
            bytes[28..32].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
        assert_eq!(SegmentHeader::decode(&with_version(1)), Ok(header));
        assert_eq!(SegmentHeader::decode(&with_version(2)), Ok(header));
        assert_eq!(SegmentHeader::decode(&with_version(3)), Ok(header));
        assert_eq!(SegmentHeader::decode(&with_version(4)), Ok(header));
        for unknown in [0, 6, u16::MAX] {
            assert_eq!(
                SegmentHeader::decode(&with_version(unknown)),
                Err(FormatError::Malformed("segment format version"))
            );
        }
    }

    fn two_tables() -> TableStats {
        TableStats {
            tables: vec![
                (TableId(1), TableTally { bytes: 1000, objects: 10 }),
                (TableId(4), TableTally { bytes: 50, objects: 1 }),
            ],
            others: TableTally { bytes: 7, objects: 2 },
        }
    }

    #[test]
    fn a_corrupt_or_malformed_table_stats_entry_is_refused() {
        let good = encode_table_stats(&two_tables());
        for index in 0..good.len() {
            let mut corrupt = good.clone();
            corrupt[index] ^= 0x01;
            assert!(decode_table_stats(&corrupt).is_err(), "a flip at byte {index} passed");
        }
        assert_eq!(
            decode_table_stats(&good[..good.len() - 1]),
            Err(FormatError::Malformed("table stats length"))
        );
        // Tables out of order (checksum recomputed, so only the order is wrong).
        let mut swapped = good.clone();
        let (first, second) = (24..48, 48..72);
        let first_bytes = swapped[first.clone()].to_vec();
        swapped.copy_within(second.clone(), first.start);
        swapped[second].copy_from_slice(&first_bytes);
        let crc = checksum(&swapped[4..]);
        swapped[..4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode_table_stats(&swapped),
            Err(FormatError::Malformed("table stats not ascending by table id"))
        );
        // A count past the limit is refused before the length is trusted.
        let mut huge = good;
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_table_stats(&huge),
            Err(FormatError::Malformed("table stats list too many tables"))
        );
    }
}

#[cfg(test)]
mod completion_tests {
    use super::*;

    /// A write's completion with a small table, a lease among the first thousands, a client a
    /// few thousand RPCs in and a version below 2^24 takes 28 bytes with its entry header:
    /// within the 32 bytes a mutation may add to the log until it is acknowledged.
    #[test]
    fn a_typical_completion_takes_under_32_bytes() {
        let record = CompletionRecord {
            table: TableId(3),
            key_hash: 0x0123_4567_89ab_cdef,
            lease_id: 4_000,
            rpc_id: 70_000,
            acknowledged: 69_990,
            version: Version(5_000_000),
            integer: None,
        };
        let content = record.encode().as_bytes().to_vec();
        let header = EntryHeader::new(EntryType::Completion, content.len() as u32);
        assert_eq!(header.header_bytes() + content.len(), 28);
        assert_eq!(decode_completion(&content), Ok(record));
        // An increment's adds its value at its minimal width, zigzag-encoded: a counter
        // within ±127 takes one byte, one within ±2^31 at most four.
        for (integer, added) in [(-7, 1), (127, 1), (128, 2), (-1_000_000, 3), (i64::MIN, 8)] {
            let increment = CompletionRecord { integer: Some(integer), ..record };
            let encoded = increment.encode().as_bytes().to_vec();
            assert_eq!(encoded.len(), content.len() + added, "{integer}");
            assert_eq!(decode_completion(&encoded), Ok(increment));
        }
        let counter = CompletionRecord { integer: Some(1_000_000), ..record };
        assert!(header.header_bytes() + counter.encode().as_bytes().len() <= 32);
    }

    #[test]
    fn malformed_completions_are_refused() {
        let record = CompletionRecord {
            table: TableId(1),
            key_hash: 9,
            lease_id: 1,
            rpc_id: 1,
            acknowledged: 0,
            version: Version(1),
            integer: None,
        };
        let content = record.encode().as_bytes().to_vec();
        assert_eq!(decode_completion(&content[..content.len() - 1]), Err(FormatError::Truncated));
        let mut longer = content.clone();
        longer.push(0);
        assert!(decode_completion(&longer).is_err());
        // An increment's record whose integer is missing.
        let mut no_integer = content.clone();
        no_integer[4..6].copy_from_slice(
            &(u16::from_le_bytes([content[4], content[5]]) | COMPLETION_HAS_INTEGER).to_le_bytes(),
        );
        assert_eq!(
            decode_completion_unverified(&no_integer),
            Err(FormatError::Malformed("completion length"))
        );
        let zero = CompletionRecord { rpc_id: 0, ..record }.encode();
        assert_eq!(
            decode_completion(zero.as_bytes()),
            Err(FormatError::Malformed("completion of rpc id 0"))
        );
    }
}

#[cfg(test)]
mod golden {
    //! The worked example of docs/design/log-format.md, pinned: if these bytes change, stored
    //! segments and replicas become unreadable.
    use super::*;

    fn bytes(hex: &str) -> Vec<u8> {
        hex.split_whitespace().map(|byte| u8::from_str_radix(byte, 16).unwrap()).collect()
    }

    #[test]
    fn worked_example_bytes_are_stable() {
        let object = encode_object(TableId(7), Version(1), 1_700_000_000, None, b"k1", b"hi");
        assert_eq!(object, bytes("8b 8c 92 6d 00 f1 53 65 00 07 01 02 6b 31 68 69"));
        // The same object expiring at 1 700 000 060 000 ms (a minute after it was written).
        let expiring = encode_object(
            TableId(7),
            Version(1),
            1_700_000_000,
            Some(ExpiresAt(1_700_000_060_000)),
            b"k1",
            b"hi",
        );
        assert_eq!(
            expiring,
            bytes("8b 80 54 ea 00 f1 53 65 80 07 01 60 52 e6 cf 8b 01 00 00 02 6b 31 68 69")
        );
        assert_eq!(EntryHeader::new(EntryType::Object, 16).as_bytes(), &[0x02, 0x10]);
        let tombstone = encode_tombstone(&TombstoneView {
            table: TableId(7),
            segment_id: SegmentId(3),
            object_version: Version(1),
            timestamp: 1_700_000_005,
            key: b"k1",
        });
        assert_eq!(tombstone, bytes("99 cd 76 c2 05 f1 53 65 00 00 07 01 03 6b 31"));
        let header = SegmentHeader {
            log_id: ServerId(2),
            segment_id: SegmentId(3),
            capacity_bytes: 1 << 20,
        }
        .encode();
        assert_eq!(
            header.to_vec(),
            bytes(
                "53 47 4d 54 05 00 00 00 02 00 00 00 00 00 00 00 \
                 03 00 00 00 00 00 00 00 00 00 10 00 93 76 e4 4e"
            )
        );
        let digest = encode_log_digest(&[SegmentId(1), SegmentId(3)]);
        assert_eq!(
            digest,
            bytes("d3 33 0a fb 02 00 00 00 01 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00")
        );
        let safe = encode_safe_version(Version(5));
        assert_eq!(safe.to_vec(), bytes("c0 4d 09 e4 05 00 00 00 00 00 00 00"));
        let table_stats = encode_table_stats(&TableStats {
            tables: vec![(TableId(7), TableTally { bytes: 40, objects: 2 })],
            others: TableTally::default(),
        });
        assert_eq!(
            table_stats,
            bytes(
                "cd 4b 70 16 01 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 \
                 07 00 00 00 00 00 00 00 28 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00"
            )
        );
        assert_eq!(EntryHeader::new(EntryType::TableStats, 48).as_bytes(), &[0x06, 0x30]);
        let completion = CompletionRecord {
            table: TableId(7),
            key_hash: 0x0123_4567_89ab_cdef,
            lease_id: 4,
            rpc_id: 12,
            acknowledged: 10,
            version: Version(1),
            integer: None,
        };
        assert_eq!(
            completion.encode().as_bytes(),
            bytes("2c be 0e e5 00 00 ef cd ab 89 67 45 23 01 07 04 0c 0a 01")
        );
        assert_eq!(EntryHeader::new(EntryType::Completion, 19).as_bytes(), &[0x07, 0x13]);
        let mut builder = CertificateBuilder::default();
        for header in
            [[0x01, 0x20], [0x04, 0x18], [0x05, 0x0c], [0x06, 0x30], [0x02, 0x10], [0x03, 0x0f]]
        {
            builder.add_header(&header);
        }
        let certificate = builder.certificate(159);
        assert_eq!(certificate.to_bytes().to_vec(), bytes("9f 00 00 00 45 2e 42 8e"));
    }
}

#[cfg(test)]
mod prepared_tests {
    use super::*;

    fn transfer_debit() -> PreparedView<'static> {
        PreparedView {
            table: TableId(3),
            key_hash: 0x1122_3344_5566_7788,
            lease_id: 9,
            rpc_id: 42,
            acknowledged: 40,
            transaction: 41,
            kind: TxOpKind::Write,
            version_read: Version(7),
            key: b"alice",
            value: b"90",
        }
    }

    #[test]
    fn a_prepared_entry_round_trips_and_its_layout_is_pinned() {
        let view = transfer_debit();
        let content = view.encode();
        assert_eq!(content.len(), PREPARED_FIXED_BYTES + 5 + 2);
        // The layout of docs/design/log-format.md: fields at fixed offsets.
        assert_eq!(&content[4..12], &3u64.to_le_bytes());
        assert_eq!(&content[12..20], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&content[20..28], &9u64.to_le_bytes());
        assert_eq!(&content[28..36], &42u64.to_le_bytes());
        assert_eq!(&content[36..44], &40u64.to_le_bytes());
        assert_eq!(&content[44..52], &41u64.to_le_bytes());
        assert_eq!(content[52], TxOpKind::Write.code());
        assert_eq!(&content[53..61], &7u64.to_le_bytes());
        assert_eq!(&content[61..63], &5u16.to_le_bytes());
        assert_eq!(&content[63..], b"alice90");
        assert_eq!(decode_prepared(&content), Ok(view));
        assert_eq!(decode_entry(EntryType::Prepared, &content), Ok(Entry::Prepared(view)));
    }

    #[test]
    fn a_corrupt_or_malformed_prepared_entry_is_refused() {
        let good = transfer_debit().encode();
        for index in 0..good.len() {
            let mut corrupt = good.clone();
            corrupt[index] ^= 0x01;
            assert!(decode_prepared(&corrupt).is_err(), "a flip at byte {index} passed");
        }
        for length in 0..PREPARED_FIXED_BYTES + 5 {
            assert!(decode_prepared(&good[..length]).is_err(), "{length} bytes decoded");
        }
        let read_with_value = PreparedView { kind: TxOpKind::Read, ..transfer_debit() };
        let mut content = transfer_debit().encode();
        content[52] = read_with_value.kind.code();
        let crc = checksum(&content[4..]);
        content[..4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            decode_prepared(&content),
            Err(FormatError::Malformed("prepared value without a write"))
        );
        let mut unknown_kind = transfer_debit().encode();
        unknown_kind[52] = 0;
        assert_eq!(
            decode_prepared_unverified(&unknown_kind),
            Err(FormatError::Malformed("prepared operation kind"))
        );
    }

    #[test]
    fn a_prepared_tombstone_round_trips_and_refuses_corruption() {
        let record = PreparedTombstoneRecord {
            table: TableId(3),
            key_hash: 77,
            lease_id: 9,
            rpc_id: 42,
            segment_id: SegmentId(12),
        };
        let content = record.encode();
        assert_eq!(&content[36..44], &12u64.to_le_bytes());
        assert_eq!(decode_prepared_tombstone(&content), Ok(record));
        assert_eq!(
            decode_entry(EntryType::PreparedTombstone, &content),
            Ok(Entry::PreparedTombstone(record))
        );
        for index in 0..content.len() {
            let mut corrupt = content;
            corrupt[index] ^= 0x01;
            assert!(decode_prepared_tombstone(&corrupt).is_err(), "a flip at byte {index} passed");
        }
        assert!(decode_prepared_tombstone(&content[..43]).is_err());
    }
}

#[cfg(test)]
mod tx_participants_tests {
    use super::*;

    fn transfer() -> TxParticipantsRecord {
        TxParticipantsRecord {
            lease_id: 9,
            transaction: 41,
            participants: vec![
                TxParticipant { table: TableId(3), key_hash: 5, rpc_id: 41 },
                TxParticipant { table: TableId(3), key_hash: 6, rpc_id: 42 },
            ],
        }
    }

    #[test]
    fn a_participant_list_round_trips_and_refuses_corruption() {
        let record = transfer();
        let content = record.encode();
        assert_eq!(content.len(), TX_PARTICIPANTS_FIXED_BYTES + 2 * TX_PARTICIPANT_BYTES);
        assert_eq!(&content[20..24], &2u32.to_le_bytes());
        assert_eq!(&content[24..32], &3u64.to_le_bytes());
        assert_eq!(decode_tx_participants(&content), Ok(record.clone()));
        assert_eq!(
            decode_entry(EntryType::TxParticipants, &content),
            Ok(Entry::TxParticipants(record))
        );
        for index in 0..content.len() {
            let mut corrupt = content.clone();
            corrupt[index] ^= 0x01;
            assert!(decode_tx_participants(&corrupt).is_err(), "a flip at byte {index} passed");
        }
        for length in 0..content.len() {
            assert!(decode_tx_participants(&content[..length]).is_err(), "{length} bytes");
        }
        // A count the content cannot hold is refused before anything is allocated for it.
        let mut huge = content.clone();
        huge[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_tx_participants_unverified(&huge),
            Err(FormatError::Malformed("transaction participants length"))
        );
    }
}
