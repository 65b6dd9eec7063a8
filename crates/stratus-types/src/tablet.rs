//! Tablets: contiguous ranges of a table's key-hash space, each served by one master.

use crate::ids::KeyHash;

/// An inclusive range `[start, end]` of key hashes. Inclusive so that the whole space
/// `[0, u64::MAX]` is representable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HashRange {
    /// First hash in the range.
    pub start: u64,
    /// Last hash in the range (inclusive).
    pub end: u64,
}

impl HashRange {
    /// The whole hash space.
    pub const FULL: HashRange = HashRange { start: 0, end: u64::MAX };

    /// A range; `None` if `start > end`.
    pub fn new(start: u64, end: u64) -> Option<HashRange> {
        (start <= end).then_some(HashRange { start, end })
    }

    /// True if `hash` lies in the range.
    pub fn contains(&self, hash: KeyHash) -> bool {
        self.start <= hash.0 && hash.0 <= self.end
    }

    /// True if every hash of `other` lies in `self`.
    pub fn covers(&self, other: &HashRange) -> bool {
        self.start <= other.start && other.end <= self.end
    }

    /// The intersection of two ranges, if any.
    pub fn intersection(&self, other: &HashRange) -> Option<HashRange> {
        HashRange::new(self.start.max(other.start), self.end.min(other.end))
    }

    /// Splits the full hash space into `parts` contiguous ranges of (nearly) equal size, in
    /// ascending order. `parts` must be at least 1.
    pub fn split_evenly(parts: u32) -> Vec<HashRange> {
        assert!(parts >= 1, "a table needs at least one tablet");
        HashRange::FULL.split(parts)
    }

    /// Splits this range into at most `parts` contiguous ranges of (nearly) equal size, in
    /// ascending order (fewer when the range holds fewer hashes). `parts` must be at least 1.
    pub fn split(&self, parts: u32) -> Vec<HashRange> {
        assert!(parts >= 1, "a range splits into at least one part");
        let width = u128::from(self.end - self.start) + 1;
        let parts = u128::from(parts).min(width);
        (0..parts)
            .map(|index| {
                let start = u128::from(self.start) + width * index / parts;
                let end = u128::from(self.start) + width * (index + 1) / parts - 1;
                // Both lie in [self.start, self.end], so they fit in u64.
                HashRange { start: start as u64, end: end as u64 }
            })
            .collect()
    }
}

/// The state of a tablet in the coordinator's map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TabletState {
    /// Served by its owner.
    Normal,
    /// Its owner crashed and it is being recovered; clients wait and retry.
    Recovering,
    /// Its owner crashed and no complete copy of its log exists (the master ran without
    /// replicas, or every replica is gone): nothing serves it until an operator accepts the
    /// loss (`stratus recovery accept-loss`), or a backup holding the log returns. Clients
    /// fail at once instead of waiting.
    Unavailable,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_space_without_gaps() {
        for parts in [1u32, 2, 3, 7, 1024] {
            let ranges = HashRange::split_evenly(parts);
            assert_eq!(ranges.len(), parts as usize);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges[ranges.len() - 1].end, u64::MAX);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end + 1, pair[1].start);
            }
        }
        assert_eq!(HashRange::split_evenly(2)[1].start, 1 << 63);
        let part = HashRange { start: 10, end: 19 };
        assert_eq!(part.split(1), vec![part]);
        let halves = part.split(2);
        assert_eq!(
            halves,
            vec![HashRange { start: 10, end: 14 }, HashRange { start: 15, end: 19 }]
        );
        // More parts than hashes: one part per hash.
        assert_eq!(HashRange { start: 5, end: 6 }.split(4).len(), 2);
        for parts in [1u32, 3, 7] {
            let pieces = HashRange { start: 1 << 40, end: u64::MAX }.split(parts);
            assert_eq!(pieces.len(), parts as usize);
            assert_eq!(pieces[0].start, 1 << 40);
            assert_eq!(pieces[pieces.len() - 1].end, u64::MAX);
            for pair in pieces.windows(2) {
                assert_eq!(pair[0].end + 1, pair[1].start);
            }
        }
    }

    #[test]
    fn contains_and_intersection() {
        let range = HashRange::new(10, 20).unwrap();
        assert!(range.contains(KeyHash(10)) && range.contains(KeyHash(20)));
        assert!(!range.contains(KeyHash(21)));
        assert_eq!(range.intersection(&HashRange::new(15, 30).unwrap()), HashRange::new(15, 20));
        assert_eq!(range.intersection(&HashRange::new(21, 30).unwrap()), None);
        assert!(HashRange::FULL.covers(&range));
        assert!(HashRange::new(20, 10).is_none());
    }
}
