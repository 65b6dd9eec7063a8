//! Recording a request's metrics allocates nothing: counted by a global allocator that counts
//! the allocations of the thread under test.

#![allow(unsafe_code)] // a global allocator is unsafe to implement

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use stratus_ops::{LatencyHistogram, ShardedCounter};

struct CountingAllocator;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded to the system allocator unchanged; the count is a
// thread-local cell with a const initializer, which itself never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: `pointer` came from `alloc` above, i.e. from the system allocator.
        unsafe { System.dealloc(pointer, layout) }
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|count| count.set(count.get() + 1));
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(pointer, layout, size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn recording_allocates_nothing() {
    let histogram = LatencyHistogram::new();
    let counter = ShardedCounter::new();
    // The allocator does count: building a histogram allocates its shards.
    let before = allocations();
    let other = LatencyHistogram::new();
    assert!(allocations() > before, "the counting allocator counts nothing");
    drop(other);

    let before = allocations();
    for index in 0..100_000u64 {
        histogram.record(Duration::from_nanos(index * 997));
        histogram.record_nanos(u64::MAX - index);
        counter.add(index);
    }
    let started = tokio::time::Instant::now();
    histogram.record(started.elapsed());
    assert_eq!(allocations() - before, 0, "recording allocated");
    assert_eq!(histogram.snapshot().count(), 200_001);
}
