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
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use stratus_env::{
    read_first_answer, write_and_flush, BoxFuture, BoxReader, BoxWriter, Connection, Entropy,
    Listener, Network,
};
use stratus_wire::membership::PeerRole;
use stratus_wire::membership::{
    decode_member_verdict, encode_member_verdict, proof_transcript, MemberAnswer, MemberChallenge,
    MemberNonce, MemberProof, ProofSide, MEMBER_ANSWER_BYTES, MEMBER_CHALLENGE_BYTES,
    MEMBER_CLIENT_PROOF_BYTES, MEMBER_MAGIC, MEMBER_PREAMBLE_VERSION, MEMBER_VERDICT_BYTES,
};
use stratus_wire::{Access, Identity, Opcode, Status};
use tokio::io::AsyncReadExt;

use crate::preamble::{denied, draw_nonce, invalid_data};
use crate::users::{admit_user, prove_user, AdmittedUser, UserDirectory, UserPassword};

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

/// The salts of the derivations: public and fixed (a per-cluster salt would have to be
/// distributed with the secret, and buys nothing when the secret is one per cluster), and
/// different for the cluster secret and the client password, so one string used for both
/// gives two unrelated keys.
const KEY_SALT: &[u8] = b"stratus cluster key v1";
const CLIENT_KEY_SALT: &[u8] = b"stratus client key v1";

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
        ClusterKey::derive(secret, KEY_SALT)
    }

    /// The key clients prove for the client password `password` (surrounding whitespace
    /// removed, at least [`CLUSTER_SECRET_BYTES_MIN`] bytes).
    pub fn from_client_password(password: &[u8]) -> Result<ClusterKey, SecretError> {
        ClusterKey::derive(password, CLIENT_KEY_SALT)
    }

    fn derive(secret: &[u8], salt: &[u8]) -> Result<ClusterKey, SecretError> {
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
            .hash_password_into(secret, salt, &mut key)
            .map_err(|error| SecretError::Unreadable(format!("key derivation: {error}")))?;
        Ok(ClusterKey(key))
    }

    /// The key for the secret held in the file at `path` (read up to
    /// [`CLUSTER_SECRET_BYTES_MAX`] + 1 bytes, so a device or a huge file is refused, not
    /// read whole). Warns if others than its owner may read the file.
    pub fn read_file(path: &Path) -> Result<ClusterKey, SecretError> {
        ClusterKey::from_secret(&read_secret_file(path)?)
    }

    /// The client key for the password held in the file at `path` (read as
    /// [`ClusterKey::read_file`] reads).
    pub fn read_client_password_file(path: &Path) -> Result<ClusterKey, SecretError> {
        ClusterKey::from_client_password(&read_secret_file(path)?)
    }

    fn mac(
        &self,
        role: PeerRole,
        side: ProofSide,
        client: &MemberNonce,
        server: &MemberNonce,
    ) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(&proof_transcript(role, side, client, server));
        mac
    }

    /// A key for another purpose, derived from this one with `label` (HMAC-SHA-256): every
    /// member derives the same, nobody without the secret can.
    pub fn subkey(&self, label: &[u8]) -> [u8; 32] {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(label);
        mac.finalize().into_bytes().into()
    }

    /// The proof that `side` holds this key in `role`, for one exchange's nonces.
    pub fn prove(
        &self,
        role: PeerRole,
        side: ProofSide,
        client: &MemberNonce,
        server: &MemberNonce,
    ) -> MemberProof {
        self.mac(role, side, client, server).finalize().into_bytes().into()
    }

    /// True if `proof` is `side`'s proof in `role` for these nonces; compared in constant time,
    /// so the time a refusal takes tells nothing of how much of a forged proof was right.
    pub fn verify(
        &self,
        role: PeerRole,
        side: ProofSide,
        client: &MemberNonce,
        server: &MemberNonce,
        proof: &MemberProof,
    ) -> bool {
        self.mac(role, side, client, server).verify_slice(proof).is_ok()
    }
}

/// The secret held in a file, without surrounding ASCII whitespace: read up to [`CLUSTER_SECRET_BYTES_MAX`] + 1 bytes (a device or a
/// huge file is refused, not read whole), only from a regular file; warns if others than its
/// owner may read it.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, SecretError> {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let unreadable =
        |error: &dyn fmt::Display| SecretError::Unreadable(format!("{}: {error}", path.display()));
    let file = std::fs::File::open(path).map_err(|error| unreadable(&error))?;
    let metadata = file.metadata().map_err(|error| unreadable(&error))?;
    if !metadata.is_file() {
        return Err(unreadable(&"not a regular file"));
    }
    if metadata.permissions().mode() & 0o077 != 0 {
        tracing::warn!(
            path = %path.display(),
            "a secret file may be read by others than its owner (chmod 600 it)"
        );
    }
    let mut bytes = Vec::new();
    file.take(CLUSTER_SECRET_BYTES_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| unreadable(&error))?;
    if bytes.len() > CLUSTER_SECRET_BYTES_MAX {
        return Err(unreadable(&format!("more than {CLUSTER_SECRET_BYTES_MAX} bytes")));
    }
    Ok(bytes.trim_ascii().to_vec())
}

/// The connector's side of the preamble, in `role` with `key`: proves it to the acceptor of
/// `connection` and checks that the acceptor holds the key too (it never sends its own proof to
/// one that does not). On success the caller goes on with the hello.
async fn prove_to_acceptor(
    connection: &mut Connection,
    role: PeerRole,
    key: &ClusterKey,
    nonces: &dyn Entropy,
) -> io::Result<()> {
    let peer = connection.peer_address.clone();
    let what = match role {
        PeerRole::Member => "cluster secret",
        PeerRole::Client => "client password",
        PeerRole::User => unreachable!("a named user proves itself in users::prove_user"),
    };
    let client_nonce = draw_nonce(nonces);
    let challenge = MemberChallenge { version: MEMBER_PREAMBLE_VERSION, role, client_nonce };
    write_and_flush(&mut connection.writer, &challenge.encode()).await?;
    let mut answer = [0u8; MEMBER_ANSWER_BYTES];
    read_first_answer(&mut connection.reader, &mut answer).await?;
    let answer = MemberAnswer::decode(&answer).map_err(invalid_data)?;
    if answer.status != Status::Ok {
        return Err(denied(format!(
            "{peer} refused to authenticate ({}): it has no {what} configured, or speaks \
             another preamble version",
            answer.status
        )));
    }
    let proven = key.verify(
        role,
        ProofSide::Acceptor,
        &client_nonce,
        &answer.server_nonce,
        &answer.server_proof,
    );
    if !proven {
        return Err(denied(format!(
            "{peer} does not hold this {what} (a server of another cluster, or a different \
             one on each side)"
        )));
    }
    let proof = key.prove(role, ProofSide::Connector, &client_nonce, &answer.server_nonce);
    write_and_flush(&mut connection.writer, &proof).await?;
    let mut verdict = [0u8; MEMBER_VERDICT_BYTES];
    connection.reader.read_exact(&mut verdict).await?;
    match decode_member_verdict(&verdict).map_err(invalid_data)? {
        Status::Ok => Ok(()),
        status => Err(denied(format!("{peer} refused this process's {what} ({status})"))),
    }
}

/// A member process's keys (the cluster's, and the client password's if clients must prove
/// one), where its nonces come from, and what it refused.
#[derive(Debug)]
pub struct Membership {
    key: ClusterKey,
    client_key: Option<ClusterKey>,
    refused_proof_delay: Duration,
    /// Must be unpredictable in production (`stratus_env::OsEntropy`); seeded in the simulator.
    nonces: Arc<dyn Entropy>,
    handshakes_refused: AtomicU64,
    requests_refused: AtomicU64,
    /// The named users this process checks, once it serves them.
    users: OnceLock<Arc<UserDirectory>>,
    /// Makes the salt answered for a user this process does not know: derived from the
    /// cluster key, so every member answers the same salt for the same unknown name.
    pepper: [u8; 32],
}

/// What a connector proved in its preamble.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proven {
    /// The cluster secret.
    Member,
    /// The client password (the default user).
    Client,
    /// The password of the named user.
    User(AdmittedUser),
}

impl Membership {
    /// A membership with `key`, drawing nonces from `nonces`; clients need no password.
    pub fn new(key: ClusterKey, nonces: Arc<dyn Entropy>) -> Arc<Membership> {
        Membership::with_options(key, None, nonces, REFUSED_PROOF_DELAY)
    }

    /// A membership whose clients must prove `client_key` (or, without one, need nothing), that
    /// answers a wrong proof after `refused_proof_delay` ([`REFUSED_PROOF_DELAY`] in servers;
    /// the fuzz target, which tries many wrong proofs a second, gives zero).
    pub fn with_options(
        key: ClusterKey,
        client_key: Option<ClusterKey>,
        nonces: Arc<dyn Entropy>,
        refused_proof_delay: Duration,
    ) -> Arc<Membership> {
        Arc::new(Membership {
            client_key,
            refused_proof_delay,
            nonces,
            handshakes_refused: AtomicU64::new(0),
            requests_refused: AtomicU64::new(0),
            users: OnceLock::new(),
            pepper: key.prove(PeerRole::User, ProofSide::Acceptor, &[0; 32], &[0; 32]),
            key,
        })
    }

    /// Makes this process authenticate named users against `directory` and check their
    /// requests against their grants. Once per process; a second call is ignored.
    pub fn serve_users(&self, directory: Arc<UserDirectory>) {
        let _ = self.users.set(directory);
    }

    /// A key derived from the cluster key for another purpose, named by `label`
    /// ([`ClusterKey::subkey`]).
    pub fn subkey(&self, label: &[u8]) -> [u8; 32] {
        self.key.subkey(label)
    }

    /// The named users this process serves, if it serves them.
    pub fn users(&self) -> Option<&Arc<UserDirectory>> {
        self.users.get()
    }

    /// True if a client must prove the client password before any operation but PING.
    pub fn requires_client_password(&self) -> bool {
        self.client_key.is_some()
    }

    /// Preambles this process refused as acceptor (a wrong proof, a bad message, a version it
    /// does not speak, a role it has no key for).
    pub fn handshakes_refused(&self) -> u64 {
        self.handshakes_refused.load(Ordering::Relaxed)
    }

    /// Requests refused because the connection did not prove what the opcode needs.
    pub fn requests_refused(&self) -> u64 {
        self.requests_refused.load(Ordering::Relaxed)
    }

    pub(crate) fn count_refused_request(&self) -> u64 {
        self.requests_refused.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The connector's side, as a cluster member: proves the cluster secret to the acceptor of
    /// `connection` and checks that it holds it too.
    pub async fn authenticate(&self, connection: &mut Connection) -> io::Result<()> {
        prove_to_acceptor(connection, PeerRole::Member, &self.key, &*self.nonces).await
    }

    /// The acceptor's side, after the connector's first four bytes (`magic`, already read)
    /// were [`MEMBER_MAGIC`]. The role the connector proved; an error (the reason in words)
    /// when the connection must be closed. A refusal is counted and logged as a warning (the
    /// first of the process, then one in 64: a misconfigured peer retrying in a loop does not
    /// flood the log).
    pub async fn admit(
        &self,
        magic: [u8; 4],
        reader: &mut BoxReader,
        writer: &mut BoxWriter,
        peer: &str,
    ) -> Result<Proven, String> {
        let result = self.admit_unchecked(magic, reader, writer).await;
        if let Err(reason) = &result {
            let refused = self.handshakes_refused.fetch_add(1, Ordering::Relaxed) + 1;
            if refused == 1 || refused.is_multiple_of(64) {
                tracing::warn!(%peer, %reason, refused, "refused a peer's credentials");
            } else {
                tracing::debug!(%peer, %reason, refused, "refused a peer's credentials");
            }
        }
        result
    }

    async fn admit_unchecked(
        &self,
        magic: [u8; 4],
        reader: &mut BoxReader,
        writer: &mut BoxWriter,
    ) -> Result<Proven, String> {
        debug_assert_eq!(magic, MEMBER_MAGIC);
        let mut challenge = [0u8; MEMBER_CHALLENGE_BYTES];
        challenge[..4].copy_from_slice(&magic);
        reader.read_exact(&mut challenge[4..]).await.map_err(|error| error.to_string())?;
        let challenge = MemberChallenge::decode(&challenge).map_err(|error| error.to_string())?;
        if challenge.version != MEMBER_PREAMBLE_VERSION {
            let refusal = MemberAnswer::refusal(Status::ProtocolVersionMismatch);
            let _ = write_and_flush(writer, &refusal.encode()).await;
            return Err(format!("preamble version {}", challenge.version));
        }
        let role = challenge.role;
        let (key, what) = match role {
            PeerRole::User => {
                let Some(users) = self.users.get() else {
                    let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
                    let _ = write_and_flush(writer, &refusal.encode()).await;
                    return Err("a client offered a user name, and this process serves no users"
                        .to_string());
                };
                let delay = self.refused_proof_delay;
                let admitted = admit_user(
                    users,
                    &self.pepper,
                    &*self.nonces,
                    &challenge,
                    reader,
                    writer,
                    delay,
                )
                .await?;
                return Ok(Proven::User(admitted));
            }
            PeerRole::Member => (&self.key, "cluster secret"),
            PeerRole::Client => match &self.client_key {
                Some(key) => (key, "client password"),
                None => {
                    let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
                    let _ = write_and_flush(writer, &refusal.encode()).await;
                    return Err("a client offered a password, and none is configured".to_string());
                }
            },
        };
        let server_nonce = draw_nonce(&*self.nonces);
        let server_proof =
            key.prove(role, ProofSide::Acceptor, &challenge.client_nonce, &server_nonce);
        let answer = MemberAnswer { status: Status::Ok, server_nonce, server_proof };
        write_and_flush(writer, &answer.encode()).await.map_err(|error| error.to_string())?;
        let mut proof = [0u8; MEMBER_CLIENT_PROOF_BYTES];
        reader.read_exact(&mut proof).await.map_err(|error| match error.kind() {
            io::ErrorKind::UnexpectedEof => {
                format!("closed without sending its proof: it did not accept this server's {what} (it holds another)")
            }
            _ => error.to_string(),
        })?;
        let client_nonce = &challenge.client_nonce;
        if !key.verify(role, ProofSide::Connector, client_nonce, &server_nonce, &proof) {
            tokio::time::sleep(self.refused_proof_delay).await;
            let _ =
                write_and_flush(writer, &encode_member_verdict(Status::AuthenticationFailed)).await;
            return Err(format!("wrong proof of the {what}"));
        }
        write_and_flush(writer, &encode_member_verdict(Status::Ok))
            .await
            .map_err(|error| error.to_string())?;
        Ok(match role {
            PeerRole::Member => Proven::Member,
            _ => Proven::Client,
        })
    }
}

/// Answers a preamble on a server that has no cluster secret: it cannot prove one, so it says
/// so (the connector reports a clear error) and the connection closes.
pub(crate) async fn refuse_without_secret(
    magic: [u8; 4],
    reader: &mut BoxReader,
    writer: &mut BoxWriter,
) {
    let mut challenge = [0u8; MEMBER_CHALLENGE_BYTES];
    challenge[..4].copy_from_slice(&magic);
    if reader.read_exact(&mut challenge[4..]).await.is_ok() {
        let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
        let _ = write_and_flush(writer, &refusal.encode()).await;
    }
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

/// A network whose every outgoing connection proves the client password, or a named user's,
/// before anything else: the network of a client of a cluster that requires one.
#[derive(Debug)]
pub struct ClientNetwork {
    inner: Arc<dyn Network>,
    credential: ClientCredential,
    nonces: Arc<dyn Entropy>,
}

/// What a client proves.
#[derive(Debug)]
enum ClientCredential {
    /// The client password (the default user).
    Password(ClusterKey),
    /// A named user's password.
    User(Arc<UserPassword>),
}

impl ClientNetwork {
    /// `inner`, with every connection it opens proving the password whose key is `key`.
    pub fn new(
        inner: Arc<dyn Network>,
        key: ClusterKey,
        nonces: Arc<dyn Entropy>,
    ) -> ClientNetwork {
        ClientNetwork { inner, credential: ClientCredential::Password(key), nonces }
    }

    /// `inner`, with every connection it opens proving `user`'s password.
    pub fn for_user(
        inner: Arc<dyn Network>,
        user: Arc<UserPassword>,
        nonces: Arc<dyn Entropy>,
    ) -> ClientNetwork {
        ClientNetwork { inner, credential: ClientCredential::User(user), nonces }
    }
}

impl Network for ClientNetwork {
    fn connect<'a>(&'a self, address: &'a str) -> BoxFuture<'a, io::Result<Connection>> {
        Box::pin(async move {
            let mut connection = self.inner.connect(address).await?;
            match &self.credential {
                ClientCredential::Password(key) => {
                    prove_to_acceptor(&mut connection, PeerRole::Client, key, &*self.nonces).await?
                }
                ClientCredential::User(user) => {
                    prove_user(&mut connection, user, &*self.nonces).await?
                }
            }
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
    /// Connections that proved the cluster secret may send every opcode; those that proved the
    /// client password (or any other, when none is configured) only [`Access::Client`] ones;
    /// the rest only PING.
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
    /// PING only: the server requires the client password and the connection did not prove it.
    PingOnly(Arc<Membership>),
    /// Client opcodes, each checked against the named user's grants in `users`.
    User {
        /// The user, as the connection proved it.
        user: Arc<AdmittedUser>,
        /// Where member-only opcodes are counted.
        membership: Arc<Membership>,
        /// The directory the user's grants are read from, request by request.
        users: Arc<UserDirectory>,
    },
}

impl ConnectionAccess {
    /// What an accepted connection that proved `proven` (or nothing) may send under
    /// `admission`.
    pub(crate) fn after(admission: &Admission, proven: Option<Proven>) -> ConnectionAccess {
        match (admission, proven) {
            (Admission::Open, _) => ConnectionAccess::Everything,
            (Admission::Members(_), Some(Proven::Member)) => ConnectionAccess::Member,
            (Admission::Members(membership), Some(Proven::Client)) => {
                ConnectionAccess::ClientOnly(membership.clone())
            }
            (Admission::Members(membership), Some(Proven::User(admitted))) => {
                let users = membership
                    .users()
                    .expect("a user is admitted only by a process that serves users")
                    .clone();
                let user = Arc::new(admitted);
                ConnectionAccess::User { user, membership: membership.clone(), users }
            }
            (Admission::Members(membership), None) if membership.requires_client_password() => {
                ConnectionAccess::PingOnly(membership.clone())
            }
            (Admission::Members(membership), None) => {
                ConnectionAccess::ClientOnly(membership.clone())
            }
        }
    }

    /// If the opcode with wire code `code` is not allowed here: the membership to count the
    /// refusal in, and what the connection lacks. Unknown codes pass (the service answers
    /// them as unknown).
    pub(crate) fn refusal(&self, code: u16) -> Option<(&Arc<Membership>, &'static str)> {
        let access = Opcode::access_of_code(code)?;
        match (self, access) {
            (ConnectionAccess::ClientOnly(membership), Access::Member)
            | (ConnectionAccess::User { membership, .. }, Access::Member) => {
                Some((membership, "is for cluster members only: this connection did not prove the cluster secret"))
            }
            (ConnectionAccess::PingOnly(membership), _) if code != Opcode::Ping.code() => {
                Some((membership, "needs the client password: this connection did not prove it (give --password-file, or STRATUS_PASSWORD_FILE)"))
            }
            _ => None,
        }
    }

    /// True if no opcode is refused (the per-request check can be skipped).
    pub(crate) fn allows_everything(&self) -> bool {
        matches!(self, ConnectionAccess::Everything | ConnectionAccess::Member)
    }

    /// Who the connection is, as WHO_AM_I answers.
    pub(crate) fn identity(&self) -> Identity {
        match self {
            ConnectionAccess::Everything => Identity::Open,
            ConnectionAccess::Member => Identity::Member,
            ConnectionAccess::ClientOnly(membership) if membership.requires_client_password() => {
                Identity::Default
            }
            ConnectionAccess::ClientOnly(_) | ConnectionAccess::PingOnly(_) => Identity::Anonymous,
            ConnectionAccess::User { user, users, .. } => Identity::User {
                name: user.name.clone(),
                grants: users
                    .snapshot()
                    .user(&user.name)
                    .map(|user| user.grants.clone())
                    .unwrap_or_default(),
            },
        }
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
        let member = PeerRole::Member;
        let proof = key.prove(member, ProofSide::Connector, &client, &server);
        assert!(key.verify(member, ProofSide::Connector, &client, &server, &proof));
        assert!(!other.verify(member, ProofSide::Connector, &client, &server, &proof));
        assert!(!key.verify(member, ProofSide::Acceptor, &client, &server, &proof), "reflected");
        assert!(!key.verify(member, ProofSide::Connector, &client, &[3u8; 32], &proof), "replayed");
        let as_client = PeerRole::Client;
        assert!(!key.verify(as_client, ProofSide::Connector, &client, &server, &proof), "role");
        let mut flipped = proof;
        flipped[31] ^= 1;
        assert!(!key.verify(member, ProofSide::Connector, &client, &server, &flipped));
    }
}
