//! Tablet migration between masters (wire-protocol.md, MIGRATE_TABLET, TRANSFER_TABLET and
//! RECEIVE_MIGRATION_DATA).
//!
//! The source freezes the tablet (writes get RETRY; writes already admitted finish first),
//! copies every live object to the target in bounded batches, makes its own log durable, and
//! stops serving the tablet. The target starts the tablet afresh in its log (drops what it
//! held of the range, raises its safe version to the source's, rolls its head: the new head
//! is the tablet's creation segment, which the coordinator records so that recovery of the
//! target ignores the range's older entries), writes each object with its version, and
//! answers each batch once it is durable. The coordinator then records the new owner.

use std::sync::{Arc, Mutex};

use stratus_rpc::ChannelPool;
use stratus_store::ObjectStore;
use stratus_types::limits::MIGRATION_BATCH_BYTES_MAX;
use stratus_types::{HashRange, SegmentId, ServerId, TableId, Version};
use stratus_wire::{EnumeratedObject, Request, Response, ResponseBody, Status};

use crate::ownership::{AssignmentRefusal, TabletOwnership};

/// Transfers a target remembers (source and transfer id per range). One per migration the
/// coordinator ran to this master, and it runs one at a time; a range's entry is replaced by
/// the next transfer of an overlapping range, so this bounds only ranges never transferred
/// again, oldest forgotten first (a forgotten transfer's late batch is then refused).
pub const INCOMING_TRANSFERS_REMEMBERED_MAX: usize = 64;

/// Ended transfers out of this master a master remembers, so that the coordinator, whose
/// answer was lost (a connection that broke or stalled), can ask again with the same
/// TRANSFER_TABLET and get the outcome rather than a refusal. The coordinator runs one
/// migration at a time and asks again within seconds, so a few are plenty.
pub const COMPLETED_TRANSFERS_REMEMBERED_MAX: usize = 16;

/// A failed transfer or batch: the status and message to answer with.
pub type MigrationFailure = (Status, String);

/// One transfer into this master, as its first batch announced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IncomingTransfer {
    pub(crate) table: TableId,
    pub(crate) range: HashRange,
    pub(crate) assignment_epoch: u64,
    pub(crate) source: ServerId,
    pub(crate) transfer_id: u64,
}

/// The transfers this master is receiving (or received).
#[derive(Debug, Default)]
pub(crate) struct IncomingTransfers {
    transfers: Mutex<Vec<IncomingTransfer>>,
}

impl IncomingTransfers {
    /// Remembers `transfer` as the one for its range, replacing every overlapping one.
    pub(crate) fn begin(&self, transfer: IncomingTransfer) {
        let mut transfers = self.transfers.lock().unwrap_or_else(|poison| poison.into_inner());
        transfers.retain(|other| {
            other.table != transfer.table || other.range.intersection(&transfer.range).is_none()
        });
        if transfers.len() >= INCOMING_TRANSFERS_REMEMBERED_MAX {
            transfers.remove(0);
        }
        transfers.push(transfer);
    }

    /// True if `transfer` is the one remembered for its range.
    pub(crate) fn is_current(&self, transfer: &IncomingTransfer) -> bool {
        let transfers = self.transfers.lock().unwrap_or_else(|poison| poison.into_inner());
        transfers.contains(transfer)
    }
}

/// A transfer out of this master that ended: (table, range, assignment epoch) and what it
/// answered (creation segment in the target's log and objects sent, or its failure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CompletedTransfer {
    pub(crate) table: TableId,
    pub(crate) range: HashRange,
    pub(crate) assignment_epoch: u64,
    pub(crate) outcome: Result<(SegmentId, u64), MigrationFailure>,
}

/// The last few completed transfers out of this master. Its lock is held across a hand-off
/// and its record, and across a look-up and the freeze that starts a transfer, so a TRANSFER
/// asked again at the moment the first one hands off sees either the tablet still frozen (a
/// transfer running: RETRY) or the outcome, never a tablet that is simply gone.
#[derive(Debug, Default)]
pub(crate) struct CompletedTransfers {
    transfers: Mutex<std::collections::VecDeque<CompletedTransfer>>,
}

/// What a TRANSFER_TABLET found.
pub(crate) enum TransferStart {
    /// A new transfer, frozen with this id.
    Started(u64),
    /// The same transfer ended before: its outcome.
    Completed(Result<(SegmentId, u64), MigrationFailure>),
}

impl CompletedTransfers {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::VecDeque<CompletedTransfer>> {
        self.transfers.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The outcome of the transfer of exactly `range` of `table` at `assignment_epoch` if it
    /// completed here; otherwise freezes the tablet for a new transfer.
    pub(crate) fn outcome_or_freeze(
        &self,
        ownership: &TabletOwnership,
        table: TableId,
        range: HashRange,
        assignment_epoch: u64,
    ) -> Result<TransferStart, AssignmentRefusal> {
        let transfers = self.lock();
        let done = transfers.iter().find(|done| {
            done.table == table && done.range == range && done.assignment_epoch == assignment_epoch
        });
        if let Some(done) = done {
            return Ok(TransferStart::Completed(done.outcome.clone()));
        }
        ownership.freeze(table, range, assignment_epoch).map(TransferStart::Started)
    }

    /// Ends the transfer that froze a tablet with `transfer_id`: on success hands the tablet
    /// off (unless a TAKE ended the transfer meanwhile: then it failed), on failure serves it
    /// again; remembers the outcome (forgetting the oldest past the bound) and returns it.
    pub(crate) fn end(
        &self,
        ownership: &TabletOwnership,
        transfer_id: u64,
        mut transfer: CompletedTransfer,
    ) -> Result<(SegmentId, u64), MigrationFailure> {
        let mut transfers = self.lock();
        match transfer.outcome {
            Ok(_) if ownership.hand_off(transfer_id) => {}
            Ok(_) => transfer.outcome = Err((Status::Retry, "the transfer was ended".to_string())),
            Err(_) => ownership.unfreeze(transfer_id),
        }
        if transfers.len() >= COMPLETED_TRANSFERS_REMEMBERED_MAX {
            transfers.pop_front();
        }
        let outcome = transfer.outcome.clone();
        transfers.push_back(transfer);
        outcome
    }
}

/// What a transfer out of this master needs.
pub(crate) struct Transfer {
    pub(crate) store: Arc<ObjectStore>,
    pub(crate) ownership: Arc<TabletOwnership>,
    pub(crate) pool: Arc<ChannelPool>,
    pub(crate) source: ServerId,
    pub(crate) transfer_id: u64,
    pub(crate) table: TableId,
    pub(crate) range: HashRange,
    pub(crate) assignment_epoch: u64,
    pub(crate) target_address: String,
}

impl Transfer {
    /// Copies every live object of the (frozen) tablet to the target; returns the tablet's
    /// creation segment in the target's log and the objects sent. Stops early once the
    /// transfer was ended (a TAKE of the tablet).
    pub(crate) async fn send(&self) -> Result<(SegmentId, u64), MigrationFailure> {
        // Frozen: no write to the tablet is applied from here on, so every version it holds
        // is below this, and so is every version it removed.
        let safe_version: Version = self.store.log().safe_version();
        let mut cursor: (u64, Option<Vec<u8>>) = (0, None);
        let mut creation_segment = None;
        let mut objects_sent = 0u64;
        loop {
            if !self.ownership.is_frozen_by(self.transfer_id) {
                return Err((Status::Retry, "the transfer was ended".to_string()));
            }
            let mut objects = Vec::new();
            let next = self.store.enumerate(
                self.table,
                self.range,
                cursor.0,
                cursor.1.as_deref(),
                MIGRATION_BATCH_BYTES_MAX,
                &mut |key, value, version| {
                    objects.push(EnumeratedObject {
                        key: bytes::Bytes::copy_from_slice(key),
                        value: bytes::Bytes::copy_from_slice(value),
                        version,
                    })
                },
            );
            // A stretch of empty buckets: go on (each call scans a bounded number), but always
            // send a first batch, which starts the tablet on the target.
            if objects.is_empty() && creation_segment.is_some() {
                match next {
                    Some(next) => {
                        cursor = next;
                        continue;
                    }
                    None => break,
                }
            }
            let count = objects.len() as u64;
            let request = Request::ReceiveMigrationData {
                table_id: self.table,
                range: self.range,
                assignment_epoch: self.assignment_epoch,
                source: self.source,
                transfer_id: self.transfer_id,
                safe_version,
                first: creation_segment.is_none(),
                objects,
            };
            match self.pool.call(&self.target_address, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::ReceiveMigrationData {
                        creation_segment: created,
                    }),
                )) => {
                    creation_segment.get_or_insert(created);
                }
                Ok((status, body)) => {
                    let status = if status == Status::Ok { Status::InternalError } else { status };
                    return Err((status, format!("the target refused a batch: {body:?}")));
                }
                Err(error) => {
                    self.pool.forget(&self.target_address);
                    return Err((
                        Status::Retry,
                        format!("target {}: {error}", self.target_address),
                    ));
                }
            }
            objects_sent += count;
            match next {
                Some(next) => cursor = next,
                None => break,
            }
        }
        let creation_segment = creation_segment.expect("the first batch was sent");
        Ok((creation_segment, objects_sent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_types::KeyHash;

    #[test]
    fn a_transfer_asked_again_is_in_progress_while_running_and_gets_its_outcome_once_ended() {
        let ownership = TabletOwnership::default();
        let completed = CompletedTransfers::default();
        let (table, range) = (TableId(1), HashRange::FULL);
        ownership.take(table, range, 1).unwrap();
        let start = |epoch| completed.outcome_or_freeze(&ownership, table, range, epoch);
        let Ok(TransferStart::Started(transfer_id)) = start(2) else {
            panic!("the first request starts the transfer");
        };
        // Running: the same request is told so; another epoch's finds the tablet busy.
        assert!(matches!(start(2), Err(AssignmentRefusal::TransferRunning)));
        assert!(matches!(start(3), Err(AssignmentRefusal::AlreadyFrozen)));
        let done =
            CompletedTransfer { table, range, assignment_epoch: 2, outcome: Ok((SegmentId(9), 5)) };
        assert_eq!(completed.end(&ownership, transfer_id, done.clone()), Ok((SegmentId(9), 5)));
        assert!(!ownership.owns(table, KeyHash(0)), "handed off");
        assert!(matches!(start(2), Ok(TransferStart::Completed(Ok((SegmentId(9), 5))))));
        // A later transfer's request is not this one's.
        assert!(matches!(start(3), Err(AssignmentRefusal::NotATablet)));

        // A failed transfer serves the tablet again and answers its failure when asked again.
        ownership.take(table, range, 4).unwrap();
        let Ok(TransferStart::Started(failing)) = start(5) else { panic!("starts") };
        let failure = (Status::Retry, "target unreachable".to_string());
        let failed =
            CompletedTransfer { assignment_epoch: 5, outcome: Err(failure.clone()), ..done };
        assert_eq!(completed.end(&ownership, failing, failed), Err(failure.clone()));
        assert!(ownership.owns(table, KeyHash(0)), "served again");
        assert!(matches!(start(5), Ok(TransferStart::Completed(Err(ref f))) if *f == failure));

        // Bounded.
        for epoch in 10..10 + COMPLETED_TRANSFERS_REMEMBERED_MAX as u64 {
            let Ok(TransferStart::Started(id)) = start(epoch) else { panic!("starts") };
            let record = CompletedTransfer {
                assignment_epoch: epoch,
                outcome: Err(failure.clone()),
                ..done
            };
            assert!(completed.end(&ownership, id, record).is_err());
        }
        assert_eq!(completed.lock().len(), COMPLETED_TRANSFERS_REMEMBERED_MAX);
        assert!(!completed.lock().iter().any(|record| record.assignment_epoch == 2));
    }

    #[test]
    fn a_later_transfer_of_an_overlapping_range_supersedes_the_earlier() {
        let incoming = IncomingTransfers::default();
        let first = IncomingTransfer {
            table: TableId(1),
            range: HashRange::new(0, 99).unwrap(),
            assignment_epoch: 1,
            source: ServerId(1),
            transfer_id: 0,
        };
        incoming.begin(first);
        assert!(incoming.is_current(&first));
        let second = IncomingTransfer { range: HashRange::new(50, 150).unwrap(), ..first };
        incoming.begin(second);
        assert!(!incoming.is_current(&first), "a late batch of the first is refused");
        assert!(incoming.is_current(&second));
        let other_table = IncomingTransfer { table: TableId(2), ..first };
        incoming.begin(other_table);
        assert!(incoming.is_current(&second) && incoming.is_current(&other_table));
        for transfer_id in 1..=INCOMING_TRANSFERS_REMEMBERED_MAX as u64 {
            let range = HashRange::new(1_000 * transfer_id, 1_000 * transfer_id + 1).unwrap();
            incoming.begin(IncomingTransfer { range, transfer_id, ..first });
        }
        assert!(!incoming.is_current(&second), "the oldest is forgotten first");
    }
}
