//! TLS for every Stratus listener and client (docs/design/security.md, "TLS").
//!
//! - [`ServerTls`]: a listener's certificate and key (and, optionally, the CA its clients'
//!   certificates must chain to), read from PEM files and reloaded when the files change, so a
//!   renewed certificate takes effect without a restart.
//! - [`ClientTls`]: the CA a client trusts (and, optionally, its own certificate).
//! - [`TlsNetwork`]: a `stratus_env::Network` whose connections speak TLS, over any other
//!   network; every protocol (native RPC, RESP) runs unchanged above it.
//! - [`local_authority`]: the local CA and certificates `stratus up --secure` writes.
//!
//! rustls with the ring provider: no OpenSSL, and TLS 1.2 and 1.3 only, with rustls's safe
//! defaults for cipher suites.

mod blocking;
mod client;
mod files;
pub mod local_authority;
mod network;
mod reload;
mod server;

pub use blocking::BlockingStream;
pub use client::{server_name_of, ClientTls, ClientTlsFiles};
pub use files::TlsError;
pub use network::TlsNetwork;
pub use server::{ClientCertificates, ServerTls, ServerTlsFiles, RELOAD_CHECK_INTERVAL};

use std::sync::Arc;

/// The cryptography every configuration uses: rustls's ring provider.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
