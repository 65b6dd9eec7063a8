//! The client side: pipelined channels and a pool of them.
//!
//! A [`Channel`] is one connection. Callers encode their request straight into the channel's
//! shared output buffer (no intermediate allocation), register a completion slot under the
//! request id, and wait; a writer task flushes whatever accumulated since its last write in one
//! system call (so concurrent callers share writes), and a reader task splits the incoming byte
//! stream into frames and completes the slots. Responses may arrive in any order.
//!
//! A pool may also know one server that lives in the same process (a storage server's own RESP
//! front end uses the client library to reach every master, itself included): calls to that
//! address run the server's [`Service`] handler directly, with the same frames and the same
//! answers but no socket, no system call and no task switch for a request answered at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{read_first_answer, write_and_flush, BoxReader, BoxWriter, Network};
use stratus_types::limits::{FRAME_BYTES_MAX, REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX};
use stratus_wire::{
    body_offset, decode_frame_header, decode_response, encode_request, frame_length, FrameError,
    FrameKind, Hello, Opcode, Request, ResponseBody, Status, HELLO_BYTES, PROTOCOL_VERSION,
};

use crate::server::{Handled, Service};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, Notify, Semaphore};

/// Settings of the RPC client.
#[derive(Clone, Debug)]
pub struct RpcConfig {
    /// How long one request may take before it fails with [`RpcError::Timeout`].
    pub request_timeout: Duration,
    /// How long connecting (including the handshake) may take.
    pub connect_timeout: Duration,
    /// Connections kept per server address; requests are spread over them round-robin so one
    /// client can keep several server cores busy.
    pub connections_per_address: usize,
}

impl Default for RpcConfig {
    fn default() -> RpcConfig {
        RpcConfig {
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            connections_per_address: 1,
        }
    }
}

/// Why a call produced no response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RpcError {
    /// Connecting or the handshake failed.
    Connect(String),
    /// No response within the request timeout.
    Timeout,
    /// The connection broke before the response arrived; the request may or may not have run.
    ConnectionLost(String),
    /// The connection had closed before the request was written to it: the request reached
    /// nobody, so it may be sent again anywhere without doubt.
    NotSent(String),
    /// The peer sent bytes that violate the protocol.
    Protocol(String),
    /// The peer speaks another protocol version.
    VersionMismatch {
        /// The version the peer announced.
        server_version: u16,
    },
    /// The credentials preamble failed: the peer refused this process's secret or password,
    /// or does not hold it itself. Retrying cannot cure it.
    AuthenticationFailed(String),
}

impl RpcError {
    /// The status a caller reports for this failure.
    pub fn status(&self) -> Status {
        match self {
            RpcError::Connect(_) | RpcError::ConnectionLost(_) | RpcError::NotSent(_) => {
                Status::CouldntConnect
            }
            RpcError::Timeout => Status::Timeout,
            RpcError::Protocol(_) => Status::InternalError,
            RpcError::VersionMismatch { .. } => Status::ProtocolVersionMismatch,
            RpcError::AuthenticationFailed(_) => Status::AuthenticationFailed,
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Connect(reason) => write!(f, "couldn't connect: {reason}"),
            RpcError::Timeout => write!(f, "request timed out"),
            RpcError::ConnectionLost(reason) => write!(f, "connection lost: {reason}"),
            RpcError::NotSent(reason) => write!(f, "not sent: {reason}"),
            RpcError::Protocol(reason) => write!(f, "protocol violation: {reason}"),
            RpcError::AuthenticationFailed(reason) => f.write_str(reason),
            RpcError::VersionMismatch { server_version } => write!(
                f,
                "protocol version mismatch: we speak {PROTOCOL_VERSION}, server speaks {server_version}"
            ),
        }
    }
}

impl std::error::Error for RpcError {}

type Completion = oneshot::Sender<Result<Bytes, RpcError>>;

#[derive(Debug)]
struct Shared {
    output: Mutex<BytesMut>,
    output_ready: Notify,
    pending: Mutex<BTreeMap<u64, Completion>>,
    next_request_id: AtomicU64,
    in_flight: Semaphore,
    closed: AtomicBool,
}

impl Shared {
    fn close(&self, reason: &str) {
        self.close_with(RpcError::ConnectionLost(reason.to_string()));
    }

    /// Closes the channel and fails every waiting call with `error`.
    fn close_with(&self, error: RpcError) {
        self.closed.store(true, Ordering::SeqCst);
        // Wake the writer so it notices and exits.
        self.output_ready.notify_one();
        let drained: Vec<Completion> = {
            let mut pending = self.pending.lock().unwrap_or_else(|poison| poison.into_inner());
            std::mem::take(&mut *pending).into_values().collect()
        };
        for completion in drained {
            let _ = completion.send(Err(error.clone()));
        }
    }
}

/// One pipelined connection to a server.
#[derive(Debug)]
pub struct Channel {
    address: String,
    shared: Arc<Shared>,
}

impl Channel {
    /// Connects to `address` and performs the version handshake.
    pub async fn connect(
        network: &dyn Network,
        address: &str,
        config: &RpcConfig,
    ) -> Result<Channel, RpcError> {
        let connecting = async {
            let mut connection = network.connect(address).await.map_err(|error| {
                // A credentials preamble refused (see `membership`): final, not a connection
                // failure to retry.
                match error.kind() {
                    std::io::ErrorKind::PermissionDenied => {
                        RpcError::AuthenticationFailed(error.to_string())
                    }
                    _ => RpcError::Connect(error.to_string()),
                }
            })?;
            let hello = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
            write_and_flush(&mut connection.writer, &hello.encode())
                .await
                .map_err(|error| RpcError::Connect(error.to_string()))?;
            let mut reply = [0u8; HELLO_BYTES];
            read_first_answer(&mut connection.reader, &mut reply)
                .await
                .map_err(|error| RpcError::Connect(format!("handshake: {error}")))?;
            let reply =
                Hello::decode(&reply).map_err(|error| RpcError::Protocol(error.to_string()))?;
            if reply.status != Status::Ok || reply.version != PROTOCOL_VERSION {
                return Err(RpcError::VersionMismatch { server_version: reply.version });
            }
            Ok(connection)
        };
        let connection = tokio::time::timeout(config.connect_timeout, connecting)
            .await
            .map_err(|_| RpcError::Connect(format!("no answer from {address} in time")))??;
        let shared = Arc::new(Shared {
            output: Mutex::new(BytesMut::with_capacity(64 << 10)),
            output_ready: Notify::new(),
            pending: Mutex::new(BTreeMap::new()),
            next_request_id: AtomicU64::new(1),
            in_flight: Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(write_loop(connection.writer, shared.clone()));
        tokio::spawn(read_loop(connection.reader, shared.clone()));
        Ok(Channel { address: address.to_string(), shared })
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// True once the connection broke; a closed channel fails every call.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Sends `request` and waits for its response.
    pub async fn call(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<(Status, ResponseBody), RpcError> {
        let opcode = request.opcode();
        let frame = self
            .call_encoded(timeout, |out, request_id| encode_request(out, request_id, request))
            .await?;
        decode_response_frame(opcode, frame)
    }

    /// Sends one request frame produced by `encode` (given the output buffer and the request id
    /// to use) and returns the whole response frame. Used by `call` and by benchmarks.
    pub async fn call_encoded(
        &self,
        timeout: Duration,
        encode: impl FnOnce(&mut BytesMut, u64),
    ) -> Result<Bytes, RpcError> {
        let _permit = self
            .shared
            .in_flight
            .acquire()
            .await
            .map_err(|_| RpcError::ConnectionLost("channel shut down".to_string()))?;
        if self.is_closed() {
            return Err(RpcError::NotSent(format!("connection to {} closed", self.address)));
        }
        let request_id = self.shared.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(request_id, sender);
        {
            let mut output = self.shared.output.lock().unwrap_or_else(|poison| poison.into_inner());
            encode(&mut output, request_id);
        }
        self.shared.output_ready.notify_one();
        // The connection may have closed between the check and the insert; the close drains
        // `pending`, but only entries present then, so check again. An entry no longer there
        // was taken by the reader (its answer is waiting in `receiver`: the server may answer
        // and close before this line runs) or by the close (its error is): either way the
        // receiver has the outcome. Only an entry still present would never be completed.
        if self.is_closed() && self.forget(request_id) {
            return Err(RpcError::ConnectionLost(format!("connection to {} closed", self.address)));
        }
        match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(RpcError::ConnectionLost("completion dropped".to_string())),
            Err(_) => {
                self.forget(request_id);
                Err(RpcError::Timeout)
            }
        }
    }

    /// Drops the completion of `request_id`; true if it was still waiting (nobody else will
    /// complete it now).
    fn forget(&self, request_id: u64) -> bool {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .remove(&request_id)
            .is_some()
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // The tasks hold the other references; closing ends them and the connection.
        self.shared.close("channel dropped");
    }
}

/// Splits a response frame and decodes its body for `opcode`.
pub fn decode_response_frame(
    opcode: Opcode,
    frame: Bytes,
) -> Result<(Status, ResponseBody), RpcError> {
    let header =
        decode_frame_header(&frame).map_err(|error| RpcError::Protocol(error.to_string()))?;
    if header.opcode_code != opcode.code() {
        return Err(RpcError::Protocol(format!(
            "response opcode {} for a request with opcode {}",
            header.opcode_code,
            opcode.code()
        )));
    }
    let body = frame.slice(body_offset(FrameKind::Response)..);
    let decoded = decode_response(opcode, header.status, body)
        .map_err(|error| RpcError::Protocol(format!("bad {opcode:?} response: {error}")))?;
    Ok((header.status, decoded))
}

async fn write_loop(mut writer: BoxWriter, shared: Arc<Shared>) {
    let mut spare = BytesMut::with_capacity(64 << 10);
    loop {
        shared.output_ready.notified().await;
        if shared.closed.load(Ordering::SeqCst) {
            break;
        }
        {
            let mut output = shared.output.lock().unwrap_or_else(|poison| poison.into_inner());
            std::mem::swap(&mut *output, &mut spare);
        }
        if spare.is_empty() {
            continue;
        }
        if let Err(error) = write_and_flush(&mut writer, &spare).await {
            shared.close(&format!("write failed: {error}"));
            break;
        }
        spare.clear();
    }
    let _ = writer.shutdown().await;
}

async fn read_loop(mut reader: BoxReader, shared: Arc<Shared>) {
    let mut buffer = BytesMut::with_capacity(64 << 10);
    // A frame that breaks the protocol is reported as such (callers do not retry what a
    // broken peer will only break again); a lost connection as lost.
    let failure = loop {
        match next_frame(&mut reader, &mut buffer).await {
            Ok(frame) => {
                let header = match decode_frame_header(&frame) {
                    Ok(header) if header.kind == FrameKind::Response => header,
                    Ok(_) => break RpcError::Protocol("server sent a request frame".to_string()),
                    Err(error) => break RpcError::Protocol(format!("bad frame: {error}")),
                };
                let completion = shared
                    .pending
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .remove(&header.request_id);
                // A missing entry is a response to a request that already timed out.
                if let Some(completion) = completion {
                    let _ = completion.send(Ok(frame));
                }
            }
            Err(reason) => break RpcError::ConnectionLost(reason),
        }
        if shared.closed.load(Ordering::SeqCst) {
            break RpcError::ConnectionLost("closed".to_string());
        }
    };
    shared.close_with(failure);
}

/// Reads until `buffer` holds one whole frame and splits it off. Errors are strings because
/// they only end the connection and are reported to waiting callers.
pub(crate) async fn next_frame(
    reader: &mut BoxReader,
    buffer: &mut BytesMut,
) -> Result<Bytes, String> {
    loop {
        if let Some(length) = frame_length(buffer).map_err(|error| error.to_string())? {
            if buffer.len() >= length {
                return Ok(buffer.split_to(length).freeze());
            }
            buffer.reserve(length - buffer.len());
        } else {
            buffer.reserve(64 << 10);
        }
        let read = reader.read_buf(buffer).await.map_err(|error| error.to_string())?;
        if read == 0 {
            return Err("connection closed by peer".to_string());
        }
    }
}

/// A server in this process: requests to its address are handled without the network.
struct InProcessServer {
    address: String,
    service: Arc<dyn Service>,
    /// Calls in flight, bounded as on one connection: a handler that waits (replication
    /// stalled) holds its permit until it ends, even after its caller gave up, so callers
    /// that retry cannot pile up detached handlers.
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for InProcessServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessServer").field("address", &self.address).finish_non_exhaustive()
    }
}

/// The request id of in-process requests: nothing matches responses by id there (each call
/// gets its own response frame), so every call may use the same one.
const IN_PROCESS_REQUEST_ID: u64 = 0;

impl InProcessServer {
    /// One request through the service's handler: the frame is built and checked exactly as
    /// one from a socket would be, and the answer decoded the same way. A handler that must
    /// wait runs on its own task, as on a connection, so a caller that gives up (timeout,
    /// cancellation) never cuts a handler short halfway.
    async fn call(
        &self,
        request: &Request,
        timeout: Duration,
    ) -> Result<(Status, ResponseBody), RpcError> {
        let opcode = request.opcode();
        let mut frame = BytesMut::new();
        encode_request(&mut frame, IN_PROCESS_REQUEST_ID, request);
        let frame = frame.freeze();
        let header = match decode_frame_header(&frame) {
            Ok(header) => header,
            // What a server answers a frame over the limit on a connection.
            Err(FrameError::TooLarge { announced_bytes }) => {
                let message = format!(
                    "frame of {announced_bytes} bytes exceeds the maximum of {FRAME_BYTES_MAX} bytes"
                );
                return Ok((Status::RequestTooLarge, ResponseBody::Error { message }));
            }
            Err(error) => return Err(RpcError::Protocol(error.to_string())),
        };
        let body = frame.slice(body_offset(FrameKind::Request)..);
        let waited = tokio::time::timeout(timeout, self.in_flight.clone().acquire_owned()).await;
        let permit = match waited {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(RpcError::ConnectionLost("server shut down".to_string())),
            Err(_) => return Err(RpcError::Timeout),
        };
        let mut response = BytesMut::new();
        let response = match self.service.handle(&header, body, &mut response) {
            Handled::Done => {
                drop(permit);
                // Nothing above waited: let a caller that runs many such calls back to back
                // (a pipelined RESP connection) give its worker thread to other tasks now and
                // then, as reading from a socket would.
                tokio::task::consume_budget().await;
                response
            }
            Handled::Later(future) => {
                let handler = tokio::spawn(async move {
                    let response = future.await;
                    drop(permit);
                    response
                });
                match tokio::time::timeout(timeout, handler).await {
                    Ok(Ok(response)) => response,
                    Ok(Err(error)) => return Err(RpcError::ConnectionLost(error.to_string())),
                    Err(_) => return Err(RpcError::Timeout),
                }
            }
        };
        decode_response_frame(opcode, response.freeze())
    }
}

/// Channels to many servers, one (or a few) per address, created on first use and replaced
/// when they break.
#[derive(Debug)]
pub struct ChannelPool {
    network: Arc<dyn Network>,
    config: RpcConfig,
    channels: Mutex<BTreeMap<String, Vec<Arc<Channel>>>>,
    round_robin: AtomicU64,
    /// Which of several coordinator addresses answered last (see [`ChannelPool::call_coordinator`]).
    coordinator_preferred: AtomicU64,
    /// The server living in this process, if any.
    in_process: Option<InProcessServer>,
}

impl ChannelPool {
    /// An empty pool.
    pub fn new(network: Arc<dyn Network>, config: RpcConfig) -> ChannelPool {
        assert!(config.connections_per_address >= 1);
        ChannelPool {
            network,
            config,
            channels: Mutex::new(BTreeMap::new()),
            round_robin: AtomicU64::new(0),
            coordinator_preferred: AtomicU64::new(0),
            in_process: None,
        }
    }

    /// The same pool, with calls to `address` handled by `service` in this process: the
    /// address must be the one that server advertises, so that the tablet map's owner
    /// addresses name it.
    pub fn with_in_process_server(
        mut self,
        address: impl Into<String>,
        service: Arc<dyn Service>,
    ) -> ChannelPool {
        self.in_process = Some(InProcessServer {
            address: address.into(),
            service,
            in_flight: Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX)),
        });
        self
    }

    /// The pool's settings.
    pub fn config(&self) -> &RpcConfig {
        &self.config
    }

    /// An open channel to `address`, connecting if needed.
    pub async fn channel(&self, address: &str) -> Result<Arc<Channel>, RpcError> {
        let turn = self.round_robin.fetch_add(1, Ordering::Relaxed) as usize;
        {
            let mut channels = self.channels.lock().unwrap_or_else(|poison| poison.into_inner());
            if let Some(list) = channels.get_mut(address) {
                list.retain(|channel| !channel.is_closed());
                if list.len() >= self.config.connections_per_address {
                    return Ok(list[turn % list.len()].clone());
                }
            }
        }
        let channel = Arc::new(Channel::connect(&*self.network, address, &self.config).await?);
        let mut channels = self.channels.lock().unwrap_or_else(|poison| poison.into_inner());
        let list = channels.entry(address.to_string()).or_default();
        if list.len() < self.config.connections_per_address {
            list.push(channel.clone());
        }
        Ok(channel)
    }

    /// One attempt of `request` against `address`, with the configured timeout.
    pub async fn call(
        &self,
        address: &str,
        request: &Request,
    ) -> Result<(Status, ResponseBody), RpcError> {
        self.call_within(address, request, self.config.request_timeout).await
    }

    /// One attempt of `request` against `address` that ends within `timeout` (or the
    /// configured request timeout, if shorter), connecting included: for a caller whose
    /// operation has less time left. A connection not made in time fails as not connected
    /// (nothing was sent).
    pub async fn call_within(
        &self,
        address: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<(Status, ResponseBody), RpcError> {
        let timeout = timeout.min(self.config.request_timeout);
        if let Some(server) = self.in_process.as_ref().filter(|server| server.address == address) {
            return server.call(request, timeout).await;
        }
        // Only the connecting is cut short from outside: a call cancelled halfway would leave
        // its completion slot behind, so the call keeps its own timeout.
        let channel = match tokio::time::timeout(timeout, self.channel(address)).await {
            Ok(channel) => channel?,
            Err(_) => return Err(RpcError::Connect(format!("no connection to {address} in time"))),
        };
        channel.call(request, timeout).await
    }

    /// One attempt of `request` against the coordinator at `coordinators`: one address, or
    /// several separated by commas (the coordinators of a cluster with standbys, of which one
    /// is active and listens). Starts with the address that answered last; after a transport
    /// failure it drops that address's channels and tries the next, each address once, and
    /// returns the last failure if none answers. A status from a coordinator is an answer,
    /// except RETRY: a standby (or a deposed coordinator) answers it to everything, so the
    /// next address is tried, and the first RETRY is returned only if no coordinator gives
    /// another answer. After a failure the next call starts at the next address, so a dead
    /// coordinator that times out does not take every call's whole time; addresses the time
    /// ran out before are not tried (and not blamed).
    pub async fn call_coordinator(
        &self,
        coordinators: &str,
        request: &Request,
    ) -> Result<(Status, ResponseBody), RpcError> {
        self.call_coordinator_within(coordinators, request, self.config.request_timeout).await
    }

    /// [`ChannelPool::call_coordinator`] that ends within `timeout` (or the configured request
    /// timeout, if shorter) for all the addresses tried together: for a caller whose
    /// operation has less time left. An address tried once the time is out fails as not
    /// connected (nothing is sent).
    pub async fn call_coordinator_within(
        &self,
        coordinators: &str,
        request: &Request,
        timeout: Duration,
    ) -> Result<(Status, ResponseBody), RpcError> {
        let addresses = || coordinators.split(',').map(str::trim).filter(|a| !a.is_empty());
        let count = addresses().count().max(1) as u64;
        let first = self.coordinator_preferred.load(Ordering::Relaxed) % count;
        let started = tokio::time::Instant::now();
        let mut last_failure = None;
        let mut first_retry = None;
        for turn in 0..count {
            let index = (first + turn) % count;
            // No address at all: the whole text, which then fails to connect with its name.
            let address = addresses().nth(index as usize).unwrap_or(coordinators);
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() && turn > 0 {
                // Out of time: the addresses left were not tried, so nothing is learnt about
                // them (the next call starts after the last one that failed).
                break;
            }
            match self.call_within(address, request, left).await {
                Ok((Status::Retry, body)) => {
                    first_retry.get_or_insert((Status::Retry, body));
                }
                Ok(answer) => {
                    self.coordinator_preferred.store(index, Ordering::Relaxed);
                    return Ok(answer);
                }
                Err(failure) => {
                    self.forget(address);
                    self.coordinator_preferred.store(index + 1, Ordering::Relaxed);
                    last_failure = Some(failure);
                }
            }
        }
        match first_retry {
            Some(answer) => Ok(answer),
            None => Err(last_failure.expect("at least one address was tried")),
        }
    }

    /// Drops the channels to `address` (after a timeout: the server may be gone).
    pub fn forget(&self, address: &str) {
        self.channels.lock().unwrap_or_else(|poison| poison.into_inner()).remove(address);
    }
}
