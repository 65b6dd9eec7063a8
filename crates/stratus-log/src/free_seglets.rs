//! The log's free seglets, split by whether their pages are resident.
//!
//! Seglets freed by cleaning still hold mapped pages; seglets never used, or given back to the
//! operating system ([`crate::SegletMemory::release`]), hold none. Appends take resident
//! seglets first (reusing memory the process already has, without page faults), and the
//! resident ones beyond what the store wants to keep are the ones given back. One deque: the
//! back holds the resident seglets (a stack: the most recently freed is reused first), the
//! front the released ones.

use std::collections::VecDeque;

/// Free seglets: released ones at the front, `resident` resident ones at the back.
#[derive(Debug)]
pub(crate) struct FreeSeglets {
    seglets: VecDeque<u32>,
    /// How many seglets at the back are resident.
    resident: usize,
}

impl FreeSeglets {
    /// Seglets handed out in the order given: never touched, or (`resident`) touched already
    /// (a prefaulted region).
    pub(crate) fn new(
        seglets: impl DoubleEndedIterator<Item = u32>,
        resident: bool,
    ) -> FreeSeglets {
        let seglets: VecDeque<u32> = seglets.rev().collect();
        let resident = if resident { seglets.len() } else { 0 };
        FreeSeglets { seglets, resident }
    }

    #[cfg(test)]
    pub(crate) fn untouched(seglets: impl DoubleEndedIterator<Item = u32>) -> FreeSeglets {
        FreeSeglets::new(seglets, false)
    }

    /// Free seglets, resident or not.
    pub(crate) fn len(&self) -> usize {
        self.seglets.len()
    }

    /// Free seglets whose pages are resident.
    pub(crate) fn resident(&self) -> usize {
        self.resident
    }

    /// Takes a free seglet, a resident one if any.
    pub(crate) fn pop(&mut self) -> Option<u32> {
        let seglet = self.seglets.pop_back()?;
        self.resident = self.resident.saturating_sub(1);
        Some(seglet)
    }

    /// Returns seglets that were written (reclaimed from the log, or spares of a compaction
    /// that may have been): they count as resident. The last is taken first.
    pub(crate) fn push_resident(&mut self, seglets: impl IntoIterator<Item = u32>) {
        let before = self.seglets.len();
        self.seglets.extend(seglets);
        self.resident += self.seglets.len() - before;
    }

    /// Takes up to `count` resident seglets to be released: the ones freed longest ago, which
    /// appends would take last (the most recently freed are popped next).
    pub(crate) fn take_resident(&mut self, count: usize) -> Vec<u32> {
        let count = count.min(self.resident);
        let at = self.seglets.len() - self.resident;
        self.resident -= count;
        self.seglets.drain(at..at + count).collect()
    }

    /// Returns released seglets (their pages given back): taken after every resident one.
    pub(crate) fn push_released(&mut self, seglets: &[u32]) {
        for &seglet in seglets.iter().rev() {
            self.seglets.push_front(seglet);
        }
    }

    /// Takes `count` seglets for a compaction copy, in the order they would be popped.
    pub(crate) fn take(&mut self, count: usize) -> Vec<u32> {
        (0..count).map(|_| self.pop().expect("counted by the caller")).collect()
    }
}

/// Where an append takes its next seglet from: the log's free list, or the seglets set aside
/// for a compaction copy.
pub(crate) trait SegletSource {
    fn take_seglet(&mut self) -> Option<u32>;
}

impl SegletSource for FreeSeglets {
    fn take_seglet(&mut self) -> Option<u32> {
        self.pop()
    }
}

impl SegletSource for Vec<u32> {
    fn take_seglet(&mut self) -> Option<u32> {
        self.pop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_seglets_are_taken_first_and_released_ones_last() {
        let mut free = FreeSeglets::untouched(1..5u32);
        assert_eq!((free.len(), free.resident()), (4, 0));
        assert_eq!(free.pop(), Some(1));
        assert_eq!(free.pop(), Some(2));
        free.push_resident([2, 1]);
        assert_eq!((free.len(), free.resident()), (4, 2));
        assert_eq!(free.take_resident(5), vec![2, 1]);
        free.push_resident([7, 8, 9]);
        // The one freed longest ago goes first; the newest stay to be reused.
        assert_eq!(free.take_resident(1), vec![7]);
        assert_eq!(free.take(2), vec![9, 8]);
        assert_eq!((free.len(), free.resident()), (2, 0));
        free.push_released(&[2, 1]);
        free.push_resident([9]);
        assert_eq!(free.take(2), vec![9, 3]);
        assert_eq!(free.pop(), Some(4));
        assert_eq!(free.pop(), Some(1));
        assert_eq!(free.pop(), Some(2));
        assert_eq!(free.pop(), None);
        assert_eq!(free.resident(), 0);
    }
}
