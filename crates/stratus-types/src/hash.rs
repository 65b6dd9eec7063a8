//! The key hash. Client and server must compute it identically, forever: tablet boundaries are
//! ranges of this hash, so changing it would move every key. It is XXH3-64 of the key bytes with
//! the table id as seed (see docs/design/wire-protocol.md, "Key hash").

use crate::ids::{KeyHash, TableId};

/// Hashes `key` within `table`.
pub fn key_hash(table: TableId, key: &[u8]) -> KeyHash {
    KeyHash(xxhash_rust::xxh3::xxh3_64_with_seed(key, table.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pinned values: if these change, every stored tablet map is wrong.
    #[test]
    fn key_hash_is_stable() {
        assert_eq!(key_hash(TableId(1), b"hello").0, 0x74b0_7ed3_97a8_9e92);
        assert_eq!(key_hash(TableId(42), b"k").0, 0x9e4c_2be7_9747_122e);
        let first = key_hash(TableId(1), b"hello");
        let again = key_hash(TableId(1), b"hello");
        assert_eq!(first, again);
        assert_ne!(key_hash(TableId(1), b"hello"), key_hash(TableId(2), b"hello"));
        assert_ne!(key_hash(TableId(1), b"hello"), key_hash(TableId(1), b"hellp"));
    }
}
