//! TLS from the command line: the flags every command takes, and what they mean for a
//! coordinator or server (a listener certificate, and a client of its peers) and for a client.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use stratus_tls::{ClientCertificates, ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles};

/// Which clients a TLS listener asks for a certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ClientCertificateMode {
    /// None (clients prove who they are with the client password, if the cluster has one).
    #[default]
    None,
    /// A client may show one; if it does, it must chain to --tls-ca-file.
    Optional,
    /// Every client, and every peer server, must show one that chains to --tls-ca-file.
    Required,
}

impl ClientCertificateMode {
    /// The value of `--tls-client-certificates` that selects this mode.
    pub fn flag_value(self) -> &'static str {
        match self {
            ClientCertificateMode::None => "none",
            ClientCertificateMode::Optional => "optional",
            ClientCertificateMode::Required => "required",
        }
    }
}

/// TLS flags (docs/design/security.md, "TLS"). Global: `stratus --tls-ca-file ca.pem get ...`
/// and `stratus server --tls-cert-file ...` read the same flags.
#[derive(Clone, Debug, Default, Args)]
pub struct TlsArguments {
    /// CA certificate (PEM) that signed the cluster's certificates. A client (the CLI,
    /// `stratus resp`'s connections to the cluster) speaks TLS to the cluster when given one
    /// and trusts this CA alone; a coordinator or server checks its peers against it.
    #[arg(long, global = true, env = "STRATUS_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// Certificate chain (PEM, leaf first). A coordinator or server given one speaks only TLS
    /// on every listener (RPC, RESP, metrics and status page) and reloads it when the file
    /// changes; a client shows it to servers that ask for client certificates.
    #[arg(long, global = true, env = "STRATUS_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, global = true, env = "STRATUS_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// Which clients a TLS listener asks for a certificate signed by --tls-ca-file.
    #[arg(long, global = true, value_enum, default_value_t = ClientCertificateMode::None)]
    pub tls_client_certificates: ClientCertificateMode,
}

/// A coordinator's or server's TLS: its listeners' configuration, and the client side it uses
/// to reach its peers (showing its own certificate, in case they ask for one).
#[derive(Clone, Debug)]
pub(crate) struct ProcessTls {
    pub(crate) server: Arc<ServerTls>,
    pub(crate) client: ClientTls,
}

impl TlsArguments {
    /// The TLS of a client process: `None` without --tls-ca-file (a certificate and key,
    /// if given, are shown to servers that ask for one).
    pub(crate) fn client(&self) -> Result<Option<ClientTls>, String> {
        let Some(ca) = &self.tls_ca_file else { return Ok(None) };
        let files = ClientTlsFiles {
            ca: ca.clone(),
            certificate_and_key: self.tls_cert_file.clone().zip(self.tls_key_file.clone()),
        };
        ClientTls::load(&files).map(Some).map_err(|error| format!("TLS: {error}"))
    }

    /// The flags that give a coordinator or server started by `stratus up` these files (none
    /// without a certificate: the cluster runs without TLS).
    pub(crate) fn flags_for_children(&self) -> Vec<String> {
        let (Some(ca), Some(certificate), Some(key)) =
            (&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file)
        else {
            return Vec::new();
        };
        vec![
            "--tls-ca-file".to_string(),
            ca.display().to_string(),
            "--tls-cert-file".to_string(),
            certificate.display().to_string(),
            "--tls-key-file".to_string(),
            key.display().to_string(),
            "--tls-client-certificates".to_string(),
            self.tls_client_certificates.flag_value().to_string(),
        ]
    }

    /// A listener's TLS (`stratus resp`'s, which needs no CA when it reaches the cluster
    /// without TLS): `None` without --tls-cert-file.
    pub(crate) fn listener(&self) -> Result<Option<Arc<ServerTls>>, String> {
        let (Some(certificate), Some(key)) = (&self.tls_cert_file, &self.tls_key_file) else {
            if self.tls_client_certificates != ClientCertificateMode::None {
                return Err("--tls-client-certificates needs --tls-cert-file".to_string());
            }
            return Ok(None);
        };
        let client_certificates = match (self.tls_client_certificates, &self.tls_ca_file) {
            (ClientCertificateMode::None, _) => ClientCertificates::NotAsked,
            (ClientCertificateMode::Optional, Some(ca)) => ClientCertificates::Optional(ca.clone()),
            (ClientCertificateMode::Required, Some(ca)) => ClientCertificates::Required(ca.clone()),
            (_, None) => {
                return Err("--tls-client-certificates needs --tls-ca-file (the CA client \
                            certificates must chain to)"
                    .to_string())
            }
        };
        let files = ServerTlsFiles {
            certificate: certificate.clone(),
            private_key: key.clone(),
            client_certificates,
        };
        ServerTls::load(files).map(Some).map_err(|error| format!("TLS: {error}"))
    }

    /// The TLS of a coordinator or server (`role`, for messages): `None` without
    /// --tls-cert-file. A certificate needs a CA: the process reaches its peers over TLS too.
    pub(crate) fn process(&self, role: &str) -> Result<Option<ProcessTls>, String> {
        if self.tls_cert_file.is_some() && self.tls_ca_file.is_none() {
            return Err(format!(
                "a {role} with --tls-cert-file needs --tls-ca-file: it checks the certificates \
                 of the coordinators and servers it connects to against that CA"
            ));
        }
        let Some(server) = self.listener()? else { return Ok(None) };
        let client = self.client()?.expect("a CA was given");
        Ok(Some(ProcessTls { server, client }))
    }
}
