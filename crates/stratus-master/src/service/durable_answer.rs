//! Answers released only once what they depend on is durable: a request that changed the
//! log waits for its append to reach every replica, and a read that saw the unreplicated tail
//! (or an absence while bytes wait) waits for that tail.

use std::sync::Arc;

use bytes::BytesMut;
use stratus_rpc::Handled;
use stratus_types::SegmentId;
use stratus_wire::{encode_error_response, encode_response, Opcode, Request, Response, Status};

use super::{Master, SyncContext};
use crate::metrics::Operation;
use crate::replication::{LogPosition, SyncError};

impl Master {
    /// Handles a request that may have appended to the log, and answers only after the log up
    /// to the append is on every replica. The response is built now (the store's work is
    /// done) and released by the future.
    pub(super) fn handle_then_sync(
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
    pub(super) fn read_once_durable(
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
pub(super) enum Observed {
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
pub(super) fn answer_once_durable(
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
                    // to try again; a retried write re-applies harmlessly, a retried increment
                    // may apply twice until exactly-once RPCs exist (documented in README).
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
