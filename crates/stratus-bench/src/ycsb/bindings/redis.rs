//! Redis, with YCSB's redis binding's mapping.

use stratus_resp::Value;

use super::Database;
use crate::resp_client::RespConnection;
use crate::ycsb::generators::{java_string_hash, FIELD_COUNT};
use crate::ycsb::measure::Outcome;

/// Redis with YCSB's redis binding's mapping: a record is a hash (fields field0..field9);
/// insert = HSET of all fields + `ZADD _indices <String.hashCode(key)> key`; read = HGETALL;
/// update = HSET of one field; scan = `ZRANGEBYSCORE _indices <hash(start)> +inf LIMIT 0 n`
/// then HGETALL of each key.
///
/// With `wait_replicas` (the `wait-R` configurations) an operation that writes is
/// acknowledged only once R replicas have it: its last write command goes out with
/// `WAIT R 0` in the same round trip (WAIT covers every earlier write of the connection, so an
/// insert's HSET and ZADD need one WAIT, after the ZADD).
pub struct RedisDatabase {
    connection: RespConnection,
    wait_replicas: Option<u32>,
}

const REDIS_INDEX_KEY: &[u8] = b"_indices";

impl RedisDatabase {
    /// A database over `connection` (plain or TLS) to the Redis server (the primary, with
    /// `wait_replicas`).
    pub fn over(connection: RespConnection, wait_replicas: Option<u32>) -> RedisDatabase {
        RedisDatabase { connection, wait_replicas }
    }

    /// A write command that ends an operation: acknowledged by the replicas when asked for.
    fn last_write(&mut self, arguments: &[&[u8]]) -> Result<Value, String> {
        Ok(match self.wait_replicas {
            Some(replicas) => self.connection.call_then_wait(arguments, replicas)?,
            None => self.connection.call(arguments)?,
        })
    }

    fn hgetall(&mut self, key: &[u8]) -> Result<Outcome, String> {
        match self.connection.call(&[b"HGETALL", key])? {
            Value::Array(items) if items.is_empty() => Ok(Outcome::NotFound),
            Value::Array(items) if items.len() == 2 * FIELD_COUNT => Ok(Outcome::Ok),
            reply => Err(format!("unexpected HGETALL reply {reply:?}")),
        }
    }
}

impl Database for RedisDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        let names: Vec<String> = (0..fields.len()).map(|index| format!("field{index}")).collect();
        let mut arguments: Vec<&[u8]> = vec![b"HSET", key.as_bytes()];
        for (name, value) in names.iter().zip(fields) {
            arguments.push(name.as_bytes());
            arguments.push(value);
        }
        self.connection.call(&arguments)?;
        let score = java_string_hash(key).to_string();
        self.last_write(&[b"ZADD", REDIS_INDEX_KEY, score.as_bytes(), key.as_bytes()])?;
        Ok(Outcome::Ok)
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        self.hgetall(key.as_bytes())
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        let name = format!("field{field}");
        self.last_write(&[b"HSET", key.as_bytes(), name.as_bytes(), value])?;
        Ok(Outcome::Ok)
    }

    fn scan(&mut self, start_key: &str, count: u64) -> Result<Outcome, String> {
        let score = java_string_hash(start_key).to_string();
        let count = count.to_string();
        let keys = match self.connection.call(&[
            b"ZRANGEBYSCORE",
            REDIS_INDEX_KEY,
            score.as_bytes(),
            b"+inf",
            b"LIMIT",
            b"0",
            count.as_bytes(),
        ])? {
            Value::Array(items) => items,
            reply => return Err(format!("unexpected ZRANGEBYSCORE reply {reply:?}")),
        };
        for key in keys {
            let Value::BulkString(key) = key else {
                return Err("unexpected ZRANGEBYSCORE item".into());
            };
            self.hgetall(&key)?;
        }
        Ok(Outcome::Ok)
    }
}
