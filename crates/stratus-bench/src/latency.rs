//! `stratus bench latency`: 100-byte write and read latency with 0, 1 and 3 replicas, in the
//! buffered and fsync durability modes, on a local cluster of storage servers. The read of the
//! same run is the reference: RAMCloud's goal is a replicated write within a small multiple of
//! a read (13.5 µs / 4.7 µs over Infiniband).

use std::time::Instant;

use clap::Args;
use stratus_client::{Client, ClientConfig};

use crate::cluster::start_local_cluster;
use crate::report::{latency_histogram, print_json, Field, Percentiles};

/// `stratus bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArguments {
    /// Replica counts to measure, comma-separated.
    #[arg(long, default_value = "0,1,3", value_delimiter = ',')]
    pub replicas: Vec<u32>,
    /// Durability modes to measure, comma-separated (buffered, fsync).
    #[arg(long, default_value = "buffered,fsync", value_delimiter = ',')]
    pub durability: Vec<String>,
    /// Storage servers in the cluster (at least replicas + 1).
    #[arg(long, default_value_t = 4)]
    pub servers: u32,
    /// Operations of each kind per configuration.
    #[arg(long, default_value_t = 10_000)]
    pub operations: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
}

const WARMUP_OPERATIONS: u64 = 300;

/// Runs the benchmark.
pub fn run(arguments: LatencyArguments) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    println!(
        "{:<6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "op", "replicas", "durability", "p50_us", "p99_us", "p999_us", "ops_per_sec"
    );
    for durability in &arguments.durability {
        if durability != "buffered" && durability != "fsync" {
            return Err(format!("unknown durability mode {durability:?} (buffered or fsync)"));
        }
        for &replicas in &arguments.replicas {
            if replicas == 0 && durability == "fsync" {
                // Nothing is written to disk without replicas: the row would repeat buffered.
                continue;
            }
            if replicas >= arguments.servers {
                return Err(format!("{replicas} replicas need at least {} servers", replicas + 1));
            }
            measure_configuration(&runtime, &arguments, replicas, durability)?;
        }
    }
    Ok(())
}

fn measure_configuration(
    runtime: &tokio::runtime::Runtime,
    arguments: &LatencyArguments,
    replicas: u32,
    durability: &str,
) -> Result<(), String> {
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let replicas_text = replicas.to_string();
    let cluster = start_local_cluster(
        directory.path(),
        arguments.servers,
        &["--log-mib", "128", "--replicas", &replicas_text, "--durability", durability],
        None,
    )?;
    let coordinator = cluster.coordinator.clone();
    let value = vec![0x5a_u8; arguments.value_bytes];
    let (operations, value_bytes) = (arguments.operations, arguments.value_bytes);
    let durability = durability.to_string();
    // The client runs on a task of the runtime, as an application's would: waiting in
    // `block_on` on this thread would add a hand-over from a worker thread to this one to
    // every response (measured: about 50 µs per request on a 2-CPU VM whose idle threads
    // wake slowly), which is the benchmark's own cost, not Stratus's.
    let measured = runtime.spawn(async move {
        let client = Client::new(ClientConfig::new(coordinator.clone()));
        let table = client.create_table("bench-latency", 1).await.map_err(|error| error.to_string())?;
        for operation in ["write", "read"] {
            let mut histogram = latency_histogram();
            let total = WARMUP_OPERATIONS + operations;
            let mut started_measuring = Instant::now();
            for index in 0..total {
                if index == WARMUP_OPERATIONS {
                    started_measuring = Instant::now();
                }
                // A small key set: reads hit written objects, writes overwrite (the cleaner's
                // steady state rather than an ever-growing log).
                let key = format!("key-{}", index % 1_000);
                let started = Instant::now();
                if operation == "write" {
                    client.write(table, key.as_bytes(), &value).await
                        .map_err(|error| format!("write: {error}"))?;
                } else {
                    client.read(table, key.as_bytes()).await
                        .map_err(|error| format!("read: {error}"))?;
                }
                if index >= WARMUP_OPERATIONS {
                    let nanoseconds = started.elapsed().as_nanos() as u64;
                    histogram.saturating_record(nanoseconds.max(1));
                }
            }
            let elapsed = started_measuring.elapsed();
            let percentiles = Percentiles::of(&histogram);
            let ops_per_sec = operations as f64 / elapsed.as_secs_f64();
            println!(
                "{operation:<6} {replicas:>8} {durability:>10} {:>10.1} {:>10.1} {:>10.1} {ops_per_sec:>12.0}",
                percentiles.p50_us, percentiles.p99_us, percentiles.p999_us
            );
            print_json(&[
                ("bench", Field::Text("latency".into())),
                ("op", Field::Text(operation.into())),
                ("replicas", Field::Number(f64::from(replicas))),
                ("durability", Field::Text(durability.clone())),
                ("value_bytes", Field::Number(value_bytes as f64)),
                ("p50_us", Field::Number(percentiles.p50_us)),
                ("p99_us", Field::Number(percentiles.p99_us)),
                ("p999_us", Field::Number(percentiles.p999_us)),
                ("ops_per_sec", Field::Number(ops_per_sec)),
            ]);
        }
        Ok::<_, String>(())
    });
    runtime.block_on(measured).map_err(|error| error.to_string())?
}
