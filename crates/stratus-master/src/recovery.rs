//! The recovery master's side of crash recovery (docs/design/recovery.md): given a partition of
//! a crashed master's tablets and the segments of its log, read one good replica of every
//! segment from the backups, replay the partition's objects into this master's store, and make
//! them durable on this master's own backups. The coordinator then hands the tablets over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stratus_env::WallClock;
use stratus_log::{verify_replica, AppendPriority, Certificate, SideLog};
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_store::{ObjectStore, ReplayCollector, ReplayError, ReplayInto};
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{RecoveryTablet, Request, Response, ResponseBody, Status};
use tokio::sync::Semaphore;

use crate::metrics::{MasterMetrics, RecoveryCounters};
use crate::replication::ReplicaManager;

/// Replica reads in flight at once on one recovery master: enough to keep several backups'
/// disks and the network busy, few enough that the bytes in flight stay bounded (each read
/// carries one segment, at most 8 MiB).
pub const RECOVERY_READS_IN_FLIGHT_MAX: usize = 8;

/// Times a recovery master asks a busy backup (RETRY) again for the same replica, with
/// backoff up to 250 ms, before it tries the next replica: about 8 s in all.
const BUSY_BACKUP_RETRIES_MAX: u32 = 40;

/// How long one replica read may take before the next replica of the segment is tried (a whole
/// segment read from a backup's disk).
const REPLICA_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A failed recovery: the status and message the coordinator receives.
pub type RecoveryFailure = (Status, String);

/// Where a recovery master reads replicas from.
#[derive(Debug, Clone)]
pub struct RecoveryReader {
    pool: Arc<ChannelPool>,
}

impl RecoveryReader {
    /// Its connections (also used to send a transferred tablet to its target).
    pub(crate) fn pool(&self) -> Arc<ChannelPool> {
        self.pool.clone()
    }

    /// A reader whose connections go through `network`.
    pub fn new(network: Arc<dyn stratus_env::Network>) -> RecoveryReader {
        let config = RpcConfig { request_timeout: REPLICA_READ_TIMEOUT, ..RpcConfig::default() };
        RecoveryReader { pool: Arc::new(ChannelPool::new(network, config)) }
    }
}

/// One replica a backup listed: where it is and how good it is.
#[derive(Debug, Clone)]
struct ReplicaLocation {
    backup: String,
    epoch: u64,
    length: u32,
    /// The master marked it primary: the backup cuts it for every partition ahead of the
    /// requests (BACKUP_START_PARTITIONING).
    primary: bool,
}

/// What recovering a partition needs besides the request.
pub(crate) struct RecoveryContext {
    pub(crate) store: Arc<ObjectStore>,
    pub(crate) replication: Option<ReplicaManager>,
    pub(crate) reader: RecoveryReader,
    pub(crate) wall_clock: Arc<dyn WallClock>,
    /// Where the progress is counted (segments as they arrive, objects once replayed).
    pub(crate) metrics: Arc<MasterMetrics>,
}

/// Recovers one partition; answers RECOVER_TABLETS.
pub(crate) async fn recover_partition(
    context: RecoveryContext,
    crashed_master: ServerId,
    tablets: Vec<RecoveryTablet>,
    segments: Vec<SegmentId>,
    backups: Vec<String>,
) -> Result<Response, RecoveryFailure> {
    // Replayed objects must become durable here before the partition is handed over; with
    // fewer backups than replicas they never can, and a replay would only fill the log with
    // objects dropped again. Let the coordinator try another master, or later.
    if let Some(replication) = &context.replication {
        if replication.backups_available() < replication.replicas() {
            return Err((
                Status::Retry,
                format!(
                    "only {} backups besides this master for {} replicas",
                    replication.backups_available(),
                    replication.replicas()
                ),
            ));
        }
    }
    tracing::info!(%crashed_master, tablets = tablets.len(), segments = segments.len(), "recovering a partition");
    // Phase times for the log line at the end (the runtime's clock: virtual in the simulation).
    let started = tokio::time::Instant::now();
    let locations = locate_replicas(&context.reader, crashed_master, &backups).await?;
    let mut plan = Vec::with_capacity(segments.len());
    for &segment_id in &segments {
        let mut replicas = locations.get(&segment_id).cloned().unwrap_or_default();
        if replicas.is_empty() {
            return Err((
                Status::Retry,
                format!("no live backup holds a replica of segment {segment_id}"),
            ));
        }
        // Only replicas of the newest epoch: an older one is a copy the master abandoned when
        // it re-replicated the segment, and may miss writes acknowledged since. Longest first;
        // of equally long ones the primary, which its backup has cut for this partition ahead.
        let newest = replicas.iter().map(|replica| replica.epoch).max().unwrap_or(0);
        replicas.retain(|replica| replica.epoch == newest);
        replicas.sort_by_key(|replica| (std::cmp::Reverse(replica.length), !replica.primary));
        plan.push((segment_id, replicas));
    }

    let permits = Arc::new(Semaphore::new(RECOVERY_READS_IN_FLIGHT_MAX));
    let mut reads = tokio::task::JoinSet::new();
    let partition = Arc::new(tablets.clone());
    for (segment_id, replicas) in plan {
        let reader = context.reader.clone();
        let permits = permits.clone();
        let partition = partition.clone();
        reads.spawn(async move {
            let _permit = permits.acquire_owned().await.expect("semaphore never closed");
            read_good_replica(&reader, crashed_master, segment_id, &replicas, &partition)
                .await
                .map(|(bytes, certificate)| (segment_id, bytes, certificate))
        });
    }
    let mut read: Vec<(SegmentId, Bytes, Certificate)> = Vec::with_capacity(segments.len());
    let mut replica_bytes_read = 0u64;
    while let Some(joined) = reads.join_next().await {
        let (segment_id, bytes, certificate) = joined
            .map_err(|error| (Status::InternalError, format!("replica read task: {error}")))??;
        replica_bytes_read += bytes.len() as u64;
        let counters = &context.metrics.recovery;
        RecoveryCounters::add(&counters.segments_read, 1);
        RecoveryCounters::add(&counters.replica_bytes_read, bytes.len() as u64);
        read.push((segment_id, bytes, certificate));
    }

    // Whatever this master holds of the partition is from an earlier time it served the range
    // (it serves none of it now, and no other recovery of it runs here): drop it, so that the
    // replay alone decides. Then start the partition in a new head: a later recovery of this
    // master ignores the partition's entries in older segments (the coordinator records this
    // creation segment with the recovered tablets).
    for tablet in &tablets {
        context.store.drop_range(tablet.table_id, tablet.range);
    }
    let creation_segment = match context.store.log().roll_head(stratus_log::AppendPriority::Normal)
    {
        Ok(segment_id) => segment_id,
        Err(_) => return Err((Status::NoTableSpace, "the log is full".to_string())),
    };

    // Replay into a side log (RAMCloud's design): the replayed objects do not interleave with
    // this master's own writes in its head, each side segment is replicated as soon as it is
    // full while replay goes on, and the whole side log joins the log at once when it is
    // durable, or is dropped whole if the recovery fails.
    let (closed_sender, mut closed_receiver) = tokio::sync::mpsc::unbounded_channel();
    let replicator = context.replication.clone().map(|replication| {
        tokio::spawn(async move {
            while let Some(segment_id) = closed_receiver.recv().await {
                replication.replicate_side_segment(segment_id).await?;
            }
            Ok::<_, crate::replication::SyncError>(())
        })
    });
    let store = context.store.clone();
    let now = stratus_store::WallTime::from_millis(context.wall_clock.now_millis());
    let partition = tablets.clone();
    let read_done = tokio::time::Instant::now();
    let replayed = stratus_env::run_blocking(move || {
        let segments: Vec<(&[u8], Certificate)> =
            read.iter().map(|(_, bytes, certificate)| (&bytes[..], *certificate)).collect();
        // An object of a tablet in a segment older than the tablet's creation in the crashed
        // log is left from an earlier time that master served the range: its removal may be
        // in another master's log, so replaying it could bring a removed object back.
        let accept = |index: usize, table, hash| {
            let segment_id = read[index].0;
            partition.iter().any(|tablet| {
                tablet.table_id == table
                    && tablet.range.contains(hash)
                    && segment_id >= tablet.creation_segment
            })
        };
        let mut side_log = SideLog::new(AppendPriority::Normal);
        // Unbounded, yet bounded by the log: one id per side segment, each in this master's
        // memory.
        let mut closed = |segment_id| {
            let _ = closed_sender.send(segment_id);
        };
        let into = ReplayInto::SideLog { side_log: &mut side_log, closed: &mut closed };
        // Every segment passed `verify_replica` when it was read (to try another backup's
        // replica on failure): the replay does not compute objects' checksums again.
        let mut collector = ReplayCollector::new(&accept);
        let outcome = segments
            .iter()
            .enumerate()
            .try_for_each(|(index, (bytes, certificate))| {
                collector.add_verified(index, bytes, certificate)
            })
            .and_then(|()| store.replay_collected(collector, now, into));
        if outcome.is_ok() {
            if let Some(&last) = side_log.segments().last() {
                closed(last);
            }
        }
        (outcome, side_log)
    })
    .await;
    // On failure, leave nothing behind that no tablet owns: the partition may go elsewhere.
    // (The master refuses to recover into a range it serves, and runs no two recoveries of
    // overlapping ranges at once, so this drops only what this recovery replayed.)
    let abandon = |side_log: Option<&SideLog>, status: Status, message: String| {
        for tablet in &tablets {
            context.store.drop_range(tablet.table_id, tablet.range);
        }
        if let Some(side_log) = side_log {
            context.store.log().abandon_side_segments(side_log.segments());
        }
        Err((status, message))
    };
    let (statistics, side_log) = match replayed {
        // The replay panicked: the side log is lost with it, and the server's invariants with
        // it; the drop still frees what the index holds.
        Err(error) => return abandon(None, Status::InternalError, format!("replay task: {error}")),
        Ok((Ok(statistics), side_log)) => (statistics, side_log),
        Ok((Err(error), side_log)) => {
            if let Some(replicator) = replicator {
                replicator.abort();
            }
            let status = match error {
                ReplayError::StoreFull | ReplayError::ObjectTooLarge { .. } => Status::NoTableSpace,
                ReplayError::CorruptSegment { .. } => Status::Retry,
            };
            return abandon(Some(&side_log), status, format!("replay: {error}"));
        }
    };
    let replay_done = tokio::time::Instant::now();
    let counters = &context.metrics.recovery;
    RecoveryCounters::add(&counters.segments_replayed, statistics.segments);
    RecoveryCounters::add(&counters.objects_replayed, statistics.objects_replayed);
    // The side log must be durable before it joins the log: once fused, the log's digest on
    // the backups names its segments.
    if let Some(replicator) = replicator {
        let replicated = match replicator.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(error.message),
            Err(error) => Err(format!("side log replication task: {error}")),
        };
        if let Err(message) = replicated {
            return abandon(
                Some(&side_log),
                Status::Retry,
                format!("replicating the replayed objects: {message}"),
            );
        }
    }
    if !side_log.segments().is_empty() {
        if let Err(error) =
            context.store.log().fuse_side_segments(side_log.segments(), AppendPriority::Normal)
        {
            return abandon(
                Some(&side_log),
                Status::NoTableSpace,
                format!("no room for the head that fuses the replayed objects: {error:?}"),
            );
        }
    }
    // The fusing head (its digest, and the safe version raised past every replayed version)
    // must be durable before the tablets are handed over, or a crash of this master would
    // lose the replayed objects.
    if let Some(replication) = &context.replication {
        if let Err(error) = replication.sync(replication.position_to_sync()).await {
            // The side segments are in the log now: drop the objects; the cleaner reclaims
            // their segments like any other dead data.
            for tablet in &tablets {
                context.store.drop_range(tablet.table_id, tablet.range);
            }
            return Err((
                Status::Retry,
                format!("replicating the head that fuses the replayed objects: {}", error.message),
            ));
        }
    }
    tracing::info!(
        %crashed_master,
        segments = statistics.segments,
        objects = statistics.objects_replayed,
        replica_bytes_read,
        read_ms = (read_done - started).as_millis() as u64,
        replay_ms = (replay_done - read_done).as_millis() as u64,
        durable_ms = replay_done.elapsed().as_millis() as u64,
        "partition replayed and durable"
    );
    Ok(Response::RecoverTablets {
        segments_replayed: statistics.segments,
        replica_bytes_read,
        objects_replayed: statistics.objects_replayed,
        creation_segment,
    })
}

/// Asks every backup which replicas of `crashed_master` it holds. Every backup must answer: one
/// that does not may hold the only replica of the newest epoch, and reading an older one could
/// lose acknowledged writes. Then this recovery fails with RETRY and the coordinator tries
/// again (with the backups then up).
async fn locate_replicas(
    reader: &RecoveryReader,
    crashed_master: ServerId,
    backups: &[String],
) -> Result<BTreeMap<SegmentId, Vec<ReplicaLocation>>, RecoveryFailure> {
    let mut listings = tokio::task::JoinSet::new();
    for backup in backups {
        let pool = reader.pool.clone();
        let backup = backup.clone();
        listings.spawn(async move {
            let request = Request::BackupListReplicas { master_id: crashed_master };
            let outcome = pool.call(&backup, &request).await;
            if outcome.is_err() {
                pool.forget(&backup);
            }
            (backup, outcome)
        });
    }
    let mut locations: BTreeMap<SegmentId, Vec<ReplicaLocation>> = BTreeMap::new();
    while let Some(joined) = listings.join_next().await {
        let (backup, outcome) = joined.map_err(|error| {
            (Status::InternalError, format!("replica listing task failed: {error}"))
        })?;
        match outcome {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::BackupListReplicas { replicas }),
            )) => {
                for replica in replicas.into_iter().filter(|r| r.master_id == crashed_master) {
                    locations.entry(replica.segment_id).or_default().push(ReplicaLocation {
                        backup: backup.clone(),
                        epoch: replica.epoch,
                        length: replica.certificate.segment_length,
                        primary: replica.primary,
                    });
                }
            }
            other => {
                return Err((
                    Status::Retry,
                    format!("backup {backup} did not list its replicas: {other:?}"),
                ))
            }
        }
    }
    Ok(locations)
}

/// Reads this partition's part of one segment from its replicas, in order, until one verifies.
/// The backup sends only the partition's entries (BACKUP_GET_RECOVERY_DATA): each recovery
/// master receives and holds its share of the crashed log, not all of it.
async fn read_good_replica(
    reader: &RecoveryReader,
    crashed_master: ServerId,
    segment_id: SegmentId,
    replicas: &[ReplicaLocation],
    partition: &[RecoveryTablet],
) -> Result<(Bytes, Certificate), RecoveryFailure> {
    let mut problems = Vec::new();
    for replica in replicas {
        let request = Request::BackupGetRecoveryData {
            master_id: crashed_master,
            segment_id,
            tablets: partition.to_vec(),
        };
        // A busy backup (its disk reads all in flight) answers RETRY: ask it again, with
        // backoff, rather than move on at once.
        let mut backoff = std::time::Duration::from_millis(10);
        let mut outcome = reader.pool.call(&replica.backup, &request).await;
        for _ in 0..BUSY_BACKUP_RETRIES_MAX {
            if !matches!(outcome, Ok((Status::Retry, _))) {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(std::time::Duration::from_millis(250));
            outcome = reader.pool.call(&replica.backup, &request).await;
        }
        match outcome {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::BackupGetRecoveryData { certificate, data }),
            )) => {
                let certificate = Certificate {
                    segment_length: certificate.segment_length,
                    checksum: certificate.checksum,
                };
                match verify_replica(&data, &certificate, crashed_master, segment_id) {
                    Ok(_) => return Ok((data, certificate)),
                    Err(reason) => {
                        tracing::warn!(backup = %replica.backup, %segment_id, %reason, "replica failed verification");
                        problems.push(format!("{}: {reason}", replica.backup));
                    }
                }
            }
            Ok((status, _)) => problems.push(format!("{}: {status}", replica.backup)),
            Err(error) => {
                reader.pool.forget(&replica.backup);
                problems.push(format!("{}: {error}", replica.backup));
            }
        }
    }
    Err((
        Status::Retry,
        format!("no good replica of segment {segment_id}: {}", problems.join("; ")),
    ))
}
