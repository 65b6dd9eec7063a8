//! The RPC layer end to end over loopback TCP: pipelining, out-of-order completion, timeouts,
//! a dead server, and the pool replacing broken channels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{Network, TcpNetwork};
use stratus_rpc::{
    serve, BlockingChannel, Channel, ChannelPool, Handled, RpcConfig, RpcError, Service,
};
use stratus_types::TableId;
use stratus_wire::{
    decode_request, encode_error_response, encode_response, FrameHeader, Request, Response,
    ResponseBody, Status,
};

/// Answers PING at once, GET_TABLE_ID after a delay given by the name's length in
/// milliseconds (so responses complete out of order), READ with a value as long as the key
/// says, and never answers LIST_TABLES.
struct TestService {
    handled: AtomicU64,
}

impl Service for TestService {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        self.handled.fetch_add(1, Ordering::Relaxed);
        let request_id = header.request_id;
        match decode_request(header.opcode_code, body) {
            Ok(Request::Ping) => {
                encode_response(out, request_id, Status::Ok, &Response::Ping);
                Handled::Done
            }
            Ok(Request::GetTableId { name }) => Handled::Later(Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(name.len() as u64)).await;
                let mut frame = BytesMut::new();
                let response = Response::GetTableId { table_id: TableId(name.len() as u64) };
                encode_response(&mut frame, request_id, Status::Ok, &response);
                frame
            })),
            Ok(Request::ListTables) => Handled::Later(Box::pin(std::future::pending())),
            Ok(Request::Read { key, .. }) => {
                // The key is the value's size in decimal: responses of any size.
                let bytes: usize = std::str::from_utf8(&key).unwrap().parse().unwrap();
                let value = Bytes::from(vec![0xab; bytes]);
                let response = Response::Read {
                    version: stratus_types::Version(7),
                    value,
                    expires_in_millis: 0,
                };
                encode_response(out, request_id, Status::Ok, &response);
                Handled::Done
            }
            Ok(_) => {
                encode_error_response(
                    out,
                    request_id,
                    header.opcode_code,
                    Status::UnimplementedRequest,
                    "",
                );
                Handled::Done
            }
            Err(error) => {
                encode_error_response(
                    out,
                    request_id,
                    header.opcode_code,
                    error.status(),
                    &error.to_string(),
                );
                Handled::Done
            }
        }
    }
}

async fn start_server() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    let service = Arc::new(TestService { handled: AtomicU64::new(0) });
    (address, tokio::spawn(serve(listener, service)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_calls_complete_out_of_order() {
    let (address, _server) = start_server().await;
    let channel =
        Arc::new(Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.unwrap());
    let mut calls = tokio::task::JoinSet::new();
    for index in 0..500u64 {
        let delayed = channel.clone();
        calls.spawn(async move {
            let name = "x".repeat((index % 20) as usize + 1);
            let request = Request::GetTableId { name: name.clone() };
            let (status, body) = delayed.call(&request, Duration::from_secs(10)).await.unwrap();
            assert_eq!(status, Status::Ok);
            match body {
                ResponseBody::Operation(Response::GetTableId { table_id }) => {
                    assert_eq!(table_id.0, name.len() as u64)
                }
                other => panic!("unexpected {other:?}"),
            }
        });
        let channel = channel.clone();
        calls.spawn(async move {
            let (status, _) = channel.call(&Request::Ping, Duration::from_secs(10)).await.unwrap();
            assert_eq!(status, Status::Ok);
        });
    }
    while let Some(result) = calls.join_next().await {
        result.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_answer_times_out_and_the_channel_stays_usable() {
    let (address, _server) = start_server().await;
    let channel = Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.unwrap();
    let outcome = channel.call(&Request::ListTables, Duration::from_millis(50)).await;
    assert_eq!(outcome.unwrap_err(), RpcError::Timeout);
    let (status, _) = channel.call(&Request::Ping, Duration::from_secs(10)).await.unwrap();
    assert_eq!(status, Status::Ok);
}

/// A hand-written server: the first connection reads a request and hangs up; the second
/// answers one PING properly.
async fn flaky_server(listener: tokio::net::TcpListener) {
    use stratus_wire::{decode_frame_header, frame_length, Hello, HELLO_BYTES, PROTOCOL_VERSION};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for connection in 0..2 {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; HELLO_BYTES];
        stream.read_exact(&mut hello).await.unwrap();
        stream
            .write_all(&Hello { version: PROTOCOL_VERSION, status: Status::Ok }.encode())
            .await
            .unwrap();
        let mut buffer = BytesMut::new();
        let frame = loop {
            if let Some(length) = frame_length(&buffer).unwrap() {
                if buffer.len() >= length {
                    break buffer.split_to(length);
                }
            }
            assert!(stream.read_buf(&mut buffer).await.unwrap() > 0);
        };
        if connection == 0 {
            drop(stream);
            continue;
        }
        let header = decode_frame_header(&frame).unwrap();
        let mut response = BytesMut::new();
        encode_response(&mut response, header.request_id, Status::Ok, &Response::Ping);
        stream.write_all(&response).await.unwrap();
        let _ = stream.read(&mut [0u8; 1]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_connection_fails_its_calls_and_the_pool_reconnects() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(flaky_server(listener));
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
    let lost = pool.call(&address, &Request::ListTables).await.unwrap_err();
    assert!(matches!(lost, RpcError::ConnectionLost(_)), "{lost:?}");
    assert_eq!(lost.status(), Status::CouldntConnect);
    let (status, _) = pool.call(&address, &Request::Ping).await.unwrap();
    assert_eq!(status, Status::Ok);
    drop(pool);
    server.await.unwrap();
    let refused = Channel::connect(&TcpNetwork, "127.0.0.1:1", &RpcConfig::default()).await;
    assert!(matches!(refused, Err(RpcError::Connect(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_the_in_process_server_skip_the_network_and_answer_the_same() {
    let in_process = Arc::new(TestService { handled: AtomicU64::new(0) });
    // An address nothing listens on: a call that took the network would fail to connect.
    let address = "127.0.0.1:1";
    let config = RpcConfig { request_timeout: Duration::from_millis(200), ..RpcConfig::default() };
    let pool = ChannelPool::new(Arc::new(TcpNetwork), config)
        .with_in_process_server(address, in_process.clone());
    // Answered at once by the handler.
    assert_eq!(
        pool.call(address, &Request::Ping).await.unwrap(),
        (Status::Ok, ResponseBody::Operation(Response::Ping))
    );
    // Answered later, by a future the handler returned.
    let request = Request::GetTableId { name: "abc".to_string() };
    let (status, body) = pool.call(address, &request).await.unwrap();
    assert_eq!(status, Status::Ok);
    assert_eq!(body, ResponseBody::Operation(Response::GetTableId { table_id: TableId(3) }));
    // A handler that never answers times out like a remote one.
    assert_eq!(pool.call(address, &Request::ListTables).await, Err(RpcError::Timeout));
    // An error status travels back decoded.
    let (status, _) = pool.call(address, &Request::GetServerStatistics).await.unwrap();
    assert_eq!(status, Status::UnimplementedRequest);
    assert_eq!(in_process.handled.load(Ordering::Relaxed), 4);
    // A request over the frame limit is refused as a server refuses it, without the handler.
    let oversized = Request::Write {
        table_id: TableId(1),
        key: Bytes::from_static(b"k"),
        value: Bytes::from(vec![0u8; stratus_types::limits::FRAME_BYTES_MAX]),
        rules: stratus_types::RejectRules::NONE,
        expiry: stratus_types::Expiry::Never,
        rpc: None,
    };
    let (status, _) = pool.call(address, &oversized).await.unwrap();
    assert_eq!(status, Status::RequestTooLarge);
    assert_eq!(in_process.handled.load(Ordering::Relaxed), 4);
    // Other addresses still go over the network.
    let (remote, _server) = start_server().await;
    assert_eq!(
        pool.call(&remote, &Request::Ping).await.unwrap(),
        (Status::Ok, ResponseBody::Operation(Response::Ping))
    );
    assert_eq!(in_process.handled.load(Ordering::Relaxed), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_handlers_that_never_end_are_bounded_like_a_connection() {
    use stratus_types::limits::REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX;
    let in_process = Arc::new(TestService { handled: AtomicU64::new(0) });
    let address = "127.0.0.1:1";
    let config = RpcConfig { request_timeout: Duration::from_millis(200), ..RpcConfig::default() };
    let pool = Arc::new(
        ChannelPool::new(Arc::new(TcpNetwork), config)
            .with_in_process_server(address, in_process.clone()),
    );
    // Every window slot is taken by a handler that never ends; its caller gives up.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX {
        let pool = pool.clone();
        calls.spawn(async move { pool.call(address, &Request::ListTables).await });
    }
    while let Some(outcome) = calls.join_next().await {
        assert_eq!(outcome.unwrap(), Err(RpcError::Timeout));
    }
    // The detached handlers still hold the window: a new call waits and times out without
    // reaching the handler, as a request on a full connection would.
    let handled = in_process.handled.load(Ordering::Relaxed);
    assert_eq!(handled, REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX as u64);
    assert_eq!(pool.call(address, &Request::Ping).await, Err(RpcError::Timeout));
    assert_eq!(in_process.handled.load(Ordering::Relaxed), handled);
}

/// Runs `work` on a thread of its own, as a blocking caller would, while the server runs on
/// the test's runtime.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.unwrap()
}

fn read_of(bytes: usize) -> Request {
    Request::Read {
        table_id: TableId(1),
        key: Bytes::from(bytes.to_string()),
        rules: stratus_types::RejectRules::NONE,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_channel_answers_requests_one_after_another_of_any_size() {
    let (address, _server) = start_server().await;
    blocking(move || {
        let mut channel = BlockingChannel::connect(&address, &RpcConfig::default()).unwrap();
        let timeout = Duration::from_secs(10);
        for round in 0..200u64 {
            assert_eq!(
                channel.call(&Request::Ping, timeout).unwrap(),
                (Status::Ok, ResponseBody::Operation(Response::Ping))
            );
            // Answered later by the server (a spawned handler), after a delay.
            let name = "x".repeat((round % 3) as usize + 1);
            let (status, body) =
                channel.call(&Request::GetTableId { name: name.clone() }, timeout).unwrap();
            assert_eq!(status, Status::Ok);
            let table_id = TableId(name.len() as u64);
            assert_eq!(body, ResponseBody::Operation(Response::GetTableId { table_id }));
        }
        // Responses larger than the channel's read buffer, then small ones again.
        for bytes in [0, 100, 64 << 10, 3 << 20, 10, 200 << 10, 1] {
            let (status, body) = channel.call(&read_of(bytes), timeout).unwrap();
            assert_eq!(status, Status::Ok);
            match body {
                ResponseBody::Operation(Response::Read { value, .. }) => {
                    assert_eq!(value.len(), bytes);
                    assert!(value.iter().all(|&byte| byte == 0xab));
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // An error status travels back decoded.
        let (status, _) = channel.call(&Request::GetServerStatistics, timeout).unwrap();
        assert_eq!(status, Status::UnimplementedRequest);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_call_without_answer_times_out() {
    let (address, _server) = start_server().await;
    blocking(move || {
        let config =
            RpcConfig { request_timeout: Duration::from_millis(100), ..RpcConfig::default() };
        let mut channel = BlockingChannel::connect(&address, &config).unwrap();
        let outcome = channel.call(&Request::ListTables, Duration::from_millis(100));
        assert_eq!(outcome.unwrap_err(), RpcError::Timeout);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_channel_reports_a_lost_connection_and_a_refused_one() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(flaky_server(listener));
    let lost = address.clone();
    blocking(move || {
        // The first connection is hung up on after the request.
        let mut channel = BlockingChannel::connect(&lost, &RpcConfig::default()).unwrap();
        let outcome = channel.call(&Request::ListTables, Duration::from_secs(10));
        assert!(matches!(outcome, Err(RpcError::ConnectionLost(_))), "{outcome:?}");
        // The second one answers.
        let mut channel = BlockingChannel::connect(&lost, &RpcConfig::default()).unwrap();
        assert_eq!(channel.call(&Request::Ping, Duration::from_secs(10)).unwrap().0, Status::Ok);
    })
    .await;
    server.await.unwrap();
    blocking(|| {
        let refused = BlockingChannel::connect("127.0.0.1:1", &RpcConfig::default());
        assert!(matches!(refused, Err(RpcError::Connect(_))), "{refused:?}");
    })
    .await;
}

/// A hand-written peer: completes the handshake announcing `version`, then answers every
/// request with `answer` (raw bytes) and keeps the connection open.
async fn scripted_peer(version: u16, answer: &'static [u8]) -> String {
    use stratus_wire::{Hello, HELLO_BYTES};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut hello = [0u8; HELLO_BYTES];
                if stream.read_exact(&mut hello).await.is_err() {
                    return;
                }
                let status = if version == stratus_wire::PROTOCOL_VERSION {
                    Status::Ok
                } else {
                    Status::ProtocolVersionMismatch
                };
                let _ = stream.write_all(&Hello { version, status }.encode()).await;
                let mut request = [0u8; 256];
                while matches!(stream.read(&mut request).await, Ok(count) if count > 0) {
                    let _ = stream.write_all(answer).await;
                }
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_channel_refuses_a_peer_that_breaks_the_protocol() {
    // A length of 12 bytes, then a frame kind that does not exist.
    let garbage = scripted_peer(
        stratus_wire::PROTOCOL_VERSION,
        &[12, 0, 0, 0, 0xEE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    )
    .await;
    // A length over the frame limit.
    let oversized = scripted_peer(stratus_wire::PROTOCOL_VERSION, &[0xff, 0xff, 0xff, 0xff]).await;
    let other_version = scripted_peer(stratus_wire::PROTOCOL_VERSION + 1, b"").await;
    blocking(move || {
        for address in [garbage, oversized] {
            let mut channel = BlockingChannel::connect(&address, &RpcConfig::default()).unwrap();
            let outcome = channel.call(&Request::Ping, Duration::from_secs(10));
            assert!(matches!(outcome, Err(RpcError::Protocol(_))), "{outcome:?}");
        }
        let refused = BlockingChannel::connect(&other_version, &RpcConfig::default());
        assert!(
            matches!(refused, Err(RpcError::VersionMismatch { server_version }) if server_version == stratus_wire::PROTOCOL_VERSION + 1),
            "{refused:?}"
        );
    })
    .await;
}

/// Answers RETRY to everything, as a standby coordinator does.
struct StandbyService;

impl Service for StandbyService {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        encode_error_response(out, header.request_id, header.opcode_code, Status::Retry, "standby");
        Handled::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_call_passes_dead_addresses_and_standbys_to_the_active_one() {
    // A port nothing listens on: bound, then closed.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let standby_listener = TcpNetwork.bind("127.0.0.1:0").await.unwrap();
    let standby = standby_listener.local_address();
    let _standby = tokio::spawn(serve(standby_listener, Arc::new(StandbyService)));
    let (active, _active) = start_server().await;
    let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());

    // Whatever the order, the active one answers: RETRY is not taken as the answer while
    // another address may give one.
    for coordinators in [
        format!("{dead},{standby},{active}"),
        format!("{standby},{active},{dead}"),
        format!("{active},{dead},{standby}"),
    ] {
        for _ in 0..3 {
            let (status, _) = pool.call_coordinator(&coordinators, &Request::Ping).await.unwrap();
            assert_eq!(status, Status::Ok, "{coordinators}");
        }
    }
    // Only standbys (and a dead one): their RETRY is the answer, not the transport failure.
    let (status, _) =
        pool.call_coordinator(&format!("{dead},{standby}"), &Request::Ping).await.unwrap();
    assert_eq!(status, Status::Retry);
    // Only the dead one: its failure.
    assert!(pool.call_coordinator(&dead, &Request::Ping).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_that_takes_a_call_s_whole_time_is_tried_last_next_time() {
    // Accepts connections (the kernel does) but never answers the hello: a paused process.
    let paused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let paused_address = paused.local_addr().unwrap().to_string();
    let (active, _active) = start_server().await;
    let config = RpcConfig { request_timeout: Duration::from_millis(300), ..RpcConfig::default() };
    let pool = ChannelPool::new(Arc::new(TcpNetwork), config);
    let coordinators = format!("{paused_address},{active}");
    // The first call spends its whole time on the paused one; the active one is not tried
    // (no time left) and not blamed, so the next call starts there.
    assert!(pool.call_coordinator(&coordinators, &Request::Ping).await.is_err());
    for _ in 0..3 {
        let (status, _) = pool.call_coordinator(&coordinators, &Request::Ping).await.unwrap();
        assert_eq!(status, Status::Ok);
    }
    drop(paused);
}

/// A TLS server (local CA certificates) and the client TLS that trusts it.
async fn start_tls_server(
    directory: &std::path::Path,
) -> (String, stratus_tls::ClientTls, tokio::task::JoinHandle<std::io::Result<()>>) {
    let (files, _) = stratus_tls::local_authority::ensure(directory, &[]).unwrap();
    let server = stratus_tls::ServerTls::load(stratus_tls::ServerTlsFiles {
        certificate: files.node_certificate.clone(),
        private_key: files.node_key.clone(),
        client_certificates: stratus_tls::ClientCertificates::NotAsked,
    })
    .unwrap();
    let client = stratus_tls::ClientTls::load(&stratus_tls::ClientTlsFiles {
        ca: files.ca_certificate.clone(),
        certificate_and_key: None,
    })
    .unwrap();
    let network = stratus_tls::TlsNetwork::new(Arc::new(TcpNetwork), Some(server), None);
    let listener = network.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    let service = Arc::new(TestService { handled: AtomicU64::new(0) });
    (address, client, tokio::spawn(serve(listener, service)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_and_blocking_channels_speak_tls_and_an_idle_tls_channel_stays_open() {
    let directory = tempfile::tempdir().unwrap();
    let (address, tls, _server) = start_tls_server(directory.path()).await;
    let network = stratus_tls::TlsNetwork::new(Arc::new(TcpNetwork), None, Some(tls.clone()));
    let channel = Channel::connect(&network, &address, &RpcConfig::default()).await.unwrap();
    let (status, _) = channel.call(&read_of(3 << 20), Duration::from_secs(10)).await.unwrap();
    assert_eq!(status, Status::Ok);
    // Without TLS the client is told the server speaks it.
    let plain = Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.unwrap_err();
    assert!(plain.to_string().contains("speaks TLS"), "{plain}");
    blocking(move || {
        let config = RpcConfig::default();
        let timeout = Duration::from_secs(10);
        let mut channel =
            BlockingChannel::connect_with_tls(&address, &config, timeout, Some(&tls)).unwrap();
        for bytes in [0, 100, 3 << 20, 10] {
            let (status, body) = channel.call(&read_of(bytes), timeout).unwrap();
            assert_eq!(status, Status::Ok);
            match body {
                ResponseBody::Operation(Response::Read { value, .. }) => {
                    assert_eq!(value.len(), bytes)
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // Idle past the idle check: nothing arrives unasked (no session tickets), so the
        // channel is still open and answers.
        std::thread::sleep(Duration::from_millis(50));
        assert!(channel.is_open());
        assert_eq!(channel.call(&Request::Ping, timeout).unwrap().0, Status::Ok);
    })
    .await;
}
