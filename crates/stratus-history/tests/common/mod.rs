//! Builders for hand-written histories on one key.

#![allow(dead_code)]

use bytes::Bytes;
use stratus_client::Status;
use stratus_history::{History, Operation, OperationRecord, Outcome};
use stratus_types::{RejectRules, TableId, Version};

pub fn record(
    invoked: u64,
    completed: u64,
    operation: Operation,
    outcome: Outcome,
) -> OperationRecord {
    OperationRecord {
        id: invoked,
        client: 0,
        table: TableId(1),
        key: Bytes::from_static(b"k"),
        operation,
        invoked,
        completed,
        outcome,
    }
}

pub fn history(operations: Vec<OperationRecord>) -> History {
    History { operations }
}

pub fn write(value: &str) -> Operation {
    Operation::Write { value: Bytes::copy_from_slice(value.as_bytes()), rules: RejectRules::NONE }
}

pub fn write_if(value: &str, rules: RejectRules) -> Operation {
    Operation::Write { value: Bytes::copy_from_slice(value.as_bytes()), rules }
}

pub fn read() -> Operation {
    Operation::Read { rules: RejectRules::NONE }
}

pub fn remove() -> Operation {
    Operation::Remove { rules: RejectRules::NONE }
}

pub fn increment(delta: i64) -> Operation {
    Operation::Increment { delta, rules: RejectRules::NONE }
}

pub fn written(version: u64) -> Outcome {
    Outcome::Written { version: Version(version) }
}

pub fn value(value: &str, version: u64) -> Outcome {
    Outcome::Read { value: Bytes::copy_from_slice(value.as_bytes()), version: Version(version) }
}

pub fn integer(value: i64, version: u64) -> Outcome {
    Outcome::Read { value: Bytes::copy_from_slice(&value.to_le_bytes()), version: Version(version) }
}

pub fn removed(version: u64) -> Outcome {
    Outcome::Removed { version: Version(version) }
}

pub fn incremented(value: i64, version: u64) -> Outcome {
    Outcome::Incremented { value, version: Version(version) }
}

pub fn refused(status: Status, version: u64) -> Outcome {
    Outcome::Refused { status, version: Version(version) }
}

pub fn missing() -> Outcome {
    refused(Status::ObjectDoesntExist, 0)
}

pub fn unknown() -> Outcome {
    Outcome::Unknown { status: Status::Timeout }
}
