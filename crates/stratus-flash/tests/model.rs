//! Model test: random puts, overwrites, deletes, flushes, cleaning passes (with writers racing
//! the cleaner, locked objects, relocations that fail, and passes left unsynced), clean
//! restarts, crashes (some tearing the write in progress), failed segment frees and a disk
//! small enough to fill, against a HashMap. Nothing acknowledged is lost, nothing deleted comes back, nothing is duplicated, and
//! a write the crash tore takes effect whole or not at all.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::{assert_matches_model, delete, index_from, put, small_config, Located, RacingIndex};
use proptest::prelude::*;
use stratus_flash::{
    FlashAddress, FlashError, FlashLog, IoOperation, MemoryDevice, SegmentNumber, SegmentState,
};

#[derive(Clone, Debug)]
enum Op {
    Put {
        key: u8,
        value_bytes: usize,
    },
    Delete {
        key: u8,
    },
    Flush,
    Sync,
    /// A cleaning pass; without `sync` its victim may still be on the device at a crash. The
    /// victim is the cleaner's first choice for `victim` 0, else any closed segment (as another
    /// policy might pick), so passes leave stale copies in segments the policy would not
    /// revisit soon.
    Clean {
        victim: u8,
        racing: Vec<u8>,
        locked: Vec<u8>,
        failing: Vec<u8>,
        sync: bool,
    },
    Restart,
    Crash,
    /// A put, then a crash during the write of the oldest unsynced slot: only its first `keep`
    /// bytes reach the device.
    TornCrash {
        key: u8,
        value_bytes: usize,
        keep: usize,
    },
    /// The next segment free fails (the segment stays, and the next reclaim retries it).
    FailFree,
    /// A put, then a crash after the flush wrote every buffer but before the sync returned:
    /// the device kept some of those slots and not others, in any order (the kernel may write
    /// back unsynced pages out of order). Bit `i` of `lose` drops the `i`th slot written,
    /// unless it is a segment's first (its header; see the note at `SyncFailCrash`'s use).
    SyncFailCrash {
        key: u8,
        value_bytes: usize,
        lose: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0u8..24, 0usize..5000).prop_map(|(key, value_bytes)| Op::Put { key, value_bytes }),
        3 => (0u8..24).prop_map(|key| Op::Delete { key }),
        2 => Just(Op::Flush),
        1 => Just(Op::Sync),
        3 => (
            0u8..4,
            proptest::collection::vec(0u8..24, 0..3),
            proptest::collection::vec(0u8..24, 0..2),
            proptest::collection::vec(0u8..24, 0..2),
            proptest::bool::weighted(0.8),
        )
            .prop_map(|(victim, racing, locked, failing, sync)| Op::Clean {
                victim,
                racing,
                locked,
                failing,
                sync
            }),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
        1 => (0u8..24, 0usize..5000, 0usize..(16 << 10))
            .prop_map(|(key, value_bytes, keep)| Op::TornCrash { key, value_bytes, keep }),
        1 => Just(Op::FailFree),
        1 => (0u8..24, 0usize..5000, any::<u8>())
            .prop_map(|(key, value_bytes, lose)| Op::SyncFailCrash { key, value_bytes, lose }),
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

/// A device the model's writes never fill.
const ROOMY: u64 = 64;
/// A device so small that writes often find it full (`Full`: nothing written) and the cleaner
/// works from its reserve.
const CRAMPED: u64 = 5;

struct Harness {
    device: MemoryDevice,
    log: FlashLog,
    index: HashMap<Vec<u8>, Located>,
    model: HashMap<Vec<u8>, Vec<u8>>,
    /// The model as of everything durable, plus the writes since, in order.
    durable_model: HashMap<Vec<u8>, Vec<u8>>,
    pending: Vec<Acknowledged>,
    next_version: u64,
    /// A crash tore a write: restarts may report tears (until the torn segment is cleaned).
    torn: bool,
    /// A free failure is armed and has not been seen yet.
    free_failure_armed: bool,
}

impl Harness {
    /// A harness on a device of `budget_segments` segments (the cleaner reserves one of them).
    fn new(budget_segments: u64) -> Harness {
        let device = MemoryDevice::new(64 << 10, budget_segments * (64 << 10));
        let log = FlashLog::create(Arc::new(device.clone()), small_config()).unwrap();
        Harness {
            device,
            log,
            index: HashMap::new(),
            model: HashMap::new(),
            durable_model: HashMap::new(),
            pending: Vec::new(),
            next_version: 1,
            torn: false,
            free_failure_armed: false,
        }
    }

    /// `operation`, again while it fails only because a segment's free failed.
    fn tolerating_frees<T>(
        &mut self,
        operation: impl FnMut(&mut Harness) -> Result<T, FlashError>,
    ) -> Result<T, FlashError> {
        let mut operation = operation;
        loop {
            match operation(self) {
                Err(FlashError::Io { operation: IoOperation::Free, .. }) => {
                    self.free_failure_armed = false;
                }
                other => return other,
            }
        }
    }

    /// Puts `key`; `false` when the disk is full (nothing was written).
    fn put(&mut self, key: u8, value_bytes: usize) -> bool {
        let key = key_of(key);
        let value: Vec<u8> =
            (0..value_bytes).map(|byte| (byte as u64 ^ self.next_version) as u8).collect();
        let written = self.tolerating_frees(|harness| {
            put(&harness.log, &mut harness.index, &key, &value, harness.next_version)
        });
        self.next_version += 1;
        match written {
            Ok(end) => {
                self.record(key, Some(value), end);
                true
            }
            Err(FlashError::Full { .. }) => false,
            Err(error) => panic!("put: {error:?}"),
        }
    }

    /// Restarts after a crash in which the device kept the unacknowledged writes for which
    /// `survives(end)` holds.
    fn crash(&mut self, survives: impl Fn(FlashAddress) -> bool) {
        self.settle();
        for write in self.pending.drain(..) {
            if !survives(write.end) {
                continue;
            }
            match write.value {
                Some(value) => self.durable_model.insert(write.key, value),
                None => self.durable_model.remove(&write.key),
            };
        }
        self.model = self.durable_model.clone();
        self.restart();
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
                self.put(*key, *value_bytes);
            }
            Op::Delete { key } => {
                let key = key_of(*key);
                let deleted =
                    self.tolerating_frees(|harness| delete(&harness.log, &mut harness.index, &key));
                match deleted {
                    Ok(Some(end)) => self.record(key, None, end),
                    Ok(None) | Err(FlashError::Full { .. }) => {}
                    Err(error) => panic!("delete: {error:?}"),
                }
            }
            Op::Flush => {
                self.tolerating_frees(|harness| harness.log.flush_ready()).unwrap();
            }
            Op::Sync => {
                self.tolerating_frees(|harness| harness.log.sync()).unwrap();
            }
            Op::Clean { victim, racing, locked, failing, sync } => {
                self.clean(*victim, racing, locked, failing, *sync)
            }
            Op::Restart => {
                self.tolerating_frees(|harness| harness.log.sync()).unwrap();
                self.settle();
                assert!(self.pending.is_empty(), "sync makes every write durable");
                self.restart();
            }
            Op::Crash => self.crash(|_| false),
            Op::SyncFailCrash { key, value_bytes, lose } => {
                if !self.put(*key, *value_bytes) {
                    self.crash(|_| false);
                    self.settle();
                    return;
                }
                let geometry = self.log.config().geometry;
                let first_slot = self.log.durable_end().0;
                let writes_before = self.device.writes();
                self.device.fail_next_syncs(1);
                let failed = self.log.sync();
                assert!(
                    matches!(failed, Err(FlashError::Io { operation: IoOperation::Sync, .. })),
                    "the sync fails after the writes: {failed:?}"
                );
                // Slots are written in address order from the durable end, one write each.
                let written = self.device.writes() - writes_before;
                let mut lost = Vec::new();
                for index in 0..written {
                    let slot = FlashAddress(first_slot + index * geometry.buffer_bytes());
                    let offset = geometry.offset_in_segment(slot);
                    // A lost header slot under a kept later slot is refused at restart as
                    // corruption (recovery will not guess whether the segment's entries were
                    // acknowledged); that refusal is documented, not checked here.
                    if index < 8 && lose & (1 << index) != 0 && offset != 0 {
                        let zeros = vec![0u8; geometry.buffer_bytes() as usize];
                        self.device.corrupt(geometry.segment_of(slot), offset as usize, &zeros);
                        lost.push(slot.0);
                    }
                }
                self.crash(|end| !lost.contains(&geometry.slot_of(FlashAddress(end.0 - 1)).0));
            }
            Op::TornCrash { key, value_bytes, keep } => {
                if !self.put(*key, *value_bytes) {
                    // Full: maybe nothing to write, so no write to tear.
                    self.crash(|_| false);
                    self.settle();
                    return;
                }
                // The oldest unsynced slot starts at the durable end; it is written first, and
                // the write that tears stops the flush, so nothing after it reaches the device.
                let cut = FlashAddress(self.log.durable_end().0 + *keep as u64);
                self.device.tear_next_write(*keep);
                let torn = self.log.sync();
                assert!(
                    matches!(torn, Err(FlashError::Io { operation: IoOperation::Write, .. })),
                    "the sync meets the torn write: {torn:?}"
                );
                self.torn = true;
                self.crash(|end| end <= cut);
            }
            Op::FailFree => {
                self.device.fail_next_frees(1);
                self.free_failure_armed = true;
            }
        }
        self.settle();
    }

    fn clean(&mut self, victim: u8, racing: &[u8], locked: &[u8], failing: &[u8], sync: bool) {
        let closed: Vec<SegmentNumber> = self
            .log
            .segment_stats()
            .into_iter()
            .filter(|stats| stats.state == SegmentState::Closed)
            .map(|stats| stats.segment)
            .collect();
        let chosen = match victim {
            0 => self.log.segments_to_clean().first().copied(),
            _ if closed.is_empty() => None,
            _ => Some(closed[victim as usize % closed.len()]),
        };
        let Some(segment) = chosen else { return };
        let mut racing_index = RacingIndex {
            log: &self.log,
            index: &mut self.index,
            racing: racing.iter().map(|&key| key_of(key)).collect(),
            locked: locked.iter().map(|&key| key_of(key)).collect(),
            failing: failing.iter().map(|&key| key_of(key)).collect(),
            next_version: &mut self.next_version,
            raced: Vec::new(),
        };
        let result = self.log.clean_segment(segment, &mut racing_index);
        let raced = std::mem::take(&mut racing_index.raced);
        for (key, value) in raced {
            let end = {
                let located = self.index[&key];
                FlashAddress(located.address.0 + located.entry_bytes as u64)
            };
            self.record(key, Some(value), end);
        }
        let state = self.log.segment_stats().into_iter().find(|stats| stats.segment == segment);
        let state = state.map(|stats| stats.state);
        let completed = match result {
            Ok(outcome) if outcome.gave_up_on_lock => false,
            Ok(_) => true,
            // A failing relocation, or the cleaner's reserve exhausted.
            Err(FlashError::Full { .. }) => false,
            Err(FlashError::Io { operation: IoOperation::Free, .. }) => {
                // A flush inside the pass could not free another segment; the pass stopped.
                self.free_failure_armed = false;
                false
            }
            Err(error) => panic!("cleaning {segment:?}: {error:?}"),
        };
        if completed {
            assert!(!matches!(state, Some(SegmentState::Closed)));
        } else {
            assert_eq!(state, Some(SegmentState::Closed), "a pass that stops leaves it closed");
        }
        if !sync {
            return;
        }
        // Freed once the copies are durable and no read is in flight (none here).
        let free_may_fail = self.free_failure_armed;
        self.tolerating_frees(|harness| harness.log.sync()).unwrap();
        let state = self.log.segment_stats().into_iter().find(|stats| stats.segment == segment);
        if completed && !free_may_fail {
            assert_eq!(state, None, "a cleaned segment is freed after its copies are durable");
        }
    }

    fn restart(&mut self) {
        // Recovery frees a head segment torn before its header reached the device; an injected
        // free failure makes it fail, and it is run again.
        let (log, recovery) = self
            .tolerating_frees(|harness| {
                stratus_flash::recover(Arc::new(harness.device.clone()), small_config())
            })
            .unwrap();
        if !self.torn {
            assert!(
                recovery.tears.is_empty(),
                "no tears without torn writes: {:?}",
                recovery.tears
            );
        }
        self.log = log;
        self.index = index_from(&recovery);
        self.next_version = self.next_version.max(recovery.version_max + 1);
        let recovered: HashSet<&Vec<u8>> = self.index.keys().collect();
        let expected: HashSet<&Vec<u8>> = self.model.keys().collect();
        assert_eq!(recovered, expected, "restart recovers exactly the acknowledged keys");
    }
}

proptest! {
    // A fixed seed: the same 128 cases every run (tests here are deterministic). Failures that
    // other seeds found are kept as their own tests below.
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_F1A5),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_log_holds_exactly_what_the_model_holds(
        ops in proptest::collection::vec(op(), 1..120),
        budget_segments in prop_oneof![Just(ROOMY), Just(CRAMPED)],
    ) {
        let mut harness = Harness::new(budget_segments);
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
    ops.push(Op::Clean { victim: 0, racing: vec![], locked: vec![3], failing: vec![], sync: true });
    ops.extend([Op::Delete { key: 15 }, Op::Sync, Op::Restart]);
    ops.push(Op::Clean { victim: 0, racing: vec![], locked: vec![], failing: vec![], sync: true });
    ops.extend([put(0, 1), Op::Restart]);
    let mut harness = Harness::new(ROOMY);
    for op in &ops {
        harness.apply(op);
        assert_matches_model(&harness.log, &harness.index, &harness.model);
    }
}

/// Found by this model once it could tear writes: an overwrite appended the old version's
/// tombstone before the new object, and a crash that tore the write between them kept the
/// tombstone alone: the acknowledged old value was killed and nothing replaced it (key 3 was
/// lost). The object now comes first; a prefix holding it without the tombstone is a whole
/// overwrite.
#[test]
fn a_torn_overwrite_keeps_the_old_value_or_the_new_one_never_neither() {
    let put = |key: u8, value_bytes: usize| Op::Put { key, value_bytes };
    let mut ops = vec![put(0, 2340), put(5, 4172), put(3, 4300), put(0, 1820), put(3, 3364)];
    ops.extend([put(0, 660), put(5, 4988), Op::Flush]);
    ops.push(Op::TornCrash { key: 0, value_bytes: 0, keep: 48 });
    let mut harness = Harness::new(ROOMY);
    for op in &ops {
        harness.apply(op);
        assert_matches_model(&harness.log, &harness.index, &harness.model);
    }
}

/// Found by this model once passes could be left unsynced: a pass over a segment holding only
/// a deleted object copied nothing, so the segment was freed at the next flush while the
/// delete's tombstone was still in a buffer; the crash lost the delete and the acknowledged
/// object with it.
#[test]
fn a_crash_after_an_unsynced_pass_keeps_an_object_whose_delete_was_not_durable() {
    let clean =
        Op::Clean { victim: 0, racing: vec![], locked: vec![], failing: vec![], sync: false };
    let ops = [Op::Put { key: 10, value_bytes: 0 }, Op::Restart, Op::Delete { key: 10 }];
    let ops = ops.into_iter().chain([clean, Op::Flush, Op::Crash]);
    let mut harness = Harness::new(ROOMY);
    for op in ops {
        harness.apply(&op);
        assert_matches_model(&harness.log, &harness.index, &harness.model);
    }
}
