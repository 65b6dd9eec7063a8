//! The raw log region: one preallocated block of memory divided into seglets. This is the only
//! module of the storage engine with unsafe code.
//!
//! # Invariants (why the unsafe code is sound)
//!
//! 1. **Write-once, in order.** Each seglet has two counters: `reserved` (bytes claimed by a
//!    writer) and `written` (bytes whose writing has finished). A writer claims `[start, end)` by
//!    a compare-and-swap of `reserved` from exactly `start` to `end`, so no two writers ever own
//!    overlapping bytes, and no byte is ever claimed twice (memory is never freed or reused in
//!    this version; a later issue adds epoch-based freeing, which must reset the counters only
//!    when no reader can still hold a reference into the seglet).
//! 2. **Publication.** After copying its bytes, the writer moves `written` from `start` to `end`
//!    with a compare-and-swap and `Release` ordering. Only the log appender, holding the log lock,
//!    writes, so in practice writes are serialized and the swap always succeeds; if it did not
//!    (an out-of-order writer), the writer panics before publishing anything.
//! 3. **Readers only read published bytes.** [`SegletMemory::read`] loads `written` with
//!    `Acquire` and asserts that the requested range lies below it, so every byte a reader sees
//!    was completely written before, and will never be written again. Shared `&[u8]` slices into
//!    the region are therefore never aliased by a writer.
//! 4. **Bounds.** Every access asserts that it stays within one seglet and within the region.
//!
//! Callers learn references through the hash table (whose bucket lock orders the appender's
//! writes before the reader's loads); the `Acquire`/`Release` pair on `written` makes the
//! publication explicit even without that lock.

#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// The raw memory of the log, divided into seglets.
pub struct SegletMemory {
    /// Start of the region; owned (allocated in [`SegletMemory::new`], freed in `Drop`).
    base: NonNull<u8>,
    /// Total bytes in the region (`seglet_count * seglet_bytes`).
    region_bytes: usize,
    /// Bytes per seglet.
    seglet_bytes: u32,
    /// Per seglet: bytes claimed by a writer (see invariant 1).
    reserved: Box<[AtomicU32]>,
    /// Per seglet: bytes completely written and readable (see invariants 2 and 3).
    written: Box<[AtomicU32]>,
}

// SAFETY: the region is owned by this value (like a `Box<[u8]>`), and all shared access goes
// through the reserved/written protocol above: bytes are written only after an exclusive claim
// and read only after publication, so sharing across threads cannot create a data race.
unsafe impl Send for SegletMemory {}
// SAFETY: as above; `&SegletMemory` exposes only the claim/publish writes and published reads.
unsafe impl Sync for SegletMemory {}

impl std::fmt::Debug for SegletMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SegletMemory")
            .field("region_bytes", &self.region_bytes)
            .field("seglet_bytes", &self.seglet_bytes)
            .finish()
    }
}

impl SegletMemory {
    /// Allocates `seglet_count` zeroed seglets of `seglet_bytes` each. Zeroed allocation is lazy
    /// on common platforms, so untouched seglets cost no physical memory.
    pub fn new(seglet_count: u32, seglet_bytes: u32) -> SegletMemory {
        assert!(seglet_count > 0 && seglet_bytes > 0, "empty log region");
        let region_bytes = (seglet_count as usize)
            .checked_mul(seglet_bytes as usize)
            .expect("log region size overflows usize");
        let region: Box<[u8]> = vec![0u8; region_bytes].into_boxed_slice();
        let base = NonNull::new(Box::into_raw(region).cast::<u8>()).expect("Box is never null");
        let counters = || (0..seglet_count).map(|_| AtomicU32::new(0)).collect::<Box<[_]>>();
        SegletMemory { base, region_bytes, seglet_bytes, reserved: counters(), written: counters() }
    }

    /// Bytes per seglet.
    pub fn seglet_bytes(&self) -> u32 {
        self.seglet_bytes
    }

    /// Number of seglets.
    pub fn seglet_count(&self) -> u32 {
        self.written.len() as u32
    }

    /// Writes `bytes` at `offset` within `seglet`. The write must start exactly where the previous
    /// write to this seglet ended (write-once, in order); anything else panics, because it means
    /// the appender's bookkeeping is broken and continuing would corrupt the log.
    pub fn write(&self, seglet: u32, offset: u32, bytes: &[u8]) {
        let end = self.check_range(seglet, offset, bytes.len());
        let index = seglet as usize;
        self.reserved[index]
            .compare_exchange(offset, end, Ordering::AcqRel, Ordering::Acquire)
            .expect("seglet write does not start at the seglet's write position");
        let start = self.region_offset(seglet, offset);
        // SAFETY: `check_range` proved `start + bytes.len() <= region_bytes`, so the destination
        // is inside the allocation; the claim above makes this thread the only writer of these
        // bytes, and no reader reads them until `written` is advanced below (invariant 3). The
        // source is a separate borrow, so the ranges cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.as_ptr().add(start),
                bytes.len(),
            );
        }
        self.written[index]
            .compare_exchange(offset, end, Ordering::Release, Ordering::Relaxed)
            .expect("seglet writes published out of order");
    }

    /// The published bytes `[offset, offset + length)` of `seglet`. Panics if any of them has not
    /// been written yet: a reference to unwritten memory is a broken invariant.
    pub fn read(&self, seglet: u32, offset: u32, length: usize) -> &[u8] {
        let end = self.check_range(seglet, offset, length);
        let written = self.written[seglet as usize].load(Ordering::Acquire);
        assert!(end <= written, "read of unpublished log bytes");
        let start = self.region_offset(seglet, offset);
        // SAFETY: in bounds (`check_range`); every byte was written and published before the
        // `Acquire` load above and is never written again (invariants 1 and 3), so an immutable
        // slice tied to `&self` is never aliased by a mutation while it lives.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(start), length) }
    }

    /// Bytes already published in `seglet`.
    pub fn written_bytes(&self, seglet: u32) -> u32 {
        self.written[seglet as usize].load(Ordering::Acquire)
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

impl Drop for SegletMemory {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.base.as_ptr(), self.region_bytes);
        // SAFETY: `base`/`region_bytes` came from `Box::into_raw` of a `Box<[u8]>` of exactly this
        // length in `new`, and this is the only place that frees it; `&mut self` proves no slice
        // handed out by `read` is still alive.
        drop(unsafe { Box::from_raw(slice) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small enough to run under Miri (`cargo +nightly miri test -p stratus-log seglet_memory`).
    #[test]
    fn write_then_read_in_order() {
        let memory = SegletMemory::new(4, 64);
        memory.write(1, 0, b"hello");
        memory.write(1, 5, b" world");
        assert_eq!(memory.read(1, 0, 11), b"hello world");
        assert_eq!(memory.read(1, 6, 5), b"world");
        assert_eq!(memory.written_bytes(1), 11);
        assert_eq!(memory.written_bytes(0), 0);
        memory.write(3, 0, &[7u8; 64]);
        assert_eq!(memory.read(3, 0, 64), &[7u8; 64][..]);
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
                        let seen = memory.read(seglet, 0, (step as usize + 1) * 8);
                        assert!(seen.iter().all(|&byte| byte == seglet as u8));
                    }
                });
            }
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
        let _ = memory.read(0, 0, 4);
    }

    #[test]
    #[should_panic(expected = "crosses the end")]
    fn crossing_a_seglet_panics() {
        let memory = SegletMemory::new(2, 64);
        memory.write(0, 60, b"abcdefgh");
    }
}
