//! Hostile input: random bytes, truncations, trailing bytes, mutations and absurd lengths are
//! all refused with the right error, and nothing panics.

mod common;

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use stratus_types::limits::{FRAME_BYTES_MAX, MULTI_OP_ITEMS_MAX, TRANSACTION_OBJECTS_MAX};
use stratus_types::{HashRange, SegmentId, ServerId, TableId, Tier};
use stratus_wire::{
    decode_frame_header, decode_request, decode_response, encode_request, encode_response,
    frame_length, peek_request_identity, DecodeError, FrameError, Hello, Opcode, RecoveryReplica,
    RecoverySegment, RecoveryTablet, Request, Response, Status, TableEntry, REQUEST_HEADER_BYTES,
    RESPONSE_HEADER_BYTES,
};

fn request_body(request: &stratus_wire::Request) -> Bytes {
    let mut out = BytesMut::new();
    encode_request(&mut out, 1, request);
    out.freeze().slice(REQUEST_HEADER_BYTES..)
}

fn response_body(status: Status, response: &stratus_wire::Response) -> Bytes {
    let mut out = BytesMut::new();
    encode_response(&mut out, 1, status, response);
    out.freeze().slice(RESPONSE_HEADER_BYTES..)
}

fn with_suffix(body: &Bytes, suffix: &[u8]) -> Bytes {
    let mut longer = body.to_vec();
    longer.extend_from_slice(suffix);
    Bytes::from(longer)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random bodies for every opcode and status (and unknown opcodes): an answer, no panic.
    #[test]
    fn random_bodies_never_panic(bytes in vec(any::<u8>(), 0..160), code in any::<u16>()) {
        let body = Bytes::from(bytes);
        for opcode in Opcode::ALL {
            let _ = decode_request(opcode.code(), body.clone());
            for status in Status::ALL {
                let _ = decode_response(opcode, status, body.clone());
            }
        }
        match decode_request(code, body.clone()) {
            Err(DecodeError::UnknownOpcode(unknown)) => {
                prop_assert_eq!(unknown, code);
                prop_assert!(Opcode::from_code(code).is_none());
            }
            _ => prop_assert!(Opcode::from_code(code).is_some()),
        }
    }

    /// Random frames: the envelope functions answer, never panic.
    #[test]
    fn random_frames_never_panic(bytes in vec(any::<u8>(), 0..40)) {
        let _ = frame_length(&bytes);
        let _ = decode_frame_header(&bytes);
        let _ = peek_request_identity(&bytes);
        if let Ok(hello) = <[u8; 8]>::try_from(bytes.get(..8).unwrap_or(&[])) {
            let _ = Hello::decode(&hello);
        }
    }

    /// Every proper prefix of a valid request body is Truncated; any suffix is TrailingBytes.
    #[test]
    fn request_truncations_and_suffixes(
        request in common::request(),
        suffix in vec(any::<u8>(), 1..8),
    ) {
        let code = request.opcode().code();
        let body = request_body(&request);
        for cut in 0..body.len() {
            prop_assert_eq!(
                decode_request(code, body.slice(..cut)),
                Err(DecodeError::Truncated),
                "cut at {}", cut
            );
        }
        prop_assert_eq!(
            decode_request(code, with_suffix(&body, &suffix)),
            Err(DecodeError::TrailingBytes)
        );
    }

    /// Every proper prefix of a valid response body is Truncated; any suffix is TrailingBytes.
    #[test]
    fn response_truncations_and_suffixes(
        response in common::response(),
        status in common::operation_status(),
        suffix in vec(any::<u8>(), 1..8),
    ) {
        let opcode = response.opcode();
        let body = response_body(status, &response);
        for cut in 0..body.len() {
            prop_assert_eq!(
                decode_response(opcode, status, body.slice(..cut)),
                Err(DecodeError::Truncated),
                "cut at {}", cut
            );
        }
        prop_assert_eq!(
            decode_response(opcode, status, with_suffix(&body, &suffix)),
            Err(DecodeError::TrailingBytes)
        );
    }

    /// Error bodies behave the same way.
    #[test]
    fn error_body_truncations_and_suffixes(
        status in common::error_status(),
        message in "\\PC{0,32}",
        suffix in vec(any::<u8>(), 1..8),
    ) {
        let mut out = BytesMut::new();
        stratus_wire::encode_error_response(&mut out, 1, Opcode::Read.code(), status, &message);
        let body = out.freeze().slice(RESPONSE_HEADER_BYTES..);
        for cut in 0..body.len() {
            prop_assert_eq!(
                decode_response(Opcode::Read, status, body.slice(..cut)),
                Err(DecodeError::Truncated)
            );
        }
        prop_assert_eq!(
            decode_response(Opcode::Read, status, with_suffix(&body, &suffix)),
            Err(DecodeError::TrailingBytes)
        );
    }

    /// Valid encodings with one byte changed: decoded or refused, never a panic.
    #[test]
    fn mutated_encodings_never_panic(
        request in common::request(),
        response in common::response(),
        position in any::<usize>(),
        byte in any::<u8>(),
    ) {
        let mut body = request_body(&request).to_vec();
        if !body.is_empty() {
            let index = position % body.len();
            body[index] = byte;
        }
        let _ = decode_request(request.opcode().code(), Bytes::from(body));
        let mut body = response_body(Status::Ok, &response).to_vec();
        if !body.is_empty() {
            let index = position % body.len();
            body[index] = byte;
        }
        let _ = decode_response(response.opcode(), Status::Ok, Bytes::from(body));
    }
}

#[test]
fn huge_announced_lengths_are_too_large() {
    for announced in [u32::MAX, 0x8000_0000, (FRAME_BYTES_MAX - 3) as u32] {
        let mut frame = announced.to_le_bytes().to_vec();
        frame.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let expected = FrameError::TooLarge { announced_bytes: u64::from(announced) + 4 };
        assert_eq!(frame_length(&frame), Err(expected));
        assert_eq!(decode_frame_header(&frame), Err(expected));
        // The header is still readable, so the server can answer REQUEST_TOO_LARGE.
        assert_eq!(peek_request_identity(&frame), Some((1, 0)));
    }
}

#[test]
fn bad_magic_kind_and_flags() {
    assert_eq!(Hello::decode(b"HTTP/1.1"), Err(FrameError::BadMagic));
    assert_eq!(Hello::decode(b"stra\x01\x00\x00\x00"), Err(FrameError::BadMagic));
    let mut frame = BytesMut::new();
    encode_request(&mut frame, 1, &stratus_wire::Request::Ping);
    for kind in [0u8, 3, 0xff] {
        let mut bad = frame.to_vec();
        bad[4] = kind;
        assert_eq!(decode_frame_header(&bad), Err(FrameError::BadKind(kind)));
    }
    for flags in [1u8, 0x80, 0xff] {
        let mut bad = frame.to_vec();
        bad[5] = flags;
        assert_eq!(decode_frame_header(&bad), Err(FrameError::BadFlags(flags)));
    }
}

#[test]
fn field_domains_are_checked() {
    let read = stratus_wire::Request::Read {
        table_id: stratus_types::TableId(1),
        key: Bytes::from_static(b"k"),
        rules: stratus_types::RejectRules::NONE,
    };
    // Reject-rules flags with an undefined bit.
    let mut body = request_body(&read).to_vec();
    *body.last_mut().unwrap() = 0x10;
    assert_eq!(
        decode_request(Opcode::Read.code(), Bytes::from(body)),
        Err(DecodeError::InvalidField("reject rules flags"))
    );
    // A hash range with start > end (after the master id and the table id).
    let mut body = 3u64.to_le_bytes().to_vec();
    body.extend_from_slice(&7u64.to_le_bytes());
    body.extend_from_slice(&5u64.to_le_bytes());
    body.extend_from_slice(&4u64.to_le_bytes());
    assert_eq!(
        decode_request(Opcode::TakeTabletOwnership.code(), Bytes::from(body)),
        Err(DecodeError::InvalidField("hash range"))
    );
    // A service mask with an unknown bit (bit 3; bits 0..=2 are master, backup, unreplicated).
    let mut body = vec![0, 0];
    body.extend_from_slice(&8u32.to_le_bytes());
    assert_eq!(
        decode_request(Opcode::EnlistServer.code(), Bytes::from(body)),
        Err(DecodeError::InvalidField("service mask"))
    );
    // A failure domain over FAILURE_DOMAIN_BYTES_MAX (64) is refused; one at it is not.
    let enlistment = |domain_bytes: usize| {
        let mut body = vec![3, 0, b'a', b':', b'1'];
        body.extend_from_slice(&stratus_wire::ServiceMask::BACKUP.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&(domain_bytes as u16).to_le_bytes());
        body.extend_from_slice(&vec![b'r'; domain_bytes]);
        decode_request(Opcode::EnlistServer.code(), Bytes::from(body))
    };
    assert_eq!(enlistment(65), Err(DecodeError::InvalidField("failure domain")));
    assert!(enlistment(64).is_ok());
    // A crash hint or an accepted loss without its whole server id, or with bytes after it.
    for opcode in [Opcode::HintServerCrashed, Opcode::RecoveryAcceptLoss] {
        assert_eq!(
            decode_request(opcode.code(), Bytes::from_static(&[4, 0, 0, 0])),
            Err(DecodeError::Truncated)
        );
        assert_eq!(
            decode_request(opcode.code(), Bytes::from_static(&[4, 0, 0, 0, 0, 0, 0, 0, 9])),
            Err(DecodeError::TrailingBytes)
        );
    }
    // Backup write flags with an undefined bit (byte 28: after master, segment, epoch, offset).
    let write = stratus_wire::Request::BackupWrite {
        master_id: stratus_types::ServerId(1),
        segment_id: stratus_types::SegmentId(2),
        epoch: 3,
        offset: 0,
        flags: stratus_wire::BackupWriteFlags::default(),
        certificate: stratus_wire::ReplicaCertificate::default(),
        data: Bytes::new(),
    };
    let mut body = request_body(&write).to_vec();
    body[28] = 0x08;
    assert_eq!(
        decode_request(Opcode::BackupWrite.code(), Bytes::from(body)),
        Err(DecodeError::InvalidField("backup write flags"))
    );
    // A replica read whose data disagrees with its certificate, and replica flags with an
    // undefined bit.
    let read_replica = stratus_wire::Response::BackupReadReplica {
        epoch: 1,
        certificate: stratus_wire::ReplicaCertificate { segment_length: 2, checksum: 0 },
        closed: false,
        primary: false,
        data: Bytes::from_static(b"ab"),
    };
    let mut body = response_body(Status::Ok, &read_replica).to_vec();
    body[8] = 3;
    assert_eq!(
        decode_response(Opcode::BackupReadReplica, Status::Ok, Bytes::from(body)),
        Err(DecodeError::InvalidField("replica data length"))
    );
    let mut body = response_body(Status::Ok, &read_replica).to_vec();
    body[16] = 0x04;
    assert_eq!(
        decode_response(Opcode::BackupReadReplica, Status::Ok, Bytes::from(body)),
        Err(DecodeError::InvalidField("replica flags"))
    );
    // A name over the limit, and one that is not UTF-8.
    let mut body = 257u16.to_le_bytes().to_vec();
    body.extend_from_slice(&[b'a'; 257]);
    body.extend_from_slice(&1u32.to_le_bytes());
    assert_eq!(
        decode_request(Opcode::CreateTable.code(), Bytes::from(body)),
        Err(DecodeError::InvalidField("table name"))
    );
    let body = Bytes::from_static(&[2, 0, 0xc3, 0x28]);
    assert_eq!(decode_request(Opcode::GetTableId.code(), body), Err(DecodeError::InvalidUtf8));
    // Too many items for a multi-op.
    let count = (MULTI_OP_ITEMS_MAX + 1) as u32;
    assert_eq!(
        decode_request(Opcode::MultiWrite.code(), Bytes::copy_from_slice(&count.to_le_bytes())),
        Err(DecodeError::TooManyItems { count: u64::from(count), max: MULTI_OP_ITEMS_MAX as u64 })
    );
    // An unknown status inside a multi-op result.
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend_from_slice(&999u16.to_le_bytes());
    body.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(
        decode_response(Opcode::MultiWrite, Status::Ok, Bytes::from(body)),
        Err(DecodeError::InvalidField("status"))
    );
    // An over-long error message.
    let mut body = 1025u16.to_le_bytes().to_vec();
    body.extend_from_slice(&[b'x'; 1025]);
    assert_eq!(
        decode_response(Opcode::Read, Status::InternalError, Bytes::from(body)),
        Err(DecodeError::InvalidField("error message"))
    );
    // Statuses for decode errors.
    assert_eq!(DecodeError::UnknownOpcode(999).status(), Status::UnimplementedRequest);
    assert_eq!(DecodeError::Truncated.status(), Status::RequestFormatError);
    assert_eq!(DecodeError::InvalidUtf8.status(), Status::RequestFormatError);
}

/// Every message that carries a storage tier, built for `tier`: as a request body, or as the
/// body of an OK response.
fn with_tier(tier: Tier) -> Vec<(Opcode, bool, Bytes)> {
    let (table_id, range) = (TableId(7), HashRange::FULL);
    let recovery_tablet = RecoveryTablet { table_id, range, creation_segment: SegmentId(3), tier };
    let requests = [
        Request::CreateTable { name: "t".to_string(), server_span: 1, tier },
        Request::TakeTabletOwnership {
            master_id: ServerId(1),
            table_id,
            range,
            assignment_epoch: 9,
            tier,
        },
        Request::ReceiveMigrationData {
            table_id,
            range,
            assignment_epoch: 9,
            source: ServerId(2),
            transfer_id: 1,
            safe_version: stratus_types::Version(5),
            first: true,
            tier,
            objects: Vec::new(),
            removed_keys: Vec::new(),
            completions: Vec::new(),
        },
        Request::RecoverTablets {
            master_id: ServerId(1),
            crashed_master: ServerId(2),
            tablets: vec![recovery_tablet],
            backups: vec!["b:1".to_string()],
            segments: vec![RecoverySegment {
                segment_id: SegmentId(4),
                replicas: vec![RecoveryReplica { backup: 0, epoch: 1, length: 64, primary: true }],
            }],
            assignment_epoch: 9,
        },
        Request::BackupGetRecoveryData {
            master_id: ServerId(2),
            segment_id: SegmentId(4),
            tablets: vec![recovery_tablet],
        },
        Request::BackupStartPartitioning {
            master_id: ServerId(2),
            segments: vec![SegmentId(4)],
            partitions: vec![vec![recovery_tablet]],
        },
    ];
    let list = Response::ListTables {
        tables: vec![TableEntry { name: "t".to_string(), table_id, tablet_count: 1, tier }],
    };
    requests
        .iter()
        .map(|request| (request.opcode(), true, request_body(request)))
        .chain([(Opcode::ListTables, false, response_body(Status::Ok, &list))])
        .collect()
}

#[test]
fn an_unknown_tier_code_is_refused_in_every_message_that_carries_a_tier() {
    for ((opcode, is_request, memory), (_, _, flash)) in
        with_tier(Tier::Memory).into_iter().zip(with_tier(Tier::Flash))
    {
        // The two encodings differ in the tier byte alone.
        assert_eq!(memory.len(), flash.len(), "{opcode:?}");
        let differing: Vec<usize> = (0..memory.len()).filter(|&i| memory[i] != flash[i]).collect();
        assert_eq!(differing.len(), 1, "{opcode:?}: one tier byte");
        let at = differing[0];
        assert_eq!((memory[at], flash[at]), (Tier::Memory.code(), Tier::Flash.code()));
        for code in [3u8, 0x80, 0xff] {
            let mut body = memory.to_vec();
            body[at] = code;
            let decoded = if is_request {
                decode_request(opcode.code(), Bytes::from(body)).map(|_| ())
            } else {
                decode_response(opcode, Status::Ok, Bytes::from(body)).map(|_| ())
            };
            assert_eq!(decoded, Err(DecodeError::UnknownTier(code)), "{opcode:?}");
        }
    }
    // A server answers it as a malformed request, saying which codes it knows.
    let error = DecodeError::UnknownTier(9);
    assert_eq!(error.status(), Status::RequestFormatError);
    assert_eq!(error.to_string(), "unknown storage tier code 9 (known: 0 memory, 1 flash, 2 auto)");
}

/// The op named by table 1, key hash 5 and `rpc`.
fn tx_op_name(rpc: u64) -> stratus_wire::TxDecisionOp {
    stratus_wire::TxDecisionOp {
        table_id: stratus_types::TableId(1),
        key_hash: 5,
        rpc: stratus_types::RpcId(rpc),
    }
}

/// A TX_PREPARE of one op (lease 7, acknowledged 10, transaction 12) and its body, for the
/// byte surgery below. Body offsets: lease 0, acknowledged 8, transaction 16, validate-only
/// flag 24, count 25, then the op: table 29, key 37 ("k"), rpc 40, kind 48, version 49,
/// value 57 (4 + the value's length), then the participants: with a 1-byte value, count 62,
/// then the participant (the op itself): table 66, key hash 74, rpc 82.
fn tx_prepare(kind: stratus_types::TxOpKind, value: &'static [u8]) -> stratus_wire::Request {
    stratus_wire::Request::TxPrepare {
        lease: stratus_types::LeaseId(7),
        acknowledged: stratus_types::RpcId(10),
        transaction: stratus_types::RpcId(12),
        validate_only: false,
        ops: vec![stratus_wire::TxOp {
            table_id: stratus_types::TableId(1),
            key: Bytes::from_static(b"k"),
            rpc: stratus_types::RpcId(12),
            kind,
            version_read: stratus_types::Version(3),
            value: Bytes::from_static(value),
        }],
        participants: vec![tx_op_name(12)],
    }
}

/// [`tx_prepare`] of a read, as a read-only transaction's validation (no participants).
fn tx_validation() -> stratus_wire::Request {
    match tx_prepare(stratus_types::TxOpKind::Read, b"") {
        stratus_wire::Request::TxPrepare { lease, acknowledged, transaction, ops, .. } => {
            stratus_wire::Request::TxPrepare {
                lease,
                acknowledged,
                transaction,
                validate_only: true,
                ops,
                participants: Vec::new(),
            }
        }
        _ => unreachable!(),
    }
}

fn refused(opcode: Opcode, body: Vec<u8>) -> DecodeError {
    decode_request(opcode.code(), Bytes::from(body)).expect_err("refused")
}

#[test]
fn transaction_requests_that_cannot_be_right_are_refused() {
    use stratus_types::TxOpKind;
    let write = request_body(&tx_prepare(TxOpKind::Write, b"v")).to_vec();
    assert!(decode_request(Opcode::TxPrepare.code(), Bytes::from(write.clone())).is_ok());
    let patched = |at: usize, bytes: &[u8]| {
        let mut body = write.clone();
        body[at..at + bytes.len()].copy_from_slice(bytes);
        body
    };
    let invalid = DecodeError::InvalidField;
    assert_eq!(
        refused(Opcode::TxPrepare, patched(0, &0u64.to_le_bytes())),
        invalid("transaction lease")
    );
    assert_eq!(
        refused(Opcode::TxPrepare, patched(16, &0u64.to_le_bytes())),
        invalid("transaction id")
    );
    // A transaction the client says it has the result of already.
    assert_eq!(
        refused(Opcode::TxPrepare, patched(8, &12u64.to_le_bytes())),
        invalid("transaction id")
    );
    assert_eq!(refused(Opcode::TxPrepare, patched(24, &[2])), invalid("validate-only flag"));
    assert_eq!(
        refused(Opcode::TxPrepare, patched(40, &0u64.to_le_bytes())),
        invalid("transaction op rpc id")
    );
    assert_eq!(
        refused(Opcode::TxPrepare, patched(40, &10u64.to_le_bytes())),
        invalid("transaction op rpc id")
    );
    for kind in [0u8, 4, 0xff] {
        assert_eq!(
            refused(Opcode::TxPrepare, patched(48, &[kind])),
            invalid("transaction op kind")
        );
    }
    // A write may be empty, but a read or a remove carries no value.
    for kind in [TxOpKind::Read, TxOpKind::Remove] {
        assert_eq!(
            refused(Opcode::TxPrepare, patched(48, &[kind.code()])),
            invalid("transaction op value")
        );
    }
    assert!(decode_request(
        Opcode::TxPrepare.code(),
        request_body(&tx_prepare(TxOpKind::Write, b""))
    )
    .is_ok());
    // A validation carries reads only.
    assert_eq!(refused(Opcode::TxPrepare, patched(24, &[1])), invalid("validate-only op kind"));
    let validation = request_body(&tx_validation()).to_vec();
    assert!(decode_request(Opcode::TxPrepare.code(), Bytes::from(validation.clone())).is_ok());

    // Participants: exactly when not validate-only, each with an rpc id above acknowledged.
    let read = request_body(&tx_prepare(TxOpKind::Read, b"")).to_vec();
    let mut validation_with_participants = read.clone();
    validation_with_participants[24] = 1;
    assert_eq!(
        refused(Opcode::TxPrepare, validation_with_participants),
        invalid("transaction participants")
    );
    let mut prepare_without_participants = validation.clone();
    prepare_without_participants[24] = 0;
    assert_eq!(
        refused(Opcode::TxPrepare, prepare_without_participants),
        invalid("transaction participants")
    );
    for rpc in [0u64, 10] {
        assert_eq!(
            refused(Opcode::TxPrepare, patched(82, &rpc.to_le_bytes())),
            invalid("transaction op rpc id")
        );
    }
    let mut too_many_participants = write[..62].to_vec();
    too_many_participants.extend_from_slice(&(TRANSACTION_OBJECTS_MAX as u32 + 1).to_le_bytes());
    assert_eq!(
        refused(Opcode::TxPrepare, too_many_participants),
        DecodeError::TooManyItems {
            count: TRANSACTION_OBJECTS_MAX as u64 + 1,
            max: TRANSACTION_OBJECTS_MAX as u64
        }
    );

    // TX_DECISION: the same identity rules, and a decision byte of 1 or 2. Body offsets:
    // identity 0..24, decision 24, count 25, op: table 29, key hash 37, rpc 45.
    let decision = stratus_wire::Request::TxDecision {
        lease: stratus_types::LeaseId(7),
        acknowledged: stratus_types::RpcId(10),
        transaction: stratus_types::RpcId(12),
        decision: stratus_types::TxDecision::Abort,
        ops: vec![tx_op_name(13)],
    };
    let body = request_body(&decision).to_vec();
    let patched = |at: usize, bytes: &[u8]| {
        let mut patched = body.clone();
        patched[at..at + bytes.len()].copy_from_slice(bytes);
        patched
    };
    assert_eq!(
        refused(Opcode::TxDecision, patched(0, &0u64.to_le_bytes())),
        invalid("transaction lease")
    );
    assert_eq!(
        refused(Opcode::TxDecision, patched(8, &13u64.to_le_bytes())),
        invalid("transaction id")
    );
    for code in [0u8, 3] {
        assert_eq!(
            refused(Opcode::TxDecision, patched(24, &[code])),
            invalid("transaction decision")
        );
    }
    for rpc in [0u64, 10] {
        assert_eq!(
            refused(Opcode::TxDecision, patched(45, &rpc.to_le_bytes())),
            invalid("transaction op rpc id")
        );
    }

    // TX_REQUEST_ABORT: lease and transaction not 0, op rpc ids not 0, and no acknowledged
    // mark (rpc 1 is fine). Body offsets: lease 0, transaction 8, count 16, op: table 20, key
    // hash 28, rpc 36.
    let request_abort = stratus_wire::Request::TxRequestAbort {
        lease: stratus_types::LeaseId(7),
        transaction: stratus_types::RpcId(12),
        ops: vec![tx_op_name(1)],
    };
    let body = request_body(&request_abort).to_vec();
    assert_eq!(body.len(), 44);
    assert!(decode_request(Opcode::TxRequestAbort.code(), Bytes::from(body.clone())).is_ok());
    let patched = |at: usize, bytes: &[u8]| {
        let mut patched = body.clone();
        patched[at..at + bytes.len()].copy_from_slice(bytes);
        patched
    };
    let zero = 0u64.to_le_bytes();
    assert_eq!(refused(Opcode::TxRequestAbort, patched(0, &zero)), invalid("transaction lease"));
    assert_eq!(refused(Opcode::TxRequestAbort, patched(8, &zero)), invalid("transaction id"));
    assert_eq!(
        refused(Opcode::TxRequestAbort, patched(36, &zero)),
        invalid("transaction op rpc id")
    );
    let mut too_many_ops = body[..16].to_vec();
    too_many_ops.extend_from_slice(&((MULTI_OP_ITEMS_MAX + 1) as u32).to_le_bytes());
    assert_eq!(
        refused(Opcode::TxRequestAbort, too_many_ops),
        DecodeError::TooManyItems {
            count: MULTI_OP_ITEMS_MAX as u64 + 1,
            max: MULTI_OP_ITEMS_MAX as u64
        }
    );

    // Too many ops, for both (after the identity and the flag or decision byte).
    let mut body = request_body(&tx_prepare(TxOpKind::Write, b"v")).to_vec();
    body.truncate(25);
    body.extend_from_slice(&((MULTI_OP_ITEMS_MAX + 1) as u32).to_le_bytes());
    let too_many = DecodeError::TooManyItems {
        count: MULTI_OP_ITEMS_MAX as u64 + 1,
        max: MULTI_OP_ITEMS_MAX as u64,
    };
    assert_eq!(refused(Opcode::TxPrepare, body.clone()), too_many);
    body[24] = stratus_types::TxDecision::Commit.code();
    assert_eq!(refused(Opcode::TxDecision, body), too_many);
}

#[test]
fn transaction_responses_that_cannot_be_right_are_refused() {
    // A vote byte that is no vote, and an unknown status in a decision's results.
    for opcode in [Opcode::TxPrepare, Opcode::TxRequestAbort] {
        for vote in [0u8, 3] {
            let mut body = 1u32.to_le_bytes().to_vec();
            body.extend_from_slice(&Status::Ok.code().to_le_bytes());
            body.push(vote);
            body.extend_from_slice(&3u64.to_le_bytes());
            assert_eq!(
                decode_response(opcode, Status::Ok, Bytes::from(body)),
                Err(DecodeError::InvalidField("transaction vote"))
            );
        }
    }
    let mut body = 1u32.to_le_bytes().to_vec();
    body.extend_from_slice(&999u16.to_le_bytes());
    assert_eq!(
        decode_response(Opcode::TxDecision, Status::Ok, Bytes::from(body)),
        Err(DecodeError::InvalidField("status"))
    );
    let count = (MULTI_OP_ITEMS_MAX + 1) as u32;
    for opcode in [Opcode::TxPrepare, Opcode::TxDecision, Opcode::TxRequestAbort] {
        assert_eq!(
            decode_response(opcode, Status::Ok, Bytes::copy_from_slice(&count.to_le_bytes())),
            Err(DecodeError::TooManyItems {
                count: u64::from(count),
                max: MULTI_OP_ITEMS_MAX as u64
            })
        );
    }
}

/// RECOVER_TABLETS locates each segment's replicas by an index into its backups: an index
/// past the end, a primary flag other than 0 or 1, and more replicas for one segment than
/// allowed are refused, never read as some other backup.
#[test]
fn recovery_replicas_that_name_no_backup_are_refused() {
    let request = |backup: u16, replicas: usize| stratus_wire::Request::RecoverTablets {
        master_id: ServerId(1),
        crashed_master: ServerId(2),
        tablets: Vec::new(),
        backups: vec!["b:1".to_string(), "b:2".to_string()],
        segments: vec![RecoverySegment {
            segment_id: SegmentId(4),
            replicas: vec![
                RecoveryReplica { backup, epoch: 1, length: 64, primary: true };
                replicas
            ],
        }],
        assignment_epoch: 9,
    };
    let good = request(1, 1);
    assert_eq!(decode_request(Opcode::RecoverTablets.code(), request_body(&good)), Ok(good));
    let past_the_end = request_body(&request(2, 1)).to_vec();
    assert_eq!(
        refused(Opcode::RecoverTablets, past_the_end),
        DecodeError::InvalidField("replica's backup index")
    );
    // The primary flag is the byte before the assignment epoch.
    let mut bad_flag = request_body(&request(0, 1)).to_vec();
    let flag = bad_flag.len() - 9;
    assert_eq!(bad_flag[flag], 1);
    bad_flag[flag] = 2;
    assert_eq!(
        refused(Opcode::RecoverTablets, bad_flag),
        DecodeError::InvalidField("replica's primary flag")
    );
    let too_many = request_body(&request(0, 17)).to_vec();
    assert!(matches!(
        refused(Opcode::RecoverTablets, too_many),
        DecodeError::TooManyItems { count: 17, max: 16 }
    ));
}
