//! TLS for the benchmarks' `--tls` configurations: one local CA and certificate (as
//! `stratus up --secure` writes them) for Stratus and Redis alike, so both sides run the same
//! key type (ECDSA P-256) and the same TLS versions, and the client side of each.

use stratus_tls::local_authority::{ensure, LocalAuthorityFiles};
use stratus_tls::{ClientTls, ClientTlsFiles};

/// The CA, the servers' certificate and a client's TLS, in a directory removed on drop.
pub struct BenchTls {
    _directory: tempfile::TempDir,
    files: LocalAuthorityFiles,
    client: ClientTls,
}

impl BenchTls {
    /// A new local CA and certificate (loopback names).
    pub fn create() -> Result<BenchTls, String> {
        let directory = tempfile::tempdir().map_err(|error| error.to_string())?;
        let (files, _) = ensure(directory.path(), &[]).map_err(|error| error.to_string())?;
        let client = ClientTls::load(&ClientTlsFiles {
            ca: files.ca_certificate.clone(),
            certificate_and_key: None,
        })
        .map_err(|error| error.to_string())?;
        Ok(BenchTls { _directory: directory, files, client })
    }

    /// What a client trusts.
    pub fn client(&self) -> &ClientTls {
        &self.client
    }

    /// The flags that make `stratus up` (and every process it starts) speak TLS.
    pub fn stratus_flags(&self) -> Vec<String> {
        vec![
            "--tls-ca-file".to_string(),
            self.files.ca_certificate.display().to_string(),
            "--tls-cert-file".to_string(),
            self.files.node_certificate.display().to_string(),
            "--tls-key-file".to_string(),
            self.files.node_key.display().to_string(),
        ]
    }

    /// redis-server's arguments for TLS only on `port` (no plain port), no client
    /// certificates asked, and TLS between a primary and its replicas.
    pub fn redis_arguments(&self, port: &str) -> Vec<String> {
        let path = |path: &std::path::Path| path.display().to_string();
        [
            "--port",
            "0",
            "--tls-port",
            port,
            "--tls-cert-file",
            &path(&self.files.node_certificate),
            "--tls-key-file",
            &path(&self.files.node_key),
            "--tls-ca-cert-file",
            &path(&self.files.ca_certificate),
            "--tls-auth-clients",
            "no",
            "--tls-replication",
            "yes",
        ]
        .map(str::to_string)
        .to_vec()
    }
}
