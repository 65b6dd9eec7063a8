//! The accept loop and one connection's loop.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::BytesMut;
use stratus_env::{Connection, Listener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::commands::After;
use crate::gateway::{Gateway, Session};
use crate::request::{Parsed, RequestLimits, RequestParser};
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
    // Until the password is given, the small limits of `before_authentication`.
    let mut limited = gateway.needs_password(&session);
    let mut parser = RequestParser::new(match limited {
        true => RequestLimits::before_authentication(),
        false => gateway.config.limits,
    });
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
                    if limited && !gateway.needs_password(&session) {
                        limited = false;
                        parser.set_limits(gateway.config.limits);
                    }
                    if after == After::Close {
                        writer.write_all(&output).await?;
                        return writer.flush().await;
                    }
                    if output.len() >= OUTPUT_FLUSH_BYTES {
                        // Flushed too: a TLS writer holds what it encrypted until then, and the
                        // client may be waiting for these replies while the rest of the
                        // pipeline runs.
                        stratus_env::write_and_flush(&mut writer, &output).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{GatewayConfig, RespPassword};
    use crate::test_support::offline_gateway_with;

    /// Serves one in-memory connection of a gateway with a password; returns the client's
    /// halves.
    fn connect(
        gateway: Arc<Gateway>,
    ) -> (tokio::io::ReadHalf<tokio::io::DuplexStream>, tokio::io::WriteHalf<tokio::io::DuplexStream>)
    {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (reader, writer) = tokio::io::split(server);
        let connection = Connection {
            reader: Box::new(reader),
            writer: Box::new(writer),
            peer_address: "test".to_string(),
        };
        tokio::spawn(async move { serve_connection(&gateway, connection).await });
        tokio::io::split(client)
    }

    /// A command as a client sends it: an array of bulk strings (the gateway's own encoder).
    fn command(arguments: &[&[u8]]) -> BytesMut {
        let arguments =
            arguments.iter().map(|argument| Value::BulkString(argument.to_vec().into()));
        let mut bytes = BytesMut::new();
        Value::Array(arguments.collect()).encode(crate::value::Protocol::Resp2, &mut bytes);
        bytes
    }

    async fn read_reply(reader: &mut tokio::io::ReadHalf<tokio::io::DuplexStream>) -> Vec<u8> {
        let mut reply = vec![0u8; 4096];
        let read = reader.read(&mut reply).await.unwrap();
        reply.truncate(read);
        reply
    }

    fn password_gateway() -> Arc<Gateway> {
        Arc::new(offline_gateway_with(GatewayConfig {
            password: Some(RespPassword(b"s3cret-password".to_vec())),
            ..GatewayConfig::default()
        }))
    }

    #[tokio::test]
    async fn before_auth_a_large_argument_ends_the_connection_and_after_it_is_accepted() {
        let big = vec![b'x'; 20 << 10];
        // Not authenticated: a 20 KiB argument is a protocol error, and the connection ends.
        let (mut reader, mut writer) = connect(password_gateway());
        writer.write_all(&command(&[b"SET", b"k", &big])).await.unwrap();
        let reply = read_reply(&mut reader).await;
        assert!(reply.starts_with(b"-ERR Protocol error"), "{}", String::from_utf8_lossy(&reply));
        assert_eq!(read_reply(&mut reader).await, b"", "closed");

        // Eleven arguments before AUTH: the same.
        let (mut reader, mut writer) = connect(password_gateway());
        let many: Vec<&[u8]> = vec![b"x"; 11];
        writer.write_all(&command(&many)).await.unwrap();
        assert!(read_reply(&mut reader).await.starts_with(b"-ERR Protocol error"));

        // After AUTH the connection has the gateway's own limits: the large argument is read
        // and the command runs (here it fails in the offline cluster, not in the parser).
        let (mut reader, mut writer) = connect(password_gateway());
        writer.write_all(&command(&[b"AUTH", b"s3cret-password"])).await.unwrap();
        assert_eq!(read_reply(&mut reader).await, b"+OK\r\n");
        writer.write_all(&command(&[b"ECHO", &big])).await.unwrap();
        let mut echoed = Vec::new();
        while echoed.len() < big.len() + 10 {
            let chunk = read_reply(&mut reader).await;
            assert!(!chunk.is_empty(), "closed after {} bytes", echoed.len());
            echoed.extend_from_slice(&chunk);
        }
        assert!(echoed.starts_with(b"$20480\r\n"), "{}", String::from_utf8_lossy(&echoed[..16]));
    }
}
