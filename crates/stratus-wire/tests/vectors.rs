//! The examples in docs/design/wire-protocol.md are test vectors: every `<!-- vector: NAME -->`
//! marker is followed by a ```hex block holding one whole handshake or frame. Each is decoded,
//! compared with the value built here for NAME, and re-encoded byte for byte, so the document
//! and the code cannot drift apart.

use bytes::{Bytes, BytesMut};
use stratus_types::{
    key_hash, HashRange, LeaseId, RejectRules, RpcId, SegmentId, ServerId, TableId, TabletState,
    Tier, TxDecision, TxOpKind, TxVote, Version,
};
use stratus_wire::{
    body_offset, decode_frame_header, decode_request, decode_response, encode_error_response,
    encode_request, encode_response, frame_length, BackupDurability, BackupServiceStatistics,
    BackupWriteFlags, EnumerationCursor, FrameKind, Hello, Opcode, RecoveryReplica,
    RecoverySegment, RecoveryTablet, ReplicaCertificate, ReplicaEntry, Request, Response,
    ResponseBody, Status, TableEntry, TabletEntry, TxDecisionOp, TxOp, TxVoteItem, WriteItem,
    HELLO_BYTES, PROTOCOL_VERSION,
};

const SPEC: &str = include_str!("../../../docs/design/wire-protocol.md");

/// What a vector must decode to.
enum Expected {
    Hello(Hello),
    Request { request_id: u64, request: Request },
    Response { request_id: u64, opcode: Opcode, status: Status, body: ResponseBody },
}

/// The op of table 1 whose key is `key`, with rpc id `rpc`, as transaction requests name it.
fn tx_op(key: &[u8], rpc: u64) -> TxDecisionOp {
    TxDecisionOp { table_id: TableId(1), key_hash: key_hash(TableId(1), key).0, rpc: RpcId(rpc) }
}

fn expected(name: &str) -> Expected {
    let ok = |request_id, response: Response| Expected::Response {
        request_id,
        opcode: response.opcode(),
        status: Status::Ok,
        body: ResponseBody::Operation(response),
    };
    match name {
        "hello" => Expected::Hello(Hello { version: PROTOCOL_VERSION, status: Status::Ok }),
        "hello-version-mismatch" => Expected::Hello(Hello {
            version: PROTOCOL_VERSION,
            status: Status::ProtocolVersionMismatch,
        }),
        "ping-request" => Expected::Request { request_id: 1, request: Request::Ping },
        "ping-response" => ok(1, Response::Ping),
        "read-request" => Expected::Request {
            request_id: 2,
            request: Request::Read {
                table_id: TableId(1),
                key: Bytes::from_static(b"hello"),
                rules: RejectRules::version_equals(Version(5)),
            },
        },
        "read-response-ok" => {
            let value = Bytes::from_static(b"world");
            ok(2, Response::Read { version: Version(5), value, expires_in_millis: 1_500 })
        }
        "read-response-object-doesnt-exist" => Expected::Response {
            request_id: 3,
            opcode: Opcode::Read,
            status: Status::ObjectDoesntExist,
            body: ResponseBody::Operation(Response::Read {
                version: Version::NONEXISTENT,
                value: Bytes::new(),
                expires_in_millis: 0,
            }),
        },
        "write-request" => Expected::Request {
            request_id: 4,
            request: Request::Write {
                table_id: TableId(1),
                key: Bytes::from_static(b"k"),
                value: Bytes::from_static(b"v1"),
                rules: RejectRules::create_only(),
                expiry: stratus_types::Expiry::AfterMillis(60_000),
                rpc: Some(stratus_types::RpcIdentity {
                    lease: stratus_types::LeaseId(7),
                    rpc: stratus_types::RpcId(12),
                    acknowledged: stratus_types::RpcId(10),
                }),
            },
        },
        "client-lease-request" => Expected::Request {
            request_id: 21,
            request: Request::ClientLease { lease: stratus_types::LeaseId(0) },
        },
        "client-lease-response" => {
            ok(21, Response::ClientLease { lease: stratus_types::LeaseId(7), term_ms: 30_000 })
        }
        "check-client-leases-request" => Expected::Request {
            request_id: 22,
            request: Request::CheckClientLeases {
                leases: vec![stratus_types::LeaseId(7), stratus_types::LeaseId(9)],
            },
        },
        "check-client-leases-response" => {
            ok(22, Response::CheckClientLeases { remaining_ms: vec![25_000, 0] })
        }
        "tx-prepare-request" => Expected::Request {
            request_id: 23,
            request: Request::TxPrepare {
                lease: LeaseId(7),
                acknowledged: RpcId(10),
                transaction: RpcId(12),
                validate_only: false,
                ops: vec![
                    TxOp {
                        table_id: TableId(1),
                        key: Bytes::from_static(b"a"),
                        rpc: RpcId(12),
                        kind: TxOpKind::Write,
                        version_read: Version(3),
                        value: Bytes::from_static(b"x"),
                    },
                    TxOp {
                        table_id: TableId(1),
                        key: Bytes::from_static(b"b"),
                        rpc: RpcId(13),
                        kind: TxOpKind::Read,
                        version_read: Version::NONEXISTENT,
                        value: Bytes::new(),
                    },
                ],
                participants: vec![tx_op(b"a", 12), tx_op(b"b", 13), tx_op(b"c", 14)],
            },
        },
        "tx-prepare-response" => ok(
            23,
            Response::TxPrepare {
                votes: vec![
                    TxVoteItem { status: Status::Ok, vote: TxVote::Prepared, version: Version(3) },
                    TxVoteItem {
                        status: Status::Retry,
                        vote: TxVote::Abort,
                        version: Version::NONEXISTENT,
                    },
                ],
            },
        ),
        "tx-decision-request" => Expected::Request {
            request_id: 24,
            request: Request::TxDecision {
                lease: LeaseId(7),
                acknowledged: RpcId(10),
                transaction: RpcId(12),
                decision: TxDecision::Commit,
                ops: vec![tx_op(b"a", 12), tx_op(b"b", 13)],
            },
        },
        "tx-decision-response" => {
            ok(24, Response::TxDecision { results: vec![Status::Ok, Status::UnknownTablet] })
        }
        "tx-request-abort-request" => Expected::Request {
            request_id: 25,
            request: Request::TxRequestAbort {
                lease: LeaseId(7),
                transaction: RpcId(12),
                ops: vec![tx_op(b"a", 12), tx_op(b"b", 13)],
            },
        },
        "tx-request-abort-response" => ok(
            25,
            Response::TxRequestAbort {
                votes: vec![
                    TxVoteItem { status: Status::Ok, vote: TxVote::Prepared, version: Version(3) },
                    TxVoteItem {
                        status: Status::Ok,
                        vote: TxVote::Abort,
                        version: Version::NONEXISTENT,
                    },
                ],
            },
        ),
        "increment-response" => ok(5, Response::Increment { version: Version(9), value: -2 }),
        "multi-write-request" => Expected::Request {
            request_id: 6,
            request: Request::MultiWrite {
                items: vec![
                    WriteItem {
                        table_id: TableId(1),
                        key: Bytes::from_static(b"a"),
                        value: Bytes::from_static(b"x"),
                        rules: RejectRules::NONE,
                        expiry: stratus_types::Expiry::Never,
                        rpc: None,
                    },
                    WriteItem {
                        table_id: TableId(2),
                        key: Bytes::from_static(b"b"),
                        value: Bytes::from_static(b"yz"),
                        rules: RejectRules::version_equals(Version(3)),
                        expiry: stratus_types::Expiry::Keep,
                        rpc: None,
                    },
                ],
            },
        },
        "enumerate-request" => Expected::Request {
            request_id: 7,
            request: Request::Enumerate {
                table_id: TableId(1),
                range: HashRange::FULL,
                cursor: EnumerationCursor {
                    reversed_hash: 1 << 63,
                    after_key: Some(Bytes::from_static(b"k")),
                },
                bytes_max: 65_536,
            },
        },
        "create-table-request" => Expected::Request {
            request_id: 8,
            request: Request::CreateTable {
                name: "users".to_string(),
                server_span: 4,
                tier: Tier::Flash,
            },
        },
        "list-tables-response" => ok(
            27,
            Response::ListTables {
                tables: vec![
                    TableEntry {
                        name: "users".to_string(),
                        table_id: TableId(1),
                        tablet_count: 2,
                        tier: Tier::Memory,
                    },
                    TableEntry {
                        name: "events".to_string(),
                        table_id: TableId(2),
                        tablet_count: 1,
                        tier: Tier::Flash,
                    },
                ],
            },
        ),
        "take-tablet-ownership-request" => Expected::Request {
            request_id: 26,
            request: Request::TakeTabletOwnership {
                master_id: ServerId(5),
                table_id: TableId(1),
                range: HashRange { start: 0, end: 0x7fff_ffff_ffff_ffff },
                assignment_epoch: 8,
                tier: Tier::Flash,
            },
        },
        "split-tablet-request" => Expected::Request {
            request_id: 10,
            request: Request::SplitTablet { name: "users".to_string(), split_hash: 1 << 63 },
        },
        "get-tablet-map-response" => ok(
            9,
            Response::GetTabletMap {
                tablets: vec![
                    TabletEntry {
                        table_id: TableId(1),
                        range: HashRange { start: 0, end: (1 << 63) - 1 },
                        owner: ServerId(1),
                        owner_address: "10.0.0.1:11100".to_string(),
                        state: TabletState::Normal,
                    },
                    TabletEntry {
                        table_id: TableId(1),
                        range: HashRange { start: 1 << 63, end: u64::MAX },
                        owner: ServerId(2),
                        owner_address: "10.0.0.2:11100".to_string(),
                        state: TabletState::Recovering,
                    },
                ],
            },
        ),
        "error-response-unknown-tablet" => Expected::Response {
            request_id: 10,
            opcode: Opcode::Read,
            status: Status::UnknownTablet,
            body: ResponseBody::Error { message: "tablet not owned".to_string() },
        },
        "backup-write-request" => Expected::Request {
            request_id: 11,
            request: Request::BackupWrite {
                master_id: ServerId(2),
                segment_id: SegmentId(3),
                epoch: 1,
                offset: 0,
                flags: BackupWriteFlags { open: true, close: false, primary: true },
                certificate: ReplicaCertificate { segment_length: 4, checksum: 0x0a0b_0c0d },
                data: Bytes::from_static(&[0x01, 0x20, 0x53, 0x47]),
            },
        },
        "backup-write-response-open-rejected" => Expected::Response {
            request_id: 11,
            opcode: Opcode::BackupWrite,
            status: Status::BackupOpenRejected,
            body: ResponseBody::Error { message: "no replica buffer free".to_string() },
        },
        "backup-free-request" => Expected::Request {
            request_id: 12,
            request: Request::BackupFree { master_id: ServerId(2), segment_id: SegmentId(3) },
        },
        "backup-list-replicas-request" => Expected::Request {
            request_id: 13,
            request: Request::BackupListReplicas { master_id: ServerId(2) },
        },
        "backup-list-replicas-response" => ok(
            13,
            Response::BackupListReplicas {
                replicas: vec![
                    ReplicaEntry {
                        master_id: ServerId(2),
                        segment_id: SegmentId(3),
                        epoch: 1,
                        certificate: ReplicaCertificate {
                            segment_length: 109,
                            checksum: 0xe582_93f4,
                        },
                        closed: true,
                        primary: true,
                    },
                    ReplicaEntry {
                        master_id: ServerId(2),
                        segment_id: SegmentId(4),
                        epoch: 2,
                        certificate: ReplicaCertificate {
                            segment_length: 64,
                            checksum: 0x0102_0304,
                        },
                        closed: false,
                        primary: false,
                    },
                ],
            },
        ),
        "backup-read-replica-request" => Expected::Request {
            request_id: 14,
            request: Request::BackupReadReplica {
                master_id: ServerId(2),
                segment_id: SegmentId(3),
            },
        },
        "backup-read-replica-response" => ok(
            14,
            Response::BackupReadReplica {
                epoch: 1,
                certificate: ReplicaCertificate { segment_length: 4, checksum: 0x0a0b_0c0d },
                closed: true,
                primary: false,
                data: Bytes::from_static(&[0x01, 0x20, 0x53, 0x47]),
            },
        ),
        "recover-tablets-request" => Expected::Request {
            request_id: 16,
            request: Request::RecoverTablets {
                master_id: ServerId(5),
                crashed_master: ServerId(2),
                tablets: vec![RecoveryTablet {
                    table_id: TableId(1),
                    range: HashRange { start: 0, end: 0x7fff_ffff_ffff_ffff },
                    creation_segment: SegmentId(0),
                    tier: Tier::Flash,
                }],
                backups: vec!["b:1".to_string()],
                segments: vec![
                    RecoverySegment {
                        segment_id: SegmentId(1),
                        replicas: vec![RecoveryReplica {
                            backup: 0,
                            epoch: 2,
                            length: 65_536,
                            primary: true,
                        }],
                    },
                    RecoverySegment {
                        segment_id: SegmentId(3),
                        replicas: vec![RecoveryReplica {
                            backup: 0,
                            epoch: 1,
                            length: 4_096,
                            primary: false,
                        }],
                    },
                ],
                assignment_epoch: 7,
            },
        },
        "renew-lease-request" => Expected::Request {
            request_id: 17,
            request: Request::RenewLease { server_id: ServerId(3) },
        },
        "renew-lease-response" => ok(17, Response::RenewLease { lease_ms: 750 }),
        "hint-server-crashed-request" => Expected::Request {
            request_id: 19,
            request: Request::HintServerCrashed { server_id: ServerId(4) },
        },
        "recovery-accept-loss-request" => Expected::Request {
            request_id: 20,
            request: Request::RecoveryAcceptLoss { server_id: ServerId(2) },
        },
        "recovery-accept-loss-response" => ok(20, Response::RecoveryAcceptLoss),
        "backup-fence-master-request" => Expected::Request {
            request_id: 18,
            request: Request::BackupFenceMaster { master_id: ServerId(2) },
        },
        "backup-start-partitioning-request" => Expected::Request {
            request_id: 21,
            request: Request::BackupStartPartitioning {
                master_id: ServerId(2),
                segments: vec![SegmentId(1), SegmentId(3)],
                partitions: [(0, 0x7fff_ffff_ffff_ffff), (0x8000_0000_0000_0000, u64::MAX)]
                    .map(|(start, end)| {
                        vec![RecoveryTablet {
                            table_id: TableId(1),
                            range: HashRange { start, end },
                            creation_segment: SegmentId(0),
                            tier: Tier::Flash,
                        }]
                    })
                    .to_vec(),
            },
        },
        "backup-start-partitioning-response" => {
            ok(21, Response::BackupStartPartitioning { replicas_to_partition: 1 })
        }
        "recover-tablets-response" => ok(
            16,
            Response::RecoverTablets {
                segments_replayed: 2,
                replica_bytes_read: 131_072,
                objects_replayed: 1000,
                creation_segment: SegmentId(7),
            },
        ),
        "backup-get-statistics-response" => ok(
            15,
            Response::BackupGetStatistics {
                statistics: BackupServiceStatistics {
                    durability: BackupDurability::Fsync,
                    replicas: 3,
                    replicas_open: 1,
                    buffers_in_use: 1,
                    buffer_count: 32,
                    frames_free: 509,
                    frame_count: 512,
                    disk_syncs: 10,
                    disk_write_jobs: 40,
                    disk_data_bytes_written: 1 << 20,
                    storage_failure: None,
                },
            },
        ),
        other => panic!("the spec has a vector {other:?} this test does not know"),
    }
}

/// Every (name, bytes) vector in the spec, in order.
fn vectors() -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let mut lines = SPEC.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .trim()
            .strip_prefix("<!-- vector:")
            .and_then(|rest| rest.strip_suffix("-->"))
            .map(str::trim)
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert_eq!(fence.trim(), "```hex", "vector {name} must be followed by a ```hex block");
        let mut bytes = Vec::new();
        for line in lines.by_ref() {
            if line.trim() == "```" {
                break;
            }
            let data = line.split('#').next().unwrap_or_default();
            for token in data.split_whitespace() {
                let byte = u8::from_str_radix(token, 16)
                    .unwrap_or_else(|_| panic!("vector {name}: bad hex byte {token:?}"));
                assert_eq!(token.len(), 2, "vector {name}: bytes are two hex digits");
                bytes.push(byte);
            }
        }
        found.push((name.to_string(), bytes));
    }
    found
}

fn check(name: &str, bytes: &[u8]) {
    match expected(name) {
        Expected::Hello(hello) => {
            let array: [u8; HELLO_BYTES] = bytes.try_into().expect("a hello is 8 bytes");
            assert_eq!(Hello::decode(&array), Ok(hello), "{name}");
            assert_eq!(hello.encode(), array, "{name}");
        }
        Expected::Request { request_id, request } => {
            assert_eq!(frame_length(bytes), Ok(Some(bytes.len())), "{name}");
            let header = decode_frame_header(bytes).unwrap();
            assert_eq!(header.kind, FrameKind::Request, "{name}");
            assert_eq!(header.request_id, request_id, "{name}");
            let body = Bytes::copy_from_slice(&bytes[body_offset(FrameKind::Request)..]);
            assert_eq!(decode_request(header.opcode_code, body).as_ref(), Ok(&request), "{name}");
            let mut out = BytesMut::new();
            encode_request(&mut out, request_id, &request);
            assert_eq!(&out[..], bytes, "{name} re-encodes identically");
        }
        Expected::Response { request_id, opcode, status, body } => {
            assert_eq!(frame_length(bytes), Ok(Some(bytes.len())), "{name}");
            let header = decode_frame_header(bytes).unwrap();
            assert_eq!(header.kind, FrameKind::Response, "{name}");
            assert_eq!(header.request_id, request_id, "{name}");
            assert_eq!(header.opcode_code, opcode.code(), "{name}");
            assert_eq!(header.status, status, "{name}");
            let raw = Bytes::copy_from_slice(&bytes[body_offset(FrameKind::Response)..]);
            assert_eq!(decode_response(opcode, status, raw).as_ref(), Ok(&body), "{name}");
            let mut out = BytesMut::new();
            match &body {
                ResponseBody::Operation(response) => {
                    encode_response(&mut out, request_id, status, response)
                }
                ResponseBody::Error { message } => {
                    encode_error_response(&mut out, request_id, opcode.code(), status, message)
                }
            }
            assert_eq!(&out[..], bytes, "{name} re-encodes identically");
        }
    }
}

#[test]
fn spec_vectors_decode_and_re_encode() {
    let vectors = vectors();
    for (name, bytes) in &vectors {
        check(name, bytes);
    }
    let names: Vec<&str> = vectors.iter().map(|(name, _)| name.as_str()).collect();
    for required in [
        "hello",
        "hello-version-mismatch",
        "ping-request",
        "ping-response",
        "read-request",
        "read-response-ok",
        "read-response-object-doesnt-exist",
        "write-request",
        "increment-response",
        "multi-write-request",
        "enumerate-request",
        "create-table-request",
        "list-tables-response",
        "split-tablet-request",
        "take-tablet-ownership-request",
        "get-tablet-map-response",
        "error-response-unknown-tablet",
        "backup-write-request",
        "backup-write-response-open-rejected",
        "backup-free-request",
        "backup-list-replicas-request",
        "backup-list-replicas-response",
        "backup-read-replica-request",
        "backup-read-replica-response",
        "backup-get-statistics-response",
        "tx-prepare-request",
        "tx-prepare-response",
        "tx-decision-request",
        "tx-decision-response",
        "tx-request-abort-request",
        "tx-request-abort-response",
    ] {
        assert!(names.contains(&required), "the spec lacks the vector {required}");
    }
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "vector names are unique");
}

/// The key-hash values pinned in the spec.
#[test]
fn spec_key_hash_values() {
    assert!(SPEC.contains("0x74b07ed397a89e92") && SPEC.contains("0x9e4c2be79747122e"));
    assert_eq!(key_hash(TableId(1), b"hello").0, 0x74b0_7ed3_97a8_9e92);
    assert_eq!(key_hash(TableId(42), b"k").0, 0x9e4c_2be7_9747_122e);
}

/// The status and opcode tables in the spec list every code with its number.
#[test]
fn spec_tables_list_every_code() {
    for status in Status::ALL {
        let row = format!("| {} | `{}` |", status.code(), upper_snake(&format!("{status:?}")));
        assert!(SPEC.contains(&row), "the spec's status table lacks {row}");
    }
    for opcode in Opcode::ALL {
        let row = format!("| {} | `{}` |", opcode.code(), upper_snake(&format!("{opcode:?}")));
        assert!(SPEC.contains(&row), "the spec's opcode table lacks {row}");
    }
}

/// `UnknownTablet` → `UNKNOWN_TABLET`.
fn upper_snake(camel: &str) -> String {
    let mut out = String::new();
    for (index, character) in camel.chars().enumerate() {
        if character.is_ascii_uppercase() && index > 0 {
            out.push('_');
        }
        out.push(character.to_ascii_uppercase());
    }
    out
}
