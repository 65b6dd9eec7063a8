//! Memory aligned for direct I/O, without unsafe code: a vector over-allocated by one
//! alignment unit, of which an aligned window is used. The address is read (never turned back
//! into a pointer), so this is plain safe Rust.

use crate::constants::IO_ALIGNMENT_BYTES;

/// A zeroed byte buffer whose start is aligned to [`IO_ALIGNMENT_BYTES`].
#[derive(Debug)]
pub struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
    length: usize,
}

impl AlignedBuffer {
    /// A zeroed buffer of `length` bytes.
    pub fn zeroed(length: usize) -> AlignedBuffer {
        let storage = vec![0u8; length + IO_ALIGNMENT_BYTES];
        let misalignment = storage.as_ptr() as usize % IO_ALIGNMENT_BYTES;
        let start = (IO_ALIGNMENT_BYTES - misalignment) % IO_ALIGNMENT_BYTES;
        AlignedBuffer { storage, start, length }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.length]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.length]
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
}

/// `length` rounded up to the I/O alignment.
pub fn align_up(length: u64) -> u64 {
    length.div_ceil(IO_ALIGNMENT_BYTES as u64) * IO_ALIGNMENT_BYTES as u64
}

/// `offset` rounded down to the I/O alignment.
pub fn align_down(offset: u64) -> u64 {
    offset - offset % IO_ALIGNMENT_BYTES as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_aligned_zeroed_and_of_the_asked_length() {
        for length in [0, 1, 4096, 10_000] {
            let buffer = AlignedBuffer::zeroed(length);
            assert_eq!(buffer.as_slice().as_ptr() as usize % IO_ALIGNMENT_BYTES, 0);
            assert_eq!(buffer.len(), length);
            assert!(buffer.as_slice().iter().all(|&byte| byte == 0));
        }
        assert_eq!(align_up(1), 4096);
        assert_eq!(align_up(4096), 4096);
        assert_eq!(align_down(8191), 4096);
    }
}
