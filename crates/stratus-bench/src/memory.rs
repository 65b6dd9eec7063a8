//! `stratus bench memory`: how much memory each system needs to hold the same live data while
//! object sizes change — the FAST'14 paper's allocator study (Table 1, workloads W1–W8) with
//! Stratus's log in it, side by side with the allocators and the stores users run today.
//!
//! Every workload has three phases: allocate `allocation multiple` × the live cap in objects of
//! distribution A, deleting objects at random so the live data (key + value bytes) never
//! exceeds the cap; delete a fraction of the objects at random; allocate as much again with
//! distribution B. One driver (this process) generates the operations from a fixed seed, so
//! every system sees the same sequence; keys are 8 bytes (the object's number in hex).
//!
//! Systems, each in a process of its own so its peak resident set (`VmHWM`, everything
//! included: code, index, fragmentation) is its alone:
//! - `stratus`: the storage engine in a worker process, its log sized so the largest live data
//!   of the workload fills it to `--log-utilization-percent` (90 %), its hash table sized for
//!   the most objects the workload holds, its cleaner on a thread of its own;
//! - `glibc`, `jemalloc`, `mimalloc`: a worker holding every object in a block of its own from
//!   that allocator, found through a hash map (the paper's allocator test);
//! - `redis` (default settings but persistence off) and `redis-defrag` (`activedefrag yes`),
//!   driven with pipelined SET and DEL;
//! - `memcached`, given the same memory as Stratus's log (`-m`): it evicts rather than grows,
//!   so its row says what fraction of the live objects it still held at the end;
//! - `stratus-server`: what a user gets, a real `stratus server` started by `stratus up
//!   --servers 1` with its default flags (memory target 90 %, a hash table that follows the
//!   objects; memory-only, as one server has no backups), its log's hard limit raised to hold
//!   the data, driven with the same pipelined SET and DEL as Redis through the server's own
//!   RESP front end (its gateway buffers count against it). Its peak is the server process's.
//!
//! The workers read operations as fixed 12-byte records on their standard input (see
//! [`WorkerRecord`]); the pipe's flow control keeps the driver in step with them.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use stratus_log::format::{EntryHeader, ObjectPrefix};
use stratus_log::EntryType;
use stratus_store::{CleanerConfig, ObjectError, ObjectStore, StoreConfig};
use stratus_types::{key_hash, RejectRules, ServerId, TableId, Version};

use crate::allocators::{Allocator, Block};
use crate::cluster::ChildProcess;
use crate::peers::{peer_command, start_memcached};
use crate::redis_reference::{connect, encode_command};
use crate::report::{print_json, Field};
use crate::utilization::spawn_cleaner;
use stratus_env::SplitMix64;

/// Every key is 8 bytes: the paper's per-object overhead is stated for 8-byte keys.
const KEY_BYTES: u64 = 8;
/// The largest value any workload writes (W8's 15,000 bytes).
const VALUE_BYTES_MAX: usize = 15_000;
/// Commands sent to Redis or memcached before their answers are awaited.
const PIPELINE_COMMANDS: usize = 1_000;
/// While the live data is at its cap, Stratus's log utilization is sampled once per this many
/// allocations (a sample takes the engine's statistics, which is not free).
const SAMPLE_EVERY_ALLOCATIONS: u64 = 4_096;
/// How long a peer server may take to start answering.
const PEER_START_PATIENCE: Duration = Duration::from_secs(60);
/// Starts the error of a system that cannot run on this machine (not a failed measurement).
const UNAVAILABLE_PREFIX: &str = "unavailable: ";
/// Largest `--live-mib`: 1 TiB, far beyond any machine this runs on, and far from overflowing
/// the byte counts (`allocation multiple × live` included).
const LIVE_MIB_MAX: u64 = 1 << 20;
/// Largest `--allocation-multiple` (the paper's is 5).
const ALLOCATION_MULTIPLE_MAX: u64 = 1_000;
/// Largest `--segment-kib`: segments are addressed in 32-bit byte offsets.
const SEGMENT_KIB_MAX: u32 = 1 << 21;
/// The live data `--full` holds: the paper's 10 GB.
const FULL_LIVE_MIB: u64 = 10 * 1024;
/// How long a refused Stratus write waits for the cleaner, in 100 µs steps, before the
/// workload is declared not completed (10 s).
const STRATUS_WRITE_ATTEMPTS_MAX: u32 = 100_000;

/// `stratus bench memory`.
#[derive(Debug, Args)]
pub struct MemoryArguments {
    /// Workloads, comma-separated (W1..W8), or `all`.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    pub workload: Vec<String>,
    /// Systems, comma-separated: stratus, stratus-server, glibc, jemalloc, mimalloc, redis,
    /// redis-defrag, memcached. Redis and memcached come from the Debian packages
    /// (scripts/install-peers).
    #[arg(
        long,
        default_value = "stratus,stratus-server,glibc,jemalloc,mimalloc,redis,redis-defrag,memcached",
        value_delimiter = ','
    )]
    pub systems: Vec<String>,
    /// Live data held (key + value bytes), in MiB.
    #[arg(long, default_value_t = 256)]
    pub live_mib: u64,
    /// Bytes allocated in each allocating phase, as a multiple of the live data (the paper:
    /// 50 GB per phase for 10 GB live).
    #[arg(long, default_value_t = 5)]
    pub allocation_multiple: u64,
    /// The paper's sizes: 10 GiB live (needs several times that in memory for Redis).
    #[arg(long)]
    pub full: bool,
    /// Stratus's log is sized so the workload's largest live data fills this share of it.
    #[arg(long, default_value_t = 90)]
    pub log_utilization_percent: u64,
    /// Stratus's segment size in KiB. The log keeps about three segments in reserve, so
    /// segments must be small against the log for 90 % to be admissible.
    #[arg(long, default_value_t = 1024)]
    pub segment_kib: u32,
    /// Stratus's seglet size in KiB.
    #[arg(long, default_value_t = 16)]
    pub seglet_kib: u32,
    /// Stratus's cleaning levels: 2 (compaction, then combined; what a replicated server runs)
    /// or 1 (combined only, the memory-only mode).
    #[arg(long, default_value_t = 2)]
    pub levels: u32,
    /// Seed of the operation sequence (the same for every system).
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
}

/// `stratus bench memory-worker` (internal): holds the objects of one system.
#[derive(Debug, Args)]
pub struct MemoryWorkerArguments {
    /// stratus, glibc, jemalloc or mimalloc.
    #[arg(long)]
    pub system: String,
    /// Stratus only: bytes of the log.
    #[arg(long, default_value_t = 0)]
    pub log_bytes: u64,
    /// Stratus only: bytes of the hash table.
    #[arg(long, default_value_t = 0)]
    pub hash_table_bytes: u64,
    /// Stratus only: segment bytes.
    #[arg(long, default_value_t = 0)]
    pub segment_bytes: u32,
    /// Stratus only: seglet bytes.
    #[arg(long, default_value_t = 0)]
    pub seglet_bytes: u32,
    /// Stratus only: cleaning levels.
    #[arg(long, default_value_t = 2)]
    pub levels: u32,
}

// ---------------------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------------------

/// Value sizes drawn uniformly from `low..=high` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sizes {
    low: u32,
    high: u32,
}

/// A workload of FAST'14 Table 1.
#[derive(Clone, Copy, Debug)]
struct Workload {
    name: &'static str,
    before: Sizes,
    /// Percent of the objects deleted between the phases, and the sizes allocated after; none
    /// for W1, which has only its first phase.
    after: Option<(u32, Sizes)>,
}

const fn sizes(low: u32, high: u32) -> Sizes {
    Sizes { low, high }
}

/// FAST'14 Table 1 (object sizes are value sizes; keys are 8 bytes on top).
const WORKLOADS: [Workload; 8] = [
    Workload { name: "W1", before: sizes(100, 100), after: None },
    Workload { name: "W2", before: sizes(100, 100), after: Some((0, sizes(130, 130))) },
    Workload { name: "W3", before: sizes(100, 100), after: Some((90, sizes(130, 130))) },
    Workload { name: "W4", before: sizes(100, 150), after: Some((0, sizes(200, 250))) },
    Workload { name: "W5", before: sizes(100, 150), after: Some((90, sizes(200, 250))) },
    Workload { name: "W6", before: sizes(100, 200), after: Some((50, sizes(1_000, 2_000))) },
    Workload { name: "W7", before: sizes(1_000, 2_000), after: Some((90, sizes(1_500, 2_500))) },
    Workload { name: "W8", before: sizes(50, 150), after: Some((90, sizes(5_000, 15_000))) },
];

impl Workload {
    fn allocating_phases(&self) -> impl Iterator<Item = Sizes> {
        std::iter::once(self.before).chain(self.after.map(|(_, sizes)| sizes))
    }
}

fn selected_workloads(names: &[String]) -> Result<Vec<Workload>, String> {
    if names.iter().any(|name| name.eq_ignore_ascii_case("all")) {
        return Ok(WORKLOADS.to_vec());
    }
    names
        .iter()
        .map(|name| {
            WORKLOADS
                .iter()
                .find(|workload| workload.name.eq_ignore_ascii_case(name))
                .copied()
                .ok_or_else(|| format!("unknown workload {name:?} (W1..W8 or all)"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The operation sequence
// ---------------------------------------------------------------------------------------------

/// What a system is asked to do.
trait Holder {
    /// Store a new object: key `key`, a value of `value_bytes` bytes.
    fn allocate(&mut self, id: u32, key: &[u8; 8], value_bytes: u32) -> Result<(), String>;
    /// Delete the object `id`.
    fn free(&mut self, id: u32, key: &[u8; 8]) -> Result<(), String>;
    /// The live data is at its cap: a moment to sample how full the memory is.
    fn sample(&mut self) -> Result<(), String>;
    /// No more operations: what the system reports about itself.
    fn finish(&mut self, live_objects: u64) -> Result<Finished, String>;
    /// The process holding the data.
    fn process_id(&self) -> u32;
}

/// What a system reports at the end.
#[derive(Clone, Copy, Debug, Default)]
struct Finished {
    /// Stratus: the lowest live-object share of the allocated seglets while at the cap.
    log_utilization_min: Option<f64>,
    /// memcached: the share of the live objects it still holds.
    live_fraction_kept: Option<f64>,
}

/// The key of object `id`: its number in 8 hex digits (valid for memcached's text protocol).
fn key_of(id: u32) -> [u8; 8] {
    let mut key = [0u8; 8];
    for (index, byte) in key.iter_mut().enumerate() {
        let nibble = (id >> (28 - 4 * index)) & 0xf;
        *byte = b"0123456789abcdef"[nibble as usize];
    }
    key
}

/// The value bytes every system stores (a prefix of one pattern: the benchmark measures
/// memory, not value generation).
fn value_pattern() -> Vec<u8> {
    (0..VALUE_BYTES_MAX).map(|index| (index % 251) as u8).collect()
}

/// Generates a workload's operations and keeps the live set.
struct Driver {
    random: SplitMix64,
    /// Live objects: (id, value bytes); a random one is deleted by swap-remove.
    live: Vec<(u32, u32)>,
    live_bytes: u64,
    live_bytes_max: u64,
    next_id: u32,
    cap_bytes: u64,
    operations: u64,
}

impl Driver {
    fn new(seed: u64, cap_bytes: u64) -> Driver {
        Driver {
            random: SplitMix64::new(seed),
            live: Vec::new(),
            live_bytes: 0,
            live_bytes_max: 0,
            next_id: 0,
            cap_bytes,
            operations: 0,
        }
    }

    fn free_random(&mut self, holder: &mut dyn Holder) -> Result<(), String> {
        let index = self.random.below(self.live.len() as u64) as usize;
        let (id, value_bytes) = self.live.swap_remove(index);
        self.live_bytes -= KEY_BYTES + u64::from(value_bytes);
        self.operations += 1;
        holder.free(id, &key_of(id))
    }

    /// Allocates `total_bytes` (key + value) of objects with sizes from `sizes`, deleting at
    /// random to stay under the cap.
    fn allocate_phase(
        &mut self,
        sizes: Sizes,
        total_bytes: u64,
        holder: &mut dyn Holder,
    ) -> Result<(), String> {
        let mut allocated = 0u64;
        let mut since_sample = 0u64;
        let largest_object = KEY_BYTES + u64::from(sizes.high);
        while allocated < total_bytes {
            let spread = u64::from(sizes.high - sizes.low) + 1;
            let value_bytes = sizes.low + self.random.below(spread) as u32;
            let object = KEY_BYTES + u64::from(value_bytes);
            while self.live_bytes + object > self.cap_bytes {
                self.free_random(holder)?;
            }
            let id = self.next_id;
            self.next_id = self.next_id.checked_add(1).ok_or("more than 2^32 objects")?;
            holder.allocate(id, &key_of(id), value_bytes)?;
            self.live.push((id, value_bytes));
            self.live_bytes += object;
            self.live_bytes_max = self.live_bytes_max.max(self.live_bytes);
            self.operations += 1;
            allocated += object;
            // At the cap: the next allocation may have to delete first.
            if self.live_bytes + largest_object > self.cap_bytes {
                since_sample += 1;
                if since_sample >= SAMPLE_EVERY_ALLOCATIONS {
                    since_sample = 0;
                    holder.sample()?;
                }
            }
        }
        Ok(())
    }

    fn run(
        &mut self,
        workload: &Workload,
        allocation_bytes: u64,
        holder: &mut dyn Holder,
    ) -> Result<(), String> {
        self.allocate_phase(workload.before, allocation_bytes, holder)?;
        if let Some((delete_percent, after)) = workload.after {
            let deletes = self.live.len() as u64 * u64::from(delete_percent) / 100;
            for _ in 0..deletes {
                self.free_random(holder)?;
            }
            self.allocate_phase(after, allocation_bytes, holder)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Sizing Stratus
// ---------------------------------------------------------------------------------------------

/// A version 4 bytes wide, as after billions of writes: the conservative case.
const VERSION_WIDE: Version = Version(1 << 31);

/// Bytes of the log entry of an object with an 8-byte key and `value_bytes` of value at
/// `version` (versions are stored in as few bytes as they need).
fn object_entry_bytes(value_bytes: u32, version: Version, pattern: &[u8]) -> u64 {
    let value = &pattern[..value_bytes as usize];
    let prefix = ObjectPrefix::new(TableId(1), version, 0, None, &key_of(0), value);
    let content = prefix.as_bytes().len() + KEY_BYTES as usize + value.len();
    let header = EntryHeader::new(EntryType::Object, content as u32);
    (header.header_bytes() + content) as u64
}

/// How Stratus is sized for a workload.
#[derive(Clone, Copy, Debug, PartialEq)]
struct StratusSizes {
    log_bytes: u64,
    hash_table_bytes: u64,
    /// The lowest share of the whole log the live entries fill at the cap in any phase: one
    /// log serves both phases, so where the second phase's objects carry less overhead than
    /// the first's, the same live data fills less of it (W8: about 0.78 at 90 %).
    log_fill_at_cap_min: f64,
}

/// The log and hash table that hold `workload` at `cap_bytes` of live data at
/// `utilization_percent` when each phase allocates `allocation_bytes`: the phase whose objects
/// carry the most overhead at the cap decides.
fn stratus_sizes(
    workload: &Workload,
    cap_bytes: u64,
    allocation_bytes: u64,
    utilization_percent: u64,
    segment_bytes: u64,
    pattern: &[u8],
) -> StratusSizes {
    // Every write takes a new version; a remove takes none (it only raises the safe version
    // past the removed object's).
    let versions_max: u64 = workload
        .allocating_phases()
        .map(|sizes| allocation_bytes / (KEY_BYTES + u64::from(sizes.low)))
        .sum();
    let version = Version(versions_max.max(1));
    let mut entry_bytes_at_cap = Vec::new();
    let mut objects_max = 0u64;
    for sizes in workload.allocating_phases() {
        let mean_value = (sizes.low + sizes.high) / 2;
        let objects_at_cap = cap_bytes / (KEY_BYTES + u64::from(mean_value));
        entry_bytes_at_cap.push(objects_at_cap * object_entry_bytes(mean_value, version, pattern));
        objects_max = objects_max.max(cap_bytes / (KEY_BYTES + u64::from(sizes.low)));
    }
    let entry_bytes_max = entry_bytes_at_cap.iter().copied().max().unwrap_or(0);
    let segments = (entry_bytes_max * 100 / utilization_percent).div_ceil(segment_bytes);
    let log_bytes = segments * segment_bytes;
    // Eight entries per 64-byte bucket; between 3/8 and 3/4 of the entries in use at the most
    // objects the workload holds, so overflow buckets stay rare.
    let buckets = objects_max.div_ceil(6).next_power_of_two();
    let entry_bytes_min = entry_bytes_at_cap.iter().copied().min().unwrap_or(0);
    StratusSizes {
        log_bytes,
        hash_table_bytes: buckets * stratus_index::BUCKET_BYTES,
        log_fill_at_cap_min: entry_bytes_min as f64 / log_bytes.max(1) as f64,
    }
}

// ---------------------------------------------------------------------------------------------
// Worker processes (stratus and the allocators)
// ---------------------------------------------------------------------------------------------

/// One operation for a worker: three little-endian u32s (operation, id, value bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WorkerRecord {
    Allocate { id: u32, value_bytes: u32 },
    Free { id: u32 },
    Sample,
    Finish,
}

const WORKER_RECORD_BYTES: usize = 12;

impl WorkerRecord {
    fn encode(self) -> [u8; WORKER_RECORD_BYTES] {
        let (operation, id, value_bytes) = match self {
            WorkerRecord::Allocate { id, value_bytes } => (1u32, id, value_bytes),
            WorkerRecord::Free { id } => (2, id, 0),
            WorkerRecord::Sample => (3, 0, 0),
            WorkerRecord::Finish => (4, 0, 0),
        };
        let mut bytes = [0u8; WORKER_RECORD_BYTES];
        bytes[0..4].copy_from_slice(&operation.to_le_bytes());
        bytes[4..8].copy_from_slice(&id.to_le_bytes());
        bytes[8..12].copy_from_slice(&value_bytes.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; WORKER_RECORD_BYTES]) -> Result<WorkerRecord, String> {
        let word = |index: usize| {
            u32::from_le_bytes(bytes[index * 4..index * 4 + 4].try_into().expect("4 bytes"))
        };
        match word(0) {
            1 if word(2) as usize <= VALUE_BYTES_MAX => {
                Ok(WorkerRecord::Allocate { id: word(1), value_bytes: word(2) })
            }
            1 => Err(format!("value of {} bytes is over {VALUE_BYTES_MAX}", word(2))),
            2 => Ok(WorkerRecord::Free { id: word(1) }),
            3 => Ok(WorkerRecord::Sample),
            4 => Ok(WorkerRecord::Finish),
            other => Err(format!("unknown worker operation {other}")),
        }
    }
}

/// A worker process, fed through its standard input.
struct WorkerHolder {
    process: ChildProcess,
    input: Option<BufWriter<ChildStdin>>,
    output: BufReader<ChildStdout>,
}

impl WorkerHolder {
    fn start(arguments: &[String]) -> Result<WorkerHolder, String> {
        let executable = std::env::current_exe().map_err(|error| error.to_string())?;
        let mut command = Command::new(executable);
        command
            .args(["bench", "memory-worker"])
            .args(arguments)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut process = ChildProcess::spawn(&mut command, "stratus bench memory-worker")?;
        let (input, output) = process.take_standard_streams();
        Ok(WorkerHolder {
            process,
            input: Some(BufWriter::with_capacity(1 << 16, input.ok_or("no worker stdin")?)),
            output: BufReader::new(output.ok_or("no worker stdout")?),
        })
    }

    fn send(&mut self, record: WorkerRecord) -> Result<(), String> {
        let input = self.input.as_mut().ok_or("the worker's input is closed")?;
        if input.write_all(&record.encode()).is_err() {
            // The worker stopped reading: it failed, and said why on its output.
            return Err(self.failure());
        }
        Ok(())
    }

    fn failure(&mut self) -> String {
        let mut line = String::new();
        let _ = self.output.read_line(&mut line);
        match line.strip_prefix("failed ") {
            Some(reason) => reason.trim_end().to_string(),
            None => format!("the worker stopped without saying why ({:?})", line.trim_end()),
        }
    }
}

impl Holder for WorkerHolder {
    fn allocate(&mut self, id: u32, _key: &[u8; 8], value_bytes: u32) -> Result<(), String> {
        self.send(WorkerRecord::Allocate { id, value_bytes })
    }

    fn free(&mut self, id: u32, _key: &[u8; 8]) -> Result<(), String> {
        self.send(WorkerRecord::Free { id })
    }

    fn sample(&mut self) -> Result<(), String> {
        self.send(WorkerRecord::Sample)
    }

    fn finish(&mut self, live_objects: u64) -> Result<Finished, String> {
        self.send(WorkerRecord::Finish)?;
        let flushed = self.input.as_mut().map(|input| input.flush());
        if !matches!(flushed, Some(Ok(()))) {
            return Err(self.failure());
        }
        let mut line = String::new();
        self.output.read_line(&mut line).map_err(|error| error.to_string())?;
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["finished", utilization, objects] => {
                let objects: u64 = objects.parse().map_err(|_| format!("bad line {line:?}"))?;
                if objects != live_objects {
                    return Err(format!("the worker holds {objects} objects, not {live_objects}"));
                }
                Ok(Finished {
                    log_utilization_min: utilization.parse().ok(),
                    live_fraction_kept: None,
                })
            }
            _ => Err(line.strip_prefix("failed ").unwrap_or(&line).trim_end().to_string()),
        }
    }

    fn process_id(&self) -> u32 {
        self.process.id()
    }
}

impl Drop for WorkerHolder {
    fn drop(&mut self) {
        // End of input: the worker exits (the process is reaped by ChildProcess's drop).
        self.input = None;
    }
}

/// What a worker holds its objects in.
enum WorkerStore {
    Stratus {
        store: Arc<ObjectStore>,
        stop: Arc<AtomicBool>,
        cleaner: Option<std::thread::JoinHandle<()>>,
    },
    Allocator {
        allocator: Allocator,
        blocks: HashMap<u32, Block>,
    },
}

/// Runs a worker: applies the records on standard input until Finish, reports, then waits for
/// the end of its input (the driver reads its peak memory meanwhile).
pub fn run_worker(arguments: MemoryWorkerArguments) -> Result<(), String> {
    let outcome = open_worker_store(&arguments).and_then(|mut store| {
        let outcome = apply_records(&mut store);
        if let WorkerStore::Stratus { stop, cleaner, .. } = &mut store {
            stop.store(true, Ordering::Relaxed);
            if let Some(cleaner) = cleaner.take() {
                let _ = cleaner.join();
            }
        }
        outcome
    });
    let mut output = std::io::stdout().lock();
    match outcome {
        Ok((utilization_min, objects)) => {
            let utilization =
                utilization_min.map_or("none".to_string(), |value| format!("{value:.4}"));
            writeln!(output, "finished {utilization} {objects}")
                .map_err(|error| error.to_string())?;
            output.flush().map_err(|error| error.to_string())?;
            // Stay alive, holding the objects, until the driver has read the peak and closes.
            let mut rest = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut rest);
            Ok(())
        }
        Err(reason) => {
            // The driver reads this line when its next write finds the pipe closed.
            let _ = writeln!(output, "failed {reason}");
            let _ = output.flush();
            Err(reason)
        }
    }
}

fn open_worker_store(arguments: &MemoryWorkerArguments) -> Result<WorkerStore, String> {
    Ok(match Allocator::named(&arguments.system) {
        Some(allocator) => WorkerStore::Allocator { allocator, blocks: HashMap::new() },
        None if arguments.system == "stratus" => {
            let mut config = StoreConfig::with_log_bytes(arguments.log_bytes);
            config.segment_bytes = arguments.segment_bytes;
            config.seglet_bytes = arguments.seglet_bytes;
            config.hash_table_bytes = arguments.hash_table_bytes;
            config.value_bytes_max = VALUE_BYTES_MAX as u32;
            // The log region is the server's memory: allocated and touched up front.
            config.prefault_memory = true;
            config.cleaner = CleanerConfig {
                replicas: if arguments.levels == 2 { 3 } else { 0 },
                ..CleanerConfig::default()
            };
            config.validate().map_err(|error| format!("stratus configuration: {error}"))?;
            let store =
                Arc::new(ObjectStore::new(config, ServerId(1)).map_err(|error| error.to_string())?);
            let stop = Arc::new(AtomicBool::new(false));
            let cleaner = Some(spawn_cleaner(store.clone(), stop.clone()));
            WorkerStore::Stratus { store, stop, cleaner }
        }
        None => return Err(format!("unknown worker system {:?}", arguments.system)),
    })
}

/// (lowest sampled log utilization, objects held at the end).
fn apply_records(store: &mut WorkerStore) -> Result<(Option<f64>, u64), String> {
    let pattern = value_pattern();
    let mut input = BufReader::with_capacity(1 << 16, std::io::stdin().lock());
    let mut record = [0u8; WORKER_RECORD_BYTES];
    let mut utilization_min: Option<f64> = None;
    let table = TableId(1);
    loop {
        input.read_exact(&mut record).map_err(|error| format!("reading a record: {error}"))?;
        match (WorkerRecord::decode(&record)?, &mut *store) {
            (
                WorkerRecord::Allocate { id, value_bytes },
                WorkerStore::Allocator { allocator, blocks },
            ) => {
                let block =
                    Block::new(*allocator, &[&key_of(id), &pattern[..value_bytes as usize]]);
                if blocks.insert(id, block).is_some() {
                    return Err(format!("object {id} allocated twice"));
                }
            }
            (WorkerRecord::Free { id }, WorkerStore::Allocator { blocks, .. }) => {
                let block =
                    blocks.remove(&id).ok_or_else(|| format!("object {id} freed but not held"))?;
                // The block still holds what was stored in it (its key leads).
                if block.contents()[..KEY_BYTES as usize] != key_of(id) {
                    return Err(format!("object {id}'s block lost its key"));
                }
            }
            (WorkerRecord::Allocate { id, value_bytes }, WorkerStore::Stratus { store, .. }) => {
                let key = key_of(id);
                let value = &pattern[..value_bytes as usize];
                retry_while_log_full(|| {
                    store.write(
                        table,
                        &key,
                        key_hash(table, &key),
                        value,
                        &RejectRules::NONE,
                        stratus_store::Expiry::Never,
                        stratus_store::WallTime::from_seconds(0),
                    )
                })?;
            }
            (WorkerRecord::Free { id }, WorkerStore::Stratus { store, .. }) => {
                let key = key_of(id);
                let removed = retry_while_log_full(|| {
                    store.remove(
                        table,
                        &key,
                        key_hash(table, &key),
                        &RejectRules::NONE,
                        stratus_store::WallTime::from_seconds(0),
                    )
                })?;
                if removed == Version(0) {
                    return Err(format!("object {id} removed but not held"));
                }
            }
            (WorkerRecord::Sample, WorkerStore::Stratus { store, .. }) => {
                let statistics = store.statistics();
                let utilization = statistics.log_bytes_live_objects as f64
                    / statistics.log_bytes_allocated.max(1) as f64;
                utilization_min =
                    Some(utilization_min.map_or(utilization, |low| low.min(utilization)));
            }
            (WorkerRecord::Sample, WorkerStore::Allocator { .. }) => {}
            (WorkerRecord::Finish, WorkerStore::Allocator { blocks, .. }) => {
                return Ok((None, blocks.len() as u64));
            }
            (WorkerRecord::Finish, WorkerStore::Stratus { store, .. }) => {
                return Ok((utilization_min, store.statistics().objects_live));
            }
        }
    }
}

/// Runs `operation` until the log accepts it; a refusal means the cleaner is behind, and the
/// writer waits for it as a client retrying RETRY would, for 10 s at most.
fn retry_while_log_full(
    mut operation: impl FnMut() -> Result<Version, ObjectError>,
) -> Result<Version, String> {
    for _ in 0..STRATUS_WRITE_ATTEMPTS_MAX {
        match operation() {
            Ok(version) => return Ok(version),
            Err(ObjectError::LogFull) => std::thread::sleep(Duration::from_micros(100)),
            Err(error) => return Err(format!("{error:?}")),
        }
    }
    Err("the log stayed full for 10 s: the cleaner could not keep up or free memory".into())
}

// ---------------------------------------------------------------------------------------------
// Redis and memcached
// ---------------------------------------------------------------------------------------------

/// A server of a peer system, driven over one pipelined connection.
struct PeerHolder {
    _server: ChildProcess,
    process_id: u32,
    kind: PeerKind,
    reader: BufReader<std::net::TcpStream>,
    writer: BufWriter<std::net::TcpStream>,
    /// Commands sent whose answers were not read yet.
    pending: usize,
    /// Redis: the answers the pending commands must get, in order.
    expected: Vec<&'static [u8]>,
    pattern: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PeerKind {
    Redis,
    Memcached,
}

impl PeerHolder {
    fn start_redis(directory: &std::path::Path, defragment: bool) -> Result<PeerHolder, String> {
        let (mut command, address, port) = peer_command("redis-server", directory)?;
        // Redis's defaults but persistence: no snapshot (its fork would double the memory
        // measured) and no append-only file.
        command
            .args(["--port", &port, "--bind", "127.0.0.1", "--daemonize", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(directory);
        if defragment {
            command.args(["--activedefrag", "yes"]);
        }
        let mut server = ChildProcess::spawn(&mut command, "redis-server")?;
        let deadline = Instant::now() + PEER_START_PATIENCE;
        while !PeerHolder::answers_ping(&address) {
            if server.exited().is_some() || Instant::now() >= deadline {
                let log_text =
                    std::fs::read_to_string(directory.join("redis-server.log")).unwrap_or_default();
                // Debian's Redis links the system's jemalloc, without the hint active
                // defragmentation needs: the system is not there to measure.
                if log_text.contains("Active defragmentation cannot be enabled") {
                    return Err(format!(
                        "{UNAVAILABLE_PREFIX}this redis-server cannot defragment (it needs the \
                         modified jemalloc of Redis's own source distribution)"
                    ));
                }
                let last = log_text.lines().rev().find(|line| !line.trim().is_empty());
                return Err(format!("redis-server did not start: {}", last.unwrap_or("no log")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        PeerHolder::connected(server, PeerKind::Redis, &address)
    }

    /// `stratus up --servers 1` with default flags but a RESP port and a log whose hard limit
    /// holds the data (four times the live data, at least the default 256 MiB: a limit, not a
    /// reservation). The peak measured is the server process's.
    fn start_stratus_server(
        directory: &std::path::Path,
        live_mib: u64,
    ) -> Result<PeerHolder, String> {
        let log_mib = (live_mib * 4).max(256).to_string();
        // A fresh directory each time: one left by another workload would be recovered first.
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let start = STARTS.fetch_add(1, Ordering::Relaxed);
        let data = directory.join(format!("stratus-server-{start}"));
        let cluster = crate::cluster::start_local_cluster(
            &data,
            1,
            &["--resp-port", "0", "--log-mib", &log_mib],
            None,
        )?;
        let field = |prefix: &str| {
            cluster.lines.iter().find_map(|line| line.strip_prefix(prefix)).map(str::trim)
        };
        let address = field("redis: server-0 ")
            .ok_or_else(|| format!("stratus up printed no RESP address: {:?}", cluster.lines))?
            .to_string();
        let server_id = field("processes: ")
            .and_then(|processes| {
                processes.split_whitespace().find_map(|part| part.strip_prefix("server-0="))
            })
            .and_then(|id| id.parse::<u32>().ok())
            .ok_or_else(|| format!("stratus up printed no server process: {:?}", cluster.lines))?;
        let mut holder = PeerHolder::connected(cluster.process, PeerKind::Redis, &address)?;
        holder.process_id = server_id;
        Ok(holder)
    }

    /// Whether a Redis at `address` answers PING with PONG now.
    fn answers_ping(address: &str) -> bool {
        let Ok(stream) = connect(address) else { return false };
        let mut reader = BufReader::new(&stream);
        let mut line = String::new();
        (&stream).write_all(&encode_command(&[b"PING"])).is_ok()
            && reader.read_line(&mut line).is_ok()
            && line.starts_with("+PONG")
    }

    fn start_memcached(
        directory: &std::path::Path,
        memory_bytes: u64,
    ) -> Result<PeerHolder, String> {
        // The memory Stratus's log gets.
        let (server, address) = start_memcached(directory, memory_bytes.div_ceil(1 << 20))?;
        PeerHolder::connected(server, PeerKind::Memcached, &address)
    }

    fn connected(
        server: ChildProcess,
        kind: PeerKind,
        address: &str,
    ) -> Result<PeerHolder, String> {
        let stream =
            connect(address).map_err(|error| format!("connecting to {address}: {error}"))?;
        let reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
        Ok(PeerHolder {
            process_id: server.id(),
            _server: server,
            kind,
            reader,
            writer: BufWriter::with_capacity(1 << 16, stream),
            pending: 0,
            expected: Vec::with_capacity(PIPELINE_COMMANDS),
            pattern: value_pattern(),
        })
    }

    fn sent(&mut self) -> Result<(), String> {
        self.pending += 1;
        if self.pending >= PIPELINE_COMMANDS {
            self.drain()?;
        }
        Ok(())
    }

    /// Reads the answers to every pending command (memcached: a no-op answered once all the
    /// quiet commands before it were applied).
    fn drain(&mut self) -> Result<(), String> {
        if self.pending == 0 {
            return Ok(());
        }
        if self.kind == PeerKind::Memcached {
            self.writer.write_all(b"mn\r\n").map_err(|error| error.to_string())?;
        }
        self.writer.flush().map_err(|error| format!("sending: {error}"))?;
        match self.kind {
            PeerKind::Redis => {
                let mut answer = [0u8; 5];
                for expected in self.expected.drain(..) {
                    let answer = &mut answer[..expected.len()];
                    self.reader
                        .read_exact(answer)
                        .map_err(|error| format!("reading redis answers: {error}"))?;
                    if answer != expected {
                        return Err(format!(
                            "redis answered {:?} where {:?} was due",
                            String::from_utf8_lossy(answer),
                            String::from_utf8_lossy(expected)
                        ));
                    }
                }
            }
            PeerKind::Memcached => {
                let mut line = String::new();
                self.reader
                    .read_line(&mut line)
                    .map_err(|error| format!("reading from memcached: {error}"))?;
                if line != "MN\r\n" {
                    return Err(format!("memcached answered {line:?} to a no-op"));
                }
            }
        }
        self.pending = 0;
        Ok(())
    }

    /// memcached's `stats` counter `name`.
    fn memcached_statistic(&mut self, name: &str) -> Result<u64, String> {
        self.writer.write_all(b"stats\r\n").map_err(|error| error.to_string())?;
        self.writer.flush().map_err(|error| error.to_string())?;
        let mut value = None;
        loop {
            let mut line = String::new();
            let read = self.reader.read_line(&mut line).map_err(|error| error.to_string())?;
            if read == 0 || line == "END\r\n" {
                break;
            }
            if let ["STAT", key, number] = line.split_whitespace().collect::<Vec<_>>().as_slice() {
                if *key == name {
                    value = number.parse().ok();
                }
            }
        }
        value.ok_or_else(|| format!("memcached stats has no {name}"))
    }
}

impl Holder for PeerHolder {
    fn allocate(&mut self, _id: u32, key: &[u8; 8], value_bytes: u32) -> Result<(), String> {
        let value = &self.pattern[..value_bytes as usize];
        let written = match self.kind {
            PeerKind::Redis => {
                self.expected.push(b"+OK\r\n");
                write!(self.writer, "*3\r\n$3\r\nSET\r\n$8\r\n")
                    .and_then(|()| self.writer.write_all(key))
                    .and_then(|()| write!(self.writer, "\r\n${value_bytes}\r\n"))
                    .and_then(|()| self.writer.write_all(value))
                    .and_then(|()| self.writer.write_all(b"\r\n"))
            }
            PeerKind::Memcached => self
                .writer
                .write_all(b"set ")
                .and_then(|()| self.writer.write_all(key))
                .and_then(|()| write!(self.writer, " 0 0 {value_bytes} noreply\r\n"))
                .and_then(|()| self.writer.write_all(value))
                .and_then(|()| self.writer.write_all(b"\r\n")),
        };
        written.map_err(|error| format!("sending: {error}"))?;
        self.sent()
    }

    fn free(&mut self, _id: u32, key: &[u8; 8]) -> Result<(), String> {
        let written = match self.kind {
            PeerKind::Redis => {
                self.expected.push(b":1\r\n");
                self.writer
                    .write_all(b"*2\r\n$3\r\nDEL\r\n$8\r\n")
                    .and_then(|()| self.writer.write_all(key))
                    .and_then(|()| self.writer.write_all(b"\r\n"))
            }
            PeerKind::Memcached => self
                .writer
                .write_all(b"delete ")
                .and_then(|()| self.writer.write_all(key))
                .and_then(|()| self.writer.write_all(b" noreply\r\n")),
        };
        written.map_err(|error| format!("sending: {error}"))?;
        self.sent()
    }

    fn sample(&mut self) -> Result<(), String> {
        Ok(())
    }

    fn finish(&mut self, live_objects: u64) -> Result<Finished, String> {
        self.drain()?;
        match self.kind {
            PeerKind::Redis => Ok(Finished::default()),
            PeerKind::Memcached => {
                // Every object it holds is live (deleted ones are gone), so the items it counts
                // over the live objects is what it kept.
                let items = self.memcached_statistic("curr_items")?;
                Ok(Finished {
                    log_utilization_min: None,
                    live_fraction_kept: Some(items as f64 / live_objects.max(1) as f64),
                })
            }
        }
    }

    fn process_id(&self) -> u32 {
        self.process_id
    }
}

/// The peak resident set of process `process_id` (`VmHWM`), in bytes.
fn peak_resident_bytes(process_id: u32) -> Result<u64, String> {
    let path = format!("/proc/{process_id}/status");
    let status = std::fs::read_to_string(&path).map_err(|error| format!("{path}: {error}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kibibytes| kibibytes.trim().parse::<u64>().ok())
        .map(|kibibytes| kibibytes * 1024)
        .ok_or_else(|| format!("{path} has no VmHWM line"))
}

// ---------------------------------------------------------------------------------------------
// The benchmark
// ---------------------------------------------------------------------------------------------

const SYSTEMS: [&str; 8] = [
    "stratus",
    "stratus-server",
    "glibc",
    "jemalloc",
    "mimalloc",
    "redis",
    "redis-defrag",
    "memcached",
];

/// One system's result on one workload.
#[derive(Clone, Debug)]
struct Row {
    system: String,
    live_bytes: u64,
    peak_bytes: Option<u64>,
    completed: bool,
    error: Option<String>,
    /// Why the system could not run here at all (it is then neither measured nor a failure).
    unavailable: Option<String>,
    ops_per_sec: Option<f64>,
    finished: Finished,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        self.peak_bytes.map(|peak| peak as f64 / self.live_bytes.max(1) as f64)
    }
}

/// Runs the benchmark.
pub fn run(mut arguments: MemoryArguments) -> Result<(), String> {
    if arguments.full {
        arguments.live_mib = FULL_LIVE_MIB;
    }
    let workloads = selected_workloads(&arguments.workload)?;
    if let Some(unknown) =
        arguments.systems.iter().find(|system| !SYSTEMS.contains(&system.as_str()))
    {
        return Err(format!("unknown system {unknown:?} ({})", SYSTEMS.join(", ")));
    }
    if !(10..=99).contains(&arguments.log_utilization_percent) {
        return Err("--log-utilization-percent must be within 10..=99".into());
    }
    if arguments.levels != 1 && arguments.levels != 2 {
        return Err(format!("--levels must be 1 or 2, not {}", arguments.levels));
    }
    check_sizes(&arguments)?;
    let pattern = value_pattern();
    let cap_bytes = arguments.live_mib << 20;
    let overhead = object_entry_bytes(100, VERSION_WIDE, &pattern) - (KEY_BYTES + 100);
    println!(
        "per-object overhead of a 100-byte value with an 8-byte key: {overhead} B in the log + {} B \
         hash-table entry",
        stratus_index::BUCKET_BYTES / stratus_index::ENTRIES_PER_BUCKET as u64
    );
    print_json(&[
        ("bench", Field::Text("memory-overhead".into())),
        ("log_entry_overhead_bytes", Field::Number(overhead as f64)),
        (
            "hash_entry_bytes",
            Field::Number(
                (stratus_index::BUCKET_BYTES / stratus_index::ENTRIES_PER_BUCKET as u64) as f64,
            ),
        ),
    ]);
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let mut failures = 0;
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>6} {:>9} {:>11} {:>12} {:>12} {:>6} {:>8} {:>14}",
        "workload",
        "system",
        "live_bytes",
        "peak_bytes",
        "ratio",
        "completed",
        "ops_per_sec",
        "log_util_min",
        "fill_at_cap",
        "kept",
        "vs_redis",
        "vs_best_malloc"
    );
    for workload in &workloads {
        let sizes = stratus_sizes(
            workload,
            cap_bytes,
            arguments.allocation_multiple * cap_bytes,
            arguments.log_utilization_percent,
            u64::from(arguments.segment_kib) << 10,
            &pattern,
        );
        let rows: Vec<Row> = arguments
            .systems
            .iter()
            .map(|system| measure(&arguments, workload, system, &sizes, directory.path()))
            .collect();
        let ratio_of = |names: &[&str]| {
            rows.iter()
                .filter(|row| names.contains(&row.system.as_str()) && row.completed)
                .filter_map(Row::ratio)
                .fold(None, |best: Option<f64>, ratio| Some(best.map_or(ratio, |b| b.min(ratio))))
        };
        let redis_ratio = ratio_of(&["redis"]);
        let best_malloc_ratio = ratio_of(&["glibc", "jemalloc", "mimalloc"]);
        for row in &rows {
            if let Some(reason) = &row.unavailable {
                eprintln!("bench memory: {} skipped on {}: {reason}", row.system, workload.name);
            } else if !row.completed {
                failures += 1;
                eprintln!(
                    "bench memory: {} on {}: {}",
                    row.system,
                    workload.name,
                    row.error.as_deref().unwrap_or("did not complete")
                );
            }
            let is_stratus = row.system == "stratus";
            // Both Stratus rows are compared with the references.
            let compared = is_stratus || row.system == "stratus-server";
            let relative = |reference: Option<f64>| match (compared, row.ratio(), reference) {
                (true, Some(ratio), Some(reference)) => Some(ratio / reference),
                _ => None,
            };
            let text = |value: Option<f64>, decimals: usize| {
                value.map_or("-".to_string(), |value| format!("{value:.decimals$}"))
            };
            println!(
                "{:>8} {:>12} {:>12} {:>12} {:>6} {:>9} {:>11} {:>12} {:>12} {:>6} {:>8} {:>14}",
                workload.name,
                row.system,
                row.live_bytes,
                row.peak_bytes.map_or("-".to_string(), |peak| peak.to_string()),
                text(row.ratio(), 2),
                if row.unavailable.is_some() {
                    "n/a".to_string()
                } else {
                    row.completed.to_string()
                },
                text(row.ops_per_sec, 0),
                text(row.finished.log_utilization_min, 3),
                text(is_stratus.then_some(sizes.log_fill_at_cap_min), 3),
                text(row.finished.live_fraction_kept, 3),
                text(relative(redis_ratio), 2),
                text(relative(best_malloc_ratio), 2),
            );
            let stratus_only =
                |value: u64| Field::optional_number(is_stratus.then_some(value as f64));
            print_json(&[
                ("bench", Field::Text("memory".into())),
                ("workload", Field::Text(workload.name.into())),
                ("system", Field::Text(row.system.clone())),
                ("live_bytes", Field::Number(row.live_bytes as f64)),
                ("peak_bytes", Field::optional_number(row.peak_bytes.map(|peak| peak as f64))),
                ("ratio", Field::optional_number(row.ratio())),
                ("completed", Field::Text(row.completed.to_string())),
                ("unavailable", row.unavailable.clone().map_or(Field::Null, Field::Text)),
                ("ops_per_sec", Field::optional_number(row.ops_per_sec)),
                ("log_utilization_min", Field::optional_number(row.finished.log_utilization_min)),
                ("live_fraction_kept", Field::optional_number(row.finished.live_fraction_kept)),
                ("ratio_vs_redis", Field::optional_number(relative(redis_ratio))),
                ("ratio_vs_best_malloc", Field::optional_number(relative(best_malloc_ratio))),
                ("log_bytes", stratus_only(sizes.log_bytes)),
                ("hash_table_bytes", stratus_only(sizes.hash_table_bytes)),
                (
                    "log_fill_at_cap_min",
                    Field::optional_number(is_stratus.then_some(sizes.log_fill_at_cap_min)),
                ),
            ]);
        }
    }
    if failures > 0 {
        return Err(format!("{failures} system(s) did not complete a workload (see above)"));
    }
    Ok(())
}

/// The sizes must hold the largest object (a live cap below it would have nothing to delete
/// to make room) and stay far from overflowing a byte count.
fn check_sizes(arguments: &MemoryArguments) -> Result<(), String> {
    if !(1..=LIVE_MIB_MAX).contains(&arguments.live_mib) {
        return Err(format!("--live-mib must be within 1..={LIVE_MIB_MAX}"));
    }
    if !(1..=ALLOCATION_MULTIPLE_MAX).contains(&arguments.allocation_multiple) {
        return Err(format!("--allocation-multiple must be within 1..={ALLOCATION_MULTIPLE_MAX}"));
    }
    if arguments.segment_kib == 0 || arguments.seglet_kib == 0 {
        return Err("--segment-kib and --seglet-kib must be positive".into());
    }
    if arguments.segment_kib > SEGMENT_KIB_MAX {
        return Err(format!("--segment-kib must be at most {SEGMENT_KIB_MAX}"));
    }
    Ok(())
}

/// Runs `workload` on `system`; any failure becomes a row that did not complete.
fn measure(
    arguments: &MemoryArguments,
    workload: &Workload,
    system: &str,
    sizes: &StratusSizes,
    directory: &std::path::Path,
) -> Row {
    let mut row = Row {
        system: system.to_string(),
        live_bytes: 0,
        peak_bytes: None,
        completed: false,
        error: None,
        unavailable: None,
        ops_per_sec: None,
        finished: Finished::default(),
    };
    let started = (|| -> Result<Box<dyn Holder>, String> {
        Ok(match system {
            "redis" => Box::new(PeerHolder::start_redis(directory, false)?),
            "redis-defrag" => Box::new(PeerHolder::start_redis(directory, true)?),
            "memcached" => Box::new(PeerHolder::start_memcached(directory, sizes.log_bytes)?),
            "stratus-server" => {
                Box::new(PeerHolder::start_stratus_server(directory, arguments.live_mib)?)
            }
            "stratus" => Box::new(WorkerHolder::start(&[
                "--system".into(),
                "stratus".into(),
                "--log-bytes".into(),
                sizes.log_bytes.to_string(),
                "--hash-table-bytes".into(),
                sizes.hash_table_bytes.to_string(),
                "--segment-bytes".into(),
                (arguments.segment_kib << 10).to_string(),
                "--seglet-bytes".into(),
                (arguments.seglet_kib << 10).to_string(),
                "--levels".into(),
                arguments.levels.to_string(),
            ])?),
            allocator => Box::new(WorkerHolder::start(&["--system".into(), allocator.into()])?),
        })
    })();
    let mut holder = match started {
        Ok(holder) => holder,
        Err(error) => {
            match error.strip_prefix(UNAVAILABLE_PREFIX) {
                Some(reason) => row.unavailable = Some(reason.to_string()),
                None => row.error = Some(error),
            }
            return row;
        }
    };
    let cap_bytes = arguments.live_mib << 20;
    let mut driver = Driver::new(arguments.seed, cap_bytes);
    let clock = Instant::now();
    let outcome = driver
        .run(workload, arguments.allocation_multiple * cap_bytes, holder.as_mut())
        .and_then(|()| holder.finish(driver.live.len() as u64));
    let seconds = clock.elapsed().as_secs_f64();
    row.live_bytes = driver.live_bytes_max;
    // The peak so far, read while the system still holds everything.
    row.peak_bytes = peak_resident_bytes(holder.process_id()).ok();
    match outcome {
        Ok(finished) => {
            row.completed = true;
            row.finished = finished;
            row.ops_per_sec = Some(driver.operations as f64 / seconds);
        }
        Err(error) => row.error = Some(error),
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts what a holder is asked to do.
    #[derive(Default)]
    struct Counting {
        held: HashMap<u32, u32>,
        samples: u64,
    }

    impl Holder for Counting {
        fn allocate(&mut self, id: u32, key: &[u8; 8], value_bytes: u32) -> Result<(), String> {
            assert_eq!(*key, key_of(id));
            assert!(self.held.insert(id, value_bytes).is_none());
            Ok(())
        }
        fn free(&mut self, id: u32, _key: &[u8; 8]) -> Result<(), String> {
            self.held.remove(&id).map(|_| ()).ok_or_else(|| format!("{id} not held"))
        }
        fn sample(&mut self) -> Result<(), String> {
            self.samples += 1;
            Ok(())
        }
        fn finish(&mut self, _live_objects: u64) -> Result<Finished, String> {
            Ok(Finished::default())
        }
        fn process_id(&self) -> u32 {
            0
        }
    }

    #[test]
    fn the_driver_holds_live_data_under_its_cap_through_every_phase() {
        // Large enough that W7's 1–2.5 KB objects reach a sample point at the cap.
        let cap = 8 << 20;
        for workload in &WORKLOADS {
            let mut holder = Counting::default();
            let mut driver = Driver::new(1, cap);
            driver.run(workload, 5 * cap, &mut holder).unwrap();
            let held: u64 = holder.held.values().map(|&value| KEY_BYTES + u64::from(value)).sum();
            assert_eq!(held, driver.live_bytes, "{}", workload.name);
            assert!(driver.live_bytes_max <= cap && driver.live_bytes_max > cap * 9 / 10);
            assert!(holder.samples > 0, "{} reached its cap", workload.name);
            // The last phase's sizes dominate the live set at the end.
            let last = workload.after.map_or(workload.before, |(_, sizes)| sizes);
            let in_last = holder.held.values().filter(|&&value| value >= last.low).count();
            assert!(in_last * 2 > holder.held.len(), "{}", workload.name);
        }
    }

    #[test]
    fn sizes_that_cannot_run_are_refused_with_their_flag_named() {
        let arguments = |live_mib, allocation_multiple, segment_kib| MemoryArguments {
            workload: vec!["W1".into()],
            systems: vec!["glibc".into()],
            live_mib,
            allocation_multiple,
            full: false,
            log_utilization_percent: 90,
            segment_kib,
            seglet_kib: 16,
            levels: 2,
            seed: 1,
        };
        assert!(check_sizes(&arguments(256, 5, 1024)).is_ok());
        for (bad, flag) in [
            (arguments(0, 5, 1024), "--live-mib"),
            (arguments(u64::MAX, 5, 1024), "--live-mib"),
            (arguments(256, 0, 1024), "--allocation-multiple"),
            (arguments(256, 5, 0), "--segment-kib"),
            (arguments(256, 5, u32::MAX), "--segment-kib"),
        ] {
            let error = check_sizes(&bad).unwrap_err();
            assert!(error.contains(flag), "{error}");
        }
    }

    #[test]
    fn keys_are_eight_hex_digits() {
        assert_eq!(&key_of(0), b"00000000");
        assert_eq!(&key_of(0xdead_beef), b"deadbeef");
    }

    #[test]
    fn worker_records_round_trip_and_bad_ones_are_refused() {
        for record in [
            WorkerRecord::Allocate { id: 7, value_bytes: 15_000 },
            WorkerRecord::Free { id: u32::MAX },
            WorkerRecord::Sample,
            WorkerRecord::Finish,
        ] {
            assert_eq!(WorkerRecord::decode(&record.encode()), Ok(record));
        }
        let too_large = WorkerRecord::Allocate { id: 1, value_bytes: 15_001 }.encode();
        assert!(WorkerRecord::decode(&too_large).is_err());
        let mut unknown = WorkerRecord::Finish.encode();
        unknown[0] = 9;
        assert!(WorkerRecord::decode(&unknown).is_err());
    }

    #[test]
    fn stratus_is_sized_for_the_phase_with_the_most_overhead() {
        let pattern = value_pattern();
        let cap = 256 << 20;
        let w8 = WORKLOADS[7];
        let sizes = stratus_sizes(&w8, cap, 5 * cap, 90, 1 << 20, &pattern);
        // W8's small objects (mean 100 B) carry the overhead: about 1.15 × the cap in entries.
        // 5 × 256 MiB of 50..150-byte objects, then of larger ones: over 2^24 writes, so
        // versions are 4 bytes.
        let entries = (cap / 108) * object_entry_bytes(100, VERSION_WIDE, &pattern);
        let log_bytes = sizes.log_bytes;
        assert!(log_bytes >= entries * 100 / 90 && log_bytes < entries * 100 / 90 + (1 << 20));
        // Up to cap / 58 objects (50-byte values), at most 3/4 of the hash entries used.
        assert!(sizes.hash_table_bytes / 8 * 3 / 4 >= cap / 58);
        // The large objects of the second phase fill less of the log than the small ones.
        assert!(sizes.log_fill_at_cap_min > 0.7 && sizes.log_fill_at_cap_min < 0.85);
        let w1 = stratus_sizes(&WORKLOADS[0], cap, 5 * cap, 90, 1 << 20, &pattern);
        assert!((w1.log_fill_at_cap_min - 0.9).abs() < 0.01, "{w1:?}");
    }
}
