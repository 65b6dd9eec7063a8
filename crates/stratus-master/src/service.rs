//! Request handling.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use stratus_env::WallClock;
use stratus_rpc::{Handled, Service};
use stratus_store::{ByteSink, CleanOutcome, ObjectError, ObjectStore, StoreConfig};
use stratus_types::limits::{ENUMERATE_RESPONSE_BYTES_MAX, KEY_BYTES_MAX};
use stratus_types::{
    key_hash, HashRange, RejectReason, RejectRules, SegmentId, ServerId, TableId, Version,
};
use stratus_wire::{
    begin_response, decode_request, encode_error_response, encode_response, finish_frame, put,
    EnumeratedObject, EnumerationCursor, FrameHeader, IncrementItem, IncrementItemResult, KeyItem,
    Opcode, ReadItemResult, RecoveryTablet, Request, Response, ServerStatistics, Status,
    VersionItemResult, WriteItem,
};

use crate::lease::Lease;
use crate::metrics::{MasterMetrics, Operation, RecoveryCounters};
use crate::migration::{
    CompletedTransfer, CompletedTransfers, IncomingTransfer, IncomingTransfers, MigrationFailure,
    Transfer, TransferStart,
};
use crate::ownership::{AssignmentRefusal, TabletOwnership, WriteRefusal};
use crate::recovery::{recover_partition, RecoveryContext, RecoveryReader};
use crate::replication::{LogPosition, ReplicaManager, SyncError};

/// How long a cleaner thread sleeps when the balancer finds nothing to do. Short enough that
/// the cleaner reacts long before the free seglets (at least the cleaning threshold of the log)
/// run out; long enough that an idle server costs no CPU to speak of.
const CLEANER_IDLE_SLEEP: std::time::Duration = std::time::Duration::from_millis(10);

/// Settings of a master.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// The object store's memory layout.
    pub store: StoreConfig,
}

/// The master service of one storage server.
#[derive(Debug)]
pub struct Master {
    server_id: ServerId,
    store: Arc<ObjectStore>,
    /// Present unless the master runs memory-only (replicas = 0).
    replication: Option<ReplicaManager>,
    ownership: Arc<TabletOwnership>,
    /// Tablets being received from other masters (which transfer each range belongs to).
    incoming: IncomingTransfers,
    /// Transfers out of this master that completed (answered again when asked again).
    completed_transfers: Arc<CompletedTransfers>,
    wall_clock: Arc<dyn WallClock>,
    /// Requests per operation and their latencies; recovery work.
    metrics: Arc<MasterMetrics>,
    /// What a change to the log needs until it is acknowledged, in one place so a request
    /// takes one reference (present with replication).
    sync_context: Option<Arc<SyncContext>>,
    /// Present when this master may be asked to recover a crashed master's tablets.
    recovery: Option<RecoveryReader>,
    /// Present when this master is a member of a cluster: it serves only while the lease is
    /// valid (see `lease.rs`). Absent in tests that drive a master alone.
    lease: Option<Arc<Lease>>,
    /// Partitions being recovered here now. Two recoveries of overlapping ranges never run at
    /// once (a late one failing would drop what the other replayed), and no range this master
    /// serves is recovered into (replay's removals are not atomic with client writes).
    recoveries_in_flight: Arc<std::sync::Mutex<Vec<RecoveryTablet>>>,
}

/// What a request that changed the log needs until it is answered: the replica manager it
/// waits for, the lease it must still hold, and the metrics that time it. Shared by every such
/// request (one reference count per request, rather than one per part).
#[derive(Debug)]
struct SyncContext {
    replication: ReplicaManager,
    lease: Option<Arc<Lease>>,
    metrics: Arc<MasterMetrics>,
}

/// Appends the value bytes the store copies out of the log directly to the response frame.
struct FrameSink<'a>(&'a mut BytesMut);

impl ByteSink for FrameSink<'_> {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

impl Master {
    /// A master with an empty log, for the server `server_id` (the log id in every segment
    /// header).
    pub fn new(
        server_id: ServerId,
        config: MasterConfig,
        wall_clock: Arc<dyn WallClock>,
    ) -> Result<Master, String> {
        config
            .store
            .validate()
            .map_err(|error| format!("invalid store configuration: {error:?}"))?;
        let memory = config.store.log_config().allocate_memory();
        Master::with_memory(server_id, config, wall_clock, memory)
    }

    /// [`Master::new`] with its log in `memory`, allocated (and prefaulted, which takes time)
    /// before the server enlisted: `config.store.log_config().allocate_memory()`.
    pub fn with_memory(
        server_id: ServerId,
        config: MasterConfig,
        wall_clock: Arc<dyn WallClock>,
        memory: stratus_log::seglet_memory::SegletMemory,
    ) -> Result<Master, String> {
        let store = ObjectStore::with_memory(config.store, server_id, memory)
            .map_err(|error| format!("invalid store configuration: {error:?}"))?;
        Ok(Master {
            server_id,
            store: Arc::new(store),
            replication: None,
            ownership: Arc::default(),
            incoming: IncomingTransfers::default(),
            completed_transfers: Arc::default(),
            wall_clock,
            metrics: Arc::default(),
            sync_context: None,
            recovery: None,
            lease: None,
            recoveries_in_flight: Arc::default(),
        })
    }

    /// The object store (for statistics and tests).
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// A shared handle on the object store, for the replica manager and the cleaner threads.
    pub fn store_handle(&self) -> Arc<ObjectStore> {
        self.store.clone()
    }

    /// Turns on replication: from now on a request that changes the log is answered only once
    /// `replication` holds the log up to it on every replica.
    pub fn set_replication(&mut self, replication: ReplicaManager) {
        self.replication = Some(replication);
        self.update_sync_context();
    }

    /// From now on, serves object requests only while `lease` is valid.
    pub fn set_lease(&mut self, lease: Arc<Lease>) {
        self.lease = Some(lease);
        self.update_sync_context();
    }

    fn update_sync_context(&mut self) {
        self.sync_context = self.replication.as_ref().map(|replication| {
            Arc::new(SyncContext {
                replication: replication.clone(),
                lease: self.lease.clone(),
                metrics: self.metrics.clone(),
            })
        });
    }

    /// Requests per operation with their latencies, and recovery work.
    pub fn metrics(&self) -> &MasterMetrics {
        &self.metrics
    }

    /// Tablets of crashed masters being recovered here now.
    pub fn tablets_recovering(&self) -> usize {
        self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).len()
    }

    /// True unless a lease is required and not held (expired, or the server was declared
    /// crashed): the check every object request passes first (public for invariant checkers
    /// such as the simulation's single-owner check).
    pub fn may_serve(&self) -> bool {
        self.lease.as_ref().is_none_or(|lease| lease.valid())
    }

    /// Lets this master serve RECOVER_TABLETS, reading replicas through `reader`.
    pub fn set_recovery_reader(&mut self, reader: RecoveryReader) {
        self.recovery = Some(reader);
    }

    /// Starts the log cleaner on `threads` threads of its own, concurrent with requests: each
    /// asks the store for one unit of work at a time (the store's balancer decides whether to
    /// clean and how; only one thread at a time runs combined cleaning, the others compact).
    /// The threads end when the master is dropped, or once survivors can no longer be made
    /// durable (the master was declared crashed, or replication stopped).
    pub fn start_cleaner(&self, threads: usize) -> std::io::Result<()> {
        for index in 0..threads {
            let store = Arc::downgrade(&self.store);
            let clock = self.wall_clock.clone();
            std::thread::Builder::new().name(format!("cleaner-{index}")).spawn(move || {
                while let Some(store) = store.upgrade() {
                    let outcome = store.clean_once(clock.now_seconds());
                    drop(store);
                    match outcome {
                        // Fenced, or replication stopped: no survivor can become durable
                        // again, so no combined pass can finish; this thread is done.
                        CleanOutcome::SurvivorsNotDurable(error) if error.is_final() => {
                            tracing::warn!(%error, "the cleaner stops");
                            return;
                        }
                        CleanOutcome::Idle
                        | CleanOutcome::NothingToClean
                        | CleanOutcome::SurvivorsNotDurable(_) => {
                            std::thread::sleep(CLEANER_IDLE_SLEEP)
                        }
                        CleanOutcome::Combined { .. } | CleanOutcome::Compacted { .. } => {}
                    }
                }
            })?;
        }
        Ok(())
    }

    /// The replica manager, if replication is on.
    pub fn replication(&self) -> Option<&ReplicaManager> {
        self.replication.as_ref()
    }

    /// The tablets this master owns.
    pub fn ownership(&self) -> &TabletOwnership {
        &self.ownership
    }

    fn now_seconds(&self) -> u32 {
        self.wall_clock.now_seconds()
    }

    /// Checks what every object request must satisfy before the store sees it: a valid lease,
    /// a valid key and an owned tablet. Without a lease the answer is RETRY: the coordinator
    /// may be slow (the lease comes back), or this master was declared crashed (it exits, and
    /// the client's retry then finds the tablet's new owner).
    fn admit(&self, table: TableId, key: &[u8]) -> Result<stratus_types::KeyHash, Status> {
        let hash = self.admit_key(table, key)?;
        if !self.ownership.owns(table, hash) {
            return Err(Status::UnknownTablet);
        }
        Ok(hash)
    }

    /// The lease and key checks of [`Master::admit`], without the ownership check.
    fn admit_key(&self, table: TableId, key: &[u8]) -> Result<stratus_types::KeyHash, Status> {
        if !self.may_serve() {
            return Err(Status::Retry);
        }
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(Status::InvalidKey);
        }
        Ok(key_hash(table, key))
    }

    /// Admits a request that changes `key` of `table` and applies it with `apply` while the
    /// tablet can be neither frozen nor dropped (see `TabletOwnership::while_writable`). A
    /// tablet at the end of its transfer answers RETRY: the client tries again and finds the
    /// tablet writable or at its new master.
    fn mutate<T>(
        &self,
        table: TableId,
        key: &[u8],
        apply: impl FnOnce(stratus_types::KeyHash) -> Result<T, ObjectError>,
    ) -> Result<T, (Status, Version)> {
        let hash = self.admit_key(table, key).map_err(|status| (status, Version(0)))?;
        match self.ownership.while_writable(table, hash, key, || apply(hash)) {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(error)) => Err(status_of(error)),
            Err(WriteRefusal::NotOwned) => Err((Status::UnknownTablet, Version(0))),
            Err(WriteRefusal::Frozen) => Err((Status::Retry, Version(0))),
        }
    }

    fn handle_request(&self, request_id: u64, request: Request, out: &mut BytesMut) {
        match request {
            Request::Ping => encode_response(out, request_id, Status::Ok, &Response::Ping),
            Request::Read { table_id, key, rules } => {
                self.read(request_id, table_id, &key, &rules, out);
            }
            Request::Write { table_id, key, value, rules } => {
                let (status, version) = self.write_one(table_id, &key, &value, &rules);
                respond_version(out, request_id, Opcode::Write, status, version);
            }
            Request::Remove { table_id, key, rules } => {
                let (status, version) = self.remove_one(table_id, &key, &rules);
                respond_version(out, request_id, Opcode::Remove, status, version);
            }
            Request::Increment { table_id, key, delta, rules } => {
                let result = self.increment_one(table_id, &key, delta, &rules);
                if result.status.carries_operation_body() {
                    let response =
                        Response::Increment { version: result.version, value: result.value };
                    encode_response(out, request_id, result.status, &response);
                } else {
                    encode_error_response(
                        out,
                        request_id,
                        Opcode::Increment.code(),
                        result.status,
                        "",
                    );
                }
            }
            Request::MultiRead { items } => {
                self.metrics.add_items(Operation::MultiRead, items.len());
                let results = items.iter().map(|item| self.read_one(item).0).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiRead { results });
            }
            Request::MultiWrite { items } => {
                self.metrics.add_items(Operation::MultiWrite, items.len());
                let results = items.iter().map(|item| self.write_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiWrite { results });
            }
            Request::MultiRemove { items } => {
                self.metrics.add_items(Operation::MultiRemove, items.len());
                let results = items.iter().map(|item| self.remove_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiRemove { results });
            }
            Request::MultiIncrement { items } => {
                self.metrics.add_items(Operation::MultiIncrement, items.len());
                let results = items.iter().map(|item| self.increment_item(item)).collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiIncrement { results });
            }
            Request::Enumerate { table_id, range, cursor, bytes_max } => {
                self.enumerate(request_id, table_id, range, cursor, bytes_max, out)
            }
            Request::TakeTabletOwnership { master_id, .. }
            | Request::DropTabletOwnership { master_id, .. }
            | Request::ReplicasNeeded { master_id, .. }
            | Request::AbandonMigration { master_id, .. }
                if master_id != self.server_id =>
            {
                // Meant for an earlier process at this address (it crashed, this one enlisted
                // with a new id): applying it would make this master serve a tablet the
                // coordinator gave to the other, or tell a backup to free the replicas the
                // other's recovery needs.
                let message = format!("this is server {}, not {master_id}", self.server_id);
                encode_error_response(
                    out,
                    request_id,
                    request.opcode().code(),
                    Status::WrongServer,
                    &message,
                );
            }
            Request::TakeTabletOwnership { table_id, range, assignment_epoch, .. } => {
                match self.ownership.take(table_id, range, assignment_epoch) {
                    Ok(()) => {
                        tracing::info!(table = %table_id, start = range.start, end = range.end, assignment_epoch, "taking tablet")
                    }
                    // Answered OK: the coordinator has decided otherwise since, and the
                    // assignment it sends now is the one that counts.
                    Err(refusal) => {
                        tracing::info!(table = %table_id, start = range.start, assignment_epoch, ?refusal, "ignoring an obsolete TAKE")
                    }
                }
                encode_response(out, request_id, Status::Ok, &Response::TakeTabletOwnership);
            }
            Request::DropTabletOwnership { table_id, range, assignment_epoch, .. } => {
                let dropped =
                    self.ownership.drop_within_then(table_id, &range, assignment_epoch, || {
                        self.store.drop_range(table_id, range)
                    });
                match dropped {
                    Ok(dropped) => tracing::info!(table = %table_id, dropped, "dropped tablet"),
                    Err(refusal) => {
                        tracing::info!(table = %table_id, start = range.start, assignment_epoch, ?refusal, "ignoring an obsolete DROP")
                    }
                }
                encode_response(out, request_id, Status::Ok, &Response::DropTabletOwnership);
            }
            Request::AbandonMigration { table_id, range, assignment_epoch, .. } => {
                let objects_dropped = self.abandon_migration(table_id, range, assignment_epoch);
                let response = Response::AbandonMigration { objects_dropped };
                encode_response(out, request_id, Status::Ok, &response);
            }
            Request::ReplicasNeeded { segment_ids, .. } => {
                // A master without replication has no replicas anywhere: none is needed.
                let not_needed = match &self.replication {
                    Some(replication) => replication.not_needed(&segment_ids),
                    None => segment_ids,
                };
                let response = Response::ReplicasNeeded { not_needed };
                encode_response(out, request_id, Status::Ok, &response);
            }
            Request::GetServerStatistics => {
                let statistics = self.statistics();
                encode_response(
                    out,
                    request_id,
                    Status::Ok,
                    &Response::GetServerStatistics { statistics },
                );
            }
            other => {
                let message =
                    format!("{:?} is served by the coordinator, not a master", other.opcode());
                encode_error_response(
                    out,
                    request_id,
                    other.opcode().code(),
                    Status::UnimplementedRequest,
                    &message,
                );
            }
        }
    }

    /// READ: the value goes from the log straight into the frame.
    fn read(
        &self,
        request_id: u64,
        table: TableId,
        key: &[u8],
        rules: &RejectRules,
        out: &mut BytesMut,
    ) -> Observed {
        let hash = match self.admit(table, key) {
            Ok(hash) => hash,
            Err(status) => {
                encode_error_response(out, request_id, Opcode::Read.code(), status, "");
                return Observed::Nothing;
            }
        };
        let frame_position = out.len();
        let start = begin_response(out, request_id, Opcode::Read, Status::Ok);
        let version_position = out.len();
        put::put_u64(out, 0);
        let value_position = put::begin_length_prefixed_u32(out);
        let outcome = self.store.read_located(table, key, hash, rules, &mut FrameSink(out));
        let observed = match &outcome {
            Ok((_, segment)) => Observed::Object(*segment),
            Err(_) => Observed::Absence,
        };
        match outcome.map(|(version, _)| version) {
            Ok(version) => {
                put::finish_length_prefixed_u32(out, value_position);
                put::patch_u64(out, version_position, version.0);
                if finish_frame(out, start).is_err() {
                    // Cannot happen with the configured limits; answer rather than crash.
                    out.truncate(frame_position);
                    encode_error_response(
                        out,
                        request_id,
                        Opcode::Read.code(),
                        Status::InternalError,
                        "response too large",
                    );
                }
            }
            Err(error) => {
                out.truncate(frame_position);
                let (status, version) = status_of(error);
                if status.carries_operation_body() {
                    let response = Response::Read { version, value: Bytes::new() };
                    encode_response(out, request_id, status, &response);
                } else {
                    encode_error_response(out, request_id, Opcode::Read.code(), status, "");
                }
            }
        }
        observed
    }

    fn read_one(&self, item: &KeyItem) -> (ReadItemResult, Observed) {
        let hash = match self.admit(item.table_id, &item.key) {
            Ok(hash) => hash,
            Err(status) => {
                let result = ReadItemResult { status, version: Version(0), value: Bytes::new() };
                return (result, Observed::Nothing);
            }
        };
        let mut value = Vec::new();
        match self.store.read_located(item.table_id, &item.key, hash, &item.rules, &mut value) {
            Ok((version, segment)) => {
                let result =
                    ReadItemResult { status: Status::Ok, version, value: Bytes::from(value) };
                (result, Observed::Object(segment))
            }
            Err(error) => {
                let (status, version) = status_of(error);
                (ReadItemResult { status, version, value: Bytes::new() }, Observed::Absence)
            }
        }
    }

    fn write_one(
        &self,
        table: TableId,
        key: &[u8],
        value: &[u8],
        rules: &RejectRules,
    ) -> (Status, Version) {
        let now_seconds = self.now_seconds();
        match self.mutate(table, key, |hash| {
            self.store.write(table, key, hash, value, rules, now_seconds)
        }) {
            Ok(version) => (Status::Ok, version),
            Err(refusal) => refusal,
        }
    }

    fn write_item(&self, item: &WriteItem) -> VersionItemResult {
        let (status, version) = self.write_one(item.table_id, &item.key, &item.value, &item.rules);
        VersionItemResult { status, version }
    }

    fn remove_one(&self, table: TableId, key: &[u8], rules: &RejectRules) -> (Status, Version) {
        let now_seconds = self.now_seconds();
        match self
            .mutate(table, key, |hash| self.store.remove(table, key, hash, rules, now_seconds))
        {
            Ok(version) => (Status::Ok, version),
            Err(refusal) => refusal,
        }
    }

    fn remove_item(&self, item: &KeyItem) -> VersionItemResult {
        let (status, version) = self.remove_one(item.table_id, &item.key, &item.rules);
        VersionItemResult { status, version }
    }

    fn increment_one(
        &self,
        table: TableId,
        key: &[u8],
        delta: i64,
        rules: &RejectRules,
    ) -> IncrementItemResult {
        let now_seconds = self.now_seconds();
        match self.mutate(table, key, |hash| {
            self.store.increment(table, key, hash, delta, rules, now_seconds)
        }) {
            Ok((version, value)) => IncrementItemResult { status: Status::Ok, version, value },
            Err((status, version)) => IncrementItemResult { status, version, value: 0 },
        }
    }

    fn increment_item(&self, item: &IncrementItem) -> IncrementItemResult {
        self.increment_one(item.table_id, &item.key, item.delta, &item.rules)
    }

    fn enumerate(
        &self,
        request_id: u64,
        table: TableId,
        range: HashRange,
        cursor: EnumerationCursor,
        bytes_max: u32,
        out: &mut BytesMut,
    ) {
        if !self.may_serve() {
            let message = "no lease from the coordinator";
            return encode_error_response(
                out,
                request_id,
                Opcode::Enumerate.code(),
                Status::Retry,
                message,
            );
        }
        if !self.ownership.covers(table, &range) {
            let message = "the range is not within one tablet this server owns";
            return encode_error_response(
                out,
                request_id,
                Opcode::Enumerate.code(),
                Status::UnknownTablet,
                message,
            );
        }
        let bytes_max =
            usize::try_from(bytes_max).unwrap_or(usize::MAX).clamp(1, ENUMERATE_RESPONSE_BYTES_MAX);
        let mut objects = Vec::new();
        let next = self.store.enumerate(
            table,
            range,
            cursor.reversed_hash,
            cursor.after_key.as_deref(),
            bytes_max,
            &mut |key, value, version| {
                objects.push(EnumeratedObject {
                    key: Bytes::copy_from_slice(key),
                    value: Bytes::copy_from_slice(value),
                    version,
                })
            },
        );
        let next = next.map(|(reversed_hash, after_key)| EnumerationCursor {
            reversed_hash,
            after_key: after_key.map(Bytes::from),
        });
        encode_response(out, request_id, Status::Ok, &Response::Enumerate { objects, next });
    }

    fn statistics(&self) -> ServerStatistics {
        let store = self.store.statistics();
        let replication = self.replication.as_ref().map(ReplicaManager::statistics);
        let cleaner = store.cleaner;
        ServerStatistics {
            server_id: self.server_id,
            log_bytes_total: store.log_bytes_total,
            log_bytes_live: store.log_bytes_live,
            log_bytes_allocated: store.log_bytes_allocated,
            seglets_total: store.seglets_total,
            seglets_free: store.seglets_free,
            segments_in_log: store.segments_in_log,
            objects_live: store.objects_live,
            tablets_owned: u32::try_from(self.ownership.count()).unwrap_or(u32::MAX),
            requests_served: self.metrics.requests_answered(),
            replicas: self
                .replication
                .as_ref()
                .map_or(0, |replication| u32::try_from(replication.replicas()).unwrap_or(u32::MAX)),
            log_bytes_live_objects: store.log_bytes_live_objects,
            bytes_replicated: replication.map_or(0, |statistics| statistics.bytes_replicated),
            cleaner_bytes_replicated: replication
                .map_or(0, |statistics| statistics.cleaner_bytes_replicated),
            segments_cleaned: cleaner.segments_cleaned,
            cleaner_bytes_relocated: cleaner.object_bytes_relocated
                + cleaner.tombstone_bytes_relocated,
            compactions: cleaner.compactions,
            bytes_compacted: cleaner.bytes_compacted,
        }
    }
}

impl Service for Master {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        // Counted and timed when answered: here, or when a deferred answer is ready.
        let started = tokio::time::Instant::now();
        let operation = Operation::of_opcode(header.opcode_code);
        match decode_request(header.opcode_code, body) {
            Ok(Request::RecoverTablets {
                master_id,
                crashed_master,
                tablets,
                segments,
                backups,
                assignment_epoch,
            }) => {
                let request = RecoverRequest {
                    master_id,
                    crashed_master,
                    tablets,
                    segments,
                    backups,
                    assignment_epoch,
                };
                return self.recover(header.request_id, request, started, out);
            }
            Ok(Request::TransferTablet {
                master_id,
                table_id,
                range,
                assignment_epoch,
                target: _,
                target_address,
            }) => {
                let request = TransferRequest {
                    master_id,
                    table_id,
                    range,
                    assignment_epoch,
                    target_address,
                };
                return self.transfer(header.request_id, request, started, out);
            }
            Ok(Request::ReceiveMigrationData {
                table_id,
                range,
                assignment_epoch,
                source,
                transfer_id,
                safe_version,
                first,
                objects,
                removed_keys,
            }) => {
                let transfer = IncomingTransfer {
                    table: table_id,
                    range,
                    assignment_epoch,
                    source,
                    transfer_id,
                };
                let batch = MigrationBatch { transfer, safe_version, first, objects, removed_keys };
                return self.receive_migration_data(header.request_id, batch, started, out);
            }
            Ok(request) => match &self.sync_context {
                Some(context) if changes_log(&request) => {
                    let timing = (operation, started);
                    return self.handle_then_sync(header.request_id, request, context, timing);
                }
                Some(context) if reads_objects(&request) => {
                    let timing = (operation, started);
                    if let Some(later) =
                        self.read_once_durable(header.request_id, request, context, timing, out)
                    {
                        return later;
                    }
                }
                _ => self.handle_request(header.request_id, request, out),
            },
            Err(error) => encode_error_response(
                out,
                header.request_id,
                header.opcode_code,
                error.status(),
                &error.to_string(),
            ),
        }
        self.metrics.record(operation, started);
        Handled::Done
    }
}

/// A TRANSFER_TABLET request (wire-protocol.md).
struct TransferRequest {
    /// The master it is meant for (the tablet's owner).
    master_id: ServerId,
    table_id: TableId,
    /// The tablet to copy.
    range: HashRange,
    /// The migration's assignment epoch.
    assignment_epoch: u64,
    /// Where the target master listens.
    target_address: String,
}

/// A RECEIVE_MIGRATION_DATA batch (wire-protocol.md).
struct MigrationBatch {
    transfer: IncomingTransfer,
    /// The source's safe version.
    safe_version: Version,
    /// The first batch of the transfer: start the tablet afresh.
    first: bool,
    objects: Vec<EnumeratedObject>,
    /// Keys the source removed while it copied the tablet.
    removed_keys: Vec<Bytes>,
}

impl Master {
    /// TRANSFER_TABLET: copies the tablet to the target in the background (writes go on until
    /// the catch-up at the end, `Transfer::send`), makes this log durable, and stops serving
    /// the tablet; on failure serves it as before.
    fn transfer(
        &self,
        request_id: u64,
        request: TransferRequest,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let TransferRequest { master_id, table_id: table, range, assignment_epoch, target_address } =
            request;
        let opcode = Opcode::TransferTablet.code();
        let refuse = |out: &mut BytesMut, status: Status, message: &str| {
            encode_error_response(out, request_id, opcode, status, message);
            self.metrics.record(Operation::Control, started);
            Handled::Done
        };
        let Some(reader) = &self.recovery else {
            return refuse(out, Status::UnimplementedRequest, "this master cannot reach others");
        };
        if master_id != self.server_id {
            let message = format!("this is server {}, not {master_id}", self.server_id);
            return refuse(out, Status::WrongServer, &message);
        }
        if !self.may_serve() {
            return refuse(out, Status::Retry, "no lease from the coordinator");
        }
        let start = self.completed_transfers.outcome_or_freeze(
            &self.ownership,
            table,
            range,
            assignment_epoch,
        );
        let transfer_id = match start {
            Ok(TransferStart::Started(transfer_id)) => transfer_id,
            // Asked again after it ended (the coordinator lost the first answer).
            Ok(TransferStart::Completed(Ok((creation_segment, objects_sent)))) => {
                let response = Response::TransferTablet { creation_segment, objects_sent };
                encode_response(out, request_id, Status::Ok, &response);
                self.metrics.record(Operation::Control, started);
                return Handled::Done;
            }
            Ok(TransferStart::Completed(Err((status, message)))) => {
                return refuse(out, status, &message)
            }
            Err(AssignmentRefusal::TransferRunning) => {
                return refuse(out, Status::InProgress, "this transfer is running")
            }
            Err(AssignmentRefusal::AlreadyFrozen) => {
                return refuse(out, Status::Retry, "a transfer of this tablet is running")
            }
            Err(AssignmentRefusal::Stale) => {
                return refuse(out, Status::Retry, "the transfer is older than an assignment seen")
            }
            Err(_) => {
                return refuse(
                    out,
                    Status::UnknownTablet,
                    "the range is not a tablet this master owns",
                )
            }
        };
        tracing::info!(%table, start = range.start, end = range.end, %target_address, "transferring a tablet");
        let transfer = Transfer {
            store: self.store.clone(),
            ownership: self.ownership.clone(),
            pool: reader.pool(),
            source: self.server_id,
            transfer_id,
            table,
            range,
            assignment_epoch,
            target_address,
        };
        let replication = self.replication.clone();
        let metrics = self.metrics.clone();
        let completed_transfers = self.completed_transfers.clone();
        Handled::Later(Box::pin(async move {
            let mut outcome = transfer.send().await;
            if outcome.is_ok() {
                // What was copied is durable here too before this master lets go of it.
                if let Some(replication) = &replication {
                    if let Err(error) = replication.sync(replication.position_to_sync()).await {
                        outcome = Err((Status::Retry, format!("replicating: {}", error.message)));
                    }
                }
            }
            let ended = CompletedTransfer { table, range, assignment_epoch, outcome };
            let outcome: Result<(SegmentId, u64), MigrationFailure> =
                completed_transfers.end(&transfer.ownership, transfer_id, ended);
            metrics.record(Operation::Control, started);
            let mut out = BytesMut::new();
            match outcome {
                Ok((creation_segment, objects_sent)) => {
                    tracing::info!(%table, start = range.start, objects_sent, "tablet transferred");
                    let response = Response::TransferTablet { creation_segment, objects_sent };
                    encode_response(&mut out, request_id, Status::Ok, &response);
                }
                Err((status, message)) => {
                    tracing::warn!(%table, start = range.start, %status, %message, "transfer failed; serving the tablet again");
                    encode_error_response(&mut out, request_id, opcode, status, &message);
                }
            }
            out
        }))
    }

    /// RECEIVE_MIGRATION_DATA: writes the batch into the store (starting the tablet afresh for
    /// the first batch) and answers once it is durable.
    fn receive_migration_data(
        &self,
        request_id: u64,
        batch: MigrationBatch,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let opcode = Opcode::ReceiveMigrationData;
        match self.apply_migration_batch(&batch) {
            Err((status, message)) => {
                encode_error_response(out, request_id, opcode.code(), status, &message);
            }
            Ok(creation_segment) => {
                let response = Response::ReceiveMigrationData { creation_segment };
                if let Some(context) = &self.sync_context {
                    let mut frame = BytesMut::new();
                    encode_response(&mut frame, request_id, Status::Ok, &response);
                    let position = context.replication.position_to_sync();
                    let timing = (Operation::Control, started);
                    return answer_once_durable(
                        request_id, opcode, frame, position, context, timing,
                    );
                }
                encode_response(out, request_id, Status::Ok, &response);
            }
        }
        self.metrics.record(Operation::Control, started);
        Handled::Done
    }

    /// ABANDON_MIGRATION: drops what the transfer of `table`'s `range` at `assignment_epoch`
    /// copied here, and refuses its later batches; returns the objects dropped.
    ///
    /// Only the copy of that transfer, and only while nothing overtook it: the transfer must
    /// be the one receiving here (not replaced by a later one, and not superseded by a
    /// recovery of an overlapping range, which marks it when it begins), and no assignment of
    /// the range may be newer or served here. A recovery that replayed into the range and
    /// waits for its TAKE has marked the transfer, so its objects are never the ones dropped.
    fn abandon_migration(&self, table: TableId, range: HashRange, assignment_epoch: u64) -> u64 {
        // Held throughout, as a batch holds it: a recovery of the range cannot begin between
        // the checks and the drop.
        let in_flight =
            self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
        let recovering = in_flight
            .iter()
            .any(|other| other.table_id == table && other.range.intersection(&range).is_some());
        let dropped = self.ownership.while_receiving(table, range, assignment_epoch, || {
            // Marked abandoned whatever happens next, so that no batch of it lands after this.
            let receiving = self.incoming.abandon(table, range, assignment_epoch);
            if receiving && !recovering {
                self.store.drop_range(table, range)
            } else {
                0
            }
        });
        drop(in_flight);
        match dropped {
            Ok(objects) => {
                tracing::info!(table = %table, start = range.start, assignment_epoch, objects, "dropped the copy of an abandoned transfer");
                objects
            }
            Err(refusal) => {
                // The range was assigned since (a recovery's TAKE, or a later transfer): what
                // this master holds of it is not the abandoned copy's to drop.
                self.incoming.abandon(table, range, assignment_epoch);
                tracing::info!(table = %table, start = range.start, assignment_epoch, ?refusal, "an abandoned transfer was overtaken; nothing dropped");
                0
            }
        }
    }

    fn apply_migration_batch(&self, batch: &MigrationBatch) -> Result<SegmentId, MigrationFailure> {
        let MigrationBatch { transfer, safe_version, first, objects, removed_keys } = batch;
        let (safe_version, first) = (*safe_version, *first);
        if !self.may_serve() {
            return Err((Status::Retry, "no lease from the coordinator".to_string()));
        }
        let IncomingTransfer { table, range, assignment_epoch, .. } = *transfer;
        let keys = objects.iter().map(|object| &object.key).chain(removed_keys);
        for key in keys {
            if key.is_empty() || key.len() > KEY_BYTES_MAX {
                return Err((Status::InvalidParameter, "a migrated key is invalid".to_string()));
            }
            if !range.contains(key_hash(table, key)) {
                return Err((
                    Status::InvalidParameter,
                    "a migrated key lies outside the tablet".to_string(),
                ));
            }
        }
        // Held while the batch is written: a recovery of an overlapping range registers under
        // it, and must not interleave with this batch (its replay starts by dropping the
        // range, and a migrated object must not land after that drop).
        let in_flight =
            self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
        if in_flight
            .iter()
            .any(|other| other.table_id == table && other.range.intersection(&range).is_some())
        {
            return Err((
                Status::Retry,
                "a recovery of an overlapping range is running here".to_string(),
            ));
        }
        let written = self.ownership.while_receiving(table, range, assignment_epoch, || {
            let log = self.store.log();
            let creation_segment = if first {
                if !self.incoming.begin(*transfer) {
                    return Err((
                        Status::InvalidParameter,
                        "the transfer was abandoned".to_string(),
                    ));
                }
                // Whatever this master still holds of the range is from an earlier time it had
                // it (or an abandoned transfer): invisible (not owned), and it must stay so.
                self.store.drop_range(table, range);
                log.raise_safe_version(safe_version);
                // The new head starts the tablet in this log (and records the raised safe
                // version): recovery ignores the range's entries in older segments.
                log.roll_head(stratus_log::AppendPriority::Normal)
                    .map_err(|_| (Status::Retry, "the log is full".to_string()))?
            } else {
                if !self.incoming.is_current(transfer) {
                    return Err((
                        Status::InvalidParameter,
                        "the transfer was superseded by a later one".to_string(),
                    ));
                }
                log.head_segment_id().unwrap_or(SegmentId(0))
            };
            let now_seconds = self.now_seconds();
            let refused = |error| match error {
                ObjectError::LogFull => (Status::Retry, "the log is full".to_string()),
                other => (Status::InvalidParameter, format!("a migrated object: {other:?}")),
            };
            for object in objects {
                self.store
                    .insert_migrated(table, &object.key, &object.value, object.version, now_seconds)
                    .map_err(refused)?;
            }
            for key in removed_keys {
                self.store
                    .remove_migrated(table, key, safe_version, now_seconds)
                    .map_err(refused)?;
            }
            if !removed_keys.is_empty() {
                // The removals raised the safe version past the removed versions; a new head
                // records it, so a recovery of this master once it serves the tablet does not
                // hand those versions out again (the answer waits until the head is durable).
                log.roll_head(stratus_log::AppendPriority::Normal)
                    .map_err(|_| (Status::Retry, "the log is full".to_string()))?;
            }
            Ok(creation_segment)
        });
        let creation_segment = match written {
            Ok(written) => written?,
            Err(AssignmentRefusal::ServesPart) => {
                return Err((
                    Status::InvalidParameter,
                    "this master already serves part of the range".to_string(),
                ))
            }
            Err(refusal) => {
                return Err((Status::Retry, format!("the transfer is obsolete: {refusal:?}")))
            }
        };
        drop(in_flight);
        Ok(creation_segment)
    }
}

/// A RECOVER_TABLETS request (wire-protocol.md).
struct RecoverRequest {
    /// The recovery master it is meant for.
    master_id: ServerId,
    crashed_master: ServerId,
    /// The partition: the tablets (parts of the crashed master's) to replay.
    tablets: Vec<RecoveryTablet>,
    /// The crashed log's segments, as its newest digest lists them.
    segments: Vec<SegmentId>,
    /// The backups to fetch the partition's entries from.
    backups: Vec<String>,
    /// The recovery's assignment epoch.
    assignment_epoch: u64,
}

impl Master {
    /// RECOVER_TABLETS: replays the partition in the background and answers when it is
    /// durable here.
    fn recover(
        &self,
        request_id: u64,
        request: RecoverRequest,
        started: tokio::time::Instant,
        out: &mut BytesMut,
    ) -> Handled {
        let RecoverRequest {
            master_id,
            crashed_master,
            tablets,
            segments,
            backups,
            assignment_epoch,
        } = request;
        let refuse = |out: &mut BytesMut, status: Status, message: &str| {
            let opcode = Opcode::RecoverTablets.code();
            encode_error_response(out, request_id, opcode, status, message);
            self.metrics.record(Operation::RecoverTablets, started);
            Handled::Done
        };
        let Some(reader) = self.recovery.clone() else {
            let message = "this master does not take part in recovery";
            return refuse(out, Status::UnimplementedRequest, message);
        };
        if master_id != self.server_id {
            // Meant for an earlier process at this address: replaying here would leave the
            // partition with a master the coordinator does not know to hold it.
            let message = format!("this is server {}, not {master_id}", self.server_id);
            return refuse(out, Status::WrongServer, &message);
        }
        if tablets.is_empty() {
            return refuse(out, Status::InvalidParameter, "no tablet to recover");
        }
        let refusal = {
            let mut in_flight =
                self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner());
            let overlapping = |tablet: &RecoveryTablet| {
                in_flight.iter().any(|other| {
                    other.table_id == tablet.table_id
                        && other.range.intersection(&tablet.range).is_some()
                })
            };
            if tablets.iter().any(overlapping) {
                Some((Status::Retry, "a recovery of an overlapping range is running here"))
            } else if tablets
                .iter()
                .any(|tablet| self.ownership.overlaps(tablet.table_id, &tablet.range))
            {
                Some((Status::InvalidParameter, "this master already serves part of the range"))
            } else if !self.ownership.note_recovery(
                tablets.iter().map(|tablet| (tablet.table_id, tablet.range)),
                assignment_epoch,
            ) {
                // A request of an earlier attempt that arrives late (the range may have been
                // recovered elsewhere and migrated here since): replaying it would drop what
                // this master received. A current attempt is never older than what it saw.
                Some((
                    Status::Retry,
                    "an assignment of the range newer than this recovery was seen here",
                ))
            } else {
                for tablet in &tablets {
                    // A transfer of the range into this master is over: its batches, and an
                    // ABANDON_MIGRATION of it, must not touch what this recovery replays. One
                    // whose first batch has not arrived yet is not remembered here: the
                    // recovery's epoch, above the transfer's, makes its batches stale.
                    self.incoming.supersede_overlapping(tablet.table_id, &tablet.range);
                }
                in_flight.extend(tablets.iter().copied());
                None
            }
        };
        if let Some((status, message)) = refusal {
            return refuse(out, status, message);
        }
        let metrics = self.metrics.clone();
        RecoveryCounters::add(&metrics.recovery.partitions_started, 1);
        let context = RecoveryContext {
            store: self.store.clone(),
            replication: self.replication.clone(),
            reader,
            wall_clock: self.wall_clock.clone(),
            metrics: metrics.clone(),
        };
        let in_flight =
            InFlight { registry: self.recoveries_in_flight.clone(), tablets: tablets.clone() };
        Handled::Later(Box::pin(async move {
            let outcome =
                recover_partition(context, crashed_master, tablets, segments, backups).await;
            drop(in_flight);
            let counters = &metrics.recovery;
            let finished = if outcome.is_ok() {
                &counters.partitions_succeeded
            } else {
                &counters.partitions_failed
            };
            RecoveryCounters::add(finished, 1);
            metrics.record(Operation::RecoverTablets, started);
            let mut out = BytesMut::new();
            match outcome {
                Ok(response) => encode_response(&mut out, request_id, Status::Ok, &response),
                Err((status, message)) => {
                    tracing::warn!(%crashed_master, %status, %message, "recovery of a partition failed");
                    encode_error_response(
                        &mut out,
                        request_id,
                        Opcode::RecoverTablets.code(),
                        status,
                        &message,
                    )
                }
            }
            out
        }))
    }

    /// Handles a request that may have appended to the log, and answers only after the log up
    /// to the append is on every replica. The response is built now (the store's work is
    /// done) and released by the future.
    fn handle_then_sync(
        &self,
        request_id: u64,
        request: Request,
        context: &Arc<SyncContext>,
        (operation, started): (Operation, tokio::time::Instant),
    ) -> Handled {
        let opcode = request.opcode();
        let mut frame = BytesMut::new();
        self.handle_request(request_id, request, &mut frame);
        // Taken after the append: the head's end is at or past it.
        let position = context.replication.position_to_sync();
        answer_once_durable(request_id, opcode, frame, position, context, (operation, started))
    }

    /// READ and MULTI_READ on a replicated master: the answer waits until the log is durable
    /// up to what the read saw. An object still in the unreplicated tail (or the absence of
    /// one, which may be a remove in that tail) would vanish if this master crashed now, after
    /// a client had seen it: a later read would go back in time. Reads of older objects, and
    /// every read while nothing waits for replication, are answered at once (`None`: the
    /// answer is in `out`). The read runs first and the durable position is looked at after
    /// it, so a write landing in between cannot slip through unseen.
    fn read_once_durable(
        &self,
        request_id: u64,
        request: Request,
        context: &Arc<SyncContext>,
        timing: (Operation, tokio::time::Instant),
        out: &mut BytesMut,
    ) -> Option<Handled> {
        let opcode = request.opcode();
        let frame_start = out.len();
        let mut seen = Seen::default();
        match request {
            Request::Read { table_id, key, rules } => {
                seen.add(self.read(request_id, table_id, &key, &rules, out));
            }
            Request::MultiRead { items } => {
                self.metrics.add_items(Operation::MultiRead, items.len());
                let results = items
                    .iter()
                    .map(|item| {
                        let (result, observed) = self.read_one(item);
                        seen.add(observed);
                        result
                    })
                    .collect();
                encode_response(out, request_id, Status::Ok, &Response::MultiRead { results });
            }
            other => {
                self.handle_request(request_id, other, out);
                return None;
            }
        }
        // Both taken after the reads: `position` is at or past everything they saw. The
        // durable position first: reads of older objects are answered without looking at the
        // log's head (which takes the log's lock that appends take).
        let durable = context.replication.durable_position();
        if seen.is_durable_before(durable) {
            return None;
        }
        let position = context.replication.position_to_sync();
        if durable >= position {
            return None;
        }
        let frame = out.split_off(frame_start);
        Some(answer_once_durable(request_id, opcode, frame, position, context, timing))
    }
}

/// What a read saw, for deciding whether its answer must wait for replication.
#[derive(Clone, Copy, Debug)]
enum Observed {
    /// Nothing of the log (the request was refused before the store was asked).
    Nothing,
    /// That no object exists (or a version the rules refused): may be a recent remove.
    Absence,
    /// An object in this segment.
    Object(SegmentId),
}

/// Everything one request's reads saw.
#[derive(Clone, Copy, Debug, Default)]
struct Seen {
    newest_segment: Option<SegmentId>,
    absence: bool,
}

impl Seen {
    fn add(&mut self, observed: Observed) {
        match observed {
            Observed::Nothing => {}
            Observed::Absence => self.absence = true,
            Observed::Object(segment) => {
                self.newest_segment = self.newest_segment.max(Some(segment));
            }
        }
    }

    /// True if nothing seen can be lost by a crash now: every segment before the durable
    /// position's segment is durable whole (a head is closed on its backups before the
    /// position moves past it). An absence is judged by the caller (durable only if nothing
    /// waits for replication).
    fn is_durable_before(self, durable: LogPosition) -> bool {
        !self.absence && self.newest_segment.is_none_or(|segment| segment.0 < durable.segment_id)
    }
}

/// Answers `frame` once the log is durable up to `position` (RETRY if it cannot be made so in
/// time, or if this master lost its lease meanwhile).
fn answer_once_durable(
    request_id: u64,
    opcode: Opcode,
    frame: BytesMut,
    position: LogPosition,
    context: &Arc<SyncContext>,
    (operation, started): (Operation, tokio::time::Instant),
) -> Handled {
    {
        let context = context.clone();
        Handled::Later(Box::pin(async move {
            let mut outcome = context.replication.sync(position).await;
            // Acknowledge only while still a member: a master declared crashed while this
            // write waited for its backups must not report success (its tablets may already
            // be recovered elsewhere, from replicas read before this write reached them).
            if outcome.is_ok() && context.lease.as_ref().is_some_and(|lease| !lease.valid()) {
                outcome = Err(SyncError { message: "lease lost while replicating".to_string() });
            }
            context.metrics.record(operation, started);
            match outcome {
                Ok(()) => frame,
                Err(error) => {
                    // The change is in memory but not known durable. RETRY tells the client
                    // to try again; until exactly-once RPCs exist a resent mutation applies
                    // again (a second version, an increment's delta twice, a conditional
                    // write refused by its own first attempt: README, "Status"), which is why
                    // a client may be configured to return RETRY on a mutation instead.
                    let mut refusal = BytesMut::new();
                    encode_error_response(
                        &mut refusal,
                        request_id,
                        opcode.code(),
                        Status::Retry,
                        &error.message,
                    );
                    refusal
                }
            }
        }))
    }
}

/// Removes a recovery's ranges from the in-flight registry when it ends, however it ends.
struct InFlight {
    registry: Arc<std::sync::Mutex<Vec<RecoveryTablet>>>,
    tablets: Vec<RecoveryTablet>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut registry = self.registry.lock().unwrap_or_else(|poison| poison.into_inner());
        for tablet in &self.tablets {
            if let Some(position) = registry.iter().position(|other| other == tablet) {
                registry.swap_remove(position);
            }
        }
    }
}

/// Requests that may append to the log and so must be replicated before they are answered.
/// True for a request whose answer shows objects (or their absence).
fn reads_objects(request: &Request) -> bool {
    matches!(request, Request::Read { .. } | Request::MultiRead { .. })
}

fn changes_log(request: &Request) -> bool {
    matches!(
        request,
        Request::Write { .. }
            | Request::Remove { .. }
            | Request::Increment { .. }
            | Request::MultiWrite { .. }
            | Request::MultiRemove { .. }
            | Request::MultiIncrement { .. }
    )
}

fn respond_version(
    out: &mut BytesMut,
    request_id: u64,
    opcode: Opcode,
    status: Status,
    version: Version,
) {
    if !status.carries_operation_body() {
        return encode_error_response(out, request_id, opcode.code(), status, "");
    }
    let response = match opcode {
        Opcode::Write => Response::Write { version },
        Opcode::Remove => Response::Remove { version },
        _ => unreachable!("respond_version is only used for WRITE and REMOVE"),
    };
    encode_response(out, request_id, status, &response);
}

/// The status and version a store error is reported with.
fn status_of(error: ObjectError) -> (Status, Version) {
    match error {
        ObjectError::Rejected { reason, current } => {
            let status = match reason {
                RejectReason::ObjectDoesntExist => Status::ObjectDoesntExist,
                RejectReason::ObjectExists => Status::ObjectExists,
                RejectReason::WrongVersion => Status::WrongVersion,
            };
            (status, current)
        }
        ObjectError::LogFull => (Status::Retry, Version(0)),
        ObjectError::NotAnInteger { current } => (Status::InvalidObject, current),
        ObjectError::IncrementOverflow { current } => (Status::InvalidObject, current),
        ObjectError::InvalidKey => (Status::InvalidKey, Version(0)),
        ObjectError::ValueTooLarge => (Status::ValueTooLarge, Version(0)),
    }
}
