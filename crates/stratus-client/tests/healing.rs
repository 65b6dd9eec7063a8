//! Every client path heals the way a single-object read does: after a failure that a fresh
//! tablet map (or a fresh connection) can cure, it drops what it cached and tries again, within
//! its operation's deadline; and a mutation whose outcome is unknown is sent again only when
//! exactly-once is on (the default) or `retry_ambiguous_mutations` allows it. Each test kills or
//! moves the master under the call.

mod scripted;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use scripted::{
    dead_address, healthy_master, master, serve, serve_dying, Coordinator, TABLE, VERSION,
};
use stratus_client::{
    BlockingClient, Client, ClientConfig, IncrementItem, KeyItem, RejectRules, Status, WriteItem,
};
use stratus_types::TabletState;
use stratus_wire::{IncrementItemResult, Request, Response};

/// How long a test waits for a call at most: far past every operation timeout below, so a
/// call still running then has outlived its deadline.
const TEST_PATIENCE: Duration = Duration::from_secs(60);

async fn bounded<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_PATIENCE, call).await.expect("the call outlived its deadline")
}

fn config(coordinator: String) -> ClientConfig {
    let mut config = ClientConfig::new(coordinator);
    config.operation_timeout = Duration::from_secs(20);
    config
}

fn read_items(count: usize) -> Vec<KeyItem> {
    (0..count)
        .map(|index| KeyItem {
            table_id: TABLE,
            key: Bytes::from(format!("key-{index}")),
            rules: RejectRules::NONE,
        })
        .collect()
}

fn increment_items(count: usize) -> Vec<IncrementItem> {
    (0..count)
        .map(|index| IncrementItem {
            table_id: TABLE,
            key: Bytes::from(format!("key-{index}")),
            delta: 7,
            rules: RejectRules::NONE,
            rpc: None,
        })
        .collect()
}

fn assert_every_read_healed(outcomes: &[stratus_client::Result<(Bytes, stratus_client::Version)>]) {
    for outcome in outcomes {
        match outcome {
            Ok((value, version)) => assert_eq!((&value[..], *version), (&b"value"[..], VERSION)),
            Err(error) => panic!("an item did not heal: {error}"),
        }
    }
}

#[tokio::test]
async fn a_multi_read_whose_master_is_gone_heals_once_the_map_names_a_new_master() {
    let new_master = serve(healthy_master()).await;
    // The first map names a master that died (its address refuses connections).
    let coordinator = Coordinator::moving(dead_address(), 1, new_master);
    let client = Client::new(config(serve(coordinator.clone()).await));
    let outcomes = bounded(client.multi_read(&read_items(3))).await;
    assert_every_read_healed(&outcomes);
    assert!(coordinator.maps_served.load(Ordering::SeqCst) >= 2, "the map was never refetched");
}

#[tokio::test]
async fn a_multi_read_whose_master_dies_under_it_heals_once_the_map_names_a_new_master() {
    // The first map names a master that dies under every request.
    let (dying, accepted) = serve_dying(healthy_master(), usize::MAX).await;
    let new_master = serve(healthy_master()).await;
    let coordinator = Coordinator::moving(dying, 1, new_master);
    let client = Client::new(config(serve(coordinator).await));
    let outcomes = bounded(client.multi_read(&read_items(3))).await;
    assert_every_read_healed(&outcomes);
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the dead master was asked again");
}

#[tokio::test]
async fn a_multi_read_of_a_recovering_tablet_heals_once_recovery_ends() {
    let new_master = serve(healthy_master()).await;
    // Recovering in the first two maps (nobody serves it), then served by the new master.
    let coordinator = Coordinator::new(move |served| match served {
        0 | 1 => (String::new(), TabletState::Recovering),
        _ => (new_master.clone(), TabletState::Normal),
    });
    let client = Client::new(config(serve(coordinator).await));
    let outcomes = bounded(client.multi_read(&read_items(3))).await;
    assert_every_read_healed(&outcomes);
}

#[test]
fn a_blocking_multi_read_whose_master_is_gone_heals_once_the_map_names_a_new_master() {
    let servers =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let coordinator = servers.block_on(async {
        let new_master = serve(healthy_master()).await;
        serve(Coordinator::moving(dead_address(), 1, new_master)).await
    });
    let client = BlockingClient::new(config(coordinator)).unwrap();
    assert_every_read_healed(&client.multi_read(&read_items(3)));
    let outcomes = client.multi_write(&[WriteItem {
        table_id: TABLE,
        key: Bytes::from_static(b"key"),
        value: Bytes::from_static(b"value"),
        rules: RejectRules::NONE,
        expiry: stratus_client::Expiry::Never,
        rpc: None,
    }]);
    assert!(matches!(outcomes[..], [Ok(_)]), "{outcomes:?}");
}

/// A master that leaves the first MULTI_INCREMENT unanswered (its answer lost) and answers
/// every later one.
fn master_losing_the_first_multi_increment_answer() -> std::sync::Arc<scripted::Master> {
    let increments = std::sync::atomic::AtomicUsize::new(0);
    master(move |request| match request {
        Request::MultiIncrement { .. } if increments.fetch_add(1, Ordering::SeqCst) == 0 => None,
        other => scripted::healthy_answer(other),
    })
}

#[tokio::test]
async fn a_multi_increment_whose_answer_is_lost_is_not_sent_again_when_ambiguity_is_refused() {
    let master = master_losing_the_first_multi_increment_answer();
    let coordinator = Coordinator::serving(serve(master.clone()).await);
    let mut config = config(serve(coordinator).await);
    config.rpc.request_timeout = Duration::from_millis(200);
    config.exactly_once = false;
    config.retry_ambiguous_mutations = false;
    let client = Client::new(config);
    let outcomes = bounded(client.multi_increment(&increment_items(2))).await;
    for outcome in &outcomes {
        let error = outcome.as_ref().expect_err("the outcome is unknown");
        assert_eq!(error.status, Status::Timeout, "{error}");
    }
    assert_eq!(master.requests.load(Ordering::SeqCst), 1, "the increment was sent again");
}

#[tokio::test]
async fn a_multi_increment_whose_answer_is_lost_is_sent_again_by_default() {
    let master = master_losing_the_first_multi_increment_answer();
    let coordinator = Coordinator::serving(serve(master.clone()).await);
    let mut config = config(serve(coordinator).await);
    config.rpc.request_timeout = Duration::from_millis(200);
    let client = Client::new(config);
    let outcomes = bounded(client.multi_increment(&increment_items(2))).await;
    assert!(outcomes.iter().all(|outcome| matches!(outcome, Ok((7, _)))), "{outcomes:?}");
    assert_eq!(master.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_multi_increment_item_answered_retry_is_not_sent_again_when_ambiguity_is_refused() {
    // The first item is applied; the master could not confirm the second one's replication.
    let master = master(|request| match request {
        Request::MultiIncrement { items } => Some((
            Status::Ok,
            Response::MultiIncrement {
                results: items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| IncrementItemResult {
                        status: if index == 0 { Status::Ok } else { Status::Retry },
                        version: stratus_client::Version(4),
                        value: if index == 0 { item.delta } else { 0 },
                    })
                    .collect(),
            },
        )),
        other => scripted::healthy_answer(other),
    });
    let coordinator = Coordinator::serving(serve(master.clone()).await);
    let mut config = config(serve(coordinator).await);
    config.exactly_once = false;
    config.retry_ambiguous_mutations = false;
    let client = Client::new(config);
    let outcomes = bounded(client.multi_increment(&increment_items(2))).await;
    assert!(matches!(outcomes[0], Ok((7, _))), "{outcomes:?}");
    assert!(matches!(&outcomes[1], Err(error) if error.status == Status::Retry), "{outcomes:?}");
    assert_eq!(master.requests.load(Ordering::SeqCst), 1, "the increment was sent again");
}

#[tokio::test]
async fn a_multi_operation_ends_by_its_deadline_though_its_request_could_wait_longer() {
    let silent = master(|_| None);
    let coordinator = Coordinator::serving(serve(silent.clone()).await);
    let mut config = config(serve(coordinator).await);
    // Ten minutes per request; one second per operation.
    config.rpc.request_timeout = Duration::from_secs(600);
    config.operation_timeout = Duration::from_secs(1);
    let client = Client::new(config);
    let outcomes = bounded(client.multi_read(&read_items(2))).await;
    for outcome in &outcomes {
        let error = outcome.as_ref().expect_err("nothing answers");
        assert_eq!(error.status, Status::Timeout, "{error}");
    }
}

#[tokio::test]
async fn an_enumeration_whose_master_is_gone_heals_once_the_map_names_a_new_master() {
    let new_master = serve(healthy_master()).await;
    let coordinator = Coordinator::moving(dead_address(), 1, new_master);
    let client = Client::new(config(serve(coordinator).await));
    let objects = bounded(client.enumerate(TABLE).collect_all()).await.expect("healed");
    assert_eq!(objects.len(), 1);
    assert_eq!(objects[0].version, VERSION);
}

#[tokio::test]
async fn an_enumeration_ends_by_its_deadline_though_its_request_could_wait_longer() {
    let silent = master(|_| None);
    let coordinator = Coordinator::serving(serve(silent).await);
    let mut config = config(serve(coordinator).await);
    config.rpc.request_timeout = Duration::from_secs(600);
    config.operation_timeout = Duration::from_secs(1);
    let client = Client::new(config);
    let error = bounded(client.enumerate(TABLE).collect_all()).await.expect_err("no answer");
    assert_eq!(error.status, Status::Timeout, "{error}");
}

#[tokio::test]
async fn a_table_call_ends_by_its_deadline_though_the_coordinator_could_wait_longer() {
    let silent = master(|_| None);
    let mut config = config(serve(silent).await);
    config.rpc.request_timeout = Duration::from_secs(600);
    config.operation_timeout = Duration::from_secs(1);
    let client = Client::new(config);
    let error = bounded(client.create_table("t", 1)).await.expect_err("no answer");
    assert_eq!(error.status, Status::Timeout, "{error}");
    let error = bounded(client.drop_table("t")).await.expect_err("no answer");
    assert_eq!(error.status, Status::Timeout, "{error}");
}

#[tokio::test]
async fn a_table_call_heals_once_the_coordinator_is_back() {
    // The coordinator dies under the first request; it is back at the same address.
    let (coordinator, accepted) = serve_dying(Coordinator::serving(String::new()), 1).await;
    let client = Client::new(config(coordinator));
    assert_eq!(bounded(client.create_table("t", 1)).await.expect("healed"), TABLE);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn server_statistics_heal_once_the_server_is_back() {
    // The server dies under the first request; it is back at the same address.
    let (address, accepted) = serve_dying(healthy_master(), 1).await;
    let client = Client::new(config(dead_address()));
    bounded(client.server_statistics(&address)).await.expect("healed");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_single_read_whose_master_is_gone_heals_once_the_map_names_a_new_master() {
    let new_master = serve(healthy_master()).await;
    let coordinator = Coordinator::moving(dead_address(), 1, new_master);
    let client = Client::new(config(serve(coordinator.clone()).await));
    let (value, version) = bounded(client.read(TABLE, b"key")).await.expect("healed");
    assert_eq!((&value[..], version), (&b"value"[..], VERSION));
    // The master refused the connection: the client waited at the coordinator for the tablet
    // to move (AWAIT_TABLET_MAP naming it), rather than polling the map.
    assert_eq!(coordinator.maps_awaited.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_read_of_a_recovering_tablet_waits_at_the_coordinator_for_its_new_master() {
    let new_master = serve(healthy_master()).await;
    // The first map shows the tablet recovering; the next one names its new master.
    let coordinator = Coordinator::new(move |served| match served {
        0 => (String::new(), TabletState::Recovering),
        _ => (new_master.clone(), TabletState::Normal),
    });
    let client = Client::new(config(serve(coordinator.clone()).await));
    let (value, version) = bounded(client.read(TABLE, b"key")).await.expect("healed");
    assert_eq!((&value[..], version), (&b"value"[..], VERSION));
    // The second map was awaited (AWAIT_TABLET_MAP), not polled for.
    assert_eq!(coordinator.maps_served.load(Ordering::SeqCst), 2);
    assert_eq!(coordinator.maps_awaited.load(Ordering::SeqCst), 1);
}
