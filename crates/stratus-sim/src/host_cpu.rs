//! The processor time one simulated host takes: what the coordinator costs, in real CPU time
//! of this machine, while a run's events unfold in simulated time.
//!
//! turmoil enters a tracing span named `node` (field `name`: the host) around each host's
//! share of every simulation step, on the one thread that runs the simulation. [`HostCpuMeter`]
//! is a tracing subscriber interested in that span only: on entering the measured host's span
//! it reads the thread's processor time (`CLOCK_THREAD_CPUTIME_ID`),
//! and on leaving it adds the difference. Every task of the host (request handling, the RPC
//! layer's framing and membership proofs, the failure detector, recovery planning, metadata
//! writes) runs inside that span; the simulator's network and the other hosts do not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::time::{clock_gettime, ClockId};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};

/// The span turmoil enters around a host's share of a step.
const NODE_SPAN: &str = "node";

/// Ids this subscriber hands out: the measured host's span, and every other host's.
const MEASURED: u64 = 1;
const OTHER: u64 = 2;

/// Nanoseconds this thread has run on a CPU (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_nanos() -> u64 {
    let now = clock_gettime(ClockId::ThreadCPUTime);
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// A tracing subscriber that measures the processor time of one simulated host (see the
/// module's comment). Install it around a run with `tracing::subscriber::with_default`.
#[derive(Debug)]
pub struct HostCpuMeter {
    host: String,
    total_nanos: Arc<AtomicU64>,
    entered_at: AtomicU64,
}

impl HostCpuMeter {
    /// A meter of `host`'s processor time, added to `total_nanos`.
    pub fn new(host: &str, total_nanos: Arc<AtomicU64>) -> HostCpuMeter {
        HostCpuMeter { host: host.to_string(), total_nanos, entered_at: AtomicU64::new(0) }
    }
}

fn is_node_span(metadata: &Metadata<'_>) -> bool {
    metadata.is_span() && metadata.name() == NODE_SPAN && metadata.target().starts_with("turmoil")
}

/// Finds whether a span's `name` field is the measured host.
struct NameIs<'a> {
    host: &'a str,
    matched: bool,
}

impl Visit for NameIs<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "name" {
            self.matched = value == self.host;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "name" {
            self.matched = format!("{value:?}").trim_matches('"') == self.host;
        }
    }
}

impl Subscriber for HostCpuMeter {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if is_node_span(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_node_span(metadata)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut name = NameIs { host: &self.host, matched: false };
        span.record(&mut name);
        Id::from_u64(if name.matched { MEASURED } else { OTHER })
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, _event: &Event<'_>) {}

    fn enter(&self, span: &Id) {
        if span.into_u64() == MEASURED {
            self.entered_at.store(thread_cpu_nanos(), Ordering::Relaxed);
        }
    }

    fn exit(&self, span: &Id) {
        if span.into_u64() == MEASURED {
            let spent = thread_cpu_nanos().saturating_sub(self.entered_at.load(Ordering::Relaxed));
            self.total_nanos.fetch_add(spent, Ordering::Relaxed);
        }
    }
}
