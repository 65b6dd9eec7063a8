//! Cluster membership over loopback TCP: a server with a cluster secret serves every opcode to
//! connections that proved it and only client opcodes to the others; a wrong secret, a
//! replayed handshake and a server without a secret all fail, each with a clear reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use stratus_env::{Network, OsEntropy, TcpNetwork};
use stratus_rpc::{
    serve, serve_admitting, Admission, Channel, ClientNetwork, ClusterKey, Handled, MemberNetwork,
    Membership, RpcConfig, Service,
};
use stratus_wire::membership::{
    decode_member_verdict, MemberAnswer, MemberChallenge, PeerRole, ProofSide, MEMBER_ANSWER_BYTES,
    MEMBER_PREAMBLE_VERSION, MEMBER_VERDICT_BYTES,
};
use stratus_wire::{
    begin_request, decode_frame_header, encode_error_response, finish_frame, Access, FrameHeader,
    Hello, Opcode, Status, HELLO_BYTES, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECRET: &[u8] = b"a cluster secret for the membership tests";
const TIMEOUT: Duration = Duration::from_secs(5);

/// Answers every request with INVALID_PARAMETER and the message "reached", so a test can tell
/// a request the service saw from one the RPC layer refused.
struct Reached {
    handled: AtomicU64,
}

impl Service for Reached {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        self.handled.fetch_add(1, Ordering::Relaxed);
        encode_error_response(
            out,
            header.request_id,
            header.opcode_code,
            Status::InvalidParameter,
            "reached",
        );
        Handled::Done
    }
}

fn membership(secret: &[u8]) -> Arc<Membership> {
    Membership::new(ClusterKey::from_secret(secret).expect("key"), Arc::new(OsEntropy))
}

async fn start(admission: Admission) -> (String, Arc<Reached>) {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_address();
    let service = Arc::new(Reached { handled: AtomicU64::new(0) });
    tokio::spawn(serve_admitting(listener, service.clone(), admission));
    (address, service)
}

/// What a request that reaches the server's service is answered: [`Reached`]'s status, except
/// WHO_AM_I, which the RPC layer answers itself.
fn served(opcode: Opcode) -> Status {
    if opcode == Opcode::WhoAmI {
        Status::Ok
    } else {
        Status::InvalidParameter
    }
}

/// Sends `opcode` with an empty body and returns the response's status.
async fn status_of(channel: &Channel, opcode: Opcode) -> Status {
    let frame = channel
        .call_encoded(TIMEOUT, |out, request_id| {
            let start = begin_request(out, request_id, opcode);
            finish_frame(out, start).expect("an empty request fits");
        })
        .await
        .expect("an answer");
    decode_frame_header(&frame).expect("a response").status
}

#[tokio::test]
async fn members_reach_every_opcode_and_other_connections_only_client_ones() {
    let server_membership = membership(SECRET);
    let (address, service) = start(Admission::Members(server_membership.clone())).await;
    let member_network = MemberNetwork::new(Arc::new(TcpNetwork), membership(SECRET));
    let member =
        Channel::connect(&member_network, &address, &RpcConfig::default()).await.expect("member");
    let anonymous =
        Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.expect("anonymous");

    let mut member_only = 0;
    for opcode in Opcode::ALL {
        assert_eq!(status_of(&member, opcode).await, served(opcode), "{opcode:?}");
        let expected = match opcode.access() {
            Access::Client => served(opcode),
            Access::Member => {
                member_only += 1;
                Status::PermissionDenied
            }
        };
        assert_eq!(status_of(&anonymous, opcode).await, expected, "{opcode:?} anonymously");
    }
    // The server-to-server opcodes the issue names are among the refused ones.
    for opcode in [
        Opcode::EnlistServer,
        Opcode::BackupWrite,
        Opcode::BackupFenceMaster,
        Opcode::TakeTabletOwnership,
        Opcode::RecoverTablets,
        Opcode::BackupReadReplica,
        Opcode::BackupGetRecoveryData,
    ] {
        assert_eq!(opcode.access(), Access::Member, "{opcode:?}");
    }
    assert!(member_only >= 20, "only {member_only} member-only opcodes");
    // What the client library, the CLI, the RESP gateway and the Python client send must stay
    // open to connections without the secret (TX_REQUEST_ABORT: a client whose PREPARE answers
    // were lost asks for final votes).
    for opcode in [
        Opcode::Read,
        Opcode::Write,
        Opcode::MultiWrite,
        Opcode::Enumerate,
        Opcode::CreateTable,
        Opcode::GetTabletMap,
        Opcode::ClientLease,
        Opcode::TxPrepare,
        Opcode::TxDecision,
        Opcode::TxRequestAbort,
        Opcode::GetServerStatistics,
        Opcode::BackupGetStatistics,
    ] {
        assert_eq!(opcode.access(), Access::Client, "{opcode:?}");
    }
    assert_eq!(server_membership.requests_refused(), member_only);
    let reached = service.handled.load(Ordering::Relaxed);
    // WHO_AM_I, twice, never reached the service.
    assert_eq!(reached, 2 * Opcode::ALL.len() as u64 - member_only - 2);
    assert_eq!(server_membership.handshakes_refused(), 0);
}

#[tokio::test]
async fn a_server_without_a_secret_serves_everyone_and_refuses_to_authenticate() {
    let listener = TcpNetwork.bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_address();
    tokio::spawn(serve(listener, Arc::new(Reached { handled: AtomicU64::new(0) })));
    let anonymous =
        Channel::connect(&TcpNetwork, &address, &RpcConfig::default()).await.expect("anonymous");
    for opcode in Opcode::ALL {
        assert_eq!(status_of(&anonymous, opcode).await, served(opcode), "{opcode:?}");
    }
    let member_network = MemberNetwork::new(Arc::new(TcpNetwork), membership(SECRET));
    let error = Channel::connect(&member_network, &address, &RpcConfig::default())
        .await
        .expect_err("an open server cannot prove a secret");
    assert!(error.to_string().contains("has no cluster secret configured"), "{error}");
}

#[tokio::test]
async fn a_server_with_another_secret_is_not_trusted_and_does_not_learn_a_proof() {
    let server_membership = membership(SECRET);
    let (address, service) = start(Admission::Members(server_membership.clone())).await;
    let rogue_network =
        MemberNetwork::new(Arc::new(TcpNetwork), membership(b"the secret of another cluster"));
    let error = Channel::connect(&rogue_network, &address, &RpcConfig::default())
        .await
        .expect_err("the secrets differ");
    // The connector checks the acceptor's proof first: it never sends its own to a server
    // that does not hold the secret.
    assert!(error.to_string().contains("does not hold this cluster secret"), "{error}");
    wait_until(|| server_membership.handshakes_refused() == 1).await;
    assert_eq!(service.handled.load(Ordering::Relaxed), 0);
}

/// One connector's side of the preamble by hand: sends a challenge with `client_nonce`, reads
/// the answer, sends `proof_for(answer)` and returns the verdict, leaving the stream open.
async fn preamble_by_hand(
    address: &str,
    client_nonce: [u8; 32],
    proof_for: impl FnOnce(&MemberAnswer) -> [u8; 32],
) -> (Status, TcpStream) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let challenge =
        MemberChallenge { version: MEMBER_PREAMBLE_VERSION, role: PeerRole::Member, client_nonce };
    stream.write_all(&challenge.encode()).await.expect("challenge");
    let mut answer = [0u8; MEMBER_ANSWER_BYTES];
    stream.read_exact(&mut answer).await.expect("answer");
    let answer = MemberAnswer::decode(&answer).expect("an answer");
    assert_eq!(answer.status, Status::Ok);
    stream.write_all(&proof_for(&answer)).await.expect("proof");
    let mut verdict = [0u8; MEMBER_VERDICT_BYTES];
    stream.read_exact(&mut verdict).await.expect("verdict");
    (decode_member_verdict(&verdict).expect("a verdict"), stream)
}

#[tokio::test]
async fn a_wrong_proof_and_a_replayed_handshake_are_refused() {
    let server_membership = membership(SECRET);
    let (address, _service) = start(Admission::Members(server_membership.clone())).await;
    let key = ClusterKey::from_secret(SECRET).expect("key");
    let client_nonce = [0x5a; 32];

    // A genuine exchange, as an eavesdropper would record it: the challenge and the proof.
    let mut captured_proof = [0u8; 32];
    let (verdict, mut stream) = preamble_by_hand(&address, client_nonce, |answer| {
        captured_proof =
            key.prove(PeerRole::Member, ProofSide::Connector, &client_nonce, &answer.server_nonce);
        captured_proof
    })
    .await;
    assert_eq!(verdict, Status::Ok);
    let hello = Hello { version: PROTOCOL_VERSION, status: Status::Ok };
    stream.write_all(&hello.encode()).await.expect("hello");
    let mut welcome = [0u8; HELLO_BYTES];
    stream.read_exact(&mut welcome).await.expect("welcome");
    assert_eq!(Hello::decode(&welcome).expect("hello").status, Status::Ok);

    // The same bytes sent again: the server's nonce is new, so the old proof is wrong.
    let (verdict, _) = preamble_by_hand(&address, client_nonce, |_| captured_proof).await;
    assert_eq!(verdict, Status::AuthenticationFailed);

    // A proof under another secret.
    let other = ClusterKey::from_secret(b"a guess at the cluster secret").expect("key");
    let (verdict, _) = preamble_by_hand(&address, [1; 32], |answer| {
        other.prove(PeerRole::Member, ProofSide::Connector, &[1; 32], &answer.server_nonce)
    })
    .await;
    assert_eq!(verdict, Status::AuthenticationFailed);

    // The server's own proof reflected back as the connector's.
    let (verdict, _) = preamble_by_hand(&address, [2; 32], |answer| answer.server_proof).await;
    assert_eq!(verdict, Status::AuthenticationFailed);
    assert_eq!(server_membership.handshakes_refused(), 3);
}

async fn wait_until(condition: impl Fn() -> bool) {
    for _ in 0..500 {
        if condition() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met in 5 s");
}

#[tokio::test]
async fn with_a_client_password_a_connection_that_proves_nothing_may_only_ping() {
    let password = b"the client password of the tests";
    let client_key = ClusterKey::from_client_password(password).expect("key");
    let key = ClusterKey::from_secret(SECRET).expect("key");
    let server_membership = Membership::with_options(
        key,
        Some(client_key.clone()),
        Arc::new(OsEntropy),
        Duration::from_millis(10),
    );
    let (address, _service) = start(Admission::Members(server_membership.clone())).await;
    let config = RpcConfig::default();

    let anonymous = Channel::connect(&TcpNetwork, &address, &config).await.expect("anonymous");
    let client_network = ClientNetwork::new(Arc::new(TcpNetwork), client_key, Arc::new(OsEntropy));
    let client = Channel::connect(&client_network, &address, &config).await.expect("client");
    let member_network = MemberNetwork::new(Arc::new(TcpNetwork), membership(SECRET));
    let member = Channel::connect(&member_network, &address, &config).await.expect("member");
    for opcode in Opcode::ALL {
        let anonymous_expected = if opcode == Opcode::Ping {
            Status::InvalidParameter
        } else {
            Status::PermissionDenied
        };
        assert_eq!(status_of(&anonymous, opcode).await, anonymous_expected, "{opcode:?}");
        let client_expected = match opcode.access() {
            Access::Client => served(opcode),
            Access::Member => Status::PermissionDenied,
        };
        assert_eq!(status_of(&client, opcode).await, client_expected, "{opcode:?} as client");
        assert_eq!(status_of(&member, opcode).await, served(opcode), "{opcode:?}");
    }

    // A wrong password, and a password offered to a server that requires none.
    let wrong = ClusterKey::from_client_password(b"not the client password!").expect("key");
    let wrong_network = ClientNetwork::new(Arc::new(TcpNetwork), wrong, Arc::new(OsEntropy));
    let error = Channel::connect(&wrong_network, &address, &config).await.expect_err("wrong");
    assert!(error.to_string().contains("does not hold this client password"), "{error}");
    let (no_password_address, _) = start(Admission::Members(membership(SECRET))).await;
    let error =
        Channel::connect(&client_network, &no_password_address, &config).await.expect_err("none");
    assert!(error.to_string().contains("no client password configured"), "{error}");
    // The cluster secret is not the client password: a client cannot pass as a member.
    let as_member = ClientNetwork::new(
        Arc::new(TcpNetwork),
        ClusterKey::from_secret(SECRET).expect("key"),
        Arc::new(OsEntropy),
    );
    assert!(Channel::connect(&as_member, &address, &config).await.is_err());
}
