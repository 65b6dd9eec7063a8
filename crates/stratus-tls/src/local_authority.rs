//! The local certificate authority of `stratus up --secure`: a CA, one certificate for every
//! process of a local cluster, and one for clients, written as PEM files into a directory.
//!
//! For a cluster on one machine or a test bed. A deployment across machines brings
//! certificates from its own CA (`--tls-cert-file` and friends); this module is not a CA
//! service. Certificates use rcgen's defaults for validity (they do not expire in practice):
//! a local CA whose key sits beside the data has nothing to gain from short lifetimes.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::files::TlsError;

/// Where the local authority's files are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalAuthorityFiles {
    /// The CA's certificate: what clients trust (`--tls-ca-file`, `redis-cli --cacert`).
    pub ca_certificate: PathBuf,
    /// The CA's private key (mode 0600), kept to issue certificates for new hosts later.
    pub ca_key: PathBuf,
    /// The certificate of every coordinator and server of the local cluster (names localhost,
    /// 127.0.0.1, ::1 and the hosts given), for server and client authentication.
    pub node_certificate: PathBuf,
    /// Its private key (mode 0600).
    pub node_key: PathBuf,
    /// A client certificate, for servers that ask clients for one.
    pub client_certificate: PathBuf,
    /// Its private key (mode 0600).
    pub client_key: PathBuf,
}

impl LocalAuthorityFiles {
    /// The files' paths in `directory`.
    pub fn in_directory(directory: &Path) -> LocalAuthorityFiles {
        LocalAuthorityFiles {
            ca_certificate: directory.join("ca.pem"),
            ca_key: directory.join("ca-key.pem"),
            node_certificate: directory.join("node.pem"),
            node_key: directory.join("node-key.pem"),
            client_certificate: directory.join("client.pem"),
            client_key: directory.join("client-key.pem"),
        }
    }

    fn all(&self) -> [&Path; 6] {
        [
            &self.ca_certificate,
            &self.ca_key,
            &self.node_certificate,
            &self.node_key,
            &self.client_certificate,
            &self.client_key,
        ]
    }
}

/// The local authority's files in `directory`, written first if any is missing (then all are
/// written anew: a CA half written by a crash is not trusted). `Ok((files, true))` when they
/// were just written. The node certificate names loopback and `hosts`.
pub fn ensure(directory: &Path, hosts: &[String]) -> Result<(LocalAuthorityFiles, bool), TlsError> {
    for host in hosts {
        // The check a client applies to the host it dials: a name it could not match is
        // refused here rather than written into a certificate no client accepts.
        if rustls_pki_types::ServerName::try_from(host.as_str()).is_err() {
            return Err(TlsError::Generate(format!(
                "{host:?} is neither a DNS name nor an IP address"
            )));
        }
    }
    let files = LocalAuthorityFiles::in_directory(directory);
    if files.all().iter().all(|path| path.is_file()) {
        return Ok((files, false));
    }
    std::fs::create_dir_all(directory).map_err(|error| TlsError::File {
        path: directory.to_path_buf(),
        reason: error.to_string(),
    })?;
    let generated = generate(hosts)?;
    // The keys and certificates first, the CA's certificate last: a crash in between leaves
    // the set incomplete, and the next start writes it all again.
    let contents = [
        (&files.ca_key, &generated.ca_key, true),
        (&files.node_certificate, &generated.node_certificate, false),
        (&files.node_key, &generated.node_key, true),
        (&files.client_certificate, &generated.client_certificate, false),
        (&files.client_key, &generated.client_key, true),
        (&files.ca_certificate, &generated.ca_certificate, false),
    ];
    for (path, text, secret) in contents {
        write_file(path, text.as_bytes(), secret)?;
    }
    Ok((files, true))
}

/// The PEM texts of a new local authority.
struct Generated {
    ca_certificate: String,
    ca_key: String,
    node_certificate: String,
    node_key: String,
    client_certificate: String,
    client_key: String,
}

fn generate(hosts: &[String]) -> Result<Generated, TlsError> {
    let failed = |error: rcgen::Error| TlsError::Generate(error.to_string());
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    ca_params.distinguished_name = name("Stratus local CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(failed)?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(failed)?;

    let mut node_names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    node_names.extend(
        hosts.iter().filter(|host| !node_names.contains(host)).cloned().collect::<Vec<_>>(),
    );
    let mut node_params = CertificateParams::new(node_names).map_err(failed)?;
    node_params.distinguished_name = name("Stratus node");
    node_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Servers are clients of each other too (replication, recovery), and show this same
    // certificate when a listener asks for one.
    node_params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let node_key = KeyPair::generate().map_err(failed)?;
    let node = node_params.signed_by(&node_key, &ca).map_err(failed)?;

    let mut client_params = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
    client_params.distinguished_name = name("Stratus client");
    client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().map_err(failed)?;
    let client = client_params.signed_by(&client_key, &ca).map_err(failed)?;

    Ok(Generated {
        ca_certificate: ca.pem(),
        ca_key: ca_key_pem,
        node_certificate: node.pem(),
        node_key: node_key.serialize_pem(),
        client_certificate: client.pem(),
        client_key: client_key.serialize_pem(),
    })
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

/// Writes `bytes` to `path` through a synced temporary file renamed over it, so a crash leaves
/// the old file or the whole new one; `secret` files are readable by their owner alone. The
/// temporary file is created anew (a stale one is removed first) and never through a symbolic
/// link, so its mode is the one asked for and the key is written where intended.
fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<(), TlsError> {
    let file_error = |reason: String| TlsError::File { path: path.to_path_buf(), reason };
    let temporary = path.with_extension("pem.tmp");
    match std::fs::remove_file(&temporary) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(file_error(format!("removing a stale temporary file: {error}"))),
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(&temporary)
        .map_err(|error| file_error(error.to_string()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|error| file_error(error.to_string()))?;
    std::fs::rename(&temporary, path).map_err(|error| file_error(error.to_string()))?;
    // The rename is durable once the directory is synced.
    if let Some(directory) = path.parent() {
        let synced = std::fs::File::open(directory).and_then(|directory| directory.sync_all());
        synced.map_err(|error| file_error(format!("syncing its directory: {error}")))?;
    }
    Ok(())
}
