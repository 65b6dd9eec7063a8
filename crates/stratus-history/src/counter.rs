//! The counter model: keys only ever incremented by 1, where exactly-once is visible in the
//! numbers (docs/design/exactly-once.md).
//!
//! A register model accepts a history in which an increment whose answer was lost was applied
//! twice, as long as nobody observed the intermediate value. A counter does not: each
//! increment by 1 that takes effect adds exactly 1, so
//!
//! - the values acknowledged increments returned are distinct (two increments that returned
//!   the same value were one increment applied once and answered twice, or the same
//!   application reported to two callers);
//! - the final value is at least the number of acknowledged increments, and at most that plus
//!   the increments whose outcome is unknown: more means some increment was applied twice;
//! - every acknowledged value is at most the final value.
//!
//! Refused increments (INVALID_OBJECT cannot happen to a counter) must not occur.

use std::collections::BTreeSet;
use std::fmt;

use bytes::Bytes;
use stratus_types::TableId;

use crate::history::{History, Operation, Outcome};

/// What a counter's history came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterReport {
    /// Increments acknowledged with their new value.
    pub acknowledged: u64,
    /// Increments whose outcome is unknown.
    pub unknown: u64,
    /// The counter's final value.
    pub final_value: i64,
}

/// Why a counter's history shows a mutation applied other than once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterViolation {
    /// Two acknowledged increments returned the same value.
    DuplicateValue {
        /// The value returned twice.
        value: i64,
    },
    /// The final value exceeds what the increments could have produced: one was applied
    /// twice (or more).
    TooHigh {
        /// What the history allows at most.
        most: i64,
        /// The counter's final value.
        final_value: i64,
    },
    /// The final value is below the acknowledged increments: one was lost.
    TooLow {
        /// What the history requires at least.
        least: i64,
        /// The counter's final value.
        final_value: i64,
    },
    /// An acknowledged increment returned a value above the final value.
    ValueAboveFinal {
        /// The value returned.
        value: i64,
        /// The counter's final value.
        final_value: i64,
    },
    /// An operation other than an increment by 1 (or a read) touched the key, or an increment
    /// was refused: the key is not a counter.
    NotACounter {
        /// What happened.
        what: String,
    },
}

impl fmt::Display for CounterViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CounterViolation::DuplicateValue { value } => {
                write!(f, "two acknowledged increments both returned {value}")
            }
            CounterViolation::TooHigh { most, final_value } => write!(
                f,
                "the counter ended at {final_value}, above the {most} its increments allow: an \
                 increment was applied more than once"
            ),
            CounterViolation::TooLow { least, final_value } => write!(
                f,
                "the counter ended at {final_value}, below its {least} acknowledged increments: \
                 an acknowledged increment was lost"
            ),
            CounterViolation::ValueAboveFinal { value, final_value } => write!(
                f,
                "an increment returned {value}, above the counter's final value {final_value}"
            ),
            CounterViolation::NotACounter { what } => write!(f, "not a counter: {what}"),
        }
    }
}

/// Checks the counter (`table`, `key`) of `history`, whose value read after every increment
/// ended is `final_value`.
pub fn check_counter(
    history: &History,
    table: TableId,
    key: &Bytes,
    final_value: i64,
) -> Result<CounterReport, CounterViolation> {
    let mut values = BTreeSet::new();
    let mut report = CounterReport { acknowledged: 0, unknown: 0, final_value };
    let records = history.operations.iter().filter(|record| {
        record.table == table && record.key == *key && record.operation.is_mutation()
    });
    for record in records {
        match (&record.operation, &record.outcome) {
            (Operation::Increment { delta: 1, rules }, outcome) if rules.is_unconditional() => {
                match outcome {
                    Outcome::Incremented { value, .. } => {
                        report.acknowledged += 1;
                        if !values.insert(*value) {
                            return Err(CounterViolation::DuplicateValue { value: *value });
                        }
                    }
                    Outcome::Unknown { .. } => report.unknown += 1,
                    other => {
                        return Err(CounterViolation::NotACounter {
                            what: format!("an increment ended {other:?}"),
                        })
                    }
                }
            }
            (operation, _) => {
                return Err(CounterViolation::NotACounter {
                    what: format!("{operation:?} on the key"),
                })
            }
        }
    }
    let least = i64::try_from(report.acknowledged).unwrap_or(i64::MAX);
    let most = least.saturating_add(i64::try_from(report.unknown).unwrap_or(i64::MAX));
    if final_value > most {
        return Err(CounterViolation::TooHigh { most, final_value });
    }
    if final_value < least {
        return Err(CounterViolation::TooLow { least, final_value });
    }
    if let Some(&value) = values.iter().next_back().filter(|value| **value > final_value) {
        return Err(CounterViolation::ValueAboveFinal { value, final_value });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use stratus_client::Status;
    use stratus_types::{RejectRules, Version};

    use super::*;
    use crate::history::OperationRecord;

    const TABLE: TableId = TableId(1);

    fn increment(id: u64, outcome: Outcome) -> OperationRecord {
        OperationRecord {
            id,
            client: 0,
            table: TABLE,
            key: Bytes::from_static(b"c"),
            operation: Operation::Increment { delta: 1, rules: RejectRules::NONE },
            invoked: id * 2,
            completed: id * 2 + 1,
            outcome,
        }
    }

    fn acknowledged(id: u64, value: i64) -> OperationRecord {
        increment(id, Outcome::Incremented { value, version: Version(value as u64) })
    }

    fn unknown(id: u64) -> OperationRecord {
        increment(id, Outcome::Unknown { status: Status::Timeout })
    }

    fn check(
        operations: Vec<OperationRecord>,
        final_value: i64,
    ) -> Result<CounterReport, CounterViolation> {
        let history = History { operations };
        check_counter(&history, TABLE, &Bytes::from_static(b"c"), final_value)
    }

    #[test]
    fn a_counter_applied_exactly_once_passes() {
        let report = check(vec![acknowledged(1, 1), unknown(2), acknowledged(3, 3)], 3).unwrap();
        assert_eq!(report, CounterReport { acknowledged: 2, unknown: 1, final_value: 3 });
        // The unknown one may not have been applied at all.
        check(vec![acknowledged(1, 1), unknown(2), acknowledged(3, 2)], 2).unwrap();
    }

    #[test]
    fn an_increment_applied_twice_is_caught() {
        // Its retry applied it again: one more than the increments allow.
        assert_eq!(
            check(vec![acknowledged(1, 2), acknowledged(2, 3)], 3),
            Err(CounterViolation::TooHigh { most: 2, final_value: 3 })
        );
        // Or its two answers reported the same application.
        assert_eq!(
            check(vec![acknowledged(1, 1), acknowledged(2, 1)], 1),
            Err(CounterViolation::DuplicateValue { value: 1 })
        );
    }

    #[test]
    fn a_lost_increment_is_caught() {
        assert_eq!(
            check(vec![acknowledged(1, 1), acknowledged(2, 2)], 1),
            Err(CounterViolation::TooLow { least: 2, final_value: 1 })
        );
    }

    #[test]
    fn other_operations_on_a_counter_are_refused() {
        let mut write = acknowledged(1, 1);
        write.operation = Operation::Write { value: Bytes::new(), rules: RejectRules::NONE };
        assert!(matches!(check(vec![write], 1), Err(CounterViolation::NotACounter { .. })));
    }
}
