//! TLS over any `stratus_env::Network`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use stratus_env::{BoxFuture, BoxReader, BoxWriter, Connection, Listener, Network};
use stratus_types::limits::TLS_HANDSHAKES_IN_FLIGHT_MAX;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::task::JoinSet;

use crate::client::ClientTls;
use crate::server::ServerTls;

/// A network whose listeners speak TLS as servers (with `server`) and whose connections speak
/// it as clients (with `client`), over `inner`. Either side may be absent: a client process
/// has no listener certificate, and a server without a CA to check its peers against cannot
/// open TLS connections (its configuration refuses that combination).
#[derive(Debug)]
pub struct TlsNetwork {
    inner: Arc<dyn Network>,
    server: Option<Arc<ServerTls>>,
    client: Option<ClientTls>,
}

impl TlsNetwork {
    /// `inner` with TLS on the sides given.
    pub fn new(
        inner: Arc<dyn Network>,
        server: Option<Arc<ServerTls>>,
        client: Option<ClientTls>,
    ) -> TlsNetwork {
        TlsNetwork { inner, server, client }
    }
}

impl Network for TlsNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move {
            let connection = self.inner.connect(address).await?;
            let Some(client) = &self.client else { return Ok(connection) };
            let peer_address = connection.peer_address.clone();
            let stream = client.connect(address, Joined::from(connection)).await?;
            Ok(split(stream, peer_address))
        })
    }

    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let listener = self.inner.bind(address).await?;
            let Some(server) = &self.server else { return Ok(listener) };
            let tls =
                TlsListener { inner: listener, tls: server.clone(), handshakes: JoinSet::new() };
            Ok(Box::new(tls) as Box<dyn Listener>)
        })
    }
}

/// A listener whose connections have finished a TLS handshake. Handshakes run on their own
/// tasks, [`TLS_HANDSHAKES_IN_FLIGHT_MAX`] at most, so one slow client does not hold up the
/// accept loop and a flood of silent ones cannot grow without bound.
#[derive(Debug)]
struct TlsListener {
    inner: Box<dyn Listener>,
    tls: Arc<ServerTls>,
    handshakes: JoinSet<io::Result<Connection>>,
}

impl Listener for TlsListener {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Connection>> {
        Box::pin(async move {
            let TlsListener { inner, tls, handshakes } = self;
            loop {
                tokio::select! {
                    // Both futures are cancel-safe: a TCP accept loses no connection, and
                    // `join_next` loses no finished handshake.
                    accepted = inner.accept(), if handshakes.len() < TLS_HANDSHAKES_IN_FLIGHT_MAX => {
                        let connection = accepted?;
                        let tls = tls.clone();
                        handshakes.spawn(async move {
                            let peer_address = connection.peer_address.clone();
                            let stream = tls.accept(Joined::from(connection), &peer_address).await?;
                            Ok(split(stream, peer_address))
                        });
                    }
                    Some(finished) = handshakes.join_next(), if !handshakes.is_empty() => {
                        // A failed handshake was counted and logged by `ServerTls::accept`.
                        if let Ok(Ok(connection)) = finished {
                            return Ok(connection);
                        }
                    }
                }
            }
        })
    }

    fn local_address(&self) -> String {
        self.inner.local_address()
    }
}

/// A TLS stream cut into the halves a `Connection` carries. The halves share the stream
/// through tokio's split lock: a reader task and a writer task each hold one.
fn split<S>(stream: S, peer_address: String) -> Connection
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (reader, writer) = tokio::io::split(stream);
    Connection { reader: Box::new(reader), writer: Box::new(writer), peer_address }
}

/// A connection's two halves as one stream again, for TLS to run over.
struct Joined {
    reader: BoxReader,
    writer: BoxWriter,
}

impl From<Connection> for Joined {
    fn from(connection: Connection) -> Joined {
        Joined { reader: connection.reader, writer: connection.writer }
    }
}

impl AsyncRead for Joined {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(context, buffer)
    }
}

impl AsyncWrite for Joined {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().writer).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.writer.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().writer).poll_shutdown(context)
    }
}
