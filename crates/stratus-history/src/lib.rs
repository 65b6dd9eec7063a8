//! Histories of client operations and a linearizability checker for them (test support).
//!
//! Tests wrap a [`stratus_client::Client`] in a [`RecordingClient`]: every call is recorded with
//! its invocation and completion (stamps from one atomic counter, so they order events across
//! threads the way real time does) and its outcome. An outcome is *known* (a value, a version,
//! an object status such as OBJECT_DOESNT_EXIST) or *unknown* (a timeout, a lost connection, any
//! other failure): an unknown write may or may not have taken effect, now or at any later time.
//! The recorded client must take each call into effect at most once (exactly-once, the
//! default, or `retry_ambiguous_mutations` off): a call the library resent without an
//! identity after an attempt of unknown outcome may have applied twice, which no outcome can
//! record.
//!
//! [`check`] then verifies the [`History`] one key at a time (linearizability is compositional,
//! so the keys are independent):
//!
//! 1. every version a key reports is unique to one write, and a read never observes a version
//!    older than an acknowledged write that completed before the read began, unless a remove may
//!    lie between them ("every acknowledged write is visible afterwards", checked directly so
//!    that its failures are reported plainly);
//! 2. the key's operations are linearizable with respect to a register with versions: a search
//!    in the style of Wing and Gong with Lowe's memoization of (linearized set, state), pruned by
//!    Stratus's rule that a key's versions strictly increase, and bounded in effort: a history
//!    too large to decide is reported as such, never searched forever.
//!
//! A violation names the smallest set of operations found that still fails on its own.
//!
//! Keys used only as counters (incremented by 1) are checked by [`check_counter`] too: there
//! exactly-once is visible in the numbers (no increment applied twice, none lost), which a
//! register model cannot see when nobody read the value in between.
//!
//! Multi-object transactions are checked separately, on list-append histories
//! ([`list_append`]): an Elle-style inference of each key's version order and of the
//! dependencies between transactions, and a search for the cycles and other anomalies strict
//! serializability forbids.
//!
//! Dependency direction: this crate depends on `stratus-client` and `stratus-types`; nothing in
//! the production path depends on it.

mod checker;
mod counter;
mod history;
pub mod list_append;
mod model;
mod recorder;
pub mod workload;

pub use checker::{check, check_key, CheckOptions, KeyReport, Report, Verdict, Violation};
pub use counter::{check_counter, CounterReport, CounterViolation};
pub use history::{History, Operation, OperationRecord, Outcome};
pub use list_append::{check_list_append, ListAppendHistory, ListAppendReport};
pub use recorder::{Recorder, RecordingClient};
