//! The coordinator's metadata store: a small, durable, ordered map from string keys to byte
//! values, changed only by atomic batches.
//!
//! The coordinator keeps everything it must not forget (server list, table names and ids, the
//! tablet map, id counters) in a [`MetaStore`] and makes every change durable there before it
//! acknowledges it. The trait is deliberately narrow (point read, prefix scan, atomic batch) so
//! that it can be backed by very different systems:
//!
//! - [`MemoryMetaStore`]: a map in memory, for unit tests and the deterministic simulator.
//! - [`FileMetaStore`]: the production store, the whole map in memory plus an append-only,
//!   checksummed, fsynced log file in one directory. Its byte layout and crash rules are
//!   specified in docs/design/meta-store-format.md.
//! - An etcd-backed store is planned; [`conformance`] is the behavioural suite that every
//!   implementation must pass, so the coordinator can rely on identical semantics.
//!
//! Size limits ([`KEY_BYTES_MAX`], [`VALUE_BYTES_MAX`], [`BATCH_BYTES_MAX`]) are part of the
//! contract and are checked by every implementation before anything is applied.

pub mod conformance;
mod error;
mod file;
mod format;
mod memory;

pub use error::MetaError;
pub use file::{FileMetaStore, OpenReport, LOG_FILE_NAME, TEMPORARY_FILE_NAME};
pub use memory::MemoryMetaStore;

/// Largest key, in bytes of UTF-8. Keys are names (`table/<name>`), never bulk data.
pub const KEY_BYTES_MAX: usize = 4 * 1024;

/// Largest value, in bytes. The biggest coordinator value is a table's tablet map.
pub const VALUE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Largest batch, measured as its encoded size (see [`batch_encoded_bytes`]). Bounded so that
/// one record of the file store, and one etcd transaction later, stays a sane size.
pub const BATCH_BYTES_MAX: usize = 64 * 1024 * 1024;

/// A durable, ordered map from string keys to byte values.
///
/// Implementations are shared between threads (`Send + Sync`) and every method takes `&self`;
/// each call is atomic with respect to the others (a reader never sees half a batch).
pub trait MetaStore: Send + Sync + std::fmt::Debug + 'static {
    /// Value of `key`, if present.
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetaError>;

    /// Every (key, value) whose key starts with `prefix`, ascending by key.
    ///
    /// Keys compare byte-wise as UTF-8 (equivalently, by Unicode code point), the order etcd
    /// uses too. The empty prefix returns the whole map.
    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError>;

    /// Applies every operation atomically; when it returns Ok the batch is durable (survives a
    /// crash of the process or the machine); on Err nothing was applied.
    ///
    /// Operations apply in order, so a `Put` then a `Delete` of the same key leaves it absent
    /// and a `Delete` then a `Put` leaves it present. An empty batch is allowed and changes
    /// nothing. A batch over a size limit fails with [`MetaError::TooLarge`] before anything is
    /// touched.
    ///
    /// An I/O failure while making the batch durable is different: the batch is not visible
    /// through this store, but it may or may not have reached the disk, so the store refuses
    /// every later call ([`MetaError::Poisoned`]) and the only way on is to reopen it, which
    /// tells the truth either way.
    fn apply(&self, batch: &[MetaOperation]) -> Result<(), MetaError>;
}

/// One change inside a batch given to [`MetaStore::apply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaOperation {
    /// Sets `key` to `value`, replacing any previous value.
    Put {
        /// The key to set.
        key: String,
        /// Its new value.
        value: Vec<u8>,
    },
    /// Removes `key`; removing an absent key is not an error.
    Delete {
        /// The key to remove.
        key: String,
    },
}

impl MetaOperation {
    /// The key this operation changes.
    pub fn key(&self) -> &str {
        match self {
            MetaOperation::Put { key, .. } | MetaOperation::Delete { key } => key,
        }
    }
}

/// The size of `batch` in the file store's batch encoding (docs/design/meta-store-format.md):
/// a 4-byte count, then per operation 1 kind byte, 4 length bytes and the key, and for a put 4
/// more length bytes and the value. This is the size [`BATCH_BYTES_MAX`] limits.
pub fn batch_encoded_bytes(batch: &[MetaOperation]) -> u64 {
    let operations: u64 = batch.iter().map(operation_encoded_bytes).sum();
    4 + operations
}

/// The encoded size of one operation; see [`batch_encoded_bytes`].
fn operation_encoded_bytes(operation: &MetaOperation) -> u64 {
    match operation {
        MetaOperation::Put { key, value } => 1 + 4 + key.len() as u64 + 4 + value.len() as u64,
        MetaOperation::Delete { key } => 1 + 4 + key.len() as u64,
    }
}

/// Checks every size limit of `batch`, so that implementations reject the same batches and do
/// so before touching anything.
pub fn validate_batch(batch: &[MetaOperation]) -> Result<(), MetaError> {
    for operation in batch {
        let key = operation.key();
        if key.len() > KEY_BYTES_MAX {
            return Err(MetaError::TooLarge { what: "key", bytes: key.len() as u64 });
        }
        if let MetaOperation::Put { value, .. } = operation {
            if value.len() > VALUE_BYTES_MAX {
                return Err(MetaError::TooLarge { what: "value", bytes: value.len() as u64 });
            }
        }
    }
    let bytes = batch_encoded_bytes(batch);
    if bytes > BATCH_BYTES_MAX as u64 {
        return Err(MetaError::TooLarge { what: "batch", bytes });
    }
    Ok(())
}

/// Applies a (validated) batch to an in-memory map, in order. Shared by both implementations so
/// that their semantics cannot drift apart.
pub(crate) fn apply_to_map(
    map: &mut std::collections::BTreeMap<String, Vec<u8>>,
    batch: &[MetaOperation],
) {
    for operation in batch {
        match operation {
            MetaOperation::Put { key, value } => {
                map.insert(key.clone(), value.clone());
            }
            MetaOperation::Delete { key } => {
                map.remove(key);
            }
        }
    }
}

/// The entries of `map` whose key starts with `prefix`, ascending. Shared by both
/// implementations.
pub(crate) fn scan_map(
    map: &std::collections::BTreeMap<String, Vec<u8>>,
    prefix: &str,
) -> Vec<(String, Vec<u8>)> {
    // Every key with the prefix sorts at or after the prefix itself and they are contiguous, so
    // a range scan that stops at the first non-matching key visits only the answer.
    map.range::<str, _>((std::ops::Bound::Included(prefix), std::ops::Bound::Unbounded))
        .take_while(|(key, _)| key.starts_with(prefix))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_size_matches_the_documented_layout() {
        let batch = vec![
            MetaOperation::Put { key: "ab".into(), value: vec![1, 2, 3] },
            MetaOperation::Delete { key: "c".into() },
        ];
        assert_eq!(batch_encoded_bytes(&batch), 4 + (1 + 4 + 2 + 4 + 3) + (1 + 4 + 1));
        assert_eq!(batch_encoded_bytes(&[]), 4);
    }

    #[test]
    fn limits_are_inclusive() {
        let key = "k".repeat(KEY_BYTES_MAX);
        assert!(validate_batch(&[MetaOperation::Delete { key }]).is_ok());
        let key = "k".repeat(KEY_BYTES_MAX + 1);
        assert!(matches!(
            validate_batch(&[MetaOperation::Delete { key }]),
            Err(MetaError::TooLarge { what: "key", bytes }) if bytes == KEY_BYTES_MAX as u64 + 1
        ));
    }
}
