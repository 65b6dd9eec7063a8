//! Properties of the checker on generated histories: a sequential execution of an independent
//! reference model, stretched into overlapping intervals that contain each operation's moment
//! of effect, is always accepted; changing one read so that it contradicts the execution
//! unambiguously is always rejected.

mod common;

use bytes::Bytes;
use common::record;
use proptest::prelude::*;
use stratus_client::Status;
use stratus_history::{check, CheckOptions, History, Operation, OperationRecord, Outcome};
use stratus_types::{RejectRules, Version};

/// One generated step: what to do, how far the interval stretches on each side of the moment
/// of effect, and (for mutations) whether the outcome is lost and, if so, whether it applied.
#[derive(Clone, Debug)]
struct Step {
    kind: u8,
    argument: u8,
    stretch_before: u64,
    stretch_after: u64,
    lost: bool,
    applied_when_lost: bool,
    version_gap: u64,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    (0u8..100, any::<u8>(), 0u64..40, 1u64..40, prop::bool::weighted(0.1), any::<bool>(), 1u64..4)
        .prop_map(|(kind, argument, before, after, lost, applied, gap)| Step {
            kind,
            argument,
            stretch_before: before,
            stretch_after: after,
            lost,
            applied_when_lost: applied,
            version_gap: gap,
        })
}

/// The reference: a Stratus object, written independently of the checker's model.
#[derive(Default)]
struct Reference {
    object: Option<(Bytes, u64)>,
    largest_version: u64,
}

impl Reference {
    fn current_version(&self) -> u64 {
        self.object.as_ref().map_or(0, |(_, version)| *version)
    }

    /// Runs `operation`; returns its outcome and whether the state changed.
    fn run(&mut self, operation: &Operation, version_gap: u64) -> Outcome {
        let current = self.current_version();
        if let Err(reason) = operation.rules().check(Version(current)) {
            let status = match reason {
                stratus_types::RejectReason::ObjectDoesntExist => Status::ObjectDoesntExist,
                stratus_types::RejectReason::ObjectExists => Status::ObjectExists,
                stratus_types::RejectReason::WrongVersion => Status::WrongVersion,
            };
            return Outcome::Refused { status, version: Version(current) };
        }
        let new_version = self.largest_version + version_gap;
        match operation {
            Operation::Read { .. } => match &self.object {
                Some((value, version)) => {
                    Outcome::Read { value: value.clone(), version: Version(*version) }
                }
                None => Outcome::Refused { status: Status::ObjectDoesntExist, version: Version(0) },
            },
            Operation::Write { value, .. } => {
                self.object = Some((value.clone(), new_version));
                self.largest_version = new_version;
                Outcome::Written { version: Version(new_version) }
            }
            Operation::Remove { .. } => {
                self.object = None;
                Outcome::Removed { version: Version(current) }
            }
            Operation::Increment { delta, .. } => {
                let integer = match &self.object {
                    None => Some(0),
                    Some((value, _)) => {
                        <[u8; 8]>::try_from(&value[..]).ok().map(i64::from_le_bytes)
                    }
                };
                match integer.and_then(|integer| integer.checked_add(*delta)) {
                    None => Outcome::Refused {
                        status: Status::InvalidObject,
                        version: Version(current),
                    },
                    Some(sum) => {
                        self.object =
                            Some((Bytes::copy_from_slice(&sum.to_le_bytes()), new_version));
                        self.largest_version = new_version;
                        Outcome::Incremented { value: sum, version: Version(new_version) }
                    }
                }
            }
        }
    }
}

fn operation_for(step: &Step, index: usize, reference: &Reference) -> Operation {
    let value = if step.argument.is_multiple_of(2) {
        Bytes::copy_from_slice(&(index as i64).to_le_bytes())
    } else {
        Bytes::from(format!("value-{index}"))
    };
    let current = Version(reference.current_version());
    let old = Version(current.0.saturating_sub(u64::from(step.argument % 3)));
    match step.kind {
        0..=34 => Operation::Read { rules: RejectRules::NONE },
        35..=39 => Operation::Read { rules: RejectRules::version_equals(old) },
        40..=59 => Operation::Write { value, rules: RejectRules::NONE },
        60..=67 => Operation::Write { value, rules: RejectRules::version_equals(old) },
        68..=71 => Operation::Write { value, rules: RejectRules::create_only() },
        72..=81 => Operation::Remove { rules: RejectRules::NONE },
        _ => {
            Operation::Increment { delta: i64::from(step.argument) - 128, rules: RejectRules::NONE }
        }
    }
}

/// A sequential execution stretched into intervals around moments 200 apart (each stretches up to 120 either way, so neighbours overlap).
fn generate(steps: &[Step]) -> History {
    let mut reference = Reference::default();
    let mut operations = Vec::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        let operation = operation_for(step, index, &reference);
        let moment = 200 * (index as u64 + 1);
        let lost = step.lost && operation.is_mutation();
        let outcome = if lost && !step.applied_when_lost {
            Outcome::Unknown { status: Status::Timeout }
        } else {
            let outcome = reference.run(&operation, step.version_gap);
            if lost {
                Outcome::Unknown { status: Status::Timeout }
            } else {
                outcome
            }
        };
        let invoked = moment - step.stretch_before * 3;
        let completed = moment + step.stretch_after * 3;
        operations.push(record(invoked, completed, operation, outcome));
    }
    History { operations }
}

fn is_linearizable(history: &History) -> bool {
    let report = check(history, &CheckOptions::default());
    assert_eq!(report.undecided().count(), 0, "small histories are always decided:\n{report}");
    report.is_linearizable()
}

fn successful_reads(history: &History) -> Vec<usize> {
    (0..history.operations.len())
        .filter(|&index| matches!(history.operations[index].outcome, Outcome::Read { .. }))
        .collect()
}

/// Index of an acknowledged write that a later acknowledged write completed before `read`
/// began, if any: reporting its value and version at `read` is unambiguously stale.
fn superseded_write(history: &History, read: &OperationRecord) -> Option<usize> {
    let operations = &history.operations;
    let newest_before = operations
        .iter()
        .filter(|operation| operation.completed < read.invoked)
        .filter_map(|operation| operation.outcome.created_version())
        .max()?;
    (0..operations.len()).find(|&index| {
        matches!(operations[index].outcome, Outcome::Written { version } if version < newest_before)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn consistent_intervals_are_accepted(steps in prop::collection::vec(step_strategy(), 1..60)) {
        let history = generate(&steps);
        prop_assert!(is_linearizable(&history), "rejected:\n{}\n{history}",
            check(&history, &CheckOptions::default()));
    }

    #[test]
    fn a_read_of_a_value_never_written_is_rejected(
        steps in prop::collection::vec(step_strategy(), 1..60),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut history = generate(&steps);
        let reads = successful_reads(&history);
        prop_assume!(!reads.is_empty());
        let read = &mut history.operations[reads[pick.index(reads.len())]];
        let Outcome::Read { version, .. } = read.outcome else { unreachable!() };
        // Never written: no write uses this text, and increments only make 8-byte values.
        read.outcome = Outcome::Read { value: Bytes::from_static(b"never written"), version };
        prop_assert!(!is_linearizable(&history), "accepted:\n{history}");
    }

    #[test]
    fn a_stale_read_is_rejected(
        steps in prop::collection::vec(step_strategy(), 1..60),
        pick in any::<prop::sample::Index>(),
    ) {
        let mut history = generate(&steps);
        let reads = successful_reads(&history);
        prop_assume!(!reads.is_empty());
        let read_index = reads[pick.index(reads.len())];
        let superseded = superseded_write(&history, &history.operations[read_index]);
        prop_assume!(superseded.is_some());
        let write = &history.operations[superseded.expect("assumed")];
        let (Operation::Write { value, .. }, Outcome::Written { version }) =
            (&write.operation, &write.outcome) else { unreachable!() };
        let stale = Outcome::Read { value: value.clone(), version: *version };
        history.operations[read_index].outcome = stale;
        prop_assert!(!is_linearizable(&history), "accepted:\n{history}");
    }

    #[test]
    fn a_read_of_a_version_never_created_is_rejected(
        mut steps in prop::collection::vec(step_strategy(), 1..60),
        pick in any::<prop::sample::Index>(),
    ) {
        // Without lost outcomes, so that no write of unknown version can explain the read.
        for step in &mut steps {
            step.lost = false;
        }
        let mut history = generate(&steps);
        let reads = successful_reads(&history);
        prop_assume!(!reads.is_empty());
        let read = &mut history.operations[reads[pick.index(reads.len())]];
        let Outcome::Read { value, .. } = read.outcome.clone() else { unreachable!() };
        // Versions grow by at most 3 per operation, so this one was never created.
        read.outcome = Outcome::Read { value, version: Version(1 << 40) };
        prop_assert!(!is_linearizable(&history), "accepted:\n{history}");
    }
}
