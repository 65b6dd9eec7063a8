//! Figures of each auto table: where its objects are and how its reads were served, the one
//! record the store keeps of them (the server-wide [`crate::AutoStatistics`] are their sums).
//!
//! Sharded as the log's table tallies are: every change of a key reports to the shard of the
//! key's hash-table bucket (the caller holds that bucket's lock), so each shard's counts are
//! exact on their own, flash counts never go negative, and readers of different buckets do not
//! contend for one lock or cache line.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use stratus_types::{IntegerHashing, TableId};

/// Shards of the figures (as the table tallies: 16 keeps a hot table's readers apart).
const SHARDS: usize = 16;

/// Counts of one auto table (in one shard, or summed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AutoTableCounts {
    /// Objects on flash now (a FLASH_OBJECT in DRAM each).
    pub flash_objects: u64,
    /// Their bytes at full size (as the table tallies count them).
    pub flash_bytes: u64,
    /// Reads served from DRAM, since the store was made.
    pub reads_from_dram: u64,
    /// Reads served from flash.
    pub reads_from_flash: u64,
    /// Objects promoted from flash into DRAM.
    pub promotions: u64,
    /// Their bytes.
    pub promoted_bytes: u64,
    /// Objects moved to flash by demotions.
    pub objects_demoted: u64,
}

impl AutoTableCounts {
    fn add(&mut self, other: &AutoTableCounts) {
        self.flash_objects += other.flash_objects;
        self.flash_bytes += other.flash_bytes;
        self.reads_from_dram += other.reads_from_dram;
        self.reads_from_flash += other.reads_from_flash;
        self.promotions += other.promotions;
        self.promoted_bytes += other.promoted_bytes;
        self.objects_demoted += other.objects_demoted;
    }
}

/// One shard, alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    tables: Mutex<HashMap<TableId, AutoTableCounts, IntegerHashing>>,
}

/// The counts of every auto table that has had an object on flash or a read.
#[derive(Debug, Default)]
pub(crate) struct AutoTableFigures {
    shards: [Shard; SHARDS],
}

impl AutoTableFigures {
    fn shard(
        &self,
        key_shard: u64,
    ) -> MutexGuard<'_, HashMap<TableId, AutoTableCounts, IntegerHashing>> {
        let shard = &self.shards[(key_shard % SHARDS as u64) as usize];
        // Figures only: a panic elsewhere while holding it leaves numbers, not data, behind.
        shard.tables.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Changes `table`'s counts in the shard of `key_shard` (the key's bucket).
    pub(crate) fn update(
        &self,
        key_shard: u64,
        table: TableId,
        change: impl FnOnce(&mut AutoTableCounts),
    ) {
        change(self.shard(key_shard).entry(table).or_default());
    }

    /// An object of `table` of `bytes` left flash (freed, overwritten, promoted or relocated).
    pub(crate) fn left_flash(&self, key_shard: u64, table: TableId, bytes: u64) {
        self.update(key_shard, table, |counts| {
            // The shard saw the object arrive (every change of a key reports here). Figures
            // only, so a release build saturates rather than stop the server over them.
            debug_assert!(
                counts.flash_objects >= 1 && counts.flash_bytes >= bytes,
                "table {table}: an object of {bytes} bytes left flash that the figures never saw \
                 arrive ({counts:?})"
            );
            counts.flash_objects = counts.flash_objects.saturating_sub(1);
            counts.flash_bytes = counts.flash_bytes.saturating_sub(bytes);
        });
    }

    /// Every table's counts, summed over the shards.
    pub(crate) fn by_table(&self) -> HashMap<TableId, AutoTableCounts> {
        let mut totals: HashMap<TableId, AutoTableCounts> = HashMap::new();
        for index in 0..SHARDS {
            for (table, counts) in self.shard(index as u64).iter() {
                totals.entry(*table).or_default().add(counts);
            }
        }
        totals
    }

    /// Every table's counts summed.
    pub(crate) fn sum(&self) -> AutoTableCounts {
        let mut sum = AutoTableCounts::default();
        for index in 0..SHARDS {
            for counts in self.shard(index as u64).values() {
                sum.add(counts);
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_of_one_table_sum_over_shards_and_tables_stay_apart() {
        let figures = AutoTableFigures::default();
        for key_shard in 0..40u64 {
            figures.update(key_shard, TableId(1), |counts| {
                counts.flash_objects += 1;
                counts.flash_bytes += 100;
                counts.reads_from_dram += 2;
            });
        }
        figures.update(3, TableId(2), |counts| counts.reads_from_flash += 5);
        figures.left_flash(7, TableId(1), 100);
        let by_table = figures.by_table();
        let one = by_table[&TableId(1)];
        assert_eq!((one.flash_objects, one.flash_bytes, one.reads_from_dram), (39, 3_900, 80));
        assert_eq!(by_table[&TableId(2)].reads_from_flash, 5);
        assert_eq!(by_table[&TableId(2)].flash_objects, 0);
        let sum = figures.sum();
        assert_eq!((sum.flash_objects, sum.reads_from_flash, sum.reads_from_dram), (39, 5, 80));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "never saw")]
    fn an_object_leaving_flash_that_never_arrived_is_caught_in_tests() {
        AutoTableFigures::default().left_flash(0, TableId(1), 100);
    }
}
