//! The operations surface of Stratus: what an operator scrapes and looks at.
//!
//! - [`histogram`]: counters and latency histograms cheap enough to record on every request
//!   (sharded per thread, relaxed atomics, no allocation, no lock).
//! - [`exposition`]: the Prometheus text format 0.0.4 (a writer, and a strict parser for tests).
//! - [`json`]: a small JSON writer for the status page's data.
//! - [`process`]: figures of this process (resident memory).
//! - `http` (feature `http`): a bounded HTTP/1.1 server (axum's router on hyper) and the
//!   status page, one self-contained HTML document.
//!
//! Which figures a role exports, and under which names, is decided by the role (the `stratus`
//! binary's `roles/metrics.rs`, documented in `docs/design/metrics.md`); this crate only
//! provides the means. Without the `http` feature it depends on nothing, so service crates
//! (the master) use its primitives without pulling in an HTTP stack.

pub mod exposition;
pub mod histogram;
#[cfg(feature = "http")]
pub mod http;
pub mod json;
pub mod process;

pub use exposition::{Exposition, MetricType};
pub use histogram::{HistogramSnapshot, LatencyHistogram, ShardedCounter};

/// The status page: one HTML document with its script and style inline (no external asset:
/// it must work on a machine without internet). It polls `api/cluster` (relative to its own
/// URL) every second and draws the figures.
#[cfg(feature = "http")]
pub const STATUS_PAGE_HTML: &str = include_str!("status_page.html");

/// The content security policy the status page is served with: nothing but itself and its
/// own origin's data.
#[cfg(feature = "http")]
pub const STATUS_PAGE_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; \
     script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:";
