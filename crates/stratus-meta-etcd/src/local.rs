//! A single-member etcd started as a child process on loopback: for tests, and for trying
//! coordinator failover on one machine. Needs the `etcd` binary (Debian: `etcd-server`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::client::EtcdClient;
use crate::{REQUEST_BYTES_MIN, TXN_OPERATIONS_MAX};

/// etcd's heartbeat interval for a local single member (its default is 100 ms).
const HEARTBEAT_INTERVAL_MS: u32 = 100;

/// etcd's election timeout for a local single member (its default, 1 000 ms, makes 2 s the
/// least lease TTL it grants; 500 ms makes it 1 s).
const ELECTION_TIMEOUT_MS: u32 = 500;

/// How long a started etcd may take to answer.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// An etcd process, killed when dropped.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Child,
    client_url: String,
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|error| error.to_string())?;
    Ok(listener.local_addr().map_err(|error| error.to_string())?.port())
}

impl LocalEtcd {
    /// Starts etcd with its data in `data_directory`, on free loopback ports, configured for
    /// the coordinator's limits, and waits until it answers. Its log is `data_directory` with
    /// the extension `log`.
    pub fn start(data_directory: &Path) -> Result<LocalEtcd, String> {
        LocalEtcd::start_with(data_directory, &data_directory.with_extension("log"), |_| {})
    }

    /// As [`LocalEtcd::start`], with its log in `log_file`, and `prepare` run on the command
    /// before it is spawned (`stratus up` uses it to tie etcd's life to its own).
    pub fn start_with(
        data_directory: &Path,
        log_file: &Path,
        prepare: impl FnOnce(&mut Command),
    ) -> Result<LocalEtcd, String> {
        let binary = std::env::var("STRATUS_ETCD_BINARY").unwrap_or_else(|_| "etcd".to_string());
        let client_url = format!("http://127.0.0.1:{}", free_port()?);
        let peer_url = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(log_file)
            .map_err(|error| format!("etcd log file {}: {error}", log_file.display()))?;
        let mut command = Command::new(&binary);
        prepare(&mut command);
        let child = command
            .arg("--name=stratus-local")
            .arg(format!("--data-dir={}", data_directory.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=stratus-local={peer_url}"))
            .arg(format!("--max-txn-ops={TXN_OPERATIONS_MAX}"))
            // One member on loopback: elections are instant, and a short election timeout
            // lowers etcd's least lease TTL (1.5 election timeouts, rounded up to whole
            // seconds) to 1 s, so a standby coordinator can take over about a second after
            // the active one died (`stratus up` asks for that TTL).
            .arg(format!("--heartbeat-interval={HEARTBEAT_INTERVAL_MS}"))
            .arg(format!("--election-timeout={ELECTION_TIMEOUT_MS}"))
            .arg(format!("--max-request-bytes={REQUEST_BYTES_MIN}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|error| {
                format!("cannot start {binary} (install etcd-server, or set STRATUS_ETCD_BINARY): {error}")
            })?;
        let mut etcd = LocalEtcd { child, client_url };
        let client = EtcdClient::new(&[etcd.client_url.clone()], Duration::from_secs(1))?;
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            match client.range(b"probe", &[]) {
                Ok(_) => return Ok(etcd),
                Err(error) => {
                    if let Ok(Some(status)) = etcd.child.try_wait() {
                        return Err(format!(
                            "etcd exited at start ({status}); see {}",
                            log_file.display()
                        ));
                    }
                    if Instant::now() >= deadline {
                        etcd.kill();
                        return Err(format!(
                            "etcd did not answer within {START_PATIENCE:?}: {error}"
                        ));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The URL clients reach it at.
    pub fn client_url(&self) -> &str {
        &self.client_url
    }

    /// How it exited, if it did.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Its process id.
    pub fn process_id(&self) -> u32 {
        self.child.id()
    }

    /// Kills it (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill();
    }
}
