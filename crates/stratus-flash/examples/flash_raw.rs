//! Raw device speed against the flash log's, on one file system, in one run.
//!
//!     cargo run --release -p stratus-flash --example flash_raw -- [directory] [MiB]
//!
//! Measures, in a fresh temporary directory under `directory` (default: the system temp dir),
//! with `MiB` of data (default 256):
//! - raw sequential writes: 1 MiB pwrite + fdatasync each, MB/s;
//! - the flash log's appends of 1 KiB entries (one appender thread, a background flusher that
//!   writes 1 MiB buffers with fdatasync), MB/s and entries/s, up to `sync`;
//! - raw 4 KiB random preads: latency p50/p99 at depth 1, throughput at depth 32 (32 threads);
//! - the flash log's random reads of those entries: latency at depth 1 with `read` (no size
//!   known) and `read_sized` (the size an index knows), throughput at depth 32 with
//!   `read_sized` through a `ReadPool` of 32 threads.
//!
//! The same I/O mode (O_DIRECT or buffered) is used for the raw and the log measures; it is
//! printed. With buffered I/O the reads measure the page cache, not the disk.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use stratus_flash::aligned::AlignedBuffer;
use stratus_flash::io::{BackgroundFlusher, ReadPool};
use stratus_flash::{
    EntryRef, FileDevice, FlashAddress, FlashConfig, FlashError, FlashLog, IoMode,
};

const MIB: usize = 1 << 20;
const BLOCK_BYTES: usize = 4096;
const READS_DEPTH_1: usize = 20_000;
const READS_PER_THREAD_DEPTH_32: usize = 2_000;
const DEPTH: usize = 32;

/// A small deterministic generator (SplitMix64), so runs read the same offsets.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn megabytes_per_second(bytes: usize, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

fn percentile(sorted: &[Duration], percent: usize) -> Duration {
    sorted[(sorted.len() * percent / 100).min(sorted.len() - 1)]
}

fn report_latency(name: &str, mut latencies: Vec<Duration>) {
    latencies.sort();
    println!(
        "{name}: p50 {:.1} us, p99 {:.1} us ({} reads)",
        percentile(&latencies, 50).as_secs_f64() * 1e6,
        percentile(&latencies, 99).as_secs_f64() * 1e6,
        latencies.len()
    );
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut arguments = std::env::args().skip(1);
    let parent = arguments.next().map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let total_mib: usize = arguments.next().map(|text| text.parse()).transpose()?.unwrap_or(256);
    let directory = tempfile::tempdir_in(&parent)?;
    let device = FileDevice::open(&directory.path().join("log"), 8 << 20, 1 << 40)?;
    let mode = device.io_mode();
    println!("directory {} ({total_mib} MiB per test), I/O mode {mode:?}", parent.display());

    // Raw sequential writes.
    let raw_path = directory.path().join("raw");
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(true);
    if mode == IoMode::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let raw = options.open(&raw_path)?;
    let mut block = AlignedBuffer::zeroed(MIB);
    block.as_mut_slice().iter_mut().enumerate().for_each(|(index, byte)| *byte = index as u8);
    let start = Instant::now();
    for chunk in 0..total_mib {
        raw.write_all_at(block.as_slice(), (chunk * MIB) as u64)?;
        raw.sync_data()?;
    }
    let elapsed = start.elapsed();
    println!(
        "raw sequential write, 1 MiB pwrite + fdatasync: {:.0} MB/s",
        megabytes_per_second(total_mib * MIB, elapsed)
    );

    // The log's appends of 1 KiB entries.
    let log = Arc::new(FlashLog::create(Arc::new(device), FlashConfig::new(1))?);
    let value = vec![0x5Au8; 1024 - 40 - 8];
    let entries = total_mib * MIB / 1024;
    let flusher = BackgroundFlusher::spawn(Arc::clone(&log), Duration::from_micros(100));
    let mut addresses = Vec::with_capacity(entries);
    let mut busy_waits = 0u64;
    let start = Instant::now();
    for number in 0..entries as u64 {
        let key = number.to_le_bytes();
        let entry = EntryRef::object(1, &key, &value, number);
        let address = loop {
            match log.append(&entry) {
                Err(FlashError::BuffersBusy) => {
                    busy_waits += 1;
                    std::thread::yield_now();
                }
                other => break other?,
            }
        };
        addresses.push(address);
    }
    let appended = start.elapsed();
    log.sync()?;
    let synced = start.elapsed();
    if let Some(error) = flusher.stop() {
        return Err(error.into());
    }
    println!(
        "flash log append, 1 KiB entries: {:.0} MB/s, {:.0} entries/s to durable \
         ({:.0} MB/s into buffers before the final sync; {busy_waits} waits for a buffer)",
        megabytes_per_second(entries * 1024, synced),
        entries as f64 / synced.as_secs_f64(),
        megabytes_per_second(entries * 1024, appended),
    );

    // Raw random 4 KiB reads.
    let blocks = (total_mib * MIB / BLOCK_BYTES) as u64;
    let raw = Arc::new(raw);
    let mut random = SplitMix(7);
    let mut buffer = AlignedBuffer::zeroed(BLOCK_BYTES);
    let latencies: Vec<Duration> = (0..READS_DEPTH_1)
        .map(|_| {
            let offset = random.next() % blocks * BLOCK_BYTES as u64;
            let start = Instant::now();
            raw.read_exact_at(buffer.as_mut_slice(), offset).expect("raw read");
            start.elapsed()
        })
        .collect();
    report_latency("raw 4 KiB random pread, depth 1", latencies);
    let start = Instant::now();
    let threads: Vec<_> = (0..DEPTH)
        .map(|thread| {
            let raw = Arc::clone(&raw);
            std::thread::spawn(move || {
                let mut random = SplitMix(100 + thread as u64);
                let mut buffer = AlignedBuffer::zeroed(BLOCK_BYTES);
                for _ in 0..READS_PER_THREAD_DEPTH_32 {
                    let offset = random.next() % blocks * BLOCK_BYTES as u64;
                    raw.read_exact_at(buffer.as_mut_slice(), offset).expect("raw read");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|thread| thread.join().expect("reader"));
    let elapsed = start.elapsed();
    let reads = DEPTH * READS_PER_THREAD_DEPTH_32;
    println!(
        "raw 4 KiB random pread, depth {DEPTH} ({DEPTH} threads): {:.0} reads/s, {:.0} MB/s",
        reads as f64 / elapsed.as_secs_f64(),
        megabytes_per_second(reads * BLOCK_BYTES, elapsed)
    );

    // The log's random reads: without a size (`read`, 4 KiB from the entry's start) and with
    // the size an index knows (`read_sized`, exactly the entry's blocks).
    for (name, hint) in [("read", None), ("read_sized", Some(1024))] {
        let mut random = SplitMix(7);
        let latencies: Vec<Duration> = (0..READS_DEPTH_1)
            .map(|_| {
                let address = addresses[(random.next() % addresses.len() as u64) as usize];
                let start = Instant::now();
                match hint {
                    None => log.read(address).expect("log read"),
                    Some(entry_bytes) => log.read_sized(address, entry_bytes).expect("log read"),
                };
                start.elapsed()
            })
            .collect();
        report_latency(&format!("flash log random {name} of 1 KiB entries, depth 1"), latencies);
    }
    let pool = ReadPool::new(Arc::clone(&log), DEPTH);
    let completed = Arc::new(AtomicU64::new(0));
    let (done_sender, done) = mpsc::channel::<()>();
    let reads = DEPTH * READS_PER_THREAD_DEPTH_32;
    let mut random = SplitMix(100);
    let start = Instant::now();
    for _ in 0..reads {
        let address: FlashAddress = addresses[(random.next() % addresses.len() as u64) as usize];
        let (completed, done_sender) = (Arc::clone(&completed), done_sender.clone());
        pool.submit_sized(
            address,
            1024,
            Box::new(move |result| {
                result.expect("log read");
                if completed.fetch_add(1, Ordering::SeqCst) + 1 == reads as u64 {
                    let _ = done_sender.send(());
                }
            }),
        );
    }
    done.recv()?;
    let elapsed = start.elapsed();
    println!(
        "flash log random read_sized, depth {DEPTH} (ReadPool of {DEPTH}): {:.0} reads/s, {:.0} MB/s of entries",
        reads as f64 / elapsed.as_secs_f64(),
        megabytes_per_second(reads * 1024, elapsed)
    );
    Ok(())
}
