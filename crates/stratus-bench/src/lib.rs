//! `stratus bench`: benchmarks that always measure a reference in the same run.
//!
//! Each benchmark prints a readable table and one JSON object per result line, so numbers can
//! be collected by scripts. Benchmarks start the systems they measure themselves (as child
//! processes of the `stratus` binary) and stop them afterwards.

mod cluster;
mod report;
mod rpc;

use clap::Subcommand;

/// `stratus bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Round-trip latency and throughput of a 100-byte read, against a raw TCP echo of the
    /// same size on loopback.
    Rpc(rpc::RpcArguments),
    /// (Internal) a TCP echo server, the reference for `bench rpc`.
    #[command(hide = true)]
    EchoServer {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
}

/// Runs a benchmark; `Err` is a one-line message.
pub fn run(command: BenchCommand, _coordinator: &str) -> Result<(), String> {
    match command {
        BenchCommand::Rpc(arguments) => rpc::run(arguments),
        BenchCommand::EchoServer { listen } => rpc::run_echo_server(&listen),
    }
}
