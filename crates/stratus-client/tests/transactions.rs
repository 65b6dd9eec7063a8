//! Transactions against model masters: each keeps objects with versions, locks and votes as
//! docs/design/transactions.md says a participant does (in memory, no log), so the client's
//! side of the protocol is checked over the wire: what it prepares, what it decides, whom it
//! tells, and what it reports, on one master and across two.

mod scripted;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use scripted::{serve, TABLE};
use stratus_client::{
    AbortReason, BlockingClient, Client, ClientConfig, Status, TableId, TxOutcome,
};
use stratus_rpc::{Handled, Service};
use stratus_types::{
    key_hash, HashRange, LeaseId, RpcId, ServerId, TabletState, TxDecision, TxOpKind, TxVote,
    Version,
};
use stratus_wire::{
    decode_request, encode_error_response, encode_response, FrameHeader, Opcode, ReadItemResult,
    Request, Response, TabletEntry, TxDecisionOp, TxOp, TxVoteItem,
};

/// How long a test waits for a committed transaction's decision to reach the masters.
const SETTLE_PATIENCE: Duration = Duration::from_secs(10);

/// How a model master misbehaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Fault {
    #[default]
    None,
    /// Leaves every TX_PREPARE unanswered (and unapplied).
    MutePrepares,
    /// Applies every TX_PREPARE but leaves it unanswered (the answer is lost).
    LosePrepareAnswers,
    /// Leaves every TX_DECISION unanswered (and unapplied).
    MuteDecisions,
    /// Leaves every TX_PREPARE, TX_REQUEST_ABORT and TX_DECISION unanswered (and unapplied).
    MuteTransactions,
}

/// A participant's state, in memory.
#[derive(Debug)]
struct Model {
    objects: BTreeMap<Bytes, (Bytes, Version)>,
    next_version: u64,
    /// Key → the transaction holding it.
    locks: BTreeMap<Bytes, (LeaseId, RpcId)>,
    /// Each op's recorded vote (its RIFL result), by (lease, rpc id).
    votes: BTreeMap<(LeaseId, RpcId), TxVote>,
    /// Each prepared op, until its decision.
    prepared: BTreeMap<(LeaseId, RpcId), TxOp>,
    /// The transaction requests it received.
    requests: Vec<Request>,
    /// The opcodes of the read requests it received.
    reads: Vec<Opcode>,
    fault: Fault,
    value_bytes_max: usize,
}

impl Model {
    fn new() -> Model {
        Model {
            objects: BTreeMap::new(),
            next_version: 10,
            locks: BTreeMap::new(),
            votes: BTreeMap::new(),
            prepared: BTreeMap::new(),
            requests: Vec::new(),
            reads: Vec::new(),
            fault: Fault::None,
            value_bytes_max: 1 << 20,
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) {
        self.next_version += 1;
        let version = Version(self.next_version);
        self.objects.insert(Bytes::copy_from_slice(key), (Bytes::copy_from_slice(value), version));
    }

    fn version(&self, key: &[u8]) -> Version {
        self.objects.get(key).map_or(Version::NONEXISTENT, |(_, version)| *version)
    }

    fn integer(&self, key: &[u8]) -> i64 {
        let (value, _) = &self.objects[key];
        i64::from_le_bytes(value[..].try_into().unwrap())
    }

    fn read(&self, key: &Bytes) -> (Status, Version, Bytes) {
        if self.locks.contains_key(key) {
            return (Status::Retry, Version::NONEXISTENT, Bytes::new());
        }
        match self.objects.get(key) {
            Some((value, version)) => (Status::Ok, *version, value.clone()),
            None => (Status::ObjectDoesntExist, Version::NONEXISTENT, Bytes::new()),
        }
    }

    fn prepare(&mut self, owner: (LeaseId, RpcId), validate_only: bool, op: &TxOp) -> TxVoteItem {
        let version = self.version(&op.key);
        let vote = |vote| TxVoteItem { status: Status::Ok, vote, version };
        if validate_only {
            let unchanged = !self.locks.contains_key(&op.key) && version == op.version_read;
            return vote(if unchanged { TxVote::Prepared } else { TxVote::Abort });
        }
        if op.value.len() > self.value_bytes_max {
            return TxVoteItem { status: Status::ValueTooLarge, vote: TxVote::Abort, version };
        }
        let identity = (owner.0, op.rpc);
        if let Some(recorded) = self.votes.get(&identity) {
            return vote(*recorded);
        }
        let free = self.locks.get(&op.key).is_none_or(|holder| *holder == owner);
        let decided = if free && version == op.version_read {
            self.locks.insert(op.key.clone(), owner);
            self.prepared.insert(identity, op.clone());
            TxVote::Prepared
        } else {
            TxVote::Abort
        };
        self.votes.insert(identity, decided);
        vote(decided)
    }

    /// TX_REQUEST_ABORT of one op: its vote, made final (recorded ABORT if it had none).
    fn request_abort(&mut self, lease: LeaseId, op: &TxDecisionOp) -> TxVoteItem {
        let identity = (lease, op.rpc);
        let vote = match self.prepared.contains_key(&identity) {
            true => TxVote::Prepared,
            false => *self.votes.entry(identity).or_insert(TxVote::Abort),
        };
        TxVoteItem { status: Status::Ok, vote, version: Version::NONEXISTENT }
    }

    fn decide(&mut self, lease: LeaseId, decision: TxDecision, op: &TxDecisionOp) -> Status {
        let identity = (lease, op.rpc);
        if let Some(prepared) = self.prepared.remove(&identity) {
            self.locks.remove(&prepared.key);
            if decision == TxDecision::Commit {
                match prepared.kind {
                    TxOpKind::Write => self.put(&prepared.key, &prepared.value),
                    TxOpKind::Remove => drop(self.objects.remove(&prepared.key)),
                    TxOpKind::Read => {}
                }
            }
        } else if decision == TxDecision::Abort {
            self.votes.entry(identity).or_insert(TxVote::Abort);
        }
        Status::Ok
    }

    /// The answer to `request`; `None` to leave it unanswered.
    fn answer(&mut self, request: &Request) -> Option<(Status, Response)> {
        let response = match request {
            Request::Read { key, .. } => {
                self.reads.push(Opcode::Read);
                let (status, version, value) = self.read(key);
                return Some((status, Response::Read { version, value, expires_in_millis: 0 }));
            }
            Request::MultiRead { items } => {
                self.reads.push(Opcode::MultiRead);
                Response::MultiRead {
                    results: items
                        .iter()
                        .map(|item| {
                            let (status, version, value) = self.read(&item.key);
                            ReadItemResult { status, version, value }
                        })
                        .collect(),
                }
            }
            Request::TxPrepare { lease, transaction, validate_only, ops, participants, .. } => {
                self.requests.push(request.clone());
                if matches!(self.fault, Fault::MutePrepares | Fault::MuteTransactions) {
                    return None;
                }
                // Every op of a prepare is among its participants (the master checks).
                let listed = |op: &TxOp| {
                    let hash = key_hash(TABLE, &op.key).0;
                    participants.iter().any(|p| p.rpc == op.rpc && p.key_hash == hash)
                };
                if !*validate_only && !ops.iter().all(listed) {
                    return Some((Status::RequestFormatError, Response::Ping));
                }
                let owner = (*lease, *transaction);
                let votes = ops.iter().map(|op| self.prepare(owner, *validate_only, op)).collect();
                if self.fault == Fault::LosePrepareAnswers {
                    return None;
                }
                Response::TxPrepare { votes }
            }
            Request::TxRequestAbort { lease, ops, .. } => {
                self.requests.push(request.clone());
                if self.fault == Fault::MuteTransactions {
                    return None;
                }
                let votes = ops.iter().map(|op| self.request_abort(*lease, op)).collect();
                Response::TxRequestAbort { votes }
            }
            Request::TxDecision { lease, decision, ops, .. } => {
                self.requests.push(request.clone());
                if matches!(self.fault, Fault::MuteDecisions | Fault::MuteTransactions) {
                    return None;
                }
                let results = ops.iter().map(|op| self.decide(*lease, *decision, op)).collect();
                Response::TxDecision { results }
            }
            _ => return Some((Status::UnimplementedRequest, Response::Ping)),
        };
        Some((Status::Ok, response))
    }

    fn prepares(&self) -> Vec<&Request> {
        self.requests.iter().filter(|r| matches!(r, Request::TxPrepare { .. })).collect()
    }

    /// The opcodes of the transaction requests received, in order.
    fn phases(&self) -> Vec<Opcode> {
        self.requests.iter().map(Request::opcode).collect()
    }

    fn decisions(&self) -> Vec<TxDecision> {
        let decisions = self.requests.iter().filter_map(|request| match request {
            Request::TxDecision { decision, .. } => Some(*decision),
            _ => None,
        });
        decisions.collect()
    }
}

/// A master serving its [`Model`].
#[derive(Debug)]
struct ModelMaster(Mutex<Model>);

impl ModelMaster {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.0.lock().unwrap()
    }
}

impl Service for ModelMaster {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        let request = decode_request(header.opcode_code, body).unwrap();
        match self.model().answer(&request) {
            Some((status, response)) if status.carries_operation_body() => {
                encode_response(out, header.request_id, status, &response);
            }
            Some((status, _)) => {
                encode_error_response(out, header.request_id, header.opcode_code, status, "");
            }
            None => return Handled::Later(Box::pin(std::future::pending())),
        }
        Handled::Done
    }
}

/// A coordinator whose map of [`TABLE`] has one tablet per master, splitting the hash space
/// evenly; it grants lease 1 to every client.
#[derive(Debug)]
struct SplitCoordinator(Vec<String>);

impl Service for SplitCoordinator {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        let response = match decode_request(header.opcode_code, body).unwrap() {
            Request::GetTabletMap { .. } => {
                let width = u64::MAX / self.0.len() as u64;
                let tablets = (0..self.0.len())
                    .map(|index| {
                        let start = index as u64 * width.wrapping_add(1);
                        let end = if index + 1 == self.0.len() { u64::MAX } else { start + width };
                        TabletEntry {
                            table_id: TABLE,
                            range: HashRange { start, end },
                            owner: ServerId(index as u64 + 1),
                            owner_address: self.0[index].clone(),
                            state: TabletState::Normal,
                        }
                    })
                    .collect();
                Response::GetTabletMap { tablets }
            }
            Request::ClientLease { lease } => {
                Response::ClientLease { lease: LeaseId(lease.0.max(1)), term_ms: 30_000 }
            }
            _ => {
                let status = Status::UnimplementedRequest;
                encode_error_response(out, header.request_id, header.opcode_code, status, "");
                return Handled::Done;
            }
        };
        encode_response(out, header.request_id, Status::Ok, &response);
        Handled::Done
    }
}

/// `masters` model masters, each with its part of [`TABLE`], and a client of them.
async fn cluster(masters: usize, timeout: Duration) -> (Client, Vec<Arc<ModelMaster>>) {
    let masters: Vec<Arc<ModelMaster>> =
        (0..masters).map(|_| Arc::new(ModelMaster(Mutex::new(Model::new())))).collect();
    let mut addresses = Vec::new();
    for master in &masters {
        addresses.push(serve(master.clone()).await);
    }
    let coordinator = serve(Arc::new(SplitCoordinator(addresses))).await;
    let mut config = ClientConfig::new(coordinator);
    config.operation_timeout = timeout;
    (Client::new(config), masters)
}

/// A key whose hash puts it on master `index` of `masters` (see [`SplitCoordinator`]).
fn key_on(index: usize, masters: usize, name: &str) -> Vec<u8> {
    let width = u64::MAX / masters as u64;
    let owner = |key: &[u8]| match width.checked_add(1) {
        Some(tablet_width) => (key_hash(TABLE, key).0 / tablet_width).min(masters as u64 - 1),
        None => 0,
    };
    (0..)
        .map(|n| format!("{name}-{n}").into_bytes())
        .find(|key| owner(key) == index as u64)
        .unwrap()
}

fn integer(value: i64) -> [u8; 8] {
    value.to_le_bytes()
}

#[tokio::test]
async fn a_transfer_between_two_masters_commits_on_both() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (alice, bob) = (key_on(0, 2, "alice"), key_on(1, 2, "bob"));
    masters[0].model().put(&alice, &integer(100));
    masters[1].model().put(&bob, &integer(5));
    let tx = client.transaction();
    assert_eq!(tx.increment(TABLE, &alice, -30).await.unwrap(), 70);
    assert_eq!(tx.increment(TABLE, &bob, 30).await.unwrap(), 35);
    // The transaction reads its own writes; nothing reached a master yet.
    assert_eq!(tx.read(TABLE, &alice).await.unwrap(), Some(Bytes::copy_from_slice(&integer(70))));
    assert!(masters.iter().all(|master| master.model().requests.is_empty()));
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);

    let identities: Vec<(LeaseId, RpcId)> = masters
        .iter()
        .map(|master| {
            let model = master.model();
            assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
            assert_eq!(model.decisions(), [TxDecision::Commit]);
            match model.prepares()[..] {
                [Request::TxPrepare {
                    lease,
                    transaction,
                    validate_only: false,
                    ops,
                    participants,
                    ..
                }] => {
                    assert_eq!(ops.len(), 1, "each master gets its own op only");
                    assert_eq!(ops[0].kind, TxOpKind::Write);
                    assert_eq!(participants.len(), 2, "but the names of every op");
                    assert_eq!(participants[0].rpc, *transaction, "the first is the id");
                    (*lease, *transaction)
                }
                ref other => panic!("{other:?}"),
            }
        })
        .collect();
    assert_eq!(identities[0], identities[1], "one transaction id on every master");
    assert_eq!(masters[0].model().integer(&alice), 70);
    assert_eq!(masters[1].model().integer(&bob), 35);
}

#[tokio::test]
async fn a_change_after_the_read_aborts_in_a_conflict_and_unlocks_everything() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (alice, bob) = (key_on(0, 2, "alice"), key_on(1, 2, "bob"));
    masters[0].model().put(&alice, &integer(100));
    let tx = client.transaction();
    tx.read(TABLE, &alice).await.unwrap();
    tx.write(TABLE, &bob, b"new").unwrap();
    tx.write(TABLE, &alice, b"mine").unwrap();
    // Another client writes alice meanwhile.
    masters[0].model().put(&alice, &integer(1));
    let outcome = tx.commit().await.unwrap();
    let conflict = AbortReason::Conflict { table: TABLE, key: Bytes::from(alice.clone()) };
    assert_eq!(outcome, TxOutcome::Aborted(conflict));
    for master in &masters {
        let model = master.model();
        assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
        assert_eq!(model.decisions(), [TxDecision::Abort], "every op is told");
    }
    assert_eq!(masters[0].model().integer(&alice), 1);
    assert!(!masters[1].model().objects.contains_key(&bob[..]), "bob was not written");
}

#[tokio::test]
async fn a_blind_write_is_prepared_at_the_version_the_commit_read() {
    let (client, masters) = cluster(1, Duration::from_secs(5)).await;
    masters[0].model().put(b"present", b"old");
    let present_version = masters[0].model().version(b"present");
    let tx = client.transaction();
    tx.write(TABLE, b"present", b"new").unwrap();
    tx.remove(TABLE, b"absent").unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    let model = masters[0].model();
    let Request::TxPrepare { ops, .. } = model.prepares()[0] else { unreachable!() };
    let mut versions: Vec<(&[u8], TxOpKind, Version)> =
        ops.iter().map(|op| (&op.key[..], op.kind, op.version_read)).collect();
    versions.sort_by_key(|(key, _, _)| *key);
    assert_eq!(
        versions,
        [
            (&b"absent"[..], TxOpKind::Remove, Version::NONEXISTENT),
            (b"present", TxOpKind::Write, present_version),
        ]
    );
    assert_eq!(model.objects[&b"present"[..]].0, Bytes::from_static(b"new"));
}

#[tokio::test]
async fn a_read_only_transaction_validates_its_reads_and_locks_nothing() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    masters[0].model().put(&a, b"1");
    masters[1].model().put(&b, b"2");

    // One object needs no request at all.
    let tx = client.transaction();
    assert_eq!(tx.read(TABLE, &a).await.unwrap(), Some(Bytes::from_static(b"1")));
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    assert!(masters[0].model().requests.is_empty());

    let tx = client.transaction();
    tx.read(TABLE, &a).await.unwrap();
    assert_eq!(tx.read(TABLE, &b).await.unwrap(), Some(Bytes::from_static(b"2")));
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    for master in &masters {
        let model = master.model();
        assert!(matches!(model.prepares()[..], [Request::TxPrepare { validate_only: true, .. }]));
        assert!(model.decisions().is_empty(), "nothing to decide");
        assert!(model.votes.is_empty() && model.locks.is_empty(), "nothing recorded");
    }

    // A read the transaction saw first is what it sees again; changed, it aborts.
    let tx = client.transaction();
    tx.read(TABLE, &a).await.unwrap();
    tx.read(TABLE, &b).await.unwrap();
    masters[1].model().put(&b, b"3");
    assert_eq!(tx.read(TABLE, &b).await.unwrap(), Some(Bytes::from_static(b"2")));
    let conflict = AbortReason::Conflict { table: TABLE, key: Bytes::from(b.clone()) };
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Aborted(conflict));
}

/// The op named as the transaction requests of lease-less tests name it.
fn op_name(key: &[u8], rpc: u64) -> TxDecisionOp {
    TxDecisionOp { table_id: TABLE, key_hash: key_hash(TABLE, key).0, rpc: RpcId(rpc) }
}

#[tokio::test]
async fn an_unanswered_vote_is_made_final_as_abort_before_anything_is_decided() {
    let (client, masters) = cluster(2, Duration::from_millis(400)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    masters[1].model().fault = Fault::MutePrepares;
    let tx = client.transaction();
    tx.write(TABLE, &a, b"x").unwrap();
    tx.write(TABLE, &b, b"y").unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Aborted(AbortReason::Timeout));
    for master in &masters {
        let model = master.model();
        assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
        assert_eq!(model.decisions(), [TxDecision::Abort], "every op is told");
    }
    // The muted op's vote was asked for (TX_REQUEST_ABORT) before any decision was sent to
    // it, and recorded ABORT; the other op voted and needed no asking.
    let mut model = masters[1].model();
    assert_eq!(model.phases(), [Opcode::TxPrepare, Opcode::TxRequestAbort, Opcode::TxDecision]);
    assert_eq!(masters[0].model().phases(), [Opcode::TxPrepare, Opcode::TxDecision]);
    assert_eq!(model.votes.values().copied().collect::<Vec<_>>(), [TxVote::Abort]);
    // Its PREPARE, arriving late, votes ABORT and locks nothing.
    model.fault = Fault::None;
    let late = model.prepares()[0].clone();
    match model.answer(&late) {
        Some((Status::Ok, Response::TxPrepare { votes })) => {
            assert_eq!(votes.iter().map(|vote| vote.vote).collect::<Vec<_>>(), [TxVote::Abort]);
        }
        other => panic!("{other:?}"),
    }
    assert!(model.locks.is_empty() && model.objects.is_empty(), "{model:?}");
    assert!(masters[0].model().objects.is_empty());
}

#[tokio::test]
async fn a_prepared_op_whose_answer_was_lost_is_found_prepared_and_commits() {
    let (client, masters) = cluster(2, Duration::from_millis(400)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    masters[1].model().fault = Fault::LosePrepareAnswers;
    let tx = client.transaction();
    tx.write(TABLE, &a, b"x").unwrap();
    tx.write(TABLE, &b, b"y").unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    assert_eq!(masters[0].model().phases(), [Opcode::TxPrepare, Opcode::TxDecision]);
    assert_eq!(
        masters[1].model().phases(),
        [Opcode::TxPrepare, Opcode::TxRequestAbort, Opcode::TxDecision]
    );
    for master in &masters {
        let model = master.model();
        assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
        assert_eq!(model.decisions(), [TxDecision::Commit]);
    }
    assert_eq!(masters[1].model().objects[&b[..]].0, Bytes::from_static(b"y"));
    assert_eq!(masters[0].model().objects[&a[..]].0, Bytes::from_static(b"x"));
}

/// The acknowledged mark of the one TX_PREPARE `master` received last.
fn last_acknowledged(master: &ModelMaster) -> RpcId {
    match master.model().prepares().last() {
        Some(Request::TxPrepare { acknowledged, .. }) => *acknowledged,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn undelivered_decisions_keep_the_tickets_until_they_are_delivered() {
    let (client, masters) = cluster(2, Duration::from_millis(300)).await;
    let (a, b, c) = (key_on(0, 2, "a"), key_on(1, 2, "b"), key_on(0, 2, "c"));
    masters[1].model().fault = Fault::MuteDecisions;
    let tx = client.transaction();
    tx.write(TABLE, &a, b"x").unwrap();
    tx.write(TABLE, &b, b"y").unwrap();
    // Committed: every vote is PREPARED, though one master has not heard the decision.
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    let (transaction, last_rpc) = match masters[0].model().prepares()[..] {
        [Request::TxPrepare { transaction, participants, .. }] => {
            (*transaction, participants.iter().map(|op| op.rpc).max().unwrap())
        }
        ref other => panic!("{other:?}"),
    };
    assert!(masters[1].model().locks.contains_key(&b[..]), "b waits for its decision");

    // Meanwhile the client acknowledges none of the transaction's ops.
    let tx = client.transaction();
    tx.write(TABLE, &c, b"z").unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    assert!(last_acknowledged(&masters[0]) < transaction, "the ops are not acknowledged");

    // The master answers again: the decision reaches it in the background.
    masters[1].model().fault = Fault::None;
    let delivered = tokio::time::Instant::now() + Duration::from_secs(10);
    while !masters[1].model().locks.is_empty() {
        assert!(tokio::time::Instant::now() < delivered, "the decision is delivered late");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(masters[1].model().objects[&b[..]].0, Bytes::from_static(b"y"));
    // Once it is, the client acknowledges them.
    let settled = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let tx = client.transaction();
        tx.write(TABLE, &c, b"w").unwrap();
        assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
        // The decision goes on in the background: wait for it before looking at the masters.
        assert!(client.settle_transactions(SETTLE_PATIENCE).await);
        if last_acknowledged(&masters[0]) >= last_rpc {
            break;
        }
        // The background task gives the tickets back just after the answer.
        assert!(tokio::time::Instant::now() < settled, "the ops are acknowledged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_participant_finishes_a_transaction_whose_ops_are_all_prepared_by_committing_it() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    // Another client (lease 9) prepared its transaction 5 everywhere, then died.
    let (lease, transaction) = (LeaseId(9), RpcId(5));
    let write = |key: &[u8], rpc: u64, value: &'static [u8]| TxOp {
        table_id: TABLE,
        key: Bytes::copy_from_slice(key),
        rpc: RpcId(rpc),
        kind: TxOpKind::Write,
        version_read: Version::NONEXISTENT,
        value: Bytes::from_static(value),
    };
    let owner = (lease, transaction);
    assert_eq!(
        masters[0].model().prepare(owner, false, &write(&a, 5, b"x")).vote,
        TxVote::Prepared
    );
    assert_eq!(
        masters[1].model().prepare(owner, false, &write(&b, 6, b"y")).vote,
        TxVote::Prepared
    );
    let participants = [op_name(&a, 5), op_name(&b, 6)];
    let decision = client.finish_transaction(lease, transaction, &participants).await.unwrap();
    assert_eq!(decision, TxDecision::Commit);
    for master in &masters {
        let model = master.model();
        assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
        assert_eq!(model.phases(), [Opcode::TxRequestAbort, Opcode::TxDecision]);
        match &model.requests[1] {
            Request::TxDecision { lease: sent, acknowledged, transaction: id, .. } => {
                assert_eq!((*sent, *acknowledged, *id), (lease, RpcId(0), transaction));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(masters[0].model().objects[&a[..]].0, Bytes::from_static(b"x"));
    assert_eq!(masters[1].model().objects[&b[..]].0, Bytes::from_static(b"y"));
}

#[tokio::test]
async fn a_participant_finishes_a_transaction_with_an_op_that_never_voted_by_aborting_it() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    let (lease, transaction) = (LeaseId(9), RpcId(5));
    let write = |key: &[u8], rpc: u64| TxOp {
        table_id: TABLE,
        key: Bytes::copy_from_slice(key),
        rpc: RpcId(rpc),
        kind: TxOpKind::Write,
        version_read: Version::NONEXISTENT,
        value: Bytes::from_static(b"v"),
    };
    let owner = (lease, transaction);
    // The client died after its PREPARE reached a's master only.
    assert_eq!(masters[0].model().prepare(owner, false, &write(&a, 5)).vote, TxVote::Prepared);
    let participants = [op_name(&a, 5), op_name(&b, 6)];
    let decision = client.finish_transaction(lease, transaction, &participants).await.unwrap();
    assert_eq!(decision, TxDecision::Abort);
    for master in &masters {
        let model = master.model();
        assert!(model.locks.is_empty() && model.prepared.is_empty(), "{model:?}");
        assert!(model.objects.is_empty(), "{model:?}");
        assert_eq!(model.decisions(), [TxDecision::Abort]);
    }
    // b's vote is recorded ABORT: its PREPARE, arriving late, locks nothing.
    {
        let mut model = masters[1].model();
        assert_eq!(model.votes.get(&(lease, RpcId(6))), Some(&TxVote::Abort));
        assert_eq!(model.prepare(owner, false, &write(&b, 6)).vote, TxVote::Abort);
        assert!(model.locks.is_empty());
    }

    // A master that does not answer: the finish cannot complete, and says so.
    let (client, masters) = cluster(2, Duration::from_millis(200)).await;
    masters[1].model().fault = Fault::MuteTransactions;
    let error = client.finish_transaction(lease, transaction, &participants).await.unwrap_err();
    assert_eq!(error.status, Status::Timeout, "{error}");
    assert!(error.message.contains("could not be finished"), "{error}");
    let error = client.finish_transaction(lease, transaction, &[]).await.unwrap_err();
    assert_eq!(error.status, Status::InvalidParameter, "{error}");
}

#[tokio::test]
async fn a_commit_that_can_neither_learn_votes_nor_abort_has_an_unknown_outcome() {
    let (client, masters) = cluster(1, Duration::from_millis(300)).await;
    masters[0].model().fault = Fault::MuteTransactions;
    let tx = client.transaction();
    tx.write(TABLE, b"a", b"x").unwrap();
    let error = tx.commit().await.unwrap_err();
    assert_eq!(error.status, Status::Timeout, "{error}");
    assert!(error.message.contains("outcome is unknown"), "{error}");
}

#[tokio::test]
async fn an_op_its_master_refuses_aborts_the_transaction_with_its_error() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (small, large) = (key_on(0, 2, "small"), key_on(1, 2, "large"));
    masters[1].model().value_bytes_max = 4;
    let tx = client.transaction();
    tx.write(TABLE, &small, b"x").unwrap();
    tx.write(TABLE, &large, b"too large").unwrap();
    let error = tx.commit().await.unwrap_err();
    assert_eq!(error.status, Status::ValueTooLarge, "{error}");
    let model = masters[0].model();
    assert!(model.locks.is_empty() && model.objects.is_empty(), "{model:?}");
}

#[tokio::test]
async fn a_transaction_refuses_use_after_its_commit() {
    let (client, _masters) = cluster(1, Duration::from_secs(5)).await;
    let tx = client.transaction();
    let handle = tx.clone();
    tx.write(TABLE, b"a", b"x").unwrap();
    assert_eq!(tx.commit().await.unwrap(), TxOutcome::Committed);
    // The decision goes on in the background: wait for it before looking at the masters.
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    assert_eq!(handle.write(TABLE, b"a", b"y").unwrap_err().status, Status::InvalidParameter);
    assert_eq!(handle.commit().await.unwrap_err().status, Status::InvalidParameter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_increments_in_transactions_lose_nothing() {
    const CLIENTS: i64 = 6;
    const INCREMENTS: i64 = 5;
    let (client, masters) = cluster(2, Duration::from_secs(20)).await;
    let (a, b) = (key_on(0, 2, "a"), key_on(1, 2, "b"));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let (client, a, b) = (client.clone(), a.clone(), b.clone());
        tasks.spawn(async move {
            for _ in 0..INCREMENTS {
                let (a, b) = (a.clone(), b.clone());
                client
                    .run_transaction(|tx| {
                        let (a, b) = (a.clone(), b.clone());
                        async move {
                            tx.increment(TABLE, &a, 1).await?;
                            tx.increment(TABLE, &b, -1).await?;
                            Ok(())
                        }
                    })
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap();
    }
    assert!(client.settle_transactions(SETTLE_PATIENCE).await);
    assert_eq!(masters[0].model().integer(&a), CLIENTS * INCREMENTS);
    assert_eq!(masters[1].model().integer(&b), -CLIENTS * INCREMENTS);
    assert!(masters.iter().all(|master| master.model().locks.is_empty()));
}

#[test]
fn the_blocking_twin_runs_transactions_too() {
    let servers = tokio::runtime::Runtime::new().unwrap();
    let (client, masters) = servers.block_on(cluster(1, Duration::from_secs(5)));
    let config = client.config().clone();
    masters[0].model().put(b"counter", &integer(41));
    let blocking = BlockingClient::new(config).unwrap();
    let value = blocking
        .run_transaction(|tx| {
            let read = tx.read(TABLE, b"counter")?;
            assert_eq!(read, Some(Bytes::copy_from_slice(&integer(41))));
            tx.increment(TABLE, b"counter", 1)
        })
        .unwrap();
    assert_eq!(value, 42);
    let tx = blocking.transaction();
    tx.remove(TABLE, b"counter").unwrap();
    assert_eq!(tx.read(TABLE, b"counter").unwrap(), None);
    assert_eq!(tx.commit().unwrap(), TxOutcome::Committed);
    assert!(blocking.settle_transactions(SETTLE_PATIENCE));
    assert!(masters[0].model().objects.is_empty());
}

#[tokio::test]
async fn many_reads_go_out_together_and_are_checked_at_commit_as_single_reads() {
    let (client, masters) = cluster(2, Duration::from_secs(5)).await;
    let (a, b, c) = (key_on(0, 2, "a"), key_on(1, 2, "b"), key_on(1, 2, "c"));
    masters[0].model().put(&a, b"one");
    masters[1].model().put(&b, b"two");
    let tx = client.transaction();
    tx.write(TABLE, &c, b"mine").unwrap();
    let objects: [(TableId, &[u8]); 4] = [(TABLE, &a), (TABLE, &b), (TABLE, &c), (TABLE, &a)];
    let values = tx.read_many(&objects).await.unwrap();
    let expected: Vec<Option<Bytes>> = vec![
        Some(Bytes::from_static(b"one")),
        Some(Bytes::from_static(b"two")),
        Some(Bytes::from_static(b"mine")),
        Some(Bytes::from_static(b"one")),
    ];
    assert_eq!(values, expected);
    // One multi-read per master; the transaction's own write was not read.
    for master in &masters {
        assert_eq!(master.model().reads, [Opcode::MultiRead]);
    }
    // What read_many saw is what the commit checks: a change to b aborts it.
    masters[1].model().put(&b, b"changed");
    assert!(matches!(tx.commit().await.unwrap(), TxOutcome::Aborted(AbortReason::Conflict { .. })));
}
