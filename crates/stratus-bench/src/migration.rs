//! `stratus bench migration`: how long clients' writes to a tablet wait while it moves to
//! another master. A tablet of 1 KB objects is migrated while one client overwrites its objects
//! back to back; the run reports the migration's duration and the latency of the writes made
//! during it. The reference is the same client's writes before the migration, in the same run;
//! `--cluster-binary` runs the cluster with another build (the client stays this one), so two
//! builds are compared on the same machine.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use stratus_client::{Client, ClientConfig};
use stratus_wire::ServerStatus;

use crate::cluster::start_local_cluster;
use crate::report::{latency_histogram, print_json, Field, Percentiles};

/// `stratus bench migration`.
#[derive(Debug, Args)]
pub struct MigrationArguments {
    /// Data in the migrated tablet, in MiB of 1 KB objects.
    #[arg(long, default_value_t = 64)]
    pub data_mib: u64,
    /// Storage servers in the cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Replicas of every segment.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// The `stratus` binary that runs the cluster (default: this one).
    #[arg(long)]
    pub cluster_binary: Option<PathBuf>,
}

const OBJECT_BYTES: usize = 1_000;
const TABLE: &str = "bench-migration";
/// Writers loading the tablet at once.
const LOADERS: u64 = 16;
/// How long the client writes before the migration (its reference) and after it.
const QUIET_PERIOD: Duration = Duration::from_millis(1_000);

/// One write the measuring client made: when it started and how long it took.
type Timed = (Instant, Duration);

/// Runs the benchmark.
pub fn run(arguments: MigrationArguments) -> Result<(), String> {
    if arguments.servers < 2 || arguments.replicas >= arguments.servers {
        return Err("the tablet needs a second master, and replicas fewer than servers".into());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let replicas = arguments.replicas.to_string();
    // Room for the tablet on both masters, with the cleaner's headroom.
    let log_mib = (arguments.data_mib * 3 + 256).to_string();
    let cluster = start_local_cluster(
        directory.path(),
        arguments.servers,
        &["--log-mib", &log_mib, "--replicas", &replicas],
        arguments.cluster_binary.as_deref(),
    )?;
    let coordinator = cluster.coordinator.clone();
    let objects = arguments.data_mib * 1_048_576 / OBJECT_BYTES as u64;
    let (migration, before, during) = runtime
        .block_on(measure(coordinator.clone(), objects))
        .map_err(|error| error.to_string())?;
    let reference = Percentiles::of(&histogram_of(&before));
    let moving = Percentiles::of(&histogram_of(&during));
    let longest = during.iter().map(|(_, latency)| *latency).max().unwrap_or_default();
    let migration_ms = migration.as_secs_f64() * 1e3;
    let longest_ms = longest.as_secs_f64() * 1e3;
    let writes_per_sec =
        |writes: &[Timed], over: Duration| writes.len() as f64 / over.as_secs_f64();
    println!(
        "{:>9} {:>9} {:>13} {:>9} {:>13} {:>13} {:>15} {:>16} {:>12}",
        "data_mb",
        "objects",
        "migration_ms",
        "writes",
        "write_p50_us",
        "write_p99_us",
        "longest_write_ms",
        "reference_p50_us",
        "longest/move"
    );
    println!(
        "{:>9.1} {objects:>9} {migration_ms:>13.0} {:>9} {:>13.1} {:>13.1} {longest_ms:>15.1} {:>16.1} {:>12.2}",
        (objects * OBJECT_BYTES as u64) as f64 / 1e6,
        during.len(),
        moving.p50_us,
        moving.p99_us,
        reference.p50_us,
        longest_ms / migration_ms
    );
    print_json(&[
        ("bench", Field::Text("migration".into())),
        ("servers", Field::Number(f64::from(arguments.servers))),
        ("replicas", Field::Number(f64::from(arguments.replicas))),
        ("data_bytes", Field::Number((objects * OBJECT_BYTES as u64) as f64)),
        ("objects", Field::Number(objects as f64)),
        ("migration_ms", Field::Number(migration_ms)),
        ("writes_during_migration", Field::Number(during.len() as f64)),
        ("writes_per_sec_during_migration", Field::Number(writes_per_sec(&during, migration))),
        ("writes_per_sec_before", Field::Number(writes_per_sec(&before, QUIET_PERIOD))),
        ("write_p50_us", Field::Number(moving.p50_us)),
        ("write_p99_us", Field::Number(moving.p99_us)),
        ("longest_write_ms", Field::Number(longest_ms)),
        ("reference_write_p50_us", Field::Number(reference.p50_us)),
        ("longest_write_over_migration", Field::Number(longest_ms / migration_ms)),
        (
            "cluster_binary",
            Field::Text(
                arguments
                    .cluster_binary
                    .as_ref()
                    .map_or("this one".to_string(), |binary| binary.display().to_string()),
            ),
        ),
    ]);
    Ok(())
}

fn histogram_of(writes: &[Timed]) -> hdrhistogram::Histogram<u64> {
    let mut histogram = latency_histogram();
    for (_, latency) in writes {
        histogram.saturating_record((latency.as_nanos() as u64).max(1));
    }
    histogram
}

/// Loads the tablet, then migrates it while a client overwrites its objects; returns the
/// migration's duration, and the client's writes before and during it.
async fn measure(
    coordinator: String,
    objects: u64,
) -> stratus_client::Result<(Duration, Vec<Timed>, Vec<Timed>)> {
    let client = Client::new(ClientConfig::new(coordinator.clone()));
    let table = client.create_table(TABLE, 1).await?;
    let mut loaders = tokio::task::JoinSet::new();
    for loader in 0..LOADERS {
        let client = client.clone();
        loaders.spawn(async move {
            let value = vec![0x4d_u8; OBJECT_BYTES];
            for index in (loader..objects).step_by(LOADERS as usize) {
                client.write(table, format!("object-{index}").as_bytes(), &value).await?;
            }
            stratus_client::Result::Ok(())
        });
    }
    while let Some(loaded) = loaders.join_next().await {
        loaded.expect("a loader panicked")?;
    }
    let source = client.tablet_map(table).await?[0].owner;
    let target = client
        .server_list()
        .await?
        .into_iter()
        .find(|server| {
            server.status == ServerStatus::Up
                && server.services.has_master()
                && server.server_id != source
        })
        .expect("a second master")
        .server_id;

    // Its own client, which finds the tablet's new master as any other client would.
    let writer = Client::new(ClientConfig::new(coordinator));
    let stop = Arc::new(AtomicBool::new(false));
    let writing = tokio::spawn({
        let stop = stop.clone();
        async move {
            let value = vec![0x77_u8; OBJECT_BYTES];
            let mut timed: Vec<Timed> = Vec::new();
            let mut index = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Spread over the tablet, so a write meets every part of the copy.
                index = (index + 7_919) % objects;
                let started = Instant::now();
                writer.write(table, format!("object-{index}").as_bytes(), &value).await?;
                timed.push((started, started.elapsed()));
            }
            stratus_client::Result::Ok(timed)
        }
    });
    tokio::time::sleep(QUIET_PERIOD).await;
    let migration_started = Instant::now();
    client.migrate_tablet(TABLE, 0, target).await?;
    let migration = migration_started.elapsed();
    tokio::time::sleep(QUIET_PERIOD).await;
    stop.store(true, Ordering::Relaxed);
    let timed = writing.await.expect("the writer panicked")?;
    let before = timed.iter().copied().filter(|(started, _)| *started < migration_started);
    let migration_ended = migration_started + migration;
    let during = timed
        .iter()
        .copied()
        .filter(|(started, _)| *started >= migration_started && *started < migration_ended);
    Ok((migration, before.collect(), during.collect()))
}
