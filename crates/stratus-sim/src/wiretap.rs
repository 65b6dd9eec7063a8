//! The simulation's wiretap: every RPC the coordinator and the servers send, counted on their
//! connections, and the planted bugs that tamper with them (checking the checker).
//!
//! A node's connections go through a [`TappedNetwork`] when a run measures
//! ([`crate::SimulationOptions::measure`]) or plants a bug ([`PlantedBug`]). It wraps the
//! network above the membership preamble, so it sees exactly the bytes of the RPC protocol: the
//! 8-byte handshake each way, then frames (docs/design/wire-protocol.md, "Frames"). It reads
//! frame headers only, and counts each request by the second of simulated time it was sent in,
//! its sender, its receiver and its opcode, and each response's bytes to the same; it decodes
//! one body, RECOVER_TABLETS (request and answer), to learn what each recovery master was
//! asked to replay and what it replayed. Only connections a node opens are wrapped (the
//! requests it sends, the answers it gets), so every request is counted once.
//!
//! Invariants:
//! 1. A scanner sees a connection's bytes in order, each once: the writer side feeds it exactly
//!    the bytes the inner writer accepted, the reader side exactly the bytes read.
//! 2. A tampered byte depends only on bytes before it in the stream, so the writer can compute
//!    it before a partial write and again after (the same answer both times).

use std::collections::BTreeMap;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use stratus_env::{BoxFuture, BoxReader, BoxWriter, Connection, Listener, Network};
use stratus_types::ServerId;
use stratus_wire::frame::{FrameKind, HELLO_BYTES, LENGTH_FIELD_BYTES, RESPONSE_HEADER_BYTES};
use stratus_wire::{Opcode, Request, Response, ResponseBody, Status};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A bug planted in a run on purpose, to show that the simulation's checks catch it
/// (docs/design/simulation.md, "Checking the checker"). Planted by the wiretap, in the
/// simulator: no production code has the hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Every RECOVER_TABLETS the coordinator sends that lists two segments or more has its last
    /// segment id replaced by its first: the recovery master replays the first twice (which
    /// changes nothing) and never reads the last, as if the coordinator had read the crashed
    /// log's digest one entry short. Whatever only that segment held is lost.
    RecoverySkipsASegment,
}

/// A simulated node, as the wiretap tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    /// The coordinator.
    Coordinator,
    /// Storage server `index` (host `server-<index>`), whatever its incarnation.
    Server(usize),
    /// Any client host (workload, verifier, operator, loader).
    Client,
}

impl Node {
    /// The node of simulated host `host`.
    pub fn of_host(host: &str) -> Node {
        if host == "coordinator" {
            return Node::Coordinator;
        }
        match host.strip_prefix("server-").and_then(|index| index.parse().ok()) {
            Some(index) => Node::Server(index),
            None => Node::Client,
        }
    }

    /// The node an address ("host:port") belongs to.
    fn of_address(address: &str) -> Node {
        Node::of_host(address.split(':').next().unwrap_or_default())
    }

    fn role(self) -> Role {
        match self {
            Node::Coordinator => Role::Coordinator,
            Node::Server(_) => Role::Server,
            Node::Client => Role::Client,
        }
    }
}

/// What a peer is, for the counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The coordinator.
    Coordinator,
    /// A storage server.
    Server,
    /// A client.
    Client,
}

/// Requests of one kind (one second, one peer role, one opcode) and the bytes they moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests.
    pub requests: u64,
    /// Bytes of those requests' frames.
    pub request_bytes: u64,
    /// Bytes of the response frames that answered them.
    pub response_bytes: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.requests += other.requests;
        self.request_bytes += other.request_bytes;
        self.response_bytes += other.response_bytes;
    }
}

/// Whose side of a request a count takes: the node that sent it or the one that received it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Counted at the sender, by its receiver's role.
    Sent,
    /// Counted at the receiver, by its sender's role.
    Received,
}

/// One node's traffic: (second of simulated time, the peer's role, opcode) → tally.
#[derive(Debug, Default)]
struct Ledger {
    sent: BTreeMap<(u32, Role, u16), Tally>,
    received: BTreeMap<(u32, Role, u16), Tally>,
}

/// One RECOVER_TABLETS: what the coordinator asked of a recovery master, and what it answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPartition {
    /// The crashed master.
    pub crashed: ServerId,
    /// The recovery master.
    pub recovery_master: ServerId,
    /// Its host.
    pub node: Node,
    /// The recovery attempt's assignment epoch: one per plan the coordinator computed and sent.
    pub assignment_epoch: u64,
    /// Parts of crashed tablets in the partition.
    pub parts: usize,
    /// Segments of the crashed log it was told to replay.
    pub segments: usize,
    /// When the request was sent.
    pub asked_at: Duration,
    /// When the answer came, and its status (`None`: none came).
    pub answered: Option<(Duration, Status)>,
    /// From an OK answer: bytes of replica data the master read (the partition's share),
    /// objects it replayed, segments it replayed.
    pub replica_bytes_read: u64,
    /// See `replica_bytes_read`.
    pub objects_replayed: u64,
    /// See `replica_bytes_read`.
    pub segments_replayed: u64,
}

impl RecoveryPartition {
    /// Whether the recovery master answered OK (the partition is replayed and durable there).
    pub fn succeeded(&self) -> bool {
        matches!(self.answered, Some((_, Status::Ok)))
    }
}

/// Everything the wiretap saw in one run.
#[derive(Debug)]
pub struct Wiretap {
    servers: usize,
    planted: Option<PlantedBug>,
    /// Per node: the coordinator, then the servers by index, then all clients together.
    ledgers: Mutex<Vec<Ledger>>,
    partitions: Mutex<Vec<RecoveryPartition>>,
    /// Connections the coordinator and the servers opened, by second of simulated time.
    connections: Mutex<BTreeMap<u32, u64>>,
    /// Frames whose bytes were tampered with by the planted bug.
    tampered_frames: AtomicU64,
    /// Streams whose bytes stopped making sense as frames, and RECOVER_TABLETS bodies that did
    /// not decode (must stay 0: what followed is missing from the counts).
    misreadings: AtomicU64,
}

impl Wiretap {
    /// A wiretap for a cluster of `servers` storage servers, planting `planted` if any.
    pub fn new(servers: usize, planted: Option<PlantedBug>) -> Arc<Wiretap> {
        Arc::new(Wiretap {
            servers,
            planted,
            ledgers: Mutex::new((0..servers + 2).map(|_| Ledger::default()).collect()),
            partitions: Mutex::new(Vec::new()),
            connections: Mutex::new(BTreeMap::new()),
            tampered_frames: AtomicU64::new(0),
            misreadings: AtomicU64::new(0),
        })
    }

    fn ledger_index(&self, node: Node) -> usize {
        match node {
            Node::Coordinator => 0,
            Node::Server(index) => 1 + index.min(self.servers),
            Node::Client => self.servers + 1,
        }
    }

    fn ledgers(&self) -> std::sync::MutexGuard<'_, Vec<Ledger>> {
        self.ledgers.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn partitions_mut(&self) -> std::sync::MutexGuard<'_, Vec<RecoveryPartition>> {
        self.partitions.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Notes a request (or, with `request_bytes` 0 and `response_bytes` set, its answer)
    /// between `from` and `to`.
    fn count(&self, from: Node, to: Node, opcode: u16, tally: Tally) {
        let second = now().as_secs() as u32;
        let (sender, receiver) = (self.ledger_index(from), self.ledger_index(to));
        let mut ledgers = self.ledgers();
        ledgers[sender].sent.entry((second, to.role(), opcode)).or_default().add(tally);
        ledgers[receiver].received.entry((second, from.role(), opcode)).or_default().add(tally);
    }

    /// The tallies of `node`'s requests on `side` within `seconds` (whole seconds of
    /// simulated time), per (peer role, opcode).
    pub fn tallies(
        &self,
        node: Node,
        side: Side,
        seconds: Range<u32>,
    ) -> BTreeMap<(Role, u16), Tally> {
        let ledgers = self.ledgers();
        let ledger = &ledgers[self.ledger_index(node)];
        let entries = match side {
            Side::Sent => &ledger.sent,
            Side::Received => &ledger.received,
        };
        let mut tallies: BTreeMap<(Role, u16), Tally> = BTreeMap::new();
        for (&(second, role, opcode), tally) in entries {
            if seconds.contains(&second) {
                tallies.entry((role, opcode)).or_default().add(*tally);
            }
        }
        tallies
    }

    /// The tallies of every server's requests on `side` within `seconds`, added up, per (peer
    /// role, opcode).
    pub fn servers_tallies(&self, side: Side, seconds: Range<u32>) -> BTreeMap<(Role, u16), Tally> {
        let mut tallies: BTreeMap<(Role, u16), Tally> = BTreeMap::new();
        for index in 0..self.servers {
            for (key, tally) in self.tallies(Node::Server(index), side, seconds.clone()) {
                tallies.entry(key).or_default().add(tally);
            }
        }
        tallies
    }

    /// Connections the coordinator and the servers opened within `seconds`.
    pub fn connections_opened(&self, seconds: Range<u32>) -> u64 {
        let connections = self.connections.lock().unwrap_or_else(|poison| poison.into_inner());
        connections.range(seconds).map(|(_, count)| count).sum()
    }

    /// For every server: its requests on `side` within `seconds` that `select` (the peer's
    /// role, the opcode) picks.
    pub fn per_server(
        &self,
        side: Side,
        seconds: Range<u32>,
        select: impl Fn(Role, u16) -> bool,
    ) -> PerServer {
        let ledgers = self.ledgers();
        let mut counts = vec![0u64; self.servers];
        let mut busiest_second = 0u64;
        for (index, count) in counts.iter_mut().enumerate() {
            let ledger = &ledgers[self.ledger_index(Node::Server(index))];
            let entries = match side {
                Side::Sent => &ledger.sent,
                Side::Received => &ledger.received,
            };
            let mut by_second: BTreeMap<u32, u64> = BTreeMap::new();
            for (&(second, role, opcode), tally) in entries {
                if seconds.contains(&second) && select(role, opcode) {
                    *by_second.entry(second).or_default() += tally.requests;
                }
            }
            *count = by_second.values().sum();
            busiest_second = busiest_second.max(by_second.values().copied().max().unwrap_or(0));
        }
        PerServer { counts, seconds: seconds.end.saturating_sub(seconds.start), busiest_second }
    }

    /// Every RECOVER_TABLETS the coordinator sent, in the order sent.
    pub fn recovery_partitions(&self) -> Vec<RecoveryPartition> {
        self.partitions_mut().clone()
    }

    /// Frames the planted bug tampered with.
    pub fn tampered_frames(&self) -> u64 {
        self.tampered_frames.load(Ordering::Relaxed)
    }

    /// Streams that stopped parsing as frames and RECOVER_TABLETS bodies that did not decode:
    /// 0 unless the wiretap is wrong (its counts are then short).
    pub fn misreadings(&self) -> u64 {
        self.misreadings.load(Ordering::Relaxed)
    }

    fn misread(&self) {
        self.misreadings.fetch_add(1, Ordering::Relaxed);
    }
}

/// Some requests of every server over a window of whole seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerServer {
    /// Per server (by index): requests in the window.
    pub counts: Vec<u64>,
    /// Seconds in the window.
    pub seconds: u32,
    /// The most requests one server had in one second of the window.
    pub busiest_second: u64,
}

impl PerServer {
    /// Requests per server per second, averaged over the servers and the window.
    pub fn mean_per_second(&self) -> f64 {
        let total: u64 = self.counts.iter().sum();
        total as f64 / (self.counts.len().max(1) as f64 * f64::from(self.seconds.max(1)))
    }

    /// The busiest server's requests per second, averaged over the window.
    pub fn max_per_second(&self) -> f64 {
        let most = self.counts.iter().copied().max().unwrap_or(0);
        most as f64 / f64::from(self.seconds.max(1))
    }
}

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// A node's network, tapped: every connection it opens is counted on `tap`.
#[derive(Debug)]
pub struct TappedNetwork {
    inner: Arc<dyn Network>,
    node: Node,
    tap: Arc<Wiretap>,
}

impl TappedNetwork {
    /// `inner` (with its membership preamble, if any) seen by `tap` as the connections of
    /// host `host`.
    pub fn new(inner: Arc<dyn Network>, host: &str, tap: Arc<Wiretap>) -> TappedNetwork {
        TappedNetwork { inner, node: Node::of_host(host), tap }
    }
}

impl Network for TappedNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move {
            let connection = self.inner.connect(address).await?;
            {
                let second = now().as_secs() as u32;
                let mut connections =
                    self.tap.connections.lock().unwrap_or_else(|poison| poison.into_inner());
                *connections.entry(second).or_default() += 1;
            }
            let line = Arc::new(Line {
                tap: self.tap.clone(),
                from: self.node,
                to: Node::of_address(address),
                pending: Mutex::new(BTreeMap::new()),
            });
            Ok(Connection {
                reader: Box::new(TappedReader {
                    inner: connection.reader,
                    line: line.clone(),
                    scanner: FrameScanner::new(),
                }),
                writer: Box::new(TappedWriter {
                    inner: connection.writer,
                    line,
                    scanner: FrameScanner::new(),
                    scratch: Vec::new(),
                }),
                peer_address: connection.peer_address,
            })
        })
    }

    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        self.inner.bind(address)
    }
}

/// One connection: who opened it to whom, and its RECOVER_TABLETS awaiting their answers
/// (request id → index in the wiretap's partitions).
#[derive(Debug)]
struct Line {
    tap: Arc<Wiretap>,
    from: Node,
    to: Node,
    pending: Mutex<BTreeMap<u64, usize>>,
}

impl Line {
    fn request(&self, frame: Frame) {
        let tally = Tally { requests: 1, request_bytes: frame.bytes as u64, response_bytes: 0 };
        self.tap.count(self.from, self.to, frame.opcode, tally);
        if frame.tampered {
            self.tap.tampered_frames.fetch_add(1, Ordering::Relaxed);
        }
        let Some(body) = frame.body else { return };
        let decoded = stratus_wire::codec::decode_request(frame.opcode, Bytes::from(body));
        let Ok(Request::RecoverTablets {
            master_id,
            crashed_master,
            tablets,
            segments,
            assignment_epoch,
            ..
        }) = decoded
        else {
            self.tap.misread();
            return;
        };
        let mut partitions = self.tap.partitions_mut();
        partitions.push(RecoveryPartition {
            crashed: crashed_master,
            recovery_master: master_id,
            node: self.to,
            assignment_epoch,
            parts: tablets.len(),
            segments: segments.len(),
            asked_at: now(),
            answered: None,
            replica_bytes_read: 0,
            objects_replayed: 0,
            segments_replayed: 0,
        });
        let index = partitions.len() - 1;
        self.pending.lock().unwrap_or_else(|poison| poison.into_inner()).insert(frame.id, index);
    }

    fn response(&self, frame: Frame) {
        let tally = Tally { requests: 0, request_bytes: 0, response_bytes: frame.bytes as u64 };
        self.tap.count(self.from, self.to, frame.opcode, tally);
        let Some(body) = frame.body else { return };
        let index =
            self.pending.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&frame.id);
        let (Some(index), Some(status)) = (index, Status::from_code(frame.status)) else {
            return;
        };
        let mut partitions = self.tap.partitions_mut();
        let partition = &mut partitions[index];
        partition.answered = Some((now(), status));
        let decoded =
            stratus_wire::codec::decode_response(Opcode::RecoverTablets, status, Bytes::from(body));
        match decoded {
            Ok(ResponseBody::Operation(Response::RecoverTablets {
                segments_replayed,
                replica_bytes_read,
                objects_replayed,
                ..
            })) => {
                partition.replica_bytes_read = replica_bytes_read;
                partition.objects_replayed = objects_replayed;
                partition.segments_replayed = segments_replayed;
            }
            // A refusal (RETRY, NO_TABLE_SPACE) carries an error body: nothing replayed.
            Ok(ResponseBody::Error { .. }) => {}
            Ok(ResponseBody::Operation(_)) | Err(_) => self.tap.misread(),
        }
    }
}

/// A whole frame, as scanned.
#[derive(Clone, Debug)]
struct Frame {
    kind: FrameKind,
    opcode: u16,
    id: u64,
    /// The response's status code (0 for a request).
    status: u16,
    /// Bytes of the frame, its length field included.
    bytes: usize,
    /// The body, for the frames whose body the wiretap decodes (as sent, tampering included).
    body: Option<Vec<u8>>,
    tampered: bool,
}

/// Reads one direction of a connection frame by frame (invariant 1).
#[derive(Clone, Debug)]
struct FrameScanner {
    /// Handshake bytes still to pass.
    hello_left: usize,
    /// The header being assembled.
    header: [u8; RESPONSE_HEADER_BYTES],
    header_len: usize,
    /// The frame whose body passes now, and how many of its body bytes are still to come.
    frame: Option<(Frame, usize)>,
    /// The bytes stopped making sense as frames: nothing more is counted.
    lost: bool,
}

/// The frames whose bodies the wiretap keeps and decodes (and the planted bug may change):
/// RECOVER_TABLETS, request and answer.
fn keeps_body(opcode: u16) -> bool {
    opcode == Opcode::RecoverTablets.code()
}

impl FrameScanner {
    fn new() -> FrameScanner {
        FrameScanner {
            hello_left: HELLO_BYTES,
            header: [0; RESPONSE_HEADER_BYTES],
            header_len: 0,
            frame: None,
            lost: false,
        }
    }

    /// Scans `bytes`, the next ones of the stream: each whole frame goes to `done`, and each
    /// byte `planted` changes goes to `patch` (its index in `bytes`, the byte to send instead).
    /// Returns true if the stream stopped parsing as frames in this call.
    fn scan(
        &mut self,
        bytes: &[u8],
        planted: Option<PlantedBug>,
        patch: &mut dyn FnMut(usize, u8),
        done: &mut Vec<Frame>,
    ) -> bool {
        let was_lost = self.lost;
        let mut at = 0;
        loop {
            if let Some((_, 0)) = self.frame {
                let (frame, _) = self.frame.take().expect("a frame in progress");
                done.push(frame);
            }
            if at == bytes.len() || self.lost {
                return self.lost && !was_lost;
            }
            if self.hello_left > 0 {
                let passing = self.hello_left.min(bytes.len() - at);
                self.hello_left -= passing;
                at += passing;
                continue;
            }
            let Some((frame, left)) = &mut self.frame else {
                at += self.scan_header(&bytes[at..]);
                continue;
            };
            match &mut frame.body {
                // Byte by byte: a kept body is small, and tampering goes by offsets.
                Some(body) => {
                    let mut byte = bytes[at];
                    let tampered = tampered_byte(planted, frame.kind, frame.opcode, body);
                    if let Some(changed) = tampered.filter(|changed| *changed != byte) {
                        patch(at, changed);
                        byte = changed;
                        frame.tampered = true;
                    }
                    body.push(byte);
                    at += 1;
                    *left -= 1;
                }
                None => {
                    let passing = (*left).min(bytes.len() - at);
                    at += passing;
                    *left -= passing;
                }
            }
        }
    }

    /// Adds header bytes from the front of `bytes`; returns how many it took. Once the header
    /// is whole, the frame starts.
    fn scan_header(&mut self, bytes: &[u8]) -> usize {
        const KIND_AT: usize = LENGTH_FIELD_BYTES;
        let wanted = if self.header_len <= KIND_AT {
            KIND_AT + 1
        } else {
            match FrameKind::from_code(self.header[KIND_AT]) {
                Some(kind) => kind.header_bytes(),
                None => {
                    self.lost = true;
                    return bytes.len();
                }
            }
        };
        let taking = (wanted - self.header_len).min(bytes.len());
        self.header[self.header_len..self.header_len + taking].copy_from_slice(&bytes[..taking]);
        self.header_len += taking;
        if self.header_len <= KIND_AT + 1 {
            // The kind just arrived (or not yet): the next call knows the header's length.
            if self.header_len == KIND_AT + 1
                && FrameKind::from_code(self.header[KIND_AT]).is_none()
            {
                self.lost = true;
            }
            return taking;
        }
        if self.header_len < wanted {
            return taking;
        }
        let header = &self.header;
        let field = |range: Range<usize>| -> u64 {
            header[range].iter().rev().fold(0, |value, byte| (value << 8) | u64::from(*byte))
        };
        let kind = FrameKind::from_code(header[KIND_AT]).expect("checked when it arrived");
        let bytes_in_frame = field(0..4) as usize + LENGTH_FIELD_BYTES;
        let Some(body_bytes) = bytes_in_frame.checked_sub(kind.header_bytes()) else {
            self.lost = true;
            return taking;
        };
        let opcode = field(6..8) as u16;
        let frame = Frame {
            kind,
            opcode,
            id: field(8..16),
            status: match kind {
                FrameKind::Response => field(16..18) as u16,
                FrameKind::Request => 0,
            },
            bytes: bytes_in_frame,
            body: keeps_body(opcode).then(|| Vec::with_capacity(body_bytes)),
            tampered: false,
        };
        self.header_len = 0;
        self.frame = Some((frame, body_bytes));
        taking
    }
}

/// What the planted bug makes of the next byte of a kept body, `body` being the bytes before
/// it (invariant 2): for [`PlantedBug::RecoverySkipsASegment`], the bytes of a RECOVER_TABLETS
/// request's last segment id become those of its first.
fn tampered_byte(
    planted: Option<PlantedBug>,
    kind: FrameKind,
    opcode: u16,
    body: &[u8],
) -> Option<u8> {
    if planted != Some(PlantedBug::RecoverySkipsASegment)
        || kind != FrameKind::Request
        || opcode != Opcode::RecoverTablets.code()
    {
        return None;
    }
    // master id (8), crashed master (8), tablets: count (4) and 33 bytes each (table, range
    // start and end, creation segment, tier), backups: count (4) and a string each (length
    // u16 and bytes), segments: count (4) and each an id (8), a replica count (4) and 15 bytes
    // per replica (docs/design/wire-protocol.md, RECOVER_TABLETS, protocol version 6). The
    // last segment keeps its replicas: they are asked for the first segment, which in a small
    // cluster they hold too (with 5 servers and R = 3, two of any segment's three backups hold
    // any other's), so the recovery reads the first twice and the last never.
    let u32_at = |at: usize| -> Option<usize> {
        let field = body.get(at..at + 4)?;
        Some(u32::from_le_bytes(field.try_into().ok()?) as usize)
    };
    let u16_at = |at: usize| -> Option<usize> {
        let field = body.get(at..at + 2)?;
        Some(usize::from(u16::from_le_bytes(field.try_into().ok()?)))
    };
    let tablets = u32_at(16)?;
    let backups_count_at = 20 + 33 * tablets;
    let mut at = backups_count_at + 4;
    for _ in 0..u32_at(backups_count_at)? {
        at += 2 + u16_at(at)?;
    }
    let segments = u32_at(at)?;
    if segments < 2 {
        return None;
    }
    let first = at + 4;
    let mut last = first;
    for _ in 0..segments - 1 {
        last += 8 + 4 + 15 * u32_at(last + 8)?;
    }
    let offset = body.len();
    (last..last + 8).contains(&offset).then(|| body[first + offset - last])
}

struct TappedWriter {
    inner: BoxWriter,
    line: Arc<Line>,
    scanner: FrameScanner,
    /// The bytes as sent, when the planted bug changes some.
    scratch: Vec<u8>,
}

impl AsyncWrite for TappedWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let planted = this.line.tap.planted;
        // With a planted bug the bytes to send may differ: found on a copy of the scanner, and
        // found again below for the part the inner writer takes (invariant 2).
        let mut changed = false;
        if planted.is_some() {
            let mut trial = this.scanner.clone();
            this.scratch.clear();
            this.scratch.extend_from_slice(buf);
            let scratch = &mut this.scratch;
            let mut patch = |at: usize, byte: u8| {
                scratch[at] = byte;
                changed = true;
            };
            trial.scan(buf, planted, &mut patch, &mut Vec::new());
        }
        let sending: &[u8] = if changed { &this.scratch } else { buf };
        let written = match Pin::new(&mut this.inner).poll_write(cx, sending) {
            Poll::Ready(Ok(written)) => written,
            other => return other,
        };
        let mut done = Vec::new();
        if this.scanner.scan(&buf[..written], planted, &mut |_, _| {}, &mut done) {
            this.line.tap.misread();
        }
        for frame in done.into_iter().filter(|frame| frame.kind == FrameKind::Request) {
            this.line.request(frame);
        }
        Poll::Ready(Ok(written))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

struct TappedReader {
    inner: BoxReader,
    line: Arc<Line>,
    scanner: FrameScanner,
}

impl AsyncRead for TappedReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let outcome = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = outcome {
            let mut done = Vec::new();
            if this.scanner.scan(&buf.filled()[before..], None, &mut |_, _| {}, &mut done) {
                this.line.tap.misread();
            }
            for frame in done.into_iter().filter(|frame| frame.kind == FrameKind::Response) {
                this.line.response(frame);
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use stratus_types::{HashRange, SegmentId, TableId};
    use stratus_wire::{encode_request, RecoveryReplica, RecoverySegment, RecoveryTablet};

    fn recover_tablets(segments: &[u64]) -> Request {
        Request::RecoverTablets {
            master_id: ServerId(3),
            crashed_master: ServerId(2),
            tablets: vec![RecoveryTablet {
                table_id: TableId(1),
                range: HashRange { start: 0, end: u64::MAX },
                creation_segment: SegmentId(0),
                tier: stratus_types::Tier::Memory,
            }],
            backups: vec!["server-1:7100".to_string(), "server-4:7100".to_string()],
            segments: segments
                .iter()
                .map(|&segment| RecoverySegment {
                    segment_id: SegmentId(segment),
                    replicas: vec![RecoveryReplica {
                        backup: 1,
                        epoch: 1,
                        length: 64,
                        primary: true,
                    }],
                })
                .collect(),
            assignment_epoch: 9,
        }
    }

    /// A connection's first bytes: the hello, a PING, a RECOVER_TABLETS.
    fn stream(segments: &[u64]) -> Vec<u8> {
        let mut out = BytesMut::new();
        out.extend_from_slice(&[0; HELLO_BYTES]);
        encode_request(&mut out, 1, &Request::Ping);
        encode_request(&mut out, 2, &recover_tablets(segments));
        out.to_vec()
    }

    /// Scans `bytes` in pieces of `piece` bytes; returns the frames and the bytes as sent.
    fn scan_in_pieces(
        bytes: &[u8],
        piece: usize,
        planted: Option<PlantedBug>,
    ) -> (Vec<Frame>, Vec<u8>) {
        let mut scanner = FrameScanner::new();
        let (mut frames, mut sent) = (Vec::new(), Vec::new());
        for chunk in bytes.chunks(piece) {
            let mut chunk = chunk.to_vec();
            let mut patched = chunk.clone();
            scanner.scan(&chunk, planted, &mut |at, byte| patched[at] = byte, &mut frames);
            chunk.copy_from_slice(&patched);
            sent.extend_from_slice(&chunk);
        }
        (frames, sent)
    }

    #[test]
    fn frames_are_found_whatever_pieces_the_stream_arrives_in() {
        let bytes = stream(&[4, 5, 6]);
        for piece in 1..=bytes.len() {
            let (frames, sent) = scan_in_pieces(&bytes, piece, None);
            assert_eq!(sent, bytes);
            let opcodes: Vec<u16> = frames.iter().map(|frame| frame.opcode).collect();
            assert_eq!(opcodes, [Opcode::Ping.code(), Opcode::RecoverTablets.code()], "{piece}");
            assert_eq!(frames.iter().map(|frame| frame.bytes).sum::<usize>(), bytes.len() - 8);
            let body = Bytes::from(frames[1].body.clone().expect("kept"));
            let decoded = stratus_wire::decode_request(frames[1].opcode, body).expect("decodes");
            assert_eq!(decoded, recover_tablets(&[4, 5, 6]));
        }
    }

    #[test]
    fn the_planted_bug_sends_the_first_segment_in_the_last_one_s_place() {
        let bytes = stream(&[4, 5, 6]);
        for piece in [1, 7, bytes.len()] {
            let planted = Some(PlantedBug::RecoverySkipsASegment);
            let (frames, sent) = scan_in_pieces(&bytes, piece, planted);
            assert!(frames[1].tampered && !frames[0].tampered);
            assert_eq!(sent, stream(&[4, 5, 4]), "{piece}");
        }
        // A log of one segment is left alone: there is no other segment to name in its place.
        let (frames, sent) =
            scan_in_pieces(&stream(&[4]), 3, Some(PlantedBug::RecoverySkipsASegment));
        assert!(!frames[1].tampered);
        assert_eq!(sent, stream(&[4]));
    }
}
