//! `stratus`: one binary for every role and tool.
//!
//! - `stratus up` runs a whole local cluster (coordinator + N storage servers as child
//!   processes on loopback) in the foreground.
//! - `stratus coordinator` and `stratus server` run the production roles.
//! - `stratus resp` runs the Redis-protocol gateway (crate `stratus-resp`).
//! - `stratus table ...`, `put`, `get`, `del`, `incr`, `scan`, `status` are the command-line
//!   client.
//! - `stratus bench ...` runs benchmarks.
//! - `stratus workload` runs a checked workload (recorded histories, linearizability) against
//!   a cluster, for fault-injection tests such as `tests/containers/run.py`.

mod cli;
mod roles;
mod status;
mod tx;
mod up;
mod users;
mod workload;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let arguments = cli::Arguments::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("STRATUS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(arguments.default_log_filter()));
    // Colour only for a person at a terminal: a log file (`stratus up` sends each child's
    // stderr to one) gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    stop_the_process_on_panic();
    cli::main(arguments)
}

/// A panic is a broken invariant (the storage path asserts its invariants). A panicking task
/// of the async runtime would end alone and leave the rest of the server serving from state
/// the failed code left half-changed, or behind a poisoned lock: stop the whole process instead
/// (after the usual message), so that the cluster recovers its data from the backups. Exit
/// status 134 (SIGABRT), as a build with `panic = "abort"` would give.
fn stop_the_process_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        std::process::abort();
    }));
}
