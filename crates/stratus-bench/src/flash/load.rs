//! Putting objects on flash: pipelined writes into a flash table, then a memory table's writes
//! on the same master to close the log's head segment (the head is never demoted), then a wait
//! until the master's metrics count every object demoted.

use std::time::{Duration, Instant};

use bytes::Bytes;
use stratus_client::{Client, Expiry, RejectRules, TableId, Tier, WriteItem};

use super::server::{flash_figures, FlashFigures};

/// Objects per MULTI_WRITE.
const BATCH_OBJECTS: u64 = 100;
/// MULTI_WRITEs in flight.
const REQUESTS_IN_FLIGHT: usize = 8;
/// Size of the values written to close the head segment (a memory table's, so they stay in
/// memory and are not counted as objects of the flash table), at most: a server takes values
/// up to an eighth of a segment.
const FILLER_VALUE_BYTES_MAX: u64 = 256 << 10;
/// How often the demotion wait reads the metrics.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// The demotion wait gives up when the demoted count has not grown for this long.
const DEMOTION_STALL_PATIENCE: Duration = Duration::from_secs(30);

/// The key of object `index` of a table: 16 bytes.
pub fn key_of(index: u64) -> Vec<u8> {
    format!("flash-{index:010}").into_bytes()
}

/// The value of object `index`: its key, then a fill byte (so a read of the wrong object is
/// caught), `value_bytes` long.
pub fn value_of(index: u64, value_bytes: usize) -> Vec<u8> {
    let mut value = key_of(index);
    value.resize(value_bytes, (index % 251) as u8);
    value.truncate(value_bytes);
    value
}

/// Writes objects `0..count` of `value_bytes` into `table` with [`REQUESTS_IN_FLIGHT`]
/// MULTI_WRITEs of [`BATCH_OBJECTS`] in flight.
pub async fn write_objects(
    client: &Client,
    table: TableId,
    count: u64,
    value_bytes: usize,
) -> Result<(), String> {
    let mut requests = tokio::task::JoinSet::new();
    let mut next = 0u64;
    loop {
        while next < count && requests.len() < REQUESTS_IN_FLIGHT {
            let end = (next + BATCH_OBJECTS).min(count);
            let items: Vec<WriteItem> = (next..end)
                .map(|index| WriteItem {
                    table_id: table,
                    key: Bytes::from(key_of(index)),
                    value: Bytes::from(value_of(index, value_bytes)),
                    rules: RejectRules::NONE,
                    expiry: Expiry::Never,
                    rpc: None,
                })
                .collect();
            next = end;
            let client = client.clone();
            requests.spawn(async move { client.multi_write(&items).await });
        }
        let Some(outcomes) = requests.join_next().await else { return Ok(()) };
        for outcome in outcomes.map_err(|error| error.to_string())? {
            outcome.map_err(|error| format!("writing to the flash table: {error}"))?;
        }
    }
}

/// The master of `table`'s first tablet.
pub async fn master_of(client: &Client, table: TableId) -> Result<String, String> {
    let tablets = client.tablet_map(table).await.map_err(|error| format!("tablet map: {error}"))?;
    Ok(tablets.first().ok_or("a table without tablets")?.owner_address.clone())
}

/// A memory table on the same master as `table` (tables are placed by the coordinator:
/// tables are created until one lands there; the others stay, empty).
pub async fn memory_table_beside(
    client: &Client,
    table: TableId,
    name: &str,
    servers: u32,
) -> Result<TableId, String> {
    let master = master_of(client, table).await?;
    for attempt in 0..=servers {
        let candidate = client
            .create_table_with_tier(&format!("{name}-{attempt}"), 1, Tier::Memory)
            .await
            .map_err(|error| format!("creating a memory table: {error}"))?;
        if master_of(client, candidate).await? == master {
            return Ok(candidate);
        }
    }
    Err(format!("no memory table landed on {master} in {} tries", servers + 1))
}

/// Writes a segment and a half of large values into `memory_table` (on the flash table's
/// master): the segment that held the last flash objects is then closed, so it can be demoted.
pub async fn close_head_segment(
    client: &Client,
    memory_table: TableId,
    segment_bytes: u64,
) -> Result<(), String> {
    let (values, value_bytes) = filler_values(segment_bytes);
    let value = vec![0xf1_u8; value_bytes as usize];
    for index in 0..values {
        let key = filler_key(index);
        client
            .write(memory_table, key.as_bytes(), &value)
            .await
            .map_err(|error| format!("writing the filler: {error}"))?;
    }
    Ok(())
}

/// How many filler values [`close_head_segment`] writes, and their size.
fn filler_values(segment_bytes: u64) -> (u64, u64) {
    let value_bytes = FILLER_VALUE_BYTES_MAX.min(segment_bytes / 16).max(1);
    ((segment_bytes * 3 / 2).div_ceil(value_bytes), value_bytes)
}

fn filler_key(index: u64) -> String {
    format!("filler-{index}")
}

/// Removes what [`close_head_segment`] wrote.
pub async fn remove_filler(
    client: &Client,
    memory_table: TableId,
    segment_bytes: u64,
) -> Result<(), String> {
    for index in 0..filler_values(segment_bytes).0 {
        client
            .remove(memory_table, filler_key(index).as_bytes())
            .await
            .map_err(|error| format!("removing the filler: {error}"))?;
    }
    Ok(())
}

/// Waits until the servers' demoted-object count is `before.objects_demoted + objects`; gives
/// up when it stops growing for [`DEMOTION_STALL_PATIENCE`]. Returns the figures then.
pub fn wait_for_demotion(
    servers: &[String],
    before: &FlashFigures,
    objects: u64,
) -> Result<FlashFigures, String> {
    let target = before.objects_demoted + objects as f64;
    let mut last = flash_figures(servers)?;
    let mut last_growth = Instant::now();
    loop {
        if last.objects_demoted >= target {
            return Ok(last);
        }
        if last_growth.elapsed() > DEMOTION_STALL_PATIENCE {
            return Err(format!(
                "demotion stalled: {} of {objects} objects demoted (images refused: {}), after \
                 {} s without progress",
                last.objects_demoted - before.objects_demoted,
                last.images_refused - before.images_refused,
                DEMOTION_STALL_PATIENCE.as_secs()
            ));
        }
        std::thread::sleep(POLL_INTERVAL);
        let now = flash_figures(servers)?;
        if now.objects_demoted > last.objects_demoted {
            last_growth = Instant::now();
        }
        last = now;
    }
}
