//! `stratus bench rpc`: 100-byte reads through the full client and server path, side by side
//! with a raw TCP echo of the same payload size on loopback, measured in the same run.
//!
//! Each row also says what it cost in CPU per operation: the server side (the one-server
//! cluster's processes, or the echo server's) and the driver (this process). CPU is taken
//! over the warm-up and the measured operations together, and divided by both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use stratus_client::{Client, ClientConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{start_local_cluster, start_stratus};
use crate::cpu::{process_tree, CpuCost, PhaseCpu};
use crate::report::{latency_histogram, print_json, Field, Percentiles};

/// `stratus bench rpc`.
#[derive(Debug, Args)]
pub struct RpcArguments {
    /// Operations per configuration (split across its clients).
    #[arg(long, default_value_t = 40_000)]
    pub operations: u64,
    /// Concurrent clients to measure, comma-separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    pub clients: Vec<u32>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    pub value_bytes: usize,
}

/// What one configuration measured.
struct Measurement {
    histogram: Histogram<u64>,
    elapsed: Duration,
    operations: u64,
}

const WARMUP_OPERATIONS: u64 = 500;

/// Runs the benchmark.
pub fn run(arguments: RpcArguments) -> Result<(), String> {
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let cluster = start_local_cluster(directory.path(), 1, &["--log-mib", "64"], None)?;
    let coordinator = cluster.coordinator.clone();
    let cluster_processes = process_tree(cluster.process.id())?;
    let (echo, line) =
        start_stratus(&["bench", "echo-server"], "listening on", Duration::from_secs(20))?;
    let echo_processes = vec![echo.id()];
    let echo_address = line.rsplit(' ').next().unwrap_or_default().to_string();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let value = vec![0x5a_u8; arguments.value_bytes];
    let table = runtime.block_on(async {
        let client = Client::new(ClientConfig::new(coordinator.clone()));
        let table = client.create_table("bench-rpc", 1).await.map_err(|error| error.to_string())?;
        client.write(table, b"bench-key", &value).await.map_err(|error| error.to_string())?;
        Ok::<_, String>(table)
    })?;
    println!(
        "{:<10} {:>8} {:>10} {:>10} {:>10} {:>12} {:>10} {:>10}",
        "system", "clients", "p50_us", "p99_us", "p999_us", "ops_per_sec", "cpu_us/op", "drv_us/op"
    );
    let mut stratus_p50_single = None;
    let mut echo_p50_single = None;
    for &clients in &arguments.clients {
        let clients = clients.max(1);
        let per_client = (arguments.operations / u64::from(clients)).max(1);
        let cpu = PhaseCpu::start(cluster_processes.clone())?;
        let stratus =
            runtime.block_on(measure_stratus(&coordinator, table, clients, per_client))?;
        let stratus_cpu = cpu.finish()?;
        let cpu = PhaseCpu::start(echo_processes.clone())?;
        let echo = runtime.block_on(measure_echo(
            &echo_address,
            arguments.value_bytes,
            clients,
            per_client,
        ))?;
        let echo_cpu = cpu.finish()?;
        report("stratus", clients, &stratus, &stratus_cpu);
        report("tcp-echo", clients, &echo, &echo_cpu);
        if clients == 1 {
            stratus_p50_single = Some(Percentiles::of(&stratus.histogram).p50_us);
            echo_p50_single = Some(Percentiles::of(&echo.histogram).p50_us);
        }
    }
    if let (Some(stratus), Some(echo)) = (stratus_p50_single, echo_p50_single) {
        let ratio = stratus / echo;
        println!("read p50 / tcp-echo p50 (1 client): {ratio:.2}");
        print_json(&[
            ("bench", Field::Text("rpc".into())),
            ("system", Field::Text("ratio".into())),
            ("clients", Field::Number(1.0)),
            ("p50_ratio_stratus_to_tcp_echo", Field::Number(ratio)),
        ]);
    }
    Ok(())
}

/// Prints a row; `cpu` covers the warm-up and the measured operations.
fn report(system: &str, clients: u32, measurement: &Measurement, cpu: &CpuCost) {
    let percentiles = Percentiles::of(&measurement.histogram);
    let ops_per_sec = measurement.operations as f64 / measurement.elapsed.as_secs_f64();
    let cpu_operations = measurement.operations + u64::from(clients) * WARMUP_OPERATIONS;
    println!(
        "{system:<10} {clients:>8} {:>10.1} {:>10.1} {:>10.1} {ops_per_sec:>12.0} {:>10.1} {:>10.1}",
        percentiles.p50_us,
        percentiles.p99_us,
        percentiles.p999_us,
        cpu.system_us_per_op(cpu_operations),
        cpu.driver_us_per_op(cpu_operations),
    );
    let mut fields = vec![
        ("bench", Field::Text("rpc".into())),
        ("system", Field::Text(system.into())),
        ("clients", Field::Number(f64::from(clients))),
        ("p50_us", Field::Number(percentiles.p50_us)),
        ("p99_us", Field::Number(percentiles.p99_us)),
        ("p999_us", Field::Number(percentiles.p999_us)),
        ("ops_per_sec", Field::Number(ops_per_sec.round())),
    ];
    fields.extend(cpu.fields(cpu_operations));
    print_json(&fields);
}

async fn measure_stratus(
    coordinator: &str,
    table: stratus_client::TableId,
    clients: u32,
    per_client: u64,
) -> Result<Measurement, String> {
    let mut tasks = tokio::task::JoinSet::new();
    let start_line = Arc::new(tokio::sync::Barrier::new(clients as usize));
    for _ in 0..clients {
        // A client per task: its own connection, like separate application processes.
        let client = Client::new(ClientConfig::new(coordinator.to_string()));
        let start_line = start_line.clone();
        tasks.spawn(async move {
            for _ in 0..WARMUP_OPERATIONS {
                client.read(table, b"bench-key").await.map_err(|error| error.to_string())?;
            }
            start_line.wait().await;
            let mut histogram = latency_histogram();
            let started = Instant::now();
            for _ in 0..per_client {
                let before = Instant::now();
                client.read(table, b"bench-key").await.map_err(|error| error.to_string())?;
                let _ = histogram.record(before.elapsed().as_nanos() as u64);
            }
            Ok::<_, String>((histogram, started.elapsed()))
        });
    }
    collect(tasks, u64::from(clients) * per_client).await
}

async fn measure_echo(
    address: &str,
    payload_bytes: usize,
    clients: u32,
    per_client: u64,
) -> Result<Measurement, String> {
    let mut tasks = tokio::task::JoinSet::new();
    let start_line = Arc::new(tokio::sync::Barrier::new(clients as usize));
    for _ in 0..clients {
        let address = address.to_string();
        let start_line = start_line.clone();
        tasks.spawn(async move {
            let mut stream = tokio::net::TcpStream::connect(&address)
                .await
                .map_err(|error| error.to_string())?;
            stream.set_nodelay(true).map_err(|error| error.to_string())?;
            let message = vec![0x5a_u8; payload_bytes];
            let mut reply = vec![0u8; payload_bytes];
            let mut round_trip = async |stream: &mut tokio::net::TcpStream| -> Result<(), String> {
                stream.write_all(&message).await.map_err(|error| error.to_string())?;
                stream.read_exact(&mut reply).await.map_err(|error| error.to_string())?;
                Ok(())
            };
            for _ in 0..WARMUP_OPERATIONS {
                round_trip(&mut stream).await?;
            }
            start_line.wait().await;
            let mut histogram = latency_histogram();
            let started = Instant::now();
            for _ in 0..per_client {
                let before = Instant::now();
                round_trip(&mut stream).await?;
                let _ = histogram.record(before.elapsed().as_nanos() as u64);
            }
            Ok::<_, String>((histogram, started.elapsed()))
        });
    }
    collect(tasks, u64::from(clients) * per_client).await
}

async fn collect(
    mut tasks: tokio::task::JoinSet<Result<(Histogram<u64>, Duration), String>>,
    operations: u64,
) -> Result<Measurement, String> {
    let mut histogram = latency_histogram();
    let mut elapsed = Duration::ZERO;
    while let Some(joined) = tasks.join_next().await {
        let (part, part_elapsed) = joined.map_err(|error| error.to_string())??;
        histogram.add(&part).map_err(|error| error.to_string())?;
        elapsed = elapsed.max(part_elapsed);
    }
    Ok(Measurement { histogram, elapsed, operations })
}

/// The reference server: echoes every byte back on the same connection.
pub fn run_echo_server(listen: &str) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(listen).await.map_err(|error| error.to_string())?;
        let address = listener.local_addr().map_err(|error| error.to_string())?;
        println!("echo server listening on {address}");
        loop {
            let (mut stream, _) = listener.accept().await.map_err(|error| error.to_string())?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 << 10];
                loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(count) => {
                            if stream.write_all(&buffer[..count]).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            });
        }
    })
}
