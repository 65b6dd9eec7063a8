//! RESP values: the encoder the gateway answers with, and a general parser of every RESP2 and
//! RESP3 type (used by tests and by anything that reads a gateway's replies).
//!
//! The encoder writes the same [`Value`] in either protocol: RESP2 has no maps, sets, doubles,
//! booleans or typed nulls, so those are written the way Redis writes them to a RESP2 client
//! (maps and sets as flat arrays, doubles and big numbers as bulk strings, booleans as
//! integers, nulls as `$-1`).

use bytes::{BufMut, Bytes, BytesMut};

/// The protocol a connection speaks; HELLO switches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's start.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

/// One RESP value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `+text`: must not contain CR or LF (the encoder replaces them with spaces).
    SimpleString(String),
    /// `-text` (or RESP3's `!` blob error when parsed).
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n` binary-safe bytes.
    BulkString(Bytes),
    /// RESP3 `_`; RESP2 `$-1` (and `*-1` when parsed).
    Null,
    /// The null a command that answers arrays gives (EXEC of a transaction whose WATCHed key
    /// changed): RESP3 `_`, RESP2 `*-1`, as Redis writes it. Never produced by the parser,
    /// which reads both nulls as [`Value::Null`].
    NullArray,
    /// `*n`.
    Array(Vec<Value>),
    /// RESP3 `%n`; RESP2 a flat array of 2n elements.
    Map(Vec<(Value, Value)>),
    /// RESP3 `~n`; RESP2 an array.
    Set(Vec<Value>),
    /// RESP3 `,x`; RESP2 a bulk string.
    Double(f64),
    /// RESP3 `#t`/`#f`; RESP2 the integer 1 or 0.
    Boolean(bool),
    /// RESP3 `(digits`; RESP2 a bulk string.
    BigNumber(String),
    /// RESP3 `=n` with a 3-byte format ("txt"); RESP2 a bulk string of the text.
    VerbatimString {
        /// The format, for example `*b"txt"`.
        format: [u8; 3],
        /// The text.
        text: Bytes,
    },
    /// RESP3 `>n` out-of-band push; RESP2 an array.
    Push(Vec<Value>),
}

impl Value {
    /// A simple string from text.
    pub fn simple(text: &str) -> Value {
        Value::SimpleString(text.to_string())
    }

    /// `+OK`.
    pub fn ok() -> Value {
        Value::simple("OK")
    }

    /// An error reply; `text` starts with the error code (`ERR ...`).
    pub fn error(text: impl Into<String>) -> Value {
        Value::Error(text.into())
    }

    /// A bulk string copied from bytes.
    pub fn bulk(bytes: &[u8]) -> Value {
        Value::BulkString(Bytes::copy_from_slice(bytes))
    }

    /// Appends this value's encoding in `protocol` to `out`.
    pub fn encode(&self, protocol: Protocol, out: &mut BytesMut) {
        let resp3 = protocol == Protocol::Resp3;
        match self {
            Value::SimpleString(text) => line(out, b'+', text.as_bytes()),
            Value::Error(text) => line(out, b'-', text.as_bytes()),
            Value::Integer(number) => header(out, b':', *number),
            Value::BulkString(bytes) => bulk(out, bytes),
            Value::Null if resp3 => out.put_slice(b"_\r\n"),
            Value::Null => out.put_slice(b"$-1\r\n"),
            Value::NullArray if resp3 => out.put_slice(b"_\r\n"),
            Value::NullArray => out.put_slice(b"*-1\r\n"),
            Value::Array(items) => {
                header(out, b'*', items.len() as i64);
                items.iter().for_each(|item| item.encode(protocol, out));
            }
            Value::Map(pairs) => {
                if resp3 {
                    header(out, b'%', pairs.len() as i64);
                } else {
                    header(out, b'*', 2 * pairs.len() as i64);
                }
                for (key, value) in pairs {
                    key.encode(protocol, out);
                    value.encode(protocol, out);
                }
            }
            Value::Set(items) | Value::Push(items) => {
                let kind = match (resp3, self) {
                    (false, _) => b'*',
                    (true, Value::Set(_)) => b'~',
                    (true, _) => b'>',
                };
                header(out, kind, items.len() as i64);
                items.iter().for_each(|item| item.encode(protocol, out));
            }
            Value::Double(number) => {
                let text = format_double(*number);
                if resp3 {
                    line(out, b',', text.as_bytes());
                } else {
                    bulk(out, text.as_bytes());
                }
            }
            Value::Boolean(flag) if resp3 => {
                out.put_slice(if *flag { b"#t\r\n" } else { b"#f\r\n" })
            }
            Value::Boolean(flag) => header(out, b':', i64::from(*flag)),
            Value::BigNumber(digits) if resp3 => line(out, b'(', digits.as_bytes()),
            Value::BigNumber(digits) => bulk(out, digits.as_bytes()),
            Value::VerbatimString { format, text } if resp3 => {
                header(out, b'=', (text.len() + 4) as i64);
                out.put_slice(format);
                out.put_u8(b':');
                out.put_slice(text);
                out.put_slice(b"\r\n");
            }
            Value::VerbatimString { text, .. } => bulk(out, text),
        }
    }

    /// This value encoded in `protocol`, as a fresh buffer.
    pub fn to_bytes(&self, protocol: Protocol) -> BytesMut {
        let mut out = BytesMut::new();
        self.encode(protocol, &mut out);
        out
    }
}

fn format_double(number: f64) -> String {
    if number.is_nan() {
        "nan".to_string()
    } else if number.is_infinite() {
        if number > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{number}")
    }
}

/// `kind` + text + CRLF, with any CR or LF in the text replaced by a space: a line-based type
/// cannot carry them, and Redis sanitizes error texts the same way.
fn line(out: &mut BytesMut, kind: u8, text: &[u8]) {
    out.reserve(text.len() + 3);
    out.put_u8(kind);
    out.extend(text.iter().map(|&byte| if byte == b'\r' || byte == b'\n' { b' ' } else { byte }));
    out.put_slice(b"\r\n");
}

fn header(out: &mut BytesMut, kind: u8, number: i64) {
    out.put_u8(kind);
    out.put_slice(number.to_string().as_bytes());
    out.put_slice(b"\r\n");
}

fn bulk(out: &mut BytesMut, bytes: &[u8]) {
    out.reserve(bytes.len() + 16);
    header(out, b'$', bytes.len() as i64);
    out.put_slice(bytes);
    out.put_slice(b"\r\n");
}

/// Why bytes are not valid RESP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(pub String);

/// Most nesting levels the general parser follows: bounds its recursion on hostile input.
pub const VALUE_NESTING_MAX: usize = 64;
/// Most elements of one aggregate the general parser accepts (bounds what a length can make
/// it reserve).
pub const VALUE_ELEMENTS_MAX: usize = 1 << 20;
/// Longest bulk string or verbatim string the general parser accepts, in bytes (Redis's
/// proto-max-bulk-len default).
pub const VALUE_BULK_BYTES_MAX: usize = 512 << 20;

/// Parses one complete value at the start of `input`: `Ok(Some((value, bytes consumed)))`,
/// `Ok(None)` when more bytes are needed, `Err` when the bytes can never be valid RESP. Never
/// panics, and never allocates from a length before the bytes it announces are present.
pub fn parse_value(input: &[u8]) -> Result<Option<(Value, usize)>, ParseError> {
    let mut position = 0;
    match parse_at(input, &mut position, 0)? {
        Some(value) => Ok(Some((value, position))),
        None => Ok(None),
    }
}

/// The line starting at `*position` (without CRLF), advancing past the CRLF.
fn take_line<'a>(input: &'a [u8], position: &mut usize) -> Result<Option<&'a [u8]>, ParseError> {
    let rest = &input[*position..];
    match rest.windows(2).position(|pair| pair == b"\r\n") {
        Some(end) => {
            *position += end + 2;
            Ok(Some(&rest[..end]))
        }
        None if rest.len() > 64 << 10 => Err(ParseError("line longer than 64 KiB".to_string())),
        None => Ok(None),
    }
}

fn parse_integer(text: &[u8]) -> Result<i64, ParseError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .ok_or_else(|| ParseError(format!("invalid integer {:?}", text.escape_ascii().to_string())))
}

fn parse_length(text: &[u8], max: usize) -> Result<Option<usize>, ParseError> {
    let number = parse_integer(text)?;
    if number == -1 {
        return Ok(None);
    }
    match usize::try_from(number) {
        Ok(length) if length <= max => Ok(Some(length)),
        _ => Err(ParseError(format!("invalid length {number}"))),
    }
}

fn text(bytes: &[u8]) -> Result<String, ParseError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| ParseError("text is not UTF-8".to_string()))
}

/// `length` bytes then CRLF at `*position`.
fn take_blob(
    input: &[u8],
    position: &mut usize,
    length: usize,
) -> Result<Option<Bytes>, ParseError> {
    let rest = &input[*position..];
    if rest.len() < length + 2 {
        return Ok(None);
    }
    if &rest[length..length + 2] != b"\r\n" {
        return Err(ParseError("blob not followed by CRLF".to_string()));
    }
    *position += length + 2;
    Ok(Some(Bytes::copy_from_slice(&rest[..length])))
}

fn parse_elements(
    input: &[u8],
    position: &mut usize,
    count: usize,
    depth: usize,
) -> Result<Option<Vec<Value>>, ParseError> {
    // Reserve at most what the remaining bytes could hold (each element takes >= 3 bytes).
    let mut items = Vec::with_capacity(count.min((input.len() - *position) / 3));
    for _ in 0..count {
        match parse_at(input, position, depth + 1)? {
            Some(item) => items.push(item),
            None => return Ok(None),
        }
    }
    Ok(Some(items))
}

fn parse_at(input: &[u8], position: &mut usize, depth: usize) -> Result<Option<Value>, ParseError> {
    if depth > VALUE_NESTING_MAX {
        return Err(ParseError("nesting too deep".to_string()));
    }
    let Some(&kind) = input.get(*position) else { return Ok(None) };
    *position += 1;
    let Some(line) = take_line(input, position)? else { return Ok(None) };
    let value = match kind {
        b'+' => Value::SimpleString(text(line)?),
        b'-' => Value::Error(text(line)?),
        b':' => Value::Integer(parse_integer(line)?),
        b'_' if line.is_empty() => Value::Null,
        b'#' => match line {
            b"t" => Value::Boolean(true),
            b"f" => Value::Boolean(false),
            _ => return Err(ParseError("invalid boolean".to_string())),
        },
        b',' => {
            let number = match line {
                b"inf" => f64::INFINITY,
                b"-inf" => f64::NEG_INFINITY,
                _ => std::str::from_utf8(line)
                    .ok()
                    .and_then(|text| text.parse::<f64>().ok())
                    .ok_or_else(|| ParseError("invalid double".to_string()))?,
            };
            Value::Double(number)
        }
        b'(' => {
            let digits = text(line)?;
            let body = digits.strip_prefix('-').unwrap_or(&digits);
            if body.is_empty() || !body.bytes().all(|byte| byte.is_ascii_digit()) {
                return Err(ParseError("invalid big number".to_string()));
            }
            Value::BigNumber(digits)
        }
        b'$' | b'!' | b'=' => {
            let Some(length) = parse_length(line, VALUE_BULK_BYTES_MAX)? else {
                return if kind == b'$' {
                    Ok(Some(Value::Null))
                } else {
                    Err(ParseError("negative blob length".to_string()))
                };
            };
            let Some(blob) = take_blob(input, position, length)? else { return Ok(None) };
            match kind {
                b'$' => Value::BulkString(blob),
                b'!' => Value::Error(text(&blob)?),
                _ => {
                    if blob.len() < 4 || blob[3] != b':' {
                        return Err(ParseError("invalid verbatim string".to_string()));
                    }
                    let format = [blob[0], blob[1], blob[2]];
                    Value::VerbatimString { format, text: blob.slice(4..) }
                }
            }
        }
        b'*' | b'~' | b'>' => {
            let Some(count) = parse_length(line, VALUE_ELEMENTS_MAX)? else {
                return if kind == b'*' {
                    Ok(Some(Value::Null))
                } else {
                    Err(ParseError("negative aggregate length".to_string()))
                };
            };
            let Some(items) = parse_elements(input, position, count, depth)? else {
                return Ok(None);
            };
            match kind {
                b'*' => Value::Array(items),
                b'~' => Value::Set(items),
                _ => Value::Push(items),
            }
        }
        b'%' => {
            let Some(count) = parse_length(line, VALUE_ELEMENTS_MAX / 2)? else {
                return Err(ParseError("negative map length".to_string()));
            };
            let Some(items) = parse_elements(input, position, 2 * count, depth)? else {
                return Ok(None);
            };
            let mut pairs = Vec::with_capacity(count);
            let mut items = items.into_iter();
            while let (Some(key), Some(value)) = (items.next(), items.next()) {
                pairs.push((key, value));
            }
            Value::Map(pairs)
        }
        other => return Err(ParseError(format!("unknown type byte {:?}", other as char))),
    };
    Ok(Some(value))
}
