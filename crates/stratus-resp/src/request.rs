//! The incremental parser of client requests: RESP arrays of bulk strings, and Redis's inline
//! commands (a line of words, what `telnet` sends).
//!
//! The parser consumes complete arguments from the connection's buffer as they arrive and keeps
//! the partial command between reads, so a command split over many reads is scanned once, and
//! each argument is a zero-copy slice of the bytes read. Every length is checked against a
//! limit before anything is reserved for it; any input either yields commands, asks for more
//! bytes, or is a [`ProtocolError`] (after which the connection is closed, as Redis does).
//!
//! A well-framed command with an argument over the limit (a value larger than the cluster
//! stores) is not a protocol error: its bytes are read and dropped as they arrive, without
//! being kept, and it yields [`Parsed::Refused`], which the connection answers with an error
//! before going on with the next command. Only a command that would make the connection drop
//! more than [`RequestLimits::refused_command_bytes_max`] ends it.

use bytes::{Buf, Bytes, BytesMut};

/// Bounds on one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Longest argument, in bytes. Redis allows 512 MiB; the gateway caps it at what the
    /// cluster can store (its value limit), since a longer argument can only fail.
    pub argument_bytes_max: usize,
    /// Most arguments of one command.
    pub arguments_max: usize,
    /// Most bytes of all arguments of one command together: bounds the memory one connection
    /// can hold in a half-received command.
    pub command_bytes_max: usize,
    /// Longest inline command line, in bytes (Redis: 64 KiB).
    pub inline_bytes_max: usize,
    /// Most bytes of a refused command (one with an argument over `argument_bytes_max`, or
    /// over `command_bytes_max` in all) read and dropped so that its error can be answered
    /// and the connection kept; a longer one is a protocol error. Dropped bytes are never
    /// held, so this bounds time spent reading, not memory. 512 MiB is Redis's largest
    /// argument (`proto-max-bulk-len`): what Redis would accept, Stratus refuses politely.
    pub refused_command_bytes_max: usize,
}

impl RequestLimits {
    /// The limits of a connection that has not given the password yet, as Redis has them for
    /// unauthenticated clients: at most 10 arguments of at most 16 KiB each (AUTH, HELLO with
    /// AUTH and SETNAME, QUIT fit), and a longer command ends the connection instead of being
    /// read and dropped. A client without the password can make the gateway hold at most a
    /// few KiB, and read nothing it cannot answer.
    pub fn before_authentication() -> RequestLimits {
        RequestLimits {
            argument_bytes_max: 16 << 10,
            arguments_max: 10,
            command_bytes_max: 64 << 10,
            inline_bytes_max: 16 << 10,
            refused_command_bytes_max: 0,
        }
    }
}

impl Default for RequestLimits {
    fn default() -> RequestLimits {
        RequestLimits {
            argument_bytes_max: stratus_types::limits::VALUE_BYTES_MAX_DEFAULT,
            arguments_max: 1 << 20,
            command_bytes_max: 64 << 20,
            inline_bytes_max: 64 << 10,
            refused_command_bytes_max: 512 << 20,
        }
    }
}

/// Bytes that can never be a valid request. The text follows Redis's `Protocol error: ...`
/// replies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl ProtocolError {
    fn new(text: impl Into<String>) -> ProtocolError {
        ProtocolError(text.into())
    }
}

/// Longest line holding a count or a length ("*1048576\r\n" is 10 bytes; 32 leaves room for
/// leading zeros without letting a peer send an endless number).
const LENGTH_LINE_BYTES_MAX: usize = 32;

/// What the parser found at the front of the buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A whole command: its arguments, the command name first.
    Command(Vec<Bytes>),
    /// A whole command read and dropped because it was over a limit; the text (without the
    /// `ERR ` prefix) is the error to answer. The connection stays usable.
    Refused(String),
}

/// A command being received: the arguments still expected and those complete so far.
#[derive(Debug)]
struct PartialCommand {
    remaining: usize,
    arguments: Vec<Bytes>,
    bytes: usize,
    /// Why the command is refused, once an argument broke a limit: every byte of it from
    /// there on is dropped, not kept.
    refused: Option<String>,
    /// Body bytes of the current argument still to drop (then its CRLF), while refused.
    dropping: Option<usize>,
    /// Bytes dropped so far (bounded by `refused_command_bytes_max`).
    dropped: usize,
}

impl PartialCommand {
    /// Drops what arrived of the argument being dropped. `Ok(true)` when the argument (and
    /// its CRLF) is gone, `Ok(false)` when more bytes are needed.
    fn drop_argument(&mut self, buffer: &mut BytesMut) -> Result<bool, ProtocolError> {
        let Some(left) = self.dropping else { return Ok(true) };
        let dropped = left.min(buffer.len());
        buffer.advance(dropped);
        let left = left - dropped;
        self.dropping = Some(left);
        if left > 0 || buffer.len() < 2 {
            return Ok(false);
        }
        if &buffer[..2] != b"\r\n" {
            return Err(ProtocolError::new("Protocol error: bulk string not followed by CRLF"));
        }
        buffer.advance(2);
        self.dropping = None;
        self.remaining -= 1;
        Ok(true)
    }
}

/// The parser of one connection.
#[derive(Debug)]
pub struct RequestParser {
    limits: RequestLimits,
    partial: Option<PartialCommand>,
}

/// Finds CRLF in the first `max` bytes: `Ok(Some(index of CR))`, `Ok(None)` when more bytes
/// may complete it, `Err` when `max` bytes came without one.
fn find_line_end(buffer: &[u8], max: usize, error: &str) -> Result<Option<usize>, ProtocolError> {
    let window = &buffer[..buffer.len().min(max + 2)];
    match window.windows(2).position(|pair| pair == b"\r\n") {
        Some(end) => Ok(Some(end)),
        None if buffer.len() >= max + 2 => Err(ProtocolError::new(error)),
        None => Ok(None),
    }
}

/// A decimal number as Redis's `string2ll` accepts it (optional '-', digits, no '+', no
/// spaces).
fn parse_number(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Why an argument of `length` bytes, after `bytes` of the command's earlier arguments, cannot
/// be taken, if it cannot.
fn refusal(limits: &RequestLimits, length: usize, bytes: usize) -> Option<String> {
    if length > limits.argument_bytes_max {
        return Some(format!(
            "argument of {length} bytes is longer than the limit of {} bytes (the largest value \
             the cluster stores)",
            limits.argument_bytes_max
        ));
    }
    if bytes.saturating_add(length) > limits.command_bytes_max {
        return Some(format!(
            "command longer than the limit of {} bytes",
            limits.command_bytes_max
        ));
    }
    None
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: RequestLimits) -> RequestParser {
        RequestParser { limits, partial: None }
    }

    /// Enforces `limits` from the next command on (called between commands: a command half
    /// received keeps the limits it started under until it completes).
    pub fn set_limits(&mut self, limits: RequestLimits) {
        self.limits = limits;
    }

    /// The next complete command from the front of `buffer` (consuming its bytes), `Ok(None)`
    /// when the buffer holds no complete command yet (what it holds of one is kept), or the
    /// error that ends the connection.
    pub fn next_command(&mut self, buffer: &mut BytesMut) -> Result<Option<Parsed>, ProtocolError> {
        loop {
            if self.partial.is_none() {
                match buffer.first() {
                    None => return Ok(None),
                    Some(b'*') => {
                        let Some(end) = find_line_end(
                            buffer,
                            LENGTH_LINE_BYTES_MAX,
                            "Protocol error: too big mbulk count string",
                        )?
                        else {
                            return Ok(None);
                        };
                        let count = parse_number(&buffer[1..end]).ok_or_else(|| {
                            ProtocolError::new("Protocol error: invalid multibulk length")
                        })?;
                        if count > self.limits.arguments_max as i64 {
                            return Err(ProtocolError::new(
                                "Protocol error: invalid multibulk length",
                            ));
                        }
                        buffer.advance(end + 2);
                        if count <= 0 {
                            // Redis ignores empty and null arrays.
                            continue;
                        }
                        let remaining = count as usize;
                        // Reserve from the count only up to a small bound: the count is a claim.
                        let arguments = Vec::with_capacity(remaining.min(64));
                        self.partial = Some(PartialCommand {
                            remaining,
                            arguments,
                            bytes: 0,
                            refused: None,
                            dropping: None,
                            dropped: 0,
                        });
                    }
                    Some(_) => match self.inline(buffer)? {
                        Some(arguments) if arguments.is_empty() => continue,
                        other => return Ok(other.map(Parsed::Command)),
                    },
                }
            }
            let Some(partial) = self.partial.as_mut() else { continue };
            while partial.remaining > 0 {
                if !partial.drop_argument(buffer)? {
                    return Ok(None);
                }
                if partial.remaining == 0 {
                    break;
                }
                let Some(&first) = buffer.first() else { return Ok(None) };
                if first != b'$' {
                    return Err(ProtocolError(format!(
                        "Protocol error: expected '$', got '{}'",
                        first.escape_ascii()
                    )));
                }
                let Some(end) = find_line_end(
                    buffer,
                    LENGTH_LINE_BYTES_MAX,
                    "Protocol error: invalid bulk length",
                )?
                else {
                    return Ok(None);
                };
                let length = parse_number(&buffer[1..end])
                    .and_then(|length| usize::try_from(length).ok())
                    .ok_or_else(|| ProtocolError::new("Protocol error: invalid bulk length"))?;
                if partial.refused.is_none() {
                    partial.refused = refusal(&self.limits, length, partial.bytes);
                }
                if partial.refused.is_some() {
                    partial.dropped = partial.dropped.saturating_add(length);
                    if partial.dropped > self.limits.refused_command_bytes_max {
                        return Err(ProtocolError::new("Protocol error: invalid bulk length"));
                    }
                    buffer.advance(end + 2);
                    partial.dropping = Some(length);
                    continue;
                }
                let needed = end + 2 + length + 2;
                if buffer.len() < needed {
                    // Bounded by the limits checked above.
                    buffer.reserve(needed - buffer.len());
                    return Ok(None);
                }
                if &buffer[needed - 2..needed] != b"\r\n" {
                    return Err(ProtocolError::new(
                        "Protocol error: bulk string not followed by CRLF",
                    ));
                }
                buffer.advance(end + 2);
                partial.arguments.push(buffer.split_to(length).freeze());
                buffer.advance(2);
                partial.bytes += length;
                partial.remaining -= 1;
            }
            let complete = self.partial.take().map(|partial| match partial.refused {
                Some(reason) => Parsed::Refused(reason),
                None => Parsed::Command(partial.arguments),
            });
            return Ok(complete);
        }
    }

    /// An inline command: one line split on spaces and tabs, without Redis's quoting (inline
    /// commands are for typing by hand; every client library sends arrays). An empty line
    /// gives no arguments, which the caller skips.
    fn inline(&mut self, buffer: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let window = &buffer[..buffer.len().min(self.limits.inline_bytes_max + 1)];
        let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
            if buffer.len() > self.limits.inline_bytes_max {
                return Err(ProtocolError::new("Protocol error: too big inline request"));
            }
            return Ok(None);
        };
        let line = buffer.split_to(newline + 1).freeze();
        let line = line.slice(..newline);
        let line = match line.last() {
            Some(b'\r') => line.slice(..line.len() - 1),
            _ => line,
        };
        let mut arguments = Vec::new();
        let mut start = None;
        for (index, &byte) in line.iter().enumerate() {
            let blank = byte == b' ' || byte == b'\t';
            match (blank, start) {
                (false, None) => start = Some(index),
                (true, Some(from)) => {
                    arguments.push(line.slice(from..index));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(from) = start {
            arguments.push(line.slice(from..));
        }
        if arguments.len() > self.limits.arguments_max {
            return Err(ProtocolError::new("Protocol error: invalid multibulk length"));
        }
        Ok(Some(arguments))
    }
}
