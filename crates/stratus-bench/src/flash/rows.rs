//! The write, read and DRAM rows.

use std::path::{Path, PathBuf};
use std::time::Instant;

use stratus_client::{BlockingClient, RejectRules, TableId, Tier};

use super::load::{
    close_head_segment, key_of, memory_table_beside, value_of, wait_for_demotion, write_objects,
};
use super::raw::{self, RawIo, RawReads};
use super::server::{flash_figures, server_flash_io, FlashFigures};
use super::{client_config, FlashArguments, FlashCluster};
use crate::cpu::{CpuCost, PhaseCpu};
use crate::report::{latency_histogram, print_json, Field, Percentiles};
use crate::ycsb::generators::Random;

/// Objects of the memory table whose reads are the RPC reference of the read row.
const MEMORY_REFERENCE_OBJECTS: u64 = 1_000;
/// The goal of the DRAM row (T2's mapping entry), in bytes per object.
const DRAM_GOAL_BYTES: f64 = 16.0;

/// Prints the table's header.
pub(super) fn print_header() {
    println!(
        "{:<6} {:<8} {:<34} {:>12} {:>12} {:>8} {:>10}",
        "row", "config", "measure", "flash", "reference", "ratio", "cpu_us/op"
    );
}

/// One line of the table; `reference` and `ratio` are absent where a figure has none.
pub(super) fn line(
    row: &str,
    config: &str,
    measure: &str,
    value: f64,
    reference: Option<f64>,
    cpu: f64,
) {
    let reference_text = reference.map_or("-".to_string(), |reference| format!("{reference:.1}"));
    let ratio = reference
        .filter(|reference| *reference > 0.0)
        .map_or("-".to_string(), |reference| format!("{:.3}", value / reference));
    let cpu_text = if cpu > 0.0 { format!("{cpu:.1}") } else { "-".to_string() };
    println!(
        "{row:<6} {config:<8} {measure:<34} {value:>12.1} {reference_text:>12} {ratio:>8} \
         {cpu_text:>10}"
    );
}

/// What the write row leaves for the read row.
struct Written {
    table: TableId,
    memory_table: TableId,
    raw_path: PathBuf,
    raw_io: RawIo,
    demoted_fraction: f64,
    server_io: String,
}

/// The write row with `replicas` replicas (one server for R = 0, R + 1 otherwise), then the
/// read rows on the same cluster when `with_reads`.
pub(super) fn write_and_read(
    arguments: &FlashArguments,
    replicas: u32,
    with_reads: bool,
) -> Result<(), String> {
    let servers = if replicas == 0 { 1 } else { replicas + 1 };
    let cluster =
        FlashCluster::start(arguments, servers, replicas, arguments.log_mib, arguments.flash_gib)?;
    let written = write_row(&cluster, arguments, replicas)?;
    if with_reads {
        read_rows(&cluster, arguments, &written)?;
    }
    Ok(())
}

/// A flash table and a memory table on the same master.
pub(super) fn tables(cluster: &FlashCluster, name: &str) -> Result<(TableId, TableId), String> {
    let client = &cluster.client;
    cluster.runtime.block_on(async {
        let table = client
            .create_table_with_tier(name, 1, Tier::Flash)
            .await
            .map_err(|error| format!("creating the flash table: {error}"))?;
        let memory =
            memory_table_beside(client, table, &format!("{name}-memory"), cluster.servers).await?;
        Ok((table, memory))
    })
}

/// What [`write_until_on_flash`] measured.
struct OnFlash {
    before: FlashFigures,
    after: FlashFigures,
    /// From the first write to the last write's answer.
    acknowledged_seconds: f64,
    /// From the first write until every object was demoted.
    on_flash_seconds: f64,
    /// The cluster's CPU over the whole.
    cpu: CpuCost,
}

/// Writes `objects` of `value_bytes` into the flash table of `tables`, closes the head segment
/// with writes to the memory table, and waits until every object is demoted.
fn write_until_on_flash(
    cluster: &FlashCluster,
    tables: (TableId, TableId),
    objects: u64,
    value_bytes: usize,
) -> Result<OnFlash, String> {
    let (table, memory) = tables;
    let before = flash_figures(cluster.server_metrics())?;
    let cpu = PhaseCpu::start(cluster.processes.clone())?;
    let started = Instant::now();
    let client = &cluster.client;
    cluster.runtime.block_on(write_objects(client, table, objects, value_bytes))?;
    let acknowledged_seconds = started.elapsed().as_secs_f64();
    cluster.runtime.block_on(close_head_segment(client, memory, cluster.segment_bytes))?;
    let after = wait_for_demotion(cluster.server_metrics(), &before, objects)?;
    let on_flash_seconds = started.elapsed().as_secs_f64();
    Ok(OnFlash { before, after, acknowledged_seconds, on_flash_seconds, cpu: cpu.finish()? })
}

fn write_row(
    cluster: &FlashCluster,
    arguments: &FlashArguments,
    replicas: u32,
) -> Result<Written, String> {
    let (table, memory_table) = tables(cluster, "flash-writes")?;
    let (objects, value_bytes) = (arguments.objects, arguments.value_bytes);
    let OnFlash {
        before,
        after,
        acknowledged_seconds: acknowledged,
        on_flash_seconds: on_flash,
        cpu,
    } = write_until_on_flash(cluster, (table, memory_table), objects, value_bytes)?;
    let data_bytes = objects * value_bytes as u64;
    let raw_io = raw::probe(cluster.path());
    let raw_path = cluster.path().join("raw-file");
    let raw_seconds = raw::sequential_write(&raw_path, data_bytes, raw_io)?.as_secs_f64();
    let mb_per_sec = data_bytes as f64 / 1e6 / on_flash;
    let raw_mb_per_sec = data_bytes as f64 / 1e6 / raw_seconds;
    let image_bytes = after.image_bytes_written - before.image_bytes_written;
    let image_mb_per_sec = image_bytes / 1e6 / on_flash;
    let demoted = after.objects_demoted - before.objects_demoted;
    let server_io = server_flash_io(cluster.path(), 0).unwrap_or_else(|| "unknown".into());
    let config = format!("r{replicas}");
    let cpu_per_object = cpu.system_us_per_op(objects);
    line("write", &config, "objects/s until on flash", objects as f64 / on_flash, None, 0.0);
    line("write", &config, "MB/s until on flash vs raw seq", mb_per_sec, Some(raw_mb_per_sec), 0.0);
    line(
        "write",
        &config,
        "image MB/s written by the tier",
        image_mb_per_sec,
        None,
        cpu_per_object,
    );
    let mut fields = vec![
        ("bench", Field::Text("flash".into())),
        ("row", Field::Text("write".into())),
        ("config", Field::Text(config.clone())),
        ("replicas", Field::Number(f64::from(replicas))),
        ("servers", Field::Number(f64::from(cluster.servers))),
        ("objects", Field::Number(objects as f64)),
        ("value_bytes", Field::Number(value_bytes as f64)),
        ("acknowledged_seconds", Field::Number(acknowledged)),
        ("on_flash_seconds", Field::Number(on_flash)),
        ("objects_per_sec", Field::Number(objects as f64 / on_flash)),
        ("mb_per_sec", Field::Number(mb_per_sec)),
        ("acknowledged_mb_per_sec", Field::Number(data_bytes as f64 / 1e6 / acknowledged)),
        ("raw_io", Field::Text(raw_io.name().into())),
        ("raw_write_mb_per_sec", Field::Number(raw_mb_per_sec)),
        ("ratio_to_raw", Field::Number(mb_per_sec / raw_mb_per_sec)),
        ("objects_demoted", Field::Number(demoted)),
        ("image_bytes_written", Field::Number(image_bytes)),
        ("image_mb_per_sec", Field::Number(image_mb_per_sec)),
        ("image_bytes_per_data_byte", Field::Number(image_bytes / data_bytes as f64)),
        ("images_refused", Field::Number(after.images_refused - before.images_refused)),
        ("server_flash_io", Field::Text(server_io.clone())),
    ];
    fields.extend(cpu.fields(objects));
    print_json(&fields);
    Ok(Written {
        table,
        memory_table,
        raw_path,
        raw_io,
        demoted_fraction: demoted / objects as f64,
        server_io,
    })
}

/// What reads through the client measured.
struct ClientReads {
    percentiles: Percentiles,
    ops_per_sec: f64,
    cpu: CpuCost,
}

/// `reads` reads of uniformly chosen objects `0..keys` of `table` by `depth` threads, each
/// with its own blocking client and one read at a time; every value is checked.
fn client_reads(
    cluster: &FlashCluster,
    table: TableId,
    keys: u64,
    value_bytes: usize,
    depth: usize,
    reads: u64,
) -> Result<ClientReads, String> {
    let mut clients = Vec::new();
    for _ in 0..depth.max(1) {
        let client = BlockingClient::new(client_config(cluster.coordinator()))
            .map_err(|error| format!("client: {error}"))?;
        // Its first read fetches the tablet map and opens the connection: not measured.
        client.read(table, &key_of(0), RejectRules::NONE).map_err(|error| error.to_string())?;
        clients.push(client);
    }
    let depth = clients.len() as u64;
    let cpu = PhaseCpu::start(cluster.processes.clone())?;
    let started = Instant::now();
    let histograms = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(thread, client)| {
                let count = reads / depth + u64::from((thread as u64) < reads % depth);
                scope.spawn(move || read_loop(client, table, keys, value_bytes, thread, count))
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().map_err(|_| "a reader panicked".to_string())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu.finish()?;
    let mut merged = latency_histogram();
    for histogram in &histograms {
        merged.add(histogram).map_err(|error| format!("merging histograms: {error}"))?;
    }
    Ok(ClientReads {
        percentiles: Percentiles::of(&merged),
        ops_per_sec: reads as f64 / elapsed.max(1e-9),
        cpu,
    })
}

fn read_loop(
    client: &BlockingClient,
    table: TableId,
    keys: u64,
    value_bytes: usize,
    thread: usize,
    count: u64,
) -> Result<hdrhistogram::Histogram<u64>, String> {
    let mut random = Random::new(0x666c_6173 ^ thread as u64);
    let mut histogram = latency_histogram();
    for _ in 0..count {
        let index = random.uniform(0, keys - 1);
        let begin = Instant::now();
        let (value, _) = client
            .read(table, &key_of(index), RejectRules::NONE)
            .map_err(|error| format!("reading object {index}: {error}"))?;
        histogram.saturating_record((begin.elapsed().as_nanos() as u64).max(1));
        if value[..] != value_of(index, value_bytes)[..] {
            return Err(format!("object {index} read back wrong"));
        }
    }
    Ok(histogram)
}

/// The read rows at depth 1 and at `--depth`, flash against raw.
fn read_rows(
    cluster: &FlashCluster,
    arguments: &FlashArguments,
    written: &Written,
) -> Result<(), String> {
    let (objects, value_bytes) = (arguments.objects, arguments.value_bytes);
    let client = &cluster.client;
    let memory = written.memory_table;
    let reference_objects = MEMORY_REFERENCE_OBJECTS.min(objects);
    cluster.runtime.block_on(write_objects(client, memory, reference_objects, value_bytes))?;
    let reference_reads = arguments.reads.min(5_000);
    let memory_reads =
        client_reads(cluster, memory, reference_objects, value_bytes, 1, reference_reads)?;
    let data_bytes = objects * value_bytes as u64;
    for depth in [1, arguments.depth.max(1)] {
        let flash =
            client_reads(cluster, written.table, objects, value_bytes, depth, arguments.reads)?;
        let raw = raw::random_reads(
            &written.raw_path,
            data_bytes,
            written.raw_io,
            depth,
            arguments.reads,
        )?;
        let reference = (depth == 1).then_some(memory_reads.percentiles.p50_us);
        report_reads(arguments, written, depth, &flash, &raw, reference);
    }
    remove_raw_file(&written.raw_path);
    Ok(())
}

fn remove_raw_file(path: &Path) {
    // The cluster's directory is removed with it anyway; this only frees the space sooner.
    let _ = std::fs::remove_file(path);
}

fn report_reads(
    arguments: &FlashArguments,
    written: &Written,
    depth: usize,
    flash: &ClientReads,
    raw: &RawReads,
    memory_read_p50_us: Option<f64>,
) {
    let config = format!("depth{depth}");
    let cpu = flash.cpu.system_us_per_op(arguments.reads);
    let (p50, p99) = (flash.percentiles.p50_us, flash.percentiles.p99_us);
    line("read", &config, "p50 us vs raw 4K pread", p50, Some(raw.percentiles.p50_us), 0.0);
    line("read", &config, "p99 us vs raw 4K pread", p99, Some(raw.percentiles.p99_us), 0.0);
    line("read", &config, "reads/s vs raw 4K pread", flash.ops_per_sec, Some(raw.ops_per_sec), cpu);
    if let Some(memory) = memory_read_p50_us {
        line(
            "read",
            &config,
            "p50 us vs raw + memory-table read",
            p50,
            Some(raw.percentiles.p50_us + memory),
            0.0,
        );
    }
    let mut fields = vec![
        ("bench", Field::Text("flash".into())),
        ("row", Field::Text("read".into())),
        ("config", Field::Text(config)),
        ("depth", Field::Number(depth as f64)),
        ("reads", Field::Number(arguments.reads as f64)),
        ("objects", Field::Number(arguments.objects as f64)),
        ("value_bytes", Field::Number(arguments.value_bytes as f64)),
        ("demoted_fraction", Field::Number(written.demoted_fraction)),
        ("p50_us", Field::Number(p50)),
        ("p99_us", Field::Number(p99)),
        ("ops_per_sec", Field::Number(flash.ops_per_sec)),
        ("raw_io", Field::Text(written.raw_io.name().into())),
        ("server_flash_io", Field::Text(written.server_io.clone())),
        ("raw_read_bytes", Field::Number(raw::READ_BYTES as f64)),
        ("raw_p50_us", Field::Number(raw.percentiles.p50_us)),
        ("raw_p99_us", Field::Number(raw.percentiles.p99_us)),
        ("raw_ops_per_sec", Field::Number(raw.ops_per_sec)),
        ("p50_minus_raw_us", Field::Number(p50 - raw.percentiles.p50_us)),
        ("throughput_ratio_to_raw", Field::Number(flash.ops_per_sec / raw.ops_per_sec)),
        ("memory_read_p50_us", Field::optional_number(memory_read_p50_us)),
    ];
    fields.extend(flash.cpu.fields(arguments.reads));
    print_json(&fields);
}

/// The DRAM row for `value_bytes`: a fresh one-server cluster, `--dram-objects` objects
/// demoted, then the log's figures.
pub(super) fn dram(arguments: &FlashArguments, value_bytes: usize) -> Result<(), String> {
    if value_bytes <= 8 {
        return Err(format!(
            "--dram-value-bytes {value_bytes}: values of 8 bytes or less stay in memory"
        ));
    }
    let cluster = FlashCluster::start(arguments, 1, 0, arguments.log_mib, arguments.flash_gib)?;
    let objects = arguments.dram_objects.max(1);
    let OnFlash { before, after, cpu, .. } =
        write_until_on_flash(&cluster, tables(&cluster, "flash-dram")?, objects, value_bytes)?;
    let demoted = after.objects_demoted - before.objects_demoted;
    let stub = (after.stub_bytes() - before.stub_bytes()) / demoted;
    let slot = after.hash_table_bytes / after.objects_live.max(1.0);
    // Seglets in use for the flash objects: allocated log memory, less what objects in memory
    // (the memory table's filler) take.
    let allocated = (after.log_allocated_bytes
        - before.log_allocated_bytes
        - (after.log_live_object_bytes - before.log_live_object_bytes))
        / demoted;
    let config = format!("{value_bytes}B");
    line(
        "dram",
        &config,
        "bytes per flash object vs goal",
        stub + slot,
        Some(DRAM_GOAL_BYTES),
        0.0,
    );
    line("dram", &config, "log seglet bytes per flash object", allocated, None, 0.0);
    let mut fields = vec![
        ("bench", Field::Text("flash".into())),
        ("row", Field::Text("dram".into())),
        ("config", Field::Text(config)),
        ("value_bytes", Field::Number(value_bytes as f64)),
        ("objects", Field::Number(objects as f64)),
        ("objects_demoted", Field::Number(demoted)),
        ("stub_bytes_per_object", Field::Number(stub)),
        ("hash_table_bytes_per_object", Field::Number(slot)),
        ("dram_bytes_per_object", Field::Number(stub + slot)),
        ("log_allocated_bytes_per_object", Field::Number(allocated)),
        ("goal_bytes_per_object", Field::Number(DRAM_GOAL_BYTES)),
    ];
    fields.extend(cpu.fields(objects));
    print_json(&fields);
    Ok(())
}
