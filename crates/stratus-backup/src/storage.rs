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
/// [`ReplicaStorage::sync`] is `fdatasync`.
///
/// O_DIRECT is not used: it needs buffers aligned to the device's block size, and the standard
/// library gives aligned memory only through `unsafe` allocation, which this crate does not
/// contain. The layout keeps every frame and data area 4 KiB-aligned so O_DIRECT can be added
/// without a format change. The file is preallocated with `set_len` (sparse: blocks are
/// allocated on first write; the standard library has no `fallocate`).
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
