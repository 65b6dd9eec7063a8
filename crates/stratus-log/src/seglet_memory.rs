//! The raw log region: one preallocated block of memory divided into seglets, and the epochs
//! that decide when a seglet may be reused. This is the only module of the storage engine with
//! unsafe code.
//!
//! # Invariants (why the unsafe code is sound)
//!
//! 1. **Write-once, in order, per use.** Each seglet has two counters: `reserved` (bytes claimed
//!    by a writer) and `written` (bytes whose writing has finished). A writer claims
//!    `[start, end)` by a compare-and-swap of `reserved` from exactly `start` to `end`, so no two
//!    writers ever own overlapping bytes, and no byte is claimed twice while the seglet is in
//!    use. The counters return to 0 only in [`SegletMemory::reclaim`] (invariant 5).
//! 2. **Publication.** After copying its bytes, the writer moves `written` from `start` to `end`
//!    with a compare-and-swap and `SeqCst` ordering. Only the log appender and the cleaner,
//!    each owning the seglet exclusively, write, so the swap always succeeds; if it did not (an
//!    out-of-order writer), the writer panics before publishing anything.
//! 3. **Readers only read published bytes, under an epoch guard.** [`SegletMemory::read`] needs
//!    an [`EpochGuard`] and returns a slice that lives no longer than the guard. It loads
//!    `written` (`SeqCst`) and asserts that the requested range lies below it, so every byte a
//!    reader sees was completely written before.
//! 4. **Bounds.** Every access asserts that it stays within one seglet and within the region.
//! 5. **Reuse waits for readers (epochs, RAMCloud §4.4.3).** A guard holds a slot with the
//!    global epoch it saw when it was pinned (re-checked after publishing, so a slot never holds
//!    an epoch older than one a concurrent scan could miss). A seglet leaves the log by
//!    [`SegletMemory::retire`], which tags it with `epoch.fetch_add(1)`. [`SegletMemory::reclaim`]
//!    then works in two steps, each waiting until every pinned slot holds an epoch newer than
//!    the seglet's tag: (a) set `written` to 0 (later reads of it panic: no new slice can be
//!    made) and re-tag it with a fresh epoch; (b) set `reserved` to 0 and hand the seglet back
//!    for writing. Any slice of the old bytes was made by a read whose `SeqCst` load of
//!    `written` came before step (a)'s store, by a guard pinned before that; step (b) waits for
//!    that guard, and the slice cannot outlive it. So bytes are never rewritten while a slice
//!    of them is alive, even for a reader that followed a stale or forged reference.
//!
//! The log's seglet tables (owner, next seglet) are plain atomics: a stale reader following
//! them sees published bytes of some entry or panics, never undefined behaviour.

#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use stratus_pages::PageRegion;

/// Epoch slots: how many guards can be pinned at once. A pin that finds every slot taken waits
/// (yields) until one is released; 256 is far above the request threads of a server.
pub const EPOCH_SLOTS: usize = 256;

/// A free epoch slot (epochs start at 1).
const SLOT_FREE: u64 = 0;

/// One epoch slot on its own cache line, so threads pinning at once do not share lines.
#[repr(align(64))]
#[derive(Debug)]
struct EpochSlot(AtomicU64);

/// Hands each thread a different first slot to try.
static NEXT_SLOT_HINT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slot this thread pinned last: usually free again, and on a line no other thread
    /// writes, so pinning costs one uncontended compare-and-swap.
    static SLOT_HINT: std::cell::Cell<usize> =
        std::cell::Cell::new(NEXT_SLOT_HINT.fetch_add(1, Ordering::Relaxed));
}

/// A seglet waiting for readers before it can be reused.
#[derive(Debug, Clone, Copy)]
struct Retired {
    seglet: u32,
    /// The epoch the current step waits to pass.
    tag: u64,
    /// false: waiting to unpublish (`written = 0`); true: waiting to be handed back.
    unpublished: bool,
}

/// The raw memory of the log, divided into seglets.
pub struct SegletMemory {
    /// The region; its pages cost memory only once touched, and free seglets' pages can be
    /// given back ([`SegletMemory::release`]).
    region: PageRegion,
    /// Start of the region (`region.as_ptr()`), valid while `region` lives.
    base: NonNull<u8>,
    /// Total bytes in the region (`seglet_count * seglet_bytes`).
    region_bytes: usize,
    /// Bytes per seglet.
    seglet_bytes: u32,
    /// Per seglet: bytes claimed by a writer (see invariant 1).
    reserved: Box<[AtomicU32]>,
    /// Per seglet: bytes completely written and readable (see invariants 2 and 3).
    written: Box<[AtomicU32]>,
    /// The global epoch (invariant 5); starts at 1.
    epoch: AtomicU64,
    /// Per pinned guard: the epoch it pinned, or [`SLOT_FREE`].
    slots: Box<[EpochSlot]>,
    /// Seglets retired and not yet handed back.
    retired: Mutex<Vec<Retired>>,
}

// SAFETY: the region is owned by this value (like a `Box<[u8]>`), and all shared access goes
// through the reserved/written/epoch protocol above: bytes are written only after an exclusive
// claim, read only after publication, and reclaimed only after every reader that could hold
// them is gone, so sharing across threads cannot create a data race.
unsafe impl Send for SegletMemory {}
// SAFETY: as above; `&SegletMemory` exposes only the claim/publish writes, published reads
// under a guard, and the epoch-checked reclaim.
unsafe impl Sync for SegletMemory {}

impl std::fmt::Debug for SegletMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SegletMemory")
            .field("region_bytes", &self.region_bytes)
            .field("seglet_bytes", &self.seglet_bytes)
            .field("epoch", &self.epoch.load(Ordering::Relaxed))
            .finish()
    }
}

/// Proof that the holder is a registered reader of the log (RAMCloud's request epoch): seglets
/// it can see are not reused until it is dropped. Take one per operation, never hold one
/// across waits: a guard held forever stops all memory reclamation.
#[derive(Debug)]
pub struct EpochGuard<'a> {
    memory: &'a SegletMemory,
    slot: usize,
}

impl Drop for EpochGuard<'_> {
    fn drop(&mut self) {
        self.memory.slots[self.slot].0.store(SLOT_FREE, Ordering::SeqCst);
    }
}

impl EpochGuard<'_> {
    /// The epoch this guard pinned.
    pub fn epoch(&self) -> u64 {
        self.memory.slots[self.slot].0.load(Ordering::SeqCst)
    }
}

/// Asks the kernel to back `region` with transparent huge pages (2 MiB) where it can, before
/// it is touched: prefaulting then takes one fault per 2 MiB instead of one per 4 KiB, and
/// lookups spread over the log miss the TLB far less (RAMCloud keeps its log in huge pages for
/// the same reasons). Only for prefaulted memory: a lazily touched region would pay the huge
/// pages' compaction on first use, under load. Linux with transparent huge pages in "madvise"
/// or "always" mode; elsewhere, or when the kernel refuses, the region keeps normal pages.
#[cfg(all(target_os = "linux", not(miri)))]
fn advise_huge_pages(region: &PageRegion) {
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    let start = region.as_ptr() as usize;
    let end = start + region.len();
    // Only whole huge pages inside the region (madvise needs a page-aligned start).
    let aligned_start = start.next_multiple_of(HUGE_PAGE_BYTES);
    let aligned_end = end / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if aligned_end <= aligned_start {
        return;
    }
    // SAFETY: the range lies inside `region`, which is being created, so no other code uses
    // it meanwhile. MADV_HUGEPAGE changes neither the contents nor the addresses, only
    // how the kernel backs the pages; its result is ignored because a refusal (huge pages
    // disabled, an old kernel) leaves the region exactly as it was.
    let _ = unsafe {
        libc::madvise(
            aligned_start as *mut libc::c_void,
            aligned_end - aligned_start,
            libc::MADV_HUGEPAGE,
        )
    };
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn advise_huge_pages(_region: &PageRegion) {}

/// Bytes between two touched bytes when prefaulting: the smallest page size in use.
const PREFAULT_STRIDE_BYTES: usize = 4096;

impl SegletMemory {
    /// Allocates `seglet_count` zeroed seglets of `seglet_bytes` each. Zeroed allocation is lazy
    /// on common platforms, so untouched seglets cost no physical memory.
    pub fn new(seglet_count: u32, seglet_bytes: u32) -> SegletMemory {
        SegletMemory::with_prefault(seglet_count, seglet_bytes, false)
    }

    /// [`SegletMemory::new`], and with `prefault` every page of the region is touched now, so
    /// that no append ever waits for the kernel to map a page (the first write to each page of
    /// a lazily zeroed region faults; a server that reuses its memory pays that only once, a
    /// fresh one on every new page).
    pub fn with_prefault(seglet_count: u32, seglet_bytes: u32, prefault: bool) -> SegletMemory {
        assert!(seglet_count > 0 && seglet_bytes > 0, "empty log region");
        let region_bytes = (seglet_count as usize)
            .checked_mul(seglet_bytes as usize)
            .expect("log region size overflows usize");
        let region = PageRegion::new(region_bytes);
        let base = NonNull::new(region.as_ptr()).expect("a region is never null");
        if prefault {
            advise_huge_pages(&region);
            for offset in (0..region_bytes).step_by(PREFAULT_STRIDE_BYTES) {
                // SAFETY: in bounds, and the region is not shared yet. The volatile write of
                // a zero into zeroed memory is not removed, so the page gets mapped.
                unsafe { base.as_ptr().add(offset).write_volatile(0) };
            }
        }
        let counters = || (0..seglet_count).map(|_| AtomicU32::new(0)).collect::<Box<[_]>>();
        SegletMemory {
            region,
            base,
            region_bytes,
            seglet_bytes,
            reserved: counters(),
            written: counters(),
            epoch: AtomicU64::new(1),
            slots: (0..EPOCH_SLOTS).map(|_| EpochSlot(AtomicU64::new(SLOT_FREE))).collect(),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Bytes per seglet.
    pub fn seglet_bytes(&self) -> u32 {
        self.seglet_bytes
    }

    /// Number of seglets.
    pub fn seglet_count(&self) -> u32 {
        self.written.len() as u32
    }

    /// The current global epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Registers a reader: until the guard is dropped, no seglet it could read is reused.
    pub fn pin(&self) -> EpochGuard<'_> {
        let start = SLOT_HINT.with(std::cell::Cell::get);
        let mut attempt = 0usize;
        let slot = loop {
            let slot = (start + attempt) % EPOCH_SLOTS;
            let epoch = self.epoch.load(Ordering::SeqCst);
            if self.slots[slot]
                .0
                .compare_exchange(SLOT_FREE, epoch, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                SLOT_HINT.with(|hint| hint.set(slot));
                break slot;
            }
            attempt += 1;
            if attempt.is_multiple_of(EPOCH_SLOTS) {
                std::thread::yield_now();
            }
        };
        // Re-check: if the epoch moved between the load and the publication, a reclaim scan
        // may have missed this slot; publish the newer epoch until it is stable (invariant 5).
        loop {
            let published = self.slots[slot].0.load(Ordering::SeqCst);
            let current = self.epoch.load(Ordering::SeqCst);
            if current == published {
                break;
            }
            self.slots[slot].0.store(current, Ordering::SeqCst);
        }
        EpochGuard { memory: self, slot }
    }

    /// Writes `bytes` at `offset` within `seglet`. The write must start exactly where the previous
    /// write to this seglet ended (write-once, in order); anything else panics, because it means
    /// the appender's bookkeeping is broken and continuing would corrupt the log.
    pub fn write(&self, seglet: u32, offset: u32, bytes: &[u8]) {
        let end = self.check_range(seglet, offset, bytes.len());
        let index = seglet as usize;
        self.reserved[index]
            .compare_exchange(offset, end, Ordering::SeqCst, Ordering::SeqCst)
            .expect("seglet write does not start at the seglet's write position");
        let start = self.region_offset(seglet, offset);
        // SAFETY: `check_range` proved `start + bytes.len() <= region_bytes`, so the destination
        // is inside the allocation; the claim above makes this thread the only writer of these
        // bytes, and no reader reads them until `written` is advanced below (invariant 3); no
        // slice of earlier contents of these bytes is alive (invariant 5: `reserved` is reset
        // only after every guard that could hold one is dropped). The source is a separate
        // borrow, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(start),
                bytes.len(),
            );
        }
        self.written[index]
            .compare_exchange(offset, end, Ordering::SeqCst, Ordering::Relaxed)
            .expect("seglet writes published out of order");
    }

    /// The published bytes `[offset, offset + length)` of `seglet`, valid while `guard` lives.
    /// Panics if any of them has not been written (or the seglet was reclaimed): a reference to
    /// unwritten memory is a broken invariant.
    pub fn read<'g>(
        &'g self,
        guard: &'g EpochGuard<'_>,
        seglet: u32,
        offset: u32,
        length: usize,
    ) -> &'g [u8] {
        assert!(std::ptr::eq(guard.memory, self), "epoch guard of another log");
        let end = self.check_range(seglet, offset, length);
        let written = self.written[seglet as usize].load(Ordering::SeqCst);
        assert!(end <= written, "read of unpublished log bytes");
        let start = self.region_offset(seglet, offset);
        // SAFETY: in bounds (`check_range`); every byte was written and published before the
        // `SeqCst` load above, and is not written again until `reclaim` hands the seglet back,
        // which waits for `guard` (invariant 5); the slice borrows `guard`, so it dies first.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(start), length) }
    }

    /// Bytes already published in `seglet`.
    pub fn written_bytes(&self, seglet: u32) -> u32 {
        self.written[seglet as usize].load(Ordering::SeqCst)
    }

    /// Gives the pages of free seglets back to the operating system: they use no physical
    /// memory until written again, and read as empty. Each seglet must be free: handed back by
    /// [`SegletMemory::reclaim`] (or never used) and not written since, which the caller (the
    /// owner of the free list) guarantees and this asserts. Returns the bytes given back.
    pub fn release(&self, seglets: &[u32]) -> u64 {
        let mut released = 0u64;
        for &seglet in seglets {
            let index = seglet as usize;
            assert!(index < self.written.len(), "seglet {seglet} out of range");
            // Free: nothing claimed (no writer) and nothing published (no reader can make a
            // slice of it, invariant 3), so no reference into its bytes exists.
            assert_eq!(self.reserved[index].load(Ordering::SeqCst), 0, "release of a used seglet");
            assert_eq!(self.written[index].load(Ordering::SeqCst), 0, "release of a used seglet");
            let start = self.region_offset(seglet, 0);
            released += self.region.release(start, self.seglet_bytes as usize) as u64;
        }
        released
    }

    /// Retires seglets that no longer belong to the log: they are reused only after every
    /// guard pinned now (or earlier) is dropped. Returns the epoch they were tagged with.
    pub fn retire(&self, seglets: &[u32]) -> u64 {
        for &seglet in seglets {
            assert!((seglet as usize) < self.written.len(), "seglet {seglet} out of range");
        }
        let tag = self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut retired = self.retired.lock().expect("retired list poisoned");
        retired.extend(seglets.iter().map(|&seglet| Retired { seglet, tag, unpublished: false }));
        tag
    }

    /// Seglets retired and not yet handed back.
    pub fn retired_count(&self) -> usize {
        self.retired.lock().expect("retired list poisoned").len()
    }

    /// The oldest epoch a pinned guard holds, or `u64::MAX` when none is pinned.
    fn oldest_pinned_epoch(&self) -> u64 {
        self.slots
            .iter()
            .map(|slot| slot.0.load(Ordering::SeqCst))
            .filter(|&epoch| epoch != SLOT_FREE)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Hands back the retired seglets no reader can still see, empty and ready to be written
    /// from offset 0 (invariant 5). With no guard pinned, one call hands back all of them.
    pub fn reclaim(&self) -> Vec<u32> {
        let mut retired = self.retired.lock().expect("retired list poisoned");
        if retired.is_empty() {
            return Vec::new();
        }
        // Step (a): unpublish seglets whose readers are gone, then re-tag them.
        let oldest = self.oldest_pinned_epoch();
        let mut unpublished_any = false;
        for item in retired.iter_mut().filter(|item| !item.unpublished && item.tag < oldest) {
            self.written[item.seglet as usize].store(0, Ordering::SeqCst);
            item.unpublished = true;
            item.tag = u64::MAX;
            unpublished_any = true;
        }
        if unpublished_any {
            let tag = self.epoch.fetch_add(1, Ordering::SeqCst);
            for item in retired.iter_mut().filter(|item| item.tag == u64::MAX) {
                item.tag = tag;
            }
        }
        // Step (b): hand back unpublished seglets whose last possible readers are gone.
        let oldest = self.oldest_pinned_epoch();
        let mut handed_back = Vec::new();
        retired.retain(|item| {
            if item.unpublished && item.tag < oldest {
                self.reserved[item.seglet as usize].store(0, Ordering::SeqCst);
                handed_back.push(item.seglet);
                false
            } else {
                true
            }
        });
        handed_back
    }

    /// Asserts that `[offset, offset + length)` lies within `seglet`; returns the end offset.
    fn check_range(&self, seglet: u32, offset: u32, length: usize) -> u32 {
        assert!((seglet as usize) < self.written.len(), "seglet {seglet} out of range");
        let end = (offset as usize).checked_add(length).expect("range overflows");
        assert!(end <= self.seglet_bytes as usize, "access crosses the end of a seglet");
        end as u32
    }

    fn region_offset(&self, seglet: u32, offset: u32) -> usize {
        let start = seglet as usize * self.seglet_bytes as usize + offset as usize;
        debug_assert!(start <= self.region_bytes);
        start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small enough to run under Miri (`cargo +nightly miri test -p stratus-log seglet_memory`).
    #[test]
    fn write_then_read_in_order() {
        let memory = SegletMemory::new(4, 64);
        let guard = memory.pin();
        memory.write(1, 0, b"hello");
        memory.write(1, 5, b" world");
        assert_eq!(memory.read(&guard, 1, 0, 11), b"hello world");
        assert_eq!(memory.read(&guard, 1, 6, 5), b"world");
        assert_eq!(memory.written_bytes(1), 11);
        assert_eq!(memory.written_bytes(0), 0);
        memory.write(3, 0, &[7u8; 64]);
        assert_eq!(memory.read(&guard, 3, 0, 64), &[7u8; 64][..]);
    }

    #[test]
    fn a_prefaulted_region_behaves_like_a_lazy_one() {
        // Seglets smaller and larger than the stride, so some pages hold several seglets and
        // some seglets several pages.
        for (seglets, seglet_bytes) in [(3u32, 64u32), (3, 3 * 4096 + 8)] {
            let memory = SegletMemory::with_prefault(seglets, seglet_bytes, true);
            let guard = memory.pin();
            for seglet in 0..seglets {
                memory.write(seglet, 0, &vec![seglet as u8 + 1; seglet_bytes as usize]);
            }
            for seglet in 0..seglets {
                let expected = vec![seglet as u8 + 1; seglet_bytes as usize];
                assert_eq!(memory.read(&guard, seglet, 0, seglet_bytes as usize), &expected[..]);
            }
        }
    }

    #[test]
    fn concurrent_writers_on_distinct_seglets_and_readers() {
        let memory = SegletMemory::new(4, 64);
        std::thread::scope(|scope| {
            for seglet in 0..4u32 {
                let memory = &memory;
                scope.spawn(move || {
                    for step in 0..8u32 {
                        memory.write(seglet, step * 8, &[seglet as u8; 8]);
                        let guard = memory.pin();
                        let seen = memory.read(&guard, seglet, 0, (step as usize + 1) * 8);
                        assert!(seen.iter().all(|&byte| byte == seglet as u8));
                    }
                });
            }
        });
    }

    #[test]
    fn retired_seglets_wait_for_pinned_readers() {
        let memory = SegletMemory::new(2, 64);
        memory.write(0, 0, b"old bytes");
        let reader = memory.pin();
        let old = memory.read(&reader, 0, 0, 9);
        memory.retire(&[0]);
        // The reader pinned before the retirement: nothing is handed back.
        assert!(memory.reclaim().is_empty());
        assert!(memory.reclaim().is_empty());
        assert_eq!(memory.retired_count(), 1);
        // A reader pinned after the retirement does not block it.
        let later = memory.pin();
        assert!(later.epoch() > reader.epoch());
        assert_eq!(old, b"old bytes");
        drop(reader);
        // Step (a) unpublishes; `later` was pinned before that, so step (b) waits for it.
        assert!(memory.reclaim().is_empty());
        assert_eq!(memory.written_bytes(0), 0);
        drop(later);
        assert_eq!(memory.reclaim(), vec![0]);
        assert_eq!(memory.retired_count(), 0);
        // The seglet is writable again from offset 0.
        memory.write(0, 0, b"new");
        let guard = memory.pin();
        assert_eq!(memory.read(&guard, 0, 0, 3), b"new");
    }

    #[test]
    fn reclaim_without_readers_hands_back_at_once() {
        let memory = SegletMemory::new(3, 64);
        memory.write(1, 0, b"a");
        memory.write(2, 0, b"b");
        memory.retire(&[1, 2]);
        let mut handed_back = memory.reclaim();
        handed_back.sort_unstable();
        assert_eq!(handed_back, vec![1, 2]);
        assert!(memory.reclaim().is_empty());
    }

    #[test]
    fn readers_and_reclaim_race_without_reading_reused_bytes() {
        // A reader keeps reading seglet 0 through a (stale) position while another thread
        // retires, reclaims and rewrites it: every successful read sees one uniform fill.
        let memory = SegletMemory::new(1, 64);
        memory.write(0, 0, &[1u8; 64]);
        std::thread::scope(|scope| {
            let memory = &memory;
            scope.spawn(move || {
                for _ in 0..200 {
                    let guard = memory.pin();
                    if memory.written_bytes(0) == 64 {
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            let bytes = memory.read(&guard, 0, 0, 64);
                            assert!(bytes.iter().all(|&byte| byte == bytes[0]));
                        }));
                        // A read may lose the race with the unpublishing step and panic.
                        let _ = result;
                    }
                }
            });
            scope.spawn(move || {
                for round in 2..40u8 {
                    memory.retire(&[0]);
                    loop {
                        if memory.reclaim() == vec![0] {
                            break;
                        }
                        std::thread::yield_now();
                    }
                    memory.write(0, 0, &[round; 64]);
                }
            });
        });
    }

    #[test]
    #[should_panic(expected = "does not start")]
    fn rewriting_bytes_panics() {
        let memory = SegletMemory::new(1, 64);
        memory.write(0, 0, b"abc");
        memory.write(0, 0, b"xyz");
    }

    #[test]
    #[should_panic(expected = "unpublished")]
    fn reading_unwritten_bytes_panics() {
        let memory = SegletMemory::new(1, 64);
        memory.write(0, 0, b"abc");
        let guard = memory.pin();
        let _ = memory.read(&guard, 0, 0, 4);
    }

    #[test]
    #[should_panic(expected = "crosses the end")]
    fn crossing_a_seglet_panics() {
        let memory = SegletMemory::new(2, 64);
        memory.write(0, 60, b"abcdefgh");
    }
}
