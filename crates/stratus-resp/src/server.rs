//! The accept loop and one connection's loop.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use stratus_env::{Connection, Listener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::commands::After;
use crate::gateway::{Gateway, Session};
use crate::request::{Parsed, RequestParser};
use crate::value::Value;

/// Replies are flushed when this many bytes are waiting, even in the middle of a pipeline, so
/// a client that pipelines many commands does not make the gateway buffer all their replies.
pub const OUTPUT_FLUSH_BYTES: usize = 64 << 10;

/// Bytes read from a socket at a time (at least; a long argument is read whole).
const READ_CHUNK_BYTES: usize = 16 << 10;

/// Accepts connections from `listener` forever, serving each on its own task.
pub async fn serve(gateway: Arc<Gateway>, mut listener: Box<dyn Listener>) {
    loop {
        let connection = match listener.accept().await {
            Ok(connection) => connection,
            Err(error) => {
                // Out of file descriptors and similar: wait instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        gateway.connections_received.fetch_add(1, Ordering::Relaxed);
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let peer = connection.peer_address.clone();
            if let Err(error) = serve_connection(&gateway, connection).await {
                tracing::debug!(%peer, %error, "connection ended");
            }
        });
    }
}

/// Decrements the connected-clients count however the connection ends.
struct ConnectedGuard<'a>(&'a Gateway);

impl Drop for ConnectedGuard<'_> {
    fn drop(&mut self) {
        self.0.connected_clients.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection until the peer closes it, sends QUIT, or breaks the protocol.
/// Commands are executed one at a time in arrival order, so a pipeline's replies come back
/// in order and each command sees the effects of those before it; the replies of every
/// command found in one read are sent together.
pub async fn serve_connection(gateway: &Gateway, connection: Connection) -> io::Result<()> {
    let Connection { mut reader, mut writer, .. } = connection;
    let connected = gateway.connected_clients.fetch_add(1, Ordering::Relaxed) + 1;
    let _guard = ConnectedGuard(gateway);
    if connected > gateway.config.connections_max {
        writer.write_all(b"-ERR max number of clients reached\r\n").await?;
        return writer.flush().await;
    }
    let mut session = Session::new(gateway.new_client_id());
    let mut parser = RequestParser::new(gateway.config.limits);
    let mut input = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut output = BytesMut::with_capacity(READ_CHUNK_BYTES);
    loop {
        loop {
            match parser.next_command(&mut input) {
                Ok(Some(Parsed::Refused(reason))) => {
                    // Its bytes were read and dropped: the stream is framed still.
                    Value::Error(format!("ERR {reason}")).encode(session.protocol, &mut output);
                }
                Ok(Some(Parsed::Command(arguments))) => {
                    let after = gateway.execute(&mut session, &arguments, &mut output).await;
                    if after == After::Close {
                        writer.write_all(&output).await?;
                        return writer.flush().await;
                    }
                    if output.len() >= OUTPUT_FLUSH_BYTES {
                        writer.write_all(&output).await?;
                        output.clear();
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    // Like Redis: answer the protocol error, then close, since the rest of
                    // the stream cannot be framed.
                    Value::Error(format!("ERR {}", error.0)).encode(session.protocol, &mut output);
                    writer.write_all(&output).await?;
                    return writer.flush().await;
                }
            }
        }
        if !output.is_empty() {
            writer.write_all(&output).await?;
            writer.flush().await?;
            output.clear();
        }
        input.reserve(READ_CHUNK_BYTES);
        if reader.read_buf(&mut input).await? == 0 {
            return Ok(());
        }
    }
}
