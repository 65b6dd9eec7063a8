//! Command handlers: Redis semantics on top of the Stratus client.
//!
//! Every handler returns a [`Value`] or a [`Failure`]; the dispatcher checks arity first with
//! Redis's exact error texts, and runs a command a second time (once) when its database's
//! table was dropped under it (FLUSHDB on another connection or gateway): the first attempt
//! then changed nothing, and the second recreates the table.

use bytes::{Bytes, BytesMut};
use std::sync::Arc;

use stratus_client::{
    Client, Error, Expiry, Identity, KeyItem, RejectRules, ServerOverview, ServerStatus, Status,
    TableId, UserPassword, Version, WriteItem,
};
use stratus_types::limits::KEY_BYTES_MAX;

use crate::expiry::{parse_expiry, time_option, TimeGiven};
use crate::gateway::{Gateway, OpenScan, Session, UserSession};
use crate::glob;
use crate::hash::{is_hash, Hash, HASH_MARKER};
use crate::transaction;
use crate::value::{Protocol, Value};

/// How many times a read-modify-write command (INCR, APPEND, SET ... GET) re-reads and
/// retries when another client changed the key between its read and its conditional write.
/// Bounded so a hot key yields an error instead of a connection stuck forever.
pub const CONDITIONAL_UPDATE_ATTEMPTS_MAX: usize = 64;

/// Bytes of objects each SCAN step asks a master for (values travel with keys in an
/// enumeration, so this bounds a step's memory and latency).
const SCAN_BATCH_BYTES: u32 = 64 << 10;

/// Why a command did not produce its normal reply.
#[derive(Debug)]
pub enum Failure {
    /// A ready error (or other) reply.
    Reply(Value),
    /// The cluster refused or failed.
    Client(Error),
}

impl From<Error> for Failure {
    fn from(error: Error) -> Failure {
        Failure::Client(error)
    }
}

pub(crate) type Outcome = Result<Value, Failure>;

pub(crate) fn error(text: impl Into<String>) -> Failure {
    Failure::Reply(Value::error(text))
}

pub(crate) fn syntax_error() -> Failure {
    error("ERR syntax error")
}

pub(crate) fn not_an_integer() -> Failure {
    error("ERR value is not an integer or out of range")
}

pub(crate) fn wrong_type() -> Failure {
    error("WRONGTYPE Operation against a key holding the wrong kind of value")
}

/// Strings may not start with the bytes that mark a stored hash: the marker is how a value is
/// told to be a hash (docs/design/resp-hash-format.md).
pub(crate) fn check_string(value: &[u8]) -> Result<(), Failure> {
    if is_hash(value) {
        return Err(error(format!(
            "ERR Stratus reserves strings that start with the bytes {HASH_MARKER:02X?} for hashes"
        )));
    }
    Ok(())
}

/// A stored value that a string command may use: WRONGTYPE for a hash.
pub(crate) fn as_string(value: Bytes) -> Result<Bytes, Failure> {
    if is_hash(&value) {
        return Err(wrong_type());
    }
    Ok(value)
}

/// A stored value that a hash command may use (None: no such key): WRONGTYPE for a string.
fn as_hash(value: Option<Bytes>) -> Result<Option<Hash>, Failure> {
    match value {
        None => Ok(None),
        Some(value) if is_hash(&value) => {
            Hash::decode(&value).map(Some).map_err(|corrupt| error(format!("ERR {corrupt}")))
        }
        Some(_) => Err(wrong_type()),
    }
}

/// What a read-modify-write command does to the key once it has seen the current value.
pub(crate) enum Change {
    /// Nothing (the reply says why).
    Keep,
    /// Write this value with this expiry (`Keep`: the one the key has, as INCR, APPEND and
    /// HSET keep it), if the key still has the version read.
    Write(Bytes, Expiry),
    /// Remove the key, if it still has the version read (a hash's last field deleted).
    Remove,
}

/// How long INFO's `stratus` section waits for one server's figures: a server that takes
/// longer is counted unreachable rather than holding the reply.
const INFO_SERVER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// A client error as a reply: `ERR stratus: <status>: <details>`, the words every Stratus
/// tool uses for it (the error's `Display`).
/// A PERMISSION_DENIED (a named user without the grant the command needs) is Redis's
/// `NOPERM` with the cluster's words (`Write needs -w- on table "logs", and user "alice" has
/// r--`).
pub(crate) fn client_error_reply(error: &Error) -> Value {
    if error.status == Status::PermissionDenied {
        return Value::Error(format!("NOPERM {}", error.message));
    }
    Value::Error(format!("ERR stratus: {error}"))
}

/// A command's name, arity (Redis's convention: n means exactly n arguments including the
/// name, -n at least n), flags, and first key, last key and step (for COMMAND).
struct CommandSpecification {
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
}

const fn command(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> CommandSpecification {
    CommandSpecification { name, arity, flags, keys }
}

const READ: &[&str] = &["readonly", "fast"];
const WRITE: &[&str] = &["write", "denyoom"];
const WRITE_FAST: &[&str] = &["write", "fast"];
const CONNECTION: &[&str] = &["fast", "stale", "loading"];
const SLOW_READ: &[&str] = &["readonly"];
const ADMIN: &[&str] = &["admin", "noscript"];
const ACL: &[&str] = &["noscript", "loading", "stale"];
const TRANSACTION: &[&str] = &["noscript", "loading", "stale", "fast"];
const TRANSACTION_SLOW: &[&str] = &["noscript", "loading", "stale"];

/// Every command the gateway serves.
const COMMANDS: &[CommandSpecification] = &[
    command("ping", -1, CONNECTION, (0, 0, 0)),
    command("echo", 2, CONNECTION, (0, 0, 0)),
    command("hello", -1, CONNECTION, (0, 0, 0)),
    command("auth", -2, CONNECTION, (0, 0, 0)),
    command("select", 2, CONNECTION, (0, 0, 0)),
    command("quit", -1, CONNECTION, (0, 0, 0)),
    command("client", -2, CONNECTION, (0, 0, 0)),
    command("command", -1, CONNECTION, (0, 0, 0)),
    command("info", -1, SLOW_READ, (0, 0, 0)),
    command("config", -2, ADMIN, (0, 0, 0)),
    command("acl", -2, ACL, (0, 0, 0)),
    command("get", 2, READ, (1, 1, 1)),
    command("set", -3, WRITE, (1, 1, 1)),
    command("setnx", 3, WRITE, (1, 1, 1)),
    command("getset", 3, WRITE, (1, 1, 1)),
    command("setex", 4, WRITE, (1, 1, 1)),
    command("psetex", 4, WRITE, (1, 1, 1)),
    command("getex", -2, WRITE, (1, 1, 1)),
    command("expire", -3, WRITE_FAST, (1, 1, 1)),
    command("pexpire", -3, WRITE_FAST, (1, 1, 1)),
    command("expireat", -3, WRITE_FAST, (1, 1, 1)),
    command("pexpireat", -3, WRITE_FAST, (1, 1, 1)),
    command("persist", 2, WRITE_FAST, (1, 1, 1)),
    command("ttl", 2, READ, (1, 1, 1)),
    command("pttl", 2, READ, (1, 1, 1)),
    command("expiretime", 2, READ, (1, 1, 1)),
    command("pexpiretime", 2, READ, (1, 1, 1)),
    command("del", -2, WRITE, (1, -1, 1)),
    command("exists", -2, READ, (1, -1, 1)),
    command("type", 2, READ, (1, 1, 1)),
    command("incr", 2, WRITE, (1, 1, 1)),
    command("incrby", 3, WRITE, (1, 1, 1)),
    command("decr", 2, WRITE, (1, 1, 1)),
    command("decrby", 3, WRITE, (1, 1, 1)),
    command("mget", -2, READ, (1, -1, 1)),
    command("mset", -3, WRITE, (1, -1, 2)),
    command("strlen", 2, READ, (1, 1, 1)),
    command("append", 3, WRITE, (1, 1, 1)),
    command("hset", -4, WRITE, (1, 1, 1)),
    command("hsetnx", 4, WRITE, (1, 1, 1)),
    command("hmset", -4, WRITE, (1, 1, 1)),
    command("hget", 3, READ, (1, 1, 1)),
    command("hmget", -3, READ, (1, 1, 1)),
    command("hgetall", 2, SLOW_READ, (1, 1, 1)),
    command("hdel", -3, WRITE, (1, 1, 1)),
    command("hlen", 2, READ, (1, 1, 1)),
    command("hexists", 3, READ, (1, 1, 1)),
    command("hkeys", 2, SLOW_READ, (1, 1, 1)),
    command("hvals", 2, SLOW_READ, (1, 1, 1)),
    command("hstrlen", 3, READ, (1, 1, 1)),
    command("hincrby", 4, WRITE, (1, 1, 1)),
    command("dbsize", 1, SLOW_READ, (0, 0, 0)),
    command("keys", 2, SLOW_READ, (0, 0, 0)),
    command("scan", -2, SLOW_READ, (0, 0, 0)),
    command("flushdb", -1, WRITE, (0, 0, 0)),
    command("flushall", -1, WRITE, (0, 0, 0)),
    command("multi", 1, TRANSACTION, (0, 0, 0)),
    command("exec", 1, TRANSACTION_SLOW, (0, 0, 0)),
    command("discard", 1, TRANSACTION, (0, 0, 0)),
    command("watch", -2, TRANSACTION, (1, -1, 1)),
    command("unwatch", 1, TRANSACTION, (0, 0, 0)),
];

fn specification(name: &str) -> Option<&'static CommandSpecification> {
    COMMANDS.iter().find(|command| command.name == name)
}

fn command_entry(command: &CommandSpecification) -> Value {
    let flags = command.flags.iter().map(|flag| Value::simple(flag)).collect();
    Value::Array(vec![
        Value::bulk(command.name.as_bytes()),
        Value::Integer(command.arity),
        Value::Set(flags),
        Value::Integer(command.keys.0),
        Value::Integer(command.keys.1),
        Value::Integer(command.keys.2),
        Value::Set(Vec::new()),
        Value::Set(Vec::new()),
        Value::Array(Vec::new()),
        Value::Array(Vec::new()),
    ])
}

/// Redis's `string2ll`: optional '-', no '+', no spaces, no leading zeros, fits in i64.
pub fn parse_integer(text: &[u8]) -> Option<i64> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let valid = match digits {
        [] => false,
        [b'0'] => digits.len() == text.len(),
        [first, ..] => (b'1'..=b'9').contains(first) && digits.iter().all(u8::is_ascii_digit),
    };
    if !valid || text.len() > 20 {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

pub(crate) fn check_key(key: &[u8]) -> Result<(), Failure> {
    if key.is_empty() {
        return Err(error("ERR empty keys are not supported by Stratus"));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(error(format!(
            "ERR keys longer than {KEY_BYTES_MAX} bytes are not supported by Stratus"
        )));
    }
    Ok(())
}

pub(crate) fn lowercase(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_ascii_lowercase()
}

/// Redis's unknown-command text: the name and up to about 128 bytes of arguments, each
/// quoted and followed by a space.
fn unknown_command(arguments: &[Bytes]) -> Value {
    let truncate = |bytes: &[u8], max: usize| {
        String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
    };
    let mut listed = String::new();
    for argument in &arguments[1..] {
        if listed.len() >= 128 {
            break;
        }
        listed.push_str(&format!("'{}' ", truncate(argument, 128 - listed.len())));
    }
    Value::error(format!(
        "ERR unknown command '{}', with args beginning with: {listed}",
        truncate(&arguments[0], 128)
    ))
}

/// The command, if the gateway knows it and it has a number of arguments its arity allows;
/// else the error Redis answers.
fn check_call(name: &str, arguments: &[Bytes]) -> Result<(), Value> {
    let Some(specification) = specification(name) else {
        return Err(unknown_command(arguments));
    };
    let count = arguments.len() as i64;
    if (specification.arity > 0 && count != specification.arity)
        || (specification.arity < 0 && count < -specification.arity)
    {
        return Err(wrong_arity(name));
    }
    Ok(())
}

pub(crate) fn wrong_arity(name: &str) -> Value {
    Value::error(format!("ERR wrong number of arguments for '{name}' command"))
}

fn unknown_subcommand(subcommand: &[u8], command: &str) -> Failure {
    error(format!(
        "ERR unknown subcommand '{}'. Try {} HELP.",
        String::from_utf8_lossy(&subcommand[..subcommand.len().min(128)]),
        command.to_ascii_uppercase()
    ))
}

/// How long a wrong password waits for its answer: a guesser gets a few tries per second per
/// connection (and connections are bounded), a person who mistyped hardly notices.
const WRONG_PASSWORD_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// Failed AUTH attempts a gateway checks per second, over all its connections; beyond it AUTH
/// is refused without checking until the second ends. A hundred is far more than people
/// mistyping and far fewer than a guesser needs.
const AUTH_FAILURES_PER_SECOND_MAX: u32 = 100;

/// Redis's answer to a wrong user or password.
fn wrong_password() -> Failure {
    error("WRONGPASS invalid username-password pair or user is disabled.")
}

/// What the cluster said of a named user's password.
enum UserCheck {
    /// Right (a named user's session, or None for the default user).
    Accepted(Option<UserSession>),
    /// Wrong, or no such user (or a disabled one).
    Refused,
    /// The cluster could not be asked.
    Unanswered(Failure),
}

/// What a command asks of the connection besides its reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Keep reading commands.
    Continue,
    /// Send the reply, then close (QUIT).
    Close,
}

impl Gateway {
    /// Runs one command and appends its reply, encoded for the session's protocol, to `out`.
    pub async fn execute(
        &self,
        session: &mut Session,
        arguments: &[Bytes],
        out: &mut BytesMut,
    ) -> After {
        self.commands_processed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(first) = arguments.first() else { return After::Continue };
        let name = lowercase(first);
        if self.needs_password(session) && !matches!(name.as_str(), "auth" | "hello" | "quit") {
            // As Redis with `requirepass`: nothing else before the password.
            Value::error("NOAUTH Authentication required.").encode(session.protocol, out);
            return After::Continue;
        }
        let reply = match check_call(&name, arguments) {
            Err(refusal) => {
                // As Redis: an unknown command or a wrong arity inside MULTI dooms its EXEC.
                if let Some(queue) = session.queue.as_mut() {
                    queue.refuse();
                }
                refusal
            }
            Ok(()) => match session.queue.as_mut() {
                Some(queue) if !transaction::runs_inside_multi(&name) => {
                    queue.enqueue(&name, arguments)
                }
                _ => self.run_command(session, &name, arguments).await,
            },
        };
        reply.encode(session.protocol, out);
        if name == "quit" {
            After::Close
        } else {
            After::Continue
        }
    }

    /// Runs a command now (not queued), once more if its database's table was dropped under
    /// it; its reply.
    async fn run_command(&self, session: &mut Session, name: &str, arguments: &[Bytes]) -> Value {
        let mut outcome = self.dispatch(session, name, arguments).await;
        if let Err(Failure::Client(failure)) = &outcome {
            if failure.status == Status::TableDoesntExist {
                self.forget_table(session.database);
                outcome = self.dispatch(session, name, arguments).await;
            }
        }
        match outcome {
            Ok(value) => value,
            Err(Failure::Reply(value)) => value,
            Err(Failure::Client(failure)) => client_error_reply(&failure),
        }
    }

    async fn dispatch(&self, session: &mut Session, name: &str, arguments: &[Bytes]) -> Outcome {
        let arguments = &arguments[1..];
        match name {
            "ping" => match arguments {
                [] => Ok(Value::simple("PONG")),
                [message] => Ok(Value::BulkString(message.clone())),
                _ => Err(Failure::Reply(wrong_arity("ping"))),
            },
            "echo" => Ok(Value::BulkString(arguments[0].clone())),
            "quit" => Ok(Value::ok()),
            "hello" => self.hello(session, arguments).await,
            "auth" => match arguments {
                [password] => self.authenticate(session, None, password).await,
                [user, password] => self.authenticate(session, Some(user), password).await,
                _ => Err(error("ERR syntax error")),
            },
            "select" => {
                let database = parse_integer(&arguments[0]).ok_or_else(not_an_integer)?;
                if database < 0 || database >= i64::from(self.config.databases) {
                    return Err(error("ERR DB index is out of range"));
                }
                session.database = database as u32;
                Ok(Value::ok())
            }
            "client" => self.client_command(session, arguments),
            "command" => command_command(arguments),
            "config" => match lowercase(&arguments[0]).as_str() {
                // No Redis configuration parameter exists here: every pattern matches none,
                // which is what Redis answers for an unknown parameter.
                "get" if arguments.len() >= 2 => Ok(Value::Map(Vec::new())),
                "get" => Err(Failure::Reply(wrong_arity("config|get"))),
                "set" => Err(error("ERR CONFIG SET is not supported by the Stratus gateway")),
                _ => Err(unknown_subcommand(&arguments[0], "config")),
            },
            "info" => self.info(session, arguments).await,
            "acl" => self.acl(session, arguments).await,
            "get" => self.get(session, &arguments[0]).await,
            "set" => self.set(session, arguments).await,
            "setnx" => {
                let reply = self
                    .set(
                        session,
                        &[arguments[0].clone(), arguments[1].clone(), Bytes::from_static(b"NX")],
                    )
                    .await?;
                Ok(Value::Integer(i64::from(reply == Value::ok())))
            }
            "getset" => {
                let options =
                    [arguments[0].clone(), arguments[1].clone(), Bytes::from_static(b"GET")];
                self.set(session, &options).await
            }
            "setex" | "psetex" => {
                let given = if name == "setex" { TimeGiven::Seconds } else { TimeGiven::Millis };
                // Checked before the key is touched, with the command's own error.
                parse_expiry(&arguments[1], given, true, name)?;
                let option = Bytes::from_static(if name == "setex" { b"EX" } else { b"PX" });
                let set =
                    [arguments[0].clone(), arguments[2].clone(), option, arguments[1].clone()];
                self.set(session, &set).await
            }
            "getex" => self.get_expiring(session, arguments).await,
            "expire" => self.expire(session, name, arguments, TimeGiven::Seconds).await,
            "pexpire" => self.expire(session, name, arguments, TimeGiven::Millis).await,
            "expireat" => self.expire(session, name, arguments, TimeGiven::UnixSeconds).await,
            "pexpireat" => self.expire(session, name, arguments, TimeGiven::UnixMillis).await,
            "persist" => self.persist(session, &arguments[0]).await,
            "ttl" => self.time_to_live(session, &arguments[0], false).await,
            "pttl" => self.time_to_live(session, &arguments[0], true).await,
            "expiretime" => self.expire_time(session, &arguments[0], false).await,
            "pexpiretime" => self.expire_time(session, &arguments[0], true).await,
            "del" => self.delete(session, arguments).await,
            "exists" => self.exists(session, arguments).await,
            "type" => Ok(Value::simple(match self.read_raw(session, &arguments[0]).await? {
                None => "none",
                Some(value) if is_hash(&value) => "hash",
                Some(_) => "string",
            })),
            "incr" => self.increment(session, &arguments[0], 1).await,
            "decr" => self.increment(session, &arguments[0], -1).await,
            "incrby" => {
                let delta = parse_integer(&arguments[1]).ok_or_else(not_an_integer)?;
                self.increment(session, &arguments[0], delta).await
            }
            "decrby" => {
                let delta = parse_integer(&arguments[1])
                    .ok_or_else(not_an_integer)?
                    .checked_neg()
                    .ok_or_else(|| error("ERR decrement would overflow"))?;
                self.increment(session, &arguments[0], delta).await
            }
            "mget" => self.multi_get(session, arguments).await,
            "mset" => self.multi_set(session, arguments).await,
            "strlen" => match self.get(session, &arguments[0]).await? {
                Value::BulkString(value) => Ok(Value::Integer(value.len() as i64)),
                _ => Ok(Value::Integer(0)),
            },
            "append" => self.append(session, &arguments[0], &arguments[1]).await,
            "hset" | "hmset" | "hsetnx" => self.hash_set(session, name, arguments).await,
            "hdel" => self.hash_delete(session, &arguments[0], &arguments[1..]).await,
            "hincrby" => {
                let delta = parse_integer(&arguments[2]).ok_or_else(not_an_integer)?;
                self.hash_increment(session, &arguments[0], &arguments[1], delta).await
            }
            "hget" | "hmget" | "hgetall" | "hlen" | "hexists" | "hkeys" | "hvals" | "hstrlen" => {
                let hash = self.read_hash(session, &arguments[0]).await?.unwrap_or_default();
                Ok(hash_read_reply(name, &hash, &arguments[1..]))
            }
            "dbsize" => self.database_size(session).await,
            "keys" => self.keys(session, &arguments[0]).await,
            "scan" => self.scan(session, arguments).await,
            "flushdb" => {
                check_flush_options(arguments)?;
                self.flush(session, session.database).await
            }
            "multi" => match session.queue {
                Some(_) => Err(error("ERR MULTI calls can not be nested")),
                None => {
                    session.queue = Some(transaction::Queue::default());
                    Ok(Value::ok())
                }
            },
            "exec" => self.exec(session).await,
            "discard" => match session.queue.take() {
                Some(_) => {
                    session.watches.clear();
                    Ok(Value::ok())
                }
                None => Err(error("ERR DISCARD without MULTI")),
            },
            "watch" => self.watch(session, arguments).await,
            "unwatch" => {
                session.watches.clear();
                Ok(Value::ok())
            }
            "flushall" => {
                check_flush_options(arguments)?;
                for database in 0..self.config.databases {
                    self.flush(session, database).await?;
                }
                Ok(Value::ok())
            }
            _ => Ok(unknown_command(&[Bytes::copy_from_slice(name.as_bytes())])),
        }
    }

    /// True if the connection must still give the password.
    pub(crate) fn needs_password(&self, session: &Session) -> bool {
        self.config.password.is_some() && !session.authenticated
    }

    /// AUTH [user] password, and HELLO's AUTH option: the user `default` (the client
    /// password), or a named user of the cluster, whose password the cluster checks (and
    /// whose grants it then applies to every command of the session). A wrong password is
    /// answered after [`WRONG_PASSWORD_DELAY`] and counted; a failed AUTH leaves the session
    /// as it was.
    async fn authenticate(
        &self,
        session: &mut Session,
        user: Option<&Bytes>,
        password: &[u8],
    ) -> Outcome {
        let named = user.filter(|user| user.as_ref() != b"default");
        let Some(expected) = &self.config.password else {
            // As Redis whose default user has no password: it accepts any password given
            // with its name, and only it exists.
            return match (user, named) {
                (None, _) => Err(error(
                    "ERR AUTH <password> called without any password configured for the \
                     default user. Are you sure your configuration is correct?",
                )),
                (Some(_), None) => Ok(Value::ok()),
                (Some(_), Some(_)) => Err(wrong_password()),
            };
        };
        if !self.reserve_auth_attempt() {
            self.authentications_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(WRONG_PASSWORD_DELAY).await;
            return Err(error("ERR too many failed AUTH attempts on this server; try again later"));
        }
        let checked = match named {
            None if expected.matches(password) => UserCheck::Accepted(None),
            None => UserCheck::Refused,
            Some(name) => self.check_user(name, password).await,
        };
        match checked {
            UserCheck::Accepted(user) => {
                // A success does not count against the window.
                self.release_auth_attempt();
                session.authenticated = true;
                session.user = user;
                Ok(Value::ok())
            }
            UserCheck::Unanswered(failure) => {
                self.release_auth_attempt();
                Err(failure)
            }
            UserCheck::Refused => {
                self.authentications_failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(WRONG_PASSWORD_DELAY).await;
                Err(wrong_password())
            }
        }
    }

    /// Checks a named user's password with the cluster: WHO_AM_I on a connection opened for
    /// it, which proves the password in its preamble. A client cached for the same name and
    /// password is reused for the session, but the check always opens a fresh connection
    /// (sharing the cached derived keys, so no new Argon2id while the salt is the same): the
    /// cached client's open connections proved the password when they were opened, and the
    /// password may have changed, or the user been disabled, since.
    async fn check_user(&self, name: &[u8], password: &[u8]) -> UserCheck {
        use sha2::Digest;
        let Some(factory) = &self.config.user_clients else { return UserCheck::Refused };
        let Ok(name) = std::str::from_utf8(name) else { return UserCheck::Refused };
        let digest: [u8; 32] = sha2::Sha256::digest(password).into();
        let cached = self.lock_user_clients().find(name, &digest);
        let (user, client, checker) = match cached {
            Some((user, client)) => {
                let checker = (factory.0)(user.clone());
                (user, client, checker)
            }
            None => {
                let Ok(user) = UserPassword::new(name, password) else {
                    return UserCheck::Refused;
                };
                let user = Arc::new(user);
                let client = (factory.0)(user.clone());
                (user, client.clone(), client)
            }
        };
        // Closed never: the semaphore lives as long as the gateway.
        let Ok(_turn) = self.user_checks.acquire().await else { return UserCheck::Refused };
        match checker.who_am_i().await {
            Ok(Identity::User { name: who, .. }) if who == name => {
                self.lock_user_clients().insert(name, digest, user, client.clone());
                UserCheck::Accepted(Some(UserSession { name: name.to_string(), client }))
            }
            Ok(_) => UserCheck::Refused,
            Err(failure)
                if matches!(
                    failure.status,
                    Status::AuthenticationFailed | Status::PermissionDenied
                ) =>
            {
                // A guess with another password leaves the user's cached clients alone.
                self.lock_user_clients().forget_password(name, &digest);
                UserCheck::Refused
            }
            Err(failure) => UserCheck::Unanswered(Failure::Client(failure)),
        }
    }

    /// Gives back an attempt taken from the current window (it did not fail).
    fn release_auth_attempt(&self) {
        let mut window = self.lock_auth_failure_window();
        window.1 = window.1.saturating_sub(1);
    }

    /// Takes one attempt from the current one-second window, unless
    /// `AUTH_FAILURES_PER_SECOND_MAX` were taken (by attempts that failed, or are being
    /// checked): the bound on guesses a second over all connections, each of which alone is
    /// slowed by `WRONG_PASSWORD_DELAY` but may be one of thousands. While a guesser exhausts
    /// it, honest clients are refused too, for that second: the price of the bound.
    fn reserve_auth_attempt(&self) -> bool {
        let mut window = self.lock_auth_failure_window();
        if window.0.elapsed() >= std::time::Duration::from_secs(1) {
            *window = (tokio::time::Instant::now(), 0);
        }
        if window.1 >= AUTH_FAILURES_PER_SECOND_MAX {
            return false;
        }
        window.1 += 1;
        true
    }

    fn lock_auth_failure_window(&self) -> std::sync::MutexGuard<'_, (tokio::time::Instant, u32)> {
        self.auth_failure_window.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    async fn hello(&self, session: &mut Session, arguments: &[Bytes]) -> Outcome {
        let mut protocol = session.protocol;
        if let Some(version) = arguments.first() {
            protocol = match parse_integer(version) {
                Some(2) => Protocol::Resp2,
                Some(3) => Protocol::Resp3,
                Some(_) => return Err(error("NOPROTO unsupported protocol version")),
                None => {
                    return Err(error("ERR Protocol version is not an integer or out of range"))
                }
            };
        }
        let mut name = None;
        let mut index = 1;
        while index < arguments.len() {
            let option = lowercase(&arguments[index]);
            match option.as_str() {
                "auth" if index + 2 < arguments.len() => {
                    let (user, password) = (&arguments[index + 1], &arguments[index + 2]);
                    self.authenticate(session, Some(user), password).await?;
                    index += 3;
                }
                "setname" if index + 1 < arguments.len() => {
                    name = Some(valid_client_name(&arguments[index + 1])?);
                    index += 2;
                }
                _ => {
                    return Err(error(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&arguments[index])
                    )))
                }
            }
        }
        if self.needs_password(session) {
            return Err(error(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            ));
        }
        session.protocol = protocol;
        if let Some(name) = name {
            session.name = name;
        }
        let protocol_number = if protocol == Protocol::Resp3 { 3 } else { 2 };
        Ok(Value::Map(vec![
            (Value::bulk(b"server"), Value::bulk(b"stratus")),
            (Value::bulk(b"version"), Value::bulk(b"7.0.0")),
            (Value::bulk(b"proto"), Value::Integer(protocol_number)),
            (Value::bulk(b"id"), Value::Integer(session.id as i64)),
            (Value::bulk(b"mode"), Value::bulk(b"standalone")),
            (Value::bulk(b"role"), Value::bulk(b"master")),
            (Value::bulk(b"modules"), Value::Array(Vec::new())),
        ]))
    }

    fn client_command(&self, session: &mut Session, arguments: &[Bytes]) -> Outcome {
        let subcommand = lowercase(&arguments[0]);
        let rest = &arguments[1..];
        match (subcommand.as_str(), rest) {
            ("setname", [name]) => {
                session.name = valid_client_name(name)?;
                Ok(Value::ok())
            }
            ("getname", []) => Ok(session.name.clone().map_or(Value::Null, Value::BulkString)),
            ("id", []) => Ok(Value::Integer(session.id as i64)),
            // Client libraries announce themselves (redis-py, for one); nothing to keep.
            ("setinfo", [_, _]) => Ok(Value::ok()),
            ("setname" | "getname" | "id" | "setinfo", _) => {
                Err(Failure::Reply(wrong_arity(&format!("client|{subcommand}"))))
            }
            _ => Err(unknown_subcommand(&arguments[0], "client")),
        }
    }

    async fn info(&self, session: &Session, arguments: &[Bytes]) -> Outcome {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let wanted: Vec<String> = arguments.iter().map(|section| lowercase(section)).collect();
        let all = wanted.is_empty()
            || wanted
                .iter()
                .any(|section| matches!(section.as_str(), "all" | "everything" | "default"));
        let include = |section: &str| all || wanted.iter().any(|wanted| wanted == section);
        let mut text = String::new();
        if include("server") {
            let _ = write!(
                text,
                "# Server\r\nredis_version:7.0.0\r\nstratus_version:{}\r\nredis_mode:standalone\r\nuptime_in_seconds:{}\r\n\r\n",
                env!("CARGO_PKG_VERSION"),
                self.started.elapsed().as_secs()
            );
        }
        if include("clients") {
            let _ = write!(
                text,
                "# Clients\r\nconnected_clients:{}\r\n\r\n",
                self.connected_clients.load(Relaxed)
            );
        }
        if include("stats") {
            let _ = write!(
                text,
                "# Stats\r\ntotal_connections_received:{}\r\ntotal_commands_processed:{}\r\n\r\n",
                self.connections_received.load(Relaxed),
                self.commands_processed.load(Relaxed)
            );
        }
        if include("stratus") {
            // The cluster's own figures: every live master's statistics, summed. Servers
            // that crashed or were removed are counted apart, not as unreachable masters.
            let overview = self.client_of(session).cluster_overview(INFO_SERVER_PATIENCE).await?;
            let up = |server: &&ServerOverview| server.entry.status == ServerStatus::Up;
            let servers_up = overview.servers.iter().filter(up).count();
            let servers_down = overview
                .servers
                .iter()
                .filter(|server| server.entry.status == ServerStatus::Crashed);
            let (mut masters, mut unreachable) = (0u64, 0u64);
            let (mut objects, mut live, mut allocated, mut total, mut requests) =
                (0u64, 0u64, 0u64, 0u64, 0u64);
            let live_masters = overview
                .servers
                .iter()
                .filter(up)
                .filter(|server| server.entry.services.has_master());
            for server in live_masters {
                match &server.statistics {
                    Some(statistics) => {
                        masters += 1;
                        objects += statistics.objects_live;
                        live += statistics.log_bytes_live;
                        allocated += statistics.log_bytes_allocated;
                        total += statistics.log_bytes_total;
                        requests += statistics.requests_served;
                    }
                    None => unreachable += 1,
                }
            }
            let _ = write!(
                text,
                "# Stratus\r\nstratus_servers:{servers_up}\r\nstratus_servers_crashed:{}\r\nstratus_masters:{masters}\r\nstratus_masters_unreachable:{unreachable}\r\nstratus_tables:{}\r\nstratus_objects_live:{objects}\r\nstratus_log_bytes_live:{live}\r\nstratus_log_bytes_allocated:{allocated}\r\nstratus_log_bytes_total:{total}\r\nstratus_requests_served:{requests}\r\n",
                servers_down.count(),
                overview.tables.len()
            );
            // Where this front end runs: in a storage server (whose master's keys cost no
            // hop) or in a gateway process.
            match &self.config.local_master {
                Some(address) => {
                    let _ = write!(
                        text,
                        "stratus_front_end:server\r\nstratus_local_master:{address}\r\n"
                    );
                }
                None => text.push_str("stratus_front_end:gateway\r\n"),
            }
            text.push_str("\r\n");
        }
        Ok(Value::BulkString(Bytes::from(text)))
    }

    async fn get(&self, session: &Session, key: &Bytes) -> Outcome {
        match self.read_raw(session, key).await? {
            Some(value) => Ok(Value::BulkString(as_string(value)?)),
            None => Ok(Value::Null),
        }
    }

    /// The stored value of `key`, string or hash (None: no such key).
    async fn read_raw(&self, session: &Session, key: &Bytes) -> Result<Option<Bytes>, Failure> {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        match self.client_of(session).read(table, key).await {
            Ok((value, _)) => Ok(Some(value)),
            Err(failure) if failure.status == Status::ObjectDoesntExist => Ok(None),
            Err(failure) => Err(failure.into()),
        }
    }

    /// The hash stored under `key` (None: no such key; WRONGTYPE for a string).
    async fn read_hash(&self, session: &Session, key: &Bytes) -> Result<Option<Hash>, Failure> {
        as_hash(self.read_raw(session, key).await?)
    }

    /// HSET, HMSET (replies OK) and HSETNX (sets only a new field): one read-modify-write of
    /// the whole hash.
    async fn hash_set(&self, session: &Session, name: &str, arguments: &[Bytes]) -> Outcome {
        let (key, pairs) = (&arguments[0], &arguments[1..]);
        if !pairs.len().is_multiple_of(2) {
            return Err(Failure::Reply(wrong_arity(name)));
        }
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        self.update(self.client_of(session), table, key, |current| {
            let mut hash = as_hash(current)?.unwrap_or_default();
            if name == "hsetnx" && hash.get(&pairs[0]).is_some() {
                return Ok((Change::Keep, Value::Integer(0)));
            }
            let mut added = 0;
            for pair in pairs.chunks(2) {
                added += i64::from(hash.set(pair[0].clone(), pair[1].clone()));
            }
            let reply = if name == "hmset" { Value::ok() } else { Value::Integer(added) };
            Ok((Change::Write(hash.encode(), Expiry::Keep), reply))
        })
        .await
    }

    /// HDEL: removes the fields; a hash left empty is removed, as Redis does.
    async fn hash_delete(&self, session: &Session, key: &Bytes, fields: &[Bytes]) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        self.update(self.client_of(session), table, key, |current| {
            let Some(mut hash) = as_hash(current)? else {
                return Ok((Change::Keep, Value::Integer(0)));
            };
            let removed = hash.remove(fields) as i64;
            let change = match (removed, hash.is_empty()) {
                (0, _) => Change::Keep,
                (_, true) => Change::Remove,
                (_, false) => Change::Write(hash.encode(), Expiry::Keep),
            };
            Ok((change, Value::Integer(removed)))
        })
        .await
    }

    /// HINCRBY on a decimal field, as Redis stores it.
    async fn hash_increment(
        &self,
        session: &Session,
        key: &Bytes,
        field: &Bytes,
        delta: i64,
    ) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        self.update(self.client_of(session), table, key, |current| {
            let mut hash = as_hash(current)?.unwrap_or_default();
            let old = match hash.get(field) {
                None => 0,
                Some(value) => {
                    parse_integer(value).ok_or_else(|| error("ERR hash value is not an integer"))?
                }
            };
            let new = old
                .checked_add(delta)
                .ok_or_else(|| error("ERR increment or decrement would overflow"))?;
            hash.set(field.clone(), Bytes::from(new.to_string()));
            Ok((Change::Write(hash.encode(), Expiry::Keep), Value::Integer(new)))
        })
        .await
    }

    /// SET key value [NX|XX] [GET] [EX s|PX ms|EXAT t|PXAT t|KEEPTTL]. NX is Stratus's
    /// `exists` reject rule (refuse when the object exists), XX its `doesnt_exist` rule; GET
    /// reads the old value and writes only if the version read is still current. Without an
    /// expiry option the key's expiry is cleared, as Redis does; KEEPTTL keeps it.
    async fn set(&self, session: &Session, arguments: &[Bytes]) -> Outcome {
        #[derive(PartialEq)]
        enum Condition {
            Always,
            IfAbsent,
            IfPresent,
        }
        let (key, value) = (&arguments[0], &arguments[1]);
        let mut condition = Condition::Always;
        let mut return_old = false;
        let mut expiry: Option<Expiry> = None;
        let mut options = arguments[2..].iter();
        while let Some(option) = options.next() {
            let option = lowercase(option);
            match option.as_str() {
                "nx" if condition != Condition::IfPresent => condition = Condition::IfAbsent,
                "xx" if condition != Condition::IfAbsent => condition = Condition::IfPresent,
                "get" => return_old = true,
                "keepttl" if expiry.is_none() => expiry = Some(Expiry::Keep),
                time if expiry.is_none() && time_option(time).is_some() => {
                    let given = time_option(time).expect("checked by the guard");
                    let amount = options.next().ok_or_else(syntax_error)?;
                    expiry = Some(parse_expiry(amount, given, true, "set")?);
                }
                _ => return Err(syntax_error()),
            }
        }
        let expiry = expiry.unwrap_or(Expiry::Never);
        check_key(key)?;
        check_string(value)?;
        let table = self.table(session, session.database).await?;
        if return_old {
            return self
                .update(self.client_of(session), table, key, |current| {
                    let current = current.map(as_string).transpose()?;
                    let old = current.clone().map_or(Value::Null, Value::BulkString);
                    let write = match condition {
                        Condition::IfAbsent => current.is_none(),
                        Condition::IfPresent => current.is_some(),
                        Condition::Always => true,
                    };
                    let change =
                        if write { Change::Write(value.clone(), expiry) } else { Change::Keep };
                    Ok((change, old))
                })
                .await;
        }
        let rules = match condition {
            Condition::Always => RejectRules::NONE,
            Condition::IfAbsent => RejectRules { exists: true, ..RejectRules::NONE },
            Condition::IfPresent => RejectRules { doesnt_exist: true, ..RejectRules::NONE },
        };
        match self.client_of(session).write_expiring(table, key, value.clone(), rules, expiry).await
        {
            Ok(_) => Ok(Value::ok()),
            Err(failure)
                if matches!(failure.status, Status::ObjectExists | Status::ObjectDoesntExist) =>
            {
                Ok(Value::Null)
            }
            Err(failure) => Err(failure.into()),
        }
    }

    /// Read, compute, and write (or remove) only if the object still has the version read
    /// (version 0: still missing); retried a bounded number of times when another writer got
    /// in between. `change` gets the current value (None when missing) and returns what to do
    /// and the reply.
    async fn update<F>(
        &self,
        client: &Client,
        table: TableId,
        key: &Bytes,
        mut change: F,
    ) -> Outcome
    where
        F: FnMut(Option<Bytes>) -> Result<(Change, Value), Failure>,
    {
        for _ in 0..CONDITIONAL_UPDATE_ATTEMPTS_MAX {
            let (current, version) = match client.read(table, key).await {
                Ok((value, version)) => (Some(value), version),
                Err(failure) if failure.status == Status::ObjectDoesntExist => {
                    (None, Version::NONEXISTENT)
                }
                Err(failure) => return Err(failure.into()),
            };
            let (change, reply) = change(current)?;
            let rules = RejectRules::version_equals(version);
            let outcome = match change {
                Change::Keep => return Ok(reply),
                Change::Write(new_value, expiry) => {
                    client.write_expiring(table, key, new_value, rules, expiry).await.map(|_| ())
                }
                Change::Remove => client.remove_with(table, key, rules).await.map(|_| ()),
            };
            match outcome {
                Ok(()) => return Ok(reply),
                Err(failure) if failure.status == Status::WrongVersion => continue,
                Err(failure) => return Err(failure.into()),
            }
        }
        Err(error(format!(
            "ERR key changed by other clients {CONDITIONAL_UPDATE_ATTEMPTS_MAX} times during this command; try again"
        )))
    }

    /// INCR and friends on decimal ASCII values, as Redis stores them (not Stratus's 8-byte
    /// integers): read, add with overflow check, conditional write.
    async fn increment(&self, session: &Session, key: &Bytes, delta: i64) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        self.update(self.client_of(session), table, key, |current| {
            let old = match current.map(as_string).transpose()? {
                None => 0,
                Some(value) => parse_integer(&value).ok_or_else(not_an_integer)?,
            };
            let new = old
                .checked_add(delta)
                .ok_or_else(|| error("ERR increment or decrement would overflow"))?;
            Ok((Change::Write(Bytes::from(new.to_string()), Expiry::Keep), Value::Integer(new)))
        })
        .await
    }

    async fn append(&self, session: &Session, key: &Bytes, suffix: &Bytes) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        self.update(self.client_of(session), table, key, |current| {
            let mut value =
                current.map(as_string).transpose()?.map(|value| value.to_vec()).unwrap_or_default();
            value.extend_from_slice(suffix);
            check_string(&value)?;
            let length = value.len() as i64;
            Ok((Change::Write(Bytes::from(value), Expiry::Keep), Value::Integer(length)))
        })
        .await
    }

    async fn key_items(&self, session: &Session, keys: &[Bytes]) -> Result<Vec<KeyItem>, Failure> {
        keys.iter().try_for_each(|key| check_key(key))?;
        let table_id = self.table(session, session.database).await?;
        Ok(keys
            .iter()
            .map(|key| KeyItem { table_id, key: key.clone(), rules: RejectRules::NONE })
            .collect())
    }

    /// DEL: one multi-remove; a removed version of 0 means the key did not exist.
    async fn delete(&self, session: &Session, keys: &[Bytes]) -> Outcome {
        let items = self.key_items(session, keys).await?;
        let mut removed = 0;
        for outcome in self.client_of(session).multi_remove(&items).await {
            if outcome? != Version::NONEXISTENT {
                removed += 1;
            }
        }
        Ok(Value::Integer(removed))
    }

    /// EXISTS: one multi-read; a key named twice counts twice, as in Redis.
    async fn exists(&self, session: &Session, keys: &[Bytes]) -> Outcome {
        let items = self.key_items(session, keys).await?;
        let mut found = 0;
        for outcome in self.client_of(session).multi_read(&items).await {
            match outcome {
                Ok(_) => found += 1,
                Err(failure) if failure.status == Status::ObjectDoesntExist => {}
                Err(failure) => return Err(failure.into()),
            }
        }
        Ok(Value::Integer(found))
    }

    async fn multi_get(&self, session: &Session, keys: &[Bytes]) -> Outcome {
        let items = self.key_items(session, keys).await?;
        let mut values = Vec::with_capacity(items.len());
        for outcome in self.client_of(session).multi_read(&items).await {
            match outcome {
                // As Redis: MGET answers nil for a key that holds another type.
                Ok((value, _)) if is_hash(&value) => values.push(Value::Null),
                Ok((value, _)) => values.push(Value::BulkString(value)),
                Err(failure) if failure.status == Status::ObjectDoesntExist => {
                    values.push(Value::Null)
                }
                Err(failure) => return Err(failure.into()),
            }
        }
        Ok(Value::Array(values))
    }

    /// MSET: one multi-write, fanned out to the masters in parallel. Not atomic across keys
    /// (a transaction would cost a second round and locks): on an error some keys may be
    /// written. Inside MULTI it is atomic, like the whole EXEC (`transaction.rs`).
    async fn multi_set(&self, session: &Session, pairs: &[Bytes]) -> Outcome {
        if !pairs.len().is_multiple_of(2) {
            return Err(Failure::Reply(wrong_arity("mset")));
        }
        pairs.chunks(2).try_for_each(|pair| {
            check_key(&pair[0])?;
            check_string(&pair[1])
        })?;
        let table_id = self.table(session, session.database).await?;
        let items: Vec<WriteItem> = pairs
            .chunks(2)
            .map(|pair| WriteItem {
                table_id,
                key: pair[0].clone(),
                value: pair[1].clone(),
                rules: RejectRules::NONE,
                expiry: stratus_client::Expiry::Never,
                rpc: None,
            })
            .collect();
        for outcome in self.client_of(session).multi_write(&items).await {
            outcome?;
        }
        Ok(Value::ok())
    }

    /// DBSIZE: enumerates the table and counts (Stratus keeps no per-table count), so it costs
    /// a full scan like KEYS.
    async fn database_size(&self, session: &Session) -> Outcome {
        let table = self.table(session, session.database).await?;
        let mut enumeration = self.client_of(session).enumerate(table);
        let mut count = 0;
        while let Some(batch) = enumeration.next_batch().await? {
            count += batch.len() as i64;
        }
        Ok(Value::Integer(count))
    }

    /// KEYS: a full enumeration filtered by the pattern; refused once the reply would exceed
    /// `keys_reply_bytes_max` (use SCAN for big tables).
    async fn keys(&self, session: &Session, pattern: &Bytes) -> Outcome {
        let table = self.table(session, session.database).await?;
        let mut enumeration = self.client_of(session).enumerate(table);
        let (mut keys, mut bytes) = (Vec::new(), 0);
        while let Some(batch) = enumeration.next_batch().await? {
            for object in batch {
                if glob::matches(pattern, &object.key) {
                    bytes += object.key.len();
                    if bytes > self.config.keys_reply_bytes_max {
                        return Err(error(format!(
                            "ERR KEYS reply would exceed {} bytes; use SCAN",
                            self.config.keys_reply_bytes_max
                        )));
                    }
                    keys.push(Value::BulkString(object.key));
                }
            }
        }
        Ok(Value::Array(keys))
    }

    /// SCAN cursor [MATCH pattern] [COUNT n] [TYPE type]. Cursor 0 starts a Stratus
    /// enumeration; the gateway keeps it and answers with a fresh cursor naming it, or 0 when
    /// the table is exhausted. Every key present for the whole scan is returned exactly once.
    async fn scan(&self, session: &Session, arguments: &[Bytes]) -> Outcome {
        let cursor = std::str::from_utf8(&arguments[0])
            .ok()
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| error("ERR invalid cursor"))?;
        // TYPE: every key (None), or only keys of that type (other types match nothing).
        let (mut pattern, mut count, mut only_type) = (None, 10usize, None::<String>);
        let mut options = arguments[1..].chunks(2);
        for option in options.by_ref() {
            let [name, value] = option else { return Err(syntax_error()) };
            match lowercase(name).as_str() {
                "match" => pattern = Some(value.clone()),
                "count" => match parse_integer(value) {
                    Some(number) if number >= 1 => count = number.min(1 << 20) as usize,
                    Some(_) => return Err(syntax_error()),
                    None => return Err(not_an_integer()),
                },
                "type" => only_type = Some(lowercase(value)),
                _ => return Err(syntax_error()),
            }
        }
        let mut scan = if cursor == 0 {
            let table = self.table(session, session.database).await?;
            OpenScan {
                database: session.database,
                user: session.user.as_ref().map(|user| user.name.clone()),
                enumeration: self
                    .client_of(session)
                    .enumerate(table)
                    .with_batch_bytes(SCAN_BATCH_BYTES),
            }
        } else {
            let user = session.user.as_ref().map(|user| user.name.as_str());
            match self.lock_scans().take_matching(cursor, session.database, user) {
                Some(scan) => scan,
                None => return Err(error("ERR invalid cursor")),
            }
        };
        let mut keys = Vec::new();
        let mut examined = 0;
        let mut exhausted = false;
        while examined < count {
            match scan.enumeration.next_batch().await? {
                Some(batch) => {
                    examined += batch.len();
                    keys.extend(
                        batch
                            .into_iter()
                            .filter(|object| {
                                let kind = if is_hash(&object.value) { "hash" } else { "string" };
                                only_type.as_deref().is_none_or(|wanted| wanted == kind)
                                    && pattern
                                        .as_ref()
                                        .is_none_or(|pattern| glob::matches(pattern, &object.key))
                            })
                            .map(|object| Value::BulkString(object.key)),
                    );
                }
                None => {
                    exhausted = true;
                    break;
                }
            }
        }
        let next =
            if exhausted { 0 } else { self.lock_scans().insert(scan, self.config.scans_open_max) };
        Ok(Value::Array(vec![Value::bulk(next.to_string().as_bytes()), Value::Array(keys)]))
    }

    /// Drops the database's table (its objects go with it); the next command recreates it.
    async fn flush(&self, session: &Session, database: u32) -> Outcome {
        self.forget_table(database);
        match self.client_of(session).drop_table(&self.table_name(database)).await {
            Ok(()) => Ok(Value::ok()),
            Err(failure) if failure.status == Status::TableDoesntExist => Ok(Value::ok()),
            Err(failure) => Err(Failure::Client(failure)),
        }
    }
}

fn check_flush_options(arguments: &[Bytes]) -> Result<(), Failure> {
    match arguments {
        [] => Ok(()),
        [mode] if matches!(lowercase(mode).as_str(), "sync" | "async") => Ok(()),
        _ => Err(syntax_error()),
    }
}

/// Redis refuses client names with spaces, newlines or other special characters; an empty
/// name clears it.
fn valid_client_name(name: &Bytes) -> Result<Option<Bytes>, Failure> {
    if name.iter().any(|&byte| !(b'!'..=b'~').contains(&byte)) {
        return Err(error(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok((!name.is_empty()).then(|| name.clone()))
}

fn command_command(arguments: &[Bytes]) -> Outcome {
    let Some(subcommand) = arguments.first() else {
        return Ok(Value::Array(COMMANDS.iter().map(command_entry).collect()));
    };
    match lowercase(subcommand).as_str() {
        "count" => Ok(Value::Integer(COMMANDS.len() as i64)),
        "list" => Ok(Value::Array(
            COMMANDS.iter().map(|command| Value::bulk(command.name.as_bytes())).collect(),
        )),
        "info" => Ok(Value::Array(
            arguments[1..]
                .iter()
                .map(|name| specification(&lowercase(name)).map_or(Value::Null, command_entry))
                .collect(),
        )),
        // redis-cli asks for documentation to show hints; it copes with none.
        "docs" => Ok(Value::Map(Vec::new())),
        _ => Err(unknown_subcommand(subcommand, "command")),
    }
}

/// The reply of a hash read command on `hash` (empty when the key does not exist), for the
/// fields named in `arguments` (after the key).
fn hash_read_reply(name: &str, hash: &Hash, arguments: &[Bytes]) -> Value {
    let value_of = |field: &Bytes| hash.get(field).cloned().map_or(Value::Null, Value::BulkString);
    match name {
        "hget" => value_of(&arguments[0]),
        "hmget" => Value::Array(arguments.iter().map(value_of).collect()),
        "hgetall" => Value::Map(
            hash.fields()
                .map(|(field, content)| {
                    (Value::BulkString(field.clone()), Value::BulkString(content.clone()))
                })
                .collect(),
        ),
        "hlen" => Value::Integer(hash.len() as i64),
        "hexists" => Value::Integer(i64::from(hash.get(&arguments[0]).is_some())),
        "hkeys" => {
            Value::Array(hash.fields().map(|(field, _)| Value::BulkString(field.clone())).collect())
        }
        "hvals" => Value::Array(
            hash.fields().map(|(_, content)| Value::BulkString(content.clone())).collect(),
        ),
        "hstrlen" => {
            Value::Integer(hash.get(&arguments[0]).map_or(0, |content| content.len() as i64))
        }
        // The dispatcher sends only the names above here.
        _ => Value::error(format!("ERR {name} is not a hash read command")),
    }
}

#[cfg(test)]
mod authentication_tests {
    use crate::gateway::{Gateway, GatewayConfig, RespPassword, Session};
    use crate::test_support::{call, offline_gateway_with};
    use crate::value::Value;

    fn gateway(password: Option<&str>) -> Gateway {
        offline_gateway_with(GatewayConfig {
            password: password.map(|password| RespPassword(password.as_bytes().to_vec())),
            ..GatewayConfig::default()
        })
    }

    fn error_text(value: Value) -> String {
        match value {
            Value::Error(text) => text,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn with_a_password_nothing_runs_before_auth_and_a_wrong_one_is_refused() {
        let gateway = gateway(Some("s3cret-password"));
        let mut session = Session::new(1);
        for command in [vec!["PING"], vec!["GET", "k"], vec!["SELECT", "1"], vec!["MULTI"]] {
            let text = error_text(call(&gateway, &mut session, &command).await);
            assert!(text.starts_with("NOAUTH"), "{command:?}: {text}");
        }
        let text = error_text(call(&gateway, &mut session, &["HELLO", "3"]).await);
        assert!(text.starts_with("NOAUTH HELLO must be called"), "{text}");
        for wrong in [vec!["AUTH", "guess"], vec!["AUTH", "admin", "s3cret-password"]] {
            let text = error_text(call(&gateway, &mut session, &wrong).await);
            assert!(text.starts_with("WRONGPASS"), "{text}");
        }
        assert_eq!(gateway.authentications_failed.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert_eq!(call(&gateway, &mut session, &["AUTH", "s3cret-password"]).await, Value::ok());
        assert_eq!(call(&gateway, &mut session, &["PING"]).await, Value::simple("PONG"));

        // HELLO with AUTH authenticates a new connection and switches its protocol at once.
        let mut other = Session::new(2);
        let hello = ["HELLO", "3", "AUTH", "default", "s3cret-password"];
        assert!(matches!(call(&gateway, &mut other, &hello).await, Value::Map(_)));
        assert_eq!(call(&gateway, &mut other, &["PING"]).await, Value::simple("PONG"));
        let mut third = Session::new(3);
        let wrong_hello = ["HELLO", "3", "AUTH", "default", "nope"];
        let text = error_text(call(&gateway, &mut third, &wrong_hello).await);
        assert!(text.starts_with("WRONGPASS"), "{text}");
        assert!(error_text(call(&gateway, &mut third, &["PING"]).await).starts_with("NOAUTH"));
        assert!(!format!("{:?}", gateway.config).contains("s3cret"), "password in Debug");
    }

    #[tokio::test]
    async fn failed_auth_attempts_are_bounded_per_second_over_all_connections() {
        let gateway = gateway(Some("s3cret-password"));
        let attempts = (0..120)
            .map(|id| {
                let gateway = &gateway;
                Box::pin(async move {
                    let mut session = Session::new(id);
                    error_text(call(gateway, &mut session, &["AUTH", "guess"]).await)
                }) as stratus_env::BoxFuture<'_, String>
            })
            .collect();
        let texts = stratus_env::join_all(attempts).await;
        let checked = texts.iter().filter(|text| text.starts_with("WRONGPASS")).count();
        let refused = texts.iter().filter(|text| text.contains("too many failed AUTH")).count();
        assert_eq!((checked, refused), (100, 20), "{texts:?}");
    }

    #[tokio::test]
    async fn without_a_password_everything_runs_and_auth_says_none_is_configured() {
        let gateway = gateway(None);
        let mut session = Session::new(1);
        assert_eq!(call(&gateway, &mut session, &["PING"]).await, Value::simple("PONG"));
        let text = error_text(call(&gateway, &mut session, &["AUTH", "anything"]).await);
        assert!(text.contains("without any password configured"), "{text}");
        assert_eq!(call(&gateway, &mut session, &["AUTH", "default", "x"]).await, Value::ok());
        let text = error_text(call(&gateway, &mut session, &["AUTH", "someone", "x"]).await);
        assert!(text.starts_with("WRONGPASS"), "{text}");
        let hello = ["HELLO", "3", "AUTH", "default", "anything"];
        assert!(matches!(call(&gateway, &mut session, &hello).await, Value::Map(_)));
    }
}
