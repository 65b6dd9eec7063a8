//! Reading a crashed master's replicas once for all its recovery masters
//! (BACKUP_START_PARTITIONING, docs/design/wire-protocol.md).
//!
//! Without it, every recovery master asks for its partition of every segment, and the backup
//! reads and scans the replica once per recovery master. RAMCloud's backups instead read each
//! replica once, as soon as recovery starts, and cut it into every partition at once; the
//! recovery masters then fetch parts that are ready. That is what this module does: the
//! coordinator names the partitions, a task per crashed master reads the backup's primary
//! replicas of the log one by one, in the background, and keeps each cut until its recovery
//! master fetches it.
//!
//! It is only an optimization, never a second source of truth: a request it cannot answer (a
//! part already fetched, a replica that was not cut, a partitioning replaced or given up) is
//! filtered on demand from the replica, exactly as before, and both give the same bytes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use stratus_log::Entry;
use stratus_types::{key_hash, SegmentId, ServerId};
use stratus_wire::{RecoveryTablet, ReplicaCertificate, Status};
use tokio::sync::Notify;

use crate::service::{Pending, ReplicaContents, Shared};

/// Most bytes of cut replicas a backup holds that no recovery master fetched yet, by default
/// (`BackupConfig::recovery_partitioned_bytes_max`); reading pauses while they are this many. A recovery reads a backup's share of a crashed master's
/// log (RAMCloud keeps all of it in memory); this bounds what one backup keeps at once.
pub const RECOVERY_PARTITIONED_BYTES_MAX: usize = 256 << 20;

/// Crashed masters a backup partitions for at once (several crash together only rarely); a
/// further one replaces the oldest.
pub const PARTITIONINGS_MAX: usize = 4;

/// A partitioning whose parts nobody fetched for this long is given up (its recovery
/// masters failed, or read other replicas): its memory must not stay held.
pub const PARTITIONING_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Times a replica read the disk queue refused (RETRY: its reads in flight are all taken) is
/// tried again, 20 ms apart, before the replica is left to be filtered on demand.
const BUSY_READ_RETRIES_MAX: u32 = 250;

/// The cuts of one replica: one part per partition, taken out as they are fetched.
type Parts = Vec<Option<(Bytes, ReplicaCertificate)>>;

#[derive(Debug)]
enum Cut {
    /// Not read yet.
    Waiting,
    /// Read and cut.
    Ready(Parts),
    /// Could not be read or failed verification: requests filter it on demand (and get the
    /// error from there).
    Failed,
}

#[derive(Debug)]
struct Progress {
    cuts: BTreeMap<SegmentId, Cut>,
    /// Bytes of cuts held, not fetched yet.
    bytes_held: usize,
    /// When a part was last fetched (or the partitioning started).
    last_fetch: tokio::time::Instant,
    /// Reading is paused: the cuts held fill `bytes_max`. A request for a
    /// replica not cut yet then filters it on demand instead of waiting: the parts that would
    /// make room may be those of a recovery master that itself waits (all its reads in flight)
    /// on another backup paused the same way.
    full: bool,
}

/// The partitioning of one crashed master's replicas for one recovery attempt.
#[derive(Debug)]
pub(crate) struct Partitioning {
    master_id: ServerId,
    /// Most bytes of cuts held at once.
    bytes_max: usize,
    partitions: Arc<Vec<Vec<RecoveryTablet>>>,
    /// Which partitioning this is, to tell it from a later one of the same master.
    generation: u64,
    progress: Mutex<Progress>,
    /// Woken when a cut is ready or fetched, or the partitioning ends.
    changed: Notify,
    /// Replaced, given up, or finished: requests filter on demand.
    ended: AtomicBool,
}

impl Partitioning {
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Ends it: cuts not fetched are dropped, and waiting requests filter on demand.
    fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
        let mut progress = self.progress();
        progress.cuts.clear();
        progress.bytes_held = 0;
        drop(progress);
        self.changed.notify_waiters();
    }

    /// The part `part` of segment `segment_id`, once it is cut; `None` if it never will be
    /// here (not a replica this backup cuts, failed, fetched before, or the partitioning
    /// ended): the caller filters the replica on demand.
    pub(crate) async fn fetch(
        &self,
        segment_id: SegmentId,
        part: usize,
    ) -> Option<(Bytes, ReplicaCertificate)> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a change between the check and the wait wakes it.
            changed.as_mut().enable();
            if self.ended.load(Ordering::SeqCst) {
                return None;
            }
            {
                let mut progress = self.progress();
                let full = progress.full;
                match progress.cuts.get_mut(&segment_id)? {
                    Cut::Failed => return None,
                    Cut::Waiting if full => return None,
                    Cut::Waiting => {}
                    Cut::Ready(parts) => {
                        let taken = parts.get_mut(part)?.take();
                        if let Some((data, _)) = &taken {
                            progress.bytes_held -= data.len();
                            progress.last_fetch = tokio::time::Instant::now();
                            drop(progress);
                            // Room for the next cut.
                            self.changed.notify_waiters();
                        }
                        return taken;
                    }
                }
            }
            changed.await;
        }
    }

    fn all_fetched(&self) -> bool {
        self.progress().cuts.values().all(|cut| match cut {
            Cut::Waiting => false,
            Cut::Failed => true,
            Cut::Ready(parts) => parts.iter().all(Option::is_none),
        })
    }

    /// Waits until `ready` holds, the partitioning ended (false), or nothing was fetched for
    /// `PARTITIONING_IDLE_TIMEOUT` (false).
    async fn wait_for(&self, ready: impl Fn(&Partitioning) -> bool) -> bool {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.ended.load(Ordering::SeqCst) {
                return false;
            }
            if ready(self) {
                return true;
            }
            let idle_until = self.progress().last_fetch + PARTITIONING_IDLE_TIMEOUT;
            if tokio::time::timeout_at(idle_until, changed).await.is_err()
                && tokio::time::Instant::now()
                    >= self.progress().last_fetch + PARTITIONING_IDLE_TIMEOUT
            {
                tracing::warn!(master_id = %self.master_id, "recovery partitioning idle: given up");
                return false;
            }
        }
    }
}

/// Counters of the partitioning, for metrics and tests.
#[derive(Debug, Default)]
pub struct PartitioningCounters {
    /// Replicas read and cut into partitions.
    pub replicas_partitioned: AtomicU64,
    /// BACKUP_GET_RECOVERY_DATA answered with a part cut ahead.
    pub parts_fetched: AtomicU64,
    /// BACKUP_GET_RECOVERY_DATA filtered on demand from the replica.
    pub filtered_on_demand: AtomicU64,
}

/// The partitionings a backup runs: at most one per crashed master, `PARTITIONINGS_MAX` in all.
#[derive(Debug, Default)]
pub(crate) struct Partitionings {
    running: Mutex<BTreeMap<ServerId, Arc<Partitioning>>>,
    next_generation: AtomicU64,
    pub(crate) counters: PartitioningCounters,
}

impl Partitionings {
    fn running(&self) -> MutexGuard<'_, BTreeMap<ServerId, Arc<Partitioning>>> {
        self.running.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The partitioning that cut (or will cut) `segment_id` of `master_id` for exactly
    /// `tablets`, and that part's index.
    pub(crate) fn find(
        &self,
        master_id: ServerId,
        segment_id: SegmentId,
        tablets: &[RecoveryTablet],
    ) -> Option<(Arc<Partitioning>, usize)> {
        let partitioning = self.running().get(&master_id)?.clone();
        let part = partitioning.partitions.iter().position(|partition| partition == tablets)?;
        let cut_here = partitioning.progress().cuts.contains_key(&segment_id);
        cut_here.then_some((partitioning, part))
    }

    /// Stops partitioning for `master_id`, if it runs.
    fn remove(&self, partitioning: &Arc<Partitioning>) {
        let mut running = self.running();
        if running.get(&partitioning.master_id).is_some_and(|held| Arc::ptr_eq(held, partitioning))
        {
            running.remove(&partitioning.master_id);
        }
    }
}

/// Starts partitioning `segments` of `master_id` (those this backup holds the primary replica
/// of) into `partitions`, replacing an earlier partitioning of that master; returns how many
/// replicas it will cut. The work runs on a task of the current runtime.
pub(crate) fn start(
    shared: &Arc<Shared>,
    master_id: ServerId,
    segments: &[SegmentId],
    partitions: Vec<Vec<RecoveryTablet>>,
) -> u32 {
    let to_cut = shared.primary_replicas(master_id, segments);
    let cuts = to_cut.iter().map(|&segment_id| (segment_id, Cut::Waiting)).collect();
    let partitionings = &shared.partitionings;
    let partitioning = Arc::new(Partitioning {
        master_id,
        bytes_max: shared.config().recovery_partitioned_bytes_max,
        partitions: Arc::new(partitions),
        generation: partitionings.next_generation.fetch_add(1, Ordering::Relaxed),
        progress: Mutex::new(Progress {
            cuts,
            bytes_held: 0,
            last_fetch: tokio::time::Instant::now(),
            full: false,
        }),
        changed: Notify::new(),
        ended: AtomicBool::new(false),
    });
    let mut ended = Vec::new();
    {
        let mut running = partitionings.running();
        ended.extend(running.insert(master_id, partitioning.clone()));
        while running.len() > PARTITIONINGS_MAX {
            let oldest = running
                .iter()
                .min_by_key(|(_, partitioning)| partitioning.generation)
                .map(|(&master, _)| master)
                .expect("more than PARTITIONINGS_MAX entries");
            ended.extend(running.remove(&oldest));
        }
    }
    for old in ended {
        old.end();
    }
    tracing::info!(%master_id, replicas = to_cut.len(), partitions = partitioning.partitions.len(), "partitioning a crashed master's replicas for recovery");
    let count = to_cut.len() as u32;
    tokio::spawn(cut_replicas(Arc::downgrade(shared), partitioning, to_cut));
    count
}

/// Ends the partitioning when its task ends, however it ends.
struct EndOnDrop {
    shared: Weak<Shared>,
    partitioning: Arc<Partitioning>,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.partitioning.end();
        if let Some(shared) = self.shared.upgrade() {
            shared.partitionings.remove(&self.partitioning);
        }
    }
}

/// The task of one partitioning: read and cut each replica in turn, holding at most
/// `bytes_max` of cuts (and one replica's more), then keep them until fetched or idle.
async fn cut_replicas(
    shared: Weak<Shared>,
    partitioning: Arc<Partitioning>,
    segments: Vec<SegmentId>,
) {
    let guard = EndOnDrop { shared: shared.clone(), partitioning };
    let partitioning = &guard.partitioning;
    let master_id = partitioning.master_id;
    // The next replica is read while this one is cut: the disk (or the page cache) and the
    // processor both stay busy.
    let mut read_ahead =
        segments.first().and_then(|&first| Some(shared.upgrade()?.begin_read(master_id, first)));
    for (index, &segment_id) in segments.iter().enumerate() {
        let room = |partitioning: &Partitioning| {
            partitioning.progress().bytes_held < partitioning.bytes_max
        };
        if !room(partitioning) {
            partitioning.progress().full = true;
            partitioning.changed.notify_waiters();
            if !partitioning.wait_for(room).await {
                return;
            }
            partitioning.progress().full = false;
        }
        let Some(contents) = read(&shared, master_id, segment_id, read_ahead.take()).await else {
            return;
        };
        if let Some(&next) = segments.get(index + 1) {
            read_ahead = Some(match shared.upgrade() {
                Some(shared) => shared.begin_read(master_id, next),
                None => return,
            });
        }
        let cut = match contents {
            Ok(contents) => {
                let partitions = Arc::clone(&partitioning.partitions);
                let cut =
                    stratus_env::run_blocking(move || partition_replica(&contents, &partitions))
                        .await;
                match cut {
                    Ok(Ok(parts)) => Some(parts),
                    Ok(Err(reason)) | Err(reason) => {
                        tracing::warn!(master_id = %partitioning.master_id, %segment_id, %reason, "a replica could not be partitioned; it is filtered on demand");
                        None
                    }
                }
            }
            Err(()) => None,
        };
        if partitioning.ended.load(Ordering::SeqCst) {
            return;
        }
        {
            let mut progress = partitioning.progress();
            let entry = match cut {
                Some(parts) => {
                    progress.bytes_held += parts.iter().map(|(data, _)| data.len()).sum::<usize>();
                    Cut::Ready(parts.into_iter().map(Some).collect())
                }
                None => Cut::Failed,
            };
            progress.cuts.insert(segment_id, entry);
        }
        if let Some(shared) = shared.upgrade() {
            shared.partitionings.counters.replicas_partitioned.fetch_add(1, Ordering::Relaxed);
        }
        partitioning.changed.notify_waiters();
    }
    // Keep the cuts until every part was fetched (then they are gone already) or none was
    // fetched for a while.
    partitioning.wait_for(Partitioning::all_fetched).await;
}

/// Reads a replica (`started`: the read begun already), trying again while the disk queue is
/// busy. `None`: the backup is gone; `Some(Err)`: the replica could not be read (requests
/// filter it on demand).
async fn read(
    shared: &Weak<Shared>,
    master_id: ServerId,
    segment_id: SegmentId,
    mut started: Option<Pending<ReplicaContents>>,
) -> Option<Result<ReplicaContents, ()>> {
    for _ in 0..BUSY_READ_RETRIES_MAX {
        let pending = match started.take() {
            Some(pending) => pending,
            None => shared.upgrade()?.begin_read(master_id, segment_id),
        };
        match pending.wait().await {
            Ok(contents) => return Some(Ok(contents)),
            Err(error) if error.status == Status::Retry => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => {
                tracing::warn!(%master_id, %segment_id, %error, "a replica to partition could not be read");
                return Some(Err(()));
            }
        }
    }
    Some(Err(()))
}

/// Cuts a replica into one verified, filtered segment per partition in one pass: each gets
/// the segment header, the safe-version entries, and the objects, tombstones, completion
/// records and transactions' prepared entries whose (table, key hash) lies in one of its
/// tablets. BACKUP_GET_RECOVERY_DATA filtered on demand
/// is this with one partition, so both give the same bytes.
pub(crate) fn partition_replica(
    contents: &ReplicaContents,
    partitions: &[Vec<RecoveryTablet>],
) -> Result<Vec<(Bytes, ReplicaCertificate)>, String> {
    let certificate = stratus_log::Certificate {
        segment_length: contents.certificate.segment_length,
        checksum: contents.certificate.checksum,
    };
    let place = |entry: &Entry<'_>, parts: &mut [bool]| {
        let (table, hash) = match entry {
            Entry::Object(object) => (object.table, key_hash(object.table, object.key)),
            Entry::Tombstone(tombstone) => {
                (tombstone.table, key_hash(tombstone.table, tombstone.key))
            }
            // A mutation's result goes where its object goes: the recovery master that serves
            // the key answers the mutation's retries.
            Entry::Completion(completion) => {
                (completion.table, stratus_types::KeyHash(completion.key_hash))
            }
            // A transaction's prepared operation, and the mark that it was decided, go where
            // the object goes: its recovery master locks it again, or sees it decided.
            Entry::Prepared(prepared) => {
                (prepared.table, stratus_types::KeyHash(prepared.key_hash))
            }
            Entry::PreparedTombstone(decided) => {
                (decided.table, stratus_types::KeyHash(decided.key_hash))
            }
            // A transaction's list goes to every partition: any recovery master that gets
            // one of its undecided operations needs it to finish the transaction.
            Entry::SafeVersion(_) | Entry::TxParticipants(_) => {
                parts.fill(true);
                return;
            }
            _ => return,
        };
        for (keep, tablets) in parts.iter_mut().zip(partitions) {
            *keep = tablets
                .iter()
                .any(|tablet| tablet.table_id == table && tablet.range.contains(hash));
        }
    };
    let parts =
        stratus_log::partition_segment(&contents.data, &certificate, partitions.len(), &place)
            .map_err(|error| format!("the replica failed verification: {error}"))?;
    Ok(parts
        .into_iter()
        .map(|(data, certificate)| {
            let certificate = ReplicaCertificate {
                segment_length: certificate.segment_length,
                checksum: certificate.checksum,
            };
            (Bytes::from(data), certificate)
        })
        .collect())
}
