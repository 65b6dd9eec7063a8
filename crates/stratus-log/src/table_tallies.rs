//! Live data per table, kept by the log's owner (the object store knows when an object lives
//! and dies; the log does not) and written by the log into every new head as a TABLE_STATS
//! entry, so that recovery can size its partitions from the crashed log alone.

use std::collections::HashMap;
use std::sync::Mutex;

use stratus_types::{IntegerHashing, TableId};

use crate::format::{TableStats, TableTally, TABLE_STATS_TABLES_MAX};

/// Shards of the tallies. Every version of a key reports to the same shard (the caller passes
/// a number fixed per key: the store passes the key's hash-table bucket), so each shard's
/// figures are exact on their own and never negative, and writers of different buckets do not
/// contend for one lock or cache line.
const SHARDS: usize = 16;

/// Live bytes and objects per table. Each object write takes one shard's lock for a few
/// additions; a table leaves a shard when its last object there dies, so the shards hold only
/// tables with live data.
#[derive(Debug, Default)]
pub struct TableTallies {
    shards: [Shard; SHARDS],
}

/// One shard, alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    tables: Mutex<HashMap<TableId, TableTally, IntegerHashing>>,
}

type ShardGuard<'a> = std::sync::MutexGuard<'a, HashMap<TableId, TableTally, IntegerHashing>>;

impl TableTallies {
    fn shard(&self, key_shard: u64) -> ShardGuard<'_> {
        let shard = &self.shards[(key_shard % SHARDS as u64) as usize];
        // Statistics only: a panic elsewhere while holding it leaves numbers, not data, behind.
        shard.tables.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// An object of `bytes` (whole entry) of `table` became live. `key_shard` is the same for
    /// every version of the object's key (the store passes its hash-table bucket).
    pub fn object_added(&self, key_shard: u64, table: TableId, bytes: u64) {
        let mut tables = self.shard(key_shard);
        let tally = tables.entry(table).or_default();
        tally.bytes += bytes;
        tally.objects += 1;
    }

    /// An object of `bytes` of `table` died.
    pub fn object_removed(&self, key_shard: u64, table: TableId, bytes: u64) {
        let mut tables = self.shard(key_shard);
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
    pub fn object_replaced(&self, key_shard: u64, table: TableId, old_bytes: u64, new_bytes: u64) {
        let mut tables = self.shard(key_shard);
        let tally = tables.entry(table).or_default();
        debug_assert!(
            tally.bytes >= old_bytes && tally.objects >= 1,
            "table {table} tally underflow"
        );
        tally.bytes = tally.bytes.saturating_sub(old_bytes) + new_bytes;
        tally.objects = tally.objects.max(1);
    }

    /// Every table's live data now, summed over the shards.
    fn totals(&self) -> HashMap<TableId, TableTally> {
        let mut totals: HashMap<TableId, TableTally> = HashMap::new();
        for index in 0..SHARDS {
            for (table, tally) in self.shard(index as u64).iter() {
                let total = totals.entry(*table).or_default();
                total.bytes += tally.bytes;
                total.objects += tally.objects;
            }
        }
        totals
    }

    /// `table`'s live data now (zero if none).
    pub fn of(&self, table: TableId) -> TableTally {
        self.totals().get(&table).copied().unwrap_or_default()
    }

    /// Every table's live data now, in one pass over the shards (where asking [`Self::of`]
    /// for each of many tables would sum every shard each time).
    pub fn by_table(&self) -> HashMap<TableId, TableTally> {
        self.totals()
    }

    /// What a new head records: the `tables_max` (at most [`TABLE_STATS_TABLES_MAX`]) tables
    /// with the most live bytes one by one (ascending by id), the rest summed.
    pub fn snapshot(&self, tables_max: usize) -> TableStats {
        let tables_max = tables_max.min(TABLE_STATS_TABLES_MAX);
        let mut tables: Vec<(TableId, TableTally)> = self.totals().into_iter().collect();
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
        // Keys in shards 0 and 1 of table 2, one in shard 5 of table 9.
        tallies.object_added(0, TableId(2), 100);
        tallies.object_added(1, TableId(2), 50);
        tallies.object_added(5, TableId(9), 10);
        tallies.object_replaced(0, TableId(2), 100, 300);
        assert_eq!(tallies.of(TableId(2)), TableTally { bytes: 350, objects: 2 });
        tallies.object_removed(5, TableId(9), 10);
        assert_eq!(tallies.of(TableId(9)), TableTally::default());
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
            tallies.object_added(table, TableId(table), table + 1);
        }
        let snapshot = tallies.snapshot(usize::MAX);
        assert_eq!(snapshot.tables.len(), TABLE_STATS_TABLES_MAX);
        assert_eq!(snapshot.tables.first().map(|(table, _)| *table), Some(TableId(extra)));
        assert!(snapshot.tables.windows(2).all(|pair| pair[0].0 < pair[1].0));
        assert_eq!(snapshot.others, TableTally { bytes: (1..=extra).sum(), objects: extra });
    }
}
