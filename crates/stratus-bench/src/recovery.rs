//! `stratus bench recovery`: how long a master's data is unavailable after it crashes, and how
//! fast it is recovered, against the disk's bound and against Redis restarting, in one run.
//!
//! A local cluster of a coordinator and N storage servers (each a master and a backup) is
//! started as child processes. A table whose tablets all live on one master is filled with
//! M MiB of objects, then that master's process is killed with SIGKILL. Measured:
//!
//! - `kill_to_served_ms`: from the kill until every tablet of the table is normal on other
//!   masters in the coordinator's tablet map and a sample of keys reads back correctly: what a
//!   client sees (failure detection included).
//! - `decision_to_served_ms`: the same, from the moment the coordinator declared the crash (the
//!   timestamp of its "server declared crashed" log line; if that line cannot be found, the
//!   first poll of the server list that showed the master crashed). `recovered_mb_per_sec` is
//!   the data over this time: RAMCloud's recovery bandwidth.
//! - `acknowledged_writes_lost`: every key written (all were acknowledged) is read back after
//!   recovery; a missing or different value counts. It must be 0.
//!
//! References in the same run: `physical_bound_ms`, reading one replica of each of the
//! master's segments the way the backups read them for the recovery (through the page cache,
//! or with O_DIRECT under `--backup-direct-io`; the open head, in buffered mode only in the
//! backups' RAM, copied in memory), split over the backups in parallel (`replica_files`; done
//! just before the kill, because recovered masters' replicas are garbage-collected afterwards);
//! and `redis_restart_ms`, Redis restarting from an append-only file of the same objects
//! (`redis_reference`; null when `redis-server` is not installed). The slowest recovery master
//! is compared with Redis's one process in objects per second (`recovery_master_over_redis_load`:
//! the same unit on both sides; replica bytes count keys, headers and segment overhead that an
//! AOF of values does not), and each side's CPU in CPU-seconds per GB of object values: every
//! surviving Stratus process from the kill until served, Redis's process from its start until
//! it answered.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use clap::Args;
use stratus_client::{Client, ClientConfig, KeyItem, Status, TableId, WriteItem};
use stratus_env::TcpNetwork;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::{RejectRules, ServerId, TabletState};
use stratus_wire::{Request, Response, ResponseBody, ServerStatus};

use crate::cluster::{free_loopback_address, start_stratus_logged, ChildProcess};
use crate::cpu::CpuMeter;
use crate::redis_reference::{self, RedisRestart};
use crate::replica_files::{self, Location, PhysicalRead, ReadMethod, StoredReplica};
use crate::report::{print_json, Field};
use crate::server_logs::{
    crash_declaration_time, objects_expected, partitions_recovered, print_log_tails,
    recovery_finished_elapsed, PartitionRecovered,
};

/// `stratus bench recovery`.
#[derive(Debug, Args)]
pub struct RecoveryArguments {
    /// Storage servers (each a master and a backup); one of them is killed.
    #[arg(long, default_value_t = 5)]
    pub servers: u32,
    /// Live data on the master that is killed, in MiB.
    #[arg(long, default_value_t = 1024)]
    pub data_mib: u64,
    /// Copies of every segment on other servers (default: 3, or servers − 2 in smaller
    /// clusters: after the kill, each recovery master needs that many backups besides itself).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Value size of each object in bytes.
    #[arg(long, default_value_t = 1000)]
    pub object_bytes: usize,
    /// When backups acknowledge replica writes: buffered (in their RAM) or fsync (on disk).
    #[arg(long, default_value = "buffered", value_parser = ["buffered", "fsync"])]
    pub durability: String,
    /// Segment size in MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u32,
    /// How long the recovery may take, from the kill until the data is served, before the
    /// benchmark reports a failure.
    #[arg(long, default_value_t = 300)]
    pub recovery_timeout_seconds: u64,
    /// Directory for the cluster's data and logs, kept afterwards (it must not exist or be
    /// empty). Default: a temporary directory, removed at the end.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Start the servers with `--prefault-memory` (their log memory touched at start, as a
    /// production server's is: RAMCloud's masters reserve theirs at start), so the recovery
    /// does not pay the page faults of a fresh server's first writes. `false` measures a
    /// server started without it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub prefault_memory: bool,
    /// Start the servers with `--backup-direct-io` (replica files written and read with
    /// O_DIRECT, as RAMCloud's and DXRAM's backups do, rather than through the page cache).
    #[arg(long)]
    pub backup_direct_io: bool,
    /// Extra tables of one tablet each, moved onto the master that is killed and left empty:
    /// a crashed master whose tablets differ in size, to see how recovery sizes its partitions
    /// (with one, in a 3-server cluster, equal cuts per tablet would give one recovery master
    /// all the data).
    #[arg(long, default_value_t = 0)]
    pub empty_tables: u32,
    /// Also fill a second table on the master that is killed, with as many bytes as the first
    /// (`--data-mib` more) in objects of this many bytes: a crashed master holding small
    /// objects beside large ones, to see how recovery weighs object counts against bytes.
    #[arg(long)]
    pub second_table_object_bytes: Option<usize>,
}

/// Bytes an object entry takes in the log besides its key and value (entry header and object
/// header, rounded up).
const OBJECT_ENTRY_OVERHEAD_BYTES: u64 = 40;
/// The most of a master's log the benchmark fills with live data: the log keeps segments in
/// reserve for the cleaner and refuses writes well before it is full.
const LIVE_FRACTION_OF_LOG_MAX: f64 = 0.8;
/// Segments added to every log beyond its live data (the head, the cleaner's reserve).
const LOG_HEADROOM_SEGMENTS: u64 = 4;
/// Objects per MULTI_WRITE while loading.
const LOAD_BATCH_OBJECTS: u64 = 256;
/// MULTI_WRITEs in flight at once while loading.
const LOAD_REQUESTS_IN_FLIGHT: u64 = 8;
/// Objects per MULTI_READ while checking.
const VERIFY_BATCH_OBJECTS: u64 = 1_000;
/// MULTI_READs in flight at once while checking.
const VERIFY_REQUESTS_IN_FLIGHT: u64 = 4;
/// Keys read (spread over the key space) to decide that the data is served again.
const SAMPLE_KEYS: u64 = 100;
/// Pause between two polls of the coordinator while waiting for the recovery.
const RECOVERY_POLL_INTERVAL: Duration = Duration::from_millis(5);
/// How long the servers may take to become idle after loading (replicas closing and being
/// written); past it the benchmark goes on with a notice.
const IDLE_PATIENCE: Duration = Duration::from_secs(60);
/// Consecutive identical statistics polls that count as idle.
const IDLE_POLLS: u32 = 4;
/// Pause between two statistics polls while waiting for idle.
const IDLE_POLL_INTERVAL: Duration = Duration::from_millis(250);
/// How long one process may take to start and print that it is listening.
const START_PATIENCE: Duration = Duration::from_secs(60);
/// The most of the available memory the benchmark's estimate may use.
const MEMORY_FRACTION_MAX: f64 = 0.8;

/// What the arguments work out to.
#[derive(Clone, Debug, PartialEq)]
struct Plan {
    servers: u32,
    replicas: u32,
    /// Value bytes of the first table's objects.
    object_bytes: usize,
    /// Objects of both tables: indexes below `first_table_objects` are the first table's.
    objects: u64,
    first_table_objects: u64,
    /// Value bytes of the second table's objects, if there is one.
    second_table_object_bytes: Option<usize>,
    data_bytes: u64,
    segment_mib: u32,
    /// Log memory of every server: the killed master's data with headroom. Every server gets
    /// it, because the coordinator picks the table's master after the servers started; a
    /// recovery master needs only its share (data / (servers − 1)). Without prefaulting, log
    /// memory is reserved, not touched, until used; with it (the default), every server holds
    /// all of it (`memory_needed_bytes` counts that).
    log_mib: u64,
    /// Storage frames of every backup: its share of the killed master's replicas and of the
    /// replicas of the recovered data, twice over.
    backup_frames: u32,
    durability: String,
    recovery_timeout: Duration,
    prefault_memory: bool,
    backup_direct_io: bool,
    empty_tables: u32,
}

impl Plan {
    fn from_arguments(arguments: &RecoveryArguments) -> Result<Plan, String> {
        if arguments.servers < 3 {
            return Err("--servers must be at least 3: one is killed, another recovers, and a \
                        third backs up what it recovered"
                .into());
        }
        // After the crash every recovery master must place its recovered data on `replicas`
        // backups other than itself among the survivors, or the recovery can never finish.
        let replicas = arguments.replicas.unwrap_or(3.min(arguments.servers - 2));
        if replicas == 0 {
            return Err("--replicas must be at least 1: nothing survives a crash without".into());
        }
        if arguments.servers < replicas + 2 {
            return Err(format!(
                "{replicas} replicas need at least {} servers: a master never backs itself up, \
                 and the recovery masters need {replicas} backups besides themselves after one \
                 server is killed",
                replicas + 2
            ));
        }
        if arguments.data_mib == 0 {
            return Err("--data-mib must be at least 1".into());
        }
        if arguments.segment_mib == 0 || arguments.segment_mib > 8 {
            return Err("--segment-mib must be 1 to 8 (one segment per backup write)".into());
        }
        let segment_bytes = u64::from(arguments.segment_mib) << 20;
        // A master accepts values up to an eighth of a segment (the cleaner's packing rule).
        let value_bytes_max = (segment_bytes / 8).min(1 << 20);
        if arguments.object_bytes == 0 || arguments.object_bytes as u64 > value_bytes_max {
            return Err(format!("--object-bytes must be 1 to {value_bytes_max}"));
        }
        if let Some(bytes) = arguments.second_table_object_bytes {
            if bytes == 0 || bytes as u64 > value_bytes_max {
                return Err(format!("--second-table-object-bytes must be 1 to {value_bytes_max}"));
            }
        }
        if arguments.recovery_timeout_seconds == 0 {
            return Err("--recovery-timeout-seconds must be at least 1".into());
        }
        let data_bytes_wanted = arguments.data_mib << 20;
        let first_table_objects = (data_bytes_wanted / arguments.object_bytes as u64).max(1);
        let second_table_objects = arguments
            .second_table_object_bytes
            .map_or(0, |bytes| (data_bytes_wanted / bytes as u64).max(1));
        let objects = first_table_objects + second_table_objects;
        let second_table_bytes = arguments.second_table_object_bytes.unwrap_or(0) as u64;
        let data_bytes = first_table_objects * arguments.object_bytes as u64
            + second_table_objects * second_table_bytes;
        let key_bytes = object_key(objects).len() as u64;
        let live_log_bytes = data_bytes + objects * (key_bytes + OBJECT_ENTRY_OVERHEAD_BYTES);
        let log_bytes = (live_log_bytes as f64 / LIVE_FRACTION_OF_LOG_MAX) as u64
            + LOG_HEADROOM_SEGMENTS * segment_bytes;
        let log_mib = log_bytes.div_ceil(segment_bytes) * u64::from(arguments.segment_mib);
        let segments = live_log_bytes.div_ceil(segment_bytes) + 1;
        let replicas_per_backup =
            (2 * u64::from(replicas) * segments).div_ceil(u64::from(arguments.servers - 1));
        let backup_frames = u32::try_from(2 * replicas_per_backup + 16)
            .map_err(|_| "--data-mib is too large for the backups' storage".to_string())?
            .max(stratus_backup::BackupConfig::FRAME_COUNT_DEFAULT);
        Ok(Plan {
            servers: arguments.servers,
            replicas,
            object_bytes: arguments.object_bytes,
            objects,
            first_table_objects,
            second_table_object_bytes: arguments.second_table_object_bytes,
            data_bytes,
            segment_mib: arguments.segment_mib,
            log_mib,
            backup_frames,
            durability: arguments.durability.clone(),
            recovery_timeout: Duration::from_secs(arguments.recovery_timeout_seconds),
            prefault_memory: arguments.prefault_memory,
            backup_direct_io: arguments.backup_direct_io,
            empty_tables: arguments.empty_tables,
        })
    }

    /// The value bytes of object `index`.
    fn value_bytes(&self, index: u64) -> usize {
        match self.second_table_object_bytes {
            Some(bytes) if index >= self.first_table_objects => bytes,
            _ => self.object_bytes,
        }
    }

    /// Memory the run needs at its peak, roughly: during recovery the recovery masters hold
    /// their partitions' segments while they replay and the recovered objects in their logs
    /// (the crashed log twice over, in all; with prefaulted memory, every server's whole log),
    /// and every backup may fill its RAM buffers; Redis runs after the cluster stopped and
    /// needs about one and a half times the data.
    fn memory_needed_bytes(&self) -> u64 {
        let log_bytes = self.log_mib << 20;
        let backup_buffers_bytes = u64::from(self.servers)
            * stratus_backup::BackupConfig::BUFFER_COUNT_DEFAULT as u64
            * (u64::from(self.segment_mib) << 20);
        let logs_bytes = if self.prefault_memory {
            u64::from(self.servers) * log_bytes + log_bytes
        } else {
            2 * log_bytes
        };
        let cluster_peak = logs_bytes + backup_buffers_bytes;
        let redis_peak = self.data_bytes * 3 / 2;
        cluster_peak.max(redis_peak)
    }
}

/// The `MemAvailable` figure of /proc/meminfo, in bytes.
fn parse_memory_available_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kibibytes: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kibibytes * 1024)
}

/// The tables the objects are loaded into.
#[derive(Clone, Copy, Debug)]
struct Tables {
    first: TableId,
    /// With `--second-table-object-bytes`.
    second: Option<TableId>,
    first_table_objects: u64,
}

impl Tables {
    /// The table of object `index` (keys are distinct over both tables).
    fn of(&self, index: u64) -> TableId {
        match self.second {
            Some(second) if index >= self.first_table_objects => second,
            _ => self.first,
        }
    }

    fn all(&self) -> impl Iterator<Item = TableId> {
        std::iter::once(self.first).chain(self.second)
    }
}

/// The key of object `index`.
fn object_key(index: u64) -> Vec<u8> {
    format!("recovery-{index:012}").into_bytes()
}

/// The value of object `index`: its index, then a byte that depends on it, so a value of
/// another object or a stale one never compares equal.
fn object_value(index: u64, object_bytes: usize) -> Vec<u8> {
    let mut value = vec![(index % 251) as u8; object_bytes];
    let tag = index.to_le_bytes();
    let tagged = tag.len().min(object_bytes);
    value[..tagged].copy_from_slice(&tag[..tagged]);
    value
}

/// Runs the benchmark.
pub fn run(arguments: RecoveryArguments) -> Result<(), String> {
    let plan = Plan::from_arguments(&arguments)?;
    if let Some(available) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|meminfo| parse_memory_available_bytes(&meminfo))
    {
        let needed = plan.memory_needed_bytes();
        if needed as f64 > available as f64 * MEMORY_FRACTION_MAX {
            return Err(format!(
                "this run needs about {} MiB of memory and {} MiB are available; use a smaller \
                 --data-mib or fewer --servers",
                needed >> 20,
                available >> 20
            ));
        }
    }
    let temporary_directory;
    let directory = match &arguments.dir {
        Some(directory) => {
            let is_empty = std::fs::read_dir(directory)
                .map(|mut entries| entries.next().is_none())
                .unwrap_or(true);
            if !is_empty {
                return Err(format!("{} is not empty", directory.display()));
            }
            std::fs::create_dir_all(directory)
                .map_err(|error| format!("{}: {error}", directory.display()))?;
            directory.clone()
        }
        None => {
            temporary_directory = tempfile::tempdir().map_err(|error| error.to_string())?;
            temporary_directory.path().to_path_buf()
        }
    };
    let logs = directory.join("logs");
    std::fs::create_dir_all(&logs).map_err(|error| format!("{}: {error}", logs.display()))?;
    let outcome = run_in(&plan, &directory);
    if outcome.is_err() {
        print_log_tails(&logs);
    }
    outcome
}

/// Everything measured on the Stratus cluster.
#[derive(Clone, Debug)]
struct ClusterMeasurement {
    load: Duration,
    physical: PhysicalRead,
    kill_to_decision: Duration,
    kill_to_served: Duration,
    decision_source: &'static str,
    coordinator_recovery: Option<Duration>,
    /// What each recovery master reported of its partitions.
    partitions: Vec<PartitionRecovered>,
    /// The objects the coordinator expected each recovery master to replay (from the crashed
    /// log's table statistics), if it logged them.
    objects_expected: Option<Vec<u64>>,
    acknowledged_writes_lost: u64,
    /// CPU of the surviving processes from the kill until served, and how many they are.
    recovery_cpu: Duration,
    recovery_cpu_processes: usize,
}

fn run_in(plan: &Plan, directory: &Path) -> Result<(), String> {
    let second_table = match plan.second_table_object_bytes {
        Some(bytes) => format!(
            " and {} of {bytes} bytes in a second table",
            plan.objects - plan.first_table_objects
        ),
        None => String::new(),
    };
    eprintln!(
        "bench recovery: {} servers, {} replicas, {} objects of {} bytes{second_table} ({:.1} \
         MB), log {} MiB per server, data in {}",
        plan.servers,
        plan.replicas,
        plan.first_table_objects,
        plan.object_bytes,
        plan.data_bytes as f64 / 1e6,
        plan.log_mib,
        directory.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let mut cluster = LocalCluster::start(plan, directory)?;
    let measured = runtime.block_on(measure_cluster(plan, &mut cluster))?;
    // Stop Stratus before Redis runs, so it has the machine to itself.
    drop(cluster);

    let mut redis_failure = None;
    let redis = match redis_reference::find_executable(
        redis_reference::REDIS_SERVER,
        &std::env::var_os("PATH").unwrap_or_default(),
    ) {
        None => {
            eprintln!(
                "NOTICE: {} is not on PATH: the Redis reference is skipped (redis_restart_ms \
                 null)",
                redis_reference::REDIS_SERVER
            );
            None
        }
        Some(executable) => {
            eprintln!("bench recovery: loading Redis and restarting it from its AOF");
            match redis_reference::measure_restart(
                &executable,
                &directory.join("redis"),
                plan.objects,
                |index| (object_key(index), object_value(index, plan.value_bytes(index))),
                plan.recovery_timeout,
            ) {
                Ok(restart) => Some(restart),
                Err(error) => {
                    eprintln!("the Redis reference failed: {error}");
                    redis_failure = Some(error);
                    None
                }
            }
        }
    };

    report(plan, &measured, redis.as_ref());
    if measured.acknowledged_writes_lost > 0 {
        return Err(format!(
            "{} acknowledged writes were lost in the recovery",
            measured.acknowledged_writes_lost
        ));
    }
    match redis_failure {
        Some(error) => Err(format!("the Redis reference failed: {error}")),
        None => Ok(()),
    }
}

fn milliseconds(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// Prints the result: a line of the main figures, then one JSON row with all of them.
fn report(plan: &Plan, measured: &ClusterMeasurement, redis: Option<&RedisRestart>) {
    let data_mb = plan.data_bytes as f64 / 1e6;
    let kill_to_served_ms = milliseconds(measured.kill_to_served);
    let decision_to_served = measured.kill_to_served.saturating_sub(measured.kill_to_decision);
    let decision_to_served_ms = milliseconds(decision_to_served);
    let recovered_mb_per_sec = data_mb / decision_to_served.as_secs_f64();
    let physical_bound_ms = milliseconds(measured.physical.elapsed);
    let redis_restart_ms = redis.map(|redis| milliseconds(redis.restart));
    println!(
        "{:>7} {:>8} {:>9} {:>9} {:>17} {:>21} {:>20} {:>17} {:>16} {:>11}",
        "servers",
        "replicas",
        "data_mb",
        "objects",
        "kill_to_served_ms",
        "decision_to_served_ms",
        "recovered_mb_per_sec",
        "physical_bound_ms",
        "redis_restart_ms",
        "writes_lost"
    );
    let redis_text =
        redis_restart_ms.map_or_else(|| "-".to_string(), |restart_ms| format!("{restart_ms:.0}"));
    println!(
        "{:>7} {:>8} {data_mb:>9.1} {:>9} {kill_to_served_ms:>17.0} {decision_to_served_ms:>21.0} \
         {recovered_mb_per_sec:>20.1} {physical_bound_ms:>17.0} {redis_text:>16} {:>11}",
        plan.servers, plan.replicas, plan.objects, measured.acknowledged_writes_lost
    );
    let mut fields = vec![
        ("bench", Field::Text("recovery".into())),
        ("servers", Field::Number(f64::from(plan.servers))),
        ("replicas", Field::Number(f64::from(plan.replicas))),
        ("durability", Field::Text(plan.durability.clone())),
        ("segment_mib", Field::Number(f64::from(plan.segment_mib))),
        ("prefault_memory", Field::Boolean(plan.prefault_memory)),
        ("backup_direct_io", Field::Boolean(plan.backup_direct_io)),
        ("empty_tables", Field::Number(f64::from(plan.empty_tables))),
        ("data_bytes", Field::Number(plan.data_bytes as f64)),
        ("object_bytes", Field::Number(plan.object_bytes as f64)),
        (
            "second_table_object_bytes",
            Field::optional_number(plan.second_table_object_bytes.map(|bytes| bytes as f64)),
        ),
        ("objects", Field::Number(plan.objects as f64)),
        ("load_mb_per_sec", Field::Number(data_mb / measured.load.as_secs_f64())),
        ("kill_to_decision_ms", Field::Number(milliseconds(measured.kill_to_decision))),
        ("decision_source", Field::Text(measured.decision_source.into())),
        ("kill_to_served_ms", Field::Number(kill_to_served_ms)),
        ("decision_to_served_ms", Field::Number(decision_to_served_ms)),
        (
            "coordinator_recovery_ms",
            Field::optional_number(measured.coordinator_recovery.map(milliseconds)),
        ),
        ("recovered_mb_per_sec", Field::Number(recovered_mb_per_sec)),
    ];
    fields.extend(partition_fields(measured));
    fields.extend(physical_fields(measured, decision_to_served_ms));
    fields.extend(redis_fields(plan, measured, redis));
    fields.push((
        "acknowledged_writes_lost",
        Field::Number(measured.acknowledged_writes_lost as f64),
    ));
    print_json(&fields);
}

/// What each recovery master reported of its partition: the slowest one's rates (replica
/// bytes per second, and objects per second, the unit compared with Redis), the longest
/// phases, and how evenly the work was shared.
fn partition_fields(measured: &ClusterMeasurement) -> Vec<(&'static str, Field)> {
    let partitions = &measured.partitions;
    let slowest = |rate: &dyn Fn(&PartitionRecovered) -> f64| {
        partitions.iter().map(rate).min_by(f64::total_cmp)
    };
    let whole =
        |partition: &PartitionRecovered| partition.read + partition.replay + partition.durable;
    let per_second = |bytes: u64, duration: Duration| bytes as f64 / 1e6 / duration.as_secs_f64();
    let longest = |phase: &dyn Fn(&PartitionRecovered) -> Duration| {
        partitions.iter().map(|partition| milliseconds(phase(partition))).max_by(f64::total_cmp)
    };
    // How evenly the partitions shared the work: the most objects one master replayed over
    // the mean (1.0 is perfect balance).
    let objects_replayed: u64 = partitions.iter().map(|partition| partition.objects).sum();
    let objects_max_over_mean = partitions
        .iter()
        .map(|partition| partition.objects)
        .max()
        .map(|most| most as f64 * partitions.len() as f64 / objects_replayed.max(1) as f64);
    let objects_expected: Option<u64> =
        measured.objects_expected.as_ref().map(|expected| expected.iter().sum());
    // The same for the replay phases' durations: how evenly the modelled work was shared.
    let replay_ms: Vec<f64> =
        partitions.iter().map(|partition| milliseconds(partition.replay)).collect();
    let replay_ms_max_over_mean = replay_ms.iter().copied().max_by(f64::total_cmp).map(|most| {
        most * replay_ms.len() as f64 / replay_ms.iter().sum::<f64>().max(f64::MIN_POSITIVE)
    });
    vec![
        ("recovery_masters", Field::Number(partitions.len() as f64)),
        ("objects_replayed", Field::Number(objects_replayed as f64)),
        (
            "objects_expected",
            Field::optional_number(objects_expected.map(|expected| expected as f64)),
        ),
        ("recovery_master_objects_max_over_mean", Field::optional_number(objects_max_over_mean)),
        (
            "recovery_master_mb_per_sec_min",
            Field::optional_number(slowest(&|partition| {
                per_second(partition.replica_bytes_read, whole(partition))
            })),
        ),
        (
            "recovery_master_objects_per_sec_min",
            Field::optional_number(recovery_master_objects_per_sec_min(partitions)),
        ),
        (
            "replay_mb_per_sec_min",
            Field::optional_number(slowest(&|partition| {
                per_second(partition.replica_bytes_read, partition.replay)
            })),
        ),
        ("read_ms_max", Field::optional_number(longest(&|partition| partition.read))),
        ("replay_ms_max", Field::optional_number(longest(&|partition| partition.replay))),
        ("replay_ms_max_over_mean", Field::optional_number(replay_ms_max_over_mean)),
        ("durable_ms_max", Field::optional_number(longest(&|partition| partition.durable))),
    ]
}

/// Objects per second of the slowest recovery master over its whole part (read, replay,
/// durable).
fn recovery_master_objects_per_sec_min(partitions: &[PartitionRecovered]) -> Option<f64> {
    partitions
        .iter()
        .map(|partition| {
            let whole = partition.read + partition.replay + partition.durable;
            partition.objects as f64 / whole.as_secs_f64().max(1e-9)
        })
        .min_by(f64::total_cmp)
}

/// The physical bound: reading the replicas as the backups read them for the recovery.
fn physical_fields(
    measured: &ClusterMeasurement,
    decision_to_served_ms: f64,
) -> Vec<(&'static str, Field)> {
    let physical = &measured.physical;
    let physical_bound_ms = milliseconds(physical.elapsed);
    let mb_per_sec = physical.segment_bytes_read as f64 / 1e6 / physical.elapsed.as_secs_f64();
    vec![
        ("physical_bound_ms", Field::Number(physical_bound_ms)),
        ("physical_bound_method", Field::Text(physical.method.name().into())),
        ("physical_bound_bytes", Field::Number(physical.segment_bytes_read as f64)),
        ("physical_bound_memory_bytes", Field::Number(physical.memory_bytes_read as f64)),
        ("physical_bound_segments", Field::Number(physical.segments as f64)),
        ("physical_bound_mb_per_sec", Field::Number(mb_per_sec)),
        (
            "physical_bound_over_kill_to_served",
            Field::Number(physical_bound_ms / milliseconds(measured.kill_to_served)),
        ),
        (
            "physical_bound_over_decision_to_served",
            Field::Number(physical_bound_ms / decision_to_served_ms),
        ),
    ]
}

/// Redis's restart beside the recovery, in the same units on both sides: objects per second
/// (one recovery master against Redis's one process), and CPU-seconds per GB of object
/// values (every surviving Stratus process from the kill until served; Redis's process from
/// its start until it answered).
fn redis_fields(
    plan: &Plan,
    measured: &ClusterMeasurement,
    redis: Option<&RedisRestart>,
) -> Vec<(&'static str, Field)> {
    let data_gb = plan.data_bytes as f64 / 1e9;
    let redis_restart_ms = redis.map(|redis| milliseconds(redis.restart));
    let redis_objects_per_sec =
        redis.map(|redis| plan.objects as f64 / redis.restart.as_secs_f64());
    let master_objects_per_sec = recovery_master_objects_per_sec_min(&measured.partitions);
    let kill_to_served_ms = milliseconds(measured.kill_to_served);
    vec![
        (
            "recovery_master_over_redis_load",
            Field::optional_number(
                master_objects_per_sec
                    .zip(redis_objects_per_sec)
                    .map(|(master, redis)| master / redis),
            ),
        ),
        ("redis_restart_ms", Field::optional_number(redis_restart_ms)),
        (
            "redis_load_mb_per_sec",
            Field::optional_number(
                redis.map(|redis| plan.data_bytes as f64 / 1e6 / redis.restart.as_secs_f64()),
            ),
        ),
        ("redis_load_objects_per_sec", Field::optional_number(redis_objects_per_sec)),
        ("redis_aof_bytes", Field::optional_number(redis.map(|redis| redis.aof_bytes as f64))),
        (
            "redis_restart_over_kill_to_served",
            Field::optional_number(redis_restart_ms.map(|redis| redis / kill_to_served_ms)),
        ),
        ("stratus_cpu_seconds", Field::Number(measured.recovery_cpu.as_secs_f64())),
        ("stratus_cpu_processes", Field::Number(measured.recovery_cpu_processes as f64)),
        (
            "stratus_cpu_seconds_per_gb",
            Field::Number(measured.recovery_cpu.as_secs_f64() / data_gb),
        ),
        ("redis_cpu_seconds", Field::optional_number(redis.map(|redis| redis.cpu.as_secs_f64()))),
        (
            "redis_cpu_seconds_per_gb",
            Field::optional_number(redis.map(|redis| redis.cpu.as_secs_f64() / data_gb)),
        ),
    ]
}

/// A storage server of the local cluster.
#[derive(Debug)]
struct StorageServer {
    server_id: ServerId,
    address: String,
    /// Its backup's storage file.
    storage_file: PathBuf,
    /// Its log (standard output and error).
    log: PathBuf,
    process: ChildProcess,
}

/// The coordinator and storage servers, stopped (SIGTERM) when dropped.
#[derive(Debug)]
struct LocalCluster {
    // Declared first, so it is dropped (stopped) first: a coordinator that outlives servers
    // being stopped would declare them crashed and start recovering their tablets.
    coordinator: ChildProcess,
    coordinator_address: String,
    coordinator_log: PathBuf,
    servers: Vec<StorageServer>,
}

impl LocalCluster {
    fn start(plan: &Plan, directory: &Path) -> Result<LocalCluster, String> {
        let logs = directory.join("logs");
        let coordinator_address = free_loopback_address()?;
        let coordinator_directory = directory.join("coordinator").display().to_string();
        let coordinator_log = logs.join("coordinator.log");
        let (coordinator, _) = start_stratus_logged(
            &[
                "coordinator",
                "--listen",
                &coordinator_address,
                "--dir",
                &coordinator_directory,
                "--exit-with-parent",
            ],
            "coordinator listening",
            START_PATIENCE,
            &coordinator_log,
        )?;
        let mut cluster =
            LocalCluster { coordinator, coordinator_address, coordinator_log, servers: Vec::new() };
        let log_mib = plan.log_mib.to_string();
        let segment_mib = plan.segment_mib.to_string();
        let replicas = plan.replicas.to_string();
        let backup_frames = plan.backup_frames.to_string();
        for index in 0..plan.servers {
            let backup_directory = directory.join(format!("server-{index}")).join("backup");
            let backup_directory_text = backup_directory.display().to_string();
            let (process, line) = start_stratus_logged(
                &[
                    "--coordinator",
                    &cluster.coordinator_address,
                    "server",
                    "--exit-with-parent",
                    "--listen",
                    "127.0.0.1:0",
                    "--log-mib",
                    &log_mib,
                    "--segment-mib",
                    &segment_mib,
                    "--replicas",
                    &replicas,
                    "--backup-dir",
                    &backup_directory_text,
                    "--durability",
                    &plan.durability,
                    "--backup-frames",
                    &backup_frames,
                ]
                .into_iter()
                .chain(plan.prefault_memory.then_some("--prefault-memory"))
                .chain(plan.backup_direct_io.then_some("--backup-direct-io"))
                .collect::<Vec<_>>(),
                "listening on",
                START_PATIENCE,
                &logs.join(format!("server-{index}.log")),
            )?;
            let (server_id, address) = parse_server_listening(&line)
                .ok_or_else(|| format!("unexpected server output {line:?}"))?;
            cluster.servers.push(StorageServer {
                server_id,
                address,
                storage_file: backup_directory.join(stratus_backup::STORAGE_FILE_NAME),
                log: logs.join(format!("server-{index}.log")),
                process,
            });
        }
        Ok(cluster)
    }

    /// A message naming the first process of the cluster that exited, other than `killed`.
    fn unexpected_exit(&mut self, killed: ServerId) -> Option<String> {
        if let Some(status) = self.coordinator.exited() {
            return Some(format!("the coordinator exited ({status})"));
        }
        self.servers.iter_mut().filter(|server| server.server_id != killed).find_map(|server| {
            server
                .process
                .exited()
                .map(|status| format!("server {} exited ({status})", server.server_id))
        })
    }
}

/// The server id and address of a server's "server ID listening on ADDRESS" line.
fn parse_server_listening(line: &str) -> Option<(ServerId, String)> {
    let mut words = line.split_whitespace();
    if words.next()? != "server" {
        return None;
    }
    let server_id = ServerId(words.next()?.parse().ok()?);
    if (words.next()?, words.next()?) != ("listening", "on") {
        return None;
    }
    Some((server_id, words.next()?.to_string()))
}

fn client(coordinator: &str, operation_timeout: Duration) -> Client {
    let mut config = ClientConfig::new(coordinator.to_string());
    config.operation_timeout = operation_timeout;
    Client::new(config)
}

async fn measure_cluster(
    plan: &Plan,
    cluster: &mut LocalCluster,
) -> Result<ClusterMeasurement, String> {
    let loader = client(&cluster.coordinator_address, Duration::from_secs(60));
    let table = loader
        .create_table("bench-recovery", 1)
        .await
        .map_err(|error| format!("creating the table: {error}"))?;
    let tablets = loader.tablet_map(table).await.map_err(|error| format!("tablet map: {error}"))?;
    let victim = tablets.first().map(|tablet| tablet.owner).ok_or("the table has no tablet")?;
    if tablets.iter().any(|tablet| tablet.owner != victim) {
        return Err("a table of server span 1 is spread over several masters".into());
    }
    let victim_address = tablets[0].owner_address.clone();
    for index in 0..plan.empty_tables {
        create_table_on(&loader, &format!("bench-recovery-empty-{index}"), victim).await?;
    }
    let second = match plan.second_table_object_bytes {
        None => None,
        Some(_) => Some(create_table_on(&loader, "bench-recovery-second", victim).await?),
    };
    let tables = Tables { first: table, second, first_table_objects: plan.first_table_objects };

    eprintln!("bench recovery: loading {} objects onto master {victim}", plan.objects);
    let started = Instant::now();
    // At least 1 MB/s, or something is wrong.
    let load_patience = Duration::from_secs(120 + plan.data_bytes / 1_000_000);
    tokio::time::timeout(load_patience, load(&loader, tables, plan))
        .await
        .map_err(|_| format!("loading took more than {} s", load_patience.as_secs()))??;
    let load_time = started.elapsed();
    wait_until_idle(&loader, &victim_address, cluster).await?;
    let servers = loader.server_list().await.map_err(|error| format!("server list: {error}"))?;
    if let Some(down) = servers.iter().find(|server| server.status != ServerStatus::Up) {
        return Err(format!(
            "server {} was declared {:?} before the kill (overloaded?)",
            down.server_id, down.status
        ));
    }
    drop(loader);

    // The physical bound is read now, before the kill: once the master is recovered the
    // coordinator marks it removed and the backups garbage-collect its replicas.
    let physical = read_physical_bound(plan, cluster, victim).await?;

    let served = kill_and_wait_until_served(plan, cluster, tables, victim).await?;
    let coordinator_log = std::fs::read_to_string(&cluster.coordinator_log)
        .map_err(|error| format!("{}: {error}", cluster.coordinator_log.display()))?;
    let (kill_to_decision, decision_source) = crash_decision(&coordinator_log, victim, &served)?;
    let coordinator_recovery = recovery_finished_elapsed(&coordinator_log, victim);
    let objects_expected = objects_expected(&coordinator_log, victim);
    let mut partitions = Vec::new();
    for server in cluster.servers.iter().filter(|server| server.server_id != victim) {
        let log = std::fs::read_to_string(&server.log)
            .map_err(|error| format!("{}: {error}", server.log.display()))?;
        partitions.extend(partitions_recovered(&log, victim));
    }

    eprintln!("bench recovery: reading back all {} objects", plan.objects);
    let acknowledged_writes_lost = tokio::time::timeout(
        plan.recovery_timeout,
        count_lost(&cluster.coordinator_address, tables, plan),
    )
    .await
    .map_err(|_| {
        format!("reading back every object took more than {} s", plan.recovery_timeout.as_secs())
    })??;
    Ok(ClusterMeasurement {
        load: load_time,
        physical,
        kill_to_decision,
        kill_to_served: served.kill_to_served,
        decision_source,
        coordinator_recovery,
        partitions,
        objects_expected,
        acknowledged_writes_lost,
        recovery_cpu: served.cpu,
        recovery_cpu_processes: served.cpu_processes,
    })
}

/// Reads one replica of every segment of `victim` as the recovery will: the replicas the
/// surviving backups list (from their memory), from their files as they read them (through
/// the page cache, or with O_DIRECT under `--backup-direct-io`) or copied in memory for those
/// only in their RAM (the open head, in buffered mode).
async fn read_physical_bound(
    plan: &Plan,
    cluster: &LocalCluster,
    victim: ServerId,
) -> Result<PhysicalRead, String> {
    eprintln!("bench recovery: reading master {victim}'s replicas as the backups will");
    let survivors: Vec<(String, PathBuf)> = cluster
        .servers
        .iter()
        .filter(|server| server.server_id != victim)
        .map(|server| (server.address.clone(), server.storage_file.clone()))
        .collect();
    let method = if plan.backup_direct_io { ReadMethod::DirectIo } else { ReadMethod::PageCache };
    read_replicas_as_recovery_will(victim, &survivors, method).await
}

/// The physical bound of `victim`'s recovery: one replica of each of its segments read from
/// `survivors` (each a backup's address and its storage file) the way their backups read them,
/// in parallel over the backups.
pub(crate) async fn read_replicas_as_recovery_will(
    victim: ServerId,
    survivors: &[(String, PathBuf)],
    method: ReadMethod,
) -> Result<PhysicalRead, String> {
    let pool = ChannelPool::new(
        Arc::new(TcpNetwork),
        RpcConfig { request_timeout: Duration::from_secs(30), ..RpcConfig::default() },
    );
    let mut listed = Vec::new();
    for (backup, (address, _)) in survivors.iter().enumerate() {
        let request = Request::BackupListReplicas { master_id: victim };
        let replicas = match pool.call(address, &request).await {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::BackupListReplicas { replicas }),
            )) => replicas,
            other => return Err(format!("listing the replicas of {address}: {other:?}")),
        };
        listed.extend(replicas.into_iter().filter(|entry| entry.master_id == victim).map(
            |entry| StoredReplica {
                backup,
                location: Location::Memory,
                segment_id: entry.segment_id,
                epoch: entry.epoch,
                segment_length: entry.certificate.segment_length,
            },
        ));
    }
    let storage_files: Vec<PathBuf> = survivors.iter().map(|(_, file)| file.clone()).collect();
    tokio::task::spawn_blocking(move || {
        replica_files::read_master_replicas(&storage_files, &listed, victim, method)
    })
    .await
    .map_err(|error| format!("reading the replicas: {error}"))?
}

/// Creates table `name` of one tablet and moves it onto `master` if it was placed elsewhere.
pub(crate) async fn create_table_on(
    client: &Client,
    name: &str,
    master: ServerId,
) -> Result<TableId, String> {
    let table = client
        .create_table(name, 1)
        .await
        .map_err(|error| format!("creating table {name}: {error}"))?;
    let owner = client
        .tablet_map(table)
        .await
        .map_err(|error| format!("tablet map of {name}: {error}"))?
        .first()
        .map(|tablet| tablet.owner);
    if owner != Some(master) {
        client
            .migrate_tablet(name, 0, master)
            .await
            .map_err(|error| format!("moving table {name} to master {master}: {error}"))?;
    }
    Ok(table)
}

/// What happened between the kill and the data being served again.
#[derive(Clone, Copy, Debug)]
struct KillToServed {
    killed_at_wall: SystemTime,
    killed_at: Instant,
    /// When a poll of the server list first showed the killed master crashed.
    crash_seen_at: Option<Instant>,
    kill_to_served: Duration,
    /// CPU time of every surviving process of the cluster (coordinator and servers) from the
    /// kill until the data was served again.
    cpu: Duration,
    /// How many processes that sums.
    cpu_processes: usize,
}

/// Kills `victim` with SIGKILL, then polls the coordinator until every tablet of `tables` is
/// normal on another master, then reads a sample of keys; fails after the recovery timeout or
/// if another process of the cluster exits.
async fn kill_and_wait_until_served(
    plan: &Plan,
    cluster: &mut LocalCluster,
    tables: Tables,
    victim: ServerId,
) -> Result<KillToServed, String> {
    let observer = client(&cluster.coordinator_address, Duration::from_secs(2));
    let survivors = std::iter::once(cluster.coordinator.id())
        .chain(
            cluster
                .servers
                .iter()
                .filter(|server| server.server_id != victim)
                .map(|server| server.process.id()),
        )
        .collect::<Vec<u32>>();
    let cpu = CpuMeter::start(survivors)?;
    let victim_process = &mut cluster
        .servers
        .iter_mut()
        .find(|server| server.server_id == victim)
        .ok_or_else(|| format!("master {victim} is not one of the servers started"))?
        .process;
    eprintln!("bench recovery: killing master {victim} (SIGKILL)");
    let killed_at_wall = SystemTime::now();
    let killed_at = Instant::now();
    victim_process.kill_now()?;
    let deadline = killed_at + plan.recovery_timeout;

    let mut crash_seen_at = None;
    loop {
        if let Some(exit) = cluster.unexpected_exit(victim) {
            return Err(format!("{exit} during the recovery"));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the data of master {victim} was not served again within {} s of the kill \
                 (crash declared: {})",
                plan.recovery_timeout.as_secs(),
                crash_seen_at.is_some()
            ));
        }
        if crash_seen_at.is_none() {
            let servers = observer.server_list().await.unwrap_or_default();
            // Removed follows crashed once the recovery is done: either means declared.
            if servers
                .iter()
                .any(|server| server.server_id == victim && server.status != ServerStatus::Up)
            {
                crash_seen_at = Some(Instant::now());
            }
        }
        let mut moved = true;
        for table in tables.all() {
            let tablets = observer.tablet_map(table).await.unwrap_or_default();
            moved &= !tablets.is_empty()
                && tablets
                    .iter()
                    .all(|tablet| tablet.state == TabletState::Normal && tablet.owner != victim);
        }
        if moved {
            break;
        }
        tokio::time::sleep(RECOVERY_POLL_INTERVAL).await;
    }
    read_sample(&cluster.coordinator_address, tables, plan, deadline).await?;
    let kill_to_served = killed_at.elapsed();
    Ok(KillToServed {
        killed_at_wall,
        killed_at,
        crash_seen_at,
        kill_to_served,
        cpu: cpu.elapsed()?,
        cpu_processes: cpu.processes(),
    })
}

/// How long after the kill the coordinator declared the crash, and how that was learnt: from
/// the timestamp of its log line (the coordinator's own clock, microseconds), or failing that
/// from the first poll of the server list that showed the master crashed (later by up to a
/// poll).
fn crash_decision(
    coordinator_log: &str,
    victim: ServerId,
    served: &KillToServed,
) -> Result<(Duration, &'static str), String> {
    let declared_in_log = crash_declaration_time(coordinator_log, victim)
        .and_then(|declared| declared.duration_since(served.killed_at_wall).ok());
    match (declared_in_log, served.crash_seen_at) {
        (Some(offset), _) => Ok((offset, "coordinator_log")),
        (None, Some(seen_at)) => Ok((seen_at - served.killed_at, "server_list_poll")),
        (None, None) => Err("the coordinator never declared the crash".into()),
    }
}

/// Writes every object with concurrent MULTI_WRITEs; every item must be acknowledged.
async fn load(client: &Client, tables: Tables, plan: &Plan) -> Result<(), String> {
    let next_batch = Arc::new(AtomicU64::new(0));
    let mut writers = tokio::task::JoinSet::<Result<(), String>>::new();
    for _ in 0..LOAD_REQUESTS_IN_FLIGHT {
        let client = client.clone();
        let next_batch = next_batch.clone();
        let plan = plan.clone();
        writers.spawn(async move {
            let objects = plan.objects;
            loop {
                let first = next_batch.fetch_add(1, Ordering::Relaxed) * LOAD_BATCH_OBJECTS;
                if first >= objects {
                    return Ok(());
                }
                let items: Vec<WriteItem> = (first..(first + LOAD_BATCH_OBJECTS).min(objects))
                    .map(|index| WriteItem {
                        table_id: tables.of(index),
                        key: Bytes::from(object_key(index)),
                        value: Bytes::from(object_value(index, plan.value_bytes(index))),
                        rules: RejectRules::NONE,
                        expiry: stratus_types::Expiry::Never,
                        rpc: None,
                    })
                    .collect();
                for outcome in client.multi_write(&items).await {
                    outcome.map_err(|error| format!("loading: {error}"))?;
                }
            }
        });
    }
    while let Some(joined) = writers.join_next().await {
        joined.map_err(|error| error.to_string())??;
    }
    Ok(())
}

/// Waits until the loaded master and every backup stop changing (the last replicas closed and
/// written, no cleaning), so the kill finds a settled log; bounded by [`IDLE_PATIENCE`].
async fn wait_until_idle(
    client: &Client,
    master_address: &str,
    cluster: &LocalCluster,
) -> Result<(), String> {
    let deadline = Instant::now() + IDLE_PATIENCE;
    let mut previous = None;
    let mut unchanged_polls = 0;
    while Instant::now() < deadline {
        let master = client
            .server_statistics(master_address)
            .await
            .map_err(|error| format!("master statistics: {error}"))?;
        let mut snapshot =
            vec![master.bytes_replicated, master.segments_cleaned, master.compactions];
        for server in &cluster.servers {
            let backup = client
                .backup_statistics(&server.address)
                .await
                .map_err(|error| format!("backup statistics: {error}"))?;
            snapshot.extend([backup.disk_write_jobs, backup.disk_data_bytes_written]);
        }
        if previous.as_ref() == Some(&snapshot) {
            unchanged_polls += 1;
            if unchanged_polls >= IDLE_POLLS {
                return Ok(());
            }
        } else {
            unchanged_polls = 0;
        }
        previous = Some(snapshot);
        tokio::time::sleep(IDLE_POLL_INTERVAL).await;
    }
    eprintln!(
        "NOTICE: the servers were still busy {} s after loading; killing anyway",
        IDLE_PATIENCE.as_secs()
    );
    Ok(())
}

/// Reads a sample of keys spread over the tables until every one comes back right, with a new
/// client (no cached tablet map), or fails at `deadline`.
async fn read_sample(
    coordinator: &str,
    tables: Tables,
    plan: &Plan,
    deadline: Instant,
) -> Result<(), String> {
    let samples = SAMPLE_KEYS.min(plan.objects);
    let indexes: Vec<u64> = (0..samples).map(|sample| sample * plan.objects / samples).collect();
    let items: Vec<KeyItem> = indexes
        .iter()
        .map(|&index| KeyItem {
            table_id: tables.of(index),
            key: Bytes::from(object_key(index)),
            rules: RejectRules::NONE,
        })
        .collect();
    let mut last_problem = String::new();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(format!(
                "the tablets moved, but a sample of keys was not served within the recovery \
                 timeout ({last_problem})"
            ));
        }
        let reader = client(coordinator, remaining);
        let outcomes = reader.multi_read(&items).await;
        let problem = indexes.iter().zip(&outcomes).find_map(|(&index, outcome)| match outcome {
            Ok((value, _)) if value[..] == object_value(index, plan.value_bytes(index))[..] => None,
            Ok(_) => Some(format!("key {index} has another value")),
            Err(error) => Some(format!("key {index}: {error}")),
        });
        match problem {
            None => return Ok(()),
            Some(problem) => last_problem = problem,
        }
        tokio::time::sleep(RECOVERY_POLL_INTERVAL).await;
    }
}

/// Reads every object back; returns how many are missing, hold another value, or cannot be
/// read (each acknowledged when it was loaded).
async fn count_lost(coordinator: &str, tables: Tables, plan: &Plan) -> Result<u64, String> {
    let reader = client(coordinator, Duration::from_secs(30));
    let next_batch = Arc::new(AtomicU64::new(0));
    let mut checkers = tokio::task::JoinSet::new();
    for _ in 0..VERIFY_REQUESTS_IN_FLIGHT {
        let reader = reader.clone();
        let next_batch = next_batch.clone();
        let plan = plan.clone();
        checkers.spawn(async move {
            let objects = plan.objects;
            let mut lost = 0u64;
            loop {
                let first = next_batch.fetch_add(1, Ordering::Relaxed) * VERIFY_BATCH_OBJECTS;
                if first >= objects {
                    return lost;
                }
                let indexes = first..(first + VERIFY_BATCH_OBJECTS).min(objects);
                let items: Vec<KeyItem> = indexes
                    .clone()
                    .map(|index| KeyItem {
                        table_id: tables.of(index),
                        key: Bytes::from(object_key(index)),
                        rules: RejectRules::NONE,
                    })
                    .collect();
                let outcomes = reader.multi_read(&items).await;
                for (index, outcome) in indexes.zip(outcomes) {
                    let intact = match &outcome {
                        Ok((value, _)) => {
                            value[..] == object_value(index, plan.value_bytes(index))[..]
                        }
                        Err(_) => false,
                    };
                    if !intact {
                        if lost < 5 {
                            let what = match outcome {
                                Ok(_) => "another value".to_string(),
                                Err(error) if error.status == Status::ObjectDoesntExist => {
                                    "missing".to_string()
                                }
                                Err(error) => format!("unreadable: {error}"),
                            };
                            eprintln!("LOST: object {index}: {what}");
                        }
                        lost += 1;
                    }
                }
            }
        });
    }
    let mut lost = 0;
    while let Some(joined) = checkers.join_next().await {
        lost += joined.map_err(|error| error.to_string())?;
    }
    Ok(lost)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Command {
        #[command(flatten)]
        arguments: RecoveryArguments,
    }

    fn plan_of(arguments: &[&str]) -> Result<Plan, String> {
        let command =
            Command::try_parse_from(std::iter::once("recovery").chain(arguments.iter().copied()))
                .map_err(|error| error.to_string())?;
        Plan::from_arguments(&command.arguments)
    }

    #[test]
    fn defaults_are_five_servers_a_gibibyte_three_replicas_and_kilobyte_objects() {
        let plan = plan_of(&[]).unwrap();
        assert_eq!((plan.servers, plan.replicas, plan.object_bytes), (5, 3, 1000));
        assert_eq!(plan.objects, (1024 << 20) / 1000);
        assert_eq!(plan.data_bytes, plan.objects * 1000);
        assert_eq!(plan.recovery_timeout, Duration::from_secs(300));
    }

    #[test]
    fn replicas_default_to_what_the_survivors_can_hold_in_small_clusters() {
        assert_eq!(plan_of(&["--servers", "3"]).unwrap().replicas, 1);
        assert_eq!(plan_of(&["--servers", "4"]).unwrap().replicas, 2);
        assert_eq!(plan_of(&["--servers", "5"]).unwrap().replicas, 3);
        assert_eq!(plan_of(&["--servers", "9"]).unwrap().replicas, 3);
    }

    #[test]
    fn impossible_configurations_are_refused() {
        for arguments in [
            &["--servers", "2"][..],
            &["--servers", "3", "--replicas", "2"],
            &["--servers", "4", "--replicas", "3"],
            &["--replicas", "0"],
            &["--data-mib", "0"],
            &["--object-bytes", "0"],
            &["--object-bytes", "2000000"],
            &["--segment-mib", "16"],
            &["--durability", "sometimes"],
            &["--recovery-timeout-seconds", "0"],
        ] {
            assert!(plan_of(arguments).is_err(), "{arguments:?} was accepted");
        }
    }

    #[test]
    fn logs_hold_the_data_with_headroom_and_backups_their_share() {
        let plan = plan_of(&["--servers", "5", "--data-mib", "128"]).unwrap();
        let live_bytes = plan.objects * (1000 + 21 + OBJECT_ENTRY_OVERHEAD_BYTES);
        let log_bytes = plan.log_mib << 20;
        assert!(live_bytes as f64 <= log_bytes as f64 * LIVE_FRACTION_OF_LOG_MAX);
        assert_eq!(plan.log_mib % 8, 0, "whole segments");
        assert!(plan.backup_frames >= stratus_backup::BackupConfig::FRAME_COUNT_DEFAULT);
        let large = plan_of(&["--servers", "3", "--replicas", "1", "--data-mib", "8192"]).unwrap();
        assert!(u64::from(large.backup_frames) * 8 >= 2 * 8192, "every replica has a frame");
        assert!(large.memory_needed_bytes() > plan.memory_needed_bytes());
    }

    #[test]
    fn memory_available_is_read_from_meminfo() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_memory_available_bytes(meminfo), Some(2048 * 1024));
        assert_eq!(parse_memory_available_bytes("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn values_differ_between_objects_and_keep_their_size() {
        assert_eq!(object_value(7, 1000).len(), 1000);
        assert_eq!(object_value(7, 3).len(), 3);
        assert_ne!(object_value(7, 1000), object_value(8, 1000));
        assert_ne!(object_value(7, 1000), object_value(7 + 251, 1000));
        assert_eq!(object_key(42), b"recovery-000000000042");
    }

    #[test]
    fn server_lines_name_the_id_and_address() {
        assert_eq!(
            parse_server_listening("server 4 listening on 127.0.0.1:40123"),
            Some((ServerId(4), "127.0.0.1:40123".to_string()))
        );
        assert_eq!(parse_server_listening("coordinator listening on 127.0.0.1:1"), None);
    }
}
