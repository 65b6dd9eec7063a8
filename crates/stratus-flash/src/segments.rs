//! The segment table: every segment's state and live bytes, the cleaner's cost-benefit ranking,
//! and the read epochs that decide when a freed segment's space may be reused.
//!
//! Segment life (one transition table, here and in docs/design/flash-format.md):
//!
//! | from      | to        | when                                                          |
//! |-----------|-----------|---------------------------------------------------------------|
//! | (none)    | Open      | the head reaches the segment's first slot (device allocate)    |
//! | Open      | Closed    | the segment's last slot is flushed                             |
//! | Closed    | Cleaned   | the cleaner relocated its live entries (copies may be buffered)|
//! | Cleaned   | Freeing   | the log is durable past everything appended before the pass end|
//! | Freeing   | (none)    | every read that began before `Freeing` has ended (device free) |
//!
//! Read epochs: a read registers the current epoch and checks the segment's state under the
//! same lock. Entering `Freeing` takes the current epoch and advances it, so a read that saw the
//! segment readable holds an epoch no newer than the segment's, and a read that starts later
//! sees `Freeing` and gets `SegmentFreed`. The device frees the segment only when no read with an
//! epoch at or below it remains.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::{Hash, Hasher};

use crate::address::{FlashAddress, SegmentNumber};
use crate::constants::CLEANABLE_LIVE_PERCENT_MAX;

/// Where a segment is in its life (see the module's transition table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// The head is in it: some of its slots are in buffers or not yet assigned.
    Open,
    /// Every slot is on the device; a cleaning candidate.
    Closed,
    /// Its live entries were relocated; it is freed once the log is durable past `durable_at`:
    /// the head's position when the pass ended, so past the copies and past every tombstone or
    /// newer version that made its other entries dead.
    Cleaned {
        /// The end of the slot the head was in when the pass ended.
        durable_at: u64,
    },
    /// Waiting for the reads that may point into it to end.
    Freeing {
        /// The read epoch it was retired in.
        epoch: u64,
    },
}

/// One segment's accounting, as reported by `FlashLog::segment_stats`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentStats {
    /// The segment.
    pub segment: SegmentNumber,
    /// Its state.
    pub state: SegmentState,
    /// Entry bytes flushed into it (padding included; headers and slot tails excluded).
    pub appended_bytes: u64,
    /// Of those, bytes not yet noted dead.
    pub live_bytes: u64,
}

/// How the cleaner ranks segments (`u` = live bytes / segment bytes, `age` = segments closed
/// since this one, plus one). The same two formulas as the memory cleaner
/// (`stratus_store::cleaner::CostBenefit`), with a logical age instead of seconds so the core
/// reads no clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostBenefit {
    /// `(1 − u) · age / u`: RAMCloud's in-memory formula (cleaning costs only the copy).
    AgeOverUtilization,
    /// `(1 − u) · age / (1 + u)`: LFS's formula (Rosenblum's Eq.), which also counts reading
    /// the segment. The default here: cleaning a flash segment does read all of it.
    AgeOverOnePlusUtilization,
}

impl CostBenefit {
    /// The score of a segment: higher is cleaned first.
    pub fn score(self, live_fraction: f64, age: u64) -> f64 {
        let age = (age + 1) as f64;
        let free = 1.0 - live_fraction;
        match self {
            CostBenefit::AgeOverUtilization if live_fraction <= 0.0 => f64::INFINITY,
            CostBenefit::AgeOverUtilization => free * age / live_fraction,
            CostBenefit::AgeOverOnePlusUtilization => free * age / (1.0 + live_fraction),
        }
    }
}

#[derive(Debug)]
struct SegmentInfo {
    state: SegmentState,
    appended_bytes: u64,
    dead_bytes: u64,
    /// The value of `closed_count` when the segment closed (its logical birth time).
    closed_at: u64,
    /// Hashes (`key_hash`) of the keys this segment may hold a *stale copy* of: an object
    /// version that also exists elsewhere (the cleaner copied it out, or a restart found it
    /// twice) or that no tombstone names by its segment. A tombstone of such a key is kept
    /// while the segment holds entries; see `may_hold_stale`.
    stale_keys: HashSet<u64>,
    /// Where the restart scan found bytes that do not verify in this segment (a write torn by
    /// the crash, or corruption already there): nothing past them was indexed, so a cleaning
    /// walk that stops at exactly these places frees nothing the index knows.
    recovered_tears: Vec<FlashAddress>,
}

/// Why a read may not proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadRefusal {
    /// The segment was freed or is being freed.
    Freed,
    /// The segment was never allocated.
    NotWritten,
}

/// The table; see the module documentation. Owned by the log under one lock.
#[derive(Debug)]
pub(crate) struct SegmentTable {
    segments: BTreeMap<SegmentNumber, SegmentInfo>,
    /// The highest segment number ever allocated (0: none).
    highest: SegmentNumber,
    closed_count: u64,
    segment_bytes: u64,
    epoch: u64,
    /// Reads in progress, by the epoch they registered in.
    readers: BTreeMap<u64, usize>,
    /// Segments with a non-empty `stale_keys`, so `may_hold_stale` looks at few segments.
    with_stale_keys: BTreeSet<SegmentNumber>,
}

/// The hash under which a segment records a key it may hold a stale copy of. Only ever
/// compared in memory (never written), so any fixed hasher will do; a collision only keeps a
/// tombstone longer than needed, never drops one that is needed.
pub(crate) fn key_hash(table_id: u64, key: &[u8]) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    table_id.hash(&mut hasher);
    key.hash(&mut hasher);
    hasher.finish()
}

impl SegmentTable {
    pub(crate) fn new(segment_bytes: u64) -> SegmentTable {
        SegmentTable {
            segments: BTreeMap::new(),
            highest: SegmentNumber(0),
            closed_count: 0,
            segment_bytes,
            epoch: 0,
            readers: BTreeMap::new(),
            with_stale_keys: BTreeSet::new(),
        }
    }

    /// A segment the head has just entered.
    pub(crate) fn open(&mut self, segment: SegmentNumber) {
        assert!(segment > self.highest, "segment {segment:?} opened out of order");
        self.highest = segment;
        let info = SegmentInfo {
            state: SegmentState::Open,
            appended_bytes: 0,
            dead_bytes: 0,
            closed_at: 0,
            stale_keys: HashSet::new(),
            recovered_tears: Vec::new(),
        };
        self.segments.insert(segment, info);
    }

    /// A closed segment found on the device at restart, with its bytes and dead bytes, the keys
    /// it may hold stale copies of, and where its walk met bytes that do not verify.
    pub(crate) fn adopt(
        &mut self,
        segment: SegmentNumber,
        appended_bytes: u64,
        dead_bytes: u64,
        stale_keys: HashSet<u64>,
        recovered_tears: Vec<FlashAddress>,
    ) {
        assert!(segment > self.highest, "segment {segment:?} adopted out of order");
        assert!(dead_bytes <= appended_bytes);
        self.highest = segment;
        self.closed_count += 1;
        if !stale_keys.is_empty() {
            self.with_stale_keys.insert(segment);
        }
        let info = SegmentInfo {
            state: SegmentState::Closed,
            appended_bytes,
            dead_bytes,
            closed_at: self.closed_count,
            stale_keys,
            recovered_tears,
        };
        self.segments.insert(segment, info);
    }

    /// Records that `segment` may hold a stale copy of the key `key_hash`: the cleaner is about
    /// to copy one of its objects elsewhere. Moot once the segment is being freed.
    pub(crate) fn note_stale(&mut self, segment: SegmentNumber, key_hash: u64) {
        let Some(info) = self.segments.get_mut(&segment) else { return };
        if matches!(info.state, SegmentState::Freeing { .. }) {
            return;
        }
        info.stale_keys.insert(key_hash);
        self.with_stale_keys.insert(segment);
    }

    /// Whether a segment other than `except`, still holding entries, may hold a stale copy of
    /// the key `key_hash`: a tombstone of that key must then be kept, whatever segment its dead
    /// address names, or a restart would find the stale copy with nothing to kill it.
    pub(crate) fn may_hold_stale(&self, key_hash: u64, except: SegmentNumber) -> bool {
        self.with_stale_keys.iter().any(|&segment| {
            segment != except
                && self.segments.get(&segment).is_some_and(|info| {
                    !matches!(info.state, SegmentState::Freeing { .. })
                        && info.stale_keys.contains(&key_hash)
                })
        })
    }

    /// Where the restart scan found bytes in `segment` that do not verify.
    pub(crate) fn recovered_tears(&self, segment: SegmentNumber) -> &[FlashAddress] {
        self.segments.get(&segment).map_or(&[], |info| &info.recovered_tears)
    }

    /// Bytes of entries flushed into an open segment.
    pub(crate) fn add_appended(&mut self, segment: SegmentNumber, bytes: u64) {
        let info = self.segments.get_mut(&segment).expect("flushed into a segment in the table");
        assert_eq!(info.state, SegmentState::Open, "flushed into a segment that is not open");
        info.appended_bytes += bytes;
    }

    /// Open → Closed.
    pub(crate) fn close(&mut self, segment: SegmentNumber) {
        self.closed_count += 1;
        let info = self.segments.get_mut(&segment).expect("closing a segment in the table");
        assert_eq!(info.state, SegmentState::Open);
        // See `note_dead`: an over-count is the caller's bug, clamped outside tests.
        debug_assert!(
            info.dead_bytes <= info.appended_bytes,
            "more bytes noted dead than appended"
        );
        info.dead_bytes = info.dead_bytes.min(info.appended_bytes);
        info.state = SegmentState::Closed;
        info.closed_at = self.closed_count;
    }

    /// Records `bytes` of `segment` as dead. `false` when the segment is already being freed or
    /// gone (the note is then moot).
    pub(crate) fn note_dead(&mut self, segment: SegmentNumber, bytes: u64) -> bool {
        let Some(info) = self.segments.get_mut(&segment) else { return false };
        // An open segment may hear of a death before the flush that counts the bytes appended.
        let bound = match info.state {
            SegmentState::Open => self.segment_bytes,
            _ => info.appended_bytes,
        };
        // Over-counting is the caller's bug (an entry noted dead twice, or a wrong size): caught
        // in tests, clamped in production so the counts stay usable (the segment merely looks
        // emptier than it is, and cleaning it relocates what is live anyway).
        debug_assert!(
            info.dead_bytes + bytes <= bound,
            "segment {segment:?}: more bytes noted dead than it holds"
        );
        info.dead_bytes = (info.dead_bytes + bytes).min(bound);
        true
    }

    /// Whether entries of `segment` still exist on the device for a restart to find (a tombstone
    /// pointing into it is still needed).
    pub(crate) fn holds_entries(&self, segment: SegmentNumber) -> bool {
        self.segments
            .get(&segment)
            .is_some_and(|info| !matches!(info.state, SegmentState::Freeing { .. }))
    }

    /// The state of `segment`, if it is in the table.
    pub(crate) fn state(&self, segment: SegmentNumber) -> Option<SegmentState> {
        self.segments.get(&segment).map(|info| info.state)
    }

    /// Closed → Cleaned.
    pub(crate) fn mark_cleaned(&mut self, segment: SegmentNumber, durable_at: u64) {
        let info = self.segments.get_mut(&segment).expect("cleaning a segment in the table");
        assert_eq!(info.state, SegmentState::Closed, "cleaning a segment that is not closed");
        info.state = SegmentState::Cleaned { durable_at };
    }

    /// Cleaned → Freeing for every cleaned segment with `durable_at` at or below `durable_end`.
    /// From here on the segment counts as gone for the tombstones that protect against its
    /// entries (`holds_entries`, `may_hold_stale`), so its stale keys are forgotten.
    pub(crate) fn retire_cleaned(&mut self, durable_end: u64) {
        for (segment, info) in self.segments.iter_mut() {
            if let SegmentState::Cleaned { durable_at } = info.state {
                if durable_at <= durable_end {
                    info.state = SegmentState::Freeing { epoch: self.epoch };
                    self.epoch += 1;
                    info.stale_keys = HashSet::new();
                    self.with_stale_keys.remove(segment);
                }
            }
        }
    }

    /// The freeing segments no read can still point into, in the order they entered `Freeing`.
    /// They stay in the table (and count against the budget) until `forget` after their device
    /// free succeeded, so a failed free is retried by the next `reclaim`.
    ///
    /// The order matters for restart: a tombstone is dropped by the cleaner only once what it
    /// protects against is in segments already `Freeing`; the tombstone's own segment enters
    /// `Freeing` later (a later epoch), so freeing in epoch order, and stopping at a failure,
    /// never leaves a killed object on the device after its tombstone is gone.
    pub(crate) fn reclaimable(&self) -> Vec<SegmentNumber> {
        let oldest_reader = self.readers.keys().next().copied();
        let mut freeing: Vec<(u64, SegmentNumber)> = self
            .segments
            .iter()
            .filter_map(|(&segment, info)| match info.state {
                SegmentState::Freeing { epoch }
                    if oldest_reader.is_none_or(|oldest| oldest > epoch) =>
                {
                    Some((epoch, segment))
                }
                _ => None,
            })
            .collect();
        freeing.sort_unstable();
        freeing.into_iter().map(|(_, segment)| segment).collect()
    }

    /// Removes a freeing segment whose device space has been freed.
    pub(crate) fn forget(&mut self, segment: SegmentNumber) {
        let info = self.segments.remove(&segment).expect("forgetting a segment in the table");
        assert!(
            matches!(info.state, SegmentState::Freeing { .. }),
            "forgetting segment {segment:?} that is not being freed"
        );
    }

    /// Registers a read of `segment`: its epoch, or why it may not proceed.
    pub(crate) fn begin_read(&mut self, segment: SegmentNumber) -> Result<u64, ReadRefusal> {
        match self.segments.get(&segment) {
            None if segment > self.highest || segment.0 == 0 => Err(ReadRefusal::NotWritten),
            None | Some(SegmentInfo { state: SegmentState::Freeing { .. }, .. }) => {
                Err(ReadRefusal::Freed)
            }
            Some(_) => {
                *self.readers.entry(self.epoch).or_insert(0) += 1;
                Ok(self.epoch)
            }
        }
    }

    /// Ends a read registered in `epoch`.
    pub(crate) fn end_read(&mut self, epoch: u64) {
        let count = self.readers.get_mut(&epoch).expect("ending a read that began");
        *count -= 1;
        if *count == 0 {
            self.readers.remove(&epoch);
        }
    }

    /// Closed segments worth cleaning, best first.
    pub(crate) fn candidates(&self, policy: CostBenefit) -> Vec<SegmentNumber> {
        let mut scored: Vec<(SegmentNumber, f64)> = self
            .segments
            .iter()
            .filter(|(_, info)| info.state == SegmentState::Closed)
            .filter_map(|(&segment, info)| {
                let live_bytes = info.appended_bytes - info.dead_bytes;
                if live_bytes * 100 > self.segment_bytes * CLEANABLE_LIVE_PERCENT_MAX {
                    return None;
                }
                let live_fraction = live_bytes as f64 / self.segment_bytes as f64;
                let age = self.closed_count - info.closed_at;
                Some((segment, policy.score(live_fraction, age)))
            })
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.into_iter().map(|(segment, _)| segment).collect()
    }

    /// Segments holding device space (every state, `Freeing` included).
    pub(crate) fn allocated(&self) -> u64 {
        self.segments.len() as u64
    }

    /// Every segment's accounting, in log order.
    pub(crate) fn stats(&self) -> Vec<SegmentStats> {
        self.segments
            .iter()
            .map(|(&segment, info)| SegmentStats {
                segment,
                state: info.state,
                appended_bytes: info.appended_bytes,
                live_bytes: info.appended_bytes.saturating_sub(info.dead_bytes),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn closed_table(live: &[u64]) -> SegmentTable {
        let mut table = SegmentTable::new(1000);
        for (index, &live_bytes) in live.iter().enumerate() {
            let segment = SegmentNumber(index as u64 + 1);
            table.open(segment);
            table.add_appended(segment, 1000);
            table.close(segment);
            table.note_dead(segment, 1000 - live_bytes);
        }
        table
    }

    #[test]
    fn emptier_and_older_segments_rank_first_and_full_ones_not_at_all() {
        let table = closed_table(&[500, 100, 990, 100]);
        // Segments 2 and 4 are equally empty; 2 is older, so first. Segment 1 is half live but
        // three segments older than 4: (0.5 · 4) / 1.5 = 1.33 beats (0.9 · 1) / 1.1 = 0.82.
        // Segment 3 is 99 % live: not worth cleaning at any age.
        assert_eq!(
            table.candidates(CostBenefit::AgeOverOnePlusUtilization),
            vec![SegmentNumber(2), SegmentNumber(1), SegmentNumber(4)]
        );
    }

    #[test]
    fn a_freed_segment_waits_for_reads_that_began_before_it_was_retired() {
        let mut table = closed_table(&[0, 0]);
        let early_read = table.begin_read(SegmentNumber(1)).unwrap();
        table.mark_cleaned(SegmentNumber(1), 10);
        table.retire_cleaned(5);
        assert_eq!(table.state(SegmentNumber(1)), Some(SegmentState::Cleaned { durable_at: 10 }));
        table.retire_cleaned(10);
        assert_eq!(
            table.begin_read(SegmentNumber(1)),
            Err(ReadRefusal::Freed),
            "late reads refused"
        );
        let late_read_elsewhere = table.begin_read(SegmentNumber(2)).unwrap();
        assert!(table.reclaimable().is_empty(), "the early read is still in progress");
        table.end_read(early_read);
        assert_eq!(table.reclaimable(), vec![SegmentNumber(1)], "later reads do not hold it");
        table.forget(SegmentNumber(1));
        table.end_read(late_read_elsewhere);
        assert_eq!(table.begin_read(SegmentNumber(1)), Err(ReadRefusal::Freed));
        assert_eq!(table.begin_read(SegmentNumber(9)), Err(ReadRefusal::NotWritten));
    }

    #[test]
    fn segments_are_reclaimed_in_the_order_they_were_retired_not_by_number() {
        let mut table = closed_table(&[0, 0, 0]);
        table.mark_cleaned(SegmentNumber(3), 10);
        table.retire_cleaned(10);
        table.mark_cleaned(SegmentNumber(1), 20);
        table.retire_cleaned(20);
        assert_eq!(table.reclaimable(), vec![SegmentNumber(3), SegmentNumber(1)]);
    }

    #[test]
    fn a_stale_key_keeps_tombstones_until_its_segment_is_retired() {
        let mut table = closed_table(&[0, 0]);
        let key = key_hash(1, b"k");
        table.note_stale(SegmentNumber(1), key);
        assert!(table.may_hold_stale(key, SegmentNumber(2)));
        assert!(!table.may_hold_stale(key, SegmentNumber(1)), "not the segment being cleaned");
        assert!(!table.may_hold_stale(key_hash(1, b"other"), SegmentNumber(2)));
        table.mark_cleaned(SegmentNumber(1), 0);
        assert!(table.may_hold_stale(key, SegmentNumber(2)), "cleaned but still on the device");
        table.retire_cleaned(0);
        assert!(!table.may_hold_stale(key, SegmentNumber(2)));
    }

    #[test]
    fn the_score_matches_the_memory_cleaners_formulas() {
        let lfs = CostBenefit::AgeOverOnePlusUtilization.score(0.5, 3);
        assert!((lfs - 0.5 * 4.0 / 1.5).abs() < 1e-12);
        assert_eq!(CostBenefit::AgeOverUtilization.score(0.0, 0), f64::INFINITY);
    }
}
