//! memcached: one item per record.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use super::{record_bytes, Database, CONDITIONAL_WRITE_ATTEMPTS};
use crate::peers::connect;
use crate::resp_client::REPLY_BYTES_MAX;
use crate::ycsb::generators::FIELD_LENGTH;
use crate::ycsb::measure::Outcome;

/// Why workload E does not run on memcached.
pub const MEMCACHED_NO_SCAN: &str = "memcached has no ordering and no enumeration in its protocol \
    (YCSB's memcached binding returns NOT_IMPLEMENTED for scan); workload E is skipped";

/// memcached with one object per record (key `usertable-<key>` as YCSB's binding qualifies
/// it), the 10 fields concatenated; insert = `add`; read = `get`; update = `gets` + `cas` of
/// the whole record with one field replaced (YCSB's binding instead `replace`s the record with
/// only the updated field, losing the other nine: we keep the record whole).
pub struct MemcachedDatabase {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl MemcachedDatabase {
    /// Connects to memcached at `address`.
    pub fn open(address: &str) -> Result<MemcachedDatabase, String> {
        let stream = connect(address)?;
        let reader = BufReader::new(stream.try_clone().map_err(|error| error.to_string())?);
        Ok(MemcachedDatabase { reader, writer: stream })
    }

    fn line(&mut self) -> Result<String, String> {
        let mut line = String::new();
        let bytes = self
            .reader
            .read_line(&mut line)
            .map_err(|error| format!("reading from memcached: {error}"))?;
        if bytes == 0 {
            return Err("memcached closed the connection".into());
        }
        Ok(line.trim_end().to_string())
    }

    /// `get`/`gets` of one key: the value and its CAS unique (0 for `get`), if present.
    fn fetch(&mut self, command: &str, key: &str) -> Result<Option<(Vec<u8>, u64)>, String> {
        self.writer
            .write_all(format!("{command} usertable-{key}\r\n").as_bytes())
            .map_err(|error| format!("sending to memcached: {error}"))?;
        let header = self.line()?;
        if header == "END" {
            return Ok(None);
        }
        let parts: Vec<&str> = header.split(' ').collect();
        if parts.first() != Some(&"VALUE") || parts.len() < 4 {
            return Err(format!("unexpected memcached reply {header:?}"));
        }
        let length: usize = parts[3].parse().map_err(|_| format!("bad length in {header:?}"))?;
        // The buffer is allocated from the announced length: bound it first.
        if length > REPLY_BYTES_MAX {
            return Err(format!("memcached announced a value of {length} bytes"));
        }
        let unique: u64 = parts.get(4).and_then(|text| text.parse().ok()).unwrap_or(0);
        let mut data = vec![0; length + 2];
        self.reader
            .read_exact(&mut data)
            .map_err(|error| format!("reading from memcached: {error}"))?;
        data.truncate(length);
        let end = self.line()?;
        if end != "END" {
            return Err(format!("unexpected memcached reply {end:?}"));
        }
        Ok(Some((data, unique)))
    }

    /// A storage command; returns the reply line.
    fn store(
        &mut self,
        command: &str,
        key: &str,
        data: &[u8],
        unique: Option<u64>,
    ) -> Result<String, String> {
        let mut request = format!("{command} usertable-{key} 0 0 {}", data.len());
        if let Some(unique) = unique {
            let _ = write!(request, " {unique}");
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(data);
        bytes.extend_from_slice(b"\r\n");
        self.writer.write_all(&bytes).map_err(|error| format!("sending to memcached: {error}"))?;
        self.line()
    }
}

impl Database for MemcachedDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        match self.store("add", key, &record_bytes(fields), None)?.as_str() {
            "STORED" => Ok(Outcome::Ok),
            reply => Err(format!("memcached add of {key}: {reply}")),
        }
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        Ok(if self.fetch("get", key)?.is_some() { Outcome::Ok } else { Outcome::NotFound })
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        for _ in 0..CONDITIONAL_WRITE_ATTEMPTS {
            let Some((mut record, unique)) = self.fetch("gets", key)? else {
                return Ok(Outcome::NotFound);
            };
            let range = field * FIELD_LENGTH..(field + 1) * FIELD_LENGTH;
            if record.len() < range.end {
                return Err(format!("memcached record {key} has {} bytes", record.len()));
            }
            record[range].copy_from_slice(value);
            match self.store("cas", key, &record, Some(unique))?.as_str() {
                "STORED" => return Ok(Outcome::Ok),
                "EXISTS" => continue,
                "NOT_FOUND" => return Ok(Outcome::NotFound),
                reply => return Err(format!("memcached cas of {key}: {reply}")),
            }
        }
        Err(format!(
            "memcached update of {key}: {CONDITIONAL_WRITE_ATTEMPTS} cas attempts lost races"
        ))
    }

    fn scan(&mut self, _start_key: &str, _count: u64) -> Result<Outcome, String> {
        Err(MEMCACHED_NO_SCAN.into())
    }
}
