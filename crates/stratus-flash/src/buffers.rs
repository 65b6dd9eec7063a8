//! One DRAM flush buffer (T2 §4.6): the bytes of one buffer slot of the log before they are
//! written to the device.
//!
//! Invariants:
//! 1. A buffer is *ready* (`base == NO_SLOT` and `fill` not sealed), *current* (a slot assigned,
//!    `fill` not sealed), or *processing* (`fill` sealed: it accepts nothing and waits to be
//!    written, or is being recycled). At most one buffer of a log is current; the log's head
//!    lock assigns slots (ready → current) and the flusher recycles them (processing → ready).
//!    A buffer being recycled has `base == NO_SLOT` while `fill` is still sealed (see
//!    `recycle`), so readiness is both conditions (`is_ready`): were `base` alone taken for it,
//!    the head could assign the buffer a new slot in that window, and the end of the recycle
//!    would then reset the new slot's `fill` under its appenders (later reservations would
//!    overwrite the segment header and entries already acknowledged at their addresses).
//! 2. Appenders reserve with a compare-and-swap on `fill` and copy concurrently into disjoint
//!    ranges. Reservations are multiples of 8 bytes at multiples of 8 bytes, so no two appenders
//!    ever write the same 64-bit word: the buffer is an array of atomic words, and a copy is a
//!    sequence of relaxed word stores (no unsafe code, no torn word).
//! 3. An appender counts itself in `writers` *before* it checks `base` and reserves, and out
//!    after its copy (all SeqCst). Sealing is a SeqCst `fetch_or` on `fill`. So once the flusher
//!    has seen the seal and then `writers == 0`, every reservation made is fully copied and no
//!    new one can be made: the flusher reads exactly `fill & !SEALED` complete bytes. Appenders
//!    that only look (and find the buffer sealed or not at their slot) may still count in and
//!    out after that; `recycle` waits them out before it unseals (see there).
//! 4. A slot address is assigned to a buffer at most once in the life of the log (slots only
//!    grow), so `base` doubles as the buffer's generation: a reader copies, then checks `base`
//!    again after an acquire fence (a seqlock); writers of the next incarnation issue a release
//!    fence before their first word store, so a reader that saw one of their words sees the
//!    new `base` and retries from the device, which holds the old slot by then (a buffer is
//!    recycled only after its flush completed).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// `base` of a ready buffer.
pub(crate) const NO_SLOT: u64 = u64::MAX;

/// The bit of `fill` that seals the buffer (invariant 1).
const SEALED: u64 = 1 << 63;

/// The outcome of a reservation attempt.
#[derive(Debug)]
pub(crate) enum Reservation<'a> {
    /// Space reserved: copy with the guard, which counts the copy out when dropped.
    Reserved(WriteGuard<'a>),
    /// The buffer was not the current one at the expected slot, or is sealed.
    NotCurrent,
    /// The entry does not fit in the space left; the buffer has been sealed.
    Sealed,
}

/// A flush buffer; see the module documentation.
#[derive(Debug)]
pub(crate) struct FlushBuffer {
    words: Box<[AtomicU64]>,
    base: AtomicU64,
    fill: AtomicU64,
    writers: AtomicU32,
}

/// A reserved range of a buffer; dropping it counts the appender out (invariant 3).
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    buffer: &'a FlushBuffer,
    /// Offset of the reserved range in the buffer.
    pub(crate) offset: u64,
    length: u64,
}

impl WriteGuard<'_> {
    /// Copies `bytes` (exactly the reserved length) into the reserved range.
    pub(crate) fn copy(&self, bytes: &[u8]) {
        assert_eq!(bytes.len() as u64, self.length, "copy of the wrong length");
        // Invariant 4: the next incarnation's words become visible only after its base.
        fence(Ordering::Release);
        self.buffer.store_words(self.offset, bytes);
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.buffer.writers.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FlushBuffer {
    /// A ready buffer of `bytes` (a multiple of 8).
    pub(crate) fn new(bytes: u64) -> FlushBuffer {
        assert_eq!(bytes % 8, 0);
        FlushBuffer {
            words: (0..bytes / 8).map(|_| AtomicU64::new(0)).collect(),
            base: AtomicU64::new(NO_SLOT),
            fill: AtomicU64::new(0),
            writers: AtomicU32::new(0),
        }
    }

    fn capacity_bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// The slot this buffer holds, or `NO_SLOT`.
    pub(crate) fn base(&self) -> u64 {
        self.base.load(Ordering::SeqCst)
    }

    /// Bytes reserved so far, and whether the buffer is sealed.
    pub(crate) fn fill(&self) -> (u64, bool) {
        let fill = self.fill.load(Ordering::SeqCst);
        (fill & !SEALED, fill & SEALED != 0)
    }

    /// Appenders still copying.
    pub(crate) fn writers(&self) -> u32 {
        self.writers.load(Ordering::SeqCst)
    }

    /// Whether the buffer may be assigned a slot: no slot, and not sealed (a recycle that has
    /// cleared `base` but still waits for appenders to leave has not unsealed yet).
    pub(crate) fn is_ready(&self) -> bool {
        self.base() == NO_SLOT && !self.fill().1
    }

    /// Ready → current: gives the buffer `slot`, with `prefix` (the segment header, or nothing)
    /// already in place. Called only under the head lock, on a ready buffer (invariant 1).
    pub(crate) fn assign(&self, slot: u64, prefix: &[u8]) {
        assert!(self.is_ready(), "assigning a buffer that is not ready");
        assert_eq!(prefix.len() % 8, 0);
        fence(Ordering::Release);
        self.store_words(0, prefix);
        self.fill.store(prefix.len() as u64, Ordering::SeqCst);
        self.base.store(slot, Ordering::SeqCst);
    }

    /// Reserves `length` bytes (a multiple of 8) if this buffer is current at `slot`.
    pub(crate) fn reserve(&self, slot: u64, length: u64) -> Reservation<'_> {
        assert_eq!(length % 8, 0);
        // Fast refusal without counting in: appenders retrying after `BuffersBusy` poll the
        // sealed current buffer, and counting them would make the flusher wait for them.
        // Refusing early is always safe (the caller only retries); the checks that decide a
        // reservation are the ones below, made after counting in (invariant 3).
        if self.base.load(Ordering::SeqCst) != slot || self.fill().1 {
            return Reservation::NotCurrent;
        }
        self.writers.fetch_add(1, Ordering::SeqCst);
        let guard_if = |offset| WriteGuard { buffer: self, offset, length };
        if self.base.load(Ordering::SeqCst) != slot {
            self.writers.fetch_sub(1, Ordering::SeqCst);
            return Reservation::NotCurrent;
        }
        let mut fill = self.fill.load(Ordering::SeqCst);
        loop {
            if fill & SEALED != 0 {
                self.writers.fetch_sub(1, Ordering::SeqCst);
                return Reservation::NotCurrent;
            }
            let (next, sealing) = if fill + length <= self.capacity_bytes() {
                (fill + length, false)
            } else {
                (fill | SEALED, true)
            };
            match self.fill.compare_exchange(fill, next, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) if sealing => {
                    self.writers.fetch_sub(1, Ordering::SeqCst);
                    return Reservation::Sealed;
                }
                Ok(_) => return Reservation::Reserved(guard_if(fill)),
                Err(actual) => fill = actual,
            }
        }
    }

    /// Current → processing, whatever the space left (a sync of a partly filled buffer).
    /// Returns the bytes reserved.
    pub(crate) fn seal(&self) -> u64 {
        self.fill.fetch_or(SEALED, Ordering::SeqCst) & !SEALED
    }

    /// Processing → ready, after the buffer's bytes are durable on the device (invariant 4).
    ///
    /// Appenders may still be counted in `writers` here: ones polling the sealed buffer after
    /// `BuffersBusy` count in before they look at `base` and `fill` (invariant 3). So `base`
    /// goes first: an appender counting in after it sees `NO_SLOT` and leaves. One that counted
    /// in before it may still be about to read `fill`, so `fill` stays sealed until every such
    /// appender has left; only then is it reset. Resetting it earlier would let that appender
    /// reserve in a ready buffer at an address of the old slot.
    pub(crate) fn recycle(&self) {
        assert!(self.fill().1, "recycling a buffer that was never sealed");
        self.base.store(NO_SLOT, Ordering::SeqCst);
        // Every appender still counted in sees the seal and leaves at once (a load and a
        // decrement: no copy can be in progress in a sealed buffer the flusher has written,
        // since it wrote only once `writers` was 0 after the seal), so this wait is short.
        let mut spins = 0u32;
        while self.writers() != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The appender was preempted between its two steps: let it run.
                std::thread::yield_now();
            }
        }
        self.fill.store(0, Ordering::SeqCst);
    }

    fn store_words(&self, offset: u64, bytes: &[u8]) {
        assert!(offset.is_multiple_of(8) && bytes.len().is_multiple_of(8));
        let first = (offset / 8) as usize;
        for (word, chunk) in
            self.words[first..first + bytes.len() / 8].iter().zip(bytes.chunks_exact(8))
        {
            let mut value = [0u8; 8];
            value.copy_from_slice(chunk);
            word.store(u64::from_le_bytes(value), Ordering::Relaxed);
        }
    }

    /// Copies the buffer's bytes at `offset` into `out` (offset and length multiples of 8).
    pub(crate) fn load_words(&self, offset: u64, out: &mut [u8]) {
        assert!(offset.is_multiple_of(8) && out.len().is_multiple_of(8));
        let first = (offset / 8) as usize;
        for (word, chunk) in
            self.words[first..first + out.len() / 8].iter().zip(out.chunks_exact_mut(8))
        {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
    }

    /// Copies bytes at `offset` for a reader, if the buffer still holds `slot` after the copy
    /// (invariant 4). `false`: the buffer moved on; read the device.
    pub(crate) fn read_if_holding(&self, slot: u64, offset: u64, out: &mut [u8]) -> bool {
        if self.base.load(Ordering::SeqCst) != slot {
            return false;
        }
        self.load_words(offset, out);
        fence(Ordering::Acquire);
        self.base.load(Ordering::SeqCst) == slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_reserves_until_full_then_seals_itself() {
        let buffer = FlushBuffer::new(64);
        assert!(matches!(buffer.reserve(4096, 8), Reservation::NotCurrent), "not assigned yet");
        buffer.assign(4096, &[1u8; 16]);
        let Reservation::Reserved(first) = buffer.reserve(4096, 40) else { panic!("fits") };
        assert_eq!(first.offset, 16);
        first.copy(&[2u8; 40]);
        drop(first);
        assert!(matches!(buffer.reserve(4096, 16), Reservation::Sealed), "16 + 40 + 16 > 64");
        assert!(matches!(buffer.reserve(4096, 8), Reservation::NotCurrent), "sealed");
        assert_eq!(buffer.fill(), (56, true));
        let mut out = [0u8; 56];
        assert!(buffer.read_if_holding(4096, 0, &mut out));
        assert_eq!(&out[..16], &[1u8; 16]);
        assert_eq!(&out[16..], &[2u8; 40]);
        buffer.recycle();
        assert!(!buffer.read_if_holding(4096, 0, &mut out));
        assert_eq!(buffer.base(), NO_SLOT);
    }

    /// The interleaving behind the flusher's panic and the misplaced reservation, made
    /// deterministic: an appender polling the sealed buffer has counted itself in and has not
    /// yet read `base` or `fill` when the flusher recycles.
    #[test]
    fn recycle_waits_for_counted_in_appenders_and_keeps_the_seal_until_they_leave() {
        let buffer = FlushBuffer::new(64);
        buffer.assign(4096, &[]);
        buffer.seal();
        buffer.writers.fetch_add(1, Ordering::SeqCst);
        std::thread::scope(|scope| {
            let recycling = scope.spawn(|| buffer.recycle());
            while buffer.base() != NO_SLOT && !recycling.is_finished() {
                std::thread::yield_now();
            }
            assert_eq!(buffer.base(), NO_SLOT, "the slot is cleared first");
            // The polling appender now reads `fill`: sealed, so it reserves nothing.
            assert!(buffer.fill().1, "unsealed while an appender could still read fill");
            assert!(!recycling.is_finished(), "recycled with an appender counted in");
            buffer.writers.fetch_sub(1, Ordering::SeqCst);
            recycling.join().expect("recycle panicked");
        });
        assert_eq!(buffer.fill(), (0, false));
        assert!(matches!(buffer.reserve(4096, 8), Reservation::NotCurrent), "old slot refused");
    }

    #[test]
    fn a_buffer_is_not_ready_for_a_new_slot_until_its_recycle_is_over() {
        let buffer = FlushBuffer::new(64);
        buffer.assign(4096, &[]);
        buffer.seal();
        buffer.writers.fetch_add(1, Ordering::SeqCst);
        std::thread::scope(|scope| {
            let recycling = scope.spawn(|| buffer.recycle());
            while buffer.base() != NO_SLOT && !recycling.is_finished() {
                std::thread::yield_now();
            }
            // The head, looking for the next buffer now, must not take this one: the recycle's
            // reset of `fill` is still to come and would land on the new slot.
            assert!(!buffer.is_ready(), "ready while the recycle still waits for an appender");
            buffer.writers.fetch_sub(1, Ordering::SeqCst);
            recycling.join().expect("recycle panicked");
        });
        assert!(buffer.is_ready());
        buffer.assign(8192, &[5u8; 16]);
        assert_eq!(buffer.fill(), (16, false));
    }

    #[test]
    fn a_writer_still_copying_is_counted_until_its_guard_drops() {
        let buffer = FlushBuffer::new(64);
        buffer.assign(0, &[]);
        let Reservation::Reserved(guard) = buffer.reserve(0, 8) else { panic!("fits") };
        assert_eq!(buffer.seal(), 8);
        assert_eq!(buffer.writers(), 1);
        guard.copy(&[9u8; 8]);
        drop(guard);
        assert_eq!(buffer.writers(), 0);
    }
}
