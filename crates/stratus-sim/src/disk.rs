//! A simulated disk for a backup: what a crash does to data that was written but not synced,
//! and the faults a real disk shows (failed writes and syncs, torn writes, flipped bits).

use std::fmt;
use std::io;
use std::sync::{Mutex, MutexGuard};

use stratus_backup::ReplicaStorage;

use crate::schedule::Choices;

/// Bytes a torn write keeps are a whole number of these (a disk sector: what hardware writes
/// atomically).
const SECTOR_BYTES: usize = 512;

/// What a crash does to each write that was not synced yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    /// Never reached the platter.
    Lost,
    /// Reached it whole.
    Kept,
    /// Reached it in part: a prefix of whole sectors.
    Torn,
}

#[derive(Default)]
struct DiskState {
    /// What survives a crash.
    durable: Vec<u8>,
    /// What reads see: `durable` plus the writes since the last sync.
    current: Vec<u8>,
    /// Writes since the last successful sync, oldest first.
    unsynced: Vec<(u64, Vec<u8>)>,
    /// The next this many syncs fail (then the disk works again; the backup must have stopped
    /// acknowledging on the first failure).
    failing_syncs: u32,
    /// The next this many writes fail.
    failing_writes: u32,
    /// Faults applied so far, for the run's report.
    faults: Vec<String>,
}

fn write_into(target: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let start = offset as usize;
    let end = start + bytes.len();
    if target.len() < end {
        target.resize(end, 0);
    }
    target[start..end].copy_from_slice(bytes);
}

fn read_from(source: &[u8], offset: u64, buffer: &mut [u8]) {
    buffer.fill(0);
    let start = offset as usize;
    if start >= source.len() {
        return;
    }
    let available = (source.len() - start).min(buffer.len());
    buffer[..available].copy_from_slice(&source[start..start + available]);
}

/// One backup's disk. It outlives the incarnations of its node: a restarted node opens the
/// same disk, holding what the crash left of it.
pub struct SimulatedDisk {
    capacity_bytes: u64,
    state: Mutex<DiskState>,
}

impl fmt::Debug for SimulatedDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatedDisk").field("capacity_bytes", &self.capacity_bytes).finish()
    }
}

impl SimulatedDisk {
    /// An empty (zeroed) disk of `capacity_bytes`.
    pub fn new(capacity_bytes: u64) -> SimulatedDisk {
        SimulatedDisk { capacity_bytes, state: Mutex::new(DiskState::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The node crashed: each unsynced write is lost, kept or torn, as `choices` decide. The
    /// disk's own failures were transient: the restarted node finds it working.
    pub fn crash(&self, choices: &mut Choices) {
        let mut state = self.lock();
        state.failing_syncs = 0;
        state.failing_writes = 0;
        let unsynced = std::mem::take(&mut state.unsynced);
        let (mut lost, mut kept, mut torn) = (0, 0, 0);
        for (offset, bytes) in unsynced {
            let fate = match choices.below(3) {
                0 => Fate::Lost,
                1 => Fate::Kept,
                _ => Fate::Torn,
            };
            match fate {
                Fate::Lost => lost += 1,
                Fate::Kept => {
                    kept += 1;
                    write_into(&mut state.durable, offset, &bytes);
                }
                Fate::Torn => {
                    torn += 1;
                    let sectors = bytes.len().div_ceil(SECTOR_BYTES) as u64;
                    let kept_bytes =
                        (choices.below(sectors.max(1)) as usize * SECTOR_BYTES).min(bytes.len());
                    write_into(&mut state.durable, offset, &bytes[..kept_bytes]);
                }
            }
        }
        state.current = state.durable.clone();
        if lost + kept + torn > 0 {
            state
                .faults
                .push(format!("crash: {lost} unsynced writes lost, {kept} kept, {torn} torn"));
        }
    }

    /// Flips one bit of what is on the disk, somewhere in what was ever written (a latent
    /// sector error that the backup's checksums must catch). Returns the offset.
    pub fn flip_bit(&self, choices: &mut Choices) -> Option<u64> {
        let mut state = self.lock();
        if state.durable.is_empty() {
            return None;
        }
        let offset = choices.below(state.durable.len() as u64);
        let mask = 1u8 << choices.below(8);
        state.durable[offset as usize] ^= mask;
        if let Some(byte) = state.current.get_mut(offset as usize) {
            *byte ^= mask;
        }
        state.faults.push(format!("bit flipped at offset {offset}"));
        Some(offset)
    }

    /// The next `count` syncs fail.
    pub fn fail_syncs(&self, count: u32) {
        let mut state = self.lock();
        state.failing_syncs += count;
        state.faults.push(format!("next {count} syncs fail"));
    }

    /// The next `count` writes fail.
    pub fn fail_writes(&self, count: u32) {
        let mut state = self.lock();
        state.failing_writes += count;
        state.faults.push(format!("next {count} writes fail"));
    }

    /// Bytes of memory the disk's contents take in the simulator: what survives a crash, what
    /// reads see, and the unsynced writes (each a copy).
    pub fn held_bytes(&self) -> u64 {
        let state = self.lock();
        let unsynced: usize = state.unsynced.iter().map(|(_, bytes)| bytes.len()).sum();
        (state.durable.len() + state.current.len() + unsynced) as u64
    }

    /// The faults applied so far, in order.
    pub fn faults(&self) -> Vec<String> {
        self.lock().faults.clone()
    }

    fn check_range(&self, offset: u64, length: usize) -> io::Result<()> {
        match offset.checked_add(length as u64) {
            Some(end) if end <= self.capacity_bytes => Ok(()),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "access outside the disk")),
        }
    }
}

impl ReplicaStorage for SimulatedDisk {
    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.check_range(offset, bytes.len())?;
        let mut state = self.lock();
        if state.failing_writes > 0 {
            state.failing_writes -= 1;
            return Err(io::Error::other("simulated write error"));
        }
        write_into(&mut state.current, offset, bytes);
        state.unsynced.push((offset, bytes.to_vec()));
        Ok(())
    }

    fn read_at(&self, offset: u64, buffer: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buffer.len())?;
        read_from(&self.lock().current, offset, buffer);
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.lock();
        if state.failing_syncs > 0 {
            // As Linux may after a failed fsync: the pages stay readable for now (the page
            // cache keeps them), but they were marked clean, so no later sync writes them: a
            // crash loses them even after a sync that succeeds.
            state.failing_syncs -= 1;
            let dropped = std::mem::take(&mut state.unsynced).len();
            state.faults.push(format!("a failed sync dropped {dropped} unsynced writes"));
            return Err(io::Error::other("simulated sync error"));
        }
        let unsynced = std::mem::take(&mut state.unsynced);
        for (offset, bytes) in unsynced {
            write_into(&mut state.durable, offset, &bytes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_writes_survive_a_crash_and_unsynced_ones_may_not() {
        let disk = SimulatedDisk::new(1 << 20);
        disk.write_at(0, &[1u8; 1024]).unwrap();
        disk.sync().unwrap();
        disk.write_at(4096, &[2u8; 4096]).unwrap();
        let mut buffer = [0u8; 4096];
        disk.read_at(4096, &mut buffer).unwrap();
        assert_eq!(buffer, [2u8; 4096], "reads see unsynced writes");
        // Over many crashes of the same pattern, every fate happens.
        let mut outcomes = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let disk = SimulatedDisk::new(1 << 20);
            disk.write_at(0, &[1u8; 1024]).unwrap();
            disk.sync().unwrap();
            disk.write_at(4096, &[2u8; 4096]).unwrap();
            disk.crash(&mut Choices::new(seed));
            let mut synced = [0u8; 1024];
            disk.read_at(0, &mut synced).unwrap();
            assert_eq!(synced, [1u8; 1024], "a synced write survives");
            let mut buffer = [0u8; 4096];
            disk.read_at(4096, &mut buffer).unwrap();
            let kept = buffer.iter().take_while(|&&byte| byte == 2).count();
            assert!(buffer[kept..].iter().all(|&byte| byte == 0), "a torn write keeps a prefix");
            assert_eq!(kept % SECTOR_BYTES, 0, "a torn write keeps whole sectors");
            outcomes.insert(kept);
        }
        assert!(outcomes.contains(&0) && outcomes.contains(&4096) && outcomes.len() > 2);
    }

    #[test]
    fn a_failed_sync_makes_nothing_durable_then_or_later() {
        let disk = SimulatedDisk::new(1 << 20);
        disk.write_at(0, &[7u8; 512]).unwrap();
        disk.fail_syncs(1);
        assert!(disk.sync().is_err());
        // Find a seed whose crash loses the write: a failed sync promised nothing.
        let lost = (0..32).any(|seed| {
            let disk = SimulatedDisk::new(1 << 20);
            disk.write_at(0, &[7u8; 512]).unwrap();
            disk.fail_syncs(1);
            let _ = disk.sync();
            disk.crash(&mut Choices::new(seed));
            let mut buffer = [0u8; 512];
            disk.read_at(0, &mut buffer).unwrap();
            buffer == [0u8; 512]
        });
        assert!(lost);
        assert!(disk.sync().is_ok(), "the disk works again after the failed sync");
        // A later sync that succeeds does not make the dropped writes durable: every crash
        // loses them now, while reads still see them until then (the page cache).
        for seed in 0..32 {
            let disk = SimulatedDisk::new(1 << 20);
            disk.write_at(0, &[7u8; 512]).unwrap();
            disk.fail_syncs(1);
            assert!(disk.sync().is_err());
            disk.sync().unwrap();
            let mut buffer = [0u8; 512];
            disk.read_at(0, &mut buffer).unwrap();
            assert_eq!(buffer, [7u8; 512], "still readable before the crash");
            disk.crash(&mut Choices::new(seed));
            disk.read_at(0, &mut buffer).unwrap();
            assert_eq!(
                buffer, [0u8; 512],
                "seed {seed}: a write dropped by a failed sync survived"
            );
        }
    }

    #[test]
    fn a_flipped_bit_changes_one_bit_and_accesses_stay_in_bounds() {
        let disk = SimulatedDisk::new(8192);
        assert!(disk.write_at(8000, &[0u8; 512]).is_err());
        disk.write_at(0, &[0u8; 100]).unwrap();
        disk.sync().unwrap();
        let offset = disk.flip_bit(&mut Choices::new(3)).unwrap();
        let mut buffer = [0u8; 100];
        disk.read_at(0, &mut buffer).unwrap();
        let ones: u32 = buffer.iter().map(|byte| byte.count_ones()).sum();
        assert_eq!(ones, 1);
        assert_ne!(buffer[offset as usize], 0);
    }
}
