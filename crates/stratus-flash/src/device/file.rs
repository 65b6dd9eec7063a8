//! Segments as files in one directory, one file per segment (`<number as 16 hex digits>.segment`).
//!
//! One file per segment rather than one preallocated file: freeing a segment is an unlink, which
//! returns its space to the file system at once (no hole punching or TRIM bookkeeping); a new
//! segment starts as an empty file, so no bytes of an earlier incarnation can be mistaken for
//! entries by the restart scan; and restart finds the segments by listing the directory.
//!
//! Direct I/O (O_DIRECT) is used when the file system accepts it: `open` probes with an aligned
//! write, and falls back to buffered I/O (tmpfs, some overlay file systems refuse O_DIRECT) and
//! says so in [`FileDevice::io_mode`]. Either way every write is followed by fdatasync before the
//! log counts it durable.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::address::SegmentNumber;
use crate::aligned::AlignedBuffer;
use crate::constants::IO_ALIGNMENT_BYTES;
use crate::device::FlashDevice;
use crate::error::{FlashError, IoOperation};

/// How the device reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// O_DIRECT: no page cache; reads and writes go to the drive.
    Direct,
    /// The file system refused O_DIRECT: reads may be served by the page cache.
    Buffered,
}

/// A directory of segment files; see the module documentation.
#[derive(Debug)]
pub struct FileDevice {
    directory: PathBuf,
    mode: IoMode,
    segment_bytes: u64,
    budget_bytes: u64,
    files: Mutex<BTreeMap<SegmentNumber, Arc<File>>>,
}

const SEGMENT_SUFFIX: &str = ".segment";
const PROBE_NAME: &str = "direct-io-probe.tmp";

fn io_error(
    operation: IoOperation,
    segment: SegmentNumber,
    budget_bytes: u64,
) -> impl Fn(std::io::Error) -> FlashError {
    move |error| FlashError::from_io(operation, segment, &error, budget_bytes)
}

impl FileDevice {
    /// Opens (creating it if needed) the directory `directory` for segments of
    /// `segment_bytes`, holding at most `budget_bytes` of them. Existing segments count against
    /// the budget.
    pub fn open(
        directory: &Path,
        segment_bytes: u64,
        budget_bytes: u64,
    ) -> Result<FileDevice, FlashError> {
        let none = SegmentNumber(0);
        std::fs::create_dir_all(directory).map_err(io_error(
            IoOperation::Open,
            none,
            budget_bytes,
        ))?;
        let mode = probe_direct_io(directory);
        let mut files = BTreeMap::new();
        let entries = std::fs::read_dir(directory).map_err(io_error(
            IoOperation::List,
            none,
            budget_bytes,
        ))?;
        for entry in entries {
            let entry = entry.map_err(io_error(IoOperation::List, none, budget_bytes))?;
            let name = entry.file_name();
            let Some(segment) = name.to_str().and_then(parse_segment_name) else { continue };
            let file = open_segment(&entry.path(), mode, false).map_err(io_error(
                IoOperation::Open,
                segment,
                budget_bytes,
            ))?;
            files.insert(segment, Arc::new(file));
        }
        Ok(FileDevice {
            directory: directory.to_path_buf(),
            mode,
            segment_bytes,
            budget_bytes,
            files: Mutex::new(files),
        })
    }

    /// Whether O_DIRECT is in use.
    pub fn io_mode(&self) -> IoMode {
        self.mode
    }

    fn path_of(&self, segment: SegmentNumber) -> PathBuf {
        self.directory.join(format!("{:016x}{SEGMENT_SUFFIX}", segment.0))
    }

    /// fsync of the directory, so the creation or removal of a segment file is durable.
    fn sync_directory(&self) -> std::io::Result<()> {
        File::open(&self.directory)?.sync_all()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<SegmentNumber, Arc<File>>> {
        self.files.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn file(
        &self,
        operation: IoOperation,
        segment: SegmentNumber,
    ) -> Result<Arc<File>, FlashError> {
        self.lock().get(&segment).cloned().ok_or(FlashError::Io {
            operation,
            segment,
            kind: std::io::ErrorKind::NotFound,
            os_code: Some(libc::ENOENT),
        })
    }
}

fn parse_segment_name(name: &str) -> Option<SegmentNumber> {
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 16 {
        return None;
    }
    u64::from_str_radix(digits, 16).ok().map(SegmentNumber)
}

fn open_segment(path: &Path, mode: IoMode, create: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(create);
    if mode == IoMode::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

/// Whether the file system under `directory` takes O_DIRECT: opening with the flag and one
/// aligned write must both succeed (some file systems accept the flag and fail the write).
fn probe_direct_io(directory: &Path) -> IoMode {
    let path = directory.join(PROBE_NAME);
    let outcome = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .and_then(|file| {
            file.write_all_at(AlignedBuffer::zeroed(IO_ALIGNMENT_BYTES).as_slice(), 0)
        });
    // The probe file is only a probe: failing to remove it leaves a small file and changes nothing.
    let _ = std::fs::remove_file(&path);
    match outcome {
        Ok(()) => IoMode::Direct,
        Err(_) => IoMode::Buffered,
    }
}

impl FlashDevice for FileDevice {
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        let mut files = self.lock();
        if (files.len() as u64 + 1) * self.segment_bytes > self.budget_bytes {
            return Err(FlashError::Full { budget_bytes: self.budget_bytes });
        }
        let file = open_segment(&self.path_of(segment), self.mode, true).map_err(io_error(
            IoOperation::Allocate,
            segment,
            self.budget_bytes,
        ))?;
        // fdatasync of the file makes its data durable, not its name: without this, a crash
        // could lose the whole file, synced slots and all.
        self.sync_directory().map_err(io_error(
            IoOperation::Allocate,
            segment,
            self.budget_bytes,
        ))?;
        files.insert(segment, Arc::new(file));
        Ok(())
    }

    fn write_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FlashError> {
        self.file(IoOperation::Write, segment)?.write_all_at(bytes, offset).map_err(io_error(
            IoOperation::Write,
            segment,
            self.budget_bytes,
        ))
    }

    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError> {
        let file = self.file(IoOperation::Read, segment)?;
        let mut present = 0;
        while present < out.len() {
            match file.read_at(&mut out[present..], offset + present as u64) {
                Ok(0) => break,
                Ok(count) => present += count,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(io_error(IoOperation::Read, segment, self.budget_bytes)(error))
                }
            }
        }
        out[present..].fill(0);
        Ok(present)
    }

    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.file(IoOperation::Sync, segment)?.sync_data().map_err(io_error(
            IoOperation::Sync,
            segment,
            self.budget_bytes,
        ))
    }

    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        // Readers holding the file keep it readable until they drop it (unlink semantics), but
        // the log frees a segment only after its read epoch has drained anyway.
        let mut files = self.lock();
        let error = io_error(IoOperation::Free, segment, self.budget_bytes);
        match std::fs::remove_file(self.path_of(segment)) {
            // Already gone: an earlier free unlinked it and failed after (at the directory sync).
            Err(unlink) if unlink.kind() == std::io::ErrorKind::NotFound => {}
            // Kept in the map: the segment still holds its space and the free can be retried.
            Err(unlink) => return Err(error(unlink)),
            Ok(()) => {}
        }
        files.remove(&segment);
        // Without it, a crash could bring the unlinked file back (with segments after it gone).
        self.sync_directory().map_err(error)
    }

    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError> {
        Ok(self.lock().keys().copied().collect())
    }

    fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_written_read_listed_and_freed_across_reopens() {
        let directory = tempfile::tempdir().unwrap();
        let device = FileDevice::open(directory.path(), 64 << 10, 128 << 10).unwrap();
        device.allocate(SegmentNumber(1)).unwrap();
        device.allocate(SegmentNumber(2)).unwrap();
        assert_eq!(
            device.allocate(SegmentNumber(3)),
            Err(FlashError::Full { budget_bytes: 128 << 10 })
        );
        let mut block = AlignedBuffer::zeroed(4096);
        block.as_mut_slice().fill(7);
        device.write_at(SegmentNumber(2), 4096, block.as_slice()).unwrap();
        device.sync(SegmentNumber(2)).unwrap();
        drop(device);

        let device = FileDevice::open(directory.path(), 64 << 10, 128 << 10).unwrap();
        assert_eq!(device.segments().unwrap(), vec![SegmentNumber(1), SegmentNumber(2)]);
        let mut out = AlignedBuffer::zeroed(3 * 4096);
        assert_eq!(device.read_at(SegmentNumber(2), 0, out.as_mut_slice()).unwrap(), 8192);
        assert!(out.as_slice()[..4096].iter().all(|&byte| byte == 0));
        assert!(out.as_slice()[4096..8192].iter().all(|&byte| byte == 7));
        device.free(SegmentNumber(1)).unwrap();
        device.allocate(SegmentNumber(3)).unwrap();
        assert_eq!(device.segments().unwrap(), vec![SegmentNumber(2), SegmentNumber(3)]);
    }
}
