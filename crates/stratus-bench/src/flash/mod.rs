//! `stratus bench flash`: the flash tier (docs/design/flash-tier.md) against the raw file
//! system it writes to, measured in the same run and directory, on clusters of real server
//! processes (`stratus up`, metrics on, so the servers' own figures are read):
//!
//! 1. `write`: 1 KB objects per second and MB/s into a flash table, R = 0 and R = 3, from the
//!    first write until the master's metrics count every object demoted (the head segment is
//!    closed by a memory table's writes, since the head is never demoted), against a
//!    sequential write of a file of the same size (1 MiB blocks, O_DIRECT where accepted,
//!    fdatasync at the end); and what the flash tier itself wrote (image bytes per second).
//! 2. `read`: with every object demoted, p50/p99 of one outstanding read and throughput of 32
//!    (32 threads, a blocking client each), against 4 KiB random `pread`s of the raw file at
//!    the same depths, with the same page-cache treatment as the images (O_DIRECT where the
//!    file system accepts it); a read of a memory table's object on the same master is the
//!    RPC reference.
//! 3. `dram`: memory per flash-resident object after demotion, for 100 B and 1 KB values: the
//!    log's live bytes that are neither objects in memory nor tombstones (the FLASH_OBJECT
//!    entries), plus the hash table's bytes per object.
//! 4. `ycsb`: YCSB A, B and C (the `bench ycsb` driver) on a flash table four times the log
//!    memory and on a memory table of a quarter of it, on the same server: the throughput ratio, and
//!    throughput per dollar with DRAM at 23 times flash's $/GB.
//! 5. `cleaning`: overwrites of a flash table whose live data is 80 % of the flash budget,
//!    against as many new writes into an empty tier (writes per second to the last answer and
//!    until on flash); a tier that stops admitting writes (one refused for 30 s) is reported as
//!    stalled, with how many writes it answered and what its cleaner did.
//!
//! Every row has the CPU per operation of the cluster's processes (`crate::cpu`).

mod cleaning;
mod load;
mod raw;
mod rows;
pub(crate) mod server;
mod ycsb_rows;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use stratus_client::{Client, ClientConfig};

use crate::cluster::{start_local_cluster_with_metrics, ChildProcess, MetricsCluster, UpCluster};
use crate::cpu::process_tree;

/// `stratus bench flash`.
#[derive(Debug, Args)]
pub struct FlashArguments {
    /// Rows to measure, comma-separated: write, read, dram, ycsb, cleaning (`read` runs on
    /// the R = 0 cluster of `write` and needs R = 0 among --replicas).
    #[arg(long, default_value = "write,read,dram,ycsb,cleaning", value_delimiter = ',')]
    pub rows: Vec<String>,
    /// Objects written by the write row (and read by the read row): 400 MB of 1 KiB values
    /// by default, six times the log, so the writes run at what demotion sustains.
    #[arg(long, default_value_t = 400_000)]
    pub objects: u64,
    /// Value size of the write and read rows, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// Replica counts of the write row, comma-separated (R = 3 runs 4 servers).
    #[arg(long, default_value = "0,3", value_delimiter = ',')]
    pub replicas: Vec<u32>,
    /// Log memory of each server, in MiB.
    #[arg(long, default_value_t = 64)]
    pub log_mib: u64,
    /// Segment size, in MiB (one image per segment).
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u64,
    /// Flash budget of each server, in GiB (the servers' --flash-gib).
    #[arg(long, default_value_t = 4)]
    pub flash_gib: u64,
    /// Reads measured at each depth (flash and raw).
    #[arg(long, default_value_t = 20_000)]
    pub reads: u64,
    /// Outstanding reads of the throughput measurement (threads, each one read at a time).
    #[arg(long, default_value_t = 32)]
    pub depth: usize,
    /// Value sizes of the DRAM row, comma-separated.
    #[arg(long, default_value = "100,1024", value_delimiter = ',')]
    pub dram_value_bytes: Vec<usize>,
    /// Objects of each DRAM row.
    #[arg(long, default_value_t = 100_000)]
    pub dram_objects: u64,
    /// Log memory of the cleaning row's servers, in MiB (their DRAM holds an entry per live
    /// flash object: about 60 bytes each, 50 MB at 80 % of 1 GiB).
    #[arg(long, default_value_t = 256)]
    pub cleaning_log_mib: u64,
    /// Flash budget of the cleaning row's servers, in GiB.
    #[arg(long, default_value_t = 1)]
    pub cleaning_flash_gib: u64,
    /// Writes measured by the cleaning row, at each utilization (0: half the flash budget's
    /// worth, more than the 20 % left free, so the full tier is cleaned).
    #[arg(long, default_value_t = 0)]
    pub cleaning_writes: u64,
    /// Live data of the cleaning row's full tier, in percent of the flash budget.
    #[arg(long, default_value_t = 80)]
    pub cleaning_utilization_percent: u32,
    /// YCSB workloads, comma-separated (a, b, c).
    #[arg(long, default_value = "a,b,c", value_delimiter = ',')]
    pub ycsb_workloads: Vec<String>,
    /// Log memory of the YCSB server, in MiB.
    #[arg(long, default_value_t = 64)]
    pub ycsb_log_mib: u64,
    /// Records of the YCSB flash table (0: four times the log memory, at 1.1 KB a record in
    /// the log).
    #[arg(long, default_value_t = 0)]
    pub ycsb_flash_records: u64,
    /// Records of the YCSB memory table (0: a quarter of the log memory, at 1.1 KB a record).
    #[arg(long, default_value_t = 0)]
    pub ycsb_memory_records: u64,
    /// Operations of each YCSB run phase, per table.
    #[arg(long, default_value_t = 20_000)]
    pub ycsb_operations: u64,
    /// YCSB driver threads.
    #[arg(long, default_value_t = 4)]
    pub ycsb_threads: u32,
}

/// Runs the benchmark.
pub fn run(arguments: FlashArguments) -> Result<(), String> {
    for row in &arguments.rows {
        if !["write", "read", "dram", "ycsb", "cleaning"].contains(&row.trim()) {
            return Err(format!("unknown row {row:?} (write, read, dram, ycsb, cleaning)"));
        }
    }
    let wants = |row: &str| arguments.rows.iter().any(|named| named.trim() == row);
    if wants("read") && !arguments.replicas.contains(&0) {
        return Err("the read row runs on the R = 0 write cluster: add 0 to --replicas".into());
    }
    if arguments.objects == 0 || arguments.value_bytes <= 8 || arguments.reads == 0 {
        return Err("--objects and --reads must be positive, --value-bytes above 8".into());
    }
    rows::print_header();
    // The read row needs the R = 0 write row's objects: without `write`, only that one runs.
    let write_replicas: &[u32] = match (wants("write"), wants("read")) {
        (true, _) => &arguments.replicas,
        (false, true) => &[0],
        (false, false) => &[],
    };
    for &replicas in write_replicas {
        rows::write_and_read(&arguments, replicas, wants("read") && replicas == 0)?;
    }
    if wants("dram") {
        for &value_bytes in &arguments.dram_value_bytes {
            rows::dram(&arguments, value_bytes)?;
        }
    }
    if wants("ycsb") {
        ycsb_rows::run(&arguments)?;
    }
    if wants("cleaning") {
        cleaning::run(&arguments)?;
    }
    Ok(())
}

/// A `stratus up` cluster with its metrics, a client, and its processes (`bench tiering` runs
/// its servers as these too).
pub(crate) struct FlashCluster {
    /// `stratus up` (stopped once the last holder drops it: the YCSB rows share it).
    pub(crate) process: Arc<ChildProcess>,
    pub(crate) coordinator: String,
    /// Each server's metrics address.
    server_metrics: Vec<String>,
    /// Dropped before its runtime.
    pub(crate) client: Client,
    pub(crate) runtime: tokio::runtime::Runtime,
    /// `stratus up` and all its descendants, for their CPU time.
    processes: Vec<u32>,
    segment_bytes: u64,
    servers: u32,
    /// The cluster's data and logs, the flash directories and the raw file (removed on drop,
    /// after the cluster, which is declared before it).
    directory: tempfile::TempDir,
}

/// The servers of a [`FlashCluster`]: how many, and each one's memory and flash.
pub(crate) struct ClusterShape {
    pub(crate) servers: u32,
    pub(crate) replicas: u32,
    pub(crate) log_mib: u64,
    pub(crate) segment_mib: u64,
    pub(crate) flash_gib: u64,
    /// The servers' DRAM budget for auto tables (`--auto-dram-mib`; default: half the log).
    pub(crate) auto_dram_mib: Option<u64>,
}

impl FlashCluster {
    /// `servers` servers with `replicas` replicas, `log_mib` of log and `flash_gib` of flash
    /// each.
    fn start(
        arguments: &FlashArguments,
        servers: u32,
        replicas: u32,
        log_mib: u64,
        flash_gib: u64,
    ) -> Result<FlashCluster, String> {
        let segment_mib = arguments.segment_mib;
        let shape = ClusterShape {
            servers,
            replicas,
            log_mib,
            segment_mib,
            flash_gib,
            auto_dram_mib: None,
        };
        FlashCluster::start_with(&shape)
    }

    /// A cluster of `shape`.
    pub(crate) fn start_with(shape: &ClusterShape) -> Result<FlashCluster, String> {
        let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
        let (log, segment, replicas_text) =
            (shape.log_mib.to_string(), shape.segment_mib.to_string(), shape.replicas.to_string());
        let flags = ["--log-mib", &log, "--segment-mib", &segment, "--replicas", &replicas_text];
        // Info lines without colour: the bench reads the server's flash I/O mode from its log
        // (what servers log when STRATUS_LOG is unset; a test's environment may lower it).
        let mut environment = vec![
            ("STRATUS_FLASH_GIB", shape.flash_gib.to_string()),
            ("STRATUS_LOG", "info".to_string()),
            ("NO_COLOR", "1".to_string()),
        ];
        if let Some(auto_dram_mib) = shape.auto_dram_mib {
            environment.push(("STRATUS_AUTO_DRAM_MIB", auto_dram_mib.to_string()));
        }
        let environment: Vec<(&str, &str)> =
            environment.iter().map(|(name, value)| (*name, value.as_str())).collect();
        let MetricsCluster { cluster: UpCluster { process, coordinator, .. }, server_metrics } =
            start_local_cluster_with_metrics(
                directory.path(),
                shape.servers,
                &flags,
                &environment,
            )?;
        let processes = process_tree(process.id())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|error| error.to_string())?;
        let client = {
            let _entered = runtime.enter();
            Client::new(client_config(&coordinator))
        };
        Ok(FlashCluster {
            process: Arc::new(process),
            coordinator,
            server_metrics,
            client,
            runtime,
            processes,
            segment_bytes: shape.segment_mib << 20,
            servers: shape.servers,
            directory,
        })
    }

    fn path(&self) -> &Path {
        self.directory.path()
    }

    pub(crate) fn server_metrics(&self) -> &[String] {
        &self.server_metrics
    }

    fn coordinator(&self) -> &str {
        &self.coordinator
    }
}

/// A client without exactly-once (no completion records in the log, whose bytes would count
/// in the DRAM row) and patient, since writes wait for demotion when the log is full.
fn client_config(coordinator: &str) -> ClientConfig {
    let mut config = ClientConfig::new(coordinator.to_string());
    config.exactly_once = false;
    config.operation_timeout = Duration::from_secs(120);
    config
}
