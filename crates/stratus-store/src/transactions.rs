//! A participant's side of multi-object transactions (docs/design/transactions.md): prepare
//! an operation (lock its object at the version the transaction read, durably), validate a
//! read-only transaction's read, and apply a decision.
//!
//! Every step runs under the key's bucket lock, as single-object operations do, and every
//! answer is recorded before it is given, so a retried request gets the first answer:
//! - a PREPARED vote is the PREPARED entry itself (the prepared table names it while the
//!   operation waits for its decision);
//! - an ABORT vote is a COMPLETION entry of the operation's rpc id whose integer is the vote;
//! - a decision appends the operation's effect (the object or its tombstone), a
//!   PREPARED_TOMBSTONE for the PREPARED entry and a COMPLETION entry of the vote, in one
//!   append, so a duplicate PREPARE arriving after the decision finds the vote and locks
//!   nothing.
//!
//! An ABORT decision for an operation that was never prepared here records an ABORT vote too:
//! a PREPARE still in flight that arrives after it must not lock the object for a
//! transaction that is over.

use stratus_log::format::{
    decode_prepared_unverified, PreparedTombstoneRecord, PreparedView, TxParticipant,
    TxParticipantsRecord,
};
use stratus_log::{AppendEntry, AppendPriority, EntryType};
use stratus_types::{KeyHash, RpcId, RpcIdentity, TableId, TxDecision, TxOpKind, TxVote, Version};

use crate::completions::{self, CompletionResult};
use crate::prepared::{PreparedOp, TransactionRecord, TransactionToFinish};
use crate::{
    append_error, live, live_version, CompletionDraft, NewObject, ObjectError, ObjectStore,
    WallTime,
};

/// One operation of a transaction, as a participant prepares it.
#[derive(Clone, Copy, Debug)]
pub struct TxPrepareOp<'a> {
    /// The object's table.
    pub table: TableId,
    /// The object's key.
    pub key: &'a [u8],
    /// The key's hash.
    pub hash: KeyHash,
    /// The operation's exactly-once identity (its own rpc id).
    pub rpc: RpcIdentity,
    /// The transaction: the rpc id of its first operation, under the same lease.
    pub transaction: RpcId,
    /// What the operation does.
    pub kind: TxOpKind,
    /// The version the transaction read (0: absent).
    pub version_read: Version,
    /// A WRITE's new value; empty otherwise.
    pub value: &'a [u8],
    /// Every operation of the transaction, on every master (this one among them): kept while
    /// any of its operations is prepared here, so this master can finish the transaction if
    /// its client does not.
    pub participants: &'a [TxParticipant],
}

/// A participant's vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxVoted {
    /// The vote.
    pub vote: TxVote,
    /// The object's version as the participant saw it (the version read for a PREPARED vote).
    pub version: Version,
    /// True when the vote was recorded earlier and is answered again.
    pub repeated: bool,
}

/// What a decision did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxDecided {
    /// The operation was prepared here: its decision is applied and its lock released.
    Applied,
    /// Decided before (a retried decision): nothing to do.
    AlreadyDecided,
    /// Nothing was prepared here (an operation whose vote was ABORT, or never arrived); an
    /// ABORT decision recorded the operation as aborted.
    NothingPrepared,
}

/// The integer a COMPLETION entry of a transaction operation holds: the vote's code.
fn vote_result(vote: TxVote, version: Version) -> CompletionResult {
    CompletionResult { version, integer: Some(i64::from(vote.code())) }
}

/// The vote a COMPLETION entry of a transaction operation recorded. A record without a vote
/// means the client used the rpc id for another mutation: the safe answer is ABORT.
fn recorded_vote(result: CompletionResult) -> TxVote {
    result
        .integer
        .and_then(|code| u8::try_from(code).ok())
        .and_then(TxVote::from_code)
        .unwrap_or(TxVote::Abort)
}

impl ObjectStore {
    /// Prepares `op` at `now`: votes PREPARED, with the object locked for the transaction and a
    /// PREPARED entry appended, when the object is unlocked and still at the version read;
    /// votes ABORT otherwise, recording the vote. A retried operation gets its first vote
    /// again. The master answers only once the appended entries are durable.
    pub fn prepare(&self, op: &TxPrepareOp<'_>, now: WallTime) -> Result<TxVoted, ObjectError> {
        Self::check_key(op.key)?;
        assert!(
            op.kind == TxOpKind::Write || op.value.is_empty(),
            "a value on a transaction operation that writes none (the wire refuses it)"
        );
        if op.value.len() > self.config.value_bytes_max as usize {
            return Err(ObjectError::ValueTooLarge);
        }
        let rpc = op.rpc;
        if rpc.validate().is_err() || op.transaction.0 == 0 || op.transaction > rpc.rpc {
            return Err(ObjectError::InvalidRpcIdentity);
        }
        self.log.observe_time(now.seconds());
        let epoch = self.log.pin();
        let guard = self.index.lock(op.hash.0);
        if let Some(prepared) = self.prepared.get((rpc.lease, rpc.rpc)) {
            let version = prepared.version_read;
            return Ok(TxVoted { vote: TxVote::Prepared, version, repeated: true });
        }
        let mut free = |reference| self.log.free(&epoch, reference);
        match self.completions.check(&rpc, (op.table, op.hash.0), &mut free) {
            Ok(completions::Check::New) => {}
            Ok(completions::Check::Completed(result)) => {
                let vote = recorded_vote(result);
                return Ok(TxVoted { vote, version: result.version, repeated: true });
            }
            Err(completions::CheckError::Stale) => return Err(ObjectError::StaleRpc),
            Err(completions::CheckError::TooManyUnacknowledged) => {
                return Err(ObjectError::TooManyUnacknowledged)
            }
            Err(completions::CheckError::OtherObject) => {
                return Err(ObjectError::InvalidRpcIdentity)
            }
        }
        let current = self.lookup(&epoch, &guard, op.table, op.key);
        let version = live_version(current.as_ref(), now);
        if self.prepared.holder(op.table, op.key).is_some() || version != op.version_read {
            let draft = CompletionDraft { rpc, key_hash: op.hash.0 };
            let result = vote_result(TxVote::Abort, version);
            let content = draft.record(op.table, result).encode();
            let entry = AppendEntry::new(EntryType::Completion, content.as_bytes());
            let appended =
                self.log.append(&[entry], AppendPriority::Normal).map_err(append_error)?;
            let recorded = (appended.references[0], entry.entry_bytes() as u64);
            self.completions.record(&rpc, (op.table, op.hash.0), result, recorded, &mut free);
            return Ok(TxVoted { vote: TxVote::Abort, version, repeated: false });
        }
        let listed = op.participants.iter().any(|participant| {
            (participant.table, participant.key_hash, participant.rpc_id)
                == (op.table, op.hash.0, rpc.rpc.0)
        });
        if !listed {
            return Err(ObjectError::NotAParticipant);
        }
        let content = PreparedView {
            table: op.table,
            key_hash: op.hash.0,
            lease_id: rpc.lease.0,
            rpc_id: rpc.rpc.0,
            acknowledged: rpc.acknowledged.0,
            transaction: op.transaction.0,
            kind: op.kind,
            version_read: op.version_read,
            key: op.key,
            value: op.value,
        }
        .encode();
        // The transaction's first operation here brings its participant list, in the same
        // append: a replica never holds a PREPARED entry without the list.
        let transaction_key = (rpc.lease, op.transaction);
        let participants = (!self.prepared.knows_transaction(transaction_key)).then(|| {
            TxParticipantsRecord {
                lease_id: rpc.lease.0,
                transaction: op.transaction.0,
                participants: op.participants.to_vec(),
            }
            .encode()
        });
        let mut entries = vec![AppendEntry::new(EntryType::Prepared, &content)];
        if let Some(participants) = &participants {
            entries.push(AppendEntry::new(EntryType::TxParticipants, participants));
        }
        let appended = self.log.append(&entries, AppendPriority::Normal).map_err(append_error)?;
        let record = participants.as_ref().map(|_| {
            let entry = (appended.references[1], entries[1].entry_bytes() as u64);
            TransactionRecord::new(op.participants.to_vec(), entry, now.millis())
        });
        self.prepared.insert(
            (rpc.lease, rpc.rpc),
            PreparedOp {
                table: op.table,
                key: op.key.into(),
                key_hash: op.hash.0,
                kind: op.kind,
                version_read: op.version_read,
                transaction: op.transaction,
                reference: appended.references[0],
                entry_bytes: entries[0].entry_bytes() as u64,
            },
            record,
        );
        drop(guard);
        Ok(TxVoted { vote: TxVote::Prepared, version, repeated: false })
    }

    /// Validates one read of a read-only transaction at `now`: PREPARED when the object is
    /// unlocked and still at `version_read` (0: still absent), ABORT otherwise. Locks and logs
    /// nothing.
    pub fn validate_read(
        &self,
        (table, key, hash): (TableId, &[u8], KeyHash),
        version_read: Version,
        now: WallTime,
    ) -> Result<TxVoted, ObjectError> {
        Self::check_key(key)?;
        let epoch = self.log.pin();
        let guard = self.index.lock(hash.0);
        let current = self.lookup(&epoch, &guard, table, key);
        let version = live_version(current.as_ref(), now);
        // Unlocked matters: a locked object may belong to a transaction that is committed but
        // not applied here yet, whose write a later reader must see.
        let unchanged = version == version_read && self.prepared.holder(table, key).is_none();
        let vote = if unchanged { TxVote::Prepared } else { TxVote::Abort };
        Ok(TxVoted { vote, version, repeated: false })
    }

    /// Applies `decision` to the operation `rpc` on (`table`, `key`) at `now`: on COMMIT its
    /// effect (a WRITE's object, a REMOVE's tombstone, nothing for a READ), then in every case
    /// the PREPARED entry's tombstone and the vote's record, in one append, and the lock
    /// released. Idempotent.
    pub fn decide(
        &self,
        (table, hash): (TableId, KeyHash),
        rpc: RpcIdentity,
        decision: TxDecision,
        now: WallTime,
    ) -> Result<TxDecided, ObjectError> {
        if rpc.validate().is_err() {
            return Err(ObjectError::InvalidRpcIdentity);
        }
        self.log.observe_time(now.seconds());
        let epoch = self.log.pin();
        let mut guard = self.index.lock(hash.0);
        let mut free = |reference| self.log.free(&epoch, reference);
        let draft = CompletionDraft { rpc, key_hash: hash.0 };
        let Some(prepared) = self.prepared.get((rpc.lease, rpc.rpc)) else {
            return match self.completions.check(&rpc, (table, hash.0), &mut free) {
                Ok(completions::Check::Completed(_)) | Err(completions::CheckError::Stale) => {
                    Ok(TxDecided::AlreadyDecided)
                }
                Err(completions::CheckError::TooManyUnacknowledged) => {
                    Err(ObjectError::TooManyUnacknowledged)
                }
                Err(completions::CheckError::OtherObject) => Err(ObjectError::InvalidRpcIdentity),
                Ok(completions::Check::New) if decision == TxDecision::Commit => {
                    // Every operation of a committed transaction voted PREPARED, durably, so
                    // one that is neither prepared nor recorded here was decided and
                    // acknowledged already.
                    Ok(TxDecided::AlreadyDecided)
                }
                Ok(completions::Check::New) => {
                    self.record_abort_vote((table, hash), rpc, &mut free)?;
                    Ok(TxDecided::NothingPrepared)
                }
            };
        };
        if prepared.table != table || prepared.key_hash != hash.0 {
            // The client named another object for this rpc id than it prepared.
            return Err(ObjectError::InvalidRpcIdentity);
        }
        let key: &[u8] = &prepared.key;
        let decided = PreparedTombstoneRecord {
            table,
            key_hash: hash.0,
            lease_id: rpc.lease.0,
            rpc_id: rpc.rpc.0,
            segment_id: self.log.segment_of(prepared.reference),
        }
        .encode();
        let current = self.lookup(&epoch, &guard, table, key);
        let current_version = live_version(current.as_ref(), now);
        // The lock kept every other writer out since the vote, and only expiry changes an
        // object by itself.
        assert!(
            current_version == prepared.version_read || current_version == Version::NONEXISTENT,
            "a prepared object changed under its lock"
        );
        let write = match (decision, prepared.kind) {
            (TxDecision::Commit, TxOpKind::Write) => {
                let (_, content) = self.log.entry(&epoch, prepared.reference);
                let view = decode_prepared_unverified(&content).expect("corrupt prepared entry");
                Some(view.value.to_vec())
            }
            _ => None,
        };
        let completion = match (decision, prepared.kind, write) {
            (TxDecision::Commit, TxOpKind::Write, Some(value)) => {
                let kept = live(current.as_ref(), now).and_then(|current| current.expires_at);
                let new = NewObject {
                    table,
                    key,
                    value: &value,
                    expires_at: kept,
                    timestamp: now.seconds(),
                };
                let version = match &current {
                    Some(current) => Version(current.version.0 + 1),
                    None => self.log.allocate_version(),
                };
                let integer = Some(i64::from(TxVote::Prepared.code()));
                let recording = (Some(draft), integer);
                let (_, entry) = self.store_version(
                    &epoch,
                    &mut guard,
                    current,
                    new,
                    version,
                    recording,
                    Some(&decided),
                )?;
                let result = vote_result(TxVote::Prepared, version);
                entry.map(|entry| (result, entry))
            }
            (TxDecision::Commit, TxOpKind::Remove, _) if current.is_some() => {
                let current = current.expect("checked above");
                let result = vote_result(TxVote::Prepared, current_version);
                let entry = self.remove_current(
                    &epoch,
                    &mut guard,
                    current,
                    (table, key),
                    now,
                    Some((draft, result)),
                    Some(&decided),
                )?;
                entry.map(|entry| (result, entry))
            }
            _ => {
                // A READ, a REMOVE of an absent object, or an ABORT: nothing changes but the
                // lock and the record.
                let result = vote_result(TxVote::Prepared, current_version);
                let content = draft.record(table, result).encode();
                let entries = [
                    AppendEntry::new(EntryType::PreparedTombstone, &decided),
                    AppendEntry::new(EntryType::Completion, content.as_bytes()),
                ];
                let appended = self
                    .log
                    .append(&entries, AppendPriority::MayUseReserve)
                    .map_err(append_error)?;
                Some((result, (appended.references[1], entries[1].entry_bytes() as u64)))
            }
        };
        let (released, finished) =
            self.prepared.remove((rpc.lease, rpc.rpc)).expect("held under the lock");
        free(released.reference);
        if let Some(transaction) = finished {
            free(transaction.reference);
        }
        if let Some((result, entry)) = completion {
            self.completions.record(&rpc, (table, hash.0), result, entry, &mut free);
        }
        drop(guard);
        Ok(TxDecided::Applied)
    }

    /// Appends and keeps the vote ABORT for `rpc`, an operation on (`table`, `hash`) that was
    /// never prepared here: whatever arrives for it later (a PREPARE still in flight) gets that
    /// vote. The caller holds the key's bucket lock and found no record of the operation.
    fn record_abort_vote(
        &self,
        (table, hash): (TableId, KeyHash),
        rpc: RpcIdentity,
        free: &mut crate::completions::FreeEntry<'_>,
    ) -> Result<(), ObjectError> {
        // The version is for information only; with no key at hand it is not looked up.
        let result = vote_result(TxVote::Abort, Version::NONEXISTENT);
        let draft = CompletionDraft { rpc, key_hash: hash.0 };
        let content = draft.record(table, result).encode();
        let entry = AppendEntry::new(EntryType::Completion, content.as_bytes());
        let appended =
            self.log.append(&[entry], AppendPriority::MayUseReserve).map_err(append_error)?;
        let recorded = (appended.references[0], entry.entry_bytes() as u64);
        self.completions.record(&rpc, (table, hash.0), result, recorded, free);
        Ok(())
    }

    /// Makes the vote of operation `rpc` on (`table`, `hash`) final and returns it (a
    /// participant finishing a transaction whose client is gone asks every operation this):
    /// PREPARED if it is prepared here, or was and is decided; its recorded vote if it has one;
    /// otherwise ABORT, recorded first, so a PREPARE arriving later votes ABORT too. An
    /// operation its client acknowledged already was decided long ago: ABORT, recording
    /// nothing (its client acknowledges only once every operation has its decision, so no
    /// recovery asks about it while another operation of its transaction is prepared).
    pub fn request_abort(
        &self,
        (table, hash): (TableId, KeyHash),
        rpc: RpcIdentity,
        now: WallTime,
    ) -> Result<TxVoted, ObjectError> {
        if rpc.validate().is_err() {
            return Err(ObjectError::InvalidRpcIdentity);
        }
        self.log.observe_time(now.seconds());
        let epoch = self.log.pin();
        let _guard = self.index.lock(hash.0);
        if let Some(prepared) = self.prepared.get((rpc.lease, rpc.rpc)) {
            let version = prepared.version_read;
            return Ok(TxVoted { vote: TxVote::Prepared, version, repeated: true });
        }
        let mut free = |reference| self.log.free(&epoch, reference);
        let aborted =
            TxVoted { vote: TxVote::Abort, version: Version::NONEXISTENT, repeated: true };
        match self.completions.check(&rpc, (table, hash.0), &mut free) {
            Ok(completions::Check::Completed(result)) => {
                Ok(TxVoted { vote: recorded_vote(result), version: result.version, repeated: true })
            }
            Err(completions::CheckError::Stale) => Ok(aborted),
            Err(completions::CheckError::TooManyUnacknowledged) => {
                Err(ObjectError::TooManyUnacknowledged)
            }
            Err(completions::CheckError::OtherObject) => Err(ObjectError::InvalidRpcIdentity),
            Ok(completions::Check::New) => {
                self.record_abort_vote((table, hash), rpc, &mut free)?;
                Ok(TxVoted { repeated: false, ..aborted })
            }
        }
    }

    /// The transactions with operations prepared here that this master should finish now,
    /// their clients not having decided them in time (at most `limit`; each is due again
    /// later, less and less often, until its operations here are decided).
    pub fn transactions_to_finish(&self, now: WallTime, limit: usize) -> Vec<TransactionToFinish> {
        self.prepared.due_for_recovery(now.millis(), limit)
    }

    /// Whether an operation on an object of `table` whose key hash lies in `range` is prepared
    /// (a migration of the range waits until none is).
    pub fn has_prepared_in_range(&self, table: TableId, range: stratus_types::HashRange) -> bool {
        self.prepared.any_in_range(table, range)
    }

    /// The prepared operations and their log bytes, for metrics.
    pub fn prepared_statistics(&self) -> crate::PreparedStatistics {
        self.prepared.statistics()
    }
}

impl ObjectStore {
    /// Appends a PREPARED entry from a replayed log (`content`, verified) where `into` says,
    /// and locks its object again, unless the operation is prepared here already or this store
    /// holds its decided vote. `participants` is the content of the transaction's
    /// TX_PARTICIPANTS entry from the same log, appended too when the transaction has no
    /// record here yet; its recovery delay starts at `now`. Returns whether it was kept.
    pub(crate) fn import_prepared(
        &self,
        content: &[u8],
        participants: Option<&[u8]>,
        now: WallTime,
        into: &mut crate::ReplayInto<'_>,
    ) -> Result<bool, ObjectError> {
        let view = decode_prepared_unverified(content).expect("verified by the replay");
        let rpc = RpcIdentity {
            lease: stratus_types::LeaseId(view.lease_id),
            rpc: RpcId(view.rpc_id),
            acknowledged: RpcId(view.acknowledged),
        };
        let epoch = self.log.pin();
        let _guard = self.index.lock(view.key_hash);
        if self.prepared.get((rpc.lease, rpc.rpc)).is_some() {
            return Ok(false);
        }
        let mut free = |reference| self.log.free(&epoch, reference);
        match self.completions.check(&rpc, (view.table, view.key_hash), &mut free) {
            // A result of another object under this id cannot have been recorded before the
            // operation was prepared (its PREPARE would have been refused): the lock is kept.
            Ok(completions::Check::New)
            | Err(completions::CheckError::TooManyUnacknowledged)
            | Err(completions::CheckError::OtherObject) => {}
            // Decided here already, or acknowledged by its client: the decision was applied.
            Ok(completions::Check::Completed(_)) | Err(completions::CheckError::Stale) => {
                return Ok(false)
            }
        }
        if let Some(holder) = self.prepared.holder(view.table, view.key) {
            // Two undecided operations on one object cannot both have been prepared: the
            // replayed log is not one this store can hold.
            panic!("replayed prepared operation {rpc:?} on an object {holder:?} locks");
        }
        let transaction_key = (rpc.lease, RpcId(view.transaction));
        let participants = match participants {
            _ if self.prepared.knows_transaction(transaction_key) => None,
            Some(participants) => Some(participants),
            // Appended in the same append as the transaction's first PREPARED entry on the
            // crashed master, and kept while any of its operations was prepared there.
            None => panic!("replayed prepared operation {rpc:?} without its transaction's list"),
        };
        let mut entries = vec![AppendEntry::new(EntryType::Prepared, content)];
        if let Some(participants) = participants {
            entries.push(AppendEntry::new(EntryType::TxParticipants, participants));
        }
        let mut references = Vec::with_capacity(2);
        for entry in &entries {
            references.push(match into {
                crate::ReplayInto::Head => {
                    let appended =
                        self.log.append(&[*entry], AppendPriority::Normal).map_err(append_error)?;
                    appended.references[0]
                }
                crate::ReplayInto::SideLog { side_log, closed } => {
                    let (reference, full) =
                        side_log.append(&self.log, entry).map_err(append_error)?;
                    if let Some(full) = full {
                        closed(full);
                    }
                    reference
                }
            });
        }
        let record = participants.map(|participants| {
            let listed = stratus_log::format::decode_tx_participants_unverified(participants)
                .expect("verified by the replay");
            let entry = (references[1], entries[1].entry_bytes() as u64);
            TransactionRecord::new(listed.participants, entry, now.millis())
        });
        let reference = references[0];
        let entry = entries[0];
        self.prepared.insert(
            (rpc.lease, rpc.rpc),
            PreparedOp {
                table: view.table,
                key: view.key.into(),
                key_hash: view.key_hash,
                kind: view.kind,
                version_read: view.version_read,
                transaction: RpcId(view.transaction),
                reference,
                entry_bytes: entry.entry_bytes() as u64,
            },
            record,
        );
        Ok(true)
    }
}
