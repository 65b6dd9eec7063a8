//! Log segments of arbitrary bytes: the validating iterator, every entry decoder and recovery's
//! replay must return errors, never panic, and every entry that decodes must survive encode then
//! decode unchanged.
//!
//! The first input byte picks how the certificate is made. Taken from the input, it almost never
//! matches, which exercises the certificate check; computed over the bytes' own headers, it lets
//! the fuzzer reach the entry decoders behind the check (recovery trusts a certificate only as
//! far as its CRC, so a corrupt segment with a matching certificate is a real case).

#![no_main]

use libfuzzer_sys::fuzz_target;
use stratus_log::format::{
    decode_completion, decode_entry, decode_entry_header, decode_log_digest, decode_object, decode_safe_version,
    decode_table_stats, decode_tombstone, encode_log_digest, encode_object, encode_safe_version,
    encode_table_stats, encode_tombstone, tombstone_segment_id, Certificate, CertificateBuilder, Entry, EntryType, SegmentHeader,
    CERTIFICATE_BYTES,
};
use stratus_log::iterator::SegmentIterator;
use stratus_store::{ObjectStore, ReplayError, StoreConfig, WallTime};
use stratus_types::ServerId;

/// Bounds the header walk that computes a certificate (each step consumes at least 2 bytes, so
/// this is never reached by inputs libFuzzer generates; it documents the bound).
const HEADER_WALK_STEPS_MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode & 1 == 0 {
        let Some(certificate_bytes) = rest.get(..CERTIFICATE_BYTES) else { return };
        let certificate = Certificate::from_bytes(certificate_bytes).expect("8 bytes");
        iterate(&rest[CERTIFICATE_BYTES..], &certificate);
    } else {
        let certificate = certificate_of_prefix(rest);
        iterate(rest, &certificate);
    }
    if let Some((&type_code, content)) = rest.split_first() {
        if let Some(entry_type) = EntryType::from_code(type_code % 11) {
            check_round_trip(entry_type, content);
        }
    }
});

fn iterate(segment: &[u8], certificate: &Certificate) {
    replay(segment, certificate);
    partition(segment, certificate);
    // The iterator for bytes verified before must not panic on bytes that were not.
    if let Ok(trusting) = SegmentIterator::of_verified(segment, certificate) {
        for item in trusting {
            if item.is_err() {
                break;
            }
        }
    }
    let Ok(iterator) = SegmentIterator::new(segment, certificate) else { return };
    let mut entries_bytes = 0u64;
    for item in iterator {
        match item {
            Ok(entry) => {
                entries_bytes += u64::from(entry.entry_bytes);
                assert!(entries_bytes <= u64::from(certificate.segment_length));
            }
            Err(_) => break,
        }
    }
}

/// A backup's cut of the segment into recovery partitions (here by entry kind and table
/// parity): refused whole or cut into parts that each verify as a segment of their own, with
/// the header in every part (a segment that verifies starts with one).
fn partition(segment: &[u8], certificate: &Certificate) {
    let place = |entry: &Entry<'_>, parts: &mut [bool]| match entry {
        Entry::Object(object) => parts[(object.table.0 % 2) as usize] = true,
        Entry::Tombstone(_) => parts[2] = true,
        Entry::SafeVersion(_) => parts.fill(true),
        _ => {}
    };
    let Ok(parts) = stratus_log::partition_segment(segment, certificate, 3, &place) else {
        return;
    };
    for (bytes, part_certificate) in &parts {
        let entries = SegmentIterator::new(bytes, part_certificate)
            .expect("a part's certificate matches its bytes")
            .map(|entry| entry.expect("a part's entries verify"))
            .count();
        if certificate.segment_length > 0 {
            assert!(entries >= 1, "every part holds the segment header");
        }
    }
}

/// Recovery's replay of the segment into an empty store: refused with an error or replayed,
/// never a panic, and never half a replay of a segment it refuses.
fn replay(segment: &[u8], certificate: &Certificate) {
    let mut config = StoreConfig::for_testing();
    config.log_bytes = 1536 << 10;
    // The auto tables' DRAM budget is a share of the log, so it follows the log's size.
    config.auto_dram_bytes_max = config.log_bytes / stratus_store::AUTO_DRAM_SHARE_OF_LOG_DIVISOR;
    config.segment_bytes = 256 << 10;
    config.seglet_bytes = 16 << 10;
    config.value_bytes_max = 24 << 10;
    let store = ObjectStore::new(config, ServerId(1)).expect("a valid configuration");
    let segments = [(segment, *certificate)];
    if let Err(ReplayError::CorruptSegment { .. }) = store.replay(&segments, &|_, _| true, WallTime::from_seconds(1)) {
        assert_eq!(store.statistics().objects_live, 0, "a refused segment left objects behind");
    }
}

/// The certificate of the longest prefix of `segment` whose entry headers parse and stay in
/// bounds, computed the way a writer would.
fn certificate_of_prefix(segment: &[u8]) -> Certificate {
    let mut builder = CertificateBuilder::default();
    let mut position = 0usize;
    for _ in 0..HEADER_WALK_STEPS_MAX {
        let Ok(header) = decode_entry_header(&segment[position..]) else { break };
        let Some(end) = position
            .checked_add(header.header_bytes + header.content_bytes as usize)
            .filter(|&end| end <= segment.len())
        else {
            break;
        };
        builder.add_header(&segment[position..position + header.header_bytes]);
        position = end;
    }
    builder.certificate(u32::try_from(position).expect("fuzz inputs are far below 4 GiB"))
}

fn check_round_trip(entry_type: EntryType, content: &[u8]) {
    // The log reads the segment a tombstone names from its first bytes alone: any bytes give
    // an answer or an error, never a panic, and a valid tombstone's answer is its segment.
    let named = tombstone_segment_id(content);
    let Ok(entry) = decode_entry(entry_type, content) else { return };
    match entry {
        Entry::SegmentHeader(header) => {
            assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header));
        }
        Entry::Object(view) => {
            let encoded =
                encode_object(view.table, view.version, view.timestamp, None, view.key, view.value);
            assert_eq!(decode_object(&encoded), Ok(view));
        }
        Entry::Tombstone(view) => {
            let encoded = encode_tombstone(&view);
            assert_eq!(decode_tombstone(&encoded), Ok(view));
            assert_eq!(named, Ok(view.segment_id));
        }
        Entry::LogDigest(segment_ids) => {
            let encoded = encode_log_digest(&segment_ids);
            assert_eq!(decode_log_digest(&encoded), Ok(segment_ids));
        }
        Entry::SafeVersion(version) => {
            assert_eq!(decode_safe_version(&encode_safe_version(version)), Ok(version));
        }
        Entry::TableStats(statistics) => {
            let encoded = encode_table_stats(&statistics);
            assert_eq!(encoded, content, "TABLE_STATS has one encoding");
            assert_eq!(decode_table_stats(&encoded), Ok(statistics));
        }
        Entry::Completion(record) => {
            // Wider-than-minimal fields decode too, so only the round trip is one-to-one.
            let encoded = record.encode();
            assert!(encoded.as_bytes().len() <= content.len());
            assert_eq!(decode_completion(encoded.as_bytes()), Ok(record));
        }
        Entry::Prepared(view) => {
            let encoded = view.encode();
            assert_eq!(encoded, content, "PREPARED has one encoding");
            assert_eq!(stratus_log::format::decode_prepared(&encoded), Ok(view));
        }
        Entry::PreparedTombstone(record) => {
            let encoded = record.encode();
            assert_eq!(&encoded[..], content, "PREPARED_TOMBSTONE has one encoding");
            assert_eq!(
                stratus_log::format::segment_named_by(EntryType::PreparedTombstone, content),
                Some(record.segment_id)
            );
        }
        Entry::TxParticipants(record) => {
            let encoded = record.encode();
            assert_eq!(encoded, content, "TX_PARTICIPANTS has one encoding");
            assert_eq!(stratus_log::format::decode_tx_participants(&encoded), Ok(record));
        }
    }
}
