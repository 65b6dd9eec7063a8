//! `stratus bench ycsb`: YCSB's core workloads A–F, driven by one driver against Stratus,
//! Redis and memcached, each started here with a documented configuration.
//!
//! The generators reproduce YCSB's `CoreWorkload` (brianfrankcooper/YCSB): keys are
//! `"user" + fnvhash64(keynum)` (insertorder=hashed), requests follow the
//! `ScrambledZipfianGenerator` (θ = 0.99 over 10^10 ranks, precomputed ζ = 26.46902820178302,
//! folded onto the key space with FNV-64) or, for workload D, the `SkewedLatestGenerator` over
//! an acknowledged insert counter. Records are 10 fields of 100 printable bytes; a read reads
//! all fields, an update writes one uniformly chosen field. See docs/ycsb.md for the mapping of
//! records and operations onto each system.
//!
//! Every row also says what its phase cost in CPU (`crate::cpu`): the user and system time of
//! every process of the system under test, and of the driver (this process), per operation.

mod bindings;
pub(crate) mod driver;
pub(crate) mod generators;
pub(crate) mod measure;
pub(crate) mod systems;

use clap::Args;

use crate::report::{print_json, Field};
use bindings::{MEMCACHED_NO_SCAN, STRATUS_NO_SCAN};
use driver::{load, run_phase};
use generators::Workload;
use measure::{report_phase, RunLabel};
use systems::{configurations, start, Configuration};

/// `stratus bench ycsb`.
#[derive(Debug, Args)]
pub struct YcsbArguments {
    /// The core workload: a, b, c, d, e or f.
    #[arg(long, default_value = "a", value_parser = ["a", "b", "c", "d", "e", "f"])]
    pub workload: String,
    /// Systems to measure, comma-separated: stratus, redis, memcached.
    #[arg(long, default_value = "stratus,redis,memcached", value_delimiter = ',')]
    pub systems: Vec<String>,
    /// Only these configurations (comma-separated; default all but the `+tls` ones): stratus
    /// r0, r3-buffered, r3-buffered-eo-off (its clients without exactly-once), r3-fsync; redis
    /// everysec, always, wait-3 (a primary and 3 replicas, every write followed by WAIT 3 0);
    /// memcached default; and over TLS (one local CA for both systems): stratus r0+tls,
    /// r3-buffered+tls, redis everysec+tls, wait-3+tls.
    #[arg(long, value_delimiter = ',')]
    pub configs: Vec<String>,
    /// Records loaded before the run (YCSB recordcount).
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Operations of the run phase (YCSB operationcount).
    #[arg(long, default_value_t = 50_000)]
    pub operations: u64,
    /// Client threads, each with its own connection (YCSB -threads).
    #[arg(long, default_value_t = 4)]
    pub threads: u32,
    /// Target throughput of the run phase in operations per second (YCSB -target); also
    /// reports the coordinated-omission-corrected latency from each operation's intended
    /// start time.
    #[arg(long)]
    pub target: Option<f64>,
    /// Storage servers of the Stratus cluster (R = 3 needs at least 4).
    #[arg(long, default_value_t = 4)]
    pub stratus_servers: u32,
    /// Log memory of each Stratus server in MiB (the records, about 1.1 KB each in the log,
    /// are spread over all servers; with R = 3 each server also holds replicas in its backup's
    /// buffers, not in this log).
    #[arg(long, default_value_t = 256)]
    pub stratus_log_mib: u64,
}

impl YcsbArguments {
    /// The driver's arguments for a benchmark that starts its own cluster and table and runs
    /// the driver on it (`bench flash`, `bench tiering`): the workload, systems and cluster
    /// shape are then the caller's, and unused here.
    pub fn for_table(records: u64, operations: u64, threads: u32, log_mib: u64) -> YcsbArguments {
        YcsbArguments {
            workload: "a".into(),
            systems: Vec::new(),
            configs: Vec::new(),
            records,
            operations,
            threads: threads.max(1),
            target: None,
            stratus_servers: 1,
            stratus_log_mib: log_mib,
        }
    }
}

/// Runs the benchmark.
pub fn run(arguments: YcsbArguments) -> Result<(), String> {
    let name = arguments.workload.chars().next().unwrap_or('a');
    let workload = Workload::core(name).ok_or_else(|| format!("unknown workload {name:?}"))?;
    if arguments.records == 0 || arguments.threads == 0 {
        return Err("--records and --threads must be at least 1".into());
    }
    if let Some(target) = arguments.target {
        if !(target > 0.0 && target.is_finite()) {
            return Err("--target must be a positive number of operations per second".into());
        }
    }
    let mut selected = Vec::new();
    for system in &arguments.systems {
        for configuration in configurations(system.trim())? {
            let named = arguments.configs.iter().any(|name| name == configuration.name);
            if named || (arguments.configs.is_empty() && !configuration.tls()) {
                selected.push(configuration);
            }
        }
    }
    if selected.is_empty() {
        return Err("no configuration selected (see --systems and --configs)".into());
    }
    for configuration in &selected {
        if workload.scan > 0.0 && configuration.system != "redis" {
            report_skipped(workload, configuration);
            continue;
        }
        measure(configuration, &arguments, workload)
            .map_err(|error| format!("{} {}: {error}", configuration.system, configuration.name))?;
    }
    Ok(())
}

/// Workload E on a system without an ordered scan: says so, in text and as a row.
fn report_skipped(workload: Workload, configuration: &Configuration) {
    let why = if configuration.system == "stratus" { STRATUS_NO_SCAN } else { MEMCACHED_NO_SCAN };
    println!(
        "# ycsb skipped workload=e system={} config={}: {why}",
        configuration.system, configuration.name
    );
    print_json(&[
        ("bench", Field::Text("ycsb".into())),
        ("workload", Field::Text(workload.name.to_string())),
        ("system", Field::Text(configuration.system.into())),
        ("config", Field::Text(configuration.name.into())),
        ("skipped", Field::Text(why.into())),
    ]);
}

/// Starts one configuration fresh, loads it, runs the workload, reports both phases, and
/// stops it.
fn measure(
    configuration: &Configuration,
    arguments: &YcsbArguments,
    workload: Workload,
) -> Result<(), String> {
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let tls = if configuration.tls() { Some(crate::tls::BenchTls::create()?) } else { None };
    let running = start(configuration, arguments, directory.path(), tls.as_ref())?;
    let mut label = RunLabel {
        phase: "load",
        workload: workload.name,
        system: configuration.system,
        config: configuration.name,
        threads: arguments.threads,
        records: arguments.records,
        target: arguments.target,
    };
    let loaded = load(&running, arguments).map_err(|error| format!("load: {error}"))?;
    report_phase(&label, &loaded);
    let ran = run_phase(&running, arguments, workload).map_err(|error| format!("run: {error}"))?;
    label.phase = "run";
    report_phase(&label, &ran);
    Ok(())
}
