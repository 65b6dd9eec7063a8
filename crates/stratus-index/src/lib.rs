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
const _: () = assert!(stratus_pages::PAGE_BYTES.is_multiple_of(BUCKET_BYTES as usize));

/// The main buckets, in memory whose pages are mapped only once touched: a table sized for the
/// whole log costs memory only where keys landed (a `Box` of default buckets would write, and
/// so map, every page at start).
struct MainBuckets {
    region: stratus_pages::PageRegion,
    count: usize,
}

impl std::fmt::Debug for MainBuckets {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("MainBuckets").field("count", &self.count).finish()
    }
}

impl MainBuckets {
    fn new(count: usize) -> MainBuckets {
        let bytes = count.checked_mul(BUCKET_BYTES as usize).expect("bucket array overflows");
        MainBuckets { region: stratus_pages::PageRegion::new(bytes), count }
    }

    fn get(&self, index: usize) -> &Bucket {
        assert!(index < self.count, "bucket {index} out of range");
        // SAFETY: in bounds (above); the region is page-aligned (so aligned for `Bucket`,
        // checked above), starts zeroed, and lives as long as `self`; all zeros is a valid
        // `Bucket` (eight `AtomicU64` of 0), and every change goes through the atomics. Pages
        // are released only for buckets beyond a shrunk table, which no reference points into
        // (`HashTable::finish_resize`).
        #[allow(unsafe_code)]
        unsafe {
            &*self.region.as_ptr().cast::<Bucket>().add(index)
        }
    }

    /// Gives the pages of buckets `[from, to)` back; they read as empty afterwards.
    fn release(&self, from: usize, to: usize) {
        assert!(from <= to && to <= self.count, "release of buckets {from}..{to}");
        let bytes = BUCKET_BYTES as usize;
        self.region.release(from * bytes, (to - from) * bytes);
    }
}

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

    /// Returns an overflow bucket no chain points to any more; it is zeroed first (a new chain
    /// expects it empty).
    fn free(&self, index: u64) {
        for word in &self.bucket(index).words {
            word.store(0, Ordering::Relaxed);
        }
        self.free.lock().expect("overflow free list poisoned").push(index);
    }
}

/// The phase of the table's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// `2^bits` buckets.
    Stable,
    /// From `2^bits` to `2^(bits+1)`: old buckets below `cursor` were split (bucket `i`'s
    /// entries whose hash has bit `bits` set moved to bucket `i + 2^bits`).
    Growing,
    /// From `2^bits` to `2^(bits-1)`: buckets `i + 2^(bits-1)` for `i` below `cursor` were
    /// merged into bucket `i`.
    Shrinking,
}

/// Where keys live now, packed in one atomic word: bits 0..6 `bits`, 6..8 the phase, 8.. the
/// cursor. Read under a stripe lock it is stable for that stripe's buckets: a unit of migration
/// moves one stripe's buckets under that stripe's lock and advances the cursor before releasing
/// it, and every size keeps the stripe bits of the bucket index (sizes are at least
/// [`LOCK_STRIPES`] buckets when the table resizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    bits: u32,
    phase: Phase,
    cursor: u64,
}

impl Layout {
    fn encode(self) -> u64 {
        let phase = match self.phase {
            Phase::Stable => 0,
            Phase::Growing => 1,
            Phase::Shrinking => 2,
        };
        u64::from(self.bits) | (phase << 6) | (self.cursor << 8)
    }

    fn decode(word: u64) -> Layout {
        let phase = match (word >> 6) & 3 {
            0 => Phase::Stable,
            1 => Phase::Growing,
            _ => Phase::Shrinking,
        };
        Layout { bits: (word & 63) as u32, phase, cursor: word >> 8 }
    }

    /// The main bucket of `hash`.
    fn bucket_of(self, hash: u64) -> u64 {
        let hash = hash & BUCKET_HASH_MASK;
        let count = 1u64 << self.bits;
        match self.phase {
            Phase::Stable => hash & (count - 1),
            Phase::Growing => {
                let old = hash & (count - 1);
                if old < self.cursor {
                    hash & (2 * count - 1)
                } else {
                    old
                }
            }
            Phase::Shrinking => {
                let new = hash & (count / 2 - 1);
                if new < self.cursor {
                    new
                } else {
                    hash & (count - 1)
                }
            }
        }
    }

    /// One past the highest main bucket that may hold an entry.
    fn buckets_in_use(self) -> u64 {
        match self.phase {
            Phase::Growing => 2u64 << self.bits,
            Phase::Stable | Phase::Shrinking => 1u64 << self.bits,
        }
    }

    /// The smallest table size at which the layout places some hash: a hash's bucket is its
    /// low bits modulo this size or modulo a larger one in use.
    fn placement_buckets_min(self) -> u64 {
        match self.phase {
            Phase::Stable | Phase::Growing => 1u64 << self.bits,
            Phase::Shrinking => 1u64 << (self.bits - 1),
        }
    }

    /// Units of migration of the resize in progress (0 when stable).
    fn units(self) -> u64 {
        match self.phase {
            Phase::Stable => 0,
            Phase::Growing => 1u64 << self.bits,
            Phase::Shrinking => 1u64 << (self.bits - 1),
        }
    }
}

/// A table grows once it holds more than this many entries per main bucket on average (half of
/// a bucket's 8: chains stay rare, Poisson(4) overflows 8 in about 2 % of buckets).
pub const GROW_ENTRIES_PER_BUCKET: u64 = 4;

/// A table shrinks once it holds fewer than this many entries per main bucket on average; after
/// halving it holds fewer than 2, so it never shrinks and grows back at once.
pub const SHRINK_ENTRIES_PER_BUCKET: u64 = 1;

/// What [`HashTable::resize_step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeProgress {
    /// The table has the size its entries call for.
    Idle,
    /// Units were migrated and more remain (call again).
    Migrating,
    /// A resize finished in this call.
    Finished,
    /// Another thread is resizing.
    Busy,
}

/// The hash table.
#[derive(Debug)]
pub struct HashTable {
    /// Room for the largest size; pages are touched only where the current size's buckets
    /// hold entries.
    buckets: MainBuckets,
    overflow: OverflowPool,
    locks: Box<[Mutex<()>]>,
    /// The stripe of a hash: its low bits under this mask (the bucket index's low bits at every
    /// size the table takes).
    stripe_mask: u64,
    /// log2 of the largest and the smallest size.
    bits_max: u32,
    bits_min: u32,
    /// The [`Layout`], encoded.
    layout: AtomicU64,
    /// Held by the one thread migrating.
    resizing: Mutex<()>,
}

impl HashTable {
    /// A table of a fixed size using about `bytes` of memory for its main buckets: the largest
    /// power of two of 64-byte buckets that fits (at least one bucket). Its pages are touched
    /// only where keys land.
    pub fn new(bytes: u64) -> HashTable {
        let mut table = HashTable::growable(bytes);
        // Fixed at its largest size: never resized.
        table.bits_min = table.bits_max;
        let bits = table.bits_max;
        table
            .layout
            .store(Layout { bits, phase: Phase::Stable, cursor: 0 }.encode(), Ordering::SeqCst);
        table
    }

    /// A table that may take up to about `bytes` for its main buckets (as [`HashTable::new`]),
    /// starting at [`LOCK_STRIPES`] buckets (or the largest size, if smaller) and resized by
    /// [`HashTable::resize_step`] as its entries come and go. Only the pages of the buckets in
    /// use are ever touched.
    pub fn growable(bytes: u64) -> HashTable {
        let wanted = (bytes / BUCKET_BYTES).clamp(1, BUCKET_HASH_MASK + 1);
        let bits_max = 63 - wanted.leading_zeros();
        let bucket_count = 1u64 << bits_max;
        let bits_min = bits_max.min(LOCK_STRIPES.trailing_zeros());
        HashTable {
            buckets: MainBuckets::new(
                usize::try_from(bucket_count).expect("bucket count fits the address space"),
            ),
            overflow: OverflowPool::new(),
            locks: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            stripe_mask: (1u64 << bits_min) - 1,
            bits_max,
            bits_min,
            layout: AtomicU64::new(
                Layout { bits: bits_min, phase: Phase::Stable, cursor: 0 }.encode(),
            ),
            resizing: Mutex::new(()),
        }
    }

    fn current_layout(&self) -> Layout {
        Layout::decode(self.layout.load(Ordering::Acquire))
    }

    /// Number of main buckets in use (a power of two; during a resize, the size it started
    /// from).
    pub fn bucket_count(&self) -> u64 {
        1u64 << self.current_layout().bits
    }

    /// The most main buckets the table may grow to.
    pub fn bucket_count_max(&self) -> u64 {
        1u64 << self.bits_max
    }

    /// The main bucket that holds keys with this hash now (it changes as the table resizes;
    /// its low bits under the stripe mask do not).
    pub fn bucket_index(&self, hash: u64) -> u64 {
        self.current_layout().bucket_of(hash)
    }

    /// Bytes of main buckets in use.
    pub fn main_bucket_bytes(&self) -> u64 {
        self.current_layout().buckets_in_use() * BUCKET_BYTES
    }

    /// Asks the processor to bring the main bucket of `hash` (and its lock) into the cache, so
    /// a [`HashTable::lock`] of it a little later does not wait for memory. A hint only: it
    /// reads nothing and changes nothing. The cleaner issues it some entries ahead of the one
    /// it relocates; every relocation otherwise starts with a cache miss on a random bucket.
    pub fn prefetch(&self, hash: u64) {
        let bucket_index = self.bucket_index(hash) as usize;
        prefetch_line(std::ptr::from_ref(self.buckets.get(bucket_index)).cast());
        prefetch_line(std::ptr::from_ref(&self.locks[self.stripe_of(hash)]).cast());
    }

    fn stripe_of(&self, hash: u64) -> usize {
        (hash & BUCKET_HASH_MASK & self.stripe_mask) as usize
    }

    /// Overflow buckets allocated so far.
    pub fn overflow_bucket_count(&self) -> u64 {
        self.overflow.next_index.load(Ordering::Relaxed)
    }

    fn lock_stripe(&self, stripe: usize) -> MutexGuard<'_, ()> {
        // The lock guards no data of its own (`()`), so a panic while holding it cannot leave
        // the mutex's contents inconsistent; recover from poisoning.
        self.locks[stripe].lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Locks the bucket of `hash` for lookups and updates of that key.
    pub fn lock(&self, hash: u64) -> BucketGuard<'_> {
        let lock = self.lock_stripe(self.stripe_of(hash));
        // Read under the stripe lock: stable for this stripe's buckets while it is held.
        let bucket_index = self.current_layout().bucket_of(hash);
        BucketGuard {
            table: self,
            bucket_index,
            partial_hash: hash >> PARTIAL_HASH_SHIFT,
            _lock: lock,
        }
    }

    fn bucket(&self, location: BucketLocation) -> &Bucket {
        match location {
            BucketLocation::Main(index) => self.buckets.get(index as usize),
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

    /// Calls `visit(reference)` for every entry that may belong to a hash whose low `bits`
    /// bits equal `low_bits`, under one stripe lock (for enumeration, which checks each key's
    /// hash itself): every main bucket that can hold such a hash in the current layout, with its
    /// chain. Entries of other hashes may be visited too. `bits` must be at least the stripe
    /// bits (`log2` of [`HashTable::bucket_count`] always is).
    pub fn for_each_in_hash_class(&self, low_bits: u64, bits: u32, mut visit: impl FnMut(u64)) {
        assert!(
            u64::from(bits) >= u64::from(self.stripe_mask.count_ones()) && bits <= 48,
            "hash class of {bits} bits"
        );
        let stripe = (low_bits & self.stripe_mask) as usize;
        let _lock = self.lock_stripe(stripe);
        let layout = self.current_layout();
        let in_use = layout.buckets_in_use();
        // Buckets congruent to `low_bits` modulo the smaller of the class and the smallest size
        // the layout places a hash at (half the size during a shrink: merged buckets are in
        // the lower half), up to the buckets in use.
        let step = (1u64 << bits).min(layout.placement_buckets_min());
        let mut bucket_index = low_bits & (step - 1);
        while bucket_index < in_use {
            self.walk(bucket_index, |_, word| {
                if word != 0 {
                    visit(word & REFERENCE_MASK);
                }
                false
            });
            bucket_index += step;
        }
    }

    /// Removes every entry for which `keep(reference)` returns false (for tablet drop), one
    /// bucket's stripe lock at a time. No resize runs meanwhile (it waits for this), so no
    /// entry moves between buckets and every one is seen once. Returns how many were removed.
    pub fn retain(&self, mut keep: impl FnMut(u64) -> bool) -> u64 {
        let _resizing = self.resizing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let layout = self.current_layout();
        let mut removed_count = 0;
        for bucket_index in 0..layout.buckets_in_use() {
            let _lock = self.lock_stripe((bucket_index & self.stripe_mask) as usize);
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
            removed_count += removed.len() as u64;
        }
        removed_count
    }

    /// True if the table may change size (a growable table of more than one size).
    pub fn can_resize(&self) -> bool {
        self.bits_min < self.bits_max
    }

    /// Adds `word` to the chain of main bucket `bucket_index` (the caller holds its stripe
    /// lock): in the first empty entry, or in a new overflow bucket.
    fn insert_word(&self, bucket_index: u64, word: u64) -> Slot {
        let mut last_bucket = BucketLocation::Main(bucket_index);
        let empty = self.walk(bucket_index, |slot, existing| {
            last_bucket = slot.bucket;
            existing == 0
        });
        if let Some(slot) = empty {
            self.store(slot, word);
            return slot;
        }
        // The chain is full: its last bucket's 8th entry moves to a new overflow bucket and
        // becomes the chain pointer.
        let overflow_index = self.overflow.allocate();
        let overflow = BucketLocation::Overflow(overflow_index);
        let last_slot = Slot { bucket: last_bucket, position: ENTRIES_PER_BUCKET - 1 };
        let moved = self.bucket(last_bucket).words[ENTRIES_PER_BUCKET - 1].load(Ordering::Relaxed);
        assert!(moved != 0 && moved & CHAIN_FLAG == 0, "full chain ends in an empty or chain slot");
        let new_bucket = self.bucket(overflow);
        assert!(
            new_bucket.words.iter().all(|entry| entry.load(Ordering::Relaxed) == 0),
            "overflow bucket handed out twice"
        );
        new_bucket.words[0].store(moved, Ordering::Relaxed);
        new_bucket.words[1].store(word, Ordering::Relaxed);
        self.store(last_slot, CHAIN_FLAG | overflow_index);
        Slot { bucket: overflow, position: 1 }
    }

    /// Empties the chain of main bucket `bucket_index` (the caller holds its stripe lock),
    /// returning its overflow buckets to the pool; returns the entries it held.
    fn take_chain(&self, bucket_index: u64) -> Vec<u64> {
        let mut words = Vec::new();
        let mut location = BucketLocation::Main(bucket_index);
        loop {
            let bucket = self.bucket(location);
            let mut next = None;
            for (position, word) in bucket.words.iter().enumerate() {
                let value = word.load(Ordering::Relaxed);
                if position == ENTRIES_PER_BUCKET - 1 && value & CHAIN_FLAG != 0 {
                    next = Some(value & REFERENCE_MASK);
                } else if value != 0 {
                    words.push(value);
                }
                word.store(0, Ordering::Relaxed);
            }
            if let BucketLocation::Overflow(index) = location {
                self.overflow.free(index);
            }
            match next {
                Some(index) => location = BucketLocation::Overflow(index),
                None => return words,
            }
        }
    }

    /// One step of keeping the table sized for `entries` (the live entries, counted by the
    /// caller): starts a resize when the load leaves [`SHRINK_ENTRIES_PER_BUCKET`]..=
    /// [`GROW_ENTRIES_PER_BUCKET`] per bucket, and migrates at most `units_max` units (one old
    /// bucket split, or two merged), each under its stripe's lock alone, so a reader waits at
    /// most one unit's work. Growing needs each entry's full hash, which only the caller can
    /// compute from the reference (`hash_of`, reading the log); an entry whose partial hash or
    /// bucket does not match the hash given is a broken invariant and panics.
    pub fn resize_step(
        &self,
        entries: u64,
        units_max: u64,
        mut hash_of: impl FnMut(u64) -> u64,
    ) -> ResizeProgress {
        let _resizing = match self.resizing.try_lock() {
            Ok(guard) => guard,
            // A panic in an earlier step (a broken invariant) left nothing half-moved: entries
            // are placed before their chain is emptied.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return ResizeProgress::Busy,
        };
        let mut layout = self.current_layout();
        if layout.phase == Phase::Stable {
            match self.start_resize(layout, entries) {
                Some(started) => layout = started,
                None => return ResizeProgress::Idle,
            }
        }
        let end = layout.units().min(layout.cursor.saturating_add(units_max));
        for unit in layout.cursor..end {
            let _lock = self.lock_stripe((unit & self.stripe_mask) as usize);
            match layout.phase {
                Phase::Growing => self.split_bucket(unit, 1u64 << layout.bits, &mut hash_of),
                Phase::Shrinking => self.merge_bucket(unit, 1u64 << (layout.bits - 1)),
                Phase::Stable => unreachable!("a stable layout has no units"),
            }
            // Under the unit's stripe lock: a holder of it sees the unit before or after.
            layout.cursor = unit + 1;
            self.layout.store(layout.encode(), Ordering::Release);
        }
        if layout.cursor < layout.units() {
            return ResizeProgress::Migrating;
        }
        self.finish_resize(layout);
        ResizeProgress::Finished
    }

    /// The layout of a resize `entries` call for from the stable `layout`, now published;
    /// `None` if the size is right.
    fn start_resize(&self, layout: Layout, entries: u64) -> Option<Layout> {
        let count = 1u64 << layout.bits;
        let phase = if entries > count * GROW_ENTRIES_PER_BUCKET && layout.bits < self.bits_max {
            Phase::Growing
        } else if entries < count * SHRINK_ENTRIES_PER_BUCKET && layout.bits > self.bits_min {
            Phase::Shrinking
        } else {
            return None;
        };
        let started = Layout { bits: layout.bits, phase, cursor: 0 };
        self.layout.store(started.encode(), Ordering::Release);
        Some(started)
    }

    /// Splits old bucket `unit` of a table growing from `count` buckets: entries whose hash has
    /// the bit `count` set move to `unit + count`. The caller holds the unit's stripe lock.
    /// Every entry's place is found and checked first, and only then the chain emptied: a
    /// broken invariant panics with the table as it was.
    fn split_bucket(&self, unit: u64, count: u64, hash_of: &mut impl FnMut(u64) -> u64) {
        let mut placed = Vec::new();
        self.walk(unit, |_, word| {
            if word != 0 {
                let hash = hash_of(word & REFERENCE_MASK);
                assert_eq!(
                    hash >> PARTIAL_HASH_SHIFT,
                    word >> PARTIAL_HASH_SHIFT,
                    "an entry's partial hash does not match its object's hash"
                );
                let target = hash & BUCKET_HASH_MASK & (2 * count - 1);
                assert!(
                    target == unit || target == unit + count,
                    "an entry in bucket {unit} hashes to bucket {target}"
                );
                placed.push((target, word));
            }
            false
        });
        let taken = self.take_chain(unit);
        debug_assert_eq!(taken.len(), placed.len());
        for (target, word) in placed {
            self.insert_word(target, word);
        }
    }

    /// Merges bucket `unit + half` into `unit` of a table shrinking to `half` buckets. The
    /// caller holds the unit's stripe lock (both buckets share it).
    fn merge_bucket(&self, unit: u64, half: u64) {
        for word in self.take_chain(unit + half) {
            self.insert_word(unit, word);
        }
    }

    /// Publishes the stable layout after the last unit of `layout`; after a shrink, gives the
    /// upper half's pages back.
    fn finish_resize(&self, layout: Layout) {
        let bits = match layout.phase {
            Phase::Growing => layout.bits + 1,
            _ => layout.bits - 1,
        };
        self.layout
            .store(Layout { bits, phase: Phase::Stable, cursor: 0 }.encode(), Ordering::Release);
        if layout.phase == Phase::Shrinking {
            // Every bucket of the upper half was emptied under its stripe's lock, after which no
            // lookup addresses it (the layout read under that lock sends it below). A visitor of
            // a whole hash class that read the shrinking layout may still walk those empty
            // buckets under its stripe lock: taking every stripe lock once waits for them, and
            // later ones read the stable layout. Then no reference into the upper half exists,
            // and its pages can go.
            for stripe in 0..=self.stripe_mask {
                drop(self.lock_stripe(stripe as usize));
            }
            let count = 1usize << layout.bits;
            self.buckets.release(count / 2, count);
        }
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
        self.table.insert_word(self.bucket_index, word)
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
        table.for_each_in_hash_class(2, 2, |reference| {
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
        table.for_each_in_hash_class(1, 2, |_| panic!("bucket 1 should be empty"));
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
        table.for_each_in_hash_class(2, 2, |_| count += 1);
        assert_eq!(count, 100);
        let removed = table.retain(|reference| reference > 100);
        assert_eq!(removed, 50);
        let mut left = Vec::new();
        table.for_each_in_hash_class(2, 2, |reference| left.push(reference));
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
        for class in 0..8 {
            table.for_each_in_hash_class(class, 3, |_| total += 1);
        }
        assert_eq!(total, 2000);
    }

    /// The hash of a reference in the resizing tests: what the store computes from the key
    /// stored at the reference.
    fn mixed(reference: u64) -> u64 {
        let mut value = reference.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        value ^= value >> 29;
        value.wrapping_mul(0xBF58_476D_1CE4_E5B9)
    }

    fn resize_until_idle(table: &HashTable, entries: u64, units_max: u64) -> u32 {
        let mut finished = 0;
        for _ in 0..100_000 {
            match table.resize_step(entries, units_max, mixed) {
                ResizeProgress::Idle => return finished,
                ResizeProgress::Finished => finished += 1,
                ResizeProgress::Migrating | ResizeProgress::Busy => {}
            }
        }
        panic!("the table never settled");
    }

    fn present(table: &HashTable, reference: u64) -> bool {
        table.lock(mixed(reference)).find(|found| found == reference).is_some()
    }

    #[test]
    fn a_growable_table_starts_small_grows_with_its_entries_and_shrinks_back() {
        // Room for 16 Ki buckets (1 MiB); it starts at 1 Ki (64 KiB).
        let table = HashTable::growable(1 << 20);
        assert_eq!((table.bucket_count(), table.bucket_count_max()), (1024, 16_384));
        assert_eq!(table.main_bucket_bytes(), 64 << 10);
        for reference in 1..=20_000u64 {
            table.lock(mixed(reference)).insert(reference);
            if reference % 1_000 == 0 {
                // A few units at a time, interleaved with inserts, as the cleaner does.
                table.resize_step(reference, 300, mixed);
            }
        }
        resize_until_idle(&table, 20_000, 300);
        // Above 4 per bucket it grows: 20 000 entries settle at 8 Ki buckets (2.4 per bucket).
        assert_eq!(table.bucket_count(), 8192);
        assert!((1..=20_000).all(|reference| present(&table, reference)));
        for reference in 501..=20_000u64 {
            let mut guard = table.lock(mixed(reference));
            let (slot, _) = guard.find(|found| found == reference).unwrap();
            guard.remove(slot);
        }
        assert_eq!(resize_until_idle(&table, 500, 50), 3);
        assert_eq!(table.bucket_count(), 1024);
        assert!((1..=500).all(|reference| present(&table, reference)));
        assert!((501..=600).all(|reference| !present(&table, reference)));
        let mut seen = 0;
        for class in 0..1024 {
            table.for_each_in_hash_class(class, 10, |_| seen += 1);
        }
        assert_eq!(seen, 500);
        // A fixed table never resizes.
        let fixed = HashTable::new(1 << 20);
        assert_eq!(fixed.bucket_count(), 16_384);
        assert_eq!(fixed.resize_step(0, 100, mixed), ResizeProgress::Idle);
    }

    /// Every entry of a hash class, exactly once, whatever the class width against the
    /// table's size during a resize: the classes of the size a shrink started from (whose upper
    /// half is partly merged down already), and classes wider than a table halfway through
    /// growing.
    #[test]
    fn hash_classes_are_complete_in_the_middle_of_a_shrink_and_of_a_grow() {
        let check = |table: &HashTable, bits: u32, expected: &BTreeSet<u64>| {
            let mut seen = BTreeSet::new();
            for class in 0..(1u64 << bits) {
                table.for_each_in_hash_class(class, bits, |reference| {
                    if mixed(reference) & ((1 << bits) - 1) == class {
                        assert!(seen.insert(reference), "{reference} twice");
                    }
                });
            }
            assert_eq!(&seen, expected, "classes of {bits} bits");
        };
        let table = HashTable::growable(1 << 20);
        for reference in 1..=20_000u64 {
            table.lock(mixed(reference)).insert(reference);
        }
        resize_until_idle(&table, 20_000, 1_000);
        assert_eq!(table.bucket_count(), 8192);
        for reference in 501..=20_000u64 {
            let mut guard = table.lock(mixed(reference));
            let (slot, _) = guard.find(|found| found == reference).unwrap();
            guard.remove(slot);
        }
        let left: BTreeSet<u64> = (1..=500).collect();
        // A tenth of the way through halving 8 Ki buckets.
        assert_eq!(table.resize_step(500, 400, mixed), ResizeProgress::Migrating);
        assert_eq!(table.bucket_count(), 8192);
        for bits in [10, 12, 13, 14] {
            check(&table, bits, &left);
        }
        resize_until_idle(&table, 500, 1_000);
        assert_eq!(table.bucket_count(), 1024);
        // Halfway through growing from 1 Ki to 2 Ki buckets.
        for reference in 20_001..=25_000u64 {
            table.lock(mixed(reference)).insert(reference);
        }
        assert_eq!(table.resize_step(5_500, 512, mixed), ResizeProgress::Migrating);
        let all: BTreeSet<u64> = (1..=500).chain(20_001..=25_000).collect();
        for bits in [10, 11, 12] {
            check(&table, bits, &all);
        }
    }

    #[test]
    #[should_panic(expected = "partial hash does not match")]
    fn growing_with_a_wrong_hash_stops_rather_than_misplacing_an_entry() {
        let table = HashTable::growable(1 << 20);
        for reference in 1..=5_000u64 {
            table.lock(mixed(reference)).insert(reference);
        }
        table.resize_step(5_000, 1_024, |reference| mixed(reference + 1));
    }

    /// Writers insert and find their own entries, and a reader enumerates hash classes, while
    /// another thread grows and shrinks the table a few units at a time: no entry is ever
    /// missing from a lookup or from its hash class.
    #[test]
    fn lookups_and_enumeration_see_every_entry_while_the_table_resizes() {
        let table = HashTable::growable(1 << 20);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let resizer = scope.spawn(|| {
                let mut finished = 0;
                while !done.load(Ordering::Relaxed) {
                    // Claims a count that swings the table up and down.
                    let entries = if finished % 2 == 0 { 60_000 } else { 10 };
                    if table.resize_step(entries, 7, mixed) == ResizeProgress::Finished {
                        finished += 1;
                    }
                }
                finished
            });
            let writers: Vec<_> = (0..2u64)
                .map(|thread| {
                    let table = &table;
                    scope.spawn(move || {
                        for index in 0..6_000u64 {
                            let reference = thread * 100_000 + index + 1;
                            table.lock(mixed(reference)).insert(reference);
                            assert!(present(table, reference), "{reference} lost");
                            let earlier = thread * 100_000 + index / 2 + 1;
                            assert!(present(table, earlier), "{earlier} lost");
                        }
                    })
                })
                .collect();
            for writer in writers {
                writer.join().unwrap();
            }
            // Every entry is in its hash class, exactly once.
            let mut seen = BTreeSet::new();
            for class in 0..1024 {
                table.for_each_in_hash_class(class, 10, |reference| {
                    assert_eq!(mixed(reference) & 1023, class);
                    assert!(seen.insert(reference), "{reference} twice");
                });
            }
            assert_eq!(seen.len(), 12_000);
            done.store(true, Ordering::Relaxed);
            assert!(resizer.join().unwrap() >= 2, "the table should have resized meanwhile");
        });
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
