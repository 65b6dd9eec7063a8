//! The software of each simulated node: the same services the `stratus` binary runs, wired to
//! the simulated network, clock and disk, each node on one thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use stratus_backup::{collect_garbage, BackupConfig, BackupRouter, BackupService, Durability};
use stratus_coordinator::{Coordinator, FailureDetectorConfig};
use stratus_env::Environment;
use stratus_master::{
    keep_lease, probe_peers, DeviceImages, Lease, Master, MasterConfig, PeerProbeConfig, Placement,
    RecoveryReader, ReplicaManager, ReplicationConfig,
};
use stratus_meta::MetaStore;
use stratus_rpc::{serve_admitting, Backoff, ChannelPool, RpcConfig, Service};
use stratus_store::{
    AutoStatistics, CleanOutcome, CleanStep, FlashImages, FlashTotals, ObjectStore, StoreConfig,
};
use stratus_types::{HashRange, ServerId, TableId};
use stratus_wire::{Request, Response, ResponseBody, ServiceMask, Status};

use crate::disk::SimulatedDisk;
use crate::flash::SimulatedFlash;
use crate::network::member_environment;
use crate::wiretap::{TappedNetwork, Wiretap};

/// The coordinator's host name and port.
pub const COORDINATOR_ADDRESS: &str = "coordinator:7400";
/// Every server listens on this port of its own host.
const SERVER_PORT: u16 = 7100;

/// A simulated host's result (turmoil's).
pub type HostResult = Result<(), Box<dyn std::error::Error>>;

/// The name of server `index`'s host.
pub fn server_host(index: usize) -> String {
    format!("server-{index}")
}

/// How often a server samples what it serves, for the single-owner invariant.
const SERVING_SAMPLE_INTERVAL: Duration = Duration::from_millis(10);
/// How often the cleaner task looks for work when it found none.
const CLEANER_IDLE_INTERVAL: Duration = Duration::from_millis(20);
/// How often a server checks whether the coordinator declared it crashed.
const DECLARED_CRASHED_CHECK_INTERVAL: Duration = Duration::from_millis(50);
/// How long the cleaner task stops demoting after flash refused an image (full or failing),
/// as the server's demoting thread does (`DEMOTION_RETRY_PAUSE` in stratus-master's
/// cleaner_threads.rs): each try compacts a segment for nothing.
const DEMOTION_RETRY_PAUSE: Duration = Duration::from_secs(1);

/// Sizes of the simulated servers: a log of 6 segments of 256 KiB in 16 KiB seglets, so that
/// the clients' filler writes fill it and the cleaner runs against replication, crashes and
/// recovery within a short run. The cleaner is told the servers' replica count by
/// [`run_server`], as `stratus server` tells it: with replicas it cleans in two levels.
pub fn store_config() -> StoreConfig {
    let mut store = StoreConfig::for_testing();
    store.log_bytes = 1536 << 10;
    // The auto tables' DRAM budget is a share of the log, so it follows the log's size.
    store.auto_dram_bytes_max = store.log_bytes / stratus_store::AUTO_DRAM_SHARE_OF_LOG_DIVISOR;
    store.segment_bytes = 256 << 10;
    store.seglet_bytes = 16 << 10;
    store.value_bytes_max = FILLER_VALUE_BYTES_MAX as u32;
    store
}

/// Largest value the clients' filler writes use (within the eighth of a segment the store
/// admits).
pub const FILLER_VALUE_BYTES_MAX: usize = 24 << 10;

/// The backup configuration of every simulated server.
pub fn backup_config(durability: Durability) -> BackupConfig {
    let mut config = BackupConfig::new(store_config().segment_bytes);
    config.frame_count = 96;
    config.buffer_count = 24;
    config.durability = durability;
    config.io_on_runtime = true;
    config
}

/// What a server serves at one moment (simulated milliseconds since the start).
#[derive(Clone, Debug)]
struct ServingSample {
    server_id: ServerId,
    host: String,
    tablets: Vec<(TableId, HashRange)>,
}

/// The single-owner invariant, checked as samples arrive: within one sampling period no two
/// servers may both hold a valid lease and own overlapping ranges of a table.
#[derive(Debug, Default)]
pub struct ServingObservations {
    /// The samples of the current period, by period number.
    period: u64,
    samples: Vec<ServingSample>,
    /// Every violation seen.
    pub violations: Vec<String>,
    /// Samples taken in all.
    pub sample_count: u64,
    /// The cleaner's work, per server incarnation (the latest figures of each).
    pub cleaner_work: std::collections::BTreeMap<ServerId, (u64, u64)>,
    /// Per server incarnation: when it last sampled (simulated time), and how many of its
    /// segments were then on fewer than R backups.
    pub segments_short: std::collections::BTreeMap<ServerId, (Duration, usize)>,
    /// Per server incarnation: when it last sampled, and how many transaction operations it
    /// then held prepared (each locking an object).
    pub prepared_ops: std::collections::BTreeMap<ServerId, (Duration, u64)>,
    /// Per server index: the running incarnation's id and backup, so the harness can see
    /// where every segment's copies are when servers crash (removed when it crashes).
    pub backups: std::collections::BTreeMap<usize, (ServerId, Arc<BackupService>)>,
    /// With a flash tier (`SimulationOptions::tiering`), per server index: the latest
    /// incarnation's id and store, which the harness reads between steps to time a crash at
    /// a move between tiers (weak: a crash drops the store with its runtime).
    pub stores: std::collections::BTreeMap<usize, (ServerId, Weak<ObjectStore>)>,
    /// With a flash tier, the tiers' work per server incarnation (the latest figures of each).
    pub tier_work: std::collections::BTreeMap<ServerId, TierWork>,
}

/// What a master's store did between its tiers (its counters since it was made).
#[derive(Clone, Copy, Debug, Default)]
pub struct TierWork {
    /// The flash tier's counters.
    pub flash: FlashTotals,
    /// The auto tables' figures.
    pub auto: AutoStatistics,
}

impl TierWork {
    /// The figures of `store` now.
    pub fn of(store: &ObjectStore) -> TierWork {
        TierWork { flash: store.flash_statistics().totals, auto: store.auto_statistics() }
    }
}

fn overlaps(first: &HashRange, second: &HashRange) -> bool {
    first.start <= second.end && second.start <= first.end
}

impl ServingObservations {
    fn record(&mut self, elapsed: Duration, sample: ServingSample) {
        let period = elapsed.as_millis() as u64 / SERVING_SAMPLE_INTERVAL.as_millis() as u64;
        if period != self.period {
            self.period = period;
            self.samples.clear();
        }
        self.sample_count += 1;
        for other in &self.samples {
            if other.server_id == sample.server_id {
                continue;
            }
            for (table, range) in &sample.tablets {
                for (other_table, other_range) in &other.tablets {
                    if table == other_table && overlaps(range, other_range) {
                        self.violations.push(format!(
                            "at {} ms two masters serve table {}: server {} ({}) {:?} and \
                             server {} ({}) {:?}",
                            elapsed.as_millis(),
                            table.0,
                            sample.server_id,
                            sample.host,
                            range,
                            other.server_id,
                            other.host,
                            other_range
                        ));
                    }
                }
            }
        }
        self.samples.push(sample);
    }
}

/// The coordinator's software. Its metadata store outlives its incarnations (it is the disk).
pub fn coordinator(
    seed: u64,
    meta: Arc<dyn MetaStore>,
    incarnations: Arc<AtomicU64>,
    wiretap: Option<Arc<Wiretap>>,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = HostResult>>> {
    move || {
        let meta = meta.clone();
        let wiretap = wiretap.clone();
        let incarnation = incarnations.fetch_add(1, Ordering::Relaxed);
        Box::pin(async move {
            let (environment, admission) = member_environment(seed, "coordinator", incarnation);
            let environment = tapped(environment, "coordinator", wiretap);
            let coordinator = Coordinator::open(meta, environment.clone())?;
            let listener = environment.network.bind("0.0.0.0:7400").await?;
            let background = coordinator.clone();
            tokio::spawn(async move { background.verify_servers_and_redeliver().await });
            let detector = coordinator.clone();
            tokio::spawn(async move {
                detector.run_failure_detector(FailureDetectorConfig::default()).await
            });
            serve_admitting(listener, Arc::new(coordinator), admission).await?;
            Ok(())
        })
    }
}

/// Everything a server needs that outlives one incarnation.
#[derive(Clone, Debug)]
pub struct ServerSetup {
    /// The simulation's seed.
    pub seed: u64,
    /// Index of the server.
    pub index: usize,
    /// Replicas per segment.
    pub replicas: usize,
    /// Cleaning levels (1 or 2).
    pub cleaner_levels: u32,
    /// The store's memory target.
    pub memory_target_percent: Option<u32>,
    /// When backups acknowledge.
    pub durability: Durability,
    /// Its disk.
    pub disk: Arc<SimulatedDisk>,
    /// Where it reports what it serves.
    pub observations: Arc<Mutex<ServingObservations>>,
    /// Incarnations so far.
    pub incarnations: Arc<AtomicU64>,
    /// Its failure domain (`stratus server --failure-domain`; empty: none).
    pub failure_domain: String,
    /// How its master places replicas.
    pub placement: Placement,
    /// Where its RPCs are counted (and a planted bug planted), if anywhere.
    pub wiretap: Option<Arc<Wiretap>>,
    /// How it pings its peers.
    pub peer_probe: PeerProbeConfig,
    /// Its flash tier, if it has one (`SimulationOptions::tiering`).
    pub tiering: Option<ServerTiering>,
}

/// A simulated server's flash tier.
#[derive(Clone, Debug)]
pub struct ServerTiering {
    /// Its flash (a new device per incarnation, the faults and counters shared).
    pub flash: Arc<SimulatedFlash>,
    /// The auto tables' DRAM budget (`StoreConfig::auto_dram_bytes_max`).
    pub auto_dram_bytes_max: u64,
}

/// `environment` with its connections seen by `wiretap` as host `host`'s (unchanged without
/// one).
fn tapped(mut environment: Environment, host: &str, wiretap: Option<Arc<Wiretap>>) -> Environment {
    if let Some(wiretap) = wiretap {
        environment.network = Arc::new(TappedNetwork::new(environment.network, host, wiretap));
    }
    environment
}

/// A storage server's software: backup on the node's disk, master, replica manager, lease,
/// cleaner (as a task: one thread per node), and the probe for the single-owner invariant.
pub fn server(
    setup: ServerSetup,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = HostResult>>> {
    move || {
        let setup = setup.clone();
        Box::pin(async move { run_server(setup).await })
    }
}

async fn run_server(setup: ServerSetup) -> HostResult {
    let host = server_host(setup.index);
    let incarnation = setup.incarnations.fetch_add(1, Ordering::Relaxed);
    let (environment, admission) = member_environment(setup.seed, &host, incarnation);
    let environment = tapped(environment, &host, setup.wiretap.clone());
    let listener = environment.network.bind(&format!("0.0.0.0:{SERVER_PORT}")).await?;
    let address = format!("{host}:{SERVER_PORT}");
    let mut store = store_config();
    // As `stratus server` configures it: two-level cleaning (compaction first) with replicas,
    // unless told to clean in one level.
    store.cleaner.replicas = if setup.cleaner_levels == 1 { 0 } else { setup.replicas as u32 };
    store.cleaner.memory_target_percent = setup.memory_target_percent;
    // As `stratus server --flash-gib` configures it: the budget counts in the segment limit.
    let mut flash_images: Option<Arc<dyn FlashImages>> = None;
    if let Some(tiering) = &setup.tiering {
        store.flash_image_bytes = tiering.flash.budget_bytes();
        store.auto_dram_bytes_max = tiering.auto_dram_bytes_max;
        let images = DeviceImages::on(tiering.flash.device())
            .map_err(|error| format!("the simulated flash refused to open: {error:?}"))?;
        flash_images = Some(Arc::new(images));
    }
    let (backup, _report) =
        BackupService::open(backup_config(setup.durability), setup.disk.clone())?;
    let backup = Arc::new(backup);
    let services = ServiceMask(ServiceMask::MASTER | ServiceMask::BACKUP);
    let Some(server_id) = enlist(&environment, &address, services, &setup.failure_domain).await
    else {
        return Ok(());
    };
    setup
        .observations
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .backups
        .insert(setup.index, (server_id, backup.clone()));
    let config = MasterConfig { flash_images, ..MasterConfig::memory_only(store) };
    let mut master = Master::new(server_id, config, environment.wall_clock.clone())?;
    if setup.tiering.is_some() {
        let store = Arc::downgrade(&master.store_handle());
        let mut observations =
            setup.observations.lock().unwrap_or_else(|poison| poison.into_inner());
        observations.stores.insert(setup.index, (server_id, store));
    }
    let mut config = ReplicationConfig::new(setup.replicas, COORDINATOR_ADDRESS.to_string());
    config.placement = setup.placement;
    let replication =
        ReplicaManager::start(server_id, config, master.store_handle(), environment.clone());
    master.set_replication(replication.clone());
    master.set_recovery_reader(RecoveryReader::new(environment.network.clone()));
    // Failure detection as `stratus server` runs it: ping random peers, report the silent.
    tokio::spawn(probe_peers(
        server_id,
        COORDINATOR_ADDRESS.to_string(),
        setup.peer_probe,
        replication.server_list(),
        environment.clone(),
    ));
    let sweep =
        master.check_client_leases(COORDINATOR_ADDRESS.to_string(), environment.network.clone());
    tokio::spawn(sweep);
    // Transactions whose client left them undecided are finished by their participants, as
    // `stratus server` does.
    tokio::spawn(stratus_master::finish_abandoned_transactions(
        master.store_handle(),
        COORDINATOR_ADDRESS.to_string(),
        environment.clone(),
    ));
    let lease = Lease::new();
    master.set_lease(lease.clone());
    tokio::spawn(keep_lease(
        lease.clone(),
        server_id,
        COORDINATOR_ADDRESS.to_string(),
        environment.network.clone(),
    ));
    let master = Arc::new(master);
    tokio::spawn(clean(master.clone(), replication.clone(), environment.clone()));
    tokio::spawn(sample_serving(
        master.clone(),
        replication.clone(),
        server_id,
        host,
        setup.observations,
        setup.tiering.is_some(),
    ));
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    tokio::spawn(collect_garbage(backup.clone(), COORDINATOR_ADDRESS.to_string(), pool));
    let service: Arc<dyn Service> = Arc::new(BackupRouter::new(backup, master));
    let serving = tokio::spawn(serve_admitting(listener, service, admission));
    // A zombie stops itself once it learns it was declared crashed (its tablets are served
    // elsewhere); the schedule starts it again as a new server.
    loop {
        tokio::time::sleep(DECLARED_CRASHED_CHECK_INTERVAL).await;
        if lease.is_crashed() || replication.is_fenced() {
            serving.abort();
            return Ok(());
        }
        if serving.is_finished() {
            return Err("the server's accept loop ended".into());
        }
    }
}

/// The cleaner, one unit of work at a time on the node's thread. A combined pass's survivors
/// are replicated by awaiting the replica manager (a cleaner thread would block on it). With a
/// flash tier it demotes first, a segment per unit, as the server's first cleaner thread does
/// (`Master::start_cleaner`).
async fn clean(master: Arc<Master>, replication: ReplicaManager, environment: Environment) {
    let mut demotion_paused_until = tokio::time::Instant::now();
    loop {
        let store = master.store();
        if store.has_flash() && tokio::time::Instant::now() >= demotion_paused_until {
            let now = stratus_store::WallTime::from_millis(environment.wall_clock.now_millis());
            match store.demote_once(now) {
                Ok(Some(_)) => {
                    tokio::task::yield_now().await;
                    continue;
                }
                Ok(None) => {}
                // Full or failing: the objects stay in memory; cleaning goes on.
                Err(_) => {
                    demotion_paused_until = tokio::time::Instant::now() + DEMOTION_RETRY_PAUSE
                }
            }
        }
        let outcome = match store
            .clean_step(stratus_store::WallTime::from_millis(environment.wall_clock.now_millis()))
        {
            CleanStep::Finished(outcome) => outcome,
            CleanStep::Replicate(pass) => {
                for &segment_id in pass.survivor_segments() {
                    let (bytes, certificate) =
                        store.log().segment_contents(segment_id).expect("survivor segment");
                    // Fenced, or the pump gone: this server is stopping, and so does its
                    // cleaner (its pass stays pending; nothing of it was fused).
                    if replication.replicate_survivor(segment_id, bytes, certificate).await.is_err()
                    {
                        return;
                    }
                }
                store.finish_combined_pass(pass)
            }
        };
        if matches!(outcome, CleanOutcome::Idle | CleanOutcome::NothingToClean) {
            tokio::time::sleep(CLEANER_IDLE_INTERVAL).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

async fn sample_serving(
    master: Arc<Master>,
    replication: ReplicaManager,
    server_id: ServerId,
    host: String,
    observations: Arc<Mutex<ServingObservations>>,
    tiering: bool,
) {
    let interval_ms = SERVING_SAMPLE_INTERVAL.as_millis() as u64;
    loop {
        // At the next multiple of the interval in simulated time, so that every server samples
        // at the same instant: a tablet handed from one master to another within a period
        // (a migration: the source lets go, then the coordinator tells the target) is then
        // never seen on both, while two masters serving it at one instant always are.
        let now_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis() as u64;
        let next_ms = (now_ms / interval_ms + 1) * interval_ms;
        tokio::time::sleep(Duration::from_millis(next_ms - now_ms)).await;
        {
            let elapsed = turmoil::sim_elapsed().unwrap_or_default();
            let short = replication.segments_short_of_replicas();
            let mut observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
            observations.segments_short.insert(server_id, (elapsed, short));
            let prepared = master.store().prepared_statistics().operations;
            observations.prepared_ops.insert(server_id, (elapsed, prepared));
            if tiering {
                observations.tier_work.insert(server_id, TierWork::of(master.store()));
            }
        }
        // What the request path checks: a master that would refuse every object request
        // serves nothing.
        if !master.may_serve() {
            continue;
        }
        let tablets = master.ownership().tablets();
        if tablets.is_empty() {
            continue;
        }
        let elapsed = turmoil::sim_elapsed().unwrap_or_default();
        let sample = ServingSample { server_id, host: host.clone(), tablets };
        let cleaner = master.store().cleaner_statistics();
        let mut observations = observations.lock().unwrap_or_else(|poison| poison.into_inner());
        observations.record(elapsed, sample);
        observations.cleaner_work.insert(server_id, (cleaner.compactions, cleaner.combined_passes));
    }
}

/// Joins the cluster; `None` if the coordinator refused (the node then stops).
async fn enlist(
    environment: &Environment,
    address: &str,
    services: ServiceMask,
    failure_domain: &str,
) -> Option<ServerId> {
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    let request = Request::EnlistServer {
        address: address.to_string(),
        services,
        previous_server_id: ServerId(0),
        failure_domain: failure_domain.to_string(),
    };
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    loop {
        match pool.call(COORDINATOR_ADDRESS, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::EnlistServer { server_id }))) => {
                return Some(server_id)
            }
            Ok((status, body)) => {
                tracing::error!(%status, ?body, "the coordinator refused enlistment");
                return None;
            }
            Err(_) => pool.forget(COORDINATOR_ADDRESS),
        }
        tokio::time::sleep(backoff.next_delay(&*environment.entropy)).await;
    }
}
