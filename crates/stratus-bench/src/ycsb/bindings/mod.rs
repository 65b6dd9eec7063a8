//! One client connection per driver thread, for each system: how a YCSB record and its
//! operations map onto the system's own commands (docs/ycsb.md, "Mapping").

mod memcached;
mod redis;
mod stratus;

pub use memcached::{MemcachedDatabase, MEMCACHED_NO_SCAN};
pub use redis::RedisDatabase;
pub use stratus::{StratusDatabase, STRATUS_NO_SCAN};

use super::measure::Outcome;

/// One client connection of a system (each driver thread owns one).
pub trait Database {
    /// Writes a whole new record.
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String>;
    /// Reads all fields of a record.
    fn read(&mut self, key: &str) -> Result<Outcome, String>;
    /// Writes field `field` of a record.
    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String>;
    /// Reads up to `count` records in key order from `start_key`.
    fn scan(&mut self, start_key: &str, count: u64) -> Result<Outcome, String>;
}

/// Attempts of one conditional read-modify-write under contention before it fails.
pub(super) const CONDITIONAL_WRITE_ATTEMPTS: u32 = 1_000;

/// A record as one object: the 10 fields of 100 bytes concatenated (field i at i × 100).
pub(super) fn record_bytes(fields: &[Vec<u8>]) -> Vec<u8> {
    fields.concat()
}
