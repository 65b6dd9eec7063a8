//! A cluster of real `stratus` processes on loopback for integration tests. Every process is
//! killed when the cluster is dropped; every wait is bounded.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use stratus_client::{Client, ClientConfig};

/// The stratus binary under test.
pub fn stratus_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_stratus"))
}

/// A free loopback address.
pub fn free_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("local address").to_string()
}

/// A running process whose stdout lines are forwarded to a channel.
pub struct Process {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    /// The address a server announced ("server N listening on ADDRESS"), once known.
    pub address: Option<String>,
}

impl Process {
    /// `stratus ARGUMENTS`, logging warnings and errors only (or what `STRATUS_TEST_LOG` says:
    /// `STRATUS_TEST_LOG=info` shows what the servers did when a test is chased).
    pub fn start(arguments: &[String]) -> Process {
        let filter = std::env::var("STRATUS_TEST_LOG").unwrap_or_else(|_| "warn".to_string());
        Process::start_logging(arguments, &filter)
    }

    /// `stratus ARGUMENTS` with the log filter `STRATUS_LOG=filter`.
    pub fn start_logging(arguments: &[String], filter: &str) -> Process {
        let mut child = Command::new(stratus_binary())
            .args(arguments)
            .env("STRATUS_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start stratus");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Process { child, lines, address: None }
    }

    /// Waits (bounded) for a stdout line containing `marker`.
    pub fn wait_for_line(&self, marker: &str, patience: Duration) -> String {
        self.try_wait_for_line(marker, patience)
            .unwrap_or_else(|| panic!("no line containing {marker:?} within {patience:?}"))
    }

    /// [`Process::wait_for_line`], None when the process ends or the patience runs out first.
    pub fn try_wait_for_line(&self, marker: &str, patience: Duration) -> Option<String> {
        let deadline = Instant::now() + patience;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(marker) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    pub fn signal(&self, signal: i32) {
        send_signal(i32::try_from(self.child.id()).expect("pid"), signal);
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the process to exit and returns whether it exited successfully.
    pub fn wait_exit(&mut self, patience: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends `signal` to the process `pid` (a child of the test, or of one of its children).
#[allow(unsafe_code)]
pub fn send_signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// A coordinator and storage servers, each a separate process.
pub struct TestCluster {
    pub coordinator_address: String,
    pub directory: tempfile::TempDir,
    pub coordinator: Process,
    pub servers: Vec<Process>,
    /// Server arguments besides the common ones, kept for restarts.
    replicas: usize,
    extra: Vec<String>,
    /// Coordinator arguments besides the common ones, kept for restarts.
    coordinator_extra: Vec<String>,
}

/// Server arguments used by the tests: a small log with 1 MiB segments and 128 KiB values,
/// `replicas` copies of each segment, backup storage under `backup_directory`.
pub fn server_arguments(
    coordinator: &str,
    replicas: usize,
    backup_directory: &std::path::Path,
) -> Vec<String> {
    let replicas = replicas.to_string();
    let backup_directory = backup_directory.display().to_string();
    [
        "--coordinator",
        coordinator,
        "server",
        "--listen",
        "127.0.0.1:0",
        "--log-mib",
        "32",
        "--segment-mib",
        "1",
        "--value-bytes-max",
        "131072",
        "--replicas",
        replicas.as_str(),
        "--backup-dir",
        backup_directory.as_str(),
    ]
    .iter()
    .map(|argument| argument.to_string())
    .collect()
}

impl TestCluster {
    /// `server_count` servers, each segment replicated on up to 2 of the others (a single
    /// server runs memory-only).
    pub fn start(server_count: usize) -> TestCluster {
        Self::start_with_replicas(server_count, server_count.saturating_sub(1).min(2))
    }

    /// `server_count` servers with `replicas` copies of every segment.
    pub fn start_with_replicas(server_count: usize, replicas: usize) -> TestCluster {
        Self::start_with(server_count, replicas, &[])
    }

    /// `server_count` servers with `replicas` copies of every segment and `extra` server
    /// arguments.
    pub fn start_with(server_count: usize, replicas: usize, extra: &[&str]) -> TestCluster {
        Self::start_with_coordinator(server_count, replicas, extra, &[])
    }

    /// Like [`TestCluster::start_with`], with `coordinator_extra` coordinator arguments.
    pub fn start_with_coordinator(
        server_count: usize,
        replicas: usize,
        extra: &[&str],
        coordinator_extra: &[&str],
    ) -> TestCluster {
        let directory = tempfile::tempdir().expect("temporary directory");
        let coordinator_extra: Vec<String> =
            coordinator_extra.iter().map(|argument| argument.to_string()).collect();
        // Port 0: the coordinator binds a free port itself and says which. (A port found free
        // here and bound later by the child can be taken in between by another test's
        // connection: CI saw "Address already in use".) Restarts reuse the port it got.
        let (coordinator, coordinator_address) =
            Self::launch_coordinator("127.0.0.1:0", &directory, &coordinator_extra);
        let mut cluster = TestCluster {
            coordinator_address,
            directory,
            coordinator,
            servers: Vec::new(),
            replicas,
            extra: extra.iter().map(|argument| argument.to_string()).collect(),
            coordinator_extra,
        };
        cluster.servers = (0..server_count).map(|index| cluster.start_server(index)).collect();
        cluster
    }

    /// Starts server `index` (its backup directory is `backup-<index>`) and waits until it
    /// listens.
    fn start_server(&self, index: usize) -> Process {
        let backup_directory = self.directory.path().join(format!("backup-{index}"));
        let mut arguments =
            server_arguments(&self.coordinator_address, self.replicas, &backup_directory);
        arguments.extend(self.extra.iter().cloned());
        let mut server = Process::start(&arguments);
        let line = server.wait_for_line("listening on", Duration::from_secs(30));
        server.address = line.split_whitespace().last().map(str::to_string);
        server
    }

    /// Starts the coordinator and every server again on their directories, after they were
    /// all stopped (a cold start).
    pub fn restart_all(&mut self) {
        self.coordinator = Self::start_coordinator_with(
            &self.coordinator_address,
            &self.directory,
            &self.coordinator_extra,
        );
        self.servers = (0..self.servers.len()).map(|index| self.start_server(index)).collect();
    }

    pub fn start_coordinator(address: &str, directory: &tempfile::TempDir) -> Process {
        Self::start_coordinator_with(address, directory, &[])
    }

    pub fn start_coordinator_with(
        address: &str,
        directory: &tempfile::TempDir,
        extra: &[String],
    ) -> Process {
        Self::launch_coordinator(address, directory, extra).0
    }

    /// Starts a coordinator listening on `address` and waits until it listens; returns it and
    /// the address it listens on (the port it was given, or the one it chose for port 0).
    fn launch_coordinator(
        address: &str,
        directory: &tempfile::TempDir,
        extra: &[String],
    ) -> (Process, String) {
        let mut arguments = vec![
            "coordinator".to_string(),
            "--listen".to_string(),
            address.to_string(),
            "--dir".to_string(),
            directory.path().join("coordinator").display().to_string(),
        ];
        arguments.extend(extra.iter().cloned());
        let coordinator = Process::start(&arguments);
        let line = coordinator.wait_for_line("listening on", Duration::from_secs(30));
        let listening = line.split_whitespace().last().expect("an address").to_string();
        (coordinator, listening)
    }

    /// Kills the coordinator with SIGKILL and starts a new one on the same directory.
    pub fn restart_coordinator_after_sigkill(&mut self) {
        self.coordinator.signal(libc::SIGKILL);
        assert!(self.coordinator.wait_exit(Duration::from_secs(10)).is_some());
        self.coordinator = Self::start_coordinator_with(
            &self.coordinator_address,
            &self.directory,
            &self.coordinator_extra,
        );
    }

    pub fn client(&self) -> Client {
        let mut config = ClientConfig::new(self.coordinator_address.clone());
        config.operation_timeout = Duration::from_secs(20);
        Client::new(config)
    }
}

/// One JSON object a benchmark printed.
pub type BenchRow = std::collections::HashMap<String, serde_json::Value>;

/// The number `field` of a benchmark's row; fails the test, showing the row, if it is not one.
pub fn number(row: &BenchRow, field: &str) -> f64 {
    row[field].as_f64().unwrap_or_else(|| panic!("{field}: {row:?}"))
}

/// Asserts that every one of `fields` of a benchmark's row is a positive, finite number.
pub fn assert_positive(row: &BenchRow, fields: &[&str]) {
    for field in fields {
        let value = number(row, field);
        assert!(value > 0.0 && value.is_finite(), "{field} = {value}: {row:?}");
    }
}

/// Runs `stratus ARGUMENTS` (a benchmark) to its end, waiting at most `patience`; asserts that
/// it succeeded and returns its standard output and the JSON objects it printed.
pub fn run_bench(arguments: &[&str], patience: Duration) -> (String, Vec<BenchRow>) {
    let arguments: Vec<String> = arguments.iter().map(|argument| argument.to_string()).collect();
    let mut bench = Process::start(&arguments);
    let status = bench
        .wait_exit(patience)
        .unwrap_or_else(|| panic!("{arguments:?} did not finish within {patience:?}"));
    let mut lines = Vec::new();
    while let Ok(line) = bench.lines.recv_timeout(Duration::from_secs(10)) {
        lines.push(line);
    }
    let stdout = lines.join("\n");
    assert!(status.success(), "{arguments:?} failed (its errors are above):\n{stdout}");
    let rows = stdout
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).expect("a JSON object per line"))
        .collect();
    (stdout, rows)
}

/// Whether `executable` is on PATH.
pub fn installed(executable: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {executable}")])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Fails the test, naming `executable`, unless it is on PATH: no test skips itself for want of
/// a program (`scripts/test`, the README's test command, installs every one).
pub fn require_installed(executable: &str) {
    assert!(
        installed(executable),
        "this test needs `{executable}`, which is not on PATH: run the tests with scripts/test \
         (README.md), which installs every program they need"
    );
}

/// The address of a process's metrics endpoint, from the line it prints once it serves.
pub fn metrics_address(process: &Process, patience: Duration) -> String {
    let line = process.wait_for_line("metrics served at http://", patience);
    let url = line.split("http://").nth(1).expect("a URL");
    url.split('/').next().expect("an address").to_string()
}

/// `GET /metrics` of `address`, parsed strictly.
pub fn scrape(address: &str) -> stratus_ops::exposition::ParsedExposition {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to /metrics");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("read timeout");
    let request = format!("GET /metrics HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send the request");
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read the response");
    let text = String::from_utf8(bytes).expect("UTF-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stratus_ops::exposition::parse(body).unwrap_or_else(|error| panic!("{error}\n{body}"))
}
