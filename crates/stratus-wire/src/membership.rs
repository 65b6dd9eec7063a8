//! The membership preamble: how a coordinator or server proves to another that it holds the
//! cluster secret, and learns that the other holds it too, before the [`Hello`](crate::Hello).
//!
//! A connection that opens with [`MEMBER_MAGIC`] instead of the hello's `STRA` runs this
//! exchange first (little-endian, see docs/design/wire-protocol.md, "Membership preamble"):
//!
//! ```text
//! 1. connector -> acceptor  challenge: [b"STRM"][u16 version][u16 role][32 B client nonce]
//! 2. acceptor  -> connector answer:    [b"STRM"][u16 status][u16 reserved = 0][32 B server nonce]
//!                                      [32 B server proof]
//! 3. connector -> acceptor  proof:     [32 B client proof]
//! 4. acceptor  -> connector verdict:   [u16 status][u16 reserved = 0]
//! ```
//!
//! then the ordinary hello and frames. The role says what the connector claims to be: a cluster
//! member (proving the cluster secret) or a client (proving the client password). A proof is
//! HMAC-SHA-256, under the key of the claimed role, of a [`proof_transcript`]: a label naming
//! the role and which side proves, then both nonces. The acceptor's
//! nonce is fresh, so a recorded client proof answers no later challenge (a replay fails);
//! the connector's nonce is fresh, so a recorded server answer proves nothing to a later
//! connector; the labels differ, so one side's proof cannot be reflected back as the other's.
//! The MAC itself is computed outside this crate (stratus-rpc): this crate only fixes bytes.

use crate::frame::FrameError;
use crate::status::Status;

/// The four bytes that open a membership preamble (the hello opens with `STRA`).
pub const MEMBER_MAGIC: [u8; 4] = *b"STRM";

/// The preamble's own version; a change to any layout below bumps it.
pub const MEMBER_PREAMBLE_VERSION: u16 = 1;

/// Bytes of a nonce: 256 bits, so a nonce never repeats by chance.
pub const MEMBER_NONCE_BYTES: usize = 32;

/// Bytes of a proof: an HMAC-SHA-256 tag.
pub const MEMBER_PROOF_BYTES: usize = 32;

/// Size of the connector's challenge (step 1).
pub const MEMBER_CHALLENGE_BYTES: usize = 8 + MEMBER_NONCE_BYTES;

/// Size of the acceptor's answer (step 2).
pub const MEMBER_ANSWER_BYTES: usize = 8 + MEMBER_NONCE_BYTES + MEMBER_PROOF_BYTES;

/// Size of the connector's proof (step 3).
pub const MEMBER_CLIENT_PROOF_BYTES: usize = MEMBER_PROOF_BYTES;

/// Size of the acceptor's verdict (step 4).
pub const MEMBER_VERDICT_BYTES: usize = 4;

/// Labels that open a proof's transcript: the role, and which side proves (16 bytes each).
const MEMBER_CONNECTOR_LABEL: &[u8; 16] = b"stratus member c";
const MEMBER_ACCEPTOR_LABEL: &[u8; 16] = b"stratus member a";
const CLIENT_CONNECTOR_LABEL: &[u8; 16] = b"stratus client c";
const CLIENT_ACCEPTOR_LABEL: &[u8; 16] = b"stratus client a";
const USER_CONNECTOR_LABEL: &[u8; 16] = b"stratus user   c";
const USER_ACCEPTOR_LABEL: &[u8; 16] = b"stratus user   a";

/// Bytes a named user's answer carries after the common answer: the user's salt, which the
/// connector needs to derive its keys from the password.
pub const MEMBER_USER_SALT_BYTES: usize = crate::users::USER_SALT_BYTES;

/// What the connector claims to be. On the wire: a u16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerRole {
    /// A coordinator or server of the cluster, proving the cluster secret.
    Member = 0,
    /// A client, proving the client password.
    Client = 1,
    /// A client, proving a named user's password (SCRAM-style: the challenge names the user,
    /// the answer carries the user's salt).
    User = 2,
}

impl PeerRole {
    /// The wire code.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The role for a wire code, if it is one.
    pub fn from_code(code: u16) -> Option<PeerRole> {
        match code {
            0 => Some(PeerRole::Member),
            1 => Some(PeerRole::Client),
            2 => Some(PeerRole::User),
            _ => None,
        }
    }
}

/// Size of a proof's transcript.
pub const MEMBER_TRANSCRIPT_BYTES: usize = 16 + 2 * MEMBER_NONCE_BYTES;

/// A 256-bit nonce.
pub type MemberNonce = [u8; MEMBER_NONCE_BYTES];

/// An HMAC-SHA-256 tag.
pub type MemberProof = [u8; MEMBER_PROOF_BYTES];

/// Which side of the exchange a proof comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProofSide {
    /// The side that opened the connection.
    Connector,
    /// The side that accepted it.
    Acceptor,
}

/// The bytes a proof is the MAC of: `[16 B label][client nonce][server nonce]`.
pub fn proof_transcript(
    role: PeerRole,
    side: ProofSide,
    client_nonce: &MemberNonce,
    server_nonce: &MemberNonce,
) -> [u8; MEMBER_TRANSCRIPT_BYTES] {
    let label = match (role, side) {
        (PeerRole::Member, ProofSide::Connector) => MEMBER_CONNECTOR_LABEL,
        (PeerRole::Member, ProofSide::Acceptor) => MEMBER_ACCEPTOR_LABEL,
        (PeerRole::Client, ProofSide::Connector) => CLIENT_CONNECTOR_LABEL,
        (PeerRole::Client, ProofSide::Acceptor) => CLIENT_ACCEPTOR_LABEL,
        (PeerRole::User, ProofSide::Connector) => USER_CONNECTOR_LABEL,
        (PeerRole::User, ProofSide::Acceptor) => USER_ACCEPTOR_LABEL,
    };
    let mut transcript = [0u8; MEMBER_TRANSCRIPT_BYTES];
    transcript[..16].copy_from_slice(label);
    transcript[16..16 + MEMBER_NONCE_BYTES].copy_from_slice(client_nonce);
    transcript[16 + MEMBER_NONCE_BYTES..].copy_from_slice(server_nonce);
    transcript
}

/// The transcript of a named user's proofs: the common transcript, then the user name's
/// length (one byte) and the name, so a proof for one user is no proof for another.
pub fn user_proof_transcript(
    side: ProofSide,
    client_nonce: &MemberNonce,
    server_nonce: &MemberNonce,
    user: &str,
) -> Vec<u8> {
    let mut transcript =
        proof_transcript(PeerRole::User, side, client_nonce, server_nonce).to_vec();
    transcript.extend_from_slice(&encode_user_name(user));
    transcript
}

/// What follows a named user's challenge: the name's length in one byte, then the name.
/// The caller validated the name (at most `USER_NAME_BYTES_MAX` bytes).
pub fn encode_user_name(user: &str) -> Vec<u8> {
    debug_assert!(user.len() <= stratus_types::limits::USER_NAME_BYTES_MAX);
    let mut bytes = Vec::with_capacity(1 + user.len());
    bytes.push(u8::try_from(user.len()).unwrap_or(u8::MAX));
    bytes.extend_from_slice(user.as_bytes());
    bytes
}

/// Checks the name a challenge carries (its bytes, without the length byte).
pub fn decode_user_name(bytes: &[u8]) -> Result<String, FrameError> {
    let name = std::str::from_utf8(bytes)
        .map_err(|_| FrameError::BadPreamble("user name is not UTF-8"))?;
    crate::users::validate_user_name(name)
        .map_err(|_| FrameError::BadPreamble("invalid user name"))?;
    Ok(name.to_string())
}

/// Step 1: the connector's challenge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberChallenge {
    /// The connector's preamble version.
    pub version: u16,
    /// What the connector claims to be.
    pub role: PeerRole,
    /// Fresh for every connection.
    pub client_nonce: MemberNonce,
}

impl MemberChallenge {
    /// The challenge's bytes.
    pub fn encode(&self) -> [u8; MEMBER_CHALLENGE_BYTES] {
        let mut bytes = [0u8; MEMBER_CHALLENGE_BYTES];
        bytes[..4].copy_from_slice(&MEMBER_MAGIC);
        bytes[4..6].copy_from_slice(&self.version.to_le_bytes());
        bytes[6..8].copy_from_slice(&self.role.code().to_le_bytes());
        bytes[8..].copy_from_slice(&self.client_nonce);
        bytes
    }

    /// Parses a challenge; refuses a wrong magic or an unknown role. The version is returned
    /// as sent: whether it is acceptable is the acceptor's decision.
    pub fn decode(bytes: &[u8; MEMBER_CHALLENGE_BYTES]) -> Result<MemberChallenge, FrameError> {
        if bytes[..4] != MEMBER_MAGIC {
            return Err(FrameError::BadPreamble("does not start with \"STRM\""));
        }
        let role = PeerRole::from_code(u16::from_le_bytes([bytes[6], bytes[7]]))
            .ok_or(FrameError::BadPreamble("unknown role"))?;
        let mut client_nonce = [0u8; MEMBER_NONCE_BYTES];
        client_nonce.copy_from_slice(&bytes[8..]);
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        Ok(MemberChallenge { version, role, client_nonce })
    }
}

/// Step 2: the acceptor's answer. With a status other than OK (the acceptor has no cluster
/// secret, or speaks another preamble version) the nonce and proof are zero and the acceptor
/// closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberAnswer {
    /// OK, or why the acceptor refuses to authenticate.
    pub status: Status,
    /// Fresh for every connection.
    pub server_nonce: MemberNonce,
    /// The acceptor's proof over ([`ProofSide::Acceptor`], client nonce, server nonce).
    pub server_proof: MemberProof,
}

impl MemberAnswer {
    /// An answer that refuses, with `status`.
    pub fn refusal(status: Status) -> MemberAnswer {
        MemberAnswer {
            status,
            server_nonce: [0; MEMBER_NONCE_BYTES],
            server_proof: [0; MEMBER_PROOF_BYTES],
        }
    }

    /// The answer's bytes.
    pub fn encode(&self) -> [u8; MEMBER_ANSWER_BYTES] {
        let mut bytes = [0u8; MEMBER_ANSWER_BYTES];
        bytes[..4].copy_from_slice(&MEMBER_MAGIC);
        bytes[4..6].copy_from_slice(&self.status.code().to_le_bytes());
        bytes[8..8 + MEMBER_NONCE_BYTES].copy_from_slice(&self.server_nonce);
        bytes[8 + MEMBER_NONCE_BYTES..].copy_from_slice(&self.server_proof);
        bytes
    }

    /// Parses an answer; refuses a wrong magic, an unknown status or a nonzero reserved field.
    pub fn decode(bytes: &[u8; MEMBER_ANSWER_BYTES]) -> Result<MemberAnswer, FrameError> {
        if bytes[..4] != MEMBER_MAGIC {
            return Err(FrameError::BadPreamble("does not start with \"STRM\""));
        }
        let status = decode_status(bytes[4], bytes[5])?;
        if bytes[6..8] != [0, 0] {
            return Err(FrameError::BadPreamble("reserved field is not zero"));
        }
        let mut server_nonce = [0u8; MEMBER_NONCE_BYTES];
        server_nonce.copy_from_slice(&bytes[8..8 + MEMBER_NONCE_BYTES]);
        let mut server_proof = [0u8; MEMBER_PROOF_BYTES];
        server_proof.copy_from_slice(&bytes[8 + MEMBER_NONCE_BYTES..]);
        Ok(MemberAnswer { status, server_nonce, server_proof })
    }
}

/// Step 4: the acceptor's verdict on the connector's proof.
pub fn encode_member_verdict(status: Status) -> [u8; MEMBER_VERDICT_BYTES] {
    let [low, high] = status.code().to_le_bytes();
    [low, high, 0, 0]
}

/// Parses a verdict; refuses an unknown status or a nonzero reserved field.
pub fn decode_member_verdict(bytes: &[u8; MEMBER_VERDICT_BYTES]) -> Result<Status, FrameError> {
    if bytes[2..] != [0, 0] {
        return Err(FrameError::BadPreamble("reserved field is not zero"));
    }
    decode_status(bytes[0], bytes[1])
}

fn decode_status(low: u8, high: u8) -> Result<Status, FrameError> {
    let code = u16::from_le_bytes([low, high]);
    Status::from_code(code).ok_or(FrameError::UnknownStatus(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_and_answer_round_trip_and_refuse_bad_bytes() {
        let challenge = MemberChallenge {
            version: MEMBER_PREAMBLE_VERSION,
            role: PeerRole::Member,
            client_nonce: [7; 32],
        };
        let bytes = challenge.encode();
        assert_eq!(&bytes[..8], b"STRM\x01\x00\x00\x00");
        assert_eq!(MemberChallenge::decode(&bytes), Ok(challenge));
        let client = MemberChallenge { role: PeerRole::Client, ..challenge };
        assert_eq!(&client.encode()[..8], b"STRM\x01\x00\x01\x00");
        assert_eq!(MemberChallenge::decode(&client.encode()), Ok(client));
        let mut wrong = bytes;
        wrong[0] = b'X';
        assert!(matches!(MemberChallenge::decode(&wrong), Err(FrameError::BadPreamble(_))));
        let mut unknown_role = bytes;
        unknown_role[6] = 3;
        assert!(MemberChallenge::decode(&unknown_role).is_err());

        let answer =
            MemberAnswer { status: Status::Ok, server_nonce: [1; 32], server_proof: [2; 32] };
        let bytes = answer.encode();
        assert_eq!(MemberAnswer::decode(&bytes), Ok(answer));
        let mut unknown = bytes;
        unknown[4] = 0xff;
        unknown[5] = 0xff;
        assert_eq!(MemberAnswer::decode(&unknown), Err(FrameError::UnknownStatus(0xffff)));
        let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
        assert_eq!(MemberAnswer::decode(&refusal.encode()), Ok(refusal));
    }

    #[test]
    fn the_access_table_agrees_with_the_access_of_every_opcode() {
        use crate::message::{Access, Opcode};
        for code in 0..=u16::MAX {
            let expected = Opcode::from_code(code).map(Opcode::access);
            assert_eq!(Opcode::access_of_code(code), expected, "code {code}");
        }
        assert_eq!(Opcode::BackupWrite.access(), Access::Member);
        assert_eq!(Opcode::Read.access(), Access::Client);
    }

    #[test]
    fn verdicts_round_trip_and_transcripts_differ_by_side() {
        for status in [Status::Ok, Status::AuthenticationFailed] {
            assert_eq!(decode_member_verdict(&encode_member_verdict(status)), Ok(status));
        }
        assert!(decode_member_verdict(&[0, 0, 1, 0]).is_err());
        let connector =
            proof_transcript(PeerRole::Member, ProofSide::Connector, &[1; 32], &[2; 32]);
        let acceptor = proof_transcript(PeerRole::Member, ProofSide::Acceptor, &[1; 32], &[2; 32]);
        let client = proof_transcript(PeerRole::Client, ProofSide::Connector, &[1; 32], &[2; 32]);
        assert_ne!(connector, acceptor);
        assert_ne!(connector, client);
        assert_eq!(&client[..16], b"stratus client c");
        assert_eq!(&connector[..16], b"stratus member c");
        assert_eq!(&connector[16..48], &[1; 32]);
        assert_eq!(&connector[48..], &[2; 32]);
        let alice = user_proof_transcript(ProofSide::Connector, &[1; 32], &[2; 32], "alice");
        let bob = user_proof_transcript(ProofSide::Connector, &[1; 32], &[2; 32], "bob");
        assert_eq!(&alice[..16], b"stratus user   c");
        assert_eq!(&alice[80..], b"\x05alice");
        assert_ne!(alice, bob);
        assert_eq!(decode_user_name(b"alice"), Ok("alice".to_string()));
        assert!(decode_user_name(b"al ice").is_err());
        assert!(decode_user_name(&[0xff]).is_err());
    }
}
