//! The coordinator's metadata log with arbitrary contents: `FileMetaStore::open` must refuse or
//! accept it without panicking, and a log it accepts must reopen to the same state (opening cuts
//! a torn tail, and doing so twice must change nothing), and must accept a new batch that a
//! third open then sees.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stratus_meta::{FileMetaStore, MetaOperation, MetaStore, LOG_FILE_NAME};

/// One directory per fuzzing process, reused by every input (a fresh one per input would spend
/// the run creating directories).
fn directory() -> &'static PathBuf {
    static DIRECTORY: OnceLock<PathBuf> = OnceLock::new();
    DIRECTORY.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("stratus-fuzz-meta-{}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create the fuzzing directory");
        path
    })
}

fuzz_target!(|data: &[u8]| {
    let directory = directory();
    std::fs::write(directory.join(LOG_FILE_NAME), data).expect("write the log");
    let Ok((store, _report)) = FileMetaStore::open(directory) else { return };
    let state = store.scan_prefix("").expect("a freshly opened store scans");
    drop(store);

    let (store, report) = FileMetaStore::open(directory).expect("an accepted log reopens");
    assert_eq!(report.torn_tail_bytes_discarded, 0, "the first open already cut the tail");
    assert_eq!(store.scan_prefix("").expect("scan"), state, "state changed across a reopen");
    let batch = [MetaOperation::Put { key: "fuzz/key".to_string(), value: vec![1, 2, 3] }];
    store.apply(&batch).expect("a reopened store accepts a batch");
    drop(store);

    let (store, _report) = FileMetaStore::open(directory).expect("the log reopens after a batch");
    assert_eq!(store.get("fuzz/key").expect("get"), Some(vec![1, 2, 3]));
});
