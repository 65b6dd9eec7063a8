//! Cluster membership with real processes (docs/design/security.md): a coordinator and servers
//! started with one cluster secret serve clients as before; a server with another secret, or
//! none, cannot join; and hand-built server-to-server requests from a process without the
//! secret (fence a master, drop its tablet, recover, read a replica, enlist) are refused while
//! the cluster keeps every object and goes on taking writes.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{server_arguments, stratus_binary, TestCluster};
use stratus_env::Environment;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::{HashRange, SegmentId, ServerId};
use stratus_wire::{Request, ServiceMask, Status};

const KEYS: usize = 200;

fn write_secret(path: &Path, secret: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{secret}\n")).expect("write the secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Runs a `stratus server` that should fail to join, and returns its exit status and everything
/// it wrote.
fn run_rogue_server(
    cluster: &TestCluster,
    name: &str,
    extra: &[&str],
) -> (std::process::ExitStatus, String) {
    let directory = cluster.directory.path().join(name);
    let mut arguments = server_arguments(&cluster.coordinator_address, 0, &directory);
    arguments.extend(["--enlist-timeout-seconds".to_string(), "2".to_string()]);
    arguments.extend(extra.iter().map(|argument| argument.to_string()));
    run_to_exit(&arguments, &cluster.directory.path().join(format!("{name}.out")))
}

/// Runs `stratus ARGUMENTS` (expected to end by itself) and returns its exit status and
/// everything it wrote (kept in `output_path`); kills it if it has not ended within 60 s.
fn run_to_exit(arguments: &[String], output_path: &Path) -> (std::process::ExitStatus, String) {
    let output = std::fs::File::create(output_path).expect("output file");
    let mut child = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_LOG", "warn")
        .env_remove("STRATUS_CLUSTER_SECRET_FILE")
        .env_remove("STRATUS_METRICS_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(output.try_clone().expect("output"))
        .stderr(output)
        .spawn()
        .expect("start stratus");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`stratus {arguments:?}` did not end in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, std::fs::read_to_string(output_path).unwrap_or_default())
}

/// `GET path` on `address` with `authorization` (a whole header line, or empty); returns the
/// status code and the body.
fn http_get(address: &str, path: &str, authorization: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect to metrics");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let request =
        format!("GET {path} HTTP/1.1\r\nhost: x\r\n{authorization}connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body).to_string();
    (status, body)
}

#[test]
fn a_secure_coordinator_serves_metrics_beyond_loopback_only_with_a_token() {
    let directory = tempfile::tempdir().expect("temporary directory");
    let secret = directory.path().join("cluster-secret");
    write_secret(&secret, "0123456789abcdef0123456789abcdef");
    let base = |name: &str| -> Vec<String> {
        [
            "coordinator",
            "--listen",
            "127.0.0.1:0",
            "--dir",
            &directory.path().join(name).display().to_string(),
            "--cluster-secret-file",
            &secret.display().to_string(),
            "--metrics-listen",
            "0.0.0.0:0",
        ]
        .iter()
        .map(|argument| argument.to_string())
        .collect()
    };
    let (status, output) = run_to_exit(&base("refused"), &directory.path().join("refused.out"));
    assert!(!status.success(), "{output}");
    assert!(output.contains("--metrics-token-file"), "{output}");

    let token_file = directory.path().join("metrics-token");
    let token = "metrics-token-fedcba9876543210";
    write_secret(&token_file, token);
    let mut arguments = base("served");
    arguments.extend(["--metrics-token-file".to_string(), token_file.display().to_string()]);
    let coordinator = common::Process::start(&arguments);
    let line = coordinator.wait_for_line("metrics served at http://", Duration::from_secs(30));
    let port = line.rsplit(':').next().and_then(|tail| tail.split('/').next()).expect("a port");
    let address = format!("127.0.0.1:{port}");
    for path in ["/metrics", "/", "/api/cluster"] {
        let (status, body) = http_get(&address, path, "");
        assert_eq!(status, 401, "{path}: {body}");
        let (status, _) = http_get(&address, path, "authorization: Bearer wrong-token-000000\r\n");
        assert_eq!(status, 401, "{path} with a wrong token");
    }
    let bearer = format!("authorization: Bearer {token}\r\n");
    let (status, body) = http_get(&address, "/metrics", &bearer);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("stratus_membership_handshakes_refused_total 0"), "{body}");
    assert!(!body.contains(token) && !body.contains("0123456789abcdef"), "a secret in metrics");
    let (status, _) = http_get(&address, "/", &bearer);
    assert_eq!(status, 200);
}

#[test]
fn only_processes_holding_the_cluster_secret_join_replicate_fence_or_recover() {
    let secrets = tempfile::tempdir().expect("temporary directory");
    let secret_file = secrets.path().join("cluster-secret");
    write_secret(&secret_file, "0123456789abcdef0123456789abcdef");
    let secret_path = secret_file.display().to_string();
    let membership = ["--cluster-secret-file", secret_path.as_str()];
    let cluster = TestCluster::start_with_coordinator(3, 2, &membership, &membership);

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let client = cluster.client();
    // Clients hold no secret: every client operation works as before.
    let table = runtime.block_on(client.create_table("accounts", 3)).expect("create table");
    runtime.block_on(async {
        for index in 0..KEYS {
            let key = format!("key-{index}");
            client.write(table, key.as_bytes(), key.as_bytes()).await.expect("write");
        }
    });

    // A server with another secret cannot even connect to the coordinator.
    let wrong_file = secrets.path().join("wrong-secret");
    write_secret(&wrong_file, "not the secret of this cluster at all");
    let wrong = wrong_file.display().to_string();
    let (status, output) = run_rogue_server(
        &cluster,
        "rogue-wrong-secret",
        &["--cluster-secret-file", wrong.as_str()],
    );
    assert!(!status.success(), "{output}");
    assert!(output.contains("does not hold this cluster secret"), "{output}");
    // One without a secret connects as a client and is refused enlistment.
    let (status, output) = run_rogue_server(&cluster, "rogue-no-secret", &[]);
    assert!(!status.success(), "{output}");
    assert!(output.contains("permission denied"), "{output}");

    // Hand-built server-to-server requests from a process without the secret.
    let servers = runtime.block_on(client.server_list()).expect("server list");
    assert_eq!(servers.len(), 3, "no rogue joined: {servers:?}");
    let pool = ChannelPool::new(Environment::system().network, RpcConfig::default());
    let mut refused = 0;
    runtime.block_on(async {
        let enlist = Request::EnlistServer {
            address: "127.0.0.1:1".to_string(),
            services: ServiceMask(ServiceMask::MASTER | ServiceMask::BACKUP),
            previous_server_id: ServerId(0),
            failure_domain: String::new(),
        };
        let (status, _) =
            pool.call(&cluster.coordinator_address, &enlist).await.expect("an answer");
        assert_eq!(status, Status::PermissionDenied);
        refused += 1;
        for target in &servers {
            for victim in &servers {
                let master_id = victim.server_id;
                let requests = [
                    Request::BackupFenceMaster { master_id },
                    Request::BackupReadReplica { master_id, segment_id: SegmentId(1) },
                    Request::DropTabletOwnership {
                        master_id,
                        table_id: table,
                        range: HashRange::FULL,
                        assignment_epoch: u64::MAX,
                    },
                    Request::RecoverTablets {
                        master_id,
                        crashed_master: ServerId(u64::MAX),
                        tablets: Vec::new(),
                        backups: Vec::new(),
                        segments: Vec::new(),
                        assignment_epoch: u64::MAX,
                    },
                ];
                for request in requests {
                    let (status, _) =
                        pool.call(&target.address, &request).await.expect("an answer");
                    assert_eq!(status, Status::PermissionDenied, "{request:?}");
                    refused += 1;
                }
            }
        }
    });
    assert_eq!(refused, 1 + 3 * 3 * 4);

    // Nothing happened: every object is there, every master still takes writes.
    runtime.block_on(async {
        for index in 0..KEYS {
            let key = format!("key-{index}");
            let (value, _) = client.read(table, key.as_bytes()).await.expect("read");
            assert_eq!(value.as_ref(), key.as_bytes());
            client.write(table, key.as_bytes(), b"after").await.expect("write after");
        }
    });
    let servers_after = runtime.block_on(client.server_list()).expect("server list");
    assert_eq!(servers_after, servers, "no server was fenced, stopped or added");
}

/// Sends one RESP command over `stream` and returns the first line of the reply.
fn resp_line(stream: &mut std::net::TcpStream, arguments: &[&str]) -> String {
    use std::io::{BufRead, Write};
    let mut request = format!("*{}\r\n", arguments.len());
    for argument in arguments {
        request.push_str(&format!("${}\r\n{argument}\r\n", argument.len()));
    }
    stream.write_all(request.as_bytes()).expect("send");
    let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    reader.read_line(&mut line).expect("reply");
    line.trim_end().to_string()
}

#[test]
fn with_a_client_password_only_clients_that_give_it_read_or_write() {
    let files = tempfile::tempdir().expect("temporary directory");
    let secret = files.path().join("cluster-secret");
    write_secret(&secret, "0123456789abcdef0123456789abcdef");
    let password_file = files.path().join("client-password");
    let password = "the-client-password-of-this-test";
    write_secret(&password_file, password);
    let (secret, password_path) =
        (secret.display().to_string(), password_file.display().to_string());
    let security = [
        "--cluster-secret-file",
        secret.as_str(),
        "--client-password-file",
        password_path.as_str(),
    ];
    let mut server_flags = security.to_vec();
    server_flags.extend(["--resp-listen", "127.0.0.1:0"]);
    let cluster = TestCluster::start_with_coordinator(3, 2, &server_flags, &security);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    // Without the password: refused, saying why.
    let error = runtime.block_on(cluster.client().create_table("t", 3)).expect_err("refused");
    assert!(error.to_string().contains("needs the client password"), "{error}");

    // With it: everything works, through the library and the CLI.
    let mut config = stratus_client::ClientConfig::new(cluster.coordinator_address.clone())
        .with_password(password.as_bytes())
        .expect("a long enough password");
    config.operation_timeout = Duration::from_secs(20);
    let client = stratus_client::Client::new(config);
    let table = runtime.block_on(client.create_table("t", 3)).expect("create");
    runtime.block_on(client.write(table, b"k", b"v")).expect("write");
    let cli = |extra: &[&str], name: &str| {
        let mut arguments = vec!["--coordinator".to_string(), cluster.coordinator_address.clone()];
        arguments.extend(extra.iter().map(|argument| argument.to_string()));
        arguments.extend(["get", "t", "k"].map(str::to_string));
        run_to_exit(&arguments, &cluster.directory.path().join(name))
    };
    let (status, output) = cli(&["--password-file", password_path.as_str()], "cli-ok.out");
    assert!(status.success(), "{output}");
    assert_eq!(output.trim(), "v");
    let (status, output) = cli(&[], "cli-refused.out");
    assert!(!status.success(), "{output}");
    assert!(output.contains("--password-file"), "{output}");

    // The RESP front end asks for it, as Redis with requirepass does.
    let line = cluster.servers[0].wait_for_line("speaks RESP on", Duration::from_secs(30));
    let address = line.split_whitespace().last().expect("an address").to_string();
    let mut stream = std::net::TcpStream::connect(&address).expect("connect to RESP");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    assert_eq!(resp_line(&mut stream, &["SET", "a", "1"]), "-NOAUTH Authentication required.");
    assert!(resp_line(&mut stream, &["AUTH", "guess"]).starts_with("-WRONGPASS"));
    assert_eq!(resp_line(&mut stream, &["AUTH", password]), "+OK");
    assert_eq!(resp_line(&mut stream, &["SET", "a", "1"]), "+OK");
    assert_eq!(resp_line(&mut stream, &["INCR", "a"]), ":2");
}
