//! Starting the systems a benchmark measures, as child processes that are stopped on drop.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A child process stopped (SIGTERM, then killed, and reaped) when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
    /// True once the child was waited for: its pid may belong to another process by now, so
    /// no signal may be sent to it any more.
    reaped: bool,
}

/// How long a benchmark's child gets to stop after SIGTERM (`stratus up` stops its own children
/// in that time) before it is killed.
const CHILD_STOP_GRACE: Duration = Duration::from_secs(10);

impl ChildProcess {
    /// Starts `command`; `description` names it in errors.
    pub fn spawn(command: &mut Command, description: &str) -> Result<ChildProcess, String> {
        let child = command.spawn().map_err(|error| format!("starting {description}: {error}"))?;
        Ok(ChildProcess { child, reaped: false })
    }

    /// Kills the child with SIGKILL at once and reaps it: a crash, not a shutdown.
    pub fn kill_now(&mut self) -> Result<(), String> {
        if self.reaped {
            return Ok(());
        }
        self.child.kill().map_err(|error| format!("SIGKILL: {error}"))?;
        self.child.wait().map_err(|error| format!("reaping a killed child: {error}"))?;
        self.reaped = true;
        Ok(())
    }

    /// Waits (at most `patience`) for the child to exit on its own, and reaps it.
    pub fn wait_for_exit(&mut self, patience: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + patience;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.reaped = true;
                    return Ok(status);
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Err(format!("did not exit within {} s", patience.as_secs()))
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(error) => return Err(format!("waiting for a child: {error}")),
            }
        }
    }

    /// Sends the signal named `name` (STOP, CONT, …) to the child, with the `kill` command
    /// (this crate has no unsafe code); a child already reaped is not signalled.
    pub fn signal(&self, name: &str) -> Result<(), String> {
        if self.reaped {
            return Err(format!("SIG{name} to a child that has exited"));
        }
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|error| format!("kill -{name}: {error}"))?;
        if !status.success() {
            return Err(format!("kill -{name} {} failed ({status})", self.child.id()));
        }
        Ok(())
    }

    /// The child's process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Takes the pipes to the child's standard input and from its standard output, where the
    /// command asked for them.
    pub fn take_standard_streams(
        &mut self,
    ) -> (Option<std::process::ChildStdin>, Option<std::process::ChildStdout>) {
        (self.child.stdin.take(), self.child.stdout.take())
    }

    /// The exit status if the child has exited (it is then reaped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            self.reaped = true;
        }
        status
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // SIGTERM first, so `stratus up` stops its servers; `kill` the command keeps this crate
        // free of unsafe code. The children also stop on their own when `up` dies.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + CHILD_STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `stratus ARGUMENTS...` and waits (at most `patience`) for a line of its standard
/// output that contains `marker`; returns the child and that line. Its standard error is
/// discarded.
pub fn start_stratus(
    arguments: &[&str],
    marker: &str,
    patience: Duration,
) -> Result<(ChildProcess, String), String> {
    let mut command = stratus_command(arguments)?;
    command.stderr(Stdio::null());
    start_and_wait_for_marker(&mut command, arguments, marker, patience)
}

/// [`start_stratus`], with the child's standard error (its log) appended to `error_log`: with
/// info lines and without colour codes, because the benchmark reads it (the coordinator's
/// crash declarations) and people read it after a failure.
pub fn start_stratus_logged(
    arguments: &[&str],
    marker: &str,
    patience: Duration,
    error_log: &Path,
) -> Result<(ChildProcess, String), String> {
    let mut command = logged_stratus_command(arguments, error_log)?;
    start_and_wait_for_marker(&mut command, arguments, marker, patience)
        .map_err(|error| format!("{error} (its log: {})", error_log.display()))
}

/// Starts `stratus ARGUMENTS...` without waiting for it to say anything (a standby
/// coordinator says nothing until it is active); its standard error (its log) is appended to
/// `error_log` as [`start_stratus_logged`] does, its standard output discarded.
pub fn spawn_stratus_logged(arguments: &[&str], error_log: &Path) -> Result<ChildProcess, String> {
    let mut command = logged_stratus_command(arguments, error_log)?;
    command.stdout(Stdio::null());
    ChildProcess::spawn(&mut command, &format!("stratus {arguments:?}"))
}

/// `stratus ARGUMENTS...` with its standard error (its log, info lines, no colour codes)
/// appended to `error_log`.
fn logged_stratus_command(arguments: &[&str], error_log: &Path) -> Result<Command, String> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(error_log)
        .map_err(|error| format!("{}: {error}", error_log.display()))?;
    let mut command = stratus_command(arguments)?;
    command.stderr(log).env("STRATUS_LOG", "info").env("NO_COLOR", "1");
    Ok(command)
}

/// A local cluster a benchmark started with `stratus up`, stopped when dropped.
pub struct UpCluster {
    /// The `stratus up` process (it stops its children when it ends).
    pub process: ChildProcess,
    /// The coordinator's address.
    pub coordinator: String,
    /// What `stratus up` printed up to its ready line (for example the RESP addresses).
    pub lines: Vec<String>,
}

/// Starts `stratus up` with `servers` servers, data under `directory`, the coordinator on a
/// free port and no metrics (the status page's once-a-second sampler would be load the
/// references do not have), followed by `extra` arguments; waits until it is ready. `binary`
/// runs another build of `stratus` (default: this one).
pub fn start_local_cluster(
    directory: &Path,
    servers: u32,
    extra: &[&str],
    binary: Option<&Path>,
) -> Result<UpCluster, String> {
    start_up(directory, servers, extra, binary, false, &[])
}

/// A cluster of [`start_local_cluster_with_metrics`]: the cluster and where each server serves
/// its metrics (`host:port`, in the servers' order).
pub struct MetricsCluster {
    /// The cluster.
    pub cluster: UpCluster,
    /// `server-0`'s metrics address first.
    pub server_metrics: Vec<String>,
}

/// [`start_local_cluster`] with every process's metrics endpoint on (free ports; a benchmark
/// that reads a server's own figures, such as its flash tier's, needs them) and `environment`
/// set for `stratus up` and so for its servers (`STRATUS_FLASH_GIB`, say).
pub fn start_local_cluster_with_metrics(
    directory: &Path,
    servers: u32,
    extra: &[&str],
    environment: &[(&str, &str)],
) -> Result<MetricsCluster, String> {
    let cluster = start_up(directory, servers, extra, None, true, environment)?;
    let mut server_metrics = Vec::new();
    for index in 0..servers {
        let prefix = format!("metrics: server-{index} ");
        let address = cluster
            .lines
            .iter()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|url| url.strip_prefix("http://"))
            .and_then(|url| url.strip_suffix("/metrics"))
            .ok_or_else(|| format!("`stratus up` printed no metrics address for server-{index}"))?;
        server_metrics.push(address.to_string());
    }
    Ok(MetricsCluster { cluster, server_metrics })
}

fn start_up(
    directory: &Path,
    servers: u32,
    extra: &[&str],
    binary: Option<&Path>,
    metrics: bool,
    environment: &[(&str, &str)],
) -> Result<UpCluster, String> {
    let coordinator = free_loopback_address()?;
    let directory_text = directory.display().to_string();
    let servers_text = servers.to_string();
    let mut arguments = vec!["--coordinator", &coordinator, "up"];
    if !metrics {
        arguments.push("--no-metrics");
    }
    arguments.extend(["--dir", &directory_text, "--servers", &servers_text]);
    arguments.extend_from_slice(extra);
    let mut command = match binary {
        Some(binary) => {
            let mut command = Command::new(binary);
            command.args(&arguments).stdin(Stdio::null()).stdout(Stdio::piped());
            command
        }
        None => stratus_command(&arguments)?,
    };
    command.stderr(Stdio::null());
    for (name, value) in environment {
        command.env(name, value);
    }
    let (process, lines) =
        start_and_collect(&mut command, &arguments, "ready", LOCAL_CLUSTER_PATIENCE)?;
    Ok(UpCluster { process, coordinator, lines })
}

/// How long `stratus up` may take to report its cluster ready.
const LOCAL_CLUSTER_PATIENCE: Duration = Duration::from_secs(60);

/// `stratus ARGUMENTS...` with this process's own executable, standard output piped.
fn stratus_command(arguments: &[&str]) -> Result<Command, String> {
    let executable = std::env::current_exe().map_err(|error| error.to_string())?;
    let mut command = Command::new(executable);
    command.args(arguments).stdin(Stdio::null()).stdout(Stdio::piped());
    Ok(command)
}

fn start_and_wait_for_marker(
    command: &mut Command,
    arguments: &[&str],
    marker: &str,
    patience: Duration,
) -> Result<(ChildProcess, String), String> {
    let (process, mut lines) = start_and_collect(command, arguments, marker, patience)?;
    let line = lines.pop().expect("the marker's line ends the collected lines");
    Ok((process, line))
}

fn start_and_collect(
    command: &mut Command,
    arguments: &[&str],
    marker: &str,
    patience: Duration,
) -> Result<(ChildProcess, Vec<String>), String> {
    let mut process = ChildProcess::spawn(command, &format!("stratus {arguments:?}"))?;
    let stdout = process.child.stdout.take().ok_or("no stdout")?;
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        // Keep draining after the receiver is gone, so the child never blocks on a full pipe.
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = sender.send(line);
        }
    });
    let deadline = std::time::Instant::now() + patience;
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match receiver.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(marker);
                lines.push(line);
                if found {
                    return Ok((process, lines));
                }
            }
            Err(_) => {
                return Err(format!("stratus {arguments:?} did not print {marker:?} in time"))
            }
        }
    }
}

/// A free loopback port (bound then released; a small race we accept in benchmarks).
pub fn free_loopback_address() -> Result<String, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|error| error.to_string())?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    Ok(address.to_string())
}
