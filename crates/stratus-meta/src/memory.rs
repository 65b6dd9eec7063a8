//! [`MemoryMetaStore`]: the in-memory implementation, for tests and the simulator.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::{apply_to_map, scan_map, validate_batch, MetaError, MetaOperation, MetaStore};

/// A [`MetaStore`] that keeps everything in memory and forgets it when dropped.
///
/// It enforces the same limits and batch semantics as the durable stores, so code tested
/// against it behaves the same in production. "Durable" here means "visible to every later
/// call on this value", which is what a simulated coordinator restart that keeps the store
/// needs.
#[derive(Debug, Default)]
pub struct MemoryMetaStore {
    map: Mutex<BTreeMap<String, Vec<u8>>>,
}

impl MemoryMetaStore {
    /// An empty store.
    pub fn new() -> MemoryMetaStore {
        MemoryMetaStore::default()
    }

    /// Locks the map. A panic while the lock was held cannot leave the map half-changed
    /// (batches are validated first and applying a validated batch cannot fail), so a
    /// poisoned lock is safe to use.
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl MetaStore for MemoryMetaStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetaError> {
        Ok(self.lock().get(key).cloned())
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        Ok(scan_map(&self.lock(), prefix))
    }

    fn apply(&self, batch: &[MetaOperation]) -> Result<(), MetaError> {
        validate_batch(batch)?;
        apply_to_map(&mut self.lock(), batch);
        Ok(())
    }
}
