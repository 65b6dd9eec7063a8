//! The sequential specification: one Stratus object as a register with versions.
//!
//! Besides the value, the state keeps a lower bound of the largest version the key ever had,
//! because Stratus never reuses a version: every version it creates exceeds every version the
//! key had before, across removes too. An operation whose outcome is unknown may create a
//! version nobody saw; the state then says "present, version unknown" until an outcome that
//! reports the version pins it down.

use std::collections::HashMap;

use bytes::Bytes;
use stratus_client::Status;
use stratus_types::{RejectReason, RejectRules, Version};

use crate::history::{Operation, OperationRecord, Outcome};

/// The state of one key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RegisterState {
    /// The object's value, interned (see [`Values`]); `None` when the object is missing.
    value: Option<u32>,
    /// The present object's version; `None` when it is present but was created by an
    /// operation whose outcome is unknown. Always `Some(0)` when the object is missing.
    version: Option<u64>,
    /// Every version created from now on exceeds this.
    version_floor: u64,
}

impl RegisterState {
    /// A key that never held an object.
    pub(crate) fn missing() -> RegisterState {
        RegisterState { value: None, version: Some(0), version_floor: 0 }
    }
}

/// Value bytes interned to small numbers, so states are cheap to hash and compare.
#[derive(Debug, Default)]
pub(crate) struct Values {
    identifiers: HashMap<Bytes, u32>,
    values: Vec<Bytes>,
}

impl Values {
    fn intern(&mut self, value: &Bytes) -> u32 {
        if let Some(&identifier) = self.identifiers.get(value) {
            return identifier;
        }
        let identifier = u32::try_from(self.values.len()).expect("fewer than 2^32 values");
        self.identifiers.insert(value.clone(), identifier);
        self.values.push(value.clone());
        identifier
    }

    fn get(&self, identifier: u32) -> &Bytes {
        &self.values[identifier as usize]
    }
}

/// What the reject rules decide for a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RulesVerdict {
    Proceed,
    Refuse(Status),
    /// Depends on a version the history does not reveal.
    Ambiguous,
}

fn refusal_status(reason: RejectReason) -> Status {
    match reason {
        RejectReason::ObjectDoesntExist => Status::ObjectDoesntExist,
        RejectReason::ObjectExists => Status::ObjectExists,
        RejectReason::WrongVersion => Status::WrongVersion,
    }
}

fn rules_verdict(rules: &RejectRules, state: &RegisterState) -> RulesVerdict {
    let Some(version) = state.version else {
        // Present, with a version above the floor that nobody has seen.
        if rules.exists {
            return RulesVerdict::Refuse(Status::ObjectExists);
        }
        let given = rules.given_version.0;
        if rules.version_le_given && given > state.version_floor {
            return RulesVerdict::Ambiguous;
        }
        if rules.version_ne_given {
            if given > state.version_floor {
                return RulesVerdict::Ambiguous;
            }
            return RulesVerdict::Refuse(Status::WrongVersion);
        }
        return RulesVerdict::Proceed;
    };
    match rules.check(Version(version)) {
        Ok(()) => RulesVerdict::Proceed,
        Err(reason) => RulesVerdict::Refuse(refusal_status(reason)),
    }
}

/// Pins down an unknown version to `observed`; `None` if that contradicts the state (the
/// version was created after the floor, so it must exceed it).
fn resolve(state: &RegisterState, observed: Option<Version>) -> Option<RegisterState> {
    match (state.version, observed) {
        (None, Some(observed)) if observed.0 > state.version_floor => Some(RegisterState {
            version: Some(observed.0),
            version_floor: observed.0,
            ..state.clone()
        }),
        (None, Some(_)) => None,
        _ => Some(state.clone()),
    }
}

/// The state after a mutation that leaves `value` with `version` (`Some(0)` when missing,
/// `None` when unknown), on a key whose versions so far are at most `floor`.
fn created(value: Option<u32>, version: Option<u64>, floor: u64) -> RegisterState {
    RegisterState { value, version, version_floor: floor.max(version.unwrap_or(0)) }
}

/// Up to two states an operation may lead to: one for a known outcome, "not applied" and
/// "applied" for an unknown one.
pub(crate) type Candidates = [Option<RegisterState>; 2];

/// The integer value of a state for an increment: missing counts as 0; `None` if the value is
/// not an 8-byte integer.
fn integer_value(values: &Values, state: &RegisterState) -> Option<i64> {
    match state.value {
        None => Some(0),
        Some(identifier) => {
            let bytes: [u8; 8] = values.get(identifier)[..].try_into().ok()?;
            Some(i64::from_le_bytes(bytes))
        }
    }
}

/// The model: applies one operation with its recorded outcome to a state.
pub(crate) fn step(
    values: &mut Values,
    state: &RegisterState,
    record: &OperationRecord,
) -> Candidates {
    if record.outcome.is_unknown() {
        return [Some(state.clone()), apply_unknown(values, state, &record.operation)];
    }
    [step_known(values, state, &record.operation, &record.outcome), None]
}

/// The state if a mutation with an unknown outcome took effect, or `None` if it could not have.
fn apply_unknown(
    values: &mut Values,
    state: &RegisterState,
    operation: &Operation,
) -> Option<RegisterState> {
    if let RulesVerdict::Refuse(_) = rules_verdict(&operation.rules(), state) {
        return None;
    }
    let floor = state.version_floor.max(state.version.unwrap_or(0));
    match operation {
        Operation::Read { .. } => None,
        Operation::Write { value, .. } => Some(created(Some(values.intern(value)), None, floor)),
        Operation::Remove { .. } => Some(created(None, Some(0), floor)),
        Operation::Increment { delta, .. } => {
            let sum = integer_value(values, state)?.checked_add(*delta)?;
            let value = values.intern(&Bytes::copy_from_slice(&sum.to_le_bytes()));
            Some(created(Some(value), None, floor))
        }
    }
}

/// The version an outcome proves the object had just before the operation, if it proves one.
fn observed_before(operation: &Operation, outcome: &Outcome) -> Option<Version> {
    match outcome {
        Outcome::Read { version, .. } | Outcome::Removed { version } => Some(*version),
        Outcome::Refused { status, version } if *status != Status::InvalidObject => Some(*version),
        Outcome::Written { .. } | Outcome::Incremented { .. } => {
            let rules = operation.rules();
            rules.version_ne_given.then_some(rules.given_version)
        }
        _ => None,
    }
}

fn step_known(
    values: &mut Values,
    state: &RegisterState,
    operation: &Operation,
    outcome: &Outcome,
) -> Option<RegisterState> {
    let state = resolve(state, observed_before(operation, outcome))?;
    let verdict = rules_verdict(&operation.rules(), &state);
    if let Outcome::Refused { status, version } = outcome {
        if *status == Status::InvalidObject {
            return step_invalid_object(values, &state, operation, verdict);
        }
        // A refusal reports the current version (0 when missing); resolve made it known.
        let current = state.version?;
        let matches = verdict == RulesVerdict::Refuse(*status) && version.0 == current;
        let read_of_missing = matches!(operation, Operation::Read { .. })
            && verdict == RulesVerdict::Proceed
            && state.value.is_none()
            && *status == Status::ObjectDoesntExist
            && version.0 == 0;
        return (matches || read_of_missing).then_some(state);
    }
    if let RulesVerdict::Refuse(_) = verdict {
        return None;
    }
    let floor = state.version_floor.max(state.version.unwrap_or(0));
    match (operation, outcome) {
        (Operation::Read { .. }, Outcome::Read { value, version }) => {
            let present = state.value?;
            let same = values.get(present) == value && state.version == Some(version.0);
            same.then_some(state)
        }
        (Operation::Write { value, .. }, Outcome::Written { version }) => {
            let created_version = (version.0 > floor).then_some(version.0)?;
            Some(created(Some(values.intern(value)), Some(created_version), floor))
        }
        (Operation::Remove { .. }, Outcome::Removed { version }) => {
            (state.version == Some(version.0)).then(|| created(None, Some(0), floor))
        }
        (Operation::Increment { delta, .. }, Outcome::Incremented { value, version }) => {
            let sum = integer_value(values, &state)?.checked_add(*delta)?;
            let created_version = (sum == *value && version.0 > floor).then_some(version.0)?;
            let bytes = Bytes::copy_from_slice(&sum.to_le_bytes());
            Some(created(Some(values.intern(&bytes)), Some(created_version), floor))
        }
        _ => None,
    }
}

/// INVALID_OBJECT: an increment of an object that is not an 8-byte integer, or that would
/// overflow. It changes nothing.
fn step_invalid_object(
    values: &Values,
    state: &RegisterState,
    operation: &Operation,
    verdict: RulesVerdict,
) -> Option<RegisterState> {
    let Operation::Increment { delta, .. } = operation else { return None };
    if let RulesVerdict::Refuse(_) = verdict {
        return None;
    }
    let invalid = integer_value(values, state).and_then(|value| value.checked_add(*delta));
    invalid.is_none().then(|| state.clone())
}

/// Whether an outcome can belong to an operation at all (a read cannot be "written").
pub(crate) fn outcome_fits(operation: &Operation, outcome: &Outcome) -> bool {
    matches!(
        (operation, outcome),
        (_, Outcome::Unknown { .. })
            | (_, Outcome::Refused { .. })
            | (Operation::Read { .. }, Outcome::Read { .. })
            | (Operation::Write { .. }, Outcome::Written { .. })
            | (Operation::Remove { .. }, Outcome::Removed { .. })
            | (Operation::Increment { .. }, Outcome::Incremented { .. })
    )
}
