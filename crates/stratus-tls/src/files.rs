//! Certificates, keys and CAs from PEM files, with errors that name the file and the reason.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use stratus_types::limits::TLS_PEM_FILE_BYTES_MAX;

/// Why TLS could not be set up.
#[derive(Debug)]
pub enum TlsError {
    /// A file could not be read or written.
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A file holds no usable certificate, key or CA.
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// rustls refused the configuration (a key that does not match its certificate, say).
    Config(String),
    /// Generating a certificate failed.
    Generate(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::File { path, reason } => write!(f, "{}: {reason}", path.display()),
            TlsError::Content { path, reason } => write!(f, "{}: {reason}", path.display()),
            TlsError::Config(reason) => write!(f, "TLS configuration: {reason}"),
            TlsError::Generate(reason) => write!(f, "generating a certificate: {reason}"),
        }
    }
}

impl std::error::Error for TlsError {}

/// The bytes of `path`, refused past [`TLS_PEM_FILE_BYTES_MAX`].
pub(crate) fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file_error = |reason: String| TlsError::File { path: path.to_path_buf(), reason };
    let file = std::fs::File::open(path).map_err(|error| file_error(error.to_string()))?;
    let mut bytes = Vec::new();
    file.take(TLS_PEM_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| file_error(error.to_string()))?;
    if bytes.len() as u64 > TLS_PEM_FILE_BYTES_MAX {
        return Err(file_error(format!(
            "larger than {} bytes: not a PEM certificate or key",
            TLS_PEM_FILE_BYTES_MAX
        )));
    }
    Ok(bytes)
}

fn content_error(path: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Content { path: path.to_path_buf(), reason: reason.into() }
}

/// Every certificate in `path` (a chain: the leaf first), at least one.
pub(crate) fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bounded(path)?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| content_error(path, format!("not a PEM certificate: {error}")))?;
    if certificates.is_empty() {
        return Err(content_error(path, "holds no PEM certificate (BEGIN CERTIFICATE)"));
    }
    Ok(certificates)
}

/// The private key in `path` (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_bounded(path)?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|error| content_error(path, format!("holds no PEM private key: {error}")))
}

/// The CA certificates in `path`, as trust roots.
pub(crate) fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots.add(certificate).map_err(|error| {
            content_error(path, format!("not a usable CA certificate: {error}"))
        })?;
    }
    Ok(roots)
}
