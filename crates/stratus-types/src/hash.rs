//! The key hash. Client and server must compute it identically, forever: tablet boundaries are
//! ranges of this hash, so changing it would move every key. It is XXH3-64 of the key bytes with
//! the table id as seed (see docs/design/wire-protocol.md, "Key hash").

use crate::ids::{KeyHash, TableId};

/// Hashes `key` within `table`.
pub fn key_hash(table: TableId, key: &[u8]) -> KeyHash {
    KeyHash(xxhash_rust::xxh3::xxh3_64_with_seed(key, table.0))
}

/// A [`std::hash::Hasher`] for map keys that are integers no client chooses (table ids, key
/// hashes already computed): one multiplication per `u64` instead of SipHash. Each value is
/// folded (its high half into its low half) and multiplied by 2^64 / φ, so the result's top
/// bits depend on every bit of it: hashbrown takes its per-slot tags from the top bits, and the
/// keys it serves here differ in their low bits (small table ids) or share their top bits (the
/// key hashes of one recovery partition, a contiguous range). Not for keys an attacker picks:
/// chosen collisions would slow the map, which is why these keys must not come from clients.
#[derive(Clone, Copy, Debug, Default)]
pub struct IntegerHasher(u64);

/// Builds [`IntegerHasher`]s, for `HashMap<K, V, IntegerHashing>`.
pub type IntegerHashing = std::hash::BuildHasherDefault<IntegerHasher>;

impl std::hash::Hasher for IntegerHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not what the keys above write; correct, if slow, for any other key.
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    fn write_u64(&mut self, value: u64) {
        let mixed = self.0.rotate_left(5) ^ value;
        self.0 = (mixed ^ (mixed >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hasher};

    #[test]
    fn integer_hashes_of_alike_keys_spread_over_the_top_bits() {
        let tag = |value: u64| IntegerHashing::default().hash_one(value) >> 57;
        // The key hashes of one recovery partition share their top bits.
        let partition: std::collections::BTreeSet<u64> = (0..256u64)
            .map(|index| tag((0xAB << 56) | index.wrapping_mul(0x0001_0000_0100_0001)))
            .collect();
        assert!(partition.len() > 64, "only {} distinct tags", partition.len());
        // Table ids are small.
        let tables: std::collections::BTreeSet<u64> = (1..=256u64).map(tag).collect();
        assert!(tables.len() > 64, "only {} distinct tags", tables.len());
        // Bytes are hashed too, and differently from each other.
        let mut first = IntegerHasher::default();
        first.write(b"ab");
        let mut second = IntegerHasher::default();
        second.write(b"ba");
        assert_ne!(first.finish(), second.finish());
    }

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
