//! Runs the conformance suite against both implementations in this crate.

use stratus_meta::{conformance, FileMetaStore, MemoryMetaStore};

#[test]
fn memory_store_conforms() {
    conformance::run_all(&mut MemoryMetaStore::new);
}

#[test]
fn file_store_conforms() {
    // Directories are kept until the end of the test so each store's files stay valid.
    let mut directories = Vec::new();
    conformance::run_all(&mut || {
        let directory = tempfile::tempdir().expect("temporary directory");
        let (store, report) = FileMetaStore::open(directory.path()).expect("open fresh store");
        assert_eq!(report.records_replayed, 0);
        directories.push(directory);
        store
    });
}

#[test]
fn file_store_conforms_after_reopen() {
    // The same suite on a store that was created, closed and reopened, so that replaying a log
    // with only a header is covered too.
    let mut directories = Vec::new();
    conformance::run_all(&mut || {
        let directory = tempfile::tempdir().expect("temporary directory");
        drop(FileMetaStore::open(directory.path()).expect("create"));
        let (store, _) = FileMetaStore::open(directory.path()).expect("reopen");
        directories.push(directory);
        store
    });
}
