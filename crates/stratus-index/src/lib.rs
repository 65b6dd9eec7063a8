//! The hash table of a Stratus master: the only pointer to each live object.
//!
//! Layout (RAMCloud's): an array of 64-byte, cache-line-aligned buckets of 8 × u64 entries.
//! An entry is `partial hash (hash >> 48) in bits 63..48 | chain flag bit 47 | 47-bit log
//! reference`; 0 is empty. A key lives only in bucket
//! `(hash & 0xFFFF_FFFF_FFFF) & (bucket_count - 1)`. When all 8 entries of the last bucket of a
//! chain are used, its 8th entry becomes a chain pointer (chain flag set, the low 47 bits an
//! index into the overflow pool) to an overflow bucket, and the entry that was there moves into
//! the new bucket.
//!
//! The table never reads the log: lookups return candidate references whose partial hash
//! matches, and the caller compares keys. Concurrency: striped bucket locks, held by writers and
//! readers alike in this version; entries are atomics only so that the table needs no unsafe
//! code (all accesses happen under the bucket's lock, which orders them). The one unsafe
//! block is a prefetch hint ([`HashTable::prefetch`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// A software prefetch of the cache line at `address` (a no-op where none is wired up).
#[allow(unsafe_code)]
fn prefetch_line(address: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address, and neither reads
    // nor writes memory as far as the program can observe. SSE, which it belongs to, is part
    // of the x86_64 baseline, so the instruction exists on every x86_64 processor.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}

/// Entries per bucket: 8 × 8 bytes fill one 64-byte cache line.
pub const ENTRIES_PER_BUCKET: usize = 8;

/// Bytes per bucket (one cache line, so a lookup usually costs one miss in the table).
pub const BUCKET_BYTES: u64 = 64;

/// Bits of a log reference in an entry.
pub const REFERENCE_BITS: u32 = 47;

/// Mask of the reference bits.
pub const REFERENCE_MASK: u64 = (1 << REFERENCE_BITS) - 1;

/// Set in a bucket's last entry when it points to an overflow bucket.
const CHAIN_FLAG: u64 = 1 << REFERENCE_BITS;

/// The partial hash is the hash's top 16 bits, stored in the entry's top 16 bits.
const PARTIAL_HASH_SHIFT: u32 = 48;

/// The bucket index uses only the low 48 bits, so the partial hash (top 16) is independent of it.
const BUCKET_HASH_MASK: u64 = 0xFFFF_FFFF_FFFF;

/// Number of bucket locks. RAMCloud uses 1024 spinlocks; contention measured there was 0.1%.
pub const LOCK_STRIPES: usize = 1024;

/// Buckets in the first overflow chunk; each next chunk doubles, so 40 chunks address far more
/// overflow buckets than 47-bit references could ever need, while memory grows on demand.
const OVERFLOW_FIRST_CHUNK_BUCKETS: u64 = 64;
const OVERFLOW_CHUNKS: usize = 40;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Bucket {
    words: [AtomicU64; ENTRIES_PER_BUCKET],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == BUCKET_BYTES as usize);
const _: () = assert!(std::mem::align_of::<Bucket>() == BUCKET_BYTES as usize);

/// Which bucket a slot is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum BucketLocation {
    Main(u64),
    Overflow(u64),
}

/// The position of an entry, valid while the guard that produced it is held and until the next
/// [`BucketGuard::insert`] (which may move an entry into a new overflow bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    bucket: BucketLocation,
    position: usize,
}

/// The overflow pool: chunks of buckets allocated on demand, addressed by a flat index.
#[derive(Debug)]
struct OverflowPool {
    chunks: Box<[OnceLock<Box<[Bucket]>>]>,
    next_index: AtomicU64,
    /// Overflow buckets are never unlinked in this version; the free list is where a future
    /// chain compaction returns them.
    free: Mutex<Vec<u64>>,
}

impl OverflowPool {
    fn new() -> OverflowPool {
        OverflowPool {
            chunks: (0..OVERFLOW_CHUNKS).map(|_| OnceLock::new()).collect(),
            next_index: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
        }
    }

    /// (chunk, offset within chunk) of a flat index.
    fn locate(index: u64) -> (usize, usize) {
        let chunk = (63 - (index / OVERFLOW_FIRST_CHUNK_BUCKETS + 1).leading_zeros()) as usize;
        let chunk_base = OVERFLOW_FIRST_CHUNK_BUCKETS * ((1u64 << chunk) - 1);
        (chunk, (index - chunk_base) as usize)
    }

    fn chunk_buckets(chunk: usize) -> usize {
        (OVERFLOW_FIRST_CHUNK_BUCKETS << chunk) as usize
    }

    fn allocate(&self) -> u64 {
        if let Some(index) = self.free.lock().expect("overflow free list poisoned").pop() {
            return index;
        }
        let index = self.next_index.fetch_add(1, Ordering::Relaxed);
        assert!(index <= REFERENCE_MASK, "overflow pool exhausted");
        let (chunk, _) = Self::locate(index);
        assert!(chunk < OVERFLOW_CHUNKS, "overflow pool exhausted");
        self.chunks[chunk]
            .get_or_init(|| (0..Self::chunk_buckets(chunk)).map(|_| Bucket::default()).collect());
        index
    }

    fn bucket(&self, index: u64) -> &Bucket {
        let (chunk, offset) = Self::locate(index);
        &self.chunks[chunk].get().expect("chain points to an unallocated overflow bucket")[offset]
    }
}

/// The hash table.
#[derive(Debug)]
pub struct HashTable {
    buckets: Box<[Bucket]>,
    overflow: OverflowPool,
    locks: Box<[Mutex<()>]>,
    bucket_mask: u64,
}

impl HashTable {
    /// A table using about `bytes` of memory for its main buckets: the largest power of two of
    /// 64-byte buckets that fits (at least one bucket).
    pub fn new(bytes: u64) -> HashTable {
        let wanted = (bytes / BUCKET_BYTES).clamp(1, BUCKET_HASH_MASK + 1);
        let bucket_count = 1u64 << (63 - wanted.leading_zeros());
        HashTable {
            buckets: (0..bucket_count).map(|_| Bucket::default()).collect(),
            overflow: OverflowPool::new(),
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            bucket_mask: bucket_count - 1,
        }
    }

    /// Number of main buckets (a power of two).
    pub fn bucket_count(&self) -> u64 {
        self.bucket_mask + 1
    }

    /// The bucket that holds keys with this hash.
    pub fn bucket_index(&self, hash: u64) -> u64 {
        (hash & BUCKET_HASH_MASK) & self.bucket_mask
    }

    /// Asks the processor to bring the main bucket of `hash` (and its lock) into the cache, so
    /// a [`HashTable::lock`] of it a little later does not wait for memory. A hint only: it
    /// reads nothing and changes nothing. The cleaner issues it some entries ahead of the one
    /// it relocates; every relocation otherwise starts with a cache miss on a random bucket.
    pub fn prefetch(&self, hash: u64) {
        let bucket_index = self.bucket_index(hash) as usize;
        let stripe = bucket_index & (LOCK_STRIPES - 1);
        prefetch_line(std::ptr::from_ref(&self.buckets[bucket_index]).cast());
        prefetch_line(std::ptr::from_ref(&self.locks[stripe]).cast());
    }

    /// Overflow buckets allocated so far.
    pub fn overflow_bucket_count(&self) -> u64 {
        self.overflow.next_index.load(Ordering::Relaxed)
    }

    fn lock_bucket(&self, bucket_index: u64) -> MutexGuard<'_, ()> {
        // The lock guards no data of its own (`()`), so a panic while holding it cannot leave
        // the mutex's contents inconsistent; recover from poisoning.
        let stripe = (bucket_index as usize) & (LOCK_STRIPES - 1);
        self.locks[stripe].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the bucket of `hash` for lookups and updates of that key.
    pub fn lock(&self, hash: u64) -> BucketGuard<'_> {
        let bucket_index = self.bucket_index(hash);
        BucketGuard {
            table: self,
            bucket_index,
            partial_hash: hash >> PARTIAL_HASH_SHIFT,
            _lock: self.lock_bucket(bucket_index),
        }
    }

    fn bucket(&self, location: BucketLocation) -> &Bucket {
        match location {
            BucketLocation::Main(index) => &self.buckets[index as usize],
            BucketLocation::Overflow(index) => self.overflow.bucket(index),
        }
    }

    /// Visits every entry word (not chain pointers) of the chain starting at main bucket
    /// `bucket_index`; `visit` returns true to stop. The caller holds the bucket's lock.
    fn walk(&self, bucket_index: u64, mut visit: impl FnMut(Slot, u64) -> bool) -> Option<Slot> {
        let mut location = BucketLocation::Main(bucket_index);
        loop {
            let bucket = self.bucket(location);
            let mut next = None;
            for (position, word) in bucket.words.iter().enumerate() {
                let word = word.load(Ordering::Relaxed);
                if position == ENTRIES_PER_BUCKET - 1 && word & CHAIN_FLAG != 0 {
                    next = Some(BucketLocation::Overflow(word & REFERENCE_MASK));
                    break;
                }
                let slot = Slot { bucket: location, position };
                if visit(slot, word) {
                    return Some(slot);
                }
            }
            location = next?;
        }
    }

    fn store(&self, slot: Slot, word: u64) {
        self.bucket(slot.bucket).words[slot.position].store(word, Ordering::Relaxed);
    }

    /// Calls `visit(reference)` for every entry of main bucket `bucket_index` and its chain,
    /// under that bucket's lock (for enumeration).
    pub fn for_each_in_bucket(&self, bucket_index: u64, mut visit: impl FnMut(u64)) {
        assert!(bucket_index <= self.bucket_mask, "bucket index out of range");
        let _lock = self.lock_bucket(bucket_index);
        self.walk(bucket_index, |_, word| {
            if word != 0 {
                visit(word & REFERENCE_MASK);
            }
            false
        });
    }

    /// Removes every entry of main bucket `bucket_index` (and its chain) for which
    /// `keep(reference)` returns false, under that bucket's lock (for tablet drop). Returns how
    /// many were removed.
    pub fn retain_in_bucket(&self, bucket_index: u64, mut keep: impl FnMut(u64) -> bool) -> u64 {
        assert!(bucket_index <= self.bucket_mask, "bucket index out of range");
        let _lock = self.lock_bucket(bucket_index);
        let mut removed = Vec::new();
        self.walk(bucket_index, |slot, word| {
            if word != 0 && !keep(word & REFERENCE_MASK) {
                removed.push(slot);
            }
            false
        });
        for &slot in &removed {
            self.store(slot, 0);
        }
        removed.len() as u64
    }
}

/// Exclusive access to one bucket chain, for the key hash it was taken for.
#[derive(Debug)]
pub struct BucketGuard<'a> {
    table: &'a HashTable,
    bucket_index: u64,
    partial_hash: u64,
    _lock: MutexGuard<'a, ()>,
}

impl BucketGuard<'_> {
    /// The main bucket this guard locks.
    pub fn bucket_index(&self) -> u64 {
        self.bucket_index
    }

    fn matches(&self, word: u64) -> bool {
        word != 0 && word >> PARTIAL_HASH_SHIFT == self.partial_hash
    }

    /// Every entry whose partial hash matches, with its reference.
    pub fn candidates(&self) -> Vec<(Slot, u64)> {
        let mut found = Vec::new();
        self.table.walk(self.bucket_index, |slot, word| {
            if self.matches(word) {
                found.push((slot, word & REFERENCE_MASK));
            }
            false
        });
        found
    }

    /// The first matching entry whose reference satisfies `predicate` (the caller compares the
    /// key stored at the reference).
    pub fn find(&self, mut predicate: impl FnMut(u64) -> bool) -> Option<(Slot, u64)> {
        let mut reference = 0;
        let slot = self.table.walk(self.bucket_index, |_, word| {
            reference = word & REFERENCE_MASK;
            self.matches(word) && predicate(reference)
        })?;
        Some((slot, reference))
    }

    fn word_for(&self, reference: u64) -> u64 {
        assert!(reference != 0 && reference <= REFERENCE_MASK, "reference out of range");
        (self.partial_hash << PARTIAL_HASH_SHIFT) | reference
    }

    /// Adds an entry for `reference` (non-zero, < 2^47) under this guard's hash. Invalidates
    /// slots obtained earlier from this guard.
    pub fn insert(&mut self, reference: u64) -> Slot {
        let word = self.word_for(reference);
        let table = self.table;
        let mut last_bucket = BucketLocation::Main(self.bucket_index);
        let empty = table.walk(self.bucket_index, |slot, existing| {
            last_bucket = slot.bucket;
            existing == 0
        });
        if let Some(slot) = empty {
            table.store(slot, word);
            return slot;
        }
        // The chain is full: its last bucket's 8th entry moves to a new overflow bucket and
        // becomes the chain pointer.
        let overflow_index = table.overflow.allocate();
        let overflow = BucketLocation::Overflow(overflow_index);
        let last_slot = Slot { bucket: last_bucket, position: ENTRIES_PER_BUCKET - 1 };
        let moved = table.bucket(last_bucket).words[ENTRIES_PER_BUCKET - 1].load(Ordering::Relaxed);
        assert!(moved != 0 && moved & CHAIN_FLAG == 0, "full chain ends in an empty or chain slot");
        let new_bucket = table.bucket(overflow);
        assert!(
            new_bucket.words.iter().all(|entry| entry.load(Ordering::Relaxed) == 0),
            "overflow bucket handed out twice"
        );
        new_bucket.words[0].store(moved, Ordering::Relaxed);
        new_bucket.words[1].store(word, Ordering::Relaxed);
        table.store(last_slot, CHAIN_FLAG | overflow_index);
        Slot { bucket: overflow, position: 1 }
    }

    /// Points the entry at `slot` to `reference` (overwrite, or relocation by a cleaner).
    pub fn replace(&mut self, slot: Slot, reference: u64) {
        let word = self.word_for(reference);
        let current = self.table.bucket(slot.bucket).words[slot.position].load(Ordering::Relaxed);
        assert!(self.matches(current) && current & CHAIN_FLAG == 0, "replacing a foreign slot");
        self.table.store(slot, word);
    }

    /// Empties the entry at `slot`.
    pub fn remove(&mut self, slot: Slot) {
        let current = self.table.bucket(slot.bucket).words[slot.position].load(Ordering::Relaxed);
        assert!(self.matches(current) && current & CHAIN_FLAG == 0, "removing a foreign slot");
        self.table.store(slot, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    /// A hash in bucket `bucket` with partial hash `partial`.
    fn hash(bucket: u64, partial: u64) -> u64 {
        (partial << 48) | bucket
    }

    #[test]
    fn sizing_rounds_down_to_a_power_of_two() {
        assert_eq!(HashTable::new(0).bucket_count(), 1);
        assert_eq!(HashTable::new(64).bucket_count(), 1);
        assert_eq!(HashTable::new(64 * 5).bucket_count(), 4);
        assert_eq!(HashTable::new(64 << 10).bucket_count(), 1024);
        let table = HashTable::new(64 * 16);
        assert_eq!(table.bucket_index(hash(5, 0xFFFF)), 5);
        assert_eq!(table.bucket_index(0xFFFF_0000_0000_0013), 3);
    }

    #[test]
    fn overflow_pool_locations() {
        assert_eq!(OverflowPool::locate(0), (0, 0));
        assert_eq!(OverflowPool::locate(63), (0, 63));
        assert_eq!(OverflowPool::locate(64), (1, 0));
        assert_eq!(OverflowPool::locate(191), (1, 127));
        assert_eq!(OverflowPool::locate(192), (2, 0));
    }

    #[test]
    fn insert_find_replace_remove() {
        let table = HashTable::new(64 * 16);
        let key_hash = hash(3, 0xABCD);
        let mut guard = table.lock(key_hash);
        assert!(guard.candidates().is_empty());
        let slot = guard.insert(100);
        assert_eq!(guard.find(|reference| reference == 100), Some((slot, 100)));
        guard.replace(slot, 200);
        assert_eq!(guard.candidates(), vec![(slot, 200)]);
        drop(guard);
        // Another partial hash in the same bucket is not a candidate.
        let other = table.lock(hash(3, 0x1234));
        assert!(other.candidates().is_empty());
        assert!(other.find(|_| true).is_none());
        drop(other);
        let mut guard = table.lock(key_hash);
        guard.remove(slot);
        assert!(guard.candidates().is_empty());
    }

    #[test]
    fn many_keys_colliding_in_one_bucket_chain_into_overflow() {
        let table = HashTable::new(64 * 4);
        let mut expected = BTreeSet::new();
        for index in 1..=100u64 {
            // Same bucket, 4 distinct partial hashes: full collisions too.
            let mut guard = table.lock(hash(2, index % 4));
            guard.insert(index);
            expected.insert(index);
        }
        assert!(table.overflow_bucket_count() >= 100 / 7);
        let mut seen = BTreeSet::new();
        table.for_each_in_bucket(2, |reference| {
            assert!(seen.insert(reference));
        });
        assert_eq!(seen, expected);
        for partial in 0..4u64 {
            let guard = table.lock(hash(2, partial));
            let candidates: BTreeSet<u64> =
                guard.candidates().into_iter().map(|(_, reference)| reference).collect();
            let wanted: BTreeSet<u64> = (1..=100).filter(|index| index % 4 == partial).collect();
            assert_eq!(candidates, wanted);
        }
        // Other buckets are unaffected.
        table.for_each_in_bucket(1, |_| panic!("bucket 1 should be empty"));
        // Remove half, then reinsert into the freed slots without new overflow buckets.
        let overflow_before = table.overflow_bucket_count();
        for index in (1..=100u64).filter(|index| index % 2 == 0) {
            let mut guard = table.lock(hash(2, index % 4));
            let (slot, _) = guard.find(|reference| reference == index).unwrap();
            guard.remove(slot);
        }
        for index in 101..=150u64 {
            table.lock(hash(2, 1)).insert(index);
        }
        assert_eq!(table.overflow_bucket_count(), overflow_before);
        let mut count = 0;
        table.for_each_in_bucket(2, |_| count += 1);
        assert_eq!(count, 100);
        let removed = table.retain_in_bucket(2, |reference| reference > 100);
        assert_eq!(removed, 50);
        let mut left = Vec::new();
        table.for_each_in_bucket(2, |reference| left.push(reference));
        left.sort();
        assert_eq!(left, (101..=150).collect::<Vec<_>>());
    }

    #[test]
    #[should_panic(expected = "reference out of range")]
    fn zero_reference_is_rejected() {
        let table = HashTable::new(64);
        table.lock(5).insert(0);
    }

    #[test]
    fn concurrent_inserts_and_lookups() {
        let table = HashTable::new(64 * 8);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let table = &table;
                scope.spawn(move || {
                    for index in 0..500u64 {
                        let reference = thread * 10_000 + index + 1;
                        let key_hash = reference.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                        table.lock(key_hash).insert(reference);
                        let guard = table.lock(key_hash);
                        assert!(guard.find(|found| found == reference).is_some());
                    }
                });
            }
        });
        let mut total = 0;
        for bucket in 0..table.bucket_count() {
            table.for_each_in_bucket(bucket, |_| total += 1);
        }
        assert_eq!(total, 2000);
    }

    proptest::proptest! {
        #[test]
        fn behaves_like_a_multimap(operations in proptest::collection::vec((0u64..6, 0u64..3, proptest::prelude::any::<bool>()), 1..300)) {
            let table = HashTable::new(64 * 2);
            let mut model: HashMap<u64, Vec<u64>> = HashMap::new();
            let mut next_reference = 1;
            for (bucket, partial, insert) in operations {
                let key_hash = hash(bucket, partial);
                let mut guard = table.lock(key_hash);
                let references = model.entry(key_hash).or_default();
                if insert || references.is_empty() {
                    guard.insert(next_reference);
                    references.push(next_reference);
                    next_reference += 1;
                } else {
                    let victim = references.remove(0);
                    let (slot, _) = guard.find(|reference| reference == victim).unwrap();
                    guard.remove(slot);
                }
                let mut candidates: Vec<u64> = guard.candidates().into_iter().map(|(_, r)| r).collect();
                candidates.sort();
                // Hashes with the same bucket index (mod 2) and partial hash share candidates.
                let mut wanted: Vec<u64> = model
                    .iter()
                    .filter(|(other, _)| table.bucket_index(**other) == table.bucket_index(key_hash) && **other >> 48 == partial)
                    .flat_map(|(_, references)| references.iter().copied())
                    .collect();
                wanted.sort();
                proptest::prop_assert_eq!(candidates, wanted);
            }
        }
    }
}
