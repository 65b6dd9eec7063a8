//! Large clusters in the simulator (issue 31): servers crash in a cluster of hundreds, and every
//! invariant of the simulation holds (a linearizable history, one master per tablet, every key
//! served again once the faults stop, every segment back on R backups, no panic). The seeds'
//! tests run 4 or 5 servers; these run the same production code at scale.

use std::time::{Duration, Instant};

use stratus_sim::{run, Fault, ScheduledFault, SimulationOptions};

/// `servers` storage servers (R = 3) of which `crashed` (the first ones) crash together at 2 s
/// and stay down 3 s; two clients run their operations throughout.
fn crash_together(servers: usize, crashed: usize) -> SimulationOptions {
    let faults = (0..crashed)
        .map(|server| ScheduledFault {
            at: Duration::from_secs(2),
            fault: Fault::CrashServer { server, down_for: Duration::from_secs(3), flip_bit: false },
        })
        .collect();
    SimulationOptions {
        servers,
        replicas: 3,
        clients: 2,
        operations_per_client: 60,
        scripted_faults: Some(faults),
        time_limit: Duration::from_secs(300),
        ..SimulationOptions::default()
    }
}

fn run_and_report(seed: u64, options: &SimulationOptions) {
    let started = Instant::now();
    let report = run(seed, options).unwrap_or_else(|failure| panic!("{failure}"));
    eprintln!(
        "{{\"servers\":{},\"crashed\":{},\"servers_recovered\":{},\"simulated_s\":{:.1},\
         \"wall_s\":{:.1},\"operations\":{}}}",
        options.servers,
        report.faults.len(),
        report.servers_recovered,
        report.simulated.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        report.operations,
    );
    // The crashes happened and were recovered: a run where nothing failed proves nothing.
    assert_eq!(report.servers_recovered, report.faults.len(), "{report}");
    assert!(report.known_outcomes > 0, "{report}");
}

#[test]
fn one_percent_of_two_hundred_servers_crash_at_once() {
    run_and_report(31, &crash_together(200, 2));
}

/// 1 000 servers, 10 crashing at once: about 2 GiB and a minute here; run by hand.
#[test]
#[ignore = "1 000 servers: run by hand (cargo test -p stratus-sim --test scale -- --ignored)"]
fn one_percent_of_a_thousand_servers_crash_at_once() {
    run_and_report(31, &crash_together(1_000, 10));
}
