//! The narrow disk interface of a backup, and its two implementations.
//!
//! A [`ReplicaStorage`] is a fixed-size array of bytes with positional reads and writes and a
//! barrier ([`ReplicaStorage::sync`]) after which every earlier write survives a power loss.
//! Nothing else is assumed: a write not followed by a successful sync may be lost, partly
//! written (torn) or reordered with other unsynced writes. The frame layout on top
//! (docs/design/backup-format.md) is designed for exactly that model, so a simulator (issue 6)
//! can implement this trait with torn writes and lost unsynced data.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A fixed-size byte array on a durable medium.
pub trait ReplicaStorage: Send + Sync + fmt::Debug + 'static {
    /// Bytes the storage holds; reads and writes must stay below this.
    fn capacity_bytes(&self) -> u64;

    /// Writes `bytes` at `offset`. Not durable until a later [`ReplicaStorage::sync`] succeeds.
    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()>;

    /// Fills `buffer` from `offset` (bytes never written read as zero).
    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()>;

    /// Makes every write that completed before this call durable. An error means some of
    /// them may be lost: the caller must stop acknowledging writes (the backup poisons itself).
    fn sync(&self) -> io::Result<()>;
}

fn check_range(offset: u64, length: usize, capacity: u64) -> io::Result<()> {
    match offset.checked_add(length as u64) {
        Some(end) if end <= capacity => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "access of {length} bytes at {offset} is outside the storage's {capacity} bytes"
            ),
        )),
    }
}

/// One preallocated file. Writes go through the page cache (`pwrite`), and
/// [`ReplicaStorage::sync`] is `fdatasync`. [`DirectFileStorage`] is the O_DIRECT variant.
/// The file is preallocated with `set_len` (sparse: blocks are allocated on first write; the
/// standard library has no `fallocate`).
#[derive(Debug)]
pub struct FileStorage {
    file: File,
    path: PathBuf,
    capacity_bytes: u64,
}

impl FileStorage {
    /// Opens (creating if needed) the file at `path` and extends it to `capacity_bytes` if it
    /// is shorter. A longer file is refused: it was made with another geometry.
    pub fn open(path: &Path, capacity_bytes: u64) -> io::Result<FileStorage> {
        let file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        let length = file.metadata()?.len();
        if length > capacity_bytes {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {length} bytes, more than the {capacity_bytes} bytes configured \
                     (was it made with more frames or larger segments?)",
                    path.display()
                ),
            ));
        }
        if length < capacity_bytes {
            file.set_len(capacity_bytes)?;
            file.sync_all()?;
        }
        Ok(FileStorage { file, path: path.to_path_buf(), capacity_bytes })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ReplicaStorage for FileStorage {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        check_range(offset, bytes.len(), self.capacity_bytes)?;
        self.file.write_all_at(bytes, offset)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        check_range(offset, buffer.len(), self.capacity_bytes)?;
        self.file.read_exact_at(buffer, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// The block size O_DIRECT transfers are aligned to (offset, length and memory). 4 KiB covers
/// every common device's logical block size; the backup file layout aligns frames to it.
pub const DIRECT_IO_BLOCK_BYTES: usize = 4_096;

/// The same file as [`FileStorage`], opened with O_DIRECT: writes bypass the page cache, so a
/// backup streaming whole segments does not evict the memory of the master beside it and its
/// bandwidth is the disk's. `sync` is still `fdatasync` (O_DIRECT does not flush the device's
/// cache or the file's metadata).
///
/// O_DIRECT needs block-aligned offsets, lengths and buffers. Buffers are aligned without
/// `unsafe`: an over-allocated vector is used from its first aligned byte. A write that does
/// not cover whole blocks reads the partial first and last blocks and writes them back
/// patched (read-modify-write), under a lock so two such writes cannot interleave.
#[derive(Debug)]
pub struct DirectFileStorage {
    file: File,
    path: PathBuf,
    capacity_bytes: u64,
    read_modify_write: Mutex<()>,
}

/// A zeroed, block-aligned byte region of `length` bytes (a multiple of the block size), as
/// O_DIRECT needs, without unsafe code: an over-allocated vector used from its first aligned
/// byte. Also used by the benchmarks that read backup files directly.
#[derive(Debug)]
pub struct AlignedBuffer {
    bytes: Vec<u8>,
    start: usize,
    length: usize,
}

impl AlignedBuffer {
    /// A zeroed buffer of `length` bytes starting on a [`DIRECT_IO_BLOCK_BYTES`] boundary.
    pub fn new(length: usize) -> AlignedBuffer {
        let bytes = vec![0u8; length + DIRECT_IO_BLOCK_BYTES];
        let start = bytes.as_ptr().align_offset(DIRECT_IO_BLOCK_BYTES);
        assert!(start < DIRECT_IO_BLOCK_BYTES, "no aligned byte in the buffer");
        AlignedBuffer { bytes, start, length }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.length]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.length]
    }
}

impl DirectFileStorage {
    /// Opens (creating if needed) the file at `path` with O_DIRECT, as [`FileStorage::open`]
    /// does. `capacity_bytes` must be a multiple of [`DIRECT_IO_BLOCK_BYTES`]. Fails on file
    /// systems without O_DIRECT (tmpfs, for one).
    pub fn open(path: &Path, capacity_bytes: u64) -> io::Result<DirectFileStorage> {
        if !capacity_bytes.is_multiple_of(DIRECT_IO_BLOCK_BYTES as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("O_DIRECT storage of {capacity_bytes} bytes is not block-aligned"),
            ));
        }
        // Sizing and the geometry check go through the ordinary path first.
        drop(FileStorage::open(path, capacity_bytes)?);
        use std::os::unix::fs::OpenOptionsExt;
        let file =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path)?;
        Ok(DirectFileStorage {
            file,
            path: path.to_path_buf(),
            capacity_bytes,
            read_modify_write: Mutex::new(()),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The block-aligned range covering `[offset, offset + length)`.
    fn aligned_range(offset: u64, length: usize) -> (u64, usize) {
        let block = DIRECT_IO_BLOCK_BYTES as u64;
        let start = offset / block * block;
        let end = (offset + length as u64).div_ceil(block) * block;
        (start, (end - start) as usize)
    }
}

impl ReplicaStorage for DirectFileStorage {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        check_range(offset, bytes.len(), self.capacity_bytes)?;
        if bytes.is_empty() {
            return Ok(());
        }
        let (start, length) = Self::aligned_range(offset, bytes.len());
        let mut buffer = AlignedBuffer::new(length);
        let _guard = self.read_modify_write.lock().unwrap_or_else(|poison| poison.into_inner());
        let head = (offset - start) as usize;
        let tail_start = length - DIRECT_IO_BLOCK_BYTES;
        if head != 0 {
            self.file.read_exact_at(&mut buffer.as_mut_slice()[..DIRECT_IO_BLOCK_BYTES], start)?;
        }
        if head + bytes.len() != length && (tail_start != 0 || head == 0) {
            self.file.read_exact_at(
                &mut buffer.as_mut_slice()[tail_start..],
                start + tail_start as u64,
            )?;
        }
        buffer.as_mut_slice()[head..head + bytes.len()].copy_from_slice(bytes);
        self.file.write_all_at(buffer.as_slice(), start)
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        check_range(offset, buffer.len(), self.capacity_bytes)?;
        if buffer.is_empty() {
            return Ok(());
        }
        let (start, length) = Self::aligned_range(offset, buffer.len());
        let mut aligned = AlignedBuffer::new(length);
        self.file.read_exact_at(aligned.as_mut_slice(), start)?;
        let head = (offset - start) as usize;
        buffer.copy_from_slice(&aligned.as_slice()[head..head + buffer.len()]);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Storage in memory, for tests: every write is at once "durable". Tests corrupt it through
/// [`ReplicaStorage::write_at`] to simulate torn or stale writes.
pub struct MemoryStorage {
    bytes: Mutex<Vec<u8>>,
    capacity_bytes: u64,
}

impl fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStorage").field("capacity_bytes", &self.capacity_bytes).finish()
    }
}

impl MemoryStorage {
    /// Zeroed storage of `capacity_bytes` (memory is used only as far as it is written).
    pub fn new(capacity_bytes: u64) -> MemoryStorage {
        MemoryStorage { bytes: Mutex::new(Vec::new()), capacity_bytes }
    }
}

/// `offset` as an index; the range was checked against the capacity, so on 64-bit targets it
/// always fits.
fn index(offset: u64) -> io::Result<usize> {
    usize::try_from(offset).map_err(|_| io::Error::other("offset does not fit in memory"))
}

impl ReplicaStorage for MemoryStorage {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        check_range(offset, bytes.len(), self.capacity_bytes)?;
        let start = index(offset)?;
        let end = start + bytes.len();
        let mut stored = self.bytes.lock().unwrap_or_else(|poison| poison.into_inner());
        if stored.len() < end {
            stored.resize(end, 0);
        }
        stored[start..end].copy_from_slice(bytes);
        Ok(())
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        check_range(offset, buffer.len(), self.capacity_bytes)?;
        let start = index(offset)?;
        let stored = self.bytes.lock().unwrap_or_else(|poison| poison.into_inner());
        buffer.fill(0);
        if let Some(present) = stored.get(start..) {
            let count = present.len().min(buffer.len());
            buffer[..count].copy_from_slice(&present[..count]);
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exercise(storage: &dyn ReplicaStorage) {
        storage.write_at(10, b"hello").unwrap();
        storage.sync().unwrap();
        let mut buffer = [1u8; 8];
        storage.read_at(8, &mut buffer).unwrap();
        assert_eq!(&buffer, b"\0\0hello\0");
        let capacity = storage.capacity_bytes();
        assert!(storage.write_at(capacity - 2, b"abc").is_err());
        assert!(storage.read_at(u64::MAX, &mut buffer).is_err());
    }

    /// Random unaligned writes and reads through O_DIRECT match the same operations on memory
    /// storage (the read-modify-write of partial blocks keeps neighbouring bytes).
    #[test]
    fn direct_io_storage_matches_memory_storage() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("replicas");
        let capacity = 64 * DIRECT_IO_BLOCK_BYTES as u64;
        let direct = match DirectFileStorage::open(&path, capacity) {
            Ok(storage) => storage,
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("NOTICE: the temporary directory's file system has no O_DIRECT: {error}");
                return;
            }
            Err(error) => panic!("opening with O_DIRECT: {error}"),
        };
        exercise(&direct);
        let memory = MemoryStorage::new(capacity);
        exercise(&memory);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for round in 0..300u64 {
            let length = (next() % 20_000) as usize + 1;
            let offset = next() % (capacity - length as u64);
            let bytes: Vec<u8> = (0..length).map(|index| (index as u64 ^ round) as u8).collect();
            direct.write_at(offset, &bytes).unwrap();
            memory.write_at(offset, &bytes).unwrap();
            let read_length = (next() % 9_000) as usize + 1;
            let read_offset = next() % (capacity - read_length as u64);
            let mut from_direct = vec![0u8; read_length];
            let mut from_memory = vec![0u8; read_length];
            direct.read_at(read_offset, &mut from_direct).unwrap();
            memory.read_at(read_offset, &mut from_memory).unwrap();
            assert_eq!(from_direct, from_memory, "round {round}");
        }
        direct.sync().unwrap();
        let mut whole_direct = vec![0u8; capacity as usize];
        let mut whole_memory = vec![0u8; capacity as usize];
        direct.read_at(0, &mut whole_direct).unwrap();
        memory.read_at(0, &mut whole_memory).unwrap();
        assert!(whole_direct == whole_memory);
    }

    #[test]
    fn memory_storage_reads_what_was_written() {
        exercise(&MemoryStorage::new(64));
    }

    #[test]
    fn file_storage_reads_what_was_written_and_refuses_a_longer_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("replicas");
        exercise(&FileStorage::open(&path, 64).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 64);
        assert!(FileStorage::open(&path, 32).is_err());
        exercise(&FileStorage::open(&path, 128).unwrap());
    }
}
