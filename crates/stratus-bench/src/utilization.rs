//! `stratus bench utilization`: write throughput of the storage engine as its memory fills
//! with live data (FAST'14 Figure 6, dissertation Figure 8.1), with the cleaner running on its
//! own thread, and how many bytes the cleaner moves per byte written.
//!
//! The engine is measured in-process (no network): a writer overwrites objects of one size
//! chosen uniformly or with a hot set (90 % of writes to 15 % of the objects) while the live
//! data is held at a given fraction of the log. Each configuration first writes every object
//! once, then overwrites for `passes` times the log size. "levels" = 1 is combined cleaning
//! only (the memory-only mode); 2 is two-level cleaning (compaction first), which is what a
//! replicated server runs. The reference is the same engine at 30 % utilization in the same
//! run: the goal is that 90 % keeps at least 0.7 of that throughput.
//!
//! With `--replicas N` the same workload runs against a local cluster of N + 1 servers through
//! the network (batched writes from several clients), and the cleaner column is the bytes the
//! cleaner sent to backups per byte of new data sent to them: what two-level cleaning exists
//! to save.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use stratus_env::SplitMix64;
use stratus_store::{CleanOutcome, ObjectError, ObjectStore, StoreConfig};
use stratus_types::{key_hash, RejectRules, ServerId, TableId};

use crate::report::{print_json, Field};

/// `stratus bench utilization`.
#[derive(Debug, Args)]
pub struct UtilizationArguments {
    /// Object (value) sizes in bytes, comma-separated.
    #[arg(long, default_value = "100,1000,10000", value_delimiter = ',')]
    pub object_bytes: Vec<usize>,
    /// Live data as a percentage of the log, comma-separated.
    #[arg(long, default_value = "30,50,70,80,90", value_delimiter = ',')]
    pub utilization: Vec<u32>,
    /// Distributions: uniform, hot (90 % of writes to 15 % of objects).
    #[arg(long, default_value = "uniform,hot", value_delimiter = ',')]
    pub distribution: Vec<String>,
    /// Cleaning levels: 1 (combined only) and/or 2 (compaction, then combined).
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    pub levels: Vec<u32>,
    /// Log size in MiB.
    #[arg(long, default_value_t = 128)]
    pub log_mib: u64,
    /// Segment size in MiB. The log keeps about three segments in reserve (removes, the
    /// cleaner), so segments must be small against the log for 90 % to be admissible.
    #[arg(long, default_value_t = 1)]
    pub segment_mib: u32,
    /// Seglet size in KiB. A pass must free more seglets than its survivors and commit head
    /// take, so seglets must be small against segments (RAMCloud: 64 KiB of 8 MiB).
    #[arg(long, default_value_t = 16)]
    pub seglet_kib: u32,
    /// Replicas. 0 measures the engine in-process; more runs a local cluster of replicas + 1
    /// servers and writes through the network, and adds the cleaner's backup traffic.
    #[arg(long, default_value_t = 0)]
    pub replicas: u32,
    /// Overwrite volume, as a multiple of the log size.
    #[arg(long, default_value_t = 2)]
    pub passes: u64,
}

/// Runs the engine's cleaner on a thread of its own, as a server does, until `stop` is set.
pub(crate) fn spawn_cleaner(
    store: Arc<ObjectStore>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if matches!(
                store.clean_once(stratus_store::WallTime::from_seconds(0)),
                CleanOutcome::Idle | CleanOutcome::NothingToClean
            ) {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    })
}

/// Runs the benchmark.
pub fn run(arguments: UtilizationArguments) -> Result<(), String> {
    println!(
        "{:>11} {:>12} {:>11} {:>6} {:>8} {:>12} {:>26} {:>20}",
        "object_size",
        "distribution",
        "utilization",
        "levels",
        "replicas",
        "ops_per_sec",
        "cleaner_bytes_per_new_byte",
        "vs_first_utilization"
    );
    for &object_bytes in &arguments.object_bytes {
        for distribution in &arguments.distribution {
            if distribution != "uniform" && distribution != "hot" {
                return Err(format!("unknown distribution {distribution:?} (uniform or hot)"));
            }
            for &levels in &arguments.levels {
                if levels != 1 && levels != 2 {
                    return Err(format!("levels must be 1 or 2, not {levels}"));
                }
                let mut reference = None;
                for &utilization in &arguments.utilization {
                    let (ops_per_sec, cleaner_ratio) = if arguments.replicas == 0 {
                        measure(&arguments, object_bytes, distribution, utilization, levels)?
                    } else {
                        measure_cluster(
                            &arguments,
                            object_bytes,
                            distribution,
                            utilization,
                            levels,
                        )?
                    };
                    let reference = *reference.get_or_insert(ops_per_sec);
                    let relative = ops_per_sec / reference;
                    println!(
                        "{object_bytes:>11} {distribution:>12} {utilization:>11} {levels:>6} {:>8} {ops_per_sec:>12.0} {cleaner_ratio:>26.2} {relative:>20.2}",
                        arguments.replicas
                    );
                    print_json(&[
                        ("bench", Field::Text("utilization".into())),
                        ("object_size", Field::Number(object_bytes as f64)),
                        ("distribution", Field::Text(distribution.clone())),
                        ("utilization", Field::Number(f64::from(utilization))),
                        ("levels", Field::Number(f64::from(levels))),
                        ("replicas", Field::Number(f64::from(arguments.replicas))),
                        ("ops_per_sec", Field::Number(ops_per_sec)),
                        ("cleaner_bytes_per_new_byte", Field::Number(cleaner_ratio)),
                        // In-process: bytes the cleaner moved in memory. With replicas: bytes
                        // the cleaner sent to backups (survivor segments, every copy).
                        (
                            "cleaner_bytes_measured",
                            Field::Text(
                                if arguments.replicas == 0 { "memory" } else { "backup" }.into(),
                            ),
                        ),
                        ("relative_to_first_utilization", Field::Number(relative)),
                    ]);
                }
            }
        }
    }
    Ok(())
}

/// One configuration: (writes per second, cleaner bytes moved per byte written).
fn measure(
    arguments: &UtilizationArguments,
    object_bytes: usize,
    distribution: &str,
    utilization: u32,
    levels: u32,
) -> Result<(f64, f64), String> {
    let log_bytes = arguments.log_mib << 20;
    let mut config = StoreConfig::with_log_bytes(log_bytes);
    config.segment_bytes = arguments.segment_mib << 20;
    config.seglet_bytes = arguments.seglet_kib << 10;
    config.value_bytes_max = (config.segment_bytes / 8).max(object_bytes as u32);
    // Two-level cleaning is what the engine does when it has replicas to save bandwidth on;
    // the benchmark has no backups, so only the policy changes.
    config.cleaner.replicas = if levels == 2 { 3 } else { 0 };
    config.validate().map_err(|error| error.to_string())?;
    let store = Arc::new(ObjectStore::new(config, ServerId(1)).map_err(|error| error.to_string())?);
    let table = TableId(1);
    let entry_bytes = object_bytes as u64 + 40; // key, object header and entry header
    let objects = (log_bytes * u64::from(utilization) / 100 / entry_bytes).max(1);
    let value = vec![0x5a_u8; object_bytes];
    let key_of = |index: u64| format!("object-{index:012}");

    let stop = Arc::new(AtomicBool::new(false));
    let cleaner = spawn_cleaner(store.clone(), stop.clone());
    let write = |index: u64| -> Result<(), String> {
        let key = key_of(index);
        let hash = key_hash(table, key.as_bytes());
        // LogFull means the cleaner is behind: the writer waits for it, as a client retrying
        // RETRY would. Bounded: 10 s of waiting per write at most.
        for _attempt in 0..100_000 {
            match store.write(
                table,
                key.as_bytes(),
                hash,
                &value,
                &RejectRules::NONE,
                stratus_store::Expiry::Never,
                stratus_store::WallTime::from_seconds(0),
            ) {
                Ok(_) => return Ok(()),
                Err(ObjectError::LogFull) => {
                    std::thread::sleep(std::time::Duration::from_micros(100))
                }
                Err(error) => return Err(format!("write: {error:?}")),
            }
        }
        let odd: Vec<_> = store
            .segment_statistics()
            .into_iter()
            .filter(|(_, statistics)| statistics.entry_count[2] < 900)
            .take(4)
            .collect();
        Err(format!(
            "the log stayed full at {utilization} % utilization: {:?} {odd:?}",
            store.statistics()
        ))
    };
    let outcome = (|| {
        for index in 0..objects {
            write(index)?;
        }
        let before = store.statistics().cleaner;
        let mut random = SplitMix64::new(0x5eed ^ object_bytes as u64 ^ u64::from(utilization));
        let hot_objects = (objects * 15 / 100).max(1);
        let writes = (arguments.passes * log_bytes / entry_bytes).max(1);
        let started = Instant::now();
        for _ in 0..writes {
            let index = if distribution == "hot" && random.below(100) < 90 {
                random.below(hot_objects)
            } else {
                random.below(objects)
            };
            write(index)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = store.statistics().cleaner;
        let moved = (after.object_bytes_relocated - before.object_bytes_relocated)
            + (after.tombstone_bytes_relocated - before.tombstone_bytes_relocated)
            + (after.bytes_compacted - before.bytes_compacted);
        let written = writes * entry_bytes;
        Ok::<_, String>((writes as f64 / seconds, moved as f64 / written as f64))
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = cleaner.join();
    outcome
}

/// Writes per batch (one MULTI_WRITE) of the cluster mode's stress clients.
const CLUSTER_BATCH_OBJECTS: u64 = 32;
/// Concurrent stress clients of the cluster mode.
const CLUSTER_CLIENTS: u64 = 4;

/// One configuration on a local cluster with replication: (writes per second, bytes the
/// cleaner sent to backups per byte of new data sent to backups). Both sides count every copy,
/// so the ratio is per new byte. The overwrite volume is the same as the in-process mode's.
fn measure_cluster(
    arguments: &UtilizationArguments,
    object_bytes: usize,
    distribution: &str,
    utilization: u32,
    levels: u32,
) -> Result<(f64, f64), String> {
    use stratus_client::{Client, ClientConfig, WriteItem};
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let replicas = arguments.replicas.to_string();
    let log_mib = arguments.log_mib.to_string();
    let segment_mib = arguments.segment_mib.to_string();
    let seglet_kib = arguments.seglet_kib.to_string();
    let levels_text = levels.to_string();
    let cluster = crate::cluster::start_local_cluster(
        directory.path(),
        arguments.replicas + 1,
        &[
            "--replicas",
            &replicas,
            "--log-mib",
            &log_mib,
            "--segment-mib",
            &segment_mib,
            "--seglet-kib",
            &seglet_kib,
            "--cleaner-levels",
            &levels_text,
            "--backup-frames",
            "4096",
        ],
        None,
    )?;
    let coordinator = cluster.coordinator.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    runtime.block_on(async {
        let mut config = ClientConfig::new(coordinator.clone());
        config.operation_timeout = std::time::Duration::from_secs(60);
        let client = Client::new(config);
        let table = client.create_table("bench-utilization", 1).await.map_err(|e| e.to_string())?;
        let master =
            client.tablet_map(table).await.map_err(|e| e.to_string())?[0].owner_address.clone();
        let log_bytes = arguments.log_mib << 20;
        let entry_bytes = object_bytes as u64 + 40;
        let objects = (log_bytes * u64::from(utilization) / 100 / entry_bytes).max(1);
        let value = bytes::Bytes::from(vec![0x5a_u8; object_bytes]);
        let item = |index: u64| WriteItem {
            table_id: table,
            key: bytes::Bytes::from(format!("object-{index:012}")),
            value: value.clone(),
            rules: RejectRules::NONE,
            expiry: stratus_types::Expiry::Never,
        };
        let write_batch = |indexes: Vec<u64>| {
            let client = client.clone();
            let items: Vec<WriteItem> = indexes.into_iter().map(item).collect();
            async move {
                for outcome in client.multi_write(&items).await {
                    outcome.map_err(|error| format!("write: {error}"))?;
                }
                Ok::<(), String>(())
            }
        };
        let indexes: Vec<u64> = (0..objects).collect();
        for chunk in indexes.chunks(CLUSTER_BATCH_OBJECTS as usize) {
            write_batch(chunk.to_vec()).await?;
        }
        let before = client.server_statistics(&master).await.map_err(|e| e.to_string())?;
        let writes = (arguments.passes * log_bytes / entry_bytes).max(1);
        let batches_per_client = writes / CLUSTER_BATCH_OBJECTS / CLUSTER_CLIENTS + 1;
        let hot_objects = (objects * 15 / 100).max(1);
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for client_index in 0..CLUSTER_CLIENTS {
            let mut random = SplitMix64::new(0x5eed ^ client_index ^ u64::from(utilization) << 8);
            let hot = distribution == "hot";
            let batches: Vec<Vec<u64>> = (0..batches_per_client)
                .map(|_| {
                    (0..CLUSTER_BATCH_OBJECTS)
                        .map(|_| {
                            if hot && random.below(100) < 90 {
                                random.below(hot_objects)
                            } else {
                                random.below(objects)
                            }
                        })
                        .collect()
                })
                .collect();
            let futures: Vec<_> = batches.into_iter().map(&write_batch).collect();
            tasks.spawn(async move {
                for future in futures {
                    future.await?;
                }
                Ok::<(), String>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|error| error.to_string())??;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = client.server_statistics(&master).await.map_err(|e| e.to_string())?;
        let cleaner = after.cleaner_bytes_replicated - before.cleaner_bytes_replicated;
        let total = after.bytes_replicated - before.bytes_replicated;
        let new_data = total.saturating_sub(cleaner).max(1);
        let written = batches_per_client * CLUSTER_BATCH_OBJECTS * CLUSTER_CLIENTS;
        Ok((written as f64 / seconds, cleaner as f64 / new_data as f64))
    })
}
