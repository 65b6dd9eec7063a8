//! A coordinator killed with SIGKILL and restarted on the same directory keeps every table.

mod common;

use common::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordinator_sigkill_keeps_tables_and_data() {
    let mut cluster = TestCluster::start(2);
    let client = cluster.client();
    let mut tables = Vec::new();
    for index in 0..5 {
        let name = format!("table-{index}");
        let id = client.create_table(&name, 2).await.unwrap();
        client.write(id, b"key", name.as_bytes()).await.unwrap();
        tables.push((name, id));
    }
    client.drop_table("table-4").await.unwrap();
    tables.pop();

    cluster.restart_coordinator_after_sigkill();
    let client = cluster.client();
    let listed = client.list_tables().await.unwrap();
    assert_eq!(listed.len(), tables.len());
    for (name, id) in &tables {
        assert_eq!(client.get_table_id(name).await.unwrap(), *id);
        let (value, _) = client.read(*id, b"key").await.unwrap();
        assert_eq!(
            &value[..],
            name.as_bytes(),
            "servers kept serving while the coordinator restarted"
        );
    }
    // Ids are never reused after a restart.
    let fresh = client.create_table("after-restart", 1).await.unwrap();
    assert_eq!(fresh.0, 6, "table ids continue after the dropped table's id (1..=5 were used)");
    assert_eq!(
        client.get_table_id("table-4").await.unwrap_err().status,
        stratus_client::Status::TableDoesntExist
    );
}
