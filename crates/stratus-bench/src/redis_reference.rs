//! The peer reference of `bench recovery`: how long Redis takes to come back after a restart
//! from an append-only file holding the same objects — the single-node way of getting a
//! durable in-memory store's data back into memory.
//!
//! Redis runs on a free loopback port with `--appendonly yes --appendfsync no --save ""` and
//! automatic AOF rewrites off, so the file stays a plain log of SET commands (a rewrite would
//! turn it into an RDB snapshot at a moment that depends on timing). The objects are loaded
//! with pipelined SETs over a raw RESP connection; SHUTDOWN flushes and fsyncs the file; the
//! restart is timed from process start until PING answers PONG instead of LOADING, and its CPU
//! time until then is read from /proc. Both sides read warm page caches: Stratus's backups and
//! Redis's file were written moments before.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{free_loopback_address, ChildProcess};
use crate::cpu::cpu_since_start;

/// The Redis executable looked for on PATH.
pub const REDIS_SERVER: &str = "redis-server";

/// SETs sent before their replies are read.
const PIPELINE_COMMANDS: usize = 1_000;
/// How long Redis may take to start answering (empty) or to stop.
const START_AND_STOP_PATIENCE: Duration = Duration::from_secs(60);
/// The longest a single socket read or write may block.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two polls while Redis starts or loads.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// What restarting Redis took.
#[derive(Clone, Copy, Debug)]
pub struct RedisRestart {
    /// From spawning the process until PING answered PONG.
    pub restart: Duration,
    /// Bytes of the append-only file(s) it loaded.
    pub aof_bytes: u64,
    /// CPU time the restarted process used until it answered PONG.
    pub cpu: Duration,
}

/// The path of an executable file named `name` in the directories of `search_path` (a PATH
/// value), if any.
pub fn find_executable(name: &str, search_path: &OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(search_path).map(|directory| directory.join(name)).find(|candidate| {
        std::fs::metadata(candidate)
            .map(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// Starts Redis in `directory`, loads `objects` objects (key and value of `object_at(index)`),
/// shuts it down and measures the restart (at most `restart_patience`).
pub fn measure_restart(
    executable: &Path,
    directory: &Path,
    objects: u64,
    object_at: impl Fn(u64) -> (Vec<u8>, Vec<u8>),
    restart_patience: Duration,
) -> Result<RedisRestart, String> {
    std::fs::create_dir_all(directory)
        .map_err(|error| format!("{}: {error}", directory.display()))?;
    let address = free_loopback_address()?;
    let port = address.rsplit(':').next().unwrap_or_default().to_string();
    let log = directory.join("redis.log");

    let mut first = start_redis(executable, directory, &port, &log)?;
    wait_for_pong(&address, Instant::now() + START_AND_STOP_PATIENCE)?;
    load(&address, objects, &object_at)?;
    shut_down(&address)?;
    first
        .wait_for_exit(START_AND_STOP_PATIENCE)
        .map_err(|error| format!("redis after SHUTDOWN: {error} (log: {})", log.display()))?;
    drop(first);
    let aof_bytes = directory_bytes(directory, "redis.log");

    let started = Instant::now();
    let restarted = start_redis(executable, directory, &port, &log)?;
    wait_for_pong(&address, started + restart_patience)
        .map_err(|error| format!("{error} (log: {})", log.display()))?;
    let restart = started.elapsed();
    let cpu = cpu_since_start(restarted.id())?;
    let keys = database_size(&address)?;
    if keys != objects {
        return Err(format!("redis came back with {keys} keys, not {objects}"));
    }
    Ok(RedisRestart { restart, aof_bytes, cpu })
}

fn start_redis(
    executable: &Path,
    directory: &Path,
    port: &str,
    log: &Path,
) -> Result<ChildProcess, String> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|error| format!("{}: {error}", log.display()))?;
    let error_log = log_file.try_clone().map_err(|error| error.to_string())?;
    let mut command = Command::new(executable);
    command
        .args(["--port", port, "--bind", "127.0.0.1", "--daemonize", "no"])
        .args(["--appendonly", "yes", "--appendfsync", "no", "--save", ""])
        .args(["--auto-aof-rewrite-percentage", "0"])
        .arg("--dir")
        .arg(directory)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(error_log);
    ChildProcess::spawn(&mut command, REDIS_SERVER)
}

pub(crate) fn connect(address: &str) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Polls until Redis accepts a connection and answers PING with PONG (a loading Redis
/// answers LOADING); fails at `deadline`.
fn wait_for_pong(address: &str, deadline: Instant) -> Result<(), String> {
    let mut last_answer = String::from("no connection");
    while Instant::now() < deadline {
        let Ok(stream) = connect(address) else {
            std::thread::sleep(POLL_INTERVAL);
            continue;
        };
        let mut reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
        let mut writer = stream;
        while Instant::now() < deadline {
            let mut line = String::new();
            let answered = writer.write_all(&encode_command(&[b"PING"])).is_ok()
                && reader.read_line(&mut line).is_ok_and(|bytes| bytes > 0);
            if !answered {
                break;
            }
            if line.starts_with("+PONG") {
                return Ok(());
            }
            last_answer = line.trim_end().to_string();
            std::thread::sleep(POLL_INTERVAL);
        }
    }
    Err(format!("redis did not answer PONG in time (last answer: {last_answer})"))
}

/// Pipelined SETs of every object, checking that each was answered +OK.
fn load(
    address: &str,
    objects: u64,
    object_at: &impl Fn(u64) -> (Vec<u8>, Vec<u8>),
) -> Result<(), String> {
    let stream = connect(address).map_err(|error| format!("connecting to redis: {error}"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
    let mut writer = stream;
    let mut requests = Vec::new();
    let mut replies = Vec::new();
    let mut next = 0u64;
    while next < objects {
        let batch_end = (next + PIPELINE_COMMANDS as u64).min(objects);
        requests.clear();
        for index in next..batch_end {
            let (key, value) = object_at(index);
            requests.extend_from_slice(&encode_command(&[b"SET", &key, &value]));
        }
        writer.write_all(&requests).map_err(|error| format!("sending SETs: {error}"))?;
        // Every answer to a SET that succeeded is exactly "+OK\r\n".
        replies.resize((batch_end - next) as usize * OK_REPLY.len(), 0);
        reader.read_exact(&mut replies).map_err(|error| format!("reading SET replies: {error}"))?;
        if let Some(bad) = replies.chunks(OK_REPLY.len()).find(|reply| *reply != OK_REPLY) {
            return Err(format!("redis refused a SET: {}", String::from_utf8_lossy(bad)));
        }
        next = batch_end;
    }
    Ok(())
}

const OK_REPLY: &[u8] = b"+OK\r\n";

/// SHUTDOWN (which, with the append-only file on, flushes and fsyncs it). Redis closes the
/// connection instead of answering when it succeeds.
fn shut_down(address: &str) -> Result<(), String> {
    let mut stream = connect(address).map_err(|error| format!("connecting to redis: {error}"))?;
    stream
        .write_all(&encode_command(&[b"SHUTDOWN"]))
        .map_err(|error| format!("sending SHUTDOWN: {error}"))?;
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    if reply.first() == Some(&b'-') {
        return Err(format!("redis refused SHUTDOWN: {}", String::from_utf8_lossy(&reply)));
    }
    Ok(())
}

fn database_size(address: &str) -> Result<u64, String> {
    let stream = connect(address).map_err(|error| format!("connecting to redis: {error}"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
    let mut writer = stream;
    writer.write_all(&encode_command(&[b"DBSIZE"])).map_err(|error| error.to_string())?;
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|error| error.to_string())?;
    parse_integer_reply(&line).ok_or_else(|| format!("unexpected DBSIZE reply {line:?}"))
}

/// A RESP array of bulk strings: how clients send commands.
pub fn encode_command(arguments: &[&[u8]]) -> Vec<u8> {
    let mut bytes = format!("*{}\r\n", arguments.len()).into_bytes();
    for argument in arguments {
        bytes.extend_from_slice(format!("${}\r\n", argument.len()).as_bytes());
        bytes.extend_from_slice(argument);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes
}

/// The value of a RESP integer reply line (":42\r\n").
pub fn parse_integer_reply(line: &str) -> Option<u64> {
    line.strip_prefix(':')?.trim_end().parse().ok()
}

/// Bytes of the files under `directory`, recursively (Redis 7 keeps its append-only file as
/// several parts in a subdirectory), except the one named `excluded`.
fn directory_bytes(directory: &Path, excluded: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir(directory) else { return 0 };
    entries
        .flatten()
        .filter(|entry| entry.file_name() != excluded)
        .map(|entry| match entry.metadata() {
            Ok(metadata) if metadata.is_dir() => directory_bytes(&entry.path(), excluded),
            Ok(metadata) => metadata.len(),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            encode_command(&[b"SET", b"k", b"value"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n"
        );
        assert_eq!(encode_command(&[b"PING"]), b"*1\r\n$4\r\nPING\r\n");
    }

    #[test]
    fn integer_replies_parse() {
        assert_eq!(parse_integer_reply(":1048576\r\n"), Some(1_048_576));
        assert_eq!(parse_integer_reply("-LOADING Redis is loading\r\n"), None);
        assert_eq!(parse_integer_reply(":x\r\n"), None);
    }

    #[test]
    fn executables_are_found_on_the_search_path_only() {
        use std::os::unix::fs::PermissionsExt;
        let first = tempfile::tempdir().unwrap();
        let second = tempfile::tempdir().unwrap();
        let plain = first.path().join("tool");
        std::fs::write(&plain, b"").unwrap();
        let executable = second.path().join("tool");
        std::fs::write(&executable, b"").unwrap();
        std::fs::set_permissions(&executable, std::fs::Permissions::from_mode(0o755)).unwrap();
        let search_path = std::env::join_paths([first.path(), second.path()]).unwrap();
        assert_eq!(find_executable("tool", &search_path), Some(executable));
        assert_eq!(find_executable("missing", &search_path), None);
    }
}
