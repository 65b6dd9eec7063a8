//! Failure detection and master crash recovery, the coordinator's side
//! (docs/design/recovery.md).
//!
//! Storage servers ping random peers and report a peer that did not answer
//! (HINT_SERVER_CRASHED); the coordinator's own sweep of every server, much slower, is the
//! backstop. Either way a miss only makes the server a *suspect*: the coordinator pings it
//! itself, and declares it crashed only after it missed
//! [`FailureDetectorConfig::misses_to_declare`] of those pings in a row and its lease ended (one
//! late reply never declares anything). Declaring a master crashed starts its recovery: the
//! coordinator finds the crashed log's newest digest among the replicas the backups hold, checks
//! that every segment it lists has a replica, cuts the crashed master's tablets into one
//! partition per live master, and sends each partition to its recovery master
//! (RECOVER_TABLETS). A partition that comes back OK is durable on its new master: the tablet
//! map changes (persisted first), then the new owner is told to serve it. Partitions that failed
//! stay with the crashed master — clients see them as recovering — and the next attempt tries
//! them again. A recovery that cannot succeed because no complete log can exist (the master ran
//! without replicas, or no backup holds any of its log) leaves the tablets *unavailable* until an
//! operator accepts the loss (RECOVERY_ACCEPT_LOSS); they are then handed over empty.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stratus_log::{verify_replica, Certificate, TableStats, TableTally};
use stratus_rpc::{Backoff, ChannelPool, RpcConfig, RpcError};
use stratus_types::limits::TABLETS_PER_TABLE_MAX;
use stratus_types::{HashRange, SegmentId, ServerId, TableId, Tier};
use stratus_wire::codec::{RECOVERY_REPLICAS_MAX, RECOVERY_REPLICAS_PER_SEGMENT_MAX};
use stratus_wire::{
    RecoveryReplica, RecoverySegment, RecoveryTablet, ReplicaEntry, Request, Response,
    ResponseBody, ServerEntry, ServerStatus, Status,
};

use crate::metrics::CoordinatorCounters;

/// A recovered part: (table, the whole crashed tablet, the part, its recovery master, where
/// the part starts in that master's log).
type RecoveredPart = (TableId, HashRange, HashRange, ServerId, SegmentId);
use crate::records::{put_server, put_table, CoordinatorState, LogHead, TabletRecord};
use crate::service::Inner;

/// How the coordinator decides that a server crashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureDetectorConfig {
    /// Time between two sweeps in which the coordinator pings every server itself: the
    /// backstop for what peers do not report (a cluster of one server has no peer to ping it).
    pub backstop_interval: Duration,
    /// How long one of the coordinator's pings may take before it counts as missed.
    pub probe_timeout: Duration,
    /// The coordinator's own pings a suspect must miss in a row to be declared crashed.
    pub misses_to_declare: u32,
}

impl Default for FailureDetectorConfig {
    /// A suspect is declared after three missed pings of 250 ms (0.75 s of silence: one slow
    /// reply, a long pause or a busy core is not a crash) once its lease ended; with peers
    /// pinging every 100 ms (`stratus_master::PeerProbeConfig`), a crash is declared about 1 s
    /// after it happened. The backstop sweep runs every second: it costs the coordinator one
    /// ping per server per second, and is needed only when no peer reports.
    fn default() -> FailureDetectorConfig {
        FailureDetectorConfig {
            backstop_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_millis(250),
            misses_to_declare: 3,
        }
    }
}

/// Suspects the coordinator checks at once at most; hints about others are dropped meanwhile
/// (a later hint or the backstop sweep brings them back). Bounds the pings and tasks a flood of
/// hints can cause: each check is itself bounded (see [`Inner::check_suspect`]).
pub const SUSPECT_CHECKS_RUNNING_MAX: usize = 32;

/// After a check of a server ended, hints about it are ignored for this long: every server
/// pings a peer every 100 ms, so without it a slow server would be checked again and again.
pub const SUSPECT_CHECK_COOLDOWN: Duration = Duration::from_millis(500);

/// How long a master may serve after asking for its lease. About as long as a suspect's
/// check (three missed 250 ms pings), so a master's lease has ended by the time it would be
/// declared crashed anyway; long against the renewal interval (150 ms), so one slow renewal
/// costs nothing.
pub const LEASE_DURATION: Duration = Duration::from_millis(750);

/// Extra time a crash declaration waits past the end of the last lease: covers the two clocks
/// running at slightly different rates.
pub const LEASE_MARGIN: Duration = Duration::from_millis(50);

/// How long recovery waits for a backup to acknowledge BACKUP_START_PARTITIONING (it answers at
/// once when it is well) before it goes on without it.
const PARTITIONING_START_PATIENCE: Duration = Duration::from_secs(2);

/// How long one RECOVER_TABLETS may run: reading and replaying a whole partition.
const RECOVER_TABLETS_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a recovery waiting on a recovery master checks that it is still up.
const RECOVERY_MASTER_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How long one replica read by the coordinator (looking for the newest digest) may take.
const REPLICA_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long recovery waits for one backup to list the replicas it holds of the crashed master
/// (BACKUP_LIST_REPLICAS), not a replica read's 30 s: a backup answers from its in-memory
/// table at once, so this only covers a loaded machine, like the coordinator's other quick
/// calls to backups (fencing, on a 2 s request timeout; PARTITIONING_START_PATIENCE). Every
/// backup is asked at once, so a silent one costs a recovery attempt this long, once; the
/// attempt then goes again after its backoff (a backup that does not answer may hold what
/// completes the log).
const LIST_REPLICAS_TIMEOUT: Duration = Duration::from_secs(2);

/// Recovery attempts for one crashed master before the coordinator gives up until it restarts
/// (with the backoff below, well over half an hour of retrying).
const RECOVERY_ATTEMPTS_MAX: u32 = 1_000;

/// How long no backup that is up may hold anything of a crashed master's reported log before
/// its recovery is taken for impossible. Backups that restart (a cold start, a rolling restart)
/// list their replicas again within seconds of starting; meanwhile the tablets are reported
/// recovering, not unavailable, and clients wait rather than fail.
pub const LOG_MISSING_PATIENCE: Duration = Duration::from_secs(10);

/// Parts one crashed tablet is cut into at most (each is recovered by a different master).
const PARTS_PER_TABLET_MAX: u32 = 64;

/// What replaying one object costs, in bytes of data that take as long to replay: partitioning
/// weighs a tablet as its bytes plus this much per object. Replay does per-object work (a hash
/// table lookup and insert, a version comparison, an entry header) beside per-byte work
/// (copying and checksumming). Measured with `stratus bench recovery --servers 3 --data-mib
/// 128` at 100, 300 and 1 000-byte objects (docs/design/recovery.md, "Measured"), a least
/// squares fit gives 0.95 µs per object and 0.86 ns per byte: an object costs about as much as
/// 1 100 bytes of data. By bytes alone a master handed a table of 100-byte objects
/// replays several times longer than one handed the same bytes in 1 KB objects. The figure
/// matters within a factor of two or so: it only decides how finely such tables are cut.
const REPLAY_OBJECT_COST_BYTES: u128 = 1_100;

/// The pools recovery uses: long timeouts, separate from the coordinator's quick calls.
#[derive(Debug)]
pub(crate) struct RecoveryPools {
    /// For RECOVER_TABLETS.
    masters: ChannelPool,
    /// For listing and reading replicas on backups.
    backups: ChannelPool,
}

impl RecoveryPools {
    pub(crate) fn new(network: Arc<dyn stratus_env::Network>) -> RecoveryPools {
        let masters =
            RpcConfig { request_timeout: RECOVER_TABLETS_TIMEOUT, ..RpcConfig::default() };
        let backups = RpcConfig { request_timeout: REPLICA_READ_TIMEOUT, ..RpcConfig::default() };
        RecoveryPools {
            masters: ChannelPool::new(network.clone(), masters),
            backups: ChannelPool::new(network, backups),
        }
    }
}

/// How long a recovery may wait (for backups to return, for a master to recover onto) before
/// the wait is logged as a warning. Shorter waits are what a restart or a slow backup look
/// like, and are logged once at info: a cluster restarted in order reads calmly.
const RECOVERY_WAIT_WARNING_AFTER: Duration = Duration::from_secs(15);

/// How often a recovery that keeps waiting repeats its warning.
const RECOVERY_WAIT_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// Reports why a recovery waits, as a person wants to read it: each new reason once at info,
/// the same reason again only at debug, and a warning once the wait has lasted
/// [`RECOVERY_WAIT_WARNING_AFTER`] (repeated every [`RECOVERY_WAIT_WARNING_INTERVAL`]).
struct RecoveryWait {
    crashed: ServerId,
    since: tokio::time::Instant,
    last_reason: Option<String>,
    warned_at: Option<tokio::time::Instant>,
}

impl RecoveryWait {
    fn new(crashed: ServerId) -> RecoveryWait {
        RecoveryWait {
            crashed,
            since: tokio::time::Instant::now(),
            last_reason: None,
            warned_at: None,
        }
    }

    fn report(&mut self, attempt: u32, reason: &str) {
        let crashed = self.crashed;
        let now = tokio::time::Instant::now();
        let waited = now.duration_since(self.since);
        let warning_due = waited >= RECOVERY_WAIT_WARNING_AFTER
            && self
                .warned_at
                .is_none_or(|at| now.duration_since(at) >= RECOVERY_WAIT_WARNING_INTERVAL);
        if warning_due {
            let waited_seconds = waited.as_secs();
            tracing::warn!(%crashed, attempt, waited_seconds, reason, "recovery still waiting");
            self.warned_at = Some(now);
        } else if self.last_reason.as_deref() != Some(reason) {
            tracing::info!(%crashed, attempt, reason, "recovery waits; retrying");
        } else {
            tracing::debug!(%crashed, attempt, reason, "recovery waits; retrying");
        }
        self.last_reason = Some(reason.to_string());
    }
}

/// What one recovery attempt concluded.
enum Attempt {
    /// Every tablet of the crashed master is served elsewhere.
    Finished,
    /// Try again later, for this reason.
    Again(String),
}

/// A crashed master whose recovery cannot succeed: no complete copy of its log exists.
#[derive(Clone, Debug)]
pub(crate) struct Unrecoverable {
    /// Why (for the log and the operator).
    pub(crate) reason: String,
    /// An operator accepted the loss: the tablets are handed over empty.
    pub(crate) loss_accepted: bool,
}

/// The suspects the coordinator is checking, and when recent checks ended.
#[derive(Debug, Default)]
pub(crate) struct Suspects {
    /// Being checked (at most [`SUSPECT_CHECKS_RUNNING_MAX`]).
    pub(crate) checking: std::collections::BTreeSet<ServerId>,
    /// Checks that ended less than [`SUSPECT_CHECK_COOLDOWN`] ago (pruned on every hint, so at
    /// most the servers checked within one cooldown).
    pub(crate) checked_at: BTreeMap<ServerId, tokio::time::Instant>,
}

/// A replica some backup listed.
#[derive(Clone, Debug)]
struct Location {
    backup: String,
    epoch: u64,
    length: u32,
    /// The master marked it primary (its backup cuts it for the partitions ahead).
    primary: bool,
}

/// Where each recovery master reads the crashed log: the segments of its newest digest, each
/// with the replicas the backups listed, and the addresses those replicas name by index. Sent
/// whole in every RECOVER_TABLETS, so no recovery master asks the backups again (each used to
/// ask every backup: 64 × (N − 1) requests per crash among N servers).
#[derive(Clone, Debug, Default)]
struct LocatedLog {
    backups: Vec<String>,
    segments: Vec<RecoverySegment>,
}

impl LocatedLog {
    /// `segments` (every one located: the caller checked) with their newest epoch's replicas,
    /// best first: the longest, then the primary. Every newest-epoch replica holds every
    /// acknowledged write of its segment, so any will do. At most as many in all as keep the
    /// request within `RECOVERY_REPLICAS_MAX`: for a log of more than 131 072 segments, the
    /// budget is dealt evenly (the first segments one more), and which of a segment's replicas
    /// are left out turns with `rotation` (one draw per attempt), so a replica that fails to
    /// read does not fail every attempt.
    fn new(
        segments: &[SegmentId],
        locations: &BTreeMap<SegmentId, Vec<Location>>,
        rotation: u64,
    ) -> LocatedLog {
        let count = segments.len().max(1);
        let (share, spare) = (RECOVERY_REPLICAS_MAX / count, RECOVERY_REPLICAS_MAX % count);
        let mut backups: Vec<String> = Vec::new();
        let mut index_of: BTreeMap<String, u16> = BTreeMap::new();
        let mut located = Vec::with_capacity(segments.len());
        for (position, &segment_id) in segments.iter().enumerate() {
            let allowed =
                (share + usize::from(position < spare)).clamp(1, RECOVERY_REPLICAS_PER_SEGMENT_MAX);
            let found = locations.get(&segment_id).map(Vec::as_slice).unwrap_or_default();
            let newest = found.iter().map(|location| location.epoch).max().unwrap_or(0);
            let mut best: Vec<&Location> =
                found.iter().filter(|location| location.epoch == newest).collect();
            best.sort_by_key(|location| (std::cmp::Reverse(location.length), !location.primary));
            if best.len() > allowed {
                let turn = (rotation % best.len() as u64) as usize;
                best.rotate_left(turn);
            }
            let replicas = best
                .into_iter()
                .take(allowed)
                .map(|location| {
                    let backup = *index_of.entry(location.backup.clone()).or_insert_with(|| {
                        backups.push(location.backup.clone());
                        u16::try_from(backups.len() - 1)
                            .expect("at most SERVERS_MAX backups, which u16 indexes")
                    });
                    RecoveryReplica {
                        backup,
                        epoch: location.epoch,
                        length: location.length,
                        primary: location.primary,
                    }
                })
                .collect();
            located.push(RecoverySegment { segment_id, replicas });
        }
        LocatedLog { backups, segments: located }
    }

    fn segment_ids(&self) -> Vec<SegmentId> {
        self.segments.iter().map(|segment| segment.segment_id).collect()
    }
}

/// Who takes part in a recovery of `crashed`: the tablets it owns (with each one's creation
/// segment in its log), the masters that are up (id, address) and the addresses of the backups
/// that are up.
type Participants = (Vec<(TableId, HashRange, SegmentId)>, Vec<(ServerId, String)>, Vec<String>);

fn recovery_participants(state: &CoordinatorState, crashed: ServerId) -> Participants {
    let tablets = state
        .tables
        .values()
        .flat_map(|table| {
            table
                .tablets
                .iter()
                .filter(|tablet| tablet.owner == crashed)
                .map(|tablet| (table.table_id, tablet.range, tablet.creation_segment))
        })
        .collect();
    let masters = state
        .servers_in(ServerStatus::Up)
        .filter(|server| server.services.has_master())
        .map(|server| (server.server_id, server.address.clone()))
        .collect();
    let backups = state
        .servers_in(ServerStatus::Up)
        .filter(|server| server.services.has_backup())
        .map(|server| server.address.clone())
        .collect();
    (tablets, masters, backups)
}

/// One crashed tablet's live data as recovery expects it: the crashed master's TABLE_STATS
/// (what it held per table when its newest head opened) divided over the tablets of each table
/// it owned, in proportion to their hash spans. `None` for every tablet when the head holds no
/// TABLE_STATS (a log written before it existed): recovery then weighs tablets by span alone.
fn estimate_tablets(
    tablets: &[(TableId, HashRange, SegmentId)],
    statistics: Option<&TableStats>,
) -> Vec<Option<TableTally>> {
    let Some(statistics) = statistics else { return vec![None; tablets.len()] };
    let span = |range: &HashRange| u128::from(range.end - range.start) + 1;
    let listed =
        |table: TableId| statistics.tables.binary_search_by_key(&table, |(listed, _)| *listed).ok();
    // Per listed table (or, for `None`, all tables not listed together): the spans owned.
    let mut spans: BTreeMap<Option<usize>, u128> = BTreeMap::new();
    for (table, range, _) in tablets {
        *spans.entry(listed(*table)).or_default() += span(range);
    }
    tablets
        .iter()
        .map(|(table, range, _)| {
            let group = listed(*table);
            let total = match group {
                Some(index) => statistics.tables[index].1,
                None => statistics.others,
            };
            let share = |value: u64| {
                // span ≤ 2^64 and value < 2^64: the product fits in u128; span ≤ the group's
                // spans, so the quotient is at most `value`.
                (u128::from(value) * span(range) / spans[&group]) as u64
            };
            Some(TableTally { bytes: share(total.bytes), objects: share(total.objects) })
        })
        .collect()
}

/// A part of a crashed tablet, as one recovery master replays it: (table, whole tablet, part,
/// the tablet's creation segment in the crashed log).
type PlannedPart = (TableId, HashRange, HashRange, SegmentId);

/// A recovery's partitions: for each recovery master (an index into the masters, who number
/// `master_count`), its parts, with what it is expected to replay.
///
/// Every master gets work when there are parts enough: the tablets are cut until there are at
/// least `master_count` parts and no part is larger than an even share (the whole over
/// `master_count`), each cut going to the tablet whose parts are largest (by `estimates`,
/// weighed as bytes plus `REPLAY_OBJECT_COST_BYTES` per object, or by hash span where there are
/// none), so large tablets are cut finely and empty ones not at
/// all. A tablet is cut into at most `PARTS_PER_TABLET_MAX` (and `master_count`) equal hash
/// ranges, never into more parts than it has hashes, and into no more than `tablet_room` (per
/// table: how many tablets it may still gain) allows, since every part becomes a tablet of its
/// own. The parts are then dealt largest first, each to the master with the least expected so
/// far (ties: fewest parts, then the order from master `first`, which the caller picks at
/// random to spread recoveries over the cluster).
fn plan_partitions(
    tablets: &[(TableId, HashRange, SegmentId)],
    estimates: &[Option<TableTally>],
    master_count: usize,
    first: usize,
    mut tablet_room: BTreeMap<TableId, usize>,
) -> BTreeMap<usize, (Vec<PlannedPart>, Option<TableTally>)> {
    assert!(master_count > 0 && !tablets.is_empty(), "a recovery has masters and tablets");
    assert_eq!(tablets.len(), estimates.len(), "one estimate per tablet");
    let span = |index: usize| u128::from(tablets[index].1.end - tablets[index].1.start) + 1;
    // The modelled replay time of a tablet, in bytes: at most 2^64 × 1 101 < 2^75, so sums
    // over any number of tablets and the products with part and master counts below stay
    // far inside u128.
    let weight = |index: usize| -> u128 {
        match estimates[index] {
            Some(estimate) => {
                u128::from(estimate.bytes) + u128::from(estimate.objects) * REPLAY_OBJECT_COST_BYTES
            }
            None => span(index),
        }
    };
    let parts_per_tablet_max = PARTS_PER_TABLET_MAX.min(master_count as u32);
    let mut parts = vec![1u32; tablets.len()];
    let mut parts_total = tablets.len();
    let weight_total: u128 = (0..tablets.len()).map(weight).sum();
    loop {
        // The tablet whose parts are largest, among those that may be cut further: weight / k
        // compared as weight_a · k_b against weight_b · k_a, exact in u128.
        let next = (0..tablets.len())
            .filter(|&index| {
                weight(index) > 0
                    && parts[index] < parts_per_tablet_max
                    // A range of n hashes splits into at most n parts.
                    && u128::from(parts[index]) < span(index)
                    && tablet_room.get(&tablets[index].0).copied().unwrap_or(0) > 0
            })
            .max_by(|&a, &b| {
                (weight(a) * u128::from(parts[b]))
                    .cmp(&(weight(b) * u128::from(parts[a])))
                    .then(b.cmp(&a))
            });
        let Some(index) = next else { break };
        // Above an even share of the whole (weight_total / master_count)?
        let above_even_share =
            weight(index) * master_count as u128 > weight_total * u128::from(parts[index]);
        if parts_total >= master_count && !above_even_share {
            break;
        }
        parts[index] += 1;
        parts_total += 1;
        *tablet_room.get_mut(&tablets[index].0).expect("filtered on room above") -= 1;
    }
    // Every part, largest first (stable: ties keep the tablets' order).
    let mut cut: Vec<(PlannedPart, Option<TableTally>, u128)> = Vec::with_capacity(parts_total);
    for (index, &(table_id, range, creation_segment)) in tablets.iter().enumerate() {
        let pieces = range.split(parts[index]);
        assert_eq!(pieces.len(), parts[index] as usize, "a cut past the tablet's hash span");
        let count = pieces.len() as u64;
        for part in pieces {
            let share = estimates[index].map(|estimate| TableTally {
                bytes: estimate.bytes / count,
                objects: estimate.objects / count,
            });
            cut.push((
                (table_id, range, part, creation_segment),
                share,
                weight(index) / u128::from(count),
            ));
        }
    }
    cut.sort_by_key(|part| std::cmp::Reverse(part.2));
    // Per master: expected weight and parts so far.
    let mut loads: Vec<(u128, usize)> = vec![(0, 0); master_count];
    let mut partitions: BTreeMap<usize, (Vec<PlannedPart>, Option<TableTally>)> = BTreeMap::new();
    for (part, share, part_weight) in cut {
        let master = (0..master_count)
            .map(|offset| (first + offset) % master_count)
            .min_by_key(|&master| loads[master])
            .expect("at least one master");
        loads[master].0 += part_weight;
        loads[master].1 += 1;
        let (planned, expected) = partitions
            .entry(master)
            .or_insert_with(|| (Vec::new(), share.map(|_| TableTally::default())));
        planned.push(part);
        if let (Some(expected), Some(share)) = (expected.as_mut(), share) {
            // Saturating: the statistics come from replica bytes, checksummed but not trusted.
            expected.bytes = expected.bytes.saturating_add(share.bytes);
            expected.objects = expected.objects.saturating_add(share.objects);
        }
    }
    partitions
}

impl Inner {
    /// Runs the failure detector forever: every [`FailureDetectorConfig::backstop_interval`]
    /// the coordinator pings every server that is up itself, and checks each that missed (the
    /// backstop: peers' hints are the fast path, see [`Inner::hint_server_crashed`]).
    pub(crate) async fn run_failure_detector(self: Arc<Self>, config: FailureDetectorConfig) {
        if self.detector.set(config).is_err() {
            tracing::warn!("the failure detector is already running");
            return;
        }
        loop {
            tokio::time::sleep(config.backstop_interval).await;
            if !self.is_active() {
                continue;
            }
            let servers: Vec<ServerEntry> =
                self.state.lock().await.servers_in(ServerStatus::Up).cloned().collect();
            self.ping_misses().retain(|id, _| servers.iter().any(|server| server.server_id == *id));
            let mut probes = tokio::task::JoinSet::new();
            for server in servers {
                let inner = self.clone();
                probes.spawn(async move {
                    let answered = inner.ping(&server.address, config.probe_timeout).await;
                    (server.server_id, answered)
                });
            }
            while let Some(joined) = probes.join_next().await {
                let Ok((server_id, answered)) = joined else { continue };
                if answered {
                    self.ping_misses().remove(&server_id);
                } else {
                    self.suspect(server_id, "missed the coordinator's sweep");
                }
            }
        }
    }

    /// One ping of `address` with `timeout`; true if it answered OK in time.
    async fn ping(&self, address: &str, timeout: Duration) -> bool {
        let answered = matches!(
            tokio::time::timeout(timeout, self.pool.call(address, &Request::Ping)).await,
            Ok(Ok((Status::Ok, _)))
        );
        if !answered {
            self.pool.forget(address);
        }
        answered
    }

    /// HINT_SERVER_CRASHED: a peer's ping of `server_id` went unanswered. Only a hint: the
    /// suspect is checked by the coordinator's own pings (rate-limited, see [`Inner::suspect`]).
    pub(crate) async fn hint_server_crashed(
        self: &Arc<Self>,
        server_id: ServerId,
    ) -> Result<Response, (Status, String)> {
        let status = self.state.lock().await.servers.get(&server_id).map(|server| server.status);
        match status {
            None => Err((Status::InvalidParameter, format!("no server {server_id}"))),
            Some(ServerStatus::Up) => {
                CoordinatorCounters::count(&self.counters.crash_hints_received, 1);
                self.suspect(server_id, "a peer's ping went unanswered");
                Ok(Response::HintServerCrashed)
            }
            // Already declared: nothing more to check.
            Some(_) => Ok(Response::HintServerCrashed),
        }
    }

    /// Starts checking `server_id` unless it is being checked, was checked less than
    /// [`SUSPECT_CHECK_COOLDOWN`] ago, [`SUSPECT_CHECKS_RUNNING_MAX`] checks are running, or
    /// the failure detector does not run.
    pub(crate) fn suspect(self: &Arc<Self>, server_id: ServerId, why: &'static str) {
        let Some(config) = self.detector.get().copied() else { return };
        {
            let mut suspects = self.suspects();
            let now = tokio::time::Instant::now();
            suspects.checked_at.retain(|_, at| now.duration_since(*at) < SUSPECT_CHECK_COOLDOWN);
            if suspects.checking.contains(&server_id)
                || suspects.checked_at.contains_key(&server_id)
            {
                return;
            }
            if suspects.checking.len() >= SUSPECT_CHECKS_RUNNING_MAX {
                CoordinatorCounters::count(&self.counters.crash_hints_dropped, 1);
                return;
            }
            suspects.checking.insert(server_id);
        }
        tracing::debug!(%server_id, why, "checking a suspect");
        let inner = self.clone();
        tokio::spawn(async move {
            inner.check_suspect(server_id, config).await;
            let mut suspects = inner.suspects();
            suspects.checking.remove(&server_id);
            suspects.checked_at.insert(server_id, tokio::time::Instant::now());
        });
    }

    /// The suspects being checked, and when recent checks ended.
    pub(crate) fn suspects(&self) -> std::sync::MutexGuard<'_, Suspects> {
        self.suspects.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Pings `server_id` (each ping at most `probe_timeout`, one started every `probe_timeout`)
    /// until it answers — it is alive, and its missed pings are forgotten — or it has missed
    /// `misses_to_declare` in a row and its lease ended: then it is declared crashed. Once it
    /// has missed that many its lease renewals are refused (see `renew_lease`), so its lease
    /// ends; the check gives up after the time that takes (a failed declaration is retried by
    /// the next hint or sweep), so it sends a bounded number of pings.
    async fn check_suspect(self: &Arc<Self>, server_id: ServerId, config: FailureDetectorConfig) {
        let misses_then_lease =
            config.probe_timeout * (config.misses_to_declare + 1) + LEASE_DURATION + LEASE_MARGIN;
        let deadline = tokio::time::Instant::now() + misses_then_lease;
        loop {
            let address = {
                let state = self.state.lock().await;
                match state.servers.get(&server_id) {
                    Some(server) if server.status == ServerStatus::Up => server.address.clone(),
                    _ => return,
                }
            };
            let started = tokio::time::Instant::now();
            if self.ping(&address, config.probe_timeout).await {
                self.ping_misses().remove(&server_id);
                tracing::debug!(%server_id, "a suspect answered: alive");
                return;
            }
            let missed = {
                let mut misses = self.ping_misses();
                let missed = misses.entry(server_id).or_insert(0);
                *missed = missed.saturating_add(1);
                *missed
            };
            // A server whose lease may still run could still be serving: the declaration
            // waits for the lease to end (checked again under the state lock). Meanwhile its
            // renewals are refused (see `renew_lease`), so the lease does end.
            if missed >= config.misses_to_declare
                && self.declare_crashed(server_id, "missed pings", true).await
            {
                self.ping_misses().remove(&server_id);
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::debug!(%server_id, missed, "suspect check ended undecided");
                return;
            }
            tokio::time::sleep_until(started + config.probe_timeout).await;
        }
    }

    /// Missed pings per server, shared with `renew_lease`.
    pub(crate) fn ping_misses(&self) -> std::sync::MutexGuard<'_, BTreeMap<ServerId, u32>> {
        self.ping_misses.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Marks `server_id` crashed (persisted first) and starts recovering its tablets. With
    /// `require_lease_expired`, only if no lease it was granted can still run — checked under
    /// the state lock, which lease grants also take, so no renewal slips in between. Returns
    /// whether the server is now crashed.
    pub(crate) async fn declare_crashed(
        self: &Arc<Self>,
        server_id: ServerId,
        why: &str,
        require_lease_expired: bool,
    ) -> bool {
        {
            let mut state = self.state.lock().await;
            let Some(server) = state.servers.get(&server_id).cloned() else { return false };
            if server.status != ServerStatus::Up {
                return true;
            }
            {
                // No lease is granted from here on (renewals check membership under this lock).
                let mut leases = self.leases();
                if require_lease_expired && !self.lease_expired_in(&leases, server_id) {
                    return false;
                }
                leases.members.remove(&server_id);
            }
            let crashed = ServerEntry { status: ServerStatus::Crashed, ..server };
            if self.persist(vec![put_server(&crashed)]).await.is_err() {
                self.leases().members.insert(server_id);
                return false;
            }
            tracing::warn!(%server_id, address = %crashed.address, why, "server declared crashed");
            CoordinatorCounters::count(&self.counters.servers_declared_crashed, 1);
            state.servers.insert(server_id, crashed);
        }
        self.start_recovery(server_id).await;
        true
    }

    /// Starts recovering the tablets of crashed master `crashed` unless a recovery of it is
    /// already running.
    pub(crate) async fn start_recovery(self: &Arc<Self>, crashed: ServerId) {
        {
            let mut running = self.recoveries.lock().await;
            if !running.insert(crashed) {
                return;
            }
        }
        CoordinatorCounters::count(&self.counters.recoveries_started, 1);
        let inner = self.clone();
        tokio::spawn(async move {
            inner.recover_master(crashed).await;
            inner.recoveries.lock().await.remove(&crashed);
        });
    }

    /// Starts recoveries for every crashed or stopped server (after a restart of the
    /// coordinator, or after servers were found gone). One that owns no tablet is simply marked
    /// removed, so backups free its replicas.
    pub(crate) async fn resume_recoveries(self: &Arc<Self>) {
        let crashed: Vec<ServerId> = self
            .state
            .lock()
            .await
            .servers_awaiting_recovery()
            .map(|server| server.server_id)
            .collect();
        for server_id in crashed {
            self.start_recovery(server_id).await;
        }
    }

    async fn recover_master(self: &Arc<Self>, crashed: ServerId) {
        let started = tokio::time::Instant::now();
        // Whatever path declared the crash, the master may still hold a lease granted just
        // before: nothing is read from its backups until that lease has ended. No lease is
        // granted after the declaration, so this ends within one lease.
        while !self.lease_expired(crashed) {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        let mut waiting = RecoveryWait::new(crashed);
        for attempt in 1..=RECOVERY_ATTEMPTS_MAX {
            if !self.is_active() {
                // Deposed: the successor resumes this recovery from the metadata.
                tracing::warn!(%crashed, "not the active coordinator any more; recovery left to the successor");
                return;
            }
            match self.recovery_attempt(crashed).await {
                Attempt::Finished => {
                    self.unrecoverable().remove(&crashed);
                    self.log_missing_since().remove(&crashed);
                    tracing::info!(%crashed, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "recovery finished");
                    CoordinatorCounters::count(&self.counters.recoveries_completed, 1);
                    self.mark_removed(crashed).await;
                    return;
                }
                Attempt::Again(reason) => {
                    waiting.report(attempt, &reason);
                    CoordinatorCounters::count(&self.counters.recovery_attempts_incomplete, 1);
                }
            }
            tokio::time::sleep(backoff.next_delay(&*self.environment.entropy)).await;
        }
        tracing::error!(%crashed, "recovery gave up after {RECOVERY_ATTEMPTS_MAX} attempts; its tablets stay unavailable until the coordinator restarts");
        CoordinatorCounters::count(&self.counters.recoveries_abandoned, 1);
    }

    /// A recovered master is *removed*: nothing of it is needed any more, and backups free its
    /// replicas (their garbage collection looks for removed masters).
    async fn mark_removed(&self, server_id: ServerId) {
        let mut state = self.state.lock().await;
        let Some(server) = state.servers.get(&server_id).cloned() else { return };
        if !server.status.awaits_recovery() {
            return;
        }
        // Its replicas are freed once it is removed: never while it still owns a tablet.
        if state.owns_tablets(server_id) {
            tracing::warn!(%server_id, "not removing a crashed master that still owns tablets");
            return;
        }
        let removed = ServerEntry { status: ServerStatus::Removed, ..server };
        if self.persist(vec![put_server(&removed)]).await.is_ok() {
            state.servers.insert(server_id, removed);
        }
    }

    async fn recovery_attempt(self: &Arc<Self>, crashed: ServerId) -> Attempt {
        let (tablets, masters, backups, unreplicated) = {
            let state = self.state.lock().await;
            let (tablets, masters, backups) = recovery_participants(&state, crashed);
            let unreplicated =
                state.servers.get(&crashed).is_some_and(|server| server.services.is_unreplicated());
            (tablets, masters, backups, unreplicated)
        };
        if tablets.is_empty() {
            return Attempt::Finished;
        }
        if masters.is_empty() {
            return Attempt::Again("no master is up to recover onto".to_string());
        }
        if unreplicated {
            // Nothing of its log exists anywhere: no backup to fence or ask.
            return self.impossible(crashed, "it ran without replicas (memory only)").await;
        }
        // Fence first: from here on no backup accepts a write of the crashed master, so the
        // replicas read below hold every write it could ever have had acknowledged.
        if let Err(reason) = self.fence(crashed, &backups).await {
            return Attempt::Again(reason);
        }
        let locations = match self.locate_replicas(crashed, &backups).await {
            Ok(locations) => locations,
            Err(reason) => return Attempt::Again(reason),
        };
        if !locations.is_empty() {
            // Some of its log exists: at worst incomplete (waited for), not impossible.
            self.log_missing_since().remove(&crashed);
            self.unrecoverable().remove(&crashed);
        }
        let head = self.log_heads.lock().await.get(&crashed).copied();
        let (segments, table_stats) = match head {
            // It never reported a head, so it never had a replicated write acknowledged: nothing
            // to replay. (A master without replicas reports none either: handled above.)
            None => {
                tracing::warn!(%crashed, "the crashed master never reported a log head: its tablets are handed over empty");
                (Vec::new(), None)
            }
            // It had writes acknowledged (it reported a head), yet no backup that is up holds
            // anything of its log: no complete log can be read — unless a backup holding it is
            // restarting, so only once that lasted LOG_MISSING_PATIENCE. Every attempt looks
            // afresh, so a backup that returns later still makes the recovery possible.
            Some(_) if locations.is_empty() => {
                let since = *self
                    .log_missing_since()
                    .entry(crashed)
                    .or_insert_with(tokio::time::Instant::now);
                if since.elapsed() < LOG_MISSING_PATIENCE {
                    return Attempt::Again(
                        "no backup that is up holds any replica of its log (yet)".to_string(),
                    );
                }
                return self
                    .impossible(crashed, "no backup that is up holds any replica of its log")
                    .await;
            }
            Some(head) => {
                let head_found = locations
                    .get(&head.segment_id)
                    .is_some_and(|replicas| replicas.iter().any(|r| r.epoch >= head.epoch));
                if !head_found {
                    return Attempt::Again(format!(
                        "no backup that is up holds head segment {} at epoch {} or newer",
                        head.segment_id, head.epoch
                    ));
                }
                match self.newest_digest(crashed, &locations, head).await {
                    Ok(found) => found,
                    Err(reason) => return Attempt::Again(reason),
                }
            }
        };
        if let Some(missing) = segments.iter().find(|id| !locations.contains_key(id)) {
            return Attempt::Again(format!(
                "the log is incomplete: no live backup holds segment {missing} of the digest"
            ));
        }
        // Drawn only for a log so long that some of its replicas are left out: every other
        // recovery draws what it drew before (the simulator's seeds run as they did).
        let long_log = segments.len() > RECOVERY_REPLICAS_MAX / RECOVERY_REPLICAS_PER_SEGMENT_MAX;
        let rotation =
            if long_log { self.environment.entropy.below(u64::from(u32::MAX)) } else { 0 };
        let located = LocatedLog::new(&segments, &locations, rotation);
        self.recover_partitions(
            crashed,
            &tablets,
            &masters,
            &backups,
            located,
            table_stats.as_ref(),
        )
        .await
    }

    /// A recovery that cannot succeed: no complete copy of `crashed`'s log exists. Unless an
    /// operator accepted the loss, its tablets stay unavailable (clients are told so at once)
    /// and the attempt ends; later attempts look again, in case a backup holding the log
    /// returns. Once the loss is accepted, the tablets are handed over empty.
    async fn impossible(self: &Arc<Self>, crashed: ServerId, reason: &str) -> Attempt {
        let accepted = {
            let mut unrecoverable = self.unrecoverable();
            let entry = unrecoverable.entry(crashed).or_insert_with(|| {
                tracing::error!(
                    %crashed, reason,
                    "recovery is impossible: no complete log of the crashed master exists; its \
                     tablets stay unavailable until an operator runs `stratus recovery \
                     accept-loss {crashed}` (they are then handed over empty)"
                );
                Unrecoverable { reason: reason.to_string(), loss_accepted: false }
            });
            entry.reason = reason.to_string();
            entry.loss_accepted
        };
        // Its tablets are reported unavailable from now on: clients waiting stop waiting.
        self.recoveries_settled.notify_waiters();
        if !accepted {
            return Attempt::Again(format!(
                "recovery is impossible ({reason}); waiting for an operator to accept the loss"
            ));
        }
        tracing::warn!(%crashed, reason, "the loss was accepted: handing the tablets over empty");
        let (tablets, masters, backups) = recovery_participants(&*self.state.lock().await, crashed);
        if tablets.is_empty() {
            return Attempt::Finished;
        }
        if masters.is_empty() {
            return Attempt::Again("no master is up to recover onto".to_string());
        }
        let nothing_to_replay = LocatedLog::default();
        self.recover_partitions(crashed, &tablets, &masters, &backups, nothing_to_replay, None)
            .await
    }

    /// Since when no backup that is up has held anything of each crashed master's log (only
    /// masters that reported a log head and are being recovered).
    pub(crate) fn log_missing_since(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<ServerId, tokio::time::Instant>> {
        self.log_missing_since.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The crashed masters whose recovery was found impossible.
    pub(crate) fn unrecoverable(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<ServerId, Unrecoverable>> {
        self.unrecoverable.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// RECOVERY_ACCEPT_LOSS: the operator accepts that `server_id`'s data is lost; its recovery
    /// (started again if it had given up) hands its tablets over empty.
    pub(crate) async fn accept_loss(
        self: &Arc<Self>,
        server_id: ServerId,
    ) -> Result<Response, (Status, String)> {
        {
            let mut unrecoverable = self.unrecoverable();
            let Some(entry) = unrecoverable.get_mut(&server_id) else {
                return Err((
                    Status::InvalidParameter,
                    format!(
                        "the recovery of server {server_id} is not blocked as impossible: \
                         nothing to accept (it is up, recovers, waits for backups that may \
                         return, or is unknown)"
                    ),
                ));
            };
            if !entry.loss_accepted {
                entry.loss_accepted = true;
                tracing::warn!(%server_id, reason = %entry.reason, "an operator accepted the loss of a crashed master's data");
            }
        }
        self.start_recovery(server_id).await;
        Ok(Response::RecoveryAcceptLoss)
    }

    /// Sends each recovery master its partition of `tablets` (replaying the segments of
    /// `located`, none to hand the tablets over empty; `table_stats` from the crashed log's
    /// newest head sizes the partitions) and commits what comes back durable. `backups`: every
    /// backup that is up (each cuts its primary replicas for the partitions ahead).
    async fn recover_partitions(
        self: &Arc<Self>,
        crashed: ServerId,
        tablets: &[(TableId, HashRange, SegmentId)],
        masters: &[(ServerId, String)],
        backups: &[String],
        located: LocatedLog,
        table_stats: Option<&TableStats>,
    ) -> Attempt {
        let segments = located.segment_ids();
        // Room for more tablets in each table: recovered parts become tablets of their own.
        // And each table's tier, which every recovery master is told with its parts so that it
        // replays them into that tier.
        let (tablet_room, tiers): (BTreeMap<TableId, usize>, BTreeMap<TableId, Tier>) = {
            let state = self.state.lock().await;
            let room = state.tables.values().map(|table| {
                (table.table_id, TABLETS_PER_TABLE_MAX.saturating_sub(table.tablets.len()))
            });
            let tiers = state.tables.values().map(|table| (table.table_id, table.tier));
            (room.collect(), tiers.collect())
        };
        // The restarted successor of the crashed server (the same index), if it is up, is
        // dealt first: a server stopped and started again gets its tablets back when they fit
        // one part each, so a restart leaves the cluster as it was. Otherwise a random master,
        // to spread recoveries over the cluster.
        let successor = masters.iter().position(|(id, _)| id.index() == crashed.index());
        let first = successor
            .unwrap_or_else(|| self.environment.entropy.below(masters.len() as u64) as usize);
        let estimates = estimate_tablets(tablets, table_stats);
        let partitions = plan_partitions(tablets, &estimates, masters.len(), first, tablet_room);
        tracing::info!(
            %crashed,
            tablets = tablets.len(),
            segments = segments.len(),
            recovery_masters = partitions.len(),
            sized_by = if table_stats.is_some() { "table stats" } else { "hash span" },
            "recovering"
        );
        for (index, (parts, expected)) in &partitions {
            let recovery_master = masters[*index].0;
            match expected {
                Some(expected) => tracing::info!(
                    %crashed,
                    %recovery_master,
                    parts = parts.len(),
                    expected_bytes = expected.bytes,
                    expected_objects = expected.objects,
                    "recovery partition planned"
                ),
                None => tracing::info!(
                    %crashed,
                    %recovery_master,
                    parts = parts.len(),
                    "recovery partition planned"
                ),
            }
        }
        let partitions: BTreeMap<usize, Vec<PlannedPart>> =
            partitions.into_iter().map(|(index, (parts, _))| (index, parts)).collect();

        if !self.is_active() {
            return Attempt::Again("not the active coordinator".to_string());
        }
        // Above every assignment made before this attempt, the transfers of these ranges
        // included: each recovery master refuses their batches from now on (a first batch
        // arriving late would drop what it replays). Persisted before any message carries it.
        let assignment_epoch = {
            let mut state = self.state.lock().await;
            let (epoch, persist_epoch) = state.next_assignment_epoch();
            if let Err((_, reason)) = self.persist(vec![persist_epoch]).await {
                return Attempt::Again(format!("persisting the recovery's epoch: {reason}"));
            }
            epoch
        };
        // Each recovery master's tablets, exactly as its RECOVER_TABLETS names them: the
        // backups cut their replicas for these partitions ahead of the requests.
        let partitions: Vec<_> = partitions
            .into_iter()
            .map(|(index, parts)| {
                let tablets: Vec<RecoveryTablet> = parts
                    .iter()
                    .map(|&(table_id, _, range, creation_segment)| RecoveryTablet {
                        table_id,
                        range,
                        creation_segment,
                        // A table dropped since the participants were read: its parts are
                        // replayed but never committed (`commit_recovered` skips tables that
                        // are gone), so the tier they are replayed into does not matter.
                        tier: tiers.get(&table_id).copied().unwrap_or_default(),
                    })
                    .collect();
                (index, parts, tablets)
            })
            .collect();
        if !segments.is_empty() {
            let tablets = partitions.iter().map(|(_, _, tablets)| tablets.clone()).collect();
            self.start_partitioning(crashed, &segments, tablets, backups).await;
        }
        let mut calls = tokio::task::JoinSet::new();
        for (index, parts, tablets) in partitions {
            let (master_id, address) = masters[index].clone();
            let request = Request::RecoverTablets {
                master_id,
                crashed_master: crashed,
                tablets,
                backups: located.backups.clone(),
                segments: located.segments.clone(),
                assignment_epoch,
            };
            let inner = self.clone();
            calls.spawn(async move {
                // A recovery master that dies silently (power loss, a partition) never answers
                // and never closes the connection: stop waiting once the failure detector has
                // declared it crashed, so this attempt ends and the next one gives its part to
                // a live master, instead of waiting out the call's long timeout. (The
                // simulation found a recovery stalled that way.)
                let call = inner.recovery_pools.masters.call(&address, &request);
                let outcome = tokio::select! {
                    biased;
                    outcome = call => outcome,
                    () = inner.until_not_up(master_id) => Err(RpcError::ConnectionLost(format!(
                        "recovery master {master_id} was declared crashed"
                    ))),
                };
                if outcome.is_err() {
                    inner.recovery_pools.masters.forget(&address);
                }
                (master_id, address, parts, outcome)
            });
        }
        let mut recovered: Vec<RecoveredPart> = Vec::new();
        let mut failures = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let (master_id, address, parts, outcome) = match joined {
                Ok(call) => call,
                Err(error) => {
                    failures.push(format!("a recovery call task failed: {error}"));
                    continue;
                }
            };
            match outcome {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::RecoverTablets { creation_segment, .. }),
                )) => {
                    recovered.extend(parts.into_iter().map(|(table, tablet, part, _)| {
                        (table, tablet, part, master_id, creation_segment)
                    }));
                }
                Ok((status, body)) => failures.push(format!("{address}: {status} {body:?}")),
                Err(error) => failures.push(format!("{address}: {error}")),
            }
        }
        if let Err(reason) = self.commit_recovered(crashed, &recovered).await {
            failures.push(reason);
        }
        if failures.is_empty() {
            // Finished only if the map agrees that no tablet is left with `crashed`.
            if self.state.lock().await.owns_tablets(crashed) {
                Attempt::Again("tablets are left after the commit".to_string())
            } else {
                Attempt::Finished
            }
        } else {
            Attempt::Again(format!("some partitions failed: {}", failures.join("; ")))
        }
    }

    /// Returns once `server_id` is no longer up in the server list (crashed or removed).
    async fn until_not_up(&self, server_id: ServerId) {
        loop {
            let up = self
                .state
                .lock()
                .await
                .servers
                .get(&server_id)
                .is_some_and(|server| server.status == ServerStatus::Up);
            if !up {
                return;
            }
            tokio::time::sleep(RECOVERY_MASTER_CHECK_INTERVAL).await;
        }
    }

    /// Asks every backup to read its primary replicas of `segments` once and cut them into
    /// `partitions` before the recovery masters ask (BACKUP_START_PARTITIONING). Advisory: a
    /// backup that does not answer is not waited for again, and filters each part when asked.
    async fn start_partitioning(
        self: &Arc<Self>,
        crashed: ServerId,
        segments: &[SegmentId],
        partitions: Vec<Vec<RecoveryTablet>>,
        backups: &[String],
    ) {
        let request = Arc::new(Request::BackupStartPartitioning {
            master_id: crashed,
            segments: segments.to_vec(),
            partitions,
        });
        let mut starts = tokio::task::JoinSet::new();
        for backup in backups {
            let inner = self.clone();
            let backup = backup.clone();
            let request = request.clone();
            starts.spawn(async move {
                let call = inner.recovery_pools.backups.call(&backup, &request);
                let outcome = tokio::time::timeout(PARTITIONING_START_PATIENCE, call)
                    .await
                    .unwrap_or_else(|_| Err(RpcError::Timeout));
                if outcome.is_err() {
                    inner.recovery_pools.backups.forget(&backup);
                }
                (backup, outcome)
            });
        }
        let mut replicas_to_partition = 0u64;
        while let Some(joined) = starts.join_next().await {
            match joined {
                Ok((
                    _,
                    Ok((
                        Status::Ok,
                        ResponseBody::Operation(Response::BackupStartPartitioning {
                            replicas_to_partition: count,
                        }),
                    )),
                )) => replicas_to_partition += u64::from(count),
                Ok((backup, outcome)) => {
                    tracing::warn!(%crashed, %backup, ?outcome, "a backup did not start partitioning; it filters on demand")
                }
                Err(error) => tracing::warn!(%crashed, %error, "a partitioning start task failed"),
            }
        }
        tracing::info!(%crashed, segments = segments.len(), replicas_to_partition, "backups partition the crashed log");
    }

    /// Tells every backup to refuse `crashed`'s writes (idempotent); fails unless all did.
    async fn fence(self: &Arc<Self>, crashed: ServerId, backups: &[String]) -> Result<(), String> {
        let mut fences = tokio::task::JoinSet::new();
        for backup in backups {
            let inner = self.clone();
            let backup = backup.clone();
            fences.spawn(async move {
                let request = Request::BackupFenceMaster { master_id: crashed };
                let outcome = inner.pool.call(&backup, &request).await;
                if outcome.is_err() {
                    inner.pool.forget(&backup);
                }
                (backup, outcome)
            });
        }
        let mut unfenced = Vec::new();
        while let Some(joined) = fences.join_next().await {
            match joined {
                Ok((_, Ok((Status::Ok, _)))) => {}
                Ok((backup, outcome)) => unfenced.push(format!("{backup}: {outcome:?}")),
                Err(error) => unfenced.push(error.to_string()),
            }
        }
        if unfenced.is_empty() {
            Ok(())
        } else {
            Err(format!("backups not fenced yet: {}", unfenced.join("; ")))
        }
    }

    /// Asks every backup which replicas of `crashed` it holds. Every backup that is up must
    /// answer: one that does not may hold what makes the log complete. Each segment's
    /// locations come newest epoch first, then longest, then in the order of `backups`.
    async fn locate_replicas(
        self: &Arc<Self>,
        crashed: ServerId,
        backups: &[String],
    ) -> Result<BTreeMap<SegmentId, Vec<Location>>, String> {
        let listings = self.list_replicas_everywhere(crashed, backups).await;
        let mut locations: BTreeMap<SegmentId, Vec<Location>> = BTreeMap::new();
        let mut silent = Vec::new();
        for (backup, listing) in backups.iter().zip(listings) {
            let replicas = match listing {
                Ok(replicas) => replicas,
                Err(reason) => {
                    silent.push(reason);
                    continue;
                }
            };
            for replica in replicas {
                locations.entry(replica.segment_id).or_default().push(Location {
                    backup: backup.clone(),
                    epoch: replica.epoch,
                    length: replica.certificate.segment_length,
                    primary: replica.primary,
                });
            }
        }
        if !silent.is_empty() {
            return Err(silent.join("; "));
        }
        for replicas in locations.values_mut() {
            // Newest epoch first (an older one may miss acknowledged data), then the longest.
            replicas.sort_by(|a, b| b.epoch.cmp(&a.epoch).then(b.length.cmp(&a.length)));
        }
        Ok(locations)
    }

    /// Every backup's listing of `crashed`'s replicas, asked of all at once: one answer per
    /// backup, in the order of `backups` (not of arrival, so a recovery does not depend on
    /// which backup answered first).
    async fn list_replicas_everywhere(
        self: &Arc<Self>,
        crashed: ServerId,
        backups: &[String],
    ) -> Vec<Result<Vec<ReplicaEntry>, String>> {
        let mut asks = tokio::task::JoinSet::new();
        for (index, backup) in backups.iter().enumerate() {
            let (inner, backup) = (self.clone(), backup.clone());
            asks.spawn(async move { (index, inner.list_replicas(crashed, &backup).await) });
        }
        let mut listings = vec![None; backups.len()];
        while let Some(joined) = asks.join_next().await {
            // Nothing cancels these tasks: an error is a panic, passed on.
            let (index, listing) =
                joined.unwrap_or_else(|error| std::panic::resume_unwind(error.into_panic()));
            listings[index] = Some(listing);
        }
        let asked = listings.into_iter().map(|listing| listing.expect("every backup was asked"));
        asked.collect()
    }

    /// The replicas of `crashed` that `backup` holds, asked within [`LIST_REPLICAS_TIMEOUT`].
    async fn list_replicas(
        &self,
        crashed: ServerId,
        backup: &str,
    ) -> Result<Vec<ReplicaEntry>, String> {
        let request = Request::BackupListReplicas { master_id: crashed };
        let pool = &self.recovery_pools.backups;
        match pool.call_within(backup, &request, LIST_REPLICAS_TIMEOUT).await {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::BackupListReplicas { replicas }),
            )) => Ok(replicas.into_iter().filter(|replica| replica.master_id == crashed).collect()),
            Ok((status, _)) => Err(format!("backup {backup} refused to list replicas: {status}")),
            Err(error) => {
                pool.forget(backup);
                Err(format!("backup {backup} did not list its replicas: {error}"))
            }
        }
    }

    /// The members of the crashed log's newest digest, and the TABLE_STATS beside it (if the
    /// head holds one): the one in its last head, the segment it reported with SET_LOG_HEAD
    /// before acknowledging any write there. Only a replica at the
    /// reported epoch or newer is read (an older one may lack the end of the head). Earlier
    /// heads hold digests too, but older ones: looking for "the highest segment with a digest"
    /// among the replicas that happen to be visible could pick one of those.
    async fn newest_digest(
        &self,
        crashed: ServerId,
        locations: &BTreeMap<SegmentId, Vec<Location>>,
        head: LogHead,
    ) -> Result<(Vec<SegmentId>, Option<TableStats>), String> {
        let replicas = locations.get(&head.segment_id).map(Vec::as_slice).unwrap_or_default();
        let mut problems = Vec::new();
        for location in replicas.iter().filter(|location| location.epoch >= head.epoch) {
            match self.read_replica(crashed, head.segment_id, &location.backup).await {
                Ok((Some(digest), table_stats)) => return Ok((digest, table_stats)),
                Ok((None, _)) => {
                    problems.push(format!("{}: no digest in the head", location.backup))
                }
                Err(reason) => problems.push(format!("{}: {reason}", location.backup)),
            }
        }
        Err(format!(
            "no good replica of head segment {} at epoch {} or newer: {}",
            head.segment_id,
            head.epoch,
            problems.join("; ")
        ))
    }

    /// Reads and verifies one replica; returns the digest and table stats it holds, if any.
    async fn read_replica(
        &self,
        crashed: ServerId,
        segment_id: SegmentId,
        backup: &str,
    ) -> Result<(Option<Vec<SegmentId>>, Option<TableStats>), String> {
        let request = Request::BackupReadReplica { master_id: crashed, segment_id };
        let (certificate, data): (Certificate, Bytes) =
            match self.recovery_pools.backups.call(backup, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::BackupReadReplica {
                        certificate, data, ..
                    }),
                )) => (
                    Certificate {
                        segment_length: certificate.segment_length,
                        checksum: certificate.checksum,
                    },
                    data,
                ),
                Ok((status, _)) => return Err(status.to_string()),
                Err(error) => {
                    self.recovery_pools.backups.forget(backup);
                    return Err(error.to_string());
                }
            };
        verify_replica(&data, &certificate, crashed, segment_id)
            .map(|verified| (verified.digest, verified.table_stats))
    }

    /// Hands recovered parts to their new masters: the tablet map changes first (one durable
    /// batch), then each new owner is told to serve its parts.
    async fn commit_recovered(
        self: &Arc<Self>,
        crashed: ServerId,
        recovered: &[RecoveredPart],
    ) -> Result<(), String> {
        let mut state = self.state.lock().await;
        // A recovery master that crashed since it answered holds the part nowhere durable
        // that anyone will recover from its log's point of view (it owned nothing then): its
        // parts stay with `crashed` and are recovered again.
        let (recovered, lost): (Vec<_>, Vec<_>) = recovered.iter().copied().partition(|part| {
            state.servers.get(&part.3).is_some_and(|server| server.status == ServerStatus::Up)
        });
        if recovered.is_empty() {
            return if lost.is_empty() {
                Ok(())
            } else {
                Err(format!("{} recovered parts lost their new master", lost.len()))
            };
        }
        let recovered = &recovered[..];
        let mut changed = Vec::new();
        for (name, table) in &state.tables {
            let mine: Vec<_> =
                recovered.iter().filter(|(table_id, ..)| *table_id == table.table_id).collect();
            if mine.is_empty() {
                continue;
            }
            let mut updated = table.clone();
            let mut tablets = Vec::with_capacity(table.tablets.len() + mine.len());
            for tablet in &table.tablets {
                let parts: Vec<_> = mine
                    .iter()
                    .filter(|(_, whole, ..)| tablet.owner == crashed && *whole == tablet.range)
                    .collect();
                if parts.is_empty() {
                    tablets.push(tablet.clone());
                    continue;
                }
                // Cover the tablet with its recovered parts; hashes not in any recovered part
                // stay with the crashed master (recovered by a later attempt).
                let mut cursor = Some(tablet.range.start);
                let mut sorted: Vec<_> = parts
                    .iter()
                    .map(|(_, _, part, owner, created)| (*part, *owner, *created))
                    .collect();
                sorted.sort_by_key(|(part, ..)| part.start);
                for (part, owner, creation_segment) in sorted {
                    let Some(start) = cursor else { break };
                    if start < part.start {
                        tablets.push(TabletRecord {
                            range: HashRange { start, end: part.start - 1 },
                            owner: crashed,
                            creation_segment: tablet.creation_segment,
                        });
                    }
                    tablets.push(TabletRecord { range: part, owner, creation_segment });
                    cursor = part.end.checked_add(1);
                }
                if let Some(start) = cursor.filter(|start| *start <= tablet.range.end) {
                    tablets.push(TabletRecord {
                        range: HashRange { start, end: tablet.range.end },
                        owner: crashed,
                        creation_segment: tablet.creation_segment,
                    });
                }
            }
            updated.tablets = tablets;
            changed.push((name.clone(), updated));
        }
        let mut batch: Vec<_> =
            changed.iter().map(|(name, table)| put_table(name, table)).collect();
        let (epoch, persist_epoch) = state.next_assignment_epoch();
        batch.push(persist_epoch);
        if let Err((_, message)) = self.persist(batch).await {
            // Nothing changed: the next attempt replays again (harmless: versions decide).
            return Err(format!("the new owners could not be persisted: {message}"));
        }
        for (name, table) in changed {
            state.tables.insert(name, table);
        }
        drop(state);
        // Clients waiting for these tablets (AWAIT_TABLET_MAP) learn the new owners now.
        self.recoveries_settled.notify_waiters();
        for &(table_id, _, part, owner, creation_segment) in recovered {
            let inner = self.clone();
            let tablet = TabletRecord { range: part, owner, creation_segment };
            tokio::spawn(async move {
                crate::service::deliver(inner, table_id, tablet, true, epoch).await
            });
        }
        tracing::info!(%crashed, parts = recovered.len(), "recovered tablets handed over");
        if lost.is_empty() {
            Ok(())
        } else {
            Err(format!("{} recovered parts lost their new master", lost.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::TableRecord;
    use crate::service::Coordinator;
    use stratus_env::Environment;
    use stratus_meta::MemoryMetaStore;
    use stratus_types::TabletState;
    use stratus_wire::codec::RECOVERY_SEGMENTS_MAX;
    use stratus_wire::ServiceMask;

    /// How long a test waits for the coordinator to reach a state before it fails.
    const PATIENCE: Duration = Duration::from_secs(20);

    fn location(backup: &str, epoch: u64, length: u32, primary: bool) -> Location {
        Location { backup: backup.to_string(), epoch, length, primary }
    }

    #[test]
    fn recovery_masters_are_told_each_segment_s_newest_replicas_best_first() {
        let locations = BTreeMap::from([
            (
                SegmentId(1),
                vec![
                    location("b:2", 3, 4_096, false),
                    // Abandoned at epoch 2: may miss writes acknowledged since. Never sent.
                    location("b:9", 2, 8_192, true),
                    location("b:1", 3, 4_096, true),
                    location("b:3", 3, 8_192, false),
                ],
            ),
            (SegmentId(2), vec![location("b:1", 1, 100, false)]),
            // Not a member of the digest: not sent.
            (SegmentId(7), vec![location("b:5", 1, 100, true)]),
        ]);
        let located = LocatedLog::new(&[SegmentId(1), SegmentId(2)], &locations, 7);
        let named = |segment: &RecoverySegment| -> Vec<(String, u64, u32, bool)> {
            let backups = &located.backups;
            let replicas = segment.replicas.iter();
            replicas
                .map(|r| (backups[usize::from(r.backup)].clone(), r.epoch, r.length, r.primary))
                .collect()
        };
        assert_eq!(located.segment_ids(), vec![SegmentId(1), SegmentId(2)]);
        assert_eq!(
            named(&located.segments[0]),
            vec![
                ("b:3".to_string(), 3, 8_192, false),
                ("b:1".to_string(), 3, 4_096, true),
                ("b:2".to_string(), 3, 4_096, false),
            ]
        );
        assert_eq!(named(&located.segments[1]), vec![("b:1".to_string(), 1, 100, false)]);
        // Each backup once in the table, and only backups a replica names.
        let mut backups = located.backups.clone();
        backups.sort();
        assert_eq!(backups, vec!["b:1", "b:2", "b:3"]);
    }

    #[test]
    fn a_huge_log_is_located_within_the_request_s_bound_and_turns_which_replicas_it_leaves_out() {
        let segments: Vec<SegmentId> = (0..RECOVERY_SEGMENTS_MAX as u64).map(SegmentId).collect();
        let three: Vec<Location> =
            ["b:1", "b:2", "b:3"].iter().map(|b| location(b, 1, 10, false)).collect();
        let locations: BTreeMap<_, _> = segments.iter().map(|&id| (id, three.clone())).collect();
        let counts = |located: &LocatedLog| -> Vec<usize> {
            located.segments.iter().map(|segment| segment.replicas.len()).collect()
        };
        let located = LocatedLog::new(&segments, &locations, 0);
        // 393 216 over 262 144 segments: the first half gets two, the rest one.
        let total: usize = counts(&located).iter().sum();
        assert_eq!(total, RECOVERY_REPLICAS_MAX);
        assert!(counts(&located).iter().all(|&count| count == 1 || count == 2));
        // Another attempt leaves other replicas out.
        let first = |located: &LocatedLog| {
            let replica = located.segments.last().unwrap().replicas[0];
            located.backups[usize::from(replica.backup)].clone()
        };
        let other = LocatedLog::new(&segments, &locations, 1);
        assert_ne!(first(&located), first(&other));
        // A smaller log gets every replica, in the best order whatever the rotation.
        let located = LocatedLog::new(&segments[..1_000], &locations, 5);
        assert!(counts(&located).iter().all(|&count| count == 3));
    }

    #[test]
    fn partitions_cut_tablets_for_every_master_but_never_past_a_table_s_tablet_limit() {
        let whole = HashRange { start: 0, end: u64::MAX };
        let tablets = [(TableId(1), whole, SegmentId(0)), (TableId(2), whole, SegmentId(3))];
        let unknown = [None, None];
        // Room everywhere: 8 masters, 2 tablets of equal span → 4 parts each, one per master.
        let room = BTreeMap::from([(TableId(1), 100), (TableId(2), 100)]);
        let plan = parts_of(plan_partitions(&tablets, &unknown, 8, 3, room));
        assert_eq!(plan.len(), 8);
        assert!(plan.values().all(|parts| parts.len() == 1));
        let parts: Vec<_> = plan.values().flatten().copied().collect();
        assert_eq!((covered(&parts, TableId(1)), covered(&parts, TableId(2))), (4, 4));
        assert!(parts.iter().all(|part| part.1 == whole));
        assert!(parts
            .iter()
            .filter(|part| part.0 == TableId(2))
            .all(|part| part.3 == SegmentId(3)));
        // Table 1 may gain only one tablet, table 2 none (unknown: no room): 2 parts and 1.
        let room = BTreeMap::from([(TableId(1), 1)]);
        let plan = parts_of(plan_partitions(&tablets, &unknown, 8, 0, room));
        let parts: Vec<_> = plan.values().flatten().copied().collect();
        assert_eq!((covered(&parts, TableId(1)), covered(&parts, TableId(2))), (2, 1));
        // Room is shared by a table's tablets: two halves of table 1 with room for one more.
        let halves = [
            (TableId(1), HashRange { start: 0, end: u64::MAX / 2 }, SegmentId(0)),
            (TableId(1), HashRange { start: u64::MAX / 2 + 1, end: u64::MAX }, SegmentId(0)),
        ];
        let plan = plan_partitions(&halves, &unknown, 8, 0, BTreeMap::from([(TableId(1), 1)]));
        assert_eq!(plan.values().map(|(parts, _)| parts.len()).sum::<usize>(), 3);
    }

    /// The planned parts per master, without the expectations.
    fn parts_of(
        plan: BTreeMap<usize, (Vec<PlannedPart>, Option<TableTally>)>,
    ) -> BTreeMap<usize, Vec<PlannedPart>> {
        plan.into_iter().map(|(index, (parts, _))| (index, parts)).collect()
    }

    /// How many parts cover `table`, checking that they cover all of its hash space once.
    fn covered(parts: &[PlannedPart], table: TableId) -> usize {
        let mut ranges: Vec<HashRange> =
            parts.iter().filter(|part| part.0 == table).map(|part| part.2).collect();
        ranges.sort_by_key(|range| range.start);
        assert_eq!(ranges.first().map(|range| range.start), Some(0));
        assert_eq!(ranges.last().map(|range| range.end), Some(u64::MAX));
        assert!(ranges.windows(2).all(|pair| pair[0].end + 1 == pair[1].start), "{ranges:?}");
        ranges.len()
    }

    fn tally(bytes: u64, objects: u64) -> TableTally {
        TableTally { bytes, objects }
    }

    #[test]
    fn table_stats_size_the_parts_so_large_tablets_are_cut_and_empty_ones_are_not() {
        let whole = HashRange::FULL;
        let tablets = [
            (TableId(1), whole, SegmentId(0)),
            (TableId(2), whole, SegmentId(0)),
            (TableId(3), whole, SegmentId(0)),
        ];
        let megabyte = 1 << 20;
        let estimates = [
            Some(tally(900 * megabyte, 900_000)),
            Some(tally(100 * megabyte, 100_000)),
            Some(tally(0, 0)),
        ];
        let room = BTreeMap::from([(TableId(1), 100), (TableId(2), 100), (TableId(3), 100)]);
        let plan = plan_partitions(&tablets, &estimates, 5, 2, room);
        let parts: Vec<_> = plan.values().flat_map(|(parts, _)| parts.clone()).collect();
        // Five masters, an even share of 200 MB each: the 900 MB tablet in five parts of 180,
        // the others whole; the heaviest master gets 180 + 100. Equal cuts per tablet (two
        // each, as before table statistics) gave two masters 450 MB each.
        assert_eq!(
            [TableId(1), TableId(2), TableId(3)].map(|table| covered(&parts, table)),
            [5, 1, 1]
        );
        assert_eq!(plan.len(), 5, "every master recovers something");
        let heaviest = plan.values().filter_map(|(_, expected)| *expected).max_by_key(|e| e.bytes);
        assert_eq!(heaviest, Some(tally(280 * megabyte, 280_000)));
        let expected_total: u64 =
            plan.values().filter_map(|(_, expected)| expected.map(|e| e.bytes)).sum();
        assert_eq!(expected_total, 1000 * megabyte);
    }

    #[test]
    fn a_table_of_small_objects_weighs_more_than_its_bytes() {
        let tablets = [
            (TableId(1), HashRange::FULL, SegmentId(0)),
            (TableId(2), HashRange::FULL, SegmentId(0)),
        ];
        // The same bytes twice: in 1 KB objects, and in 100-byte objects.
        let megabyte = 1_000_000;
        let estimates =
            [Some(tally(100 * megabyte, 100_000)), Some(tally(100 * megabyte, 1_000_000))];
        let room = BTreeMap::from([(TableId(1), 100), (TableId(2), 100)]);
        let plan = plan_partitions(&tablets, &estimates, 2, 0, room);
        let parts: Vec<_> = plan.values().flat_map(|(parts, _)| parts.clone()).collect();
        // Weighed 210 MB and 1 200 MB: the small objects' tablet is above an even share
        // (705 MB) and is halved; by bytes alone each master took one whole tablet, and one
        // of them replayed 1 000 000 objects while the other replayed 100 000.
        assert_eq!([TableId(1), TableId(2)].map(|table| covered(&parts, table)), [1, 2]);
        let objects: Vec<u64> =
            plan.values().map(|(_, expected)| expected.unwrap().objects).collect();
        assert_eq!(objects.iter().max(), Some(&600_000), "{plan:?}");
        assert_eq!(objects.iter().sum::<u64>(), 1_100_000);
    }

    #[test]
    fn a_tablet_is_never_cut_finer_than_its_hashes_and_huge_estimates_saturate() {
        let narrow = HashRange { start: 10, end: 11 };
        let tablets = [(TableId(1), narrow, SegmentId(0))];
        let gigabyte = 1 << 30;
        let room = BTreeMap::from([(TableId(1), 100)]);
        let plan = plan_partitions(&tablets, &[Some(tally(gigabyte, 10))], 8, 0, room);
        let parts: Vec<_> = plan.values().flat_map(|(parts, _)| parts.clone()).collect();
        assert_eq!(parts.iter().map(|part| part.2).collect::<Vec<_>>().len(), 2);
        let expected: u64 = plan.values().map(|(_, expected)| expected.unwrap().bytes).sum();
        assert_eq!(expected, gigabyte);
        // Hostile statistics: sums saturate instead of overflowing.
        let tablets: Vec<_> =
            (1..=3).map(|table| (TableId(table), HashRange::FULL, SegmentId(0))).collect();
        let plan =
            plan_partitions(&tablets, &[Some(tally(u64::MAX, u64::MAX)); 3], 1, 0, BTreeMap::new());
        assert_eq!(plan[&0].1, Some(tally(u64::MAX, u64::MAX)));
    }

    #[test]
    fn a_crashed_master_s_one_large_tablet_is_cut_even_among_as_many_tablets_as_masters() {
        // Two tablets, two masters: enough parts already, but one holds everything.
        let tablets = [
            (TableId(1), HashRange::FULL, SegmentId(0)),
            (TableId(2), HashRange::FULL, SegmentId(0)),
        ];
        let estimates = [Some(tally(800, 8)), Some(tally(0, 0))];
        let room = BTreeMap::from([(TableId(1), 100), (TableId(2), 100)]);
        let plan = plan_partitions(&tablets, &estimates, 2, 0, room);
        let loads: Vec<u64> = plan.values().map(|(_, expected)| expected.unwrap().bytes).collect();
        assert_eq!(loads.iter().max(), Some(&400), "{plan:?}");
    }

    #[test]
    fn a_tablet_that_may_not_be_cut_does_not_get_others_cut_for_nothing() {
        // Table 1's huge tablet has no room to grow; table 2's small one has room, but its
        // part is already below an even share: nothing is cut.
        let tablets = [
            (TableId(1), HashRange::FULL, SegmentId(0)),
            (TableId(2), HashRange::FULL, SegmentId(0)),
        ];
        let estimates = [Some(tally(1000, 10)), Some(tally(10, 1))];
        let room = BTreeMap::from([(TableId(2), 100)]);
        let plan = plan_partitions(&tablets, &estimates, 2, 0, room);
        assert_eq!(plan.values().map(|(parts, _)| parts.len()).sum::<usize>(), 2);
    }

    #[test]
    fn more_parts_than_masters_are_dealt_to_the_least_loaded() {
        let tablets: Vec<_> =
            (1..=5).map(|table| (TableId(table), HashRange::FULL, SegmentId(0))).collect();
        let estimates = [5, 4, 3, 3, 3].map(|bytes| Some(tally(bytes, bytes)));
        let plan = plan_partitions(&tablets, &estimates, 2, 0, BTreeMap::new());
        let loads: Vec<u64> = plan.values().map(|(_, expected)| expected.unwrap().bytes).collect();
        // Largest first, each to the lighter master: 5 | 4, then 3 → 7, 3 → 8, 3 → 10.
        assert_eq!(loads.iter().sum::<u64>(), 18);
        assert_eq!(loads.iter().max(), Some(&10));
        // No data at all: the tablets are dealt round-robin, not piled on one master.
        let empty = [Some(tally(0, 0)); 5];
        let plan = plan_partitions(&tablets, &empty, 2, 1, BTreeMap::new());
        let counts: Vec<usize> = plan.values().map(|(parts, _)| parts.len()).collect();
        assert_eq!(counts, vec![2, 3]);
    }

    #[test]
    fn a_table_s_statistics_are_shared_by_its_tablets_in_proportion_to_their_spans() {
        let quarter = HashRange { start: 0, end: u64::MAX / 4 };
        let rest = HashRange { start: u64::MAX / 4 + 1, end: u64::MAX };
        let tablets = [
            (TableId(1), quarter, SegmentId(0)),
            (TableId(1), rest, SegmentId(0)),
            (TableId(2), HashRange::FULL, SegmentId(0)),
            (TableId(3), HashRange::FULL, SegmentId(0)),
        ];
        let statistics =
            TableStats { tables: vec![(TableId(1), tally(4000, 400))], others: tally(600, 60) };
        let estimates = estimate_tablets(&tablets, Some(&statistics));
        assert_eq!(
            estimates,
            vec![
                Some(tally(1000, 100)),
                Some(tally(3000, 300)),
                // Tables 2 and 3 are not listed: "others" is split between them by span.
                Some(tally(300, 30)),
                Some(tally(300, 30)),
            ]
        );
        assert_eq!(estimate_tablets(&tablets, None), vec![None; 4]);
    }

    fn coordinator() -> Coordinator {
        Coordinator::open(Arc::new(MemoryMetaStore::new()), Environment::system())
            .expect("open a coordinator")
    }

    /// Enlists a server at `address` and returns its id.
    async fn enlist(coordinator: &Coordinator, address: &str, services: u32) -> ServerId {
        match coordinator
            .inner
            .enlist(address.to_string(), ServiceMask(services), ServerId(0), String::new())
            .await
        {
            Ok(Response::EnlistServer { server_id }) => server_id,
            other => panic!("enlistment failed: {other:?}"),
        }
    }

    /// A loopback address that answers pings (another coordinator serves it).
    async fn answering_address() -> String {
        let environment = Environment::system();
        let listener = environment.network.bind("127.0.0.1:0").await.expect("bind loopback");
        let address = listener.local_address();
        tokio::spawn(stratus_rpc::serve(listener, Arc::new(coordinator())));
        address
    }

    /// A loopback address nobody listens on (connections are refused).
    fn silent_address() -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        listener.local_addr().expect("local address").to_string()
    }

    async fn status_of(coordinator: &Coordinator, server_id: ServerId) -> ServerStatus {
        coordinator.state().await.servers.get(&server_id).expect("known server").status
    }

    /// Waits (bounded) until no suspect is being checked.
    async fn checks_finished(coordinator: &Coordinator) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !coordinator.inner.suspects().checking.is_empty() {
            assert!(tokio::time::Instant::now() < deadline, "a suspect check did not end");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The state of `table`'s tablets in an AWAIT_TABLET_MAP answer.
    fn states(answer: Result<Response, (Status, String)>) -> Vec<TabletState> {
        match answer {
            Ok(Response::AwaitTabletMap { tablets }) => {
                tablets.iter().map(|tablet| tablet.state).collect()
            }
            other => panic!("not a map: {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_awaited_tablet_map_is_answered_once_its_recovery_settles() {
        let coordinator = coordinator();
        let crashed = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        let survivor = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        let table = TableId(1);
        {
            let mut state = coordinator.inner.state.lock().await;
            let tablet = TabletRecord {
                range: HashRange::FULL,
                owner: crashed,
                creation_segment: SegmentId(0),
            };
            let record = TableRecord { table_id: table, tier: Tier::Memory, tablets: vec![tablet] };
            state.tables.insert("t".to_string(), record);
        }
        // Nothing recovers: answered at once, however long the caller would wait.
        let answer = coordinator.inner.await_tablet_map(table, u32::MAX, ServerId(0));
        let answer = tokio::time::timeout(PATIENCE, answer).await.expect("answered at once");
        assert_eq!(states(answer), vec![TabletState::Normal]);

        coordinator.inner.state.lock().await.servers.get_mut(&crashed).unwrap().status =
            ServerStatus::Crashed;
        // Still recovering when the wait is over: the map as it is.
        let answer = coordinator.inner.await_tablet_map(table, 30, ServerId(0)).await;
        assert_eq!(states(answer), vec![TabletState::Recovering]);

        // A recovery that hands the tablet over wakes the waiter with the new owner.
        let inner = coordinator.inner.clone();
        let waiter =
            tokio::spawn(async move { inner.await_tablet_map(table, u32::MAX, ServerId(0)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "answered while the tablet recovers");
        {
            let mut state = coordinator.inner.state.lock().await;
            state.tables.get_mut("t").unwrap().tablets[0].owner = survivor;
        }
        coordinator.inner.recoveries_settled.notify_waiters();
        let answer = tokio::time::timeout(PATIENCE, waiter).await.expect("woken").expect("task");
        assert_eq!(states(answer), vec![TabletState::Normal]);

        // A client that could not reach the survivor waits while the survivor owns the tablet:
        // until the wait's end, or until a recovery hands the tablet over.
        let answer = coordinator.inner.await_tablet_map(table, 30, survivor).await;
        assert_eq!(states(answer), vec![TabletState::Normal], "held, then the map as it is");
        let inner = coordinator.inner.clone();
        let waiter =
            tokio::spawn(async move { inner.await_tablet_map(table, u32::MAX, survivor).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "answered while the unreachable master owns the tablet");
        {
            let mut state = coordinator.inner.state.lock().await;
            state.tables.get_mut("t").unwrap().tablets[0].owner = crashed;
            state.servers.get_mut(&crashed).unwrap().status = ServerStatus::Up;
        }
        coordinator.inner.recoveries_settled.notify_waiters();
        let answer = tokio::time::timeout(PATIENCE, waiter).await.expect("woken").expect("task");
        assert_eq!(states(answer), vec![TabletState::Normal]);

        // A change that wakes no one (the table vanishing from memory behind the coordinator's
        // back) is seen by the periodic look, before the wait's end.
        coordinator.inner.state.lock().await.servers.get_mut(&crashed).unwrap().status =
            ServerStatus::Crashed;
        let inner = coordinator.inner.clone();
        let waiter =
            tokio::spawn(async move { inner.await_tablet_map(table, u32::MAX, ServerId(0)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        coordinator.inner.state.lock().await.tables.clear();
        let answer =
            tokio::time::timeout(PATIENCE, waiter).await.expect("rechecked").expect("task");
        assert!(matches!(answer, Err((Status::TableDoesntExist, _))), "{answer:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hint_about_a_server_that_answers_declares_nothing() {
        let coordinator = coordinator();
        coordinator.inner.detector.set(FailureDetectorConfig::default()).unwrap();
        let address = answering_address().await;
        let server_id = enlist(&coordinator, &address, ServiceMask::MASTER).await;
        let answer = coordinator.inner.hint_server_crashed(server_id).await;
        assert!(matches!(answer, Ok(Response::HintServerCrashed)), "{answer:?}");
        checks_finished(&coordinator).await;
        assert_eq!(status_of(&coordinator, server_id).await, ServerStatus::Up);
        assert!(coordinator.inner.ping_misses().get(&server_id).is_none());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hint_about_a_silent_server_declares_it_crashed_once_its_lease_ended() {
        let coordinator = coordinator();
        coordinator.inner.detector.set(FailureDetectorConfig::default()).unwrap();
        let server_id = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        coordinator.inner.hint_server_crashed(server_id).await.expect("hint accepted");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while status_of(&coordinator, server_id).await == ServerStatus::Up {
            assert!(tokio::time::Instant::now() < deadline, "the silent server was not declared");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(coordinator.inner.lease_expired(server_id), "declared while a lease could run");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failure_domains_are_checked_and_kept() {
        let meta = Arc::new(MemoryMetaStore::new());
        let coordinator =
            Coordinator::open(meta.clone(), Environment::system()).expect("open a coordinator");
        let services = ServiceMask(ServiceMask::MASTER | ServiceMask::BACKUP);
        for bad in ["rack 1", "r\u{e4}ck", &"r".repeat(65)] {
            let refused =
                coordinator.inner.enlist("a:1".to_string(), services, ServerId(0), bad.to_string());
            assert!(
                matches!(refused.await, Err((Status::InvalidParameter, _))),
                "{bad:?} was accepted"
            );
        }
        let answer = coordinator
            .inner
            .enlist("a:1".to_string(), services, ServerId(0), "rack-7".to_string())
            .await;
        let Ok(Response::EnlistServer { server_id }) = answer else { panic!("{answer:?}") };
        // Kept in the server record, as a coordinator opened on the same store reads it.
        let loaded = CoordinatorState::load(&*meta).expect("load");
        assert_eq!(loaded.servers[&server_id].failure_domain, "rack-7");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_predecessor_that_may_still_grant_leases_defers_crash_declarations() {
        let coordinator = coordinator();
        coordinator.inner.detector.set(FailureDetectorConfig::default()).unwrap();
        let server_id = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        let window = Duration::from_secs(3_600);
        coordinator.predecessor_may_grant_until(window);
        assert!(!coordinator.inner.lease_expired(server_id));
        // A silent server is checked and its pings missed, but it is not declared: a lease its
        // predecessor might grant it could still run.
        coordinator.inner.hint_server_crashed(server_id).await.expect("hint accepted");
        checks_finished(&coordinator).await;
        assert_eq!(status_of(&coordinator, server_id).await, ServerStatus::Up);
        // A shorter window later does not shorten it.
        coordinator.predecessor_may_grant_until(Duration::ZERO);
        assert!(!coordinator.inner.lease_expired(server_id));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_hints_checks_each_suspect_once_at_a_time() {
        let coordinator = coordinator();
        coordinator.inner.detector.set(FailureDetectorConfig::default()).unwrap();
        let first = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        let second = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        for _ in 0..1_000 {
            for server_id in [first, second] {
                coordinator.inner.hint_server_crashed(server_id).await.expect("hint accepted");
            }
            assert!(coordinator.inner.suspects().checking.len() <= 2);
        }
        assert_eq!(coordinator.metrics().await.crash_hints_received, 2_000);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hints_are_checked_against_the_server_list() {
        let coordinator = coordinator();
        // Unknown servers (0 means none) are refused.
        for unknown in [ServerId(0), ServerId(77)] {
            let answer = coordinator.inner.hint_server_crashed(unknown).await;
            assert!(matches!(answer, Err((Status::InvalidParameter, _))), "{answer:?}");
        }
        // Without a running detector a hint is accepted and ignored.
        let server_id = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        coordinator.inner.hint_server_crashed(server_id).await.expect("hint accepted");
        assert!(coordinator.inner.suspects().checking.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_loss_is_accepted_only_for_an_impossible_recovery() {
        let coordinator = coordinator();
        let server_id = enlist(&coordinator, &silent_address(), ServiceMask::MASTER).await;
        let answer = coordinator.inner.accept_loss(server_id).await;
        assert!(matches!(answer, Err((Status::InvalidParameter, _))), "{answer:?}");
        // As if its recovery were running (so accepting the loss starts none here).
        coordinator.inner.recoveries.lock().await.insert(server_id);
        coordinator
            .inner
            .unrecoverable()
            .insert(server_id, Unrecoverable { reason: "test".to_string(), loss_accepted: false });
        assert_eq!(
            coordinator.unrecoverable_masters(),
            vec![(server_id, "test".to_string(), false)]
        );
        let answer = coordinator.inner.accept_loss(server_id).await;
        assert!(matches!(answer, Ok(Response::RecoveryAcceptLoss)), "{answer:?}");
        assert_eq!(
            coordinator.unrecoverable_masters(),
            vec![(server_id, "test".to_string(), true)]
        );
    }

    /// A backup that lists, for any master, replicas of segments 1 and 2 at `epoch`; or, with
    /// `epoch` `None`, one that takes requests and never answers (a stalled machine).
    struct ListingBackup {
        epoch: Option<u64>,
    }

    impl stratus_rpc::Service for ListingBackup {
        fn handle(
            &self,
            header: &stratus_wire::FrameHeader,
            body: Bytes,
            out: &mut bytes::BytesMut,
        ) -> stratus_rpc::Handled {
            let Some(epoch) = self.epoch else {
                return stratus_rpc::Handled::Later(Box::pin(std::future::pending()));
            };
            let Ok(Request::BackupListReplicas { master_id }) =
                stratus_wire::decode_request(header.opcode_code, body)
            else {
                panic!("only BACKUP_LIST_REPLICAS is asked");
            };
            let replica = |segment: u64| stratus_wire::ReplicaEntry {
                master_id,
                segment_id: SegmentId(segment),
                epoch,
                certificate: stratus_wire::ReplicaCertificate { segment_length: 100, checksum: 0 },
                closed: true,
                primary: false,
            };
            let response = Response::BackupListReplicas { replicas: vec![replica(1), replica(2)] };
            stratus_wire::encode_response(out, header.request_id, Status::Ok, &response);
            stratus_rpc::Handled::Done
        }
    }

    async fn listing_backup(epoch: Option<u64>) -> String {
        let listener = Environment::system().network.bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_address();
        tokio::spawn(stratus_rpc::serve(listener, Arc::new(ListingBackup { epoch })));
        address
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_are_located_on_every_backup_newest_epoch_first() {
        let coordinator = coordinator();
        let backups = vec![listing_backup(Some(3)).await, listing_backup(Some(4)).await];
        let locations = coordinator.inner.locate_replicas(ServerId(9), &backups).await.unwrap();
        assert_eq!(locations.keys().copied().collect::<Vec<_>>(), [SegmentId(1), SegmentId(2)]);
        for replicas in locations.values() {
            let found: Vec<(&str, u64)> =
                replicas.iter().map(|location| (&location.backup[..], location.epoch)).collect();
            assert_eq!(found, [(&backups[1][..], 4), (&backups[0][..], 3)]);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_silent_backup_costs_a_recovery_one_short_wait_not_a_replica_read_s_timeout() {
        let coordinator = coordinator();
        let silent = listing_backup(None).await;
        let backups = vec![silent.clone(), listing_backup(Some(3)).await, silent.clone()];
        // Asked with a replica read's timeout, the first silent backup alone would take twice
        // this.
        let located = tokio::time::timeout(
            REPLICA_READ_TIMEOUT / 2,
            coordinator.inner.locate_replicas(ServerId(9), &backups),
        )
        .await
        .expect("the silent backups held up the recovery attempt");
        let reason = located.expect_err("a backup that did not answer may hold the log");
        assert!(reason.contains(&silent), "{reason}");
    }

    /// The states of table 1's tablets in the coordinator's map.
    async fn tablet_states(coordinator: &Coordinator) -> Vec<stratus_types::TabletState> {
        match coordinator.inner.tablet_map(TableId(1)).await {
            Ok(Response::GetTabletMap { tablets }) => {
                tablets.iter().map(|tablet| tablet.state).collect()
            }
            other => panic!("no tablet map: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_reported_log_no_backup_holds_is_unavailable_after_the_patience_until_accepted() {
        use stratus_types::TabletState;
        let coordinator = coordinator();
        // No backup at all: nothing of the crashed master's log can be found.
        let crashed = enlist(&coordinator, "crashed:1", ServiceMask::MASTER).await;
        enlist(&coordinator, "survivor:1", ServiceMask::MASTER).await;
        coordinator
            .inner
            .log_heads
            .lock()
            .await
            .insert(crashed, LogHead { segment_id: SegmentId(1), epoch: 1 });
        {
            let mut state = coordinator.inner.state.lock().await;
            let tablet = TabletRecord {
                range: HashRange::FULL,
                owner: crashed,
                creation_segment: SegmentId(0),
            };
            let table = crate::records::TableRecord {
                table_id: TableId(1),
                tier: stratus_types::Tier::Memory,
                tablets: vec![tablet],
            };
            state.tables.insert("t".to_string(), table);
            state.servers.get_mut(&crashed).expect("enlisted").status = ServerStatus::Crashed;
        }
        // At first it may be backups restarting: the tablet is recovering.
        let attempt = coordinator.inner.recovery_attempt(crashed).await;
        assert!(matches!(&attempt, Attempt::Again(reason) if reason.contains("(yet)")));
        assert_eq!(tablet_states(&coordinator).await, vec![TabletState::Recovering]);
        assert!(coordinator.unrecoverable_masters().is_empty());

        tokio::time::advance(LOG_MISSING_PATIENCE).await;
        let attempt = coordinator.inner.recovery_attempt(crashed).await;
        assert!(matches!(&attempt, Attempt::Again(reason) if reason.contains("impossible")));
        assert_eq!(tablet_states(&coordinator).await, vec![TabletState::Unavailable]);
        assert_eq!(coordinator.metrics().await.tablets_unavailable, 1);

        // Accepted: no longer reported unavailable (it is handed over; the next attempt does).
        coordinator.inner.recoveries.lock().await.insert(crashed);
        coordinator.inner.accept_loss(crashed).await.expect("the loss is accepted");
        assert_eq!(tablet_states(&coordinator).await, vec![TabletState::Recovering]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreplicated_master_s_recovery_is_impossible_at_once() {
        use stratus_types::TabletState;
        let coordinator = coordinator();
        let services = ServiceMask::MASTER | ServiceMask::UNREPLICATED;
        let crashed = enlist(&coordinator, "crashed:1", services).await;
        enlist(&coordinator, "survivor:1", ServiceMask::MASTER).await;
        {
            let mut state = coordinator.inner.state.lock().await;
            let tablet = TabletRecord {
                range: HashRange::FULL,
                owner: crashed,
                creation_segment: SegmentId(0),
            };
            let table = crate::records::TableRecord {
                table_id: TableId(1),
                tier: stratus_types::Tier::Memory,
                tablets: vec![tablet],
            };
            state.tables.insert("t".to_string(), table);
            state.servers.get_mut(&crashed).expect("enlisted").status = ServerStatus::Crashed;
        }
        let attempt = coordinator.inner.recovery_attempt(crashed).await;
        assert!(matches!(&attempt, Attempt::Again(reason) if reason.contains("without replicas")));
        assert_eq!(tablet_states(&coordinator).await, vec![TabletState::Unavailable]);
    }
}
