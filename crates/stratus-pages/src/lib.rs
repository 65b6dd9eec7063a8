//! Large zeroed regions whose pages cost physical memory only once touched, and whose pages
//! can be handed back to the operating system: the memory under the log's seglets and the hash
//! table's buckets, so that a server's resident memory follows its data rather than the
//! sizes it was started with (docs/design/cleaner.md, "Memory that tracks the data").
//!
//! On Linux a region is a private anonymous mapping (`mmap`, `MAP_NORESERVE`): the kernel maps
//! a zero page on first touch, and [`PageRegion::release`] is `madvise(MADV_DONTNEED)`, after
//! which the range reads as zeros again and its pages are free. Elsewhere (and under Miri) the
//! region is an ordinary zeroed allocation and `release` zeroes the range, so that callers see
//! the same contents on every platform; only the memory saving is Linux's.
//!
//! This crate holds the engine's only page-level unsafe code; callers get a pointer to a region
//! that outlives them, and rules (below) for using it.

#![allow(unsafe_code)]

use std::ptr::NonNull;

/// The page size the region rounds to. Linux on x86_64 and most arm64 kernels use 4 KiB; a
/// larger system page only makes `release` skip partial pages, never unsound.
pub const PAGE_BYTES: usize = 4096;

/// One region of zeroed memory, owned like a `Box<[u8]>`.
///
/// # Rules for callers
/// - Every access stays inside `[0, len)`.
/// - [`PageRegion::release`] changes the contents of its range (to zeros) behind every
///   reference: the caller must guarantee that no other thread reads or writes that range
///   during the call, and that no reference into it is alive.
pub struct PageRegion {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value, like a `Box<[u8]>`; it is shared only
// through the raw pointer, and callers synchronize their own accesses (rules above).
unsafe impl Send for PageRegion {}
// SAFETY: as above; `&PageRegion` hands out only the base pointer and `release`, whose
// exclusivity the caller guarantees.
unsafe impl Sync for PageRegion {}

impl std::fmt::Debug for PageRegion {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("PageRegion").field("len", &self.len).finish()
    }
}

impl PageRegion {
    /// A zeroed region of `len` bytes (at least one page is reserved), aligned to a page. No
    /// physical memory is used until a page is touched. Panics if the system refuses the
    /// address space (a server cannot run without its log).
    pub fn new(len: usize) -> PageRegion {
        let reserved = len.max(1).next_multiple_of(PAGE_BYTES);
        PageRegion { base: platform::map(reserved), len }
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a region of no bytes (still one page is reserved).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte; valid for `len` bytes while `self` lives.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Gives the whole pages inside `[offset, offset + len)` back to the operating system; they
    /// read as zeros afterwards and use physical memory again only once touched. Returns the
    /// bytes given back (the range rounded inwards to pages). Panics if the range leaves the
    /// region. The caller guarantees that nothing uses the range during the call (see the
    /// type's rules).
    pub fn release(&self, offset: usize, len: usize) -> usize {
        let end = offset.checked_add(len).expect("range overflows");
        assert!(end <= self.len, "release of {offset}..{end} outside a region of {}", self.len);
        let start = offset.next_multiple_of(PAGE_BYTES);
        let stop = end / PAGE_BYTES * PAGE_BYTES;
        if stop <= start {
            return 0;
        }
        // SAFETY: `[start, stop)` lies inside the mapping (checked above); the caller
        // guarantees no reference into it is alive and no other thread touches it meanwhile.
        unsafe { platform::release(self.base.as_ptr().add(start), stop - start) };
        stop - start
    }
}

impl Drop for PageRegion {
    fn drop(&mut self) {
        let reserved = self.len.max(1).next_multiple_of(PAGE_BYTES);
        // SAFETY: `base` came from `platform::map(reserved)` with this same size, and `&mut
        // self` proves nothing borrows the region any more.
        unsafe { platform::unmap(self.base, reserved) };
    }
}

#[cfg(all(target_os = "linux", not(miri)))]
mod platform {
    use std::ptr::NonNull;

    pub(super) fn map(len: usize) -> NonNull<u8> {
        // SAFETY: a fresh private anonymous mapping touches no existing memory; the result is
        // checked against MAP_FAILED before use.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(
            address != libc::MAP_FAILED,
            "mapping {len} bytes failed: {}",
            std::io::Error::last_os_error()
        );
        NonNull::new(address.cast()).expect("mmap never returns null on success")
    }

    /// # Safety
    /// `[start, start + len)` is page-aligned, inside one mapping made by `map`, and unused.
    pub(super) unsafe fn release(start: *mut u8, len: usize) {
        // SAFETY: the caller's contract. MADV_DONTNEED on a private anonymous mapping drops the
        // pages; later reads see zeros, exactly as a fresh mapping.
        let result = unsafe { libc::madvise(start.cast(), len, libc::MADV_DONTNEED) };
        // It fails only for an invalid range, which the checks above rule out.
        assert_eq!(result, 0, "madvise failed: {}", std::io::Error::last_os_error());
    }

    /// # Safety
    /// `base` and `len` are exactly those of a mapping made by `map`, no longer used.
    pub(super) unsafe fn unmap(base: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { libc::munmap(base.as_ptr().cast(), len) };
    }
}

#[cfg(not(all(target_os = "linux", not(miri))))]
mod platform {
    use std::alloc::Layout;
    use std::ptr::NonNull;

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, super::PAGE_BYTES).expect("valid layout")
    }

    pub(super) fn map(len: usize) -> NonNull<u8> {
        // SAFETY: the layout has a non-zero size (at least one page).
        let address = unsafe { std::alloc::alloc_zeroed(layout(len)) };
        NonNull::new(address).unwrap_or_else(|| std::alloc::handle_alloc_error(layout(len)))
    }

    /// # Safety
    /// `[start, start + len)` is inside one region made by `map`, and unused.
    pub(super) unsafe fn release(start: *mut u8, len: usize) {
        // SAFETY: the caller's contract; zeroing keeps the contents the Linux version gives.
        unsafe { std::ptr::write_bytes(start, 0, len) };
    }

    /// # Safety
    /// `base` and `len` are exactly those of a region made by `map`, no longer used.
    pub(super) unsafe fn unmap(base: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract.
        unsafe { std::alloc::dealloc(base.as_ptr(), layout(len)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(region: &PageRegion, offset: usize, bytes: &[u8]) {
        assert!(offset + bytes.len() <= region.len());
        // SAFETY: in bounds, and this test is the only user of the region.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), region.as_ptr().add(offset), bytes.len())
        }
    }

    fn read(region: &PageRegion, offset: usize, len: usize) -> Vec<u8> {
        assert!(offset + len <= region.len());
        // SAFETY: in bounds, and this test is the only user of the region.
        unsafe { std::slice::from_raw_parts(region.as_ptr().add(offset), len) }.to_vec()
    }

    /// Small enough for Miri (`cargo +nightly miri test -p stratus-pages`).
    #[test]
    fn a_region_starts_zeroed_and_release_zeroes_whole_pages_only() {
        let region = PageRegion::new(4 * PAGE_BYTES);
        assert_eq!(region.as_ptr() as usize % PAGE_BYTES, 0);
        assert!(read(&region, 0, 4 * PAGE_BYTES).iter().all(|&byte| byte == 0));
        write(&region, 0, &[7u8; 4 * PAGE_BYTES]);
        // Pages 1 and 2 lie wholly inside; the partial pages at either end are kept.
        assert_eq!(region.release(PAGE_BYTES / 2, 3 * PAGE_BYTES), 2 * PAGE_BYTES);
        assert!(read(&region, 0, PAGE_BYTES).iter().all(|&byte| byte == 7));
        assert!(read(&region, PAGE_BYTES, 2 * PAGE_BYTES).iter().all(|&byte| byte == 0));
        assert!(read(&region, 3 * PAGE_BYTES, PAGE_BYTES).iter().all(|&byte| byte == 7));
        // A released page can be written again.
        write(&region, PAGE_BYTES + 5, b"again");
        assert_eq!(read(&region, PAGE_BYTES + 5, 5), b"again");
        assert_eq!(region.release(10, 20), 0);
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn a_release_past_the_end_panics() {
        let region = PageRegion::new(PAGE_BYTES);
        region.release(0, 2 * PAGE_BYTES);
    }

    /// This process's resident bytes (`/proc/self/statm`).
    #[cfg(all(target_os = "linux", not(miri)))]
    fn process_resident_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * PAGE_BYTES as u64)
    }

    /// Resident memory follows touches and releases (Linux only: elsewhere nothing is
    /// returned). 64 MiB, far above the noise of the test process's own allocations.
    #[cfg(all(target_os = "linux", not(miri)))]
    #[test]
    fn touched_pages_are_resident_and_released_ones_are_not() {
        const BYTES: usize = 64 << 20;
        let region = PageRegion::new(BYTES);
        let before = process_resident_bytes().unwrap();
        for offset in (0..BYTES).step_by(PAGE_BYTES) {
            write(&region, offset, &[1]);
        }
        let touched = process_resident_bytes().unwrap();
        assert!(touched >= before + (BYTES as u64) * 9 / 10, "{before} -> {touched}");
        assert_eq!(region.release(0, BYTES), BYTES);
        let released = process_resident_bytes().unwrap();
        assert!(released + (BYTES as u64) * 9 / 10 <= touched, "{touched} -> {released}");
    }
}
