//! The bytes of the file store's log: the file header, records and the batch encoding, and
//! the replay rule that tells a torn tail (discard) from damage (refuse to start).
//!
//! The specification is docs/design/meta-store-format.md; this module is its only
//! implementation. All integers are little-endian. Decoding never trusts a length from the
//! file: every length is bounds-checked before it is used.

use crate::{MetaError, MetaOperation, BATCH_BYTES_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX};

/// The first 8 bytes of every log file.
pub(crate) const FILE_MAGIC: [u8; 8] = *b"STRATMET";

/// The format version this code writes and the only one it reads.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Size of the file header: magic, version, reserved.
pub(crate) const HEADER_BYTES: usize = 16;

/// The first 4 bytes of every record, so that replay can tell a record boundary from garbage
/// (and, after damage, search the rest of the file for records that would be lost). On disk
/// these are the ASCII bytes "MREC".
pub(crate) const RECORD_MARKER: [u8; 4] = *b"MREC";

/// Size of a record's header: marker, payload length, payload CRC32C.
pub(crate) const RECORD_HEADER_BYTES: usize = 12;

/// Largest record payload. Every record holds at most one batch's worth of encoding, so a
/// length above this can only be damage (or a torn length field), never a real record.
pub(crate) const RECORD_PAYLOAD_BYTES_MAX: usize = BATCH_BYTES_MAX;

/// Operation kind byte of a put.
const KIND_PUT: u8 = 1;

/// Operation kind byte of a delete.
const KIND_DELETE: u8 = 2;

/// The 16-byte file header of a version-1 log.
pub(crate) fn encode_header() -> [u8; HEADER_BYTES] {
    let mut header = [0u8; HEADER_BYTES];
    header[..8].copy_from_slice(&FILE_MAGIC);
    header[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    // Bytes 12..16 are reserved and written as zero.
    header
}

/// Checks the file header at the start of `log`.
pub(crate) fn check_header(log: &[u8]) -> Result<(), MetaError> {
    // The header is written to a temporary file, fsynced and renamed into place, so a short
    // header is never a torn write: it is damage.
    if log.len() < HEADER_BYTES {
        return Err(corrupt(0, format!("file is {} bytes, shorter than its header", log.len())));
    }
    if log[..8] != FILE_MAGIC {
        return Err(corrupt(0, "not a Stratus metadata log (bad magic)".to_string()));
    }
    let version = read_u32(log, 8);
    if version != FORMAT_VERSION {
        return Err(corrupt(8, format!("unsupported format version {version}")));
    }
    let reserved = read_u32(log, 12);
    if reserved != 0 {
        // A later version might give these bytes a meaning; this reader cannot know it.
        return Err(corrupt(12, format!("reserved header field is {reserved:#x}, not zero")));
    }
    Ok(())
}

/// Appends one record holding `operations` (an encoded batch) to `out`. The caller keeps the
/// payload within [`RECORD_PAYLOAD_BYTES_MAX`] (validated batches and snapshot chunks do).
pub(crate) fn append_record(out: &mut Vec<u8>, operations: &[MetaOperation]) {
    let start = out.len();
    out.extend_from_slice(&RECORD_MARKER);
    // Length and checksum are patched in once the payload is encoded.
    out.extend_from_slice(&[0u8; 8]);
    let payload_start = out.len();
    out.extend_from_slice(&(operations.len() as u32).to_le_bytes());
    for operation in operations {
        match operation {
            MetaOperation::Put { key, value } => {
                out.push(KIND_PUT);
                append_bytes(out, key.as_bytes());
                append_bytes(out, value);
            }
            MetaOperation::Delete { key } => {
                out.push(KIND_DELETE);
                append_bytes(out, key.as_bytes());
            }
        }
    }
    let payload_length = (out.len() - payload_start) as u32;
    let checksum = crc32c::crc32c(&out[payload_start..]);
    out[start + 4..start + 8].copy_from_slice(&payload_length.to_le_bytes());
    out[start + 8..start + 12].copy_from_slice(&checksum.to_le_bytes());
}

/// Appends a u32 length and then `bytes`.
fn append_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// What replaying a log found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replay {
    /// Records replayed.
    pub(crate) records: u64,
    /// Offset just past the last good record: the length the file must have.
    pub(crate) good_bytes: u64,
    /// Bytes after the last good record that are a torn, unacknowledged append.
    pub(crate) torn_tail_bytes: u64,
}

/// Replays `log` (a whole log file), handing each record's batch to `each` in order.
///
/// The first record that is not valid (wrong marker, impossible length, cut short, or checksum
/// mismatch) ends the log. If no valid record starts anywhere after it, the bytes from it on are
/// a torn tail: an append that a crash interrupted before its fsync returned, so it was never
/// acknowledged and dropping it loses nothing. If a valid record does follow, the bad one is
/// damage to data that was acknowledged, and replay fails with [`MetaError::Corrupt`].
pub(crate) fn replay(
    log: &[u8],
    mut each: impl FnMut(Vec<MetaOperation>),
) -> Result<Replay, MetaError> {
    check_header(log)?;
    let mut records = 0;
    let mut at = HEADER_BYTES;
    while at < log.len() {
        match probe_record(log, at) {
            Ok((payload, end)) => {
                // A payload whose checksum matches was written whole, so failing to decode it
                // is not a torn write but a bug or deliberate damage.
                each(decode_batch(payload, at as u64)?);
                records += 1;
                at = end;
            }
            Err(reason) => {
                if let Some(valid_at) = find_valid_record(log, at + 1) {
                    return Err(corrupt(
                        at as u64,
                        format!(
                            "{reason}, but a valid record follows at byte {valid_at}, so this is \
                             damage to acknowledged data, not a torn write"
                        ),
                    ));
                }
                tracing::debug!(offset = at, %reason, "metadata log ends in a torn record");
                return Ok(Replay {
                    records,
                    good_bytes: at as u64,
                    torn_tail_bytes: (log.len() - at) as u64,
                });
            }
        }
    }
    Ok(Replay { records, good_bytes: log.len() as u64, torn_tail_bytes: 0 })
}

/// Checks the record starting at `at`; on success returns its payload and the offset just past
/// it, otherwise why it is not a valid record.
fn probe_record(log: &[u8], at: usize) -> Result<(&[u8], usize), String> {
    let available = log.len() - at;
    if available < RECORD_HEADER_BYTES {
        return Err(format!("record header cut short ({available} of 12 bytes)"));
    }
    if log[at..at + 4] != RECORD_MARKER {
        return Err("wrong record marker".to_string());
    }
    let payload_length = read_u32(log, at + 4) as usize;
    if payload_length > RECORD_PAYLOAD_BYTES_MAX {
        return Err(format!("record length {payload_length} exceeds the limit"));
    }
    let payload_start = at + RECORD_HEADER_BYTES;
    let end = payload_start + payload_length;
    if end > log.len() {
        return Err(format!(
            "record cut short ({} of {payload_length} payload bytes)",
            log.len() - payload_start
        ));
    }
    let payload = &log[payload_start..end];
    let stored = read_u32(log, at + 8);
    let computed = crc32c::crc32c(payload);
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
        ));
    }
    Ok((payload, end))
}

/// The offset of the first valid record starting at or after `from`, if any.
fn find_valid_record(log: &[u8], from: usize) -> Option<usize> {
    if log.len() < RECORD_HEADER_BYTES {
        return None;
    }
    // Checking the marker first keeps this cheap: the checksum is computed only where one
    // matches.
    (from..=log.len() - RECORD_HEADER_BYTES)
        .find(|&at| log[at..at + 4] == RECORD_MARKER && probe_record(log, at).is_ok())
}

/// Decodes a record payload (an encoded batch). `record_offset` is only for error messages.
pub(crate) fn decode_batch(
    payload: &[u8],
    record_offset: u64,
) -> Result<Vec<MetaOperation>, MetaError> {
    let damaged = |reason: String| corrupt(record_offset, format!("record payload: {reason}"));
    let mut reader = Reader { bytes: payload, at: 0 };
    let count = reader.u32().ok_or_else(|| damaged("no operation count".to_string()))?;
    // Each operation takes at least 5 bytes, so a count larger than that allows is damage;
    // bounding the capacity this way means a bad count cannot cause a huge allocation.
    let mut operations = Vec::with_capacity((count as usize).min(payload.len() / 5));
    for index in 0..count {
        let kind = reader.u8().ok_or_else(|| damaged(format!("operation {index} cut short")))?;
        let key = reader
            .bytes_with_length(KEY_BYTES_MAX)
            .map_err(|reason| damaged(format!("operation {index} key: {reason}")))?;
        let key = String::from_utf8(key.to_vec())
            .map_err(|_| damaged(format!("operation {index} key is not UTF-8")))?;
        match kind {
            KIND_PUT => {
                let value = reader
                    .bytes_with_length(VALUE_BYTES_MAX)
                    .map_err(|reason| damaged(format!("operation {index} value: {reason}")))?;
                operations.push(MetaOperation::Put { key, value: value.to_vec() });
            }
            KIND_DELETE => operations.push(MetaOperation::Delete { key }),
            other => return Err(damaged(format!("operation {index} has unknown kind {other}"))),
        }
    }
    if reader.at != payload.len() {
        return Err(damaged(format!("{} trailing bytes", payload.len() - reader.at)));
    }
    Ok(operations)
}

/// A bounds-checked cursor over a payload.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(count)?;
        let taken = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(taken)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|bytes| bytes[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|bytes| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// A u32 length (at most `limit`) followed by that many bytes.
    fn bytes_with_length(&mut self, limit: usize) -> Result<&'a [u8], String> {
        let length = self.u32().ok_or("length cut short")? as usize;
        if length > limit {
            return Err(format!("length {length} exceeds the limit {limit}"));
        }
        self.take(length).ok_or_else(|| format!("{length} bytes cut short"))
    }
}

/// The little-endian u32 at `at`; the caller has checked the bounds.
fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn corrupt(offset: u64, reason: String) -> MetaError {
    MetaError::Corrupt { offset, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &[u8]) -> MetaOperation {
        MetaOperation::Put { key: key.to_string(), value: value.to_vec() }
    }

    /// The worked example in docs/design/meta-store-format.md, byte for byte.
    #[test]
    fn record_matches_the_documented_example() {
        let mut record = Vec::new();
        append_record(
            &mut record,
            &[put("a", b"xy"), MetaOperation::Delete { key: "b".to_string() }],
        );
        let payload: Vec<u8> = vec![
            2, 0, 0, 0, // count
            1, 1, 0, 0, 0, b'a', 2, 0, 0, 0, b'x', b'y', // put "a" = "xy"
            2, 1, 0, 0, 0, b'b', // delete "b"
        ];
        let mut expected = b"MREC".to_vec();
        expected.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        expected.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        expected.extend_from_slice(&payload);
        assert_eq!(record, expected);
        assert_eq!(payload.len(), 22);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        // CRC32C check value from the specification, so the document can quote it.
        assert_eq!(crc32c::crc32c(&payload), 0xcd21_8a73);
        assert_eq!(
            encode_header(),
            [b'S', b'T', b'R', b'A', b'T', b'M', b'E', b'T', 1, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn batches_round_trip() {
        let batch =
            vec![put("", b""), put("key", &[0, 255]), MetaOperation::Delete { key: "é".into() }];
        let mut record = Vec::new();
        append_record(&mut record, &batch);
        let (payload, end) = probe_record(&record, 0).expect("valid record");
        assert_eq!(end, record.len());
        assert_eq!(decode_batch(payload, 0).expect("decodes"), batch);
    }

    #[test]
    fn decoding_rejects_malformed_payloads() {
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            vec![1, 0, 0, 0],
            vec![1, 0, 0, 0, 3, 0, 0, 0, 0],
            vec![1, 0, 0, 0, 2, 1, 0, 0, 0, 0xff],
            vec![0, 0, 0, 0, 9],
            vec![0xff, 0xff, 0xff, 0xff],
        ];
        for payload in cases {
            assert!(
                matches!(decode_batch(&payload, 7), Err(MetaError::Corrupt { offset: 7, .. })),
                "{payload:?} should not decode"
            );
        }
    }
}
