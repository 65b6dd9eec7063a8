//! The validating segment iterator: given a segment's bytes and its certificate, it checks the
//! certificate before yielding anything, then verifies each entry's own checksum as it goes.
//! Recovery replays segments through it, so it must return errors, never panic, on any input.

use crate::format::{
    decode_entry, decode_entry_header, Certificate, CertificateBuilder, Entry, EntryType,
    FormatError,
};

/// One verified entry of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IteratedEntry<'a> {
    /// Byte offset of the entry's header within the segment.
    pub offset: u32,
    /// The entry's type.
    pub entry_type: EntryType,
    /// Bytes of header + content.
    pub entry_bytes: u32,
    /// The decoded entry.
    pub entry: Entry<'a>,
}

/// Iterates over the entries of a segment whose certificate has been verified.
#[derive(Debug)]
pub struct SegmentIterator<'a> {
    bytes: &'a [u8],
    position: usize,
    /// Set after the first error, so a corrupt segment yields exactly one error and stops.
    finished: bool,
}

impl<'a> SegmentIterator<'a> {
    /// Verifies `certificate` against `bytes` (which may be longer than the certified length;
    /// the rest is ignored): the headers must parse, the entries must end exactly at
    /// `segment_length`, the checksum must match, and the first entry must be a segment header.
    pub fn new(
        bytes: &'a [u8],
        certificate: &Certificate,
    ) -> Result<SegmentIterator<'a>, FormatError> {
        let length = certificate.segment_length as usize;
        let bytes = bytes.get(..length).ok_or(FormatError::Truncated)?;
        let mut builder = CertificateBuilder::default();
        let mut position = 0usize;
        let mut first_type = None;
        while position < length {
            let header = decode_entry_header(&bytes[position..])
                .map_err(|_| FormatError::CertificateMismatch)?;
            first_type.get_or_insert(header.entry_type);
            builder.add_header(&bytes[position..position + header.header_bytes]);
            position = position
                .checked_add(header.header_bytes + header.content_bytes as usize)
                .filter(|&end| end <= length)
                .ok_or(FormatError::CertificateMismatch)?;
        }
        if builder.certificate(certificate.segment_length) != *certificate {
            return Err(FormatError::CertificateMismatch);
        }
        if first_type.is_some_and(|entry_type| entry_type != EntryType::SegmentHeader) {
            return Err(FormatError::Malformed("segment does not start with a segment header"));
        }
        Ok(SegmentIterator { bytes, position: 0, finished: false })
    }
}

impl<'a> Iterator for SegmentIterator<'a> {
    type Item = Result<IteratedEntry<'a>, FormatError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished || self.position >= self.bytes.len() {
            return None;
        }
        let bytes: &'a [u8] = self.bytes;
        let result = (|| {
            // The walk in `new` proved these headers parse and stay in bounds; decode again
            // rather than trusting that, so a logic slip yields an error instead of a panic.
            let header = decode_entry_header(&bytes[self.position..])?;
            let content_start = self.position + header.header_bytes;
            let content_end = content_start + header.content_bytes as usize;
            let content = bytes.get(content_start..content_end).ok_or(FormatError::Truncated)?;
            let entry = decode_entry(header.entry_type, content)?;
            let item = IteratedEntry {
                offset: self.position as u32,
                entry_type: header.entry_type,
                entry_bytes: (content_end - self.position) as u32,
                entry,
            };
            self.position = content_end;
            Ok(item)
        })();
        if result.is_err() {
            self.finished = true;
        }
        Some(result)
    }
}
