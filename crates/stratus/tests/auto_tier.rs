//! Automatic tiering with real processes: an auto table four times its master's DRAM budget
//! for auto tables is written; the master's cleaner moves the objects not read for longest to
//! flash; a hot set read again and again ends up served from DRAM (the master's metrics say
//! so); then the master is killed with SIGKILL and its tablet comes back on another master from
//! the backups, every value intact.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{metrics_address, scrape, TestCluster};
use stratus_client::{Client, ClientConfig, TableId, Tier};
use stratus_types::TabletState;

/// 4 000 objects of 4 000 bytes: 16 MB, four times the 4 MiB budget, half the 32 MiB log.
const OBJECTS: u32 = 4_000;
const VALUE_BYTES: usize = 4_000;
const AUTO_DRAM_MIB: u64 = 4;
/// The hot set: 1 MB, a quarter of the budget.
const HOT_OBJECTS: u32 = 250;

/// Bound on every wait.
const PATIENCE: Duration = Duration::from_secs(90);

fn key_of(index: u32) -> Vec<u8> {
    format!("auto-{index:08}").into_bytes()
}

/// A value that names its key, so a value read for another key is caught.
fn value_of(index: u32) -> Vec<u8> {
    let mut value = format!("value of {index} ").into_bytes();
    value.resize(VALUE_BYTES, (index % 251) as u8);
    value
}

/// One metric of the auto tier, by its single label.
fn auto_metric(address: &str, name: &str, label: (&str, &str)) -> f64 {
    scrape(address).value(name, &[label]).unwrap_or_else(|error| panic!("{name}: {error}"))
}

async fn read_range(client: &Client, table: TableId, range: std::ops::Range<u32>) {
    let mut tasks = tokio::task::JoinSet::new();
    let readers = 4u32;
    for reader in 0..readers {
        let client = client.clone();
        let range = range.clone();
        tasks.spawn(async move {
            for index in range.filter(|index| index % readers == reader) {
                let (value, _) = client
                    .read(table, &key_of(index))
                    .await
                    .unwrap_or_else(|error| panic!("object {index} unreadable: {error}"));
                assert!(value == value_of(index), "object {index} read back wrong");
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_auto_table_keeps_its_hot_set_in_dram_and_survives_a_killed_master() {
    let budget = AUTO_DRAM_MIB.to_string();
    let extra = ["--flash-gib", "1", "--auto-dram-mib", &budget, "--metrics-listen", "127.0.0.1:0"];
    // Four servers: with one killed, a recovery master still has two backups besides itself.
    let mut cluster = TestCluster::start_with(4, 2, &extra);
    let metrics: HashMap<String, String> = cluster
        .servers
        .iter()
        .map(|server| {
            (server.address.clone().expect("an address"), metrics_address(server, PATIENCE))
        })
        .collect();
    let mut config = ClientConfig::new(cluster.coordinator_address.clone());
    config.operation_timeout = PATIENCE;
    let client = Client::new(config);
    let table = client.create_table_with_tier("auto", 1, Tier::Auto).await.unwrap();
    for index in 0..OBJECTS {
        client.write(table, &key_of(index), &value_of(index)).await.unwrap();
    }
    let owner = client.tablet_map(table).await.unwrap()[0].owner_address.clone();
    let owner_metrics = &metrics[&owner];

    // The cleaner brings the auto table's DRAM down to its budget (plus the open head, 1 MiB,
    // which no demotion takes).
    let budget_bytes = (AUTO_DRAM_MIB << 20) as f64;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let dram = auto_metric(owner_metrics, "stratus_tier_auto_bytes", ("place", "dram"));
        let flash = auto_metric(owner_metrics, "stratus_tier_auto_bytes", ("place", "flash"));
        if dram <= budget_bytes + (1 << 20) as f64 && flash > 0.0 {
            eprintln!("demoted: {dram} bytes in DRAM, {flash} on flash");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never demoted: {dram} in DRAM");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A hot set read again and again comes back to DRAM and stays there.
    for _ in 0..20 {
        read_range(&client, table, 0..HOT_OBJECTS).await;
    }
    let reads = |from| auto_metric(owner_metrics, "stratus_tier_auto_reads_total", ("from", from));
    let (dram_before, flash_before) = (reads("dram"), reads("flash"));
    read_range(&client, table, 0..HOT_OBJECTS).await;
    let (dram_after, flash_after) = (reads("dram"), reads("flash"));
    let hit_ratio =
        (dram_after - dram_before) / (dram_after + flash_after - dram_before - flash_before);
    let promotions =
        scrape(owner_metrics).value("stratus_tier_auto_promotions_total", &[]).unwrap();
    eprintln!("hot set: DRAM hit ratio {hit_ratio:.3} after {promotions} promotions");
    assert!(hit_ratio >= 0.9, "hot set served from DRAM at {hit_ratio}");
    let dram = auto_metric(owner_metrics, "stratus_tier_auto_bytes", ("place", "dram"));
    assert!(dram <= budget_bytes + (2 << 20) as f64, "{dram} bytes in DRAM");
    // Everything reads back, from either tier.
    read_range(&client, table, 0..OBJECTS).await;

    // The table's own figures: in its master's metrics and in the cluster overview that
    // `stratus status` and the status page show. Every object is in one place or the other.
    let id = table.0.to_string();
    let scraped = scrape(owner_metrics);
    let per_table = |place| {
        let labels = [("table", id.as_str()), ("place", place)];
        scraped.value("stratus_tier_auto_table_objects", &labels).expect("the table's objects")
    };
    assert_eq!(per_table("dram") + per_table("flash"), f64::from(OBJECTS));
    let labels = [("table", id.as_str())];
    let table_promotions =
        scraped.value("stratus_tier_auto_table_promotions_total", &labels).expect("promotions");
    assert!(table_promotions >= promotions, "{table_promotions} < {promotions}");
    let overview = client.cluster_overview(Duration::from_secs(10)).await.unwrap();
    let figures = overview.auto_tables()[&table];
    assert_eq!(figures.dram_objects + figures.flash_objects, u64::from(OBJECTS));
    assert!(figures.flash_objects > 0 && figures.objects_demoted > 0, "{figures:?}");
    assert!(figures.reads_from_dram > 0 && figures.reads_from_flash > 0, "{figures:?}");
    let ratio = stratus_client::dram_hit_ratio(&figures).expect("reads");
    eprintln!("table {id}: {figures:?}, DRAM hit ratio since start {ratio:.3}");

    // The master is killed: its auto tablet is recovered elsewhere from the backups.
    let victim = cluster
        .servers
        .iter_mut()
        .find(|server| server.address.as_deref() == Some(owner.as_str()))
        .expect("the owner's process");
    victim.signal(libc::SIGKILL);
    assert!(victim.wait_exit(Duration::from_secs(10)).is_some());
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let map = client.tablet_map(table).await.unwrap();
        let served = map
            .iter()
            .all(|tablet| tablet.owner_address != owner && tablet.state == TabletState::Normal);
        if served {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not recovered: {map:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    read_range(&client, table, 0..OBJECTS).await;
}
