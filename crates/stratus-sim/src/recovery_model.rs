//! How long a recovery takes at production sizes: the simulator's measurements completed by
//! this machine's.
//!
//! The simulator runs the production code in virtual time, where work costs nothing: a
//! recovery master replays its partition in no simulated time, so a simulated recovery's
//! length is its failure detection and its coordination (the RPCs' latencies, the waits, the
//! plan), whatever the data. This model adds the data's cost back, phase by phase, for the
//! busiest recovery master of a plan, as the recovery master's code runs them
//! (stratus-master's recovery.rs): it reads every segment's share of its partition first, then
//! replays them, the side segments being replicated as they fill, and answers once the last
//! one is durable.
//!
//! - read: the partition's bytes over the network into the recovery master, or the backups'
//!   disks reading the crashed log (each backup its share of the primaries, once, in
//!   parallel), whichever is slower;
//! - replay: per object and per byte, on one core (`examples/replay_cost.rs` measures both,
//!   checksum verification included, on this machine);
//! - replicate: R copies of the replayed bytes out over the network, overlapping the replay;
//!   the last side segment's copies after it.
//!
//! The costs are this machine's (a release build); the network's bandwidth is assumed (this
//! machine has none between servers), and given with every estimate.

use std::time::Duration;

/// What the work of a recovery costs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecoveryCosts {
    /// Replaying one object (hash table lookup and insert, version check, entry header).
    pub replay_nanos_per_object: f64,
    /// Replaying one byte (copy), its checksum verified when read included.
    pub replay_nanos_per_byte: f64,
    /// A backup's disk, reading replicas sequentially.
    pub disk_bytes_per_second: f64,
    /// One server's network link, each way.
    pub network_bytes_per_second: f64,
}

impl RecoveryCosts {
    /// Measured on the 2-core development machine (docs/design/simulation.md, "Recovery
    /// model"): replay by `examples/replay_cost.rs` (the better of two fits: 1.65 µs per object
    /// and 0.86 ns per byte, in processor time, the machine loaded), the disk by `dd` with
    /// O_DIRECT (1.0–1.5 GB/s); the network assumed 10 Gb/s.
    pub const DEVELOPMENT_MACHINE: RecoveryCosts = RecoveryCosts {
        replay_nanos_per_object: 1_650.0,
        replay_nanos_per_byte: 0.86,
        disk_bytes_per_second: 1.0e9,
        network_bytes_per_second: 1.25e9,
    };
}

/// What is recovered, by how many, and what the simulator measured of it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecoveryShape {
    /// The crashed master's live data, in bytes (its replicas' bytes: entries with headers).
    pub bytes: f64,
    /// Its objects.
    pub objects: f64,
    /// Servers left (each a backup and a possible recovery master).
    pub survivors: u32,
    /// Recovery masters the plan uses.
    pub recovery_masters: u32,
    /// Replicas of every segment.
    pub replicas: u32,
    /// The plan's busiest recovery master over the mean, in bytes and objects (1: even).
    pub imbalance: f64,
    /// Segment size, bytes (the last side segment is replicated after the replay).
    pub segment_bytes: f64,
    /// From the crash to its declaration (simulated).
    pub detection: Duration,
    /// From the declaration to every tablet served, with no data (simulated: the
    /// coordinator's and the masters' RPCs and waits).
    pub coordination: Duration,
}

/// A recovery's length, phase by phase, for the busiest recovery master.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecoveryEstimate {
    /// From the crash to its declaration.
    pub detection: Duration,
    /// The coordination, as simulated.
    pub coordination: Duration,
    /// Reading the partition.
    pub read: Duration,
    /// Replaying it.
    pub replay: Duration,
    /// Replicating it (overlapping the replay, but for the last segment).
    pub replicate: Duration,
}

impl RecoveryEstimate {
    /// From the declaration to every tablet served.
    pub fn from_declaration(&self) -> Duration {
        self.coordination + self.read + self.replay.max(self.replicate)
    }

    /// From the crash to every tablet served.
    pub fn from_crash(&self) -> Duration {
        self.detection + self.from_declaration()
    }
}

/// The model (see the module's comment).
pub fn estimate(shape: &RecoveryShape, costs: &RecoveryCosts) -> RecoveryEstimate {
    let masters = f64::from(shape.recovery_masters.max(1));
    let part_bytes = shape.bytes / masters * shape.imbalance;
    let part_objects = shape.objects / masters * shape.imbalance;
    let seconds = Duration::from_secs_f64;
    let network_in = part_bytes / costs.network_bytes_per_second;
    let per_backup = shape.bytes / f64::from(shape.survivors.max(1));
    let disk = per_backup / costs.disk_bytes_per_second;
    let network_out = per_backup / costs.network_bytes_per_second;
    let replay = (part_objects * costs.replay_nanos_per_object
        + part_bytes * costs.replay_nanos_per_byte)
        / 1e9;
    let replicas = f64::from(shape.replicas);
    let replicate = replicas * part_bytes / costs.network_bytes_per_second;
    let last_segment =
        replicas * shape.segment_bytes.min(part_bytes) / costs.network_bytes_per_second;
    RecoveryEstimate {
        detection: shape.detection,
        coordination: shape.coordination,
        read: seconds(network_in.max(disk).max(network_out)),
        replay: seconds(replay + last_segment),
        replicate: seconds(replicate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(bytes: f64, survivors: u32, recovery_masters: u32) -> RecoveryShape {
        RecoveryShape {
            bytes,
            objects: bytes / 1_000.0,
            survivors,
            recovery_masters,
            replicas: 3,
            imbalance: 1.0,
            segment_bytes: 8.0 * 1024.0 * 1024.0,
            detection: Duration::from_secs(1),
            coordination: Duration::from_millis(300),
        }
    }

    #[test]
    fn more_recovery_masters_recover_faster_and_the_phases_add_up() {
        let costs = RecoveryCosts::DEVELOPMENT_MACHINE;
        let few = estimate(&shape(35e9, 999, 64), &costs);
        let many = estimate(&shape(35e9, 999, 640), &costs);
        assert!(many.from_crash() < few.from_crash());
        assert_eq!(
            few.from_crash(),
            few.detection + few.coordination + few.read + few.replay.max(few.replicate)
        );
    }

    #[test]
    fn a_partition_costs_its_bytes_over_the_network_and_its_objects_on_a_core() {
        // 1 GB of 1 KB objects on one recovery master, one survivor: 1 s to read it from the
        // disk, 1 M objects at 1.65 µs plus 1 GB at 0.86 ns to replay (and a segment's
        // copies), 2.4 s to replicate.
        let costs = RecoveryCosts::DEVELOPMENT_MACHINE;
        let estimate = estimate(&shape(1e9, 1, 1), &costs);
        assert!((estimate.read.as_secs_f64() - 1.0).abs() < 1e-9, "{estimate:?}");
        let replay = 1.65 + 0.86 + 3.0 * 8.0 * 1024.0 * 1024.0 / 1.25e9;
        assert!((estimate.replay.as_secs_f64() - replay).abs() < 1e-6, "{estimate:?}");
        assert!((estimate.replicate.as_secs_f64() - 2.4).abs() < 1e-9, "{estimate:?}");
    }
}
