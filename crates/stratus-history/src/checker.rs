//! The per-key checker: direct checks of versions and visibility, then a bounded search for a
//! linearization (Wing and Gong's algorithm with Lowe's memoization, as in Porcupine).

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use bytes::Bytes;
use stratus_types::TableId;

use crate::history::{History, Operation, OperationRecord, Outcome};
use crate::model::{outcome_fits, step, RegisterState, Values};

/// Bounds on the checker's effort.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// Search steps allowed per key before the key is reported as too large to decide. Each
    /// step may remember one (linearized set, state) pair, so this also bounds memory: about
    /// (operations / 8 + 64) bytes per step.
    pub search_steps_max: u64,
    /// Sub-histories tried while shrinking a violation to its smallest failing set.
    pub shrink_attempts_max: u32,
    /// Search steps allowed per shrinking attempt (an attempt that runs out counts as "no
    /// longer failing", so shrinking never hides a violation, only keeps more operations).
    pub shrink_search_steps_max: u64,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            search_steps_max: 1_000_000,
            shrink_attempts_max: 400,
            shrink_search_steps_max: 200_000,
        }
    }
}

/// Why a key's history is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// An outcome that cannot belong to its operation (a read reported as written).
    Malformed {
        /// The operation.
        operation: OperationRecord,
    },
    /// Two acknowledged operations created the same version: versions are never reused.
    DuplicateVersion {
        /// The first creator.
        first: OperationRecord,
        /// The second creator.
        second: OperationRecord,
    },
    /// An operation that began after another completed created a smaller version.
    VersionsNotIncreasing {
        /// The operation that completed first.
        earlier: OperationRecord,
        /// The operation invoked after it, with a smaller version.
        later: OperationRecord,
    },
    /// A read began after an acknowledged write completed and saw an older version.
    StaleRead {
        /// The acknowledged write.
        write: OperationRecord,
        /// The read that missed it.
        read: OperationRecord,
    },
    /// A read began after an acknowledged write completed and found no object, and no remove
    /// can lie between them: the write was lost.
    LostWrite {
        /// The acknowledged write.
        write: OperationRecord,
        /// The read that found nothing.
        read: OperationRecord,
    },
    /// No order of the operations explains every outcome.
    NotLinearizable {
        /// The smallest failing sub-history found (its operations alone are not linearizable).
        operations: Vec<OperationRecord>,
        /// The operation the deepest search attempt could not place.
        stuck: OperationRecord,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Malformed { operation } => {
                write!(f, "outcome does not fit its operation:\n  {operation}")
            }
            Violation::DuplicateVersion { first, second } => {
                write!(f, "two operations created the same version:\n  {first}\n  {second}")
            }
            Violation::VersionsNotIncreasing { earlier, later } => write!(
                f,
                "an operation invoked after another completed created a smaller version:\n  \
                 {earlier}\n  {later}"
            ),
            Violation::StaleRead { write, read } => write!(
                f,
                "stale read: an acknowledged write completed before the read began, and the read \
                 saw an older version:\n  {write}\n  {read}"
            ),
            Violation::LostWrite { write, read } => write!(
                f,
                "lost acknowledged write: the read began after the write completed, found no \
                 object, and no remove can lie between them:\n  {write}\n  {read}"
            ),
            Violation::NotLinearizable { operations, stuck } => {
                writeln!(
                    f,
                    "not linearizable; these {} operations alone have no valid order \
                     (logical times [invoked, completed]):",
                    operations.len()
                )?;
                for operation in operations {
                    writeln!(f, "  {operation}")?;
                }
                write!(f, "the search could place every operation before this one:\n  {stuck}")
            }
        }
    }
}

/// The verdict for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Some order of the operations explains every outcome.
    Linearizable,
    /// The history is wrong.
    Violation(Box<Violation>),
    /// The search ran out of steps: undecided.
    TooLarge {
        /// Steps spent.
        steps: u64,
    },
}

/// The result for one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyReport {
    /// The table.
    pub table: TableId,
    /// The key.
    pub key: Bytes,
    /// Operations on the key (unknown reads included).
    pub operations: usize,
    /// Search steps spent.
    pub steps: u64,
    /// The verdict.
    pub verdict: Verdict,
}

/// The result for a whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// One report per key, ordered by table and key.
    pub keys: Vec<KeyReport>,
}

impl Report {
    /// True when every key is linearizable.
    pub fn is_linearizable(&self) -> bool {
        self.keys.iter().all(|key| key.verdict == Verdict::Linearizable)
    }

    /// Keys with a violation.
    pub fn violations(&self) -> impl Iterator<Item = &KeyReport> {
        self.keys.iter().filter(|key| matches!(key.verdict, Verdict::Violation(_)))
    }

    /// Keys the search could not decide within its bound.
    pub fn undecided(&self) -> impl Iterator<Item = &KeyReport> {
        self.keys.iter().filter(|key| matches!(key.verdict, Verdict::TooLarge { .. }))
    }

    /// Operations checked, over all keys.
    pub fn operations(&self) -> usize {
        self.keys.iter().map(|key| key.operations).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let undecided = self.undecided().count();
        let violations = self.violations().count();
        writeln!(
            f,
            "{} operations on {} keys: {} linearizable, {violations} violating, {undecided} \
             undecided",
            self.operations(),
            self.keys.len(),
            self.keys.len() - violations - undecided
        )?;
        for key in &self.keys {
            let name = key.key.escape_ascii();
            match &key.verdict {
                Verdict::Linearizable => {}
                Verdict::Violation(violation) => {
                    writeln!(f, "table {} key \"{name}\": {violation}", key.table.0)?
                }
                Verdict::TooLarge { steps } => writeln!(
                    f,
                    "table {} key \"{name}\": undecided, too large ({} operations, {steps} \
                     search steps)",
                    key.table.0, key.operations
                )?,
            }
        }
        Ok(())
    }
}

/// Checks every key of `history`.
pub fn check(history: &History, options: &CheckOptions) -> Report {
    let mut keys: BTreeMap<(TableId, Bytes), Vec<OperationRecord>> = BTreeMap::new();
    for operation in &history.operations {
        keys.entry((operation.table, operation.key.clone())).or_default().push(operation.clone());
    }
    let keys = keys
        .into_iter()
        .map(|((table, key), operations)| {
            let count = operations.len();
            let (verdict, steps) = check_key(&operations, options);
            KeyReport { table, key, operations: count, steps, verdict }
        })
        .collect();
    Report { keys }
}

/// Checks the operations of one key (which must all be on the same key of the same table);
/// returns the verdict and the search steps spent.
pub fn check_key(operations: &[OperationRecord], options: &CheckOptions) -> (Verdict, u64) {
    if let Some(first) = operations.first() {
        assert!(
            operations
                .iter()
                .all(|operation| operation.table == first.table && operation.key == first.key),
            "check_key takes the operations of one key"
        );
    }
    // A read with an unknown outcome constrains nothing.
    let operations: Vec<OperationRecord> = operations
        .iter()
        .filter(|operation| operation.operation.is_mutation() || !operation.outcome.is_unknown())
        .cloned()
        .collect();
    if let Some(violation) = direct_violation(&operations) {
        return (Verdict::Violation(Box::new(violation)), 0);
    }
    match search(&operations, options.search_steps_max) {
        Search::Linearizable { steps } => (Verdict::Linearizable, steps),
        Search::TooLarge { steps } => (Verdict::TooLarge { steps }, steps),
        Search::NotLinearizable { steps, stuck } => {
            let minimal = shrink(operations, options);
            let stuck = minimal_stuck(&minimal, options).unwrap_or(stuck);
            let violation = Violation::NotLinearizable { operations: minimal, stuck };
            (Verdict::Violation(Box::new(violation)), steps)
        }
    }
}

/// The operation the search of an already-failing `operations` gets stuck on.
fn minimal_stuck(
    operations: &[OperationRecord],
    options: &CheckOptions,
) -> Option<OperationRecord> {
    match search(operations, options.shrink_search_steps_max) {
        Search::NotLinearizable { stuck, .. } => Some(stuck),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Direct checks: cheap, and their failures are easy to read.

fn direct_violation(operations: &[OperationRecord]) -> Option<Violation> {
    if let Some(operation) =
        operations.iter().find(|operation| !outcome_fits(&operation.operation, &operation.outcome))
    {
        return Some(Violation::Malformed { operation: operation.clone() });
    }
    let mut creators: Vec<&OperationRecord> = operations
        .iter()
        .filter(|operation| operation.outcome.created_version().is_some())
        .collect();
    creators.sort_by_key(|operation| operation.outcome.created_version());
    for pair in creators.windows(2) {
        if pair[0].outcome.created_version() == pair[1].outcome.created_version() {
            return Some(Violation::DuplicateVersion {
                first: pair[0].clone(),
                second: pair[1].clone(),
            });
        }
    }
    versions_not_increasing(&creators).or_else(|| invisible_write(operations, &creators))
}

/// For each operation in `later` (sorted by invocation), the operation of `creators` with the
/// largest created version among those completed before it was invoked.
fn latest_completed_before<'a>(
    creators: &[&'a OperationRecord],
    later: &[&'a OperationRecord],
) -> Vec<Option<&'a OperationRecord>> {
    let mut by_completion: Vec<&OperationRecord> = creators.to_vec();
    by_completion.sort_by_key(|operation| operation.completed);
    let mut next = 0;
    let mut latest: Option<&OperationRecord> = None;
    let mut result = Vec::with_capacity(later.len());
    for operation in later {
        while next < by_completion.len() && by_completion[next].completed < operation.invoked {
            let candidate = by_completion[next];
            if latest.is_none_or(|best| {
                candidate.outcome.created_version() > best.outcome.created_version()
            }) {
                latest = Some(candidate);
            }
            next += 1;
        }
        result.push(latest);
    }
    result
}

fn versions_not_increasing(creators: &[&OperationRecord]) -> Option<Violation> {
    let mut by_invocation = creators.to_vec();
    by_invocation.sort_by_key(|operation| operation.invoked);
    let latest = latest_completed_before(creators, &by_invocation);
    by_invocation.iter().zip(latest).find_map(|(later, earlier)| {
        let earlier = earlier?;
        (earlier.outcome.created_version() > later.outcome.created_version()).then(|| {
            Violation::VersionsNotIncreasing { earlier: earlier.clone(), later: (*later).clone() }
        })
    })
}

/// "Every acknowledged write is visible afterwards": an outcome that observes the version must
/// not observe one older than an acknowledged write completed before it began.
fn invisible_write(
    operations: &[OperationRecord],
    creators: &[&OperationRecord],
) -> Option<Violation> {
    let mut observers: Vec<&OperationRecord> = operations
        .iter()
        .filter(|operation| operation.outcome.observed_version().is_some())
        .collect();
    observers.sort_by_key(|operation| operation.invoked);
    let latest = latest_completed_before(creators, &observers);
    for (read, write) in observers.iter().zip(latest) {
        let Some(write) = write else { continue };
        let observed = read.outcome.observed_version().expect("filtered on observed versions");
        if observed >= write.outcome.created_version().expect("a creator") {
            continue;
        }
        if observed.0 != 0 {
            return Some(Violation::StaleRead { write: write.clone(), read: (*read).clone() });
        }
        // Missing is fine if a remove may have taken effect after the write and before the
        // read completed.
        let remove_between = operations.iter().any(|remove| {
            matches!(remove.operation, Operation::Remove { .. })
                && matches!(remove.outcome, Outcome::Removed { .. } | Outcome::Unknown { .. })
                && remove.invoked < read.completed
                && remove.effect_deadline() > write.invoked
        });
        if !remove_between {
            return Some(Violation::LostWrite { write: write.clone(), read: (*read).clone() });
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The search.

enum Search {
    Linearizable { steps: u64 },
    NotLinearizable { steps: u64, stuck: OperationRecord },
    TooLarge { steps: u64 },
}

/// No node: the end of the event list.
const NONE: usize = usize::MAX;

/// The call and return events of every operation in a doubly linked list ordered by time, from
/// which operations are lifted as they are linearized and put back on backtracking (in LIFO
/// order, which is what makes putting back exact).
struct EventList {
    next: Vec<usize>,
    previous: Vec<usize>,
    /// For a node, its operation's index; calls are nodes `2i`, returns `2i + 1`.
    head: usize,
}

impl EventList {
    fn new(operations: &[OperationRecord]) -> EventList {
        let count = operations.len();
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * count);
        for (index, operation) in operations.iter().enumerate() {
            // At equal times a call sorts before a return: such operations count as concurrent.
            events.push((operation.invoked, 0, 2 * index));
            events.push((operation.effect_deadline(), 1, 2 * index + 1));
        }
        events.sort_unstable();
        let head = 2 * count;
        let mut next = vec![NONE; 2 * count + 1];
        let mut previous = vec![NONE; 2 * count + 1];
        let mut last = head;
        for &(_, _, node) in &events {
            next[last] = node;
            previous[node] = last;
            last = node;
        }
        EventList { next, previous, head }
    }

    fn first(&self) -> usize {
        self.next[self.head]
    }

    fn unlink(&mut self, node: usize) {
        let (previous, next) = (self.previous[node], self.next[node]);
        self.next[previous] = next;
        if next != NONE {
            self.previous[next] = previous;
        }
    }

    fn relink(&mut self, node: usize) {
        let (previous, next) = (self.previous[node], self.next[node]);
        self.next[previous] = node;
        if next != NONE {
            self.previous[next] = node;
        }
    }

    /// Removes an operation's call and return.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(call + 1);
    }

    /// Undoes the latest `lift`, which must have been of `call`.
    fn unlift(&mut self, call: usize) {
        self.relink(call + 1);
        self.relink(call);
    }
}

/// A set of operation indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct OperationSet(Vec<u64>);

impl OperationSet {
    fn new(count: usize) -> OperationSet {
        OperationSet(vec![0; count.div_ceil(64)])
    }
    fn insert(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }
    fn remove(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
}

/// A linearized operation, with what is needed to undo it.
struct Frame {
    call: usize,
    state_before: RegisterState,
    /// The next candidate state of this operation to try after backtracking.
    next_candidate: usize,
}

/// Searches for a linearization of `operations` (one key), starting from a missing object.
///
/// Pruning: an operation that created a known version must be linearized after every one that
/// created a smaller known version (Stratus's versions increase), so among those only the one
/// with the next version rank is ever tried. Memoization: a (linearized set, state) pair seen
/// before leads nowhere new.
fn search(operations: &[OperationRecord], steps_max: u64) -> Search {
    let count = operations.len();
    let mut ranks: Vec<Option<usize>> = vec![None; count];
    let mut creators: Vec<usize> =
        (0..count).filter(|&index| operations[index].outcome.created_version().is_some()).collect();
    creators.sort_by_key(|&index| operations[index].outcome.created_version());
    for (rank, &index) in creators.iter().enumerate() {
        ranks[index] = Some(rank);
    }

    let mut values = Values::default();
    let mut events = EventList::new(operations);
    let mut linearized = OperationSet::new(count);
    let mut seen: HashSet<(OperationSet, RegisterState)> = HashSet::new();
    let mut stack: Vec<Frame> = Vec::with_capacity(count);
    let mut state = RegisterState::missing();
    let mut ranked_linearized = 0usize;
    let mut node = events.first();
    let mut first_candidate = 0usize;
    let mut deepest = 0usize;
    let mut stuck = None;
    let mut steps = 0u64;
    loop {
        if events.first() == NONE {
            return Search::Linearizable { steps };
        }
        steps += 1;
        if steps > steps_max {
            return Search::TooLarge { steps };
        }
        assert!(node != NONE, "a pending call always has its return later in the list");
        let index = node / 2;
        if node.is_multiple_of(2) {
            let mut lifted = false;
            if ranks[index].is_none_or(|rank| rank == ranked_linearized) {
                let candidates = step(&mut values, &state, &operations[index]);
                for (candidate_index, candidate) in candidates.into_iter().enumerate() {
                    let Some(candidate) = candidate.filter(|_| candidate_index >= first_candidate)
                    else {
                        continue;
                    };
                    linearized.insert(index);
                    if seen.insert((linearized.clone(), candidate.clone())) {
                        let state_before = std::mem::replace(&mut state, candidate);
                        stack.push(Frame {
                            call: node,
                            state_before,
                            next_candidate: candidate_index + 1,
                        });
                        ranked_linearized += usize::from(ranks[index].is_some());
                        events.lift(node);
                        lifted = true;
                        break;
                    }
                    linearized.remove(index);
                }
            }
            first_candidate = 0;
            node = if lifted { events.first() } else { events.next[node] };
        } else {
            // The return of an operation not yet linearized: every order tried from here
            // leaves it out, so undo the latest choice.
            if stack.len() >= deepest {
                deepest = stack.len();
                stuck = Some(index);
            }
            let Some(frame) = stack.pop() else {
                let stuck = operations[stuck.unwrap_or(index)].clone();
                return Search::NotLinearizable { steps, stuck };
            };
            let undone = frame.call / 2;
            linearized.remove(undone);
            ranked_linearized -= usize::from(ranks[undone].is_some());
            state = frame.state_before;
            events.unlift(frame.call);
            node = frame.call;
            first_candidate = frame.next_candidate;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Shrinking a violation.

/// Outcomes that nothing remaining can explain: observed versions that no remaining known write
/// created (unless an unknown mutation remains, which could have), and increments whose result
/// starts from a value no remaining operation produced. Shrinking must not create these, or it
/// would turn any violation into "a read of a value never written" or "an increment of nothing"
/// (one increment left alone always fails, whatever the real fault was).
fn unexplained_observations(operations: &[OperationRecord]) -> usize {
    unexplained_versions(operations) + unexplained_increments(operations)
}

/// Increments whose starting value (result minus delta) is neither 0 (a missing object) nor a
/// value some remaining operation wrote or produced.
fn unexplained_increments(operations: &[OperationRecord]) -> usize {
    let produced: HashSet<i64> = operations
        .iter()
        .filter_map(|operation| match (&operation.operation, &operation.outcome) {
            (_, Outcome::Incremented { value, .. }) => Some(*value),
            (Operation::Write { value, .. }, _) => {
                <[u8; 8]>::try_from(&value[..]).ok().map(i64::from_le_bytes)
            }
            _ => None,
        })
        .collect();
    operations
        .iter()
        .filter(|operation| match (&operation.operation, &operation.outcome) {
            (Operation::Increment { delta, .. }, Outcome::Incremented { value, .. }) => {
                let start = value.wrapping_sub(*delta);
                start != 0 && !produced.contains(&start)
            }
            _ => false,
        })
        .count()
}

fn unexplained_versions(operations: &[OperationRecord]) -> usize {
    let any_unknown_mutation = operations
        .iter()
        .any(|operation| operation.operation.is_mutation() && operation.outcome.is_unknown());
    if any_unknown_mutation {
        return 0;
    }
    let created: HashSet<u64> = operations
        .iter()
        .filter_map(|operation| operation.outcome.created_version().map(|version| version.0))
        .collect();
    operations
        .iter()
        .filter_map(|operation| match operation.outcome {
            Outcome::Read { version, .. } | Outcome::Removed { version } => Some(version.0),
            _ => operation.outcome.observed_version().map(|version| version.0),
        })
        .filter(|version| *version != 0 && !created.contains(version))
        .count()
}

/// Removes operations (halves, then quarters, ... then single ones) while what is left still
/// fails on its own, within the attempt bound.
fn shrink(mut operations: Vec<OperationRecord>, options: &CheckOptions) -> Vec<OperationRecord> {
    let unexplained = unexplained_observations(&operations);
    let mut attempts = 0u32;
    let mut chunk = operations.len().div_ceil(2).max(1);
    loop {
        let mut start = 0;
        while start < operations.len() && attempts < options.shrink_attempts_max {
            let end = (start + chunk).min(operations.len());
            let mut candidate = operations.clone();
            candidate.drain(start..end);
            attempts += 1;
            let still_fails = !candidate.is_empty()
                && unexplained_observations(&candidate) <= unexplained
                && (direct_violation(&candidate).is_some()
                    || matches!(
                        search(&candidate, options.shrink_search_steps_max),
                        Search::NotLinearizable { .. }
                    ));
            if still_fails {
                operations = candidate;
            } else {
                start = end;
            }
        }
        if chunk == 1 || attempts >= options.shrink_attempts_max {
            return operations;
        }
        chunk = chunk.div_ceil(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stratus_client::Status;
    use stratus_types::{RejectRules, Version};

    fn read_at(invoked: u64, completed: u64) -> OperationRecord {
        OperationRecord {
            id: invoked,
            client: 0,
            table: TableId(1),
            key: Bytes::from_static(b"k"),
            operation: Operation::Read { rules: RejectRules::NONE },
            invoked,
            completed,
            outcome: Outcome::Refused { status: Status::ObjectDoesntExist, version: Version(0) },
        }
    }

    fn walk(events: &EventList) -> Vec<usize> {
        let mut nodes = Vec::new();
        let mut node = events.first();
        while node != NONE {
            nodes.push(node);
            node = events.next[node];
        }
        nodes
    }

    #[test]
    fn event_list_orders_by_time_and_lift_is_undone_exactly() {
        // Operation 0 spans [1, 6], operation 1 spans [2, 3], operation 2 spans [4, 5].
        let operations = [read_at(1, 6), read_at(2, 3), read_at(4, 5)];
        let mut events = EventList::new(&operations);
        let original = walk(&events);
        assert_eq!(original, vec![0, 2, 3, 4, 5, 1]);
        events.lift(2);
        assert_eq!(walk(&events), vec![0, 4, 5, 1]);
        events.lift(0);
        assert_eq!(walk(&events), vec![4, 5]);
        events.unlift(0);
        events.unlift(2);
        assert_eq!(walk(&events), original);
    }

    #[test]
    fn an_unknown_outcome_may_take_effect_after_every_completion() {
        let mut late = read_at(1, 2);
        late.operation = Operation::Remove { rules: RejectRules::NONE };
        late.outcome = Outcome::Unknown { status: Status::Timeout };
        assert_eq!(late.effect_deadline(), u64::MAX);
        let events = EventList::new(&[late, read_at(3, 4)]);
        assert_eq!(walk(&events), vec![0, 2, 3, 1], "its return sorts last");
    }

    fn record(
        id: u64,
        (invoked, completed): (u64, u64),
        operation: Operation,
        outcome: Outcome,
    ) -> OperationRecord {
        OperationRecord {
            id,
            client: id as u32,
            table: TableId(1),
            key: Bytes::from_static(b"k"),
            operation,
            invoked,
            completed,
            outcome,
        }
    }

    fn increment(delta: i64) -> Operation {
        Operation::Increment { delta, rules: RejectRules::NONE }
    }

    /// The shape the simulation found (seed 20429): an increment with an unknown outcome is
    /// read, then lost (a later increment starts from nothing at a lower version). Later,
    /// unrelated operations must not be what shrinking reports: an increment left alone fails
    /// only because its predecessors were removed.
    #[test]
    fn shrinking_keeps_what_an_increment_starts_from() {
        let operations = vec![
            record(1, (1, 2), increment(-7), Outcome::Unknown { status: Status::Timeout }),
            record(
                3,
                (3, 4),
                Operation::Read { rules: RejectRules::NONE },
                Outcome::Read {
                    value: Bytes::copy_from_slice(&(-7i64).to_le_bytes()),
                    version: Version(40),
                },
            ),
            record(
                5,
                (5, 6),
                increment(-2),
                Outcome::Incremented { value: -2, version: Version(41) },
            ),
            record(
                7,
                (7, 8),
                Operation::Write {
                    value: Bytes::copy_from_slice(&100i64.to_le_bytes()),
                    rules: RejectRules::NONE,
                },
                Outcome::Written { version: Version(42) },
            ),
            record(
                9,
                (9, 10),
                increment(1),
                Outcome::Incremented { value: 101, version: Version(43) },
            ),
            record(
                11,
                (11, 12),
                increment(1),
                Outcome::Incremented { value: 102, version: Version(44) },
            ),
            record(
                13,
                (13, 14),
                increment(1),
                Outcome::Incremented { value: 103, version: Version(45) },
            ),
            record(
                15,
                (15, 16),
                increment(1),
                Outcome::Incremented { value: 104, version: Version(46) },
            ),
        ];
        let (verdict, _) = check_key(&operations, &CheckOptions::default());
        let Verdict::Violation(violation) = verdict else { panic!("{verdict:?}") };
        let Violation::NotLinearizable { operations: minimal, .. } = *violation else {
            panic!("{violation:?}")
        };
        let ids: Vec<u64> = minimal.iter().map(|operation| operation.id).collect();
        assert!(ids.contains(&3) && ids.contains(&5), "the read and the lost increment: {ids:?}");
        assert!(ids.iter().all(|&id| id < 9), "a tail of increments is not the fault: {ids:?}");
    }
}
