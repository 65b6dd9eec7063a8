//! The simulation run over many seeds, and the proof that a seed decides a run.

use stratus_sim::{run, BankOptions, SimulationOptions};

/// Seeds CI runs (each a whole cluster with faults for about 15 s of simulated time, a quarter
/// of a second of real time); the `many_seeds` test runs as many as `STRATUS_SIM_SEEDS` says.
const CI_SEEDS: u64 = 300;

fn seed_base() -> u64 {
    std::env::var("STRATUS_SIM_SEED_BASE").ok().and_then(|text| text.parse().ok()).unwrap_or(0)
}

/// The options of `seed`, with the tablet operator when `STRATUS_SIM_TABLET_MOVES=1` and the
/// bank workload when `STRATUS_SIM_BANK=1` (for the tests run by hand).
fn options_from_environment(seed: u64) -> SimulationOptions {
    let flag = |name: &str| std::env::var_os(name).is_some_and(|value| value == "1");
    let bank = flag("STRATUS_SIM_BANK").then(bank_from_environment);
    SimulationOptions {
        tablet_moves: flag("STRATUS_SIM_TABLET_MOVES"),
        bank,
        ..SimulationOptions::for_seed(seed)
    }
}

/// What the seeds of one test did, summed: a run that passes because nothing happened proves
/// nothing, so the test checks that the faults it claims were injected did happen.
#[derive(Debug, Default)]
struct Exercised {
    seeds: u64,
    seeds_with_faults: u64,
    server_crashes: u64,
    coordinator_crashes: u64,
    servers_recovered: u64,
    seeds_with_recoveries: u64,
    disk_faults_fired: u64,
    operations: u64,
    known_outcomes: u64,
    combined_cleanings: u64,
}

impl Exercised {
    fn add(&mut self, report: &stratus_sim::SimulationReport) {
        use stratus_sim::schedule::Fault;
        self.seeds += 1;
        self.seeds_with_faults += u64::from(!report.faults.is_empty());
        for scheduled in &report.faults {
            match scheduled.fault {
                Fault::CrashServer { .. } => self.server_crashes += 1,
                Fault::CrashCoordinator { .. } => self.coordinator_crashes += 1,
                _ => {}
            }
        }
        self.servers_recovered += report.servers_recovered as u64;
        self.seeds_with_recoveries += u64::from(report.servers_recovered > 0);
        self.disk_faults_fired += report.disk_faults.len() as u64;
        self.operations += report.operations as u64;
        self.known_outcomes += report.known_outcomes as u64;
        self.combined_cleanings += report.cleaner_work.1;
    }

    /// The floors hold with a wide margin over CI's 300 seeds (measured when this was written:
    /// faults in all 300, 195 server crashes, 88 coordinator crashes, recoveries in 294 seeds,
    /// 228 disk faults fired, every outcome known, 1 506 combined cleanings); a change that
    /// silently stops a kind of fault fails here.
    fn check(&self) {
        let share = |part: u64, whole: u64| part as f64 / whole.max(1) as f64;
        assert!(share(self.seeds_with_faults, self.seeds) >= 0.9, "{self:?}");
        assert!(self.server_crashes >= self.seeds / 4, "{self:?}");
        assert!(self.coordinator_crashes > 0, "{self:?}");
        assert!(share(self.seeds_with_recoveries, self.seeds) >= 0.5, "{self:?}");
        assert!(self.disk_faults_fired > 0, "{self:?}");
        assert!(share(self.known_outcomes, self.operations) >= 0.5, "{self:?}");
        assert!(self.combined_cleanings > 0, "{self:?}");
    }
}

fn run_seeds(count: u64) {
    let mut failures = Vec::new();
    let mut exercised = Exercised::default();
    for seed in seed_base()..seed_base() + count {
        match run(seed, &options_from_environment(seed)) {
            Ok(report) => {
                eprint!("{report}");
                exercised.add(&report);
            }
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure.report.seed);
            }
        }
    }
    eprintln!("exercised: {exercised:?}");
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
    if count >= 100 {
        exercised.check();
    }
}

#[test]
fn seeds_with_faults_keep_every_invariant() {
    run_seeds(CI_SEEDS);
}

/// Seeds outside the CI range that once failed: 1764290021 (with holder-check pings as short
/// as the replication timeout, a master stalled for 747 ms found every backup silent, dropped
/// every copy of its log, freed the old copies as soon as their backups answered, and crashed
/// before the new copies were complete: its recovery found a segment on no backup).
#[test]
fn seeds_that_once_failed_pass() {
    let mut failures = Vec::new();
    for seed in [1_764_290_021] {
        if let Err(failure) = run(seed, &SimulationOptions::for_seed(seed)) {
            eprintln!("{failure}");
            failures.push(seed);
        }
    }
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}

#[test]
fn a_seed_decides_the_whole_run() {
    for (seed, tablet_moves) in [(7, false), (1_000_003, false), (2, false), (5, true)] {
        let options = SimulationOptions { tablet_moves, ..SimulationOptions::for_seed(seed) };
        let first = run(seed, &options).map_err(|failure| failure.to_string());
        let second = run(seed, &options).map_err(|failure| failure.to_string());
        match (first, second) {
            (Ok(first), Ok(second)) => {
                let divergence =
                    first.history.iter().zip(&second.history).position(|(a, b)| a != b);
                if let Some(index) = divergence {
                    panic!(
                        "seed {seed} diverged at operation {index}:\n  {}\n  {}",
                        first.history[index], second.history[index]
                    );
                }
                assert_eq!(first.fingerprint, second.fingerprint, "seed {seed} diverged");
                assert_eq!(first.steps, second.steps);
                assert!(first.operations > 0 && first.serving_samples > 0);
            }
            (first, second) => panic!("seed {seed}: {first:?} / {second:?}"),
        }
    }
}

/// Seeds run with an operator splitting and migrating tablets while the clients run and the
/// faults happen.
const TABLET_MOVE_SEEDS: u64 = 40;

#[test]
fn seeds_with_tablet_moves_keep_every_invariant() {
    let mut failures = Vec::new();
    let mut splits = 0;
    let mut migrations = 0;
    for seed in seed_base()..seed_base() + TABLET_MOVE_SEEDS {
        let options = SimulationOptions { tablet_moves: true, ..SimulationOptions::for_seed(seed) };
        match run(seed, &options) {
            Ok(report) => {
                eprint!("{report}");
                splits += report.tablet_splits;
                migrations += report.tablet_migrations;
            }
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure.report.seed);
            }
        }
    }
    assert!(failures.is_empty(), "failing seeds with tablet moves: {failures:?}");
    // Most requests split or move a tablet (some meet a fault): the runs really changed the map.
    assert!(splits > TABLET_MOVE_SEEDS as u32 * 2, "only {splits} splits happened");
    assert!(migrations > TABLET_MOVE_SEEDS as u32 * 3, "only {migrations} migrations happened");
}

/// Seeds with the tablet operator that once failed, kept as regressions: 885 (a transfer's
/// answer lost to a partition left the tablet unserved), 2628 (a failed backup made the master
/// drop every closed copy of its compacted segments, and its crash then found one on no
/// backup), 67 (a TAKE for a crashed master taken by the process restarted at its address).
#[test]
fn seeds_that_once_failed_with_tablet_moves_pass() {
    let mut failures = Vec::new();
    for seed in [885, 2628, 67] {
        let options = SimulationOptions { tablet_moves: true, ..SimulationOptions::for_seed(seed) };
        if let Err(failure) = run(seed, &options) {
            eprintln!("{failure}");
            failures.push(seed);
        }
    }
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}

/// `STRATUS_SIM_SEEDS=2000 cargo test --release -p stratus-sim many_seeds -- --ignored`
/// (`STRATUS_SIM_TABLET_MOVES=1`: with the tablet operator)
#[test]
#[ignore = "long: run by hand with STRATUS_SIM_SEEDS"]
fn many_seeds() {
    let count = std::env::var("STRATUS_SIM_SEEDS").ok().and_then(|text| text.parse().ok());
    run_seeds(count.unwrap_or(1_000));
}

/// `STRATUS_SIM_SEED=N cargo test -p stratus-sim --test seeds one_seed -- --ignored --nocapture`
///
/// With `STRATUS_SIM_TRACE=FILE`, every simulated message (turmoil's trace) and the services'
/// debug logs go to FILE, without timestamps: two traces of one seed are identical, and `diff`
/// shows where a nondeterministic run first diverges. `STRATUS_SIM_VERBOSE=1` prints the whole
/// history of a key that violates linearizability. `STRATUS_SIM_TABLET_MOVES=1` runs the seed
/// with the operator that splits and migrates tablets (as
/// `seeds_with_tablet_moves_keep_every_invariant` does).
#[test]
#[ignore = "reproduces one seed: run by hand with STRATUS_SIM_SEED"]
fn one_seed() {
    let seed = std::env::var("STRATUS_SIM_SEED").ok().and_then(|text| text.parse().ok());
    let seed = seed.expect("set STRATUS_SIM_SEED");
    let options = options_from_environment(seed);
    let simulate = || run(seed, &options);
    let outcome = match std::env::var_os("STRATUS_SIM_TRACE") {
        Some(path) => {
            let file = std::fs::File::create(&path).expect("create the trace file");
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter("turmoil=trace,stratus=debug")
                .without_time()
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .finish();
            tracing::subscriber::with_default(subscriber, simulate)
        }
        None => simulate(),
    };
    match outcome {
        Ok(report) => eprint!("{report}"),
        Err(failure) => panic!("{failure}"),
    }
}

/// Seeds with a zombie client: one increment under a client lease, silence for longer than a
/// lease term (after the faults), then a new increment and the old one again under the expired
/// lease: both are refused, and the counter holds the one increment (docs/design/exactly-once.md).
const ZOMBIE_SEEDS: u64 = 3;

#[test]
fn a_zombie_client_applies_nothing_under_an_expired_lease() {
    let mut failures = Vec::new();
    for seed in seed_base()..seed_base() + ZOMBIE_SEEDS {
        let options =
            SimulationOptions { zombie_client: true, ..SimulationOptions::for_seed(seed) };
        match run(seed, &options) {
            Ok(report) => eprint!("{report}"),
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure.report.seed);
            }
        }
    }
    assert!(failures.is_empty(), "failing seeds with a zombie client: {failures:?}");
}

/// Seeds of the bank workload run in CI: each a whole cluster with faults, the main workload,
/// and 16 accounts moved between by 3 transfer clients and summed by an auditor
/// (docs/design/simulation.md, "Bank"); about a second of real time each in release mode.
const BANK_SEEDS: u64 = 6;

/// The options of a bank seed: the seed's shape, the bank, and the tablet operator (moving
/// the bank's tablets too) on odd seeds.
fn bank_options(seed: u64) -> SimulationOptions {
    SimulationOptions {
        tablet_moves: seed % 2 == 1,
        bank: Some(bank_from_environment()),
        ..SimulationOptions::for_seed(seed)
    }
}

/// The default bank, with the bank clients' operation timeout from
/// `STRATUS_SIM_BANK_TIMEOUT_MS` if set (a short one makes commits end with unknown outcomes;
/// see docs/design/simulation.md on what that shows before the transaction recovery manager).
fn bank_from_environment() -> BankOptions {
    let mut bank = BankOptions::default();
    let millis =
        std::env::var("STRATUS_SIM_BANK_TIMEOUT_MS").ok().and_then(|text| text.parse().ok());
    if let Some(millis) = millis {
        bank.operation_timeout = std::time::Duration::from_millis(millis);
    }
    bank
}

fn run_bank_seeds(count: u64) {
    let mut failures = Vec::new();
    let (mut transfers, mut audits) = (0, 0);
    for seed in seed_base()..seed_base() + count {
        match run(seed, &bank_options(seed)) {
            Ok(report) => {
                eprint!("{report}");
                let bank = report.bank.expect("a bank run reports the bank");
                transfers += bank.transfers.0;
                audits += bank.audits.0;
            }
            Err(failure) => {
                eprintln!("{failure}");
                failures.push(failure.report.seed);
            }
        }
    }
    assert!(failures.is_empty(), "failing bank seeds: {failures:?}");
    // Each seed checked that some transfer committed; the audits must have run too.
    assert!(transfers > 0 && audits > 0, "{transfers} transfers and {audits} audits committed");
}

/// Transactions under faults: every committed audit sums to the opening total and sees a
/// state the committed transfers explain; the final balances (plain reads) are the opening
/// ones moved by every committed transfer and some of those of unknown outcome; no lock is
/// left behind; some transfer committed.
#[test]
fn bank_seeds_keep_the_total() {
    run_bank_seeds(BANK_SEEDS);
}

/// `STRATUS_SIM_SEED_BASE=0 STRATUS_SIM_SEEDS=200 cargo test --release -p stratus-sim --test
/// seeds many_bank_seeds -- --ignored` (tablet moves on odd seeds, as in
/// `bank_seeds_keep_the_total`; one seed by hand: `STRATUS_SIM_BANK=1` with `one_seed`).
#[test]
#[ignore = "long: run by hand with STRATUS_SIM_SEEDS"]
fn many_bank_seeds() {
    let count = std::env::var("STRATUS_SIM_SEEDS").ok().and_then(|text| text.parse().ok());
    run_bank_seeds(count.unwrap_or(200));
}

#[test]
fn a_bank_seed_decides_the_whole_run() {
    for seed in [3, 4] {
        let options = bank_options(seed);
        let first = run(seed, &options).map_err(|failure| failure.to_string());
        let second = run(seed, &options).map_err(|failure| failure.to_string());
        match (first, second) {
            (Ok(first), Ok(second)) => {
                let divergence =
                    first.history.iter().zip(&second.history).position(|(a, b)| a != b);
                if let Some(index) = divergence {
                    panic!(
                        "bank seed {seed} diverged at line {index}:\n  {}\n  {}",
                        first.history[index], second.history[index]
                    );
                }
                assert_eq!(first.history.len(), second.history.len());
                assert_eq!(first.fingerprint, second.fingerprint, "bank seed {seed} diverged");
                assert_eq!(first.steps, second.steps);
            }
            (first, second) => panic!("bank seed {seed}: {first:?} / {second:?}"),
        }
    }
}
