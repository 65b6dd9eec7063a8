//! The master's request and recovery metrics.
//!
//! Every request is counted and timed by operation, on the request path: the operation is an
//! index into fixed arrays (no map, no allocation), and recording is two relaxed atomic adds on
//! a cache line of the recording thread's own (see `stratus_ops::histogram`). The time is from
//! the request's arrival in [`Master`](crate::Master)'s handler until its response is ready:
//! for a change to the log, until it is on every backup.

use std::sync::atomic::{AtomicU64, Ordering};

use stratus_ops::{HistogramSnapshot, LatencyHistogram, ShardedCounter};
use stratus_wire::Opcode;
use tokio::time::Instant;

/// What a master is asked to do, as its metrics count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// READ.
    Read,
    /// WRITE.
    Write,
    /// REMOVE.
    Remove,
    /// INCREMENT.
    Increment,
    /// MULTI_READ.
    MultiRead,
    /// MULTI_WRITE.
    MultiWrite,
    /// MULTI_REMOVE.
    MultiRemove,
    /// MULTI_INCREMENT.
    MultiIncrement,
    /// TX_PREPARE (transactions' votes and read-only validations).
    TxPrepare,
    /// TX_DECISION.
    TxDecision,
    /// TX_REQUEST_ABORT (a participant finishing a transaction whose client died).
    TxRequestAbort,
    /// ENUMERATE.
    Enumerate,
    /// RECOVER_TABLETS.
    RecoverTablets,
    /// Everything else: PING, statistics, tablet ownership, and opcodes a master does not
    /// serve.
    Control,
}

impl Operation {
    /// How many there are.
    pub const COUNT: usize = 14;

    /// Every operation, in index order.
    pub const ALL: [Operation; Operation::COUNT] = [
        Operation::Read,
        Operation::Write,
        Operation::Remove,
        Operation::Increment,
        Operation::MultiRead,
        Operation::MultiWrite,
        Operation::MultiRemove,
        Operation::MultiIncrement,
        Operation::TxPrepare,
        Operation::TxDecision,
        Operation::TxRequestAbort,
        Operation::Enumerate,
        Operation::RecoverTablets,
        Operation::Control,
    ];

    /// The operation's name in metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::Remove => "remove",
            Operation::Increment => "increment",
            Operation::MultiRead => "multi_read",
            Operation::MultiWrite => "multi_write",
            Operation::MultiRemove => "multi_remove",
            Operation::MultiIncrement => "multi_increment",
            Operation::TxPrepare => "tx_prepare",
            Operation::TxDecision => "tx_decision",
            Operation::TxRequestAbort => "tx_request_abort",
            Operation::Enumerate => "enumerate",
            Operation::RecoverTablets => "recover_tablets",
            Operation::Control => "control",
        }
    }

    /// True for the multi-operations, whose items are counted too.
    pub fn is_multi(self) -> bool {
        matches!(
            self,
            Operation::MultiRead
                | Operation::MultiWrite
                | Operation::MultiRemove
                | Operation::MultiIncrement
                | Operation::TxPrepare
                | Operation::TxDecision
                | Operation::TxRequestAbort
        )
    }

    /// The operation of a request with opcode `code` (decoded or not).
    pub fn of_opcode(code: u16) -> Operation {
        match Opcode::from_code(code) {
            Some(Opcode::Read) => Operation::Read,
            Some(Opcode::Write) => Operation::Write,
            Some(Opcode::Remove) => Operation::Remove,
            Some(Opcode::Increment) => Operation::Increment,
            Some(Opcode::MultiRead) => Operation::MultiRead,
            Some(Opcode::MultiWrite) => Operation::MultiWrite,
            Some(Opcode::MultiRemove) => Operation::MultiRemove,
            Some(Opcode::MultiIncrement) => Operation::MultiIncrement,
            Some(Opcode::TxPrepare) => Operation::TxPrepare,
            Some(Opcode::TxDecision) => Operation::TxDecision,
            Some(Opcode::TxRequestAbort) => Operation::TxRequestAbort,
            Some(Opcode::Enumerate) => Operation::Enumerate,
            Some(Opcode::RecoverTablets) => Operation::RecoverTablets,
            _ => Operation::Control,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// A master's request and recovery figures since it started.
#[derive(Debug)]
pub struct MasterMetrics {
    /// Time to answer, per operation (the count of each is its histogram's count).
    latency: [LatencyHistogram; Operation::COUNT],
    /// Objects named by multi-operations, per operation (zero for the others).
    items: [ShardedCounter; Operation::COUNT],
    /// Recovery work done here.
    pub(crate) recovery: RecoveryCounters,
}

impl Default for MasterMetrics {
    fn default() -> MasterMetrics {
        MasterMetrics {
            latency: std::array::from_fn(|_| LatencyHistogram::new()),
            items: std::array::from_fn(|_| ShardedCounter::new()),
            recovery: RecoveryCounters::default(),
        }
    }
}

impl MasterMetrics {
    /// Counts one answered request of `operation` that arrived at `started`.
    #[inline]
    pub(crate) fn record(&self, operation: Operation, started: Instant) {
        self.latency[operation.index()].record(started.elapsed());
    }

    /// Counts `items` objects named by one multi-operation.
    #[inline]
    pub(crate) fn add_items(&self, operation: Operation, items: usize) {
        self.items[operation.index()].add(items as u64);
    }

    /// The latencies of `operation`'s answered requests.
    pub fn latency(&self, operation: Operation) -> HistogramSnapshot {
        self.latency[operation.index()].snapshot()
    }

    /// Objects named by `operation`'s requests (multi-operations only).
    pub fn items(&self, operation: Operation) -> u64 {
        self.items[operation.index()].get()
    }

    /// Requests answered, all operations together.
    pub fn requests_answered(&self) -> u64 {
        Operation::ALL.iter().map(|&operation| self.latency(operation).count()).sum()
    }

    /// Recovery work so far.
    pub fn recovery(&self) -> RecoveryStatistics {
        let counters = &self.recovery;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RecoveryStatistics {
            partitions_started: load(&counters.partitions_started),
            partitions_succeeded: load(&counters.partitions_succeeded),
            partitions_failed: load(&counters.partitions_failed),
            segments_read: load(&counters.segments_read),
            replica_bytes_read: load(&counters.replica_bytes_read),
            segments_replayed: load(&counters.segments_replayed),
            objects_replayed: load(&counters.objects_replayed),
        }
    }
}

/// Counters of the recovery work a master does for crashed masters (a few updates per
/// segment, off the request path).
#[derive(Debug, Default)]
pub(crate) struct RecoveryCounters {
    pub(crate) partitions_started: AtomicU64,
    pub(crate) partitions_succeeded: AtomicU64,
    pub(crate) partitions_failed: AtomicU64,
    pub(crate) segments_read: AtomicU64,
    pub(crate) replica_bytes_read: AtomicU64,
    pub(crate) segments_replayed: AtomicU64,
    pub(crate) objects_replayed: AtomicU64,
}

impl RecoveryCounters {
    pub(crate) fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }
}

/// The recovery work a master did since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryStatistics {
    /// Partitions of crashed masters' tablets this master was asked to recover (and accepted).
    pub partitions_started: u64,
    /// Of those, replayed and durable here.
    pub partitions_succeeded: u64,
    /// Of those, failed (the coordinator retries them, here or elsewhere).
    pub partitions_failed: u64,
    /// Segments read from backups (a partition's share of each), as they arrive.
    pub segments_read: u64,
    /// Bytes of those reads.
    pub replica_bytes_read: u64,
    /// Segments replayed.
    pub segments_replayed: u64,
    /// Objects written into this master's log by replays.
    pub objects_replayed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_master_opcode_has_its_operation_and_the_rest_are_control() {
        for (index, operation) in Operation::ALL.iter().enumerate() {
            assert_eq!(operation.index(), index, "ALL is in index order");
        }
        assert_eq!(Operation::of_opcode(Opcode::Read.code()), Operation::Read);
        assert_eq!(Operation::of_opcode(Opcode::MultiIncrement.code()), Operation::MultiIncrement);
        assert_eq!(Operation::of_opcode(Opcode::RecoverTablets.code()), Operation::RecoverTablets);
        assert_eq!(Operation::of_opcode(Opcode::Ping.code()), Operation::Control);
        assert_eq!(Operation::of_opcode(Opcode::GetServerStatistics.code()), Operation::Control);
        assert_eq!(Operation::of_opcode(0xffff), Operation::Control);
        let names: std::collections::BTreeSet<&str> =
            Operation::ALL.iter().map(|operation| operation.name()).collect();
        assert_eq!(names.len(), Operation::COUNT, "names are distinct");
    }

    #[test]
    fn requests_are_counted_per_operation() {
        let metrics = MasterMetrics::default();
        let started = Instant::now();
        metrics.record(Operation::Read, started);
        metrics.record(Operation::Read, started);
        metrics.record(Operation::MultiWrite, started);
        metrics.add_items(Operation::MultiWrite, 7);
        assert_eq!(metrics.latency(Operation::Read).count(), 2);
        assert_eq!(metrics.latency(Operation::Write).count(), 0);
        assert_eq!(metrics.items(Operation::MultiWrite), 7);
        assert_eq!(metrics.requests_answered(), 3);
    }
}
