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
    /// The content bytes, verified (the decoded entry borrows from them): a replay copies an
    /// object's entry with them as they are, checksum included, rather than encoding it again.
    pub content: &'a [u8],
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
    /// The bytes passed [`verify_replica`] (or this iterator) before: objects' checksums are
    /// not computed again.
    objects_verified: bool,
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
        Ok(SegmentIterator { bytes, position: 0, finished: false, objects_verified: false })
    }

    /// Iterates over segment bytes that already passed [`verify_replica`] with `certificate`
    /// (the same bytes, which cannot have changed since: they are borrowed immutably): the
    /// certificate is not walked again and objects' checksums are not computed again, which
    /// was a recovery master's second pass over every replayed byte. Every other check stays,
    /// so bytes that were not in fact verified still yield errors, never a panic; they may
    /// then yield an object whose bytes do not match its checksum.
    pub fn of_verified(
        bytes: &'a [u8],
        certificate: &Certificate,
    ) -> Result<SegmentIterator<'a>, FormatError> {
        let length = certificate.segment_length as usize;
        let bytes = bytes.get(..length).ok_or(FormatError::Truncated)?;
        Ok(SegmentIterator { bytes, position: 0, finished: false, objects_verified: true })
    }
}

/// Builds the segment a recovery master needs from a replica: the segment header, then the
/// entries `keep` accepts, in their order and with their bytes unchanged, and the certificate
/// of the result. The replica is verified on the way (certificate and every entry's checksum);
/// a replica that fails is refused whole.
pub fn filter_segment(
    bytes: &[u8],
    certificate: &Certificate,
    keep: &dyn Fn(&Entry<'_>) -> bool,
) -> Result<(Vec<u8>, Certificate), FormatError> {
    let mut parts = partition_segment(bytes, certificate, 1, &|entry, parts| {
        parts[0] = keep(entry);
    })?;
    Ok(parts.pop().expect("partition_segment returns one segment per part"))
}

/// Cuts a replica into `part_count` segments in one pass, as a backup does for every recovery
/// master of a crash at once: each part gets the segment header and the entries `place` marks
/// for it (it receives one flag per part, all false, and sets those of the parts that need the
/// entry), in their order and with their bytes unchanged, and its own certificate. The replica
/// is verified on the way (certificate and every entry's checksum); a replica that fails is
/// refused whole.
pub fn partition_segment(
    bytes: &[u8],
    certificate: &Certificate,
    part_count: usize,
    place: &dyn Fn(&Entry<'_>, &mut [bool]),
) -> Result<Vec<(Vec<u8>, Certificate)>, FormatError> {
    let mut parts: Vec<(Vec<u8>, CertificateBuilder)> =
        (0..part_count).map(|_| (Vec::new(), CertificateBuilder::default())).collect();
    let mut placed = vec![false; part_count];
    for entry in SegmentIterator::new(bytes, certificate)? {
        let entry = entry?;
        if entry.entry_type == EntryType::SegmentHeader {
            placed.fill(true);
        } else {
            placed.fill(false);
            place(&entry.entry, &mut placed);
        }
        let start = entry.offset as usize;
        let whole = &bytes[start..start + entry.entry_bytes as usize];
        let header_bytes = crate::format::entry_header_bytes_from_first_byte(whole[0]);
        for ((data, builder), _) in parts.iter_mut().zip(&placed).filter(|(_, &keep)| keep) {
            builder.add_header(&whole[..header_bytes]);
            data.extend_from_slice(whole);
        }
    }
    parts
        .into_iter()
        .map(|(data, builder)| {
            let length = u32::try_from(data.len()).map_err(|_| FormatError::Truncated)?;
            let certificate = builder.certificate(length);
            Ok((data, certificate))
        })
        .collect()
}

/// What a verified replica of a segment says about its log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedReplica {
    /// The log digest the segment holds, if it is a head (heads start with header, digest,
    /// safe version; survivors and compacted copies hold none).
    pub digest: Option<Vec<stratus_types::SegmentId>>,
    /// The live data per table the segment records, if it is a head written since heads
    /// carry TABLE_STATS (older heads hold none).
    pub table_stats: Option<crate::format::TableStats>,
    /// Entries in the certified prefix.
    pub entries: u64,
}

/// Verifies a replica of segment `segment_id` of the log `log_id` before recovery uses it:
/// the certificate, every entry's checksum, and a segment header naming that log and segment.
/// A replica that fails any check is refused whole (read another one).
pub fn verify_replica(
    bytes: &[u8],
    certificate: &Certificate,
    log_id: stratus_types::ServerId,
    segment_id: stratus_types::SegmentId,
) -> Result<VerifiedReplica, String> {
    let iterator = SegmentIterator::new(bytes, certificate).map_err(|error| error.to_string())?;
    let mut verified = VerifiedReplica { digest: None, table_stats: None, entries: 0 };
    for entry in iterator {
        let entry = entry.map_err(|error| format!("entry {}: {error}", verified.entries))?;
        match entry.entry {
            Entry::SegmentHeader(header)
                if header.log_id != log_id || header.segment_id != segment_id =>
            {
                return Err(format!(
                    "the replica's header names segment {} of log {}, not {segment_id} of {log_id}",
                    header.segment_id, header.log_id
                ));
            }
            Entry::LogDigest(listed) if verified.digest.is_none() => {
                verified.digest = Some(listed);
            }
            Entry::TableStats(statistics) if verified.table_stats.is_none() => {
                verified.table_stats = Some(statistics);
            }
            _ => {}
        }
        verified.entries += 1;
    }
    if verified.entries == 0 {
        return Err("the replica certifies no entry, not even its header".to_string());
    }
    Ok(verified)
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
            let entry = match header.entry_type {
                EntryType::Object if self.objects_verified => {
                    Entry::Object(crate::format::decode_object_unverified(content)?)
                }
                entry_type => decode_entry(entry_type, content)?,
            };
            let item = IteratedEntry {
                offset: self.position as u32,
                entry_type: header.entry_type,
                entry_bytes: (content_end - self.position) as u32,
                content,
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
