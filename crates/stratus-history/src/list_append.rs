//! A checker of list-append histories for the anomalies strict serializability forbids, in
//! the manner of Elle (Kingsbury and Alvaro, "Elle: Inferring Isolation Anomalies from
//! Experimental Observations", VLDB 2020).
//!
//! Each key holds a list of u64 elements; a transaction appends elements (unique per key)
//! and reads whole lists. Because a list shows every append made to it, in order, a read
//! reveals the whole version history of its key up to that point, so the checker can infer
//! the order of every transaction's writes and the dependencies between transactions from
//! the observations alone, without a search over orders:
//!
//! 1. **Per read** (committed transactions only: others' observations are not trusted):
//!    duplicate elements, elements nobody appended (garbage), elements of aborted
//!    transactions (G1a, aborted read), a read ending in an append its writer followed with
//!    another append to the key (G1b, intermediate read), and a read that disagrees with the
//!    transaction's own earlier reads and appends (internal inconsistency).
//! 2. **Per key**: every committed read must be a prefix of one order (the longest read);
//!    a read that is not is an incompatible order. That order is the key's version order.
//! 3. **Direct checks**: two committed transactions that read the same state of a key and
//!    both appended to it (lost update); a committed append missing from a read that began
//!    after it committed (stale read, or lost append when no read ever shows it).
//! 4. **The dependency graph** over committed transactions, and the transactions of unknown
//!    outcome whose appends some committed read shows (they took effect, so they committed):
//!    ww (a's append directly precedes b's in a key's order), wr (b read a list whose last
//!    element a appended), rw (a read a state of a key that b's append is the next change
//!    of), and real-time edges (a completed before b was invoked). Cycles are found per
//!    strongly connected component (Tarjan's algorithm, iterative) and named by the weakest
//!    edges they need: G0 (ww only), G1c (ww and wr), G-single (exactly one rw), G2 (two or
//!    more rw; a cycle of two transactions each missing the other's append is reported as
//!    write skew too), and real-time when only real-time edges close the cycle (a
//!    serializable history that is not strictly serializable).
//!
//! Transactions of unknown outcome whose appends nobody saw may or may not have happened and
//! are left out of the graph; aborted ones are left out too (G1a covers them being seen).
//!
//! Bounds: the work is linear in the size of the history (the sum of the lengths of the
//! reads) plus the real-time edges, which are built from a frontier (each transaction is
//! linked from the transactions that completed before it began and are not already ordered
//! before another such one: at most the number of transactions running at once), not from
//! every earlier one. The cycle searches are breadth-first searches confined to one
//! component: one per component and kind of anomaly is always made, further attempts only
//! within [`CheckLimits::cycle_search_steps_max`]. Examples are kept up to
//! [`CheckLimits::examples_per_kind`] per kind; the counts go on. The result depends only on
//! the history (maps that are iterated are ordered).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

/// A list's bytes as the list-append workloads store it in one object: its elements, 8 bytes
/// little-endian each (an absent object is the empty list).
pub fn encode_list(list: &[u64]) -> Vec<u8> {
    list.iter().flat_map(|element| element.to_le_bytes()).collect()
}

/// A list from its object's bytes; `None` for a length that is not a whole number of
/// elements.
pub fn decode_list(value: &[u8]) -> Option<Vec<u64>> {
    let chunks = value.chunks_exact(8);
    if !chunks.remainder().is_empty() {
        return None;
    }
    chunks.map(|chunk| chunk.try_into().ok().map(u64::from_le_bytes)).collect()
}

/// One operation inside a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MicroOp {
    /// Append `element` to the list at `key`. Elements are unique per key across the history.
    Append {
        /// The list.
        key: u64,
        /// The element appended.
        element: u64,
    },
    /// Read the list at `key` (an absent list reads as empty).
    Read {
        /// The list.
        key: u64,
        /// What the read returned: required for committed transactions, ignored for the
        /// others (a transaction that did not commit may have read a state that never was).
        observed: Option<Vec<u64>>,
    },
}

impl MicroOp {
    /// The key the operation touches.
    pub fn key(&self) -> u64 {
        match self {
            MicroOp::Append { key, .. } | MicroOp::Read { key, .. } => *key,
        }
    }
}

/// How a transaction ended, as its client learnt it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TransactionOutcome {
    /// Committed: every operation took effect, at one point between invocation and
    /// completion.
    Committed,
    /// Definitely not applied, ever.
    Aborted,
    /// May or may not have taken effect (a commit that timed out or failed ambiguously); if it
    /// did, it did at one point after its invocation.
    Unknown,
}

/// One transaction of a list-append history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transaction {
    /// The client (process) that ran it.
    pub process: u64,
    /// When it was invoked, on a clock shared by every process (logical or monotonic).
    pub invoked_at: u64,
    /// When its outcome was returned; `None` when the outcome is unknown (an indeterminate
    /// transaction may take effect at any later time). Required for committed transactions.
    pub completed_at: Option<u64>,
    /// How it ended.
    pub outcome: TransactionOutcome,
    /// Its operations, in the order it issued them.
    pub ops: Vec<MicroOp>,
}

/// A list-append history: transactions in any order (they are identified by their index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListAppendHistory {
    /// The transactions.
    pub transactions: Vec<Transaction>,
}

impl ListAppendHistory {
    /// Adds a transaction; returns its index.
    pub fn push(&mut self, transaction: Transaction) -> usize {
        self.transactions.push(transaction);
        self.transactions.len() - 1
    }
}

/// Bounds on the checker's effort and output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckLimits {
    /// Examples kept per kind of anomaly (every instance is still counted).
    pub examples_per_kind: usize,
    /// Edges the cycle searches may visit beyond the one search per component and kind that
    /// is always made (searches for further kinds in a component that already showed one).
    pub cycle_search_steps_max: u64,
    /// Edges inferred per key from reads of a key's whole known order to appends no read
    /// shows (a product that only a badly broken history makes large); past it the
    /// remaining ones are left out and the report says so.
    pub unobserved_edges_per_key_max: usize,
}

impl Default for CheckLimits {
    fn default() -> CheckLimits {
        CheckLimits {
            examples_per_kind: 8,
            cycle_search_steps_max: 20_000_000,
            unobserved_edges_per_key_max: 1 << 20,
        }
    }
}

/// A history the checker cannot judge: the recording, not the database, is at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HistoryError {
    /// More transactions than the checker indexes (u32).
    TooManyTransactions {
        /// How many there are.
        transactions: usize,
    },
    /// The same element was appended to a key twice (elements must be unique per key).
    DuplicateAppend {
        /// The key.
        key: u64,
        /// The element.
        element: u64,
        /// The transactions that appended it (they may be the same one).
        transactions: (usize, usize),
    },
    /// A committed transaction's read has no observation.
    CommittedReadUnobserved {
        /// The transaction.
        transaction: usize,
        /// The key read.
        key: u64,
    },
    /// A committed transaction has no completion time.
    CommittedWithoutCompletion {
        /// The transaction.
        transaction: usize,
    },
    /// A transaction completed before it was invoked.
    CompletedBeforeInvoked {
        /// The transaction.
        transaction: usize,
    },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::TooManyTransactions { transactions } => {
                write!(f, "{transactions} transactions: at most {} can be checked", u32::MAX)
            }
            HistoryError::DuplicateAppend { key, element, transactions } => write!(
                f,
                "element {element} appended to key {key} twice (transactions {} and {}): \
                 elements must be unique per key",
                transactions.0, transactions.1
            ),
            HistoryError::CommittedReadUnobserved { transaction, key } => write!(
                f,
                "transaction {transaction} committed but its read of key {key} has no \
                 observation"
            ),
            HistoryError::CommittedWithoutCompletion { transaction } => {
                write!(f, "transaction {transaction} committed but has no completion time")
            }
            HistoryError::CompletedBeforeInvoked { transaction } => {
                write!(f, "transaction {transaction} completed before it was invoked")
            }
        }
    }
}

impl std::error::Error for HistoryError {}

/// The kinds of anomaly the checker reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AnomalyKind {
    /// Two committed reads of a key, neither a prefix of the other: no single order of
    /// appends explains both.
    IncompatibleOrder,
    /// A committed read shows an element twice.
    DuplicateElements,
    /// A committed read shows an element no transaction appended.
    GarbageRead,
    /// A committed read disagrees with its own transaction's earlier reads and appends of
    /// the key (a transaction must see its own writes and a stable snapshot).
    InternalInconsistency,
    /// G1a: a committed read shows an element of an aborted transaction.
    AbortedRead,
    /// G1b: a committed read ends in an append that its writer followed with another append
    /// to the same key (a state in the middle of a transaction).
    IntermediateRead,
    /// Two committed transactions read the same state of a key and both appended to it: one
    /// overwrote the other's effect (a G-single or G2 on one key).
    LostUpdate,
    /// A committed read missed an append that committed before the read began and that
    /// other reads show (a real-time violation on one key).
    StaleRead,
    /// A committed append that no read shows, although some read began after it committed.
    LostAppend,
    /// A cycle of write-write dependencies.
    G0,
    /// A cycle of write-write and write-read dependencies, at least one write-read.
    G1c,
    /// A cycle with exactly one read-write anti-dependency.
    GSingle,
    /// A cycle with two or more read-write anti-dependencies.
    G2,
    /// Two transactions each of which read a state missing the other's append (a G2 cycle of
    /// two anti-dependencies).
    WriteSkew,
    /// A cycle that only real-time edges close: serializable, perhaps, but not strictly.
    RealTime,
}

impl AnomalyKind {
    /// A short description for reports.
    pub fn description(self) -> &'static str {
        match self {
            AnomalyKind::IncompatibleOrder => "incompatible order",
            AnomalyKind::DuplicateElements => "duplicate elements",
            AnomalyKind::GarbageRead => "garbage read",
            AnomalyKind::InternalInconsistency => "internal inconsistency",
            AnomalyKind::AbortedRead => "G1a aborted read",
            AnomalyKind::IntermediateRead => "G1b intermediate read",
            AnomalyKind::LostUpdate => "lost update",
            AnomalyKind::StaleRead => "stale read (real-time)",
            AnomalyKind::LostAppend => "lost append",
            AnomalyKind::G0 => "G0 write cycle",
            AnomalyKind::G1c => "G1c circular information flow",
            AnomalyKind::GSingle => "G-single read skew",
            AnomalyKind::G2 => "G2 anti-dependency cycle",
            AnomalyKind::WriteSkew => "write skew",
            AnomalyKind::RealTime => "strict-serializability (real-time) violation",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

/// Why one transaction must precede another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dependency {
    /// ww: the first's append directly precedes the second's in a key's order.
    WriteWrite,
    /// wr: the second read a list whose last element the first appended.
    WriteRead,
    /// rw: the first read a state of a key that the second's append changed next.
    ReadWrite,
    /// The first completed before the second was invoked.
    RealTime,
}

impl Dependency {
    /// The dependency's bit in an edge's set of kinds; the order of the bits is the order
    /// of strength (the weakest, lowest bit names the edge in a cycle).
    fn bit(self) -> u8 {
        match self {
            Dependency::WriteWrite => WW,
            Dependency::WriteRead => WR,
            Dependency::ReadWrite => RW,
            Dependency::RealTime => RT,
        }
    }

    /// The weakest dependency in a non-empty set of kinds.
    fn weakest(kinds: u8) -> Dependency {
        if kinds & WW != 0 {
            Dependency::WriteWrite
        } else if kinds & WR != 0 {
            Dependency::WriteRead
        } else if kinds & RW != 0 {
            Dependency::ReadWrite
        } else {
            Dependency::RealTime
        }
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dependency::WriteWrite => "ww",
            Dependency::WriteRead => "wr",
            Dependency::ReadWrite => "rw",
            Dependency::RealTime => "rt",
        })
    }
}

const WW: u8 = 1;
const WR: u8 = 2;
const RW: u8 = 4;
const RT: u8 = 8;
/// The edges of each level of the graph: ww; ww and wr; every data dependency; all.
const LEVEL_WW: u8 = WW;
const LEVEL_WW_WR: u8 = WW | WR;
const LEVEL_DATA: u8 = WW | WR | RW;
const LEVEL_ALL: u8 = WW | WR | RW | RT;

/// One edge of a cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CycleStep {
    /// The transaction that must come first (its index in the history).
    pub from: usize,
    /// The transaction that must come after it.
    pub to: usize,
    /// The weakest reason it must.
    pub dependency: Dependency,
    /// The key of that dependency (none for real time).
    pub key: Option<u64>,
}

/// One anomaly found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Anomaly {
    /// What kind.
    pub kind: AnomalyKind,
    /// The transactions involved (indices in the history).
    pub transactions: Vec<usize>,
    /// The key, when one key shows it.
    pub key: Option<u64>,
    /// For a cycle: its edges, in order (the last leads back to the first's `from`).
    pub cycle: Vec<CycleStep>,
    /// What was seen, in words.
    pub detail: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.detail)?;
        if let Some(first) = self.cycle.first() {
            write!(f, " [T{}", first.from)?;
            for step in &self.cycle {
                match step.key {
                    Some(key) => write!(f, " -{}({key})-> T{}", step.dependency, step.to)?,
                    None => write!(f, " -{}-> T{}", step.dependency, step.to)?,
                }
            }
            write!(f, "]")?;
        }
        Ok(())
    }
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListAppendReport {
    /// Transactions in the history.
    pub transactions: usize,
    /// Keys touched.
    pub keys: usize,
    /// Reads of committed transactions checked.
    pub committed_reads_checked: usize,
    /// Transactions in the dependency graph (committed, and unknown ones seen to take effect).
    pub graph_transactions: usize,
    /// Edges of the graph (pairs of transactions; an edge may have several kinds).
    pub graph_edges: usize,
    /// Instances found per kind (cycles: components showing the kind).
    pub counts: BTreeMap<AnomalyKind, u64>,
    /// Examples, at most [`CheckLimits::examples_per_kind`] per kind, in the order found.
    pub anomalies: Vec<Anomaly>,
    /// Whether some inference or search was cut short by a [`CheckLimits`] bound (the
    /// anomalies reported are real; some more may have gone unreported).
    pub truncated: bool,
}

impl ListAppendReport {
    /// Whether the history shows no anomaly.
    pub fn is_valid(&self) -> bool {
        self.counts.values().all(|&count| count == 0)
    }

    /// Instances of `kind` found.
    pub fn count(&self, kind: AnomalyKind) -> u64 {
        self.counts.get(&kind).copied().unwrap_or(0)
    }

    fn record(
        &mut self,
        kind: AnomalyKind,
        limits: &CheckLimits,
        anomaly: impl FnOnce() -> Anomaly,
    ) {
        let count = self.counts.entry(kind).or_insert(0);
        *count += 1;
        if *count as usize <= limits.examples_per_kind {
            self.anomalies.push(anomaly());
        }
    }
}

impl fmt::Display for ListAppendReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} transactions, {} keys, {} committed reads checked, graph of {} transactions and \
             {} edges",
            self.transactions,
            self.keys,
            self.committed_reads_checked,
            self.graph_transactions,
            self.graph_edges
        )?;
        if self.truncated {
            write!(f, " (some inference or search cut short by its bound)")?;
        }
        if self.is_valid() {
            return write!(f, ": no anomaly");
        }
        for (kind, count) in self.counts.iter().filter(|(_, count)| **count > 0) {
            write!(f, "\n  {kind}: {count}")?;
        }
        for anomaly in &self.anomalies {
            write!(f, "\n  - {anomaly}")?;
        }
        Ok(())
    }
}

/// Who appended an element to a key.
#[derive(Clone, Copy, Debug)]
struct Writer {
    transaction: u32,
    /// Whether it is its transaction's last append to the key.
    last_in_transaction: bool,
}

/// A read of a committed transaction.
#[derive(Clone, Copy, Debug)]
struct ReadRef {
    transaction: u32,
    op: u32,
}

/// A key's version order, as the reads show it.
#[derive(Debug, Default)]
struct KeyOrder {
    /// The longest committed read (the first of the longest, in history order).
    order: Vec<u64>,
    /// Position of each element of `order` (its first occurrence).
    position: HashMap<u64, usize>,
    /// Length of the longest prefix of `order` free of duplicates.
    distinct_prefix: usize,
}

/// Checks a list-append history (see the module documentation).
pub fn check_list_append(
    history: &ListAppendHistory,
    limits: &CheckLimits,
) -> Result<ListAppendReport, HistoryError> {
    let transactions = &history.transactions;
    if u32::try_from(transactions.len()).is_err() {
        return Err(HistoryError::TooManyTransactions { transactions: transactions.len() });
    }
    let mut report = ListAppendReport { transactions: transactions.len(), ..Default::default() };

    // Who appended what, and each committed transaction's reads, by key.
    let mut writers: HashMap<(u64, u64), Writer> = HashMap::new();
    let mut appends_by_key: BTreeMap<u64, Vec<(u64, u32)>> = BTreeMap::new();
    let mut reads_by_key: BTreeMap<u64, Vec<ReadRef>> = BTreeMap::new();
    for (index, transaction) in transactions.iter().enumerate() {
        let id = index as u32;
        match (transaction.outcome, transaction.completed_at) {
            (TransactionOutcome::Committed, None) => {
                return Err(HistoryError::CommittedWithoutCompletion { transaction: index });
            }
            (_, Some(completed)) if completed < transaction.invoked_at => {
                return Err(HistoryError::CompletedBeforeInvoked { transaction: index });
            }
            _ => {}
        }
        let mut last_append: BTreeMap<u64, u64> = BTreeMap::new();
        for (op_index, op) in transaction.ops.iter().enumerate() {
            match op {
                MicroOp::Append { key, element } => {
                    let writer = Writer { transaction: id, last_in_transaction: false };
                    if let Some(first) = writers.insert((*key, *element), writer) {
                        return Err(HistoryError::DuplicateAppend {
                            key: *key,
                            element: *element,
                            transactions: (first.transaction as usize, index),
                        });
                    }
                    appends_by_key.entry(*key).or_default().push((*element, id));
                    last_append.insert(*key, *element);
                }
                MicroOp::Read { key, observed } => {
                    if transaction.outcome == TransactionOutcome::Committed {
                        if observed.is_none() {
                            return Err(HistoryError::CommittedReadUnobserved {
                                transaction: index,
                                key: *key,
                            });
                        }
                        reads_by_key
                            .entry(*key)
                            .or_default()
                            .push(ReadRef { transaction: id, op: op_index as u32 });
                    } else {
                        reads_by_key.entry(*key).or_default();
                    }
                }
            }
        }
        for (key, element) in last_append {
            if let Some(writer) = writers.get_mut(&(key, element)) {
                writer.last_in_transaction = true;
            }
        }
    }
    let keys: BTreeSet<u64> = appends_by_key.keys().chain(reads_by_key.keys()).copied().collect();
    report.keys = keys.len();
    let observed_of = |read: &ReadRef| -> &[u64] {
        match &transactions[read.transaction as usize].ops[read.op as usize] {
            MicroOp::Read { observed: Some(observed), .. } => observed,
            _ => &[],
        }
    };

    // 1. Per read: garbage, aborted and intermediate reads; which unknown transactions were
    // seen to take effect.
    let mut seen_to_commit = vec![false; transactions.len()];
    for (&key, reads) in &reads_by_key {
        for read in reads {
            report.committed_reads_checked += 1;
            let observed = observed_of(read);
            for &element in observed {
                let Some(writer) = writers.get(&(key, element)) else {
                    report.record(AnomalyKind::GarbageRead, limits, || Anomaly {
                        kind: AnomalyKind::GarbageRead,
                        transactions: vec![read.transaction as usize],
                        key: Some(key),
                        cycle: Vec::new(),
                        detail: format!(
                            "T{} read key {key} as {}: nobody appended {element}",
                            read.transaction,
                            abbreviated(observed)
                        ),
                    });
                    continue;
                };
                match transactions[writer.transaction as usize].outcome {
                    TransactionOutcome::Aborted => {
                        report.record(AnomalyKind::AbortedRead, limits, || Anomaly {
                            kind: AnomalyKind::AbortedRead,
                            transactions: vec![
                                writer.transaction as usize,
                                read.transaction as usize,
                            ],
                            key: Some(key),
                            cycle: Vec::new(),
                            detail: format!(
                                "T{} read key {key} as {}, with {element} of aborted T{}",
                                read.transaction,
                                abbreviated(observed),
                                writer.transaction
                            ),
                        })
                    }
                    TransactionOutcome::Unknown => {
                        seen_to_commit[writer.transaction as usize] = true
                    }
                    TransactionOutcome::Committed => {}
                }
            }
            if let Some(&last) = observed.last() {
                if let Some(writer) = writers.get(&(key, last)) {
                    if !writer.last_in_transaction && writer.transaction != read.transaction {
                        report.record(AnomalyKind::IntermediateRead, limits, || Anomaly {
                            kind: AnomalyKind::IntermediateRead,
                            transactions: vec![
                                writer.transaction as usize,
                                read.transaction as usize,
                            ],
                            key: Some(key),
                            cycle: Vec::new(),
                            detail: format!(
                                "T{} read key {key} ending in {last}, which T{} followed with \
                                 another append to the key",
                                read.transaction, writer.transaction
                            ),
                        });
                    }
                }
            }
        }
    }
    check_internal_consistency(transactions, &mut report, limits);

    // 2. Per key: one order every read is a prefix of.
    let mut orders: BTreeMap<u64, KeyOrder> = BTreeMap::new();
    // Per key, per read (in `reads_by_key` order): whether it is a prefix of the order.
    let mut consistent: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
    for (&key, reads) in &reads_by_key {
        let longest = reads
            .iter()
            .map(observed_of)
            .fold(None::<&[u64]>, |best, read| match best {
                Some(best) if best.len() >= read.len() => Some(best),
                _ => Some(read),
            })
            .unwrap_or(&[]);
        let longest_reader = reads
            .iter()
            .find(|read| observed_of(read).len() == longest.len())
            .map(|read| read.transaction);
        let mut key_order = KeyOrder { order: longest.to_vec(), ..KeyOrder::default() };
        key_order.distinct_prefix = longest.len();
        for (position, &element) in longest.iter().enumerate() {
            let first = *key_order.position.entry(element).or_insert(position);
            if first != position && position < key_order.distinct_prefix {
                key_order.distinct_prefix = position;
            }
        }
        let mut flags = Vec::with_capacity(reads.len());
        for read in reads {
            let observed = observed_of(read);
            let is_prefix = longest.starts_with(observed);
            flags.push(is_prefix);
            let has_duplicates = if is_prefix {
                observed.len() > key_order.distinct_prefix
            } else {
                let mut seen = HashSet::with_capacity(observed.len());
                !observed.iter().all(|element| seen.insert(*element))
            };
            if has_duplicates {
                report.record(AnomalyKind::DuplicateElements, limits, || Anomaly {
                    kind: AnomalyKind::DuplicateElements,
                    transactions: vec![read.transaction as usize],
                    key: Some(key),
                    cycle: Vec::new(),
                    detail: format!(
                        "T{} read key {key} as {}",
                        read.transaction,
                        abbreviated(observed)
                    ),
                });
            }
            if !is_prefix {
                let other = longest_reader.unwrap_or(read.transaction);
                report.record(AnomalyKind::IncompatibleOrder, limits, || Anomaly {
                    kind: AnomalyKind::IncompatibleOrder,
                    transactions: vec![read.transaction as usize, other as usize],
                    key: Some(key),
                    cycle: Vec::new(),
                    detail: format!(
                        "T{} read key {key} as {}, not a prefix of T{other}'s {}: {}",
                        read.transaction,
                        abbreviated(observed),
                        abbreviated(longest),
                        divergence(observed, longest)
                    ),
                });
            }
        }
        consistent.insert(key, flags);
        orders.insert(key, key_order);
    }

    // The transactions the graph orders: committed ones, and unknown ones seen to take effect.
    let in_graph = |transaction: u32| -> bool {
        match transactions[transaction as usize].outcome {
            TransactionOutcome::Committed => true,
            TransactionOutcome::Unknown => seen_to_commit[transaction as usize],
            TransactionOutcome::Aborted => false,
        }
    };
    let mut node_of = vec![u32::MAX; transactions.len()];
    let mut transaction_of: Vec<u32> = Vec::new();
    for index in 0..transactions.len() as u32 {
        if in_graph(index) {
            node_of[index as usize] = transaction_of.len() as u32;
            transaction_of.push(index);
        }
    }
    report.graph_transactions = transaction_of.len();

    // 3. Direct checks, and the data edges.
    check_lost_updates(transactions, &orders, &mut report, limits);
    check_missed_appends(
        transactions,
        &reads_by_key,
        &consistent,
        &orders,
        &appends_by_key,
        &mut report,
        limits,
    );
    let mut edges: Vec<RawEdge> = Vec::new();
    let mut add_edge = |from: u32, to: u32, kind: u8, key: u64| {
        if from != to && in_graph(from) && in_graph(to) {
            edges.push(RawEdge {
                from: node_of[from as usize],
                to: node_of[to as usize],
                kind,
                key,
            });
        }
    };
    for (&key, key_order) in &orders {
        let writer_of =
            |element: u64| writers.get(&(key, element)).map(|writer| writer.transaction);
        for pair in key_order.order.windows(2) {
            if let (Some(first), Some(second)) = (writer_of(pair[0]), writer_of(pair[1])) {
                add_edge(first, second, WW, key);
            }
        }
        let reads = &reads_by_key[&key];
        let flags = &consistent[&key];
        for (read, &is_prefix) in reads.iter().zip(flags) {
            let observed = observed_of(read);
            if let Some(writer) = observed.last().and_then(|&last| writer_of(last)) {
                add_edge(writer, read.transaction, WR, key);
            }
            if is_prefix && observed.len() < key_order.order.len() {
                if let Some(writer) = writer_of(key_order.order[observed.len()]) {
                    add_edge(read.transaction, writer, RW, key);
                }
            }
        }
        // Appends of transactions in the graph that no read shows come after the whole known
        // order: after its last append, and after every read of all of it.
        let unobserved: Vec<u32> = appends_by_key
            .get(&key)
            .map(|appends| {
                appends
                    .iter()
                    .filter(|(element, writer)| {
                        in_graph(*writer) && !key_order.position.contains_key(element)
                    })
                    .map(|(_, writer)| *writer)
                    .collect()
            })
            .unwrap_or_default();
        if unobserved.is_empty() {
            continue;
        }
        if let Some(last) = key_order.order.last().and_then(|&last| writer_of(last)) {
            for &writer in &unobserved {
                add_edge(last, writer, WW, key);
            }
        }
        let mut budget = limits.unobserved_edges_per_key_max;
        'readers: for (read, &is_prefix) in reads.iter().zip(flags) {
            if !is_prefix || observed_of(read).len() != key_order.order.len() {
                continue;
            }
            for &writer in &unobserved {
                if budget == 0 {
                    report.truncated = true;
                    break 'readers;
                }
                budget -= 1;
                add_edge(read.transaction, writer, RW, key);
            }
        }
    }
    add_real_time_edges(transactions, &transaction_of, &mut edges);
    edges.sort_unstable();
    edges.dedup();
    let graph = Graph::new(transaction_of.len(), &edges);
    report.graph_edges = graph.targets.len();

    // 4. Cycles.
    let mut cycles = CycleFinder {
        graph: &graph,
        edges: &edges,
        transaction_of: &transaction_of,
        search: PathSearch::new(graph.nodes()),
        steps_left: limits.cycle_search_steps_max,
    };
    cycles.find_all(&mut report, limits);
    Ok(report)
}

/// A read that contradicts the transaction's own earlier operations on the key: after a read,
/// the same list (plus its own appends since); after appends without a read, a list ending in
/// them.
fn check_internal_consistency(
    transactions: &[Transaction],
    report: &mut ListAppendReport,
    limits: &CheckLimits,
) {
    for (index, transaction) in transactions.iter().enumerate() {
        if transaction.outcome != TransactionOutcome::Committed {
            continue;
        }
        // Per key: the list as the transaction knows it (`Some` after a read), or the
        // appends it made without having read.
        let mut known: BTreeMap<u64, (Option<Vec<u64>>, Vec<u64>)> = BTreeMap::new();
        for op in &transaction.ops {
            match op {
                MicroOp::Append { key, element } => {
                    let (list, appended) = known.entry(*key).or_default();
                    match list {
                        Some(list) => list.push(*element),
                        None => appended.push(*element),
                    }
                }
                MicroOp::Read { key, observed } => {
                    let observed = observed.as_deref().unwrap_or(&[]);
                    let (list, appended) = known.entry(*key).or_default();
                    let consistent = match list {
                        Some(list) => list == observed,
                        None => observed.ends_with(appended),
                    };
                    if !consistent {
                        let expected = match list {
                            Some(list) => abbreviated(list),
                            None => format!("a list ending in {}", abbreviated(appended)),
                        };
                        report.record(AnomalyKind::InternalInconsistency, limits, || Anomaly {
                            kind: AnomalyKind::InternalInconsistency,
                            transactions: vec![index],
                            key: Some(*key),
                            cycle: Vec::new(),
                            detail: format!(
                                "T{index} read key {key} as {} where its own earlier \
                                 operations make it {expected}",
                                abbreviated(observed)
                            ),
                        });
                    }
                    *list = Some(observed.to_vec());
                    appended.clear();
                }
            }
        }
    }
}

/// Lists in reports: short ones whole, long ones by their length and last elements.
fn abbreviated(list: &[u64]) -> String {
    const SHOWN: usize = 6;
    if list.len() <= SHOWN {
        return format!("{list:?}");
    }
    let tail: Vec<String> = list[list.len() - SHOWN..].iter().map(u64::to_string).collect();
    format!("[{} elements: …, {}]", list.len(), tail.join(", "))
}

/// Where a read departs from the order it should be a prefix of.
fn divergence(read: &[u64], order: &[u64]) -> String {
    match read.iter().zip(order).position(|(seen, ordered)| seen != ordered) {
        Some(position) => format!(
            "at position {position} it has {} where the other has {}",
            read[position], order[position]
        ),
        None => format!("it is longer ({} elements, not {})", read.len(), order.len()),
    }
}

/// Two committed transactions that read the same state of a key (their first operation on
/// it, a read of a prefix of its order) and then both appended to it.
fn check_lost_updates(
    transactions: &[Transaction],
    orders: &BTreeMap<u64, KeyOrder>,
    report: &mut ListAppendReport,
    limits: &CheckLimits,
) {
    // (key, length of the state read: a prefix of the order, so the length names it) → the
    // transactions that read it first and then appended.
    let mut readers_of_state: BTreeMap<(u64, usize), Vec<usize>> = BTreeMap::new();
    for (index, transaction) in transactions.iter().enumerate() {
        if transaction.outcome != TransactionOutcome::Committed {
            continue;
        }
        // Per key: the length of the first read, if it came before any append; whether the
        // transaction appended after it.
        let mut first_ops: BTreeMap<u64, (Option<usize>, bool)> = BTreeMap::new();
        for op in &transaction.ops {
            match op {
                MicroOp::Read { key, observed } => {
                    first_ops.entry(*key).or_insert_with(|| {
                        let observed = observed.as_deref().unwrap_or(&[]);
                        let is_prefix =
                            orders.get(key).is_some_and(|order| order.order.starts_with(observed));
                        (is_prefix.then_some(observed.len()), false)
                    });
                }
                MicroOp::Append { key, .. } => {
                    first_ops.entry(*key).or_insert((None, false)).1 = true;
                }
            }
        }
        for (key, (length, appended)) in first_ops {
            if let (Some(length), true) = (length, appended) {
                readers_of_state.entry((key, length)).or_default().push(index);
            }
        }
    }
    for ((key, length), readers) in readers_of_state {
        if readers.len() < 2 {
            continue;
        }
        report.record(AnomalyKind::LostUpdate, limits, || Anomaly {
            kind: AnomalyKind::LostUpdate,
            detail: format!(
                "{} committed transactions ({}) read key {key} with the same {length} elements \
                 and each appended to it",
                readers.len(),
                readers.iter().map(|reader| format!("T{reader}")).collect::<Vec<_>>().join(", ")
            ),
            transactions: readers,
            key: Some(key),
            cycle: Vec::new(),
        });
    }
}

/// A committed append missing from a (consistent) committed read invoked after the append's
/// transaction completed: stale when some read shows the append, lost when none does.
fn check_missed_appends(
    transactions: &[Transaction],
    reads_by_key: &BTreeMap<u64, Vec<ReadRef>>,
    consistent: &BTreeMap<u64, Vec<bool>>,
    orders: &BTreeMap<u64, KeyOrder>,
    appends_by_key: &BTreeMap<u64, Vec<(u64, u32)>>,
    report: &mut ListAppendReport,
    limits: &CheckLimits,
) {
    for (&key, appends) in appends_by_key {
        let (Some(reads), Some(order)) = (reads_by_key.get(&key), orders.get(&key)) else {
            continue;
        };
        // (length read, invoked at, reader), shortest first; then the latest invocation among
        // the reads of at most each length.
        let mut by_length: Vec<(usize, u64, u32)> = reads
            .iter()
            .zip(&consistent[&key])
            .filter(|(_, &is_prefix)| is_prefix)
            .map(|(read, _)| {
                let length = match &transactions[read.transaction as usize].ops[read.op as usize] {
                    MicroOp::Read { observed: Some(observed), .. } => observed.len(),
                    _ => 0,
                };
                (length, transactions[read.transaction as usize].invoked_at, read.transaction)
            })
            .collect();
        by_length.sort_unstable();
        let mut latest: Vec<(u64, u32)> = Vec::with_capacity(by_length.len());
        for &(_, invoked_at, reader) in &by_length {
            let best = match latest.last() {
                Some(&(best_at, best_reader)) if best_at >= invoked_at => (best_at, best_reader),
                _ => (invoked_at, reader),
            };
            latest.push(best);
        }
        for &(element, writer) in appends {
            let transaction = &transactions[writer as usize];
            let (TransactionOutcome::Committed, Some(completed_at)) =
                (transaction.outcome, transaction.completed_at)
            else {
                continue;
            };
            // Reads of at most `position` elements miss the append.
            let position = order.position.get(&element).copied();
            let missing = match position {
                Some(position) => by_length.partition_point(|(length, _, _)| *length <= position),
                None => by_length.len(),
            };
            let Some(&(invoked_at, reader)) = missing.checked_sub(1).map(|last| &latest[last])
            else {
                continue;
            };
            if invoked_at <= completed_at {
                continue;
            }
            let kind =
                if position.is_some() { AnomalyKind::StaleRead } else { AnomalyKind::LostAppend };
            report.record(kind, limits, || Anomaly {
                kind,
                transactions: vec![writer as usize, reader as usize],
                key: Some(key),
                cycle: Vec::new(),
                detail: format!(
                    "T{writer} appended {element} to key {key} and committed at {completed_at}; \
                     T{reader}, invoked at {invoked_at}, read the key without it{}",
                    if position.is_some() { "" } else { ", and no read ever shows it" }
                ),
            });
        }
    }
}

/// Real-time edges: `a → b` when a completed before b was invoked, reduced to a frontier.
/// Events in time order (at one instant, invocations first: a completion and an invocation
/// at the same instant are concurrent); the frontier holds the completed transactions not
/// yet ordered before a later-completed one; each invocation is linked from the whole
/// frontier, and each completion drops from it the transactions that completed before the
/// completing one began (they reach everything it reaches through it). The transitive
/// closure is the whole real-time order.
fn add_real_time_edges(
    transactions: &[Transaction],
    transaction_of: &[u32],
    edges: &mut Vec<RawEdge>,
) {
    // (time, 0 invoke / 1 complete, node)
    let mut events: Vec<(u64, u8, u32)> = Vec::with_capacity(transaction_of.len() * 2);
    for (node, &transaction) in transaction_of.iter().enumerate() {
        let transaction = &transactions[transaction as usize];
        events.push((transaction.invoked_at, 0, node as u32));
        if let Some(completed_at) = transaction.completed_at {
            events.push((completed_at, 1, node as u32));
        }
    }
    events.sort_unstable();
    let invoked_at = |node: u32| transactions[transaction_of[node as usize] as usize].invoked_at;
    let completed_at = |node: u32| {
        transactions[transaction_of[node as usize] as usize].completed_at.unwrap_or(u64::MAX)
    };
    let mut frontier: Vec<u32> = Vec::new();
    for (_, event, node) in events {
        if event == 0 {
            edges.extend(frontier.iter().map(|&from| RawEdge { from, to: node, kind: RT, key: 0 }));
        } else {
            let began = invoked_at(node);
            frontier.retain(|&earlier| completed_at(earlier) >= began);
            frontier.push(node);
        }
    }
}

/// One inferred edge, before the graph is built; kept (sorted) to name an edge's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct RawEdge {
    from: u32,
    to: u32,
    kind: u8,
    key: u64,
}

/// The dependency graph, in compressed rows: node i's edges are `offsets[i]..offsets[i + 1]`,
/// sorted by target, each with its set of kinds.
#[derive(Debug)]
struct Graph {
    offsets: Vec<usize>,
    targets: Vec<u32>,
    kinds: Vec<u8>,
}

impl Graph {
    /// From edges sorted by (from, to).
    fn new(nodes: usize, edges: &[RawEdge]) -> Graph {
        let mut graph =
            Graph { offsets: vec![0; nodes + 1], targets: Vec::new(), kinds: Vec::new() };
        let mut next = 0;
        for node in 0..nodes {
            graph.offsets[node] = graph.targets.len();
            while next < edges.len() && edges[next].from as usize == node {
                let edge = edges[next];
                if graph.targets.len() > graph.offsets[node]
                    && graph.targets.last() == Some(&edge.to)
                {
                    if let Some(kinds) = graph.kinds.last_mut() {
                        *kinds |= edge.kind;
                    }
                } else {
                    graph.targets.push(edge.to);
                    graph.kinds.push(edge.kind);
                }
                next += 1;
            }
        }
        graph.offsets[nodes] = graph.targets.len();
        graph
    }

    fn nodes(&self) -> usize {
        self.offsets.len() - 1
    }

    fn edges(&self, node: u32) -> impl Iterator<Item = (u32, u8)> + '_ {
        let range = self.offsets[node as usize]..self.offsets[node as usize + 1];
        self.targets[range.clone()].iter().copied().zip(self.kinds[range].iter().copied())
    }

    fn kinds(&self, from: u32, to: u32) -> u8 {
        let range = self.offsets[from as usize]..self.offsets[from as usize + 1];
        match self.targets[range.clone()].binary_search(&to) {
            Ok(found) => self.kinds[range.start + found],
            Err(_) => 0,
        }
    }

    /// The strongly connected components of the edges with a kind in `level` (Tarjan's
    /// algorithm, iterative): each node's component, numbered from 0.
    fn components(&self, level: u8) -> Vec<u32> {
        const UNVISITED: u32 = u32::MAX;
        let nodes = self.nodes();
        let mut index = vec![UNVISITED; nodes];
        let mut low = vec![0u32; nodes];
        let mut on_stack = vec![false; nodes];
        let mut component = vec![UNVISITED; nodes];
        let mut stack: Vec<u32> = Vec::new();
        let mut calls: Vec<(u32, usize)> = Vec::new();
        let (mut next_index, mut components) = (0u32, 0u32);
        for root in 0..nodes as u32 {
            if index[root as usize] != UNVISITED {
                continue;
            }
            index[root as usize] = next_index;
            low[root as usize] = next_index;
            next_index += 1;
            stack.push(root);
            on_stack[root as usize] = true;
            calls.push((root, self.offsets[root as usize]));
            while let Some(&(node, mut position)) = calls.last() {
                let end = self.offsets[node as usize + 1];
                let mut descended = false;
                while position < end {
                    let (target, kinds) = (self.targets[position], self.kinds[position]);
                    position += 1;
                    if kinds & level == 0 {
                        continue;
                    }
                    if index[target as usize] == UNVISITED {
                        index[target as usize] = next_index;
                        low[target as usize] = next_index;
                        next_index += 1;
                        stack.push(target);
                        on_stack[target as usize] = true;
                        if let Some(top) = calls.last_mut() {
                            top.1 = position;
                        }
                        calls.push((target, self.offsets[target as usize]));
                        descended = true;
                        break;
                    } else if on_stack[target as usize] {
                        low[node as usize] = low[node as usize].min(index[target as usize]);
                    }
                }
                if descended {
                    continue;
                }
                calls.pop();
                if let Some(&(parent, _)) = calls.last() {
                    low[parent as usize] = low[parent as usize].min(low[node as usize]);
                }
                if low[node as usize] == index[node as usize] {
                    while let Some(member) = stack.pop() {
                        on_stack[member as usize] = false;
                        component[member as usize] = components;
                        if member == node {
                            break;
                        }
                    }
                    components += 1;
                }
            }
        }
        component
    }
}

/// Breadth-first searches for paths, reusing their memory (marks stamped per search).
#[derive(Debug)]
struct PathSearch {
    /// Per state (node × 2 + whether a marked edge was crossed): the search that reached it.
    stamp: Vec<u32>,
    parent: Vec<u32>,
    current: u32,
    queue: Vec<u32>,
}

/// One path search's rules.
#[derive(Clone, Copy, Debug)]
struct PathRules<'a> {
    /// Edges with a kind in this set may be followed.
    level: u8,
    /// When set, the path must cross at least one edge whose weakest kind is this one.
    must_cross: Option<u8>,
    /// The component (of `components`) the path must stay in.
    components: &'a [u32],
    component: u32,
}

impl PathSearch {
    fn new(nodes: usize) -> PathSearch {
        PathSearch {
            stamp: vec![0; nodes * 2],
            parent: vec![0; nodes * 2],
            current: 0,
            queue: Vec::new(),
        }
    }

    /// The nodes of a shortest path from `from` to `to` under `rules` (both ends included),
    /// and the edges visited.
    fn path(
        &mut self,
        graph: &Graph,
        from: u32,
        to: u32,
        rules: PathRules<'_>,
    ) -> (Option<Vec<u32>>, u64) {
        self.current += 1;
        let stamp = self.current;
        let mut steps = 0u64;
        self.queue.clear();
        let start = from * 2;
        let goal = to * 2 + u32::from(rules.must_cross.is_some());
        self.stamp[start as usize] = stamp;
        self.queue.push(start);
        let mut head = 0;
        while head < self.queue.len() {
            let state = self.queue[head];
            head += 1;
            if state == goal {
                let mut path = vec![state / 2];
                let mut at = state;
                while at != start {
                    at = self.parent[at as usize];
                    path.push(at / 2);
                }
                path.reverse();
                return (Some(path), steps);
            }
            let (node, crossed) = (state / 2, state % 2);
            for (target, kinds) in graph.edges(node) {
                steps += 1;
                if kinds & rules.level == 0 || rules.components[target as usize] != rules.component
                {
                    continue;
                }
                let crosses =
                    rules.must_cross.is_some_and(|bit| Dependency::weakest(kinds).bit() == bit);
                let next = target * 2 + (crossed | u32::from(crosses));
                if self.stamp[next as usize] != stamp {
                    self.stamp[next as usize] = stamp;
                    self.parent[next as usize] = state;
                    self.queue.push(next);
                }
            }
        }
        (None, steps)
    }
}

/// The cycle searches over one graph.
struct CycleFinder<'a> {
    graph: &'a Graph,
    edges: &'a [RawEdge],
    transaction_of: &'a [u32],
    search: PathSearch,
    steps_left: u64,
}

impl CycleFinder<'_> {
    /// The cycles of every kind, one per component and kind (see the module documentation).
    fn find_all(&mut self, report: &mut ListAppendReport, limits: &CheckLimits) {
        let ww = self.graph.components(LEVEL_WW);
        let ww_wr = self.graph.components(LEVEL_WW_WR);
        let data = self.graph.components(LEVEL_DATA);
        let all = self.graph.components(LEVEL_ALL);
        let weakest_is = |kinds: u8, bit: u8| kinds != 0 && Dependency::weakest(kinds).bit() == bit;

        // G0: a ww edge inside a ww component closes a ww cycle.
        self.each_component(&ww, |finder, component, members| {
            let candidate = finder.first_edge(members, |from, to, kinds| {
                kinds & WW != 0 && ww[from as usize] == component && ww[to as usize] == component
            });
            if let Some((from, to)) = candidate {
                let rules =
                    PathRules { level: LEVEL_WW, must_cross: None, components: &ww, component };
                finder.report_cycle(from, to, rules, true, report, limits);
            }
        });
        // G1c: a wr edge (not also ww) inside a ww+wr component.
        self.each_component(&ww_wr, |finder, component, members| {
            let candidate = finder.first_edge(members, |_, to, kinds| {
                weakest_is(kinds, WR) && ww_wr[to as usize] == component
            });
            if let Some((from, to)) = candidate {
                let rules = PathRules {
                    level: LEVEL_WW_WR,
                    must_cross: None,
                    components: &ww_wr,
                    component,
                };
                finder.report_cycle(from, to, rules, true, report, limits);
            }
        });
        // G-single and G2: through an rw edge (not also ww or wr) inside a data component, a
        // way back without rw edges, or one crossing another. The first candidate finds one
        // of the two (a way back exists, with an rw edge or without); more are tried within
        // the budget.
        self.each_component(&data, |finder, component, members| {
            let candidates = finder.edges_where(members, |_, to, kinds| {
                weakest_is(kinds, RW) && data[to as usize] == component
            });
            let (mut single, mut multiple) = (false, false);
            for (attempt, &(from, to)) in candidates.iter().enumerate() {
                if single && multiple || attempt > 0 && finder.steps_left == 0 {
                    break;
                }
                if !single {
                    let rules = PathRules {
                        level: LEVEL_WW_WR,
                        must_cross: None,
                        components: &data,
                        component,
                    };
                    single = finder.report_cycle(from, to, rules, attempt == 0, report, limits);
                }
                if !multiple {
                    let rules = PathRules {
                        level: LEVEL_DATA,
                        must_cross: Some(RW),
                        components: &data,
                        component,
                    };
                    multiple = finder.report_cycle(from, to, rules, attempt == 0, report, limits);
                }
            }
            if !candidates.is_empty() && finder.steps_left == 0 && !(single && multiple) {
                report.truncated = true;
            }
        });
        // Write skew: two rw edges (neither also ww or wr) between the same two transactions.
        for from in 0..self.graph.nodes() as u32 {
            for (to, kinds) in self.graph.edges(from) {
                if from < to && weakest_is(kinds, RW) && weakest_is(self.graph.kinds(to, from), RW)
                {
                    let steps = vec![self.step(from, to), self.step(to, from)];
                    record_cycle(AnomalyKind::WriteSkew, steps, report, limits);
                }
            }
        }
        // Real time: an rt edge (no data dependency) between two data components inside one
        // component of the whole graph; every cycle through it needs real time.
        self.each_component(&all, |finder, component, members| {
            let candidate = finder.first_edge(members, |from, to, kinds| {
                kinds == RT
                    && all[to as usize] == component
                    && data[from as usize] != data[to as usize]
            });
            if let Some((from, to)) = candidate {
                let rules =
                    PathRules { level: LEVEL_ALL, must_cross: None, components: &all, component };
                finder.report_cycle(from, to, rules, true, report, limits);
            }
        });
    }

    /// Calls `visit` with each component of more than one node and its members (ascending),
    /// components in the order of their smallest member.
    fn each_component(
        &mut self,
        components: &[u32],
        mut visit: impl FnMut(&mut Self, u32, &[u32]),
    ) {
        let mut members: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (node, &component) in components.iter().enumerate() {
            members.entry(component).or_default().push(node as u32);
        }
        let mut groups: Vec<Vec<u32>> =
            members.into_values().filter(|group| group.len() > 1).collect();
        groups.sort_unstable_by_key(|group| group[0]);
        for group in groups {
            visit(self, components[group[0] as usize], &group);
        }
    }

    fn first_edge(
        &self,
        members: &[u32],
        wanted: impl Fn(u32, u32, u8) -> bool,
    ) -> Option<(u32, u32)> {
        members.iter().find_map(|&from| {
            self.graph
                .edges(from)
                .find(|&(to, kinds)| wanted(from, to, kinds))
                .map(|(to, _)| (from, to))
        })
    }

    fn edges_where(
        &self,
        members: &[u32],
        wanted: impl Fn(u32, u32, u8) -> bool,
    ) -> Vec<(u32, u32)> {
        let wanted = &wanted;
        members
            .iter()
            .flat_map(|&from| {
                self.graph
                    .edges(from)
                    .filter(move |&(to, kinds)| wanted(from, to, kinds))
                    .map(move |(to, _)| (from, to))
            })
            .collect()
    }

    /// Searches a way back from `to` to `from` under `rules`; if found, records the cycle
    /// `from → to → … → from` under the kind its edges make it. Searches that are not
    /// `always` are made only within the step budget. Returns whether a cycle was found.
    fn report_cycle(
        &mut self,
        from: u32,
        to: u32,
        rules: PathRules<'_>,
        always: bool,
        report: &mut ListAppendReport,
        limits: &CheckLimits,
    ) -> bool {
        if !always && self.steps_left == 0 {
            return false;
        }
        let (path, steps) = self.search.path(self.graph, to, from, rules);
        self.steps_left = self.steps_left.saturating_sub(steps);
        let Some(path) = path else { return false };
        let mut nodes = vec![from];
        nodes.extend(path);
        // A search that must cross a kind of edge may return a walk through some transaction
        // twice (once before the crossing, once after): that is two cycles, not one of the
        // kind sought. (When no way back avoids the crossing, the shortest walk is simple.)
        let mut members = nodes[..nodes.len() - 1].to_vec();
        members.sort_unstable();
        if members.windows(2).any(|pair| pair[0] == pair[1]) {
            return false;
        }
        let steps: Vec<CycleStep> =
            nodes.windows(2).map(|pair| self.step(pair[0], pair[1])).collect();
        let kind = cycle_kind(&steps);
        record_cycle(kind, steps, report, limits);
        true
    }

    /// The edge `from → to` as a cycle step, named by its weakest kind and that kind's key.
    fn step(&self, from: u32, to: u32) -> CycleStep {
        let dependency = Dependency::weakest(self.graph.kinds(from, to));
        let bit = dependency.bit();
        let found =
            self.edges.partition_point(|edge| (edge.from, edge.to, edge.kind) < (from, to, bit));
        let key = self
            .edges
            .get(found)
            .filter(|edge| (edge.from, edge.to, edge.kind) == (from, to, bit) && bit != RT)
            .map(|edge| edge.key);
        CycleStep {
            from: self.transaction_of[from as usize] as usize,
            to: self.transaction_of[to as usize] as usize,
            dependency,
            key,
        }
    }
}

/// The kind a cycle's edges make it: real-time if any edge is real-time only, else by its
/// anti-dependencies and write-read edges.
fn cycle_kind(steps: &[CycleStep]) -> AnomalyKind {
    let count = |dependency| steps.iter().filter(|step| step.dependency == dependency).count();
    if count(Dependency::RealTime) > 0 {
        AnomalyKind::RealTime
    } else if count(Dependency::ReadWrite) >= 2 {
        AnomalyKind::G2
    } else if count(Dependency::ReadWrite) == 1 {
        AnomalyKind::GSingle
    } else if count(Dependency::WriteRead) > 0 {
        AnomalyKind::G1c
    } else {
        AnomalyKind::G0
    }
}

fn record_cycle(
    kind: AnomalyKind,
    steps: Vec<CycleStep>,
    report: &mut ListAppendReport,
    limits: &CheckLimits,
) {
    report.record(kind, limits, || Anomaly {
        kind,
        transactions: steps.iter().map(|step| step.from).collect(),
        key: None,
        detail: format!("a cycle of {} transactions", steps.len()),
        cycle: steps,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A transaction at [invoked, completed] on process 0.
    fn tx(
        outcome: TransactionOutcome,
        (invoked, completed): (u64, u64),
        ops: Vec<MicroOp>,
    ) -> Transaction {
        Transaction {
            process: 0,
            invoked_at: invoked,
            completed_at: (outcome != TransactionOutcome::Unknown).then_some(completed),
            outcome,
            ops,
        }
    }

    fn committed(times: (u64, u64), ops: Vec<MicroOp>) -> Transaction {
        tx(TransactionOutcome::Committed, times, ops)
    }

    fn append(key: u64, element: u64) -> MicroOp {
        MicroOp::Append { key, element }
    }

    fn read(key: u64, observed: &[u64]) -> MicroOp {
        MicroOp::Read { key, observed: Some(observed.to_vec()) }
    }

    fn check(transactions: Vec<Transaction>) -> ListAppendReport {
        check_list_append(&ListAppendHistory { transactions }, &CheckLimits::default()).unwrap()
    }

    /// Asserts the report shows `kind` (and prints it when not).
    fn assert_shows(report: &ListAppendReport, kind: AnomalyKind) {
        assert!(report.count(kind) > 0, "expected {kind}, got {report}");
        assert!(report.anomalies.iter().any(|anomaly| anomaly.kind == kind));
    }

    #[test]
    fn lists_round_trip_and_torn_ones_are_refused() {
        for list in [vec![], vec![7], vec![1, u64::MAX, 3]] {
            assert_eq!(decode_list(&encode_list(&list)), Some(list));
        }
        assert_eq!(decode_list(&[1, 2, 3]), None);
    }

    #[test]
    fn a_serial_history_shows_no_anomaly() {
        let report = check(vec![
            committed((0, 1), vec![read(1, &[]), append(1, 10), append(2, 20)]),
            committed((2, 3), vec![read(1, &[10]), read(2, &[20]), append(2, 21)]),
            committed((4, 5), vec![append(1, 11), read(1, &[10, 11])]),
            tx(TransactionOutcome::Aborted, (6, 7), vec![read(1, &[10, 11]), append(1, 99)]),
            committed((8, 9), vec![read(1, &[10, 11]), read(2, &[20, 21])]),
        ]);
        assert!(report.is_valid(), "{report}");
        assert_eq!((report.transactions, report.keys, report.committed_reads_checked), (5, 2, 6));
        assert_eq!(report.graph_transactions, 4);
    }

    #[test]
    fn reads_that_are_not_prefixes_of_one_order_are_incompatible() {
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((0, 1), vec![append(1, 2)]),
            committed((2, 3), vec![read(1, &[1, 2])]),
            committed((2, 3), vec![read(1, &[2, 1])]),
        ]);
        assert_shows(&report, AnomalyKind::IncompatibleOrder);
    }

    #[test]
    fn duplicates_and_garbage_are_found() {
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((2, 3), vec![read(1, &[1, 1])]),
            committed((2, 3), vec![read(1, &[7])]),
        ]);
        assert_shows(&report, AnomalyKind::DuplicateElements);
        assert_shows(&report, AnomalyKind::GarbageRead);
    }

    #[test]
    fn an_element_of_an_aborted_transaction_is_an_aborted_read() {
        let report = check(vec![
            tx(TransactionOutcome::Aborted, (0, 1), vec![append(1, 1)]),
            committed((2, 3), vec![read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::AbortedRead);
        assert_eq!(report.count(AnomalyKind::AbortedRead), 1);
    }

    #[test]
    fn a_state_in_the_middle_of_a_transaction_is_an_intermediate_read() {
        let report = check(vec![
            committed((0, 5), vec![append(1, 1), append(1, 2)]),
            committed((1, 4), vec![read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::IntermediateRead);
        assert!(!report.anomalies.iter().any(|anomaly| anomaly.kind == AnomalyKind::StaleRead));
    }

    #[test]
    fn a_read_contradicting_its_own_transaction_is_internally_inconsistent() {
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((2, 3), vec![read(1, &[1]), append(1, 2), read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::InternalInconsistency);
        let report = check(vec![committed((0, 1), vec![append(1, 1), read(1, &[])])]);
        assert_shows(&report, AnomalyKind::InternalInconsistency);
    }

    #[test]
    fn two_transactions_appending_to_the_same_state_lose_an_update() {
        // Both read [1] and appended; the list kept one of them.
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((2, 5), vec![read(1, &[1]), append(1, 2)]),
            committed((2, 5), vec![read(1, &[1]), append(1, 3)]),
            committed((6, 7), vec![read(1, &[1, 2, 3])]),
        ]);
        assert_shows(&report, AnomalyKind::LostUpdate);
        // T1 read [1] missing 3... and T2 read [1] missing 2, each ordered around the other.
        assert_shows(&report, AnomalyKind::GSingle);
    }

    #[test]
    fn a_write_cycle_is_g0() {
        // Key 1 orders T0 before T1, key 2 T1 before T0.
        let report = check(vec![
            committed((0, 5), vec![append(1, 1), append(2, 2)]),
            committed((0, 5), vec![append(1, 3), append(2, 4)]),
            committed((6, 7), vec![read(1, &[1, 3]), read(2, &[4, 2])]),
        ]);
        assert_shows(&report, AnomalyKind::G0);
        let cycle =
            &report.anomalies.iter().find(|anomaly| anomaly.kind == AnomalyKind::G0).unwrap().cycle;
        assert_eq!(cycle.len(), 2);
        assert!(cycle.iter().all(|step| step.dependency == Dependency::WriteWrite));
    }

    #[test]
    fn circular_information_flow_is_g1c() {
        // T0 read T1's append, and T1 read T0's.
        let report = check(vec![
            committed((0, 5), vec![append(1, 1), read(2, &[2])]),
            committed((0, 5), vec![append(2, 2), read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::G1c);
        assert_eq!(report.count(AnomalyKind::G0), 0);
    }

    #[test]
    fn one_anti_dependency_in_a_cycle_is_g_single() {
        // T1 appends to 1 and 2; T0 sees its append to 2 but not the one to 1 (read skew).
        let report = check(vec![
            committed((0, 5), vec![read(1, &[]), read(2, &[2])]),
            committed((0, 5), vec![append(1, 1), append(2, 2)]),
            committed((6, 7), vec![read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::GSingle);
        assert_eq!(report.count(AnomalyKind::G2), 0);
    }

    #[test]
    fn each_missing_the_others_append_is_write_skew_and_g2() {
        let report = check(vec![
            committed((0, 5), vec![read(1, &[]), read(2, &[]), append(1, 1)]),
            committed((0, 5), vec![read(1, &[]), read(2, &[]), append(2, 2)]),
            committed((6, 7), vec![read(1, &[1]), read(2, &[2])]),
        ]);
        assert_shows(&report, AnomalyKind::WriteSkew);
        assert_shows(&report, AnomalyKind::G2);
        assert_eq!(report.count(AnomalyKind::GSingle), 0);
        assert_eq!(report.count(AnomalyKind::LostUpdate), 0);
    }

    #[test]
    fn a_cycle_only_real_time_closes_is_a_real_time_violation() {
        // T0 appended and committed before T1 began, yet T1 read the list without it: T1 must
        // come before T0 (rw), and after it (rt).
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((2, 3), vec![read(1, &[])]),
            committed((4, 5), vec![read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::RealTime);
        assert_shows(&report, AnomalyKind::StaleRead);
        assert_eq!(report.count(AnomalyKind::GSingle) + report.count(AnomalyKind::G2), 0);
        // The same reads at overlapping times are strictly serializable.
        let report = check(vec![
            committed((0, 3), vec![append(1, 1)]),
            committed((2, 3), vec![read(1, &[])]),
            committed((4, 5), vec![read(1, &[1])]),
        ]);
        assert!(report.is_valid(), "{report}");
    }

    #[test]
    fn a_committed_append_no_later_read_shows_is_lost() {
        let report = check(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((2, 3), vec![append(1, 2)]),
            committed((4, 5), vec![read(1, &[1])]),
        ]);
        assert_shows(&report, AnomalyKind::LostAppend);
        assert_shows(&report, AnomalyKind::RealTime);
    }

    #[test]
    fn unknown_transactions_count_once_seen_and_may_not_come_from_the_future() {
        // Unknown and unseen: may never have happened.
        let unseen = tx(TransactionOutcome::Unknown, (0, 0), vec![append(1, 1)]);
        let report = check(vec![unseen.clone(), committed((5, 6), vec![read(1, &[])])]);
        assert!(report.is_valid(), "{report}");
        assert_eq!(report.graph_transactions, 1);
        // Seen: it took effect, so it is ordered; seen by a read that completed before it
        // began, it came from the future.
        let report = check(vec![
            committed((0, 1), vec![read(1, &[1])]),
            tx(TransactionOutcome::Unknown, (2, 0), vec![append(1, 1)]),
        ]);
        assert_eq!(report.graph_transactions, 2);
        assert_shows(&report, AnomalyKind::RealTime);
        // Seen on one key by a read that completed before another read missed its append to
        // a second key: a fractured transaction, which only real time orders.
        let report = check(vec![
            tx(TransactionOutcome::Unknown, (0, 0), vec![append(1, 1), append(2, 2)]),
            committed((3, 4), vec![read(1, &[1])]),
            committed((5, 6), vec![read(2, &[])]),
        ]);
        assert_shows(&report, AnomalyKind::RealTime);
    }

    #[test]
    fn malformed_histories_are_refused() {
        let limits = CheckLimits::default();
        let history = |transactions| ListAppendHistory { transactions };
        let twice = history(vec![
            committed((0, 1), vec![append(1, 1)]),
            committed((0, 1), vec![append(1, 1)]),
        ]);
        assert!(matches!(
            check_list_append(&twice, &limits),
            Err(HistoryError::DuplicateAppend { key: 1, element: 1, transactions: (0, 1) })
        ));
        let unobserved =
            history(vec![committed((0, 1), vec![MicroOp::Read { key: 1, observed: None }])]);
        assert!(matches!(
            check_list_append(&unobserved, &limits),
            Err(HistoryError::CommittedReadUnobserved { transaction: 0, key: 1 })
        ));
        let backwards = history(vec![committed((3, 1), vec![])]);
        assert!(matches!(
            check_list_append(&backwards, &limits),
            Err(HistoryError::CompletedBeforeInvoked { transaction: 0 })
        ));
        let mut open = committed((0, 1), vec![]);
        open.completed_at = None;
        assert!(matches!(
            check_list_append(&history(vec![open]), &limits),
            Err(HistoryError::CommittedWithoutCompletion { transaction: 0 })
        ));
    }

    #[test]
    fn examples_are_bounded_and_counts_are_not() {
        let mut transactions = vec![tx(TransactionOutcome::Aborted, (0, 1), vec![append(1, 1)])];
        transactions.extend((0..20).map(|_| committed((2, 3), vec![read(1, &[1])])));
        let limits = CheckLimits { examples_per_kind: 3, ..CheckLimits::default() };
        let report = check_list_append(&ListAppendHistory { transactions }, &limits).unwrap();
        assert_eq!(report.count(AnomalyKind::AbortedRead), 20);
        assert_eq!(
            report
                .anomalies
                .iter()
                .filter(|anomaly| anomaly.kind == AnomalyKind::AbortedRead)
                .count(),
            3
        );
    }

    /// One transaction to generate: its operations (true: append), outcome (0–6 committed, 7
    /// aborted, 8–9 unknown), whether an unknown one took effect, and how far its interval
    /// reaches before and after its serialization point.
    type Spec = (Vec<(bool, u64)>, u8, bool, u64, u64);

    /// Runs `specs` one at a time against lists (transaction i takes effect at 10·i, inside
    /// its interval), then reads every key: a strictly serializable history by construction.
    fn serial_history(specs: &[Spec], keys: u64) -> ListAppendHistory {
        let mut lists: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut history = ListAppendHistory::default();
        let mut next_element = 0;
        for (index, (ops, outcome, took_effect, before, after)) in specs.iter().enumerate() {
            let point = 1_000 + 10 * index as u64;
            let outcome = match outcome {
                0..=6 => TransactionOutcome::Committed,
                7 => TransactionOutcome::Aborted,
                _ => TransactionOutcome::Unknown,
            };
            let applies = match outcome {
                TransactionOutcome::Committed => true,
                TransactionOutcome::Aborted => false,
                TransactionOutcome::Unknown => *took_effect,
            };
            // The lists it touches, as it sees them (copied from the model on first touch).
            let mut touched: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            let mut recorded = Vec::new();
            for &(is_append, key) in ops {
                let list = touched
                    .entry(key)
                    .or_insert_with(|| lists.get(&key).cloned().unwrap_or_default());
                if is_append {
                    next_element += 1;
                    list.push(next_element);
                    recorded.push(append(key, next_element));
                } else {
                    let observed = (outcome == TransactionOutcome::Committed).then(|| list.clone());
                    recorded.push(MicroOp::Read { key, observed });
                }
            }
            if applies {
                lists.extend(touched);
            }
            history.push(Transaction {
                process: index as u64 % 5,
                invoked_at: point - before,
                completed_at: (outcome != TransactionOutcome::Unknown).then_some(point + after),
                outcome,
                ops: recorded,
            });
        }
        let end = 1_000 + 10 * specs.len() as u64 + 100;
        let finals =
            (0..keys).map(|key| read(key, lists.get(&key).map(Vec::as_slice).unwrap_or(&[])));
        history.push(committed((end, end + 1), finals.collect()));
        history
    }

    fn spec(keys: u64) -> impl Strategy<Value = Spec> {
        (
            prop::collection::vec((any::<bool>(), 0..keys), 1..6),
            0u8..10,
            any::<bool>(),
            0u64..40,
            0u64..40,
        )
    }

    proptest! {
        #[test]
        fn serial_executions_show_no_anomaly(specs in prop::collection::vec(spec(4), 0..60)) {
            let history = serial_history(&specs, 4);
            let report = check_list_append(&history, &CheckLimits::default()).unwrap();
            prop_assert!(report.is_valid(), "{}", report);
        }

        #[test]
        fn a_final_read_missing_a_committed_append_is_caught(
            specs in prop::collection::vec(spec(2), 1..40),
        ) {
            // Drop the last element of a final read whose last element a committed
            // transaction appended: an append that committed before the final read began is
            // missing from it.
            let mut history = serial_history(&specs, 2);
            let committed_writer = |element: u64| {
                history.transactions.iter().any(|transaction| {
                    transaction.outcome == TransactionOutcome::Committed
                        && transaction.ops.iter().any(|op| {
                            matches!(op, MicroOp::Append { element: appended, .. } if *appended == element)
                        })
                })
            };
            let finals = &history.transactions[history.transactions.len() - 1].ops;
            let victim = finals.iter().position(|op| match op {
                MicroOp::Read { observed: Some(observed), .. } => {
                    observed.last().is_some_and(|&last| committed_writer(last))
                }
                _ => false,
            });
            prop_assume!(victim.is_some());
            let (finals_index, victim) = (history.transactions.len() - 1, victim.unwrap_or(0));
            if let MicroOp::Read { observed: Some(observed), .. } =
                &mut history.transactions[finals_index].ops[victim]
            {
                observed.pop();
            }
            let report = check_list_append(&history, &CheckLimits::default()).unwrap();
            prop_assert!(
                report.count(AnomalyKind::StaleRead) + report.count(AnomalyKind::LostAppend) > 0,
                "{}",
                report
            );
        }
    }

    #[test]
    fn a_hundred_thousand_transactions_check_in_seconds() {
        // Many keys (lists stay short, as a real workload's rotating keys keep them), five
        // transactions in flight at once.
        let mut choices = crate::workload::Choices::new(7);
        let specs: Vec<Spec> = (0..100_000)
            .map(|_| {
                let ops = (0..1 + choices.below(4))
                    .map(|_| (choices.below(2) == 0, choices.below(2_000)))
                    .collect();
                (
                    ops,
                    choices.below(10) as u8,
                    choices.below(2) == 0,
                    choices.below(30),
                    choices.below(30),
                )
            })
            .collect();
        let history = serial_history(&specs, 0);
        let started = std::time::Instant::now();
        let report = check_list_append(&history, &CheckLimits::default()).unwrap();
        assert!(report.is_valid(), "{report}");
        let elapsed = started.elapsed();
        eprintln!("{report} in {elapsed:?}");
        assert!(report.graph_transactions > 70_000);
        // Under a second here in a debug build; the bound only catches a quadratic regression.
        assert!(elapsed < std::time::Duration::from_secs(30), "{elapsed:?}");
    }
}
