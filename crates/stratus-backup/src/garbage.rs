//! Garbage collection of replicas nobody needs any more: those of masters the coordinator
//! lists as *removed* — crashed and recovered, so their tablets live in other masters' logs.
//!
//! Replicas of a master that is up are freed by that master (BACKUP_FREE when a segment leaves
//! its log). A crashed master frees nothing, and a backup that was down while its master was
//! recovered finds the replicas again on its disk when it restarts; this loop frees both.
//! Replicas of a master that is merely *crashed* are kept: its recovery needs them.
//!
//! A master's own frees are best effort: a BACKUP_FREE lost to a backup that was unreachable
//! at the time, a replica written before a failed recovery abandoned its side segment, or a
//! stale copy on a backup that restarted and found it on disk would each hold a storage frame
//! for as long as the master lives. So this loop also asks every master that is up which of
//! its replicas here it still needs (REPLICAS_NEEDED, RAMCloud's isReplicaNeeded) and frees the
//! others.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use stratus_env::{join_all, BoxFuture};
use stratus_rpc::ChannelPool;
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{Request, Response, ResponseBody, ServerStatus, Status, BACKUP_REPLICAS_MAX};

use crate::service::BackupService;

/// Time between two collections: replicas of a recovered master cost only disk frames, so
/// there is no hurry; the first collection runs this long after start.
pub const GARBAGE_COLLECTION_INTERVAL: Duration = Duration::from_secs(5);

/// Frees, every [`GARBAGE_COLLECTION_INTERVAL`] until the task is dropped, the replicas of
/// masters that `coordinator` lists as removed.
pub async fn collect_garbage(backup: Arc<BackupService>, coordinator: String, pool: ChannelPool) {
    loop {
        tokio::time::sleep(GARBAGE_COLLECTION_INTERVAL).await;
        collect_once(&backup, &coordinator, &pool).await;
    }
}

/// One collection; returns how many replicas were freed.
pub async fn collect_once(backup: &BackupService, coordinator: &str, pool: &ChannelPool) -> usize {
    let held: BTreeSet<ServerId> =
        backup.list(ServerId(0)).iter().map(|replica| replica.master_id).collect();
    if held.is_empty() {
        return 0;
    }
    let servers = match pool.call_coordinator(coordinator, &Request::GetServerList).await {
        Ok((Status::Ok, ResponseBody::Operation(Response::GetServerList { servers }))) => servers,
        other => {
            tracing::debug!(?other, "no server list for garbage collection");
            return 0;
        }
    };
    let removed: Vec<ServerId> = servers
        .iter()
        .filter(|server| server.status == ServerStatus::Removed && held.contains(&server.server_id))
        .map(|server| server.server_id)
        .collect();
    let mut freed = 0;
    for master_id in removed {
        for replica in backup.list(master_id) {
            match backup.free(master_id, replica.segment_id) {
                Ok(()) => freed += 1,
                // The disk queue is full: the rest waits for the next collection.
                Err(error) => {
                    tracing::debug!(%master_id, status = %error.status, "replica not freed yet");
                    return freed;
                }
            }
        }
        tracing::info!(%master_id, "freed the replicas of a recovered master");
    }
    // Every up master is asked at once: one that does not answer (each call is bounded by the
    // pool's request timeout) delays none of the others.
    let mut questions: Vec<BoxFuture<'_, _>> = Vec::new();
    for server in servers.iter().filter(|server| {
        server.status == ServerStatus::Up
            && server.services.has_master()
            && held.contains(&server.server_id)
    }) {
        let mut segment_ids: Vec<SegmentId> =
            backup.list(server.server_id).iter().map(|replica| replica.segment_id).collect();
        segment_ids.truncate(BACKUP_REPLICAS_MAX);
        if segment_ids.is_empty() {
            continue;
        }
        let (master_id, address) = (server.server_id, server.address.as_str());
        questions.push(Box::pin(async move {
            let not_needed = ask_replicas_needed(pool, master_id, address, &segment_ids).await;
            (master_id, segment_ids, not_needed)
        }));
    }
    for answered in join_all(questions).await {
        let (master_id, asked, Some(not_needed)) = answered else { continue };
        let asked: BTreeSet<SegmentId> = asked.into_iter().collect();
        let mut freed_here = 0;
        // Only segments asked about: an answer naming others is ignored for those.
        for segment_id in not_needed.into_iter().filter(|segment_id| asked.contains(segment_id)) {
            match backup.free(master_id, segment_id) {
                Ok(()) => freed_here += 1,
                Err(error) => {
                    tracing::debug!(%master_id, status = %error.status, "replica not freed yet");
                    return freed + freed_here;
                }
            }
        }
        if freed_here > 0 {
            tracing::info!(%master_id, freed = freed_here, "freed replicas the master no longer needs");
        }
        freed += freed_here;
    }
    freed
}

/// Asks the live master `master_id` at `address` which of `segment_ids` (its segments this
/// backup holds replicas of) it no longer needs. `None` when it does not answer, or answers
/// otherwise than OK: the replicas are kept until the next collection.
async fn ask_replicas_needed(
    pool: &ChannelPool,
    master_id: ServerId,
    address: &str,
    segment_ids: &[SegmentId],
) -> Option<Vec<SegmentId>> {
    let request = Request::ReplicasNeeded { master_id, segment_ids: segment_ids.to_vec() };
    match pool.call(address, &request).await {
        Ok((Status::Ok, ResponseBody::Operation(Response::ReplicasNeeded { not_needed }))) => {
            Some(not_needed)
        }
        other => {
            tracing::debug!(%master_id, ?other, "no answer about needed replicas");
            None
        }
    }
}
