//! Tablet migration: TRANSFER_TABLET on the source, RECEIVE_MIGRATION_DATA and
//! ABANDON_MIGRATION on the target (the state machines are in `crate::migration`).

use bytes::{Bytes, BytesMut};
use stratus_log::format::CompletionRecord;
use stratus_rpc::Handled;
use stratus_store::ObjectError;
use stratus_types::limits::KEY_BYTES_MAX;
use stratus_types::{key_hash, HashRange, KeyHash, SegmentId, ServerId, TableId, Tier, Version};
use stratus_wire::{
    encode_error_response, encode_response, EnumeratedObject, MigratedCompletion, Opcode, Response,
    Status,
};

use super::durable_answer::answer_once_durable;
use super::Master;
use crate::metrics::Operation;
use crate::migration::{
    CompletedTransfer, IncomingTransfer, MigrationFailure, Transfer, TransferStart,
};
use crate::ownership::AssignmentRefusal;

/// Why a migration target refuses a batch with NO_TABLE_SPACE.
const LOG_FULL_FOR_TABLET: &str = "the log is full: no room for the tablet here";

/// A TRANSFER_TABLET request (wire-protocol.md).
pub(super) struct TransferRequest {
    /// The master it is meant for (the tablet's owner).
    pub(super) master_id: ServerId,
    pub(super) table_id: TableId,
    /// The tablet to copy.
    pub(super) range: HashRange,
    /// The migration's assignment epoch.
    pub(super) assignment_epoch: u64,
    /// Where the target master listens.
    pub(super) target_address: String,
}

/// A RECEIVE_MIGRATION_DATA batch (wire-protocol.md).
pub(super) struct MigrationBatch {
    pub(super) transfer: IncomingTransfer,
    /// The source's safe version.
    pub(super) safe_version: Version,
    /// The first batch of the transfer: start the tablet afresh.
    pub(super) first: bool,
    /// The table's tier, as the source stores it.
    pub(super) tier: Tier,
    pub(super) objects: Vec<EnumeratedObject>,
    /// Keys the source removed while it copied the tablet.
    pub(super) removed_keys: Vec<Bytes>,
    /// Unacknowledged results of the tablet's mutations.
    pub(super) completions: Vec<MigratedCompletion>,
}

impl Master {
    /// TRANSFER_TABLET: copies the tablet to the target in the background (writes go on until
    /// the catch-up at the end, `Transfer::send`), makes this log durable, and stops serving
    /// the tablet; on failure serves it as before.
    pub(super) fn transfer(
        &self,
        request_id: u64,
        request: TransferRequest,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let TransferRequest { master_id, table_id: table, range, assignment_epoch, target_address } =
            request;
        let opcode = Opcode::TransferTablet.code();
        let refuse = |out: &mut BytesMut, status: Status, message: &str| {
            encode_error_response(out, request_id, opcode, status, message);
            self.metrics.record(Operation::Control, started);
            Handled::Done
        };
        let Some(reader) = &self.recovery else {
            return refuse(out, Status::UnimplementedRequest, "this master cannot reach others");
        };
        if master_id != self.server_id {
            let message = format!("this is server {}, not {master_id}", self.server_id);
            return refuse(out, Status::WrongServer, &message);
        }
        if !self.may_serve() {
            return refuse(out, Status::Retry, "no lease from the coordinator");
        }
        let start = self.completed_transfers.outcome_or_freeze(
            &self.ownership,
            table,
            range,
            assignment_epoch,
            || self.store.has_prepared_in_range(table, range),
        );
        let transfer_id = match start {
            Ok(TransferStart::Started(transfer_id)) => transfer_id,
            // Asked again after it ended (the coordinator lost the first answer).
            Ok(TransferStart::Completed(Ok((creation_segment, objects_sent)))) => {
                let response = Response::TransferTablet { creation_segment, objects_sent };
                encode_response(out, request_id, Status::Ok, &response);
                self.metrics.record(Operation::Control, started);
                return Handled::Done;
            }
            Ok(TransferStart::Completed(Err((status, message)))) => {
                return refuse(out, status, &message)
            }
            Err(AssignmentRefusal::TransferRunning) => {
                return refuse(out, Status::InProgress, "this transfer is running")
            }
            Err(AssignmentRefusal::AlreadyFrozen) => {
                return refuse(out, Status::Retry, "a transfer of this tablet is running")
            }
            Err(AssignmentRefusal::Stale) => {
                return refuse(out, Status::Retry, "the transfer is older than an assignment seen")
            }
            Err(AssignmentRefusal::TransactionsPrepared) => {
                let message = "transactions hold prepared operations in the tablet: it moves \
                               once they are decided";
                return refuse(out, Status::Retry, message);
            }
            Err(_) => {
                return refuse(
                    out,
                    Status::UnknownTablet,
                    "the range is not a tablet this master owns",
                )
            }
        };
        tracing::info!(%table, start = range.start, end = range.end, %target_address, "transferring a tablet");
        let transfer = Transfer {
            store: self.store.clone(),
            wall_clock: self.wall_clock.clone(),
            ownership: self.ownership.clone(),
            pool: reader.pool(),
            source: self.server_id,
            transfer_id,
            table,
            range,
            assignment_epoch,
            target_address,
        };
        let replication = self.replication.clone();
        let metrics = self.metrics.clone();
        let completed_transfers = self.completed_transfers.clone();
        Handled::Later(Box::pin(async move {
            let mut outcome = transfer.send().await;
            if outcome.is_ok() {
                // What was copied is durable here too before this master lets go of it.
                if let Some(replication) = &replication {
                    if let Err(error) = replication.sync(replication.position_to_sync()).await {
                        outcome = Err((Status::Retry, format!("replicating: {}", error.message)));
                    }
                }
            }
            let ended = CompletedTransfer { table, range, assignment_epoch, outcome };
            let outcome: Result<(SegmentId, u64), MigrationFailure> =
                completed_transfers.end(&transfer.ownership, transfer_id, ended);
            metrics.record(Operation::Control, started);
            let mut out = BytesMut::new();
            match outcome {
                Ok((creation_segment, objects_sent)) => {
                    tracing::info!(%table, start = range.start, objects_sent, "tablet transferred");
                    let response = Response::TransferTablet { creation_segment, objects_sent };
                    encode_response(&mut out, request_id, Status::Ok, &response);
                }
                Err((status, message)) => {
                    tracing::warn!(%table, start = range.start, %status, %message, "transfer failed; serving the tablet again");
                    encode_error_response(&mut out, request_id, opcode, status, &message);
                }
            }
            out
        }))
    }

    /// RECEIVE_MIGRATION_DATA: writes the batch into the store (starting the tablet afresh for
    /// the first batch) and answers once it is durable.
    pub(super) fn receive_migration_data(
        &self,
        request_id: u64,
        batch: MigrationBatch,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let opcode = Opcode::ReceiveMigrationData;
        match self.apply_migration_batch(&batch) {
            Err((status, message)) => {
                encode_error_response(out, request_id, opcode.code(), status, &message);
            }
            Ok(creation_segment) => {
                let response = Response::ReceiveMigrationData { creation_segment };
                if let Some(context) = &self.sync_context {
                    let mut frame = BytesMut::new();
                    encode_response(&mut frame, request_id, Status::Ok, &response);
                    let position = context.replication.position_to_sync();
                    let timing = (Operation::Control, started);
                    return answer_once_durable(
                        request_id, opcode, frame, position, context, timing,
                    );
                }
                encode_response(out, request_id, Status::Ok, &response);
            }
        }
        self.metrics.record(Operation::Control, started);
        Handled::Done
    }

    /// ABANDON_MIGRATION: drops what the transfer of `table`'s `range` at `assignment_epoch`
    /// copied here, and refuses its later batches; returns the objects dropped.
    ///
    /// Only the copy of that transfer, and only while nothing overtook it: the transfer must
    /// be the one receiving here (not replaced by a later one, and not superseded by a
    /// recovery of an overlapping range, which marks it when it begins), and no assignment of
    /// the range may be newer or served here. A recovery that replayed into the range and
    /// waits for its TAKE has marked the transfer, so its objects are never the ones dropped.
    pub(super) fn abandon_migration(
        &self,
        table: TableId,
        range: HashRange,
        assignment_epoch: u64,
    ) -> u64 {
        // Held throughout, as a batch holds it: a recovery of the range cannot begin between
        // the checks and the drop.
        let in_flight =
            self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
        let recovering = in_flight
            .iter()
            .any(|other| other.table_id == table && other.range.intersection(&range).is_some());
        let dropped = self.ownership.while_receiving(table, range, assignment_epoch, || {
            // Marked abandoned whatever happens next, so that no batch of it lands after this.
            let receiving = self.incoming.abandon(table, range, assignment_epoch);
            if receiving && !recovering {
                self.store.drop_range(table, range)
            } else {
                0
            }
        });
        drop(in_flight);
        match dropped {
            Ok(objects) => {
                tracing::info!(table = %table, start = range.start, assignment_epoch, objects, "dropped the copy of an abandoned transfer");
                objects
            }
            Err(refusal) => {
                // The range was assigned since (a recovery's TAKE, or a later transfer): what
                // this master holds of it is not the abandoned copy's to drop.
                self.incoming.abandon(table, range, assignment_epoch);
                tracing::info!(table = %table, start = range.start, assignment_epoch, ?refusal, "an abandoned transfer was overtaken; nothing dropped");
                0
            }
        }
    }

    fn apply_migration_batch(&self, batch: &MigrationBatch) -> Result<SegmentId, MigrationFailure> {
        let MigrationBatch {
            transfer,
            safe_version,
            first,
            tier,
            objects,
            removed_keys,
            completions,
        } = batch;
        let (safe_version, first) = (*safe_version, *first);
        if !self.may_serve() {
            return Err((Status::Retry, "no lease from the coordinator".to_string()));
        }
        let IncomingTransfer { table, range, assignment_epoch, .. } = *transfer;
        let keys = objects.iter().map(|object| &object.key).chain(removed_keys);
        for key in keys {
            if key.is_empty() || key.len() > KEY_BYTES_MAX {
                return Err((Status::InvalidParameter, "a migrated key is invalid".to_string()));
            }
            if !range.contains(key_hash(table, key)) {
                return Err((
                    Status::InvalidParameter,
                    "a migrated key lies outside the tablet".to_string(),
                ));
            }
        }
        if completions.iter().any(|completion| !range.contains(KeyHash(completion.key_hash))) {
            return Err((
                Status::InvalidParameter,
                "a migrated result lies outside the tablet".to_string(),
            ));
        }
        // Held while the batch is written: a recovery of an overlapping range registers under
        // it, and must not interleave with this batch (its replay starts by dropping the
        // range, and a migrated object must not land after that drop).
        let in_flight =
            self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
        if in_flight
            .iter()
            .any(|other| other.table_id == table && other.range.intersection(&range).is_some())
        {
            return Err((
                Status::Retry,
                "a recovery of an overlapping range is running here".to_string(),
            ));
        }
        let written = self.ownership.while_receiving(table, range, assignment_epoch, || {
            // The store knows the table's tier before any of its objects lands here (every
            // batch repeats it; the first batch of a table new to this master teaches it), and
            // only from a batch of a transfer this master may receive now.
            self.learn_table_tier(table, *tier)
                .map_err(|conflict| (Status::InvalidParameter, conflict.to_string()))?;
            let log = self.store.log();
            let creation_segment = if first {
                if !self.incoming.begin(*transfer) {
                    return Err((
                        Status::InvalidParameter,
                        "the transfer was abandoned".to_string(),
                    ));
                }
                // Whatever this master still holds of the range is from an earlier time it had
                // it (or an abandoned transfer): invisible (not owned), and it must stay so.
                self.store.drop_range(table, range);
                log.raise_safe_version(safe_version);
                // The new head starts the tablet in this log (and records the raised safe
                // version): recovery ignores the range's entries in older segments.
                log.roll_head(stratus_log::AppendPriority::Normal)
                    .map_err(|_| (Status::NoTableSpace, LOG_FULL_FOR_TABLET.to_string()))?
            } else {
                if !self.incoming.is_current(transfer) {
                    return Err((
                        Status::InvalidParameter,
                        "the transfer was superseded by a later one".to_string(),
                    ));
                }
                log.head_segment_id().unwrap_or(SegmentId(0))
            };
            let now = self.now();
            // A full log is the target's lasting answer, not a moment's: retrying at once would
            // copy the tablet again into the same log (a client retrying MIGRATE_TABLET on
            // RETRY did, for its whole timeout).
            let refused = |error| match error {
                ObjectError::LogFull => (Status::NoTableSpace, LOG_FULL_FOR_TABLET.to_string()),
                other => (Status::InvalidParameter, format!("a migrated object: {other:?}")),
            };
            for object in objects {
                let EnumeratedObject { key, value, version, expires_at } = object;
                self.store
                    .insert_migrated(table, key, value, *version, *expires_at, now)
                    .map_err(refused)?;
            }
            for key in removed_keys {
                self.store.remove_migrated(table, key, safe_version, now).map_err(refused)?;
            }
            let records: Vec<CompletionRecord> = completions
                .iter()
                .map(|completion| CompletionRecord {
                    table,
                    key_hash: completion.key_hash,
                    lease_id: completion.lease.0,
                    rpc_id: completion.rpc.0,
                    acknowledged: completion.acknowledged.0,
                    version: completion.version,
                    integer: completion.integer,
                })
                .collect();
            self.store.import_completions(&records).map_err(refused)?;
            if !removed_keys.is_empty() {
                // The removals raised the safe version past the removed versions; a new head
                // records it, so a recovery of this master once it serves the tablet does not
                // hand those versions out again (the answer waits until the head is durable).
                log.roll_head(stratus_log::AppendPriority::Normal)
                    .map_err(|_| (Status::NoTableSpace, LOG_FULL_FOR_TABLET.to_string()))?;
            }
            Ok(creation_segment)
        });
        let creation_segment = match written {
            Ok(written) => written?,
            Err(AssignmentRefusal::ServesPart) => {
                return Err((
                    Status::InvalidParameter,
                    "this master already serves part of the range".to_string(),
                ))
            }
            Err(refusal) => {
                return Err((Status::Retry, format!("the transfer is obsolete: {refusal:?}")))
            }
        };
        drop(in_flight);
        Ok(creation_segment)
    }
}
