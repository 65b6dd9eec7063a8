//! The history model: operations on keys of tables, each with invocation, completion and
//! outcome.

use std::fmt;

use bytes::Bytes;
use stratus_client::Status;
use stratus_types::{RejectRules, TableId, Version};

/// What a client asked for on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Read the object, subject to reject rules.
    Read {
        /// Conditions checked before reading.
        rules: RejectRules,
    },
    /// Write `value`, subject to reject rules.
    Write {
        /// The value written.
        value: Bytes,
        /// Conditions checked before writing.
        rules: RejectRules,
    },
    /// Remove the object, subject to reject rules.
    Remove {
        /// Conditions checked before removing.
        rules: RejectRules,
    },
    /// Add `delta` to the 8-byte little-endian integer object (missing counts as 0).
    Increment {
        /// The amount added.
        delta: i64,
        /// Conditions checked before incrementing.
        rules: RejectRules,
    },
}

impl Operation {
    /// True for operations that may change the object.
    pub fn is_mutation(&self) -> bool {
        !matches!(self, Operation::Read { .. })
    }

    /// The reject rules of the operation.
    pub fn rules(&self) -> RejectRules {
        match self {
            Operation::Read { rules }
            | Operation::Write { rules, .. }
            | Operation::Remove { rules }
            | Operation::Increment { rules, .. } => *rules,
        }
    }
}

/// How an operation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A read returned this value and version.
    Read {
        /// The value read.
        value: Bytes,
        /// Its version.
        version: Version,
    },
    /// A write succeeded and created this version.
    Written {
        /// The new version.
        version: Version,
    },
    /// A remove succeeded; the removed version, 0 if there was no object.
    Removed {
        /// The version removed (0 if none).
        version: Version,
    },
    /// An increment succeeded with this new value and version.
    Incremented {
        /// The new integer value.
        value: i64,
        /// The new version.
        version: Version,
    },
    /// The operation was refused because of the object's state and had no effect:
    /// OBJECT_DOESNT_EXIST, OBJECT_EXISTS, WRONG_VERSION or INVALID_OBJECT, with the object's
    /// current version as reported (0 when missing).
    Refused {
        /// Why it was refused.
        status: Status,
        /// The current version the server reported.
        version: Version,
    },
    /// The outcome is unknown (timeout, lost connection, any other failure): the operation may
    /// or may not have taken effect, at any time after its invocation.
    Unknown {
        /// The status the client reported.
        status: Status,
    },
}

impl Outcome {
    /// True when the operation may or may not have taken effect.
    pub fn is_unknown(&self) -> bool {
        matches!(self, Outcome::Unknown { .. })
    }

    /// The version this outcome says the operation created (acknowledged writes and
    /// increments), if any.
    pub fn created_version(&self) -> Option<Version> {
        match self {
            Outcome::Written { version } | Outcome::Incremented { version, .. } => Some(*version),
            _ => None,
        }
    }

    /// The object's version this outcome observed (0 = missing), for outcomes that observe one
    /// without changing it.
    pub fn observed_version(&self) -> Option<Version> {
        match self {
            Outcome::Read { version, .. } => Some(*version),
            Outcome::Refused { status, version } if *status != Status::InvalidObject => {
                Some(*version)
            }
            _ => None,
        }
    }

    /// Whether `status` (not OK) is an object outcome: the server refused the operation because
    /// of the object's state, so it had no effect and the reported version is meaningful.
    pub fn is_refusal(status: Status) -> bool {
        matches!(
            status,
            Status::ObjectDoesntExist
                | Status::ObjectExists
                | Status::WrongVersion
                | Status::InvalidObject
        )
    }
}

/// One operation of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationRecord {
    /// Unique within its history, in order of invocation.
    pub id: u64,
    /// Which client (one sequential thread of calls) issued it.
    pub client: u32,
    /// The table.
    pub table: TableId,
    /// The key.
    pub key: Bytes,
    /// What was asked.
    pub operation: Operation,
    /// Logical time of the invocation.
    pub invoked: u64,
    /// Logical time of the completion; an unknown outcome may take effect even after it.
    pub completed: u64,
    /// How it ended.
    pub outcome: Outcome,
}

impl OperationRecord {
    /// The logical time after which this operation can no longer take effect: its completion,
    /// or never for an unknown outcome.
    pub fn effect_deadline(&self) -> u64 {
        if self.outcome.is_unknown() {
            u64::MAX
        } else {
            self.completed
        }
    }
}

impl fmt::Display for OperationRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} client {} [{}, {}] table {} key {:?}: ",
            self.id,
            self.client,
            self.invoked,
            self.completed,
            self.table.0,
            EscapedBytes(&self.key)
        )?;
        match &self.operation {
            Operation::Read { .. } => write!(f, "read")?,
            Operation::Write { value, .. } => write!(f, "write {:?}", EscapedBytes(value))?,
            Operation::Remove { .. } => write!(f, "remove")?,
            Operation::Increment { delta, .. } => write!(f, "increment {delta}")?,
        }
        let rules = self.operation.rules();
        if !rules.is_unconditional() {
            write!(f, " if {rules:?}")?;
        }
        match &self.outcome {
            Outcome::Read { value, version } => {
                write!(f, " -> {:?} version {}", EscapedBytes(value), version.0)
            }
            Outcome::Written { version } => write!(f, " -> ok version {}", version.0),
            Outcome::Removed { version } => write!(f, " -> removed version {}", version.0),
            Outcome::Incremented { value, version } => {
                write!(f, " -> {value} version {}", version.0)
            }
            Outcome::Refused { status, version } => {
                write!(f, " -> refused {status:?} (current version {})", version.0)
            }
            Outcome::Unknown { status } => write!(f, " -> unknown outcome ({status:?})"),
        }
    }
}

/// Bytes shown as a string with non-printable bytes escaped.
struct EscapedBytes<'a>(&'a [u8]);

impl fmt::Debug for EscapedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

/// A whole history: every recorded operation, in any order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The operations.
    pub operations: Vec<OperationRecord>,
}

impl History {
    /// Number of operations.
    pub fn len(&self) -> usize {
        self.operations.len()
    }

    /// True when no operation was recorded.
    pub fn is_empty(&self) -> bool {
        self.operations.is_empty()
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for operation in &self.operations {
            writeln!(f, "  {operation}")?;
        }
        Ok(())
    }
}
