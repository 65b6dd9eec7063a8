//! Cluster membership: the coordinator and the servers prove to each other that they hold the
//! cluster secret before they speak, and a server that runs with a secret serves the
//! server-to-server opcodes ([`Access::Member`]) only on connections that proved it.
//!
//! The exchange is the preamble of `stratus_wire::membership` (byte layouts there and in
//! docs/design/wire-protocol.md); why it is a shared secret with a mutual challenge–response
//! rather than mutual TLS is in docs/design/security.md. Here:
//! - [`ClusterKey`]: the MAC key derived from the secret, and the proofs;
//! - [`Membership`]: a process's key, its source of nonces and its counters; the connector's
//!   side ([`Membership::authenticate`]) and the acceptor's ([`Membership::admit`]);
//! - [`MemberNetwork`]: a [`Network`] whose every outgoing connection authenticates first, so
//!   every component of a member process (replication, recovery, leases, probes) is a member
//!   without knowing it;
//! - [`Admission`]: what a server asks of the connections it accepts.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use stratus_env::{BoxFuture, BoxReader, BoxWriter, Connection, Entropy, Listener, Network};
use stratus_wire::membership::{
    decode_member_verdict, encode_member_verdict, proof_transcript, MemberAnswer, MemberChallenge,
    MemberNonce, MemberProof, ProofSide, MEMBER_ANSWER_BYTES, MEMBER_CHALLENGE_BYTES,
    MEMBER_CLIENT_PROOF_BYTES, MEMBER_MAGIC, MEMBER_NONCE_BYTES, MEMBER_PREAMBLE_VERSION,
    MEMBER_VERDICT_BYTES,
};
use stratus_wire::{Access, Status};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The shortest secret accepted, in bytes: 128 bits if it is random, which is what `stratus up
/// --cluster-secret-file` writes (32 random bytes, hex-encoded).
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;

/// The longest secret file read, in bytes: a secret is a line, not a document.
pub const CLUSTER_SECRET_BYTES_MAX: usize = 4_096;

/// How long an acceptor waits before it answers a wrong proof: a peer guessing the secret gets
/// one guess per connection per second, and a misconfigured server retrying in a loop does not
/// flood the log.
pub const REFUSED_PROOF_DELAY: Duration = Duration::from_secs(1);

type HmacSha256 = Hmac<Sha256>;

/// The MAC key of a cluster: Argon2id of the secret (with a fixed, public salt: every member
/// must derive the same key), so the secret itself is never a key and is not kept after
/// start. An acceptor sends its proof for a nonce of the connector's choosing to anyone who
/// asks, so anyone can try guesses at the secret offline against it: the slow, memory-hard
/// derivation makes each guess cost what a login attempt's does (KDF parameters below), which
/// matters for a secret a person chose; a generated one (`stratus up`) is out of reach anyway.
#[derive(Clone)]
pub struct ClusterKey([u8; 32]);

/// Argon2id's parameters for the cluster key: OWASP's minimum for password storage (19 MiB,
/// two passes, one lane). About 50 ms once per process start on this project's machines.
const KEY_MEMORY_KIB: u32 = 19 * 1024;
const KEY_PASSES: u32 = 2;
const KEY_LANES: u32 = 1;

/// The salt of the derivation: public and fixed (a per-cluster salt would have to be
/// distributed with the secret, and buys nothing when the secret is one per cluster).
const KEY_SALT: &[u8] = b"stratus cluster key v1";

impl fmt::Debug for ClusterKey {
    /// Never shows the key: a Debug print may reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(<redacted>)")
    }
}

/// Why a secret cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecretError {
    /// Fewer bytes than [`CLUSTER_SECRET_BYTES_MIN`] (surrounding whitespace excluded).
    TooShort {
        /// Its length.
        bytes: usize,
    },
    /// The secret file could not be read, or is longer than [`CLUSTER_SECRET_BYTES_MAX`].
    Unreadable(String),
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretError::TooShort { bytes } => write!(
                f,
                "the cluster secret has {bytes} bytes; at least {CLUSTER_SECRET_BYTES_MIN} are needed"
            ),
            SecretError::Unreadable(reason) => write!(f, "cannot read the cluster secret: {reason}"),
        }
    }
}

impl std::error::Error for SecretError {}

impl ClusterKey {
    /// The key for `secret`, with surrounding ASCII whitespace removed (a file written by an
    /// editor ends with a newline).
    pub fn from_secret(secret: &[u8]) -> Result<ClusterKey, SecretError> {
        let secret = secret.trim_ascii();
        if secret.len() < CLUSTER_SECRET_BYTES_MIN {
            return Err(SecretError::TooShort { bytes: secret.len() });
        }
        let params = argon2::Params::new(KEY_MEMORY_KIB, KEY_PASSES, KEY_LANES, Some(32))
            .expect("valid Argon2 parameters");
        let argon2 =
            argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
        let mut key = [0u8; 32];
        argon2
            .hash_password_into(secret, KEY_SALT, &mut key)
            .map_err(|error| SecretError::Unreadable(format!("key derivation: {error}")))?;
        Ok(ClusterKey(key))
    }

    /// The key for the secret held in the file at `path` (read up to
    /// [`CLUSTER_SECRET_BYTES_MAX`] + 1 bytes, so a device or a huge file is refused, not
    /// read whole). Warns if others than its owner may read the file.
    pub fn read_file(path: &Path) -> Result<ClusterKey, SecretError> {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        let unreadable = |error: &dyn fmt::Display| {
            SecretError::Unreadable(format!("{}: {error}", path.display()))
        };
        let file = std::fs::File::open(path).map_err(|error| unreadable(&error))?;
        let metadata = file.metadata().map_err(|error| unreadable(&error))?;
        if !metadata.is_file() {
            return Err(unreadable(&"not a regular file"));
        }
        if metadata.permissions().mode() & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                "the cluster secret file may be read by others than its owner (chmod 600 it)"
            );
        }
        let mut bytes = Vec::new();
        file.take(CLUSTER_SECRET_BYTES_MAX as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|error| unreadable(&error))?;
        if bytes.len() > CLUSTER_SECRET_BYTES_MAX {
            return Err(unreadable(&format!("more than {CLUSTER_SECRET_BYTES_MAX} bytes")));
        }
        ClusterKey::from_secret(&bytes)
    }

    fn mac(&self, side: ProofSide, client: &MemberNonce, server: &MemberNonce) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(&proof_transcript(side, client, server));
        mac
    }

    /// The proof that `side` holds this key, for one exchange's nonces.
    pub fn prove(
        &self,
        side: ProofSide,
        client: &MemberNonce,
        server: &MemberNonce,
    ) -> MemberProof {
        self.mac(side, client, server).finalize().into_bytes().into()
    }

    /// True if `proof` is `side`'s proof for these nonces; compared in constant time, so the
    /// time a refusal takes tells nothing of how much of a forged proof was right.
    pub fn verify(
        &self,
        side: ProofSide,
        client: &MemberNonce,
        server: &MemberNonce,
        proof: &MemberProof,
    ) -> bool {
        self.mac(side, client, server).verify_slice(proof).is_ok()
    }
}

/// A member process's key, where its nonces come from, and what it refused.
#[derive(Debug)]
pub struct Membership {
    key: ClusterKey,
    refused_proof_delay: Duration,
    /// Must be unpredictable in production (`stratus_env::OsEntropy`); seeded in the simulator.
    nonces: Arc<dyn Entropy>,
    handshakes_refused: AtomicU64,
    requests_refused: AtomicU64,
}

impl Membership {
    /// A membership with `key`, drawing nonces from `nonces`.
    pub fn new(key: ClusterKey, nonces: Arc<dyn Entropy>) -> Arc<Membership> {
        Membership::with_refused_proof_delay(key, nonces, REFUSED_PROOF_DELAY)
    }

    /// [`Membership::new`] answering a wrong proof after `delay` instead of
    /// [`REFUSED_PROOF_DELAY`] (the fuzz target, which tries many wrong proofs a second).
    pub fn with_refused_proof_delay(
        key: ClusterKey,
        nonces: Arc<dyn Entropy>,
        delay: Duration,
    ) -> Arc<Membership> {
        Arc::new(Membership {
            key,
            refused_proof_delay: delay,
            nonces,
            handshakes_refused: AtomicU64::new(0),
            requests_refused: AtomicU64::new(0),
        })
    }

    /// Preambles this process refused as acceptor (a wrong proof, a bad message, a version it
    /// does not speak).
    pub fn handshakes_refused(&self) -> u64 {
        self.handshakes_refused.load(Ordering::Relaxed)
    }

    /// Requests for a member-only opcode refused on connections that did not authenticate.
    pub fn requests_refused(&self) -> u64 {
        self.requests_refused.load(Ordering::Relaxed)
    }

    pub(crate) fn count_refused_request(&self) -> u64 {
        self.requests_refused.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn nonce(&self) -> MemberNonce {
        let mut nonce = [0u8; MEMBER_NONCE_BYTES];
        for chunk in nonce.chunks_exact_mut(8) {
            chunk.copy_from_slice(&self.nonces.next_u64().to_le_bytes());
        }
        nonce
    }

    /// The connector's side: proves the secret to the acceptor of `connection` and checks that
    /// it holds it too. On success the caller goes on with the hello.
    pub async fn authenticate(&self, connection: &mut Connection) -> io::Result<()> {
        let peer = connection.peer_address.clone();
        let client_nonce = self.nonce();
        let challenge = MemberChallenge { version: MEMBER_PREAMBLE_VERSION, client_nonce };
        connection.writer.write_all(&challenge.encode()).await?;
        let mut answer = [0u8; MEMBER_ANSWER_BYTES];
        connection.reader.read_exact(&mut answer).await?;
        let answer = MemberAnswer::decode(&answer).map_err(invalid_data)?;
        if answer.status != Status::Ok {
            return Err(denied(format!(
                "{peer} refused to authenticate ({}): it runs without a cluster secret, or speaks \
                 another membership preamble version",
                answer.status
            )));
        }
        let proven = self.key.verify(
            ProofSide::Acceptor,
            &client_nonce,
            &answer.server_nonce,
            &answer.server_proof,
        );
        if !proven {
            return Err(denied(format!(
                "{peer} does not hold this cluster's secret (a server of another cluster, or a \
                 wrong --cluster-secret-file on one side)"
            )));
        }
        let proof = self.key.prove(ProofSide::Connector, &client_nonce, &answer.server_nonce);
        connection.writer.write_all(&proof).await?;
        let mut verdict = [0u8; MEMBER_VERDICT_BYTES];
        connection.reader.read_exact(&mut verdict).await?;
        match decode_member_verdict(&verdict).map_err(invalid_data)? {
            Status::Ok => Ok(()),
            status => Err(denied(format!("{peer} refused this process's proof ({status})"))),
        }
    }

    /// The acceptor's side, after the connector's first four bytes (`magic`, already read)
    /// were [`MEMBER_MAGIC`]. Ok when the connector proved the secret; an error (the reason in
    /// words) when the connection must be closed. A refusal is counted and logged as a warning
    /// (the first of the process, then one in 64: a misconfigured server retrying in a loop
    /// does not flood the log).
    pub async fn admit(
        &self,
        magic: [u8; 4],
        reader: &mut BoxReader,
        writer: &mut BoxWriter,
        peer: &str,
    ) -> Result<(), String> {
        let result = self.admit_unchecked(magic, reader, writer).await;
        if let Err(reason) = &result {
            let refused = self.handshakes_refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused == 1 || refused.is_multiple_of(64) {
                tracing::warn!(%peer, %reason, refused, "refused a peer claiming cluster membership");
            } else {
                tracing::debug!(%peer, %reason, refused, "refused a peer claiming cluster membership");
            }
        }
        result
    }

    async fn admit_unchecked(
        &self,
        magic: [u8; 4],
        reader: &mut BoxReader,
        writer: &mut BoxWriter,
    ) -> Result<(), String> {
        debug_assert_eq!(magic, MEMBER_MAGIC);
        let mut challenge = [0u8; MEMBER_CHALLENGE_BYTES];
        challenge[..4].copy_from_slice(&magic);
        reader.read_exact(&mut challenge[4..]).await.map_err(|error| error.to_string())?;
        let challenge = MemberChallenge::decode(&challenge).map_err(|error| error.to_string())?;
        if challenge.version != MEMBER_PREAMBLE_VERSION {
            let refusal = MemberAnswer::refusal(Status::ProtocolVersionMismatch);
            let _ = writer.write_all(&refusal.encode()).await;
            return Err(format!("membership preamble version {}", challenge.version));
        }
        let server_nonce = self.nonce();
        let server_proof =
            self.key.prove(ProofSide::Acceptor, &challenge.client_nonce, &server_nonce);
        let answer = MemberAnswer { status: Status::Ok, server_nonce, server_proof };
        writer.write_all(&answer.encode()).await.map_err(|error| error.to_string())?;
        let mut proof = [0u8; MEMBER_CLIENT_PROOF_BYTES];
        reader.read_exact(&mut proof).await.map_err(|error| match error.kind() {
            io::ErrorKind::UnexpectedEof => "closed without sending its proof: it did not accept \
                                             this server's (it holds another cluster secret)"
                .to_string(),
            _ => error.to_string(),
        })?;
        if !self.key.verify(ProofSide::Connector, &challenge.client_nonce, &server_nonce, &proof) {
            tokio::time::sleep(self.refused_proof_delay).await;
            let _ = writer.write_all(&encode_member_verdict(Status::AuthenticationFailed)).await;
            return Err("wrong proof of the cluster secret".to_string());
        }
        writer
            .write_all(&encode_member_verdict(Status::Ok))
            .await
            .map_err(|error| error.to_string())
    }
}

/// Answers a membership preamble on a server that has no cluster secret: it cannot prove one,
/// so it says so (the connector reports a clear error) and the connection closes.
pub(crate) async fn refuse_without_secret(
    magic: [u8; 4],
    reader: &mut BoxReader,
    writer: &mut BoxWriter,
) {
    let mut challenge = [0u8; MEMBER_CHALLENGE_BYTES];
    challenge[..4].copy_from_slice(&magic);
    if reader.read_exact(&mut challenge[4..]).await.is_ok() {
        let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
        let _ = writer.write_all(&refusal.encode()).await;
    }
}

fn invalid_data(error: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("membership preamble: {error}"))
}

fn denied(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, format!("membership: {reason}"))
}

/// A network whose every outgoing connection proves the cluster secret before anything else:
/// the network of a member process (coordinator or server).
#[derive(Debug)]
pub struct MemberNetwork {
    inner: Arc<dyn Network>,
    membership: Arc<Membership>,
}

impl MemberNetwork {
    /// `inner`, with every connection it opens authenticated with `membership`.
    pub fn new(inner: Arc<dyn Network>, membership: Arc<Membership>) -> MemberNetwork {
        MemberNetwork { inner, membership }
    }
}

impl Network for MemberNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move {
            let mut connection = self.inner.connect(address).await?;
            self.membership.authenticate(&mut connection).await?;
            Ok(connection)
        })
    }

    fn bind<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Box<dyn Listener>>> {
        self.inner.bind(address)
    }
}

/// What a server asks of the connections it accepts.
#[derive(Clone, Debug)]
pub enum Admission {
    /// Nothing: every connection may send every opcode (no cluster secret: the default on
    /// loopback).
    Open,
    /// Connections that proved the cluster secret may send every opcode; the others only
    /// [`Access::Client`] ones.
    Members(Arc<Membership>),
}

impl Admission {
    /// The membership whose counters this admission keeps, if the server has a secret.
    pub fn membership(&self) -> Option<Arc<Membership>> {
        match self {
            Admission::Open => None,
            Admission::Members(membership) => Some(membership.clone()),
        }
    }
}

/// What one accepted connection may send.
#[derive(Clone, Debug)]
pub(crate) enum ConnectionAccess {
    /// Every opcode: the server runs without a cluster secret.
    Everything,
    /// Every opcode: the connection proved the cluster secret.
    Member,
    /// Client opcodes only; member-only ones are refused and counted in the membership.
    ClientOnly(Arc<Membership>),
}

impl ConnectionAccess {
    /// The membership to count a refusal in, if `access` is not allowed here.
    pub(crate) fn refuses(&self, access: Access) -> Option<&Arc<Membership>> {
        match (self, access) {
            (ConnectionAccess::ClientOnly(membership), Access::Member) => Some(membership),
            _ => None,
        }
    }

    /// True if no opcode is refused (the per-request check can be skipped).
    pub(crate) fn allows_everything(&self) -> bool {
        !matches!(self, ConnectionAccess::ClientOnly(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secrets_are_refused_and_whitespace_does_not_count() {
        assert_eq!(
            ClusterKey::from_secret(b"  short secret \n").unwrap_err(),
            SecretError::TooShort { bytes: 12 }
        );
        let padded = ClusterKey::from_secret(b"0123456789abcdef\n").expect("16 bytes");
        let bare = ClusterKey::from_secret(b"0123456789abcdef").expect("16 bytes");
        assert_eq!(padded.0, bare.0);
        assert_eq!(format!("{padded:?}"), "ClusterKey(<redacted>)");
    }

    #[test]
    fn a_secret_file_is_read_bounded_and_only_if_it_is_a_regular_file() {
        let directory = std::env::temp_dir().join(format!("stratus-secret-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("directory");
        let huge = directory.join("huge");
        std::fs::write(&huge, vec![b'x'; CLUSTER_SECRET_BYTES_MAX + 1]).expect("write");
        assert!(matches!(ClusterKey::read_file(&huge), Err(SecretError::Unreadable(_))));
        let good = directory.join("good");
        std::fs::write(&good, "0123456789abcdef0123\n").expect("write");
        let from_file = ClusterKey::read_file(&good).expect("a good secret");
        assert_eq!(from_file.0, ClusterKey::from_secret(b"0123456789abcdef0123").expect("key").0);
        assert!(matches!(
            ClusterKey::read_file(Path::new("/dev/zero")),
            Err(SecretError::Unreadable(_))
        ));
        assert!(matches!(ClusterKey::read_file(&directory), Err(SecretError::Unreadable(_))));
        std::fs::remove_dir_all(&directory).expect("clean up");
    }

    #[test]
    fn a_proof_verifies_only_for_its_key_side_and_nonces() {
        let key = ClusterKey::from_secret(b"the right secret, long enough").expect("key");
        let other = ClusterKey::from_secret(b"another secret, long enough!!").expect("key");
        let (client, server) = ([1u8; 32], [2u8; 32]);
        let proof = key.prove(ProofSide::Connector, &client, &server);
        assert!(key.verify(ProofSide::Connector, &client, &server, &proof));
        assert!(!other.verify(ProofSide::Connector, &client, &server, &proof));
        assert!(!key.verify(ProofSide::Acceptor, &client, &server, &proof), "reflected");
        assert!(!key.verify(ProofSide::Connector, &client, &[3u8; 32], &proof), "replayed");
        let mut flipped = proof;
        flipped[31] ^= 1;
        assert!(!key.verify(ProofSide::Connector, &client, &server, &flipped));
    }
}
