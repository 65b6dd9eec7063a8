//! Starting the systems a benchmark measures, as child processes that are stopped on drop.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A child process stopped (killed and reaped) when dropped.
#[derive(Debug)]
pub struct ChildProcess {
    child: Child,
}

/// How long a benchmark's child gets to stop after SIGTERM (`stratus up` stops its own children
/// in that time) before it is killed.
const CHILD_STOP_GRACE: Duration = Duration::from_secs(10);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // SIGTERM first, so `stratus up` stops its servers; `kill` the command keeps this crate
        // free of unsafe code. The children also stop on their own when `up` dies.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = std::time::Instant::now() + CHILD_STOP_GRACE;
        while std::time::Instant::now() < deadline {
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
/// output that contains `marker`; returns the child and that line.
pub fn start_stratus(
    arguments: &[&str],
    marker: &str,
    patience: Duration,
) -> Result<(ChildProcess, String), String> {
    let executable = std::env::current_exe().map_err(|error| error.to_string())?;
    let mut child = Command::new(executable)
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("starting stratus {arguments:?}: {error}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let process = ChildProcess { child };
    let (sender, receiver) = mpsc::channel();
    let marker = marker.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains(&marker) {
                let _ = sender.send(line);
                // Keep draining so the child never blocks on a full pipe.
                continue;
            }
        }
    });
    match receiver.recv_timeout(patience) {
        Ok(line) => Ok((process, line)),
        Err(_) => Err(format!("stratus {arguments:?} did not print {:?} in time", "ready")),
    }
}

/// A free loopback port (bound then released; a small race we accept in benchmarks).
pub fn free_loopback_address() -> Result<String, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|error| error.to_string())?;
    let address = listener.local_addr().map_err(|error| error.to_string())?;
    Ok(address.to_string())
}
