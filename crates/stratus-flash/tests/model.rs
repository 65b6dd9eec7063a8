//! Model test: random puts, overwrites, deletes, flushes, cleaning passes (with writers racing
//! the cleaner and locked objects), clean restarts and crashes, against a HashMap. Nothing
//! acknowledged is lost, nothing deleted comes back, nothing is duplicated.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::{
    assert_matches_model, delete, index_from, put, restart, small_config, Located, RacingIndex,
};
use proptest::prelude::*;
use stratus_flash::{FlashAddress, FlashLog, MemoryDevice, SegmentState};

#[derive(Clone, Debug)]
enum Op {
    Put { key: u8, value_bytes: usize },
    Delete { key: u8 },
    Flush,
    Sync,
    Clean { racing: Vec<u8>, locked: Vec<u8> },
    Restart,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0u8..24, 0usize..5000).prop_map(|(key, value_bytes)| Op::Put { key, value_bytes }),
        3 => (0u8..24).prop_map(|key| Op::Delete { key }),
        2 => Just(Op::Flush),
        1 => Just(Op::Sync),
        3 => (proptest::collection::vec(0u8..24, 0..3), proptest::collection::vec(0u8..24, 0..2))
            .prop_map(|(racing, locked)| Op::Clean { racing, locked }),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
    ]
}

fn key_of(key: u8) -> Vec<u8> {
    format!("key-{key}").into_bytes()
}

/// A write the model holds, and where its last entry ends (durable once the log is past it).
struct Acknowledged {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    end: FlashAddress,
}

struct Harness {
    device: MemoryDevice,
    log: FlashLog,
    index: HashMap<Vec<u8>, Located>,
    model: HashMap<Vec<u8>, Vec<u8>>,
    /// The model as of everything durable, plus the writes since, in order.
    durable_model: HashMap<Vec<u8>, Vec<u8>>,
    pending: Vec<Acknowledged>,
    next_version: u64,
}

impl Harness {
    fn new() -> Harness {
        let device = MemoryDevice::new(64 << 10, 64 * (64 << 10));
        let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
        Harness {
            device,
            log,
            index: HashMap::new(),
            model: HashMap::new(),
            durable_model: HashMap::new(),
            pending: Vec::new(),
            next_version: 1,
        }
    }

    fn record(&mut self, key: Vec<u8>, value: Option<Vec<u8>>, end: FlashAddress) {
        match &value {
            Some(value) => self.model.insert(key.clone(), value.clone()),
            None => self.model.remove(&key),
        };
        self.pending.push(Acknowledged { key, value, end });
    }

    /// Moves every write now durable into the durable model.
    fn settle(&mut self) {
        let durable_end = self.log.durable_end();
        let durable = self.pending.iter().take_while(|write| write.end <= durable_end).count();
        for write in self.pending.drain(..durable) {
            match write.value {
                Some(value) => self.durable_model.insert(write.key, value),
                None => self.durable_model.remove(&write.key),
            };
        }
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Put { key, value_bytes } => {
                let key = key_of(*key);
                let value: Vec<u8> =
                    (0..*value_bytes).map(|byte| (byte as u64 ^ self.next_version) as u8).collect();
                let end = put(&self.log, &mut self.index, &key, &value, self.next_version).unwrap();
                self.next_version += 1;
                self.record(key, Some(value), end);
            }
            Op::Delete { key } => {
                let key = key_of(*key);
                if let Some(end) = delete(&self.log, &mut self.index, &key).unwrap() {
                    self.record(key, None, end);
                }
            }
            Op::Flush => {
                self.log.flush_ready().unwrap();
            }
            Op::Sync => {
                self.log.sync().unwrap();
            }
            Op::Clean { racing, locked } => self.clean(racing, locked),
            Op::Restart => {
                self.log.sync().unwrap();
                self.settle();
                assert!(self.pending.is_empty(), "sync makes every write durable");
                self.restart();
            }
            Op::Crash => {
                self.settle();
                self.pending.clear();
                self.model = self.durable_model.clone();
                self.restart();
            }
        }
        self.settle();
    }

    fn clean(&mut self, racing: &[u8], locked: &[u8]) {
        let Some(&segment) = self.log.segments_to_clean().first() else { return };
        let mut racing_index = RacingIndex {
            log: &self.log,
            index: &mut self.index,
            racing: racing.iter().map(|&key| key_of(key)).collect(),
            locked: locked.iter().map(|&key| key_of(key)).collect(),
            next_version: &mut self.next_version,
            raced: Vec::new(),
        };
        let outcome = self.log.clean_segment(segment, &mut racing_index).unwrap();
        let raced = std::mem::take(&mut racing_index.raced);
        for (key, value) in raced {
            let end = {
                let located = self.index[&key];
                FlashAddress(located.address.0 + located.entry_bytes as u64)
            };
            self.record(key, Some(value), end);
        }
        let state = self.log.segment_stats().into_iter().find(|stats| stats.segment == segment);
        if outcome.gave_up_on_lock {
            assert_eq!(state.map(|stats| stats.state), Some(SegmentState::Closed));
        } else {
            assert!(!matches!(state.map(|stats| stats.state), Some(SegmentState::Closed)));
        }
        // Freed once the copies are durable and no read is in flight (none here).
        self.log.sync().unwrap();
        let state = self.log.segment_stats().into_iter().find(|stats| stats.segment == segment);
        if !outcome.gave_up_on_lock {
            assert_eq!(state, None, "a cleaned segment is freed after its copies are durable");
        }
    }

    fn restart(&mut self) {
        let (log, recovery) = restart(&self.device, small_config());
        assert!(recovery.tears.is_empty(), "no torn writes without faults: {:?}", recovery.tears);
        self.log = log;
        self.index = index_from(&recovery);
        self.next_version = self.next_version.max(recovery.version_max + 1);
        let recovered: HashSet<&Vec<u8>> = self.index.keys().collect();
        let expected: HashSet<&Vec<u8>> = self.model.keys().collect();
        assert_eq!(recovered, expected, "restart recovers exactly the acknowledged keys");
    }
}

proptest! {
    // A fixed seed: the same 128 cases every run (tests here are deterministic). A failure a
    // random seed once found is kept as its own test below.
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_F1A5),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_log_holds_exactly_what_the_model_holds(ops in proptest::collection::vec(op(), 1..120)) {
        let mut harness = Harness::new();
        for op in &ops {
            harness.apply(op);
            assert_matches_model(&harness.log, &harness.index, &harness.model);
        }
        // A last clean restart recovers the same.
        harness.apply(&Op::Restart);
        assert_matches_model(&harness.log, &harness.index, &harness.model);
        // Live bytes never exceed what a segment holds (the accounting stays sane).
        for stats in harness.log.segment_stats() {
            prop_assert!(stats.live_bytes <= stats.appended_bytes);
        }
    }
}

/// Found by this model with a random seed: a cleaning pass that gives up on a locked object
/// after it has moved others leaves their originals in the segment as same-version stale
/// copies. A delete's tombstone names the copy; cleaning the copy's segment used to drop the
/// tombstone once the copy's segment went (the version it kills was there), and a restart then
/// found the stale original with nothing to kill it: the deleted key came back. The victim now
/// records the keys it may hold stale copies of, and their tombstones are kept while it holds
/// entries (docs/design/flash-format.md, "Stale copies").
#[test]
fn a_deleted_key_stays_deleted_after_an_abandoned_cleaning_pass_left_stale_copies() {
    let put = |key: u8, value_bytes: usize| Op::Put { key, value_bytes };
    let mut ops = vec![put(1, 0), put(0, 0), Op::Crash, put(0, 0), put(0, 0), put(6, 548)];
    ops.extend([put(7, 3764), put(0, 0), put(2, 1164), put(0, 996), put(15, 0), put(0, 852)]);
    ops.extend([put(8, 2388), put(4, 1300), put(5, 3644), put(3, 3124), put(9, 2820)]);
    ops.extend([put(1, 620), put(6, 500), put(19, 899), Op::Restart]);
    ops.push(Op::Clean { racing: vec![], locked: vec![3] });
    ops.extend([Op::Delete { key: 15 }, Op::Sync, Op::Restart]);
    ops.push(Op::Clean { racing: vec![], locked: vec![] });
    ops.extend([put(0, 1), Op::Restart]);
    let mut harness = Harness::new();
    for op in &ops {
        harness.apply(op);
        assert_matches_model(&harness.log, &harness.index, &harness.model);
    }
}
