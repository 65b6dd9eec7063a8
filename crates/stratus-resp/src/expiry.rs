//! Keys that expire: SET's EX/PX/EXAT/PXAT/KEEPTTL options, SETEX and PSETEX, GETEX, the
//! EXPIRE family (EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT with NX/XX/GT/LT), TTL and PTTL,
//! EXPIRETIME and PEXPIRETIME, and PERSIST.
//!
//! A Stratus object carries its expiry itself (docs/design/log-format.md): the master that
//! applies a write turns a relative time to live into an absolute time by its own clock, and
//! never serves the object after it. So TTL here is what the master reports (milliseconds
//! left by its clock), EX and PX never depend on this gateway's clock, and only the absolute
//! forms (EXAT, PXAT, EXPIREAT, EXPIRETIME) assume this gateway's clock agrees with the
//! masters', as Redis assumes of its clients. Commands that rewrite a value keep its expiry
//! (INCR, APPEND, HSET: Redis does the same); SET without KEEPTTL, GETSET and MSET clear it.

use bytes::Bytes;
use stratus_client::{Client, Expiry, ObjectRead, RejectRules, Status, TableId};

use crate::commands::{
    check_key, error, lowercase, not_an_integer, parse_integer, syntax_error, Failure, Outcome,
    CONDITIONAL_UPDATE_ATTEMPTS_MAX,
};
use crate::gateway::{Gateway, Session};
use crate::value::Value;

/// Milliseconds in a second.
const MILLIS_PER_SECOND: i64 = 1_000;

/// The unit a command's time is given in, and whether it is a time to live or a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimeGiven {
    /// EX, SETEX, EXPIRE: seconds from now.
    Seconds,
    /// PX, PSETEX, PEXPIRE: milliseconds from now.
    Millis,
    /// EXAT, EXPIREAT: a Unix time in seconds.
    UnixSeconds,
    /// PXAT, PEXPIREAT: a Unix time in milliseconds.
    UnixMillis,
}

impl TimeGiven {
    /// The expiry `amount` of this unit means; `None` when it overflows milliseconds.
    fn expiry(self, amount: i64) -> Option<Expiry> {
        let millis = match self {
            TimeGiven::Seconds | TimeGiven::UnixSeconds => amount.checked_mul(MILLIS_PER_SECOND)?,
            TimeGiven::Millis | TimeGiven::UnixMillis => amount,
        };
        // A time to live of zero or less has already passed: the object expires at once.
        let millis = u64::try_from(millis).unwrap_or(0);
        Some(match self {
            TimeGiven::Seconds | TimeGiven::Millis => Expiry::AfterMillis(millis),
            TimeGiven::UnixSeconds | TimeGiven::UnixMillis => Expiry::AtMillis(millis),
        })
    }
}

/// A time argument of `command`: an integer, and for SET-like commands a positive one (Redis
/// refuses zero and negative expire times there, while EXPIRE takes them and expires the key).
pub(crate) fn parse_expiry(
    text: &[u8],
    given: TimeGiven,
    positive_only: bool,
    command: &str,
) -> Result<Expiry, Failure> {
    let amount = parse_integer(text).ok_or_else(not_an_integer)?;
    let invalid = || error(format!("ERR invalid expire time in '{command}' command"));
    if positive_only && amount <= 0 {
        return Err(invalid());
    }
    given.expiry(amount).ok_or_else(invalid)
}

/// The expiry options of SET (and GETEX): `None` when `option` is not one.
pub(crate) fn time_option(option: &str) -> Option<TimeGiven> {
    match option {
        "ex" => Some(TimeGiven::Seconds),
        "px" => Some(TimeGiven::Millis),
        "exat" => Some(TimeGiven::UnixSeconds),
        "pxat" => Some(TimeGiven::UnixMillis),
        _ => None,
    }
}

/// The conditions of the EXPIRE family (Redis 7's NX, XX, GT, LT; none: always).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ExpireCondition {
    /// NX: only when the key has no expiry.
    without_expiry: bool,
    /// XX: only when it has one.
    with_expiry: bool,
    /// GT: only when the new expiry is later (no expiry counts as never: never later).
    later: bool,
    /// LT: only when the new expiry is sooner (no expiry counts as never: always sooner).
    sooner: bool,
}

impl ExpireCondition {
    fn parse(options: &[Bytes]) -> Result<ExpireCondition, Failure> {
        let mut condition = ExpireCondition::default();
        for option in options {
            match lowercase(option).as_str() {
                "nx" => condition.without_expiry = true,
                "xx" => condition.with_expiry = true,
                "gt" => condition.later = true,
                "lt" => condition.sooner = true,
                _ => {
                    let option = String::from_utf8_lossy(option);
                    return Err(error(format!("ERR Unsupported option {option}")));
                }
            }
        }
        if condition.without_expiry
            && (condition.with_expiry || condition.later || condition.sooner)
        {
            return Err(error(
                "ERR NX and XX, GT or LT options at the same time are not compatible",
            ));
        }
        if condition.later && condition.sooner {
            return Err(error("ERR GT and LT options at the same time are not compatible"));
        }
        Ok(condition)
    }

    fn is_always(self) -> bool {
        self == ExpireCondition::default()
    }

    /// Whether the condition lets a key that expires in `current` (milliseconds; `None`: no
    /// expiry) get an expiry `new_in` milliseconds from now.
    fn allows(self, current: Option<u64>, new_in: u64) -> bool {
        let refused = (self.without_expiry && current.is_some())
            || (self.with_expiry && current.is_none())
            || (self.later && current.is_none_or(|current| new_in <= current))
            || (self.sooner && current.is_some_and(|current| new_in >= current));
        !refused
    }
}

impl Gateway {
    /// The wall clock of this gateway, in milliseconds since the Unix epoch: only the
    /// absolute forms compare with it (EXPIRETIME, and GT/LT with EXPIREAT).
    fn now_millis(&self) -> u64 {
        self.wall_clock.now_millis()
    }

    /// Milliseconds from now until `expiry` (for GT/LT), by this gateway's clock.
    fn millis_from_now(&self, expiry: Expiry) -> u64 {
        match expiry {
            Expiry::AfterMillis(millis) => millis,
            Expiry::AtMillis(at) => at.saturating_sub(self.now_millis()),
            Expiry::Never | Expiry::Keep => u64::MAX,
        }
    }

    /// The object under `key` with its time to live (None: no such key, or expired).
    async fn read_object(
        &self,
        client: &Client,
        table: TableId,
        key: &Bytes,
    ) -> Result<Option<ObjectRead>, Failure> {
        match client.read_object(table, key, RejectRules::NONE).await {
            Ok(object) => Ok(Some(object)),
            Err(failure) if failure.status == Status::ObjectDoesntExist => Ok(None),
            Err(failure) => Err(failure.into()),
        }
    }

    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT: 1 if the key got the expiry, 0 if it does not
    /// exist or the condition refused. A time already past expires the key at once.
    pub(crate) async fn expire(
        &self,
        session: &Session,
        name: &str,
        arguments: &[Bytes],
        given: TimeGiven,
    ) -> Outcome {
        let key = &arguments[0];
        check_key(key)?;
        let expiry = parse_expiry(&arguments[1], given, false, name)?;
        let condition = ExpireCondition::parse(&arguments[2..])?;
        let table = self.table(session, session.database).await?;
        if condition.is_always() {
            return Ok(Value::Integer(
                self.set_expiry(self.client_of(session), table, key, expiry, RejectRules::NONE)
                    .await?,
            ));
        }
        let new_in = self.millis_from_now(expiry);
        self.update_expiry(self.client_of(session), table, key, |object| {
            let current = object.expires_in.map(|left| left.as_millis() as u64);
            condition.allows(current, new_in).then_some((expiry, Value::Integer(1)))
        })
        .await
        .map(|reply| reply.unwrap_or(Value::Integer(0)))
    }

    /// Reads `key`'s object, asks `decide` whether to set its expiry (and what to answer then),
    /// and sets it only if the object is still the one read, retrying a bounded number of
    /// times when another client changed it in between. `None` when there is no object (or it
    /// expired meanwhile) or `decide` declined; the caller answers then.
    async fn update_expiry(
        &self,
        client: &Client,
        table: TableId,
        key: &Bytes,
        mut decide: impl FnMut(&ObjectRead) -> Option<(Expiry, Value)>,
    ) -> Result<Option<Value>, Failure> {
        for _ in 0..CONDITIONAL_UPDATE_ATTEMPTS_MAX {
            let Some(object) = self.read_object(client, table, key).await? else { return Ok(None) };
            let Some((expiry, reply)) = decide(&object) else { return Ok(None) };
            let rules = RejectRules::version_equals(object.version);
            match client.set_expiry(table, key, expiry, rules).await {
                Ok(_) => return Ok(Some(reply)),
                Err(failure) if failure.status == Status::WrongVersion => continue,
                Err(failure) if failure.status == Status::ObjectDoesntExist => return Ok(None),
                Err(failure) => return Err(failure.into()),
            }
        }
        Err(contended())
    }

    /// SET_EXPIRY as the EXPIRE family answers it: 1 when set, 0 for a missing key.
    async fn set_expiry(
        &self,
        client: &Client,
        table: TableId,
        key: &Bytes,
        expiry: Expiry,
        rules: RejectRules,
    ) -> Result<i64, Failure> {
        match client.set_expiry(table, key, expiry, rules).await {
            Ok(_) => Ok(1),
            Err(failure) if failure.status == Status::ObjectDoesntExist => Ok(0),
            Err(failure) => Err(failure.into()),
        }
    }

    /// TTL (seconds, rounded as Redis rounds them) and PTTL (milliseconds): -2 for a missing
    /// key, -1 for one without expiry.
    pub(crate) async fn time_to_live(
        &self,
        session: &Session,
        key: &Bytes,
        in_millis: bool,
    ) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        let reply = match self.read_object(self.client_of(session), table, key).await? {
            None => -2,
            Some(ObjectRead { expires_in: None, .. }) => -1,
            Some(ObjectRead { expires_in: Some(left), .. }) => {
                let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
                if in_millis {
                    millis
                } else {
                    (millis + MILLIS_PER_SECOND / 2) / MILLIS_PER_SECOND
                }
            }
        };
        Ok(Value::Integer(reply))
    }

    /// EXPIRETIME (Unix seconds) and PEXPIRETIME (Unix milliseconds): when the key expires by
    /// this gateway's clock (the master reports the time left); -2 missing, -1 no expiry.
    pub(crate) async fn expire_time(
        &self,
        session: &Session,
        key: &Bytes,
        in_millis: bool,
    ) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        let reply = match self.read_object(self.client_of(session), table, key).await? {
            None => -2,
            Some(ObjectRead { expires_in: None, .. }) => -1,
            Some(ObjectRead { expires_in: Some(left), .. }) => {
                let at = self.now_millis().saturating_add(left.as_millis() as u64);
                let at = i64::try_from(at).unwrap_or(i64::MAX);
                if in_millis {
                    at
                } else {
                    at / MILLIS_PER_SECOND
                }
            }
        };
        Ok(Value::Integer(reply))
    }

    /// PERSIST: 1 if the key had an expiry and now has none, 0 otherwise.
    pub(crate) async fn persist(&self, session: &Session, key: &Bytes) -> Outcome {
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        let reply = self
            .update_expiry(self.client_of(session), table, key, |object| {
                object.expires_in.map(|_| (Expiry::Never, Value::Integer(1)))
            })
            .await?;
        Ok(reply.unwrap_or(Value::Integer(0)))
    }

    /// GETEX key [EX|PX|EXAT|PXAT time | PERSIST]: the value, and the expiry set (or removed)
    /// if the value is still the one read.
    pub(crate) async fn get_expiring(&self, session: &Session, arguments: &[Bytes]) -> Outcome {
        let key = &arguments[0];
        let change = match &arguments[1..] {
            [] => None,
            [option] if lowercase(option) == "persist" => Some(Expiry::Never),
            [option, time] => {
                let given = time_option(&lowercase(option)).ok_or_else(syntax_error)?;
                Some(parse_expiry(time, given, true, "getex")?)
            }
            _ => return Err(syntax_error()),
        };
        check_key(key)?;
        let table = self.table(session, session.database).await?;
        let Some(expiry) = change else {
            return match self.read_object(self.client_of(session), table, key).await? {
                Some(object) => Ok(Value::BulkString(crate::commands::as_string(object.value)?)),
                None => Ok(Value::Null),
            };
        };
        let mut not_a_string = None;
        let reply = self
            .update_expiry(self.client_of(session), table, key, |object| {
                match crate::commands::as_string(object.value.clone()) {
                    Ok(value) => Some((expiry, Value::BulkString(value))),
                    Err(failure) => {
                        not_a_string = Some(failure);
                        None
                    }
                }
            })
            .await?;
        if let Some(failure) = not_a_string {
            return Err(failure);
        }
        Ok(reply.unwrap_or(Value::Null))
    }
}

fn contended() -> Failure {
    error(format!(
        "ERR key changed by other clients {CONDITIONAL_UPDATE_ATTEMPTS_MAX} times during this \
         command; try again"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_like_redis_and_a_past_one_expires_at_once() {
        let seconds = parse_expiry(b"10", TimeGiven::Seconds, true, "set").unwrap();
        assert_eq!(seconds, Expiry::AfterMillis(10_000));
        let at = parse_expiry(b"1700000000", TimeGiven::UnixSeconds, true, "set").unwrap();
        assert_eq!(at, Expiry::AtMillis(1_700_000_000_000));
        assert_eq!(
            parse_expiry(b"-5", TimeGiven::Millis, false, "pexpire").unwrap(),
            Expiry::AfterMillis(0)
        );
        for refused in [&b"0"[..], b"-1"] {
            assert!(parse_expiry(refused, TimeGiven::Seconds, true, "set").is_err());
        }
        assert!(parse_expiry(b"x", TimeGiven::Seconds, false, "expire").is_err());
        let overflow = i64::MAX.to_string();
        assert!(parse_expiry(overflow.as_bytes(), TimeGiven::Seconds, false, "expire").is_err());
    }

    #[test]
    fn expire_conditions_follow_redis() {
        let parse = |options: &[&str]| {
            let options: Vec<Bytes> =
                options.iter().map(|option| Bytes::copy_from_slice(option.as_bytes())).collect();
            ExpireCondition::parse(&options)
        };
        assert!(parse(&["NX", "XX"]).is_err());
        assert!(parse(&["GT", "LT"]).is_err());
        assert!(parse(&["nope"]).is_err());
        let nx = parse(&["nx"]).unwrap();
        assert!(nx.allows(None, 5) && !nx.allows(Some(1), 5));
        let xx = parse(&["XX"]).unwrap();
        assert!(!xx.allows(None, 5) && xx.allows(Some(1), 5));
        let gt = parse(&["GT"]).unwrap();
        assert!(!gt.allows(None, 5) && gt.allows(Some(1), 5) && !gt.allows(Some(9), 5));
        let lt = parse(&["LT"]).unwrap();
        assert!(lt.allows(None, 5) && !lt.allows(Some(1), 5) && lt.allows(Some(9), 5));
        let xx_lt = parse(&["XX", "LT"]).unwrap();
        assert!(!xx_lt.allows(None, 5) && xx_lt.allows(Some(9), 5) && !xx_lt.allows(Some(1), 5));
        assert!(parse(&[]).unwrap().is_always());
    }
}
