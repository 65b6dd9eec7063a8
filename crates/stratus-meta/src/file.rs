//! [`FileMetaStore`]: the production store, an in-memory map made durable by an append-only,
//! checksummed, fsynced log file, compacted by rewriting the whole state.
//!
//! The file format and the crash rules are specified in docs/design/meta-store-format.md.
//! Every rule here exists so that a batch acknowledged by [`MetaStore::apply`] survives any
//! crash, and so that opening the store either recovers exactly the acknowledged batches (plus
//! possibly the one that was in flight) or refuses to start.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::format::{self, HEADER_BYTES, RECORD_HEADER_BYTES};
use crate::{
    apply_to_map, scan_map, validate_batch, MetaError, MetaOperation, MetaStore, BATCH_BYTES_MAX,
};

/// Name of the log file inside the store's directory.
pub const LOG_FILE_NAME: &str = "meta.log";

/// Name of the file a compaction (or the creation of a new store) writes before renaming it
/// over [`LOG_FILE_NAME`]. One found on open is an unfinished attempt and is deleted.
pub const TEMPORARY_FILE_NAME: &str = "meta.log.tmp";

/// The log is never compacted below this size: rewriting a tiny state often gains nothing.
const COMPACTION_FLOOR_BYTES: u64 = 1024 * 1024;

/// The log is compacted once it is more than this many times the size of a fresh snapshot,
/// which bounds both the disk used and the replay time to a constant factor of the state.
const COMPACTION_STATE_MULTIPLE: u64 = 4;

/// What [`FileMetaStore::open`] found in the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Records replayed to rebuild the state (after a compaction, the snapshot's records).
    pub records_replayed: u64,
    /// Bytes of a torn, never-acknowledged append that were cut off the end of the log.
    pub torn_tail_bytes_discarded: u64,
}

/// A [`MetaStore`] whose whole state lives in memory and whose durability comes from the log
/// file `meta.log` in one directory.
///
/// Every call holds one lock, including `apply` while it waits for fsync: the coordinator
/// changes metadata rarely and reads it from its own caches, so simplicity wins over
/// concurrency here. Only one process may open a directory at a time (not enforced: the
/// coordinator is a single process by design).
#[derive(Debug)]
pub struct FileMetaStore {
    directory: PathBuf,
    inner: Mutex<Inner>,
}

/// The state behind the lock.
#[derive(Debug)]
struct Inner {
    map: BTreeMap<String, Vec<u8>>,
    /// The open log, positioned at its end; every record is appended here.
    log: File,
    /// Current length of the log file.
    log_bytes: u64,
    /// Sum of the encoded sizes of the map's entries as put operations, kept up to date so
    /// that deciding whether to compact costs nothing.
    entries_bytes: u64,
    /// Set when a write or fsync failed: whether that batch reached the disk is unknown, so no
    /// later call may pretend to know the state.
    poisoned: Option<String>,
    /// After a compaction failed (before its rename, so harmlessly), the log length at which to
    /// try again, so a persistent failure (a full disk) does not make every apply rewrite the
    /// state.
    compaction_retry_bytes: u64,
}

impl FileMetaStore {
    /// Opens the store in `directory`, creating the directory and an empty log if needed, and
    /// replays the log.
    ///
    /// A torn final record (the append a crash interrupted, never acknowledged) is logged,
    /// cut off and counted in [`OpenReport::torn_tail_bytes_discarded`]. Any other damage —
    /// a bad header, a bad record followed by valid ones, a valid record that does not decode —
    /// fails with [`MetaError::Corrupt`]: acknowledged data would be lost, so an operator must
    /// look.
    pub fn open(directory: &Path) -> Result<(FileMetaStore, OpenReport), MetaError> {
        fs::create_dir_all(directory)?;
        let log_path = directory.join(LOG_FILE_NAME);
        let temporary_path = directory.join(TEMPORARY_FILE_NAME);
        // A temporary file was never renamed into place, so it holds nothing that meta.log does
        // not; removing it keeps a crash mid-compaction from leaking disk.
        match fs::remove_file(&temporary_path) {
            Ok(()) => {
                tracing::info!(path = %temporary_path.display(), "removed an unfinished compaction")
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(error.into()),
        }
        match fs::metadata(&log_path) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // Created through a renamed temporary file, so that a crash can never leave a
                // meta.log with a partial header (which open would have to call damage).
                write_whole_log(directory, &format::encode_header())?;
                tracing::info!(path = %log_path.display(), "created an empty metadata log");
            }
            Err(error) => return Err(error.into()),
        }

        let contents = fs::read(&log_path)?;
        let mut map = BTreeMap::new();
        let replay = format::replay(&contents, |batch| apply_to_map(&mut map, &batch))?;
        drop(contents);
        let log = OpenOptions::new().append(true).open(&log_path)?;
        if replay.torn_tail_bytes > 0 {
            tracing::warn!(
                path = %log_path.display(),
                offset = replay.good_bytes,
                bytes = replay.torn_tail_bytes,
                "discarding a torn final record of the metadata log (a write a crash interrupted; \
                 it was never acknowledged)"
            );
            // Cut before appending anything: a new record after the torn bytes would turn them
            // into mid-file damage on the next open.
            log.set_len(replay.good_bytes)?;
            log.sync_all()?;
        }
        let entries_bytes = map.iter().map(|(key, value)| entry_bytes(key, value)).sum();
        let store = FileMetaStore {
            directory: directory.to_path_buf(),
            inner: Mutex::new(Inner {
                map,
                log,
                log_bytes: replay.good_bytes,
                entries_bytes,
                poisoned: None,
                compaction_retry_bytes: 0,
            }),
        };
        let report = OpenReport {
            records_replayed: replay.records,
            torn_tail_bytes_discarded: replay.torn_tail_bytes,
        };
        Ok((store, report))
    }

    /// The directory this store keeps its files in.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// Locks the state, refusing if the store is poisoned (an earlier failure) or a thread
    /// panicked while holding the lock (the state may be half-updated).
    fn lock(&self) -> Result<MutexGuard<'_, Inner>, MetaError> {
        let inner = self.inner.lock().map_err(|_| MetaError::Poisoned {
            reason: "a thread panicked while using the store".to_string(),
        })?;
        if let Some(reason) = &inner.poisoned {
            return Err(MetaError::Poisoned { reason: reason.clone() });
        }
        Ok(inner)
    }

    /// Rewrites the log as a snapshot of the state if it has grown enough. A failure before the
    /// rename only delays compaction; a failure after it poisons the store, because the new log
    /// might not survive a crash and later appends to it would then be lost.
    fn compact_if_due(&self, inner: &mut Inner) {
        let snapshot_bytes = (HEADER_BYTES + RECORD_HEADER_BYTES + 4) as u64 + inner.entries_bytes;
        let threshold = COMPACTION_FLOOR_BYTES.max(COMPACTION_STATE_MULTIPLE * snapshot_bytes);
        if inner.log_bytes <= threshold || inner.log_bytes < inner.compaction_retry_bytes {
            return;
        }
        let old_bytes = inner.log_bytes;
        match self.compact(inner) {
            Ok(()) => tracing::debug!(
                old_bytes,
                new_bytes = inner.log_bytes,
                "compacted the metadata log"
            ),
            Err(CompactionFailure::BeforeRename(error)) => {
                tracing::warn!(%error, "metadata log compaction failed; the log is unchanged");
                let _ = fs::remove_file(self.directory.join(TEMPORARY_FILE_NAME));
                inner.compaction_retry_bytes = old_bytes + COMPACTION_FLOOR_BYTES;
            }
            Err(CompactionFailure::AfterRename(error)) => {
                tracing::error!(%error, "metadata log compaction failed after its rename");
                inner.poisoned = Some(format!("compaction failed after its rename: {error}"));
            }
        }
    }

    /// Writes the whole state to the temporary file, fsyncs it, renames it over the log and
    /// fsyncs the directory; then appends go to the new file.
    fn compact(&self, inner: &mut Inner) -> Result<(), CompactionFailure> {
        let temporary_path = self.directory.join(TEMPORARY_FILE_NAME);
        let before = CompactionFailure::BeforeRename;
        let mut file = File::create(&temporary_path).map_err(before)?;
        file.write_all(&format::encode_header()).map_err(before)?;
        let written = HEADER_BYTES as u64
            + write_snapshot_records(&mut file, &inner.map, BATCH_BYTES_MAX as u64)
                .map_err(before)?;
        file.sync_all().map_err(before)?;
        fs::rename(&temporary_path, self.directory.join(LOG_FILE_NAME)).map_err(before)?;
        // From here on meta.log names the new file, so a failure cannot be undone.
        sync_directory(&self.directory).map_err(CompactionFailure::AfterRename)?;
        // The handle still refers to the renamed file and sits at its end, so later appends
        // land in the new log.
        inner.log = file;
        inner.log_bytes = written;
        inner.compaction_retry_bytes = 0;
        Ok(())
    }
}

/// Why a compaction failed, and so whether the store can go on.
enum CompactionFailure {
    /// Nothing changed: meta.log is still the old, complete log.
    BeforeRename(io::Error),
    /// meta.log was replaced, but the replacement may not be durable.
    AfterRename(io::Error),
}

impl MetaStore for FileMetaStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.lock()?.map.get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        Ok(scan_map(&self.lock()?.map, prefix))
    }

    fn apply(&self, batch: &[MetaOperation]) -> Result<(), MetaError> {
        validate_batch(batch)?;
        let mut guard = self.lock()?;
        let inner = &mut *guard;
        if batch.is_empty() {
            // Nothing to make durable, and no record keeps the log free of no-ops.
            return Ok(());
        }
        let mut record =
            Vec::with_capacity(RECORD_HEADER_BYTES + crate::batch_encoded_bytes(batch) as usize);
        format::append_record(&mut record, batch);
        // sync_data is enough: it flushes the data and the file length (needed to read the
        // data back), just not timestamps.
        if let Err(error) = inner.log.write_all(&record).and_then(|()| inner.log.sync_data()) {
            // After a failed fsync the kernel may have dropped the dirty pages and a retry can
            // falsely succeed, and after a failed write part of the record may be on disk. Either
            // way the truth is only learned by reopening, so stop here.
            tracing::error!(%error, "appending to the metadata log failed; the store is now unusable");
            inner.poisoned = Some(format!("appending a batch to the log failed: {error}"));
            return Err(MetaError::Io(error));
        }
        inner.log_bytes += record.len() as u64;
        for operation in batch {
            let key = operation.key();
            if let Some(old) = inner.map.get(key) {
                inner.entries_bytes -= entry_bytes(key, old);
            }
            if let MetaOperation::Put { key, value } = operation {
                inner.entries_bytes += entry_bytes(key, value);
            }
            apply_to_map(&mut inner.map, std::slice::from_ref(operation));
        }
        self.compact_if_due(inner);
        Ok(())
    }
}

/// Writes `map` as a sequence of records of put operations, each payload at most
/// `payload_limit` bytes (or one entry, if a single entry is larger), and returns the bytes
/// written.
///
/// The state can be larger than one record may be, so it is split; that is still atomic
/// because the file only becomes the log, whole, by the rename that follows.
fn write_snapshot_records(
    out: &mut impl Write,
    map: &BTreeMap<String, Vec<u8>>,
    payload_limit: u64,
) -> io::Result<u64> {
    let mut written = 0u64;
    let mut chunk: Vec<MetaOperation> = Vec::new();
    let mut chunk_bytes = 4u64;
    let mut record = Vec::new();
    let mut entries = map.iter().peekable();
    while let Some((key, value)) = entries.next() {
        chunk.push(MetaOperation::Put { key: key.clone(), value: value.clone() });
        chunk_bytes += entry_bytes(key, value);
        let next_fits = entries
            .peek()
            .is_some_and(|(key, value)| chunk_bytes + entry_bytes(key, value) <= payload_limit);
        if !next_fits {
            record.clear();
            format::append_record(&mut record, &chunk);
            out.write_all(&record)?;
            written += record.len() as u64;
            chunk.clear();
            chunk_bytes = 4;
        }
    }
    Ok(written)
}

/// Encoded size of one map entry written as a put (see [`crate::batch_encoded_bytes`]).
fn entry_bytes(key: &str, value: &[u8]) -> u64 {
    1 + 4 + key.len() as u64 + 4 + value.len() as u64
}

/// Makes `contents` the whole of the log in `directory`, atomically and durably: write a
/// temporary file, fsync it, rename it over the log, fsync the directory.
fn write_whole_log(directory: &Path, contents: &[u8]) -> io::Result<()> {
    let temporary_path = directory.join(TEMPORARY_FILE_NAME);
    let mut file = File::create(&temporary_path)?;
    file.write_all(contents)?;
    file.sync_all()?;
    drop(file);
    fs::rename(&temporary_path, directory.join(LOG_FILE_NAME))?;
    sync_directory(directory)
}

/// Fsyncs a directory, making a rename or a file creation in it durable.
fn sync_directory(directory: &Path) -> io::Result<()> {
    File::open(directory)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state bigger than one record must be split into several records that replay to the
    /// same state; with the real 64 MiB limit that needs a huge state, so the limit is shrunk.
    #[test]
    fn snapshots_split_into_records_that_replay_to_the_same_state() {
        let map: BTreeMap<String, Vec<u8>> = (0..50u32)
            .map(|index| (format!("key/{index}"), vec![index as u8; index as usize]))
            .collect();
        for payload_limit in [1, 60, 200, 10_000] {
            let mut log = format::encode_header().to_vec();
            let written = write_snapshot_records(&mut log, &map, payload_limit).expect("write");
            assert_eq!(written as usize + HEADER_BYTES, log.len());
            let mut replayed = BTreeMap::new();
            let replay = format::replay(&log, |batch| {
                let payload: u64 = crate::batch_encoded_bytes(&batch);
                assert!(payload <= payload_limit.max(4 + 1 + 4 + 6 + 4 + 49), "{payload}");
                apply_to_map(&mut replayed, &batch);
            })
            .expect("replay");
            assert_eq!(replayed, map, "limit {payload_limit}");
            assert_eq!(replay.torn_tail_bytes, 0);
            if payload_limit <= 200 {
                assert!(replay.records > 1, "limit {payload_limit} gave one record");
            } else {
                assert_eq!(replay.records, 1);
            }
        }
        let mut empty = Vec::new();
        assert_eq!(write_snapshot_records(&mut empty, &BTreeMap::new(), 100).expect("write"), 0);
    }
}
