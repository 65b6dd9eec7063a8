//! The backup RPCs end to end over loopback TCP through `stratus_rpc`: open, append, close,
//! list, read and free; the out-of-buffers refusal; a malformed request; and the router that
//! serves the backup beside another service on one port.

mod common;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use common::segment;
use stratus_backup::{BackupConfig, BackupRouter, BackupService, Durability, MemoryStorage};
use stratus_env::{Network, TcpNetwork};
use stratus_rpc::{serve, Channel, Handled, RpcConfig, Service};
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{
    encode_error_response, BackupWriteFlags, FrameHeader, Request, Response, ResponseBody, Status,
};

/// Bound on every call, so a broken server fails the test instead of hanging it.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

async fn start(service: Arc<dyn Service>) -> Channel {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    tokio::spawn(serve(listener, service));
    Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.unwrap()
}

fn backup(durability: Durability, buffer_count: usize) -> Arc<BackupService> {
    let mut config = BackupConfig::new(1 << 20);
    config.frame_count = 8;
    config.buffer_count = buffer_count;
    config.durability = durability;
    let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
    Arc::new(BackupService::open(config, storage).unwrap().0)
}

fn write_request(built: &common::SegmentBuilder, from: u32, flags: BackupWriteFlags) -> Request {
    let write = built.write_from(from, flags);
    Request::BackupWrite {
        master_id: write.master_id,
        segment_id: write.segment_id,
        epoch: write.epoch,
        offset: write.offset,
        flags: write.flags,
        certificate: write.certificate,
        data: write.data,
    }
}

async fn expect_ok(channel: &Channel, request: &Request) -> Response {
    match channel.call(request, TIMEOUT).await.unwrap() {
        (Status::Ok, ResponseBody::Operation(response)) => response,
        other => panic!("{:?}: {other:?}", request.opcode()),
    }
}

async fn expect_status(channel: &Channel, request: &Request) -> (Status, String) {
    match channel.call(request, TIMEOUT).await.unwrap() {
        (status, ResponseBody::Error { message }) => (status, message),
        other => panic!("{:?}: expected an error, got {other:?}", request.opcode()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_life_cycle_over_rpc() {
    for durability in [Durability::Buffered, Durability::Fsync] {
        let channel = start(backup(durability, 2)).await;
        let mut built = segment(2, 3, 1);
        let open = BackupWriteFlags { open: true, close: false, primary: true };
        expect_ok(&channel, &write_request(&built, 0, open)).await;
        let mut sent = built.length();
        for index in 0..5 {
            built.append_object(format!("key {index}").as_bytes(), 300);
            expect_ok(&channel, &write_request(&built, sent, BackupWriteFlags::default())).await;
            sent = built.length();
        }
        let close = BackupWriteFlags { open: false, close: true, primary: false };
        expect_ok(&channel, &write_request(&built, sent, close)).await;
        let listed =
            expect_ok(&channel, &Request::BackupListReplicas { master_id: ServerId(0) }).await;
        let Response::BackupListReplicas { replicas } = listed else { panic!("{listed:?}") };
        assert_eq!(replicas.len(), 1);
        assert_eq!(replicas[0].segment_id, SegmentId(3));
        assert_eq!(replicas[0].certificate, built.certificate());
        assert!(replicas[0].closed && replicas[0].primary);
        let read = Request::BackupReadReplica { master_id: ServerId(2), segment_id: SegmentId(3) };
        let Response::BackupReadReplica { data, certificate, closed, .. } =
            expect_ok(&channel, &read).await
        else {
            panic!("unexpected response")
        };
        assert_eq!(data, built.bytes, "{durability}");
        assert_eq!(certificate, built.certificate());
        assert!(closed);
        let free = Request::BackupFree { master_id: ServerId(2), segment_id: SegmentId(3) };
        expect_ok(&channel, &free).await;
        expect_ok(&channel, &free).await;
        let (status, _) = expect_status(&channel, &read).await;
        assert_eq!(status, Status::BackupBadSegmentId);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_buffers_is_refused_with_a_clear_status() {
    let channel = start(backup(Durability::Buffered, 2)).await;
    let open = BackupWriteFlags { open: true, close: false, primary: false };
    expect_ok(&channel, &write_request(&segment(4, 1, 2), 0, open)).await;
    expect_ok(&channel, &write_request(&segment(4, 2, 2), 0, open)).await;
    let (status, message) =
        expect_status(&channel, &write_request(&segment(4, 3, 2), 0, open)).await;
    assert_eq!(status, Status::BackupOpenRejected);
    assert!(message.contains("buffers"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_foreign_requests_are_answered() {
    let channel = start(backup(Durability::Fsync, 2)).await;
    // A BACKUP_WRITE body cut short: 20 bytes of its 45-byte minimum.
    let response = channel
        .call_encoded(TIMEOUT, |out, request_id| {
            let start =
                stratus_wire::begin_request(out, request_id, stratus_wire::Opcode::BackupWrite);
            out.extend_from_slice(&[0u8; 20]);
            stratus_wire::finish_frame(out, start).unwrap();
        })
        .await
        .unwrap();
    let header = stratus_wire::decode_frame_header(&response).unwrap();
    assert_eq!(header.status, Status::RequestFormatError);
    // A master request sent to a backup alone.
    let read = Request::GetServerStatistics;
    let (status, _) = expect_status(&channel, &read).await;
    assert_eq!(status, Status::UnimplementedRequest);
    expect_ok(&channel, &Request::Ping).await;
}

/// Stands in for the master: answers every request with WRONG_SERVER, so the test sees which
/// service handled it.
struct NotTheBackup;

impl Service for NotTheBackup {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        encode_error_response(
            out,
            header.request_id,
            header.opcode_code,
            Status::WrongServer,
            "master",
        );
        Handled::Done
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_serves_backup_and_master_on_one_port() {
    let router = BackupRouter::new(backup(Durability::Buffered, 2), Arc::new(NotTheBackup));
    let channel = start(Arc::new(router)).await;
    let listed = expect_ok(&channel, &Request::BackupListReplicas { master_id: ServerId(0) }).await;
    assert_eq!(listed, Response::BackupListReplicas { replicas: Vec::new() });
    let Response::BackupGetStatistics { statistics } =
        expect_ok(&channel, &Request::BackupGetStatistics).await
    else {
        panic!("unexpected response")
    };
    assert_eq!(statistics.durability, stratus_wire::BackupDurability::Buffered);
    assert_eq!((statistics.buffer_count, statistics.frame_count), (2, 8));
    assert_eq!(statistics.storage_failure, None);
    let (status, message) = expect_status(&channel, &Request::Ping).await;
    assert_eq!((status, message.as_str()), (Status::WrongServer, "master"));
}

/// BACKUP_GET_RECOVERY_DATA sends a verifiable segment holding the header and exactly the
/// objects whose key hash lies in the partition.
#[tokio::test]
async fn recovery_data_holds_exactly_the_partition() {
    let channel = start(backup(Durability::Buffered, 4)).await;
    let built = segment(2, 3, 40);
    expect_ok(
        &channel,
        &write_request(&built, 0, BackupWriteFlags { open: true, close: true, primary: false }),
    )
    .await;
    let lower_half = stratus_types::HashRange { start: 0, end: u64::MAX / 2 };
    let request = Request::BackupGetRecoveryData {
        master_id: ServerId(2),
        segment_id: SegmentId(3),
        tablets: vec![stratus_wire::RecoveryTablet {
            table_id: stratus_types::TableId(1),
            range: lower_half,
            creation_segment: stratus_types::SegmentId(0),
            tier: stratus_types::Tier::Memory,
        }],
    };
    let Response::BackupGetRecoveryData { certificate, data } = expect_ok(&channel, &request).await
    else {
        panic!("wrong response");
    };
    let certificate = stratus_log::Certificate {
        segment_length: certificate.segment_length,
        checksum: certificate.checksum,
    };
    stratus_log::verify_replica(&data, &certificate, ServerId(2), SegmentId(3)).unwrap();
    let kept: Vec<Vec<u8>> = stratus_log::SegmentIterator::new(&data, &certificate)
        .unwrap()
        .filter_map(|entry| match entry.unwrap().entry {
            stratus_log::Entry::Object(object) => Some(object.key.to_vec()),
            _ => None,
        })
        .collect();
    let expected: Vec<Vec<u8>> = (0..40)
        .map(|index| format!("key-2-3-{index}").into_bytes())
        .filter(|key| lower_half.contains(stratus_types::key_hash(stratus_types::TableId(1), key)))
        .collect();
    assert!(!expected.is_empty() && expected.len() < 40, "the partition splits the keys");
    assert_eq!(kept, expected);
    // A replica the backup does not hold.
    let missing = Request::BackupGetRecoveryData {
        master_id: ServerId(2),
        segment_id: SegmentId(99),
        tablets: Vec::new(),
    };
    assert_eq!(expect_status(&channel, &missing).await.0, Status::BackupBadSegmentId);
}

/// Every recovery-data answer for (segment, partition), in that order.
async fn recovery_answers(
    channel: &Channel,
    segments: &[u64],
    partitions: &[Vec<stratus_wire::RecoveryTablet>],
) -> Vec<Response> {
    let mut answers = Vec::new();
    for &segment in segments {
        for tablets in partitions {
            let request = Request::BackupGetRecoveryData {
                master_id: ServerId(2),
                segment_id: SegmentId(segment),
                tablets: tablets.clone(),
            };
            answers.push(expect_ok(channel, &request).await);
        }
    }
    answers
}

/// Two halves of table 1 (one partition each) and a backup holding replicas of master 2:
/// segments 3 and 4 primary, 5 not. Returns the backup and its channel.
async fn partitioned_backup(
    partitioned_bytes_max: usize,
) -> (Arc<BackupService>, Channel, Vec<Vec<stratus_wire::RecoveryTablet>>) {
    let mut config = BackupConfig::new(1 << 20);
    config.frame_count = 8;
    config.buffer_count = 4;
    config.recovery_partitioned_bytes_max = partitioned_bytes_max;
    let storage = Arc::new(MemoryStorage::new(config.geometry().total_bytes()));
    let backup = Arc::new(BackupService::open(config, storage).unwrap().0);
    let channel = start(backup.clone()).await;
    for (segment_id, primary) in [(3, true), (4, true), (5, false)] {
        let built = segment(2, segment_id, 30);
        let flags = BackupWriteFlags { open: true, close: true, primary };
        expect_ok(&channel, &write_request(&built, 0, flags)).await;
    }
    let half = |start, end| {
        vec![stratus_wire::RecoveryTablet {
            table_id: stratus_types::TableId(1),
            range: stratus_types::HashRange { start, end },
            creation_segment: SegmentId(0),
            tier: stratus_types::Tier::Flash,
        }]
    };
    let partitions = vec![half(0, u64::MAX / 2), half(u64::MAX / 2 + 1, u64::MAX)];
    (backup, channel, partitions)
}

async fn start_partitioning(
    channel: &Channel,
    partitions: &[Vec<stratus_wire::RecoveryTablet>],
) -> u32 {
    let request = Request::BackupStartPartitioning {
        master_id: ServerId(2),
        segments: [3, 4, 5, 99].map(SegmentId).to_vec(),
        partitions: partitions.to_vec(),
    };
    // Refused until the master is fenced: its replicas could still change under the cuts.
    let (status, message) = expect_status(channel, &request).await;
    assert_eq!(status, Status::InvalidParameter, "{message}");
    expect_ok(channel, &Request::BackupFenceMaster { master_id: ServerId(2) }).await;
    match expect_ok(channel, &request).await {
        Response::BackupStartPartitioning { replicas_to_partition } => replicas_to_partition,
        other => panic!("{other:?}"),
    }
}

/// BACKUP_START_PARTITIONING reads each primary replica once and cuts it into every
/// partition; the recovery-data answers are then those cuts, byte for byte what filtering on
/// demand gives, and whatever was not cut (a replica that is not primary, a part fetched
/// twice, a partition it was not told of) is still filtered on demand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_recovery_data_equals_filtering_on_demand() {
    let (backup, channel, partitions) =
        partitioned_backup(stratus_backup::RECOVERY_PARTITIONED_BYTES_MAX).await;
    let on_demand = recovery_answers(&channel, &[3, 4, 5], &partitions).await;
    assert_eq!(backup.statistics().recovery_parts_filtered_on_demand, 6);
    // The primaries of segments 3 and 4; 5 is not primary and 99 is not here.
    assert_eq!(start_partitioning(&channel, &partitions).await, 2);
    let cut = recovery_answers(&channel, &[3, 4, 5], &partitions).await;
    assert_eq!(cut, on_demand);
    let statistics = backup.statistics();
    assert_eq!(statistics.recovery_replicas_partitioned, 2);
    assert_eq!(statistics.recovery_parts_fetched, 4);
    assert_eq!(statistics.recovery_parts_filtered_on_demand, 8);
    // A part fetched before, and a partition the backup was not told of: on demand.
    let again = recovery_answers(&channel, &[3], &partitions[..1]).await;
    assert_eq!(again[..], on_demand[..1]);
    let whole = vec![stratus_wire::RecoveryTablet {
        table_id: stratus_types::TableId(1),
        range: stratus_types::HashRange { start: 0, end: u64::MAX },
        creation_segment: SegmentId(0),
        tier: stratus_types::Tier::Flash,
    }];
    recovery_answers(&channel, &[4], &[whole]).await;
    let statistics = backup.statistics();
    assert_eq!(statistics.recovery_parts_fetched, 4);
    assert_eq!(statistics.recovery_parts_filtered_on_demand, 10);
}

/// With no room for cuts (bound: 1 byte), the backup cuts one replica and pauses; a request
/// for a replica it has not cut then filters on demand instead of waiting, so no recovery
/// master can wait on a backup whose room is held by another's parts. Every answer is still
/// what filtering on demand gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_partitioning_answers_on_demand_rather_than_waiting() {
    let (backup, channel, partitions) = partitioned_backup(1).await;
    let on_demand = recovery_answers(&channel, &[3, 4], &partitions).await;
    assert_eq!(start_partitioning(&channel, &partitions).await, 2);
    // Segment 4 first: not cut yet (at most segment 3 is, which fills the room).
    let mut answers = recovery_answers(&channel, &[4], &partitions).await;
    let statistics = backup.statistics();
    assert_eq!(statistics.recovery_parts_fetched, 0);
    assert_eq!(statistics.recovery_parts_filtered_on_demand, 6);
    // Segment 3's parts were cut (the room holds one replica's cut, whatever its size).
    answers.splice(0..0, recovery_answers(&channel, &[3], &partitions).await);
    assert_eq!(answers, on_demand);
    assert_eq!(backup.statistics().recovery_parts_fetched, 2);
}
