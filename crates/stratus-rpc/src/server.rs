//! The server side: accept loop and per-connection request loop.
//!
//! Each connection is served by one reader task and one writer task. The reader performs the
//! handshake, splits frames, rejects malformed ones, and hands each request to the
//! [`Service`]. Synchronous handlers (every read and write in memory) write their response
//! straight into the connection's output buffer, so a request costs no task and no channel;
//! handlers that must wait (for example for replication) return a future, which is spawned and
//! bounded per connection. Connections are spread over the runtime's worker threads, so a
//! server uses every core.
//!
//! What one server's connections may hold is bounded as a whole too ([`ServerLimits`]): how
//! many are open (past the limit a new one is closed at once, and counted), and how many bytes
//! of responses they have unwritten (a connection with unwritten responses reads no request
//! while it is over its own bound, or while the server is over its total).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{write_and_flush, BoxFuture, BoxReader, BoxWriter, Connection, Listener};
use stratus_types::limits::{
    RPC_CONNECTIONS_PER_SERVER_MAX, RPC_OUTPUT_BYTES_PER_CONNECTION_MAX,
    RPC_OUTPUT_BYTES_PER_SERVER_MAX,
};
use stratus_wire::membership::MEMBER_MAGIC;
use stratus_wire::{
    body_offset, decode_frame_header, encode_error_response, encode_response, frame_length,
    peek_request_identity, FrameError, FrameHeader, FrameKind, Hello, Opcode, Status, HELLO_BYTES,
    PROTOCOL_VERSION,
};

use crate::membership::{refuse_without_secret, Admission, ConnectionAccess};
use crate::users::user_request_refusal;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, Semaphore};

/// How long a new connection may take to send its handshake before it is dropped, so idle
/// sockets cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handlers that wait (spawned futures) per connection.
const DEFERRED_RESPONSES_PER_CONNECTION_MAX: usize = 1_024;

/// What a handler did with a request.
pub enum Handled {
    /// The response frame was appended to the output buffer.
    Done,
    /// The response will be produced by this future (a whole encoded frame).
    Later(BoxFuture<'static, BytesMut>),
}

impl std::fmt::Debug for Handled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handled::Done => f.write_str("Done"),
            Handled::Later(_) => f.write_str("Later"),
        }
    }
}

/// A service: turns request frames into response frames.
pub trait Service: Send + Sync + 'static {
    /// Handles one request whose frame header is valid. `body` is the request body (not yet
    /// decoded: the service decodes it for the opcode and answers decode errors with their
    /// status). Must append exactly one response frame for `header.request_id` to `out`, or
    /// return [`Handled::Later`].
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled;
}

/// Bounds on what all the connections of one server hold together, and what they hold now.
#[derive(Debug)]
pub struct ServerLimits {
    /// Connections open at most; past it a new connection is closed at once.
    pub connections_max: usize,
    /// Unwritten response bytes per connection before it reads no more requests.
    pub output_bytes_per_connection_max: usize,
    /// Unwritten response bytes of all connections together before a connection that has
    /// any of its own unwritten reads no more requests.
    pub output_bytes_max: usize,
    connection_permits: Arc<Semaphore>,
    output_bytes: AtomicUsize,
    /// Woken when a connection's writer wrote responses while the server was over
    /// `output_bytes_max`.
    output_drained: Notify,
    connections_refused: AtomicU64,
}

impl ServerLimits {
    /// The limits of `stratus_types::limits` (RPC_CONNECTIONS_PER_SERVER_MAX and the two
    /// output bounds).
    pub fn standard() -> Arc<ServerLimits> {
        ServerLimits::new(
            RPC_CONNECTIONS_PER_SERVER_MAX,
            RPC_OUTPUT_BYTES_PER_CONNECTION_MAX,
            RPC_OUTPUT_BYTES_PER_SERVER_MAX,
        )
    }

    /// Other limits (tests: a few connections, a few bytes).
    pub fn new(
        connections_max: usize,
        output_bytes_per_connection_max: usize,
        output_bytes_max: usize,
    ) -> Arc<ServerLimits> {
        assert!(connections_max >= 1 && output_bytes_per_connection_max <= output_bytes_max);
        Arc::new(ServerLimits {
            connections_max,
            output_bytes_per_connection_max,
            output_bytes_max,
            connection_permits: Arc::new(Semaphore::new(connections_max)),
            output_bytes: AtomicUsize::new(0),
            output_drained: Notify::new(),
            connections_refused: AtomicU64::new(0),
        })
    }

    /// Connections open now.
    pub fn connections_open(&self) -> usize {
        self.connections_max - self.connection_permits.available_permits()
    }

    /// Connections closed at once because `connections_max` were open.
    pub fn connections_refused(&self) -> u64 {
        self.connections_refused.load(Ordering::Relaxed)
    }

    /// Bytes of responses the connections have not written yet (buffered, or being written).
    pub fn output_bytes(&self) -> usize {
        self.output_bytes.load(Ordering::Relaxed)
    }

    fn refuse(&self, peer_address: &str) {
        let refused = self.connections_refused.fetch_add(1, Ordering::Relaxed) + 1;
        // Logged at 1, 2, 4, 8...: a flood of connections cannot flood the log.
        if refused.is_power_of_two() {
            tracing::warn!(
                peer = %peer_address, refused, connections_max = self.connections_max,
                "too many connections: a new one is closed at once"
            );
        }
    }
}

/// Accepts connections forever, serving each with `service` on its own task, within the
/// standard [`ServerLimits`], to every connection (no cluster secret).
pub async fn serve(listener: Box<dyn Listener>, service: Arc<dyn Service>) -> std::io::Result<()> {
    accept_loop(listener, service, ServerLimits::standard(), Admission::Open).await
}

/// [`serve`], asking of every connection what `admission` says: with a cluster secret, the
/// server-to-server opcodes only to connections that proved it.
pub async fn serve_admitting(
    listener: Box<dyn Listener>,
    service: Arc<dyn Service>,
    admission: Admission,
) -> std::io::Result<()> {
    accept_loop(listener, service, ServerLimits::standard(), admission).await
}

/// [`serve`] within `limits`, which the caller may watch.
pub async fn serve_within(
    listener: Box<dyn Listener>,
    service: Arc<dyn Service>,
    limits: Arc<ServerLimits>,
) -> std::io::Result<()> {
    accept_loop(listener, service, limits, Admission::Open).await
}

async fn accept_loop(
    mut listener: Box<dyn Listener>,
    service: Arc<dyn Service>,
    limits: Arc<ServerLimits>,
    admission: Admission,
) -> std::io::Result<()> {
    loop {
        let connection = match listener.accept().await {
            Ok(connection) => connection,
            Err(error) => {
                // Running out of file descriptors is transient; back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = limits.connection_permits.clone().try_acquire_owned() else {
            limits.refuse(&connection.peer_address);
            drop(connection);
            continue;
        };
        let (service, limits, admission) = (service.clone(), limits.clone(), admission.clone());
        tokio::spawn(async move {
            serve_connection_within(connection, service, limits, &admission).await;
            drop(permit);
        });
    }
}

#[derive(Debug)]
struct Output {
    buffer: Mutex<BytesMut>,
    ready: Notify,
    drained: Notify,
    closed: AtomicBool,
    /// Bytes of responses not written to the socket yet: buffered, or being written.
    unwritten_bytes: AtomicUsize,
    /// The server's account of every connection's unwritten bytes.
    limits: Arc<ServerLimits>,
}

impl Output {
    fn push(&self, frame: &[u8]) {
        self.buffer.lock().unwrap_or_else(|poison| poison.into_inner()).extend_from_slice(frame);
        self.added(frame.len());
        self.ready.notify_one();
    }

    /// `bytes` more responses, appended to the buffer.
    fn added(&self, bytes: usize) {
        self.unwritten_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.limits.output_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// `bytes` of responses are on the socket (or dropped with the connection).
    fn written(&self, bytes: usize) {
        self.unwritten_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let before = self.limits.output_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.drained.notify_waiters();
        if before > self.limits.output_bytes_max {
            self.limits.output_drained.notify_waiters();
        }
    }

    /// Whether the connection may take another request, and if not, what it waits for. (A
    /// connection with nothing unwritten always may: peers that read are never shut out by
    /// peers that do not.)
    fn room(&self) -> Room {
        let own = self.unwritten_bytes.load(Ordering::Relaxed);
        if own > self.limits.output_bytes_per_connection_max {
            Room::WaitForOwnDrain
        } else if own > 0 && self.limits.output_bytes() > self.limits.output_bytes_max {
            Room::WaitForServerDrain
        } else {
            Room::Available
        }
    }

    /// Returns once the connection may take another request (see [`Output::room`]); `false`
    /// if the writer closed meanwhile.
    async fn wait_for_room(&self) -> bool {
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            let drain = match self.room() {
                Room::Available => return true,
                Room::WaitForOwnDrain => &self.drained,
                Room::WaitForServerDrain => &self.limits.output_drained,
            };
            // The responses waiting are what must drain: the writer flushes them now rather
            // than after the batch of requests this one belongs to.
            self.ready.notify_one();
            // Registered before the second look, so a drain between the look and the wait is
            // not missed (and only here: a connection with room never touches the server's
            // shared waiter list).
            let drained = drain.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if !self.closed.load(Ordering::SeqCst) && !matches!(self.room(), Room::Available) {
                drained.await;
            }
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.ready.notify_one();
        self.drained.notify_waiters();
        // Its reader may wait for the server's total to drop: it must see the close. (Other
        // connections' readers wake too, look, and wait again: closes are rare.)
        self.limits.output_drained.notify_waiters();
    }
}

impl Drop for Output {
    /// Responses never written (the connection ended first) leave the server's account.
    fn drop(&mut self) {
        let unwritten = *self.unwritten_bytes.get_mut();
        self.limits.output_bytes.fetch_sub(unwritten, Ordering::Relaxed);
        self.limits.output_drained.notify_waiters();
    }
}

/// What a connection's reader waits for before it takes another request.
enum Room {
    Available,
    /// Its own unwritten responses are over the per-connection bound.
    WaitForOwnDrain,
    /// It has unwritten responses and the server is over its total.
    WaitForServerDrain,
}

/// Serves one connection until it closes or misbehaves, within the standard limits of a
/// server that has only this connection (a caller with its own accept loop).
pub async fn serve_connection(connection: Connection, service: Arc<dyn Service>) {
    serve_connection_within(connection, service, ServerLimits::standard(), &Admission::Open).await
}

/// [`serve_connection`], asking of the connection what `admission` says.
pub async fn serve_connection_admitting(
    connection: Connection,
    service: Arc<dyn Service>,
    admission: &Admission,
) {
    serve_connection_within(connection, service, ServerLimits::standard(), admission).await
}

/// Serves one connection of a server with `limits` until it closes or misbehaves.
async fn serve_connection_within(
    connection: Connection,
    service: Arc<dyn Service>,
    limits: Arc<ServerLimits>,
    admission: &Admission,
) {
    let Connection { mut reader, mut writer, peer_address } = connection;
    let handshaking = handshake(&mut reader, &mut writer, admission, &peer_address);
    let access = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshaking).await {
        Ok(Ok(access)) => access,
        Ok(Err(HandshakeFailure::ClosedBeforeHello)) => {
            tracing::debug!(peer = %peer_address, "closed before its hello (a probe)");
            return;
        }
        Ok(Err(HandshakeFailure::Refused(reason))) => {
            tracing::info!(peer = %peer_address, %reason, "handshake refused");
            let _ = writer.shutdown().await;
            return;
        }
        Ok(Err(HandshakeFailure::NotAMember(reason))) => {
            // Logged (rate-limited) and counted by the membership itself.
            tracing::debug!(peer = %peer_address, %reason, "not a member");
            let _ = writer.shutdown().await;
            return;
        }
        Err(_) => {
            tracing::info!(peer = %peer_address, "no handshake in time");
            return;
        }
    };
    let output = Arc::new(Output {
        buffer: Mutex::new(BytesMut::with_capacity(64 << 10)),
        ready: Notify::new(),
        drained: Notify::new(),
        closed: AtomicBool::new(false),
        unwritten_bytes: AtomicUsize::new(0),
        limits,
    });
    let writer_task = tokio::spawn(write_loop(writer, output.clone()));
    let connection = ConnectionContext { access, peer_address: peer_address.clone() };
    let reason = read_loop(&mut reader, &service, &output, &connection).await;
    tracing::debug!(peer = %peer_address, %reason, "connection ended");
    // Let the writer flush what is buffered (for example a REQUEST_TOO_LARGE answer), then end.
    output.ready.notify_one();
    output.closed.store(true, Ordering::SeqCst);
    output.ready.notify_one();
    let _ = writer_task.await;
}

/// Why a connection's handshake failed.
#[derive(Debug)]
enum HandshakeFailure {
    /// The peer closed the connection before sending its hello: a probe of whether anything
    /// listens (a standby coordinator checks the active one's address this way), not an error.
    ClosedBeforeHello,
    /// The peer opened the membership preamble and did not prove the cluster secret (or this
    /// server has none): logged as a warning where it is found, since it is either an attack
    /// or a misconfigured cluster.
    NotAMember(String),
    /// Anything else, said in words.
    Refused(String),
}

/// Reads the peer's first four bytes; with [`MEMBER_MAGIC`] runs the membership preamble, then
/// the hello. Returns what the connection may send.
async fn handshake(
    reader: &mut BoxReader,
    writer: &mut BoxWriter,
    admission: &Admission,
    peer: &str,
) -> Result<ConnectionAccess, HandshakeFailure> {
    let mut bytes = [0u8; HELLO_BYTES];
    read_opening(reader, &mut bytes[..4]).await?;
    let proven = if bytes[..4] == MEMBER_MAGIC {
        let magic = [bytes[0], bytes[1], bytes[2], bytes[3]];
        let role = match admission {
            Admission::Open => {
                refuse_without_secret(magic, reader, writer).await;
                tracing::warn!(
                    %peer,
                    "a peer asked to prove credentials, and this process runs without a cluster secret"
                );
                return Err(HandshakeFailure::NotAMember(
                    "this server runs without a cluster secret".to_string(),
                ));
            }
            Admission::Members(membership) => membership
                .admit(magic, reader, writer, peer)
                .await
                .map_err(HandshakeFailure::NotAMember)?,
        };
        read_opening(reader, &mut bytes[..4]).await?;
        Some(role)
    } else {
        None
    };
    let access = ConnectionAccess::after(admission, proven);
    reader
        .read_exact(&mut bytes[4..])
        .await
        .map_err(|error| HandshakeFailure::Refused(format!("closed within the hello: {error}")))?;
    let hello = Hello::decode(&bytes)
        .map_err(|error| HandshakeFailure::Refused(format!("bad handshake: {error}")))?;
    if hello.version != PROTOCOL_VERSION {
        let refusal = Hello { version: PROTOCOL_VERSION, status: Status::ProtocolVersionMismatch };
        let _ = write_and_flush(writer, &refusal.encode()).await;
        return Err(HandshakeFailure::Refused(format!(
            "client speaks protocol version {}",
            hello.version
        )));
    }
    let welcome = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
    write_and_flush(writer, &welcome.encode())
        .await
        .map_err(|error| HandshakeFailure::Refused(error.to_string()))?;
    Ok(access)
}

/// Reads the four bytes that open a connection (or the hello after a preamble); a peer that
/// closes before sending any is a probe.
async fn read_opening(reader: &mut BoxReader, bytes: &mut [u8]) -> Result<(), HandshakeFailure> {
    let mut received = 0;
    while received < bytes.len() {
        match reader.read(&mut bytes[received..]).await {
            Ok(0) if received == 0 => return Err(HandshakeFailure::ClosedBeforeHello),
            Ok(0) => return Err(HandshakeFailure::Refused("closed within the hello".into())),
            Ok(read) => received += read,
            Err(error) => return Err(HandshakeFailure::Refused(error.to_string())),
        }
    }
    Ok(())
}

/// What the request loop knows of its connection.
#[derive(Debug)]
struct ConnectionContext {
    access: ConnectionAccess,
    peer_address: String,
}

async fn read_loop(
    reader: &mut BoxReader,
    service: &Arc<dyn Service>,
    output: &Arc<Output>,
    connection: &ConnectionContext,
) -> String {
    let mut buffer = BytesMut::with_capacity(64 << 10);
    let deferred = Arc::new(Semaphore::new(DEFERRED_RESPONSES_PER_CONNECTION_MAX));
    loop {
        // Handle every complete frame already received, then flush them together. Each frame
        // waits for room first: one read may bring thousands of requests, each asking for a
        // large response.
        loop {
            match frame_length(&buffer) {
                Ok(Some(length)) if buffer.len() >= length => {
                    if !output.wait_for_room().await {
                        return "writer closed".to_string();
                    }
                    let frame = buffer.split_to(length).freeze();
                    if let Err(reason) =
                        dispatch(frame, service, output, &deferred, connection).await
                    {
                        output.ready.notify_one();
                        return reason;
                    }
                }
                Ok(Some(length)) => {
                    buffer.reserve(length - buffer.len());
                    break;
                }
                Ok(None) => break,
                Err(FrameError::TooLarge { announced_bytes }) => {
                    refuse_oversized(&buffer, reader, output, announced_bytes).await;
                    return format!("frame of {announced_bytes} bytes is over the limit");
                }
                Err(error) => {
                    output.ready.notify_one();
                    return format!("bad frame: {error}");
                }
            }
        }
        output.ready.notify_one();
        if output.closed.load(Ordering::SeqCst) {
            return "writer closed".to_string();
        }
        buffer.reserve(64 << 10);
        match reader.read_buf(&mut buffer).await {
            Ok(0) => return "closed by peer".to_string(),
            Ok(_) => {}
            Err(error) => return error.to_string(),
        }
    }
}

async fn dispatch(
    frame: Bytes,
    service: &Arc<dyn Service>,
    output: &Arc<Output>,
    deferred: &Arc<Semaphore>,
    connection: &ConnectionContext,
) -> Result<(), String> {
    let header = decode_frame_header(&frame).map_err(|error| format!("bad frame: {error}"))?;
    if header.kind != FrameKind::Request {
        return Err("client sent a response frame".to_string());
    }
    if !connection.access.allows_everything() {
        if let Some((membership, lack)) = connection.access.refusal(header.opcode_code) {
            let refused = membership.count_refused_request();
            refuse_request(&header, refused, lack, connection, output);
            return Ok(());
        }
    }
    let body = frame.slice(body_offset(FrameKind::Request)..);
    if header.opcode_code == Opcode::WhoAmI.code() {
        answer_who_am_i(&header, connection, output);
        return Ok(());
    }
    if let ConnectionAccess::User { user, users, .. } = &connection.access {
        if let Some(reason) = user_request_refusal(users, user, header.opcode_code, &body).await {
            let refused = users.count_denied_request();
            refuse_request(&header, refused, &reason, connection, output);
            return Ok(());
        }
    }
    let handled = {
        let mut buffer = output.buffer.lock().unwrap_or_else(|poison| poison.into_inner());
        let before = buffer.len();
        let handled = service.handle(&header, body, &mut buffer);
        output.added(buffer.len() - before);
        handled
    };
    if let Handled::Later(future) = handled {
        let permit = deferred
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| "deferred responses closed".to_string())?;
        let output = output.clone();
        tokio::spawn(async move {
            let frame = future.await;
            output.push(&frame);
            drop(permit);
        });
    }
    Ok(())
}

/// Answers a request the connection may not send (it did not prove what the opcode needs)
/// with PERMISSION_DENIED, saying what it lacks; nothing reaches the service.
fn refuse_request(
    header: &FrameHeader,
    refused: u64,
    lack: &str,
    connection: &ConnectionContext,
    output: &Output,
) {
    let opcode = Opcode::from_code(header.opcode_code);
    let name =
        opcode.map_or_else(|| header.opcode_code.to_string(), |opcode| format!("{opcode:?}"));
    // The first refusal of a process is logged, then one in 1 024, so a peer that repeats
    // cannot flood the log; the counter has them all.
    if refused == 1 || refused.is_multiple_of(1_024) {
        tracing::warn!(
            peer = %connection.peer_address,
            opcode = %name,
            refused,
            lack,
            "refused a request the connection did not prove it may send"
        );
    }
    let message = format!("{name} {lack}");
    let mut frame = BytesMut::new();
    encode_error_response(
        &mut frame,
        header.request_id,
        header.opcode_code,
        Status::PermissionDenied,
        &message,
    );
    output.push(&frame);
}

/// Answers WHO_AM_I from what the connection proved (only this layer knows it).
fn answer_who_am_i(header: &FrameHeader, connection: &ConnectionContext, output: &Output) {
    let identity = connection.access.identity();
    let mut frame = BytesMut::new();
    encode_response(
        &mut frame,
        header.request_id,
        Status::Ok,
        &stratus_wire::Response::WhoAmI { identity },
    );
    output.push(&frame);
}

/// Answers a frame whose announced length is over the limit with REQUEST_TOO_LARGE for its
/// request id (if the header can be read), so the client gets a clear status before the
/// connection closes.
async fn refuse_oversized(
    buffer: &BytesMut,
    reader: &mut BoxReader,
    output: &Arc<Output>,
    announced_bytes: u64,
) {
    let mut header = buffer.to_vec();
    while header.len() < stratus_wire::REQUEST_HEADER_BYTES {
        let mut more = [0u8; 64];
        match tokio::time::timeout(Duration::from_secs(1), reader.read(&mut more)).await {
            Ok(Ok(count)) if count > 0 => header.extend_from_slice(&more[..count]),
            _ => break,
        }
    }
    if let Some((opcode_code, request_id)) = peek_request_identity(&header) {
        let mut frame = BytesMut::new();
        let message = format!(
            "frame of {announced_bytes} bytes exceeds the maximum of {} bytes",
            stratus_types::limits::FRAME_BYTES_MAX
        );
        encode_error_response(
            &mut frame,
            request_id,
            opcode_code,
            Status::RequestTooLarge,
            &message,
        );
        output.push(&frame);
    }
}

async fn write_loop(mut writer: BoxWriter, output: Arc<Output>) {
    let mut spare = BytesMut::with_capacity(64 << 10);
    loop {
        {
            let mut buffer = output.buffer.lock().unwrap_or_else(|poison| poison.into_inner());
            std::mem::swap(&mut *buffer, &mut spare);
        }
        if !spare.is_empty() {
            if write_and_flush(&mut writer, &spare).await.is_err() {
                output.close();
                break;
            }
            output.written(spare.len());
            spare.clear();
            continue;
        }
        if output.closed.load(Ordering::SeqCst) {
            break;
        }
        output.ready.notified().await;
    }
    let _ = writer.shutdown().await;
}
