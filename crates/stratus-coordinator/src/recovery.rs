//! Failure detection and master crash recovery, the coordinator's side
//! (docs/design/recovery.md).
//!
//! The failure detector pings every server that is up; a server that misses
//! [`FailureDetectorConfig::misses_to_declare`] pings in a row is declared crashed (one late
//! reply never is). Declaring a master crashed starts its recovery: the coordinator finds the
//! crashed log's newest digest among the replicas the backups hold, checks that every segment
//! it lists has a replica, cuts the crashed master's tablets into one partition per live master,
//! and sends each partition to its recovery master (RECOVER_TABLETS). A partition that comes
//! back OK is durable on its new master: the tablet map changes (persisted first), then the new
//! owner is told to serve it. Partitions that failed stay with the crashed master — clients see
//! them as recovering — and the next attempt tries them again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stratus_log::{verify_replica, Certificate};
use stratus_rpc::{Backoff, ChannelPool, RpcConfig, RpcError};
use stratus_types::{HashRange, SegmentId, ServerId, TableId};
use stratus_wire::{
    RecoveryTablet, Request, Response, ResponseBody, ServerEntry, ServerStatus, Status,
};

use crate::metrics::CoordinatorCounters;
use crate::records::{put_server, put_table, LogHead, TabletRecord};
use crate::service::Inner;

/// How the coordinator decides that a server crashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureDetectorConfig {
    /// Time between two rounds of pings.
    pub probe_interval: Duration,
    /// How long one ping may take before it counts as missed.
    pub probe_timeout: Duration,
    /// Missed pings in a row that declare a server crashed.
    pub misses_to_declare: u32,
}

impl Default for FailureDetectorConfig {
    /// Detection within about a second (3 × 200 ms + a 250 ms timeout), and a server must miss
    /// three pings in a row: one slow reply (a long pause, a busy core) is not a crash.
    fn default() -> FailureDetectorConfig {
        FailureDetectorConfig {
            probe_interval: Duration::from_millis(200),
            probe_timeout: Duration::from_millis(250),
            misses_to_declare: 3,
        }
    }
}

/// How long a master may serve after asking for its lease. Shorter than detection (three
/// missed 200 ms probes), so a master's lease has ended by the time it would be declared
/// crashed anyway; long against the renewal interval (150 ms), so one slow renewal costs
/// nothing.
pub const LEASE_DURATION: Duration = Duration::from_millis(750);

/// Extra time a crash declaration waits past the end of the last lease: covers the two clocks
/// running at slightly different rates.
pub const LEASE_MARGIN: Duration = Duration::from_millis(50);

/// How long one RECOVER_TABLETS may run: reading and replaying a whole partition.
const RECOVER_TABLETS_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a recovery waiting on a recovery master checks that it is still up.
const RECOVERY_MASTER_CHECK_INTERVAL: Duration = Duration::from_millis(100);

/// How long one replica read by the coordinator (looking for the newest digest) may take.
const REPLICA_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Recovery attempts for one crashed master before the coordinator gives up until it restarts
/// (with the backoff below, well over half an hour of retrying).
const RECOVERY_ATTEMPTS_MAX: u32 = 1_000;

/// Parts one crashed tablet is cut into at most (each is recovered by a different master).
const PARTS_PER_TABLET_MAX: u32 = 64;

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

/// What one recovery attempt concluded.
enum Attempt {
    /// Every tablet of the crashed master is served elsewhere.
    Finished,
    /// Try again later, for this reason.
    Again(String),
}

/// A replica some backup listed.
#[derive(Clone, Debug)]
struct Location {
    backup: String,
    epoch: u64,
    length: u32,
}

impl Inner {
    /// Pings every server that is up, forever; declares crashed those that miss enough pings
    /// in a row.
    pub(crate) async fn run_failure_detector(self: Arc<Self>, config: FailureDetectorConfig) {
        self.misses_to_declare
            .store(config.misses_to_declare, std::sync::atomic::Ordering::Relaxed);
        loop {
            tokio::time::sleep(config.probe_interval).await;
            let servers: Vec<ServerEntry> =
                self.state.lock().await.servers_in(ServerStatus::Up).cloned().collect();
            self.ping_misses().retain(|id, _| servers.iter().any(|server| server.server_id == *id));
            let mut probes = tokio::task::JoinSet::new();
            for server in servers {
                let inner = self.clone();
                probes.spawn(async move {
                    let ping = inner.pool.call(&server.address, &Request::Ping);
                    let answered = matches!(
                        tokio::time::timeout(config.probe_timeout, ping).await,
                        Ok(Ok((Status::Ok, _)))
                    );
                    if !answered {
                        inner.pool.forget(&server.address);
                    }
                    (server.server_id, answered)
                });
            }
            while let Some(joined) = probes.join_next().await {
                let Ok((server_id, answered)) = joined else { continue };
                if answered {
                    self.ping_misses().remove(&server_id);
                    continue;
                }
                let missed = {
                    let mut misses = self.ping_misses();
                    let missed = misses.entry(server_id).or_insert(0);
                    *missed += 1;
                    *missed
                };
                // A server whose lease may still run could still be serving: the declaration
                // waits for the lease to end (checked again under the state lock). Meanwhile
                // its renewals are refused (see `renew_lease`), so the lease does end.
                if missed >= config.misses_to_declare
                    && self.declare_crashed(server_id, "missed pings", true).await
                {
                    self.ping_misses().remove(&server_id);
                }
            }
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

    /// Starts recoveries for every crashed server (after a restart of the coordinator, or after
    /// servers were found gone). One that owns no tablet is simply marked removed, so backups
    /// free its replicas.
    pub(crate) async fn resume_recoveries(self: &Arc<Self>) {
        let crashed: Vec<ServerId> = self
            .state
            .lock()
            .await
            .servers_in(ServerStatus::Crashed)
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
        for attempt in 1..=RECOVERY_ATTEMPTS_MAX {
            match self.recovery_attempt(crashed).await {
                Attempt::Finished => {
                    tracing::info!(%crashed, attempt, elapsed_ms = started.elapsed().as_millis() as u64, "recovery finished");
                    CoordinatorCounters::count(&self.counters.recoveries_completed, 1);
                    self.mark_removed(crashed).await;
                    return;
                }
                Attempt::Again(reason) => {
                    tracing::warn!(%crashed, attempt, %reason, "recovery attempt incomplete; retrying");
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
        if server.status != ServerStatus::Crashed {
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
        let (tablets, masters, backups) = {
            let state = self.state.lock().await;
            let tablets: Vec<(TableId, HashRange)> = state
                .tables
                .values()
                .flat_map(|table| {
                    table
                        .tablets
                        .iter()
                        .filter(|tablet| tablet.owner == crashed)
                        .map(|tablet| (table.table_id, tablet.range))
                })
                .collect();
            let masters: Vec<(ServerId, String)> = state
                .servers_in(ServerStatus::Up)
                .filter(|server| server.services.has_master())
                .map(|server| (server.server_id, server.address.clone()))
                .collect();
            let backups: Vec<String> = state
                .servers_in(ServerStatus::Up)
                .filter(|server| server.services.has_backup())
                .map(|server| server.address.clone())
                .collect();
            (tablets, masters, backups)
        };
        if tablets.is_empty() {
            return Attempt::Finished;
        }
        if masters.is_empty() {
            return Attempt::Again("no master is up to recover onto".to_string());
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
        let head = self.log_heads.lock().await.get(&crashed).copied();
        let segments = match head {
            // It never reported a head, so it never had a replicated write acknowledged (or it
            // ran without replicas, and its data died with it): nothing to replay.
            None => {
                tracing::warn!(%crashed, "the crashed master never reported a log head: its tablets are handed over empty");
                Vec::new()
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
                    Ok(listed) => listed,
                    Err(reason) => return Attempt::Again(reason),
                }
            }
        };
        if let Some(missing) = segments.iter().find(|id| !locations.contains_key(id)) {
            return Attempt::Again(format!(
                "the log is incomplete: no live backup holds segment {missing} of the digest"
            ));
        }

        // One part per master in all, spread over the tablets.
        let parts_per_tablet = (masters.len().div_ceil(tablets.len()) as u32)
            .clamp(1, PARTS_PER_TABLET_MAX.min(masters.len() as u32));
        let first = self.environment.entropy.below(masters.len() as u64) as usize;
        let mut partitions: BTreeMap<usize, Vec<(TableId, HashRange, HashRange)>> = BTreeMap::new();
        let mut slot = first;
        for &(table_id, range) in &tablets {
            for part in range.split(parts_per_tablet) {
                partitions.entry(slot % masters.len()).or_default().push((table_id, range, part));
                slot += 1;
            }
        }
        tracing::info!(
            %crashed,
            tablets = tablets.len(),
            segments = segments.len(),
            recovery_masters = partitions.len(),
            "recovering"
        );

        let mut calls = tokio::task::JoinSet::new();
        for (index, parts) in partitions {
            let (master_id, address) = masters[index].clone();
            let request = Request::RecoverTablets {
                crashed_master: crashed,
                tablets: parts
                    .iter()
                    .map(|&(table_id, _, range)| RecoveryTablet { table_id, range })
                    .collect(),
                segments: segments.clone(),
                backups: backups.clone(),
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
        let mut recovered: Vec<(TableId, HashRange, HashRange, ServerId)> = Vec::new();
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
                Ok((Status::Ok, ResponseBody::Operation(Response::RecoverTablets { .. }))) => {
                    recovered.extend(
                        parts
                            .into_iter()
                            .map(|(table, tablet, part)| (table, tablet, part, master_id)),
                    );
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
    /// answer: one that does not may hold what makes the log complete.
    async fn locate_replicas(
        &self,
        crashed: ServerId,
        backups: &[String],
    ) -> Result<BTreeMap<SegmentId, Vec<Location>>, String> {
        let mut locations: BTreeMap<SegmentId, Vec<Location>> = BTreeMap::new();
        for backup in backups {
            let request = Request::BackupListReplicas { master_id: crashed };
            match self.recovery_pools.backups.call(backup, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::BackupListReplicas { replicas }),
                )) => {
                    for replica in replicas.into_iter().filter(|r| r.master_id == crashed) {
                        locations.entry(replica.segment_id).or_default().push(Location {
                            backup: backup.clone(),
                            epoch: replica.epoch,
                            length: replica.certificate.segment_length,
                        });
                    }
                }
                Ok((status, _)) => {
                    return Err(format!("backup {backup} refused to list replicas: {status}"))
                }
                Err(error) => {
                    self.recovery_pools.backups.forget(backup);
                    return Err(format!("backup {backup} did not list its replicas: {error}"));
                }
            }
        }
        for replicas in locations.values_mut() {
            // Newest epoch first (an older one may miss acknowledged data), then the longest.
            replicas.sort_by(|a, b| b.epoch.cmp(&a.epoch).then(b.length.cmp(&a.length)));
        }
        Ok(locations)
    }

    /// The members of the crashed log's newest digest: the one in its last head, the segment it
    /// reported with SET_LOG_HEAD before acknowledging any write there. Only a replica at the
    /// reported epoch or newer is read (an older one may lack the end of the head). Earlier
    /// heads hold digests too, but older ones: looking for "the highest segment with a digest"
    /// among the replicas that happen to be visible could pick one of those.
    async fn newest_digest(
        &self,
        crashed: ServerId,
        locations: &BTreeMap<SegmentId, Vec<Location>>,
        head: LogHead,
    ) -> Result<Vec<SegmentId>, String> {
        let replicas = locations.get(&head.segment_id).map(Vec::as_slice).unwrap_or_default();
        let mut problems = Vec::new();
        for location in replicas.iter().filter(|location| location.epoch >= head.epoch) {
            match self.read_replica(crashed, head.segment_id, &location.backup).await {
                Ok(Some(digest)) => return Ok(digest),
                Ok(None) => problems.push(format!("{}: no digest in the head", location.backup)),
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

    /// Reads and verifies one replica; returns the digest it holds, if any.
    async fn read_replica(
        &self,
        crashed: ServerId,
        segment_id: SegmentId,
        backup: &str,
    ) -> Result<Option<Vec<SegmentId>>, String> {
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
        verify_replica(&data, &certificate, crashed, segment_id).map(|verified| verified.digest)
    }

    /// Hands recovered parts to their new masters: the tablet map changes first (one durable
    /// batch), then each new owner is told to serve its parts.
    async fn commit_recovered(
        self: &Arc<Self>,
        crashed: ServerId,
        recovered: &[(TableId, HashRange, HashRange, ServerId)],
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
                let mut sorted: Vec<_> =
                    parts.iter().map(|(_, _, part, owner)| (*part, *owner)).collect();
                sorted.sort_by_key(|(part, _)| part.start);
                for (part, owner) in sorted {
                    let Some(start) = cursor else { break };
                    if start < part.start {
                        tablets.push(TabletRecord {
                            range: HashRange { start, end: part.start - 1 },
                            owner: crashed,
                        });
                    }
                    tablets.push(TabletRecord { range: part, owner });
                    cursor = part.end.checked_add(1);
                }
                if let Some(start) = cursor.filter(|start| *start <= tablet.range.end) {
                    tablets.push(TabletRecord {
                        range: HashRange { start, end: tablet.range.end },
                        owner: crashed,
                    });
                }
            }
            updated.tablets = tablets;
            changed.push((name.clone(), updated));
        }
        let batch = changed.iter().map(|(name, table)| put_table(name, table)).collect();
        if let Err((_, message)) = self.persist(batch).await {
            // Nothing changed: the next attempt replays again (harmless: versions decide).
            return Err(format!("the new owners could not be persisted: {message}"));
        }
        for (name, table) in changed {
            state.tables.insert(name, table);
        }
        drop(state);
        for &(table_id, _, part, owner) in recovered {
            let inner = self.clone();
            tokio::spawn(async move {
                crate::service::deliver(inner, table_id, TabletRecord { range: part, owner }, true)
                    .await
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
