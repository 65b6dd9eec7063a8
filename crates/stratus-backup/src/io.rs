//! The backup's I/O thread: every disk access of a running backup goes through one bounded
//! queue to one thread, so request handlers never block the async runtime.
//!
//! Group commit: the thread takes every queued job at once (a batch), performs the batch's
//! data writes in queue order, then writes each touched frame's newest metadata block once,
//! then syncs once for the whole batch, and only then completes the batch's writes. Appends
//! that arrive while a sync runs queue up and share the next one.
//!
//! Metadata slots alternate: a frame's new metadata goes to the slot that does not hold its
//! last synced metadata, so a torn metadata write leaves the previous, synced one intact (and
//! the data it certifies is never overwritten: replicas are append-only).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::format::{Geometry, ReplicaMetadata, METADATA_BLOCK_BYTES};
use crate::storage::ReplicaStorage;

/// Called with the outcome of a write, after the sync that made it durable (or failed).
pub(crate) type WriteCompletion = Box<dyn FnOnce(Result<(), String>) + Send>;
/// Called with the bytes read, or why they could not be.
pub(crate) type ReadCompletion = Box<dyn FnOnce(Result<Vec<u8>, String>) + Send>;

/// One unit of work for the I/O thread.
pub(crate) enum Job {
    /// Write `data` at `data_offset` of the frame's data area, then (once per batch and frame)
    /// the newest metadata; complete after the batch's sync.
    Write {
        frame: u32,
        data_offset: u32,
        data: Box<dyn AsRef<[u8]> + Send>,
        metadata: ReplicaMetadata,
        completion: WriteCompletion,
    },
    /// Read `length` bytes from the start of the frame's data area.
    Read { frame: u32, length: u32, completion: ReadCompletion },
    /// Zero both metadata slots of a freed frame, so its replica does not reappear.
    Clear { frame: u32 },
    /// Writes nothing; completes once every job queued before it is done (jobs complete in
    /// queue order), so a stopping backup can wait for writes it acknowledged before the disk.
    Barrier { completion: WriteCompletion },
}

/// A storage failure that stops the backup from acknowledging writes.
#[derive(Debug, Default)]
pub(crate) struct Poison {
    poisoned: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Poison {
    pub(crate) fn set(&self, reason: String) {
        let mut stored = self.reason.lock().unwrap_or_else(|poison| poison.into_inner());
        if stored.is_none() {
            tracing::error!(%reason, "backup storage failed; refusing further writes");
            *stored = Some(reason);
        }
        self.poisoned.store(true, Ordering::SeqCst);
    }

    pub(crate) fn reason(&self) -> Option<String> {
        if !self.poisoned.load(Ordering::SeqCst) {
            return None;
        }
        self.reason.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }
}

/// Counters of the I/O thread.
#[derive(Debug, Default)]
pub(crate) struct IoCounters {
    pub(crate) syncs: AtomicU64,
    pub(crate) write_jobs: AtomicU64,
    pub(crate) data_bytes_written: AtomicU64,
    pub(crate) metadata_blocks_written: AtomicU64,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    shutdown: bool,
}

/// The bounded job queue between request handlers and the I/O thread.
pub(crate) struct IoQueue {
    state: Mutex<QueueState>,
    /// Wakes the I/O thread.
    ready: Condvar,
    /// Wakes the I/O task instead, when the jobs run on the runtime (`io_on_runtime`).
    ready_task: tokio::sync::Notify,
    capacity: usize,
}

impl std::fmt::Debug for IoQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue").field("capacity", &self.capacity).finish()
    }
}

impl IoQueue {
    pub(crate) fn new(capacity: usize) -> IoQueue {
        IoQueue {
            state: Mutex::new(QueueState::default()),
            ready: Condvar::new(),
            ready_task: tokio::sync::Notify::new(),
            capacity,
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// True if a push would be accepted now. Callers that must not fail after changing state
    /// check this first while holding the lock that serializes their pushes.
    pub(crate) fn has_room(&self) -> bool {
        let state = self.lock();
        !state.shutdown && state.jobs.len() < self.capacity
    }

    /// Queues a job; gives it back if the queue is full or shut down.
    pub(crate) fn push(&self, job: Job) -> Result<(), Box<Job>> {
        let mut state = self.lock();
        if state.shutdown || state.jobs.len() >= self.capacity {
            return Err(Box::new(job));
        }
        state.jobs.push_back(job);
        drop(state);
        self.ready.notify_one();
        self.ready_task.notify_one();
        Ok(())
    }

    /// Asks the thread to finish the queued jobs and stop.
    pub(crate) fn shut_down(&self) {
        self.lock().shutdown = true;
        self.ready.notify_all();
        self.ready_task.notify_one();
    }

    /// Every queued job without waiting: `Ok(None)` if there is none yet, `Err(())` once shut
    /// down and drained.
    fn try_take_batch(&self) -> Result<Option<Vec<Job>>, ()> {
        let mut state = self.lock();
        if !state.jobs.is_empty() {
            return Ok(Some(state.jobs.drain(..).collect()));
        }
        if state.shutdown {
            return Err(());
        }
        Ok(None)
    }

    /// Every queued job, waiting for one; `None` once shut down and drained.
    fn take_batch(&self) -> Option<Vec<Job>> {
        let mut state = self.lock();
        loop {
            if !state.jobs.is_empty() {
                return Some(state.jobs.drain(..).collect());
            }
            if state.shutdown {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|poison| poison.into_inner());
        }
    }
}

/// What the I/O thread knows about a frame's metadata slots.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FrameSlots {
    /// The slot holding the newest synced, valid metadata, if any.
    pub(crate) durable_slot: Option<u8>,
    /// The highest sequence number written to the frame so far.
    pub(crate) sequence: u64,
}

impl FrameSlots {
    fn next_slot(&self) -> u8 {
        match self.durable_slot {
            Some(slot) => slot ^ 1,
            None => 0,
        }
    }
}

/// Everything the I/O thread owns.
pub(crate) struct IoThread {
    pub(crate) queue: Arc<IoQueue>,
    pub(crate) storage: Arc<dyn ReplicaStorage>,
    pub(crate) geometry: Geometry,
    pub(crate) frames: Vec<FrameSlots>,
    pub(crate) poison: Arc<Poison>,
    pub(crate) counters: Arc<IoCounters>,
}

impl IoThread {
    /// Runs until the queue is shut down and drained.
    pub(crate) fn run(mut self) {
        while let Some(batch) = self.queue.take_batch() {
            self.process(batch);
        }
    }

    /// The same loop as a task of the runtime (`io_on_runtime`): each batch is processed
    /// without yielding, as the thread would.
    pub(crate) async fn run_on_runtime(mut self) {
        let queue = self.queue.clone();
        loop {
            match queue.try_take_batch() {
                Ok(Some(batch)) => self.process(batch),
                // Notify keeps one permit for a push that came before this wait.
                Ok(None) => queue.ready_task.notified().await,
                Err(()) => return,
            }
        }
    }

    fn process(&mut self, batch: Vec<Job>) {
        let mut completions: Vec<WriteCompletion> = Vec::new();
        let mut newest_metadata: BTreeMap<u32, ReplicaMetadata> = BTreeMap::new();
        let mut failure: Option<String> = self.poison.reason();
        let mut wrote = false;
        for job in batch {
            match job {
                Job::Write { frame, data_offset, data, metadata, completion } => {
                    completions.push(completion);
                    self.counters.write_jobs.fetch_add(1, Ordering::Relaxed);
                    if failure.is_some() {
                        continue;
                    }
                    let bytes: &[u8] = (*data).as_ref();
                    if !bytes.is_empty() {
                        let offset = self.geometry.data_offset(frame) + u64::from(data_offset);
                        if let Err(error) = self.storage.write_at(offset, bytes) {
                            failure = Some(format!("writing frame {frame}: {error}"));
                            continue;
                        }
                        self.counters
                            .data_bytes_written
                            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    }
                    newest_metadata.insert(frame, metadata);
                    wrote = true;
                }
                Job::Read { frame, length, completion } => {
                    let mut bytes = vec![0u8; length as usize];
                    let offset = self.geometry.data_offset(frame);
                    let result = self
                        .storage
                        .read_at(offset, &mut bytes)
                        .map(|()| bytes)
                        .map_err(|error| format!("reading frame {frame}: {error}"));
                    completion(result);
                }
                Job::Clear { frame } => {
                    newest_metadata.remove(&frame);
                    if failure.is_some() {
                        continue;
                    }
                    let zeros = [0u8; METADATA_BLOCK_BYTES];
                    for slot in 0..2 {
                        let offset = self.geometry.slot_offset(frame, slot);
                        if let Err(error) = self.storage.write_at(offset, &zeros) {
                            failure = Some(format!("clearing frame {frame}: {error}"));
                        }
                    }
                    if let Some(slots) = self.frames.get_mut(frame as usize) {
                        slots.durable_slot = None;
                    }
                    wrote = true;
                }
                Job::Barrier { completion } => completions.push(completion),
            }
        }
        // The newest metadata of each frame, into the slot that is not the synced one.
        let mut written_slots: Vec<(u32, u8)> = Vec::new();
        if failure.is_none() {
            for (frame, mut metadata) in newest_metadata {
                let Some(slots) = self.frames.get_mut(frame as usize) else {
                    failure = Some(format!("frame {frame} does not exist"));
                    break;
                };
                slots.sequence += 1;
                metadata.sequence = slots.sequence;
                let slot = slots.next_slot();
                let offset = self.geometry.slot_offset(frame, slot);
                if let Err(error) = self.storage.write_at(offset, &metadata.encode()) {
                    failure = Some(format!("writing metadata of frame {frame}: {error}"));
                    break;
                }
                self.counters.metadata_blocks_written.fetch_add(1, Ordering::Relaxed);
                written_slots.push((frame, slot));
            }
        }
        if wrote && failure.is_none() {
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = self.storage.sync() {
                failure = Some(format!("sync failed: {error}"));
            }
        }
        match failure {
            Some(reason) => {
                self.poison.set(reason.clone());
                for completion in completions {
                    completion(Err(reason.clone()));
                }
            }
            None => {
                for (frame, slot) in written_slots {
                    if let Some(slots) = self.frames.get_mut(frame as usize) {
                        slots.durable_slot = Some(slot);
                    }
                }
                for completion in completions {
                    completion(Ok(()));
                }
            }
        }
    }
}
