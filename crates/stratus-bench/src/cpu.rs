//! What a measured phase cost in CPU: the user and system time of every process of the system
//! under test, and of the driver, read from `/proc/<pid>/stat` before and after the phase.
//!
//! On a small machine throughput and latency hide what an operation costs: client and servers
//! share the cores, and a system that burns more CPU per operation slows its own driver. CPU
//! time per operation, summed over every process of a system, compares systems fairly there.
//!
//! Each process's figure is `utime + stime + cutime + cstime` (all its threads, plus the
//! children it reaped during the phase, such as Redis's AOF-rewrite fork), in clock ticks
//! (`sysconf(_SC_CLK_TCK)`, 100 per second on Linux): a phase should last long enough for its
//! processes to accumulate many ticks. The set of processes is taken when the phase starts; a
//! process that exits during the phase makes the measurement fail rather than quietly lose its
//! share.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::report::Field;

/// Why CPU time could not be read.
#[derive(Debug)]
pub enum CpuError {
    /// The process's stat file could not be read (the process exited, or /proc is missing).
    Unreadable {
        /// The process.
        pid: u32,
        /// What reading it said.
        error: std::io::Error,
    },
    /// The stat file did not have the expected fields.
    Malformed {
        /// The process.
        pid: u32,
    },
}

impl std::fmt::Display for CpuError {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CpuError::Unreadable { pid, error } => write!(
                formatter,
                "reading /proc/{pid}/stat: {error} (did the process exit during the measured \
                 phase?)"
            ),
            CpuError::Malformed { pid } => write!(formatter, "/proc/{pid}/stat is malformed"),
        }
    }
}

impl From<CpuError> for String {
    fn from(error: CpuError) -> String {
        error.to_string()
    }
}

/// The fields of `/proc/<pid>/stat` this module reads, counted from 1 as proc(5) does.
const STAT_FIELD_PARENT: usize = 4;
const STAT_FIELD_USER_TICKS: usize = 14;
/// `utime`, `stime`, `cutime`, `cstime` are fields 14 to 17.
const STAT_CPU_FIELDS: usize = 4;

/// The parent and the CPU ticks (own and reaped children's) in the text of a stat file. The
/// command name (field 2) is in parentheses and may contain spaces and parentheses itself, so
/// fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 3 (the state) is the first after the name.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| fields.get(number - 3).copied();
    let parent = field(STAT_FIELD_PARENT)?.parse().ok()?;
    let mut ticks = 0u64;
    for number in STAT_FIELD_USER_TICKS..STAT_FIELD_USER_TICKS + STAT_CPU_FIELDS {
        // cutime and cstime are signed in the kernel's format; never negative in practice.
        ticks += u64::try_from(field(number)?.parse::<i64>().ok()?).ok()?;
    }
    Some((parent, ticks))
}

fn read_stat(pid: u32) -> Result<(u32, u64), CpuError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|error| CpuError::Unreadable { pid, error })?;
    parse_stat(&stat).ok_or(CpuError::Malformed { pid })
}

/// Clock ticks per second of the times in stat files.
#[allow(unsafe_code)]
fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads its integer argument and returns a number; it touches no
    // memory of ours. std has no wrapper for it, and the tick length is the unit of every
    // figure /proc/<pid>/stat reports.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    // Linux has reported 100 since 2.6 whatever the kernel's HZ; sysconf fails only where
    // there is no /proc to read either.
    u64::try_from(ticks).ok().filter(|&ticks| ticks > 0).unwrap_or(100)
}

/// `root` and every process descended from it, now (found through the parent field of every
/// process's stat file).
pub fn process_tree(root: u32) -> Result<Vec<u32>, CpuError> {
    let entries =
        std::fs::read_dir("/proc").map_err(|error| CpuError::Unreadable { pid: root, error })?;
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        // A process that exits while the table is read is simply not part of the tree.
        if let Ok((parent, _)) = read_stat(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    read_stat(root)?;
    let mut tree = vec![root];
    let mut next = 0;
    while next < tree.len() {
        tree.extend(children.get(&tree[next]).into_iter().flatten().copied());
        next += 1;
    }
    Ok(tree)
}

/// CPU time `pid` used since it started (its own and that of the children it reaped).
pub fn cpu_since_start(pid: u32) -> Result<Duration, CpuError> {
    let (_, ticks) = read_stat(pid)?;
    Ok(ticks_to_duration(ticks))
}

fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64)
}

/// CPU time of a fixed set of processes since the meter started.
#[derive(Debug)]
pub struct CpuMeter {
    measured: Measured,
    nanos_at_start: u64,
}

/// What a [`CpuMeter`] reads.
#[derive(Debug)]
enum Measured {
    /// Other processes, through /proc ([`total_nanos`]): their threads live as long as they
    /// do (servers), so the threads alive at the end carry their time.
    Processes(Vec<u32>),
    /// This process, through `getrusage`, which keeps the time of threads that have exited:
    /// a driver's threads are joined before its phase's CPU is read, and /proc no longer lists
    /// them then.
    ThisProcess,
}

impl Measured {
    fn nanos(&self) -> Result<u64, CpuError> {
        match self {
            Measured::Processes(pids) => total_nanos(pids),
            Measured::ThisProcess => Ok(this_process_nanos()),
        }
    }
}

impl CpuMeter {
    /// Starts measuring `pids` (their CPU time so far is the zero).
    pub fn start(pids: Vec<u32>) -> Result<CpuMeter, CpuError> {
        CpuMeter::measuring(Measured::Processes(pids))
    }

    /// Measures this process (the driver, when the driver runs in the benchmark's process),
    /// its threads that exit before the end included, and the children it reaps.
    pub fn this_process() -> Result<CpuMeter, CpuError> {
        CpuMeter::measuring(Measured::ThisProcess)
    }

    fn measuring(measured: Measured) -> Result<CpuMeter, CpuError> {
        let nanos_at_start = measured.nanos()?;
        Ok(CpuMeter { measured, nanos_at_start })
    }

    /// CPU time the processes used since the start.
    pub fn elapsed(&self) -> Result<Duration, CpuError> {
        Ok(Duration::from_nanos(self.measured.nanos()?.saturating_sub(self.nanos_at_start)))
    }

    /// How many processes are measured.
    pub fn processes(&self) -> usize {
        match &self.measured {
            Measured::Processes(pids) => pids.len(),
            Measured::ThisProcess => 1,
        }
    }
}

/// User and system time of this process (every thread it has run, exited or not) and of the
/// children it has reaped, in nanoseconds (microsecond resolution).
#[allow(unsafe_code)]
fn this_process_nanos() -> u64 {
    let mut total = 0u64;
    for who in [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN] {
        // SAFETY: getrusage writes one `rusage` into the zeroed value it is given, which lives
        // until the call returns, and reads nothing else of ours; RUSAGE_SELF and
        // RUSAGE_CHILDREN are valid for every process, so it does not fail (were it to, the
        // zeroed value adds nothing).
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(who, &mut usage);
            usage
        };
        for time in [usage.ru_utime, usage.ru_stime] {
            let micros = u64::try_from(time.tv_sec).unwrap_or(0) * 1_000_000
                + u64::try_from(time.tv_usec).unwrap_or(0);
            total += micros * 1_000;
        }
    }
    total
}

/// CPU time of `pids` in nanoseconds: each thread's time on a CPU from its schedstat file
/// (nanoseconds, exact), plus the ticks of children they reaped; where schedstat is missing
/// (kernels without scheduler statistics), the ticks of the stat file. Ticks alone (10 ms each,
/// charged to whoever runs at the tick) read 0 for a short phase on a busy machine.
fn total_nanos(pids: &[u32]) -> Result<u64, CpuError> {
    pids.iter().map(|&pid| process_nanos(pid)).sum()
}

fn process_nanos(pid: u32) -> Result<u64, CpuError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|error| CpuError::Unreadable { pid, error })?;
    let (_, all_ticks) = parse_stat(&stat).ok_or(CpuError::Malformed { pid })?;
    let reaped_ticks = parse_reaped_ticks(&stat).ok_or(CpuError::Malformed { pid })?;
    let nanos_per_tick = 1_000_000_000 / clock_ticks_per_second();
    match threads_nanos(pid) {
        Some(threads) => Ok(threads + reaped_ticks * nanos_per_tick),
        None => Ok(all_ticks * nanos_per_tick),
    }
}

/// `cutime` + `cstime` (fields 16 and 17) of a stat file's text.
fn parse_reaped_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| fields.get(number - 3).copied();
    let mut ticks = 0u64;
    for number in STAT_FIELD_USER_TICKS + 2..STAT_FIELD_USER_TICKS + STAT_CPU_FIELDS {
        ticks += u64::try_from(field(number)?.parse::<i64>().ok()?).ok()?;
    }
    Some(ticks)
}

/// The time on a CPU of every thread of `pid`, in nanoseconds (`None` when schedstat files
/// cannot be read). A thread that exits between the listing and its read is skipped.
fn threads_nanos(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut nanos = 0u64;
    let mut read_any = false;
    for task in tasks.flatten() {
        let Ok(text) = std::fs::read_to_string(task.path().join("schedstat")) else { continue };
        nanos += text.split_whitespace().next()?.parse::<u64>().ok()?;
        read_any = true;
    }
    read_any.then_some(nanos)
}

/// The system under test and the driver, measured over one phase.
#[derive(Debug)]
pub struct PhaseCpu {
    system: CpuMeter,
    driver: CpuMeter,
}

impl PhaseCpu {
    /// Starts measuring the system's processes `system` and this process as the driver. A
    /// driver that runs as a child of this process (redis-benchmark) is counted here too once
    /// it is reaped: its time then moves into this process's `cutime` and `cstime`.
    pub fn start(system: Vec<u32>) -> Result<PhaseCpu, CpuError> {
        Ok(PhaseCpu { system: CpuMeter::start(system)?, driver: CpuMeter::this_process()? })
    }

    /// What the phase cost so far.
    pub fn finish(&self) -> Result<CpuCost, CpuError> {
        Ok(CpuCost {
            system: self.system.elapsed()?,
            driver: self.driver.elapsed()?,
            system_processes: self.system.processes(),
        })
    }
}

/// What a phase cost in CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuCost {
    /// CPU time of every process of the system under test.
    pub system: Duration,
    /// CPU time of the driver.
    pub driver: Duration,
    /// Processes of the system under test that were measured.
    pub system_processes: usize,
}

impl CpuCost {
    /// The system's CPU per operation, in microseconds.
    pub fn system_us_per_op(&self, operations: u64) -> f64 {
        per_operation_us(self.system, operations)
    }

    /// The driver's CPU per operation, in microseconds.
    pub fn driver_us_per_op(&self, operations: u64) -> f64 {
        per_operation_us(self.driver, operations)
    }

    /// The JSON fields of a row measured over `operations`: `cpu_us_per_op` (the system under
    /// test), `driver_cpu_us_per_op` and `cpu_processes` (how many processes the system's
    /// figure sums).
    pub fn fields(&self, operations: u64) -> [(&'static str, Field); 3] {
        [
            ("cpu_us_per_op", Field::Number(self.system_us_per_op(operations))),
            ("driver_cpu_us_per_op", Field::Number(self.driver_us_per_op(operations))),
            ("cpu_processes", Field::Number(self.system_processes as f64)),
        ]
    }
}

fn per_operation_us(cpu: Duration, operations: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / operations.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and a parenthesis, as a process may name itself.
        let stat = "4242 (tokio (rt) 1) S 17 4242 17 0 -1 4194560 1 0 0 0 250 30 7 3 20 0 5 \
                    0 100 0 0";
        assert_eq!(parse_stat(stat), Some((17, 250 + 30 + 7 + 3)));
        assert_eq!(parse_stat("4242 (short) S 17"), None);
        assert_eq!(parse_stat("no parenthesis at all"), None);
    }

    #[test]
    fn this_process_is_found_in_its_own_tree_and_its_work_is_counted() {
        let meter = CpuMeter::this_process().unwrap();
        // Spin until the kernel has charged a few ticks (bounded by work, not by time).
        let mut accumulator = 0u64;
        for round in 0..200_u64 {
            for index in 0..1_000_000_u64 {
                accumulator = accumulator.wrapping_mul(31).wrapping_add(index ^ round);
            }
            if meter.elapsed().unwrap() >= Duration::from_millis(30) {
                break;
            }
        }
        std::hint::black_box(accumulator);
        assert!(meter.elapsed().unwrap() > Duration::ZERO);
        let parent = read_stat(std::process::id()).unwrap().0;
        assert!(process_tree(parent).unwrap().contains(&std::process::id()));
    }

    #[test]
    fn the_work_of_a_driver_thread_that_has_exited_is_counted() {
        let meter = CpuMeter::this_process().unwrap();
        std::thread::spawn(|| {
            let mut accumulator = 0u64;
            let started = std::time::Instant::now();
            // About 50 ms of work on a CPU (bounded by wall time on a busy machine).
            while started.elapsed() < Duration::from_millis(50) {
                for index in 0..100_000_u64 {
                    accumulator = accumulator.wrapping_mul(31).wrapping_add(index);
                }
            }
            std::hint::black_box(accumulator);
        })
        .join()
        .unwrap();
        // Other tests' threads may add to it; none takes any away.
        assert!(meter.elapsed().unwrap() >= Duration::from_millis(5), "{:?}", meter.elapsed());
    }

    #[test]
    fn a_child_process_is_part_of_the_tree_of_its_parent() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tree = process_tree(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        let tree = tree.unwrap();
        assert_eq!(tree[0], std::process::id());
        assert!(tree.contains(&child.id()), "{tree:?}");
    }

    #[test]
    fn a_process_gone_before_the_end_is_an_error_not_a_zero() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let meter = CpuMeter::start(vec![child.id()]).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(meter.elapsed(), Err(CpuError::Unreadable { .. })));
    }

    #[test]
    fn per_operation_figures_are_in_microseconds() {
        let cost = CpuCost {
            system: Duration::from_millis(30),
            driver: Duration::from_millis(10),
            system_processes: 4,
        };
        assert_eq!(cost.system_us_per_op(1_000), 30.0);
        assert_eq!(cost.driver_us_per_op(1_000), 10.0);
    }
}
