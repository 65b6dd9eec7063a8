//! A minimal client of etcd's v3 API, spoken as JSON over HTTP/1.1 through etcd's gRPC gateway
//! (on by default on every etcd client URL since 3.3; these are the 3.4 paths).
//!
//! Only what the metadata store and the leadership need: range reads, transactions, and lease
//! grant, keep-alive and revoke. Bytes fields (keys, values) travel base64-encoded and 64-bit
//! integers as decimal strings, as the gateway's JSON mapping of protobuf requires; a field
//! equal to its default (false, 0, empty) is left out of the gateway's answers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::{RESPONSE_BYTES_MAX, SCAN_PAGE_KEYS};

/// How long connecting to one member may take before the next is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// gRPC codes with which etcd refuses a request before proposing it, so nothing was applied:
/// invalid argument (3), permission denied (7), resource exhausted (8: too large), failed
/// precondition (9), out of range (11: e.g. a compacted revision), unauthenticated (16).
const DEFINITE_REFUSAL_CODES: [u64; 6] = [3, 7, 8, 9, 11, 16];

/// Why a request to etcd failed.
#[derive(Debug)]
pub enum EtcdError {
    /// No member could be reached: nothing was sent, so nothing happened.
    Unreachable(String),
    /// The request may have reached etcd and been applied, but no answer came back.
    Ambiguous(String),
    /// etcd answered with an error (for a transaction: nothing was applied).
    Refused(String),
    /// etcd answered with something this client does not understand.
    Malformed(String),
}

impl std::fmt::Display for EtcdError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EtcdError::Unreachable(reason) => write!(formatter, "etcd unreachable: {reason}"),
            EtcdError::Ambiguous(reason) => {
                write!(formatter, "etcd gave no answer (outcome unknown): {reason}")
            }
            EtcdError::Refused(reason) => write!(formatter, "etcd refused: {reason}"),
            EtcdError::Malformed(reason) => {
                write!(formatter, "etcd answer not understood: {reason}")
            }
        }
    }
}

/// One key-value pair as etcd stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision that created the key (0 never appears for a present key).
    pub create_revision: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// A condition of a transaction.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key exists with exactly this value (a missing key fails the comparison).
    ValueEquals { key: Vec<u8>, value: Vec<u8> },
    /// The key does not exist (its create revision is 0).
    Absent { key: Vec<u8> },
}

/// An operation of a transaction.
#[derive(Clone, Debug)]
pub enum TxnOperation {
    /// Sets a key, optionally attached to a lease (0: none).
    Put { key: Vec<u8>, value: Vec<u8>, lease: i64 },
    /// Removes a key (absent: nothing happens).
    Delete { key: Vec<u8> },
    /// Reads a key (its answer is in [`TxnOutcome::ranges`]).
    Get { key: Vec<u8> },
}

/// What a transaction did.
#[derive(Debug)]
pub struct TxnOutcome {
    /// True if every comparison held and the success branch ran.
    pub succeeded: bool,
    /// The pairs each `Get` of the branch that ran returned, in order.
    pub ranges: Vec<Vec<KeyValue>>,
}

/// A client of one etcd cluster, given several member URLs: it uses the member that answered
/// last and moves on to the next when one cannot be reached.
#[derive(Debug)]
pub struct EtcdClient {
    agent: ureq::Agent,
    endpoints: Vec<String>,
    preferred: AtomicUsize,
}

impl EtcdClient {
    /// A client of the members at `endpoints` ("http://host:port", or "host:port"), each
    /// request bounded by `request_timeout`.
    pub fn new(endpoints: &[String], request_timeout: Duration) -> Result<EtcdClient, String> {
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|endpoint| endpoint.trim().trim_end_matches('/'))
            .filter(|endpoint| !endpoint.is_empty())
            .map(|endpoint| {
                if endpoint.contains("://") {
                    endpoint.to_string()
                } else {
                    format!("http://{endpoint}")
                }
            })
            .collect();
        if endpoints.is_empty() {
            return Err("no etcd endpoint given".to_string());
        }
        if let Some(secure) = endpoints.iter().find(|endpoint| !endpoint.starts_with("http://")) {
            return Err(format!("etcd endpoint {secure}: only http:// is supported"));
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(request_timeout))
            // A member whose host is gone must fail fast and be skipped, not use up the whole
            // request's time (a hanging connect would otherwise look like a sent request).
            .timeout_connect(Some(CONNECT_TIMEOUT.min(request_timeout)))
            .http_status_as_error(false)
            .build()
            .into();
        Ok(EtcdClient { agent, endpoints, preferred: AtomicUsize::new(0) })
    }

    /// The member URLs.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Posts `body` to `path`, starting with the member that answered last, within `timeout`
    /// per member. A request that changes nothing, or changes the same thing however often it
    /// is applied (`repeatable`), moves on to the next member after any failure; any other
    /// only while nothing can have reached etcd, and is ambiguous after that.
    fn post(
        &self,
        path: &str,
        body: &Value,
        repeatable: bool,
        timeout: Option<Duration>,
    ) -> Result<Value, EtcdError> {
        let body = body.to_string();
        let first = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
        let mut failures = Vec::new();
        for turn in 0..self.endpoints.len() {
            let index = (first + turn) % self.endpoints.len();
            // The next call starts elsewhere if this member fails.
            self.preferred.store((index + 1) % self.endpoints.len(), Ordering::Relaxed);
            let url = format!("{}{path}", self.endpoints[index]);
            let mut request = self.agent.post(&url).content_type("application/json");
            if let Some(timeout) = timeout {
                request = request.config().timeout_global(Some(timeout)).build();
            }
            let failure = match request.send(&body) {
                Ok(mut response) => match Self::answer(&url, &mut response) {
                    Ok(answer) => {
                        self.preferred.store(index, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Err(failure) => failure,
                },
                Err(error) if nothing_sent(&error) => {
                    EtcdError::Unreachable(format!("{url}: {error}"))
                }
                Err(error) => EtcdError::Ambiguous(format!("{url}: {error}")),
            };
            match failure {
                EtcdError::Unreachable(reason) => failures.push(reason),
                other if repeatable => failures.push(other.to_string()),
                other => return Err(other),
            }
        }
        Err(EtcdError::Unreachable(failures.join("; ")))
    }

    /// The JSON answer of a member, or why it is not one.
    fn answer(
        url: &str,
        response: &mut ureq::http::Response<ureq::Body>,
    ) -> Result<Value, EtcdError> {
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_BYTES_MAX)
            .read_to_string()
            .map_err(|error| EtcdError::Ambiguous(format!("{url}: {error}")))?;
        let answer: Value = serde_json::from_str(&text)
            .map_err(|error| EtcdError::Malformed(format!("{url}: {error}: {}", excerpt(&text))))?;
        if status == 200 && answer.get("error").is_none() {
            return Ok(answer);
        }
        let message = answer
            .get("message")
            .or_else(|| answer.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("no message");
        let code = answer.get("code").and_then(Value::as_u64).unwrap_or(0);
        let description = format!("{url}: HTTP {status}, code {code}: {message}");
        // Only errors etcd gives before proposing anything mean "not applied"; a timed-out or
        // interrupted proposal (deadline exceeded, unavailable, unknown, internal) may still
        // be applied later.
        if DEFINITE_REFUSAL_CODES.contains(&code) {
            Err(EtcdError::Refused(description))
        } else {
            Err(EtcdError::Ambiguous(description))
        }
    }

    /// Every pair with a key in `[start, end)` (`end` empty: just `start`), read at one
    /// revision, in pages of [`SCAN_PAGE_KEYS`] so no answer grows without bound.
    pub fn range(&self, start: &[u8], end: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let mut pairs = Vec::new();
        let mut from = start.to_vec();
        let mut revision: Option<i64> = None;
        loop {
            let mut request = json!({
                "key": BASE64.encode(&from),
                "limit": SCAN_PAGE_KEYS.to_string(),
            });
            if !end.is_empty() {
                request["range_end"] = json!(BASE64.encode(end));
            }
            if let Some(revision) = revision {
                request["revision"] = json!(revision.to_string());
            }
            let answer = self.post("/v3/kv/range", &request, true, None)?;
            if revision.is_none() {
                revision = Some(integer(&answer["header"]["revision"])?);
            }
            let page = key_values(&answer["kvs"])?;
            let more = answer["more"].as_bool().unwrap_or(false);
            if more && page.is_empty() {
                return Err(EtcdError::Malformed(
                    "a range page with more to come but no keys".into(),
                ));
            }
            let last = page.last().map(|pair| pair.key.clone());
            pairs.extend(page);
            match (more, last, end.is_empty()) {
                (true, Some(mut last), false) => {
                    // The next page starts just after the last key of this one.
                    last.push(0);
                    from = last;
                }
                _ => return Ok(pairs),
            }
        }
    }

    /// Runs a transaction: `success` if every comparison holds, else `failure`.
    pub fn txn(
        &self,
        compare: &[Compare],
        success: &[TxnOperation],
        failure: &[TxnOperation],
    ) -> Result<TxnOutcome, EtcdError> {
        let compare: Vec<Value> = compare
            .iter()
            .map(|condition| match condition {
                Compare::ValueEquals { key, value } => json!({
                    "key": BASE64.encode(key), "target": "VALUE", "result": "EQUAL",
                    "value": BASE64.encode(value),
                }),
                Compare::Absent { key } => json!({
                    "key": BASE64.encode(key), "target": "CREATE", "result": "EQUAL",
                    "create_revision": "0",
                }),
            })
            .collect();
        let request = json!({
            "compare": compare,
            "success": success.iter().map(operation_json).collect::<Vec<_>>(),
            "failure": failure.iter().map(operation_json).collect::<Vec<_>>(),
        });
        let answer = self.post("/v3/kv/txn", &request, false, None)?;
        let succeeded = answer["succeeded"].as_bool().unwrap_or(false);
        let mut ranges = Vec::new();
        if let Some(responses) = answer["responses"].as_array() {
            for response in responses {
                if let Some(range) = response.get("response_range") {
                    ranges.push(key_values(&range["kvs"])?);
                }
            }
        }
        Ok(TxnOutcome { succeeded, ranges })
    }

    /// Grants a lease of `ttl_seconds`; returns its id and the TTL etcd granted. (Repeating a
    /// grant at worst leaves an unused lease, which expires.)
    pub fn lease_grant(&self, ttl_seconds: u64) -> Result<(i64, u64), EtcdError> {
        let body = json!({ "TTL": ttl_seconds.to_string() });
        let answer = self.post("/v3/lease/grant", &body, true, None)?;
        let id = integer(&answer["ID"])?;
        let ttl = integer(&answer["TTL"])?;
        Ok((id, u64::try_from(ttl).unwrap_or(0)))
    }

    /// Renews lease `id`, each member given at most `timeout`; returns the seconds it now has
    /// left (0: it had already expired).
    pub fn lease_keep_alive(&self, id: i64, timeout: Duration) -> Result<u64, EtcdError> {
        let body = json!({ "ID": id.to_string() });
        let answer = self.post("/v3/lease/keepalive", &body, true, Some(timeout))?;
        let result = answer.get("result").unwrap_or(&answer);
        let ttl = if result["TTL"].is_null() { 0 } else { integer(&result["TTL"])? };
        Ok(u64::try_from(ttl).unwrap_or(0))
    }

    /// How many members the etcd cluster has.
    pub fn member_count(&self) -> Result<usize, EtcdError> {
        let answer = self.post("/v3/cluster/member/list", &json!({}), true, None)?;
        match answer["members"].as_array() {
            Some(members) if !members.is_empty() => Ok(members.len()),
            _ => Err(EtcdError::Malformed(format!("a member list without members: {answer}"))),
        }
    }

    /// Lease `id`'s seconds left (0 once expired or unknown) and the TTL it was granted with.
    pub fn lease_time_to_live(&self, id: i64) -> Result<(u64, u64), EtcdError> {
        let body = json!({ "ID": id.to_string() });
        let answer = self.post("/v3/lease/timetolive", &body, true, None)?;
        let field = |name: &str| -> Result<u64, EtcdError> {
            let value = if answer[name].is_null() { 0 } else { integer(&answer[name])? };
            // etcd answers -1 for an expired or unknown lease.
            Ok(u64::try_from(value).unwrap_or(0))
        };
        Ok((field("TTL")?, field("grantedTTL")?))
    }

    /// Revokes lease `id`, deleting every key attached to it.
    pub fn lease_revoke(&self, id: i64) -> Result<(), EtcdError> {
        self.post("/v3/lease/revoke", &json!({ "ID": id.to_string() }), true, None).map(|_| ())
    }
}

/// True if `error` happened before any byte of the request could reach the server.
fn nothing_sent(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound => true,
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => true,
        ureq::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
        ),
        _ => false,
    }
}

fn operation_json(operation: &TxnOperation) -> Value {
    match operation {
        TxnOperation::Put { key, value, lease } => {
            let mut put = json!({ "key": BASE64.encode(key), "value": BASE64.encode(value) });
            if *lease != 0 {
                put["lease"] = json!(lease.to_string());
            }
            json!({ "request_put": put })
        }
        TxnOperation::Delete { key } => {
            json!({ "request_delete_range": { "key": BASE64.encode(key) } })
        }
        TxnOperation::Get { key } => json!({ "request_range": { "key": BASE64.encode(key) } }),
    }
}

/// The pairs of a `kvs` array (absent: none).
fn key_values(kvs: &Value) -> Result<Vec<KeyValue>, EtcdError> {
    let Some(list) = kvs.as_array() else {
        return if kvs.is_null() {
            Ok(Vec::new())
        } else {
            Err(EtcdError::Malformed(format!("kvs is not a list: {}", excerpt(&kvs.to_string()))))
        };
    };
    list.iter()
        .map(|pair| {
            Ok(KeyValue {
                key: bytes(&pair["key"])?,
                value: bytes(&pair["value"])?,
                create_revision: integer_or_zero(&pair["create_revision"])?,
                mod_revision: integer_or_zero(&pair["mod_revision"])?,
                lease: integer_or_zero(&pair["lease"])?,
            })
        })
        .collect()
}

/// A base64 bytes field; absent means empty (the gateway leaves empty fields out).
fn bytes(field: &Value) -> Result<Vec<u8>, EtcdError> {
    match field {
        Value::Null => Ok(Vec::new()),
        Value::String(text) => BASE64
            .decode(text)
            .map_err(|error| EtcdError::Malformed(format!("bad base64 field: {error}"))),
        other => Err(EtcdError::Malformed(format!("bytes field is not a string: {other}"))),
    }
}

/// A 64-bit integer field, which the gateway writes as a decimal string.
fn integer(field: &Value) -> Result<i64, EtcdError> {
    match field {
        Value::String(text) => text
            .parse()
            .map_err(|error| EtcdError::Malformed(format!("bad integer {text:?}: {error}"))),
        Value::Number(number) => number
            .as_i64()
            .ok_or_else(|| EtcdError::Malformed(format!("integer out of range: {number}"))),
        other => Err(EtcdError::Malformed(format!("missing integer field: {other}"))),
    }
}

fn integer_or_zero(field: &Value) -> Result<i64, EtcdError> {
    if field.is_null() {
        Ok(0)
    } else {
        integer(field)
    }
}

/// The start of `text`, for error messages.
fn excerpt(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The smallest key greater than every key that starts with `prefix` (etcd's `range_end` for
/// a prefix scan); empty (the end of the key space) if there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only 0xff bytes (or nothing): every key from the prefix on. etcd spells that "\0".
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte_that_can_be() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn answers_with_left_out_defaults_decode() {
        let kvs = json!([{ "key": BASE64.encode(b"k"), "create_revision": "5" }]);
        let pairs = key_values(&kvs).unwrap();
        assert_eq!(pairs[0].key, b"k".to_vec());
        assert_eq!(pairs[0].value, Vec::<u8>::new());
        assert_eq!(pairs[0].create_revision, 5);
        assert_eq!(pairs[0].lease, 0);
        assert!(key_values(&Value::Null).unwrap().is_empty());
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        assert!(key_values(&json!("nope")).is_err());
        assert!(key_values(&json!([{ "key": "!!!" }])).is_err());
        assert!(integer(&json!("12x")).is_err());
        assert!(integer(&Value::Null).is_err());
        assert!(bytes(&json!(7)).is_err());
    }

    #[test]
    fn endpoints_are_normalized_and_checked() {
        let client = EtcdClient::new(
            &["127.0.0.1:2379".into(), " http://h:1/ ".into()],
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(client.endpoints(), ["http://127.0.0.1:2379", "http://h:1"]);
        assert!(EtcdClient::new(&[], Duration::from_secs(1)).is_err());
        assert!(EtcdClient::new(&["https://h:1".into()], Duration::from_secs(1)).is_err());
    }
}
