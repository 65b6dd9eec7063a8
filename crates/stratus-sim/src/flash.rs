//! The simulated servers' flash (`SimulationOptions::tiering`): an in-memory device per server
//! with a small budget, under the master's production `DeviceImages`, and the flash faults the
//! schedule injects (`Fault::FailFlash`).
//!
//! Invariants:
//! 1. A device is deterministic: `MemoryDevice` keeps its segments in a `BTreeMap`, and a
//!    fault is switched on and off by the harness between two steps of the simulation, never
//!    by a timer of its own, so a seed decides every refusal and every failed read.
//! 2. Each incarnation of a server gets a new, empty device (a restarted server deletes every
//!    image it finds anyway: its log starts empty, docs/design/flash-tier.md); the fault
//!    switch and the counters belong to the server index and outlive incarnations, so a fault
//!    begun before a crash still holds after the restart until it heals.
//! 3. A fault changes only what the device answers: a refused or failed write persists
//!    nothing, a failed read returns nothing; the bytes of every image are never altered.

use std::sync::{Arc, Mutex, MutexGuard};

use stratus_flash::{FlashDevice, FlashError, IoOperation, MemoryDevice, SegmentNumber};

/// What a flash fault makes the device do, until it heals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlashFault {
    /// Every allocation of an image is refused as the budget being full (`FlashError::Full`):
    /// demotion must leave the objects in memory.
    Full,
    /// Every write fails with an I/O error (EIO) and persists nothing: the same.
    WriteErrors,
    /// Every read fails with an I/O error: a read of a value on flash must fail clearly
    /// (never a wrong value), a cleaning pass that needs one must leave its segment whole, a
    /// promotion must not happen, a re-replication from an image must wait.
    ReadErrors,
}

/// What the server's devices did, over all its incarnations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlashDeviceCounts {
    /// Writes that persisted.
    pub writes: u64,
    /// Allocations and writes refused by a fault.
    pub writes_refused: u64,
    /// Reads answered.
    pub reads: u64,
    /// Reads failed by a fault.
    pub reads_failed: u64,
}

/// One server's flash: the budget, the fault switch and the counters (invariant 2).
#[derive(Debug)]
pub struct SimulatedFlash {
    segment_bytes: u64,
    budget_bytes: u64,
    state: Mutex<FlashState>,
}

#[derive(Debug, Default)]
struct FlashState {
    fault: Option<FlashFault>,
    counts: FlashDeviceCounts,
}

impl SimulatedFlash {
    /// The flash of a server whose segments are `segment_bytes`, holding at most
    /// `budget_bytes` of images.
    pub fn new(segment_bytes: u64, budget_bytes: u64) -> Arc<SimulatedFlash> {
        Arc::new(SimulatedFlash { segment_bytes, budget_bytes, state: Mutex::default() })
    }

    fn state(&self) -> MutexGuard<'_, FlashState> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Its budget in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// A new, empty device for a new incarnation of the server (invariant 2).
    pub fn device(self: &Arc<Self>) -> Arc<dyn FlashDevice> {
        Arc::new(FaultyDevice {
            inner: MemoryDevice::new(self.segment_bytes, self.budget_bytes),
            flash: self.clone(),
        })
    }

    /// Starts `fault` (replacing any other).
    pub fn fail(&self, fault: FlashFault) {
        self.state().fault = Some(fault);
    }

    /// Ends the fault.
    pub fn heal(&self) {
        self.state().fault = None;
    }

    /// What the devices did so far.
    pub fn counts(&self) -> FlashDeviceCounts {
        self.state().counts
    }
}

/// A `MemoryDevice` behind the server's fault switch.
#[derive(Debug)]
struct FaultyDevice {
    inner: MemoryDevice,
    flash: Arc<SimulatedFlash>,
}

fn injected(operation: IoOperation, segment: SegmentNumber) -> FlashError {
    FlashError::Io { operation, segment, kind: std::io::ErrorKind::Other, os_code: Some(5) }
}

impl FlashDevice for FaultyDevice {
    fn allocate(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        let mut state = self.flash.state();
        if state.fault == Some(FlashFault::Full) {
            state.counts.writes_refused += 1;
            return Err(FlashError::Full { budget_bytes: self.flash.budget_bytes });
        }
        drop(state);
        self.inner.allocate(segment)
    }

    fn write_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), FlashError> {
        let mut state = self.flash.state();
        if matches!(state.fault, Some(FlashFault::Full | FlashFault::WriteErrors)) {
            state.counts.writes_refused += 1;
            return Err(injected(IoOperation::Write, segment));
        }
        let written = self.inner.write_at(segment, offset, bytes);
        if written.is_ok() {
            state.counts.writes += 1;
        }
        written
    }

    fn read_at(
        &self,
        segment: SegmentNumber,
        offset: u64,
        out: &mut [u8],
    ) -> Result<usize, FlashError> {
        let mut state = self.flash.state();
        if state.fault == Some(FlashFault::ReadErrors) {
            state.counts.reads_failed += 1;
            return Err(injected(IoOperation::Read, segment));
        }
        state.counts.reads += 1;
        drop(state);
        self.inner.read_at(segment, offset, out)
    }

    fn sync(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.inner.sync(segment)
    }

    fn free(&self, segment: SegmentNumber) -> Result<(), FlashError> {
        self.inner.free(segment)
    }

    fn segments(&self) -> Result<Vec<SegmentNumber>, FlashError> {
        self.inner.segments()
    }

    fn budget_bytes(&self) -> u64 {
        self.inner.budget_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_flash::aligned::AlignedBuffer;

    #[test]
    fn a_fault_refuses_until_it_heals_and_a_new_incarnation_starts_empty() {
        let flash = SimulatedFlash::new(64 << 10, 256 << 10);
        let device = flash.device();
        let block = AlignedBuffer::zeroed(4096);
        device.allocate(SegmentNumber(1)).unwrap();
        device.write_at(SegmentNumber(1), 0, block.as_slice()).unwrap();
        flash.fail(FlashFault::Full);
        assert!(matches!(device.allocate(SegmentNumber(2)), Err(FlashError::Full { .. })));
        flash.fail(FlashFault::ReadErrors);
        let mut out = AlignedBuffer::zeroed(4096);
        assert!(device.read_at(SegmentNumber(1), 0, out.as_mut_slice()).is_err());
        flash.heal();
        assert_eq!(device.read_at(SegmentNumber(1), 0, out.as_mut_slice()).unwrap(), 4096);
        let counts = flash.counts();
        assert_eq!((counts.writes, counts.writes_refused, counts.reads_failed), (1, 1, 1));
        assert!(flash.device().segments().unwrap().is_empty());
    }
}
