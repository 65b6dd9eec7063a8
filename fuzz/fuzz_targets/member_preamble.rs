//! The membership preamble fed arbitrary bytes: its decoders, and a server connection of a
//! process with a cluster secret. Nothing may panic or hang; whatever decodes re-encodes to the
//! same bytes; and the server writes a well-formed answer, verdict, hello and response frames,
//! in that order, and never a welcome after a wrong proof.
//!
//! The first input byte steers the stream: with its low bit set and a whole challenge after
//! it, the target splices in the right proof for that challenge (the server's nonce is
//! deterministic here: seeded entropy), so the fuzzer also reaches the frames a member sends.
//! For a named user's challenge (role 2) the proof goes after the name, and is right for the
//! user `fuzz`, whom every third server knows.

#![no_main]

#[path = "common/server_stream.rs"]
mod server_stream;

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use stratus_env::{Entropy, SeededEntropy};
use stratus_rpc::{
    user_client_proof, user_credentials, Admission, ClusterKey, Handled, Membership, Service,
    UserDirectory,
};
use stratus_wire::membership::{
    decode_member_verdict, encode_member_verdict, MemberAnswer, MemberChallenge, PeerRole,
    ProofSide, MEMBER_ANSWER_BYTES, MEMBER_CHALLENGE_BYTES, MEMBER_MAGIC, MEMBER_VERDICT_BYTES,
};
use stratus_wire::membership::MEMBER_USER_SALT_BYTES;
use stratus_wire::{
    encode_error_response, FrameHeader, Status, TableAccess, TableGrant, UserDirectorySnapshot,
    UserRecord,
};

const SECRET: &[u8] = b"the fuzzed cluster's secret";
const PASSWORD: &[u8] = b"the fuzzed cluster's client password";
const NONCE_SEED: u64 = 7;
const USER: &str = "fuzz";
const USER_PASSWORD: &[u8] = b"the fuzzed user's password";
const USER_SALT: [u8; MEMBER_USER_SALT_BYTES] = [9; MEMBER_USER_SALT_BYTES];
/// The role code of a named user's challenge.
const USER_ROLE: u8 = 2;

struct AnswerEverything;

impl Service for AnswerEverything {
    fn handle(&self, header: &FrameHeader, _body: Bytes, out: &mut BytesMut) -> Handled {
        encode_error_response(out, header.request_id, header.opcode_code, Status::Retry, "fuzz");
        Handled::Done
    }
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime"),
    );
}

fuzz_target!(|data: &[u8]| {
    check_decoders(data);
    let input = steer(data);
    let admission = admission(&input);
    let role = input.get(6).copied();
    let exchange = server_stream::exchange(input, Arc::new(AnswerEverything), admission);
    let output = RUNTIME.with(|runtime| runtime.borrow().block_on(exchange));
    check_output(&output, role);
});

fn check_decoders(data: &[u8]) {
    if let Some(bytes) = data.get(..MEMBER_CHALLENGE_BYTES) {
        let bytes: &[u8; MEMBER_CHALLENGE_BYTES] = bytes.try_into().expect("length");
        if let Ok(challenge) = MemberChallenge::decode(bytes) {
            assert_eq!(&challenge.encode(), bytes);
        }
    }
    if let Some(bytes) = data.get(..MEMBER_ANSWER_BYTES) {
        let bytes: &[u8; MEMBER_ANSWER_BYTES] = bytes.try_into().expect("length");
        if let Ok(answer) = MemberAnswer::decode(bytes) {
            assert_eq!(&answer.encode(), bytes);
        }
    }
    if let Some(bytes) = data.get(..MEMBER_VERDICT_BYTES) {
        let bytes: &[u8; MEMBER_VERDICT_BYTES] = bytes.try_into().expect("length");
        if let Ok(status) = decode_member_verdict(bytes) {
            assert_eq!(&encode_member_verdict(status), bytes);
        }
    }
}

/// The client password's key, derived once.
fn client_key() -> ClusterKey {
    static KEY: std::sync::OnceLock<ClusterKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| ClusterKey::from_client_password(PASSWORD).expect("long enough")).clone()
}

/// Derived once: the derivation is deliberately slow.
fn key() -> ClusterKey {
    static KEY: std::sync::OnceLock<ClusterKey> = std::sync::OnceLock::new();
    KEY.get_or_init(|| ClusterKey::from_secret(SECRET).expect("a long enough secret")).clone()
}

/// The stream to send: the input after its first byte, with the right proof spliced in after
/// the challenge when the first byte asks for it.
fn steer(data: &[u8]) -> Vec<u8> {
    let Some((&steering, rest)) = data.split_first() else { return Vec::new() };
    let challenge = rest.get(..MEMBER_CHALLENGE_BYTES);
    match challenge {
        Some(challenge) if steering & 1 == 1 && challenge[..4] == MEMBER_MAGIC => {
            let mut client_nonce = [0u8; 32];
            client_nonce.copy_from_slice(&challenge[8..]);
            // The server's first nonce: four draws of its seeded entropy, as Membership does.
            let entropy = SeededEntropy::new(NONCE_SEED);
            let mut server_nonce = [0u8; 32];
            for chunk in server_nonce.chunks_exact_mut(8) {
                chunk.copy_from_slice(&entropy.next_u64().to_le_bytes());
            }
            let after = &rest[MEMBER_CHALLENGE_BYTES..];
            if challenge[6] == USER_ROLE {
                // The name (its length byte, then its bytes), then the proof for user `fuzz`.
                let Some((&length, names)) = after.split_first() else { return rest.to_vec() };
                let Some(name) = names.get(..usize::from(length)) else { return rest.to_vec() };
                let name = String::from_utf8_lossy(name).into_owned();
                let Ok(proof) =
                    user_client_proof(USER_PASSWORD, &USER_SALT, &client_nonce, &server_nonce, &name)
                else {
                    return rest.to_vec();
                };
                let mut stream = rest[..MEMBER_CHALLENGE_BYTES + 1 + usize::from(length)].to_vec();
                stream.extend_from_slice(&proof);
                stream.extend_from_slice(&names[usize::from(length)..]);
                return stream;
            }
            // The role the challenge claims (an unknown one is refused before any proof).
            let role = match challenge[6] {
                1 => PeerRole::Client,
                _ => PeerRole::Member,
            };
            let key = if role == PeerRole::Client { client_key() } else { key() };
            let proof = key.prove(role, ProofSide::Connector, &client_nonce, &server_nonce);
            let mut stream = challenge.to_vec();
            stream.extend_from_slice(&proof);
            stream.extend_from_slice(after);
            stream
        }
        _ => rest.to_vec(),
    }
}

/// The user directory every third server serves: the user `fuzz`, reading every table.
fn users() -> UserDirectorySnapshot {
    static USERS: std::sync::OnceLock<UserDirectorySnapshot> = std::sync::OnceLock::new();
    USERS
        .get_or_init(|| UserDirectorySnapshot {
            version: 1,
            next_table_id: stratus_types::TableId(2),
            users: vec![UserRecord {
                name: USER.to_string(),
                enabled: true,
                credentials: Some(user_credentials(USER_PASSWORD, USER_SALT).expect("valid")),
                grants: vec![TableGrant { pattern: "*".to_string(), access: TableAccess::READ }],
            }],
            tables: Vec::new(),
        })
        .clone()
}

/// A server with a cluster secret (and, for every other input, a client password; with one,
/// every third also serves named users).
fn admission(input: &[u8]) -> Admission {
    let client_key = (input.len() % 2 == 0).then(client_key);
    let serves_users = client_key.is_some() && input.len() % 3 == 0;
    let nonces = Arc::new(SeededEntropy::new(NONCE_SEED));
    let membership = Membership::with_options(key(), client_key, nonces, Duration::ZERO);
    if serves_users {
        let directory = Arc::new(UserDirectory::new());
        directory.install(users());
        membership.serve_users(directory);
    }
    Admission::Members(membership)
}

/// Checks what the server wrote, given the role byte the input's challenge claimed.
fn check_output(output: &[u8], role: Option<u8>) {
    let mut rest = output;
    if rest.starts_with(&MEMBER_MAGIC) {
        let answer: &[u8; MEMBER_ANSWER_BYTES] =
            rest.get(..MEMBER_ANSWER_BYTES).and_then(|b| b.try_into().ok()).expect("whole answer");
        let answer = MemberAnswer::decode(answer).expect("the server's answer decodes");
        rest = &rest[MEMBER_ANSWER_BYTES..];
        if answer.status == Status::Ok && role == Some(USER_ROLE) {
            // A named user's answer carries the user's salt.
            assert!(rest.len() >= MEMBER_USER_SALT_BYTES, "an answer without its salt");
            rest = &rest[MEMBER_USER_SALT_BYTES..];
        }
        if answer.status != Status::Ok || rest.is_empty() {
            assert!(rest.is_empty(), "bytes after a refusal or before a proof");
            return;
        }
        let verdict: &[u8; MEMBER_VERDICT_BYTES] =
            rest.get(..MEMBER_VERDICT_BYTES).and_then(|b| b.try_into().ok()).expect("verdict");
        let verdict = decode_member_verdict(verdict).expect("the server's verdict decodes");
        rest = &rest[MEMBER_VERDICT_BYTES..];
        if verdict != Status::Ok {
            assert!(rest.is_empty(), "a welcome after a wrong proof");
            return;
        }
    }
    server_stream::check_hello_and_frames(rest);
}
