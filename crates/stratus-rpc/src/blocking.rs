//! A synchronous connection for callers without an async runtime.
//!
//! [`BlockingChannel`] sends one request at a time over a plain blocking socket and waits for
//! its response in the `recv` system call itself. The async [`crate::Channel`] needs a writer
//! task, a reader task and a runtime that parks in `epoll_wait`; a thread that only ever waits
//! for one answer pays for all of that on every request (measured with `stratus bench ycsb`:
//! four system calls per read instead of two, and about a quarter more CPU per operation in
//! the driver threads than Redis's blocking client). Same frames, same handshake, same
//! validation as the async channel; no pipelining.
//!
//! It speaks to real sockets only (`std::net`), not through `stratus-env`'s network: the
//! deterministic simulation drives the async client, never this one. It speaks TLS when given
//! a [`ClientTls`] (rustls over the same blocking socket), and no credentials preamble.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use stratus_wire::{
    decode_frame_header, encode_request, frame_length, FrameKind, Hello, Request, ResponseBody,
    Status, HELLO_BYTES, PROTOCOL_VERSION,
};

use crate::client::{decode_response_frame, RpcConfig, RpcError};
use stratus_tls::{BlockingStream, ClientTls};

/// Bytes read from the socket at a time (and kept between responses): one read takes a whole
/// response of a small object and the header of a large one.
const INPUT_BYTES_DEFAULT: usize = 64 << 10;

/// How far a socket's timeout may lie above the time a call has left before it is lowered (a
/// system call): a call overshoots its timeout by at most this (plus the kernel's rounding of
/// socket timeouts up to its tick), and a call answered within it changes no timeout at all.
const TIMEOUT_SLACK: Duration = Duration::from_millis(5);

/// How long a connection may sit idle before [`BlockingChannel::is_open`] asks the kernel
/// whether the server closed it (three system calls). Below it the check is skipped: a server
/// that went away within this time of its last answer costs the next call a lost connection,
/// as it would had it gone away just after that call was sent.
const IDLE_CHECK_AFTER: Duration = Duration::from_millis(1);

/// The instant `timeout` from now; a timeout too long to add (`Duration::MAX`, say) is as good
/// as none, and gives an instant more than a century away instead of a panic.
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or(now + Duration::from_secs(1 << 32))
}

/// One blocking connection to a server: a request, then its response, then the next request.
///
/// After any error the connection's state is unknown (a response may still arrive for a
/// request that timed out): drop the channel and connect again.
#[derive(Debug)]
pub struct BlockingChannel {
    address: String,
    stream: BlockingStream,
    /// Received bytes: `input[..filled]` is data, the rest room for the next read.
    input: Vec<u8>,
    filled: usize,
    output: BytesMut,
    next_request_id: u64,
    /// The read and write timeouts the socket has now.
    socket_timeout: Duration,
    /// When the last call ended.
    last_used: Instant,
}

impl BlockingChannel {
    /// Connects to `address` ("host:port") and performs the version handshake, within the
    /// connect timeout of `config`.
    pub fn connect(address: &str, config: &RpcConfig) -> Result<BlockingChannel, RpcError> {
        BlockingChannel::connect_within(address, config, config.connect_timeout)
    }

    /// [`BlockingChannel::connect`] within `timeout` (and the connect timeout of `config`), for
    /// a caller whose operation has less time left than that.
    pub fn connect_within(
        address: &str,
        config: &RpcConfig,
        timeout: Duration,
    ) -> Result<BlockingChannel, RpcError> {
        BlockingChannel::connect_with_tls(address, config, timeout, None)
    }

    /// [`BlockingChannel::connect_within`], speaking TLS with `tls` if given (the server's
    /// certificate must name the host of `address`).
    pub fn connect_with_tls(
        address: &str,
        config: &RpcConfig,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<BlockingChannel, RpcError> {
        let connect_error =
            |error: std::io::Error| RpcError::Connect(format!("{address}: {error}"));
        let deadline = deadline_after(timeout.min(config.connect_timeout));
        let left = || {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                Err(RpcError::Connect(format!("{address}: no connection in time")))
            } else {
                Ok(left)
            }
        };
        let mut last_error = None;
        let mut connected = None;
        for socket_address in address.to_socket_addrs().map_err(connect_error)? {
            match TcpStream::connect_timeout(&socket_address, left()?) {
                Ok(stream) => {
                    connected = Some(stream);
                    break;
                }
                Err(error) => last_error = Some(error),
            }
        }
        let stream = match (connected, last_error) {
            (Some(stream), _) => stream,
            (None, Some(error)) => return Err(connect_error(error)),
            (None, None) => {
                return Err(RpcError::Connect(format!("{address} resolves to no address")))
            }
        };
        let configure = |stream: &TcpStream, timeout: Duration| -> std::io::Result<()> {
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))
        };
        configure(&stream, left()?).map_err(connect_error)?;
        stream.set_nodelay(true).map_err(connect_error)?;
        // With TLS, the handshake runs within the first write, under the socket's timeouts.
        let mut stream = BlockingStream::new(stream, tls, address).map_err(connect_error)?;
        let hello = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
        stream.write_all(&hello.encode()).map_err(connect_error)?;
        let mut reply = [0u8; HELLO_BYTES];
        stream
            .read_exact(&mut reply)
            .map_err(|error| RpcError::Connect(format!("{address}: handshake: {error}")))?;
        let reply = Hello::decode(&reply).map_err(|error| RpcError::Protocol(error.to_string()))?;
        if reply.status != Status::Ok || reply.version != PROTOCOL_VERSION {
            return Err(RpcError::VersionMismatch { server_version: reply.version });
        }
        configure(stream.tcp(), config.request_timeout).map_err(connect_error)?;
        Ok(BlockingChannel {
            address: address.to_string(),
            stream,
            input: vec![0; INPUT_BYTES_DEFAULT],
            filled: 0,
            output: BytesMut::with_capacity(INPUT_BYTES_DEFAULT),
            next_request_id: 1,
            socket_timeout: config.request_timeout,
            last_used: Instant::now(),
        })
    }

    /// False if the server closed the connection (or sent something unasked) while it was
    /// idle, so that a request sent on it would be lost before it reached anyone. Checked only
    /// after [`IDLE_CHECK_AFTER`] of idleness, without waiting.
    pub fn is_open(&self) -> bool {
        if self.filled != 0 {
            // Bytes nobody asked for: the stream is out of step.
            return false;
        }
        if self.last_used.elapsed() < IDLE_CHECK_AFTER {
            return true;
        }
        // With TLS too: the servers send no TLS 1.3 session tickets (stratus-tls), so any byte
        // from an idle TLS server is an alert or the end: the connection is over either way.
        let socket = self.stream.tcp();
        if socket.set_nonblocking(true).is_err() {
            return false;
        }
        let idle = matches!(
            socket.peek(&mut [0u8; 1]),
            Err(error) if error.kind() == ErrorKind::WouldBlock
        );
        socket.set_nonblocking(false).is_ok() && idle
    }

    /// The server's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Sends `request` and waits for its response, for at most `timeout` (give or take
    /// [`TIMEOUT_SLACK`]).
    pub fn call(
        &mut self,
        request: &Request,
        timeout: Duration,
    ) -> Result<(Status, ResponseBody), RpcError> {
        let deadline = deadline_after(timeout);
        let request_id = self.next_request_id;
        self.next_request_id += 1;
        self.output.clear();
        encode_request(&mut self.output, request_id, request);
        self.send_output(deadline)?;
        if self.output.capacity() > 4 * INPUT_BYTES_DEFAULT {
            // A large request passed: give its memory back.
            self.output = BytesMut::with_capacity(INPUT_BYTES_DEFAULT);
        }
        let frame = self.read_frame(deadline)?;
        self.last_used = Instant::now();
        let header = decode_frame_header(&frame)
            .map_err(|error| RpcError::Protocol(format!("bad frame: {error}")))?;
        if header.kind != FrameKind::Response {
            return Err(RpcError::Protocol("server sent a request frame".to_string()));
        }
        if header.request_id != request_id {
            // One request at a time, and a channel is dropped after a timeout: any other id
            // is the server's mistake.
            return Err(RpcError::Protocol(format!(
                "response to request {} while waiting for {request_id}",
                header.request_id
            )));
        }
        decode_response_frame(request.opcode(), frame)
    }

    /// Writes the whole output buffer, each write bounded by the time left.
    fn send_output(&mut self, deadline: Instant) -> Result<(), RpcError> {
        let mut sent = 0;
        while sent < self.output.len() {
            self.bound_socket_waits(deadline)?;
            match self.stream.write(&self.output[sent..]) {
                Ok(0) => {
                    return Err(RpcError::ConnectionLost("sending: the socket took nothing".into()))
                }
                Ok(written) => sent += written,
                // The deadline decides, not a socket timeout that may fire a little early.
                Err(error) if is_wait_over(&error) => {}
                Err(error) => return Err(RpcError::ConnectionLost(format!("sending: {error}"))),
            }
        }
        Ok(())
    }

    /// Fails with a timeout once `deadline` has passed; otherwise makes sure the next blocking
    /// read or write of the socket cannot wait (much) past it, or (much) less than is left.
    fn bound_socket_waits(&mut self, deadline: Instant) -> Result<(), RpcError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RpcError::Timeout);
        }
        if left + TIMEOUT_SLACK < self.socket_timeout || left > self.socket_timeout + TIMEOUT_SLACK
        {
            let set = |stream: &TcpStream| -> std::io::Result<()> {
                stream.set_read_timeout(Some(left))?;
                stream.set_write_timeout(Some(left))
            };
            set(self.stream.tcp()).map_err(|error| {
                RpcError::ConnectionLost(format!("setting a socket timeout: {error}"))
            })?;
            self.socket_timeout = left;
        }
        Ok(())
    }

    /// Reads until one whole frame is buffered and returns it.
    fn read_frame(&mut self, deadline: Instant) -> Result<Bytes, RpcError> {
        loop {
            let buffered = &self.input[..self.filled];
            match frame_length(buffered) {
                Ok(Some(length)) if buffered.len() >= length => {
                    let frame = Bytes::copy_from_slice(&buffered[..length]);
                    self.input.copy_within(length..self.filled, 0);
                    self.filled -= length;
                    if self.input.len() > INPUT_BYTES_DEFAULT && self.filled <= INPUT_BYTES_DEFAULT
                    {
                        // A large response passed: give its memory back.
                        self.input.truncate(INPUT_BYTES_DEFAULT);
                        self.input.shrink_to_fit();
                    }
                    return Ok(frame);
                }
                // Bounded: frame_length refuses lengths over FRAME_BYTES_MAX.
                Ok(Some(length)) if self.input.len() < length => self.input.resize(length, 0),
                Ok(_) => {}
                Err(error) => return Err(RpcError::Protocol(format!("bad frame: {error}"))),
            }
            self.bound_socket_waits(deadline)?;
            match self.stream.read(&mut self.input[self.filled..]) {
                Ok(0) => {
                    return Err(RpcError::ConnectionLost(format!(
                        "connection to {} closed by peer",
                        self.address
                    )))
                }
                Ok(read) => self.filled += read,
                Err(error) if is_wait_over(&error) => {}
                Err(error) => return Err(RpcError::ConnectionLost(format!("receiving: {error}"))),
            }
        }
    }
}

/// Whether a socket operation ended without failing the connection: its timeout expired or a
/// signal interrupted it (the caller checks the deadline and tries again).
fn is_wait_over(error: &std::io::Error) -> bool {
    matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_too_far_to_add_saturates_instead_of_panicking() {
        let far = deadline_after(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(100 * 365 * 86_400));
        let near = deadline_after(Duration::from_millis(5));
        assert!(near <= Instant::now() + Duration::from_millis(5));
    }
}
