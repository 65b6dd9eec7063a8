//! The seeded fault schedule: which faults happen to which node, and when.

use std::fmt;
use std::time::Duration;

pub use crate::flash::FlashFault;

/// Every choice of a simulation comes from one of these (SplitMix64), seeded from the run's
/// seed, so a run is a function of its seed.
pub use stratus_history::workload::Choices;

/// A duration in `low..high` milliseconds.
fn millis(choices: &mut Choices, low: u64, high: u64) -> Duration {
    Duration::from_millis(low + choices.below(high.saturating_sub(low)))
}

/// True with probability `percent` / 100.
pub fn percent(choices: &mut Choices, percent: u64) -> bool {
    choices.below(100) < percent
}

/// One fault. Each lasts a while and then heals (a crashed node is restarted on the disk the
/// crash left); the schedule never has two at once, and leaves time between them to heal
/// (recovery, re-replication), so the cluster is never asked to survive more than it promises:
/// R − 1 lost copies of any segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The server's process dies (its memory and unsynced disk writes with it) and is started
    /// again after `down_for`, on the same disk, as a new server; with `flip_bit`, one bit of
    /// its disk is flipped while it is down.
    CrashServer {
        /// Index of the server (0-based).
        server: usize,
        /// How long it stays down.
        down_for: Duration,
        /// Whether a bit of its disk rots while it is down.
        flip_bit: bool,
    },
    /// The coordinator's process dies and is started again on its durable metadata.
    CrashCoordinator {
        /// How long it stays down.
        down_for: Duration,
    },
    /// Every link of the server drops everything for `heal_after` (its TCP streams stall for
    /// good); a server the coordinator declared crashed meanwhile stops itself and is started
    /// again once the partition heals.
    PartitionServer {
        /// Index of the server.
        server: usize,
        /// How long the partition lasts.
        heal_after: Duration,
    },
    /// Like `PartitionServer`, in one direction only: the server's messages are dropped
    /// (`outbound`) or the messages to it are, while the other direction works. A server whose
    /// lease renewals arrive but whose answers do not must still lose its lease.
    PartitionServerOneWay {
        /// Index of the server.
        server: usize,
        /// How long the partition lasts.
        heal_after: Duration,
        /// True: what the server sends is dropped; false: what it receives.
        outbound: bool,
    },
    /// Two servers crash, the second `gap` after the first (0: together; otherwise most likely
    /// while the first one's recovery runs, so the second may be one of its recovery masters
    /// or backups); both restart `down_for` after the second. Only drawn with 3 or more
    /// replicas, where two lost copies of a segment leave one.
    CrashTwoServers {
        /// Index of the first server.
        first: usize,
        /// Index of the second server (not the first).
        second: usize,
        /// Time between the two crashes.
        gap: Duration,
        /// How long both stay down after the second crash.
        down_for: Duration,
    },
    /// Every link of the server holds its messages for `release_after`, then delivers them: a
    /// long pause (a stalled network or a stopped process, as the others see it).
    StallServer {
        /// Index of the server.
        server: usize,
        /// How long messages are held.
        release_after: Duration,
    },
    /// The server's disk fails its next syncs; the backup must stop acknowledging, and is
    /// restarted (crash and start) by the operator after `restart_after`.
    FailSyncs {
        /// Index of the server.
        server: usize,
        /// When the operator restarts it.
        restart_after: Duration,
    },
    /// The server's disk fails its next writes (a full disk: ENOSPC); the backup must stop
    /// acknowledging, and is restarted by the operator after `restart_after`.
    FailWrites {
        /// Index of the server.
        server: usize,
        /// When the operator restarts it.
        restart_after: Duration,
    },
    /// One bit of the running server's disk flips (a latent sector error): a replica read from
    /// it later (by a recovery) must fail its checksums and another replica be used.
    RotBit {
        /// Index of the server.
        server: usize,
    },
    /// (With `SimulationOptions::tiering` only.) Armed at `at`: the first master whose store
    /// does `on` (a demotion, a promotion, a value read from flash) crashes as `CrashServer`
    /// does right after that step of the simulation, so its process dies in the millisecond
    /// of the move, before the replicas of what it just appended (a promoted copy) could
    /// catch up; if no master does within `armed_for`, `server` crashes then anyway
    /// (`SimulationReport::tiering` counts both). It restarts `down_for` after the crash.
    CrashServerAtTierMove {
        /// Index of the server crashed if no master moves in time.
        server: usize,
        /// What it must have just done.
        on: TierMove,
        /// Longest wait for it.
        armed_for: Duration,
        /// How long it stays down.
        down_for: Duration,
    },
    /// (With `SimulationOptions::tiering` only.) The server's flash refuses image writes
    /// (full, or I/O errors) or fails every read (module `flash`), until it heals.
    FailFlash {
        /// Index of the server.
        server: usize,
        /// What the flash does.
        fault: FlashFault,
        /// How long it lasts.
        heal_after: Duration,
    },
}

/// What a master's store does between tiers, as `Fault::CrashServerAtTierMove` waits for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TierMove {
    /// A segment imaged on flash and compacted (`FlashTotals::demotions`).
    Demotion,
    /// An auto object read from flash and appended back into the log
    /// (`AutoStatistics::promotions`).
    Promotion,
    /// A value of a flash or auto object read back from an image for a request.
    FlashRead,
}

impl Fault {
    /// How long the fault lasts before it heals.
    pub fn duration(&self) -> Duration {
        match *self {
            Fault::CrashServer { down_for, .. } | Fault::CrashCoordinator { down_for } => down_for,
            Fault::PartitionServer { heal_after, .. }
            | Fault::PartitionServerOneWay { heal_after, .. } => heal_after,
            Fault::CrashTwoServers { gap, down_for, .. } => gap + down_for,
            Fault::StallServer { release_after, .. } => release_after,
            Fault::FailSyncs { restart_after, .. } | Fault::FailWrites { restart_after, .. } => {
                restart_after
            }
            Fault::RotBit { .. } => Duration::ZERO,
            Fault::CrashServerAtTierMove { armed_for, down_for, .. } => armed_for + down_for,
            Fault::FailFlash { heal_after, .. } => heal_after,
        }
    }
}

/// A fault and when it begins (simulated time since the start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledFault {
    /// When it begins.
    pub at: Duration,
    /// What happens.
    pub fault: Fault,
}

impl fmt::Display for ScheduledFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {:>6} ms: {:?}", self.at.as_millis(), self.fault)
    }
}

/// Time after a crash heals (the node restarted) before the next fault: recovery of a
/// crashed master takes about a second in simulation, re-replication of a lost backup's
/// replicas a few holder-check intervals.
const HEAL_TIME_AFTER_CRASH: Duration = Duration::from_millis(4_000);
/// Time after a stall or a coordinator restart before the next fault.
const HEAL_TIME_AFTER_BLIP: Duration = Duration::from_millis(1_500);

/// Faults from `choices`, beginning within `window` (none in its first half second, while the
/// cluster forms), for a cluster of `servers` servers with `replicas` replicas per segment.
pub fn generate(
    choices: &mut Choices,
    servers: usize,
    replicas: usize,
    window: Duration,
) -> Vec<ScheduledFault> {
    let mut faults = Vec::new();
    let mut at = millis(choices, 500, 2_000);
    while at < window {
        let server = choices.below(servers as u64) as usize;
        let roll = choices.below(100);
        let fault = common_fault(choices, server, servers, replicas, roll);
        let next = at + fault.duration() + heal_time(&fault) + millis(choices, 0, 1_000);
        faults.push(ScheduledFault { at, fault });
        at = next;
    }
    faults
}

/// The fault `roll` (0..100) draws for `server`, with the further choices it needs: the draws
/// of [`generate`], in its order, so every seed's schedule stays what it was.
fn common_fault(
    choices: &mut Choices,
    server: usize,
    servers: usize,
    replicas: usize,
    roll: u64,
) -> Fault {
    match roll {
        0..=24 => Fault::CrashServer {
            server,
            down_for: millis(choices, 100, 3_000),
            flip_bit: percent(choices, 30),
        },
        25..=34 if replicas >= 3 => Fault::CrashTwoServers {
            first: server,
            second: (server + 1 + choices.below(servers as u64 - 1) as usize) % servers,
            gap: if percent(choices, 30) { Duration::ZERO } else { millis(choices, 1, 1_500) },
            down_for: millis(choices, 100, 3_000),
        },
        25..=34 => Fault::PartitionServerOneWay {
            server,
            heal_after: millis(choices, 100, 3_000),
            outbound: percent(choices, 50),
        },
        35..=44 => Fault::CrashCoordinator { down_for: millis(choices, 50, 2_000) },
        45..=59 => Fault::PartitionServer { server, heal_after: millis(choices, 100, 3_000) },
        60..=69 => Fault::PartitionServerOneWay {
            server,
            heal_after: millis(choices, 100, 3_000),
            outbound: percent(choices, 50),
        },
        70..=84 => Fault::StallServer { server, release_after: millis(choices, 50, 1_500) },
        85..=89 => Fault::RotBit { server },
        90..=94 => Fault::FailSyncs { server, restart_after: millis(choices, 200, 2_000) },
        _ => Fault::FailWrites { server, restart_after: millis(choices, 200, 2_000) },
    }
}

/// Time after `fault` heals before the next one begins.
fn heal_time(fault: &Fault) -> Duration {
    match fault {
        Fault::CrashServer { .. }
        | Fault::CrashTwoServers { .. }
        | Fault::PartitionServer { .. }
        | Fault::PartitionServerOneWay { .. }
        | Fault::FailSyncs { .. }
        | Fault::FailWrites { .. }
        | Fault::CrashServerAtTierMove { .. } => HEAL_TIME_AFTER_CRASH,
        // A flash fault loses no copy, but a read fault holds up re-replication from images.
        Fault::CrashCoordinator { .. }
        | Fault::StallServer { .. }
        | Fault::RotBit { .. }
        | Fault::FailFlash { .. } => HEAL_TIME_AFTER_BLIP,
    }
}

/// Faults for a run whose table is on flash or auto (`SimulationOptions::tiering`), drawn as
/// [`generate`] draws them, one at a time with time to heal between them, but half of them
/// about the tiers: a crash timed at a demotion, a promotion (auto tables only: flash tables
/// promote nothing, so a value read from flash instead) or a read from flash, a flash that
/// refuses writes (full, or I/O errors) or fails reads; the other half is drawn from
/// [`generate`]'s kinds.
pub fn generate_tiered(
    choices: &mut Choices,
    servers: usize,
    replicas: usize,
    window: Duration,
    promotions: bool,
) -> Vec<ScheduledFault> {
    let mut faults = Vec::new();
    let mut at = millis(choices, 500, 2_000);
    while at < window {
        let server = choices.below(servers as u64) as usize;
        let fault = match choices.below(100) {
            0..=29 => {
                let on = match choices.below(3) {
                    0 => TierMove::Demotion,
                    1 if promotions => TierMove::Promotion,
                    _ => TierMove::FlashRead,
                };
                Fault::CrashServerAtTierMove {
                    server,
                    on,
                    armed_for: Duration::from_millis(6_000),
                    down_for: millis(choices, 100, 3_000),
                }
            }
            30..=49 => {
                let fault = match choices.below(3) {
                    0 => FlashFault::Full,
                    1 => FlashFault::WriteErrors,
                    _ => FlashFault::ReadErrors,
                };
                Fault::FailFlash { server, fault, heal_after: millis(choices, 100, 2_000) }
            }
            roll => common_fault(choices, server, servers, replicas, (roll - 50) * 2),
        };
        let next = at + fault.duration() + heal_time(&fault) + millis(choices, 0, 1_000);
        faults.push(ScheduledFault { at, fault });
        at = next;
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_a_function_of_its_seed_and_faults_never_overlap() {
        let window = Duration::from_secs(30);
        for seed in 0..200 {
            let first = generate(&mut Choices::new(seed), 5, 3, window);
            assert_eq!(first, generate(&mut Choices::new(seed), 5, 3, window));
            for pair in first.windows(2) {
                assert!(pair[0].at + pair[0].fault.duration() < pair[1].at);
            }
            assert!(first.iter().all(|fault| fault.at < window));
        }
        let kinds: std::collections::BTreeSet<String> = (0..200)
            .flat_map(|seed| generate(&mut Choices::new(seed), 5, 3, window))
            .map(|fault| {
                format!("{:?}", fault.fault).split_whitespace().next().unwrap().to_string()
            })
            .collect();
        assert_eq!(kinds.len(), 9, "every kind of fault is drawn: {kinds:?}");
    }

    #[test]
    fn a_tiered_schedule_draws_tier_faults_and_faults_never_overlap() {
        let window = Duration::from_secs(18);
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..200 {
            let first = generate_tiered(&mut Choices::new(seed), 5, 2, window, true);
            assert_eq!(first, generate_tiered(&mut Choices::new(seed), 5, 2, window, true));
            for pair in first.windows(2) {
                assert!(pair[0].at + pair[0].fault.duration() < pair[1].at);
            }
            for scheduled in &first {
                match scheduled.fault {
                    Fault::CrashServerAtTierMove { on, .. } => kinds.insert(format!("{on:?}")),
                    Fault::FailFlash { fault, .. } => kinds.insert(format!("{fault:?}")),
                    _ => kinds.insert("other".to_string()),
                };
            }
        }
        assert_eq!(kinds.len(), 7, "every tier fault and others are drawn: {kinds:?}");
        // Flash tables promote nothing: no crash waits for a promotion.
        let flash = generate_tiered(&mut Choices::new(3), 5, 2, window, false);
        assert!(flash.iter().all(|scheduled| !matches!(
            scheduled.fault,
            Fault::CrashServerAtTierMove { on: TierMove::Promotion, .. }
        )));
    }
}
