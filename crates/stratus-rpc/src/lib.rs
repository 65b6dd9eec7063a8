//! Remote procedure calls over the byte streams of `stratus-env`.
//!
//! - [`client`]: one pipelined [`client::Channel`] per server connection (many outstanding
//!   requests, responses matched by request id), a [`client::ChannelPool`] keyed by address,
//!   per-request timeouts.
//! - [`server`]: the accept loop and the per-connection loop that performs the handshake,
//!   validates every frame before a service sees it, runs synchronous handlers inline (no task
//!   per request) and spawns only the handlers that must wait.
//! - [`blocking`]: [`blocking::BlockingChannel`], one request at a time over a blocking socket,
//!   for callers without an async runtime.
//! - [`membership`]: the cluster secret; members prove it to each other before the hello, and
//!   a server with a secret serves server-to-server opcodes to proven members only.
//! - [`users`]: named users: the preamble in which a client proves a user's password, and
//!   the directory against which a server checks each of a user's requests.
//! - [`backoff`]: bounded exponential backoff with jitter, used by every retry loop.
//!
//! Every queue here is bounded: requests in flight per connection, bytes buffered for a peer
//! that does not read (per connection and per server), connections per server, and frame
//! sizes.

pub mod backoff;
pub mod blocking;
pub mod client;
pub mod membership;
mod preamble;
pub mod server;
pub mod users;

pub use backoff::{deadline_in, Backoff};
pub use blocking::{deadline_after, BlockingChannel};
pub use client::{Channel, ChannelPool, RpcConfig, RpcError};
pub use membership::{
    Admission, ClientNetwork, ClusterKey, MemberNetwork, Membership, Proven, SecretError,
};
pub use server::{serve, serve_admitting, serve_within, Handled, ServerLimits, Service};
pub use users::{
    new_user_credentials, password_matches, user_client_proof, user_credentials, AdmittedUser,
    UserDirectory, UserPassword,
};
