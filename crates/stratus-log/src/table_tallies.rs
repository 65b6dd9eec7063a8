//! Live data per table, kept by the log's owner (the object store knows when an object lives
//! and dies; the log does not) and written by the log into every new head as a TABLE_STATS
//! entry, so that recovery can size its partitions from the crashed log alone.

use std::collections::HashMap;
use std::sync::Mutex;

use stratus_types::TableId;

use crate::format::{TableStats, TableTally, TABLE_STATS_TABLES_MAX};

/// Live bytes and objects per table. One short critical section per object write; a table
/// leaves the map when its last object dies, so the map holds only tables with live data.
#[derive(Debug, Default)]
pub struct TableTallies {
    tables: Mutex<HashMap<TableId, TableTally>>,
}

impl TableTallies {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TableId, TableTally>> {
        // Statistics only: a panic elsewhere while holding it leaves numbers, not data, behind.
        self.tables.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// An object of `bytes` (whole entry) of `table` became live.
    pub fn object_added(&self, table: TableId, bytes: u64) {
        let mut tables = self.lock();
        let tally = tables.entry(table).or_default();
        tally.bytes += bytes;
        tally.objects += 1;
    }

    /// An object of `bytes` of `table` died.
    pub fn object_removed(&self, table: TableId, bytes: u64) {
        let mut tables = self.lock();
        let Some(tally) = tables.get_mut(&table) else {
            debug_assert!(false, "an object of table {table} died that never lived");
            return;
        };
        debug_assert!(tally.bytes >= bytes && tally.objects >= 1, "table {table} tally underflow");
        tally.bytes = tally.bytes.saturating_sub(bytes);
        tally.objects = tally.objects.saturating_sub(1);
        if tally.objects == 0 {
            tables.remove(&table);
        }
    }

    /// An object of `table` was overwritten: `old_bytes` died, `new_bytes` lives.
    pub fn object_replaced(&self, table: TableId, old_bytes: u64, new_bytes: u64) {
        let mut tables = self.lock();
        let tally = tables.entry(table).or_default();
        debug_assert!(
            tally.bytes >= old_bytes && tally.objects >= 1,
            "table {table} tally underflow"
        );
        tally.bytes = tally.bytes.saturating_sub(old_bytes) + new_bytes;
        tally.objects = tally.objects.max(1);
    }

    /// `table`'s live data now (zero if none).
    pub fn of(&self, table: TableId) -> TableTally {
        self.lock().get(&table).copied().unwrap_or_default()
    }

    /// What a new head records: the `tables_max` (at most [`TABLE_STATS_TABLES_MAX`]) tables
    /// with the most live bytes one by one (ascending by id), the rest summed.
    pub fn snapshot(&self, tables_max: usize) -> TableStats {
        let tables_max = tables_max.min(TABLE_STATS_TABLES_MAX);
        let mut tables: Vec<(TableId, TableTally)> =
            self.lock().iter().map(|(table, tally)| (*table, *tally)).collect();
        let mut others = TableTally::default();
        if tables.len() > tables_max {
            tables.sort_unstable_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
            for (_, tally) in tables.drain(tables_max..) {
                others.bytes += tally.bytes;
                others.objects += tally.objects;
            }
        }
        tables.sort_unstable_by_key(|(table, _)| *table);
        TableStats { tables, others }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_follow_objects_and_forget_empty_tables() {
        let tallies = TableTallies::default();
        tallies.object_added(TableId(2), 100);
        tallies.object_added(TableId(2), 50);
        tallies.object_added(TableId(9), 10);
        tallies.object_replaced(TableId(2), 100, 300);
        assert_eq!(tallies.of(TableId(2)), TableTally { bytes: 350, objects: 2 });
        tallies.object_removed(TableId(9), 10);
        assert_eq!(
            tallies.snapshot(TABLE_STATS_TABLES_MAX).tables,
            vec![(TableId(2), TableTally { bytes: 350, objects: 2 })]
        );
    }

    #[test]
    fn beyond_the_limit_the_smallest_tables_are_summed() {
        let tallies = TableTallies::default();
        let extra = 5u64;
        for table in 0..TABLE_STATS_TABLES_MAX as u64 + extra {
            // Table t holds t + 1 bytes in one object: tables 0..extra are the smallest.
            tallies.object_added(TableId(table), table + 1);
        }
        let snapshot = tallies.snapshot(usize::MAX);
        assert_eq!(snapshot.tables.len(), TABLE_STATS_TABLES_MAX);
        assert_eq!(snapshot.tables.first().map(|(table, _)| *table), Some(TableId(extra)));
        assert!(snapshot.tables.windows(2).all(|pair| pair[0].0 < pair[1].0));
        assert_eq!(snapshot.others, TableTally { bytes: (1..=extra).sum(), objects: extra });
    }
}
