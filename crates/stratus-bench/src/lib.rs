//! `stratus bench`: benchmarks that always measure a reference in the same run.
//!
//! Each benchmark prints a readable table and one JSON object per result line, so numbers can
//! be collected by scripts. Benchmarks start the systems they measure themselves (as child
//! processes of the `stratus` binary) and stop them afterwards.

mod allocators;
mod backup;
mod cleaner_latency;
mod cluster;
mod cpu;
mod failover;
mod flash;
mod latency;
mod memory;
mod migration;
mod peers;
mod recovery;
mod redis_reference;
mod replica_files;
mod report;
mod resp;
mod resp_client;
mod rpc;
mod server_logs;
mod tiering;
mod tls;
mod tx;
mod utilization;
mod ycsb;

use clap::Subcommand;

/// `stratus bench ...`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Round-trip latency and throughput of a 100-byte read, against a raw TCP echo of the
    /// same size on loopback.
    Rpc(rpc::RpcArguments),
    /// Write and read latency of small objects with 0, 1 and 3 replicas, buffered and fsync,
    /// on a local cluster (the read is the reference for the write).
    Latency(latency::LatencyArguments),
    /// Objects per second one backup logs through the RPC path, against the raw sequential
    /// write bandwidth of the same disk.
    Backup(backup::BackupArguments),
    /// Storage-engine write throughput as live data fills the log (30..90 %), with the
    /// cleaner running, and the cleaner's bytes moved per byte written; one- vs two-level.
    Utilization(utilization::UtilizationArguments),
    /// Write latency percentiles (p50 … p99.99) of back-to-back small overwrites with the
    /// cleaner busy at high utilization, against the same writes with the cleaner idle.
    CleanerLatency(cleaner_latency::CleanerLatencyArguments),
    /// Time from a master's SIGKILL until its data is served again by the other masters, with
    /// the recovery bandwidth and a check that no acknowledged write was lost, against reading
    /// its replicas straight from the backups' disks and against Redis restarting from an AOF
    /// of the same objects.
    Recovery(recovery::RecoveryArguments),
    /// How long clients wait when a master is killed or paused, a backup is paused, two
    /// servers are killed, or the active coordinator is killed with standbys: per event, the
    /// longest stall and p99 of the failed servers' keys and of all others, and when every
    /// key was served again.
    Failover(failover::FailoverArguments),
    /// How long clients' writes to a tablet wait while it moves to another master: the
    /// migration's duration and the latency of writes during it, against the same client's
    /// writes before it (`--cluster-binary` runs the cluster with another build).
    Migration(migration::MigrationArguments),
    /// redis-benchmark against Stratus's RESP front ends (the key's own server, another
    /// server that forwards, the gateway) in each configuration, beside Redis with and
    /// without an AOF; ratios to Redis.
    Resp(resp::RespArguments),
    /// YCSB's core workloads A–F (ScrambledZipfian and latest keys, 10 × 100-byte fields) on
    /// Stratus (R = 0; R = 3 buffered and fsync) side by side with Redis (appendfsync everysec
    /// and always) and memcached, started here; YCSB-style report plus JSON lines.
    Ycsb(ycsb::YcsbArguments),
    /// Transactions: commit latency of 1, 2 and 5 objects on 1, 2 and 5 masters beside a
    /// single write, and T2's transactional YCSB (zipfian read-modify-write transactions) on
    /// Stratus beside Redis's WATCH/MULTI/EXEC with replicas and WAIT; committed transactions
    /// per second, abort rates, latency and CPU per transaction.
    Tx(tx::TxArguments),
    /// Memory needed to hold the same live data while object sizes change (FAST'14 Table 1,
    /// W1..W8): Stratus's log at 90 % against glibc, jemalloc and mimalloc, Redis (with and
    /// without active defragmentation) and memcached, each's peak resident set.
    Memory(memory::MemoryArguments),
    /// The flash tier against the raw file system it writes to, in the same run: write
    /// throughput until on flash (R = 0 and 3) against a sequential write, reads at depth 1
    /// and 32 against 4 KiB random preads, DRAM per flash object (100 B, 1 KB), and YCSB A, B,
    /// C on a flash table four times the log memory beside a memory table (ratio, and per
    /// dollar with DRAM at 23 × flash's $/GB), and overwrites at 80 % flash utilization
    /// against writes into an empty tier.
    Flash(flash::FlashArguments),
    /// Automatic tiering: YCSB B and C on an auto table five times its server's DRAM budget
    /// beside a memory table holding it all (throughput ratio, DRAM hit ratio), a hot set
    /// that moves (time until the hit ratio is back at 0.9), and Redis with the same budget as
    /// an LRU cache (the share of keys it evicts) against the auto table keeping every key.
    Tiering(tiering::TieringArguments),
    /// (Internal) the process holding one system's objects for `bench memory`.
    #[command(hide = true)]
    MemoryWorker(memory::MemoryWorkerArguments),
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
        BenchCommand::Latency(arguments) => latency::run(arguments),
        BenchCommand::Backup(arguments) => backup::run(arguments),
        BenchCommand::Utilization(arguments) => utilization::run(arguments),
        BenchCommand::CleanerLatency(arguments) => cleaner_latency::run(arguments),
        BenchCommand::Recovery(arguments) => recovery::run(arguments),
        BenchCommand::Failover(arguments) => failover::run(arguments),
        BenchCommand::Migration(arguments) => migration::run(arguments),
        BenchCommand::Ycsb(arguments) => ycsb::run(arguments),
        BenchCommand::Tx(arguments) => tx::run(arguments),
        BenchCommand::Resp(arguments) => resp::run(arguments),
        BenchCommand::Memory(arguments) => memory::run(arguments),
        BenchCommand::Flash(arguments) => flash::run(arguments),
        BenchCommand::Tiering(arguments) => tiering::run(arguments),
        BenchCommand::MemoryWorker(arguments) => memory::run_worker(arguments),
        BenchCommand::EchoServer { listen } => rpc::run_echo_server(&listen),
    }
}
