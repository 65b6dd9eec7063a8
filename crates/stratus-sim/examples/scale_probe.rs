//! How the simulation grows with its cluster: runs one fault-free seed with N storage servers
//! (R = 3, two clients) for each N given, and prints the wall time, simulated time and steps,
//! and the process's peak resident memory after it (VmHWM: peak so far, so run the sizes in
//! increasing order; each size's increase over the previous is what it added).
//!
//!   cargo run -p stratus-sim --example scale_probe -- 8 16 32 64

use std::time::{Duration, Instant};

use stratus_sim::{run, SimulationOptions};

fn peak_resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|arg| arg.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![8, 16, 32] } else { sizes };
    println!("servers  wall_s  simulated_s  steps  peak_rss_mib  operations");
    for servers in sizes {
        let options = SimulationOptions {
            servers,
            replicas: 3,
            clients: 2,
            operations_per_client: 40,
            faults: false,
            time_limit: Duration::from_secs(600),
            ..SimulationOptions::default()
        };
        let started = Instant::now();
        match run(7, &options) {
            Ok(report) => println!(
                "{servers:>7}  {:>6.1}  {:>11.1}  {:>5}  {:>12.1}  {:>10}",
                started.elapsed().as_secs_f64(),
                report.simulated.as_secs_f64(),
                report.steps,
                peak_resident_kib() as f64 / 1024.0,
                report.operations,
            ),
            Err(failure) => {
                println!(
                    "{servers:>7}  failed after {:.1} s: {failure}",
                    started.elapsed().as_secs_f64()
                );
                break;
            }
        }
    }
}
