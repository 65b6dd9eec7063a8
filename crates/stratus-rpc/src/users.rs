//! Named users on the native protocol: their keys, the preamble in which a client proves a
//! user's password (role 2), and the user directory a server checks every request against.
//!
//! The keys are SCRAM's (RFC 5802) with Argon2id in place of PBKDF2 (docs/design/security.md,
//! "Users"):
//!
//! ```text
//! salted     = Argon2id(password, salt)            19 MiB, 2 passes: one guess costs a login
//! client_key = HMAC(salted, "Client Key")
//! stored_key = SHA-256(client_key)                 kept by the cluster
//! server_key = HMAC(salted, "Server Key")          kept by the cluster
//! ```
//!
//! In the preamble the acceptor answers with the user's salt and its proof
//! `HMAC(server_key, transcript_a)`; the connector derives its keys, checks that proof (so it
//! never proves anything to a server that does not know the user), and sends `client_key XOR
//! HMAC(stored_key, transcript_c)`. The acceptor recovers `client_key` and checks its SHA-256
//! against `stored_key`. What the cluster keeps lets nobody log in; each transcript names
//! both nonces and the user, so nothing replays. A user the acceptor does not know gets a salt
//! derived from the name and a random proof, so a probe cannot tell a missing user from a
//! wrong password.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use stratus_env::{
    read_first_answer, write_and_flush, BoxReader, BoxWriter, Connection, Entropy, OsEntropy,
};
use stratus_types::limits::{
    USER_AUTHENTICATION_FAILURES_PER_SECOND_MAX, USER_PASSWORD_BYTES_MAX, USER_PASSWORD_BYTES_MIN,
};
use stratus_types::TableId;
use stratus_wire::membership::PeerRole;
use stratus_wire::membership::{
    decode_member_verdict, decode_user_name, encode_member_verdict, encode_user_name,
    user_proof_transcript, MemberAnswer, MemberChallenge, ProofSide, MEMBER_ANSWER_BYTES,
    MEMBER_CLIENT_PROOF_BYTES, MEMBER_PREAMBLE_VERSION, MEMBER_USER_SALT_BYTES,
    MEMBER_VERDICT_BYTES,
};
use stratus_wire::users::{USER_KEY_BYTES, USER_SALT_BYTES};
use stratus_wire::{
    decode_request, AccessNeeded, Request, Response, ResponseBody, Status, TableAccess,
    UserCredentials, UserDirectorySnapshot, UserRecord,
};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::preamble::{denied, draw_nonce, invalid_data};

type HmacSha256 = Hmac<Sha256>;

/// Argon2id's parameters for a user's salted password: the cluster key's (OWASP's minimum).
const USER_KEY_MEMORY_KIB: u32 = 19 * 1024;
const USER_KEY_PASSES: u32 = 2;
const USER_KEY_LANES: u32 = 1;

/// The keys derived from a password and a salt.
#[derive(Clone)]
struct UserKeys {
    client_key: [u8; USER_KEY_BYTES],
    stored_key: [u8; USER_KEY_BYTES],
    server_key: [u8; USER_KEY_BYTES],
}

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Checks a password's length (without surrounding ASCII whitespace).
pub fn check_user_password(password: &[u8]) -> Result<&[u8], String> {
    let password = password.trim_ascii();
    if password.len() < USER_PASSWORD_BYTES_MIN || password.len() > USER_PASSWORD_BYTES_MAX {
        return Err(format!(
            "a user's password has {USER_PASSWORD_BYTES_MIN} to {USER_PASSWORD_BYTES_MAX} bytes, not {}",
            password.len()
        ));
    }
    Ok(password)
}

fn derive_user_keys(password: &[u8], salt: &[u8; USER_SALT_BYTES]) -> UserKeys {
    let params =
        argon2::Params::new(USER_KEY_MEMORY_KIB, USER_KEY_PASSES, USER_KEY_LANES, Some(32))
            .expect("valid Argon2 parameters");
    let argon2 = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params);
    let mut salted = [0u8; 32];
    argon2
        .hash_password_into(password, salt, &mut salted)
        .expect("a checked password and a 16-byte salt are valid Argon2 inputs");
    let client_key = hmac(&salted, b"Client Key");
    let stored_key: [u8; 32] = Sha256::digest(client_key).into();
    let server_key = hmac(&salted, b"Server Key");
    UserKeys { client_key, stored_key, server_key }
}

/// The credentials the cluster keeps for `password` with a fresh random salt (what SET_USER
/// carries: the password itself never leaves the process that sets it).
pub fn new_user_credentials(password: &[u8]) -> Result<UserCredentials, String> {
    let mut salt = [0u8; USER_SALT_BYTES];
    for chunk in salt.chunks_exact_mut(8) {
        chunk.copy_from_slice(&OsEntropy.next_u64().to_le_bytes());
    }
    user_credentials(password, salt)
}

/// The credentials for `password` with `salt` (tests and fuzzing need a fixed salt; real
/// passwords get [`new_user_credentials`]'s random one).
pub fn user_credentials(
    password: &[u8],
    salt: [u8; USER_SALT_BYTES],
) -> Result<UserCredentials, String> {
    let password = check_user_password(password)?;
    let keys = derive_user_keys(password, &salt);
    Ok(UserCredentials { salt, stored_key: keys.stored_key, server_key: keys.server_key })
}

/// The client proof (step 3 of a named user's preamble) that `password` gives for `user` in
/// the exchange of these nonces, with the user's `salt`: what [`prove_user`] sends, for tests
/// and fuzzing that build preambles by hand.
pub fn user_client_proof(
    password: &[u8],
    salt: &[u8; USER_SALT_BYTES],
    client_nonce: &[u8; 32],
    server_nonce: &[u8; 32],
    user: &str,
) -> Result<[u8; 32], String> {
    stratus_wire::users::validate_user_name(user)?;
    let keys = derive_user_keys(check_user_password(password)?, salt);
    let transcript = user_proof_transcript(ProofSide::Connector, client_nonce, server_nonce, user);
    let signature = hmac(&keys.stored_key, &transcript);
    let mut proof = [0u8; 32];
    for (byte, (key, sign)) in proof.iter_mut().zip(keys.client_key.iter().zip(&signature)) {
        *byte = key ^ sign;
    }
    Ok(proof)
}

/// True if `password` is the one `credentials` were made from (one Argon2id): how the RESP
/// front end checks `AUTH user password`.
pub fn password_matches(credentials: &UserCredentials, password: &[u8]) -> bool {
    let Ok(password) = check_user_password(password) else {
        return false;
    };
    let keys = derive_user_keys(password, &credentials.salt);
    constant_time_equal(&keys.stored_key, &credentials.stored_key)
}

fn constant_time_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |difference, (x, y)| difference | (x ^ y)) == 0
}

/// A named user's password, held by a client to prove it. The keys derived for the last salt
/// a server sent are kept, so a client pays the Argon2id once, not once per connection.
pub struct UserPassword {
    name: String,
    password: Vec<u8>,
    keys: Mutex<Option<([u8; USER_SALT_BYTES], UserKeys)>>,
}

impl fmt::Debug for UserPassword {
    /// Never shows the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UserPassword({:?}, <redacted>)", self.name)
    }
}

impl UserPassword {
    /// The user `name` with `password` (surrounding ASCII whitespace removed).
    pub fn new(name: &str, password: &[u8]) -> Result<UserPassword, String> {
        stratus_wire::users::validate_user_name(name)?;
        let password = check_user_password(password)?.to_vec();
        Ok(UserPassword { name: name.to_string(), password, keys: Mutex::new(None) })
    }

    /// The user `name` with the password held in the file at `path` (read as the cluster
    /// secret is: bounded, warning if others may read it).
    pub fn read_file(name: &str, path: &Path) -> Result<UserPassword, String> {
        let password =
            crate::membership::read_secret_file(path).map_err(|error| error.to_string())?;
        UserPassword::new(name, &password)
    }

    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The password, for a client that must check it elsewhere (the RESP front end).
    pub fn password(&self) -> &[u8] {
        &self.password
    }

    /// The keys for `salt`: the cached ones, or derived (one Argon2id, about 50 ms and 19 MiB)
    /// on a blocking thread, so a runtime thread that also serves others (a server's RESP
    /// front end shares its master's) is not held; the lock is not held while deriving.
    async fn keys_for(&self, salt: &[u8; USER_SALT_BYTES]) -> io::Result<UserKeys> {
        if let Some((cached_salt, keys)) = self.lock_keys().as_ref() {
            if cached_salt == salt {
                return Ok(keys.clone());
            }
        }
        let (password, salt_copy) = (self.password.clone(), *salt);
        let keys = stratus_env::run_blocking(move || derive_user_keys(&password, &salt_copy))
            .await
            .map_err(|error| io::Error::other(format!("deriving the user's keys: {error}")))?;
        *self.lock_keys() = Some((*salt, keys.clone()));
        Ok(keys)
    }

    fn lock_keys(&self) -> std::sync::MutexGuard<'_, Option<([u8; USER_SALT_BYTES], UserKeys)>> {
        self.keys.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// The connector's side of a named user's preamble: proves `user`'s password to the acceptor
/// of `connection`, after checking that the acceptor knows the user.
pub(crate) async fn prove_user(
    connection: &mut Connection,
    user: &UserPassword,
    nonces: &dyn Entropy,
) -> io::Result<()> {
    let peer = connection.peer_address.clone();
    let client_nonce = draw_nonce(nonces);
    let challenge =
        MemberChallenge { version: MEMBER_PREAMBLE_VERSION, role: PeerRole::User, client_nonce };
    let mut opening = challenge.encode().to_vec();
    opening.extend_from_slice(&encode_user_name(&user.name));
    write_and_flush(&mut connection.writer, &opening).await?;
    let mut answer = [0u8; MEMBER_ANSWER_BYTES];
    read_first_answer(&mut connection.reader, &mut answer).await?;
    let answer = MemberAnswer::decode(&answer).map_err(invalid_data)?;
    if answer.status != Status::Ok {
        return Err(denied(format!(
            "{peer} refused to authenticate user {:?} ({}): it has no users configured, \
             refuses that name for a moment after many failures, or speaks another preamble \
             version",
            user.name, answer.status
        )));
    }
    let mut salt = [0u8; MEMBER_USER_SALT_BYTES];
    connection.reader.read_exact(&mut salt).await?;
    let keys = user.keys_for(&salt).await?;
    let server_nonce = answer.server_nonce;
    let acceptor_transcript =
        user_proof_transcript(ProofSide::Acceptor, &client_nonce, &server_nonce, &user.name);
    let mut mac = HmacSha256::new_from_slice(&keys.server_key).expect("any key length");
    mac.update(&acceptor_transcript);
    if mac.verify_slice(&answer.server_proof).is_err() {
        return Err(denied(format!(
            "{peer} does not accept user {:?} with this password (a wrong user name or \
             password, a disabled user, or a server of another cluster)",
            user.name
        )));
    }
    let connector_transcript =
        user_proof_transcript(ProofSide::Connector, &client_nonce, &server_nonce, &user.name);
    let signature = hmac(&keys.stored_key, &connector_transcript);
    let mut proof = [0u8; MEMBER_CLIENT_PROOF_BYTES];
    for (byte, (key, sign)) in proof.iter_mut().zip(keys.client_key.iter().zip(&signature)) {
        *byte = key ^ sign;
    }
    write_and_flush(&mut connection.writer, &proof).await?;
    let mut verdict = [0u8; MEMBER_VERDICT_BYTES];
    connection.reader.read_exact(&mut verdict).await?;
    match decode_member_verdict(&verdict).map_err(invalid_data)? {
        Status::Ok => Ok(()),
        status => Err(denied(format!("{peer} refused user {:?} ({status})", user.name))),
    }
}

/// Failed authentications per user name in the current second, to refuse a guesser's
/// preambles unchecked past [`USER_AUTHENTICATION_FAILURES_PER_SECOND_MAX`].
#[derive(Debug, Default)]
struct FailureWindow {
    second: u64,
    by_name: HashMap<String, u32>,
    /// A failure of a name not remembered happened this second (the map was full).
    overflowed: bool,
}

/// Names remembered per window at most: a guesser cycling through names gets no more than
/// this many entries; past it, every name not remembered is refused unchecked for the rest of
/// the second (honest users included: the price of bounding the memory a guesser takes).
const FAILURE_WINDOW_NAMES_MAX: usize = 4_096;

/// The users a server knows and checks: the coordinator's directory, replaced whole when a
/// newer one arrives; requests of a user connection are checked against the newest.
#[derive(Debug)]
pub struct UserDirectory {
    current: watch::Sender<Arc<UserDirectorySnapshot>>,
    failures: Mutex<FailureWindow>,
    authentications_failed: AtomicU64,
    requests_denied: AtomicU64,
    /// Where the seconds of the failure window come from (tokio's clock: virtual in the
    /// simulator).
    started: tokio::time::Instant,
}

impl Default for UserDirectory {
    fn default() -> Self {
        UserDirectory::new()
    }
}

impl UserDirectory {
    /// An empty directory (version 0): no user can authenticate until one is installed.
    pub fn new() -> UserDirectory {
        UserDirectory {
            current: watch::Sender::new(Arc::new(UserDirectorySnapshot::default())),
            failures: Mutex::new(FailureWindow::default()),
            authentications_failed: AtomicU64::new(0),
            requests_denied: AtomicU64::new(0),
            started: tokio::time::Instant::now(),
        }
    }

    /// The newest directory.
    pub fn snapshot(&self) -> Arc<UserDirectorySnapshot> {
        self.current.borrow().clone()
    }

    /// Replaces the directory (if `snapshot` is another version).
    pub fn install(&self, snapshot: UserDirectorySnapshot) {
        self.current.send_if_modified(|current| {
            if current.version == snapshot.version {
                return false;
            }
            *current = Arc::new(snapshot);
            true
        });
    }

    /// The directory once its version differs from `version`, or the current one after
    /// `timeout`.
    pub async fn changed_from(
        &self,
        version: u64,
        timeout: Duration,
    ) -> Arc<UserDirectorySnapshot> {
        let mut receiver = self.current.subscribe();
        let changed = tokio::time::timeout(timeout, async {
            receiver.wait_for(|current| current.version != version).await.map(|c| c.clone())
        })
        .await;
        match changed {
            Ok(Ok(current)) => current,
            _ => self.snapshot(),
        }
    }

    /// Named-user preambles refused (a wrong password, an unknown or disabled user, a name
    /// over its failure limit).
    pub fn authentications_failed(&self) -> u64 {
        self.authentications_failed.load(Ordering::Relaxed)
    }

    /// Requests of named users refused for want of a grant.
    pub fn requests_denied(&self) -> u64 {
        self.requests_denied.load(Ordering::Relaxed)
    }

    pub(crate) fn count_denied_request(&self) -> u64 {
        self.requests_denied.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn current_second(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// True if `name` failed too often this second.
    fn over_failure_limit(&self, name: &str) -> bool {
        let second = self.current_second();
        let failures = self.failures.lock().unwrap_or_else(|poison| poison.into_inner());
        if failures.second != second {
            return false;
        }
        match failures.by_name.get(name) {
            Some(&count) => count >= USER_AUTHENTICATION_FAILURES_PER_SECOND_MAX,
            None => failures.overflowed,
        }
    }

    fn record_failure(&self, name: &str) {
        self.authentications_failed.fetch_add(1, Ordering::Relaxed);
        let second = self.current_second();
        let mut failures = self.failures.lock().unwrap_or_else(|poison| poison.into_inner());
        if failures.second != second {
            failures.second = second;
            failures.by_name.clear();
            failures.overflowed = false;
        }
        if failures.by_name.len() < FAILURE_WINDOW_NAMES_MAX || failures.by_name.contains_key(name)
        {
            *failures.by_name.entry(name.to_string()).or_default() += 1;
        } else {
            failures.overflowed = true;
        }
    }
}

/// A named user as a connection proved it: its name, and the stored key of the password it
/// proved (a request is refused once the user's password is another).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmittedUser {
    /// The user's name.
    pub name: String,
    /// The stored key the connection's proof matched.
    pub stored_key: [u8; USER_KEY_BYTES],
}

/// The acceptor's side of a named user's preamble, after the common 40-byte challenge:
/// reads the name, answers with the user's salt and proof, checks the client's proof. The
/// user's name on success; an error (in words) when the connection must close. `pepper`
/// (a key only the cluster's members derive) makes the salt of an unknown user.
pub(crate) async fn admit_user(
    directory: &UserDirectory,
    pepper: &[u8; 32],
    nonces: &dyn Entropy,
    challenge: &MemberChallenge,
    reader: &mut BoxReader,
    writer: &mut BoxWriter,
    refused_proof_delay: Duration,
) -> Result<AdmittedUser, String> {
    let length = reader.read_u8().await.map_err(|error| error.to_string())?;
    let mut name = vec![0u8; usize::from(length)];
    reader.read_exact(&mut name).await.map_err(|error| error.to_string())?;
    let name = decode_user_name(&name).map_err(|error| error.to_string())?;
    if directory.over_failure_limit(&name) {
        directory.authentications_failed.fetch_add(1, Ordering::Relaxed);
        let refusal = MemberAnswer::refusal(Status::AuthenticationFailed);
        let _ = write_and_flush(writer, &refusal.encode()).await;
        return Err(format!("user {name:?} failed too often this second; refused unchecked"));
    }
    let snapshot = directory.snapshot();
    let known: Option<&UserRecord> = snapshot.user(&name).filter(|user| user.enabled);
    let credentials = known.and_then(|user| user.credentials.as_ref());
    let server_nonce = draw_nonce(nonces);
    let client_nonce = &challenge.client_nonce;
    let acceptor_transcript =
        user_proof_transcript(ProofSide::Acceptor, client_nonce, &server_nonce, &name);
    let (salt, server_proof) = match credentials {
        Some(credentials) => {
            (credentials.salt, hmac(&credentials.server_key, &acceptor_transcript))
        }
        None => {
            let fake = hmac(pepper, name.as_bytes());
            let mut salt = [0u8; USER_SALT_BYTES];
            salt.copy_from_slice(&fake[..USER_SALT_BYTES]);
            (salt, draw_nonce(nonces))
        }
    };
    let answer = MemberAnswer { status: Status::Ok, server_nonce, server_proof };
    let mut bytes = answer.encode().to_vec();
    bytes.extend_from_slice(&salt);
    write_and_flush(writer, &bytes).await.map_err(|error| error.to_string())?;
    let mut proof = [0u8; MEMBER_CLIENT_PROOF_BYTES];
    if let Err(error) = reader.read_exact(&mut proof).await {
        directory.record_failure(&name);
        return Err(match error.kind() {
            io::ErrorKind::UnexpectedEof => format!(
                "closed without sending its proof for user {name:?}: a wrong password, or an \
                 unknown or disabled user"
            ),
            _ => error.to_string(),
        });
    }
    let proven = credentials.is_some_and(|credentials| {
        let connector_transcript =
            user_proof_transcript(ProofSide::Connector, client_nonce, &server_nonce, &name);
        let signature = hmac(&credentials.stored_key, &connector_transcript);
        let mut client_key = [0u8; 32];
        for (byte, (sent, sign)) in client_key.iter_mut().zip(proof.iter().zip(&signature)) {
            *byte = sent ^ sign;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        constant_time_equal(&stored, &credentials.stored_key)
    });
    if !proven {
        directory.record_failure(&name);
        tokio::time::sleep(refused_proof_delay).await;
        let _ = write_and_flush(writer, &encode_member_verdict(Status::AuthenticationFailed)).await;
        return Err(format!("wrong proof for user {name:?}"));
    }
    write_and_flush(writer, &encode_member_verdict(Status::Ok))
        .await
        .map_err(|error| error.to_string())?;
    let stored_key = credentials.expect("proven only with credentials").stored_key;
    Ok(AdmittedUser { name, stored_key })
}

/// How long one GET_USER_DIRECTORY may take: the coordinator holds it up to its poll time
/// (5 s), so this leaves room for that and a slow network.
pub const USER_DIRECTORY_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

impl UserDirectory {
    /// Keeps this directory equal to the coordinator's, forever: long-polls GET_USER_DIRECTORY
    /// at `coordinators` (one address, or several separated by commas) over `network` (a
    /// member's: the directory holds stored keys), backing off (jittered by `entropy`) after
    /// failures.
    pub async fn follow_coordinator(
        self: Arc<Self>,
        network: Arc<dyn stratus_env::Network>,
        entropy: Arc<dyn Entropy>,
        coordinators: String,
    ) {
        let config = crate::RpcConfig {
            request_timeout: USER_DIRECTORY_REQUEST_TIMEOUT,
            ..crate::RpcConfig::default()
        };
        let pool = crate::ChannelPool::new(network, config);
        let new_backoff =
            || crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let mut backoff = new_backoff();
        loop {
            let request = Request::GetUserDirectory { known_version: self.snapshot().version };
            match pool.call_coordinator(&coordinators, &request).await {
                Ok((
                    Status::Ok,
                    ResponseBody::Operation(Response::GetUserDirectory { directory }),
                )) => {
                    backoff = new_backoff();
                    if let Some(directory) = directory {
                        tracing::info!(
                            version = directory.version,
                            users = directory.users.len(),
                            "user directory updated"
                        );
                        self.install(directory);
                    }
                    continue;
                }
                Ok((status, body)) => {
                    tracing::debug!(%status, ?body, "user directory poll refused");
                }
                Err(error) => tracing::debug!(%error, "user directory poll failed"),
            }
            tokio::time::sleep(backoff.next_delay(&*entropy)).await;
        }
    }
}

/// How long a request naming a table newer than the server's directory waits for the next
/// one (it is normally on its way: the coordinator answers every server's long poll as soon
/// as it creates a table) before it is refused.
pub const NEWER_TABLE_WAIT: Duration = Duration::from_secs(2);

enum Verdict {
    Allowed,
    Denied(String),
    /// A table id newer than the directory: wait for the next one.
    TableTooNew(TableId),
}

fn judge(
    snapshot: &UserDirectorySnapshot,
    user: &UserRecord,
    needed: &AccessNeeded<'_>,
) -> Verdict {
    match needed {
        AccessNeeded::Nothing => Verdict::Allowed,
        AccessNeeded::Member => Verdict::Denied("is for cluster members only".to_string()),
        AccessNeeded::ClusterAdmin if user.is_cluster_admin() => Verdict::Allowed,
        AccessNeeded::ClusterAdmin => Verdict::Denied(format!(
            "needs a cluster administrator (admin on \"*\"), and user {:?} is not one",
            user.name
        )),
        AccessNeeded::TableNamed(table, access) => {
            if user.access_to(table).covers(*access) {
                Verdict::Allowed
            } else {
                Verdict::Denied(format!(
                    "needs {access} on table {table:?}, and user {:?} has {}",
                    user.name,
                    user.access_to(table)
                ))
            }
        }
        AccessNeeded::Tables(tables) => {
            // A multi-op names a few tables many times (up to MULTI_OP_ITEMS_MAX items): each
            // table's access is matched against the grants once.
            let mut resolved: Vec<(TableId, Option<TableAccess>)> = Vec::new();
            for (table_id, access) in tables {
                let known = resolved.iter().find(|(id, _)| id == table_id).map(|(_, has)| *has);
                let has = known.unwrap_or_else(|| {
                    let has = snapshot.access_by_id(&user.grants, *table_id);
                    resolved.push((*table_id, has));
                    has
                });
                match has {
                    None => return Verdict::TableTooNew(*table_id),
                    Some(has) if access.met_by(has) => {}
                    Some(has) => {
                        let table = snapshot.table_name(*table_id).map_or_else(
                            || format!("id {}", table_id.0),
                            |name| format!("{name:?}"),
                        );
                        return Verdict::Denied(format!(
                            "needs {access} on table {table}, and user {:?} has {has}",
                            user.name
                        ));
                    }
                }
            }
            Verdict::Allowed
        }
    }
}

/// Why the named user `name` may not send this request (decoded from `body`), or `None` if it
/// may. A request that does not decode passes: the service answers it with its decode error.
pub(crate) async fn user_request_refusal(
    users: &UserDirectory,
    admitted: &AdmittedUser,
    opcode_code: u16,
    body: &Bytes,
) -> Option<String> {
    let request = decode_request(opcode_code, body.clone()).ok()?;
    let needed = request.access_needed();
    let name = admitted.name.as_str();
    let mut snapshot = users.snapshot();
    // A request naming a table newer than the directory waits, in all, this long for one
    // that names it: directories made before the table may arrive first.
    let wait_until = tokio::time::Instant::now() + NEWER_TABLE_WAIT;
    loop {
        let Some(user) = snapshot.user(name).filter(|user| user.enabled) else {
            return Some(format!("user {name:?} no longer exists or is disabled"));
        };
        // A changed password (or a user deleted and created again under the name) ends the
        // sessions of the old one: they proved a password that no longer opens this user.
        let stored_key = user.credentials.as_ref().map(|credentials| credentials.stored_key);
        if stored_key != Some(admitted.stored_key) {
            return Some(format!(
                "user {name:?} has another password since this connection authenticated"
            ));
        }
        match judge(&snapshot, user, &needed) {
            Verdict::Allowed => return None,
            Verdict::Denied(reason) => return Some(reason),
            Verdict::TableTooNew(_) if tokio::time::Instant::now() < wait_until => {
                let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
                snapshot = users.changed_from(snapshot.version, left).await;
            }
            Verdict::TableTooNew(table_id) => {
                return Some(format!(
                    "names table id {}, which this server's user directory does not know yet",
                    table_id.0
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn past_its_tracked_names_the_failure_window_refuses_every_other_name() {
        let directory = UserDirectory::new();
        for _ in 0..USER_AUTHENTICATION_FAILURES_PER_SECOND_MAX {
            directory.record_failure("alice");
        }
        assert!(directory.over_failure_limit("alice"));
        assert!(!directory.over_failure_limit("bob"), "another name is not limited yet");
        for index in 0..FAILURE_WINDOW_NAMES_MAX {
            directory.record_failure(&format!("guess-{index}"));
        }
        // The table is full: a name it could not track is refused, not waved through.
        directory.record_failure("one-more-guess");
        assert!(directory.over_failure_limit("bob"));
        // The next second starts afresh.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!directory.over_failure_limit("bob"));
        assert!(!directory.over_failure_limit("alice"));
    }

    #[test]
    fn credentials_check_the_password_they_were_made_from() {
        let credentials = new_user_credentials(b"correct horse\n").expect("long enough");
        assert!(password_matches(&credentials, b"correct horse"));
        assert!(!password_matches(&credentials, b"correct horsf"));
        assert!(new_user_credentials(b"short").is_err());
        let again = new_user_credentials(b"correct horse").expect("long enough");
        assert_ne!(again.salt, credentials.salt, "a fresh salt each time");
        assert_ne!(again.stored_key, credentials.stored_key);
        assert_eq!(format!("{credentials:?}"), "UserCredentials(<redacted>)");
        let user = UserPassword::new("alice", b"correct horse").expect("valid");
        assert!(!format!("{user:?}").contains("horse"));
        assert!(UserPassword::new("default", b"correct horse").is_err());
    }
}
