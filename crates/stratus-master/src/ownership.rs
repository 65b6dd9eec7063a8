//! The tablets a master owns, which of them are being transferred (taking writes while they
//! are copied, remembering the keys those writes changed, then holding writes for the end of
//! the transfer), and the newest assignment epoch it has seen for each range (so that a stale assignment from the
//! coordinator, delayed in the network or re-sent by an earlier incarnation, is ignored).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use stratus_types::limits::{
    ASSIGNMENTS_REMEMBERED_MAX, MIGRATION_CHANGED_KEYS_MAX, MIGRATION_CHANGED_KEY_BYTES_MAX,
};
use stratus_types::{HashRange, KeyHash, TableId};

/// Why a write was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteRefusal {
    /// No owned tablet holds the key (UNKNOWN_TABLET).
    NotOwned,
    /// The tablet is being handed to another master: writes are held for the end of its
    /// transfer (RETRY).
    Frozen,
}

/// Why an assignment from the coordinator was not applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignmentRefusal {
    /// An assignment of an overlapping range with a newer epoch was seen first: this one is
    /// obsolete (the coordinator decided otherwise since).
    Stale,
    /// TRANSFER: the range is not exactly one tablet this master owns.
    NotATablet,
    /// TRANSFER: the tablet is being transferred already, by a transfer of another epoch.
    AlreadyFrozen,
    /// TRANSFER: this very transfer (same epoch) is running; its outcome comes later.
    TransferRunning,
    /// RECEIVE_MIGRATION_DATA: this master serves part of the range.
    ServesPart,
    /// TRANSFER: transactions have operations prepared in the tablet; it moves once they
    /// are decided (docs/design/transactions.md, "Migration and split").
    TransactionsPrepared,
}

/// What an assignment tells the master about a range, in the order that decides between two
/// assignments of one epoch: serving (TAKE, or receiving a migration) comes before releasing
/// (TRANSFER, DROP), so a TAKE re-sent at the epoch of a transfer or drop that followed it is
/// stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Direction {
    Serve,
    Release,
}

/// The newest assignment seen for a range of a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SeenAssignment {
    table: TableId,
    range: HashRange,
    rank: (u64, Direction),
}

#[derive(Debug, Default)]
struct Owned {
    tablets: HashMap<TableId, Vec<HashRange>>,
    /// The newest assignment seen per range (ranges may overlap; an assignment is stale if
    /// any overlapping entry ranks above it). Bounded by [`ASSIGNMENTS_REMEMBERED_MAX`].
    seen: Vec<SeenAssignment>,
    /// Owned tablets being transferred. Few at a time (one per transfer the coordinator runs,
    /// one at a time), so a list.
    frozen: Vec<Frozen>,
    /// The id the next transfer gets.
    next_transfer_id: u64,
}

/// A tablet being transferred, and which transfer (a transfer that was ended by a TAKE must
/// not hand off the tablet a later transfer began).
#[derive(Clone, Debug)]
struct Frozen {
    table: TableId,
    range: HashRange,
    transfer_id: u64,
    /// The assignment epoch of the TRANSFER_TABLET that began it.
    epoch: u64,
    /// Still copying: writes are admitted, and each notes its key in `changed`. Once false,
    /// writes are held (RETRY) until the transfer ends.
    writable: bool,
    changed: Arc<Mutex<ChangedKeys>>,
}

/// The keys writes changed while a transfer copied their tablet, bounded by
/// [`MIGRATION_CHANGED_KEYS_MAX`] and [`MIGRATION_CHANGED_KEY_BYTES_MAX`]. Ordered, so that
/// the transfer sends them in the same order on every run (the simulation depends on it).
#[derive(Debug, Default)]
struct ChangedKeys {
    keys: BTreeSet<Vec<u8>>,
    bytes: usize,
    /// A bound was reached: the keys were forgotten and the whole tablet must be copied again.
    too_many: bool,
}

impl ChangedKeys {
    fn note(&mut self, key: &[u8]) {
        if self.too_many || self.keys.contains(key) {
            return;
        }
        if self.keys.len() >= MIGRATION_CHANGED_KEYS_MAX
            || self.bytes + key.len() > MIGRATION_CHANGED_KEY_BYTES_MAX
        {
            self.too_many = true;
            self.keys = BTreeSet::new();
            self.bytes = 0;
            return;
        }
        self.bytes += key.len();
        self.keys.insert(key.to_vec());
    }
}

/// Empties `changed`, returning what it held.
fn take_changed(changed: &Mutex<ChangedKeys>) -> ChangedDuringCopy {
    let changed = std::mem::take(&mut *changed.lock().unwrap_or_else(|poison| poison.into_inner()));
    if changed.too_many {
        ChangedDuringCopy::TooMany
    } else {
        ChangedDuringCopy::Keys(changed.keys.into_iter().collect())
    }
}

/// What writes did to a tablet while its transfer copied it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangedDuringCopy {
    /// These keys (ascending) were written, removed or incremented: only they need sending
    /// again.
    Keys(Vec<Vec<u8>>),
    /// More than the bounds allow: the whole tablet must be copied again.
    TooMany,
}

/// The set of (table, hash range) this master serves. Read on every request, written only when
/// the coordinator assigns or drops a tablet or a transfer starts or ends, hence a
/// reader-writer lock. A write holds the read lock while it is admitted *and applied*
/// ([`TabletOwnership::while_writable`]), so once [`TabletOwnership::freeze`] returns, no write
/// to the frozen tablet is still being applied: a copy taken afterwards sees every write that
/// will ever be acknowledged there.
///
/// Assignments (TAKE, DROP, the freeze of a transfer, a migration batch) are applied one at a
/// time under `assignments`, taken before the reader-writer lock: a migration batch holds it
/// while its objects are written, so no TAKE or DROP of the range falls between its check and
/// its writes, while requests keep being served (they take only the read lock).
#[derive(Debug, Default)]
pub struct TabletOwnership {
    owned: RwLock<Owned>,
    assignments: Mutex<()>,
}

impl TabletOwnership {
    fn read(&self) -> RwLockReadGuard<'_, Owned> {
        self.owned.read().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Held while an assignment is applied (see the type's comment).
    fn assigning(&self) -> MutexGuard<'_, ()> {
        self.assignments.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Owned> {
        self.owned.write().unwrap_or_else(|poison| poison.into_inner())
    }

    /// True if `hash` of `table` lies in an owned tablet.
    pub fn owns(&self, table: TableId, hash: KeyHash) -> bool {
        self.read().owns(table, hash)
    }

    /// Runs `apply` if `hash` of `table` lies in an owned tablet whose writes are not held,
    /// holding the ownership lock until it returns (see the type's comment). A write to a
    /// tablet its transfer is still copying notes `key` as changed before the lock is
    /// released, so the transfer, which holds writes under the write lock, sees every change.
    pub fn while_writable<T>(
        &self,
        table: TableId,
        hash: KeyHash,
        key: &[u8],
        apply: impl FnOnce() -> T,
    ) -> Result<T, WriteRefusal> {
        let owned = self.read();
        if !owned.owns(table, hash) {
            return Err(WriteRefusal::NotOwned);
        }
        let transfer =
            owned.frozen.iter().find(|frozen| frozen.table == table && frozen.range.contains(hash));
        match transfer {
            None => Ok(apply()),
            Some(transfer) if !transfer.writable => Err(WriteRefusal::Frozen),
            Some(transfer) => {
                let applied = apply();
                transfer.changed.lock().unwrap_or_else(|poison| poison.into_inner()).note(key);
                Ok(applied)
            }
        }
    }

    /// Runs `apply` if `hash` of `table` lies in an owned tablet that no transfer is moving,
    /// holding the ownership lock until it returns: a transaction's PREPARE, whose lock must
    /// not be left behind by a tablet that moves (a transfer starts only when no operation is
    /// prepared in its tablet, and waits for this lock to check).
    pub fn while_not_transferring<T>(
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

    /// TRANSFER_TABLET at `epoch`: starts a transfer of `range` of `table`, which must be
    /// exactly an owned tablet not being transferred yet; returns the transfer's id. The tablet
    /// keeps taking writes while it is copied ([`TabletOwnership::hold_writes`] ends that).
    /// Nothing changes on a refusal.
    ///
    /// `prepared_in_range` says whether transactions hold operations prepared in the range:
    /// asked under the ownership lock, which every PREPARE holds too
    /// ([`TabletOwnership::while_not_transferring`]), so none slips in between.
    pub fn begin_transfer(
        &self,
        table: TableId,
        range: HashRange,
        epoch: u64,
        prepared_in_range: impl FnOnce() -> bool,
    ) -> Result<u64, AssignmentRefusal> {
        let _assigning = self.assigning();
        let mut owned = self.write();
        let rank = (epoch, Direction::Release);
        if owned.is_stale(table, &range, rank) {
            return Err(AssignmentRefusal::Stale);
        }
        if !owned.tablets.get(&table).is_some_and(|ranges| ranges.contains(&range)) {
            return Err(AssignmentRefusal::NotATablet);
        }
        let running =
            owned.frozen.iter().find(|frozen| frozen.table == table && frozen.range == range);
        if let Some(running) = running {
            return Err(if running.epoch == epoch {
                AssignmentRefusal::TransferRunning
            } else {
                AssignmentRefusal::AlreadyFrozen
            });
        }
        if prepared_in_range() {
            return Err(AssignmentRefusal::TransactionsPrepared);
        }
        owned.record(table, range, rank);
        let transfer_id = owned.next_transfer_id;
        owned.next_transfer_id += 1;
        owned.frozen.push(Frozen {
            table,
            range,
            transfer_id,
            epoch,
            writable: true,
            changed: Arc::default(),
        });
        Ok(transfer_id)
    }

    /// Holds writes to the tablet of `transfer_id` from now until the transfer ends (RETRY);
    /// returns once no write to it is being applied, with what the writes admitted since the
    /// last look changed. `None` if a TAKE or DROP ended the transfer.
    pub fn hold_writes(&self, transfer_id: u64) -> Option<ChangedDuringCopy> {
        let mut owned = self.write();
        let transfer = owned.frozen.iter_mut().find(|frozen| frozen.transfer_id == transfer_id)?;
        transfer.writable = false;
        Some(take_changed(&transfer.changed))
    }

    /// True if a write to `hash` of `table` would be admitted now (it notes nothing).
    #[cfg(test)]
    pub fn admits_writes(&self, table: TableId, hash: KeyHash) -> bool {
        let owned = self.read();
        owned.owns(table, hash)
            && !owned.frozen.iter().any(|frozen| {
                frozen.table == table && frozen.range.contains(hash) && !frozen.writable
            })
    }

    /// Notes `keys` as changed again for the transfer `transfer_id` (a look that decided to
    /// send them later). Nothing if the transfer ended.
    pub fn note_again(&self, transfer_id: u64, keys: Vec<Vec<u8>>) {
        let owned = self.read();
        if let Some(transfer) = owned.frozen.iter().find(|frozen| frozen.transfer_id == transfer_id)
        {
            let mut changed = transfer.changed.lock().unwrap_or_else(|poison| poison.into_inner());
            for key in keys {
                changed.note(&key);
            }
        }
    }

    /// What the writes admitted to the tablet of `transfer_id` changed since the last look,
    /// while writes go on: a write still between its change and its note is noted for the
    /// next look. `None` if a TAKE or DROP ended the transfer.
    pub fn changed_so_far(&self, transfer_id: u64) -> Option<ChangedDuringCopy> {
        let owned = self.read();
        let transfer = owned.frozen.iter().find(|frozen| frozen.transfer_id == transfer_id)?;
        Some(take_changed(&transfer.changed))
    }

    /// RECEIVE_MIGRATION_DATA at `epoch`: runs `apply` (which writes the batch) if the
    /// transfer is not stale and this master serves no part of the range, holding the
    /// assignment lock until it returns, so that no TAKE or DROP of the range is applied
    /// between the check and the write (requests are served meanwhile).
    pub fn while_receiving<T>(
        &self,
        table: TableId,
        range: HashRange,
        epoch: u64,
        apply: impl FnOnce() -> T,
    ) -> Result<T, AssignmentRefusal> {
        let _assigning = self.assigning();
        {
            let mut owned = self.write();
            let rank = (epoch, Direction::Serve);
            if owned.is_stale(table, &range, rank) {
                return Err(AssignmentRefusal::Stale);
            }
            let serves_part = owned.tablets.get(&table).is_some_and(|ranges| {
                ranges.iter().any(|owned| owned.intersection(&range).is_some())
            });
            if serves_part {
                return Err(AssignmentRefusal::ServesPart);
            }
            owned.record(table, range, rank);
        }
        // Requests go on meanwhile; no assignment can change the range until this returns.
        Ok(apply())
    }

    /// A recovery of the ranges `tablets` at `epoch` begins here (RECOVER_TABLETS): each is
    /// remembered as an assignment seen, so that every older assignment of it, a transfer's
    /// batches included, is stale from now on (the coordinator's TAKE of a recovered range
    /// comes at a newer epoch). False, and nothing recorded, if the recovery itself is stale:
    /// an assignment of an overlapping range newer than it was seen here.
    pub fn note_recovery(
        &self,
        tablets: impl Iterator<Item = (TableId, HashRange)> + Clone,
        epoch: u64,
    ) -> bool {
        let _assigning = self.assigning();
        let mut owned = self.write();
        let rank = (epoch, Direction::Serve);
        if tablets.clone().any(|(table, range)| owned.is_stale(table, &range, rank)) {
            return false;
        }
        for (table, range) in tablets {
            owned.record(table, range, rank);
        }
        true
    }

    /// Ends the transfer `transfer_id` (it failed): its tablet is served as before.
    pub fn unfreeze(&self, transfer_id: u64) {
        self.write().frozen.retain(|frozen| frozen.transfer_id != transfer_id);
    }

    /// True while the transfer `transfer_id` runs (no TAKE or DROP ended it).
    pub fn is_frozen_by(&self, transfer_id: u64) -> bool {
        self.read().frozen.iter().any(|frozen| frozen.transfer_id == transfer_id)
    }

    /// Stops serving the tablet of the transfer `transfer_id` (it is done); its objects stay
    /// in the store until DROP. False if a TAKE or DROP ended that transfer meanwhile, and then
    /// nothing changes.
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
    ///
    /// Refused (nothing changes) if an assignment of an overlapping range newer than `epoch`
    /// was seen: a TAKE sent before the tablet was transferred away must not make this master
    /// serve it again beside its new owner.
    pub fn take(
        &self,
        table: TableId,
        range: HashRange,
        epoch: u64,
    ) -> Result<(), AssignmentRefusal> {
        let _assigning = self.assigning();
        let mut owned = self.write();
        let rank = (epoch, Direction::Serve);
        if owned.is_stale(table, &range, rank) {
            return Err(AssignmentRefusal::Stale);
        }
        owned.record(table, range, rank);
        owned
            .frozen
            .retain(|frozen| frozen.table != table || frozen.range.intersection(&range).is_none());
        let ranges = owned.tablets.entry(table).or_default();
        if ranges.contains(&range) {
            return Ok(());
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
        Ok(())
    }

    /// DROP_TABLET_OWNERSHIP at `epoch`: stops owning (and ends the freeze of) every owned
    /// range of `table` that lies within `range`, then runs `then` (which drops the objects)
    /// before any write is admitted again: a write admitted before the drop and applied after
    /// `then` would leave an object behind in a range this master no longer owns. Refused
    /// (nothing changes) if an assignment of an overlapping range newer than `epoch` was seen:
    /// a DROP delayed past the tablet's return here must not drop it.
    pub fn drop_within_then<T>(
        &self,
        table: TableId,
        range: &HashRange,
        epoch: u64,
        then: impl FnOnce() -> T,
    ) -> Result<T, AssignmentRefusal> {
        let _assigning = self.assigning();
        let mut owned = self.write();
        let rank = (epoch, Direction::Release);
        if owned.is_stale(table, range, rank) {
            return Err(AssignmentRefusal::Stale);
        }
        owned.record(table, *range, rank);
        owned.drop_within(table, range);
        Ok(then())
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
    /// True if an assignment of a range overlapping `range` ranks above `rank`.
    fn is_stale(&self, table: TableId, range: &HashRange, rank: (u64, Direction)) -> bool {
        self.seen.iter().any(|seen| {
            seen.table == table && seen.rank > rank && seen.range.intersection(range).is_some()
        })
    }

    /// Remembers an applied assignment. Entries it covers and outranks say nothing more, and
    /// go; past the bound, the oldest goes (an assignment older than every forgotten one's
    /// successor is then no longer recognised as stale; with the bound far above the tablets a
    /// master serves, that needs thousands of later assignments to it first).
    fn record(&mut self, table: TableId, range: HashRange, rank: (u64, Direction)) {
        self.seen.retain(|seen| {
            !(seen.table == table && range.covers(&seen.range) && seen.rank <= rank)
        });
        if self.seen.len() >= ASSIGNMENTS_REMEMBERED_MAX {
            let oldest = (0..self.seen.len()).min_by_key(|&index| self.seen[index].rank);
            if let Some(oldest) = oldest {
                self.seen.swap_remove(oldest);
            }
        }
        self.seen.push(SeenAssignment { table, range, rank });
    }

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
        ownership.take(table, low, 1).unwrap();
        ownership.take(table, low, 1).unwrap();
        assert_eq!(ownership.count(), 1);
        assert!(ownership.owns(table, KeyHash(5)));
        assert!(!ownership.owns(table, KeyHash(100)));
        assert!(!ownership.owns(TableId(4), KeyHash(5)));
        assert!(ownership.covers(table, &HashRange::new(10, 20).unwrap()));
        assert!(!ownership.covers(table, &HashRange::new(10, 200).unwrap()));
        ownership.drop_within_then(table, &HashRange::FULL, 2, || ()).unwrap();
        assert!(!ownership.owns(table, KeyHash(5)));
        assert_eq!(ownership.count(), 0);
    }

    /// A transfer's batch delayed past the start of a recovery of its range here is stale,
    /// however late it comes before the recovery's TAKE; the TAKE and later transfers are not.
    #[test]
    fn a_recovery_makes_batches_of_earlier_transfers_of_its_range_stale() {
        let ownership = TabletOwnership::default();
        let table = TableId(2);
        let range = HashRange::new(0, 99).unwrap();
        let part = HashRange::new(50, 59).unwrap();
        let receive = |epoch| ownership.while_receiving(table, range, epoch, || ());
        // The transfer's first batch never arrived; the recovery of a part of it begins.
        assert!(ownership.note_recovery([(table, part)].into_iter(), 8));
        assert_eq!(receive(7), Err(AssignmentRefusal::Stale), "a batch of the earlier transfer");
        let elsewhere = HashRange::new(200, 299).unwrap();
        assert_eq!(ownership.while_receiving(table, elsewhere, 7, || ()), Ok(()));
        ownership.take(table, part, 9).unwrap();
        assert!(ownership.owns(table, KeyHash(55)), "the recovery's TAKE is newer");
        ownership.drop_within_then(table, &part, 10, || ()).unwrap();
        assert_eq!(receive(11), Ok(()), "a later transfer of the range");
        // A request of an earlier recovery attempt that arrives now is refused, and changes
        // nothing: the batches of the later transfer still go in.
        let overlapping = HashRange::new(40, 60).unwrap();
        assert!(!ownership.note_recovery([(table, overlapping)].into_iter(), 9));
        assert_eq!(receive(11), Ok(()));
    }

    #[test]
    fn taking_both_halves_of_an_owned_tablet_splits_it() {
        let ownership = TabletOwnership::default();
        let table = TableId(1);
        let whole = HashRange::new(100, 199).unwrap();
        let low = HashRange::new(100, 149).unwrap();
        let high = HashRange::new(150, 199).unwrap();
        ownership.take(table, whole, 1).unwrap();
        ownership.take(table, high, 2).unwrap();
        // Every hash is still served, now as two tablets.
        assert_eq!(ownership.tablets(), vec![(table, low), (table, high)]);
        ownership.take(table, low, 2).unwrap();
        ownership.take(table, high, 2).unwrap();
        assert_eq!(ownership.tablets(), vec![(table, low), (table, high)]);
        assert!(ownership.covers(table, &low) && !ownership.covers(table, &whole));
        // Dropping one half (migrated away) leaves the other.
        ownership.drop_within_then(table, &high, 3, || ()).unwrap();
        assert!(ownership.owns(table, KeyHash(149)) && !ownership.owns(table, KeyHash(150)));
    }

    #[test]
    fn a_transferred_tablet_takes_writes_until_they_are_held_then_until_handed_off_or_taken_back() {
        let ownership = TabletOwnership::default();
        let table = TableId(2);
        let low = HashRange::new(0, 99).unwrap();
        let high = HashRange::new(100, 199).unwrap();
        ownership.take(table, low, 1).unwrap();
        ownership.take(table, high, 1).unwrap();
        let write = |hash, key: &[u8]| ownership.while_writable(table, KeyHash(hash), key, || 7);
        assert_eq!(write(150, b"a"), Ok(7));
        let part = HashRange::new(100, 150).unwrap();
        assert_eq!(
            ownership.begin_transfer(table, part, 2, || false),
            Err(AssignmentRefusal::NotATablet)
        );
        assert_eq!(
            ownership.begin_transfer(table, high, 2, || true),
            Err(AssignmentRefusal::TransactionsPrepared)
        );
        let first = ownership.begin_transfer(table, high, 2, || false).unwrap();
        assert_eq!(
            ownership.begin_transfer(table, high, 3, || false),
            Err(AssignmentRefusal::AlreadyFrozen)
        );
        // Copying: writes go on, and their keys are noted (once each, in order).
        assert_eq!(write(150, b"zebra"), Ok(7));
        assert_eq!(write(160, b"apple"), Ok(7));
        assert_eq!(write(150, b"zebra"), Ok(7));
        assert_eq!(write(50, b"elsewhere"), Ok(7));
        let changed = ChangedDuringCopy::Keys(vec![b"apple".to_vec(), b"zebra".to_vec()]);
        assert_eq!(ownership.changed_so_far(first), Some(changed));
        // A look while writes go on starts the notes afresh.
        assert_eq!(write(170, b"mango"), Ok(7));
        ownership.note_again(first, vec![b"kiwi".to_vec()]);
        let changed = ChangedDuringCopy::Keys(vec![b"kiwi".to_vec(), b"mango".to_vec()]);
        assert_eq!(ownership.hold_writes(first), Some(changed));
        // Held: refused until the transfer ends; the other tablet and reads go on.
        assert_eq!(write(150, b"a"), Err(WriteRefusal::Frozen));
        assert_eq!(write(50, b"a"), Ok(7));
        assert!(ownership.owns(table, KeyHash(150)), "reads go on while writes are held");
        // A failed transfer: writes again.
        ownership.unfreeze(first);
        assert_eq!(ownership.hold_writes(first), None, "ended");
        assert_eq!(write(150, b"a"), Ok(7));
        // A finished transfer: no longer served.
        let second = ownership.begin_transfer(table, high, 4, || false).unwrap();
        assert!(!ownership.hand_off(first), "an ended transfer hands nothing off");
        assert!(ownership.hand_off(second));
        assert_eq!(write(150, b"a"), Err(WriteRefusal::NotOwned));
        // The coordinator hands it back (a failed migration): served and writable again.
        ownership.take(table, high, 5).unwrap();
        let third = ownership.begin_transfer(table, high, 6, || false).unwrap();
        ownership.take(table, high, 7).unwrap();
        assert!(!ownership.hand_off(third), "a TAKE ended the transfer");
        assert_eq!(write(150, b"a"), Ok(7));
    }

    /// Past its bounds a transfer forgets the changed keys and asks for a whole new copy.
    #[test]
    fn too_many_changed_keys_ask_for_a_whole_new_copy() {
        let ownership = TabletOwnership::default();
        let table = TableId(2);
        ownership.take(table, HashRange::FULL, 1).unwrap();
        let transfer = ownership.begin_transfer(table, HashRange::FULL, 2, || false).unwrap();
        for index in 0..=MIGRATION_CHANGED_KEYS_MAX as u32 {
            let key = index.to_le_bytes();
            ownership.while_writable(table, KeyHash(u64::from(index)), &key, || ()).unwrap();
        }
        assert_eq!(ownership.hold_writes(transfer), Some(ChangedDuringCopy::TooMany));
        let mut keys = ChangedKeys::default();
        keys.note(&vec![1; MIGRATION_CHANGED_KEY_BYTES_MAX]);
        keys.note(b"one more byte");
        assert!(keys.too_many && keys.keys.is_empty() && keys.bytes == 0);
    }

    #[test]
    fn taking_a_range_at_the_ends_of_the_hash_space_never_overflows() {
        let ownership = TabletOwnership::default();
        let table = TableId(1);
        ownership.take(table, HashRange::FULL, 1).unwrap();
        ownership.take(table, HashRange::new(0, 0).unwrap(), 1).unwrap();
        ownership.take(table, HashRange::new(u64::MAX, u64::MAX).unwrap(), 1).unwrap();
        let middle = HashRange::new(1, u64::MAX - 1).unwrap();
        assert_eq!(
            ownership.tablets(),
            vec![
                (table, HashRange::new(0, 0).unwrap()),
                (table, middle),
                (table, HashRange::new(u64::MAX, u64::MAX).unwrap())
            ]
        );
        ownership.take(table, HashRange::FULL, 1).unwrap();
        assert_eq!(ownership.tablets(), vec![(table, HashRange::FULL)]);
    }

    #[test]
    fn assignments_older_than_one_seen_for_an_overlapping_range_are_refused() {
        let ownership = TabletOwnership::default();
        let table = TableId(4);
        let whole = HashRange::FULL;
        let high = HashRange::new(1 << 63, u64::MAX).unwrap();
        ownership.take(table, whole, 10).unwrap();
        // Transferred away at 11 (and handed off): the TAKE of 10, re-sent or delayed, must
        // not make this master serve the tablet beside its new owner.
        let transfer = ownership.begin_transfer(table, whole, 11, || false).unwrap();
        assert!(ownership.hand_off(transfer));
        assert_eq!(ownership.take(table, whole, 10), Err(AssignmentRefusal::Stale));
        assert_eq!(ownership.take(table, high, 11), Err(AssignmentRefusal::Stale), "same epoch");
        assert_eq!(ownership.count(), 0);
        // Migrated back at 13 (receiving, then TAKE): a DROP of 12 (sent after the move away)
        // arriving late must not drop it, nor may a late batch of the move at 11 write into it.
        let received = ownership.while_receiving(table, whole, 13, || "written");
        assert_eq!(received, Ok("written"));
        ownership.take(table, whole, 13).unwrap();
        let late_drop = ownership.drop_within_then(table, &high, 12, || panic!("dropped"));
        assert_eq!(late_drop, Err(AssignmentRefusal::Stale));
        let late_batch = ownership.while_receiving(table, high, 11, || panic!("written"));
        assert_eq!(late_batch, Err(AssignmentRefusal::Stale));
        assert_eq!(
            ownership.while_receiving(table, high, 14, || ()),
            Err(AssignmentRefusal::ServesPart)
        );
        assert!(ownership.owns(table, KeyHash(5)) && ownership.owns(table, KeyHash(u64::MAX)));
        // A transfer older than the TAKE is refused too; a newer one goes ahead.
        assert_eq!(
            ownership.begin_transfer(table, whole, 12, || false),
            Err(AssignmentRefusal::Stale)
        );
        assert!(ownership.begin_transfer(table, whole, 15, || false).is_ok());
        // Other tables are unaffected.
        assert_eq!(ownership.take(TableId(5), whole, 1), Ok(()));
    }

    #[test]
    fn remembered_assignments_stay_bounded() {
        let ownership = TabletOwnership::default();
        let table = TableId(1);
        for epoch in 0..(ASSIGNMENTS_REMEMBERED_MAX as u64 + 10) {
            let range = HashRange::new(epoch * 10, epoch * 10 + 1).unwrap();
            ownership.take(table, range, epoch).unwrap();
        }
        assert_eq!(ownership.read().seen.len(), ASSIGNMENTS_REMEMBERED_MAX);
        // A range covering them all replaces every entry it outranks.
        ownership.drop_within_then(table, &HashRange::FULL, u64::MAX, || ()).unwrap();
        assert_eq!(ownership.read().seen.len(), 1);
        assert_eq!(ownership.count(), 0);
    }
}
