//! Named users on the RESP front end, with real processes (docs/design/resp-acl.md): a cluster
//! with a cluster secret and a client password, a server's RESP front end and a `stratus
//! resp` gateway; AUTH as a named user, the cluster applying its grants (NOPERM), a wrong
//! password (WRONGPASS), ACL SETUSER / WHOAMI / USERS / LIST / DELUSER for the default user
//! and refused for a user without admin, a deleted user's open connection refused.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use common::{Process, TestCluster};

const PASSWORD: &str = "the-client-password-of-this-test";

fn write_secret(path: &Path, secret: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{secret}\n")).expect("write the secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// A RESP reply (RESP3 maps and sets are read as arrays of their elements).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(String),
    Null,
    Array(Vec<Reply>),
}

impl Reply {
    fn error(&self) -> &str {
        match self {
            Reply::Error(text) => text,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    fn strings(&self) -> Vec<String> {
        match self {
            Reply::Array(items) => items
                .iter()
                .map(|item| match item {
                    Reply::Bulk(text) | Reply::Simple(text) => text.clone(),
                    other => panic!("expected strings, got {other:?}"),
                })
                .collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }
}

/// One client connection speaking raw RESP.
struct Connection {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Connection {
    fn open(address: &str) -> Connection {
        let stream = TcpStream::connect(address).expect("connect to RESP");
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Connection { writer: stream, reader }
    }

    fn call(&mut self, arguments: &[&str]) -> Reply {
        let mut request = format!("*{}\r\n", arguments.len());
        for argument in arguments {
            request.push_str(&format!("${}\r\n{argument}\r\n", argument.len()));
        }
        self.writer.write_all(request.as_bytes()).expect("send");
        self.read()
    }

    fn read(&mut self) -> Reply {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("reply");
        let line = line.trim_end_matches("\r\n");
        assert!(!line.is_empty(), "the connection closed");
        let (kind, rest) = line.split_at(1);
        let count = || rest.parse::<i64>().expect("a length");
        match kind {
            "+" => Reply::Simple(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Integer(count()),
            "_" => Reply::Null,
            "$" if count() < 0 => Reply::Null,
            "$" => {
                let mut bytes = vec![0u8; count() as usize + 2];
                std::io::Read::read_exact(&mut self.reader, &mut bytes).expect("bulk");
                bytes.truncate(bytes.len() - 2);
                Reply::Bulk(String::from_utf8(bytes).expect("UTF-8"))
            }
            "*" | "~" if count() < 0 => Reply::Null,
            "*" | "~" => Reply::Array((0..count()).map(|_| self.read()).collect()),
            "%" => Reply::Array((0..2 * count()).map(|_| self.read()).collect()),
            other => panic!("unexpected reply type {other:?} in {line:?}"),
        }
    }
}

fn ok() -> Reply {
    Reply::Simple("OK".to_string())
}

fn bulk(text: &str) -> Reply {
    Reply::Bulk(text.to_string())
}

#[test]
fn named_users_authenticate_over_resp_and_the_cluster_applies_their_grants() {
    let files = tempfile::tempdir().expect("temporary directory");
    let secret = files.path().join("cluster-secret");
    write_secret(&secret, "0123456789abcdef0123456789abcdef");
    let password_file = files.path().join("client-password");
    write_secret(&password_file, PASSWORD);
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
    let cluster = TestCluster::start_with_coordinator(1, 0, &server_flags, &security);
    let line = cluster.servers[0].wait_for_line("speaks RESP on", Duration::from_secs(30));
    let address = line.split_whitespace().last().expect("an address").to_string();

    // The default user (the client password) creates two databases' tables and two users.
    let mut admin = Connection::open(&address);
    assert_eq!(admin.call(&["AUTH", "default", PASSWORD]), ok());
    assert_eq!(admin.call(&["ACL", "WHOAMI"]), bulk("default"));
    assert_eq!(admin.call(&["SET", "shared", "1"]), ok());
    assert_eq!(admin.call(&["SELECT", "1"]), ok());
    assert_eq!(admin.call(&["SET", "report", "draft"]), ok());
    let alice = ["ACL", "SETUSER", "alice", "on", ">alice-password-1", "%RW~redis-db-0"];
    assert_eq!(admin.call(&alice), ok());
    // SETUSER changes the current settings: a second call adds a grant and keeps the rest.
    assert_eq!(admin.call(&["ACL", "SETUSER", "alice", "%R~redis-db-1", "+@all", "&*"]), ok());
    let bob = ["ACL", "SETUSER", "bob", "on", ">bob-password-1", "%R~redis-db-0"];
    assert_eq!(admin.call(&bob), ok());
    assert_eq!(admin.call(&["ACL", "USERS"]).strings(), ["alice", "bob", "default"]);
    let list = admin.call(&["ACL", "LIST"]).strings();
    assert!(
        list.contains(&"user alice on %RW~redis-db-0 %R~redis-db-1 &* +@all".to_string()),
        "{list:?}"
    );
    assert!(list.iter().any(|line| line.starts_with("user default on")), "{list:?}");
    assert!(!list.iter().any(|line| line.contains("password")), "password material: {list:?}");
    let refused = admin.call(&["ACL", "SETUSER", "alice", "nopass"]);
    assert!(refused.error().contains("modifier 'nopass'"), "{refused:?}");
    let refused = admin.call(&["ACL", "SETUSER", "default", "off"]);
    assert!(refused.error().contains("default user cannot be changed"), "{refused:?}");

    // A wrong password, then alice's own: her grants apply.
    let mut session = Connection::open(&address);
    assert!(session.call(&["GET", "shared"]).error().starts_with("NOAUTH"));
    let wrong = session.call(&["AUTH", "alice", "not-her-password"]);
    assert_eq!(wrong.error(), "WRONGPASS invalid username-password pair or user is disabled.");
    let wrong = session.call(&["AUTH", "mallory", "not-her-password"]);
    assert!(wrong.error().starts_with("WRONGPASS"), "{wrong:?}");
    assert_eq!(session.call(&["AUTH", "alice", "alice-password-1"]), ok());
    assert_eq!(session.call(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(session.call(&["GET", "shared"]), bulk("1"));
    assert_eq!(session.call(&["SET", "mine", "2"]), ok());
    assert_eq!(session.call(&["INCR", "mine"]), Reply::Integer(3));
    assert_eq!(session.call(&["SELECT", "1"]), ok());
    assert_eq!(session.call(&["GET", "report"]), bulk("draft"));
    let denied = session.call(&["SET", "report", "final"]);
    assert!(denied.error().starts_with("NOPERM "), "{denied:?}");
    assert!(
        denied.error().contains("redis-db-1") && denied.error().contains("alice"),
        "{denied:?}"
    );
    // A database whose table does not exist: creating it needs admin.
    assert_eq!(session.call(&["SELECT", "5"]), ok());
    assert!(session.call(&["GET", "anything"]).error().starts_with("NOPERM "));
    // User management needs a cluster administrator.
    for command in [
        vec!["ACL", "LIST"],
        vec!["ACL", "USERS"],
        vec!["ACL", "SETUSER", "carol", "on"],
        vec!["ACL", "DELUSER", "bob"],
    ] {
        let denied = session.call(&command);
        assert!(denied.error().starts_with("NOPERM "), "{command:?}: {denied:?}");
    }

    // A second connection of alice (the cached client), and HELLO 3 AUTH for bob.
    let mut again = Connection::open(&address);
    assert_eq!(again.call(&["AUTH", "alice", "alice-password-1"]), ok());
    assert_eq!(again.call(&["GET", "mine"]), bulk("3"));
    let mut bobs = Connection::open(&address);
    let hello = bobs.call(&["HELLO", "3", "AUTH", "bob", "bob-password-1"]);
    assert!(matches!(hello, Reply::Array(_)), "{hello:?}");
    assert_eq!(bobs.call(&["GET", "shared"]), bulk("1"));
    assert!(bobs.call(&["SET", "shared", "2"]).error().starts_with("NOPERM "));

    // A changed password: the old one no longer authenticates, even though a client made with
    // it is cached.
    assert_eq!(admin.call(&["ACL", "SETUSER", "alice", ">alice-password-2"]), ok());
    let mut late = Connection::open(&address);
    assert!(late.call(&["AUTH", "alice", "alice-password-1"]).error().starts_with("WRONGPASS"));
    assert_eq!(late.call(&["AUTH", "alice", "alice-password-2"]), ok());
    assert_eq!(late.call(&["GET", "shared"]), bulk("1"));

    // DELUSER: default cannot go; bob goes, and his open connection is refused from its next
    // command on.
    let refused = admin.call(&["ACL", "DELUSER", "bob", "default"]);
    assert!(refused.error().contains("'default' user cannot be removed"), "{refused:?}");
    assert_eq!(admin.call(&["ACL", "DELUSER", "bob", "nobody"]), Reply::Integer(1));
    let denied = bobs.call(&["GET", "shared"]);
    assert!(denied.error().starts_with("NOPERM "), "{denied:?}");
    let mut gone = Connection::open(&address);
    assert!(gone.call(&["AUTH", "bob", "bob-password-1"]).error().starts_with("WRONGPASS"));

    // The `stratus resp` gateway process serves named users the same way.
    let gateway = Process::start(
        &[
            "--coordinator",
            cluster.coordinator_address.as_str(),
            "--password-file",
            password_path.as_str(),
            "resp",
            "--listen",
            "127.0.0.1:0",
        ]
        .map(str::to_string),
    );
    let line = gateway.wait_for_line("listening on", Duration::from_secs(30));
    let gateway_address = line.split_whitespace().last().expect("an address").to_string();
    let mut through = Connection::open(&gateway_address);
    assert!(through.call(&["AUTH", "alice", "alice-password-1"]).error().starts_with("WRONGPASS"));
    assert_eq!(through.call(&["AUTH", "alice", "alice-password-2"]), ok());
    assert_eq!(through.call(&["ACL", "WHOAMI"]), bulk("alice"));
    assert_eq!(through.call(&["GET", "mine"]), bulk("3"));
    assert_eq!(through.call(&["SELECT", "1"]), ok());
    assert!(through.call(&["DEL", "report"]).error().starts_with("NOPERM "));
}
