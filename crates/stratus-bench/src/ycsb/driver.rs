//! The driver: the load phase and the run phase, each on `--threads` threads with a
//! connection of their own.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::bindings::Database;
use super::generators::{
    key_name, random_field, AcknowledgedCounter, Operation, Random, ScrambledZipfian, SkewedLatest,
    Workload, FIELD_COUNT, SCAN_LENGTH_MAX,
};
use super::measure::{Measurements, Outcome, PhaseResult};
use super::systems::Running;
use super::YcsbArguments;
use crate::cpu::PhaseCpu;

/// Seeds of the driver threads (fixed: runs are repeatable in their choices).
const SEED: u64 = 0x5943_5342;

/// The load phase: `records` inserts of key numbers 0.. by `threads` threads.
pub fn load(running: &Running, arguments: &YcsbArguments) -> Result<PhaseResult, String> {
    let next = Arc::new(AtomicU64::new(0));
    let cpu = PhaseCpu::start(running.process_ids()?)?;
    let started = Instant::now();
    let measurements = in_threads(arguments.threads, |thread| {
        let mut database = running.connect()?;
        let mut random = Random::new(SEED ^ (u64::from(thread) << 32) ^ 0x10ad);
        let mut measurements = Measurements::default();
        loop {
            let keynum = next.fetch_add(1, Ordering::Relaxed);
            if keynum >= arguments.records {
                return Ok(measurements);
            }
            let fields: Vec<Vec<u8>> =
                (0..FIELD_COUNT).map(|_| random_field(&mut random)).collect();
            let key = key_name(keynum);
            let begin = Instant::now();
            let outcome = database.insert(&key, &fields)?;
            let elapsed = begin.elapsed();
            measurements.record(Operation::Insert, elapsed, elapsed, outcome);
        }
    })?;
    let runtime = started.elapsed();
    let cpu = cpu.finish()?;
    Ok(PhaseResult { runtime, operations: arguments.records, measurements, cpu })
}

/// What every thread of the run phase shares.
struct RunPlan<'a> {
    arguments: &'a YcsbArguments,
    workload: Workload,
    /// Seeds the threads' random streams (each thread mixes in its number).
    seed: u64,
    /// Key numbers of inserts, and the highest below which every insert was acknowledged.
    counter: AcknowledgedCounter,
    /// CoreWorkload: the zipfian key space includes the inserts expected during the run
    /// (operationcount × insertproportion × 2); keys not inserted yet are drawn again.
    expected_new_keys: i64,
    /// With a target: each thread's interval between two intended starts.
    tick: Option<Duration>,
}

/// The run phase: `operations` transactions of `workload` by `threads` threads.
pub fn run_phase(
    running: &Running,
    arguments: &YcsbArguments,
    workload: Workload,
) -> Result<PhaseResult, String> {
    run_phase_seeded(running, arguments, workload, SEED)
}

/// [`run_phase`] with the threads' random streams seeded from `seed`: phases run one after
/// another on the same records with different seeds draw different sequences of keys from
/// the same distribution (with the same seed, a warm-up would rehearse the measured phase's
/// exact keys).
pub fn run_phase_seeded(
    running: &Running,
    arguments: &YcsbArguments,
    workload: Workload,
    seed: u64,
) -> Result<PhaseResult, String> {
    let threads = f64::from(arguments.threads);
    let plan = RunPlan {
        arguments,
        workload,
        seed,
        counter: AcknowledgedCounter::new(arguments.records),
        expected_new_keys: (arguments.operations as f64 * workload.insert * 2.0) as i64,
        tick: arguments.target.map(|target| Duration::from_secs_f64(threads / target)),
    };
    let cpu = PhaseCpu::start(running.process_ids()?)?;
    let started = Instant::now();
    let measurements = in_threads(arguments.threads, |thread| run_thread(running, &plan, thread))?;
    let runtime = started.elapsed();
    let cpu = cpu.finish()?;
    Ok(PhaseResult { runtime, operations: arguments.operations, measurements, cpu })
}

/// One operation of the run phase, chosen before it is timed.
enum Request {
    Read { key: String },
    Update { key: String, field: usize, value: Vec<u8> },
    Insert { keynum: u64, key: String, fields: Vec<Vec<u8>> },
    Scan { key: String, length: u64 },
}

/// One driver thread of the run phase: its connection, its random streams, its share of the
/// operations.
struct RunThread<'a> {
    plan: &'a RunPlan<'a>,
    database: Box<dyn Database>,
    random: Random,
    zipfian: ScrambledZipfian,
    latest: SkewedLatest,
    measurements: Measurements,
}

fn run_thread(running: &Running, plan: &RunPlan<'_>, thread: u32) -> Result<Measurements, String> {
    let arguments = plan.arguments;
    let (thread, threads) = (u64::from(thread), u64::from(arguments.threads));
    let mut state = RunThread {
        plan,
        database: running.connect()?,
        random: Random::new(plan.seed ^ (thread << 32)),
        zipfian: ScrambledZipfian::new(0, arguments.records as i64 + plan.expected_new_keys),
        latest: SkewedLatest::new(plan.counter.last_value()),
        measurements: Measurements::default(),
    };
    let count = arguments.operations / threads + u64::from(thread < arguments.operations % threads);
    let thread_start = Instant::now();
    for index in 0..count {
        // With a target, each thread runs on its own schedule (YCSB's per-thread throttle);
        // latency from the intended start corrects coordinated omission.
        let intended = match plan.tick {
            Some(tick) => {
                let intended = thread_start + tick.mul_f64(index as f64);
                let now = Instant::now();
                if intended > now {
                    std::thread::sleep(intended - now);
                }
                intended
            }
            None => Instant::now(),
        };
        let operation = plan.workload.choose(&mut state.random);
        state.perform(operation, intended)?;
    }
    Ok(state.measurements)
}

impl RunThread<'_> {
    /// The next key number to read or update: one acknowledged as inserted.
    fn next_key(&mut self) -> u64 {
        loop {
            let last = self.plan.counter.last_value();
            let keynum = if self.plan.workload.latest {
                self.latest.next_value(last, &mut self.random)
            } else {
                self.zipfian.next_value(&mut self.random) as u64
            };
            if keynum <= last {
                return keynum;
            }
        }
    }

    /// Performs one operation whose intended start was `intended`, and records it. Its key
    /// and values are chosen before its clock starts.
    fn perform(&mut self, operation: Operation, intended: Instant) -> Result<(), String> {
        let request = match operation {
            Operation::Read => Request::Read { key: key_name(self.next_key()) },
            Operation::Update => Request::Update {
                key: key_name(self.next_key()),
                field: self.random.uniform(0, FIELD_COUNT as u64 - 1) as usize,
                value: random_field(&mut self.random),
            },
            Operation::Insert => {
                let keynum = self.plan.counter.next_value();
                let fields = (0..FIELD_COUNT).map(|_| random_field(&mut self.random)).collect();
                Request::Insert { keynum, key: key_name(keynum), fields }
            }
            Operation::Scan => Request::Scan {
                key: key_name(self.next_key()),
                length: self.random.uniform(1, SCAN_LENGTH_MAX),
            },
            Operation::ReadModifyWrite => return self.read_modify_write(intended),
        };
        let begin = Instant::now();
        let outcome = match &request {
            Request::Read { key } => self.database.read(key)?,
            Request::Update { key, field, value } => self.database.update(key, *field, value)?,
            Request::Insert { key, fields, .. } => self.database.insert(key, fields)?,
            Request::Scan { key, length } => self.database.scan(key, *length)?,
        };
        let end = Instant::now();
        if let Request::Insert { keynum, .. } = request {
            self.plan.counter.acknowledge(keynum);
        }
        self.measurements.record(operation, end - begin, end - intended, outcome);
        Ok(())
    }

    /// F's read-modify-write: reported as itself, and its read and update also under READ and
    /// UPDATE (as YCSB does).
    fn read_modify_write(&mut self, intended: Instant) -> Result<(), String> {
        let key = key_name(self.next_key());
        let field = self.random.uniform(0, FIELD_COUNT as u64 - 1) as usize;
        let value = random_field(&mut self.random);
        let begin = Instant::now();
        let read = self.database.read(&key)?;
        let read_end = Instant::now();
        self.measurements.record(Operation::Read, read_end - begin, read_end - intended, read);
        let update = self.database.update(&key, field, &value)?;
        let end = Instant::now();
        self.measurements.record(Operation::Update, end - read_end, end - intended, update);
        let outcome = if read == Outcome::Ok && update == Outcome::Ok {
            Outcome::Ok
        } else {
            Outcome::NotFound
        };
        self.measurements.record(Operation::ReadModifyWrite, end - begin, end - intended, outcome);
        Ok(())
    }
}

/// Runs `body(thread)` on `threads` scoped threads and merges their measurements.
fn in_threads(
    threads: u32,
    body: impl Fn(u32) -> Result<Measurements, String> + Sync,
) -> Result<Measurements, String> {
    let body = &body;
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            (0..threads.max(1)).map(|thread| scope.spawn(move || body(thread))).collect();
        let mut merged = Measurements::default();
        let mut first_error = None;
        for handle in handles {
            match handle.join() {
                Ok(Ok(measurements)) => merged.merge(measurements),
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(_) => {
                    first_error.get_or_insert("a driver thread panicked".into());
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(merged),
        }
    })
}
