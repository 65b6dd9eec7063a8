//! FileMetaStore durability: reopening, compaction, torn tails, damage detection, and a
//! property test against a model map.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use proptest::prelude::*;
use stratus_meta::{
    FileMetaStore, MetaError, MetaOperation, MetaStore, OpenReport, LOG_FILE_NAME,
    TEMPORARY_FILE_NAME,
};
use tempfile::TempDir;

/// Size of the file header (docs/design/meta-store-format.md).
const HEADER_BYTES: usize = 16;

fn put(key: &str, value: &[u8]) -> MetaOperation {
    MetaOperation::Put { key: key.to_string(), value: value.to_vec() }
}

fn delete(key: &str) -> MetaOperation {
    MetaOperation::Delete { key: key.to_string() }
}

fn open(directory: &Path) -> (FileMetaStore, OpenReport) {
    FileMetaStore::open(directory).unwrap_or_else(|error| panic!("open failed: {error}"))
}

fn log_path(directory: &Path) -> std::path::PathBuf {
    directory.join(LOG_FILE_NAME)
}

fn log_length(directory: &Path) -> u64 {
    fs::metadata(log_path(directory)).expect("log metadata").len()
}

fn everything(store: &FileMetaStore) -> BTreeMap<String, Vec<u8>> {
    store.scan_prefix("").expect("scan").into_iter().collect()
}

fn apply_to_model(model: &mut BTreeMap<String, Vec<u8>>, batch: &[MetaOperation]) {
    for operation in batch {
        match operation {
            MetaOperation::Put { key, value } => {
                model.insert(key.clone(), value.clone());
            }
            MetaOperation::Delete { key } => {
                model.remove(key);
            }
        }
    }
}

/// A fresh directory whose log is exactly `bytes`.
fn directory_with_log(bytes: &[u8]) -> TempDir {
    let directory = tempfile::tempdir().expect("temporary directory");
    fs::write(log_path(directory.path()), bytes).expect("write log");
    directory
}

/// A record around `payload`, built independently of the crate's encoder.
fn record(payload: &[u8]) -> Vec<u8> {
    let mut bytes = b"MREC".to_vec();
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

fn header() -> Vec<u8> {
    let mut bytes = b"STRATMET".to_vec();
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes
}

/// A log of three batches written through the store.
struct SampleLog {
    /// The whole file.
    bytes: Vec<u8>,
    /// Where each record starts, then where the last one ends.
    boundaries: Vec<usize>,
    /// The model state after 0, 1, 2 and 3 batches.
    states: Vec<BTreeMap<String, Vec<u8>>>,
}

fn three_batch_log() -> SampleLog {
    let directory = tempfile::tempdir().expect("temporary directory");
    let (store, _) = open(directory.path());
    let batches = [
        vec![put("server/1", b"first server"), put("counter", &[1, 0, 0, 0])],
        vec![put("table/a", b"tablets of a"), delete("counter"), put("counter", &[2])],
        vec![put("server/1", b"crashed"), delete("table/a")],
    ];
    let mut boundaries = vec![log_length(directory.path()) as usize];
    let mut states = vec![BTreeMap::new()];
    let mut model = BTreeMap::new();
    for batch in &batches {
        store.apply(batch).expect("apply");
        apply_to_model(&mut model, batch);
        boundaries.push(log_length(directory.path()) as usize);
        states.push(model.clone());
    }
    assert_eq!(everything(&store), model);
    drop(store);
    SampleLog { bytes: fs::read(log_path(directory.path())).expect("read log"), boundaries, states }
}

#[test]
fn new_store_writes_only_the_header() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let nested = directory.path().join("a").join("b");
    let (store, report) = open(&nested);
    assert_eq!(report, OpenReport::default());
    assert_eq!(store.directory(), nested.as_path());
    assert_eq!(fs::read(log_path(&nested)).expect("read"), header());
    assert!(!nested.join(TEMPORARY_FILE_NAME).exists());
}

#[test]
fn reopen_keeps_every_applied_batch() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let mut model = BTreeMap::new();
    let mut applied = 0u64;
    for round in 0..5u32 {
        let (store, report) = open(directory.path());
        assert_eq!(report.records_replayed, applied);
        assert_eq!(report.torn_tail_bytes_discarded, 0);
        assert_eq!(everything(&store), model, "state after reopen {round}");
        for index in 0..10u32 {
            let batch = vec![
                put(&format!("key/{}", (round * 7 + index) % 13), &round.to_le_bytes()),
                delete(&format!("key/{}", (round + index * 3) % 13)),
                put(&format!("round/{round}"), &index.to_le_bytes()),
            ];
            store.apply(&batch).expect("apply");
            apply_to_model(&mut model, &batch);
            applied += 1;
        }
        // Empty batches write nothing, so they are not replayed either.
        store.apply(&[]).expect("empty batch");
    }
    let (store, report) = open(directory.path());
    assert_eq!(report.records_replayed, applied);
    assert_eq!(everything(&store), model);
}

#[test]
fn compaction_shrinks_the_log_and_keeps_the_state() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let (store, _) = open(directory.path());
    let mut model = BTreeMap::new();
    let mut largest_log = 0;
    // 8 keys of ~8 KiB each are ~64 KiB of state, so the log is compacted each time it passes
    // 1 MiB; 600 batches of ~8 KiB (~4.8 MiB) force several compactions.
    for index in 0..600u32 {
        let value = vec![(index % 251) as u8; 8 * 1024 + index as usize % 17];
        let mut batch = vec![put(&format!("slot/{}", index % 8), &value)];
        if index % 5 == 0 {
            batch.push(delete(&format!("slot/{}", (index + 3) % 8)));
        }
        batch.push(put("last", &index.to_le_bytes()));
        store.apply(&batch).expect("apply");
        apply_to_model(&mut model, &batch);
        largest_log = largest_log.max(log_length(directory.path()));
    }
    assert_eq!(everything(&store), model);
    // Without compaction the log would be ~4.8 MiB.
    assert!(largest_log <= 1024 * 1024 + 16 * 1024, "log grew to {largest_log} bytes");
    assert!(!directory.path().join(TEMPORARY_FILE_NAME).exists());
    drop(store);

    let (store, report) = open(directory.path());
    assert_eq!(everything(&store), model);
    assert!(report.records_replayed < 600, "replayed {} records", report.records_replayed);
    assert_eq!(report.torn_tail_bytes_discarded, 0);
    // The compacted log is still appendable and replayable.
    store.apply(&[put("after", b"compaction")]).expect("apply after reopen");
    apply_to_model(&mut model, &[put("after", b"compaction")]);
    drop(store);
    assert_eq!(everything(&open(directory.path()).0), model);
}

#[test]
fn a_cut_last_record_is_discarded_at_every_length() {
    let SampleLog { bytes: log, boundaries, states } = three_batch_log();
    let last_start = boundaries[2];
    let last_end = boundaries[3];
    assert_eq!(last_end, log.len());
    for cut in last_start..last_end {
        let directory = directory_with_log(&log[..cut]);
        let (store, report) = open(directory.path());
        assert_eq!(report.records_replayed, 2, "cut at {cut}");
        assert_eq!(report.torn_tail_bytes_discarded, (cut - last_start) as u64, "cut at {cut}");
        assert_eq!(everything(&store), states[2], "cut at {cut}");
        assert_eq!(log_length(directory.path()), last_start as u64, "file not truncated");
        // Appends after the truncation must replay cleanly (no garbage left between records).
        store.apply(&[put("after", b"recovery")]).expect("apply after recovery");
        drop(store);
        let (store, report) = open(directory.path());
        assert_eq!(report.torn_tail_bytes_discarded, 0);
        assert_eq!(report.records_replayed, 3);
        let mut expected = states[2].clone();
        expected.insert("after".to_string(), b"recovery".to_vec());
        assert_eq!(everything(&store), expected, "cut at {cut}");
    }
}

#[test]
fn a_cut_first_record_leaves_an_empty_store() {
    let SampleLog { bytes: log, boundaries, states } = three_batch_log();
    for cut in boundaries[0] + 1..boundaries[1] {
        let directory = directory_with_log(&log[..cut]);
        let (store, report) = open(directory.path());
        assert_eq!(report.records_replayed, 0);
        assert_eq!(report.torn_tail_bytes_discarded, (cut - boundaries[0]) as u64);
        assert_eq!(everything(&store), states[0]);
    }
}

#[test]
fn garbage_after_the_last_record_is_discarded() {
    let SampleLog { bytes: log, boundaries: _, states } = three_batch_log();
    let complete_record = record(&[0, 0, 0, 0]);
    let mut wrong_checksum = complete_record.clone();
    wrong_checksum[8] ^= 1;
    let tails: Vec<(&str, Vec<u8>)> = vec![
        ("zeros, as a file system may leave after a crash", vec![0; 4096]),
        ("pseudo-random bytes", (0..1000u32).map(|index| (index * 7919 % 251) as u8).collect()),
        ("a lone marker", b"MREC".to_vec()),
        ("a record header claiming a huge payload", {
            let mut bytes = b"MREC".to_vec();
            bytes.extend_from_slice(&u32::MAX.to_le_bytes());
            bytes.extend_from_slice(&[0; 4]);
            bytes
        }),
        ("a whole record with a wrong checksum", wrong_checksum),
        ("a record missing its last byte", complete_record[..complete_record.len() - 1].to_vec()),
    ];
    for (what, tail) in tails {
        let mut bytes = log.clone();
        bytes.extend_from_slice(&tail);
        let directory = directory_with_log(&bytes);
        let (store, report) = open(directory.path());
        assert_eq!(report.records_replayed, 3, "{what}");
        assert_eq!(report.torn_tail_bytes_discarded, tail.len() as u64, "{what}");
        assert_eq!(everything(&store), states[3], "{what}");
        assert_eq!(log_length(directory.path()), log.len() as u64, "{what}");
    }
}

#[test]
fn damage_followed_by_valid_records_is_corrupt() {
    let SampleLog { bytes: log, boundaries, states: _ } = three_batch_log();
    // Every byte of the middle record: marker, length, checksum and payload.
    for position in boundaries[1]..boundaries[2] {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bytes = log.clone();
            bytes[position] ^= flip;
            let directory = directory_with_log(&bytes);
            match FileMetaStore::open(directory.path()) {
                Err(MetaError::Corrupt { offset, .. }) => {
                    assert_eq!(offset, boundaries[1] as u64, "byte {position} ^ {flip:#x}")
                }
                other => panic!("byte {position} ^ {flip:#x}: expected Corrupt, got {other:?}"),
            }
            // Refusing must not have "repaired" anything.
            assert_eq!(fs::read(log_path(directory.path())).expect("read"), bytes);
        }
    }
}

#[test]
fn garbage_between_records_is_corrupt() {
    let SampleLog { bytes: log, boundaries, states: _ } = three_batch_log();
    let mut bytes = log[..boundaries[2]].to_vec();
    bytes.extend_from_slice(&[0; 100]);
    bytes.extend_from_slice(&log[boundaries[2]..]);
    let directory = directory_with_log(&bytes);
    let result = FileMetaStore::open(directory.path());
    assert!(
        matches!(result, Err(MetaError::Corrupt { offset, .. }) if offset == boundaries[2] as u64),
        "{result:?}"
    );
}

#[test]
fn a_valid_record_that_does_not_decode_is_corrupt() {
    let mut bytes = header();
    // Correct checksum, but operation kind 9 does not exist: not a torn write.
    bytes.extend_from_slice(&record(&[1, 0, 0, 0, 9, 0, 0, 0, 0]));
    let directory = directory_with_log(&bytes);
    let result = FileMetaStore::open(directory.path());
    assert!(
        matches!(result, Err(MetaError::Corrupt { offset, .. }) if offset == HEADER_BYTES as u64),
        "{result:?}"
    );
}

#[test]
fn a_bad_header_is_corrupt() {
    let SampleLog { bytes: log, boundaries: _, states: _ } = three_batch_log();
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty file", Vec::new()),
        ("short header", log[..5].to_vec()),
        ("header without records, cut", log[..HEADER_BYTES - 1].to_vec()),
    ];
    let mut wrong_magic = log.clone();
    wrong_magic[0] = b's';
    cases.push(("wrong magic", wrong_magic));
    let mut wrong_version = log.clone();
    wrong_version[8] = 2;
    cases.push(("version 2", wrong_version));
    let mut reserved = log.clone();
    reserved[15] = 1;
    cases.push(("reserved bits set", reserved));
    for (what, bytes) in cases {
        let directory = directory_with_log(&bytes);
        let result = FileMetaStore::open(directory.path());
        assert!(matches!(result, Err(MetaError::Corrupt { .. })), "{what}: {result:?}");
        let message = result.expect_err("corrupt").to_string();
        assert!(message.contains("corrupt"), "{what}: {message}");
    }
}

#[test]
fn a_leftover_temporary_file_is_ignored_and_removed() {
    let SampleLog { bytes: log, boundaries: _, states } = three_batch_log();
    let directory = directory_with_log(&log);
    fs::write(directory.path().join(TEMPORARY_FILE_NAME), b"STRATMET half a compaction")
        .expect("write temporary");
    let (store, report) = open(directory.path());
    assert_eq!(report.records_replayed, 3);
    assert_eq!(everything(&store), states[3]);
    assert!(!directory.path().join(TEMPORARY_FILE_NAME).exists());
}

#[test]
fn oversized_batches_leave_the_log_untouched() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let (store, _) = open(directory.path());
    store.apply(&[put("k", b"v")]).expect("apply");
    let before = fs::read(log_path(directory.path())).expect("read");
    let result = store.apply(&[put("ok", b""), put(&"x".repeat(5000), b"")]);
    assert!(matches!(result, Err(MetaError::TooLarge { what: "key", bytes: 5000 })));
    assert_eq!(fs::read(log_path(directory.path())).expect("read"), before);
    // A rejected batch does not poison the store.
    store.apply(&[put("k2", b"v2")]).expect("apply after rejection");
}

/// Keys from a small alphabet so batches overwrite and delete each other's keys often.
fn operation_strategy() -> impl Strategy<Value = MetaOperation> {
    let key = prop::sample::select(vec!["a", "a/b", "a/c", "b", "ba", "", "é", "z/1", "z/2"]);
    prop_oneof![
        3 => (key.clone(), prop::collection::vec(any::<u8>(), 0..40))
            .prop_map(|(key, value)| put(key, &value)),
        1 => key.prop_map(delete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_batches_with_reopens_match_a_model(
        batches in prop::collection::vec(prop::collection::vec(operation_strategy(), 0..6), 1..12)
    ) {
        let directory = tempfile::tempdir().expect("temporary directory");
        let mut model = BTreeMap::new();
        for batch in &batches {
            let (store, report) = open(directory.path());
            prop_assert_eq!(report.torn_tail_bytes_discarded, 0);
            prop_assert_eq!(everything(&store), model.clone());
            store.apply(batch).expect("apply");
            apply_to_model(&mut model, batch);
            prop_assert_eq!(everything(&store), model.clone());
            for prefix in ["a", "a/", "z/", "é", "q"] {
                let expected: Vec<(String, Vec<u8>)> = model
                    .iter()
                    .filter(|(key, _)| key.starts_with(prefix))
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                prop_assert_eq!(store.scan_prefix(prefix).expect("scan"), expected);
            }
        }
        let (store, _) = open(directory.path());
        prop_assert_eq!(everything(&store), model);
    }
}
