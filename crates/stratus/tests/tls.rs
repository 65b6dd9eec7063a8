//! TLS with real processes (docs/design/security.md, "TLS"): `stratus up --secure` starts a
//! cluster that speaks only TLS on every port (native RPC, RESP, metrics); the CLI and
//! redis-cli reach it with the local CA and the client password; a client without TLS, or
//! trusting another CA, is refused with an error that says why; a server whose certificate
//! comes from another CA cannot join.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::{require_installed, stratus_binary, Process};
use stratus_env::{Network, TcpNetwork};
use stratus_tls::{ClientTls, ClientTlsFiles, TlsNetwork};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PATIENCE: Duration = Duration::from_secs(60);

/// `stratus ARGUMENTS` run to its end (bounded by its own --timeout-ms): status and output.
fn stratus(arguments: &[&str]) -> (bool, String) {
    let output = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .expect("run stratus");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn redis_cli(arguments: &[&str]) -> (bool, String) {
    let output = Command::new("timeout")
        .arg("20")
        .arg("redis-cli")
        .args(arguments)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// `GET /metrics` over TLS at `url` ("https://host:port/metrics") trusting `ca`.
fn https_get(url: &str, ca: &Path) -> std::io::Result<String> {
    let address = url.strip_prefix("https://").and_then(|rest| rest.split('/').next()).unwrap();
    let tls = ClientTls::load(&ClientTlsFiles { ca: ca.to_path_buf(), certificate_and_key: None })
        .expect("client TLS");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let network = TlsNetwork::new(Arc::new(TcpNetwork), None, Some(tls));
        let mut connection = network.connect(address).await?;
        let request =
            format!("GET /metrics HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
        connection.writer.write_all(request.as_bytes()).await?;
        connection.writer.flush().await?;
        let mut response = Vec::new();
        // A peer may end TLS without a close_notify; what was read is what counts.
        let _ = connection.reader.read_to_end(&mut response).await;
        Ok(String::from_utf8_lossy(&response).into_owned())
    })
}

#[test]
fn a_secure_cluster_speaks_only_tls_and_says_so_to_plain_clients() {
    require_installed("redis-cli");
    let directory = tempfile::tempdir().unwrap();
    let data = directory.path().join("data");
    let coordinator = common::free_address();
    let mut up = Process::start(
        &[
            "--coordinator",
            &coordinator,
            "up",
            "--secure",
            "--dir",
            &data.display().to_string(),
            "--servers",
            "2",
            "--replicas",
            "1",
            "--log-mib",
            "16",
            "--segment-mib",
            "1",
            "--resp-port",
            "0",
        ]
        .map(str::to_string),
    );
    let status_page = up.wait_for_line("status page: ", PATIENCE);
    let server_metrics = up.wait_for_line("metrics: server-0 ", PATIENCE);
    let resp_line = up.wait_for_line("redis: server-0 ", PATIENCE);
    up.wait_for_line("stratus cluster ready", PATIENCE);
    let ca = data.join("tls").join("ca.pem");
    let password = data.join("secrets").join("client-password");
    let (ca_text, password_text) = (ca.display().to_string(), password.display().to_string());
    let secure = [
        "--coordinator",
        &coordinator,
        "--tls-ca-file",
        &ca_text,
        "--password-file",
        &password_text,
    ];

    // The CLI with the CA and the password.
    let with = |command: &[&str]| stratus(&[&secure[..], command].concat());
    let (created, output) = with(&["table", "create", "accounts"]);
    assert!(created, "{output}");
    assert!(with(&["put", "accounts", "alice", "100"]).0);
    let (read, value) = with(&["get", "accounts", "alice"]);
    assert!(read, "{value}");
    assert_eq!(value.trim(), "100");

    // Without TLS: refused, and told why.
    let plain =
        ["--coordinator", &coordinator, "--password-file", &password_text, "--timeout-ms", "3000"];
    let (ok, output) = stratus(&[&plain[..], &["get", "accounts", "alice"]].concat());
    assert!(!ok);
    assert!(output.contains("speaks TLS"), "{output}");

    // Trusting another CA: the handshake fails.
    let other =
        stratus_tls::local_authority::ensure(&directory.path().join("other-ca"), &[]).unwrap().0;
    let other_ca = other.ca_certificate.display().to_string();
    let wrong = [
        "--coordinator",
        &coordinator,
        "--tls-ca-file",
        &other_ca,
        "--password-file",
        &password_text,
        "--timeout-ms",
        "3000",
    ];
    let (ok, output) = stratus(&[&wrong[..], &["get", "accounts", "alice"]].concat());
    assert!(!ok);
    assert!(output.contains("TLS handshake"), "{output}");

    // A server whose certificate another CA signed cannot join: the coordinator does not trust
    // it (and it does not trust the coordinator).
    let rogue_dir = directory.path().join("rogue");
    let rogue = stratus(&[
        "--coordinator",
        &coordinator,
        "--tls-ca-file",
        &other_ca,
        "--tls-cert-file",
        &other.node_certificate.display().to_string(),
        "--tls-key-file",
        &other.node_key.display().to_string(),
        "server",
        "--listen",
        "127.0.0.1:0",
        "--log-mib",
        "16",
        "--segment-mib",
        "1",
        "--replicas",
        "0",
        "--backup-dir",
        &rogue_dir.display().to_string(),
        "--cluster-secret-file",
        &data.join("secrets").join("cluster-secret").display().to_string(),
        "--enlist-timeout-seconds",
        "2",
    ]);
    assert!(!rogue.0, "a server with another CA's certificate joined: {}", rogue.1);
    let (listed, servers) = with(&["status"]);
    assert!(listed, "{servers}");

    // RESP: redis-cli over TLS with the CA and the password; without TLS it gets nothing.
    let port = resp_line.rsplit(':').next().unwrap().trim().to_string();
    let secret = std::fs::read_to_string(&password).unwrap().trim().to_string();
    let tls_cli = ["--tls", "--cacert", &ca_text, "-p", &port, "-a", &secret, "--no-auth-warning"];
    let (ok, output) = redis_cli(&[&tls_cli[..], &["SET", "greeting", "hello"]].concat());
    assert!(ok && output.trim() == "OK", "{output}");
    let (ok, output) = redis_cli(&[&tls_cli[..], &["GET", "greeting"]].concat());
    assert!(ok && output.trim() == "hello", "{output}");
    let (_, output) =
        redis_cli(&["-p", &port, "-a", &secret, "--no-auth-warning", "GET", "greeting"]);
    assert!(!output.contains("hello"), "plain text reached a TLS port: {output}");
    // A wrong password is refused and counted in the server's metrics.
    let wrong_cli = [
        "--tls",
        "--cacert",
        &ca_text,
        "-p",
        &port,
        "-a",
        "not-the-password!",
        "--no-auth-warning",
    ];
    let (_, output) = redis_cli(&[&wrong_cli[..], &["GET", "greeting"]].concat());
    assert!(!output.contains("hello"), "{output}");
    let server_url = server_metrics.split_whitespace().last().unwrap().to_string();
    let scrape = https_get(&server_url, &ca).expect("server metrics over TLS");
    let failed_auth: f64 = scrape
        .lines()
        .find_map(|line| line.strip_prefix("stratus_resp_authentications_failed_total "))
        .and_then(|value| value.trim().parse().ok())
        .expect("the failed-AUTH counter");
    assert!(failed_auth >= 1.0, "{failed_auth}");

    // The checked workload runs against a secure cluster with the same flags as the CLI.
    let (passed, output) = stratus(
        &[
            &secure[..],
            &[
                "workload",
                "--seconds",
                "2",
                "--servers",
                "2",
                "--clients",
                "2",
                "--rate",
                "100",
                "--settle-seconds",
                "30",
                "--startup-seconds",
                "30",
            ],
        ]
        .concat(),
    );
    assert!(passed && output.contains("verdict=linearizable"), "{output}");

    // Metrics and the status page: HTTPS only.
    let url = status_page.split_whitespace().last().unwrap().trim_end_matches('/').to_string();
    assert!(url.starts_with("https://"), "{status_page}");
    let metrics = https_get(&format!("{url}/metrics"), &ca).expect("metrics over TLS");
    assert!(metrics.contains("stratus_coordinator_servers"), "{metrics}");
    // The plain and wrong-CA clients above failed their handshakes with the coordinator.
    let failed: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("stratus_tls_handshakes_failed_total "))
        .and_then(|value| value.trim().parse().ok())
        .expect("the failed-handshake counter");
    assert!(failed >= 2.0, "{failed}");
    assert!(https_get(&format!("{url}/metrics"), &other.ca_certificate).is_err());

    up.signal(libc::SIGTERM);
    assert!(up.wait_exit(PATIENCE).is_some());
}
