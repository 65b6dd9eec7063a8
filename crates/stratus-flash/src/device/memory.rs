//! An in-memory device with injectable faults: a torn write (only a prefix persists, and the
//! write fails, as when the machine dies during it), read errors, write and sync errors, and a
//! space budget. Clones share the same storage, so a test "restarts" by opening a new log on a
//! clone. Writes persist at once: the device has no volatile cache, a tear is the crash model.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::address::SegmentNumber;
use crate::constants::IO_ALIGNMENT_BYTES;
use crate::device::FlashDevice;
use crate::error::{FlashError, IoOperation};

/// An in-memory device; see the module documentation.
#[derive(Clone, Debug)]
pub struct MemoryDevice {
    state: Arc<Mutex<MemoryState>>,
}

#[derive(Debug, Default)]
struct Faults {
    /// The next write persists only this many bytes of its start, then fails.
    torn_write_keep_bytes: Option<usize>,
    /// How many of the next writes fail without persisting anything.
    write_errors: u32,
    /// How many of the next reads fail.
    read_errors: u32,
    /// How many of the next syncs fail.
    sync_errors: u32,
    /// How many of the next frees fail, keeping the segment.
    free_errors: u32,
}

#[derive(Debug)]
struct MemoryState {
    segments: BTreeMap<SegmentNumber, Vec<u8>>,
    segment_bytes: u64,
    budget_bytes: u64,
    faults: Faults,
    writes: u64,
}

fn injected(operation: IoOperation, segment: SegmentNumber) -> FlashError {
    FlashError::Io { operation, segment, kind: std::io::ErrorKind::Other, os_code: Some(libc::EIO) }
}

fn assert_aligned(offset: u64, bytes: &[u8]) {
    let alignment = IO_ALIGNMENT_BYTES as u64;
    assert!(
        offset.is_multiple_of(alignment) && (bytes.len() as u64).is_multiple_of(alignment),
        "unaligned device I/O: offset {offset}, length {}",
        bytes.len()
    );
    assert_eq!(bytes.as_ptr() as usize % IO_ALIGNMENT_BYTES, 0, "unaligned I/O memory");
}

impl MemoryDevice {
    /// A device holding at most `budget_bytes` of segments of `segment_bytes` each.
    pub fn new(segment_bytes: u64, budget_bytes: u64) -> MemoryDevice {
        let state = MemoryState {
            segments: BTreeMap::new(),
            segment_bytes,
            budget_bytes,
            faults: Faults::default(),
            writes: 0,
        };
        MemoryDevice { state: Arc::new(Mutex::new(state)) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The next write persists only its first `keep_bytes` bytes and fails.
    pub fn tear_next_write(&self, keep_bytes: usize) {
        self.lock().faults.torn_write_keep_bytes = Some(keep_bytes);
    }

    /// The next `count` writes fail, persisting nothing.
    pub fn fail_next_writes(&self, count: u32) {
        self.lock().faults.write_errors = count;
    }

    /// The next `count` reads fail.
    pub fn fail_next_reads(&self, count: u32) {
        self.lock().faults.read_errors = count;
    }

    /// The next `count` syncs fail.
    pub fn fail_next_syncs(&self, count: u32) {
        self.lock().faults.sync_errors = count;
    }

    /// The next `count` frees fail; the segments stay.
    pub fn fail_next_frees(&self, count: u32) {
        self.lock().faults.free_errors = count;
    }

    /// Changes the space budget (a smaller one than is in use makes the next allocation fail).
    pub fn set_budget_bytes(&self, budget_bytes: u64) {
        self.lock().budget_bytes = budget_bytes;
    }

    /// Writes done so far (failed ones included).
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// The segments stored (for tests; the trait's `segments` says the same).
    pub fn segments_present(&self) -> Vec<SegmentNumber> {
        self.lock().segments.keys().copied().collect()
    }

    /// Overwrites stored bytes directly, as media corruption would (for tests).
    pub fn corrupt(&self, segment: SegmentNumber, offset: usize, bytes: &[u8]) {
        let mut state = self.lock();
        let data = state.segments.get_mut(&segment).expect("corrupting a segment that exists");
        if data.len() < offset + bytes.len() {
            data.resize(offset + bytes.len(), 0);
        }
        data[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
}

impl FlashDevice for MemoryDevice {
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        let mut state = self.lock();
        let used_bytes = state.segments.len() as u64 * state.segment_bytes;
        if used_bytes + state.segment_bytes > state.budget_bytes {
            return Err(FlashError::Full { budget_bytes: state.budget_bytes });
        }
        let previous = state.segments.insert(segment, Vec::new());
        assert!(previous.is_none(), "segment {segment:?} allocated twice");
        Ok(())
    }

    fn write_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FlashError> {
        assert_aligned(offset, bytes);
        let mut state = self.lock();
        state.writes += 1;
        assert!(offset + bytes.len() as u64 <= state.segment_bytes, "write past the segment");
        if state.faults.write_errors > 0 {
            state.faults.write_errors -= 1;
            return Err(injected(IoOperation::Write, segment));
        }
        let torn = state.faults.torn_write_keep_bytes.take();
        let persisted = &bytes[..torn.unwrap_or(bytes.len()).min(bytes.len())];
        let data = state.segments.get_mut(&segment).expect("writing a segment never allocated");
        let start = offset as usize;
        if data.len() < start + persisted.len() {
            data.resize(start + persisted.len(), 0);
        }
        data[start..start + persisted.len()].copy_from_slice(persisted);
        match torn {
            Some(_) => Err(injected(IoOperation::Write, segment)),
            None => Ok(()),
        }
    }

    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError> {
        assert_aligned(offset, out);
        let mut state = self.lock();
        if state.faults.read_errors > 0 {
            state.faults.read_errors -= 1;
            return Err(injected(IoOperation::Read, segment));
        }
        let Some(data) = state.segments.get(&segment) else {
            return Err(FlashError::Io {
                operation: IoOperation::Read,
                segment,
                kind: std::io::ErrorKind::NotFound,
                os_code: Some(libc::ENOENT),
            });
        };
        let start = (offset as usize).min(data.len());
        let present = (data.len() - start).min(out.len());
        out[..present].copy_from_slice(&data[start..start + present]);
        out[present..].fill(0);
        Ok(present)
    }

    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        let mut state = self.lock();
        if state.faults.sync_errors > 0 {
            state.faults.sync_errors -= 1;
            return Err(injected(IoOperation::Sync, segment));
        }
        Ok(())
    }

    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        let mut state = self.lock();
        if state.faults.free_errors > 0 {
            state.faults.free_errors -= 1;
            return Err(injected(IoOperation::Free, segment));
        }
        let removed = state.segments.remove(&segment);
        assert!(removed.is_some(), "freeing segment {segment:?}, which does not exist");
        Ok(())
    }

    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError> {
        Ok(self.lock().segments.keys().copied().collect())
    }

    fn budget_bytes(&self) -> u64 {
        self.lock().budget_bytes
    }
}
