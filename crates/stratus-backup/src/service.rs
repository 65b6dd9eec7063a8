//! The backup service: replica state, RAM buffers, durability modes, and the RPC handlers.

use std::collections::btree_map::Entry as MapEntry;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use stratus_rpc::{Handled, Service};
use stratus_types::limits::BACKUP_BUFFERS_KEPT_FREE_MAX;
use stratus_types::{SegmentId, ServerId};
use stratus_wire::{
    decode_request, encode_error_response, encode_response, BackupDurability,
    BackupServiceStatistics, BackupWriteFlags, FrameHeader, Opcode, RecoveryTablet,
    ReplicaCertificate, ReplicaEntry, Request, Response, Status, BACKUP_REPLICAS_MAX,
    REPLICA_BYTES_MAX,
};
use tokio::sync::oneshot;

use crate::format::{
    Geometry, ReplicaMetadata, FILE_HEADER_BYTES, FILE_MAGIC, METADATA_BLOCK_BYTES,
};
use crate::io::{IoCounters, IoQueue, IoThread, Job, Poison};
use crate::partitioning::{self, partition_replica, Partitionings, RECOVERY_PARTITIONED_BYTES_MAX};
use crate::scan::scan;
use crate::storage::{DirectFileStorage, FileStorage, ReplicaStorage};

/// Replica reads from disk in flight at once: each holds a whole replica in memory until its
/// response is sent, so this bounds that memory (16 × 8 MiB); more answer RETRY.
pub const DISK_READS_IN_FLIGHT_MAX: usize = 16;

/// Name of the storage file inside a backup directory.
pub const STORAGE_FILE_NAME: &str = "replicas.stratus-backup";

/// When a backup acknowledges a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Once the bytes are in the backup's RAM buffer (RAMCloud's assumption: a write survives
    /// the crash of any R - 1 of its R backups, not a power loss of all of them). A replica is
    /// written to disk in one sequential write, and synced, when it is closed.
    Buffered,
    /// Once the bytes and the metadata that certifies them are on disk (after fdatasync);
    /// concurrent writes share one sync. Survives a power loss of the whole cluster.
    Fsync,
}

impl Durability {
    /// The name used on the command line and in status output.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Buffered => "buffered",
            Durability::Fsync => "fsync",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = String;

    fn from_str(text: &str) -> Result<Durability, String> {
        match text {
            "buffered" => Ok(Durability::Buffered),
            "fsync" => Ok(Durability::Fsync),
            other => Err(format!("unknown durability {other:?} (expected buffered or fsync)")),
        }
    }
}

/// Settings of a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupConfig {
    /// Capacity of one replica, in bytes (the cluster's segment size); at most
    /// `REPLICA_BYTES_MAX`.
    pub segment_bytes: u32,
    /// Storage frames: the most replicas held at once (at most `BACKUP_REPLICAS_MAX`).
    pub frame_count: u32,
    /// RAM buffers of up to `segment_bytes` each: the most replicas open at once (in buffered
    /// mode, also closed replicas not yet on disk).
    pub buffer_count: usize,
    /// When writes are acknowledged.
    pub durability: Durability,
    /// Most disk jobs queued for the I/O thread; when it is full, requests answer RETRY.
    pub io_queue_jobs_max: usize,
    /// Open the storage file with O_DIRECT ([`crate::DirectFileStorage`]): replica writes
    /// bypass the page cache.
    pub direct_io: bool,
    /// Run the disk jobs on a task of the tokio runtime that opens the backup instead of on a
    /// dedicated I/O thread. Only for the deterministic simulator, whose storage is memory and
    /// whose nodes each run on one thread: a second OS thread would make the order of events
    /// depend on the operating system's scheduler. Real disks need the thread (a blocking
    /// write or sync must not stall the requests of every other task).
    pub io_on_runtime: bool,
    /// Most bytes of crashed masters' replicas cut for recovery masters and not fetched yet
    /// (BACKUP_START_PARTITIONING pauses reading past it).
    pub recovery_partitioned_bytes_max: usize,
}

impl BackupConfig {
    /// Default RAM buffers.
    pub const BUFFER_COUNT_DEFAULT: usize = 32;
    /// Default storage frames.
    pub const FRAME_COUNT_DEFAULT: u32 = 512;
    /// Default I/O queue bound.
    pub const IO_QUEUE_JOBS_MAX_DEFAULT: usize = 4_096;

    /// Defaults for replicas of `segment_bytes`: 512 frames, 32 buffers, buffered.
    pub fn new(segment_bytes: u32) -> BackupConfig {
        BackupConfig {
            segment_bytes,
            frame_count: Self::FRAME_COUNT_DEFAULT,
            buffer_count: Self::BUFFER_COUNT_DEFAULT,
            durability: Durability::Buffered,
            io_queue_jobs_max: Self::IO_QUEUE_JOBS_MAX_DEFAULT,
            direct_io: false,
            io_on_runtime: false,
            recovery_partitioned_bytes_max: RECOVERY_PARTITIONED_BYTES_MAX,
        }
    }

    /// Checks every bound; `Err` says which.
    pub fn validate(&self) -> Result<(), String> {
        if self.segment_bytes == 0 || self.segment_bytes as usize > REPLICA_BYTES_MAX {
            return Err(format!(
                "backup segment bytes must be in 1..={REPLICA_BYTES_MAX}, not {}",
                self.segment_bytes
            ));
        }
        if self.frame_count == 0 || self.frame_count as usize > BACKUP_REPLICAS_MAX {
            return Err(format!(
                "backup frame count must be in 1..={BACKUP_REPLICAS_MAX}, not {}",
                self.frame_count
            ));
        }
        if self.buffer_count == 0 {
            return Err("backup buffer count must be at least 1".to_string());
        }
        if self.io_queue_jobs_max == 0 {
            return Err("backup I/O queue bound must be at least 1".to_string());
        }
        Ok(())
    }

    /// The storage layout for this configuration.
    pub fn geometry(&self) -> Geometry {
        Geometry { segment_bytes: self.segment_bytes, frame_count: self.frame_count }
    }
}

/// A refused backup request: the status and a human-readable reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupError {
    /// The status to answer with.
    pub status: Status,
    /// Why.
    pub message: String,
}

impl BackupError {
    fn new(status: Status, message: impl Into<String>) -> BackupError {
        BackupError { status, message: message.into() }
    }
}

impl fmt::Display for BackupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for BackupError {}

/// One BACKUP_WRITE (docs/design/wire-protocol.md gives the rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaWrite {
    /// The master whose segment this is.
    pub master_id: ServerId,
    /// The segment.
    pub segment_id: SegmentId,
    /// Replica epoch.
    pub epoch: u64,
    /// Where `data` starts.
    pub offset: u32,
    /// Open, close, primary.
    pub flags: BackupWriteFlags,
    /// The certificate after this write.
    pub certificate: ReplicaCertificate,
    /// Segment bytes.
    pub data: Bytes,
}

/// One replica's certified contents, as BACKUP_READ_REPLICA returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaContents {
    /// Replica epoch.
    pub epoch: u64,
    /// Certificate; `data` is exactly its length.
    pub certificate: ReplicaCertificate,
    /// The segment is complete.
    pub closed: bool,
    /// The primary replica.
    pub primary: bool,
    /// The certified bytes.
    pub data: Bytes,
}

/// What a backup found on its storage when it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// Replicas found valid (listed by BACKUP_LIST_REPLICAS).
    pub replicas_found: usize,
    /// Why each discarded frame or metadata slot was discarded (also logged).
    pub discarded: Vec<String>,
}

/// Counters for `stratus status` and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupStatistics {
    /// Durability mode.
    pub durability: Durability,
    /// Replicas held.
    pub replicas: usize,
    /// Replicas not closed yet.
    pub replicas_open: usize,
    /// RAM buffers in use, of `buffer_count`.
    pub buffers_in_use: usize,
    /// RAM buffers configured.
    pub buffer_count: usize,
    /// Storage frames not holding a replica.
    pub frames_free: usize,
    /// Storage frames.
    pub frame_count: u32,
    /// Syncs issued (each one a group commit of every write in its batch).
    pub disk_syncs: u64,
    /// Write jobs completed by those syncs.
    pub disk_write_jobs: u64,
    /// Segment bytes written to disk.
    pub disk_data_bytes_written: u64,
    /// Metadata blocks written to disk.
    pub disk_metadata_blocks_written: u64,
    /// Why the backup refuses writes, if its storage failed.
    pub storage_failure: Option<String>,
    /// Replicas of crashed masters read once and cut into every recovery partition
    /// (BACKUP_START_PARTITIONING).
    pub recovery_replicas_partitioned: u64,
    /// BACKUP_GET_RECOVERY_DATA answered with a part cut ahead.
    pub recovery_parts_fetched: u64,
    /// BACKUP_GET_RECOVERY_DATA that read and filtered the replica on demand.
    pub recovery_parts_filtered_on_demand: u64,
}

/// A place in a bounded count (RAM buffers, disk reads in flight), given back when dropped,
/// wherever its holder ends up (a freed replica, a completed flush or read), so the count
/// cannot leak.
#[derive(Debug)]
struct CountPermit {
    in_use: Arc<AtomicUsize>,
}

impl CountPermit {
    fn acquire(in_use: &Arc<AtomicUsize>, max: usize) -> Option<CountPermit> {
        in_use
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |count| {
                (count < max).then_some(count + 1)
            })
            .ok()
            .map(|_| CountPermit { in_use: in_use.clone() })
    }
}

impl Drop for CountPermit {
    fn drop(&mut self) {
        self.in_use.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A replica's bytes in RAM. Dropped (replica written to disk, freed, or never used), its
/// memory goes back to the pool it came from; the permit is released after that, so buffers
/// in use and kept free together stay within the buffer count.
#[derive(Debug)]
struct ReplicaBuffer {
    bytes: Vec<u8>,
    pool: Arc<BufferPool>,
    _permit: CountPermit,
}

impl Drop for ReplicaBuffer {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.bytes));
    }
}

/// Segment-sized buffers no replica uses now, kept mapped for the next replicas (at most
/// [`BACKUP_BUFFERS_KEPT_FREE_MAX`]).
#[derive(Debug)]
struct BufferPool {
    buffer_bytes: usize,
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    fn new(buffer_bytes: usize) -> BufferPool {
        BufferPool { buffer_bytes, free: Mutex::new(Vec::new()) }
    }

    /// An empty buffer with room for a whole segment.
    fn take(&self) -> Vec<u8> {
        let kept = self.free.lock().unwrap_or_else(PoisonError::into_inner).pop();
        kept.unwrap_or_else(|| Vec::with_capacity(self.buffer_bytes))
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() != self.buffer_bytes {
            return; // not one of ours (the placeholder of a dropped buffer)
        }
        buffer.clear();
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < BACKUP_BUFFERS_KEPT_FREE_MAX {
            free.push(buffer);
        }
    }
}

impl AsRef<[u8]> for ReplicaBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[derive(Debug)]
struct Replica {
    frame: u32,
    epoch: u64,
    certificate: ReplicaCertificate,
    closed: bool,
    primary: bool,
    /// Bytes held (in `buffer`, on disk, or on their way to disk).
    length: u32,
    /// The bytes in RAM, while the replica is open. Without it, reads go to disk.
    buffer: Option<ReplicaBuffer>,
}

impl Replica {
    fn metadata(&self, key: (ServerId, SegmentId)) -> ReplicaMetadata {
        ReplicaMetadata {
            sequence: 0, // assigned by the I/O thread
            master_id: key.0,
            segment_id: key.1,
            epoch: self.epoch,
            certificate: self.certificate,
            closed: self.closed,
            primary: self.primary,
        }
    }

    fn entry(&self, key: (ServerId, SegmentId)) -> ReplicaEntry {
        ReplicaEntry {
            master_id: key.0,
            segment_id: key.1,
            epoch: self.epoch,
            certificate: self.certificate,
            closed: self.closed,
            primary: self.primary,
        }
    }
}

#[derive(Debug, Default)]
struct State {
    replicas: BTreeMap<(ServerId, SegmentId), Replica>,
    /// Free frames, taken from the end.
    free_frames: Vec<u32>,
    /// Masters the coordinator declared crashed: their writes are refused, so a master that is
    /// still running (a zombie) can complete no write once its recovery has begun. Checked
    /// under the same lock as writes are applied, so a write is either applied before the
    /// fence (and seen by recovery, which reads after fencing) or refused. Bounded by
    /// [`FENCED_MASTERS_MAX`]; the oldest ids (the longest dead) are forgotten first.
    fenced_masters: BTreeSet<ServerId>,
    /// The server is stopping: open replicas are being written to disk, and no write is
    /// applied any more (it would miss that copy and be lost, though acknowledged).
    stopping: bool,
}

/// Crashed masters a backup remembers refusing (server ids are never reused, so the set only
/// grows; the oldest are dropped past this many).
pub const FENCED_MASTERS_MAX: usize = stratus_types::limits::SERVERS_MAX;

#[derive(Debug)]
pub(crate) struct Shared {
    config: BackupConfig,
    state: Mutex<State>,
    queue: Arc<IoQueue>,
    poison: Arc<Poison>,
    counters: Arc<IoCounters>,
    buffers_in_use: Arc<AtomicUsize>,
    buffer_pool: Arc<BufferPool>,
    disk_reads_in_flight: Arc<AtomicUsize>,
    requests_served: AtomicU64,
    /// Crashed masters' replicas being cut for their recovery masters.
    pub(crate) partitionings: Partitionings,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Reads a replica: at once from RAM, or once the I/O thread has read the disk.
    pub(crate) fn begin_read(
        &self,
        master_id: ServerId,
        segment_id: SegmentId,
    ) -> Pending<ReplicaContents> {
        let state = self.state();
        let Some(replica) = state.replicas.get(&(master_id, segment_id)) else {
            return Pending::Ready(Err(BackupError::new(
                Status::BackupBadSegmentId,
                format!("no replica of master {master_id} segment {segment_id}"),
            )));
        };
        let certificate = replica.certificate;
        let (epoch, closed, primary) = (replica.epoch, replica.closed, replica.primary);
        let length = certificate.segment_length;
        if let Some(buffer) = &replica.buffer {
            let data = Bytes::copy_from_slice(buffer.bytes.get(..length as usize).unwrap_or(&[]));
            return Pending::Ready(Ok(ReplicaContents {
                epoch,
                certificate,
                closed,
                primary,
                data,
            }));
        }
        let Some(permit) =
            CountPermit::acquire(&self.disk_reads_in_flight, DISK_READS_IN_FLIGHT_MAX)
        else {
            return Pending::Ready(Err(BackupError::new(
                Status::Retry,
                format!("{DISK_READS_IN_FLIGHT_MAX} replica reads from disk are in flight"),
            )));
        };
        let (sender, receiver) = oneshot::channel();
        let completion = Box::new(move |result: Result<Vec<u8>, String>| {
            drop(permit);
            let outcome = result
                .map(|bytes| ReplicaContents {
                    epoch,
                    certificate,
                    closed,
                    primary,
                    data: Bytes::from(bytes),
                })
                .map_err(|reason| {
                    BackupError::new(
                        Status::InternalError,
                        format!("reading the replica: {reason}"),
                    )
                });
            let _ = sender.send(outcome);
        });
        match self.queue.push(Job::Read { frame: replica.frame, length, completion }) {
            Ok(()) => Pending::Waiting(receiver),
            Err(_) => Pending::Ready(Err(queue_full())),
        }
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &BackupConfig {
        &self.config
    }

    /// Which of `segments` of `master_id` this backup holds the primary replica of.
    pub(crate) fn primary_replicas(
        &self,
        master_id: ServerId,
        segments: &[SegmentId],
    ) -> Vec<SegmentId> {
        let state = self.state();
        let mut primaries: Vec<SegmentId> = segments
            .iter()
            .copied()
            .filter(|&segment_id| {
                state.replicas.get(&(master_id, segment_id)).is_some_and(|replica| replica.primary)
            })
            .collect();
        primaries.sort_unstable();
        primaries.dedup();
        primaries
    }
}

/// The outcome of a request: ready now, or once the I/O thread has done its part.
#[derive(Debug)]
pub enum Pending<T> {
    /// Done.
    Ready(Result<T, BackupError>),
    /// Completes when the I/O thread is done.
    Waiting(oneshot::Receiver<Result<T, BackupError>>),
}

impl<T> Pending<T> {
    /// Waits for the outcome.
    pub async fn wait(self) -> Result<T, BackupError> {
        match self {
            Pending::Ready(result) => result,
            Pending::Waiting(receiver) => receiver.await.unwrap_or_else(|_| {
                Err(BackupError::new(Status::InternalError, "the backup stopped"))
            }),
        }
    }
}

/// The backup service of one storage server (see the crate documentation).
#[derive(Debug)]
pub struct BackupService {
    shared: Arc<Shared>,
    io_thread: Mutex<Option<JoinHandle<()>>>,
}

fn storage_failed(reason: String) -> BackupError {
    BackupError::new(
        Status::BackupStorageFailed,
        format!("backup storage failed, refusing writes until restarted: {reason}"),
    )
}

fn queue_full() -> BackupError {
    BackupError::new(Status::Retry, "backup disk queue is full")
}

fn offset_mismatch(held: u32, offset: u32, data_bytes: u64) -> BackupError {
    BackupError::new(
        Status::BackupOffsetMismatch,
        format!(
            "the backup holds {held} bytes; a write of {data_bytes} bytes at offset {offset} \
             does not continue them"
        ),
    )
}

fn certificate_too_long(certified: u32, held: u32) -> BackupError {
    BackupError::new(
        Status::InvalidParameter,
        format!("the certificate covers {certified} bytes but the replica holds {held}"),
    )
}

/// Checks a storage header against the configured geometry: `Ok(true)` if it matches,
/// `Ok(false)` if the storage is new (zero header), `Err` if it is foreign or of another
/// geometry.
///
/// A header whose magic is ours but for a few flipped bits, and that fails its checksum, was
/// damaged on the disk (a bad sector, a torn first write): it is reported as new, with a
/// warning, and rewritten from the configuration. The header holds nothing but the geometry,
/// which the configuration supplies, and every frame is validated on its own (metadata
/// checksum, certificate), so a frame the configured geometry does not fit is discarded, never
/// misread. Refusing to start instead would take every good replica on the disk offline over
/// one bad sector. A magic that is not nearly ours means a foreign file: refused.
fn check_header(header: &[u8], geometry: Geometry) -> Result<bool, String> {
    let decoded = match Geometry::decode_header(header) {
        Ok(decoded) => decoded,
        Err(reason) if is_damaged_header_of_ours(header) => {
            tracing::warn!(%reason, "backup storage header is damaged; rewriting it");
            return Ok(false);
        }
        Err(reason) => return Err(reason),
    };
    match decoded {
        Some(found) if found == geometry => Ok(true),
        Some(found) => Err(format!(
            "backup storage was made for {} frames of {} bytes, but is configured for {} frames \
             of {} bytes",
            found.frame_count, found.segment_bytes, geometry.frame_count, geometry.segment_bytes
        )),
        None => Ok(false),
    }
}

/// Most bits in which a damaged header's magic may differ from ours.
const DAMAGED_MAGIC_BITS_MAX: u32 = 2;

/// True if `header` starts with our magic but for at most `DAMAGED_MAGIC_BITS_MAX` bits.
fn is_damaged_header_of_ours(header: &[u8]) -> bool {
    let Some(magic) = header.get(..FILE_MAGIC.len()) else {
        return false;
    };
    let differing: u32 =
        magic.iter().zip(FILE_MAGIC.iter()).map(|(a, b)| (a ^ b).count_ones()).sum();
    differing <= DAMAGED_MAGIC_BITS_MAX
}

impl BackupService {
    /// Opens the backup's storage file in `directory` (creating both if missing), sized for
    /// `config`.
    pub fn open_directory(
        config: BackupConfig,
        directory: &Path,
    ) -> Result<(BackupService, RestartReport), String> {
        config.validate()?;
        std::fs::create_dir_all(directory)
            .map_err(|error| format!("{}: {error}", directory.display()))?;
        let path = directory.join(STORAGE_FILE_NAME);
        // An existing file made with another geometry is refused before it is resized.
        if let Ok(mut file) = std::fs::File::open(&path) {
            let mut header = [0u8; FILE_HEADER_BYTES];
            if std::io::Read::read_exact(&mut file, &mut header).is_ok() {
                check_header(&header, config.geometry())?;
            }
        }
        let capacity_bytes = config.geometry().total_bytes();
        let storage: Arc<dyn ReplicaStorage> = if config.direct_io {
            Arc::new(
                DirectFileStorage::open(&path, capacity_bytes)
                    .map_err(|error| format!("{} (O_DIRECT): {error}", path.display()))?,
            )
        } else {
            Arc::new(
                FileStorage::open(&path, capacity_bytes)
                    .map_err(|error| format!("{}: {error}", path.display()))?,
            )
        };
        Self::open(config, storage)
    }

    /// Starts a backup on `storage`: writes the file header if the storage is new; otherwise
    /// checks it and scans every frame for replicas.
    pub fn open(
        config: BackupConfig,
        storage: Arc<dyn ReplicaStorage>,
    ) -> Result<(BackupService, RestartReport), String> {
        config.validate()?;
        let geometry = config.geometry();
        if storage.capacity_bytes() < geometry.total_bytes() {
            return Err(format!(
                "backup storage holds {} bytes, the configuration needs {}",
                storage.capacity_bytes(),
                geometry.total_bytes()
            ));
        }
        let mut header = [0u8; FILE_HEADER_BYTES];
        storage.read_at(0, &mut header).map_err(|error| format!("reading the header: {error}"))?;
        if !check_header(&header, geometry)? {
            // New storage, or a header of ours that a bad sector damaged: write it afresh
            // (the configuration says what it holds).
            storage
                .write_at(0, &geometry.encode_header())
                .and_then(|()| storage.sync())
                .map_err(|error| format!("writing the header: {error}"))?;
        }
        let found = scan(&*storage, geometry)?;
        for reason in &found.discarded {
            tracing::warn!(%reason, "backup discarded what it found in a storage frame");
        }
        if !found.duplicate_frames.is_empty() {
            let zeros = [0u8; METADATA_BLOCK_BYTES];
            for &frame in &found.duplicate_frames {
                for slot in 0..2 {
                    storage
                        .write_at(geometry.slot_offset(frame, slot), &zeros)
                        .map_err(|error| format!("clearing frame {frame}: {error}"))?;
                }
            }
            storage.sync().map_err(|error| format!("clearing duplicate frames: {error}"))?;
        }
        let mut state = State { free_frames: found.free_frames, ..State::default() };
        for (key, replica) in &found.replicas {
            let metadata = replica.metadata;
            state.replicas.insert(
                *key,
                Replica {
                    frame: replica.frame,
                    epoch: metadata.epoch,
                    certificate: metadata.certificate,
                    closed: metadata.closed,
                    primary: metadata.primary,
                    length: metadata.certificate.segment_length,
                    buffer: None,
                },
            );
        }
        let report =
            RestartReport { replicas_found: found.replicas.len(), discarded: found.discarded };
        if report.replicas_found > 0 {
            tracing::info!(replicas = report.replicas_found, "backup found replicas on disk");
        }
        let queue = Arc::new(IoQueue::new(config.io_queue_jobs_max));
        let poison = Arc::new(Poison::default());
        let counters = Arc::new(IoCounters::default());
        let io = IoThread {
            queue: queue.clone(),
            storage,
            geometry,
            frames: found.frames,
            poison: poison.clone(),
            counters: counters.clone(),
        };
        let thread = if config.io_on_runtime {
            let runtime = tokio::runtime::Handle::try_current()
                .map_err(|_| "io_on_runtime needs a tokio runtime to open the backup on")?;
            runtime.spawn(io.run_on_runtime());
            None
        } else {
            let thread = std::thread::Builder::new()
                .name("backup-io".to_string())
                .spawn(move || io.run())
                .map_err(|error| format!("starting the backup I/O thread: {error}"))?;
            Some(thread)
        };
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(state),
            queue,
            poison,
            counters,
            buffers_in_use: Arc::new(AtomicUsize::new(0)),
            buffer_pool: Arc::new(BufferPool::new(config.segment_bytes as usize)),
            disk_reads_in_flight: Arc::new(AtomicUsize::new(0)),
            requests_served: AtomicU64::new(0),
            partitionings: Partitionings::default(),
        });
        Ok((BackupService { shared, io_thread: Mutex::new(thread) }, report))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.state()
    }

    /// The configuration.
    pub fn config(&self) -> &BackupConfig {
        &self.shared.config
    }

    /// The durability mode.
    pub fn durability(&self) -> Durability {
        self.shared.config.durability
    }

    /// Current counters.
    pub fn statistics(&self) -> BackupStatistics {
        let state = self.state();
        let counters = &self.shared.counters;
        let partitioning = &self.shared.partitionings.counters;
        BackupStatistics {
            durability: self.shared.config.durability,
            replicas: state.replicas.len(),
            replicas_open: state.replicas.values().filter(|replica| !replica.closed).count(),
            buffers_in_use: self.shared.buffers_in_use.load(Ordering::SeqCst),
            buffer_count: self.shared.config.buffer_count,
            frames_free: state.free_frames.len(),
            frame_count: self.shared.config.frame_count,
            disk_syncs: counters.syncs.load(Ordering::Relaxed),
            disk_write_jobs: counters.write_jobs.load(Ordering::Relaxed),
            disk_data_bytes_written: counters.data_bytes_written.load(Ordering::Relaxed),
            disk_metadata_blocks_written: counters.metadata_blocks_written.load(Ordering::Relaxed),
            storage_failure: self.shared.poison.reason(),
            recovery_replicas_partitioned: partitioning
                .replicas_partitioned
                .load(Ordering::Relaxed),
            recovery_parts_fetched: partitioning.parts_fetched.load(Ordering::Relaxed),
            recovery_parts_filtered_on_demand: partitioning
                .filtered_on_demand
                .load(Ordering::Relaxed),
        }
    }

    /// The counters as BACKUP_GET_STATISTICS reports them.
    pub fn wire_statistics(&self) -> BackupServiceStatistics {
        let statistics = self.statistics();
        let count = |value: usize| u32::try_from(value).unwrap_or(u32::MAX);
        BackupServiceStatistics {
            durability: match statistics.durability {
                Durability::Buffered => BackupDurability::Buffered,
                Durability::Fsync => BackupDurability::Fsync,
            },
            replicas: count(statistics.replicas),
            replicas_open: count(statistics.replicas_open),
            buffers_in_use: count(statistics.buffers_in_use),
            buffer_count: count(statistics.buffer_count),
            frames_free: count(statistics.frames_free),
            frame_count: statistics.frame_count,
            disk_syncs: statistics.disk_syncs,
            disk_write_jobs: statistics.disk_write_jobs,
            disk_data_bytes_written: statistics.disk_data_bytes_written,
            storage_failure: statistics.storage_failure,
        }
    }

    /// Requests served since start.
    pub fn requests_served(&self) -> u64 {
        self.shared.requests_served.load(Ordering::Relaxed)
    }

    /// The replicas of `master_id` (of every master for id 0), by master then segment.
    pub fn list(&self, master_id: ServerId) -> Vec<ReplicaEntry> {
        self.state()
            .replicas
            .iter()
            .filter(|((master, _), _)| master_id.0 == 0 || *master == master_id)
            .map(|(key, replica)| replica.entry(*key))
            .collect()
    }

    /// Applies a write (BACKUP_WRITE) and waits until it is as durable as the mode promises.
    pub async fn write(&self, write: ReplicaWrite) -> Result<(), BackupError> {
        self.begin_write(write).wait().await
    }

    /// Reads a replica's certified bytes (BACKUP_READ_REPLICA).
    pub async fn read(
        &self,
        master_id: ServerId,
        segment_id: SegmentId,
    ) -> Result<ReplicaContents, BackupError> {
        self.begin_read(master_id, segment_id).wait().await
    }

    /// On a graceful stop in buffered mode: writes every open replica held only in RAM to its
    /// storage frame (bytes and metadata, as fsync mode keeps them), and waits until they are
    /// on disk, at most `patience`. A restarted backup then finds them, so the crashed
    /// masters' heads can be recovered after a whole-cluster restart; only a crash of the
    /// backup process (or the machine) loses them, as buffered durability says. Returns how
    /// many replicas were written.
    pub async fn flush_open_replicas(&self, patience: std::time::Duration) -> usize {
        if self.shared.config.durability != Durability::Buffered {
            return 0;
        }
        let deadline = tokio::time::Instant::now() + patience;
        let mut waiting = Vec::new();
        let open: Vec<(ServerId, SegmentId)> = {
            let mut state = self.state();
            state.stopping = true;
            state
                .replicas
                .iter()
                .filter(|(_, replica)| !replica.closed && replica.buffer.is_some())
                .map(|(key, _)| *key)
                .collect()
        };
        for key in open {
            loop {
                let pushed = {
                    let state = self.state();
                    let Some(replica) = state.replicas.get(&key) else { break };
                    let Some(buffer) = &replica.buffer else { break };
                    if !self.shared.queue.has_room() {
                        false
                    } else {
                        let (sender, receiver) = oneshot::channel();
                        let completion = Box::new(move |result: Result<(), String>| {
                            let _ = sender.send(result);
                        });
                        let data: Box<dyn AsRef<[u8]> + Send> =
                            Box::new(Bytes::copy_from_slice(&buffer.bytes));
                        let job = Job::Write {
                            frame: replica.frame,
                            data_offset: 0,
                            data,
                            metadata: replica.metadata(key),
                            completion,
                        };
                        if self.push(job).is_ok() {
                            waiting.push(receiver);
                        }
                        true
                    }
                };
                if pushed || tokio::time::Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        // Then everything queued before, such as closed replicas and raised epochs that were
        // acknowledged before they reached the disk (buffered mode): the queue completes jobs
        // in order, so this barrier completes after them.
        let barrier = loop {
            let (sender, receiver) = oneshot::channel();
            let completion = Box::new(move |result: Result<(), String>| {
                let _ = sender.send(result);
            });
            if self.push(Job::Barrier { completion }).is_ok() {
                break Some(receiver);
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        };
        let mut written = 0;
        for receiver in waiting {
            if let Ok(Ok(Ok(()))) = tokio::time::timeout_at(deadline, receiver).await {
                written += 1;
            }
        }
        let drained = match barrier {
            Some(receiver) => {
                matches!(tokio::time::timeout_at(deadline, receiver).await, Ok(Ok(Ok(()))))
            }
            None => false,
        };
        if !drained {
            tracing::warn!("the backup's earlier disk writes did not finish before the stop");
        }
        written
    }

    /// True once `master_id` was fenced.
    pub fn is_fenced(&self, master_id: ServerId) -> bool {
        self.state().fenced_masters.contains(&master_id)
    }

    /// Refuses every later write of `master_id` (BACKUP_FENCE_MASTER; idempotent).
    pub fn fence_master(&self, master_id: ServerId) {
        let mut state = self.state();
        if state.fenced_masters.insert(master_id) {
            // Every recovery fences, restarts included: routine, not a warning (the coordinator
            // warns of a crash when it declares one).
            tracing::info!(%master_id, "master fenced for its recovery: refusing its writes");
        }
        while state.fenced_masters.len() > FENCED_MASTERS_MAX {
            state.fenced_masters.pop_first();
        }
    }

    /// Applies a write; the outcome is ready at once unless it waits for the disk.
    pub fn begin_write(&self, write: ReplicaWrite) -> Pending<()> {
        match self.apply_write(write) {
            Ok(pending) => pending,
            Err(error) => Pending::Ready(Err(error)),
        }
    }

    fn apply_write(&self, write: ReplicaWrite) -> Result<Pending<()>, BackupError> {
        if let Some(reason) = self.shared.poison.reason() {
            return Err(storage_failed(reason));
        }
        let config = &self.shared.config;
        let key = (write.master_id, write.segment_id);
        let data_bytes = write.data.len() as u64;
        let end = u64::from(write.offset) + data_bytes;
        if end > u64::from(config.segment_bytes) {
            return Err(BackupError::new(
                Status::BackupSegmentOverflow,
                format!(
                    "a write of {data_bytes} bytes at offset {} ends past the replica capacity \
                     of {} bytes",
                    write.offset, config.segment_bytes
                ),
            ));
        }
        // At most the capacity, a u32.
        let end = end as u32;
        let mut state = self.state();
        if state.stopping {
            return Err(BackupError::new(Status::Retry, "the backup is stopping"));
        }
        if state.fenced_masters.contains(&write.master_id) {
            return Err(BackupError::new(
                Status::ServerCrashed,
                format!("master {} was declared crashed: its writes are refused", write.master_id),
            ));
        }
        let State { replicas, free_frames, .. } = &mut *state;
        let replica = match replicas.entry(key) {
            MapEntry::Occupied(entry) => entry.into_mut(),
            MapEntry::Vacant(entry) => {
                if !write.flags.open {
                    return Err(BackupError::new(
                        Status::BackupBadSegmentId,
                        format!("no replica of master {} segment {}", key.0, key.1),
                    ));
                }
                // Check the write against an empty replica before taking a buffer and a frame.
                if write.offset != 0 {
                    return Err(offset_mismatch(0, write.offset, data_bytes));
                }
                if write.certificate.segment_length > end {
                    return Err(certificate_too_long(write.certificate.segment_length, end));
                }
                if !self.shared.queue.has_room() {
                    return Err(queue_full());
                }
                let Some(permit) =
                    CountPermit::acquire(&self.shared.buffers_in_use, config.buffer_count)
                else {
                    return Err(BackupError::new(
                        Status::BackupOpenRejected,
                        format!("all {} replica buffers are in use", config.buffer_count),
                    ));
                };
                let Some(frame) = free_frames.pop() else {
                    return Err(BackupError::new(
                        Status::BackupOpenRejected,
                        format!("all {} storage frames hold replicas", config.frame_count),
                    ));
                };
                let buffer = ReplicaBuffer {
                    bytes: self.shared.buffer_pool.take(),
                    pool: self.shared.buffer_pool.clone(),
                    _permit: permit,
                };
                entry.insert(Replica {
                    frame,
                    epoch: write.epoch,
                    certificate: ReplicaCertificate::default(),
                    closed: false,
                    primary: false,
                    length: 0,
                    buffer: Some(buffer),
                })
            }
        };
        let appends = write.offset == replica.length && !write.data.is_empty();
        if appends {
            if replica.closed {
                return Err(BackupError::new(
                    Status::BackupReplicaClosed,
                    format!("the replica of master {} segment {} is closed", key.0, key.1),
                ));
            }
            if replica.buffer.is_none() {
                return Err(BackupError::new(
                    Status::BackupReplicaClosed,
                    format!(
                        "the replica of master {} segment {} was found on disk after a restart \
                         and is read-only",
                        key.0, key.1
                    ),
                ));
            }
        } else if end <= replica.length {
            // A re-send of bytes already held (or an empty write).
            let identical = match &replica.buffer {
                Some(buffer) => {
                    buffer.bytes.get(write.offset as usize..end as usize) == Some(&write.data[..])
                }
                // The bytes are on disk only: accept a re-send that carries the certificate
                // the backup holds (a retry whose acknowledgement was lost).
                None => write.data.is_empty() || write.certificate == replica.certificate,
            };
            if !identical {
                return Err(BackupError::new(
                    Status::BackupOffsetMismatch,
                    format!(
                        "re-sent bytes at offset {} differ from the {} bytes held",
                        write.offset, replica.length
                    ),
                ));
            }
        } else {
            return Err(offset_mismatch(replica.length, write.offset, data_bytes));
        }
        let length = if appends { end } else { replica.length };
        if write.certificate.segment_length > length {
            return Err(certificate_too_long(write.certificate.segment_length, length));
        }
        let newly_closed = write.flags.close && !replica.closed;
        // A raised epoch on a replica whose bytes live on disk only (closed, or found there
        // after a restart) exists nowhere else: no buffer is flushed for it at a stop. Its
        // metadata goes to disk before the write is acknowledged, or a master could record a
        // head at an epoch that no backup has after a whole-cluster restart (recovery then
        // waits forever for it).
        let raises_epoch_on_disk = write.epoch > replica.epoch && replica.buffer.is_none();
        let needs_disk = match config.durability {
            Durability::Buffered => newly_closed || raises_epoch_on_disk,
            Durability::Fsync => true,
        };
        if needs_disk && !self.shared.queue.has_room() {
            return Err(queue_full());
        }
        // Everything is checked: apply.
        if appends {
            if let Some(buffer) = replica.buffer.as_mut() {
                buffer.bytes.extend_from_slice(&write.data);
            }
            replica.length = length;
        }
        // A late duplicate of an older write never shrinks the certified prefix.
        if write.certificate.segment_length >= replica.certificate.segment_length {
            replica.certificate = write.certificate;
        }
        replica.epoch = replica.epoch.max(write.epoch);
        replica.closed |= write.flags.close;
        replica.primary |= write.flags.primary;
        let metadata = replica.metadata(key);
        let frame = replica.frame;
        match config.durability {
            Durability::Buffered => {
                if newly_closed {
                    // One sequential write of the whole replica, then a sync; the buffer is
                    // released when that is done. Reads of the replica now go to disk, queued
                    // behind this write.
                    let data: Box<dyn AsRef<[u8]> + Send> = match replica.buffer.take() {
                        Some(buffer) => Box::new(buffer),
                        None => Box::new(Bytes::new()),
                    };
                    let completion = Box::new(move |result: Result<(), String>| {
                        if let Err(reason) = result {
                            tracing::error!(
                                master = %key.0, segment = %key.1, %reason,
                                "writing a closed replica to disk failed"
                            );
                        }
                    });
                    self.push(Job::Write { frame, data_offset: 0, data, metadata, completion })?;
                } else if raises_epoch_on_disk {
                    let (sender, receiver) = oneshot::channel();
                    let completion = Box::new(move |result: Result<(), String>| {
                        let _ = sender.send(result.map_err(storage_failed));
                    });
                    let data: Box<dyn AsRef<[u8]> + Send> = Box::new(Bytes::new());
                    self.push(Job::Write { frame, data_offset: 0, data, metadata, completion })?;
                    return Ok(Pending::Waiting(receiver));
                }
                Ok(Pending::Ready(Ok(())))
            }
            Durability::Fsync => {
                let data: Box<dyn AsRef<[u8]> + Send> =
                    if appends { Box::new(write.data) } else { Box::new(Bytes::new()) };
                let (sender, receiver) = oneshot::channel();
                let completion = Box::new(move |result: Result<(), String>| {
                    let _ = sender.send(result.map_err(storage_failed));
                });
                if replica.closed {
                    // A closed replica is read from disk, queued behind this write.
                    replica.buffer = None;
                }
                self.push(Job::Write {
                    frame,
                    data_offset: write.offset,
                    data,
                    metadata,
                    completion,
                })?;
                Ok(Pending::Waiting(receiver))
            }
        }
    }

    /// Pushes a job. Callers checked for room under the state lock, which serializes pushes,
    /// so this fails only if the I/O thread stopped.
    fn push(&self, job: Job) -> Result<(), BackupError> {
        self.shared
            .queue
            .push(job)
            .map_err(|_| BackupError::new(Status::InternalError, "the backup I/O thread stopped"))
    }

    /// Reads a replica: at once from RAM, or once the I/O thread has read the disk.
    pub fn begin_read(
        &self,
        master_id: ServerId,
        segment_id: SegmentId,
    ) -> Pending<ReplicaContents> {
        self.shared.begin_read(master_id, segment_id)
    }

    /// Frees a replica (BACKUP_FREE); freeing one the backup does not hold is not an error.
    pub fn free(&self, master_id: ServerId, segment_id: SegmentId) -> Result<(), BackupError> {
        let mut state = self.state();
        let Some(replica) = state.replicas.get(&(master_id, segment_id)) else {
            return Ok(());
        };
        // Clear the frame's metadata before the frame can be reused (the queue keeps order).
        self.shared.queue.push(Job::Clear { frame: replica.frame }).map_err(|_| queue_full())?;
        if let Some(replica) = state.replicas.remove(&(master_id, segment_id)) {
            state.free_frames.push(replica.frame);
        }
        Ok(())
    }
}

impl Drop for BackupService {
    fn drop(&mut self) {
        // Finish the queued disk work (closed replicas' flushes, clears), then stop the thread.
        self.shared.queue.shut_down();
        let thread = self.io_thread.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// Encodes the answer to a backup request.
fn encode_outcome(
    out: &mut BytesMut,
    request_id: u64,
    opcode: Opcode,
    outcome: Result<Response, BackupError>,
) {
    match outcome {
        Ok(response) => encode_response(out, request_id, Status::Ok, &response),
        Err(error) => {
            encode_error_response(out, request_id, opcode.code(), error.status, &error.message)
        }
    }
}

/// BACKUP_GET_RECOVERY_DATA: the part of the replica that a recovery master of `tablets`
/// needs, cut ahead by a partitioning (BACKUP_START_PARTITIONING) when one did, or else read,
/// verified and filtered now (off the async runtime: a whole segment's checksums).
async fn recovery_data(
    shared: Arc<Shared>,
    master_id: ServerId,
    segment_id: SegmentId,
    tablets: Vec<RecoveryTablet>,
) -> Result<Response, BackupError> {
    let counters = &shared.partitionings.counters;
    if let Some((partitioning, part)) = shared.partitionings.find(master_id, segment_id, &tablets) {
        if let Some((data, certificate)) = partitioning.fetch(segment_id, part).await {
            counters.parts_fetched.fetch_add(1, Ordering::Relaxed);
            return Ok(Response::BackupGetRecoveryData { certificate, data });
        }
    }
    counters.filtered_on_demand.fetch_add(1, Ordering::Relaxed);
    let contents = shared.begin_read(master_id, segment_id).wait().await?;
    let mut parts = stratus_env::run_blocking(move || partition_replica(&contents, &[tablets]))
        .await
        .map_err(|error| BackupError::new(Status::InternalError, format!("filter task: {error}")))?
        .map_err(|reason| BackupError::new(Status::InternalError, reason))?;
    let (data, certificate) = parts.pop().expect("one part per partition");
    Ok(Response::BackupGetRecoveryData { certificate, data })
}

/// Answers now if the outcome is ready, or later from a future that waits for it.
fn answer<T: Send + 'static>(
    out: &mut BytesMut,
    request_id: u64,
    opcode: Opcode,
    pending: Pending<T>,
    respond: impl FnOnce(T) -> Response + Send + 'static,
) -> Handled {
    match pending {
        Pending::Ready(result) => {
            encode_outcome(out, request_id, opcode, result.map(respond));
            Handled::Done
        }
        waiting => Handled::Later(Box::pin(async move {
            let result = waiting.wait().await;
            let mut frame = BytesMut::new();
            encode_outcome(&mut frame, request_id, opcode, result.map(respond));
            frame
        })),
    }
}

impl Service for BackupService {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        self.shared.requests_served.fetch_add(1, Ordering::Relaxed);
        let request_id = header.request_id;
        let request = match decode_request(header.opcode_code, body) {
            Ok(request) => request,
            Err(error) => {
                let message = error.to_string();
                encode_error_response(
                    out,
                    request_id,
                    header.opcode_code,
                    error.status(),
                    &message,
                );
                return Handled::Done;
            }
        };
        match request {
            Request::Ping => {
                encode_response(out, request_id, Status::Ok, &Response::Ping);
                Handled::Done
            }
            Request::BackupWrite {
                master_id,
                segment_id,
                epoch,
                offset,
                flags,
                certificate,
                data,
            } => {
                let write =
                    ReplicaWrite { master_id, segment_id, epoch, offset, flags, certificate, data };
                let pending = self.begin_write(write);
                answer(out, request_id, Opcode::BackupWrite, pending, |()| Response::BackupWrite)
            }
            Request::BackupFree { master_id, segment_id } => {
                // A fenced master may be a zombie that thinks its backups died: the replicas it
                // would free are what its recovery reads. (Garbage collection frees through
                // `free` directly, once the master is removed.)
                let outcome = if self.is_fenced(master_id) {
                    Err(BackupError::new(
                        Status::ServerCrashed,
                        format!("master {master_id} was declared crashed: it frees nothing"),
                    ))
                } else {
                    self.free(master_id, segment_id)
                }
                .map(|()| Response::BackupFree);
                encode_outcome(out, request_id, Opcode::BackupFree, outcome);
                Handled::Done
            }
            Request::BackupListReplicas { master_id } => {
                let response = Response::BackupListReplicas { replicas: self.list(master_id) };
                encode_response(out, request_id, Status::Ok, &response);
                Handled::Done
            }
            Request::BackupGetStatistics => {
                let response = Response::BackupGetStatistics { statistics: self.wire_statistics() };
                encode_response(out, request_id, Status::Ok, &response);
                Handled::Done
            }
            Request::BackupFenceMaster { master_id } => {
                self.fence_master(master_id);
                encode_response(out, request_id, Status::Ok, &Response::BackupFenceMaster);
                Handled::Done
            }
            Request::BackupGetRecoveryData { master_id, segment_id, tablets } => {
                let shared = self.shared.clone();
                Handled::Later(Box::pin(async move {
                    let outcome = recovery_data(shared, master_id, segment_id, tablets).await;
                    let mut frame = BytesMut::new();
                    encode_outcome(&mut frame, request_id, Opcode::BackupGetRecoveryData, outcome);
                    frame
                }))
            }
            Request::BackupStartPartitioning { master_id, segments, partitions } => {
                // Only a fenced master's replicas can no longer change: a cut of a replica
                // that could still grow might miss writes acknowledged after it was made.
                if !self.is_fenced(master_id) {
                    let message = format!(
                        "master {master_id} is not fenced here (BACKUP_FENCE_MASTER first):                          its replicas may still change"
                    );
                    encode_outcome(
                        out,
                        request_id,
                        Opcode::BackupStartPartitioning,
                        Err(BackupError::new(Status::InvalidParameter, message)),
                    );
                    return Handled::Done;
                }
                let replicas_to_partition =
                    partitioning::start(&self.shared, master_id, &segments, partitions);
                let response = Response::BackupStartPartitioning { replicas_to_partition };
                encode_response(out, request_id, Status::Ok, &response);
                Handled::Done
            }
            Request::BackupReadReplica { master_id, segment_id } => {
                let pending = self.begin_read(master_id, segment_id);
                answer(out, request_id, Opcode::BackupReadReplica, pending, |contents| {
                    Response::BackupReadReplica {
                        epoch: contents.epoch,
                        certificate: contents.certificate,
                        closed: contents.closed,
                        primary: contents.primary,
                        data: contents.data,
                    }
                })
            }
            other => {
                let opcode = other.opcode();
                let message = format!("{opcode:?} is not a backup request");
                encode_error_response(
                    out,
                    request_id,
                    opcode.code(),
                    Status::UnimplementedRequest,
                    &message,
                );
                Handled::Done
            }
        }
    }
}

/// True for the opcodes the backup service serves (BACKUP_WRITE through BACKUP_GET_STATISTICS).
pub fn is_backup_opcode(code: u16) -> bool {
    matches!(
        Opcode::from_code(code),
        Some(
            Opcode::BackupWrite
                | Opcode::BackupFree
                | Opcode::BackupListReplicas
                | Opcode::BackupReadReplica
                | Opcode::BackupGetStatistics
                | Opcode::BackupFenceMaster
                | Opcode::BackupGetRecoveryData
                | Opcode::BackupStartPartitioning
        )
    )
}

/// Serves the backup RPCs with a [`BackupService`] and every other request with another
/// service (the master), so one port serves both.
#[derive(Clone)]
pub struct BackupRouter {
    backup: Arc<BackupService>,
    other: Arc<dyn Service>,
}

impl fmt::Debug for BackupRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackupRouter").field("backup", &self.backup).finish_non_exhaustive()
    }
}

impl BackupRouter {
    /// Routes the backup opcodes (50..=54) to `backup` and the rest to `other`.
    pub fn new(backup: Arc<BackupService>, other: Arc<dyn Service>) -> BackupRouter {
        BackupRouter { backup, other }
    }
}

impl Service for BackupRouter {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        if is_backup_opcode(header.opcode_code) {
            self.backup.handle(header, body, out)
        } else {
            self.other.handle(header, body, out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_pool_hands_back_kept_memory_and_keeps_a_bounded_number() {
        let pool = Arc::new(BufferPool::new(4096));
        let in_use = Arc::new(AtomicUsize::new(0));
        let buffer = |pool: &Arc<BufferPool>| ReplicaBuffer {
            bytes: pool.take(),
            pool: pool.clone(),
            _permit: CountPermit::acquire(&in_use, usize::MAX).expect("no limit"),
        };
        let mut first = buffer(&pool);
        first.bytes.extend_from_slice(b"replica bytes");
        let address = first.bytes.as_ptr();
        drop(first);
        // The memory comes back, emptied, with its capacity.
        let again = buffer(&pool);
        assert_eq!(again.bytes.as_ptr(), address);
        assert!(again.bytes.is_empty());
        assert_eq!(again.bytes.capacity(), 4096);
        drop(again);
        // Many buffers released at once: only the bound is kept.
        let many: Vec<_> = (0..BACKUP_BUFFERS_KEPT_FREE_MAX + 5).map(|_| buffer(&pool)).collect();
        assert_eq!(in_use.load(Ordering::SeqCst), BACKUP_BUFFERS_KEPT_FREE_MAX + 5);
        drop(many);
        assert_eq!(pool.free.lock().unwrap().len(), BACKUP_BUFFERS_KEPT_FREE_MAX);
        assert_eq!(in_use.load(Ordering::SeqCst), 0);
        // A buffer of another size is not kept.
        pool.give_back(Vec::with_capacity(10));
        assert_eq!(pool.free.lock().unwrap().len(), BACKUP_BUFFERS_KEPT_FREE_MAX);
    }
}
