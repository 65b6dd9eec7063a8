//! Replication of the master's log to backups (RAMCloud's replica manager).
//!
//! Every segment of the log is copied to `replicas` backups, each segment to its own set, so
//! the log is scattered over the cluster and recovery can read it from many disks at once.
//! A write is acknowledged only once the log up to and including it is held by every replica
//! of its segment ([`ReplicaManager::sync`]).
//!
//! One task (the pump) does all replication work for a master. Writers never talk to backups
//! themselves: they note the log position they need, wake the pump and wait for the durable
//! position to pass it. Writes that arrive while a round is in flight are carried by the next
//! round together, so concurrent writers share replication round trips (group commit), and
//! exactly one replication RPC per backup is in flight at a time.
//!
//! Order of a round: the head segment first (a new head is opened on its backups before the
//! previous head is closed, so a crash never leaves a log without an open head on backups),
//! then the remaining bytes of older segments, with the close flag.
//!
//! Backup failures: a backup that does not answer, or refuses the replica, is replaced by
//! another that receives the whole segment from its start; the segment's epoch is raised so
//! that a stale copy of an open segment can be told apart (recovery's use of epochs is issue 5).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use stratus_env::{join_all, BoxFuture, Environment};
use stratus_rpc::{Backoff, ChannelPool, RpcConfig};
use stratus_store::ObjectStore;
use stratus_store::{DurabilityError, SegmentDurability};
use stratus_types::limits::SEGMENT_BYTES_MAX;
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{
    BackupWriteFlags, ReplicaCertificate, Request, ServerEntry, ServerStatus, ServiceMask, Status,
};
use tokio::sync::{mpsc, Notify};

use crate::peer_probe::ServerList;

/// How often the pump looks at the log even when nobody woke it (to free replicas of cleaned
/// segments and to replicate segments the cleaner wrote).
const IDLE_ROUND_INTERVAL: Duration = Duration::from_millis(200);

/// Survivor segments queued for replication (the cleaner hands over one at a time and waits).
const SURVIVORS_QUEUED_MAX: usize = 16;

/// How often the backups holding this master's replicas are pinged (off the write path: the
/// pings run in a task of their own, and the pump applies their verdicts when they are in). A
/// backup that does not answer within the replication timeout is treated as lost: its replicas
/// are re-created elsewhere. This keeps closed segments at R copies even for a backup that no
/// write has gone to since it went silent and that the coordinator has not declared crashed
/// (yet: a crash declaration in the server list drops it at once).
const HOLDER_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long a holder check's ping may take. Longer than the replication timeout: the check
/// decides about closed, complete copies, which hold up no write, and a short one would take
/// every copy from a master that was itself stalled for a moment (its pings all time out at
/// once), re-replicating its whole log (the simulation lost a log that way: the master
/// crashed before the new copies were complete, and the old ones had been freed).
const HOLDER_PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Which of a lost backup's replicas are taken from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LossScope {
    /// Every replica: it did not answer a holder check, or was declared crashed.
    All,
    /// Those of segments not complete on every holder (the head, segments being
    /// re-replicated): a replica write to it timed out.
    Incomplete,
}

/// The replication timeout when none is configured. A backup that has not acknowledged a
/// write this long after it was sent (plus the transfer allowance below) is slow: it is
/// dropped from every replica set of this master and the replicas go to other backups, so a
/// paused or dead backup holds up this master's writes for about this long (plus the copy of
/// the head to its replacement), instead of for the whole pause or until the cluster declares
/// it crashed. RAMCloud waits for the coordinator's crash declaration. 150 ms keeps the whole
/// stall under issue 27's 250 ms for keys not on a failed server (at 200 ms, `bench failover`
/// measured 224–256 ms), is below the 250 ms in which failure detection suspects a server, and
/// is far above a healthy backup's answer (tens of µs idle, a few ms under load or with fsync):
/// see docs/design/replication.md.
pub const REPLICATION_TIMEOUT_DEFAULT: Duration = Duration::from_millis(150);

/// The slowest rate at which a healthy backup takes a replica write's bytes: a write of `n`
/// bytes may take the replication timeout plus `n` / this. A whole 8 MiB segment (what a new
/// holder receives) adds 125 ms; a typical group-committed write of a few KiB adds nothing
/// measurable.
const REPLICATION_BYTES_PER_SECOND_MIN: u64 = 64 << 20;

/// How long a BACKUP_WRITE of `bytes` may take before its backup counts as slow.
fn backup_write_timeout(replication_timeout: Duration, bytes: usize) -> Duration {
    let transfer_micros =
        (bytes as u64).saturating_mul(1_000_000) / REPLICATION_BYTES_PER_SECOND_MIN;
    replication_timeout.saturating_add(Duration::from_micros(transfer_micros))
}

/// Timeout of the pump's requests to the coordinator (SET_LOG_HEAD, which the coordinator
/// makes durable in its metadata store before it answers).
const CONTROL_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Frees kept for backups in quarantine, until they answer again: a stale copy each, so a
/// bound on storage frames, not on correctness.
const ORPHANS_WAITING_MAX: usize = 4_096;

/// How long a backup found dead is not chosen for new replicas.
const DEAD_BACKUP_QUARANTINE: Duration = Duration::from_secs(10);

/// How a segment's backups are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Each replica on its own backup, chosen by power of two choices on the replicas this
    /// master placed: the log scatters over every backup (fastest recovery).
    Random,
    /// Copysets: backups are partitioned into fixed groups of `replicas` (by server id) and a
    /// segment's replicas all go to one group. Data is lost only if a whole group fails,
    /// which makes loss after a correlated failure far less likely (docs/design/replication.md).
    Copyset,
}

/// Settings of replication.
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// Copies of every segment on other servers. 0 disables replication (memory only).
    pub replicas: usize,
    /// How backups are chosen.
    pub placement: Placement,
    /// The coordinator, asked for the list of backups.
    pub coordinator_address: String,
    /// How long a write waits for its replication before the client is told RETRY.
    pub sync_timeout: Duration,
    /// How long a backup may take to acknowledge a replica write (plus a transfer allowance
    /// for large writes) or to answer a holder check's ping before it counts as lost and its
    /// replicas go elsewhere (`stratus server --replication-timeout-ms`).
    pub replication_timeout: Duration,
}

impl ReplicationConfig {
    /// Defaults for a coordinator at `coordinator_address`.
    pub fn new(replicas: usize, coordinator_address: String) -> ReplicationConfig {
        ReplicationConfig {
            replicas,
            placement: Placement::Random,
            coordinator_address,
            sync_timeout: Duration::from_secs(10),
            replication_timeout: REPLICATION_TIMEOUT_DEFAULT,
        }
    }
}

/// A position in the log: (segment id, bytes of that segment). Everything before it is in
/// lower segments or earlier in the same one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct LogPosition {
    /// The segment.
    pub segment_id: u64,
    /// Bytes of it.
    pub bytes: u32,
}

/// Why a write could not be made durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncError {
    /// What went wrong, for the client.
    pub message: String,
}

/// Counters for `stratus status` and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicationStatistics {
    /// Replication rounds completed.
    pub rounds: u64,
    /// BACKUP_WRITE RPCs sent.
    pub backup_writes: u64,
    /// Bytes sent to backups (each copy counted).
    pub bytes_replicated: u64,
    /// Of those, bytes of the cleaner's survivor segments.
    pub cleaner_bytes_replicated: u64,
    /// Replicas replaced after a backup failed or refused.
    pub replicas_replaced: u64,
    /// Replicas freed on backups after their segment left the log.
    pub replicas_freed: u64,
}

/// The replica manager of one master. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ReplicaManager {
    shared: Arc<Shared>,
    survivors: mpsc::Sender<SurvivorRequest>,
}

#[derive(Debug)]
struct Shared {
    config: ReplicationConfig,
    store: Arc<ObjectStore>,
    wake: Notify,
    durable: DurablePosition,
    statistics: std::sync::Mutex<ReplicationStatistics>,
    /// The last problem that kept replication from progressing, for error messages.
    last_problem: std::sync::Mutex<String>,
    /// A backup refused a write because the coordinator declared this master crashed: it is
    /// a zombie and nothing it writes can become durable any more.
    fenced: std::sync::atomic::AtomicBool,
    /// Backups other than this master in the last server list (`usize::MAX` before the first
    /// list arrives: unknown is not "too few").
    backups_available: std::sync::atomic::AtomicUsize,
    /// Segments of the log not (yet) on `replicas` backups in full, as of the last round.
    segments_short_of_replicas: std::sync::atomic::AtomicUsize,
    /// The coordinator's server list, shared with the peer pinger.
    server_list: Arc<ServerList>,
    /// Every segment the pump tracks (has or may have replicas of): from before its first
    /// replica is placed until its replicas are freed. Backups ask about the replicas they
    /// hold (REPLICAS_NEEDED) and free those of segments neither here nor in the log.
    tracked_segments: std::sync::Mutex<BTreeSet<u64>>,
}

/// The log position known durable, and the writers waiting for it to pass theirs.
///
/// Not tokio's watch channel: its waiters are spread over several `Notify` instances chosen
/// with tokio's own unseeded randomness, so the order in which waiting writers are answered
/// would differ from run to run, and a simulation run would no longer be a function of its
/// seed. Here every waiter waits on one `Notify`, woken in a fixed order.
#[derive(Debug, Default)]
struct DurablePosition {
    position: std::sync::Mutex<LogPosition>,
    advanced: Notify,
}

impl DurablePosition {
    fn get(&self) -> LogPosition {
        *self.position.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Raises the position (never lowers it) and wakes the waiters.
    fn advance_to(&self, position: LogPosition) {
        let mut current = self.position.lock().unwrap_or_else(|poison| poison.into_inner());
        if position > *current {
            *current = position;
            drop(current);
            self.advanced.notify_waiters();
        }
    }

    /// Returns once the position is at least `position`.
    async fn wait_for(&self, position: LogPosition) {
        loop {
            let notified = self.advanced.notified();
            tokio::pin!(notified);
            // Registered before the check, so an advance between the check and the wait is
            // not missed.
            notified.as_mut().enable();
            if self.get() >= position {
                return;
            }
            notified.await;
        }
    }
}

impl ReplicaManager {
    /// Starts the pump task for `store`'s log on the current tokio runtime. `replicas` must be
    /// at least 1 (a memory-only master has no replica manager).
    pub fn start(
        server_id: ServerId,
        config: ReplicationConfig,
        store: Arc<ObjectStore>,
        environment: Environment,
    ) -> ReplicaManager {
        assert!(config.replicas >= 1, "a replica manager needs at least one replica");
        let durable = DurablePosition::default();
        let config_coordinator_address = config.coordinator_address.clone();
        let shared = Arc::new(Shared {
            config,
            store,
            wake: Notify::new(),
            durable,
            statistics: std::sync::Mutex::new(ReplicationStatistics::default()),
            last_problem: std::sync::Mutex::new(String::new()),
            fenced: std::sync::atomic::AtomicBool::new(false),
            backups_available: std::sync::atomic::AtomicUsize::new(usize::MAX),
            segments_short_of_replicas: std::sync::atomic::AtomicUsize::new(0),
            server_list: ServerList::new(config_coordinator_address, environment.network.clone()),
            tracked_segments: std::sync::Mutex::new(BTreeSet::new()),
        });
        let (survivor_sender, survivor_receiver) = mpsc::channel(SURVIVORS_QUEUED_MAX);
        let pump = Pump::new(server_id, shared.clone(), environment, survivor_receiver);
        tokio::spawn(pump.run());
        shared.store.log().require_replication();
        let manager = ReplicaManager { shared, survivors: survivor_sender };
        manager.shared.store.set_segment_durability(Some(Arc::new(manager.clone())));
        manager
    }

    /// The segments of `segment_ids` this master will never need replicas of again
    /// (REPLICAS_NEEDED): those neither in its log nor tracked by replication. Segment ids are
    /// never reused, so the answer stays true.
    ///
    /// The log is looked at first: a segment leaves the log (cleaned or abandoned) while its
    /// replication still tracks it, until the digest that drops it is durable and its replicas
    /// are freed. Looked at in this order, a segment that left the log between the two looks
    /// is still tracked, and is kept. (In the other order, it could be found not yet tracked,
    /// then out of the log.)
    pub fn not_needed(&self, segment_ids: &[SegmentId]) -> Vec<SegmentId> {
        let log = self.shared.store.log();
        let out_of_log: Vec<SegmentId> = segment_ids
            .iter()
            .copied()
            .filter(|&segment_id| log.certificate(segment_id).is_none())
            .collect();
        let tracked = self.shared.tracked_segments.lock().unwrap_or_else(PoisonError::into_inner);
        out_of_log.into_iter().filter(|segment_id| !tracked.contains(&segment_id.0)).collect()
    }

    /// The coordinator's server list this manager chooses backups from: the peer pinger
    /// shares it, so one server fetches one list.
    pub fn server_list(&self) -> Arc<ServerList> {
        self.shared.server_list.clone()
    }

    /// The replica count.
    pub fn replicas(&self) -> usize {
        self.shared.config.replicas
    }

    /// The log position a write that has just returned from the store must wait for: the end
    /// of the current head. (A segment that was head when the write appended and has since
    /// been closed lies entirely before it.)
    pub fn position_to_sync(&self) -> LogPosition {
        current_head_position(&self.shared.store)
    }

    /// Waits until the log up to `position` is on every replica, or the sync timeout passes.
    pub async fn sync(&self, position: LogPosition) -> Result<(), SyncError> {
        if self.is_fenced() {
            return Err(SyncError { message: "this master was declared crashed".to_string() });
        }
        if self.shared.durable.get() >= position {
            return Ok(());
        }
        self.shared.wake.notify_one();
        let waited = tokio::time::timeout(
            self.shared.config.sync_timeout,
            self.shared.durable.wait_for(position),
        )
        .await;
        waited.map_err(|_| self.not_replicated_in_time("write"))
    }

    /// The error for something not on every replica within the sync timeout, with the pump's
    /// last problem (why it is not).
    fn not_replicated_in_time(&self, what: &str) -> SyncError {
        let problem = self.shared.last_problem.lock().map(|p| p.clone()).unwrap_or_default();
        SyncError {
            message: format!(
                "{what} not replicated to {} backups in time: {problem}",
                self.shared.config.replicas
            ),
        }
    }

    /// Backups other than this master in the last server list it fetched (`usize::MAX` before
    /// the first). Fewer than [`ReplicaManager::replicas`] means nothing new can become
    /// durable until more backups join.
    pub fn backups_available(&self) -> usize {
        self.shared.backups_available.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Segments of the log that were not on `replicas` backups in full after the last
    /// replication round: 0 once the cluster is healthy and re-replication has caught up.
    pub fn segments_short_of_replicas(&self) -> usize {
        self.shared.segments_short_of_replicas.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True once a backup refused a write because this master was declared crashed.
    pub fn is_fenced(&self) -> bool {
        self.shared.fenced.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The position known durable.
    pub fn durable_position(&self) -> LogPosition {
        self.shared.durable.get()
    }

    /// Counters.
    pub fn statistics(&self) -> ReplicationStatistics {
        self.shared.statistics.lock().map(|statistics| *statistics).unwrap_or_default()
    }
}

impl SegmentDurability for ReplicaManager {
    /// Called on a cleaner thread (never on the runtime): hands the survivor to the pump and
    /// blocks until it is on every replica, for at most the sync timeout. The cleaner must
    /// wait (fusing a survivor that is not replicated would make the log on backups
    /// incomplete), but not forever: after a timeout its pass waits and it tries again later
    /// (the pump goes on meanwhile), and a fenced master or a stopped pump is final.
    fn make_durable(
        &self,
        segment_id: SegmentId,
        bytes: &[u8],
        certificate: stratus_log::Certificate,
    ) -> Result<(), DurabilityError> {
        if self.is_fenced() {
            return Err(DurabilityError::Fenced);
        }
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let bytes = Bytes::copy_from_slice(bytes);
        let request =
            SurvivorRequest { segment_id, bytes, certificate, done: SurvivorWaiter::Thread(done) };
        self.queue_survivor(request)?;
        match finished.recv_timeout(self.shared.config.sync_timeout) {
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(DurabilityError::TimedOut),
            // The pump dropped the request unanswered: it is gone.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(DurabilityError::Stopped),
        }
    }
}

impl ReplicaManager {
    /// What [`SegmentDurability::make_durable`] does, for a cleaner that runs as a task
    /// (`ObjectStore::clean_step`) and for a recovery's side segments: returns once the
    /// survivor is on every replica, or the master is fenced, or the pump is gone. Unbounded:
    /// the caller bounds it if it must (dropping the future abandons the request).
    pub async fn replicate_survivor(
        &self,
        segment_id: SegmentId,
        bytes: Vec<u8>,
        certificate: stratus_log::Certificate,
    ) -> Result<(), DurabilityError> {
        if self.is_fenced() {
            return Err(DurabilityError::Fenced);
        }
        let (done, finished) = tokio::sync::oneshot::channel();
        let bytes = Bytes::from(bytes);
        let request =
            SurvivorRequest { segment_id, bytes, certificate, done: SurvivorWaiter::Task(done) };
        match self.survivors.send(request).await {
            Ok(()) => self.shared.wake.notify_one(),
            Err(_) => return Err(DurabilityError::Stopped),
        }
        // The pump dropped the request unanswered: it is gone.
        finished.await.unwrap_or(Err(DurabilityError::Stopped))
    }

    /// Queues a survivor for the pump without blocking: a full queue (the pump far behind)
    /// is a timeout the cleaner retries later.
    fn queue_survivor(&self, request: SurvivorRequest) -> Result<(), DurabilityError> {
        match self.survivors.try_send(request) {
            Ok(()) => {
                self.shared.wake.notify_one();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(DurabilityError::TimedOut),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(DurabilityError::Stopped),
        }
    }
}

impl ReplicaManager {
    /// Makes a side segment (a recovery's replayed objects) durable on every replica before it
    /// joins the log; its bytes are taken from the log, so nothing is appended to it any more.
    /// Fails after the sync timeout, or when this master was declared crashed. The pump skips
    /// a side segment abandoned meanwhile.
    pub async fn replicate_side_segment(&self, segment_id: SegmentId) -> Result<(), SyncError> {
        if self.is_fenced() {
            return Err(SyncError { message: "this master was declared crashed".to_string() });
        }
        let Some((bytes, certificate)) = self.shared.store.log().segment_contents(segment_id)
        else {
            return Err(SyncError { message: format!("side segment {segment_id} is gone") });
        };
        let replicated = self.replicate_survivor(segment_id, bytes, certificate);
        match tokio::time::timeout(self.shared.config.sync_timeout, replicated).await {
            Ok(Ok(())) if !self.is_fenced() => Ok(()),
            Ok(Ok(())) => Err(SyncError { message: DurabilityError::Fenced.to_string() }),
            Ok(Err(error)) => Err(SyncError { message: error.to_string() }),
            Err(_) => Err(self.not_replicated_in_time(&format!("side segment {segment_id}"))),
        }
    }
}

fn current_head_position(store: &ObjectStore) -> LogPosition {
    let log = store.log();
    match log.head_segment_id() {
        Some(head) => LogPosition {
            segment_id: head.0,
            bytes: log.certificate(head).map_or(0, |certificate| certificate.segment_length),
        },
        None => LogPosition::default(),
    }
}

/// One backup holding (or about to hold) a replica.
#[derive(Clone, Debug)]
struct ReplicaHolder {
    server_id: ServerId,
    address: String,
    /// Bytes of the segment the backup acknowledged.
    bytes_held: u32,
    /// Whether the backup acknowledged the close flag.
    closed: bool,
    /// The segment epoch of the backup's last acknowledged write. A holder behind the
    /// segment's epoch gets a write (possibly empty) that raises it, so that a copy left on a
    /// replaced backup is the only one with an older epoch.
    epoch: u64,
}

/// Replication state of one segment.
#[derive(Debug)]
struct SegmentReplicas {
    epoch: u64,
    holders: Vec<ReplicaHolder>,
    /// Backups that failed for this segment: not chosen again for it.
    excluded: BTreeSet<ServerId>,
    /// When the segment left the log: the head at that moment. Its replicas are freed once a
    /// later head (whose digest no longer lists it) is durable.
    dropped_under_head: Option<u64>,
    /// Closed and complete on every holder: rounds skip it until a holder is lost.
    complete: bool,
    /// Was complete once: every write in it has been acknowledged, so bringing it back to R
    /// copies after a loss does not hold up new writes.
    ever_complete: bool,
}

struct Pump {
    server_id: ServerId,
    shared: Arc<Shared>,
    environment: Environment,
    pool: Arc<ChannelPool>,
    segments: BTreeMap<u64, SegmentReplicas>,
    backups: Vec<ServerEntry>,
    /// Replicas this master placed on each backup: the load for power-of-two choices.
    load: BTreeMap<ServerId, usize>,
    /// Backups found dead, and since when: not chosen again for a while.
    dead_backups: BTreeMap<ServerId, tokio::time::Instant>,
    holders_checked_at: Option<tokio::time::Instant>,
    /// The holder check in flight (pings run in a task of their own, so a silent backup
    /// delays no round): each pinged backup and whether it answered.
    holder_check: Option<tokio::task::JoinHandle<Vec<(ServerId, bool)>>>,
    /// The server list generation whose crash declarations have been applied.
    server_list_generation_seen: u64,
    /// Replicas no longer part of their segment's replica set, to free on their backups.
    orphans: Vec<(ServerId, String, SegmentId)>,
    /// Survivor segments the cleaner waits on.
    survivors: mpsc::Receiver<SurvivorRequest>,
    /// A survivor whose replication failed, tried again first in the next round.
    pending_survivor: Option<SurvivorRequest>,
    /// The newest (head segment, epoch) the coordinator has recorded (SET_LOG_HEAD).
    recorded_head: Option<(u64, u64)>,
    /// The log's count of forgotten dropped segments when this pump last looked.
    dropped_forgotten_seen: u64,
    /// Every listed server's failure domain (`domain_key`), this master's own included.
    domains: BTreeMap<ServerId, String>,
    /// Whether this master has logged that it had to place replicas in a shared failure
    /// domain (said once: it persists as long as the cluster is short of domains).
    shared_domain_logged: bool,
}

/// Where the bytes of a segment being replicated come from.
enum Source<'a> {
    /// The log itself (the segment is in it).
    Log,
    /// A survivor segment handed over by the cleaner, with its certificate. Every backup's
    /// write is a slice of these bytes (no copy per replica).
    Given(&'a Bytes, stratus_log::Certificate),
    /// The image on flash of a segment whose objects moved there, with its certificate.
    Image(&'a Bytes, stratus_log::Certificate),
}

/// A survivor segment to replicate before the cleaner fuses it into the log.
struct SurvivorRequest {
    segment_id: SegmentId,
    bytes: Bytes,
    certificate: stratus_log::Certificate,
    /// Told when every replica holds the survivor, or that none will.
    done: SurvivorWaiter,
}

/// Who waits for a survivor's replication, and how it is told.
enum SurvivorWaiter {
    /// A cleaner thread, waiting with a timeout (a std channel: the thread has no runtime).
    Thread(std::sync::mpsc::SyncSender<Result<(), DurabilityError>>),
    /// A task: an async cleaner, or a recovery replicating a side segment.
    Task(tokio::sync::oneshot::Sender<Result<(), DurabilityError>>),
}

impl SurvivorWaiter {
    fn tell(self, outcome: Result<(), DurabilityError>) {
        // A waiter that gave up is not told.
        match self {
            SurvivorWaiter::Thread(sender) => {
                let _ = sender.try_send(outcome);
            }
            SurvivorWaiter::Task(sender) => {
                let _ = sender.send(outcome);
            }
        }
    }

    /// Whether the waiter is known to have given up. (A cleaner thread that timed out cannot
    /// be seen to have; it sends the survivor again, and replicating it twice writes nothing
    /// new the second time.)
    fn gave_up(&self) -> bool {
        match self {
            SurvivorWaiter::Thread(_) => false,
            SurvivorWaiter::Task(sender) => sender.is_closed(),
        }
    }
}

/// The outcome of one BACKUP_WRITE.
enum WriteOutcome {
    Held {
        bytes_held: u32,
        closed: bool,
    },
    /// The backup answered with a refusal (out of buffers, stopping, a bad request): it is
    /// alive, and loses this replica only.
    Refused(String),
    /// No answer within the write's timeout, or no connection: the backup may be paused,
    /// partitioned or dead, and loses every replica of this master at once (waiting for it
    /// segment by segment would stall writes once per segment it holds).
    Unreachable(String),
    /// The backup refused: this master was declared crashed.
    Fenced,
}

impl Pump {
    fn new(
        server_id: ServerId,
        shared: Arc<Shared>,
        environment: Environment,
        survivors: mpsc::Receiver<SurvivorRequest>,
    ) -> Pump {
        // Calls bound themselves more tightly where they must (replica writes, pings, frees):
        // this cap is for the coordinator's answers, and never shorter than a whole segment's
        // write may take.
        let whole_segment =
            backup_write_timeout(shared.config.replication_timeout, SEGMENT_BYTES_MAX);
        let rpc = RpcConfig {
            request_timeout: whole_segment.max(CONTROL_REQUEST_TIMEOUT),
            ..RpcConfig::default()
        };
        Pump {
            server_id,
            pool: Arc::new(ChannelPool::new(environment.network.clone(), rpc)),
            shared,
            environment,
            segments: BTreeMap::new(),
            backups: Vec::new(),
            load: BTreeMap::new(),
            dead_backups: BTreeMap::new(),
            holders_checked_at: None,
            holder_check: None,
            server_list_generation_seen: 0,
            orphans: Vec::new(),
            survivors,
            pending_survivor: None,
            recorded_head: None,
            dropped_forgotten_seen: 0,
            domains: BTreeMap::new(),
            shared_domain_logged: false,
        }
    }

    async fn run(mut self) {
        let mut backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(500));
        loop {
            let progressed = self.round().await;
            self.publish_segments_short_of_replicas();
            if progressed {
                backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(500));
                // Wait for the next write, or look again after a while.
                let _ =
                    tokio::time::timeout(IDLE_ROUND_INTERVAL, self.shared.wake.notified()).await;
            } else {
                tokio::time::sleep(backoff.next_delay(&*self.environment.entropy)).await;
            }
        }
    }

    /// One replication round. Returns false if something kept it from completing (the caller
    /// backs off before the next).
    async fn round(&mut self) -> bool {
        let store = self.shared.store.clone();
        let log = store.log();
        self.check_holders_alive().await;
        self.drop_holders_declared_crashed();
        // A fenced master's survivors can never be durable: their waiters are told so.
        if self.shared.fenced.load(std::sync::atomic::Ordering::Acquire) {
            self.refuse_survivors();
            return false;
        }
        // Survivor segments of the cleaner first: the cleaner thread is blocked on them.
        while let Some(request) =
            self.pending_survivor.take().or_else(|| self.survivors.try_recv().ok())
        {
            // A side segment abandoned before it was replicated (a failed recovery) is not
            // needed on any backup; a copy already written is freed as a dropped segment.
            if log.segment_length(request.segment_id).is_none() {
                if let Some(segment) = self.segments.get_mut(&request.segment_id.0) {
                    segment
                        .dropped_under_head
                        .get_or_insert(log.head_segment_id().map_or(0, |head| head.0));
                }
                request.done.tell(Ok(()));
                continue;
            }
            // Nobody waits for it any more: a recovery whose wait timed out, which abandons
            // the side segment once its replay ends (a segment is fused only after its wait
            // succeeded; the cleaner's thread waits until it is done). Retrying it meanwhile
            // would hold up this master's own writes behind a segment nobody will use; a copy
            // already written is freed when the abandon reports the segment dropped.
            if request.done.gave_up() {
                continue;
            }
            let source = Source::Given(&request.bytes, request.certificate);
            match self.replicate_segment(request.segment_id.0, source, true).await {
                Ok(()) => {
                    self.segment_completed(request.segment_id.0);
                    request.done.tell(Ok(()));
                }
                Err(problem) => {
                    self.note_problem(problem);
                    self.pending_survivor = Some(request);
                    if self.shared.fenced.load(std::sync::atomic::Ordering::Acquire) {
                        self.refuse_survivors();
                    }
                    return false;
                }
            }
        }
        let Some(head) = log.head_segment_id() else {
            return true;
        };
        for dropped in log.take_dropped_segments() {
            if let Some(segment) = self.segments.get_mut(&dropped.0) {
                segment.dropped_under_head.get_or_insert(head.0);
            }
        }
        let forgotten = log.dropped_segments_forgotten();
        if forgotten != self.dropped_forgotten_seen {
            // Drops the log could not remember until now: without this their replicas would
            // be kept forever.
            self.dropped_forgotten_seen = forgotten;
            mark_dropped_by_membership(&mut self.segments, log, head);
        }
        self.free_orphans().await;
        // Only segments older than the head are closed: a head rolled since `head` was read
        // (or a cleaner survivor not yet fused) has a higher id and waits for the next round.
        // The head goes first, so a new head is open on its backups before the previous one
        // is closed.
        let older: Vec<u64> = log
            .segment_ids()
            .into_iter()
            .map(|id| id.0)
            .filter(|id| *id < head.0)
            .filter(|id| !self.segments.get(id).is_some_and(|segment| segment.complete))
            .collect();
        let (recent, lost_copies): (Vec<u64>, Vec<u64>) = older
            .into_iter()
            .partition(|id| !self.segments.get(id).is_some_and(|segment| segment.ever_complete));
        // Writes wait for the head and for every segment that was never complete; segments
        // that were complete once and lost a copy are brought back to R copies afterwards,
        // without holding up new writes (RAMCloud re-replicates them in the background too).
        let mut durable_head_bytes = None;
        for segment_id in std::iter::once(head.0).chain(recent) {
            let close = segment_id != head.0;
            match self.replicate_segment(segment_id, Source::Log, close).await {
                Ok(()) if !close => {
                    durable_head_bytes = self.segments.get(&segment_id).and_then(|segment| {
                        segment.holders.iter().map(|holder| holder.bytes_held).min()
                    });
                }
                Ok(()) => self.segment_completed(segment_id),
                Err(problem) => {
                    self.note_problem(problem);
                    return false;
                }
            }
        }
        if let Some(bytes) = durable_head_bytes {
            let position = LogPosition { segment_id: head.0, bytes };
            self.shared.durable.advance_to(position);
        }
        let mut complete = true;
        for segment_id in lost_copies {
            let replicated = if self.shared.store.has_image(SegmentId(segment_id)) {
                self.replicate_from_image(segment_id).await
            } else {
                self.replicate_segment(segment_id, Source::Log, true).await
            };
            match replicated {
                Ok(()) => self.segment_completed(segment_id),
                Err(problem) => {
                    self.note_problem(problem);
                    complete = false;
                    break;
                }
            }
        }
        self.free_dropped_segments().await;
        self.count(|statistics| statistics.rounds += 1);
        complete
    }

    /// Tells everyone waiting for a survivor (the one being retried and those queued) that it
    /// cannot be made durable: this master was declared crashed.
    fn refuse_survivors(&mut self) {
        while let Some(request) =
            self.pending_survivor.take().or_else(|| self.survivors.try_recv().ok())
        {
            request.done.tell(Err(DurabilityError::Fenced));
        }
    }

    /// Counts the segments still in the log that are not on `replicas` backups in full (the
    /// head: not on `replicas` backups), for [`ReplicaManager::segments_short_of_replicas`].
    fn publish_segments_short_of_replicas(&self) {
        let replicas = self.shared.config.replicas;
        let head = self.shared.store.log().head_segment_id().map(|head| head.0);
        let short = self
            .segments
            .iter()
            .filter(|(segment_id, segment)| {
                segment.dropped_under_head.is_none()
                    && (segment.holders.len() < replicas
                        || (Some(**segment_id) != head && !segment.complete))
            })
            .count();
        self.shared.segments_short_of_replicas.store(short, std::sync::atomic::Ordering::Relaxed);
    }

    /// A closed segment is complete on every holder: rounds skip it, and the cleaner may now
    /// clean or compact it.
    fn segment_completed(&mut self, segment_id: u64) {
        if let Some(segment) = self.segments.get_mut(&segment_id) {
            segment.complete = true;
            segment.ever_complete = true;
        }
        self.shared.store.log().mark_replicated(SegmentId(segment_id));
    }

    fn note_problem(&self, problem: String) {
        tracing::warn!(%problem, "replication round incomplete");
        if let Ok(mut last) = self.shared.last_problem.lock() {
            *last = problem;
        }
    }

    fn count(&self, update: impl FnOnce(&mut ReplicationStatistics)) {
        if let Ok(mut statistics) = self.shared.statistics.lock() {
            update(&mut statistics);
        }
    }

    /// The bytes a holder that has the first `from` bytes lacks, and the certificate that
    /// commits the segment up to their end.
    fn tail(
        &self,
        segment_id: u64,
        source: &Source<'_>,
        from: u32,
    ) -> Option<(Bytes, stratus_log::Certificate)> {
        match source {
            Source::Log => {
                let (bytes, certificate) =
                    self.shared.store.log().segment_tail(SegmentId(segment_id), from)?;
                Some((Bytes::from(bytes), certificate))
            }
            Source::Given(bytes, certificate) | Source::Image(bytes, certificate) => {
                let range = from as usize..certificate.segment_length as usize;
                bytes.get(range.clone())?;
                Some((bytes.slice(range), *certificate))
            }
        }
    }

    /// Brings a segment whose objects are on flash back to R copies: its memory holds
    /// FLASH_OBJECT entries, which must never reach a backup, so new copies get its image
    /// (read on a blocking thread: up to a segment from the device).
    async fn replicate_from_image(&mut self, segment_id: u64) -> Result<(), String> {
        let store = self.shared.store.clone();
        let read =
            stratus_env::run_blocking(move || store.replication_image(SegmentId(segment_id)))
                .await
                .map_err(|error| format!("reading segment {segment_id}'s image: {error}"))?;
        match read {
            // Images go only once their segments left the log: nothing to replicate.
            None if self.current_length(segment_id, &Source::Log).is_none() => Ok(()),
            None => Err(format!("segment {segment_id} is in the log without its image")),
            Some(Ok((bytes, certificate))) => {
                let bytes = Bytes::from(bytes);
                self.replicate_segment(segment_id, Source::Image(&bytes, certificate), true).await
            }
            Some(Err(error)) => Err(format!("reading segment {segment_id}'s image: {error}")),
        }
    }

    /// The segment's length now.
    fn current_length(&self, segment_id: u64, source: &Source<'_>) -> Option<u32> {
        match source {
            Source::Log => self
                .shared
                .store
                .log()
                .certificate(SegmentId(segment_id))
                .map(|certificate| certificate.segment_length),
            Source::Given(_, certificate) | Source::Image(_, certificate) => {
                Some(certificate.segment_length)
            }
        }
    }

    /// Brings every replica of one segment up to its length at the time of the call (and
    /// closed if `close`).
    async fn replicate_segment(
        &mut self,
        segment_id: u64,
        source: Source<'_>,
        close: bool,
    ) -> Result<(), String> {
        let replicas = self.shared.config.replicas;
        let Some(length) = self.current_length(segment_id, &source) else {
            return Ok(()); // left the log since it was listed
        };
        // Bounded: each pass either finishes or replaces a failed holder; the number of
        // candidate backups is finite and failed ones are excluded.
        for _attempt in 0..=self.backups.len() + replicas + 1 {
            self.fill_holders(segment_id).await?;
            let segment = self.segments.get(&segment_id).expect("filled above");
            let epoch = segment.epoch;
            let pending: Vec<(usize, ReplicaHolder)> = segment
                .holders
                .iter()
                .enumerate()
                .filter(|(_, holder)| {
                    holder.bytes_held < length || (close && !holder.closed) || holder.epoch < epoch
                })
                .map(|(index, holder)| (index, holder.clone()))
                .collect();
            if pending.is_empty() {
                // Every replica holds the segment at this epoch. A head (opened with a digest)
                // is now reported to the coordinator, before the caller counts anything in it
                // as durable, so before any write there is acknowledged: recovery then looks
                // for exactly this head at this epoch or newer, which exists on R backups. (Had
                // it been reported before the writes, a crash in between would leave a record
                // no replica matches, and recovery would wait forever.)
                let is_head = matches!(source, Source::Log)
                    && self.shared.store.log().opened_as_head(SegmentId(segment_id));
                if is_head
                    && self.recorded_head.is_none_or(|recorded| recorded < (segment_id, epoch))
                {
                    self.record_head(segment_id, epoch).await?;
                }
                return Ok(());
            }
            let mut calls: Vec<BoxFuture<'static, (ServerId, WriteOutcome)>> = Vec::new();
            let mut failed = Vec::new();
            for (index, holder) in pending {
                let tail = self.tail(segment_id, &source, holder.bytes_held).or_else(|| {
                    // The copy holds more bytes than the segment has now: the segment was
                    // compacted after the copy was complete (only complete segments are), and
                    // the copy is still a valid replica (compaction changes nothing on backups;
                    // its extra entries are dead). A closed one is behind only in epoch: an empty
                    // write raises it, and the backup keeps its own longer certificate. (One
                    // not closed may lack the segment's end, which is gone from memory: it is
                    // replaced.) Dropping closed copies when another backup failed (which raises
                    // the epoch of every segment it held) left a compacted segment on no backup
                    // at all when its master then crashed (operator simulation seed 2628).
                    (holder.bytes_held > length && holder.closed)
                        .then(|| self.tail(segment_id, &source, length))
                        .flatten()
                });
                let Some((data, certificate)) = tail else {
                    if self.current_length(segment_id, &source).is_none() {
                        return Ok(()); // the segment left the log meanwhile
                    }
                    // Demoted meanwhile (its memory now holds FLASH_OBJECT entries, which the
                    // log never hands out): not the holders' fault. The next round copies the
                    // image instead.
                    if matches!(source, Source::Log)
                        && self.shared.store.has_image(SegmentId(segment_id))
                    {
                        return Err(format!("segment {segment_id} moved to flash; next round"));
                    }
                    failed.push((holder.server_id, "segment shrank under its replica".into()));
                    continue;
                };
                let call = BackupCall {
                    master_id: self.server_id,
                    segment_id: SegmentId(segment_id),
                    epoch,
                    certificate,
                    close,
                    primary: index == 0,
                };
                let pool = self.pool.clone();
                let replication_timeout = self.shared.config.replication_timeout;
                let survivor = matches!(source, Source::Given(..));
                self.count(|statistics| {
                    statistics.backup_writes += 1;
                    statistics.bytes_replicated += data.len() as u64;
                    if survivor {
                        statistics.cleaner_bytes_replicated += data.len() as u64;
                    }
                });
                calls.push(Box::pin(async move {
                    let outcome = call.send(&pool, &holder, data, replication_timeout).await;
                    (holder.server_id, outcome)
                }));
            }
            // Polled together on the pump's own task: the R writes go out at once without a
            // task per call (on a loaded machine each spawn is a scheduling hop).
            let mut unreachable = Vec::new();
            for (server_id, outcome) in join_all(calls).await {
                let segment = self.segments.get_mut(&segment_id).expect("exists");
                match outcome {
                    WriteOutcome::Held { bytes_held, closed } => {
                        if let Some(holder) =
                            segment.holders.iter_mut().find(|holder| holder.server_id == server_id)
                        {
                            // Never less than before: a compacted segment's copy keeps its
                            // longer prefix (see above).
                            holder.bytes_held = holder.bytes_held.max(bytes_held);
                            holder.closed |= closed;
                            holder.epoch = epoch;
                        }
                    }
                    WriteOutcome::Refused(reason) => failed.push((server_id, reason)),
                    WriteOutcome::Unreachable(reason) => unreachable.push((server_id, reason)),
                    WriteOutcome::Fenced => {
                        if !self.shared.fenced.swap(true, std::sync::atomic::Ordering::AcqRel) {
                            tracing::error!(backup = %server_id, "a backup refused a write: this master was declared crashed");
                        }
                        return Err("this master was declared crashed".to_string());
                    }
                }
            }
            if failed.is_empty() && unreachable.is_empty() {
                continue; // verify in the next pass (returns Ok when nothing is pending)
            }
            for (server_id, reason) in &unreachable {
                tracing::warn!(segment = segment_id, backup = %server_id, %reason, "backup did not answer a replica write in time; replacing its replicas");
                // Only the segments still being written: a closed, complete copy on it is
                // as good as it was, and this master may itself have been the one that
                // stalled (its own timers then fire for every backup at once). The holder
                // check, with its longer timeout, decides about those.
                self.lose_backup(*server_id, LossScope::Incomplete);
            }
            let segment = self.segments.get_mut(&segment_id).expect("exists");
            for (server_id, reason) in &failed {
                tracing::warn!(segment = segment_id, backup = %server_id, %reason, "replica lost; replacing it");
                if let Some(lost) =
                    segment.holders.iter().find(|holder| holder.server_id == *server_id)
                {
                    // Freed when this backup is no holder of the segment any more (a stale
                    // copy would otherwise use a storage frame forever).
                    self.orphans.push((*server_id, lost.address.clone(), SegmentId(segment_id)));
                }
                segment.holders.retain(|holder| holder.server_id != *server_id);
                segment.excluded.insert(*server_id);
                if let Some(load) = self.load.get_mut(server_id) {
                    *load = load.saturating_sub(1);
                }
            }
            if !failed.is_empty() {
                segment.epoch += 1;
                segment.complete = false;
            }
            let replaced = failed.len() as u64;
            self.count(|statistics| statistics.replicas_replaced += replaced);
            // Backups that failed may be gone: look at the server list again.
            self.shared.server_list.mark_stale().await;
        }
        Err(format!("segment {segment_id}: replicas kept failing"))
    }

    /// The holder check, which never waits on a backup: applies the verdicts of the check in
    /// flight if it is done, and starts the next when one is due. Every backup holding a
    /// replica of this log is pinged (at most once per interval); one that does not answer
    /// within the replication timeout loses its replicas, so the rounds re-create them.
    async fn check_holders_alive(&mut self) {
        if self.holder_check.as_ref().is_some_and(|check| check.is_finished()) {
            let check = self.holder_check.take().expect("checked above");
            // Finished, so this does not wait. A check whose task panicked tells nothing.
            if let Ok(verdicts) = check.await {
                self.apply_holder_verdicts(verdicts);
            }
        }
        let due = self
            .holders_checked_at
            .is_none_or(|checked| checked.elapsed() >= HOLDER_CHECK_INTERVAL);
        if !due || self.holder_check.is_some() {
            return;
        }
        self.holders_checked_at = Some(tokio::time::Instant::now());
        let mut backups: BTreeMap<ServerId, String> = BTreeMap::new();
        for segment in self.segments.values() {
            for holder in &segment.holders {
                backups.insert(holder.server_id, holder.address.clone());
            }
        }
        // Quarantined backups are pinged too: one that answers again is a candidate again at
        // once. A master that was itself cut off finds every backup silent; keeping them all
        // out for the whole quarantine would leave its segments on fewer than R backups long
        // after the network healed (the simulation lost a head segment that way, to two
        // crashes that R = 3 must survive).
        for entry in &self.backups {
            if self.dead_backups.contains_key(&entry.server_id) {
                backups.entry(entry.server_id).or_insert_with(|| entry.address.clone());
            }
        }
        let pool = self.pool.clone();
        let timeout = HOLDER_PING_TIMEOUT;
        self.holder_check = Some(tokio::spawn(async move {
            let pings = backups.into_iter().map(|(server_id, address)| {
                let pool = pool.clone();
                Box::pin(async move {
                    let answered = matches!(
                        pool.call_within(&address, &Request::Ping, timeout).await,
                        Ok((Status::Ok, _))
                    );
                    if !answered {
                        pool.forget(&address);
                    }
                    (server_id, answered)
                }) as BoxFuture<'static, (ServerId, bool)>
            });
            join_all(pings.collect()).await
        }));
    }

    /// What a holder check found: backups that answered leave quarantine, and those that did
    /// not lose their replicas.
    fn apply_holder_verdicts(&mut self, verdicts: Vec<(ServerId, bool)>) {
        for (server_id, answered) in verdicts {
            if answered {
                if self.dead_backups.remove(&server_id).is_some() {
                    tracing::info!(backup = %server_id, "backup answers again; a candidate for replicas");
                }
                continue;
            }
            // Still silent in quarantine and holding nothing: nothing more to take away.
            let holds_replicas = self
                .segments
                .values()
                .any(|segment| segment.holders.iter().any(|holder| holder.server_id == server_id));
            if self.dead_backups.contains_key(&server_id) && !holds_replicas {
                continue;
            }
            tracing::warn!(backup = %server_id, "backup does not answer; re-replicating its replicas");
            self.lose_backup(server_id, LossScope::All);
        }
    }

    /// Drops the holders the coordinator's server list declares crashed (or removed) from
    /// every replica set, once per list fetched: recovery of such a server runs without it,
    /// and this master's replicas on it are re-created at once, whether or not a write or a
    /// ping would have found it silent yet. Never waits: a list being fetched is looked at in
    /// a later round.
    fn drop_holders_declared_crashed(&mut self) {
        let list = &self.shared.server_list;
        if list.generation() == self.server_list_generation_seen {
            return;
        }
        let Some((generation, servers)) = list.try_cached() else {
            return;
        };
        self.server_list_generation_seen = generation;
        let declared: BTreeSet<ServerId> = servers
            .iter()
            .filter(|entry| matches!(entry.status, ServerStatus::Crashed | ServerStatus::Removed))
            .map(|entry| entry.server_id)
            .collect();
        let holding: BTreeSet<ServerId> = self
            .segments
            .values()
            .flat_map(|segment| segment.holders.iter().map(|holder| holder.server_id))
            .filter(|server_id| declared.contains(server_id))
            .collect();
        for server_id in holding {
            tracing::warn!(backup = %server_id, "backup declared crashed; re-replicating its replicas");
            self.lose_backup(server_id, LossScope::All);
        }
    }

    /// Takes `server_id` out of the replica set of every segment of this log that `scope`
    /// names (it did not answer in time, or was declared crashed): each segment it held gets a
    /// new holder in the next round and a raised epoch (so the copy left behind is the only one with an older
    /// epoch, and is freed if the backup comes back), and the backup is not chosen for new
    /// replicas until it answers a holder check's ping or its quarantine ends.
    fn lose_backup(&mut self, server_id: ServerId, scope: LossScope) {
        // Quarantined only when found dead by a holder check or declared crashed: a write
        // timeout may be load on a busy machine, and in a small cluster the slow backup can be
        // the only candidate left (a CI run's recovery, R = 1 on three servers, stalled on
        // that). The segment it timed out on excludes it, as any failed write does.
        if scope == LossScope::All {
            self.dead_backups.insert(server_id, tokio::time::Instant::now());
        }
        let mut lost = 0u64;
        for (segment_id, segment) in self.segments.iter_mut() {
            if scope == LossScope::Incomplete && segment.complete {
                continue;
            }
            let Some(position) =
                segment.holders.iter().position(|holder| holder.server_id == server_id)
            else {
                continue;
            };
            let holder = segment.holders.remove(position);
            self.orphans.push((server_id, holder.address, SegmentId(*segment_id)));
            segment.excluded.insert(server_id);
            segment.epoch += 1;
            segment.complete = false;
            lost += 1;
        }
        self.load.remove(&server_id);
        self.count(|statistics| statistics.replicas_replaced += lost);
    }

    /// Chooses backups for a segment until it has `replicas` holders.
    async fn fill_holders(&mut self, segment_id: u64) -> Result<(), String> {
        let replicas = self.shared.config.replicas;
        let needs = self
            .segments
            .get(&segment_id)
            .map_or(replicas, |segment| replicas.saturating_sub(segment.holders.len()));
        if needs == 0 {
            return Ok(());
        }
        self.refresh_backups().await?;
        self.dead_backups.retain(|_, since| since.elapsed() < DEAD_BACKUP_QUARANTINE);
        if !self.segments.contains_key(&segment_id) {
            // Tracked before any replica exists (see `ReplicaManager::not_needed`).
            self.shared
                .tracked_segments
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(segment_id);
            self.segments.insert(
                segment_id,
                SegmentReplicas {
                    epoch: 1,
                    holders: Vec::new(),
                    excluded: BTreeSet::new(),
                    dropped_under_head: None,
                    complete: false,
                    ever_complete: false,
                },
            );
        }
        let placed = if self.shared.config.placement == Placement::Copyset {
            self.fill_from_copyset(segment_id)
        } else {
            self.fill_at_random(segment_id, needs)
        };
        if placed.is_err() {
            // Too few backups in this master's copy of the server list, which may be older
            // than a server that has joined since: at a cluster's start every master but the
            // last fetched it before the last server was up. The next round fetches it again
            // instead of after SERVER_LIST_REFRESH_INTERVAL, during which writes would wait
            // (longer than a client's request timeout). The pump's backoff bounds how often
            // that asks the coordinator while the cluster really is short of backups.
            self.shared.server_list.mark_stale().await;
        }
        placed
    }

    /// Random placement: `needs` more backups for the segment, each the less loaded of two
    /// chosen at random.
    fn fill_at_random(&mut self, segment_id: u64, needs: usize) -> Result<(), String> {
        let replicas = self.shared.config.replicas;
        // Primaries per backup (each segment's first holder). Recovery reads the primary first,
        // and its backup cuts it for every recovery master: spreading primaries by their own
        // count spreads that work. (By replicas in all alone, 17 primaries once fell 10, 4, 3
        // and 0 on four backups.) Counted only when this segment's primary is being chosen.
        let mut primaries: BTreeMap<ServerId, usize> = BTreeMap::new();
        if self.segments.get(&segment_id).is_some_and(|segment| segment.holders.is_empty()) {
            for holder in self.segments.values().filter_map(|segment| segment.holders.first()) {
                *primaries.entry(holder.server_id).or_insert(0) += 1;
            }
        }
        let segment = self.segments.get_mut(&segment_id).expect("inserted above");
        for _ in 0..needs {
            let choosing_primary = segment.holders.is_empty();
            let candidates: Vec<&ServerEntry> = self
                .backups
                .iter()
                .filter(|entry| {
                    entry.server_id != self.server_id
                        && !self.dead_backups.contains_key(&entry.server_id)
                        && !segment.excluded.contains(&entry.server_id)
                        && !segment.holders.iter().any(|holder| holder.server_id == entry.server_id)
                })
                .collect();
            if candidates.is_empty() {
                // Backups that failed for this segment may have failed transiently (a full
                // disk queue, a restart): let them be chosen again from the next round on
                // rather than stall writes and the cleaner for good. Their stale copies are
                // freed first (orphans).
                segment.excluded.clear();
                let have = segment.holders.len();
                return Err(format!(
                    "only {have} of {replicas} backups available for segment {segment_id} \
                     ({} backups in the cluster besides this server)",
                    self.backups.iter().filter(|entry| entry.server_id != self.server_id).count()
                ));
            }
            // Failure domains: a backup outside this master's domain and every holder's, if
            // there is one; else outside the holders' domains; else any (said once).
            let own_domain = domain_of(&self.domains, self.server_id);
            let taken: BTreeSet<String> = segment
                .holders
                .iter()
                .map(|holder| domain_of(&self.domains, holder.server_id))
                .collect();
            let (candidates, shared) = domain_tier(candidates, |entry| {
                let domain = domain_key(entry);
                (domain != own_domain, !taken.contains(&domain))
            });
            if let Some(shared) = shared.filter(|_| !self.shared_domain_logged) {
                self.shared_domain_logged = true;
                let domains: BTreeSet<&String> = self.domains.values().collect();
                tracing::warn!(
                    segment = segment_id,
                    replicas,
                    domains = domains.len(),
                    "not enough live backups in distinct failure domains: a replica shares {shared} \
                     (said once)"
                );
            }
            if candidates.is_empty() {
                segment.excluded.clear();
                let have = segment.holders.len();
                return Err(format!(
                    "only {have} of {replicas} backups available for segment {segment_id} \
                     ({} backups in the cluster besides this server)",
                    self.backups.iter().filter(|entry| entry.server_id != self.server_id).count()
                ));
            }
            // Power of two choices on the replicas this master placed: spreads the log
            // evenly without a global view.
            let entropy = &*self.environment.entropy;
            let first = candidates[(entropy.next_u64() % candidates.len() as u64) as usize];
            let second = candidates[(entropy.next_u64() % candidates.len() as u64) as usize];
            let load_of = |entry: &ServerEntry| {
                let replicas = self.load.get(&entry.server_id).copied().unwrap_or(0);
                let primaries = primaries.get(&entry.server_id).copied().unwrap_or(0);
                (if choosing_primary { primaries } else { 0 }, replicas)
            };
            let chosen = if load_of(second) < load_of(first) { second } else { first };
            *self.load.entry(chosen.server_id).or_insert(0) += 1;
            segment.holders.push(ReplicaHolder {
                server_id: chosen.server_id,
                address: chosen.address.clone(),
                bytes_held: 0,
                closed: false,
                epoch: 0,
            });
        }
        Ok(())
    }

    /// Copyset placement: all replicas of a segment in one group. A segment that lost part of
    /// its group moves to a whole new group (the survivors' copies are freed), so the copyset
    /// invariant holds for every segment.
    fn fill_from_copyset(&mut self, segment_id: u64) -> Result<(), String> {
        let replicas = self.shared.config.replicas;
        let groups = copyset_groups(&self.backups, replicas);
        let own_domain = domain_of(&self.domains, self.server_id);
        let segment = self.segments.get_mut(&segment_id).expect("inserted by the caller");
        let usable: Vec<&Vec<ServerEntry>> = groups
            .iter()
            .filter(|group| {
                group.iter().all(|entry| {
                    entry.server_id != self.server_id
                        && !self.dead_backups.contains_key(&entry.server_id)
                        && !segment.excluded.contains(&entry.server_id)
                })
            })
            .collect();
        if usable.is_empty() {
            // As with random placement: failures may have been transient; retry them later.
            segment.excluded.clear();
            return Err(format!(
                "no complete copyset of {replicas} live backups without this server for \
                 segment {segment_id} ({} groups in the cluster)",
                groups.len()
            ));
        }
        // A group outside this master's failure domain if there is one (its members are in
        // distinct domains already, when the cluster has enough).
        let (usable, shared) = domain_tier(usable, |group| {
            (group.iter().all(|entry| domain_key(entry) != own_domain), true)
        });
        if shared.is_some() && !self.shared_domain_logged {
            self.shared_domain_logged = true;
            tracing::warn!(
                segment = segment_id,
                replicas,
                "no live copyset outside this master's failure domain: a replica shares it \
                 (said once)"
            );
        }
        let entropy = &*self.environment.entropy;
        let group_load = |group: &Vec<ServerEntry>| -> usize {
            group.iter().map(|entry| self.load.get(&entry.server_id).copied().unwrap_or(0)).sum()
        };
        let first = usable[(entropy.next_u64() % usable.len() as u64) as usize];
        let second = usable[(entropy.next_u64() % usable.len() as u64) as usize];
        let chosen = if group_load(second) < group_load(first) { second } else { first };
        // Members of the chosen group that already hold the segment keep their copy (and what
        // they acknowledged); only holders outside the group become orphans. Freeing a copy
        // that a chosen member still uses would silently drop a replica.
        let in_chosen =
            |server_id: ServerId| chosen.iter().any(|entry| entry.server_id == server_id);
        let (kept, dropped): (Vec<ReplicaHolder>, Vec<ReplicaHolder>) =
            segment.holders.drain(..).partition(|holder| in_chosen(holder.server_id));
        for holder in dropped {
            self.orphans.push((holder.server_id, holder.address, SegmentId(segment_id)));
            if let Some(load) = self.load.get_mut(&holder.server_id) {
                *load = load.saturating_sub(1);
            }
        }
        segment.holders = kept;
        for entry in chosen {
            if segment.holders.iter().any(|holder| holder.server_id == entry.server_id) {
                continue;
            }
            *self.load.entry(entry.server_id).or_insert(0) += 1;
            segment.holders.push(ReplicaHolder {
                server_id: entry.server_id,
                address: entry.address.clone(),
                bytes_held: 0,
                closed: false,
                epoch: 0,
            });
        }
        Ok(())
    }

    /// SET_LOG_HEAD: records (segment, epoch) at the coordinator and waits for it.
    async fn record_head(&mut self, segment_id: u64, epoch: u64) -> Result<(), String> {
        let coordinator = self.shared.config.coordinator_address.clone();
        let request = Request::SetLogHead {
            server_id: self.server_id,
            segment_id: SegmentId(segment_id),
            epoch,
        };
        match self.pool.call_coordinator(&coordinator, &request).await {
            Ok((Status::Ok, _)) => {
                self.recorded_head = Some((segment_id, epoch));
                Ok(())
            }
            Ok((Status::ServerCrashed, _)) => {
                if !self.shared.fenced.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    tracing::error!(
                        "the coordinator refused the log head: this master was declared crashed"
                    );
                }
                Err("this master was declared crashed".to_string())
            }
            Ok((status, body)) => {
                Err(format!("the coordinator refused the log head: {status} {body:?}"))
            }
            Err(error) => Err(format!("the log head was not recorded: {error}")),
        }
    }

    /// Takes the backups from the server list (fetched from the coordinator when it is old).
    async fn refresh_backups(&mut self) -> Result<(), String> {
        let servers = self.shared.server_list.servers().await?;
        self.domains = servers.iter().map(|entry| (entry.server_id, domain_key(entry))).collect();
        self.backups = servers
            .into_iter()
            .filter(|entry| {
                entry.status == ServerStatus::Up && entry.services.0 & ServiceMask::BACKUP != 0
            })
            .collect();
        let others = self.backups.iter().filter(|entry| entry.server_id != self.server_id).count();
        self.shared.backups_available.store(others, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Frees the copies that are no longer part of their segment's replica set (failed or
    /// moved holders), all at once. A copy on a backup that is a current holder of the same
    /// segment again is kept: it is that holder's replica. Best effort: a backup that misses
    /// the free keeps a stale copy with an older epoch.
    async fn free_orphans(&mut self) {
        let orphans = std::mem::take(&mut self.orphans);
        let mut frees: Vec<BoxFuture<'static, bool>> = Vec::new();
        let timeout = self.shared.config.replication_timeout;
        for (server_id, address, segment_id) in orphans {
            // A backup in quarantine did not answer lately: a free would most likely wait out
            // its timeout in this round. The free waits until the backup answers a holder
            // check again (a bounded wait: past the bound, its garbage collector's
            // REPLICAS_NEEDED frees the copy once its segment leaves this log).
            if self.dead_backups.contains_key(&server_id) {
                if self.orphans.len() < ORPHANS_WAITING_MAX {
                    self.orphans.push((server_id, address, segment_id));
                }
                continue;
            }
            let still_held = self.segments.get(&segment_id.0).is_some_and(|segment| {
                segment.holders.iter().any(|holder| holder.address == address)
            });
            if still_held {
                continue;
            }
            let pool = self.pool.clone();
            let request = Request::BackupFree { master_id: self.server_id, segment_id };
            frees.push(Box::pin(async move {
                let freed = pool.call_within(&address, &request, timeout).await;
                matches!(freed, Ok((Status::Ok, _)))
            }));
        }
        let freed = join_all(frees).await.into_iter().filter(|freed| *freed).count() as u64;
        self.count(|statistics| statistics.replicas_freed += freed);
    }

    /// Frees, on their backups, the replicas of segments the cleaner dropped, once a head that
    /// no longer lists them is durable.
    async fn free_dropped_segments(&mut self) {
        let durable = self.shared.durable.get();
        let ready: Vec<u64> = self
            .segments
            .iter()
            .filter(|(_, segment)| {
                segment.dropped_under_head.is_some_and(|head| durable.segment_id > head)
            })
            .map(|(id, _)| *id)
            .collect();
        for segment_id in ready {
            let Some(segment) = self.segments.remove(&segment_id) else { continue };
            self.shared
                .tracked_segments
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&segment_id);
            for holder in segment.holders {
                if let Some(load) = self.load.get_mut(&holder.server_id) {
                    *load = load.saturating_sub(1);
                }
                // Best effort: a backup that misses the free keeps a replica that recovery
                // ignores (its segment is not in the digest).
                self.orphans.push((holder.server_id, holder.address, SegmentId(segment_id)));
            }
        }
        self.free_orphans().await;
    }
}

/// Marks as dropped under `head` every tracked segment no longer in `log`. Every tracked
/// segment was in the log before it was tracked (survivors too: a side segment is in the log's
/// memory, outside its digest, until fused or abandoned), so one missing now was dropped.
fn mark_dropped_by_membership(
    segments: &mut BTreeMap<u64, SegmentReplicas>,
    log: &stratus_log::Log,
    head: SegmentId,
) {
    for (id, segment) in segments.iter_mut() {
        if segment.dropped_under_head.is_none() && log.certificate(SegmentId(*id)).is_none() {
            segment.dropped_under_head = Some(head.0);
        }
    }
}

/// One BACKUP_WRITE to send (maybe in several pieces).
struct BackupCall {
    master_id: ServerId,
    segment_id: SegmentId,
    epoch: u64,
    certificate: stratus_log::Certificate,
    close: bool,
    primary: bool,
}

impl BackupCall {
    /// Sends the bytes the holder lacks (`data`, starting at `holder.bytes_held`) with the
    /// certificate for the segment's current length; a backup that has not answered within the
    /// replication timeout (plus the transfer allowance for `data`) is unreachable.
    async fn send(
        self,
        pool: &ChannelPool,
        holder: &ReplicaHolder,
        data: Bytes,
        replication_timeout: Duration,
    ) -> WriteOutcome {
        let length = self.certificate.segment_length;
        let timeout = backup_write_timeout(replication_timeout, data.len());
        let request = Request::BackupWrite {
            master_id: self.master_id,
            segment_id: self.segment_id,
            epoch: self.epoch,
            offset: holder.bytes_held,
            flags: BackupWriteFlags {
                open: holder.bytes_held == 0,
                close: self.close,
                primary: self.primary,
            },
            certificate: ReplicaCertificate {
                segment_length: length,
                checksum: self.certificate.checksum,
            },
            data,
        };
        match pool.call_within(&holder.address, &request, timeout).await {
            Ok((Status::Ok, _)) => WriteOutcome::Held { bytes_held: length, closed: self.close },
            Ok((Status::ServerCrashed, _)) => WriteOutcome::Fenced,
            Ok((status, body)) => WriteOutcome::Refused(format!("{status}: {body:?}")),
            Err(error) => {
                pool.forget(&holder.address);
                WriteOutcome::Unreachable(error.to_string())
            }
        }
    }
}

/// A server's failure domain as placement compares it: its `--failure-domain`, or, for a
/// server without one, a name of its own (a space cannot occur in a given domain), so it
/// shares a domain with no other server.
fn domain_key(entry: &ServerEntry) -> String {
    if entry.failure_domain.is_empty() {
        format!(" server {}", entry.server_id.0)
    } else {
        entry.failure_domain.clone()
    }
}

/// The failure domain of `server_id` from the server list (a server no longer listed is a
/// domain of its own).
fn domain_of(domains: &BTreeMap<ServerId, String>, server_id: ServerId) -> String {
    domains.get(&server_id).cloned().unwrap_or_else(|| format!(" server {}", server_id.0))
}

/// The best tier of `candidates` by failure domain: `apart` says of each whether it is outside
/// the master's domain and whether it is outside the segment's holders' domains. Candidates
/// outside both come first; then those outside the holders' domains (the replicas still
/// survive the loss of any one domain but the master's); then all. The second value says
/// what a lower tier shares, for the log.
fn domain_tier<T: Copy>(
    candidates: Vec<T>,
    apart: impl Fn(T) -> (bool, bool),
) -> (Vec<T>, Option<&'static str>) {
    let best: Vec<T> = candidates
        .iter()
        .copied()
        .filter(|&candidate| {
            let (from_master, from_holders) = apart(candidate);
            from_master && from_holders
        })
        .collect();
    if !best.is_empty() || candidates.is_empty() {
        return (best, None);
    }
    let next: Vec<T> = candidates.iter().copied().filter(|&candidate| apart(candidate).1).collect();
    if !next.is_empty() {
        return (next, Some("this master's failure domain"));
    }
    (candidates, Some("another replica's failure domain"))
}

/// The copysets of a cluster: up backups sorted by server id, cut into consecutive groups of
/// `replicas`; a remainder too small for a group joins the last ids of the list (so every
/// backup is in some group and the groups are the same on every master that sees the same
/// list).
///
/// With failure domains (any backup has one), each group is formed across domains instead:
/// one backup (the lowest id left) from each of the `replicas` domains with the most backups
/// left, ties by domain name, as long as `replicas` domains have backups left (taking from
/// the largest domains first leaves the fewest over). Each backup left over then forms a
/// group with the lowest ids of other domains (of any domain where there are too few), so
/// every backup is in some group. Backups without a domain are each a domain of their own.
/// With fewer domains than `replicas`, the groups are cut by id as without domains.
fn copyset_groups(backups: &[ServerEntry], replicas: usize) -> Vec<Vec<ServerEntry>> {
    let mut sorted: Vec<ServerEntry> = backups.to_vec();
    sorted.sort_by_key(|entry| entry.server_id);
    if replicas == 0 || sorted.len() < replicas {
        return Vec::new();
    }
    let domains: BTreeSet<String> = sorted.iter().map(domain_key).collect();
    if sorted.iter().any(|entry| !entry.failure_domain.is_empty()) && domains.len() >= replicas {
        return copyset_groups_across_domains(&sorted, replicas);
    }
    let mut groups: Vec<Vec<ServerEntry>> =
        sorted.chunks_exact(replicas).map(|chunk| chunk.to_vec()).collect();
    if !sorted.len().is_multiple_of(replicas) {
        groups.push(sorted[sorted.len() - replicas..].to_vec());
    }
    groups
}

/// `copyset_groups` for backups (sorted by id, at least `replicas` of them) with failure
/// domains.
fn copyset_groups_across_domains(sorted: &[ServerEntry], replicas: usize) -> Vec<Vec<ServerEntry>> {
    let mut domains: BTreeMap<String, std::collections::VecDeque<&ServerEntry>> = BTreeMap::new();
    for entry in sorted {
        domains.entry(domain_key(entry)).or_default().push_back(entry);
    }
    let mut groups: Vec<Vec<ServerEntry>> = Vec::new();
    loop {
        let mut order: Vec<(usize, String)> = domains
            .iter()
            .filter(|(_, left)| !left.is_empty())
            .map(|(domain, left)| (left.len(), domain.clone()))
            .collect();
        if order.len() < replicas {
            break;
        }
        order.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let group = order[..replicas]
            .iter()
            .map(|(_, domain)| {
                let left = domains.get_mut(domain).expect("listed above");
                left.pop_front().expect("not empty").clone()
            })
            .collect();
        groups.push(group);
    }
    for entry in domains.into_values().flatten() {
        let mut group = vec![entry.clone()];
        let mut used: BTreeSet<String> = BTreeSet::from([domain_key(entry)]);
        for other in sorted {
            if group.len() == replicas {
                break;
            }
            if used.insert(domain_key(other)) {
                group.push(other.clone());
            }
        }
        for other in sorted {
            if group.len() == replicas {
                break;
            }
            if group.iter().all(|member| member.server_id != other.server_id) {
                group.push(other.clone());
            }
        }
        groups.push(group);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(id: u64) -> ServerEntry {
        ServerEntry {
            server_id: ServerId(id),
            address: format!("127.0.0.1:{}", 7_000 + id),
            services: ServiceMask(ServiceMask::BACKUP),
            status: ServerStatus::Up,
            failure_domain: String::new(),
        }
    }

    fn ids(groups: &[Vec<ServerEntry>]) -> Vec<Vec<u64>> {
        groups.iter().map(|group| group.iter().map(|entry| entry.server_id.0).collect()).collect()
    }

    #[test]
    fn tracked_segments_gone_from_the_log_are_marked_dropped() {
        use stratus_log::{AppendEntry, AppendPriority, EntryType, Log, LogConfig, SideLog};
        let config = LogConfig {
            log_bytes: 96 << 10,
            segment_bytes: 8 << 10,
            seglet_bytes: 1 << 10,
            prefault_memory: false,
            flash_image_bytes: 0,
        };
        let log = Log::new(config, ServerId(1));
        let entry = [AppendEntry::new(EntryType::Object, &[1; 100])];
        log.append(&entry, AppendPriority::Normal).unwrap();
        let head = log.head_segment_id().unwrap();
        // A side segment that stays, and one abandoned (its drop forgotten, say).
        let mut kept = SideLog::new(AppendPriority::Normal);
        kept.append(&log, &entry[0]).unwrap();
        let mut abandoned = SideLog::new(AppendPriority::Normal);
        let (reference, _) = abandoned.append(&log, &entry[0]).unwrap();
        let guard = log.pin();
        log.free(&guard, reference);
        drop(guard);
        log.abandon_side_segments(abandoned.segments());
        let tracked = |dropped_under_head| SegmentReplicas {
            epoch: 1,
            holders: Vec::new(),
            excluded: BTreeSet::new(),
            dropped_under_head,
            complete: true,
            ever_complete: true,
        };
        let (kept_id, abandoned_id) = (kept.segments()[0], abandoned.segments()[0]);
        // Not in this log either, but already marked under an older head.
        let marked_before = SegmentId(head.0 + 100);
        let mut segments = BTreeMap::from([
            (head.0, tracked(None)),
            (kept_id.0, tracked(None)),
            (abandoned_id.0, tracked(None)),
            (marked_before.0, tracked(Some(0))),
        ]);
        mark_dropped_by_membership(&mut segments, &log, head);
        let marks: Vec<(u64, Option<u64>)> =
            segments.iter().map(|(id, segment)| (*id, segment.dropped_under_head)).collect();
        let mut expected = vec![
            (head.0, None),
            (kept_id.0, None),
            (abandoned_id.0, Some(head.0)),
            (marked_before.0, Some(0)),
        ];
        expected.sort();
        assert_eq!(marks, expected);
    }

    #[test]
    fn copysets_partition_backups_by_id() {
        let backups: Vec<ServerEntry> = [5, 1, 3, 2, 4, 6].into_iter().map(backup).collect();
        assert_eq!(ids(&copyset_groups(&backups, 3)), vec![vec![1, 2, 3], vec![4, 5, 6]]);
        assert_eq!(ids(&copyset_groups(&backups, 2)), vec![vec![1, 2], vec![3, 4], vec![5, 6]]);
        // A remainder joins the highest ids, so every backup is in a group.
        let seven: Vec<ServerEntry> = (1..=7).map(backup).collect();
        assert_eq!(
            ids(&copyset_groups(&seven, 3)),
            vec![vec![1, 2, 3], vec![4, 5, 6], vec![5, 6, 7]]
        );
        assert!(copyset_groups(&seven[..2], 3).is_empty());
    }

    /// A coordinator and a backup in one scripted server: the server list names it as the only
    /// backup (besides the master, id 1), and it refuses every replica write as a backup does
    /// once the coordinator fenced the master.
    struct FencingBackup {
        address: std::sync::Mutex<String>,
    }

    impl stratus_rpc::Service for FencingBackup {
        fn handle(
            &self,
            header: &stratus_wire::FrameHeader,
            body: Bytes,
            out: &mut bytes::BytesMut,
        ) -> stratus_rpc::Handled {
            use stratus_wire::{decode_request, encode_error_response, encode_response, Response};
            let response = match decode_request(header.opcode_code, body) {
                Ok(Request::GetServerList) => {
                    let address = self.address.lock().unwrap().clone();
                    let entry = ServerEntry { address, ..backup(2) };
                    Response::GetServerList { servers: vec![entry] }
                }
                Ok(Request::Ping) => Response::Ping,
                _ => {
                    let status = Status::ServerCrashed;
                    encode_error_response(out, header.request_id, header.opcode_code, status, "");
                    return stratus_rpc::Handled::Done;
                }
            };
            encode_response(out, header.request_id, Status::Ok, &response);
            stratus_rpc::Handled::Done
        }
    }

    /// A replica manager whose only backup refuses its writes (it was fenced), on `runtime`.
    fn fenced_replica_manager(runtime: &tokio::runtime::Runtime) -> ReplicaManager {
        runtime.block_on(async {
            let environment = Environment::system();
            let listener = environment.network.bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_address();
            let service =
                Arc::new(FencingBackup { address: std::sync::Mutex::new(address.clone()) });
            tokio::spawn(stratus_rpc::serve(listener, service));
            let store = stratus_store::StoreConfig::for_testing();
            let store = Arc::new(ObjectStore::new(store, ServerId(1)).unwrap());
            // Something to replicate: the log's first head.
            let (table, key) = (stratus_types::TableId(1), b"key");
            let hash = stratus_types::key_hash(table, key);
            let rules = stratus_types::RejectRules::NONE;
            store
                .write(
                    table,
                    key,
                    hash,
                    b"value",
                    &rules,
                    stratus_store::Expiry::Never,
                    stratus_store::WallTime::from_seconds(0),
                )
                .unwrap();
            let mut config = ReplicationConfig::new(1, address);
            config.sync_timeout = Duration::from_secs(600);
            ReplicaManager::start(ServerId(1), config, store, environment)
        })
    }

    /// Runs `make_durable` of a survivor segment on a thread of its own; its outcome, or
    /// `None` if it did not return within a minute (far more than it takes).
    fn make_durable_on_a_thread(manager: &ReplicaManager) -> Option<Result<(), DurabilityError>> {
        use stratus_log::{AppendEntry, AppendPriority, EntryType, SideLog};
        // A survivor: a side segment, in the log but not fused yet.
        let log = manager.shared.store.log();
        let mut survivors = SideLog::new(AppendPriority::Cleaner);
        survivors.append(log, &AppendEntry::new(EntryType::Object, &[1; 100])).unwrap();
        let survivor = survivors.segments()[0];
        let (bytes, certificate) = log.segment_contents(survivor).unwrap();
        let manager = manager.clone();
        let (sender, outcome) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = sender.send(manager.make_durable(survivor, &bytes, certificate));
        });
        outcome.recv_timeout(Duration::from_secs(60)).ok()
    }

    #[test]
    fn a_fenced_master_is_told_its_survivor_cannot_be_made_durable() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let manager = fenced_replica_manager(&runtime);
        // The survivor goes to the pump before it learns of the fencing (the sync timeout is
        // ten minutes: only the fencing can end the wait in time).
        let outcome = make_durable_on_a_thread(&manager).expect("make_durable never returned");
        assert_eq!(outcome, Err(DurabilityError::Fenced));
        assert!(manager.is_fenced());
        // Once fenced, at once.
        assert_eq!(make_durable_on_a_thread(&manager), Some(Err(DurabilityError::Fenced)));
    }

    #[test]
    fn make_durable_reports_a_pump_that_is_gone() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let manager = fenced_replica_manager(&runtime);
        // The runtime ends, and the pump with it, before anything is replicated.
        runtime.shutdown_background();
        assert_eq!(make_durable_on_a_thread(&manager), Some(Err(DurabilityError::Stopped)));
    }

    #[test]
    fn a_master_short_of_backups_finds_one_that_joined_without_waiting_out_the_list() {
        use crate::peer_probe::SERVER_LIST_REFRESH_INTERVAL;
        runtime().block_on(async {
            let mut cluster = ScriptedCluster::start(1, 2, |config| {
                // Shorter than the list is trusted: only a fetch that the shortage itself
                // prompts can make the write durable in time.
                config.sync_timeout = SERVER_LIST_REFRESH_INTERVAL / 2;
            })
            .await;
            let manager = cluster.manager.clone();
            // Something to replicate, so the pump fetches the server list.
            cluster.write();
            // The pump fetched the list with one backup (of the two it needs) ...
            for _ in 0..1_000 {
                if manager.backups_available() == 1 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(manager.backups_available(), 1, "the first list was never fetched");
            // ... and then a second backup joins.
            cluster.add_backup().await;
            let synced = cluster.write_and_sync().await;
            assert!(synced.is_ok(), "{synced:?}");
            assert_eq!(manager.backups_available(), 2);
        });
    }

    fn in_domain(id: u64, domain: &str) -> ServerEntry {
        ServerEntry { failure_domain: domain.to_string(), ..backup(id) }
    }

    fn domains_of(group: &[ServerEntry]) -> BTreeSet<String> {
        group.iter().map(domain_key).collect()
    }

    #[test]
    fn copysets_are_formed_across_failure_domains() {
        // Four racks of four: every group of three is in three racks, and every backup is in
        // exactly one group but the one left over, which joins a group of other racks.
        let backups: Vec<ServerEntry> =
            (1..=16).map(|id| in_domain(id, &format!("rack-{}", id % 4))).collect();
        let groups = copyset_groups(&backups, 3);
        assert_eq!(groups.len(), 6, "{:?}", ids(&groups));
        for group in &groups {
            assert_eq!(domains_of(group).len(), 3, "{:?}", ids(&groups));
        }
        let mut seen: Vec<u64> = ids(&groups).into_iter().flatten().collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, (1..=16).collect::<Vec<u64>>());
        // The same list in another order gives the same groups (every master agrees).
        let mut reversed = backups.clone();
        reversed.reverse();
        assert_eq!(ids(&copyset_groups(&reversed, 3)), ids(&groups));
        // Unequal racks: the largest are drawn from first, so only one backup is left over.
        let uneven: Vec<ServerEntry> = (1..=9)
            .map(|id| in_domain(id, if id <= 5 { "big" } else { ["a", "b"][id as usize % 2] }))
            .collect();
        let groups = copyset_groups(&uneven, 2);
        for group in &groups {
            assert_eq!(domains_of(group).len(), 2, "{:?}", ids(&groups));
        }
        // Fewer racks than replicas: groups of consecutive ids, as without racks.
        let two_racks: Vec<ServerEntry> =
            (1..=6).map(|id| in_domain(id, ["x", "y"][id as usize % 2])).collect();
        assert_eq!(ids(&copyset_groups(&two_racks, 3)), vec![vec![1, 2, 3], vec![4, 5, 6]]);
        for group in copyset_groups(&two_racks, 3) {
            let mut members: Vec<u64> = group.iter().map(|entry| entry.server_id.0).collect();
            members.dedup();
            assert_eq!(members.len(), 3);
            assert_eq!(domains_of(&group).len(), 2);
        }
    }

    #[test]
    fn domain_tiers_prefer_apart_then_apart_from_holders_then_any() {
        let apart = |candidate: u8| (candidate.is_multiple_of(2), candidate < 4);
        assert_eq!(domain_tier(vec![1, 2, 3, 4], apart), (vec![2], None));
        assert_eq!(
            domain_tier(vec![1, 3, 4], apart),
            (vec![1, 3], Some("this master's failure domain"))
        );
        assert_eq!(
            domain_tier(vec![5, 6], apart),
            (vec![5, 6], Some("another replica's failure domain"))
        );
        assert_eq!(domain_tier(Vec::<u8>::new(), apart), (Vec::new(), None));
    }

    /// Places one segment of a master (id 1, in `master_domain`) with `replicas` replicas on
    /// backups 2, 3, … in `domains`, and returns the domains of the backups that received it.
    fn placed_domains(master_domain: &str, domains: &[&str], replicas: usize) -> Vec<String> {
        runtime().block_on(async {
            let mut cluster = ScriptedCluster::start(domains.len() as u64, replicas, |_| {}).await;
            {
                let mut servers = cluster.servers.lock().unwrap();
                for (entry, domain) in servers.iter_mut().zip(domains) {
                    entry.failure_domain = domain.to_string();
                }
                let master = ServerEntry {
                    services: ServiceMask(ServiceMask::MASTER),
                    failure_domain: master_domain.to_string(),
                    ..backup(1)
                };
                servers.push(master);
            }
            let synced = cluster.write_and_sync().await;
            assert!(synced.is_ok(), "{synced:?}");
            let holders: Vec<ServerId> = cluster.writes().into_keys().collect();
            assert_eq!(holders.len(), replicas, "{holders:?}");
            holders.iter().map(|id| domains[(id.0 - 2) as usize].to_string()).collect()
        })
    }

    #[test]
    fn replicas_never_share_a_failure_domain_when_they_need_not() {
        // Three racks of two backups, the master in rack a: two replicas go to racks b and c,
        // whatever the random choices.
        for _ in 0..8 {
            let mut placed = placed_domains("a", &["a", "a", "b", "b", "c", "c"], 2);
            placed.sort();
            assert_eq!(placed, ["b", "c"]);
        }
    }

    #[test]
    fn too_few_failure_domains_fall_back_to_distinct_servers() {
        // Racks a (the master's too) and b for two replicas: one in each.
        for _ in 0..4 {
            let mut placed = placed_domains("a", &["a", "b", "b"], 2);
            placed.sort();
            assert_eq!(placed, ["a", "b"]);
        }
        // One rack for three replicas: three distinct servers of it.
        assert_eq!(placed_domains("a", &["b", "b", "b"], 3), ["b", "b", "b"]);
        // No domains at all: as before, any three distinct backups.
        assert_eq!(placed_domains("", &["", "", ""], 3).len(), 3);
    }

    /// A scripted node: the coordinator (server list and log heads) or one backup. A backup
    /// counts the replica writes it acknowledged; silenced, it takes requests and never
    /// answers, as a paused process does (its kernel still accepts the connection).
    struct ScriptedNode {
        servers: Arc<std::sync::Mutex<Vec<ServerEntry>>>,
        silent: std::sync::atomic::AtomicBool,
        writes: std::sync::atomic::AtomicU64,
    }

    impl stratus_rpc::Service for ScriptedNode {
        fn handle(
            &self,
            header: &stratus_wire::FrameHeader,
            body: Bytes,
            out: &mut bytes::BytesMut,
        ) -> stratus_rpc::Handled {
            use stratus_wire::{decode_request, encode_error_response, encode_response, Response};
            if self.silent.load(std::sync::atomic::Ordering::SeqCst) {
                return stratus_rpc::Handled::Later(Box::pin(std::future::pending()));
            }
            let response = match decode_request(header.opcode_code, body) {
                Ok(Request::GetServerList) => {
                    Response::GetServerList { servers: self.servers.lock().unwrap().clone() }
                }
                Ok(Request::BackupWrite { .. }) => {
                    self.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Response::BackupWrite
                }
                Ok(Request::SetLogHead { .. }) => Response::SetLogHead,
                Ok(Request::BackupFree { .. }) => Response::BackupFree,
                Ok(Request::Ping) => Response::Ping,
                _ => {
                    let status = Status::UnimplementedRequest;
                    encode_error_response(out, header.request_id, header.opcode_code, status, "");
                    return stratus_rpc::Handled::Done;
                }
            };
            encode_response(out, header.request_id, Status::Ok, &response);
            stratus_rpc::Handled::Done
        }
    }

    /// A coordinator and `backups` scripted backups (ids 2, 3, …), each on its own port, and a
    /// replica manager (master id 1) with `replicas` replicas and `config_changes` applied.
    struct ScriptedCluster {
        environment: Environment,
        servers: Arc<std::sync::Mutex<Vec<ServerEntry>>>,
        backups: BTreeMap<ServerId, Arc<ScriptedNode>>,
        manager: ReplicaManager,
        written: u64,
    }

    impl ScriptedCluster {
        async fn start(
            backups: u64,
            replicas: usize,
            configure: impl FnOnce(&mut ReplicationConfig),
        ) -> ScriptedCluster {
            let environment = Environment::system();
            let servers = Arc::new(std::sync::Mutex::new(Vec::new()));
            let (coordinator, _) = serve_node(&environment, &servers).await;
            let store = stratus_store::StoreConfig::for_testing();
            let store = Arc::new(ObjectStore::new(store, ServerId(1)).unwrap());
            let mut config = ReplicationConfig::new(replicas, coordinator);
            configure(&mut config);
            let manager = ReplicaManager::start(ServerId(1), config, store, environment.clone());
            let mut cluster = ScriptedCluster {
                environment,
                servers,
                backups: BTreeMap::new(),
                manager,
                written: 0,
            };
            for _ in 0..backups {
                cluster.add_backup().await;
            }
            cluster
        }

        /// Starts one more backup (ids 2, 3, … in order) and lists it in the server list.
        async fn add_backup(&mut self) {
            let id = 2 + self.backups.len() as u64;
            let (address, node) = serve_node(&self.environment, &self.servers).await;
            self.servers.lock().unwrap().push(ServerEntry { address, ..backup(id) });
            self.backups.insert(ServerId(id), node);
        }

        /// Writes one more object and waits for it to be on every replica.
        async fn write_and_sync(&mut self) -> Result<(), SyncError> {
            self.write();
            self.manager.sync(self.manager.position_to_sync()).await
        }

        /// Writes one more object into the master's store (replicated by the next round).
        fn write(&mut self) {
            self.written += 1;
            let (table, key) = (stratus_types::TableId(1), self.written.to_string());
            let hash = stratus_types::key_hash(table, key.as_bytes());
            let rules = stratus_types::RejectRules::NONE;
            let store = &self.manager.shared.store;
            store
                .write(
                    table,
                    key.as_bytes(),
                    hash,
                    b"value",
                    &rules,
                    stratus_store::Expiry::Never,
                    stratus_store::WallTime::from_seconds(0),
                )
                .unwrap();
        }

        /// The backups that have acknowledged at least one replica write, and how many.
        fn writes(&self) -> BTreeMap<ServerId, u64> {
            self.backups
                .iter()
                .map(|(id, node)| (*id, node.writes.load(std::sync::atomic::Ordering::SeqCst)))
                .filter(|(_, writes)| *writes > 0)
                .collect()
        }
    }

    /// A scripted node serving on a port of its own; its address and the node.
    async fn serve_node(
        environment: &Environment,
        servers: &Arc<std::sync::Mutex<Vec<ServerEntry>>>,
    ) -> (String, Arc<ScriptedNode>) {
        let node = Arc::new(ScriptedNode {
            servers: servers.clone(),
            silent: std::sync::atomic::AtomicBool::new(false),
            writes: std::sync::atomic::AtomicU64::new(0),
        });
        let listener = environment.network.bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_address();
        tokio::spawn(stratus_rpc::serve(listener, node.clone()));
        (address, node)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
    }

    #[test]
    fn a_silent_backup_holds_up_writes_no_longer_than_the_replication_timeout() {
        runtime().block_on(async {
            let mut cluster = ScriptedCluster::start(3, 2, |config| {
                config.replication_timeout = Duration::from_millis(100);
                // Far less than the pause below: every write must become durable around
                // the silent backup, not wait for it to answer again.
                config.sync_timeout = Duration::from_secs(1);
            })
            .await;
            cluster.write_and_sync().await.expect("the first write");
            let holders: Vec<ServerId> = cluster.writes().into_keys().collect();
            assert_eq!(holders.len(), 2, "the head is on two backups");
            // One holder pauses for good.
            let paused = &cluster.backups[&holders[0]];
            paused.silent.store(true, std::sync::atomic::Ordering::SeqCst);
            // Writes go on for longer than a holder check's interval, so the checks that ping
            // the silent backup (a holder first, then quarantined) run meanwhile too.
            let started = tokio::time::Instant::now();
            while started.elapsed() < HOLDER_CHECK_INTERVAL * 5 / 2 {
                let synced = cluster.write_and_sync().await;
                assert!(synced.is_ok(), "a write waited for the silent backup: {synced:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let replacement: Vec<ServerId> =
                cluster.writes().into_keys().filter(|id| !holders.contains(id)).collect();
            assert_eq!(replacement.len(), 1, "the third backup took the silent one's replica");
            assert!(cluster.manager.statistics().replicas_replaced >= 1);
        });
    }

    #[test]
    fn a_backup_declared_crashed_loses_its_replicas_at_once() {
        runtime().block_on(async {
            let mut cluster = ScriptedCluster::start(3, 2, |_| {}).await;
            cluster.write_and_sync().await.expect("the first write");
            let holders: Vec<ServerId> = cluster.writes().into_keys().collect();
            assert_eq!(holders.len(), 2, "the head is on two backups");
            // The coordinator declares a holder crashed, which still answers everything (a
            // server cut off from the coordinator only, say): the declaration alone must take
            // its replicas away, before any write or ping finds it silent.
            for entry in cluster.servers.lock().unwrap().iter_mut() {
                if entry.server_id == holders[0] {
                    entry.status = ServerStatus::Crashed;
                }
            }
            // The server list is fetched again (the peer pinger does every 2 s).
            let list = cluster.manager.server_list();
            list.mark_stale().await;
            list.servers().await.unwrap();
            let declared_writes = cluster.writes()[&holders[0]];
            for _ in 0..200 {
                if cluster.manager.statistics().replicas_replaced >= 1 {
                    break;
                }
                cluster.write_and_sync().await.expect("a write");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert_eq!(cluster.manager.statistics().replicas_replaced, 1);
            cluster.write_and_sync().await.expect("a write after the replacement");
            let writes = cluster.writes();
            assert_eq!(writes[&holders[0]], declared_writes, "no write went to the crashed one");
            assert_eq!(writes.len(), 3, "the third backup holds the replica now");
        });
    }

    #[test]
    fn log_positions_order_by_segment_then_bytes() {
        let early = LogPosition { segment_id: 3, bytes: 9_000 };
        let later = LogPosition { segment_id: 4, bytes: 10 };
        assert!(early < later);
        assert!(LogPosition { segment_id: 4, bytes: 11 } > later);
    }
}
