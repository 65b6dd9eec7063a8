//! A listener's TLS: its certificate and key, which clients it asks for certificates, and the
//! reload of all of them when their files change.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use stratus_types::limits::TLS_HANDSHAKE_TIMEOUT_MILLIS;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::files::{read_certificates, read_private_key, read_roots, TlsError};
use crate::reload::Reloading;

/// How often a process looks at its certificate, key and CA files for a change: a renewed
/// certificate (certbot, cert-manager, an operator's copy) is in use within this long, and a
/// look reads and hashes a few KiB.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(5);

/// Which clients must show a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCertificates {
    /// None is asked for (clients prove who they are with a password, if at all).
    NotAsked,
    /// A client may show one, which must then chain to the CA in this file.
    Optional(PathBuf),
    /// Every client must show one that chains to the CA in this file.
    Required(PathBuf),
}

/// The files a listener's TLS comes from.
#[derive(Clone, Debug)]
pub struct ServerTlsFiles {
    /// The certificate chain, leaf first (PEM).
    pub certificate: PathBuf,
    /// Its private key (PEM).
    pub private_key: PathBuf,
    /// Which clients must show a certificate.
    pub client_certificates: ClientCertificates,
}

impl ServerTlsFiles {
    fn paths(&self) -> Vec<&Path> {
        let mut paths = vec![self.certificate.as_path(), self.private_key.as_path()];
        match &self.client_certificates {
            ClientCertificates::NotAsked => {}
            ClientCertificates::Optional(ca) | ClientCertificates::Required(ca) => {
                paths.push(ca.as_path())
            }
        }
        paths
    }
}

/// A listener's TLS configuration, current as of its files' last successful load.
#[derive(Debug)]
pub struct ServerTls {
    files: ServerTlsFiles,
    reloading: Reloading<rustls::ServerConfig>,
    handshakes_failed: AtomicU64,
}

impl ServerTls {
    /// The configuration in `files`; an error says which file is missing or wrong.
    pub fn load(files: ServerTlsFiles) -> Result<Arc<ServerTls>, TlsError> {
        let paths = files.paths().into_iter().map(Path::to_path_buf).collect();
        let building = files.clone();
        let reloading = Reloading::load(paths, move || build(&building))?;
        Ok(Arc::new(ServerTls { files, reloading, handshakes_failed: AtomicU64::new(0) }))
    }

    /// The configuration new handshakes use.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.reloading.current()
    }

    /// The files this configuration comes from.
    pub fn files(&self) -> &ServerTlsFiles {
        &self.files
    }

    /// Loads the files again if their contents changed since the last check. `Ok(true)`: the
    /// new configuration is in use for every handshake from now on (connections already open
    /// keep theirs). An error leaves the previous configuration in use; it is returned once per
    /// distinct content, so a certificate and key replaced one after the other are picked up
    /// once both are.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.reloading.reload_if_changed()
    }

    /// Checks the files every [`RELOAD_CHECK_INTERVAL`] forever, logging each reload and each
    /// failed one (a failed reload keeps the previous certificate in use).
    pub async fn watch(self: Arc<ServerTls>) {
        crate::reload::watch(&self.reloading, "TLS certificate", RELOAD_CHECK_INTERVAL).await
    }

    /// Successful reloads since the start.
    pub fn reloads(&self) -> u64 {
        self.reloading.reloads()
    }

    /// Reloads that failed (the files changed, but did not load).
    pub fn reloads_failed(&self) -> u64 {
        self.reloading.reloads_failed()
    }

    /// Handshakes that failed or took too long (a client that does not speak TLS, does not
    /// trust this certificate, or showed no acceptable certificate of its own).
    pub fn handshakes_failed(&self) -> u64 {
        self.handshakes_failed.load(Ordering::Relaxed)
    }

    /// Runs the server side of a handshake on `stream`, within
    /// [`TLS_HANDSHAKE_TIMEOUT_MILLIS`]. A failure is counted and logged at debug level (the
    /// first, then one in 64, as a warning: a client that speaks plain text to a TLS port in a
    /// loop does not flood the log).
    pub async fn accept<S>(
        &self,
        stream: S,
        peer: &str,
    ) -> io::Result<tokio_rustls::server::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config());
        let patience = Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MILLIS);
        let result = match tokio::time::timeout(patience, acceptor.accept(stream)).await {
            Ok(result) => result,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake took too long")),
        };
        if let Err(error) = &result {
            let failed = self.handshakes_failed.fetch_add(1, Ordering::Relaxed) + 1;
            if failed == 1 || failed.is_multiple_of(64) {
                tracing::warn!(%peer, %error, failed, "TLS handshake failed");
            } else {
                tracing::debug!(%peer, %error, failed, "TLS handshake failed");
            }
        }
        result
    }
}

fn build(files: &ServerTlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certificates = read_certificates(&files.certificate)?;
    let key = read_private_key(&files.private_key)?;
    let provider = crate::provider();
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?;
    let builder = match &files.client_certificates {
        ClientCertificates::NotAsked => builder.with_no_client_auth(),
        ClientCertificates::Optional(ca) | ClientCertificates::Required(ca) => {
            let roots = Arc::new(read_roots(ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = match &files.client_certificates {
                ClientCertificates::Optional(_) => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier.build().map_err(|error| TlsError::Config(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(certificates, key).map_err(|error| {
        TlsError::Config(format!(
            "{} with {}: {error}",
            files.certificate.display(),
            files.private_key.display()
        ))
    })?;
    // No TLS 1.3 session tickets: Stratus's connections live long and are pooled, so
    // resumption saves little, and without tickets nothing arrives unasked on an idle
    // connection (a blocking client reads any byte from an idle server as the end of it).
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}
