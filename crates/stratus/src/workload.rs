//! `stratus workload`: a checked client workload to run against a cluster while faults are
//! injected (the container tests of `tests/containers/run.py` run it in a client container).
//!
//! Concurrent clients issue reads, writes, conditional writes (version-equals and create-only)
//! and increments on a small key set for a fixed time, every call recorded by
//! `stratus-history`'s `RecordingClient`; then every key is read back, and the whole history is
//! checked with `stratus_history::check` (per-key linearizability, which includes "every
//! acknowledged write is visible afterwards"), plus a direct check that each key's final value
//! is at least its newest acknowledged write (the workload never removes, so a missing or older
//! final value is a lost write). One summary line is printed; a violation prints the smallest
//! offending history of each failing key and exits with status 2.
//!
//! Every mutation takes effect exactly once: the clients run with exactly-once RPCs on (RIFL,
//! docs/design/exactly-once.md), so the client library sends a mutation whose outcome is
//! unknown (a timeout, a connection lost after sending, RETRY from the master) again under the
//! same identity until `--operation-timeout-ms`, and a retry of one that ran gets the first
//! answer instead of running again. An operation still without an answer then is recorded as
//! an unknown outcome, and the client backs off and goes on with new, separately recorded
//! operations. A conditional write applied twice would show in the register check; an
//! increment applied twice, where a register cannot see it, shows in the counters:
//! `--counters` keys that are only ever incremented by 1 (one operation in ten, some as
//! two-item multi-increments), each checked with `stratus_history::check_counter` against its
//! final value (at least its acknowledged increments, at most those plus the unknown ones, and
//! no value returned twice). Counter keys are left out of the register check (their histories
//! are long, and the counter check is the stronger one for them).
//!
//! `--bank-accounts` adds a bank (`workload/bank.rs`): clients moving money between accounts
//! on every master in transactions, and read-only transactions summing every account; every
//! committed audit must see the opening total, and so must the final plain reads.
//!
//! `--list-append-keys` adds list-append transactions (`workload/list_append.rs`): clients
//! reading lists and appending unique elements to them in transactions, the whole history
//! (with a final read-only transaction of every list) checked for every anomaly strict
//! serializability forbids by `stratus_history::list_append`; one more summary line
//! (`workload: list_append ...`) is printed before the verdict line.
//!
//! Exit status: 0 linearizable and nothing lost; 1 the workload could not run (no cluster, bad
//! arguments); 2 a violation (lost acknowledged write or non-linearizable history); 3
//! inconclusive (a key stayed unreadable after the run, the checker ran out of search steps on a
//! key, the checker's canary was not caught, or the whole command ran past its time bound).
//!
//! The canary: the history of one key with one read changed to a value nobody wrote must fail
//! the check, so a pass cannot come from a checker or a recording that accepts everything.
//!
//! Every phase is bounded in time: startup (`--startup-seconds`), the mixed phase (`--seconds`,
//! plus at most one operation's timeout), the final reads (`--settle-seconds`), and the checker (by
//! search steps per key); a watchdog ends the process if the sum is exceeded anyway.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use stratus_client::{Client, ClientConfig, Error as ClientError, RejectRules, Status, TableId};
use stratus_history::workload::{counter_key, counter_step, Choices};
use stratus_history::{
    check, check_counter, check_key, CheckOptions, History, Operation, OperationRecord, Outcome,
    Recorder, RecordingClient, Verdict,
};
use stratus_rpc::deadline_in;
use stratus_types::Version;
use stratus_wire::ServerStatus;

mod availability;
mod bank;
mod list_append;

/// `stratus workload`.
#[derive(Debug, Args)]
pub struct WorkloadArguments {
    /// Table to create and use (default `workload-<seed>`). It must not exist yet: the checker
    /// assumes every key starts missing.
    #[arg(long)]
    pub table: Option<String>,
    /// Keys shared by every client (an eighth of them get half of the operations).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub keys: u32,
    /// Counter keys, incremented by 1 and nothing else, that check every increment ran exactly
    /// once (0: none).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub counters: u32,
    /// Concurrent clients, each one sequential stream of operations with its own connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub clients: u32,
    /// Length of the mixed phase, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Seed of every client's choices (default: from the clock; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Wait until at least this many servers are up before creating the table.
    #[arg(long, default_value_t = 1)]
    pub servers: usize,
    /// Masters to spread the table over (default: every server up at the start).
    #[arg(long)]
    pub span: Option<u32>,
    /// How long to wait for the cluster (coordinator reachable, --servers up), in seconds.
    #[arg(long, default_value_t = 60)]
    pub startup_seconds: u64,
    /// How long the final read of every key may take after the mixed phase, in seconds (the
    /// cluster may still be recovering from the last fault).
    #[arg(long, default_value_t = 90)]
    pub settle_seconds: u64,
    /// How long one request to one server may take, in milliseconds (a write that times out
    /// is an unknown outcome).
    #[arg(long, default_value_t = 3_000)]
    pub attempt_timeout_ms: u64,
    /// How long one operation may take, retries of requests that certainly did not run
    /// included, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub operation_timeout_ms: u64,
    /// Most operations per second per client (0: as fast as the cluster answers). Bounds the
    /// history, hence the checker's work.
    #[arg(long, default_value_t = 0)]
    pub rate: u32,
    /// Search steps the checker may spend per key before calling it undecided.
    #[arg(long, default_value_t = 2_000_000)]
    pub check_steps: u64,
    /// Write the whole history here (one operation per line) when the verdict is not a pass,
    /// for analysis beyond the minimal histories printed.
    #[arg(long)]
    pub history_out: Option<PathBuf>,
    /// Accounts of the bank run beside the checked clients (0: none): transfers in
    /// transactions between accounts on every master and read-only audits of every account,
    /// checked to conserve the total (docs/design/transactions.md).
    #[arg(long, default_value_t = 0, value_parser = parse_bank_accounts)]
    pub bank_accounts: u32,
    /// Bank clients, each alternating transfers and audits.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub bank_clients: u32,
    /// Lists of the list-append transactions run beside the checked clients (0: none):
    /// transactions reading 1–3 lists and appending to 1–2, checked for every anomaly strict
    /// serializability forbids.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=4_096))]
    pub list_append_keys: u32,
    /// List-append clients, each running one transaction at a time.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub list_append_clients: u32,
    /// Write when each operation of the mixed phase ran and which master owned its key here
    /// (format in `workload/availability.rs`), for a fault harness that bounds how long
    /// operations on servers it did not touch waited.
    #[arg(long)]
    pub availability_out: Option<PathBuf>,
}

/// `--bank-accounts`: none, or at least two (a transfer needs two accounts).
fn parse_bank_accounts(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(count) if count == 0 || (2..=4_096).contains(&count) => Ok(count),
        _ => Err("0 (no bank) or 2 to 4096 accounts".to_string()),
    }
}

/// The workload's verdicts, as exit statuses.
const EXIT_VIOLATION: u8 = 2;
const EXIT_INCONCLUSIVE: u8 = 3;

/// Backoff of a client after an unknown outcome (the cluster may be recovering).
const FAULT_BACKOFF_MIN: Duration = Duration::from_millis(20);
const FAULT_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How far a paced client may fall behind its rate and still catch up.
const PACING_CATCH_UP_MAX: Duration = Duration::from_millis(100);
/// How often progress is printed during the mixed phase.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(5);
/// Time the checker gets before the watchdog gives up on it.
const CHECK_PATIENCE: Duration = Duration::from_secs(300);

fn key_name(index: u32) -> Vec<u8> {
    format!("key-{index:05}").into_bytes()
}

/// How long the clients wait: `operation` per operation, `attempt` per request.
#[derive(Clone, Copy, Debug)]
struct Timeouts {
    operation: Duration,
    attempt: Duration,
}

/// A client whose mutations take effect exactly once (see the module documentation).
fn exactly_once_client(base: &ClientConfig, timeouts: Timeouts) -> Client {
    let mut config = base.clone();
    config.operation_timeout = timeouts.operation;
    assert!(config.exactly_once, "the workload checks exactly-once mutations");
    config.rpc.request_timeout = timeouts.attempt;
    config.rpc.connect_timeout = timeouts.attempt.min(Duration::from_secs(2));
    Client::new(config)
}

/// What one client did, beyond the history.
#[derive(Debug, Default)]
struct Tally {
    /// Unknown outcomes by status.
    unknown: BTreeMap<String, u64>,
    /// The operations timed for `--availability-out` (none without it).
    timed: Vec<availability::Timed>,
    /// Operations not timed because the bound was reached.
    timed_left_out: u64,
}

/// How a client of the mixed phase runs.
#[derive(Clone, Copy, Debug)]
struct Pace {
    /// Most operations per second (0: as fast as the cluster answers).
    rate: u32,
    /// Time every operation for `--availability-out`.
    timed: bool,
}

/// One client's mixed phase: until `stop`, pick a key and an operation, record it, back off
/// after an unknown outcome.
async fn run_client(
    client: RecordingClient,
    client_id: u32,
    table: TableId,
    (keys, counters): (u32, u32),
    mut choices: Choices,
    pace: Pace,
    stop: Arc<AtomicBool>,
) -> Tally {
    let hot_keys = (keys / 8).max(1);
    let mut tally = Tally::default();
    let mut last_seen = vec![Version(0); keys as usize];
    let mut backoff = FAULT_BACKOFF_MIN;
    let Pace { rate, timed: timing } = pace;
    let pacing = (rate > 0).then(|| Duration::from_secs(1) / rate);
    // When the next operation may start: advances by `pacing` per operation, so the rate holds
    // on average even though one timer tick is about as long as one operation.
    let mut next_start = tokio::time::Instant::now();
    let mut sequence: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        if let Some(pacing) = pacing {
            let now = tokio::time::Instant::now();
            // After a stall (a fault), start again from now rather than catch up in a burst.
            if next_start + PACING_CATCH_UP_MAX < now {
                next_start = now;
            }
            if next_start > now {
                tokio::time::sleep_until(next_start).await;
            }
            next_start += pacing;
        }
        sequence += 1;
        if counters > 0 && choices.below(10) == 0 {
            // Its outcome is in the history; the counter check reads it from there.
            counter_step(&client, table, counters as usize, &mut choices).await;
            continue;
        }
        let key_index = if choices.below(2) == 0 {
            choices.below(u64::from(hot_keys)) as u32
        } else {
            choices.below(u64::from(keys)) as u32
        };
        let key = key_name(key_index);
        // Distinct per write, and an 8-byte integer so that increments apply to it.
        let value = Bytes::copy_from_slice(
            &((i64::from(client_id) << 40) | (sequence as i64 & 0xFF_FFFF_FFFF)).to_le_bytes(),
        );
        let start_micros = availability::wall_micros();
        let result: Result<Version, ClientError> = match choices.below(100) {
            0..=39 => client.read(table, &key).await.map(|(_, version)| version),
            40..=64 => client.write_with(table, &key, value, RejectRules::NONE).await,
            65..=79 => {
                let rules = RejectRules::version_equals(last_seen[key_index as usize]);
                client.write_with(table, &key, value, rules).await
            }
            80..=84 => client.write_with(table, &key, value, RejectRules::create_only()).await,
            _ => {
                let delta = choices.below(19) as i64 - 9;
                client.increment(table, &key, delta).await.map(|(_, version)| version)
            }
        };
        if timing {
            if tally.timed.len() < availability::TIMED_OPERATIONS_PER_CLIENT_MAX {
                let end_micros = availability::wall_micros();
                tally.timed.push(availability::Timed { start_micros, end_micros, key_index });
            } else {
                tally.timed_left_out += 1;
            }
        }
        match result {
            Ok(version) => {
                last_seen[key_index as usize] = version;
                backoff = FAULT_BACKOFF_MIN;
            }
            Err(error) if Outcome::is_refusal(error.status) => {
                if error.status != Status::InvalidObject {
                    last_seen[key_index as usize] = error.version;
                }
                backoff = FAULT_BACKOFF_MIN;
            }
            Err(error) => {
                *tally.unknown.entry(format!("{:?}", error.status)).or_default() += 1;
                // Jitter from the same seeded stream: half to the full delay.
                let delay = backoff.mul_f64(0.5 + choices.below(500) as f64 / 1000.0);
                tokio::time::sleep(delay).await;
                backoff = (backoff * 2).min(FAULT_BACKOFF_MAX);
                continue;
            }
        }
    }
    tally
}

/// What the final read of a key found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum FinalRead {
    /// The object, with its value and version.
    Present(Bytes, Version),
    /// No object.
    Missing,
    /// No known outcome before the settle deadline.
    Unreadable,
}

/// Reads every key of `keys` once the mixed phase is over, retrying each until it has a known
/// outcome or `deadline` passes. The reads are part of the history (client id `client_id`).
async fn read_back(
    client: &RecordingClient,
    table: TableId,
    keys: &[Vec<u8>],
    deadline: tokio::time::Instant,
) -> Vec<FinalRead> {
    let mut found = Vec::with_capacity(keys.len());
    for key in keys {
        let mut backoff = FAULT_BACKOFF_MIN;
        let result = loop {
            match client.read(table, key).await {
                Ok((value, version)) => break FinalRead::Present(value, version),
                Err(error) if error.status == Status::ObjectDoesntExist => {
                    break FinalRead::Missing
                }
                Err(_) if tokio::time::Instant::now() >= deadline => break FinalRead::Unreadable,
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(FAULT_BACKOFF_MAX);
                }
            }
        };
        found.push(result);
    }
    found
}

/// What the counters' histories and final reads came to: the increments counted, and one line
/// per counter that shows an increment applied other than once.
#[derive(Debug, Default)]
struct CounterFindings {
    counted_increments: u64,
    violations: Vec<String>,
    unreadable: usize,
}

/// Checks every counter's history against its final read ([`check_counter`]).
fn check_counters(history: &History, table: TableId, finals: &[FinalRead]) -> CounterFindings {
    let mut findings = CounterFindings::default();
    for (index, final_read) in finals.iter().enumerate() {
        let key = counter_key(index);
        let final_value = match final_read {
            FinalRead::Present(value, _) => match <[u8; 8]>::try_from(&value[..]) {
                Ok(bytes) => i64::from_le_bytes(bytes),
                Err(_) => {
                    let what = format!("holds {} bytes, not an integer", value.len());
                    findings.violations.push(format!("counter {index}: {what}"));
                    continue;
                }
            },
            FinalRead::Missing => 0,
            FinalRead::Unreadable => {
                findings.unreadable += 1;
                continue;
            }
        };
        match check_counter(history, table, &key, final_value) {
            Ok(report) => findings.counted_increments += report.acknowledged,
            Err(violation) => findings.violations.push(format!("counter {index}: {violation}")),
        }
    }
    findings
}

/// Waits until the coordinator answers and at least `servers` servers are up; returns how many
/// are up.
async fn wait_for_cluster(
    admin: &Client,
    servers: usize,
    deadline: tokio::time::Instant,
) -> Result<usize, String> {
    loop {
        let last = match admin.server_list().await {
            Ok(list) => {
                let up = list
                    .iter()
                    .filter(|server| {
                        server.status == ServerStatus::Up && server.services.has_master()
                    })
                    .count();
                if up >= servers.max(1) {
                    return Ok(up);
                }
                format!("{up} of {servers} servers up")
            }
            Err(error) => format!("coordinator: {error}"),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("the cluster did not come up in time ({last})"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates the workload's table; refuses a table that exists already.
async fn create_table(admin: &Client, name: &str, span: u32) -> Result<TableId, String> {
    match admin.get_table_id(name).await {
        Ok(id) => {
            return Err(format!(
                "table {name:?} exists already (id {id}); the checker assumes every key starts \
                 missing: give a new --table"
            ))
        }
        Err(error) if error.status == Status::TableDoesntExist => {}
        Err(error) => return Err(format!("looking up table {name:?}: {error}")),
    }
    admin
        .create_table(name, span)
        .await
        .map_err(|error| format!("creating table {name:?}: {error}"))
}

/// The value an acknowledged write or increment left in the object.
fn created_value(operation: &OperationRecord) -> Option<Bytes> {
    match (&operation.operation, &operation.outcome) {
        (Operation::Write { value, .. }, Outcome::Written { .. }) => Some(value.clone()),
        (_, Outcome::Incremented { value, .. }) => {
            Some(Bytes::copy_from_slice(&value.to_le_bytes()))
        }
        _ => None,
    }
}

/// Keys whose final read does not hold their newest acknowledged write (the workload never
/// removes, so the final object must be that write, at its version with its value, or a later
/// one): (newest acknowledged, final read).
fn lost_writes<'a>(
    history: &'a History,
    final_reads: &[FinalRead],
) -> Vec<(&'a OperationRecord, FinalRead)> {
    let mut newest: BTreeMap<&[u8], &OperationRecord> = BTreeMap::new();
    for operation in &history.operations {
        let Some(version) = operation.outcome.created_version() else { continue };
        let entry = newest.entry(&operation.key[..]).or_insert(operation);
        if entry.outcome.created_version() < Some(version) {
            *entry = operation;
        }
    }
    let mut lost = Vec::new();
    for (key_index, final_read) in final_reads.iter().enumerate() {
        let key = key_name(key_index as u32);
        let Some(write) = newest.get(&key[..]) else { continue };
        let acknowledged = write.outcome.created_version().unwrap_or(Version(0));
        let kept = match final_read {
            FinalRead::Present(value, version) => {
                *version > acknowledged
                    || (*version == acknowledged && created_value(write).as_ref() == Some(value))
            }
            FinalRead::Missing => false,
            // Not a loss as far as we know: reported as unavailable instead.
            FinalRead::Unreadable => true,
        };
        if !kept {
            lost.push((*write, final_read.clone()));
        }
    }
    lost
}

fn describe_final(final_read: &FinalRead) -> String {
    match final_read {
        FinalRead::Present(value, version) => {
            format!("\"{}\" version {}", value.escape_ascii(), version.0)
        }
        FinalRead::Missing => "no object".to_string(),
        FinalRead::Unreadable => "unreadable".to_string(),
    }
}

/// A canary for the checker: the history of the key of the first successful read, with that
/// read's value replaced by bytes nobody wrote, must be rejected; otherwise a pass could come
/// from a checker (or a recording) that accepts everything. `None` when nothing was read.
fn checker_canary_caught(history: &History, options: &CheckOptions) -> Option<bool> {
    let read = history
        .operations
        .iter()
        .find(|operation| matches!(operation.outcome, Outcome::Read { .. }))?;
    let mut operations: Vec<OperationRecord> = history
        .operations
        .iter()
        .filter(|operation| operation.table == read.table && operation.key == read.key)
        .cloned()
        .collect();
    for operation in &mut operations {
        if operation.id == read.id {
            if let Outcome::Read { version, .. } = operation.outcome {
                let value = Bytes::from_static(b"never written by the workload");
                operation.outcome = Outcome::Read { value, version };
            }
        }
    }
    let (verdict, _) = check_key(&operations, options);
    Some(matches!(verdict, Verdict::Violation(_)))
}

/// Every operation, one per line, ordered by invocation.
fn write_history(path: &PathBuf, history: &History) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for operation in &history.operations {
        writeln!(out, "{operation}")?;
    }
    out.flush()
}

/// Ends the process with status 3 if the workload is still running at `limit`: no fault may
/// hang the command.
fn start_watchdog(limit: Duration) {
    let started = Instant::now();
    let spawned = std::thread::Builder::new().name("watchdog".to_string()).spawn(move || {
        std::thread::sleep(limit);
        eprintln!(
            "workload: verdict=INCONCLUSIVE: still running after {:.0?} (the bound of every \
             phase together); giving up",
            started.elapsed()
        );
        std::process::exit(i32::from(EXIT_INCONCLUSIVE));
    });
    if let Err(error) = spawned {
        eprintln!("workload: no watchdog thread ({error}); relying on the per-phase bounds");
    }
}

fn timeouts(arguments: &WorkloadArguments) -> Timeouts {
    let attempt = Duration::from_millis(arguments.attempt_timeout_ms.max(1));
    Timeouts {
        attempt,
        operation: Duration::from_millis(arguments.operation_timeout_ms).max(attempt),
    }
}

/// Runs the workload; the exit status is the verdict (see the module documentation).
/// Runs the workload against the cluster `base` reaches (its coordinator, and the client
/// password and TLS it needs, if any).
pub fn run(arguments: WorkloadArguments, base: ClientConfig) -> ExitCode {
    let coordinator = base.coordinator_address.clone();
    let seed = arguments.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0x5EED)
    });
    let table_name = arguments.table.clone().unwrap_or_else(|| format!("workload-{seed}"));
    println!(
        "workload: seed={seed} coordinator={coordinator} table={table_name} keys={} clients={} \
         seconds={}",
        arguments.keys, arguments.clients, arguments.seconds
    );
    let timeouts = timeouts(&arguments);
    // Saturating: a phase given "forever" makes the watchdog wait forever, not panic or wrap.
    let phases_seconds = arguments
        .startup_seconds
        .saturating_add(arguments.seconds)
        .saturating_add(arguments.settle_seconds);
    start_watchdog(
        Duration::from_secs(phases_seconds)
            .saturating_add(timeouts.operation.saturating_mul(2))
            .saturating_add(CHECK_PATIENCE),
    );
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("workload: {error}");
                return ExitCode::FAILURE;
            }
        };
    let outcome = runtime.block_on(run_phases(&arguments, &base, seed, &table_name));
    // Client tasks are done; do not wait for idle connections to close.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("workload: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run_phases(
    arguments: &WorkloadArguments,
    base: &ClientConfig,
    seed: u64,
    table_name: &str,
) -> Result<u8, String> {
    let started = tokio::time::Instant::now();
    let timeouts = timeouts(arguments);
    let mut admin_config = base.clone();
    admin_config.operation_timeout = Duration::from_secs(10);
    let admin = Client::new(admin_config);
    let startup_deadline = deadline_in(Duration::from_secs(arguments.startup_seconds));
    let up = wait_for_cluster(&admin, arguments.servers, startup_deadline).await?;
    let span = arguments.span.unwrap_or(up as u32).max(1);
    let table = create_table(&admin, table_name, span).await?;
    println!("workload: {up} servers up; table {table_name} (id {table}) over {span} masters");

    // The mixed phase.
    let recorder = Recorder::new();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    for client_id in 0..arguments.clients {
        let client =
            RecordingClient::new(exactly_once_client(base, timeouts), recorder.clone(), client_id);
        let choices =
            Choices::new(seed ^ u64::from(client_id + 1).wrapping_mul(0xA24B_AED4_963E_E407));
        tasks.spawn(run_client(
            client,
            client_id,
            table,
            (arguments.keys, arguments.counters),
            choices,
            Pace { rate: arguments.rate, timed: arguments.availability_out.is_some() },
            stop.clone(),
        ));
    }
    let bank_table = if arguments.bank_accounts > 0 {
        let name = format!("{table_name}-bank");
        let bank_table = create_table(&admin, &name, span).await?;
        bank::open_accounts(&admin, bank_table, arguments.bank_accounts).await?;
        println!(
            "workload: bank table {name} (id {bank_table}): {} accounts of {}",
            arguments.bank_accounts,
            bank::OPENING_BALANCE
        );
        Some(bank_table)
    } else {
        None
    };
    let mut bank_tasks = tokio::task::JoinSet::new();
    if let Some(bank_table) = bank_table {
        for bank_client in 0..arguments.bank_clients {
            bank_tasks.spawn(bank::run_bank_client(
                exactly_once_client(base, timeouts),
                bank_table,
                arguments.bank_accounts,
                seed ^ u64::from(bank_client + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                stop.clone(),
            ));
        }
    }
    let list_table = if arguments.list_append_keys > 0 {
        let name = format!("{table_name}-lists");
        let list_table = create_table(&admin, &name, span).await?;
        println!(
            "workload: list-append table {name} (id {list_table}): {} lists, {} clients",
            arguments.list_append_keys, arguments.list_append_clients
        );
        Some(list_table)
    } else {
        None
    };
    let list_state = Arc::new(list_append::ListAppendState::default());
    let mut list_tasks = tokio::task::JoinSet::new();
    if let Some(list_table) = list_table {
        for list_client in 0..arguments.list_append_clients {
            list_tasks.spawn(list_append::run_list_append_client(
                exactly_once_client(base, timeouts),
                list_table,
                arguments.list_append_keys,
                list_client,
                seed ^ u64::from(list_client + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
                list_state.clone(),
                stop.clone(),
            ));
        }
    }
    let owners = arguments.availability_out.as_ref().map(|_| {
        tokio::spawn(availability::Owners::sample_until(admin.clone(), table, stop.clone()))
    });
    let mixed_started = tokio::time::Instant::now();
    let mixed_end = deadline_in(Duration::from_secs(arguments.seconds));
    while tokio::time::Instant::now() < mixed_end {
        let next = (tokio::time::Instant::now() + PROGRESS_INTERVAL).min(mixed_end);
        tokio::time::sleep_until(next).await;
        let history = recorder.history();
        let unknown = history.operations.iter().filter(|op| op.outcome.is_unknown()).count();
        eprintln!(
            "workload: t={:.0}s operations={} unknown={unknown}",
            mixed_started.elapsed().as_secs_f64(),
            history.len()
        );
    }
    stop.store(true, Ordering::Relaxed);
    let mut unknown_by_status: BTreeMap<String, u64> = BTreeMap::new();
    let mut timed = Vec::new();
    let mut timed_left_out = 0;
    // Every client finishes its operation in flight (bounded by the operation timeout) or its
    // backoff; the join is bounded all the same.
    let joined = tokio::time::timeout(2 * timeouts.operation + FAULT_BACKOFF_MAX, async {
        while let Some(joined) = tasks.join_next().await {
            let tally = joined.map_err(|error| format!("a client task failed: {error}"))?;
            for (status, count) in tally.unknown {
                *unknown_by_status.entry(status).or_default() += count;
            }
            timed.extend(tally.timed);
            timed_left_out += tally.timed_left_out;
        }
        Ok::<(), String>(())
    })
    .await;
    match joined {
        Ok(result) => result?,
        Err(_) => return Err("client tasks did not stop after the mixed phase".to_string()),
    }
    // A bank client's transaction in flight is bounded like any operation: its commit's
    // rounds each by the operation timeout.
    let mut bank = bank::BankTally::default();
    let bank_joined = tokio::time::timeout(4 * timeouts.operation + FAULT_BACKOFF_MAX, async {
        while let Some(joined) = bank_tasks.join_next().await {
            let tally = joined.map_err(|error| format!("a bank client failed: {error}"))?;
            bank.committed += tally.committed;
            bank.unknown += tally.unknown;
            bank.audits += tally.audits;
            bank.wrong_audits.extend(tally.wrong_audits);
        }
        Ok::<(), String>(())
    })
    .await;
    match bank_joined {
        Ok(result) => result?,
        Err(_) => return Err("bank clients did not stop after the mixed phase".to_string()),
    }
    // Like a bank client's, a list-append transaction in flight is bounded by its rounds.
    let list_joined = tokio::time::timeout(4 * timeouts.operation + FAULT_BACKOFF_MAX, async {
        while let Some(joined) = list_tasks.join_next().await {
            joined.map_err(|error| format!("a list-append client failed: {error}"))?;
        }
        Ok::<(), String>(())
    })
    .await;
    match list_joined {
        Ok(result) => result?,
        Err(_) => return Err("list-append clients did not stop after the mixed phase".to_string()),
    }
    let mixed_seconds = mixed_started.elapsed().as_secs_f64();
    if let (Some(path), Some(owners)) = (&arguments.availability_out, owners) {
        // The sampler stops within one interval (or one tablet-map call) of `stop`.
        let owners = owners.await.map_err(|error| format!("the owner sampler failed: {error}"))?;
        let name = |index: u32| key_name(index);
        match availability::write(path, table, &name, timed, timed_left_out, &owners) {
            Ok(()) => println!("workload: availability written to {}", path.display()),
            Err(error) => return Err(format!("writing {}: {error}", path.display())),
        }
    }

    // The last word on every key.
    let reader = RecordingClient::new(
        exactly_once_client(base, timeouts),
        recorder.clone(),
        arguments.clients,
    );
    let settle_deadline = deadline_in(Duration::from_secs(arguments.settle_seconds));
    let keys: Vec<Vec<u8>> = (0..arguments.keys).map(key_name).collect();
    let final_reads = read_back(&reader, table, &keys, settle_deadline).await;
    let counter_keys: Vec<Vec<u8>> =
        (0..arguments.counters as usize).map(|index| counter_key(index).to_vec()).collect();
    let counter_finals = read_back(&reader, table, &counter_keys, settle_deadline).await;
    let unreadable = final_reads.iter().filter(|read| **read == FinalRead::Unreadable).count();
    let bank_total = match bank_table {
        Some(bank_table) => {
            let accounts = arguments.bank_accounts;
            Some(bank::final_total(&admin, bank_table, accounts, settle_deadline).await)
        }
        None => None,
    };
    let bank_expected = bank::OPENING_BALANCE * i64::from(arguments.bank_accounts);
    let bank_violation = !bank.wrong_audits.is_empty()
        || matches!(&bank_total, Some(Ok(total)) if *total != bank_expected);
    let bank_inconclusive = matches!(&bank_total, Some(Err(_)))
        || (bank_table.is_some() && (bank.committed == 0 || bank.audits == 0));
    // The list-append history, closed by a read-only transaction of every list.
    let lists = match list_table {
        Some(list_table) => {
            let final_read = list_append::final_read(
                &admin,
                list_table,
                arguments.list_append_keys,
                arguments.list_append_clients,
                &list_state,
                settle_deadline,
            )
            .await;
            let findings = tokio::task::block_in_place(|| list_append::check(&list_state));
            Some((final_read, findings))
        }
        None => None,
    };
    let lists_violation = matches!(&lists, Some((_, findings)) if findings.anomalies() > 0);
    let lists_inconclusive = matches!(
        &lists,
        Some((final_read, findings))
            if final_read.is_err() || findings.report.is_err() || findings.committed_appends == 0
    );
    if let Some((final_read, findings)) = &lists {
        if !lists_violation && !lists_inconclusive {
            println!(
                "workload: list_append ok committed={} aborted={} unknown={} \
                 committed_appends={} reads_checked={} anomalies=0",
                findings.committed,
                findings.aborted,
                findings.unknown,
                findings.committed_appends,
                findings.reads_checked(),
            );
        } else {
            for violation in &findings.violations {
                println!("LIST-APPEND VIOLATION: {violation}");
            }
            match &findings.report {
                Ok(report) if !report.is_valid() => {
                    println!("LIST-APPEND VIOLATION: not strictly serializable: {report}")
                }
                Ok(_) => {}
                Err(error) => println!("LIST-APPEND INCONCLUSIVE: malformed history: {error}"),
            }
            if let Err(reason) = final_read {
                println!("LIST-APPEND UNAVAILABLE: {reason}");
            }
            if findings.committed_appends == 0 {
                println!(
                    "LIST-APPEND INCONCLUSIVE: no transaction committed an append ({} aborted, \
                     {} unknown)",
                    findings.aborted, findings.unknown
                );
            }
            println!(
                "workload: list_append {} committed={} aborted={} unknown={} \
                 committed_appends={} reads_checked={} anomalies={}",
                if lists_violation { "VIOLATION" } else { "INCONCLUSIVE" },
                findings.committed,
                findings.aborted,
                findings.unknown,
                findings.committed_appends,
                findings.reads_checked(),
                findings.anomalies(),
            );
        }
    }

    // Checks.
    let history = recorder.history();
    let check_started = Instant::now();
    let counters = check_counters(&history, table, &counter_finals);
    let registers = History {
        operations: (history.operations.iter())
            .filter(|operation| !counter_keys.iter().any(|key| operation.key[..] == key[..]))
            .cloned()
            .collect(),
    };
    let options =
        CheckOptions { search_steps_max: arguments.check_steps, ..CheckOptions::default() };
    let report = tokio::task::block_in_place(|| check(&registers, &options));
    let lost = lost_writes(&history, &final_reads);
    let canary = tokio::task::block_in_place(|| checker_canary_caught(&registers, &options));
    let count = |predicate: &dyn Fn(&OperationRecord) -> bool| {
        history.operations.iter().filter(|operation| predicate(operation)).count()
    };
    let acknowledged_writes = count(&|op| op.outcome.created_version().is_some());
    let known = count(&|op| !op.outcome.is_unknown());
    let refused = count(&|op| matches!(op.outcome, Outcome::Refused { .. }));
    let unknown = count(&|op| op.outcome.is_unknown());
    let unknown_mutations = count(&|op| op.outcome.is_unknown() && op.operation.is_mutation());
    let reads = count(&|op| matches!(op.operation, Operation::Read { .. }));
    let steps: u64 = report.keys.iter().map(|key| key.steps).sum();
    let undecided = report.undecided().count();
    let violating = report.violations().count();
    let verdict = if violating > 0
        || !lost.is_empty()
        || !counters.violations.is_empty()
        || bank_violation
        || lists_violation
    {
        "VIOLATION"
    } else if lists_inconclusive
        || unreadable > 0
        || counters.unreadable > 0
        || undecided > 0
        || canary != Some(true)
        || bank_inconclusive
    {
        "INCONCLUSIVE"
    } else {
        "linearizable"
    };
    if verdict != "linearizable" {
        print!("{report}");
        for (write, final_read) in &lost {
            println!(
                "LOST ACKNOWLEDGED WRITE: key \"{}\" was acknowledged at version {}, the final \
                 read found {}:\n  {write}",
                write.key.escape_ascii(),
                write.outcome.created_version().map_or(0, |version| version.0),
                describe_final(final_read)
            );
        }
        for violation in &counters.violations {
            println!("EXACTLY-ONCE VIOLATION: {violation}");
        }
        for seen in &bank.wrong_audits {
            println!(
                "BANK VIOLATION: a committed read-only transaction summed every account to \
                 {seen}, not {bank_expected}"
            );
        }
        match &bank_total {
            Some(Ok(total)) if *total != bank_expected => println!(
                "BANK VIOLATION: the accounts sum to {total} after the run, not {bank_expected}"
            ),
            Some(Err(reason)) => println!("BANK UNAVAILABLE: {reason}"),
            _ => {}
        }
        if bank_table.is_some() && (bank.committed == 0 || bank.audits == 0) {
            println!(
                "BANK INCONCLUSIVE: {} transfers and {} audits committed",
                bank.committed, bank.audits
            );
        }
        if counters.unreadable > 0 {
            println!(
                "UNAVAILABLE: {} of {} counters had no known outcome within --settle-seconds {}",
                counters.unreadable, arguments.counters, arguments.settle_seconds
            );
        }
        if unreadable > 0 {
            println!(
                "UNAVAILABLE: {unreadable} of {} keys had no known outcome within \
                 --settle-seconds {} after the mixed phase",
                arguments.keys, arguments.settle_seconds
            );
        }
        match canary {
            Some(true) => {}
            Some(false) => println!(
                "CHECKER CANARY: a read changed to a value nobody wrote was not rejected; the \
                 verdict cannot be trusted"
            ),
            None => println!("CHECKER CANARY: no successful read to check the checker with"),
        }
        if let Some(path) = &arguments.history_out {
            match write_history(path, &history) {
                Ok(()) => println!("workload: whole history written to {}", path.display()),
                Err(error) => eprintln!("workload: writing {}: {error}", path.display()),
            }
        }
    }
    println!(
        "workload: verdict={verdict} seed={seed} operations={} reads={reads} known={known} \
         acknowledged_writes={acknowledged_writes} refused={refused} unknown={unknown} \
         unknown_mutations={unknown_mutations} unknown_by_status={unknown_by_status:?} keys={} \
         final_reads={}/{} lost_writes={} violating_keys={violating} undecided_keys={undecided} \
         counters={} counted_increments={} counter_violations={} \
         bank_transfers={} bank_unknown={} bank_audits={} bank_total={} \
         search_steps={steps} mixed_seconds={mixed_seconds:.1} check_seconds={:.1} \
         total_seconds={:.1}",
        history.len(),
        report.keys.len(),
        final_reads.len() - unreadable,
        final_reads.len(),
        lost.len(),
        arguments.counters,
        counters.counted_increments,
        counters.violations.len(),
        bank.committed,
        bank.unknown,
        bank.audits,
        match &bank_total {
            None => "none".to_string(),
            Some(Ok(total)) => format!("{total}/{bank_expected}"),
            Some(Err(_)) => "unreadable".to_string(),
        },
        check_started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    Ok(match verdict {
        "VIOLATION" => EXIT_VIOLATION,
        "INCONCLUSIVE" => EXIT_INCONCLUSIVE,
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u64, operation: Operation, outcome: Outcome) -> OperationRecord {
        OperationRecord {
            id,
            client: 0,
            table: TableId(1),
            key: Bytes::from(key_name(0)),
            operation,
            invoked: 2 * id,
            completed: 2 * id + 1,
            outcome,
        }
    }

    fn write(id: u64, value: &'static [u8], version: u64) -> OperationRecord {
        record(
            id,
            Operation::Write { value: Bytes::from_static(value), rules: RejectRules::NONE },
            Outcome::Written { version: Version(version) },
        )
    }

    fn read(id: u64, value: &'static [u8], version: u64) -> OperationRecord {
        record(
            id,
            Operation::Read { rules: RejectRules::NONE },
            Outcome::Read { value: Bytes::from_static(value), version: Version(version) },
        )
    }

    /// An increment of counter 0 by 1 that returned `value` (None: its outcome is unknown).
    fn counted(id: u64, value: Option<i64>) -> OperationRecord {
        let outcome = match value {
            Some(value) => Outcome::Incremented { value, version: Version(value as u64) },
            None => Outcome::Unknown { status: Status::Timeout },
        };
        let increment = Operation::Increment { delta: 1, rules: RejectRules::NONE };
        OperationRecord { key: counter_key(0), ..record(id, increment, outcome) }
    }

    #[test]
    fn a_counter_above_its_increments_is_a_violation_and_one_within_them_is_not() {
        let history = History { operations: vec![counted(1, Some(1)), counted(2, None)] };
        let at = |value: i64| {
            let bytes = Bytes::copy_from_slice(&value.to_le_bytes());
            [FinalRead::Present(bytes, Version(9))]
        };
        for value in [1, 2] {
            let findings = check_counters(&history, TableId(1), &at(value));
            assert!(findings.violations.is_empty(), "{value}: {findings:?}");
            assert_eq!(findings.counted_increments, 1);
        }
        assert_eq!(
            check_counters(&history, TableId(1), &at(3)).violations.len(),
            1,
            "applied twice"
        );
        assert_eq!(check_counters(&history, TableId(1), &at(0)).violations.len(), 1, "one lost");
        let missing = check_counters(&history, TableId(1), &[FinalRead::Missing]);
        assert_eq!(missing.violations.len(), 1, "an acknowledged increment lost with the key");
        let unreadable = check_counters(&history, TableId(1), &[FinalRead::Unreadable]);
        assert_eq!((unreadable.unreadable, unreadable.violations.len()), (1, 0));
    }

    #[test]
    fn the_final_read_must_hold_the_newest_acknowledged_write() {
        let history = History { operations: vec![write(1, b"old", 3), write(2, b"new", 7)] };
        let present = |value: &'static [u8], version: u64| {
            FinalRead::Present(Bytes::from_static(value), Version(version))
        };
        assert!(lost_writes(&history, &[present(b"new", 7)]).is_empty());
        assert!(lost_writes(&history, &[present(b"later", 9)]).is_empty(), "a later write");
        assert!(lost_writes(&history, &[FinalRead::Unreadable]).is_empty(), "reported apart");
        for lost in [present(b"old", 3), present(b"other", 7), FinalRead::Missing] {
            let found = lost_writes(&history, std::slice::from_ref(&lost));
            assert_eq!(found.len(), 1, "{lost:?}");
            assert_eq!(found[0].0.id, 2);
        }
    }

    #[test]
    fn an_increment_leaves_its_integer_as_the_value() {
        let increment = record(
            1,
            Operation::Increment { delta: 5, rules: RejectRules::NONE },
            Outcome::Incremented { value: 5, version: Version(2) },
        );
        assert_eq!(created_value(&increment), Some(Bytes::copy_from_slice(&5i64.to_le_bytes())));
        assert_eq!(created_value(&read(2, b"x", 2)), None);
    }

    #[test]
    fn the_canary_is_caught_and_needs_a_read() {
        let options = CheckOptions::default();
        let history = History { operations: vec![write(1, b"a", 1), read(2, b"a", 1)] };
        assert_eq!(checker_canary_caught(&history, &options), Some(true));
        let (verdict, _) = check_key(&history.operations, &options);
        assert_eq!(verdict, Verdict::Linearizable, "the history itself passes");
        let no_reads = History { operations: vec![write(1, b"a", 1)] };
        assert_eq!(checker_canary_caught(&no_reads, &options), None);
    }

    #[test]
    fn choices_depend_only_on_the_seed() {
        let draw = |seed| {
            let mut choices = Choices::new(seed);
            (0..8).map(|_| choices.below(100)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        assert!(draw(7).iter().all(|choice| *choice < 100));
    }
}
