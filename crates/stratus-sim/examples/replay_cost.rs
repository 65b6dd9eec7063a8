//! What replaying a crashed master's log costs on this machine, per object and per byte: the
//! calibration of the recovery model (`stratus_sim::recovery_model`, docs/design/simulation.md,
//! "Recovery model").
//!
//!   cargo run --release -p stratus-sim --example replay_cost -- 128
//!
//! For values of 100, 1 000 and 10 000 bytes, fills a store with about that many MiB of objects,
//! takes its segments as a backup would hold them, and times what a recovery master does with
//! them on one core: verify each replica (checksums) and replay them all into an empty store,
//! timed in the thread's processor time (the machine's other work does not count). Each size
//! runs five times (the fastest counts); then a least-squares fit of
//! time = a · objects + b · bytes over the sizes.

use std::time::Duration;

use rustix::time::{clock_gettime, ClockId};

use stratus_log::{verify_replica, Certificate};
use stratus_store::{Expiry, ObjectStore, StoreConfig, WallTime};
use stratus_types::{key_hash, RejectRules, SegmentId, ServerId, TableId};

const TABLE: TableId = TableId(1);
const SEGMENT_BYTES: u32 = 8 << 20;
const NOW: WallTime = WallTime::from_seconds(1_767_225_600);

fn store(log_bytes: u64, log_id: u64) -> ObjectStore {
    let config = StoreConfig {
        segment_bytes: SEGMENT_BYTES,
        prefault_memory: true,
        ..StoreConfig::with_log_bytes(log_bytes)
    };
    ObjectStore::new(config, ServerId(log_id)).expect("store configuration")
}

/// A crashed master's segments: `mib` MiB of objects with values of `value_bytes`.
fn crashed_log(mib: u64, value_bytes: usize) -> (Vec<Replica>, u64) {
    let source = store((mib << 20) * 2 + (64 << 20), 7);
    let value = vec![7u8; value_bytes];
    let objects = (mib << 20) / (value_bytes as u64 + 8);
    for index in 0..objects {
        let key = index.to_le_bytes();
        let hash = key_hash(TABLE, &key);
        source
            .write(TABLE, &key, hash, &value, &RejectRules::NONE, Expiry::Never, NOW)
            .expect("the source log has room");
    }
    let log = source.log();
    let segments = log
        .segment_ids()
        .into_iter()
        .filter_map(|segment_id| {
            let (contents, certificate) = log.segment_contents(segment_id)?;
            Some(Replica { segment_id, contents, certificate })
        })
        .collect();
    (segments, objects)
}

/// One replica of the crashed log, as a backup holds it.
struct Replica {
    segment_id: SegmentId,
    contents: Vec<u8>,
    certificate: Certificate,
}

/// This thread's processor time: what the work costs a core, whatever else the machine runs
/// (the development machine's two cores are shared).
fn thread_cpu() -> Duration {
    let now = clock_gettime(ClockId::ThreadCPUTime);
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// One recovery master's work on `segments`: verify each, replay all. Returns its processor
/// time.
fn recover(segments: &[Replica], bytes: u64) -> Duration {
    let target = store(bytes * 2 + (64 << 20), 9);
    let started = thread_cpu();
    for replica in segments {
        verify_replica(&replica.contents, &replica.certificate, ServerId(7), replica.segment_id)
            .expect("a replica of the source log verifies");
    }
    let borrowed: Vec<(&[u8], Certificate)> =
        segments.iter().map(|replica| (&replica.contents[..], replica.certificate)).collect();
    target.replay(&borrowed, &|_, _| true, NOW).expect("replay");
    thread_cpu() - started
}

fn main() {
    let mib: u64 = std::env::args().nth(1).and_then(|arg| arg.parse().ok()).unwrap_or(128);
    let mut runs: Vec<(f64, f64, f64)> = Vec::new();
    println!("value_bytes  objects  replica_bytes  cpu_seconds  ns_per_byte  ns_per_object");
    for value_bytes in [100usize, 1_000, 10_000] {
        let (segments, objects) = crashed_log(mib, value_bytes);
        let bytes: u64 = segments.iter().map(|replica| replica.contents.len() as u64).sum();
        let fastest = (0..5).map(|_| recover(&segments, bytes)).min().expect("three runs");
        let seconds = fastest.as_secs_f64();
        println!(
            "{value_bytes:>11}  {objects:>7}  {bytes:>13}  {seconds:>11.3}  {:>11.3}  {:>13.1}",
            seconds * 1e9 / bytes as f64,
            seconds * 1e9 / objects as f64
        );
        runs.push((objects as f64, bytes as f64, seconds));
    }
    // Least squares of seconds = a · objects + b · bytes (no constant).
    let (mut oo, mut ob, mut bb, mut ot, mut bt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(objects, bytes, seconds) in &runs {
        oo += objects * objects;
        ob += objects * bytes;
        bb += bytes * bytes;
        ot += objects * seconds;
        bt += bytes * seconds;
    }
    let determinant = oo * bb - ob * ob;
    let per_object = (ot * bb - bt * ob) / determinant;
    let per_byte = (oo * bt - ob * ot) / determinant;
    println!(
        "{{\"measure\":\"replay_cost\",\"mib\":{mib},\"ns_per_object\":{:.1},\"ns_per_byte\":{:.3}}}",
        per_object * 1e9,
        per_byte * 1e9
    );
}
