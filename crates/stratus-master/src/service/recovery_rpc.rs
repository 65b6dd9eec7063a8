//! RECOVER_TABLETS: a recovery master replays its partition of a crashed master's log.

use std::sync::Arc;

use bytes::BytesMut;
use stratus_rpc::Handled;
use stratus_types::ServerId;
use stratus_wire::{
    encode_error_response, encode_response, Opcode, RecoverySegment, RecoveryTablet, Status,
};

use super::Master;
use crate::metrics::{Operation, RecoveryCounters};
use crate::recovery::{recover_partition, RecoveryContext};

/// A RECOVER_TABLETS request (wire-protocol.md).
pub(super) struct RecoverRequest {
    /// The recovery master it is meant for.
    pub(super) master_id: ServerId,
    pub(super) crashed_master: ServerId,
    /// The partition: the tablets (parts of the crashed master's) to replay.
    pub(super) tablets: Vec<RecoveryTablet>,
    /// The crashed log's segments, as its newest digest lists them, each with the replicas
    /// the coordinator located.
    pub(super) segments: Vec<RecoverySegment>,
    /// The backups holding those replicas (the replicas name them by index).
    pub(super) backups: Vec<String>,
    /// The recovery's assignment epoch.
    pub(super) assignment_epoch: u64,
}

impl Master {
    /// RECOVER_TABLETS: replays the partition in the background and answers when it is
    /// durable here.
    pub(super) fn recover(
        &self,
        request_id: u64,
        request: RecoverRequest,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let RecoverRequest {
            master_id,
            crashed_master,
            tablets,
            segments,
            backups,
            assignment_epoch,
        } = request;
        let refuse = |out: &mut BytesMut, status: Status, message: &str| {
            let opcode = Opcode::RecoverTablets.code();
            encode_error_response(out, request_id, opcode, status, message);
            self.metrics.record(Operation::RecoverTablets, started);
            Handled::Done
        };
        let Some(reader) = self.recovery.clone() else {
            let message = "this master does not take part in recovery";
            return refuse(out, Status::UnimplementedRequest, message);
        };
        if master_id != self.server_id {
            // Meant for an earlier process at this address: replaying here would leave the
            // partition with a master the coordinator does not know to hold it.
            let message = format!("this is server {}, not {master_id}", self.server_id);
            return refuse(out, Status::WrongServer, &message);
        }
        if tablets.is_empty() {
            return refuse(out, Status::InvalidParameter, "no tablet to recover");
        }
        let refusal = {
            let mut in_flight =
                self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
            let overlapping = |tablet: &RecoveryTablet| {
                in_flight.iter().any(|other| {
                    other.table_id == tablet.table_id
                        && other.range.intersection(&tablet.range).is_some()
                })
            };
            let tiers = tablets.iter().map(|tablet| (tablet.table_id, tablet.tier));
            if tablets.iter().any(overlapping) {
                Some((Status::Retry, "a recovery of an overlapping range is running here".into()))
            } else if tablets
                .iter()
                .any(|tablet| self.ownership.overlaps(tablet.table_id, &tablet.range))
            {
                let message = "this master already serves part of the range";
                Some((Status::InvalidParameter, message.into()))
            } else if let Err(conflict) = self.learn_table_tiers(tiers) {
                // Before anything is replayed, the store knows each table's tier, so replayed
                // objects go to it. All or nothing, and before the epoch is noted: this
                // refusal changes nothing here.
                tracing::error!(%crashed_master, %conflict, "refusing RECOVER_TABLETS");
                Some((Status::InvalidParameter, conflict.to_string()))
            } else if !self.ownership.note_recovery(
                tablets.iter().map(|tablet| (tablet.table_id, tablet.range)),
                assignment_epoch,
            ) {
                // A request of an earlier attempt that arrives late (the range may have been
                // recovered elsewhere and migrated here since): replaying it would drop what
                // this master received. A current attempt is never older than what it saw.
                let message = "an assignment of the range newer than this recovery was seen here";
                Some((Status::Retry, message.into()))
            } else {
                for tablet in &tablets {
                    // A transfer of the range into this master is over: its batches, and an
                    // ABANDON_MIGRATION of it, must not touch what this recovery replays. One
                    // whose first batch has not arrived yet is not remembered here: the
                    // recovery's epoch, above the transfer's, makes its batches stale.
                    self.incoming.supersede_overlapping(tablet.table_id, &tablet.range);
                }
                in_flight.extend(tablets.iter().copied());
                None
            }
        };
        if let Some((status, message)) = refusal {
            return refuse(out, status, &message);
        }
        let metrics = self.metrics.clone();
        RecoveryCounters::add(&metrics.recovery.partitions_started, 1);
        let context = RecoveryContext {
            store: self.store.clone(),
            replication: self.replication.clone(),
            reader,
            wall_clock: self.wall_clock.clone(),
            metrics: metrics.clone(),
        };
        let in_flight =
            InFlight { registry: self.recoveries_in_flight.clone(), tablets: tablets.clone() };
        Handled::Later(Box::pin(async move {
            let outcome =
                recover_partition(context, crashed_master, tablets, segments, backups).await;
            drop(in_flight);
            let counters = &metrics.recovery;
            let finished = if outcome.is_ok() {
                &counters.partitions_succeeded
            } else {
                &counters.partitions_failed
            };
            RecoveryCounters::add(finished, 1);
            metrics.record(Operation::RecoverTablets, started);
            let mut out = BytesMut::new();
            match outcome {
                Ok(response) => encode_response(&mut out, request_id, Status::Ok, &response),
                Err((status, message)) => {
                    tracing::warn!(%crashed_master, %status, %message, "recovery of a partition failed");
                    encode_error_response(
                        &mut out,
                        request_id,
                        Opcode::RecoverTablets.code(),
                        status,
                        &message,
                    )
                }
            }
            out
        }))
    }
}

/// Removes a recovery's ranges from the in-flight registry when it ends, however it ends.
struct InFlight {
    registry: Arc<std::sync::Mutex<Vec<RecoveryTablet>>>,
    tablets: Vec<RecoveryTablet>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut registry = self.registry.lock().unwrap_or_else(|poison| poison.into_inner());
        for tablet in &self.tablets {
            if let Some(position) = registry.iter().position(|other| other == tablet) {
                registry.swap_remove(position);
            }
        }
    }
}
