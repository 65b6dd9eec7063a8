//! A client's TLS: the CA it trusts, and optionally its own certificate.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use stratus_types::limits::TLS_HANDSHAKE_TIMEOUT_MILLIS;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::files::{read_certificates, read_private_key, read_roots, TlsError};
use crate::reload::Reloading;

/// The files a client's TLS comes from.
#[derive(Clone, Debug)]
pub struct ClientTlsFiles {
    /// The CA that signed the servers' certificates (PEM): the client trusts it alone.
    pub ca: PathBuf,
    /// The client's own certificate chain and private key (PEM), for servers that ask for one.
    pub certificate_and_key: Option<(PathBuf, PathBuf)>,
}

/// A client's TLS configuration, reloaded when its files change ([`ClientTls::watch`]): a
/// rotated CA or a renewed client certificate is used by new connections without a restart.
/// Cheap to clone (clones share the configuration).
#[derive(Clone)]
pub struct ClientTls {
    reloading: Arc<Reloading<rustls::ClientConfig>>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls").field("files", &self.reloading).finish()
    }
}

impl ClientTlsFiles {
    fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.ca.clone()];
        if let Some((certificate, key)) = &self.certificate_and_key {
            paths.extend([certificate.clone(), key.clone()]);
        }
        paths
    }
}

impl ClientTls {
    /// The configuration in `files`; an error says which file is missing or wrong.
    pub fn load(files: &ClientTlsFiles) -> Result<ClientTls, TlsError> {
        let building = files.clone();
        let reloading = Reloading::load(files.paths(), move || build(&building))?;
        Ok(ClientTls { reloading: Arc::new(reloading) })
    }

    /// Loads the files again if their contents changed (see [`crate::ServerTls::reload_if_changed`]).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.reloading.reload_if_changed()
    }

    /// Checks the files every [`crate::RELOAD_CHECK_INTERVAL`] forever, logging each reload.
    pub async fn watch(self) {
        let interval = crate::RELOAD_CHECK_INTERVAL;
        crate::reload::watch(&self.reloading, "TLS trust (CA) and client certificate", interval)
            .await
    }

    /// The rustls configuration new connections use (for a blocking client's
    /// `rustls::StreamOwned`).
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        self.reloading.current()
    }

    /// Runs the client side of a handshake with the server at `address` ("host:port"; its
    /// certificate must name the host) on `stream`, within [`TLS_HANDSHAKE_TIMEOUT_MILLIS`].
    pub async fn connect<S>(
        &self,
        address: &str,
        stream: S,
    ) -> io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = server_name_of(address)?;
        let connector = tokio_rustls::TlsConnector::from(self.config());
        let patience = Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MILLIS);
        match tokio::time::timeout(patience, connector.connect(name, stream)).await {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(error)) => {
                // A plain-text server answers a client hello with bytes that are no TLS record,
                // or closes.
                let hint = match error.kind() {
                    io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => {
                        " (does it speak TLS? a server does when started with --tls-cert-file)"
                    }
                    _ => "",
                };
                Err(io::Error::new(
                    error.kind(),
                    format!("TLS handshake with {address}: {error}{hint}"),
                ))
            }
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("TLS handshake with {address} took too long"),
            )),
        }
    }
}

fn build(files: &ClientTlsFiles) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = read_roots(&files.ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(crate::provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?
        .with_root_certificates(roots);
    let config = match &files.certificate_and_key {
        None => builder.with_no_client_auth(),
        Some((certificate, key)) => builder
            .with_client_auth_cert(read_certificates(certificate)?, read_private_key(key)?)
            .map_err(|error| {
                TlsError::Config(format!(
                    "{} with {}: {error}",
                    certificate.display(),
                    key.display()
                ))
            })?,
    };
    Ok(Arc::new(config))
}

/// The name a server at `address` ("host:port", "[v6]:port") must have in its certificate:
/// the host, as a DNS name or an IP address.
pub fn server_name_of(address: &str) -> io::Result<ServerName<'static>> {
    let host = match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|byte| byte.is_ascii_digit()) => host,
        _ => address,
    };
    let host = host.strip_prefix('[').and_then(|host| host.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_string()).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{address}: no TLS server name: {error}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host_part() {
        let name = |address: &str| server_name_of(address).map(|name| name.to_str().into_owned());
        assert_eq!(name("127.0.0.1:7400").unwrap(), "127.0.0.1");
        assert_eq!(name("[::1]:7400").unwrap(), "::1");
        assert_eq!(name("db-3.example.com:7400").unwrap(), "db-3.example.com");
        assert_eq!(name("localhost").unwrap(), "localhost");
        assert!(name("bad name:1").is_err());
    }
}
