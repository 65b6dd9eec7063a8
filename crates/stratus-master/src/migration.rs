//! Tablet migration between masters (wire-protocol.md, MIGRATE_TABLET, TRANSFER_TABLET and
//! RECEIVE_MIGRATION_DATA).
//!
//! The source copies every live object to the target in bounded batches while the tablet
//! still takes writes (each noting the key it changed), then holds writes (RETRY; writes
//! already admitted finish first) and sends the changed keys again, makes its own log durable,
//! and stops serving the tablet. The target starts the tablet afresh in its log (drops what it
//! held of the range, raises its safe version to the source's, rolls its head: the new head
//! is the tablet's creation segment, which the coordinator records so that recovery of the
//! target ignores the range's older entries), writes each object with its version, and
//! answers each batch once it is durable. The coordinator then records the new owner.

use std::sync::{Arc, Mutex};

use stratus_rpc::ChannelPool;
use stratus_store::ObjectStore;
use stratus_types::limits::{MIGRATION_BATCH_BYTES_MAX, MIGRATION_COMPLETIONS_PER_BATCH_MAX};
use stratus_types::{key_hash, HashRange, RejectRules, SegmentId, ServerId, TableId, Version};
use stratus_types::{LeaseId, RpcId};
use stratus_wire::{EnumeratedObject, MigratedCompletion, Request, Response, ResponseBody, Status};

use crate::ownership::{AssignmentRefusal, ChangedDuringCopy, TabletOwnership};

/// Transfers a target remembers (source and transfer id per range, and whether each was
/// abandoned). One per migration the coordinator ran to this master, and it runs one at a
/// time; a range's entry is replaced by the next transfer of an overlapping range, so this
/// bounds only ranges never transferred again. Abandoned ones are forgotten first, then the
/// oldest (a forgotten transfer's late batch is then refused, unless it is a first batch of
/// an abandoned transfer: that one starts it again, as before abandoning existed).
pub const INCOMING_TRANSFERS_REMEMBERED_MAX: usize = 64;

/// Ended transfers out of this master a master remembers, so that the coordinator, whose
/// answer was lost (a connection that broke or stalled), can ask again with the same
/// TRANSFER_TABLET and get the outcome rather than a refusal. The coordinator runs one
/// migration at a time and asks again within seconds, so a few are plenty.
pub const COMPLETED_TRANSFERS_REMEMBERED_MAX: usize = 16;

/// Catch-up rounds a transfer runs while the tablet still takes writes, before it holds them
/// for the last: each sends what changed during the one before, so the last, which writes wait
/// for, is short unless writes change keys faster than they can be sent.
const CATCH_UP_ROUNDS_WRITABLE: usize = 2;

/// Changed keys few enough to send with writes held at once, without another round while
/// writes go on (about a millisecond of sending at 1 KB objects).
const CATCH_UP_KEYS_TO_HOLD_FOR: usize = 64;

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

/// A transfer into this master as remembered: receiving, or abandoned (the coordinator said
/// it failed, or a recovery of an overlapping range began here), after which none of its
/// batches is taken, its first included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RememberedTransfer {
    transfer: IncomingTransfer,
    abandoned: bool,
}

/// The transfers this master is receiving (or received, or abandoned).
#[derive(Debug, Default)]
pub(crate) struct IncomingTransfers {
    transfers: Mutex<Vec<RememberedTransfer>>,
}

/// Whether `transfer` is the transfer of `table`'s `range` at `assignment_epoch` (the
/// coordinator's name for it; the source's transfer id is not known to the coordinator).
fn names(transfer: &IncomingTransfer, table: TableId, range: HashRange, epoch: u64) -> bool {
    transfer.table == table && transfer.range == range && transfer.assignment_epoch == epoch
}

impl IncomingTransfers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RememberedTransfer>> {
        self.transfers.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Remembers `transfer` as the one for its range, replacing every overlapping one; false
    /// (and nothing changes) if it was abandoned: a late first batch must not start it again.
    pub(crate) fn begin(&self, transfer: IncomingTransfer) -> bool {
        let mut transfers = self.lock();
        let abandoned = transfers.iter().any(|other| {
            other.abandoned
                && names(&other.transfer, transfer.table, transfer.range, transfer.assignment_epoch)
        });
        if abandoned {
            return false;
        }
        transfers.retain(|other| {
            other.transfer.table != transfer.table
                || other.transfer.range.intersection(&transfer.range).is_none()
        });
        remember(&mut transfers, RememberedTransfer { transfer, abandoned: false });
        true
    }

    /// True if `transfer` is the one remembered for its range, and not abandoned.
    pub(crate) fn is_current(&self, transfer: &IncomingTransfer) -> bool {
        let wanted = RememberedTransfer { transfer: *transfer, abandoned: false };
        self.lock().contains(&wanted)
    }

    /// Marks the transfer of `table`'s `range` at `assignment_epoch` abandoned. True if it was
    /// receiving here until now: its copy is this master's to drop. Otherwise (never begun
    /// here, replaced by a later transfer, or abandoned before) it is remembered as abandoned
    /// all the same, so that a batch of it still on its way is refused.
    pub(crate) fn abandon(&self, table: TableId, range: HashRange, assignment_epoch: u64) -> bool {
        let mut transfers = self.lock();
        let named = transfers
            .iter_mut()
            .find(|other| names(&other.transfer, table, range, assignment_epoch));
        match named {
            Some(other) => !std::mem::replace(&mut other.abandoned, true),
            None => {
                let transfer = IncomingTransfer {
                    table,
                    range,
                    assignment_epoch,
                    source: stratus_types::ServerId(0),
                    transfer_id: 0,
                };
                remember(&mut transfers, RememberedTransfer { transfer, abandoned: true });
                false
            }
        }
    }

    /// A recovery of `range` of `table` begins here: every transfer of an overlapping range is
    /// abandoned, so that neither its batches nor an ABANDON_MIGRATION of it touch what the
    /// recovery replays.
    pub(crate) fn supersede_overlapping(&self, table: TableId, range: &HashRange) {
        for other in self.lock().iter_mut() {
            if other.transfer.table == table && other.transfer.range.intersection(range).is_some() {
                other.abandoned = true;
            }
        }
    }
}

/// Adds `transfer`, forgetting one past [`INCOMING_TRANSFERS_REMEMBERED_MAX`]: the oldest
/// abandoned one if there is any (a marker that only refuses late batches), so that a marker
/// does not push out a transfer still receiving; else the oldest.
fn remember(transfers: &mut Vec<RememberedTransfer>, transfer: RememberedTransfer) {
    if transfers.len() >= INCOMING_TRANSFERS_REMEMBERED_MAX {
        let oldest_abandoned = transfers.iter().position(|other| other.abandoned);
        transfers.remove(oldest_abandoned.unwrap_or(0));
    }
    transfers.push(transfer);
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
        prepared_in_range: impl FnOnce() -> bool,
    ) -> Result<TransferStart, AssignmentRefusal> {
        let transfers = self.lock();
        let done = transfers.iter().find(|done| {
            done.table == table && done.range == range && done.assignment_epoch == assignment_epoch
        });
        if let Some(done) = done {
            return Ok(TransferStart::Completed(done.outcome.clone()));
        }
        ownership
            .begin_transfer(table, range, assignment_epoch, prepared_in_range)
            .map(TransferStart::Started)
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
    /// The master's clock: an object expired while the tablet is copied is not sent (and a
    /// key whose object expired is sent as a removal).
    pub(crate) wall_clock: Arc<dyn stratus_env::WallClock>,
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
    fn now(&self) -> stratus_store::WallTime {
        stratus_store::WallTime::from_millis(self.wall_clock.now_millis())
    }

    /// Copies every live object of the tablet to the target; returns the tablet's creation
    /// segment in the target's log and the objects sent. Stops early once the transfer was
    /// ended (a TAKE or DROP of the tablet).
    ///
    /// First the whole tablet is copied while it still takes writes; the writes note the keys
    /// they change. Then, still taking writes, up to [`CATCH_UP_ROUNDS_WRITABLE`] rounds send
    /// the keys noted so far again (each round's notes are what changed during the last), until
    /// few enough remain. Then writes are held (RETRY) and the last notes are sent, so writes
    /// wait only for that last catch-up. A key is sent as its current object, or as a removal
    /// when it no longer exists; the target keeps the newest version of each object, so a key
    /// sent twice is harmless. Past the bounds on noted keys the whole tablet is copied again
    /// (with writes held, when the bound is hit in the last round), the target starting it
    /// afresh.
    pub(crate) async fn send(&self) -> Result<(SegmentId, u64), MigrationFailure> {
        let (mut creation_segment, mut objects_sent) = self.copy_whole_tablet().await?;
        for _ in 0..CATCH_UP_ROUNDS_WRITABLE {
            let changed =
                self.ownership.changed_so_far(self.transfer_id).ok_or_else(transfer_ended)?;
            match changed {
                ChangedDuringCopy::Keys(keys) if keys.len() <= CATCH_UP_KEYS_TO_HOLD_FOR => {
                    // Few enough to send with writes held: put them back in the last round.
                    self.ownership.note_again(self.transfer_id, keys);
                    break;
                }
                ChangedDuringCopy::Keys(keys) => objects_sent += self.catch_up(keys).await?,
                ChangedDuringCopy::TooMany => {
                    let (created, sent) = self.copy_whole_tablet().await?;
                    creation_segment = created;
                    objects_sent += sent;
                }
            }
        }
        let changed = self.ownership.hold_writes(self.transfer_id).ok_or_else(transfer_ended)?;
        match changed {
            ChangedDuringCopy::Keys(keys) => objects_sent += self.catch_up(keys).await?,
            ChangedDuringCopy::TooMany => {
                tracing::info!(table = %self.table, start = self.range.start, "too many keys changed during the copy: copying the tablet again with writes held");
                let (created, sent) = self.copy_whole_tablet().await?;
                creation_segment = created;
                objects_sent += sent;
            }
        }
        self.send_completions().await?;
        Ok((creation_segment, objects_sent))
    }

    /// Sends the unacknowledged results of the tablet's mutations (exactly-once), with writes
    /// held so none is added meanwhile: a retry that reaches the target gets the result the
    /// source answered, instead of applying the mutation again.
    async fn send_completions(&self) -> Result<(), MigrationFailure> {
        let records = self.store.completions_in_range(self.table, self.range);
        if records.is_empty() {
            return Ok(());
        }
        let safe_version = self.store.log().safe_version();
        let count = records.len();
        for chunk in records.chunks(MIGRATION_COMPLETIONS_PER_BATCH_MAX) {
            let completions = chunk
                .iter()
                .map(|record| MigratedCompletion {
                    key_hash: record.key_hash,
                    lease: LeaseId(record.lease_id),
                    rpc: RpcId(record.rpc_id),
                    acknowledged: RpcId(record.acknowledged),
                    version: record.version,
                    integer: record.integer,
                })
                .collect();
            self.send_batch(Vec::new(), Vec::new(), completions, safe_version, false).await?;
        }
        tracing::debug!(table = %self.table, start = self.range.start, count, "sent the tablet's unacknowledged results");
        Ok(())
    }

    /// Sends `keys` again: the current object of each, or the key as a removal when it no
    /// longer exists. Values are read a batch at a time, just before the batch goes, so the
    /// memory a catch-up takes is one batch, however large the changed objects. Returns the
    /// objects sent.
    async fn catch_up(&self, keys: Vec<Vec<u8>>) -> Result<u64, MigrationFailure> {
        let mut objects_sent = 0;
        let mut batch: Vec<EnumeratedObject> = Vec::new();
        let mut batch_bytes = 0;
        let mut removed_keys: Vec<bytes::Bytes> = Vec::new();
        for key in keys {
            let hash = key_hash(self.table, &key);
            let mut value = Vec::new();
            let now = self.now();
            let rules = RejectRules::NONE;
            let Ok(found) =
                self.store.read_located(self.table, &key, hash, &rules, now, &mut value)
            else {
                removed_keys.push(key.into());
                continue;
            };
            let size = key.len() + value.len();
            if !batch.is_empty() && batch_bytes + size > MIGRATION_BATCH_BYTES_MAX {
                objects_sent += batch.len() as u64;
                let safe_version = self.store.log().safe_version();
                let objects = std::mem::take(&mut batch);
                self.send_batch(objects, Vec::new(), Vec::new(), safe_version, false).await?;
                batch_bytes = 0;
            }
            batch_bytes += size;
            batch.push(EnumeratedObject {
                key: key.into(),
                value: value.into(),
                version: found.version,
                expires_at: found.expires_at,
            });
        }
        // Read after every key was looked up: every version removed before a key was found
        // gone is below it (a remove raises the safe version past the removed version). The
        // removed keys are bounded by the notes' key bytes.
        let safe_version = self.store.log().safe_version();
        tracing::debug!(table = %self.table, start = self.range.start, objects = objects_sent + batch.len() as u64, removed = removed_keys.len(), "sent the keys changed during the copy");
        let removals = cut_by_bytes(removed_keys, |key| key.len());
        let mut last_objects = Some(batch).filter(|batch| !batch.is_empty());
        if removals.is_empty() {
            if let Some(objects) = last_objects.take() {
                objects_sent += objects.len() as u64;
                self.send_batch(objects, Vec::new(), Vec::new(), safe_version, false).await?;
            }
        }
        for removed_keys in removals {
            // The last objects ride with the first removals.
            let objects = last_objects.take().unwrap_or_default();
            objects_sent += objects.len() as u64;
            self.send_batch(objects, removed_keys, Vec::new(), safe_version, false).await?;
        }
        Ok(objects_sent)
    }

    /// Sends every live object of the tablet, the first batch starting the tablet afresh on
    /// the target; returns the creation segment that batch made and the objects sent.
    async fn copy_whole_tablet(&self) -> Result<(SegmentId, u64), MigrationFailure> {
        // Every version the tablet holds now, or removed, is below this; versions it hands out
        // later are sent with their objects (the target raises its safe version past each).
        let safe_version: Version = self.store.log().safe_version();
        let mut cursor: (u64, Option<Vec<u8>>) = (0, None);
        let mut creation_segment = None;
        let mut objects_sent = 0u64;
        loop {
            let mut objects = Vec::new();
            let next = self.store.enumerate(
                self.table,
                self.range,
                (cursor.0, cursor.1.as_deref()),
                MIGRATION_BATCH_BYTES_MAX,
                self.now(),
                &mut |key, value, version, expires_at| {
                    objects.push(EnumeratedObject {
                        key: bytes::Bytes::copy_from_slice(key),
                        value: bytes::Bytes::copy_from_slice(value),
                        version,
                        expires_at,
                    })
                },
            );
            // A value on this master's flash that cannot be read ends the migration (the
            // tablet stays here, whole; the durable copies on backups are not affected).
            let next = next.map_err(|error| {
                (crate::service::status_of(error).0, format!("reading the tablet: {error:?}"))
            })?;
            // A stretch of empty buckets: go on (each call scans a bounded number), but always
            // send a first batch, which starts the tablet on the target.
            if !objects.is_empty() || creation_segment.is_none() {
                objects_sent += objects.len() as u64;
                let first = creation_segment.is_none();
                let created =
                    self.send_batch(objects, Vec::new(), Vec::new(), safe_version, first).await?;
                creation_segment.get_or_insert(created);
            } else if !self.ownership.is_frozen_by(self.transfer_id) {
                return Err(transfer_ended());
            }
            match next {
                Some(next) => cursor = next,
                None => break,
            }
        }
        let creation_segment = creation_segment.expect("the first batch was sent");
        Ok((creation_segment, objects_sent))
    }

    /// Sends one batch (RECEIVE_MIGRATION_DATA); returns the tablet's creation segment in the
    /// target's log.
    async fn send_batch(
        &self,
        objects: Vec<EnumeratedObject>,
        removed_keys: Vec<bytes::Bytes>,
        completions: Vec<MigratedCompletion>,
        safe_version: Version,
        first: bool,
    ) -> Result<SegmentId, MigrationFailure> {
        if !self.ownership.is_frozen_by(self.transfer_id) {
            return Err(transfer_ended());
        }
        let request = Request::ReceiveMigrationData {
            table_id: self.table,
            range: self.range,
            assignment_epoch: self.assignment_epoch,
            source: self.source,
            transfer_id: self.transfer_id,
            safe_version,
            first,
            // The source stores the table in the tier the coordinator gave it with the
            // tablet: the target learns it from the first batch, before any object lands.
            tier: self.store.table_tier(self.table),
            objects,
            removed_keys,
            completions,
        };
        match self.pool.call(&self.target_address, &request).await {
            Ok((
                Status::Ok,
                ResponseBody::Operation(Response::ReceiveMigrationData { creation_segment }),
            )) => Ok(creation_segment),
            Ok((status, body)) => {
                let status = if status == Status::Ok { Status::InternalError } else { status };
                Err((status, format!("the target refused a batch: {body:?}")))
            }
            Err(error) => {
                self.pool.forget(&self.target_address);
                Err((Status::Retry, format!("target {}: {error}", self.target_address)))
            }
        }
    }
}

fn transfer_ended() -> MigrationFailure {
    (Status::Retry, "the transfer was ended".to_string())
}

/// `items` cut into batches of at most [`MIGRATION_BATCH_BYTES_MAX`] bytes (as `size` counts
/// them), in order, each with at least one item.
fn cut_by_bytes<T>(items: Vec<T>, size: impl Fn(&T) -> usize) -> Vec<Vec<T>> {
    let mut batches: Vec<Vec<T>> = Vec::new();
    let mut bytes = 0;
    for item in items {
        let item_bytes = size(&item);
        match batches.last_mut() {
            Some(batch) if bytes + item_bytes <= MIGRATION_BATCH_BYTES_MAX => {
                bytes += item_bytes;
                batch.push(item);
            }
            _ => {
                bytes = item_bytes;
                batches.push(vec![item]);
            }
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_types::KeyHash;

    use crate::ownership::WriteRefusal;
    use bytes::{Bytes, BytesMut};
    use stratus_env::{Network, TcpNetwork};
    use stratus_rpc::{Handled, RpcConfig, Service};
    use stratus_store::{Expiry, StoreConfig, WallTime};
    use stratus_wire::{decode_request, encode_response, FrameHeader};

    /// One batch a fake target received: whether it started the tablet, its objects, and its
    /// removed keys.
    type Received = (bool, Vec<(Vec<u8>, Version)>, Vec<Vec<u8>>);

    /// A target that records every batch (and whether the source admitted writes to the
    /// tablet when it arrived) and, on the first, runs `during_copy` (writes a client makes
    /// while the source copies).
    struct RecordingTarget {
        received: Mutex<Vec<Received>>,
        writable_at_each: Mutex<Vec<bool>>,
        during_copy: Box<dyn Fn() + Send + Sync>,
        source_admits_writes: Box<dyn Fn() -> bool + Send + Sync>,
    }

    impl Service for RecordingTarget {
        fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
            let Ok(Request::ReceiveMigrationData { first, objects, removed_keys, .. }) =
                decode_request(header.opcode_code, body)
            else {
                panic!("the source sends only batches");
            };
            let objects = objects.iter().map(|object| (object.key.to_vec(), object.version));
            let removed = removed_keys.iter().map(|key| key.to_vec()).collect();
            let mut received = self.received.lock().unwrap();
            if received.is_empty() {
                (self.during_copy)();
            }
            received.push((first, objects.collect(), removed));
            self.writable_at_each.lock().unwrap().push((self.source_admits_writes)());
            let response = Response::ReceiveMigrationData { creation_segment: SegmentId(40) };
            encode_response(out, header.request_id, Status::Ok, &response);
            Handled::Done
        }
    }

    const TABLE: TableId = TableId(5);

    /// Transfers a tablet of 3 000 objects (several batches) to a recording target, running
    /// `during_copy` with the source store and ownership when the first batch arrives; returns
    /// the batches and, for each, whether the source admitted writes to the tablet then.
    async fn transfer_recording_writability(
        during_copy: impl Fn(&ObjectStore, &TabletOwnership) + Send + Sync + 'static,
    ) -> (Vec<Received>, Vec<bool>, Arc<ObjectStore>, Arc<TabletOwnership>) {
        let store = Arc::new(ObjectStore::new(StoreConfig::for_testing(), ServerId(1)).unwrap());
        let ownership = Arc::new(TabletOwnership::default());
        ownership.take(TABLE, HashRange::FULL, 1).unwrap();
        for index in 0..3_000u32 {
            let key = format!("key-{index}");
            let hash = key_hash(TABLE, key.as_bytes());
            store
                .write(
                    TABLE,
                    key.as_bytes(),
                    hash,
                    &[1; 1_000],
                    &RejectRules::NONE,
                    Expiry::Never,
                    WallTime::from_seconds(1),
                )
                .unwrap();
        }
        let transfer_id = ownership.begin_transfer(TABLE, HashRange::FULL, 2, || false).unwrap();
        let (source, owner) = (store.clone(), ownership.clone());
        let probed = ownership.clone();
        let target = Arc::new(RecordingTarget {
            received: Mutex::new(Vec::new()),
            writable_at_each: Mutex::new(Vec::new()),
            during_copy: Box::new(move || during_copy(&source, &owner)),
            source_admits_writes: Box::new(move || probed.admits_writes(TABLE, KeyHash(1))),
        });
        let listener = TcpNetwork.bind("127.0.0.1:0").await.unwrap();
        let target_address = listener.local_address();
        let server = tokio::spawn(stratus_rpc::serve(listener, target.clone()));
        let transfer = Transfer {
            store: store.clone(),
            wall_clock: Arc::new(stratus_env::SystemWallClock),
            ownership: ownership.clone(),
            pool: Arc::new(ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default())),
            source: ServerId(1),
            transfer_id,
            table: TABLE,
            range: HashRange::FULL,
            assignment_epoch: 2,
            target_address,
        };
        let (creation_segment, _) = transfer.send().await.unwrap();
        assert_eq!(creation_segment, SegmentId(40));
        server.abort();
        let received = std::mem::take(&mut *target.received.lock().unwrap());
        let writable = std::mem::take(&mut *target.writable_at_each.lock().unwrap());
        (received, writable, store, ownership)
    }

    fn client_write(store: &ObjectStore, ownership: &TabletOwnership, key: &[u8]) {
        let hash = key_hash(TABLE, key);
        let write = || {
            store
                .write(
                    TABLE,
                    key,
                    hash,
                    b"new",
                    &RejectRules::NONE,
                    Expiry::Never,
                    WallTime::from_seconds(2),
                )
                .unwrap()
        };
        ownership.while_writable(TABLE, hash, key, write).expect("writes go on during the copy");
    }

    /// Writes during the copy are admitted, and only their keys are sent again at the end
    /// (writes held): current objects with their new versions, and removed keys as removals;
    /// writes are held from then on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_during_the_copy_are_admitted_and_only_their_keys_sent_again() {
        let (received, writable, store, ownership) =
            transfer_recording_writability(|store, ownership| {
                client_write(store, ownership, b"key-5");
                client_write(store, ownership, b"a-new-key");
                let key = b"key-7";
                let hash = key_hash(TABLE, key);
                let remove = || {
                    store
                        .remove(TABLE, key, hash, &RejectRules::NONE, WallTime::from_seconds(2))
                        .unwrap()
                };
                ownership.while_writable(TABLE, hash, key, remove).unwrap();
            })
            .await;
        // Few changed keys: no round while writable; the copy went with writes admitted, the
        // catch-up with writes held.
        assert_eq!(writable.last(), Some(&false));
        assert!(writable[..writable.len() - 1].iter().all(|admitted| *admitted));
        assert!(received.len() >= 3, "several batches: {}", received.len());
        assert!(received[0].0, "the first batch starts the tablet");
        assert!(received[1..].iter().all(|(first, ..)| !first), "no second copy");
        let copied: usize =
            received[..received.len() - 1].iter().map(|(_, objects, _)| objects.len()).sum();
        assert!((3_000..=3_001).contains(&copied), "the copy saw each object once: {copied}");
        let (_, last, removed) = received.last().unwrap();
        let version_of = |key: &[u8]| {
            store.read(
                TABLE,
                key,
                key_hash(TABLE, key),
                &RejectRules::NONE,
                WallTime::from_seconds(0),
                &mut Vec::new(),
            )
        };
        let expected: Vec<(Vec<u8>, Version)> = [&b"a-new-key"[..], b"key-5"]
            .iter()
            .map(|key| (key.to_vec(), version_of(key).unwrap()))
            .collect();
        assert_eq!(last, &expected, "the catch-up carries exactly the changed objects");
        assert_eq!(removed, &vec![b"key-7".to_vec()], "and the removed key");
        let hash = key_hash(TABLE, b"key-9");
        assert_eq!(
            ownership.while_writable(TABLE, hash, b"key-9", || ()),
            Err(WriteRefusal::Frozen),
            "writes are held until the transfer ends"
        );
    }

    /// Many keys changed during the copy are sent in a round while writes still go on; the
    /// round with writes held then has nothing left to send.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_changed_keys_are_sent_while_writes_still_go_on() {
        let changed = CATCH_UP_KEYS_TO_HOLD_FOR + 36;
        let (received, writable, _, ownership) =
            transfer_recording_writability(move |store, ownership| {
                for index in 0..changed {
                    client_write(store, ownership, format!("key-{index}").as_bytes());
                }
            })
            .await;
        let (first, objects, removed) = received.last().unwrap();
        assert!(!first && removed.is_empty());
        assert_eq!(objects.len(), changed, "one round carried every changed key");
        assert!(writable.iter().all(|admitted| *admitted), "every batch went while writable");
        let hash = key_hash(TABLE, b"key-9");
        assert_eq!(
            ownership.while_writable(TABLE, hash, b"key-9", || ()),
            Err(WriteRefusal::Frozen)
        );
    }

    /// Removed keys are cut by bytes, in order, never into an empty batch.
    #[test]
    fn removed_keys_are_cut_within_the_batch_bound() {
        let half = MIGRATION_BATCH_BYTES_MAX / 2;
        let sizes = vec![half, half, MIGRATION_BATCH_BYTES_MAX + 5, 1, 2];
        let batches = cut_by_bytes(sizes, |size| *size);
        assert_eq!(
            batches,
            vec![vec![half, half], vec![MIGRATION_BATCH_BYTES_MAX + 5], vec![1, 2]]
        );
        assert!(cut_by_bytes(Vec::<usize>::new(), |size| *size).is_empty());
    }

    #[test]
    fn a_transfer_asked_again_is_in_progress_while_running_and_gets_its_outcome_once_ended() {
        let ownership = TabletOwnership::default();
        let completed = CompletedTransfers::default();
        let (table, range) = (TableId(1), HashRange::FULL);
        ownership.take(table, range, 1).unwrap();
        let start = |epoch| completed.outcome_or_freeze(&ownership, table, range, epoch, || false);
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
        assert!(incoming.begin(first));
        assert!(incoming.is_current(&first));
        let second = IncomingTransfer { range: HashRange::new(50, 150).unwrap(), ..first };
        assert!(incoming.begin(second));
        assert!(!incoming.is_current(&first), "a late batch of the first is refused");
        assert!(incoming.is_current(&second));
        let other_table = IncomingTransfer { table: TableId(2), ..first };
        assert!(incoming.begin(other_table));
        assert!(incoming.is_current(&second) && incoming.is_current(&other_table));
        for transfer_id in 1..=INCOMING_TRANSFERS_REMEMBERED_MAX as u64 {
            let range = HashRange::new(1_000 * transfer_id, 1_000 * transfer_id + 1).unwrap();
            incoming.begin(IncomingTransfer { range, transfer_id, ..first });
        }
        assert!(!incoming.is_current(&second), "the oldest is forgotten first");
    }

    fn transfer_of(range: HashRange, assignment_epoch: u64) -> IncomingTransfer {
        IncomingTransfer {
            table: TableId(1),
            range,
            assignment_epoch,
            source: ServerId(3),
            transfer_id: 7,
        }
    }

    #[test]
    fn an_abandoned_transfer_takes_no_batch_and_is_dropped_once() {
        let incoming = IncomingTransfers::default();
        let range = HashRange::new(0, 99).unwrap();
        let transfer = transfer_of(range, 4);
        assert!(incoming.begin(transfer));
        // Another epoch or range names another transfer.
        assert!(!incoming.abandon(TableId(1), range, 5));
        assert!(!incoming.abandon(TableId(1), HashRange::new(0, 98).unwrap(), 4));
        assert!(incoming.is_current(&transfer));
        assert!(incoming.abandon(TableId(1), range, 4), "its copy is to be dropped");
        assert!(!incoming.is_current(&transfer), "later batches are refused");
        assert!(!incoming.begin(transfer), "a late first batch does not start it again");
        assert!(!incoming.abandon(TableId(1), range, 4), "dropped once only");
        // A later transfer of the range starts as usual.
        let later = transfer_of(range, 6);
        assert!(incoming.begin(later) && incoming.is_current(&later));
    }

    #[test]
    fn a_transfer_abandoned_before_its_first_batch_never_starts() {
        let incoming = IncomingTransfers::default();
        let range = HashRange::new(10, 20).unwrap();
        assert!(!incoming.abandon(TableId(1), range, 4), "nothing here to drop");
        assert!(!incoming.begin(transfer_of(range, 4)));
    }

    #[test]
    fn markers_of_abandoned_transfers_do_not_push_out_one_still_receiving() {
        let incoming = IncomingTransfers::default();
        let receiving = transfer_of(HashRange::new(0, 0).unwrap(), 1);
        assert!(incoming.begin(receiving));
        for epoch in 0..2 * INCOMING_TRANSFERS_REMEMBERED_MAX as u64 {
            let range = HashRange::new(10 + epoch, 10 + epoch).unwrap();
            incoming.abandon(TableId(1), range, 100 + epoch);
        }
        assert_eq!(incoming.lock().len(), INCOMING_TRANSFERS_REMEMBERED_MAX, "bounded");
        assert!(incoming.is_current(&receiving));
    }

    #[test]
    fn a_recovery_of_an_overlapping_range_supersedes_a_transfer() {
        let incoming = IncomingTransfers::default();
        let range = HashRange::new(0, 99).unwrap();
        let transfer = transfer_of(range, 4);
        let elsewhere = transfer_of(HashRange::new(200, 300).unwrap(), 5);
        assert!(incoming.begin(transfer) && incoming.begin(elsewhere));
        incoming.supersede_overlapping(TableId(1), &HashRange::new(50, 60).unwrap());
        assert!(!incoming.is_current(&transfer), "its batches are refused");
        assert!(!incoming.abandon(TableId(1), range, 4), "its ABANDON drops nothing");
        assert!(incoming.is_current(&elsewhere), "a transfer of another range goes on");
    }
}
