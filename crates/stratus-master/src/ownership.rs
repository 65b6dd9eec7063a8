//! The tablets a master owns.

use std::collections::HashMap;
use std::sync::RwLock;

use stratus_types::{HashRange, KeyHash, TableId};

/// The set of (table, hash range) this master serves. Read on every request, written only when
/// the coordinator assigns or drops a tablet, hence a reader-writer lock.
#[derive(Debug, Default)]
pub struct TabletOwnership {
    tablets: RwLock<HashMap<TableId, Vec<HashRange>>>,
}

impl TabletOwnership {
    /// True if `hash` of `table` lies in an owned tablet.
    pub fn owns(&self, table: TableId, hash: KeyHash) -> bool {
        let tablets = self.tablets.read().unwrap_or_else(|poison| poison.into_inner());
        tablets.get(&table).is_some_and(|ranges| ranges.iter().any(|range| range.contains(hash)))
    }

    /// True if all of `range` lies in one owned tablet of `table`.
    pub fn covers(&self, table: TableId, range: &HashRange) -> bool {
        let tablets = self.tablets.read().unwrap_or_else(|poison| poison.into_inner());
        tablets.get(&table).is_some_and(|ranges| ranges.iter().any(|owned| owned.covers(range)))
    }

    /// True if any hash of `range` lies in an owned tablet of `table`.
    pub fn overlaps(&self, table: TableId, range: &HashRange) -> bool {
        let tablets = self.tablets.read().unwrap_or_else(|poison| poison.into_inner());
        tablets
            .get(&table)
            .is_some_and(|ranges| ranges.iter().any(|owned| owned.intersection(range).is_some()))
    }

    /// Starts owning `range` of `table` as one tablet. Idempotent: the coordinator re-sends
    /// assignments after it restarts. An owned range that overlaps `range` keeps only its parts
    /// outside it, so owned ranges never overlap and match the coordinator's tablets: a split
    /// tablet `[a, b]` is told as TAKE of `[a, s − 1]` and of `[s, b]`, and after either
    /// arrives the master serves exactly the hashes it served before, cut at `s` (a later DROP
    /// of one half then leaves the other).
    pub fn take(&self, table: TableId, range: HashRange) {
        let mut tablets = self.tablets.write().unwrap_or_else(|poison| poison.into_inner());
        let ranges = tablets.entry(table).or_default();
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

    /// Stops owning every owned range of `table` that lies within `range`.
    pub fn drop_within(&self, table: TableId, range: &HashRange) {
        let mut tablets = self.tablets.write().unwrap_or_else(|poison| poison.into_inner());
        if let Some(ranges) = tablets.get_mut(&table) {
            ranges.retain(|owned| !range.covers(owned));
            if ranges.is_empty() {
                tablets.remove(&table);
            }
        }
    }

    /// Number of owned tablets.
    pub fn count(&self) -> usize {
        let tablets = self.tablets.read().unwrap_or_else(|poison| poison.into_inner());
        tablets.values().map(Vec::len).sum()
    }

    /// Every owned (table, range), ordered (for invariant checks and reports).
    pub fn tablets(&self) -> Vec<(TableId, HashRange)> {
        let tablets = self.tablets.read().unwrap_or_else(|poison| poison.into_inner());
        let mut all: Vec<(TableId, HashRange)> = tablets
            .iter()
            .flat_map(|(&table, ranges)| ranges.iter().map(move |&range| (table, range)))
            .collect();
        all.sort_by_key(|(table, range)| (table.0, range.start));
        all
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
