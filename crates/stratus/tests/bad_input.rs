//! Bad input gets a clear error status and never stops a server from serving others.

mod common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::TestCluster;
use stratus_client::{RejectRules, Status, TableId};
use stratus_types::{
    key_hash, HashRange, LeaseId, RpcId, SegmentId, ServerId, Tier, TxDecision, TxOpKind, TxVote,
    Version,
};
use stratus_wire::{
    body_offset, decode_frame_header, decode_response, encode_request, frame_length,
    EnumeratedObject, FrameKind, Hello, Opcode, RecoveryReplica, RecoverySegment, RecoveryTablet,
    Request, Response, ResponseBody, TxDecisionOp, TxOp, HELLO_BYTES, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn handshaken(address: &str) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(&Hello { version: PROTOCOL_VERSION, status: Status::Ok }.encode())
        .await
        .unwrap();
    let mut reply = [0u8; HELLO_BYTES];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!(Hello::decode(&reply).unwrap().status, Status::Ok);
    stream
}

/// Reads one response frame; returns (request id, status). `buffer` keeps bytes received past
/// that frame (several responses may arrive in one read) for the next call.
async fn read_response(stream: &mut TcpStream, buffer: &mut BytesMut) -> (u64, Status) {
    loop {
        if let Some(length) = frame_length(buffer).unwrap() {
            if buffer.len() >= length {
                let frame = buffer.split_to(length);
                let header = decode_frame_header(&frame).unwrap();
                assert_eq!(header.kind, FrameKind::Response);
                return (header.request_id, header.status);
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(buffer))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(read > 0, "connection closed before a response");
    }
}

/// True if the server closes the connection (bounded wait).
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_servers_keep_serving() {
    let cluster = TestCluster::start(1);
    let client = cluster.client();
    let table = client.create_table("strict", 1).await.unwrap();
    client.write(table, b"good", b"value").await.unwrap();
    let master = client.tablet_map(table).await.unwrap()[0].owner_address.clone();
    let owner = client.tablet_map(table).await.unwrap()[0].owner;

    // Client-side checks: keys that cannot be encoded or are empty.
    assert_eq!(client.write(table, b"", b"v").await.unwrap_err().status, Status::InvalidKey);
    assert_eq!(
        client.read(table, &vec![b'k'; 65_536]).await.unwrap_err().status,
        Status::InvalidKey
    );
    // The longest legal key works.
    client.write(table, &vec![b'k'; 65_535], b"v").await.unwrap();
    // Value over the server's limit (128 KiB in these tests).
    let too_big = Bytes::from(vec![0u8; 128 * 1024 + 1]);
    let error = client.write_with(table, b"big", too_big, RejectRules::NONE).await.unwrap_err();
    assert_eq!(error.status, Status::ValueTooLarge);
    // Unknown table.
    assert_eq!(
        client.read(TableId(424_242), b"k").await.unwrap_err().status,
        Status::TableDoesntExist
    );
    assert_eq!(client.get_table_id("nope").await.unwrap_err().status, Status::TableDoesntExist);
    assert_eq!(client.create_table("", 1).await.unwrap_err().status, Status::InvalidParameter);
    assert_eq!(client.create_table("zero", 0).await.unwrap_err().status, Status::InvalidParameter);

    // Server-side checks on raw frames.
    let mut stream = handshaken(&master).await;
    let mut received = BytesMut::new();
    let mut frame = BytesMut::new();
    encode_request(
        &mut frame,
        1,
        &Request::Read { table_id: table, key: Bytes::new(), rules: RejectRules::NONE },
    );
    encode_request(
        &mut frame,
        2,
        &Request::Read {
            table_id: TableId(77),
            key: Bytes::from_static(b"k"),
            rules: RejectRules::NONE,
        },
    );
    stream.write_all(&frame).await.unwrap();
    assert_eq!(read_response(&mut stream, &mut received).await, (1, Status::InvalidKey));
    assert_eq!(read_response(&mut stream, &mut received).await, (2, Status::UnknownTablet));
    // Unknown opcode, then a truncated body: clear statuses, connection stays usable.
    let mut unknown = BytesMut::new();
    encode_request(&mut unknown, 3, &Request::Ping);
    unknown[6..8].copy_from_slice(&999u16.to_le_bytes());
    stream.write_all(&unknown).await.unwrap();
    assert_eq!(read_response(&mut stream, &mut received).await, (3, Status::UnimplementedRequest));
    let mut truncated = BytesMut::new();
    encode_request(
        &mut truncated,
        4,
        &Request::Read {
            table_id: table,
            key: Bytes::from_static(b"good"),
            rules: RejectRules::NONE,
        },
    );
    let shortened = truncated.len() - 3;
    truncated.truncate(shortened);
    let length = (shortened - 4) as u32;
    truncated[0..4].copy_from_slice(&length.to_le_bytes());
    stream.write_all(&truncated).await.unwrap();
    assert_eq!(read_response(&mut stream, &mut received).await, (4, Status::RequestFormatError));

    // Recovery requests a master cannot act on: no tablet, a range it serves, a replica no
    // backup holds. Clear statuses; nothing of the master's own data changes.
    let mut recovery = BytesMut::new();
    let recover = |tablets| Request::RecoverTablets {
        master_id: owner,
        crashed_master: ServerId(999),
        tablets,
        backups: vec![master.clone()],
        segments: vec![RecoverySegment {
            segment_id: SegmentId(1),
            replicas: vec![RecoveryReplica { backup: 0, epoch: 1, length: 64, primary: true }],
        }],
        assignment_epoch: 1,
    };
    encode_request(&mut recovery, 10, &recover(Vec::new()));
    let owned = RecoveryTablet {
        table_id: table,
        range: HashRange::FULL,
        creation_segment: SegmentId(0),
        tier: Tier::Memory,
    };
    encode_request(&mut recovery, 11, &recover(vec![owned]));
    encode_request(
        &mut recovery,
        12,
        &Request::BackupGetRecoveryData {
            master_id: ServerId(999),
            segment_id: SegmentId(1),
            tablets: vec![owned],
        },
    );
    // Cutting replicas for a master the coordinator did not declare crashed (its replicas may
    // still change): refused.
    encode_request(
        &mut recovery,
        18,
        &Request::BackupStartPartitioning {
            master_id: ServerId(999),
            segments: vec![SegmentId(1)],
            partitions: vec![vec![owned]],
        },
    );
    stream.write_all(&recovery).await.unwrap();
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(read_response(&mut stream, &mut received).await);
    }
    answers.sort_unstable_by_key(|(request_id, _)| *request_id);
    assert_eq!(
        answers,
        vec![
            (10, Status::InvalidParameter),
            (11, Status::InvalidParameter),
            (12, Status::BackupBadSegmentId),
            (18, Status::InvalidParameter)
        ]
    );
    // Assignments and recoveries meant for another master (an earlier process at this
    // address): WRONG_SERVER, and this master takes nothing.
    let mut misaddressed = BytesMut::new();
    let other_table = TableId(table.0 + 1_000);
    encode_request(
        &mut misaddressed,
        13,
        &Request::TakeTabletOwnership {
            master_id: ServerId(owner.0 + 1_000),
            table_id: other_table,
            range: HashRange::FULL,
            assignment_epoch: u64::MAX,
            tier: Tier::Flash,
        },
    );
    let recovery_elsewhere = Request::RecoverTablets {
        master_id: ServerId(owner.0 + 1_000),
        crashed_master: ServerId(999),
        tablets: vec![RecoveryTablet { table_id: other_table, ..owned }],
        backups: vec![master.clone()],
        segments: vec![RecoverySegment {
            segment_id: SegmentId(1),
            replicas: vec![RecoveryReplica { backup: 0, epoch: 1, length: 64, primary: true }],
        }],
        assignment_epoch: 1,
    };
    encode_request(&mut misaddressed, 14, &recovery_elsewhere);
    let abandon = |master_id, table_id| Request::AbandonMigration {
        master_id,
        table_id,
        range: HashRange::FULL,
        assignment_epoch: u64::MAX,
    };
    encode_request(&mut misaddressed, 23, &abandon(ServerId(owner.0 + 1_000), table));
    stream.write_all(&misaddressed).await.unwrap();
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(read_response(&mut stream, &mut received).await);
    }
    answers.sort_unstable_by_key(|(request_id, _)| *request_id);
    assert_eq!(
        answers,
        vec![(13, Status::WrongServer), (14, Status::WrongServer), (23, Status::WrongServer)]
    );
    let statistics = client.server_statistics(&master).await.unwrap();
    assert_eq!(statistics.tablets_owned, 1, "only the table's own tablet");
    let objects_before = statistics.objects_live;
    // Migration requests this master cannot act on: a batch for a range it serves, a batch
    // with an object outside its range, a transfer of a range that is not one of its
    // tablets. Clear statuses, and the master still serves its tablet with its objects.
    let mut migration = BytesMut::new();
    let batch = |table_id, range, objects| Request::ReceiveMigrationData {
        table_id,
        range,
        assignment_epoch: u64::MAX,
        source: ServerId(999),
        transfer_id: 0,
        safe_version: Version(0),
        first: true,
        tier: Tier::Memory,
        objects,
        removed_keys: Vec::new(),
        completions: Vec::new(),
    };
    encode_request(&mut migration, 15, &batch(table, HashRange::FULL, Vec::new()));
    let stray = EnumeratedObject {
        key: Bytes::from_static(b"stray"),
        value: Bytes::from_static(b"v"),
        version: Version(1),
        expires_at: None,
    };
    let narrow = HashRange::new(0, 9).unwrap();
    encode_request(&mut migration, 16, &batch(other_table, narrow, vec![stray]));
    // A removed key outside the tablet, and an empty one: refused before anything is applied.
    for (request_id, removed) in [(19, &b"stray"[..]), (22, &b""[..])] {
        let mut removal = batch(other_table, narrow, Vec::new());
        if let Request::ReceiveMigrationData { removed_keys, .. } = &mut removal {
            removed_keys.push(Bytes::from_static(removed));
        }
        encode_request(&mut migration, request_id, &removal);
    }
    encode_request(
        &mut migration,
        17,
        &Request::TransferTablet {
            master_id: owner,
            table_id: table,
            range: narrow,
            assignment_epoch: u64::MAX,
            target: ServerId(999),
            target_address: master.clone(),
        },
    );
    // Abandoning a transfer of a range this master serves (no such transfer ran): answered,
    // and nothing of the served tablet is dropped.
    encode_request(&mut migration, 24, &abandon(owner, table));
    stream.write_all(&migration).await.unwrap();
    let mut answers = Vec::new();
    for _ in 0..6 {
        answers.push(read_response(&mut stream, &mut received).await);
    }
    answers.sort_unstable_by_key(|(request_id, _)| *request_id);
    assert_eq!(
        answers,
        vec![
            (15, Status::InvalidParameter),
            (16, Status::InvalidParameter),
            (17, Status::UnknownTablet),
            (19, Status::InvalidParameter),
            (22, Status::InvalidParameter),
            (24, Status::Ok)
        ]
    );
    let statistics = client.server_statistics(&master).await.unwrap();
    assert_eq!(statistics.tablets_owned, 1);
    assert_eq!(statistics.objects_live, objects_before, "the served tablet keeps its objects");
    // Lease and log-head requests for a server the coordinator does not know: told it is not
    // up (a master would stop serving).
    let mut coordinator = handshaken(&cluster.coordinator_address).await;
    let mut coordinator_received = BytesMut::new();
    let mut membership = BytesMut::new();
    encode_request(&mut membership, 20, &Request::RenewLease { server_id: ServerId(999) });
    encode_request(
        &mut membership,
        21,
        &Request::SetLogHead { server_id: ServerId(999), segment_id: SegmentId(1), epoch: 1 },
    );
    coordinator.write_all(&membership).await.unwrap();
    let mut answers = Vec::new();
    for _ in 0..2 {
        answers.push(read_response(&mut coordinator, &mut coordinator_received).await);
    }
    answers.sort_unstable_by_key(|(request_id, _)| *request_id);
    assert_eq!(answers, vec![(20, Status::ServerCrashed), (21, Status::ServerCrashed)]);

    // A frame claiming a huge length: REQUEST_TOO_LARGE for its request id, then the
    // connection closes.
    let mut huge = BytesMut::new();
    encode_request(&mut huge, 5, &Request::Ping);
    huge[0..4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    stream.write_all(&huge[..16]).await.unwrap();
    assert_eq!(read_response(&mut stream, &mut received).await, (5, Status::RequestTooLarge));
    assert!(closed_by_server(&mut stream).await);

    // Garbage instead of a handshake: the server hangs up.
    let mut garbage = TcpStream::connect(&master).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(closed_by_server(&mut garbage).await);

    // A wrong protocol version: told so, then disconnected.
    let mut old = TcpStream::connect(&master).await.unwrap();
    old.write_all(&Hello { version: PROTOCOL_VERSION + 1, status: Status::Ok }.encode())
        .await
        .unwrap();
    let mut reply = [0u8; HELLO_BYTES];
    old.read_exact(&mut reply).await.unwrap();
    let reply = Hello::decode(&reply).unwrap();
    assert_eq!(reply.status, Status::ProtocolVersionMismatch);
    assert_eq!(reply.version, PROTOCOL_VERSION);
    assert!(closed_by_server(&mut old).await);

    // The same checks against the coordinator's port.
    let mut garbage = TcpStream::connect(&cluster.coordinator_address).await.unwrap();
    garbage.write_all(&[0xff; 64]).await.unwrap();
    assert!(closed_by_server(&mut garbage).await);

    // Everything still works for well-behaved clients.
    let (value, _) = client.read(table, b"good").await.unwrap();
    assert_eq!(&value[..], b"value");
    client.write(table, b"after", b"ok").await.unwrap();
    assert_eq!(client.list_tables().await.unwrap().len(), 1);
}

/// Reads one response frame and decodes its body as the answer to `opcode`.
async fn read_answer(
    stream: &mut TcpStream,
    buffer: &mut BytesMut,
    opcode: Opcode,
) -> (u64, Status, ResponseBody) {
    loop {
        if let Some(length) = frame_length(buffer).unwrap() {
            if buffer.len() >= length {
                let frame = buffer.split_to(length).freeze();
                let header = decode_frame_header(&frame).unwrap();
                let body = frame.slice(body_offset(FrameKind::Response)..);
                let decoded = decode_response(opcode, header.status, body).unwrap();
                return (header.request_id, header.status, decoded);
            }
        }
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(buffer))
            .await
            .expect("a response in time")
            .unwrap();
        assert!(read > 0, "connection closed before a response");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_stray_transaction_requests_get_clear_errors_and_lock_nothing() {
    let cluster = TestCluster::start(1);
    let client = cluster.client();
    let table = client.create_table("strict-tx", 1).await.unwrap();
    let version = client.write(table, b"good", b"value").await.unwrap();
    let master = client.tablet_map(table).await.unwrap()[0].owner_address.clone();
    let hash = key_hash(table, b"good").0;
    let op = TxOp {
        table_id: table,
        key: Bytes::from_static(b"good"),
        rpc: RpcId(5),
        kind: TxOpKind::Write,
        version_read: version,
        value: Bytes::from_static(b"stolen"),
    };
    let participant = TxDecisionOp { table_id: table, key_hash: hash, rpc: RpcId(5) };
    let prepare = |request_id, lease, participants: Vec<TxDecisionOp>, out: &mut BytesMut| {
        let request = Request::TxPrepare {
            lease: LeaseId(lease),
            acknowledged: RpcId(0),
            transaction: RpcId(5),
            validate_only: false,
            ops: vec![op.clone()],
            participants,
        };
        encode_request(out, request_id, &request);
    };
    let mut stream = handshaken(&master).await;
    let mut received = BytesMut::new();

    // A prepare without its participant list (nobody could finish it): refused as a whole.
    let mut frame = BytesMut::new();
    prepare(1, 77, Vec::new(), &mut frame);
    stream.write_all(&frame).await.unwrap();
    let (id, status, _) = read_answer(&mut stream, &mut received, Opcode::TxPrepare).await;
    assert_eq!((id, status), (1, Status::RequestFormatError));

    // A prepare under a lease the coordinator never granted: the op is refused, not locked.
    let mut frame = BytesMut::new();
    prepare(2, 424_242, vec![participant], &mut frame);
    stream.write_all(&frame).await.unwrap();
    match read_answer(&mut stream, &mut received, Opcode::TxPrepare).await {
        (2, Status::Ok, ResponseBody::Operation(Response::TxPrepare { votes })) => {
            assert_eq!(votes.len(), 1);
            assert_ne!(votes[0].status, Status::Ok, "{votes:?}");
            assert_eq!(votes[0].vote, TxVote::Abort, "{votes:?}");
        }
        other => panic!("{other:?}"),
    }

    // Decisions for ops nobody prepared (COMMIT here and on a table the master does not
    // serve), and a request to abort under lease 0: idempotent, refused per op, refused.
    let mut frame = BytesMut::new();
    let stray_table = TxDecisionOp { table_id: TableId(table.0 + 1_000), ..participant };
    let decision = Request::TxDecision {
        lease: LeaseId(424_243),
        acknowledged: RpcId(0),
        transaction: RpcId(5),
        decision: TxDecision::Commit,
        ops: vec![participant, stray_table],
    };
    encode_request(&mut frame, 3, &decision);
    stream.write_all(&frame).await.unwrap();
    match read_answer(&mut stream, &mut received, Opcode::TxDecision).await {
        (3, Status::Ok, ResponseBody::Operation(Response::TxDecision { results })) => {
            assert_eq!(results, [Status::Ok, Status::UnknownTablet]);
        }
        other => panic!("{other:?}"),
    }
    let mut frame = BytesMut::new();
    let abort = Request::TxRequestAbort {
        lease: LeaseId(0),
        transaction: RpcId(5),
        ops: vec![participant],
    };
    encode_request(&mut frame, 4, &abort);
    stream.write_all(&frame).await.unwrap();
    let (id, status, _) = read_answer(&mut stream, &mut received, Opcode::TxRequestAbort).await;
    assert_eq!((id, status), (4, Status::RequestFormatError));

    // Nothing was applied or left locked: the object reads and writes as before.
    // (A locked object would answer RETRY until the client's deadline.)
    let (value, read_version) = client.read(table, b"good").await.unwrap();
    assert_eq!((&value[..], read_version), (&b"value"[..], version));
    client.write(table, b"good", b"after").await.unwrap();
}
