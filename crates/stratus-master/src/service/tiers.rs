//! Storage tiers of the tables a master serves: every message that makes a master hold a
//! tablet's objects (TAKE_TABLET_OWNERSHIP, RECOVER_TABLETS, RECEIVE_MIGRATION_DATA) carries
//! the table's tier, and the master records it in its store before it serves, replays or
//! receives any of the table's objects.
//!
//! Invariants:
//! 1. A table's tier never changes (the coordinator fixes it at creation), so the store is
//!    told one tier per table; it stops the server if told two. A message that names another
//!    tier than the store holds is therefore refused here, with a status, before the store
//!    sees it: bad input is answered, never panicked on.
//! 2. The store records only tiers other than memory, so "memory" there also means "not told
//!    yet": a master cannot tell a memory table from one it has not heard of, and a flash
//!    tier may follow a memory one undetected. The coordinator never sends either.
//! 3. The check and the record happen under one lock, so two messages racing for one table
//!    cannot both pass the check with different tiers (invariant 1 would then stop the server).

use std::fmt;

use stratus_types::{TableId, Tier};

use super::Master;

/// Why a master refused the tiers a message named (answered INVALID_PARAMETER).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TierConflict {
    /// The store holds the table in another tier.
    Stored { table: TableId, stored: Tier, named: Tier },
    /// The message names two tiers for one table.
    TwoNamed { table: TableId, first: Tier, second: Tier },
}

impl fmt::Display for TierConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TierConflict::Stored { table, stored, named } => write!(
                f,
                "table {table} is stored in tier {stored} here, not {named} (a table's tier \
                 never changes)"
            ),
            TierConflict::TwoNamed { table, first, second } => {
                write!(f, "table {table} is named with two tiers, {first} and {second}")
            }
        }
    }
}

impl Master {
    /// Records that the objects of each of `tables` live in its tier, before this master
    /// serves, replays or receives any of them. All or nothing: refuses (recording none) if
    /// one contradicts the tier the store holds its table in, or two name one table with
    /// different tiers.
    pub(super) fn learn_table_tiers(
        &self,
        tables: impl IntoIterator<Item = (TableId, Tier)> + Clone,
    ) -> Result<(), TierConflict> {
        // Invariant 3: checked and recorded under one lock.
        let _one_at_a_time = self.tier_changes.lock().unwrap_or_else(|poison| poison.into_inner());
        let mut named: std::collections::BTreeMap<TableId, Tier> = Default::default();
        for (table, tier) in tables.clone() {
            let first = *named.entry(table).or_insert(tier);
            if first != tier {
                return Err(TierConflict::TwoNamed { table, first, second: tier });
            }
            let stored = self.store.table_tier(table);
            // Invariant 2: a stored memory tier may only mean "not told yet".
            if stored != Tier::Memory && stored != tier {
                return Err(TierConflict::Stored { table, stored, named: tier });
            }
        }
        for (table, tier) in tables {
            self.store.set_table_tier(table, tier);
        }
        Ok(())
    }

    /// [`Master::learn_table_tiers`] for one table.
    pub(super) fn learn_table_tier(&self, table: TableId, tier: Tier) -> Result<(), TierConflict> {
        self.learn_table_tiers([(table, tier)])
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use stratus_store::StoreConfig;
    use stratus_types::ServerId;

    use super::*;
    use crate::service::MasterConfig;

    fn master() -> Master {
        let config = MasterConfig::memory_only(StoreConfig::for_testing());
        Master::new(ServerId(1), config, Arc::new(stratus_env::SystemWallClock)).unwrap()
    }

    #[test]
    fn a_table_s_tier_is_recorded_once_and_a_contradiction_is_refused_without_recording() {
        let master = master();
        let (memory, flash) = (TableId(1), TableId(2));
        master.learn_table_tier(memory, Tier::Memory).unwrap();
        master.learn_table_tiers([(flash, Tier::Flash), (flash, Tier::Flash)]).unwrap();
        assert_eq!(master.store().table_tier(flash), Tier::Flash);
        // Told again, as every assignment repeats it: nothing changes.
        master.learn_table_tier(flash, Tier::Flash).unwrap();
        let conflict = master.learn_table_tier(flash, Tier::Memory).unwrap_err();
        let expected =
            TierConflict::Stored { table: flash, stored: Tier::Flash, named: Tier::Memory };
        assert_eq!(conflict, expected);
        assert!(conflict.to_string().contains("stored in tier flash here, not memory"));
        assert_eq!(master.store().table_tier(flash), Tier::Flash);
    }

    #[test]
    fn one_message_naming_two_tiers_for_a_table_records_nothing() {
        let master = master();
        let (other, table) = (TableId(3), TableId(4));
        let refused = master.learn_table_tiers([
            (other, Tier::Flash),
            (table, Tier::Flash),
            (table, Tier::Memory),
        ]);
        let expected = TierConflict::TwoNamed { table, first: Tier::Flash, second: Tier::Memory };
        assert_eq!(refused, Err(expected));
        assert_eq!(master.store().table_tier(other), Tier::Memory, "all or nothing");
        assert_eq!(master.store().table_tier(table), Tier::Memory);
    }
}
