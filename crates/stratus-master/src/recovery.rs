//! The recovery master's side of crash recovery (docs/design/recovery.md): given a partition of
//! a crashed master's tablets and the segments of its log, read one good replica of every
//! segment from the backups, replay the partition's objects into this master's store, and make
//! them durable on this master's own backups. The coordinator then hands the tablets over.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use stratus_env::WallClock;
use stratus_log::{verify_replica, AppendPriority, Certificate, SideLog};
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_store::{
    CleanOutcome, CleanStep, ObjectStore, ReplayCollector, ReplayError, ReplayInto, ReplayRoom,
    RoomShortage, WallTime,
};
use stratus_types::limits::SEGMENT_BYTES_MAX;
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{RecoverySegment, RecoveryTablet, Request, Response, ResponseBody, Status};
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

/// How long one replica read may take before the next replica of the segment is tried, besides
/// the transfer allowance below: a backup that accepted the read (a busy one answers RETRY at
/// once) and has not answered in this long is paused or gone, and recovery does not wait on
/// it longer. (It was 30 s per read. 2 s was tried: with one replica per segment, a read slowed
/// by load, debug builds and two benchmarks on two cores, failed a CI run's recovery attempt.)
const REPLICA_READ_TIMEOUT_BASE: Duration = Duration::from_secs(10);

/// The slowest rate a healthy backup reads and sends a replica at: an 8 MiB segment adds
/// 0.5 s to [`REPLICA_READ_TIMEOUT_BASE`].
const REPLICA_READ_BYTES_PER_SECOND_MIN: u64 = 16 << 20;

/// The pool's cap on one call: a read of the largest segment.
const REPLICA_READ_TIMEOUT_MAX: Duration = Duration::from_millis(
    REPLICA_READ_TIMEOUT_BASE.as_millis() as u64
        + (SEGMENT_BYTES_MAX as u64 * 1_000).div_ceil(REPLICA_READ_BYTES_PER_SECOND_MIN),
);

/// How long reading a replica of `length` bytes may take.
fn replica_read_timeout(length: u32) -> Duration {
    let transfer_millis = (u64::from(length) * 1_000).div_ceil(REPLICA_READ_BYTES_PER_SECOND_MIN);
    REPLICA_READ_TIMEOUT_BASE + Duration::from_millis(transfer_millis)
}

/// Combined cleaning passes a recovery master runs at most to make room for a replay before
/// it refuses the partition (each pass moves at most ten segments' worth of live data).
const ROOM_CLEANING_PASSES_MAX: u32 = 32;

/// How long a recovery waits for another combined pass (the cleaner's) to finish before it
/// tries its own again.
const ROOM_CLEANING_WAIT: Duration = Duration::from_millis(5);

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
        let config =
            RpcConfig { request_timeout: REPLICA_READ_TIMEOUT_MAX, ..RpcConfig::default() };
        RecoveryReader { pool: Arc::new(ChannelPool::new(network, config)) }
    }
}

/// One replica the coordinator located: where it is and how good it is.
#[derive(Debug, Clone)]
struct ReplicaLocation {
    backup: String,
    epoch: u64,
    length: u32,
    /// The master marked it primary: the backup cuts it for every partition ahead of the
    /// requests (BACKUP_START_PARTITIONING).
    primary: bool,
}

/// The order in which to read `segments`' replicas: for each segment, the replicas of its
/// newest epoch only (an older one is a copy the master abandoned when it re-replicated the
/// segment, and may miss writes acknowledged since), longest first, of equally long ones the
/// primary, which its backup has cut for this partition ahead. The coordinator sends them so;
/// the recovery master does not rely on it. A segment with no replica fails the partition with
/// RETRY (the coordinator's next attempt locates the replicas again).
fn read_plan(
    segments: &[RecoverySegment],
    backups: &[String],
) -> Result<Vec<(SegmentId, Vec<ReplicaLocation>)>, RecoveryFailure> {
    let mut plan = Vec::with_capacity(segments.len());
    for segment in segments {
        let mut replicas: Vec<ReplicaLocation> = segment
            .replicas
            .iter()
            .filter_map(|replica| {
                // The decoder refused indices past the end; a request built in this process
                // (tests) is held to the same rule.
                let backup = backups.get(usize::from(replica.backup))?;
                Some(ReplicaLocation {
                    backup: backup.clone(),
                    epoch: replica.epoch,
                    length: replica.length,
                    primary: replica.primary,
                })
            })
            .collect();
        let Some(newest) = replicas.iter().map(|replica| replica.epoch).max() else {
            return Err((
                Status::Retry,
                format!("no replica of segment {} was located", segment.segment_id),
            ));
        };
        replicas.retain(|replica| replica.epoch == newest);
        replicas.sort_by_key(|replica| (std::cmp::Reverse(replica.length), !replica.primary));
        plan.push((segment.segment_id, replicas));
    }
    Ok(plan)
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
    segments: Vec<RecoverySegment>,
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
    let plan = read_plan(&segments, &backups)?;

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
    // Room for the two heads a recovery opens (the creation head now, the fusing head at the
    // end) first; the replay checks its own room once it knows what it appends.
    if let Some(shortage) = make_room(&context, &ReplayRoom::default(), 2).await {
        return Err((Status::NoTableSpace, shortage.to_string()));
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
    let read = Arc::new(read);
    let read_done = tokio::time::Instant::now();
    // The replay checks its room once it knows what it appends, before it appends anything;
    // short of room, this master cleans its log and the replay runs again (collecting the
    // segments twice, on this rare path only), or the partition is refused with what is short.
    let mut room_made = false;
    let replayed = loop {
        let replay =
            replay_partition(&context, read.clone(), tablets.clone(), closed_sender.clone());
        match replay.await {
            Ok((Err(ReplayError::NoRoom(shortage)), _)) if !room_made => {
                tracing::info!(%shortage, "cleaning this master's log to make room for a recovery");
                room_made = true;
                let room = shortage.room;
                if let Some(still) = make_room(&context, &room, 1).await {
                    break Ok((
                        Err(ReplayError::NoRoom(still)),
                        SideLog::new(AppendPriority::Normal),
                    ));
                }
            }
            replayed => break replayed,
        }
    };
    drop(closed_sender);
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
                ReplayError::StoreFull
                | ReplayError::NoRoom(_)
                | ReplayError::ObjectTooLarge { .. } => Status::NoTableSpace,
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

/// One replay of the partition's objects from `read` into a side log of this master's store,
/// on a blocking thread: collects the segments, checks that the store has room for what they
/// hold (`ReplayError::NoRoom` otherwise, with nothing appended), then appends. Each side
/// segment that fills is sent to `closed` for replication while the replay goes on.
async fn replay_partition(
    context: &RecoveryContext,
    read: Arc<Vec<(SegmentId, Bytes, Certificate)>>,
    partition: Vec<RecoveryTablet>,
    closed: tokio::sync::mpsc::UnboundedSender<SegmentId>,
) -> Result<(Result<stratus_store::ReplayStatistics, ReplayError>, SideLog), String> {
    let store = context.store.clone();
    let now = WallTime::from_millis(context.wall_clock.now_millis());
    stratus_env::run_blocking(move || {
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
            let _ = closed.send(segment_id);
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
            .and_then(|()| {
                // One head after the replay: the one that fuses the side log (or, with no
                // side segment, the one the replay rolls to record the safe version).
                match store.replay_room_shortage(&collector.room_needed(), 1) {
                    Some(shortage) => Err(ReplayError::NoRoom(shortage)),
                    None => store.replay_collected(collector, now, into),
                }
            });
        if outcome.is_ok() {
            if let Some(&last) = side_log.segments().last() {
                closed(last);
            }
        }
        (outcome, side_log)
    })
    .await
}

/// Cleans this master's log with combined passes until a replay of `room` followed by `heads`
/// new heads fits (`None`), or no pass can help any more: then what is still short. The
/// passes' survivors are replicated by a task of their own, so a recovery dropped halfway
/// never leaves a pass pending (which would stop combined cleaning on this master for good).
async fn make_room(
    context: &RecoveryContext,
    room: &ReplayRoom,
    heads: u64,
) -> Option<RoomShortage> {
    for _ in 0..ROOM_CLEANING_PASSES_MAX {
        let shortage = context.store.replay_room_shortage(room, heads)?;
        let now = WallTime::from_millis(context.wall_clock.now_millis());
        let step = match context.store.clean_combined_step(now, !shortage.memory_short()) {
            Some(step) => step,
            None => {
                // Another pass (the cleaner's) is under way: it may free what is needed.
                tokio::time::sleep(ROOM_CLEANING_WAIT).await;
                continue;
            }
        };
        let outcome = match step {
            CleanStep::Finished(outcome) => outcome,
            CleanStep::Replicate(pass) => {
                let store = context.store.clone();
                let replication = context.replication.clone();
                let finished = tokio::spawn(async move {
                    if let Some(replication) = &replication {
                        for &segment_id in pass.survivor_segments() {
                            let (bytes, certificate) =
                                store.log().segment_contents(segment_id).expect("survivor");
                            // Fenced, or the pump gone: this server is stopping; its pass
                            // stays pending (nothing of it was fused).
                            let replicated =
                                replication.replicate_survivor(segment_id, bytes, certificate);
                            replicated.await.ok()?;
                        }
                    }
                    Some(store.finish_combined_pass(pass))
                });
                match finished.await {
                    Ok(Some(outcome)) => outcome,
                    _ => break,
                }
            }
        };
        if matches!(outcome, CleanOutcome::NothingToClean | CleanOutcome::Idle) {
            break;
        }
    }
    context.store.replay_room_shortage(room, heads)
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
        let timeout = replica_read_timeout(replica.length);
        let mut outcome = reader.pool.call_within(&replica.backup, &request, timeout).await;
        for _ in 0..BUSY_BACKUP_RETRIES_MAX {
            if !matches!(outcome, Ok((Status::Retry, _))) {
                break;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(std::time::Duration::from_millis(250));
            outcome = reader.pool.call_within(&replica.backup, &request, timeout).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_wire::RecoveryReplica;

    fn replica(backup: u16, epoch: u64, length: u32, primary: bool) -> RecoveryReplica {
        RecoveryReplica { backup, epoch, length, primary }
    }

    #[test]
    fn only_the_newest_epoch_is_read_longest_first_then_the_primary() {
        let backups = vec!["b:0".to_string(), "b:1".to_string(), "b:2".to_string()];
        // Sent in no useful order: the recovery master orders them itself.
        let segments = vec![RecoverySegment {
            segment_id: SegmentId(4),
            replicas: vec![
                replica(0, 5, 100, false),
                replica(1, 4, 900, true),
                replica(2, 5, 100, true),
                replica(1, 5, 200, false),
            ],
        }];
        let plan = read_plan(&segments, &backups).expect("every segment located");
        let order: Vec<(&str, u32)> =
            plan[0].1.iter().map(|replica| (replica.backup.as_str(), replica.length)).collect();
        assert_eq!(plan[0].0, SegmentId(4));
        assert_eq!(order, vec![("b:1", 200), ("b:2", 100), ("b:0", 100)]);
    }

    #[test]
    fn a_segment_without_a_located_replica_fails_the_partition_with_retry() {
        let backups = vec!["b:0".to_string()];
        let segments = vec![
            RecoverySegment { segment_id: SegmentId(1), replicas: vec![replica(0, 1, 10, true)] },
            RecoverySegment { segment_id: SegmentId(2), replicas: Vec::new() },
        ];
        let (status, message) = read_plan(&segments, &backups).expect_err("segment 2 unlocated");
        assert_eq!(status, Status::Retry);
        assert!(message.contains("segment 2"), "{message}");
        // An index past the backups (only a request built in-process could hold one) counts as
        // no replica.
        let segments = vec![RecoverySegment {
            segment_id: SegmentId(1),
            replicas: vec![replica(3, 1, 10, true)],
        }];
        assert!(read_plan(&segments, &backups).is_err());
    }
}
