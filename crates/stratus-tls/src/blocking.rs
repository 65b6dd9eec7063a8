//! TLS for blocking sockets: the blocking RPC channel and the benchmarks' Redis driver.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::client::{server_name_of, ClientTls};

/// A blocking connection: plain TCP, or TLS over it (rustls's blocking stream: each read and
/// write drives the TLS state machine, and a write sends the records of what it accepted
/// before returning).
#[derive(Debug)]
pub enum BlockingStream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl BlockingStream {
    /// `stream` as is without `tls`, or with TLS to the server at `address` (its certificate
    /// must name the host). The handshake runs within the first read or write, under the
    /// socket's timeouts.
    pub fn new(
        stream: TcpStream,
        tls: Option<&ClientTls>,
        address: &str,
    ) -> io::Result<BlockingStream> {
        let Some(tls) = tls else { return Ok(BlockingStream::Plain(stream)) };
        let name = server_name_of(address)?;
        let connection = rustls::ClientConnection::new(tls.config(), name).map_err(|error| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("TLS: {error}"))
        })?;
        Ok(BlockingStream::Tls(Box::new(rustls::StreamOwned::new(connection, stream))))
    }

    /// The TCP socket underneath (for timeouts and idle checks).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            BlockingStream::Plain(stream) => stream,
            BlockingStream::Tls(stream) => &stream.sock,
        }
    }
}

impl Read for BlockingStream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Plain(stream) => stream.read(buffer),
            BlockingStream::Tls(stream) => stream.read(buffer),
        }
    }
}

impl Write for BlockingStream {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            BlockingStream::Plain(stream) => stream.write(bytes),
            BlockingStream::Tls(stream) => stream.write(bytes),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            BlockingStream::Plain(stream) => stream.flush(),
            BlockingStream::Tls(stream) => stream.flush(),
        }
    }
}
