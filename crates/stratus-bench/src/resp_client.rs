//! The drivers' Redis connection: blocking, one request (or one pipelined batch) at a time,
//! commands written as arrays of bulk strings, replies read with stratus-resp's bounded
//! parser (which never allocates from a length before the bytes it announces are present,
//! and bounds nesting), so a peer that misbehaves costs the driver an error, not its memory.

use std::io::{Read, Write};

use stratus_tls::{BlockingStream, ClientTls};

use stratus_resp::{parse_value, Value};

use crate::peers::connect;

/// The largest reply a driver accepts, in bytes: far above any reply of the benchmarks (a
/// YCSB scan's ZRANGEBYSCORE of 100 keys is a few KB), far below what would hurt the driver.
pub const REPLY_BYTES_MAX: usize = 16 << 20;

/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Why a call failed.
#[derive(Debug)]
pub enum RespError {
    /// The socket failed (or its bounded wait ran out).
    Io(std::io::Error),
    /// The server closed the connection.
    Closed,
    /// The bytes are not RESP, or a reply is larger than [`REPLY_BYTES_MAX`].
    Malformed(String),
    /// The server answered with an error reply.
    Refused(String),
    /// WAIT counted fewer replicas than asked for (with timeout 0 it only returns once it
    /// has them, so this is a broken promise, not a slow replica).
    TooFewReplicas {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas WAIT counted.
        acknowledged: i64,
    },
}

impl std::fmt::Display for RespError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RespError::Io(error) => write!(formatter, "redis connection: {error}"),
            RespError::Closed => write!(formatter, "redis closed the connection"),
            RespError::Malformed(why) => write!(formatter, "malformed redis reply: {why}"),
            RespError::Refused(message) => write!(formatter, "redis: {message}"),
            RespError::TooFewReplicas { wanted, acknowledged } => write!(
                formatter,
                "WAIT {wanted} 0 answered {acknowledged}: fewer replicas than asked for"
            ),
        }
    }
}

impl From<RespError> for String {
    fn from(error: RespError) -> String {
        error.to_string()
    }
}

/// One connection to a Redis server.
pub struct RespConnection {
    stream: BlockingStream,
    /// Bytes received and not parsed yet.
    received: Vec<u8>,
    /// The request being written (kept to reuse its memory).
    request: Vec<u8>,
    /// What one read of the socket fills (kept: zeroing a fresh one per read would cost the
    /// driver more than the copy out of it).
    chunk: Box<[u8]>,
}

impl RespConnection {
    /// Connects to `address` (loopback, Nagle off, bounded waits).
    pub fn open(address: &str) -> Result<RespConnection, String> {
        RespConnection::open_with(address, None)
    }

    /// [`RespConnection::open`], speaking TLS with `tls` if given.
    pub fn open_with(address: &str, tls: Option<&ClientTls>) -> Result<RespConnection, String> {
        let stream = BlockingStream::new(connect(address)?, tls, address)
            .map_err(|error| format!("{address}: {error}"))?;
        Ok(RespConnection {
            stream,
            received: Vec::with_capacity(READ_CHUNK_BYTES),
            request: Vec::new(),
            chunk: vec![0; READ_CHUNK_BYTES].into_boxed_slice(),
        })
    }

    /// Sends one command and reads its reply; an error reply is [`RespError::Refused`].
    pub fn call(&mut self, arguments: &[&[u8]]) -> Result<Value, RespError> {
        self.request.clear();
        append_command(&mut self.request, arguments);
        self.stream.write_all(&self.request).map_err(RespError::Io)?;
        match self.read_value()? {
            Value::Error(message) => Err(RespError::Refused(message)),
            value => Ok(value),
        }
    }

    /// Sends `command` and `WAIT replicas 0` in one write (one round trip) and reads both
    /// replies: the command's reply once `replicas` replicas acknowledged every write this
    /// connection made so far. This is how a Redis write is made as durable as a Stratus write
    /// acknowledged by R backups.
    pub fn call_then_wait(&mut self, command: &[&[u8]], replicas: u32) -> Result<Value, RespError> {
        let replicas_text = replicas.to_string();
        self.request.clear();
        append_command(&mut self.request, command);
        append_command(&mut self.request, &[b"WAIT", replicas_text.as_bytes(), b"0"]);
        self.stream.write_all(&self.request).map_err(RespError::Io)?;
        // Both replies are read before either is judged, so the connection stays in step.
        let reply = self.read_value()?;
        let waited = self.read_value()?;
        if let Value::Error(message) = reply {
            return Err(RespError::Refused(message));
        }
        match waited {
            Value::Integer(acknowledged) if acknowledged >= i64::from(replicas) => Ok(reply),
            Value::Integer(acknowledged) => {
                Err(RespError::TooFewReplicas { wanted: replicas, acknowledged })
            }
            Value::Error(message) => Err(RespError::Refused(message)),
            other => Err(RespError::Malformed(format!("WAIT answered {other:?}"))),
        }
    }

    /// Sends `commands` in one write (one round trip) and reads one reply per command, error
    /// replies included as [`Value::Error`]: every reply is read before any is judged, so the
    /// connection stays in step whatever the server answered.
    pub fn call_pipelined(&mut self, commands: &[Vec<&[u8]>]) -> Result<Vec<Value>, RespError> {
        self.request.clear();
        for command in commands {
            append_command(&mut self.request, command);
        }
        self.stream.write_all(&self.request).map_err(RespError::Io)?;
        commands.iter().map(|_| self.read_value()).collect()
    }

    /// Reads one whole reply, waiting (bounded by the socket's timeout) for its bytes.
    fn read_value(&mut self) -> Result<Value, RespError> {
        loop {
            match parse_value(&self.received) {
                Ok(Some((value, used))) => {
                    self.received.drain(..used);
                    return Ok(value);
                }
                Ok(None) => {}
                Err(error) => return Err(RespError::Malformed(error.0)),
            }
            if self.received.len() >= REPLY_BYTES_MAX {
                return Err(RespError::Malformed(format!(
                    "a reply larger than {REPLY_BYTES_MAX} bytes"
                )));
            }
            match self.stream.read(&mut self.chunk[..]) {
                Ok(0) => return Err(RespError::Closed),
                Ok(count) => self.received.extend_from_slice(&self.chunk[..count]),
                Err(error) => return Err(RespError::Io(error)),
            }
        }
    }
}

/// Appends a command, a RESP array of bulk strings, to `out`.
pub fn append_command(out: &mut Vec<u8>, arguments: &[&[u8]]) {
    out.push(b'*');
    out.extend_from_slice(arguments.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for argument in arguments {
        out.push(b'$');
        out.extend_from_slice(argument.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(argument);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A server that answers one connection with `reply`, in pieces of `piece_bytes`, once it
    /// read `expect_bytes` of request, then reads until the client closes (unread bytes at
    /// its close would reset the connection); returns everything it read.
    fn scripted_server(
        reply: Vec<u8>,
        expect_bytes: usize,
        piece_bytes: usize,
    ) -> (String, std::thread::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = vec![0u8; expect_bytes];
            stream.read_exact(&mut request).unwrap();
            // In pieces, so the reader has to wait for the rest of a reply; a reader that gave
            // up closes the connection, which ends the writing.
            for piece in reply.chunks(piece_bytes) {
                if stream.write_all(piece).is_err() {
                    break;
                }
            }
            let _ = stream.read_to_end(&mut request);
            request
        });
        (address, server)
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        let mut out = Vec::new();
        append_command(&mut out, &[b"SET", b"k", b"value"]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n");
    }

    #[test]
    fn a_write_and_its_wait_go_in_one_request_and_both_replies_are_read() {
        let mut expected_request = Vec::new();
        append_command(&mut expected_request, &[b"SET", b"k", b"v"]);
        append_command(&mut expected_request, &[b"WAIT", b"3", b"0"]);
        // The PING's reply comes with the others: the server answers before it is sent.
        let (address, server) =
            scripted_server(b"+OK\r\n:3\r\n+PONG\r\n".to_vec(), expected_request.len(), 3);
        let mut connection = RespConnection::open(&address).unwrap();
        let reply = connection.call_then_wait(&[b"SET", b"k", b"v"], 3).unwrap();
        assert_eq!(reply, Value::SimpleString("OK".into()));
        assert_eq!(connection.call(&[b"PING"]).unwrap(), Value::SimpleString("PONG".into()));
        drop(connection);
        let request = server.join().unwrap();
        assert_eq!(&request[..expected_request.len()], &expected_request[..]);
    }

    #[test]
    fn too_few_replicas_and_error_replies_are_errors() {
        let (address, _server) = scripted_server(b"+OK\r\n:2\r\n-ERR no\r\n".to_vec(), 0, 3);
        let mut connection = RespConnection::open(&address).unwrap();
        assert!(matches!(
            connection.call_then_wait(&[b"SET", b"k", b"v"], 3),
            Err(RespError::TooFewReplicas { wanted: 3, acknowledged: 2 })
        ));
        assert!(matches!(connection.call(&[b"GET", b"k"]), Err(RespError::Refused(_))));
    }

    #[test]
    fn a_reply_longer_than_the_limit_is_refused() {
        // 100 MiB announced (the parser itself would accept up to 512 MiB) and more than the
        // driver's limit sent: the reader stops at its limit instead of buffering the rest.
        let mut reply = b"$104857600\r\n".to_vec();
        reply.resize(reply.len() + REPLY_BYTES_MAX + (1 << 20), b'x');
        let (address, _server) = scripted_server(reply, 0, 1 << 20);
        let mut connection = RespConnection::open(&address).unwrap();
        let outcome = connection.call(&[b"GET", b"k"]);
        assert!(matches!(outcome, Err(RespError::Malformed(_))), "{outcome:?}");
        assert!(connection.received.len() < REPLY_BYTES_MAX + READ_CHUNK_BYTES);
    }

    #[test]
    fn nested_replies_parse() {
        let (address, _server) =
            scripted_server(b"*2\r\n$3\r\nfoo\r\n$-1\r\n:7\r\n".to_vec(), 0, 3);
        let mut connection = RespConnection::open(&address).unwrap();
        let reply = connection.call(&[b"MGET", b"a", b"b"]).unwrap();
        assert_eq!(
            reply,
            Value::Array(vec![Value::BulkString(bytes::Bytes::from_static(b"foo")), Value::Null])
        );
    }
}
