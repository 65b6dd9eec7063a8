//! The redis-lru row: Redis as a cache of the same DRAM budget (`maxmemory` = the auto
//! server's budget, `allkeys-lru`), loaded with the same records (each key's 1 000 bytes of
//! fields as one string, as Stratus keeps a record as one object), then asked how many keys it
//! still holds; and every key of the auto table read back, counted.

use std::sync::atomic::{AtomicU64, Ordering};

use stratus_resp::Value;

use super::systems::{AutoFigures, LoadedServer};
use super::{line, Sizes, TieringArguments};
use crate::peers::start_redis_evicting;
use crate::report::{print_json, Field};
use crate::resp_client::RespConnection;
use crate::ycsb::generators::{key_name, random_field, Random, FIELD_COUNT};
use crate::ycsb::measure::Outcome;

/// SETs per pipelined batch.
const BATCH_KEYS: u64 = 100;
/// Seeds the values written to Redis.
const SEED: u64 = 0x006c_7275;

/// Runs the row.
pub(super) fn run(
    arguments: &TieringArguments,
    sizes: &Sizes,
    auto: &LoadedServer,
) -> Result<(), String> {
    let budget_bytes = arguments.auto_dram_mib << 20;
    let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
    let redis = start_redis_evicting(directory.path(), budget_bytes)?;
    let mut connection = redis.connect()?;
    load_redis(&mut connection, sizes.records)?;
    let kept = match connection.call(&[b"DBSIZE"])? {
        Value::Integer(keys) => u64::try_from(keys).unwrap_or(0),
        other => return Err(format!("DBSIZE answered {other:?}")),
    };
    let stats = info(&mut connection, "stats")?;
    let memory = info(&mut connection, "memory")?;
    let evicted = info_field(&stats, "evicted_keys").unwrap_or(f64::NAN);
    let used_memory = info_field(&memory, "used_memory").unwrap_or(f64::NAN);
    let stratus_kept = read_every_key(arguments, sizes, auto)?;
    let figures = AutoFigures::scrape(auto.cluster.server_metrics())?;
    let records = sizes.records as f64;
    let lost = |kept: u64| 1.0 - kept as f64 / records;
    line(
        "redis-lru",
        &format!("{} MiB", arguments.auto_dram_mib),
        &format!("keys kept of {} (reference: Redis allkeys-lru)", sizes.records),
        &stratus_kept.to_string(),
        &kept.to_string(),
        &format!("lost {:.3} vs {:.3}", lost(stratus_kept), lost(kept)),
        "lose 0",
    );
    let common = |system: &str| {
        vec![
            ("bench", Field::Text("tiering".into())),
            ("row", Field::Text("redis-lru".into())),
            ("system", Field::Text(system.into())),
            ("records", Field::Number(records)),
            ("dram_budget_bytes", Field::Number(budget_bytes as f64)),
        ]
    };
    let mut redis_row = common("redis");
    redis_row.extend([
        ("keys_kept", Field::Number(kept as f64)),
        ("lost_fraction", Field::Number(lost(kept))),
        ("evicted_keys", Field::Number(evicted)),
        ("used_memory_bytes", Field::Number(used_memory)),
        ("maxmemory_policy", Field::Text("allkeys-lru".into())),
    ]);
    print_json(&redis_row);
    let mut stratus_row = common("stratus");
    stratus_row.extend([
        ("keys_kept", Field::Number(stratus_kept as f64)),
        ("lost_fraction", Field::Number(lost(stratus_kept))),
        ("dram_objects", Field::Number(figures.dram_objects)),
        ("flash_objects", Field::Number(figures.flash_objects)),
        ("dram_bytes", Field::Number(figures.dram_bytes)),
        ("flash_bytes", Field::Number(figures.flash_bytes)),
        ("demotions_total", Field::Number(figures.demotions)),
        ("promotions_total", Field::Number(figures.promotions)),
    ]);
    print_json(&stratus_row);
    Ok(())
}

/// SETs every record's key to 1 000 bytes of fields, [`BATCH_KEYS`] to a round trip.
fn load_redis(connection: &mut RespConnection, records: u64) -> Result<(), String> {
    let mut random = Random::new(SEED);
    let mut next = 0;
    while next < records {
        let end = (next + BATCH_KEYS).min(records);
        let batch: Vec<(String, Vec<u8>)> = (next..end)
            .map(|keynum| {
                let value = (0..FIELD_COUNT).flat_map(|_| random_field(&mut random)).collect();
                (key_name(keynum), value)
            })
            .collect();
        let commands: Vec<Vec<&[u8]>> = batch
            .iter()
            .map(|(key, value)| vec![&b"SET"[..], key.as_bytes(), value.as_slice()])
            .collect();
        for reply in connection.call_pipelined(&commands)? {
            if let Value::Error(message) = reply {
                return Err(format!("Redis refused a SET: {message}"));
            }
        }
        next = end;
    }
    Ok(())
}

/// The text of `INFO section`.
fn info(connection: &mut RespConnection, section: &str) -> Result<String, String> {
    match connection.call(&[b"INFO", section.as_bytes()])? {
        Value::BulkString(text) => Ok(String::from_utf8_lossy(&text).into_owned()),
        other => Err(format!("INFO {section} answered {other:?}")),
    }
}

/// A numeric `name:value` line of an INFO text.
fn info_field(info: &str, name: &str) -> Option<f64> {
    info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')?.trim().parse().ok())
}

/// Reads every record of the auto table, `--threads` readers each taking every n-th key;
/// returns how many were found.
fn read_every_key(
    arguments: &TieringArguments,
    sizes: &Sizes,
    auto: &LoadedServer,
) -> Result<u64, String> {
    let found = AtomicU64::new(0);
    let threads = u64::from(arguments.threads);
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..threads)
            .map(|thread| {
                let found = &found;
                scope.spawn(move || -> Result<(), String> {
                    let mut database = auto.running.connect()?;
                    for keynum in (thread..sizes.records).step_by(threads as usize) {
                        if database.read(&key_name(keynum))? == Outcome::Ok {
                            found.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|reader| reader.join().unwrap_or_else(|_| Err("a reader panicked".into())))
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(found.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_info_field_is_read_by_its_whole_name() {
        let info = "# Stats\r\nevicted_keys:42\r\nevicted_keys_total:7\r\nused_memory:1.5e3\r\n";
        assert_eq!(info_field(info, "evicted_keys"), Some(42.0));
        assert_eq!(info_field(info, "used_memory"), Some(1500.0));
        assert_eq!(info_field(info, "evicted"), None);
    }
}
