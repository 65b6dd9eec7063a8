//! The allocators `bench memory` compares the log with, called through their own malloc and
//! free: glibc's (the process's own), jemalloc's and mimalloc's (linked with prefixed symbols,
//! so they serve only the blocks made here and never the rest of the process).
//!
//! The only unsafe code of the benchmarks' memory comparison lives here, behind [`Block`]: a
//! block owns exactly one allocation of one allocator and gives it back when dropped, so no
//! caller can free twice, free through the wrong allocator, or write outside a block.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ptr::NonNull;

/// A general-purpose allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// glibc's malloc (ptmalloc2), what a C program gets by default.
    Glibc,
    /// jemalloc 5.3 (what Redis links), built from source by `tikv-jemalloc-sys`.
    Jemalloc,
    /// mimalloc 2, built from source by `libmimalloc-sys`.
    Mimalloc,
}

impl Allocator {
    /// The allocator a system name of `bench memory` stands for.
    pub fn named(name: &str) -> Option<Allocator> {
        match name {
            "glibc" => Some(Allocator::Glibc),
            "jemalloc" => Some(Allocator::Jemalloc),
            "mimalloc" => Some(Allocator::Mimalloc),
            _ => None,
        }
    }

    fn allocate(self, bytes: usize) -> *mut c_void {
        // SAFETY: each is the C allocator's malloc, callable with any size; a null result is
        // handled by the caller.
        unsafe {
            match self {
                Allocator::Glibc => libc::malloc(bytes),
                Allocator::Jemalloc => tikv_jemalloc_sys::malloc(bytes),
                Allocator::Mimalloc => libmimalloc_sys::mi_malloc(bytes),
            }
        }
    }

    /// # Safety
    /// `address` came from `self.allocate` and is not used after this call.
    unsafe fn free(self, address: *mut c_void) {
        // SAFETY: the caller's contract: the matching allocator's free, exactly once.
        unsafe {
            match self {
                Allocator::Glibc => libc::free(address),
                Allocator::Jemalloc => tikv_jemalloc_sys::free(address),
                Allocator::Mimalloc => libmimalloc_sys::mi_free(address),
            }
        }
    }
}

/// One allocation holding the concatenation of some byte pieces (an object's key and value),
/// freed by its allocator when dropped.
#[derive(Debug)]
pub struct Block {
    address: NonNull<u8>,
    /// Bytes of the block (stored objects are far below 4 GiB; 16 bytes per block in all).
    bytes: u32,
    allocator: Allocator,
}

impl Block {
    /// Allocates `pieces`' total length with `allocator` and copies them in, so every byte of
    /// the block is written (resident, as a stored object is). Panics when the allocator is
    /// out of memory: the benchmark then has nothing left to measure.
    pub fn new(allocator: Allocator, pieces: &[&[u8]]) -> Block {
        let bytes: usize = pieces.iter().map(|piece| piece.len()).sum();
        let bytes_stored = u32::try_from(bytes).expect("a block is smaller than 4 GiB");
        // malloc(0) may answer null or a unique pointer; one byte keeps the answer uniform.
        let address = NonNull::new(allocator.allocate(bytes.max(1)).cast::<u8>())
            .unwrap_or_else(|| panic!("{allocator:?} could not allocate {bytes} bytes"));
        let mut offset = 0;
        for piece in pieces {
            // SAFETY: the block is `bytes` long and the pieces together are `bytes` long, so
            // [offset, offset + piece.len()) is inside it; a fresh allocation cannot overlap
            // the pieces, which the caller still borrows.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    address.as_ptr().add(offset),
                    piece.len(),
                );
            }
            offset += piece.len();
        }
        Block { address, bytes: bytes_stored, allocator }
    }

    /// The block's bytes.
    pub fn contents(&self) -> &[u8] {
        // SAFETY: the block is `self.bytes` long (at least that was allocated), every byte was
        // written in `new`, and the allocation lives as long as the borrow of `self`.
        unsafe { std::slice::from_raw_parts(self.address.as_ptr(), self.bytes as usize) }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        // SAFETY: the block owns its allocation, made by `self.allocator`, and drop runs once.
        unsafe { self.allocator.free(self.address.as_ptr().cast()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_hold_their_pieces_with_every_allocator() {
        for allocator in [Allocator::Glibc, Allocator::Jemalloc, Allocator::Mimalloc] {
            let blocks: Vec<Block> = (0..1_000u32)
                .map(|index| Block::new(allocator, &[&index.to_le_bytes(), &[7u8; 100]]))
                .collect();
            for (index, block) in blocks.iter().enumerate() {
                assert_eq!(block.contents()[..4], (index as u32).to_le_bytes());
                assert_eq!(block.contents()[4..], [7u8; 100]);
            }
            let empty = Block::new(allocator, &[]);
            assert_eq!(empty.contents(), b"");
        }
        assert_eq!(Allocator::named("jemalloc"), Some(Allocator::Jemalloc));
        assert_eq!(Allocator::named("tcmalloc"), None);
    }
}
