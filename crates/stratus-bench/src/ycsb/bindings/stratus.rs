//! Stratus: one object per record.

use stratus_client::{BlockingClient, RejectRules, TableId};
use stratus_wire::Status;

use super::{record_bytes, Database, CONDITIONAL_WRITE_ATTEMPTS};
use crate::ycsb::generators::FIELD_LENGTH;
use crate::ycsb::measure::Outcome;

/// Stratus: one object per record in table `usertable`; an update reads the record and writes
/// it back with field i replaced, conditional on the version read (retried on a race).
pub struct StratusDatabase {
    /// The connection.
    pub client: BlockingClient,
    /// `usertable`.
    pub table: TableId,
}

impl Database for StratusDatabase {
    fn insert(&mut self, key: &str, fields: &[Vec<u8>]) -> Result<Outcome, String> {
        self.client
            .write(self.table, key.as_bytes(), &record_bytes(fields), RejectRules::NONE)
            .map_err(|error| format!("stratus write: {error:?}"))?;
        Ok(Outcome::Ok)
    }

    fn read(&mut self, key: &str) -> Result<Outcome, String> {
        match self.client.read(self.table, key.as_bytes(), RejectRules::NONE) {
            Ok(_) => Ok(Outcome::Ok),
            Err(error) if error.status == Status::ObjectDoesntExist => Ok(Outcome::NotFound),
            Err(error) => Err(format!("stratus read: {error:?}")),
        }
    }

    fn update(&mut self, key: &str, field: usize, value: &[u8]) -> Result<Outcome, String> {
        for _ in 0..CONDITIONAL_WRITE_ATTEMPTS {
            let (current, version) =
                match self.client.read(self.table, key.as_bytes(), RejectRules::NONE) {
                    Ok(found) => found,
                    Err(error) if error.status == Status::ObjectDoesntExist => {
                        return Ok(Outcome::NotFound)
                    }
                    Err(error) => return Err(format!("stratus read: {error:?}")),
                };
            let mut record = current.to_vec();
            let range = field * FIELD_LENGTH..(field + 1) * FIELD_LENGTH;
            if record.len() < range.end {
                return Err(format!("stratus record {key} has {} bytes", record.len()));
            }
            record[range].copy_from_slice(value);
            match self.client.write(
                self.table,
                key.as_bytes(),
                &record,
                RejectRules::version_equals(version),
            ) {
                Ok(_) => return Ok(Outcome::Ok),
                Err(error) if error.status == Status::WrongVersion => continue,
                Err(error) if error.status == Status::ObjectDoesntExist => {
                    return Ok(Outcome::NotFound)
                }
                Err(error) => return Err(format!("stratus write: {error:?}")),
            }
        }
        Err(format!(
            "stratus update of {key}: {CONDITIONAL_WRITE_ATTEMPTS} conditional writes lost races"
        ))
    }

    fn scan(&mut self, _start_key: &str, _count: u64) -> Result<Outcome, String> {
        Err(STRATUS_NO_SCAN.into())
    }
}

/// Why workload E does not run on Stratus.
pub const STRATUS_NO_SCAN: &str = "Stratus has no ordered scan: a table is enumerated in \
    bit-reversed key-hash order from its beginning, with no way to start at a key, and the \
    client has no ordered index; workload E (scans in key order from a start key) is skipped";
