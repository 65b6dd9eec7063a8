//! How the client fails: at once when retrying cannot help, never after a second timeout.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use stratus_client::{Client, ClientConfig, Status, TableId};
use stratus_wire::{Hello, HELLO_BYTES, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A peer that completes the handshake, then answers the first request with bytes that are
/// no frame at all. Counts the connections it accepted.
async fn garbage_speaker() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut hello = [0u8; HELLO_BYTES];
                if stream.read_exact(&mut hello).await.is_err() {
                    return;
                }
                let answer = Hello { version: PROTOCOL_VERSION, status: Status::Ok }.encode();
                let _ = stream.write_all(&answer).await;
                let mut request = [0u8; 64];
                let _ = stream.read(&mut request).await;
                // A length of 12 bytes, then a frame kind that does not exist.
                let _ =
                    stream.write_all(&[12, 0, 0, 0, 0xEE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await;
                let _ = stream.flush().await;
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    (address, connections)
}

#[tokio::test]
async fn a_peer_that_breaks_the_protocol_is_not_retried() {
    let (address, connections) = garbage_speaker().await;
    let mut config = ClientConfig::new(address);
    // Long: retrying until the deadline would open many connections in that time.
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    let error = client.create_table("t", 1).await.expect_err("garbage is not an answer");
    assert_eq!(error.status, Status::InternalError, "{error}");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "the request was retried: {error}");
}

#[tokio::test]
async fn table_id_zero_names_no_table() {
    // Nothing listens there: an answer at all means the client did not try the network.
    let mut config = ClientConfig::new("127.0.0.1:9");
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    let error = client.read(TableId(0), b"key").await.expect_err("no table 0");
    assert_eq!(error.status, Status::TableDoesntExist, "{error}");
}

/// A coordinator whose tablet map has one tablet of table 1, in `state`, owned by crashed
/// server 7 (every request is answered with that map).
async fn coordinator_reporting(state: stratus_types::TabletState) -> String {
    struct MapService(stratus_types::TabletState);
    impl stratus_rpc::Service for MapService {
        fn handle(
            &self,
            header: &stratus_wire::FrameHeader,
            _body: bytes::Bytes,
            out: &mut bytes::BytesMut,
        ) -> stratus_rpc::Handled {
            let tablets = vec![stratus_wire::TabletEntry {
                table_id: TableId(1),
                range: stratus_types::HashRange::FULL,
                owner: stratus_types::ServerId(7),
                owner_address: String::new(),
                state: self.0,
            }];
            let response = stratus_wire::Response::GetTabletMap { tablets };
            stratus_wire::encode_response(out, header.request_id, Status::Ok, &response);
            stratus_rpc::Handled::Done
        }
    }
    serve_on_loopback(Arc::new(MapService(state))).await
}

/// Serves `service` on a free loopback port; returns its address.
async fn serve_on_loopback(service: Arc<dyn stratus_rpc::Service>) -> String {
    let environment = stratus_env::Environment::system();
    let listener = environment.network.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    tokio::spawn(stratus_rpc::serve(listener, service));
    address
}

#[tokio::test]
async fn an_unavailable_tablet_fails_at_once_with_a_clear_status() {
    let address = coordinator_reporting(stratus_types::TabletState::Unavailable).await;
    let mut config = ClientConfig::new(address);
    // Long: waiting for the deadline would end in RETRY, not in this status.
    config.operation_timeout = Duration::from_secs(60);
    let client = Client::new(config);
    let error = client.read(TableId(1), b"key").await.expect_err("nothing serves it");
    assert_eq!(error.status, Status::ServiceNotAvailable, "{error}");
    assert!(error.message.contains("accept-loss 7"), "{error}");
    let item = stratus_client::KeyItem {
        table_id: TableId(1),
        key: bytes::Bytes::from_static(b"key"),
        rules: stratus_client::RejectRules::NONE,
    };
    let outcomes = client.multi_read(&[item]).await;
    assert!(
        matches!(&outcomes[..], [Err(error)] if error.status == Status::ServiceNotAvailable),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn a_tablet_still_recovering_at_the_deadline_says_so() {
    let address = coordinator_reporting(stratus_types::TabletState::Recovering).await;
    let mut config = ClientConfig::new(address);
    config.operation_timeout = Duration::from_millis(300);
    let client = Client::new(config);
    let error = client.read(TableId(1), b"key").await.expect_err("nothing serves it");
    assert_eq!(error.status, Status::Retry, "{error}");
    assert!(error.message.contains("is recovering (its master 7 crashed)"), "{error}");
}

/// A coordinator that leaves the first DROP_TABLE unanswered (as if its answer were lost) and
/// answers every later one TABLE_DOESNT_EXIST (as it would once the first had dropped the
/// table); with `answer_first`, it answers the first one so too. Counts the requests.
async fn coordinator_dropping(answer_first: bool) -> (String, Arc<AtomicUsize>) {
    struct DropService {
        answer_first: bool,
        requests: Arc<AtomicUsize>,
    }
    impl stratus_rpc::Service for DropService {
        fn handle(
            &self,
            header: &stratus_wire::FrameHeader,
            _body: bytes::Bytes,
            out: &mut bytes::BytesMut,
        ) -> stratus_rpc::Handled {
            if self.requests.fetch_add(1, Ordering::SeqCst) == 0 && !self.answer_first {
                return stratus_rpc::Handled::Later(Box::pin(std::future::pending()));
            }
            let message = "no table named \"t\"";
            let opcode = header.opcode_code;
            stratus_wire::encode_error_response(
                out,
                header.request_id,
                opcode,
                Status::TableDoesntExist,
                message,
            );
            stratus_rpc::Handled::Done
        }
    }
    let requests = Arc::new(AtomicUsize::new(0));
    let service = DropService { answer_first, requests: requests.clone() };
    (serve_on_loopback(Arc::new(service)).await, requests)
}

#[tokio::test]
async fn a_drop_whose_first_answer_was_lost_succeeds_when_the_table_is_gone() {
    let (address, requests) = coordinator_dropping(false).await;
    let mut config = ClientConfig::new(address);
    config.rpc.request_timeout = Duration::from_millis(200);
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    client.drop_table("t").await.expect("the first attempt may have dropped it");
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_drop_of_a_table_that_never_existed_says_so() {
    let (address, requests) = coordinator_dropping(true).await;
    let mut config = ClientConfig::new(address);
    config.operation_timeout = Duration::from_secs(20);
    let client = Client::new(config);
    let error = client.drop_table("t").await.expect_err("no such table");
    assert_eq!(error.status, Status::TableDoesntExist, "{error}");
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}
