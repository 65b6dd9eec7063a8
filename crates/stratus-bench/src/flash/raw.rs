//! The raw file system, measured in the same run and the same directory as the flash tier:
//! sequential writes of a file as large as the data (1 MiB blocks), and 4 KiB random positioned
//! reads of it at the depths the flash reads are measured at (depth N = N threads, each doing
//! one `pread` at a time).
//!
//! The flash tier's images use O_DIRECT where the file system accepts it (the server's device
//! layer probes with an aligned write, `stratus_flash::FileDevice`); the baseline does the same
//! probe here and uses O_DIRECT when it is accepted, so neither side reads through the page
//! cache. Where it is refused, both go through the page cache, and the rows say so.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use stratus_flash::aligned::AlignedBuffer;

use crate::report::{latency_histogram, Percentiles};
use crate::ycsb::generators::Random;

/// Size of each sequential write: large, as a log writer's flush.
const WRITE_BLOCK_BYTES: usize = 1 << 20;
/// Size of each random read: a flash page.
pub const READ_BYTES: usize = 4 << 10;

/// How the raw file is written and read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RawIo {
    /// O_DIRECT: no page cache; the file is synced once at the end (fdatasync) as well, for
    /// the allocation of its blocks.
    Direct,
    /// The file system refused O_DIRECT: buffered writes then one fdatasync; reads may be
    /// served by the page cache.
    Buffered,
}

impl RawIo {
    /// The name the rows carry.
    pub fn name(self) -> &'static str {
        match self {
            RawIo::Direct => "direct",
            RawIo::Buffered => "buffered+fdatasync",
        }
    }
}

/// Whether the file system under `directory` takes O_DIRECT: opening with it and one aligned
/// write must both succeed (the server's own probe, `stratus_flash::FileDevice::open`).
pub fn probe(directory: &Path) -> RawIo {
    let path = directory.join("raw-direct-io-probe.tmp");
    let outcome = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .and_then(|file| file.write_all_at(AlignedBuffer::zeroed(READ_BYTES).as_slice(), 0));
    let _ = std::fs::remove_file(&path);
    match outcome {
        Ok(()) => RawIo::Direct,
        Err(_) => RawIo::Buffered,
    }
}

fn open(path: &Path, io: RawIo, create: bool) -> Result<File, String> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if create {
        options.create(true).truncate(true);
    }
    if io == RawIo::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path).map_err(|error| format!("{}: {error}", path.display()))
}

/// A sequential write of `bytes` (rounded up to whole blocks) to a new file at `path`, synced
/// at the end; the time includes the sync.
pub fn sequential_write(path: &Path, bytes: u64, io: RawIo) -> Result<Duration, String> {
    let file = open(path, io, true)?;
    let mut block = AlignedBuffer::zeroed(WRITE_BLOCK_BYTES);
    // Not zeros: a file system that compresses or deduplicates would not write them.
    for (index, byte) in block.as_mut_slice().iter_mut().enumerate() {
        *byte = (index as u8).wrapping_mul(31) ^ 0x5a;
    }
    let blocks = bytes.div_ceil(WRITE_BLOCK_BYTES as u64);
    let started = Instant::now();
    for index in 0..blocks {
        file.write_all_at(block.as_slice(), index * WRITE_BLOCK_BYTES as u64)
            .map_err(|error| format!("writing {}: {error}", path.display()))?;
    }
    file.sync_data().map_err(|error| format!("fdatasync of {}: {error}", path.display()))?;
    Ok(started.elapsed())
}

/// What random reads measured.
#[derive(Clone, Copy, Debug)]
pub struct RawReads {
    /// Latency of each read.
    pub percentiles: Percentiles,
    /// Reads per second over all threads.
    pub ops_per_sec: f64,
}

/// `reads` random 4 KiB positioned reads (aligned) of the first `bytes` of the file at `path`,
/// by `depth` threads, each with its own descriptor and one read at a time.
pub fn random_reads(
    path: &Path,
    bytes: u64,
    io: RawIo,
    depth: usize,
    reads: u64,
) -> Result<RawReads, String> {
    let pages = (bytes / READ_BYTES as u64).max(1);
    let depth = depth.max(1);
    let started = Instant::now();
    let histograms = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..depth)
            .map(|thread| {
                let count =
                    reads / depth as u64 + u64::from((thread as u64) < reads % depth as u64);
                scope.spawn(move || -> Result<_, String> {
                    let file = open(path, io, false)?;
                    let mut buffer = AlignedBuffer::zeroed(READ_BYTES);
                    let mut random = Random::new(0x7261_7700 ^ thread as u64);
                    let mut histogram = latency_histogram();
                    for _ in 0..count {
                        let offset = random.uniform(0, pages - 1) * READ_BYTES as u64;
                        let begin = Instant::now();
                        file.read_exact_at(buffer.as_mut_slice(), offset)
                            .map_err(|error| format!("reading {}: {error}", path.display()))?;
                        histogram.saturating_record((begin.elapsed().as_nanos() as u64).max(1));
                    }
                    Ok(histogram)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| "a raw reader panicked".to_string())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    let elapsed = started.elapsed();
    let mut merged = latency_histogram();
    for histogram in &histograms {
        merged.add(histogram).map_err(|error| format!("merging histograms: {error}"))?;
    }
    Ok(RawReads {
        percentiles: Percentiles::of(&merged),
        ops_per_sec: reads as f64 / elapsed.as_secs_f64().max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_written_sequentially_reads_back_at_random_pages() {
        let directory = tempfile::tempdir().unwrap();
        let io = probe(directory.path());
        let path = directory.path().join("raw");
        sequential_write(&path, 3 << 20, io).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        let reads = random_reads(&path, 3 << 20, io, 4, 200).unwrap();
        assert!(reads.ops_per_sec > 0.0);
        assert!(reads.percentiles.p50_us > 0.0);
        assert!(reads.percentiles.p50_us <= reads.percentiles.p99_us);
    }
}
