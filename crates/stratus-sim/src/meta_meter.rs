//! The coordinator's metadata writes, counted: every batch the coordinator makes durable, when
//! (simulated time), how many records it changed and how many bytes it would take in the file
//! store's encoding. What the coordinator does per event is measured in these.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stratus_meta::{batch_encoded_bytes, MemoryMetaStore, MetaError, MetaOperation, MetaStore};

/// One durable batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaWrite {
    /// When it was applied.
    pub at: Duration,
    /// Records it put or deleted, by the key's kind (the key up to its first `/`).
    pub records: BTreeMap<String, u64>,
    /// Its size in the file store's encoding.
    pub bytes: u64,
}

/// A [`MetaStore`] that notes every batch applied to it (reads are not noted).
#[derive(Debug)]
pub struct MeteredMetaStore {
    inner: Arc<MemoryMetaStore>,
    writes: Mutex<Vec<MetaWrite>>,
}

impl MeteredMetaStore {
    /// `inner`, metered.
    pub fn new(inner: Arc<MemoryMetaStore>) -> MeteredMetaStore {
        MeteredMetaStore { inner, writes: Mutex::new(Vec::new()) }
    }

    /// Every batch applied so far, in order.
    pub fn writes(&self) -> Vec<MetaWrite> {
        self.writes.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }
}

impl MetaStore for MeteredMetaStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.inner.get(key)
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        self.inner.scan_prefix(prefix)
    }

    fn apply(&self, batch: &[MetaOperation]) -> Result<(), MetaError> {
        self.inner.apply(batch)?;
        let mut records: BTreeMap<String, u64> = BTreeMap::new();
        for operation in batch {
            let kind = operation.key().split('/').next().unwrap_or_default();
            *records.entry(kind.to_string()).or_default() += 1;
        }
        let write = MetaWrite {
            at: turmoil::sim_elapsed().unwrap_or_default(),
            records,
            bytes: batch_encoded_bytes(batch),
        };
        self.writes.lock().unwrap_or_else(|poison| poison.into_inner()).push(write);
        Ok(())
    }
}
