//! The cleaning row: overwrites of 1 KB objects of a flash table whose live data fills
//! `--cleaning-utilization-percent` (80) of the server's flash budget, against the same number
//! of writes into an empty flash tier (a fresh server, same flags). Once flash is full, the
//! combined cleaner must free images (reading their live objects back into memory, to be
//! demoted again) for the overwrites' new versions to leave memory, so the overwrites run at
//! what flash cleaning sustains. Both phases run to the last write's answer, then until every
//! write was demoted (`stratus_flash_objects_demoted_total`, which also counts objects the
//! cleaner moved back to memory and demoted again: so the wait may end early, never late).
//! A write refused for [`STALL_PATIENCE`] (its exactly-once client retrying RETRY, the log
//! full) ends the phase: the row then says the tier stalled, after how many writes, and what
//! its cleaner had done (images refused and deleted), instead of a rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stratus_client::{Client, ClientConfig, TableId};

use super::load::{close_head_segment, key_of, value_of, wait_for_demotion, write_objects};
use super::rows::line;
use super::server::{flash_figures, FlashFigures};
use super::{FlashArguments, FlashCluster};
use crate::cpu::{CpuCost, PhaseCpu};
use crate::report::{print_json, Field};

/// Writes in flight during the measured phases (single writes, each retried by its
/// exactly-once client while the log is full).
const WRITERS: u64 = 32;
/// Bytes an image takes per byte of value, for sizing the live data from the flash budget
/// (object and entry headers and the key; 1.065 measured with 1 KiB values and 16-byte keys).
const IMAGE_BYTES_PER_VALUE_BYTE: f64 = 1.07;

/// How long a write may wait (its client retrying RETRY, the log full) before the tier counts
/// as stalled: a tier that cleans admits writes again within seconds.
const STALL_PATIENCE: Duration = Duration::from_secs(30);

/// What one phase measured.
struct Phase {
    /// Writes per second until the last answer; `None` if the tier stalled.
    writes_per_sec: Option<f64>,
    /// Writes per second until every write was demoted; `None` if the tier stalled.
    on_flash_writes_per_sec: Option<f64>,
    /// Writes answered (all of them, unless the tier stalled).
    acknowledged: u64,
    /// Why a write failed, if one did.
    stall: Option<String>,
    cpu: CpuCost,
    before: FlashFigures,
    after: FlashFigures,
}

/// Runs the row.
pub(super) fn run(arguments: &FlashArguments) -> Result<(), String> {
    let value_bytes = arguments.value_bytes;
    let budget = (arguments.cleaning_flash_gib << 30) as f64;
    let object_image_bytes = value_bytes as f64 * IMAGE_BYTES_PER_VALUE_BYTE;
    let utilization = f64::from(arguments.cleaning_utilization_percent) / 100.0;
    let live_objects = (budget * utilization / object_image_bytes) as u64;
    // Half the budget by default: more than the 20 % left free, so flash fills and is cleaned.
    let writes = match arguments.cleaning_writes {
        0 => (budget / 2.0 / object_image_bytes) as u64,
        writes => writes,
    };
    let start = || {
        FlashCluster::start(
            arguments,
            1,
            0,
            arguments.cleaning_log_mib,
            arguments.cleaning_flash_gib,
        )
    };
    let empty = {
        let cluster = start()?;
        let tables = super::rows::tables(&cluster, "flash-empty")?;
        // New objects into the empty tier.
        measure(&cluster, tables, writes, 0, value_bytes)?
    };
    let full = {
        let cluster = start()?;
        let (table, memory) = super::rows::tables(&cluster, "flash-full")?;
        let (client, runtime) = (&cluster.client, &cluster.runtime);
        let before = flash_figures(cluster.server_metrics())?;
        runtime.block_on(write_objects(client, table, live_objects, value_bytes))?;
        runtime.block_on(close_head_segment(client, memory, cluster.segment_bytes))?;
        wait_for_demotion(cluster.server_metrics(), &before, live_objects)?;
        measure(&cluster, (table, memory), writes, live_objects, value_bytes)?
    };
    report(arguments, live_objects, writes, &empty, &full);
    Ok(())
}

/// `writes` writes of objects among `0..keys` (or new objects when `keys` is 0), by
/// [`WRITERS`] concurrent writers, then until they are demoted; a write refused for
/// [`STALL_PATIENCE`] ends the phase as stalled.
fn measure(
    cluster: &FlashCluster,
    tables: (TableId, TableId),
    writes: u64,
    keys: u64,
    value_bytes: usize,
) -> Result<Phase, String> {
    let (table, memory) = tables;
    let mut config = ClientConfig::new(cluster.coordinator().to_string());
    config.operation_timeout = STALL_PATIENCE;
    let client = {
        let _entered = cluster.runtime.enter();
        Client::new(config)
    };
    let before = flash_figures(cluster.server_metrics())?;
    let cpu = PhaseCpu::start(cluster.processes.clone())?;
    let started = Instant::now();
    let acknowledged = Arc::new(AtomicU64::new(0));
    let outcome = cluster.runtime.block_on(overwrite(
        &client,
        (table, keys),
        writes,
        value_bytes,
        &acknowledged,
    ));
    let answered_seconds = started.elapsed().as_secs_f64();
    let acknowledged = acknowledged.load(Ordering::Relaxed);
    if let Err(stall) = outcome {
        let after = flash_figures(cluster.server_metrics())?;
        let stall = format!("{stall}; server warnings: {:?}", server_warnings(cluster.path()));
        let (writes_per_sec, on_flash_writes_per_sec) = (None, None);
        let cpu = cpu.finish()?;
        return Ok(Phase {
            writes_per_sec,
            on_flash_writes_per_sec,
            acknowledged,
            stall: Some(stall),
            cpu,
            before,
            after,
        });
    }
    cluster.runtime.block_on(close_head_segment(&cluster.client, memory, cluster.segment_bytes))?;
    let after = wait_for_demotion(cluster.server_metrics(), &before, writes)?;
    let on_flash = started.elapsed().as_secs_f64();
    Ok(Phase {
        writes_per_sec: Some(writes as f64 / answered_seconds),
        on_flash_writes_per_sec: Some(writes as f64 / on_flash),
        acknowledged,
        stall: None,
        cpu: cpu.finish()?,
        before,
        after,
    })
}

async fn overwrite(
    client: &Client,
    (table, keys): (TableId, u64),
    writes: u64,
    value_bytes: usize,
    acknowledged: &Arc<AtomicU64>,
) -> Result<(), String> {
    let next = Arc::new(AtomicU64::new(0));
    let mut writers: tokio::task::JoinSet<Result<(), String>> = tokio::task::JoinSet::new();
    for _ in 0..WRITERS {
        let (client, next, acknowledged) = (client.clone(), next.clone(), acknowledged.clone());
        writers.spawn(async move {
            loop {
                let count = next.fetch_add(1, Ordering::Relaxed);
                if count >= writes {
                    return Ok(());
                }
                let index = if keys == 0 { count } else { scattered(count, keys) };
                let value = value_of(index, value_bytes);
                client
                    .write(table, &key_of(index), &value)
                    .await
                    .map_err(|error| format!("write {count}: {error}"))?;
                acknowledged.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let mut first_error = None;
    while let Some(done) = writers.join_next().await {
        if let Err(error) = done.map_err(|error| error.to_string()).and_then(|result| result) {
            // The others stop at their next write.
            next.store(writes, Ordering::Relaxed);
            first_error.get_or_insert(error);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The `count`th key of a walk over `0..keys` that visits every key once per `keys` steps, in
/// an order unrelated to the keys' (and so to the segments they were written to).
fn scattered(count: u64, keys: u64) -> u64 {
    const STRIDE: u64 = 1_000_003; // a prime
    let stride = if keys.is_multiple_of(STRIDE) { 1 } else { STRIDE % keys };
    ((u128::from(count) * u128::from(stride)) % u128::from(keys)) as u64
}

fn report(arguments: &FlashArguments, live_objects: u64, writes: u64, empty: &Phase, full: &Phase) {
    let config = format!("{}%", arguments.cleaning_utilization_percent);
    let ratio = |full: Option<f64>, empty: Option<f64>| Some(full? / empty?);
    let cpu = full.cpu.system_us_per_op(full.acknowledged);
    match (full.writes_per_sec, empty.writes_per_sec) {
        (Some(full_rate), Some(empty_rate)) => {
            line("clean", &config, "writes/s vs empty flash tier", full_rate, Some(empty_rate), cpu)
        }
        _ => line(
            "clean",
            &config,
            "writes answered before a stall",
            full.acknowledged as f64,
            Some(writes as f64),
            cpu,
        ),
    }
    let deleted = full.after.images_deleted - full.before.images_deleted;
    line("clean", &config, "images deleted by the cleaner", deleted, None, 0.0);
    let mut fields = vec![
        ("bench", Field::Text("flash".into())),
        ("row", Field::Text("cleaning".into())),
        ("config", Field::Text(config)),
        ("flash_gib", Field::Number(arguments.cleaning_flash_gib as f64)),
        ("log_mib", Field::Number(arguments.cleaning_log_mib as f64)),
        ("live_objects", Field::Number(live_objects as f64)),
        ("value_bytes", Field::Number(arguments.value_bytes as f64)),
        ("writes", Field::Number(writes as f64)),
        ("acknowledged", Field::Number(full.acknowledged as f64)),
        ("stalled", Field::Boolean(full.stall.is_some())),
        ("stall", full.stall.clone().map_or(Field::Null, Field::Text)),
        ("writes_per_sec", Field::optional_number(full.writes_per_sec)),
        ("empty_writes_per_sec", Field::optional_number(empty.writes_per_sec)),
        ("ratio", Field::optional_number(ratio(full.writes_per_sec, empty.writes_per_sec))),
        ("on_flash_writes_per_sec", Field::optional_number(full.on_flash_writes_per_sec)),
        ("empty_on_flash_writes_per_sec", Field::optional_number(empty.on_flash_writes_per_sec)),
        (
            "on_flash_ratio",
            Field::optional_number(ratio(
                full.on_flash_writes_per_sec,
                empty.on_flash_writes_per_sec,
            )),
        ),
        ("images", Field::Number(full.after.images)),
        ("images_refused", Field::Number(full.after.images_refused - full.before.images_refused)),
        ("images_deleted", Field::Number(deleted)),
        (
            "segments_cleaned",
            Field::Number(full.after.segments_cleaned - full.before.segments_cleaned),
        ),
        ("log_live_object_bytes", Field::Number(full.after.log_live_object_bytes)),
        ("empty_stalled", Field::Boolean(empty.stall.is_some())),
        ("empty_cpu_us_per_op", Field::Number(empty.cpu.system_us_per_op(empty.acknowledged))),
    ];
    fields.extend(full.cpu.fields(full.acknowledged));
    print_json(&fields);
}

/// The last few warnings of server 0's log (for an error message).
fn server_warnings(directory: &std::path::Path) -> Vec<String> {
    let log =
        std::fs::read_to_string(directory.join("logs").join("server-0.log")).unwrap_or_default();
    let warnings: Vec<String> =
        log.lines().filter(|line| line.contains("WARN")).map(str::to_string).collect();
    warnings[warnings.len().saturating_sub(4)..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scattered_walk_visits_every_key_once_per_round() {
        for keys in [1u64, 2, 7, 1_000, 12_345] {
            let mut seen = vec![false; keys as usize];
            for count in 0..keys {
                let key = scattered(count, keys);
                assert!(!seen[key as usize], "key {key} of {keys} twice");
                seen[key as usize] = true;
            }
            assert_eq!(scattered(keys, keys), scattered(0, keys));
        }
    }
}
