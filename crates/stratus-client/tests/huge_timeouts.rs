//! Timeouts too long to add to the clock (`Duration::MAX`) mean "no timeout": every public
//! call takes them without panicking, on the async client and the blocking one.

mod scripted;

use std::time::Duration;

use bytes::Bytes;
use scripted::{healthy_master, serve, Coordinator, TABLE, VERSION};
use stratus_client::{BlockingClient, Client, ClientConfig, KeyItem, RejectRules};

fn unbounded_config(coordinator: String) -> ClientConfig {
    let mut config = ClientConfig::new(coordinator);
    config.operation_timeout = Duration::MAX;
    config.rpc.request_timeout = Duration::MAX;
    config.rpc.connect_timeout = Duration::MAX;
    config
}

fn item() -> KeyItem {
    KeyItem { table_id: TABLE, key: Bytes::from_static(b"key"), rules: RejectRules::NONE }
}

/// A coordinator and a healthy master on `runtime`; the coordinator's address and the
/// master's.
fn cluster(runtime: &tokio::runtime::Runtime) -> (String, String) {
    runtime.block_on(async {
        let master = serve(healthy_master()).await;
        (serve(Coordinator::serving(master.clone())).await, master)
    })
}

#[test]
fn the_async_client_takes_timeouts_too_long_to_add() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (coordinator, master) = cluster(&runtime);
    let client = Client::new(unbounded_config(coordinator));
    runtime.block_on(async {
        assert_eq!(client.create_table("t", 1).await.unwrap(), TABLE);
        assert_eq!(client.read(TABLE, b"key").await.unwrap().1, VERSION);
        assert_eq!(client.write(TABLE, b"key", b"value").await.unwrap().0, 4);
        assert!(client.multi_read(&[item()]).await[0].is_ok());
        assert_eq!(client.enumerate(TABLE).collect_all().await.unwrap().len(), 1);
        client.server_statistics(&master).await.unwrap();
        client.drop_table("t").await.unwrap();
    });
}

#[test]
fn the_blocking_client_takes_timeouts_too_long_to_add() {
    let servers =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (coordinator, _) = cluster(&servers);
    let client = BlockingClient::new(unbounded_config(coordinator)).unwrap();
    assert_eq!(client.create_table("t", 1).unwrap(), TABLE);
    // The first read fills the map cache; the second and the write go straight to the master.
    for _ in 0..2 {
        assert_eq!(client.read(TABLE, b"key", RejectRules::NONE).unwrap().1, VERSION);
    }
    assert_eq!(client.write(TABLE, b"key", b"value", RejectRules::NONE).unwrap().0, 4);
    assert!(client.multi_read(&[item()])[0].is_ok());
    assert_eq!(client.enumerate_all(TABLE).unwrap().len(), 1);
    client.drop_table("t").unwrap();
}
