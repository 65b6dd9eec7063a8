//! Deterministic simulation of a whole Stratus cluster.
//!
//! The coordinator, every storage server (master, backup, replica manager, cleaner, lease) and
//! the clients run in one process, one thread, on turmoil's simulated network and clock, with
//! a simulated disk under each backup. The services are the production ones: they reach the
//! outside world only through stratus-env's `Environment`, `tokio::time` and the backup's
//! `ReplicaStorage`, so nothing in them knows it is simulated. A seed decides everything:
//! message latencies, the fault schedule (crashes and restarts of servers and of the
//! coordinator, partitions, stalled links, lost and torn unsynced writes, flipped bits, failing
//! syncs), the clients' operations and every random choice inside the services. A failing seed
//! therefore fails the same way every time it is run.
//!
//! Invariants, checked throughout and at the end:
//! - no acknowledged write is lost, and the whole history of reads, writes, conditional
//!   writes, removes and increments is linearizable per key (stratus-history's checker);
//! - at most one master serves a tablet at any time (every server samples, every 10 ms of
//!   simulated time, the tablets it owns while its lease is valid);
//! - liveness: once the faults stop, every key can be read again (recovery finishes), within
//!   the run's time limit;
//! - durability restored: once the faults stop, every running server's segments are back on R
//!   backups;
//! - no panic anywhere (a broken storage invariant panics);
//! - with the bank workload ([`SimulationOptions::bank`], module [`bank`]): multi-object
//!   transactions conserve money, read-only ones see states the committed transfers explain,
//!   and no lock outlives the run;
//! - with the list-append workload ([`SimulationOptions::list_append`], module
//!   [`list_append`]): transactions appending to and reading lists, whose whole history must
//!   show none of the anomalies strict serializability forbids (stratus-history's Elle-style
//!   checker);
//! - with tiers ([`SimulationOptions::tiering`], module [`flash`]): the main table on flash or
//!   auto, every server with a small in-memory flash under the production `DeviceImages`, and
//!   a schedule that also crashes masters in the millisecond of a demotion, a promotion or a
//!   read from flash (`Fault::CrashServerAtTierMove`) and makes flash refuse writes or fail
//!   reads (`Fault::FailFlash`): the invariants above hold whatever tier an object is in, and
//!   [`SimulationReport::tiering`] shows the objects did move.
//!
//! `docs/design/simulation.md` describes the model and what it leaves out.

pub mod bank;
pub mod disk;
pub mod flash;
pub mod host_cpu;
pub mod list_append;
pub mod meta_meter;
pub mod network;
pub mod nodes;
pub mod preload;
pub mod recovery_model;
pub mod schedule;
pub mod wiretap;
mod zombie;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use stratus_backup::Durability;
use stratus_client::{Client, ClientConfig, TableId, Tier, Version};
use stratus_history::workload::{counter_key, counter_step, mixed_step, unique_value};
use stratus_history::{check, CheckOptions, Outcome, Recorder, RecordingClient};
pub use stratus_master::{PeerProbeConfig, Placement};
use stratus_meta::MemoryMetaStore;
use stratus_wire::ServerStatus;

pub use crate::bank::BankOptions;
use crate::disk::SimulatedDisk;
pub use crate::flash::{FlashDeviceCounts, FlashFault, SimulatedFlash};
pub use crate::list_append::{ListAppendOptions, ListAppendSummary};
use crate::meta_meter::MeteredMetaStore;
use crate::nodes::{
    server_host, ServerSetup, ServerTiering, ServingObservations, TierWork, COORDINATOR_ADDRESS,
};
pub use crate::preload::Preload;
use crate::preload::PreloadState;
use crate::schedule::Choices;
pub use crate::schedule::{Fault, ScheduledFault, TierMove};
pub use crate::wiretap::PlantedBug;
use crate::wiretap::Wiretap;

/// What one simulation runs.
#[derive(Clone, Debug)]
pub struct SimulationOptions {
    /// Storage servers.
    pub servers: usize,
    /// Replicas of every segment (at most servers − 2, so a crashed server's data can be
    /// recovered and re-replicated while another is down).
    pub replicas: usize,
    /// Concurrent clients.
    pub clients: u32,
    /// Operations each client issues.
    pub operations_per_client: u32,
    /// Keys shared by the clients (few, so operations on a key overlap).
    pub keys: u64,
    /// A client waits up to this long between two operations, so the workload spans the
    /// faults.
    pub think_time_max: Duration,
    /// Whether to inject faults (drawn from the seed; see `scripted_faults`).
    pub faults: bool,
    /// A scenario's own faults, injected instead of the seed's (whatever `faults` says): one
    /// server crash, 1 % of the servers at once, a rolling restart.
    pub scripted_faults: Option<Vec<ScheduledFault>>,
    /// Faults begin within this much simulated time from the start.
    pub fault_window: Duration,
    /// Simulated time the whole run may take: liveness is violated past it.
    pub time_limit: Duration,
    /// Whether an operator splits tablets and migrates them between masters while the
    /// clients run (and the faults happen).
    pub tablet_moves: bool,
    /// The servers' cleaning levels: 2 compacts in memory first (what a replicated server
    /// runs), 1 cleans with the combined cleaner alone (`stratus server --cleaner-levels 1`).
    pub cleaner_levels: u32,
    /// The servers' memory target (`stratus server --memory-target-percent`): the log cleans
    /// ahead of need and gives free pages back. `None`: the log fills its region first.
    pub memory_target_percent: Option<u32>,
    /// Whether a zombie client runs: it applies a mutation under a client lease, falls
    /// silent for longer than a lease term (after the faults), and must then find that
    /// neither a new mutation nor its old one is applied under the expired lease.
    pub zombie_client: bool,
    /// The bank workload besides the main one (module [`bank`]): accounts on every master,
    /// clients moving money between them in transactions, auditors summing them in
    /// read-only transactions. `None` (the default, and `for_seed`'s): no bank.
    pub bank: Option<BankOptions>,
    /// The list-append workload besides the main one (module [`list_append`]): lists on
    /// every master, clients appending to and reading them in transactions, the history
    /// checked for the anomalies of strict serializability. `None` (the default, and
    /// `for_seed`'s): none.
    pub list_append: Option<ListAppendOptions>,
    /// Failure domains the servers announce (`stratus server --failure-domain`): server `i`
    /// is in rack `rack-{i % failure_domains}`. 0 (the default): none, every server a domain
    /// of its own.
    pub failure_domains: usize,
    /// How the masters place replicas (the default: `Placement::Random`, as `stratus server`).
    pub placement: Placement,
    /// Whether to follow every server's record at the coordinator (every 10 ms of simulated
    /// time) and report when it was declared crashed and when its recovery ended
    /// ([`SimulationReport::recoveries`]).
    pub observe_recoveries: bool,
    /// Whether to measure what the run costs ([`SimulationReport::measurements`]): every RPC
    /// the coordinator and the servers send, by second, sender, receiver and opcode (module
    /// [`wiretap`]), what each recovery master was asked to replay and replayed, the
    /// coordinator's metadata writes ([`meta_meter`]) and its processor time ([`host_cpu`]:
    /// this replaces the thread's tracing subscriber for the run).
    pub measure: bool,
    /// A bug planted on purpose (module [`wiretap`]): the run must fail. `None` (the default).
    pub planted_bug: Option<PlantedBug>,
    /// Objects written into chosen servers' tablets before the faults (module [`preload`]).
    pub preload: Option<Preload>,
    /// Whether the clients wait for every server to enlist before they create the table, so
    /// that it is spread over all of them (one tablet each). Off by default: small clusters
    /// enlist within the first steps anyway.
    pub await_every_server: bool,
    /// Largest value of the clients' filler writes (at most [`nodes::FILLER_VALUE_BYTES_MAX`],
    /// the default): large ones fill the small logs so the cleaner runs; a scenario that
    /// measures recoveries may want its crashed masters' data to be its preload.
    pub filler_value_bytes_max: usize,
    /// How the servers ping their peers (`stratus_master::PeerProbeConfig`; the default, as
    /// `stratus server` runs). A test of the ping-rate bound runs a faster one.
    pub peer_probe: PeerProbeConfig,
    /// The workload's table on flash or auto, and every server with a flash tier (module
    /// [`flash`]); with faults, the schedule then draws crashes timed at moves between tiers
    /// and flash faults too (`schedule::generate_tiered`). `None` (the default, and
    /// `for_seed`'s): a memory table on servers without flash, every seed as before.
    pub tiering: Option<Tiering>,
}

/// The tier of the workload's table and the servers' flash (`SimulationOptions::tiering`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiering {
    /// The tier the main workload's table `simulation` is created with (the bank's and the
    /// list-append workload's tables stay in memory).
    pub tier: Tier,
    /// Each server's flash budget: images of whole segments (256 KiB) count against it.
    pub flash_budget_bytes: u64,
    /// The auto tables' DRAM budget per server (`StoreConfig::auto_dram_bytes_max`).
    pub auto_dram_bytes_max: u64,
    /// Reads of random filler keys (any client's) each client adds to every step, so that
    /// values are read back from flash and auto objects promoted; the verifier reads them all
    /// at the end as always.
    pub filler_reads_per_step: u32,
}

impl Tiering {
    /// A flash table on servers with 8 segments' worth of flash (twice their 1.5 MiB log
    /// less a segment: the filler keeps it near full, so the flash-pressure cleaning runs).
    pub fn flash() -> Tiering {
        let segment_bytes = u64::from(nodes::store_config().segment_bytes);
        Tiering {
            tier: Tier::Flash,
            flash_budget_bytes: 8 * segment_bytes,
            auto_dram_bytes_max: nodes::store_config().auto_dram_bytes_max,
            filler_reads_per_step: 3,
        }
    }

    /// An auto table whose DRAM budget is a 48th of the servers' 1.5 MiB log (32 KiB, an
    /// eighth of a segment): a master's share of the clients' live filler (6 keys of up to
    /// 24 KiB per client) never fits, so every closed segment holding auto objects is demoted
    /// once replicated, least recently used first, and the filler reads promote what they
    /// find on flash, which puts the master over its budget again.
    pub fn auto() -> Tiering {
        Tiering {
            tier: Tier::Auto,
            auto_dram_bytes_max: nodes::store_config().log_bytes / 48,
            ..Tiering::flash()
        }
    }
}

impl SimulationOptions {
    /// The shape the seed picks: 4 servers with 2 replicas, or 5 with 2 or 3, 2 to 4 clients,
    /// and one or two cleaning levels; everything else as the defaults.
    pub fn for_seed(seed: u64) -> SimulationOptions {
        let mut choices = Choices::new(seed ^ 0x5A4E_0000);
        let mut options = SimulationOptions::default();
        match choices.below(3) {
            0 => {}
            1 => options.servers = 5,
            _ => {
                options.servers = 5;
                options.replicas = 3;
            }
        }
        options.clients = 2 + choices.below(3) as u32;
        // Drawn last, so the choices above stay what they were for every seed. One seed in
        // three cleans in one level, so combined passes run under faults often too.
        if choices.below(3) == 0 {
            options.cleaner_levels = 1;
        }
        // One seed in two runs the servers as `stratus server` does by default, cleaning ahead
        // of need to keep memory near the live data: far more cleaning under the faults.
        if choices.below(2) == 0 {
            options.memory_target_percent = Some(stratus_store::MEMORY_TARGET_PERCENT_DEFAULT);
        }
        options
    }
}

impl Default for SimulationOptions {
    fn default() -> SimulationOptions {
        SimulationOptions {
            servers: 4,
            replicas: 2,
            clients: 3,
            operations_per_client: 150,
            keys: 6,
            think_time_max: Duration::from_millis(120),
            faults: true,
            scripted_faults: None,
            fault_window: Duration::from_secs(12),
            time_limit: Duration::from_secs(150),
            tablet_moves: false,
            cleaner_levels: 2,
            memory_target_percent: None,
            zombie_client: false,
            bank: None,
            list_append: None,
            failure_domains: 0,
            placement: Placement::Random,
            observe_recoveries: false,
            measure: false,
            planted_bug: None,
            preload: None,
            await_every_server: false,
            filler_value_bytes_max: nodes::FILLER_VALUE_BYTES_MAX,
            peer_probe: PeerProbeConfig::default(),
            tiering: None,
        }
    }
}

/// The failure domain `stratus server --failure-domain` would be given for server `index`
/// when the servers are spread over `domains` racks (`SimulationOptions::failure_domains`).
pub fn failure_domain_of(index: usize, domains: usize) -> String {
    if domains == 0 {
        String::new()
    } else {
        format!("rack-{}", index % domains)
    }
}

/// One server (one incarnation: a restarted server enlists again under a new id) as the
/// coordinator's records showed it over the run (`SimulationOptions::observe_recoveries`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerRecovery {
    /// Its host (`server-<index>`).
    pub host: String,
    /// Its id.
    pub server_id: u64,
    /// When it was first seen enlisted.
    pub enlisted_at: Duration,
    /// When the coordinator first listed it as crashed (or stopped): failure detection.
    pub declared_at: Option<Duration>,
    /// When it was first listed as removed: every tablet it served was recovered and is
    /// served by another master.
    pub recovered_at: Option<Duration>,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct SimulationReport {
    /// The seed.
    pub seed: u64,
    /// The backups' durability mode the seed chose.
    pub durability: String,
    /// Storage servers, replicas per segment and clients.
    pub shape: (usize, usize, u32),
    /// Whether the operator split and migrated tablets (`SimulationOptions::tablet_moves`).
    pub tablet_moves: bool,
    /// What the bank workload did, when it ran (`SimulationOptions::bank`).
    pub bank: Option<bank::BankSummary>,
    /// What the list-append workload did, when it ran (`SimulationOptions::list_append`).
    pub list_append: Option<ListAppendSummary>,
    /// Servers the coordinator declared crashed and whose tablets were recovered.
    pub servers_recovered: usize,
    /// The faults injected.
    pub faults: Vec<ScheduledFault>,
    /// What the disks' faults did (per server).
    pub disk_faults: Vec<String>,
    /// Operations in the history.
    pub operations: usize,
    /// Operations with a known outcome (acknowledged or refused).
    pub known_outcomes: usize,
    /// Operations that were items of multi-operations.
    pub multi_operation_items: u64,
    /// Acknowledged increments of the counter keys (each checked applied exactly once).
    pub counted_increments: u64,
    /// Simulated time the run took.
    pub simulated: Duration,
    /// Simulation steps (of 1 ms).
    pub steps: u64,
    /// Single-owner samples taken.
    pub serving_samples: u64,
    /// Tablet splits the operator's requests made (with `tablet_moves`).
    pub tablet_splits: u32,
    /// Tablet migrations the operator's requests made (with `tablet_moves`).
    pub tablet_migrations: u32,
    /// Compactions and combined-cleaning passes the servers ran (as last sampled).
    pub cleaner_work: (u64, u64),
    /// A digest of everything observable: two runs of one seed must agree on it.
    pub fingerprint: u64,
    /// The history, one operation per line (to show where two runs of a seed diverge).
    pub history: Vec<String>,
    /// Every server incarnation's detection and recovery, by server id
    /// (`SimulationOptions::observe_recoveries`; empty otherwise).
    pub recoveries: Vec<ServerRecovery>,
    /// For each instant servers crashed: where the copies of the crashed masters' segments
    /// were (`SimulationOptions::observe_recoveries`; empty otherwise).
    pub exposures: Vec<CrashExposure>,
    /// What the run cost (`SimulationOptions::measure`).
    pub measurements: Option<Arc<Measurements>>,
    /// The preload's acknowledged writes, and when the loader finished
    /// (`SimulationOptions::preload`).
    pub preloaded: Option<(u64, Duration)>,
    /// What the tiers did (`SimulationOptions::tiering`).
    pub tiering: Option<TieringSummary>,
}

/// What the servers' tiers did in a run (`SimulationOptions::tiering`), summed over every
/// server incarnation (each as last sampled, every 10 ms of simulated time), so a test can
/// require that the run exercised what it claims to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TieringSummary {
    /// Segments demoted (imaged on flash and compacted), for flash and auto tables.
    pub demotions: u64,
    /// Objects moved to flash by them.
    pub objects_demoted: u64,
    /// Of the demotions, those made because auto tables were over their DRAM budget.
    pub auto_demotions: u64,
    /// Images flash refused (full or failing): their segments stayed in memory.
    pub images_refused: u64,
    /// Images deleted because their segments were cleaned.
    pub images_deleted: u64,
    /// Values read back from flash for requests (flash tables' and auto tables').
    pub reads_from_flash: u64,
    /// Reads of auto objects served from DRAM.
    pub reads_from_dram: u64,
    /// Image reads that failed or did not verify (by the store's count).
    pub flash_reads_failed: u64,
    /// Auto objects promoted back into the log.
    pub promotions: u64,
    /// Promotions drawn but not done (over the byte rate, or no memory).
    pub promotions_refused: u64,
    /// What the simulated devices did (writes, refusals, reads, failed reads).
    pub device: FlashDeviceCounts,
    /// `Fault::CrashServerAtTierMove` crashes made right after the move they waited for, by
    /// move.
    pub crashes_at_moves: BTreeMap<TierMove, u64>,
    /// Those that waited in vain and crashed the server at the end of their wait.
    pub crashes_after_waiting: u64,
}

impl TieringSummary {
    /// Adds `other`'s counts to these (to sum the runs of a test).
    pub fn add(&mut self, other: &TieringSummary) {
        self.demotions += other.demotions;
        self.objects_demoted += other.objects_demoted;
        self.auto_demotions += other.auto_demotions;
        self.images_refused += other.images_refused;
        self.images_deleted += other.images_deleted;
        self.reads_from_flash += other.reads_from_flash;
        self.reads_from_dram += other.reads_from_dram;
        self.flash_reads_failed += other.flash_reads_failed;
        self.promotions += other.promotions;
        self.promotions_refused += other.promotions_refused;
        self.add_device(other.device);
        for (on, count) in &other.crashes_at_moves {
            *self.crashes_at_moves.entry(*on).or_default() += count;
        }
        self.crashes_after_waiting += other.crashes_after_waiting;
    }

    fn add_work(&mut self, work: &TierWork) {
        self.demotions += work.flash.demotions;
        self.objects_demoted += work.flash.objects_demoted;
        self.auto_demotions += work.auto.demotions;
        self.images_refused += work.flash.images_refused;
        self.images_deleted += work.flash.images_deleted;
        self.reads_from_flash += work.flash.values_read + work.auto.reads_from_flash;
        self.reads_from_dram += work.auto.reads_from_dram;
        self.flash_reads_failed += work.flash.reads_failed;
        self.promotions += work.auto.promotions;
        self.promotions_refused += work.auto.promotions_refused;
    }

    fn add_device(&mut self, counts: FlashDeviceCounts) {
        self.device.writes += counts.writes;
        self.device.writes_refused += counts.writes_refused;
        self.device.reads += counts.reads;
        self.device.reads_failed += counts.reads_failed;
    }
}

impl fmt::Display for TieringSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tiers: {} demotions ({} for the auto budget, {} objects), {} images refused, {} \
             deleted; {} reads from flash, {} from DRAM, {} flash reads failed; {} promotions \
             ({} refused); device {} writes, {} refused, {} reads, {} failed; crashes at \
             moves {:?}, {} after waiting",
            self.demotions,
            self.auto_demotions,
            self.objects_demoted,
            self.images_refused,
            self.images_deleted,
            self.reads_from_flash,
            self.reads_from_dram,
            self.flash_reads_failed,
            self.promotions,
            self.promotions_refused,
            self.device.writes,
            self.device.writes_refused,
            self.device.reads,
            self.device.reads_failed,
            self.crashes_at_moves,
            self.crashes_after_waiting
        )
    }
}

/// What a run cost, measured (`SimulationOptions::measure`; with a planted bug, the wiretap
/// that planted it and the metadata writes only).
#[derive(Debug)]
pub struct Measurements {
    /// Every RPC the coordinator and the servers sent, and every RECOVER_TABLETS.
    pub wiretap: Arc<Wiretap>,
    /// The coordinator's metadata writes.
    pub meta: Arc<MeteredMetaStore>,
    /// The coordinator's processor time in each second of simulated time (index: the second;
    /// with `SimulationOptions::measure` only).
    coordinator_cpu: Mutex<Vec<Duration>>,
    /// Where the memory is at the end of each second of simulated time (index: the second;
    /// with `SimulationOptions::measure` only).
    memory: Mutex<Vec<MemorySample>>,
}

/// The simulation's memory at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemorySample {
    /// The process's resident memory (`VmRSS`): every simulated node, the harness, the test.
    pub resident_bytes: u64,
    /// What the simulated disks hold (module [`disk`]: two copies of what was written, and the
    /// unsynced writes).
    pub disk_bytes: u64,
    /// The running backups' RAM buffers in use, in bytes (each one segment).
    pub backup_buffer_bytes: u64,
    /// Replicas the running backups hold.
    pub replicas: u64,
}

impl Measurements {
    fn add_coordinator_cpu(&self, at: Duration, spent: Duration) {
        let mut seconds = self.coordinator_cpu.lock().unwrap_or_else(|poison| poison.into_inner());
        let second = at.as_secs() as usize;
        if seconds.len() <= second {
            seconds.resize(second + 1, Duration::ZERO);
        }
        seconds[second] += spent;
    }

    /// Whether a new second of simulated time began at `at` (then a memory sample is due).
    fn memory_due(&self, at: Duration) -> bool {
        let samples = self.memory.lock().unwrap_or_else(|poison| poison.into_inner());
        samples.len() <= at.as_secs() as usize
    }

    fn note_memory(&self, at: Duration, sample: MemorySample) {
        let mut samples = self.memory.lock().unwrap_or_else(|poison| poison.into_inner());
        let second = at.as_secs() as usize;
        if samples.len() <= second {
            samples.resize(second + 1, sample);
        }
    }

    /// Where the memory was at the start of each second of simulated time so far.
    pub fn memory(&self) -> Vec<MemorySample> {
        self.memory.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    /// The coordinator's processor time within `seconds` of simulated time.
    pub fn coordinator_cpu_in(&self, seconds: std::ops::Range<u32>) -> Duration {
        let by_second = self.coordinator_cpu.lock().unwrap_or_else(|poison| poison.into_inner());
        by_second
            .iter()
            .enumerate()
            .filter(|(second, _)| seconds.contains(&(*second as u32)))
            .map(|(_, cpu)| *cpu)
            .sum()
    }
}

/// Where the copies of the crashed masters' segments were at the instant they crashed, as
/// their backups listed them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrashExposure {
    /// When.
    pub at: Duration,
    /// Servers that crashed at that instant.
    pub crashed: usize,
    /// Segments of theirs that some backup held a copy of (any epoch).
    pub segments: usize,
    /// Of those, segments every copy of which was on a server that crashed at that instant:
    /// lost, had those servers' disks not come back (their recovery waits for them).
    pub segments_without_a_copy_elsewhere: usize,
}

impl fmt::Display for SimulationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} ({} servers, R={}, {} clients, {}): {} operations ({} known outcomes, {} \
             in multi-operations, {} counted increments), {} faults, {} servers recovered, {} compactions, {} combined cleanings, {:.1} s \
             simulated, {} serving samples, {} tablet splits, {} migrations, fingerprint {:016x}",
            self.seed,
            self.shape.0,
            self.shape.1,
            self.shape.2,
            self.durability,
            self.operations,
            self.known_outcomes,
            self.multi_operation_items,
            self.counted_increments,
            self.faults.len(),
            self.servers_recovered,
            self.cleaner_work.0,
            self.cleaner_work.1,
            self.simulated.as_secs_f64(),
            self.serving_samples,
            self.tablet_splits,
            self.tablet_migrations,
            self.fingerprint
        )?;
        if let Some(bank) = &self.bank {
            writeln!(
                f,
                "  bank: {} transfers committed, {} not applied, {} unknown; {} audits \
                 committed ({} snapshots checked, {} unchecked), {} not committed",
                bank.transfers.0,
                bank.transfers.1,
                bank.transfers.2,
                bank.audits.0,
                bank.snapshots.0,
                bank.snapshots.1,
                bank.audits.1
            )?;
        }
        if let Some(lists) = &self.list_append {
            writeln!(
                f,
                "  list-append: {} transactions committed ({} appending, {} appends), {} \
                 aborted, {} unknown; {} committed reads checked, graph of {} transactions and \
                 {} edges",
                lists.transactions.0,
                lists.committed_appends.0,
                lists.committed_appends.1,
                lists.transactions.1,
                lists.transactions.2,
                lists.report.committed_reads_checked,
                lists.report.graph_transactions,
                lists.report.graph_edges
            )?;
        }
        if let Some(tiering) = &self.tiering {
            writeln!(f, "  {tiering}")?;
        }
        for fault in &self.faults {
            writeln!(f, "  {fault}")?;
        }
        for fault in &self.disk_faults {
            writeln!(f, "  disk: {fault}")?;
        }
        Ok(())
    }
}

/// A run that broke an invariant.
#[derive(Clone, Debug)]
pub struct SimulationFailure {
    /// Which invariant, and the evidence (for a history violation: the smallest offending
    /// history the checker found).
    pub reason: String,
    /// What the run did up to the failure.
    pub report: Box<SimulationReport>,
}

impl fmt::Display for SimulationFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "simulation seed {} failed: {}", self.report.seed, self.reason)?;
        write!(f, "{}", self.report)?;
        let moves = if self.report.tablet_moves { " STRATUS_SIM_TABLET_MOVES=1" } else { "" };
        let bank = if self.report.bank.is_some() { " STRATUS_SIM_BANK=1" } else { "" };
        if self.report.list_append.is_some() {
            return write!(
                f,
                "reproduce: STRATUS_SIM_SEED={} cargo test -p stratus-sim --test list_append \
                 one_list_append_seed -- --ignored --nocapture",
                self.report.seed
            );
        }
        write!(
            f,
            "reproduce: STRATUS_SIM_SEED={}{moves}{bank} cargo test -p stratus-sim --test seeds \
             one_seed -- --ignored --nocapture",
            self.report.seed
        )
    }
}

thread_local! {
    /// Panics on this thread (every node of a simulation runs on the thread that runs it).
    static PANICS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Records every panic on the thread that raised it, so the simulation fails at once with the
/// message (a panic in a spawned task would otherwise only end that task).
fn record_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let location = info.location().map(|location| location.to_string()).unwrap_or_default();
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            PANICS.with(|panics| panics.borrow_mut().push(format!("{message} at {location}")));
            previous(info);
        }));
    });
}

/// Notes, at `now`, every server's status in the coordinator's records (read as a restarted
/// coordinator would: from the metadata store).
fn observe_recoveries(
    meta: &MemoryMetaStore,
    now: Duration,
    recoveries: &mut BTreeMap<u64, ServerRecovery>,
) {
    let Ok(state) = stratus_coordinator::CoordinatorState::load(meta) else { return };
    for entry in state.servers.values() {
        let record = recoveries.entry(entry.server_id.0).or_insert_with(|| ServerRecovery {
            host: entry.address.split(':').next().unwrap_or_default().to_string(),
            server_id: entry.server_id.0,
            enlisted_at: now,
            declared_at: None,
            recovered_at: None,
        });
        if entry.status != ServerStatus::Up && record.declared_at.is_none() {
            record.declared_at = Some(now);
        }
        if entry.status == ServerStatus::Removed && record.recovered_at.is_none() {
            record.recovered_at = Some(now);
        }
    }
}

/// Where the copies of the segments of the servers `crashing` (by index) are, as every running
/// backup lists them.
fn exposure(
    now: Duration,
    crashing: &BTreeSet<usize>,
    observations: &Mutex<ServingObservations>,
) -> CrashExposure {
    let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
    let masters: Vec<stratus_types::ServerId> = crashing
        .iter()
        .filter_map(|index| observations.backups.get(index).map(|(server_id, _)| *server_id))
        .collect();
    let mut holders: BTreeMap<(u64, u64), BTreeSet<usize>> = BTreeMap::new();
    for (index, (_, backup)) in &observations.backups {
        for master in &masters {
            for replica in backup.list(*master) {
                holders.entry((master.0, replica.segment_id.0)).or_default().insert(*index);
            }
        }
    }
    CrashExposure {
        at: now,
        crashed: crashing.len(),
        segments: holders.len(),
        segments_without_a_copy_elsewhere: holders
            .values()
            .filter(|holders| holders.is_subset(crashing))
            .count(),
    }
}

/// One step of the fault timeline.
#[derive(Clone, Debug)]
enum Action {
    CrashServer { server: usize, flip_bit: bool },
    RestartServer { server: usize },
    RestartServerIfStopped { server: usize },
    CrashCoordinator,
    RestartCoordinator,
    Partition { server: usize },
    Repair { server: usize },
    PartitionOneWay { server: usize, outbound: bool },
    RepairOneWay { server: usize, outbound: bool },
    Hold { server: usize },
    Release { server: usize },
    FailSyncs { server: usize },
    FailWrites { server: usize },
    RotBit { server: usize },
    ArmCrashAtTierMove { server: usize, on: TierMove, armed_for: Duration, down_for: Duration },
    FailFlash { server: usize, fault: FlashFault },
    HealFlash { server: usize },
}

/// A crash waiting for a master's next move between tiers (`Fault::CrashServerAtTierMove`).
#[derive(Debug)]
struct ArmedCrash {
    /// The server crashed if no master moves in time.
    fallback: usize,
    on: TierMove,
    until: Duration,
    down_for: Duration,
    /// Per server index: the incarnation watched and its count of such moves when first seen.
    baselines: BTreeMap<usize, (stratus_types::ServerId, u64)>,
}

/// How many moves of kind `on` `store` has made.
fn tier_moves(store: &stratus_store::ObjectStore, on: TierMove) -> u64 {
    let work = TierWork::of(store);
    match on {
        TierMove::Demotion => work.flash.demotions,
        TierMove::Promotion => work.auto.promotions,
        TierMove::FlashRead => work.flash.values_read + work.auto.reads_from_flash,
    }
}

impl ArmedCrash {
    /// Which server to crash after a step that ended at `now`, if any: the first (by index)
    /// whose store made such a move during the step (`true`), or, once the wait is over,
    /// the fallback (`false`).
    fn due(
        &mut self,
        now: Duration,
        observations: &Mutex<ServingObservations>,
    ) -> Option<(usize, bool)> {
        let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
        let mut moved = None;
        for (index, (server_id, store)) in &observations.stores {
            let Some(store) = store.upgrade() else { continue };
            let moves = tier_moves(&store, self.on);
            match self.baselines.get(index) {
                Some((watched, before)) if watched == server_id && moves > *before => {
                    moved = moved.or(Some(*index));
                }
                Some((watched, _)) if watched == server_id => {}
                // A new incarnation (or the first look): count from here.
                _ => {
                    self.baselines.insert(*index, (*server_id, moves));
                }
            }
        }
        match moved {
            Some(index) => Some((index, true)),
            None => (now >= self.until).then_some((self.fallback, false)),
        }
    }
}

/// Time after a partition heals or a stall ends before a server that stopped itself (it was
/// declared crashed meanwhile) is started again.
const RESTART_AFTER_HEAL: Duration = Duration::from_millis(1_500);

fn timeline(faults: &[ScheduledFault]) -> Vec<(Duration, Action)> {
    let mut actions = Vec::new();
    for scheduled in faults {
        let at = scheduled.at;
        match scheduled.fault {
            Fault::CrashServer { server, down_for, flip_bit } => {
                actions.push((at, Action::CrashServer { server, flip_bit }));
                actions.push((at + down_for, Action::RestartServer { server }));
            }
            Fault::CrashCoordinator { down_for } => {
                actions.push((at, Action::CrashCoordinator));
                actions.push((at + down_for, Action::RestartCoordinator));
            }
            Fault::PartitionServer { server, heal_after } => {
                actions.push((at, Action::Partition { server }));
                actions.push((at + heal_after, Action::Repair { server }));
                actions.push((
                    at + heal_after + RESTART_AFTER_HEAL,
                    Action::RestartServerIfStopped { server },
                ));
            }
            Fault::PartitionServerOneWay { server, heal_after, outbound } => {
                actions.push((at, Action::PartitionOneWay { server, outbound }));
                actions.push((at + heal_after, Action::RepairOneWay { server, outbound }));
                actions.push((
                    at + heal_after + RESTART_AFTER_HEAL,
                    Action::RestartServerIfStopped { server },
                ));
            }
            Fault::CrashTwoServers { first, second, gap, down_for } => {
                actions.push((at, Action::CrashServer { server: first, flip_bit: false }));
                actions.push((at + gap, Action::CrashServer { server: second, flip_bit: false }));
                actions.push((at + gap + down_for, Action::RestartServer { server: first }));
                actions.push((at + gap + down_for, Action::RestartServer { server: second }));
            }
            Fault::StallServer { server, release_after } => {
                actions.push((at, Action::Hold { server }));
                actions.push((at + release_after, Action::Release { server }));
                actions.push((
                    at + release_after + RESTART_AFTER_HEAL,
                    Action::RestartServerIfStopped { server },
                ));
            }
            Fault::RotBit { server } => actions.push((at, Action::RotBit { server })),
            Fault::FailWrites { server, restart_after } => {
                actions.push((at, Action::FailWrites { server }));
                actions.push((at + restart_after, Action::CrashServer { server, flip_bit: false }));
                actions.push((
                    at + restart_after + Duration::from_millis(100),
                    Action::RestartServer { server },
                ));
            }
            Fault::FailSyncs { server, restart_after } => {
                actions.push((at, Action::FailSyncs { server }));
                actions.push((at + restart_after, Action::CrashServer { server, flip_bit: false }));
                actions.push((
                    at + restart_after + Duration::from_millis(100),
                    Action::RestartServer { server },
                ));
            }
            // The crash and the restart are timed when the move happens (`ArmedCrash`).
            Fault::CrashServerAtTierMove { server, on, armed_for, down_for } => {
                actions.push((at, Action::ArmCrashAtTierMove { server, on, armed_for, down_for }));
            }
            Fault::FailFlash { server, fault, heal_after } => {
                actions.push((at, Action::FailFlash { server, fault }));
                actions.push((at + heal_after, Action::HealFlash { server }));
            }
        }
    }
    actions.sort_by_key(|(at, _)| *at);
    actions
}

/// Shared between the harness and the simulated clients.
struct Workload {
    recorder: Arc<Recorder>,
    clients_done: AtomicU32,
    faults_over: AtomicBool,
    verified: AtomicBool,
    /// Splits the operator asked for that the coordinator acknowledged.
    tablet_splits: AtomicU32,
    tablet_migrations: AtomicU32,
    /// The counters' values the verifier read after the faults (the counter model's final
    /// values).
    counter_finals: Mutex<Vec<i64>>,
    /// The zombie client finished its checks.
    zombie_checked: AtomicBool,
    /// The bank workload's clients and log (`SimulationOptions::bank`).
    bank: bank::BankState,
    /// The list-append workload's clients and history (`SimulationOptions::list_append`).
    lists: list_append::ListAppendState,
    /// The preload's keys and progress (`SimulationOptions::preload`).
    preload: Arc<PreloadState>,
}

fn client_config() -> ClientConfig {
    let mut config = ClientConfig::new(COORDINATOR_ADDRESS);
    // Long enough to ride out a recovery, short enough that a stuck operation shows.
    config.operation_timeout = Duration::from_secs(8);
    // Every operation takes effect at most once, so the history is exact: mutations are
    // exactly-once (retried with their identity), and a client built without it would not
    // send an ambiguous mutation again.
    config.exactly_once = true;
    config.retry_ambiguous_mutations = false;
    config
}

/// The tier of the table every client uses.
fn workload_tier(options: &SimulationOptions) -> Tier {
    options.tiering.as_ref().map_or(Tier::Memory, |tiering| tiering.tier)
}

/// The table every client uses: created (on `tier`) by whichever client gets there first.
async fn table_id(client: &Client, span: u32, tier: Tier) -> Option<TableId> {
    for _ in 0..200 {
        if let Ok(table) = client.create_table_with_tier("simulation", span, tier).await {
            return Some(table);
        }
        if let Ok(table) = client.get_table_id("simulation").await {
            return Some(table);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// One client's operations: reads, blind writes, conditional writes, creates, removes and
/// increments, on a few shared keys, one at a time or several in one multi-operation. Failures
/// are part of the history, never a reason to stop.
async fn run_client(
    seed: u64,
    client_id: u32,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let mut choices = Choices::new(seed ^ 0xC11E_0000 ^ u64::from(client_id));
    let client = Client::with_environment(
        client_config(),
        network::client_environment(seed, &format!("client-{client_id}"), 0),
    );
    if options.await_every_server {
        preload::every_server_enlisted(&client, options.servers).await;
    }
    let table = table_id(&client, options.servers as u32, workload_tier(&options))
        .await
        .ok_or("no table")?;
    let client = RecordingClient::new(client, workload.recorder.clone(), client_id);
    let keys: Vec<bytes::Bytes> =
        (0..options.keys).map(|index| bytes::Bytes::from(format!("key-{index}"))).collect();
    let mut last_seen = vec![Version(0); keys.len()];
    for sequence in 0..options.operations_per_client {
        mixed_step(&client, table, &keys, &mut last_seen, client_id, sequence, &mut choices).await;
        // Half the steps also count: increments by 1 that the counter model checks.
        if choices.below(2) == 0 {
            counter_step(&client, table, COUNTERS, &mut choices).await;
        }
        // Filler: an overwrite of one of this client's own keys with a value of up to
        // FILLER_VALUE_BYTES_MAX (24 KiB), so the small logs fill with dead versions and the
        // cleaner must run.
        let key = filler_key(client_id, choices.below(FILLER_KEYS_PER_CLIENT));
        let filler_max = options.filler_value_bytes_max.clamp(9, nodes::FILLER_VALUE_BYTES_MAX);
        let length = 8 + choices.below(filler_max as u64 - 8) as usize;
        let mut value = unique_value(client_id, sequence).to_vec();
        value.resize(length, (sequence % 251) as u8);
        let _ = client.write(table, key.as_bytes(), &value).await;
        // With a table on flash or auto: read filler back (drawn only then, so other runs
        // make the same choices as before), from flash or, once promoted, from DRAM.
        if let Some(tiering) = &options.tiering {
            for _ in 0..tiering.filler_reads_per_step {
                let owner = choices.below(u64::from(options.clients)) as u32;
                let key = filler_key(owner, choices.below(FILLER_KEYS_PER_CLIENT));
                let _ = client.read(table, key.as_bytes()).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(
            choices.below(options.think_time_max.as_millis() as u64 + 1),
        ))
        .await;
    }
    workload.clients_done.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The loader (`SimulationOptions::preload`): fills the chosen servers' tablets before the
/// faults, recorded in the history as the client after the verifier.
async fn run_loader(
    seed: u64,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let Some(preload) = options.preload.clone() else { return Ok(()) };
    let client =
        Client::with_environment(client_config(), network::client_environment(seed, "loader", 0));
    if options.await_every_server {
        preload::every_server_enlisted(&client, options.servers).await;
    }
    let table = table_id(&client, options.servers as u32, workload_tier(&options))
        .await
        .ok_or("no table")?;
    let span = (options.servers as u32).min(stratus_types::limits::SERVER_SPAN_MAX);
    for extra in 0..preload.extra_tables {
        let name = format!("extra-{extra}");
        // Retried like the workload's table: the coordinator may be down for a moment.
        let created = async {
            for _ in 0..200 {
                if client.create_table(&name, span).await.is_ok()
                    || client.get_table_id(&name).await.is_ok()
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        };
        if !created.await {
            return Err(format!("extra table {name} was not created").into());
        }
    }
    let recorder = workload.recorder.clone();
    let client_id = options.clients + 1;
    preload::run_loader(client, recorder, client_id, table, preload, workload.preload.clone()).await
}

/// Most splits and migrations the operator asks for in one run.
const TABLET_MOVES_MAX: u32 = 24;

/// The operator: while the clients run, splits a random tablet at a random hash or migrates
/// one to a random master, every 0.2–1.5 s of simulated time. Its requests may fail (a
/// master or the coordinator is down, a migration meets a crash): that is part of what is
/// tested; the invariants are checked on the clients' history as always.
async fn run_operator(
    seed: u64,
    options: SimulationOptions,
    workload: Arc<Workload>,
) -> nodes::HostResult {
    let mut choices = Choices::new(seed ^ 0x0BE2_A702);
    let client =
        Client::with_environment(client_config(), network::client_environment(seed, "operator", 0));
    let table = table_id(&client, options.servers as u32, workload_tier(&options))
        .await
        .ok_or("no table")?;
    for _ in 0..TABLET_MOVES_MAX {
        tokio::time::sleep(Duration::from_millis(200 + choices.below(1_300))).await;
        if workload.clients_done.load(Ordering::Acquire) >= options.clients {
            break;
        }
        // With the bank, half the moves are of its table (a range holding prepared
        // transactions must drain before it migrates). Drawn only then, so the runs without
        // the bank make the same choices as before.
        // Likewise with the list-append workload, half the remaining ones are of its table.
        let (name, table) = if options.bank.is_some() && schedule::percent(&mut choices, 50) {
            match client.get_table_id("bank").await {
                Ok(bank) => ("bank", bank),
                Err(_) => continue,
            }
        } else if options.list_append.is_some() && schedule::percent(&mut choices, 50) {
            match client.get_table_id(list_append::TABLE).await {
                Ok(lists) => (list_append::TABLE, lists),
                Err(_) => continue,
            }
        } else {
            ("simulation", table)
        };
        let Ok(tablets) = client.tablet_map(table).await else { continue };
        let Ok(servers) = client.server_list().await else { continue };
        let masters: Vec<_> = servers
            .iter()
            .filter(|server| server.status == ServerStatus::Up && server.services.has_master())
            .map(|server| server.server_id)
            .collect();
        if tablets.is_empty() || masters.is_empty() {
            continue;
        }
        if schedule::percent(&mut choices, 40) {
            if client.split_tablet(name, choices.below(u64::MAX)).await.is_ok() {
                workload.tablet_splits.fetch_add(1, Ordering::AcqRel);
            }
        } else {
            let tablet = &tablets[choices.below(tablets.len() as u64) as usize];
            let target = masters[choices.below(masters.len() as u64) as usize];
            if client.migrate_tablet(name, tablet.range.start, target).await.is_ok() {
                workload.tablet_migrations.fetch_add(1, Ordering::AcqRel);
            }
        }
    }
    Ok(())
}

/// Counter keys the clients increment by 1 (checked by the counter model).
const COUNTERS: usize = 2;

/// Keys each client overwrites with filler values.
const FILLER_KEYS_PER_CLIENT: u64 = 6;

fn filler_key(client_id: u32, index: u64) -> String {
    format!("fill-{client_id}-{index}")
}

/// After the workload and the faults: the last word on every key, from a fresh client, read
/// one by one and then all in one multi-read. Each read must have a known outcome (liveness:
/// recovery finished), and every live server's segments must be back on R backups
/// (durability restored).
async fn verify(
    seed: u64,
    options: SimulationOptions,
    workload: Arc<Workload>,
    observations: Arc<Mutex<ServingObservations>>,
) -> nodes::HostResult {
    while workload.clients_done.load(Ordering::Acquire) < options.clients
        || !workload.faults_over.load(Ordering::Acquire)
        || options.bank.as_ref().is_some_and(|bank| !workload.bank.done(bank))
        || options.list_append.as_ref().is_some_and(|lists| !workload.lists.done(lists))
        || (options.preload.is_some() && !workload.preload.done())
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut config = client_config();
    config.operation_timeout = Duration::from_secs(30);
    let client = Client::with_environment(config, network::client_environment(seed, "verifier", 0));
    let table = table_id(&client, options.servers as u32, workload_tier(&options))
        .await
        .ok_or("no table")?;
    let client = RecordingClient::new(client, workload.recorder.clone(), options.clients);
    let shared_keys = (0..options.keys).map(|index| format!("key-{index}"));
    let filler_keys = (0..options.clients).flat_map(|client_id| {
        (0..FILLER_KEYS_PER_CLIENT).map(move |index| filler_key(client_id, index))
    });
    let keys: Vec<String> = shared_keys.chain(filler_keys).collect();
    for key in &keys {
        if let Err(error) = client.read(table, key.as_bytes()).await {
            if !Outcome::is_refusal(error.status) {
                return Err(format!(
                    "liveness: the final read of {key} failed after the faults stopped: {error}"
                )
                .into());
            }
        }
    }
    // Every key once more in one multi-read: the multi-object path must heal too.
    let items: Vec<stratus_client::KeyItem> = keys
        .iter()
        .map(|key| stratus_client::KeyItem {
            table_id: table,
            key: bytes::Bytes::from(key.clone()),
            rules: stratus_client::RejectRules::NONE,
        })
        .collect();
    let mut finals = Vec::with_capacity(COUNTERS);
    for index in 0..COUNTERS {
        let value = match client.read(table, &counter_key(index)).await {
            Ok((value, _)) => {
                let bytes: [u8; 8] = value[..].try_into().map_err(|_| {
                    format!("counter {index} holds {} bytes, not an integer", value.len())
                })?;
                i64::from_le_bytes(bytes)
            }
            Err(error) if error.status == stratus_client::Status::ObjectDoesntExist => 0,
            Err(error) => {
                return Err(format!(
                    "liveness: the final read of counter {index} failed after the faults \
                     stopped: {error}"
                )
                .into())
            }
        };
        finals.push(value);
    }
    *workload.counter_finals.lock().unwrap_or_else(|poison| poison.into_inner()) = finals;
    for (key, result) in keys.iter().zip(client.multi_read(&items).await) {
        if let Err(error) = result {
            if !Outcome::is_refusal(error.status) {
                return Err(format!(
                    "liveness: the final multi-read's item {key} failed after the faults \
                     stopped: {error}"
                )
                .into());
            }
        }
    }
    if options.preload.is_some() {
        preload::verify(&client, table, &workload.preload).await?;
    }
    // The bank: every account readable (no lock left behind), its final balance recorded for
    // the checks after the run, and no live master holding a prepared operation.
    if let Some(bank) = &options.bank {
        bank::verify_accounts(
            client.client(),
            bank,
            &workload.bank,
            &observations,
            LIVE_SAMPLE_AGE_MAX,
        )
        .await?;
    }
    // The lists: every one readable, read once more in one read-only transaction, and no
    // lock left.
    if let Some(lists) = &options.list_append {
        list_append::verify_lists(
            client.client(),
            lists,
            &workload.lists,
            &observations,
            LIVE_SAMPLE_AGE_MAX,
        )
        .await?;
    }
    // Durability restored: every live server's segments are back on R backups.
    let mut waited = Duration::ZERO;
    loop {
        let now = turmoil::sim_elapsed().unwrap_or_default();
        let short: Vec<String> = {
            let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
            observations
                .segments_short
                .iter()
                .filter(|(_, (sampled, short))| {
                    now.saturating_sub(*sampled) <= LIVE_SAMPLE_AGE_MAX && *short > 0
                })
                .map(|(server_id, (_, short))| format!("server {server_id}: {short}"))
                .collect()
        };
        if short.is_empty() {
            break;
        }
        if waited >= REREPLICATION_PATIENCE {
            return Err(format!(
                "durability: segments still on fewer than R backups {} s after the faults \
                 stopped ({})",
                REREPLICATION_PATIENCE.as_secs(),
                short.join(", ")
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }
    workload.verified.store(true, Ordering::Release);
    Ok(())
}

/// A server whose last sample is older than this is not running (crashed or stopped).
const LIVE_SAMPLE_AGE_MAX: Duration = Duration::from_millis(100);
/// How long after the faults every segment must be back on R backups.
const REREPLICATION_PATIENCE: Duration = Duration::from_secs(30);

/// Where the simulation's memory is now.
fn memory_sample(
    disks: &[Arc<SimulatedDisk>],
    observations: &Mutex<ServingObservations>,
) -> MemorySample {
    let segment_bytes = u64::from(nodes::store_config().segment_bytes);
    let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
    let backups = observations.backups.values().map(|(_, backup)| backup.statistics());
    let (buffers, replicas) = backups.fold((0, 0), |(buffers, replicas), statistics| {
        (buffers + statistics.buffers_in_use as u64, replicas + statistics.replicas as u64)
    });
    MemorySample {
        resident_bytes: resident_bytes(),
        disk_bytes: disks.iter().map(|disk| disk.held_bytes()).sum(),
        backup_buffer_bytes: buffers * segment_bytes,
        replicas,
    }
}

/// The process's resident memory now (`VmRSS`; 0 where the system does not say).
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: Option<u64> = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok());
    kib.unwrap_or(0) * 1024
}

fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for &byte in bytes {
        *hash ^= u64::from(byte);
        *hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
}

/// Runs one simulation from `seed`.
pub fn run(seed: u64, options: &SimulationOptions) -> Result<SimulationReport, SimulationFailure> {
    record_panics();
    PANICS.with(|panics| panics.borrow_mut().clear());
    let mut report = SimulationReport {
        seed,
        shape: (options.servers, options.replicas, options.clients),
        tablet_moves: options.tablet_moves,
        bank: options.bank.as_ref().map(|_| bank::BankSummary::default()),
        list_append: options.list_append.as_ref().map(|_| ListAppendSummary::default()),
        ..SimulationReport::default()
    };
    if options.bank.as_ref().is_some_and(|bank| bank.crash_a_client_mid_commit) {
        return Err(SimulationFailure {
            reason: "BankOptions::crash_a_client_mid_commit is not supported yet: it needs the \
                     participant-side transaction recovery manager"
                .to_string(),
            report: Box::new(report),
        });
    }
    let mut schedule_choices = Choices::new(seed ^ 0x5C4E_D01E);
    let mut disk_choices = Choices::new(seed ^ 0xD15C_0000);
    let durability = if schedule::percent(&mut schedule_choices, 50) {
        Durability::Buffered
    } else {
        Durability::Fsync
    };
    report.durability = durability.to_string();
    if let Some(script) = &options.scripted_faults {
        report.faults = script.clone();
    } else if let Some(tiering) = options.tiering.as_ref().filter(|_| options.faults) {
        report.faults = schedule::generate_tiered(
            &mut schedule_choices,
            options.servers,
            options.replicas,
            options.fault_window,
            tiering.tier == Tier::Auto,
        );
    } else if options.faults {
        report.faults = schedule::generate(
            &mut schedule_choices,
            options.servers,
            options.replicas,
            options.fault_window,
        );
    }
    let mut actions = timeline(&report.faults).into_iter().peekable();

    let mut simulation = turmoil::Builder::new()
        .simulation_duration(options.time_limit)
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_micros(100))
        .max_message_latency(Duration::from_millis(4))
        .tcp_capacity(1024)
        .rng_seed(seed)
        .build();

    let meta = Arc::new(MemoryMetaStore::new());
    // What the run costs, and the planted bug (which the wiretap plants).
    let measurements = (options.measure || options.planted_bug.is_some()).then(|| {
        Arc::new(Measurements {
            wiretap: Wiretap::new(options.servers, options.planted_bug),
            meta: Arc::new(MeteredMetaStore::new(meta.clone())),
            coordinator_cpu: Mutex::new(Vec::new()),
            memory: Mutex::new(Vec::new()),
        })
    });
    report.measurements = measurements.clone();
    let wiretap = measurements.as_ref().map(|measured| measured.wiretap.clone());
    let coordinator_meta: Arc<dyn stratus_meta::MetaStore> = match &measurements {
        Some(measured) => measured.meta.clone(),
        None => meta.clone(),
    };
    // The coordinator's processor time, read after every step (module `host_cpu`).
    let coordinator_cpu = Arc::new(AtomicU64::new(0));
    let _cpu_meter = options.measure.then(|| {
        let meter = host_cpu::HostCpuMeter::new("coordinator", coordinator_cpu.clone());
        tracing::subscriber::set_default(meter)
    });
    simulation.host(
        "coordinator",
        nodes::coordinator(seed, coordinator_meta, Arc::new(AtomicU64::new(0)), wiretap.clone()),
    );
    let observations = Arc::new(Mutex::new(ServingObservations::default()));
    let geometry_bytes = nodes::backup_config(durability).geometry().total_bytes();
    let disks: Vec<Arc<SimulatedDisk>> =
        (0..options.servers).map(|_| Arc::new(SimulatedDisk::new(geometry_bytes))).collect();
    let segment_bytes = u64::from(nodes::store_config().segment_bytes);
    let flashes: Vec<Arc<SimulatedFlash>> = match &options.tiering {
        Some(tiering) => (0..options.servers)
            .map(|_| SimulatedFlash::new(segment_bytes, tiering.flash_budget_bytes))
            .collect(),
        None => Vec::new(),
    };
    for (index, disk) in disks.iter().enumerate() {
        let setup = ServerSetup {
            seed,
            index,
            replicas: options.replicas,
            cleaner_levels: options.cleaner_levels,
            memory_target_percent: options.memory_target_percent,
            durability,
            disk: disk.clone(),
            observations: observations.clone(),
            incarnations: Arc::new(AtomicU64::new(0)),
            failure_domain: failure_domain_of(index, options.failure_domains),
            placement: options.placement,
            wiretap: wiretap.clone(),
            peer_probe: options.peer_probe,
            tiering: options.tiering.as_ref().map(|tiering| ServerTiering {
                flash: flashes[index].clone(),
                auto_dram_bytes_max: tiering.auto_dram_bytes_max,
            }),
        };
        simulation.host(server_host(index), nodes::server(setup));
    }
    let workload = Arc::new(Workload {
        recorder: Recorder::new(),
        clients_done: AtomicU32::new(0),
        faults_over: AtomicBool::new(false),
        verified: AtomicBool::new(false),
        tablet_splits: AtomicU32::new(0),
        tablet_migrations: AtomicU32::new(0),
        counter_finals: Mutex::new(Vec::new()),
        zombie_checked: AtomicBool::new(false),
        bank: bank::BankState::default(),
        lists: list_append::ListAppendState::default(),
        preload: Arc::new(PreloadState::default()),
    });
    let mut hosts: Vec<String> = vec!["coordinator".to_string()];
    hosts.extend((0..options.servers).map(server_host));
    for client_id in 0..options.clients {
        let name = format!("client-{client_id}");
        hosts.push(name.clone());
        simulation.client(name, run_client(seed, client_id, options.clone(), workload.clone()));
    }
    if options.preload.is_some() {
        hosts.push("loader".to_string());
        simulation.client("loader", run_loader(seed, options.clone(), workload.clone()));
    }
    if options.tablet_moves {
        hosts.push("operator".to_string());
        simulation.client("operator", run_operator(seed, options.clone(), workload.clone()));
    }
    if options.zombie_client {
        hosts.push("zombie".to_string());
        simulation.client("zombie", zombie::run(seed, options.clone(), workload.clone()));
    }
    if let Some(bank) = &options.bank {
        for index in 0..bank.transfer_clients {
            let name = format!("bank-client-{index}");
            hosts.push(name.clone());
            simulation
                .client(name, bank::run_transfers(seed, index, options.clone(), workload.clone()));
        }
        for index in 0..bank.auditors {
            let name = format!("bank-auditor-{index}");
            hosts.push(name.clone());
            simulation
                .client(name, bank::run_auditor(seed, index, options.clone(), workload.clone()));
        }
    }
    if let Some(lists) = &options.list_append {
        for index in 0..lists.clients {
            let name = format!("list-client-{index}");
            hosts.push(name.clone());
            simulation.client(
                name,
                list_append::run_client(seed, index, options.clone(), workload.clone()),
            );
        }
    }
    hosts.push("verifier".to_string());
    simulation
        .client("verifier", verify(seed, options.clone(), workload.clone(), observations.clone()));

    let fail = |reason: String, report: &SimulationReport| SimulationFailure {
        reason,
        report: Box::new(report.clone()),
    };
    let others = |server: usize| -> Vec<String> {
        hosts.iter().filter(|host| **host != server_host(server)).cloned().collect()
    };
    // Dropping a host's runtime (a crash, or the restart of a host whose software stopped)
    // closes its connections in the order tokio drops its tasks, which depends on task ids
    // numbered across the whole process: the FINs would reach the peers in a different order
    // in the second simulation of a process. A crashed machine sends nothing anyway, so the
    // host is cut off while its runtime is dropped (peers learn of the crash from resets and
    // timeouts, as they would).
    let quietly = |simulation: &mut turmoil::Sim<'_>,
                   host: String,
                   drop_runtime: &dyn Fn(&mut turmoil::Sim<'_>, &str)| {
        let peers: Vec<String> = hosts.iter().filter(|other| **other != host).cloned().collect();
        for peer in &peers {
            simulation.partition(host.as_str(), peer.as_str());
        }
        drop_runtime(simulation, &host);
        for peer in &peers {
            simulation.repair(host.as_str(), peer.as_str());
        }
    };
    let crash = |simulation: &mut turmoil::Sim<'_>, host: &str| simulation.crash(host);
    let mut recoveries: BTreeMap<u64, ServerRecovery> = std::collections::BTreeMap::new();
    let bounce = |simulation: &mut turmoil::Sim<'_>, host: &str| simulation.bounce(host);
    // Crashes timed at moves between tiers: the one waiting, and the crash and restart it
    // scheduled once it fired (empty unless the schedule has such faults).
    let mut armed: Option<ArmedCrash> = None;
    let mut timed_actions: Vec<(Duration, Action)> = Vec::new();
    let mut tier_crashes: (BTreeMap<TierMove, u64>, u64) = (BTreeMap::new(), 0);
    loop {
        let now = simulation.elapsed();
        if options.observe_recoveries {
            let crashing: BTreeSet<usize> = actions
                .clone()
                .take_while(|(at, _)| *at <= now)
                .filter_map(|(_, action)| match action {
                    Action::CrashServer { server, .. } => Some(server),
                    _ => None,
                })
                .collect();
            if !crashing.is_empty() {
                report.exposures.push(exposure(now, &crashing, &observations));
            }
        }
        let mut due: Vec<Action> = Vec::new();
        while let Some((_, action)) = actions.next_if(|(at, _)| *at <= now) {
            due.push(action);
        }
        if !timed_actions.is_empty() {
            due.extend(timed_actions.iter().filter(|(at, _)| *at <= now).map(|(_, a)| a.clone()));
            timed_actions.retain(|(at, _)| *at > now);
        }
        for action in due {
            match action {
                Action::CrashServer { server, flip_bit } => {
                    observations
                        .lock()
                        .unwrap_or_else(|poison| poison.into_inner())
                        .backups
                        .remove(&server);
                    quietly(&mut simulation, server_host(server), &crash);
                    disks[server].crash(&mut disk_choices);
                    if flip_bit {
                        disks[server].flip_bit(&mut disk_choices);
                    }
                }
                Action::RestartServer { server } => simulation.bounce(server_host(server)),
                Action::RestartServerIfStopped { server } => {
                    if !simulation.is_host_running(server_host(server)) {
                        // Its stopped software may have left tasks (and connections) behind.
                        quietly(&mut simulation, server_host(server), &bounce);
                    }
                }
                Action::CrashCoordinator => {
                    quietly(&mut simulation, "coordinator".to_string(), &crash)
                }
                Action::RestartCoordinator => simulation.bounce("coordinator"),
                Action::Partition { server } => {
                    for other in others(server) {
                        simulation.partition(server_host(server), other);
                    }
                }
                Action::Repair { server } => {
                    for other in others(server) {
                        simulation.repair(server_host(server), other);
                    }
                }
                Action::PartitionOneWay { server, outbound } => {
                    for other in others(server) {
                        if outbound {
                            simulation.partition_oneway(server_host(server), other);
                        } else {
                            simulation.partition_oneway(other, server_host(server));
                        }
                    }
                }
                Action::RepairOneWay { server, outbound } => {
                    for other in others(server) {
                        if outbound {
                            simulation.repair_oneway(server_host(server), other);
                        } else {
                            simulation.repair_oneway(other, server_host(server));
                        }
                    }
                }
                Action::Hold { server } => {
                    for other in others(server) {
                        simulation.hold(server_host(server), other);
                    }
                }
                Action::Release { server } => {
                    for other in others(server) {
                        simulation.release(server_host(server), other);
                    }
                }
                Action::FailSyncs { server } => disks[server].fail_syncs(3),
                Action::FailWrites { server } => disks[server].fail_writes(3),
                Action::RotBit { server } => {
                    disks[server].flip_bit(&mut disk_choices);
                }
                Action::ArmCrashAtTierMove { server, on, armed_for, down_for } => {
                    armed = Some(ArmedCrash {
                        fallback: server,
                        on,
                        until: now + armed_for,
                        down_for,
                        baselines: BTreeMap::new(),
                    });
                }
                Action::FailFlash { server, fault } => flashes[server].fail(fault),
                Action::HealFlash { server } => flashes[server].heal(),
            }
        }
        if actions.peek().is_none() && timed_actions.is_empty() && armed.is_none() {
            workload.faults_over.store(true, Ordering::Release);
        }
        let stepped = simulation.step();
        report.steps += 1;
        report.simulated = simulation.elapsed();
        if let Some(crash) = armed.as_mut() {
            // Crashed before the next step: in the millisecond of the move.
            if let Some((server, at_move)) = crash.due(report.simulated, &observations) {
                let down_for = crash.down_for;
                if at_move {
                    *tier_crashes.0.entry(crash.on).or_default() += 1;
                } else {
                    tier_crashes.1 += 1;
                }
                armed = None;
                let at = report.simulated;
                timed_actions.push((at, Action::CrashServer { server, flip_bit: false }));
                timed_actions.push((at + down_for, Action::RestartServer { server }));
            }
        }
        if let Some(measured) = measurements.as_ref().filter(|_| options.measure) {
            let spent = Duration::from_nanos(coordinator_cpu.swap(0, Ordering::Relaxed));
            measured.add_coordinator_cpu(report.simulated, spent);
            if measured.memory_due(report.simulated) {
                let sample = memory_sample(&disks, &observations);
                measured.note_memory(report.simulated, sample);
            }
        }
        if options.observe_recoveries && report.steps.is_multiple_of(10) {
            observe_recoveries(&meta, report.simulated, &mut recoveries);
        }
        if let Some(panic) = PANICS.with(|panics| panics.borrow().first().cloned()) {
            return Err(fail(format!("a node panicked: {panic}"), &report));
        }
        {
            let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
            if let Some(violation) = observations.violations.first() {
                return Err(fail(format!("single owner: {violation}"), &report));
            }
            report.serving_samples = observations.sample_count;
            report.cleaner_work = observations
                .cleaner_work
                .values()
                .fold((0, 0), |sum, work| (sum.0 + work.0, sum.1 + work.1));
        }
        match stepped {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => return Err(fail(format!("{error}"), &report)),
        }
    }
    report.recoveries = recoveries.into_values().collect();
    if options.tiering.is_some() {
        let mut summary = TieringSummary {
            crashes_at_moves: tier_crashes.0,
            crashes_after_waiting: tier_crashes.1,
            ..TieringSummary::default()
        };
        let observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
        for work in observations.tier_work.values() {
            summary.add_work(work);
        }
        for flash in &flashes {
            summary.add_device(flash.counts());
        }
        report.tiering = Some(summary);
    }
    if options.preload.is_some() {
        report.preloaded = Some(workload.preload.outcome());
    }
    report.disk_faults = disks
        .iter()
        .enumerate()
        .flat_map(|(index, disk)| {
            disk.faults().into_iter().map(move |fault| format!("server-{index}: {fault}"))
        })
        .collect();
    if let Ok(state) = stratus_coordinator::CoordinatorState::load(&*meta) {
        report.servers_recovered = state.servers_in(ServerStatus::Removed).count();
    }
    if !workload.verified.load(Ordering::Acquire) {
        return Err(fail("the verifier did not finish".to_string(), &report));
    }
    if options.zombie_client && !workload.zombie_checked.load(Ordering::Acquire) {
        return Err(fail("the zombie client did not finish its checks".to_string(), &report));
    }
    let history = workload.recorder.history();
    report.operations = history.len();
    report.multi_operation_items = workload.recorder.multi_operation_items();
    report.tablet_splits = workload.tablet_splits.load(Ordering::Acquire);
    report.tablet_migrations = workload.tablet_migrations.load(Ordering::Acquire);
    report.known_outcomes =
        history.operations.iter().filter(|operation| !operation.outcome.is_unknown()).count();
    report.history = history.operations.iter().map(|operation| operation.to_string()).collect();
    let mut fingerprint = 0xCBF2_9CE4_8422_2325u64;
    fnv1a(&mut fingerprint, format!("{:?}", history.operations).as_bytes());
    fnv1a(&mut fingerprint, &report.steps.to_le_bytes());
    fnv1a(&mut fingerprint, &report.serving_samples.to_le_bytes());
    if let Some(tiering) = &report.tiering {
        fnv1a(&mut fingerprint, format!("{tiering:?}").as_bytes());
    }
    if options.bank.is_some() {
        let log = workload.bank.log();
        fnv1a(&mut fingerprint, log.join("\n").as_bytes());
        report.history.extend(log);
    }
    if options.list_append.is_some() {
        let log = workload.lists.log();
        fnv1a(&mut fingerprint, log.join("\n").as_bytes());
        report.history.extend(log);
    }
    report.fingerprint = fingerprint;
    let verdict = check(&history, &CheckOptions::default());
    if !verdict.is_linearizable() {
        let mut reason = format!("history check: {verdict}");
        // The whole history of each violating key, on request (it can be long).
        if std::env::var_os("STRATUS_SIM_VERBOSE").is_some() {
            for key in verdict.violations() {
                reason.push_str(&format!("\nwhole history of {:?}:\n", key.key.escape_ascii()));
                for operation in &history.operations {
                    if operation.table == key.table && operation.key == key.key {
                        reason.push_str(&format!("  {operation}\n"));
                    }
                }
            }
        }
        return Err(fail(reason, &report));
    }
    // Exactly-once, where a register cannot see it: every counter's value is the number of
    // its increments that took effect, no more, no fewer.
    let finals =
        workload.counter_finals.lock().unwrap_or_else(|poison| poison.into_inner()).clone();
    let table = history.operations.iter().find(|operation| operation.key == counter_key(0));
    if let Some(table) = table.map(|operation| operation.table) {
        for (index, final_value) in finals.iter().enumerate() {
            let key = counter_key(index);
            match stratus_history::check_counter(&history, table, &key, *final_value) {
                Ok(counted) => report.counted_increments += counted.acknowledged,
                Err(violation) => {
                    return Err(fail(format!("counter {index}: {violation}"), &report));
                }
            }
        }
    }
    if let Some(bank) = &options.bank {
        match bank::check(&workload.bank, bank) {
            Ok(summary) => report.bank = Some(summary),
            Err(reason) => return Err(fail(reason, &report)),
        }
    }
    if options.list_append.is_some() {
        let (summary, verdict) = list_append::check(&workload.lists);
        report.list_append = Some(summary);
        if let Err(reason) = verdict {
            return Err(fail(reason, &report));
        }
    }
    Ok(report)
}
