//! Where every request to a master arrives: decoded, admitted and sent to its handler.

use bytes::{Bytes, BytesMut};
use stratus_rpc::{Handled, Service};
use stratus_wire::{
    decode_request, encode_error_response, encode_response, FrameHeader, Opcode, Request, Response,
    Status,
};

use super::migration_rpc::{MigrationBatch, TransferRequest};
use super::objects::{respond_version, ObjectWrite};
use super::recovery_rpc::RecoverRequest;
use super::transactions::TransactionId;
use super::Master;
use crate::metrics::Operation;
use crate::migration::IncomingTransfer;

impl Master {
    pub(super) fn handle_request(&self, request_id: u64, request: Request, out: &mut BytesMut) {
        match request {
            Request::Ping => encode_response(out, request_id, Status::Ok, &Response::Ping),
            Request::Read { table_id, key, rules } => {
                self.read(request_id, table_id, &key, &rules, out);
            }
            Request::Write { table_id, key, value, rules, expiry, rpc } => {
                let write = ObjectWrite {
                    table: table_id,
                    key: &key,
                    value: &value,
                    rules: &rules,
                    expiry,
                    rpc,
                };
                let outcome = self.write_one(write);
                let message = self.write_refusal_message(outcome.0, &value);
                respond_version(out, request_id, Opcode::Write, outcome, &message);
            }
            Request::SetExpiry { table_id, key, expiry, rules, rpc } => {
                let outcome = self.set_expiry_one((table_id, &key), expiry, &rules, rpc);
                respond_version(out, request_id, Opcode::SetExpiry, outcome, "");
            }
            Request::Remove { table_id, key, rules, rpc } => {
                let outcome = self.remove_one((table_id, &key), &rules, rpc);
                respond_version(out, request_id, Opcode::Remove, outcome, "");
            }
            Request::Increment { table_id, key, delta, rules, rpc } => {
                let result = self.increment_one((table_id, &key), delta, &rules, rpc);
                if result.status.carries_operation_body() {
                    let response =
                        Response::Increment { version: result.version, value: result.value };
                    encode_response(out, request_id, result.status, &response);
                } else {
                    encode_error_response(
                        out,
                        request_id,
                        Opcode::Increment.code(),
                        result.status,
                        "",
                    );
                }
            }
            Request::MultiRead { items } => {
                self.metrics.add_items(Operation::MultiRead, items.len());
                let results = items.iter().map(|item| self.read_one(item).0).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiRead { results });
            }
            Request::MultiWrite { items } => {
                self.metrics.add_items(Operation::MultiWrite, items.len());
                let results = items.iter().map(|item| self.write_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiWrite { results });
            }
            Request::MultiRemove { items } => {
                self.metrics.add_items(Operation::MultiRemove, items.len());
                let results = items.iter().map(|item| self.remove_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiRemove { results });
            }
            Request::MultiIncrement { items } => {
                self.metrics.add_items(Operation::MultiIncrement, items.len());
                let results = items.iter().map(|item| self.increment_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiIncrement { results });
            }
            Request::TxPrepare {
                lease,
                acknowledged,
                transaction,
                validate_only,
                ops,
                participants,
            } => {
                self.metrics.add_items(Operation::TxPrepare, ops.len());
                let transaction = TransactionId { lease, acknowledged, transaction };
                let votes = self.tx_prepare(transaction, validate_only, &ops, &participants);
                encode_response(out, request_id, Status::Ok, &Response::TxPrepare { votes });
            }
            Request::TxRequestAbort { lease, transaction, ops } => {
                self.metrics.add_items(Operation::TxRequestAbort, ops.len());
                let votes = self.tx_request_abort((lease, transaction), &ops);
                encode_response(out, request_id, Status::Ok, &Response::TxRequestAbort { votes });
            }
            Request::TxDecision { lease, acknowledged, transaction, decision, ops } => {
                self.metrics.add_items(Operation::TxDecision, ops.len());
                let transaction = TransactionId { lease, acknowledged, transaction };
                let results = self.tx_decision(transaction, decision, &ops);
                encode_response(out, request_id, Status::Ok, &Response::TxDecision { results });
            }
            Request::Enumerate { table_id, range, cursor, bytes_max } => {
                self.enumerate(request_id, table_id, range, cursor, bytes_max, out)
            }
            Request::TakeTabletOwnership { master_id, .. }
            | Request::DropTabletOwnership { master_id, .. }
            | Request::ReplicasNeeded { master_id, .. }
            | Request::AbandonMigration { master_id, .. }
                if master_id != self.server_id =>
            {
                // Meant for an earlier process at this address (it crashed, this one enlisted
                // with a new id): applying it would make this master serve a tablet the
                // coordinator gave to the other, or tell a backup to free the replicas the
                // other's recovery needs.
                let message = format!("this is server {}, not {master_id}", self.server_id);
                encode_error_response(
                    out,
                    request_id,
                    request.opcode().code(),
                    Status::WrongServer,
                    &message,
                );
            }
            Request::TakeTabletOwnership { table_id, range, assignment_epoch, tier, .. } => {
                // The store knows the table's tier before the range is served (a TAKE that
                // turns out obsolete below still names the table's one tier: harmless).
                if let Err(conflict) = self.learn_table_tier(table_id, tier) {
                    tracing::error!(table = %table_id, start = range.start, assignment_epoch, %conflict, "refusing a TAKE");
                    let opcode = Opcode::TakeTabletOwnership.code();
                    let message = conflict.to_string();
                    encode_error_response(
                        out,
                        request_id,
                        opcode,
                        Status::InvalidParameter,
                        &message,
                    );
                    return;
                }
                match self.ownership.take(table_id, range, assignment_epoch) {
                    Ok(()) => {
                        tracing::info!(table = %table_id, start = range.start, end = range.end, assignment_epoch, "taking tablet")
                    }
                    // Answered OK: the coordinator has decided otherwise since, and the
                    // assignment it sends now is the one that counts.
                    Err(refusal) => {
                        tracing::info!(table = %table_id, start = range.start, assignment_epoch, ?refusal, "ignoring an obsolete TAKE")
                    }
                }
                encode_response(out, request_id, Status::Ok, &Response::TakeTabletOwnership);
            }
            Request::DropTabletOwnership { table_id, range, assignment_epoch, .. } => {
                let dropped =
                    self.ownership.drop_within_then(table_id, &range, assignment_epoch, || {
                        self.store.drop_range(table_id, range)
                    });
                match dropped {
                    Ok(dropped) => tracing::info!(table = %table_id, dropped, "dropped tablet"),
                    Err(refusal) => {
                        tracing::info!(table = %table_id, start = range.start, assignment_epoch, ?refusal, "ignoring an obsolete DROP")
                    }
                }
                encode_response(out, request_id, Status::Ok, &Response::DropTabletOwnership);
            }
            Request::AbandonMigration { table_id, range, assignment_epoch, .. } => {
                let objects_dropped = self.abandon_migration(table_id, range, assignment_epoch);
                let response = Response::AbandonMigration { objects_dropped };
                encode_response(out, request_id, Status::Ok, &response);
            }
            Request::ReplicasNeeded { segment_ids, .. } => {
                // A master without replication has no replicas anywhere: none is needed.
                let not_needed = match &self.replication {
                    Some(replication) => replication.not_needed(&segment_ids),
                    None => segment_ids,
                };
                let response = Response::ReplicasNeeded { not_needed };
                encode_response(out, request_id, Status::Ok, &response);
            }
            Request::GetServerStatistics => {
                let statistics = self.statistics();
                encode_response(
                    out,
                    request_id,
                    Status::Ok,
                    &Response::GetServerStatistics { statistics },
                );
            }
            other => {
                let message =
                    format!("{:?} is served by the coordinator, not a master", other.opcode());
                encode_error_response(
                    out,
                    request_id,
                    other.opcode().code(),
                    Status::UnimplementedRequest,
                    &message,
                );
            }
        }
    }
}

impl Service for Master {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        // Counted and timed when answered: here, or when a deferred answer is ready.
        let started = tokio::time::Instant::now();
        let operation = Operation::of_opcode(header.opcode_code);
        match decode_request(header.opcode_code, body) {
            Ok(Request::RecoverTablets {
                master_id,
                crashed_master,
                tablets,
                segments,
                backups,
                assignment_epoch,
            }) => {
                let request = RecoverRequest {
                    master_id,
                    crashed_master,
                    tablets,
                    segments,
                    backups,
                    assignment_epoch,
                };
                return self.recover(header.request_id, request, started, out);
            }
            Ok(Request::TransferTablet {
                master_id,
                table_id,
                range,
                assignment_epoch,
                target: _,
                target_address,
            }) => {
                let request = TransferRequest {
                    master_id,
                    table_id,
                    range,
                    assignment_epoch,
                    target_address,
                };
                return self.transfer(header.request_id, request, started, out);
            }
            Ok(Request::ReceiveMigrationData {
                table_id,
                range,
                assignment_epoch,
                source,
                transfer_id,
                safe_version,
                first,
                tier,
                objects,
                removed_keys,
                completions,
            }) => {
                let transfer = IncomingTransfer {
                    table: table_id,
                    range,
                    assignment_epoch,
                    source,
                    transfer_id,
                };
                let batch = MigrationBatch {
                    transfer,
                    safe_version,
                    first,
                    tier,
                    objects,
                    removed_keys,
                    completions,
                };
                return self.receive_migration_data(header.request_id, batch, started, out);
            }
            Ok(request) => match &self.sync_context {
                Some(context) if changes_log(&request) => {
                    let timing = (operation, started);
                    return self.handle_then_sync(header.request_id, request, context, timing);
                }
                Some(context) if reads_objects(&request) => {
                    let timing = (operation, started);
                    if let Some(later) =
                        self.read_once_durable(header.request_id, request, context, timing, out)
                    {
                        return later;
                    }
                }
                _ => self.handle_request(header.request_id, request, out),
            },
            Err(error) => encode_error_response(
                out,
                header.request_id,
                header.opcode_code,
                error.status(),
                &error.to_string(),
            ),
        }
        self.metrics.record(operation, started);
        Handled::Done
    }
}

/// True for a request whose answer shows objects (or their absence).
fn reads_objects(request: &Request) -> bool {
    matches!(request, Request::Read { .. } | Request::MultiRead { .. })
}

/// Requests that may append to the log and so must be replicated before they are answered
/// (a retry answered from its completion record too: the record may not be durable yet).
fn changes_log(request: &Request) -> bool {
    matches!(
        request,
        Request::Write { .. }
            | Request::Remove { .. }
            | Request::Increment { .. }
            | Request::SetExpiry { .. }
            | Request::MultiWrite { .. }
            | Request::MultiRemove { .. }
            | Request::MultiIncrement { .. }
            | Request::TxPrepare { .. }
            | Request::TxDecision { .. }
            | Request::TxRequestAbort { .. }
    )
}
