//! MULTI / EXEC / DISCARD / WATCH / UNWATCH (docs/design/transactions.md, "Redis MULTI /
//! EXEC / WATCH"): the queued commands run at EXEC as one Stratus transaction, whose keys may
//! live on any masters.
//!
//! How Redis's semantics map onto a Stratus transaction:
//! 1. Queue time. MULTI opens a [`Queue`] on the session. A command that Stratus can run in a
//!    transaction ([`QUEUEABLE`]) and whose arity is right is answered `+QUEUED`; an unknown
//!    command, a wrong arity, a command not in [`QUEUEABLE`], or a queue past its bounds is
//!    answered with an error and dooms the EXEC (`EXECABORT`), as Redis does for errors at
//!    queue time. EXEC, DISCARD, MULTI, WATCH and QUIT run at once even inside MULTI.
//! 2. Exec time. The queued commands run in order on one [`Transaction`]: reads see the
//!    transaction's snapshot and its own earlier writes, writes are buffered. An error a
//!    command meets at exec time in Redis (WRONGTYPE, not an integer, a syntax error in its
//!    options) is that command's reply and the command changes nothing, while the others
//!    still apply: Redis does not roll back either. An error of the cluster (a timeout, a
//!    refused value) fails the whole EXEC, and nothing is applied.
//! 3. WATCH records each key's version (0: absent) as read before the transaction; EXEC gives
//!    them to the transaction as read at those versions ([`Transaction::expect_version`]), so
//!    the commit checks them with everything else it read. A conflict on a watched key makes
//!    EXEC answer a null array, as Redis does when a watched key changed; a conflict on
//!    another key (a concurrent transaction on a key only the queued commands touch) is
//!    retried by running the whole queue again ([`Client::run_transaction_retrying_if`]'s
//!    policy), because Redis, which runs EXEC alone, never fails there.
//!
//! [`Client::run_transaction_retrying_if`]: stratus_client::Client::run_transaction_retrying_if

use std::collections::BTreeMap;

use bytes::Bytes;
use stratus_client::{
    AbortReason, KeyItem, RejectRules, Status, TableId, Transaction, TransactionError, Version,
};
use stratus_types::limits::{TRANSACTION_BYTES_MAX, TRANSACTION_OBJECTS_MAX};

use crate::commands::{
    as_string, check_key, check_string, client_error_reply, error, lowercase, not_an_integer,
    parse_integer, syntax_error, wrong_arity, Failure, Outcome,
};
use crate::gateway::{Gateway, Session};
use crate::hash::is_hash;
use crate::value::Value;

/// Most commands one MULTI may queue: every queued command touches at least one object (but
/// PING, ECHO and UNWATCH), and one transaction holds at most `TRANSACTION_OBJECTS_MAX`, so a
/// longer queue could only be refused at EXEC after being held in memory.
pub const QUEUED_COMMANDS_MAX: usize = TRANSACTION_OBJECTS_MAX;

/// Most bytes of arguments one MULTI may queue: the transaction buffers its keys and values
/// within `TRANSACTION_BYTES_MAX`, so more queued bytes could never commit; this also bounds
/// the memory one connection's queue takes.
pub const QUEUED_BYTES_MAX: usize = TRANSACTION_BYTES_MAX;

/// Most keys one connection may WATCH at once: each is an object of its EXEC's transaction.
pub const WATCHED_KEYS_MAX: usize = TRANSACTION_OBJECTS_MAX;

/// The commands EXEC can run inside one Stratus transaction: those whose Redis semantics are
/// exactly a few transactional reads and writes of whole string values. The others are
/// refused at queue time: expiry cannot be changed by a transaction's write (SET's EX, PX,
/// EXAT and PXAT options are refused too), hashes are not served in transactions yet, and
/// scans and administration are not transactional.
pub const QUEUEABLE: &[&str] = &[
    "get", "set", "setnx", "getset", "del", "exists", "incr", "incrby", "decr", "decrby", "mget",
    "mset", "strlen", "append", "ping", "echo", "unwatch",
];

/// SET options that set an expiry, which a transaction's write cannot do.
const SET_EXPIRY_OPTIONS: &[&str] = &["ex", "px", "exat", "pxat"];

/// What Redis answers to EXEC after an error at queue time.
const EXEC_ABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// Commands that run at once inside MULTI instead of being queued.
pub(crate) fn runs_inside_multi(name: &str) -> bool {
    matches!(name, "exec" | "discard" | "multi" | "watch" | "quit")
}

/// The commands a session queued since MULTI.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    commands: Vec<Vec<Bytes>>,
    /// Bytes of the queued commands' arguments (bounded by [`QUEUED_BYTES_MAX`]).
    bytes: usize,
    /// An error at queue time: EXEC answers `EXECABORT` and runs nothing.
    refused: bool,
}

/// The keys a session WATCHes: (table, key) → the version it had when watched (0: absent).
/// The table, not the database number, so that a database flushed (its table dropped and
/// recreated under a new id) meanwhile is noticed.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    keys: BTreeMap<(TableId, Bytes), Version>,
}

impl Watches {
    pub(crate) fn clear(&mut self) {
        self.keys.clear();
    }

    fn covers(&self, reason: &AbortReason) -> bool {
        match reason {
            AbortReason::Conflict { table, key } => self.keys.contains_key(&(*table, key.clone())),
            AbortReason::Timeout => false,
        }
    }
}

impl Queue {
    /// Dooms the EXEC (an error was answered at queue time).
    pub(crate) fn refuse(&mut self) {
        self.refused = true;
    }

    /// Queues a command (its name and arity are checked already): `+QUEUED`, or the error
    /// that dooms the EXEC.
    pub(crate) fn enqueue(&mut self, name: &str, arguments: &[Bytes]) -> Value {
        let bytes: usize = arguments.iter().map(Bytes::len).sum();
        let refusal = if !QUEUEABLE.contains(&name) {
            Some(format!(
                "ERR {} is not supported inside MULTI by Stratus",
                name.to_ascii_uppercase()
            ))
        } else if name == "set"
            && arguments[3..].iter().any(|option| SET_EXPIRY_OPTIONS.contains(&&*lowercase(option)))
        {
            Some(
                "ERR SET with EX, PX, EXAT or PXAT is not supported inside MULTI by Stratus: a \
             transaction's write cannot set an expiry"
                    .to_string(),
            )
        } else if self.commands.len() >= QUEUED_COMMANDS_MAX {
            Some(format!(
                "ERR a Stratus transaction queues at most {QUEUED_COMMANDS_MAX} commands \
             (one transaction holds at most that many objects)"
            ))
        } else if self.bytes + bytes > QUEUED_BYTES_MAX {
            Some(format!(
                "ERR a Stratus transaction queues at most {QUEUED_BYTES_MAX} bytes of arguments \
             (one transaction buffers at most that many bytes)"
            ))
        } else {
            None
        };
        match refusal {
            Some(text) => {
                self.refuse();
                Value::error(text)
            }
            None => {
                self.commands.push(arguments.to_vec());
                self.bytes += bytes;
                Value::simple("QUEUED")
            }
        }
    }
}

/// SET's condition.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Condition {
    Always,
    IfAbsent,
    IfPresent,
}

impl Gateway {
    /// WATCH key...: records each key's current version, in one multi-read.
    pub(crate) async fn watch(&self, session: &mut Session, keys: &[Bytes]) -> Outcome {
        if session.queue.is_some() {
            return Err(error("ERR WATCH inside MULTI is not allowed"));
        }
        keys.iter().try_for_each(|key| check_key(key))?;
        let table_id = self.table(session, session.database).await?;
        let mut new: Vec<&Bytes> = keys
            .iter()
            .filter(|key| !session.watches.keys.contains_key(&(table_id, (*key).clone())))
            .collect();
        new.sort();
        new.dedup();
        if session.watches.keys.len() + new.len() > WATCHED_KEYS_MAX {
            return Err(error(format!(
                "ERR a connection watches at most {WATCHED_KEYS_MAX} keys (each is an object of \
                 its EXEC's transaction)"
            )));
        }
        let items: Vec<KeyItem> = new
            .iter()
            .map(|key| KeyItem { table_id, key: (*key).clone(), rules: RejectRules::NONE })
            .collect();
        let mut versions = Vec::with_capacity(items.len());
        for outcome in self.client_of(session).multi_read(&items).await {
            versions.push(match outcome {
                Ok((_, version)) => version,
                Err(failure) if failure.status == Status::ObjectDoesntExist => Version::NONEXISTENT,
                Err(failure) => return Err(failure.into()),
            });
        }
        for (item, version) in items.into_iter().zip(versions) {
            session.watches.keys.insert((table_id, item.key), version);
        }
        Ok(Value::ok())
    }

    /// EXEC: runs the queued commands as one transaction (see the module documentation).
    /// Ends the MULTI and clears the watches whatever happens, as Redis does.
    pub(crate) async fn exec(&self, session: &mut Session) -> Outcome {
        let Some(queue) = session.queue.take() else {
            return Err(error("ERR EXEC without MULTI"));
        };
        let watches = std::mem::take(&mut session.watches);
        if queue.refused {
            return Err(error(EXEC_ABORT));
        }
        let mut outcome = self.run_queue(session, &queue.commands, &watches).await;
        if is_table_dropped(&outcome) {
            // FLUSHDB or FLUSHALL dropped a table under the transaction: nothing was applied.
            // The queue's own table is recreated once; a watched key's table that is gone
            // was flushed since WATCH, which Redis counts as a change of the key.
            self.forget_table(session.database);
            outcome = self.run_queue(session, &queue.commands, &watches).await;
            if is_table_dropped(&outcome) && !watches.keys.is_empty() {
                return Ok(Value::NullArray);
            }
        }
        match outcome {
            Ok(replies) => Ok(Value::Array(replies)),
            Err(TransactionError::Aborted(reason)) if watches.covers(&reason) => {
                Ok(Value::NullArray)
            }
            Err(TransactionError::Aborted(reason)) => Err(error(format!(
                "ERR stratus: the transaction aborted, nothing was applied: {reason}"
            ))),
            Err(TransactionError::Failed(failure)) => {
                Err(Failure::Reply(client_error_reply(&failure)))
            }
        }
    }

    /// Runs `commands` in one transaction that also checks the watched versions; retries
    /// the conflicts on keys not watched.
    async fn run_queue(
        &self,
        session: &Session,
        commands: &[Vec<Bytes>],
        watches: &Watches,
    ) -> Result<Vec<Value>, TransactionError> {
        let table = self.table(session, session.database).await?;
        let body = |transaction: Transaction| async move {
            for ((watched_table, key), version) in &watches.keys {
                transaction.expect_version(*watched_table, key, *version)?;
            }
            let mut replies = Vec::with_capacity(commands.len());
            for command in commands {
                replies.push(match self.run_queued(&transaction, table, command).await {
                    Ok(reply) | Err(Failure::Reply(reply)) => reply,
                    Err(Failure::Client(failure)) => return Err(failure),
                });
            }
            Ok(replies)
        };
        self.client_of(session)
            .run_transaction_retrying_if(body, |reason| !watches.covers(reason))
            .await
    }

    /// One queued command, on the transaction; its reply (an error reply if it fails the way
    /// Redis fails it at exec time, having changed nothing).
    async fn run_queued(&self, tx: &Transaction, table: TableId, command: &[Bytes]) -> Outcome {
        let name = lowercase(&command[0]);
        let arguments = &command[1..];
        match name.as_str() {
            "ping" => match arguments {
                [] => Ok(Value::simple("PONG")),
                [message] => Ok(Value::BulkString(message.clone())),
                _ => Err(Failure::Reply(wrong_arity("ping"))),
            },
            "echo" => Ok(Value::BulkString(arguments[0].clone())),
            // The watches were checked already (they are part of this transaction).
            "unwatch" => Ok(Value::ok()),
            "get" => Ok(read_string(tx, table, &arguments[0])
                .await?
                .map_or(Value::Null, Value::BulkString)),
            "strlen" => {
                let value = read_string(tx, table, &arguments[0]).await?;
                Ok(Value::Integer(value.map_or(0, |value| value.len() as i64)))
            }
            "set" => set(tx, table, arguments).await,
            "setnx" => {
                let (key, value) = (&arguments[0], &arguments[1]);
                let written = set_if(tx, table, key, value, Condition::IfAbsent).await?;
                Ok(Value::Integer(i64::from(written)))
            }
            "getset" => {
                let options =
                    [arguments[0].clone(), arguments[1].clone(), Bytes::from_static(b"GET")];
                set(tx, table, &options).await
            }
            "del" => {
                arguments.iter().try_for_each(|key| check_key(key))?;
                let mut removed = 0;
                for key in arguments {
                    // A key named twice is removed once, as in Redis.
                    if tx.read(table, key).await?.is_some() {
                        tx.remove(table, key)?;
                        removed += 1;
                    }
                }
                Ok(Value::Integer(removed))
            }
            "exists" => {
                arguments.iter().try_for_each(|key| check_key(key))?;
                let mut found = 0;
                for key in arguments {
                    found += i64::from(tx.read(table, key).await?.is_some());
                }
                Ok(Value::Integer(found))
            }
            "incr" => increment(tx, table, &arguments[0], 1).await,
            "decr" => increment(tx, table, &arguments[0], -1).await,
            "incrby" => {
                let delta = parse_integer(&arguments[1]).ok_or_else(not_an_integer)?;
                increment(tx, table, &arguments[0], delta).await
            }
            "decrby" => {
                let delta = parse_integer(&arguments[1])
                    .ok_or_else(not_an_integer)?
                    .checked_neg()
                    .ok_or_else(|| error("ERR decrement would overflow"))?;
                increment(tx, table, &arguments[0], delta).await
            }
            "mget" => {
                arguments.iter().try_for_each(|key| check_key(key))?;
                let mut values = Vec::with_capacity(arguments.len());
                for key in arguments {
                    values.push(match tx.read(table, key).await? {
                        // As Redis: MGET answers nil for a key that holds another type.
                        Some(value) if !is_hash(&value) => Value::BulkString(value),
                        _ => Value::Null,
                    });
                }
                Ok(Value::Array(values))
            }
            "mset" => {
                if !arguments.len().is_multiple_of(2) {
                    return Err(Failure::Reply(wrong_arity("mset")));
                }
                arguments.chunks(2).try_for_each(|pair| {
                    check_key(&pair[0])?;
                    check_string(&pair[1])
                })?;
                for pair in arguments.chunks(2) {
                    tx.write(table, &pair[0], &pair[1])?;
                }
                Ok(Value::ok())
            }
            "append" => {
                let (key, suffix) = (&arguments[0], &arguments[1]);
                let mut value = read_string(tx, table, key)
                    .await?
                    .map(|value| value.to_vec())
                    .unwrap_or_default();
                value.extend_from_slice(suffix);
                check_string(&value)?;
                tx.write(table, key, &value)?;
                Ok(Value::Integer(value.len() as i64))
            }
            // `enqueue` queues only the commands above.
            _ => Err(error(format!("ERR {name} is not supported inside MULTI by Stratus"))),
        }
    }
}

fn is_table_dropped<T>(outcome: &Result<T, TransactionError>) -> bool {
    matches!(outcome, Err(TransactionError::Failed(failure)) if failure.status == Status::TableDoesntExist)
}

/// The string the transaction sees under `key` (None: absent; WRONGTYPE for a hash).
async fn read_string(
    tx: &Transaction,
    table: TableId,
    key: &Bytes,
) -> Result<Option<Bytes>, Failure> {
    check_key(key)?;
    tx.read(table, key).await?.map(as_string).transpose()
}

/// SET key value [NX|XX] [GET] [KEEPTTL] (expiry options were refused at queue time). The
/// write keeps the key's expiry, whether or not KEEPTTL is given: a transaction's write
/// cannot clear it.
async fn set(tx: &Transaction, table: TableId, arguments: &[Bytes]) -> Outcome {
    let (key, value) = (&arguments[0], &arguments[1]);
    let mut condition = Condition::Always;
    let (mut return_old, mut keep_ttl) = (false, false);
    for option in &arguments[2..] {
        match lowercase(option).as_str() {
            "nx" if condition != Condition::IfPresent => condition = Condition::IfAbsent,
            "xx" if condition != Condition::IfAbsent => condition = Condition::IfPresent,
            "get" => return_old = true,
            "keepttl" if !keep_ttl => keep_ttl = true,
            _ => return Err(syntax_error()),
        }
    }
    check_key(key)?;
    check_string(value)?;
    if !return_old {
        let written = set_if(tx, table, key, value, condition).await?;
        return Ok(if written { Value::ok() } else { Value::Null });
    }
    let old = read_string(tx, table, key).await?;
    let write = match condition {
        Condition::IfAbsent => old.is_none(),
        Condition::IfPresent => old.is_some(),
        Condition::Always => true,
    };
    if write {
        tx.write(table, key, value)?;
    }
    Ok(old.map_or(Value::Null, Value::BulkString))
}

/// Writes `value` under `key` if `condition` holds as the transaction sees the key (any type,
/// as SET NX and XX look only at existence); whether it wrote.
async fn set_if(
    tx: &Transaction,
    table: TableId,
    key: &Bytes,
    value: &Bytes,
    condition: Condition,
) -> Result<bool, Failure> {
    check_key(key)?;
    check_string(value)?;
    let write = match condition {
        Condition::Always => true,
        Condition::IfAbsent => tx.read(table, key).await?.is_none(),
        Condition::IfPresent => tx.read(table, key).await?.is_some(),
    };
    if write {
        tx.write(table, key, value)?;
    }
    Ok(write)
}

/// INCR and friends on decimal ASCII values, as Redis stores them.
async fn increment(tx: &Transaction, table: TableId, key: &Bytes, delta: i64) -> Outcome {
    let old = match read_string(tx, table, key).await? {
        None => 0,
        Some(value) => parse_integer(&value).ok_or_else(not_an_integer)?,
    };
    let new =
        old.checked_add(delta).ok_or_else(|| error("ERR increment or decrement would overflow"))?;
    tx.write(table, key, new.to_string().as_bytes())?;
    Ok(Value::Integer(new))
}

#[cfg(test)]
mod tests {
    use super::QUEUED_COMMANDS_MAX;
    use crate::gateway::{Gateway, GatewayConfig, Session};
    use crate::test_support::{call, offline_gateway_with};
    use crate::value::{Protocol, Value};

    /// A gateway whose cluster cannot be reached: every reply below is decided in the
    /// gateway, before any request to a master.
    fn offline_gateway() -> Gateway {
        offline_gateway_with(GatewayConfig::default())
    }

    fn queued() -> Value {
        Value::simple("QUEUED")
    }

    #[tokio::test]
    async fn an_error_at_queue_time_makes_exec_answer_execabort() {
        let gateway = offline_gateway();
        let mut session = Session::new(1);
        assert_eq!(call(&gateway, &mut session, &["MULTI"]).await, Value::ok());
        assert_eq!(call(&gateway, &mut session, &["SET", "a", "1"]).await, queued());
        assert_eq!(call(&gateway, &mut session, &["INCRBY", "a", "x"]).await, queued());
        let refused = [
            (vec!["GET"], "ERR wrong number of arguments for 'get' command"),
            (vec!["NOSUCH", "x"], "ERR unknown command 'NOSUCH', with args beginning with: 'x' "),
            (vec!["HSET", "h", "f", "v"], "ERR HSET is not supported inside MULTI by Stratus"),
            (vec!["SELECT", "1"], "ERR SELECT is not supported inside MULTI by Stratus"),
        ];
        for (command, text) in refused {
            assert_eq!(call(&gateway, &mut session, &command).await, Value::error(text));
        }
        match call(&gateway, &mut session, &["SET", "a", "1", "EX", "10"]).await {
            Value::Error(text) => assert!(text.starts_with("ERR SET with EX"), "{text}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            call(&gateway, &mut session, &["EXEC"]).await,
            Value::error("EXECABORT Transaction discarded because of previous errors.")
        );
        assert_eq!(
            call(&gateway, &mut session, &["EXEC"]).await,
            Value::error("ERR EXEC without MULTI"),
            "the EXEC ended the MULTI"
        );
    }

    #[tokio::test]
    async fn multi_does_not_nest_and_discard_drops_the_queue() {
        let gateway = offline_gateway();
        let mut session = Session::new(1);
        assert_eq!(
            call(&gateway, &mut session, &["DISCARD"]).await,
            Value::error("ERR DISCARD without MULTI")
        );
        assert_eq!(call(&gateway, &mut session, &["MULTI"]).await, Value::ok());
        assert_eq!(
            call(&gateway, &mut session, &["MULTI"]).await,
            Value::error("ERR MULTI calls can not be nested")
        );
        assert_eq!(
            call(&gateway, &mut session, &["WATCH", "a"]).await,
            Value::error("ERR WATCH inside MULTI is not allowed")
        );
        assert_eq!(call(&gateway, &mut session, &["INCR", "a"]).await, queued());
        assert_eq!(call(&gateway, &mut session, &["DISCARD"]).await, Value::ok());
        assert!(session.queue.is_none() && session.watches.keys.is_empty());
        assert_eq!(
            call(&gateway, &mut session, &["EXEC"]).await,
            Value::error("ERR EXEC without MULTI")
        );
        // Neither a nested MULTI nor WATCH inside MULTI dooms the EXEC, as in Redis.
        assert_eq!(call(&gateway, &mut session, &["MULTI"]).await, Value::ok());
        call(&gateway, &mut session, &["MULTI"]).await;
        call(&gateway, &mut session, &["WATCH", "a"]).await;
        assert_eq!(call(&gateway, &mut session, &["UNWATCH"]).await, queued());
        assert!(matches!(session.queue.as_ref(), Some(queue) if !queue.refused));
    }

    #[tokio::test]
    async fn the_queue_is_bounded() {
        let gateway = offline_gateway();
        let mut session = Session::new(1);
        call(&gateway, &mut session, &["MULTI"]).await;
        for _ in 0..QUEUED_COMMANDS_MAX {
            assert_eq!(call(&gateway, &mut session, &["PING"]).await, queued());
        }
        match call(&gateway, &mut session, &["PING"]).await {
            Value::Error(text) => assert!(text.contains("queues at most"), "{text}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            call(&gateway, &mut session, &["EXEC"]).await,
            Value::Error(text) if text.starts_with("EXECABORT")
        ));
    }

    #[test]
    fn a_null_array_is_written_as_redis_writes_an_aborted_exec() {
        assert_eq!(&Value::NullArray.to_bytes(Protocol::Resp2)[..], b"*-1\r\n");
        assert_eq!(&Value::NullArray.to_bytes(Protocol::Resp3)[..], b"_\r\n");
    }
}
