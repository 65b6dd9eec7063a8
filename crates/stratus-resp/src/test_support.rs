//! What the gateway's unit tests share: a gateway whose cluster cannot be reached, and one
//! command run through it.

use bytes::{Bytes, BytesMut};
use stratus_client::{Client, ClientConfig};

use crate::gateway::{Gateway, GatewayConfig, Session};
use crate::value::{parse_value, Value};

/// A gateway with `config` whose cluster cannot be reached: every reply a test looks at is
/// decided in the gateway, before any request to a master.
pub(crate) fn offline_gateway_with(config: GatewayConfig) -> Gateway {
    Gateway::new(Client::new(ClientConfig::new("127.0.0.1:1")), config)
}

/// Runs one command on `session` and returns its whole reply.
pub(crate) async fn call(gateway: &Gateway, session: &mut Session, arguments: &[&str]) -> Value {
    let arguments: Vec<Bytes> =
        arguments.iter().map(|argument| Bytes::copy_from_slice(argument.as_bytes())).collect();
    let mut out = BytesMut::new();
    gateway.execute(session, &arguments, &mut out).await;
    let (value, used) = parse_value(&out).unwrap().expect("one whole reply");
    assert_eq!(used, out.len());
    value
}
