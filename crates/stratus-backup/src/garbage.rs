//! Garbage collection of replicas nobody needs any more: those of masters the coordinator
//! lists as *removed* — crashed and recovered, so their tablets live in other masters' logs.
//!
//! Replicas of a master that is up are freed by that master (BACKUP_FREE when a segment leaves
//! its log). A crashed master frees nothing, and a backup that was down while its master was
//! recovered finds the replicas again on its disk when it restarts; this loop frees both.
//! Replicas of a master that is merely *crashed* are kept: its recovery needs them.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use stratus_rpc::ChannelPool;
use stratus_types::ServerId;
use stratus_wire::{Request, Response, ResponseBody, ServerStatus, Status};

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
    freed
}
