//! [`StandbyGate`]: the RPC service of a coordinator from the moment it starts, standby or
//! active.
//!
//! A standby listens on its address from its start and answers every request with RETRY
//! ("not the active one"), as a deposed coordinator does; once it takes over, the same
//! listener serves the coordinator. Two things follow from listening for the whole life of the
//! process:
//! - Callers tell "not the active one" (an answer: try the next address) from "no process"
//!   (a refused connection).
//! - A standby may read a refused connection on the active coordinator's address as that
//!   process being gone, and take over at once instead of after the leadership's TTL
//!   (docs/design/coordinator-failover.md).

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use stratus_rpc::{Handled, Service};
use stratus_wire::{encode_error_response, FrameHeader, Status};

use crate::service::Coordinator;

/// What a standby answers to every request.
pub const STANDBY_ANSWER: &str = "this coordinator is standing by, not the active one";

/// A coordinator's service: RETRY until [`StandbyGate::activate`], then the coordinator.
#[derive(Debug, Default)]
pub struct StandbyGate {
    active: OnceLock<Coordinator>,
}

impl StandbyGate {
    /// A gate that answers RETRY to everything.
    pub fn new() -> StandbyGate {
        StandbyGate::default()
    }

    /// From now on `coordinator` answers. Only once: a coordinator that loses the leadership
    /// exits rather than stand by again (what it remembers may be overtaken).
    pub fn activate(&self, coordinator: Coordinator) {
        assert!(self.active.set(coordinator).is_ok(), "a coordinator is activated once");
    }
}

impl Service for StandbyGate {
    fn handle(&self, header: &FrameHeader, body: Bytes, out: &mut BytesMut) -> Handled {
        match self.active.get() {
            Some(coordinator) => coordinator.handle(header, body, out),
            None => {
                encode_error_response(
                    out,
                    header.request_id,
                    header.opcode_code,
                    Status::Retry,
                    STANDBY_ANSWER,
                );
                Handled::Done
            }
        }
    }
}
