//! The only part of the crate that starts threads or sleeps: an optional background flusher and
//! a bounded pool of reader threads. Servers use them; the simulator drives `flush_ready` and
//! `read` itself.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::address::FlashAddress;
use crate::constants::{READ_FIRST_BYTES, READ_POOL_DEPTH_MAX};
use crate::error::FlashError;
use crate::format::OwnedEntry;
use crate::log::FlashLog;

/// A thread that flushes sealed buffers as they fill, sleeping `idle` when there is nothing
/// to do. Device errors are kept (the buffer stays sealed and is retried) and reported by
/// `stop`.
#[derive(Debug)]
pub struct BackgroundFlusher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<FlashError>>>,
}

impl BackgroundFlusher {
    /// Starts flushing `log`.
    pub fn spawn(log: Arc<FlashLog>, idle: Duration) -> BackgroundFlusher {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("flash-flusher".into())
            .spawn(move || {
                let mut last_error = None;
                while !stopping.load(Ordering::SeqCst) {
                    match log.flush_ready() {
                        Ok(progress) if progress.buffers_written > 0 => continue,
                        Ok(_) => {}
                        Err(error) => last_error = Some(error),
                    }
                    std::thread::sleep(idle);
                }
                last_error
            })
            .expect("spawning the flusher thread");
        BackgroundFlusher { stop, thread: Some(thread) }
    }

    /// Whether the thread has ended: only after `stop`, or when it panicked (appenders then
    /// wait on `BuffersBusy` for ever, so a caller waiting for buffers can check this).
    pub fn has_ended(&self) -> bool {
        self.thread.as_ref().is_none_or(|thread| thread.is_finished())
    }

    /// Stops the thread; the last device error it met, if any. A panic of the thread (a bug,
    /// not a device error) is raised again here, on the caller's thread, rather than hidden.
    pub fn stop(mut self) -> Option<FlashError> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take()?;
        match thread.join() {
            Ok(last_error) => last_error,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for BackgroundFlusher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // As in `stop`, unless this thread is already unwinding (a second panic aborts).
            if let Err(panic) = thread.join() {
                if !std::thread::panicking() {
                    std::panic::resume_unwind(panic);
                }
            }
        }
    }
}

/// What a read's caller is told when the read completes.
pub type ReadCompletion = Box<dyn FnOnce(Result<OwnedEntry, FlashError>) + Send>;

type ReadJob = (FlashAddress, usize, ReadCompletion);

/// A bounded pool of reader threads: at most `depth` reads in flight, and at most `depth` more
/// queued (`submit` blocks beyond that: back-pressure instead of an unbounded queue).
/// Completions run on the pool's threads.
#[derive(Debug)]
pub struct ReadPool {
    sender: Option<SyncSender<ReadJob>>,
    threads: Vec<JoinHandle<()>>,
}

impl ReadPool {
    /// A pool of `depth` threads (at most [`READ_POOL_DEPTH_MAX`]) reading `log`.
    pub fn new(log: Arc<FlashLog>, depth: usize) -> ReadPool {
        assert!((1..=READ_POOL_DEPTH_MAX).contains(&depth), "read pool depth out of bounds");
        let (sender, receiver) = sync_channel::<ReadJob>(depth);
        let receiver: Arc<Mutex<Receiver<ReadJob>>> = Arc::new(Mutex::new(receiver));
        let threads = (0..depth)
            .map(|index| {
                let log = Arc::clone(&log);
                let receiver = Arc::clone(&receiver);
                std::thread::Builder::new()
                    .name(format!("flash-read-{index}"))
                    .spawn(move || loop {
                        let job =
                            receiver.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).recv();
                        let Ok((address, entry_bytes_hint, completion)) = job else { return };
                        completion(log.read_sized(address, entry_bytes_hint));
                    })
                    .expect("spawning a reader thread")
            })
            .collect();
        ReadPool { sender: Some(sender), threads }
    }

    /// Queues a read (`FlashLog::read`); `completion` gets its result on a pool thread.
    pub fn submit(&self, address: FlashAddress, completion: ReadCompletion) {
        self.submit_sized(address, READ_FIRST_BYTES, completion);
    }

    /// Queues a read with the entry's size as the caller's index knows it
    /// (`FlashLog::read_sized`).
    pub fn submit_sized(
        &self,
        address: FlashAddress,
        entry_bytes_hint: usize,
        completion: ReadCompletion,
    ) {
        let sender = self.sender.as_ref().expect("the pool is open until dropped");
        sender
            .send((address, entry_bytes_hint, completion))
            .expect("reader threads live as long as the pool");
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        self.sender.take();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemoryDevice;
    use crate::format::EntryRef;
    use crate::log::FlashConfig;
    use crate::{CostBenefit, Geometry};

    fn log() -> Arc<FlashLog> {
        let config = FlashConfig {
            geometry: Geometry::new(64 << 10, 16 << 10).unwrap(),
            flush_buffers: 2,
            log_id: 1,
            cost_benefit: CostBenefit::AgeOverOnePlusUtilization,
            cleaner_reserve_segments: 1,
        };
        let device = MemoryDevice::new(64 << 10, 64 << 20);
        Arc::new(FlashLog::create(Arc::new(device), config).unwrap())
    }

    /// A device whose writes panic, as a bug in the flush path would.
    #[derive(Debug)]
    struct PanickingWrites(MemoryDevice);

    impl crate::FlashDevice for PanickingWrites {
        fn allocate(&self, segment: crate::SegmentNumber) -> Result<(), FlashError> {
            self.0.allocate(segment)
        }
        fn write_at(&self, _: crate::SegmentNumber, _: u64, _: &[u8]) -> Result<(), FlashError> {
            panic!("a bug in the flush path")
        }
        fn read_at(
            &self,
            segment: crate::SegmentNumber,
            offset: u64,
            out: &mut [u8],
        ) -> Result<usize, FlashError> {
            self.0.read_at(segment, offset, out)
        }
        fn sync(&self, segment: crate::SegmentNumber) -> Result<(), FlashError> {
            self.0.sync(segment)
        }
        fn free(&self, segment: crate::SegmentNumber) -> Result<(), FlashError> {
            self.0.free(segment)
        }
        fn segments(&self) -> Result<Vec<crate::SegmentNumber>, FlashError> {
            self.0.segments()
        }
        fn budget_bytes(&self) -> u64 {
            self.0.budget_bytes()
        }
    }

    #[test]
    fn stop_raises_a_panic_of_the_flusher_thread_instead_of_hiding_it() {
        let device = PanickingWrites(MemoryDevice::new(64 << 10, 64 << 20));
        let log = Arc::new(FlashLog::create(Arc::new(device), log().config().to_owned()).unwrap());
        log.append(&EntryRef::object(1, b"k", b"v", 1)).unwrap();
        log.seal_current();
        let flusher = BackgroundFlusher::spawn(Arc::clone(&log), Duration::from_micros(50));
        while !flusher.has_ended() {
            std::thread::yield_now();
        }
        let stopped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| flusher.stop()));
        assert!(stopped.is_err(), "the flusher's panic was hidden: {stopped:?}");
    }

    #[test]
    fn the_background_flusher_frees_buffers_for_appenders_and_the_pool_reads_every_entry() {
        let log = log();
        let flusher = BackgroundFlusher::spawn(Arc::clone(&log), Duration::from_micros(50));
        let value = vec![7u8; 3000];
        let addresses: Vec<FlashAddress> = (0..200u64)
            .map(|version| loop {
                match log.append(&EntryRef::object(1, &version.to_le_bytes(), &value, version)) {
                    Err(FlashError::BuffersBusy) => std::thread::yield_now(),
                    other => break other.unwrap(),
                }
            })
            .collect();
        assert_eq!(flusher.stop(), None);
        log.sync().unwrap();

        let pool = ReadPool::new(Arc::clone(&log), 4);
        let (sender, results) = std::sync::mpsc::channel();
        for &address in &addresses {
            let sender = sender.clone();
            pool.submit(address, Box::new(move |result| sender.send((address, result)).unwrap()));
        }
        drop(sender);
        let mut versions: Vec<u64> =
            results.iter().map(|(_, result)| result.unwrap().version).collect();
        versions.sort();
        assert_eq!(versions, (0..200).collect::<Vec<_>>());
    }
}
