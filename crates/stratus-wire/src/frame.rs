//! The handshake and the frame envelope: everything a connection needs to find where one message
//! ends and the next begins, and to route a response to the request it answers, without looking
//! at any body.
//!
//! Layouts (little-endian, see docs/design/wire-protocol.md):
//!
//! ```text
//! hello:    [b"STRA"][u16 version][u16 status]
//! request:  [u32 frame_length][u8 kind = 1][u8 flags = 0][u16 opcode][u64 request_id][body]
//! response: [u32 frame_length][u8 kind = 2][u8 flags = 0][u16 opcode][u64 request_id]
//!           [u16 status][body]
//! ```
//!
//! `frame_length` counts the bytes after itself, so a reader needs only the first four bytes to
//! know how much to wait for.

use std::fmt;

use bytes::BytesMut;
use stratus_types::limits::FRAME_BYTES_MAX;

use crate::message::Opcode;
use crate::status::Status;

/// The four bytes that open every handshake, so a stray connection (an HTTP client, a port
/// scanner) is recognised and dropped before anything is parsed as a frame.
pub const MAGIC: [u8; 4] = *b"STRA";

/// The protocol version this crate speaks. Any change to a byte layout bumps it.
pub const PROTOCOL_VERSION: u16 = 6;

/// Size of the handshake message, in both directions.
pub const HELLO_BYTES: usize = 8;

/// Size of a request frame's header, including the 4-byte length field.
pub const REQUEST_HEADER_BYTES: usize = 16;

/// Size of a response frame's header, including the 4-byte length field.
pub const RESPONSE_HEADER_BYTES: usize = 18;

/// Size of the length field that opens every frame.
pub const LENGTH_FIELD_BYTES: usize = 4;

/// The handshake message. The client sends its version with status OK; the server answers with
/// its own version and OK, or PROTOCOL_VERSION_MISMATCH and then closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The sender's protocol version.
    pub version: u16,
    /// OK, or (from a server) why it refuses the connection.
    pub status: Status,
}

impl Hello {
    /// The 8 handshake bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let version = self.version.to_le_bytes();
        let status = self.status.code().to_le_bytes();
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], version[0], version[1], status[0], status[1]]
    }

    /// Parses handshake bytes; refuses a wrong magic or an unknown status code. The version is
    /// returned as sent: deciding whether it is acceptable is the server's job.
    pub fn decode(bytes: &[u8; HELLO_BYTES]) -> Result<Hello, FrameError> {
        let [m0, m1, m2, m3, v0, v1, s0, s1] = *bytes;
        if [m0, m1, m2, m3] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        let status_code = u16::from_le_bytes([s0, s1]);
        let status =
            Status::from_code(status_code).ok_or(FrameError::UnknownStatus(status_code))?;
        Ok(Hello { version: u16::from_le_bytes([v0, v1]), status })
    }
}

/// Which way a frame travels. On the wire: a u8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Client to server.
    Request = 1,
    /// Server to client.
    Response = 2,
}

impl FrameKind {
    /// The wire code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The kind for a wire code, if it is one.
    pub fn from_code(code: u8) -> Option<FrameKind> {
        match code {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Response),
            _ => None,
        }
    }

    /// Size of this kind's header, including the length field.
    pub fn header_bytes(self) -> usize {
        match self {
            FrameKind::Request => REQUEST_HEADER_BYTES,
            FrameKind::Response => RESPONSE_HEADER_BYTES,
        }
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request or response.
    pub kind: FrameKind,
    /// The raw opcode: kept raw so a server can answer UNIMPLEMENTED_REQUEST for a code it does
    /// not know, echoing it back.
    pub opcode_code: u16,
    /// Chosen by the client; the response carries the same id (responses may come out of order).
    pub request_id: u64,
    /// The response's status; always OK for requests.
    pub status: Status,
}

/// A malformed handshake or frame envelope. After one of these the byte stream cannot be
/// trusted, so the connection is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer bytes than the header (or the handshake) needs.
    TooShort,
    /// The frame (including its length field) is longer than `FRAME_BYTES_MAX`.
    TooLarge {
        /// Total bytes the frame announced (or occupies), including the length field.
        announced_bytes: u64,
    },
    /// The kind byte is neither request nor response.
    BadKind(u8),
    /// The flags byte is not zero (reserved for future versions).
    BadFlags(u8),
    /// The handshake does not start with [`MAGIC`].
    BadMagic,
    /// A membership preamble message is malformed (its magic, or a reserved field not zero).
    BadPreamble(&'static str),
    /// A status code this version does not know.
    UnknownStatus(u16),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooShort => f.write_str("frame shorter than its header"),
            FrameError::TooLarge { announced_bytes } => write!(
                f,
                "frame of {announced_bytes} bytes exceeds the maximum of {FRAME_BYTES_MAX} bytes"
            ),
            FrameError::BadKind(kind) => write!(f, "unknown frame kind {kind}"),
            FrameError::BadFlags(flags) => write!(f, "non-zero frame flags {flags:#04x}"),
            FrameError::BadMagic => f.write_str("handshake does not start with the magic \"STRA\""),
            FrameError::BadPreamble(what) => write!(f, "bad membership preamble: {what}"),
            FrameError::UnknownStatus(code) => write!(f, "unknown status code {code}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Reads a little-endian u16 at `offset`, or `None` if `bytes` is too short.
fn u16_at(bytes: &[u8], offset: usize) -> Option<u16> {
    let end = offset.checked_add(2)?;
    bytes.get(offset..end)?.try_into().ok().map(u16::from_le_bytes)
}

/// Reads a little-endian u32 at `offset`, or `None` if `bytes` is too short.
fn u32_at(bytes: &[u8], offset: usize) -> Option<u32> {
    let end = offset.checked_add(4)?;
    bytes.get(offset..end)?.try_into().ok().map(u32::from_le_bytes)
}

/// Reads a little-endian u64 at `offset`, or `None` if `bytes` is too short.
fn u64_at(bytes: &[u8], offset: usize) -> Option<u64> {
    let end = offset.checked_add(8)?;
    bytes.get(offset..end)?.try_into().ok().map(u64::from_le_bytes)
}

/// The total size (length field included) of the frame at the start of `buffer`, once its
/// length field has arrived: `Ok(None)` while fewer than 4 bytes are buffered.
///
/// Refuses a frame longer than `FRAME_BYTES_MAX` (`TooLarge`, so the reader never buffers an
/// attacker's claimed length) or shorter than a request header (`TooShort`).
pub fn frame_length(buffer: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(after_length) = u32_at(buffer, 0) else {
        return Ok(None);
    };
    // In u64 so that the addition cannot overflow on any platform.
    let total = u64::from(after_length) + LENGTH_FIELD_BYTES as u64;
    if total > FRAME_BYTES_MAX as u64 {
        return Err(FrameError::TooLarge { announced_bytes: total });
    }
    if total < REQUEST_HEADER_BYTES as u64 {
        return Err(FrameError::TooShort);
    }
    // Fits: total <= FRAME_BYTES_MAX, which is a usize.
    Ok(Some(total as usize))
}

/// Decodes the header of `frame`, which starts with the length field. Checks the kind, the
/// flags, that the bytes (and the announced length) cover the kind's header, and for a response
/// the status code. Does not look at the body.
pub fn decode_frame_header(frame: &[u8]) -> Result<FrameHeader, FrameError> {
    let after_length = u32_at(frame, 0).ok_or(FrameError::TooShort)?;
    let total = u64::from(after_length) + LENGTH_FIELD_BYTES as u64;
    if total > FRAME_BYTES_MAX as u64 {
        return Err(FrameError::TooLarge { announced_bytes: total });
    }
    let kind_code = *frame.get(4).ok_or(FrameError::TooShort)?;
    let kind = FrameKind::from_code(kind_code).ok_or(FrameError::BadKind(kind_code))?;
    let flags = *frame.get(5).ok_or(FrameError::TooShort)?;
    if flags != 0 {
        return Err(FrameError::BadFlags(flags));
    }
    let header_bytes = kind.header_bytes();
    if frame.len() < header_bytes || total < header_bytes as u64 {
        return Err(FrameError::TooShort);
    }
    let opcode_code = u16_at(frame, 6).ok_or(FrameError::TooShort)?;
    let request_id = u64_at(frame, 8).ok_or(FrameError::TooShort)?;
    let status = match kind {
        FrameKind::Request => Status::Ok,
        FrameKind::Response => {
            let code = u16_at(frame, 16).ok_or(FrameError::TooShort)?;
            Status::from_code(code).ok_or(FrameError::UnknownStatus(code))?
        }
    };
    Ok(FrameHeader { kind, opcode_code, request_id, status })
}

/// Where the body starts in a frame of this kind (the header size, length field included).
pub fn body_offset(kind: FrameKind) -> usize {
    kind.header_bytes()
}

/// The opcode and request id of a request header at the start of `bytes`, ignoring its length
/// field. Used to answer REQUEST_TOO_LARGE for a frame whose length is refused: the rest of the
/// header is still meaningful. `None` if fewer than 16 bytes, or not a well-formed request
/// header.
pub fn peek_request_identity(bytes: &[u8]) -> Option<(u16, u64)> {
    if bytes.get(4).copied() != Some(FrameKind::Request.code()) || bytes.get(5).copied() != Some(0)
    {
        return None;
    }
    Some((u16_at(bytes, 6)?, u64_at(bytes, 8)?))
}

/// A frame being built in place: where its length field is, so [`finish_frame`] can patch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a started frame must be finished, or its placeholder length is sent"]
pub struct FrameStart {
    /// Offset of the frame's length field in the output buffer.
    position: usize,
    /// The frame's kind, to know its header size.
    kind: FrameKind,
}

impl FrameStart {
    /// Offset of the frame's first byte (its length field) in the output buffer; truncating the
    /// buffer to this drops the frame.
    pub fn position(&self) -> usize {
        self.position
    }
}

/// Appends a request header with a placeholder length; finish it with [`finish_frame`].
pub fn begin_request(out: &mut BytesMut, request_id: u64, opcode: Opcode) -> FrameStart {
    begin_frame(out, FrameKind::Request, opcode.code(), request_id, None)
}

/// Appends a response header with a placeholder length; the caller appends the body (for
/// example a value copied straight out of the log) and then calls [`finish_frame`].
pub fn begin_response(
    out: &mut BytesMut,
    request_id: u64,
    opcode: Opcode,
    status: Status,
) -> FrameStart {
    begin_frame(out, FrameKind::Response, opcode.code(), request_id, Some(status))
}

/// Appends a header; `status` is written only for responses.
pub(crate) fn begin_frame(
    out: &mut BytesMut,
    kind: FrameKind,
    opcode_code: u16,
    request_id: u64,
    status: Option<Status>,
) -> FrameStart {
    let position = out.len();
    out.reserve(kind.header_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&[kind.code(), 0]);
    out.extend_from_slice(&opcode_code.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
    if let Some(status) = status {
        out.extend_from_slice(&status.code().to_le_bytes());
    }
    FrameStart { position, kind }
}

/// Patches the length of the frame begun at `start`, now that its body is complete.
///
/// Returns `Err(TooLarge)` (leaving the placeholder) if the frame exceeds `FRAME_BYTES_MAX`: the
/// caller truncates `out` to `start.position()` and sends an error instead. Returns
/// `Err(TooShort)` if `out` no longer holds the header (the caller truncated it).
pub fn finish_frame(out: &mut BytesMut, start: FrameStart) -> Result<(), FrameError> {
    let total = out.len().checked_sub(start.position).ok_or(FrameError::TooShort)?;
    if total < start.kind.header_bytes() {
        return Err(FrameError::TooShort);
    }
    if total > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge { announced_bytes: total as u64 });
    }
    patch_length(out, start);
    Ok(())
}

/// Writes the frame length whatever the size (saturating at u32::MAX, which a peer refuses as
/// too large); returns the frame's total size.
pub(crate) fn patch_length(out: &mut BytesMut, start: FrameStart) -> usize {
    let total = out.len().saturating_sub(start.position);
    let after_length = u32::try_from(total.saturating_sub(LENGTH_FIELD_BYTES)).unwrap_or(u32::MAX);
    let end = start.position.saturating_add(LENGTH_FIELD_BYTES);
    if let Some(field) = out.get_mut(start.position..end) {
        field.copy_from_slice(&after_length.to_le_bytes());
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trips_and_refuses_bad_input() {
        let hello = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
        assert_eq!(hello.encode(), *b"STRA\x06\x00\x00\x00");
        assert_eq!(Hello::decode(&hello.encode()), Ok(hello));
        assert_eq!(Hello::decode(b"STRB\x01\x00\x00\x00"), Err(FrameError::BadMagic));
        assert_eq!(Hello::decode(b"STRA\x01\x00\xff\x00"), Err(FrameError::UnknownStatus(255)));
    }

    #[test]
    fn frame_length_limits() {
        assert_eq!(frame_length(&[]), Ok(None));
        assert_eq!(frame_length(&[12, 0, 0]), Ok(None));
        assert_eq!(frame_length(&12u32.to_le_bytes()), Ok(Some(16)));
        assert_eq!(frame_length(&11u32.to_le_bytes()), Err(FrameError::TooShort));
        assert_eq!(
            frame_length(&u32::MAX.to_le_bytes()),
            Err(FrameError::TooLarge { announced_bytes: u64::from(u32::MAX) + 4 })
        );
        let largest = (FRAME_BYTES_MAX - 4) as u32;
        assert_eq!(frame_length(&largest.to_le_bytes()), Ok(Some(FRAME_BYTES_MAX)));
        assert_eq!(
            frame_length(&(largest + 1).to_le_bytes()),
            Err(FrameError::TooLarge { announced_bytes: FRAME_BYTES_MAX as u64 + 1 })
        );
    }

    #[test]
    fn header_checks() {
        let mut out = BytesMut::new();
        let start = begin_response(&mut out, 9, Opcode::Ping, Status::Retry);
        finish_frame(&mut out, start).unwrap();
        let header = decode_frame_header(&out).unwrap();
        assert_eq!(header.kind, FrameKind::Response);
        assert_eq!(header.request_id, 9);
        assert_eq!(header.status, Status::Retry);
        for cut in 0..out.len() {
            assert_eq!(decode_frame_header(&out[..cut]), Err(FrameError::TooShort), "cut {cut}");
        }
        let mut bad = out.to_vec();
        bad[4] = 3;
        assert_eq!(decode_frame_header(&bad), Err(FrameError::BadKind(3)));
        let mut bad = out.to_vec();
        bad[5] = 0x80;
        assert_eq!(decode_frame_header(&bad), Err(FrameError::BadFlags(0x80)));
        let mut bad = out.to_vec();
        bad[16..18].copy_from_slice(&500u16.to_le_bytes());
        assert_eq!(decode_frame_header(&bad), Err(FrameError::UnknownStatus(500)));
        // A response header announcing fewer bytes than a response header holds.
        let mut bad = out.to_vec();
        bad[0..4].copy_from_slice(&12u32.to_le_bytes());
        assert_eq!(decode_frame_header(&bad), Err(FrameError::TooShort));
    }

    #[test]
    fn peek_identity_reads_oversized_headers() {
        let mut out = BytesMut::new();
        let start = begin_request(&mut out, 77, Opcode::Write);
        finish_frame(&mut out, start).unwrap();
        out[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(peek_request_identity(&out), Some((Opcode::Write.code(), 77)));
        assert_eq!(peek_request_identity(&out[..15]), None);
        out[4] = 2;
        assert_eq!(peek_request_identity(&out), None);
    }

    #[test]
    fn finish_frame_refuses_oversized_and_truncated() {
        let mut out = BytesMut::new();
        let start = begin_response(&mut out, 1, Opcode::Read, Status::Ok);
        out.resize(FRAME_BYTES_MAX + 1, 0);
        assert_eq!(
            finish_frame(&mut out, start),
            Err(FrameError::TooLarge { announced_bytes: FRAME_BYTES_MAX as u64 + 1 })
        );
        out.truncate(start.position() + 3);
        assert_eq!(finish_frame(&mut out, start), Err(FrameError::TooShort));
    }
}
