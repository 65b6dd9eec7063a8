//! The gateway: shared state (table ids, open scans, counters) and one connection's session.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stratus_client::{Client, Enumeration, Status, TableId, UserPassword};
use tokio::time::Instant;

use crate::request::RequestLimits;
use crate::transaction::{Queue, Watches};
use crate::value::Protocol;

/// Settings of a gateway.
#[derive(Clone, Debug)]
pub struct GatewayConfig {
    /// Database n is the Stratus table named `table_prefix` + n.
    pub table_prefix: String,
    /// Server span of the tables the gateway creates.
    pub table_span: u32,
    /// How many databases SELECT accepts (0 ..= databases - 1), like Redis's `databases`.
    pub databases: u32,
    /// Bounds on one request.
    pub limits: RequestLimits,
    /// Most client connections at once; more are answered with an error and closed.
    pub connections_max: u64,
    /// Most bytes of keys one KEYS reply may hold: KEYS builds its whole reply in memory.
    pub keys_reply_bytes_max: usize,
    /// Most SCAN cursors open at once in the gateway; beyond it the oldest is forgotten.
    pub scans_open_max: usize,
    /// The address of the master in this process, when this front end runs inside a storage
    /// server (`INFO stratus` reports it, so a client can tell which keys cost no hop); `None`
    /// for the `stratus resp` gateway.
    pub local_master: Option<String>,
    /// The password of the default user (Redis's `requirepass`): with one, a connection must
    /// AUTH (or HELLO … AUTH) before any command but those two, QUIT and PING's refusal.
    pub password: Option<RespPassword>,
    /// Makes the client a session authenticated as a named user (AUTH user password) sends
    /// its requests with, so that the cluster applies that user's grants. The process builds
    /// it on a network without the cluster secret (and with its TLS client settings); without
    /// it (or without `password`) only the default user exists.
    pub user_clients: Option<UserClients>,
}

/// Makes a client acting as a named user ([`stratus_client::ClientConfig::user`]); the
/// gateway keeps the clients it made in a bounded cache ([`USER_CLIENTS_CACHED_MAX`]).
#[derive(Clone)]
pub struct UserClients(pub Arc<dyn Fn(Arc<UserPassword>) -> Client + Send + Sync>);

impl std::fmt::Debug for UserClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserClients(..)")
    }
}

/// Named users' clients a gateway keeps (the oldest is forgotten beyond it): a second
/// connection of a user reuses the client, its connections and the keys derived from the
/// password (one Argon2id per salt, not per connection).
pub const USER_CLIENTS_CACHED_MAX: usize = 64;

/// Named users' passwords a gateway checks at once; more AUTH wait their turn. A check whose
/// salt is new costs an Argon2id (19 MiB, tens of milliseconds of CPU), computed by the client
/// library inside the connection's preamble, on a runtime thread that a server's front end
/// shares with its master: a guesser (whose failures the per-second limit bounds) must not be
/// able to take every thread at once.
pub const USER_CHECKS_AT_ONCE_MAX: usize = 2;

/// A cached named user's client, under the user's name and the SHA-256 of the password it
/// was made with.
struct CachedUser {
    name: String,
    password_digest: [u8; 32],
    user: Arc<UserPassword>,
    client: Client,
}

/// The bounded cache of named users' clients, oldest first.
#[derive(Default)]
pub(crate) struct UserClientCache {
    entries: VecDeque<CachedUser>,
}

impl std::fmt::Debug for UserClientCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserClientCache({} clients)", self.entries.len())
    }
}

impl UserClientCache {
    /// The user and client made for `name` with the password of this digest.
    pub(crate) fn find(
        &self,
        name: &str,
        digest: &[u8; 32],
    ) -> Option<(Arc<UserPassword>, Client)> {
        self.entries
            .iter()
            .find(|entry| entry.name == name && &entry.password_digest == digest)
            .map(|entry| (entry.user.clone(), entry.client.clone()))
    }

    /// Keeps `client` (replacing one for the same name and password), forgetting the oldest
    /// beyond `USER_CLIENTS_CACHED_MAX`.
    pub(crate) fn insert(
        &mut self,
        name: &str,
        digest: [u8; 32],
        user: Arc<UserPassword>,
        client: Client,
    ) {
        self.entries.retain(|entry| !(entry.name == name && entry.password_digest == digest));
        while self.entries.len() >= USER_CLIENTS_CACHED_MAX {
            self.entries.pop_front();
        }
        self.entries.push_back(CachedUser {
            name: name.to_string(),
            password_digest: digest,
            user,
            client,
        });
    }

    /// Forgets the client made for `name` with the password of this digest (it no longer
    /// authenticates).
    pub(crate) fn forget_password(&mut self, name: &str, digest: &[u8; 32]) {
        self.entries.retain(|entry| !(entry.name == name && &entry.password_digest == digest));
    }

    /// Forgets every client of `name` (the user was changed or deleted).
    pub(crate) fn forget(&mut self, name: &str) {
        self.entries.retain(|entry| entry.name != name);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The default user's password; its Debug output is redacted.
#[derive(Clone)]
pub struct RespPassword(pub Vec<u8>);

impl std::fmt::Debug for RespPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RespPassword(<redacted>)")
    }
}

impl RespPassword {
    /// True if `candidate` is the password; the time taken depends on the lengths only.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        self.0.len() == candidate.len()
            && self.0.iter().zip(candidate).fold(0u8, |difference, (a, b)| difference | (a ^ b))
                == 0
    }
}

impl Default for GatewayConfig {
    fn default() -> GatewayConfig {
        GatewayConfig {
            table_prefix: "redis-db-".to_string(),
            table_span: 1,
            databases: 16,
            limits: RequestLimits::default(),
            connections_max: 10_000,
            keys_reply_bytes_max: 64 << 20,
            scans_open_max: 1_024,
            local_master: None,
            password: None,
            user_clients: None,
        }
    }
}

/// A SCAN in progress: the enumeration continues where the previous call stopped.
#[derive(Debug)]
pub(crate) struct OpenScan {
    pub(crate) database: u32,
    /// The named user whose session opened it (None: the default user): its enumeration
    /// reads with that session's client, so only that user's sessions may continue it (cursor
    /// numbers are small and guessable).
    pub(crate) user: Option<String>,
    pub(crate) enumeration: Enumeration,
}

/// Open SCAN cursors, bounded: the oldest is forgotten when a new one would exceed the bound.
#[derive(Debug, Default)]
pub(crate) struct ScanRegistry {
    next_cursor: u64,
    open: HashMap<u64, OpenScan>,
    /// Cursors in the order they were opened; may hold cursors already consumed, pruned when
    /// it grows past a few times the bound.
    order: VecDeque<u64>,
}

impl ScanRegistry {
    #[cfg(test)]
    pub(crate) fn take(&mut self, cursor: u64) -> Option<OpenScan> {
        self.open.remove(&cursor)
    }

    /// The scan under `cursor` if it reads `database` for `user` (None: the default user); a
    /// scan of another user or database stays (a session cannot consume another's cursors).
    pub(crate) fn take_matching(
        &mut self,
        cursor: u64,
        database: u32,
        user: Option<&str>,
    ) -> Option<OpenScan> {
        match self.open.get(&cursor) {
            Some(scan) if scan.database == database && scan.user.as_deref() == user => {
                self.open.remove(&cursor)
            }
            _ => None,
        }
    }

    /// Keeps `scan` under a fresh cursor (never 0, which means "start" and "done").
    pub(crate) fn insert(&mut self, scan: OpenScan, open_max: usize) -> u64 {
        while self.open.len() >= open_max.max(1) {
            match self.order.pop_front() {
                Some(oldest) => {
                    self.open.remove(&oldest);
                }
                None => break,
            }
        }
        if self.order.len() > 4 * open_max.max(1) {
            let open = &self.open;
            self.order.retain(|cursor| open.contains_key(cursor));
        }
        self.next_cursor = self.next_cursor.wrapping_add(1).max(1);
        let cursor = self.next_cursor;
        self.open.insert(cursor, scan);
        self.order.push_back(cursor);
        cursor
    }
}

/// State shared by every connection of a gateway.
/// A gateway's counters (see `Gateway::statistics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayStatistics {
    /// Connections open now.
    pub connected_clients: u64,
    /// Connections accepted since the start.
    pub connections_received: u64,
    /// Commands executed since the start.
    pub commands_processed: u64,
    /// AUTH and HELLO … AUTH attempts refused (a wrong user or password, or past the rate
    /// limit).
    pub authentications_failed: u64,
}

#[derive(Debug)]
pub struct Gateway {
    pub(crate) client: Client,
    pub(crate) config: GatewayConfig,
    tables: Mutex<HashMap<u32, TableId>>,
    pub(crate) scans: Mutex<ScanRegistry>,
    /// Named users' clients (AUTH user password).
    pub(crate) user_clients: Mutex<UserClientCache>,
    /// Turns to check a named user's password (`USER_CHECKS_AT_ONCE_MAX`).
    pub(crate) user_checks: tokio::sync::Semaphore,
    next_client_id: AtomicU64,
    pub(crate) connected_clients: AtomicU64,
    pub(crate) connections_received: AtomicU64,
    pub(crate) commands_processed: AtomicU64,
    /// AUTH and HELLO … AUTH attempts with a wrong user or password.
    pub(crate) authentications_failed: AtomicU64,
    /// Failed AUTH attempts in the current one-second window (its start, its count): past
    /// `AUTH_FAILURES_PER_SECOND_MAX`, AUTH is refused unchecked until the window ends.
    pub(crate) auth_failure_window: Mutex<(Instant, u32)>,
    pub(crate) started: Instant,
    /// This gateway's wall clock: what EXPIRETIME and the absolute expiry forms compare with.
    pub(crate) wall_clock: std::sync::Arc<dyn stratus_env::WallClock>,
}

impl Gateway {
    /// A gateway forwarding to the cluster `client` talks to.
    pub fn new(client: Client, config: GatewayConfig) -> Gateway {
        Gateway {
            client,
            config,
            tables: Mutex::new(HashMap::new()),
            scans: Mutex::new(ScanRegistry::default()),
            user_clients: Mutex::new(UserClientCache::default()),
            user_checks: tokio::sync::Semaphore::new(USER_CHECKS_AT_ONCE_MAX),
            next_client_id: AtomicU64::new(1),
            connected_clients: AtomicU64::new(0),
            connections_received: AtomicU64::new(0),
            commands_processed: AtomicU64::new(0),
            authentications_failed: AtomicU64::new(0),
            auth_failure_window: Mutex::new((Instant::now(), 0)),
            started: Instant::now(),
            wall_clock: std::sync::Arc::new(stratus_env::SystemWallClock),
        }
    }

    /// What the gateway has done so far (for metrics).
    pub fn statistics(&self) -> GatewayStatistics {
        GatewayStatistics {
            connected_clients: self.connected_clients.load(Ordering::Relaxed),
            connections_received: self.connections_received.load(Ordering::Relaxed),
            commands_processed: self.commands_processed.load(Ordering::Relaxed),
            authentications_failed: self.authentications_failed.load(Ordering::Relaxed),
        }
    }

    /// The name of the Stratus table holding database `database`.
    pub fn table_name(&self, database: u32) -> String {
        format!("{}{database}", self.config.table_prefix)
    }

    /// The table of `database`, created on first use (create_table returns the existing id
    /// when the name is taken, so gateways racing to create it agree). A named user's session
    /// looks it up first and creates it only if it does not exist: creating needs ADMIN on
    /// it, reading and writing an existing one does not.
    pub(crate) async fn table(
        &self,
        session: &Session,
        database: u32,
    ) -> stratus_client::Result<TableId> {
        if let Some(&table) = self.lock_tables().get(&database) {
            return Ok(table);
        }
        let client = self.client_of(session);
        let name = self.table_name(database);
        let table = match &session.user {
            None => client.create_table(&name, self.config.table_span).await?,
            Some(_) => match client.get_table_id(&name).await {
                Ok(table) => table,
                Err(failure) if failure.status == Status::TableDoesntExist => {
                    client.create_table(&name, self.config.table_span).await?
                }
                Err(failure) => return Err(failure),
            },
        };
        self.lock_tables().insert(database, table);
        Ok(table)
    }

    /// The client `session`'s commands use: its named user's, or the gateway's own (a
    /// cluster member's, or the default user's).
    pub(crate) fn client_of<'a>(&'a self, session: &'a Session) -> &'a Client {
        session.user.as_ref().map_or(&self.client, |user| &user.client)
    }

    pub(crate) fn lock_user_clients(&self) -> std::sync::MutexGuard<'_, UserClientCache> {
        self.user_clients.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Forgets the cached id of `database` (its table was dropped, here or elsewhere).
    pub(crate) fn forget_table(&self, database: u32) {
        self.lock_tables().remove(&database);
    }

    fn lock_tables(&self) -> std::sync::MutexGuard<'_, HashMap<u32, TableId>> {
        self.tables.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    pub(crate) fn lock_scans(&self) -> std::sync::MutexGuard<'_, ScanRegistry> {
        self.scans.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    pub(crate) fn new_client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// One connection's state.
#[derive(Debug)]
pub struct Session {
    /// The reply encoding (HELLO switches it).
    pub protocol: Protocol,
    /// The selected database.
    pub database: u32,
    /// CLIENT SETNAME's name.
    pub name: Option<bytes::Bytes>,
    /// CLIENT ID.
    pub id: u64,
    /// The commands queued since MULTI (`None`: not in MULTI).
    pub(crate) queue: Option<Queue>,
    /// The keys WATCHed since the last EXEC, DISCARD or UNWATCH, with their versions.
    pub(crate) watches: Watches,
    /// Whether the connection gave the password (or none is needed).
    pub(crate) authenticated: bool,
    /// The named user the connection authenticated as (None: the default user).
    pub(crate) user: Option<UserSession>,
}

/// A session authenticated as a named user: its name and the client acting as it.
#[derive(Debug)]
pub(crate) struct UserSession {
    pub(crate) name: String,
    pub(crate) client: Client,
}

impl Session {
    /// A new connection's session: RESP2, database 0.
    pub fn new(id: u64) -> Session {
        Session {
            protocol: Protocol::Resp2,
            database: 0,
            name: None,
            id,
            queue: None,
            watches: Watches::default(),
            authenticated: false,
            user: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use stratus_client::{Client, ClientConfig, TableId};

    use super::{OpenScan, ScanRegistry, UserClientCache, USER_CLIENTS_CACHED_MAX};

    #[test]
    fn user_client_cache_is_bounded_and_keyed_by_name_and_password() {
        use std::sync::Arc;
        let user = Arc::new(stratus_client::UserPassword::new("alice", b"password-1").unwrap());
        let client = Client::new(ClientConfig::new("127.0.0.1:1"));
        let mut cache = UserClientCache::default();
        cache.insert("alice", [1; 32], user.clone(), client.clone());
        assert!(cache.find("alice", &[1; 32]).is_some());
        assert!(cache.find("alice", &[2; 32]).is_none(), "another password");
        assert!(cache.find("bob", &[1; 32]).is_none());
        cache.insert("alice", [1; 32], user.clone(), client.clone());
        assert_eq!(cache.len(), 1, "the same name and password replace");
        for index in 0..USER_CLIENTS_CACHED_MAX as u8 {
            cache.insert(&format!("user{index}"), [index; 32], user.clone(), client.clone());
        }
        assert_eq!(cache.len(), USER_CLIENTS_CACHED_MAX);
        assert!(cache.find("alice", &[1; 32]).is_none(), "the oldest is forgotten");
        assert!(cache.find("user1", &[1; 32]).is_some());
        cache.forget("user1");
        assert!(cache.find("user1", &[1; 32]).is_none());
        cache.insert("user2", [7; 32], user.clone(), client.clone());
        cache.forget_password("user2", &[7; 32]);
        assert!(cache.find("user2", &[7; 32]).is_none());
        assert!(cache.find("user2", &[2; 32]).is_some(), "its other password's client stays");
    }

    #[test]
    fn scan_registry_is_bounded_and_cursors_work_once() {
        // No connection is made: an enumeration talks to the cluster only when stepped.
        let client = Client::new(ClientConfig::new("127.0.0.1:1"));
        let scan =
            || OpenScan { database: 0, user: None, enumeration: client.enumerate(TableId(1)) };
        let mut registry = ScanRegistry::default();
        let first = registry.insert(scan(), 2);
        let second = registry.insert(scan(), 2);
        let third = registry.insert(scan(), 2);
        assert!(first != 0 && second != first && third != second);
        assert!(registry.take(first).is_none(), "the oldest cursor is forgotten at the bound");
        assert!(registry.take(second).is_some());
        assert!(registry.take(second).is_none(), "a cursor works once");
        for _ in 0..100 {
            let cursor = registry.insert(scan(), 2);
            registry.take(cursor);
        }
        assert!(registry.order.len() <= 8 + 1, "consumed cursors are pruned");
        assert!(registry.take(third).is_some());
        let alices = OpenScan {
            database: 0,
            user: Some("alice".to_string()),
            enumeration: client.enumerate(TableId(1)),
        };
        let cursor = registry.insert(alices, 2);
        assert!(registry.take_matching(cursor, 0, None).is_none(), "another user's");
        assert!(registry.take_matching(cursor, 1, Some("alice")).is_none(), "another database");
        assert!(registry.take_matching(cursor, 0, Some("alice")).is_some());
    }
}
