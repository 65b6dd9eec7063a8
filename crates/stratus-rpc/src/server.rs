//! The server side: accept loop and per-connection request loop.
//!
//! Each connection is served by one reader task and one writer task. The reader performs the
//! handshake, splits frames, rejects malformed ones, and hands each request to the
//! [`Service`]. Synchronous handlers (every read and write in memory) write their response
//! straight into the connection's output buffer, so a request costs no task and no channel;
//! handlers that must wait (for example for replication) return a future, which is spawned and
//! bounded per connection. Connections are spread over the runtime's worker threads, so a
//! server uses every core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{BoxFuture, BoxReader, BoxWriter, Connection, Listener};
use stratus_wire::{
    body_offset, decode_frame_header, encode_error_response, frame_length, peek_request_identity,
    FrameError, FrameHeader, FrameKind, Hello, Status, HELLO_BYTES, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, Semaphore};

/// How long a new connection may take to send its handshake before it is dropped, so idle
/// sockets cannot pile up.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of responses buffered for a client that does not read them, before the server stops
/// reading its requests (backpressure instead of unbounded memory).
const OUTPUT_BYTES_HIGH_WATER: usize = 8 << 20;

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

/// Accepts connections forever, serving each with `service` on its own task.
pub async fn serve(
    mut listener: Box<dyn Listener>,
    service: Arc<dyn Service>,
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
        tokio::spawn(serve_connection(connection, service.clone()));
    }
}

#[derive(Debug)]
struct Output {
    buffer: Mutex<BytesMut>,
    ready: Notify,
    drained: Notify,
    closed: AtomicBool,
}

impl Output {
    fn push(&self, frame: &[u8]) {
        self.buffer.lock().unwrap_or_else(|poison| poison.into_inner()).extend_from_slice(frame);
        self.ready.notify_one();
    }

    fn buffered_bytes(&self) -> usize {
        self.buffer.lock().unwrap_or_else(|poison| poison.into_inner()).len()
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.ready.notify_one();
        self.drained.notify_waiters();
    }
}

/// Serves one connection until it closes or misbehaves.
pub async fn serve_connection(connection: Connection, service: Arc<dyn Service>) {
    let Connection { mut reader, mut writer, peer_address } = connection;
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&mut reader, &mut writer)).await {
        Ok(Ok(())) => {}
        Ok(Err(reason)) => {
            tracing::info!(peer = %peer_address, %reason, "handshake refused");
            let _ = writer.shutdown().await;
            return;
        }
        Err(_) => {
            tracing::info!(peer = %peer_address, "no handshake in time");
            return;
        }
    }
    let output = Arc::new(Output {
        buffer: Mutex::new(BytesMut::with_capacity(64 << 10)),
        ready: Notify::new(),
        drained: Notify::new(),
        closed: AtomicBool::new(false),
    });
    let writer_task = tokio::spawn(write_loop(writer, output.clone()));
    let reason = read_loop(&mut reader, &service, &output).await;
    tracing::debug!(peer = %peer_address, %reason, "connection ended");
    // Let the writer flush what is buffered (for example a REQUEST_TOO_LARGE answer), then end.
    output.ready.notify_one();
    output.closed.store(true, Ordering::SeqCst);
    output.ready.notify_one();
    let _ = writer_task.await;
}

async fn handshake(reader: &mut BoxReader, writer: &mut BoxWriter) -> Result<(), String> {
    let mut bytes = [0u8; HELLO_BYTES];
    reader.read_exact(&mut bytes).await.map_err(|error| error.to_string())?;
    let hello = Hello::decode(&bytes).map_err(|error| format!("bad handshake: {error}"))?;
    if hello.version != PROTOCOL_VERSION {
        let refusal = Hello { version: PROTOCOL_VERSION, status: Status::ProtocolVersionMismatch };
        let _ = writer.write_all(&refusal.encode()).await;
        return Err(format!("client speaks protocol version {}", hello.version));
    }
    let welcome = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
    writer.write_all(&welcome.encode()).await.map_err(|error| error.to_string())
}

async fn read_loop(
    reader: &mut BoxReader,
    service: &Arc<dyn Service>,
    output: &Arc<Output>,
) -> String {
    let mut buffer = BytesMut::with_capacity(64 << 10);
    let deferred = Arc::new(Semaphore::new(DEFERRED_RESPONSES_PER_CONNECTION_MAX));
    loop {
        // Handle every complete frame already received, then flush them together.
        loop {
            match frame_length(&buffer) {
                Ok(Some(length)) if buffer.len() >= length => {
                    let frame = buffer.split_to(length).freeze();
                    if let Err(reason) = dispatch(frame, service, output, &deferred).await {
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
        while output.buffered_bytes() > OUTPUT_BYTES_HIGH_WATER {
            if output.closed.load(Ordering::SeqCst) {
                return "writer closed".to_string();
            }
            // Register for the wake-up before the check, so a drain between the check and
            // the wait cannot be missed.
            let drained = output.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if output.buffered_bytes() <= OUTPUT_BYTES_HIGH_WATER {
                break;
            }
            drained.await;
        }
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
) -> Result<(), String> {
    let header = decode_frame_header(&frame).map_err(|error| format!("bad frame: {error}"))?;
    if header.kind != FrameKind::Request {
        return Err("client sent a response frame".to_string());
    }
    let body = frame.slice(body_offset(FrameKind::Request)..);
    let handled = {
        let mut buffer = output.buffer.lock().unwrap_or_else(|poison| poison.into_inner());
        service.handle(&header, body, &mut buffer)
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
        output.drained.notify_waiters();
        if !spare.is_empty() {
            if writer.write_all(&spare).await.is_err() {
                output.close();
                break;
            }
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
