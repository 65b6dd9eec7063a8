//! Object requests: reads, writes, removes, increments (single and multi), enumeration and
//! statistics, and how a store error is answered.

use bytes::{Bytes, BytesMut};
use stratus_store::{ByteSink, ExpiresAt, Expiry, Mutated, Mutation, ObjectError, WallTime};
use stratus_types::limits::ENUMERATE_RESPONSE_BYTES_MAX;
use stratus_types::{HashRange, RejectReason, RejectRules, RpcIdentity, TableId, Version};
use stratus_wire::{
    begin_response, encode_error_response, encode_response, finish_frame, put, AutoTableFigures,
    EnumeratedObject, EnumerationCursor, IncrementItem, IncrementItemResult, KeyItem, Opcode,
    ReadItemResult, RemoveItem, Response, ServerStatistics, Status, VersionItemResult, WriteItem,
    AUTO_TABLES_REPORTED_MAX,
};

use super::durable_answer::Observed;
use super::Master;
use crate::replication::ReplicaManager;

/// Appends the value bytes the store copies out of the log directly to the response frame.
struct FrameSink<'a>(&'a mut BytesMut);

impl ByteSink for FrameSink<'_> {
    fn put_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
}

impl Master {
    /// READ: the value goes from the log straight into the frame.
    pub(super) fn read(
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
        let now = self.now();
        let outcome = self.flash_reads.run(self.may_read_flash(table), || {
            self.store.read_located(table, key, hash, rules, now, &mut FrameSink(out))
        });
        let observed = match &outcome {
            Ok(found) => Observed::Object(found.segment_id),
            Err(_) => Observed::Absence,
        };
        match outcome {
            Ok(found) => {
                put::finish_length_prefixed_u32(out, value_position);
                put::patch_u64(out, version_position, found.version.0);
                put::put_u64(out, expires_in_millis(found.expires_at, now));
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
                    let response =
                        Response::Read { version, value: Bytes::new(), expires_in_millis: 0 };
                    encode_response(out, request_id, status, &response);
                } else {
                    encode_error_response(out, request_id, Opcode::Read.code(), status, "");
                }
            }
        }
        observed
    }

    /// Whether a read of `table` may wait on the flash tier: its table is not in memory and
    /// this master has flash (a value read from an image is a positioned read).
    fn may_read_flash(&self, table: TableId) -> bool {
        self.store.has_flash() && self.store.table_tier(table) != stratus_types::Tier::Memory
    }

    pub(super) fn read_one(&self, item: &KeyItem) -> (ReadItemResult, Observed) {
        let hash = match self.admit(item.table_id, &item.key) {
            Ok(hash) => hash,
            Err(status) => {
                let result = ReadItemResult { status, version: Version(0), value: Bytes::new() };
                return (result, Observed::Nothing);
            }
        };
        let mut value = Vec::new();
        let (table, key, rules) = (item.table_id, &item.key, &item.rules);
        let now = self.now();
        let outcome = self.flash_reads.run(self.may_read_flash(table), || {
            self.store.read_located(table, key, hash, rules, now, &mut value)
        });
        match outcome {
            Ok(found) => {
                let result = ReadItemResult {
                    status: Status::Ok,
                    version: found.version,
                    value: value.into(),
                };
                (result, Observed::Object(found.segment_id))
            }
            Err(error) => {
                let (status, version) = status_of(error);
                (ReadItemResult { status, version, value: Bytes::new() }, Observed::Absence)
            }
        }
    }

    /// Applies `mutation` to (`table`, `key`) if `rules` allow it, exactly once under `rpc`.
    fn apply(
        &self,
        (table, key): (TableId, &[u8]),
        rules: &RejectRules,
        mutation: Mutation<'_>,
        rpc: Option<RpcIdentity>,
    ) -> Result<Mutated, (Status, Version)> {
        let now = self.now();
        self.mutate(table, key, rpc, |hash| {
            self.store.mutate((table, key, hash), rules, mutation, rpc, now)
        })
    }

    pub(super) fn write_one(&self, write: ObjectWrite<'_>) -> (Status, Version) {
        let ObjectWrite { table, key, value, rules, expiry, rpc } = write;
        match self.apply((table, key), rules, Mutation::Write { value, expiry }, rpc) {
            Ok(done) => (Status::Ok, done.version),
            Err(refusal) => refusal,
        }
    }

    pub(super) fn write_item(&self, item: &WriteItem) -> VersionItemResult {
        let (status, version) = self.write_one(ObjectWrite {
            table: item.table_id,
            key: &item.key,
            value: &item.value,
            rules: &item.rules,
            expiry: item.expiry,
            rpc: item.rpc,
        });
        VersionItemResult { status, version }
    }

    /// The message an error answer to a WRITE carries: the limit a value broke, so the caller
    /// learns it.
    pub(super) fn write_refusal_message(&self, status: Status, value: &[u8]) -> String {
        match status {
            Status::ValueTooLarge => format!(
                "a value of {} bytes; this server takes values of at most {} bytes \
                 (--value-bytes-max)",
                value.len(),
                self.store.config().value_bytes_max
            ),
            _ => String::new(),
        }
    }

    /// SET_EXPIRY: the object keeps its value and gets a new version with `expiry`.
    pub(super) fn set_expiry_one(
        &self,
        (table, key): (TableId, &[u8]),
        expiry: Expiry,
        rules: &RejectRules,
        rpc: Option<RpcIdentity>,
    ) -> (Status, Version) {
        match self.apply((table, key), rules, Mutation::SetExpiry { expiry }, rpc) {
            Ok(done) => (Status::Ok, done.version),
            Err(refusal) => refusal,
        }
    }

    pub(super) fn remove_one(
        &self,
        (table, key): (TableId, &[u8]),
        rules: &RejectRules,
        rpc: Option<RpcIdentity>,
    ) -> (Status, Version) {
        match self.apply((table, key), rules, Mutation::Remove, rpc) {
            Ok(done) => (Status::Ok, done.version),
            Err(refusal) => refusal,
        }
    }

    pub(super) fn remove_item(&self, item: &RemoveItem) -> VersionItemResult {
        let (status, version) = self.remove_one((item.table_id, &item.key), &item.rules, item.rpc);
        VersionItemResult { status, version }
    }

    pub(super) fn increment_one(
        &self,
        (table, key): (TableId, &[u8]),
        delta: i64,
        rules: &RejectRules,
        rpc: Option<RpcIdentity>,
    ) -> IncrementItemResult {
        match self.apply((table, key), rules, Mutation::Increment { delta }, rpc) {
            Ok(done) => IncrementItemResult {
                status: Status::Ok,
                version: done.version,
                value: done.integer.expect("an increment answers its value"),
            },
            Err((status, version)) => IncrementItemResult { status, version, value: 0 },
        }
    }

    pub(super) fn increment_item(&self, item: &IncrementItem) -> IncrementItemResult {
        self.increment_one((item.table_id, &item.key), item.delta, &item.rules, item.rpc)
    }

    pub(super) fn enumerate(
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
            (cursor.reversed_hash, cursor.after_key.as_deref()),
            bytes_max,
            self.now(),
            &mut |key, value, version, expires_at| {
                objects.push(EnumeratedObject {
                    key: Bytes::copy_from_slice(key),
                    value: Bytes::copy_from_slice(value),
                    version,
                    expires_at,
                })
            },
        );
        let next = match next {
            Ok(next) => next,
            Err(error) => {
                let opcode = Opcode::Enumerate.code();
                let message = format!("enumeration failed: {error:?}");
                return encode_error_response(
                    out,
                    request_id,
                    opcode,
                    status_of(error).0,
                    &message,
                );
            }
        };
        let next = next.map(|(reversed_hash, after_key)| EnumerationCursor {
            reversed_hash,
            after_key: after_key.map(Bytes::from),
        });
        encode_response(out, request_id, Status::Ok, &Response::Enumerate { objects, next });
    }

    pub(super) fn statistics(&self) -> ServerStatistics {
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
            process_resident_bytes: stratus_ops::process::resident_memory_bytes().unwrap_or(0),
            log_bytes_resident: store.log_bytes_resident,
            log_bytes_target: store.log_bytes_target,
            hash_table_bytes: store.hash_table_bytes,
            auto_tables: self
                .store
                .auto_table_statistics(AUTO_TABLES_REPORTED_MAX)
                .into_iter()
                .map(|table| AutoTableFigures {
                    table_id: table.table,
                    dram_objects: table.dram_objects,
                    dram_bytes: table.dram_bytes,
                    flash_objects: table.counts.flash_objects,
                    flash_bytes: table.counts.flash_bytes,
                    reads_from_dram: table.counts.reads_from_dram,
                    reads_from_flash: table.counts.reads_from_flash,
                    promotions: table.counts.promotions,
                    objects_demoted: table.counts.objects_demoted,
                })
                .collect(),
        }
    }
}

/// A WRITE as the master applies it.
pub(super) struct ObjectWrite<'a> {
    pub(super) table: TableId,
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
    pub(super) rules: &'a RejectRules,
    pub(super) expiry: Expiry,
    pub(super) rpc: Option<RpcIdentity>,
}

/// What READ reports of an object's expiry: milliseconds left, rounded up so that a live
/// object never reports 0, which means "no expiry".
fn expires_in_millis(expires_at: Option<ExpiresAt>, now: WallTime) -> u64 {
    expires_at.map_or(0, |expires_at| expires_at.remaining_millis(now.millis()).max(1))
}

/// Answers a WRITE, REMOVE or SET_EXPIRY: the version, or an error with `message`.
pub(super) fn respond_version(
    out: &mut BytesMut,
    request_id: u64,
    opcode: Opcode,
    (status, version): (Status, Version),
    message: &str,
) {
    if !status.carries_operation_body() {
        return encode_error_response(out, request_id, opcode.code(), status, message);
    }
    let response = match opcode {
        Opcode::Write => Response::Write { version },
        Opcode::Remove => Response::Remove { version },
        Opcode::SetExpiry => Response::SetExpiry { version },
        _ => unreachable!("respond_version answers WRITE, REMOVE and SET_EXPIRY"),
    };
    encode_response(out, request_id, status, &response);
}

/// The status and version a store error is reported with.
pub(crate) fn status_of(error: ObjectError) -> (Status, Version) {
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
        ObjectError::StaleRpc => (Status::StaleRpc, Version(0)),
        // The client's retry, once it has acknowledged results, goes through.
        ObjectError::TooManyUnacknowledged => (Status::Retry, Version(0)),
        ObjectError::InvalidRpcIdentity => (Status::RequestFormatError, Version(0)),
        // A transaction holds the object between its vote and its decision: a round trip
        // or two, the client's retry finds it free.
        ObjectError::Locked => (Status::Retry, Version(0)),
        ObjectError::NotAParticipant => (Status::RequestFormatError, Version(0)),
        // This master's own flash failed or is corrupt: its problem, not the request's (the
        // durable copies on backups are intact; docs/design/flash-tier.md says what an
        // operator does).
        ObjectError::FlashRead(_) | ObjectError::FlashCorrupt => {
            (Status::InternalError, Version(0))
        }
    }
}
