//! The RESP gateway (`stratus resp`) in front of a real cluster, driven with raw RESP over TCP
//! and, when it is installed, with `redis-cli`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{free_address, Process, TestCluster};
use stratus_resp::{parse_value, Protocol, Value};

/// A cluster of 2 servers and a gateway whose tables span both, so keys live on both masters.
struct Setup {
    _cluster: TestCluster,
    _gateway: Process,
    address: String,
}

fn start() -> Setup {
    let cluster = TestCluster::start(2);
    // A free port can be taken by another test's process before the gateway binds it (the
    // gateway then exits with "Address already in use"): try a few.
    for _attempt in 0..5 {
        let address = free_address();
        let gateway = Process::start(&[
            "--coordinator".to_string(),
            cluster.coordinator_address.clone(),
            "resp".to_string(),
            "--listen".to_string(),
            address.clone(),
            "--table-span".to_string(),
            "2".to_string(),
            "--value-bytes-max".to_string(),
            "131072".to_string(),
        ]);
        if gateway.try_wait_for_line("listening on", Duration::from_secs(30)).is_some() {
            return Setup { _cluster: cluster, _gateway: gateway, address };
        }
    }
    panic!("the RESP gateway did not start on any of 5 free ports");
}

/// One client connection speaking raw RESP.
struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Connection {
    fn open(address: &str) -> Connection {
        let stream = TcpStream::connect(address).expect("connect to the gateway");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Connection { stream, buffer: Vec::new() }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    fn send(&mut self, arguments: &[&[u8]]) {
        let command =
            Value::Array(arguments.iter().map(|argument| Value::bulk(argument)).collect());
        self.send_raw(&command.to_bytes(Protocol::Resp2));
    }

    /// The next reply; panics if none comes within the read timeout.
    fn reply(&mut self) -> Value {
        loop {
            if let Some((value, used)) = parse_value(&self.buffer).expect("valid RESP reply") {
                self.buffer.drain(..used);
                return value;
            }
            let mut chunk = [0u8; 65536];
            let read = match self.stream.read(&mut chunk) {
                // A signal the test process got (a child's exit) is no reason to fail.
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                read => read.expect("read reply"),
            };
            assert!(read > 0, "gateway closed the connection; buffered {:?}", self.buffer);
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    fn call(&mut self, arguments: &[&[u8]]) -> Value {
        self.send(arguments);
        self.reply()
    }

    /// The next reply's bytes, exactly as they came (to tell `*-1` from `$-1`).
    fn call_raw(&mut self, arguments: &[&[u8]]) -> Vec<u8> {
        self.send(arguments);
        loop {
            if let Some((_, used)) = parse_value(&self.buffer).expect("valid RESP reply") {
                return self.buffer.drain(..used).collect();
            }
            let mut chunk = [0u8; 65536];
            let read = match self.stream.read(&mut chunk) {
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                read => read.expect("read reply"),
            };
            assert!(read > 0, "gateway closed the connection; buffered {:?}", self.buffer);
            self.buffer.extend_from_slice(&chunk[..read]);
        }
    }

    /// True when the gateway closed the connection (after any pending replies).
    fn closed(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        matches!(self.stream.read(&mut chunk), Ok(0))
    }
}

fn ok() -> Value {
    Value::ok()
}

fn bulk(bytes: &[u8]) -> Value {
    Value::bulk(bytes)
}

fn error(text: &str) -> Value {
    Value::error(text)
}

fn assert_error_starts(value: &Value, prefix: &str) {
    match value {
        Value::Error(text) => assert!(text.starts_with(prefix), "{text:?} should start {prefix:?}"),
        other => panic!("expected an error starting {prefix:?}, got {other:?}"),
    }
}

#[test]
fn resp_gateway_serves_redis_commands_over_raw_tcp() {
    let setup = start();
    let mut connection = Connection::open(&setup.address);

    // Connection commands.
    assert_eq!(connection.call(&[b"PING"]), Value::simple("PONG"));
    assert_eq!(connection.call(&[b"ping", b"hi"]), bulk(b"hi"));
    assert_eq!(connection.call(&[b"ECHO", b"a\r\nb"]), bulk(b"a\r\nb"));
    assert_eq!(
        connection.call(&[b"PING", b"a", b"b"]),
        error("ERR wrong number of arguments for 'ping' command")
    );
    assert_eq!(
        connection.call(&[b"GET"]),
        error("ERR wrong number of arguments for 'get' command")
    );
    assert_eq!(
        connection.call(&[b"FOO", b"bar", b"baz"]),
        error("ERR unknown command 'FOO', with args beginning with: 'bar' 'baz' ")
    );
    assert_eq!(connection.call(&[b"CLIENT", b"SETNAME", b"tester"]), ok());
    assert_eq!(connection.call(&[b"CLIENT", b"GETNAME"]), bulk(b"tester"));
    assert!(matches!(connection.call(&[b"CLIENT", b"ID"]), Value::Integer(id) if id > 0));
    assert_error_starts(&connection.call(&[b"CLIENT", b"SETNAME", b"a b"]), "ERR Client names");
    assert_error_starts(&connection.call(&[b"CLIENT", b"KILL"]), "ERR unknown subcommand 'KILL'");
    assert!(
        matches!(connection.call(&[b"COMMAND", b"COUNT"]), Value::Integer(count) if count >= 25)
    );
    assert!(matches!(connection.call(&[b"COMMAND"]), Value::Array(entries) if entries.len() >= 25));
    assert_eq!(connection.call(&[b"COMMAND", b"DOCS"]), Value::Array(Vec::new()));
    match connection.call(&[b"COMMAND", b"INFO", b"get", b"nosuch"]) {
        Value::Array(entries) => {
            assert_eq!(entries.len(), 2);
            assert_eq!(entries[1], Value::Null);
        }
        other => panic!("COMMAND INFO: {other:?}"),
    }
    assert_eq!(connection.call(&[b"CONFIG", b"GET", b"save"]), Value::Array(Vec::new()));

    // Strings, binary-safe.
    assert_eq!(connection.call(&[b"GET", b"missing"]), Value::Null);
    assert_eq!(connection.call(&[b"SET", b"k\0\xff", b"v\r\n\0"]), ok());
    assert_eq!(connection.call(&[b"GET", b"k\0\xff"]), bulk(b"v\r\n\0"));
    assert_eq!(connection.call(&[b"TYPE", b"k\0\xff"]), Value::simple("string"));
    assert_eq!(connection.call(&[b"TYPE", b"missing"]), Value::simple("none"));
    assert_eq!(connection.call(&[b"SET", b"empty-value", b""]), ok());
    assert_eq!(connection.call(&[b"GET", b"empty-value"]), bulk(b""));
    assert_error_starts(&connection.call(&[b"SET", b"", b"x"]), "ERR empty keys are not supported");
    assert_error_starts(&connection.call(&[b"GET", b""]), "ERR empty keys are not supported");
    assert_eq!(connection.call(&[b"STRLEN", b"k\0\xff"]), Value::Integer(4));
    assert_eq!(connection.call(&[b"STRLEN", b"missing"]), Value::Integer(0));

    // SET options.
    assert_eq!(connection.call(&[b"SET", b"s", b"1", b"NX"]), ok());
    assert_eq!(connection.call(&[b"SET", b"s", b"2", b"nx"]), Value::Null);
    assert_eq!(connection.call(&[b"SET", b"s", b"3", b"XX"]), ok());
    assert_eq!(connection.call(&[b"SET", b"absent", b"3", b"XX"]), Value::Null);
    assert_eq!(connection.call(&[b"GET", b"absent"]), Value::Null);
    assert_eq!(connection.call(&[b"SET", b"s", b"4", b"GET"]), bulk(b"3"));
    assert_eq!(connection.call(&[b"SET", b"fresh", b"1", b"GET"]), Value::Null);
    assert_eq!(connection.call(&[b"SET", b"s", b"5", b"NX", b"GET"]), bulk(b"4"));
    assert_eq!(connection.call(&[b"GET", b"s"]), bulk(b"4"));
    assert_eq!(connection.call(&[b"SET", b"s", b"1", b"NX", b"XX"]), error("ERR syntax error"));
    assert_eq!(connection.call(&[b"SET", b"s", b"1", b"BOGUS"]), error("ERR syntax error"));
    // Expiry options are taken (expiry_answers_what_redis_answers checks their meaning).
    for option in [&b"EX"[..], b"PX", b"EXAT", b"PXAT"] {
        assert_eq!(connection.call(&[b"SET", b"e", b"1", option, b"4000000000000"]), ok());
    }
    assert_eq!(connection.call(&[b"DEL", b"e"]), Value::Integer(1));
    assert_error_starts(
        &connection.call(&[b"SET", b"s", b"1", b"KEEPTTL", b"EX", b"5"]),
        "ERR syntax error",
    );
    assert_eq!(connection.call(&[b"GET", b"s"]), bulk(b"4"), "refused options change nothing");
    assert_eq!(connection.call(&[b"GETSET", b"s", b"6"]), bulk(b"4"));
    assert_eq!(connection.call(&[b"GETSET", b"new", b"6"]), Value::Null);
    assert_eq!(connection.call(&[b"SETNX", b"s", b"7"]), Value::Integer(0));
    assert_eq!(connection.call(&[b"SETNX", b"nx-new", b"7"]), Value::Integer(1));

    // Counters are decimal text, like Redis.
    assert_eq!(connection.call(&[b"INCR", b"counter"]), Value::Integer(1));
    assert_eq!(connection.call(&[b"INCRBY", b"counter", b"41"]), Value::Integer(42));
    assert_eq!(connection.call(&[b"DECR", b"counter"]), Value::Integer(41));
    assert_eq!(connection.call(&[b"DECRBY", b"counter", b"-9"]), Value::Integer(50));
    assert_eq!(connection.call(&[b"GET", b"counter"]), bulk(b"50"));
    assert_eq!(connection.call(&[b"SET", b"counter", b"-7"]), ok());
    assert_eq!(connection.call(&[b"INCR", b"counter"]), Value::Integer(-6));
    assert_eq!(
        connection.call(&[b"INCR", b"k\0\xff"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(
        connection.call(&[b"INCRBY", b"counter", b"x"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(connection.call(&[b"SET", b"big", b"9223372036854775807"]), ok());
    assert_eq!(
        connection.call(&[b"INCR", b"big"]),
        error("ERR increment or decrement would overflow")
    );
    assert_eq!(
        connection.call(&[b"DECRBY", b"big", b"-9223372036854775808"]),
        error("ERR decrement would overflow")
    );

    // APPEND.
    assert_eq!(connection.call(&[b"APPEND", b"log", b"abc"]), Value::Integer(3));
    assert_eq!(connection.call(&[b"APPEND", b"log", b"\0de"]), Value::Integer(6));
    assert_eq!(connection.call(&[b"GET", b"log"]), bulk(b"abc\0de"));

    // Multi-key commands across both masters.
    let keys: Vec<Vec<u8>> = (0..40).map(|index| format!("multi-{index}").into_bytes()).collect();
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for key in &keys {
        mset.push(key);
        mset.push(key);
    }
    assert_eq!(connection.call(&mset), ok());
    assert_eq!(
        connection.call(&[b"MSET", b"a"]),
        error("ERR wrong number of arguments for 'mset' command")
    );
    assert_eq!(
        connection.call(&[b"MSET", b"a", b"1", b"b"]),
        error("ERR wrong number of arguments for 'mset' command")
    );
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(Vec::as_slice));
    mget.push(b"missing");
    let mut expected: Vec<Value> = keys.iter().map(|key| bulk(key)).collect();
    expected.push(Value::Null);
    assert_eq!(connection.call(&mget), Value::Array(expected));
    assert_eq!(
        connection.call(&[b"EXISTS", b"multi-1", b"multi-1", b"missing", b"multi-2"]),
        Value::Integer(3)
    );
    assert_eq!(connection.call(&[b"DEL", b"multi-1", b"multi-2", b"missing"]), Value::Integer(2));
    assert_eq!(connection.call(&[b"EXISTS", b"multi-1"]), Value::Integer(0));

    // Enumeration: DBSIZE, KEYS, SCAN (38 multi-* keys remain, plus the others above).
    let size = match connection.call(&[b"DBSIZE"]) {
        Value::Integer(size) => size,
        other => panic!("DBSIZE: {other:?}"),
    };
    assert_eq!(size, 38 + 9);
    match connection.call(&[b"KEYS", b"multi-3*"]) {
        Value::Array(found) => {
            let mut found: Vec<Value> = found;
            found.sort_by_key(|value| format!("{value:?}"));
            let mut expected = vec![bulk(b"multi-3")];
            expected.extend((30..40).map(|index| bulk(format!("multi-{index}").as_bytes())));
            expected.sort_by_key(|value| format!("{value:?}"));
            assert_eq!(found, expected);
        }
        other => panic!("KEYS: {other:?}"),
    }
    let mut cursor = b"0".to_vec();
    let mut scanned = Vec::new();
    for step in 0.. {
        assert!(step < 1000, "SCAN does not end");
        match connection.call(&[b"SCAN", &cursor, b"MATCH", b"multi-*", b"COUNT", b"5"]) {
            Value::Array(parts) => match &parts[..] {
                [Value::BulkString(next), Value::Array(keys)] => {
                    scanned.extend(keys.iter().cloned());
                    cursor = next.to_vec();
                }
                other => panic!("SCAN reply {other:?}"),
            },
            other => panic!("SCAN: {other:?}"),
        }
        if cursor == b"0" {
            break;
        }
    }
    assert_eq!(scanned.len(), 38, "each multi-* key exactly once");
    scanned.sort_by_key(|value| format!("{value:?}"));
    scanned.dedup();
    assert_eq!(scanned.len(), 38);
    assert_eq!(connection.call(&[b"SCAN", b"12345"]), error("ERR invalid cursor"));
    assert_eq!(connection.call(&[b"SCAN", b"0", b"COUNT", b"0"]), error("ERR syntax error"));

    // Databases are tables: SELECT isolates, FLUSHDB empties only the selected one.
    assert_eq!(connection.call(&[b"SELECT", b"1"]), ok());
    assert_eq!(connection.call(&[b"GET", b"s"]), Value::Null);
    assert_eq!(connection.call(&[b"SET", b"s", b"db1"]), ok());
    assert_eq!(connection.call(&[b"DBSIZE"]), Value::Integer(1));
    assert_eq!(connection.call(&[b"FLUSHDB"]), ok());
    assert_eq!(connection.call(&[b"DBSIZE"]), Value::Integer(0));
    assert_eq!(connection.call(&[b"SET", b"after-flush", b"x"]), ok());
    assert_eq!(connection.call(&[b"GET", b"after-flush"]), bulk(b"x"));
    assert_eq!(connection.call(&[b"SELECT", b"16"]), error("ERR DB index is out of range"));
    assert_eq!(
        connection.call(&[b"SELECT", b"x"]),
        error("ERR value is not an integer or out of range")
    );
    assert_eq!(connection.call(&[b"SELECT", b"0"]), ok());
    assert_eq!(connection.call(&[b"GET", b"s"]), bulk(b"6"));

    // INFO reports the cluster's figures.
    match connection.call(&[b"INFO"]) {
        Value::BulkString(text) => {
            let text = String::from_utf8_lossy(&text);
            assert!(text.contains("redis_version:"), "{text}");
            assert!(text.contains("stratus_masters:2\r\n"), "{text}");
            assert!(text.contains("stratus_front_end:gateway\r\n"), "{text}");
            assert!(text.contains("connected_clients:"), "{text}");
        }
        other => panic!("INFO: {other:?}"),
    }

    // Values over the limit: the cluster's limit (128 KiB here) is the gateway's too.
    let large = vec![b'x'; 100 << 10];
    assert_eq!(connection.call(&[b"SET", b"large", &large]), ok());
    assert_eq!(connection.call(&[b"GET", b"large"]), bulk(&large));
    // APPEND past the cluster's value limit: the master refuses, the reply says why, and the
    // value is unchanged.
    let suffix = vec![b'y'; 40 << 10];
    assert_error_starts(
        &connection.call(&[b"APPEND", b"large", &suffix]),
        "ERR stratus: value too large",
    );
    assert_eq!(connection.call(&[b"STRLEN", b"large"]), Value::Integer(100 << 10));
    // A key over 65 535 bytes is refused by the gateway.
    let long_key = vec![b'k'; 65_536];
    assert_error_starts(&connection.call(&[b"GET", &long_key]), "ERR keys longer than 65535 bytes");
    // A client that disconnects in the middle of a command does not disturb the gateway.
    let mut half = Connection::open(&setup.address);
    half.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nabc");
    drop(half);

    // Pipelining: 200 commands in one write, answered in order.
    let mut pipeline = Vec::new();
    for index in 0..100 {
        let key = format!("pipe-{index}");
        let value = format!("value-{index}");
        for command in [vec!["SET", key.as_str(), value.as_str()], vec!["GET", key.as_str()]] {
            let command = Value::Array(command.iter().map(|part| bulk(part.as_bytes())).collect());
            pipeline.extend_from_slice(&command.to_bytes(Protocol::Resp2));
        }
    }
    connection.send_raw(&pipeline);
    for index in 0..100 {
        assert_eq!(connection.reply(), ok());
        assert_eq!(connection.reply(), bulk(format!("value-{index}").as_bytes()));
    }
    // Inline commands work too.
    connection.send_raw(b"PING\r\nGET pipe-7\r\n");
    assert_eq!(connection.reply(), Value::simple("PONG"));
    assert_eq!(connection.reply(), bulk(b"value-7"));

    // RESP3 after HELLO 3: maps and `_` nulls.
    match connection.call(&[b"HELLO", b"3"]) {
        Value::Map(fields) => {
            assert!(fields.contains(&(bulk(b"proto"), Value::Integer(3))), "{fields:?}");
        }
        other => panic!("HELLO 3: {other:?}"),
    }
    connection.send(&[b"GET", b"missing"]);
    assert_eq!(connection.reply(), Value::Null);
    assert_eq!(connection.call(&[b"HELLO", b"4"]), error("NOPROTO unsupported protocol version"));
    assert!(matches!(connection.call(&[b"HELLO", b"2"]), Value::Array(_)), "RESP2 maps are arrays");
    // No password configured: only the user `default` exists, with any password (Redis's
    // `nopass`).
    assert_error_starts(&connection.call(&[b"HELLO", b"3", b"AUTH", b"u", b"p"]), "WRONGPASS");

    // INCR is atomic under contention: read + version-conditional write, retried.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let address = setup.address.clone();
            std::thread::spawn(move || {
                let mut connection = Connection::open(&address);
                for _ in 0..50 {
                    assert!(matches!(connection.call(&[b"INCR", b"contended"]), Value::Integer(_)));
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("incrementing thread");
    }
    assert_eq!(connection.call(&[b"GET", b"contended"]), bulk(b"200"));

    // QUIT answers and closes.
    assert_eq!(connection.call(&[b"QUIT"]), ok());
    assert!(connection.closed());

    // Protocol errors answer and close, like Redis; the gateway keeps serving others.
    let mut broken = Connection::open(&setup.address);
    broken.send_raw(b"*1\r\n:5\r\n");
    assert_eq!(broken.reply(), error("ERR Protocol error: expected '$', got ':'"));
    assert!(broken.closed());
    // Past what Redis itself would take (512 MiB), an argument ends the connection...
    let mut too_large = Connection::open(&setup.address);
    too_large.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999\r\n");
    assert_eq!(too_large.reply(), error("ERR Protocol error: invalid bulk length"));
    assert!(too_large.closed());
    // ... but one over the cluster's value limit (128 KiB here) is read, refused with the
    // limit named, and the connection goes on.
    let mut over_limit = Connection::open(&setup.address);
    let big = vec![b'z'; 200 << 10];
    assert_error_starts(
        &over_limit.call(&[b"SET", b"big", &big]),
        "ERR argument of 204800 bytes is longer than the limit of 131072 bytes",
    );
    assert_eq!(over_limit.call(&[b"GET", b"s"]), bulk(b"6"));
    let mut fresh = Connection::open(&setup.address);
    assert_eq!(fresh.call(&[b"GET", b"s"]), bulk(b"6"));
}

/// `redis-cli` against the gateway (the Debian package `redis-tools`).
#[test]
fn redis_cli_talks_to_the_gateway() {
    common::require_installed("redis-cli");
    let setup = start();
    let port = setup.address.rsplit(':').next().unwrap().to_string();
    let cli = |arguments: &[&str]| -> String {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(arguments)
            .output()
            .expect("run redis-cli");
        assert!(output.status.success(), "redis-cli {arguments:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim_end().to_string()
    };
    assert_eq!(cli(&["PING"]), "PONG");
    assert_eq!(cli(&["SET", "greeting", "hello world"]), "OK");
    assert_eq!(cli(&["GET", "greeting"]), "hello world");
    assert_eq!(cli(&["INCRBY", "visits", "5"]), "5");
    assert_eq!(cli(&["MSET", "a", "1", "b", "2"]), "OK");
    assert_eq!(cli(&["MGET", "a", "b", "nosuch"]), "1\n2");
    assert_eq!(cli(&["EXISTS", "a", "b", "nosuch"]), "2");
    assert_eq!(cli(&["DEL", "a"]), "1");
    assert_eq!(cli(&["DBSIZE"]), "3");
    let mut scanned: Vec<String> = cli(&["--scan"]).lines().map(str::to_string).collect();
    scanned.sort();
    assert_eq!(scanned, ["b", "greeting", "visits"]);
    assert_eq!(cli(&["SET", "x", "1", "EX", "10"]), "OK");
    assert!(["9", "10"].contains(&cli(&["TTL", "x"]).as_str()));
    assert!(cli(&["NOSUCHCOMMAND"]).contains("unknown command"));
    assert!(cli(&["-3", "HELLO", "3"]).contains("proto"));
    assert!(cli(&["INFO", "stratus"]).contains("stratus_masters:2"));
    // Many commands through one connection, as redis-cli -n and piping do.
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port, "-n", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child.stdin.take().unwrap().write_all(b"SET k v\nGET k\nDBSIZE\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "OK\nv\n1\n");
    // A value over the cluster's limit from stdin: redis-cli sends all of it and must see the
    // error, not a connection closed under it (it would print nothing and die of SIGPIPE).
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port, "-x", "SET", "big"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    let mut input = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || input.write_all(&vec![b'v'; 2 << 20]));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().expect("redis-cli read all of its input");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("longer than the limit of 131072 bytes"),
        "redis-cli -x SET with 2 MiB: {output:?}"
    );
    assert_eq!(cli(&["EXISTS", "big"]), "0");
}

/// Every storage server speaks RESP itself (`stratus server --resp-listen`): through either
/// server's port, keys the server owns (served in its own process) and keys the other master
/// owns (forwarded) read back what was written through the other port.
#[test]
fn every_server_speaks_resp_for_every_key() {
    let cluster = TestCluster::start_with(
        2,
        1,
        &["--resp-listen", "127.0.0.1:0", "--resp-table-span", "2", "--probe-interval-ms", "0"],
    );
    let addresses: Vec<String> = cluster
        .servers
        .iter()
        .map(|server| {
            let line = server.wait_for_line("speaks RESP on", Duration::from_secs(30));
            line.split_whitespace().last().expect("address").to_string()
        })
        .collect();
    let mut first = Connection::open(&addresses[0]);
    let mut second = Connection::open(&addresses[1]);
    // Each port names the master in its own process.
    for (server, connection) in cluster.servers.iter().zip([&mut first, &mut second]) {
        let expected = format!("stratus_local_master:{}\r\n", server.address.as_ref().unwrap());
        match connection.call(&[b"INFO", b"stratus"]) {
            Value::BulkString(text) => {
                let text = String::from_utf8_lossy(&text);
                assert!(text.contains("stratus_front_end:server\r\n"), "{text}");
                assert!(text.contains(&expected), "{text}");
            }
            other => panic!("INFO: {other:?}"),
        }
    }
    let keys: Vec<String> = (0..200).map(|index| format!("key-{index}")).collect();
    for (index, key) in keys.iter().enumerate() {
        let value = format!("value-{index}");
        assert_eq!(first.call(&[b"SET", key.as_bytes(), value.as_bytes()]), ok());
    }
    for (index, key) in keys.iter().enumerate() {
        let value = format!("value-{index}");
        assert_eq!(second.call(&[b"GET", key.as_bytes()]), bulk(value.as_bytes()));
        assert_eq!(first.call(&[b"GET", key.as_bytes()]), bulk(value.as_bytes()));
    }
    // Both masters own keys of the table, so both ports served local and forwarded keys.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = cluster.client();
    let owners: std::collections::BTreeSet<String> = runtime.block_on(async {
        let table = client.get_table_id("redis-db-0").await.expect("table created by SET");
        let map = client.tablet_map(table).await.expect("tablet map");
        keys.iter()
            .map(|key| {
                let hash = stratus_types::key_hash(table, key.as_bytes());
                let tablet = map.iter().find(|tablet| tablet.range.contains(hash)).unwrap();
                tablet.owner_address.clone()
            })
            .collect()
    });
    assert_eq!(owners.len(), 2, "the keys live on both masters: {owners:?}");
    // Read-modify-write commands and multi-key commands across both masters, on both ports.
    assert_eq!(second.call(&[b"INCRBY", b"counter", b"5"]), Value::Integer(5));
    assert_eq!(first.call(&[b"INCR", b"counter"]), Value::Integer(6));
    assert_eq!(
        second.call(&[b"MGET", b"key-0", b"key-1", b"key-2", b"counter"]),
        Value::Array(vec![bulk(b"value-0"), bulk(b"value-1"), bulk(b"value-2"), bulk(b"6")])
    );
    let deleted: Vec<&[u8]> = keys.iter().map(|key| key.as_bytes()).collect();
    let mut command: Vec<&[u8]> = vec![b"DEL"];
    command.extend(deleted.iter().copied());
    assert_eq!(second.call(&command), Value::Integer(200));
    assert_eq!(first.call(&[b"DBSIZE"]), Value::Integer(1));
    assert_eq!(first.call(&[b"GET", b"key-7"]), Value::Null);
}

/// A redis-server of its own on a free port, stopped when dropped.
struct RedisServer {
    child: std::process::Child,
    address: String,
}

impl RedisServer {
    fn start() -> Option<RedisServer> {
        for _attempt in 0..5 {
            let address = free_address();
            let port = address.rsplit(':').next().unwrap().to_string();
            let child = Command::new("redis-server")
                .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .ok()?;
            let server = RedisServer { child, address };
            for _ in 0..100 {
                if TcpStream::connect(&server.address).is_ok() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        None
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Hash commands (and string commands meeting hashes) answer exactly what Redis answers: the
/// same commands go to a redis-server and to the gateway, and every reply must match.
#[test]
fn hashes_answer_what_redis_answers() {
    common::require_installed("redis-server");
    let redis = RedisServer::start().expect("redis-server starts");
    let setup = start();
    let mut stratus = Connection::open(&setup.address);
    let mut reference = Connection::open(&redis.address);
    let script: &[&[&[u8]]] = &[
        &[b"HSET", b"user:1", b"name", b"ada", b"age", b"36"],
        &[b"HSET", b"user:1", b"name", b"Ada", b"city", b"London"],
        &[b"HGET", b"user:1", b"name"],
        &[b"HGET", b"user:1", b"nosuch"],
        &[b"HGET", b"nosuch", b"name"],
        &[b"HMGET", b"user:1", b"age", b"nosuch", b"city"],
        &[b"HGETALL", b"user:1"],
        &[b"HGETALL", b"nosuch"],
        &[b"HKEYS", b"user:1"],
        &[b"HVALS", b"user:1"],
        &[b"HLEN", b"user:1"],
        &[b"HEXISTS", b"user:1", b"age"],
        &[b"HEXISTS", b"user:1", b"nosuch"],
        &[b"HSTRLEN", b"user:1", b"city"],
        &[b"HSTRLEN", b"user:1", b"nosuch"],
        &[b"HSETNX", b"user:1", b"name", b"Grace"],
        &[b"HSETNX", b"user:1", b"email", b"ada@example.org"],
        &[b"HMSET", b"user:1", b"age", b"37", b"lang", b"en"],
        &[b"HINCRBY", b"user:1", b"age", b"5"],
        &[b"HINCRBY", b"user:1", b"visits", b"-2"],
        &[b"HINCRBY", b"user:1", b"name", b"1"],
        &[b"HINCRBY", b"user:1", b"age", b"x"],
        &[b"HGETALL", b"user:1"],
        &[b"TYPE", b"user:1"],
        &[b"HDEL", b"user:1", b"nosuch"],
        &[b"HDEL", b"user:1", b"age", b"city", b"age"],
        &[b"HGETALL", b"user:1"],
        // Wrong types both ways.
        &[b"SET", b"plain", b"text"],
        &[b"HSET", b"plain", b"f", b"v"],
        &[b"HGET", b"plain", b"f"],
        &[b"HGETALL", b"plain"],
        &[b"GET", b"user:1"],
        &[b"STRLEN", b"user:1"],
        &[b"APPEND", b"user:1", b"x"],
        &[b"INCR", b"user:1"],
        &[b"SET", b"user:1", b"again", b"GET"],
        &[b"MGET", b"plain", b"user:1", b"nosuch"],
        &[b"EXISTS", b"user:1", b"plain", b"nosuch"],
        &[b"TYPE", b"plain"],
        &[b"TYPE", b"nosuch"],
        // Arity.
        &[b"HSET", b"user:1", b"odd"],
        &[b"HSET", b"user:1", b"a", b"1", b"b"],
        &[b"HGET", b"user:1"],
        // The last field deleted removes the key.
        &[b"HSET", b"short", b"only", b"1"],
        &[b"HDEL", b"short", b"only"],
        &[b"EXISTS", b"short"],
        &[b"TYPE", b"short"],
        &[b"HLEN", b"short"],
        // SET replaces a hash; DEL removes one.
        &[b"SET", b"user:1", b"now a string"],
        &[b"GET", b"user:1"],
        &[b"HSET", b"user:2", b"a", b"1"],
        &[b"DEL", b"user:2", b"plain"],
        &[b"HGETALL", b"user:2"],
    ];
    for command in script {
        let expected = reference.call(command);
        let got = stratus.call(command);
        let shown: Vec<String> =
            command.iter().map(|argument| String::from_utf8_lossy(argument).into_owned()).collect();
        assert_eq!(got, expected, "{shown:?}");
    }
    // SCAN TYPE tells hashes from strings.
    let writes: [&[&[u8]]; 3] =
        [&[b"HSET", b"h1", b"f", b"v"], &[b"HSET", b"h2", b"f", b"v"], &[b"SET", b"s1", b"v"]];
    for command in writes {
        assert_eq!(stratus.call(command), reference.call(command));
    }
    for kind in [&b"hash"[..], b"string", b"list"] {
        assert_eq!(
            scan_all(&mut stratus, kind),
            scan_all(&mut reference, kind),
            "SCAN TYPE {kind:?}"
        );
    }
    // RESP3: HGETALL is a map.
    stratus.call(&[b"HELLO", b"3"]);
    reference.call(&[b"HELLO", b"3"]);
    stratus.call(&[b"HSET", b"m", b"k", b"v"]);
    reference.call(&[b"HSET", b"m", b"k", b"v"]);
    assert_eq!(stratus.call(&[b"HGETALL", b"m"]), reference.call(&[b"HGETALL", b"m"]));
    // What only Stratus has: strings may not start with the hash marker.
    let marker: &[u8] = &stratus_resp::hash::HASH_MARKER;
    assert_error_starts(&stratus.call(&[b"SET", b"k", marker]), "ERR Stratus reserves strings");
    assert_error_starts(&stratus.call(&[b"MSET", b"k", marker]), "ERR Stratus reserves strings");
}

/// Every key SCAN returns with `TYPE kind`, sorted (the order of a scan is not specified).
fn scan_all(connection: &mut Connection, kind: &[u8]) -> Vec<Value> {
    let mut cursor = b"0".to_vec();
    let mut keys = Vec::new();
    loop {
        match connection.call(&[b"SCAN", &cursor, b"COUNT", b"1000", b"TYPE", kind]) {
            Value::Array(mut parts) if parts.len() == 2 => {
                let Value::Array(found) = parts.pop().unwrap() else { panic!("SCAN keys") };
                keys.extend(found);
                let Value::BulkString(next) = parts.pop().unwrap() else { panic!("SCAN cursor") };
                if &next[..] == b"0" {
                    break;
                }
                cursor = next.to_vec();
            }
            other => panic!("SCAN: {other:?}"),
        }
    }
    keys.sort_by_key(|key| format!("{key:?}"));
    keys
}

/// A value that starts with the hash marker but does not decode (a native client can write
/// one) is answered with an error; the connection and the server carry on, and the key can
/// still be removed.
#[test]
fn a_corrupt_stored_hash_is_an_error_reply() {
    let setup = start();
    let mut connection = Connection::open(&setup.address);
    assert_eq!(connection.call(&[b"SET", b"create", b"the table"]), ok());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = setup._cluster.client();
    let mut corrupt = stratus_resp::hash::HASH_MARKER.to_vec();
    corrupt.extend_from_slice(&5u32.to_le_bytes()); // five fields, and no bytes for them
    runtime.block_on(async {
        let table = client.get_table_id("redis-db-0").await.unwrap();
        client.write(table, b"bad", &corrupt).await.unwrap();
    });
    for command in
        [&[&b"HGET"[..], b"bad", b"f"][..], &[b"HGETALL", b"bad"], &[b"HSET", b"bad", b"f", b"v"]]
    {
        assert_error_starts(&connection.call(command), "ERR stored hash is corrupt");
    }
    assert_eq!(connection.call(&[b"TYPE", b"bad"]), Value::simple("hash"));
    assert_error_starts(&connection.call(&[b"GET", b"bad"]), "WRONGTYPE");
    assert_eq!(connection.call(&[b"DEL", b"bad"]), Value::Integer(1));
    assert_eq!(connection.call(&[b"PING"]), Value::simple("PONG"));
}

/// Expiry commands answer what Redis answers: the same script goes to a redis-server and to
/// the gateway, and every reply must match, except the times left, which are checked to be
/// within what the script set (they count down while it runs).
#[test]
fn expiry_answers_what_redis_answers() {
    common::require_installed("redis-server");
    let redis = RedisServer::start().expect("redis-server starts");
    let setup = start();
    let mut stratus = Connection::open(&setup.address);
    let mut reference = Connection::open(&redis.address);
    // Replies that are times left (TTL, PTTL) are compared as "within [low, high]".
    type TimeLeft = Option<(i64, i64)>;
    let script: &[(&[&[u8]], TimeLeft)] = &[
        (&[b"SET", b"k", b"v", b"EX", b"100"], None),
        (&[b"TTL", b"k"], Some((98, 100))),
        (&[b"PTTL", b"k"], Some((98_000, 100_000))),
        (&[b"SET", b"k", b"w", b"KEEPTTL"], None),
        (&[b"TTL", b"k"], Some((98, 100))),
        (&[b"GET", b"k"], None),
        (&[b"SET", b"k", b"x"], None),
        (&[b"TTL", b"k"], None),
        (&[b"TTL", b"missing"], None),
        (&[b"PTTL", b"missing"], None),
        (&[b"EXPIRE", b"missing", b"10"], None),
        (&[b"EXPIRE", b"k", b"1000", b"NX"], None),
        (&[b"EXPIRE", b"k", b"2000", b"NX"], None),
        (&[b"EXPIRE", b"k", b"500", b"GT"], None),
        (&[b"EXPIRE", b"k", b"3000", b"GT"], None),
        (&[b"TTL", b"k"], Some((2_990, 3_000))),
        (&[b"EXPIRE", b"k", b"600", b"XX", b"LT"], None),
        (&[b"TTL", b"k"], Some((590, 600))),
        (&[b"EXPIRE", b"k", b"1", b"NX", b"XX"], None),
        (&[b"EXPIRE", b"k", b"1", b"GT", b"LT"], None),
        (&[b"EXPIRE", b"k", b"1", b"SOON"], None),
        (&[b"PERSIST", b"k"], None),
        (&[b"PERSIST", b"k"], None),
        (&[b"TTL", b"k"], None),
        (&[b"EXPIRETIME", b"k"], None),
        (&[b"PERSIST", b"missing"], None),
        // Commands that rewrite a value keep its expiry; SET and GETSET clear it.
        (&[b"SET", b"n", b"1", b"PX", b"100000"], None),
        (&[b"INCR", b"n"], None),
        (&[b"APPEND", b"n", b"0"], None),
        (&[b"TTL", b"n"], Some((98, 100))),
        (&[b"GETSET", b"n", b"7"], None),
        (&[b"TTL", b"n"], None),
        (&[b"HSET", b"h", b"f", b"1"], None),
        (&[b"EXPIRE", b"h", b"100"], None),
        (&[b"HSET", b"h", b"g", b"2"], None),
        (&[b"TTL", b"h"], Some((98, 100))),
        (&[b"MSET", b"h2", b"x", b"n", b"8"], None),
        (&[b"TTL", b"n"], None),
        // SETEX, PSETEX, GETEX and their errors.
        (&[b"SETEX", b"s", b"100", b"v"], None),
        (&[b"TTL", b"s"], Some((98, 100))),
        (&[b"PSETEX", b"s", b"50000", b"v2"], None),
        (&[b"TTL", b"s"], Some((48, 50))),
        (&[b"SETEX", b"s", b"0", b"v"], None),
        (&[b"SETEX", b"s", b"x", b"v"], None),
        (&[b"SET", b"s", b"v", b"EX", b"0"], None),
        (&[b"SET", b"s", b"v", b"EX", b"10", b"PX", b"10"], None),
        (&[b"SET", b"s", b"v", b"KEEPTTL", b"EX", b"10"], None),
        (&[b"SET", b"s", b"v", b"EX"], None),
        (&[b"GETEX", b"s", b"EX", b"200"], None),
        (&[b"TTL", b"s"], Some((198, 200))),
        (&[b"GETEX", b"s", b"PERSIST"], None),
        (&[b"TTL", b"s"], None),
        (&[b"GETEX", b"s"], None),
        (&[b"GETEX", b"missing", b"EX", b"5"], None),
        (&[b"GETEX", b"s", b"EX", b"0"], None),
        (&[b"GETEX", b"s", b"BOGUS"], None),
        // A time already past expires the key at once.
        (&[b"SET", b"gone", b"v"], None),
        (&[b"EXPIRE", b"gone", b"-1"], None),
        (&[b"GET", b"gone"], None),
        (&[b"EXISTS", b"gone"], None),
        (&[b"TTL", b"gone"], None),
        (&[b"SET", b"gone", b"again", b"NX"], None),
        (&[b"SET", b"past", b"v", b"PXAT", b"1000"], None),
        (&[b"GET", b"past"], None),
        (&[b"EXPIREAT", b"k", b"1"], None),
        (&[b"EXISTS", b"k"], None),
    ];
    for (command, time_left) in script {
        let mine = stratus.call(command);
        let theirs = reference.call(command);
        let shown: Vec<String> =
            command.iter().map(|part| String::from_utf8_lossy(part).into_owned()).collect();
        match time_left {
            None => assert_eq!(mine, theirs, "{shown:?}"),
            Some((low, high)) => {
                for (who, reply) in [("stratus", &mine), ("redis", &theirs)] {
                    let Value::Integer(left) = reply else { panic!("{who} {shown:?}: {reply:?}") };
                    assert!(low <= left && left <= high, "{who} {shown:?}: {left}");
                }
            }
        }
    }
    // Expiry takes effect by itself: a key with a short time to live is gone once it passes.
    assert_eq!(stratus.call(&[b"SET", b"brief", b"v", b"PX", b"200"]), ok());
    assert_eq!(stratus.call(&[b"GET", b"brief"]), bulk(b"v"));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while stratus.call(&[b"EXISTS", b"brief"]) != Value::Integer(0) {
        assert!(std::time::Instant::now() < deadline, "brief never expired");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(stratus.call(&[b"GET", b"brief"]), Value::Null);
    assert_eq!(stratus.call(&[b"TTL", b"brief"]), Value::Integer(-2));
}

/// MULTI / EXEC / DISCARD / WATCH answer byte for byte what Redis answers: the same commands,
/// on two connections each (the second changes watched keys), go to a redis-server and to the
/// gateway.
#[test]
fn transactions_answer_what_redis_answers() {
    common::require_installed("redis-server");
    let redis = RedisServer::start().expect("redis-server starts");
    let setup = start();
    let mut stratus = [Connection::open(&setup.address), Connection::open(&setup.address)];
    let mut reference = [Connection::open(&redis.address), Connection::open(&redis.address)];
    let script: &[(usize, &[&[u8]])] = &[
        // Reads see the transaction's own writes.
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"k", b"1"]),
        (0, &[b"INCR", b"k"]),
        (0, &[b"GET", b"k"]),
        (0, &[b"EXEC"]),
        // Errors at exec time are the command's reply; the other commands apply.
        (0, &[b"SET", b"s", b"hello"]),
        (0, &[b"HSET", b"h", b"f", b"v"]),
        (0, &[b"MULTI"]),
        (0, &[b"INCR", b"s"]),
        (0, &[b"GET", b"h"]),
        (0, &[b"SET", b"t", b"1"]),
        (0, &[b"INCRBY", b"t", b"x"]),
        (0, &[b"APPEND", b"t", b"23"]),
        (0, &[b"STRLEN", b"t"]),
        (0, &[b"APPEND", b"h", b"x"]),
        (0, &[b"DEL", b"t", b"t", b"nosuch"]),
        (0, &[b"EXISTS", b"t", b"s", b"s"]),
        (0, &[b"MSET", b"a", b"1", b"b", b"2"]),
        (0, &[b"MSET", b"a", b"1", b"b"]),
        (0, &[b"MGET", b"a", b"b", b"h", b"nosuch"]),
        (0, &[b"SETNX", b"a", b"9"]),
        (0, &[b"SETNX", b"c", b"3"]),
        (0, &[b"GETSET", b"c", b"4"]),
        (0, &[b"SET", b"c", b"5", b"XX", b"GET"]),
        (0, &[b"SET", b"d", b"1", b"NX"]),
        (0, &[b"SET", b"d", b"2", b"NX"]),
        (0, &[b"SET", b"d", b"2", b"BOGUS"]),
        (0, &[b"SET", b"h", b"x", b"GET"]),
        (0, &[b"DECRBY", b"a", b"5"]),
        (0, &[b"DECR", b"fresh"]),
        (0, &[b"PING"]),
        (0, &[b"ECHO", b"hi"]),
        (0, &[b"EXEC"]),
        (0, &[b"MGET", b"a", b"b", b"c", b"d", b"t", b"fresh", b"s"]),
        // An error at queue time discards the transaction.
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"x", b"1"]),
        (0, &[b"GET"]),
        (0, &[b"NOSUCHCOMMAND", b"arg"]),
        (0, &[b"EXEC"]),
        (0, &[b"EXISTS", b"x"]),
        // DISCARD.
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"y", b"1"]),
        (0, &[b"DISCARD"]),
        (0, &[b"EXISTS", b"y"]),
        (0, &[b"DISCARD"]),
        (0, &[b"EXEC"]),
        // Nested MULTI and WATCH inside MULTI are refused, and do not discard.
        (0, &[b"MULTI"]),
        (0, &[b"MULTI"]),
        (0, &[b"WATCH", b"k"]),
        (0, &[b"SET", b"n", b"1"]),
        (0, &[b"EXEC"]),
        (0, &[b"GET", b"n"]),
        // A watched key changed by another connection: EXEC answers a null array and
        // applies nothing.
        (0, &[b"WATCH", b"w"]),
        (1, &[b"SET", b"w", b"theirs"]),
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"w", b"mine"]),
        (0, &[b"SET", b"other", b"x"]),
        (0, &[b"EXEC"]),
        (0, &[b"GET", b"w"]),
        (0, &[b"EXISTS", b"other"]),
        // EXEC cleared the watches.
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"w", b"mine"]),
        (0, &[b"EXEC"]),
        (0, &[b"GET", b"w"]),
        // Watched keys left alone (one absent): EXEC runs.
        (0, &[b"WATCH", b"w", b"absent"]),
        (1, &[b"GET", b"w"]),
        (0, &[b"MULTI"]),
        (0, &[b"INCR", b"absent"]),
        (0, &[b"EXEC"]),
        // A watched absent key created, and a watched key removed.
        (0, &[b"WATCH", b"z"]),
        (1, &[b"SET", b"z", b"1"]),
        (0, &[b"MULTI"]),
        (0, &[b"GET", b"z"]),
        (0, &[b"EXEC"]),
        (0, &[b"WATCH", b"z"]),
        (1, &[b"DEL", b"z"]),
        (0, &[b"MULTI"]),
        (0, &[b"SET", b"z", b"2"]),
        (0, &[b"EXEC"]),
        (0, &[b"EXISTS", b"z"]),
        // UNWATCH and DISCARD forget the watches.
        (0, &[b"WATCH", b"q"]),
        (1, &[b"SET", b"q", b"1"]),
        (0, &[b"UNWATCH"]),
        (0, &[b"MULTI"]),
        (0, &[b"INCR", b"q"]),
        (0, &[b"EXEC"]),
        (0, &[b"WATCH", b"q"]),
        (1, &[b"SET", b"q", b"7"]),
        (0, &[b"MULTI"]),
        (0, &[b"DISCARD"]),
        (0, &[b"MULTI"]),
        (0, &[b"GET", b"q"]),
        (0, &[b"EXEC"]),
        // An empty transaction.
        (0, &[b"MULTI"]),
        (0, &[b"EXEC"]),
    ];
    let compare = |stratus: &mut [Connection; 2], reference: &mut [Connection; 2]| {
        for (index, command) in script {
            let expected = reference[*index].call_raw(command);
            let got = stratus[*index].call_raw(command);
            let shown: Vec<String> = command
                .iter()
                .map(|argument| String::from_utf8_lossy(argument).into_owned())
                .collect();
            assert_eq!(
                got.escape_ascii().to_string(),
                expected.escape_ascii().to_string(),
                "{shown:?} on connection {index}"
            );
        }
    };
    compare(&mut stratus, &mut reference);
    // The same in RESP3 (the nulls are `_`), from a clean slate.
    for connection in stratus.iter_mut().chain(reference.iter_mut()) {
        connection.call(&[b"HELLO", b"3"]);
        connection.call(&[b"FLUSHALL"]);
    }
    compare(&mut stratus, &mut reference);
}

/// One EXEC writes keys on both masters all together, or (a watched key changed) none of them.
#[test]
fn exec_applies_keys_on_every_master_all_or_nothing() {
    let setup = start();
    let mut connection = Connection::open(&setup.address);
    let mut other = Connection::open(&setup.address);
    let keys: Vec<String> = (0..20).map(|index| format!("all-{index}")).collect();
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for key in &keys {
        mset.extend([key.as_bytes(), b"1"]);
    }
    let mut exists: Vec<&[u8]> = vec![b"EXISTS"];
    exists.extend(keys.iter().map(|key| key.as_bytes()));
    // Nothing: the watched key changed, so no key of the MSET is written.
    assert_eq!(connection.call(&[b"WATCH", b"guard"]), ok());
    assert_eq!(other.call(&[b"SET", b"guard", b"changed"]), ok());
    assert_eq!(connection.call(&[b"MULTI"]), ok());
    assert_eq!(connection.call(&mset), Value::simple("QUEUED"));
    assert_eq!(connection.call(&[b"INCR", b"total"]), Value::simple("QUEUED"));
    assert_eq!(connection.call_raw(&[b"EXEC"]), b"*-1\r\n");
    assert_eq!(connection.call(&exists), Value::Integer(0));
    assert_eq!(connection.call(&[b"GET", b"total"]), Value::Null);
    // All: the same, watched key untouched.
    assert_eq!(connection.call(&[b"WATCH", b"guard"]), ok());
    assert_eq!(connection.call(&[b"MULTI"]), ok());
    connection.call(&mset);
    connection.call(&[b"INCR", b"total"]);
    assert_eq!(connection.call(&[b"EXEC"]), Value::Array(vec![ok(), Value::Integer(1)]));
    assert_eq!(connection.call(&exists), Value::Integer(20));
}

/// Transactions racing on keys nobody watches never fail: the gateway runs a conflicting one
/// again, so every increment is applied once, as Redis, which runs one EXEC at a time, would.
#[test]
fn concurrent_execs_on_unwatched_keys_all_apply() {
    let setup = start();
    const EXECS_PER_CLIENT: i64 = 25;
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let address = setup.address.clone();
            std::thread::spawn(move || {
                let mut connection = Connection::open(&address);
                for _ in 0..EXECS_PER_CLIENT {
                    assert_eq!(connection.call(&[b"MULTI"]), ok());
                    connection.call(&[b"INCR", b"left"]);
                    connection.call(&[b"DECR", b"right"]);
                    match connection.call(&[b"EXEC"]) {
                        Value::Array(replies) => assert_eq!(replies.len(), 2),
                        other => panic!("EXEC: {other:?}"),
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.join().unwrap();
    }
    let mut connection = Connection::open(&setup.address);
    let total = 3 * EXECS_PER_CLIENT;
    assert_eq!(
        connection.call(&[b"MGET", b"left", b"right"]),
        Value::Array(vec![
            bulk(total.to_string().as_bytes()),
            bulk((-total).to_string().as_bytes())
        ])
    );
}
