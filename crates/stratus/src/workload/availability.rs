//! `stratus workload --availability-out FILE`: when each operation ran and which master owned
//! its key, for a fault harness to measure how long operations on servers it did not touch
//! waited (tests/containers/run.py bounds it; issue 27).
//!
//! Every operation of the mixed phase (register keys; counter steps are left out) is timed by
//! the wall clock, which the harness shares (same kernel), and the table's tablet map is
//! sampled every [`OWNER_SAMPLE_INTERVAL`]. An operation's owner is the one the last sample
//! before its start names: after a recovery moves a key, operations started before the next
//! sample are attributed to the failed master, which only takes them out of the bounded group.
//!
//! The file, one line per operation, ordered by start:
//! `<start µs since the Unix epoch> <end µs> <key index> <owner address, or - if unknown>`.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use stratus_client::{Client, TableId};
use stratus_types::{key_hash, HashRange};

/// How often the owners of the table's tablets are sampled.
pub const OWNER_SAMPLE_INTERVAL: Duration = Duration::from_millis(200);

/// Samples kept at most (a mixed phase of an hour at the interval above); later ones are
/// dropped, and their operations' owners come from the last one kept.
const OWNER_SAMPLES_MAX: usize = 18_000;

/// Operations timed per client at most; later ones are not timed (the file says how many
/// were left out).
pub const TIMED_OPERATIONS_PER_CLIENT_MAX: usize = 1 << 20;

/// Microseconds since the Unix epoch, by the wall clock.
pub fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// One timed operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed {
    pub start_micros: u64,
    pub end_micros: u64,
    pub key_index: u32,
}

/// The tablets' owners at one instant.
#[derive(Clone, Debug)]
struct OwnerSample {
    at_micros: u64,
    tablets: Vec<(HashRange, String)>,
}

/// Owner samples taken until stopped.
#[derive(Debug, Default)]
pub struct Owners {
    samples: Vec<OwnerSample>,
}

impl Owners {
    /// Samples `table`'s owners through `client` every [`OWNER_SAMPLE_INTERVAL`] until `stop`.
    /// A failed sample is skipped (the coordinator may be the failed server).
    pub async fn sample_until(client: Client, table: TableId, stop: Arc<AtomicBool>) -> Owners {
        let mut owners = Owners::default();
        while !stop.load(Ordering::Relaxed) {
            let at_micros = wall_micros();
            if let Ok(tablets) = client.tablet_map(table).await {
                if owners.samples.len() < OWNER_SAMPLES_MAX {
                    let tablets =
                        tablets.into_iter().map(|tablet| (tablet.range, tablet.owner_address));
                    owners.samples.push(OwnerSample { at_micros, tablets: tablets.collect() });
                }
            }
            tokio::time::sleep(OWNER_SAMPLE_INTERVAL).await;
        }
        owners
    }

    /// The owner of `key` by the last sample taken at or before `at_micros`.
    fn owner_at(&self, table: TableId, key: &[u8], at_micros: u64) -> Option<&str> {
        let taken = self.samples.partition_point(|sample| sample.at_micros <= at_micros);
        let sample = self.samples.get(taken.checked_sub(1)?)?;
        let hash = key_hash(table, key);
        sample
            .tablets
            .iter()
            .find(|(range, _)| range.contains(hash))
            .map(|(_, owner)| owner.as_str())
    }
}

/// Writes the availability file (format in the module comment).
pub fn write(
    path: &Path,
    table: TableId,
    key_name: &dyn Fn(u32) -> Vec<u8>,
    mut timed: Vec<Timed>,
    left_out: u64,
    owners: &Owners,
) -> std::io::Result<()> {
    timed.sort_by_key(|operation| operation.start_micros);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "# start_us end_us key_index owner (operations not timed: {left_out})")?;
    for operation in timed {
        let key = key_name(operation.key_index);
        let owner = owners.owner_at(table, &key, operation.start_micros).unwrap_or("-");
        writeln!(
            out,
            "{} {} {} {owner}",
            operation.start_micros, operation.end_micros, operation.key_index
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_is_attributed_to_the_owner_of_the_last_sample_before_it() {
        let table = TableId(7);
        let key = b"key-00001".to_vec();
        let whole = HashRange { start: 0, end: u64::MAX };
        let owners = Owners {
            samples: vec![
                OwnerSample { at_micros: 100, tablets: vec![(whole, "a:1".to_string())] },
                OwnerSample { at_micros: 200, tablets: vec![(whole, "b:1".to_string())] },
            ],
        };
        assert_eq!(owners.owner_at(table, &key, 99), None, "before any sample");
        assert_eq!(owners.owner_at(table, &key, 100), Some("a:1"));
        assert_eq!(owners.owner_at(table, &key, 199), Some("a:1"));
        assert_eq!(owners.owner_at(table, &key, 5_000), Some("b:1"));

        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("availability.txt");
        let timed = vec![
            Timed { start_micros: 250, end_micros: 300, key_index: 1 },
            Timed { start_micros: 150, end_micros: 900, key_index: 1 },
        ];
        let name = |index: u32| format!("key-{index:05}").into_bytes();
        write(&path, table, &name, timed, 3, &owners).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# start_us end_us key_index owner (operations not timed: 3)");
        assert_eq!(&lines[1..], ["150 900 1 a:1", "250 300 1 b:1"]);
    }
}
