//! Named users with real processes (docs/design/security.md, "Users"): the default user (the
//! client password) creates users; each user reads and writes only what its grants allow, on
//! every master; a table a user creates is usable at once on every master; users survive a
//! coordinator killed with SIGKILL; a deleted user's open client is refused; the CLI acts as a
//! user.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{stratus_binary, TestCluster};
use stratus_client::UserSettings;
use stratus_client::{Client, ClientConfig, Identity, Status, TableAccess, TableGrant};

const KEYS: usize = 64;

fn write_secret(path: &Path, secret: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("{secret}\n")).expect("write the secret");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

fn grant(pattern: &str, letters: &str) -> TableGrant {
    TableGrant {
        pattern: pattern.to_string(),
        access: TableAccess::parse_letters(letters).expect("letters"),
    }
}

fn settings(name: &str, password: &str, grants: Vec<TableGrant>) -> UserSettings {
    UserSettings {
        name: name.to_string(),
        password: Some(password.as_bytes().to_vec()),
        enabled: true,
        grants,
    }
}

fn client_as(cluster: &TestCluster, user: Option<(&str, &str)>, password: &str) -> Client {
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = Duration::from_secs(20);
    let config = match user {
        Some((name, password)) => config.with_user(name, password.as_bytes()).expect("valid"),
        None => config.with_password(password.as_bytes()).expect("long enough"),
    };
    Client::new(config)
}

fn cli(cluster: &TestCluster, arguments: &[&str]) -> (bool, String) {
    let output = Command::new(stratus_binary())
        .args(["--coordinator", cluster.coordinator_address.as_str()])
        .args(arguments)
        .env("STRATUS_LOG", "warn")
        .env_remove("STRATUS_PASSWORD_FILE")
        .env_remove("STRATUS_USER")
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

fn key(index: usize) -> Vec<u8> {
    format!("key-{index}").into_bytes()
}

#[test]
fn users_read_and_write_only_what_their_grants_allow_and_survive_a_coordinator_crash() {
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
    let mut cluster = TestCluster::start_with_coordinator(2, 1, &security, &security);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");

    // The default user sets up tables and users.
    let admin = client_as(&cluster, None, password);
    let orders = runtime.block_on(admin.create_table("orders", 2)).expect("create orders");
    let logs = runtime.block_on(admin.create_table("logs", 2)).expect("create logs");
    for index in 0..KEYS {
        runtime.block_on(admin.write(logs, &key(index), b"log")).expect("write logs");
    }
    let alice_grants = vec![grant("orders", "rw"), grant("log*", "r")];
    let created = runtime
        .block_on(admin.set_user(settings("alice", "alice's password", alice_grants.clone())))
        .expect("set alice");
    assert!(created);
    runtime
        .block_on(admin.set_user(settings("bob", "bob's password!", vec![grant("bob-*", "rwa")])))
        .expect("set bob");

    // Alice, on both masters.
    let alice = client_as(&cluster, Some(("alice", "alice's password")), "");
    for index in 0..KEYS {
        runtime.block_on(alice.write(orders, &key(index), b"order")).expect("alice writes");
        let read = runtime.block_on(alice.read(logs, &key(index))).expect("alice reads logs");
        assert_eq!(&read.0[..], b"log");
    }
    let denied = |result: stratus_client::Result<_>, what: &str| {
        let error = result.err().unwrap_or_else(|| panic!("{what} was allowed"));
        assert_eq!(error.status, Status::PermissionDenied, "{what}: {error}");
    };
    denied(runtime.block_on(alice.write(logs, b"k", b"v")).map(|_| ()), "alice writing logs");
    denied(runtime.block_on(alice.create_table("alice", 1)).map(|_| ()), "alice creating");
    denied(runtime.block_on(alice.drop_table("orders")), "alice dropping orders");
    denied(runtime.block_on(alice.list_users()).map(|_| ()), "alice listing users");
    let identity = runtime.block_on(alice.who_am_i()).expect("who am i");
    assert_eq!(identity, Identity::User { name: "alice".into(), grants: alice_grants });

    // Bob creates tables and uses them at once, on every master: each master learns of a new
    // table from the coordinator's directory (or waits briefly for it).
    let bob = client_as(&cluster, Some(("bob", "bob's password!")), "");
    for round in 0..3 {
        let table = runtime.block_on(bob.create_table(&format!("bob-{round}"), 2)).expect("bob");
        for index in 0..16 {
            runtime.block_on(bob.write(table, &key(index), b"bob")).expect("bob writes at once");
        }
    }
    denied(runtime.block_on(bob.read(orders, &key(0))).map(|_| ()), "bob reading orders");

    // Users are in the coordinator's MetaStore: a coordinator killed and started again knows
    // them, and so do the servers (their directory comes from it).
    cluster.restart_coordinator_after_sigkill();
    let users = runtime.block_on(admin.list_users()).expect("list users after the restart");
    let names: Vec<&str> = users.iter().map(|user| user.name.as_str()).collect();
    assert_eq!(names, ["alice", "bob"]);
    assert!(users.iter().all(|user| user.has_password && user.enabled));
    let alice_again = client_as(&cluster, Some(("alice", "alice's password")), "");
    let read = runtime.block_on(alice_again.read(orders, &key(3))).expect("alice after restart");
    assert_eq!(&read.0[..], b"order");

    // A narrower grant applies to alice's open client; a deleted alice is refused outright.
    runtime
        .block_on(admin.set_user(UserSettings {
            name: "alice".into(),
            password: None,
            enabled: true,
            grants: vec![grant("orders", "r")],
        }))
        .expect("narrow alice");
    let narrowed = (0..100).find_map(|_| {
        let result = runtime.block_on(alice.write(orders, b"narrow", b"v"));
        match result {
            Err(error) if error.status == Status::PermissionDenied => Some(()),
            _ => {
                std::thread::sleep(Duration::from_millis(50));
                None
            }
        }
    });
    assert!(narrowed.is_some(), "the narrower grant never applied");
    assert!(runtime.block_on(alice.read(orders, &key(1))).is_ok(), "reads still allowed");
    assert!(runtime.block_on(admin.delete_user("alice")).expect("delete"));
    let refused = (0..100).find_map(|_| match runtime.block_on(alice.read(orders, &key(1))) {
        Err(error) if error.status == Status::PermissionDenied => Some(error),
        _ => {
            std::thread::sleep(Duration::from_millis(50));
            None
        }
    });
    let refused = refused.expect("the deleted user was never refused");
    assert!(refused.to_string().contains("no longer exists"), "{refused}");

    // The CLI acts as a user, and manages users with the client password.
    let bob_password = files.path().join("bob-password");
    write_secret(&bob_password, "bob's password!");
    let bob_file = bob_password.display().to_string();
    let (ok, output) = cli(&cluster, &["--user", "bob", "--password-file", &bob_file, "whoami"]);
    assert!(ok, "{output}");
    assert!(output.contains("bob: bob-*=rwa"), "{output}");
    let (ok, output) =
        cli(&cluster, &["--user", "bob", "--password-file", &bob_file, "get", "orders", "key-1"]);
    assert!(!ok && output.contains("permission denied"), "{output}");
    let (ok, output) = cli(&cluster, &["--password-file", &password_path, "user", "list"]);
    assert!(ok && output.contains("bob") && !output.contains("alice"), "{output}");
    let wrong = files.path().join("wrong-password");
    write_secret(&wrong, "not bob's password");
    let wrong = wrong.display().to_string();
    let (ok, output) = cli(&cluster, &["--user", "bob", "--password-file", &wrong, "whoami"]);
    assert!(!ok && output.contains("does not accept user \"bob\""), "{output}");

    // `user set` changes only what it is given: a password reset of a disabled user keeps it
    // disabled and keeps its grants.
    let admin_cli = ["--password-file", password_path.as_str(), "user", "set", "bob"];
    let (ok, output) = cli(&cluster, &[&admin_cli[..], &["--disabled"]].concat());
    assert!(ok, "{output}");
    let (ok, output) = cli(&cluster, &[&admin_cli[..], &["--new-password-file", &wrong]].concat());
    assert!(ok, "{output}");
    let bob =
        runtime.block_on(admin.list_users()).expect("list").into_iter().find(|u| u.name == "bob");
    let bob = bob.expect("bob exists");
    assert!(!bob.enabled, "a password reset re-enabled bob");
    assert_eq!(bob.grants, vec![grant("bob-*", "rwa")]);
    let (ok, output) = cli(&cluster, &["--user", "bob", "--password-file", &wrong, "whoami"]);
    assert!(!ok, "a disabled user authenticated: {output}");
}
