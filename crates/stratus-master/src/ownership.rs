//! The tablets a master owns, and which of them refuse writes while they are transferred.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use stratus_types::{HashRange, KeyHash, TableId};

/// Why a write was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteRefusal {
    /// No owned tablet holds the key (UNKNOWN_TABLET).
    NotOwned,
    /// The tablet is being transferred to another master (RETRY).
    Frozen,
}

#[derive(Debug, Default)]
struct Owned {
    tablets: HashMap<TableId, Vec<HashRange>>,
    /// Owned tablets being transferred: writes to them are refused. Few at a time (one per
    /// transfer the coordinator runs, one at a time), so a list.
    frozen: Vec<Frozen>,
    /// The id the next freeze gets.
    next_transfer_id: u64,
}

/// A tablet being transferred, and which transfer froze it (a transfer that was ended by a
/// TAKE must not hand off the tablet a later transfer froze).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Frozen {
    table: TableId,
    range: HashRange,
    transfer_id: u64,
}

/// The set of (table, hash range) this master serves. Read on every request, written only when
/// the coordinator assigns or drops a tablet or a transfer starts or ends, hence a
/// reader-writer lock. A write holds the read lock while it is admitted *and applied*
/// ([`TabletOwnership::while_writable`]), so once [`TabletOwnership::freeze`] returns, no write
/// to the frozen tablet is still being applied: a copy taken afterwards sees every write that
/// will ever be acknowledged there.
#[derive(Debug, Default)]
pub struct TabletOwnership {
    owned: RwLock<Owned>,
}

impl TabletOwnership {
    fn read(&self) -> RwLockReadGuard<'_, Owned> {
        self.owned.read().unwrap_or_else(|poison| poison.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Owned> {
        self.owned.write().unwrap_or_else(|poison| poison.into_inner())
    }

    /// True if `hash` of `table` lies in an owned tablet.
    pub fn owns(&self, table: TableId, hash: KeyHash) -> bool {
        self.read().owns(table, hash)
    }

    /// Runs `apply` if `hash` of `table` lies in an owned tablet that is not frozen, holding
    /// the ownership lock until it returns (see the type's comment).
    pub fn while_writable<T>(
        &self,
        table: TableId,
        hash: KeyHash,
        apply: impl FnOnce() -> T,
    ) -> Result<T, WriteRefusal> {
        let owned = self.read();
        if !owned.owns(table, hash) {
            return Err(WriteRefusal::NotOwned);
        }
        if owned.frozen.iter().any(|frozen| frozen.table == table && frozen.range.contains(hash)) {
            return Err(WriteRefusal::Frozen);
        }
        Ok(apply())
    }

    /// Starts refusing writes to `range` of `table`, which must be exactly an owned tablet
    /// not frozen yet; returns once no write to it is being applied, with the transfer's id.
    /// `None` (nothing changed) otherwise.
    pub fn freeze(&self, table: TableId, range: HashRange) -> Option<u64> {
        let mut owned = self.write();
        let is_tablet = owned.tablets.get(&table).is_some_and(|ranges| ranges.contains(&range));
        let is_frozen =
            owned.frozen.iter().any(|frozen| frozen.table == table && frozen.range == range);
        if !is_tablet || is_frozen {
            return None;
        }
        let transfer_id = owned.next_transfer_id;
        owned.next_transfer_id += 1;
        owned.frozen.push(Frozen { table, range, transfer_id });
        Some(transfer_id)
    }

    /// Takes writes to the tablet frozen by `transfer_id` again (the transfer failed).
    pub fn unfreeze(&self, transfer_id: u64) {
        self.write().frozen.retain(|frozen| frozen.transfer_id != transfer_id);
    }

    /// True while the tablet frozen by `transfer_id` still is (no TAKE ended the transfer).
    pub fn is_frozen_by(&self, transfer_id: u64) -> bool {
        self.read().frozen.iter().any(|frozen| frozen.transfer_id == transfer_id)
    }

    /// Stops serving the tablet frozen by `transfer_id` (the transfer is done); its objects
    /// stay in the store until DROP. False if it is no longer frozen by that transfer (a TAKE
    /// ended it meanwhile), and then nothing changes.
    pub fn hand_off(&self, transfer_id: u64) -> bool {
        let mut owned = self.write();
        let Some(position) =
            owned.frozen.iter().position(|frozen| frozen.transfer_id == transfer_id)
        else {
            return false;
        };
        let Frozen { table, range, .. } = owned.frozen.swap_remove(position);
        owned.drop_within(table, &range);
        true
    }

    /// True if all of `range` lies in one owned tablet of `table`.
    pub fn covers(&self, table: TableId, range: &HashRange) -> bool {
        let owned = self.read();
        owned
            .tablets
            .get(&table)
            .is_some_and(|ranges| ranges.iter().any(|owned| owned.covers(range)))
    }

    /// True if any hash of `range` lies in an owned tablet of `table`.
    pub fn overlaps(&self, table: TableId, range: &HashRange) -> bool {
        let owned = self.read();
        owned
            .tablets
            .get(&table)
            .is_some_and(|ranges| ranges.iter().any(|owned| owned.intersection(range).is_some()))
    }

    /// Starts owning `range` of `table` as one tablet. Idempotent: the coordinator re-sends
    /// assignments after it restarts. An owned range that overlaps `range` keeps only its parts
    /// outside it, so owned ranges never overlap and match the coordinator's tablets: a split
    /// tablet `[a, b]` is told as TAKE of `[a, s − 1]` and of `[s, b]`, and after either
    /// arrives the master serves exactly the hashes it served before, cut at `s` (a later DROP
    /// of one half then leaves the other). Taking a range ends the freeze of every tablet it
    /// overlaps: the coordinator hands a tablet back this way after a failed transfer.
    pub fn take(&self, table: TableId, range: HashRange) {
        let mut owned = self.write();
        owned
            .frozen
            .retain(|frozen| frozen.table != table || frozen.range.intersection(&range).is_none());
        let ranges = owned.tablets.entry(table).or_default();
        if ranges.contains(&range) {
            return;
        }
        let mut refined = Vec::with_capacity(ranges.len() + 2);
        for owned in ranges.iter() {
            if owned.intersection(&range).is_none() {
                refined.push(*owned);
                continue;
            }
            // The parts of `owned` before and after `range` (each empty when `range` reaches
            // past that end; the arithmetic cannot overflow because it runs only then).
            if owned.start < range.start {
                refined.extend(HashRange::new(owned.start, range.start - 1));
            }
            if owned.end > range.end {
                refined.extend(HashRange::new(range.end + 1, owned.end));
            }
        }
        refined.push(range);
        refined.sort();
        *ranges = refined;
    }

    /// Stops owning (and ends the freeze of) every owned range of `table` that lies within
    /// `range`.
    pub fn drop_within(&self, table: TableId, range: &HashRange) {
        self.write().drop_within(table, range);
    }

    /// [`TabletOwnership::drop_within`], then `then` before any write is admitted again: a
    /// write admitted before the drop and applied after `then` dropped the objects would
    /// leave an object behind in a range this master no longer owns.
    pub fn drop_within_then<T>(
        &self,
        table: TableId,
        range: &HashRange,
        then: impl FnOnce() -> T,
    ) -> T {
        let mut owned = self.write();
        owned.drop_within(table, range);
        then()
    }

    /// Number of owned tablets.
    pub fn count(&self) -> usize {
        self.read().tablets.values().map(Vec::len).sum()
    }

    /// Every owned (table, range), ordered (for invariant checks and reports).
    pub fn tablets(&self) -> Vec<(TableId, HashRange)> {
        let owned = self.read();
        let mut all: Vec<(TableId, HashRange)> = owned
            .tablets
            .iter()
            .flat_map(|(&table, ranges)| ranges.iter().map(move |&range| (table, range)))
            .collect();
        all.sort_by_key(|(table, range)| (table.0, range.start));
        all
    }
}

impl Owned {
    fn owns(&self, table: TableId, hash: KeyHash) -> bool {
        self.tablets
            .get(&table)
            .is_some_and(|ranges| ranges.iter().any(|range| range.contains(hash)))
    }

    fn drop_within(&mut self, table: TableId, range: &HashRange) {
        self.frozen.retain(|frozen| frozen.table != table || !range.covers(&frozen.range));
        if let Some(ranges) = self.tablets.get_mut(&table) {
            ranges.retain(|owned| !range.covers(owned));
            if ranges.is_empty() {
                self.tablets.remove(&table);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_owns_and_drop_forgets() {
        let ownership = TabletOwnership::default();
        let low = HashRange::new(0, 99).unwrap();
        let table = TableId(3);
        assert!(!ownership.owns(table, KeyHash(5)));
        ownership.take(table, low);
        ownership.take(table, low);
        assert_eq!(ownership.count(), 1);
        assert!(ownership.owns(table, KeyHash(5)));
        assert!(!ownership.owns(table, KeyHash(100)));
        assert!(!ownership.owns(TableId(4), KeyHash(5)));
        assert!(ownership.covers(table, &HashRange::new(10, 20).unwrap()));
        assert!(!ownership.covers(table, &HashRange::new(10, 200).unwrap()));
        ownership.drop_within(table, &HashRange::FULL);
        assert!(!ownership.owns(table, KeyHash(5)));
        assert_eq!(ownership.count(), 0);
    }

    #[test]
    fn taking_both_halves_of_an_owned_tablet_splits_it() {
        let ownership = TabletOwnership::default();
        let table = TableId(1);
        let whole = HashRange::new(100, 199).unwrap();
        let low = HashRange::new(100, 149).unwrap();
        let high = HashRange::new(150, 199).unwrap();
        ownership.take(table, whole);
        ownership.take(table, high);
        // Every hash is still served, now as two tablets.
        assert_eq!(ownership.tablets(), vec![(table, low), (table, high)]);
        ownership.take(table, low);
        ownership.take(table, high);
        assert_eq!(ownership.tablets(), vec![(table, low), (table, high)]);
        assert!(ownership.covers(table, &low) && !ownership.covers(table, &whole));
        // Dropping one half (migrated away) leaves the other.
        ownership.drop_within(table, &high);
        assert!(ownership.owns(table, KeyHash(149)) && !ownership.owns(table, KeyHash(150)));
    }

    #[test]
    fn a_frozen_tablet_refuses_writes_until_handed_off_or_taken_back() {
        let ownership = TabletOwnership::default();
        let table = TableId(2);
        let low = HashRange::new(0, 99).unwrap();
        let high = HashRange::new(100, 199).unwrap();
        ownership.take(table, low);
        ownership.take(table, high);
        assert_eq!(ownership.while_writable(table, KeyHash(150), || 7), Ok(7));
        assert_eq!(ownership.freeze(table, HashRange::new(100, 150).unwrap()), None, "no tablet");
        let first = ownership.freeze(table, high).unwrap();
        assert_eq!(ownership.freeze(table, high), None, "already frozen");
        assert_eq!(ownership.while_writable(table, KeyHash(150), || 7), Err(WriteRefusal::Frozen));
        assert_eq!(ownership.while_writable(table, KeyHash(50), || 7), Ok(7));
        assert!(ownership.owns(table, KeyHash(150)), "reads go on while frozen");
        // A failed transfer: writes again.
        ownership.unfreeze(first);
        assert_eq!(ownership.while_writable(table, KeyHash(150), || 7), Ok(7));
        // A finished transfer: no longer served.
        let second = ownership.freeze(table, high).unwrap();
        assert!(!ownership.hand_off(first), "an ended transfer hands nothing off");
        assert!(ownership.hand_off(second));
        assert_eq!(
            ownership.while_writable(table, KeyHash(150), || 7),
            Err(WriteRefusal::NotOwned)
        );
        // The coordinator hands it back (a failed migration): served and writable again.
        ownership.take(table, high);
        let third = ownership.freeze(table, high).unwrap();
        ownership.take(table, high);
        assert!(!ownership.hand_off(third), "a TAKE ended the transfer");
        assert_eq!(ownership.while_writable(table, KeyHash(150), || 7), Ok(7));
    }

    #[test]
    fn taking_a_range_at_the_ends_of_the_hash_space_never_overflows() {
        let ownership = TabletOwnership::default();
        let table = TableId(1);
        ownership.take(table, HashRange::FULL);
        ownership.take(table, HashRange::new(0, 0).unwrap());
        ownership.take(table, HashRange::new(u64::MAX, u64::MAX).unwrap());
        let middle = HashRange::new(1, u64::MAX - 1).unwrap();
        assert_eq!(
            ownership.tablets(),
            vec![
                (table, HashRange::new(0, 0).unwrap()),
                (table, middle),
                (table, HashRange::new(u64::MAX, u64::MAX).unwrap())
            ]
        );
        ownership.take(table, HashRange::FULL);
        assert_eq!(ownership.tablets(), vec![(table, HashRange::FULL)]);
    }
}
