//! Storage tiers with real processes: a table created on flash through the command line is
//! listed with its tier (`stratus table list`, `stratus status`), keeps it through a restart of
//! the coordinator (the table record) and through a crash of the master serving it (the
//! recovery masters are told it with their partitions and TAKEs, which their metrics show).

mod common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{metrics_address, scrape, stratus_binary, TestCluster};
use stratus_client::{Client, ClientConfig, Status, TableId, Tier};
use stratus_env::TcpNetwork;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::TabletState;
use stratus_wire::Request;

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(60);

/// `stratus ARGUMENTS` against `coordinator`: whether it succeeded, and its output.
fn stratus(coordinator: &str, arguments: &[&str]) -> (bool, String, String) {
    let output = Command::new(stratus_binary())
        .args(arguments)
        .env("STRATUS_COORDINATOR", coordinator)
        .stdin(Stdio::null())
        .output()
        .expect("run stratus");
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

/// How many tables the master whose metrics are at `address` serves in `tier`.
fn tables_served_in(address: &str, tier: Tier) -> f64 {
    let scrape = scrape(address);
    scrape
        .value("stratus_master_tables", &[("tier", tier.name())])
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The line of `stratus table list` for `name`.
fn listed(coordinator: &str, name: &str) -> String {
    let (success, stdout, stderr) = stratus(coordinator, &["table", "list"]);
    assert!(success, "{stderr}");
    let prefix = format!("{name}\t");
    stdout.lines().find(|line| line.starts_with(&prefix)).unwrap_or_default().to_string()
}

/// Waits (bounded) until every tablet of `table` is served by a master other than `gone`;
/// returns the owners' addresses.
async fn owners_without(client: &Client, table: TableId, gone: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.expect("the tablet map");
        let served = map
            .iter()
            .all(|tablet| tablet.owner_address != gone && tablet.state == TabletState::Normal);
        if served {
            let mut owners: Vec<String> =
                map.into_iter().map(|tablet| tablet.owner_address).collect();
            owners.sort();
            owners.dedup();
            return owners;
        }
        assert!(Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flash_table_keeps_its_tier_through_a_coordinator_restart_and_its_master_s_crash() {
    let mut cluster = TestCluster::start_with(3, 1, &["--metrics-listen", "127.0.0.1:0"]);
    let metrics: HashMap<String, String> = cluster
        .servers
        .iter()
        .map(|server| {
            (server.address.clone().expect("an address"), metrics_address(server, PATIENCE))
        })
        .collect();
    let coordinator = cluster.coordinator_address.clone();

    // Created through the command line: flash when asked, memory by default.
    let (success, _, stderr) =
        stratus(&coordinator, &["table", "create", "archive", "--tier", "flash"]);
    assert!(success, "{stderr}");
    let (success, _, stderr) = stratus(&coordinator, &["table", "create", "plain", "--span", "3"]);
    assert!(success, "{stderr}");
    let (success, _, stderr) = stratus(&coordinator, &["table", "create", "hot", "--tier", "auto"]);
    assert!(success, "{stderr}");
    let (success, _, stderr) = stratus(&coordinator, &["table", "create", "x", "--tier", "disk"]);
    assert!(!success && stderr.contains("\"disk\" is not a tier"), "{stderr}");
    assert!(stderr.contains("memory, flash, auto"), "{stderr}");
    assert!(listed(&coordinator, "hot").ends_with("\ttier=auto"));
    assert!(listed(&coordinator, "archive").ends_with("\ttier=flash"));
    assert!(listed(&coordinator, "plain").ends_with("\ttier=memory"));
    let (success, status, stderr) = stratus(&coordinator, &["status", "--json"]);
    assert!(success, "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&status).expect("JSON");
    let tiers: HashMap<&str, &str> = status["tables"]
        .as_array()
        .expect("tables")
        .iter()
        .map(|table| (table["name"].as_str().unwrap(), table["tier"].as_str().unwrap()))
        .collect();
    assert_eq!(tiers, HashMap::from([("archive", "flash"), ("plain", "memory"), ("hot", "auto")]));
    // The text: a TIER column beside each table's id.
    let (success, status, _) = stratus(&coordinator, &["status"]);
    assert!(success && status.contains("TIER"), "{status}");
    let words = |line: &str| line.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    assert!(status.lines().any(|line| words(line) == "archive 1 flash"), "{status}");
    assert!(status.lines().any(|line| words(line) == "hot 3 auto"), "{status}");
    assert_eq!(status.lines().filter(|line| words(line) == "plain 2 memory").count(), 3);

    let mut config = ClientConfig::new(coordinator.clone());
    config.operation_timeout = PATIENCE;
    let client = Client::new(config);
    let archive = client.get_table_id("archive").await.unwrap();
    // Asked again with its tier: the same table. With another: refused, never its id.
    assert_eq!(client.create_table_with_tier("archive", 1, Tier::Flash).await.unwrap(), archive);
    let refused = client.create_table("archive", 1).await.unwrap_err();
    assert_eq!(refused.status, Status::InvalidParameter, "{refused}");
    let hot = client.get_table_id("hot").await.unwrap();
    assert_eq!(client.create_table_with_tier("hot", 1, Tier::Auto).await.unwrap(), hot);
    let refused = client.create_table_with_tier("hot", 1, Tier::Flash).await.unwrap_err();
    assert_eq!(refused.status, Status::InvalidParameter, "{refused}");
    let hot_owner = client.tablet_map(hot).await.unwrap()[0].owner_address.clone();
    assert_eq!(tables_served_in(&metrics[&hot_owner], Tier::Auto), 1.0);
    for index in 0..50 {
        let key = format!("k{index}");
        client.write(archive, key.as_bytes(), b"kept on flash").await.unwrap();
    }
    // The master serving it was told: its store holds the table in flash.
    let map = client.tablet_map(archive).await.unwrap();
    assert_eq!(map.len(), 1);
    let owner = map[0].owner_address.clone();
    assert_eq!(tables_served_in(&metrics[&owner], Tier::Flash), 1.0);
    assert_eq!(tables_served_in(&metrics[&owner], Tier::Memory), 1.0, "its part of plain");
    // An assignment that contradicts the tier it holds the table in is refused, and changes
    // nothing (only a bug could send one: the coordinator sends the record's tier).
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let contradiction = Request::TakeTabletOwnership {
        master_id: map[0].owner,
        table_id: archive,
        range: map[0].range,
        assignment_epoch: u64::MAX,
        tier: Tier::Memory,
    };
    let (status, body) = pool.call(&owner, &contradiction).await.expect("an answer");
    assert_eq!(status, Status::InvalidParameter, "{body:?}");
    assert!(format!("{body:?}").contains("stored in tier flash here, not memory"), "{body:?}");
    assert_eq!(tables_served_in(&metrics[&owner], Tier::Flash), 1.0);

    // A coordinator that restarts reads the tier from the table record, and re-sends every
    // assignment with it.
    cluster.restart_coordinator_after_sigkill();
    assert!(listed(&coordinator, "archive").ends_with("\ttier=flash"));
    assert!(listed(&coordinator, "plain").ends_with("\ttier=memory"));

    // The master serving it crashes: its recovery masters are told the tier.
    let victim = cluster
        .servers
        .iter()
        .find(|server| server.address.as_deref() == Some(owner.as_str()))
        .expect("the owner's process");
    victim.signal(libc::SIGKILL);
    let owners = owners_without(&client, archive, &owner).await;
    assert!(listed(&coordinator, "archive").ends_with("\ttier=flash"));
    for recovery_master in &owners {
        assert_eq!(tables_served_in(&metrics[recovery_master], Tier::Flash), 1.0);
        // The table's live objects came with it, and its tier with them.
        let scrape = scrape(&metrics[recovery_master]);
        let table = archive.0.to_string();
        let info = [("table", table.as_str()), ("tier", "flash")];
        assert_eq!(scrape.value("stratus_master_table_tier_info", &info), Ok(1.0));
    }
    for index in 0..50 {
        let key = format!("k{index}");
        let (value, _) = client.read(archive, key.as_bytes()).await.unwrap();
        assert_eq!(value, &b"kept on flash"[..]);
    }
}
